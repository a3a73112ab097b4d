#include "backend/cpu/mlx_f32.h"
#include "backend/cpu/kernels.h"
#include "base/fp16.h"
#include "base/status.h"

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

static float sb_value(enum gb_type t, const void *p, size_t i) {
    switch (t) {
    case GB_TYPE_F32: return ((const float *)p)[i];
    case GB_TYPE_F16: return f16_to_f32(((const uint16_t *)p)[i]);
    default: return bf16_to_f32(((const uint16_t *)p)[i]);
    }
}

/* Code c of a row: a little-endian bit stream of bits-wide codes. */
static inline unsigned mlx_code(const uint8_t *row, int bits, size_t c) {
    size_t bit = c * (size_t)bits;
    unsigned v = row[bit >> 3];
    if ((bit & 7) + (size_t)bits > 8) v |= (unsigned)row[(bit >> 3) + 1] << 8;
    return (v >> (bit & 7)) & ((1u << bits) - 1u);
}

void mlx_f32_row_generic(const struct gb_weight *w, int o, const float *x, const float *gsum, int t0, int t1,
                         float *y) {
    const int n = (int)w->n_in, gs = w->group_size, ng = n / gs;
    const uint8_t *row = (const uint8_t *)w->data + (size_t)o * w->row_bytes;
    for (int t = t0; t < t1; t++) {
        const float *xt = x + (size_t)t * n;
        float acc = 0.0f;
        for (int g = 0; g < ng; g++) {
            float qx = 0.0f;
            for (int i = g * gs; i < (g + 1) * gs; i++) qx += (float)mlx_code(row, w->bits, (size_t)i) * xt[i];
            size_t k = (size_t)o * (size_t)ng + (size_t)g;
            acc += sb_value(w->sb_type, w->scales, k) * qx + sb_value(w->sb_type, w->biases, k) * gsum[(size_t)t * ng + g];
        }
        y[(size_t)t * w->n_out + o] = acc;
    }
}

struct mlx_job {
    const struct gb_weight *w;
    const float *x;
    float *gsum;
    float *y;
    int n_tok;
    int fast;
    _Atomic int next;
};

enum { ROWS_PER_CHUNK = 8 };

static void gsum_worker(void *ctx, int ith, int nth) {
    struct mlx_job *j = ctx;
    const int n = (int)j->w->n_in, gs = j->w->group_size, ng = n / gs;
    long lo, hi;
    tp_range((long)j->n_tok * ng, ith, nth, &lo, &hi);
    for (long k = lo; k < hi; k++) {
        const float *xt = j->x + (size_t)(k / ng) * n + (size_t)(k % ng) * gs;
        float s = 0.0f;
        for (int i = 0; i < gs; i++) s += xt[i];
        j->gsum[k] = s;
    }
}

static void rows_worker(void *ctx, int ith, int nth) {
    struct mlx_job *j = ctx;
    (void)ith;
    (void)nth;
    const int n_out = (int)j->w->n_out;
    for (;;) {
        int c = atomic_fetch_add(&j->next, 1);
        int o0 = c * ROWS_PER_CHUNK;
        if (o0 >= n_out) break;
        int o1 = o0 + ROWS_PER_CHUNK < n_out ? o0 + ROWS_PER_CHUNK : n_out;
        for (int o = o0; o < o1; o++) {
#ifdef GERBIL_HAVE_X86
            if (j->fast) { mlx_f32_row_avx2(j->w, o, j->x, j->gsum, 0, j->n_tok, j->y); continue; }
#endif
            mlx_f32_row_generic(j->w, o, j->x, j->gsum, 0, j->n_tok, j->y);
        }
    }
}

size_t mlx_f32_work_size(const struct gb_weight *w, int n_tok) {
    return (size_t)n_tok * (size_t)(w->n_in / w->group_size) * sizeof(float);
}

void mlx_f32_matmul(threadpool_t *tp, float *y, const float *x, const struct gb_weight *w, int n_tok, void *work) {
    GB_ASSERT(w->kind == GB_WEIGHT_MLX && w->n_in % w->group_size == 0);
    struct mlx_job j = {.w = w, .x = x, .gsum = work, .y = y, .n_tok = n_tok};
    /* the AVX2 kernel handles 4- and 8-bit codes in groups of a multiple of 32 */
    j.fast = cpu_has_avx2() && (w->bits == 4 || w->bits == 8) && w->group_size % 32 == 0;
    atomic_init(&j.next, 0);
    tp_run(tp, gsum_worker, &j);
    tp_run(tp, rows_worker, &j);
}
