/* Ops of the recurrent (linear-attention) layers: the causal depthwise conv1d with its
 * rolling state, per-head L2 norm, gated RMSNorm, sigmoid gates, and the gated delta
 * rule in its recurrent (decode) and chunked (prefill) forms. f32 throughout, in the
 * order of operations transformers uses, so results track its reference closely. */
#include "backend/cpu/kernels.h"
#include "backend/cpu/parallel.h"
#include "backend/ops.h"
#include "base/status.h"

#include <math.h>
#include <string.h>

static inline float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float siluf(float x) { return x / (1.0f + expf(-x)); }

/* ---- element-wise ---- */

struct gate_args {
    float *y;
    const float *x, *g;
};

static void sigmoid_mul_range(void *p, long lo, long hi) {
    const struct gate_args *a = p;
    for (long i = lo; i < hi; i++) a->y[i] = a->x[i] * sigmoidf(a->g[i]);
}

void op_sigmoid_mul(struct backend *be, float *y, const float *x, const float *g, long n) {
    struct gate_args a = {.y = y, .x = x, .g = g};
    parallel_range(be, n, 8, sigmoid_mul_range, &a);
}

/* ---- causal depthwise conv1d ---- */

struct conv_args {
    float *y, *state;
    const float *x, *w;
    int n_tok, C, K, silu;
};

/* Input row i of state ++ x, channel c. */
static inline float conv_in(const struct conv_args *a, int i, int c) {
    return i < a->K - 1 ? a->state[(size_t)i * a->C + c] : a->x[(size_t)(i - (a->K - 1)) * a->C + c];
}

static void conv_channels(void *p, long lo, long hi) {
    const struct conv_args *a = p;
    const int K = a->K;
    for (int t = 0; t < a->n_tok; t++)
        for (long c = lo; c < hi; c++) {
            const float *w = a->w + (size_t)c * K;
            float acc = 0.0f;
            for (int j = 0; j < K; j++) acc += w[j] * conv_in(a, t + j, (int)c);
            a->y[(size_t)t * a->C + c] = a->silu ? siluf(acc) : acc;
        }
    /* the new state: the last K-1 inputs; row r reads input n_tok + r > r, not yet overwritten */
    for (int r = 0; r < K - 1; r++)
        for (long c = lo; c < hi; c++) a->state[(size_t)r * a->C + c] = conv_in(a, a->n_tok + r, (int)c);
}

void op_conv1d_causal(struct backend *be, float *y, const float *x, float *state, const float *w,
                      int n_tok, int C, int K, int silu) {
    GB_ASSERT(K >= 1 && y != x);
    struct conv_args a = {.y = y, .state = state, .x = x, .w = w, .n_tok = n_tok, .C = C, .K = K, .silu = silu};
    parallel_range(be, C, (long)n_tok * K, conv_channels, &a);
}

/* ---- norms ---- */

struct l2_args {
    float *x;
    int n_heads, d, stride;
    float eps, scale;
};

static void l2norm_range(void *p, long lo, long hi) {
    const struct l2_args *a = p;
    for (long item = lo; item < hi; item++) {
        float *v = a->x + (size_t)(item / a->n_heads) * a->stride + (size_t)(item % a->n_heads) * a->d;
        float ss = 0.0f;
        for (int i = 0; i < a->d; i++) ss += v[i] * v[i];
        const float inv = 1.0f / sqrtf(ss + a->eps);
        for (int i = 0; i < a->d; i++) v[i] = v[i] * inv * a->scale;
    }
}

void op_l2norm_heads(struct backend *be, float *x, int n_tok, int n_heads, int d, int stride, float eps,
                     float scale) {
    struct l2_args a = {.x = x, .n_heads = n_heads, .d = d, .stride = stride, .eps = eps, .scale = scale};
    parallel_range(be, (long)n_tok * n_heads, d, l2norm_range, &a);
}

struct gnorm_args {
    float *y;
    const float *x, *z, *w;
    float eps;
    int n;
};

static void rmsnorm_gated_rows(void *p, long lo, long hi) {
    const struct gnorm_args *a = p;
    for (long r = lo; r < hi; r++) {
        const float *x = a->x + (size_t)r * a->n, *z = a->z + (size_t)r * a->n;
        float *y = a->y + (size_t)r * a->n;
        double ss = 0.0;
        for (int i = 0; i < a->n; i++) ss += (double)x[i] * x[i];
        const float inv = 1.0f / sqrtf((float)(ss / a->n) + a->eps);
        for (int i = 0; i < a->n; i++) y[i] = a->w[i] * (x[i] * inv) * siluf(z[i]);
    }
}

void op_rmsnorm_gated(struct backend *be, float *y, const float *x, const float *z, const float *w, float eps,
                      int n_rows, int n) {
    struct gnorm_args a = {.y = y, .x = x, .z = z, .w = w, .eps = eps, .n = n};
    parallel_range(be, n_rows, n, rmsnorm_gated_rows, &a);
}

/* ---- gated delta rule ---- */

size_t delta_scratch_floats(int dk, int dv) {
    return (size_t)DELTA_CHUNK * DELTA_CHUNK + (size_t)DELTA_CHUNK * ((size_t)dk + dv + 1);
}

static inline int key_head(const struct delta_args *a, int h) { return a->v_tiled ? h % a->nk : h / (a->nv / a->nk); }

static inline const float *dq(const struct delta_args *a, int t, int kh) {
    return a->x + (size_t)t * a->qk_stride + a->q_off + (size_t)kh * a->dk;
}
static inline const float *dk_(const struct delta_args *a, int t, int kh) {
    return a->x + (size_t)t * a->qk_stride + a->k_off + (size_t)kh * a->dk;
}
static inline const float *dv_(const struct delta_args *a, int t, int h) {
    return a->x + (size_t)t * a->v_stride + a->v_off + (size_t)h * a->dv;
}

/* One token at a time: two passes over S per token. */
static void delta_head_recurrent(const struct delta_args *a, int h, float *S, float *tmp) {
    const int dk = a->dk, dv = a->dv, kh = key_head(a, h);
    for (int t = 0; t < a->n_tok; t++) {
        const float *q = dq(a, t, kh), *k = dk_(a, t, kh), *v = dv_(a, t, h);
        const float decay = expf(a->g[(size_t)t * a->nv + h]), beta = a->beta[(size_t)t * a->nv + h];
        float *out = a->out + ((size_t)t * a->nv + h) * dv;
        /* S *= decay; tmp = S^T k */
        memset(tmp, 0, (size_t)dv * sizeof *tmp);
        for (int i = 0; i < dk; i++) {
            float *row = S + (size_t)i * dv;
            for (int j = 0; j < dv; j++) row[j] *= decay;
            axpy_f32(tmp, k[i], row, dv);
        }
        /* tmp = beta (v - S^T k) */
        for (int j = 0; j < dv; j++) tmp[j] = (v[j] - tmp[j]) * beta;
        /* S += k tmp^T; out = S^T q */
        memset(out, 0, (size_t)dv * sizeof *out);
        for (int i = 0; i < dk; i++) {
            float *row = S + (size_t)i * dv;
            axpy_f32(row, k[i], tmp, dv);
            axpy_f32(out, q[i], row, dv);
        }
    }
}

/* Chunks of L <= DELTA_CHUNK tokens: within a chunk the L rank-one updates become a
 * unit lower-triangular solve (the UT transform), then the chunk reads the state once
 * and writes it once. cum: cumulative log decay within the chunk. */
static void delta_head_chunked(const struct delta_args *a, int h, float *S, float *scratch) {
    const int dk = a->dk, dv = a->dv, kh = key_head(a, h);
    float *A = scratch;                                    /* [C][C], strictly lower used */
    float *U = A + (size_t)DELTA_CHUNK * DELTA_CHUNK;      /* [C][dv]: new values */
    float *W = U + (size_t)DELTA_CHUNK * dv;               /* [C][dk]: decayed beta keys */
    float *cum = W + (size_t)DELTA_CHUNK * dk;             /* [C] */
    for (int t0 = 0; t0 < a->n_tok; t0 += DELTA_CHUNK) {
        const int L = a->n_tok - t0 < DELTA_CHUNK ? a->n_tok - t0 : DELTA_CHUNK;
        float c = 0.0f;
        for (int i = 0; i < L; i++) cum[i] = c += a->g[(size_t)(t0 + i) * a->nv + h];
        /* A[i][j] = beta_i (k_i . k_j) exp(cum_i - cum_j), j < i; solve (I + A) U = beta v and
         * (I + A) W = beta k exp(cum) by forward substitution */
        for (int i = 0; i < L; i++) {
            const float *ki = dk_(a, t0 + i, kh), *vi = dv_(a, t0 + i, h);
            const float bi = a->beta[(size_t)(t0 + i) * a->nv + h];
            float *Ui = U + (size_t)i * dv, *Wi = W + (size_t)i * dk;
            const float ei = expf(cum[i]);
            for (int j = 0; j < dv; j++) Ui[j] = vi[j] * bi;
            for (int j = 0; j < dk; j++) Wi[j] = ki[j] * bi * ei;
            for (int j = 0; j < i; j++) {
                float aij = bi * dot_f32(ki, dk_(a, t0 + j, kh), dk) * expf(cum[i] - cum[j]);
                A[(size_t)i * DELTA_CHUNK + j] = aij;
                axpy_f32(Ui, -aij, U + (size_t)j * dv, dv);
                axpy_f32(Wi, -aij, W + (size_t)j * dk, dk);
            }
        }
        /* v_new_i = U_i - W_i S (into U) */
        for (int i = 0; i < L; i++) {
            float *Ui = U + (size_t)i * dv;
            const float *Wi = W + (size_t)i * dk;
            for (int r = 0; r < dk; r++) axpy_f32(Ui, -Wi[r], S + (size_t)r * dv, dv);
        }
        /* out_i = exp(cum_i) q_i S + sum_{j<=i} (q_i . k_j) exp(cum_i - cum_j) v_new_j */
        for (int i = 0; i < L; i++) {
            const float *qi = dq(a, t0 + i, kh);
            float *out = a->out + ((size_t)(t0 + i) * a->nv + h) * dv;
            const float ei = expf(cum[i]);
            memset(out, 0, (size_t)dv * sizeof *out);
            for (int r = 0; r < dk; r++) axpy_f32(out, qi[r] * ei, S + (size_t)r * dv, dv);
            for (int j = 0; j <= i; j++) {
                float s = dot_f32(qi, dk_(a, t0 + j, kh), dk) * expf(cum[i] - cum[j]);
                axpy_f32(out, s, U + (size_t)j * dv, dv);
            }
        }
        /* S = exp(cum_last) S + sum_j (k_j exp(cum_last - cum_j)) v_new_j^T */
        const float last = cum[L - 1], el = expf(last);
        for (int r = 0; r < dk; r++) {
            float *row = S + (size_t)r * dv;
            for (int j = 0; j < dv; j++) row[j] *= el;
        }
        for (int j = 0; j < L; j++) {
            const float *kj = dk_(a, t0 + j, kh);
            const float e = expf(last - cum[j]);
            for (int r = 0; r < dk; r++) axpy_f32(S + (size_t)r * dv, kj[r] * e, U + (size_t)j * dv, dv);
        }
    }
}

static void delta_worker(void *p, int ith, int nth) {
    const struct delta_args *a = p;
    float *scratch = a->scratch + (size_t)ith * delta_scratch_floats(a->dk, a->dv);
    long lo, hi;
    tp_range(a->nv, ith, nth, &lo, &hi);
    for (long h = lo; h < hi; h++) {
        float *S = a->state + (size_t)h * a->dk * a->dv;
        if (a->chunked) delta_head_chunked(a, (int)h, S, scratch);
        else delta_head_recurrent(a, (int)h, S, scratch);
    }
}

void op_delta_rule(struct backend *be, const struct delta_args *a) {
    GB_ASSERT(a->nk > 0 && a->nv % a->nk == 0);
    if ((long)a->n_tok * a->nv * a->dk * a->dv < (1L << 15) || tp_n_threads(be->tp) == 1)
        delta_worker((void *)a, 0, 1);
    else
        tp_run(be->tp, delta_worker, (void *)a);
}
