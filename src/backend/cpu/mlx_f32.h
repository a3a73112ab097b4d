/* MLX affine matmul with f32 activations: exact up to f32 summation order, unlike
 * the 8-bit activation blocks of backend/cpu/qmatmul.c. dot(w, x) over a group is
 * s * (q . x) + b * sum(x): codes are widened to f32 in registers; sum(x) per group is
 * computed once per call into work. */
#ifndef GB_MLX_F32_H
#define GB_MLX_F32_H

#include "base/threadpool.h"
#include "tensor/weight.h"

#include <stddef.h>

size_t mlx_f32_work_size(const struct gb_weight *w, int n_tok);
void mlx_f32_matmul(threadpool_t *tp, float *y, const float *x, const struct gb_weight *w, int n_tok, void *work);

/* One row o against tokens [t0, t1): y[t][o]; used by the threaded driver. gsum: the
 * per-group sums of x, [n_tok][n_in / group_size]. */
void mlx_f32_row_generic(const struct gb_weight *w, int o, const float *x, const float *gsum, int t0, int t1,
                         float *y);
void mlx_f32_row_avx2(const struct gb_weight *w, int o, const float *x, const float *gsum, int t0, int t1,
                      float *y);

#endif
