/* The CPU backend's ops for the encoder-decoder speech models (backend.h: im2col1d,
 * layernorm, groupnorm, unary). Statistics are summed in double in index order, as the
 * reference does, so the norms give the reference's bits; tanh and the erf GELU use libm's
 * f32 functions (within an ulp or two of the reference's double ones). */
#include "backend/cpu/cpu.h"
#include "base/status.h"

#include <math.h>
#include <string.h>

struct im2col_args {
    float *col;
    const float *x;
    int C, K, stride;
};

static void im2col_range(void *p, long lo, long hi) {
    const struct im2col_args *a = p;
    const int C = a->C, K = a->K;
    for (long t = lo; t < hi; t++) {
        float *out = a->col + (size_t)t * C * K;
        const float *in = a->x + (size_t)t * a->stride * C;
        if (C == 1) {
            memcpy(out, in, (size_t)K * sizeof *out);
            continue;
        }
        for (int c = 0; c < C; c++) /* writes in order; the K reads of a column sit in K rows */
            for (int k = 0; k < K; k++) out[(size_t)c * K + k] = in[(size_t)k * C + c];
    }
}

void cpu_im2col1d(struct backend *be, float *col, const float *x, int T_in, int C, int K, int stride) {
    const int T_out = (T_in - K) / stride + 1;
    if (T_out <= 0) return;
    struct im2col_args a = {col, x, C, K, stride};
    parallel_range(cpu_of(be), T_out, (long)C * K, im2col_range, &a);
}

struct ln_args {
    float *y;
    const float *x, *w, *b;
    float eps;
    int n;
};

static void ln_range(void *p, long lo, long hi) {
    const struct ln_args *a = p;
    const int n = a->n;
    for (long r = lo; r < hi; r++) {
        const float *xr = a->x + (size_t)r * n;
        float *yr = a->y + (size_t)r * n;
        double m = 0, v = 0;
        for (int i = 0; i < n; i++) m += xr[i];
        m /= n;
        for (int i = 0; i < n; i++) v += (xr[i] - m) * (xr[i] - m);
        v /= n;
        const double inv = 1.0 / sqrt(v + a->eps);
        for (int i = 0; i < n; i++)
            yr[i] = (float)((xr[i] - m) * inv * (a->w ? a->w[i] : 1.0) + (a->b ? a->b[i] : 0.0));
    }
}

void cpu_layernorm(struct backend *be, float *y, const float *x, const float *w, const float *b, float eps,
                   int n_rows, int n) {
    struct ln_args a = {y, x, w, b, eps, n};
    parallel_range(cpu_of(be), n_rows, 4L * n, ln_range, &a);
}

struct gn_args {
    float *y;
    const float *x, *w, *b;
    const double *mean, *inv;
    int C, cg;
};

static void gn_apply(void *p, long lo, long hi) {
    const struct gn_args *a = p;
    for (long t = lo; t < hi; t++)
        for (int c = 0; c < a->C; c++) {
            const int g = c / a->cg;
            const size_t i = (size_t)t * a->C + c;
            a->y[i] = (float)((a->x[i] - a->mean[g]) * a->inv[g] * a->w[c] + a->b[c]);
        }
}

void cpu_groupnorm(struct backend *be, float *y, const float *x, const float *w, const float *b, float eps, int T,
                   int C, int G) {
    GB_ASSERT(G > 0 && C % G == 0 && G <= 1024);
    const int cg = C / G;
    double mean[1024], inv[1024];
    for (int g = 0; g < G; g++) {
        double m = 0, v = 0;
        for (int t = 0; t < T; t++)
            for (int c = g * cg; c < (g + 1) * cg; c++) m += x[(size_t)t * C + c];
        m /= (double)T * cg;
        for (int t = 0; t < T; t++)
            for (int c = g * cg; c < (g + 1) * cg; c++) {
                double d = x[(size_t)t * C + c] - m;
                v += d * d;
            }
        v /= (double)T * cg;
        mean[g] = m;
        inv[g] = 1.0 / sqrt(v + eps);
    }
    struct gn_args a = {y, x, w, b, mean, inv, C, cg};
    parallel_range(cpu_of(be), T, 2L * C, gn_apply, &a);
}

struct unary_args {
    float *x;
    int kind;
};

static void unary_range(void *p, long lo, long hi) {
    const struct unary_args *a = p;
    float *x = a->x;
    if (a->kind == GB_UNARY_TANH)
        for (long i = lo; i < hi; i++) x[i] = tanhf(x[i]);
    else
        for (long i = lo; i < hi; i++) x[i] = 0.5f * x[i] * erfcf(-x[i] * (float)M_SQRT1_2); /* = 1 + erf, no cancellation */
}

void cpu_unary(struct backend *be, float *x, long n, int kind) {
    struct unary_args a = {x, kind};
    parallel_range(cpu_of(be), n, 16, unary_range, &a);
}

/* Dense attention as two matmuls per head through the float GEMM kernels: S = Q_h K_h^T
 * ([n_q][n_kv]), a softmax per row (f32, max subtracted), O_h = P V_h with V_h transposed
 * into a [hd][n_kv] weight. Each output depends only on its own row, so the thread count
 * changes no bit. */
struct softmax_args {
    float *s;
    int n;
    float scale;
};

static void softmax_rows(void *p, long lo, long hi) {
    const struct softmax_args *a = p;
    for (long r = lo; r < hi; r++) {
        float *x = a->s + (size_t)r * a->n;
        float mx = -INFINITY;
        for (int j = 0; j < a->n; j++) mx = x[j] * a->scale > mx ? x[j] * a->scale : mx;
        double sum = 0;
        for (int j = 0; j < a->n; j++) sum += (x[j] = expf(x[j] * a->scale - mx));
        const float inv = (float)(1.0 / sum);
        for (int j = 0; j < a->n; j++) x[j] *= inv;
    }
}

void cpu_attention_dense(struct backend *be, float *out, const float *q, const float *k, const float *v, int n_q,
                         int n_kv, int n_head, int n_head_kv, int hd, float scale, float *scratch) {
    struct cpu_backend *cb = cpu_of(be);
    const int group = n_head / n_head_kv;
    float *qh = scratch, *oh = qh + (size_t)n_q * hd, *kh = oh + (size_t)n_q * hd, *vt = kh + (size_t)n_kv * hd,
          *s = vt + (size_t)n_kv * hd;
    const size_t qs = (size_t)n_head * hd, ks = (size_t)n_head_kv * hd;
    for (int kvh = 0; kvh < n_head_kv; kvh++) {
        for (int j = 0; j < n_kv; j++) {
            memcpy(kh + (size_t)j * hd, k + j * ks + (size_t)kvh * hd, (size_t)hd * sizeof *kh);
            for (int c = 0; c < hd; c++) vt[(size_t)c * n_kv + j] = v[j * ks + (size_t)kvh * hd + c];
        }
        for (int h = kvh * group; h < (kvh + 1) * group; h++) {
            for (int i = 0; i < n_q; i++) memcpy(qh + (size_t)i * hd, q + i * qs + (size_t)h * hd, (size_t)hd * sizeof *qh);
            matmul(cb->tp, s, qh, kh, GB_TYPE_F32, n_q, hd, n_kv);
            struct softmax_args a = {s, n_kv, scale};
            parallel_range(cb, n_q, 8L * n_kv, softmax_rows, &a);
            matmul(cb->tp, oh, s, vt, GB_TYPE_F32, n_q, n_kv, hd);
            for (int i = 0; i < n_q; i++) memcpy(out + i * qs + (size_t)h * hd, oh + (size_t)i * hd, (size_t)hd * sizeof *oh);
        }
    }
}
