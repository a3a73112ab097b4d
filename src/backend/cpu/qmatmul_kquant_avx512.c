/* AVX-512 (512-bit) kernels for GGUF Q4_K, Q5_K and Q6_K weights, tuned for decode
 * (1..4 tokens; correct for any count).
 *
 * Activations: x quantized per super-block of 256 exactly as qmatmul.c's Q8_K (d =
 * max|x| / 127, round to nearest even, the same int8 codes), stored as struct qxk:
 * the codes 64-byte aligned, plus the sums of each 16 and each 32 codes. For Q6_K the
 * codes are in natural order. For Q4_K/Q5_K they are in the order one 64-byte load
 * of nibbles unpacks: qs[32 c + l] (c < 4) holds elements 64 c + l (low nibble) and
 * 64 c + 32 + l (high nibble), so a 64-byte load v of qs covers 128 elements as
 * v & 15 = elements {0..31, 64..95} and v >> 4 & 15 = {32..63, 96..127} of those
 * 128; x is stored with the middle two 32-element quarters of every 128 swapped, and
 * then every weight vector meets plain 64-byte loads of x.
 *
 * Per super-block and token: vpmaddubsw (unsigned codes x int8 x, pairs to int16:
 * at most 2 * 63 * 127, never saturating) and vpdpwssd by a vector of the group
 * scales (each int16 lane the scale of its sub-block) give 16 exact int32 lane sums,
 * converted once and added with one FMA by d * dx. Q4_K/Q5_K's mins are one 128-bit
 * vpmaddwd of the 8 mins with the 8 32-sums of x; Q6_K's -32 offset is one more
 * vpdpwssd of -32 * scales with the 16 16-sums, into the same int32 lanes. The scale
 * vectors are built once per super-block and shared by all tokens of the tile:
 * Q4_K/Q5_K's packed 6-bit scales and mins are unpacked with xmm ops (~10% faster
 * from L3 than the 64-bit scalar unpack), broadcast and spread to int16 lanes with
 * vpshufb; Q6_K's signed int8 scales are widened and spread with vpermw.
 *
 * Q6_K's 6-bit unpack in 512-bit: the 64-byte ql load of half h gives elements
 * 128 h + 0..63 (low nibbles) and 128 h + 64..127 (high nibbles); the 32 qh bytes of
 * half h are duplicated into both 256-bit halves and shifted by a per-lane amount
 * (vpsllvw / vpsrlvw) so each byte's two bits land at bits 4..5; one vpternlogd
 * merges them with the nibbles.
 *
 * Tiles: one row x up to 4 tokens. A decode call (one token) streams its rows one after
 * the other (interleaving rows was slower for decode in qmatmul_avx512.c's Q8_0 kernel),
 * two rows per step sharing the setup and the horizontal sums (hsum2: the same adds as
 * hsum1, so the same bits), and a software prefetch PF_K bytes ahead (see PF_K). Each
 * (row, token) output is computed by the same instruction sequence whatever the tile's
 * token count, the rows per call and the thread split, so results depend on none of
 * them.
 *
 * Compiled with -mavx512f/bw/vl/vnni (CMakeLists.txt: every *_avx512.c); nothing here
 * runs before qmatmul.c has checked the CPU. */
#include "backend/cpu/qmatmul_avx512.h"

#include "tensor/quant.h"

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))
#define UNROLL_T _Pragma("GCC unroll 4")

_Static_assert(sizeof(struct qxk) == 320, "qxk");

enum { KT = 4 }; /* most tokens per tile */

/* Decode (one token): software prefetch of the weight stream this many bytes ahead, 3
 * (Q4_K/Q5_K) or 4 (Q6_K) lines per super-block. Qwen3-0.6B Q4_K_M decode, gerbil bench
 * tg64, 1 thread, back to back (load ~3): none 50-54 tok/s, 1024 49, 4096 56-59, 8192
 * 63-65, 16384 56-60 (main's 256-bit kernels: 47-49). Without it the kernel ran as fast
 * from DRAM as from L3 in bench_qmatmul but not end to end. */
#ifndef PF_K
#define PF_K 8192
#endif

/* ---- activations --------------------------------------------------------------------- */

void qk_quant_x_avx512(const float *x, int n, int q4order, struct qxk *out) {
    for (int i = 0; i < n / QK_K; i++, x += QK_K) {
        struct qxk *o = out + i;
        __m512 v[16];
        __m512 mx = _mm512_setzero_ps();
        for (int g = 0; g < 16; g++) {
            v[g] = _mm512_loadu_ps(x + 16 * g);
            mx = _mm512_max_ps(mx, _mm512_abs_ps(v[g]));
        }
        float amax = _mm512_reduce_max_ps(mx);
        float id = amax > 0.0f ? 127.0f / amax : 0.0f;
        o->d = amax / 127.0f;
        __m512 idv = _mm512_set1_ps(id);
        for (int g = 0; g < 16; g++) {
            /* vcvtps2dq rounds to nearest even, as qmatmul.c's round_near */
            __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(v[g], idv));
            int s = _mm512_reduce_add_epi32(q);
            o->bsums[g] = (int16_t)s;
            /* Q4_K order: 16-element groups 2, 3 and 4, 5 of every 8 swap places */
            int k = g & 7, dst = q4order && k >= 2 && k < 6 ? (g & 8) + (k < 4 ? k + 2 : k - 2) : g;
            _mm_storeu_si128((__m128i *)(o->qs + 16 * dst), _mm512_cvtepi32_epi8(q));
        }
        for (int s = 0; s < 8; s++) o->bsum32[s] = (int16_t)(o->bsums[2 * s] + o->bsums[2 * s + 1]);
        memset(o->pad, 0, sizeof o->pad);
    }
}

/* ---- Q4_K / Q5_K ------------------------------------------------------------------------ */

/* The 8 6-bit scales and 8 6-bit mins of a Q4_K/Q5_K super-block (see qmatmul.c's
 * scale_min_k4) as one xmm: bytes 0..3 scales 0..3, 4..7 mins 0..3, 8..11 scales 4..7,
 * 12..15 mins 4..7. Bytes 0..3 of s hold scales 0..3 (low 6 bits) and the top 2 bits of
 * scales 4..7; bytes 4..7 the same for the mins; bytes 8..11 the low 4 bits of scales
 * 4..7 (low nibbles) and mins 4..7 (high nibbles). */
AI __m128i k4_scales(const uint8_t *s) {
    /* dwords a0 a1 a2 (a 16-byte load: the 4 bytes past the scales are the block's codes) */
    __m128i v = _mm_loadu_si128((const __m128i *)s);
    __m128i t = _mm_srlv_epi32(_mm_shuffle_epi32(v, 0xA4), _mm_set_epi32(4, 0, 0, 0)); /* a0 a1 a2 a2>>4 */
    __m128i u = _mm_srli_epi32(_mm_shuffle_epi32(v, 0x44), 2);                          /* .. .. a0>>2 a1>>2 */
    t = _mm_and_si128(t, _mm_set_epi32(0x0f0f0f0f, 0x0f0f0f0f, 0x3f3f3f3f, 0x3f3f3f3f));
    return _mm_ternarylogic_epi32(t, u, _mm_set_epi32(0x30303030, 0x30303030, 0, 0), 0xF8); /* t | (u & m) */
}

/* pshufb control: int16 lanes of 128-bit lanes 0, 1 take scale a, those of lanes 2, 3
 * scale b (k4_scales' byte j for j < 4, j + 4 above; high bytes zero) */
AI __m512i sel2(int a, int b) {
    a += a < 4 ? 0 : 4;
    b += b < 4 ? 0 : 4;
    __m128i ca = _mm_set1_epi16((short)(0x8000 | a)), cb = _mm_set1_epi16((short)(0x8000 | b));
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(ca, ca)), _mm256_set_m128i(cb, cb), 1);
}

/* The integer sum of 256 codes (four 64-byte vectors w, unsigned) times x (four vectors at
 * xv, int8), pairs scaled by s in int16: two chains, p over w0 and w2, q over w1 and w3;
 * vpmaddwd starts each (vpdpwssd from zero, the same sums). */
AI void dot4(__m512i w0, __m512i w1, __m512i w2, __m512i w3, __m512i s0, __m512i s1, __m512i s2, __m512i s3,
             const __m512i *xv, __m512i *p, __m512i *q) {
    *p = _mm512_madd_epi16(_mm512_maddubs_epi16(w0, _mm512_load_si512(xv)), s0);
    *q = _mm512_madd_epi16(_mm512_maddubs_epi16(w1, _mm512_load_si512(xv + 1)), s1);
    *p = _mm512_dpwssd_epi32(*p, _mm512_maddubs_epi16(w2, _mm512_load_si512(xv + 2)), s2);
    *q = _mm512_dpwssd_epi32(*q, _mm512_maddubs_epi16(w3, _mm512_load_si512(xv + 3)), s3);
}

/* One row (nb super-blocks) against T tokens: out[u] = 16 lanes summing to y; Q5_K when q5. */
AI void k45_tile(int nb, const uint8_t *row, int q5, const char *xq, size_t xs, int T, __m512 out[KT]) {
    const size_t bsz = q5 ? sizeof(block_q5_K) : sizeof(block_q4_K);
    const __m512i m4 = _mm512_set1_epi8(15), m10 = _mm512_set1_epi8(0x10);
    /* weight vectors: lo0 = subs 0 | 2, hi0 = 1 | 3, lo1 = 4 | 6, hi1 = 5 | 7 */
    const __m512i c0 = sel2(0, 2), c1 = sel2(1, 3), c2 = sel2(4, 6), c3 = sel2(5, 7);
    const __m128i mnsel = _mm_set_epi8(-128, 15, -128, 14, -128, 13, -128, 12, -128, 7, -128, 6, -128, 5, -128, 4);
    /* Q5_K: fifth bit of sub-block j is bit j of qh[l]; moved to bit 4 */
    const __m512i sh0 = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i sh1 = _mm512_inserti64x4(_mm512_set1_epi16(3), _mm256_set1_epi16(1), 1);
    const __m512i sh2 = _mm512_inserti64x4(_mm512_set1_epi16(0), _mm256_set1_epi16(2), 1);
    const __m512i sh3 = _mm512_inserti64x4(_mm512_set1_epi16(1), _mm256_set1_epi16(3), 1);
    __m512 acc[KT];
    __m128 accm[KT];
    UNROLL_T for (int u = 0; u < T; u++) {
        acc[u] = _mm512_setzero_ps();
        accm[u] = _mm_setzero_ps();
    }
    for (int i = 0; i < nb; i++) {
        const uint8_t *b = row + (size_t)i * bsz;
        if (T == 1 && PF_K != 0) {
            _mm_prefetch((const char *)b + PF_K, _MM_HINT_T0);
            _mm_prefetch((const char *)b + PF_K + 64, _MM_HINT_T0);
            _mm_prefetch((const char *)b + PF_K + 128, _MM_HINT_T0);
        }
        uint32_t dm;
        memcpy(&dm, b, 4);
        __m128 dd = _mm_cvtph_ps(_mm_cvtsi32_si128((int)dm)); /* d, dmin */
        __m128i sm = k4_scales(b + 4);
        const uint8_t *qs = b + 4 + K_SCALE_SIZE + (q5 ? QK_K / 8 : 0);
        __m512i v0 = _mm512_loadu_si512(qs), v1 = _mm512_loadu_si512(qs + 64);
        __m512i w0 = _mm512_and_si512(v0, m4), w1 = _mm512_and_si512(_mm512_srli_epi16(v0, 4), m4);
        __m512i w2 = _mm512_and_si512(v1, m4), w3 = _mm512_and_si512(_mm512_srli_epi16(v1, 4), m4);
        if (q5) {
            __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b + 4 + K_SCALE_SIZE)));
            /* w | (shifted qh & 0x10) */
            w0 = _mm512_ternarylogic_epi32(w0, _mm512_sllv_epi16(h, sh0), m10, 0xF8);
            w1 = _mm512_ternarylogic_epi32(w1, _mm512_sllv_epi16(h, sh1), m10, 0xF8);
            w2 = _mm512_ternarylogic_epi32(w2, _mm512_srlv_epi16(h, sh2), m10, 0xF8);
            w3 = _mm512_ternarylogic_epi32(w3, _mm512_srlv_epi16(h, sh3), m10, 0xF8);
        }
        __m512i scb = _mm512_broadcast_i32x4(sm);
        __m512i s0 = _mm512_shuffle_epi8(scb, c0), s1 = _mm512_shuffle_epi8(scb, c1);
        __m512i s2 = _mm512_shuffle_epi8(scb, c2), s3 = _mm512_shuffle_epi8(scb, c3);
        __m128i mn16 = _mm_shuffle_epi8(sm, mnsel);
        UNROLL_T for (int u = 0; u < T; u++) {
            const struct qxk *xb = (const struct qxk *)(xq + (size_t)u * xs) + i;
            __m512i p, q;
            dot4(w0, w1, w2, w3, s0, s1, s2, s3, (const __m512i *)xb->qs, &p, &q);
            __m128 f = _mm_mul_ps(dd, _mm_set1_ps(xb->d)); /* d dx, dmin dx */
            acc[u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(p, q)), _mm512_broadcastss_ps(f), acc[u]);
            __m128i m = _mm_madd_epi16(mn16, _mm_load_si128((const __m128i *)xb->bsum32));
            accm[u] = _mm_fnmadd_ps(_mm_cvtepi32_ps(m), _mm_permute_ps(f, 0x55), accm[u]);
        }
    }
    UNROLL_T for (int u = 0; u < T; u++) out[u] = _mm512_add_ps(acc[u], _mm512_zextps128_ps512(accm[u]));
}

/* ---- Q6_K ---------------------------------------------------------------------------------- */

AI void q6_tile(int nb, const block_q6_K *row, const char *xq, size_t xs, int T, __m512 out[KT]) {
    const __m512i m4 = _mm512_set1_epi8(15), m30 = _mm512_set1_epi8(0x30);
    /* qh bits 0..1 (low half, elements 0..31 of the half) and 2..3 (high half, 32..63) to
     * bits 4..5: left by 4 and 2; bits 4..5 and 6..7 (elements 64..127): right by 0, 2 */
    const __m512i shl = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i shr = _mm512_inserti64x4(_mm512_set1_epi16(0), _mm256_set1_epi16(2), 1);
    /* int16 lane l of weight vector k (order lo0, hi0, lo1, hi1) is in sub-block 4 k + l / 8 */
    const __m512i lane = _mm512_srli_epi16(
        _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7,
                         6, 5, 4, 3, 2, 1, 0),
        3);
    const __m512i i0 = lane, i1 = _mm512_add_epi16(lane, _mm512_set1_epi16(4));
    const __m512i i2 = _mm512_add_epi16(lane, _mm512_set1_epi16(8)), i3 = _mm512_add_epi16(lane, _mm512_set1_epi16(12));
    __m512 acc[KT];
    UNROLL_T for (int u = 0; u < T; u++) acc[u] = _mm512_setzero_ps();
    for (int i = 0; i < nb; i++) {
        const block_q6_K *b = row + i;
        if (T == 1 && PF_K != 0) {
            const char *p = (const char *)b + PF_K;
            _mm_prefetch(p, _MM_HINT_T0);
            _mm_prefetch(p + 64, _MM_HINT_T0);
            _mm_prefetch(p + 128, _MM_HINT_T0);
            _mm_prefetch(p + 192, _MM_HINT_T0);
        }
        __m512i ql0 = _mm512_loadu_si512(b->ql), ql1 = _mm512_loadu_si512(b->ql + 64);
        __m512i qh = _mm512_loadu_si512(b->qh);
        __m512i qh0 = _mm512_shuffle_i64x2(qh, qh, 0x44), qh1 = _mm512_shuffle_i64x2(qh, qh, 0xEE);
        /* (nibbles & 15) | high bits: vpternlogd A & C | B */
        __m512i w0 = _mm512_ternarylogic_epi32(ql0, _mm512_and_si512(_mm512_sllv_epi16(qh0, shl), m30), m4, 0xEC);
        __m512i w1 = _mm512_ternarylogic_epi32(_mm512_srli_epi16(ql0, 4), _mm512_and_si512(_mm512_srlv_epi16(qh0, shr), m30),
                                               m4, 0xEC);
        __m512i w2 = _mm512_ternarylogic_epi32(ql1, _mm512_and_si512(_mm512_sllv_epi16(qh1, shl), m30), m4, 0xEC);
        __m512i w3 = _mm512_ternarylogic_epi32(_mm512_srli_epi16(ql1, 4), _mm512_and_si512(_mm512_srlv_epi16(qh1, shr), m30),
                                               m4, 0xEC);
        /* the 16 scales in int16 lanes 0..15, lanes 16..31 zero */
        __m512i scz = _mm512_cvtepi8_epi16(_mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)b->scales)));
        __m512i s0 = _mm512_permutexvar_epi16(i0, scz), s1 = _mm512_permutexvar_epi16(i1, scz);
        __m512i s2 = _mm512_permutexvar_epi16(i2, scz), s3 = _mm512_permutexvar_epi16(i3, scz);
        /* the -32 offset: -32 sum_g sc_g bsums_g, one more vpdpwssd against a 64-byte load at
         * bsums (lanes 16..31 meet the zero lanes) */
        __m512i scn = _mm512_mullo_epi16(scz, _mm512_set1_epi16(-32));
        uint16_t dh;
        memcpy(&dh, &b->d, 2);
        __m512 d = _mm512_cvtph_ps(_mm256_set1_epi16((short)dh));
        UNROLL_T for (int u = 0; u < T; u++) {
            const struct qxk *xb = (const struct qxk *)(xq + (size_t)u * xs) + i;
            __m512i p, q;
            dot4(w0, w1, w2, w3, s0, s1, s2, s3, (const __m512i *)xb->qs, &p, &q);
            p = _mm512_dpwssd_epi32(p, _mm512_load_si512(xb->bsums), scn);
            __m512 f = _mm512_mul_ps(d, _mm512_set1_ps(xb->d));
            acc[u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(p, q)), f, acc[u]);
        }
    }
    UNROLL_T for (int u = 0; u < T; u++) out[u] = acc[u];
}

/* ---- entry points ----------------------------------------------------------------------------- */

enum { K_Q4, K_Q5, K_Q6 };

AI void ktile(int kind, int nb, const uint8_t *row, const char *xq, size_t xs, int T, __m512 out[KT]) {
    if (kind == K_Q6) q6_tile(nb, (const block_q6_K *)row, xq, xs, T, out);
    else k45_tile(nb, row, kind == K_Q5, xq, xs, T, out);
}

/* The sum of v's 16 lanes: halves added (lane i + lane i + 8), then i + 4, i + 2, i + 1. */
AI float hsum1(__m512 v) {
    __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

/* hsum1 of a and of b, the same adds (so the same bits), two rows per instruction. */
AI void hsum2(__m512 a, __m512 b, float *ya, float *yb) {
    __m512 t = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE)); /* a s8, b s8 */
    __m512 u = _mm512_add_ps(_mm512_shuffle_f32x4(t, t, 0x88), _mm512_shuffle_f32x4(t, t, 0xDD)); /* a s4, b s4 */
    __m256 s4 = _mm512_castps512_ps256(u);
    __m256 s2 = _mm256_add_ps(s4, _mm256_permute_ps(s4, 0x4E));
    __m256 s1 = _mm256_add_ps(s2, _mm256_movehdup_ps(s2));
    *ya = _mm256_cvtss_f32(s1);
    *yb = _mm_cvtss_f32(_mm256_extractf128_ps(s1, 1));
}

/* Tiles of up to KT tokens; one token: rows two at a time, one after the other (one
 * sequential weight stream), their horizontal sums shared (hsum2). */
AI void krows(int kind, int n, int nr, const void *row0, size_t rb, const void *xq, size_t xs, int nt, float *y,
              size_t ldy) {
    int nb = n / QK_K;
    for (int u0 = 0; u0 < nt; u0 += KT) {
        int T = nt - u0 < KT ? nt - u0 : KT;
        const char *xu = (const char *)xq + (size_t)u0 * xs;
        float *yu = y + (size_t)u0 * ldy;
        __m512 o[KT], o2[KT];
        int r = 0;
        if (T == 1) {
            for (; r + 1 < nr; r += 2) {
                const uint8_t *row = (const uint8_t *)row0 + (size_t)r * rb;
                ktile(kind, nb, row, xu, xs, 1, o);
                ktile(kind, nb, row + rb, xu, xs, 1, o2);
                hsum2(o[0], o2[0], yu + r, yu + r + 1);
            }
        }
        for (; r < nr; r++) {
            const uint8_t *row = (const uint8_t *)row0 + (size_t)r * rb;
            switch (T) {
            case 4: ktile(kind, nb, row, xu, xs, 4, o); break;
            case 3: ktile(kind, nb, row, xu, xs, 3, o); break;
            case 2: ktile(kind, nb, row, xu, xs, 2, o); break;
            default: ktile(kind, nb, row, xu, xs, 1, o); break;
            }
            for (int u = 0; u < T; u++) yu[(size_t)u * ldy + r] = hsum1(o[u]);
        }
    }
}

void qrows_q4_K_avx512(int n, int nr, const void *row0, size_t rb, const void *xq, size_t xs, int nt, float *y,
                       size_t ldy) {
    krows(K_Q4, n, nr, row0, rb, xq, xs, nt, y, ldy);
}

void qrows_q5_K_avx512(int n, int nr, const void *row0, size_t rb, const void *xq, size_t xs, int nt, float *y,
                       size_t ldy) {
    krows(K_Q5, n, nr, row0, rb, xq, xs, nt, y, ldy);
}

void qrows_q6_K_avx512(int n, int nr, const void *row0, size_t rb, const void *xq, size_t xs, int nt, float *y,
                       size_t ldy) {
    krows(K_Q6, n, nr, row0, rb, xq, xs, nt, y, ldy);
}
