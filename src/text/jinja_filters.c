/* Jinja filters and tests, with Jinja2 3.1's arguments and Python results. tojson is
 * transformers' override: json.dumps(x, ensure_ascii=False, indent, separators,
 * sort_keys), not Jinja's HTML-safe one. */
#include "text/jinja.h"
#include "text/jinja_str.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef jv *(*filter_fn)(jctx *c, jv *v, jargs *a, int line);

static int is_intlike(const jv *v) { return v->type == JV_INT || v->type == JV_BOOL; }

static jv *argv_or(jargs *a, int idx, const char *name, jv *def) {
    jv *x = jarg(a, idx, name);
    return x ? x : def;
}

static int arg_bool(jargs *a, int idx, const char *name, int def) {
    jv *x = jarg(a, idx, name);
    return x ? jv_truthy(x) : def;
}

static jv *need_str(jctx *c, jv *v) { return jv_to_str(c, v); }

/* Jinja's make_attrgetter: "a.b.0" through getitem. */
static jv *attr_path(jctx *c, jv *item, jv *attr, int line) {
    if (attr->type != JV_STR) return jinja_getitem(c, item, attr, line);
    const char *p = attr->s.p;
    jv *cur = item;
    while (cur) {
        const char *dot = strchr(p, '.');
        size_t n = dot ? (size_t)(dot - p) : strlen(p);
        int digits = n > 0;
        for (size_t k = 0; k < n; k++) digits &= p[k] >= '0' && p[k] <= '9';
        jv *key = digits ? jv_int(c, strtoll(p, NULL, 10)) : jv_str(c, p, n);
        if (!key) return NULL;
        cur = jinja_getitem(c, cur, key, line);
        if (!dot) break;
        p = dot + 1;
    }
    return cur;
}

/* ---- sorting (stable merge sort with a fallible comparison) ---- */
typedef struct { jctx *c; int line; int case_sensitive; int err; } sortctx;

static jv *sort_key(sortctx *s, jv *v) {
    if (!s->case_sensitive && v->type == JV_STR) return jstr_case(s->c, v, 0);
    return v;
}

static int msort(sortctx *s, jv **keys, jv **vals, jv **tk, jv **tv, size_t n, int reverse) {
    if (n < 2) return 0;
    size_t h = n / 2;
    if (msort(s, keys, vals, tk, tv, h, reverse) || msort(s, keys + h, vals + h, tk, tv, n - h, reverse)) return -1;
    size_t i = 0, j = h, o = 0;
    while (i < h && j < n) {
        int r;
        if (jv_compare(s->c, s->line, keys[j], keys[i], &r)) return -1;
        if (reverse ? r > 0 : r < 0) { tk[o] = keys[j]; tv[o++] = vals[j++]; }
        else { tk[o] = keys[i]; tv[o++] = vals[i++]; }
    }
    while (i < h) { tk[o] = keys[i]; tv[o++] = vals[i++]; }
    while (j < n) { tk[o] = keys[j]; tv[o++] = vals[j++]; }
    memcpy(keys, tk, n * sizeof(jv *));
    memcpy(vals, tv, n * sizeof(jv *));
    return 0;
}

/* Sort vals (in place) by keys. */
static int sort_by(jctx *c, int line, jv **keys, jv **vals, size_t n, int reverse) {
    sortctx s = {c, line, 1, 0};
    jv **tk = ja_alloc(&c->arena, (n + 1) * sizeof(jv *)), **tv = ja_alloc(&c->arena, (n + 1) * sizeof(jv *));
    if (!tk || !tv) { jerr(c, line, "out of memory"); return -1; }
    return msort(&s, keys, vals, tk, tv, n, reverse);
}

static jv *items_of(jctx *c, jv *v, int line) { return jinja_iter_list(c, v, line); }

/* ---- filters ---- */
static jv *f_length(jctx *c, jv *v, jargs *a, int line) {
    switch (v->type) {
    case JV_STR: return jv_int(c, (int64_t)jv_utf8_len(v->s.p, v->s.n));
    case JV_LIST: return jv_int(c, (int64_t)v->l.n);
    case JV_DICT: return jv_int(c, (int64_t)v->d.n);
    case JV_UNDEF: return jv_int(c, 0);
    case JV_LOOP: return jv_int(c, (int64_t)v->loop->items->l.n);
    default: return jerr(c, line, "object of type '%s' has no len()", jv_type_name(v));
    }
}

static jv *f_tojson(jctx *c, jv *v, jargs *a, int line) {
    jjson_opts o = {.indent = -1, .item_sep = ", ", .key_sep = ": "};
    jv *ea = jarg(a, 0, "ensure_ascii"), *ind = jarg(a, 1, "indent"), *sep = jarg(a, 2, "separators"),
       *sk = jarg(a, 3, "sort_keys");
    o.ensure_ascii = ea ? jv_truthy(ea) : 0;
    o.sort_keys = sk ? jv_truthy(sk) : 0;
    if (ind && ind->type != JV_NONE) {
        if (is_intlike(ind)) o.indent = ind->i < 0 ? 0 : (int)(ind->i > 64 ? 64 : ind->i);
        else if (ind->type == JV_STR) { o.indent = 0; o.indent_str = ind->s.p; }
        else return jerr(c, line, "tojson: indent must be an int or a string");
        o.item_sep = ",";
    }
    if (sep && sep->type != JV_NONE) {
        if (sep->type != JV_LIST || sep->l.n != 2 || sep->l.v[0]->type != JV_STR || sep->l.v[1]->type != JV_STR)
            return jerr(c, line, "tojson: separators must be a pair of strings");
        o.item_sep = sep->l.v[0]->s.p;
        o.key_sep = sep->l.v[1]->s.p;
    }
    jsb b = {0};
    if (jv_json_into(c, line, &b, v, &o, 0)) return NULL;
    return jsb_to_str(c, &b);
}

static jv *f_default(jctx *c, jv *v, jargs *a, int line) {
    jv *def = argv_or(a, 0, "default_value", NULL);
    int boolean = arg_bool(a, 1, "boolean", 0);
    if (v->type == JV_UNDEF || (boolean && !jv_truthy(v))) return def ? def : jv_cstr(c, "");
    return v;
}

static jv *f_trim(jctx *c, jv *v, jargs *a, int line) {
    jv *s = need_str(c, v), *chars = jarg(a, 0, "chars");
    if (!s) return NULL;
    return jstr_strip(c, s, chars && chars->type != JV_NONE ? chars : NULL, 3);
}

static jv *f_upper(jctx *c, jv *v, jargs *a, int line) { jv *s = need_str(c, v); return s ? jstr_case(c, s, 1) : NULL; }
static jv *f_lower(jctx *c, jv *v, jargs *a, int line) { jv *s = need_str(c, v); return s ? jstr_case(c, s, 0) : NULL; }
static jv *f_capitalize(jctx *c, jv *v, jargs *a, int line) { jv *s = need_str(c, v); return s ? jstr_capitalize(c, s) : NULL; }
static jv *f_title(jctx *c, jv *v, jargs *a, int line) { jv *s = need_str(c, v); return s ? jstr_title_filter(c, s) : NULL; }

static jv *f_replace(jctx *c, jv *v, jargs *a, int line) {
    jv *s = need_str(c, v), *old = jarg(a, 0, "old"), *new_ = jarg(a, 1, "new"), *cnt = jarg(a, 2, "count");
    if (!s) return NULL;
    if (!old || !new_) return jerr(c, line, "replace() needs old and new");
    if (!(old = need_str(c, old)) || !(new_ = need_str(c, new_))) return NULL;
    return jstr_replace(c, s, old, new_, cnt && is_intlike(cnt) ? cnt->i : -1);
}

static jv *f_items(jctx *c, jv *v, jargs *a, int line) {
    if (v->type == JV_UNDEF) return jv_list(c, 0);
    if (v->type != JV_DICT) return jerr(c, line, "Can only get item pairs from a mapping.");
    jv *r = jv_list(c, v->d.n);
    for (size_t i = 0; r && i < v->d.n; i++) {
        jv *t = jv_list(c, 2);
        if (!t) return NULL;
        t->tuple = 1;
        t->l.v[0] = v->d.k[i];
        t->l.v[1] = v->d.v[i];
        t->l.n = 2;
        r->l.v[r->l.n++] = t;
    }
    return r;
}

static jv *f_dictsort(jctx *c, jv *v, jargs *a, int line) {
    int cs = arg_bool(a, 0, "case_sensitive", 0), rev = arg_bool(a, 2, "reverse", 0);
    jv *by = jarg(a, 1, "by");
    int by_value = by && by->type == JV_STR && !strcmp(by->s.p, "value");
    if (by && !(by->type == JV_STR && (by_value || !strcmp(by->s.p, "key"))))
        return jerr(c, line, "You can only sort by either \"key\" or \"value\"");
    jv *items = f_items(c, v, a, line);
    if (!items) return NULL;
    size_t n = items->l.n;
    jv **keys = ja_alloc(&c->arena, (n + 1) * sizeof(jv *));
    if (!keys) return jerr(c, line, "out of memory");
    sortctx s = {c, line, cs, 0};
    for (size_t i = 0; i < n; i++)
        if (!(keys[i] = sort_key(&s, items->l.v[i]->l.v[by_value]))) return NULL;
    if (sort_by(c, line, keys, items->l.v, n, rev)) return NULL;
    return items;
}

static jv *f_join(jctx *c, jv *v, jargs *a, int line) {
    jv *sep = argv_or(a, 0, "d", NULL), *attr = jarg(a, 1, "attribute");
    jv *items = items_of(c, v, line);
    if (!items) return NULL;
    if (sep && !(sep = need_str(c, sep))) return NULL;
    jsb b = {0};
    if (jsb_put(c, &b, "", 0)) return NULL;
    for (size_t i = 0; i < items->l.n; i++) {
        jv *x = items->l.v[i];
        if (attr && !(x = attr_path(c, x, attr, line))) return NULL;
        if (i && sep && jsb_put(c, &b, sep->s.p, sep->s.n)) return NULL;
        if (jv_str_into(c, &b, x)) return NULL;
    }
    return jsb_to_str(c, &b);
}

static jv *f_first(jctx *c, jv *v, jargs *a, int line) {
    jv *items = items_of(c, v, line);
    if (!items) return NULL;
    return items->l.n ? items->l.v[0] : jv_undef_hint(c, "No first item, sequence was empty.");
}

static jv *f_last(jctx *c, jv *v, jargs *a, int line) {
    jv *items = items_of(c, v, line);
    if (!items) return NULL;
    return items->l.n ? items->l.v[items->l.n - 1] : jv_undef_hint(c, "No last item, sequence was empty.");
}

static jv *f_list(jctx *c, jv *v, jargs *a, int line) {
    jv *items = items_of(c, v, line), *r;
    if (!items || !(r = jv_list(c, items->l.n))) return NULL;
    for (size_t i = 0; i < items->l.n; i++) r->l.v[r->l.n++] = items->l.v[i];
    return r;
}

static jv *f_string(jctx *c, jv *v, jargs *a, int line) { return jv_to_str(c, v); }

static jv *f_int(jctx *c, jv *v, jargs *a, int line) {
    jv *def = argv_or(a, 0, "default", NULL), *basev = jarg(a, 1, "base");
    int base = basev && is_intlike(basev) ? (int)basev->i : 10;
    if (is_intlike(v)) return jv_int(c, v->i);
    if (v->type == JV_FLOAT) {
        if (isfinite(v->f) && fabs(v->f) < 9.2e18) return jv_int(c, (int64_t)v->f);
    } else if (v->type == JV_STR) {
        int64_t i;
        double d;
        if (jstr_parse_int(v, base, &i)) return jv_int(c, i);
        if (base == 10 && jstr_parse_float(v, &d) && isfinite(d) && fabs(d) < 9.2e18) return jv_int(c, (int64_t)d);
    }
    return def ? def : jv_int(c, 0);
}

static jv *f_float(jctx *c, jv *v, jargs *a, int line) {
    jv *def = argv_or(a, 0, "default", NULL);
    double d;
    if (jv_is_num(v)) return jv_float(c, jv_num(v));
    if (v->type == JV_STR && jstr_parse_float(v, &d)) return jv_float(c, d);
    return def ? def : jv_float(c, 0.0);
}

static jv *f_abs(jctx *c, jv *v, jargs *a, int line) {
    if (is_intlike(v)) return v->i == INT64_MIN ? jerr(c, line, "integer overflow") : jv_int(c, v->i < 0 ? -v->i : v->i);
    if (v->type == JV_FLOAT) return jv_float(c, fabs(v->f));
    return jerr(c, line, "bad operand type for abs(): '%s'", jv_type_name(v));
}

static jv *f_round(jctx *c, jv *v, jargs *a, int line) {
    jv *pv = jarg(a, 0, "precision"), *mv = jarg(a, 1, "method");
    int prec = pv && is_intlike(pv) ? (int)pv->i : 0;
    const char *method = mv && mv->type == JV_STR ? mv->s.p : "common";
    if (!jv_is_num(v)) return jerr(c, line, "type %s doesn't define __round__ method", jv_type_name(v));
    if (strcmp(method, "common") && strcmp(method, "floor") && strcmp(method, "ceil"))
        return jerr(c, line, "method must be common, ceil or floor");
    double x = jv_num(v);
    if (!strcmp(method, "common")) {
        if (is_intlike(v)) return jv_int(c, v->i); /* round(int, n>=0) is the int */
        if (!isfinite(x) || prec > 300) return jv_float(c, x);
        if (prec < -300) return jv_float(c, 0.0 * x);
        if (prec >= 0) { /* printf rounds the exact binary value half-to-even, as Python's round */
            char buf[400];
            snprintf(buf, sizeof buf, "%.*f", prec, x);
            return jv_float(c, strtod(buf, NULL));
        }
        double p = pow(10.0, -prec);
        return jv_float(c, nearbyint(x / p) * p);
    }
    double p = pow(10.0, prec);
    return jv_float(c, (!strcmp(method, "floor") ? floor(x * p) : ceil(x * p)) / p);
}

static jv *f_indent(jctx *c, jv *v, jargs *a, int line) {
    jv *s = need_str(c, v), *w = argv_or(a, 0, "width", NULL);
    int first = arg_bool(a, 1, "first", 0), blank = arg_bool(a, 2, "blank", 0);
    if (!s) return NULL;
    jsb ind = {0};
    if (jsb_put(c, &ind, "", 0)) return NULL;
    if (!w) { if (jsb_puts(c, &ind, "    ")) return NULL; }
    else if (w->type == JV_STR) { if (jsb_put(c, &ind, w->s.p, w->s.n)) return NULL; }
    else if (is_intlike(w)) { for (int64_t k = 0; k < w->i && k < 1000; k++) if (jsb_putc(c, &ind, ' ')) return NULL; }
    else return jerr(c, line, "indent: width must be an int or a string");
    /* s + "\n", then splitlines (the trailing newline makes a final empty line disappear) */
    jsb t = {0};
    if (jsb_put(c, &t, s->s.p, s->s.n) || jsb_putc(c, &t, '\n')) return NULL;
    jv *lines = jstr_splitlines(c, t.p, t.n);
    if (!lines) return NULL;
    jsb b = {0};
    if (jsb_put(c, &b, "", 0)) return NULL;
    if (first && jsb_put(c, &b, ind.p, ind.n)) return NULL;
    for (size_t i = 0; i < lines->l.n; i++) {
        jv *ln = lines->l.v[i];
        if (i) {
            if (jsb_putc(c, &b, '\n')) return NULL;
            if ((blank || ln->s.n) && jsb_put(c, &b, ind.p, ind.n)) return NULL;
        }
        if (jsb_put(c, &b, ln->s.p, ln->s.n)) return NULL;
    }
    return jsb_to_str(c, &b);
}

static jv *f_center(jctx *c, jv *v, jargs *a, int line) {
    jv *s = need_str(c, v), *w = jarg(a, 0, "width");
    if (!s) return NULL;
    return jstr_pad(c, s, w && is_intlike(w) ? w->i : 80, 'c', " ");
}

static jv *f_safe(jctx *c, jv *v, jargs *a, int line) {
    jv *s = jv_to_str(c, v), *r;
    if (!s || !(r = jv_str(c, s->s.p, s->s.n))) return NULL;
    r->markup = 1;
    return r;
}

static jv *f_escape(jctx *c, jv *v, jargs *a, int line) {
    if (v->type == JV_STR && v->markup) return v;
    jv *s = jv_to_str(c, v);
    if (!s) return NULL;
    jsb b = {0};
    if (jsb_put(c, &b, "", 0)) return NULL;
    for (size_t i = 0; i < s->s.n; i++) {
        char ch = s->s.p[i];
        const char *e = ch == '&' ? "&amp;" : ch == '<' ? "&lt;" : ch == '>' ? "&gt;" : ch == '"' ? "&#34;"
                      : ch == '\'' ? "&#39;" : NULL;
        if (e ? jsb_puts(c, &b, e) : jsb_putc(c, &b, ch)) return NULL;
    }
    jv *r = jsb_to_str(c, &b);
    if (r) r->markup = 1;
    return r;
}

static jv *f_forceescape(jctx *c, jv *v, jargs *a, int line) {
    jv *s = jv_to_str(c, v), *plain;
    if (!s || !(plain = jv_str(c, s->s.p, s->s.n))) return NULL;
    return f_escape(c, plain, a, line);
}

static jv *f_unique(jctx *c, jv *v, jargs *a, int line) {
    int cs = arg_bool(a, 0, "case_sensitive", 0);
    jv *attr = jarg(a, 1, "attribute"), *items = items_of(c, v, line), *r, *seen;
    if (!items || !(r = jv_list(c, items->l.n)) || !(seen = jv_list(c, items->l.n))) return NULL;
    sortctx s = {c, line, cs, 0};
    for (size_t i = 0; i < items->l.n; i++) {
        jv *k = items->l.v[i];
        if (attr && !(k = attr_path(c, k, attr, line))) return NULL;
        if (!(k = sort_key(&s, k))) return NULL;
        int dup = 0;
        for (size_t j = 0; j < seen->l.n && !dup; j++) dup = jv_equal(seen->l.v[j], k);
        if (dup) continue;
        seen->l.v[seen->l.n++] = k;
        r->l.v[r->l.n++] = items->l.v[i];
    }
    return r;
}

static jv *f_sort(jctx *c, jv *v, jargs *a, int line) {
    int rev = arg_bool(a, 0, "reverse", 0), cs = arg_bool(a, 1, "case_sensitive", 0);
    jv *attr = jarg(a, 2, "attribute"), *r = f_list(c, v, a, line);
    if (!r) return NULL;
    jv **keys = ja_alloc(&c->arena, (r->l.n + 1) * sizeof(jv *));
    if (!keys) return jerr(c, line, "out of memory");
    sortctx s = {c, line, cs, 0};
    for (size_t i = 0; i < r->l.n; i++) {
        jv *k = r->l.v[i];
        if (attr && !(k = attr_path(c, k, attr, line))) return NULL;
        if (!(keys[i] = sort_key(&s, k))) return NULL;
    }
    if (sort_by(c, line, keys, r->l.v, r->l.n, rev)) return NULL;
    return r;
}

static jv *f_reverse(jctx *c, jv *v, jargs *a, int line) {
    jv *items = items_of(c, v, line), *r;
    if (!items || !(r = jv_list(c, items->l.n))) return NULL;
    for (size_t i = items->l.n; i > 0; i--) r->l.v[r->l.n++] = items->l.v[i - 1];
    if (v->type != JV_STR) return r;
    jsb b = {0};
    if (jsb_put(c, &b, "", 0)) return NULL;
    for (size_t i = 0; i < r->l.n; i++)
        if (jsb_put(c, &b, r->l.v[i]->s.p, r->l.v[i]->s.n)) return NULL;
    return jsb_to_str(c, &b);
}

static jv *add2(jctx *c, int line, jv *x, jv *y) {
    if (!jv_is_num(x) || !jv_is_num(y))
        return jerr(c, line, "unsupported operand type(s) for +: '%s' and '%s'", jv_type_name(x), jv_type_name(y));
    if (x->type != JV_FLOAT && y->type != JV_FLOAT) {
        int64_t r;
        if (__builtin_add_overflow(x->i, y->i, &r)) return jerr(c, line, "integer overflow");
        return jv_int(c, r);
    }
    return jv_float(c, jv_num(x) + jv_num(y));
}

static jv *f_sum(jctx *c, jv *v, jargs *a, int line) {
    jv *attr = jarg(a, 0, "attribute"), *acc = argv_or(a, 1, "start", NULL), *items = items_of(c, v, line);
    if (!items || (!acc && !(acc = jv_int(c, 0)))) return NULL;
    for (size_t i = 0; i < items->l.n && acc; i++) {
        jv *x = items->l.v[i];
        if (attr && !(x = attr_path(c, x, attr, line))) return NULL;
        acc = add2(c, line, acc, x);
    }
    return acc;
}

static jv *minmax(jctx *c, jv *v, jargs *a, int line, int want_max) {
    int cs = arg_bool(a, 0, "case_sensitive", 0);
    jv *attr = jarg(a, 1, "attribute"), *items = items_of(c, v, line), *best = NULL, *bestk = NULL;
    if (!items) return NULL;
    sortctx s = {c, line, cs, 0};
    for (size_t i = 0; i < items->l.n; i++) {
        jv *k = items->l.v[i];
        if (attr && !(k = attr_path(c, k, attr, line))) return NULL;
        if (!(k = sort_key(&s, k))) return NULL;
        int r = 0;
        if (bestk && jv_compare(c, line, k, bestk, &r)) return NULL;
        if (!bestk || (want_max ? r > 0 : r < 0)) { best = items->l.v[i]; bestk = k; }
    }
    return best ? best : jv_undef_hint(c, "No aggregated item, sequence was empty.");
}
static jv *f_min(jctx *c, jv *v, jargs *a, int line) { return minmax(c, v, a, line, 0); }
static jv *f_max(jctx *c, jv *v, jargs *a, int line) { return minmax(c, v, a, line, 1); }

static jv *f_batch(jctx *c, jv *v, jargs *a, int line) {
    jv *nv = jarg(a, 0, "linecount"), *fill = jarg(a, 1, "fill_with"), *items = items_of(c, v, line), *r, *cur = NULL;
    if (!nv || !is_intlike(nv) || nv->i <= 0) return jerr(c, line, "batch: linecount must be a positive int");
    if (!items || !(r = jv_list(c, 0))) return NULL;
    for (size_t i = 0; i < items->l.n; i++) {
        if (!cur) { if (!(cur = jv_list(c, 0)) || jv_list_push(c, r, cur)) return NULL; }
        if (jv_list_push(c, cur, items->l.v[i])) return NULL;
        if ((int64_t)cur->l.n == nv->i) cur = NULL;
    }
    if (cur && fill && fill->type != JV_NONE)
        while ((int64_t)cur->l.n < nv->i)
            if (jv_list_push(c, cur, fill)) return NULL;
    return r;
}

static jv *f_wordcount(jctx *c, jv *v, jargs *a, int line) {
    jv *s = need_str(c, v);
    return s ? jv_int(c, jstr_wordcount(s)) : NULL;
}

static jv *f_striptags(jctx *c, jv *v, jargs *a, int line) {
    jv *s = need_str(c, v);
    return s ? jstr_striptags(c, s) : NULL;
}

static jv *f_format(jctx *c, jv *v, jargs *a, int line) {
    jv *s = need_str(c, v);
    return s ? jstr_percent_format(c, s, a, line) : NULL;
}

static jv *f_attr(jctx *c, jv *v, jargs *a, int line) {
    jv *name = jarg(a, 0, "name");
    if (!name || name->type != JV_STR) return jerr(c, line, "attr: name must be a string");
    if (v->type == JV_DICT) { /* Python attributes only: methods, never keys */
        jv *m = jinja_dict_method(c, v, name->s.p);
        return m ? m : jv_undef_hint(c, "'dict object' has no attribute '%s'", name->s.p);
    }
    return jinja_getattr(c, v, name->s.p, line);
}

/* map / select / reject / selectattr / rejectattr */
static jv *f_map(jctx *c, jv *v, jargs *a, int line) {
    jv *items = items_of(c, v, line), *r, *attr = NULL, *def = NULL;
    if (!items || !(r = jv_list(c, items->l.n))) return NULL;
    for (int k = 0; k < a->nkw; k++) {
        if (!strcmp(a->kwn[k], "attribute")) attr = a->kwv[k];
        else if (!strcmp(a->kwn[k], "default")) def = a->kwv[k];
    }
    if (!attr && (!a->npos || a->pos[0]->type != JV_STR)) return jerr(c, line, "map: needs a filter name or attribute=");
    jargs rest = {.pos = a->pos + 1, .npos = a->npos > 0 ? a->npos - 1 : 0, .kwn = a->kwn, .kwv = a->kwv, .nkw = attr ? 0 : a->nkw};
    for (size_t i = 0; i < items->l.n; i++) {
        jv *x;
        if (attr) {
            if (!(x = attr_path(c, items->l.v[i], attr, line))) return NULL;
            if (x->type == JV_UNDEF && def) x = def;
        } else {
            int found = 0;
            x = jinja_filter(c, a->pos[0]->s.p, items->l.v[i], &rest, line, &found);
            if (!found) return jerr(c, line, "unknown filter '%s'", a->pos[0]->s.p);
            if (!x) return NULL;
        }
        r->l.v[r->l.n++] = x;
    }
    return r;
}

static jv *select_common(jctx *c, jv *v, jargs *a, int line, int by_attr, int keep) {
    jv *items = items_of(c, v, line), *r;
    if (!items || !(r = jv_list(c, items->l.n))) return NULL;
    int off = by_attr ? 1 : 0;
    jv *attr = by_attr ? jarg(a, 0, NULL) : NULL;
    if (by_attr && !attr) return jerr(c, line, "selectattr/rejectattr: needs an attribute name");
    jv *test = a->npos > off ? a->pos[off] : NULL;
    if (test && test->type != JV_STR) return jerr(c, line, "select: the test name must be a string");
    jargs rest = {.pos = a->pos + off + 1, .npos = a->npos > off + 1 ? a->npos - off - 1 : 0,
                  .kwn = a->kwn, .kwv = a->kwv, .nkw = a->nkw};
    for (size_t i = 0; i < items->l.n; i++) {
        jv *x = items->l.v[i];
        if (attr && !(x = attr_path(c, x, attr, line))) return NULL;
        int ok;
        if (test) {
            int found = 0;
            ok = jinja_test(c, test->s.p, x, &rest, line, &found);
            if (!found) return jerr(c, line, "unknown test '%s'", test->s.p);
            if (ok < 0) return NULL;
        } else ok = jv_truthy(x);
        if (ok == keep) r->l.v[r->l.n++] = items->l.v[i];
    }
    return r;
}
static jv *f_select(jctx *c, jv *v, jargs *a, int line) { return select_common(c, v, a, line, 0, 1); }
static jv *f_reject(jctx *c, jv *v, jargs *a, int line) { return select_common(c, v, a, line, 0, 0); }
static jv *f_selectattr(jctx *c, jv *v, jargs *a, int line) { return select_common(c, v, a, line, 1, 1); }
static jv *f_rejectattr(jctx *c, jv *v, jargs *a, int line) { return select_common(c, v, a, line, 1, 0); }

static const struct { const char *name; filter_fn fn; } filters[] = {
    {"abs", f_abs}, {"attr", f_attr}, {"batch", f_batch}, {"capitalize", f_capitalize},
    {"center", f_center}, {"count", f_length}, {"d", f_default}, {"default", f_default},
    {"dictsort", f_dictsort}, {"e", f_escape}, {"escape", f_escape}, {"first", f_first},
    {"float", f_float}, {"forceescape", f_forceescape}, {"format", f_format}, {"indent", f_indent},
    {"int", f_int}, {"items", f_items}, {"join", f_join}, {"last", f_last}, {"length", f_length},
    {"list", f_list}, {"lower", f_lower}, {"map", f_map}, {"max", f_max}, {"min", f_min},
    {"reject", f_reject}, {"rejectattr", f_rejectattr}, {"replace", f_replace}, {"reverse", f_reverse},
    {"round", f_round}, {"safe", f_safe}, {"select", f_select}, {"selectattr", f_selectattr},
    {"sort", f_sort}, {"string", f_string}, {"striptags", f_striptags}, {"sum", f_sum},
    {"title", f_title}, {"tojson", f_tojson}, {"trim", f_trim}, {"unique", f_unique},
    {"upper", f_upper}, {"wordcount", f_wordcount},
};

int jinja_is_filter(const char *name) {
    for (size_t k = 0; k < sizeof filters / sizeof filters[0]; k++)
        if (!strcmp(filters[k].name, name)) return 1;
    return 0;
}

jv *jinja_filter(jctx *c, const char *name, jv *v, jargs *a, int line, int *found) {
    for (size_t k = 0; k < sizeof filters / sizeof filters[0]; k++)
        if (!strcmp(filters[k].name, name)) {
            *found = 1;
            if (c->status != GERBIL_OK) return NULL;
            /* an undefined value used as text or a sequence acts as "" / []; elsewhere it fails */
            if (v->type == JV_UNDEF && (filters[k].fn == f_tojson || filters[k].fn == f_abs ||
                                        filters[k].fn == f_round || filters[k].fn == f_attr))
                return jerr(c, line, "%s", v->u.hint ? v->u.hint : "undefined value");
            return filters[k].fn(c, v, a, line);
        }
    *found = 0;
    return NULL;
}

/* ---- tests ---- */
static int cmp_test(jctx *c, jv *v, jargs *a, int line, int want) {
    jv *o = jarg(a, 0, NULL);
    if (!o) { jerr(c, line, "test needs an argument"); return -1; }
    if (want == 0) return jv_equal(v, o);
    if (want == 9) return !jv_equal(v, o);
    if (v->type == JV_UNDEF || o->type == JV_UNDEF) { jerr(c, line, "%s", "undefined value in comparison"); return -1; }
    int r;
    if (jv_compare(c, line, v, o, &r)) return -1;
    return want == 1 ? r < 0 : want == 2 ? r <= 0 : want == 3 ? r > 0 : r >= 0;
}

int jinja_is_test(const char *name) {
    static const char *tests[] = {"defined", "undefined", "none", "string", "mapping", "iterable",
        "sequence", "number", "integer", "float", "boolean", "true", "false", "callable", "lower",
        "upper", "even", "odd", "divisibleby", "in", "eq", "equalto", "==", "ne", "!=", "lt",
        "lessthan", "<", "le", "<=", "gt", "greaterthan", ">", "ge", ">=", "sameas", "escaped",
        "filter", "test", NULL};
    for (int k = 0; tests[k]; k++)
        if (!strcmp(tests[k], name)) return 1;
    return 0;
}

int jinja_test(jctx *c, const char *n, jv *v, jargs *a, int line, int *found) {
    *found = 1;
    int t = v->type;
    if (!strcmp(n, "defined")) return t != JV_UNDEF;
    if (!strcmp(n, "undefined")) return t == JV_UNDEF;
    if (!strcmp(n, "none")) return t == JV_NONE;
    if (!strcmp(n, "string")) return t == JV_STR;
    if (!strcmp(n, "mapping")) return t == JV_DICT;
    if (!strcmp(n, "iterable")) return t == JV_LIST || t == JV_STR || t == JV_DICT || t == JV_UNDEF;
    if (!strcmp(n, "sequence")) return t == JV_LIST || t == JV_STR || t == JV_DICT || t == JV_UNDEF || t == JV_LOOP;
    if (!strcmp(n, "number")) return jv_is_num(v);
    if (!strcmp(n, "integer")) return t == JV_INT;
    if (!strcmp(n, "float")) return t == JV_FLOAT;
    if (!strcmp(n, "boolean")) return t == JV_BOOL;
    if (!strcmp(n, "true")) return t == JV_BOOL && v->i;
    if (!strcmp(n, "false")) return t == JV_BOOL && !v->i;
    if (!strcmp(n, "callable")) return t == JV_MACRO || t == JV_NATIVE;
    if (!strcmp(n, "escaped")) return t == JV_STR && v->markup;
    if (!strcmp(n, "lower") || !strcmp(n, "upper")) {
        jv *s = jv_to_str(c, v);
        if (!s) return -1;
        return jstr_is_case(s, n[0] == 'u');
    }
    if (!strcmp(n, "even") || !strcmp(n, "odd") || !strcmp(n, "divisibleby")) {
        jv *d = n[0] == 'd' ? jarg(a, 0, "num") : NULL;
        if (n[0] == 'd' && (!d || !jv_is_num(d))) { jerr(c, line, "divisibleby needs a number"); return -1; }
        if (!jv_is_num(v)) { jerr(c, line, "unsupported operand type(s) for %%: '%s' and 'int'", jv_type_name(v)); return -1; }
        double x = jv_num(v), m = d ? jv_num(d) : 2;
        if (m == 0) { jerr(c, line, "integer division or modulo by zero"); return -1; }
        if (v->type != JV_FLOAT && (!d || d->type != JV_FLOAT)) {
            int64_t r = v->i % (d ? d->i : 2);
            return n[0] == 'o' ? r != 0 : r == 0;
        }
        double r = fmod(x, m);
        return n[0] == 'o' ? r != 0 : r == 0;
    }
    if (!strcmp(n, "in")) {
        jv *seq = jarg(a, 0, "seq");
        if (!seq) { jerr(c, line, "'in' test needs a container"); return -1; }
        if (seq->type == JV_STR) {
            if (v->type != JV_STR) { jerr(c, line, "'in <string>' requires string as left operand, not %s", jv_type_name(v)); return -1; }
            return !v->s.n || memmem(seq->s.p, seq->s.n, v->s.p, v->s.n) != NULL;
        }
        if (seq->type == JV_DICT) return jv_dict_get(seq, v) != NULL;
        if (seq->type == JV_UNDEF) return 0;
        if (seq->type != JV_LIST) { jerr(c, line, "argument of type '%s' is not iterable", jv_type_name(seq)); return -1; }
        for (size_t i = 0; i < seq->l.n; i++)
            if (jv_equal(seq->l.v[i], v)) return 1;
        return 0;
    }
    if (!strcmp(n, "eq") || !strcmp(n, "equalto") || !strcmp(n, "==")) return cmp_test(c, v, a, line, 0);
    if (!strcmp(n, "ne") || !strcmp(n, "!=")) return cmp_test(c, v, a, line, 9);
    if (!strcmp(n, "lt") || !strcmp(n, "lessthan") || !strcmp(n, "<")) return cmp_test(c, v, a, line, 1);
    if (!strcmp(n, "le") || !strcmp(n, "<=")) return cmp_test(c, v, a, line, 2);
    if (!strcmp(n, "gt") || !strcmp(n, "greaterthan") || !strcmp(n, ">")) return cmp_test(c, v, a, line, 3);
    if (!strcmp(n, "ge") || !strcmp(n, ">=")) return cmp_test(c, v, a, line, 4);
    if (!strcmp(n, "sameas")) {
        jv *o = jarg(a, 0, "other");
        if (!o) { jerr(c, line, "sameas needs an argument"); return -1; }
        if (v->type == JV_NONE || v->type == JV_BOOL) return o->type == v->type && o->i == v->i;
        return v == o;
    }
    if (!strcmp(n, "filter") || !strcmp(n, "test")) {
        if (v->type != JV_STR) return 0;
        return n[0] == 'f' ? jinja_is_filter(v->s.p) : jinja_is_test(v->s.p);
    }
    *found = 0;
    return 0;
}
