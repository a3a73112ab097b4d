/* AVX2 kernel of mlx_f32.c: 4- and 8-bit codes widened to f32 lanes, FMA with x.
 * Within a group the products go to independent vector accumulators; the group's
 * scale is applied to the vector sum (no horizontal add per group) and the bias term
 * uses the precomputed group sum of x. Four tokens share each widened code vector
 * in prefill. */
#include "backend/cpu/mlx_f32.h"
#include "base/fp16.h"

#include <immintrin.h>
#include <stdint.h>

static inline float sb_value(enum gb_type t, const void *p, size_t i) {
    switch (t) {
    case GB_TYPE_F32: return ((const float *)p)[i];
    case GB_TYPE_F16: return f16_to_f32(((const uint16_t *)p)[i]);
    default: return bf16_to_f32(((const uint16_t *)p)[i]);
    }
}

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

/* 32 codes starting at code c (c a multiple of 32) as four vectors of 8 f32. */
static inline void codes32(const uint8_t *row, int bits, int c, __m256 q[4]) {
    if (bits == 4) {
        /* byte k holds code 2k (low nibble) and 2k + 1 (high nibble) */
        __m128i v = _mm_loadu_si128((const __m128i *)(row + c / 2));
        const __m128i m = _mm_set1_epi8(15);
        __m128i lo = _mm_and_si128(v, m), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
        __m128i a = _mm_unpacklo_epi8(lo, hi), b = _mm_unpackhi_epi8(lo, hi); /* codes 0..15, 16..31 */
        q[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(a));
        q[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(a, 8)));
        q[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b));
        q[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(b, 8)));
    } else {
        for (int k = 0; k < 4; k++)
            q[k] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(row + c + 8 * k))));
    }
}

/* One token: y = sum_g s_g (q . x)_g + b_g gsum_g. */
static float row_dot1(const struct gb_weight *w, const uint8_t *row, size_t k0, const float *x, const float *gs_x) {
    const int gs = w->group_size, ng = (int)w->n_in / gs;
    __m256 tot = _mm256_setzero_ps();
    float bias = 0.0f;
    for (int g = 0; g < ng; g++) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int c = g * gs; c < (g + 1) * gs; c += 32) {
            __m256 q[4];
            codes32(row, w->bits, c, q);
            a0 = _mm256_fmadd_ps(q[0], _mm256_loadu_ps(x + c), a0);
            a1 = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(x + c + 8), a1);
            a2 = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(x + c + 16), a2);
            a3 = _mm256_fmadd_ps(q[3], _mm256_loadu_ps(x + c + 24), a3);
        }
        __m256 acc = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
        tot = _mm256_fmadd_ps(_mm256_set1_ps(sb_value(w->sb_type, w->scales, k0 + (size_t)g)), acc, tot);
        bias += sb_value(w->sb_type, w->biases, k0 + (size_t)g) * gs_x[g];
    }
    return hsum(tot) + bias;
}

/* Four tokens sharing each widened code vector (prefill). */
static void row_dot4(const struct gb_weight *w, const uint8_t *row, size_t k0, const float *x, size_t ldx,
                     const float *gsum, int ng, float out[4]) {
    const int gs = w->group_size;
    __m256 t0 = _mm256_setzero_ps(), t1 = t0, t2 = t0, t3 = t0;
    float b0 = 0, b1 = 0, b2 = 0, b3 = 0;
    const float *x0 = x, *x1 = x + ldx, *x2 = x + 2 * ldx, *x3 = x + 3 * ldx;
    for (int g = 0; g < ng; g++) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int c = g * gs; c < (g + 1) * gs; c += 32) {
            __m256 q[4];
            codes32(row, w->bits, c, q);
            for (int k = 0; k < 4; k++) {
                const int o = c + 8 * k;
                a0 = _mm256_fmadd_ps(q[k], _mm256_loadu_ps(x0 + o), a0);
                a1 = _mm256_fmadd_ps(q[k], _mm256_loadu_ps(x1 + o), a1);
                a2 = _mm256_fmadd_ps(q[k], _mm256_loadu_ps(x2 + o), a2);
                a3 = _mm256_fmadd_ps(q[k], _mm256_loadu_ps(x3 + o), a3);
            }
        }
        const __m256 s = _mm256_set1_ps(sb_value(w->sb_type, w->scales, k0 + (size_t)g));
        const float b = sb_value(w->sb_type, w->biases, k0 + (size_t)g);
        t0 = _mm256_fmadd_ps(s, a0, t0);
        t1 = _mm256_fmadd_ps(s, a1, t1);
        t2 = _mm256_fmadd_ps(s, a2, t2);
        t3 = _mm256_fmadd_ps(s, a3, t3);
        b0 += b * gsum[g];
        b1 += b * gsum[ng + g];
        b2 += b * gsum[2 * ng + g];
        b3 += b * gsum[3 * ng + g];
    }
    out[0] = hsum(t0) + b0;
    out[1] = hsum(t1) + b1;
    out[2] = hsum(t2) + b2;
    out[3] = hsum(t3) + b3;
}

void mlx_f32_row_avx2(const struct gb_weight *w, int o, const float *x, const float *gsum, int t0, int t1,
                      float *y) {
    const int n = (int)w->n_in, ng = n / w->group_size;
    const uint8_t *row = (const uint8_t *)w->data + (size_t)o * w->row_bytes;
    const size_t k0 = (size_t)o * (size_t)ng;
    int t = t0;
    for (; t + 4 <= t1; t += 4) {
        float out[4];
        row_dot4(w, row, k0, x + (size_t)t * n, (size_t)n, gsum + (size_t)t * ng, ng, out);
        for (int u = 0; u < 4; u++) y[(size_t)(t + u) * w->n_out + o] = out[u];
    }
    for (; t < t1; t++) y[(size_t)t * w->n_out + o] = row_dot1(w, row, k0, x + (size_t)t * n, gsum + (size_t)t * ng);
}
