/* Jinja parser: tokens -> AST, following Jinja2's grammar and operator precedence
 * (or < and < not < comparisons < + - < ~ < * / // % < ** < unary - + < filters, tests,
 * calls, attribute and item access). */
#include "text/jinja.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    jctx *c;
    jtok *t;
    int nt, i, depth;
    const char *expect[8]; /* end tags the innermost open block waits for */
    int nexpect;
    const char *open;      /* name of the innermost open block */
    int loops;             /* enclosing for bodies, for break/continue (reset in macros) */
} parser;

static jtok *cur(parser *P) { return &P->t[P->i]; }
static jtok *peek(parser *P, int k) { return &P->t[P->i + k < P->nt ? P->i + k : P->nt - 1]; }
static void adv(parser *P) { if (P->i < P->nt - 1) P->i++; }

static int tok_is(jtok *t, jtok_type type, const char *text) {
    return t->type == type && (!text || (t->n == strlen(text) && !memcmp(t->p, text, t->n)));
}
static int is_op(parser *P, const char *op) { return tok_is(cur(P), JT_OP, op); }
static int is_name(parser *P, const char *name) { return tok_is(cur(P), JT_NAME, name); }

static const char *tok_desc(jtok *t, char *buf, size_t cap) {
    switch (t->type) {
    case JT_EOF: return "end of template";
    case JT_BLOCK_END: return "end of statement block";
    case JT_VAR_END: return "end of print statement";
    case JT_DATA: return "template data";
    case JT_BLOCK_BEGIN: return "begin of statement block";
    case JT_VAR_BEGIN: return "begin of print statement";
    default: snprintf(buf, cap, "'%.*s'", (int)(t->n > 40 ? 40 : t->n), t->p); return buf;
    }
}

static void *fail_unexpected(parser *P, const char *want) {
    char buf[64];
    jtok *t = cur(P);
    return jerr(P->c, t->line, "unexpected %s, expected %s", tok_desc(t, buf, sizeof buf), want);
}

static int expect_op(parser *P, const char *op) {
    if (!is_op(P, op)) {
        char w[16];
        snprintf(w, sizeof w, "'%s'", op);
        fail_unexpected(P, w);
        return -1;
    }
    adv(P);
    return 0;
}

static jnode *node(parser *P, jnode_kind kind, int line) {
    jnode *n = ja_alloc(&P->c->arena, sizeof *n);
    if (!n) return jerr(P->c, line, "template too large");
    n->kind = kind;
    n->line = line;
    return n;
}

/* Growable node arrays in the arena. */
typedef struct { jnode **v; int n, cap; } nvec;
static int nvec_push(parser *P, nvec *a, jnode *x) {
    if (a->n == a->cap) {
        int cap = a->cap ? a->cap * 2 : 4;
        jnode **nv = ja_alloc(&P->c->arena, (size_t)cap * sizeof *nv);
        if (!nv) { jerr(P->c, cur(P)->line, "template too large"); return -1; }
        if (a->n) memcpy(nv, a->v, (size_t)a->n * sizeof *nv);
        a->v = nv;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return 0;
}

static jnode *parse_expr(parser *P);
static jnode *parse_or(parser *P);
static jnode *parse_unary(parser *P, int with_filter);
static jnode *parse_primary(parser *P);
static jnode *parse_postfix(parser *P, jnode *n);
static jnode *parse_body(parser *P, const char **ends, int nends);

static int enter(parser *P) {
    if (++P->depth > JINJA_MAX_DEPTH) { jerr(P->c, cur(P)->line, "template nested too deeply"); return -1; }
    return 0;
}

/* Call arguments after "(": positional and name=value; fills kids and kw. */
static int parse_call_args(parser *P, jnode *n) {
    nvec pos = {0}, kwv = {0};
    const char **kwn = NULL;
    int nkwn = 0, cap = 0;
    if (expect_op(P, "(")) return -1;
    while (!is_op(P, ")")) {
        if (pos.n + kwv.n) { if (expect_op(P, ",")) return -1; if (is_op(P, ")")) break; }
        if (is_op(P, "*") || is_op(P, "**")) { fail_unexpected(P, "an argument (*args and **kwargs are not supported)"); return -1; }
        if (cur(P)->type == JT_NAME && tok_is(peek(P, 1), JT_OP, "=")) {
            jtok *nt = cur(P);
            adv(P);
            adv(P);
            jnode *v = parse_expr(P);
            if (!v) return -1;
            if (nkwn == cap) {
                cap = cap ? cap * 2 : 4;
                const char **nk = ja_alloc(&P->c->arena, (size_t)cap * sizeof *nk);
                if (!nk) { jerr(P->c, nt->line, "template too large"); return -1; }
                if (nkwn) memcpy(nk, kwn, (size_t)nkwn * sizeof *nk);
                kwn = nk;
            }
            if (!(kwn[nkwn++] = ja_strndup(&P->c->arena, nt->p, nt->n)) || nvec_push(P, &kwv, v)) return -1;
        } else {
            if (kwv.n) { jerr(P->c, cur(P)->line, "positional argument follows keyword argument"); return -1; }
            jnode *v = parse_expr(P);
            if (!v || nvec_push(P, &pos, v)) return -1;
        }
    }
    adv(P);
    n->kids = pos.v;
    n->nkids = pos.n;
    n->kwn = kwn;
    n->kwv = kwv.v;
    n->nkw = kwv.n;
    return 0;
}

static char *name_str(parser *P, jtok *t) { return ja_strndup(&P->c->arena, t->p, t->n); }

static jnode *parse_filter(parser *P, jnode *input) {
    /* at "|" */
    adv(P);
    if (cur(P)->type != JT_NAME) return fail_unexpected(P, "a filter name");
    jnode *n = node(P, N_FILTER, cur(P)->line);
    if (!n) return NULL;
    n->a = input;
    n->str = name_str(P, cur(P));
    n->slen = cur(P)->n;
    adv(P);
    if (is_op(P, ".")) return jerr(P->c, cur(P)->line, "dotted filter names are not supported ('%s.')", n->str);
    if (is_op(P, "(") && parse_call_args(P, n)) return NULL;
    return n;
}

static jnode *parse_test(parser *P, jnode *input) {
    int line = cur(P)->line;
    adv(P); /* is */
    jnode *n = node(P, N_TEST, line);
    if (!n) return NULL;
    n->a = input;
    if (is_name(P, "not")) { n->op = 1; adv(P); }
    if (cur(P)->type != JT_NAME) return fail_unexpected(P, "a test name");
    n->str = name_str(P, cur(P));
    n->slen = cur(P)->n;
    adv(P);
    jtok *t = cur(P);
    if (is_op(P, "(")) {
        if (parse_call_args(P, n)) return NULL;
    } else if ((t->type == JT_NAME || t->type == JT_STRING || t->type == JT_INT || t->type == JT_FLOAT ||
                is_op(P, "[") || is_op(P, "{")) &&
               !is_name(P, "else") && !is_name(P, "or") && !is_name(P, "and")) {
        if (is_name(P, "is")) return jerr(P->c, t->line, "you cannot chain multiple tests with is");
        jnode *arg = parse_primary(P);
        if (!arg || !(arg = parse_postfix(P, arg))) return NULL;
        n->kids = ja_alloc(&P->c->arena, sizeof(jnode *));
        if (!n->kids) return jerr(P->c, line, "template too large");
        n->kids[0] = arg;
        n->nkids = 1;
    }
    return n;
}

static jnode *parse_filter_expr(parser *P, jnode *n) {
    for (;;) {
        if (is_op(P, "|")) n = parse_filter(P, n);
        else if (is_name(P, "is")) n = parse_test(P, n);
        else if (is_op(P, "(")) {
            jnode *call = node(P, N_CALL, cur(P)->line);
            if (!call) return NULL;
            call->a = n;
            if (parse_call_args(P, call)) return NULL;
            n = call;
        } else return n;
        if (!n) return NULL;
    }
}

/* Subscript contents: an expression or a slice a:b:c. */
static jnode *parse_subscript(parser *P, jnode *obj, int line) {
    jnode *parts[3] = {NULL, NULL, NULL};
    int colons = 0;
    if (!is_op(P, ":")) { if (!(parts[0] = parse_expr(P))) return NULL; }
    while (is_op(P, ":") && colons < 2) {
        adv(P);
        colons++;
        if (!is_op(P, ":") && !is_op(P, "]") && !is_op(P, ",")) {
            if (!(parts[colons] = parse_expr(P))) return NULL;
        }
    }
    jnode *n = node(P, colons ? N_SLICE : N_GETITEM, line);
    if (!n) return NULL;
    n->a = obj;
    n->b = parts[0];
    if (colons) { n->c = parts[1]; n->d = parts[2]; }
    return n;
}

static jnode *parse_postfix(parser *P, jnode *n) {
    for (;;) {
        int line = cur(P)->line;
        if (is_op(P, ".")) {
            adv(P);
            jtok *t = cur(P);
            if (t->type == JT_NAME) {
                jnode *g = node(P, N_GETATTR, line);
                if (!g) return NULL;
                g->a = n;
                g->str = name_str(P, t);
                g->slen = t->n;
                adv(P);
                n = g;
            } else if (t->type == JT_INT) {
                jnode *g = node(P, N_GETITEM, line), *k = node(P, N_CONST, line);
                if (!g || !k) return NULL;
                k->val = t->val;
                g->a = n;
                g->b = k;
                adv(P);
                n = g;
            } else return fail_unexpected(P, "an attribute name");
        } else if (is_op(P, "[")) {
            adv(P);
            jnode *g = parse_subscript(P, n, line);
            if (!g) return NULL;
            if (is_op(P, ",")) return jerr(P->c, line, "tuple subscripts are not supported");
            if (expect_op(P, "]")) return NULL;
            n = g;
        } else if (is_op(P, "(")) {
            jnode *call = node(P, N_CALL, line);
            if (!call) return NULL;
            call->a = n;
            if (parse_call_args(P, call)) return NULL;
            n = call;
        } else return n;
    }
}

/* Comma-separated expressions; a single one without a comma stays itself
 * (Jinja's parse_tuple). */
static jnode *parse_tuple(parser *P, int explicit_parens, int with_condexpr) {
    int line = cur(P)->line;
    nvec items = {0};
    int is_tuple = 0;
    for (;;) {
        if (items.n && expect_op(P, ",")) return NULL;
        jtok *t = cur(P);
        if (t->type == JT_BLOCK_END || t->type == JT_VAR_END || is_op(P, ")") || is_name(P, "recursive"))
            break;
        jnode *e = with_condexpr ? parse_expr(P) : parse_or(P);
        if (!e || nvec_push(P, &items, e)) return NULL;
        if (!is_op(P, ",")) break;
        is_tuple = 1;
    }
    if (!is_tuple) {
        if (items.n) return items.v[0];
        if (!explicit_parens) return fail_unexpected(P, "an expression");
    }
    jnode *n = node(P, N_TUPLE, line);
    if (!n) return NULL;
    n->kids = items.v;
    n->nkids = items.n;
    return n;
}

static jnode *parse_primary(parser *P) {
    jtok *t = cur(P);
    int line = t->line;
    if (enter(P)) return NULL;
    jnode *n = NULL;
    if (t->type == JT_NAME) {
        static const char *consts[] = {"true", "True", "false", "False", "none", "None"};
        for (int k = 0; k < 6; k++)
            if (tok_is(t, JT_NAME, consts[k])) {
                n = node(P, N_CONST, line);
                if (n) n->val = k < 2 ? JV_TRUE : k < 4 ? JV_FALSE : JV_NONEV;
                adv(P);
                P->depth--;
                return n;
            }
        n = node(P, N_NAME, line);
        if (!n) return NULL;
        n->str = name_str(P, t);
        n->slen = t->n;
        adv(P);
    } else if (t->type == JT_STRING) {
        /* adjacent string literals concatenate */
        jv *v = t->val;
        adv(P);
        while (cur(P)->type == JT_STRING) {
            jsb b = {0};
            if (jsb_put(P->c, &b, v->s.p, v->s.n) || jsb_put(P->c, &b, cur(P)->val->s.p, cur(P)->val->s.n))
                return NULL;
            if (!(v = jsb_to_str(P->c, &b))) return NULL;
            adv(P);
        }
        if (!(n = node(P, N_CONST, line))) return NULL;
        n->val = v;
    } else if (t->type == JT_INT || t->type == JT_FLOAT) {
        if (!(n = node(P, N_CONST, line))) return NULL;
        n->val = t->val;
        adv(P);
    } else if (is_op(P, "(")) {
        adv(P);
        if (!(n = parse_tuple(P, 1, 1))) return NULL;
        if (expect_op(P, ")")) return NULL;
    } else if (is_op(P, "[")) {
        adv(P);
        nvec items = {0};
        while (!is_op(P, "]")) {
            if (items.n && expect_op(P, ",")) return NULL;
            if (is_op(P, "]")) break;
            jnode *e = parse_expr(P);
            if (!e || nvec_push(P, &items, e)) return NULL;
        }
        adv(P);
        if (!(n = node(P, N_LIST, line))) return NULL;
        n->kids = items.v;
        n->nkids = items.n;
    } else if (is_op(P, "{")) {
        adv(P);
        nvec keys = {0}, vals = {0};
        while (!is_op(P, "}")) {
            if (keys.n && expect_op(P, ",")) return NULL;
            if (is_op(P, "}")) break;
            jnode *k = parse_expr(P);
            if (!k || expect_op(P, ":")) return NULL;
            jnode *v = parse_expr(P);
            if (!v || nvec_push(P, &keys, k) || nvec_push(P, &vals, v)) return NULL;
        }
        adv(P);
        if (!(n = node(P, N_DICT, line))) return NULL;
        n->kids = keys.v;
        n->nkids = keys.n;
        n->kwv = vals.v;
        n->nkw = vals.n;
    } else {
        return fail_unexpected(P, "an expression");
    }
    P->depth--;
    return n;
}

static jnode *parse_unary(parser *P, int with_filter) {
    int line = cur(P)->line;
    if (enter(P)) return NULL;
    jnode *n;
    if (is_op(P, "-") || is_op(P, "+")) {
        int neg = is_op(P, "-");
        adv(P);
        jnode *x = parse_unary(P, 0);
        if (!x || !(n = node(P, neg ? N_NEG : N_POS, line))) return NULL;
        n->a = x;
    } else if (!(n = parse_primary(P))) return NULL;
    if (!(n = parse_postfix(P, n))) return NULL;
    if (with_filter && !(n = parse_filter_expr(P, n))) return NULL;
    P->depth--;
    return n;
}

static jnode *binop(parser *P, int op, jnode *a, jnode *b, int line) {
    jnode *n = node(P, N_BIN, line);
    if (!n) return NULL;
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static jnode *parse_pow(parser *P) {
    jnode *n = parse_unary(P, 1);
    while (n && is_op(P, "**")) {
        int line = cur(P)->line;
        adv(P);
        jnode *r = parse_unary(P, 1);
        n = r ? binop(P, OP_POW, n, r, line) : NULL;
    }
    return n;
}

static jnode *parse_math2(parser *P) {
    jnode *n = parse_pow(P);
    for (;;) {
        if (!n) return NULL;
        int op = is_op(P, "*") ? OP_MUL : is_op(P, "/") ? OP_DIV : is_op(P, "//") ? OP_FLOORDIV
               : is_op(P, "%") ? OP_MOD : -1;
        if (op < 0) return n;
        int line = cur(P)->line;
        adv(P);
        jnode *r = parse_pow(P);
        n = r ? binop(P, op, n, r, line) : NULL;
    }
}

static jnode *parse_concat(parser *P) {
    jnode *n = parse_math2(P);
    while (n && is_op(P, "~")) {
        int line = cur(P)->line;
        adv(P);
        jnode *r = parse_math2(P);
        n = r ? binop(P, OP_CONCAT, n, r, line) : NULL;
    }
    return n;
}

static jnode *parse_math1(parser *P) {
    jnode *n = parse_concat(P);
    for (;;) {
        if (!n) return NULL;
        int op = is_op(P, "+") ? OP_ADD : is_op(P, "-") ? OP_SUB : -1;
        if (op < 0) return n;
        int line = cur(P)->line;
        adv(P);
        jnode *r = parse_concat(P);
        n = r ? binop(P, op, n, r, line) : NULL;
    }
}

static jnode *parse_compare(parser *P) {
    int line = cur(P)->line;
    jnode *first = parse_math1(P);
    if (!first) return NULL;
    nvec operands = {0};
    uint8_t ops[64];
    int nops = 0;
    for (;;) {
        int op = is_op(P, "==") ? OP_EQ : is_op(P, "!=") ? OP_NE : is_op(P, "<") ? OP_LT
               : is_op(P, "<=") ? OP_LE : is_op(P, ">") ? OP_GT : is_op(P, ">=") ? OP_GE
               : is_name(P, "in") ? OP_IN
               : (is_name(P, "not") && tok_is(peek(P, 1), JT_NAME, "in")) ? OP_NOTIN : -1;
        if (op < 0) break;
        if (nops == 64) return jerr(P->c, line, "comparison chain too long");
        adv(P);
        if (op == OP_NOTIN) adv(P);
        if (!operands.n && nvec_push(P, &operands, first)) return NULL;
        jnode *r = parse_math1(P);
        if (!r || nvec_push(P, &operands, r)) return NULL;
        ops[nops++] = (uint8_t)op;
    }
    if (!nops) return first;
    jnode *n = node(P, N_CMP, line);
    if (!n || !(n->ops = ja_alloc(&P->c->arena, (size_t)nops))) return jerr(P->c, line, "template too large");
    memcpy(n->ops, ops, (size_t)nops);
    n->kids = operands.v;
    n->nkids = operands.n;
    return n;
}

static jnode *parse_not(parser *P) {
    if (is_name(P, "not")) {
        int line = cur(P)->line;
        adv(P);
        if (enter(P)) return NULL;
        jnode *x = parse_not(P), *n;
        if (!x || !(n = node(P, N_NOT, line))) return NULL;
        P->depth--;
        n->a = x;
        return n;
    }
    return parse_compare(P);
}

static jnode *parse_and(parser *P) {
    jnode *n = parse_not(P);
    while (n && is_name(P, "and")) {
        int line = cur(P)->line;
        adv(P);
        jnode *r = parse_not(P), *a;
        if (!r || !(a = node(P, N_AND, line))) return NULL;
        a->a = n;
        a->b = r;
        n = a;
    }
    return n;
}

static jnode *parse_or(parser *P) {
    jnode *n = parse_and(P);
    while (n && is_name(P, "or")) {
        int line = cur(P)->line;
        adv(P);
        jnode *r = parse_and(P), *o;
        if (!r || !(o = node(P, N_OR, line))) return NULL;
        o->a = n;
        o->b = r;
        n = o;
    }
    return n;
}

/* Full expression with conditional expressions: a if c else b. */
static jnode *parse_expr(parser *P) {
    if (enter(P)) return NULL;
    jnode *n = parse_or(P);
    while (n && is_name(P, "if")) {
        int line = cur(P)->line;
        adv(P);
        jnode *cond = parse_or(P), *els = NULL, *ce;
        if (!cond) return NULL;
        if (is_name(P, "else")) {
            adv(P);
            if (!(els = parse_expr(P))) return NULL;
        }
        if (!(ce = node(P, N_COND, line))) return NULL;
        ce->a = cond;
        ce->b = n;
        ce->c = els;
        n = ce;
    }
    if (n) P->depth--;
    return n;
}

/* ---- statements ---- */
static int expect_block_end(parser *P) {
    if (cur(P)->type != JT_BLOCK_END) { fail_unexpected(P, "end of statement block"); return -1; }
    adv(P);
    return 0;
}

/* A name, or comma-separated names (optionally in parens); with ns: also name.attr. */
static jnode *parse_assign_target(parser *P, int with_ns) {
    int line = cur(P)->line;
    if (with_ns && cur(P)->type == JT_NAME && tok_is(peek(P, 1), JT_OP, ".") && peek(P, 2)->type == JT_NAME) {
        jnode *nm = node(P, N_NAME, line), *g = node(P, N_GETATTR, line);
        if (!nm || !g) return NULL;
        nm->str = name_str(P, cur(P));
        nm->slen = cur(P)->n;
        adv(P);
        adv(P);
        g->a = nm;
        g->str = name_str(P, cur(P));
        g->slen = cur(P)->n;
        adv(P);
        return g;
    }
    int parens = is_op(P, "(");
    if (parens) adv(P);
    nvec names = {0};
    int trailing = 0;
    for (;;) {
        if (cur(P)->type != JT_NAME) return fail_unexpected(P, "a variable name");
        jnode *nm = node(P, N_NAME, cur(P)->line);
        if (!nm) return NULL;
        nm->str = name_str(P, cur(P));
        nm->slen = cur(P)->n;
        static const char *reserved[] = {"true", "false", "none", "True", "False", "None"};
        for (int k = 0; k < 6; k++)
            if (!strcmp(nm->str, reserved[k])) return jerr(P->c, line, "cannot assign to '%s'", nm->str);
        if (nvec_push(P, &names, nm)) return NULL;
        adv(P);
        trailing = 0;
        if (!is_op(P, ",")) break;
        adv(P);
        trailing = 1;
        if (cur(P)->type != JT_NAME) break;
    }
    if (parens && expect_op(P, ")")) return NULL;
    if (names.n == 1 && !trailing && !parens) return names.v[0];
    jnode *t = node(P, N_TUPLE, line);
    if (!t) return NULL;
    t->kids = names.v;
    t->nkids = names.n;
    return t;
}

/* Macro / caller parameter list "(a, b=1)". */
static int parse_params(parser *P, jnode *n) {
    nvec names = {0}, defs = {0};
    if (expect_op(P, "(")) return -1;
    while (!is_op(P, ")")) {
        if (names.n && expect_op(P, ",")) return -1;
        if (is_op(P, ")")) break;
        if (cur(P)->type != JT_NAME) { fail_unexpected(P, "a parameter name"); return -1; }
        jnode *nm = node(P, N_NAME, cur(P)->line), *def = NULL;
        if (!nm) return -1;
        nm->str = name_str(P, cur(P));
        nm->slen = cur(P)->n;
        adv(P);
        if (is_op(P, "=")) {
            adv(P);
            if (!(def = parse_expr(P))) return -1;
        } else if (defs.n && defs.v[defs.n - 1]) {
            jerr(P->c, nm->line, "non-default argument follows default argument");
            return -1;
        }
        if (nvec_push(P, &names, nm) || nvec_push(P, &defs, def)) return -1;
    }
    adv(P);
    n->kids = names.v;
    n->nkids = names.n;
    n->kwv = defs.v;
    n->nkw = defs.n;
    return 0;
}

/* Filters applied to a captured block: "| f(x) | g" over N_BLOCKVAL. */
static jnode *parse_block_filters(parser *P, int line, int need_one) {
    jnode *n = node(P, N_BLOCKVAL, line);
    if (!n) return NULL;
    if (need_one && !is_op(P, "|")) {
        /* {% filter upper %}: the first filter comes without "|" */
        if (cur(P)->type != JT_NAME) return fail_unexpected(P, "a filter name");
        P->i--; /* parse_filter skips one token as the "|" */
        return parse_filter_expr(P, parse_filter(P, n));
    }
    while (n && is_op(P, "|")) n = parse_filter(P, n);
    return n;
}

static jnode *parse_statement(parser *P) {
    jtok *t = cur(P);
    int line = t->line;
    if (t->type != JT_NAME) return fail_unexpected(P, "a statement name");
    const char *w = name_str(P, t);
    if (!w) return NULL;
    adv(P);
    jnode *n = NULL;
    if (!strcmp(w, "if")) {
        if (!(n = node(P, N_IF, line)) || !(n->a = parse_tuple(P, 0, 0)) || expect_block_end(P)) return NULL;
        static const char *ends[] = {"elif", "else", "endif"};
        jnode *at = n;
        for (;;) {
            if (!(at->b = parse_body(P, ends, 3))) return NULL;
            jtok *e = cur(P);
            adv(P);
            if (tok_is(e, JT_NAME, "elif")) {
                jnode *el = node(P, N_IF, e->line);
                if (!el || !(el->a = parse_tuple(P, 0, 0)) || expect_block_end(P)) return NULL;
                at->c = el;
                at = el;
                continue;
            }
            if (tok_is(e, JT_NAME, "else")) {
                static const char *endif[] = {"endif"};
                if (expect_block_end(P) || !(at->c = parse_body(P, endif, 1))) return NULL;
                adv(P);
            }
            break;
        }
    } else if (!strcmp(w, "for")) {
        if (!(n = node(P, N_FOR, line)) || !(n->a = parse_assign_target(P, 0))) return NULL;
        if (!is_name(P, "in")) return fail_unexpected(P, "'in'");
        adv(P);
        if (!(n->b = parse_tuple(P, 0, 0))) return NULL;
        if (is_name(P, "if")) {
            adv(P);
            if (!(n->e = parse_expr(P))) return NULL;
        }
        if (is_name(P, "recursive")) return jerr(P->c, line, "recursive for loops are not supported");
        if (expect_block_end(P)) return NULL;
        static const char *ends[] = {"endfor", "else"};
        P->loops++;
        n->c = parse_body(P, ends, 2);
        P->loops--;
        if (!n->c) return NULL;
        if (is_name(P, "else")) {
            static const char *endfor[] = {"endfor"};
            adv(P);
            if (expect_block_end(P) || !(n->d = parse_body(P, endfor, 1))) return NULL;
        }
        adv(P);
    } else if (!strcmp(w, "set")) {
        jnode *target = parse_assign_target(P, 1);
        if (!target) return NULL;
        if (is_op(P, "=")) {
            adv(P);
            if (!(n = node(P, N_SET, line))) return NULL;
            n->a = target;
            if (!(n->b = parse_tuple(P, 0, 1))) return NULL;
        } else {
            if (!(n = node(P, N_SETBLOCK, line))) return NULL;
            n->a = target;
            if (is_op(P, "|") && !(n->c = parse_block_filters(P, line, 0))) return NULL;
            static const char *ends[] = {"endset"};
            if (expect_block_end(P) || !(n->b = parse_body(P, ends, 1))) return NULL;
            adv(P);
        }
    } else if (!strcmp(w, "macro")) {
        if (cur(P)->type != JT_NAME) return fail_unexpected(P, "a macro name");
        if (!(n = node(P, N_MACRO, line))) return NULL;
        n->str = name_str(P, cur(P));
        n->slen = cur(P)->n;
        adv(P);
        static const char *ends[] = {"endmacro"};
        int loops = P->loops;
        P->loops = 0;
        if (parse_params(P, n) || expect_block_end(P) || !(n->b = parse_body(P, ends, 1))) return NULL;
        P->loops = loops;
        adv(P);
    } else if (!strcmp(w, "call")) {
        if (!(n = node(P, N_CALLBLOCK, line))) return NULL;
        if (is_op(P, "(") && parse_params(P, n)) return NULL;
        jnode *call = parse_unary(P, 0);
        if (!call) return NULL;
        if (call->kind != N_CALL) return jerr(P->c, line, "expected a call after 'call'");
        n->a = call;
        static const char *ends[] = {"endcall"};
        int loops = P->loops;
        P->loops = 0;
        if (expect_block_end(P) || !(n->b = parse_body(P, ends, 1))) return NULL;
        P->loops = loops;
        adv(P);
    } else if (!strcmp(w, "filter")) {
        if (!(n = node(P, N_FILTERBLOCK, line)) || !(n->a = parse_block_filters(P, line, 1))) return NULL;
        static const char *ends[] = {"endfilter"};
        if (expect_block_end(P) || !(n->b = parse_body(P, ends, 1))) return NULL;
        adv(P);
    } else if (!strcmp(w, "with")) {
        if (!(n = node(P, N_WITH, line))) return NULL;
        nvec targets = {0}, vals = {0};
        while (cur(P)->type != JT_BLOCK_END) {
            if (targets.n && expect_op(P, ",")) return NULL;
            jnode *tg = parse_assign_target(P, 0), *v;
            if (!tg || expect_op(P, "=") || !(v = parse_expr(P))) return NULL;
            if (nvec_push(P, &targets, tg) || nvec_push(P, &vals, v)) return NULL;
        }
        n->kids = targets.v;
        n->nkids = targets.n;
        n->kwv = vals.v;
        n->nkw = vals.n;
        static const char *ends[] = {"endwith"};
        if (expect_block_end(P) || !(n->b = parse_body(P, ends, 1))) return NULL;
        adv(P);
    } else if (!strcmp(w, "generation")) {
        /* transformers' AssistantTracker: the body renders as is */
        static const char *ends[] = {"endgeneration"};
        if (expect_block_end(P) || !(n = parse_body(P, ends, 1))) return NULL;
        adv(P);
    } else if (!strcmp(w, "break") || !strcmp(w, "continue")) {
        if (!P->loops) return jerr(P->c, line, "'%s' outside loop", w);
        if (!(n = node(P, w[0] == 'b' ? N_BREAK : N_CONTINUE, line))) return NULL;
    } else {
        int is_end = !strncmp(w, "end", 3) || !strcmp(w, "else") || !strcmp(w, "elif");
        if (is_end && P->nexpect) {
            char want[160] = "";
            for (int k = 0; k < P->nexpect; k++) {
                size_t l = strlen(want);
                snprintf(want + l, sizeof want - l, "%s'%s'", k ? " or " : "", P->expect[k]);
            }
            return jerr(P->c, line, "unexpected '%s', expected %s (the innermost open block is '%s')", w, want, P->open);
        }
        if (is_end) return jerr(P->c, line, "unexpected '%s': no block is open", w);
        return jerr(P->c, line, "unknown tag '%s'", w);
    }
    if (!n || expect_block_end(P)) return NULL;
    return n;
}

/* Statements until one of ends (left as the current token after its "{%"), or EOF
 * when nends == 0. */
static jnode *parse_body(parser *P, const char **ends, int nends) {
    int line = cur(P)->line;
    if (enter(P)) return NULL;
    const char *saved_expect[8];
    int saved_n = P->nexpect;
    const char *saved_open = P->open;
    memcpy(saved_expect, P->expect, sizeof saved_expect);
    if (nends) {
        for (int k = 0; k < nends && k < 8; k++) P->expect[k] = ends[k];
        P->nexpect = nends;
        P->open = ends[0];
        for (int k = 0; k < nends; k++)
            if (!strncmp(ends[k], "end", 3)) P->open = ends[k] + 3;
    }
    nvec stmts = {0};
    for (;;) {
        jtok *t = cur(P);
        if (t->type == JT_EOF) {
            if (!nends) break;
            char want[160] = "";
            for (int k = 0; k < nends; k++) {
                size_t l = strlen(want);
                snprintf(want + l, sizeof want - l, "%s'%s'", k ? " or " : "", ends[k]);
            }
            return jerr(P->c, t->line, "unexpected end of template, expected %s (the block '%s' is not closed)", want, P->open);
        }
        if (t->type == JT_DATA) {
            jnode *d = node(P, N_TEXT, t->line);
            if (!d) return NULL;
            d->str = t->p;
            d->slen = t->n;
            if (nvec_push(P, &stmts, d)) return NULL;
            adv(P);
        } else if (t->type == JT_VAR_BEGIN) {
            adv(P);
            jnode *o = node(P, N_OUTPUT, t->line);
            if (!o || !(o->a = parse_tuple(P, 0, 1))) return NULL;
            if (cur(P)->type != JT_VAR_END) return fail_unexpected(P, "end of print statement");
            adv(P);
            if (nvec_push(P, &stmts, o)) return NULL;
        } else if (t->type == JT_BLOCK_BEGIN) {
            jtok *nt = peek(P, 1);
            int is_end = 0;
            for (int k = 0; k < nends; k++)
                if (tok_is(nt, JT_NAME, ends[k])) is_end = 1;
            if (is_end) { adv(P); break; }
            adv(P);
            jnode *s = parse_statement(P);
            if (!s || nvec_push(P, &stmts, s)) return NULL;
        } else {
            return fail_unexpected(P, "template data or a tag");
        }
    }
    memcpy(P->expect, saved_expect, sizeof saved_expect);
    P->nexpect = saved_n;
    P->open = saved_open;
    jnode *b = node(P, N_BODY, line);
    if (!b) return NULL;
    b->kids = stmts.v;
    b->nkids = stmts.n;
    P->depth--;
    return b;
}

jnode *jinja_parse(jctx *c, jtok *toks, int ntoks) {
    parser P = {.c = c, .t = toks, .nt = ntoks};
    return parse_body(&P, NULL, 0);
}
