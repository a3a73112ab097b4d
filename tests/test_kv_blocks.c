/* The paged KV cache's block manager (model/kv_blocks.h). First unit tests: the order
 * blocks are handed out and reused in, reference counts after a fork, copy-on-write
 * (exactly when the last block is partial and shared), truncation, pool exhaustion and
 * the table's capacity (an error that changes nothing), kvb_needed against what
 * kvb_extend takes. Then random operations on up to eight sequences over a fake pool
 * of "contents" (one int per position), each sequence with a model of the values it
 * holds, every invariant checked after every step. The seed is printed; pass it back
 * as argv[1] to replay a run. */
#include "model/kv_blocks.h"
#include "test.h"

#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum {
    MAX_BLOCKS = 64, /* the largest pool below */
    MAX_TABS = 8,    /* live tables at once */
    MAX_TB = 16,     /* blocks per table (max_len <= MAX_TB * KV_BLOCK) */
    POISON = -7      /* the contents of free blocks */
};

static struct kv_blocks kb;
static int32_t pool[MAX_BLOCKS * KV_BLOCK];
static struct kv_table *tabs[MAX_TABS]; /* the live tables (a copy's destination is in none) */
static int n_tabs;
static int copies, bad_copies, magic;
static int32_t last_dst, last_src;
static unsigned long long seed0;

static int ceil_blocks(int len) { return (len + KV_BLOCK - 1) / KV_BLOCK; }

static int in_tables(int32_t b) {
    for (int i = 0; i < n_tabs; i++)
        for (int j = 0; j < tabs[i]->n; j++)
            if (tabs[i]->blocks[j] == b) return 1;
    return 0;
}

static int in_free_list(int32_t b) {
    for (int i = 0; i < kb.n_free; i++)
        if (kb.free_list[i] == b) return 1;
    return 0;
}

/* The copy-on-write callback: dst must be fresh (taken, held by no table, not free),
 * src still held; copies src's contents in the fake pool. */
static void copy_cb(void *user, int32_t dst, int32_t src) {
    copies++;
    last_dst = dst;
    last_src = src;
    const int ok = user == &magic && dst >= 0 && dst < kb.n_blocks && src >= 0 && src < kb.n_blocks && dst != src &&
                   kb.ref[dst] == 1 && !in_tables(dst) && !in_free_list(dst) && kb.ref[src] >= 1 && in_tables(src);
    if (!ok) {
        bad_copies++;
        return;
    }
    memcpy(pool + (size_t)dst * KV_BLOCK, pool + (size_t)src * KV_BLOCK, KV_BLOCK * sizeof *pool);
}

/* Everything an operation could change: the pool's counts and free list, every table. */
struct snap {
    int n_free, n[MAX_TABS];
    int32_t ref[MAX_BLOCKS], fl[MAX_BLOCKS], b[MAX_TABS][MAX_TB];
};

static void snap_take(struct snap *s) {
    memset(s, 0, sizeof *s);
    s->n_free = kb.n_free;
    memcpy(s->ref, kb.ref, (size_t)kb.n_blocks * sizeof *kb.ref);
    memcpy(s->fl, kb.free_list, (size_t)kb.n_free * sizeof *kb.free_list);
    for (int i = 0; i < n_tabs; i++) {
        s->n[i] = tabs[i]->n;
        memcpy(s->b[i], tabs[i]->blocks, (size_t)tabs[i]->n * sizeof *tabs[i]->blocks);
    }
}

static int snap_same(const struct snap *a) {
    struct snap b;
    snap_take(&b);
    return memcmp(a, &b, sizeof b) == 0;
}

static int blocks_are(const struct kv_table *t, int n, const int32_t *want) {
    if (t->n != n) return 0;
    for (int i = 0; i < n; i++)
        if (t->blocks[i] != want[i]) return 0;
    return 1;
}

/* kvb_extend, checking that it takes exactly kvb_needed blocks (or fails leaving the
 * pool and every table as they were) and counting its copies. */
static gerbil_status extend(struct kv_table *t, int len, int new_len) {
    const int need = kvb_needed(&kb, t, len, new_len), free0 = kb.n_free;
    struct snap s;
    snap_take(&s);
    copies = 0;
    gerbil_status st = kvb_extend(&kb, t, len, new_len, copy_cb, &magic);
    if (st == GERBIL_OK) {
        CHECKF(free0 - kb.n_free == need, "extend %d -> %d took %d blocks, kvb_needed said %d", len, new_len,
               free0 - kb.n_free, need);
        if (new_len > len) CHECKF(t->n == ceil_blocks(new_len), "extend %d -> %d: %d blocks", len, new_len, t->n);
        else CHECK(snap_same(&s) && copies == 0);
    } else {
        CHECK(st == GERBIL_ERR_CONTEXT);
        CHECK(snap_same(&s));
        CHECK(copies == 0);
    }
    return st;
}

/* Write value v(p) = tag * 1000 + p into positions [from, to) of t. */
static void fill(const struct kv_table *t, int from, int to, int tag) {
    for (int p = from; p < to; p++) pool[kv_pool_row(t->blocks, p)] = tag * 1000 + p;
}

static int holds(const struct kv_table *t, int from, int to, int tag) {
    for (int p = from; p < to; p++)
        if (pool[kv_pool_row(t->blocks, p)] != tag * 1000 + p) return 0;
    return 1;
}

static void unit_tests(void) {
    struct kv_table a, b, c;
    CHECK(kvb_init(&kb, 0) == GERBIL_ERR_INVALID_ARG);
    kvb_destroy(&kb);
    CHECK(kvb_init(&kb, -3) == GERBIL_ERR_INVALID_ARG);
    kvb_destroy(&kb);

    /* allocation order: a fresh pool hands out 0, 1, 2, ... */
    CHECK(kvb_init(&kb, 8) == GERBIL_OK);
    CHECK(kb.n_blocks == 8 && kb.n_free == 8);
    CHECK(kvt_init(&a, 200) == GERBIL_OK && a.cap == 13 && a.n == 0);
    CHECK(kvt_init(&b, 256) == GERBIL_OK && b.cap == 16);
    CHECK(kvt_init(&c, 256) == GERBIL_OK);
    tabs[0] = &a, tabs[1] = &b, tabs[2] = &c, n_tabs = 3;
    CHECK(kvb_needed(&kb, &a, 0, 0) == 0);
    CHECK(kvb_needed(&kb, &a, 0, 1) == 1);
    CHECK(kvb_needed(&kb, &a, 0, 16) == 1);
    CHECK(kvb_needed(&kb, &a, 0, 17) == 2);
    CHECK(kvb_needed(&kb, &a, 0, 40) == 3);
    CHECK(extend(&a, 0, 0) == GERBIL_OK && a.n == 0 && kb.n_free == 8);
    CHECK(extend(&a, 0, 40) == GERBIL_OK && copies == 0);
    CHECK(blocks_are(&a, 3, (int32_t[]){0, 1, 2}));
    CHECK(kb.n_free == 5 && kb.ref[0] == 1 && kb.ref[1] == 1 && kb.ref[2] == 1 && kb.ref[3] == 0);
    fill(&a, 0, 40, 1);
    CHECK(extend(&a, 40, 48) == GERBIL_OK && a.n == 3 && kb.n_free == 5 && copies == 0); /* same block */
    CHECK(extend(&a, 48, 49) == GERBIL_OK && blocks_are(&a, 4, (int32_t[]){0, 1, 2, 3}) && copies == 0);
    CHECK(extend(&b, 0, 1) == GERBIL_OK && blocks_are(&b, 1, (int32_t[]){4}));

    /* free and reuse: the most recently freed block comes back first */
    kvb_truncate(&kb, &a, 40);
    CHECK(a.n == 3 && kb.ref[3] == 0 && kb.n_free == 4);
    CHECK(extend(&c, 0, 1) == GERBIL_OK && blocks_are(&c, 1, (int32_t[]){3}));
    kvb_truncate(&kb, &c, 0);
    kvb_truncate(&kb, &a, 0);
    CHECK(a.n == 0 && kb.n_free == 7 && kb.ref[0] == 0 && kb.ref[1] == 0 && kb.ref[2] == 0 && kb.ref[3] == 0);
    /* a truncation frees from the end, so the same table gets its blocks back in order */
    CHECK(extend(&a, 0, 40) == GERBIL_OK && blocks_are(&a, 3, (int32_t[]){0, 1, 2}));
    CHECK(extend(&c, 0, 1) == GERBIL_OK && blocks_are(&c, 1, (int32_t[]){3}));
    kvb_truncate(&kb, &c, 0);
    kvb_truncate(&kb, &b, 0);
    CHECK(kb.n_free == 5);
    fill(&a, 0, 40, 1);

    /* fork: the same blocks, each referenced twice, none taken */
    kvb_fork(&kb, &b, &a);
    CHECK(blocks_are(&b, 3, (int32_t[]){0, 1, 2}));
    CHECK(kb.ref[0] == 2 && kb.ref[1] == 2 && kb.ref[2] == 2 && kb.n_free == 5);
    CHECK(holds(&b, 0, 40, 1));

    /* extend the source: its last block (8 of 16 positions) is shared -> copied first */
    CHECK(kvb_needed(&kb, &a, 40, 41) == 1);
    CHECK(kvb_needed(&kb, &a, 40, 40) == 0); /* nothing to write, nothing to copy */
    CHECK(extend(&a, 40, 40) == GERBIL_OK && copies == 0 && a.blocks[2] == 2);
    CHECK(extend(&a, 40, 41) == GERBIL_OK && copies == 1 && bad_copies == 0);
    CHECK(last_src == 2 && last_dst == a.blocks[2] && last_dst != 2);
    CHECK(a.n == 3 && a.blocks[0] == 0 && a.blocks[1] == 1);
    CHECK(kb.ref[2] == 1 && kb.ref[a.blocks[2]] == 1 && kb.ref[0] == 2 && kb.ref[1] == 2 && kb.n_free == 4);
    CHECK(holds(&a, 0, 40, 1));
    fill(&a, 40, 41, 2);
    CHECK(holds(&b, 0, 40, 1) && pool[2 * KV_BLOCK + 8] != 2040);
    /* now exclusive: no more copies of it, for either of them */
    CHECK(extend(&a, 41, 45) == GERBIL_OK && copies == 0 && kb.n_free == 4);
    CHECK(kvb_needed(&kb, &b, 40, 45) == 0);
    CHECK(extend(&b, 40, 45) == GERBIL_OK && copies == 0 && b.blocks[2] == 2 && kb.n_free == 4);
    fill(&b, 40, 45, 3);
    CHECK(holds(&a, 0, 40, 1) && holds(&a, 40, 41, 2) && holds(&b, 0, 40, 1) && holds(&b, 40, 45, 3));
    kvb_truncate(&kb, &a, 0);
    kvb_truncate(&kb, &b, 0);
    CHECK(kb.n_free == 8);

    /* extend the fork, with the copy and new blocks in one call */
    CHECK(extend(&a, 0, 40) == GERBIL_OK);
    fill(&a, 0, 40, 1);
    kvb_fork(&kb, &b, &a);
    CHECK(kvb_needed(&kb, &b, 40, 70) == 3); /* the copy + 2 blocks for [48, 70) */
    CHECK(extend(&b, 40, 70) == GERBIL_OK && copies == 1 && bad_copies == 0);
    CHECK(last_src == a.blocks[2] && last_dst == b.blocks[2] && b.n == 5);
    CHECK(b.blocks[0] == a.blocks[0] && b.blocks[1] == a.blocks[1]);
    CHECK(kb.ref[a.blocks[2]] == 1 && kb.ref[b.blocks[2]] == 1 && kb.ref[b.blocks[3]] == 1 && kb.n_free == 2);
    fill(&b, 40, 70, 4);
    CHECK(holds(&a, 0, 40, 1) && holds(&b, 0, 40, 1) && holds(&b, 40, 70, 4));
    CHECK(extend(&a, 40, 48) == GERBIL_OK && copies == 0); /* a's block is its own again */
    kvb_truncate(&kb, &a, 0);
    kvb_truncate(&kb, &b, 0);
    CHECK(kb.n_free == 8);

    /* a full last block is never copied: the fork and the source each get a new block */
    CHECK(extend(&a, 0, 32) == GERBIL_OK);
    kvb_fork(&kb, &b, &a);
    CHECK(kvb_needed(&kb, &a, 32, 33) == 1 && kvb_needed(&kb, &b, 32, 50) == 2);
    CHECK(extend(&a, 32, 33) == GERBIL_OK && copies == 0 && a.n == 3);
    CHECK(extend(&b, 32, 50) == GERBIL_OK && copies == 0 && b.n == 4);
    CHECK(kb.ref[a.blocks[0]] == 2 && kb.ref[a.blocks[1]] == 2 && kb.ref[a.blocks[2]] == 1);
    CHECK(a.blocks[2] != b.blocks[2] && kb.n_free == 3);
    kvb_truncate(&kb, &a, 0);
    CHECK(kb.ref[b.blocks[0]] == 1 && kb.ref[b.blocks[1]] == 1 && kb.n_free == 4); /* only a's own block freed */
    kvb_truncate(&kb, &b, 0);
    CHECK(kb.n_free == 8);

    /* truncation: inside a block, at a block boundary, to 0 */
    CHECK(extend(&a, 0, 64) == GERBIL_OK && a.n == 4 && kb.n_free == 4);
    int32_t ab[4];
    memcpy(ab, a.blocks, sizeof ab);
    kvb_truncate(&kb, &a, 64);
    CHECK(a.n == 4 && kb.n_free == 4);
    kvb_truncate(&kb, &a, 100); /* past the end: nothing */
    CHECK(a.n == 4 && kb.n_free == 4);
    kvb_truncate(&kb, &a, 40);
    CHECK(blocks_are(&a, 3, ab) && kb.ref[ab[3]] == 0 && kb.n_free == 5);
    kvb_truncate(&kb, &a, 33);
    CHECK(a.n == 3 && kb.n_free == 5);
    kvb_truncate(&kb, &a, 32);
    CHECK(blocks_are(&a, 2, ab) && kb.ref[ab[2]] == 0 && kb.n_free == 6);
    kvb_truncate(&kb, &a, 1);
    CHECK(blocks_are(&a, 1, ab) && kb.ref[ab[1]] == 0 && kb.n_free == 7);
    kvb_truncate(&kb, &a, 0);
    CHECK(a.n == 0 && kb.n_free == 8 && kb.ref[ab[0]] == 0);

    /* truncate a fork into a shared block, then extend it: copy-on-write again; the
     * source's last block, no longer shared, is not copied */
    CHECK(extend(&a, 0, 40) == GERBIL_OK);
    fill(&a, 0, 40, 1);
    kvb_fork(&kb, &b, &a);
    kvb_truncate(&kb, &b, 20);
    CHECK(b.n == 2 && kb.ref[a.blocks[2]] == 1 && kb.ref[a.blocks[1]] == 2 && kb.n_free == 5);
    CHECK(kvb_needed(&kb, &b, 20, 21) == 1 && kvb_needed(&kb, &a, 40, 41) == 0);
    CHECK(extend(&b, 20, 21) == GERBIL_OK && copies == 1 && bad_copies == 0);
    CHECK(last_src == a.blocks[1] && last_dst == b.blocks[1] && kb.ref[a.blocks[1]] == 1 && kb.n_free == 4);
    fill(&b, 20, 21, 5);
    CHECK(holds(&a, 0, 40, 1) && holds(&b, 0, 20, 1) && holds(&b, 20, 21, 5));
    CHECK(extend(&a, 40, 41) == GERBIL_OK && copies == 0);
    /* truncated to a boundary: the next write goes to a new block, nothing copied */
    kvb_truncate(&kb, &b, 16);
    CHECK(b.n == 1 && kb.ref[a.blocks[0]] == 2);
    CHECK(kvb_needed(&kb, &b, 16, 17) == 1);
    CHECK(extend(&b, 16, 17) == GERBIL_OK && copies == 0 && b.n == 2 && b.blocks[1] != a.blocks[1]);
    kvb_truncate(&kb, &a, 0);
    kvb_truncate(&kb, &b, 0);
    CHECK(kb.n_free == 8);

    /* exhaustion: GERBIL_ERR_CONTEXT, nothing changed (extend() compares a snapshot) */
    CHECK(extend(&a, 0, 100) == GERBIL_OK && a.n == 7 && kb.n_free == 1);
    CHECK(extend(&b, 0, 33) == GERBIL_ERR_CONTEXT && b.n == 0 && kb.n_free == 1);
    CHECK(extend(&b, 0, 32) == GERBIL_ERR_CONTEXT && b.n == 0);
    CHECK(extend(&a, 100, 129) == GERBIL_ERR_CONTEXT && a.n == 7);
    CHECK(extend(&a, 100, 112) == GERBIL_OK && a.n == 7 && kb.n_free == 1); /* fits the last block */
    CHECK(extend(&a, 112, 128) == GERBIL_OK && a.n == 8 && kb.n_free == 0);
    CHECK(extend(&b, 0, 1) == GERBIL_ERR_CONTEXT && b.n == 0);
    CHECK(extend(&b, 0, 0) == GERBIL_OK && b.n == 0);
    kvb_truncate(&kb, &a, 0);
    /* ... also when only the copy does not fit */
    CHECK(extend(&a, 0, 120) == GERBIL_OK && a.n == 8 && kb.n_free == 0);
    kvb_fork(&kb, &b, &a);
    CHECK(kvb_needed(&kb, &b, 120, 121) == 1);
    CHECK(extend(&b, 120, 121) == GERBIL_ERR_CONTEXT && copies == 0);
    CHECK(extend(&a, 120, 128) == GERBIL_ERR_CONTEXT && copies == 0);
    CHECK(kb.ref[a.blocks[7]] == 2 && blocks_are(&b, 8, a.blocks));
    kvb_truncate(&kb, &b, 112); /* a's last block is its own again: room without a copy */
    CHECK(kb.n_free == 0 && kvb_needed(&kb, &a, 120, 128) == 0);
    CHECK(extend(&a, 120, 128) == GERBIL_OK && copies == 0);
    CHECK(extend(&b, 112, 113) == GERBIL_ERR_CONTEXT && b.n == 7); /* a new block, none free */
    kvb_truncate(&kb, &b, 100); /* into a shared block */
    kvb_truncate(&kb, &a, 112); /* frees one */
    CHECK(kb.n_free == 1 && kvb_needed(&kb, &b, 100, 113) == 2);
    CHECK(extend(&b, 100, 113) == GERBIL_ERR_CONTEXT && copies == 0); /* copy + new block: 2 > 1 */
    CHECK(extend(&b, 100, 112) == GERBIL_OK && copies == 1 && kb.n_free == 0); /* the copy alone fits */
    kvb_truncate(&kb, &a, 0);
    kvb_truncate(&kb, &b, 0);
    CHECK(kb.n_free == 8);

    /* the table's capacity: ceil(max_len / KV_BLOCK) blocks, whatever the pool has free */
    kvt_destroy(&kb, &c);
    CHECK(kvt_init(&c, 40) == GERBIL_OK && c.cap == 3);
    tabs[2] = &c;
    CHECK(kvb_needed(&kb, &c, 0, 49) == 4); /* kvb_needed counts blocks, not the capacity */
    CHECK(extend(&c, 0, 49) == GERBIL_ERR_CONTEXT && c.n == 0);
    CHECK(extend(&c, 0, 48) == GERBIL_OK && c.n == 3 && kb.n_free == 5);
    CHECK(extend(&c, 48, 49) == GERBIL_ERR_CONTEXT && c.n == 3);
    kvb_truncate(&kb, &c, 30);
    CHECK(extend(&c, 30, 49) == GERBIL_ERR_CONTEXT && c.n == 2 && kb.n_free == 6);
    /* a fork needs only room for the source's blocks */
    kvt_destroy(&kb, &b);
    CHECK(kvt_init(&b, 32) == GERBIL_OK && b.cap == 2);
    tabs[1] = &b;
    kvb_fork(&kb, &b, &c);
    CHECK(b.n == 2 && kb.ref[c.blocks[1]] == 2);
    CHECK(extend(&b, 30, 32) == GERBIL_OK && copies == 1 && bad_copies == 0);
    CHECK(extend(&b, 32, 33) == GERBIL_ERR_CONTEXT);
    kvt_destroy(&kb, &c);
    CHECK(c.blocks == NULL && c.cap == 0);
    kvt_destroy(&kb, &c); /* twice: harmless */
    CHECK(kvt_init(&c, 0) == GERBIL_OK && c.cap == 0);
    CHECK(extend(&c, 0, 1) == GERBIL_ERR_CONTEXT && c.n == 0);
    CHECK(extend(&c, 0, 0) == GERBIL_OK);

    /* a table's destruction releases its blocks */
    n_tabs = 0;
    kvt_destroy(&kb, &a);
    kvt_destroy(&kb, &b);
    kvt_destroy(&kb, &c);
    CHECK(kb.n_free == 8);
    for (int i = 0; i < 8; i++) CHECK(kb.ref[i] == 0);
    kvb_destroy(&kb);
    CHECK(kb.ref == NULL && kb.free_list == NULL && kb.n_blocks == 0);
    CHECK(bad_copies == 0);
}

/* ---- random operations against a model ---- */

enum { MAX_LEN = 160 }; /* positions per sequence: 10 blocks */

struct seq {
    int used, len;
    struct kv_table t;
    int32_t val[MAX_LEN]; /* what positions [0, len) hold */
};
static struct seq seqs[MAX_TABS];
static unsigned long long rng;
static int next_val;
static struct {
    int ops, appends, copies, full, capacity, forks, truncs, news, frees;
} stats;

static int rnd(int n) { return (int)(test_rand_u64(&rng) % (unsigned long long)n); }

static void sync_tabs(void) {
    n_tabs = 0;
    for (int i = 0; i < MAX_TABS; i++)
        if (seqs[i].used) tabs[n_tabs++] = &seqs[i].t;
}

/* cnt[b] = the tables that reference block b. Returns 0 when a table holds a block
 * twice or one outside the pool. */
static int count_refs(int32_t *cnt) {
    memset(cnt, 0, MAX_BLOCKS * sizeof *cnt);
    int ok = 1;
    for (int i = 0; i < n_tabs; i++)
        for (int j = 0; j < tabs[i]->n; j++) {
            const int32_t b = tabs[i]->blocks[j];
            if (b < 0 || b >= kb.n_blocks) {
                ok = 0;
                continue;
            }
            for (int k = 0; k < j; k++)
                if (tabs[i]->blocks[k] == b) ok = 0;
            cnt[b]++;
        }
    return ok;
}

/* Every invariant; poisons the free blocks' contents after. 0 on a failure. */
static int check_all(int step, const char *op) {
    const int fail0 = test_fail_;
    int32_t cnt[MAX_BLOCKS];
    CHECKF(count_refs(cnt), "seed %llu step %d (%s): a table holds a block twice or outside the pool", seed0, step,
           op);
    int zero = 0;
    for (int b = 0; b < kb.n_blocks; b++) {
        CHECKF(kb.ref[b] == cnt[b], "seed %llu step %d (%s): block %d has %d references, %d tables hold it", seed0,
               step, op, b, kb.ref[b], cnt[b]);
        zero += kb.ref[b] == 0;
    }
    CHECKF(kb.n_free == zero, "seed %llu step %d (%s): n_free %d, %d blocks unreferenced", seed0, step, op,
           kb.n_free, zero);
    unsigned char seen[MAX_BLOCKS] = {0};
    for (int i = 0; i < kb.n_free && i < kb.n_blocks; i++) {
        const int32_t b = kb.free_list[i];
        const int ok = b >= 0 && b < kb.n_blocks && !seen[b] && kb.ref[b] == 0;
        CHECKF(ok, "seed %llu step %d (%s): free list entry %d is block %d", seed0, step, op, i, (int)b);
        if (ok) seen[b] = 1;
    }
    for (int i = 0; i < MAX_TABS; i++) {
        const struct seq *s = &seqs[i];
        if (!s->used) continue;
        CHECKF(s->t.n == ceil_blocks(s->len) && s->t.n <= s->t.cap,
               "seed %llu step %d (%s): sequence %d of %d positions has %d blocks (cap %d)", seed0, step, op, i,
               s->len, s->t.n, s->t.cap);
        if (s->t.n < ceil_blocks(s->len)) continue;
        int bad = -1;
        for (int p = 0; p < s->len && bad < 0; p++) {
            const int32_t b = s->t.blocks[p / KV_BLOCK];
            if (b < 0 || b >= kb.n_blocks || pool[kv_pool_row(s->t.blocks, p)] != s->val[p]) bad = p;
        }
        CHECKF(bad < 0, "seed %llu step %d (%s): sequence %d position %d reads back %d, wrote %d", seed0, step, op,
               i, bad, bad < 0 ? 0 : pool[kv_pool_row(s->t.blocks, bad)], bad < 0 ? 0 : s->val[bad]);
    }
    CHECKF(bad_copies == 0, "seed %llu step %d (%s): a copy to a block that was not fresh", seed0, step, op);
    for (int b = 0; b < kb.n_blocks; b++)
        if (kb.ref[b] == 0)
            for (int r = 0; r < KV_BLOCK; r++) pool[b * KV_BLOCK + r] = POISON;
    return test_fail_ == fail0;
}

static int free_slot(void) {
    int cand[MAX_TABS], n = 0;
    for (int i = 0; i < MAX_TABS; i++)
        if (!seqs[i].used) cand[n++] = i;
    return n ? cand[rnd(n)] : -1;
}

static int used_slot(void) {
    int cand[MAX_TABS], n = 0;
    for (int i = 0; i < MAX_TABS; i++)
        if (seqs[i].used) cand[n++] = i;
    return n ? cand[rnd(n)] : -1;
}

static void op_append(int i, int step) {
    struct seq *s = &seqs[i];
    const int k = rnd(8) == 0 ? rnd(MAX_LEN + 1) : rnd(20);
    const int len = s->len, new_len = len + k, want = ceil_blocks(new_len);
    int32_t cnt[MAX_BLOCKS];
    count_refs(cnt);
    const int shared_last = len % KV_BLOCK != 0 && cnt[s->t.blocks[len / KV_BLOCK]] > 1;
    const int model_need = (want > s->t.n ? want - s->t.n : 0) + (k > 0 && shared_last);
    const int need = kvb_needed(&kb, &s->t, len, new_len);
    CHECKF(need == model_need, "seed %llu step %d: kvb_needed(%d -> %d) = %d, expected %d", seed0, step, len,
           new_len, need, model_need);
    const int fits_cap = k == 0 || want <= s->t.cap, fits_pool = k == 0 || model_need <= kb.n_free;
    const int32_t old_last = len % KV_BLOCK ? s->t.blocks[len / KV_BLOCK] : -1;
    const int free0 = kb.n_free;
    struct snap sn;
    snap_take(&sn);
    copies = 0;
    const gerbil_status st = kvb_extend(&kb, &s->t, len, new_len, copy_cb, &magic);
    stats.appends++;
    if (!fits_cap || !fits_pool) {
        stats.capacity += !fits_cap;
        stats.full += fits_cap && !fits_pool;
        CHECKF(st == GERBIL_ERR_CONTEXT && snap_same(&sn) && copies == 0,
               "seed %llu step %d: extend %d -> %d (cap %d, need %d, free %d) gave %d, changed %d, copies %d", seed0,
               step, len, new_len, s->t.cap, model_need, kb.n_free, (int)st, !snap_same(&sn), copies);
        return;
    }
    CHECKF(st == GERBIL_OK, "seed %llu step %d: extend %d -> %d failed (%d)", seed0, step, len, new_len, (int)st);
    if (st != GERBIL_OK) return;
    CHECKF(free0 - kb.n_free == model_need, "seed %llu step %d: extend %d -> %d took %d blocks, needed %d", seed0,
           step, len, new_len, free0 - kb.n_free, model_need);
    const int want_copy = k > 0 && shared_last;
    CHECKF(copies == want_copy, "seed %llu step %d: extend %d -> %d made %d copies, expected %d", seed0, step, len,
           new_len, copies, want_copy);
    if (want_copy && copies == 1)
        CHECKF(last_src == old_last && last_dst == s->t.blocks[len / KV_BLOCK],
               "seed %llu step %d: copied %d -> %d, expected %d -> the new block %d", seed0, step, (int)last_src,
               (int)last_dst, (int)old_last, (int)s->t.blocks[len / KV_BLOCK]);
    stats.copies += copies;
    if (s->t.n < want) return; /* reported by check_all */
    int unshared = 1;
    for (int p = len; p < new_len; p++) {
        unshared &= kb.ref[s->t.blocks[p / KV_BLOCK]] == 1;
        pool[kv_pool_row(s->t.blocks, p)] = s->val[p] = next_val++;
    }
    CHECKF(unshared, "seed %llu step %d: extend %d -> %d left a shared block to write", seed0, step, len, new_len);
    s->len = new_len;
}

static int random_run(int rounds, int steps) {
    int step = 0;
    for (int round = 0; round < rounds; round++) {
        const int n_blocks = 1 + (round % 2 ? rnd(6) : rnd(MAX_BLOCKS));
        if (kvb_init(&kb, n_blocks) != GERBIL_OK) return 0;
        memset(seqs, 0, sizeof seqs);
        for (int b = 0; b < n_blocks * KV_BLOCK; b++) pool[b] = POISON;
        sync_tabs();
        for (int j = 0; j < steps; j++, step++) {
            const int r = rnd(100);
            const char *op;
            stats.ops++;
            int i, d;
            if (r < 10 && (i = free_slot()) >= 0) {
                op = "new";
                stats.news++;
                struct seq *s = &seqs[i];
                if (kvt_init(&s->t, rnd(MAX_LEN + 1)) != GERBIL_OK) return 0;
                s->used = 1;
                s->len = 0;
            } else if (r < 18 && (i = used_slot()) >= 0) {
                op = "free";
                stats.frees++;
                if (rnd(2)) kvb_truncate(&kb, &seqs[i].t, rnd(seqs[i].len + 1));
                kvt_destroy(&kb, &seqs[i].t);
                seqs[i].used = 0;
            } else if (r < 33 && (i = used_slot()) >= 0 && (d = free_slot()) >= 0) {
                op = "fork";
                stats.forks++;
                struct seq *s = &seqs[i], *t = &seqs[d];
                const int min_len = s->t.n * KV_BLOCK;
                if (kvt_init(&t->t, min_len + rnd(MAX_LEN - min_len + 1)) != GERBIL_OK) return 0;
                kvb_fork(&kb, &t->t, &s->t);
                t->used = 1;
                t->len = s->len;
                memcpy(t->val, s->val, (size_t)s->len * sizeof *s->val);
            } else if (r < 53 && (i = used_slot()) >= 0) {
                op = "truncate";
                stats.truncs++;
                struct seq *s = &seqs[i];
                const int n = rnd(4) == 0 ? s->len - rnd(s->len + 1) % 4 : rnd(s->len + 1);
                kvb_truncate(&kb, &s->t, n);
                s->len = n;
            } else if ((i = used_slot()) >= 0) {
                op = "append";
                sync_tabs();
                op_append(i, step);
            } else {
                continue;
            }
            sync_tabs();
            if (!check_all(step, op)) return 0;
        }
        for (int i = 0; i < MAX_TABS; i++)
            if (seqs[i].used) kvt_destroy(&kb, &seqs[i].t), seqs[i].used = 0;
        sync_tabs();
        CHECKF(kb.n_free == n_blocks, "seed %llu round %d: %d of %d blocks free after all sequences went", seed0,
               round, kb.n_free, n_blocks);
        kvb_destroy(&kb);
    }
    return 1;
}

int main(int argc, char **argv) {
    seed0 = argc > 1 ? strtoull(argv[1], NULL, 0)
                     : (unsigned long long)time(NULL) * 6364136223846793005ULL ^ (unsigned long long)getpid();
    if (!seed0) seed0 = 1; /* xorshift's one fixed point */
    rng = seed0;
    printf("seed %llu\n", seed0);

    unit_tests();
    CHECKF(random_run(60, 500), "seed %llu: the random run stopped at its first failure", seed0);
    printf("random: %d ops, %d appends (%d copies-on-write, %d pool full, %d over capacity), %d forks, %d truncates, "
           "%d new, %d freed\n", stats.ops, stats.appends, stats.copies, stats.full, stats.capacity, stats.forks,
           stats.truncs, stats.news, stats.frees);
    /* the mix must have reached every path */
    CHECK(stats.copies > 0 && stats.full > 0 && stats.capacity > 0 && stats.forks > 0 && stats.truncs > 0);
    return test_done();
}
