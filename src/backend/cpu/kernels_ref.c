/* Scalar reference kernels: the spec for the SIMD versions and the oracle the tests
 * compare them with. They favour accuracy over speed: every sum is accumulated in
 * double, so the reference is (nearly) the exact answer rounded once to f32, and a
 * fast kernel's error against it is its own reordering error alone. */
#include "backend/cpu/kernels.h"
#include "base/fp16.h"
#include "base/status.h"

#include <math.h>
#include <stddef.h>

/* Element i of a weight row of type t, as f32 (exact for all three types). */
static inline float weight_at(const void *w, enum gb_type t, size_t i) {
    switch (t) {
    case GB_TYPE_F32: return ((const float *)w)[i];
    case GB_TYPE_F16: return f16_to_f32(((const uint16_t *)w)[i]);
    case GB_TYPE_BF16: return bf16_to_f32(((const uint16_t *)w)[i]);
    default: GB_ASSERT(!"matmul: weight type must be F32, F16 or BF16"); return 0.0f;
    }
}

void matmul_rows_ref(float *y, const float *x, const void *w, enum gb_type wtype,
                     int n_tok, int n_in, int n_out, int o_lo, int o_hi) {
    for (int o = o_lo; o < o_hi; o++) {
        size_t row = (size_t)o * (size_t)n_in;
        for (int t = 0; t < n_tok; t++) {
            const float *xt = x + (size_t)t * (size_t)n_in;
            double acc = 0.0;
            for (int i = 0; i < n_in; i++) acc += (double)xt[i] * weight_at(w, wtype, row + (size_t)i);
            y[(size_t)t * (size_t)n_out + (size_t)o] = (float)acc;
        }
    }
}

void matmul_ref(float *y, const float *x, const void *w, enum gb_type wtype,
                int n_tok, int n_in, int n_out) {
    matmul_rows_ref(y, x, w, wtype, n_tok, n_in, n_out, 0, n_out);
}

float dot_f32_ref(const float *a, const float *b, int n) {
    double acc = 0.0;
    for (int i = 0; i < n; i++) acc += (double)a[i] * b[i];
    return (float)acc;
}

float dot_f32_f16_ref(const float *a, const uint16_t *b, int n) {
    double acc = 0.0;
    for (int i = 0; i < n; i++) acc += (double)a[i] * f16_to_f32(b[i]);
    return (float)acc;
}

/* a * v[i] is exact in double, so this is a fused multiply-add up to the rare
 * double rounding (double, then f32): within an ulp of the FMA version. */
void axpy_f32_ref(float *y, float a, const float *v, int n) {
    for (int i = 0; i < n; i++) y[i] = (float)((double)y[i] + (double)a * v[i]);
}

void axpy_f16_ref(float *y, float a, const uint16_t *v, int n) {
    for (int i = 0; i < n; i++) y[i] = (float)((double)y[i] + (double)a * f16_to_f32(v[i]));
}

double sumsq_f32_ref(const float *x, int n) {
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    return ss;
}

void f32_to_f16_row_ref(uint16_t *y, const float *x, long n) {
    for (long i = 0; i < n; i++) y[i] = f32_to_f16(x[i]);
}

/* In double, rounded once. */
void silu_mul_ref(float *y, const float *g, const float *u, long n) {
    for (long i = 0; i < n; i++) {
        double x = g[i];
        y[i] = (float)(x / (1.0 + exp(-x)) * u[i]);
    }
}

/* In double, rounded once: the tanh form torch evaluates for gelu(approximate="tanh"). */
void gelu_tanh_mul_ref(float *y, const float *g, const float *u, long n) {
    const double k = sqrt(2.0 / M_PI);
    for (long i = 0; i < n; i++) {
        double x = g[i];
        double t = tanh(k * (x + 0.044715 * x * x * x));
        y[i] = (float)(0.5 * x * (1.0 + t) * u[i]);
    }
}

void softcap_ref(float *x, float cap, long n) {
    for (long i = 0; i < n; i++) x[i] = (float)((double)cap * tanh((double)x[i] / cap));
}
