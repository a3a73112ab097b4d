/* Causal attention over an f16 KV cache with AVX-512 (head_dim a multiple of 16, at
 * most ATTN512_MAX_HD): the queries of up to ATTN512_TQ consecutive tokens times the
 * query heads sharing one kv head are done together, so each key and value row is
 * loaded and converted from f16 once for all of them (op_attention's scalar-per-query
 * loop converted it once per query head and token).
 *
 * Keys go in absolute blocks of 64 positions ([64k, 64k + 64)) with an online softmax
 * per query: block scores, new running max m, the output and the sum rescaled by
 * exp(m_old - m), then out += p v. A key outside a query's range gets p = 0 exactly,
 * which adds nothing, and a block with none of its keys is skipped. Scores: with few
 * queries per item (decode) one dot product and horizontal sum per key and query
 * (scores_rows); with KT_MIN_Q or more (prefill) the block's keys are transposed once and
 * each query's 16-key scores are one FMA chain over the head dims (scores_kt: attention
 * was 26% of a Qwen3-0.6B Q4_K_M pp512 with scores_rows alone). The two sum in different
 * orders, so a prompt and the same tokens fed one at a time agree to rounding, not to
 * the bit; for a given item every query's arithmetic is fixed, so the results never
 * depend on the thread split. */
#include "backend/cpu/attn_avx512.h"

#include "backend/cpu/simd512.h"

#include <float.h>
#include <immintrin.h>
#include <math.h>

enum {
    KB = 64,      /* keys per block */
    KT_MIN_Q = 8, /* queries per item from which the keys are transposed (scores_kt) */
};
#define UNROLL _Pragma("GCC unroll 8")
#ifndef ATTN_PF_J
#define ATTN_PF_J 8 /* key rows prefetched ahead in decode (scores_rows) */
#endif

/* exp(x) for x <= 0 (and finite): 2^(x log2 e) = 2^n 2^f, |f| <= 1/2, 2^f by its
 * degree-6 Taylor series (relative error ~1e-7), 2^n by vscalefps (0 below ~-104). */
static inline __m512 exp_neg(__m512 x) {
    __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504f));
    __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(t, n);
    __m512 p = _mm512_set1_ps(1.5403530e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504109e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022651e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

static inline __m512 load_h16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }

/* o[i] += sum_j sc[i][j - jb] v_j over the keys [jb, je) for the nq queries: tiles of
 * PV_R queries x C chunks of 16 dims held in registers, so each key's value chunks
 * (converted from f16 once per tile) and weights (one broadcast per query) feed PV_R x C
 * FMAs; per query and dim the same FMAs in the same order (over j) for any tile. */
enum { PV_R = 4, PV_C = 4 };

static inline __attribute__((always_inline)) void pv_tile(int R, int C, float *const *o, float (*sc)[KB],
                                                          const uint16_t *const *vrow, int c0, int jb, int je) {
    __m512 acc[PV_R][PV_C];
    UNROLL for (int r = 0; r < R; r++)
        UNROLL for (int c = 0; c < C; c++) acc[r][c] = _mm512_loadu_ps(o[r] + 16 * c);
    for (int j = jb; j < je; j++) {
        __m512 v[PV_C];
        const uint16_t *vb = vrow[j - jb] + 16 * c0;
        UNROLL for (int c = 0; c < C; c++) v[c] = load_h16(vb + 16 * c);
        UNROLL for (int r = 0; r < R; r++) {
            __m512 p = _mm512_set1_ps(sc[r][j - jb]);
            UNROLL for (int c = 0; c < C; c++) acc[r][c] = _mm512_fmadd_ps(p, v[c], acc[r][c]);
        }
    }
    UNROLL for (int r = 0; r < R; r++)
        UNROLL for (int c = 0; c < C; c++) _mm512_storeu_ps(o[r] + 16 * c, acc[r][c]);
}

/* All nq queries over C chunks from chunk c0 (o[i] already there), PV_R at a time. */
static inline __attribute__((always_inline)) void pv_rows(int C, int nq, float *const *o, float (*sc)[KB],
                                                          const uint16_t *const *vrow, int c0, int jb, int je) {
    for (int i0 = 0; i0 < nq; i0 += PV_R) {
        switch (nq - i0 < PV_R ? nq - i0 : PV_R) {
        case 4: pv_tile(4, C, o + i0, sc + i0, vrow, c0, jb, je); break;
        case 3: pv_tile(3, C, o + i0, sc + i0, vrow, c0, jb, je); break;
        case 2: pv_tile(2, C, o + i0, sc + i0, vrow, c0, jb, je); break;
        default: pv_tile(1, C, o + i0, sc + i0, vrow, c0, jb, je); break;
        }
    }
}

/* vrow[j - jb]: the value row (this kv head's) of key j. */
static void pv_block(int nq, float *const *o, float (*sc)[KB], const uint16_t *const *vrow, int jb, int je, int nc) {
    for (int c0 = 0; c0 < nc;) {
        float *oc[ATTN512_MAX_Q];
        for (int i = 0; i < nq; i++) oc[i] = o[i] + 16 * c0;
        if (nc - c0 >= PV_C) {
            pv_rows(PV_C, nq, oc, sc, vrow, c0, jb, je);
            c0 += PV_C;
        } else { /* head_dim not a multiple of 64: the rest one chunk at a time */
            pv_rows(1, nq, oc, sc, vrow, c0, jb, je);
            c0++;
        }
    }
}

/* Scores of keys [jb, je) for the nq queries, one key row at a time: each row converted
 * once, then a dot product and a horizontal sum per query (decode: few queries). */
static void scores_rows(const struct attn_args *a, const struct gb_seg *s, int kvh, const float *const *q, int nq,
                        const int *jlo, const int *jhi, int jb, int je, const uint16_t *const *krow,
                        const uint16_t *const *vrow, float (*sc)[KB]) {
    const int hd = a->head_dim, nc = hd / 16;
    float kf[ATTN512_MAX_HD];
    const int n_kv = s->pos0 + s->n_rows; /* rows up to the segment's last are stored */
    for (int j = jb; j < je; j++) {
        const uint16_t *k = krow[j - jb];
        /* The cache rows come from DRAM in decode (the weights streamed since the last
         * layer evicted them), a latency per row: fetch the key row ATTN_PF_J ahead and
         * this value row, whose p v pass comes after the block (tg128, 1 thread: attention
         * 7.4% of the decode profile, all on the two f16 loads, before this) */
        if (j + ATTN_PF_J < n_kv) {
            const uint16_t *kn = (const uint16_t *)a->k_cache +
                                 (size_t)kv_pool_row(s->blocks, j + ATTN_PF_J) * a->kv_stride + (size_t)kvh * hd;
            for (int c = 0; c < hd; c += 32) _mm_prefetch((const char *)(kn + c), _MM_HINT_T0);
        }
        for (int c = 0; c < hd; c += 32) _mm_prefetch((const char *)(vrow[j - jb] + c), _MM_HINT_T0);
        for (int c = 0; c < nc; c++) _mm512_storeu_ps(kf + 16 * c, load_h16(k + 16 * c)); /* once for all */
        for (int i = 0; i < nq; i++) {
            if (j < jlo[i] || j > jhi[i]) { sc[i][j - jb] = -INFINITY; continue; }
            __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
            int c = 0;
            for (; c + 2 <= nc; c += 2) {
                s0 = _mm512_fmadd_ps(_mm512_loadu_ps(q[i] + 16 * c), _mm512_loadu_ps(kf + 16 * c), s0);
                s1 = _mm512_fmadd_ps(_mm512_loadu_ps(q[i] + 16 * c + 16), _mm512_loadu_ps(kf + 16 * c + 16), s1);
            }
            if (c < nc) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(q[i] + 16 * c), _mm512_loadu_ps(kf + 16 * c), s0);
            sc[i][j - jb] = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1)) * a->scale;
        }
    }
}

/* Scores of R queries against the block's transposed keys kt: R x 4 groups of 16 keys in
 * registers, each kt row loaded once for the R queries (per query the same FMA chain over d
 * for any R). Keys outside a query's range get -inf. */
enum { SQ = 4 };
static inline __attribute__((always_inline)) void scores_tile(int R, const struct attn_args *a, const float *const *q,
                                                              const int *jlo, const int *jhi, int jb,
                                                              float (*sc)[KB], float (*kt)[KB]) {
    const __m512i iota = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512 scale = _mm512_set1_ps(a->scale), ninf = _mm512_set1_ps(-INFINITY);
    __m512 acc[SQ][KB / 16];
    UNROLL for (int u = 0; u < R; u++) UNROLL for (int g = 0; g < KB / 16; g++) acc[u][g] = _mm512_setzero_ps();
    for (int d = 0; d < a->head_dim; d++) {
        __m512 k[KB / 16];
        UNROLL for (int g = 0; g < KB / 16; g++) {
            k[g] = _mm512_load_ps(kt[d] + 16 * g);
            __asm__("" : "+v"(k[g])); /* one load for the R queries, not one per FMA */
        }
        UNROLL for (int u = 0; u < R; u++) {
            __m512 b = _mm512_set1_ps(q[u][d]);
            UNROLL for (int g = 0; g < KB / 16; g++) acc[u][g] = _mm512_fmadd_ps(b, k[g], acc[u][g]);
        }
    }
    UNROLL for (int u = 0; u < R; u++) {
        __m512i lo = _mm512_set1_epi32(jlo[u]), hi = _mm512_set1_epi32(jhi[u]);
        UNROLL for (int g = 0; g < KB / 16; g++) {
            __m512i jv = _mm512_add_epi32(_mm512_set1_epi32(jb + 16 * g), iota);
            __mmask16 in = _mm512_cmp_epi32_mask(jv, lo, _MM_CMPINT_NLT) & _mm512_cmp_epi32_mask(jv, hi, _MM_CMPINT_LE);
            _mm512_storeu_ps(sc[u] + 16 * g, _mm512_mask_blend_ps(in, ninf, _mm512_mul_ps(acc[u][g], scale)));
        }
    }
}

/* The same with the block's keys transposed once (kt[d][j - jb], 16 x 16 at a time), so
 * 16 keys' scores are one FMA chain over d per query with no horizontal sums, SQ queries
 * at a time (scores_tile). Keys past je are zeros and masked. */
static void scores_kt(const struct attn_args *a, const float *const *q, int nq, const int *jlo, const int *jhi,
                      int jb, int je, const uint16_t *const *krow, float (*sc)[KB], float (*kt)[KB]) {
    const int hd = a->head_dim, nc = hd / 16;
    for (int g = 0; g < KB / 16; g++)
        for (int c = 0; c < nc; c++) {
            __m512i v[16];
            for (int r = 0; r < 16; r++) {
                int j = jb + 16 * g + r;
                v[r] = j < je ? _mm512_castps_si512(load_h16(krow[j - jb] + 16 * c)) : _mm512_setzero_si512();
            }
            transpose16_epi32(v);
            for (int d = 0; d < 16; d++) _mm512_store_ps(kt[16 * c + d] + 16 * g, _mm512_castsi512_ps(v[d]));
        }
    for (int i0 = 0; i0 < nq; i0 += SQ) {
        switch (nq - i0 < SQ ? nq - i0 : SQ) {
        case 4: scores_tile(4, a, q + i0, jlo + i0, jhi + i0, jb, sc + i0, kt); break;
        case 3: scores_tile(3, a, q + i0, jlo + i0, jhi + i0, jb, sc + i0, kt); break;
        case 2: scores_tile(2, a, q + i0, jlo + i0, jhi + i0, jb, sc + i0, kt); break;
        default: scores_tile(1, a, q + i0, jlo + i0, jhi + i0, jb, sc + i0, kt); break;
        }
    }
}

void attn_item_f16_avx512(const struct attn_args *a, const struct gb_seg *s, int t0, int nt, int kvh) {
    const int group = a->n_head / a->n_head_kv, hd = a->head_dim, nc = hd / 16;
    const int nq = nt * group;
    const uint16_t *kc = (const uint16_t *)a->k_cache + (size_t)kvh * hd, *vc = (const uint16_t *)a->v_cache + (size_t)kvh * hd;
    const uint16_t *krow[KB], *vrow[KB]; /* this kv head's rows of the block's keys (paged: any pool rows) */
    const float *q[ATTN512_MAX_Q];
    float *o[ATTN512_MAX_Q], m[ATTN512_MAX_Q], l[ATTN512_MAX_Q];
    int jlo[ATTN512_MAX_Q], jhi[ATTN512_MAX_Q];
    float sc[ATTN512_MAX_Q][KB];
    _Alignas(64) float kt[ATTN512_MAX_HD][KB];
    int lo = 1 << 30, hi = -1;
    for (int i = 0; i < nq; i++) {
        int t = t0 + i / group, h = kvh * group + i % group, pos = s->pos0 + t, row = s->row0 + t;
        q[i] = a->q + ((size_t)row * a->n_head + h) * hd;
        o[i] = a->out + ((size_t)row * a->n_head + h) * hd;
        attn_key_range(a, s, pos, &jlo[i], &jhi[i]);
        m[i] = -INFINITY;
        l[i] = 0.0f;
        for (int c = 0; c < nc; c++) _mm512_storeu_ps(o[i] + 16 * c, _mm512_setzero_ps());
        if (jlo[i] < lo) lo = jlo[i];
        if (jhi[i] > hi) hi = jhi[i];
    }
    for (int jb = lo / KB * KB; jb <= hi; jb += KB) {
        int je = jb + KB <= hi + 1 ? jb + KB : hi + 1;
        for (int j = jb; j < je; j++) {
            size_t off = (size_t)kv_pool_row(s->blocks, j) * (size_t)a->kv_stride;
            krow[j - jb] = kc + off;
            vrow[j - jb] = vc + off;
        }
        /* scores (-inf outside a query's range) */
        if (nq >= KT_MIN_Q) scores_kt(a, q, nq, jlo, jhi, jb, je, krow, sc, kt);
        else scores_rows(a, s, kvh, q, nq, jlo, jhi, jb, je, krow, vrow, sc);
        /* online softmax: rescale what came before, turn scores into weights */
        for (int i = 0; i < nq; i++) {
            if (je - 1 < jlo[i] || jb > jhi[i]) { /* no key here: weights 0 (add nothing) */
                for (int j = 0; j < KB; j++) sc[i][j] = 0.0f;
                continue;
            }
            __m512 bmv = _mm512_set1_ps(-INFINITY);
            for (int j = 0; j < je - jb; j += 16) {
                __mmask16 in = lanes16(je - jb - j);
                bmv = _mm512_mask_max_ps(bmv, in, bmv, _mm512_loadu_ps(sc[i] + j));
            }
            float bm = _mm512_reduce_max_ps(bmv);
            float mn = bm > m[i] ? bm : m[i];
            float corr = expf(m[i] - mn); /* 0 on the first block (m = -inf) */
            if (corr != 1.0f) {
                l[i] *= corr;
                __m512 cv = _mm512_set1_ps(corr);
                for (int c = 0; c < nc; c++) _mm512_storeu_ps(o[i] + 16 * c, _mm512_mul_ps(_mm512_loadu_ps(o[i] + 16 * c), cv));
            }
            __m512 sv = _mm512_setzero_ps(), mv = _mm512_set1_ps(mn);
            for (int j = 0; j < je - jb; j += 16) {
                __mmask16 in = lanes16(je - jb - j);
                __m512 x = _mm512_maskz_loadu_ps(in, sc[i] + j);
                /* -inf scores (keys outside the range) and lanes past the block get 0 */
                __mmask16 ok = in & _mm512_cmp_ps_mask(x, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ);
                __m512 p = _mm512_maskz_mov_ps(ok, exp_neg(_mm512_sub_ps(x, mv)));
                _mm512_mask_storeu_ps(sc[i] + j, in, p);
                sv = _mm512_add_ps(sv, p);
            }
            l[i] += _mm512_reduce_add_ps(sv);
            m[i] = mn;
        }
        /* out += p v */
        pv_block(nq, o, sc, vrow, jb, je, nc);
    }
    for (int i = 0; i < nq; i++) {
        __m512 inv = _mm512_set1_ps(1.0f / l[i]);
        for (int c = 0; c < nc; c++) _mm512_storeu_ps(o[i] + 16 * c, _mm512_mul_ps(_mm512_loadu_ps(o[i] + 16 * c), inv));
    }
}
