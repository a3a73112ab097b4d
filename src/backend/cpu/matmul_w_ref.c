/* The oracle for matmul_w: any weight format, one row at a time, in double. */
#include "backend/cpu/kernels.h"
#include "base/status.h"
#include "backend/cpu/mlx_packed.h"

#include <stdlib.h>

void matmul_w_ref(float *y, const float *x, const struct gb_weight *w, int n_tok) {
    const int64_t n_in = w->n_in, n_out = w->n_out;
    float *row = malloc((size_t)n_in * sizeof *row);
    GB_ASSERT(row != NULL);
    for (int64_t o = 0; o < n_out; o++) {
        cpu_weight_row(w, o, row);
        for (int t = 0; t < n_tok; t++) {
            const float *xt = x + (size_t)t * (size_t)n_in;
            double acc = 0.0;
            for (int64_t i = 0; i < n_in; i++) acc += (double)xt[i] * row[i];
            y[(size_t)t * (size_t)n_out + (size_t)o] = (float)acc;
        }
    }
    free(row);
}
