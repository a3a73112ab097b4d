#include "tensor/weight.h"
#include "base/status.h"
#include "tensor/quant_ref.h"

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

void weight_get_row(const struct gb_weight *w, int64_t r, float *out) {
    GB_ASSERT(r >= 0 && r < w->n_out && !w->packed);
    if (w->kind == GB_WEIGHT_MLX) {
        const size_t sb = type_traits(w->sb_type)->type_size, g0 = (size_t)(r * (w->n_in / w->group_size));
        dequantize_row_mlx((const uint32_t *)((const char *)w->data + (size_t)r * mlx_row_bytes(w)),
                           (const char *)w->scales + g0 * sb, (const char *)w->biases + g0 * sb, w->sb_type, w->bits,
                           w->group_size, out, w->n_in);
        return;
    }
    type_to_f32(w->type, (const char *)w->data + (size_t)r * w->row_bytes, out, w->n_in);
}
