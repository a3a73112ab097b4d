/* Python str behaviour for Jinja (case mapping, strip, split, replace, format, ...),
 * the str and dict methods templates call, and the globals transformers provides
 * (range, namespace, dict, raise_exception, strftime_now). */
#include "text/jinja_str.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <utf8proc.h>

/* ---- code point helpers ---- */
static int cat_of(int cp) { return (int)utf8proc_category(cp); }
static int is_cased(int cp) {
    int k = cat_of(cp);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
}
static int is_alnum(int cp) {
    int k = cat_of(cp);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) || (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO);
}
static int put_cp(jctx *c, jsb *b, int cp) {
    char buf[8];
    return jsb_put(c, b, buf, (size_t)ju_encode(cp, buf));
}

/* Map every code point: mode 0 lower, 1 upper, 2 title. */
static int map_cp(int cp, int mode) {
    return mode == 0 ? utf8proc_tolower(cp) : mode == 1 ? utf8proc_toupper(cp) : utf8proc_totitle(cp);
}

jv *jstr_case(jctx *c, jv *s, int upper) {
    jsb b = {0};
    if (jsb_put(c, &b, "", 0)) return NULL;
    for (size_t i = 0; i < s->s.n;)
        if (put_cp(c, &b, map_cp(ju_decode(s->s.p, s->s.n, &i), upper))) return NULL;
    return jsb_to_str(c, &b);
}

jv *jstr_capitalize(jctx *c, jv *s) {
    jsb b = {0};
    if (jsb_put(c, &b, "", 0)) return NULL;
    for (size_t i = 0, k = 0; i < s->s.n; k++)
        if (put_cp(c, &b, map_cp(ju_decode(s->s.p, s->s.n, &i), k == 0 ? 2 : 0))) return NULL;
    return jsb_to_str(c, &b);
}

jv *jstr_title_method(jctx *c, jv *s) {
    jsb b = {0};
    int prev_cased = 0;
    if (jsb_put(c, &b, "", 0)) return NULL;
    for (size_t i = 0; i < s->s.n;) {
        int cp = ju_decode(s->s.p, s->s.n, &i);
        if (put_cp(c, &b, map_cp(cp, prev_cased ? 0 : 2))) return NULL;
        prev_cased = is_cased(cp);
    }
    return jsb_to_str(c, &b);
}

/* Jinja: re.split(r"([-\s({\[<]+)") then item[0].upper() + item[1:].lower() */
jv *jstr_title_filter(jctx *c, jv *s) {
    jsb b = {0};
    int at_start = 1;
    if (jsb_put(c, &b, "", 0)) return NULL;
    for (size_t i = 0; i < s->s.n;) {
        int cp = ju_decode(s->s.p, s->s.n, &i);
        int sep = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || ju_isspace(cp);
        if (put_cp(c, &b, sep ? cp : map_cp(cp, at_start ? 1 : 0))) return NULL;
        at_start = sep;
    }
    return jsb_to_str(c, &b);
}

static int in_chars(jv *chars, int cp) {
    if (!chars) return ju_isspace(cp);
    for (size_t i = 0; i < chars->s.n;)
        if (ju_decode(chars->s.p, chars->s.n, &i) == cp) return 1;
    return 0;
}

jv *jstr_strip(jctx *c, jv *s, jv *chars, int which) {
    size_t st = 0, end = s->s.n;
    if (which & 1)
        while (st < end) {
            size_t k = st;
            if (!in_chars(chars, ju_decode(s->s.p, end, &k))) break;
            st = k;
        }
    if (which & 2)
        while (end > st) {
            size_t p = end - 1;
            while (p > st && ((unsigned char)s->s.p[p] & 0xC0) == 0x80) p--;
            size_t k = p;
            if (!in_chars(chars, ju_decode(s->s.p, end, &k))) break;
            end = p;
        }
    return jv_str(c, s->s.p + st, end - st);
}

jv *jstr_replace(jctx *c, jv *s, jv *old, jv *new_, int64_t count) {
    jsb b = {0};
    if (jsb_put(c, &b, "", 0)) return NULL;
    if (!old->s.n) { /* "" matches before every character and at the end */
        size_t i = 0;
        int64_t done = 0;
        for (;;) {
            if (count < 0 || done < count) { if (jsb_put(c, &b, new_->s.p, new_->s.n)) return NULL; done++; }
            if (i >= s->s.n) break;
            size_t st = i;
            ju_decode(s->s.p, s->s.n, &i);
            if (jsb_put(c, &b, s->s.p + st, i - st)) return NULL;
        }
        return jsb_to_str(c, &b);
    }
    const char *p = s->s.p, *end = s->s.p + s->s.n;
    int64_t done = 0;
    while (p < end && (count < 0 || done < count)) {
        const char *hit = memmem(p, (size_t)(end - p), old->s.p, old->s.n);
        if (!hit) break;
        if (jsb_put(c, &b, p, (size_t)(hit - p)) || jsb_put(c, &b, new_->s.p, new_->s.n)) return NULL;
        p = hit + old->s.n;
        done++;
    }
    if (jsb_put(c, &b, p, (size_t)(end - p))) return NULL;
    return jsb_to_str(c, &b);
}

/* Copy of s without surrounding whitespace and with "_" between digits removed;
 * 0 when an underscore is misplaced. */
static int clean_number(const jv *s, char *buf, size_t cap) {
    size_t st = 0, end = s->s.n, m = 0;
    while (st < end && ju_isspace((unsigned char)s->s.p[st])) st++;
    while (end > st && ju_isspace((unsigned char)s->s.p[end - 1])) end--;
    for (size_t i = st; i < end; i++) {
        char ch = s->s.p[i];
        if (ch == '_') {
            int ok = i > st && i + 1 < end && isalnum((unsigned char)s->s.p[i - 1]) && isalnum((unsigned char)s->s.p[i + 1]);
            if (!ok) return 0;
            continue;
        }
        if (m + 1 >= cap) return 0;
        buf[m++] = ch;
    }
    buf[m] = 0;
    return m > 0;
}

int jstr_parse_int(const jv *s, int base, int64_t *out) {
    char buf[128];
    if (!clean_number(s, buf, sizeof buf)) return 0;
    const char *p = buf;
    int neg = 0;
    if (*p == '+' || *p == '-') neg = *p++ == '-';
    if (p[0] == '0' && ((base == 16 && (p[1] | 32) == 'x') || (base == 8 && (p[1] | 32) == 'o') || (base == 2 && (p[1] | 32) == 'b')))
        p += 2;
    if (!*p || *p == '+' || *p == '-' || ju_isspace((unsigned char)*p)) return 0;
    char *e;
    errno = 0;
    unsigned long long v = strtoull(p, &e, base);
    if (*e || errno || v > (unsigned long long)INT64_MAX + neg) return 0;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return 1;
}

int jstr_parse_float(const jv *s, double *out) {
    char buf[128];
    if (!clean_number(s, buf, sizeof buf)) return 0;
    const char *p = buf + (buf[0] == '+' || buf[0] == '-');
    if (!strcasecmp(p, "inf") || !strcasecmp(p, "infinity") || !strcasecmp(p, "nan")) {
        *out = strtod(buf, NULL);
        return 1;
    }
    for (const char *q = p; *q; q++)
        if (!((*q >= '0' && *q <= '9') || *q == '.' || *q == 'e' || *q == 'E' || *q == '+' || *q == '-')) return 0;
    char *e;
    *out = strtod(buf, &e);
    return *e == 0;
}

jv *jstr_splitlines(jctx *c, const char *p, size_t n) {
    jv *r = jv_list(c, 0);
    if (!r) return NULL;
    size_t st = 0, i = 0;
    while (i < n) {
        size_t at = i;
        int cp = ju_decode(p, n, &i);
        int brk = cp == '\n' || cp == '\r' || cp == 0x0b || cp == 0x0c || (cp >= 0x1c && cp <= 0x1e) ||
                  cp == 0x85 || cp == 0x2028 || cp == 0x2029;
        if (!brk) continue;
        jv *ln = jv_str(c, p + st, at - st);
        if (!ln || jv_list_push(c, r, ln)) return NULL;
        if (cp == '\r' && i < n && p[i] == '\n') i++;
        st = i;
    }
    if (st < n) {
        jv *ln = jv_str(c, p + st, n - st);
        if (!ln || jv_list_push(c, r, ln)) return NULL;
    }
    return r;
}

jv *jstr_pad(jctx *c, jv *s, int64_t width, char mode, const char *fill) {
    int64_t len = (int64_t)jv_utf8_len(s->s.p, s->s.n);
    if (width > JINJA_MAX_OUTPUT)
        return jerr(c, 0, "%s width %lld is past the %d MiB string limit",
                    mode == 'l' ? "ljust" : mode == 'r' ? "rjust" : "center", (long long)width, JINJA_MAX_OUTPUT >> 20);
    if (width <= len) return s;
    int64_t marg = width - len, left = mode == 'l' ? 0 : mode == 'r' ? marg : marg / 2 + (marg & width & 1);
    jsb b = {0};
    for (int64_t k = 0; k < left; k++)
        if (jsb_puts(c, &b, fill)) return NULL;
    if (jsb_put(c, &b, s->s.p, s->s.n)) return NULL;
    for (int64_t k = left; k < marg; k++)
        if (jsb_puts(c, &b, fill)) return NULL;
    return jsb_to_str(c, &b);
}

int64_t jstr_wordcount(jv *s) {
    int64_t n = 0;
    int in = 0;
    for (size_t i = 0; i < s->s.n;) {
        int cp = ju_decode(s->s.p, s->s.n, &i);
        int w = cp == '_' || is_alnum(cp);
        if (w && !in) n++;
        in = w;
    }
    return n;
}

/* Markup.striptags: drop comments and tags, unescape the basic entities, collapse spaces. */
jv *jstr_striptags(jctx *c, jv *s) {
    jsb t = {0};
    const char *p = s->s.p, *end = p + s->s.n;
    if (jsb_put(c, &t, "", 0)) return NULL;
    while (p < end) {
        if (p + 4 <= end && !memcmp(p, "<!--", 4)) {
            const char *e = memmem(p + 4, (size_t)(end - p - 4), "-->", 3);
            if (e) { p = e + 3; continue; }
        }
        if (*p == '<') {
            const char *e = memchr(p, '>', (size_t)(end - p));
            if (e) { p = e + 1; continue; }
        }
        if (jsb_putc(c, &t, *p++)) return NULL;
    }
    static const char *ent[][2] = {{"&amp;", "&"}, {"&lt;", "<"}, {"&gt;", ">"}, {"&#34;", "\""}, {"&#39;", "'"}, {"&quot;", "\""}};
    jsb b = {0};
    int space = 0;
    if (jsb_put(c, &b, "", 0)) return NULL;
    for (size_t i = 0; i < t.n;) {
        size_t k = i;
        int cp = ju_decode(t.p, t.n, &k);
        if (ju_isspace(cp)) { space = b.n > 0; i = k; continue; }
        if (space && jsb_putc(c, &b, ' ')) return NULL;
        space = 0;
        int done = 0;
        for (size_t e = 0; e < sizeof ent / sizeof ent[0] && !done; e++) {
            size_t el = strlen(ent[e][0]);
            if (t.n - i >= el && !memcmp(t.p + i, ent[e][0], el)) {
                if (jsb_puts(c, &b, ent[e][1])) return NULL;
                i += el;
                done = 1;
            }
        }
        if (done) continue;
        if (jsb_put(c, &b, t.p + i, k - i)) return NULL;
        i = k;
    }
    return jsb_to_str(c, &b);
}

jv *jstr_percent_format(jctx *c, jv *fmt, jargs *a, int line) {
    jsb b = {0};
    int argi = 0;
    if (jsb_put(c, &b, "", 0)) return NULL;
    const char *p = fmt->s.p, *end = p + fmt->s.n;
    while (p < end) {
        if (*p != '%') { if (jsb_putc(c, &b, *p++)) return NULL; continue; }
        const char *st = p++;
        char spec[32];
        size_t sl = 0;
        spec[sl++] = '%';
        while (p < end && strchr("-+ #0123456789.", *p) && sl < 20) spec[sl++] = *p++;
        if (p >= end) return jerr(c, line, "format: incomplete format");
        char conv = *p++;
        if (conv == '%') { if (jsb_putc(c, &b, '%')) return NULL; continue; }
        if (argi >= a->npos) return jerr(c, line, "format: not enough arguments for format string");
        jv *x = a->pos[argi++];
        (void)st;
        if (conv == 's' || conv == 'r') {
            jsb t = {0};
            if ((conv == 's' ? jv_str_into(c, &t, x) : jv_repr_into(c, &t, x)) || jsb_put(c, &t, "", 0)) return NULL;
            spec[sl++] = 's';
            spec[sl] = 0;
            if (sl == 2) { if (jsb_put(c, &b, t.p, t.n)) return NULL; }
            else if (jsb_printf(c, &b, spec, t.p)) return NULL;
        } else if (strchr("dixXo", conv)) {
            if (!jv_is_num(x)) return jerr(c, line, "format: %%%c format: a number is required, not %s", conv, jv_type_name(x));
            spec[sl++] = 'l';
            spec[sl++] = 'l';
            spec[sl++] = conv == 'i' ? 'd' : conv;
            spec[sl] = 0;
            if (jsb_printf(c, &b, spec, (long long)(x->type == JV_FLOAT ? (int64_t)x->f : x->i))) return NULL;
        } else if (strchr("feEgG", conv)) {
            if (!jv_is_num(x)) return jerr(c, line, "format: must be real number, not %s", jv_type_name(x));
            spec[sl++] = conv;
            spec[sl] = 0;
            if (jsb_printf(c, &b, spec, jv_num(x))) return NULL;
        } else return jerr(c, line, "format: unsupported format character '%c'", conv);
    }
    if (argi < a->npos) return jerr(c, line, "format: not all arguments converted during string formatting");
    return jsb_to_str(c, &b);
}

int jstr_is_case(jv *s, int upper) {
    int cased = 0;
    for (size_t i = 0; i < s->s.n;) {
        int k = cat_of(ju_decode(s->s.p, s->s.n, &i));
        if (k == UTF8PROC_CATEGORY_LT) return 0;
        if (k == (upper ? UTF8PROC_CATEGORY_LL : UTF8PROC_CATEGORY_LU)) return 0;
        if (k == (upper ? UTF8PROC_CATEGORY_LU : UTF8PROC_CATEGORY_LL)) cased = 1;
    }
    return cased;
}

/* ---- str methods ---- */
static jv *str_arg(jctx *c, jargs *a, int idx, const char *name, int line, int required) {
    jv *x = jarg(a, idx, name);
    if (!x || x->type == JV_NONE) return required ? jerr(c, line, "missing argument '%s'", name) : NULL;
    if (x->type != JV_STR) return jerr(c, line, "argument '%s' must be str, not %s", name, jv_type_name(x));
    return x;
}

static jv *m_upper(jctx *c, jv *s, jargs *a, int line) { return jstr_case(c, s, 1); }
static jv *m_lower(jctx *c, jv *s, jargs *a, int line) { return jstr_case(c, s, 0); }
static jv *m_title(jctx *c, jv *s, jargs *a, int line) { return jstr_title_method(c, s); }
static jv *m_capitalize(jctx *c, jv *s, jargs *a, int line) { return jstr_capitalize(c, s); }

static jv *strip_common(jctx *c, jv *s, jargs *a, int line, int which) {
    jv *chars = jarg(a, 0, "chars");
    if (chars && chars->type != JV_NONE && chars->type != JV_STR)
        return jerr(c, line, "strip arg must be None or str");
    return jstr_strip(c, s, chars && chars->type == JV_STR ? chars : NULL, which);
}
static jv *m_strip(jctx *c, jv *s, jargs *a, int line) { return strip_common(c, s, a, line, 3); }
static jv *m_lstrip(jctx *c, jv *s, jargs *a, int line) { return strip_common(c, s, a, line, 1); }
static jv *m_rstrip(jctx *c, jv *s, jargs *a, int line) { return strip_common(c, s, a, line, 2); }

static jv *affix(jctx *c, jv *s, jargs *a, int line, int end) {
    jv *x = jarg(a, 0, end ? "suffix" : "prefix");
    if (!x) return jerr(c, line, "%swith() takes at least 1 argument", end ? "ends" : "starts");
    jv **cands = &x;
    size_t n = 1;
    if (x->type == JV_LIST && x->tuple) { cands = x->l.v; n = x->l.n; }
    for (size_t k = 0; k < n; k++) {
        jv *p = cands[k];
        if (p->type != JV_STR) return jerr(c, line, "%swith first arg must be str or a tuple of str, not %s", end ? "ends" : "starts", jv_type_name(p));
        if (p->s.n <= s->s.n && !memcmp(s->s.p + (end ? s->s.n - p->s.n : 0), p->s.p, p->s.n)) return JV_TRUE;
    }
    return JV_FALSE;
}
static jv *m_startswith(jctx *c, jv *s, jargs *a, int line) { return affix(c, s, a, line, 0); }
static jv *m_endswith(jctx *c, jv *s, jargs *a, int line) { return affix(c, s, a, line, 1); }

typedef struct { jctx *c; size_t *v; size_t n, cap; } pieces;

static int piece_add(pieces *p, size_t a, size_t b) {
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 16;
        size_t *nv = ja_alloc(&p->c->arena, cap * 2 * sizeof(size_t));
        if (!nv) return -1;
        if (p->n) memcpy(nv, p->v, p->n * 2 * sizeof(size_t));
        p->v = nv;
        p->cap = cap;
    }
    p->v[2 * p->n] = a;
    p->v[2 * p->n + 1] = b;
    p->n++;
    return 0;
}

static jv *split_common(jctx *c, jv *s, jargs *a, int line, int from_right) {
    jv *sep = jarg(a, 0, "sep"), *mx = jarg(a, 1, "maxsplit"), *r = jv_list(c, 0);
    int64_t maxsplit = mx && (mx->type == JV_INT || mx->type == JV_BOOL) ? mx->i : -1;
    if (!r) return NULL;
    if (sep && sep->type == JV_NONE) sep = NULL;
    if (sep && sep->type != JV_STR) return jerr(c, line, "split: sep must be str or None");
    if (sep && !sep->s.n) return jerr(c, line, "empty separator");
    const char *p = s->s.p;
    size_t n = s->s.n;
    /* pieces as (start, end) pairs, collected left to right or right to left */
    pieces pc = {c, NULL, 0, 0};
    if (sep) {
        if (!from_right) {
            size_t st = 0;
            while ((maxsplit < 0 || (int64_t)pc.n < maxsplit)) {
                const char *hit = memmem(p + st, n - st, sep->s.p, sep->s.n);
                if (!hit) break;
                if (piece_add(&pc, st, (size_t)(hit - p))) return jerr(c, line, "out of memory");
                st = (size_t)(hit - p) + sep->s.n;
            }
            if (piece_add(&pc, st, n)) return jerr(c, line, "out of memory");
        } else {
            size_t end = n;
            while ((maxsplit < 0 || (int64_t)pc.n < maxsplit) && end >= sep->s.n) {
                size_t k = end - sep->s.n + 1, found = (size_t)-1;
                while (k-- > 0) if (!memcmp(p + k, sep->s.p, sep->s.n)) { found = k; break; }
                if (found == (size_t)-1) break;
                if (piece_add(&pc, found + sep->s.n, end)) return jerr(c, line, "out of memory");
                end = found;
            }
            if (piece_add(&pc, 0, end)) return jerr(c, line, "out of memory");
        }
    } else { /* runs of whitespace; leading/trailing ignored */
        size_t i = 0;
        if (!from_right) {
            for (;;) {
                while (i < n) { size_t k = i; if (!ju_isspace(ju_decode(p, n, &k))) break; i = k; }
                if (i >= n) break;
                if (maxsplit >= 0 && (int64_t)pc.n >= maxsplit) {
                    size_t e = n;
                    while (e > i) { size_t q = e - 1; while (q > i && ((unsigned char)p[q] & 0xC0) == 0x80) q--; size_t k = q; if (!ju_isspace(ju_decode(p, n, &k))) break; e = q; }
                    if (piece_add(&pc, i, e)) return jerr(c, line, "out of memory");
                    break;
                }
                size_t st = i;
                while (i < n) { size_t k = i; if (ju_isspace(ju_decode(p, n, &k))) break; i = k; }
                if (piece_add(&pc, st, i)) return jerr(c, line, "out of memory");
            }
        } else {
            size_t e = n;
            for (;;) {
                while (e > 0) { size_t q = e - 1; while (q > 0 && ((unsigned char)p[q] & 0xC0) == 0x80) q--; size_t k = q; if (!ju_isspace(ju_decode(p, n, &k))) break; e = q; }
                if (e == 0) break;
                if (maxsplit >= 0 && (int64_t)pc.n >= maxsplit) {
                    size_t st = 0;
                    while (st < e) { size_t k = st; if (!ju_isspace(ju_decode(p, n, &k))) break; st = k; }
                    if (piece_add(&pc, st, e)) return jerr(c, line, "out of memory");
                    break;
                }
                size_t end = e;
                while (e > 0) { size_t q = e - 1; while (q > 0 && ((unsigned char)p[q] & 0xC0) == 0x80) q--; size_t k = q; if (ju_isspace(ju_decode(p, n, &k))) break; e = q; }
                if (piece_add(&pc, e, end)) return jerr(c, line, "out of memory");
            }
        }
    }
    for (size_t k = 0; k < pc.n; k++) {
        size_t idx = from_right ? pc.n - 1 - k : k;
        jv *piece = jv_str(c, p + pc.v[2 * idx], pc.v[2 * idx + 1] - pc.v[2 * idx]);
        if (!piece || jv_list_push(c, r, piece)) return NULL;
    }
    return r;
}
static jv *m_split(jctx *c, jv *s, jargs *a, int line) { return split_common(c, s, a, line, 0); }
static jv *m_rsplit(jctx *c, jv *s, jargs *a, int line) { return split_common(c, s, a, line, 1); }

static jv *m_splitlines(jctx *c, jv *s, jargs *a, int line) { return jstr_splitlines(c, s->s.p, s->s.n); }

static jv *m_replace(jctx *c, jv *s, jargs *a, int line) {
    jv *old = str_arg(c, a, 0, "old", line, 1), *new_ = old ? str_arg(c, a, 1, "new", line, 1) : NULL, *cnt = jarg(a, 2, "count");
    if (!old || !new_) return NULL;
    return jstr_replace(c, s, old, new_, cnt && (cnt->type == JV_INT || cnt->type == JV_BOOL) ? cnt->i : -1);
}

/* find / rfind / count / index: byte offsets converted to code points */
static jv *search(jctx *c, jv *s, jargs *a, int line, int mode) {
    jv *sub = str_arg(c, a, 0, "sub", line, 1);
    if (!sub) return NULL;
    if (mode == 2) {
        int64_t n = 0;
        if (!sub->s.n) return jv_int(c, (int64_t)jv_utf8_len(s->s.p, s->s.n) + 1);
        for (const char *p = s->s.p, *e = s->s.p + s->s.n; (p = memmem(p, (size_t)(e - p), sub->s.p, sub->s.n)); p += sub->s.n) n++;
        return jv_int(c, n);
    }
    const char *hit = NULL;
    if (mode == 0 || mode == 3) hit = memmem(s->s.p, s->s.n, sub->s.p, sub->s.n);
    else
        for (size_t k = s->s.n + 1; k-- > 0;)
            if (k + sub->s.n <= s->s.n && !memcmp(s->s.p + k, sub->s.p, sub->s.n)) { hit = s->s.p + k; break; }
    if (!hit) return mode == 3 ? jerr(c, line, "substring not found") : jv_int(c, -1);
    return jv_int(c, (int64_t)jv_utf8_len(s->s.p, (size_t)(hit - s->s.p)));
}
static jv *m_find(jctx *c, jv *s, jargs *a, int line) { return search(c, s, a, line, 0); }
static jv *m_rfind(jctx *c, jv *s, jargs *a, int line) { return search(c, s, a, line, 1); }
static jv *m_count(jctx *c, jv *s, jargs *a, int line) { return search(c, s, a, line, 2); }
static jv *m_index(jctx *c, jv *s, jargs *a, int line) { return search(c, s, a, line, 3); }

static jv *m_join(jctx *c, jv *s, jargs *a, int line) {
    jv *it = jarg(a, 0, "iterable"), *items;
    if (!it) return jerr(c, line, "join() takes exactly one argument");
    if (!(items = jinja_iter_list(c, it, line))) return NULL;
    jsb b = {0};
    if (jsb_put(c, &b, "", 0)) return NULL;
    for (size_t i = 0; i < items->l.n; i++) {
        jv *x = items->l.v[i];
        if (x->type != JV_STR) return jerr(c, line, "sequence item %zu: expected str instance, %s found", i, jv_type_name(x));
        if ((i && jsb_put(c, &b, s->s.p, s->s.n)) || jsb_put(c, &b, x->s.p, x->s.n)) return NULL;
    }
    return jsb_to_str(c, &b);
}

/* str.format with {}, {0}, {name}, {{ and }}; no format specs. */
static jv *m_format(jctx *c, jv *s, jargs *a, int line) {
    jsb b = {0};
    int auto_i = 0;
    if (jsb_put(c, &b, "", 0)) return NULL;
    const char *p = s->s.p, *e = p + s->s.n;
    while (p < e) {
        if ((*p == '{' || *p == '}') && p + 1 < e && p[1] == *p) { if (jsb_putc(c, &b, *p)) return NULL; p += 2; continue; }
        if (*p == '}') return jerr(c, line, "Single '}' encountered in format string");
        if (*p != '{') { if (jsb_putc(c, &b, *p++)) return NULL; continue; }
        const char *close = memchr(p, '}', (size_t)(e - p));
        if (!close) return jerr(c, line, "Single '{' encountered in format string");
        char field[64];
        size_t fl = (size_t)(close - p - 1);
        if (fl >= sizeof field) return jerr(c, line, "format field too long");
        memcpy(field, p + 1, fl);
        field[fl] = 0;
        char *conv = strchr(field, '!');
        if (strchr(field, ':')) return jerr(c, line, "format specs are not supported in str.format");
        int repr = 0;
        if (conv) { repr = conv[1] == 'r'; *conv = 0; }
        jv *x;
        if (!field[0]) x = jarg(a, auto_i++, NULL);
        else if (field[0] >= '0' && field[0] <= '9') x = jarg(a, atoi(field), NULL);
        else x = jarg(a, -1, field);
        if (!x) return jerr(c, line, "format: no argument for field '{%s}'", field);
        if (repr ? jv_repr_into(c, &b, x) : jv_str_into(c, &b, x)) return NULL;
        p = close + 1;
    }
    return jsb_to_str(c, &b);
}

/* str.ljust / rjust / center (width[, fillchar]): Python wants one character to fill with. */
static jv *m_pad(jctx *c, jv *s, jargs *a, int line, char mode) {
    jv *w = jarg(a, 0, "width"), *f = jarg(a, 1, "fillchar");
    char fill[8] = " ";
    if (f) {
        if (f->type != JV_STR || jv_utf8_len(f->s.p, f->s.n) != 1 || f->s.n >= sizeof fill)
            return jerr(c, line, "%s: the fill character must be exactly one character long",
                        mode == 'l' ? "ljust" : mode == 'r' ? "rjust" : "center");
        memcpy(fill, f->s.p, f->s.n);
        fill[f->s.n] = 0;
    }
    return jstr_pad(c, s, w && jv_is_num(w) ? w->i : 0, mode, fill);
}
static jv *m_pad_l(jctx *c, jv *s, jargs *a, int line) { return m_pad(c, s, a, line, 'l'); }
static jv *m_pad_r(jctx *c, jv *s, jargs *a, int line) { return m_pad(c, s, a, line, 'r'); }
static jv *m_center(jctx *c, jv *s, jargs *a, int line) { return m_pad(c, s, a, line, 'c'); }

static jv *classify(jv *s, int kind) {
    if (!s->s.n) return JV_FALSE;
    for (size_t i = 0; i < s->s.n;) {
        int cp = ju_decode(s->s.p, s->s.n, &i), k = cat_of(cp), ok;
        switch (kind) {
        case 0: ok = k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NO; break;
        case 1: ok = k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO; break;
        case 2: ok = is_alnum(cp); break;
        default: ok = ju_isspace(cp);
        }
        if (!ok) return JV_FALSE;
    }
    return JV_TRUE;
}
static jv *m_isdigit(jctx *c, jv *s, jargs *a, int line) { return classify(s, 0); }
static jv *m_isalpha(jctx *c, jv *s, jargs *a, int line) { return classify(s, 1); }
static jv *m_isalnum(jctx *c, jv *s, jargs *a, int line) { return classify(s, 2); }
static jv *m_isspace(jctx *c, jv *s, jargs *a, int line) { return classify(s, 3); }
static jv *m_isupper(jctx *c, jv *s, jargs *a, int line) { return jv_bool(jstr_is_case(s, 1)); }
static jv *m_islower(jctx *c, jv *s, jargs *a, int line) { return jv_bool(jstr_is_case(s, 0)); }

static jv *m_removeaffix(jctx *c, jv *s, jargs *a, int line, int end) {
    jv *x = str_arg(c, a, 0, end ? "suffix" : "prefix", line, 1);
    if (!x) return NULL;
    if (x->s.n <= s->s.n && !memcmp(s->s.p + (end ? s->s.n - x->s.n : 0), x->s.p, x->s.n))
        return jv_str(c, s->s.p + (end ? 0 : x->s.n), s->s.n - x->s.n);
    return s;
}
static jv *m_removeprefix(jctx *c, jv *s, jargs *a, int line) { return m_removeaffix(c, s, a, line, 0); }
static jv *m_removesuffix(jctx *c, jv *s, jargs *a, int line) { return m_removeaffix(c, s, a, line, 1); }

static const struct { const char *name; jv_native_fn fn; } str_methods[] = {
    {"upper", m_upper}, {"lower", m_lower}, {"title", m_title}, {"capitalize", m_capitalize},
    {"strip", m_strip}, {"lstrip", m_lstrip}, {"rstrip", m_rstrip}, {"startswith", m_startswith},
    {"endswith", m_endswith}, {"split", m_split}, {"rsplit", m_rsplit}, {"splitlines", m_splitlines},
    {"replace", m_replace}, {"find", m_find}, {"rfind", m_rfind}, {"count", m_count}, {"index", m_index},
    {"join", m_join}, {"format", m_format}, {"ljust", m_pad_l}, {"rjust", m_pad_r}, {"center", m_center},
    {"isdigit", m_isdigit}, {"isalpha", m_isalpha}, {"isalnum", m_isalnum}, {"isspace", m_isspace},
    {"isupper", m_isupper}, {"islower", m_islower}, {"removeprefix", m_removeprefix},
    {"removesuffix", m_removesuffix},
};

jv *jinja_str_method(jctx *c, jv *s, const char *name) {
    for (size_t k = 0; k < sizeof str_methods / sizeof str_methods[0]; k++)
        if (!strcmp(str_methods[k].name, name)) return jv_native(c, str_methods[k].fn, s, str_methods[k].name);
    return NULL;
}

/* ---- dict methods ---- */
static jv *d_items(jctx *c, jv *d, jargs *a, int line) {
    int found;
    jargs none = {0};
    return jinja_filter(c, "items", d, &none, line, &found);
}
static jv *d_keys(jctx *c, jv *d, jargs *a, int line) { return jinja_iter_list(c, d, line); }
static jv *d_values(jctx *c, jv *d, jargs *a, int line) {
    jv *r = jv_list(c, d->d.n);
    for (size_t i = 0; r && i < d->d.n; i++) r->l.v[r->l.n++] = d->d.v[i];
    return r;
}
static jv *d_get(jctx *c, jv *d, jargs *a, int line) {
    jv *k = jarg(a, 0, "key"), *def = jarg(a, 1, "default");
    if (!k) return jerr(c, line, "get expected at least 1 argument, got 0");
    jv *v = jv_dict_get(d, k);
    return v ? v : def ? def : JV_NONEV;
}
static jv *d_copy(jctx *c, jv *d, jargs *a, int line) {
    jv *r = jv_dict(c, d->d.n);
    for (size_t i = 0; r && i < d->d.n; i++) {
        r->d.k[i] = d->d.k[i];
        r->d.v[i] = d->d.v[i];
        r->d.n++;
    }
    return r;
}

jv *jinja_dict_method(jctx *c, jv *d, const char *name) {
    static const struct { const char *name; jv_native_fn fn; } m[] = {
        {"items", d_items}, {"keys", d_keys}, {"values", d_values}, {"get", d_get}, {"copy", d_copy}};
    for (size_t k = 0; k < sizeof m / sizeof m[0]; k++)
        if (!strcmp(m[k].name, name)) return jv_native(c, m[k].fn, d, m[k].name);
    return NULL;
}

/* ---- globals ---- */
static jv *g_range(jctx *c, jv *self, jargs *a, int line) {
    int64_t st = 0, stop, step = 1;
    for (int k = 0; k < a->npos; k++)
        if (a->pos[k]->type != JV_INT && a->pos[k]->type != JV_BOOL)
            return jerr(c, line, "'%s' object cannot be interpreted as an integer", jv_type_name(a->pos[k]));
    if (a->npos == 1) stop = a->pos[0]->i;
    else if (a->npos == 2 || a->npos == 3) {
        st = a->pos[0]->i;
        stop = a->pos[1]->i;
        if (a->npos == 3) step = a->pos[2]->i;
    } else return jerr(c, line, "range expected 1 to 3 arguments, got %d", a->npos);
    if (step == 0) return jerr(c, line, "range() arg 3 must not be zero");
    int64_t n = step > 0 ? (stop > st ? (stop - st + step - 1) / step : 0)
                         : (st > stop ? (st - stop - step - 1) / -step : 0);
    if (n > JINJA_MAX_RANGE)
        return jerr(c, line, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).", JINJA_MAX_RANGE);
    jv *r = jv_list(c, (size_t)n);
    for (int64_t k = 0; r && k < n; k++)
        if (!(r->l.v[r->l.n++] = jv_int(c, st + k * step))) return NULL;
    return r;
}

static jv *dict_from_args(jctx *c, jargs *a, int line) {
    jv *d = jv_dict(c, 0);
    if (!d) return NULL;
    if (a->npos > 1) return jerr(c, line, "expected at most 1 positional argument, got %d", a->npos);
    if (a->npos == 1) {
        jv *src = a->pos[0];
        if (src->type == JV_DICT || src->type == JV_NS) {
            for (size_t i = 0; i < src->d.n; i++)
                if (jv_dict_set(c, d, src->d.k[i], src->d.v[i])) return NULL;
        } else if (src->type == JV_LIST) {
            for (size_t i = 0; i < src->l.n; i++) {
                jv *pair = src->l.v[i];
                if (pair->type != JV_LIST || pair->l.n != 2) return jerr(c, line, "dictionary update sequence element #%zu has the wrong length", i);
                if (jv_dict_set(c, d, pair->l.v[0], pair->l.v[1])) return NULL;
            }
        } else return jerr(c, line, "'%s' object is not iterable", jv_type_name(src));
    }
    for (int k = 0; k < a->nkw; k++) {
        jv *key = jv_cstr(c, a->kwn[k]);
        if (!key || jv_dict_set(c, d, key, a->kwv[k])) return NULL;
    }
    return d;
}

static jv *g_dict(jctx *c, jv *self, jargs *a, int line) { return dict_from_args(c, a, line); }

static jv *g_namespace(jctx *c, jv *self, jargs *a, int line) {
    jv *d = dict_from_args(c, a, line);
    if (d) d->type = JV_NS;
    return d;
}

static jv *g_raise(jctx *c, jv *self, jargs *a, int line) {
    jv *msg = jarg(a, 0, "message");
    jv *s = msg ? jv_to_str(c, msg) : jv_cstr(c, "");
    if (!s) return NULL;
    return jerr_raise(c, s->s.p);
}

static jv *g_strftime_now(jctx *c, jv *self, jargs *a, int line) {
    jv *fmt = jarg(a, 0, "format");
    if (!fmt || fmt->type != JV_STR) return jerr(c, line, "strftime_now: format must be a string");
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    char buf[512];
    size_t n = fmt->s.n ? strftime(buf, sizeof buf, fmt->s.p, &tm) : 0;
    return jv_str(c, buf, n);
}

static jv glob_range = {.type = JV_NATIVE, .nat = {g_range, NULL, "range"}};
static jv glob_dict = {.type = JV_NATIVE, .nat = {g_dict, NULL, "dict"}};
static jv glob_namespace = {.type = JV_NATIVE, .nat = {g_namespace, NULL, "namespace"}};
static jv glob_raise = {.type = JV_NATIVE, .nat = {g_raise, NULL, "raise_exception"}};
static jv glob_strftime = {.type = JV_NATIVE, .nat = {g_strftime_now, NULL, "strftime_now"}};

jv *jinja_global(const char *name) {
    if (!strcmp(name, "range")) return &glob_range;
    if (!strcmp(name, "dict")) return &glob_dict;
    if (!strcmp(name, "namespace")) return &glob_namespace;
    if (!strcmp(name, "raise_exception")) return &glob_raise;
    if (!strcmp(name, "strftime_now")) return &glob_strftime;
    return NULL;
}
