/* The paged KV cache's block manager (kv_blocks.h). */
#include "model/kv_blocks.h"
#include "base/status.h"

#include <stdlib.h>
#include <string.h>

gerbil_status kvb_init(struct kv_blocks *kb, int n_blocks) {
    memset(kb, 0, sizeof *kb);
    if (n_blocks < 1) return err_set(GERBIL_ERR_INVALID_ARG, "a KV pool needs at least one block");
    kb->ref = calloc((size_t)n_blocks, sizeof *kb->ref);
    kb->free_list = malloc((size_t)n_blocks * sizeof *kb->free_list);
    if (!kb->ref || !kb->free_list) {
        kvb_destroy(kb);
        return err_set(GERBIL_ERR_NOMEM, "out of memory for a KV pool of %d blocks", n_blocks);
    }
    kb->n_blocks = kb->n_free = n_blocks;
    for (int i = 0; i < n_blocks; i++) kb->free_list[i] = n_blocks - 1 - i; /* block 0 on top */
    return GERBIL_OK;
}

void kvb_destroy(struct kv_blocks *kb) {
    free(kb->ref);
    free(kb->free_list);
    memset(kb, 0, sizeof *kb);
}

gerbil_status kvt_init(struct kv_table *t, int max_len) {
    t->n = 0;
    t->cap = (max_len + KV_BLOCK - 1) / KV_BLOCK;
    t->blocks = malloc((size_t)(t->cap > 0 ? t->cap : 1) * sizeof *t->blocks);
    return t->blocks ? GERBIL_OK : err_set(GERBIL_ERR_NOMEM, "out of memory");
}

void kvt_destroy(struct kv_blocks *kb, struct kv_table *t) {
    if (!t->blocks) return;
    kvb_truncate(kb, t, 0);
    free(t->blocks);
    t->blocks = NULL;
    t->cap = 0;
}

static int32_t take(struct kv_blocks *kb) {
    GB_ASSERT(kb->n_free > 0);
    int32_t b = kb->free_list[--kb->n_free];
    GB_ASSERT(kb->ref[b] == 0);
    kb->ref[b] = 1;
    return b;
}

static void unref(struct kv_blocks *kb, int32_t b) {
    GB_ASSERT(b >= 0 && b < kb->n_blocks && kb->ref[b] > 0);
    if (--kb->ref[b] == 0) kb->free_list[kb->n_free++] = b;
}

/* Whether writing position len needs a copy of the block holding it. */
static int needs_copy(const struct kv_blocks *kb, const struct kv_table *t, int len) {
    return len % KV_BLOCK != 0 && len / KV_BLOCK < t->n && kb->ref[t->blocks[len / KV_BLOCK]] > 1;
}

int32_t kvb_cow_block(const struct kv_blocks *kb, const struct kv_table *t, int len, int new_len) {
    return new_len > len && needs_copy(kb, t, len) ? t->blocks[len / KV_BLOCK] : -1;
}

int kvb_needed(const struct kv_blocks *kb, const struct kv_table *t, int len, int new_len) {
    int want = (new_len + KV_BLOCK - 1) / KV_BLOCK;
    return (want > t->n ? want - t->n : 0) + (new_len > len && needs_copy(kb, t, len));
}

gerbil_status kvb_extend(struct kv_blocks *kb, struct kv_table *t, int len, int new_len, kv_copy_fn copy, void *user) {
    GB_ASSERT(len >= 0 && t->n == (len + KV_BLOCK - 1) / KV_BLOCK); /* no blocks past len: they could be shared */
    if (new_len <= len) return GERBIL_OK;
    const int want = (new_len + KV_BLOCK - 1) / KV_BLOCK;
    if (want > t->cap)
        return err_set(GERBIL_ERR_CONTEXT, "%d positions exceed the sequence's limit of %d", new_len,
                       t->cap * KV_BLOCK);
    const int need = kvb_needed(kb, t, len, new_len);
    if (need > kb->n_free)
        return err_set(GERBIL_ERR_CONTEXT, "the KV cache is full: %d more blocks of %d positions needed, %d of %d "
                       "free", need, KV_BLOCK, kb->n_free, kb->n_blocks);
    if (needs_copy(kb, t, len)) {
        int32_t old = t->blocks[len / KV_BLOCK], fresh = take(kb);
        copy(user, fresh, old);
        unref(kb, old);
        t->blocks[len / KV_BLOCK] = fresh;
    }
    while (t->n < want) t->blocks[t->n++] = take(kb);
    return GERBIL_OK;
}

void kvb_truncate(struct kv_blocks *kb, struct kv_table *t, int n) {
    if (n < 0) n = 0;
    const int keep = (n + KV_BLOCK - 1) / KV_BLOCK;
    while (t->n > keep) unref(kb, t->blocks[--t->n]);
}

void kvb_fork(struct kv_blocks *kb, struct kv_table *dst, const struct kv_table *src) {
    GB_ASSERT(dst->n == 0 && dst->cap >= src->n);
    for (int i = 0; i < src->n; i++) {
        dst->blocks[i] = src->blocks[i];
        kb->ref[src->blocks[i]]++;
    }
    dst->n = src->n;
}

void kvb_ref(struct kv_blocks *kb, int32_t b) {
    GB_ASSERT(b >= 0 && b < kb->n_blocks && kb->ref[b] > 0);
    kb->ref[b]++;
}

void kvb_unref(struct kv_blocks *kb, int32_t b) { unref(kb, b); }

void kvb_attach(struct kv_blocks *kb, struct kv_table *dst, const int32_t *blocks, int n) {
    GB_ASSERT(dst->n == 0 && dst->cap >= n);
    for (int i = 0; i < n; i++) {
        kvb_ref(kb, blocks[i]);
        dst->blocks[i] = blocks[i];
    }
    dst->n = n;
}
