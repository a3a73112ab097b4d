/* Prefill GEMMs for quantized weights (gemm_avx512.c, compiled for AVX-512; qmatmul.c
 * calls them only when qmatmul_has_bf16() and n_tok is large enough):
 *  - GGML block types through bf16: y[t][o] = sum_k bf16(w[o][k]) bf16(x[t][k]), f32
 *    accumulation (vdpbf16ps), w dequantized to f32 and rounded to bf16; error at most
 *    about 2^-8 sum_k |w x|, plus f32 rounding;
 *  - MLX 4/8-bit through 16-bit integers: exact integer sums of codes times x quantized
 *    to 16 bits per weight group, scaled per group in f32. */
#ifndef GB_CPU_GEMM_AVX512_H
#define GB_CPU_GEMM_AVX512_H

#include <stddef.h>
#include <stdint.h>

struct gb_weight;

/* (qmatmul.c) 1 when the CPU has AVX512-BF16 besides what qmatmul_has_avx512() asks. */
int qmatmul_has_bf16(void);
/* matmul_w calls with at least n tokens (n >= 1) take this path where it is available;
 * n == 0: never; n < 0: the default. For tests and benchmarks. */
void qmatmul_set_gemm_min_tok(int n);

/* Which GEMM handles w: GGML block types through bf16, MLX 4/8-bit through 16-bit
 * integers (gemm_mlx_*); rows of n_in % 32 == 0 (and of whole groups). */
enum gemm_kind { GEMM_NONE, GEMM_BF16, GEMM_MLX16 };
enum gemm_kind gemm_kind_of(const struct gb_weight *w);

/* x is stored for the GEMMs in tiles of T = GEMM_T tokens: u32 pair p (elements 2p, 2p + 1)
 * of token t at xp[((t / T) (n / 2) + p) T + t % T]; a buffer for n_tok tokens holds
 * gemm_x_words() u32. */
enum { GEMM_T = 12 };
/* k per weight panel: the whole row up to this (longer rows in blocks of it) */
enum { GEMM_KB = 4096 };
/* Scratch each call of gemm_*_rows_avx512 needs (one per thread; 64-byte aligned): a panel
 * of 32 rows x min(n_in, GEMM_KB) codes or bf16 values, and MLX's scales and biases. */
size_t gemm_panel_bytes(const struct gb_weight *w);
static inline size_t gemm_x_words(int n_tok, int n, int T) { return (size_t)((n_tok + T - 1) / T * T) * (size_t)(n / 2); }

/* Token t's row x (n elements, n % 32 == 0) rounded to bf16 (nearest even) into xp. */
void gemm_bf16_x_avx512(const float *x, int n, int t, uint32_t *xp);

/* Rows [o0, o0 + nr) of w against n_tok tokens of bf16 x (xp, as above): y[t * ldy + o]
 * for o in [o0, o0 + nr). Each output is computed by the same operations whatever o0, nr
 * and n_tok are (no dependence on tiling or threads). */
void gemm_bf16_rows_avx512(const struct gb_weight *w, int o0, int nr, const uint32_t *xp, int n_tok, float *y,
                           size_t ldy, void *scratch);

/* MLX: token t's row x (n elements) to 16-bit integers q per group of gs, x ~ d[g] q, into
 * xp (as above); sum[g] = d[g] sum(q). */
void gemm_mlx_x_avx512(const float *x, int n, int gs, int t, uint32_t *xp, float *d, float *sum);
/* As gemm_bf16_rows_avx512 for MLX 4/8-bit rows: x quantized into xp, its steps and sums
 * (gstr floats apart per token). */
void gemm_mlx_rows_avx512(const struct gb_weight *w, int o0, int nr, const uint32_t *xp, const float *xd,
                          const float *xsum, size_t gstr, int n_tok, float *y, size_t ldy, void *scratch);

#endif
