/* Pieces shared by the AVX2 (qmatmul_avx2.c) and AVX512-VNNI (qmatmul_vnni.c) quantized
 * kernels. Include it where the AVX2 target is in force (after the VNNI file's target
 * pragma), since the helpers use AVX2/F16C intrinsics. */
#ifndef GB_QMATMUL_SIMD_H
#define GB_QMATMUL_SIMD_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define ALWAYS_INLINE inline __attribute__((always_inline))
/* Per-token loops run fully unrolled, so per-token accumulators stay in registers. */
#define UNROLL_T _Pragma("GCC unroll 4")

enum { NT = 4 }; /* most tokens one tile holds */

static ALWAYS_INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static ALWAYS_INLINE float h2f(uint16_t h) { return _cvtsh_ss(h); }

/* Tile over nt tokens in pieces of at most `max`, each piece one instance of k. */
#define TILED(k, max)                                                                       \
    for (int u0 = 0; u0 < nt; u0 += max) {                                                  \
        int t = nt - u0 < max ? nt - u0 : max;                                              \
        const char *xu = (const char *)xq + (size_t)u0 * xs;                                \
        float *yu = y + (size_t)u0 * ldy;                                                   \
        switch (t) {                                                                        \
        case 4: k(4); break;                                                                \
        case 3: k(3); break;                                                                \
        case 2: k(2); break;                                                                \
        default: k(1); break;                                                               \
        }                                                                                   \
    }

/* ---- Q4_K ------------------------------------------------------------------------- */

/* The 8 6-bit scales and 8 6-bit mins of a Q4_K/Q5_K super-block, one byte each, as
 * two u64 (sub-block j in byte j). Bytes 0..3 hold scales 0..3 (low 6 bits) and the
 * top 2 bits of scales 4..7; bytes 4..7 the same for the mins; bytes 8..11 the low
 * 4 bits of scales 4..7 (low nibbles) and mins 4..7 (high nibbles). */
static ALWAYS_INLINE void scales_k4(const uint8_t *s, uint64_t *sc, uint64_t *mn) {
    uint32_t a0, a1, a2;
    memcpy(&a0, s, 4);
    memcpy(&a1, s + 4, 4);
    memcpy(&a2, s + 8, 4);
    *sc = (uint64_t)(a0 & 0x3f3f3f3fu) | (uint64_t)((a2 & 0x0f0f0f0fu) | ((a0 >> 2) & 0x30303030u)) << 32;
    *mn = (uint64_t)(a1 & 0x3f3f3f3fu) | (uint64_t)(((a2 >> 4) & 0x0f0f0f0fu) | ((a1 >> 2) & 0x30303030u)) << 32;
}

/* The 6-bit codes (0..63, without the -32) of Q6_K half h: 32 bytes each, q[k] holding
 * elements 32 k .. 32 k + 31 of the half (low nibbles of ql[0..31], of ql[32..63], then their
 * high nibbles; the two high bits from qh[0..31], 2 k apart). */
static ALWAYS_INLINE void q6k_codes(const uint8_t *ql, const uint8_t *qh32, __m256i q[4]) {
    const __m256i m4 = _mm256_set1_epi8(15), m30 = _mm256_set1_epi8(0x30);
    __m256i qa = _mm256_loadu_si256((const __m256i *)ql), qb = _mm256_loadu_si256((const __m256i *)(ql + 32));
    __m256i qh = _mm256_loadu_si256((const __m256i *)qh32);
    q[0] = _mm256_or_si256(_mm256_and_si256(qa, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
    q[1] = _mm256_or_si256(_mm256_and_si256(qb, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qa, 4), m4), _mm256_and_si256(qh, m30));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qb, 4), m4), _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
}

/* byte k of every 8 bytes (k < 8) as 16 int16 lanes: pshufb control (k, zero) */
static ALWAYS_INLINE __m256i bcast_byte16(__m256i v, int k) {
    return _mm256_shuffle_epi8(v, _mm256_set1_epi16((short)(0x8000 | k)));
}

#endif
