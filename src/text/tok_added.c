/* Added and special tokens (tokenizers/src/tokenizer/added_vocabulary.rs): matched
 * leftmost-longest in the text before the model sees it, with the flags single_word,
 * lstrip, rstrip and normalized. */
#include "text/tok_internal.h"

#include <stdlib.h>
#include <string.h>

void tk_added_free(tk_added *a) {
    for (size_t i = 0; i < a->n; i++) {
        free(a->v[i].content);
        free(a->v[i].norm);
    }
    free(a->v);
    tk_strmap_free(&a->by_content);
    tk_u64map_free(&a->by_id);
    tk_u64map_free(&a->raw.edges);
    free(a->raw.term);
    tk_u64map_free(&a->norm.edges);
    free(a->norm.term);
    memset(a, 0, sizeof *a);
}

const tk_added_tok *tk_added_by_id(const tk_added *a, int32_t id) {
    uint64_t idx;
    if (id < 0 || !tk_u64map_get(&a->by_id, (uint64_t)(uint32_t)id, &idx)) return NULL;
    return &a->v[idx];
}

static char *dup_n(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

gerbil_status tk_added_add(tk_added *a, const tk_model *m, const tk_norm *norm, tk_ctx *cx,
                           const char *content, size_t len, int special, int normalized, int lstrip,
                           int rstrip, int single_word, int32_t *next_id) {
    if (!len) return GERBIL_OK;
    int64_t ce = tk_strmap_find(&a->by_content, content, len);
    int32_t id;
    if (ce >= 0) {
        const tk_added_tok *t = tk_added_by_id(a, a->by_content.ents[ce].val);
        if (t && t->len == len && !memcmp(t->content, content, len) && t->special == special &&
            t->normalized == normalized && t->lstrip == lstrip && t->rstrip == rstrip && t->single_word == single_word)
            return GERBIL_OK; /* identical: nothing to do */
        id = a->by_content.ents[ce].val;
    } else {
        id = tk_strmap_get(&m->vocab, content, len, -1);
        if (id < 0) id = (*next_id)++;
    }
    tk_added_tok t = {0};
    t.content = dup_n(content, len);
    t.len = len;
    t.id = id;
    t.special = (uint8_t)special, t.normalized = (uint8_t)normalized, t.lstrip = (uint8_t)lstrip;
    t.rstrip = (uint8_t)rstrip, t.single_word = (uint8_t)single_word;
    if (!t.content) return GERBIL_ERR_NOMEM;
    if (normalized && norm) {
        tk_buf s = {0};
        int lost = 0;
        gerbil_status st = tk_buf_put(&s, content, len) ? GERBIL_ERR_NOMEM : tk_norm_apply(norm, cx, &s, &lost);
        if (st != GERBIL_OK) {
            free(t.content);
            tk_buf_free(&s);
            return st;
        }
        if (s.n != len || memcmp(s.p, content, len)) {
            t.norm = s.p ? s.p : dup_n("", 0);
            t.norm_len = s.n;
        } else {
            tk_buf_free(&s);
        }
    }
    uint64_t idx;
    if (tk_u64map_get(&a->by_id, (uint64_t)(uint32_t)id, &idx)) {
        free(a->v[idx].content);
        free(a->v[idx].norm);
        a->v[idx] = t;
    } else {
        if (a->n == a->cap) {
            size_t cap = a->cap ? a->cap * 2 : 64;
            tk_added_tok *v = realloc(a->v, cap * sizeof *v);
            if (!v) {
                free(t.content);
                free(t.norm);
                return GERBIL_ERR_NOMEM;
            }
            a->v = v;
            a->cap = cap;
        }
        idx = a->n;
        a->v[a->n++] = t;
        if (tk_u64map_put(&a->by_id, (uint64_t)(uint32_t)id, idx)) return GERBIL_ERR_NOMEM;
    }
    if (tk_strmap_put(&a->by_content, content, len, id) < 0) return GERBIL_ERR_NOMEM;
    return GERBIL_OK;
}

static int trie_node(tk_trie *t) {
    if (t->n_nodes == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 256;
        int32_t *term = realloc(t->term, cap * sizeof *term);
        if (!term) return -1;
        t->term = term;
        t->cap = cap;
    }
    t->term[t->n_nodes] = -1;
    return (int)t->n_nodes++;
}

static int trie_insert(tk_trie *t, const char *s, size_t n, int32_t tok) {
    if (!t->n_nodes && trie_node(t) < 0) return -1;
    if (n) t->first[(unsigned char)s[0]] = 1;
    uint64_t node = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t key = (node << 8) | (unsigned char)s[i], child;
        if (!tk_u64map_get(&t->edges, key, &child)) {
            int c = trie_node(t);
            if (c < 0 || tk_u64map_put(&t->edges, key, (uint64_t)c)) return -1;
            child = (uint64_t)c;
        }
        node = child;
    }
    t->term[node] = tok;
    return 0;
}

gerbil_status tk_added_build_tries(tk_added *a) {
    for (size_t i = 0; i < a->n; i++) {
        const tk_added_tok *t = &a->v[i];
        int rc = t->normalized ? trie_insert(&a->norm, t->norm ? t->norm : t->content, t->norm ? t->norm_len : t->len,
                                             (int32_t)i)
                               : trie_insert(&a->raw, t->content, t->len, (int32_t)i);
        if (rc) return GERBIL_ERR_NOMEM;
    }
    return GERBIL_OK;
}

/* The last character before s[at] / the first at s[at]; 0 at the edges. */
static uint32_t char_before(const char *s, size_t at) {
    if (!at) return 0;
    size_t j = at - 1;
    while (j > 0 && ((unsigned char)s[j] & 0xC0) == 0x80) j--;
    return tk_utf8_next(s, &j);
}

int tk_added_split(const tk_added *a, const tk_trie *t, uint64_t off, uint32_t n, int first, tk_pieces *out) {
    const char *s = out->text->p + off;
    if (!t->n_nodes) return n ? tk_pieces_push(out, off, n, -1, first) : 0;
    size_t pos = 0, start_offset = 0;
    while (pos < n) {
        /* the longest token starting here (leftmost-longest: the first position wins) */
        if (!t->first[(unsigned char)s[pos]]) {
            pos++;
            continue;
        }
        uint64_t node = 0;
        size_t best_end = 0;
        int32_t best = -1;
        for (size_t k = pos; k < n; k++) {
            uint64_t child;
            if (!tk_u64map_get(&t->edges, (node << 8) | (unsigned char)s[k], &child)) break;
            node = child;
            if (t->term[node] >= 0) {
                best = t->term[node];
                best_end = k + 1;
            }
        }
        if (best < 0) {
            pos++;
            continue;
        }
        const tk_added_tok *tok = &a->v[best];
        size_t start = pos, stop = best_end;
        pos = best_end; /* a rejected match still consumes its bytes, as find_iter does */
        if (tok->special && a->split_special) continue;
        if (tok->single_word) {
            int start_space = start == 0 || !tk_is_word(char_before(s, start));
            size_t j = stop;
            int stop_space = stop == n || !tk_is_word(tk_utf8_next(s, &j));
            if (!start_space || !stop_space) continue;
        }
        if (start < start_offset) continue; /* inside a previous token's rstrip */
        if (tok->lstrip) {
            size_t ns = start;
            while (ns > start_offset) {
                size_t j = ns - 1;
                while (j > 0 && ((unsigned char)s[j] & 0xC0) == 0x80) j--;
                size_t k = j;
                if (!tk_is_whitespace(tk_utf8_next(s, &k))) break;
                ns = j;
            }
            start = ns;
        }
        if (tok->rstrip) {
            while (stop < n) {
                size_t k = stop;
                if (!tk_is_whitespace(tk_utf8_next(s, &k))) break;
                stop = k;
            }
        }
        if (start_offset < start &&
            tk_pieces_push(out, off + start_offset, (uint32_t)(start - start_offset), -1, first && start_offset == 0))
            return -1;
        if (tk_pieces_push(out, off + start, (uint32_t)(stop - start), tok->id, 0)) return -1;
        start_offset = stop;
        if (pos < start_offset) pos = start_offset;
    }
    if (start_offset < n && tk_pieces_push(out, off + start_offset, (uint32_t)(n - start_offset), -1,
                                           first && start_offset == 0))
        return -1;
    return 0;
}
