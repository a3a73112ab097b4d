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
    /* 4-bit MLX only: 1 when the words are in packed order (weight_pack_mlx4), the order
     * the AVX-512 kernels read; 0 in MLX's own order */
    int packed;
    const char *name;         /* for messages */
};

/* Packed order of 4-bit MLX words (8 codes per word, 4 words per block of 32 elements),
 * for n_out rows of nw words. Rows go in quads: rows 4k .. 4k + 3 (while all four exist)
 * share their 4 nw words, and the last n_out % 4 rows are each a "quad" of one. Per set of
 * 16 blocks (a row's last set may have fewer, bs), word j of the set's blocks of each row
 * of the quad in turn: so a 64-byte load holds word j of 16 blocks of one row, and a
 * kernel taking the quad's 4 rows at once reads one sequential stream.
 * mlx4_packed_block: where word 0 of row r's block b is, from row 0's start; the block's
 * word j is j *d further. mlx4_packed_word: where row r's word i is. */
static inline size_t mlx4_packed_block(int64_t n_out, size_t nw, int64_t r, size_t b, size_t *d) {
    size_t s = b / 16, m = b % 16, bs = nw - 64 * s >= 64 ? 16 : (nw - 64 * s) / 4;
    int quad = r < (n_out & ~(int64_t)3);
    size_t q = quad ? 4 : 1, ri = quad ? (size_t)r & 3 : 0; /* rows in the quad, r's place */
    *d = q * bs;
    return ((size_t)r - ri) * nw + q * 64 * s + ri * bs + m;
}
static inline size_t mlx4_packed_word(int64_t n_out, size_t nw, int64_t r, size_t i) {
    size_t d, p0 = mlx4_packed_block(n_out, nw, r, i / 4, &d);
    return p0 + i % 4 * d;
}
/* Put w (4-bit MLX, in MLX's order, data writable) in packed order and set w->packed. A
 * view of its rows (weight_rows) must start at a multiple of 4. */
void weight_pack_mlx4(struct gb_weight *w);
/* Words w0 .. w0 + k - 1 of row r in MLX's order, packed or not. */
void weight_mlx_words(const struct gb_weight *w, int64_t r, size_t w0, size_t k, uint32_t *out);

/* Bytes the weight occupies (data + scales + biases). */
size_t weight_nbytes(const struct gb_weight *w);
/* Rows [r0, r0 + n) of w as a weight of their own (a view; no copy). */
struct gb_weight weight_rows(const struct gb_weight *w, int64_t r0, int64_t n);
/* Row r as f32 (the embedding gather; reference dequantization). */
void weight_get_row(const struct gb_weight *w, int64_t r, float *out);

#endif
