/* AVX2 kernels for quantized weights (qmatmul_avx2.c, compiled with -mavx2 -mfma
 * -mf16c). Private to qmatmul.c, which calls them only after cpu_has_avx2().
 *
 * Every kernel has qmatmul.c's row-kernel contract: one weight row against nt tokens
 * of prepared activations,
 *   y[u * ldy] = dot(row, token u)   for u < nt,
 * and each token's value is computed by the same instruction sequence whatever nt is
 * (tokens are only grouped to share weight loads), so results depend on neither the
 * token tiling nor the thread split. */
#ifndef GB_CPU_QMATMUL_AVX2_H
#define GB_CPU_QMATMUL_AVX2_H

#include "tensor/dtype.h"

#include <stddef.h>
#include <stdint.h>

/* Activation blocks, written by qmatmul.c. qx8: x ~ d * qs over 32 elements, and
 * s = d * sum(qs). qx16: the same with 16-bit qs (MLX weights); for the AVX2 4-bit
 * kernel qs holds the x of the even elements first, then the odd ones (the order in
 * which low and high nibbles come out of 16 code bytes). */
struct qx8 {
    float d, s;
    int8_t qs[32];
};
struct qx16 {
    float d, s;
    int16_t qs[32];
};

/* GGML rows (n elements) against activations quantized by qmatmul.c: Q8_K blocks for
 * the k-quants, struct qx8 blocks (see qmatmul.c) for Q8_0/Q4_0. xs: bytes between
 * tokens of xq. */
void qdot_q4_K_avx2(int n, const void *row, const void *xq, size_t xs, int nt, float *y, size_t ldy);
void qdot_q5_K_avx2(int n, const void *row, const void *xq, size_t xs, int nt, float *y, size_t ldy);
void qdot_q6_K_avx2(int n, const void *row, const void *xq, size_t xs, int nt, float *y, size_t ldy);
void qdot_q8_0_avx2(int n, const void *row, const void *xq, size_t xs, int nt, float *y, size_t ldy);
/* Q8_0, nr <= 4 rows (rb bytes apart; row r's values at y[u * ldy + r]) against nt tokens
 * of struct qx8, or any nr with nt == 1: qmatmul.c's qrows_fn contract. */
void qrows_q8_0_avx2(int n, int nr, const void *row0, size_t rb, const void *xq, size_t xs, int nt, float *y,
                     size_t ldy);
void qdot_q4_0_avx2(int n, const void *row, const void *xq, size_t xs, int nt, float *y, size_t ldy);

/* MLX affine rows against x quantized to struct qx16 blocks. codes: the row's packed
 * words; sc, bi: its n / gs scales and biases, of type sbt (F32, F16 or BF16); xs:
 * bytes between tokens of xq; gsum: per-group sums of the quantized x (sum of the
 * blocks' s), gstr floats between tokens. */
void mlxdot4_avx2(int n, int gs, const uint8_t *codes, const void *sc, const void *bi,
                  enum gb_type sbt, const void *xq, size_t xs, const float *gsum, size_t gstr,
                  int nt, float *y, size_t ldy);
void mlxdot8_avx2(int n, int gs, const uint8_t *codes, const void *sc, const void *bi,
                  enum gb_type sbt, const void *xq, size_t xs, const float *gsum, size_t gstr,
                  int nt, float *y, size_t ldy);

#endif
