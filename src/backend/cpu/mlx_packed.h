/* The CPU backend's own layout of 4-bit MLX rows (weight_prepare rearranges the loader's
 * copy into it where the AVX-512 kernels are there; gb_weight.packed records it). Only the
 * CPU backend reads such weights: its kernels, GEMM panels and row reader below.
 *
 * Packed order of 4-bit MLX words (8 codes per word, 4 words per block of 32 elements),
 * for n_out rows of nw words. Rows go in quads: rows 4k .. 4k + 3 (while all four exist)
 * share their 4 nw words, and the last n_out % 4 rows are each a "quad" of one. Per set of
 * 16 blocks (a row's last set may have fewer, bs), word j of the set's blocks of each row
 * of the quad in turn: so a 64-byte load holds word j of 16 blocks of one row, and a
 * kernel taking the quad's 4 rows at once reads one sequential stream. */
#ifndef GB_CPU_MLX_PACKED_H
#define GB_CPU_MLX_PACKED_H

#include "tensor/weight.h"

#include <stddef.h>
#include <stdint.h>

/* Where word 0 of row r's block b is, from row 0's start; the block's word j is j * *d
 * further. */
static inline size_t mlx4_packed_block(int64_t n_out, size_t nw, int64_t r, size_t b, size_t *d) {
    size_t s = b / 16, m = b % 16, bs = nw - 64 * s >= 64 ? 16 : (nw - 64 * s) / 4;
    int quad = r < (n_out & ~(int64_t)3);
    size_t q = quad ? 4 : 1, ri = quad ? (size_t)r & 3 : 0; /* rows in the quad, r's place */
    *d = q * bs;
    return ((size_t)r - ri) * nw + q * 64 * s + ri * bs + m;
}
/* Where row r's word i is. */
static inline size_t mlx4_packed_word(int64_t n_out, size_t nw, int64_t r, size_t i) {
    size_t d, p0 = mlx4_packed_block(n_out, nw, r, i / 4, &d);
    return p0 + i % 4 * d;
}
/* Put w (4-bit MLX, in MLX's order, data writable) in packed order and set w->packed. */
void mlx4_pack(struct gb_weight *w);
/* Words w0 .. w0 + k - 1 of row r in MLX's order, packed or not. */
void cpu_mlx_words(const struct gb_weight *w, int64_t r, size_t w0, size_t k, uint32_t *out);
/* Row r as f32, whatever the layout (weight_get_row for rows the CPU backend rearranged). */
void cpu_weight_row(const struct gb_weight *w, int64_t r, float *out);

#endif
