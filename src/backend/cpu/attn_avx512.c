/* Causal attention over an f16 KV cache with AVX-512 (head_dim a multiple of 16, at
 * most ATTN512_MAX_HD): the queries of up to ATTN512_TQ consecutive tokens times the
 * query heads sharing one kv head are done together, so each key and value row is
 * loaded and converted from f16 once for all of them (op_attention's scalar-per-query
 * loop converted it once per query head and token).
 *
 * Keys go in absolute blocks of 64 positions ([64k, 64k + 64)) with an online softmax
 * per query: block scores, new running max m, the output and the sum rescaled by
 * exp(m_old - m), then out += p v. A key outside a query's range gets p = 0 exactly,
 * which adds nothing, and a block with none of its keys is skipped, so each query's
 * arithmetic is the same whichever tokens it is grouped with (prefill or decode) and
 * whatever the thread split. */
#include "backend/cpu/attn_avx512.h"

#include <float.h>
#include <immintrin.h>
#include <math.h>

enum { KB = 64 }; /* keys per block */
#ifndef ATTN_PF_J
#define ATTN_PF_J 8
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

/* vcvtps2ph rounds to nearest even as f32_to_f16 does, overflow to inf and f16
 * subnormals included; only NaNs differ (it keeps payload bits; f32_to_f16 gives sign |
 * 0x7e00), so those lanes are set. Checked against f32_to_f16 on all 2^32 inputs. The
 * scalar loop was 1.2% of MLX 4-bit decode (tg128, 1 thread). */
void kv_to_f16_avx512(uint16_t *dst, const float *x, size_t n) {
    size_t i = 0;
    for (; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
        __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        __m256i sign = _mm256_and_si256(_mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(v), 16)),
                                        _mm256_set1_epi16((short)0x8000));
        h = _mm256_mask_mov_epi16(h, nan, _mm256_or_si256(sign, _mm256_set1_epi16(0x7e00)));
        _mm256_mask_storeu_epi16(dst + i, m, h);
    }
}

static inline __m512 load_h16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }

/* o[i] += sum_j sc[i][j - jb] v_j for the nq queries, QB at a time (rows past nq have
 * weights 0 and write nowhere); per query the same FMAs in the same order for any QB. */
static inline __attribute__((always_inline)) void pv_block(int QB, int nq, float *const *o, float (*sc)[KB],
                                                           const uint16_t *vb, int kv_width, int jb, int je, int nc,
                                                           const float *dummy) {
    for (int i0 = 0; i0 < nq; i0 += QB) {
        for (int c = 0; c < nc; c++) {
            __m512 acc[8];
#pragma GCC unroll 8
            for (int k = 0; k < QB; k++) acc[k] = _mm512_loadu_ps(i0 + k < nq ? o[i0 + k] + 16 * c : dummy);
            for (int j = jb; j < je; j++) {
                __m512 v = load_h16(vb + (size_t)j * kv_width + 16 * c);
#pragma GCC unroll 8
                for (int k = 0; k < QB; k++) acc[k] = _mm512_fmadd_ps(_mm512_set1_ps(sc[i0 + k][j - jb]), v, acc[k]);
            }
#pragma GCC unroll 8
            for (int k = 0; k < QB; k++)
                if (i0 + k < nq) _mm512_storeu_ps(o[i0 + k] + 16 * c, acc[k]);
        }
    }
}

void attn_item_f16_avx512(const struct attn_args *a, int t0, int nt, int kvh) {
    const int group = a->n_head / a->n_head_kv, hd = a->head_dim, nc = hd / 16;
    const int kv_width = a->n_head_kv * hd, nq = nt * group;
    const uint16_t *kc = a->k_cache, *vc = a->v_cache;
    const float *q[ATTN512_MAX_Q];
    float *o[ATTN512_MAX_Q], m[ATTN512_MAX_Q], l[ATTN512_MAX_Q];
    int jlo[ATTN512_MAX_Q], jhi[ATTN512_MAX_Q];
    float sc[ATTN512_MAX_Q][KB], kf[ATTN512_MAX_HD], dummy[16];
    int lo = 1 << 30, hi = -1, nq8 = (nq + 7) / 8 * 8;
    for (int d = 0; d < 16; d++) dummy[d] = 0.0f;
    for (int i = 0; i < nq; i++) {
        int t = t0 + i / group, h = kvh * group + i % group, pos = a->pos0 + t;
        q[i] = a->q + ((size_t)t * a->n_head + h) * hd;
        o[i] = a->out + ((size_t)t * a->n_head + h) * hd;
        jhi[i] = pos;
        jlo[i] = (a->window > 0 && pos - a->window + 1 > 0) ? pos - a->window + 1 : 0;
        m[i] = -INFINITY;
        l[i] = 0.0f;
        for (int d = 0; d < hd; d++) o[i][d] = 0.0f;
        if (jlo[i] < lo) lo = jlo[i];
        if (jhi[i] > hi) hi = jhi[i];
    }
    for (int jb = lo / KB * KB; jb <= hi; jb += KB) {
        int je = jb + KB <= hi + 1 ? jb + KB : hi + 1;
        /* scores (-inf outside a query's range) */
        for (int j = jb; j < je; j++) {
            const uint16_t *k = kc + (size_t)j * kv_width + (size_t)kvh * hd;
            /* The cache rows come from DRAM in decode (the weights streamed since the last
             * layer evicted them), a latency per row: fetch the key row ATTN_PF_J ahead and
             * this value row, whose p v pass comes after the block (tg128, 1 thread: attention
             * 7.4% of the decode profile, all on the two f16 loads, before this) */
            if (j + ATTN_PF_J <= hi)
                for (int c = 0; c < hd; c += 32) _mm_prefetch((const char *)(k + (size_t)ATTN_PF_J * kv_width + c), _MM_HINT_T0);
            for (int c = 0; c < hd; c += 32)
                _mm_prefetch((const char *)(vc + (size_t)j * kv_width + (size_t)kvh * hd + c), _MM_HINT_T0);
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
        /* online softmax: rescale what came before, turn scores into weights */
        for (int i = 0; i < nq8; i++) {
            if (i >= nq || je - 1 < jlo[i] || jb > jhi[i]) { /* no key here: weights 0 (add nothing) */
                for (int j = 0; j < KB; j++) sc[i][j] = 0.0f;
                continue;
            }
            float bm = -INFINITY;
            for (int j = 0; j < je - jb; j++) bm = sc[i][j] > bm ? sc[i][j] : bm;
            float mn = bm > m[i] ? bm : m[i];
            float corr = expf(m[i] - mn); /* 0 on the first block (m = -inf) */
            if (corr != 1.0f) {
                l[i] *= corr;
                __m512 cv = _mm512_set1_ps(corr);
                for (int c = 0; c < nc; c++) _mm512_storeu_ps(o[i] + 16 * c, _mm512_mul_ps(_mm512_loadu_ps(o[i] + 16 * c), cv));
            }
            __m512 sv = _mm512_setzero_ps(), mv = _mm512_set1_ps(mn);
            for (int j = 0; j < je - jb; j += 16) {
                __mmask16 in = je - jb - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (je - jb - j)) - 1u);
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
        /* out += p v: 16 dims of QB queries in registers, each value row converted once */
        const uint16_t *vb = vc + (size_t)kvh * hd;
        if (nq <= 2) pv_block(2, nq, o, sc, vb, kv_width, jb, je, nc, dummy);
        else if (nq <= 4) pv_block(4, nq, o, sc, vb, kv_width, jb, je, nc, dummy);
        else pv_block(8, nq, o, sc, vb, kv_width, jb, je, nc, dummy);
    }
    for (int i = 0; i < nq; i++) {
        __m512 inv = _mm512_set1_ps(1.0f / l[i]);
        for (int c = 0; c < nc; c++) _mm512_storeu_ps(o[i] + 16 * c, _mm512_mul_ps(_mm512_loadu_ps(o[i] + 16 * c), inv));
    }
}
