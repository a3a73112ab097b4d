/* Recurrent-layer ops against their definitions on fresh random inputs: the gated
 * delta rule (recurrent and chunked forms vs a double-precision reference of the
 * recurrence, across chunk boundaries and with state carried between calls), the
 * causal conv1d (whole sequence vs token by token), the strided gating product, and
 * session checkpoints / copies on the Qwen3.5 and LFM2 fixtures (a rewound or copied
 * session continues exactly as the original). */
#include "backend/backend.h"
#include "gerbil.h"
#include "test.h"

#include <string.h>
#include <time.h>

static unsigned long long seed;

static void fill(float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = scale * test_rand_f(&seed);
}

static float max_abs(const float *a, const float *b, size_t n) {
    float m = 0;
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]);
        if (!(d <= m)) m = d;
    }
    return m;
}

/* The definition, in double: S = e^g S; S += k (beta (v - S^T k))^T; out = S^T q. */
static void delta_ref(const struct delta_args *a, int n_tok, double *S) {
    const int dk = a->dk, dv = a->dv, grp = a->nv / a->nk;
    double *tmp = malloc(sizeof(double) * (size_t)dv);
    for (int h = 0; h < a->nv; h++) {
        double *Sh = S + (size_t)h * dk * dv;
        for (int t = 0; t < n_tok; t++) {
            const float *q = a->x + (size_t)t * a->qk_stride + a->q_off + (size_t)(h / grp) * dk;
            const float *k = a->x + (size_t)t * a->qk_stride + a->k_off + (size_t)(h / grp) * dk;
            const float *v = a->x + (size_t)t * a->v_stride + a->v_off + (size_t)h * dv;
            const double decay = exp(a->g[(size_t)t * a->nv + h]), beta = a->beta[(size_t)t * a->nv + h];
            for (int j = 0; j < dv; j++) {
                double kv = 0;
                for (int i = 0; i < dk; i++) kv += (Sh[(size_t)i * dv + j] *= decay) * k[i];
                tmp[j] = (v[j] - kv) * beta;
            }
            for (int j = 0; j < dv; j++) {
                double o = 0;
                for (int i = 0; i < dk; i++) o += (Sh[(size_t)i * dv + j] += k[i] * tmp[j]) * q[i];
                a->out[((size_t)t * a->nv + h) * dv + j] = (float)o;
            }
        }
    }
    free(tmp);
}

static void l2(float *v, int n, float scale) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)v[i] * v[i];
    for (int i = 0; i < n; i++) v[i] = (float)(v[i] / sqrt(ss + 1e-6) * scale);
}

static void test_delta(struct backend *be, int n_tok, int nk, int nv, int dk, int dv) {
    const int stride = 2 * nk * dk + nv * dv;
    float *x = malloc(sizeof(float) * (size_t)n_tok * stride);
    float *g = malloc(sizeof(float) * (size_t)n_tok * nv), *beta = malloc(sizeof(float) * (size_t)n_tok * nv);
    fill(x, (size_t)n_tok * stride, 1.0f);
    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < nk; h++) {
            l2(x + (size_t)t * stride + (size_t)h * dk, dk, 1.0f / sqrtf((float)dk));
            l2(x + (size_t)t * stride + (size_t)nk * dk + (size_t)h * dk, dk, 1.0f);
        }
    for (int i = 0; i < n_tok * nv; i++) {
        g[i] = -0.5f * (1.0f + test_rand_f(&seed)); /* log decay in (-1, 0] */
        beta[i] = 0.5f * (1.0f + test_rand_f(&seed));
    }
    const size_t ns = (size_t)nv * dk * dv, no = (size_t)n_tok * nv * dv;
    float *out[2], *state[2], *init = malloc(sizeof(float) * ns), *ref_out = malloc(sizeof(float) * no);
    double *S = malloc(sizeof(double) * ns);
    fill(init, ns, 0.3f);
    for (int h = 0; h < nv; h++) /* the op keeps S^T [dv][dk]; the reference S [dk][dv] */
        for (int i = 0; i < dk; i++)
            for (int j = 0; j < dv; j++) S[((size_t)h * dk + i) * dv + j] = init[((size_t)h * dv + j) * dk + i];
    struct gb_reserve rs = {.n_rows = n_tok, .delta_dk = dk, .delta_dv = dv};
    CHECK(be->ops->reserve(be, &rs) == GERBIL_OK);
    struct delta_args a = {.x = x, .qk_stride = stride, .v_stride = stride, .q_off = 0, .k_off = nk * dk,
                           .v_off = 2 * nk * dk, .g = g, .beta = beta, .nk = nk, .nv = nv, .dk = dk, .dv = dv};
    a.out = ref_out;
    delta_ref(&a, n_tok, S);
    float *ref_state = malloc(sizeof(float) * ns);
    for (int h = 0; h < nv; h++)
        for (int i = 0; i < dk; i++)
            for (int j = 0; j < dv; j++) ref_state[((size_t)h * dv + j) * dk + i] = (float)S[((size_t)h * dk + i) * dv + j];
    for (int chunked = 0; chunked <= 1; chunked++) {
        out[chunked] = malloc(sizeof(float) * no);
        state[chunked] = malloc(sizeof(float) * ns);
        memcpy(state[chunked], init, sizeof(float) * ns);
        a.out = out[chunked];
        a.state = (struct gb_state){state[chunked], ns};
        /* two calls: the state carries over the boundary (prefill then continuation); the
         * recurrent form as one-row segments of the same sequence, one call per row */
        const int split = n_tok / 3;
        if (chunked) {
            struct delta_args b = a;
            struct gb_seg s0 = {.row0 = 0, .n_rows = split}, s1 = {.row0 = split, .n_rows = n_tok - split};
            b.segs = &s0;
            b.n_segs = 1;
            if (split > 0) op_delta_rule(be, &b);
            b.segs = &s1;
            op_delta_rule(be, &b);
        } else {
            for (int t = 0; t < n_tok; t++) {
                struct delta_args b = a;
                struct gb_seg s1 = {.row0 = t, .n_rows = 1};
                b.segs = &s1;
                b.n_segs = 1;
                op_delta_rule(be, &b);
            }
        }
        float d = max_abs(out[chunked], ref_out, no), ds = max_abs(state[chunked], ref_state, ns);
        CHECKF(d < 2e-4f && ds < 2e-4f, "delta rule (%s, T=%d nk=%d nv=%d dk=%d dv=%d, %d threads): out %g state %g",
               chunked ? "chunked" : "recurrent", n_tok, nk, nv, dk, dv, be->ops->n_threads(be), d, ds);
    }
    free(out[0]); free(out[1]); free(state[0]); free(state[1]);
    free(x); free(g); free(beta); free(init); free(ref_out); free(S); free(ref_state);
}

static void test_conv(struct backend *be, int n_tok, int C, int K, int silu) {
    float *x = malloc(sizeof(float) * (size_t)n_tok * C), *w = malloc(sizeof(float) * (size_t)C * K);
    float *y1 = malloc(sizeof(float) * (size_t)n_tok * C), *y2 = malloc(sizeof(float) * (size_t)n_tok * C);
    float *s1 = calloc((size_t)(K - 1) * C, sizeof(float)), *s2 = calloc((size_t)(K - 1) * C, sizeof(float));
    fill(x, (size_t)n_tok * C, 1.0f);
    fill(w, (size_t)C * K, 1.0f);
    struct gb_seg whole = {.row0 = 0, .n_rows = n_tok, .state = 0};
    op_conv1d(be, y1, x, (struct gb_state){s1, 0}, w, C, K, silu, &whole, 1);
    for (int t = 0; t < n_tok; t++) {
        struct gb_seg one = {.row0 = 0, .n_rows = 1, .state = 0};
        op_conv1d(be, y2 + (size_t)t * C, x + (size_t)t * C, (struct gb_state){s2, 0}, w, C, K, silu, &one, 1);
    }
    CHECKF(memcmp(y1, y2, sizeof(float) * (size_t)n_tok * C) == 0, "conv1d: whole sequence != token by token");
    CHECKF(memcmp(s1, s2, sizeof(float) * (size_t)(K - 1) * C) == 0, "conv1d: final states differ");
    /* the definition at one point: zero padding before the sequence */
    int t = n_tok > 2 ? 2 : n_tok - 1, c = C / 2;
    double acc = 0;
    for (int j = 0; j < K; j++) {
        int src = t + j - (K - 1);
        if (src >= 0) acc += (double)w[(size_t)j * C + c] * x[(size_t)src * C + c];
    }
    double want = silu ? acc / (1 + exp(-acc)) : acc;
    CHECKF(fabs(y1[(size_t)t * C + c] - want) < 1e-5, "conv1d: y[%d][%d] = %g, want %g", t, c,
           (double)y1[(size_t)t * C + c], want);
    free(x); free(w); free(y1); free(y2); free(s1); free(s2);
}

/* y[t][i] = a[t][i] * (b[t][i] + bias[i]) over strided rows, with and without the bias. */
static void test_mul_rows(struct backend *be, int n_rows, int n) {
    const int as = 3 * n, bs = n + 5;
    float *a = malloc(sizeof(float) * (size_t)n_rows * as), *b = malloc(sizeof(float) * (size_t)n_rows * bs);
    float *bias = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * (size_t)n_rows * n);
    fill(a, (size_t)n_rows * as, 1.0f);
    fill(b, (size_t)n_rows * bs, 1.0f);
    fill(bias, (size_t)n, 0.5f);
    for (int with_bias = 0; with_bias <= 1; with_bias++) {
        op_mul_rows(be, y, a + n, as, b, bs, with_bias ? bias : NULL, n_rows, n);
        int bad = 0;
        for (int t = 0; t < n_rows; t++)
            for (int i = 0; i < n; i++) {
                const float want = a[(size_t)t * as + n + i] * (b[(size_t)t * bs + i] + (with_bias ? bias[i] : 0.0f));
                bad += y[(size_t)t * n + i] != want;
            }
        CHECKF(bad == 0, "mul_rows (%d rows of %d, bias %d, %d threads): %d wrong", n_rows, n, with_bias,
               be->ops->n_threads(be), bad);
    }
    free(a); free(b); free(bias); free(y);
}

/* A session rewound to its checkpoint, or copied, continues exactly as the original. */
static void test_sessions(const char *dir) {
    gerbil_model_t m;
    if (gerbil_model_load(dir, NULL, &m) != GERBIL_OK) { CHECKF(0, "%s: %s", dir, gerbil_last_error()); return; }
    const int V = gerbil_model_n_vocab(m);
    int32_t ids[30];
    for (int i = 0; i < 30; i++) ids[i] = 3 + (i * 37) % (V - 3);
    float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V);
    gerbil_session_t s, s2;
    CHECK(gerbil_session_new(m, NULL, &s) == GERBIL_OK);
    CHECK(gerbil_session_new(m, NULL, &s2) == GERBIL_OK);
    CHECK(gerbil_session_eval(s, ids, 20, NULL, 0) == GERBIL_OK);        /* checkpoint at 20 */
    for (int i = 20; i < 25; i++) CHECK(gerbil_session_eval(s, ids + i, 1, a, 0) == GERBIL_OK);
    CHECK(gerbil_session_copy(s2, s) == GERBIL_OK);
    CHECK(gerbil_session_eval(s, ids + 25, 1, a, 0) == GERBIL_OK);
    CHECK(gerbil_session_eval(s2, ids + 25, 1, b, 0) == GERBIL_OK);
    CHECKF(memcmp(a, b, sizeof(float) * V) == 0, "a copied session continues differently");
    gerbil_session_truncate(s, 23);                                       /* -> the checkpoint at 20 */
    CHECKF(gerbil_session_n_past(s) == 20, "truncate(23) of a recurrent model: n_past %d, want 20",
           gerbil_session_n_past(s));
    for (int i = 20; i < 26; i++) CHECK(gerbil_session_eval(s, ids + i, 1, a, 0) == GERBIL_OK);
    CHECKF(memcmp(a, b, sizeof(float) * V) == 0, "a session rewound to its checkpoint continues differently");
    gerbil_session_truncate(s, 10);                                       /* before the checkpoint: start */
    CHECK(gerbil_session_n_past(s) == 0);
    CHECK(gerbil_session_eval(s, ids, 26, a, 0) == GERBIL_OK);
    CHECKF(max_abs(a, b, (size_t)V) < 1e-4f, "after a reset: %g", (double)max_abs(a, b, (size_t)V));
    gerbil_session_free(s);
    gerbil_session_free(s2);
    gerbil_model_free(m);
    free(a);
    free(b);
}

int main(void) {
    seed = (unsigned long long)time(NULL) * 2654435761ULL | 1;
    printf("seed %llu\n", seed);
    for (int nt = 1; nt <= 2; nt++) {
        struct backend *tp;
        if (backend_new("cpu", nt, &tp) != GERBIL_OK) { CHECKF(0, "%s", gerbil_last_error()); return test_done(); }
        test_delta(tp, 150, 2, 4, 16, 24);   /* grouped heads, three chunks */
        test_delta(tp, 7, 3, 3, 8, 8);       /* a partial chunk */
        test_delta(tp, 1, 1, 2, 32, 16);     /* decode */
        test_delta(tp, 130, 2, 2, 64, 64);   /* wide heads: the threaded path */
        test_conv(tp, 9, 40, 4, 1);
        test_conv(tp, 2, 7, 4, 1);           /* shorter than the kernel */
        test_conv(tp, 13, 64, 3, 0);         /* LFM2: no activation */
        test_conv(tp, 1, 33, 3, 0);
        test_mul_rows(tp, 37, 64);
        test_mul_rows(tp, 1, 7);
        backend_free(tp);
    }
    test_sessions("tests/fixtures/qwen35-f32");
    test_sessions("tests/fixtures/lfm2-f32");     /* short-convolution state */
    return test_done();
}
