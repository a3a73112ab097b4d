/* Decoders (tokenizers/src/decoders): a chain of token-list -> token-list steps; the
 * text is the concatenation of the final list. */
#include "text/tok_internal.h"
#include "io/json.h"

#include <stdlib.h>
#include <string.h>

enum { D_SEQ, D_BYTELEVEL, D_WORDPIECE, D_METASPACE, D_REPLACE, D_BYTEFALLBACK, D_FUSE, D_STRIP, D_BPE, D_CTC };

struct tk_dec {
    int type;
    tk_dec **kids;
    int n_kids;
    char *s1, *s2;      /* WordPiece prefix / BPE suffix / Replace content / CTC pad, delimiter */
    size_t l1, l2;
    int cleanup;        /* WordPiece, CTC */
    uint32_t ch;        /* Metaspace replacement, Strip content */
    int prepend_never;  /* Metaspace */
    int start, stop;    /* Strip */
    tk_regex re;        /* Replace */
};

void tk_dec_free(tk_dec *d) {
    if (!d) return;
    for (int i = 0; i < d->n_kids; i++) tk_dec_free(d->kids[i]);
    free(d->kids);
    free(d->s1);
    free(d->s2);
    tk_regex_free(&d->re);
    free(d);
}

static char *dup_s(const char *s, size_t *len) {
    size_t n = strlen(s);
    char *d = malloc(n + 1);
    if (d) memcpy(d, s, n + 1);
    *len = n;
    return d;
}

static gerbil_status get_char(const cJSON *j, const char *key, uint32_t def, uint32_t *out, const char *path) {
    const char *s = json_get_str(j, key, NULL);
    if (!s) { *out = def; return GERBIL_OK; }
    size_t n = strlen(s), i = 0;
    if (!n || tk_utf8_valid_prefix(s, n) != n) return err_set(GERBIL_ERR_FORMAT, "%s: decoder \"%s\" must be one character", path, key);
    *out = tk_utf8_next(s, &i);
    if (i != n) return err_set(GERBIL_ERR_FORMAT, "%s: decoder \"%s\" must be one character", path, key);
    return GERBIL_OK;
}

gerbil_status tk_dec_parse(const cJSON *j, const char *path, tk_dec **out) {
    *out = NULL;
    if (!j || cJSON_IsNull(j)) return GERBIL_OK;
    const char *t = json_get_str(j, "type", NULL);
    if (!t) return err_set(GERBIL_ERR_FORMAT, "%s: decoder without a \"type\"", path);
    tk_dec *d = calloc(1, sizeof *d);
    if (!d) return GERBIL_ERR_NOMEM;
    gerbil_status st = GERBIL_OK;
    if (!strcmp(t, "Sequence")) {
        d->type = D_SEQ;
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "decoders");
        if (!cJSON_IsArray(list)) {
            st = err_set(GERBIL_ERR_FORMAT, "%s: Sequence decoder without a \"decoders\" list", path);
        } else {
            d->kids = calloc((size_t)cJSON_GetArraySize(list) + 1, sizeof *d->kids);
            if (!d->kids) st = GERBIL_ERR_NOMEM;
            const cJSON *it;
            cJSON_ArrayForEach(it, list) {
                if (st) break;
                st = tk_dec_parse(it, path, &d->kids[d->n_kids]);
                if (d->kids[d->n_kids]) d->n_kids++;
            }
        }
    } else if (!strcmp(t, "ByteLevel")) d->type = D_BYTELEVEL;
    else if (!strcmp(t, "ByteFallback")) d->type = D_BYTEFALLBACK;
    else if (!strcmp(t, "Fuse")) d->type = D_FUSE;
    else if (!strcmp(t, "WordPiece")) {
        d->type = D_WORDPIECE;
        d->cleanup = json_get_bool(j, "cleanup", 1);
        if (!(d->s1 = dup_s(json_get_str(j, "prefix", "##"), &d->l1))) st = GERBIL_ERR_NOMEM;
    } else if (!strcmp(t, "BPEDecoder")) {
        d->type = D_BPE;
        if (!(d->s1 = dup_s(json_get_str(j, "suffix", "</w>"), &d->l1))) st = GERBIL_ERR_NOMEM;
    } else if (!strcmp(t, "Metaspace")) {
        d->type = D_METASPACE;
        st = get_char(j, "replacement", 0x2581, &d->ch, path);
        const char *ps = json_get_str(j, "prepend_scheme", "always");
        d->prepend_never = !strcmp(ps, "never") || cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(j, "add_prefix_space"));
    } else if (!strcmp(t, "Strip")) {
        d->type = D_STRIP;
        st = get_char(j, "content", ' ', &d->ch, path);
        d->start = (int)json_get_int(j, "start", 0);
        d->stop = (int)json_get_int(j, "stop", 0);
    } else if (!strcmp(t, "Replace")) {
        d->type = D_REPLACE;
        const char *c = json_get_str(j, "content", NULL);
        if (!c) st = err_set(GERBIL_ERR_FORMAT, "%s: Replace decoder without \"content\"", path);
        else if (!(d->s1 = dup_s(c, &d->l1))) st = GERBIL_ERR_NOMEM;
        else st = tk_parse_pattern(cJSON_GetObjectItemCaseSensitive(j, "pattern"), &d->re, "Replace decoder", path);
    } else if (!strcmp(t, "CTC")) {
        d->type = D_CTC;
        d->cleanup = json_get_bool(j, "cleanup", 1);
        if (!(d->s1 = dup_s(json_get_str(j, "pad_token", "<pad>"), &d->l1)) ||
            !(d->s2 = dup_s(json_get_str(j, "word_delimiter_token", "|"), &d->l2)))
            st = GERBIL_ERR_NOMEM;
    } else {
        st = err_set(GERBIL_ERR_UNSUPPORTED, "%s: unknown decoder type \"%s\"", path, t);
    }
    if (st != GERBIL_OK) {
        tk_dec_free(d);
        return st;
    }
    *out = d;
    return GERBIL_OK;
}

int tk_dec_has_byte_fallback(const tk_dec *d) {
    if (!d) return 0;
    if (d->type == D_BYTEFALLBACK) return 1;
    for (int i = 0; i < d->n_kids; i++)
        if (tk_dec_has_byte_fallback(d->kids[i])) return 1;
    return 0;
}

/* Append s with every occurrence of pat replaced by rep (str::replace). */
static int replace_all(tk_strs *o, const char *s, size_t n, const char *pat, size_t pl, const char *rep, size_t rl) {
    size_t i = 0;
    while (i < n) {
        const char *f = pl ? memmem(s + i, n - i, pat, pl) : NULL;
        if (!f) return tk_strs_append(o, s + i, n - i);
        if (tk_strs_append(o, s + i, (size_t)(f - (s + i))) || tk_strs_append(o, rep, rl)) return -1;
        i = (size_t)(f - s) + pl;
    }
    return 0;
}

/* WordPiece's cleanup: the replacements in order, each over the whole string. */
static int wp_cleanup(tk_strs *o, tk_buf *a, tk_buf *b) {
    static const char *pairs[][2] = {{" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"},
                                     {" n't", "n't"}, {" 'm", "'m"}, {" do not", " don't"}, {" 's", "'s"},
                                     {" 've", "'ve"}, {" 're", "'re"}};
    for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++) {
        tk_strs t = {0};
        if (tk_strs_begin(&t) || replace_all(&t, a->p ? a->p : "", a->n, pairs[k][0], strlen(pairs[k][0]), pairs[k][1],
                                             strlen(pairs[k][1]))) {
            tk_strs_free(&t);
            return -1;
        }
        b->n = 0;
        int rc = tk_buf_put(b, t.data.p ? t.data.p : "", t.len[0]);
        tk_strs_free(&t);
        if (rc) return -1;
        tk_buf x = *a;
        *a = *b;
        *b = x;
    }
    return tk_strs_push(o, a->p ? a->p : "", a->n);
}

static int is_byte_token(const char *s, size_t n, unsigned char *out) {
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return 0;
    unsigned v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        if (i == 3 && c == '+') continue; /* u8::from_str_radix accepts a sign */
        int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
        if (d < 0) return 0;
        v = v * 16 + (unsigned)d;
    }
    *out = (unsigned char)v;
    return 1;
}

static gerbil_status step(const tk_dec *d, tk_ctx *cx, tk_strs *in, tk_strs *o) {
    size_t n = in->n;
    int rc = 0;
    switch (d->type) {
    case D_BYTELEVEL: {
        tk_buf bytes = {0};
        for (size_t i = 0; i < n && !rc; i++) {
            const char *s = tk_strs_at(in, i);
            size_t len = in->len[i], k = 0, mark = bytes.n;
            int all = 1;
            while (k < len && !rc) {
                int b = tk_cp_to_byte(tk_utf8_next(s, &k));
                if (b < 0) { all = 0; break; }
                rc = tk_buf_putc(&bytes, (char)b);
            }
            if (!all) {
                bytes.n = mark;
                rc = tk_buf_put(&bytes, s, len);
            }
        }
        tk_buf txt = {0};
        if (!rc) rc = tk_utf8_lossy(bytes.p ? bytes.p : "", bytes.n, &txt) || tk_strs_push(o, txt.p ? txt.p : "", txt.n);
        tk_buf_free(&bytes);
        tk_buf_free(&txt);
        break;
    }
    case D_WORDPIECE: {
        tk_buf a = {0}, b = {0};
        for (size_t i = 0; i < n && !rc; i++) {
            const char *s = tk_strs_at(in, i);
            size_t len = in->len[i];
            a.n = 0;
            if (i != 0) {
                if (len >= d->l1 && !memcmp(s, d->s1, d->l1)) s += d->l1, len -= d->l1;
                else rc = tk_buf_putc(&a, ' ');
            }
            if (!rc) rc = tk_buf_put(&a, s, len);
            if (!rc) rc = d->cleanup ? wp_cleanup(o, &a, &b) : tk_strs_push(o, a.p, a.n);
        }
        tk_buf_free(&a);
        tk_buf_free(&b);
        break;
    }
    case D_METASPACE:
        for (size_t i = 0; i < n && !rc; i++) {
            const char *s = tk_strs_at(in, i);
            size_t len = in->len[i], k = 0;
            rc = tk_strs_begin(o);
            while (k < len && !rc) {
                size_t b = k;
                uint32_t c = tk_utf8_next(s, &k);
                if (c == d->ch) {
                    if (!(i == 0 && !d->prepend_never)) rc = tk_strs_append(o, " ", 1);
                } else {
                    rc = tk_strs_append(o, s + b, k - b);
                }
            }
        }
        break;
    case D_REPLACE:
        for (size_t i = 0; i < n && !rc; i++) {
            const char *s = tk_strs_at(in, i);
            rc = tk_strs_begin(o);
            if (rc) break;
            if (!d->re.code) { rc = tk_strs_append(o, s, in->len[i]); continue; }
            GB_TRY(tk_regex_find_matches(&d->re, cx, s, in->len[i], &cx->spans));
            for (size_t k = 0; k < cx->spans.n && !rc; k++) {
                const tk_span *sp = &cx->spans.v[k];
                rc = sp->match ? tk_strs_append(o, d->s1, d->l1) : tk_strs_append(o, s + sp->s, sp->e - sp->s);
            }
        }
        break;
    case D_BYTEFALLBACK: {
        tk_buf run = {0};
        for (size_t i = 0; i <= n && !rc; i++) {
            unsigned char byte;
            if (i < n && is_byte_token(tk_strs_at(in, i), in->len[i], &byte)) {
                rc = tk_buf_putc(&run, (char)byte);
                continue;
            }
            if (run.n) {
                if (tk_utf8_valid_prefix(run.p, run.n) == run.n) rc = tk_strs_push(o, run.p, run.n);
                else
                    for (size_t k = 0; k < run.n && !rc; k++) rc = tk_strs_push(o, "\xEF\xBF\xBD", 3);
                run.n = 0;
            }
            if (i < n && !rc) rc = tk_strs_push(o, tk_strs_at(in, i), in->len[i]);
        }
        tk_buf_free(&run);
        break;
    }
    case D_FUSE:
        rc = tk_strs_begin(o);
        for (size_t i = 0; i < n && !rc; i++) rc = tk_strs_append(o, tk_strs_at(in, i), in->len[i]);
        break;
    case D_STRIP:
        for (size_t i = 0; i < n && !rc; i++) {
            const char *s = tk_strs_at(in, i);
            size_t len = in->len[i], a = 0, b = len;
            for (int k = 0; k < d->start && a < len; k++) {
                size_t j = a;
                if (tk_utf8_next(s, &j) != d->ch) break;
                a = j;
            }
            for (int k = 0; k < d->stop && b > 0; k++) {
                size_t j = b - 1;
                while (j > 0 && ((unsigned char)s[j] & 0xC0) == 0x80) j--;
                size_t q = j;
                if (tk_utf8_next(s, &q) != d->ch) break;
                b = j;
            }
            rc = tk_strs_push(o, s + a, b > a ? b - a : 0);
        }
        break;
    case D_BPE:
        for (size_t i = 0; i < n && !rc; i++) {
            rc = tk_strs_begin(o);
            if (!rc) rc = replace_all(o, tk_strs_at(in, i), in->len[i], d->s1, d->l1, i + 1 == n ? "" : " ", i + 1 == n ? 0 : 1);
        }
        break;
    case D_CTC: {
        tk_buf a = {0}, b = {0};
        for (size_t i = 0; i < n && !rc; i++) {
            if (i > 0 && in->len[i] == in->len[i - 1] && !memcmp(tk_strs_at(in, i), tk_strs_at(in, i - 1), in->len[i]))
                continue; /* dedup */
            tk_strs t = {0};
            rc = tk_strs_begin(&t) || replace_all(&t, tk_strs_at(in, i), in->len[i], d->s1, d->l1, "", 0);
            a.n = 0;
            if (!rc) rc = tk_buf_put(&a, t.data.p ? t.data.p : "", t.len[0]);
            tk_strs_free(&t);
            if (!rc && d->cleanup) {
                tk_strs c = {0};
                rc = wp_cleanup(&c, &a, &b);
                tk_strs t2 = {0};
                if (!rc) rc = tk_strs_begin(&t2) || replace_all(&t2, tk_strs_at(&c, 0), c.len[0], d->s2, d->l2, " ", 1);
                a.n = 0;
                if (!rc) rc = tk_buf_put(&a, t2.data.p ? t2.data.p : "", t2.len[0]);
                tk_strs_free(&c);
                tk_strs_free(&t2);
            }
            if (!rc && a.n) rc = tk_strs_push(o, a.p, a.n);
        }
        tk_buf_free(&a);
        tk_buf_free(&b);
        break;
    }
    default: break;
    }
    return rc ? err_set(GERBIL_ERR_NOMEM, "decoder: out of memory") : GERBIL_OK;
}

static gerbil_status chain(const tk_dec *d, tk_ctx *cx, tk_strs *toks) {
    if (d->type == D_SEQ) {
        for (int k = 0; k < d->n_kids; k++) GB_TRY(chain(d->kids[k], cx, toks));
        return GERBIL_OK;
    }
    tk_strs o = {0};
    gerbil_status st = step(d, cx, toks, &o);
    if (st != GERBIL_OK) {
        tk_strs_free(&o);
        return st;
    }
    tk_strs_free(toks);
    *toks = o;
    return GERBIL_OK;
}

gerbil_status tk_dec_apply(const tk_dec *d, tk_ctx *cx, tk_strs *toks, tk_buf *out) {
    if (d) GB_TRY(chain(d, cx, toks));
    for (size_t i = 0; i < toks->n; i++) {
        if (!d && i > 0 && tk_buf_putc(out, ' ')) return GERBIL_ERR_NOMEM;
        if (tk_buf_put(out, tk_strs_at(toks, i), toks->len[i])) return GERBIL_ERR_NOMEM;
    }
    if (tk_buf_reserve(out, 1)) return GERBIL_ERR_NOMEM;
    out->p[out->n] = 0;
    return GERBIL_OK;
}
