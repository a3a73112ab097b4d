/* The CPU backend's packed 4-bit MLX layout (mlx_packed.h). */
#include "backend/cpu/mlx_packed.h"
#include "base/status.h"
#include "tensor/quant_ref.h"

#include <stdlib.h>
#include <string.h>

void mlx4_pack(struct gb_weight *w) {
    GB_ASSERT(w->kind == GB_WEIGHT_MLX && w->bits == 4 && !w->packed && w->n_in % 32 == 0);
    size_t nw = (size_t)w->n_in / 8;
    uint32_t *tmp = malloc(4 * nw * sizeof *tmp), *data = (uint32_t *)(uintptr_t)w->data;
    GB_ASSERT(tmp);
    for (int64_t r0 = 0; r0 < w->n_out;) { /* a quad, or one of the last rows */
        int q = r0 + 4 <= w->n_out ? 4 : 1;
        memcpy(tmp, data + (size_t)r0 * nw, (size_t)q * nw * sizeof *tmp);
        for (int ri = 0; ri < q; ri++)
            for (size_t i = 0; i < nw; i++) data[mlx4_packed_word(w->n_out, nw, r0 + ri, i)] = tmp[(size_t)ri * nw + i];
        r0 += q;
    }
    free(tmp);
    w->packed = 1;
}

void cpu_mlx_words(const struct gb_weight *w, int64_t r, size_t w0, size_t k, uint32_t *out) {
    size_t nw = (size_t)(w->n_in * w->bits / 32);
    const uint32_t *data = (const uint32_t *)w->data;
    if (!w->packed) {
        memcpy(out, data + (size_t)r * nw + w0, k * sizeof *out);
        return;
    }
    for (size_t i = 0; i < k; i++) out[i] = data[mlx4_packed_word(w->n_out, nw, r, w0 + i)];
}

void cpu_weight_row(const struct gb_weight *w, int64_t r, float *out) {
    if (!w->packed) {
        weight_get_row(w, r, out);
        return;
    }
    GB_ASSERT(r >= 0 && r < w->n_out);
    const int64_t n_groups = w->n_in / w->group_size;
    const size_t sb = type_traits(w->sb_type)->type_size;
    uint32_t words[512 * 8 / 32]; /* 512 elements at a time: whole groups, and whole sets of packed rows */
    for (int64_t c0 = 0; c0 < w->n_in; c0 += 512) {
        int64_t n = w->n_in - c0 < 512 ? w->n_in - c0 : 512;
        cpu_mlx_words(w, r, (size_t)c0 * (size_t)w->bits / 32, (size_t)n * (size_t)w->bits / 32, words);
        const size_t g0 = (size_t)(r * n_groups + c0 / w->group_size);
        dequantize_row_mlx(words, (const char *)w->scales + g0 * sb, (const char *)w->biases + g0 * sb, w->sb_type,
                           w->bits, w->group_size, out + c0, n);
    }
}
