/* AVX-512 attention over an f16 KV cache (attn_avx512.c, compiled for AVX-512; called
 * by op_attention only when qmatmul_has_avx512() and attn512_fits()). */
#ifndef GB_CPU_ATTN_AVX512_H
#define GB_CPU_ATTN_AVX512_H

#include "backend/ops.h"

#include <stddef.h>
#include <stdint.h>

enum {
    ATTN512_MAX_Q = 16,   /* queries per item: tokens x query heads per kv head */
    ATTN512_MAX_HD = 256, /* head_dim */
};

/* dst[i] = f32_to_f16(x[i]) (base/fp16.h) bit for bit, 16 at a time (op_kv_store's f16
 * cache rows). */
void kv_to_f16_avx512(uint16_t *dst, const float *x, size_t n);

/* Tokens per item for this head grouping (query heads per kv head). */
static inline int attn512_tokens(int group) { return group >= 8 ? 1 : 8 / group; }
static inline int attn512_fits(const struct attn_args *a) {
    int group = a->n_head / a->n_head_kv;
    return a->kv_type == GB_TYPE_F16 && a->head_dim % 16 == 0 && a->head_dim <= ATTN512_MAX_HD &&
           group * attn512_tokens(group) <= ATTN512_MAX_Q;
}

/* Tokens t0 .. t0 + nt - 1 (nt <= attn512_tokens) and the query heads of kv head kvh:
 * out = softmax(q k^T scale) v, as op_attention. */
void attn_item_f16_avx512(const struct attn_args *a, int t0, int nt, int kvh);

#endif
