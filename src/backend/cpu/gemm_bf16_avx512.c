/* Prefill over quantized weights: dequantize a panel of rows to bf16 once, then a
 * register-blocked bf16 GEMM (AVX512-BF16 vdpbf16ps) over every token.
 *
 * Why: the integer kernels (qmatmul_*.c) unpack and rescale every weight block again
 * for each small tile of tokens; at 512 prompt tokens that per-block work, not the
 * multiply-adds, bounds them. Here each weight is dequantized once per call and the
 * inner loop is nothing but multiply-adds: per pair of k, two 64-byte panel loads (32
 * rows) and, per token, one broadcast of x's two bf16 values into two vdpbf16ps (16
 * rows x 2 products each). 32 rows x 12 tokens keep 24 accumulators in registers.
 * Measured on Zen 5: vdpbf16ps issues two per cycle (200 GMAC/s per core, the same
 * rate as 512-bit FMAs count flops).
 *
 * Panel layout: for rows o0..o0+31 and k in a block of KB, u32 word (p, r) holds
 * bf16(w[r][2p]) (low half) and bf16(w[r][2p + 1]) (high half): one 64-byte load gives
 * 16 rows' pair p, which is what vdpbf16ps multiplies against x's pair p broadcast.
 * Rows are dequantized 256 elements at a time into f32, rounded to bf16 and
 * transposed 16 x 16 (in u32 units) into that order.
 *
 * Precision: w and x each rounded to bf16 (relative error <= 2^-9), products summed in
 * f32: |error| <= ~2^-8 sum_k |w x|. The GGUF formats' integer kernels quantize x to 8
 * bits per block (up to 2^-8 of the block's largest |x| per element), so this is
 * no worse for them; MLX's 16-bit integer path is more precise, and the MLX golden
 * tests' bound (2e-2 of the logits' RMS) leaves room for this.
 *
 * Each output (row, token) goes through the same operations in the same order (its
 * K blocks in turn, each a chain of vdpbf16ps starting from the previous block's
 * value) whatever the tile, panel or thread split. */
#include "backend/cpu/gemm_bf16_avx512.h"

#include "backend/cpu/qmatmul_simd.h" /* scales_k4 */
#include "base/fp16.h"
#include "tensor/quant.h"
#include "tensor/quant_ref.h"
#include "tensor/weight.h"

#include <immintrin.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))

enum {
    PR = 32,  /* rows per panel: two zmm of 16 */
    KB = 512, /* k per panel block: 32 KB of panel, L1-resident while every token uses it */
    TT = 12,  /* tokens per tile: 24 accumulators */
};

int gemm_bf16_supports(const struct gb_weight *w) {
    if (w->n_in <= 0 || w->n_in % 256 != 0) return 0;
    if (w->kind == GB_WEIGHT_MLX) return w->n_in % w->group_size == 0;
    return quant_fns(w->type).to_float != NULL; /* GGML block types */
}

void gemm_bf16_x_avx512(const float *x, int n, uint16_t *out) {
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i));
        _mm512_storeu_si512(out + i, (__m512i)v);
    }
    for (; i < n; i++) out[i] = f32_to_bf16(x[i]);
}

/* ---- dequantization of 256 elements of one row ------------------------------------- */

/* out[16 g + i] = a[g] q[16 g + i] + b[g] for 16 groups of 16 codes (signed when sgn). */
AI void expand256(const uint8_t *q, int sgn, const float *a, const float *b, float *out) {
    for (int g = 0; g < 16; g++) {
        __m128i v = _mm_loadu_si128((const __m128i *)(q + 16 * g));
        __m512i i = sgn ? _mm512_cvtepi8_epi32(v) : _mm512_cvtepu8_epi32(v);
        _mm512_storeu_ps(out + 16 * g, _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_set1_ps(a[g]),
                                                       _mm512_set1_ps(b[g])));
    }
}

static void dq_q4_K(const block_q4_K *b, float *out) {
    uint8_t q[256];
    float a[16], o[16];
    uint64_t sc, mn;
    scales_k4(b->scales, &sc, &mn);
    float d = f16_to_f32(b->d), dmin = f16_to_f32(b->dmin);
    for (int j = 0; j < 8; j++) {
        a[2 * j] = a[2 * j + 1] = d * (float)((sc >> (8 * j)) & 0xff);
        o[2 * j] = o[2 * j + 1] = -dmin * (float)((mn >> (8 * j)) & 0xff);
    }
    const __m256i m4 = _mm256_set1_epi8(15);
    for (int c = 0; c < 4; c++) { /* sub-block 2c: low nibbles of qs[32c..]; 2c + 1: high */
        __m256i v = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * c));
        _mm256_storeu_si256((__m256i *)(q + 64 * c), _mm256_and_si256(v, m4));
        _mm256_storeu_si256((__m256i *)(q + 64 * c + 32), _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
    }
    expand256(q, 0, a, o, out);
}

static void dq_q6_K(const block_q6_K *b, float *out) {
    uint8_t q[256];
    float a[16], o[16];
    float d = f16_to_f32(b->d);
    for (int g = 0; g < 16; g++) { a[g] = d * (float)b->scales[g]; o[g] = 0.0f; }
    const __m256i m4 = _mm256_set1_epi8(15), m30 = _mm256_set1_epi8(0x30), k32 = _mm256_set1_epi8(32);
    for (int h = 0; h < 2; h++) { /* 6-bit codes: 4 low bits from ql, 2 high from qh, minus 32 */
        __m256i qa = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h));
        __m256i qb = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h + 32));
        __m256i qh = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * h));
        __m256i v[4];
        v[0] = _mm256_or_si256(_mm256_and_si256(qa, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
        v[1] = _mm256_or_si256(_mm256_and_si256(qb, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
        v[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qa, 4), m4), _mm256_and_si256(qh, m30));
        v[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qb, 4), m4),
                               _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
        for (int k = 0; k < 4; k++) _mm256_storeu_si256((__m256i *)(q + 128 * h + 32 * k), _mm256_sub_epi8(v[k], k32));
    }
    expand256(q, 1, a, o, out);
}

static void dq_q8_0(const block_q8_0 *b, float *out) {
    uint8_t q[256];
    float a[16], o[16];
    for (int i = 0; i < 8; i++) {
        memcpy(q + 32 * i, b[i].qs, 32);
        a[2 * i] = a[2 * i + 1] = f16_to_f32(b[i].d);
        o[2 * i] = o[2 * i + 1] = 0.0f;
    }
    expand256(q, 1, a, o, out);
}

static void dq_q4_0(const block_q4_0 *b, float *out) {
    uint8_t q[256];
    float a[16], o[16];
    const __m128i m4 = _mm_set1_epi8(15);
    for (int i = 0; i < 8; i++) { /* elements 0..15: low nibbles; 16..31: high */
        __m128i v = _mm_loadu_si128((const __m128i *)b[i].qs);
        _mm_storeu_si128((__m128i *)(q + 32 * i), _mm_and_si128(v, m4));
        _mm_storeu_si128((__m128i *)(q + 32 * i + 16), _mm_and_si128(_mm_srli_epi16(v, 4), m4));
        float d = f16_to_f32(b[i].d);
        a[2 * i] = a[2 * i + 1] = d;
        o[2 * i] = o[2 * i + 1] = -8.0f * d;
    }
    expand256(q, 0, a, o, out);
}

static float sb_get(const void *p, enum gb_type t, size_t i) {
    switch (t) {
    case GB_TYPE_F32: return ((const float *)p)[i];
    case GB_TYPE_F16: return f16_to_f32(((const uint16_t *)p)[i]);
    default: return bf16_to_f32(((const uint16_t *)p)[i]);
    }
}

/* MLX 4/8-bit: codes of elements k0..k0 + 255 of row r (4-bit: element c in byte c / 2,
 * low nibble first; 8-bit: one byte each), w = scale q + bias per group. */
static void dq_mlx(const struct gb_weight *w, int64_t r, int64_t k0, float *out) {
    int gs = w->group_size;
    int64_t ng = w->n_in / gs;
    size_t esz = type_traits(w->sb_type)->type_size;
    const char *sc = (const char *)w->scales + (size_t)(r * ng) * esz;
    const char *bi = (const char *)w->biases + (size_t)(r * ng) * esz;
    const uint8_t *codes = (const uint8_t *)w->data + (size_t)r * w->row_bytes + (size_t)(k0 * w->bits / 8);
    if (w->bits != 4 && w->bits != 8) {
        dequantize_row_mlx((const uint32_t *)codes, sc + (size_t)(k0 / gs) * esz, bi + (size_t)(k0 / gs) * esz,
                           w->sb_type, w->bits, gs, out, 256);
        return;
    }
    float a[16], o[16];
    for (int g = 0; g < 16; g++) {
        size_t gi = (size_t)((k0 + 16 * g) / gs);
        a[g] = sb_get(sc, w->sb_type, gi);
        o[g] = sb_get(bi, w->sb_type, gi);
    }
    if (w->bits == 8) {
        expand256(codes, 0, a, o, out);
        return;
    }
    uint8_t q[256];
    const __m128i m4 = _mm_set1_epi8(15);
    for (int i = 0; i < 8; i++) {
        __m128i v = _mm_loadu_si128((const __m128i *)(codes + 16 * i));
        __m128i lo = _mm_and_si128(v, m4), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m4);
        _mm_storeu_si128((__m128i *)(q + 32 * i), _mm_unpacklo_epi8(lo, hi));
        _mm_storeu_si128((__m128i *)(q + 32 * i + 16), _mm_unpackhi_epi8(lo, hi));
    }
    expand256(q, 0, a, o, out);
}

/* Elements k0..k0 + 255 of row r as f32 (k0 % 256 == 0). */
static void dq256(const struct gb_weight *w, int64_t r, int64_t k0, float *out) {
    if (w->kind == GB_WEIGHT_MLX) {
        dq_mlx(w, r, k0, out);
        return;
    }
    const struct gb_type_traits *tt = type_traits(w->type);
    const char *blk = (const char *)w->data + (size_t)r * w->row_bytes + (size_t)(k0 / tt->block_size) * tt->type_size;
    switch (w->type) {
    case GB_TYPE_Q4_K: dq_q4_K((const block_q4_K *)blk, out); return;
    case GB_TYPE_Q6_K: dq_q6_K((const block_q6_K *)blk, out); return;
    case GB_TYPE_Q8_0: dq_q8_0((const block_q8_0 *)blk, out); return;
    case GB_TYPE_Q4_0: dq_q4_0((const block_q4_0 *)blk, out); return;
    default: quant_fns(w->type).to_float(blk, out, 256); return;
    }
}

/* ---- panel --------------------------------------------------------------------------- */

/* 16 x 16 transpose of u32 elements: v[i] word j <-> v[j] word i. */
AI void transpose16(__m512i v[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 16; i += 2) { /* within 128-bit lanes: (r_i, r_i+1) words interleaved */
        t[i] = _mm512_unpacklo_epi32(v[i], v[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(v[i], v[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) { /* u[i + c] lane l: rows i..i+3 of word 4l + c */
        u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int c = 0; c < 4; c++) { /* gather lane l of u[c], u[4 + c], u[8 + c], u[12 + c] */
        __m512i a = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x88), b = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xdd);
        __m512i a2 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x88), b2 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xdd);
        v[c] = _mm512_shuffle_i32x4(a, a2, 0x88);      /* word c */
        v[8 + c] = _mm512_shuffle_i32x4(a, a2, 0xdd);  /* word 8 + c */
        v[4 + c] = _mm512_shuffle_i32x4(b, b2, 0x88);  /* word 4 + c */
        v[12 + c] = _mm512_shuffle_i32x4(b, b2, 0xdd); /* word 12 + c */
    }
}

/* Rows o0..o0 + nr - 1 (nr <= PR; the rest zero), k in [k0, k0 + kn), into pan[kn / 2][PR]. */
static void pack(const struct gb_weight *w, int o0, int nr, int64_t k0, int kn, uint32_t *pan) {
    _Alignas(64) float tmp[PR][256];
    for (int kk = 0; kk < kn; kk += 256) {
        for (int r = 0; r < PR; r++) {
            if (r < nr) dq256(w, o0 + r, k0 + kk, tmp[r]);
            else memset(tmp[r], 0, sizeof tmp[r]);
        }
        for (int h = 0; h < PR / 16; h++) {
            for (int s = 0; s < 8; s++) { /* elements 32 s .. 32 s + 31: pairs 16 s .. */
                __m512i v[16];
                for (int i = 0; i < 16; i++) {
                    const float *src = tmp[16 * h + i] + 32 * s;
                    v[i] = (__m512i)_mm512_cvtne2ps_pbh(_mm512_load_ps(src + 16), _mm512_load_ps(src));
                }
                transpose16(v);
                uint32_t *dst = pan + (size_t)(kk / 2 + 16 * s) * PR + 16 * h;
                for (int p = 0; p < 16; p++) _mm512_store_si512(dst + (size_t)p * PR, v[p]);
            }
        }
    }
}

/* ---- GEMM tile ----------------------------------------------------------------------- */

/* T tokens x 32 rows over np pairs of k: y (masked by m0, m1 for rows 0..15, 16..31)
 * starts from 0 (first) or from y. */
AI void tile(int T, const uint32_t *pan, int np, const uint16_t *x, size_t xs, float *y, size_t ldy, __mmask16 m0,
             __mmask16 m1, int first) {
    __m512 a0[TT], a1[TT];
#pragma GCC unroll 12
    for (int t = 0; t < T; t++) {
        if (first) {
            a0[t] = a1[t] = _mm512_setzero_ps();
        } else {
            a0[t] = _mm512_maskz_loadu_ps(m0, y + (size_t)t * ldy);
            a1[t] = _mm512_maskz_loadu_ps(m1, y + (size_t)t * ldy + 16);
        }
    }
    for (int p = 0; p < np; p++) {
        __m512bh w0 = (__m512bh)_mm512_load_si512(pan + (size_t)p * PR);
        __m512bh w1 = (__m512bh)_mm512_load_si512(pan + (size_t)p * PR + 16);
#pragma GCC unroll 12
        for (int t = 0; t < T; t++) {
            int32_t xv;
            memcpy(&xv, x + (size_t)t * xs + 2 * (size_t)p, 4);
            __m512bh b = (__m512bh)_mm512_set1_epi32(xv);
            a0[t] = _mm512_dpbf16_ps(a0[t], w0, b);
            a1[t] = _mm512_dpbf16_ps(a1[t], w1, b);
        }
    }
#pragma GCC unroll 12
    for (int t = 0; t < T; t++) {
        _mm512_mask_storeu_ps(y + (size_t)t * ldy, m0, a0[t]);
        _mm512_mask_storeu_ps(y + (size_t)t * ldy + 16, m1, a1[t]);
    }
}

#define TILE(n) tile(n, pan, kn / 2, xt, xs, yt, ldy, m0, m1, k0 == 0)

void gemm_bf16_rows_avx512(const struct gb_weight *w, int o0, int nr, const uint16_t *xb, size_t xs, int n_tok,
                           float *y, size_t ldy) {
    _Alignas(64) uint32_t pan[KB / 2 * PR];
    int n_in = (int)w->n_in;
    for (int r0 = 0; r0 < nr; r0 += PR) {
        int pr = nr - r0 < PR ? nr - r0 : PR;
        __mmask16 m0 = (__mmask16)(pr >= 16 ? 0xffff : (1u << pr) - 1u);
        __mmask16 m1 = (__mmask16)(pr >= 32 ? 0xffff : pr > 16 ? (1u << (pr - 16)) - 1u : 0u);
        for (int k0 = 0; k0 < n_in; k0 += KB) {
            int kn = n_in - k0 < KB ? n_in - k0 : KB;
            pack(w, o0 + r0, pr, k0, kn, pan);
            for (int t0 = 0; t0 < n_tok; t0 += TT) {
                int T = n_tok - t0 < TT ? n_tok - t0 : TT;
                const uint16_t *xt = xb + (size_t)t0 * xs + k0;
                float *yt = y + (size_t)t0 * ldy + o0 + r0;
                switch (T) {
                case 12: TILE(12); break;
                case 11: TILE(11); break;
                case 10: TILE(10); break;
                case 9: TILE(9); break;
                case 8: TILE(8); break;
                case 7: TILE(7); break;
                case 6: TILE(6); break;
                case 5: TILE(5); break;
                case 4: TILE(4); break;
                case 3: TILE(3); break;
                case 2: TILE(2); break;
                default: TILE(1); break;
                }
            }
        }
    }
}
