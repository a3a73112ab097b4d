/* Normalizers (tokenizers/src/normalizers): string -> string. */
#include "text/tok_internal.h"
#include "io/json.h"

#include <stdlib.h>
#include <string.h>

enum {
    N_SEQ, N_NFC, N_NFD, N_NFKC, N_NFKD, N_LOWER, N_STRIP, N_STRIP_ACCENTS, N_REPLACE, N_PREPEND, N_BERT, N_NMT,
    N_BYTELEVEL
};

struct tk_norm {
    int type;
    tk_norm **kids;
    int n_kids;
    int left, right;                    /* Strip */
    char *content;                      /* Replace content, Prepend */
    size_t content_len;
    tk_regex re;                        /* Replace */
    size_t pat_len;                     /* Replace: a {"String"} pattern's length; SIZE_MAX for a regex */
    int clean_text, chinese, strip_accents, lowercase; /* BertNormalizer */
};

int tk_norm_shrink(const tk_norm *n) {
    if (!n) return 1;
    switch (n->type) {
    case N_SEQ: {
        int f = 1;
        for (int i = 0; i < n->n_kids && f; i++) {
            int k = tk_norm_shrink(n->kids[i]);
            f = k && f <= 64 / k ? f * k : 0;
        }
        return f;
    }
    /* composition (a Hangul L V T run: 9 bytes to 3), compatibility forms (U+2126 to
     * U+03A9) and lowercasing (U+212A KELVIN SIGN, 3 bytes, to 'k') shrink by at most 3 */
    case N_NFC: case N_NFD: case N_NFKC: case N_NFKD: case N_LOWER: return 4;
    case N_PREPEND: case N_BYTELEVEL: return 1;
    case N_REPLACE: return n->pat_len != SIZE_MAX && n->content_len >= n->pat_len ? 1 : 0;
    default: return 0; /* Strip, StripAccents, BertNormalizer, Nmt: they delete characters */
    }
}

void tk_norm_free(tk_norm *n) {
    if (!n) return;
    for (int i = 0; i < n->n_kids; i++) tk_norm_free(n->kids[i]);
    free(n->kids);
    free(n->content);
    tk_regex_free(&n->re);
    free(n);
}

gerbil_status tk_parse_pattern(const cJSON *pat, tk_regex *re, const char *what, const char *path) {
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(pat, "String");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
    if (cJSON_IsString(s)) {
        if (!s->valuestring[0]) { re->code = NULL; return GERBIL_OK; } /* an empty string matches nothing */
        return tk_regex_compile(re, s->valuestring, strlen(s->valuestring), 1, path);
    }
    if (cJSON_IsString(r)) return tk_regex_compile(re, r->valuestring, strlen(r->valuestring), 0, path);
    return err_set(GERBIL_ERR_FORMAT, "%s: %s: pattern must be {\"String\": ...} or {\"Regex\": ...}", path, what);
}

static char *dup_str(const char *s, size_t *len) {
    size_t n = strlen(s);
    char *d = malloc(n + 1);
    if (d) memcpy(d, s, n + 1);
    if (len) *len = n;
    return d;
}

gerbil_status tk_norm_parse(const cJSON *j, const char *path, tk_norm **out) {
    *out = NULL;
    if (!j || cJSON_IsNull(j)) return GERBIL_OK;
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (!cJSON_IsString(ty)) return err_set(GERBIL_ERR_FORMAT, "%s: normalizer without a \"type\"", path);
    const char *t = ty->valuestring;
    tk_norm *n = calloc(1, sizeof *n);
    if (!n) return GERBIL_ERR_NOMEM;
    gerbil_status st = GERBIL_OK;
    if (!strcmp(t, "Sequence")) {
        n->type = N_SEQ;
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "normalizers");
        if (!cJSON_IsArray(list)) {
            st = err_set(GERBIL_ERR_FORMAT, "%s: Sequence normalizer without a \"normalizers\" list", path);
        } else {
            int k = cJSON_GetArraySize(list);
            n->kids = calloc((size_t)k + 1, sizeof *n->kids);
            if (!n->kids) st = GERBIL_ERR_NOMEM;
            const cJSON *it;
            cJSON_ArrayForEach(it, list) {
                if (st) break;
                st = tk_norm_parse(it, path, &n->kids[n->n_kids]);
                if (n->kids[n->n_kids]) n->n_kids++;
            }
        }
    } else if (!strcmp(t, "NFC")) n->type = N_NFC;
    else if (!strcmp(t, "NFD")) n->type = N_NFD;
    else if (!strcmp(t, "NFKC")) n->type = N_NFKC;
    else if (!strcmp(t, "NFKD")) n->type = N_NFKD;
    else if (!strcmp(t, "Lowercase")) n->type = N_LOWER;
    else if (!strcmp(t, "StripAccents")) n->type = N_STRIP_ACCENTS;
    else if (!strcmp(t, "Nmt")) n->type = N_NMT;
    else if (!strcmp(t, "ByteLevel")) n->type = N_BYTELEVEL;
    else if (!strcmp(t, "Strip")) {
        n->type = N_STRIP;
        n->left = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "strip_left"));
        n->right = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "strip_right"));
    } else if (!strcmp(t, "Prepend")) {
        n->type = N_PREPEND;
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "prepend");
        if (!cJSON_IsString(p)) st = err_set(GERBIL_ERR_FORMAT, "%s: Prepend normalizer without \"prepend\"", path);
        else if (!(n->content = dup_str(p->valuestring, &n->content_len))) st = GERBIL_ERR_NOMEM;
    } else if (!strcmp(t, "Replace")) {
        n->type = N_REPLACE;
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "content");
        if (!cJSON_IsString(c)) st = err_set(GERBIL_ERR_FORMAT, "%s: Replace normalizer without \"content\"", path);
        else if (!(n->content = dup_str(c->valuestring, &n->content_len))) st = GERBIL_ERR_NOMEM;
        else st = tk_parse_pattern(cJSON_GetObjectItemCaseSensitive(j, "pattern"), &n->re, "Replace normalizer", path);
        const cJSON *lit = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "pattern"), "String");
        n->pat_len = cJSON_IsString(lit) ? strlen(lit->valuestring) : SIZE_MAX;
    } else if (!strcmp(t, "BertNormalizer")) {
        n->type = N_BERT;
        const cJSON *sa = cJSON_GetObjectItemCaseSensitive(j, "strip_accents");
        n->clean_text = json_get_bool(j, "clean_text", 1);
        n->chinese = json_get_bool(j, "handle_chinese_chars", 1);
        n->lowercase = json_get_bool(j, "lowercase", 1);
        n->strip_accents = (sa && cJSON_IsBool(sa)) ? cJSON_IsTrue(sa) : n->lowercase;
    } else if (!strcmp(t, "Precompiled")) {
        st = err_set(GERBIL_ERR_UNSUPPORTED,
                     "%s: normalizer type \"Precompiled\" (a SentencePiece charsmap) is not supported", path);
    } else {
        st = err_set(GERBIL_ERR_UNSUPPORTED, "%s: unknown normalizer type \"%s\"", path, t);
    }
    if (st != GERBIL_OK) {
        tk_norm_free(n);
        return st;
    }
    *out = n;
    return GERBIL_OK;
}

/* Keep the characters for which keep() holds; sets *lost when the first one goes. */
static int filter_first(const char *s, size_t len, tk_buf *o, int (*drop)(uint32_t), int *lost) {
    size_t i = 0;
    int first = 1;
    while (i < len) {
        size_t st = i;
        uint32_t c = tk_utf8_next(s, &i);
        if (drop(c)) {
            if (first) *lost = 1;
            continue;
        }
        first = 0;
        if (tk_buf_put(o, s + st, i - st)) return -1;
    }
    return 0;
}

static int bert_drop(uint32_t c) { return c == 0 || c == 0xFFFD || (c != '\t' && c != '\n' && c != '\r' && tk_is_other(c)); }
static int nmt_drop(uint32_t c) {
    return (c >= 1 && c <= 8) || c == 0x0B || (c >= 0x0E && c <= 0x1F) || c == 0x7F || c == 0x8F || c == 0x9F;
}

static gerbil_status apply_one(const tk_norm *n, tk_ctx *cx, tk_buf *s, int *lost);

static int do_replace(const tk_norm *n, tk_ctx *cx, const char *s, size_t len, tk_buf *o, int *lost) {
    if (!n->re.code) return tk_buf_put(o, s, len);
    if (tk_regex_find_matches(&n->re, cx, s, len, &cx->spans)) return -1;
    for (size_t k = 0; k < cx->spans.n; k++) {
        const tk_span *sp = &cx->spans.v[k];
        if (sp->match) {
            if (sp->s == 0 && sp->e > 0 && n->content_len == 0) *lost = 1;
            if (tk_buf_put(o, n->content, n->content_len)) return -1;
        } else if (tk_buf_put(o, s + sp->s, sp->e - sp->s)) {
            return -1;
        }
    }
    return 0;
}

static gerbil_status apply_one(const tk_norm *n, tk_ctx *cx, tk_buf *s, int *lost) {
    if (n->type == N_SEQ) {
        for (int k = 0; k < n->n_kids; k++) GB_TRY(apply_one(n->kids[k], cx, s, lost));
        return GERBIL_OK;
    }
    tk_buf o = {0};
    const char *p = s->p ? s->p : "";
    size_t len = s->n, i = 0;
    int rc = 0;
    if (tk_buf_reserve(&o, len + 8)) return GERBIL_ERR_NOMEM;
    switch (n->type) {
    case N_NFC: rc = tk_unicode_normalize(p, len, TK_NFC, &o); break;
    case N_NFD: rc = tk_unicode_normalize(p, len, TK_NFD, &o); break;
    case N_NFKC: rc = tk_unicode_normalize(p, len, TK_NFKC, &o); break;
    case N_NFKD: rc = tk_unicode_normalize(p, len, TK_NFKD, &o); break;
    case N_LOWER:
        while (i < len && !rc) rc = tk_put_lower(&o, tk_utf8_next(p, &i));
        break;
    case N_STRIP: {
        size_t a = 0, b = len;
        if (n->left) {
            while (a < len) {
                size_t j = a;
                if (!tk_is_whitespace(tk_utf8_next(p, &j))) break;
                a = j;
            }
            if (a > 0) *lost = 1;
        }
        if (n->right) {
            while (b > a) {
                size_t j = b - 1;
                while (j > a && ((unsigned char)p[j] & 0xC0) == 0x80) j--;
                size_t k = j;
                if (!tk_is_whitespace(tk_utf8_next(p, &k))) break;
                b = j;
            }
        }
        rc = tk_buf_put(&o, p + a, b - a);
        break;
    }
    case N_STRIP_ACCENTS: rc = filter_first(p, len, &o, tk_is_mark, lost); break;
    case N_REPLACE: rc = do_replace(n, cx, p, len, &o, lost); break;
    case N_PREPEND:
        if (len) rc = tk_buf_put(&o, n->content, n->content_len) || tk_buf_put(&o, p, len);
        break;
    case N_NMT: {
        tk_buf t = {0};
        rc = filter_first(p, len, &t, nmt_drop, lost);
        for (i = 0; !rc && i < t.n;) {
            uint32_t c = tk_utf8_next(t.p, &i);
            int sp = c == 9 || c == 10 || c == 12 || c == 13 || c == 0x1680 || (c >= 0x200B && c <= 0x200F) ||
                     c == 0x2028 || c == 0x2029 || c == 0x2581 || c == 0xFEFF || c == 0xFFFD;
            rc = tk_buf_put_cp(&o, sp ? ' ' : c);
        }
        tk_buf_free(&t);
        break;
    }
    case N_BYTELEVEL:
        for (i = 0; i < len && !rc; i++) rc = tk_buf_put_cp(&o, tk_byte_to_cp[(unsigned char)p[i]]);
        break;
    case N_BERT: {
        tk_buf a = {0}, b = {0};
        const char *q = p;
        size_t ql = len;
        if (n->clean_text) {
            tk_buf t = {0};
            rc = filter_first(p, len, &t, bert_drop, lost);
            for (i = 0; !rc && i < t.n;) {
                uint32_t c = tk_utf8_next(t.p, &i);
                rc = tk_buf_put_cp(&a, tk_is_whitespace(c) ? ' ' : c);
            }
            tk_buf_free(&t);
            q = a.p ? a.p : "", ql = a.n;
        }
        if (!rc && n->chinese) {
            for (i = 0; !rc && i < ql;) {
                size_t st = i;
                uint32_t c = tk_utf8_next(q, &i);
                if (tk_is_chinese(c)) rc = tk_buf_putc(&b, ' ') || tk_buf_put(&b, q + st, i - st) || tk_buf_putc(&b, ' ');
                else rc = tk_buf_put(&b, q + st, i - st);
            }
            tk_buf_free(&a);
            a = b;
            memset(&b, 0, sizeof b);
            q = a.p ? a.p : "", ql = a.n;
        }
        if (!rc && n->strip_accents) {
            rc = tk_unicode_normalize(q, ql, TK_NFD, &b);
            tk_buf t = {0};
            for (i = 0; !rc && i < b.n;) {
                size_t st = i;
                uint32_t c = tk_utf8_next(b.p, &i);
                if (!tk_is_mark_nonspacing(c)) rc = tk_buf_put(&t, b.p + st, i - st);
                else if (st == 0) *lost = 1;
            }
            tk_buf_free(&a);
            tk_buf_free(&b);
            a = t;
            q = a.p ? a.p : "", ql = a.n;
        }
        if (!rc && n->lowercase) {
            for (i = 0; !rc && i < ql;) rc = tk_put_lower(&o, tk_utf8_next(q, &i));
        } else if (!rc) {
            rc = tk_buf_put(&o, q, ql);
        }
        tk_buf_free(&a);
        tk_buf_free(&b);
        break;
    }
    default: break;
    }
    if (rc) {
        tk_buf_free(&o);
        return err_set(GERBIL_ERR_NOMEM, "normalizer: out of memory");
    }
    tk_buf_free(s);
    *s = o;
    return GERBIL_OK;
}

gerbil_status tk_norm_apply(const tk_norm *n, tk_ctx *cx, tk_buf *s, int *first_lost) {
    if (!n) return GERBIL_OK;
    return apply_one(n, cx, s, first_lost);
}
