/* The reference backend op by op against definitions written out here, in double where
 * the op sums, on fresh random inputs of odd sizes. The reference is the oracle for the
 * other backends, so what checks it must not share its code: indexing (the paged KV
 * pool, state slots, strides) and dequantization (Q8_0, bf16) are done anew below.
 * Outputs are poisoned with NaN first, so an element an op skips cannot pass; padding
 * an op must not touch is checked to be intact. The seed is printed; pass it back as
 * argv[1] to replay a run. */
#include "backend/backend.h"
#include "backend/ref/ref_backend.h"
#include "base/fp16.h"
#include "tensor/quant.h"
#include "tensor/quant_ref.h"
#include "tensor/weight.h"
#include "test.h"

#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static unsigned long long rng, seed0;
static struct backend *be;

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

static float *fmalloc(size_t n) {
    float *p = malloc((n ? n : 1) * sizeof *p);
    if (!p) { fprintf(stderr, "out of memory\n"); exit(1); }
    return p;
}
static double *dmalloc(size_t n) {
    double *p = malloc((n ? n : 1) * sizeof *p);
    if (!p) { fprintf(stderr, "out of memory\n"); exit(1); }
    return p;
}
static void fill(float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = scale * test_rand_f(&rng);
}
static float *rnd(size_t n, float scale) {
    float *p = fmalloc(n);
    fill(p, n, scale);
    return p;
}
static void poison(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = NAN;
}
static float *poisoned(size_t n) {
    float *p = fmalloc(n);
    poison(p, n);
    return p;
}
static int rand_int(int n) { return (int)(test_rand_u64(&rng) % (unsigned long long)n); }

/* Largest |got - want| / (1 + |want|) over n elements (NaN counts as infinite). */
static double rel_err(const float *got, const double *want, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]) / (1.0 + fabs(want[i]));
        if (!(e <= m)) m = isnan(e) ? INFINITY : e;
    }
    return m;
}
#define CHECK_CLOSE(what, got, want, n, tol) do { \
    double e_ = rel_err(got, want, n); \
    CHECKF(e_ <= (tol), "%s: error %.3g > %.3g (seed %llu)", what, e_, (double)(tol), seed0); \
} while (0)

static int same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof *a) == 0; }

/* ---- buffers and the loading entries ---- */

static void test_buffers(void) {
    const struct backend_ops *o = be->ops;
    CHECK(strcmp(o->name, "ref") == 0);
    CHECK(o->n_threads(be) == 1);
    const size_t n = 1000 + (size_t)rand_int(100);
    unsigned char *a = o->alloc(be, n, GB_BUF_ZERO), *b = o->alloc(be, n, GB_BUF_LAZY);
    CHECK(a && b && (uintptr_t)a % 64 == 0 && (uintptr_t)b % 64 == 0);
    if (!a || !b) return;
    int zero = 1;
    for (size_t i = 0; i < n; i++) zero &= a[i] == 0;
    CHECK(zero);
    unsigned char *h = malloc(n), *h2 = malloc(n);
    for (size_t i = 0; i < n; i++) h[i] = (unsigned char)test_rand_u64(&rng);
    o->upload(be, a, h, n);
    o->copy(be, b, a, n);
    o->zero(be, a, n / 2);
    o->sync(be);
    o->download(be, h2, b, n);
    CHECK(memcmp(h, h2, n) == 0);
    o->download(be, h2, a, n);
    int ok = 1;
    for (size_t i = 0; i < n; i++) ok &= h2[i] == (i < n / 2 ? 0 : h[i]);
    CHECK(ok);
    o->buf_free(be, a, n);
    o->buf_free(be, b, n);
    free(h);
    free(h2);

    float wd[6] = {1, 2, 3, 4, 5, 6};
    struct gb_weight w = {.kind = GB_WEIGHT_PLAIN, .type = GB_TYPE_F32, .n_out = 2, .n_in = 3, .data = wd,
                          .row_bytes = 12, .name = "w"};
    o->weight_prepare(be, &w, 1, 1);
    /* nothing rearranged, nothing marked packed */
    CHECK(w.data == wd && w.type == GB_TYPE_F32 && w.row_bytes == 12 && !w.packed && wd[5] == 6.0f);
    const struct gb_reserve rs = {.n_rows = 64, .n_kv = 4096, .n_sel = 8};
    CHECK(o->reserve(be, &rs) == GERBIL_OK);
}

/* ---- matmuls ---- */

/* y[t][o] = sum_i x[t][i] w[o][i] (+ bias[o]) in double over a dequantized w. */
static void mm_def(double *y, const float *x, const float *w, const float *bias, int n_tok, int n_in, int n_out) {
    for (int t = 0; t < n_tok; t++)
        for (int o = 0; o < n_out; o++) {
            double acc = bias ? bias[o] : 0.0;
            for (int i = 0; i < n_in; i++) acc += (double)x[(size_t)t * n_in + i] * w[(size_t)o * n_in + i];
            y[(size_t)t * n_out + o] = acc;
        }
}

/* A weight of type t holding w (rounded to t) and, in deq, what it holds as f32. */
static void *make_weight(enum gb_type t, const float *w, int n_out, int n_in, float *deq, struct gb_weight *out) {
    size_t row_bytes;
    void *data;
    if (t == GB_TYPE_F32) {
        row_bytes = (size_t)n_in * 4;
        data = malloc((size_t)n_out * row_bytes);
        memcpy(data, w, (size_t)n_out * row_bytes);
        memcpy(deq, w, (size_t)n_out * row_bytes);
    } else if (t == GB_TYPE_BF16) { /* by truncation: the top half of the f32 bits */
        row_bytes = (size_t)n_in * 2;
        uint16_t *d = malloc((size_t)n_out * row_bytes);
        for (size_t i = 0; i < (size_t)n_out * n_in; i++) {
            uint32_t u;
            memcpy(&u, &w[i], 4);
            d[i] = (uint16_t)(u >> 16);
            u &= 0xffff0000u;
            memcpy(&deq[i], &u, 4);
        }
        data = d;
    } else { /* Q8_0: blocks of 32 codes q and an f16 scale d, x = q d */
        GB_ASSERT(t == GB_TYPE_Q8_0 && n_in % QK8_0 == 0);
        const int nb = n_in / QK8_0;
        row_bytes = (size_t)nb * sizeof(block_q8_0);
        block_q8_0 *b = malloc((size_t)n_out * row_bytes);
        for (int o = 0; o < n_out; o++) quantize_row_q8_0_ref(w + (size_t)o * n_in, b + (size_t)o * nb, n_in);
        for (int o = 0; o < n_out; o++)
            for (int k = 0; k < nb; k++)
                for (int i = 0; i < QK8_0; i++)
                    deq[(size_t)o * n_in + k * QK8_0 + i] =
                        (float)b[o * nb + k].qs[i] * f16_to_f32(b[o * nb + k].d);
        data = b;
    }
    *out = (struct gb_weight){.kind = GB_WEIGHT_PLAIN, .type = t, .n_out = n_out, .n_in = n_in, .data = data,
                              .row_bytes = row_bytes, .name = "test"};
    return data;
}

static void test_matmul(enum gb_type t, int n_tok, int n_in, int n_out, int with_bias) {
    float *w = rnd((size_t)n_out * n_in, 1.0f), *deq = fmalloc((size_t)n_out * n_in);
    float *x = rnd((size_t)n_tok * n_in, 1.0f), *bias = with_bias ? rnd((size_t)n_out, 1.0f) : NULL;
    float *y = poisoned((size_t)n_tok * n_out);
    double *want = dmalloc((size_t)n_tok * n_out);
    struct gb_weight gw;
    void *data = make_weight(t, w, n_out, n_in, deq, &gw);
    int32_t *span = malloc((size_t)n_tok * sizeof *span); /* two segments: the reference ignores spans */
    for (int i = 0; i < n_tok; i++) span[i] = i < n_tok / 2 ? n_tok / 2 : n_tok - n_tok / 2;
    op_matmul(be, y, x, &gw, bias, (struct gb_rows){n_tok, span});
    mm_def(want, x, deq, bias, n_tok, n_in, n_out);
    char what[64];
    snprintf(what, sizeof what, "matmul %s %dx%dx%d", type_name(t), n_tok, n_in, n_out);
    CHECK_CLOSE(what, y, want, (size_t)n_tok * n_out, 1e-6);
    free(w), free(deq), free(x), free(bias), free(y), free(want), free(data), free(span);
}

/* matmul_multi: the bits of separate matmul calls; bias NULL, or holding a NULL. */
static void test_matmul_multi(void) {
    const int n_tok = 3, n_in = 64, k = 3, n_out[3] = {7, 1, 12};
    const enum gb_type types[3] = {GB_TYPE_F32, GB_TYPE_Q8_0, GB_TYPE_BF16};
    struct gb_weight gw[3];
    const struct gb_weight *wp[3];
    void *data[3];
    float *y[3], *y1[3], *bias[3];
    float *x = rnd((size_t)n_tok * n_in, 1.0f);
    for (int i = 0; i < k; i++) {
        float *w = rnd((size_t)n_out[i] * n_in, 1.0f), *deq = fmalloc((size_t)n_out[i] * n_in);
        data[i] = make_weight(types[i], w, n_out[i], n_in, deq, &gw[i]);
        wp[i] = &gw[i];
        free(w), free(deq);
        y[i] = poisoned((size_t)n_tok * n_out[i]);
        y1[i] = poisoned((size_t)n_tok * n_out[i]);
        bias[i] = i == 1 ? NULL : rnd((size_t)n_out[i], 1.0f);
    }
    const struct gb_rows r = {n_tok, NULL};
    for (int pass = 0; pass < 2; pass++) {
        const float *const *b = pass ? (const float *const *)bias : NULL;
        op_matmul_multi(be, k, y, x, wp, b, r);
        int ok = 1;
        for (int i = 0; i < k; i++) {
            op_matmul(be, y1[i], x, wp[i], b ? b[i] : NULL, r);
            ok &= same_bits(y[i], y1[i], (size_t)n_tok * n_out[i]);
        }
        CHECKF(ok, "matmul_multi pass %d differs from matmul", pass);
    }
    for (int i = 0; i < k; i++) free(data[i]), free(y[i]), free(y1[i]), free(bias[i]);
    free(x);
}

static void test_matmul_id(int x_per_slot) {
    const int n_mat = 4, n_out = 9, n_in = 13, n = 5, n_sel = 3;
    float *w = rnd((size_t)n_mat * n_out * n_in, 1.0f);
    struct gb_weight stack[4];
    for (int e = 0; e < n_mat; e++)
        stack[e] = (struct gb_weight){.kind = GB_WEIGHT_PLAIN, .type = GB_TYPE_F32, .n_out = n_out, .n_in = n_in,
                                      .data = w + (size_t)e * n_out * n_in, .row_bytes = (size_t)n_in * 4};
    int32_t ids[5 * 3];
    for (int i = 0; i < n * n_sel; i++) ids[i] = rand_int(n_mat);
    ids[0] = ids[1] = 2; /* one row routed twice to one expert */
    const size_t n_x = (size_t)(x_per_slot ? n * n_sel : n) * n_in;
    float *x = rnd(n_x, 1.0f), *y = poisoned((size_t)n * n_sel * n_out);
    double *want = dmalloc((size_t)n * n_sel * n_out);
    for (int t = 0; t < n; t++)
        for (int s = 0; s < n_sel; s++) {
            const float *xt = x + (size_t)(x_per_slot ? t * n_sel + s : t) * n_in;
            mm_def(want + ((size_t)t * n_sel + s) * n_out, xt, w + (size_t)ids[t * n_sel + s] * n_out * n_in,
                   NULL, 1, n_in, n_out);
        }
    const int32_t span[5] = {2, 2, 3, 3, 3}, seg_of[5] = {0, 0, 1, 1, 1};
    const struct gb_seg segs[2] = {{.row0 = 0, .n_rows = 2}, {.row0 = 2, .n_rows = 3}};
    const struct gb_batch b = {.n_rows = n, .n_segs = 2, .segs = segs, .span = span, .seg_of = seg_of};
    op_matmul_id(be, y, x, x_per_slot, stack, n_mat, ids, n_sel, &b, n);
    CHECK_CLOSE(x_per_slot ? "matmul_id per slot" : "matmul_id", y, want, (size_t)n * n_sel * n_out, 1e-6);
    free(w), free(x), free(y), free(want);
}

/* ---- rows ---- */

static void test_rows(void) {
    /* get_rows from an f16 table; a row with id < 0 is left alone */
    const int n_vocab = 6, n_embd = 21, n = 5;
    uint16_t tab[6 * 21];
    for (int i = 0; i < n_vocab * n_embd; i++) tab[i] = f32_to_f16(test_rand_f(&rng));
    const struct gb_weight e = {.kind = GB_WEIGHT_PLAIN, .type = GB_TYPE_F16, .n_out = n_vocab, .n_in = n_embd,
                                .data = tab, .row_bytes = (size_t)n_embd * 2};
    const int32_t ids[5] = {3, -1, 0, 5, 3};
    float *y = poisoned((size_t)n * n_embd);
    op_get_rows(be, y, &e, ids, n);
    int ok = 1;
    for (int t = 0; t < n; t++)
        for (int i = 0; i < n_embd; i++) {
            const float v = y[t * n_embd + i];
            ok &= ids[t] < 0 ? isnan(v) : v == f16_to_f32(tab[ids[t] * n_embd + i]);
        }
    CHECK(ok);
    free(y);

    /* gather_rows, repeats included */
    const int width = 11, n_src = 7, n_dst = 6;
    float *src = rnd((size_t)n_src * width, 1.0f), *dst = poisoned((size_t)n_dst * width);
    int32_t idx[6];
    for (int t = 0; t < n_dst; t++) idx[t] = rand_int(n_src);
    idx[1] = idx[4];
    op_gather_rows(be, dst, src, idx, n_dst, width);
    ok = 1;
    for (int t = 0; t < n_dst; t++) ok &= same_bits(dst + t * width, src + idx[t] * width, (size_t)width);
    CHECK(ok);
    free(src), free(dst);

    /* copy_strided: [n1][n2][width] between two padded layouts; the padding stays poisoned */
    const int n1 = 3, n2 = 4, wd = 5, s2 = 7, s1 = n2 * s2 + 2, d2 = 6, d1 = n2 * d2 + 3;
    float *s = rnd((size_t)n1 * s1, 1.0f), *d = poisoned((size_t)n1 * d1);
    op_copy_strided(be, d, d1, d2, s, s1, s2, n1, n2, wd);
    ok = 1;
    for (int i = 0; i < n1 * d1; i++) {
        const int a = i / d1, r = i % d1, b = r / d2, k = r % d2;
        if (b < n2 && k < wd) ok &= d[i] == s[a * s1 + b * s2 + k];
        else ok &= isnan(d[i]) != 0;
    }
    CHECK(ok);
    free(s), free(d);
}

/* ---- norms and element-wise ---- */

static double silu_d(double v) { return v / (1.0 + exp(-v)); }
static double sigmoid_d(double v) { return 1.0 / (1.0 + exp(-v)); }

static void test_norms(void) {
    const int n_rows = 3, n = 29;
    const size_t N = (size_t)n_rows * n;
    float *x = rnd(N, 2.0f), *z = rnd(N, 3.0f), *w = rnd((size_t)n, 1.5f), *y = poisoned(N), *y2 = fmalloc(N);
    double *want = dmalloc(N), *want_g = dmalloc(N);
    const float eps = 1e-5f;
    for (int r = 0; r < n_rows; r++) {
        double ss = 0.0;
        for (int i = 0; i < n; i++) ss += (double)x[r * n + i] * x[r * n + i];
        const double inv = 1.0 / sqrt(ss / n + eps);
        for (int i = 0; i < n; i++) {
            want[r * n + i] = x[r * n + i] * inv * w[i];
            want_g[r * n + i] = want[r * n + i] * silu_d(z[r * n + i]);
        }
    }
    op_rmsnorm(be, y, x, w, eps, n_rows, n);
    CHECK_CLOSE("rmsnorm", y, want, N, 1e-6);
    memcpy(y2, x, N * sizeof *x);
    op_rmsnorm(be, y2, y2, w, eps, n_rows, n); /* in place */
    CHECK(same_bits(y, y2, N));
    poison(y, N);
    op_rmsnorm_gated(be, y, x, z, w, eps, n_rows, n);
    CHECK_CLOSE("rmsnorm_gated", y, want_g, N, 1e-6);
    free(x), free(z), free(w), free(y), free(y2), free(want), free(want_g);

    /* l2norm_heads over the first n_heads * d floats of padded rows; the padding is kept */
    const int nh = 2, d = 9, stride = nh * d + 5;
    float *v = rnd((size_t)n_rows * stride, 1.0f), *v0 = fmalloc((size_t)n_rows * stride);
    memcpy(v0, v, (size_t)n_rows * stride * sizeof *v);
    const float scale = 0.37f, eps2 = 1e-6f;
    op_l2norm_heads(be, v, n_rows, nh, d, stride, eps2, scale);
    double err = 0.0;
    int pad_ok = 1;
    for (int t = 0; t < n_rows; t++) {
        for (int h = 0; h < nh; h++) {
            double ss = 0.0;
            for (int i = 0; i < d; i++) ss += (double)v0[t * stride + h * d + i] * v0[t * stride + h * d + i];
            for (int i = 0; i < d; i++) {
                const double want_v = v0[t * stride + h * d + i] / sqrt(ss + eps2) * scale;
                const double e = fabs(v[t * stride + h * d + i] - want_v);
                if (!(e <= err)) err = isnan(e) ? INFINITY : e;
            }
        }
        for (int i = nh * d; i < stride; i++) pad_ok &= v[t * stride + i] == v0[t * stride + i];
    }
    CHECKF(err <= 1e-6, "l2norm_heads: error %.3g", err);
    CHECK(pad_ok);
    free(v), free(v0);
}

static void test_elementwise(void) {
    const long n = 203;
    float *g = rnd((size_t)n, 6.0f), *u = rnd((size_t)n, 2.0f), *y = poisoned((size_t)n);
    double *want = dmalloc((size_t)n);
    const double k = sqrt(2.0 / M_PI);

    for (long i = 0; i < n; i++) want[i] = silu_d(g[i]) * u[i];
    op_silu_mul(be, y, g, u, n);
    CHECK_CLOSE("silu_mul", y, want, (size_t)n, 1e-6);
    for (long i = 0; i < n; i++) {
        const double v = g[i];
        want[i] = 0.5 * v * (1.0 + tanh(k * (v + 0.044715 * v * v * v))) * u[i];
    }
    poison(y, (size_t)n);
    op_gelu_tanh_mul(be, y, g, u, n);
    CHECK_CLOSE("gelu_tanh_mul", y, want, (size_t)n, 1e-6);

    memcpy(y, g, (size_t)n * sizeof *y);
    for (long i = 0; i < n; i++) want[i] = 2.5 * tanh(g[i] / 2.5);
    op_softcap(be, y, 2.5f, n);
    CHECK_CLOSE("softcap", y, want, (size_t)n, 1e-6);

    memcpy(y, g, (size_t)n * sizeof *y);
    for (long i = 0; i < n; i++) want[i] = (double)g[i] * -0.3f;
    op_scale(be, y, -0.3f, n);
    CHECK_CLOSE("scale", y, want, (size_t)n, 1e-7);

    memcpy(y, g, (size_t)n * sizeof *y);
    for (long i = 0; i < n; i++) want[i] = (double)g[i] + u[i];
    op_add(be, y, u, n);
    CHECK_CLOSE("add", y, want, (size_t)n, 1e-7);

    poison(y, (size_t)n);
    for (long i = 0; i < n; i++) want[i] = u[i] * sigmoid_d(g[i]);
    op_sigmoid_mul(be, y, u, g, n);
    CHECK_CLOSE("sigmoid_mul", y, want, (size_t)n, 1e-6);

    /* mul_rows over strided rows, with and without a bias */
    const int rows = 4, w = 7, as = 9, bs = 11;
    float *a = rnd((size_t)rows * as, 1.0f), *b = rnd((size_t)rows * bs, 1.0f), *bias = rnd((size_t)w, 1.0f);
    float *ym = poisoned((size_t)rows * w);
    double *wm = dmalloc((size_t)rows * w);
    for (int pass = 0; pass < 2; pass++) {
        const float *bb = pass ? bias : NULL;
        for (int t = 0; t < rows; t++)
            for (int i = 0; i < w; i++)
                wm[t * w + i] = (double)a[t * as + i] * ((double)b[t * bs + i] + (bb ? bb[i] : 0.0));
        poison(ym, (size_t)rows * w);
        op_mul_rows(be, ym, a, as, b, bs, bb, rows, w);
        CHECK_CLOSE(pass ? "mul_rows bias" : "mul_rows", ym, wm, (size_t)rows * w, 1e-6);
    }
    /* gated_add_rows: one gate per row */
    float *ga = rnd((size_t)rows * w, 1.0f), *gy = rnd((size_t)rows * w, 1.0f), *gg = rnd((size_t)rows, 4.0f);
    for (int t = 0; t < rows; t++)
        for (int i = 0; i < w; i++) wm[t * w + i] = ga[t * w + i] + sigmoid_d(gg[t]) * gy[t * w + i];
    poison(ym, (size_t)rows * w);
    op_gated_add_rows(be, ym, ga, gy, gg, rows, w);
    CHECK_CLOSE("gated_add_rows", ym, wm, (size_t)rows * w, 1e-6);

    /* deltanet_gates, a softplus argument past 20 included */
    const int nr = 3, nv = 5;
    float *beta = rnd((size_t)nr * nv, 5.0f), *gt = rnd((size_t)nr * nv, 4.0f);
    float *A = rnd((size_t)nv, 1.0f), *dt = rnd((size_t)nv, 1.0f);
    gt[7] = 30.0f;
    double *wb = dmalloc((size_t)nr * nv), *wg = dmalloc((size_t)nr * nv);
    for (int t = 0; t < nr; t++)
        for (int h = 0; h < nv; h++) {
            wb[t * nv + h] = sigmoid_d(beta[t * nv + h]);
            wg[t * nv + h] = A[h] * log1p(exp((double)gt[t * nv + h] + dt[h]));
        }
    op_deltanet_gates(be, beta, gt, A, dt, nr, nv);
    CHECK_CLOSE("deltanet_gates beta", beta, wb, (size_t)nr * nv, 1e-6);
    CHECK_CLOSE("deltanet_gates g", gt, wg, (size_t)nr * nv, 1e-6);

    free(g), free(u), free(y), free(want), free(a), free(b), free(bias), free(ym), free(wm);
    free(ga), free(gy), free(gg), free(beta), free(gt), free(A), free(dt), free(wb), free(wg);
}

/* ---- RoPE ---- */

static void test_rope(int interleaved, int with_freq) {
    const int n_rows = 3, n_heads = 2, head_dim = 11, n_rot = 6, half = n_rot / 2;
    const size_t N = (size_t)n_rows * n_heads * head_dim;
    const int32_t pos[3] = {0, 7, 123}, freq[3] = {1, 0, 1};
    float inv_freq[2 * 3];
    for (int i = 0; i < 2 * half; i++) inv_freq[i] = powf(10000.0f, -(float)(i % half) / half) * (i < half ? 1 : 0.25f);
    float *x = rnd(N, 1.0f), *x0 = fmalloc(N);
    memcpy(x0, x, N * sizeof *x);
    double *want = dmalloc(N);
    const float scale = 0.9f;
    for (int t = 0; t < n_rows; t++)
        for (int h = 0; h < n_heads; h++) {
            const float *a = x0 + ((size_t)t * n_heads + h) * head_dim;
            double *o = want + ((size_t)t * n_heads + h) * head_dim;
            for (int i = 0; i < head_dim; i++) o[i] = a[i]; /* past n_rot: as it was */
            for (int i = 0; i < half; i++) {
                const float f = inv_freq[(with_freq ? freq[t] : 0) * half + i];
                const double ang = (float)pos[t] * f, c = cos(ang) * scale, s = sin(ang) * scale;
                const int p = interleaved ? 2 * i : i, q = interleaved ? 2 * i + 1 : i + half;
                o[p] = a[p] * c - a[q] * s;
                o[q] = a[q] * c + a[p] * s;
            }
        }
    op_rope(be, x, pos, with_freq ? freq : NULL, inv_freq, scale, n_rows, n_heads, head_dim, n_rot, interleaved);
    CHECK_CLOSE(interleaved ? "rope interleaved" : "rope", x, want, N, 1e-6);
    free(x), free(x0), free(want);
}

/* ---- the paged KV cache and attention ---- */

enum { N_BLOCKS = 8 };

/* Pool row of position p: the test's own reading of the block table. */
static int64_t pool_row(const int32_t *blocks, int p) {
    return (int64_t)blocks[p / KV_BLOCK] * KV_BLOCK + p % KV_BLOCK;
}

static float kv_round(enum gb_type t, float v) { return t == GB_TYPE_F16 ? f16_to_f32(f32_to_f16(v)) : v; }

static void pool_put(void *pool, enum gb_type t, size_t i, float v) {
    if (t == GB_TYPE_F16) ((uint16_t *)pool)[i] = f32_to_f16(v);
    else ((float *)pool)[i] = v;
}

/* kv_store alone: each row to its pool row, as f32 or f16 (nearest even); the rest of the
 * pool (other rows, the padding past width) untouched. */
static void test_kv_store(enum gb_type t) {
    const int width = 23, stride = width + 4, n = 5, n_pool = 40;
    const size_t esz = t == GB_TYPE_F16 ? 2 : 4, P = (size_t)n_pool * stride;
    unsigned char *pool = malloc(P * esz), *pool0 = malloc(P * esz);
    for (size_t i = 0; i < P * esz; i++) pool[i] = (unsigned char)test_rand_u64(&rng);
    memcpy(pool0, pool, P * esz);
    float *x = rnd((size_t)n * width, 3.0f);
    x[2] = 1.0f + 1.0f / 2048; /* halfway between two f16 values: rounds to even (1.0) */
    const int32_t kv_row[5] = {17, 3, 39, 0, 22};
    op_kv_store(be, pool, t, x, kv_row, n, width, stride);
    int ok = 1;
    for (size_t i = 0; i < P; i++) {
        const int r = (int)(i / stride), c = (int)(i % stride);
        int tr = -1;
        for (int k = 0; k < n; k++)
            if (kv_row[k] == r) tr = k;
        if (tr < 0 || c >= width) ok &= memcmp(pool + i * esz, pool0 + i * esz, esz) == 0;
        else if (t == GB_TYPE_F16) ok &= ((uint16_t *)pool)[i] == f32_to_f16(x[tr * width + c]);
        else ok &= ((float *)pool)[i] == x[tr * width + c];
    }
    CHECKF(ok, "kv_store %s", type_name(t));
    if (t == GB_TYPE_F16) CHECK(((uint16_t *)pool)[(size_t)17 * stride + 2] == 0x3c00);
    free(pool), free(pool0), free(x);
}

/* Two sequences of different lengths over scrambled blocks of one pool (everything else
 * in the pool NaN), GQA, odd head_dim; this batch's keys and values written by the test
 * or through kv_store. The definition works on each sequence's own [pos][kv] arrays. */
static void test_attention(enum gb_type t, int window, int through_store) {
    const int n_head = 6, n_head_kv = 2, hd = 19, kvw = n_head_kv * hd, kv_stride = kvw + 5;
    const int n_seq = 2, n_rows = 7;
    static const int32_t blocks0[2] = {5, 2}, blocks1[3] = {7, 0, 3};
    const struct gb_seg segs[2] = {
        {.row0 = 0, .n_rows = 2, .pos0 = 19, .blocks = blocks0, .state = 0},
        {.row0 = 2, .n_rows = 5, .pos0 = 29, .blocks = blocks1, .state = 1},
    };
    const size_t esz = t == GB_TYPE_F16 ? 2 : 4, P = (size_t)N_BLOCKS * KV_BLOCK * kv_stride;
    void *kc = malloc(P * esz), *vc = malloc(P * esz);
    for (size_t i = 0; i < P; i++) pool_put(kc, t, i, NAN), pool_put(vc, t, i, NAN);

    float *K[2], *V[2]; /* the sequences' keys and values [pos][kvw], as the cache holds them */
    float *knew = fmalloc((size_t)n_rows * kvw), *vnew = fmalloc((size_t)n_rows * kvw);
    int32_t kv_row[7];
    for (int s = 0; s < n_seq; s++) {
        const int n_pos = segs[s].pos0 + segs[s].n_rows;
        K[s] = fmalloc((size_t)n_pos * kvw);
        V[s] = fmalloc((size_t)n_pos * kvw);
        for (int p = 0; p < n_pos; p++) {
            const int row = p - segs[s].pos0 + segs[s].row0; /* the batch row, for new positions */
            if (p >= segs[s].pos0) kv_row[row] = (int32_t)pool_row(segs[s].blocks, p);
            for (int c = 0; c < kvw; c++) {
                const float kf = test_rand_f(&rng), vf = test_rand_f(&rng);
                K[s][(size_t)p * kvw + c] = kv_round(t, kf);
                V[s][(size_t)p * kvw + c] = kv_round(t, vf);
                const size_t off = (size_t)pool_row(segs[s].blocks, p) * kv_stride + c;
                if (p < segs[s].pos0 || !through_store) {
                    pool_put(kc, t, off, kf);
                    pool_put(vc, t, off, vf);
                } else {
                    knew[(size_t)row * kvw + c] = kf;
                    vnew[(size_t)row * kvw + c] = vf;
                }
            }
        }
    }
    if (through_store) {
        op_kv_store(be, kc, t, knew, kv_row, n_rows, kvw, kv_stride);
        op_kv_store(be, vc, t, vnew, kv_row, n_rows, kvw, kv_stride);
    }

    const size_t N = (size_t)n_rows * n_head * hd;
    float *q = rnd(N, 1.5f), *out = poisoned(N);
    double *want = dmalloc(N), *sc = dmalloc(64);
    const float scale = 1.0f / sqrtf((float)hd);
    for (int s = 0; s < n_seq; s++)
        for (int i = 0; i < segs[s].n_rows; i++) {
            const int p = segs[s].pos0 + i, row = segs[s].row0 + i;
            for (int h = 0; h < n_head; h++) {
                const int kvh = h / (n_head / n_head_kv);
                const float *qh = q + ((size_t)row * n_head + h) * hd;
                double mx = -INFINITY, sum = 0.0;
                for (int j = 0; j <= p; j++) {
                    sc[j] = -INFINITY;
                    if (window > 0 && p - j >= window) continue;
                    double d = 0.0;
                    for (int c = 0; c < hd; c++) d += (double)qh[c] * K[s][(size_t)j * kvw + kvh * hd + c];
                    sc[j] = d * scale;
                    mx = sc[j] > mx ? sc[j] : mx;
                }
                for (int j = 0; j <= p; j++) sum += sc[j] = exp(sc[j] - mx);
                for (int c = 0; c < hd; c++) {
                    double acc = 0.0;
                    for (int j = 0; j <= p; j++) acc += sc[j] * V[s][(size_t)j * kvw + kvh * hd + c];
                    want[((size_t)row * n_head + h) * hd + c] = acc / sum;
                }
            }
        }
    const struct attn_args a = {.q = q, .out = out, .k_cache = kc, .v_cache = vc, .kv_type = t,
                                .kv_stride = kv_stride, .n_head = n_head, .n_head_kv = n_head_kv, .head_dim = hd,
                                .window = window, .scale = scale, .segs = segs, .n_segs = n_seq};
    op_attention(be, &a);
    char what[64];
    snprintf(what, sizeof what, "attention %s window %d%s", type_name(t), window, through_store ? " kv_store" : "");
    CHECK_CLOSE(what, out, want, N, 1e-6);
    for (int s = 0; s < n_seq; s++) free(K[s]), free(V[s]);
    free(kc), free(vc), free(knew), free(vnew), free(q), free(out), free(want), free(sc);
}

/* ---- recurrent layers ---- */

/* conv1d over two sequences in two calls (1 + 5 rows, then 5 + 1: the segment order
 * swaps), each sequence's state carried between them in its slot; the definition runs
 * over each sequence's whole input history. */
static void test_conv1d(void) {
    const int C = 7, K = 4, H = K - 1, n_rows = 6, slot = H * C + 2, n_slots = 3;
    float *w = rnd((size_t)K * C, 1.0f), *st = rnd((size_t)n_slots * slot, 1.0f);
    float *st0 = fmalloc((size_t)n_slots * slot);
    memcpy(st0, st, (size_t)n_slots * slot * sizeof *st);
    const int slot_of[2] = {2, 0};
    /* the inputs of each sequence, oldest first: its initial state, then its rows */
    float *hist[2];
    int len[2];
    for (int q = 0; q < 2; q++) {
        hist[q] = fmalloc((size_t)(H + 2 * n_rows) * C);
        memcpy(hist[q], st + (size_t)slot_of[q] * slot, (size_t)H * C * sizeof(float));
        len[q] = H;
    }
    struct gb_state state = {.base = st, .slot_floats = (size_t)slot};
    float *x = fmalloc((size_t)n_rows * C), *y = fmalloc((size_t)n_rows * C);
    double *want = dmalloc((size_t)n_rows * C);
    for (int call = 0; call < 2; call++) {
        const int silu = call == 0;
        const int nr[2] = {call ? 5 : 1, call ? 1 : 5};         /* rows of sequence 0, 1 */
        const int first = nr[0] < nr[1] ? 0 : 1;                  /* segments by ascending n_rows */
        struct gb_seg segs[2];
        int row0 = 0;
        for (int i = 0; i < 2; i++) {
            const int q = i == 0 ? first : 1 - first;
            segs[i] = (struct gb_seg){.row0 = row0, .n_rows = nr[q], .state = slot_of[q]};
            for (int r = 0; r < nr[q]; r++) {
                fill(x + (size_t)(row0 + r) * C, (size_t)C, 1.0f);
                memcpy(hist[q] + (size_t)(len[q] + r) * C, x + (size_t)(row0 + r) * C, (size_t)C * sizeof(float));
                for (int c = 0; c < C; c++) {
                    double acc = 0.0;
                    const float *in = hist[q] + (size_t)(len[q] + r - H) * C; /* in[t + j] of state ++ x */
                    for (int j = 0; j < K; j++) acc += (double)w[j * C + c] * in[(size_t)j * C + c];
                    want[(size_t)(row0 + r) * C + c] = silu ? silu_d(acc) : acc;
                }
            }
            len[q] += nr[q];
            row0 += nr[q];
        }
        poison(y, (size_t)n_rows * C);
        op_conv1d(be, y, x, state, w, C, K, silu, segs, 2);
        CHECK_CLOSE(call ? "conv1d call 2" : "conv1d call 1", y, want, (size_t)n_rows * C, 1e-6);
        int ok = 1; /* each slot: the last K-1 inputs of its sequence; the rest as it was */
        for (int q = 0; q < 2; q++)
            ok &= same_bits(st + (size_t)slot_of[q] * slot, hist[q] + (size_t)(len[q] - H) * C, (size_t)H * C);
        for (int i = 0; i < n_slots * slot; i++)
            if (i / slot == 1 || i % slot >= H * C) ok &= st[i] == st0[i];
        CHECKF(ok, "conv1d state after call %d", call + 1);
    }
    free(w), free(st), free(st0), free(hist[0]), free(hist[1]), free(x), free(y), free(want);
}

/* The gated delta rule against the recurrence on S [dk][dv] in double, two sequences
 * over two calls (1 + 4 rows, then 4 + 1), states carried in their slots. */
static void test_delta_rule(int v_tiled) {
    const int nk = 2, nv = 4, dk = 5, dv = 3, n_rows = 5;
    const int qkd = nk * dk, C = 2 * qkd + nv * dv + 3; /* [q | k | v | pad] */
    const int slot = nv * dv * dk + 3, n_slots = 3, slot_of[2] = {1, 2};
    float *st = rnd((size_t)n_slots * slot, 0.5f), *st0 = fmalloc((size_t)n_slots * slot);
    memcpy(st0, st, (size_t)n_slots * slot * sizeof *st);
    double *S[2]; /* per sequence [nv][dk][dv] */
    for (int q = 0; q < 2; q++) {
        S[q] = dmalloc((size_t)nv * dk * dv);
        for (int h = 0; h < nv; h++)
            for (int i = 0; i < dk; i++)
                for (int j = 0; j < dv; j++)
                    S[q][((size_t)h * dk + i) * dv + j] = st[(size_t)slot_of[q] * slot + ((size_t)h * dv + j) * dk + i];
    }
    float *x = fmalloc((size_t)n_rows * C), *g = fmalloc((size_t)n_rows * nv), *beta = fmalloc((size_t)n_rows * nv);
    float *out = fmalloc((size_t)n_rows * nv * dv);
    double *want = dmalloc((size_t)n_rows * nv * dv), *u = dmalloc((size_t)dv);
    for (int call = 0; call < 2; call++) {
        fill(x, (size_t)n_rows * C, 1.0f);
        for (int r = 0; r < n_rows; r++) /* unit keys, queries scaled by dk^-1/2, as the model gives them */
            for (int hk = 0; hk < nk; hk++) {
                float *k = x + (size_t)r * C + qkd + hk * dk, *qv = x + (size_t)r * C + hk * dk;
                double ss = 0.0;
                for (int i = 0; i < dk; i++) ss += (double)k[i] * k[i];
                for (int i = 0; i < dk; i++) k[i] = (float)(k[i] / sqrt(ss)), qv[i] /= sqrtf((float)dk);
            }
        for (int i = 0; i < n_rows * nv; i++) {
            g[i] = -0.5f * (1.0f + test_rand_f(&rng));
            beta[i] = 0.5f * (1.0f + test_rand_f(&rng));
        }
        const int nr[2] = {call ? 4 : 1, call ? 1 : 4};
        const int first = nr[0] < nr[1] ? 0 : 1;
        struct gb_seg segs[2];
        int row0 = 0;
        for (int i = 0; i < 2; i++) {
            const int q = i == 0 ? first : 1 - first;
            segs[i] = (struct gb_seg){.row0 = row0, .n_rows = nr[q], .state = slot_of[q]};
            for (int r = row0; r < row0 + nr[q]; r++)
                for (int h = 0; h < nv; h++) {
                    const int hk = v_tiled ? h % nk : h / (nv / nk);
                    const float *qv = x + (size_t)r * C + hk * dk, *k = qv + qkd;
                    const float *v = x + (size_t)r * C + 2 * qkd + h * dv;
                    double *Sh = S[q] + (size_t)h * dk * dv;
                    const double decay = exp((double)g[r * nv + h]), b = beta[r * nv + h];
                    for (int e = 0; e < dk * dv; e++) Sh[e] *= decay;
                    for (int j = 0; j < dv; j++) {
                        double kv = 0.0;
                        for (int i2 = 0; i2 < dk; i2++) kv += Sh[i2 * dv + j] * k[i2];
                        u[j] = b * (v[j] - kv);
                    }
                    for (int i2 = 0; i2 < dk; i2++)
                        for (int j = 0; j < dv; j++) Sh[i2 * dv + j] += k[i2] * u[j];
                    for (int j = 0; j < dv; j++) {
                        double o = 0.0;
                        for (int i2 = 0; i2 < dk; i2++) o += Sh[i2 * dv + j] * qv[i2];
                        want[((size_t)r * nv + h) * dv + j] = o;
                    }
                }
            row0 += nr[q];
        }
        const struct delta_args a = {.x = x, .qk_stride = C, .v_stride = C, .q_off = 0, .k_off = qkd,
                                     .v_off = 2 * qkd, .g = g, .beta = beta, .out = out,
                                     .state = {.base = st, .slot_floats = (size_t)slot}, .nk = nk, .nv = nv,
                                     .dk = dk, .dv = dv, .v_tiled = v_tiled, .segs = segs, .n_segs = 2};
        poison(out, (size_t)n_rows * nv * dv);
        op_delta_rule(be, &a);
        char what[64];
        snprintf(what, sizeof what, "delta_rule%s call %d", v_tiled ? " v_tiled" : "", call + 1);
        CHECK_CLOSE(what, out, want, (size_t)n_rows * nv * dv, 1e-5);
        double serr = 0.0;
        int pad_ok = 1;
        for (int q = 0; q < 2; q++)
            for (int h = 0; h < nv; h++)
                for (int i = 0; i < dk; i++)
                    for (int j = 0; j < dv; j++) {
                        const float got = st[(size_t)slot_of[q] * slot + ((size_t)h * dv + j) * dk + i];
                        const double e = fabs(got - S[q][((size_t)h * dk + i) * dv + j]);
                        if (!(e <= serr)) serr = isnan(e) ? INFINITY : e;
                    }
        for (int i = 0; i < n_slots * slot; i++)
            if (i / slot == 0 || i % slot >= nv * dv * dk) pad_ok &= st[i] == st0[i];
        CHECKF(serr <= 1e-5, "%s: state error %.3g (seed %llu)", what, serr, seed0);
        CHECK(pad_ok);
    }
    free(st), free(st0), free(S[0]), free(S[1]), free(x), free(g), free(beta), free(out), free(want), free(u);
}

/* ---- mixture of experts ---- */

static void test_moe_route(int norm) {
    enum { N = 4, E = 7, KS = 3 };
    float logits[N * E], l0[N * E], wsel[N * KS];
    int32_t ids[N * KS];
    fill(logits, (size_t)N * E, 3.0f);
    const float tie[E] = {0.5f, 2.0f, 2.0f, -1.0f, 2.0f, 0.1f, 2.0f}; /* four equal: the lowest three win */
    memcpy(logits, tie, sizeof tie);
    for (int e = 0; e < E; e++) logits[2 * E + e] = 0.25f; /* all equal */
    memcpy(l0, logits, sizeof logits);
    for (int i = 0; i < N * KS; i++) wsel[i] = NAN, ids[i] = -7;
    op_moe_route(be, ids, wsel, logits, N, E, KS, norm);
    int ok = 1;
    double want[N * KS];
    for (int t = 0; t < N; t++) {
        const float *l = l0 + t * E;
        double p[E], mx = l[0], sum = 0.0, ksum = 0.0;
        for (int e = 1; e < E; e++) mx = l[e] > mx ? l[e] : mx;
        for (int e = 0; e < E; e++) sum += p[e] = exp(l[e] - mx);
        int taken[E] = {0};
        for (int s = 0; s < KS; s++) { /* the largest remaining logit; the lower index first */
            int best = -1;
            for (int e = 0; e < E; e++)
                if (!taken[e] && (best < 0 || l[e] > l[best])) best = e;
            taken[best] = 1;
            ok &= ids[t * KS + s] == best;
            want[t * KS + s] = p[best] / sum;
            ksum += p[best] / sum;
        }
        if (norm)
            for (int s = 0; s < KS; s++) want[t * KS + s] /= ksum;
    }
    CHECKF(ok, "moe_route ids (norm %d, seed %llu)", norm, seed0);
    CHECK(ids[0] == 1 && ids[1] == 2 && ids[2] == 4 && ids[2 * KS] == 0 && ids[2 * KS + 2] == 2);
    CHECK_CLOSE(norm ? "moe_route wsel norm" : "moe_route wsel", wsel, want, (size_t)N * KS, 1e-6);
}

/* The order of the sum is the spec (ascending id, equal ids in slot order): rows built
 * so that any other order rounds to another value, then random rows. */
static void test_moe_combine(void) {
    enum { N = 4, KS = 3, W = 5 };
    int32_t ids[N * KS] = {2, 0, 1, 1, 1, 0};
    float y[N * KS * W], wsel[N * KS], out[N * W];
    fill(y, (size_t)N * KS * W, 1.0f);
    for (int i = 0; i < 2 * KS; i++) wsel[i] = 1.0f;
    for (int i = 2 * KS; i < N * KS; i++) ids[i] = rand_int(9), wsel[i] = test_rand_f(&rng);
    /* row 0, ids 2 0 1: (1e8 + 1) - 1e8 = 0 in id order (slot order would give 1) */
    const float r0[KS] = {-1e8f, 1e8f, 1.0f};
    /* row 1, ids 1 1 0: (1e8 - 1e8) + 1 = 1 with slot 0 before slot 1 (else 0) */
    const float r1[KS] = {-1e8f, 1.0f, 1e8f};
    for (int s = 0; s < KS; s++)
        for (int j = 0; j < W; j++) y[(0 * KS + s) * W + j] = r0[s], y[(1 * KS + s) * W + j] = r1[s];
    double want[N * W];
    for (int t = 0; t < N; t++)
        for (int j = 0; j < W; j++) {
            double acc = 0.0;
            for (int s = 0; s < KS; s++) acc += (double)wsel[t * KS + s] * y[(t * KS + s) * W + j];
            want[t * W + j] = acc;
        }
    poison(out, (size_t)N * W);
    op_moe_combine(be, out, y, ids, wsel, N, KS, W);
    int ok = 1;
    for (int j = 0; j < W; j++) ok &= out[j] == 0.0f && out[W + j] == 1.0f;
    CHECKF(ok, "moe_combine order: row 0 %g (want 0), row 1 %g (want 1)", out[0], out[W]);
    CHECK_CLOSE("moe_combine", out + 2 * W, want + 2 * W, (size_t)(N - 2) * W, 1e-6);
}

int main(int argc, char **argv) {
    seed0 = argc > 1 ? strtoull(argv[1], NULL, 0)
                     : (unsigned long long)time(NULL) ^ ((unsigned long long)getpid() << 32);
    if (!seed0) seed0 = 1; /* xorshift's one fixed point */
    rng = seed0;
    printf("test_ref_backend: seed %llu (rerun with this argument to reproduce)\n", seed0);
    be = backend_ref_new();
    if (!be) { fprintf(stderr, "backend_ref_new failed\n"); return 1; }

    test_buffers();
    const enum gb_type wt[3] = {GB_TYPE_F32, GB_TYPE_BF16, GB_TYPE_Q8_0};
    for (int i = 0; i < 3; i++) {
        const int n_in = wt[i] == GB_TYPE_Q8_0 ? 96 : 37;
        test_matmul(wt[i], 3, n_in, 13, 1);
        test_matmul(wt[i], 1, n_in, 5, 0);
    }
    test_matmul_multi();
    test_matmul_id(0);
    test_matmul_id(1);
    test_rows();
    test_norms();
    test_elementwise();
    for (int i = 0; i < 4; i++) test_rope(i & 1, i >> 1);
    test_kv_store(GB_TYPE_F32);
    test_kv_store(GB_TYPE_F16);
    const enum gb_type kt[2] = {GB_TYPE_F32, GB_TYPE_F16};
    const int windows[3] = {0, 7, 40};
    for (int i = 0; i < 2; i++)
        for (int w = 0; w < COUNT(windows); w++)
            for (int st = 0; st < 2; st++) test_attention(kt[i], windows[w], st);
    test_conv1d();
    test_delta_rule(0);
    test_delta_rule(1);
    test_moe_route(0);
    test_moe_route(1);
    test_moe_combine();

    backend_free(be);
    return test_done();
}
