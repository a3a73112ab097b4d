/* tokenizer.json reader. A 33 MB file is mostly model.vocab and model.merges; cJSON
 * would allocate a node per string (about 1.5 M for Gemma 3) and take ~1 s, so those
 * two arrays are scanned here straight into flat arrays and every other value (small:
 * normalizer, added_tokens, ...) is handed to cJSON. */
#include "text/tok_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct js {
    const char *p, *end, *base, *path;
} js;

static gerbil_status js_err(const js *j, const char *what) {
    return err_set(GERBIL_ERR_FORMAT, "%s: malformed JSON near byte %zu: %s", j->path, (size_t)(j->p - j->base), what);
}

static void js_ws(js *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) j->p++;
}

static int hex4(const char *s, uint32_t *v) {
    uint32_t x = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        x <<= 4;
        if (c >= '0' && c <= '9') x |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f') x |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') x |= (uint32_t)(c - 'A' + 10);
        else return -1;
    }
    *v = x;
    return 0;
}

/* Parse a string at j->p and append its bytes to out. */
static gerbil_status js_str(js *j, tk_buf *out) {
    if (j->p >= j->end || *j->p != '"') return js_err(j, "expected a string");
    const char *p = j->p + 1;
    for (;;) {
        const char *q = p;
        while (q < j->end && *q != '"' && *q != '\\') q++;
        if (q >= j->end) return js_err(j, "unterminated string");
        if (q > p && tk_buf_put(out, p, (size_t)(q - p))) return GERBIL_ERR_NOMEM;
        if (*q == '"') {
            j->p = q + 1;
            return GERBIL_OK;
        }
        q++;
        if (q >= j->end) return js_err(j, "unterminated escape");
        char c = *q++;
        const char *rep = NULL;
        switch (c) {
        case '"': rep = "\""; break;
        case '\\': rep = "\\"; break;
        case '/': rep = "/"; break;
        case 'b': rep = "\b"; break;
        case 'f': rep = "\f"; break;
        case 'n': rep = "\n"; break;
        case 'r': rep = "\r"; break;
        case 't': rep = "\t"; break;
        case 'u': {
            uint32_t cp;
            if (j->end - q < 4 || hex4(q, &cp)) return js_err(j, "bad \\u escape");
            q += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                uint32_t lo;
                if (j->end - q >= 6 && q[0] == '\\' && q[1] == 'u' && !hex4(q + 2, &lo) && lo >= 0xDC00 &&
                    lo <= 0xDFFF) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    q += 6;
                } else {
                    cp = 0xFFFD;
                }
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                cp = 0xFFFD;
            }
            if (tk_buf_put_cp(out, cp)) return GERBIL_ERR_NOMEM;
            break;
        }
        default: return js_err(j, "bad escape");
        }
        if (rep && tk_buf_put(out, rep, 1)) return GERBIL_ERR_NOMEM;
        p = q;
    }
}

/* Skip one value of any kind. */
static gerbil_status js_skip(js *j) {
    int depth = 0;
    do {
        js_ws(j);
        if (j->p >= j->end) return js_err(j, "unexpected end");
        char c = *j->p;
        if (c == '"') {
            const char *q = j->p + 1;
            while (q < j->end && *q != '"') q += (*q == '\\') ? 2 : 1;
            if (q >= j->end) return js_err(j, "unterminated string");
            j->p = q + 1;
        } else if (c == '{' || c == '[') {
            depth++;
            j->p++;
        } else if (c == '}' || c == ']') {
            if (!depth) return js_err(j, "unbalanced brackets");
            depth--;
            j->p++;
        } else if (c == ',' || c == ':') {
            if (!depth) return js_err(j, "unexpected separator");
            j->p++;
        } else {
            const char *q = j->p;
            while (q < j->end && *q != ',' && *q != '}' && *q != ']' && *q != ' ' && *q != '\n' && *q != '\t' &&
                   *q != '\r')
                q++;
            if (q == j->p) return js_err(j, "unexpected character");
            j->p = q;
        }
    } while (depth > 0);
    return GERBIL_OK;
}

/* Numbers are read the way serde_json reads them without its float_roundtrip feature
 * (what the tokenizers crate uses): digits into a u64 significand (digits past 19 are
 * dropped), then one multiplication or division by a power of ten. This is not always
 * the correctly rounded double, and Unigram's Viterbi depends on the exact scores. */
static const double POW10[309] = {
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
    1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22, 1e23,
    1e24, 1e25, 1e26, 1e27, 1e28, 1e29, 1e30, 1e31, 1e32, 1e33, 1e34, 1e35,
    1e36, 1e37, 1e38, 1e39, 1e40, 1e41, 1e42, 1e43, 1e44, 1e45, 1e46, 1e47,
    1e48, 1e49, 1e50, 1e51, 1e52, 1e53, 1e54, 1e55, 1e56, 1e57, 1e58, 1e59,
    1e60, 1e61, 1e62, 1e63, 1e64, 1e65, 1e66, 1e67, 1e68, 1e69, 1e70, 1e71,
    1e72, 1e73, 1e74, 1e75, 1e76, 1e77, 1e78, 1e79, 1e80, 1e81, 1e82, 1e83,
    1e84, 1e85, 1e86, 1e87, 1e88, 1e89, 1e90, 1e91, 1e92, 1e93, 1e94, 1e95,
    1e96, 1e97, 1e98, 1e99, 1e100, 1e101, 1e102, 1e103, 1e104, 1e105, 1e106, 1e107,
    1e108, 1e109, 1e110, 1e111, 1e112, 1e113, 1e114, 1e115, 1e116, 1e117, 1e118, 1e119,
    1e120, 1e121, 1e122, 1e123, 1e124, 1e125, 1e126, 1e127, 1e128, 1e129, 1e130, 1e131,
    1e132, 1e133, 1e134, 1e135, 1e136, 1e137, 1e138, 1e139, 1e140, 1e141, 1e142, 1e143,
    1e144, 1e145, 1e146, 1e147, 1e148, 1e149, 1e150, 1e151, 1e152, 1e153, 1e154, 1e155,
    1e156, 1e157, 1e158, 1e159, 1e160, 1e161, 1e162, 1e163, 1e164, 1e165, 1e166, 1e167,
    1e168, 1e169, 1e170, 1e171, 1e172, 1e173, 1e174, 1e175, 1e176, 1e177, 1e178, 1e179,
    1e180, 1e181, 1e182, 1e183, 1e184, 1e185, 1e186, 1e187, 1e188, 1e189, 1e190, 1e191,
    1e192, 1e193, 1e194, 1e195, 1e196, 1e197, 1e198, 1e199, 1e200, 1e201, 1e202, 1e203,
    1e204, 1e205, 1e206, 1e207, 1e208, 1e209, 1e210, 1e211, 1e212, 1e213, 1e214, 1e215,
    1e216, 1e217, 1e218, 1e219, 1e220, 1e221, 1e222, 1e223, 1e224, 1e225, 1e226, 1e227,
    1e228, 1e229, 1e230, 1e231, 1e232, 1e233, 1e234, 1e235, 1e236, 1e237, 1e238, 1e239,
    1e240, 1e241, 1e242, 1e243, 1e244, 1e245, 1e246, 1e247, 1e248, 1e249, 1e250, 1e251,
    1e252, 1e253, 1e254, 1e255, 1e256, 1e257, 1e258, 1e259, 1e260, 1e261, 1e262, 1e263,
    1e264, 1e265, 1e266, 1e267, 1e268, 1e269, 1e270, 1e271, 1e272, 1e273, 1e274, 1e275,
    1e276, 1e277, 1e278, 1e279, 1e280, 1e281, 1e282, 1e283, 1e284, 1e285, 1e286, 1e287,
    1e288, 1e289, 1e290, 1e291, 1e292, 1e293, 1e294, 1e295, 1e296, 1e297, 1e298, 1e299,
    1e300, 1e301, 1e302, 1e303, 1e304, 1e305, 1e306, 1e307, 1e308,
};

static double from_parts(int neg, uint64_t sig, int64_t exp) {
    double f = (double)sig;
    for (;;) {
        int64_t a = exp < 0 ? -exp : exp;
        if (a <= 308) {
            if (exp >= 0) f *= POW10[a];
            else f /= POW10[a];
            break;
        }
        if (f == 0.0) break;
        if (exp >= 0) { f = HUGE_VAL; break; }
        f /= 1e308;
        exp += 308;
    }
    return neg ? -f : f;
}

static gerbil_status js_num(js *j, double *v) {
    const char *q = j->p, *e = j->end;
    int neg = 0;
    if (q < e && *q == '-') { neg = 1; q++; }
    if (q >= e || *q < '0' || *q > '9') return js_err(j, "expected a number");
    uint64_t sig = 0;
    int64_t exp = 0;
    int over = 0;
    while (q < e && *q >= '0' && *q <= '9') {
        uint64_t d = (uint64_t)(*q++ - '0');
        if (over || (sig >= UINT64_MAX / 10 && (sig > UINT64_MAX / 10 || d > UINT64_MAX % 10))) { over = 1; exp++; }
        else sig = sig * 10 + d;
    }
    if (q < e && *q == '.') {
        q++;
        while (q < e && *q >= '0' && *q <= '9') {
            uint64_t d = (uint64_t)(*q++ - '0');
            if (over || (sig >= UINT64_MAX / 10 && (sig > UINT64_MAX / 10 || d > UINT64_MAX % 10))) { over = 1; continue; }
            sig = sig * 10 + d;
            exp--;
        }
    }
    if (q < e && (*q == 'e' || *q == 'E')) {
        q++;
        int eneg = 0;
        if (q < e && (*q == '+' || *q == '-')) eneg = *q++ == '-';
        int64_t x = 0;
        while (q < e && *q >= '0' && *q <= '9') {
            if (x < 100000) x = x * 10 + (*q - '0');
            q++;
        }
        exp += eneg ? -x : x;
    }
    *v = from_parts(neg, sig, exp);
    j->p = q;
    return GERBIL_OK;
}

static gerbil_status js_expect(js *j, char c, const char *what) {
    js_ws(j);
    if (j->p >= j->end || *j->p != c) return js_err(j, what);
    j->p++;
    return GERBIL_OK;
}

/* After a member or element: 1 = another follows, 0 = closed by `close`. */
static gerbil_status js_next(js *j, char close, int *more) {
    js_ws(j);
    if (j->p < j->end && *j->p == ',') { j->p++; *more = 1; return GERBIL_OK; }
    if (j->p < j->end && *j->p == close) { j->p++; *more = 0; return GERBIL_OK; }
    return js_err(j, "expected ',' or a closing bracket");
}

/* Is the container at j->p empty? Consumes the closing bracket if so. */
static int js_empty(js *j, char close) {
    js_ws(j);
    if (j->p < j->end && *j->p == close) { j->p++; return 1; }
    return 0;
}

static int rv_merge(tk_rawvocab *rv, uint64_t a, uint64_t al, uint64_t b, uint64_t bl) {
    if (b + bl > UINT32_MAX) return -1;
    if (rv->n_merges == rv->m_cap) {
        size_t cap = rv->m_cap ? rv->m_cap * 2 : 1024;
        uint32_t *m = realloc(rv->m_off, cap * 4 * sizeof *m);
        if (!m) return -1;
        rv->m_off = m;
        rv->m_cap = cap;
    }
    uint32_t *m = rv->m_off + rv->n_merges * 4;
    m[0] = (uint32_t)a, m[1] = (uint32_t)al, m[2] = (uint32_t)b, m[3] = (uint32_t)bl;
    rv->n_merges++;
    return 0;
}

static gerbil_status read_vocab(js *j, tk_rawvocab *rv) {
    js_ws(j);
    int more = 1;
    if (j->p < j->end && *j->p == '{') {
        j->p++;
        rv->is_list = 0;
        if (js_empty(j, '}')) return GERBIL_OK;
        while (more) {
            js_ws(j);
            uint64_t off = rv->strs.n;
            GB_TRY(js_str(j, &rv->strs));
            uint64_t len = rv->strs.n - off;
            GB_TRY(js_expect(j, ':', "expected ':'"));
            js_ws(j);
            double id;
            GB_TRY(js_num(j, &id));
            if (tk_rawvocab_push(rv, off, (uint32_t)len, id)) return GERBIL_ERR_NOMEM;
            GB_TRY(js_next(j, '}', &more));
        }
        return GERBIL_OK;
    }
    if (j->p < j->end && *j->p == '[') {
        j->p++;
        rv->is_list = 1;
        if (js_empty(j, ']')) return GERBIL_OK;
        while (more) {
            GB_TRY(js_expect(j, '[', "expected [piece, score]"));
            js_ws(j);
            uint64_t off = rv->strs.n;
            GB_TRY(js_str(j, &rv->strs));
            uint64_t len = rv->strs.n - off;
            GB_TRY(js_expect(j, ',', "expected ','"));
            js_ws(j);
            double score;
            GB_TRY(js_num(j, &score));
            GB_TRY(js_expect(j, ']', "expected ']'"));
            if (tk_rawvocab_push(rv, off, (uint32_t)len, score)) return GERBIL_ERR_NOMEM;
            GB_TRY(js_next(j, ']', &more));
        }
        return GERBIL_OK;
    }
    return js_err(j, "model.vocab must be an object or a list");
}

static gerbil_status read_merges(js *j, tk_rawvocab *rv) {
    GB_TRY(js_expect(j, '[', "model.merges must be a list"));
    rv->has_merges = 1;
    if (js_empty(j, ']')) return GERBIL_OK;
    int more = 1;
    while (more) {
        js_ws(j);
        if (j->p < j->end && *j->p == '"') {
            uint64_t off = rv->strs.n;
            GB_TRY(js_str(j, &rv->strs));
            uint64_t len = rv->strs.n - off;
            const char *s = rv->strs.p + off;
            const char *sp = memchr(s, ' ', len);
            if (!sp || memchr(sp + 1, ' ', len - (size_t)(sp + 1 - s)))
                return err_set(GERBIL_ERR_FORMAT, "%s: merge \"%.*s\" is not two tokens separated by one space",
                               j->path, (int)(len > 100 ? 100 : len), s);
            uint64_t al = (uint64_t)(sp - s);
            if (rv_merge(rv, off, al, off + al + 1, len - al - 1)) return GERBIL_ERR_NOMEM;
        } else {
            GB_TRY(js_expect(j, '[', "a merge must be \"a b\" or [a, b]"));
            js_ws(j);
            uint64_t a = rv->strs.n;
            GB_TRY(js_str(j, &rv->strs));
            uint64_t al = rv->strs.n - a;
            GB_TRY(js_expect(j, ',', "expected ','"));
            js_ws(j);
            uint64_t b = rv->strs.n;
            GB_TRY(js_str(j, &rv->strs));
            uint64_t bl = rv->strs.n - b;
            GB_TRY(js_expect(j, ']', "expected ']'"));
            if (rv_merge(rv, a, al, b, bl)) return GERBIL_ERR_NOMEM;
        }
        GB_TRY(js_next(j, ']', &more));
    }
    return GERBIL_OK;
}

/* Hand one value to cJSON and add it to obj under key. */
static gerbil_status add_cjson(js *j, cJSON *obj, const char *key) {
    js_ws(j);
    const char *start = j->p;
    GB_TRY(js_skip(j));
    cJSON *it = cJSON_ParseWithLength(start, (size_t)(j->p - start));
    if (!it) {
        j->p = start;
        return js_err(j, "cannot parse value");
    }
    if (!cJSON_AddItemToObject(obj, key, it)) {
        cJSON_Delete(it);
        return GERBIL_ERR_NOMEM;
    }
    return GERBIL_OK;
}

static gerbil_status read_object(js *j, cJSON *obj, tk_rawvocab *rv, int is_model) {
    GB_TRY(js_expect(j, '{', "expected an object"));
    if (js_empty(j, '}')) return GERBIL_OK;
    tk_buf key = {0};
    gerbil_status st = GERBIL_OK;
    int more = 1;
    while (more && st == GERBIL_OK) {
        js_ws(j);
        key.n = 0;
        if ((st = js_str(j, &key)) || (st = tk_buf_putc(&key, 0) ? GERBIL_ERR_NOMEM : GERBIL_OK)) break;
        if ((st = js_expect(j, ':', "expected ':'"))) break;
        js_ws(j);
        if (!is_model && !strcmp(key.p, "model") && j->p < j->end && *j->p == '{') {
            cJSON *m = cJSON_CreateObject();
            if (!m || !cJSON_AddItemToObject(obj, "model", m)) {
                cJSON_Delete(m);
                st = GERBIL_ERR_NOMEM;
                break;
            }
            st = read_object(j, m, rv, 1);
        } else if (is_model && !strcmp(key.p, "vocab")) {
            st = read_vocab(j, rv);
        } else if (is_model && !strcmp(key.p, "merges")) {
            st = read_merges(j, rv);
        } else {
            st = add_cjson(j, obj, key.p);
        }
        if (st == GERBIL_OK) st = js_next(j, '}', &more);
    }
    tk_buf_free(&key);
    return st;
}

gerbil_status tk_json_read(const char *buf, size_t len, const char *path, cJSON **root, tk_rawvocab *rv) {
    js j = {buf, buf + len, buf, path};
    /* the vocab and merge strings are shorter than the file: one allocation, no regrowth */
    if (tk_buf_reserve(&rv->strs, len + 1)) return GERBIL_ERR_NOMEM;
    *root = cJSON_CreateObject();
    if (!*root) return GERBIL_ERR_NOMEM;
    gerbil_status st = read_object(&j, *root, rv, 0);
    if (st == GERBIL_OK) {
        js_ws(&j);
        while (j.p < j.end && *j.p == 0) j.p++;
        if (j.p != j.end) st = js_err(&j, "data after the top-level object");
    }
    if (st != GERBIL_OK) {
        cJSON_Delete(*root);
        *root = NULL;
    }
    return st;
}

int tk_rawvocab_push(tk_rawvocab *rv, uint64_t off, uint32_t len, double num) {
    if (rv->n == rv->cap) {
        size_t cap = rv->cap ? rv->cap * 2 : 1024;
        uint64_t *o = realloc(rv->off, cap * sizeof *o);
        if (!o) return -1;
        rv->off = o;
        uint32_t *l = realloc(rv->len, cap * sizeof *l);
        if (!l) return -1;
        rv->len = l;
        double *d = realloc(rv->num, cap * sizeof *d);
        if (!d) return -1;
        rv->num = d;
        rv->cap = cap;
    }
    rv->off[rv->n] = off;
    rv->len[rv->n] = len;
    rv->num[rv->n] = num;
    rv->n++;
    return 0;
}

void tk_rawvocab_free(tk_rawvocab *v) {
    tk_buf_free(&v->strs);
    free(v->off);
    free(v->len);
    free(v->num);
    free(v->m_off);
    memset(v, 0, sizeof *v);
}
