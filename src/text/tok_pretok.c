/* Pre-tokenizers (tokenizers/src/pre_tokenizers): pieces -> smaller pieces. */
#include "text/tok_internal.h"
#include "io/json.h"

#include <stdlib.h>
#include <string.h>

/* GPT-2's byte -> printable character table: bytes that are printable map to
 * themselves, the other 68 to U+0100.. in byte order. */
const uint16_t tk_byte_to_cp[256] = {
    256, 257, 258, 259, 260, 261, 262, 263, 264, 265, 266, 267, 268, 269, 270, 271,
    272, 273, 274, 275, 276, 277, 278, 279, 280, 281, 282, 283, 284, 285, 286, 287,
    288, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47,
    48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63,
    64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79,
    80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95,
    96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111,
    112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126, 289,
    290, 291, 292, 293, 294, 295, 296, 297, 298, 299, 300, 301, 302, 303, 304, 305,
    306, 307, 308, 309, 310, 311, 312, 313, 314, 315, 316, 317, 318, 319, 320, 321,
    322, 161, 162, 163, 164, 165, 166, 167, 168, 169, 170, 171, 172, 323, 174, 175,
    176, 177, 178, 179, 180, 181, 182, 183, 184, 185, 186, 187, 188, 189, 190, 191,
    192, 193, 194, 195, 196, 197, 198, 199, 200, 201, 202, 203, 204, 205, 206, 207,
    208, 209, 210, 211, 212, 213, 214, 215, 216, 217, 218, 219, 220, 221, 222, 223,
    224, 225, 226, 227, 228, 229, 230, 231, 232, 233, 234, 235, 236, 237, 238, 239,
    240, 241, 242, 243, 244, 245, 246, 247, 248, 249, 250, 251, 252, 253, 254, 255,
};

int tk_cp_to_byte(uint32_t cp) {
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255)) return (int)cp;
    if (cp < 256 || cp >= 256 + 68) return -1;
    uint32_t k = cp - 256;
    return k <= 32 ? (int)k : k <= 66 ? (int)(127 + k - 33) : 173;
}

/* GPT-2's pattern, used by the ByteLevel pre-tokenizer with use_regex. */
static const char GPT2_RE[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

enum { P_SEQ, P_BYTELEVEL, P_SPLIT, P_METASPACE, P_WHITESPACE, P_WSSPLIT, P_BERT, P_DIGITS, P_PUNCT, P_CHARDELIM };
enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER };

struct tk_pretok {
    int type;
    tk_pretok **kids;
    int n_kids;
    int add_prefix_space, use_regex; /* ByteLevel */
    tk_regex re;                     /* Split, ByteLevel */
    int behavior, invert;            /* Split, Punctuation */
    uint32_t repl;                   /* Metaspace replacement, CharDelimiterSplit delimiter */
    int prepend_scheme, split;       /* Metaspace */
    int individual;                  /* Digits */
};

int tk_pretok_keeps_text(const tk_pretok *p) {
    if (!p) return 1;
    switch (p->type) {
    case P_SEQ:
        for (int i = 0; i < p->n_kids; i++)
            if (!tk_pretok_keeps_text(p->kids[i])) return 0;
        return 1;
    case P_BYTELEVEL: case P_METASPACE: case P_DIGITS: return 1;
    case P_SPLIT: case P_PUNCT: return p->behavior != TK_SPLIT_REMOVED;
    default: return 0; /* Whitespace, WhitespaceSplit, BertPreTokenizer, CharDelimiterSplit drop text */
    }
}

void tk_pretok_free(tk_pretok *p) {
    if (!p) return;
    for (int i = 0; i < p->n_kids; i++) tk_pretok_free(p->kids[i]);
    free(p->kids);
    tk_regex_free(&p->re);
    free(p);
}

static gerbil_status one_char(const cJSON *j, const char *key, uint32_t def, uint32_t *out, const char *path) {
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!c || cJSON_IsNull(c)) { *out = def; return GERBIL_OK; }
    const char *s = cJSON_IsString(c) ? c->valuestring : NULL;
    size_t n = s ? strlen(s) : 0, i = 0;
    if (!n || tk_utf8_valid_prefix(s, n) != n) return err_set(GERBIL_ERR_FORMAT, "%s: \"%s\" must be one character", path, key);
    *out = tk_utf8_next(s, &i);
    if (i != n) return err_set(GERBIL_ERR_FORMAT, "%s: \"%s\" must be one character", path, key);
    return GERBIL_OK;
}

gerbil_status tk_pretok_parse(const cJSON *j, const char *path, tk_pretok **out) {
    *out = NULL;
    if (!j || cJSON_IsNull(j)) return GERBIL_OK;
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (!cJSON_IsString(ty)) return err_set(GERBIL_ERR_FORMAT, "%s: pre_tokenizer without a \"type\"", path);
    const char *t = ty->valuestring;
    tk_pretok *p = calloc(1, sizeof *p);
    if (!p) return GERBIL_ERR_NOMEM;
    gerbil_status st = GERBIL_OK;
    if (!strcmp(t, "Sequence")) {
        p->type = P_SEQ;
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "pretokenizers");
        if (!cJSON_IsArray(list)) {
            st = err_set(GERBIL_ERR_FORMAT, "%s: Sequence pre_tokenizer without a \"pretokenizers\" list", path);
        } else {
            p->kids = calloc((size_t)cJSON_GetArraySize(list) + 1, sizeof *p->kids);
            if (!p->kids) st = GERBIL_ERR_NOMEM;
            const cJSON *it;
            cJSON_ArrayForEach(it, list) {
                if (st) break;
                st = tk_pretok_parse(it, path, &p->kids[p->n_kids]);
                if (p->kids[p->n_kids]) p->n_kids++;
            }
        }
    } else if (!strcmp(t, "ByteLevel")) {
        p->type = P_BYTELEVEL;
        p->add_prefix_space = json_get_bool(j, "add_prefix_space", 1);
        p->use_regex = json_get_bool(j, "use_regex", 1);
        if (p->use_regex) st = tk_regex_compile(&p->re, GPT2_RE, sizeof GPT2_RE - 1, 0, path);
    } else if (!strcmp(t, "Split")) {
        p->type = P_SPLIT;
        p->invert = json_get_bool(j, "invert", 0);
        st = tk_parse_behavior(cJSON_GetObjectItemCaseSensitive(j, "behavior"), &p->behavior, path);
        if (!st) st = tk_parse_pattern(cJSON_GetObjectItemCaseSensitive(j, "pattern"), &p->re, "Split pre_tokenizer", path);
    } else if (!strcmp(t, "Metaspace")) {
        p->type = P_METASPACE;
        st = one_char(j, "replacement", 0x2581, &p->repl, path);
        const char *ps = json_get_str(j, "prepend_scheme", "always");
        p->prepend_scheme = !strcmp(ps, "first") ? PREPEND_FIRST : !strcmp(ps, "never") ? PREPEND_NEVER : PREPEND_ALWAYS;
        const cJSON *aps = cJSON_GetObjectItemCaseSensitive(j, "add_prefix_space");
        if (cJSON_IsFalse(aps)) p->prepend_scheme = PREPEND_NEVER; /* legacy files */
        p->split = json_get_bool(j, "split", 1);
    } else if (!strcmp(t, "Whitespace")) p->type = P_WHITESPACE;
    else if (!strcmp(t, "WhitespaceSplit")) p->type = P_WSSPLIT;
    else if (!strcmp(t, "BertPreTokenizer")) p->type = P_BERT;
    else if (!strcmp(t, "Digits")) {
        p->type = P_DIGITS;
        p->individual = json_get_bool(j, "individual_digits", 0);
    } else if (!strcmp(t, "Punctuation")) {
        p->type = P_PUNCT;
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(j, "behavior");
        if (b && !cJSON_IsNull(b)) st = tk_parse_behavior(b, &p->behavior, path);
        else p->behavior = TK_SPLIT_ISOLATED;
    } else if (!strcmp(t, "CharDelimiterSplit")) {
        p->type = P_CHARDELIM;
        st = one_char(j, "delimiter", ' ', &p->repl, path);
    } else {
        st = err_set(GERBIL_ERR_UNSUPPORTED, "%s: unknown pre_tokenizer type \"%s\"", path, t);
    }
    if (st != GERBIL_OK) {
        tk_pretok_free(p);
        return st;
    }
    *out = p;
    return GERBIL_OK;
}

/* Spans of a character predicate: every matching character is a match of its own. */
enum { C_WS, C_NUM, C_PUNCT, C_EQ };
static int char_pred(int kind, uint32_t c, uint32_t arg) {
    switch (kind) {
    case C_WS: return tk_is_whitespace(c);
    case C_NUM: return tk_is_numeric(c);
    case C_PUNCT: return tk_is_punct(c);
    default: return c == arg;
    }
}

static int char_spans(const char *s, size_t n, int kind, uint32_t arg, tk_spans *out) {
    out->n = 0;
    if (!n) return tk_spans_push(out, 0, 0, 0);
    size_t last = 0, i = 0;
    while (i < n) {
        size_t b = i;
        uint32_t c = tk_utf8_next(s, &i);
        if (char_pred(kind, c, arg)) {
            if (last < b && tk_spans_push(out, (uint32_t)last, (uint32_t)b, 0)) return -1;
            if (tk_spans_push(out, (uint32_t)b, (uint32_t)i, 1)) return -1;
            last = i;
        }
    }
    if (n > last && tk_spans_push(out, (uint32_t)last, (uint32_t)n, 0)) return -1;
    return 0;
}

static int split_chars(const tk_piece *pc, tk_pieces *out, tk_ctx *cx, int kind, uint32_t arg, int behavior) {
    if (char_spans(out->text->p + pc->off, pc->len, kind, arg, &cx->spans)) return -1;
    return tk_split_piece(pc, &cx->spans, behavior, out);
}

/* Whitespace: the runs of \w+ and of [^\w\s]+; whitespace is dropped. */
static int split_whitespace(const tk_piece *pc, tk_pieces *out) {
    const char *s = out->text->p + pc->off;
    size_t n = pc->len, i = 0;
    while (i < n) {
        size_t b = i;
        uint32_t c = tk_utf8_next(s, &i);
        if (tk_is_whitespace(c) && !tk_is_word(c)) continue;
        int word = tk_is_word(c);
        size_t e = i;
        while (e < n) {
            size_t k = e;
            uint32_t d = tk_utf8_next(s, &k);
            if (word ? !tk_is_word(d) : (tk_is_word(d) || tk_is_whitespace(d))) break;
            e = k;
        }
        if (tk_pieces_push(out, pc->off + b, (uint32_t)(e - b), -1, pc->first && b == 0)) return -1;
        i = e;
    }
    return 0;
}

/* Append text to the arena as a new piece (re-read pc->off after: the arena may move). */
static int metaspace(const tk_pretok *p, const tk_piece *pc, tk_pieces *out, tk_ctx *cx) {
    tk_buf *t = out->text;
    char rep[4];
    int rl = tk_utf8_encode(rep, p->repl);
    uint64_t off = t->n;
    const char *s = t->p + pc->off;
    int starts = pc->len >= (uint32_t)rl && !memcmp(s, rep, (size_t)rl);
    int starts_space = pc->len > 0 && s[0] == ' ';
    int pre = 0;
    if (!starts && !starts_space) {
        if (p->prepend_scheme == PREPEND_ALWAYS) pre = 1;
        else if (p->prepend_scheme == PREPEND_FIRST && pc->first) pre = 1;
    }
    if (tk_buf_reserve(t, (size_t)pc->len * 3 + 8)) return -1;
    s = t->p + pc->off;
    if (pre && tk_buf_put(t, rep, (size_t)rl)) return -1;
    for (uint32_t i = 0; i < pc->len; i++) {
        if (s[i] == ' ') {
            if (tk_buf_put(t, rep, (size_t)rl)) return -1;
        } else if (tk_buf_putc(t, s[i])) {
            return -1;
        }
    }
    tk_piece np = {off, (uint32_t)(t->n - off), -1, pc->first};
    if (!p->split) return tk_pieces_push(out, np.off, np.len, -1, np.first);
    if (char_spans(t->p + np.off, np.len, C_EQ, p->repl, &cx->spans)) return -1;
    return tk_split_piece(&np, &cx->spans, TK_SPLIT_NEXT, out);
}

static int bytes_to_chars(const tk_piece *pc, tk_pieces *out) {
    tk_buf *t = out->text;
    if (tk_buf_reserve(t, (size_t)pc->len * 2 + 1)) return -1;
    uint64_t off = t->n;
    const unsigned char *s = (const unsigned char *)t->p + pc->off;
    for (uint32_t i = 0; i < pc->len; i++) {
        uint16_t cp = tk_byte_to_cp[s[i]];
        if (cp < 0x80) t->p[t->n++] = (char)cp;
        else {
            t->p[t->n++] = (char)(0xC0 | (cp >> 6));
            t->p[t->n++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    t->p[t->n] = 0;
    return tk_pieces_push(out, off, (uint32_t)(t->n - off), -1, pc->first);
}

static gerbil_status bytelevel(const tk_pretok *p, const tk_piece *pc0, tk_pieces *out, tk_ctx *cx) {
    tk_piece pc = *pc0;
    tk_buf *t = out->text;
    if (p->add_prefix_space && t->p[pc.off] != ' ') {
        uint64_t off = t->n;
        if (tk_buf_reserve(t, (size_t)pc.len + 2)) return GERBIL_ERR_NOMEM;
        t->p[t->n++] = ' ';
        memcpy(t->p + t->n, t->p + pc.off, pc.len);
        t->n += pc.len;
        t->p[t->n] = 0;
        pc.off = off;
        pc.len += 1;
    }
    if (!p->use_regex) return bytes_to_chars(&pc, out) ? GERBIL_ERR_NOMEM : GERBIL_OK;
    tk_pieces tmp = {.text = t};
    gerbil_status st = tk_regex_find_matches(&p->re, cx, t->p + pc.off, pc.len, &cx->spans);
    if (!st && tk_split_piece(&pc, &cx->spans, TK_SPLIT_ISOLATED, &tmp)) st = GERBIL_ERR_NOMEM;
    for (size_t i = 0; !st && i < tmp.n; i++)
        if (bytes_to_chars(&tmp.v[i], out)) st = GERBIL_ERR_NOMEM;
    tk_pieces_free(&tmp);
    return st;
}

static gerbil_status apply_piece(const tk_pretok *p, const tk_piece *pc, tk_pieces *out, tk_ctx *cx) {
    int rc = 0;
    switch (p->type) {
    case P_BYTELEVEL: return bytelevel(p, pc, out, cx);
    case P_SPLIT: {
        tk_spans *sp = &cx->spans;
        if (p->re.code) {
            GB_TRY(tk_regex_find_matches(&p->re, cx, out->text->p + pc->off, pc->len, sp));
        } else {
            sp->n = 0;
            rc = tk_spans_push(sp, 0, pc->len, 0);
        }
        if (p->invert)
            for (size_t i = 0; i < sp->n; i++) sp->v[i].match = !sp->v[i].match;
        if (!rc) rc = tk_split_piece(pc, sp, p->behavior, out);
        break;
    }
    case P_METASPACE: rc = metaspace(p, pc, out, cx); break;
    case P_WHITESPACE: rc = split_whitespace(pc, out); break;
    case P_WSSPLIT: rc = split_chars(pc, out, cx, C_WS, 0, TK_SPLIT_REMOVED); break;
    case P_BERT: {
        tk_pieces tmp = {.text = out->text};
        rc = split_chars(pc, &tmp, cx, C_WS, 0, TK_SPLIT_REMOVED);
        for (size_t i = 0; !rc && i < tmp.n; i++) rc = split_chars(&tmp.v[i], out, cx, C_PUNCT, 0, TK_SPLIT_ISOLATED);
        tk_pieces_free(&tmp);
        break;
    }
    case P_DIGITS:
        rc = split_chars(pc, out, cx, C_NUM, 0, p->individual ? TK_SPLIT_ISOLATED : TK_SPLIT_CONTIGUOUS);
        break;
    case P_PUNCT: rc = split_chars(pc, out, cx, C_PUNCT, 0, p->behavior); break;
    case P_CHARDELIM: rc = split_chars(pc, out, cx, C_EQ, p->repl, TK_SPLIT_REMOVED); break;
    default: break;
    }
    return rc ? err_set(GERBIL_ERR_NOMEM, "pre-tokenizer: out of memory") : GERBIL_OK;
}

gerbil_status tk_pretok_apply(const tk_pretok *p, tk_ctx *cx, tk_pieces *pcs) {
    if (!p) return GERBIL_OK;
    if (p->type == P_SEQ) {
        for (int k = 0; k < p->n_kids; k++) GB_TRY(tk_pretok_apply(p->kids[k], cx, pcs));
        return GERBIL_OK;
    }
    tk_pieces out = {.text = pcs->text};
    gerbil_status st = GERBIL_OK;
    if (pcs->n && !(out.v = malloc(pcs->n * 2 * sizeof *out.v))) return GERBIL_ERR_NOMEM;
    out.cap = pcs->n * 2;
    for (size_t i = 0; i < pcs->n && !st; i++) {
        tk_piece pc = pcs->v[i];
        if (pc.id >= 0) {
            if (tk_pieces_push(&out, pc.off, pc.len, pc.id, pc.first)) st = GERBIL_ERR_NOMEM;
        } else {
            st = apply_piece(p, &pc, &out, cx);
        }
    }
    if (st) {
        tk_pieces_free(&out);
        return st;
    }
    tk_pieces_free(pcs);
    *pcs = out;
    return GERBIL_OK;
}
