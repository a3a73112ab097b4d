/* AVX2 + FMA + F16C kernels. Two matmul shapes matter:
 *
 *  - decode (n_tok == 1): y = W x streams every weight once and is bound by memory
 *    bandwidth, so the job is to keep loads in flight: 4 rows at a time share each x
 *    load, each row has 2 accumulators (8 independent FMA chains), bf16/f16 is
 *    widened in registers on the fly, and the next 4 rows are prefetched.
 *  - prefill (n_tok > 1): bound by arithmetic once there are more than a few
 *    tokens. A 4-row x 3-token register tile (12 accumulators) does 12 FMAs per 7
 *    loads, widening weights in registers; weights stream as in decode, once per
 *    block of tokens whose x fits in L2 (see gemm).
 *
 * Summation order, which the thread-count independence rests on: y[t][o] is
 *   sum over k-blocks of KC (in order) of
 *     hsum(8-lane partial sums over that block's 8-element steps)
 * for prefill, and hsum(acc_even + acc_odd) + scalar tail (in order) for decode, with
 * hsum always hsum8x4's tree. Neither depends on which rows or tokens share a tile,
 * nor on where a thread's rows begin. (Decode and prefill orders differ, so a token's
 * y may differ in the last bits between the two paths.) */
#include "backend/cpu/kernels_avx2.h"
#include "base/fp16.h"

#include <immintrin.h>
#include <math.h>
#include <stddef.h>

#define ALWAYS_INLINE inline __attribute__((always_inline))

/* Horizontal sum of 8 lanes, always in the same tree: (lo + hi) halves, then pairs. */
static ALWAYS_INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The four horizontal sums of a, b, c, d as one vector, in one fixed tree per lane:
 * adjacent pairs, then pairs of pairs, then the two 128-bit halves. */
static ALWAYS_INLINE __m128 hsum8x4(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

/* 8 weights from element i of a row, widened to f32. The type is a constant at every
 * call site, so the branches fold away. bf16 is the top half of an f32: zero-extend
 * to 32 bits and shift left 16. */
static ALWAYS_INLINE __m256 load8_w(const void *row, size_t i, enum gb_type t) {
    if (t == GB_TYPE_F32) return _mm256_loadu_ps((const float *)row + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + i));
    if (t == GB_TYPE_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static ALWAYS_INLINE float load1_w(const void *row, size_t i, enum gb_type t) {
    if (t == GB_TYPE_F32) return ((const float *)row)[i];
    uint16_t h = ((const uint16_t *)row)[i];
    return t == GB_TYPE_F16 ? f16_to_f32(h) : bf16_to_f32(h);
}

static ALWAYS_INLINE size_t type_bytes(enum gb_type t) { return t == GB_TYPE_F32 ? 4 : 2; }

/* Lanes [0, n) set, for 0 <= n <= 8: a window into -1 x 8, 0 x 8. */
static const int32_t mask_tab[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
static ALWAYS_INLINE __m256i mask_first(int n) {
    return _mm256_loadu_si256((const __m256i *)(mask_tab + 8 - n));
}

/* ---- decode: y[o] = dot(w[o], x) ---------------------------------------------- */

/* While a group of 4 rows is summed, the same columns of the next group are
 * prefetched: the hardware prefetcher alone loses ground at every jump to a new row
 * (a bf16 row of 1024 is only 32 cache lines), and one group ahead is about one
 * DRAM latency of work. */
enum { PREFETCH_ROWS = 4 };

/* R (1..4) consecutive rows starting at row0; pf: where to prefetch (the same
 * columns of the next group, or row0 itself when there is none). */
static ALWAYS_INLINE void gemv_rows(float *y, const float *x, const char *row0, size_t row_bytes,
                                    const char *pf, int n, int R, enum gb_type t) {
    __m256 a0[4], a1[4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) a0[r] = a1[r] = _mm256_setzero_ps();
    int i = 0;
    size_t esz = type_bytes(t);
    for (; i + 16 <= n; i += 16) {
        __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + 8);
        if (((size_t)i * esz & 63) == 0) { /* once per cache line of each row */
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) _mm_prefetch(pf + (size_t)r * row_bytes + (size_t)i * esz, _MM_HINT_T0);
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const char *p = row0 + (size_t)r * row_bytes;
            a0[r] = _mm256_fmadd_ps(load8_w(p, (size_t)i, t), x0, a0[r]);
            a1[r] = _mm256_fmadd_ps(load8_w(p, (size_t)i + 8, t), x1, a1[r]);
        }
    }
    if (i + 8 <= n) {
        __m256 x0 = _mm256_loadu_ps(x + i);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            a0[r] = _mm256_fmadd_ps(load8_w(row0 + (size_t)r * row_bytes, (size_t)i, t), x0, a0[r]);
        i += 8;
    }
    /* Rows past R reduce zeros, so every row's sum takes the same path. */
    __m256 z = _mm256_setzero_ps();
    float sums[4];
    _mm_storeu_ps(sums, hsum8x4(_mm256_add_ps(a0[0], a1[0]), R > 1 ? _mm256_add_ps(a0[1], a1[1]) : z,
                                R > 2 ? _mm256_add_ps(a0[2], a1[2]) : z,
                                R > 3 ? _mm256_add_ps(a0[3], a1[3]) : z));
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        const char *p = row0 + (size_t)r * row_bytes;
        float s = sums[r];
        for (int j = i; j < n; j++) s += x[j] * load1_w(p, (size_t)j, t);
        y[r] = s;
    }
}

/* Decode: each token through gemv_rows, rows in groups of 4 with the next group prefetched.
 * With several tokens (batched decode rows) every token of the call goes against a group
 * before the next, so the group comes from DRAM once and from L1 for the other tokens (4
 * bf16 rows of 4096 are 32 KiB), and each token's result is the one it gets alone. */
static ALWAYS_INLINE void gemv_tokens(float *y, const float *x, const void *w, int n_tok, int n_in, int n_out,
                                      int o_lo, int o_hi, enum gb_type t) {
    size_t row_bytes = type_bytes(t) * (size_t)n_in;
    const char *base = (const char *)w;
    for (int o = o_lo; o < o_hi; o += 4) {
        const char *p = base + (size_t)o * row_bytes;
        int R = o_hi - o < 4 ? o_hi - o : 4;
        const char *pf = R == 4 && o + PREFETCH_ROWS + 4 <= o_hi ? p + PREFETCH_ROWS * row_bytes : p;
        for (int u = 0; u < n_tok; u++) {
            float *yu = y + (size_t)u * n_out + o;
            const float *xu = x + (size_t)u * n_in;
            switch (R) {
            case 4: gemv_rows(yu, xu, p, row_bytes, u == 0 ? pf : p, n_in, 4, t); break;
            case 3: gemv_rows(yu, xu, p, row_bytes, p, n_in, 3, t); break;
            case 2: gemv_rows(yu, xu, p, row_bytes, p, n_in, 2, t); break;
            default: gemv_rows(yu, xu, p, row_bytes, p, n_in, 1, t); break;
            }
        }
    }
}

/* ---- prefill: Y[t][o] = sum_i X[t][i] W[o][i] ------------------------------------- */

enum {
    TILE_R = 4,   /* weight rows per tile */
    TILE_T = 3,   /* tokens per tile: 4 x 3 accumulators + 3 x + 1 w = 16 ymm */
    KC = 256,     /* columns per step down a row group: the 4-row slice (2 KiB of bf16)
                     stays in L1 while every token tile of the block reuses it */
    X_BLOCK_BYTES = 256 << 10, /* tokens per block: as many as keep their rows of x
                                  (n_in floats each) within this, i.e. in L2 */
};

/* 8 weights from element i of a row, the n < 8 present ones followed by zeros. */
static ALWAYS_INLINE __m256 load_tail_w(const void *row, size_t i, int n, enum gb_type t) {
    float v[8] = {0};
    for (int j = 0; j < n; j++) v[j] = load1_w(row, i + (size_t)j, t);
    return _mm256_loadu_ps(v);
}

/* T tokens (rows of x, stride ldx) x 4 weight rows (stride ldw bytes, from the current
 * column) over kc columns; stores R rows of y (stride ldy), writing when first and
 * adding otherwise. Weights are widened in registers: each one is converted once per
 * token tile, which costs issue slots beside the FMAs but no extra memory traffic.
 * pf, if not NULL, is the next row group at the same column, prefetched as we go.
 * Rows past R repeat row R - 1 (valid memory); their sums are dropped. */
static ALWAYS_INLINE void tile(float *y, size_t ldy, const char *w, size_t ldw, enum gb_type wt,
                               const char *pf, const float *x, size_t ldx, int kc, int R, int T,
                               int first) {
    const char *wr[TILE_R];
#pragma GCC unroll 4
    for (int r = 0; r < TILE_R; r++) wr[r] = w + (size_t)(r < R ? r : R - 1) * ldw;
    __m256 acc[TILE_R][TILE_T];
#pragma GCC unroll 12
    for (int r = 0; r < TILE_R; r++)
#pragma GCC unroll 3
        for (int u = 0; u < T; u++) acc[r][u] = _mm256_setzero_ps();
    size_t esz = type_bytes(wt);
    int k = 0;
    for (; k + 8 <= kc; k += 8) {
        if (pf && ((size_t)k * esz & 63) == 0) { /* once per cache line of each row */
#pragma GCC unroll 4
            for (int r = 0; r < TILE_R; r++) _mm_prefetch(pf + (size_t)r * ldw + (size_t)k * esz, _MM_HINT_T0);
        }
        __m256 xv[TILE_T];
#pragma GCC unroll 3
        for (int u = 0; u < T; u++) xv[u] = _mm256_loadu_ps(x + (size_t)u * ldx + k);
#pragma GCC unroll 4
        for (int r = 0; r < TILE_R; r++) {
            __m256 wv = load8_w(wr[r], (size_t)k, wt);
#pragma GCC unroll 3
            for (int u = 0; u < T; u++) acc[r][u] = _mm256_fmadd_ps(wv, xv[u], acc[r][u]);
        }
    }
    if (k < kc) {
        /* Ragged last step: x past kc is masked to 0 (and not read), w is 0 there. */
        __m256i m = mask_first(kc - k);
        __m256 xv[TILE_T];
#pragma GCC unroll 3
        for (int u = 0; u < T; u++) xv[u] = _mm256_maskload_ps(x + (size_t)u * ldx + k, m);
#pragma GCC unroll 4
        for (int r = 0; r < TILE_R; r++) {
            __m256 wv = load_tail_w(wr[r], (size_t)k, kc - k, wt);
#pragma GCC unroll 3
            for (int u = 0; u < T; u++) acc[r][u] = _mm256_fmadd_ps(wv, xv[u], acc[r][u]);
        }
    }
    /* y[u][o..o+3] are adjacent: one 4-wide update per token when the tile is full. */
#pragma GCC unroll 3
    for (int u = 0; u < T; u++) {
        __m128 s = hsum8x4(acc[0][u], acc[1][u], acc[2][u], acc[3][u]);
        float *py = y + (size_t)u * ldy;
        if (R == TILE_R) {
            _mm_storeu_ps(py, first ? s : _mm_add_ps(_mm_loadu_ps(py), s));
        } else {
            float v[4];
            _mm_storeu_ps(v, s);
            for (int r = 0; r < R; r++) py[r] = first ? v[r] : py[r] + v[r];
        }
    }
}

/* Loop order: token blocks (x block in L2) > groups of 4 rows > KC columns > token
 * tiles. Each row group is read from start to end as 4 sequential streams with the
 * next group prefetched, as in decode, so the weights come from DRAM at full speed
 * once per token block; a KC slice is then reused from L1 by every token tile. (A
 * KC-wide stripe down all rows per pass, with rows widened into an f32 panel, was
 * measured slower: the stripe defeats the prefetchers.) */
static ALWAYS_INLINE void gemm(float *y, const float *x, const void *w, int n_tok, int n_in,
                               int n_out, int o_lo, int o_hi, enum gb_type t) {
    size_t esz = type_bytes(t), row_bytes = esz * (size_t)n_in;
    int tb = (int)(X_BLOCK_BYTES / (sizeof(float) * (size_t)n_in)) / TILE_T * TILE_T;
    if (tb < TILE_T) tb = TILE_T;
    for (int u0 = 0; u0 < n_tok; u0 += tb) {
        int u1 = n_tok - u0 < tb ? n_tok : u0 + tb;
        for (int o = o_lo; o < o_hi; o += TILE_R) {
            int R = o_hi - o < TILE_R ? o_hi - o : TILE_R;
            const char *rows = (const char *)w + (size_t)o * row_bytes;
            const char *next = o + 2 * TILE_R <= o_hi ? rows + TILE_R * row_bytes : NULL;
            for (int k0 = 0; k0 < n_in; k0 += KC) {
                int kc = n_in - k0 < KC ? n_in - k0 : KC;
                const char *wk = rows + (size_t)k0 * esz;
                const char *pf = next ? next + (size_t)k0 * esz : NULL; /* first tile only */
                const float *xk = x + k0;
                float *yo = y + o;
                int u = u0;
                for (; u + TILE_T <= u1; u += TILE_T, pf = NULL)
                    tile(yo + (size_t)u * n_out, (size_t)n_out, wk, row_bytes, t, pf,
                         xk + (size_t)u * n_in, (size_t)n_in, kc, R, TILE_T, k0 == 0);
                if (u1 - u == 2)
                    tile(yo + (size_t)u * n_out, (size_t)n_out, wk, row_bytes, t, pf,
                         xk + (size_t)u * n_in, (size_t)n_in, kc, R, 2, k0 == 0);
                else if (u1 - u == 1)
                    tile(yo + (size_t)u * n_out, (size_t)n_out, wk, row_bytes, t, pf,
                         xk + (size_t)u * n_in, (size_t)n_in, kc, R, 1, k0 == 0);
            }
        }
    }
}

/* One instance per weight type, so load8_w's type tests fold at compile time. */
static void gemv_f32(float *y, const float *x, const void *w, int n_tok, int n_in, int n_out, int lo, int hi) { gemv_tokens(y, x, w, n_tok, n_in, n_out, lo, hi, GB_TYPE_F32); }
static void gemv_f16(float *y, const float *x, const void *w, int n_tok, int n_in, int n_out, int lo, int hi) { gemv_tokens(y, x, w, n_tok, n_in, n_out, lo, hi, GB_TYPE_F16); }
static void gemv_bf16(float *y, const float *x, const void *w, int n_tok, int n_in, int n_out, int lo, int hi) { gemv_tokens(y, x, w, n_tok, n_in, n_out, lo, hi, GB_TYPE_BF16); }
static void gemm_f32(float *y, const float *x, const void *w, int n_tok, int n_in, int n_out, int lo, int hi) { gemm(y, x, w, n_tok, n_in, n_out, lo, hi, GB_TYPE_F32); }
static void gemm_f16(float *y, const float *x, const void *w, int n_tok, int n_in, int n_out, int lo, int hi) { gemm(y, x, w, n_tok, n_in, n_out, lo, hi, GB_TYPE_F16); }
static void gemm_bf16(float *y, const float *x, const void *w, int n_tok, int n_in, int n_out, int lo, int hi) { gemm(y, x, w, n_tok, n_in, n_out, lo, hi, GB_TYPE_BF16); }

void matmul_rows_avx2(float *y, const float *x, const void *w, enum gb_type wtype,
                      int n_tok, int n_in, int n_out, int o_lo, int o_hi, int per_token) {
    if (n_tok <= 0 || o_lo >= o_hi) return;
    if (n_in <= 0) { /* empty sums; gemm's panel loop would not run at all */
        for (int u = 0; u < n_tok; u++)
            for (int o = o_lo; o < o_hi; o++) y[(size_t)u * n_out + o] = 0.0f;
        return;
    }
    if (per_token || n_tok == 1) {
        switch (wtype) {
        case GB_TYPE_F32: gemv_f32(y, x, w, n_tok, n_in, n_out, o_lo, o_hi); return;
        case GB_TYPE_F16: gemv_f16(y, x, w, n_tok, n_in, n_out, o_lo, o_hi); return;
        default: gemv_bf16(y, x, w, n_tok, n_in, n_out, o_lo, o_hi); return;
        }
    }
    switch (wtype) {
    case GB_TYPE_F32: gemm_f32(y, x, w, n_tok, n_in, n_out, o_lo, o_hi); return;
    case GB_TYPE_F16: gemm_f16(y, x, w, n_tok, n_in, n_out, o_lo, o_hi); return;
    default: gemm_bf16(y, x, w, n_tok, n_in, n_out, o_lo, o_hi); return;
    }
}

/* ---- attention helpers -------------------------------------------------------- */

float dot_f32_avx2(const float *a, const float *b, int n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    __m256 s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float s = hsum8(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

float dot_f32_f16_avx2(const float *a, const uint16_t *b, int n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    __m256 s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load8_w(b, (size_t)i, GB_TYPE_F16), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), load8_w(b, (size_t)i + 8, GB_TYPE_F16), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), load8_w(b, (size_t)i + 16, GB_TYPE_F16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), load8_w(b, (size_t)i + 24, GB_TYPE_F16), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load8_w(b, (size_t)i, GB_TYPE_F16), s0);
    float s = hsum8(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++) s += a[i] * f16_to_f32(b[i]);
    return s;
}

/* The scalar tails use fmaf so every element is rounded once, like the vector body. */
void axpy_f32_avx2(float *y, float a, const float *v, int n) {
    __m256 av = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(v + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] = fmaf(a, v[i], y[i]);
}

void axpy_f16_avx2(float *y, float a, const uint16_t *v, int n) {
    __m256 av = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, load8_w(v, (size_t)i, GB_TYPE_F16), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] = fmaf(a, f16_to_f32(v[i]), y[i]);
}

/* ---- element-wise activations ---------------------------------------------------- */

/* e^x, x clamped to [-87, 88] (the f32 normal range): x = k ln2 + r with |r| <= ln2/2
 * (ln2 split in two so k ln2 is exact enough), e^r by its Taylor series to r^7
 * (truncation < 1e-8 relative), times 2^k built in the exponent bits. */
static ALWAYS_INLINE __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* 0.5 x (1 + tanh(z)) = x / (1 + e^(-2z)): one exp, no cancellation near z = 0. */
static ALWAYS_INLINE __m256 gelu_tanh_mul8(__m256 x, __m256 u) {
    const __m256 k = _mm256_set1_ps(0.7978845608f); /* sqrt(2/pi) */
    __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
    __m256 z = _mm256_mul_ps(k, _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), x3, x));
    __m256 e = exp8(_mm256_mul_ps(_mm256_set1_ps(-2.0f), z));
    return _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

static ALWAYS_INLINE __m256 silu_mul8(__m256 x, __m256 u) {
    __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
    return _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

/* tanh(t): odd Taylor polynomial to t^9 where |t| < 0.125 (error < 1e-11 relative), else
 * sign(t) (1 - e)/(1 + e) with e = e^(-2|t|). */
static ALWAYS_INLINE __m256 tanh8(__m256 t) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 a = _mm256_andnot_ps(sign, t);
    __m256 e = exp8(_mm256_mul_ps(_mm256_set1_ps(-2.0f), a));
    __m256 big = _mm256_div_ps(_mm256_sub_ps(_mm256_set1_ps(1.0f), e), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
    big = _mm256_or_ps(big, _mm256_and_ps(sign, t));
    __m256 t2 = _mm256_mul_ps(t, t);
    __m256 p = _mm256_set1_ps(62.0f / 2835.0f);
    p = _mm256_fmadd_ps(p, t2, _mm256_set1_ps(-17.0f / 315.0f));
    p = _mm256_fmadd_ps(p, t2, _mm256_set1_ps(2.0f / 15.0f));
    p = _mm256_fmadd_ps(p, t2, _mm256_set1_ps(-1.0f / 3.0f));
    __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(p, t2), t, t);
    return _mm256_blendv_ps(big, small, _mm256_cmp_ps(a, _mm256_set1_ps(0.125f), _CMP_LT_OQ));
}

/* y[i] = f8(g, u) over n elements, 8 at a time; the last n % 8 through the same vector
 * code from a padded copy, so an element's value never depends on whether it fell in the
 * body or the tail (or where a thread split put it). */
static ALWAYS_INLINE void map2(float *y, const float *g, const float *u, long n, __m256 (*f8)(__m256, __m256)) {
    long i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, f8(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
    if (i < n) {
        float gb[8] = {0}, ub[8] = {0}, yb[8];
        for (long j = i; j < n; j++) { gb[j - i] = g[j]; ub[j - i] = u[j]; }
        _mm256_storeu_ps(yb, f8(_mm256_loadu_ps(gb), _mm256_loadu_ps(ub)));
        for (long j = i; j < n; j++) y[j] = yb[j - i];
    }
}

void gelu_tanh_mul_avx2(float *y, const float *g, const float *u, long n) { map2(y, g, u, n, gelu_tanh_mul8); }

double sumsq_f32_avx2(const float *x, int n) {
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256d a = _mm256_cvtps_pd(_mm256_castps256_ps128(v)), b = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
        s0 = _mm256_fmadd_pd(a, a, s0); /* exact: a float's square fits a double */
        s1 = _mm256_fmadd_pd(b, b, s1);
    }
    __m256d s = _mm256_add_pd(s0, s1);
    __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    double ss = _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
    for (; i < n; i++) ss += (double)x[i] * x[i];
    return ss;
}

/* vcvtps2ph rounds to nearest even as f32_to_f16 does, overflow to inf and f16 subnormals
 * included; only NaNs differ (it keeps payload bits), so those go through f32_to_f16. */
void f32_to_f16_row_avx2(uint16_t *y, const float *x, long n) {
    long i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
        if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)))
            for (long j = i; j < i + 8; j++) y[j] = f32_to_f16(x[j]);
    }
    for (; i < n; i++) y[i] = f32_to_f16(x[i]);
}

void silu_mul_avx2(float *y, const float *g, const float *u, long n) { map2(y, g, u, n, silu_mul8); }

void softcap_avx2(float *x, float cap, long n) {
    const __m256 c = _mm256_set1_ps(cap);
    long i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_mul_ps(c, tanh8(_mm256_div_ps(_mm256_loadu_ps(x + i), c))));
    if (i < n) {
        float b[8] = {0};
        for (long j = i; j < n; j++) b[j - i] = x[j];
        _mm256_storeu_ps(b, _mm256_mul_ps(c, tanh8(_mm256_div_ps(_mm256_loadu_ps(b), c))));
        for (long j = i; j < n; j++) x[j] = b[j - i];
    }
}
