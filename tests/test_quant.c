/* Quantized formats, reference side: every GGML dequantizer against a per-element
 * reading of the format written here from the byte layout; quantize -> dequantize
 * error bounds per type; MLX affine packing (2, 3, 4, 6, 8 bits) and quantizer;
 * matmul_w_ref against dequantize-then-matmul_ref; the GGML type-id table. */
#include "backend/cpu/kernels.h"
#include "base/fp16.h"
#include "tensor/dtype.h"
#include "tensor/quant.h"
#include "tensor/quant_ref.h"
#include "tensor/weight.h"
#include "test.h"

#include <stdint.h>
#include <string.h>
#include <time.h>

static unsigned long long seed;

/* ---- per-element definitions, from the byte layout (offsets in bytes) ---- */

static float h16(const uint8_t *p) { return f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

/* Element e of one block of type t, straight from the format's definition. */
static float elem_ref(enum gb_type t, const uint8_t *b, int e) {
    switch (t) {
    case GB_TYPE_Q8_0: return (int8_t)b[2 + e] * h16(b);
    case GB_TYPE_Q4_0: { /* d | qs[16]: element e in byte e%16, low nibble for e < 16 */
        int q = e < 16 ? b[2 + e] & 15 : b[2 + e - 16] >> 4;
        return (q - 8) * h16(b);
    }
    case GB_TYPE_Q4_1: {
        int q = e < 16 ? b[4 + e] & 15 : b[4 + e - 16] >> 4;
        return q * h16(b) + h16(b + 2);
    }
    case GB_TYPE_Q5_0: { /* d | qh[4] (bit e = 5th bit of element e) | qs[16] */
        int lo = e < 16 ? b[6 + e] & 15 : b[6 + e - 16] >> 4;
        int hi = (b[2 + e / 8] >> (e % 8)) & 1;
        return ((lo | hi << 4) - 16) * h16(b);
    }
    case GB_TYPE_Q5_1: {
        int lo = e < 16 ? b[8 + e] & 15 : b[8 + e - 16] >> 4;
        int hi = (b[4 + e / 8] >> (e % 8)) & 1;
        return (lo | hi << 4) * h16(b) + h16(b + 2);
    }
    case GB_TYPE_Q2_K: { /* scales[16] | qs[64] | d | dmin */
        int sub = e / 16, h = e / 128, k = (e % 128) / 32, l = e % 32;
        int q = (b[16 + h * 32 + l] >> (2 * k)) & 3;
        float dl = h16(b + 80) * (b[sub] & 15), ml = h16(b + 82) * (b[sub] >> 4);
        return dl * q - ml;
    }
    case GB_TYPE_Q3_K: { /* hmask[32] | qs[64] | scales[12] | d */
        /* the 16 six-bit scales, as ggml unpacks them with 32-bit masks */
        uint32_t aux[4];
        memcpy(aux, b + 96, 12);
        uint32_t tmp = aux[2];
        aux[2] = ((aux[0] >> 4) & 0x0f0f0f0f) | (((tmp >> 4) & 0x03030303) << 4);
        aux[3] = ((aux[1] >> 4) & 0x0f0f0f0f) | (((tmp >> 6) & 0x03030303) << 4);
        aux[0] = (aux[0] & 0x0f0f0f0f) | (((tmp >> 0) & 0x03030303) << 4);
        aux[1] = (aux[1] & 0x0f0f0f0f) | (((tmp >> 2) & 0x03030303) << 4);
        int sc = ((const int8_t *)aux)[e / 16] - 32;
        int h = e / 128, k = (e % 128) / 32, l = e % 32;
        int q = (b[32 + h * 32 + l] >> (2 * k)) & 3;
        int high = (b[l] >> (4 * h + k)) & 1;
        return h16(b + 108) * sc * (q - (high ? 0 : 4));
    }
    case GB_TYPE_Q4_K:
    case GB_TYPE_Q5_K: { /* d | dmin | scales[12] | (Q5_K: qh[32]) | qs[128] */
        int sub = e / 32, sc, m;
        if (sub < 4) { sc = b[4 + sub] & 63; m = b[8 + sub] & 63; }
        else {
            sc = (b[12 + sub - 4] & 15) | (b[4 + sub - 4] >> 6) << 4;
            m = (b[12 + sub - 4] >> 4) | (b[8 + sub - 4] >> 6) << 4;
        }
        int qs_off = t == GB_TYPE_Q5_K ? 48 : 16;
        int byte = b[qs_off + (e / 64) * 32 + e % 32];
        int q = e % 64 < 32 ? byte & 15 : byte >> 4;
        if (t == GB_TYPE_Q5_K) q += ((b[16 + e % 32] >> sub) & 1) << 4;
        float d1 = h16(b) * sc, m1 = h16(b + 2) * m;
        return d1 * q - m1;
    }
    case GB_TYPE_Q6_K: { /* ql[128] | qh[64] | scales[16] | d */
        int h = e / 128, r = e % 128;
        int byte = b[h * 64 + r % 64];
        int lo = r < 64 ? byte & 15 : byte >> 4;
        int hi = (b[128 + h * 32 + r % 32] >> (2 * (r / 32))) & 3;
        return h16(b + 208) * (int8_t)b[192 + e / 16] * ((lo | hi << 4) - 32);
    }
    case GB_TYPE_Q8_K: {
        float d;
        memcpy(&d, b, 4);
        return d * (int8_t)b[4 + e];
    }
    default: return NAN;
    }
}

/* Offsets of the f16 scale fields, to make them finite; -1 ends. */
static const int *half_fields(enum gb_type t) {
    static const int q80[] = {0, -1}, q41[] = {0, 2, -1}, q2k[] = {80, 82, -1}, q3k[] = {108, -1},
                     q6k[] = {208, -1}, none[] = {-1};
    switch (t) {
    case GB_TYPE_Q8_0: case GB_TYPE_Q4_0: case GB_TYPE_Q5_0: return q80;
    case GB_TYPE_Q4_1: case GB_TYPE_Q5_1: case GB_TYPE_Q4_K: case GB_TYPE_Q5_K: return q41;
    case GB_TYPE_Q2_K: return q2k;
    case GB_TYPE_Q3_K: return q3k;
    case GB_TYPE_Q6_K: return q6k;
    default: return none;
    }
}

static const enum gb_type quant_types[] = {
    GB_TYPE_Q8_0, GB_TYPE_Q4_0, GB_TYPE_Q4_1, GB_TYPE_Q5_0, GB_TYPE_Q5_1, GB_TYPE_Q2_K,
    GB_TYPE_Q3_K, GB_TYPE_Q4_K, GB_TYPE_Q5_K, GB_TYPE_Q6_K, GB_TYPE_Q8_K,
};
enum { N_QUANT = sizeof quant_types / sizeof quant_types[0] };

/* (a) dequantizers vs the definition on random blocks */
static void test_dequant_definition(void) {
    enum { NB = 7 };
    for (int ti = 0; ti < N_QUANT; ti++) {
        const enum gb_type t = quant_types[ti];
        const struct gb_type_traits *tt = type_traits(t);
        const size_t bs = tt->type_size;
        const int n = NB * tt->block_size;
        uint8_t *blk = malloc(NB * bs);
        float *y = malloc((size_t)n * sizeof *y);
        for (size_t i = 0; i < NB * bs; i++) blk[i] = (uint8_t)test_rand_u64(&seed);
        for (int i = 0; i < NB; i++) {
            uint8_t *b = blk + i * bs;
            for (const int *f = half_fields(t); *f >= 0; f++) {
                uint16_t h = f32_to_f16(test_rand_f(&seed) * 0.05f);
                b[*f] = (uint8_t)h;
                b[*f + 1] = (uint8_t)(h >> 8);
            }
            if (t == GB_TYPE_Q8_K) { float d = test_rand_f(&seed) * 0.01f; memcpy(b, &d, 4); }
        }
        struct gb_quant_fns f = quant_fns(t);
        CHECKF(f.to_float && f.from_float, "%s", tt->name);
        if (!f.to_float) continue;
        f.to_float(blk, y, n);
        int bad = 0;
        for (int i = 0; i < NB; i++)
            for (int e = 0; e < tt->block_size; e++) {
                const float want = elem_ref(t, blk + i * bs, e), got = y[i * tt->block_size + e];
                if (!(got == want) && bad++ < 3)
                    fprintf(stderr, "%s block %d element %d: got %.9g want %.9g\n", tt->name, i, e, got, want);
            }
        CHECKF(bad == 0, "%s: %d elements differ from the definition", tt->name, bad);
        /* type_to_f32 goes through the same table */
        float *y2 = malloc((size_t)n * sizeof *y2);
        type_to_f32(t, blk, y2, n);
        CHECKF(memcmp(y, y2, (size_t)n * sizeof *y) == 0, "%s: type_to_f32", tt->name);
        free(y2);
        free(blk);
        free(y);
    }
}

/* (b) quantize -> dequantize: RMS(error) / RMS(x) within a bound per type, on
 * roughly Gaussian rows (sum of 4 uniforms), lengths 256..4096 at three scales;
 * all-zero rows come back exactly; positive and constant rows; a row of
 * uniforms with one value of 50 (the outlier's block then has a coarse step,
 * hence the separate bound). Bounds are ~1.25x the worst value measured
 * (printed when the test runs). */
static const struct { enum gb_type t; double bound, outlier_bound; } rt_bounds[] = {
    {GB_TYPE_Q8_0, 0.0065, 0.016}, /* measured 0.0053, outlier 0.0129 */
    {GB_TYPE_Q8_K, 0.0090, 0.045}, /* 0.0072, 0.036 */
    {GB_TYPE_Q6_K, 0.0220, 0.056}, /* 0.0178, 0.045 */
    {GB_TYPE_Q5_0, 0.0580, 0.085}, /* 0.047, 0.068 */
    {GB_TYPE_Q5_1, 0.0480, 0.066}, /* 0.038, 0.053 */
    {GB_TYPE_Q5_K, 0.0450, 0.068}, /* 0.037, 0.054 */
    {GB_TYPE_Q4_0, 0.1050, 0.110}, /* 0.084, < 0.09 */
    {GB_TYPE_Q4_1, 0.1000, 0.150}, /* 0.079, 0.120 */
    {GB_TYPE_Q4_K, 0.0880, 0.100}, /* 0.071, 0.080 */
    {GB_TYPE_Q3_K, 0.1800, 0.180}, /* 0.144, < 0.14 */
    {GB_TYPE_Q2_K, 0.3400, 0.380}, /* 0.275, 0.307 */
};

static double roundtrip_rel(enum gb_type t, const float *x, int n, float *y, void *blk) {
    struct gb_quant_fns f = quant_fns(t);
    f.from_float(x, blk, n);
    f.to_float(blk, y, n);
    double se = 0, sx = 0;
    for (int i = 0; i < n; i++) {
        se += (double)(y[i] - x[i]) * (y[i] - x[i]);
        sx += (double)x[i] * x[i];
    }
    return sx > 0 ? sqrt(se / sx) : sqrt(se);
}

static void test_roundtrip(void) {
    const int lengths[] = {256, 512, 1792, 4096};
    const int nmax = 4096;
    float *x = malloc(nmax * sizeof *x), *y = malloc(nmax * sizeof *y);
    void *blk = malloc((size_t)nmax * 2);
    for (size_t k = 0; k < sizeof rt_bounds / sizeof rt_bounds[0]; k++) {
        const enum gb_type t = rt_bounds[k].t;
        const char *name = type_name(t);
        double worst = 0, worst_out = 0;
        for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++) {
            const int n = lengths[li];
            for (int rep = 0; rep < 3; rep++) {
                const float scale = rep == 0 ? 1.0f : rep == 1 ? 0.02f : 37.0f;
                for (int i = 0; i < n; i++)
                    x[i] = scale * (test_rand_f(&seed) + test_rand_f(&seed) + test_rand_f(&seed) + test_rand_f(&seed));
                double r = roundtrip_rel(t, x, n, y, blk);
                if (r > worst) worst = r;
                CHECKF(r <= rt_bounds[k].bound, "%s n=%d scale %g: rel RMS error %.5f > %.4f", name, n, scale, r,
                       rt_bounds[k].bound);
            }
            /* one outlier */
            for (int i = 0; i < n; i++) x[i] = test_rand_f(&seed);
            x[n / 3] = 50.0f;
            double r = roundtrip_rel(t, x, n, y, blk);
            if (r > worst_out) worst_out = r;
            CHECKF(r <= rt_bounds[k].outlier_bound, "%s n=%d outlier: rel RMS error %.5f", name, n, r);
            CHECKF(fabsf(y[n / 3] - 50.0f) <= 50.0f * 2 * rt_bounds[k].bound, "%s outlier itself: %g", name, y[n / 3]);
            /* all zero */
            memset(x, 0, (size_t)n * sizeof *x);
            roundtrip_rel(t, x, n, y, blk);
            int nz = 0;
            for (int i = 0; i < n; i++) nz += y[i] != 0.0f;
            CHECKF(nz == 0, "%s: zero row gave %d non-zeros", name, nz);
            /* all positive (k-quant mins clamp at 0) and constant rows */
            for (int i = 0; i < n; i++) x[i] = 1.0f + 0.5f * test_rand_f(&seed);
            r = roundtrip_rel(t, x, n, y, blk);
            CHECKF(r <= rt_bounds[k].bound, "%s n=%d positive: rel RMS error %.5f", name, n, r);
            for (int i = 0; i < n; i++) x[i] = -0.75f;
            r = roundtrip_rel(t, x, n, y, blk);
            CHECKF(r <= rt_bounds[k].bound, "%s n=%d constant: rel RMS error %.5f", name, n, r);
        }
        printf("  %-5s worst rel RMS error %.5f (bound %.4f), with an outlier %.5f (bound %.4f)\n", name, worst,
               rt_bounds[k].bound, worst_out, rt_bounds[k].outlier_bound);
    }
    /* NaN and infinities: garbage out, but valid blocks and no undefined behaviour */
    for (size_t k = 0; k < sizeof rt_bounds / sizeof rt_bounds[0]; k++) {
        for (int i = 0; i < 512; i++) x[i] = test_rand_f(&seed);
        x[3] = NAN;
        x[300] = INFINITY;
        x[301] = -INFINITY;
        quant_fns(rt_bounds[k].t).from_float(x, blk, 512);
        quant_fns(rt_bounds[k].t).to_float(blk, y, 512);
        CHECK(1);
    }
    /* Q8_K bsums are the sums of the codes per 16 */
    for (int i = 0; i < 256; i++) x[i] = test_rand_f(&seed);
    block_q8_K q8k;
    quantize_row_q8_K_ref(x, &q8k, 256);
    int ok = 1;
    for (int j = 0; j < 16; j++) {
        int s = 0;
        for (int l = 0; l < 16; l++) s += q8k.qs[16 * j + l];
        ok &= s == q8k.bsums[j];
    }
    CHECK(ok);
    free(x);
    free(y);
    free(blk);
}

/* (c) MLX affine. Packing is written here the way MLX's CPU code lays bytes out:
 * power-of-two bits fill u32 words low bits first; 3 bits: 8 codes in 3 bytes, 5
 * bits: 8 codes in 5 bytes, 6 bits: 4 codes in 3 bytes, each pack a little-endian
 * bit string. */
static void mlx_pack(const uint8_t *q, int n, int bits, uint32_t *words) {
    uint8_t *bytes = calloc((size_t)n * bits / 8, 1);
    if (bits == 2 || bits == 4 || bits == 8) {
        const int per = 32 / bits;
        for (int w = 0; w < n / per; w++) {
            uint32_t v = 0;
            for (int k = 0; k < per; k++) v |= (uint32_t)q[w * per + k] << (k * bits);
            for (int k = 0; k < 4; k++) bytes[4 * w + k] = (uint8_t)(v >> (8 * k));
        }
    } else {
        const int per = bits == 6 ? 4 : 8, nbytes = per * bits / 8; /* 3 or 5 bytes a pack */
        for (int p = 0; p < n / per; p++) {
            uint64_t v = 0;
            for (int k = 0; k < per; k++) v |= (uint64_t)q[p * per + k] << (k * bits);
            for (int k = 0; k < nbytes; k++) bytes[nbytes * p + k] = (uint8_t)(v >> (8 * k));
        }
    }
    memcpy(words, bytes, (size_t)n * bits / 8); /* u32 words are little-endian */
    free(bytes);
}

static float sb_get(enum gb_type t, const void *p, int i) {
    if (t == GB_TYPE_F32) return ((const float *)p)[i];
    return t == GB_TYPE_F16 ? f16_to_f32(((const uint16_t *)p)[i]) : bf16_to_f32(((const uint16_t *)p)[i]);
}

static void test_mlx(void) {
    const int bitss[] = {2, 3, 4, 5, 6, 8}, gss[] = {32, 64, 128};
    const enum gb_type sbs[] = {GB_TYPE_F32, GB_TYPE_F16, GB_TYPE_BF16};
    enum { N = 512 };
    uint8_t q[N];
    uint32_t words[N * 8 / 32];
    float x[N], y[N], sc32[N / 32], bi32[N / 32];
    uint16_t sc16[N / 32], bi16[N / 32];
    for (int bi = 0; bi < 6; bi++) {
        const int bits = bitss[bi];
        for (int gi = 0; gi < 3; gi++) {
            const int gs = gss[gi], ng = N / gs;
            for (int si = 0; si < 3; si++) {
                const enum gb_type sbt = sbs[si];
                void *sc = sbt == GB_TYPE_F32 ? (void *)sc32 : (void *)sc16;
                void *bs = sbt == GB_TYPE_F32 ? (void *)bi32 : (void *)bi16;
                /* dequantize hand-packed codes */
                for (int i = 0; i < N; i++) q[i] = (uint8_t)(test_rand_u64(&seed) & ((1u << bits) - 1));
                mlx_pack(q, N, bits, words);
                for (int g = 0; g < ng; g++) {
                    float s = test_rand_f(&seed) * 0.1f, b = test_rand_f(&seed);
                    if (sbt == GB_TYPE_F32) { sc32[g] = s; bi32[g] = b; }
                    else if (sbt == GB_TYPE_F16) { sc16[g] = f32_to_f16(s); bi16[g] = f32_to_f16(b); }
                    else { sc16[g] = f32_to_bf16(s); bi16[g] = f32_to_bf16(b); }
                }
                dequantize_row_mlx(words, sc, bs, sbt, bits, gs, y, N);
                int bad = 0;
                for (int i = 0; i < N; i++)
                    bad += y[i] != sb_get(sbt, sc, i / gs) * q[i] + sb_get(sbt, bs, i / gs);
                CHECKF(bad == 0, "mlx dequant bits %d gs %d sb %s: %d wrong", bits, gs, type_name(sbt), bad);

                /* quantize -> dequantize */
                for (int i = 0; i < N; i++) x[i] = test_rand_f(&seed) * (i % 97 == 0 ? 3.0f : 1.0f) + 0.1f * (float)(i / gs);
                quantize_row_mlx_ref(x, words, sc, bs, sbt, bits, gs, N);
                dequantize_row_mlx(words, sc, bs, sbt, bits, gs, y, N);
                double worst = 0;
                for (int g = 0; g < ng; g++) {
                    float mn = INFINITY, mx = 0.0f; /* MLX's max starts at 0 */
                    for (int j = 0; j < gs; j++) { mn = fminf(mn, x[g * gs + j]); mx = fmaxf(mx, x[g * gs + j]); }
                    const double step = (mx - mn) / ((1 << bits) - 1);
                    for (int j = 0; j < gs; j++) {
                        const double e = fabs(y[g * gs + j] - x[g * gs + j]) / step;
                        if (e > worst) worst = e;
                    }
                    if (sbt == GB_TYPE_F32) {
                        /* MLX makes the edge of larger magnitude exact */
                        const float edge = fabsf(mn) > fabsf(mx) ? mn : mx;
                        int hit = 0;
                        for (int j = 0; j < gs; j++) hit |= x[g * gs + j] == edge && y[g * gs + j] == edge;
                        CHECKF(hit, "mlx bits %d gs %d group %d: edge %g not exact", bits, gs, g, edge);
                    }
                }
                /* Moving the edge onto a code changes the step by up to a factor
                 * (1 + 1/2^(bits-1)), which can clip the far edge: up to one step.
                 * f16/bf16 storage adds the bias rounding and, per code, the scale's. */
                const double rel = sbt == GB_TYPE_F32 ? 0 : sbt == GB_TYPE_F16 ? 1.0 / 1024 : 1.0 / 128;
                const double bound = 1.0001 + rel * (1 << bits);
                if (gs == 64) printf("  mlx%d gs 64 sb %-4s worst error %.3f steps (bound %.3f)\n", bits, type_name(sbt), worst, bound);
                CHECKF(worst <= bound, "mlx roundtrip bits %d gs %d sb %s: worst error %.4f steps > %.4f", bits,
                       gs, type_name(sbt), worst, bound);
            }
        }
    }
    /* NaN / inf input to the MLX quantizer */
    for (int i = 0; i < 64; i++) x[i] = i == 5 ? NAN : i == 40 ? INFINITY : test_rand_f(&seed);
    quantize_row_mlx_ref(x, words, sc32, bi32, GB_TYPE_F32, 4, 32, 64);
    CHECK(1);
    /* zero and constant groups */
    for (int i = 0; i < 64; i++) x[i] = i < 32 ? 0.0f : 2.5f;
    quantize_row_mlx_ref(x, words, sc32, bi32, GB_TYPE_F32, 4, 32, 64);
    dequantize_row_mlx(words, sc32, bi32, GB_TYPE_F32, 4, 32, y, 64);
    int bad = 0;
    for (int i = 0; i < 64; i++) bad += y[i] != x[i];
    CHECKF(bad == 0, "mlx constant groups: %d wrong", bad);
}

/* (d) matmul_w_ref against dequantize-then-matmul_ref */
static void check_matmul(const struct gb_weight *w, const char *what) {
    const int n_tok = 3, n_in = (int)w->n_in, n_out = (int)w->n_out;
    float *x = malloc((size_t)n_tok * n_in * sizeof *x), *wf = calloc((size_t)n_out * n_in, sizeof *wf);
    float *y = malloc((size_t)n_tok * n_out * sizeof *y), *y_ref = malloc((size_t)n_tok * n_out * sizeof *y);
    for (int i = 0; i < n_tok * n_in; i++) x[i] = test_rand_f(&seed);
    for (int r = 0; r < n_out; r++) weight_get_row(w, r, wf + (size_t)r * n_in);
    matmul_ref(y_ref, x, wf, GB_TYPE_F32, n_tok, n_in, n_out);
    matmul_w_ref(y, x, w, n_tok);
    double worst = 0;
    for (int i = 0; i < n_tok * n_out; i++) {
        double e = fabs(y[i] - y_ref[i]) / (1.0 + fabs(y_ref[i]));
        if (e > worst) worst = e;
    }
    CHECKF(worst < 1e-4, "matmul_w_ref %s: worst rel error %g", what, worst);
    free(x); free(wf); free(y); free(y_ref);
}

static void test_matmul_and_weight(void) {
    enum { N_OUT = 7, N_IN = 512 };
    static float wsrc[N_OUT * N_IN];
    for (int i = 0; i < N_OUT * N_IN; i++) wsrc[i] = test_rand_f(&seed) * 0.2f;
    for (int ti = 0; ti < N_QUANT; ti++) {
        const enum gb_type t = quant_types[ti];
        const size_t rb = type_row_size(t, N_IN);
        uint8_t *data = malloc(rb * N_OUT);
        for (int r = 0; r < N_OUT; r++) quant_fns(t).from_float(wsrc + r * N_IN, data + r * rb, N_IN);
        struct gb_weight w = {.kind = GB_WEIGHT_PLAIN, .type = t, .n_out = N_OUT, .n_in = N_IN, .data = data,
                              .row_bytes = rb, .name = "w"};
        CHECK(weight_nbytes(&w) == rb * N_OUT);
        float row[N_IN], want[N_IN];
        weight_get_row(&w, 5, row);
        quant_fns(t).to_float(data + 5 * rb, want, N_IN);
        CHECKF(memcmp(row, want, sizeof row) == 0, "weight_get_row %s", type_name(t));
        check_matmul(&w, type_name(t));
        free(data);
    }
    /* F16 plain */
    static uint16_t w16[N_OUT * N_IN];
    for (int i = 0; i < N_OUT * N_IN; i++) w16[i] = f32_to_f16(wsrc[i]);
    struct gb_weight wp = {.kind = GB_WEIGHT_PLAIN, .type = GB_TYPE_F16, .n_out = N_OUT, .n_in = N_IN,
                           .data = w16, .row_bytes = N_IN * 2};
    check_matmul(&wp, "F16");
    /* MLX 3-bit (codes straddle words) and 4-bit, bf16 scales, rows at offsets */
    const int bitss[] = {3, 4, 6};
    for (int bi = 0; bi < 3; bi++) {
        const int bits = bitss[bi], gs = 64, ng = N_IN / gs;
        static uint32_t words[N_OUT * N_IN * 8 / 32];
        static uint16_t sc[N_OUT * N_IN / 32], bs[N_OUT * N_IN / 32];
        for (int r = 0; r < N_OUT; r++)
            quantize_row_mlx_ref(wsrc + r * N_IN, words + r * (N_IN * bits / 32), sc + r * ng, bs + r * ng,
                                 GB_TYPE_BF16, bits, gs, N_IN);
        struct gb_weight wm = {.kind = GB_WEIGHT_MLX, .type = GB_TYPE_U32, .n_out = N_OUT, .n_in = N_IN,
                               .data = words, .row_bytes = N_IN * bits / 8, .bits = bits, .group_size = gs,
                               .sb_type = GB_TYPE_BF16, .scales = sc, .biases = bs};
        CHECK(weight_nbytes(&wm) == (size_t)N_OUT * N_IN * bits / 8 + 2 * (size_t)N_OUT * ng * 2);
        float row[N_IN], want[N_IN];
        weight_get_row(&wm, 4, row);
        dequantize_row_mlx(words + 4 * (N_IN * bits / 32), sc + 4 * ng, bs + 4 * ng, GB_TYPE_BF16, bits, gs, want,
                           N_IN);
        CHECKF(memcmp(row, want, sizeof row) == 0, "weight_get_row mlx %d", bits);
        check_matmul(&wm, bits == 3 ? "mlx3" : bits == 4 ? "mlx4" : "mlx6");
    }
}

/* (e) type table and GGML ids */
static void test_types(void) {
    const struct { uint32_t id; enum gb_type t; const char *name; } ok[] = {
        {0, GB_TYPE_F32, "F32"},    {1, GB_TYPE_F16, "F16"},    {2, GB_TYPE_Q4_0, "Q4_0"},
        {3, GB_TYPE_Q4_1, "Q4_1"},  {6, GB_TYPE_Q5_0, "Q5_0"},  {7, GB_TYPE_Q5_1, "Q5_1"},
        {8, GB_TYPE_Q8_0, "Q8_0"},  {10, GB_TYPE_Q2_K, "Q2_K"}, {11, GB_TYPE_Q3_K, "Q3_K"},
        {12, GB_TYPE_Q4_K, "Q4_K"}, {13, GB_TYPE_Q5_K, "Q5_K"}, {14, GB_TYPE_Q6_K, "Q6_K"},
        {15, GB_TYPE_Q8_K, "Q8_K"}, {24, GB_TYPE_I8, "I8"},     {26, GB_TYPE_I32, "I32"},
        {27, GB_TYPE_I64, "I64"},   {30, GB_TYPE_BF16, "BF16"},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        enum gb_type t = GB_TYPE_COUNT;
        CHECKF(type_from_ggml(ok[i].id, &t) == 0 && t == ok[i].t, "ggml id %u", ok[i].id);
        CHECKF(strcmp(ggml_type_name(ok[i].id), ok[i].name) == 0, "ggml name %u", ok[i].id);
        CHECKF(strcmp(type_name(ok[i].t), ok[i].name) == 0, "type_name %s", ok[i].name);
    }
    const struct { uint32_t id; const char *name; } bad[] = {
        {4, "unknown"},  {5, "unknown"},   {9, "Q8_1"},    {16, "IQ2_XXS"}, {17, "IQ2_XS"}, {18, "IQ3_XXS"},
        {19, "IQ1_S"},   {20, "IQ4_NL"},   {21, "IQ3_S"},  {22, "IQ2_S"},   {23, "IQ4_XS"}, {25, "I16"},
        {28, "F64"},     {29, "IQ1_M"},    {31, "unknown"}, {34, "TQ1_0"},  {35, "TQ2_0"},  {39, "MXFP4"},
        {40, "NVFP4"},   {41, "Q1_0"},     {43, "unknown"}, {0xffffffffu, "unknown"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        enum gb_type t = GB_TYPE_COUNT;
        CHECKF(type_from_ggml(bad[i].id, &t) == -1 && t == GB_TYPE_COUNT, "ggml id %u should be unsupported", bad[i].id);
        CHECKF(strcmp(ggml_type_name(bad[i].id), bad[i].name) == 0, "ggml name %u: %s", bad[i].id,
               ggml_type_name(bad[i].id));
    }
    enum gb_type t;
    CHECK(type_from_safetensors("BF16", &t) == 0 && t == GB_TYPE_BF16);
    CHECK(type_from_safetensors("Q4_K", &t) == -1);
    const struct { enum gb_type t; int bs; size_t sz; } sizes[] = {
        {GB_TYPE_Q8_0, 32, sizeof(block_q8_0)}, {GB_TYPE_Q4_0, 32, sizeof(block_q4_0)},
        {GB_TYPE_Q4_1, 32, sizeof(block_q4_1)}, {GB_TYPE_Q5_0, 32, sizeof(block_q5_0)},
        {GB_TYPE_Q5_1, 32, sizeof(block_q5_1)}, {GB_TYPE_Q2_K, 256, sizeof(block_q2_K)},
        {GB_TYPE_Q3_K, 256, sizeof(block_q3_K)}, {GB_TYPE_Q4_K, 256, sizeof(block_q4_K)},
        {GB_TYPE_Q5_K, 256, sizeof(block_q5_K)}, {GB_TYPE_Q6_K, 256, sizeof(block_q6_K)},
        {GB_TYPE_Q8_K, 256, sizeof(block_q8_K)},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        const struct gb_type_traits *tt = type_traits(sizes[i].t);
        CHECKF(tt->block_size == sizes[i].bs && tt->type_size == sizes[i].sz && tt->is_quant && !tt->is_float,
               "traits %s", tt->name);
        CHECK(type_row_size(sizes[i].t, 4 * sizes[i].bs) == 4 * sizes[i].sz);
    }
    CHECK(!type_traits(GB_TYPE_F16)->is_quant && type_traits(GB_TYPE_F16)->is_float);
    CHECK(quant_fns(GB_TYPE_F32).to_float == NULL && quant_fns(GB_TYPE_F32).from_float == NULL);
}

int main(int argc, char **argv) {
    /* fresh rows every run; pass the printed seed as argv[1] to repeat a run */
    seed = argc > 1 ? strtoull(argv[1], NULL, 0) : (unsigned long long)time(NULL) * 2654435761ULL + 1;
    printf("seed %llu\n", seed);
    test_types();
    test_dequant_definition();
    test_roundtrip();
    test_mlx();
    test_matmul_and_weight();
    return test_done();
}
