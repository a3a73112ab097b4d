/* Prefill for quantized weights through bf16 (gemm_bf16_avx512.c, compiled for AVX-512;
 * qmatmul.c calls it only when qmatmul_has_bf16() and n_tok is large enough).
 *
 * y[t][o] = sum_k bf16(w[o][k]) bf16(x[t][k]), f32 accumulation (vdpbf16ps), where
 * w[o][k] is the weight dequantized to f32 (any format weight_get_row reads) and then
 * rounded to bf16. Error against the exact product: at most about 2^-8 sum_k |w x|,
 * plus f32 rounding. */
#ifndef GB_CPU_GEMM_BF16_AVX512_H
#define GB_CPU_GEMM_BF16_AVX512_H

#include <stddef.h>
#include <stdint.h>

struct gb_weight;

/* (qmatmul.c) 1 when the CPU has AVX512-BF16 besides what qmatmul_has_avx512() asks. */
int qmatmul_has_bf16(void);
/* matmul_w calls with at least n tokens (n >= 1) take this path where it is available;
 * n == 0: never; n < 0: the default. For tests and benchmarks. */
void qmatmul_set_gemm_min_tok(int n);

/* 1 when gemm_bf16_rows_avx512 handles w: n_in % 256 == 0 and a quantized format (GGML
 * block type or MLX affine). */
int gemm_bf16_supports(const struct gb_weight *w);

/* x (n elements, n even) rounded to bf16, nearest even. */
void gemm_bf16_x_avx512(const float *x, int n, uint16_t *out);

/* Rows [o0, o0 + nr) of w against n_tok rows of bf16 x (xs elements apart, n_in
 * each): y[t * ldy + o] for o in [o0, o0 + nr). Each output is computed by the same
 * operations whatever o0, nr and n_tok are (no dependence on tiling or threads). */
void gemm_bf16_rows_avx512(const struct gb_weight *w, int o0, int nr, const uint16_t *xb, size_t xs, int n_tok,
                           float *y, size_t ldy);

#endif
