/* The paged KV cache's bookkeeping. The pool holds n_blocks blocks of KV_BLOCK
 * positions (their rows are backend memory, the context's KV pool); each block has a
 * reference count, and each sequence a block table: position p of the sequence lives
 * in block blocks[p / KV_BLOCK]. Sequences share blocks (a fork, later a cached prefix);
 * a block is written only by a sequence that holds it alone, so a shared last block is
 * copied first (copy-on-write). Full blocks are never written again. */
#ifndef GB_KV_BLOCKS_H
#define GB_KV_BLOCKS_H

#include "backend/backend.h"
#include "gerbil.h"

#include <stdint.h>

struct kv_blocks {
    int n_blocks, n_free;
    int32_t *ref;       /* [n_blocks] references (0: free) */
    int32_t *free_list; /* [n_blocks] a stack of the free blocks: the lowest taken first at the start,
                           then the most recently freed (pages already resident) */
};

/* One sequence's blocks: n of them cover positions [0, n * KV_BLOCK); at most cap. */
struct kv_table {
    int32_t *blocks;
    int n, cap;
};

/* Copies block src's rows to block dst (both in the pool). */
typedef void (*kv_copy_fn)(void *user, int32_t dst, int32_t src);

gerbil_status kvb_init(struct kv_blocks *kb, int n_blocks);
void kvb_destroy(struct kv_blocks *kb);
/* A table for sequences of up to max_len positions. */
gerbil_status kvt_init(struct kv_table *t, int max_len);
/* Releases t's blocks and frees the table. */
void kvt_destroy(struct kv_blocks *kb, struct kv_table *t);

/* Blocks kvb_extend(t, len, new_len) would take from the pool. */
int kvb_needed(const struct kv_blocks *kb, const struct kv_table *t, int len, int new_len);
/* The shared block kvb_extend(t, len, new_len) would copy first, or -1. */
int32_t kvb_cow_block(const struct kv_blocks *kb, const struct kv_table *t, int len, int new_len);
/* Make t (holding positions [0, len)) writable for positions [len, new_len): blocks for
 * the positions past its last one, and a private copy of its last block when that is
 * shared and len falls inside it. GERBIL_ERR_CONTEXT, with nothing changed, when the
 * pool has too few free blocks or new_len exceeds the table's capacity. */
gerbil_status kvb_extend(struct kv_blocks *kb, struct kv_table *t, int len, int new_len, kv_copy_fn copy, void *user);
/* Keep positions [0, n): the blocks past them are released. */
void kvb_truncate(struct kv_blocks *kb, struct kv_table *t, int n);
/* dst (empty, capacity >= src's blocks) shares src's blocks. */
void kvb_fork(struct kv_blocks *kb, struct kv_table *dst, const struct kv_table *src);
/* An extra reference to a held block (kvb_ref), and giving one back (kvb_unref: the block is
 * free again when its last reference goes). */
void kvb_ref(struct kv_blocks *kb, int32_t b);
void kvb_unref(struct kv_blocks *kb, int32_t b);
/* dst (empty, capacity >= n) takes held blocks[0..n), each referenced once more. */
void kvb_attach(struct kv_blocks *kb, struct kv_table *dst, const int32_t *blocks, int n);

#endif
