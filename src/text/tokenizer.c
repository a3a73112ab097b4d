/* Hugging Face tokenizer.json: loading, encoding, decoding (public API).
 *
 * Two loading modes:
 *  - a tokenizer.json file: exactly what `tokenizers.Tokenizer.from_file` does;
 *    tokenizer_config.json beside it only supplies bos/eos ids and the chat template.
 *  - a folder: what transformers' AutoTokenizer.from_pretrained does with it (v5):
 *    tokenizer_config.json's special tokens are added, add_bos_token/add_eos_token
 *    rebuild the post-processor ("bos $A eos") when either key is present or the file
 *    has none, and the LlamaTokenizer class rebuilds a SentencePiece-style pipeline
 *    (no normalizer, Metaspace pre-tokenizer, prepend_scheme "first").
 * Invalid UTF-8 input is encoded as if each maximal invalid subpart were U+FFFD. */
#include "text/tok_internal.h"
#include "io/json.h"
#include "io/mmap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static char *join_path(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

static int file_exists(const char *p) {
    struct stat st;
    return p && stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* A token given as "text" or {"content": "text", ...}; NULL when absent. */
static const char *token_content(const cJSON *v) {
    if (cJSON_IsString(v)) return v->valuestring;
    if (cJSON_IsObject(v)) return json_get_str(v, "content", NULL);
    return NULL;
}

static int32_t token_to_id(const struct gerbil_tokenizer *t, const char *s) {
    if (!s) return -1;
    int32_t id = tk_strmap_get(&t->added.by_content, s, strlen(s), -1);
    return id >= 0 ? id : tk_strmap_get(&t->model.vocab, s, strlen(s), -1);
}

static gerbil_status load_added(struct gerbil_tokenizer *t, const cJSON *list, int32_t *next_id, tk_ctx *cx) {
    if (!list || cJSON_IsNull(list)) return GERBIL_OK;
    if (!cJSON_IsArray(list)) return err_set(GERBIL_ERR_FORMAT, "%s: added_tokens must be a list", t->path);
    const cJSON *it;
    cJSON_ArrayForEach(it, list) {
        const char *c = json_get_str(it, "content", NULL);
        if (!c) return err_set(GERBIL_ERR_FORMAT, "%s: an added token has no \"content\"", t->path);
        int special = json_get_bool(it, "special", 0);
        GB_TRY(tk_added_add(&t->added, &t->model, t->normalizer, cx, c, strlen(c), special,
                            json_get_bool(it, "normalized", !special), json_get_bool(it, "lstrip", 0),
                            json_get_bool(it, "rstrip", 0), json_get_bool(it, "single_word", 0), next_id));
    }
    return GERBIL_OK;
}

static gerbil_status load_templates(struct gerbil_tokenizer *t, const cJSON *cfg, const char *dir) {
    char *jinja = join_path(dir, "chat_template.jinja");
    if (!jinja) return GERBIL_ERR_NOMEM;
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
    size_t n = cJSON_IsArray(ct) ? (size_t)cJSON_GetArraySize(ct) : 0;
    t->tpl_names = calloc(n + 2, sizeof *t->tpl_names);
    t->tpl_srcs = calloc(n + 2, sizeof *t->tpl_srcs);
    gerbil_status st = (t->tpl_names && t->tpl_srcs) ? GERBIL_OK : GERBIL_ERR_NOMEM;
    if (!st && file_exists(jinja)) { /* the file beside the config wins, as transformers v5 */
        struct mapped_file mf;
        st = mapped_file_open(jinja, &mf);
        if (!st) {
            char *src = malloc(mf.size + 1);
            if (src) {
                if (mf.size) memcpy(src, mf.data, mf.size);
                src[mf.size] = 0;
                t->tpl_names[t->n_tpl] = strdup("default");
                t->tpl_srcs[t->n_tpl++] = src;
            } else {
                st = GERBIL_ERR_NOMEM;
            }
            mapped_file_close(&mf);
        }
    }
    if (!st && cJSON_IsString(ct) && t->n_tpl == 0) {
        t->tpl_names[t->n_tpl] = strdup("default");
        t->tpl_srcs[t->n_tpl++] = strdup(ct->valuestring);
    } else if (!st && n) {
        const cJSON *it;
        cJSON_ArrayForEach(it, ct) {
            const char *name = json_get_str(it, "name", NULL), *src = json_get_str(it, "template", NULL);
            if (!name || !src) continue;
            if (t->n_tpl && !strcmp(name, "default")) continue; /* chat_template.jinja already is the default */
            t->tpl_names[t->n_tpl] = strdup(name);
            t->tpl_srcs[t->n_tpl++] = strdup(src);
        }
    }
    for (int i = 0; i < t->n_tpl; i++)
        if (!t->tpl_names[i] || !t->tpl_srcs[i]) st = GERBIL_ERR_NOMEM;
    free(jinja);
    return st;
}

/* transformers v5 LlamaTokenizer: normalizer none, Metaspace(first, no split),
 * decoder Replace/ByteFallback/Fuse(/Strip), BPE with fuse_unk and byte_fallback.
 * Applied only to SentencePiece-style BPE files (byte_fallback), where it is what
 * transformers produces; a byte-level file keeps its own pipeline. */
static gerbil_status llama_class_pipeline(struct gerbil_tokenizer *t, const cJSON *cfg) {
    const cJSON *aps = cJSON_GetObjectItemCaseSensitive(cfg, "add_prefix_space");
    int add_prefix_space = !cJSON_IsFalse(aps);
    int legacy = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cfg, "legacy"));
    const char *scheme = !add_prefix_space ? "never" : legacy ? "always" : "first";
    char pre[160], dec[400];
    snprintf(pre, sizeof pre, "{\"type\":\"Metaspace\",\"replacement\":\"\xE2\x96\x81\",\"prepend_scheme\":\"%s\",\"split\":false}", scheme);
    snprintf(dec, sizeof dec,
             "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\"\xE2\x96\x81\"},\"content\":\" \"},"
             "{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"}%s]}",
             add_prefix_space ? ",{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}" : "");
    cJSON *jp = cJSON_Parse(pre), *jd = cJSON_Parse(dec);
    tk_pretok *p = NULL;
    tk_dec *d = NULL;
    gerbil_status st = (jp && jd) ? tk_pretok_parse(jp, t->path, &p) : GERBIL_ERR_NOMEM;
    if (!st) st = tk_dec_parse(jd, t->path, &d);
    cJSON_Delete(jp);
    cJSON_Delete(jd);
    if (st) {
        tk_pretok_free(p);
        return st;
    }
    tk_norm_free(t->normalizer);
    t->normalizer = NULL;
    tk_pretok_free(t->pretok);
    t->pretok = p;
    tk_dec_free(t->decoder);
    t->decoder = d;
    t->model.fuse_unk = 1;
    t->model.byte_fallback = 1;
    return GERBIL_OK;
}

static gerbil_status apply_config(struct gerbil_tokenizer *t, const cJSON *cfg, int folder, int32_t *next_id, tk_ctx *cx) {
    const char *bos = token_content(cJSON_GetObjectItemCaseSensitive(cfg, "bos_token"));
    const char *eos = token_content(cJSON_GetObjectItemCaseSensitive(cfg, "eos_token"));
    if (folder) {
        const char *cls = json_get_str(cfg, "tokenizer_class", "");
        if ((!strcmp(cls, "LlamaTokenizer") || !strcmp(cls, "LlamaTokenizerFast")) && t->model.type == TK_MODEL_BPE &&
            t->model.byte_fallback)
            GB_TRY(llama_class_pipeline(t, cfg));
        /* named special tokens become special added tokens when they are not yet */
        static const char *keys[] = {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"};
        int added = 0;
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
            const char *c = token_content(cJSON_GetObjectItemCaseSensitive(cfg, keys[k]));
            if (!c || !c[0] || tk_strmap_find(&t->added.by_content, c, strlen(c)) >= 0) continue;
            GB_TRY(tk_added_add(&t->added, &t->model, t->normalizer, cx, c, strlen(c), 1, 0, 0, 0, 0, next_id));
            added = 1;
        }
        if (added) { /* rebuild the tries */
            tk_trie *tries[2] = {&t->added.raw, &t->added.norm};
            for (int k = 0; k < 2; k++) {
                tk_u64map_free(&tries[k]->edges);
                free(tries[k]->term);
                memset(tries[k], 0, sizeof *tries[k]);
            }
            GB_TRY(tk_added_build_tries(&t->added));
        }
        t->added.split_special = json_get_bool(cfg, "split_special_tokens", 0);
        int has_flags = json_has(cfg, "add_bos_token") || json_has(cfg, "add_eos_token");
        if (has_flags || !t->post) {
            int32_t b = json_get_bool(cfg, "add_bos_token", 0) ? token_to_id(t, bos) : -1;
            int32_t e = json_get_bool(cfg, "add_eos_token", 0) ? token_to_id(t, eos) : -1;
            tk_post *p;
            GB_TRY(tk_post_bos_eos(b, e, &p));
            tk_post_free(t->post);
            t->post = p;
        }
    }
    t->bos = token_to_id(t, bos);
    t->eos = token_to_id(t, eos);
    return GERBIL_OK;
}

static gerbil_status load(struct gerbil_tokenizer *t, const char *path) {
    struct stat sb;
    if (stat(path, &sb) != 0) return err_set(GERBIL_ERR_IO, "%s: no such file or folder", path);
    int folder = S_ISDIR(sb.st_mode);
    char *dir = NULL, *json = NULL;
    if (folder) {
        dir = strdup(path);
        json = join_path(path, "tokenizer.json");
    } else {
        json = strdup(path);
        const char *slash = strrchr(path, '/');
        dir = slash ? strndup(path, (size_t)(slash - path)) : strdup(".");
    }
    t->path = json;
    if (!dir || !json) {
        free(dir);
        return GERBIL_ERR_NOMEM;
    }
    if (folder && !file_exists(json)) {
        free(dir);
        return err_set(GERBIL_ERR_IO, "%s: no tokenizer.json in this folder", path);
    }
    struct mapped_file mf;
    gerbil_status st = mapped_file_open(json, &mf);
    cJSON *root = NULL, *cfg = NULL;
    tk_rawvocab rv = {0};
    tk_ctx cx = {0};
    if (!st) {
        st = mf.size ? tk_json_read(mf.data, mf.size, json, &root, &rv) : err_set(GERBIL_ERR_FORMAT, "%s: empty file", json);
        mapped_file_close(&mf);
    }
    const cJSON *model = root ? cJSON_GetObjectItemCaseSensitive(root, "model") : NULL;
    if (!st && !cJSON_IsObject(model)) st = err_set(GERBIL_ERR_FORMAT, "%s: no \"model\" object", json);
    if (!st) st = tk_norm_parse(cJSON_GetObjectItemCaseSensitive(root, "normalizer"), json, &t->normalizer);
    if (!st) st = tk_pretok_parse(cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), json, &t->pretok);
    if (!st) st = tk_model_build(&t->model, model, &rv, json);
    int32_t next_id = (int32_t)(t->model.type == TK_MODEL_UNIGRAM ? rv.n : t->model.vocab.n);
    tk_rawvocab_free(&rv);
    if (!st) st = tk_dec_parse(cJSON_GetObjectItemCaseSensitive(root, "decoder"), json, &t->decoder);
    if (!st) st = load_added(t, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"), &next_id, &cx);
    if (!st) st = tk_post_parse(cJSON_GetObjectItemCaseSensitive(root, "post_processor"), json, &t->post);
    if (!st) st = tk_added_build_tries(&t->added);
    char *cfg_path = join_path(dir, "tokenizer_config.json");
    if (!st && file_exists(cfg_path)) st = json_load_file(cfg_path, &cfg);
    if (!st) st = apply_config(t, cfg, folder, &next_id, &cx);
    if (!st && !cfg) {
        t->bos = tk_post_first_special(t->post);
        int32_t last = tk_post_last_special(t->post);
        t->eos = last != t->bos ? last : -1;
    }
    if (!st) st = load_templates(t, cfg, dir);
    t->n_vocab = t->model.n_ids;
    for (size_t i = 0; i < t->added.n; i++)
        if (t->added.v[i].id >= t->n_vocab) t->n_vocab = t->added.v[i].id + 1;
    free(cfg_path);
    free(dir);
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    tk_ctx_free(&cx);
    return st;
}

void gerbil_tokenizer_free(gerbil_tokenizer_t t) {
    if (!t) return;
    tk_norm_free(t->normalizer);
    tk_pretok_free(t->pretok);
    tk_model_free(&t->model);
    tk_post_free(t->post);
    tk_dec_free(t->decoder);
    tk_added_free(&t->added);
    for (int i = 0; i < t->n_tpl; i++) {
        free(t->tpl_names[i]);
        free(t->tpl_srcs[i]);
    }
    free(t->tpl_names);
    free(t->tpl_srcs);
    free(t->path);
    free(t);
}

gerbil_status tk_tokenizer_new(const char *path, const char *fn,
                               gerbil_status (*load_fn)(struct gerbil_tokenizer *, const char *),
                               gerbil_tokenizer_t *out) {
    if (!out) return err_set(GERBIL_ERR_INVALID_ARG, "%s: out is NULL", fn);
    *out = NULL;
    if (!path) return err_set(GERBIL_ERR_INVALID_ARG, "%s: path is NULL", fn);
    struct gerbil_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return err_set(GERBIL_ERR_NOMEM, "%s: out of memory", path);
    t->bos = t->eos = -1;
    gerbil_status st = load_fn(t, path);
    if (st != GERBIL_OK) {
        if (st == GERBIL_ERR_NOMEM) err_set(st, "%s: out of memory while loading the tokenizer", path);
        gerbil_tokenizer_free(t);
        return st;
    }
    *out = t;
    return GERBIL_OK;
}

gerbil_status gerbil_tokenizer_load(const char *path, gerbil_tokenizer_t *out) {
    return tk_tokenizer_new(path, "gerbil_tokenizer_load", load, out);
}

int gerbil_tokenizer_n_vocab(gerbil_tokenizer_t t) { return t ? t->n_vocab : 0; }
int32_t gerbil_tokenizer_bos(gerbil_tokenizer_t t) { return t ? t->bos : -1; }
int32_t gerbil_tokenizer_eos(gerbil_tokenizer_t t) { return t ? t->eos : -1; }

const char *gerbil_tokenizer_chat_template(gerbil_tokenizer_t t, const char *name) {
    if (!t) return NULL;
    if (!name) name = "default";
    for (int i = 0; i < t->n_tpl; i++)
        if (!strcmp(t->tpl_names[i], name)) return t->tpl_srcs[i];
    return NULL;
}

/* The most bytes of input one token can stand for, or 0 when there is no such bound; see
 * gerbil.h. Every input byte must land in some token: nothing deletes text (normalizer,
 * pre-tokenizer, strip flags of added tokens), and the model has a token for any
 * character (byte fallback, the byte-level alphabet, or one unknown token per character). */
int gerbil_tokenizer_max_token_bytes(gerbil_tokenizer_t t) {
    if (!t) return 0;
    const tk_model *m = &t->model;
    const int shrink = tk_norm_shrink(t->normalizer);
    if (!shrink || !tk_pretok_keeps_text(t->pretok)) return 0;
    int all_bytes = m->byte_fallback, alphabet = 1;
    for (int b = 0; b < 256; b++) {
        all_bytes &= m->byte_ids[b] >= 0;
        char u[4];
        int k = tk_utf8_encode(u, tk_byte_to_cp[b]);
        alphabet &= tk_strmap_find(&m->vocab, u, (size_t)k) >= 0;
    }
    size_t longest = 0;
    if (m->type == TK_MODEL_BPE) {
        if (!all_bytes && !alphabet && !(m->unk_id >= 0 && !m->fuse_unk)) return 0;
        longest = 4; /* an unknown character */
    } else if (m->type != TK_MODEL_UNIGRAM || !all_bytes) {
        return 0; /* WordPiece / WordLevel: one [UNK] for a whole word */
    }
    for (size_t i = 0; i < m->vocab.n; i++)
        if (m->vocab.ents[i].len > longest) longest = m->vocab.ents[i].len;
    for (size_t i = 0; i < t->added.n; i++) {
        const tk_added_tok *a = &t->added.v[i];
        if (a->lstrip || a->rstrip) return 0; /* they take any run of whitespace with them */
        if (a->len > longest) longest = a->len;
        if (a->norm && a->norm_len > longest) longest = a->norm_len;
    }
    const size_t b = longest * (size_t)shrink;
    return b > INT32_MAX ? 0 : (int)b;
}

/* ---- encode ---- */
static gerbil_status encode(const struct gerbil_tokenizer *t, tk_ctx *cx, tk_buf *arena, int add_special, tk_ids *ids) {
    tk_pieces p1 = {.text = arena}, p2 = {.text = arena};
    gerbil_status st = GERBIL_OK;
    /* 1. non-normalized added tokens on the raw text */
    if (tk_added_split(&t->added, &t->added.raw, 0, (uint32_t)arena->n, 1, &p1)) st = GERBIL_ERR_NOMEM;
    /* 2. normalize what is left, then split out the normalized added tokens */
    tk_buf norm = {0};
    for (size_t i = 0; i < p1.n && !st; i++) {
        tk_piece pc = p1.v[i];
        if (pc.id >= 0 || !t->normalizer) {
            if (pc.id >= 0 ? tk_pieces_push(&p2, pc.off, pc.len, pc.id, pc.first)
                           : tk_added_split(&t->added, &t->added.norm, pc.off, pc.len, pc.first, &p2))
                st = GERBIL_ERR_NOMEM;
            continue;
        }
        norm.n = 0;
        int lost = 0;
        if (tk_buf_put(&norm, arena->p + pc.off, pc.len)) { st = GERBIL_ERR_NOMEM; break; }
        if ((st = tk_norm_apply(t->normalizer, cx, &norm, &lost))) break;
        uint64_t off = arena->n;
        if (tk_buf_put(arena, norm.p ? norm.p : "", norm.n) ||
            tk_added_split(&t->added, &t->added.norm, off, (uint32_t)norm.n, pc.first && !lost, &p2))
            st = GERBIL_ERR_NOMEM;
    }
    tk_buf_free(&norm);
    /* 3. pre-tokenize, 4. the model on every piece */
    if (!st) st = tk_pretok_apply(t->pretok, cx, &p2);
    for (size_t i = 0; i < p2.n && !st; i++) {
        const tk_piece *pc = &p2.v[i];
        if (pc->id >= 0) st = tk_ids_push(ids, pc->id) ? GERBIL_ERR_NOMEM : GERBIL_OK;
        else st = tk_model_tokenize(&t->model, cx, arena->p + pc->off, pc->len, ids);
    }
    /* 5. post-processor */
    if (!st) st = tk_post_apply(t->post, ids, add_special);
    tk_pieces_free(&p1);
    tk_pieces_free(&p2);
    return st;
}

gerbil_status gerbil_tokenize(gerbil_tokenizer_t t, const char *text, size_t len, int add_special, int32_t **ids,
                              int *n_ids) {
    if (!t || !ids || !n_ids || (!text && len)) return err_set(GERBIL_ERR_INVALID_ARG, "gerbil_tokenize: NULL argument");
    *ids = NULL;
    *n_ids = 0;
    if (len > (size_t)UINT32_MAX / 4) return err_set(GERBIL_ERR_INVALID_ARG, "gerbil_tokenize: text of %zu bytes is too long", len);
    tk_buf arena = {0};
    tk_ids out = {0};
    tk_ctx cx = {0};
    gerbil_status st = GERBIL_OK;
    if (tk_buf_reserve(&arena, len + len / 2 + 64)) st = GERBIL_ERR_NOMEM;
    else if (tk_utf8_valid_prefix(text ? text : "", len) == len) st = tk_buf_put(&arena, text ? text : "", len) ? GERBIL_ERR_NOMEM : GERBIL_OK;
    else st = tk_utf8_lossy(text, len, &arena) ? GERBIL_ERR_NOMEM : GERBIL_OK;
    if (!st) st = encode(t, &cx, &arena, add_special, &out);
    tk_buf_free(&arena);
    tk_ctx_free(&cx);
    if (st != GERBIL_OK) {
        tk_ids_free(&out);
        if (st == GERBIL_ERR_NOMEM) return err_set(st, "gerbil_tokenize: out of memory");
        return st;
    }
    if (out.n > INT32_MAX) {
        tk_ids_free(&out);
        return err_set(GERBIL_ERR_INVALID_ARG, "gerbil_tokenize: too many tokens");
    }
    if (!out.v && !(out.v = malloc(sizeof *out.v))) return err_set(GERBIL_ERR_NOMEM, "gerbil_tokenize: out of memory");
    *ids = out.v;
    *n_ids = (int)out.n;
    return GERBIL_OK;
}

/* ---- decode ---- */
gerbil_status tk_ids_to_strs(const struct gerbil_tokenizer *t, const int32_t *ids, int n, int skip_special, tk_strs *out) {
    for (int i = 0; i < n; i++) {
        const tk_added_tok *a = tk_added_by_id(&t->added, ids[i]);
        const char *s;
        size_t len;
        if (a) {
            s = a->norm ? a->norm : a->content;
            len = a->norm ? a->norm_len : a->len;
        } else if (!(s = tk_model_token(&t->model, ids[i], &len))) {
            continue; /* unknown ids are dropped, as HF does */
        }
        if (skip_special) {
            int64_t e = tk_strmap_find(&t->added.by_content, s, len);
            const tk_added_tok *sp = e >= 0 ? tk_added_by_id(&t->added, t->added.by_content.ents[e].val) : NULL;
            if (sp && sp->special) continue;
        }
        if (tk_strs_push(out, s, len)) return GERBIL_ERR_NOMEM;
    }
    return GERBIL_OK;
}

gerbil_status gerbil_detokenize(gerbil_tokenizer_t t, const int32_t *ids, int n_ids, int skip_special, char **text,
                                size_t *len) {
    if (!t || !text || (!ids && n_ids > 0) || n_ids < 0)
        return err_set(GERBIL_ERR_INVALID_ARG, "gerbil_detokenize: bad argument");
    *text = NULL;
    if (len) *len = 0;
    tk_strs toks = {0};
    tk_buf out = {0};
    tk_ctx cx = {0};
    gerbil_status st = tk_ids_to_strs(t, ids, n_ids, skip_special, &toks);
    if (!st) st = tk_dec_apply(t->decoder, &cx, &toks, &out);
    if (!st && !out.p) st = tk_buf_reserve(&out, 1) ? GERBIL_ERR_NOMEM : GERBIL_OK;
    tk_strs_free(&toks);
    tk_ctx_free(&cx);
    if (st) {
        tk_buf_free(&out);
        return st == GERBIL_ERR_NOMEM ? err_set(st, "gerbil_detokenize: out of memory") : st;
    }
    out.p[out.n] = 0;
    *text = out.p;
    if (len) *len = out.n;
    return GERBIL_OK;
}
