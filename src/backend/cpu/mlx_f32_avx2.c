/* AVX2 kernel of mlx_f32.c: 4- and 8-bit codes widened to f32 lanes, FMA with x;
 * the group scale is applied to the vector accumulator (no horizontal sum per group). */
#include "backend/cpu/mlx_f32.h"
#include "base/fp16.h"

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

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

/* 8 codes starting at code c (c a multiple of 8) as f32 lanes. */
static inline __m256 codes8(const uint8_t *row, int bits, int c) {
    if (bits == 4) {
        uint32_t word;
        memcpy(&word, row + c / 2, 4);
        const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
        __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32((int)word), shifts);
        return _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(15)));
    }
    __m128i b = _mm_loadl_epi64((const __m128i *)(row + c));
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b));
}

enum { TB = 4 }; /* tokens per pass: each widened code vector serves TB tokens */

void mlx_f32_row_avx2(const struct gb_weight *w, int o, const float *x, const float *gsum, int t0, int t1,
                      float *y) {
    const int n = (int)w->n_in, gs = w->group_size, ng = n / gs, bits = w->bits;
    const uint8_t *row = (const uint8_t *)w->data + (size_t)o * w->row_bytes;
    for (int tb = t0; tb < t1; tb += TB) {
        const int nt = t1 - tb < TB ? t1 - tb : TB;
        __m256 tot[TB];
        float bias_acc[TB] = {0};
        for (int u = 0; u < TB; u++) tot[u] = _mm256_setzero_ps();
        for (int g = 0; g < ng; g++) {
            __m256 acc[TB];
            for (int u = 0; u < TB; u++) acc[u] = _mm256_setzero_ps();
            for (int c = g * gs; c < (g + 1) * gs; c += 8) {
                __m256 q = codes8(row, bits, c);
                for (int u = 0; u < nt; u++)
                    acc[u] = _mm256_fmadd_ps(q, _mm256_loadu_ps(x + (size_t)(tb + u) * n + c), acc[u]);
            }
            size_t k = (size_t)o * (size_t)ng + (size_t)g;
            const float s = sb_value(w->sb_type, w->scales, k), b = sb_value(w->sb_type, w->biases, k);
            const __m256 sv = _mm256_set1_ps(s);
            for (int u = 0; u < nt; u++) {
                tot[u] = _mm256_fmadd_ps(sv, acc[u], tot[u]);
                bias_acc[u] += b * gsum[(size_t)(tb + u) * ng + g];
            }
        }
        for (int u = 0; u < nt; u++) y[(size_t)(tb + u) * w->n_out + o] = hsum(tot[u]) + bias_acc[u];
    }
}
