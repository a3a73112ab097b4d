/* Jinja values: arena, constructors, Python truthiness / equality / ordering, str(),
 * repr(), json.dumps() and json.loads(). */
#include "text/jinja.h"
#include "base/status.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

jv jv_undef_v = {.type = JV_UNDEF}, jv_none_v = {.type = JV_NONE};
jv jv_true_v = {.type = JV_BOOL, .i = 1}, jv_false_v = {.type = JV_BOOL, .i = 0};

/* ---- arena ---- */
struct jarena_chunk {
    struct jarena_chunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

void *ja_alloc(jarena *a, size_t n) {
    void *p = ja_alloc_raw(a, n);
    if (p) memset(p, 0, n);
    return p;
}

void *ja_alloc_raw(jarena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (a->oom || n > JINJA_MAX_MEMORY || a->used_total + n > JINJA_MAX_MEMORY) { a->oom = 1; return NULL; }
    struct jarena_chunk *h = a->head;
    if (!h || h->cap - h->used < n) {
        size_t cap = n > (64u << 10) ? n : (64u << 10);
        h = malloc(sizeof *h + cap);
        if (!h) { a->oom = 1; return NULL; }
        h->used = 0;
        h->cap = cap;
        /* a big block goes behind the current head so the head keeps its free space */
        if (a->head && n > (16u << 10)) {
            h->next = a->head->next;
            a->head->next = h;
        } else {
            h->next = a->head;
            a->head = h;
        }
    }
    void *p = h->data + h->used;
    h->used += n;
    a->used_total += n;
    return p;
}

void ja_free_all(jarena *a) {
    struct jarena_chunk *h = a->head;
    while (h) {
        struct jarena_chunk *nx = h->next;
        free(h);
        h = nx;
    }
    a->head = NULL;
    a->used_total = 0;
}

char *ja_strndup(jarena *a, const char *s, size_t n) {
    char *p = ja_alloc(a, n + 1);
    if (p) { memcpy(p, s, n); p[n] = 0; }
    return p;
}

/* ---- errors ---- */
void *jerr(jctx *c, int line, const char *fmt, ...) {
    if (c->status != GERBIL_OK) return NULL;
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (line > 0) c->status = err_set(GERBIL_ERR_FORMAT, "template line %d: %s", line, msg);
    else c->status = err_set(GERBIL_ERR_FORMAT, "template: %s", msg); /* a limit of the whole render */
    return NULL;
}

void *jerr_raise(jctx *c, const char *msg) {
    if (c->status != GERBIL_OK) return NULL;
    c->status = err_set(GERBIL_ERR_INVALID_ARG, "%s", msg);
    return NULL;
}

static void *oom(jctx *c) {
    if (c->status == GERBIL_OK)
        c->status = err_set(GERBIL_ERR_NOMEM, "template: out of memory (render uses over %d MiB)",
                            JINJA_MAX_MEMORY >> 20);
    return NULL;
}

static void *alloc(jctx *c, size_t n) {
    void *p = ja_alloc(&c->arena, n);
    return p ? p : oom(c);
}

/* ---- constructors ---- */
jv *jv_bool(int b) { return b ? JV_TRUE : JV_FALSE; }

static jv *newv(jctx *c, int type) {
    jv *v = alloc(c, sizeof *v);
    if (v) v->type = (uint8_t)type;
    return v;
}

jv *jv_int(jctx *c, int64_t i) {
    jv *v = newv(c, JV_INT);
    if (v) v->i = i;
    return v;
}

jv *jv_float(jctx *c, double f) {
    jv *v = newv(c, JV_FLOAT);
    if (v) v->f = f;
    return v;
}

jv *jv_str(jctx *c, const char *s, size_t n) {
    if (n > JINJA_MAX_OUTPUT) return jerr(c, 0, "string longer than %d MiB", JINJA_MAX_OUTPUT >> 20);
    jv *v = newv(c, JV_STR);
    if (!v) return NULL;
    v->s.p = alloc(c, n + 1);
    if (!v->s.p) return NULL;
    if (n) memcpy(v->s.p, s, n);
    v->s.p[n] = 0;
    v->s.n = n;
    return v;
}

jv *jv_cstr(jctx *c, const char *s) { return jv_str(c, s, strlen(s)); }

jv *jv_list(jctx *c, size_t cap) {
    jv *v = newv(c, JV_LIST);
    if (!v) return NULL;
    if (cap) {
        v->l.v = alloc(c, cap * sizeof(jv *));
        if (!v->l.v) return NULL;
        v->l.cap = cap;
    }
    return v;
}

jv *jv_dict(jctx *c, size_t cap) {
    jv *v = newv(c, JV_DICT);
    if (!v) return NULL;
    if (cap) {
        v->d.k = alloc(c, cap * sizeof(jv *));
        v->d.v = alloc(c, cap * sizeof(jv *));
        if (!v->d.k || !v->d.v) return NULL;
        v->d.cap = cap;
    }
    return v;
}

jv *jv_undef_hint(jctx *c, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    jv *v = newv(c, JV_UNDEF);
    if (v) v->u.hint = ja_strndup(&c->arena, msg, strlen(msg));
    return v;
}

jv *jv_native(jctx *c, jv_native_fn fn, jv *self, const char *name) {
    jv *v = newv(c, JV_NATIVE);
    if (v) { v->nat.fn = fn; v->nat.self = self; v->nat.name = name; }
    return v;
}

int jv_list_push(jctx *c, jv *l, jv *x) {
    if (l->l.n == l->l.cap) {
        size_t cap = l->l.cap ? l->l.cap * 2 : 8;
        jv **nv = alloc(c, cap * sizeof(jv *));
        if (!nv) return -1;
        if (l->l.n) memcpy(nv, l->l.v, l->l.n * sizeof(jv *));
        l->l.v = nv;
        l->l.cap = cap;
    }
    l->l.v[l->l.n++] = x;
    return 0;
}

jv *jv_dict_get(jv *d, jv *k) {
    for (size_t i = 0; i < d->d.n; i++)
        if (jv_equal(d->d.k[i], k)) return d->d.v[i];
    return NULL;
}

jv *jv_dict_gets(jv *d, const char *k) {
    size_t n = strlen(k);
    for (size_t i = 0; i < d->d.n; i++) {
        jv *kk = d->d.k[i];
        if (kk->type == JV_STR && kk->s.n == n && !memcmp(kk->s.p, k, n)) return d->d.v[i];
    }
    return NULL;
}

int jv_dict_set(jctx *c, jv *d, jv *k, jv *x) {
    for (size_t i = 0; i < d->d.n; i++)
        if (jv_equal(d->d.k[i], k)) { d->d.v[i] = x; return 0; }
    if (d->d.n == d->d.cap) {
        size_t cap = d->d.cap ? d->d.cap * 2 : 8;
        jv **nk = alloc(c, cap * sizeof(jv *)), **nv = alloc(c, cap * sizeof(jv *));
        if (!nk || !nv) return -1;
        if (d->d.n) {
            memcpy(nk, d->d.k, d->d.n * sizeof(jv *));
            memcpy(nv, d->d.v, d->d.n * sizeof(jv *));
        }
        d->d.k = nk;
        d->d.v = nv;
        d->d.cap = cap;
    }
    d->d.k[d->d.n] = k;
    d->d.v[d->d.n++] = x;
    return 0;
}

/* ---- string builder ---- */
int jsb_put(jctx *c, jsb *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        if (b->n + n > JINJA_MAX_OUTPUT) {
            jerr(c, 0, "output longer than %d MiB", JINJA_MAX_OUTPUT >> 20);
            return -1;
        }
        size_t cap = b->cap ? b->cap * 2 : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *np = ja_alloc_raw(&c->arena, cap);
        if (!np) { oom(c); return -1; }
        if (b->n) memcpy(np, b->p, b->n);
        b->p = np;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

int jsb_puts(jctx *c, jsb *b, const char *s) { return jsb_put(c, b, s, strlen(s)); }
int jsb_putc(jctx *c, jsb *b, char ch) { return jsb_put(c, b, &ch, 1); }

int jsb_printf(jctx *c, jsb *b, const char *fmt, ...) {
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0) return -1;
    return jsb_put(c, b, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
}

jv *jsb_to_str(jctx *c, jsb *b) {
    jv *v = newv(c, JV_STR);
    if (!v) return NULL;
    if (!b->p && jsb_put(c, b, "", 0)) return NULL;
    v->s.p = b->p;
    v->s.n = b->n;
    return v;
}

/* ---- UTF-8 ---- */
int ju_decode(const char *s, size_t n, size_t *i) {
    utf8proc_int32_t cp;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + *i, (utf8proc_ssize_t)(n - *i), &cp);
    if (k <= 0) { (*i)++; return 0xFFFD; }
    *i += (size_t)k;
    return cp;
}

int ju_encode(int cp, char *out) { return (int)utf8proc_encode_char(cp, (utf8proc_uint8_t *)out); }

int ju_isspace(int cp) {
    if (cp == ' ' || (cp >= 9 && cp <= 13) || (cp >= 0x1c && cp <= 0x1f) || cp == 0x85 || cp == 0xa0)
        return 1;
    if (cp < 0x1680) return 0;
    return cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

size_t jv_utf8_len(const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) k++;
    return k;
}

/* ---- Python semantics ---- */
int jv_is_seq(const jv *v) { return v->type == JV_LIST; }
int jv_is_num(const jv *v) { return v->type == JV_BOOL || v->type == JV_INT || v->type == JV_FLOAT; }
double jv_num(const jv *v) { return v->type == JV_FLOAT ? v->f : (double)v->i; }

int jv_truthy(const jv *v) {
    switch (v->type) {
    case JV_UNDEF: case JV_NONE: return 0;
    case JV_BOOL: case JV_INT: return v->i != 0;
    case JV_FLOAT: return v->f != 0.0;
    case JV_STR: return v->s.n != 0;
    case JV_LIST: return v->l.n != 0;
    case JV_DICT: return v->d.n != 0;
    default: return 1;
    }
}

int jv_equal(const jv *a, const jv *b) {
    if (a == b) return 1;
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a->type != JV_FLOAT && b->type != JV_FLOAT) return a->i == b->i;
        return jv_num(a) == jv_num(b);
    }
    if (a->type != b->type) return 0;
    switch (a->type) {
    case JV_UNDEF: case JV_NONE: return 1;
    case JV_STR: return a->s.n == b->s.n && !memcmp(a->s.p, b->s.p, a->s.n);
    case JV_LIST:
        if (a->tuple != b->tuple || a->l.n != b->l.n) return 0;
        for (size_t i = 0; i < a->l.n; i++)
            if (!jv_equal(a->l.v[i], b->l.v[i])) return 0;
        return 1;
    case JV_DICT:
        if (a->d.n != b->d.n) return 0;
        for (size_t i = 0; i < a->d.n; i++) {
            jv *o = jv_dict_get((jv *)b, a->d.k[i]);
            if (!o || !jv_equal(a->d.v[i], o)) return 0;
        }
        return 1;
    case JV_NATIVE: return a->nat.fn == b->nat.fn && a->nat.self == b->nat.self;
    default: return 0;
    }
}

const char *jv_type_name(const jv *v) {
    switch (v->type) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST: return v->tuple ? "tuple" : "list";
    case JV_DICT: return "dict";
    case JV_NS: return "Namespace";
    case JV_MACRO: return "Macro";
    case JV_NATIVE: return "builtin_function_or_method";
    case JV_LOOP: return "LoopContext";
    }
    return "object";
}

int jv_compare(jctx *c, int line, const jv *a, const jv *b, int *out) {
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a->type != JV_FLOAT && b->type != JV_FLOAT) *out = (a->i > b->i) - (a->i < b->i);
        else *out = (jv_num(a) > jv_num(b)) - (jv_num(a) < jv_num(b));
        return 0;
    }
    if (a->type == JV_STR && b->type == JV_STR) {
        size_t m = a->s.n < b->s.n ? a->s.n : b->s.n;
        int r = memcmp(a->s.p, b->s.p, m); /* UTF-8 byte order is code point order */
        *out = r ? (r > 0 ? 1 : -1) : (a->s.n > b->s.n) - (a->s.n < b->s.n);
        return 0;
    }
    if (a->type == JV_LIST && b->type == JV_LIST && a->tuple == b->tuple) {
        for (size_t i = 0; i < a->l.n && i < b->l.n; i++) {
            if (jv_equal(a->l.v[i], b->l.v[i])) continue;
            return jv_compare(c, line, a->l.v[i], b->l.v[i], out);
        }
        *out = (a->l.n > b->l.n) - (a->l.n < b->l.n);
        return 0;
    }
    jerr(c, line, "'<' not supported between instances of '%s' and '%s'", jv_type_name(a), jv_type_name(b));
    return -1;
}

/* ---- float repr: the shortest digits that round-trip, laid out as Python does ---- */
void jv_float_repr(double f, char *buf, size_t cap) {
    if (isnan(f)) { snprintf(buf, cap, "nan"); return; }
    if (isinf(f)) { snprintf(buf, cap, f < 0 ? "-inf" : "inf"); return; }
    char tmp[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f) break;
    }
    /* tmp = [-]d.ddde[+-]XX: pull out the digits and the exponent */
    char digits[24];
    int nd = 0, neg = tmp[0] == '-';
    const char *p = tmp + neg;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9') digits[nd++] = *p;
    int exp = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    char *o = buf;
    size_t left = cap;
#define OUT(...) do { int k_ = snprintf(o, left, __VA_ARGS__); if (k_ < 0 || (size_t)k_ >= left) return; o += k_; left -= (size_t)k_; } while (0)
    if (neg) OUT("-");
    if (exp >= 16 || exp < -4) {
        OUT("%c", digits[0]);
        if (nd > 1) OUT(".%s", digits + 1);
        OUT("e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    } else if (exp < 0) {
        OUT("0.");
        for (int i = -1; i > exp; i--) OUT("0");
        OUT("%s", digits);
    } else {
        for (int i = 0; i <= exp; i++) OUT("%c", i < nd ? digits[i] : '0');
        OUT(".");
        if (nd > exp + 1) OUT("%s", digits + exp + 1);
        else OUT("0");
    }
#undef OUT
}

/* ---- str() and repr() ---- */
static int repr_str(jctx *c, jsb *b, const char *s, size_t n) {
    int q = '\'';
    if (memchr(s, '\'', n) && !memchr(s, '"', n)) q = '"';
    if (jsb_putc(c, b, (char)q)) return -1;
    size_t i = 0;
    while (i < n) {
        size_t st = i;
        int cp = ju_decode(s, n, &i);
        char e[16];
        if (cp == q || cp == '\\') { e[0] = '\\'; e[1] = (char)cp; e[2] = 0; }
        else if (cp == '\n') strcpy(e, "\\n");
        else if (cp == '\r') strcpy(e, "\\r");
        else if (cp == '\t') strcpy(e, "\\t");
        else if (cp < 0x20 || cp == 0x7f) snprintf(e, sizeof e, "\\x%02x", cp);
        else if (cp >= 0x80) {
            utf8proc_category_t cat = utf8proc_category(cp);
            int printable = !(cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF ||
                              cat == UTF8PROC_CATEGORY_CS || cat == UTF8PROC_CATEGORY_CO ||
                              cat == UTF8PROC_CATEGORY_CN || cat == UTF8PROC_CATEGORY_ZL ||
                              cat == UTF8PROC_CATEGORY_ZP || cat == UTF8PROC_CATEGORY_ZS);
            if (printable) { if (jsb_put(c, b, s + st, i - st)) return -1; continue; }
            if (cp < 0x100) snprintf(e, sizeof e, "\\x%02x", cp);
            else if (cp < 0x10000) snprintf(e, sizeof e, "\\u%04x", cp);
            else snprintf(e, sizeof e, "\\U%08x", cp);
        } else { if (jsb_put(c, b, s + st, i - st)) return -1; continue; }
        if (jsb_puts(c, b, e)) return -1;
    }
    return jsb_putc(c, b, (char)q);
}

static int str_or_repr(jctx *c, jsb *b, const jv *v, int repr) {
    char num[64];
    switch (v->type) {
    case JV_UNDEF: return 0;
    case JV_NONE: return jsb_puts(c, b, "None");
    case JV_BOOL: return jsb_puts(c, b, v->i ? "True" : "False");
    case JV_INT: return jsb_printf(c, b, "%lld", (long long)v->i);
    case JV_FLOAT: jv_float_repr(v->f, num, sizeof num); return jsb_puts(c, b, num);
    case JV_STR: return repr ? repr_str(c, b, v->s.p, v->s.n) : jsb_put(c, b, v->s.p, v->s.n);
    case JV_LIST:
        if (++c->depth > JINJA_MAX_DEPTH) { jerr(c, 0, "value nested too deeply to print"); return -1; }
        if (jsb_putc(c, b, v->tuple ? '(' : '[')) return -1;
        for (size_t i = 0; i < v->l.n; i++) {
            if (i && jsb_puts(c, b, ", ")) return -1;
            if (str_or_repr(c, b, v->l.v[i], 1)) return -1;
        }
        if (v->tuple && v->l.n == 1 && jsb_putc(c, b, ',')) return -1;
        c->depth--;
        return jsb_putc(c, b, v->tuple ? ')' : ']');
    case JV_DICT: case JV_NS:
        if (++c->depth > JINJA_MAX_DEPTH) { jerr(c, 0, "value nested too deeply to print"); return -1; }
        if (v->type == JV_NS && jsb_puts(c, b, "<Namespace ")) return -1;
        if (jsb_putc(c, b, '{')) return -1;
        for (size_t i = 0; i < v->d.n; i++) {
            if (i && jsb_puts(c, b, ", ")) return -1;
            if (str_or_repr(c, b, v->d.k[i], 1) || jsb_puts(c, b, ": ") ||
                str_or_repr(c, b, v->d.v[i], 1))
                return -1;
        }
        c->depth--;
        if (jsb_putc(c, b, '}')) return -1;
        return v->type == JV_NS ? jsb_putc(c, b, '>') : 0;
    case JV_MACRO: return jsb_printf(c, b, "<Macro '%.*s'>", (int)v->mac.node->slen, v->mac.node->str);
    case JV_NATIVE: return jsb_printf(c, b, "<built-in method %s>", v->nat.name);
    case JV_LOOP: return jsb_puts(c, b, "<LoopContext>");
    }
    return 0;
}

int jv_str_into(jctx *c, jsb *b, const jv *v) { return str_or_repr(c, b, v, 0); }
int jv_repr_into(jctx *c, jsb *b, const jv *v) { return str_or_repr(c, b, v, 1); }

jv *jv_to_str(jctx *c, jv *v) {
    if (v->type == JV_STR) return v;
    jsb b = {0};
    if (jv_str_into(c, &b, v)) return NULL;
    return jsb_to_str(c, &b);
}

/* ---- json.dumps ---- */
static int json_str(jctx *c, jsb *b, const char *s, size_t n, int ensure_ascii) {
    if (jsb_putc(c, b, '"')) return -1;
    size_t i = 0;
    while (i < n) {
        size_t st = i;
        unsigned char ch = (unsigned char)s[i];
        char e[16];
        if (ch >= 0x80) {
            int cp = ju_decode(s, n, &i);
            if (!ensure_ascii) { if (jsb_put(c, b, s + st, i - st)) return -1; continue; }
            if (cp >= 0x10000) {
                cp -= 0x10000;
                snprintf(e, sizeof e, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
            } else snprintf(e, sizeof e, "\\u%04x", cp);
            if (jsb_puts(c, b, e)) return -1;
            continue;
        }
        i++;
        switch (ch) {
        case '"': strcpy(e, "\\\""); break;
        case '\\': strcpy(e, "\\\\"); break;
        case '\n': strcpy(e, "\\n"); break;
        case '\r': strcpy(e, "\\r"); break;
        case '\t': strcpy(e, "\\t"); break;
        case '\b': strcpy(e, "\\b"); break;
        case '\f': strcpy(e, "\\f"); break;
        default:
            if (ch < 0x20 || (ch == 0x7f && ensure_ascii)) snprintf(e, sizeof e, "\\u%04x", ch);
            else { e[0] = (char)ch; e[1] = 0; }
        }
        if (jsb_puts(c, b, e)) return -1;
    }
    return jsb_putc(c, b, '"');
}

static int json_newline(jctx *c, jsb *b, const jjson_opts *o, int level) {
    if (jsb_putc(c, b, '\n')) return -1;
    for (int i = 0; i < level; i++)
        if (o->indent_str ? jsb_puts(c, b, o->indent_str) : jsb_printf(c, b, "%*s", o->indent, ""))
            return -1;
    return 0;
}

/* Sort order of dict keys for sort_keys: index permutation, insertion sort (small). */
static int json_key_order(jctx *c, int line, const jv *d, size_t *idx) {
    for (size_t i = 0; i < d->d.n; i++) idx[i] = i;
    for (size_t i = 1; i < d->d.n; i++) {
        size_t t = idx[i], j = i;
        while (j > 0) {
            int r;
            if (jv_compare(c, line, d->d.k[idx[j - 1]], d->d.k[t], &r)) return -1;
            if (r <= 0) break;
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = t;
    }
    return 0;
}

int jv_json_into(jctx *c, int line, jsb *b, const jv *v, const jjson_opts *o, int level) {
    char num[64];
    int pretty = o->indent >= 0 || o->indent_str;
    switch (v->type) {
    case JV_NONE: return jsb_puts(c, b, "null");
    case JV_BOOL: return jsb_puts(c, b, v->i ? "true" : "false");
    case JV_INT: return jsb_printf(c, b, "%lld", (long long)v->i);
    case JV_FLOAT:
        if (isnan(v->f)) return jsb_puts(c, b, "NaN");
        if (isinf(v->f)) return jsb_puts(c, b, v->f < 0 ? "-Infinity" : "Infinity");
        jv_float_repr(v->f, num, sizeof num);
        return jsb_puts(c, b, num);
    case JV_STR: return json_str(c, b, v->s.p, v->s.n, o->ensure_ascii);
    case JV_LIST:
        if (level > JINJA_MAX_DEPTH) { jerr(c, line, "tojson: value nested too deeply"); return -1; }
        if (!v->l.n) return jsb_puts(c, b, "[]");
        if (jsb_putc(c, b, '[')) return -1;
        for (size_t i = 0; i < v->l.n; i++) {
            if (i && jsb_puts(c, b, o->item_sep)) return -1;
            if (pretty && json_newline(c, b, o, level + 1)) return -1;
            if (jv_json_into(c, line, b, v->l.v[i], o, level + 1)) return -1;
        }
        if (pretty && json_newline(c, b, o, level)) return -1;
        return jsb_putc(c, b, ']');
    case JV_DICT: {
        if (level > JINJA_MAX_DEPTH) { jerr(c, line, "tojson: value nested too deeply"); return -1; }
        if (!v->d.n) return jsb_puts(c, b, "{}");
        size_t *idx = alloc(c, v->d.n * sizeof(size_t));
        if (!idx) return -1;
        if (o->sort_keys) { if (json_key_order(c, line, v, idx)) return -1; }
        else for (size_t i = 0; i < v->d.n; i++) idx[i] = i;
        if (jsb_putc(c, b, '{')) return -1;
        for (size_t i = 0; i < v->d.n; i++) {
            const jv *k = v->d.k[idx[i]];
            if (i && jsb_puts(c, b, o->item_sep)) return -1;
            if (pretty && json_newline(c, b, o, level + 1)) return -1;
            int r;
            if (k->type == JV_STR) r = json_str(c, b, k->s.p, k->s.n, o->ensure_ascii);
            else if (k->type == JV_BOOL) r = jsb_puts(c, b, k->i ? "\"true\"" : "\"false\"");
            else if (k->type == JV_NONE) r = jsb_puts(c, b, "\"null\"");
            else if (k->type == JV_INT || k->type == JV_FLOAT) {
                jsb t = {0};
                r = jv_str_into(c, &t, k) || json_str(c, b, t.p, t.n, 0);
            } else {
                jerr(c, line, "tojson: keys must be str, int, float, bool or None, not %s", jv_type_name(k));
                return -1;
            }
            if (r || jsb_puts(c, b, o->key_sep) || jv_json_into(c, line, b, v->d.v[idx[i]], o, level + 1))
                return -1;
        }
        if (pretty && json_newline(c, b, o, level)) return -1;
        return jsb_putc(c, b, '}');
    }
    default:
        jerr(c, line, "tojson: Object of type %s is not JSON serializable", jv_type_name(v));
        return -1;
    }
}

/* ---- json.loads ---- */
typedef struct { jctx *c; const char *s; size_t n, i; int depth; } jparse;

static void jp_ws(jparse *p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r'))
        p->i++;
}

static void *jp_fail(jparse *p, const char *what) {
    if (p->c->status == GERBIL_OK)
        p->c->status = err_set(GERBIL_ERR_FORMAT, "template context: invalid JSON at byte %zu: %s", p->i, what);
    return NULL;
}

static int jp_hex4(jparse *p) {
    if (p->i + 4 > p->n) return -1;
    int v = 0;
    for (int k = 0; k < 4; k++) {
        char ch = p->s[p->i + k];
        int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
              : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    p->i += 4;
    return v;
}

static jv *jp_string(jparse *p) {
    jsb b = {0};
    p->i++; /* opening quote */
    for (;;) {
        if (p->i >= p->n) return jp_fail(p, "unterminated string");
        size_t st = p->i;
        while (p->i < p->n && p->s[p->i] != '"' && p->s[p->i] != '\\' && (unsigned char)p->s[p->i] >= 0x20) p->i++;
        if (jsb_put(p->c, &b, p->s + st, p->i - st)) return NULL;
        if (p->i >= p->n) return jp_fail(p, "unterminated string");
        char ch = p->s[p->i];
        if (ch == '"') { p->i++; break; }
        if ((unsigned char)ch < 0x20) return jp_fail(p, "control character in string");
        p->i++;
        if (p->i >= p->n) return jp_fail(p, "bad escape");
        char e = p->s[p->i++], out[8];
        int cp = -1;
        switch (e) {
        case '"': case '\\': case '/': out[0] = e; break;
        case 'n': out[0] = '\n'; break;
        case 't': out[0] = '\t'; break;
        case 'r': out[0] = '\r'; break;
        case 'b': out[0] = '\b'; break;
        case 'f': out[0] = '\f'; break;
        case 'u':
            cp = jp_hex4(p);
            if (cp < 0) return jp_fail(p, "bad \\u escape");
            if (cp >= 0xD800 && cp < 0xDC00 && p->i + 1 < p->n && p->s[p->i] == '\\' && p->s[p->i + 1] == 'u') {
                size_t save = p->i;
                p->i += 2;
                int lo = jp_hex4(p);
                if (lo >= 0xDC00 && lo < 0xE000) cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                else p->i = save;
            }
            break;
        default: return jp_fail(p, "bad escape");
        }
        if (cp >= 0) {
            if (cp >= 0xD800 && cp < 0xE000) cp = 0xFFFD; /* lone surrogate: not valid UTF-8 */
            if (jsb_put(p->c, &b, out, (size_t)ju_encode(cp, out))) return NULL;
        } else if (jsb_put(p->c, &b, out, 1)) return NULL;
    }
    return jsb_to_str(p->c, &b);
}

static jv *jp_value(jparse *p) {
    jp_ws(p);
    if (p->i >= p->n) return jp_fail(p, "unexpected end");
    if (++p->depth > JINJA_MAX_DEPTH) return jp_fail(p, "nested too deeply");
    char ch = p->s[p->i];
    jv *r = NULL;
    if (ch == '{') {
        p->i++;
        r = jv_dict(p->c, 0);
        if (!r) return NULL;
        jp_ws(p);
        if (p->i < p->n && p->s[p->i] == '}') p->i++;
        else for (;;) {
            jp_ws(p);
            if (p->i >= p->n || p->s[p->i] != '"') return jp_fail(p, "expected a key");
            jv *k = jp_string(p);
            if (!k) return NULL;
            jp_ws(p);
            if (p->i >= p->n || p->s[p->i] != ':') return jp_fail(p, "expected ':'");
            p->i++;
            jv *x = jp_value(p);
            if (!x || jv_dict_set(p->c, r, k, x)) return NULL;
            jp_ws(p);
            if (p->i < p->n && p->s[p->i] == ',') { p->i++; continue; }
            if (p->i < p->n && p->s[p->i] == '}') { p->i++; break; }
            return jp_fail(p, "expected ',' or '}'");
        }
    } else if (ch == '[') {
        p->i++;
        r = jv_list(p->c, 0);
        if (!r) return NULL;
        jp_ws(p);
        if (p->i < p->n && p->s[p->i] == ']') p->i++;
        else for (;;) {
            jv *x = jp_value(p);
            if (!x || jv_list_push(p->c, r, x)) return NULL;
            jp_ws(p);
            if (p->i < p->n && p->s[p->i] == ',') { p->i++; continue; }
            if (p->i < p->n && p->s[p->i] == ']') { p->i++; break; }
            return jp_fail(p, "expected ',' or ']'");
        }
    } else if (ch == '"') {
        r = jp_string(p);
    } else if (ch == '-' || (ch >= '0' && ch <= '9')) {
        size_t st = p->i;
        int is_float = 0;
        if (p->s[p->i] == '-') p->i++;
        while (p->i < p->n) {
            char d = p->s[p->i];
            if (d == '.' || d == 'e' || d == 'E') is_float = 1;
            else if (!((d >= '0' && d <= '9') || ((d == '+' || d == '-') && is_float))) break;
            p->i++;
        }
        char buf[64];
        size_t len = p->i - st;
        if (len == 0 || len >= sizeof buf) return jp_fail(p, "bad number");
        memcpy(buf, p->s + st, len);
        buf[len] = 0;
        char *end;
        if (!is_float) {
            long long v = strtoll(buf, &end, 10);
            if (*end) return jp_fail(p, "bad number");
            r = jv_int(p->c, v); /* beyond int64 saturates: Python would keep a big int */
        } else {
            double v = strtod(buf, &end);
            if (*end) return jp_fail(p, "bad number");
            r = jv_float(p->c, v);
        }
    } else if (p->n - p->i >= 4 && !memcmp(p->s + p->i, "true", 4)) { p->i += 4; r = JV_TRUE; }
    else if (p->n - p->i >= 5 && !memcmp(p->s + p->i, "false", 5)) { p->i += 5; r = JV_FALSE; }
    else if (p->n - p->i >= 4 && !memcmp(p->s + p->i, "null", 4)) { p->i += 4; r = JV_NONEV; }
    else return jp_fail(p, "unexpected character");
    p->depth--;
    return r;
}

jv *jv_parse_json(jctx *c, const char *s, size_t n) {
    jparse p = {c, s, n, 0, 0};
    jv *v = jp_value(&p);
    if (!v) return NULL;
    jp_ws(&p);
    if (p.i != n) return jp_fail(&p, "trailing characters");
    return v;
}
