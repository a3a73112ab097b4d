/* llama.cpp's GBNF -> byte-level grammar. Syntax (llama.cpp grammars/README.md):
 *   name ::= alternatives       rules end at a newline outside parentheses
 *   "literal"  [class] [^class]  .  name  ( group )  a | b
 *   x*  x+  x?  x{m}  x{m,}  x{m,n}     # comments
 * Escapes in literals and classes: \n \r \t \\ \" \[ \] \- \xHH \uHHHH \UHHHHHHHH.
 * The start rule is "root". */
#include "grammar/grammar.h"
#include "base/status.h"

#include <stdlib.h>
#include <string.h>

struct gp {
    gir *g;
    const char *s;
    size_t n, i;
    gerbil_status err;
};

static int gfail(struct gp *p, const char *what) {
    if (p->err == GERBIL_OK) {
        int line = 1, col = 1;
        for (size_t k = 0; k < p->i && k < p->n; k++) {
            if (p->s[k] == '\n') { line++; col = 1; } else col++;
        }
        p->err = err_set(GERBIL_ERR_FORMAT, "GBNF: %s at line %d, column %d", what, line, col);
    }
    return -1;
}

static int is_word(int c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_'; }
static int pk(struct gp *p) { return p->i < p->n ? (unsigned char)p->s[p->i] : -1; }

/* skip spaces and comments; newlines only when nl_ok */
static void space(struct gp *p, int nl_ok) {
    while (p->i < p->n) {
        char c = p->s[p->i];
        if (c == ' ' || c == '\t') p->i++;
        else if (c == '#') { while (p->i < p->n && p->s[p->i] != '\n') p->i++; }
        else if (nl_ok && (c == '\n' || c == '\r')) p->i++;
        else break;
    }
}

static int hx(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* one (possibly escaped) code point of a literal or class; -1 on error */
static long gchar(struct gp *p) {
    if (p->i >= p->n) return gfail(p, "unexpected end of input");
    unsigned char c = (unsigned char)p->s[p->i];
    if (c == '\\') {
        p->i++;
        if (p->i >= p->n) return gfail(p, "trailing backslash");
        char e = p->s[p->i++];
        int digits = 0;
        switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case '\\': case '"': case '[': case ']': case '-': case '/': return e;
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        default: p->i--; return gfail(p, "unknown escape");
        }
        long v = 0;
        for (int k = 0; k < digits; k++) {
            int h = p->i < p->n ? hx(p->s[p->i]) : -1;
            if (h < 0) return gfail(p, "bad hex escape");
            v = v * 16 + h;
            p->i++;
        }
        return v;
    }
    int len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (p->i + (size_t)len > p->n) return gfail(p, "truncated UTF-8");
    long cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k < len; k++) cp = (cp << 6) | ((unsigned char)p->s[p->i + (size_t)k] & 0x3F);
    p->i += (size_t)len;
    return cp;
}

static int rule_ref(struct gp *p, const char *name, size_t n) {
    char buf[256];
    if (n >= sizeof buf) return gfail(p, "rule name too long");
    memcpy(buf, name, n);
    buf[n] = 0;
    int r = gir_find(p->g, buf);
    return r >= 0 ? r : gir_rule(p->g, buf);
}

static int g_alts(struct gp *p, int r, int nested);

static void put_cp(gir *g, gseq *s, long cp) {
    char b[4];
    int n;
    if (cp < 0x80) { b[0] = (char)cp; n = 1; }
    else if (cp < 0x800) { b[0] = (char)(0xC0 | (cp >> 6)); b[1] = (char)(0x80 | (cp & 63)); n = 2; }
    else if (cp < 0x10000) { b[0] = (char)(0xE0 | (cp >> 12)); b[1] = (char)(0x80 | ((cp >> 6) & 63)); b[2] = (char)(0x80 | (cp & 63)); n = 3; }
    else { b[0] = (char)(0xF0 | (cp >> 18)); b[1] = (char)(0x80 | ((cp >> 12) & 63)); b[2] = (char)(0x80 | ((cp >> 6) & 63)); b[3] = (char)(0x80 | (cp & 63)); n = 4; }
    gseq_lit(g, s, b, (size_t)n);
}

/* one element -> a rule id (or -1) */
static int g_atom(struct gp *p) {
    int c = pk(p);
    gir *g = p->g;
    if (c == '"') {
        p->i++;
        int r = gir_rule(g, NULL);
        gseq s = {0};
        while (p->i < p->n && p->s[p->i] != '"') {
            long cp = gchar(p);
            if (cp < 0) { gseq_free(&s); return -1; }
            put_cp(g, &s, cp);
        }
        if (pk(p) != '"') { gseq_free(&s); return gfail(p, "unterminated string literal"); }
        p->i++;
        gir_alt(g, r, &s);
        gseq_free(&s);
        return r;
    }
    if (c == '[') {
        p->i++;
        int neg = 0;
        if (pk(p) == '^') { neg = 1; p->i++; }
        uint32_t lo[512], hi[512];
        int n = 0;
        while (p->i < p->n && p->s[p->i] != ']') {
            long a = gchar(p);
            if (a < 0) return -1;
            long b = a;
            if (pk(p) == '-' && p->i + 1 < p->n && p->s[p->i + 1] != ']') {
                p->i++;
                b = gchar(p);
                if (b < 0) return -1;
                if (b < a) return gfail(p, "class range out of order");
            }
            if (n == 512) return gfail(p, "character class with more than 512 ranges");
            lo[n] = (uint32_t)a;
            hi[n] = (uint32_t)b;
            n++;
        }
        if (pk(p) != ']') return gfail(p, "unterminated character class");
        p->i++;
        return gir_char_class(g, lo, hi, n, neg);
    }
    if (c == '.') {
        p->i++;
        uint32_t lo = 0, hi = 0x10FFFF;
        return gir_char_class(g, &lo, &hi, 1, 0);
    }
    if (c == '(') {
        p->i++;
        space(p, 1);
        int r = gir_rule(g, NULL);
        if (g_alts(p, r, 1) < 0) return -1;
        space(p, 1);
        if (pk(p) != ')') return gfail(p, "expected )");
        p->i++;
        return r;
    }
    if (c >= 0 && is_word(c)) {
        size_t st = p->i;
        while (p->i < p->n && is_word((unsigned char)p->s[p->i])) p->i++;
        return rule_ref(p, p->s + st, p->i - st);
    }
    if (c == '<' || c == '!') return gfail(p, "token references are not supported");
    return gfail(p, "expected a literal, class, rule name or group");
}

static int g_num(struct gp *p, long *v) {
    size_t st = p->i;
    long x = 0;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        x = x * 10 + (p->s[p->i] - '0');
        if (x > 1000000) x = 1000000;
        p->i++;
    }
    *v = x;
    return p->i > st;
}

static int g_seq(struct gp *p, gseq *s, int nested) {
    for (;;) {
        space(p, nested);
        int c = pk(p);
        if (c < 0 || c == '|' || c == ')' || c == '\n' || c == '\r') return 0;
        int a = g_atom(p);
        if (a < 0) return -1;
        for (;;) {
            int q = pk(p);
            long mn, mx;
            if (q == '*') { mn = 0; mx = -1; p->i++; }
            else if (q == '+') { mn = 1; mx = -1; p->i++; }
            else if (q == '?') { mn = 0; mx = 1; p->i++; }
            else if (q == '{') {
                p->i++;
                space(p, 0);
                if (!g_num(p, &mn)) return gfail(p, "expected a number in {}");
                space(p, 0);
                if (pk(p) == '}') mx = mn;
                else if (pk(p) == ',') {
                    p->i++;
                    space(p, 0);
                    if (pk(p) == '}') mx = -1;
                    else if (!g_num(p, &mx)) return gfail(p, "expected a number in {}");
                    space(p, 0);
                } else return gfail(p, "expected } or ,");
                if (pk(p) != '}') return gfail(p, "expected }");
                p->i++;
                if (mx >= 0 && mx < mn) return gfail(p, "repetition {m,n} with n < m");
                if (mn > 10000 || mx > 10000) return gfail(p, "repetition count above 10000");
            } else break;
            a = gir_repeat(p->g, a, (int)mn, (int)mx);
        }
        gseq_rule(s, a);
    }
}

static int g_alts(struct gp *p, int r, int nested) {
    gseq s = {0};
    for (;;) {
        if (g_seq(p, &s, nested) < 0) { gseq_free(&s); return -1; }
        gir_alt(p->g, r, &s);
        space(p, nested);
        if (!nested) {
            /* lenient: an alternative may continue on the next line when it starts with | */
            size_t save = p->i;
            space(p, 1);
            if (pk(p) != '|') { p->i = save; break; }
        }
        if (pk(p) != '|') break;
        p->i++;
        space(p, 1);
    }
    gseq_free(&s);
    return 0;
}

gerbil_status gir_from_gbnf(gir *g, const char *src, size_t len) {
    struct gp p = {.g = g, .s = src, .n = len, .err = GERBIL_OK};
    for (;;) {
        space(&p, 1);
        if (p.i >= p.n) break;
        size_t st = p.i;
        while (p.i < p.n && is_word((unsigned char)p.s[p.i])) p.i++;
        if (p.i == st) { gfail(&p, "expected a rule name"); return p.err; }
        int r = rule_ref(&p, src + st, p.i - st);
        if (r < 0) return p.err;
        if (g->rules[r].defined) { gfail(&p, "rule defined twice"); return p.err; }
        space(&p, 0);
        if (p.i + 3 > p.n || memcmp(p.s + p.i, "::=", 3)) { gfail(&p, "expected ::="); return p.err; }
        p.i += 3;
        space(&p, 1);
        if (g_alts(&p, r, 0) < 0) return p.err;
        g->rules[r].defined = 1;
        int c = pk(&p);
        if (c >= 0 && c != '\n' && c != '\r') { gfail(&p, "unexpected character"); return p.err; }
    }
    if (g->oom) return err_set(GERBIL_ERR_NOMEM, "GBNF: out of memory");
    g->root = gir_find(g, "root");
    if (g->root < 0) return err_set(GERBIL_ERR_FORMAT, "GBNF: no \"root\" rule");
    for (int i = 0; i < g->n_rules; i++)
        if (!g->rules[i].defined && g->rules[i].name)
            return err_set(GERBIL_ERR_FORMAT, "GBNF: rule \"%s\" is used but never defined", g->rules[i].name);
    return GERBIL_OK;
}
