/* BPE model (tokenizers/src/models/bpe): characters of a word merged by rank with a
 * min-heap over (rank, position) and a linked list of symbols, O(n log n) per word;
 * whole words are cached. */
#include "text/tok_internal.h"
#include "io/json.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- word cache: piece bytes -> ids; bounded, filled until full (as HF's) ---- */
#define CACHE_MAX_WORDS 200000
#define CACHE_MAX_LEN 256

struct tk_bpe_cache {
    pthread_mutex_t lock;
    tk_strmap words; /* word -> offset into ids (count stored first) */
    tk_ids ids;
};

static struct tk_bpe_cache *cache_new(void) {
    struct tk_bpe_cache *c = calloc(1, sizeof *c);
    if (c) pthread_mutex_init(&c->lock, NULL);
    return c;
}

static void cache_free(struct tk_bpe_cache *c) {
    if (!c) return;
    pthread_mutex_destroy(&c->lock);
    tk_strmap_free(&c->words);
    tk_ids_free(&c->ids);
    free(c);
}

/* Append the cached ids of s to out; 1 on a hit. */
static int cache_get(struct tk_bpe_cache *c, const char *s, size_t n, tk_ids *out) {
    int hit = 0;
    pthread_mutex_lock(&c->lock);
    int64_t e = tk_strmap_find(&c->words, s, n);
    if (e >= 0) {
        size_t at = (size_t)c->words.ents[e].val;
        int32_t k = c->ids.v[at];
        hit = 1;
        for (int32_t i = 0; i < k; i++)
            if (tk_ids_push(out, c->ids.v[at + 1 + (size_t)i])) { hit = -1; break; }
    }
    pthread_mutex_unlock(&c->lock);
    return hit;
}

static void cache_put(struct tk_bpe_cache *c, const char *s, size_t n, const int32_t *ids, size_t k) {
    if (n > CACHE_MAX_LEN) return;
    pthread_mutex_lock(&c->lock);
    if (c->words.n < CACHE_MAX_WORDS && c->ids.n < (size_t)INT32_MAX / 2 && tk_strmap_find(&c->words, s, n) < 0) {
        size_t at = c->ids.n;
        int ok = !tk_ids_push(&c->ids, (int32_t)k);
        for (size_t i = 0; ok && i < k; i++) ok = !tk_ids_push(&c->ids, ids[i]);
        if (ok) tk_strmap_put(&c->words, s, n, (int32_t)at);
        else c->ids.n = at;
    }
    pthread_mutex_unlock(&c->lock);
}

/* ---- build ---- */
static char *opt_str(const cJSON *cfg, const char *key, size_t *len) {
    const char *s = json_get_str(cfg, key, NULL);
    if (!s || !s[0]) { *len = 0; return NULL; }
    *len = strlen(s);
    char *d = malloc(*len + 1);
    if (d) memcpy(d, s, *len + 1);
    return d;
}

gerbil_status tk_bpe_build(tk_model *m, const cJSON *cfg, tk_rawvocab *rv, const char *path) {
    if (rv->is_list) return err_set(GERBIL_ERR_FORMAT, "%s: BPE model.vocab must be an object", path);
    m->prefix = opt_str(cfg, "continuing_subword_prefix", &m->prefix_len);
    m->suffix = opt_str(cfg, "end_of_word_suffix", &m->suffix_len);
    m->fuse_unk = json_get_bool(cfg, "fuse_unk", 0);
    m->byte_fallback = json_get_bool(cfg, "byte_fallback", 0);
    m->ignore_merges = json_get_bool(cfg, "ignore_merges", 0);
    /* dropout is sampling during training; encoding here is the deterministic dropout=0 path */
    const char *unk = json_get_str(cfg, "unk_token", NULL);
    m->unk_id = unk ? tk_strmap_get(&m->vocab, unk, strlen(unk), -1) : -1;
    if (unk && m->unk_id < 0)
        return err_set(GERBIL_ERR_FORMAT, "%s: model.unk_token \"%s\" is not in the vocabulary", path, unk);
    for (int b = 0; b < 256; b++) {
        char tok[8];
        snprintf(tok, sizeof tok, "<0x%02X>", b);
        m->byte_ids[b] = tk_strmap_get(&m->vocab, tok, 6, -1);
    }
    tk_buf tmp = {0};
    gerbil_status st = GERBIL_OK;
    if (tk_u64map_reserve(&m->merges, rv->n_merges)) return GERBIL_ERR_NOMEM;
    /* merges in chunks: the three vocabulary lookups of each (left, right, merged) go
     * through one batched lookup */
    enum { CHUNK = TK_BATCH / 3 };
    const char *keys[TK_BATCH];
    size_t lens[TK_BATCH], moff[CHUNK];
    int64_t ent[TK_BATCH];
    for (size_t i0 = 0; i0 < rv->n_merges && st == GERBIL_OK; i0 += CHUNK) {
        size_t cnt = rv->n_merges - i0 < CHUNK ? rv->n_merges - i0 : CHUNK;
        tmp.n = 0;
        for (size_t c = 0; c < cnt; c++) {
            const uint32_t *mm = rv->m_off + (i0 + c) * 4;
            const char *b = rv->strs.p + mm[2];
            size_t bl = mm[3];
            /* the merged token drops the continuing prefix of its right half */
            size_t skip = (m->prefix_len && bl >= m->prefix_len && !memcmp(b, m->prefix, m->prefix_len)) ? m->prefix_len : 0;
            moff[c] = tmp.n;
            if (tk_buf_put(&tmp, rv->strs.p + mm[0], mm[1]) || tk_buf_put(&tmp, b + skip, bl - skip)) {
                st = GERBIL_ERR_NOMEM;
                break;
            }
        }
        if (st) break;
        for (size_t c = 0; c < cnt; c++) {
            const uint32_t *mm = rv->m_off + (i0 + c) * 4;
            keys[3 * c] = rv->strs.p + mm[0], lens[3 * c] = mm[1];
            keys[3 * c + 1] = rv->strs.p + mm[2], lens[3 * c + 1] = mm[3];
            keys[3 * c + 2] = tmp.p + moff[c];
            lens[3 * c + 2] = (c + 1 < cnt ? moff[c + 1] : tmp.n) - moff[c];
        }
        tk_strmap_find_batch(&m->vocab, keys, lens, ent, 3 * cnt);
        for (size_t c = 0; c < cnt; c++) {
            size_t i = i0 + c;
            int64_t ea = ent[3 * c], eb = ent[3 * c + 1], en = ent[3 * c + 2];
            if (ea < 0 || eb < 0) {
                int k = ea < 0 ? 0 : 1;
                st = err_set(GERBIL_ERR_FORMAT, "%s: merge %zu: token \"%.*s\" is not in the vocabulary", path, i,
                             (int)lens[3 * c + k], keys[3 * c + k]);
                break;
            }
            if (en < 0) {
                size_t l = lens[3 * c + 2];
                st = err_set(GERBIL_ERR_FORMAT, "%s: merge %zu: merged token \"%.*s\" is not in the vocabulary", path, i,
                             (int)(l > 100 ? 100 : l), keys[3 * c + 2]);
                break;
            }
            int32_t ia = m->vocab.ents[ea].val, ib = m->vocab.ents[eb].val, inew = m->vocab.ents[en].val;
            uint64_t key = ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib;
            if (tk_u64map_put(&m->merges, key, ((uint64_t)i << 32) | (uint32_t)inew)) { st = GERBIL_ERR_NOMEM; break; }
        }
    }
    tk_buf_free(&tmp);
    if (st == GERBIL_OK && !(m->cache = cache_new())) st = GERBIL_ERR_NOMEM;
    return st;
}

void tk_bpe_free(tk_model *m) {
    tk_u64map_free(&m->merges);
    free(m->prefix);
    free(m->suffix);
    cache_free(m->cache);
}

/* ---- merging ---- */
typedef struct sym {
    int32_t id;
    int32_t prev, next;
    uint32_t len; /* 0 = merged away */
} sym;

typedef struct heap_item {
    uint32_t rank, pos;
    int32_t new_id;
} heap_item;

static int heap_less(const heap_item *a, const heap_item *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(heap_item *h, size_t *n, heap_item x) {
    size_t i = (*n)++;
    while (i) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&x, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = x;
}

static heap_item heap_pop(heap_item *h, size_t *n) {
    heap_item top = h[0], x = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1;
        if (l >= *n) break;
        size_t c = (l + 1 < *n && heap_less(&h[l + 1], &h[l])) ? l + 1 : l;
        if (!heap_less(&h[c], &x)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = x;
    return top;
}

static int merge_of(const tk_model *m, int32_t a, int32_t b, uint32_t *rank, int32_t *new_id) {
    uint64_t v;
    if (!tk_u64map_get(&m->merges, ((uint64_t)(uint32_t)a << 32) | (uint32_t)b, &v)) return 0;
    *rank = (uint32_t)(v >> 32);
    *new_id = (int32_t)(uint32_t)v;
    return 1;
}

/* The initial symbols of a word (BPE::merge_word), then every merge. */
static gerbil_status merge_word(const tk_model *m, tk_ctx *cx, const char *w, size_t n, tk_ids *out) {
    size_t nch = 0;
    for (size_t i = 0; i < n; i += tk_utf8_len((unsigned char)w[i])) nch++;
    /* at most one symbol per byte of each char's lookup key (byte fallback) */
    size_t cap = n + nch * m->prefix_len + m->suffix_len + 1;
    sym *s = malloc(cap * sizeof *s);
    heap_item *h = malloc((cap * 3 + 2) * sizeof *h); /* each merge pops one entry, pushes <= 2 */
    if (!s || !h) {
        free(s);
        free(h);
        return GERBIL_ERR_NOMEM;
    }
    size_t ns = 0;
    int32_t unk = -1;
    uint32_t unk_len = 0;
    tk_buf *tmp = &cx->tmp;
    gerbil_status st = GERBIL_OK;
#define ADD_SYM(ID, LEN) do { s[ns].id = (ID); s[ns].len = (LEN); s[ns].prev = (int32_t)ns - 1; s[ns].next = (int32_t)ns + 1; ns++; } while (0)
    for (size_t i = 0; i < n;) {
        size_t cl = tk_utf8_len((unsigned char)w[i]);
        if (i + cl > n) cl = n - i;
        int is_first = i == 0, is_last = i + cl >= n;
        const char *key = w + i;
        size_t klen = cl;
        if ((!is_first && m->prefix_len) || (is_last && m->suffix_len)) {
            tmp->n = 0;
            if ((!is_first && tk_buf_put(tmp, m->prefix, m->prefix_len)) || tk_buf_put(tmp, w + i, cl) ||
                (is_last && tk_buf_put(tmp, m->suffix, m->suffix_len))) {
                st = GERBIL_ERR_NOMEM;
                break;
            }
            key = tmp->p;
            klen = tmp->n;
        }
        int32_t id = tk_strmap_get(&m->vocab, key, klen, -1);
        if (id >= 0) {
            if (unk >= 0) {
                ADD_SYM(unk, unk_len);
                unk = -1;
            }
            ADD_SYM(id, (uint32_t)cl);
        } else {
            int done = 0;
            if (m->byte_fallback) {
                int all = 1;
                for (size_t k = 0; k < klen; k++) all &= m->byte_ids[(unsigned char)key[k]] >= 0;
                if (all) {
                    for (size_t k = 0; k < klen; k++) ADD_SYM(m->byte_ids[(unsigned char)key[k]], 1);
                    done = 1;
                }
            }
            if (!done && m->unk_id >= 0) {
                if (unk >= 0 && m->fuse_unk) {
                    unk_len += (uint32_t)cl;
                } else {
                    if (unk >= 0) ADD_SYM(unk, unk_len);
                    unk = m->unk_id;
                    unk_len = (uint32_t)cl;
                }
            }
        }
        i += cl;
    }
    if (st == GERBIL_OK && unk >= 0) ADD_SYM(unk, unk_len);
#undef ADD_SYM
    if (st != GERBIL_OK || ns == 0) {
        free(s);
        free(h);
        return st;
    }
    s[ns - 1].next = -1;
    size_t nh = 0;
    for (size_t i = 0; i + 1 < ns; i++) {
        uint32_t r;
        int32_t nid;
        if (merge_of(m, s[i].id, s[i + 1].id, &r, &nid)) heap_push(h, &nh, (heap_item){r, (uint32_t)i, nid});
    }
    while (nh) {
        heap_item top = heap_pop(h, &nh);
        sym *cur = &s[top.pos];
        if (!cur->len || cur->next < 0) continue;
        sym *right = &s[cur->next];
        uint32_t r;
        int32_t nid;
        if (!merge_of(m, cur->id, right->id, &r, &nid) || nid != top.new_id) continue; /* stale entry */
        cur->id = top.new_id;
        cur->len += right->len;
        right->len = 0;
        cur->next = right->next;
        if (cur->next >= 0) s[cur->next].prev = (int32_t)top.pos;
        if (cur->prev >= 0 && merge_of(m, s[cur->prev].id, cur->id, &r, &nid))
            heap_push(h, &nh, (heap_item){r, (uint32_t)cur->prev, nid});
        if (cur->next >= 0 && merge_of(m, cur->id, s[cur->next].id, &r, &nid))
            heap_push(h, &nh, (heap_item){r, top.pos, nid});
    }
    for (size_t i = 0; i < ns; i++)
        if (s[i].len && tk_ids_push(out, s[i].id)) { st = GERBIL_ERR_NOMEM; break; }
    free(s);
    free(h);
    return st;
}

gerbil_status tk_bpe_tokenize(const tk_model *m, tk_ctx *cx, const char *s, size_t n, tk_ids *out) {
    if (!n) return GERBIL_OK;
    if (m->ignore_merges) {
        int32_t id = tk_strmap_get(&m->vocab, s, n, -1);
        if (id >= 0) return tk_ids_push(out, id) ? GERBIL_ERR_NOMEM : GERBIL_OK;
    }
    int hit = cache_get(m->cache, s, n, out);
    if (hit < 0) return GERBIL_ERR_NOMEM;
    if (hit) return GERBIL_OK;
    size_t before = out->n;
    GB_TRY(merge_word(m, cx, s, n, out));
    cache_put(m->cache, s, n, out->v + before, out->n - before);
    return GERBIL_OK;
}
