/* The speech-model ops of the backend table (backend.h: im2col1d, layernorm with and
 * without weight and bias, groupnorm with one and several groups, unary tanh and erf GELU,
 * attention_dense)
 * on the CPU backend (1 and 2 threads) against the reference backend on random inputs of
 * odd sizes, and the reference against the definitions written out here in double.
 * Outputs are poisoned with NaN first. Tolerances: im2col is a copy (exact); the norms sum
 * in double in the same order on both backends (exact bits); tanh / GELU: libm's f32
 * functions against double ones, 4 ulp (2^-21 relative), GELU + 1e-7 absolute (its tail);
 * attention_dense (f32 GEMMs and softmax against double, values in [-1, 1]): 2e-5. The CUDA backend has none
 * of these ops yet (NULL in its table: Moonshine refuses to load there). */
#include "backend/backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fails;
static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}
static float *rnd(size_t n, float scale, float off) {
    float *x = malloc(n * sizeof *x + 4);
    for (size_t i = 0; i < n; i++) x[i] = off + scale * frand();
    return x;
}
static float *poison(size_t n) {
    float *x = malloc(n * sizeof *x + 4);
    for (size_t i = 0; i < n; i++) x[i] = NAN;
    return x;
}
static double abs_tol = 1e-30;
static void cmp(const char *what, const float *a, const float *b, size_t n, double rel) {
    double worst = 0;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]), tol = rel * fabs((double)b[i]) + abs_tol;
        if (!(d <= tol)) bad++;
        if (d > worst || isnan(d)) worst = isnan(d) ? INFINITY : d;
    }
    printf("%-44s n=%-7zu max |diff| %.3g%s\n", what, n, worst, bad ? "  FAIL" : "");
    if (bad) fails++;
}

int main(void) {
    struct backend *ref, *cpu1, *cpu2;
    if (backend_new("ref", 1, &ref) || backend_new("cpu", 1, &cpu1) || backend_new("cpu", 2, &cpu2)) {
        printf("FAIL: backends: %s\n", gerbil_last_error());
        return 1;
    }
    struct backend *cpus[2] = {cpu1, cpu2};
    char what[128];
    /* im2col1d */
    const int cases[][4] = {{301, 5, 7, 3}, {1000, 1, 127, 64}, {29, 12, 3, 2}, {7, 3, 7, 1}};
    for (int ci = 0; ci < 4; ci++) {
        const int T = cases[ci][0], C = cases[ci][1], K = cases[ci][2], s = cases[ci][3], To = (T - K) / s + 1;
        float *x = rnd((size_t)T * C, 1, 0), *want = poison((size_t)To * C * K), *r = poison((size_t)To * C * K);
        for (int t = 0; t < To; t++)
            for (int c = 0; c < C; c++)
                for (int k = 0; k < K; k++) want[((size_t)t * C + c) * K + k] = x[((size_t)t * s + k) * C + c];
        op_im2col1d(ref, r, x, T, C, K, s);
        snprintf(what, sizeof what, "im2col1d ref T=%d C=%d K=%d s=%d", T, C, K, s);
        cmp(what, r, want, (size_t)To * C * K, 0);
        for (int b = 0; b < 2; b++) {
            float *y = poison((size_t)To * C * K);
            op_im2col1d(cpus[b], y, x, T, C, K, s);
            snprintf(what, sizeof what, "im2col1d cpu%d T=%d C=%d K=%d s=%d", b + 1, T, C, K, s);
            cmp(what, y, r, (size_t)To * C * K, 0);
            free(y);
        }
        free(x); free(want); free(r);
    }
    /* layernorm: weight and bias, weight only, neither; in place too */
    const int R = 13, N = 37;
    for (int v = 0; v < 3; v++) {
        float *x = rnd((size_t)R * N, 3, 0.7f), *w = rnd(N, 0.5f, 1), *bb = rnd(N, 0.3f, 0);
        const float *wv = v < 2 ? w : NULL, *bv = v == 0 ? bb : NULL;
        float *want = poison((size_t)R * N), *r = poison((size_t)R * N);
        for (int t = 0; t < R; t++) {
            double m = 0, var = 0;
            for (int i = 0; i < N; i++) m += x[t * N + i];
            m /= N;
            for (int i = 0; i < N; i++) var += (x[t * N + i] - m) * (x[t * N + i] - m);
            var /= N;
            for (int i = 0; i < N; i++)
                want[t * N + i] = (float)((x[t * N + i] - m) / sqrt(var + 1e-5) * (wv ? wv[i] : 1) + (bv ? bv[i] : 0));
        }
        op_layernorm(ref, r, x, wv, bv, 1e-5f, R, N);
        snprintf(what, sizeof what, "layernorm ref (%s)", v == 0 ? "w, b" : v == 1 ? "w" : "none");
        cmp(what, r, want, (size_t)R * N, 1e-6);
        for (int b = 0; b < 2; b++) {
            float *y = malloc((size_t)R * N * sizeof *y);
            memcpy(y, x, (size_t)R * N * sizeof *y); /* in place */
            op_layernorm(cpus[b], y, y, wv, bv, 1e-5f, R, N);
            snprintf(what, sizeof what, "layernorm cpu%d (%s, in place)", b + 1, v == 0 ? "w, b" : v == 1 ? "w" : "none");
            cmp(what, y, r, (size_t)R * N, 0);
            free(y);
        }
        free(x); free(w); free(bb); free(want); free(r);
    }
    /* groupnorm */
    const int gcases[][3] = {{29, 12, 1}, {31, 12, 3}, {2749, 20, 1}};
    for (int ci = 0; ci < 3; ci++) {
        const int T = gcases[ci][0], C = gcases[ci][1], G = gcases[ci][2], cg = C / G;
        float *x = rnd((size_t)T * C, 2, 0.3f), *w = rnd(C, 0.5f, 1), *bb = rnd(C, 0.3f, 0);
        float *want = poison((size_t)T * C), *r = poison((size_t)T * C);
        for (int g = 0; g < G; g++) {
            double m = 0, var = 0;
            for (int t = 0; t < T; t++)
                for (int c = g * cg; c < (g + 1) * cg; c++) m += x[t * C + c];
            m /= (double)T * cg;
            for (int t = 0; t < T; t++)
                for (int c = g * cg; c < (g + 1) * cg; c++) var += (x[t * C + c] - m) * (x[t * C + c] - m);
            var /= (double)T * cg;
            for (int t = 0; t < T; t++)
                for (int c = g * cg; c < (g + 1) * cg; c++)
                    want[t * C + c] = (float)((x[t * C + c] - m) / sqrt(var + 1e-5) * w[c] + bb[c]);
        }
        op_groupnorm(ref, r, x, w, bb, 1e-5f, T, C, G);
        snprintf(what, sizeof what, "groupnorm ref T=%d C=%d G=%d", T, C, G);
        cmp(what, r, want, (size_t)T * C, 1e-6);
        for (int b = 0; b < 2; b++) {
            float *y = poison((size_t)T * C);
            op_groupnorm(cpus[b], y, x, w, bb, 1e-5f, T, C, G);
            snprintf(what, sizeof what, "groupnorm cpu%d T=%d C=%d G=%d", b + 1, T, C, G);
            cmp(what, y, r, (size_t)T * C, 0);
            free(y);
        }
        free(x); free(w); free(bb); free(want); free(r);
    }
    /* unary */
    for (int kind = 0; kind < 2; kind++) {
        const long n = 100003;
        float *x = rnd((size_t)n, 6, 0), *want = malloc((size_t)n * sizeof *want), *r = malloc((size_t)n * sizeof *r);
        for (long i = 0; i < n; i++) {
            double v = x[i];
            want[i] = (float)(kind == GB_UNARY_TANH ? tanh(v) : 0.5 * v * (1 + erf(v / sqrt(2.0))));
        }
        memcpy(r, x, (size_t)n * sizeof *r);
        op_unary(ref, r, n, kind);
        snprintf(what, sizeof what, "unary %s ref", kind ? "gelu(erf)" : "tanh");
        cmp(what, r, want, (size_t)n, 0);
        float *y1 = NULL;
        for (int b = 0; b < 2; b++) {
            float *y = malloc((size_t)n * sizeof *y);
            memcpy(y, x, (size_t)n * sizeof *y);
            op_unary(cpus[b], y, n, kind);
            snprintf(what, sizeof what, "unary %s cpu%d", kind ? "gelu(erf)" : "tanh", b + 1);
            /* GELU's tail: erfc(z) moves 2 z^2 times the f32 rounding of z = x / sqrt 2 */
            abs_tol = kind ? 1e-7 : 1e-30;
            cmp(what, y, r, (size_t)n, 4.0 / (1 << 23));
            abs_tol = 1e-30;
            if (b == 0) y1 = y;
            else {
                if (memcmp(y1, y, (size_t)n * sizeof *y)) { printf("FAIL: unary 1 vs 2 threads differ\n"); fails++; }
                free(y);
                free(y1);
            }
        }
        free(x); free(want); free(r);
    }
    /* attention_dense: GQA and MHA, one query row and many; f32 GEMM sums and softmax against
     * double; outputs are convex combinations of values in [-1, 1]: 2e-5 absolute */
    const int acases[][5] = {{37, 53, 4, 2, 13}, {1, 123, 8, 8, 52}, {457, 457, 2, 1, 16}};
    for (int ci = 0; ci < 3; ci++) {
        const int nq = acases[ci][0], nkv = acases[ci][1], nh = acases[ci][2], nkh = acases[ci][3], hd = acases[ci][4];
        float *q = rnd((size_t)nq * nh * hd, 1, 0), *k = rnd((size_t)nkv * nkh * hd, 1, 0),
              *v = rnd((size_t)nkv * nkh * hd, 1, 0), *r = poison((size_t)nq * nh * hd);
        float *scr = malloc(attn_dense_floats(nq, nkv, hd) * sizeof(float));
        op_attention_dense(ref, r, q, k, v, nq, nkv, nh, nkh, hd, 0.3f, scr);
        for (int b = 0; b < 2; b++) {
            float *y = poison((size_t)nq * nh * hd);
            op_attention_dense(cpus[b], y, q, k, v, nq, nkv, nh, nkh, hd, 0.3f, scr);
            snprintf(what, sizeof what, "attention_dense cpu%d q=%d kv=%d heads %d/%d hd %d", b + 1, nq, nkv, nh, nkh, hd);
            abs_tol = 2e-5;
            cmp(what, y, r, (size_t)nq * nh * hd, 0);
            abs_tol = 1e-30;
            free(y);
        }
        free(q); free(k); free(v); free(r); free(scr);
    }
    /* audio-codec ops: im2col1d_pad (dilation, padding, row tiles), col2im1d (odd and even
     * strides), snake; the reference against the definitions in double, cpu against ref */
    {
        const int pc[][6] = {{37, 5, 7, 1, 3, 9}, {23, 3, 7, 1, 9, 27}, {50, 4, 3, 2, 1, 1}, {11, 6, 1, 1, 1, 0}};
        for (int ci = 0; ci < 4; ci++) {
            const int T = pc[ci][0], C = pc[ci][1], K = pc[ci][2], s = pc[ci][3], d = pc[ci][4], p = pc[ci][5];
            const int To = (T + 2 * p - d * (K - 1) - 1) / s + 1, t0 = To / 3, n = To - t0;
            float *x = rnd((size_t)T * C, 1, 0), *want = poison((size_t)n * C * K), *r = poison((size_t)n * C * K);
            for (int t = 0; t < n; t++)
                for (int c = 0; c < C; c++)
                    for (int k = 0; k < K; k++) {
                        const long i = (long)(t0 + t) * s + (long)k * d - p;
                        want[((size_t)t * C + c) * K + k] = i >= 0 && i < T ? x[(size_t)i * C + c] : 0.0f;
                    }
            op_im2col1d_pad(ref, r, x, T, C, K, s, d, p, t0, n);
            snprintf(what, sizeof what, "im2col1d_pad ref T=%d C=%d K=%d s=%d d=%d p=%d", T, C, K, s, d, p);
            cmp(what, r, want, (size_t)n * C * K, 0);
            for (int b = 0; b < 2; b++) {
                float *y = poison((size_t)n * C * K);
                op_im2col1d_pad(cpus[b], y, x, T, C, K, s, d, p, t0, n);
                snprintf(what, sizeof what, "im2col1d_pad cpu%d K=%d d=%d p=%d", b + 1, K, d, p);
                cmp(what, y, r, (size_t)n * C * K, 0);
                free(y);
            }
            free(x); free(want); free(r);
        }
        const int sc[][3] = {{13, 5, 3}, {9, 7, 2}, {31, 3, 5}, {4, 2, 8}};
        for (int ci = 0; ci < 4; ci++) {
            const int T = sc[ci][0], C = sc[ci][1], s = sc[ci][2], K = 2 * s, p = (s + 1) / 2;
            const int To = (T - 1) * s - 2 * p + K;
            float *z = rnd((size_t)T * C * K, 1, 0), *bb = rnd(C, 0.5f, 0), *r = poison((size_t)To * C);
            double *want = calloc((size_t)To * C, sizeof *want);
            for (int t = 0; t < T; t++)
                for (int c = 0; c < C; c++)
                    for (int k = 0; k < K; k++) {
                        const long j = (long)t * s + k - p;
                        if (j >= 0 && j < To) want[(size_t)j * C + c] += z[((size_t)t * C + c) * K + k];
                    }
            float *wf = malloc((size_t)To * C * sizeof *wf);
            for (int j = 0; j < To; j++)
                for (int c = 0; c < C; c++) wf[(size_t)j * C + c] = (float)(want[(size_t)j * C + c] + bb[c]);
            op_col2im1d(ref, r, z, bb, T, C, K, s, p, To);
            snprintf(what, sizeof what, "col2im1d ref T=%d C=%d s=%d", T, C, s);
            abs_tol = 1e-6;
            cmp(what, r, wf, (size_t)To * C, 1e-6);
            abs_tol = 1e-30;
            for (int b = 0; b < 2; b++) {
                float *y = poison((size_t)To * C);
                op_col2im1d(cpus[b], y, z, bb, T, C, K, s, p, To);
                snprintf(what, sizeof what, "col2im1d cpu%d T=%d C=%d s=%d", b + 1, T, C, s);
                cmp(what, y, r, (size_t)To * C, 0);
                free(y);
            }
            free(z); free(bb); free(r); free(want); free(wf);
        }
        const int T = 41, C = 19;
        float *x = rnd((size_t)T * C, 4, 0), *al = rnd(C, 0.8f, 1), *r = malloc((size_t)T * C * sizeof *r),
              *want = malloc((size_t)T * C * sizeof *want);
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++) {
                const double v = x[(size_t)t * C + c], sn = sin((double)al[c] * v);
                want[(size_t)t * C + c] = (float)(v + sn * sn / ((double)al[c] + 1e-9));
            }
        memcpy(r, x, (size_t)T * C * sizeof *r);
        op_snake(ref, r, al, T, C);
        abs_tol = 1e-6;
        cmp("snake ref (f32 sinf vs double)", r, want, (size_t)T * C, 1e-5);
        abs_tol = 1e-30;
        for (int b = 0; b < 2; b++) {
            float *y = malloc((size_t)T * C * sizeof *y);
            memcpy(y, x, (size_t)T * C * sizeof *y);
            op_snake(cpus[b], y, al, T, C);
            snprintf(what, sizeof what, "snake cpu%d", b + 1);
            cmp(what, y, r, (size_t)T * C, 0);
            free(y);
        }
        free(x); free(al); free(r); free(want);
    }
    backend_free(ref);
    backend_free(cpu1);
    backend_free(cpu2);
    printf(fails ? "test_speech_ops: %d FAILED\n" : "test_speech_ops: all passed\n", fails);
    return fails ? 1 : 0;
}
