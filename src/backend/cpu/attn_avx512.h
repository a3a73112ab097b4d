/* AVX-512 attention over an f16 KV cache (attn_avx512.c, compiled for AVX-512; called
 * by op_attention only when qmatmul_has_avx512() and attn512_fits()). */
#ifndef GB_CPU_ATTN_AVX512_H
#define GB_CPU_ATTN_AVX512_H

#include "backend/backend.h"

enum {
    /* queries per item: tokens x query heads per kv head. Each item transposes its key blocks
     * once for all its queries: 64 against 32 ran a 512-token prompt's attention (Qwen3-0.6B
     * layer) in 8.3-8.8 against 10.2-10.6 ms at 1 thread, 5.3 against 6.7 at 2. */
    ATTN512_MAX_Q = 64,
    ATTN512_MAX_HD = 256, /* head_dim */
};

/* Tokens per item for this head grouping (query heads per kv head). */
static inline int attn512_tokens(int group) { return group >= ATTN512_MAX_Q ? 1 : ATTN512_MAX_Q / group; }
static inline int attn512_fits(const struct attn_args *a) {
    int group = a->n_head / a->n_head_kv;
    return a->kv_type == GB_TYPE_F16 && a->head_dim % 16 == 0 && a->head_dim <= ATTN512_MAX_HD &&
           group * attn512_tokens(group) <= ATTN512_MAX_Q;
}

/* Rows t0 .. t0 + nt - 1 of segment s (nt <= attn512_tokens) and the query heads of kv
 * head kvh: out = softmax(q k^T scale) v, as op_attention. */
void attn_item_f16_avx512(const struct attn_args *a, const struct gb_seg *s, int t0, int nt, int kvh);

#endif
