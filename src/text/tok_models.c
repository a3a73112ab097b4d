/* Models other than BPE's merging: vocabulary building, Unigram (Viterbi over piece
 * scores), WordPiece (greedy longest match), WordLevel, and the dispatch. */
#include "text/tok_internal.h"
#include "io/json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define UNK_PENALTY 10.0 /* HF's K_UNK_PENALTY */

static gerbil_status build_vocab(tk_model *m, tk_rawvocab *rv, const char *path) {
    int32_t max_id = -1;
    for (size_t i = 0; i < rv->n; i++) {
        double v = rv->is_list ? (double)i : rv->num[i];
        if (v < 0 || v > INT32_MAX - 1 || v != floor(v))
            return err_set(GERBIL_ERR_FORMAT, "%s: model.vocab: id %g of \"%.*s\" is not a valid id", path, v,
                           (int)(rv->len[i] > 100 ? 100 : rv->len[i]), rv->strs.p + rv->off[i]);
        if ((int32_t)v > max_id) max_id = (int32_t)v;
    }
    /* ids may leave holes (added tokens fill them), but not unboundedly many: the table is
     * bounded by what the file holds */
    if ((size_t)max_id >= rv->n + TK_MAX_ID_HOLES)
        return err_set(GERBIL_ERR_FORMAT, "%s: model.vocab: id %d with only %zu entries (ids may skip at most %d)",
                       path, (int)max_id, rv->n, TK_MAX_ID_HOLES);
    m->n_ids = max_id + 1;
    m->id_ent = malloc(((size_t)m->n_ids + 1) * sizeof *m->id_ent);
    if (!m->id_ent) return GERBIL_ERR_NOMEM;
    for (int32_t i = 0; i < m->n_ids; i++) m->id_ent[i] = -1;
    if (tk_strmap_reserve(&m->vocab, rv->n, rv->strs.n)) return GERBIL_ERR_NOMEM;
    for (size_t i = 0; i < rv->n; i++) {
        int32_t id = rv->is_list ? (int32_t)i : (int32_t)rv->num[i];
        int64_t e = tk_strmap_put(&m->vocab, rv->strs.p + rv->off[i], rv->len[i], id);
        if (e < 0) return GERBIL_ERR_NOMEM;
        m->id_ent[id] = e;
    }
    return GERBIL_OK;
}

gerbil_status tk_unigram_build(tk_model *m, const cJSON *cfg, tk_rawvocab *rv, const char *path) {
    if (!rv->is_list) return err_set(GERBIL_ERR_FORMAT, "%s: Unigram model.vocab must be a list of [piece, score]", path);
    m->byte_fallback = json_get_bool(cfg, "byte_fallback", 0);
    int64_t unk = json_get_int(cfg, "unk_id", -1);
    if (unk >= (int64_t)rv->n) return err_set(GERBIL_ERR_FORMAT, "%s: Unigram unk_id %lld is outside the vocabulary", path, (long long)unk);
    m->unk_id = (int32_t)unk;
    m->scores = malloc((rv->n + 1) * sizeof *m->scores);
    if (!m->scores) return GERBIL_ERR_NOMEM;
    m->min_score = INFINITY;
    for (size_t i = 0; i < rv->n; i++) {
        m->scores[i] = rv->num[i];
        if (rv->num[i] < m->min_score) m->min_score = rv->num[i];
    }
    /* prefixes of every piece, for the common-prefix search (a piece keeps its id) */
    for (size_t i = 0; i < rv->n; i++)
        if (tk_strmap_put(&m->prefixes, rv->strs.p + rv->off[i], rv->len[i], (int32_t)i) < 0) return GERBIL_ERR_NOMEM;
    for (size_t i = 0; i < rv->n; i++) {
        const char *s = rv->strs.p + rv->off[i];
        size_t len = rv->len[i];
        for (size_t k = 1; k < len; k++) {
            if (((unsigned char)s[k] & 0xC0) == 0x80) continue;
            if (tk_strmap_find(&m->prefixes, s, k) < 0 && tk_strmap_put(&m->prefixes, s, k, -1) < 0)
                return GERBIL_ERR_NOMEM;
        }
    }
    return GERBIL_OK;
}

typedef struct best_node {
    double score;
    int32_t start; /* -1: not reached */
    int32_t id;
} best_node;

static gerbil_status unigram_emit(const tk_model *m, const char *s, size_t n, tk_ids *out) {
    int32_t id = tk_strmap_get(&m->vocab, s, n, -1);
    if (id >= 0) return tk_ids_push(out, id) ? GERBIL_ERR_NOMEM : GERBIL_OK;
    if (m->byte_fallback) {
        int all = 1;
        for (size_t k = 0; k < n; k++) all &= m->byte_ids[(unsigned char)s[k]] >= 0;
        if (all) {
            for (size_t k = 0; k < n; k++)
                if (tk_ids_push(out, m->byte_ids[(unsigned char)s[k]])) return GERBIL_ERR_NOMEM;
            return GERBIL_OK;
        }
    }
    if (m->unk_id < 0) return err_set(GERBIL_ERR_FORMAT, "Unigram: text needs the unknown token but the model has no unk_id");
    return tk_ids_push(out, m->unk_id) ? GERBIL_ERR_NOMEM : GERBIL_OK;
}

gerbil_status tk_unigram_tokenize(const tk_model *m, tk_ctx *cx, const char *s, size_t n, tk_ids *out) {
    (void)cx;
    if (!n) return GERBIL_OK;
    best_node *b = malloc((n + 1) * sizeof *b);
    if (!b) return GERBIL_ERR_NOMEM;
    for (size_t i = 0; i <= n; i++) b[i] = (best_node){0.0, -1, 0};
    const double unk_score = m->min_score - UNK_PENALTY;
    gerbil_status st = GERBIL_OK;
    for (size_t at = 0; at < n;) {
        double base = b[at].score;
        size_t mblen = tk_utf8_len((unsigned char)s[at]);
        int single = 0;
        for (size_t e = at; e < n;) {
            e += tk_utf8_len((unsigned char)s[e]);
            if (e > n) break;
            int64_t ent = tk_strmap_find(&m->prefixes, s + at, e - at);
            if (ent < 0) break;
            int32_t id = m->prefixes.ents[ent].val;
            if (id < 0) continue;
            double cand = m->scores[id] + base;
            if (b[e].start < 0 || cand > b[e].score) b[e] = (best_node){cand, (int32_t)at, id};
            if (e - at == mblen) single = 1;
        }
        if (!single) {
            if (m->unk_id < 0) {
                st = err_set(GERBIL_ERR_FORMAT, "Unigram: text needs the unknown token but the model has no unk_id");
                break;
            }
            double cand = unk_score + base;
            size_t e = at + mblen;
            if (b[e].start < 0 || cand > b[e].score) b[e] = (best_node){cand, (int32_t)at, m->unk_id};
        }
        at += mblen;
    }
    if (st == GERBIL_OK) {
        /* walk back; consecutive unknown pieces fuse into one string */
        size_t cnt = 0;
        for (size_t e = n; e > 0; e = (size_t)b[e].start) cnt++;
        size_t *starts = malloc((cnt + 1) * sizeof *starts);
        int32_t *ids = malloc((cnt + 1) * sizeof *ids);
        if (!starts || !ids) st = GERBIL_ERR_NOMEM;
        size_t k = cnt;
        for (size_t e = n; st == GERBIL_OK && e > 0; e = (size_t)b[e].start) {
            k--;
            starts[k] = (size_t)b[e].start;
            ids[k] = b[e].id;
        }
        for (size_t i = 0; st == GERBIL_OK && i < cnt;) {
            size_t j = i + 1;
            if (ids[i] == m->unk_id)
                while (j < cnt && ids[j] == m->unk_id) j++;
            size_t end = j < cnt ? starts[j] : n;
            st = unigram_emit(m, s + starts[i], end - starts[i], out);
            i = j;
        }
        free(starts);
        free(ids);
    }
    free(b);
    return st;
}

gerbil_status tk_wordpiece_tokenize(const tk_model *m, tk_ctx *cx, const char *s, size_t n, tk_ids *out) {
    size_t nch = 0, mark = out->n, start = 0;
    tk_buf *tmp = &cx->tmp;
    for (size_t i = 0; i < n; i += tk_utf8_len((unsigned char)s[i])) nch++;
    if ((int64_t)nch > m->max_input_chars_per_word) goto unk;
    while (start < n) {
        size_t end = n;
        int32_t found = -1;
        while (start < end) {
            tmp->n = 0;
            if ((start > 0 && tk_buf_put(tmp, m->prefix ? m->prefix : "", m->prefix_len)) ||
                tk_buf_put(tmp, s + start, end - start))
                return GERBIL_ERR_NOMEM;
            found = tk_strmap_get(&m->vocab, tmp->p, tmp->n, -1);
            if (found >= 0) break;
            do end--; while (end > start && ((unsigned char)s[end] & 0xC0) == 0x80);
        }
        if (found < 0) {
            out->n = mark;
            goto unk;
        }
        if (tk_ids_push(out, found)) return GERBIL_ERR_NOMEM;
        start = end;
    }
    return GERBIL_OK;
unk:
    if (m->unk_id < 0) return err_set(GERBIL_ERR_FORMAT, "WordPiece: the unk_token is not in the vocabulary");
    return tk_ids_push(out, m->unk_id) ? GERBIL_ERR_NOMEM : GERBIL_OK;
}

gerbil_status tk_model_build(tk_model *m, const cJSON *cfg, tk_rawvocab *rv, const char *path) {
    const char *type = json_get_str(cfg, "type", NULL);
    m->unk_id = -1;
    for (int b = 0; b < 256; b++) m->byte_ids[b] = -1;
    if (!type) {
        /* untagged legacy files: guess from the shape, as serde's untagged enum does */
        type = rv->is_list ? "Unigram" : rv->has_merges ? "BPE" : json_has(cfg, "max_input_chars_per_word") ? "WordPiece" : "WordLevel";
    }
    if (!strcmp(type, "BPE")) m->type = TK_MODEL_BPE;
    else if (!strcmp(type, "Unigram")) m->type = TK_MODEL_UNIGRAM;
    else if (!strcmp(type, "WordPiece")) m->type = TK_MODEL_WORDPIECE;
    else if (!strcmp(type, "WordLevel")) m->type = TK_MODEL_WORDLEVEL;
    else return err_set(GERBIL_ERR_UNSUPPORTED, "%s: unknown model type \"%s\"", path, type);
    GB_TRY(build_vocab(m, rv, path));
    switch (m->type) {
    case TK_MODEL_BPE: return tk_bpe_build(m, cfg, rv, path);
    case TK_MODEL_UNIGRAM: {
        GB_TRY(tk_unigram_build(m, cfg, rv, path));
        for (int b = 0; b < 256; b++) {
            char tok[8];
            snprintf(tok, sizeof tok, "<0x%02X>", b);
            m->byte_ids[b] = tk_strmap_get(&m->vocab, tok, 6, -1);
        }
        return GERBIL_OK;
    }
    case TK_MODEL_WORDPIECE: {
        const char *unk = json_get_str(cfg, "unk_token", "[UNK]");
        m->unk_id = tk_strmap_get(&m->vocab, unk, strlen(unk), -1);
        const char *pre = json_get_str(cfg, "continuing_subword_prefix", "##");
        m->prefix_len = strlen(pre);
        if (!(m->prefix = malloc(m->prefix_len + 1))) return GERBIL_ERR_NOMEM;
        memcpy(m->prefix, pre, m->prefix_len + 1);
        m->max_input_chars_per_word = (int)json_get_int(cfg, "max_input_chars_per_word", 100);
        return GERBIL_OK;
    }
    default: {
        const char *unk = json_get_str(cfg, "unk_token", NULL);
        m->unk_id = unk ? tk_strmap_get(&m->vocab, unk, strlen(unk), -1) : -1;
        return GERBIL_OK;
    }
    }
}

void tk_model_free(tk_model *m) {
    if (m->type == TK_MODEL_BPE) tk_bpe_free(m);
    else free(m->prefix);
    tk_strmap_free(&m->vocab);
    tk_strmap_free(&m->prefixes);
    free(m->id_ent);
    free(m->scores);
    memset(m, 0, sizeof *m);
}

gerbil_status tk_model_tokenize(const tk_model *m, tk_ctx *cx, const char *s, size_t n, tk_ids *out) {
    if (!n) return GERBIL_OK;
    switch (m->type) {
    case TK_MODEL_BPE: return tk_bpe_tokenize(m, cx, s, n, out);
    case TK_MODEL_UNIGRAM: return tk_unigram_tokenize(m, cx, s, n, out);
    case TK_MODEL_WORDPIECE: return tk_wordpiece_tokenize(m, cx, s, n, out);
    default: {
        int32_t id = tk_strmap_get(&m->vocab, s, n, -1);
        if (id < 0) id = m->unk_id;
        if (id < 0) return err_set(GERBIL_ERR_FORMAT, "WordLevel: \"%.*s\" is not in the vocabulary and there is no unk_token",
                                   (int)(n > 50 ? 50 : n), s);
        return tk_ids_push(out, id) ? GERBIL_ERR_NOMEM : GERBIL_OK;
    }
    }
}

const char *tk_model_token(const tk_model *m, int32_t id, size_t *len) {
    if (id < 0 || id >= m->n_ids || m->id_ent[id] < 0) return NULL;
    int64_t e = m->id_ent[id];
    *len = m->vocab.ents[e].len;
    return tk_strmap_key(&m->vocab, e);
}
