/* AVX512-VNNI kernels for quantized weights (qmatmul_vnni.c, 256-bit vectors with
 * AVX512VL; functions compiled for that target, the rest of the build is not).
 * Private to qmatmul.c, which calls them only when qmatmul_has_vnni().
 *
 * Same row-kernel contract as qmatmul_avx2.h, and the same results bit for bit: the
 * integer block sums are exact either way and the f32 arithmetic is the AVX2
 * kernels' own, in the same order. */
#ifndef GB_CPU_QMATMUL_VNNI_H
#define GB_CPU_QMATMUL_VNNI_H

#include <stddef.h>

/* 1 when the CPU has AVX2/FMA/F16C, AVX512-VNNI and AVX512VL (and the OS saves the
 * state) and the VNNI kernels are not switched off by qmatmul_disable_vnni. */
int qmatmul_has_vnni(void);
/* on != 0: use the AVX2 kernels even where VNNI is there (tests, benchmarks). */
void qmatmul_disable_vnni(int on);

void qdot_q4_K_vnni(int n, const void *row, const void *xq, size_t xs, int nt, float *y, size_t ldy);
void qdot_q5_K_vnni(int n, const void *row, const void *xq, size_t xs, int nt, float *y, size_t ldy);
void qdot_q6_K_vnni(int n, const void *row, const void *xq, size_t xs, int nt, float *y, size_t ldy);
void qdot_q8_0_vnni(int n, const void *row, const void *xq, size_t xs, int nt, float *y, size_t ldy);

#endif
