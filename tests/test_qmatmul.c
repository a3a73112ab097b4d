/* matmul_w over quantized weights (backend/cpu/qmatmul.c) against matmul_w_ref.
 *
 * For every GGML type and every MLX bits x group size: random weights made by the
 * reference quantizers, random x, awkward n_out and n_tok; outputs poisoned with NaN.
 * The fast kernels and the scalar ones (cpu_force_ref) must each be within the
 * format's error bound of the oracle, and pools of 1, 2 and 3 threads must agree bit
 * for bit. Where the CPU has AVX512-VNNI, the fast run uses those kernels and the AVX2
 * ones (qmatmul_disable_vnni) must give the same bits. Where it has AVX-512 F/BW/VL/VNNI,
 * MLX 4/8-bit rows with n_in % 128 == 0, Q8_0, Q4_K, Q5_K and Q6_K rows go to the 512-bit
 * kernels (qmatmul_avx512.c, qmatmul_kquant_avx512.c): those and, with
 * qmatmul_disable_avx512, the VNNI/AVX2 kernels must each be within the bound (they sum
 * in different orders, so their bits differ); check_kq512 also checks that matmul_w
 * really takes the k-quant ones and that they are f32 rounding away from the scalar
 * kernel. The
 * fast kernels must also give each token the same bits whether it comes alone or with
 * others (the tiles only share weight loads).
 *
 * Error bounds, per output y = sum_i w_i x_i:
 *  - GGML types quantize x to 8 bits per block (32 elements, or 256 for the
 *    k-quants) with step d_b = max|x in block| / 127 and round to nearest, so
 *    |x_i - x~_i| <= d_b / 2 and the product error is at most
 *      A = sum_i |w_i| d_b(i) / 2;
 *    the tolerance is 1.001 A + 1e-5 S, S = sum_i (|w_i| + |m_i|) |x_i| bounding the
 *    f32 rounding of the block sums (m_i the block's min/offset term, for terms that
 *    cancel).
 *  - MLX quantizes x to 16 bits in blocks of 32 (step d_b = max|x| / 32767) and sums
 *    the bias terms over the quantized x too, so the product error is again
 *    w . (x~ - x): A as above with 32767 for 127; S = sum_i 2 (|w_i| + |b_g| +
 *    255 |s_g|) |x_i| (s q and b can be much larger than w where they cancel).
 *
 * Those run with the bf16 prefill path (gemm_avx512.c) switched off; test_gemm
 * covers it where the CPU has AVX512-BF16: GGML and MLX weights, rows of whole and partial
 * 256-element chunks, row counts around its 32-row panels, K blocks (512) with a partial last one, token
 * counts around its tiles. GGML types go through bf16: w and x are each rounded to bf16
 * (relative error 2^-9) and the products summed in f32, so the bound is
 *   (2^-8 + n_in 2^-24) 1.01 sum_i |w_i x_i|;
 * MLX 4/8-bit through 16-bit integers with one x step per weight group: the MLX bound
 * above with the group for the block (other MLX widths stay on the per-token kernels).
 * The same bits for 1, 2 and 3 threads and for a token alone, and different bits from
 * the integer kernels (so the path is the one that ran). */
#include "test.h"

#include "backend/cpu/gemm_avx512.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/mlx_packed.h"
#include "backend/cpu/qmatmul_avx512.h"
#include "backend/cpu/qmatmul_vnni.h"
#include "base/fp16.h"
#include "base/threadpool.h"
#include "tensor/quant.h"
#include "tensor/quant_ref.h"
#include "tensor/weight.h"

#include <stdint.h>
#include <string.h>

static threadpool_t *pools[3];

typedef void (*qrows_fn_t)(int n, int nr, const void *row0, size_t rb, const void *xq, size_t xs, int nt, float *y,
                           size_t ldy);

static float *poisoned(size_t n) {
    float *p = malloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}

static float sb_get(enum gb_type t, const void *p, size_t i) {
    if (t == GB_TYPE_F32) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return t == GB_TYPE_F16 ? f16_to_f32(h) : bf16_to_f32(h);
}

/* Run matmul_w (fast or forced reference) with the 1-thread pool, and with all three
 * pools when `pools3` (bit-identity across thread counts); check the bound against
 * yref; tol[t * n_out + o]. Returns failures. */
static int run_check(const struct gb_weight *w, const float *x, int n_tok, const float *yref, const float *tol,
                     int force, int pools3, const char *what) {
    size_t ny = (size_t)n_tok * (size_t)w->n_out;
    size_t ws = matmul_w_work_size(w, n_tok);
    void *work = ws ? malloc(ws) : NULL;
    float *y[3];
    int bad = 0;
    cpu_force_ref(force);
    for (int p = 0; p < 3; p++) {
        y[p] = poisoned(ny);
        if (pools3 || p == 0) matmul_w(pools[p], y[p], x, w, n_tok, work);
    }
    if (!pools3) { memcpy(y[1], y[0], ny * sizeof(float)); memcpy(y[2], y[0], ny * sizeof(float)); }
    if (!force && qmatmul_has_vnni()) {
        /* y[0] came from the VNNI kernels (Q4_K, Q5_K, Q6_K, Q8_0): the AVX2 ones must
         * give the same bits (same exact integer sums, same f32 operations) */
        float *ya = poisoned(ny);
        qmatmul_disable_vnni(1);
        matmul_w(pools[0], ya, x, w, n_tok, work);
        qmatmul_disable_vnni(0);
        CHECKF(memcmp(ya, y[0], ny * sizeof(float)) == 0, "%s n_in %lld n_out %lld n_tok %d: VNNI and AVX2 differ",
               what, (long long)w->n_in, (long long)w->n_out, n_tok);
        free(ya);
    }
    cpu_force_ref(0);
    double worst = 0.0;
    for (size_t i = 0; i < ny; i++) {
        double e = fabs((double)y[0][i] - yref[i]);
        if (!(e <= tol[i])) { /* NaN fails too */
            if (bad++ < 3)
                fprintf(stderr, "%s: n_in %lld n_out %lld n_tok %d %s: y[%zu] = %g, ref %g, tol %g\n", what,
                        (long long)w->n_in, (long long)w->n_out, n_tok, force ? "scalar" : "fast", i, y[0][i],
                        yref[i], tol[i]);
        }
        if (tol[i] > 0 && e / tol[i] > worst) worst = e / tol[i];
    }
    CHECKF(bad == 0, "%s: %d outputs out of bound", what, bad);
    CHECKF(memcmp(y[0], y[1], ny * sizeof(float)) == 0 && memcmp(y[0], y[2], ny * sizeof(float)) == 0,
           "%s n_in %lld n_out %lld n_tok %d %s: results depend on the thread count", what, (long long)w->n_in,
           (long long)w->n_out, n_tok, force ? "scalar" : "fast");
    for (int p = 0; p < 3; p++) free(y[p]);
    free(work);
    return bad;
}

/* Fast kernels: token t of an n_tok call has the bits of a call on token t alone. */
static void check_tok_split(const struct gb_weight *w, const float *x, int n_tok, const char *what) {
    int n_in = (int)w->n_in, n_out = (int)w->n_out;
    size_t ws = matmul_w_work_size(w, n_tok);
    void *work = ws ? malloc(ws) : NULL;
    float *y = poisoned((size_t)n_tok * n_out), *y1 = poisoned((size_t)n_out);
    matmul_w(pools[0], y, x, w, n_tok, work);
    int same = 1;
    for (int t = 0; t < n_tok; t++) {
        matmul_w(pools[0], y1, x + (size_t)t * n_in, w, 1, work);
        same &= memcmp(y1, y + (size_t)t * n_out, sizeof(float) * (size_t)n_out) == 0;
    }
    CHECKF(same, "%s n_in %d n_out %d n_tok %d: a token's result depends on the tokens beside it", what, n_in,
           n_out, n_tok);
    free(y);
    free(y1);
    free(work);
}

/* amag: [n_out][n_in] the weight magnitudes multiplying the activation error (|w| for
 * GGML types); mag: [n_out][n_in] |w| plus the format's cancelling terms (see the
 * header); act_block: x quantization block. */
static void check_all_tok(const struct gb_weight *w, const float *amag, const float *mag, int act_block, float levels,
                          unsigned long long *seed, const char *what) {
    static const int toks[] = {1, 2, 3, 7, 16};
    int n_in = (int)w->n_in, n_out = (int)w->n_out;
    for (size_t k = 0; k < sizeof toks / sizeof toks[0]; k++) {
        int n_tok = toks[k];
        float *x = malloc((size_t)n_tok * n_in * sizeof *x);
        for (int i = 0; i < n_tok * n_in; i++) x[i] = test_rand_f(seed) * (1.0f + (float)(i % 7));
        float *yref = poisoned((size_t)n_tok * n_out), *tol = malloc((size_t)n_tok * n_out * sizeof *tol);
        matmul_w_ref(yref, x, w, n_tok);
        for (int t = 0; t < n_tok; t++) {
            const float *xt = x + (size_t)t * n_in;
            for (int o = 0; o < n_out; o++) {
                const float *wr = amag + (size_t)o * n_in, *mr = mag + (size_t)o * n_in;
                double a = 0.0, s = 0.0;
                for (int b = 0; b < n_in; b += act_block) {
                    int nb = act_block;
                    float amax = 0.0f;
                    for (int i = b; i < b + nb; i++) amax = fmaxf(amax, fabsf(xt[i]));
                    for (int i = b; i < b + nb; i++) {
                        a += fabs(wr[i]) * (amax / levels) / 2.0;
                        s += (double)mr[i] * fabs(xt[i]);
                    }
                }
                tol[(size_t)t * n_out + o] = (float)(1.001 * a + 1e-5 * s + 1e-30);
            }
        }
        /* thread counts only matter once the work is split: the largest shapes (pools
         * are slow to test on a loaded 2-core machine: 3 threads wait on preemption) */
        int pools3 = n_out == 67 && n_tok == 7;
        run_check(w, x, n_tok, yref, tol, 0, pools3, what);
        run_check(w, x, n_tok, yref, tol, 1, pools3, what);
        if (n_tok == 7 || n_tok == 16) check_tok_split(w, x, n_tok, what);
        if ((w->kind == GB_WEIGHT_MLX || w->type == GB_TYPE_Q8_0 || w->type == GB_TYPE_Q4_K || w->type == GB_TYPE_Q5_K ||
             w->type == GB_TYPE_Q6_K) &&
            qmatmul_has_avx512()) { /* the others too */
            qmatmul_disable_avx512(1);
            run_check(w, x, n_tok, yref, tol, 0, pools3, what);
            if (n_tok == 7 || n_tok == 16) check_tok_split(w, x, n_tok, what); /* the AVX2 rows x tokens tiles */
            qmatmul_disable_avx512(0);
        }
        free(x);
        free(yref);
        free(tol);
    }
}

/* The AVX-512 k-quant kernels (qmatmul_kquant_avx512.c), where the CPU has AVX-512:
 *  - matmul_w takes them: its output (1, 2 and 3 threads) has the bits of direct kernel
 *    calls, both one row and one token per call and 3 rows x all tokens per call (so
 *    the bits depend neither on the tile shape nor on the thread split);
 *  - against the scalar kernel (same x codes and steps, so the same exact integer
 *    sums): only f32 rounding apart, |y - y_scalar| <= 1e-5 sum_i mag_i |x_i| + 1e-30.
 * Token counts 1..5 and 9 (tiles of 4, 1, 2, 3 tokens), row counts from the caller. */
static void check_kq512(const struct gb_weight *w, const float *mag, unsigned long long *seed) {
    static const int toks[] = {1, 2, 3, 4, 5, 9};
    qrows_fn_t fn = w->type == GB_TYPE_Q4_K   ? qrows_q4_K_avx512
                    : w->type == GB_TYPE_Q5_K ? qrows_q5_K_avx512
                                              : qrows_q6_K_avx512;
    int q4order = w->type != GB_TYPE_Q6_K;
    int n_in = (int)w->n_in, n_out = (int)w->n_out, nb = n_in / QK_K;
    size_t xs = (size_t)nb * sizeof(struct qxk);
    for (size_t k = 0; k < sizeof toks / sizeof toks[0]; k++) {
        int n_tok = toks[k];
        size_t ny = (size_t)n_tok * n_out;
        float *x = malloc((size_t)n_tok * n_in * sizeof *x);
        for (int i = 0; i < n_tok * n_in; i++) x[i] = test_rand_f(seed) * (1.0f + (float)(i % 5));
        size_t ws = matmul_w_work_size(w, n_tok);
        void *work = malloc(ws);
        float *y[3], *ys = poisoned(ny), *yd1 = poisoned(ny), *yd2 = poisoned(ny);
        for (int p = 0; p < 3; p++) {
            y[p] = poisoned(ny);
            matmul_w(pools[p], y[p], x, w, n_tok, work);
        }
        cpu_force_ref(1);
        matmul_w(pools[0], ys, x, w, n_tok, work);
        cpu_force_ref(0);
        char *xq = aligned_alloc(64, (size_t)n_tok * xs);
        for (int t = 0; t < n_tok; t++) qk_quant_x_avx512(x + (size_t)t * n_in, n_in, q4order, (struct qxk *)(xq + t * xs));
        const char *rows = w->data;
        for (int t = 0; t < n_tok; t++)
            for (int o = 0; o < n_out; o++)
                fn(n_in, 1, rows + (size_t)o * w->row_bytes, w->row_bytes, xq + t * xs, xs, 1, yd1 + (size_t)t * n_out + o,
                   (size_t)n_out);
        for (int o = 0; o < n_out; o += 3)
            fn(n_in, n_out - o < 3 ? n_out - o : 3, rows + (size_t)o * w->row_bytes, w->row_bytes, xq, xs, n_tok, yd2 + o,
               (size_t)n_out);
        int same = 1;
        for (int p = 0; p < 3; p++) same &= memcmp(y[p], yd1, ny * sizeof(float)) == 0;
        CHECKF(same && memcmp(yd1, yd2, ny * sizeof(float)) == 0,
               "%s n_in %d n_out %d n_tok %d: matmul_w (1-3 threads) and direct AVX-512 kernel calls differ", w->name,
               n_in, n_out, n_tok);
        int bad = 0;
        for (int t = 0; t < n_tok; t++)
            for (int o = 0; o < n_out; o++) {
                double s = 0.0;
                for (int i = 0; i < n_in; i++) s += (double)mag[(size_t)o * n_in + i] * fabs(x[(size_t)t * n_in + i]);
                size_t i = (size_t)t * n_out + o;
                double e = fabs((double)y[0][i] - ys[i]);
                if (!(e <= 1e-5 * s + 1e-30) && bad++ < 3)
                    fprintf(stderr, "%s n_in %d n_out %d n_tok %d: y[%zu] = %.9g, scalar %.9g, sum |w x| %g\n", w->name,
                            n_in, n_out, n_tok, i, y[0][i], ys[i], s);
            }
        CHECKF(bad == 0, "%s: %d AVX-512 outputs further than f32 rounding from the scalar kernel", w->name, bad);
        for (int p = 0; p < 3; p++) free(y[p]);
        free(ys); free(yd1); free(yd2); free(xq); free(work); free(x);
    }
}

static void test_ggml(enum gb_type t, unsigned long long *seed) {
    static const int outs[] = {1, 5, 33, 67};
    const struct gb_type_traits *tt = type_traits(t);
    struct gb_quant_fns qf = quant_fns(t);
    CHECK(qf.from_float != NULL && qf.to_float != NULL);
    if (!qf.from_float || !qf.to_float) return;
    int kq = tt->block_size == QK_K;
    int ins_k[] = {256, 768}, ins_s[] = {32, 288};
    const int *ins = kq ? ins_k : ins_s;
    for (int a = 0; a < 2; a++) {
        for (size_t b = 0; b < sizeof outs / sizeof outs[0]; b++) {
            int n_in = ins[a], n_out = outs[b];
            size_t rb = type_row_size(t, n_in);
            uint8_t *data = malloc(rb * n_out);
            float *src = malloc((size_t)n_in * sizeof *src);
            float *deq = malloc((size_t)n_out * n_in * sizeof *deq), *mag = malloc((size_t)n_out * n_in * sizeof *mag);
            for (int o = 0; o < n_out; o++) {
                float scale = 0.01f + (float)(test_rand_u64(seed) % 1000) / 100.0f;
                float shift = (o % 3 == 0) ? scale * 0.5f : 0.0f; /* exercise the mins */
                for (int i = 0; i < n_in; i++) src[i] = test_rand_f(seed) * scale + shift;
                qf.from_float(src, data + (size_t)o * rb, n_in);
            }
            struct gb_weight w = {.kind = GB_WEIGHT_PLAIN, .type = t, .n_out = n_out, .n_in = n_in,
                                  .data = data, .row_bytes = rb, .name = tt->name};
            for (int o = 0; o < n_out; o++) {
                weight_get_row(&w, o, deq + (size_t)o * n_in);
                /* |w| + the block's offset/min magnitude: max |w| of its block bounds both */
                int bs = kq ? 32 : 32;
                for (int i = 0; i < n_in; i += bs) {
                    float mx = 0.0f;
                    for (int j = i; j < i + bs; j++) mx = fmaxf(mx, fabsf(deq[(size_t)o * n_in + j]));
                    for (int j = i; j < i + bs; j++) mag[(size_t)o * n_in + j] = fabsf(deq[(size_t)o * n_in + j]) + 2 * mx;
                }
            }
            check_all_tok(&w, deq, mag, kq ? QK_K : 32, 127.0f, seed, tt->name);
            if ((t == GB_TYPE_Q4_K || t == GB_TYPE_Q5_K || t == GB_TYPE_Q6_K) && qmatmul_has_avx512())
                check_kq512(&w, mag, seed);
            free(data);
            free(src);
            free(deq);
            free(mag);
        }
    }
}

/* matmul_w_multi (one token, packed weights: its fused path must run) against matmul_w per
 * matrix, bit for bit, on every pool: w and w less its first row. */
static void check_multi(const struct gb_weight *w, unsigned long long *seed, const char *what) {
    int n_in = (int)w->n_in, n_out = (int)w->n_out;
    if (n_out < 2) return;
    struct gb_weight w2 = *w;
    size_t ng = (size_t)(n_in / w->group_size), esz = type_traits(w->sb_type)->type_size;
    w2.n_out = n_out - 1;
    w2.data = (const char *)w->data + w->row_bytes;
    w2.scales = (const char *)w->scales + ng * esz;
    w2.biases = (const char *)w->biases + ng * esz;
    const struct gb_weight *ws[2] = {w, &w2};
    float *x = malloc((size_t)n_in * sizeof *x);
    for (int i = 0; i < n_in; i++) x[i] = test_rand_f(seed);
    void *work = malloc(matmul_w_work_size(w, 1) + 64);
    float *ya = poisoned((size_t)n_out), *yb = poisoned((size_t)n_out), *ra = poisoned((size_t)n_out),
          *rb = poisoned((size_t)n_out);
    matmul_w(pools[0], ra, x, w, 1, work);
    matmul_w(pools[0], rb, x, &w2, 1, work);
    for (int p = 0; p < 3; p++) {
        float *ys[2] = {ya, yb};
        int ran = matmul_w_multi(pools[p], 2, ys, x, ws, 1, work);
        CHECKF(ran, "%s n_in %d n_out %d: matmul_w_multi took no fused path for packed weights", what, n_in, n_out);
        if (!ran) break;
        CHECKF(memcmp(ya, ra, (size_t)n_out * sizeof(float)) == 0 &&
                   memcmp(yb, rb, (size_t)(n_out - 1) * sizeof(float)) == 0,
               "%s n_in %d n_out %d, %d threads: matmul_w_multi differs from matmul_w", what, n_in, n_out, p + 1);
    }
    free(x); free(work); free(ya); free(yb); free(ra); free(rb);
}

/* The same 4-bit weight packed as the loader packs it (qmatmul_pack): every row reads back
 * as the same numbers, and all matmul paths (AVX-512 packed kernels, their fallback with
 * AVX-512 or SIMD switched off, matmul_w_multi) pass check_all_tok's bounds. */
static void check_packed(const struct gb_weight *w, const float *deq, const float *mag, unsigned long long *seed,
                         const char *what) {
    char pwhat[80];
    snprintf(pwhat, sizeof pwhat, "%s packed", what);
    int n_in = (int)w->n_in, n_out = (int)w->n_out;
    size_t nb = (size_t)n_out * w->row_bytes;
    void *pd = malloc(nb);
    memcpy(pd, w->data, nb);
    struct gb_weight p = *w;
    p.data = pd;
    p.name = pwhat;
    qmatmul_pack(&p);
    CHECKF(p.packed && memcmp(pd, w->data, nb) != 0, "%s: qmatmul_pack left the rows as they were", pwhat);
    float *row = malloc((size_t)n_in * sizeof *row);
    int same = 1;
    for (int o = 0; o < n_out; o++) {
        cpu_weight_row(&p, o, row);
        same &= memcmp(row, deq + (size_t)o * n_in, (size_t)n_in * sizeof *row) == 0;
    }
    CHECKF(same, "%s n_in %d n_out %d: a packed row reads back differently", pwhat, n_in, n_out);
    check_all_tok(&p, deq, mag, 32, 32767.0f, seed, pwhat);
    check_multi(&p, seed, pwhat);
    free(row);
    free(pd);
}

static void test_mlx(int bits, int gs, enum gb_type sbt, unsigned long long *seed) {
    static const int outs[] = {1, 5, 33, 67};
    int ins[] = {gs, 384, 640}; /* 384, 640: 3 and 5 chunks of 128 (AVX-512 kernels), 12..20 groups */
    char what[64];
    snprintf(what, sizeof what, "mlx%d gs%d %s", bits, gs, type_name(sbt));
    size_t esz = type_traits(sbt)->type_size;
    for (int a = 0; a < 3; a++) {
        for (size_t b = 0; b < sizeof outs / sizeof outs[0]; b++) {
            int n_in = ins[a], n_out = outs[b], ng = n_in / gs;
            size_t rb = (size_t)n_in * bits / 8;
            uint8_t *data = malloc(rb * n_out);
            char *sc = malloc((size_t)n_out * ng * esz), *bi = malloc((size_t)n_out * ng * esz);
            float *src = malloc((size_t)n_in * sizeof *src);
            float *deq = malloc((size_t)n_out * n_in * sizeof *deq), *mag = malloc((size_t)n_out * n_in * sizeof *mag);
            for (int o = 0; o < n_out; o++) {
                float scale = 0.01f + (float)(test_rand_u64(seed) % 1000) / 100.0f;
                for (int i = 0; i < n_in; i++) src[i] = test_rand_f(seed) * scale + (o % 2 ? scale : 0.0f);
                quantize_row_mlx_ref(src, (uint32_t *)(data + (size_t)o * rb), sc + (size_t)o * ng * esz,
                                     bi + (size_t)o * ng * esz, sbt, bits, gs, n_in);
            }
            struct gb_weight w = {.kind = GB_WEIGHT_MLX, .type = GB_TYPE_U32, .n_out = n_out, .n_in = n_in,
                                  .data = data, .row_bytes = rb, .bits = bits, .group_size = gs, .sb_type = sbt,
                                  .scales = sc, .biases = bi, .name = what};
            for (int o = 0; o < n_out; o++) {
                weight_get_row(&w, o, deq + (size_t)o * n_in);
                for (int i = 0; i < n_in; i++) {
                    size_t gi = (size_t)o * ng + i / gs;
                    mag[(size_t)o * n_in + i] = 2.0f * (fabsf(deq[(size_t)o * n_in + i]) + fabsf(sb_get(sbt, bi, gi)) +
                                                        255.0f * fabsf(sb_get(sbt, sc, gi)));
                }
            }
            check_all_tok(&w, deq, mag, 32, 32767.0f, seed, what);
            if (qmatmul_wants_pack(&w)) check_packed(&w, deq, mag, seed, what);
            free(data);
            free(sc);
            free(bi);
            free(src);
            free(deq);
            free(mag);
        }
    }
}

#ifdef GERBIL_HAVE_X86 /* gemm_avx512.c is compiled for x86 only */
/* One weight (GGML type t, or MLX bits/gs when bits > 0; -4: 4-bit packed as the loader
 * packs it) through the prefill GEMMs. */
static void gemm_case(enum gb_type t, int bits, int gs, int n_in, int n_out, unsigned long long *seed) {
    static const int toks[] = {1, 5, 12, 13, 30};
    char what[64];
    int pack = bits < 0;
    if (pack) bits = -bits;
    struct gb_weight w = {.n_out = n_out, .n_in = n_in};
    void *data, *sc = NULL, *bi = NULL;
    float *src = malloc((size_t)n_in * sizeof *src);
    if (bits) {
        enum gb_type sbt = gs == 32 ? GB_TYPE_BF16 : gs == 64 ? GB_TYPE_F16 : GB_TYPE_F32;
        size_t rb = (size_t)n_in * bits / 8, esz = type_traits(sbt)->type_size, ng = (size_t)(n_in / gs);
        data = malloc(rb * n_out);
        sc = malloc(n_out * ng * esz);
        bi = malloc(n_out * ng * esz);
        for (int o = 0; o < n_out; o++) {
            float scale = 0.01f + (float)(test_rand_u64(seed) % 1000) / 100.0f;
            for (int i = 0; i < n_in; i++) src[i] = test_rand_f(seed) * scale + (o % 2 ? scale : 0.0f);
            quantize_row_mlx_ref(src, (uint32_t *)((char *)data + o * rb), (char *)sc + o * ng * esz,
                                 (char *)bi + o * ng * esz, sbt, bits, gs, n_in);
        }
        w = (struct gb_weight){.kind = GB_WEIGHT_MLX, .type = GB_TYPE_U32, .n_out = n_out, .n_in = n_in, .data = data,
                               .row_bytes = rb, .bits = bits, .group_size = gs, .sb_type = sbt, .scales = sc,
                               .biases = bi};
        snprintf(what, sizeof what, "gemm mlx%d gs%d%s", bits, gs, pack ? " packed" : "");
        if (pack) {
            if (!qmatmul_wants_pack(&w)) { free(src); free(data); free(sc); free(bi); return; }
            qmatmul_pack(&w);
        }
    } else {
        size_t rb = type_row_size(t, n_in);
        data = malloc(rb * n_out);
        for (int o = 0; o < n_out; o++) {
            float scale = 0.01f + (float)(test_rand_u64(seed) % 1000) / 100.0f;
            for (int i = 0; i < n_in; i++) src[i] = test_rand_f(seed) * scale + (o % 3 == 0 ? scale * 0.5f : 0.0f);
            quant_fns(t).from_float(src, (char *)data + o * rb, n_in);
        }
        w = (struct gb_weight){.kind = GB_WEIGHT_PLAIN, .type = t, .n_out = n_out, .n_in = n_in, .data = data,
                               .row_bytes = rb};
        snprintf(what, sizeof what, "gemm %s", type_name(t));
    }
    w.name = what;
    enum gemm_kind kind = gemm_kind_of(&w);
    CHECKF(kind == (!bits ? GEMM_BF16 : bits == 4 || bits == 8 ? GEMM_MLX16 : GEMM_NONE), "%s: gemm kind %d", what,
           (int)kind);
    if (kind == GEMM_NONE) { free(src); free(data); free(sc); free(bi); return; }
    float *deq = malloc((size_t)n_out * n_in * sizeof *deq);
    for (int o = 0; o < n_out; o++) cpu_weight_row(&w, o, deq + (size_t)o * n_in);
    for (size_t k = 0; k < sizeof toks / sizeof toks[0]; k++) {
        int n_tok = toks[k];
        size_t ny = (size_t)n_tok * n_out;
        float *x = malloc((size_t)n_tok * n_in * sizeof *x);
        for (int i = 0; i < n_tok * n_in; i++) x[i] = test_rand_f(seed) * (1.0f + (float)(i % 7));
        float *yref = poisoned(ny), *tol = malloc(ny * sizeof *tol), *y[3], *yint = poisoned(ny), *y1 = poisoned(n_out);
        matmul_w_ref(yref, x, &w, n_tok);
        for (int t2 = 0; t2 < n_tok; t2++)
            for (int o = 0; o < n_out; o++) {
                const float *xt = x + (size_t)t2 * n_in, *wr = deq + (size_t)o * n_in;
                double a = 0.0, sum = 0.0;
                if (kind == GEMM_BF16) {
                    for (int i = 0; i < n_in; i++) a += fabs((double)wr[i] * xt[i]);
                    tol[(size_t)t2 * n_out + o] = (float)((0x1p-8 + n_in * 0x1p-24) * 1.01 * a + 1e-30);
                    continue;
                }
                for (int g = 0; g < n_in / gs; g++) { /* MLX: 16-bit x per group, as the header says */
                    float amax = 0.0f;
                    for (int i = g * gs; i < (g + 1) * gs; i++) amax = fmaxf(amax, fabsf(xt[i]));
                    size_t gi = (size_t)o * (n_in / gs) + g;
                    double m = fabs(sb_get(w.sb_type, bi, gi)) + 255.0 * fabs(sb_get(w.sb_type, sc, gi));
                    for (int i = g * gs; i < (g + 1) * gs; i++) {
                        a += fabs(wr[i]) * (amax / 32767.0) / 2.0;
                        sum += 2.0 * (fabs(wr[i]) + m) * fabs(xt[i]);
                    }
                }
                tol[(size_t)t2 * n_out + o] = (float)(1.001 * a + 1e-5 * sum + 1e-30);
            }
        size_t ws = matmul_w_work_size(&w, n_tok);
        void *work = malloc(ws);
        qmatmul_set_gemm_min_tok(1);
        for (int p = 0; p < 3; p++) {
            y[p] = poisoned(ny);
            matmul_w(pools[p], y[p], x, &w, n_tok, work);
        }
        if (n_tok > 1 && n_out > 4) { /* matmul_w_multi: w and a view of its rows from 4 on, in one pass */
            struct gb_weight w2 = weight_rows(&w, 4, n_out - 4), f = {.kind = GB_WEIGHT_PLAIN, .type = GB_TYPE_F32,
                .n_out = n_out, .n_in = n_in, .data = deq, .row_bytes = (size_t)n_in * sizeof(float)};
            const struct gb_weight *ws[2] = {&w, &w2}, *mixed[2] = {&w, &f};
            size_t ny2 = (size_t)n_tok * (n_out - 4);
            float *r2 = poisoned(ny2), *ys[2] = {poisoned(ny), poisoned(ny2)};
            matmul_w(pools[0], r2, x, &w2, n_tok, work);
            for (int p = 0; p < 3; p++) {
                int ran = matmul_w_multi(pools[p], 2, ys, x, ws, n_tok, work);
                CHECKF(ran && memcmp(ys[0], y[0], ny * sizeof(float)) == 0 && memcmp(ys[1], r2, ny2 * sizeof(float)) == 0,
                       "%s n_in %d n_out %d n_tok %d, %d threads: matmul_w_multi %s", what, n_in, n_out, n_tok, p + 1,
                       ran ? "differs from matmul_w" : "took no GEMM");
            }
            CHECKF(!matmul_w_multi(pools[1], 2, ys, x, mixed, n_tok, work),
                   "%s n_in %d n_out %d n_tok %d: matmul_w_multi took f32 rows into the GEMM", what, n_in, n_out, n_tok);
            free(r2); free(ys[0]); free(ys[1]);
        }
        int bad = 0, same1 = 1;
        for (int t2 = 0; t2 < n_tok; t2++) {
            matmul_w(pools[0], y1, x + (size_t)t2 * n_in, &w, 1, work);
            same1 &= memcmp(y1, y[0] + (size_t)t2 * n_out, sizeof(float) * n_out) == 0;
        }
        qmatmul_set_gemm_min_tok(0);
        matmul_w(pools[0], yint, x, &w, n_tok, work);
        qmatmul_set_gemm_min_tok(-1);
        for (size_t i = 0; i < ny; i++) {
            double e = fabs((double)y[0][i] - yref[i]);
            if (!(e <= tol[i]) && bad++ < 3)
                fprintf(stderr, "%s n_in %d n_out %d n_tok %d: y[%zu] = %g, ref %g, tol %g\n", what, n_in, n_out,
                        n_tok, i, y[0][i], yref[i], tol[i]);
        }
        CHECKF(bad == 0, "%s n_in %d n_out %d n_tok %d: %d outputs out of bound", what, n_in, n_out, n_tok, bad);
        CHECKF(memcmp(y[0], y[1], ny * sizeof(float)) == 0 && memcmp(y[0], y[2], ny * sizeof(float)) == 0,
               "%s n_in %d n_out %d n_tok %d: results depend on the thread count", what, n_in, n_out, n_tok);
        CHECKF(same1, "%s n_in %d n_out %d n_tok %d: a token's result depends on the tokens beside it", what, n_in,
               n_out, n_tok);
        CHECKF(memcmp(y[0], yint, ny * sizeof(float)) != 0, "%s n_in %d n_out %d n_tok %d: same bits as the integer "
               "kernels: the bf16 path did not run", what, n_in, n_out, n_tok);
        for (int p = 0; p < 3; p++) free(y[p]);
        free(x); free(yref); free(tol); free(yint); free(y1); free(work);
    }
    free(deq); free(src); free(data); free(sc); free(bi);
}

static void test_gemm(unsigned long long *seed) {
    static const enum gb_type types[] = {GB_TYPE_Q4_K, GB_TYPE_Q6_K, GB_TYPE_Q8_0, GB_TYPE_Q4_0, GB_TYPE_Q5_K,
                                         GB_TYPE_Q2_K, GB_TYPE_Q5_1};
    /* k-quants: one 256-block, 5 of them, and a K block of GEMM_KB + one; the others: half a
     * 256-chunk, 5.5 of them (a partial one at the end), and a K block + 384 */
    static const int ins_k[] = {256, 1280, GEMM_KB + 256}, ins[] = {128, 1408, GEMM_KB + 384},
                     outs[] = {1, 31, 33, 70};
    for (size_t a = 0; a < 3; a++)
        for (size_t b = 0; b < 4; b++) {
            if (a == 1 && (b == 0 || b == 2)) continue; /* the long rows: one panel and a partial second */
            if (a == 2 && b != 2) continue;             /* rows of two K blocks: two panels, one partial */
            for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
                gemm_case(types[i], 0, 0, type_traits(types[i])->block_size == QK_K ? ins_k[a] : ins[a], outs[b], seed);
            gemm_case(GB_TYPE_U32, 4, 64, ins[a], outs[b], seed);
            gemm_case(GB_TYPE_U32, -4, 64, ins[a], outs[b], seed); /* packed */
            gemm_case(GB_TYPE_U32, 4, 32, ins[a], outs[b], seed);
            gemm_case(GB_TYPE_U32, 8, 128, ins[a], outs[b], seed);
            gemm_case(GB_TYPE_U32, 3, 64, ins[a], outs[b], seed);
            /* rows of an odd number of 32-blocks: a 4-bit set ending inside a 16-word load, an
             * 8-bit row ending half way through one */
            gemm_case(GB_TYPE_U32, 4, 32, ins[a] + 32, outs[b], seed);
            gemm_case(GB_TYPE_U32, 8, 32, ins[a] + 32, outs[b], seed);
        }
}

#endif

/* A float weight goes through matmul(): same answer as calling it directly. */
static void test_plain(unsigned long long *seed) {
    int n_in = 64, n_out = 9, n_tok = 3;
    float *w = malloc(sizeof(float) * n_in * n_out), *x = malloc(sizeof(float) * n_in * n_tok);
    for (int i = 0; i < n_in * n_out; i++) w[i] = test_rand_f(seed);
    for (int i = 0; i < n_in * n_tok; i++) x[i] = test_rand_f(seed);
    struct gb_weight gw = {.kind = GB_WEIGHT_PLAIN, .type = GB_TYPE_F32, .n_out = n_out, .n_in = n_in,
                           .data = w, .row_bytes = sizeof(float) * n_in};
    float *y0 = poisoned(n_tok * n_out), *y1 = poisoned(n_tok * n_out);
    CHECK(matmul_w_work_size(&gw, n_tok) == 0);
    matmul_w(pools[1], y0, x, &gw, n_tok, NULL);
    matmul(pools[1], y1, x, w, GB_TYPE_F32, n_tok, n_in, n_out);
    CHECK(memcmp(y0, y1, sizeof(float) * n_tok * n_out) == 0);
    free(w); free(x); free(y0); free(y1);
}

int main(void) {
    unsigned long long seed = 0x9e3779b97f4a7c15ULL;
    for (int p = 0; p < 3; p++) {
        pools[p] = tp_create(p + 1);
        if (!pools[p]) { fprintf(stderr, "tp_create failed\n"); return 1; }
    }
    printf("AVX2 kernels: %s, AVX512-VNNI kernels: %s\n", cpu_has_avx2() ? "yes" : "no",
           qmatmul_has_vnni() ? "yes" : "no");
    if (qmatmul_has_avx512())
        printf("AVX-512 MLX, Q8_0, Q4_K, Q5_K and Q6_K kernels: tested (and the VNNI/AVX2 kernels with them switched "
               "off)\n");
    else
        printf("AVX-512 MLX, Q8_0 and k-quant kernels: SKIPPED (this CPU lacks AVX-512 F/BW/VL/VNNI; not counted as "
               "passes)\n");
    qmatmul_set_gemm_min_tok(0); /* the integer kernels; test_gemm the bf16 path */
    static const enum gb_type types[] = {GB_TYPE_Q8_0, GB_TYPE_Q4_0, GB_TYPE_Q4_1, GB_TYPE_Q5_0, GB_TYPE_Q5_1,
                                         GB_TYPE_Q2_K, GB_TYPE_Q3_K, GB_TYPE_Q4_K, GB_TYPE_Q5_K, GB_TYPE_Q6_K};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) test_ggml(types[i], &seed);
    static const int bits[] = {2, 3, 4, 6, 8}, gss[] = {32, 64, 128};
    static const enum gb_type sbts[] = {GB_TYPE_F16, GB_TYPE_BF16, GB_TYPE_F32};
    int k = 0;
    for (int b = 0; b < 5; b++)
        for (int g = 0; g < 3; g++) test_mlx(bits[b], gss[g], sbts[k++ % 3], &seed);
    qmatmul_set_gemm_min_tok(-1);
    if (qmatmul_has_bf16()) {
        printf("prefill GEMMs (bf16, MLX 16-bit): tested\n");
#ifdef GERBIL_HAVE_X86
        test_gemm(&seed);
#endif
    } else {
        printf("prefill GEMMs: SKIPPED (this CPU lacks AVX512-BF16; not counted as a pass)\n");
    }
    test_plain(&seed);
    for (int p = 0; p < 3; p++) tp_free(pools[p]);
    return test_done();
}
