/* Jinja evaluator: statements write into a string builder, expressions give values.
 *
 * Scopes follow Jinja2: the template has one top frame (reads fall through to the
 * render variables, then to the builtins); every for-loop iteration, macro call and
 * with-block gets a fresh child frame, so a "set" inside them does not leak out (that
 * is what namespace() is for). Macros close over the frame they were defined in and
 * see its variables as they are when the macro runs. */
#include "text/jinja.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static char loop_name[] = "loop";
static jv loop_key = {.type = JV_STR, .s = {loop_name, 4}};

enum { EX_OK = 0, EX_ERR = -1, EX_BREAK = 1, EX_CONTINUE = 2 };
enum { MAX_EVAL_DEPTH = 1500 };

static jv *eval(jctx *c, jframe *f, jnode *n);
static int exec(jctx *c, jframe *f, jnode *n, jsb *out);

jv *jarg(jargs *a, int idx, const char *name) {
    if (idx >= 0 && idx < a->npos) return a->pos[idx];
    if (name)
        for (int k = 0; k < a->nkw; k++)
            if (!strcmp(a->kwn[k], name)) return a->kwv[k];
    return NULL;
}

/* ---- frames ---- */
static jframe *frame_new(jctx *c, jframe *parent) {
    jframe *f = ja_alloc(&c->arena, sizeof *f);
    if (!f) return jerr(c, 0, "out of memory");
    f->parent = parent;
    if (!(f->vars = jv_dict(c, 0))) return NULL;
    return f;
}

static int frame_set(jctx *c, jframe *f, const char *name, jv *v) {
    jv *k = jv_cstr(c, name);
    return k ? jv_dict_set(c, f->vars, k, v) : -1;
}

static jv *lookup(jctx *c, jframe *f, const char *name) {
    for (; f; f = f->parent) {
        jv *v = jv_dict_gets(f->vars, name);
        if (v) return v;
    }
    jv *v = jv_dict_gets(c->globals, name);
    if (v) return v;
    v = jinja_global(name);
    if (v) return v;
    return jv_undef_hint(c, "'%s' is undefined", name);
}

/* ---- errors for undefined values ---- */
static void *undef_error(jctx *c, int line, const jv *u) {
    return jerr(c, line, "%s", u->u.hint ? u->u.hint : "undefined value");
}

static jv *no_attr(jctx *c, const jv *obj, const char *name) {
    if (obj->type == JV_NONE) return jv_undef_hint(c, "None has no attribute '%s'", name);
    return jv_undef_hint(c, "'%s object' has no attribute '%s'", jv_type_name(obj), name);
}

/* ---- loop object ---- */
static jv *loop_cycle(jctx *c, jv *self, jargs *a, int line) {
    if (!a->npos) return jerr(c, line, "loop.cycle: no items given");
    return a->pos[self->loop->idx % (size_t)a->npos];
}

static jv *loop_changed(jctx *c, jv *self, jargs *a, int line) {
    jv *cur = jv_list(c, (size_t)a->npos);
    if (!cur) return NULL;
    cur->tuple = 1;
    for (int k = 0; k < a->npos; k++) cur->l.v[cur->l.n++] = a->pos[k];
    struct jloop *L = self->loop;
    if (L->last_changed && jv_equal(L->last_changed, cur)) return JV_FALSE;
    L->last_changed = cur;
    return JV_TRUE;
}

static jv *loop_attr(jctx *c, jv *lv, const char *name) {
    struct jloop *L = lv->loop;
    size_t n = L->items->l.n, i = L->idx;
    if (!strcmp(name, "index")) return jv_int(c, (int64_t)i + 1);
    if (!strcmp(name, "index0")) return jv_int(c, (int64_t)i);
    if (!strcmp(name, "revindex")) return jv_int(c, (int64_t)(n - i));
    if (!strcmp(name, "revindex0")) return jv_int(c, (int64_t)(n - i - 1));
    if (!strcmp(name, "first")) return jv_bool(i == 0);
    if (!strcmp(name, "last")) return jv_bool(i + 1 == n);
    if (!strcmp(name, "length")) return jv_int(c, (int64_t)n);
    if (!strcmp(name, "depth")) return jv_int(c, L->depth);
    if (!strcmp(name, "depth0")) return jv_int(c, L->depth - 1);
    if (!strcmp(name, "previtem"))
        return i > 0 ? L->items->l.v[i - 1] : jv_undef_hint(c, "there is no previous item");
    if (!strcmp(name, "nextitem"))
        return i + 1 < n ? L->items->l.v[i + 1] : jv_undef_hint(c, "there is no next item");
    if (!strcmp(name, "cycle")) return jv_native(c, loop_cycle, lv, "cycle");
    if (!strcmp(name, "changed")) return jv_native(c, loop_changed, lv, "changed");
    return jv_undef_hint(c, "'LoopContext' object has no attribute '%s'", name);
}

/* ---- attribute and item access (the sandbox's getattr / getitem) ---- */
static const char *list_unsafe[] = {"append", "extend", "insert", "pop", "remove", "reverse", "sort", "clear", NULL};
static const char *dict_unsafe[] = {"pop", "popitem", "setdefault", "update", "clear", NULL};

static int in_list(const char **l, const char *s) {
    for (; *l; l++)
        if (!strcmp(*l, s)) return 1;
    return 0;
}

static jv *list_method_count(jctx *c, jv *self, jargs *a, int line) {
    jv *x = jarg(a, 0, NULL);
    if (!x) return jerr(c, line, "count() takes exactly one argument");
    int64_t k = 0;
    for (size_t i = 0; i < self->l.n; i++) k += jv_equal(self->l.v[i], x);
    return jv_int(c, k);
}

static jv *list_method_index(jctx *c, jv *self, jargs *a, int line) {
    jv *x = jarg(a, 0, NULL);
    if (!x) return jerr(c, line, "index() takes at least one argument");
    for (size_t i = 0; i < self->l.n; i++)
        if (jv_equal(self->l.v[i], x)) return jv_int(c, (int64_t)i);
    return jerr(c, line, "value is not in list");
}

jv *jinja_getattr(jctx *c, jv *obj, const char *name, int line) {
    jv *m;
    switch (obj->type) {
    case JV_UNDEF: return undef_error(c, line, obj);
    case JV_DICT:
        if ((m = jinja_dict_method(c, obj, name))) return m;
        if (in_list(dict_unsafe, name))
            return jv_undef_hint(c, "access to attribute '%s' of 'dict' object is unsafe.", name);
        if ((m = jv_dict_gets(obj, name))) return m;
        return no_attr(c, obj, name);
    case JV_NS:
        if ((m = jv_dict_gets(obj, name))) return m;
        return no_attr(c, obj, name);
    case JV_STR:
        if ((m = jinja_str_method(c, obj, name))) return m;
        return no_attr(c, obj, name);
    case JV_LIST:
        if (!obj->tuple && in_list(list_unsafe, name))
            return jv_undef_hint(c, "access to attribute '%s' of 'list' object is unsafe.", name);
        if (!strcmp(name, "count")) return jv_native(c, list_method_count, obj, "count");
        if (!strcmp(name, "index")) return jv_native(c, list_method_index, obj, "index");
        return no_attr(c, obj, name);
    case JV_LOOP: return loop_attr(c, obj, name);
    default: return no_attr(c, obj, name);
    }
}

static int64_t norm_index(int64_t i, size_t n) { return i < 0 ? i + (int64_t)n : i; }

jv *jinja_getitem(jctx *c, jv *obj, jv *key, int line) {
    if (obj->type == JV_UNDEF) return undef_error(c, line, obj);
    if (obj->type == JV_DICT) {
        jv *v = jv_dict_get(obj, key);
        if (v) return v;
    } else if ((obj->type == JV_LIST || obj->type == JV_STR) && (key->type == JV_INT || key->type == JV_BOOL)) {
        if (obj->type == JV_LIST) {
            int64_t i = norm_index(key->i, obj->l.n);
            if (i >= 0 && (size_t)i < obj->l.n) return obj->l.v[i];
        } else {
            size_t len = jv_utf8_len(obj->s.p, obj->s.n);
            int64_t i = norm_index(key->i, len);
            if (i >= 0 && (size_t)i < len) {
                size_t pos = 0;
                for (int64_t k = 0; k < i; k++) ju_decode(obj->s.p, obj->s.n, &pos);
                size_t st = pos;
                ju_decode(obj->s.p, obj->s.n, &pos);
                return jv_str(c, obj->s.p + st, pos - st);
            }
        }
    } else if (obj->type == JV_LOOP && key->type == JV_STR) {
        return loop_attr(c, obj, key->s.p);
    }
    if (key->type == JV_STR && obj->type != JV_NS) {
        jv *m = obj->type == JV_DICT ? jinja_dict_method(c, obj, key->s.p)
              : obj->type == JV_STR ? jinja_str_method(c, obj, key->s.p) : NULL;
        if (m) return m;
        return no_attr(c, obj, key->s.p);
    }
    jsb b = {0};
    if (jv_repr_into(c, &b, key)) return NULL;
    if (obj->type == JV_NONE) return jv_undef_hint(c, "None has no element %s", b.p);
    return jv_undef_hint(c, "'%s object' has no element %s", jv_type_name(obj), b.p);
}

/* Python slice over n items: fills the chosen indices (caller allocates n). */
static int slice_indices(jctx *c, int line, jv *sa, jv *sb, jv *sc, size_t n, size_t *out, size_t *nout) {
    int64_t step = 1;
    jv *parts[3] = {sa, sb, sc};
    for (int k = 0; k < 3; k++)
        if (parts[k] && parts[k]->type != JV_NONE && parts[k]->type != JV_INT && parts[k]->type != JV_BOOL) {
            jerr(c, line, "slice indices must be integers or None");
            return -1;
        }
    if (sc && sc->type != JV_NONE) step = sc->i;
    if (step == 0) { jerr(c, line, "slice step cannot be zero"); return -1; }
    int64_t len = (int64_t)n, lo, hi;
    if (step > 0) {
        lo = sa && sa->type != JV_NONE ? sa->i : 0;
        hi = sb && sb->type != JV_NONE ? sb->i : len;
        if (lo < 0) lo = lo + len < 0 ? 0 : lo + len;
        if (lo > len) lo = len;
        if (hi < 0) hi = hi + len < 0 ? 0 : hi + len;
        if (hi > len) hi = len;
        *nout = 0;
        for (int64_t i = lo; i < hi; i += step) out[(*nout)++] = (size_t)i;
    } else {
        lo = sa && sa->type != JV_NONE ? sa->i : len - 1;
        hi = sb && sb->type != JV_NONE ? sb->i : -1 - len;
        if (lo < 0) lo = lo + len < 0 ? -1 : lo + len;
        if (lo >= len) lo = len - 1;
        if (hi < 0) hi = hi + len < 0 ? -1 : hi + len;
        if (hi >= len) hi = len - 1;
        *nout = 0;
        for (int64_t i = lo; i > hi; i += step) out[(*nout)++] = (size_t)i;
    }
    return 0;
}

static jv *do_slice(jctx *c, int line, jv *obj, jv *sa, jv *sb, jv *sc) {
    if (obj->type == JV_UNDEF) return undef_error(c, line, obj);
    if (obj->type != JV_LIST && obj->type != JV_STR)
        return jv_undef_hint(c, "'%s object' is not sliceable", jv_type_name(obj));
    size_t n = obj->type == JV_LIST ? obj->l.n : jv_utf8_len(obj->s.p, obj->s.n), m;
    size_t *idx = ja_alloc(&c->arena, (n + 1) * sizeof(size_t));
    if (!idx) return jerr(c, line, "out of memory");
    if (slice_indices(c, line, sa, sb, sc, n, idx, &m)) return NULL;
    if (obj->type == JV_LIST) {
        jv *r = jv_list(c, m);
        if (!r) return NULL;
        r->tuple = obj->tuple;
        for (size_t k = 0; k < m; k++) r->l.v[r->l.n++] = obj->l.v[idx[k]];
        return r;
    }
    /* code point offsets of the string, then copy the chosen characters */
    size_t *off = ja_alloc(&c->arena, (n + 1) * sizeof(size_t)), pos = 0;
    if (!off) return jerr(c, line, "out of memory");
    for (size_t k = 0; k < n; k++) { off[k] = pos; ju_decode(obj->s.p, obj->s.n, &pos); }
    off[n] = obj->s.n;
    jsb b = {0};
    for (size_t k = 0; k < m; k++)
        if (jsb_put(c, &b, obj->s.p + off[idx[k]], off[idx[k] + 1] - off[idx[k]])) return NULL;
    return jsb_to_str(c, &b);
}

jv *jinja_iter_list(jctx *c, jv *v, int line) {
    switch (v->type) {
    case JV_LIST: return v;
    case JV_UNDEF: return jv_list(c, 0);
    case JV_DICT: case JV_NS: {
        jv *r = jv_list(c, v->d.n);
        if (!r) return NULL;
        for (size_t i = 0; i < v->d.n; i++) r->l.v[r->l.n++] = v->d.k[i];
        return r;
    }
    case JV_STR: {
        jv *r = jv_list(c, v->s.n);
        if (!r) return NULL;
        for (size_t i = 0; i < v->s.n;) {
            size_t st = i;
            ju_decode(v->s.p, v->s.n, &i);
            jv *ch = jv_str(c, v->s.p + st, i - st);
            if (!ch) return NULL;
            r->l.v[r->l.n++] = ch;
        }
        return r;
    }
    default: return jerr(c, line, "'%s' object is not iterable", jv_type_name(v));
    }
}

/* ---- calls ---- */
static jv *call_macro(jctx *c, jv *fn, jargs *a, int line) {
    jnode *m = fn->mac.node;
    if (++c->calls > JINJA_MAX_CALLS) return jerr(c, line, "macro calls nested deeper than %d", JINJA_MAX_CALLS);
    if (++c->steps > JINJA_MAX_STEPS) return jerr(c, line, "template runs too long");
    jframe *f = frame_new(c, fn->mac.closure);
    if (!f) return NULL;
    jv *varargs = jv_list(c, 0), *kwargs = jv_dict(c, 0);
    if (!varargs || !kwargs) return NULL;
    varargs->tuple = 1;
    int nparams = m->nkids;
    jv **bound = ja_alloc(&c->arena, (size_t)(nparams + 1) * sizeof(jv *));
    if (!bound) return jerr(c, line, "out of memory");
    for (int k = 0; k < a->npos; k++) {
        if (k < nparams) bound[k] = a->pos[k];
        else if (jv_list_push(c, varargs, a->pos[k])) return NULL;
    }
    for (int k = 0; k < a->nkw; k++) {
        int p;
        for (p = 0; p < nparams; p++)
            if (!strcmp(m->kids[p]->str, a->kwn[k])) break;
        if (p < nparams) {
            if (bound[p]) return jerr(c, line, "macro '%s' got multiple values for argument '%s'", m->str ? m->str : "caller", a->kwn[k]);
            bound[p] = a->kwv[k];
        } else if (!strcmp(a->kwn[k], "caller")) {
            if (frame_set(c, f, "caller", a->kwv[k])) return NULL;
        } else {
            jv *key = jv_cstr(c, a->kwn[k]);
            if (!key || jv_dict_set(c, kwargs, key, a->kwv[k])) return NULL;
        }
    }
    for (int p = 0; p < nparams; p++) {
        jv *v = bound[p];
        if (!v) {
            if (m->kwv[p]) { if (!(v = eval(c, f, m->kwv[p]))) return NULL; }
            else v = jv_undef_hint(c, "parameter '%s' was not provided", m->kids[p]->str);
        }
        if (!v || frame_set(c, f, m->kids[p]->str, v)) return NULL;
    }
    if (frame_set(c, f, "varargs", varargs) || frame_set(c, f, "kwargs", kwargs)) return NULL;
    jsb out = {0};
    if (exec(c, f, m->b, &out) == EX_ERR) return NULL;
    c->calls--;
    return jsb_to_str(c, &out);
}

jv *jinja_call(jctx *c, jv *fn, jargs *a, int line) {
    switch (fn->type) {
    case JV_MACRO: return call_macro(c, fn, a, line);
    case JV_NATIVE: return fn->nat.fn(c, fn->nat.self, a, line);
    case JV_UNDEF: return undef_error(c, line, fn);
    default: return jerr(c, line, "'%s' object is not callable", jv_type_name(fn));
    }
}

static int eval_args(jctx *c, jframe *f, jnode *n, jargs *a) {
    a->npos = n->nkids;
    a->nkw = n->nkw;
    a->pos = ja_alloc(&c->arena, (size_t)(n->nkids + 1) * sizeof(jv *));
    a->kwv = ja_alloc(&c->arena, (size_t)(n->nkw + 1) * sizeof(jv *));
    a->kwn = n->kwn;
    if (!a->pos || !a->kwv) { jerr(c, n->line, "out of memory"); return -1; }
    for (int k = 0; k < n->nkids; k++)
        if (!(a->pos[k] = eval(c, f, n->kids[k]))) return -1;
    for (int k = 0; k < n->nkw; k++)
        if (!(a->kwv[k] = eval(c, f, n->kwv[k]))) return -1;
    return 0;
}

/* ---- operators ---- */
static const char *op_sym(int op) {
    static const char *s[] = {"+", "-", "*", "/", "//", "%", "**", "~"};
    return op >= 0 && op <= OP_CONCAT ? s[op] : "?";
}

static jv *escape_str(jctx *c, jv *s); /* markup-escape for Markup + str */

static jv *repeat(jctx *c, int line, jv *seq, int64_t times) {
    if (times < 0) times = 0;
    size_t unit = seq->type == JV_STR ? seq->s.n : seq->l.n;
    if (unit && (uint64_t)times > (uint64_t)JINJA_MAX_OUTPUT / unit) return jerr(c, line, "result too large");
    if (seq->type == JV_STR) {
        /* by doubling: 'x' * 30000000 is 25 copies, not 3e7 appends (the old buffer stays in the arena) */
        jsb b = {0};
        const size_t total = unit * (size_t)times;
        if (total && jsb_put(c, &b, seq->s.p, unit)) return NULL;
        while (b.n < total)
            if (jsb_put(c, &b, b.p, b.n < total - b.n ? b.n : total - b.n)) return NULL;
        return jsb_to_str(c, &b);
    }
    jv *r = jv_list(c, unit * (size_t)times);
    if (!r) return NULL;
    r->tuple = seq->tuple;
    for (int64_t k = 0; k < times; k++)
        for (size_t i = 0; i < unit; i++) r->l.v[r->l.n++] = seq->l.v[i];
    return r;
}

static jv *binop(jctx *c, int line, int op, jv *a, jv *b) {
    if (op == OP_CONCAT) {
        jsb s = {0};
        if (jv_str_into(c, &s, a) || jv_str_into(c, &s, b)) return NULL;
        return jsb_to_str(c, &s);
    }
    if (a->type == JV_UNDEF) return undef_error(c, line, a);
    if (b->type == JV_UNDEF) return undef_error(c, line, b);
    int ints = (a->type == JV_INT || a->type == JV_BOOL) && (b->type == JV_INT || b->type == JV_BOOL);
    if (jv_is_num(a) && jv_is_num(b)) {
        int64_t x = a->i, y = b->i, r;
        double fx = jv_num(a), fy = jv_num(b);
        switch (op) {
        case OP_ADD:
            if (ints) { if (__builtin_add_overflow(x, y, &r)) goto overflow; return jv_int(c, r); }
            return jv_float(c, fx + fy);
        case OP_SUB:
            if (ints) { if (__builtin_sub_overflow(x, y, &r)) goto overflow; return jv_int(c, r); }
            return jv_float(c, fx - fy);
        case OP_MUL:
            if (ints) { if (__builtin_mul_overflow(x, y, &r)) goto overflow; return jv_int(c, r); }
            return jv_float(c, fx * fy);
        case OP_DIV:
            if (fy == 0) return jerr(c, line, "division by zero");
            return jv_float(c, fx / fy);
        case OP_FLOORDIV: case OP_MOD:
            if (ints) {
                if (y == 0) return jerr(c, line, "integer division or modulo by zero");
                if (x == INT64_MIN && y == -1) goto overflow;
                int64_t q = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) { q--; m += y; }
                return jv_int(c, op == OP_MOD ? m : q);
            } else {
                if (fy == 0) return jerr(c, line, "float division by zero");
                double m = fmod(fx, fy);
                double q = (fx - m) / fy;
                if (m != 0 && ((m < 0) != (fy < 0))) { m += fy; q -= 1.0; }
                if (op == OP_MOD) return jv_float(c, m);
                double fq = floor(q);
                if (q - fq > 0.5) fq += 1.0;
                return jv_float(c, fq);
            }
        case OP_POW:
            if (ints && y >= 0) {
                int64_t acc = 1, base = x;
                for (int64_t e = y; e > 0; e >>= 1) {
                    if ((e & 1) && __builtin_mul_overflow(acc, base, &acc)) goto overflow;
                    if (e > 1 && __builtin_mul_overflow(base, base, &base)) goto overflow;
                }
                return jv_int(c, acc);
            }
            if (fx == 0 && fy < 0) return jerr(c, line, "0.0 cannot be raised to a negative power");
            return jv_float(c, pow(fx, fy));
        }
    }
    if (op == OP_ADD && a->type == JV_STR && b->type == JV_STR) {
        if (a->markup != b->markup) { /* Markup + str escapes the plain side */
            if (!a->markup) { if (!(a = escape_str(c, a))) return NULL; }
            else if (!(b = escape_str(c, b))) return NULL;
        }
        jsb s = {0};
        if (jsb_put(c, &s, a->s.p, a->s.n) || jsb_put(c, &s, b->s.p, b->s.n)) return NULL;
        jv *r = jsb_to_str(c, &s);
        if (r) r->markup = a->markup;
        return r;
    }
    if (op == OP_ADD && a->type == JV_LIST && b->type == JV_LIST && a->tuple == b->tuple) {
        jv *r = jv_list(c, a->l.n + b->l.n);
        if (!r) return NULL;
        r->tuple = a->tuple;
        for (size_t i = 0; i < a->l.n; i++) r->l.v[r->l.n++] = a->l.v[i];
        for (size_t i = 0; i < b->l.n; i++) r->l.v[r->l.n++] = b->l.v[i];
        return r;
    }
    if (op == OP_MUL && (a->type == JV_STR || a->type == JV_LIST) && (b->type == JV_INT || b->type == JV_BOOL))
        return repeat(c, line, a, b->i);
    if (op == OP_MUL && (b->type == JV_STR || b->type == JV_LIST) && (a->type == JV_INT || a->type == JV_BOOL))
        return repeat(c, line, b, a->i);
    if (op == OP_MOD && a->type == JV_STR) {
        jargs fa = {.pos = &b, .npos = 1};
        if (b->type == JV_LIST && b->tuple) { fa.pos = b->l.v; fa.npos = (int)b->l.n; }
        int found;
        return jinja_filter(c, "format", a, &fa, line, &found);
    }
    return jerr(c, line, "unsupported operand type(s) for %s: '%s' and '%s'", op_sym(op), jv_type_name(a), jv_type_name(b));
overflow:
    return jerr(c, line, "integer overflow in '%s' (gerbil keeps ints in 64 bits)", op_sym(op));
}

static jv *escape_str(jctx *c, jv *s) {
    int found;
    jargs none = {0};
    return jinja_filter(c, "escape", s, &none, 0, &found);
}

static int contains(jctx *c, int line, jv *item, jv *container) {
    switch (container->type) {
    case JV_STR:
        if (item->type == JV_UNDEF) { undef_error(c, line, item); return -1; }
        if (item->type != JV_STR) {
            jerr(c, line, "'in <string>' requires string as left operand, not %s", jv_type_name(item));
            return -1;
        }
        if (!item->s.n) return 1;
        return memmem(container->s.p, container->s.n, item->s.p, item->s.n) != NULL;
    case JV_LIST:
        for (size_t i = 0; i < container->l.n; i++)
            if (jv_equal(container->l.v[i], item)) return 1;
        return 0;
    case JV_DICT: return jv_dict_get(container, item) != NULL;
    case JV_UNDEF: return 0;
    default:
        jerr(c, line, "argument of type '%s' is not iterable", jv_type_name(container));
        return -1;
    }
}

static jv *compare(jctx *c, jnode *n, jframe *f) {
    jv *left = eval(c, f, n->kids[0]);
    if (!left) return NULL;
    for (int k = 1; k < n->nkids; k++) {
        jv *right = eval(c, f, n->kids[k]);
        if (!right) return NULL;
        int op = n->ops[k - 1], ok, r;
        switch (op) {
        case OP_EQ: ok = jv_equal(left, right); break;
        case OP_NE: ok = !jv_equal(left, right); break;
        case OP_IN: case OP_NOTIN:
            if ((r = contains(c, n->line, left, right)) < 0) return NULL;
            ok = op == OP_IN ? r : !r;
            break;
        default:
            if (left->type == JV_UNDEF) return undef_error(c, n->line, left);
            if (right->type == JV_UNDEF) return undef_error(c, n->line, right);
            if (jv_compare(c, n->line, left, right, &r)) return NULL;
            ok = op == OP_LT ? r < 0 : op == OP_LE ? r <= 0 : op == OP_GT ? r > 0 : r >= 0;
        }
        if (!ok) return JV_FALSE;
        left = right;
    }
    return JV_TRUE;
}

/* ---- expressions ---- */
static jv *eval_inner(jctx *c, jframe *f, jnode *n) {
    jv *a, *b;
    switch (n->kind) {
    case N_CONST: return n->val;
    case N_NAME: return lookup(c, f, n->str);
    case N_BLOCKVAL: return c->blockval ? c->blockval : JV_UNDEFINED;
    case N_GETATTR:
        if (!(a = eval(c, f, n->a))) return NULL;
        return jinja_getattr(c, a, n->str, n->line);
    case N_GETITEM:
        if (!(a = eval(c, f, n->a)) || !(b = eval(c, f, n->b))) return NULL;
        return jinja_getitem(c, a, b, n->line);
    case N_SLICE: {
        jv *s[3] = {NULL, NULL, NULL};
        jnode *p[3] = {n->b, n->c, n->d};
        if (!(a = eval(c, f, n->a))) return NULL;
        for (int k = 0; k < 3; k++)
            if (p[k] && !(s[k] = eval(c, f, p[k]))) return NULL;
        return do_slice(c, n->line, a, s[0], s[1], s[2]);
    }
    case N_CALL: {
        jargs args;
        if (!(a = eval(c, f, n->a)) || eval_args(c, f, n, &args)) return NULL;
        return jinja_call(c, a, &args, n->line);
    }
    case N_FILTER: {
        jargs args;
        int found = 0;
        if (!(a = eval(c, f, n->a)) || eval_args(c, f, n, &args)) return NULL;
        jv *r = jinja_filter(c, n->str, a, &args, n->line, &found);
        if (!found) return jerr(c, n->line, "unknown filter '%s'", n->str);
        return r;
    }
    case N_TEST: {
        jargs args;
        int found = 0;
        if (!(a = eval(c, f, n->a)) || eval_args(c, f, n, &args)) return NULL;
        int r = jinja_test(c, n->str, a, &args, n->line, &found);
        if (!found) return jerr(c, n->line, "unknown test '%s'", n->str);
        if (r < 0) return NULL;
        return jv_bool(n->op ? !r : r);
    }
    case N_NOT:
        if (!(a = eval(c, f, n->a))) return NULL;
        return jv_bool(!jv_truthy(a));
    case N_NEG: case N_POS:
        if (!(a = eval(c, f, n->a))) return NULL;
        if (a->type == JV_UNDEF) return undef_error(c, n->line, a);
        if (!jv_is_num(a)) return jerr(c, n->line, "bad operand type for unary %c: '%s'", n->kind == N_NEG ? '-' : '+', jv_type_name(a));
        if (n->kind == N_POS) return a->type == JV_BOOL ? jv_int(c, a->i) : a;
        if (a->type == JV_FLOAT) return jv_float(c, -a->f);
        if (a->i == INT64_MIN) return jerr(c, n->line, "integer overflow");
        return jv_int(c, -a->i);
    case N_BIN:
        if (!(a = eval(c, f, n->a)) || !(b = eval(c, f, n->b))) return NULL;
        return binop(c, n->line, n->op, a, b);
    case N_AND:
        if (!(a = eval(c, f, n->a))) return NULL;
        return jv_truthy(a) ? eval(c, f, n->b) : a;
    case N_OR:
        if (!(a = eval(c, f, n->a))) return NULL;
        return jv_truthy(a) ? a : eval(c, f, n->b);
    case N_CMP: return compare(c, n, f);
    case N_COND:
        if (!(a = eval(c, f, n->a))) return NULL;
        if (jv_truthy(a)) return eval(c, f, n->b);
        if (n->c) return eval(c, f, n->c);
        return jv_undef_hint(c, "the inline if-expression on line %d evaluated to false and no else section was defined.", n->line);
    case N_LIST: case N_TUPLE: {
        jv *l = jv_list(c, (size_t)n->nkids);
        if (!l) return NULL;
        l->tuple = n->kind == N_TUPLE;
        for (int k = 0; k < n->nkids; k++)
            if (!(l->l.v[l->l.n++] = eval(c, f, n->kids[k]))) return NULL;
        return l;
    }
    case N_DICT: {
        jv *d = jv_dict(c, (size_t)n->nkids);
        if (!d) return NULL;
        for (int k = 0; k < n->nkids; k++) {
            if (!(a = eval(c, f, n->kids[k])) || !(b = eval(c, f, n->kwv[k]))) return NULL;
            if (a->type == JV_LIST && !a->tuple) return jerr(c, n->line, "unhashable type: 'list'");
            if (a->type == JV_DICT) return jerr(c, n->line, "unhashable type: 'dict'");
            if (jv_dict_set(c, d, a, b)) return NULL;
        }
        return d;
    }
    default: return jerr(c, n->line, "internal error: statement used as an expression");
    }
}

static jv *eval(jctx *c, jframe *f, jnode *n) {
    if (c->status != GERBIL_OK) return NULL;
    if (++c->depth > MAX_EVAL_DEPTH) return jerr(c, n->line, "template recursion too deep");
    jv *r = eval_inner(c, f, n);
    c->depth--;
    return r;
}

/* ---- statements ---- */
static int assign(jctx *c, jframe *f, jnode *target, jv *v) {
    if (target->kind == N_NAME) { /* the key string is made once per AST node */
        if (!target->val && !(target->val = jv_cstr(c, target->str))) return EX_ERR;
        return jv_dict_set(c, f->vars, target->val, v) ? EX_ERR : EX_OK;
    }
    if (target->kind == N_GETATTR) {
        jv *ns = lookup(c, f, target->a->str);
        if (!ns) return EX_ERR;
        if (ns->type != JV_NS) {
            jerr(c, target->line, "cannot assign attribute on non-namespace object");
            return EX_ERR;
        }
        jv *k = jv_cstr(c, target->str);
        return !k || jv_dict_set(c, ns, k, v) ? EX_ERR : EX_OK;
    }
    /* tuple unpacking */
    jv *items = jinja_iter_list(c, v, target->line);
    if (!items) return EX_ERR;
    if (items->l.n != (size_t)target->nkids) {
        jerr(c, target->line, "%s values to unpack (expected %d, got %zu)",
             items->l.n > (size_t)target->nkids ? "too many" : "not enough", target->nkids, items->l.n);
        return EX_ERR;
    }
    for (int k = 0; k < target->nkids; k++)
        if (assign(c, f, target->kids[k], items->l.v[k])) return EX_ERR;
    return EX_OK;
}

static int exec_for(jctx *c, jframe *f, jnode *n, jsb *out) {
    jv *it = eval(c, f, n->b);
    if (!it) return EX_ERR;
    jv *items = jinja_iter_list(c, it, n->line);
    if (!items) return EX_ERR;
    if (n->e) { /* for x in xs if cond: filter first, so loop.length counts what is kept */
        jv *kept = jv_list(c, items->l.n);
        if (!kept) return EX_ERR;
        for (size_t i = 0; i < items->l.n; i++) {
            jframe *tf = frame_new(c, f);
            if (!tf || assign(c, tf, n->a, items->l.v[i])) return EX_ERR;
            jv *ok = eval(c, tf, n->e);
            if (!ok) return EX_ERR;
            if (jv_truthy(ok)) kept->l.v[kept->l.n++] = items->l.v[i];
        }
        items = kept;
    }
    int depth = 1; /* loop.depth only grows in recursive loops, which are not supported */
    struct jloop *L = ja_alloc(&c->arena, sizeof *L);
    jv *lv = ja_alloc(&c->arena, sizeof *lv);
    if (!L || !lv) { jerr(c, n->line, "out of memory"); return EX_ERR; }
    jframe *it_f = NULL;
    L->items = items;
    L->depth = depth;
    lv->type = JV_LOOP;
    lv->loop = L;
    for (size_t i = 0; i < items->l.n; i++) {
        if (++c->steps > JINJA_MAX_STEPS) { jerr(c, n->line, "template runs too long"); return EX_ERR; }
        L->idx = i;
        /* a fresh scope per iteration; the previous one is reused unless a macro kept it */
        if (!it_f || it_f->captured) { if (!(it_f = frame_new(c, f))) return EX_ERR; }
        else it_f->vars->d.n = 0;
        if (jv_dict_set(c, it_f->vars, &loop_key, lv) || assign(c, it_f, n->a, items->l.v[i])) return EX_ERR;
        int r = exec(c, it_f, n->c, out);
        if (r == EX_ERR) return EX_ERR;
        if (r == EX_BREAK) break;
    }
    if (!items->l.n && n->d) return exec(c, f, n->d, out);
    return EX_OK;
}

/* Render body into a fresh string (set blocks, filter blocks). */
static jv *capture(jctx *c, jframe *f, jnode *body) {
    jsb b = {0};
    int r = exec(c, f, body, &b);
    if (r == EX_ERR) return NULL;
    return jsb_to_str(c, &b);
}

static jv *apply_block_filters(jctx *c, jframe *f, jnode *chain, jv *v) {
    jv *saved = c->blockval;
    c->blockval = v;
    jv *r = eval(c, f, chain);
    c->blockval = saved;
    return r;
}

static jv *make_macro(jctx *c, jnode *n, jframe *closure) {
    jv *m = ja_alloc(&c->arena, sizeof *m);
    if (!m) return jerr(c, n->line, "out of memory");
    m->type = JV_MACRO;
    m->mac.node = n;
    m->mac.closure = closure;
    closure->captured = 1;
    return m;
}

static int exec_inner(jctx *c, jframe *f, jnode *n, jsb *out) {
    jv *v;
    switch (n->kind) {
    case N_BODY:
        for (int k = 0; k < n->nkids; k++) {
            int r = exec(c, f, n->kids[k], out);
            if (r != EX_OK) return r;
        }
        return EX_OK;
    case N_TEXT: return jsb_put(c, out, n->str, n->slen) ? EX_ERR : EX_OK;
    case N_OUTPUT:
        if (!(v = eval(c, f, n->a))) return EX_ERR;
        return jv_str_into(c, out, v) ? EX_ERR : EX_OK;
    case N_IF:
        for (jnode *b = n; b;) {
            if (b->kind != N_IF) return exec(c, f, b, out);
            if (!(v = eval(c, f, b->a))) return EX_ERR;
            if (jv_truthy(v)) return exec(c, f, b->b, out);
            b = b->c;
        }
        return EX_OK;
    case N_FOR: return exec_for(c, f, n, out);
    case N_SET:
        if (!(v = eval(c, f, n->b))) return EX_ERR;
        return assign(c, f, n->a, v);
    case N_SETBLOCK:
        if (!(v = capture(c, f, n->b))) return EX_ERR;
        if (n->c && !(v = apply_block_filters(c, f, n->c, v))) return EX_ERR;
        return assign(c, f, n->a, v);
    case N_FILTERBLOCK:
        if (!(v = capture(c, f, n->b)) || !(v = apply_block_filters(c, f, n->a, v))) return EX_ERR;
        return jv_str_into(c, out, v) ? EX_ERR : EX_OK;
    case N_MACRO:
        if (!(v = make_macro(c, n, f))) return EX_ERR;
        return frame_set(c, f, n->str, v) ? EX_ERR : EX_OK;
    case N_CALLBLOCK: {
        jnode *call = n->a;
        jargs args;
        jv *fn = eval(c, f, call->a), *caller = make_macro(c, n, f);
        if (!fn || !caller || eval_args(c, f, call, &args)) return EX_ERR;
        const char **kwn = ja_alloc(&c->arena, (size_t)(args.nkw + 1) * sizeof(char *));
        jv **kwv = ja_alloc(&c->arena, (size_t)(args.nkw + 1) * sizeof(jv *));
        if (!kwn || !kwv) { jerr(c, n->line, "out of memory"); return EX_ERR; }
        for (int k = 0; k < args.nkw; k++) { kwn[k] = args.kwn[k]; kwv[k] = args.kwv[k]; }
        kwn[args.nkw] = "caller";
        kwv[args.nkw] = caller;
        args.kwn = kwn;
        args.kwv = kwv;
        args.nkw++;
        if (!(v = jinja_call(c, fn, &args, n->line))) return EX_ERR;
        return jv_str_into(c, out, v) ? EX_ERR : EX_OK;
    }
    case N_WITH: {
        jframe *wf = frame_new(c, f);
        if (!wf) return EX_ERR;
        for (int k = 0; k < n->nkids; k++) {
            if (!(v = eval(c, f, n->kwv[k])) || assign(c, wf, n->kids[k], v)) return EX_ERR;
        }
        return exec(c, wf, n->b, out);
    }
    case N_BREAK: return EX_BREAK;
    case N_CONTINUE: return EX_CONTINUE;
    default: jerr(c, n->line, "internal error: expression used as a statement"); return EX_ERR;
    }
}

static int exec(jctx *c, jframe *f, jnode *n, jsb *out) {
    if (c->status != GERBIL_OK) return EX_ERR;
    if (++c->depth > MAX_EVAL_DEPTH) { jerr(c, n->line, "template recursion too deep"); return EX_ERR; }
    int r = exec_inner(c, f, n, out);
    c->depth--;
    if (r == EX_ERR && c->status == GERBIL_OK) jerr(c, n->line, "render failed");
    return r;
}

int jinja_render(jctx *c, jnode *body, jsb *out) {
    jframe *top = frame_new(c, NULL);
    if (!top) return -1;
    int r = exec(c, top, body, out);
    if (r == EX_BREAK || r == EX_CONTINUE) return 0; /* the parser keeps these inside loops */
    return r == EX_ERR ? -1 : 0;
}
