#include "tensor/weight.h"
#include "base/status.h"
#include "tensor/quant_ref.h"

#include <stdlib.h>
#include <string.h>

/* Bytes of one row of MLX codes: n_in codes of `bits` bits (n_in a multiple of 32). */
static size_t mlx_row_bytes(const struct gb_weight *w) {
    return (size_t)w->n_in * (size_t)w->bits / 8;
}

size_t weight_nbytes(const struct gb_weight *w) {
    if (w->kind == GB_WEIGHT_MLX) {
        const size_t n_groups = (size_t)w->n_out * (size_t)(w->n_in / w->group_size);
        return (size_t)w->n_out * mlx_row_bytes(w) + 2 * n_groups * type_traits(w->sb_type)->type_size;
    }
    return (size_t)w->n_out * w->row_bytes;
}

struct gb_weight weight_rows(const struct gb_weight *w, int64_t r0, int64_t n) {
    GB_ASSERT(r0 >= 0 && n >= 1 && r0 + n <= w->n_out);
    GB_ASSERT(!w->packed || (r0 % 4 == 0 && (n % 4 == 0 || r0 + n == w->n_out))); /* whole quads */
    struct gb_weight v = *w;
    v.n_out = n;
    if (w->kind == GB_WEIGHT_MLX) {
        const size_t sb = type_traits(w->sb_type)->type_size * (size_t)(w->n_in / w->group_size);
        v.data = (const char *)w->data + (size_t)r0 * mlx_row_bytes(w);
        v.scales = (const char *)w->scales + (size_t)r0 * sb;
        v.biases = (const char *)w->biases + (size_t)r0 * sb;
    } else {
        v.data = (const char *)w->data + (size_t)r0 * w->row_bytes;
    }
    return v;
}

void weight_pack_mlx4(struct gb_weight *w) {
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

void weight_mlx_words(const struct gb_weight *w, int64_t r, size_t w0, size_t k, uint32_t *out) {
    size_t nw = (size_t)(w->n_in * w->bits / 32);
    const uint32_t *row = (const uint32_t *)((const char *)w->data + (size_t)r * mlx_row_bytes(w));
    if (!w->packed) {
        memcpy(out, row + w0, k * sizeof *out);
        return;
    }
    const uint32_t *data = (const uint32_t *)w->data;
    for (size_t i = 0; i < k; i++) out[i] = data[mlx4_packed_word(w->n_out, nw, r, w0 + i)];
}

void weight_get_row(const struct gb_weight *w, int64_t r, float *out) {
    GB_ASSERT(r >= 0 && r < w->n_out);
    if (w->kind == GB_WEIGHT_MLX) {
        const int64_t n_groups = w->n_in / w->group_size;
        const size_t sb = type_traits(w->sb_type)->type_size;
        /* 512 elements at a time: whole groups, and whole sets of packed rows */
        uint32_t words[512 * 8 / 32];
        for (int64_t c0 = 0; c0 < w->n_in; c0 += 512) {
            int64_t n = w->n_in - c0 < 512 ? w->n_in - c0 : 512;
            weight_mlx_words(w, r, (size_t)c0 * (size_t)w->bits / 32, (size_t)n * (size_t)w->bits / 32, words);
            const size_t g0 = (size_t)(r * n_groups + c0 / w->group_size);
            dequantize_row_mlx(words, (const char *)w->scales + g0 * sb, (const char *)w->biases + g0 * sb,
                               w->sb_type, w->bits, w->group_size, out + c0, n);
        }
        return;
    }
    type_to_f32(w->type, (const char *)w->data + (size_t)r * w->row_bytes, out, w->n_in);
}
