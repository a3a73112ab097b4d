/* AVX2 + FMA + F16C kernels (kernels_avx2.c, compiled with -mavx2 -mfma -mf16c).
 * Private to the CPU backend: call only after kernels.c has checked the CPU. Same
 * contracts as the plain names in kernels.h; no alignment is assumed beyond each
 * element's natural one (weights may sit at any 2-byte offset of an mmap). */
#ifndef GB_CPU_KERNELS_AVX2_H
#define GB_CPU_KERNELS_AVX2_H

#include "tensor/dtype.h"

#include <stdint.h>

/* matmul for output columns o in [o_lo, o_hi) only (y, x, w laid out as in matmul).
 * Each y element's summation order depends on n_in and on the method alone (the decode
 * kernel for one token or per_token, else the prefill tiles), never on o_lo/o_hi or
 * n_tok, so any split of the columns over threads gives bit-identical results. */
void matmul_rows_avx2(float *y, const float *x, const void *w, enum gb_type wtype,
                      int n_tok, int n_in, int n_out, int o_lo, int o_hi, int per_token);

float dot_f32_avx2(const float *a, const float *b, int n);
float dot_f32_f16_avx2(const float *a, const uint16_t *b, int n);
void axpy_f32_avx2(float *y, float a, const float *v, int n);
void axpy_f16_avx2(float *y, float a, const uint16_t *v, int n);
void gelu_tanh_mul_avx2(float *y, const float *g, const float *u, long n);
void silu_mul_avx2(float *y, const float *g, const float *u, long n);
void f32_to_f16_row_avx2(uint16_t *y, const float *x, long n);
double sumsq_f32_avx2(const float *x, int n);
void softcap_avx2(float *x, float cap, long n);

#endif
