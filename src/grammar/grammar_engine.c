/* The grammar engine: a pushdown automaton over bytes driven through the vocabulary's
 * byte trie (design in grammar.h and docs/ARCHITECTURE.md). */
#include "grammar/grammar.h"
#include "base/status.h"
#include "base/timer.h"
#include "text/tok_bytes.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* MAX_NODES bounds the distinct parser stacks a grammar may build (about 40 bytes each):
 * an ambiguous grammar can have exponentially many, and past this it is refused as too
 * complex instead of eating memory and time. */
enum { MAX_DEPTH = 4096, TRUNC_K = 3, MAX_NODES = 1 << 21 };

/* ---- the vocabulary: token bytes and their trie ---- */
struct tnode {
    int32_t sub;   /* nodes in this subtree, itself included */
    int32_t tok;   /* first index into sorted[] of the tokens ending here, -1 if none */
    uint16_t depth;/* 1 = a child of the root */
    uint8_t b;
    uint8_t ntok;
};

struct gerbil_grammar_vocab {
    int n_vocab;          /* mask width: the model's vocabulary (>= the tokenizer's) */
    char *bytes;          /* all tokens' bytes */
    uint64_t *off;        /* [n_vocab + 1] */
    uint8_t *kind;        /* 0 text, 1 never allowed (special, empty, unknown), 2 EOS */
    int32_t *sorted;      /* token ids in trie order */
    struct tnode *trie;
    int n_trie, max_depth;
    struct top_cache *tops;
};

/* Walks of truncated states shared by every grammar compiled against this vocabulary,
 * keyed by the structure of what they can reach (grammar-independent): the string body,
 * numbers, keywords ... are walked once per process, not once per grammar. */
struct top_ent {
    uint64_t k1, k2;      /* k1 == 0: empty */
    uint64_t *acc;
    int32_t *roots;
    int n_roots;
};
struct top_cache {
    pthread_mutex_t mu;
    struct top_ent *e;
    size_t mask, n, bytes, budget;
};

static struct top_ent *top_find(struct top_cache *c, uint64_t k1, uint64_t k2) {
    if (!c->e) return NULL;
    for (size_t h = k1 & c->mask;; h = (h + 1) & c->mask) {
        if (!c->e[h].k1) return NULL;
        if (c->e[h].k1 == k1 && c->e[h].k2 == k2) return &c->e[h];
    }
}

/* takes ownership of acc/roots when it returns 1 */
static int top_put(struct top_cache *c, uint64_t k1, uint64_t k2, uint64_t *acc, int32_t *roots, int n_roots, size_t bytes) {
    if (c->bytes + bytes > c->budget) return 0;
    if (!c->e || (c->n + 1) * 2 > c->mask + 1) {
        size_t m = c->e ? (c->mask + 1) * 2 : 1024;
        struct top_ent *e = calloc(m, sizeof *e);
        if (!e) return 0;
        for (size_t i = 0; c->e && i <= c->mask; i++) {
            if (!c->e[i].k1) continue;
            size_t h = c->e[i].k1 & (m - 1);
            while (e[h].k1) h = (h + 1) & (m - 1);
            e[h] = c->e[i];
        }
        free(c->e);
        c->e = e;
        c->mask = m - 1;
    }
    size_t h = k1 & c->mask;
    while (c->e[h].k1) h = (h + 1) & c->mask;
    c->e[h] = (struct top_ent){k1, k2, acc, roots, n_roots};
    c->n++;
    c->bytes += bytes;
    return 1;
}

static void top_free(struct top_cache *c) {
    if (!c) return;
    for (size_t i = 0; c->e && i <= c->mask; i++)
        if (c->e[i].k1) { free(c->e[i].acc); free(c->e[i].roots); }
    free(c->e);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static int cmp_tok_bytes_ctx_sort(const struct gerbil_grammar_vocab *v, int32_t a, int32_t b) {
    size_t la = v->off[a + 1] - v->off[a], lb = v->off[b + 1] - v->off[b];
    size_t m = la < lb ? la : lb;
    int c = memcmp(v->bytes + v->off[a], v->bytes + v->off[b], m);
    if (c) return c;
    if (la != lb) return la < lb ? -1 : 1;
    return (a > b) - (a < b);
}

/* merge sort of ids by their bytes (qsort has no context argument in C11) */
static void sort_ids(const struct gerbil_grammar_vocab *v, int32_t *a, int32_t *tmp, int n) {
    if (n < 2) return;
    int h = n / 2;
    sort_ids(v, a, tmp, h);
    sort_ids(v, a + h, tmp, n - h);
    int i = 0, j = h, k = 0;
    while (i < h && j < n) tmp[k++] = cmp_tok_bytes_ctx_sort(v, a[i], a[j]) <= 0 ? a[i++] : a[j++];
    while (i < h) tmp[k++] = a[i++];
    while (j < n) tmp[k++] = a[j++];
    memcpy(a, tmp, (size_t)n * sizeof *a);
}

void gerbil_grammar_vocab_free(gerbil_grammar_vocab_t v) {
    if (!v) return;
    free(v->bytes);
    free(v->off);
    free(v->kind);
    free(v->sorted);
    free(v->trie);
    top_free(v->tops);
    free(v);
}

static void vocab_warm(struct gerbil_grammar_vocab *v);

gerbil_status gerbil_grammar_vocab_new(gerbil_tokenizer_t tok, int n_vocab, const int32_t *eos_ids, int n_eos,
                                       gerbil_grammar_vocab_t *out) {
    *out = NULL;
    if (!tok) return err_set(GERBIL_ERR_INVALID_ARG, "grammar: no tokenizer");
    int nt = gerbil_tokenizer_n_vocab(tok);
    if (n_vocab <= 0) n_vocab = nt;
    if (n_vocab < nt) n_vocab = nt;
    struct gerbil_grammar_vocab *v = calloc(1, sizeof *v);
    if (!v) return err_set(GERBIL_ERR_NOMEM, "grammar: out of memory");
    v->n_vocab = n_vocab;
    v->off = calloc((size_t)n_vocab + 1, sizeof *v->off);
    v->kind = calloc((size_t)n_vocab, 1);
    size_t cap = 1 << 20, used = 0;
    v->bytes = malloc(cap);
    if (!v->off || !v->kind || !v->bytes) goto oom;
    int mode = tok_bytes_mode(tok);
    for (int32_t id = 0; id < n_vocab; id++) {
        v->off[id] = used;
        char *b = NULL;
        size_t n = 0;
        int special = 0;
        if (id >= nt || tok_token_bytes(tok, mode, id, &b, &n, &special) < 0 || special || n == 0) {
            v->kind[id] = 1;
            free(b);
            continue;
        }
        if (used + n > cap) {
            while (used + n > cap) cap *= 2;
            char *q = realloc(v->bytes, cap);
            if (!q) { free(b); goto oom; }
            v->bytes = q;
        }
        memcpy(v->bytes + used, b, n);
        used += n;
        free(b);
    }
    v->off[n_vocab] = used;
    int32_t default_eos = gerbil_tokenizer_eos(tok);
    if (n_eos <= 0 && default_eos >= 0) { eos_ids = &default_eos; n_eos = 1; }
    for (int i = 0; i < n_eos; i++)
        if (eos_ids[i] >= 0 && eos_ids[i] < n_vocab) {
            v->kind[eos_ids[i]] = 2;
            v->off[eos_ids[i] + 1] = v->off[eos_ids[i] + 1]; /* keeps its bytes; never walked */
        }
    /* the trie over text tokens */
    int n_text = 0;
    for (int32_t id = 0; id < n_vocab; id++) n_text += v->kind[id] == 0;
    v->sorted = malloc((size_t)(n_text ? n_text : 1) * sizeof *v->sorted);
    int32_t *tmp = malloc((size_t)(n_text ? n_text : 1) * sizeof *tmp);
    if (!v->sorted || !tmp) { free(tmp); goto oom; }
    int k = 0;
    for (int32_t id = 0; id < n_vocab; id++)
        if (v->kind[id] == 0) v->sorted[k++] = id;
    sort_ids(v, v->sorted, tmp, n_text);
    free(tmp);
    size_t tcap = (size_t)n_text * 2 + 16;
    v->trie = malloc(tcap * sizeof *v->trie);
    int32_t path[MAX_DEPTH + 1];
    int plen = 0, nn = 0;
    const char *prev = NULL;
    if (!v->trie) goto oom;
    for (int i = 0; i < n_text; i++) {
        int32_t id = v->sorted[i];
        const char *s = v->bytes + v->off[id];
        int len = (int)(v->off[id + 1] - v->off[id]);
        if (len > MAX_DEPTH) len = MAX_DEPTH; /* never matched fully; harmless */
        int l = 0;
        while (prev && l < plen && l < len && (unsigned char)prev[l] == (unsigned char)s[l]) l++;
        while (plen > l) { plen--; v->trie[path[plen]].sub = nn - path[plen]; }
        for (; plen < len; plen++) {
            if ((size_t)nn == tcap) {
                tcap *= 2;
                void *q = realloc(v->trie, tcap * sizeof *v->trie);
                if (!q) goto oom;
                v->trie = q;
            }
            v->trie[nn] = (struct tnode){.sub = 0, .tok = -1, .depth = (uint16_t)(plen + 1), .b = (uint8_t)s[plen]};
            path[plen] = nn++;
        }
        struct tnode *t = &v->trie[path[len - 1]];
        if (t->tok < 0) t->tok = i;
        if (t->ntok < 255) t->ntok++;
        if (len > v->max_depth) v->max_depth = len;
        prev = s;
    }
    while (plen > 0) { plen--; v->trie[path[plen]].sub = nn - path[plen]; }
    v->n_trie = nn;
    v->tops = calloc(1, sizeof *v->tops);
    if (!v->tops) goto oom;
    pthread_mutex_init(&v->tops->mu, NULL);
    v->tops->budget = (size_t)512 << 20;
    vocab_warm(v);
    *out = v;
    return GERBIL_OK;
oom:
    gerbil_grammar_vocab_free(v);
    return err_set(GERBIL_ERR_NOMEM, "grammar: out of memory");
}

int gerbil_grammar_vocab_n(gerbil_grammar_vocab_t v) { return v ? v->n_vocab : 0; }

/* ---- the automaton ---- */
struct gnode {
    int32_t pos, parent, depth;
};

struct gstate {
    int32_t off, n;     /* node ids in g->lists */
    uint32_t hash;
    uint8_t accept;
    uint8_t unk;        /* a truncated stack popped into the unknown rest (node 1) */
    gbyteset first;     /* bytes some stack can take next */
    uint64_t *mask;     /* cached mask, or NULL */
    int32_t trunc;      /* the state with every stack cut to TRUNC_K frames; -2 unknown */
    /* for a truncated state: the tokens it accepts without reaching the unknown rest
     * (acc), and the trie nodes below which the answer depends on that rest (roots) */
    uint64_t *acc;
    int32_t *roots;
    int n_roots;
    uint8_t shared;     /* acc/roots belong to the vocabulary's cache */
    int8_t horizon;     /* a truncated state holding an alias target: its walk stops at
                         * GIR_HORIZON bytes (deeper subtrees become roots); -1 unknown */
};

struct gerbil_grammar {
    gir ir;
    const struct gerbil_grammar_vocab *v;
    pthread_mutex_t mu;
    struct gnode *nodes;
    int n_nodes, cap_nodes;
    int32_t *nslots;
    uint32_t nslot_mask;
    uint32_t *mark, epoch;
    int cap_mark;
    struct gstate *st;
    int n_st, cap_st;
    int32_t *sslots;
    uint32_t sslot_mask;
    int32_t *lists;
    size_t n_lists, cap_lists;
    int32_t *work, *out;
    int cap_work, n_work, cap_out, n_out;
    int accept_flag, unk_flag;
    int32_t **tr;       /* per state: [256] lazily; -2 unknown, -1 dead, else the next state */
    int cap_tr;
    int start;
    int words;
    size_t cached_bytes, cache_budget;
    int32_t *walk;      /* [max_depth + 1] */
    const int32_t **walk_row; /* [max_depth + 1] */
    int oom, overflow, toobig;
    int32_t *canon;     /* [n_el]: the first position whose rest of alternative equals this one's */
    int32_t *alias;     /* [n_el] over canonical positions: the position that behaves alike within
                         * GIR_HORIZON bytes (a long counter's), else itself */
    uint8_t *at_horizon;/* [n_el]: an alias target */
    int32_t *rnum, *rq;  /* structure hashing: rule numbers (-1: unseen), queue */
};

struct gerbil_grammar_state {
    gerbil_grammar_t g;
    int32_t s;          /* -1: dead */
    int finished;       /* EOS taken */
};

static uint32_t hash2(uint32_t a, uint32_t b) {
    uint64_t h = ((uint64_t)a << 32 | b) * 0x9e3779b97f4a7c15ULL;
    return (uint32_t)(h >> 32) ^ (uint32_t)h;
}

static int node_rehash(gerbil_grammar_t g) {
    uint32_t m = g->nslot_mask ? (g->nslot_mask + 1) * 2 : 1024;
    int32_t *s = malloc((size_t)m * sizeof *s);
    if (!s) return -1;
    memset(s, 0xff, (size_t)m * sizeof *s);
    for (int i = 2; i < g->n_nodes; i++) {
        uint32_t h = hash2((uint32_t)g->nodes[i].pos, (uint32_t)g->nodes[i].parent) & (m - 1);
        while (s[h] >= 0) h = (h + 1) & (m - 1);
        s[h] = i;
    }
    free(g->nslots);
    g->nslots = s;
    g->nslot_mask = m - 1;
    return 0;
}

/* node (pos, parent); -1 when too deep or out of memory */
static int32_t node_get(gerbil_grammar_t g, int32_t pos, int32_t parent) {
    pos = g->canon[pos];
    if ((uint32_t)g->n_nodes * 2 >= g->nslot_mask) {
        if (node_rehash(g)) { g->oom = 1; return -1; }
    }
    uint32_t h = hash2((uint32_t)pos, (uint32_t)parent) & g->nslot_mask;
    for (int32_t i; (i = g->nslots[h]) >= 0; h = (h + 1) & g->nslot_mask)
        if (g->nodes[i].pos == pos && g->nodes[i].parent == parent) return i;
    int depth = g->nodes[parent].depth + 1;
    if (depth > MAX_DEPTH) { g->overflow = 1; return -1; }
    if (g->n_nodes >= MAX_NODES) { g->toobig = 1; return -1; }
    if (g->n_nodes == g->cap_nodes) {
        int c = g->cap_nodes * 2;
        void *q = realloc(g->nodes, (size_t)c * sizeof *g->nodes);
        if (!q) { g->oom = 1; return -1; }
        g->nodes = q;
        g->cap_nodes = c;
    }
    if (g->n_nodes >= g->cap_mark) {
        int c = g->cap_mark * 2;
        uint32_t *q = realloc(g->mark, (size_t)c * sizeof *q);
        if (!q) { g->oom = 1; return -1; }
        memset(q + g->cap_mark, 0, (size_t)(c - g->cap_mark) * sizeof *q);
        g->mark = q;
        g->cap_mark = c;
    }
    g->nodes[g->n_nodes] = (struct gnode){pos, parent, depth};
    g->nslots[h] = g->n_nodes;
    return g->n_nodes++;
}

static void work_push(gerbil_grammar_t g, int32_t x) {
    if (x < 0) return;
    if (g->n_work == g->cap_work) {
        int c = g->cap_work ? g->cap_work * 2 : 256;
        void *q = realloc(g->work, (size_t)c * sizeof *g->work);
        if (!q) { g->oom = 1; return; }
        g->work = q;
        g->cap_work = c;
    }
    g->work[g->n_work++] = x;
}

static void out_push(gerbil_grammar_t g, int32_t x) {
    if (g->n_out == g->cap_out) {
        int c = g->cap_out ? g->cap_out * 2 : 256;
        void *q = realloc(g->out, (size_t)c * sizeof *g->out);
        if (!q) { g->oom = 1; return; }
        g->out = q;
        g->cap_out = c;
    }
    g->out[g->n_out++] = x;
}

/* The continuation after the element at pos in the frame of node's parent. */
static int32_t successor(gerbil_grammar_t g, int32_t pos, int32_t parent) {
    if (g->ir.el[pos + 1].kind == GE_END) return parent;
    return node_get(g, pos + 1, parent);
}

/* Close the worklist: expand rule references, pop finished frames; terminal tops go to
 * out, an emptied stack sets accept_flag. */
static void closure(gerbil_grammar_t g) {
    const gelem *el = g->ir.el;
    while (g->n_work) {
        int32_t x = g->work[--g->n_work];
        if (g->mark[x] == g->epoch) continue;
        g->mark[x] = g->epoch;
        if (x == 0) { g->accept_flag = 1; continue; }
        if (x == 1) { g->unk_flag = 1; continue; }
        int32_t pos = g->nodes[x].pos, parent = g->nodes[x].parent;
        gelem e = el[pos];
        if (e.kind == GE_BYTES) { out_push(g, x); continue; }
        if (e.kind == GE_END) { work_push(g, parent); continue; }
        const grule *r = &g->ir.rules[e.arg];
        int32_t cont = successor(g, pos, parent);
        if (cont < 0) continue;
        for (int a = 0; a < r->n_alts; a++) {
            int32_t p = r->alts[a];
            if (el[p].kind == GE_END) work_push(g, cont);
            else work_push(g, node_get(g, p, cont));
        }
    }
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static int state_rehash(gerbil_grammar_t g) {
    uint32_t m = g->sslot_mask ? (g->sslot_mask + 1) * 2 : 256;
    int32_t *s = malloc((size_t)m * sizeof *s);
    if (!s) return -1;
    memset(s, 0xff, (size_t)m * sizeof *s);
    for (int i = 0; i < g->n_st; i++) {
        uint32_t h = g->st[i].hash & (m - 1);
        while (s[h] >= 0) h = (h + 1) & (m - 1);
        s[h] = i;
    }
    free(g->sslots);
    g->sslots = s;
    g->sslot_mask = m - 1;
    return 0;
}

/* Intern the state out[0..n_out) + accept_flag; -1 if dead. */
static int32_t state_get(gerbil_grammar_t g) {
    if (g->oom) return -1;
    if (g->n_out == 0 && !g->accept_flag && !g->unk_flag) return -1;
    if (g->n_out > 1) qsort(g->out, (size_t)g->n_out, sizeof *g->out, cmp_i32); /* out may be NULL when empty */
    int m = 0;
    for (int i = 0; i < g->n_out; i++)
        if (!m || g->out[m - 1] != g->out[i]) g->out[m++] = g->out[i];
    g->n_out = m;
    uint32_t h = 0x811c9dc5u ^ (uint32_t)g->accept_flag ^ ((uint32_t)g->unk_flag << 1);
    for (int i = 0; i < g->n_out; i++) h = hash2(h, (uint32_t)g->out[i]);
    if ((uint32_t)g->n_st * 2 >= g->sslot_mask && state_rehash(g)) { g->oom = 1; return -1; }
    uint32_t k = h & g->sslot_mask;
    for (int32_t i; (i = g->sslots[k]) >= 0; k = (k + 1) & g->sslot_mask) {
        const struct gstate *s = &g->st[i];
        if (s->hash == h && s->n == g->n_out && s->accept == g->accept_flag && s->unk == g->unk_flag &&
            (!g->n_out || !memcmp(g->lists + s->off, g->out, (size_t)g->n_out * sizeof *g->out)))
            return i;
    }
    if (g->n_st == g->cap_st) {
        int c = g->cap_st ? g->cap_st * 2 : 256;
        void *q = realloc(g->st, (size_t)c * sizeof *g->st);
        if (!q) { g->oom = 1; return -1; }
        g->st = q;
        g->cap_st = c;
        q = realloc(g->tr, (size_t)c * sizeof *g->tr);
        if (!q) { g->oom = 1; return -1; }
        g->tr = q;
    }
    if (g->n_lists + (size_t)g->n_out > g->cap_lists) {
        size_t c = g->cap_lists ? g->cap_lists * 2 : 4096;
        while (c < g->n_lists + (size_t)g->n_out) c *= 2;
        void *q = realloc(g->lists, c * sizeof *g->lists);
        if (!q) { g->oom = 1; return -1; }
        g->lists = q;
        g->cap_lists = c;
    }
    struct gstate *s = &g->st[g->n_st];
    memset(s, 0, sizeof *s);
    s->off = (int32_t)g->n_lists;
    s->n = g->n_out;
    s->hash = h;
    s->accept = (uint8_t)g->accept_flag;
    s->unk = (uint8_t)g->unk_flag;
    s->trunc = -2;
    s->horizon = -1;
    g->tr[g->n_st] = NULL;
    if (g->n_out) memcpy(g->lists + g->n_lists, g->out, (size_t)g->n_out * sizeof *g->out); /* lists: NULL until used */
    g->n_lists += (size_t)g->n_out;
    for (int i = 0; i < g->n_out; i++) {
        const gbyteset *bs = &g->ir.sets[g->ir.el[g->nodes[g->out[i]].pos].arg];
        for (int w = 0; w < 4; w++) s->first.w[w] |= bs->w[w];
    }
    g->sslots[k] = g->n_st;
    return g->n_st++;
}

static void begin(gerbil_grammar_t g) {
    g->epoch++;
    if (g->epoch == 0) { memset(g->mark, 0, (size_t)g->cap_mark * sizeof *g->mark); g->epoch = 1; }
    g->n_work = g->n_out = 0;
    g->accept_flag = 0;
    g->unk_flag = 0;
}

static int32_t step_slow(gerbil_grammar_t g, int32_t s, unsigned b) {
    begin(g);
    int32_t off = g->st[s].off, n = g->st[s].n;
    for (int i = 0; i < n; i++) {
        int32_t x = g->lists[off + i];
        int32_t pos = g->nodes[x].pos;
        if (!gbs_has(&g->ir.sets[g->ir.el[pos].arg], b)) continue;
        work_push(g, successor(g, pos, g->nodes[x].parent));
        closure(g);
    }
    return state_get(g);
}

static int32_t step_fill(gerbil_grammar_t g, int32_t s, unsigned b) {
    if (!g->tr[s]) {
        int32_t *t = malloc(256 * sizeof *t);
        if (!t) { g->oom = 1; return -1; }
        for (int i = 0; i < 256; i++) t[i] = gbs_has(&g->st[s].first, (unsigned)i) ? -2 : -1;
        g->tr[s] = t;
        if (t[b] != -2) return t[b];
    }
    int32_t t = step_slow(g, s, b);
    if (!g->oom) g->tr[s][b] = t; /* g->tr may have moved */
    return t;
}

static inline int32_t step(gerbil_grammar_t g, int32_t s, unsigned b) {
    const int32_t *t = g->tr[s];
    if (t) {
        int32_t v = t[b];
        if (v != -2) return v;
    }
    return step_fill(g, s, b);
}

static void drop_masks(gerbil_grammar_t g) {
    for (int i = 0; i < g->n_st; i++) {
        free(g->st[i].mask);
        if (!g->st[i].shared) {
            free(g->st[i].acc);
            free(g->st[i].roots);
        }
        g->st[i].shared = 0;
        g->st[i].mask = g->st[i].acc = NULL;
        g->st[i].roots = NULL;
        g->st[i].n_roots = 0;
    }
    g->cached_bytes = 0;
}

/* node x with its ancestry cut after k frames (the rest: node 1, "unknown") */
static int32_t trunc_node(gerbil_grammar_t g, int32_t x, int k, int32_t cut) {
    if (x <= 1) return x;
    if (k == 0 || x == cut) return 1;
    int32_t p = trunc_node(g, g->nodes[x].parent, k - 1, cut);
    if (p < 0) return -1;
    return node_get(g, g->alias[g->nodes[x].pos], p);
}

/* The nearest frame below the tops that every stack of s passes through within TRUNC_K
 * frames, or -1. Everything from there down is one context (what follows a string, a
 * number, a value ...), so cutting there makes the walk the same wherever the construct
 * sits: every string value of every schema shares the string body's walk, and only the
 * tokens that leave it (roots) are walked again from s. */
static int32_t common_cut(gerbil_grammar_t g, int32_t s) {
    const int32_t *l = g->lists + g->st[s].off;
    const int n = g->st[s].n;
    if (n < 2) return -1;
    int32_t a = g->nodes[l[0]].parent;
    for (int k = 0; k < TRUNC_K && a > 1; k++, a = g->nodes[a].parent) {
        int all = 1;
        for (int i = 0; i < n && all; i++) {
            if (l[i] == a) { all = 0; break; } /* a is some stack's top */
            int found = 0;
            int32_t x = g->nodes[l[i]].parent;
            for (int j = 0; j < TRUNC_K && x > 1 && !found; j++, x = g->nodes[x].parent) found = x == a;
            all = found;
        }
        if (all) return a;
    }
    return -1;
}

/* whether truncated state t holds a frame at an alias target (its walk needs the horizon) */
static int state_horizon(gerbil_grammar_t g, int32_t t) {
    if (g->st[t].horizon < 0) {
        int h = 0;
        for (int i = 0; i < g->st[t].n && !h; i++)
            for (int32_t x = g->lists[g->st[t].off + i]; x > 1 && !h; x = g->nodes[x].parent) h = g->at_horizon[g->nodes[x].pos];
        g->st[t].horizon = (int8_t)h;
    }
    return g->st[t].horizon;
}

/* the truncated state of s: every stack cut to TRUNC_K frames or at the frame they all pass
 * through, and long counters aliased to their horizon rule; -1 when that changes nothing
 * (nothing to share) */
static int32_t trunc_state(gerbil_grammar_t g, int32_t s) {
    if (g->st[s].trunc != -2) return g->st[s].trunc;
    int32_t t = -1;
    if (!g->st[s].unk) {
        const int32_t cut = common_cut(g, s);
        begin(g);
        int changed = 0;
        for (int i = 0; i < g->st[s].n; i++) {
            int32_t x0 = g->lists[g->st[s].off + i], x = trunc_node(g, x0, TRUNC_K, cut);
            if (x < 0) { g->st[s].trunc = -1; return -1; }
            changed |= x != x0;
            out_push(g, x);
        }
        g->accept_flag = g->st[s].accept;
        /* nothing cut and no counter aliased: the state itself (walked in full) */
        t = changed ? state_get(g) : -1;
    }
    g->st[s].trunc = t;
    return t;
}

/* ---- the structure a truncated state can reach, hashed (grammar-independent) ---- */
struct h2 { uint64_t a, b; };
static inline void hmix(struct h2 *h, uint64_t x) {
    h->a = (h->a ^ x) * 0x100000001b3ULL;
    h->a ^= h->a >> 29;
    h->b = (h->b + x + 0x9e3779b97f4a7c15ULL) * 0xff51afd7ed558ccdULL;
    h->b ^= h->b >> 31;
}

/* elements from pos to the end of its alternative; rules numbered on first sight */
static int hash_from(gerbil_grammar_t g, struct h2 *h, int32_t pos, int *nq, long *budget) {
    for (;; pos++) {
        gelem e = g->ir.el[pos];
        if (--*budget < 0) return -1;
        if (e.kind == GE_END) { hmix(h, 0xE0D); return 0; }
        if (e.kind == GE_BYTES) {
            const gbyteset *bs = &g->ir.sets[e.arg];
            hmix(h, 0xB1);
            for (int w = 0; w < 4; w++) hmix(h, bs->w[w]);
        } else {
            if (g->rnum[e.arg] < 0) { g->rnum[e.arg] = *nq; g->rq[(*nq)++] = (int32_t)e.arg; }
            hmix(h, 0x7E);
            hmix(h, (uint64_t)g->rnum[e.arg]);
        }
    }
}

static int hash_node(gerbil_grammar_t g, int32_t x, struct h2 *out) {
    struct h2 h = {0xcbf29ce484222325ULL, 0x6a09e667f3bcc908ULL};
    int nq = 0, rc = 0;
    long budget = 20000;
    for (; x > 1 && rc == 0; x = g->nodes[x].parent) rc = hash_from(g, &h, g->nodes[x].pos, &nq, &budget);
    hmix(&h, x == 0 ? 0xACCE : 0x0BAD);
    for (int i = 0; i < nq && rc == 0; i++) {
        const grule *r = &g->ir.rules[g->rq[i]];
        hmix(&h, 0xA17 + (uint64_t)r->n_alts);
        for (int a = 0; a < r->n_alts && rc == 0; a++) rc = hash_from(g, &h, r->alts[a], &nq, &budget);
    }
    for (int i = 0; i < nq; i++) g->rnum[g->rq[i]] = -1;
    *out = h;
    return rc;
}

static int cmp_h2(const void *x, const void *y) {
    const struct h2 *a = x, *b = y;
    if (a->a != b->a) return a->a < b->a ? -1 : 1;
    return (a->b > b->b) - (a->b < b->b);
}

/* the key of truncated state t; 0 when too big to hash */
static int state_key(gerbil_grammar_t g, int32_t t, uint64_t *k1, uint64_t *k2) {
    int n = g->st[t].n;
    if (n > 256) return 0;
    if (!g->rnum) {
        g->rnum = malloc((size_t)g->ir.n_rules * sizeof *g->rnum);
        g->rq = malloc((size_t)g->ir.n_rules * sizeof *g->rq);
        if (!g->rnum || !g->rq) return 0;
        for (int i = 0; i < g->ir.n_rules; i++) g->rnum[i] = -1;
    }
    struct h2 hs[256];
    for (int i = 0; i < n; i++)
        if (hash_node(g, g->lists[g->st[t].off + i], &hs[i])) return 0;
    qsort(hs, (size_t)n, sizeof *hs, cmp_h2);
    struct h2 h = {0x243f6a8885a308d3ULL, 0x13198a2e03707344ULL};
    hmix(&h, g->st[t].accept);
    hmix(&h, state_horizon(g, t) ? 0x4012 : 0); /* a horizon walk's acc/roots differ from a full one's */
    for (int i = 0; i < n; i++) { hmix(&h, hs[i].a); hmix(&h, hs[i].b); }
    *k1 = h.a | 1;
    *k2 = h.b;
    return 1;
}

/* Walk the trie nodes [from, to) whose parent state is walk[depth(from) - 1]. For a
 * truncated state (roots != NULL), a node reaching a state that touched the unknown rest,
 * or as deep as horizon (a token that long can tell an aliased counter from the real one),
 * is recorded as a root and its subtree skipped. */
static void walk_trie(gerbil_grammar_t g, int from, int to, uint64_t *bits, int32_t **roots, int *n_roots, int *cap_roots,
                      int horizon) {
    const struct gerbil_grammar_vocab *v = g->v;
    const struct tnode *T = v->trie;
    int32_t *walk = g->walk;
    /* row[d]: the transition row of walk[d] (rows never move once made; NULL: not made yet) */
    const int32_t **row = g->walk_row;
    if (from < to) row[T[from].depth - 1] = g->tr[walk[T[from].depth - 1]];
    for (int i = from; i < to;) {
        const struct tnode *t = &T[i];
        const int d = t->depth;
        int32_t ns;
        if (d >= horizon) ns = 1; /* any live state: a root below */
        else {
            const int32_t *r = row[d - 1];
            ns = r ? r[t->b] : -2;
            if (ns == -2) { ns = step_fill(g, walk[d - 1], t->b); row[d - 1] = g->tr[walk[d - 1]]; }
        }
        if (ns < 0) { i += t->sub; continue; }
        if (roots && (t->depth >= horizon || g->st[ns].unk)) {
            if (*n_roots == *cap_roots) {
                int c = *cap_roots ? *cap_roots * 2 : 64;
                int32_t *q = realloc(*roots, (size_t)c * sizeof *q);
                if (!q) { g->oom = 1; return; }
                *roots = q;
                *cap_roots = c;
            }
            (*roots)[(*n_roots)++] = i;
            i += t->sub;
            continue;
        }
        walk[d] = ns;
        row[d] = g->tr[ns];
        if (t->tok >= 0)
            for (int k = 0; k < t->ntok; k++) {
                int32_t id = v->sorted[t->tok + k];
                bits[id >> 6] |= 1ULL << (id & 63);
            }
        i++;
    }
}

/* Compute the mask of state s into bits (n words). States deep in a grammar share the
 * work through their truncated state (every stack cut to its top TRUNC_K frames, as
 * XGrammar splits context-independent from context-dependent tokens): its walk gives the
 * tokens accepted whatever lies below (acc) and the trie subtrees that depend on it
 * (roots); only those subtrees are walked again from s itself. */
static void compute_mask(gerbil_grammar_t g, int32_t s, uint64_t *bits) {
    const struct gerbil_grammar_vocab *v = g->v;
    const size_t wb = (size_t)g->words * sizeof(uint64_t);
    if (g->st[s].mask) { memcpy(bits, g->st[s].mask, wb); return; }
    memset(bits, 0, wb);
    int32_t t = trunc_state(g, s);
    if (t >= 0) {
        if (!g->st[t].acc) {
            uint64_t k1 = 0, k2 = 0;
            struct top_cache *tc = v->tops;
            int keyed = state_key(g, t, &k1, &k2);
            if (keyed) {
                pthread_mutex_lock(&tc->mu);
                struct top_ent *e = top_find(tc, k1, k2);
                if (e) {
                    g->st[t].acc = e->acc;
                    g->st[t].roots = e->roots;
                    g->st[t].n_roots = e->n_roots;
                    g->st[t].shared = 1;
                }
                pthread_mutex_unlock(&tc->mu);
            }
            if (!g->st[t].acc) {
                uint64_t *acc = calloc(1, wb);
                int32_t *roots = NULL;
                int n_roots = 0, cap_roots = 0;
                if (!acc) { g->oom = 1; return; }
                g->walk[0] = t;
                walk_trie(g, 0, v->n_trie, acc, &roots, &n_roots, &cap_roots, state_horizon(g, t) ? GIR_HORIZON : 1 << 30);
                g->st[t].acc = acc;
                g->st[t].roots = roots;
                g->st[t].n_roots = n_roots;
                int put = 0;
                if (keyed && !g->oom) {
                    pthread_mutex_lock(&tc->mu);
                    if (!top_find(tc, k1, k2)) put = top_put(tc, k1, k2, acc, roots, n_roots, wb + (size_t)n_roots * 4);
                    pthread_mutex_unlock(&tc->mu);
                }
                if (put) g->st[t].shared = 1;
                else g->cached_bytes += wb + (size_t)n_roots * 4;
            }
        }
        memcpy(bits, g->st[t].acc, wb);
        const int32_t *roots = g->st[t].roots;
        int n_roots = g->st[t].n_roots;
        for (int r = 0; r < n_roots && !g->oom; r++) {
            int i = roots[r];
            const struct tnode *tn = &v->trie[i];
            int d = tn->depth;
            /* the state of s after the d - 1 bytes above node i (any token below i has them) */
            int j = i;
            while (v->trie[j].tok < 0) j++;
            const char *pre = v->bytes + v->off[v->sorted[v->trie[j].tok]];
            int32_t cur = s;
            g->walk[0] = s;
            for (int k = 0; k < d - 1 && cur >= 0; k++) { cur = step(g, cur, (unsigned char)pre[k]); g->walk[k + 1] = cur; }
            if (cur < 0) continue;
            walk_trie(g, i, i + tn->sub, bits, NULL, NULL, NULL, 1 << 30);
        }
    } else {
        g->walk[0] = s;
        walk_trie(g, 0, v->n_trie, bits, NULL, NULL, NULL, 1 << 30);
    }
    if (g->st[s].accept)
        for (int id = 0; id < v->n_vocab; id++)
            if (v->kind[id] == 2) bits[id >> 6] |= 1ULL << (id & 63);
    if (g->cached_bytes + wb > g->cache_budget) drop_masks(g);
    uint64_t *c = malloc(wb);
    if (c) {
        memcpy(c, bits, wb);
        g->st[s].mask = c;
        g->cached_bytes += wb;
    }
}

/* ---- public API ---- */
gerbil_grammar_params gerbil_grammar_default_params(void) {
    return (gerbil_grammar_params){.compact = 0, .max_whitespace = 0};
}

void gerbil_grammar_free(gerbil_grammar_t g) {
    if (!g) return;
    drop_masks(g);
    for (int i = 0; i < g->n_st; i++) free(g->tr[i]);
    free(g->tr);
    free(g->st);
    free(g->sslots);
    free(g->lists);
    free(g->nodes);
    free(g->nslots);
    free(g->mark);
    free(g->work);
    free(g->out);
    free(g->walk);
    free(g->walk_row);
    free(g->rnum);
    free(g->canon);
    free(g->alias);
    free(g->at_horizon);
    free(g->rq);
    gir_free(&g->ir);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

static gerbil_status build_ir(gir *ir, gerbil_grammar_kind kind, const char *src, size_t len,
                              const gerbil_grammar_params *p) {
    gschema_opts o = {.compact = p->compact, .max_ws = p->max_whitespace};
    switch (kind) {
    case GERBIL_GRAMMAR_GBNF: return gir_from_gbnf(ir, src, len);
    case GERBIL_GRAMMAR_REGEX: {
        int r = -1;
        GB_TRY(gir_from_regex(ir, src, len, GRX_PLAIN, 0, &r));
        ir->root = r;
        return GERBIL_OK;
    }
    case GERBIL_GRAMMAR_JSON_OBJECT: {
        ir->root = gir_json_object(ir, &o);
        return GERBIL_OK;
    }
    case GERBIL_GRAMMAR_JSON_SCHEMA: {
        cJSON *j = cJSON_ParseWithLength(src, len);
        if (!j) return err_set(GERBIL_ERR_FORMAT, "JSON Schema: not valid JSON (near byte %ld)",
                               (long)(cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() - src : 0));
        gerbil_status st = gir_from_schema(ir, j, &o);
        cJSON_Delete(j);
        return st;
    }
    case GERBIL_GRAMMAR_SEQUENCE: {
        cJSON *j = cJSON_ParseWithLength(src, len);
        if (!j) return err_set(GERBIL_ERR_FORMAT, "grammar sequence: not valid JSON");
        gerbil_status st = gir_from_sequence(ir, j, &o);
        cJSON_Delete(j);
        return st;
    }
    }
    return err_set(GERBIL_ERR_INVALID_ARG, "grammar: unknown kind %d", (int)kind);
}

static gerbil_status engine_err(gerbil_grammar_t g);

/* Positions whose rests of alternative are the same element sequence behave the same, so
 * nodes are keyed by one representative (the first such position): stacks that differ
 * only in which copy of a sequence they sit in (X+ compiles to "X tail" and "tail ::= X
 * tail", so (X+)+ would otherwise double the stacks at every level) become one stack. */
static int canon_positions(gerbil_grammar_t g) {
    int n = g->ir.n_el;
    g->canon = malloc((size_t)(n ? n : 1) * sizeof *g->canon);
    uint32_t m = 64;
    while (m < (uint32_t)n * 2) m *= 2;
    int32_t *slot = malloc((size_t)m * sizeof *slot);
    if (!g->canon || !slot) { free(slot); return -1; }
    memset(slot, 0xff, (size_t)m * sizeof *slot);
    for (int pos = n - 1; pos >= 0; pos--) {
        gelem e = g->ir.el[pos];
        if (e.kind == GE_END) { g->canon[pos] = pos; continue; } /* never a node */
        /* the rest after an element ending its alternative: -1 for every END */
        int32_t next = g->ir.el[pos + 1].kind == GE_END ? -1 : g->canon[pos + 1];
        uint32_t key = (uint32_t)e.kind << 30 | e.arg;
        uint32_t h = hash2(key, (uint32_t)next) & (m - 1);
        int32_t i;
        for (; (i = slot[h]) >= 0; h = (h + 1) & (m - 1)) {
            gelem f = g->ir.el[i];
            int32_t fnext = g->ir.el[i + 1].kind == GE_END ? -1 : g->canon[i + 1];
            if (f.kind == e.kind && f.arg == e.arg && fnext == next) break;
        }
        if (i < 0) { slot[h] = pos; i = pos; }
        g->canon[pos] = i;
    }
    free(slot);
    /* long counters: opt_k's positions alias opt_{GIR_HORIZON + 1}'s (grammar.h) */
    g->alias = malloc((size_t)(n ? n : 1) * sizeof *g->alias);
    g->at_horizon = calloc((size_t)(n ? n : 1), 1);
    if (!g->alias || !g->at_horizon) return -1;
    for (int pos = 0; pos < n; pos++) g->alias[pos] = pos;
    for (int r = 0; r < g->ir.n_rules; r++) {
        const grule *ru = &g->ir.rules[r];
        if (!ru->horizon_of || ru->n_alts < 1) continue;
        const grule *to = &g->ir.rules[ru->horizon_of - 1];
        for (int j = 0; j < 2; j++) { /* x, then the rest of the counter */
            int32_t a = g->canon[ru->alts[0] + j], b = g->canon[to->alts[0] + j];
            g->alias[a] = b;
            g->at_horizon[b] = 1;
        }
    }
    return 0;
}

gerbil_status gerbil_grammar_compile(gerbil_grammar_vocab_t v, gerbil_grammar_kind kind, const char *src,
                                     size_t len, const gerbil_grammar_params *p, gerbil_grammar_t *out) {
    *out = NULL;
    if (!v || (!src && kind != GERBIL_GRAMMAR_JSON_OBJECT))
        return err_set(GERBIL_ERR_INVALID_ARG, "gerbil_grammar_compile: NULL argument");
    gerbil_grammar_params dp = gerbil_grammar_default_params();
    if (!p) p = &dp;
    struct gerbil_grammar *g = calloc(1, sizeof *g);
    if (!g) return err_set(GERBIL_ERR_NOMEM, "grammar: out of memory");
    pthread_mutex_init(&g->mu, NULL);
    gir_init(&g->ir);
    g->v = v;
    g->words = (v->n_vocab + 63) / 64;
    g->cache_budget = (size_t)256 << 20;
    gerbil_status st = build_ir(&g->ir, kind, src, len, p);
    if (st == GERBIL_OK) st = gir_check(&g->ir);
    if (st != GERBIL_OK) { gerbil_grammar_free(g); return st; }
    if (canon_positions(g)) { gerbil_grammar_free(g); return err_set(GERBIL_ERR_NOMEM, "grammar: out of memory"); }
    g->cap_nodes = 1024;
    g->cap_mark = 1024;
    g->nodes = malloc((size_t)g->cap_nodes * sizeof *g->nodes);
    g->mark = calloc((size_t)g->cap_mark, sizeof *g->mark);
    g->walk = malloc(((size_t)v->max_depth + 2) * sizeof *g->walk);
    g->walk_row = malloc(((size_t)v->max_depth + 2) * sizeof *g->walk_row);
    if (!g->nodes || !g->mark || !g->walk || !g->walk_row || node_rehash(g)) { gerbil_grammar_free(g); return err_set(GERBIL_ERR_NOMEM, "grammar: out of memory"); }
    g->nodes[0] = (struct gnode){-1, -1, 0}; /* the empty stack: the grammar is complete */
    g->nodes[1] = (struct gnode){-2, -1, 0}; /* the unknown rest of a truncated stack */
    g->n_nodes = 2;
    begin(g);
    const grule *root = &g->ir.rules[g->ir.root];
    for (int a = 0; a < root->n_alts; a++) {
        int32_t pos = root->alts[a];
        work_push(g, g->ir.el[pos].kind == GE_END ? 0 : node_get(g, pos, 0));
        closure(g);
    }
    g->start = state_get(g);
    if (g->oom || g->toobig) { st = engine_err(g); gerbil_grammar_free(g); return st; }
    if (g->start < 0) { gerbil_grammar_free(g); return err_set(GERBIL_ERR_FORMAT, "grammar: matches nothing"); }
    *out = g;
    return GERBIL_OK;
}

gerbil_status gerbil_grammar_state_new(gerbil_grammar_t g, gerbil_grammar_state_t *out) {
    *out = NULL;
    if (!g) return err_set(GERBIL_ERR_INVALID_ARG, "gerbil_grammar_state_new: NULL grammar");
    struct gerbil_grammar_state *s = calloc(1, sizeof *s);
    if (!s) return err_set(GERBIL_ERR_NOMEM, "grammar: out of memory");
    s->g = g;
    s->s = g->start;
    *out = s;
    return GERBIL_OK;
}

void gerbil_grammar_state_free(gerbil_grammar_state_t s) { free(s); }

void gerbil_grammar_state_reset(gerbil_grammar_state_t s) {
    s->s = s->g->start;
    s->finished = 0;
}

void gerbil_grammar_state_copy(gerbil_grammar_state_t dst, gerbil_grammar_state_t src) {
    dst->g = src->g;
    dst->s = src->s;
    dst->finished = src->finished;
}

int gerbil_grammar_mask_words(gerbil_grammar_t g) { return g ? g->words : 0; }

static gerbil_status engine_err(gerbil_grammar_t g) {
    if (g->oom) return err_set(GERBIL_ERR_NOMEM, "grammar: out of memory");
    if (g->toobig)
        return err_set(GERBIL_ERR_UNSUPPORTED,
                       "grammar: too ambiguous to follow (over %d parser stacks; nested repetitions such as (a+)+ "
                       "or overlapping alternatives multiply them)", MAX_NODES);
    return err_set(GERBIL_ERR_UNSUPPORTED, "grammar: nesting deeper than %d", MAX_DEPTH);
}

gerbil_status gerbil_grammar_mask(gerbil_grammar_state_t s, uint64_t *bits) {
    gerbil_grammar_t g = s->g;
    if (s->finished || s->s < 0) {
        memset(bits, 0, (size_t)g->words * sizeof *bits);
        return GERBIL_OK;
    }
    pthread_mutex_lock(&g->mu);
    compute_mask(g, s->s, bits);
    gerbil_status st = g->oom || g->toobig ? engine_err(g) : GERBIL_OK;
    pthread_mutex_unlock(&g->mu);
    return st;
}

/* Feed bytes; returns how many were accepted (all of them on success). */
size_t gerbil_grammar_accept_bytes(gerbil_grammar_state_t s, const char *p, size_t n) {
    gerbil_grammar_t g = s->g;
    if (s->finished || s->s < 0) return 0;
    pthread_mutex_lock(&g->mu);
    size_t i = 0;
    for (; i < n; i++) {
        int32_t t = step(g, s->s, (unsigned char)p[i]);
        if (t < 0) break;
        s->s = t;
    }
    pthread_mutex_unlock(&g->mu);
    return i;
}

gerbil_status gerbil_grammar_accept_token(gerbil_grammar_state_t s, int32_t id) {
    gerbil_grammar_t g = s->g;
    const struct gerbil_grammar_vocab *v = g->v;
    if (id < 0 || id >= v->n_vocab) return err_set(GERBIL_ERR_INVALID_ARG, "grammar: token %d outside the vocabulary", (int)id);
    if (s->finished || s->s < 0) return err_set(GERBIL_ERR_INVALID_ARG, "grammar: the constraint has already ended");
    if (v->kind[id] == 2) {
        if (!g->st[s->s].accept) return err_set(GERBIL_ERR_INVALID_ARG, "grammar: end of sequence (token %d) before the grammar is complete", (int)id);
        s->finished = 1;
        return GERBIL_OK;
    }
    if (v->kind[id] == 1) return err_set(GERBIL_ERR_INVALID_ARG, "grammar: token %d (special or empty) is not allowed", (int)id);
    pthread_mutex_lock(&g->mu);
    int32_t cur = s->s;
    for (uint64_t k = v->off[id]; k < v->off[id + 1] && cur >= 0; k++) cur = step(g, cur, (unsigned char)v->bytes[k]);
    int bad = g->oom || g->overflow || g->toobig;
    pthread_mutex_unlock(&g->mu);
    if (cur < 0) {
        if (bad) return engine_err(g);
        return err_set(GERBIL_ERR_INVALID_ARG, "grammar: token %d does not fit the grammar here", (int)id);
    }
    s->s = cur;
    return GERBIL_OK;
}

int gerbil_grammar_is_accepting(gerbil_grammar_state_t s) {
    return s->finished || (s->s >= 0 && s->g->st[s->s].accept);
}

int gerbil_grammar_is_finished(gerbil_grammar_state_t s) {
    if (s->finished) return 1;
    if (s->s < 0) return 1;
    const struct gstate *S = &s->g->st[s->s];
    return S->accept && !(S->first.w[0] | S->first.w[1] | S->first.w[2] | S->first.w[3]);
}

size_t gerbil_grammar_forced_bytes(gerbil_grammar_state_t s, char *buf, size_t cap) {
    gerbil_grammar_t g = s->g;
    if (s->finished || s->s < 0) return 0;
    pthread_mutex_lock(&g->mu);
    size_t n = 0;
    int32_t cur = s->s;
    while (n < cap && cur >= 0 && !g->st[cur].accept) {
        const gbyteset *f = &g->st[cur].first;
        int cnt = __builtin_popcountll(f->w[0]) + __builtin_popcountll(f->w[1]) + __builtin_popcountll(f->w[2]) +
                  __builtin_popcountll(f->w[3]);
        if (cnt != 1) break;
        unsigned b = 0;
        while (!gbs_has(f, b)) b++;
        int32_t t = step(g, cur, b);
        if (t < 0) break;
        buf[n++] = (char)b;
        cur = t;
    }
    pthread_mutex_unlock(&g->mu);
    return n;
}

int32_t gerbil_grammar_forced_token(gerbil_grammar_state_t s, uint64_t *scratch) {
    gerbil_grammar_t g = s->g;
    if (gerbil_grammar_mask(s, scratch) != GERBIL_OK) return -1;
    int32_t found = -1;
    for (int w = 0; w < g->words; w++) {
        if (!scratch[w]) continue;
        if (found >= 0 || (scratch[w] & (scratch[w] - 1))) return -1;
        found = w * 64 + __builtin_ctzll(scratch[w]);
    }
    return found;
}

void gerbil_grammar_stats(gerbil_grammar_t g, int *n_states, int *n_nodes, int *n_rules) {
    if (n_states) *n_states = g->n_st;
    if (n_nodes) *n_nodes = g->n_nodes;
    if (n_rules) *n_rules = g->ir.n_rules;
}

/* Fill the vocabulary's cache with the walks every JSON constraint needs (string bodies,
 * numbers, literals, the starts of values) by computing the masks along a small document,
 * so that a grammar's first masks in those places are cache hits (a per-model precompute,
 * like XGrammar's per-tokenizer one). Failures here only leave the cache colder. */
static void vocab_warm(struct gerbil_grammar_vocab *v) {
    static const char doc[] = "{\"a\": \"text \\n\\u00e9\u00e9\", \"b\": -1.5e3, \"c\": [true, false, null, 12], \"d\": {}}";
    gerbil_grammar_t g = NULL;
    for (int flex = 0; flex < 2; flex++) {
        gerbil_grammar_params p = gerbil_grammar_default_params();
        p.compact = !flex;
        if (gerbil_grammar_compile(v, GERBIL_GRAMMAR_JSON_OBJECT, "", 0, &p, &g) != GERBIL_OK) return;
        gerbil_grammar_state_t st = NULL;
        uint64_t *m = malloc((size_t)g->words * sizeof *m);
        if (m && gerbil_grammar_state_new(g, &st) == GERBIL_OK) {
            for (size_t i = 0; i < sizeof doc - 1; i++) {
                if (flex || doc[i] != ' ' || (i > 0 && doc[i - 1] == 't')) {
                    gerbil_grammar_mask(st, m);
                    if (gerbil_grammar_accept_bytes(st, doc + i, 1) != 1) break;
                }
            }
        }
        gerbil_grammar_state_free(st);
        free(m);
        gerbil_grammar_free(g);
        g = NULL;
    }
    err_clear();
}
