/* The Q4_K, Q5_K and Q6_K kernels of qmatmul_avx2.c and qmatmul_vnni.c, one source for
 * both. The including file defines, before including it (where its target is in force):
 *   KQ_DOT(acc, a, s)  acc + the int32 sums of adjacent int16 products a * s
 *                      (vpmaddwd + vpaddd on AVX2, one vpdpwssd with AVX512-VNNI)
 *   KQ_NAME(base)      the exported name of a kernel (base##_avx2, base##_vnni).
 * Every integer sum is exact, so both expansions give the same bits. Unsigned weight codes
 * meet signed int8 activations in vpmaddubsw (pairs to int16, at most 2 * 63 * 127: no
 * saturation); the per-group scales are applied by KQ_DOT; each super-block's integer sum
 * is converted to f32 once. Each tile takes up to NT tokens per pass over the row. */
#ifndef KQ_DOT
#error "define KQ_DOT and KQ_NAME before including qmatmul_kquant.h"
#endif

/* T tokens; Q5_K when q5 (adds bit 2c / 2c + 1 of qh as the fifth bit). */
static ALWAYS_INLINE void qK45_tile(int nb, const uint8_t *row, size_t bsz, int q5, const char *xq, size_t xs,
                                    int T, float *y, size_t ldy) {
    __m256 acc[NT];
    UNROLL_T for (int u = 0; u < T; u++) acc[u] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
    for (int i = 0; i < nb; i++) {
        const uint8_t *b = row + (size_t)i * bsz;
        uint16_t dh, mh;
        memcpy(&dh, b, 2);
        memcpy(&mh, b + 2, 2);
        const uint8_t *scales = b + 4;
        const uint8_t *qh = q5 ? b + 4 + K_SCALE_SIZE : NULL;
        const uint8_t *qs = b + 4 + K_SCALE_SIZE + (q5 ? QK_K / 8 : 0);
        uint64_t sc, mn;
        scales_k4(scales, &sc, &mn);
        __m256i scv = _mm256_set1_epi64x((long long)sc);
        __m256i sumi[NT], sumj[NT]; /* two chains (vpdpwssd's latency) */
        UNROLL_T for (int u = 0; u < T; u++) sumi[u] = sumj[u] = _mm256_setzero_si256();
        __m256i hb = q5 ? _mm256_loadu_si256((const __m256i *)qh) : _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
            __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            if (q5) {
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * c), one), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * c + 1), one), 4));
            }
            __m256i s0 = bcast_byte16(scv, 2 * c), s1 = bcast_byte16(scv, 2 * c + 1);
            UNROLL_T for (int u = 0; u < T; u++) {
                const block_q8_K *xb = (const block_q8_K *)(xq + (size_t)u * xs) + i;
                __m256i x0 = _mm256_loadu_si256((const __m256i *)(xb->qs + 64 * c));
                __m256i x1 = _mm256_loadu_si256((const __m256i *)(xb->qs + 64 * c + 32));
                sumi[u] = KQ_DOT(sumi[u], _mm256_maddubs_epi16(lo, x0), s0);
                sumj[u] = KQ_DOT(sumj[u], _mm256_maddubs_epi16(hi, x1), s1);
            }
        }
        UNROLL_T for (int u = 0; u < T; u++) sumi[u] = _mm256_add_epi32(sumi[u], sumj[u]);
        float d = h2f(dh), dmin = h2f(mh);
        __m128i m8 = _mm_cvtsi64_si128((long long)mn);
        __m256i m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
        UNROLL_T for (int u = 0; u < T; u++) {
            const block_q8_K *xb = (const block_q8_K *)(xq + (size_t)u * xs) + i;
            __m256i pm = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)xb->bsums), m16);
            acc[u] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb->d), _mm256_cvtepi32_ps(sumi[u]), acc[u]);
            acc[u] = _mm256_fmadd_ps(_mm256_set1_ps(-dmin * xb->d), _mm256_cvtepi32_ps(pm), acc[u]);
        }
    }
    UNROLL_T for (int u = 0; u < T; u++) y[(size_t)u * ldy] = hsum8(acc[u]);
}

void KQ_NAME(qdot_q4_K)(int n, const void *row, const void *xq, size_t xs, int nt, float *y, size_t ldy) {
#define K(t) qK45_tile(n / QK_K, row, sizeof(block_q4_K), 0, xu, xs, t, yu, ldy)
    TILED(K, NT)
#undef K
}

void KQ_NAME(qdot_q5_K)(int n, const void *row, const void *xq, size_t xs, int nt, float *y, size_t ldy) {
#define K(t) qK45_tile(n / QK_K, row, sizeof(block_q5_K), 1, xu, xs, t, yu, ldy)
    TILED(K, NT)
#undef K
}

/* ---- Q6_K --------------------------------------------------------------------------- */

static ALWAYS_INLINE void q6K_tile(int nb, const block_q6_K *w, const char *xq, size_t xs, int T, float *y,
                                   size_t ldy) {
    __m256 acc[NT];
    UNROLL_T for (int u = 0; u < T; u++) acc[u] = _mm256_setzero_ps();
    for (int i = 0; i < nb; i++) {
        const block_q6_K *b = w + i;
        __m256i sumi[NT], sumj[NT]; /* two chains: even and odd k */
        UNROLL_T for (int u = 0; u < T; u++) sumi[u] = sumj[u] = _mm256_setzero_si256();
        __m256i sall = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)b->scales));
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256i q[4];
            q6k_codes(b->ql + 64 * h, b->qh + 32 * h, q);
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                int a = 8 * h + 2 * k;
                __m256i sv = _mm256_srai_epi16(
                    _mm256_shuffle_epi8(sall, _mm256_set_m128i(_mm_set1_epi8((char)(a + 1)), _mm_set1_epi8((char)a))), 8);
                UNROLL_T for (int u = 0; u < T; u++) {
                    const block_q8_K *xb = (const block_q8_K *)(xq + (size_t)u * xs) + i;
                    __m256i xv = _mm256_loadu_si256((const __m256i *)(xb->qs + 128 * h + 32 * k));
                    if (k & 1) sumj[u] = KQ_DOT(sumj[u], _mm256_maddubs_epi16(q[k], xv), sv);
                    else sumi[u] = KQ_DOT(sumi[u], _mm256_maddubs_epi16(q[k], xv), sv);
                }
            }
        }
        UNROLL_T for (int u = 0; u < T; u++) sumi[u] = _mm256_add_epi32(sumi[u], sumj[u]);
        __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
        float d = h2f(b->d);
        UNROLL_T for (int u = 0; u < T; u++) {
            const block_q8_K *xb = (const block_q8_K *)(xq + (size_t)u * xs) + i;
            __m256i corr = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)xb->bsums), sc16);
            __m256i s = _mm256_sub_epi32(sumi[u], _mm256_slli_epi32(corr, 5));
            acc[u] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb->d), _mm256_cvtepi32_ps(s), acc[u]);
        }
    }
    UNROLL_T for (int u = 0; u < T; u++) y[(size_t)u * ldy] = hsum8(acc[u]);
}

void KQ_NAME(qdot_q6_K)(int n, const void *row, const void *xq, size_t xs, int nt, float *y, size_t ldy) {
#define K(t) q6K_tile(n / QK_K, row, xu, xs, t, yu, ldy)
    TILED(K, NT)
#undef K
}
