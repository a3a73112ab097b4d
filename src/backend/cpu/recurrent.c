/* Ops of the recurrent (linear-attention) layers: the causal depthwise conv1d with its
 * rolling state, per-head L2 norm, gated RMSNorm, sigmoid and product gates, and the gated delta
 * rule in its recurrent (decode) and chunked (prefill) forms. f32 throughout, in the
 * order of operations transformers uses, so results track its reference closely. */
#include "backend/cpu/cpu.h"
#include "backend/cpu/kernels.h"
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

void cpu_sigmoid_mul(struct backend *be, float *y, const float *x, const float *g, long n) {
    struct gate_args a = {.y = y, .x = x, .g = g};
    parallel_range(cpu_of(be), n, 8, sigmoid_mul_range, &a);
}

struct mul_rows_args {
    float *y;
    const float *a, *b, *bias;
    int a_stride, b_stride, n;
};

static void mul_rows_range(void *p, long lo, long hi) {
    const struct mul_rows_args *m = p;
    for (long t = lo; t < hi; t++) {
        const float *a = m->a + (size_t)t * m->a_stride, *b = m->b + (size_t)t * m->b_stride;
        float *y = m->y + (size_t)t * m->n;
        if (m->bias)
            for (int i = 0; i < m->n; i++) y[i] = a[i] * (b[i] + m->bias[i]);
        else
            for (int i = 0; i < m->n; i++) y[i] = a[i] * b[i];
    }
}

void cpu_mul_rows(struct backend *be, float *y, const float *a, int a_stride, const float *b, int b_stride,
                  const float *bias, int n_rows, int n) {
    struct mul_rows_args m = {.y = y, .a = a, .b = b, .bias = bias, .a_stride = a_stride, .b_stride = b_stride,
                              .n = n};
    parallel_range(cpu_of(be), n_rows, n, mul_rows_range, &m);
}

/* ---- causal depthwise conv1d ---- */

struct conv_args {
    float *y, *state;
    const float *x, *w;
    int n_tok, C, K, silu;
};

/* Row i of the input state ++ x. */
static inline const float *conv_row(const struct conv_args *a, int i) {
    return i < a->K - 1 ? a->state + (size_t)i * a->C : a->x + (size_t)(i - (a->K - 1)) * a->C;
}

static void conv_channels(void *p, long lo, long hi) {
    const struct conv_args *a = p;
    const int K = a->K, C = a->C;
    for (int t = 0; t < a->n_tok; t++) {
        float *y = a->y + (size_t)t * C;
        const float *in = conv_row(a, t);
        for (long c = lo; c < hi; c++) y[c] = a->w[c] * in[c];
        for (int j = 1; j < K; j++) {
            const float *wj = a->w + (size_t)j * C;
            in = conv_row(a, t + j);
            for (long c = lo; c < hi; c++) y[c] += wj[c] * in[c];
        }
        if (a->silu)
            for (long c = lo; c < hi; c++) y[c] = siluf(y[c]);
    }
    /* the new state: the last K-1 inputs; row r reads input n_tok + r > r, not yet overwritten */
    for (int r = 0; r < K - 1; r++) {
        const float *in = conv_row(a, a->n_tok + r);
        memmove(a->state + (size_t)r * C + lo, in + lo, (size_t)(hi - lo) * sizeof(float));
    }
}

/* Each segment over its own state slot, its channels split over the pool. */
void cpu_conv1d(struct backend *be, float *y, const float *x, struct gb_state state, const float *w, int C, int K,
                int silu, const struct gb_seg *segs, int n_segs) {
    GB_ASSERT(K >= 1 && y != x);
    for (int i = 0; i < n_segs; i++) {
        const struct gb_seg *sg = &segs[i];
        struct conv_args a = {.y = y + (size_t)sg->row0 * C, .state = state.base + (size_t)sg->state * state.slot_floats,
                              .x = x + (size_t)sg->row0 * C, .w = w, .n_tok = sg->n_rows, .C = C, .K = K,
                              .silu = silu};
        parallel_range(cpu_of(be), C, (long)sg->n_rows * K, conv_channels, &a);
    }
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

void cpu_l2norm_heads(struct backend *be, float *x, int n_rows, int n_heads, int d, int stride, float eps,
                      float scale) {
    struct l2_args a = {.x = x, .n_heads = n_heads, .d = d, .stride = stride, .eps = eps, .scale = scale};
    parallel_range(cpu_of(be), (long)n_rows * n_heads, d, l2norm_range, &a);
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

void cpu_rmsnorm_gated(struct backend *be, float *y, const float *x, const float *z, const float *w, float eps,
                       int n_rows, int n) {
    struct gnorm_args a = {.y = y, .x = x, .z = z, .w = w, .eps = eps, .n = n};
    parallel_range(cpu_of(be), n_rows, n, rmsnorm_gated_rows, &a);
}

/* ---- Gated DeltaNet gates ---- */

static inline float softplusf(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

struct dgate_args {
    float *beta, *g;
    const float *a, *dt_bias;
    int nv;
};

static void dgate_range(void *p, long lo, long hi) {
    const struct dgate_args *d = p;
    for (long i = lo; i < hi; i++) {
        const int h = (int)(i % d->nv);
        d->beta[i] = sigmoidf(d->beta[i]);
        d->g[i] = d->a[h] * softplusf(d->g[i] + d->dt_bias[h]);
    }
}

void cpu_deltanet_gates(struct backend *be, float *beta, float *g, const float *a, const float *dt_bias, int n_rows,
                        int nv) {
    struct dgate_args d = {.beta = beta, .g = g, .a = a, .dt_bias = dt_bias, .nv = nv};
    parallel_range(cpu_of(be), (long)n_rows * nv, 16, dgate_range, &d);
}

/* ---- gated delta rule ---- */

/* The state is kept transposed, St = S^T [dv][dk]: row j holds what value channel j
 * reads from every key channel, so the recurrent step is one pass of dot/axpy over
 * rows and the chunked form is made of f32 matmuls (kernels.h: y = x w^T). */
size_t delta_scratch_floats(int dk, int dv) {
    const size_t L = DELTA_CHUNK;
    return L * L + L * (4 * (size_t)dk + 4 * (size_t)dv + 1) + (size_t)dv * L + (size_t)dk * L + (size_t)dv * dk;
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

/* One token at a time, one pass over St per token: for each value channel j,
 * row = decay * row; kv = row . k; row += beta (v_j - kv) k; out_j = row . q. */
static void delta_head_recurrent(const struct delta_args *a, int r0, int n, int h, float *St) {
    const int dk = a->dk, dv = a->dv, kh = key_head(a, h);
    for (int t = r0; t < r0 + n; t++) {
        const float *q = dq(a, t, kh), *k = dk_(a, t, kh), *v = dv_(a, t, h);
        const float decay = expf(a->g[(size_t)t * a->nv + h]), beta = a->beta[(size_t)t * a->nv + h];
        float *out = a->out + ((size_t)t * a->nv + h) * dv;
        for (int j = 0; j < dv; j++) {
            float *row = St + (size_t)j * dk;
            for (int i = 0; i < dk; i++) row[i] *= decay;
            const float delta = (v[j] - dot_f32(row, k, dk)) * beta;
            axpy_f32(row, delta, k, dk);
            out[j] = dot_f32(row, q, dk);
        }
    }
}

static void transpose(float *dst, const float *src, int rows, int cols) { /* dst [cols][rows] */
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) dst[(size_t)c * rows + r] = src[(size_t)r * cols + c];
}

/* Chunks of L <= DELTA_CHUNK tokens: within a chunk the L rank-one updates become a
 * unit lower-triangular solve (the UT transform); the chunk then reads the state once
 * and writes it once, through matmuls. cum: cumulative log decay within the chunk. */
static void delta_head_chunked(const struct delta_args *a, int r0, int n, int h, float *St, float *scratch) {
    const int dk = a->dk, dv = a->dv, kh = key_head(a, h), C = DELTA_CHUNK;
    float *A = scratch;                        /* [C][C]: beta_i k_i.k_j decays, then q_i.k_j decays */
    float *Kc = A + (size_t)C * C;             /* [C][dk] keys */
    float *Qr = Kc + (size_t)C * dk;           /* [C][dk] queries */
    float *Qc = Qr + (size_t)C * dk;           /* [C][dk] queries * exp(cum) */
    float *W = Qc + (size_t)C * dk;            /* [C][dk] decayed beta keys, solved */
    float *U = W + (size_t)C * dk;             /* [C][dv] beta values, solved, then new values */
    float *O = U + (size_t)C * dv;             /* [C][dv] outputs */
    float *T1 = O + (size_t)C * dv;            /* [C][dv] */
    float *T2 = T1 + (size_t)C * dv;           /* [C][dv] */
    float *cum = T2 + (size_t)C * dv;          /* [C] */
    float *Ut = cum + C;                       /* [dv][C] */
    float *KdT = Ut + (size_t)dv * C;          /* [dk][C] keys decayed to the chunk end, transposed */
    float *D = KdT + (size_t)dk * C;           /* [dv][dk] state update */
    for (int t0 = r0; t0 < r0 + n; t0 += C) { /* chunks from the segment's first row */
        const int L = r0 + n - t0 < C ? r0 + n - t0 : C;
        float c = 0.0f;
        for (int i = 0; i < L; i++) {
            cum[i] = c += a->g[(size_t)(t0 + i) * a->nv + h];
            memcpy(Kc + (size_t)i * dk, dk_(a, t0 + i, kh), (size_t)dk * sizeof(float));
            memcpy(Qr + (size_t)i * dk, dq(a, t0 + i, kh), (size_t)dk * sizeof(float));
        }
        /* A = K K^T; solve (I + A') U = beta v and (I + A') W = beta k exp(cum) by forward
         * substitution, A'[i][j] = beta_i A[i][j] exp(cum_i - cum_j) for j < i */
        matmul(NULL, A, Kc, Kc, GB_TYPE_F32, L, dk, L);
        for (int i = 0; i < L; i++) {
            const float bi = a->beta[(size_t)(t0 + i) * a->nv + h], ei = expf(cum[i]);
            const float *vi = dv_(a, t0 + i, h), *ki = Kc + (size_t)i * dk;
            float *Ui = U + (size_t)i * dv, *Wi = W + (size_t)i * dk, *qc = Qc + (size_t)i * dk;
            const float *qr = Qr + (size_t)i * dk;
            for (int j = 0; j < dv; j++) Ui[j] = vi[j] * bi;
            for (int j = 0; j < dk; j++) {
                Wi[j] = ki[j] * bi * ei;
                qc[j] = qr[j] * ei;
            }
            for (int j = 0; j < i; j++) {
                const float aij = bi * A[(size_t)i * L + j] * expf(cum[i] - cum[j]);
                axpy_f32(Ui, -aij, U + (size_t)j * dv, dv);
                axpy_f32(Wi, -aij, W + (size_t)j * dk, dk);
            }
        }
        /* new values U -= W S; O = Qc S */
        matmul(NULL, T1, W, St, GB_TYPE_F32, L, dk, dv);
        for (size_t i = 0; i < (size_t)L * dv; i++) U[i] -= T1[i];
        matmul(NULL, O, Qc, St, GB_TYPE_F32, L, dk, dv);
        /* O += P U with P[i][j] = q_i.k_j exp(cum_i - cum_j), j <= i */
        matmul(NULL, A, Qr, Kc, GB_TYPE_F32, L, dk, L);
        for (int i = 0; i < L; i++)
            for (int j = 0; j < L; j++) {
                float *p = A + (size_t)i * L + j;
                *p = j <= i ? *p * expf(cum[i] - cum[j]) : 0.0f;
            }
        transpose(Ut, U, L, dv);
        matmul(NULL, T2, A, Ut, GB_TYPE_F32, L, L, dv);
        for (int i = 0; i < L; i++) {
            float *out = a->out + ((size_t)(t0 + i) * a->nv + h) * dv;
            const float *o = O + (size_t)i * dv, *p = T2 + (size_t)i * dv;
            for (int j = 0; j < dv; j++) out[j] = o[j] + p[j];
        }
        /* St = exp(cum_last) St + U^T Kd, Kd_i = k_i exp(cum_last - cum_i) */
        const float last = cum[L - 1], el = expf(last);
        for (int i = 0; i < L; i++) {
            const float e = expf(last - cum[i]);
            for (int r = 0; r < dk; r++) KdT[(size_t)r * L + i] = Kc[(size_t)i * dk + r] * e;
        }
        matmul(NULL, D, Ut, KdT, GB_TYPE_F32, dv, L, dk);
        for (size_t i = 0; i < (size_t)dv * dk; i++) St[i] = St[i] * el + D[i];
    }
}

/* Items: (segment, value head), split evenly over the threads; each item is one head's
 * state and rows, whatever thread takes it. */
struct delta_job {
    const struct delta_args *a;
    float *scratch;
    size_t scratch_floats;
};

static void delta_worker(void *p, int ith, int nth) {
    const struct delta_job *j = p;
    const struct delta_args *a = j->a;
    float *scratch = j->scratch + (size_t)ith * j->scratch_floats;
    long lo, hi;
    tp_range((long)a->n_segs * a->nv, ith, nth, &lo, &hi);
    for (long item = lo; item < hi; item++) {
        const struct gb_seg *sg = &a->segs[item / a->nv];
        const int h = (int)(item % a->nv);
        float *St = a->state.base + (size_t)sg->state * a->state.slot_floats + (size_t)h * a->dk * a->dv;
        if (sg->n_rows > 1 && !sg->rowwise) delta_head_chunked(a, sg->row0, sg->n_rows, h, St, scratch);
        else delta_head_recurrent(a, sg->row0, sg->n_rows, h, St);
    }
}

void cpu_delta_rule(struct backend *be, const struct delta_args *a) {
    struct cpu_backend *cb = cpu_of(be);
    GB_ASSERT(a->nk > 0 && a->nv % a->nk == 0);
    const int nth = tp_n_threads(cb->tp);
    GB_ASSERT(delta_scratch_floats(a->dk, a->dv) <= cb->delta_floats); /* reserve()d */
    struct delta_job j = {.a = a, .scratch = cb->delta_scratch, .scratch_floats = cb->delta_floats};
    long rows = 0;
    for (int i = 0; i < a->n_segs; i++) rows += a->segs[i].n_rows;
    if (rows * a->nv * a->dk * a->dv < (1L << 15) || nth == 1) delta_worker(&j, 0, 1);
    else tp_run(cb->tp, delta_worker, &j);
}
