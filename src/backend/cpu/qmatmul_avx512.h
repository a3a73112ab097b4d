/* AVX-512 (512-bit) kernels for MLX affine 4- and 8-bit weights and for Q8_0
 * (qmatmul_avx512.c) and for Q4_K/Q5_K/Q6_K (qmatmul_kquant_avx512.c); compiled with
 * -mavx512f/bw/vl/vnni; qmatmul.c calls them only when qmatmul_has_avx512().
 *
 * Activations: x quantized to 16 bits per block of 32 elements (x ~ d_b q, the same
 * numbers as qmatmul.c's struct qx16), stored per chunk of 128 elements in the order
 * the kernels unpack the codes (see qmatmul_avx512.c), with the block steps spread
 * over the 16 int32 lanes of a vpdpwssd sum. Each weight row's value is one exact
 * integer sum per chunk and lane, scaled by d_b and the group's scale, plus
 * sum_g bias_g xsum_g; its arithmetic depends neither on how many rows or tokens a
 * call takes nor on the thread split. */
#ifndef GB_CPU_QMATMUL_AVX512_H
#define GB_CPU_QMATMUL_AVX512_H

#include "tensor/dtype.h"

#include <stddef.h>
#include <stdint.h>

/* 128 elements of one token. 4-bit: qs[32 j + k] = x[4 k + j], dv[m] = step of the
 * block holding elements 8m..8m+7 (m < 16). 8-bit: qs[64 h + 32 j + k] =
 * x[64 h + 2 k + j], dv[16 h + m] = step of the block holding 64h + 4m..4m+3. */
struct qx128 {
    int16_t qs[128];
    float dv[32];
};

/* 1 when the CPU has AVX-512 F/BW/VL/VNNI (and AVX2) and qmatmul_disable_avx512 is off
 * (also the check for attn_avx512.c). */
int qmatmul_has_avx512(void);
/* on != 0: use the AVX2/VNNI kernels and attention even where AVX-512 is there (tests,
 * benchmarks). */
void qmatmul_disable_avx512(int on);

/* x (n elements, n % 128 == 0) to n / 128 chunks for `bits` (4 or 8); gsum[g] = sum
 * over the blocks of group g (gs elements) of d_b sum(q_b). */
void mlx_quant_x_avx512(const float *x, int n, int bits, int gs, struct qx128 *out, float *gsum);

/* nr (1..4) consecutive rows: codes of row r at codes + r * rb, its n / gs scales and
 * biases (type sbt) at sc + r * sbr, bi + r * sbr bytes; nt tokens of x (xs bytes
 * apart) with group sums gsum (gstr floats apart); y[u * ldy + r]. gs in {32, 64,
 * 128}, n % 128 == 0. */
void mlxdot4_avx512(int n, int gs, int nr, const uint8_t *codes, size_t rb, const void *sc, const void *bi,
                    size_t sbr, enum gb_type sbt, const void *xq, size_t xs, const float *gsum, size_t gstr, int nt,
                    float *y, size_t ldy);
void mlxdot8_avx512(int n, int gs, int nr, const uint8_t *codes, size_t rb, const void *sc, const void *bi,
                    size_t sbr, enum gb_type sbt, const void *xq, size_t xs, const float *gsum, size_t gstr, int nt,
                    float *y, size_t ldy);

/* 4-bit rows packed at load (tensor/weight.h mlx4_packed_word: per set of 16 blocks of 32
 * elements, chunk j = word j of each block; rows in quads). x of one token per set of 512
 * elements: q[j] the bytes of chunk j: the high bytes (signed) of the blocks' even
 * elements, of their odd ones, then the low bytes (unsigned) of each, 64 each, lane m =
 * block m; dv[m] block m's step (the same steps and 16-bit codes as mlx_quant_x_avx512;
 * blocks past n zero). */
struct qx512 {
    uint8_t q[4][256];
    float dv[16];
};
void mlx_quant_x4p_avx512(const float *x, int n, int gs, struct qx512 *out, float *gsum);
/* Rows o .. o + nr - 1 of a packed weight of n_out rows (codes, scales and biases: the
 * weight's row 0; rows rb and sbr bytes apart) against nt tokens (xs bytes apart, group
 * sums gstr floats apart): y[u * ldy + r - o]. Each (row, token) value is computed by the
 * same operations whatever o, nr and nt are. gs in {32, 64, 128}, n % 128 == 0. */
void mlxdot4p_avx512(int n, int gs, int64_t n_out, const uint8_t *codes, size_t rb, const void *sc, const void *bi,
                     size_t sbr, enum gb_type sbt, int o, int nr, const struct qx512 *xq, size_t xs, const float *gsum,
                     size_t gstr, int nt, float *y, size_t ldy);

/* Q8_0 rows against x quantized to 8-bit blocks of 32 (d = max|x| / 127, as struct
 * qx8), two blocks per struct qx64: qs the codes, negc[m] = -128 * (sum of qs[4m..4m+3]),
 * dv[m] the step of block m / 8 (0 past an odd last block). */
struct qx64 {
    int8_t qs[64];
    int32_t negc[16];
    float dv[16];
};
void q8_quant_x_avx512(const float *x, int n, struct qx64 *out);
/* nr (1..4; any with one token) Q8_0 rows rb bytes apart (row r: y[u * ldy + r]) against
 * nt tokens of x, xs bytes apart; each (row, token) value computed by the same operations
 * whatever nr and nt are. */
void qrows_q8_0_avx512(int n, int nr, const void *row0, size_t rb, const void *xq, size_t xs, int nt, float *y,
                       size_t ldy);

/* Q4_K, Q5_K, Q6_K (qmatmul_kquant_avx512.c). x per super-block of 256 elements, the
 * codes of qmatmul.c's Q8_K (d = max|x| / 127): qs in natural order (q4order 0, for
 * Q6_K) or with the middle two 32-element quarters of every 128 swapped (q4order 1, for
 * Q4_K/Q5_K: the order a 64-byte load of nibbles unpacks); bsums[g] the sum of
 * elements 16g..16g+15, bsum32[s] of 32s..32s+31 (natural indices). Arrays of it must
 * be 64-byte aligned (the kernels use aligned loads). */
struct qxk {
    int8_t qs[256];
    int16_t bsums[16];
    int16_t bsum32[8];
    float d;
    uint8_t pad[12];
};
void qk_quant_x_avx512(const float *x, int n, int q4order, struct qxk *out);
/* nr (any) rows rb bytes apart (row r: y[u * ldy + r]) against nt tokens of x (xs
 * bytes apart, q4order 1 for Q4_K/Q5_K, 0 for Q6_K); each (row, token) value computed
 * by the same operations whatever nr and nt are. */
void qrows_q4_K_avx512(int n, int nr, const void *row0, size_t rb, const void *xq, size_t xs, int nt, float *y,
                       size_t ldy);
void qrows_q5_K_avx512(int n, int nr, const void *row0, size_t rb, const void *xq, size_t xs, int nt, float *y,
                       size_t ldy);
void qrows_q6_K_avx512(int n, int nr, const void *row0, size_t rb, const void *xq, size_t xs, int nt, float *y,
                       size_t ldy);

#endif
