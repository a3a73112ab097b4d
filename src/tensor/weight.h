/* A weight matrix as the matmul reads it, in its stored format: n_out rows of n_in
 * elements. Plain and GGML-block types keep each row contiguous (row r at
 * data + r * row_bytes). MLX affine quantization packs `bits`-wide unsigned codes
 * little-endian into u32 words along the row, with one scale and one bias per group
 * of group_size columns: w[r][c] = scales[r][c / gs] * q[r][c] + biases[r][c / gs]. */
#ifndef GB_WEIGHT_H
#define GB_WEIGHT_H

#include "tensor/dtype.h"

#include <stddef.h>
#include <stdint.h>

enum gb_weight_kind {
    GB_WEIGHT_PLAIN = 0, /* type is F32/F16/BF16 or a GGML block type */
    GB_WEIGHT_MLX,       /* MLX affine: data is u32 words, plus scales and biases */
};

struct gb_weight {
    enum gb_weight_kind kind;
    enum gb_type type;        /* PLAIN: the row type; MLX: GB_TYPE_U32 */
    int64_t n_out, n_in;
    const void *data;
    size_t row_bytes;
    /* MLX only */
    int bits, group_size;     /* bits in {2, 3, 4, 6, 8}; group_size in {32, 64, 128} */
    enum gb_type sb_type;     /* type of scales and biases: F32, F16 or BF16 */
    const void *scales, *biases; /* [n_out][n_in / group_size] */
    /* 1 when the backend the weight was prepared for rearranged its rows for its kernels
     * (backend.h weight_prepare; the CPU backend: 4-bit MLX rows in quads, cpu/mlx_packed.h).
     * Such a weight is read only by that backend; views of it (weight_rows) start at
     * multiples of 4 rows. */
    int packed;
    const void *plan;         /* the backend's choice of kernels for it (weight_prepare), or NULL */
    const char *name;         /* for messages */
};

/* Bytes the weight occupies (data + scales + biases). */
size_t weight_nbytes(const struct gb_weight *w);
/* Rows [r0, r0 + n) of w as a weight of their own (a view; no copy). */
struct gb_weight weight_rows(const struct gb_weight *w, int64_t r0, int64_t n);
/* Row r as f32 (the embedding gather; reference dequantization). Not for weights a backend
 * rearranged (packed): backend/cpu/mlx_packed.h reads those. */
void weight_get_row(const struct gb_weight *w, int64_t r, float *out);

#endif
