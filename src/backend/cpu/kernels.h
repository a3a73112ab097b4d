/* CPU kernels. Each has a scalar `_ref` version (the spec and the test oracle) and a
 * fast version chosen at run time (AVX2/FMA/F16C when the CPU has them, else the
 * reference). Results never depend on the thread count: every output element is
 * computed by exactly one thread, always in the same order. */
#ifndef GB_CPU_KERNELS_H
#define GB_CPU_KERNELS_H

#include "base/threadpool.h"
#include "tensor/dtype.h"

#include <stdint.h>

/* y[t][o] = sum_i x[t][i] * w[o][i]   for t < n_tok, o < n_out.
 * x: [n_tok][n_in] f32; y: [n_tok][n_out] f32 (must not alias x);
 * w: [n_out][n_in] row-major of type wtype (GB_TYPE_F32, F16 or BF16), read in place
 * (it is usually the mmap of a checkpoint; never written). */
void matmul_ref(float *y, const float *x, const void *w, enum gb_type wtype,
                int n_tok, int n_in, int n_out);
/* matmul_ref restricted to output columns o in [o_lo, o_hi) (same shapes and strides):
 * the piece one thread computes when the reference kernels are forced. */
void matmul_rows_ref(float *y, const float *x, const void *w, enum gb_type wtype,
                     int n_tok, int n_in, int n_out, int o_lo, int o_hi);
/* Threaded over tp (may be NULL) and SIMD. n_tok == 1 is the decode case
 * (matrix x vector, bound by memory bandwidth); n_tok > 1 is prefill (bound by
 * arithmetic: reuse each loaded weight row across many tokens). */
void matmul(threadpool_t *tp, float *y, const float *x, const void *w, enum gb_type wtype,
            int n_tok, int n_in, int n_out);
/* matmul with every token through the decode kernel (the results of n_tok one-token
 * calls, bit for bit), each weight row read once for all of them: decode rows of many
 * sequences batched together. */
void matmul_per_token(threadpool_t *tp, float *y, const float *x, const void *w, enum gb_type wtype,
                      int n_tok, int n_in, int n_out);

/* Attention helpers over f16 or f32 rows (the KV cache). */
float dot_f32_ref(const float *a, const float *b, int n);
float dot_f32(const float *a, const float *b, int n);
float dot_f32_f16_ref(const float *a, const uint16_t *b, int n);
float dot_f32_f16(const float *a, const uint16_t *b, int n);
/* y[i] += a * v[i] */
void axpy_f32_ref(float *y, float a, const float *v, int n);
void axpy_f32(float *y, float a, const float *v, int n);
void axpy_f16_ref(float *y, float a, const uint16_t *v, int n);
void axpy_f16(float *y, float a, const uint16_t *v, int n);

/* sum of x[i]^2 in double (RMSNorm): the reference adds in order; the fast version keeps
 * 8 double partial sums (the same value to ~1e-16 relative). */
double sumsq_f32_ref(const float *x, int n);
double sumsq_f32(const float *x, int n);

/* y[i] = f16(x[i]), rounded to nearest even: base/fp16.h's f32_to_f16 bit for bit (the
 * fast version with F16C). */
void f32_to_f16_row_ref(uint16_t *y, const float *x, long n);
void f32_to_f16_row(uint16_t *y, const float *x, long n);

/* Element-wise activations. Each element's result depends on its inputs alone (never on
 * n or on where a range starts), so splitting a vector over threads changes no bit. */
/* y[i] = silu(g[i]) * u[i] = g[i] / (1 + e^-g[i]) * u[i] (SwiGLU); y may alias g or u. */
void silu_mul_ref(float *y, const float *g, const float *u, long n);
void silu_mul(float *y, const float *g, const float *u, long n);
/* y[i] = gelu_tanh(g[i]) * u[i] (see op_gelu_tanh_mul); y may alias g or u. */
void gelu_tanh_mul_ref(float *y, const float *g, const float *u, long n);
void gelu_tanh_mul(float *y, const float *g, const float *u, long n);
/* x[i] = cap * tanh(x[i] / cap), in place. */
void softcap_ref(float *x, float cap, long n);
void softcap(float *x, float cap, long n);

/* ---- any weight format (tensor/weight.h): plain, GGML blocks, MLX affine ---- */
struct gb_weight;
/* The oracle: each row dequantized (cpu_weight_row: any layout), products summed in double. */
void matmul_w_ref(float *y, const float *x, const struct gb_weight *w, int n_tok);
/* Scratch the fast path needs for n_tok rows of x (e.g. x quantized to q8 blocks). */
size_t matmul_w_work_size(const struct gb_weight *w, int n_tok);
/* Threaded and SIMD; plain float types go to matmul(). work: matmul_w_work_size bytes
 * (may be NULL when that is 0). Quantized formats may quantize x once per call (to
 * 8-bit blocks) for their dot products; the per-format error bound is in the tests. */
void matmul_w(threadpool_t *tp, float *y, const float *x, const struct gb_weight *w, int n_tok, void *work);
/* How matmul_w runs one weight on this machine: the kernel functions, the activation layout
 * and the method for many rows, chosen once from the weight's format and the CPU's
 * instruction sets (the GGML kernel table, the MLX layouts), at weight_prepare, and kept in
 * the weight (gb_weight.plan). epoch: cpu_isa_epoch() when it was made; a call after a test
 * flipped an ISA switch (cpu_force_ref, qmatmul_disable_avx512, qmatmul_disable_vnni) finds
 * it stale and works one out for itself, as it does for a weight that has none. */
struct mm_plan {
    unsigned epoch;
    int kind;              /* mm_kind in qmatmul.c */
    int gemm;              /* enum gemm_kind: the many-row method, GEMM_NONE if none */
    int fast;              /* the AVX2 kernels (or better) */
    int act;               /* GGML: the activation layout */
    void (*fn)(void);      /* GGML: one row against tokens (qmatmul.c's qdot_fn) */
    void (*rows_fn)(void); /* GGML: 4 rows at a time (qrows_fn), instead of fn where set */
    int x512, packed, permuted; /* MLX: the AVX-512 kernels, the packed ones, AVX2's nibble order */
    size_t xs;             /* bytes of prepared x per token */
};
void matmul_w_plan(const struct gb_weight *w, struct mm_plan *p);
/* Bumped by every ISA switch. */
unsigned cpu_isa_epoch(void);
void cpu_isa_changed(void);

/* Batch invariance: matmul_w has two methods for some weights, the per-token kernels
 * and one for many rows (the prefill GEMMs; for f32/f16/bf16 rows the register tiles,
 * against the decode kernel for one token). Rows whose span (the rows of their own
 * segment in the call) is at least matmul_w_min_span(w) may take the second; INT_MAX when
 * this CPU has none for w. matmul_w(n_tok) is matmul_w_method(many = n_tok >= that). */
int matmul_w_min_span(const struct gb_weight *w);
void matmul_w_method(threadpool_t *tp, float *y, const float *x, const struct gb_weight *w, int n_tok, void *work,
                     int many);
/* y[i] = x . w[i]^T for k (<= 4) matrices sharing x in one pass over the pool, with the
 * results of k matmul_w calls bit for bit; 1 where done, 0 (nothing done) where this
 * combination has no fused path (for now: one token, packed MLX 4-bit, AVX-512; or the
 * prefill GEMMs, one kind for all, the same n_in and MLX group size). work: as for
 * matmul_w(w[0], n_tok). */
int matmul_w_multi(threadpool_t *tp, int k, float *const *y, const float *x, const struct gb_weight *const *w,
                   int n_tok, void *work);
/* matmul_w_multi with the method chosen: many = 0 only the fused decode path (one token),
 * many = 1 only the GEMMs. */
int matmul_w_multi_method(threadpool_t *tp, int k, float *const *y, const float *x,
                          const struct gb_weight *const *w, int n_tok, void *work, int many);

/* Whether matmul_w reads w faster with its rows rearranged by qmatmul_pack (for now: MLX
 * 4-bit on CPUs with the AVX-512 kernels), and the rearrangement (mlx_packed.h mlx4_pack: w's
 * data writable, the same bytes moved within groups of 4 rows). Results of packed weights match
 * the oracle within the same bounds; every path reads them, the fastest by far. */
int qmatmul_wants_pack(const struct gb_weight *w);
void qmatmul_pack(struct gb_weight *w);

/* 1 when the AVX2/FMA/F16C kernels are in use (for tests and `gerbil info`). */
int cpu_has_avx2(void);
/* Force the reference kernels (tests, debugging). */
void cpu_force_ref(int on);

#endif
