/* Every op of the backend table on the CUDA backend against the reference backend
 * (ref_backend.c, the specification), as tests/test_backend_ops.c does for the CPU: the same
 * random inputs of odd sizes go to both, device outputs are poisoned with NaN first (an
 * element an op skips cannot pass; rows an op must leave alone must keep the poison), and
 * results are compared within a bound argued per op:
 *  - matmul / matmul_multi / matmul_id, every weight format (f32/f16/bf16, the GGML block
 *    types, MLX 2-8 bits x groups 32/64/128 x f32/f16/bf16 scales): the weights dequantize to
 *    the reference's values exactly (no contraction: -fmad=false), and the products are f32
 *    fused multiply-adds summed per lane then across the warp, so the recursive-summation
 *    bound (n_in + 8) 2^-24 sum |w x| + 2^-22 (|y| + |bias|) holds; rows of one call have the
 *    bits of each segment alone (batch invariance: 1-row and 8-row kernels alike), and
 *    matmul_multi the bits of separate matmul calls;
 *  - get_rows, gather_rows, copy_strided, kv_store, moe ids: exact bits;
 *  - ops with exp / tanh / log1p (CUDA's are within 2 ulp of the host's) or a sum in
 *    another order: 1e-6 relative + 1e-6 absolute (outputs that cancel: rope, gated_add_rows);
 *  - attention: f32 scores and an online softmax against double: 2e-5 absolute, and the
 *    segments of one call the bits of each alone;
 *  - delta rule: the recurrence with sums in double, as the reference: 1e-5 (1 + |want|) for
 *    outputs and states over two calls.
 * Without a CUDA device (or in a build without the backend) it skips (exit 77). The seed is
 * printed; pass it back as argv[1] to replay a run. */
#include "backend/backend.h"
#include "base/fp16.h"
#include "tensor/dtype.h"
#include "tensor/quant.h"
#include "tensor/quant_ref.h"
#include "tensor/weight.h"
#include "test.h"

#include <stdint.h>
#include <string.h>
#include <time.h>

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

static unsigned long long rng, seed0;
static struct backend *ref, *cu;

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) { fprintf(stderr, "out of memory\n"); exit(1); }
    return p;
}
static float *fmalloc(size_t n) { return xmalloc(n * sizeof(float)); }
#define POISON_BITS 0x7fc0deadu
static void poison(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = fp32_from_bits(POISON_BITS);
}
static int rand_int(int n) { return (int)(test_rand_u64(&rng) % (unsigned long long)n); }
static float *rnd(size_t n, float scale) {
    float *p = fmalloc(n);
    for (size_t i = 0; i < n; i++) p[i] = scale * test_rand_f(&rng);
    return p;
}
static float *rnd_x(size_t n) {
    float *p = fmalloc(n);
    for (size_t i = 0; i < n; i++) p[i] = test_rand_f(&rng) * (1.0f + (float)(i % 7));
    return p;
}

/* ---- device buffers ---- */
static void *dput(const void *h, size_t n) {
    void *d = cu->ops->alloc(cu, n, 0);
    if (!d) { fprintf(stderr, "cuda alloc of %zu bytes failed\n", n); exit(1); }
    cu->ops->upload(cu, d, h, n);
    return d;
}
static float *dpoison(size_t n) {
    float *h = fmalloc(n);
    poison(h, n);
    float *d = dput(h, n * sizeof(float));
    free(h);
    return d;
}
static float *dget(const void *d, size_t n) { /* n floats back */
    float *h = fmalloc(n);
    cu->ops->download(cu, h, d, n * sizeof(float));
    return h;
}
static void dfree(void *d) { cu->ops->buf_free(cu, d, 0); }

/* got against want: |got - want| <= rel |want| + abs (rel < 0: the same bits), or tol[i]. */
static int cmp_tol(const char *what, const float *got, const float *want, size_t n, double rel, double abs_,
                   const double *tol) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        int ok = fp32_to_bits(got[i]) == fp32_to_bits(want[i]); /* the same bits (poison left alone) pass */
        if (ok) continue;
        if (tol) ok = fabs((double)got[i] - (double)want[i]) <= tol[i];
        else if (rel < 0) ok = fp32_to_bits(got[i]) == fp32_to_bits(want[i]);
        else ok = fabs((double)got[i] - (double)want[i]) <= rel * fabs((double)want[i]) + abs_ + 1e-30;
        if (ok) continue;
        if (bad < 3)
            fprintf(stderr, "  %s: [%zu] = %.9g, want %.9g (tol %.3g)\n", what, i, got[i], want[i],
                    tol ? tol[i] : rel < 0 ? 0.0 : rel * fabs((double)want[i]) + abs_);
        bad++;
    }
    CHECKF(bad == 0, "%s: %zu of %zu elements off (seed %llu)", what, bad, n, seed0);
    return bad == 0;
}
static int cmp(const char *what, const float *got, const float *want, size_t n, double rel, double abs_) {
    return cmp_tol(what, got, want, n, rel, abs_, NULL);
}

/* A one-segment-per-call batch for ops that take the batch's host arrays. */
static void begin(int n_rows, const struct gb_seg *segs, int n_segs, const int32_t *tok, const int32_t *kv_row,
                  const int32_t *pos, const int32_t *seg_of, const int32_t *span) {
    const struct gb_batch b = {.n_rows = n_rows, .n_segs = n_segs, .segs = segs, .span = span, .seg_of = seg_of,
                               .tok = tok, .kv_row = kv_row, .pos = pos};
    cu->ops->batch_begin(cu, &b);
    ref->ops->batch_begin(ref, &b);
}

/* ===================================================================== buffers */

static void test_buffers(void) {
    const struct backend_ops *o = cu->ops;
    const size_t n = (3u << 20) + 4 * (size_t)rand_int(1000);
    unsigned char *a = o->alloc(cu, n, GB_BUF_ZERO), *b = o->alloc(cu, n, GB_BUF_LAZY);
    CHECK(a && b);
    unsigned char *h = xmalloc(n), *h2 = xmalloc(n);
    o->download(cu, h2, a, n);
    int zero = 1;
    for (size_t i = 0; i < n; i++) zero &= h2[i] == 0;
    CHECKF(zero, "alloc(GB_BUF_ZERO) is not zero");
    for (size_t i = 0; i < n; i++) h[i] = (unsigned char)test_rand_u64(&rng);
    o->upload(cu, a, h, n);
    o->copy(cu, b, a, n);
    o->copy(cu, a + 1, a, n / 2); /* overlapping */
    o->zero(cu, a + n / 2 + 1, n - n / 2 - 1);
    o->sync(cu);
    o->download(cu, h2, b, n);
    CHECKF(memcmp(h, h2, n) == 0, "upload, copy, download of %zu bytes", n);
    o->download(cu, h2, a, n);
    int ok = h2[0] == h[0];
    for (size_t i = 1; i < n; i++) ok &= h2[i] == (i <= n / 2 ? h[i - 1] : 0);
    CHECKF(ok, "an overlapping copy or zero of %zu bytes", n);
    o->buf_free(cu, a, n);
    o->buf_free(cu, b, n);
    free(h), free(h2);
}

/* ===================================================================== weights */

struct fmt {
    enum gb_weight_kind kind;
    enum gb_type type, sbt;
    int bits, gs;
};
static const enum gb_type PLAIN[] = {GB_TYPE_F32,  GB_TYPE_F16,  GB_TYPE_BF16, GB_TYPE_Q4_0, GB_TYPE_Q4_1,
                                     GB_TYPE_Q5_0, GB_TYPE_Q5_1, GB_TYPE_Q8_0, GB_TYPE_Q2_K, GB_TYPE_Q3_K,
                                     GB_TYPE_Q4_K, GB_TYPE_Q5_K, GB_TYPE_Q6_K};
static const int MLX_BITS[] = {2, 3, 4, 5, 6, 8}, MLX_GS[] = {32, 64, 128};
static const enum gb_type SBT[] = {GB_TYPE_F16, GB_TYPE_BF16, GB_TYPE_F32};

static int is_float_fmt(const struct fmt *f) {
    return f->kind == GB_WEIGHT_PLAIN && (f->type == GB_TYPE_F32 || f->type == GB_TYPE_F16 || f->type == GB_TYPE_BF16);
}
static int all_formats(struct fmt *out) {
    int n = 0;
    for (int i = 0; i < COUNT(PLAIN); i++) out[n++] = (struct fmt){.kind = GB_WEIGHT_PLAIN, .type = PLAIN[i]};
    for (int b = 0; b < COUNT(MLX_BITS); b++)
        for (int g = 0; g < COUNT(MLX_GS); g++)
            out[n++] = (struct fmt){.kind = GB_WEIGHT_MLX, .type = GB_TYPE_U32, .bits = MLX_BITS[b], .gs = MLX_GS[g],
                                    .sbt = SBT[(b + g) % 3]};
    return n;
}
/* a short row (fewer chunks than lanes) and a long one (lanes loop) */
static int fmt_n_in(const struct fmt *f, int big) {
    if (f->kind == GB_WEIGHT_MLX) return big ? 128 * 11 : 384;
    if (is_float_fmt(f)) return big ? 1101 : 75;
    return type_traits(f->type)->block_size == QK_K ? (big ? 256 * 9 : 512) : (big ? 32 * 41 : 160);
}

struct tw {
    struct gb_weight w, wc; /* host (ref) and device (cuda) */
    void *data, *sc, *bi;
    float *deq;
    char name[48];
};

/* n_mat matrices of n_out rows stacked in one tensor: w is the whole, the views made by the
 * caller (weight_rows). */
static void make_tw(struct tw *t, const struct fmt *f, int n_out, int n_in) {
    memset(t, 0, sizeof *t);
    if (f->kind == GB_WEIGHT_PLAIN) snprintf(t->name, sizeof t->name, "%s", type_name(f->type));
    else snprintf(t->name, sizeof t->name, "mlx%d gs%d %s", f->bits, f->gs, type_name(f->sbt));
    float *src = fmalloc((size_t)n_in);
    if (f->kind == GB_WEIGHT_MLX) {
        const size_t ng = (size_t)(n_in / f->gs), esz = type_traits(f->sbt)->type_size, rb = (size_t)n_in * f->bits / 8;
        t->data = xmalloc(rb * (size_t)n_out);
        t->sc = xmalloc((size_t)n_out * ng * esz);
        t->bi = xmalloc((size_t)n_out * ng * esz);
        for (int o = 0; o < n_out; o++) {
            float scale = 0.01f + (float)rand_int(1000) / 100.0f;
            for (int i = 0; i < n_in; i++) src[i] = test_rand_f(&rng) * scale + (o % 2 ? scale : 0.0f);
            quantize_row_mlx_ref(src, (uint32_t *)((char *)t->data + (size_t)o * rb), (char *)t->sc + (size_t)o * ng * esz,
                                 (char *)t->bi + (size_t)o * ng * esz, f->sbt, f->bits, f->gs, n_in);
        }
        t->w = (struct gb_weight){.kind = GB_WEIGHT_MLX, .type = GB_TYPE_U32, .n_out = n_out, .n_in = n_in,
                                  .data = t->data, .row_bytes = rb, .bits = f->bits, .group_size = f->gs,
                                  .sb_type = f->sbt, .scales = t->sc, .biases = t->bi, .name = t->name};
    } else if (is_float_fmt(f)) {
        const size_t esz = f->type == GB_TYPE_F32 ? 4 : 2, nn = (size_t)n_out * n_in;
        t->data = xmalloc(nn * esz);
        for (size_t k = 0; k < nn; k++) {
            const float v = test_rand_f(&rng) * (0.01f + (float)(k / (size_t)n_in % 13));
            if (f->type == GB_TYPE_F32) ((float *)t->data)[k] = v;
            else if (f->type == GB_TYPE_F16) ((uint16_t *)t->data)[k] = f32_to_f16(v);
            else ((uint16_t *)t->data)[k] = f32_to_bf16(v);
        }
        t->w = (struct gb_weight){.kind = GB_WEIGHT_PLAIN, .type = f->type, .n_out = n_out, .n_in = n_in,
                                  .data = t->data, .row_bytes = (size_t)n_in * esz, .name = t->name};
    } else {
        const struct gb_quant_fns qf = quant_fns(f->type);
        const size_t rb = type_row_size(f->type, n_in);
        t->data = xmalloc(rb * (size_t)n_out);
        for (int o = 0; o < n_out; o++) {
            float scale = 0.01f + (float)rand_int(1000) / 100.0f, shift = o % 3 == 0 ? scale * 0.5f : 0.0f;
            for (int i = 0; i < n_in; i++) src[i] = test_rand_f(&rng) * scale + shift;
            qf.from_float(src, (char *)t->data + (size_t)o * rb, n_in);
        }
        t->w = (struct gb_weight){.kind = GB_WEIGHT_PLAIN, .type = f->type, .n_out = n_out, .n_in = n_in,
                                  .data = t->data, .row_bytes = rb, .name = t->name};
    }
    t->deq = fmalloc((size_t)n_out * n_in);
    for (int o = 0; o < n_out; o++) weight_get_row(&t->w, o, t->deq + (size_t)o * n_in);
    free(src);
}
static void free_tw(struct tw *t) { free(t->data), free(t->sc), free(t->bi), free(t->deq); }

/* The device copy of views w[0 .. n) (weight_prepare on the CUDA backend). */
static void prepare(struct gb_weight *w, int n) {
    cu->ops->weight_prepare(cu, w, n, 0);
    CHECKF(cu->ops->weight_status(cu) == GERBIL_OK, "weight_prepare: %s", gerbil_last_error());
}

static double *mm_tol(const float *deq, const float *x, int n, int n_in, int n_out, const float *yref,
                      const float *bias) {
    double *tol = xmalloc((size_t)n * n_out * sizeof *tol);
    for (int r = 0; r < n; r++)
        for (int o = 0; o < n_out; o++) {
            double s = 0.0;
            for (int i = 0; i < n_in; i++) s += fabs((double)deq[(size_t)o * n_in + i] * x[(size_t)r * n_in + i]);
            const size_t k = (size_t)r * n_out + o;
            tol[k] = (n_in + 8) * 0x1p-24 * s + 0x1p-22 * (fabs((double)yref[k]) + (bias ? fabs((double)bias[o]) : 0.0)) +
                     1e-30;
        }
    return tol;
}

static const int SEGS_A[] = {1, 1, 3, 5, 17, 33}; /* prefill chunks among decode rows */
static const int SEGS_B[] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                             1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}; /* batched decode */

static void test_matmul(const struct fmt *f, int big) {
    const int n_out = big ? 67 : 37, n_in = fmt_n_in(f, big);
    struct tw t;
    make_tw(&t, f, n_out, n_in);
    t.wc = t.w;
    prepare(&t.wc, 1);
    float *bias = rnd((size_t)n_out, 1.0f);
    float *dbias = dput(bias, (size_t)n_out * sizeof(float));
    static const int NS[] = {1, 3, 17, 40};
    /* matmul_multi's second matrix, alive as long as t (weights outlive their backend) */
    struct tw t2;
    const struct fmt f2 = {.kind = GB_WEIGHT_PLAIN, .type = GB_TYPE_Q8_0};
    if (n_in % 32 == 0) {
        make_tw(&t2, &f2, 21, n_in);
        t2.wc = t2.w;
        prepare(&t2.wc, 1);
    }
    char what[160];
    for (int k = 0; k <= COUNT(NS) + 1; k++) {
        int n = k < COUNT(NS) ? NS[k] : 0, nseg = 0;
        int32_t *span = NULL;
        const int *SEGS = k == COUNT(NS) ? SEGS_A : SEGS_B;
        if (k >= COUNT(NS)) { /* segments: each alone must give the same bits */
            nseg = k == COUNT(NS) ? COUNT(SEGS_A) : COUNT(SEGS_B);
            for (int s = 0; s < nseg; s++) n += SEGS[s];
            span = xmalloc((size_t)n * sizeof *span);
            for (int s = 0, r = 0; s < nseg; s++)
                for (int i = 0; i < SEGS[s]; i++) span[r++] = SEGS[s];
        }
        const float *b = k == 1 ? NULL : bias;
        float *x = rnd_x((size_t)n * n_in), *yref = fmalloc((size_t)n * n_out);
        op_matmul(ref, yref, x, &t.w, b, (struct gb_rows){n, span});
        float *dx = dput(x, (size_t)n * n_in * sizeof(float)), *dy = dpoison((size_t)n * n_out);
        op_matmul(cu, dy, dx, &t.wc, b ? dbias : NULL, (struct gb_rows){n, span});
        float *y = dget(dy, (size_t)n * n_out);
        double *tol = mm_tol(t.deq, x, n, n_in, n_out, yref, b);
        snprintf(what, sizeof what, "matmul %s n_in %d, %d rows%s", t.name, n_in, n, span ? " in segments" : "");
        cmp_tol(what, y, yref, (size_t)n * n_out, 0, 0, tol);
        if (span) {
            int bad = -1;
            for (int s = 0, r0 = 0; s < nseg; r0 += SEGS[s], s++) {
                float *ds = dpoison((size_t)SEGS[s] * n_out);
                op_matmul(cu, ds, dx + (size_t)r0 * n_in, &t.wc, dbias, (struct gb_rows){SEGS[s], NULL});
                float *ys = dget(ds, (size_t)SEGS[s] * n_out);
                if (memcmp(ys, y + (size_t)r0 * n_out, (size_t)SEGS[s] * n_out * sizeof(float)) && bad < 0) bad = s;
                free(ys);
                dfree(ds);
            }
            CHECKF(bad < 0, "%s: segment %d differs from the segment alone (seed %llu)", what, bad, seed0);
            /* matmul_multi: the bits of separate calls */
            if (n_in % 32 == 0) {
                float *dy2 = dpoison((size_t)n * 21), *dy1 = dpoison((size_t)n * n_out);
                float *const ys[2] = {dy1, dy2};
                const struct gb_weight *const ws[2] = {&t.wc, &t2.wc};
                const float *const bs[2] = {dbias, NULL};
                op_matmul_multi(cu, 2, ys, dx, ws, bs, (struct gb_rows){n, span});
                float *y1 = dget(dy1, (size_t)n * n_out);
                CHECKF(!memcmp(y1, y, (size_t)n * n_out * sizeof(float)), "%s: matmul_multi differs from matmul", what);
                float *y2 = dget(dy2, (size_t)n * 21), *y2r = fmalloc((size_t)n * 21);
                op_matmul(ref, y2r, x, &t2.w, NULL, (struct gb_rows){n, span});
                double *tol2 = mm_tol(t2.deq, x, n, n_in, 21, y2r, NULL);
                cmp_tol("matmul_multi second matrix (q8_0)", y2, y2r, (size_t)n * 21, 0, 0, tol2);
                free(y1), free(y2), free(y2r), free(tol2);
                dfree(dy1), dfree(dy2);
            }
        }
        free(x), free(yref), free(y), free(tol), free(span);
        dfree(dx), dfree(dy);
    }
    /* get_rows: rows of this table as f32, a row with id -1 left alone */
    {
        const int n = 7;
        int32_t ids[7];
        for (int i = 0; i < n; i++) ids[i] = i == 3 ? -1 : rand_int(n_out);
        float *dy = dpoison((size_t)n * n_in);
        begin(n, NULL, 0, ids, NULL, NULL, NULL, NULL);
        op_get_rows(cu, dy, &t.wc, ids, n);
        float *y = dget(dy, (size_t)n * n_in), *want = fmalloc((size_t)n * n_in);
        poison(want, (size_t)n * n_in);
        op_get_rows(ref, want, &t.w, ids, n);
        snprintf(what, sizeof what, "get_rows %s n_in %d", t.name, n_in);
        cmp(what, y, want, (size_t)n * n_in, -1, 0);
        free(y), free(want);
        dfree(dy);
    }
    dfree(dbias);
    free(bias);
    if (n_in % 32 == 0) free_tw(&t2);
    free_tw(&t);
}

static void test_matmul_id(const struct fmt *f) {
    const int n_mat = 5, n_out = 19, n_in = fmt_n_in(f, 0), n = 9, n_sel = 3;
    struct tw t;
    make_tw(&t, f, n_mat * n_out, n_in);
    struct gb_weight st[5], stc[5];
    for (int e = 0; e < n_mat; e++) st[e] = weight_rows(&t.w, (int64_t)e * n_out, n_out);
    memcpy(stc, st, sizeof st);
    prepare(stc, n_mat);
    int32_t ids[27];
    for (int i = 0; i < n * n_sel; i++) ids[i] = rand_int(n_mat);
    int32_t *dids = dput(ids, sizeof ids);
    for (int xps = 0; xps < 2; xps++) {
        const size_t nx = (size_t)(xps ? n * n_sel : n) * n_in, ny = (size_t)n * n_sel * n_out;
        float *x = rnd_x(nx), *yref = fmalloc(ny);
        op_matmul_id(ref, yref, x, xps, st, n_mat, ids, n_sel, NULL, n);
        float *dx = dput(x, nx * sizeof(float)), *dy = dpoison(ny);
        op_matmul_id(cu, dy, dx, xps, stc, n_mat, dids, n_sel, NULL, n);
        float *y = dget(dy, ny);
        double *tol = xmalloc(ny * sizeof *tol);
        for (int ts = 0; ts < n * n_sel; ts++) { /* per (row, slot): the matmul bound of its expert */
            const float *xr = x + (size_t)(xps ? ts : ts / n_sel) * n_in;
            double *tt = mm_tol(t.deq + (size_t)ids[ts] * n_out * n_in, xr, 1, n_in, n_out, yref + (size_t)ts * n_out, NULL);
            memcpy(tol + (size_t)ts * n_out, tt, (size_t)n_out * sizeof *tol);
            free(tt);
        }
        char what[128];
        snprintf(what, sizeof what, "matmul_id %s x_per_slot %d", t.name, xps);
        cmp_tol(what, y, yref, ny, 0, 0, tol);
        free(x), free(yref), free(y), free(tol);
        dfree(dx), dfree(dy);
    }
    dfree(dids);
    free_tw(&t);
}

/* ===================================================================== per-row ops */

static void test_rows_ops(void) {
    const int n = 13, w = 75;
    /* gather_rows */
    {
        float *src = rnd((size_t)n * w, 1.0f);
        int32_t idx[5] = {3, 0, 12, 3, 7};
        float *dsrc = dput(src, (size_t)n * w * 4), *dd = dpoison(5 * (size_t)w);
        int32_t *didx = dput(idx, sizeof idx);
        op_gather_rows(cu, dd, dsrc, didx, 5, w);
        float *got = dget(dd, 5 * (size_t)w), *want = fmalloc(5 * (size_t)w);
        op_gather_rows(ref, want, src, idx, 5, w);
        cmp("gather_rows", got, want, 5 * (size_t)w, -1, 0);
        free(src), free(got), free(want);
        dfree(dsrc), dfree(dd), dfree(didx);
    }
    /* copy_strided: heads out of [q | gate] rows */
    {
        const int nr = 7, nh = 3, hd = 11;
        float *src = rnd((size_t)nr * 2 * nh * hd, 1.0f);
        float *dsrc = dput(src, (size_t)nr * 2 * nh * hd * 4), *dd = dpoison((size_t)nr * nh * hd);
        op_copy_strided(cu, dd, nh * hd, hd, dsrc + hd, 2 * nh * hd, 2 * hd, nr, nh, hd);
        float *got = dget(dd, (size_t)nr * nh * hd), *want = fmalloc((size_t)nr * nh * hd);
        op_copy_strided(ref, want, nh * hd, hd, src + hd, 2 * nh * hd, 2 * hd, nr, nh, hd);
        cmp("copy_strided", got, want, (size_t)nr * nh * hd, -1, 0);
        free(src), free(got), free(want);
        dfree(dsrc), dfree(dd);
    }
}

/* y = op(inputs) for ops of n_rows x n over host arrays: both backends, then compare. */
enum { OP_RMS, OP_RMSG, OP_L2, OP_SILU, OP_GELU, OP_SOFTCAP, OP_SCALE, OP_ADD, OP_SIGMUL, OP_MULROWS, OP_MULROWS_B,
       OP_GATED, OP_GATES, N_OPS };
static const char *OP_NAMES[] = {"rmsnorm", "rmsnorm_gated", "l2norm_heads", "silu_mul", "gelu_tanh_mul", "softcap",
                                 "scale", "add", "sigmoid_mul", "mul_rows", "mul_rows+bias", "gated_add_rows",
                                 "deltanet_gates"};

static void run_op(struct backend *be, int op, float **a, int nr, int n) {
    const long N = (long)nr * n;
    switch (op) {
    case OP_RMS: op_rmsnorm(be, a[0], a[1], a[2], 1e-6f, nr, n); break;
    case OP_RMSG: op_rmsnorm_gated(be, a[0], a[1], a[3], a[2], 1e-6f, nr, n); break;
    case OP_L2: op_l2norm_heads(be, a[1], nr, 3, n / 4, n, 1e-6f, 0.37f); break;
    case OP_SILU: op_silu_mul(be, a[0], a[1], a[3], N); break;
    case OP_GELU: op_gelu_tanh_mul(be, a[0], a[1], a[3], N); break;
    case OP_SOFTCAP: op_softcap(be, a[1], 3.0f, N); break;
    case OP_SCALE: op_scale(be, a[1], 0.731f, N); break;
    case OP_ADD: op_add(be, a[1], a[3], N); break;
    case OP_SIGMUL: op_sigmoid_mul(be, a[0], a[1], a[3], N); break;
    case OP_MULROWS: op_mul_rows(be, a[0], a[1], n, a[3], n, NULL, nr, n - 5); break;
    case OP_MULROWS_B: op_mul_rows(be, a[0], a[1], n, a[3], n, a[2], nr, n - 5); break;
    case OP_GATED: op_gated_add_rows(be, a[0], a[1], a[3], a[2], nr, n); break;
    case OP_GATES: op_deltanet_gates(be, a[1], a[3], a[2], a[2] + n, nr, n); break;
    }
}

static void test_elementwise(void) {
    const int nr = 11, n = 131;
    const size_t N = (size_t)nr * n;
    for (int op = 0; op < N_OPS; op++) {
        /* a[0] out (poisoned), a[1] x (in/out), a[2] weights [2n], a[3] second input */
        float *h[4] = {fmalloc(N), rnd(N, 3.0f), rnd(2 * (size_t)n, 1.0f), rnd(N, 3.0f)};
        poison(h[0], N);
        float *d[4];
        for (int k = 0; k < 4; k++) d[k] = dput(h[k], (k == 2 ? 2 * (size_t)n : N) * 4);
        run_op(ref, op, h, nr, n);
        run_op(cu, op, d, nr, n);
        for (int k = 0; k < 4; k++) {
            if (k == 2) continue;
            float *g = dget(d[k], N);
            char what[64];
            snprintf(what, sizeof what, "%s (array %d)", OP_NAMES[op], k);
            cmp(what, g, h[k], N, 1e-6, 1e-6);
            free(g);
        }
        for (int k = 0; k < 4; k++) free(h[k]), dfree(d[k]);
    }
}

/* ===================================================================== RoPE, KV, attention */

static void test_rope(void) {
    const int nr = 9, nh = 5, hd = 24;
    for (int variant = 0; variant < 3; variant++) {
        const int n_rot = variant == 2 ? 16 : hd, inter = variant == 1, nf = 3;
        const size_t N = (size_t)nr * nh * hd;
        float *x = rnd(N, 2.0f), *inv = fmalloc((size_t)nf * n_rot / 2);
        for (int i = 0; i < nf * n_rot / 2; i++) inv[i] = powf(10000.0f, -(float)(i % (n_rot / 2)) * 2.0f / n_rot) * (1 + i / (n_rot / 2));
        int32_t pos[9], freq[9];
        for (int t = 0; t < nr; t++) { pos[t] = rand_int(5000); freq[t] = rand_int(nf); }
        float *dx = dput(x, N * 4), *dinv = dput(inv, (size_t)nf * n_rot / 2 * 4);
        begin(nr, NULL, 0, NULL, NULL, pos, freq, NULL);
        op_rope(ref, x, pos, variant ? freq : NULL, inv, 0.9f, nr, nh, hd, n_rot, inter);
        op_rope(cu, dx, pos, variant ? freq : NULL, dinv, 0.9f, nr, nh, hd, n_rot, inter);
        float *g = dget(dx, N);
        char what[64];
        snprintf(what, sizeof what, "rope (n_rot %d, interleaved %d, freq %d)", n_rot, inter, variant > 0);
        cmp(what, g, x, N, 1e-6, 1e-6);
        free(x), free(inv), free(g);
        dfree(dx), dfree(dinv);
    }
}

/* A paged pool: n_seq sequences of the given lengths, blocks in a random order. */
static void test_attention(void) {
    enum { NSEQ = 4 };
    const int nh = 6, nkv = 2, hd = 40, stride = nkv * hd + 8;
    const int lens[NSEQ] = {1, 7, 33, 150}, news[NSEQ] = {1, 1, 5, 70}; /* positions, of which new */
    int n_blk = 0, nb[NSEQ];
    for (int s = 0; s < NSEQ; s++) n_blk += nb[s] = (lens[s] + KV_BLOCK - 1) / KV_BLOCK;
    int32_t *perm = xmalloc((size_t)n_blk * 4);
    for (int i = 0; i < n_blk; i++) perm[i] = i;
    for (int i = n_blk - 1; i > 0; i--) { int j = rand_int(i + 1), t = perm[i]; perm[i] = perm[j]; perm[j] = t; }
    struct gb_seg segs[NSEQ];
    int rows = 0;
    for (int s = 0, b = 0; s < NSEQ; b += nb[s], s++) {
        segs[s] = (struct gb_seg){.row0 = rows, .n_rows = news[s], .pos0 = lens[s] - news[s], .blocks = perm + b};
        rows += news[s];
    }
    const size_t pool = (size_t)n_blk * KV_BLOCK * stride;
    for (int f16 = 0; f16 < 2; f16++)
        for (int window = 0; window <= 20; window += 20) {
            const enum gb_type kt = f16 ? GB_TYPE_F16 : GB_TYPE_F32;
            const size_t esz = f16 ? 2 : 4;
            /* the cache through kv_store on both: x rows [n_pos][nkv * hd] per sequence */
            void *kh = calloc(pool, esz), *vh = calloc(pool, esz);
            void *kd = cu->ops->alloc(cu, pool * esz, GB_BUF_ZERO), *vd = cu->ops->alloc(cu, pool * esz, GB_BUF_ZERO);
            for (int s = 0; s < NSEQ; s++) {
                int32_t *kvr = xmalloc((size_t)lens[s] * 4);
                for (int p = 0; p < lens[s]; p++) kvr[p] = (int32_t)kv_pool_row(segs[s].blocks, p);
                float *kx = rnd((size_t)lens[s] * nkv * hd, 1.0f), *vx = rnd((size_t)lens[s] * nkv * hd, 1.0f);
                float *dkx = dput(kx, (size_t)lens[s] * nkv * hd * 4), *dvx = dput(vx, (size_t)lens[s] * nkv * hd * 4);
                begin(lens[s], NULL, 0, NULL, kvr, NULL, NULL, NULL);
                op_kv_store(ref, kh, kt, kx, kvr, lens[s], nkv * hd, stride);
                op_kv_store(ref, vh, kt, vx, kvr, lens[s], nkv * hd, stride);
                op_kv_store(cu, kd, kt, dkx, kvr, lens[s], nkv * hd, stride);
                op_kv_store(cu, vd, kt, dvx, kvr, lens[s], nkv * hd, stride);
                free(kvr), free(kx), free(vx);
                dfree(dkx), dfree(dvx);
            }
            float *kg = dget(kd, pool * esz / 4), *vg = dget(vd, pool * esz / 4);
            CHECKF(!memcmp(kg, kh, pool * esz) && !memcmp(vg, vh, pool * esz), "kv_store (%s): cache differs",
                   f16 ? "f16" : "f32");
            free(kg), free(vg);
            const size_t nq = (size_t)rows * nh * hd;
            float *q = rnd(nq, 1.0f), *want = fmalloc(nq);
            poison(want, nq);
            float *dq = dput(q, nq * 4), *dout = dpoison(nq);
            struct attn_args a = {.q = q, .out = want, .k_cache = kh, .v_cache = vh, .kv_type = kt, .kv_stride = stride,
                                  .n_head = nh, .n_head_kv = nkv, .head_dim = hd, .window = window,
                                  .scale = 1.0f / sqrtf((float)hd), .segs = segs, .n_segs = NSEQ};
            op_attention(ref, &a);
            struct attn_args ac = a;
            ac.q = dq, ac.out = dout, ac.k_cache = kd, ac.v_cache = vd;
            int32_t *span = xmalloc((size_t)rows * 4), *segof = xmalloc((size_t)rows * 4);
            for (int s = 0; s < NSEQ; s++)
                for (int i = 0; i < news[s]; i++) span[segs[s].row0 + i] = news[s], segof[segs[s].row0 + i] = s;
            begin(rows, segs, NSEQ, NULL, NULL, NULL, segof, span);
            op_attention(cu, &ac);
            float *got = dget(dout, nq);
            char what[96];
            snprintf(what, sizeof what, "attention (%s KV, window %d)", f16 ? "f16" : "f32", window);
            cmp(what, got, want, nq, 0, 2e-5);
            /* each segment alone (outside a batch: the staged copy) gives the same bits */
            int bad = -1;
            for (int s = 0; s < NSEQ; s++) {
                float *d1 = dpoison(nq);
                struct attn_args a1 = ac;
                a1.out = d1, a1.segs = &segs[s], a1.n_segs = 1;
                op_attention(cu, &a1);
                float *g1 = dget(d1, nq);
                const size_t o = (size_t)segs[s].row0 * nh * hd, k = (size_t)news[s] * nh * hd;
                if (memcmp(g1 + o, got + o, k * 4) && bad < 0) bad = s;
                free(g1);
                dfree(d1);
            }
            CHECKF(bad < 0, "%s: segment %d alone differs from the batch", what, bad);
            free(q), free(want), free(got), free(span), free(segof), free(kh), free(vh);
            dfree(dq), dfree(dout), cu->ops->buf_free(cu, kd, 0), cu->ops->buf_free(cu, vd, 0);
        }
    free(perm);
}

/* ===================================================================== recurrent, MoE */

static void test_conv1d(void) {
    const int C = 37, K = 4, NS = 3, lens[3] = {1, 2, 9};
    int rows = 0;
    struct gb_seg segs[3];
    for (int s = 0; s < NS; s++) {
        segs[s] = (struct gb_seg){.row0 = rows, .n_rows = lens[s], .state = 3 - s}; /* slots of their own, not in order */
        rows += lens[s];
    }
    const size_t slot = (size_t)(K - 1) * C + 3, sn = 4 * slot;
    for (int silu = 0; silu < 2; silu++) {
        float *x = rnd((size_t)rows * C, 2.0f), *w = rnd((size_t)K * C, 1.0f), *st = rnd(sn, 2.0f);
        float *y = fmalloc((size_t)rows * C);
        float *dx = dput(x, (size_t)rows * C * 4), *dw = dput(w, (size_t)K * C * 4), *dst = dput(st, sn * 4);
        float *dy = dpoison((size_t)rows * C);
        for (int call = 0; call < 2; call++) {
            op_conv1d(ref, y, x, (struct gb_state){st, slot}, w, C, K, silu, segs, NS);
            begin(rows, segs, NS, NULL, NULL, NULL, NULL, NULL);
            op_conv1d(cu, dy, dx, (struct gb_state){dst, slot}, dw, C, K, silu, segs, NS);
        }
        float *gy = dget(dy, (size_t)rows * C), *gs = dget(dst, sn);
        cmp(silu ? "conv1d + silu: outputs" : "conv1d: outputs", gy, y, (size_t)rows * C, 1e-6, 1e-7);
        cmp("conv1d: states", gs, st, sn, -1, 0);
        free(x), free(w), free(st), free(y), free(gy), free(gs);
        dfree(dx), dfree(dw), dfree(dst), dfree(dy);
    }
}

static void test_delta(void) {
    const int nk = 2, nv = 4, dk = 24, dv = 20, NS = 3, lens[3] = {1, 3, 70};
    int rows = 0;
    struct gb_seg segs[3];
    for (int s = 0; s < NS; s++) {
        segs[s] = (struct gb_seg){.row0 = rows, .n_rows = lens[s], .state = 2 - s};
        rows += lens[s];
    }
    for (int tiled = 0; tiled < 2; tiled++) {
        const int qk_stride = 2 * nk * dk + nv * dv + 5;
        const size_t nx = (size_t)rows * qk_stride, slot = (size_t)nv * dv * dk, sn = 3 * slot;
        float *x = rnd(nx, 1.0f);
        for (int r = 0; r < rows; r++) /* unit keys and queries */
            for (int h = 0; h < 2 * nk; h++) {
                float *v = x + (size_t)r * qk_stride + (size_t)h * dk, ss = 0;
                for (int i = 0; i < dk; i++) ss += v[i] * v[i];
                for (int i = 0; i < dk; i++) v[i] /= sqrtf(ss);
            }
        float *g = fmalloc((size_t)rows * nv), *beta = fmalloc((size_t)rows * nv);
        for (int i = 0; i < rows * nv; i++) { g[i] = -0.02f - 0.3f * (float)(test_rand_f(&rng) + 1.0f); beta[i] = 0.5f + 0.5f * test_rand_f(&rng); }
        float *st = rnd(sn, 0.5f), *out = fmalloc((size_t)rows * nv * dv);
        float *dx = dput(x, nx * 4), *dg = dput(g, (size_t)rows * nv * 4), *db = dput(beta, (size_t)rows * nv * 4);
        float *dst = dput(st, sn * 4), *dout = dpoison((size_t)rows * nv * dv);
        struct delta_args a = {.x = x, .qk_stride = qk_stride, .v_stride = qk_stride, .q_off = 0, .k_off = nk * dk,
                               .v_off = 2 * nk * dk, .g = g, .beta = beta, .out = out, .state = {st, slot}, .nk = nk,
                               .nv = nv, .dk = dk, .dv = dv, .v_tiled = tiled, .segs = segs, .n_segs = NS};
        struct delta_args ac = a;
        ac.x = dx, ac.g = dg, ac.beta = db, ac.out = dout, ac.state.base = dst;
        for (int call = 0; call < 2; call++) {
            op_delta_rule(ref, &a);
            begin(rows, segs, NS, NULL, NULL, NULL, NULL, NULL);
            op_delta_rule(cu, &ac);
        }
        float *go = dget(dout, (size_t)rows * nv * dv), *gs = dget(dst, sn);
        double *tol = xmalloc((size_t)rows * nv * dv * sizeof *tol), *tols = xmalloc(sn * sizeof *tols);
        for (size_t i = 0; i < (size_t)rows * nv * dv; i++) tol[i] = 1e-5 * (1 + fabs((double)out[i]));
        for (size_t i = 0; i < sn; i++) tols[i] = 1e-5 * (1 + fabs((double)st[i]));
        cmp_tol(tiled ? "delta_rule (v_tiled): outputs" : "delta_rule: outputs", go, out, (size_t)rows * nv * dv, 0, 0, tol);
        cmp_tol("delta_rule: states", gs, st, sn, 0, 0, tols);
        free(x), free(g), free(beta), free(st), free(out), free(go), free(gs), free(tol), free(tols);
        dfree(dx), dfree(dg), dfree(db), dfree(dst), dfree(dout);
    }
}

static void test_moe(void) {
    const int n = 13, E = 37, k = 5, width = 29;
    for (int norm = 0; norm < 2; norm++) {
        float *lg = rnd((size_t)n * E, 4.0f);
        float *dlg = dput(lg, (size_t)n * E * 4);
        int32_t *ids = xmalloc((size_t)n * k * 4);
        float *ws = fmalloc((size_t)n * k);
        int32_t *dids = cu->ops->alloc(cu, (size_t)n * k * 4, 0);
        float *dws = dpoison((size_t)n * k);
        op_moe_route(ref, ids, ws, lg, n, E, k, norm);
        op_moe_route(cu, dids, dws, dlg, n, E, k, norm);
        int32_t *gids = xmalloc((size_t)n * k * 4);
        cu->ops->download(cu, gids, dids, (size_t)n * k * 4);
        float *gws = dget(dws, (size_t)n * k), *glg = dget(dlg, (size_t)n * E);
        CHECKF(!memcmp(gids, ids, (size_t)n * k * 4), "moe_route (norm %d): ids differ (seed %llu)", norm, seed0);
        cmp("moe_route: weights", gws, ws, (size_t)n * k, 1e-6, 0);
        cmp("moe_route: probabilities", glg, lg, (size_t)n * E, 1e-6, 0);
        /* combine, with a repeated id in one row */
        ids[k] = ids[k + 1];
        cu->ops->upload(cu, dids, ids, (size_t)n * k * 4);
        cu->ops->upload(cu, dws, ws, (size_t)n * k * 4);
        float *y = rnd((size_t)n * k * width, 1.0f), *out = fmalloc((size_t)n * width);
        float *dy = dput(y, (size_t)n * k * width * 4), *dout = dpoison((size_t)n * width);
        op_moe_combine(ref, out, y, ids, ws, n, k, width);
        op_moe_combine(cu, dout, dy, dids, dws, n, k, width);
        float *gout = dget(dout, (size_t)n * width);
        cmp("moe_combine", gout, out, (size_t)n * width, -1, 0);
        free(lg), free(ids), free(ws), free(gids), free(gws), free(glg), free(y), free(out), free(gout);
        dfree(dlg), dfree(dids), dfree(dws), dfree(dy), dfree(dout);
    }
}

/* Formats weight_prepare must refuse with a message, never compute. */
static void test_refusal(void) {
    struct backend *b = NULL;
    CHECK(backend_new("cuda", 0, &b) == GERBIL_OK);
    uint8_t data[292] = {0};
    struct gb_weight w = {.kind = GB_WEIGHT_PLAIN, .type = GB_TYPE_Q8_K, .n_out = 1, .n_in = 256, .data = data,
                          .row_bytes = 292, .name = "blk.0.q8k"};
    b->ops->weight_prepare(b, &w, 1, 0);
    const gerbil_status st = b->ops->weight_status(b);
    CHECKF(st == GERBIL_ERR_UNSUPPORTED && strstr(gerbil_last_error(), "blk.0.q8k"),
           "weight_prepare of Q8_K: status %d, \"%s\"", st, gerbil_last_error());
    CHECK(b->ops->reserve(b, &(struct gb_reserve){.n_rows = 1}) != GERBIL_OK);
    backend_free(b);
    CHECK(backend_new("cuda:999", 0, &b) == GERBIL_ERR_UNSUPPORTED && strstr(gerbil_last_error(), "999"));
    CHECK(backend_new("cuda:x", 0, &b) == GERBIL_ERR_UNSUPPORTED);
}

int main(int argc, char **argv) {
    seed0 = rng = argc > 1 ? strtoull(argv[1], NULL, 0) : (unsigned long long)time(NULL) * 2654435761ULL | 1;
    if (backend_new("cuda", 0, &cu) != GERBIL_OK) SKIP("no CUDA backend: %s", gerbil_last_error());
    if (backend_new("ref", 1, &ref) != GERBIL_OK) { fprintf(stderr, "ref backend: %s\n", gerbil_last_error()); return 1; }
    printf("test_backend_cuda: seed %llu\n", seed0);
    test_buffers();
    struct fmt f[64];
    const int nf = all_formats(f);
    struct backend *cu0 = cu;
    for (int i = 0; i < nf; i++) /* a backend per weight test: each knows only its own weights */
        for (int k = 0; k < 3; k++) {
            if (backend_new("cuda", 0, &cu) != GERBIL_OK) { fprintf(stderr, "%s\n", gerbil_last_error()); return 1; }
            if (k < 2) test_matmul(&f[i], k);
            else test_matmul_id(&f[i]);
            backend_free(cu);
        }
    cu = cu0;
    printf("matmuls of %d formats done\n", nf);
    test_rows_ops();
    test_elementwise();
    test_rope();
    test_attention();
    test_conv1d();
    test_delta();
    test_moe();
    test_refusal();
    backend_free(cu);
    backend_free(ref);
    return test_done();
}
