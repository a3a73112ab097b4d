/* Prefill over quantized weights: dequantize a panel of rows once, then a register-blocked
 * GEMM over every token: bf16 (AVX512-BF16 vdpbf16ps) for the GGML block types, 16-bit
 * integers (vpdpwssd) for MLX 4/8-bit (see the MLX section for why not bf16).
 *
 * Why: the per-token kernels (qmatmul_*.c) unpack and rescale every weight block again
 * for each small tile of tokens; at 512 prompt tokens that per-block work, not the
 * multiply-adds, bounds them. Here each weight is unpacked once per call and the inner
 * loop is nothing but multiply-adds: per pair of k, two 64-byte panel loads (32 rows)
 * and, per token, one broadcast of x's pair into two vdpbf16ps (16 rows x 2 products
 * each). 32 rows x 12 tokens keep 24 accumulators in registers. Measured on Zen 5:
 * vdpbf16ps issues two per cycle (200 GMAC/s per core, the rate of 512-bit FMAs).
 *
 * Panel layout: for rows o0..o0+31 and k in a block of KB, u32 word (p, r) holds
 * bf16(w[r][2p]) (low half) and bf16(w[r][2p + 1]) (high half): one 64-byte load gives
 * 16 rows' pair p, which is what vdpbf16ps multiplies against x's pair p broadcast.
 * Rows are dequantized 256 elements (or the row's last 32 m) at a time into f32, rounded
 * to bf16 and transposed 16 x 16 (in u32 units) into that order.
 *
 * Precision (bf16): w and x each rounded to bf16 (relative error <= 2^-9), products
 * summed in f32: |error| <= ~2^-8 sum_k |w x|. The GGUF formats' per-token kernels
 * quantize x to 8 bits per block (up to 2^-8 of the block's largest |x| per element),
 * so this is no worse for them (the GGUF golden models: 0.03-0.08 x RMS against 0.08-0.28
 * one token per call).
 *
 * Each output (row, token) goes through the same operations in the same order (its
 * K blocks in turn, each a chain of multiply-adds starting from the previous block's
 * value) whatever the tile, panel or thread split. */
#include "backend/cpu/gemm_avx512.h"

#include "backend/cpu/qmatmul_simd.h" /* scales_k4 */
#include "backend/cpu/simd512.h"
#include "base/fp16.h"
#include "tensor/quant.h"
#include "tensor/quant_ref.h"
#include "backend/cpu/mlx_packed.h"

#include <immintrin.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))

enum {
    PR = 32,       /* rows per panel: two zmm of 16 */
    KB = GEMM_KB,  /* k per panel block: the whole row up to 4096 (the panel, up to 256 KB, is
                      read from L2). With 512 (a panel in L1) every token tile started again per
                      block, its y accumulators stored and reloaded and its x stream restarted:
                      MLX 4-bit 512 tokens, 2 threads, 455-495 against 515-595 GFLOP/s whole-row */
    TT = GEMM_T,   /* tokens per tile: 24 accumulators (bf16: f32 ones; MLX: int32 ones, its
                      f32 ones, touched once per group, live in memory: bench_qmatmul gemm, 512
                      tokens, 308 against 281 GFLOP/s with 6 tokens and all in registers) */
};

enum gemm_kind gemm_kind_of(const struct gb_weight *w) {
    if (w->n_in <= 0 || w->n_in % 32 != 0) return GEMM_NONE; /* k-quant rows are whole 256-blocks anyway */
    if (w->kind == GB_WEIGHT_MLX)
        return (w->bits == 4 || w->bits == 8) && w->n_in % w->group_size == 0 ? GEMM_MLX16 : GEMM_NONE;
    return quant_fns(w->type).to_float != NULL ? GEMM_BF16 : GEMM_NONE; /* GGML block types */
}

/* Token t's pair p (u32 of two 16-bit values) in an x buffer of tiles of T tokens: the
 * tile reads its tokens' pair p from one 4 T-byte row (constant offsets, no per-token
 * pointers: 12 of those took the integer registers and were reloaded every step). */
static inline uint32_t *x_pair(uint32_t *xp, int n, int T, int t, int p) {
    return xp + ((size_t)(t / T) * (size_t)(n / 2) + (size_t)p) * (size_t)T + (size_t)(t % T);
}

void gemm_bf16_x_avx512(const float *x, int n, int t, uint32_t *xp) {
    uint32_t *o = x_pair(xp, n, TT, t, 0);
    for (int i = 0; i < n; i += 32) {
        _Alignas(64) uint32_t v[16];
        _mm512_store_si512(v, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i)));
        for (int j = 0; j < 16; j++) o[(size_t)(i / 2 + j) * TT] = v[j];
    }
}

/* ---- dequantization of up to 256 elements of one row ---------------------------------- */

/* out[16 g + i] = a[g] q[16 g + i] + b[g] for n / 16 groups of 16 codes (signed when sgn). */
AI void expand(int n, const uint8_t *q, int sgn, const float *a, const float *b, float *out) {
    for (int g = 0; g < n / 16; g++) {
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
    expand(256, q, 0, a, o, out);
}

static void dq_q6_K(const block_q6_K *b, float *out) {
    uint8_t q[256];
    float a[16], o[16];
    float d = f16_to_f32(b->d);
    for (int g = 0; g < 16; g++) { a[g] = d * (float)b->scales[g]; o[g] = 0.0f; }
    const __m256i k32 = _mm256_set1_epi8(32);
    for (int h = 0; h < 2; h++) { /* 6-bit codes minus 32 */
        __m256i v[4];
        q6k_codes(b->ql + 64 * h, b->qh + 32 * h, v);
        for (int k = 0; k < 4; k++) _mm256_storeu_si256((__m256i *)(q + 128 * h + 32 * k), _mm256_sub_epi8(v[k], k32));
    }
    expand(256, q, 1, a, o, out);
}

/* n (a multiple of 32, <= 256) elements */
static void dq_q8_0(const block_q8_0 *b, int n, float *out) {
    uint8_t q[256];
    float a[16], o[16];
    for (int i = 0; i < n / 32; i++) {
        memcpy(q + 32 * i, b[i].qs, 32);
        a[2 * i] = a[2 * i + 1] = f16_to_f32(b[i].d);
        o[2 * i] = o[2 * i + 1] = 0.0f;
    }
    expand(n, q, 1, a, o, out);
}

static void dq_q4_0(const block_q4_0 *b, int n, float *out) {
    uint8_t q[256];
    float a[16], o[16];
    const __m128i m4 = _mm_set1_epi8(15);
    for (int i = 0; i < n / 32; i++) { /* elements 0..15: low nibbles; 16..31: high */
        __m128i v = _mm_loadu_si128((const __m128i *)b[i].qs);
        _mm_storeu_si128((__m128i *)(q + 32 * i), _mm_and_si128(v, m4));
        _mm_storeu_si128((__m128i *)(q + 32 * i + 16), _mm_and_si128(_mm_srli_epi16(v, 4), m4));
        float d = f16_to_f32(b[i].d);
        a[2 * i] = a[2 * i + 1] = d;
        o[2 * i] = o[2 * i + 1] = -8.0f * d;
    }
    expand(n, q, 0, a, o, out);
}

/* Elements k0..k0 + n - 1 of row r as f32 (k0 % 256 == 0; n a multiple of 32, <= 256, and
 * 256 for the k-quants). */
static void dq_chunk(const struct gb_weight *w, int64_t r, int64_t k0, int n, float *out) {
    const struct gb_type_traits *tt = type_traits(w->type);
    const char *blk = (const char *)w->data + (size_t)r * w->row_bytes + (size_t)(k0 / tt->block_size) * tt->type_size;
    switch (w->type) {
    case GB_TYPE_Q4_K: dq_q4_K((const block_q4_K *)blk, out); return;
    case GB_TYPE_Q6_K: dq_q6_K((const block_q6_K *)blk, out); return;
    case GB_TYPE_Q8_0: dq_q8_0((const block_q8_0 *)blk, n, out); return;
    case GB_TYPE_Q4_0: dq_q4_0((const block_q4_0 *)blk, n, out); return;
    default: quant_fns(w->type).to_float(blk, out, n); return;
    }
}

/* ---- panel --------------------------------------------------------------------------- */

/* PR rows of n (a multiple of 32) 16-bit values, tmp[r][0..n), as pairs into the panel
 * from pair p0 on: pair p of row r at pan[(p0 + p) PR + r] (16 rows' 16 pairs transposed
 * 16 x 16 at a time). */
static void put_panel(const int16_t (*tmp)[256], int n, int p0, uint32_t *pan) {
    for (int h = 0; h < PR / 16; h++) {
        for (int s = 0; s < n / 32; s++) { /* elements 32 s .. 32 s + 31: pairs 16 s .. */
            __m512i v[16];
            for (int i = 0; i < 16; i++) v[i] = _mm512_load_si512(tmp[16 * h + i] + 32 * s);
            transpose16_epi32(v);
            uint32_t *dst = pan + (size_t)(p0 + 16 * s) * PR + 16 * h;
            for (int p = 0; p < 16; p++) _mm512_store_si512(dst + (size_t)p * PR, v[p]);
        }
    }
}

/* Rows o0..o0 + nr - 1 (nr <= PR; the rest zero), k in [k0, k0 + kn), into pan[kn / 2][PR]
 * as bf16. */
static void pack(const struct gb_weight *w, int o0, int nr, int64_t k0, int kn, uint32_t *pan) {
    _Alignas(64) int16_t tmp[PR][256];
    _Alignas(64) float f[256];
    for (int kk = 0; kk < kn; kk += 256) {
        int n = kn - kk < 256 ? kn - kk : 256;
        for (int r = 0; r < PR; r++) {
            if (r >= nr) {
                memset(tmp[r], 0, sizeof tmp[r]);
                continue;
            }
            dq_chunk(w, o0 + r, k0 + kk, n, f);
            for (int i = 0; i < n; i += 32)
                _mm512_store_si512(tmp[r] + i, (__m512i)_mm512_cvtne2ps_pbh(_mm512_load_ps(f + i + 16),
                                                                            _mm512_load_ps(f + i)));
        }
        put_panel((const int16_t (*)[256])tmp, n, kk / 2, pan);
    }
}

/* ---- GEMM tiles ---------------------------------------------------------------------- */

/* The f32 accumulators of T tokens x 32 rows: zero (first K block) or y so far; masks m0,
 * m1 for rows 0..15, 16..31. */
AI void acc_load(int T, const float *y, size_t ldy, __mmask16 m0, __mmask16 m1, int first, __m512 *a0, __m512 *a1) {
#pragma GCC unroll 12
    for (int t = 0; t < T; t++) {
        a0[t] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m0, y + (size_t)t * ldy);
        a1[t] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m1, y + (size_t)t * ldy + 16);
    }
}

AI void acc_store(int T, float *y, size_t ldy, __mmask16 m0, __mmask16 m1, const __m512 *a0, const __m512 *a1) {
#pragma GCC unroll 12
    for (int t = 0; t < T; t++) {
        _mm512_mask_storeu_ps(y + (size_t)t * ldy, m0, a0[t]);
        _mm512_mask_storeu_ps(y + (size_t)t * ldy + 16, m1, a1[t]);
    }
}

/* T tokens x 32 rows over np pairs of k: y (masked by m0, m1 for rows 0..15, 16..31)
 * starts from 0 (first) or from y. */
AI void tile(int T, const uint32_t *pan, int np, const uint32_t *x, float *y, size_t ldy, __mmask16 m0, __mmask16 m1,
             int first) {
    __m512 a0[TT], a1[TT];
    acc_load(T, y, ldy, m0, m1, first, a0, a1);
    for (int p = 0; p < np; p++) {
        __m512bh w0 = (__m512bh)_mm512_load_si512(pan + (size_t)p * PR);
        __m512bh w1 = (__m512bh)_mm512_load_si512(pan + (size_t)p * PR + 16);
#pragma GCC unroll 12
        for (int t = 0; t < T; t++) {
            __m512bh b = (__m512bh)_mm512_set1_epi32((int)x[(size_t)p * TT + t]);
            a0[t] = _mm512_dpbf16_ps(a0[t], w0, b);
            a1[t] = _mm512_dpbf16_ps(a1[t], w1, b);
        }
    }
    acc_store(T, y, ldy, m0, m1, a0, a1);
}

/* ---- MLX 4/8-bit: a 16-bit integer GEMM ---------------------------------------------------
 * bf16 is not precise enough here: w = s q + b rounded to bf16 and x rounded to bf16 moved the
 * MLX golden models' logits by 0.05-0.2 x RMS (tests/test_golden_quant.c), against the
 * 2e-2 x RMS bound. So the panel holds the integer codes (exact as int16) in the same pair
 * layout, x is quantized to 16 bits with one step per weight group (x ~ d_g qx), and per
 * group vpdpwssd sums q qx exactly in int32 (at most 64 pairs of 255 x 32767 per lane: no
 * overflow); then y += float(sum) (s_g d_g) + b_g xsum_g, xsum_g = d_g sum(qx). The error
 * is w . (x~ - x), 2^-15 of each group's largest |x| per element. */

void gemm_mlx_x_avx512(const float *x, int n, int gs, int t, uint32_t *xp, float *d, float *sum) {
    uint32_t *o = x_pair(xp, n, TT, t, 0);
    for (int g = 0; g < n / gs; g++) {
        const float *xg = x + (size_t)g * gs;
        __m512 amax = _mm512_setzero_ps();
        for (int i = 0; i < gs; i += 16) amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_loadu_ps(xg + i)));
        float m = _mm512_reduce_max_ps(amax);
        float id = m > 0.0f ? 32767.0f / m : 0.0f;
        __m512i s = _mm512_setzero_si512();
        for (int i = 0; i < gs; i += 16) { /* vcvtps2dq rounds to nearest even */
            __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xg + i), _mm512_set1_ps(id)));
            s = _mm512_add_epi32(s, v);
            _Alignas(32) uint32_t pr[8];
            _mm256_store_si256((__m256i *)pr, _mm512_cvtepi32_epi16(v));
            for (int j = 0; j < 8; j++) o[(size_t)((g * gs + i) / 2 + j) * TT] = pr[j];
        }
        d[g] = m / 32767.0f;
        sum[g] = d[g] * (float)_mm512_reduce_add_epi32(s);
    }
}

/* Codes straight into the panel: 16 rows' words of a row segment are loaded (one 64-byte
 * load a row), transposed 16 x 16 so a vector holds one word of each of the 16 rows, and each
 * byte of that word becomes one pair of the panel (a vpshufb; for 4-bit one more shift and
 * mask to split its nibbles). No per-row int16 staging and no second transpose.
 *
 * pair_ctl(bits, k): the vpshufb control making, from each u32 lane, 4-bit: byte k in both
 * halves (b | b << 16, split by nib_pair); 8-bit: bytes 2k and 2k + 1 as the pair's halves. */
static __m512i pair_ctl(int bits, int k) {
    _Alignas(64) uint8_t c[64];
    for (int i = 0; i < 64; i += 4) { /* vpshufb indexes within the 16-byte lane: u32 q at 4q */
        int q = i % 16 / 4;
        c[i] = (uint8_t)(4 * q + (bits == 4 ? k : 2 * k));
        c[i + 2] = (uint8_t)(4 * q + (bits == 4 ? k : 2 * k + 1));
        c[i + 1] = c[i + 3] = 0x80; /* zero */
    }
    return _mm512_load_si512(c);
}

/* b | b << 16 (b a byte of 4-bit codes) -> (b & 15) | (b >> 4) << 16: the pair (low nibble,
 * high nibble) as two int16. */
AI __m512i nib_pair(__m512i v) {
    v = _mm512_srlv_epi16(v, _mm512_set1_epi32(4 << 16));
    return _mm512_and_si512(v, _mm512_set1_epi32((int)0xffff000f));
}

/* Scales or biases at..at + n - 1 (n <= 16; F32, F16 or BF16) as f32, the other lanes 0. */
AI __m512 sb16(enum gb_type t, const void *p, size_t at, int n) {
    __mmask16 m = lanes16(n);
    if (t == GB_TYPE_F32) return _mm512_maskz_loadu_ps(m, (const float *)p + at);
    __m256i v = _mm256_maskz_loadu_epi16(m, (const uint16_t *)p + at);
    if (t == GB_TYPE_F16) return _mm512_cvtph_ps(v);
    GB_ASSERT(t == GB_TYPE_BF16);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}

/* Rows o0..o0 + nr - 1 (the rest zero), k in [k0, k0 + kn): codes into pan[kn / 2][PR]
 * (int16 pairs), scales and biases into ps, pb [kn / gs][PR] as f32.
 * 4-bit, per set of 16 blocks (512 codes; a row's last set may have fewer, nb): in packed
 * order (mlx_packed.h) load c of a row is word c of the set's blocks, in MLX's order it is
 * blocks 4c .. 4c + 3; word j of block m holds pairs 16 m + 4 j .. + 3, byte k pair 16 m + 4 j
 * + k. 8-bit, per 16 words (64 codes): word q holds pairs 2 q, 2 q + 1. */
static void pack_mlx(const struct gb_weight *w, int o0, int nr, int64_t k0, int kn, uint32_t *pan, float *ps,
                     float *pb) {
    const uint32_t *data = (const uint32_t *)w->data;
    size_t nw = (size_t)w->n_in * (size_t)w->bits / 32; /* words per row */
    int four = w->bits == 4, step = four ? 512 : 64;
    __m512i ctl[4];
    for (int k = 0; k < (four ? 4 : 2); k++) ctl[k] = pair_ctl(w->bits, k);
    for (int h = 0; h < PR / 16; h++) {
        for (int e0 = 0; e0 < kn; e0 += step) {
            int nb = (kn - e0) / 32 < 16 ? (kn - e0) / 32 : 16; /* 4-bit: blocks in the set */
            size_t b0 = (size_t)(k0 + e0) / 32;                 /* the set's first block in the row */
            for (int c = 0; c < (four ? 4 : 1); c++) {
                __m512i t[16];
                for (int i = 0; i < 16; i++) {
                    int64_t r = o0 + 16 * h + i;
                    if (16 * h + i >= nr) {
                        t[i] = _mm512_setzero_si512();
                    } else if (four && w->packed) {
                        size_t d, p = mlx4_packed_block(w->n_out, nw, r, b0, &d);
                        t[i] = _mm512_maskz_loadu_epi32(lanes16(nb), data + p + (size_t)c * d);
                    } else { /* MLX's order: 16 consecutive words of the row */
                        int nv = four ? 4 * nb - 16 * c : (kn - e0) / 4;
                        t[i] = nv <= 0 ? _mm512_setzero_si512()
                                       : _mm512_maskz_loadu_epi32(lanes16(nv), data + (size_t)r * nw +
                                                                                    (size_t)(k0 + e0) * w->bits / 32 +
                                                                                    16 * (size_t)c);
                    }
                }
                transpose16_epi32(t); /* t[q] lane i: row 16 h + i's word q of its load */
                for (int q = 0; q < 16; q++) {
                    uint32_t *dst;
                    if (four) {
                        int m = w->packed ? q : 4 * c + q / 4, j = w->packed ? c : q % 4;
                        if (m >= nb) continue;
                        dst = pan + (size_t)(e0 / 2 + 16 * m + 4 * j) * PR + 16 * h;
                        for (int k = 0; k < 4; k++)
                            _mm512_store_si512(dst + (size_t)k * PR, nib_pair(_mm512_shuffle_epi8(t[q], ctl[k])));
                    } else {
                        if (4 * q >= kn - e0) break;
                        dst = pan + (size_t)(e0 / 2 + 2 * q) * PR + 16 * h;
                        _mm512_store_si512(dst, _mm512_shuffle_epi8(t[q], ctl[0]));
                        _mm512_store_si512(dst + PR, _mm512_shuffle_epi8(t[q], ctl[1]));
                    }
                }
            }
        }
    }
    /* scales and biases: 16 groups of 16 rows converted a row at a time, transposed */
    int gs = w->group_size, ngk = kn / gs;
    int64_t ng = w->n_in / gs;
    for (int a = 0; a < 2; a++) {
        const void *src = a ? w->biases : w->scales;
        float *dst = a ? pb : ps;
        for (int h = 0; h < PR / 16; h++)
            for (int g0 = 0; g0 < ngk; g0 += 16) {
                int n = ngk - g0 < 16 ? ngk - g0 : 16;
                __m512i t[16];
                for (int i = 0; i < 16; i++) {
                    size_t at = (size_t)((o0 + 16 * h + i) * ng + k0 / gs + g0);
                    t[i] = 16 * h + i < nr ? _mm512_castps_si512(sb16(w->sb_type, src, at, n)) : _mm512_setzero_si512();
                }
                transpose16_epi32(t);
                for (int g = 0; g < n; g++) _mm512_storeu_si512(dst + (size_t)(g0 + g) * PR + 16 * h, t[g]);
            }
    }
}

/* acc += pairwise products of a and b (vpdpwssd). As inline asm with the accumulator tied:
 * GCC 12's intrinsic copied all 12 accumulators in and out of the loop every step (a
 * register move per vpdpwssd). */
AI void dpwssd(__m512i *acc, __m512i a, __m512i b) { __asm__("vpdpwssd %2, %1, %0" : "+v"(*acc) : "v"(a), "v"(b)); }

AI void tile_mlx(int T, const uint32_t *pan, const float *ps, const float *pb, int ngr, int gp, const uint32_t *x,
                 const float *xd, const float *xsum, size_t gstr, float *y, size_t ldy, __mmask16 m0,
                 __mmask16 m1, int first) {
    __m512 f0[TT], f1[TT];
    acc_load(T, y, ldy, m0, m1, first, f0, f1);
    for (int gi = 0; gi < ngr; gi++) {
        __m512i i0[TT], i1[TT];
#pragma GCC unroll 12
        for (int t = 0; t < T; t++) i0[t] = i1[t] = _mm512_setzero_si512();
        for (int p = gi * gp; p < (gi + 1) * gp; p++) {
            __m512i w0 = _mm512_load_si512(pan + (size_t)p * PR), w1 = _mm512_load_si512(pan + (size_t)p * PR + 16);
#pragma GCC unroll 12
            for (int t = 0; t < T; t++) {
                __m512i b = _mm512_set1_epi32((int)x[(size_t)p * TT + t]);
                dpwssd(&i0[t], w0, b);
                dpwssd(&i1[t], w1, b);
            }
        }
        __m512 s0 = _mm512_load_ps(ps + gi * PR), s1 = _mm512_load_ps(ps + gi * PR + 16);
        __m512 c0 = _mm512_load_ps(pb + gi * PR), c1 = _mm512_load_ps(pb + gi * PR + 16);
#pragma GCC unroll 12
        for (int t = 0; t < T; t++) {
            __m512 dv = _mm512_set1_ps(xd[(size_t)t * gstr + gi]), sv = _mm512_set1_ps(xsum[(size_t)t * gstr + gi]);
            f0[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i0[t]), _mm512_mul_ps(s0, dv), f0[t]);
            f0[t] = _mm512_fmadd_ps(c0, sv, f0[t]);
            f1[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i1[t]), _mm512_mul_ps(s1, dv), f1[t]);
            f1[t] = _mm512_fmadd_ps(c1, sv, f1[t]);
        }
    }
    acc_store(T, y, ldy, m0, m1, f0, f1);
}

/* ---- the driver: panels of 32 rows, K blocks, token tiles ------------------------------ */

#define TILE(n)                                                                                                  \
    (mlx ? tile_mlx(n, pan, ps, pb, kn / gs, gs / 2, xt, xd + (size_t)t0 * gstr + k0 / gs,                      \
                    xsum + (size_t)t0 * gstr + k0 / gs, gstr, yt, ldy, m0, m1, k0 == 0)                          \
         : tile(n, pan, kn / 2, xt, yt, ldy, m0, m1, k0 == 0))

/* k per panel for w: its whole row up to KB */
static int panel_k(const struct gb_weight *w) { return w->n_in < KB ? (int)w->n_in : KB; }

size_t gemm_panel_bytes(const struct gb_weight *w) {
    size_t kb = (size_t)panel_k(w);
    return kb / 2 * PR * sizeof(uint32_t) + 2 * (kb / 32) * PR * sizeof(float); /* codes, scales + biases */
}

/* mlx: w is MLX 4/8-bit (pack_mlx, tile_mlx; xd, xsum, gstr used), else bf16 (pack, tile).
 * scratch: gemm_panel_bytes(w), 64-byte aligned. */
static void gemm_rows(const struct gb_weight *w, int mlx, int o0, int nr, const uint32_t *xp, const float *xd,
                      const float *xsum, size_t gstr, int n_tok, float *y, size_t ldy, void *scratch) {
    int n_in = (int)w->n_in, gs = mlx ? w->group_size : 0, kb = panel_k(w);
    uint32_t *pan = scratch;
    float *ps = (float *)(pan + (size_t)kb / 2 * PR), *pb = ps + (size_t)kb / 32 * PR;
    for (int r0 = 0; r0 < nr; r0 += PR) {
        int pr = nr - r0 < PR ? nr - r0 : PR;
        __mmask16 m0 = (__mmask16)(pr >= 16 ? 0xffff : (1u << pr) - 1u);
        __mmask16 m1 = (__mmask16)(pr >= 32 ? 0xffff : pr > 16 ? (1u << (pr - 16)) - 1u : 0u);
        for (int k0 = 0; k0 < n_in; k0 += kb) {
            int kn = n_in - k0 < kb ? n_in - k0 : kb;
            if (mlx) pack_mlx(w, o0 + r0, pr, k0, kn, pan, ps, pb);
            else pack(w, o0 + r0, pr, k0, kn, pan);
            for (int t0 = 0; t0 < n_tok; t0 += TT) {
                int T = n_tok - t0 < TT ? n_tok - t0 : TT;
                const uint32_t *xt = x_pair((uint32_t *)xp, n_in, TT, t0, k0 / 2);
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

void gemm_bf16_rows_avx512(const struct gb_weight *w, int o0, int nr, const uint32_t *xp, int n_tok, float *y,
                           size_t ldy, void *scratch) {
    gemm_rows(w, 0, o0, nr, xp, NULL, NULL, 0, n_tok, y, ldy, scratch);
}

void gemm_mlx_rows_avx512(const struct gb_weight *w, int o0, int nr, const uint32_t *xp, const float *xd,
                          const float *xsum, size_t gstr, int n_tok, float *y, size_t ldy, void *scratch) {
    gemm_rows(w, 1, o0, nr, xp, xd, xsum, gstr, n_tok, y, ldy, scratch);
}
