/* AVX-512 (512-bit) kernels for MLX affine weights, w = s_g q + b_g per group g:
 *   dot(w, x) = sum_g s_g (q . x~)_g + sum_g b_g xsum_g,
 * with x~ = d_b qx the 16-bit block quantization of qmatmul.c (the error is w . (x~ - x),
 * 256 times smaller than 8-bit activations; 8-bit ones break the MLX golden bound).
 *
 * Codes meet the 16-bit x in vpdpwssd (int16 pairs to int32, exact: at most
 * 8 * 255 * 32767 per lane and chunk). A chunk is 128 elements, one 64-byte load of
 * 4-bit codes read as 32 int16 lanes: lane k holds codes 4k..4k+3 in its four nibbles,
 * so four mask/shift ops give four code vectors (code 4k + j in lane k of vector j)
 * and x is stored in that order (struct qx128). The int32 lane m of the sum then
 * covers elements 8m..8m+7, inside one 32-element x block and one group, so one
 * vcvtdq2ps, one multiply by the lanes' block steps and one FMA by the lanes' group
 * scales finish the chunk; no per-block horizontal work. 8-bit codes: two 64-byte
 * loads, bytes split into even and odd int16 lanes; lane m covers 4 elements.
 * The bias terms are 16 groups per FMA (biases x group sums of x~), into the same
 * accumulator; one horizontal sum per output.
 *
 * Tiles: up to 4 rows x 4 tokens per pass; each row's codes are unpacked once per
 * chunk and used for every token (prefill), and a decode pass streams 4 rows against
 * one token held in L1. The instruction sequence for one (row, token) is the same in
 * every tile shape, so results depend on neither the tiling nor the thread split.
 * These kernels read MLX's own code order (weights mapped from the file with --mmap);
 * 4-bit weights packed at load go to mlxdot4p_avx512 (below) instead.
 *
 * Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512vnni (CMakeLists.txt: every
 * *_avx512.c); nothing here runs before qmatmul.c has checked the CPU. */
#include "backend/cpu/qmatmul_avx512.h"
#include "backend/cpu/simd512.h"

#include <immintrin.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 8")

/* Most rows and tokens per tile: 4 x 2 keeps the 8 accumulators, 4 rows' unpacked
 * codes and scales in the 32 zmm registers (4 x 4 spilled; 2 x 4, 3 x 3 and 2 x 2 ran
 * slower in bench_qmatmul). */
enum { MR = 4, MT = 2 };

/* Decode (one token) streams the weights from DRAM, 4 rows interleaved 64 bytes at a
 * time; a software prefetch this many bytes ahead (the next tile, for 1024-wide rows)
 * ran MLX 4-bit decode 1.2-1.35x faster end to end (gerbil bench tg64, 1 thread, load ~5;
 * 2048, 4096 and 8192 within noise of each other). */
#ifndef PREFETCH
#define PREFETCH 2048
#endif
/* Into L1: T1, T2 and NTA ran the 4-bit decode kernel within noise of T0 from DRAM. */
#ifndef PF_HINT
#define PF_HINT _MM_HINT_T0
#endif
/* Rows per decode tile: 1, so the weights stream sequentially; 4 interleaved rows ran
 * Q8_0 decode at 21 against 33 tok/s end to end (MLX 4-bit ~41 both ways). */
#ifndef DEC_R
#define DEC_R 1
#endif

/* ---- activations ----------------------------------------------------------------------- */

/* One block of 32 x to integers in [-levels, levels]: q[0], q[1] elements 0..15, 16..31
 * (vcvtps2dq rounds to nearest even, as qmatmul.c's round_near); returns the step
 * max|x| / levels (0 for an all-zero block). */
AI float quant_block32(const float *xb, float levels, __m512i q[2]) {
    __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
    float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
    float id = amax > 0.0f ? levels / amax : 0.0f;
    q[0] = _mm512_cvtps_epi32(_mm512_mul_ps(x0, _mm512_set1_ps(id)));
    q[1] = _mm512_cvtps_epi32(_mm512_mul_ps(x1, _mm512_set1_ps(id)));
    return amax / levels;
}

/* quant_block32's codes as 32 int16 lanes, and their sum. */
AI __m512i block16(const __m512i q[2], int *sum) {
    *sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q[0], q[1]));
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(q[0])), _mm512_cvtepi32_epi16(q[1]), 1);
}

void mlx_quant_x_avx512(const float *x, int n, int bits, int gs, struct qx128 *out, float *gsum) {
    const __m512i ie = _mm512_set_epi16(62, 60, 58, 56, 54, 52, 50, 48, 46, 44, 42, 40, 38, 36, 34, 32, 30, 28, 26,
                                        24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i io = _mm512_add_epi16(ie, _mm512_set1_epi16(1));
    int lg = __builtin_ctz((unsigned)gs), ng = n >> lg;
    for (int g = 0; g < ng; g++) gsum[g] = 0.0f;
    for (int c = 0; c < n / 128; c++) {
        const float *xc = x + 128 * c;
        __m512i B[4];
        float d[4];
        for (int b = 0; b < 4; b++) {
            __m512i q[2];
            int sum;
            d[b] = quant_block32(xc + 32 * b, 32767.0f, q);
            B[b] = block16(q, &sum);
            gsum[(32 * (4 * c + b)) >> lg] += d[b] * (float)sum;
        }
        /* even / odd elements of each 64 */
        __m512i E0 = _mm512_permutex2var_epi16(B[0], ie, B[1]), O0 = _mm512_permutex2var_epi16(B[0], io, B[1]);
        __m512i E1 = _mm512_permutex2var_epi16(B[2], ie, B[3]), O1 = _mm512_permutex2var_epi16(B[2], io, B[3]);
        int16_t *qs = out[c].qs;
        float *dv = out[c].dv;
        if (bits == 4) {
            /* x[4k + j]: every other element of the evens (j = 0, 2) or the odds (1, 3) */
            _mm512_storeu_si512(qs, _mm512_permutex2var_epi16(E0, ie, E1));
            _mm512_storeu_si512(qs + 32, _mm512_permutex2var_epi16(O0, ie, O1));
            _mm512_storeu_si512(qs + 64, _mm512_permutex2var_epi16(E0, io, E1));
            _mm512_storeu_si512(qs + 96, _mm512_permutex2var_epi16(O0, io, O1));
            for (int m = 0; m < 16; m++) dv[m] = d[m / 4];
            for (int m = 16; m < 32; m++) dv[m] = 0.0f;
        } else {
            _mm512_storeu_si512(qs, E0);
            _mm512_storeu_si512(qs + 32, O0);
            _mm512_storeu_si512(qs + 64, E1);
            _mm512_storeu_si512(qs + 96, O1);
            for (int m = 0; m < 32; m++) dv[m] = d[m / 8];
        }
    }
}

/* ---- kernels ----------------------------------------------------------------------------- */

/* 16 (masked) scales or biases from index g0, as f32. */
AI __m512 sb16(const void *p, enum gb_type t, int g0, __mmask16 m) {
    if (t == GB_TYPE_F32) return _mm512_maskz_loadu_ps(m, (const float *)p + g0);
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)p + g0);
    if (t == GB_TYPE_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* Most tokens of a tile (either layout). */
enum { TILE_TMAX = 4 };

/* The start of a run of 16 groups (from g0) for R rows x T tokens: each row's scales into
 * s16[r] (converted once per row and run) and its bias terms (16 biases x 16 group sums of
 * x per FMA) into acc[r][t]. */
AI void group_run(int R, int T, int g0, int ng, const char *sc, const char *bi, size_t sbr, enum gb_type sbt,
                  const float *gsum, size_t gstr, __m512 *s16, __m512 (*acc)[TILE_TMAX]) {
    __mmask16 m = lanes16(ng - g0);
    UNROLL for (int r = 0; r < R; r++) {
        __m512 b = sb16(bi + (size_t)r * sbr, sbt, g0, m);
        s16[r] = sb16(sc + (size_t)r * sbr, sbt, g0, m);
        UNROLL for (int t = 0; t < T; t++)
            acc[r][t] = _mm512_fmadd_ps(b, _mm512_maskz_loadu_ps(m, gsum + (size_t)t * gstr + g0), acc[r][t]);
    }
}

AI void mlx_tile(int bits, int R, int T, int n, int gs, const uint8_t *codes, size_t rb, const char *sc,
                 const char *bi, size_t sbr, enum gb_type sbt, const char *xq, size_t xs, const float *gsum,
                 size_t gstr, float *y, size_t ldy) {
    int lg = __builtin_ctz((unsigned)gs), ng = n >> lg;
    int gpc = 128 >> lg; /* groups per chunk */
    /* lane m's group within the chunk: element 8m (4-bit), 4m and 64 + 4m (8-bit) */
    __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    __m512i ix0 = _mm512_srli_epi32(_mm512_slli_epi32(lane, bits == 4 ? 3 : 2), lg);
    __m512i ix1 = _mm512_srli_epi32(_mm512_add_epi32(_mm512_slli_epi32(lane, 2), _mm512_set1_epi32(64)), lg);
    const __m512i step = _mm512_set1_epi32(gpc);
    const __m512i m4 = _mm512_set1_epi16(15), m8 = _mm512_set1_epi16(255);
    __m512 acc[MR][TILE_TMAX];
    UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    /* runs of 16 groups (16 gs / 128 chunks) */
    for (int g0 = 0, c = 0; g0 < ng; g0 += 16) {
        __m512 s16[MR];
        group_run(R, T, g0, ng, sc, bi, sbr, sbt, gsum, gstr, s16, acc);
        int c1 = (ng - g0 >= 16 ? g0 + 16 : ng) >> (7 - lg); /* chunk c covers groups c gpc .. */
        __m512i i0 = ix0, i1 = ix1;
        for (; c < c1; c++, i0 = _mm512_add_epi32(i0, step), i1 = _mm512_add_epi32(i1, step)) {
            UNROLL for (int r = 0; r < R; r++) {
                __m512i w0, w1, w2, w3;
                const uint8_t *cr = codes + (size_t)r * rb + (size_t)c * (size_t)(16 * bits);
                if (T == 1) _mm_prefetch((const char *)cr + PREFETCH, PF_HINT);
                if (bits == 4) {
                    __m512i v = _mm512_loadu_si512(cr);
                    w0 = _mm512_and_si512(v, m4);
                    w1 = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                    w2 = _mm512_and_si512(_mm512_srli_epi16(v, 8), m4);
                    w3 = _mm512_srli_epi16(v, 12);
                } else {
                    __m512i v0 = _mm512_loadu_si512(cr), v1 = _mm512_loadu_si512(cr + 64);
                    w0 = _mm512_and_si512(v0, m8);
                    w1 = _mm512_srli_epi16(v0, 8);
                    w2 = _mm512_and_si512(v1, m8);
                    w3 = _mm512_srli_epi16(v1, 8);
                }
                __m512 sv0 = _mm512_permutexvar_ps(i0, s16[r]);
                __m512 sv1 = bits == 8 ? _mm512_permutexvar_ps(i1, s16[r]) : sv0;
                UNROLL for (int t = 0; t < T; t++) {
                    const struct qx128 *xb = (const struct qx128 *)(xq + (size_t)t * xs) + c;
                    const __m512i *q = (const __m512i *)xb->qs;
                    if (bits == 4) {
                        __m512i s = _mm512_dpwssd_epi32(_mm512_setzero_si512(), w0, _mm512_loadu_si512(q));
                        s = _mm512_dpwssd_epi32(s, w1, _mm512_loadu_si512(q + 1));
                        s = _mm512_dpwssd_epi32(s, w2, _mm512_loadu_si512(q + 2));
                        s = _mm512_dpwssd_epi32(s, w3, _mm512_loadu_si512(q + 3));
                        __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_loadu_ps(xb->dv));
                        acc[r][t] = _mm512_fmadd_ps(f, sv0, acc[r][t]);
                    } else {
                        __m512i s = _mm512_dpwssd_epi32(_mm512_setzero_si512(), w0, _mm512_loadu_si512(q));
                        s = _mm512_dpwssd_epi32(s, w1, _mm512_loadu_si512(q + 1));
                        __m512i u = _mm512_dpwssd_epi32(_mm512_setzero_si512(), w2, _mm512_loadu_si512(q + 2));
                        u = _mm512_dpwssd_epi32(u, w3, _mm512_loadu_si512(q + 3));
                        __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_loadu_ps(xb->dv));
                        __m512 e = _mm512_mul_ps(_mm512_cvtepi32_ps(u), _mm512_loadu_ps(xb->dv + 16));
                        acc[r][t] = _mm512_fmadd_ps(f, sv0, acc[r][t]);
                        acc[r][t] = _mm512_fmadd_ps(e, sv1, acc[r][t]);
                    }
                }
            }
        }
    }
    UNROLL for (int t = 0; t < T; t++) UNROLL for (int r = 0; r < R; r++) y[(size_t)t * ldy + r] =
        _mm512_reduce_add_ps(acc[r][t]);
}

_Static_assert(MT == 2 && (int)MT <= (int)TILE_TMAX, "TILE_T");
#define TILE_T(R)                                                                                         \
    switch (t) {                                                                                          \
    case 2: mlx_tile(bits, R, 2, n, gs, codes, rb, sc, bi, sbr, sbt, xu, xs, gu, gstr, yu, ldy); break; \
    default: mlx_tile(bits, R, 1, n, gs, codes, rb, sc, bi, sbr, sbt, xu, xs, gu, gstr, yu, ldy); break; \
    }

/* Several tokens: rows in blocks of RBLK, and for each pass of tokens (MT, PT) every row of
 * the block, so the pass's x (PT rows of n bytes) stays in L1 across the block's rows and their
 * codes (RBLK n / 2 bytes) in L1/L2 across the passes. One row at a time through all the
 * tokens had streamed all of x from L2 for every row once it outgrew L1: 16 tokens of 3072
 * ran 40-46 GMAC/s against 72-76 at 1024 wide (1 thread, 3072 x 1024 and 1024 x 3072). */
enum { RBLK = 16 };

AI void mlxdot(int bits, int n, int gs, int nr, const uint8_t *codes0, size_t rb, const void *scv, const void *biv,
               size_t sbr, enum gb_type sbt, const void *xq, size_t xs, const float *gsum, size_t gstr, int nt,
               float *y, size_t ldy) {
    int rstep = nt == 1 ? DEC_R : MR, rblk = nt == 1 ? nr : RBLK; /* RBLK: a multiple of MR */
    for (int b0 = 0; b0 < nr; b0 += rblk) {
        int b1 = nr - b0 < rblk ? nr : b0 + rblk;
        for (int u0 = 0; u0 < nt; u0 += MT) {
            int t = nt - u0 < MT ? nt - u0 : MT;
            const char *xu = (const char *)xq + (size_t)u0 * xs;
            const float *gu = gsum + (size_t)u0 * gstr;
            for (int r0 = b0; r0 < b1; r0 += rstep) {
                const char *sc = (const char *)scv + (size_t)r0 * sbr, *bi = (const char *)biv + (size_t)r0 * sbr;
                const uint8_t *codes = codes0 + (size_t)r0 * rb;
                int nrr = b1 - r0 < rstep ? b1 - r0 : rstep;
                float *yu = y + (size_t)u0 * ldy + r0;
                switch (nrr) {
                case 4: TILE_T(4) break;
                case 3: TILE_T(3) break;
                case 2: TILE_T(2) break;
                default: TILE_T(1) break;
                }
            }
        }
    }
}

/* ---- 4-bit, packed rows ------------------------------------------------------------------
 * The codes of weights packed at load (mlx_packed.h, mlx4_packed_word): per set of 16
 * blocks of 32 elements, chunk j (j < 4) holds word j of every block, so int32 lane m of a
 * chunk's dot products always belongs to block m of the set. A lane's integer sum then runs
 * over its whole block (4 chunks) before the one float step per set: cvt, times the 16
 * block steps of x, times the lanes' group scales, into the accumulator. Against the native
 * order (a new block, step and scale every 32 lanes of work) that is 5 float operations per
 * 4 chunks instead of 4 per chunk.
 *
 * Rows are packed in quads (a set's chunk j of the 4 rows in turn), and decode takes a quad
 * per pass: each load of x serves 4 rows and the codes are one sequential stream. Measured
 * (512 MiB of 3072 x 1024 matrices, 1 thread, Zen 5, in one process, alternating per
 * matrix): 25.5-28.8 GB/s against 18.2-24.0 for one row per pass over rows packed one by
 * one, and 29-32 for a plain read of the same bytes. (4 rows per pass over rows packed one
 * by one, four streams, ran no faster than one: 19.5 against 24.3.)
 *
 * x = 256 h + l (h signed, l unsigned bytes; exact for 16-bit x): the codes (0..15) are the
 * unsigned operand of vpdpbusd against h and the signed one against l, two code vectors per
 * 64-byte load (low nibbles: even elements, high: odd). Lane sums stay far inside int32
 * (32 x 15 x 32767 for a block). */

/* The x of one token for packed rows, per set: he/ho/le/lo bytes of chunk j at
 * q[j][0..255] (each 64: lane m = block m), the 16 block steps in dv. */
_Static_assert(sizeof(struct qx512) == 1088, "qx512");

/* 16 dwords of a set (4 x 4 per zmm: z[i] lane 4b + j = block 4i + b, dword j) to chunk
 * order: c[j] lane 4i + b. */
AI void set_transpose(const __m512i z[4], __m512i c[4]) {
    const __m512i p01 = _mm512_set_epi32(29, 25, 21, 17, 13, 9, 5, 1, 28, 24, 20, 16, 12, 8, 4, 0);
    const __m512i p23 = _mm512_set_epi32(31, 27, 23, 19, 15, 11, 7, 3, 30, 26, 22, 18, 14, 10, 6, 2);
    __m512i a01 = _mm512_permutex2var_epi32(z[0], p01, z[1]), a23 = _mm512_permutex2var_epi32(z[0], p23, z[1]);
    __m512i b01 = _mm512_permutex2var_epi32(z[2], p01, z[3]), b23 = _mm512_permutex2var_epi32(z[2], p23, z[3]);
    c[0] = _mm512_shuffle_i64x2(a01, b01, 0x44);
    c[1] = _mm512_shuffle_i64x2(a01, b01, 0xEE);
    c[2] = _mm512_shuffle_i64x2(a23, b23, 0x44);
    c[3] = _mm512_shuffle_i64x2(a23, b23, 0xEE);
}

void mlx_quant_x4p_avx512(const float *x, int n, int gs, struct qx512 *out, float *gsum) {
    const __m512i iev = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 30, 28, 26, 24, 22, 20, 18,
                                         16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i iod = _mm512_add_epi16(iev, _mm512_set1_epi16(1));
    int lg = __builtin_ctz((unsigned)gs), nb = n / 32;
    for (int g = 0; g < n >> lg; g++) gsum[g] = 0.0f;
    for (int s = 0; 16 * s < nb; s++) {
        /* per block: hi/lo bytes of its even and odd elements (16 each) */
        _Alignas(64) uint8_t part[4][16][16]; /* [he, ho, le, lo][block] */
        struct qx512 *o = out + s;
        memset(part, 0, sizeof part);
        for (int m = 0; m < 16; m++) {
            int b = 16 * s + m;
            if (b >= nb) {
                o->dv[m] = 0.0f;
                continue;
            }
            __m512i qb[2];
            int sum;
            float d = quant_block32(x + 32 * b, 32767.0f, qb);
            __m512i q = block16(qb, &sum);
            o->dv[m] = d;
            gsum[(32 * b) >> lg] += d * (float)sum;
            __m256i ev = _mm512_castsi512_si256(_mm512_permutexvar_epi16(iev, q));
            __m256i od = _mm512_castsi512_si256(_mm512_permutexvar_epi16(iod, q));
            _mm_store_si128((__m128i *)part[0][m], _mm256_cvtepi16_epi8(_mm256_srai_epi16(ev, 8)));
            _mm_store_si128((__m128i *)part[1][m], _mm256_cvtepi16_epi8(_mm256_srai_epi16(od, 8)));
            _mm_store_si128((__m128i *)part[2][m], _mm256_cvtepi16_epi8(ev));
            _mm_store_si128((__m128i *)part[3][m], _mm256_cvtepi16_epi8(od));
        }
        for (int k = 0; k < 4; k++) {
            __m512i z[4], c[4]; /* z[i]: blocks 4i..4i+3 */
            for (int i = 0; i < 4; i++) z[i] = _mm512_load_si512(part[k][4 * i]);
            set_transpose(z, c);
            for (int j = 0; j < 4; j++) _mm512_storeu_si512(o->q[j] + 64 * k, c[j]);
        }
    }
}

/* Packed-code prefetches: into L1 this far ahead and into L2 (more misses in flight than
 * the L1 has miss buffers for) further. From DRAM (the walk above): 4096 + 12288 25.0
 * GB/s, 2048 + 8192 23.0, 8192 + 24576 23.9, 1024 + 4096 20.6. */
#ifndef DEC4_PF_L1
#define DEC4_PF_L1 4096
#endif
#ifndef DEC4_PF_L2
#define DEC4_PF_L2 12288
#endif

/* Scales and biases are two more streams, 1/8 of the codes' bytes: prefetched this many
 * rows ahead (the native-order kernel: 19.0 -> 20.6 GB/s from DRAM with it). */
#ifndef SB_AHEAD
#define SB_AHEAD 16
#endif

/* Most tokens per pass over a row: each 64-byte load of codes is unpacked once for all. */
enum { PT = TILE_TMAX, QR = 4 /* rows per quad */ };

/* R rows (R = 1, or a whole quad in decode) x T tokens. codes: the layout's base (the quad's,
 * or the row's for a row outside quads), q rows in the layout (QR or 1), i0 the first row's
 * place in it; rows' scales / biases sbr bytes apart. Chunk j of set s of row i0 + k is at
 * q 256 s + (q j + i0 + k) 4 bs bytes (bs: the set's blocks): mlx_packed.h's
 * mlx4_packed_block, worked out here per set instead of called per row and set, which ran
 * the DRAM walk 13% slower (median 26.5-28.5 against 31.1-32.5 GB/s, same process). */
AI void mlx4p_tile(int R, int T, int n, int gs, const uint8_t *codes, int q, int i0, const char *sc, const char *bi,
                   size_t sbr, enum gb_type sbt, const char *xq, size_t xs, const float *gsum, size_t gstr, float *y,
                   size_t ldy) {
    int lg = __builtin_ctz((unsigned)gs), ng = n >> lg, nb = n / 32;
    const __m512i m4 = _mm512_set1_epi8(15);
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    __m512 acc[QR][TILE_TMAX];
    UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    /* runs of 16 groups (one scale / bias load each) = gs / 32 sets */
    for (int g0 = 0; g0 < ng; g0 += 16) {
        __m512 s16[QR];
        group_run(R, T, g0, ng, sc, bi, sbr, sbt, gsum, gstr, s16, acc);
        int s0 = (g0 << lg) / 512, s1 = ((g0 + 16) << lg) / 512;
        if (s1 > (nb + 15) / 16) s1 = (nb + 15) / 16;
        for (int s = s0; s < s1; s++) {
            int bs = nb - 16 * s >= 16 ? 16 : nb - 16 * s; /* blocks (lanes) in this set */
            __mmask16 lm = lanes16(bs);
            const uint8_t *cs = codes + (size_t)q * 256 * (size_t)s;
            __m512i ah[QR][PT], al[QR][PT];
            UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < T; t++) ah[r][t] = al[r][t] = _mm512_setzero_si512();
            UNROLL for (int j = 0; j < 4; j++) {
                __m512i we[QR], wo[QR];
                UNROLL for (int r = 0; r < R; r++) {
                    const uint8_t *cj = cs + (size_t)(q * j + i0 + r) * (size_t)(4 * bs);
                    _mm_prefetch((const char *)cj + DEC4_PF_L1, _MM_HINT_T0);
                    _mm_prefetch((const char *)cj + DEC4_PF_L2, _MM_HINT_T1);
                    __m512i v = bs == 16 ? _mm512_loadu_si512(cj) : _mm512_maskz_loadu_epi32(lm, cj);
                    __asm__("" : "+v"(v)); /* one load for both nibbles, not one per use */
                    we[r] = _mm512_and_si512(v, m4);
                    wo[r] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                }
                UNROLL for (int t = 0; t < T; t++) {
                    const uint8_t *xb = ((const struct qx512 *)(xq + (size_t)t * xs) + s)->q[j];
                    __m512i xhe = _mm512_loadu_si512(xb), xho = _mm512_loadu_si512(xb + 64);
                    __m512i xle = _mm512_loadu_si512(xb + 128), xlo = _mm512_loadu_si512(xb + 192);
                    UNROLL for (int r = 0; r < R; r++) {
                        ah[r][t] = _mm512_dpbusd_epi32(ah[r][t], we[r], xhe);
                        ah[r][t] = _mm512_dpbusd_epi32(ah[r][t], wo[r], xho);
                        al[r][t] = _mm512_dpbusd_epi32(al[r][t], xle, we[r]);
                        al[r][t] = _mm512_dpbusd_epi32(al[r][t], xlo, wo[r]);
                    }
                }
            }
            /* lane m: block 16 s + m, group ((16 s + m) 32 >> lg) - g0 of this run */
            __m512i gi = _mm512_sub_epi32(_mm512_srli_epi32(_mm512_add_epi32(lane, _mm512_set1_epi32(16 * s)), lg - 5),
                                          _mm512_set1_epi32(g0));
            UNROLL for (int r = 0; r < R; r++) {
                __m512 sv = _mm512_permutexvar_ps(gi, s16[r]);
                UNROLL for (int t = 0; t < T; t++) {
                    const struct qx512 *xt = (const struct qx512 *)(xq + (size_t)t * xs) + s;
                    __m512i isum = _mm512_add_epi32(_mm512_slli_epi32(ah[r][t], 8), al[r][t]);
                    __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(isum), _mm512_loadu_ps(xt->dv));
                    acc[r][t] = _mm512_fmadd_ps(f, sv, acc[r][t]);
                }
            }
        }
    }
    UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < T; t++) y[(size_t)t * ldy + r] =
        _mm512_reduce_add_ps(acc[r][t]);
}

/* The scale and bias streams of a row, SB_AHEAD rows ahead (past the weight's last row:
 * harmless). */
AI void sb_prefetch(const char *sr, const char *br, size_t sbr) {
    for (size_t k = 0; k < sbr; k += 64) {
        _mm_prefetch(sr + SB_AHEAD * sbr + k, _MM_HINT_T0);
        _mm_prefetch(br + SB_AHEAD * sbr + k, _MM_HINT_T0);
    }
}

/* Several tokens against a whole quad (4 rows x T <= QT tokens): the same float operations
 * per (row, token) as mlx4p_tile, so the same bits, with the integer work tiled for
 * batched decode. A set's 16 block sums of each (row, token) are exact int32s, so any
 * order of the integer products gives them: here the high bytes of x first for all four
 * chunks, the sum shifted by 8, then the low bytes added on, which leaves one int32
 * accumulator per (row, token) in registers (16) where mlx4p_tile keeps two; the float
 * accumulators, updated once per set, live in memory. Each 64-byte load of x then feeds
 * 4 rows and each code load 4 tokens (mlx4p_tile(1, 4): one row per x load). */
enum { QT = 4 };

AI void mlx4p_quad(int T, int n, int gs, const uint8_t *codes, const char *sc, const char *bi, size_t sbr,
                   enum gb_type sbt, const char *xq, size_t xs, const float *gsum, size_t gstr, float *y, size_t ldy) {
    int lg = __builtin_ctz((unsigned)gs), ng = n >> lg, nb = n / 32;
    const __m512i m4 = _mm512_set1_epi8(15);
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    _Alignas(64) float facc[QR][QT][16];
    UNROLL for (int r = 0; r < QR; r++) UNROLL for (int t = 0; t < T; t++) _mm512_store_ps(facc[r][t], _mm512_setzero_ps());
    for (int g0 = 0; g0 < ng; g0 += 16) {
        __m512 s16[QR];
        {   /* group_run, the float accumulators in memory */
            __m512 acc[QR][TILE_TMAX];
            UNROLL for (int r = 0; r < QR; r++) UNROLL for (int t = 0; t < T; t++) acc[r][t] = _mm512_load_ps(facc[r][t]);
            group_run(QR, T, g0, ng, sc, bi, sbr, sbt, gsum, gstr, s16, acc);
            UNROLL for (int r = 0; r < QR; r++) UNROLL for (int t = 0; t < T; t++) _mm512_store_ps(facc[r][t], acc[r][t]);
        }
        int s0 = (g0 << lg) / 512, s1 = ((g0 + 16) << lg) / 512;
        if (s1 > (nb + 15) / 16) s1 = (nb + 15) / 16;
        for (int s = s0; s < s1; s++) {
            int bs = nb - 16 * s >= 16 ? 16 : nb - 16 * s;
            __mmask16 lm = lanes16(bs);
            const uint8_t *cs = codes + (size_t)QR * 256 * (size_t)s;
            __m512i ai[QR][QT];
            UNROLL for (int r = 0; r < QR; r++) UNROLL for (int t = 0; t < T; t++) ai[r][t] = _mm512_setzero_si512();
            UNROLL for (int half = 0; half < 2; half++) { /* 0: high bytes of x, 1: low bytes */
                if (half) UNROLL for (int r = 0; r < QR; r++) UNROLL for (int t = 0; t < T; t++) ai[r][t] = _mm512_slli_epi32(ai[r][t], 8);
                UNROLL for (int j = 0; j < 4; j++) {
                    __m512i we[QR], wo[QR];
                    UNROLL for (int r = 0; r < QR; r++) {
                        const uint8_t *cj = cs + (size_t)(QR * j + r) * (size_t)(4 * bs);
                        if (!half) _mm_prefetch((const char *)cj + DEC4_PF_L1, _MM_HINT_T0);
                        __m512i v = bs == 16 ? _mm512_loadu_si512(cj) : _mm512_maskz_loadu_epi32(lm, cj);
                        __asm__("" : "+v"(v));
                        we[r] = _mm512_and_si512(v, m4);
                        wo[r] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                    }
                    UNROLL for (int t = 0; t < T; t++) {
                        const uint8_t *xb = ((const struct qx512 *)(xq + (size_t)t * xs) + s)->q[j] + 128 * half;
                        __m512i xe = _mm512_loadu_si512(xb), xo = _mm512_loadu_si512(xb + 64);
                        UNROLL for (int r = 0; r < QR; r++) {
                            if (!half) {
                                ai[r][t] = _mm512_dpbusd_epi32(ai[r][t], we[r], xe);
                                ai[r][t] = _mm512_dpbusd_epi32(ai[r][t], wo[r], xo);
                            } else {
                                ai[r][t] = _mm512_dpbusd_epi32(ai[r][t], xe, we[r]);
                                ai[r][t] = _mm512_dpbusd_epi32(ai[r][t], xo, wo[r]);
                            }
                        }
                    }
                }
            }
            __m512i gi = _mm512_sub_epi32(_mm512_srli_epi32(_mm512_add_epi32(lane, _mm512_set1_epi32(16 * s)), lg - 5),
                                          _mm512_set1_epi32(g0));
            UNROLL for (int r = 0; r < QR; r++) {
                __m512 sv = _mm512_permutexvar_ps(gi, s16[r]);
                UNROLL for (int t = 0; t < T; t++) {
                    const struct qx512 *xt = (const struct qx512 *)(xq + (size_t)t * xs) + s;
                    __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(ai[r][t]), _mm512_loadu_ps(xt->dv));
                    _mm512_store_ps(facc[r][t], _mm512_fmadd_ps(f, sv, _mm512_load_ps(facc[r][t])));
                }
            }
        }
    }
    UNROLL for (int r = 0; r < QR; r++) UNROLL for (int t = 0; t < T; t++) y[(size_t)t * ldy + r] =
        _mm512_reduce_add_ps(_mm512_load_ps(facc[r][t]));
}

void mlxdot4p_avx512(int n, int gs, int64_t n_out, const uint8_t *codes, size_t rb, const void *sc, const void *bi,
                     size_t sbr, enum gb_type sbt, int o, int nr, const struct qx512 *xq, size_t xs, const float *gsum,
                     size_t gstr, int nt, float *y, size_t ldy) {
    const int64_t n4 = n_out & ~(int64_t)(QR - 1); /* rows in quads */
    if (nt == 1) {
        for (int r = o; r < o + nr;) {
            const char *sr = (const char *)sc + (size_t)r * sbr, *br = (const char *)bi + (size_t)r * sbr;
            float *yr = y + (r - o);
            if (r % QR == 0 && r + QR <= o + nr && r + QR <= n4) { /* decode: a whole quad */
                for (int k = 0; k < QR; k++) sb_prefetch(sr + k * sbr, br + k * sbr, sbr);
                mlx4p_tile(QR, 1, n, gs, codes + (size_t)r * rb, QR, 0, sr, br, sbr, sbt, (const char *)xq, xs, gsum,
                           gstr, yr, ldy);
                r += QR;
                continue;
            }
            int q = r < n4 ? QR : 1, i0 = r < n4 ? r % QR : 0;
            sb_prefetch(sr, br, sbr);
            mlx4p_tile(1, 1, n, gs, codes + (size_t)(r - i0) * rb, q, i0, sr, br, sbr, sbt, (const char *)xq, xs, gsum,
                       gstr, yr, ldy);
            r++;
        }
        return;
    }
    for (int b0 = o; b0 < o + nr; b0 += RBLK) {
        int b1 = b0 + RBLK < o + nr ? b0 + RBLK : o + nr;
        for (int u = 0; u < nt; u += PT) {
            const char *xu = (const char *)xq + (size_t)u * xs;
            const float *gu = gsum + (size_t)u * gstr;
            for (int r = b0; r < b1;) {
                if (r % QR == 0 && r + QR <= b1 && r + QR <= n4) { /* a whole quad: mlx4p_quad */
                    const char *sr = (const char *)sc + (size_t)r * sbr, *br = (const char *)bi + (size_t)r * sbr;
                    float *yu = y + (r - o) + (size_t)u * ldy;
                    const uint8_t *cr = codes + (size_t)r * rb;
                    switch (nt - u < QT ? nt - u : QT) {
                    case 4: mlx4p_quad(4, n, gs, cr, sr, br, sbr, sbt, xu, xs, gu, gstr, yu, ldy); break;
                    case 3: mlx4p_quad(3, n, gs, cr, sr, br, sbr, sbt, xu, xs, gu, gstr, yu, ldy); break;
                    case 2: mlx4p_quad(2, n, gs, cr, sr, br, sbr, sbt, xu, xs, gu, gstr, yu, ldy); break;
                    default: mlx4p_quad(1, n, gs, cr, sr, br, sbr, sbt, xu, xs, gu, gstr, yu, ldy); break;
                    }
                    r += QR;
                    continue;
                }
                {
                const char *sr = (const char *)sc + (size_t)r * sbr, *br = (const char *)bi + (size_t)r * sbr;
                float *yu = y + (r - o) + (size_t)u * ldy;
                int q = r < n4 ? QR : 1, i0 = r < n4 ? r % QR : 0;
                const uint8_t *cr = codes + (size_t)(r - i0) * rb;
                if (u == 0) sb_prefetch(sr, br, sbr);
                switch (nt - u < PT ? nt - u : PT) {
                case 4: mlx4p_tile(1, 4, n, gs, cr, q, i0, sr, br, sbr, sbt, xu, xs, gu, gstr, yu, ldy); break;
                case 3: mlx4p_tile(1, 3, n, gs, cr, q, i0, sr, br, sbr, sbt, xu, xs, gu, gstr, yu, ldy); break;
                case 2: mlx4p_tile(1, 2, n, gs, cr, q, i0, sr, br, sbr, sbt, xu, xs, gu, gstr, yu, ldy); break;
                default: mlx4p_tile(1, 1, n, gs, cr, q, i0, sr, br, sbr, sbt, xu, xs, gu, gstr, yu, ldy); break;
                }
                }
                r++;
            }
        }
    }
}

void mlxdot4_avx512(int n, int gs, int nr, const uint8_t *codes, size_t rb, const void *sc, const void *bi,
                    size_t sbr, enum gb_type sbt, const void *xq, size_t xs, const float *gsum, size_t gstr, int nt,
                    float *y, size_t ldy) {
    mlxdot(4, n, gs, nr, codes, rb, sc, bi, sbr, sbt, xq, xs, gsum, gstr, nt, y, ldy);
}

void mlxdot8_avx512(int n, int gs, int nr, const uint8_t *codes, size_t rb, const void *sc, const void *bi,
                    size_t sbr, enum gb_type sbt, const void *xq, size_t xs, const float *gsum, size_t gstr, int nt,
                    float *y, size_t ldy) {
    mlxdot(8, n, gs, nr, codes, rb, sc, bi, sbr, sbt, xq, xs, gsum, gstr, nt, y, ldy);
}

/* ---- Q8_0 ----------------------------------------------------------------------------------
 * x quantized as for the other 32-element types (struct qx8: d = max|x| / 127, q in
 * [-127, 127]) and stored per pair of blocks (struct qx64). vpdpbusd wants one unsigned
 * operand: the weight bytes become w + 128 (one xor per weight chunk, shared by all
 * tokens), and the extra 128 sum(x) of each int32 lane is taken off by starting the sum
 * at negc = -128 (sum of the lane's 4 x). Lanes 0..7 are block 2c, 8..15 block 2c + 1,
 * so one convert, one multiply by the lanes' x steps and one FMA by the lanes' weight
 * steps finish a chunk of 64; an odd last block leaves lanes 8..15 zero. */

void q8_quant_x_avx512(const float *x, int n, struct qx64 *out) {
    int nb = n / 32;
    for (int c = 0; c < (nb + 1) / 2; c++) {
        struct qx64 *o = out + c;
        __m128i q8[4];
        float d[2] = {0.0f, 0.0f};
        for (int h = 0; h < 2; h++) {
            if (2 * c + h >= nb) {
                q8[2 * h] = q8[2 * h + 1] = _mm_setzero_si128();
                continue;
            }
            __m512i qb[2];
            d[h] = quant_block32(x + 32 * (2 * c + h), 127.0f, qb);
            q8[2 * h] = _mm512_cvtepi32_epi8(qb[0]);
            q8[2 * h + 1] = _mm512_cvtepi32_epi8(qb[1]);
        }
        __m512i q = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_set_m128i(q8[1], q8[0])), _mm256_set_m128i(q8[3], q8[2]), 1);
        _mm512_storeu_si512(o->qs, q);
        /* -128 * (sum of each lane's 4 bytes): vpdpbusd of 0x80 bytes (128 unsigned) with q,
         * negated */
        __m512i s4 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8((char)0x80), q);
        _mm512_storeu_si512(o->negc, _mm512_sub_epi32(_mm512_setzero_si512(), s4));
        for (int m = 0; m < 16; m++) o->dv[m] = d[m / 8];
    }
}

AI __m512i q8_w(const uint8_t *b, int full) {
    __m256i lo = _mm256_loadu_si256((const __m256i *)(b + 2));
    __m256i hi = full ? _mm256_loadu_si256((const __m256i *)(b + 36)) : _mm256_setzero_si256();
    return _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), _mm512_set1_epi8((char)0x80));
}

AI __m512 q8_dw(const uint8_t *b, int full, __m512i idx) {
    uint16_t ha, hb = 0;
    memcpy(&ha, b, 2);
    if (full) memcpy(&hb, b + 34, 2);
    __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128((int)((uint32_t)ha | (uint32_t)hb << 16)));
    return _mm512_permutexvar_ps(idx, _mm512_zextps128_ps512(f));
}

#ifndef Q8_MT
#define Q8_MT 4
#endif
/* Decode: a software prefetch of the row stream into L2 this far ahead. gerbil bench tg32,
 * 1 thread, Qwen3-0.6B-shaped Q8_0, alternating builds (tok/s, 3-4 runs each): into L2 at
 * 12288 34.5-44.0, at 8192 39.4-42.6, at 20480 34.8-42.0; into L1 at 2048 (before) 33.2-36.3,
 * at 4096 37.2-39.1, L1 4096 + L2 12288 37.6-38.3. */
#ifndef Q8_PF_L2
#define Q8_PF_L2 12288
#endif
/* rows x tokens per tile: each x load serves 4 rows (x is 3 bytes per element here, so
 * one row per pass ran at half the speed, bound by L2); 4 x 4 ran ~10% above 4 x 3 */
enum { Q8R = 4, Q8T = Q8_MT };

AI void q8_tile(int n, int R, int T, const uint8_t *row, size_t rb, const char *xq, size_t xs, float *y, size_t ldy) {
    const __m512i idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    __m512 acc[Q8R][Q8T];
    UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    int nb = n / 32;
    for (int c = 0; 2 * c < nb; c++) {
        int full = 2 * c + 2 <= nb;
        UNROLL for (int r = 0; r < R; r++) {
            const uint8_t *b = row + (size_t)r * rb + (size_t)c * 68;
            if (T == 1) _mm_prefetch((const char *)b + Q8_PF_L2, _MM_HINT_T1);
            __m512i w = q8_w(b, full);
            __m512 dw = q8_dw(b, full, idx);
            UNROLL for (int t = 0; t < T; t++) {
                const struct qx64 *xb = (const struct qx64 *)(xq + (size_t)t * xs) + c;
                __m512i s = _mm512_dpbusd_epi32(_mm512_loadu_si512(xb->negc), w, _mm512_loadu_si512(xb->qs));
                acc[r][t] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_loadu_ps(xb->dv)), dw, acc[r][t]);
            }
        }
    }
    UNROLL for (int t = 0; t < T; t++) UNROLL for (int r = 0; r < R; r++) y[(size_t)t * ldy + r] =
        _mm512_reduce_add_ps(acc[r][t]);
}

#define Q8TILE(R, T) q8_tile(n, R, T, rows, rb, xu, xs, yu, ldy)
#if Q8_MT >= 4
#define Q8CASE4(R) case 4: Q8TILE(R, 4); break;
#else
#define Q8CASE4(R)
#endif
#define Q8TILE_T(R)              \
    switch (T) {                 \
    Q8CASE4(R)                   \
    case 3: Q8TILE(R, 3); break; \
    case 2: Q8TILE(R, 2); break; \
    default: Q8TILE(R, 1); break; \
    }

void qrows_q8_0_avx512(int n, int nr, const void *row0, size_t rb, const void *xq, size_t xs, int nt, float *y,
                       size_t ldy) {
    for (int u0 = 0; u0 < nt; u0 += Q8T) {
        int T = nt - u0 < Q8T ? nt - u0 : Q8T;
        const char *xu = (const char *)xq + (size_t)u0 * xs;
        float *yu = y + (size_t)u0 * ldy;
        const uint8_t *rows = row0;
        if (T == 1 && DEC_R == 1) {
            for (int r = 0; r < nr; r++) q8_tile(n, 1, 1, (const uint8_t *)row0 + (size_t)r * rb, rb, xu, xs, yu + r, ldy);
            continue;
        }
        switch (nr) {
        case 4: Q8TILE_T(4) break;
        case 3: Q8TILE_T(3) break;
        case 2: Q8TILE_T(2) break;
        default: Q8TILE_T(1) break;
        }
    }
}
