/* The prefix cache (sched.h): full KV blocks of prompts under chained hashes of their
 * tokens (a block's key is the hash of its parent's key and its 16 tokens, as vLLM
 * does), open addressing; each entry keeps its tokens and parent key, so a lookup never
 * trusts a hash alone. The cache holds one reference on each block it keeps; a block
 * whose only reference is the cache's can be evicted (least recently used first). */
#include "serve/sched.h"

#include <stdlib.h>
#include <string.h>

struct pc_entry {
    uint64_t key, parent, tick;
    int32_t block;             /* -1: empty slot */
    int32_t tokens[GERBIL_KV_BLOCK];
};

struct prefix_cache {
    struct pc_entry *e;
    int cap, n;                /* slots (power of two), entries */
    uint64_t tick;
};

uint64_t prefix_hash(uint64_t parent, const int32_t *tokens) {
    /* FNV-1a over the parent key and the tokens, then a 64-bit finalizer */
    uint64_t h = 0xcbf29ce484222325ULL ^ parent;
    for (int i = 0; i < GERBIL_KV_BLOCK; i++) {
        uint32_t t = (uint32_t)tokens[i];
        for (int b = 0; b < 4; b++) {
            h ^= (t >> (8 * b)) & 0xff;
            h *= 0x100000001b3ULL;
        }
    }
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    return h ? h : 1;
}

struct prefix_cache *prefix_new(int n_blocks) {
    struct prefix_cache *pc = calloc(1, sizeof *pc);
    if (!pc) return NULL;
    int cap = 16;
    while (cap < 2 * n_blocks) cap *= 2;
    pc->e = malloc((size_t)cap * sizeof *pc->e);
    if (!pc->e) { free(pc); return NULL; }
    for (int i = 0; i < cap; i++) pc->e[i].block = -1;
    pc->cap = cap;
    return pc;
}

void prefix_free(struct prefix_cache *pc, gerbil_context_t ctx) {
    if (!pc) return;
    for (int i = 0; i < pc->cap; i++)
        if (pc->e[i].block >= 0) gerbil_kv_block_release(ctx, pc->e[i].block);
    free(pc->e);
    free(pc);
}

static int same(const struct pc_entry *e, uint64_t key, uint64_t parent, const int32_t *tokens) {
    return e->key == key && e->parent == parent && !memcmp(e->tokens, tokens, sizeof e->tokens);
}

int32_t prefix_lookup(struct prefix_cache *pc, uint64_t parent, const int32_t *tokens, uint64_t *hash) {
    const uint64_t key = prefix_hash(parent, tokens);
    *hash = key;
    for (int i = (int)(key & (uint64_t)(pc->cap - 1)), probes = 0; probes < pc->cap;
         i = (i + 1) & (pc->cap - 1), probes++) {
        struct pc_entry *e = &pc->e[i];
        if (e->block < 0) return -1;
        if (same(e, key, parent, tokens)) {
            e->tick = ++pc->tick;
            return e->block;
        }
    }
    return -1;
}

/* Remove slot i, re-placing the entries of its probe run after it (linear probing). */
static void remove_at(struct prefix_cache *pc, int i) {
    pc->e[i].block = -1;
    pc->n--;
    for (int j = (i + 1) & (pc->cap - 1); pc->e[j].block >= 0; j = (j + 1) & (pc->cap - 1)) {
        struct pc_entry t = pc->e[j];
        pc->e[j].block = -1;
        int k = (int)(t.key & (uint64_t)(pc->cap - 1));
        while (pc->e[k].block >= 0) k = (k + 1) & (pc->cap - 1);
        pc->e[k] = t;
    }
}

void prefix_insert(struct prefix_cache *pc, gerbil_context_t ctx, uint64_t parent, const int32_t *tokens, int32_t b) {
    const uint64_t key = prefix_hash(parent, tokens);
    if (pc->n + 1 > pc->cap / 2) return; /* full (sized for every block of the pool: not reached) */
    int i = (int)(key & (uint64_t)(pc->cap - 1));
    for (; pc->e[i].block >= 0; i = (i + 1) & (pc->cap - 1))
        if (same(&pc->e[i], key, parent, tokens)) {
            pc->e[i].tick = ++pc->tick;
            return;
        }
    gerbil_kv_block_retain(ctx, b);
    pc->e[i] = (struct pc_entry){.key = key, .parent = parent, .tick = ++pc->tick, .block = b};
    memcpy(pc->e[i].tokens, tokens, sizeof pc->e[i].tokens);
    pc->n++;
}

int prefix_evict(struct prefix_cache *pc, gerbil_context_t ctx, int want) {
    int done = 0;
    while (done < want) {
        int best = -1;
        for (int i = 0; i < pc->cap; i++)
            if (pc->e[i].block >= 0 && gerbil_kv_block_refs(ctx, pc->e[i].block) == 1 &&
                (best < 0 || pc->e[i].tick < pc->e[best].tick))
                best = i;
        if (best < 0) break;
        gerbil_kv_block_release(ctx, pc->e[best].block);
        remove_at(pc, best);
        done++;
    }
    return done;
}

void prefix_counts(struct prefix_cache *pc, gerbil_context_t ctx, int *cached, int *evictable) {
    int n = 0, ev = 0;
    for (int i = 0; pc && i < pc->cap; i++)
        if (pc->e[i].block >= 0) {
            n++;
            ev += gerbil_kv_block_refs(ctx, pc->e[i].block) == 1;
        }
    *cached = n;
    *evictable = ev;
}
