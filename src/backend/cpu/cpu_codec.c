/* The CPU backend's ops for the audio codecs (backend.h: im2col1d_pad, col2im1d, snake),
 * threaded over output positions. col2im1d gathers (each output sums its k ascending, as
 * the reference's scatter does), so both give the same bits; snake uses the same f32
 * expression as the reference. */
#include "backend/cpu/cpu.h"

#include <math.h>
#include <string.h>

struct colpad_args {
    float *col;
    const float *x;
    int T_in, C, K, stride, dil, pad, t0;
};

static void colpad_range(void *p, long lo, long hi) {
    const struct colpad_args *a = p;
    const int C = a->C, K = a->K;
    for (long r = lo; r < hi; r++) {
        float *out = a->col + (size_t)r * C * K;
        const long t = r + a->t0;
        for (int k = 0; k < K; k++) {
            const long i = t * a->stride + (long)k * a->dil - a->pad;
            if (i < 0 || i >= a->T_in) {
                for (int c = 0; c < C; c++) out[(size_t)c * K + k] = 0.0f;
                continue;
            }
            const float *in = a->x + (size_t)i * C;
            for (int c = 0; c < C; c++) out[(size_t)c * K + k] = in[c];
        }
    }
}

void cpu_im2col1d_pad(struct backend *be, float *col, const float *x, int T_in, int C, int K, int stride,
                      int dilation, int pad, int t0, int n) {
    if (n <= 0) return;
    struct colpad_args a = {col, x, T_in, C, K, stride, dilation, pad, t0};
    parallel_range(cpu_of(be), n, (long)C * K, colpad_range, &a);
}

struct c2i_args {
    float *y;
    const float *z, *b;
    int T_in, C, K, stride, pad;
};

static void c2i_range(void *p, long lo, long hi) {
    const struct c2i_args *a = p;
    const int C = a->C, K = a->K, s = a->stride;
    for (long j = lo; j < hi; j++) {
        float *yj = a->y + (size_t)j * C;
        for (int c = 0; c < C; c++) yj[c] = a->b ? a->b[c] : 0.0f;
        for (int k = 0; k < K; k++) {
            const long u = j + a->pad - k;
            if (u < 0 || u % s) continue;
            const long t = u / s;
            if (t >= a->T_in) continue;
            const float *zt = a->z + (size_t)t * C * K + k;
            for (int c = 0; c < C; c++) yj[c] += zt[(size_t)c * K];
        }
    }
}

void cpu_col2im1d(struct backend *be, float *y, const float *z, const float *b, int T_in, int C, int K, int stride,
                  int pad, int T_out) {
    if (T_out <= 0) return;
    struct c2i_args a = {y, z, b, T_in, C, K, stride, pad};
    parallel_range(cpu_of(be), T_out, (long)C * K / stride + C, c2i_range, &a);
}

struct snake_args {
    float *x;
    const float *alpha;
    int C;
};

static void snake_range(void *p, long lo, long hi) {
    const struct snake_args *a = p;
    for (long t = lo; t < hi; t++) {
        float *xt = a->x + (size_t)t * a->C;
        for (int c = 0; c < a->C; c++) {
            const float al = a->alpha[c], inv = 1.0f / (al + 1e-9f), v = xt[c], s = sinf(al * v);
            xt[c] = v + inv * (s * s);
        }
    }
}

void cpu_snake(struct backend *be, float *x, const float *alpha, int T, int C) {
    struct snake_args a = {x, alpha, C};
    parallel_range(cpu_of(be), T, 8L * C, snake_range, &a);
}
