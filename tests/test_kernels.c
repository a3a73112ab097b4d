/* Fast kernels against the scalar references on fresh random inputs of awkward sizes.
 * The seed is printed; pass it back as argv[1] to replay a failure. Buffers are
 * placed so that vector loads are misaligned and any read or write past the end
 * reaches the edge of the allocation (caught under the sanitizers); outputs are
 * poisoned with NaN first, so an element the kernel skips cannot pass. */
#include "backend/cpu/kernels.h"
#include "backend/cpu/qmatmul_avx512.h"
#include "backend/backend.h"
#include "base/fp16.h"
#include "test.h"

#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static unsigned long long rng;

static const int N_IN[] = {1, 3, 7, 8, 15, 16, 17, 31, 33, 64, 65, 127, 257, 1000};
static const int N_OUT[] = {1, 5, 16, 33, 67};
static const int N_TOK[] = {1, 2, 3, 7, 16, 33};
static const enum gb_type WTYPES[] = {GB_TYPE_F32, GB_TYPE_F16, GB_TYPE_BF16};
#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

static float poison(void) { return fp32_from_bits(0x7fc0dead); } /* a quiet NaN */
static int is_poison(float f) { return fp32_to_bits(f) == 0x7fc0deadu; }

/* n floats uniform in [-1, 1), one float past a 32-byte boundary, ending exactly at
 * the end of the allocation. *base is what to free. */
static float *rand_f32(int n, void **base) {
    float *b = malloc(((size_t)n + 1) * sizeof(float));
    for (int i = 0; i < n; i++) b[i + 1] = test_rand_f(&rng);
    *base = b;
    return b + 1;
}

/* A weight matrix of n elements of type t at an odd multiple of the element size
 * (weights come from an mmap at any 2-byte offset), ending at the allocation's end. */
static void *rand_weights(enum gb_type t, size_t n, void **base) {
    size_t esz = t == GB_TYPE_F32 ? 4 : 2;
    char *b = malloc((n + 1) * esz);
    void *w = b + esz;
    for (size_t i = 0; i < n; i++) {
        float f = test_rand_f(&rng);
        if (t == GB_TYPE_F32) ((float *)w)[i] = f;
        else if (t == GB_TYPE_F16) ((uint16_t *)w)[i] = f32_to_f16(f);
        else ((uint16_t *)w)[i] = f32_to_bf16(f);
    }
    *base = b;
    return w;
}

static double weight_at(const void *w, enum gb_type t, size_t i) {
    if (t == GB_TYPE_F32) return ((const float *)w)[i];
    uint16_t h = ((const uint16_t *)w)[i];
    return t == GB_TYPE_F16 ? f16_to_f32(h) : bf16_to_f32(h);
}

/* y poisoned, with 8 poisoned guard floats after it. */
static float *poisoned(size_t n) {
    float *y = malloc((n + 8) * sizeof(float));
    for (size_t i = 0; i < n + 8; i++) y[i] = poison();
    return y;
}

static int guard_intact(const float *y, size_t n) {
    for (size_t i = n; i < n + 8; i++)
        if (!is_poison(y[i])) return 0;
    return 1;
}

/* |fast - ref| <= 1e-4 (1 + sum |x w|): f32 accumulation in a different order. */
static void check_matmul(threadpool_t *tp, enum gb_type t, int n_tok, int n_in, int n_out) {
    void *xb, *wb;
    float *x = rand_f32(n_tok * n_in, &xb);
    void *w = rand_weights(t, (size_t)n_in * n_out, &wb);
    size_t ny = (size_t)n_tok * n_out;
    float *yr = poisoned(ny), *yf = poisoned(ny);
    matmul_ref(yr, x, w, t, n_tok, n_in, n_out);
    matmul(tp, yf, x, w, t, n_tok, n_in, n_out);
    int bad = 0;
    for (int u = 0; u < n_tok && bad < 3; u++)
        for (int o = 0; o < n_out && bad < 3; o++) {
            double mag = 0.0;
            for (int i = 0; i < n_in; i++)
                mag += fabs(x[(size_t)u * n_in + i] * weight_at(w, t, (size_t)o * n_in + i));
            float r = yr[(size_t)u * n_out + o], f = yf[(size_t)u * n_out + o];
            if (!(fabs((double)f - r) <= 1e-4 * (1.0 + mag))) {
                bad++;
                CHECKF(0, "matmul %s n_tok=%d n_in=%d n_out=%d: y[%d][%d] = %.9g, ref %.9g",
                       type_name(t), n_tok, n_in, n_out, u, o, f, r);
            }
        }
    CHECKF(!bad, "matmul %s n_tok=%d n_in=%d n_out=%d", type_name(t), n_tok, n_in, n_out);
    CHECKF(guard_intact(yr, ny) && guard_intact(yf, ny), "matmul wrote past y (%s %d %d %d)",
           type_name(t), n_tok, n_in, n_out);
    free(xb); free(wb); free(yr); free(yf);
}

/* Same inputs through pools of 1, 2 and 3 threads and no pool: bit-identical. */
static void check_thread_invariance(threadpool_t *const pools[3], enum gb_type t, int n_tok,
                                    int n_in, int n_out) {
    void *xb, *wb;
    float *x = rand_f32(n_tok * n_in, &xb);
    void *w = rand_weights(t, (size_t)n_in * n_out, &wb);
    size_t ny = (size_t)n_tok * n_out;
    float *y0 = poisoned(ny);
    matmul(NULL, y0, x, w, t, n_tok, n_in, n_out);
    for (int p = 0; p < 3; p++) {
        float *y = poisoned(ny);
        matmul(pools[p], y, x, w, t, n_tok, n_in, n_out);
        CHECKF(memcmp(y, y0, ny * sizeof(float)) == 0,
               "matmul %s n_tok=%d n_in=%d n_out=%d differs with %d threads", type_name(t), n_tok,
               n_in, n_out, tp_n_threads(pools[p]));
        free(y);
    }
    free(xb); free(wb); free(y0);
}

static void check_dot_axpy(int n) {
    void *ab, *bb, *hb, *yb;
    float *a = rand_f32(n, &ab), *b = rand_f32(n, &bb), *y0 = rand_f32(n, &yb);
    uint16_t *h = rand_weights(GB_TYPE_F16, (size_t)n, &hb);
    double mag = 0.0, magh = 0.0;
    for (int i = 0; i < n; i++) {
        mag += fabs((double)a[i] * b[i]);
        magh += fabs((double)a[i] * f16_to_f32(h[i]));
    }
    float r = dot_f32_ref(a, b, n), f = dot_f32(a, b, n);
    CHECKF(fabs((double)f - r) <= 1e-5 * (1.0 + mag), "dot_f32 n=%d: %.9g vs ref %.9g", n, f, r);
    r = dot_f32_f16_ref(a, h, n), f = dot_f32_f16(a, h, n);
    CHECKF(fabs((double)f - r) <= 1e-5 * (1.0 + magh), "dot_f32_f16 n=%d: %.9g vs ref %.9g", n, f, r);

    /* axpy rounds each element once (or twice in the reference): a few ulps. */
    float s = test_rand_f(&rng) * 4.0f;
    float *yr = malloc((size_t)n * sizeof(float)), *yf = malloc((size_t)n * sizeof(float));
    for (int pass = 0; pass < 2; pass++) {
        memcpy(yr, y0, (size_t)n * sizeof(float));
        memcpy(yf, y0, (size_t)n * sizeof(float));
        if (pass == 0) { axpy_f32_ref(yr, s, b, n); axpy_f32(yf, s, b, n); }
        else { axpy_f16_ref(yr, s, h, n); axpy_f16(yf, s, h, n); }
        int bad = 0;
        for (int i = 0; i < n; i++) {
            double v = pass == 0 ? b[i] : f16_to_f32(h[i]);
            double tol = 1e-6 * (fabs((double)y0[i]) + fabs(s * v)) + 1e-30;
            if (!(fabs((double)yf[i] - yr[i]) <= tol)) bad++;
        }
        CHECKF(!bad, "axpy_%s n=%d: %d elements differ", pass == 0 ? "f32" : "f16", n, bad);
    }
    free(ab); free(bb); free(hb); free(yb); free(yr); free(yf);
}

/* f32 -> f16 rows (the KV cache store): the fast version gives the scalar one's bits on
 * random values over the whole f16 range and beyond (overflow to inf, subnormals, zeros,
 * exact ties, infinities, NaNs with payloads). */
static void check_f16_row(int n) {
    float *x = malloc((size_t)n * sizeof(float));
    uint16_t *r = malloc((size_t)n * sizeof(uint16_t)), *f = malloc((size_t)n * sizeof(uint16_t));
    for (int i = 0; i < n; i++) {
        int kind = (int)(test_rand_u64(&rng) % 8);
        float v = test_rand_f(&rng);
        if (kind == 0) v *= 70000.0f;                          /* past the f16 range */
        else if (kind == 1) v *= 1e-6f;                        /* f16 subnormals */
        else if (kind == 2) v = ldexpf((float)(2 * (int)(test_rand_u64(&rng) % 1024) + 1), -11); /* ties */
        else if (kind == 3) v = i % 2 ? -0.0f : 0.0f;
        else v *= 300.0f;
        x[i] = v;
    }
    if (n > 3) { x[0] = INFINITY; x[1] = -INFINITY; x[2] = NAN; x[3] = fp32_from_bits(0xffc01234u); }
    f32_to_f16_row_ref(r, x, n);
    f32_to_f16_row(f, x, n);
    int bad = 0;
    for (int i = 0; i < n; i++)
        if (r[i] != f[i] && bad++ < 3) CHECKF(0, "f32_to_f16_row: %.9g -> %04x, ref %04x", x[i], f[i], r[i]);
    CHECKF(!bad, "f32_to_f16_row n=%d: %d values differ", n, bad);
    free(x); free(r); free(f);
}

/* sum of squares in double (RMSNorm): fast within 1e-15 relative of the in-order sum. */
static void check_sumsq(int n) {
    float *x = malloc((size_t)n * sizeof(float));
    for (int i = 0; i < n; i++) x[i] = test_rand_f(&rng) * (float)(1 + i % 13) * 100.0f;
    double r = sumsq_f32_ref(x, n), f = sumsq_f32(x, n);
    CHECKF(fabs(f - r) <= 1e-15 * r * (1 + n / 64), "sumsq_f32 n=%d: %.17g vs ref %.17g", n, f, r);
    free(x);
}

/* gelu_tanh(x) * u, silu(x) * u and cap * tanh(x / cap) against the double-precision references, on
 * inputs spread over the range where the curves bend and saturate: a few f32 ulps of
 * relative error (the fast tanh/exp are good to ~5e-7). Each element must also come out
 * the same whether it lies in the vector body or the tail, so any split is bit-identical. */
static void check_activations(int n) {
    void *gb, *ub, *xb;
    float *g = rand_f32(n, &gb), *u = rand_f32(n, &ub), *x = rand_f32(n, &xb);
    for (int i = 0; i < n; i++) { g[i] *= 8.0f; x[i] *= 60.0f; }
    float cap = 2.0f + 30.0f * (test_rand_f(&rng) + 1.0f);
    float *yr = poisoned((size_t)n), *yf = poisoned((size_t)n), *ys = poisoned((size_t)n);
    gelu_tanh_mul_ref(yr, g, u, n);
    gelu_tanh_mul(yf, g, u, n);
    int bad = 0;
    for (int i = 0; i < n; i++)
        if (!(fabs((double)yf[i] - yr[i]) <= 2e-6 * fabs((double)g[i] * u[i]) + 1e-30)) {
            if (bad++ < 3) CHECKF(0, "gelu_tanh_mul n=%d: x=%.9g u=%.9g: %.9g vs ref %.9g", n, g[i], u[i], yf[i], yr[i]);
        }
    CHECKF(!bad, "gelu_tanh_mul n=%d: %d elements off", n, bad);
    int cut = n / 3;
    gelu_tanh_mul(ys, g, u, cut);
    gelu_tanh_mul(ys + cut, g + cut, u + cut, n - cut);
    CHECKF(memcmp(ys, yf, (size_t)n * sizeof(float)) == 0, "gelu_tanh_mul n=%d: a split at %d changes bits", n, cut);
    CHECKF(guard_intact(yf, (size_t)n) && guard_intact(ys, (size_t)n), "gelu_tanh_mul n=%d wrote past y", n);

    silu_mul_ref(yr, g, u, n);
    silu_mul(yf, g, u, n);
    bad = 0;
    for (int i = 0; i < n; i++)
        if (!(fabs((double)yf[i] - yr[i]) <= 2e-6 * fabs((double)g[i] * u[i]) + 1e-30)) {
            if (bad++ < 3) CHECKF(0, "silu_mul n=%d: x=%.9g u=%.9g: %.9g vs ref %.9g", n, g[i], u[i], yf[i], yr[i]);
        }
    CHECKF(!bad, "silu_mul n=%d: %d elements off", n, bad);
    silu_mul(ys, g, u, cut);
    silu_mul(ys + cut, g + cut, u + cut, n - cut);
    CHECKF(memcmp(ys, yf, (size_t)n * sizeof(float)) == 0, "silu_mul n=%d: a split at %d changes bits", n, cut);
    CHECKF(guard_intact(yf, (size_t)n) && guard_intact(ys, (size_t)n), "silu_mul n=%d wrote past y", n);

    memcpy(yr, x, (size_t)n * sizeof(float));
    memcpy(yf, x, (size_t)n * sizeof(float));
    softcap_ref(yr, cap, n);
    softcap(yf, cap, n);
    bad = 0;
    for (int i = 0; i < n; i++)
        if (!(fabs((double)yf[i] - yr[i]) <= 2e-6 * fabs((double)yr[i]) + 1e-30)) {
            if (bad++ < 3) CHECKF(0, "softcap n=%d cap=%g: x=%.9g: %.9g vs ref %.9g", n, cap, x[i], yf[i], yr[i]);
        }
    CHECKF(!bad, "softcap n=%d: %d elements off", n, bad);
    memcpy(ys, x, (size_t)n * sizeof(float));
    softcap(ys, cap, cut);
    softcap(ys + cut, cap, n - cut);
    CHECKF(memcmp(ys, yf, (size_t)n * sizeof(float)) == 0, "softcap n=%d: a split at %d changes bits", n, cut);
    CHECKF(guard_intact(yf, (size_t)n) && guard_intact(ys, (size_t)n), "softcap n=%d wrote past x", n);
    free(gb); free(ub); free(xb); free(yr); free(yf); free(ys);
}

/* The ops split element-wise work over the pool: the same bits with 1, 2 or 3 threads. */
static void check_activation_ops(struct backend *const bes[3]) {
    const long n = 100003;
    float *g = malloc((size_t)n * sizeof(float)), *u = malloc((size_t)n * sizeof(float));
    float *y[3], *c[3], *s[3];
    for (long i = 0; i < n; i++) { g[i] = 6.0f * test_rand_f(&rng); u[i] = test_rand_f(&rng); }
    for (int p = 0; p < 3; p++) {
        y[p] = malloc((size_t)n * sizeof(float));
        c[p] = malloc((size_t)n * sizeof(float));
        op_gelu_tanh_mul(bes[p], y[p], g, u, n);
        s[p] = malloc((size_t)n * sizeof(float));
        op_silu_mul(bes[p], s[p], g, u, n);
        memcpy(c[p], g, (size_t)n * sizeof(float));
        op_softcap(bes[p], c[p], 3.0f, n);
    }
    for (int p = 1; p < 3; p++) {
        CHECKF(memcmp(y[p], y[0], (size_t)n * sizeof(float)) == 0, "op_gelu_tanh_mul differs with %d threads", p + 1);
        CHECKF(memcmp(c[p], c[0], (size_t)n * sizeof(float)) == 0, "op_softcap differs with %d threads", p + 1);
        CHECKF(memcmp(s[p], s[0], (size_t)n * sizeof(float)) == 0, "op_silu_mul differs with %d threads", p + 1);
    }
    for (int p = 0; p < 3; p++) { free(y[p]); free(c[p]); free(s[p]); }
    free(g); free(u);
}

/* op_attention over a paged f16 cache against a two-pass softmax in double: random q, k,
 * v, n_tok queries at pos0.. (keys across 64-position blocks), GQA, with and without a
 * window; the sequence's positions in pool blocks taken in scrambled order; bit-identical
 * for backends of 1..3 threads; the batch, the same tokens as n_tok one-row segments in
 * one call (batched decode) and fed one at a time each within 2e-5 of the reference (on
 * AVX-512 they sum the scores in different orders), and the latter two bit-identical to
 * each other. On AVX-512 machines this is the attn_avx512.c path, else the scalar/AVX2 one. */
static void check_attention(struct backend *bes[3], int n_tok, int pos0, int n_head, int n_head_kv, int hd,
                            int window) {
    int n_ctx = pos0 + n_tok, kvw = n_head_kv * hd, qw = n_head * hd, group = n_head / n_head_kv;
    const int n_blocks = (n_ctx + KV_BLOCK - 1) / KV_BLOCK + 3;
    /* the context's layout: per pool row a K row, a V row (and here 16 NaNs, which must
     * never be read), kvs elements apart; rows of blocks no position maps to are NaN too */
    int kvs = 2 * kvw + 16;
    int32_t *blocks = malloc(sizeof(int32_t) * (size_t)n_blocks);
    for (int i = 0; i < n_blocks; i++) blocks[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) { /* a permutation of the pool's blocks */
        int j = (int)(test_rand_u64(&rng) % (unsigned long long)(i + 1)), t = blocks[i];
        blocks[i] = blocks[j];
        blocks[j] = t;
    }
    const size_t rows = (size_t)n_blocks * KV_BLOCK;
    uint16_t *cache = malloc(sizeof(uint16_t) * rows * kvs), *kc = cache, *vc = cache + kvw;
    for (size_t i = 0; i < rows * kvs; i++) cache[i] = 0x7e00;
    for (int j = 0; j < n_ctx; j++)
        for (int i = 0; i < 2 * kvw; i++) cache[(size_t)kv_pool_row(blocks, j) * kvs + i] = f32_to_f16(test_rand_f(&rng));
    float *q = malloc(sizeof(float) * (size_t)n_tok * qw);
    for (int i = 0; i < n_tok * qw; i++) q[i] = 3.0f * test_rand_f(&rng);
    float *out[5];
    for (int p = 0; p < 5; p++) out[p] = poisoned((size_t)n_tok * qw);
    struct gb_seg seg = {.row0 = 0, .n_rows = n_tok, .pos0 = pos0, .blocks = blocks};
    struct attn_args a = {.q = q, .k_cache = kc, .v_cache = vc, .kv_type = GB_TYPE_F16, .kv_stride = kvs,
                          .n_head = n_head, .n_head_kv = n_head_kv, .head_dim = hd, .window = window,
                          .scale = 1.0f / sqrtf((float)hd), .segs = &seg, .n_segs = 1};
    for (int p = 0; p < 3; p++) {
        struct gb_reserve r = {.n_rows = n_tok, .n_kv = n_ctx};
        CHECK(bes[p]->ops->reserve(bes[p], &r) == GERBIL_OK);
        a.out = out[p];
        op_attention(bes[p], &a);
    }
    struct gb_seg *one = malloc(sizeof *one * (size_t)n_tok);
    for (int t = 0; t < n_tok; t++) { /* decode: one token per call */
        struct gb_seg d = {.row0 = 0, .n_rows = 1, .pos0 = pos0 + t, .blocks = blocks};
        struct attn_args b = a;
        b.q = q + (size_t)t * qw;
        b.out = out[3] + (size_t)t * qw;
        b.segs = &d;
        op_attention(bes[1], &b);
        one[t] = (struct gb_seg){.row0 = t, .n_rows = 1, .pos0 = pos0 + t, .blocks = blocks};
    }
    struct attn_args m = a; /* batched decode: n_tok segments of one row, one call */
    m.out = out[4];
    m.segs = one;
    m.n_segs = n_tok;
    op_attention(bes[2], &m);
    int bad = 0;
    double *sc = malloc(sizeof(double) * (size_t)n_ctx);
    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < n_head; h++) {
            int pos = pos0 + t, j0 = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0, kvh = h / group;
            const float *qv = q + (size_t)t * qw + (size_t)h * hd;
            double mx = -1e300, sum = 0.0;
            for (int j = j0; j <= pos; j++) {
                double s = 0.0;
                const size_t r = (size_t)kv_pool_row(blocks, j) * kvs + (size_t)kvh * hd;
                for (int d = 0; d < hd; d++) s += (double)qv[d] * f16_to_f32(kc[r + d]);
                sc[j] = s * (double)a.scale;
                if (sc[j] > mx) mx = sc[j];
            }
            for (int j = j0; j <= pos; j++) { sc[j] = exp(sc[j] - mx); sum += sc[j]; }
            for (int d = 0; d < hd; d++) {
                double o = 0.0;
                for (int j = j0; j <= pos; j++)
                    o += sc[j] / sum * f16_to_f32(vc[(size_t)kv_pool_row(blocks, j) * kvs + (size_t)kvh * hd + d]);
                for (int p = 0; p < 4; p += 3) { /* the batch and the one-by-one run */
                    float got = out[p][(size_t)t * qw + (size_t)h * hd + d];
                    if (!(fabs(got - o) <= 2e-5) && bad++ < 3)
                        fprintf(stderr, "attention %s t %d h %d d %d: %g, ref %g\n", p ? "one by one" : "batch", t, h,
                                d, got, o);
                }
            }
        }
    size_t ny = sizeof(float) * (size_t)n_tok * qw;
    CHECKF(!bad, "attention n_tok %d pos0 %d heads %d/%d hd %d window %d: %d outputs off", n_tok, pos0, n_head,
           n_head_kv, hd, window, bad);
    CHECKF(memcmp(out[0], out[1], ny) == 0 && memcmp(out[0], out[2], ny) == 0,
           "attention n_tok %d hd %d window %d: results depend on the thread count", n_tok, hd, window);
    CHECKF(memcmp(out[3], out[4], ny) == 0,
           "attention n_tok %d hd %d window %d: a one-row segment differs inside a batch of them", n_tok, hd, window);
    for (int p = 0; p < 5; p++) free(out[p]);
    free(cache); free(q); free(sc); free(blocks); free(one);
}

int main(int argc, char **argv) {
    unsigned long long seed = argc > 1 ? strtoull(argv[1], NULL, 0)
                                       : (unsigned long long)time(NULL) ^ ((unsigned long long)getpid() << 32);
    if (!seed) seed = 1; /* xorshift's one fixed point */
    rng = seed;
    printf("test_kernels: seed %llu (rerun with this argument to reproduce); avx2 kernels: %s\n",
           seed, cpu_has_avx2() ? "yes" : "no");

    threadpool_t *pools[3];
    struct backend *bes[3];
    for (int p = 0; p < 3; p++) {
        pools[p] = tp_create(p + 1);
        if (!pools[p]) { fprintf(stderr, "tp_create(%d) failed\n", p + 1); return 1; }
        if (backend_new("cpu", p + 1, &bes[p]) != GERBIL_OK) { fprintf(stderr, "%s\n", gerbil_last_error()); return 1; }
    }

    for (int ti = 0; ti < COUNT(WTYPES); ti++)
        for (int a = 0; a < COUNT(N_IN); a++)
            for (int b = 0; b < COUNT(N_OUT); b++)
                for (int c = 0; c < COUNT(N_TOK); c++)
                    check_matmul(pools[1], WTYPES[ti], N_TOK[c], N_IN[a], N_OUT[b]);

    /* Larger shapes: several KC panels, many tiles per thread, uneven thread splits,
     * more tokens than one prefill block (65536 / n_in, rounded down to a multiple of 3). */
    static const int BIG[][3] = {{1, 1024, 301}, {5, 1024, 301}, {33, 1000, 130}, {2, 3072, 37},
                                 {1, 777, 1027}, {129, 65, 61}, {200, 40, 13}, {389, 300, 10}, {70, 1024, 21}};
    for (int ti = 0; ti < COUNT(WTYPES); ti++)
        for (int s = 0; s < COUNT(BIG); s++) {
            check_matmul(pools[2], WTYPES[ti], BIG[s][0], BIG[s][1], BIG[s][2]);
            check_thread_invariance(pools, WTYPES[ti], BIG[s][0], BIG[s][1], BIG[s][2]);
        }
    for (int ti = 0; ti < COUNT(WTYPES); ti++)
        for (int c = 0; c < COUNT(N_TOK); c++)
            check_thread_invariance(pools, WTYPES[ti], N_TOK[c], 257, 67);

    printf("attention: %s\n", qmatmul_has_avx512() ? "AVX-512 f16 path (attn_avx512.c)"
                                                    : "AVX-512 path SKIPPED (CPU lacks it); scalar/AVX2 path");
    check_f16_row(1000);
    check_sumsq(1024);
    check_sumsq(13);
    check_sumsq(3);
    check_f16_row(13);
    /* both attention paths where the CPU has AVX-512: the second pass has it switched off */
    for (int off = 0; off <= qmatmul_has_avx512(); off++) {
        qmatmul_disable_avx512(off);
        /* items (AVX-512) of ATTN512_MAX_Q / group tokens: 64 queries */
        check_attention(bes, 1, 0, 2, 1, 16, 0);
        check_attention(bes, 9, 60, 4, 2, 128, 0);  /* keys cross a 64-block; one item of 9 tokens */
        check_attention(bes, 9, 60, 4, 2, 128, 7);  /* sliding window */
        check_attention(bes, 100, 0, 4, 2, 64, 0);  /* items of 32 tokens (64 queries), 32, 32, 4 */
        check_attention(bes, 70, 0, 6, 2, 48, 0);   /* group 3: items of 21 tokens (63 queries) */
        check_attention(bes, 5, 130, 16, 1, 64, 0); /* group 16: items of 4 tokens */
        check_attention(bes, 3, 3, 8, 8, 32, 2);
    }
    qmatmul_disable_avx512(0);

    /* The forced reference path through matmul is matmul_ref, threaded. */
    cpu_force_ref(1);
    CHECK(!cpu_has_avx2());
    for (int ti = 0; ti < COUNT(WTYPES); ti++) {
        void *xb, *wb;
        int n_tok = 3, n_in = 200, n_out = 150;
        float *x = rand_f32(n_tok * n_in, &xb);
        void *w = rand_weights(WTYPES[ti], (size_t)n_in * n_out, &wb);
        float *yr = poisoned((size_t)n_tok * n_out), *yf = poisoned((size_t)n_tok * n_out);
        matmul_ref(yr, x, w, WTYPES[ti], n_tok, n_in, n_out);
        matmul(pools[2], yf, x, w, WTYPES[ti], n_tok, n_in, n_out);
        CHECKF(memcmp(yr, yf, (size_t)n_tok * n_out * sizeof(float)) == 0,
               "forced-reference matmul %s differs from matmul_ref", type_name(WTYPES[ti]));
        free(xb); free(wb); free(yr); free(yf);
    }
    cpu_force_ref(0);

    static const int N_VEC[] = {1, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 1000};
    for (int i = 0; i < COUNT(N_VEC); i++) check_dot_axpy(N_VEC[i]);
    for (int i = 0; i < COUNT(N_VEC); i++) check_activations(N_VEC[i]);
    check_activations(4099);
    check_activation_ops(bes);

    for (int p = 0; p < 3; p++) { tp_free(pools[p]); backend_free(bes[p]); }
    return test_done();
}
