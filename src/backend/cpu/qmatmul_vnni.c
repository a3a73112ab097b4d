/* AVX512-VNNI kernels for quantized weights (256-bit vectors, AVX512VL): qmatmul_avx2.c's
 * Q4_K, Q5_K, Q6_K and Q8_0 kernels with the integer multiply-adds fused.
 *
 *  - k-quants: vpmaddubsw (codes x int8 activations, pairs to int16, never saturating:
 *    at most 2 * 63 * 127) stays, and vpmaddwd by the group scales + vpaddd become one
 *    vpdpwssd. A fused vpdpbusd cannot take the per-16 scales (codes x scale do not
 *    fit a byte), and multiplying its sums by the scales afterwards costs what it saves.
 *  - Q8_0: vpmaddubsw + vpmaddwd by ones become one vpdpbusd (|w| <= 128 unsigned
 *    x sign-moved x in [-127, 127]: vpmaddubsw never saturated, so the sums agree).
 *
 * Every integer sum is the AVX2 kernel's exactly, and all f32 arithmetic is the same
 * operations in the same order, so results are bit-identical to qmatmul_avx2.c.
 *
 * Only this file is compiled for the VNNI target (function by function, via the
 * pragma below); qmatmul.c calls it after qmatmul_has_vnni(). */
#include "backend/cpu/qmatmul_vnni.h"

#ifdef GERBIL_HAVE_X86

#include "backend/cpu/kernels.h"
#include "backend/cpu/qmatmul_avx2.h"
#include "tensor/quant.h"

#include <immintrin.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

static _Atomic int vnni_off;

int qmatmul_has_vnni(void) {
    static _Atomic int has = -1; /* first calls may race: all compute the same value */
    if (atomic_load_explicit(&vnni_off, memory_order_relaxed)) return 0;
    int h = atomic_load_explicit(&has, memory_order_relaxed);
    if (h < 0) {
        __builtin_cpu_init();
        h = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl");
        atomic_store_explicit(&has, h, memory_order_relaxed);
    }
    return h && cpu_has_avx2(); /* not cached: 0 while cpu_force_ref */
}

void qmatmul_disable_vnni(int on) {
    atomic_store_explicit(&vnni_off, on ? 1 : 0, memory_order_relaxed);
    cpu_isa_changed();
}

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512vnni,avx512vl"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512vnni,avx512vl")
#endif

#include "backend/cpu/qmatmul_simd.h"

/* Q4_K, Q5_K, Q6_K: vpmaddwd by the group scales + vpaddd fused into one vpdpwssd */
#define KQ_DOT(acc, a, s) _mm256_dpwssd_epi32(acc, a, s)
#define KQ_NAME(base) base##_vnni
#include "backend/cpu/qmatmul_kquant.h"

/* ---- Q8_0 / Q4_0 against struct qx8 --------------------------------------------------- */

static ALWAYS_INLINE void q8_0_tile(int nb, const block_q8_0 *w, const char *xq, size_t xs, int T, float *y,
                                    size_t ldy) {
    __m256 acc[2][NT];
    UNROLL_T for (int u = 0; u < T; u++) acc[0][u] = acc[1][u] = _mm256_setzero_ps();
    const __m256i zero = _mm256_setzero_si256();
    for (int i = 0; i < nb; i++) {
        __m256i wv = _mm256_loadu_si256((const __m256i *)w[i].qs);
        __m256i aw = _mm256_sign_epi8(wv, wv);
        float d = h2f(w[i].d);
        UNROLL_T for (int u = 0; u < T; u++) {
            const struct qx8 *xb = (const struct qx8 *)(xq + (size_t)u * xs) + i;
            __m256i sx = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)xb->qs), wv);
            __m256i p = _mm256_dpbusd_epi32(zero, aw, sx);
            acc[i & 1][u] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb->d), _mm256_cvtepi32_ps(p), acc[i & 1][u]);
        }
    }
    UNROLL_T for (int u = 0; u < T; u++) y[(size_t)u * ldy] = hsum8(_mm256_add_ps(acc[0][u], acc[1][u]));
}

void qdot_q8_0_vnni(int n, const void *row, const void *xq, size_t xs, int nt, float *y, size_t ldy) {
#define K(t) q8_0_tile(n / 32, row, xu, xs, t, yu, ldy)
    TILED(K, NT)
#undef K
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#else /* !GERBIL_HAVE_X86 */

int qmatmul_has_vnni(void) { return 0; }
void qmatmul_disable_vnni(int on) { (void)on; }

#endif
