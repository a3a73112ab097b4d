/* JSON Schema -> byte-level grammar. Properties come in the order the schema writes
 * them (required ones always, optional ones may be left out), then additional ones.
 * Whitespace is what JSON allows between tokens (or none in compact mode). Keywords
 * that cannot be enforced are compile errors that name them; annotations are ignored. */
#include "grammar/grammar.h"
#include "base/status.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct sc {
    gir *g;
    gschema_opts o;
    const cJSON *root;
    int ws;            /* whitespace rule, -1 in compact mode */
    int r_value, r_string, r_number, r_integer, r_object, r_array, r_strchar;
    struct { char *ref; int rule; } *refs;
    int n_refs, cap_refs;
    cJSON *owned;      /* merged schemas built during compilation (freed at the end) */
    gerbil_status err;
    int depth;
};

static int serr(struct sc *c, gerbil_status st, const char *fmt, const char *arg) {
    if (c->err == GERBIL_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, fmt, arg);
        c->err = err_set(st, "JSON Schema: %s", msg);
    }
    return -1;
}

static void ws(struct sc *c, gseq *s) { if (c->ws >= 0) gseq_rule(s, c->ws); }
static void lit(struct sc *c, gseq *s, const char *t) { gseq_lit(c->g, s, t, strlen(t)); }

static int one(struct sc *c, gseq *s) {
    int r = gir_rule(c->g, NULL);
    gir_alt(c->g, r, s);
    return r;
}

static int class_rule(struct sc *c, const char *chars) {
    gbyteset set = {{0}};
    for (const char *p = chars; *p; p++) {
        if (p[1] == '-' && p[2]) { gbs_add_range(&set, (unsigned char)p[0], (unsigned char)p[2]); p += 2; }
        else gbs_add(&set, (unsigned char)*p);
    }
    return gir_wrap_set(c->g, &set);
}

/* ---- the generic JSON rules ---- */
static void build_common(struct sc *c) {
    gir *g = c->g;
    gseq s = {0};
    if (c->o.compact) c->ws = -1;
    else {
        int wsc = class_rule(c, " \t\n\r");
        c->ws = gir_repeat(g, wsc, 0, c->o.max_ws > 0 ? c->o.max_ws : -1);
    }
    /* char ::= [^"\\\x00-\x1f] | "\\" (["\\/bfnrt] | "u" hex{4}) */
    uint32_t lo[3] = {0, '"', '\\'}, hi[3] = {0x1F, '"', '\\'};
    int plain = gir_char_class(g, lo, hi, 3, 1);
    int esc1 = class_rule(c, "\"\\/bfnrt");
    int hex = class_rule(c, "0-9a-fA-F");
    c->r_strchar = gir_rule(g, NULL);
    gseq_rule(&s, plain);
    gir_alt(g, c->r_strchar, &s);
    lit(c, &s, "\\");
    gseq_rule(&s, esc1);
    gir_alt(g, c->r_strchar, &s);
    lit(c, &s, "\\u");
    for (int i = 0; i < 4; i++) gseq_rule(&s, hex);
    gir_alt(g, c->r_strchar, &s);
    c->r_string = gir_rule(g, NULL);
    lit(c, &s, "\"");
    gseq_rule(&s, gir_repeat(g, c->r_strchar, 0, -1));
    lit(c, &s, "\"");
    gir_alt(g, c->r_string, &s);
    /* integer ::= "-"? ("0" | [1-9][0-9]*) */
    int d09 = class_rule(c, "0-9"), d19 = class_rule(c, "1-9");
    int nat = gir_rule(g, NULL);
    lit(c, &s, "0");
    gir_alt(g, nat, &s);
    gseq_rule(&s, d19);
    gseq_rule(&s, gir_repeat(g, d09, 0, -1));
    gir_alt(g, nat, &s);
    int minus = gir_repeat(g, gir_rule_lit(g, "-", 1), 0, 1);
    c->r_integer = gir_rule(g, NULL);
    gseq_rule(&s, minus);
    gseq_rule(&s, nat);
    gir_alt(g, c->r_integer, &s);
    /* number ::= integer ("." [0-9]+)? ([eE] [-+]? [0-9]+)? */
    int digits = gir_repeat(g, d09, 1, -1);
    lit(c, &s, ".");
    gseq_rule(&s, digits);
    int frac = gir_repeat(g, one(c, &s), 0, 1);
    gseq_rule(&s, class_rule(c, "eE"));
    gseq_rule(&s, gir_repeat(g, class_rule(c, "-+"), 0, 1));
    gseq_rule(&s, digits);
    int ex = gir_repeat(g, one(c, &s), 0, 1);
    c->r_number = gir_rule(g, NULL);
    gseq_rule(&s, c->r_integer);
    gseq_rule(&s, frac);
    gseq_rule(&s, ex);
    gir_alt(g, c->r_number, &s);
    /* value, object, array (mutually recursive) */
    c->r_value = gir_rule(g, NULL);
    c->r_object = gir_rule(g, NULL);
    c->r_array = gir_rule(g, NULL);
    int member = gir_rule(g, NULL);
    gseq_rule(&s, c->r_string);
    ws(c, &s);
    lit(c, &s, ":");
    ws(c, &s);
    gseq_rule(&s, c->r_value);
    ws(c, &s);
    gir_alt(g, member, &s);
    lit(c, &s, ",");
    ws(c, &s);
    gseq_rule(&s, member);
    int more = gir_repeat(g, one(c, &s), 0, -1);
    lit(c, &s, "{");
    ws(c, &s);
    lit(c, &s, "}");
    gir_alt(g, c->r_object, &s);
    lit(c, &s, "{");
    ws(c, &s);
    gseq_rule(&s, member);
    gseq_rule(&s, more);
    lit(c, &s, "}");
    gir_alt(g, c->r_object, &s);
    int elem = gir_rule(g, NULL);
    gseq_rule(&s, c->r_value);
    ws(c, &s);
    gir_alt(g, elem, &s);
    lit(c, &s, ",");
    ws(c, &s);
    gseq_rule(&s, elem);
    int emore = gir_repeat(g, one(c, &s), 0, -1);
    lit(c, &s, "[");
    ws(c, &s);
    lit(c, &s, "]");
    gir_alt(g, c->r_array, &s);
    lit(c, &s, "[");
    ws(c, &s);
    gseq_rule(&s, elem);
    gseq_rule(&s, emore);
    lit(c, &s, "]");
    gir_alt(g, c->r_array, &s);
    const int alts[] = {c->r_object, c->r_array, c->r_string, c->r_number};
    for (int i = 0; i < 4; i++) { gseq_rule(&s, alts[i]); gir_alt(g, c->r_value, &s); }
    static const char *const kw[] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++) { lit(c, &s, kw[i]); gir_alt(g, c->r_value, &s); }
    gseq_free(&s);
}

/* ---- integers in a range ---- */
/* all digit strings of length n */
static void any_digits(struct sc *c, gseq *s, int n) {
    int d = class_rule(c, "0-9");
    for (int i = 0; i < n; i++) gseq_rule(s, d);
}

static int digit_range(struct sc *c, int a, int b) {
    gbyteset set = {{0}};
    gbs_add_range(&set, (unsigned)('0' + a), (unsigned)('0' + b));
    return gir_wrap_set(c->g, &set);
}

/* alternatives into rule r: same-length digit strings x with lo <= x <= hi (strings of len n) */
static void same_len_range(struct sc *c, int r, gseq *pre, const char *lo, const char *hi, int n) {
    gir *g = c->g;
    if (n == 0) { gseq t = {0}; for (int i = 0; i < pre->n; i++) gseq_push(&t, pre->v[i].kind, pre->v[i].arg); gir_alt(g, r, &t); gseq_free(&t); return; }
    int a = lo[0] - '0', b = hi[0] - '0';
    int lo_rest_min = 1, hi_rest_max = 1;
    for (int i = 1; i < n; i++) { if (lo[i] != '0') lo_rest_min = 0; if (hi[i] != '9') hi_rest_max = 0; }
    gseq t = {0};
    if (a == b) {
        for (int i = 0; i < pre->n; i++) gseq_push(&t, pre->v[i].kind, pre->v[i].arg);
        gseq_rule(&t, digit_range(c, a, a));
        same_len_range(c, r, &t, lo + 1, hi + 1, n - 1);
        gseq_free(&t);
        return;
    }
    /* first digit a with rest >= lo[1..] */
    int from = a, to = b;
    if (!lo_rest_min) {
        for (int i = 0; i < pre->n; i++) gseq_push(&t, pre->v[i].kind, pre->v[i].arg);
        gseq_rule(&t, digit_range(c, a, a));
        char nines[32];
        memset(nines, '9', sizeof nines);
        same_len_range(c, r, &t, lo + 1, nines, n - 1);
        t.n = 0;
        from = a + 1;
    }
    if (!hi_rest_max) to = b - 1;
    if (from <= to) {
        for (int i = 0; i < pre->n; i++) gseq_push(&t, pre->v[i].kind, pre->v[i].arg);
        gseq_rule(&t, digit_range(c, from, to));
        any_digits(c, &t, n - 1);
        gir_alt(g, r, &t);
        t.n = 0;
    }
    if (!hi_rest_max) {
        for (int i = 0; i < pre->n; i++) gseq_push(&t, pre->v[i].kind, pre->v[i].arg);
        gseq_rule(&t, digit_range(c, b, b));
        char zeros[32];
        memset(zeros, '0', sizeof zeros);
        same_len_range(c, r, &t, zeros, hi + 1, n - 1);
    }
    gseq_free(&t);
}

/* non-negative integers in [lo, hi] (hi < 0: unbounded), canonical form, into rule r
 * with prefix pre */
static void nonneg_range(struct sc *c, int r, const char *prefix, long long lo, long long hi) {
    gir *g = c->g;
    gseq pre = {0};
    lit(c, &pre, prefix);
    char ls[32], hs[32];
    int llen = snprintf(ls, sizeof ls, "%lld", lo);
    int hlen = hi >= 0 ? snprintf(hs, sizeof hs, "%lld", hi) : 19;
    for (int n = llen; n <= hlen && n <= 19; n++) {
        char a[32], b[32];
        if (n == llen) memcpy(a, ls, (size_t)n + 1);
        else { a[0] = '1'; memset(a + 1, '0', (size_t)n - 1); a[n] = 0; }
        if (hi >= 0 && n == hlen) memcpy(b, hs, (size_t)n + 1);
        else { memset(b, '9', (size_t)n); b[n] = 0; }
        if (n == 1 && lo == 0) a[0] = '0';
        same_len_range(c, r, &pre, a, b, n);
    }
    if (hi < 0) {
        /* longer than 19 digits */
        gseq t = {0};
        for (int i = 0; i < pre.n; i++) gseq_push(&t, pre.v[i].kind, pre.v[i].arg);
        gseq_rule(&t, class_rule(c, "1-9"));
        any_digits(c, &t, 19);
        gseq_rule(&t, gir_repeat(g, class_rule(c, "0-9"), 0, -1));
        gir_alt(g, r, &t);
        gseq_free(&t);
    }
    gseq_free(&pre);
}

static int int_range(struct sc *c, int has_lo, long long lo, int has_hi, long long hi) {
    int r = gir_rule(c->g, NULL);
    c->g->rules[r].defined = 1;
    if (has_lo && has_hi && lo > hi) return r;
    /* negative part: -x for x in [max(1, -hi), -lo] */
    if (!has_lo || lo < 0) {
        long long nlo = has_hi ? (hi < 0 ? -hi : 1) : 1;
        long long nhi = has_lo ? -lo : -1;
        if (nlo < 1) nlo = 1;
        if (nhi < 0 || nlo <= nhi) nonneg_range(c, r, "-", nlo, nhi);
    }
    if (!has_hi || hi >= 0) {
        long long plo = has_lo && lo > 0 ? lo : 0;
        long long phi = has_hi ? hi : -1;
        nonneg_range(c, r, "", plo, phi);
    }
    return r;
}

/* ---- literals (enum / const) ---- */
static int value_lit(struct sc *c, const cJSON *v);

static void seq_value_lit(struct sc *c, gseq *s, const cJSON *v) {
    if (cJSON_IsObject(v) || cJSON_IsArray(v)) {
        int obj = cJSON_IsObject(v);
        lit(c, s, obj ? "{" : "[");
        ws(c, s);
        int first = 1;
        for (const cJSON *e = v->child; e; e = e->next) {
            if (!first) { lit(c, s, ","); ws(c, s); }
            first = 0;
            if (obj) {
                cJSON *k = cJSON_CreateString(e->string ? e->string : "");
                char *t = k ? cJSON_PrintUnformatted(k) : NULL;
                if (t) lit(c, s, t);
                free(t);
                cJSON_Delete(k);
                ws(c, s);
                lit(c, s, ":");
                ws(c, s);
            }
            gseq_rule(s, value_lit(c, e));
            ws(c, s);
        }
        lit(c, s, obj ? "}" : "]");
        return;
    }
    gseq_rule(s, value_lit(c, v));
}

static int value_lit(struct sc *c, const cJSON *v) {
    gseq s = {0};
    int r = gir_rule(c->g, NULL);
    if (cJSON_IsNumber(v)) {
        double d = v->valuedouble;
        char b[64];
        if (d == floor(d) && fabs(d) < 1e15) {
            snprintf(b, sizeof b, "%.0f", d);
            lit(c, &s, b);
            gir_alt(c->g, r, &s);
            snprintf(b, sizeof b, "%.1f", d);
            lit(c, &s, b);
        } else {
            snprintf(b, sizeof b, "%.17g", d);
            /* the shortest form that reads back */
            for (int p = 1; p <= 17; p++) {
                char t[64];
                snprintf(t, sizeof t, "%.*g", p, d);
                if (strtod(t, NULL) == d) { memcpy(b, t, sizeof t); break; }
            }
            lit(c, &s, b);
        }
        gir_alt(c->g, r, &s);
    } else if (cJSON_IsObject(v) || cJSON_IsArray(v)) {
        seq_value_lit(c, &s, v);
        gir_alt(c->g, r, &s);
    } else {
        char *t = cJSON_PrintUnformatted(v);
        if (!t) { c->g->oom = 1; gseq_free(&s); return r; }
        lit(c, &s, t);
        free(t);
        gir_alt(c->g, r, &s);
    }
    gseq_free(&s);
    return r;
}

/* ---- strings ---- */
/* days per month, 29 February only in leap years (as ajv-formats checks) */
#define DATE_RE "[0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))" \
                "|([0-9]{2}(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)-02-29"
static const char *format_regex(const char *f) {
    static const char *const tab[][2] = {
        {"date", DATE_RE},
        {"time", "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"},
        {"date-time", "(" DATE_RE ")T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]"
                      "(\\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"},
        {"uuid", "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"},
        {"ipv4", "((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"},
        {"ipv6", "([0-9a-fA-F]{1,4}:){7}[0-9a-fA-F]{1,4}|([0-9a-fA-F]{1,4}:){1,7}:|([0-9a-fA-F]{1,4}:){1,6}:[0-9a-fA-F]{1,4}"
                 "|([0-9a-fA-F]{1,4}:){1,5}(:[0-9a-fA-F]{1,4}){1,2}|([0-9a-fA-F]{1,4}:){1,4}(:[0-9a-fA-F]{1,4}){1,3}"
                 "|([0-9a-fA-F]{1,4}:){1,3}(:[0-9a-fA-F]{1,4}){1,4}|([0-9a-fA-F]{1,4}:){1,2}(:[0-9a-fA-F]{1,4}){1,5}"
                 "|[0-9a-fA-F]{1,4}:(:[0-9a-fA-F]{1,4}){1,6}|:(:[0-9a-fA-F]{1,4}){1,7}|::"},
        {"email", "[a-zA-Z0-9!#$%&'*+/=?^_`{|}~-]+(\\.[a-zA-Z0-9!#$%&'*+/=?^_`{|}~-]+)*@[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}"
                  "[a-zA-Z0-9])?(\\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?)*"},
        {"hostname", "[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?(\\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?)*"},
        {"uri", "[a-zA-Z][a-zA-Z0-9+.-]*:([A-Za-z0-9._~:/?#@!$&'()*+,;=-]|%[0-9a-fA-F]{2})*"},
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (!strcmp(tab[i][0], f)) return tab[i][1];
    return NULL;
}

static int regex_string(struct sc *c, const char *re, int search) {
    int body = -1;
    gerbil_status st = gir_from_regex(c->g, re, strlen(re), GRX_JSON_STRING, search, &body);
    if (st != GERBIL_OK) {
        if (c->err == GERBIL_OK) c->err = err_prefix(st, "JSON Schema: pattern");
        return -1;
    }
    gseq s = {0};
    lit(c, &s, "\"");
    gseq_rule(&s, body);
    lit(c, &s, "\"");
    int r = one(c, &s);
    gseq_free(&s);
    return r;
}

/* ---- keywords ---- */
static const char *const k_annotations[] = {
    "title", "description", "$schema", "$id", "id", "default", "examples", "$comment", "deprecated", "readOnly",
    "writeOnly", "contentMediaType", "contentEncoding", "$defs", "definitions", "example", "discriminator", "xml",
    "externalDocs", "$anchor", "strict", NULL};

static int is_in(const char *k, const char *const *list) {
    for (int i = 0; list[i]; i++)
        if (!strcmp(k, list[i])) return 1;
    return 0;
}

static int compile(struct sc *c, const cJSON *s);

static const cJSON *resolve_ref(struct sc *c, const char *ref) {
    if (ref[0] != '#') { serr(c, GERBIL_ERR_UNSUPPORTED, "$ref \"%s\": only references within the schema (#...) are supported", ref); return NULL; }
    const cJSON *cur = c->root;
    const char *p = ref + 1;
    if (*p == 0) return cur;
    if (*p != '/') { serr(c, GERBIL_ERR_UNSUPPORTED, "$ref \"%s\": anchors are not supported", ref); return NULL; }
    while (*p == '/') {
        p++;
        char tok[512];
        size_t n = 0;
        while (*p && *p != '/' && n + 1 < sizeof tok) {
            if (p[0] == '~' && p[1] == '0') { tok[n++] = '~'; p += 2; }
            else if (p[0] == '~' && p[1] == '1') { tok[n++] = '/'; p += 2; }
            else if (p[0] == '%' && p[1] && p[2]) {
                char h[3] = {p[1], p[2], 0};
                tok[n++] = (char)strtol(h, NULL, 16);
                p += 3;
            } else tok[n++] = *p++;
        }
        tok[n] = 0;
        if (cJSON_IsArray(cur)) cur = cJSON_GetArrayItem(cur, atoi(tok));
        else cur = cJSON_GetObjectItemCaseSensitive(cur, tok);
        if (!cur) { serr(c, GERBIL_ERR_FORMAT, "$ref \"%s\" points nowhere", ref); return NULL; }
    }
    return cur;
}

static int compile_ref(struct sc *c, const char *ref) {
    for (int i = 0; i < c->n_refs; i++)
        if (!strcmp(c->refs[i].ref, ref)) return c->refs[i].rule;
    const cJSON *t = resolve_ref(c, ref);
    if (!t) return -1;
    if (c->n_refs == c->cap_refs) {
        int cap = c->cap_refs ? c->cap_refs * 2 : 16;
        void *q = realloc(c->refs, (size_t)cap * sizeof *c->refs);
        if (!q) { c->g->oom = 1; return -1; }
        c->refs = q;
        c->cap_refs = cap;
    }
    int r = gir_rule(c->g, ref);
    c->refs[c->n_refs].ref = strdup(ref);
    c->refs[c->n_refs].rule = r;
    c->n_refs++;
    int body = compile(c, t);
    if (body < 0) return -1;
    gseq s = {0};
    gseq_rule(&s, body);
    gir_alt(c->g, r, &s);
    gseq_free(&s);
    return r;
}

/* keep a merged schema alive until the end */
static cJSON *own(struct sc *c, cJSON *x) {
    if (!x) { c->g->oom = 1; return NULL; }
    if (!c->owned) c->owned = cJSON_CreateArray();
    cJSON_AddItemToArray(c->owned, x);
    return x;
}

static const cJSON *deref(struct sc *c, const cJSON *s) {
    for (int guard = 0; guard < 32 && cJSON_IsObject(s); guard++) {
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(s, "$ref");
        if (!cJSON_IsString(r)) return s;
        /* only a bare reference (with annotations) is replaced */
        for (const cJSON *k = s->child; k; k = k->next)
            if (strcmp(k->string, "$ref") && !is_in(k->string, k_annotations)) return s;
        s = resolve_ref(c, r->valuestring);
        if (!s) return NULL;
    }
    return s;
}

static int type_mask_of(const cJSON *t); /* below */

/* Merge b into a copy of a (allOf): properties merged per key, required unioned,
 * types intersected, other keywords must agree. NULL on a conflict (error set). */
static cJSON *merge(struct sc *c, const cJSON *a, const cJSON *b) {
    a = deref(c, a);
    b = deref(c, b);
    if (!a || !b) return NULL;
    if (cJSON_IsBool(a)) { if (cJSON_IsTrue(a)) return cJSON_Duplicate(b, 1); return cJSON_Duplicate(a, 1); }
    if (cJSON_IsBool(b)) { if (cJSON_IsTrue(b)) return cJSON_Duplicate(a, 1); return cJSON_Duplicate(b, 1); }
    if (!cJSON_IsObject(a) || !cJSON_IsObject(b)) { serr(c, GERBIL_ERR_FORMAT, "%s", "a schema must be an object or a boolean"); return NULL; }
    cJSON *m = cJSON_Duplicate(a, 1);
    if (!m) return NULL;
    for (const cJSON *kb = b->child; kb; kb = kb->next) {
        const char *k = kb->string;
        cJSON *ka = cJSON_GetObjectItemCaseSensitive(m, k);
        if (!ka) { cJSON_AddItemToObject(m, k, cJSON_Duplicate(kb, 1)); continue; }
        if (is_in(k, k_annotations)) continue;
        if (!strcmp(k, "properties")) {
            for (const cJSON *p = kb->child; p; p = p->next) {
                cJSON *pa = cJSON_GetObjectItemCaseSensitive(ka, p->string);
                if (!pa) { cJSON_AddItemToObject(ka, p->string, cJSON_Duplicate(p, 1)); continue; }
                cJSON *mm = merge(c, pa, p);
                if (!mm) { cJSON_Delete(m); return NULL; }
                cJSON_ReplaceItemInObjectCaseSensitive(ka, p->string, mm);
            }
        } else if (!strcmp(k, "required")) {
            for (const cJSON *r = kb->child; r; r = r->next) {
                int has = 0;
                for (const cJSON *q = ka->child; q; q = q->next)
                    if (cJSON_IsString(q) && cJSON_IsString(r) && !strcmp(q->valuestring, r->valuestring)) has = 1;
                if (!has) cJSON_AddItemToArray(ka, cJSON_Duplicate(r, 1));
            }
        } else if (!strcmp(k, "type")) {
            int ma = type_mask_of(ka), mb = type_mask_of(kb), mi = ma & mb;
            static const char *const names[] = {"null", "boolean", "object", "array", "number", "string", "integer"};
            /* integer within number */
            if ((ma & 16) && (mb & 64)) mi |= 64;
            if ((mb & 16) && (ma & 64)) mi |= 64;
            cJSON *t = cJSON_CreateArray();
            for (int i = 0; i < 7; i++)
                if (mi & (1 << i)) cJSON_AddItemToArray(t, cJSON_CreateString(names[i]));
            cJSON_ReplaceItemInObjectCaseSensitive(m, "type", t);
        } else if (!strcmp(k, "minimum") || !strcmp(k, "minLength") || !strcmp(k, "minItems") ||
                   !strcmp(k, "exclusiveMinimum")) {
            if (cJSON_IsNumber(ka) && cJSON_IsNumber(kb) && kb->valuedouble > ka->valuedouble)
                cJSON_ReplaceItemInObjectCaseSensitive(m, k, cJSON_Duplicate(kb, 1));
        } else if (!strcmp(k, "maximum") || !strcmp(k, "maxLength") || !strcmp(k, "maxItems") ||
                   !strcmp(k, "exclusiveMaximum")) {
            if (cJSON_IsNumber(ka) && cJSON_IsNumber(kb) && kb->valuedouble < ka->valuedouble)
                cJSON_ReplaceItemInObjectCaseSensitive(m, k, cJSON_Duplicate(kb, 1));
        } else if (!strcmp(k, "allOf")) {
            for (const cJSON *x = kb->child; x; x = x->next) cJSON_AddItemToArray(ka, cJSON_Duplicate(x, 1));
        } else if (!cJSON_Compare(ka, kb, 1)) {
            if (!strcmp(k, "additionalProperties") && ((cJSON_IsBool(ka) && !cJSON_IsTrue(ka)) || (cJSON_IsBool(kb) && !cJSON_IsTrue(kb)))) {
                cJSON_ReplaceItemInObjectCaseSensitive(m, k, cJSON_CreateFalse());
                continue;
            }
            serr(c, GERBIL_ERR_UNSUPPORTED, "allOf: the branches disagree on \"%s\"", k);
            cJSON_Delete(m);
            return NULL;
        }
    }
    return m;
}

enum { T_NULL = 1, T_BOOL = 2, T_OBJECT = 4, T_ARRAY = 8, T_NUMBER = 16, T_STRING = 32, T_INTEGER = 64, T_ALL = 127 };

static int type_bit(const char *t) {
    static const char *const names[] = {"null", "boolean", "object", "array", "number", "string", "integer"};
    for (int i = 0; i < 7; i++)
        if (!strcmp(t, names[i])) return 1 << i;
    return 0;
}

static int type_mask_of(const cJSON *t) {
    if (!t) return T_ALL;
    if (cJSON_IsString(t)) return type_bit(t->valuestring);
    int m = 0;
    for (const cJSON *e = t->child; e; e = e->next)
        if (cJSON_IsString(e)) m |= type_bit(e->valuestring);
    return m;
}

/* the key of a property as it appears in JSON text */
static char *json_key(const char *k) {
    cJSON *s = cJSON_CreateString(k);
    char *t = s ? cJSON_PrintUnformatted(s) : NULL;
    cJSON_Delete(s);
    return t;
}

/* ---- keys that are none of a set (for additional properties) ---- */
struct keyset { char **k; int n; };

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* continuation after a prefix of depth d shared by keys[lo..hi) (keys' JSON bodies, no quotes) */
static int notkey_rule(struct sc *c, char **keys, int lo, int hi, int d, int rest) {
    gir *g = c->g;
    int r = gir_rule(g, NULL);
    g->rules[r].defined = 1;
    gseq s = {0};
    int ends_here = 0;
    /* at a character boundary? (the prefix's last lead byte complete) */
    const unsigned char *k0 = (const unsigned char *)keys[lo];
    int boundary = 1;
    for (int i = 0; i < d;) {
        int len = k0[i] < 0x80 ? 1 : k0[i] < 0xE0 ? 2 : k0[i] < 0xF0 ? 3 : 4;
        if (i + len > d) { boundary = 0; break; }
        i += len;
    }
    gbyteset child = {{0}};
    for (int i = lo; i < hi;) {
        unsigned char b = (unsigned char)keys[i][d];
        if (!b) { ends_here = 1; i++; continue; }
        int j = i;
        while (j < hi && (unsigned char)keys[j][d] == b) j++;
        gbs_add(&child, b);
        gseq_byte(g, &s, b);
        gseq_rule(&s, notkey_rule(c, keys, i, j, d + 1, rest));
        gir_alt(g, r, &s);
        i = j;
    }
    if (boundary) {
        if (!ends_here && d > 0) { lit(c, &s, "\""); gir_alt(g, r, &s); }
        /* a different character, then any rest */
        uint32_t lo_[260], hi_[260];
        int n = 0;
        lo_[n] = 0; hi_[n] = 0x1F; n++;
        lo_[n] = '"'; hi_[n] = '"'; n++;
        lo_[n] = '\\'; hi_[n] = '\\'; n++;
        for (unsigned b = 0; b < 256; b++) {
            if (!gbs_has(&child, b)) continue;
            if (b < 0x80) { lo_[n] = b; hi_[n] = b; n++; }
            else if (b >= 0xC2 && b < 0xE0) { lo_[n] = (b & 0x1F) << 6; hi_[n] = lo_[n] | 0x3F; n++; }
            else if (b >= 0xE0 && b < 0xF0) { lo_[n] = (b & 0x0F) << 12; hi_[n] = lo_[n] | 0xFFF; n++; }
            else if (b >= 0xF0) { lo_[n] = (b & 0x07) << 18; hi_[n] = lo_[n] | 0x3FFFF; n++; }
        }
        gseq_rule(&s, gir_char_class(g, lo_, hi_, n, 1));
        gseq_rule(&s, rest);
        gir_alt(g, r, &s);
        if (!gbs_has(&child, '\\')) {
            /* an escape is a different character too (an escaped spelling of a listed key
             * would slip through: accepted as a limitation, keys with escapes are rare) */
            lit(c, &s, "\\");
            gseq_rule(&s, class_rule(c, "\"\\/bfnrt"));
            gseq_rule(&s, rest);
            gir_alt(g, r, &s);
            lit(c, &s, "\\u");
            int hex = class_rule(c, "0-9a-fA-F");
            for (int i = 0; i < 4; i++) gseq_rule(&s, hex);
            gseq_rule(&s, rest);
            gir_alt(g, r, &s);
        }
    }
    gseq_free(&s);
    return r;
}

static int key_not_in(struct sc *c, struct keyset *ks) {
    if (ks->n == 0) return c->r_string;
    char **keys = malloc((size_t)ks->n * sizeof *keys);
    if (!keys) { c->g->oom = 1; return c->r_string; }
    for (int i = 0; i < ks->n; i++) {
        size_t n = strlen(ks->k[i]);
        keys[i] = malloc(n);
        if (!keys[i]) { c->g->oom = 1; keys[i] = strdup(""); continue; }
        memcpy(keys[i], ks->k[i] + 1, n - 2); /* strip the quotes */
        keys[i][n - 2] = 0;
    }
    qsort(keys, (size_t)ks->n, sizeof *keys, cmp_str);
    gseq s = {0};
    gseq_rule(&s, gir_repeat(c->g, c->r_strchar, 0, -1));
    lit(c, &s, "\"");
    int rest = one(c, &s);
    lit(c, &s, "\"");
    gseq_rule(&s, notkey_rule(c, keys, 0, ks->n, 0, rest));
    int r = one(c, &s);
    gseq_free(&s);
    for (int i = 0; i < ks->n; i++) free(keys[i]);
    free(keys);
    return r;
}

/* ---- objects ---- */
struct prop { char *key; int value; int required; };

static int compile_object(struct sc *c, const cJSON *s) {
    gir *g = c->g;
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *addl = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    const cJSON *pats = cJSON_GetObjectItemCaseSensitive(s, "patternProperties");
    int n = 0, cap = 8;
    struct prop *P = malloc((size_t)cap * sizeof *P);
    struct keyset ks = {0};
    int result = -1;
    if (!P) { g->oom = 1; return -1; }
    for (const cJSON *p = props ? props->child : NULL; p; p = p->next) {
        if (n == cap) { cap *= 2; void *q = realloc(P, (size_t)cap * sizeof *P); if (!q) goto done; P = q; }
        int v = compile(c, p);
        if (v < 0) goto done;
        int rq = 0;
        for (const cJSON *r = req ? req->child : NULL; r; r = r->next)
            if (cJSON_IsString(r) && !strcmp(r->valuestring, p->string)) rq = 1;
        P[n++] = (struct prop){json_key(p->string), v, rq};
    }
    int addl_rule = -1; /* -1: no additional properties */
    if (!addl || cJSON_IsTrue(addl)) addl_rule = c->r_value;
    else if (cJSON_IsObject(addl)) { if ((addl_rule = compile(c, addl)) < 0) goto done; }
    else if (!cJSON_IsBool(addl)) { serr(c, GERBIL_ERR_FORMAT, "%s", "additionalProperties must be a schema"); goto done; }
    if (pats && pats->child && addl_rule >= 0) {
        serr(c, GERBIL_ERR_UNSUPPORTED, "%s", "patternProperties together with additionalProperties other than false");
        goto done;
    }
    /* required names not in properties */
    for (const cJSON *r = req ? req->child : NULL; r; r = r->next) {
        if (!cJSON_IsString(r)) continue;
        int found = 0;
        for (const cJSON *p = props ? props->child : NULL; p; p = p->next) found |= !strcmp(p->string, r->valuestring);
        if (found) continue;
        int v = addl_rule;
        if (pats && pats->child) { serr(c, GERBIL_ERR_UNSUPPORTED, "required property \"%s\" only matched by patternProperties", r->valuestring); goto done; }
        if (v < 0) { serr(c, GERBIL_ERR_UNSUPPORTED, "required property \"%s\" is forbidden by additionalProperties: false", r->valuestring); goto done; }
        if (n == cap) { cap *= 2; void *q = realloc(P, (size_t)cap * sizeof *P); if (!q) goto done; P = q; }
        P[n++] = (struct prop){json_key(r->valuestring), v, 1};
    }
    /* the extra member rule X */
    int X = -1;
    gseq sq = {0};
    if (addl_rule >= 0) {
        ks.k = malloc((size_t)(n ? n : 1) * sizeof *ks.k);
        if (!ks.k) goto done;
        for (int i = 0; i < n; i++) ks.k[ks.n++] = P[i].key;
        gseq_rule(&sq, key_not_in(c, &ks));
        ws(c, &sq);
        lit(c, &sq, ":");
        ws(c, &sq);
        gseq_rule(&sq, addl_rule);
        ws(c, &sq);
        X = one(c, &sq);
    } else if (pats && pats->child) {
        X = gir_rule(g, NULL);
        for (const cJSON *pp = pats->child; pp; pp = pp->next) {
            int k = regex_string(c, pp->string, 1);
            int v = compile(c, pp);
            if (k < 0 || v < 0) { gseq_free(&sq); goto done; }
            gseq_rule(&sq, k);
            ws(c, &sq);
            lit(c, &sq, ":");
            ws(c, &sq);
            gseq_rule(&sq, v);
            ws(c, &sq);
            gir_alt(g, X, &sq);
        }
    }
    /* R[i][first] */
    int *R = malloc(((size_t)n + 1) * 2 * sizeof *R);
    if (!R) { gseq_free(&sq); goto done; }
    for (int first = 0; first < 2; first++) {
        int r = gir_rule(g, NULL);
        R[n * 2 + first] = r;
        if (X >= 0) {
            lit(c, &sq, ",");
            ws(c, &sq);
            gseq_rule(&sq, X);
            int more = gir_repeat(g, one(c, &sq), 0, -1);
            if (first) {
                gseq_rule(&sq, X);
                gseq_rule(&sq, more);
                gir_alt(g, r, &sq);
                gir_alt(g, r, &sq);
            } else {
                gseq_rule(&sq, more);
                gir_alt(g, r, &sq);
            }
        } else {
            gir_alt(g, r, &sq);
        }
    }
    for (int i = n - 1; i >= 0; i--)
        for (int first = 0; first < 2; first++) {
            int r = gir_rule(g, NULL);
            R[i * 2 + first] = r;
            if (!first) { lit(c, &sq, ","); ws(c, &sq); }
            if (P[i].key) lit(c, &sq, P[i].key);
            ws(c, &sq);
            lit(c, &sq, ":");
            ws(c, &sq);
            gseq_rule(&sq, P[i].value);
            ws(c, &sq);
            gseq_rule(&sq, R[(i + 1) * 2]);
            gir_alt(g, r, &sq);
            if (!P[i].required) {
                gseq_rule(&sq, R[(i + 1) * 2 + first]);
                gir_alt(g, r, &sq);
            }
        }
    lit(c, &sq, "{");
    ws(c, &sq);
    gseq_rule(&sq, R[1]);
    lit(c, &sq, "}");
    result = one(c, &sq);
    gseq_free(&sq);
    free(R);
done:
    for (int i = 0; i < n; i++) free(P[i].key);
    free(P);
    free(ks.k);
    return result;
}

/* A count keyword (minItems, maxLength ...) as an int without overflowing the cast: absent
 * gives dflt, anything above 10000 gives 10001 (refused by the caller), a negative or
 * fractional count -2 (refused here). */
static int count_kw(const cJSON *x, int dflt) {
    if (!cJSON_IsNumber(x)) return dflt;
    double d = x->valuedouble;
    if (!(d >= 0) || d != floor(d)) return -2;
    return d > 10000 ? 10001 : (int)d;
}

/* ---- arrays ---- */
static int compile_array(struct sc *c, const cJSON *s) {
    gir *g = c->g;
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    const cJSON *prefix = cJSON_GetObjectItemCaseSensitive(s, "prefixItems");
    const cJSON *addi = cJSON_GetObjectItemCaseSensitive(s, "additionalItems");
    const cJSON *mn = cJSON_GetObjectItemCaseSensitive(s, "minItems"), *mx = cJSON_GetObjectItemCaseSensitive(s, "maxItems");
    int min = count_kw(mn, 0), max = count_kw(mx, -1);
    if (min == -2 || max == -2) return serr(c, GERBIL_ERR_FORMAT, "%s", "minItems/maxItems must be non-negative integers");
    if (min > 10000 || max > 10000) return serr(c, GERBIL_ERR_UNSUPPORTED, "%s", "minItems/maxItems above 10000");
    if (cJSON_IsArray(items)) { prefix = items; items = addi; } /* draft 4-7 tuples */
    int k = 0;
    int pre[256];
    for (const cJSON *p = prefix ? prefix->child : NULL; p; p = p->next) {
        if (k == 256) return serr(c, GERBIL_ERR_UNSUPPORTED, "%s", "more than 256 prefixItems");
        if ((pre[k++] = compile(c, p)) < 0) return -1;
    }
    int item; /* -1: no more items */
    if (!items || cJSON_IsTrue(items)) item = c->r_value;
    else if (cJSON_IsFalse(items)) item = -1;
    else if ((item = compile(c, items)) < 0) return -1;
    if (max >= 0 && max < min) { int r = gir_rule(g, NULL); g->rules[r].defined = 1; return r; }
    gseq sq = {0};
    /* tail after position k: items with count in [max(0,min-k), max-k] each preceded by a comma
     * (or not, when k == 0: the first one has none) */
    int tmin = min > k ? min - k : 0, tmax = max < 0 ? -1 : (max > k ? max - k : 0);
    int tail;
    if (item < 0 || tmax == 0) {
        if (tmin > 0) { int r = gir_rule(g, NULL); g->rules[r].defined = 1; return r; } /* impossible */
        tail = gir_rule(g, NULL);
        gir_alt(g, tail, &sq);
    } else {
        lit(c, &sq, ",");
        ws(c, &sq);
        gseq_rule(&sq, item);
        ws(c, &sq);
        int comma_item = one(c, &sq);
        if (k > 0) {
            tail = gir_repeat(g, comma_item, tmin, tmax);
        } else {
            /* item ws (, item ws){tmin-1, tmax-1} ; optional if tmin == 0 */
            gseq_rule(&sq, item);
            ws(c, &sq);
            gseq_rule(&sq, gir_repeat(g, comma_item, tmin > 0 ? tmin - 1 : 0, tmax < 0 ? -1 : tmax - 1));
            int nonempty = one(c, &sq);
            tail = tmin > 0 ? nonempty : gir_repeat(g, nonempty, 0, 1);
        }
    }
    /* the prefix chain: A_j ::= sep item_j ws A_{j+1} | (j >= min: "") */
    int next = tail;
    for (int j = k - 1; j >= 0; j--) {
        int r = gir_rule(g, NULL);
        if (j > 0) { lit(c, &sq, ","); ws(c, &sq); }
        gseq_rule(&sq, pre[j]);
        ws(c, &sq);
        gseq_rule(&sq, next);
        gir_alt(g, r, &sq);
        if (j >= min) gir_alt(g, r, &sq);
        next = r;
    }
    lit(c, &sq, "[");
    ws(c, &sq);
    gseq_rule(&sq, next);
    lit(c, &sq, "]");
    int r = one(c, &sq);
    gseq_free(&sq);
    return r;
}

static int compile_string(struct sc *c, const cJSON *s) {
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(s, "format");
    const cJSON *mn = cJSON_GetObjectItemCaseSensitive(s, "minLength"), *mx = cJSON_GetObjectItemCaseSensitive(s, "maxLength");
    int has_len = cJSON_IsNumber(mn) || cJSON_IsNumber(mx);
    if (cJSON_IsString(pat)) {
        if (cJSON_IsString(fmt)) return serr(c, GERBIL_ERR_UNSUPPORTED, "%s", "pattern together with format");
        if (has_len) return serr(c, GERBIL_ERR_UNSUPPORTED, "%s", "pattern together with minLength/maxLength");
        return regex_string(c, pat->valuestring, 1);
    }
    if (cJSON_IsString(fmt)) {
        const char *re = format_regex(fmt->valuestring);
        /* a format no validator knows is an annotation (JSON Schema 2019-09+): any string */
        if (!re && !has_len) return c->r_string;
        if (!re) return serr(c, GERBIL_ERR_UNSUPPORTED, "format \"%s\" with minLength/maxLength", fmt->valuestring);
        if (has_len) return serr(c, GERBIL_ERR_UNSUPPORTED, "%s", "format together with minLength/maxLength");
        return regex_string(c, re, 0);
    }
    if (!has_len) return c->r_string;
    int min = count_kw(mn, 0), max = count_kw(mx, -1);
    if (min == -2 || max == -2) return serr(c, GERBIL_ERR_FORMAT, "%s", "minLength/maxLength must be non-negative integers");
    if (min > 10000 || max > 10000) return serr(c, GERBIL_ERR_UNSUPPORTED, "%s", "minLength/maxLength above 10000");
    if (max >= 0 && max < min) { int r = gir_rule(c->g, NULL); c->g->rules[r].defined = 1; return r; }
    gseq sq = {0};
    lit(c, &sq, "\"");
    gseq_rule(&sq, gir_repeat(c->g, c->r_strchar, min < 0 ? 0 : min, max));
    lit(c, &sq, "\"");
    int r = one(c, &sq);
    gseq_free(&sq);
    return r;
}

static int num_kw(const cJSON *s, const char *k, double *v) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(s, k);
    if (!cJSON_IsNumber(x)) return 0;
    *v = x->valuedouble;
    return 1;
}

/* an integer bound as long long; beyond ±1e18 it saturates at ±2e18 (refused by the caller) */
static long long bound_ll(double v) {
    if (!(v > -1e18)) return -2000000000000000000LL;
    if (!(v < 1e18)) return 2000000000000000000LL;
    return (long long)v;
}

static int compile_integer(struct sc *c, const cJSON *s) {
    double v;
    int has_lo = 0, has_hi = 0;
    long long lo = 0, hi = 0;
    if (num_kw(s, "multipleOf", &v) && v != 1) return serr(c, GERBIL_ERR_UNSUPPORTED, "%s", "multipleOf (other than 1)");
    const cJSON *emn = cJSON_GetObjectItemCaseSensitive(s, "exclusiveMinimum"), *emx = cJSON_GetObjectItemCaseSensitive(s, "exclusiveMaximum");
    if (num_kw(s, "minimum", &v)) {
        has_lo = 1;
        lo = bound_ll(ceil(v));
        if (cJSON_IsTrue(emn) && (double)lo == v) lo++;
    }
    if (num_kw(s, "maximum", &v)) {
        has_hi = 1;
        hi = bound_ll(floor(v));
        if (cJSON_IsTrue(emx) && (double)hi == v) hi--;
    }
    if (cJSON_IsNumber(emn)) {
        long long e = bound_ll(floor(emn->valuedouble) + 1);
        if (!has_lo || e > lo) lo = e;
        has_lo = 1;
    }
    if (cJSON_IsNumber(emx)) {
        long long e = bound_ll(ceil(emx->valuedouble) - 1);
        if (!has_hi || e < hi) hi = e;
        has_hi = 1;
    }
    if ((has_lo && fabs((double)lo) > 1e18) || (has_hi && fabs((double)hi) > 1e18))
        return serr(c, GERBIL_ERR_UNSUPPORTED, "%s", "integer bounds beyond 1e18");
    if (!has_lo && !has_hi) return c->r_integer;
    return int_range(c, has_lo, lo, has_hi, hi);
}

static int compile_number(struct sc *c, const cJSON *s) {
    double v;
    if (cJSON_GetObjectItemCaseSensitive(s, "multipleOf")) return serr(c, GERBIL_ERR_UNSUPPORTED, "%s", "multipleOf on numbers");
    if (cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(s, "exclusiveMinimum")) ||
        cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(s, "exclusiveMaximum")) ||
        cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(s, "exclusiveMinimum")) ||
        cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(s, "exclusiveMaximum")))
        return serr(c, GERBIL_ERR_UNSUPPORTED, "%s", "exclusiveMinimum/exclusiveMaximum on numbers");
    if (num_kw(s, "maximum", &v)) return serr(c, GERBIL_ERR_UNSUPPORTED, "%s", "maximum on numbers");
    if (num_kw(s, "minimum", &v)) {
        if (v != 0) return serr(c, GERBIL_ERR_UNSUPPORTED, "%s", "minimum on numbers (other than 0)");
        /* non-negative: the number rule without its sign */
        int d09 = class_rule(c, "0-9"), d19 = class_rule(c, "1-9");
        gseq sq = {0};
        int nat = gir_rule(c->g, NULL);
        lit(c, &sq, "0");
        gir_alt(c->g, nat, &sq);
        gseq_rule(&sq, d19);
        gseq_rule(&sq, gir_repeat(c->g, d09, 0, -1));
        gir_alt(c->g, nat, &sq);
        lit(c, &sq, ".");
        gseq_rule(&sq, gir_repeat(c->g, d09, 1, -1));
        int frac = gir_repeat(c->g, one(c, &sq), 0, 1);
        gseq_rule(&sq, class_rule(c, "eE"));
        gseq_rule(&sq, gir_repeat(c->g, class_rule(c, "-+"), 0, 1));
        gseq_rule(&sq, gir_repeat(c->g, d09, 1, -1));
        int ex = gir_repeat(c->g, one(c, &sq), 0, 1);
        gseq_rule(&sq, nat);
        gseq_rule(&sq, frac);
        gseq_rule(&sq, ex);
        int r = one(c, &sq);
        gseq_free(&sq);
        return r;
    }
    return c->r_number;
}

static const char *const k_unsupported[] = {
    "not", "if", "then", "else", "dependentRequired", "dependentSchemas", "dependencies", "uniqueItems", "contains",
    "minContains", "maxContains", "minProperties", "maxProperties", "propertyNames", "unevaluatedProperties",
    "unevaluatedItems", "$dynamicRef", "$recursiveRef", NULL};

/* the JSON types a schema may match (integer counted as number), for oneOf */
static int value_types(const cJSON *s) {
    if (cJSON_IsFalse(s)) return 0;
    if (!cJSON_IsObject(s)) return T_ALL;
    const cJSON *cn = cJSON_GetObjectItemCaseSensitive(s, "const"), *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    int m = T_ALL;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (t) m = type_mask_of(t);
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(s, "nullable"))) m |= T_NULL;
    if (cn || cJSON_IsArray(en)) {
        int v = 0;
        for (const cJSON *x = cn ? cn : en->child; x; x = cn ? NULL : x->next)
            v |= cJSON_IsNull(x) ? T_NULL : cJSON_IsBool(x) ? T_BOOL : cJSON_IsString(x) ? T_STRING
               : cJSON_IsNumber(x) ? T_NUMBER : cJSON_IsArray(x) ? T_ARRAY : T_OBJECT;
        m = t ? (m & v) | (v & T_NUMBER && m & T_INTEGER ? T_NUMBER : 0) : v;
    }
    if (m & T_INTEGER) m = (m & ~T_INTEGER) | T_NUMBER;
    return m;
}

/* the const/enum values of property p of object schema s (NULL when unconstrained or optional) */
static const cJSON *disc_values(const cJSON *s, const char *p, int *is_const) {
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    int rq = 0;
    for (const cJSON *r = req ? req->child : NULL; r; r = r->next) rq |= cJSON_IsString(r) && !strcmp(r->valuestring, p);
    if (!rq) return NULL;
    const cJSON *ps = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(s, "properties"), p);
    if (!ps) return NULL;
    const cJSON *cn = cJSON_GetObjectItemCaseSensitive(ps, "const");
    if (cn) { *is_const = 1; return cn; }
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(ps, "enum");
    *is_const = 0;
    return cJSON_IsArray(en) ? en : NULL;
}

static int values_overlap(const cJSON *a, int ac, const cJSON *b, int bc) {
    for (const cJSON *x = ac ? a : a->child; x; x = ac ? NULL : x->next)
        for (const cJSON *y = bc ? b : b->child; y; y = bc ? NULL : y->next)
            if (cJSON_Compare(x, y, 1)) return 1;
    return 0;
}

/* oneOf is enforced as anyOf, which is right only when no value can match two branches:
 * branches of disjoint types, or objects told apart by a required const/enum property. */
static int one_of_disjoint(struct sc *c, const cJSON *base, const cJSON *alts, int has_more) {
    const cJSON *b[64];
    int n = 0;
    for (const cJSON *x = alts->child; x; x = x->next) {
        if (n == 64) return 0;
        const cJSON *e = has_more ? own(c, merge(c, base, x)) : deref(c, x);
        if (!e) return 0;
        b[n++] = deref(c, e);
        if (!b[n - 1]) return 0;
    }
    /* every pair: disjoint types, or two objects told apart by a required const/enum property */
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) {
            int ti = value_types(b[i]), tj = value_types(b[j]);
            if (!(ti & tj)) continue;
            if (ti != T_OBJECT || tj != T_OBJECT) return 0;
            const cJSON *props = cJSON_GetObjectItemCaseSensitive(b[i], "properties");
            int told = 0;
            for (const cJSON *p = props ? props->child : NULL; p && !told; p = p->next) {
                int ic, jc;
                const cJSON *vi = disc_values(b[i], p->string, &ic), *vj = disc_values(b[j], p->string, &jc);
                told = vi && vj && !values_overlap(vi, ic, vj, jc);
            }
            if (!told) return 0;
        }
    return 1;
}

static int compile_obj_schema(struct sc *c, const cJSON *s) {
    gir *g = c->g;
    for (const cJSON *k = s->child; k; k = k->next) {
        if (is_in(k->string, k_unsupported)) {
            if (!strcmp(k->string, "uniqueItems") && cJSON_IsFalse(k)) continue;
            if (!strcmp(k->string, "minProperties") && cJSON_IsNumber(k) && k->valuedouble <= 0) continue;
            return serr(c, GERBIL_ERR_UNSUPPORTED, "keyword \"%s\" cannot be enforced", k->string);
        }
    }
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    if (cJSON_IsString(ref)) {
        int only = 1;
        for (const cJSON *k = s->child; k; k = k->next)
            if (strcmp(k->string, "$ref") && !is_in(k->string, k_annotations)) only = 0;
        if (only) return compile_ref(c, ref->valuestring);
        /* siblings: allOf [target, rest] */
        cJSON *rest = own(c, cJSON_Duplicate(s, 1));
        if (!rest) return -1;
        cJSON_DeleteItemFromObjectCaseSensitive(rest, "$ref");
        const cJSON *t = resolve_ref(c, ref->valuestring);
        if (!t) return -1;
        cJSON *m = merge(c, t, rest);
        if (!m) return -1;
        own(c, m);
        return compile(c, m);
    }
    const cJSON *all = cJSON_GetObjectItemCaseSensitive(s, "allOf");
    if (cJSON_IsArray(all)) {
        cJSON *m = own(c, cJSON_Duplicate(s, 1));
        if (!m) return -1;
        cJSON_DeleteItemFromObjectCaseSensitive(m, "allOf");
        cJSON *acc = m;
        for (const cJSON *x = all->child; x; x = x->next) {
            cJSON *nm = merge(c, acc, x);
            if (!nm) return -1;
            acc = own(c, nm);
        }
        return compile(c, acc);
    }
    const char *alt_kw = cJSON_GetObjectItemCaseSensitive(s, "anyOf") ? "anyOf" : cJSON_GetObjectItemCaseSensitive(s, "oneOf") ? "oneOf" : NULL;
    if (alt_kw) {
        if (cJSON_GetObjectItemCaseSensitive(s, "anyOf") && cJSON_GetObjectItemCaseSensitive(s, "oneOf"))
            return serr(c, GERBIL_ERR_UNSUPPORTED, "%s", "anyOf together with oneOf");
        const cJSON *alts = cJSON_GetObjectItemCaseSensitive(s, alt_kw);
        cJSON *base = own(c, cJSON_Duplicate(s, 1));
        if (!base) return -1;
        cJSON_DeleteItemFromObjectCaseSensitive(base, alt_kw);
        int has_more = 0;
        for (const cJSON *k = base->child; k; k = k->next)
            if (!is_in(k->string, k_annotations)) has_more = 1;
        if (!strcmp(alt_kw, "oneOf") && !one_of_disjoint(c, base, alts, has_more)) {
            if (c->err == GERBIL_OK)
                serr(c, GERBIL_ERR_UNSUPPORTED, "%s", "oneOf whose alternatives may overlap (exactly-one cannot be enforced)");
            return -1;
        }
        int r = gir_rule(g, NULL);
        g->rules[r].defined = 1;
        gseq sq = {0};
        for (const cJSON *x = alts->child; x; x = x->next) {
            int b;
            if (has_more) {
                cJSON *m = merge(c, base, x);
                if (!m) { gseq_free(&sq); return -1; }
                b = compile(c, own(c, m));
            } else {
                b = compile(c, x);
            }
            if (b < 0) { gseq_free(&sq); return -1; }
            gseq_rule(&sq, b);
            gir_alt(g, r, &sq);
        }
        gseq_free(&sq);
        return r;
    }
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    const cJSON *cn = cJSON_GetObjectItemCaseSensitive(s, "const");
    if (en || cn) {
        int r = gir_rule(g, NULL);
        g->rules[r].defined = 1;
        gseq sq = {0};
        int tm = type_mask_of(cJSON_GetObjectItemCaseSensitive(s, "type"));
        if (cn) {
            gseq_rule(&sq, value_lit(c, cn));
            gir_alt(g, r, &sq);
        } else {
            if (!cJSON_IsArray(en)) return serr(c, GERBIL_ERR_FORMAT, "%s", "enum must be an array");
            for (const cJSON *x = en->child; x; x = x->next) {
                int bit = cJSON_IsNull(x) ? T_NULL : cJSON_IsBool(x) ? T_BOOL : cJSON_IsString(x) ? T_STRING
                        : cJSON_IsNumber(x) ? (x->valuedouble == floor(x->valuedouble) ? T_NUMBER | T_INTEGER : T_NUMBER)
                        : cJSON_IsArray(x) ? T_ARRAY : T_OBJECT;
                if (!(bit & tm)) continue; /* excluded by "type" */
                gseq_rule(&sq, value_lit(c, x));
                gir_alt(g, r, &sq);
            }
        }
        gseq_free(&sq);
        return r;
    }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "type");
    int tm;
    if (t) {
        tm = type_mask_of(t);
        if (!tm) return serr(c, GERBIL_ERR_FORMAT, "%s", "\"type\" names no known type");
    } else {
        /* no type: infer from the keywords present, else any value */
        tm = 0;
        if (cJSON_GetObjectItemCaseSensitive(s, "properties") || cJSON_GetObjectItemCaseSensitive(s, "required") ||
            cJSON_GetObjectItemCaseSensitive(s, "additionalProperties") || cJSON_GetObjectItemCaseSensitive(s, "patternProperties"))
            tm |= T_OBJECT;
        if (cJSON_GetObjectItemCaseSensitive(s, "items") || cJSON_GetObjectItemCaseSensitive(s, "prefixItems") ||
            cJSON_GetObjectItemCaseSensitive(s, "minItems") || cJSON_GetObjectItemCaseSensitive(s, "maxItems"))
            tm |= T_ARRAY;
        if (cJSON_GetObjectItemCaseSensitive(s, "pattern") || cJSON_GetObjectItemCaseSensitive(s, "format") ||
            cJSON_GetObjectItemCaseSensitive(s, "minLength") || cJSON_GetObjectItemCaseSensitive(s, "maxLength"))
            tm |= T_STRING;
        if (cJSON_GetObjectItemCaseSensitive(s, "minimum") || cJSON_GetObjectItemCaseSensitive(s, "maximum") ||
            cJSON_GetObjectItemCaseSensitive(s, "exclusiveMinimum") || cJSON_GetObjectItemCaseSensitive(s, "exclusiveMaximum") ||
            cJSON_GetObjectItemCaseSensitive(s, "multipleOf"))
            tm |= T_NUMBER;
        if (!tm) return c->r_value;
        /* a keyword only restricts values of its own type: the other types stay allowed */
        tm = T_ALL;
    }
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(s, "nullable"))) tm |= T_NULL;
    if ((tm & T_NUMBER) && (tm & T_INTEGER)) tm &= ~T_INTEGER;
    int r = gir_rule(g, NULL);
    g->rules[r].defined = 1;
    gseq sq = {0};
    int parts[7], np = 0;
    if (tm & T_NULL) parts[np++] = gir_rule_lit(g, "null", 4);
    if (tm & T_BOOL) {
        int b = gir_rule(g, NULL);
        lit(c, &sq, "true");
        gir_alt(g, b, &sq);
        lit(c, &sq, "false");
        gir_alt(g, b, &sq);
        parts[np++] = b;
    }
    if (tm & T_OBJECT) parts[np++] = compile_object(c, s);
    if (tm & T_ARRAY) parts[np++] = compile_array(c, s);
    if (tm & T_STRING) parts[np++] = compile_string(c, s);
    if (tm & T_NUMBER) parts[np++] = compile_number(c, s);
    if (tm & T_INTEGER) parts[np++] = compile_integer(c, s);
    for (int i = 0; i < np; i++) {
        if (parts[i] < 0) { gseq_free(&sq); return -1; }
        gseq_rule(&sq, parts[i]);
        gir_alt(g, r, &sq);
    }
    gseq_free(&sq);
    return r;
}

static int compile(struct sc *c, const cJSON *s) {
    if (c->err != GERBIL_OK) return -1;
    if (cJSON_IsTrue(s)) return c->r_value;
    if (cJSON_IsFalse(s)) { int r = gir_rule(c->g, NULL); c->g->rules[r].defined = 1; return r; }
    if (!cJSON_IsObject(s)) return serr(c, GERBIL_ERR_FORMAT, "%s", "a schema must be an object or a boolean");
    if (++c->depth > 64) { c->depth--; return serr(c, GERBIL_ERR_UNSUPPORTED, "%s", "schema nested deeper than 64 (without $ref)"); }
    int r = compile_obj_schema(c, s);
    c->depth--;
    return r;
}

int gir_json_value(gir *g, const gschema_opts *o) {
    struct sc c = {.g = g, .o = *o};
    build_common(&c);
    return c.r_value;
}

static int wrap_root(struct sc *c, int body) {
    gseq s = {0};
    ws(c, &s);
    gseq_rule(&s, body);
    ws(c, &s);
    int r = one(c, &s);
    gseq_free(&s);
    return r;
}

int gir_json_object(gir *g, const gschema_opts *o) {
    struct sc c = {.g = g, .o = *o};
    build_common(&c);
    return wrap_root(&c, c.r_object);
}

gerbil_status gir_from_schema(gir *g, const cJSON *schema, const gschema_opts *o) {
    struct sc c = {.g = g, .o = *o, .root = schema, .err = GERBIL_OK};
    build_common(&c);
    int body = compile(&c, schema);
    for (int i = 0; i < c.n_refs; i++) free(c.refs[i].ref);
    free(c.refs);
    cJSON_Delete(c.owned);
    if (c.err != GERBIL_OK) return c.err;
    if (body < 0 || g->oom) return err_set(GERBIL_ERR_NOMEM, "JSON Schema: out of memory");
    g->root = wrap_root(&c, body);
    return GERBIL_OK;
}
