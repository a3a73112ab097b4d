/* Reference (scalar) conversions between f32 and the quantized weight formats:
 * the GGML block types of quant.h and MLX affine quantization. These are the spec
 * and the test oracle; the fast kernels must agree with them.
 *
 * Every row function takes n elements, n a multiple of the type's block size
 * (32 for Q4_0/Q4_1/Q5_0/Q5_1/Q8_0, QK_K = 256 for the k-quants; checked); blocks
 * are read or written contiguously, n / block_size of them. Dequantizers
 * reproduce ggml's dequantize_row_* (same f32 operations in the same order).
 * Quantizers produce valid blocks with small error for any finite input (NaN
 * gives valid codes, not UB); Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and Q8_K follow ggml's
 * reference quantizers (Q8_K rounds ties up where ggml rounds them to even), the
 * k-quants use a least-squares scale/min search of our own (see quant_ref.c):
 * not bit-identical to ggml's, error bounds in tests/test_quant.c. */
#ifndef GB_QUANT_REF_H
#define GB_QUANT_REF_H

#include "base/fp16.h"
#include "base/status.h"
#include "tensor/dtype.h"
#include "tensor/quant.h"

#include <stddef.h>
#include <stdint.h>

void dequantize_row_q8_0(const void *blocks, float *y, int64_t n);
void dequantize_row_q4_0(const void *blocks, float *y, int64_t n);
void dequantize_row_q4_1(const void *blocks, float *y, int64_t n);
void dequantize_row_q5_0(const void *blocks, float *y, int64_t n);
void dequantize_row_q5_1(const void *blocks, float *y, int64_t n);
void dequantize_row_q2_K(const void *blocks, float *y, int64_t n);
void dequantize_row_q3_K(const void *blocks, float *y, int64_t n);
void dequantize_row_q4_K(const void *blocks, float *y, int64_t n);
void dequantize_row_q5_K(const void *blocks, float *y, int64_t n);
void dequantize_row_q6_K(const void *blocks, float *y, int64_t n);
void dequantize_row_q8_K(const void *blocks, float *y, int64_t n);

void quantize_row_q8_0_ref(const float *x, void *blocks, int64_t n);
void quantize_row_q4_0_ref(const float *x, void *blocks, int64_t n);
void quantize_row_q4_1_ref(const float *x, void *blocks, int64_t n);
void quantize_row_q5_0_ref(const float *x, void *blocks, int64_t n);
void quantize_row_q5_1_ref(const float *x, void *blocks, int64_t n);
void quantize_row_q2_K_ref(const float *x, void *blocks, int64_t n);
void quantize_row_q3_K_ref(const float *x, void *blocks, int64_t n);
void quantize_row_q4_K_ref(const float *x, void *blocks, int64_t n);
void quantize_row_q5_K_ref(const float *x, void *blocks, int64_t n);
void quantize_row_q6_K_ref(const float *x, void *blocks, int64_t n);
/* Q8_K is the activation format of the k-quant dot products: d = max|x| / -127 with
 * the sign of the largest-magnitude element (as ggml), qs = round(x / d) clamped to
 * 127, bsums[j] = sum of qs over the j-th group of 16. */
void quantize_row_q8_K_ref(const float *x, void *blocks, int64_t n);

typedef void (*gb_to_float_fn)(const void *blocks, float *y, int64_t n);
typedef void (*gb_from_float_fn)(const float *x, void *blocks, int64_t n);
struct gb_quant_fns {
    gb_to_float_fn to_float;     /* NULL for types that are not GGML block types */
    gb_from_float_fn from_float; /* NULL where no quantizer exists */
};
/* The row functions of t; both NULL for plain types. */
struct gb_quant_fns quant_fns(enum gb_type t);

/* ---- MLX affine quantization (mlx.core.quantize, mode "affine") ----
 * A row of n elements is stored as n * bits / 32 u32 words (bits 2, 3, 4, 5, 6, 8;
 * mlx-community checkpoints use 4 and 8, sometimes 2, 3, 6). The codes of a row form
 * one little-endian bit stream: code c occupies bits [c*bits, (c+1)*bits) of the
 * stream, where word k holds stream bits [32k, 32k+32). For bits 2, 4, 8 each word
 * holds 32/bits whole codes, low bits first; for bits 3, 5, 6 a code may straddle
 * two words (3 bits: 32 codes in 3 words; 5 bits: 32 in 5; 6 bits: 16 in 3) -- MLX
 * writes these as packs of 3 (or 5) bytes, each a little-endian bit string, which
 * is the same stream. Group g of group_size codes has one scale
 * and one bias (type sb_type: F32, F16 or BF16): w = scale * q + bias.
 * n must be a multiple of group_size and of 32 (group_size in {32, 64, 128}). */
void dequantize_row_mlx(const uint32_t *words, const void *scales, const void *biases,
                        enum gb_type sb_type, int bits, int group_size, float *y, int64_t n);
/* Element i of an MLX scales or biases array of type t (F32, F16 or BF16). */
static inline float mlx_sb_value(enum gb_type t, const void *p, size_t i) {
    switch (t) {
    case GB_TYPE_F32: return ((const float *)p)[i];
    case GB_TYPE_F16: return f16_to_f32(((const uint16_t *)p)[i]);
    case GB_TYPE_BF16: return bf16_to_f32(((const uint16_t *)p)[i]);
    default: GB_ASSERT(!"MLX scales/biases must be F32, F16 or BF16"); return 0.0f;
    }
}
/* The inverse, as MLX's affine quantizer (its Metal kernel) does it: per group,
 * scale = (max(0, w_max) - w_min) / (2^bits - 1) (at least 1e-7), then adjusted so
 * the edge of larger magnitude (and zero) fall exactly on codes; bias = that edge;
 * q = round((w - bias) / scale) clamped to [0, 2^bits - 1]; details in quant_ref.c.
 * The scale comes out negative when the max is the larger edge. scales and biases
 * are written in sb_type. bits in {2, 3, 4, 5, 6, 8}. Error: within one step
 * (w_max - w_min) / (2^bits - 1) of the input, plus the rounding of scale and bias
 * to sb_type. */
void quantize_row_mlx_ref(const float *x, uint32_t *words, void *scales, void *biases,
                          enum gb_type sb_type, int bits, int group_size, int64_t n);

#endif
