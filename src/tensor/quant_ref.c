/* Reference conversions for the GGML block types and MLX affine quantization.
 *
 * Dequantizers follow ggml's definitions operation for operation (same f32
 * products and sums in the same order), so they match ggml's scalar code bit for
 * bit -- as long as neither side fuses a*b+c into an FMA: -std=c11 keeps
 * contraction off here; a ggml built in GNU mode with -mfma may differ in the
 * last bit.
 *
 * Quantizers. Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and Q8_K use ggml's simple reference
 * rules (amax/min-max scales). The k-quants (Q2_K..Q6_K) use our own search, in the
 * spirit of ggml's make_qkx / make_qx: for each sub-block we try a few candidate
 * inverse scales around the min-max one, round, and solve the least-squares
 * scale (and, for the asymmetric types, offset) for those codes, keeping the
 * candidate with the smallest squared error; then the sub-block scales (and
 * offsets) are themselves quantized against the super-block d (and dmin), and the
 * codes are recomputed with the scales as they will be decoded. Unweighted (no
 * importance matrix); not bit-identical to ggml. */
#include "tensor/quant_ref.h"
#include "base/fp16.h"
#include "base/status.h"

#include <float.h>
#include <math.h>
#include <string.h>

static inline float half(gb_half h) { return f16_to_f32(h); }
/* round(v) clamped to [lo, hi] (lo >= -1024), without a libm call; ties round
 * up; NaN gives lo, so garbage input still yields valid codes. */
static inline int qround(float v, int lo, int hi) {
    v = v > (float)lo ? v : (float)lo;
    v = v < (float)hi ? v : (float)hi;
    return (int)(v + 1024.5f) - 1024;
}
/* (int)v clamped to [0, hi] -- ggml's MIN(hi, (int8_t)v) for v >= 0 -- with the
 * clamp done in float so NaN or huge input never reaches the conversion. */
static inline int trunc_clamp(float v, int hi) {
    v = v > 0.0f ? v : 0.0f;
    v = v < (float)hi ? v : (float)hi;
    return (int)v;
}

/* ---------------------------------------------------------------- dequantize */

void dequantize_row_q8_0(const void *blocks, float *y, int64_t n) {
    GB_ASSERT(n % QK8_0 == 0);
    const block_q8_0 *b = blocks;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        const float d = half(b[i].d);
        for (int j = 0; j < QK8_0; j++) y[i * QK8_0 + j] = b[i].qs[j] * d;
    }
}

void dequantize_row_q4_0(const void *blocks, float *y, int64_t n) {
    GB_ASSERT(n % QK4_0 == 0);
    const block_q4_0 *b = blocks;
    for (int64_t i = 0; i < n / QK4_0; i++) {
        const float d = half(b[i].d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            const int x0 = (b[i].qs[j] & 0x0f) - 8, x1 = (b[i].qs[j] >> 4) - 8;
            y[i * QK4_0 + j] = x0 * d;
            y[i * QK4_0 + j + QK4_0 / 2] = x1 * d;
        }
    }
}

void dequantize_row_q4_1(const void *blocks, float *y, int64_t n) {
    GB_ASSERT(n % QK4_1 == 0);
    const block_q4_1 *b = blocks;
    for (int64_t i = 0; i < n / QK4_1; i++) {
        const float d = half(b[i].d), m = half(b[i].m);
        for (int j = 0; j < QK4_1 / 2; j++) {
            const int x0 = b[i].qs[j] & 0x0f, x1 = b[i].qs[j] >> 4;
            y[i * QK4_1 + j] = x0 * d + m;
            y[i * QK4_1 + j + QK4_1 / 2] = x1 * d + m;
        }
    }
}

static inline uint32_t load_u32le(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void dequantize_row_q5_0(const void *blocks, float *y, int64_t n) {
    GB_ASSERT(n % QK5_0 == 0);
    const block_q5_0 *b = blocks;
    for (int64_t i = 0; i < n / QK5_0; i++) {
        const float d = half(b[i].d);
        const uint32_t qh = load_u32le(b[i].qh); /* bit j: 5th bit of element j */
        for (int j = 0; j < QK5_0 / 2; j++) {
            const int h0 = (qh >> j) & 1, h1 = (qh >> (j + 16)) & 1;
            const int x0 = ((b[i].qs[j] & 0x0f) | h0 << 4) - 16;
            const int x1 = ((b[i].qs[j] >> 4) | h1 << 4) - 16;
            y[i * QK5_0 + j] = x0 * d;
            y[i * QK5_0 + j + QK5_0 / 2] = x1 * d;
        }
    }
}

void dequantize_row_q5_1(const void *blocks, float *y, int64_t n) {
    GB_ASSERT(n % QK5_1 == 0);
    const block_q5_1 *b = blocks;
    for (int64_t i = 0; i < n / QK5_1; i++) {
        const float d = half(b[i].d), m = half(b[i].m);
        const uint32_t qh = load_u32le(b[i].qh);
        for (int j = 0; j < QK5_1 / 2; j++) {
            const int h0 = (qh >> j) & 1, h1 = (qh >> (j + 16)) & 1;
            const int x0 = (b[i].qs[j] & 0x0f) | h0 << 4;
            const int x1 = (b[i].qs[j] >> 4) | h1 << 4;
            y[i * QK5_1 + j] = x0 * d + m;
            y[i * QK5_1 + j + QK5_1 / 2] = x1 * d + m;
        }
    }
}

/* Q2_K: 16 sub-blocks of 16; scales[s] = 4-bit scale | 4-bit min << 4.
 * Codes: each 128-element half uses 32 bytes of qs; element h*128 + 32*k + l sits
 * in qs[h*32 + l] at bits 2k..2k+1. x = d*scale*q - dmin*min. */
void dequantize_row_q2_K(const void *blocks, float *y, int64_t n) {
    GB_ASSERT(n % QK_K == 0);
    const block_q2_K *b = blocks;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = half(b[i].d), dmin = half(b[i].dmin);
        const uint8_t *q = b[i].qs;
        int is = 0;
        for (int h = 0; h < QK_K / 128; h++, q += 32) {
            for (int k = 0; k < 4; k++) {
                for (int part = 0; part < 2; part++) {
                    const uint8_t sc = b[i].scales[is++];
                    const float dl = d * (sc & 0x0f), ml = dmin * (sc >> 4);
                    for (int l = 0; l < 16; l++)
                        *y++ = dl * (int8_t)((q[part * 16 + l] >> (2 * k)) & 3) - ml;
                }
            }
        }
    }
}

/* The 16 six-bit scales of Q3_K, stored biased by 32: low nibbles in bytes 0..7
 * (scales 0..7 low nibble, 8..15 high nibble), top two bits in bytes 8..11
 * (scale s at byte 8 + s%4, bits 2*(s/4)). */
static void q3_K_unpack_scales(const uint8_t *s, int8_t out[16]) {
    for (int j = 0; j < 16; j++) {
        const int lo = j < 8 ? (s[j] & 0x0f) : (s[j - 8] >> 4);
        const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        out[j] = (int8_t)((lo | hi << 4) - 32);
    }
}

/* Q3_K: 16 sub-blocks of 16; code = 2 low bits (qs, laid out as Q2_K) minus 4
 * unless the element's hmask bit is set; hmask[l] bit 4h + k for element
 * h*128 + 32*k + l. x = d * scale * code. */
void dequantize_row_q3_K(const void *blocks, float *y, int64_t n) {
    GB_ASSERT(n % QK_K == 0);
    const block_q3_K *b = blocks;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d_all = half(b[i].d);
        int8_t scales[16];
        q3_K_unpack_scales(b[i].scales, scales);
        const uint8_t *q = b[i].qs, *hm = b[i].hmask;
        uint8_t m = 1;
        int is = 0;
        for (int h = 0; h < QK_K / 128; h++, q += 32) {
            for (int k = 0; k < 4; k++, m <<= 1) {
                for (int part = 0; part < 2; part++) {
                    const float dl = d_all * (scales[is++]);
                    for (int l = part * 16; l < part * 16 + 16; l++)
                        *y++ = dl * ((int8_t)((q[l] >> (2 * k)) & 3) - ((hm[l] & m) ? 0 : 4));
                }
            }
        }
    }
}

/* Scale and min of sub-block j (0..7) from the 12 packed bytes of Q4_K/Q5_K:
 * j < 4: low 6 bits of bytes j and j+4; j >= 4: a nibble of byte j+4 plus the top
 * two bits of bytes j-4 (scale) and j (min). */
static inline void k4_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* Q4_K: 8 sub-blocks of 32; each 64-element chunk c uses qs[32c .. 32c+31], low
 * nibbles for sub-block 2c, high nibbles for 2c+1. x = d*sc*q - dmin*m. */
void dequantize_row_q4_K(const void *blocks, float *y, int64_t n) {
    GB_ASSERT(n % QK_K == 0);
    const block_q4_K *b = blocks;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = half(b[i].d), dmin = half(b[i].dmin);
        const uint8_t *q = b[i].qs;
        for (int c = 0; c < QK_K / 64; c++, q += 32) {
            uint8_t sc, m;
            k4_scale_min(2 * c, b[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            k4_scale_min(2 * c + 1, b[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (q[l] & 0x0f) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (q[l] >> 4) - m2;
        }
    }
}

/* Q5_K: Q4_K plus a fifth bit: qh[l] bit s for element 32s + l. */
void dequantize_row_q5_K(const void *blocks, float *y, int64_t n) {
    GB_ASSERT(n % QK_K == 0);
    const block_q5_K *b = blocks;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = half(b[i].d), dmin = half(b[i].dmin);
        const uint8_t *ql = b[i].qs, *qh = b[i].qh;
        uint8_t u1 = 1, u2 = 2;
        for (int c = 0; c < QK_K / 64; c++, ql += 32, u1 <<= 2, u2 <<= 2) {
            uint8_t sc, m;
            k4_scale_min(2 * c, b[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            k4_scale_min(2 * c + 1, b[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * ((ql[l] & 0x0f) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
        }
    }
}

/* Q6_K: 16 sub-blocks of 16 with int8 scales; each 128-element half uses 64 bytes
 * of ql and 32 of qh. Element h*128 + 32k + l: low nibble (k = 0, 1) or high
 * nibble (k = 2, 3) of ql[h*64 + l + 32*(k & 1)], top two bits qh[h*32 + l] at
 * bits 2k. x = d * scale * (q - 32). */
void dequantize_row_q6_K(const void *blocks, float *y, int64_t n) {
    GB_ASSERT(n % QK_K == 0);
    const block_q6_K *b = blocks;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = half(b[i].d);
        const uint8_t *ql = b[i].ql, *qh = b[i].qh;
        const int8_t *sc = b[i].scales;
        for (int h = 0; h < QK_K / 128; h++, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = (int8_t)((ql[l] & 0x0f) | ((qh[l] >> 0) & 3) << 4) - 32;
                const int q2 = (int8_t)((ql[l + 32] & 0x0f) | ((qh[l] >> 2) & 3) << 4) - 32;
                const int q3 = (int8_t)((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
                const int q4 = (int8_t)((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
                y[l + 0] = d * sc[is + 0] * q1;
                y[l + 32] = d * sc[is + 2] * q2;
                y[l + 64] = d * sc[is + 4] * q3;
                y[l + 96] = d * sc[is + 6] * q4;
            }
        }
    }
}

void dequantize_row_q8_K(const void *blocks, float *y, int64_t n) {
    GB_ASSERT(n % QK_K == 0);
    const block_q8_K *b = blocks;
    for (int64_t i = 0; i < n / QK_K; i++)
        for (int j = 0; j < QK_K; j++) y[i * QK_K + j] = b[i].d * b[i].qs[j];
}

/* ------------------------------------------------- simple block quantizers */

void quantize_row_q8_0_ref(const float *x, void *blocks, int64_t n) {
    GB_ASSERT(n % QK8_0 == 0);
    block_q8_0 *b = blocks;
    for (int64_t i = 0; i < n / QK8_0; i++, x += QK8_0) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = f32_to_f16(d);
        for (int j = 0; j < QK8_0; j++) {
            float v = x[j] * id; /* |v| <= 127 for finite input */
            v = v > -127.0f ? v : -127.0f;
            v = v < 127.0f ? v : 127.0f;
            b[i].qs[j] = (int8_t)roundf(v);
        }
    }
}

/* The element of largest magnitude, with its sign. */
static float signed_absmax(const float *x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++)
        if (fabsf(x[j]) > amax) { amax = fabsf(x[j]); max = x[j]; }
    return max;
}

/* Q4_0/Q5_0: d = max / -2^(bits-1), so the largest-magnitude element maps to code 0. */
void quantize_row_q4_0_ref(const float *x, void *blocks, int64_t n) {
    GB_ASSERT(n % QK4_0 == 0);
    block_q4_0 *b = blocks;
    for (int64_t i = 0; i < n / QK4_0; i++, x += QK4_0) {
        const float d = signed_absmax(x, QK4_0) / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = f32_to_f16(d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            const int x0 = trunc_clamp(x[j] * id + 8.5f, 15);
            const int x1 = trunc_clamp(x[j + QK4_0 / 2] * id + 8.5f, 15);
            b[i].qs[j] = (uint8_t)(x0 | x1 << 4);
        }
    }
}

void quantize_row_q4_1_ref(const float *x, void *blocks, int64_t n) {
    GB_ASSERT(n % QK4_1 == 0);
    block_q4_1 *b = blocks;
    for (int64_t i = 0; i < n / QK4_1; i++, x += QK4_1) {
        float mn = x[0], mx = x[0];
        for (int j = 1; j < QK4_1; j++) { mn = fminf(mn, x[j]); mx = fmaxf(mx, x[j]); }
        const float d = (mx - mn) / 15.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = f32_to_f16(d);
        b[i].m = f32_to_f16(mn);
        for (int j = 0; j < QK4_1 / 2; j++) {
            const int x0 = trunc_clamp((x[j] - mn) * id + 0.5f, 15);
            const int x1 = trunc_clamp((x[j + QK4_1 / 2] - mn) * id + 0.5f, 15);
            b[i].qs[j] = (uint8_t)(x0 | x1 << 4);
        }
    }
}

static inline void store_u32le(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); p[2] = (uint8_t)(v >> 16); p[3] = (uint8_t)(v >> 24);
}

void quantize_row_q5_0_ref(const float *x, void *blocks, int64_t n) {
    GB_ASSERT(n % QK5_0 == 0);
    block_q5_0 *b = blocks;
    for (int64_t i = 0; i < n / QK5_0; i++, x += QK5_0) {
        const float d = signed_absmax(x, QK5_0) / -16.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = f32_to_f16(d);
        uint32_t qh = 0;
        for (int j = 0; j < QK5_0 / 2; j++) {
            const int x0 = trunc_clamp(x[j] * id + 16.5f, 31);
            const int x1 = trunc_clamp(x[j + QK5_0 / 2] * id + 16.5f, 31);
            b[i].qs[j] = (uint8_t)((x0 & 0x0f) | (x1 & 0x0f) << 4);
            qh |= (uint32_t)(x0 >> 4) << j | (uint32_t)(x1 >> 4) << (j + 16);
        }
        store_u32le(b[i].qh, qh);
    }
}

void quantize_row_q5_1_ref(const float *x, void *blocks, int64_t n) {
    GB_ASSERT(n % QK5_1 == 0);
    block_q5_1 *b = blocks;
    for (int64_t i = 0; i < n / QK5_1; i++, x += QK5_1) {
        float mn = x[0], mx = x[0];
        for (int j = 1; j < QK5_1; j++) { mn = fminf(mn, x[j]); mx = fmaxf(mx, x[j]); }
        const float d = (mx - mn) / 31.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = f32_to_f16(d);
        b[i].m = f32_to_f16(mn);
        uint32_t qh = 0;
        for (int j = 0; j < QK5_1 / 2; j++) {
            const int x0 = trunc_clamp((x[j] - mn) * id + 0.5f, 31);
            const int x1 = trunc_clamp((x[j + QK5_1 / 2] - mn) * id + 0.5f, 31);
            b[i].qs[j] = (uint8_t)((x0 & 0x0f) | (x1 & 0x0f) << 4);
            qh |= (uint32_t)(x0 >> 4) << j | (uint32_t)(x1 >> 4) << (j + 16);
        }
        store_u32le(b[i].qh, qh);
    }
}

void quantize_row_q8_K_ref(const float *x, void *blocks, int64_t n) {
    GB_ASSERT(n % QK_K == 0);
    block_q8_K *b = blocks;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        const float max = signed_absmax(x, QK_K);
        if (max == 0.0f) {
            memset(&b[i], 0, sizeof b[i]);
            continue;
        }
        const float iscale = -127.0f / max;
        for (int j = 0; j < QK_K; j++) b[i].qs[j] = (int8_t)qround(iscale * x[j], -127, 127);
        for (int j = 0; j < QK_K / 16; j++) {
            int sum = 0;
            for (int l = 0; l < 16; l++) sum += b[i].qs[16 * j + l];
            b[i].bsums[j] = (int16_t)sum;
        }
        b[i].d = 1.0f / iscale;
    }
}

/* ---------------------------------------------------------- k-quant search */

/* Least-squares (s, b) for x ~= s*q + b with the codes q = round((x - b0) / s0)
 * clamped to [0, nmax]; b is kept <= 0 (a k-quant min can only be subtracted).
 * Returns 0 when the codes do not determine a positive scale. */
static int ls_asym(const float *x, int n, int nmax, double s0, double b0, double *s, double *b) {
    const float inv = (float)(1.0 / s0), fb0 = (float)b0;
    double sq = 0, sqq = 0, sx = 0, sqx = 0;
    for (int j = 0; j < n; j++) {
        const int q = qround((x[j] - fb0) * inv, 0, nmax);
        sq += q; sqq += (double)q * q; sx += x[j]; sqx += (double)q * x[j];
    }
    const double det = n * sqq - sq * sq;
    if (det <= 0) return 0;
    *s = (n * sqx - sq * sx) / det;
    *b = (sqq * sx - sq * sqx) / det;
    if (*b > 0) { *b = 0; *s = sqx / sqq; }
    return *s > 0;
}

/* Squared error of x coded with (s, b), codes rounded to nearest. */
static double err_asym(const float *x, int n, int nmax, double s, double b) {
    const float inv = (float)(1.0 / s), fb = (float)b;
    double err = 0;
    for (int j = 0; j < n; j++) {
        const int q = qround((x[j] - fb) * inv, 0, nmax);
        const double e = s * q + b - x[j];
        err += e * e;
    }
    return err;
}

/* Asymmetric fit of n values: x ~= s*q - m with q in [0, nmax], s >= 0, m >= 0.
 * Tries steps (max - min) / (nmax + k/10) for k in [-8, 8], rounding from the
 * min and, for k = -8, -4, 0, 4, 8, also from half a step above it (which fits a
 * sub-block whose range one outlier stretched: most values then share the lowest
 * codes), fits
 * (s, m) by least squares to each rounding and keeps the best; then a few Lloyd
 * rounds (re-round with the fitted pair, refit) while the error drops -- these
 * matter for a sub-block with an outlier, where starting from the min places
 * the low codes badly. */
static void fit_asym(const float *x, int n, int nmax, float *s_out, float *m_out) {
    float mn = x[0], mx = x[0];
    for (int j = 1; j < n; j++) { mn = fminf(mn, x[j]); mx = fmaxf(mx, x[j]); }
    if (mn > 0.0f) mn = 0.0f;
    if (mx <= mn) { *s_out = 0.0f; *m_out = -mn; return; }
    double best_s = (mx - mn) / nmax, best_b = mn, s, b;
    double best_err = err_asym(x, n, nmax, best_s, best_b);
    for (int k = -8; k <= 8; k++) {
        const double s0 = (mx - mn) / (nmax + 0.1 * k);
        for (int half_up = 0; half_up < (k % 4 == 0 ? 2 : 1); half_up++) {
            if (!ls_asym(x, n, nmax, s0, mn + 0.5 * half_up * s0, &s, &b)) continue;
            const double err = err_asym(x, n, nmax, s, b);
            if (err < best_err) { best_err = err; best_s = s; best_b = b; }
        }
    }
    for (int it = 0; it < 4 && ls_asym(x, n, nmax, best_s, best_b, &s, &b); it++) {
        const double err = err_asym(x, n, nmax, s, b);
        if (!(err < best_err)) break;
        best_err = err; best_s = s; best_b = b;
    }
    *s_out = (float)best_s;
    *m_out = (float)-best_b;
}

/* Symmetric fit: x ~= s*q with q in [-nneg, nneg - 1]. s is signed: mapping the
 * largest-magnitude element to -nneg uses the extra negative code. */
static float fit_sym(const float *x, int n, int nneg) {
    const float max = signed_absmax(x, n);
    if (max == 0.0f) return 0.0f;
    float best_s = max / -nneg, best_err = INFINITY;
    for (int k = -10; k <= 10; k++) {
        const float iscale = -(nneg + 0.1f * k) / max;
        double sqq = 0, sqx = 0;
        for (int j = 0; j < n; j++) {
            const int q = qround(iscale * x[j], -nneg, nneg - 1);
            sqq += (double)q * q; sqx += (double)q * x[j];
        }
        if (sqq == 0) continue;
        const double s = sqx / sqq;
        const float inv = (float)(1.0 / s);
        double err = 0;
        for (int j = 0; j < n; j++) {
            const int q = qround(x[j] * inv, -nneg, nneg - 1);
            const double e = s * q - x[j];
            err += e * e;
        }
        if (err < best_err) { best_err = (float)err; best_s = (float)s; }
    }
    return best_s;
}

/* Asymmetric k-quant super-block: n_sub sub-blocks of sub_n values, codes in
 * [0, nmax], sub-block scales and mins quantized to [0, smax] against d and dmin.
 * Fills q (QK_K codes), sc[], mq[] and returns d and dmin as stored (f16). */
static void kquant_asym(const float *x, int n_sub, int sub_n, int nmax, int smax,
                        uint8_t *q, uint8_t *sc, uint8_t *mq, gb_half *d_out, gb_half *dmin_out) {
    float s[16], m[16], max_s = 0.0f, max_m = 0.0f;
    for (int j = 0; j < n_sub; j++) {
        fit_asym(x + j * sub_n, sub_n, nmax, &s[j], &m[j]);
        max_s = fmaxf(max_s, s[j]);
        max_m = fmaxf(max_m, m[j]);
    }
    const gb_half dh = f32_to_f16(max_s / smax), dminh = f32_to_f16(max_m / smax);
    const float d = half(dh), dmin = half(dminh);
    for (int j = 0; j < n_sub; j++) {
        /* The 4/6-bit sub-block scale and min are coarse when one sub-block has a
         * much larger range than the others: try the neighbours of the rounded
         * values too and keep the pair that decodes with the least error. */
        const float *xs = x + j * sub_n;
        const int sc0 = d > 0.0f ? qround(s[j] / d, 0, smax + 1) : 0, m0 = dmin > 0.0f ? qround(m[j] / dmin, 0, smax + 1) : 0;
        double best_err = INFINITY;
        sc[j] = mq[j] = 0;
        for (int a = sc0 - 1; a <= sc0 + 1; a++) {
            if (a < 0 || a > smax || (a > 0 && d <= 0.0f)) continue;
            for (int c = m0 - 1; c <= m0 + 1; c++) {
                if (c < 0 || c > smax || (c > 0 && dmin <= 0.0f)) continue;
                const float ds = d * a, dm = dmin * c, ids = ds > 0.0f ? 1.0f / ds : 0.0f;
                double err = 0;
                for (int l = 0; l < sub_n; l++) {
                    const int qv = qround((xs[l] + dm) * ids, 0, nmax);
                    const double e = (double)(ds * qv - dm) - xs[l];
                    err += e * e;
                }
                if (err < best_err) { best_err = err; sc[j] = (uint8_t)a; mq[j] = (uint8_t)c; }
            }
        }
        const float ds = d * sc[j], dm = dmin * mq[j], ids = ds > 0.0f ? 1.0f / ds : 0.0f;
        for (int l = 0; l < sub_n; l++) q[j * sub_n + l] = (uint8_t)qround((xs[l] + dm) * ids, 0, nmax);
    }
    *d_out = dh;
    *dmin_out = dminh;
}

/* Symmetric k-quant super-block of 16 sub-blocks of 16: codes in [-nneg, nneg-1],
 * returned biased by +nneg; sub-block scales in [-sneg, sneg-1]. Returns d (f16). */
static gb_half kquant_sym(const float *x, int nneg, int sneg, uint8_t *q, int8_t *sc) {
    float s[16];
    for (int j = 0; j < 16; j++) s[j] = fit_sym(x + 16 * j, 16, nneg);
    const float smax_signed = signed_absmax(s, 16);
    const gb_half dh = f32_to_f16(smax_signed / -sneg);
    const float d = half(dh);
    for (int j = 0; j < 16; j++) {
        /* as in kquant_asym: the rounded sub-block scale or a neighbour */
        const float *xs = x + 16 * j;
        const int sc0 = d != 0.0f ? qround(s[j] / d, -sneg - 1, sneg) : 0;
        double best_err = INFINITY;
        sc[j] = 0;
        for (int a = sc0 - 1; a <= sc0 + 1; a++) {
            if (a < -sneg || a > sneg - 1 || (a != 0 && d == 0.0f)) continue;
            const float ds = d * a, ids = ds != 0.0f ? 1.0f / ds : 0.0f;
            double err = 0;
            for (int l = 0; l < 16; l++) {
                const int qv = qround(xs[l] * ids, -nneg, nneg - 1);
                const double e = (double)(ds * qv) - xs[l];
                err += e * e;
            }
            if (err < best_err) { best_err = err; sc[j] = (int8_t)a; }
        }
        const float ds = d * sc[j], ids = ds != 0.0f ? 1.0f / ds : 0.0f;
        for (int l = 0; l < 16; l++) q[16 * j + l] = (uint8_t)(qround(xs[l] * ids, -nneg, nneg - 1) + nneg);
    }
    return dh;
}

void quantize_row_q2_K_ref(const float *x, void *blocks, int64_t n) {
    GB_ASSERT(n % QK_K == 0);
    block_q2_K *b = blocks;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        uint8_t q[QK_K], sc[16], mq[16];
        kquant_asym(x, 16, 16, 3, 15, q, sc, mq, &b[i].d, &b[i].dmin);
        for (int j = 0; j < 16; j++) b[i].scales[j] = (uint8_t)(sc[j] | mq[j] << 4);
        memset(b[i].qs, 0, sizeof b[i].qs);
        for (int e = 0; e < QK_K; e++) {
            const int h = e / 128, k = (e % 128) / 32, l = e % 32;
            b[i].qs[h * 32 + l] |= (uint8_t)(q[e] << (2 * k));
        }
    }
}

void quantize_row_q3_K_ref(const float *x, void *blocks, int64_t n) {
    GB_ASSERT(n % QK_K == 0);
    block_q3_K *b = blocks;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        uint8_t q[QK_K];
        int8_t sc[16];
        b[i].d = kquant_sym(x, 4, 32, q, sc);
        memset(b[i].scales, 0, sizeof b[i].scales);
        for (int j = 0; j < 16; j++) {
            const int v = sc[j] + 32;
            b[i].scales[j % 8] |= (uint8_t)((v & 0x0f) << (j < 8 ? 0 : 4));
            b[i].scales[8 + j % 4] |= (uint8_t)((v >> 4) << (2 * (j / 4)));
        }
        memset(b[i].qs, 0, sizeof b[i].qs);
        memset(b[i].hmask, 0, sizeof b[i].hmask);
        for (int e = 0; e < QK_K; e++) {
            const int h = e / 128, k = (e % 128) / 32, l = e % 32;
            b[i].qs[h * 32 + l] |= (uint8_t)((q[e] & 3) << (2 * k));
            b[i].hmask[l] |= (uint8_t)((q[e] >> 2) << (4 * h + k));
        }
    }
}

/* Pack 8 six-bit scales and mins into the 12 bytes k4_scale_min reads. */
static void k4_pack_scales(const uint8_t *sc, const uint8_t *m, uint8_t *out) {
    for (int j = 0; j < 4; j++) {
        out[j] = (uint8_t)((sc[j] & 63) | (sc[j + 4] >> 4) << 6);
        out[j + 4] = (uint8_t)((m[j] & 63) | (m[j + 4] >> 4) << 6);
        out[j + 8] = (uint8_t)((sc[j + 4] & 0x0f) | (m[j + 4] & 0x0f) << 4);
    }
}

void quantize_row_q4_K_ref(const float *x, void *blocks, int64_t n) {
    GB_ASSERT(n % QK_K == 0);
    block_q4_K *b = blocks;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        uint8_t q[QK_K], sc[8], mq[8];
        kquant_asym(x, 8, 32, 15, 63, q, sc, mq, &b[i].d, &b[i].dmin);
        k4_pack_scales(sc, mq, b[i].scales);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                b[i].qs[32 * c + l] = (uint8_t)(q[64 * c + l] | q[64 * c + 32 + l] << 4);
    }
}

void quantize_row_q5_K_ref(const float *x, void *blocks, int64_t n) {
    GB_ASSERT(n % QK_K == 0);
    block_q5_K *b = blocks;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        uint8_t q[QK_K], sc[8], mq[8];
        kquant_asym(x, 8, 32, 31, 63, q, sc, mq, &b[i].d, &b[i].dmin);
        k4_pack_scales(sc, mq, b[i].scales);
        memset(b[i].qh, 0, sizeof b[i].qh);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                const int q0 = q[64 * c + l], q1 = q[64 * c + 32 + l];
                b[i].qs[32 * c + l] = (uint8_t)((q0 & 0x0f) | (q1 & 0x0f) << 4);
                b[i].qh[l] |= (uint8_t)((q0 >> 4) << (2 * c) | (q1 >> 4) << (2 * c + 1));
            }
    }
}

void quantize_row_q6_K_ref(const float *x, void *blocks, int64_t n) {
    GB_ASSERT(n % QK_K == 0);
    block_q6_K *b = blocks;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        uint8_t q[QK_K];
        b[i].d = kquant_sym(x, 32, 128, q, b[i].scales);
        memset(b[i].ql, 0, sizeof b[i].ql);
        memset(b[i].qh, 0, sizeof b[i].qh);
        for (int e = 0; e < QK_K; e++) {
            const int h = e / 128, k = (e % 128) / 32, l = e % 32;
            const int idx = h * 64 + l + 32 * (k & 1);
            b[i].ql[idx] |= (uint8_t)((q[e] & 0x0f) << (k < 2 ? 0 : 4));
            b[i].qh[h * 32 + l] |= (uint8_t)((q[e] >> 4) << (2 * k));
        }
    }
}

/* ------------------------------------------------------------------- table */

struct gb_quant_fns quant_fns(enum gb_type t) {
    struct gb_quant_fns f = {0};
    switch (t) {
    case GB_TYPE_Q8_0: f.to_float = dequantize_row_q8_0; f.from_float = quantize_row_q8_0_ref; break;
    case GB_TYPE_Q4_0: f.to_float = dequantize_row_q4_0; f.from_float = quantize_row_q4_0_ref; break;
    case GB_TYPE_Q4_1: f.to_float = dequantize_row_q4_1; f.from_float = quantize_row_q4_1_ref; break;
    case GB_TYPE_Q5_0: f.to_float = dequantize_row_q5_0; f.from_float = quantize_row_q5_0_ref; break;
    case GB_TYPE_Q5_1: f.to_float = dequantize_row_q5_1; f.from_float = quantize_row_q5_1_ref; break;
    case GB_TYPE_Q2_K: f.to_float = dequantize_row_q2_K; f.from_float = quantize_row_q2_K_ref; break;
    case GB_TYPE_Q3_K: f.to_float = dequantize_row_q3_K; f.from_float = quantize_row_q3_K_ref; break;
    case GB_TYPE_Q4_K: f.to_float = dequantize_row_q4_K; f.from_float = quantize_row_q4_K_ref; break;
    case GB_TYPE_Q5_K: f.to_float = dequantize_row_q5_K; f.from_float = quantize_row_q5_K_ref; break;
    case GB_TYPE_Q6_K: f.to_float = dequantize_row_q6_K; f.from_float = quantize_row_q6_K_ref; break;
    case GB_TYPE_Q8_K: f.to_float = dequantize_row_q8_K; f.from_float = quantize_row_q8_K_ref; break;
    default: break;
    }
    return f;
}

/* --------------------------------------------------------------- MLX affine */

static inline void sb_store(enum gb_type t, void *p, int64_t i, float v) {
    switch (t) {
    case GB_TYPE_F32: ((float *)p)[i] = v; return;
    case GB_TYPE_F16: ((uint16_t *)p)[i] = f32_to_f16(v); return;
    case GB_TYPE_BF16: ((uint16_t *)p)[i] = f32_to_bf16(v); return;
    default: GB_ASSERT(!"MLX scales/biases must be F32, F16 or BF16");
    }
}

static void mlx_check(int bits, int group_size, int64_t n) {
    GB_ASSERT(bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8);
    GB_ASSERT(group_size == 32 || group_size == 64 || group_size == 128);
    GB_ASSERT(n % group_size == 0);
}

/* Code c of the row's little-endian bit stream. */
static inline unsigned mlx_code(const uint32_t *w, int64_t c, int bits) {
    const int64_t bit = c * bits;
    const int64_t k = bit / 32;
    const int off = (int)(bit % 32);
    uint64_t v = w[k] >> off;
    if (off + bits > 32) v |= (uint64_t)w[k + 1] << (32 - off);
    return (unsigned)(v & ((1u << bits) - 1u));
}

void dequantize_row_mlx(const uint32_t *words, const void *scales, const void *biases,
                        enum gb_type sb_type, int bits, int group_size, float *y, int64_t n) {
    mlx_check(bits, group_size, n);
    for (int64_t g = 0; g < n / group_size; g++) {
        const float s = mlx_sb_value(sb_type, scales, (size_t)g), b = mlx_sb_value(sb_type, biases, (size_t)g);
        for (int64_t c = g * group_size; c < (g + 1) * group_size; c++)
            y[c] = s * (float)mlx_code(words, c, bits) + b;
    }
}

/* Follows MLX's Metal kernel `affine_quantize` (mlx/backend/metal/kernels/
 * quantized.h), which is what produced most mlx-community checkpoints:
 *   w_max = max(0, max of the group)   (the kernel starts its max at 0)
 *   w_min = min of the group
 *   scale = max((w_max - w_min) / (2^bits - 1), 1e-7), negated unless |w_min| > |w_max|
 *   edge  = the extreme of larger magnitude; q0 = round(edge / scale)
 *   if q0 != 0: scale = edge / q0, bias = edge   (the edge, and zero, land exactly on codes)
 *   else:       bias = 0
 *   q = min(round((w - bias) / scale), 2^bits - 1)    round = half away from zero
 * So the scale is negative (codes count down from the max) when the max is the
 * larger edge. MLX's CPU quantizer differs only in ties (rint, half to even) and in
 * starting w_max at -inf instead of 0 (groups of all-negative values). Codes are
 * computed from the f32 scale and bias, which are then stored rounded to sb_type,
 * as MLX does. */
void quantize_row_mlx_ref(const float *x, uint32_t *words, void *scales, void *biases,
                          enum gb_type sb_type, int bits, int group_size, int64_t n) {
    mlx_check(bits, group_size, n);
    const float n_bins = (float)((1 << bits) - 1), eps = 1e-7f;
    memset(words, 0, (size_t)(n * bits / 32) * sizeof *words);
    for (int64_t g = 0; g < n / group_size; g++) {
        const float *xg = x + g * group_size;
        float w_min = FLT_MAX, w_max = 0.0f;
        for (int j = 0; j < group_size; j++) { w_max = fmaxf(w_max, xg[j]); w_min = fminf(w_min, xg[j]); }
        const int side = fabsf(w_min) > fabsf(w_max);
        float scale = fmaxf((w_max - w_min) / n_bins, eps);
        scale = side ? scale : -scale;
        const float edge = side ? w_min : w_max;
        const float q0 = roundf(edge / scale);
        float bias = 0.0f;
        if (q0 != 0.0f) { scale = edge / q0; bias = edge; }
        for (int j = 0; j < group_size; j++) {
            float q = roundf((xg[j] - bias) / scale);
            q = fminf(fmaxf(q, 0.0f), n_bins);
            const int64_t bit = (g * group_size + j) * bits;
            const uint64_t v = (uint64_t)q << (bit % 32);
            words[bit / 32] |= (uint32_t)v;
            if (bit % 32 + bits > 32) words[bit / 32 + 1] |= (uint32_t)(v >> 32);
        }
        sb_store(sb_type, scales, g, scale);
        sb_store(sb_type, biases, g, bias);
    }
}
