/* Jinja lexer: template text -> tokens, with whitespace control applied as Jinja2's
 * lexer applies it (trim_blocks and lstrip_blocks on, keep_trailing_newline off):
 *  - "{%-", "{{-", "{#-" strip all whitespace before the tag; "-%}", "-}}", "-#}" all
 *    whitespace after it;
 *  - trim_blocks: the first newline after "%}" or "#}" goes ("+%}" keeps it);
 *  - lstrip_blocks: spaces and tabs between a line start and "{%" or "{#" go ("{%+"
 *    keeps them); not before "{{". A line start is just after a newline, at the start
 *    of the template, or just after a tag whose match ended in a newline. */
#include "text/jinja.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    jctx *c;
    const char *s; /* normalized source */
    size_t n, i;
    jtok *t;
    int nt, cap;
    int paren;     /* open ( [ { inside a tag: end markers are operators there */
    char stack[256];
} lexer;

static int line_at(lexer *L, size_t pos) {
    int line = 1;
    for (size_t k = 0; k < pos && k < L->n; k++) line += L->s[k] == '\n';
    return line;
}

static jtok *push(lexer *L, jtok_type type, size_t pos, const char *p, size_t n) {
    if (L->nt == L->cap) {
        int cap = L->cap ? L->cap * 2 : 256;
        jtok *nt = ja_alloc(&L->c->arena, (size_t)cap * sizeof *nt);
        if (!nt) return jerr(L->c, 0, "template too large");
        if (L->nt) memcpy(nt, L->t, (size_t)L->nt * sizeof *nt);
        L->t = nt;
        L->cap = cap;
    }
    jtok *t = &L->t[L->nt++];
    t->type = type;
    t->line = (int)pos; /* a position for now; lines are filled in at the end */
    t->p = p;
    t->n = n;
    t->val = NULL;
    return t;
}

static int is_ws(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\v' || ch == '\f'; }

/* Python \s over UTF-8 at s[i]: the byte length of a whitespace character, or 0. */
static size_t ws_len(const char *s, size_t n, size_t i) {
    if (is_ws(s[i])) return 1;
    if ((unsigned char)s[i] < 0x80) return ju_isspace((unsigned char)s[i]) ? 1 : 0;
    size_t k = i;
    int cp = ju_decode(s, n, &k);
    return ju_isspace(cp) ? k - i : 0;
}

/* Length of text after stripping trailing Python whitespace. */
static size_t rstrip_len(const char *s, size_t n) {
    size_t end = n;
    while (end > 0) {
        size_t st = end - 1;
        while (st > 0 && ((unsigned char)s[st] & 0xC0) == 0x80) st--;
        if (ws_len(s, n, st) != end - st) break;
        end = st;
    }
    return end;
}

static size_t skip_ws(const char *s, size_t n, size_t i) {
    size_t k;
    while (i < n && (k = ws_len(s, n, i))) i += k;
    return i;
}

/* Emit the data before a tag, applying "-" or lstrip_blocks. */
static int emit_data(lexer *L, size_t st, size_t end, char sign, int lstrip_ok, int line_starting) {
    const char *text = L->s + st;
    size_t len = end - st;
    if (sign == '-') {
        len = rstrip_len(text, len);
    } else if (sign != '+' && lstrip_ok) {
        size_t lpos = 0;
        for (size_t k = len; k > 0; k--)
            if (text[k - 1] == '\n') { lpos = k; break; }
        if ((lpos > 0 || line_starting) && lpos < len && skip_ws(text, len, lpos) == len) len = lpos;
    }
    if (len && !push(L, JT_DATA, st, text, len)) return -1;
    return 0;
}

static jv *string_literal(lexer *L, const char *p, size_t n) {
    jsb b = {0};
    for (size_t i = 0; i < n; i++) {
        char ch = p[i];
        if (ch != '\\' || i + 1 >= n) {
            if (jsb_putc(L->c, &b, ch)) return NULL;
            continue;
        }
        char e = p[++i], buf[8];
        int cp = -1, digits = 0;
        switch (e) {
        case 'n': cp = '\n'; break;
        case 't': cp = '\t'; break;
        case 'r': cp = '\r'; break;
        case 'a': cp = 7; break;
        case 'b': cp = 8; break;
        case 'f': cp = 12; break;
        case 'v': cp = 11; break;
        case '\\': case '\'': case '"': cp = e; break;
        case '\n': continue; /* line continuation */
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        default:
            if (e >= '0' && e <= '7') {
                cp = e - '0';
                for (int k = 0; k < 2 && i + 1 < n && p[i + 1] >= '0' && p[i + 1] <= '7'; k++)
                    cp = cp * 8 + (p[++i] - '0');
            }
        }
        if (digits) {
            cp = 0;
            for (int k = 0; k < digits; k++) {
                char h = i + 1 < n ? p[i + 1] : 0;
                int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                      : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
                if (d < 0) return jerr(L->c, line_at(L, (size_t)(p - L->s)), "truncated \\%c escape in string", e);
                cp = cp * 16 + d;
                i++;
            }
            if (cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) cp = 0xFFFD;
        }
        if (cp < 0) { /* unknown escape: kept as written */
            if (jsb_putc(L->c, &b, '\\') || jsb_putc(L->c, &b, e)) return NULL;
            continue;
        }
        if (jsb_put(L->c, &b, buf, (size_t)ju_encode(cp, buf))) return NULL;
    }
    return jsb_to_str(L->c, &b);
}

static int is_name_start(unsigned char ch) { return ch == '_' || ((ch | 32) >= 'a' && (ch | 32) <= 'z') || ch >= 0x80; }
static int is_name_char(unsigned char ch) { return is_name_start(ch) || (ch >= '0' && ch <= '9'); }
static int is_digit(char ch) { return ch >= '0' && ch <= '9'; }

/* Digits with optional single underscores between them; returns the end. */
static size_t scan_digits(const char *s, size_t n, size_t i) {
    while (i < n && (is_digit(s[i]) || (s[i] == '_' && i + 1 < n && is_digit(s[i + 1]) && i > 0 && is_digit(s[i - 1]))))
        i++;
    return i;
}

static int lex_number(lexer *L) {
    const char *s = L->s;
    size_t st = L->i, i = scan_digits(s, L->n, st), end = i;
    int is_float = 0;
    if (i + 1 < L->n && s[i] == '.' && is_digit(s[i + 1]) && !(st > 0 && s[st - 1] == '.')) {
        end = scan_digits(s, L->n, i + 1);
        is_float = 1;
    }
    if (end < L->n && (s[end] | 32) == 'e' && !(st > 0 && s[st - 1] == '.')) {
        size_t k = end + 1;
        if (k < L->n && (s[k] == '+' || s[k] == '-')) k++;
        if (k < L->n && is_digit(s[k])) { end = scan_digits(s, L->n, k); is_float = 1; }
    }
    char buf[80];
    size_t m = 0;
    if (!is_float && s[st] == '0' && st + 1 < L->n && ((s[st + 1] | 32) == 'x' || (s[st + 1] | 32) == 'o' || (s[st + 1] | 32) == 'b')) {
        int base = (s[st + 1] | 32) == 'x' ? 16 : (s[st + 1] | 32) == 'o' ? 8 : 2;
        end = st + 2;
        while (end < L->n && (is_name_char((unsigned char)s[end]))) {
            if (s[end] != '_' && m < sizeof buf - 1) buf[m++] = s[end];
            end++;
        }
        buf[m] = 0;
        char *e;
        long long v = strtoll(buf, &e, base);
        if (!m || *e) return jerr(L->c, line_at(L, st), "invalid number literal"), -1;
        jtok *t = push(L, JT_INT, st, s + st, end - st);
        if (!t || !(t->val = jv_int(L->c, v))) return -1;
        L->i = end;
        return 0;
    }
    if (!is_float) end = i;
    for (size_t k = st; k < end && m < sizeof buf - 1; k++)
        if (s[k] != '_') buf[m++] = s[k];
    buf[m] = 0;
    jtok *t = push(L, is_float ? JT_FLOAT : JT_INT, st, s + st, end - st);
    if (!t) return -1;
    t->val = is_float ? jv_float(L->c, strtod(buf, NULL)) : jv_int(L->c, strtoll(buf, NULL, 10));
    if (!t->val) return -1;
    L->i = end;
    return 0;
}

/* Lex the inside of a {{ }} or {% %} tag up to and including its end marker.
 * Returns 0, or -1 on error. *line_starting: whether the end match ended in "\n". */
static int lex_tag(lexer *L, int is_block, int *line_starting) {
    static const char *ops2[] = {"//", "**", "==", "!=", ">=", "<=", NULL};
    const char *s = L->s;
    size_t start = L->i;
    L->paren = 0;
    for (;;) {
        size_t ws = skip_ws(s, L->n, L->i);
        if (ws > L->i) *line_starting = s[ws - 1] == '\n';
        L->i = ws;
        if (L->i >= L->n)
            return jerr(L->c, line_at(L, start), "unexpected end of template, expected '%s'", is_block ? "%}" : "}}"), -1;
        const char *e = is_block ? "%}" : "}}";
        if (!L->paren) {
            if (is_block && s[L->i] == '+' && L->i + 2 < L->n && !memcmp(s + L->i + 1, e, 2)) {
                if (!push(L, JT_BLOCK_END, L->i, s + L->i, 3)) return -1;
                L->i += 3;
                *line_starting = 0;
                return 0;
            }
            if (s[L->i] == '-' && L->i + 2 < L->n && !memcmp(s + L->i + 1, e, 2)) {
                if (!push(L, is_block ? JT_BLOCK_END : JT_VAR_END, L->i, s + L->i, 3)) return -1;
                size_t k = skip_ws(s, L->n, L->i + 3);
                *line_starting = k > L->i + 3 && s[k - 1] == '\n';
                L->i = k;
                return 0;
            }
            if (L->i + 1 < L->n && !memcmp(s + L->i, e, 2)) {
                if (!push(L, is_block ? JT_BLOCK_END : JT_VAR_END, L->i, s + L->i, 2)) return -1;
                L->i += 2;
                *line_starting = 0;
                if (is_block && L->i < L->n && s[L->i] == '\n') { L->i++; *line_starting = 1; }
                return 0;
            }
        }
        *line_starting = 0;
        unsigned char ch = (unsigned char)s[L->i];
        if (is_digit((char)ch)) {
            if (lex_number(L)) return -1;
            continue;
        }
        if (is_name_start(ch)) {
            size_t st = L->i;
            while (L->i < L->n && is_name_char((unsigned char)s[L->i])) L->i++;
            if (!push(L, JT_NAME, st, s + st, L->i - st)) return -1;
            continue;
        }
        if (ch == '\'' || ch == '"') {
            size_t st = L->i, k = st + 1;
            while (k < L->n && s[k] != (char)ch) k += s[k] == '\\' && k + 1 < L->n ? 2 : 1;
            if (k >= L->n) return jerr(L->c, line_at(L, st), "unterminated string literal"), -1;
            jtok *t = push(L, JT_STRING, st, s + st, k + 1 - st);
            if (!t || !(t->val = string_literal(L, s + st + 1, k - st - 1))) return -1;
            L->i = k + 1;
            continue;
        }
        size_t oplen = 0;
        for (int k = 0; ops2[k]; k++)
            if (L->i + 1 < L->n && !memcmp(s + L->i, ops2[k], 2)) oplen = 2;
        if (!oplen && strchr("+-/*%~[](){}><=.:|,;", (char)ch) && ch) oplen = 1;
        if (!oplen) return jerr(L->c, line_at(L, L->i), "unexpected character '%c'", ch >= 0x20 && ch < 0x7f ? ch : '?'), -1;
        if (oplen == 1 && strchr("([{", (char)ch)) {
            if (L->paren >= (int)sizeof L->stack) return jerr(L->c, line_at(L, L->i), "brackets nested too deeply"), -1;
            L->stack[L->paren++] = (char)ch;
        } else if (oplen == 1 && strchr(")]}", (char)ch)) {
            char want = ch == ')' ? '(' : ch == ']' ? '[' : '{';
            if (!L->paren || L->stack[L->paren - 1] != want)
                return jerr(L->c, line_at(L, L->i), "unexpected '%c'", ch), -1;
            L->paren--;
        }
        if (!push(L, JT_OP, L->i, s + L->i, oplen)) return -1;
        L->i += oplen;
    }
}

/* Find the end of a comment starting at L->i; applies "-#}" and trim_blocks. */
static int lex_comment(lexer *L, size_t start, int *line_starting) {
    const char *s = L->s;
    for (size_t k = L->i; k + 1 < L->n; k++) {
        if ((s[k] == '-' || s[k] == '+') && k + 2 < L->n && s[k + 1] == '#' && s[k + 2] == '}') {
            L->i = k + 3;
            *line_starting = 0;
            if (s[k] == '-') {
                size_t e = skip_ws(s, L->n, L->i);
                *line_starting = e > L->i && s[e - 1] == '\n';
                L->i = e;
            }
            return 0;
        }
        if (s[k] == '#' && s[k + 1] == '}') {
            L->i = k + 2;
            *line_starting = 0;
            if (L->i < L->n && s[L->i] == '\n') { L->i++; *line_starting = 1; }
            return 0;
        }
    }
    return jerr(L->c, line_at(L, start), "missing end of comment tag"), -1;
}

/* {% raw %}: at s[i] == '{' '%'; returns the index after "raw ... %}" or 0. */
static size_t match_raw(const char *s, size_t n, size_t i, const char *word) {
    size_t k = i + 2, wl = strlen(word);
    if (k < n && (s[k] == '-' || s[k] == '+')) k++;
    k = skip_ws(s, n, k);
    if (k + wl > n || memcmp(s + k, word, wl) || (k + wl < n && is_name_char((unsigned char)s[k + wl]))) return 0;
    k = skip_ws(s, n, k + wl);
    return k;
}

int jinja_lex(jctx *c, const char *src, jtok **toks, int *ntoks) {
    /* newlines normalized to "\n", one trailing newline dropped */
    size_t sn = strlen(src);
    char *s = ja_alloc(&c->arena, sn + 1);
    if (!s) return jerr(c, 0, "template too large"), -1;
    size_t n = 0;
    for (size_t k = 0; k < sn; k++) {
        if (src[k] == '\r') { s[n++] = '\n'; if (k + 1 < sn && src[k + 1] == '\n') k++; }
        else s[n++] = src[k];
    }
    if (n && s[n - 1] == '\n') n--;
    s[n] = 0;
    lexer L = {.c = c, .s = s, .n = n};
    int line_starting = 1;
    while (L.i < n) {
        /* the next tag start */
        size_t k = L.i;
        const char *tag = NULL;
        for (; k + 1 < n; k++) {
            if (s[k] == '{' && (s[k + 1] == '%' || s[k + 1] == '{' || s[k + 1] == '#')) { tag = s + k; break; }
        }
        if (!tag) {
            if (!push(&L, JT_DATA, L.i, s + L.i, n - L.i)) return -1;
            break;
        }
        char kind = tag[1];
        char sign = k + 2 < n && (s[k + 2] == '-' || s[k + 2] == '+') ? s[k + 2] : 0;
        size_t after = k + 2 + (sign ? 1 : 0);
        size_t raw = kind == '%' ? match_raw(s, n, k, "raw") : 0;
        if (raw) { /* {% raw %} ... {% endraw %} */
            size_t body;
            if (raw + 2 < n + 1 && s[raw] == '-' && raw + 2 < n && s[raw + 1] == '%' && s[raw + 2] == '}')
                body = skip_ws(s, n, raw + 3);
            else if (raw + 1 < n && s[raw] == '%' && s[raw + 1] == '}') body = raw + 2;
            else raw = 0;
            if (raw) {
                if (emit_data(&L, L.i, k, sign, 1, line_starting)) return -1;
                size_t e = body, endtag = 0, stop = 0;
                for (; e + 1 < n; e++) {
                    if (s[e] == '{' && s[e + 1] == '%' && (endtag = match_raw(s, n, e, "endraw"))) break;
                }
                if (!endtag) return jerr(c, line_at(&L, k), "missing end of raw directive"), -1;
                char esign = e + 2 < n && (s[e + 2] == '-' || s[e + 2] == '+') ? s[e + 2] : 0;
                if (endtag < n && s[endtag] == '+' && endtag + 2 < n && s[endtag + 1] == '%' && s[endtag + 2] == '}') {
                    stop = endtag + 3; line_starting = 0;
                } else if (endtag < n && s[endtag] == '-' && endtag + 2 < n && s[endtag + 1] == '%' && s[endtag + 2] == '}') {
                    stop = skip_ws(s, n, endtag + 3);
                    line_starting = stop > endtag + 3 && s[stop - 1] == '\n';
                } else if (endtag + 1 < n && s[endtag] == '%' && s[endtag + 1] == '}') {
                    stop = endtag + 2; line_starting = 0;
                    if (stop < n && s[stop] == '\n') { stop++; line_starting = 1; }
                } else return jerr(c, line_at(&L, e), "missing end of raw directive"), -1;
                L.i = body;
                if (emit_data(&L, body, e, esign, 1, 0)) return -1;
                L.i = stop;
                continue;
            }
        }
        if (emit_data(&L, L.i, k, sign, kind != '{', line_starting)) return -1;
        L.i = after;
        line_starting = 0;
        if (kind == '#') {
            if (lex_comment(&L, k, &line_starting)) return -1;
            continue;
        }
        if (!push(&L, kind == '%' ? JT_BLOCK_BEGIN : JT_VAR_BEGIN, k, tag, after - k)) return -1;
        if (lex_tag(&L, kind == '%', &line_starting)) return -1;
    }
    if (!push(&L, JT_EOF, n, s + n, 0)) return -1;
    /* positions -> line numbers in one pass */
    int line = 1;
    size_t pos = 0;
    for (int t = 0; t < L.nt; t++) {
        size_t target = (size_t)L.t[t].line;
        for (; pos < target && pos < n; pos++) line += s[pos] == '\n';
        L.t[t].line = line;
    }
    *toks = L.t;
    *ntoks = L.nt;
    return 0;
}
