/* Every op of the backend table (backend.h) on the CPU backend against the reference
 * backend (ref_backend.c, the specification), in the manner of llama.cpp's
 * test-backend-ops: the same random inputs of odd sizes go to both, outputs are poisoned
 * with NaN first (an element an op skips cannot pass; rows an op must leave alone must
 * still hold the poison bits), and the results are compared within a tolerance argued
 * for each op below. The CPU side runs under every instruction set this machine has --
 * the default (AVX-512 where present), qmatmul_disable_avx512 (AVX2 / VNNI) and
 * cpu_force_ref (the scalar kernels) -- and with pools of 1 and 2 threads, which must
 * agree bit for bit. The seed is printed; pass it back as argv[1] to replay a run.
 *
 * Batch invariance (backend.h, struct gb_rows.span) is checked at the level of the ops:
 * the rows of several segments in one call (spans non-decreasing, segments of one row
 * and segments below and above the prefill-GEMM thresholds of 32 / 48 rows, and a pass
 * with the threshold forced down to 4 rows) give each row the bits of a call over its
 * own segment alone, for matmul, matmul_multi and matmul_id (whose span is per segment
 * and expert), and likewise per segment for attention, conv1d and the delta rule.
 * matmul_multi must give the bits of separate matmul calls. The buffer entries (alloc,
 * upload, copy, zero, download) behave alike on both backends, and reserve keeps covering
 * weights prepared after an earlier reserve.
 *
 * Tolerances (CPU against ref):
 *  - matmul / matmul_multi / matmul_id, per output y = sum_i w_i x_i (+ bias), with w the
 *    weight's dequantized values (weight_get_row; the reference sums in double), the
 *    bounds of tests/test_qmatmul.c:
 *      f32 / f16 / bf16 rows: f32 sums in some order of n_in products, so at most
 *        (n_in + 4) 2^-24 sum_i |w_i x_i| (the recursive-summation bound);
 *      GGML types, per-token kernels: x quantized to 8 bits per block (32 elements, 256
 *        for the k-quants) with step d_b = max|x_b| / 127, so the product error is at
 *        most A = sum_i |w_i| d_b(i) / 2; tolerance 1.001 A + 1e-5 S, S = sum_i (|w_i| +
 *        2 max|w| of its 32-block) |x_i| bounding the f32 rounding of block sums with
 *        their min/offset terms;
 *      MLX, per-token kernels: x to 16 bits per block of 32 (step max|x| / 32767), A as
 *        above, S = sum_i 2 (|w_i| + |b_g| + 255 |s_g|) |x_i|;
 *      GGML types through the bf16 GEMM: w and x each rounded to bf16 (2^-9 relative),
 *        f32 sums: (2^-8 + n_in 2^-24) 1.01 sum_i |w_i x_i|;
 *      MLX 4/8-bit through the 16-bit GEMM: the MLX bound with one x step per weight group;
 *    plus 2^-22 (|y| + |bias|) for the f32 addition of the bias on both sides. Which
 *    method a row took is the one its span selects (matmul_w_min_span).
 *  - element-wise ops whose CPU code performs the same f32 operations in the same order
 *    as the reference (rmsnorm_gated, l2norm_heads, scale, add, sigmoid_mul, mul_rows,
 *    gated_add_rows, deltanet_gates, moe_route, moe_combine, rope, kv_store, get_rows,
 *    gather_rows, copy_strided, conv1d): exact bits.
 *  - rmsnorm: the sum of squares in double in another order (8 partial sums) can move
 *    the f32 mean by one rounding: 2^-22 relative (2 ulp).
 *  - silu_mul, gelu_tanh_mul, softcap with SIMD: the fast exp / tanh are good to ~5e-7
 *    relative (tests/test_kernels.c), so 2e-6 |g u| (softcap: 2e-6 |y|); exact with the
 *    scalar kernels, which are the reference's.
 *  - attention: f32 scores and softmax (AVX-512: an online softmax over blocks of 64 keys
 *    with a polynomial exp) against double; outputs are convex combinations of values in
 *    [-1, 1]: 2e-5 absolute, as tests/test_kernels.c.
 *  - delta rule: the chunked form (segments of more than one row) reorders the sums of
 *    the recurrence and goes through f32 matmuls; 2e-4 (1 + |want|) for outputs and
 *    states (unit keys, decays in (e^-2, 1] with heads that forget slowly, states of
 *    order 1), over two calls. */
#include "backend/backend.h"
#include "backend/cpu/gemm_avx512.h" /* qmatmul_set_gemm_min_tok, qmatmul_has_bf16 */
#include "backend/cpu/kernels.h"
#include "backend/cpu/mlx_packed.h"
#include "backend/cpu/qmatmul_avx512.h"
#include "base/fp16.h"
#include "tensor/dtype.h"
#include "tensor/quant.h"
#include "tensor/quant_ref.h"
#include "tensor/weight.h"
#include "test.h"

#include <limits.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

static unsigned long long rng, seed0;
static struct backend *ref;    /* the oracle */
static struct backend *cpu[2]; /* 1 and 2 threads, for the ops without weights */
static struct backend *packer; /* weight_prepare(writable) of MLX 4-bit test weights */

/* ---- memory and random inputs ---- */

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) { fprintf(stderr, "out of memory\n"); exit(1); }
    return p;
}
static float *fmalloc(size_t n) { return xmalloc(n * sizeof(float)); }
static double *dmalloc(size_t n) { return xmalloc(n * sizeof(double)); }

#define POISON_BITS 0x7fc0deadu /* a quiet NaN that no op produces */
static void poison(float *x, size_t n) {
    const float p = fp32_from_bits(POISON_BITS);
    for (size_t i = 0; i < n; i++) x[i] = p;
}
static float *poisoned(size_t n) {
    float *p = fmalloc(n);
    poison(p, n);
    return p;
}
static int is_poison(float f) { return fp32_to_bits(f) == POISON_BITS; }
static int rand_int(int n) { return (int)(test_rand_u64(&rng) % (unsigned long long)n); }
static void fill(float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = scale * test_rand_f(&rng);
}
static float *rnd(size_t n, float scale) {
    float *p = fmalloc(n);
    fill(p, n, scale);
    return p;
}
static float *fdup(const float *x, size_t n) {
    float *p = fmalloc(n);
    memcpy(p, x, n * sizeof *p);
    return p;
}
/* Activations of varied magnitude within a row (quantization blocks of different steps). */
static float *rnd_x(size_t n) {
    float *p = fmalloc(n);
    for (size_t i = 0; i < n; i++) p[i] = test_rand_f(&rng) * (1.0f + (float)(i % 7));
    return p;
}

/* ---- the instruction sets the CPU side runs under ---- */

enum { ISA_DEFAULT, ISA_AVX2, ISA_SCALAR, N_ISA };
static int isa_on[N_ISA], isa_runs[N_ISA];
static char isa_label[N_ISA][48];
static const char *isa_forced; /* GERBIL_CPU_ISA, when it forces one: then only that pass runs */

static void isa_init(void) {
    const char *env = getenv("GERBIL_CPU_ISA");
    if (env && *env && strcmp(env, "auto")) {
        /* the backends applied it when they were made: keep the switches as they are */
        isa_forced = env;
        isa_on[ISA_DEFAULT] = 1;
        snprintf(isa_label[ISA_DEFAULT], sizeof isa_label[0], "forced: GERBIL_CPU_ISA=%.20s", env);
        return;
    }
    cpu_force_ref(0);
    qmatmul_disable_avx512(0);
    isa_on[ISA_DEFAULT] = 1;
    isa_on[ISA_AVX2] = qmatmul_has_avx512(); /* else the default already is AVX2 (or scalar) */
    isa_on[ISA_SCALAR] = cpu_has_avx2();     /* else the default already is scalar */
    snprintf(isa_label[ISA_DEFAULT], sizeof isa_label[0], "default: %s",
             qmatmul_has_avx512() ? (qmatmul_has_bf16() ? "AVX-512 + BF16 GEMMs" : "AVX-512")
             : cpu_has_avx2()     ? "AVX2"
                                  : "scalar");
    snprintf(isa_label[ISA_AVX2], sizeof isa_label[0], "AVX2/VNNI (AVX-512 off)");
    snprintf(isa_label[ISA_SCALAR], sizeof isa_label[0], "scalar (cpu_force_ref)");
}

static int isa_enter(int m) {
    if (!isa_on[m]) return 0;
    if (isa_forced) return isa_runs[m]++, 1;
    cpu_force_ref(m == ISA_SCALAR);
    qmatmul_disable_avx512(m == ISA_AVX2);
    isa_runs[m]++;
    return 1;
}
static void isa_leave(void) {
    if (isa_forced) return;
    cpu_force_ref(0);
    qmatmul_disable_avx512(0);
    qmatmul_set_gemm_min_tok(-1);
}

/* for each instruction set m and thread count th + 1 (backend cpu[th] or one's own pair);
 * the switches are restored when the loop ends (no break out of it) */
#define FOR_CPU(m, th)                                          \
    for (int m = 0; m < N_ISA || (isa_leave(), 0); m++)         \
        if (isa_enter(m))                                       \
            for (int th = 0; th < 2; th++)

static const char *at(int m, int th) {
    static char buf[192];
    snprintf(buf, sizeof buf, "%s, %d thread%s", isa_label[m], th + 1, th ? "s" : "");
    return buf;
}

/* ---- comparisons ---- */

/* got against want: |got - want| <= tol[i], or (tol NULL) the same bits. NaN fails. Prints
 * the first few offenders; returns 1 when all pass. */
static int within(const char *what, const char *where, const float *got, const float *want, const double *tol,
                  size_t n) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        int ok = tol ? fabs((double)got[i] - (double)want[i]) <= tol[i] : fp32_to_bits(got[i]) == fp32_to_bits(want[i]);
        if (ok) continue;
        if (bad < 3) {
            if (tol)
                fprintf(stderr, "  %s [%s]: [%zu] = %.9g, want %.9g (tol %.3g)\n", what, where, i, got[i], want[i],
                        tol[i]);
            else
                fprintf(stderr, "  %s [%s]: [%zu] = %.9g (%08x), want %.9g (%08x)\n", what, where, i, got[i],
                        fp32_to_bits(got[i]), want[i], fp32_to_bits(want[i]));
        }
        bad++;
    }
    CHECKF(bad == 0, "%s [%s]: %zu of %zu elements %s (seed %llu)", what, where, bad, n,
           tol ? "out of tolerance" : "not bit-identical", seed0);
    return bad == 0;
}
static int exact(const char *what, const char *where, const float *got, const float *want, size_t n) {
    return within(what, where, got, want, NULL, n);
}
/* |got - want| <= rel |want| + abs_tol[i] (abs_tol NULL: 0) + 1e-30 */
static int near(const char *what, const char *where, const float *got, const float *want, size_t n, double rel,
                const double *abs_tol) {
    double *tol = dmalloc(n);
    for (size_t i = 0; i < n; i++) tol[i] = rel * fabs((double)want[i]) + (abs_tol ? abs_tol[i] : 0.0) + 1e-30;
    int ok = within(what, where, got, want, tol, n);
    free(tol);
    return ok;
}
static int near_abs(const char *what, const char *where, const float *got, const float *want, size_t n, double a,
                    double rel) {
    double *tol = dmalloc(n);
    for (size_t i = 0; i < n; i++) tol[i] = a + rel * fabs((double)want[i]);
    int ok = within(what, where, got, want, tol, n);
    free(tol);
    return ok;
}

static struct backend *new_cpu(int n_threads) {
    struct backend *b = NULL;
    if (backend_new("cpu", n_threads, &b) != GERBIL_OK) {
        fprintf(stderr, "backend_new(cpu, %d): %s\n", n_threads, gerbil_last_error());
        exit(1);
    }
    return b;
}

/* =====================================================================================
 * Buffers and the table's other entries: the same behaviour on both backends
 * ===================================================================================== */

static void test_buffers(struct backend *be, int n_threads) {
    const struct backend_ops *o = be->ops;
    CHECKF(o->n_threads(be) == n_threads, "%s: n_threads %d, want %d", o->name, o->n_threads(be), n_threads);
    /* a small buffer and a large lazy one (the CPU backend maps those from 1 MiB on) */
    const size_t sizes[2] = {1000 + (size_t)rand_int(100), (3u << 20) + 4 * (size_t)rand_int(1000)};
    for (int k = 0; k < 2; k++) {
        const size_t n = sizes[k];
        unsigned char *a = o->alloc(be, n, GB_BUF_ZERO), *b = o->alloc(be, n, k ? GB_BUF_LAZY : 0);
        CHECKF(a && b && (uintptr_t)a % 64 == 0 && (uintptr_t)b % 64 == 0, "%s: alloc(%zu) %p %p", o->name, n,
               (void *)a, (void *)b);
        if (!a || !b) return;
        int zero = 1;
        for (size_t i = 0; i < n; i++) zero &= a[i] == 0;
        CHECKF(zero, "%s: alloc(%zu, GB_BUF_ZERO) is not zero", o->name, n);
        unsigned char *h = xmalloc(n), *h2 = xmalloc(n);
        for (size_t i = 0; i < n; i++) h[i] = (unsigned char)test_rand_u64(&rng);
        o->upload(be, a, h, n);
        o->copy(be, b, a, n);
        o->copy(be, a + 1, a, n / 2); /* overlapping: memmove */
        o->zero(be, a + n / 2 + 1, n - n / 2 - 1);
        o->sync(be);
        o->download(be, h2, b, n);
        CHECKF(memcmp(h, h2, n) == 0, "%s: upload, copy, download of %zu bytes", o->name, n);
        o->download(be, h2, a, n);
        int ok = h2[0] == h[0];
        for (size_t i = 1; i < n; i++) ok &= h2[i] == (i <= n / 2 ? h[i - 1] : 0);
        CHECKF(ok, "%s: an overlapping copy or zero of %zu bytes", o->name, n);
        o->buf_free(be, a, n);
        o->buf_free(be, b, n);
        free(h), free(h2);
    }
    const struct gb_seg seg = {.row0 = 0, .n_rows = 1};
    const int32_t one = 1, zero = 0;
    const struct gb_batch bt = {.n_rows = 1, .n_segs = 1, .segs = &seg, .span = &one, .seg_of = &zero, .tok = &zero,
                                .kv_row = &zero, .pos = &zero};
    o->batch_begin(be, &bt);
}

/* =====================================================================================
 * Weights of every format
 * ===================================================================================== */

struct fmt {
    enum gb_weight_kind kind;
    enum gb_type type;  /* PLAIN: the row type */
    int bits, gs, pack; /* MLX */
    enum gb_type sbt;   /* MLX scales and biases */
};

static int is_float_fmt(const struct fmt *f) {
    return f->kind == GB_WEIGHT_PLAIN && (f->type == GB_TYPE_F32 || f->type == GB_TYPE_F16 || f->type == GB_TYPE_BF16);
}

static void fmt_name(const struct fmt *f, char *buf, size_t n) {
    if (f->kind == GB_WEIGHT_PLAIN) snprintf(buf, n, "%s", type_name(f->type));
    else snprintf(buf, n, "mlx%d gs%d %s%s", f->bits, f->gs, type_name(f->sbt), f->pack ? " packed" : "");
}

/* Row lengths: odd where the format allows (float rows: vector tails), an odd number of
 * 32-blocks (partial 256-chunks of the GEMMs), two k-quant super-blocks, MLX rows of 3
 * chunks of 128 (the AVX-512 kernels) or, for 32-groups, of 13 blocks (not a multiple of
 * 128: the AVX2 kernels even where AVX-512 is there). */
static int fmt_n_in(const struct fmt *f) {
    if (f->kind == GB_WEIGHT_MLX) return f->gs == 32 && !f->pack ? 416 : 384;
    if (is_float_fmt(f)) return 75;
    return type_traits(f->type)->block_size == QK_K ? 512 : 160;
}

static const enum gb_type PLAIN_TYPES[] = {GB_TYPE_F32,  GB_TYPE_F16,  GB_TYPE_BF16, GB_TYPE_Q4_0, GB_TYPE_Q4_1,
                                           GB_TYPE_Q5_0, GB_TYPE_Q5_1, GB_TYPE_Q8_0, GB_TYPE_Q2_K, GB_TYPE_Q3_K,
                                           GB_TYPE_Q4_K, GB_TYPE_Q5_K, GB_TYPE_Q6_K};
static const int MLX_BITS[] = {2, 3, 4, 5, 6, 8}, MLX_GS[] = {32, 64, 128};
static const enum gb_type SB_TYPES[] = {GB_TYPE_F16, GB_TYPE_BF16, GB_TYPE_F32};

static struct fmt plain_fmt(enum gb_type t) { return (struct fmt){.kind = GB_WEIGHT_PLAIN, .type = t}; }
static struct fmt mlx_fmt(int bits, int gs, int pack) {
    return (struct fmt){.kind = GB_WEIGHT_MLX, .type = GB_TYPE_U32, .bits = bits, .gs = gs, .pack = pack,
                        .sbt = SB_TYPES[(bits + gs / 32) % 3]};
}

/* Every format: the plain and GGML types, MLX bits x group sizes, MLX 4-bit packed. */
static int all_formats(struct fmt *out) {
    int n = 0;
    for (int i = 0; i < COUNT(PLAIN_TYPES); i++) out[n++] = plain_fmt(PLAIN_TYPES[i]);
    for (int b = 0; b < COUNT(MLX_BITS); b++)
        for (int g = 0; g < COUNT(MLX_GS); g++) out[n++] = mlx_fmt(MLX_BITS[b], MLX_GS[g], 0);
    for (int g = 0; g < COUNT(MLX_GS); g++) out[n++] = mlx_fmt(4, MLX_GS[g], 1);
    return n;
}
enum { MAX_FORMATS = 40 };

/* A test weight: the matrix in its format and what it holds as f32. */
struct tw {
    struct fmt f;
    struct gb_weight w;
    struct gb_weight wr;    /* w as the ref backend gets it: never rearranged (the CPU's packed
                               layout is the CPU backend's own) */
    void *data, *sc, *bi, *data_ref;
    float *deq; /* [n_out][n_in] weight_get_row */
    float *mag; /* [n_out][n_in] the magnitudes of S (see the header) */
    char name[48];
};

/* Random rows (scales spread over 3 decades, some rows shifted: the mins and biases
 * matter) made by the reference quantizers; MLX 4-bit with pack: given to weight_prepare
 * with writable set (the loader's own copy), which packs where this CPU wants it. */
static void make_tw(struct tw *t, const struct fmt *f, int n_out, int n_in) {
    memset(t, 0, sizeof *t);
    t->f = *f;
    fmt_name(f, t->name, sizeof t->name);
    const size_t nn = (size_t)n_out * (size_t)n_in;
    float *src = fmalloc((size_t)n_in);
    t->deq = fmalloc(nn);
    t->mag = fmalloc(nn);
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
        const size_t esz = f->type == GB_TYPE_F32 ? 4 : 2;
        t->data = xmalloc(nn * esz);
        for (int o = 0; o < n_out; o++) {
            float scale = 0.01f + (float)rand_int(1000) / 100.0f;
            for (int i = 0; i < n_in; i++) {
                const size_t k = (size_t)o * n_in + i;
                const float v = test_rand_f(&rng) * scale;
                if (f->type == GB_TYPE_F32) ((float *)t->data)[k] = v;
                else if (f->type == GB_TYPE_F16) ((uint16_t *)t->data)[k] = f32_to_f16(v);
                else ((uint16_t *)t->data)[k] = f32_to_bf16(v);
            }
        }
        t->w = (struct gb_weight){.kind = GB_WEIGHT_PLAIN, .type = f->type, .n_out = n_out, .n_in = n_in,
                                  .data = t->data, .row_bytes = (size_t)n_in * esz, .name = t->name};
    } else {
        const struct gb_quant_fns qf = quant_fns(f->type);
        GB_ASSERT(qf.from_float != NULL);
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
    for (int o = 0; o < n_out; o++) weight_get_row(&t->w, o, t->deq + (size_t)o * n_in);
    for (int o = 0; o < n_out; o++) {
        const float *d = t->deq + (size_t)o * n_in;
        float *m = t->mag + (size_t)o * n_in;
        if (f->kind == GB_WEIGHT_MLX) {
            const size_t ng = (size_t)(n_in / f->gs);
            for (int i = 0; i < n_in; i++) {
                const size_t g = (size_t)o * ng + (size_t)(i / f->gs);
                m[i] = 2.0f * (fabsf(d[i]) + fabsf(mlx_sb_value(f->sbt, t->bi, g)) +
                               255.0f * fabsf(mlx_sb_value(f->sbt, t->sc, g)));
            }
        } else {
            for (int i = 0; i < n_in; i += 32) {
                const int e = i + 32 < n_in ? i + 32 : n_in;
                float mx = 0.0f;
                for (int j = i; j < e; j++) mx = fmaxf(mx, fabsf(d[j]));
                for (int j = i; j < e; j++) m[j] = fabsf(d[j]) + 2.0f * mx;
            }
        }
    }
    t->wr = t->w;
    t->data_ref = NULL;
    if (f->pack) {
        const size_t nb = (size_t)n_out * (size_t)n_in / 2;
        t->data_ref = xmalloc(nb);
        memcpy(t->data_ref, t->w.data, nb);
        t->wr.data = t->data_ref;
        const int want = qmatmul_wants_pack(&t->w);
        packer->ops->weight_prepare(packer, &t->w, 1, 1);
        CHECKF(t->w.packed == want, "%s: weight_prepare(writable) packed %d, want %d", t->name, t->w.packed, want);
        float *row = fmalloc((size_t)n_in);
        int same = 1;
        for (int o = 0; o < n_out; o++) {
            cpu_weight_row(&t->w, o, row);
            same &= memcmp(row, t->deq + (size_t)o * n_in, (size_t)n_in * sizeof *row) == 0;
        }
        CHECKF(same, "%s: a packed row reads back differently", t->name);
        free(row);
    }
    free(src);
}

static void free_tw(struct tw *t) {
    free(t->data), free(t->sc), free(t->bi), free(t->deq), free(t->mag), free(t->data_ref);
}

/* The tolerances of rows x[0 .. n) times t's matrix against the reference's yref (bias
 * NULL or [n_out]): per output, into tol [n][n_out]; gemm: the prefill GEMMs' bounds
 * instead of the per-token kernels'. See the header. */
static void mm_tols(double *tol, const struct tw *t, const float *x, int n, const float *yref, const float *bias,
                    int gemm) {
    const int n_in = (int)t->w.n_in, n_out = (int)t->w.n_out;
    const int fl = is_float_fmt(&t->f), mlx = t->f.kind == GB_WEIGHT_MLX;
    const int sum_wx = fl || (gemm && !mlx); /* bounds by sum |w x| alone */
    const int blk = mlx ? (gemm ? t->f.gs : 32) : fl ? 1 : (type_traits(t->w.type)->block_size == QK_K ? QK_K : 32);
    const double levels = mlx ? 32767.0 : 127.0;
    double *half_step = dmalloc((size_t)n_in);
    for (int r = 0; r < n; r++) {
        const float *xr = x + (size_t)r * n_in;
        if (!sum_wx)
            for (int b = 0; b < n_in; b += blk) {
                float amax = 0.0f;
                for (int i = b; i < b + blk; i++) amax = fmaxf(amax, fabsf(xr[i]));
                for (int i = b; i < b + blk; i++) half_step[i] = amax / levels / 2.0;
            }
        for (int o = 0; o < n_out; o++) {
            const float *w = t->deq + (size_t)o * n_in, *mg = t->mag + (size_t)o * n_in;
            double e, a = 0.0, s = 0.0;
            if (sum_wx) {
                for (int i = 0; i < n_in; i++) s += fabs((double)w[i] * xr[i]);
                e = fl ? (n_in + 4) * 0x1p-24 * s : (0x1p-8 + n_in * 0x1p-24) * 1.01 * s;
            } else {
                for (int i = 0; i < n_in; i++) {
                    a += fabs((double)w[i]) * half_step[i];
                    s += (double)mg[i] * fabs((double)xr[i]);
                }
                e = 1.001 * a + 1e-5 * s;
            }
            const size_t k = (size_t)r * n_out + o;
            tol[k] = e + 0x1p-22 * (fabs((double)yref[k]) + (bias ? fabs((double)bias[o]) : 0.0)) + 1e-30;
        }
    }
    free(half_step);
}

/* Whether this CPU has a GEMM for t at all (then its bounds are computed too). */
static int gemm_possible(const struct tw *t) {
    return !is_float_fmt(&t->f) && (t->f.kind != GB_WEIGHT_MLX || t->f.bits == 4 || t->f.bits == 8) &&
           qmatmul_has_bf16();
}
/* Whether a row of this span takes t's GEMM now (the ISA switches and threshold as set). */
static int takes_gemm(const struct tw *t, int span) {
    return !is_float_fmt(&t->f) && span >= matmul_w_min_span(&t->w);
}

/* A batch of segments: sizes non-decreasing; span[t] = its segment's size. */
struct rowset {
    int n, n_seg;
    int row0[16], len[16];
    int32_t *span; /* NULL: one segment, span NULL in the call */
};

static void rowset_make(struct rowset *rs, const int *sizes, int n_seg) {
    memset(rs, 0, sizeof *rs);
    GB_ASSERT(n_seg <= 16);
    rs->n_seg = n_seg;
    for (int s = 0; s < n_seg; s++) {
        rs->row0[s] = rs->n;
        rs->len[s] = sizes[s];
        rs->n += sizes[s];
    }
    rs->span = xmalloc((size_t)rs->n * sizeof *rs->span);
    for (int s = 0; s < n_seg; s++)
        for (int r = 0; r < sizes[s]; r++) rs->span[rs->row0[s] + r] = sizes[s];
}
static void rowset_single(struct rowset *rs, int n) {
    memset(rs, 0, sizeof *rs);
    rs->n = n;
    rs->n_seg = 1;
    rs->len[0] = n;
}
static int row_span(const struct rowset *rs, int t) { return rs->span ? rs->span[t] : rs->n; }

static const int N_TOK[] = {1, 3, 17, 40, 70};
/* decode rows (1), small segments, two equal ones, and segments around the GEMM
 * thresholds (32 rows MLX, 48 GGML) */
static const int SEGS[] = {1, 1, 1, 3, 5, 5, 17, 33, 40, 50};
enum { SEG_ROWS = 1 + 1 + 1 + 3 + 5 + 5 + 17 + 33 + 40 + 50 };

/* Passes over a batch: 0 with the default GEMM thresholds, 1 with the threshold at 4 rows
 * (only where there is a GEMM: the default instruction set with AVX512-BF16). */
static int pass_runs(int pass, int m) { return pass == 0 || (m == ISA_DEFAULT && qmatmul_has_bf16()); }
static void pass_set(int pass) { qmatmul_set_gemm_min_tok(pass ? 4 : -1); }

/* ---- matmul ---- */

/* One set of rows through t's matrix on the CPU backends c (1, 2 threads): within the
 * bound of the reference, the same bits for 1 and 2 threads, and with segments each
 * segment's rows the bits of a call over that segment alone; in the default instruction
 * set, rows of spans below the GEMM threshold have the per-token kernels' bits and rows
 * above it not (so the spans chose the method and the GEMM ran). */
static void matmul_rows_check(const struct tw *t, struct backend *c[2], const float *bias, const struct rowset *rs) {
    const int n = rs->n, n_in = (int)t->w.n_in, n_out = (int)t->w.n_out;
    const size_t ny = (size_t)n * n_out;
    float *x = rnd_x((size_t)n * n_in), *yref = poisoned(ny), *y[2] = {poisoned(ny), poisoned(ny)};
    const struct gb_rows rows = {n, rs->span};
    op_matmul(ref, yref, x, &t->wr, bias, rows);
    double *tol_tok = dmalloc(ny), *tol_gemm = gemm_possible(t) ? dmalloc(ny) : NULL, *tol = dmalloc(ny);
    mm_tols(tol_tok, t, x, n, yref, bias, 0);
    if (tol_gemm) mm_tols(tol_gemm, t, x, n, yref, bias, 1);
    char what[128];
    for (int pass = 0; pass < (rs->span ? 2 : 1); pass++) {
        FOR_CPU(m, th) {
            if (!pass_runs(pass, m)) continue;
            pass_set(pass);
            snprintf(what, sizeof what, "matmul %s %d rows%s%s", t->name, n, rs->span ? " in segments" : "",
                     pass ? " (GEMM from 4 rows)" : "");
            for (int r = 0; r < n; r++) {
                const double *src = takes_gemm(t, row_span(rs, r)) && tol_gemm ? tol_gemm : tol_tok;
                memcpy(tol + (size_t)r * n_out, src + (size_t)r * n_out, (size_t)n_out * sizeof *tol);
            }
            poison(y[th], ny);
            op_matmul(c[th], y[th], x, &t->w, bias, rows);
            within(what, at(m, th), y[th], yref, tol, ny);
            if (th == 1) {
                char w2[160];
                snprintf(w2, sizeof w2, "%s: 2 threads against 1", what);
                exact(w2, at(m, th), y[1], y[0], ny);
            }
            if (!rs->span) continue;
            int bad_seg = -1;
            for (int s = 0; s < rs->n_seg; s++) {
                const size_t nys = (size_t)rs->len[s] * n_out;
                float *ys = poisoned(nys);
                op_matmul(c[th], ys, x + (size_t)rs->row0[s] * n_in, &t->w, bias, (struct gb_rows){rs->len[s], NULL});
                if (memcmp(ys, y[th] + (size_t)rs->row0[s] * n_out, nys * sizeof *ys) != 0 && bad_seg < 0) bad_seg = s;
                free(ys);
            }
            CHECKF(bad_seg < 0, "%s [%s]: segment %d (%d rows from row %d) differs from the segment alone (seed %llu)",
                   what, at(m, th), bad_seg, bad_seg < 0 ? 0 : rs->len[bad_seg], bad_seg < 0 ? 0 : rs->row0[bad_seg],
                   seed0);
            const int ms = matmul_w_min_span(&t->w);
            if (m == ISA_DEFAULT && !is_float_fmt(&t->f) && ms != INT_MAX && ms <= rs->span[n - 1]) {
                float *yt = poisoned(ny);
                qmatmul_set_gemm_min_tok(0); /* every row per token */
                op_matmul(c[th], yt, x, &t->w, bias, rows);
                pass_set(pass);
                int split = 0;
                while (rs->span[split] < ms) split++;
                const size_t k = (size_t)split * n_out;
                CHECKF(memcmp(yt, y[th], k * sizeof *yt) == 0,
                       "%s [%s]: rows of span < %d differ from the per-token kernels (seed %llu)", what, at(m, th), ms,
                       seed0);
                CHECKF(memcmp(yt + k, y[th] + k, (ny - k) * sizeof *yt) != 0,
                       "%s [%s]: rows of span >= %d have the per-token kernels' bits: no GEMM ran", what, at(m, th),
                       ms);
                free(yt);
            }
        }
    }
    free(x), free(yref), free(y[0]), free(y[1]), free(tol_tok), free(tol_gemm), free(tol);
}

/* A pair of CPU backends (1, 2 threads) that know the n weights w (weight_prepare, not
 * writable) and have scratch for r; made under the default instruction set, whose
 * scratch is the largest. */
static void cpus_for(struct backend *c[2], struct gb_weight *const *w, int n, const struct gb_reserve *r) {
    for (int th = 0; th < 2; th++) {
        c[th] = new_cpu(th + 1);
        for (int i = 0; i < n; i++) c[th]->ops->weight_prepare(c[th], w[i], 1, 0);
        CHECK(c[th]->ops->reserve(c[th], r) == GERBIL_OK);
    }
}

static void test_matmul(const struct fmt *f) {
    const int n_out = 37, n_in = fmt_n_in(f);
    struct tw t;
    make_tw(&t, f, n_out, n_in);
    struct backend *c[2];
    struct gb_weight *wp = &t.w;
    cpus_for(c, &wp, 1, &(struct gb_reserve){.n_rows = SEG_ROWS});
    float *bias = rnd((size_t)n_out, 1.0f);
    struct rowset rs;
    for (int i = 0; i < COUNT(N_TOK); i++) {
        rowset_single(&rs, N_TOK[i]);
        matmul_rows_check(&t, c, i == 1 ? NULL : bias, &rs);
    }
    rowset_make(&rs, SEGS, COUNT(SEGS));
    matmul_rows_check(&t, c, bias, &rs);
    free(rs.span);
    backend_free(c[0]), backend_free(c[1]);
    free(bias);
    free_tw(&t);
}

/* ---- matmul_multi: the bits of k matmul calls, and batch-invariant ---- */

struct mset {
    int k, n_in;
    struct fmt f[4];
};

static void test_matmul_multi(const struct mset *ms) {
    static const int n_outs[4] = {37, 21, 8, 45};
    struct tw t[4];
    struct gb_weight *wp[4];
    const struct gb_weight *cw[4];
    float *bias[4];
    char name[256] = "";
    for (int i = 0; i < ms->k; i++) {
        make_tw(&t[i], &ms->f[i], n_outs[i], ms->n_in);
        wp[i] = &t[i].w;
        cw[i] = &t[i].w;
        bias[i] = i == 1 ? NULL : rnd((size_t)n_outs[i], 1.0f);
        if (i) strcat(name, ", ");
        strcat(name, t[i].name); /* 4 names of < 48 */
    }
    struct backend *c[2];
    cpus_for(c, wp, ms->k, &(struct gb_reserve){.n_rows = SEG_ROWS});
    for (int set = 0; set <= COUNT(N_TOK); set++) {
        struct rowset rs;
        if (set < COUNT(N_TOK)) rowset_single(&rs, N_TOK[set]);
        else rowset_make(&rs, SEGS, COUNT(SEGS));
        const int n = rs.n;
        const struct gb_rows rows = {n, rs.span};
        const float *const *b = set == 1 ? NULL : (const float *const *)bias;
        float *x = rnd_x((size_t)n * ms->n_in), *y[2][4], *y1[4];
        for (int i = 0; i < ms->k; i++) {
            y[0][i] = poisoned((size_t)n * n_outs[i]);
            y[1][i] = poisoned((size_t)n * n_outs[i]);
            y1[i] = poisoned((size_t)n * n_outs[i]);
        }
        for (int pass = 0; pass < (rs.span ? 2 : 1); pass++) {
            FOR_CPU(m, th) {
                if (!pass_runs(pass, m)) continue;
                pass_set(pass);
                char what[400];
                snprintf(what, sizeof what, "matmul_multi k=%d {%s} %d rows%s%s", ms->k, name, n,
                         rs.span ? " in segments" : "", pass ? " (GEMM from 4 rows)" : "");
                for (int i = 0; i < ms->k; i++) poison(y[th][i], (size_t)n * n_outs[i]);
                op_matmul_multi(c[th], ms->k, y[th], x, cw, b, rows);
                int same = 1, same_th = 1;
                for (int i = 0; i < ms->k; i++) {
                    poison(y1[i], (size_t)n * n_outs[i]);
                    op_matmul(c[th], y1[i], x, cw[i], b ? b[i] : NULL, rows);
                    same &= memcmp(y1[i], y[th][i], (size_t)n * n_outs[i] * sizeof(float)) == 0;
                    if (th) same_th &= memcmp(y[1][i], y[0][i], (size_t)n * n_outs[i] * sizeof(float)) == 0;
                }
                CHECKF(same, "%s [%s]: differs from separate matmul calls (seed %llu)", what, at(m, th), seed0);
                CHECKF(same_th, "%s [%s]: 2 threads differ from 1 (seed %llu)", what, at(m, th), seed0);
                if (!rs.span) continue;
                int bad_seg = -1;
                for (int s = 0; s < rs.n_seg; s++) {
                    float *ys[4];
                    for (int i = 0; i < ms->k; i++) ys[i] = poisoned((size_t)rs.len[s] * n_outs[i]);
                    op_matmul_multi(c[th], ms->k, ys, x + (size_t)rs.row0[s] * ms->n_in, cw, b,
                                    (struct gb_rows){rs.len[s], NULL});
                    for (int i = 0; i < ms->k; i++) {
                        if (memcmp(ys[i], y[th][i] + (size_t)rs.row0[s] * n_outs[i],
                                   (size_t)rs.len[s] * n_outs[i] * sizeof(float)) != 0 && bad_seg < 0)
                            bad_seg = s;
                        free(ys[i]);
                    }
                }
                CHECKF(bad_seg < 0, "%s [%s]: segment %d (%d rows) differs from the segment alone (seed %llu)", what,
                       at(m, th), bad_seg, bad_seg < 0 ? 0 : rs.len[bad_seg], seed0);
            }
        }
        for (int i = 0; i < ms->k; i++) free(y[0][i]), free(y[1][i]), free(y1[i]);
        free(x);
        free(rs.span);
    }
    backend_free(c[0]), backend_free(c[1]);
    for (int i = 0; i < ms->k; i++) free_tw(&t[i]), free(bias[i]);
}

/* ---- matmul_id ---- */

/* Rows of segments of 1 .. 70 rows, n_sel 2 slots each routed to one of 4 experts (slot 0
 * mostly to expert 0, so that one segment's expert-0 rows pass the GEMM thresholds while
 * the others stay below; slot 1 may repeat slot 0's expert). Against the reference with
 * x_per_slot 0 and 1, and each segment's rows routed alone (a batch of that segment). */
static void test_matmul_id(const struct fmt *f) {
    enum { NM = 4, NSEL = 2, NSEG = 6 };
    static const int sizes[NSEG] = {1, 1, 2, 5, 20, 70};
    const int n_out = 21, n_in = fmt_n_in(f);
    struct tw t[NM];
    struct gb_weight stack[NM], stack_ref[NM];
    for (int e = 0; e < NM; e++) {
        make_tw(&t[e], f, n_out, n_in);
        stack[e] = t[e].w;
        stack_ref[e] = t[e].wr;
    }
    struct gb_seg segs[NSEG];
    int n = 0;
    for (int s = 0; s < NSEG; s++) {
        segs[s] = (struct gb_seg){.row0 = n, .n_rows = sizes[s], .state = s};
        n += sizes[s];
    }
    int32_t *span = xmalloc((size_t)n * sizeof *span), *seg_of = xmalloc((size_t)n * sizeof *seg_of);
    int32_t *ids = xmalloc((size_t)n * NSEL * sizeof *ids), *one = xmalloc((size_t)n * sizeof *one);
    for (int s = 0; s < NSEG; s++)
        for (int r = segs[s].row0; r < segs[s].row0 + segs[s].n_rows; r++) span[r] = sizes[s], seg_of[r] = s;
    for (int r = 0; r < n; r++) {
        ids[r * NSEL] = rand_int(4) < 3 ? 0 : rand_int(NM);
        ids[r * NSEL + 1] = rand_int(NM);
        one[r] = 0;
    }
    int cnt[NSEG][NM] = {{0}}; /* the span of a (segment, expert): its rows routed there */
    for (int r = 0; r < n * NSEL; r++) cnt[seg_of[r / NSEL]][ids[r]]++;
    const struct gb_batch b = {.n_rows = n, .n_segs = NSEG, .segs = segs, .span = span, .seg_of = seg_of};
    struct backend *c[2];
    struct gb_weight *sp = stack;
    for (int th = 0; th < 2; th++) {
        c[th] = new_cpu(th + 1);
        c[th]->ops->weight_prepare(c[th], sp, NM, 0);
        CHECK(c[th]->ops->reserve(c[th], &(struct gb_reserve){.n_rows = n, .n_sel = NSEL}) == GERBIL_OK);
    }
    const size_t ny = (size_t)n * NSEL * n_out;
    double *tol_tok = dmalloc(ny), *tol_gemm = dmalloc(ny), *tol = dmalloc(ny);
    for (int xps = 0; xps <= 1; xps++) {
        const size_t xrow = (size_t)(xps ? NSEL : 1) * n_in; /* floats of x per batch row */
        float *x = rnd_x((size_t)n * xrow), *yref = poisoned(ny), *y[2] = {poisoned(ny), poisoned(ny)};
        op_matmul_id(ref, yref, x, xps, stack_ref, NM, ids, NSEL, &b, n);
        for (int r = 0; r < n * NSEL; r++) {
            const float *xr = x + (size_t)(xps ? r : r / NSEL) * n_in;
            const size_t o = (size_t)r * n_out;
            mm_tols(tol_tok + o, &t[ids[r]], xr, 1, yref + o, NULL, 0);
            if (gemm_possible(&t[0])) mm_tols(tol_gemm + o, &t[ids[r]], xr, 1, yref + o, NULL, 1);
        }
        char what[128];
        for (int pass = 0; pass < 2; pass++) {
            FOR_CPU(m, th) {
                if (!pass_runs(pass, m)) continue;
                pass_set(pass);
                snprintf(what, sizeof what, "matmul_id %s x_per_slot %d%s", t[0].name, xps,
                         pass ? " (GEMM from 4 rows)" : "");
                for (int r = 0; r < n * NSEL; r++) {
                    const int g = gemm_possible(&t[0]) && takes_gemm(&t[ids[r]], cnt[seg_of[r / NSEL]][ids[r]]);
                    memcpy(tol + (size_t)r * n_out, (g ? tol_gemm : tol_tok) + (size_t)r * n_out,
                           (size_t)n_out * sizeof *tol);
                }
                poison(y[th], ny);
                op_matmul_id(c[th], y[th], x, xps, stack, NM, ids, NSEL, &b, n);
                within(what, at(m, th), y[th], yref, tol, ny);
                if (th == 1) {
                    char w2[160];
                    snprintf(w2, sizeof w2, "%s: 2 threads against 1", what);
                    exact(w2, at(m, th), y[1], y[0], ny);
                }
                int bad_seg = -1;
                for (int s = 0; s < NSEG; s++) {
                    const int nr = segs[s].n_rows, r0 = segs[s].row0;
                    const struct gb_seg s1 = {.row0 = 0, .n_rows = nr};
                    const struct gb_batch b1 = {.n_rows = nr, .n_segs = 1, .segs = &s1, .span = span + r0,
                                                .seg_of = one};
                    const size_t nys = (size_t)nr * NSEL * n_out;
                    float *ys = poisoned(nys);
                    op_matmul_id(c[th], ys, x + (size_t)r0 * xrow, xps, stack, NM, ids + (size_t)r0 * NSEL, NSEL, &b1,
                                 nr);
                    if (memcmp(ys, y[th] + (size_t)r0 * NSEL * n_out, nys * sizeof *ys) != 0 && bad_seg < 0)
                        bad_seg = s;
                    free(ys);
                }
                CHECKF(bad_seg < 0, "%s [%s]: segment %d (%d rows) differs from its rows routed alone (seed %llu)",
                       what, at(m, th), bad_seg, bad_seg < 0 ? 0 : sizes[bad_seg], seed0);
            }
        }
        free(x), free(yref), free(y[0]), free(y[1]);
    }
    backend_free(c[0]), backend_free(c[1]);
    for (int e = 0; e < NM; e++) free_tw(&t[e]);
    free(span), free(seg_of), free(ids), free(one), free(tol_tok), free(tol_gemm), free(tol);
}

/* =====================================================================================
 * Rows
 * ===================================================================================== */

/* get_rows from tables of several formats (MLX 4-bit packed too): the reference's bits,
 * the table's rows as weight_get_row reads them unpacked, rows with id -1 untouched. */
static void test_get_rows(void) {
    const struct fmt fs[] = {plain_fmt(GB_TYPE_F32),  plain_fmt(GB_TYPE_F16),  plain_fmt(GB_TYPE_BF16),
                             plain_fmt(GB_TYPE_Q4_0), plain_fmt(GB_TYPE_Q5_1), plain_fmt(GB_TYPE_Q8_0),
                             plain_fmt(GB_TYPE_Q3_K), plain_fmt(GB_TYPE_Q4_K), plain_fmt(GB_TYPE_Q6_K),
                             mlx_fmt(2, 32, 0),       mlx_fmt(3, 128, 0),      mlx_fmt(4, 64, 0),
                             mlx_fmt(4, 64, 1),       mlx_fmt(4, 32, 1),       mlx_fmt(5, 32, 0),
                             mlx_fmt(6, 64, 0),       mlx_fmt(8, 32, 0)};
    const int n_vocab = 29, n = 13;
    int32_t ids[13];
    for (int i = 0; i < n; i++) ids[i] = rand_int(n_vocab);
    ids[1] = -1, ids[7] = -1, ids[4] = ids[9], ids[0] = n_vocab - 1, ids[12] = 0;
    for (int k = 0; k < COUNT(fs); k++) {
        struct tw t;
        make_tw(&t, &fs[k], n_vocab, fmt_n_in(&fs[k]));
        const int n_in = (int)t.w.n_in;
        const size_t ny = (size_t)n * n_in;
        float *yref = poisoned(ny), *y = poisoned(ny), *want = poisoned(ny);
        op_get_rows(ref, yref, &t.wr, ids, n);
        for (int i = 0; i < n; i++)
            if (ids[i] >= 0) memcpy(want + (size_t)i * n_in, t.deq + (size_t)ids[i] * n_in, (size_t)n_in * sizeof *y);
        char what[96];
        snprintf(what, sizeof what, "get_rows %s (ref)", t.name);
        exact(what, "reference backend", yref, want, ny);
        snprintf(what, sizeof what, "get_rows %s", t.name);
        FOR_CPU(m, th) {
            poison(y, ny);
            op_get_rows(cpu[th], y, &t.w, ids, n);
            exact(what, at(m, th), y, want, ny);
        }
        free(yref), free(y), free(want);
        free_tw(&t);
    }
}

static void test_gather_copy(void) {
    const int width = 37, n_src = 11, n = 17;
    float *src = rnd((size_t)n_src * width, 3.0f), *yref = poisoned((size_t)n * width), *y = poisoned((size_t)n * width);
    int32_t idx[17];
    for (int t = 0; t < n; t++) idx[t] = rand_int(n_src);
    idx[3] = idx[5];
    op_gather_rows(ref, yref, src, idx, n, width);
    FOR_CPU(m, th) {
        poison(y, (size_t)n * width);
        op_gather_rows(cpu[th], y, src, idx, n, width);
        exact("gather_rows", at(m, th), y, yref, (size_t)n * width);
    }
    free(src), free(yref), free(y);

    /* [n1][n2][width] between padded layouts; the padding stays poisoned in both */
    const int n1 = 5, n2 = 3, wd = 19, s2 = 23, s1 = n2 * s2 + 4, d2 = 21, d1 = n2 * d2 + 7;
    float *s = rnd((size_t)n1 * s1, 2.0f), *dref = poisoned((size_t)n1 * d1), *d = poisoned((size_t)n1 * d1);
    op_copy_strided(ref, dref, d1, d2, s, s1, s2, n1, n2, wd);
    int pad_ok = 1;
    for (int i = 0; i < n1 * d1; i++) {
        const int r = i % d1;
        if (!(r / d2 < n2 && r % d2 < wd)) pad_ok &= is_poison(dref[i]);
    }
    CHECK(pad_ok);
    FOR_CPU(m, th) {
        poison(d, (size_t)n1 * d1);
        op_copy_strided(cpu[th], d, d1, d2, s, s1, s2, n1, n2, wd);
        exact("copy_strided", at(m, th), d, dref, (size_t)n1 * d1);
    }
    free(s), free(dref), free(d);
}

/* =====================================================================================
 * Norms and element-wise ops
 * ===================================================================================== */

static void test_norms(void) {
    /* 37 x 1031: enough work for the pool to split the rows */
    const int R = 37, n = 1031;
    const size_t N = (size_t)R * n;
    float *x = rnd(N, 2.0f), *z = rnd(N, 4.0f), *w = rnd((size_t)n, 1.5f), *yref = poisoned(N), *y = poisoned(N);
    for (int i = 0; i < n; i++) x[5 * n + i] *= 1000.0f, x[6 * n + i] *= 1e-3f; /* rows far from 1 */
    const float eps = 1e-6f;
    op_rmsnorm(ref, yref, x, w, eps, R, n);
    FOR_CPU(m, th) {
        poison(y, N);
        op_rmsnorm(cpu[th], y, x, w, eps, R, n);
        near("rmsnorm", at(m, th), y, yref, N, 0x1p-22, NULL);
        float *y2 = fdup(x, N);
        op_rmsnorm(cpu[th], y2, y2, w, eps, R, n);
        exact("rmsnorm in place against out of place", at(m, th), y2, y, N);
        free(y2);
    }
    op_rmsnorm_gated(ref, yref, x, z, w, eps, R, n);
    FOR_CPU(m, th) {
        poison(y, N);
        op_rmsnorm_gated(cpu[th], y, x, z, w, eps, R, n);
        exact("rmsnorm_gated", at(m, th), y, yref, N);
    }
    free(x), free(z), free(w), free(yref), free(y);

    /* l2norm_heads: 4 heads of 136 at offset 0 of rows of 551 floats; the rest untouched */
    const int rows = 61, nh = 4, d = 136, stride = nh * d + 7;
    const size_t M = (size_t)rows * stride;
    float *v = rnd(M, 1.0f), *vref = fdup(v, M);
    for (int i = 0; i < d; i++) v[2 * stride + i] *= 1e-4f; /* a small head: eps matters */
    memcpy(vref, v, M * sizeof *v);
    op_l2norm_heads(ref, vref, rows, nh, d, stride, 1e-6f, 0.37f);
    FOR_CPU(m, th) {
        float *u = fdup(v, M);
        op_l2norm_heads(cpu[th], u, rows, nh, d, stride, 1e-6f, 0.37f);
        exact("l2norm_heads", at(m, th), u, vref, M);
        free(u);
    }
    free(v), free(vref);
}

static void test_elementwise(void) {
    const long n = 40009; /* the pool splits it; an odd tail for the vector loops */
    float *g = rnd((size_t)n, 8.0f), *u = rnd((size_t)n, 2.0f), *yref = poisoned((size_t)n), *y = poisoned((size_t)n);
    double *gu = dmalloc((size_t)n);
    for (long i = 0; i < n; i++) gu[i] = 2e-6 * fabs((double)g[i] * u[i]);
    for (int gelu = 0; gelu <= 1; gelu++) {
        const char *what = gelu ? "gelu_tanh_mul" : "silu_mul";
        ref->ops->act_mul(ref, yref, g, u, n, gelu);
        FOR_CPU(m, th) {
            poison(y, (size_t)n);
            cpu[th]->ops->act_mul(cpu[th], y, g, u, n, gelu);
            if (m == ISA_SCALAR) exact(what, at(m, th), y, yref, (size_t)n);
            else near(what, at(m, th), y, yref, (size_t)n, 0.0, gu);
            float *ya = fdup(g, (size_t)n); /* y aliasing g */
            cpu[th]->ops->act_mul(cpu[th], ya, ya, u, n, gelu);
            exact(gelu ? "gelu_tanh_mul in place" : "silu_mul in place", at(m, th), ya, y, (size_t)n);
            free(ya);
        }
    }

    /* softcap */
    float *x = rnd((size_t)n, 60.0f), *xr = fdup(x, (size_t)n);
    const float cap = 2.0f + 30.0f * (test_rand_f(&rng) + 1.0f);
    op_softcap(ref, xr, cap, n);
    FOR_CPU(m, th) {
        float *xc = fdup(x, (size_t)n);
        op_softcap(cpu[th], xc, cap, n);
        if (m == ISA_SCALAR) exact("softcap", at(m, th), xc, xr, (size_t)n);
        else near("softcap", at(m, th), xc, xr, (size_t)n, 2e-6, NULL);
        free(xc);
    }

    /* scale, add, sigmoid_mul: one f32 operation (or the same few) per element */
    const float s = 0.3f + test_rand_f(&rng);
    memcpy(xr, x, (size_t)n * sizeof *x);
    op_scale(ref, xr, s, n);
    FOR_CPU(m, th) {
        float *xc = fdup(x, (size_t)n);
        op_scale(cpu[th], xc, s, n);
        exact("scale", at(m, th), xc, xr, (size_t)n);
        free(xc);
    }
    memcpy(xr, x, (size_t)n * sizeof *x);
    op_add(ref, xr, u, n);
    FOR_CPU(m, th) {
        float *xc = fdup(x, (size_t)n);
        op_add(cpu[th], xc, u, n);
        exact("add", at(m, th), xc, xr, (size_t)n);
        free(xc);
    }
    op_sigmoid_mul(ref, yref, x, g, n);
    FOR_CPU(m, th) {
        poison(y, (size_t)n);
        op_sigmoid_mul(cpu[th], y, x, g, n);
        exact("sigmoid_mul", at(m, th), y, yref, (size_t)n);
    }
    free(g), free(u), free(yref), free(y), free(gu), free(x), free(xr);

    /* mul_rows over strided rows, with and without the bias */
    const int R = 37, w = 1031, as = 3 * w + 1, bs = w + 5;
    float *a = rnd((size_t)R * as, 2.0f), *b = rnd((size_t)R * bs, 2.0f), *bias = rnd((size_t)w, 1.0f);
    float *mr = poisoned((size_t)R * w), *mc = poisoned((size_t)R * w);
    for (int wb = 0; wb <= 1; wb++) {
        op_mul_rows(ref, mr, a + w, as, b, bs, wb ? bias : NULL, R, w);
        FOR_CPU(m, th) {
            poison(mc, (size_t)R * w);
            op_mul_rows(cpu[th], mc, a + w, as, b, bs, wb ? bias : NULL, R, w);
            exact(wb ? "mul_rows with bias" : "mul_rows", at(m, th), mc, mr, (size_t)R * w);
        }
    }
    /* gated_add_rows */
    float *ga = rnd((size_t)R * w, 1.0f), *gy = rnd((size_t)R * w, 1.0f), *gg = rnd((size_t)R, 6.0f);
    op_gated_add_rows(ref, mr, ga, gy, gg, R, w);
    FOR_CPU(m, th) {
        poison(mc, (size_t)R * w);
        op_gated_add_rows(cpu[th], mc, ga, gy, gg, R, w);
        exact("gated_add_rows", at(m, th), mc, mr, (size_t)R * w);
    }
    free(a), free(b), free(bias), free(mr), free(mc), free(ga), free(gy), free(gg);

    /* deltanet_gates: g + dt_bias on both sides of softplus's cut at 20 */
    const int rows = 301, nv = 37;
    const size_t N = (size_t)rows * nv;
    float *beta = rnd(N, 8.0f), *gg2 = rnd(N, 30.0f), *A = fmalloc((size_t)nv), *dt = rnd((size_t)nv, 3.0f);
    for (int h = 0; h < nv; h++) A[h] = -expf(2.0f * test_rand_f(&rng));
    float *br = fdup(beta, N), *grf = fdup(gg2, N);
    op_deltanet_gates(ref, br, grf, A, dt, rows, nv);
    FOR_CPU(m, th) {
        float *bc = fdup(beta, N), *gc = fdup(gg2, N);
        op_deltanet_gates(cpu[th], bc, gc, A, dt, rows, nv);
        exact("deltanet_gates beta", at(m, th), bc, br, N);
        exact("deltanet_gates g", at(m, th), gc, grf, N);
        free(bc), free(gc);
    }
    free(beta), free(gg2), free(A), free(dt), free(br), free(grf);
}

/* ---- mixture of experts ---- */

static void test_moe_route(int n_expert, int k, int norm) {
    const int n = 23;
    const size_t nl = (size_t)n * n_expert;
    float *logits = rnd(nl, 4.0f);
    for (int e = 0; e < n_expert; e++) {
        logits[e] = (e % 3 == 1) ? 2.5f : fminf(logits[e], 2.4f); /* row 0: many ties at the top */
        logits[n_expert + e] = 0.75f;                    /* row 1: all equal */
        logits[2 * n_expert + e] = (float)(e / 2) * 0.5f; /* row 2: pairs of equal values */
    }
    float *lr = fdup(logits, nl), *wr = poisoned((size_t)n * k), *wc = poisoned((size_t)n * k);
    int32_t *ir = xmalloc((size_t)n * k * sizeof *ir), *ic = xmalloc((size_t)n * k * sizeof *ic);
    for (int i = 0; i < n * k; i++) ir[i] = -7;
    op_moe_route(ref, ir, wr, lr, n, n_expert, k, norm);
    CHECKF(ir[0] == 1 && (k < 2 || ir[1] == 4) && ir[k] == 0 && (k < 2 || ir[k + 1] == 1),
           "moe_route ties (reference): row 0 starts %d %d, row 1 %d %d", ir[0], k > 1 ? ir[1] : -1, ir[k],
           k > 1 ? ir[k + 1] : -1);
    char what[64];
    snprintf(what, sizeof what, "moe_route %d experts top %d norm %d", n_expert, k, norm);
    FOR_CPU(m, th) {
        float *lc = fdup(logits, nl);
        for (int i = 0; i < n * k; i++) ic[i] = -9;
        poison(wc, (size_t)n * k);
        op_moe_route(cpu[th], ic, wc, lc, n, n_expert, k, norm);
        CHECKF(memcmp(ic, ir, (size_t)n * k * sizeof *ic) == 0, "%s [%s]: ids differ (seed %llu)", what, at(m, th),
               seed0);
        exact(what, at(m, th), wc, wr, (size_t)n * k);
        free(lc);
    }
    free(logits), free(lr), free(wr), free(wc), free(ir), free(ic);
}

static void test_moe_combine(void) {
    const int n = 37, k = 6, width = 203;
    float *y = rnd((size_t)n * k * width, 3.0f), *wsel = rnd((size_t)n * k, 1.0f);
    int32_t *ids = xmalloc((size_t)n * k * sizeof *ids);
    for (int i = 0; i < n * k; i++) ids[i] = rand_int(9);
    for (int s = 0; s < k; s++) ids[s] = k - 1 - s; /* row 0 in descending id */
    ids[k] = ids[k + 1] = ids[k + 4] = 3;            /* row 1: one id three times */
    float *or_ = poisoned((size_t)n * width), *oc = poisoned((size_t)n * width);
    op_moe_combine(ref, or_, y, ids, wsel, n, k, width);
    FOR_CPU(m, th) {
        poison(oc, (size_t)n * width);
        op_moe_combine(cpu[th], oc, y, ids, wsel, n, k, width);
        exact("moe_combine", at(m, th), oc, or_, (size_t)n * width);
    }
    free(y), free(wsel), free(ids), free(or_), free(oc);
}

/* ---- RoPE ---- */

static void test_rope(int head_dim, int n_rot, int n_heads, int interleaved, int with_freq) {
    const int rows = 23, half = n_rot / 2, n_freq = 3;
    const size_t N = (size_t)rows * n_heads * head_dim;
    float *x = rnd(N, 2.0f), *inv = fmalloc((size_t)n_freq * half);
    for (int f = 0; f < n_freq; f++)
        for (int i = 0; i < half; i++)
            inv[f * half + i] = powf(10000.0f * (float)(f + 1), -(float)(2 * i) / (float)n_rot) * (f == 2 ? 0.25f : 1.0f);
    int32_t pos[23], freq[23];
    for (int t = 0; t < rows; t++) pos[t] = rand_int(5000), freq[t] = rand_int(n_freq);
    pos[0] = 0;
    const float scale = with_freq ? 0.83f : 1.0f;
    float *xr = fdup(x, N);
    op_rope(ref, xr, pos, with_freq ? freq : NULL, inv, scale, rows, n_heads, head_dim, n_rot, interleaved);
    char what[96];
    snprintf(what, sizeof what, "rope hd %d rot %d %s%s", head_dim, n_rot, interleaved ? "interleaved" : "half",
             with_freq ? " per-row freq" : "");
    FOR_CPU(m, th) {
        float *xc = fdup(x, N);
        op_rope(cpu[th], xc, pos, with_freq ? freq : NULL, inv, scale, rows, n_heads, head_dim, n_rot, interleaved);
        exact(what, at(m, th), xc, xr, N);
        free(xc);
    }
    free(x), free(inv), free(xr);
}

/* =====================================================================================
 * The paged KV cache and attention
 * ===================================================================================== */

static void test_kv_store(enum gb_type kt) {
    const int n = 29, width = 72, stride = 2 * width + 5, pool_rows = 211;
    const size_t esz = kt == GB_TYPE_F16 ? 2 : 4, pool = (size_t)pool_rows * stride * esz;
    float *x = rnd((size_t)n * width, 2.0f);
    for (int i = 0; i < width; i++) { /* the f16 range's edges: overflow, subnormals, ties */
        x[i] *= i % 3 == 0 ? 70000.0f : i % 3 == 1 ? 1e-6f : 1.0f;
        x[width + i] = ldexpf((float)(2 * rand_int(1024) + 1), -11);
    }
    int32_t *perm = xmalloc((size_t)pool_rows * sizeof *perm);
    for (int i = 0; i < pool_rows; i++) perm[i] = i;
    for (int i = pool_rows - 1; i > 0; i--) {
        int j = rand_int(i + 1), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    unsigned char *cr = xmalloc(pool), *cc = xmalloc(pool);
    memset(cr, 0xa5, pool);
    op_kv_store(ref, cr, kt, x, perm, n, width, stride);
    op_kv_store(ref, cr + (size_t)width * esz, kt, x, perm + n, n, width, stride); /* the V half, other rows */
    FOR_CPU(m, th) {
        memset(cc, 0xa5, pool);
        op_kv_store(cpu[th], cc, kt, x, perm, n, width, stride);
        op_kv_store(cpu[th], cc + (size_t)width * esz, kt, x, perm + n, n, width, stride);
        CHECKF(memcmp(cc, cr, pool) == 0, "kv_store %s [%s]: the pool differs from the reference's (seed %llu)",
               type_name(kt), at(m, th), seed0);
    }
    free(x), free(perm), free(cr), free(cc);
}

/* Attention of a batch of segments (1-row decode segments and longer ones, different
 * pos0, keys across 64-position blocks) over one pool in which each segment's blocks are
 * scattered; pool rows no position maps to, and the padding between K and V, hold NaN.
 * Against the reference within 2e-5; each segment alone has the bits it has in the batch. */
static void test_attention(enum gb_type kt, int n_head, int n_head_kv, int hd, int window) {
    enum { NS = 6 };
    static const int seg_rows[NS] = {1, 1, 1, 4, 9, 70}, seg_pos0[NS] = {37, 0, 100, 20, 60, 5};
    const int kvw = n_head_kv * hd, qw = n_head * hd, kvs = 2 * kvw + 8;
    int nb[NS], n_blocks = 3, n = 0, n_kv = 0;
    for (int s = 0; s < NS; s++) {
        const int ctx = seg_pos0[s] + seg_rows[s];
        nb[s] = (ctx + KV_BLOCK - 1) / KV_BLOCK;
        n_blocks += nb[s];
        n += seg_rows[s];
        if (ctx > n_kv) n_kv = ctx;
    }
    GB_ASSERT(n_kv <= 256); /* reserved in main */
    int32_t *perm = xmalloc((size_t)n_blocks * sizeof *perm);
    for (int i = 0; i < n_blocks; i++) perm[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) {
        int j = rand_int(i + 1), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    const size_t rows = (size_t)n_blocks * KV_BLOCK, esz = kt == GB_TYPE_F16 ? 2 : 4;
    unsigned char *cache = xmalloc(rows * kvs * esz);
    for (size_t i = 0; i < rows * kvs; i++) {
        if (kt == GB_TYPE_F16) ((uint16_t *)cache)[i] = 0x7e00;
        else ((float *)cache)[i] = NAN;
    }
    struct gb_seg segs[NS];
    int b0 = 0, r0 = 0;
    for (int s = 0; s < NS; s++) {
        segs[s] = (struct gb_seg){.row0 = r0, .n_rows = seg_rows[s], .pos0 = seg_pos0[s], .blocks = perm + b0};
        for (int p = 0; p < seg_pos0[s] + seg_rows[s]; p++)
            for (int i = 0; i < 2 * kvw; i++) {
                const size_t k = (size_t)kv_pool_row(segs[s].blocks, p) * kvs + i;
                const float v = test_rand_f(&rng);
                if (kt == GB_TYPE_F16) ((uint16_t *)cache)[k] = f32_to_f16(v);
                else ((float *)cache)[k] = v;
            }
        b0 += nb[s];
        r0 += seg_rows[s];
    }
    const size_t N = (size_t)n * qw;
    float *q = rnd(N, 1.5f), *oref = poisoned(N), *o[2] = {poisoned(N), poisoned(N)};
    const struct attn_args a = {.q = q, .out = oref, .k_cache = cache, .v_cache = cache + (size_t)kvw * esz,
                                .kv_type = kt, .kv_stride = kvs, .n_head = n_head, .n_head_kv = n_head_kv,
                                .head_dim = hd, .window = window, .scale = 1.0f / sqrtf((float)hd), .segs = segs,
                                .n_segs = NS};
    op_attention(ref, &a);
    char what[96];
    snprintf(what, sizeof what, "attention %s heads %d/%d hd %d window %d", type_name(kt), n_head, n_head_kv, hd,
             window);
    FOR_CPU(m, th) {
        struct attn_args c = a;
        c.out = o[th];
        poison(o[th], N);
        op_attention(cpu[th], &c);
        near_abs(what, at(m, th), o[th], oref, N, 2e-5, 0.0);
        if (th == 1) {
            char w2[128];
            snprintf(w2, sizeof w2, "%s: 2 threads against 1", what);
            exact(w2, at(m, th), o[1], o[0], N);
        }
        int bad_seg = -1;
        for (int s = 0; s < NS; s++) {
            const size_t ns = (size_t)seg_rows[s] * qw;
            struct gb_seg one = segs[s];
            one.row0 = 0;
            float *os = poisoned(ns);
            struct attn_args c1 = a;
            c1.q = q + (size_t)segs[s].row0 * qw;
            c1.out = os;
            c1.segs = &one;
            c1.n_segs = 1;
            op_attention(cpu[th], &c1);
            if (memcmp(os, o[th] + (size_t)segs[s].row0 * qw, ns * sizeof *os) != 0 && bad_seg < 0) bad_seg = s;
            free(os);
        }
        CHECKF(bad_seg < 0, "%s [%s]: segment %d differs from the segment alone (seed %llu)", what, at(m, th), bad_seg,
               seed0);
    }
    free(perm), free(cache), free(q), free(oref), free(o[0]), free(o[1]);
}

/* =====================================================================================
 * Recurrent layers: several segments (1-row and longer, their own state slots) per call,
 * two calls, each backend carrying its own states from the first call to the second
 * ===================================================================================== */

enum { N_SLOTS = 6 };
struct rcall {
    int n_segs;
    int rows[5], slot[5];
};
/* call 1: two decode rows, a row shorter than the conv kernel, longer ones (and for the
 * delta rule one of more than DELTA_CHUNK rows); call 2: other sizes, slots in another
 * order; slot 1 never used, slot 4 only by call 1 */
static const struct rcall RCALLS[2] = {{5, {1, 1, 2, 5, 70}, {3, 0, 4, 2, 5}}, {4, {1, 3, 9, 66}, {2, 5, 3, 0}}};

static int rcall_segs(const struct rcall *rc, struct gb_seg *segs) {
    int n = 0;
    for (int s = 0; s < rc->n_segs; s++) {
        segs[s] = (struct gb_seg){.row0 = n, .n_rows = rc->rows[s], .state = rc->slot[s]};
        n += rc->rows[s];
    }
    return n;
}

static void test_conv1d(int K) {
    const int C = 259; /* the pool splits the channels of the 70-row segment */
    const size_t slot = (size_t)(K - 1) * C + 5, ns = N_SLOTS * slot;
    float *w = rnd((size_t)K * C, 1.0f), *st0 = rnd(ns, 1.0f), *sref = fdup(st0, ns);
    float *sc[N_ISA][2];
    for (int m = 0; m < N_ISA; m++) sc[m][0] = fdup(st0, ns), sc[m][1] = fdup(st0, ns);
    for (int call = 0; call < 2; call++) {
        struct gb_seg segs[5];
        const int n = rcall_segs(&RCALLS[call], segs), silu = call == 0;
        const size_t N = (size_t)n * C;
        float *x = rnd(N, 1.0f), *yref = poisoned(N), *y = poisoned(N);
        float *sbefore = fdup(sref, ns);
        op_conv1d(ref, yref, x, (struct gb_state){sref, slot}, w, C, K, silu, segs, RCALLS[call].n_segs);
        int kept = 1; /* the reference's slots no segment used, and the padding, as they were */
        for (size_t i = 0; i < ns; i++) {
            int used = 0;
            for (int s = 0; s < RCALLS[call].n_segs; s++) used |= (int)(i / slot) == segs[s].state;
            if (!used || i % slot >= (size_t)(K - 1) * C) kept &= sref[i] == sbefore[i];
        }
        CHECKF(kept, "conv1d K %d call %d (reference): a state it does not own changed", K, call + 1);
        char what[64];
        snprintf(what, sizeof what, "conv1d K %d call %d", K, call + 1);
        FOR_CPU(m, th) {
            float *sb = fdup(sc[m][th], ns);
            poison(y, N);
            op_conv1d(cpu[th], y, x, (struct gb_state){sc[m][th], slot}, w, C, K, silu, segs, RCALLS[call].n_segs);
            exact(what, at(m, th), y, yref, N);
            char w2[96];
            snprintf(w2, sizeof w2, "%s: states", what);
            exact(w2, at(m, th), sc[m][th], sref, ns);
            int bad_seg = -1; /* each segment alone from the same state */
            for (int s = 0; s < RCALLS[call].n_segs; s++) {
                float *s1 = fdup(sb, ns), *y1 = poisoned((size_t)segs[s].n_rows * C);
                struct gb_seg one = segs[s];
                one.row0 = 0;
                op_conv1d(cpu[th], y1, x + (size_t)segs[s].row0 * C, (struct gb_state){s1, slot}, w, C, K, silu, &one,
                          1);
                if ((memcmp(y1, y + (size_t)segs[s].row0 * C, (size_t)segs[s].n_rows * C * sizeof *y1) != 0 ||
                     memcmp(s1 + segs[s].state * slot, sc[m][th] + segs[s].state * slot, slot * sizeof *s1) != 0) &&
                    bad_seg < 0)
                    bad_seg = s;
                free(s1), free(y1);
            }
            CHECKF(bad_seg < 0, "%s [%s]: segment %d differs from the segment alone (seed %llu)", what, at(m, th),
                   bad_seg, seed0);
            free(sb);
        }
        free(x), free(yref), free(y), free(sbefore);
    }
    for (int m = 0; m < N_ISA; m++) free(sc[m][0]), free(sc[m][1]);
    free(w), free(st0), free(sref);
}

static void l2(float *v, int n, float scale) {
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)v[i] * v[i];
    for (int i = 0; i < n; i++) v[i] = (float)(v[i] / sqrt(ss + 1e-6) * scale);
}

enum { DK = 44, DV = 24 }; /* dk: a 32-wide vector step, an 8-wide one and a scalar tail */

static void test_delta_rule(int v_tiled) {
    const int nk = 2, nv = 4, dk = DK, dv = DV, qkd = nk * dk, C = 2 * qkd + nv * dv + 3; /* [q | k | v | pad] */
    const size_t slot = (size_t)nv * dv * dk + 3, ns = N_SLOTS * slot;
    float *st0 = rnd(ns, 0.3f), *sref = fdup(st0, ns);
    float *sc[N_ISA][2];
    for (int m = 0; m < N_ISA; m++) sc[m][0] = fdup(st0, ns), sc[m][1] = fdup(st0, ns);
    for (int call = 0; call < 2; call++) {
        struct gb_seg segs[5];
        const int n = rcall_segs(&RCALLS[call], segs), n_segs = RCALLS[call].n_segs;
        float *x = rnd((size_t)n * C, 1.0f), *g = fmalloc((size_t)n * nv), *beta = fmalloc((size_t)n * nv);
        for (int r = 0; r < n; r++)
            for (int h = 0; h < nk; h++) { /* unit keys, queries scaled by dk^-1/2, as the model gives them */
                l2(x + (size_t)r * C + h * dk, dk, 1.0f / sqrtf((float)dk));
                l2(x + (size_t)r * C + qkd + h * dk, dk, 1.0f);
            }
        for (int i = 0; i < n * nv; i++) { /* log decays in (-2 r_h, 0]: heads that forget within a few rows
                                              * and heads whose state lasts over chunks */
            static const float rate[4] = {0.01f, 0.05f, 0.2f, 1.0f};
            g[i] = -rate[i % nv] * (1.0f + test_rand_f(&rng));
            beta[i] = 0.5f * (1.0f + test_rand_f(&rng));
        }
        const size_t no = (size_t)n * nv * dv;
        float *oref = poisoned(no), *o = poisoned(no), *sbefore = fdup(sref, ns);
        struct delta_args a = {.x = x, .qk_stride = C, .v_stride = C, .q_off = 0, .k_off = qkd, .v_off = 2 * qkd,
                               .g = g, .beta = beta, .out = oref, .state = {sref, slot}, .nk = nk, .nv = nv, .dk = dk,
                               .dv = dv, .v_tiled = v_tiled, .segs = segs, .n_segs = n_segs};
        op_delta_rule(ref, &a);
        int kept = 1;
        for (size_t i = 0; i < ns; i++) {
            int used = 0;
            for (int s = 0; s < n_segs; s++) used |= (int)(i / slot) == segs[s].state;
            if (!used || i % slot >= slot - 3) kept &= sref[i] == sbefore[i];
        }
        CHECKF(kept, "delta_rule call %d (reference): a state it does not own changed", call + 1);
        char what[64];
        snprintf(what, sizeof what, "delta_rule%s call %d", v_tiled ? " v_tiled" : "", call + 1);
        FOR_CPU(m, th) {
            float *sb = fdup(sc[m][th], ns);
            struct delta_args c = a;
            c.out = o;
            c.state.base = sc[m][th];
            poison(o, no);
            op_delta_rule(cpu[th], &c);
            near_abs(what, at(m, th), o, oref, no, 2e-4, 2e-4);
            char w2[96];
            snprintf(w2, sizeof w2, "%s: states", what);
            near_abs(w2, at(m, th), sc[m][th], sref, ns, 2e-4, 2e-4);
            int untouched = 1;
            for (size_t i = 0; i < ns; i++) {
                int used = 0;
                for (int s = 0; s < n_segs; s++) used |= (int)(i / slot) == segs[s].state;
                if (!used || i % slot >= slot - 3) untouched &= fp32_to_bits(sc[m][th][i]) == fp32_to_bits(sb[i]);
            }
            CHECKF(untouched, "%s [%s]: a state no segment owns (or a slot's padding) changed", what, at(m, th));
            int bad_seg = -1; /* each segment alone, from the same state */
            for (int s = 0; s < n_segs; s++) {
                float *s1 = fdup(sb, ns), *o1 = poisoned((size_t)segs[s].n_rows * nv * dv);
                struct gb_seg one = segs[s];
                one.row0 = 0;
                struct delta_args c1 = c;
                c1.x = x + (size_t)segs[s].row0 * C;
                c1.g = g + (size_t)segs[s].row0 * nv;
                c1.beta = beta + (size_t)segs[s].row0 * nv;
                c1.out = o1;
                c1.state.base = s1;
                c1.segs = &one;
                c1.n_segs = 1;
                op_delta_rule(cpu[th], &c1);
                if ((memcmp(o1, o + (size_t)segs[s].row0 * nv * dv, (size_t)segs[s].n_rows * nv * dv * sizeof *o1) != 0 ||
                     memcmp(s1 + segs[s].state * slot, sc[m][th] + segs[s].state * slot, slot * sizeof *s1) != 0) &&
                    bad_seg < 0)
                    bad_seg = s;
                free(s1), free(o1);
            }
            CHECKF(bad_seg < 0, "%s [%s]: segment %d differs from the segment alone (seed %llu)", what, at(m, th),
                   bad_seg, seed0);
            free(sb);
        }
        free(x), free(g), free(beta), free(oref), free(o), free(sbefore);
    }
    for (int m = 0; m < N_ISA; m++) free(sc[m][0]), free(sc[m][1]);
    free(st0), free(sref);
}

/* backend.h: weight_prepare notes the scratch a weight's matmuls need, and reserve keeps
 * the largest scratch of all its calls, so a second reserve after wider weights were
 * prepared must cover them; the CPU backend's matmul scratch does (recomputed from the
 * weights' shapes on every reserve). Here: 2 experts of 32 inputs prepared, reserve,
 * 2 experts of 1024 inputs prepared, the same reserve again, then matmul_id over the wide
 * ones against the reference. In a child process: where the scratch falls short the op
 * writes past its end (the parent only sees the exit status). */
static int reserve_after_prepare_child(void) {
    enum { NM = 2, NSEL = 2, N = 64, N_OUT = 8 };
    struct tw small[NM], big[NM];
    struct gb_weight ws[NM], wb[NM];
    for (int e = 0; e < NM; e++) {
        make_tw(&small[e], &(struct fmt){.kind = GB_WEIGHT_PLAIN, .type = GB_TYPE_F32}, N_OUT, 32);
        make_tw(&big[e], &(struct fmt){.kind = GB_WEIGHT_PLAIN, .type = GB_TYPE_F32}, N_OUT, 1024);
        ws[e] = small[e].w, wb[e] = big[e].w;
    }
    struct backend *be = new_cpu(1);
    const struct gb_reserve r = {.n_rows = N, .n_sel = NSEL};
    be->ops->weight_prepare(be, ws, NM, 0);
    int ok = be->ops->reserve(be, &r) == GERBIL_OK;
    be->ops->weight_prepare(be, wb, NM, 0);
    ok &= be->ops->reserve(be, &r) == GERBIL_OK;
    int32_t ids[N * NSEL], span[N], seg_of[N];
    for (int i = 0; i < N * NSEL; i++) ids[i] = i % NM;
    for (int t = 0; t < N; t++) span[t] = N, seg_of[t] = 0;
    const struct gb_seg seg = {.row0 = 0, .n_rows = N};
    const struct gb_batch b = {.n_rows = N, .n_segs = 1, .segs = &seg, .span = span, .seg_of = seg_of};
    const size_t ny = (size_t)N * NSEL * N_OUT;
    float *x = rnd_x((size_t)N * 1024), *y = poisoned(ny), *yref = poisoned(ny);
    double *tol = dmalloc(ny);
    op_matmul_id(ref, yref, x, 0, wb, NM, ids, NSEL, &b, N);
    for (int i = 0; i < N * NSEL; i++)
        mm_tols(tol + (size_t)i * N_OUT, &big[ids[i]], x + (size_t)(i / NSEL) * 1024, 1, yref + (size_t)i * N_OUT,
                NULL, 0);
    op_matmul_id(be, y, x, 0, wb, NM, ids, NSEL, &b, N);
    ok &= within("matmul_id after a reserve, wider weights prepared and reserve again", "default, 1 thread", y, yref,
                 tol, ny);
    backend_free(be);
    for (int e = 0; e < NM; e++) free_tw(&small[e]), free_tw(&big[e]);
    free(x), free(y), free(yref), free(tol);
    return ok;
}

static void test_reserve_after_prepare(void) {
    fflush(stdout);
    fflush(stderr);
    const pid_t pid = fork();
    if (pid == 0) _exit(reserve_after_prepare_child() ? 0 : 1);
    int st = 0;
    CHECK(pid > 0 && waitpid(pid, &st, 0) == pid);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0,
           "matmul_id after weight_prepare of wider weights and a second reserve: the child %s %d (cpu_reserve "
           "regrows matmul_id's gathered rows only for more rows, not for the wider weights prepared since)",
           WIFSIGNALED(st) ? "was killed by signal" : "exited with", WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
}

/* ===================================================================================== */

int main(int argc, char **argv) {
    seed0 = argc > 1 ? strtoull(argv[1], NULL, 0)
                     : (unsigned long long)time(NULL) ^ ((unsigned long long)getpid() << 32);
    if (!seed0) seed0 = 1; /* xorshift's one fixed point */
    rng = seed0;
    printf("test_backend_ops: seed %llu (rerun with this argument to reproduce)\n", seed0);
    if (backend_new("ref", 0, &ref) != GERBIL_OK) { fprintf(stderr, "%s\n", gerbil_last_error()); return 1; }
    isa_init();
    test_reserve_after_prepare(); /* first: fork while this process has no other threads */
    for (int th = 0; th < 2; th++) {
        cpu[th] = new_cpu(th + 1);
        const struct gb_reserve r = {.n_rows = 256, .n_kv = 256, .delta_dk = DK, .delta_dv = DV};
        CHECK(cpu[th]->ops->reserve(cpu[th], &r) == GERBIL_OK);
    }
    packer = new_cpu(1);
    test_buffers(ref, 1);
    test_buffers(cpu[0], 1);
    test_buffers(cpu[1], 2);
    printf("CPU instruction sets:");
    for (int m = 0; m < N_ISA; m++)
        if (isa_on[m]) printf(" [%s]", isa_label[m]);
    printf("\n");
    if (isa_forced) printf("  the other instruction-set passes: SKIPPED, GERBIL_CPU_ISA forces one\n");
    else if (!isa_on[ISA_AVX2]) printf("  AVX2/VNNI pass (AVX-512 off): SKIPPED, this CPU lacks AVX-512 (the default is it)\n");
    if (!isa_forced && !isa_on[ISA_SCALAR]) printf("  scalar pass: SKIPPED, this CPU lacks AVX2 (the default is it)\n");
    if (!qmatmul_has_bf16()) printf("  prefill GEMMs: SKIPPED, this CPU lacks AVX512-BF16\n");
    if (!qmatmul_has_avx512()) printf("  MLX 4-bit packing and the AVX-512 attention: SKIPPED (no AVX-512)\n");

    struct fmt fs[MAX_FORMATS];
    const int nf = all_formats(fs);
    for (int i = 0; i < nf; i++) test_matmul(&fs[i]);
    const struct mset msets[] = {
        {2, 384, {mlx_fmt(4, 64, 1), mlx_fmt(4, 64, 1)}},                      /* fused decode (packed) */
        {3, 384, {mlx_fmt(4, 128, 1), mlx_fmt(4, 128, 1), mlx_fmt(4, 128, 1)}},
        {2, 384, {mlx_fmt(4, 64, 1), mlx_fmt(4, 32, 1)}},                      /* group sizes differ */
        {2, 384, {mlx_fmt(4, 64, 0), mlx_fmt(8, 64, 0)}},                      /* the 16-bit GEMM */
        {3, 512, {plain_fmt(GB_TYPE_Q4_K), plain_fmt(GB_TYPE_Q6_K), plain_fmt(GB_TYPE_Q8_0)}}, /* bf16 GEMM */
        {4, 512, {plain_fmt(GB_TYPE_Q4_0), plain_fmt(GB_TYPE_Q5_1), plain_fmt(GB_TYPE_Q2_K), plain_fmt(GB_TYPE_Q3_K)}},
        {2, 160, {plain_fmt(GB_TYPE_F32), plain_fmt(GB_TYPE_Q8_0)}},          /* methods split differently */
        {3, 75, {plain_fmt(GB_TYPE_BF16), plain_fmt(GB_TYPE_F16), plain_fmt(GB_TYPE_F32)}},
    };
    for (int i = 0; i < COUNT(msets); i++) test_matmul_multi(&msets[i]);
    for (int i = 0; i < nf; i++) test_matmul_id(&fs[i]);

    test_get_rows();
    test_gather_copy();
    test_norms();
    test_elementwise();
    test_moe_route(61, 6, 0);
    test_moe_route(61, 6, 1);
    test_moe_route(8, 2, 1);
    test_moe_route(5, 5, 0); /* every expert */
    test_moe_combine();
    for (int i = 0; i < 8; i++) test_rope(i & 4 ? 128 : 24, i & 4 ? 128 : 16, i & 4 ? 3 : 5, i & 1, (i >> 1) & 1);

    test_kv_store(GB_TYPE_F16);
    test_kv_store(GB_TYPE_F32);
    /* GQA groups 1, 2, 4, 16; head_dim 64 / 128 (the AVX-512 path on f16) and 24, 20 (scalar; 20: a
     * tail after the 8-wide vector steps) */
    static const int heads[][3] = {{2, 2, 64}, {4, 2, 128}, {8, 2, 24}, {16, 1, 64}, {4, 1, 128}, {6, 3, 20}};
    const enum gb_type kts[2] = {GB_TYPE_F16, GB_TYPE_F32};
    for (int k = 0; k < 2; k++)
        for (int h = 0; h < COUNT(heads); h++)
            for (int w = 0; w < 2; w++) test_attention(kts[k], heads[h][0], heads[h][1], heads[h][2], w ? 13 : 0);

    test_conv1d(4);
    test_conv1d(3);
    test_conv1d(1); /* no history */
    test_delta_rule(0);
    test_delta_rule(1);

    printf("CPU runs per instruction set:");
    for (int m = 0; m < N_ISA; m++)
        if (isa_on[m]) printf(" [%s] %d", isa_label[m], isa_runs[m]);
    printf("\n");
    backend_free(cpu[0]), backend_free(cpu[1]), backend_free(packer), backend_free(ref);
    return test_done();
}
