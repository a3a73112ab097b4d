/* Containers, UTF-8, Unicode properties, regex and the split behaviours shared by the
 * tokenizer pipeline. */
#include "text/tok_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ---- buffers ---- */
int tk_buf_reserve(tk_buf *b, size_t extra) {
    if (b->n + extra <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + extra) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

int tk_buf_put(tk_buf *b, const void *s, size_t n) {
    if (tk_buf_reserve(b, n + 1)) return -1;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0; /* always NUL-terminated for convenience */
    return 0;
}

int tk_buf_put_cp(tk_buf *b, uint32_t cp) {
    char u[4];
    return tk_buf_put(b, u, (size_t)tk_utf8_encode(u, cp));
}

void tk_buf_free(tk_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

int tk_ids_push(tk_ids *a, int32_t x) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        int32_t *v = realloc(a->v, cap * sizeof *v);
        if (!v) return -1;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return 0;
}

void tk_ids_free(tk_ids *a) {
    free(a->v);
    memset(a, 0, sizeof *a);
}

/* ---- hashing ---- */
uint64_t tk_hash(const void *s, size_t n) {
    /* FNV-1a over 8-byte words, then a final mix: keys are short token strings. */
    const unsigned char *p = s;
    uint64_t h = 0xcbf29ce484222325ULL ^ (n * 0x9E3779B97F4A7C15ULL);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0x100000001b3ULL;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    while (n--) h = (h ^ *p++) * 0x100000001b3ULL;
    h ^= h >> 32;
    h *= 0xd6e8feb86659fd93ULL;
    h ^= h >> 32;
    return h;
}

/* Slots hold (hash >> 32) << 32 | (entry + 1): a probe compares hash bits before it
 * touches the entry and its key (the loads that miss the cache). */
static int strmap_resize(tk_strmap *m, size_t nslots) {
    uint64_t *slots = calloc(nslots, sizeof *slots);
    if (!slots) return -1;
    for (size_t e = 0; e < m->n; e++) {
        uint64_t h = tk_hash(m->arena.p + m->ents[e].off, m->ents[e].len);
        size_t i = h & (nslots - 1);
        while (slots[i]) i = (i + 1) & (nslots - 1);
        slots[i] = (h & 0xFFFFFFFF00000000ULL) | (uint64_t)(e + 1);
    }
    free(m->slots);
    m->slots = slots;
    m->mask = nslots - 1;
    return 0;
}

int tk_strmap_reserve(tk_strmap *m, size_t n, size_t key_bytes) {
    size_t nslots = 1024;
    while (nslots < n * 2) nslots *= 2;
    if (nslots > m->mask + 1 && strmap_resize(m, nslots)) return -1;
    if (n > m->cap) {
        tk_strmap_ent *e = realloc(m->ents, n * sizeof *e);
        if (!e) return -1;
        m->ents = e;
        m->cap = n;
    }
    return tk_buf_reserve(&m->arena, key_bytes + n);
}

static inline uint64_t key_head(const char *k, size_t n) {
    uint64_t h = 0;
    memcpy(&h, k, n < 8 ? n : 8);
    return h;
}

static inline int64_t strmap_find_h(const tk_strmap *m, const char *k, size_t n, uint64_t h) {
    if (!m->mask) return -1;
    size_t i = h & m->mask;
    uint64_t tag = h & 0xFFFFFFFF00000000ULL, head = key_head(k, n);
    for (;;) {
        uint64_t s = m->slots[i];
        if (!s) return -1;
        if ((s & 0xFFFFFFFF00000000ULL) == tag) {
            const tk_strmap_ent *e = &m->ents[(uint32_t)s - 1];
            if (e->len == n && e->head == head && (n <= 8 || !memcmp(m->arena.p + e->off + 8, k + 8, n - 8)))
                return (int64_t)(uint32_t)s - 1;
        }
        i = (i + 1) & m->mask;
    }
}

void tk_strmap_find_batch(const tk_strmap *m, const char *const *k, const size_t *n, int64_t *out, size_t cnt) {
    /* Staged so the cache misses of many lookups overlap: slots, then entries, then
     * the keys' tails in the arena are prefetched for the whole batch before use. */
    uint64_t h[TK_BATCH];
    if (!m->mask) {
        for (size_t i = 0; i < cnt; i++) out[i] = -1;
        return;
    }
    for (size_t i = 0; i < cnt; i++) {
        h[i] = tk_hash(k[i], n[i]);
        __builtin_prefetch(&m->slots[h[i] & m->mask]);
    }
    for (size_t i = 0; i < cnt; i++) {
        uint64_t s = m->slots[h[i] & m->mask];
        if (s) __builtin_prefetch(&m->ents[(uint32_t)s - 1]);
    }
    for (size_t i = 0; i < cnt; i++) {
        uint64_t s = m->slots[h[i] & m->mask];
        if (s && n[i] > 8) __builtin_prefetch(m->arena.p + m->ents[(uint32_t)s - 1].off + 8);
    }
    for (size_t i = 0; i < cnt; i++) out[i] = strmap_find_h(m, k[i], n[i], h[i]);
}

int64_t tk_strmap_find(const tk_strmap *m, const char *k, size_t n) {
    return m->mask ? strmap_find_h(m, k, n, tk_hash(k, n)) : -1;
}

int64_t tk_strmap_put(tk_strmap *m, const char *k, size_t n, int32_t val) {
    uint64_t h = tk_hash(k, n);
    int64_t f = strmap_find_h(m, k, n, h);
    if (f >= 0) {
        m->ents[f].val = val;
        return f;
    }
    if ((m->n + 1) * 2 > m->mask + 1 && strmap_resize(m, m->mask ? (m->mask + 1) * 2 : 1024)) return -1;
    if (m->n == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 256;
        tk_strmap_ent *e = realloc(m->ents, cap * sizeof *e);
        if (!e) return -1;
        m->ents = e;
        m->cap = cap;
    }
    if (n > UINT32_MAX || m->n >= UINT32_MAX - 1) return -1;
    uint64_t off = m->arena.n;
    if (tk_buf_put(&m->arena, k, n) || tk_buf_putc(&m->arena, 0)) return -1;
    tk_strmap_ent *e = &m->ents[m->n];
    e->head = key_head(k, n);
    e->off = off;
    e->len = (uint32_t)n;
    e->val = val;
    size_t i = h & m->mask;
    while (m->slots[i]) i = (i + 1) & m->mask;
    m->slots[i] = (h & 0xFFFFFFFF00000000ULL) | (uint64_t)(m->n + 1);
    return (int64_t)m->n++;
}

void tk_strmap_free(tk_strmap *m) {
    free(m->slots);
    free(m->ents);
    tk_buf_free(&m->arena);
    memset(m, 0, sizeof *m);
}

static inline uint64_t mix64(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return k;
}

static int u64map_grow(tk_u64map *m) {
    size_t nslots = m->mask ? (m->mask + 1) * 2 : 256;
    uint64_t *keys = malloc(nslots * sizeof *keys), *vals = malloc(nslots * sizeof *vals);
    if (!keys || !vals) {
        free(keys);
        free(vals);
        return -1;
    }
    memset(keys, 0xff, nslots * sizeof *keys);
    if (m->mask) {
        for (size_t j = 0; j <= m->mask; j++) {
            if (m->keys[j] == UINT64_MAX) continue;
            size_t i = mix64(m->keys[j]) & (nslots - 1);
            while (keys[i] != UINT64_MAX) i = (i + 1) & (nslots - 1);
            keys[i] = m->keys[j];
            vals[i] = m->vals[j];
        }
    }
    free(m->keys);
    free(m->vals);
    m->keys = keys;
    m->vals = vals;
    m->mask = nslots - 1;
    return 0;
}

int tk_u64map_reserve(tk_u64map *m, size_t n) {
    while ((m->mask ? m->mask + 1 : 0) < n * 2)
        if (u64map_grow(m)) return -1;
    return 0;
}

int tk_u64map_put(tk_u64map *m, uint64_t k, uint64_t v) {
    if ((m->n + 1) * 2 > (m->mask ? m->mask + 1 : 0) && u64map_grow(m)) return -1;
    size_t i = mix64(k) & m->mask;
    while (m->keys[i] != UINT64_MAX && m->keys[i] != k) i = (i + 1) & m->mask;
    if (m->keys[i] == UINT64_MAX) m->n++;
    m->keys[i] = k;
    m->vals[i] = v;
    return 0;
}

int tk_u64map_get(const tk_u64map *m, uint64_t k, uint64_t *v) {
    if (!m->mask) return 0;
    size_t i = mix64(k) & m->mask;
    for (;;) {
        if (m->keys[i] == k) {
            *v = m->vals[i];
            return 1;
        }
        if (m->keys[i] == UINT64_MAX) return 0;
        i = (i + 1) & m->mask;
    }
}

void tk_u64map_free(tk_u64map *m) {
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

/* ---- UTF-8 ---- */
int tk_utf8_encode(char out[4], uint32_t cp) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) { out[0] = (char)(0xC0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Length of the valid sequence at s (1..4), or -(length of the maximal invalid subpart). */
static int utf8_seq(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    int need;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c == 0xE0) { need = 2; lo = 0xA0; }
    else if (c >= 0xE1 && c <= 0xEC) need = 2;
    else if (c == 0xED) { need = 2; hi = 0x9F; }
    else if (c >= 0xEE && c <= 0xEF) need = 2;
    else if (c == 0xF0) { need = 3; lo = 0x90; }
    else if (c >= 0xF1 && c <= 0xF3) need = 3;
    else if (c == 0xF4) { need = 3; hi = 0x8F; }
    else return -1;
    for (int k = 1; k <= need; k++) {
        if ((size_t)k >= n) return -k;
        unsigned char d = s[k];
        if (k == 1 ? (d < lo || d > hi) : (d < 0x80 || d > 0xBF)) return -k;
    }
    return need + 1;
}

size_t tk_utf8_valid_prefix(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        int l = utf8_seq((const unsigned char *)s + i, n - i);
        if (l < 0) return i;
        i += (size_t)l;
    }
    return i;
}

int tk_utf8_lossy(const char *s, size_t n, tk_buf *out) {
    size_t i = 0;
    if (tk_buf_reserve(out, n + 1)) return -1;
    while (i < n) {
        size_t j = i;
        while (j < n && (unsigned char)s[j] < 0x80) j++;
        if (j > i && tk_buf_put(out, s + i, j - i)) return -1;
        i = j;
        if (i >= n) break;
        int l = utf8_seq((const unsigned char *)s + i, n - i);
        if (l > 0) {
            if (tk_buf_put(out, s + i, (size_t)l)) return -1;
            i += (size_t)l;
        } else {
            if (tk_buf_put(out, "\xEF\xBF\xBD", 3)) return -1;
            i += (size_t)-l;
        }
    }
    return 0;
}

/* ---- Unicode properties (utf8proc's tables, Unicode 15) ---- */
int tk_is_whitespace(uint32_t c) {
    return (c >= 9 && c <= 13) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

static int cat(uint32_t c) { return (int)utf8proc_category((utf8proc_int32_t)c); }

int tk_is_numeric(uint32_t c) {
    if (c < 0x80) return c >= '0' && c <= '9';
    int k = cat(c);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

int tk_is_word(uint32_t c) {
    if (c < 0x80) return ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') || (c >= '0' && c <= '9') || c == '_';
    int k = cat(c);
    if (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) return 1;
    if (k >= UTF8PROC_CATEGORY_MN && k <= UTF8PROC_CATEGORY_ME) return 1;
    if (k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_PC) return 1;
    return c == 0x200C || c == 0x200D || (c >= 0x24B6 && c <= 0x24E9) || (c >= 0x1F130 && c <= 0x1F189);
}

int tk_is_punct(uint32_t c) {
    if (c < 0x80) return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
                         (c >= 0x7B && c <= 0x7E);
    int k = cat(c);
    return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}

int tk_is_mark(uint32_t c) {
    if (c < 0x300) return 0;
    int k = cat(c);
    return k >= UTF8PROC_CATEGORY_MN && k <= UTF8PROC_CATEGORY_ME;
}

int tk_is_mark_nonspacing(uint32_t c) { return c >= 0x300 && cat(c) == UTF8PROC_CATEGORY_MN; }

int tk_is_other(uint32_t c) {
    int k = cat(c);
    return k == UTF8PROC_CATEGORY_CN || (k >= UTF8PROC_CATEGORY_CC && k <= UTF8PROC_CATEGORY_CO);
}

int tk_is_chinese(uint32_t c) {
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
           (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

int tk_put_lower(tk_buf *out, uint32_t c) {
    if (c < 0x80) return tk_buf_putc(out, (char)((c >= 'A' && c <= 'Z') ? c + 32 : c));
    if (c == 0x130) return tk_buf_put(out, "i\xCC\x87", 3); /* the one unconditional special casing */
    return tk_buf_put_cp(out, (uint32_t)utf8proc_tolower((utf8proc_int32_t)c));
}

static int normalize_chunk(const char *s, size_t n, utf8proc_option_t opt, tk_buf *out) {
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst, opt);
    int rc = r < 0 ? tk_buf_put(out, s, n) /* cannot happen on valid UTF-8 */ : tk_buf_put(out, dst, (size_t)r);
    free(dst);
    return rc;
}

int tk_unicode_normalize(const char *s, size_t n, int form, tk_buf *out) {
    utf8proc_option_t opt = UTF8PROC_STABLE;
    switch (form) {
    case TK_NFC: opt |= UTF8PROC_COMPOSE; break;
    case TK_NFD: opt |= UTF8PROC_DECOMPOSE; break;
    case TK_NFKC: opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    default: opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
    }
    /* Every form leaves ASCII alone, and the boundary between two ASCII characters is
     * safe (no composition pair starts or ends across it), so only the stretches around
     * non-ASCII text go through utf8proc. */
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        while (j < n && (unsigned char)s[j] < 0x80 && (j + 1 >= n || (unsigned char)s[j + 1] < 0x80)) j++;
        if (j > i && tk_buf_put(out, s + i, j - i)) return -1;
        if (j >= n) break;
        /* s[j] is non-ASCII or an ASCII char followed by non-ASCII: run to the next safe boundary */
        size_t k = j + 1;
        while (k < n && !((unsigned char)s[k - 1] < 0x80 && (unsigned char)s[k] < 0x80)) k++;
        if (k < n) k--; /* s[k-1], s[k] both ASCII: the chunk ends before s[k] */
        if (k <= j) k = j + 1;
        if (normalize_chunk(s + j, k - j, opt, out)) return -1;
        i = k;
    }
    return 0;
}

/* ---- regex ---- */
gerbil_status tk_regex_compile(tk_regex *re, const char *pat, size_t len, int literal, const char *path) {
    int err;
    PCRE2_SIZE erroff;
    uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    re->code = pcre2_compile((PCRE2_SPTR)pat, len, opts, &err, &erroff, NULL);
    if (!re->code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return err_set(GERBIL_ERR_UNSUPPORTED, "%s: cannot compile regex \"%.*s\" at offset %zu: %s", path,
                       (int)(len > 200 ? 200 : len), pat, (size_t)erroff, (const char *)msg);
    }
    pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE); /* falls back to the interpreter when unavailable */
    return GERBIL_OK;
}

void tk_regex_free(tk_regex *re) {
    pcre2_code_free(re->code);
    re->code = NULL;
}

int tk_spans_push(tk_spans *a, uint32_t s, uint32_t e, int match) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        tk_span *v = realloc(a->v, cap * sizeof *v);
        if (!v) return -1;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = (tk_span){s, e, (uint8_t)match};
    return 0;
}

void tk_spans_free(tk_spans *a) {
    free(a->v);
    memset(a, 0, sizeof *a);
}

gerbil_status tk_regex_find_matches(const tk_regex *re, tk_ctx *cx, const char *s, size_t n, tk_spans *out) {
    out->n = 0;
    if (n == 0) return tk_spans_push(out, 0, 0, 0) ? GERBIL_ERR_NOMEM : GERBIL_OK;
    if (!cx->md && !(cx->md = pcre2_match_data_create(1, NULL))) return err_set(GERBIL_ERR_NOMEM, "regex match data");
    size_t prev = 0, pos = 0;
    while (pos <= n) {
        int rc = pcre2_match(re->code, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, cx->md, NULL);
        /* the JIT's stack (32 KiB by default) overflows on long pieces some patterns
         * backtrack over; the interpreter keeps its backtracking on the heap */
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
            rc = pcre2_match(re->code, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, cx->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            if (pcre2_get_error_message(rc, msg, sizeof msg) < 0) snprintf((char *)msg, sizeof msg, "unknown error");
            return err_set(GERBIL_ERR_UNSUPPORTED, "pre-tokenizer regex failed on a piece of %zu bytes at byte %zu: %s "
                           "(PCRE2 error %d)", n, pos, (const char *)msg, rc);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(cx->md);
        size_t ms = ov[0], me = ov[1];
        if (ms != prev && tk_spans_push(out, (uint32_t)prev, (uint32_t)ms, 0)) return GERBIL_ERR_NOMEM;
        if (tk_spans_push(out, (uint32_t)ms, (uint32_t)me, 1)) return GERBIL_ERR_NOMEM;
        prev = me;
        if (me == ms) { /* empty match: step over one character */
            if (me >= n) break;
            pos = me + tk_utf8_len((unsigned char)s[me]);
        } else {
            pos = me;
        }
    }
    if (prev != n && tk_spans_push(out, (uint32_t)prev, (uint32_t)n, 0)) return GERBIL_ERR_NOMEM;
    return GERBIL_OK;
}

/* ---- pieces and split behaviours ---- */
int tk_pieces_push(tk_pieces *p, uint64_t off, uint32_t len, int32_t id, int first) {
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 64;
        tk_piece *v = realloc(p->v, cap * sizeof *v);
        if (!v) return -1;
        p->v = v;
        p->cap = cap;
    }
    p->v[p->n++] = (tk_piece){off, len, id, (uint8_t)first};
    return 0;
}

void tk_pieces_free(tk_pieces *p) {
    free(p->v);
    p->v = NULL;
    p->n = p->cap = 0;
}

gerbil_status tk_parse_behavior(const cJSON *j, int *out, const char *path) {
    const char *s = cJSON_IsString(j) ? j->valuestring : NULL;
    if (!s) return err_set(GERBIL_ERR_FORMAT, "%s: split behavior must be a string", path);
    static const char *names[][2] = {{"Removed", "removed"}, {"Isolated", "isolated"},
                                     {"MergedWithPrevious", "merged_with_previous"},
                                     {"MergedWithNext", "merged_with_next"}, {"Contiguous", "contiguous"}};
    for (int i = 0; i < 5; i++) {
        if (!strcmp(s, names[i][0]) || !strcmp(s, names[i][1])) {
            *out = i;
            return GERBIL_OK;
        }
    }
    return err_set(GERBIL_ERR_UNSUPPORTED, "%s: unknown split behavior \"%s\"", path, s);
}

int tk_split_piece(const tk_piece *pc, const tk_spans *m, int behavior, tk_pieces *out) {
    /* Reduce the match list to kept ranges exactly as NormalizedString::split, then
     * drop empty ones. Only a range starting at offset 0 keeps the "first" flag. */
    size_t n0 = out->n;
    int prev_match = 0;
    for (size_t i = 0; i < m->n; i++) {
        const tk_span *sp = &m->v[i];
        int is_match = sp->match;
        switch (behavior) {
        case TK_SPLIT_REMOVED:
            if (!is_match && tk_pieces_push(out, pc->off + sp->s, sp->e - sp->s, -1, 0)) return -1;
            continue;
        case TK_SPLIT_ISOLATED:
            if (tk_pieces_push(out, pc->off + sp->s, sp->e - sp->s, -1, 0)) return -1;
            continue;
        case TK_SPLIT_CONTIGUOUS:
            if (is_match == prev_match && out->n > n0) {
                tk_piece *l = &out->v[out->n - 1];
                l->len = (uint32_t)(pc->off + sp->e - l->off);
            } else if (tk_pieces_push(out, pc->off + sp->s, sp->e - sp->s, -1, 0)) {
                return -1;
            }
            prev_match = is_match;
            continue;
        case TK_SPLIT_PREV:
            if (is_match && !prev_match && out->n > n0) {
                tk_piece *l = &out->v[out->n - 1];
                l->len = (uint32_t)(pc->off + sp->e - l->off);
            } else if (tk_pieces_push(out, pc->off + sp->s, sp->e - sp->s, -1, 0)) {
                return -1;
            }
            prev_match = is_match;
            continue;
        default: break;
        }
    }
    if (behavior == TK_SPLIT_NEXT) {
        /* fold from the right: a match joins the range after it */
        size_t k0 = out->n;
        prev_match = 0;
        for (size_t i = m->n; i-- > 0;) {
            const tk_span *sp = &m->v[i];
            if (sp->match && !prev_match && out->n > k0) {
                tk_piece *l = &out->v[out->n - 1];
                l->len = (uint32_t)(l->off + l->len - (pc->off + sp->s));
                l->off = pc->off + sp->s;
            } else if (tk_pieces_push(out, pc->off + sp->s, sp->e - sp->s, -1, 0)) {
                return -1;
            }
            prev_match = sp->match;
        }
        for (size_t a = k0, b = out->n; a + 1 < b; a++, b--) {
            tk_piece t = out->v[a];
            out->v[a] = out->v[b - 1];
            out->v[b - 1] = t;
        }
    }
    /* drop empties, set the first flag */
    size_t w = n0;
    for (size_t i = n0; i < out->n; i++) {
        tk_piece p = out->v[i];
        if (!p.len) continue;
        p.first = (uint8_t)(pc->first && p.off == pc->off);
        out->v[w++] = p;
    }
    out->n = w;
    return 0;
}

/* ---- string lists ---- */
static int strs_grow(tk_strs *l) {
    if (l->n < l->cap) return 0;
    size_t cap = l->cap ? l->cap * 2 : 32;
    uint64_t *o = realloc(l->off, cap * sizeof *o);
    if (!o) return -1;
    l->off = o;
    uint32_t *n = realloc(l->len, cap * sizeof *n);
    if (!n) return -1;
    l->len = n;
    l->cap = cap;
    return 0;
}

int tk_strs_push(tk_strs *l, const char *s, size_t n) {
    if (strs_grow(l)) return -1;
    l->off[l->n] = l->data.n;
    l->len[l->n] = (uint32_t)n;
    if (tk_buf_put(&l->data, s, n)) return -1;
    l->n++;
    return 0;
}

int tk_strs_begin(tk_strs *l) { return tk_strs_push(l, "", 0); }

int tk_strs_append(tk_strs *l, const char *s, size_t n) {
    if (tk_buf_put(&l->data, s, n)) return -1;
    l->len[l->n - 1] += (uint32_t)n;
    return 0;
}

void tk_strs_clear(tk_strs *l) {
    l->n = 0;
    l->data.n = 0;
}

void tk_strs_free(tk_strs *l) {
    tk_buf_free(&l->data);
    free(l->off);
    free(l->len);
    memset(l, 0, sizeof *l);
}

void tk_ctx_free(tk_ctx *cx) {
    pcre2_match_data_free(cx->md);
    tk_spans_free(&cx->spans);
    tk_buf_free(&cx->tmp);
    tk_buf_free(&cx->tmp2);
    memset(cx, 0, sizeof *cx);
}
