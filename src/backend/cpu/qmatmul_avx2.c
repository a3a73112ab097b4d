/* AVX2 kernels for quantized weights: the integer dot products of qmatmul.c's scalar
 * kernels, 32 bytes at a time. Unsigned weight codes meet signed int8 activations in
 * vpmaddubsw (pairs summed to int16: at most 2 * 63 * 127, no saturation since the
 * activations stay within [-127, 127]), vpmaddwd applies the per-group scales and
 * widens to int32, and each block's exact integer sum is converted to f32 once.
 *
 * Each kernel takes up to NT tokens per weight row pass: the row's codes are loaded
 * and unpacked once and reused from registers for every token (prefill), while a
 * single token (decode) streams the row once. A token's arithmetic is the same in
 * every tile size. Q8_0 codes are signed: |w| meets sign(x, w) instead. MLX codes
 * are widened to 16 bits and meet 16-bit activations in vpmaddwd (see qmatmul.c).
 * Q8_0 takes tiles of rows x tokens (2 x 4 in prefill, 1 x 1 in decode): each weight
 * block and each x block is loaded once per tile (bench_qmatmul l3-no512, load ~13 on 2
 * vCPUs, thread CPU time: prefill-128 77 against 58 GFLOP/s for the VNNI kernel before).
 * Decode tiles of 4 rows (4 interleaved weight streams) ran a Q8_0 model's decode at less
 * than half the speed of one row at a time, from DRAM. The same tiles for MLX (2 x 4,
 * 2 x 1, the group scale folded into each block's step) ran a model's prefill 0.86-0.92x
 * and decode 0.41-0.56x these one-row kernels: not kept.
 *
 * Measured (Zen 5, 1 thread, 3072 x 1024, bench_qmatmul): decode ~21 GB/s for Q4_K,
 * Q6_K and Q8_0, ~25 for MLX 8-bit, ~12 for MLX 4-bit, the same from L3 as from
 * DRAM: bound by instruction throughput (about 0.8 instructions per Q4_K byte), not
 * by memory. Where the CPU has AVX512-VNNI, qmatmul_vnni.c replaces these kernels for
 * Q4_K, Q5_K, Q6_K and Q8_0 (vpdpwssd / vpdpbusd; prefill +25% for the k-quants). */
#include "backend/cpu/qmatmul_avx2.h"
#include "backend/cpu/qmatmul_simd.h"
#include "tensor/quant.h"

enum { NT_MLX = 3 };

/* Q4_K, Q5_K, Q6_K: vpmaddwd by the group scales, then vpaddd */
#define KQ_DOT(acc, a, s) _mm256_add_epi32(acc, _mm256_madd_epi16(a, s))
#define KQ_NAME(base) base##_avx2
#include "backend/cpu/qmatmul_kquant.h"

/* ---- Q8_0 and Q4_0 against struct qx8 ---------------------------------------------- */

/* Two accumulators per token (even and odd blocks) hide the FMA latency in decode. */
static ALWAYS_INLINE void q8_0_tile(int nb, const block_q8_0 *w, const char *xq, size_t xs, int T, float *y,
                                    size_t ldy) {
    __m256 acc[2][NT];
    UNROLL_T for (int u = 0; u < T; u++) acc[0][u] = acc[1][u] = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1);
    int i = 0;
    for (; i < nb; i++) {
        __m256i wv = _mm256_loadu_si256((const __m256i *)w[i].qs);
        __m256i aw = _mm256_sign_epi8(wv, wv);
        float d = h2f(w[i].d);
        UNROLL_T for (int u = 0; u < T; u++) {
            const struct qx8 *xb = (const struct qx8 *)(xq + (size_t)u * xs) + i;
            __m256i sx = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)xb->qs), wv);
            __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), ones);
            acc[i & 1][u] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb->d), _mm256_cvtepi32_ps(p), acc[i & 1][u]);
        }
    }
    UNROLL_T for (int u = 0; u < T; u++) y[(size_t)u * ldy] = hsum8(_mm256_add_ps(acc[0][u], acc[1][u]));
}

void qdot_q8_0_avx2(int n, const void *row, const void *xq, size_t xs, int nt, float *y, size_t ldy) {
#define K(t) q8_0_tile(n / 32, row, xu, xs, t, yu, ldy)
    TILED(K, NT)
#undef K
}

/* Q8_0, R rows x T tokens per pass (prefill: each weight block and each x block loaded
 * once for the whole tile). One accumulator per (row, token), the blocks in order, so a
 * token's value has the same bits whatever the tile (decode: one row at a time, the
 * weights one sequential stream). The step product dw dx is one vmulps per pair. */
static ALWAYS_INLINE void q8_0_rt(int nb, const char *row0, size_t rb, const char *xq, size_t xs, int R, int T,
                                  float *y, size_t ldy) {
    __m256 acc[4][4];
    UNROLL_T for (int r = 0; r < R; r++) UNROLL_T for (int u = 0; u < T; u++) acc[r][u] = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1);
    for (int i = 0; i < nb; i++) {
        __m256i wv[4], aw[4];
        __m256 dw[4];
        UNROLL_T for (int r = 0; r < R; r++) {
            const block_q8_0 *wb = (const block_q8_0 *)(row0 + (size_t)r * rb) + i;
            wv[r] = _mm256_loadu_si256((const __m256i *)wb->qs);
            aw[r] = _mm256_sign_epi8(wv[r], wv[r]);
            dw[r] = _mm256_set1_ps(h2f(wb->d));
        }
        UNROLL_T for (int u = 0; u < T; u++) {
            const struct qx8 *xb = (const struct qx8 *)(xq + (size_t)u * xs) + i;
            __m256i xv = _mm256_loadu_si256((const __m256i *)xb->qs);
            __m256 dx = _mm256_broadcast_ss(&xb->d);
            UNROLL_T for (int r = 0; r < R; r++) {
                __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw[r], _mm256_sign_epi8(xv, wv[r])), ones);
                acc[r][u] = _mm256_fmadd_ps(_mm256_mul_ps(dw[r], dx), _mm256_cvtepi32_ps(p), acc[r][u]);
            }
        }
    }
    UNROLL_T for (int r = 0; r < R; r++) UNROLL_T for (int u = 0; u < T; u++) y[(size_t)u * ldy + r] = hsum8(acc[r][u]);
}

void qrows_q8_0_avx2(int n, int nr, const void *row0, size_t rb, const void *xq, size_t xs, int nt, float *y,
                     size_t ldy) {
    int nb = n / 32;
    const char *w = row0, *x = xq;
    if (nt == 1) { /* decode: any nr, one row a pass (the weights one sequential stream: 4 rows a pass
                    * ran a Q8_0 model's decode at less than half the speed, from DRAM) */
        for (int r = 0; r < nr; r++) q8_0_rt(nb, w + (size_t)r * rb, rb, x, xs, 1, 1, y + r, ldy);
        return;
    }
    for (int r = 0; r < nr; r += 2) {
        const char *wr = w + (size_t)r * rb;
        float *yr = y + r;
        if (nr - r >= 2) {
            int u = 0;
            for (; u + 4 <= nt; u += 4) q8_0_rt(nb, wr, rb, x + (size_t)u * xs, xs, 2, 4, yr + (size_t)u * ldy, ldy);
            switch (nt - u) {
            case 3: q8_0_rt(nb, wr, rb, x + (size_t)u * xs, xs, 2, 3, yr + (size_t)u * ldy, ldy); break;
            case 2: q8_0_rt(nb, wr, rb, x + (size_t)u * xs, xs, 2, 2, yr + (size_t)u * ldy, ldy); break;
            case 1: q8_0_rt(nb, wr, rb, x + (size_t)u * xs, xs, 2, 1, yr + (size_t)u * ldy, ldy); break;
            default: break;
            }
        } else {
            int u = 0;
            for (; u + 4 <= nt; u += 4) q8_0_rt(nb, wr, rb, x + (size_t)u * xs, xs, 1, 4, yr + (size_t)u * ldy, ldy);
            for (; u < nt; u++) q8_0_rt(nb, wr, rb, x + (size_t)u * xs, xs, 1, 1, yr + (size_t)u * ldy, ldy);
        }
    }
}

/* Q4_0: w = d (q - 8); sum = d dx sum(q qx) - 8 d s, the second term summed apart. */
static ALWAYS_INLINE void q4_0_tile(int nb, const block_q4_0 *w, const char *xq, size_t xs, int T, float *y,
                                    size_t ldy) {
    __m256 acc[2][NT];
    float off[NT];
    UNROLL_T for (int u = 0; u < T; u++) { acc[0][u] = acc[1][u] = _mm256_setzero_ps(); off[u] = 0.0f; }
    const __m256i ones = _mm256_set1_epi16(1);
    const __m128i m4 = _mm_set1_epi8(15);
    for (int i = 0; i < nb; i++) {
        __m128i v = _mm_loadu_si128((const __m128i *)w[i].qs);
        __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m4), _mm_and_si128(v, m4));
        float d = h2f(w[i].d);
        UNROLL_T for (int u = 0; u < T; u++) {
            const struct qx8 *xb = (const struct qx8 *)(xq + (size_t)u * xs) + i;
            __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(q, _mm256_loadu_si256((const __m256i *)xb->qs)), ones);
            acc[i & 1][u] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb->d), _mm256_cvtepi32_ps(p), acc[i & 1][u]);
            off[u] += d * xb->s;
        }
    }
    UNROLL_T for (int u = 0; u < T; u++) y[(size_t)u * ldy] = hsum8(_mm256_add_ps(acc[0][u], acc[1][u])) - 8.0f * off[u];
}

void qdot_q4_0_avx2(int n, const void *row, const void *xq, size_t xs, int nt, float *y, size_t ldy) {
#define K(t) q4_0_tile(n / 32, row, xu, xs, t, yu, ldy)
    TILED(K, NT)
#undef K
}

/* ---- MLX affine against qx16 ---------------------------------------------------------- */

static ALWAYS_INLINE float sb_load(const void *p, enum gb_type t, size_t i) {
    if (t == GB_TYPE_F32) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    if (t == GB_TYPE_F16) return _cvtsh_ss(h);
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static ALWAYS_INLINE __m256 sb_load8(const void *p, enum gb_type t, size_t i) {
    if (t == GB_TYPE_F32) return _mm256_loadu_ps((const float *)p + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
    if (t == GB_TYPE_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* gacc[u] = lanes of sum over the group's nb blocks b of dx_b (q . qx)_b. Codes are
 * widened to 16 bits and meet the 16-bit x in vpmaddwd: per block two of them, whose
 * int32 lanes (at most 32 * 255 * 32767 in all) are added and converted once.
 * 4-bit: 16 code bytes, low nibbles (even elements) then high nibbles (odd ones),
 * against x permuted the same way. */
static ALWAYS_INLINE void mlx_group(int bits, int nb, const uint8_t *codes, const char *xq, size_t xs, int T,
                                    __m256 gacc[NT]) {
    const __m256i m4 = _mm256_set1_epi16(15);
    UNROLL_T for (int u = 0; u < T; u++) gacc[u] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        __m256i w0, w1;
        if (bits == 4) {
            /* each byte widened to 16 bits: low nibble masked, high nibble shifted down
             * (the zero-extended top byte leaves nothing else) */
            __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(codes + 16 * b)));
            w0 = _mm256_and_si256(v, m4);
            w1 = _mm256_srli_epi16(v, 4);
        } else {
            w0 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(codes + 32 * b)));
            w1 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(codes + 32 * b + 16)));
        }
        UNROLL_T for (int u = 0; u < T; u++) {
            const struct qx16 *xb = (const struct qx16 *)(xq + (size_t)u * xs) + b;
            __m256i p = _mm256_add_epi32(_mm256_madd_epi16(w0, _mm256_loadu_si256((const __m256i *)xb->qs)),
                                         _mm256_madd_epi16(w1, _mm256_loadu_si256((const __m256i *)(xb->qs + 16))));
            gacc[u] = _mm256_fmadd_ps(_mm256_broadcast_ss(&xb->d), _mm256_cvtepi32_ps(p), gacc[u]);
        }
    }
}

/* Group g's scaled sum goes to tot0 (even g) or tot1 (odd g): two chains; then
 * y = hsum(tot0 + tot1) + sum_g b_g xsum_g, the bias terms 8 groups at a time into
 * tot0's lanes and the rest in order. */
static ALWAYS_INLINE void mlx_tile(int bits, int n, int gs, const uint8_t *codes, const void *sc, const void *bi,
                                   enum gb_type sbt, const char *xq, size_t xs, const float *gsum, size_t gstr,
                                   int T, float *y, size_t ldy) {
    int ng = n >> __builtin_ctz((unsigned)gs), nb = gs >> 5; /* gs a power of two: no idiv per row */
    size_t gbytes = (size_t)gs * (size_t)bits / 8, gxs = (size_t)nb * sizeof(struct qx16);
    __m256 tot0[NT], tot1[NT], g[NT];
    UNROLL_T for (int u = 0; u < T; u++) tot0[u] = tot1[u] = _mm256_setzero_ps();
    int k = 0;
    for (; k + 2 <= ng; k += 2) {
        mlx_group(bits, nb, codes + (size_t)k * gbytes, xq + (size_t)k * gxs, xs, T, g);
        __m256 s0 = _mm256_set1_ps(sb_load(sc, sbt, (size_t)k));
        UNROLL_T for (int u = 0; u < T; u++) tot0[u] = _mm256_fmadd_ps(s0, g[u], tot0[u]);
        mlx_group(bits, nb, codes + (size_t)(k + 1) * gbytes, xq + (size_t)(k + 1) * gxs, xs, T, g);
        __m256 s1 = _mm256_set1_ps(sb_load(sc, sbt, (size_t)k + 1));
        UNROLL_T for (int u = 0; u < T; u++) tot1[u] = _mm256_fmadd_ps(s1, g[u], tot1[u]);
    }
    if (k < ng) {
        mlx_group(bits, nb, codes + (size_t)k * gbytes, xq + (size_t)k * gxs, xs, T, g);
        __m256 s0 = _mm256_set1_ps(sb_load(sc, sbt, (size_t)k));
        UNROLL_T for (int u = 0; u < T; u++) tot0[u] = _mm256_fmadd_ps(s0, g[u], tot0[u]);
    }
    int j = 0;
    for (; j + 8 <= ng; j += 8) {
        __m256 b = sb_load8(bi, sbt, (size_t)j);
        UNROLL_T for (int u = 0; u < T; u++)
            tot0[u] = _mm256_fmadd_ps(b, _mm256_loadu_ps(gsum + (size_t)u * gstr + j), tot0[u]);
    }
    UNROLL_T for (int u = 0; u < T; u++) {
        const float *gu = gsum + (size_t)u * gstr;
        float bsum = 0.0f;
        for (int i = j; i < ng; i++) bsum += sb_load(bi, sbt, (size_t)i) * gu[i];
        y[(size_t)u * ldy] = hsum8(_mm256_add_ps(tot0[u], tot1[u])) + bsum;
    }
}

static ALWAYS_INLINE void mlxdot(int bits, int n, int gs, const uint8_t *codes, const void *sc, const void *bi,
                                 enum gb_type sbt, const void *xq, size_t xs, const float *gsum, size_t gstr, int nt,
                                 float *y, size_t ldy) {
    for (int u0 = 0; u0 < nt; u0 += NT_MLX) {
        const char *xu = (const char *)xq + (size_t)u0 * xs;
        const float *gu = gsum + (size_t)u0 * gstr;
        float *yu = y + (size_t)u0 * ldy;
        switch (nt - u0 < NT_MLX ? nt - u0 : NT_MLX) {
        case 3: mlx_tile(bits, n, gs, codes, sc, bi, sbt, xu, xs, gu, gstr, 3, yu, ldy); break;
        case 2: mlx_tile(bits, n, gs, codes, sc, bi, sbt, xu, xs, gu, gstr, 2, yu, ldy); break;
        default: mlx_tile(bits, n, gs, codes, sc, bi, sbt, xu, xs, gu, gstr, 1, yu, ldy); break;
        }
    }
}

void mlxdot4_avx2(int n, int gs, const uint8_t *codes, const void *sc, const void *bi, enum gb_type sbt,
                  const void *xq, size_t xs, const float *gsum, size_t gstr, int nt, float *y, size_t ldy) {
    mlxdot(4, n, gs, codes, sc, bi, sbt, xq, xs, gsum, gstr, nt, y, ldy);
}

void mlxdot8_avx2(int n, int gs, const uint8_t *codes, const void *sc, const void *bi, enum gb_type sbt,
                  const void *xq, size_t xs, const float *gsum, size_t gstr, int nt, float *y, size_t ldy) {
    mlxdot(8, n, gs, codes, sc, bi, sbt, xq, xs, gsum, gstr, nt, y, ldy);
}
