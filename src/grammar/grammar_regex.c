/* Regex (the ECMAScript syntax JSON Schema's "pattern" uses) -> byte-level grammar.
 * Supported: literals, escapes (\d \w \s \D \W \S \n \r \t \v \f \0 \xHH \uHHHH
 * \u{H..} \cX, escaped punctuation), classes [...] [^...] with ranges and escapes, ".",
 * groups (...) (?:...) (?<name>...), alternation, quantifiers * + ? {n} {n,} {n,m} and
 * their lazy forms (same language), ^ and $ at the ends of top-level alternatives.
 * Rejected with a message naming them: lookaround, backreferences, \b \B, anchors
 * elsewhere. A regex describes a language, so greedy and lazy are the same here. */
#include "grammar/grammar.h"
#include "base/status.h"

#include <stdlib.h>
#include <string.h>

enum { MAX_REPEAT = 10000 };

struct rx {
    gir *g;
    const char *s;
    size_t n, i;
    int mode;
    gerbil_status err;
};

typedef struct ranges {
    uint32_t *lo, *hi;
    int n, cap;
} ranges;

static void rg_add(struct rx *p, ranges *r, uint32_t lo, uint32_t hi) {
    if (r->n == r->cap) {
        int c = r->cap ? r->cap * 2 : 8;
        uint32_t *a = realloc(r->lo, (size_t)c * sizeof *a), *b;
        if (!a) { p->g->oom = 1; return; }
        r->lo = a;
        b = realloc(r->hi, (size_t)c * sizeof *b);
        if (!b) { p->g->oom = 1; return; }
        r->hi = b;
        r->cap = c;
    }
    r->lo[r->n] = lo;
    r->hi[r->n] = hi;
    r->n++;
}

static void rg_free(ranges *r) {
    free(r->lo);
    free(r->hi);
    memset(r, 0, sizeof *r);
}

static int cmp_u32pair(const void *a, const void *b) {
    const uint32_t *x = a, *y = b;
    return (x[0] > y[0]) - (x[0] < y[0]);
}

/* sorted, merged; complemented when negate */
static void rg_normalize(struct rx *p, ranges *r, int negate) {
    uint32_t (*v)[2] = malloc(((size_t)r->n + 1) * sizeof *v);
    if (!v) { p->g->oom = 1; return; }
    for (int i = 0; i < r->n; i++) { v[i][0] = r->lo[i]; v[i][1] = r->hi[i]; }
    qsort(v, (size_t)r->n, sizeof *v, cmp_u32pair);
    int k = 0;
    for (int i = 0; i < r->n; i++) {
        if (k && v[i][0] <= v[k - 1][1] + 1) { if (v[i][1] > v[k - 1][1]) v[k - 1][1] = v[i][1]; }
        else { v[k][0] = v[i][0]; v[k][1] = v[i][1]; k++; }
    }
    r->n = 0;
    if (!negate) {
        for (int i = 0; i < k; i++) rg_add(p, r, v[i][0], v[i][1]);
    } else {
        uint32_t next = 0;
        for (int i = 0; i < k; i++) {
            if (v[i][0] > next) rg_add(p, r, next, v[i][0] - 1);
            next = v[i][1] + 1;
        }
        if (next <= 0x10FFFF) rg_add(p, r, next, 0x10FFFF);
    }
    free(v);
}

static int rg_has(const ranges *r, uint32_t c) {
    for (int i = 0; i < r->n; i++)
        if (c >= r->lo[i] && c <= r->hi[i]) return 1;
    return 0;
}

/* A rule for one character of the (normalized) set. In JSON-string mode the characters
 * that must be escaped inside a JSON string come as their escapes. */
static int emit_class(struct rx *p, ranges *r) {
    gir *g = p->g;
    if (p->mode != GRX_JSON_STRING) return gir_char_class(g, r->lo, r->hi, r->n, 0);
    ranges plain = {0};
    for (int i = 0; i < r->n; i++) {
        uint32_t a = r->lo[i], b = r->hi[i];
        /* remove 0x00-0x1F, '"', '\\' */
        uint32_t cuts[][2] = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}};
        uint32_t segs[8][2];
        int ns = 1;
        segs[0][0] = a;
        segs[0][1] = b;
        for (int c = 0; c < 3; c++) {
            int m = 0;
            uint32_t out[8][2];
            for (int s = 0; s < ns; s++) {
                uint32_t x = segs[s][0], y = segs[s][1];
                if (y < cuts[c][0] || x > cuts[c][1]) { out[m][0] = x; out[m][1] = y; m++; continue; }
                if (x < cuts[c][0]) { out[m][0] = x; out[m][1] = cuts[c][0] - 1; m++; }
                if (y > cuts[c][1]) { out[m][0] = cuts[c][1] + 1; out[m][1] = y; m++; }
            }
            memcpy(segs, out, sizeof out);
            ns = m;
        }
        for (int s = 0; s < ns; s++) rg_add(p, &plain, segs[s][0], segs[s][1]);
    }
    int cls = gir_char_class(g, plain.lo, plain.hi, plain.n, 0);
    rg_free(&plain);
    static const struct { uint32_t c; const char *esc; } escs[] = {
        {'"', "\\\""}, {'\\', "\\\\"}, {'\n', "\\n"}, {'\r', "\\r"}, {'\t', "\\t"}, {'\b', "\\b"}, {'\f', "\\f"}};
    int any = 0;
    for (size_t k = 0; k < sizeof escs / sizeof escs[0]; k++) any |= rg_has(r, escs[k].c);
    if (!any) return cls;
    int rr = gir_rule(g, NULL);
    gseq s = {0};
    gseq_rule(&s, cls);
    gir_alt(g, rr, &s);
    for (size_t k = 0; k < sizeof escs / sizeof escs[0]; k++)
        if (rg_has(r, escs[k].c)) {
            gseq_lit(g, &s, escs[k].esc, 2);
            gir_alt(g, rr, &s);
        }
    gseq_free(&s);
    return rr;
}

static int fail(struct rx *p, gerbil_status st, const char *what) {
    if (p->err == GERBIL_OK)
        p->err = err_set(st, "regex: %s at offset %zu of /%.*s/", what, p->i, (int)(p->n > 200 ? 200 : p->n), p->s);
    return -1;
}

static int peek(struct rx *p) { return p->i < p->n ? (unsigned char)p->s[p->i] : -1; }

/* next code point of the pattern (UTF-8) */
static uint32_t next_cp(struct rx *p) {
    unsigned char c = (unsigned char)p->s[p->i];
    int len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (p->i + (size_t)len > p->n) { p->i = p->n; return 0xFFFD; }
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1Fu) : len == 3 ? (c & 0x0Fu) : (c & 0x07u);
    for (int k = 1; k < len; k++) cp = (cp << 6) | ((unsigned char)p->s[p->i + (size_t)k] & 0x3Fu);
    p->i += (size_t)len;
    return cp;
}

static int hexdig(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static void add_class_escape(struct rx *p, ranges *r, int c) {
    switch (c) {
    case 'd': rg_add(p, r, '0', '9'); break;
    case 'w': rg_add(p, r, '0', '9'); rg_add(p, r, 'A', 'Z'); rg_add(p, r, 'a', 'z'); rg_add(p, r, '_', '_'); break;
    case 's':
        rg_add(p, r, 9, 13); rg_add(p, r, ' ', ' '); rg_add(p, r, 0xA0, 0xA0); rg_add(p, r, 0x1680, 0x1680);
        rg_add(p, r, 0x2000, 0x200A); rg_add(p, r, 0x2028, 0x2029); rg_add(p, r, 0x202F, 0x202F);
        rg_add(p, r, 0x205F, 0x205F); rg_add(p, r, 0x3000, 0x3000); rg_add(p, r, 0xFEFF, 0xFEFF);
        break;
    }
}

/* After a backslash: a class escape (\d etc.: *cls set, ranges added) or one code point.
 * Returns the code point, or -1 on error, -2 for a class escape. */
static long parse_escape(struct rx *p, ranges *r, int in_class) {
    if (p->i >= p->n) return fail(p, GERBIL_ERR_FORMAT, "trailing backslash");
    int c = peek(p);
    p->i++;
    switch (c) {
    case 'd': case 'w': case 's':
        add_class_escape(p, r, c);
        return -2;
    case 'D': case 'W': case 'S': {
        ranges t = {0};
        add_class_escape(p, &t, c - 'A' + 'a');
        rg_normalize(p, &t, 1);
        for (int k = 0; k < t.n; k++) rg_add(p, r, t.lo[k], t.hi[k]);
        rg_free(&t);
        return -2;
    }
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case 'v': return '\v';
    case 'f': return '\f';
    case '0': return 0;
    case 'b':
        if (in_class) return '\b';
        return fail(p, GERBIL_ERR_UNSUPPORTED, "word boundary \\b is not supported");
    case 'B': return fail(p, GERBIL_ERR_UNSUPPORTED, "\\B is not supported");
    case 'c': {
        int x = peek(p);
        if (!((x >= 'a' && x <= 'z') || (x >= 'A' && x <= 'Z'))) return fail(p, GERBIL_ERR_FORMAT, "bad \\c escape");
        p->i++;
        return x % 32;
    }
    case 'x': {
        if (p->i + 2 > p->n || hexdig(p->s[p->i]) < 0 || hexdig(p->s[p->i + 1]) < 0)
            return fail(p, GERBIL_ERR_FORMAT, "bad \\x escape");
        long v = hexdig(p->s[p->i]) * 16 + hexdig(p->s[p->i + 1]);
        p->i += 2;
        return v;
    }
    case 'u': {
        long v = 0;
        if (peek(p) == '{') {
            p->i++;
            int k = 0;
            while (p->i < p->n && hexdig(p->s[p->i]) >= 0 && k < 7) { v = v * 16 + hexdig(p->s[p->i]); p->i++; k++; }
            if (peek(p) != '}' || k == 0 || v > 0x10FFFF) return fail(p, GERBIL_ERR_FORMAT, "bad \\u{...} escape");
            p->i++;
            return v;
        }
        if (p->i + 4 > p->n) return fail(p, GERBIL_ERR_FORMAT, "bad \\u escape");
        for (int k = 0; k < 4; k++) {
            int h = hexdig(p->s[p->i + (size_t)k]);
            if (h < 0) return fail(p, GERBIL_ERR_FORMAT, "bad \\u escape");
            v = v * 16 + h;
        }
        p->i += 4;
        /* a surrogate pair \uD83D\uDE00 */
        if (v >= 0xD800 && v <= 0xDBFF && p->i + 6 <= p->n && p->s[p->i] == '\\' && p->s[p->i + 1] == 'u') {
            long lo = 0;
            int ok = 1;
            for (int k = 0; k < 4; k++) {
                int h = hexdig(p->s[p->i + 2 + (size_t)k]);
                if (h < 0) { ok = 0; break; }
                lo = lo * 16 + h;
            }
            if (ok && lo >= 0xDC00 && lo <= 0xDFFF) {
                p->i += 6;
                return 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
            }
        }
        return v;
    }
    case 'p': case 'P': return fail(p, GERBIL_ERR_UNSUPPORTED, "Unicode property escapes \\p{...} are not supported");
    case 'k': return fail(p, GERBIL_ERR_UNSUPPORTED, "backreferences are not supported");
    default:
        if (c >= '1' && c <= '9') return fail(p, GERBIL_ERR_UNSUPPORTED, "backreferences are not supported");
        if (c >= 0x80) { p->i--; return (long)next_cp(p); }
        return c; /* identity escape */
    }
}

static int parse_alt(struct rx *p, int depth);

/* An element of a sequence: returns a rule id, or -1 on error. */
static int parse_class(struct rx *p) {
    p->i++; /* [ */
    int neg = 0;
    if (peek(p) == '^') { neg = 1; p->i++; }
    ranges r = {0};
    int first = 1;
    for (;;) {
        if (p->i >= p->n) { rg_free(&r); return fail(p, GERBIL_ERR_FORMAT, "unterminated character class"); }
        int c = peek(p);
        if (c == ']' && !first) { p->i++; break; }
        first = 0;
        long lo;
        if (c == '\\') {
            p->i++;
            lo = parse_escape(p, &r, 1);
            if (lo == -1) { rg_free(&r); return -1; }
            if (lo == -2) continue;
        } else {
            lo = (long)next_cp(p);
        }
        if (peek(p) == '-' && p->i + 1 < p->n && p->s[p->i + 1] != ']') {
            p->i++;
            long hi;
            if (peek(p) == '\\') {
                p->i++;
                hi = parse_escape(p, &r, 1);
                if (hi == -1) { rg_free(&r); return -1; }
                if (hi == -2) { rg_add(p, &r, (uint32_t)lo, (uint32_t)lo); rg_add(p, &r, '-', '-'); continue; }
            } else {
                hi = (long)next_cp(p);
            }
            if (hi < lo) { rg_free(&r); return fail(p, GERBIL_ERR_FORMAT, "character class range out of order"); }
            rg_add(p, &r, (uint32_t)lo, (uint32_t)hi);
        } else {
            rg_add(p, &r, (uint32_t)lo, (uint32_t)lo);
        }
    }
    rg_normalize(p, &r, neg);
    int rule = emit_class(p, &r);
    rg_free(&r);
    return rule;
}

static int single_char(struct rx *p, uint32_t cp) {
    ranges r = {0};
    rg_add(p, &r, cp, cp);
    int rule = emit_class(p, &r);
    rg_free(&r);
    return rule;
}

static int parse_atom(struct rx *p, int depth) {
    int c = peek(p);
    if (c == '(') {
        p->i++;
        if (peek(p) == '?') {
            p->i++;
            int k = peek(p);
            if (k == ':') p->i++;
            else if (k == '<' && p->i + 1 < p->n && p->s[p->i + 1] != '=' && p->s[p->i + 1] != '!') {
                while (p->i < p->n && p->s[p->i] != '>') p->i++;
                if (p->i >= p->n) return fail(p, GERBIL_ERR_FORMAT, "unterminated group name");
                p->i++;
            } else if (k == '=' || k == '!' || k == '<') {
                return fail(p, GERBIL_ERR_UNSUPPORTED, "lookaround assertions are not supported");
            } else {
                return fail(p, GERBIL_ERR_UNSUPPORTED, "unknown group modifier");
            }
        }
        int r = parse_alt(p, depth + 1);
        if (r < 0) return -1;
        if (peek(p) != ')') return fail(p, GERBIL_ERR_FORMAT, "missing )");
        p->i++;
        return r;
    }
    if (c == '[') return parse_class(p);
    if (c == '.') {
        p->i++;
        ranges r = {0};
        rg_add(p, &r, '\n', '\n'); rg_add(p, &r, '\r', '\r'); rg_add(p, &r, 0x2028, 0x2029);
        rg_normalize(p, &r, 1);
        int rule = emit_class(p, &r);
        rg_free(&r);
        return rule;
    }
    if (c == '\\') {
        p->i++;
        ranges r = {0};
        long cp = parse_escape(p, &r, 0);
        if (cp == -1) { rg_free(&r); return -1; }
        int rule;
        if (cp == -2) { rg_normalize(p, &r, 0); rule = emit_class(p, &r); }
        else rule = single_char(p, (uint32_t)cp);
        rg_free(&r);
        return rule;
    }
    if (c == '^' || c == '$') return fail(p, GERBIL_ERR_UNSUPPORTED, "anchors inside the pattern (only at the ends) are not supported");
    if (c == '*' || c == '+' || c == '?') return fail(p, GERBIL_ERR_FORMAT, "nothing to repeat");
    if (c == '{') {
        /* a literal brace unless it reads as a quantifier (Annex B) */
        p->i++;
        return single_char(p, '{');
    }
    return single_char(p, next_cp(p));
}

static int parse_int(struct rx *p, long *v) {
    size_t st = p->i;
    long x = 0;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        x = x * 10 + (p->s[p->i] - '0');
        if (x > 100000000) x = 100000000;
        p->i++;
    }
    *v = x;
    return p->i > st;
}

/* a quantifier at p->i: 1 parsed (min, max; max -1 unbounded), 0 none */
static int parse_quant(struct rx *p, long *mn, long *mx) {
    int c = peek(p);
    if (c == '*') { p->i++; *mn = 0; *mx = -1; }
    else if (c == '+') { p->i++; *mn = 1; *mx = -1; }
    else if (c == '?') { p->i++; *mn = 0; *mx = 1; }
    else if (c == '{') {
        size_t save = p->i;
        p->i++;
        long a, b;
        if (!parse_int(p, &a)) { p->i = save; return 0; }
        if (peek(p) == '}') { p->i++; *mn = *mx = a; }
        else if (peek(p) == ',') {
            p->i++;
            if (peek(p) == '}') { p->i++; *mn = a; *mx = -1; }
            else if (parse_int(p, &b) && peek(p) == '}') { p->i++; *mn = a; *mx = b; }
            else { p->i = save; return 0; }
        } else { p->i = save; return 0; }
    } else return 0;
    if (peek(p) == '?') p->i++; /* lazy: same language */
    return 1;
}

/* A sequence up to | or ) or the end: a rule of one alternative. */
static int parse_seq(struct rx *p, int depth, gseq *s) {
    while (p->i < p->n && peek(p) != '|' && peek(p) != ')') {
        /* a '{' that is a quantifier after nothing is an error; a literal one is fine */
        int atom = parse_atom(p, depth);
        if (atom < 0) return -1;
        long mn, mx;
        while (parse_quant(p, &mn, &mx)) {
            if (mx >= 0 && mx < mn) return fail(p, GERBIL_ERR_FORMAT, "quantifier {n,m} with m < n");
            if (mn > MAX_REPEAT || mx > MAX_REPEAT) return fail(p, GERBIL_ERR_UNSUPPORTED, "repetition count above 10000");
            atom = gir_repeat(p->g, atom, (int)mn, (int)mx);
        }
        gseq_rule(s, atom);
    }
    return 0;
}

static int parse_alt(struct rx *p, int depth) {
    if (depth > 200) return fail(p, GERBIL_ERR_UNSUPPORTED, "groups nested deeper than 200");
    int r = gir_rule(p->g, NULL);
    gseq s = {0};
    for (;;) {
        if (parse_seq(p, depth, &s) < 0) { gseq_free(&s); return -1; }
        gir_alt(p->g, r, &s);
        if (peek(p) != '|') break;
        p->i++;
    }
    gseq_free(&s);
    p->g->rules[r].defined = 1;
    return r;
}

/* The string body any JSON string may hold (for unanchored patterns in JSON mode). */
static int any_star(struct rx *p) {
    ranges r = {0};
    if (p->mode == GRX_JSON_STRING) {
        rg_add(p, &r, 0, 0x10FFFF);
    } else {
        rg_add(p, &r, 0, 0x10FFFF);
    }
    rg_normalize(p, &r, 0);
    int c = emit_class(p, &r);
    rg_free(&r);
    return gir_repeat(p->g, c, 0, -1);
}

gerbil_status gir_from_regex(gir *g, const char *re, size_t len, int mode, int search, int *out) {
    struct rx p = {.g = g, .s = re, .n = len, .mode = mode, .err = GERBIL_OK};
    /* top-level alternatives, each with its own anchors */
    int top = gir_rule(g, NULL);
    gseq s = {0};
    for (;;) {
        int anch_start = 0, anch_end = 0;
        if (peek(&p) == '^') { p.i++; anch_start = 1; }
        /* find this alternative's end at depth 0 to see a trailing $ */
        size_t j = p.i;
        int d = 0, in_cls = 0;
        while (j < p.n) {
            char c = re[j];
            if (c == '\\') { j += 2; continue; }
            if (in_cls) { if (c == ']') in_cls = 0; j++; continue; }
            if (c == '[') { in_cls = 1; j++; continue; }
            if (c == '(') d++;
            else if (c == ')') { if (d == 0) break; d--; }
            else if (c == '|' && d == 0) break;
            j++;
        }
        if (j > p.n) j = p.n;
        size_t end = j;
        if (end > p.i && re[end - 1] == '$') {
            /* not escaped: count the backslashes before it */
            size_t b = 0;
            while (end - 1 - b > p.i && re[end - 2 - b] == '\\') b++;
            if (b % 2 == 0) { anch_end = 1; end--; }
        }
        size_t save_n = p.n;
        p.n = end;
        if (search && !anch_start) gseq_rule(&s, any_star(&p));
        if (parse_seq(&p, 0, &s) < 0) { gseq_free(&s); return p.err; }
        if (p.i < p.n) { gseq_free(&s); p.n = save_n; fail(&p, GERBIL_ERR_FORMAT, "unbalanced )"); return p.err; }
        p.n = save_n;
        if (anch_end) p.i++;
        if (search && !anch_end) gseq_rule(&s, any_star(&p));
        gir_alt(g, top, &s);
        if (p.i < p.n && re[p.i] == '|') { p.i++; continue; }
        if (p.i < p.n) { gseq_free(&s); fail(&p, GERBIL_ERR_FORMAT, "unbalanced )"); return p.err; }
        break;
    }
    gseq_free(&s);
    if (p.err != GERBIL_OK) return p.err;
    if (g->oom) return err_set(GERBIL_ERR_NOMEM, "regex: out of memory");
    *out = top;
    return GERBIL_OK;
}
