/* The grammar engine against references:
 *  - regexes against PCRE2 on random strings: full matches, and every prefix the engine
 *    accepts is one PCRE2 calls a (hard) partial match, and the reverse;
 *  - JSON Schema constraints on random token walks (the stories260K vocabulary): every
 *    finished walk parses (cJSON) and validates (a small validator for the keywords used
 *    here); the mask agrees with accept_token; hand-written valid documents are accepted and
 *    complete, invalid ones rejected or incomplete;
 *  - integer ranges against arithmetic; GBNF parsing; errors naming what is unsupported. */
#include "gerbil.h"
#include "test.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

static const char *TOK = "../shared/data/models/stories260K/hf";
static gerbil_grammar_vocab_t voc;
static gerbil_tokenizer_t tok;

static gerbil_grammar_t compile(gerbil_grammar_kind k, const char *src, int compact) {
    gerbil_grammar_params p = gerbil_grammar_default_params();
    p.compact = compact;
    gerbil_grammar_t g = NULL;
    gerbil_status st = gerbil_grammar_compile(voc, k, src, strlen(src), &p, &g);
    if (st != GERBIL_OK) fprintf(stderr, "compile failed: %s: %s\n", src, gerbil_last_error());
    return g;
}

/* 1 full match, 2 viable prefix, 0 dead */
static int engine_verdict(gerbil_grammar_t g, const char *s, size_t n) {
    gerbil_grammar_state_t st;
    gerbil_grammar_state_new(g, &st);
    size_t k = gerbil_grammar_accept_bytes(st, s, n);
    int r = k < n ? 0 : gerbil_grammar_is_accepting(st) ? 1 : 2;
    gerbil_grammar_state_free(st);
    return r;
}

static int pcre_verdict(pcre2_code *re, pcre2_match_data *md, const char *s, size_t n) {
    int rc = pcre2_match(re, (PCRE2_SPTR)s, n, 0, 0, md, NULL);
    if (rc >= 0) return 1;
    rc = pcre2_match(re, (PCRE2_SPTR)s, n, 0, PCRE2_PARTIAL_HARD, md, NULL);
    return rc == PCRE2_ERROR_PARTIAL ? 2 : 0;
}

static int utf8_valid(const char *p, size_t n) {
    const unsigned char *u = (const unsigned char *)p;
    for (size_t i = 0; i < n;) {
        int len = u[i] < 0x80 ? 1 : (u[i] & 0xE0) == 0xC0 ? 2 : (u[i] & 0xF0) == 0xE0 ? 3 : (u[i] & 0xF8) == 0xF0 ? 4 : 0;
        if (!len || i + (size_t)len > n) return 0;
        for (int k = 1; k < len; k++)
            if ((u[i + (size_t)k] & 0xC0) != 0x80) return 0;
        i += (size_t)len;
    }
    return 1;
}

static void test_regex_vs_pcre2(void) {
    static const struct { const char *re, *alpha; } cases[] = {
        {"[a-c]+x?", "abcx"},
        {"(ab|a)(bc|c)*", "abc"},
        {"a{2,4}b{0,2}", "ab"},
        {"\\d{3}-\\d{2,}", "0123-"},
        {"(fo|ba)+z", "fobaz"},
        {"[^abc]x", "abcxy"},
        {"\\w+@\\w\\.(co|o)", "a@.o"},
        {"(a|b)*abb", "ab"},
        {"x(y(z|w)?)+", "xyzw"},
        {"[0-9a-f]{2}(:[0-9a-f]{2}){0,3}", "0af:g"},
        {"(\\+|-)?(0|[1-9][0-9]*)(\\.[0-9]+)?", "+-0129."},
        {"é+[ü-ÿ]?", "\xc3\xa9\xc3\xbc\xc3\xbf\xc3"},
        {"a.c", "abc\xc3\xa9\n"},
        {"(?:ab){2}|c+", "abc"},
        {"\\s*[A-Z][a-z]{1,3}\\s*", " \tAbZ"},
        {"[\\u0041-\\u0043]\\x41", "ABCD"},
    };
    unsigned long long seed = 42;
    pcre2_match_data *md = pcre2_match_data_create(4, NULL);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        gerbil_grammar_t g = compile(GERBIL_GRAMMAR_REGEX, cases[c].re, 0);
        CHECKF(g != NULL, "%s", cases[c].re);
        if (!g) continue;
        char pat[512];
        snprintf(pat, sizeof pat, "^(?:%s)\\z", cases[c].re);
        int e;
        PCRE2_SIZE eo;
        pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_ALT_BSUX, &e, &eo, NULL);
        CHECK(re != NULL);
        const char *al = cases[c].alpha;
        size_t na = strlen(al);
        int mismatches = 0, full = 0;
        for (int t = 0; t < 8000; t++) {
            char s[32];
            size_t n = test_rand_u64(&seed) % 12;
            for (size_t i = 0; i < n; i++) s[i] = al[test_rand_u64(&seed) % na];
            /* PCRE2 with UTF needs valid UTF-8 */
            if (!utf8_valid(s, n) || n == 0) continue; /* PCRE2 reports no partial match of "" */
            int pv = pcre_verdict(re, md, s, n);
            int ev = engine_verdict(g, s, n);
            full += pv == 1;
            if (ev != pv) {
                if (mismatches++ < 3)
                    fprintf(stderr, "/%s/ on \"%.*s\": engine %d, PCRE2 %d\n", cases[c].re, (int)n, s, ev, pv);
            }
        }
        CHECKF(mismatches == 0, "/%s/: %d mismatches", cases[c].re, mismatches);
        CHECKF(full > 0, "/%s/: no random string matched (test too weak)", cases[c].re);
        pcre2_code_free(re);
        gerbil_grammar_free(g);
    }
    pcre2_match_data_free(md);
}

/* ---- a small validator for the schema keywords the walks use ---- */
static int validate(const cJSON *s, const cJSON *v, const cJSON *root);

static int type_ok(const char *t, const cJSON *v) {
    if (!strcmp(t, "object")) return cJSON_IsObject(v);
    if (!strcmp(t, "array")) return cJSON_IsArray(v);
    if (!strcmp(t, "string")) return cJSON_IsString(v);
    if (!strcmp(t, "number")) return cJSON_IsNumber(v);
    if (!strcmp(t, "integer")) return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble);
    if (!strcmp(t, "boolean")) return cJSON_IsBool(v);
    if (!strcmp(t, "null")) return cJSON_IsNull(v);
    return 0;
}

static size_t utf8_chars(const char *s) {
    size_t n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

static int validate(const cJSON *s, const cJSON *v, const cJSON *root) {
    if (cJSON_IsTrue(s)) return 1;
    if (cJSON_IsFalse(s)) return 0;
    const cJSON *x;
    if ((x = cJSON_GetObjectItem(s, "$ref"))) {
        const char *r = x->valuestring; /* "#/$defs/NAME" only */
        const cJSON *d = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "$defs"), strrchr(r, '/') + 1);
        if (!validate(d, v, root)) return 0;
    }
    if ((x = cJSON_GetObjectItem(s, "type"))) {
        int ok = 0;
        if (cJSON_IsString(x)) ok = type_ok(x->valuestring, v);
        else for (const cJSON *t = x->child; t; t = t->next) ok |= type_ok(t->valuestring, v);
        if (!ok) return 0;
    }
    if ((x = cJSON_GetObjectItem(s, "enum"))) {
        int ok = 0;
        for (const cJSON *e = x->child; e; e = e->next) ok |= cJSON_Compare(e, v, 1);
        if (!ok) return 0;
    }
    if ((x = cJSON_GetObjectItem(s, "const")) && !cJSON_Compare(x, v, 1)) return 0;
    if ((x = cJSON_GetObjectItem(s, "anyOf"))) {
        int ok = 0;
        for (const cJSON *e = x->child; e; e = e->next) ok |= validate(e, v, root);
        if (!ok) return 0;
    }
    if (cJSON_IsNumber(v)) {
        double d = v->valuedouble;
        if ((x = cJSON_GetObjectItem(s, "minimum")) && d < x->valuedouble) return 0;
        if ((x = cJSON_GetObjectItem(s, "maximum")) && d > x->valuedouble) return 0;
        if ((x = cJSON_GetObjectItem(s, "exclusiveMinimum")) && d <= x->valuedouble) return 0;
        if ((x = cJSON_GetObjectItem(s, "exclusiveMaximum")) && d >= x->valuedouble) return 0;
    }
    if (cJSON_IsString(v)) {
        size_t n = utf8_chars(v->valuestring);
        if ((x = cJSON_GetObjectItem(s, "minLength")) && n < (size_t)x->valuedouble) return 0;
        if ((x = cJSON_GetObjectItem(s, "maxLength")) && n > (size_t)x->valuedouble) return 0;
    }
    if (cJSON_IsArray(v)) {
        int n = cJSON_GetArraySize(v);
        if ((x = cJSON_GetObjectItem(s, "minItems")) && n < x->valuedouble) return 0;
        if ((x = cJSON_GetObjectItem(s, "maxItems")) && n > x->valuedouble) return 0;
        const cJSON *items = cJSON_GetObjectItem(s, "items");
        if (items)
            for (const cJSON *e = v->child; e; e = e->next)
                if (!validate(items, e, root)) return 0;
    }
    if (cJSON_IsObject(v)) {
        const cJSON *props = cJSON_GetObjectItem(s, "properties"), *addl = cJSON_GetObjectItem(s, "additionalProperties");
        for (const cJSON *r = cJSON_GetObjectItem(s, "required") ? cJSON_GetObjectItem(s, "required")->child : NULL; r; r = r->next)
            if (!cJSON_GetObjectItemCaseSensitive(v, r->valuestring)) return 0;
        for (const cJSON *m = v->child; m; m = m->next) {
            /* no duplicate keys */
            for (const cJSON *o = m->next; o; o = o->next)
                if (!strcmp(o->string, m->string)) return 0;
            const cJSON *ps = props ? cJSON_GetObjectItemCaseSensitive(props, m->string) : NULL;
            if (ps) { if (!validate(ps, m, root)) return 0; }
            else if (addl && !validate(addl, m, root)) return 0;
        }
    }
    return 1;
}

static const char *const walk_schemas[] = {
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":-5,\"maximum\":300},"
    "\"b\":{\"type\":\"string\",\"maxLength\":4},\"c\":{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"minItems\":1,"
    "\"maxItems\":3}},\"required\":[\"a\"],\"additionalProperties\":false}",
    "{\"type\":\"object\",\"properties\":{\"k\":{\"enum\":[\"x\",1,null,[1,2]]}},\"additionalProperties\":{\"type\":\"number\"}}",
    "{\"$ref\":\"#/$defs/n\",\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\",\"exclusiveMinimum\":0,"
    "\"exclusiveMaximum\":50},\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/n\"},\"maxItems\":2}},\"required\":[\"v\"],"
    "\"additionalProperties\":false}}}",
    "{\"anyOf\":[{\"type\":\"string\",\"minLength\":2,\"maxLength\":3},{\"type\":[\"null\",\"boolean\"]},{\"const\":{\"q\":[true]}}]}",
    "{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"}},\"required\":[\"id\"]}},\"maxItems\":3}",
};

static int has_any(const char *p, size_t n, const char *set) {
    for (size_t i = 0; i < n; i++)
        if (strchr(set, p[i])) return 1;
    return 0;
}

static void test_walks(void) {
    unsigned long long seed = 7;
    int words = (gerbil_grammar_vocab_n(voc) + 63) / 64;
    uint64_t *mask = malloc((size_t)words * 8);
    int32_t eos = gerbil_tokenizer_eos(tok);
    /* tokens that tend to end a value: the walks prefer them after a while */
    uint8_t *closing = calloc((size_t)gerbil_grammar_vocab_n(voc), 1);
    for (int id = 0; id < gerbil_grammar_vocab_n(voc) && id < gerbil_tokenizer_n_vocab(tok); id++) {
        char *t;
        size_t tl;
        int32_t one = id;
        if (gerbil_detokenize(tok, &one, 1, 0, &t, &tl) != GERBIL_OK) continue;
        closing[id] = id == eos || has_any(t, tl, "\"]},0123456789el");
        free(t);
    }
    for (size_t si = 0; si < sizeof walk_schemas / sizeof walk_schemas[0]; si++) {
        cJSON *schema = cJSON_Parse(walk_schemas[si]);
        for (int compact = 0; compact < 2; compact++) {
            gerbil_grammar_t g = compile(GERBIL_GRAMMAR_JSON_SCHEMA, walk_schemas[si], compact);
            CHECK(g != NULL);
            if (!g) continue;
            int finished = 0, bad = 0, mask_disagree = 0;
            for (int w = 0; w < 100; w++) {
                gerbil_grammar_state_t st;
                gerbil_grammar_state_new(g, &st);
                int32_t ids[512];
                int n_ids = 0;
                int done = 0;
                for (int step = 0; step < 400 && !done; step++) {
                    gerbil_grammar_mask(st, mask);
                    int32_t cand[1024];
                    int nc = 0, nclose = 0;
                    int32_t close[1024];
                    for (int id = 0; id < gerbil_grammar_vocab_n(voc); id++)
                        if ((mask[id >> 6] >> (id & 63)) & 1) {
                            cand[nc++] = id;
                            if (closing[id]) close[nclose++] = id;
                        }
                    if (nc == 0) { bad++; fprintf(stderr, "dead end after %d tokens\n", n_ids); break; }
                    /* a disallowed token must be refused */
                    int32_t r = (int32_t)(test_rand_u64(&seed) % (uint64_t)gerbil_grammar_vocab_n(voc));
                    if (!((mask[r >> 6] >> (r & 63)) & 1)) {
                        gerbil_grammar_state_t cp;
                        gerbil_grammar_state_new(g, &cp);
                        gerbil_grammar_state_copy(cp, st);
                        if (gerbil_grammar_accept_token(cp, r) == GERBIL_OK) mask_disagree++;
                        gerbil_grammar_state_free(cp);
                    }
                    int32_t id = (step > 20 && nclose && test_rand_u64(&seed) % 4) ? close[test_rand_u64(&seed) % (uint64_t)nclose]
                                                                                  : cand[test_rand_u64(&seed) % (uint64_t)nc];
                    if (gerbil_grammar_is_accepting(st) && step > 30 && test_rand_u64(&seed) % 2) id = eos;
                    if (gerbil_grammar_accept_token(st, id) != GERBIL_OK) { mask_disagree++; break; }
                    if (id == eos) { done = 1; break; }
                    ids[n_ids++] = id;
                }
                if (done) {
                    finished++;
                    char *text;
                    size_t len;
                    gerbil_detokenize(tok, ids, n_ids, 1, &text, &len);
                    cJSON *v = cJSON_ParseWithLength(text, len);
                    if (!v || !validate(schema, v, schema)) {
                        bad++;
                        if (bad < 4) fprintf(stderr, "schema %zu: invalid walk: \"%.*s\"\n", si, (int)len, text);
                    }
                    cJSON_Delete(v);
                    free(text);
                }
                gerbil_grammar_state_free(st);
            }
            CHECKF(bad == 0, "schema %zu compact %d: %d bad walks", si, compact, bad);
            CHECKF(mask_disagree == 0, "schema %zu: mask and accept_token disagree %d times", si, mask_disagree);
            CHECKF(finished >= 20, "schema %zu compact %d: only %d of 100 walks finished", si, compact, finished);
            gerbil_grammar_free(g);
        }
        cJSON_Delete(schema);
    }
    free(closing);
    free(mask);
}

static int doc_ok(gerbil_grammar_t g, const char *doc) { return engine_verdict(g, doc, strlen(doc)) == 1; }

static void test_documents(void) {
    static const struct { int schema; const char *doc; int valid; } d[] = {
        {0, "{\"a\": 5}", 1}, {0, "{\"a\":-5,\"b\":\"abcd\",\"c\":[true, false]}", 1}, {0, "{ \"a\" : 300 , \"c\" : [ false ] }", 1},
        {0, "{\"a\": 301}", 0}, {0, "{\"a\": -6}", 0}, {0, "{\"b\": \"x\"}", 0}, {0, "{\"a\": 1, \"b\": \"abcde\"}", 0},
        {0, "{\"a\": 1, \"c\": []}", 0}, {0, "{\"a\": 1, \"d\": 1}", 0}, {0, "{\"a\": 1.5}", 0},
        {0, "{\"a\": 1, \"c\": [true, true, true, true]}", 0}, {0, "{\"a\": 1,}", 0},
        {1, "{}", 1}, {1, "{\"k\": [1, 2]}", 1}, {1, "{\"k\": null, \"z\": -1.5e3}", 1}, {1, "{\"zz\": 2, \"k2\": 3}", 1},
        {1, "{\"k\": 2}", 0}, {1, "{\"z\": \"s\"}", 0}, {1, "{\"k\": \"x\", \"k\": \"x\"}", 0},
        {2, "{\"v\": 1, \"kids\": [{\"v\": 49}, {\"v\": 2, \"kids\": []}]}", 1}, {2, "{\"v\": 50}", 0}, {2, "{\"v\": 0}", 0},
        {2, "{\"v\": 1, \"kids\": [{\"v\": 1}, {\"v\": 1}, {\"v\": 1}]}", 0},
        {3, "\"ab\"", 1}, {3, "null", 1}, {3, "{\"q\": [true]}", 1}, {3, "\"a\"", 0}, {3, "\"abcd\"", 0}, {3, "1", 0},
        {3, "\"\\u00e9\\n\"", 1}, {3, "\"é\xc3\xa9\"", 1},
        {4, "[{\"id\": 1, \"x\": {}}, {\"id\": -0}]", 1}, {4, "[{}]", 0}, {4, "[]", 1},
    };
    gerbil_grammar_t g[5];
    /* (cJSON reads leading zeros, so this one is outside the table) */
    {
        gerbil_grammar_t z = compile(GERBIL_GRAMMAR_JSON_SCHEMA, walk_schemas[0], 0);
        CHECK(z && !doc_ok(z, "{\"a\": 01}"));
        gerbil_grammar_free(z);
    }
    for (int i = 0; i < 5; i++) g[i] = compile(GERBIL_GRAMMAR_JSON_SCHEMA, walk_schemas[i], 0);
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) {
        /* the reference: the validator above on cJSON's parse */
        cJSON *s = cJSON_Parse(walk_schemas[d[i].schema]), *v = cJSON_Parse(d[i].doc);
        int ref = v && validate(s, v, s);
        CHECKF(ref == d[i].valid, "reference validator on %s", d[i].doc);
        CHECKF(doc_ok(g[d[i].schema], d[i].doc) == d[i].valid, "schema %d, %s: expected %s", d[i].schema, d[i].doc,
               d[i].valid ? "accepted" : "rejected");
        cJSON_Delete(s);
        cJSON_Delete(v);
    }
    for (int i = 0; i < 5; i++) gerbil_grammar_free(g[i]);
}

static void test_int_ranges(void) {
    static const long long r[][2] = {{0, 0}, {-5, 300}, {7, 12}, {-120, -3}, {99, 1001}, {1, 9}, {-1, 1}, {10, 10}, {-999, 999}};
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++) {
        char s[200];
        snprintf(s, sizeof s, "{\"type\":\"integer\",\"minimum\":%lld,\"maximum\":%lld}", r[i][0], r[i][1]);
        gerbil_grammar_t g = compile(GERBIL_GRAMMAR_JSON_SCHEMA, s, 1);
        CHECK(g != NULL);
        if (!g) continue;
        int bad = 0;
        for (long long x = r[i][0] - 1100; x <= r[i][1] + 1100; x++) {
            char t[32];
            snprintf(t, sizeof t, "%lld", x);
            if (doc_ok(g, t) != (x >= r[i][0] && x <= r[i][1])) {
                if (bad++ < 3) fprintf(stderr, "[%lld, %lld]: %lld wrong\n", r[i][0], r[i][1], x);
            }
        }
        CHECKF(bad == 0, "integer range [%lld, %lld]: %d wrong", r[i][0], r[i][1], bad);
        CHECK(!doc_ok(g, "-0") || r[i][0] <= 0);
        gerbil_grammar_free(g);
    }
    /* one-sided */
    gerbil_grammar_t g = compile(GERBIL_GRAMMAR_JSON_SCHEMA, "{\"type\":\"integer\",\"minimum\":15}", 1);
    CHECK(doc_ok(g, "15") && doc_ok(g, "16") && doc_ok(g, "100") && doc_ok(g, "123456789012345678901234"));
    CHECK(!doc_ok(g, "14") && !doc_ok(g, "-20") && !doc_ok(g, "0") && !doc_ok(g, "015"));
    gerbil_grammar_free(g);
    g = compile(GERBIL_GRAMMAR_JSON_SCHEMA, "{\"type\":\"integer\",\"exclusiveMaximum\":-3}", 1);
    CHECK(doc_ok(g, "-4") && doc_ok(g, "-400000000000") && !doc_ok(g, "-3") && !doc_ok(g, "0") && !doc_ok(g, "5"));
    gerbil_grammar_free(g);
}

static void test_gbnf(void) {
    const char *json_gbnf =
        "root   ::= object\n"
        "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
        "object ::=\n"
        "  \"{\" ws (\n"
        "            string \":\" ws value\n"
        "    (\",\" ws string \":\" ws value)*\n"
        "  )? \"}\" ws\n"
        "array  ::=\n"
        "  \"[\" ws (\n"
        "            value\n"
        "    (\",\" ws value)*\n"
        "  )? \"]\" ws\n"
        "string ::=\n"
        "  \"\\\"\" (\n"
        "    [^\"\\\\\\x7F\\x00-\\x1F] |\n"
        "    \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) # escapes\n"
        "  )* \"\\\"\" ws\n"
        "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws\n"
        "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";
    gerbil_grammar_t g = compile(GERBIL_GRAMMAR_GBNF, json_gbnf, 0);
    CHECK(g != NULL);
    if (g) {
        CHECK(doc_ok(g, "{\"a\": [1, 2.5, \"x\\n\"], \"b\": {}}"));
        CHECK(doc_ok(g, "{}"));
        CHECK(!doc_ok(g, "{\"a\" 1}"));
        CHECK(!doc_ok(g, "[1]"));
        gerbil_grammar_free(g);
    }
    g = compile(GERBIL_GRAMMAR_GBNF, "root ::= \"a\" b{2,3} | \"x\"+\nb ::= [0-9]\n", 0);
    CHECK(g && doc_ok(g, "a12") && doc_ok(g, "a123") && !doc_ok(g, "a1") && !doc_ok(g, "a1234") && doc_ok(g, "xxx"));
    gerbil_grammar_free(g);
    static const struct { const char *src, *msg; } errs[] = {
        {"root ::= foo\n", "foo"},
        {"root ::= root \"a\" | \"b\"\n", "left-recursive"},
        {"root ::= \"a\"\nroot ::= \"b\"\n", "defined twice"},
        {"root ::= \"a\n", "unterminated string"},
        {"rot ::= \"a\"\n", "root"},
        {"root ::= \"a\" [b\n", "unterminated"},
    };
    for (size_t i = 0; i < sizeof errs / sizeof errs[0]; i++) {
        gerbil_grammar_t e = NULL;
        gerbil_status st = gerbil_grammar_compile(voc, GERBIL_GRAMMAR_GBNF, errs[i].src, strlen(errs[i].src), NULL, &e);
        CHECKF(st != GERBIL_OK && e == NULL && strstr(gerbil_last_error(), errs[i].msg), "GBNF %s: %s", errs[i].src,
               gerbil_last_error());
    }
}

static void test_schema_errors(void) {
    static const struct { const char *schema, *msg; } errs[] = {
        {"{\"type\":\"string\",\"not\":{\"const\":\"a\"}}", "\"not\""},
        {"{\"type\":\"array\",\"uniqueItems\":true}", "uniqueItems"},
        {"{\"type\":\"number\",\"multipleOf\":0.5}", "multipleOf"},
        {"{\"type\":\"string\",\"format\":\"color\",\"maxLength\":3}", "color"},
        {"{\"type\":\"string\",\"pattern\":\"(?=a)b\"}", "lookaround"},
        {"{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", "backreference"},
        {"{\"$ref\":\"http://example.com/s.json\"}", "$ref"},
        {"{\"type\":\"object\",\"oneOf\":[{\"required\":[\"a\"]},{\"required\":[\"b\"]}]}", "oneOf"},
        {"{\"$ref\":\"#/$defs/missing\"}", "points nowhere"},
        {"{\"type\":\"object\",\"minProperties\":2}", "minProperties"},
        {"{\"type\":", "not valid JSON"},
        {"{\"if\":{},\"then\":{}}", "\"if\""},
        /* counts and bounds beyond int / long long (UB in the cast before) */
        {"{\"type\":\"string\",\"maxLength\":2e10}", "above 10000"},
        {"{\"type\":\"string\",\"minLength\":-3}", "non-negative"},
        {"{\"type\":\"array\",\"maxItems\":1e300}", "above 10000"},
        {"{\"type\":\"array\",\"minItems\":1.5}", "non-negative"},
        {"{\"type\":\"integer\",\"minimum\":-1e300}", "beyond 1e18"},
        {"{\"type\":\"integer\",\"exclusiveMaximum\":1e300}", "beyond 1e18"},
    };
    for (size_t i = 0; i < sizeof errs / sizeof errs[0]; i++) {
        gerbil_grammar_t e = NULL;
        gerbil_status st = gerbil_grammar_compile(voc, GERBIL_GRAMMAR_JSON_SCHEMA, errs[i].schema, strlen(errs[i].schema), NULL, &e);
        CHECKF(st != GERBIL_OK && e == NULL && strstr(gerbil_last_error(), errs[i].msg), "%s: %s", errs[i].schema,
               gerbil_last_error());
    }
    /* formats against hand-picked strings */
    static const struct { const char *fmt, *s; int ok; } f[] = {
        {"date", "\"2024-02-29\"", 1}, {"date", "\"2024-13-01\"", 0}, {"date", "\"2023-02-29\"", 0},
        {"date", "\"2000-02-29\"", 1}, {"date", "\"1900-02-29\"", 0}, {"date", "\"2020-04-31\"", 0}, {"date", "\"2020-12-31\"", 1}, {"uuid", "\"123e4567-e89b-12d3-a456-426614174000\"", 1},
        {"uuid", "\"123e4567e89b12d3a456426614174000\"", 0}, {"ipv4", "\"192.168.0.255\"", 1}, {"ipv4", "\"256.1.1.1\"", 0},
        {"ipv6", "\"::1\"", 1}, {"ipv6", "\"2001:db8::ff00:42:8329\"", 1}, {"ipv6", "\"1::2::3\"", 0},
        {"email", "\"a.b@example.com\"", 1}, {"email", "\"a@@b\"", 0}, {"date-time", "\"2024-01-02T03:04:05.5Z\"", 1},
        {"date-time", "\"2024-01-02 03:04\"", 0}, {"time", "\"23:59:59+01:00\"", 1}, {"hostname", "\"a-b.example\"", 1},
        {"hostname", "\"-a\"", 0}, {"uri", "\"https://example.com/a?b=c#d\"", 1}, {"uri", "\"no scheme\"", 0},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        char s[200];
        snprintf(s, sizeof s, "{\"type\":\"string\",\"format\":\"%s\"}", f[i].fmt);
        gerbil_grammar_t g = compile(GERBIL_GRAMMAR_JSON_SCHEMA, s, 1);
        CHECKF(g && doc_ok(g, f[i].s) == f[i].ok, "format %s on %s", f[i].fmt, f[i].s);
        gerbil_grammar_free(g);
    }
    /* an unknown format is an annotation; oneOf with disjoint branches is anyOf */
    gerbil_grammar_t u = compile(GERBIL_GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"format\":\"color\"}", 1);
    CHECK(u && doc_ok(u, "\"red\""));
    gerbil_grammar_free(u);
    u = compile(GERBIL_GRAMMAR_JSON_SCHEMA, "{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"integer\"},"
                "{\"type\":\"object\",\"properties\":{\"k\":{\"const\":1}},\"required\":[\"k\"]},"
                "{\"type\":\"object\",\"properties\":{\"k\":{\"enum\":[2,3]}},\"required\":[\"k\"]}]}", 1);
    CHECK(u && doc_ok(u, "\"a\"") && doc_ok(u, "5") && doc_ok(u, "{\"k\":3}") && !doc_ok(u, "{\"k\":4}"));
    gerbil_grammar_free(u);
    /* pattern: unanchored means "contains"; escapes in JSON strings */
    gerbil_grammar_t g = compile(GERBIL_GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"pattern\":\"ab+\"}", 1);
    CHECK(g && doc_ok(g, "\"xxabbby\"") && doc_ok(g, "\"ab\"") && !doc_ok(g, "\"a b\"") && doc_ok(g, "\"\\\"ab\""));
    gerbil_grammar_free(g);
    g = compile(GERBIL_GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"pattern\":\"^a\\\"$\"}", 1);
    CHECK(g && doc_ok(g, "\"a\\\"\"") && !doc_ok(g, "\"a\""));
    gerbil_grammar_free(g);
}

static void test_api(void) {
    gerbil_grammar_t g = compile(GERBIL_GRAMMAR_REGEX, "hello (world|there)", 0);
    gerbil_grammar_state_t s;
    gerbil_grammar_state_new(g, &s);
    char buf[32];
    size_t n = gerbil_grammar_forced_bytes(s, buf, sizeof buf);
    CHECK(n == 6 && !memcmp(buf, "hello ", 6));
    CHECK(!gerbil_grammar_is_accepting(s));
    CHECK(gerbil_grammar_accept_bytes(s, "hello w", 7) == 7);
    n = gerbil_grammar_forced_bytes(s, buf, sizeof buf);
    CHECK(n == 4 && !memcmp(buf, "orld", 4));
    CHECK(gerbil_grammar_accept_bytes(s, "orld", 4) == 4);
    CHECK(gerbil_grammar_is_accepting(s) && gerbil_grammar_is_finished(s));
    int words = gerbil_grammar_mask_words(g);
    uint64_t *m = calloc((size_t)words, 8);
    int32_t eos = gerbil_tokenizer_eos(tok);
    CHECK(gerbil_grammar_forced_token(s, m) == eos);
    CHECK(gerbil_grammar_accept_token(s, eos) == GERBIL_OK);
    gerbil_grammar_mask(s, m);
    int any = 0;
    for (int w = 0; w < words; w++) any |= m[w] != 0;
    CHECK(!any);
    CHECK(gerbil_grammar_accept_token(s, 300) != GERBIL_OK);
    gerbil_grammar_state_reset(s);
    CHECK(gerbil_grammar_accept_token(s, eos) != GERBIL_OK); /* EOS before the end */
    CHECK(gerbil_grammar_accept_token(s, -1) == GERBIL_ERR_INVALID_ARG);
    free(m);
    gerbil_grammar_state_free(s);
    gerbil_grammar_free(g);
}

/* Ambiguity: nested repetitions stay small (positions with equal rests are one), and a
 * grammar whose parser stacks really do multiply is refused with a clear error, not
 * followed into gigabytes (the fuzzer found ((\\+)+)+... spending minutes in node_rehash). */
static void test_ambiguity(void) {
    char re[256] = "", *w = re;
    for (int i = 0; i < 60; i++) *w++ = '(';
    *w++ = 'a';
    for (int i = 0; i < 60; i++) { *w++ = ')'; *w++ = '+'; }
    *w = 0;
    gerbil_grammar_t g = compile(GERBIL_GRAMMAR_REGEX, re, 0);
    CHECK(g != NULL);
    if (g) {
        CHECK(engine_verdict(g, "aaaaaaaaaaaaaaaaaaaa", 20) == 1);
        CHECK(engine_verdict(g, "aab", 3) == 0);
        gerbil_grammar_state_t s;
        gerbil_grammar_state_new(g, &s);
        uint64_t *m = calloc((size_t)gerbil_grammar_mask_words(g), 8);
        for (int i = 0; i < 40; i++) {
            CHECK(gerbil_grammar_mask(s, m) == GERBIL_OK);
            CHECK(gerbil_grammar_accept_bytes(s, "a", 1) == 1);
        }
        int n_nodes = 0;
        gerbil_grammar_stats(g, NULL, &n_nodes, NULL);
        CHECKF(n_nodes < 1000, "(...(a)+...)+ built %d parser stacks", n_nodes);
        free(m);
        gerbil_grammar_state_free(s);
        gerbil_grammar_free(g);
    }
    /* a^k then k of b|c: 2^k distinct stacks after k a's */
    static const char amb[] = "root ::= \"a\" root \"b\" | \"a\" root \"c\" | \"x\"";
    g = compile(GERBIL_GRAMMAR_GBNF, amb, 0);
    CHECK(g != NULL);
    if (g) {
        CHECK(engine_verdict(g, "aaxbc", 5) == 1);
        gerbil_grammar_state_t s;
        gerbil_grammar_state_new(g, &s);
        uint64_t *m = calloc((size_t)gerbil_grammar_mask_words(g), 8);
        gerbil_status st = GERBIL_OK;
        int i = 0;
        for (; i < 40 && st == GERBIL_OK; i++) {
            st = gerbil_grammar_mask(s, m);
            if (st == GERBIL_OK && gerbil_grammar_accept_bytes(s, "a", 1) != 1) break;
        }
        CHECKF(st == GERBIL_ERR_UNSUPPORTED && strstr(gerbil_last_error(), "too ambiguous"),
               "after %d a's: status %d, %s", i, (int)st, gerbil_last_error());
        CHECK(gerbil_grammar_accept_token(s, 300) != GERBIL_OK);
        free(m);
        gerbil_grammar_state_free(s);
        gerbil_grammar_free(g);
    }
}

/* Long counters share their masks past GIR_HORIZON bytes (grammar.h): every mask along a
 * walk, checked token by token against accepting that token's bytes, on the Llama 3
 * vocabulary (128k tokens, some 16-128 bytes long: the horizon roots). */
static void test_horizon(void) {
    static const char *LLAMA3 = "../shared/data/tokenizers/llama3";
    gerbil_tokenizer_t t3 = NULL;
    gerbil_grammar_vocab_t v3 = NULL;
    if (gerbil_tokenizer_load(LLAMA3, &t3) != GERBIL_OK || gerbil_grammar_vocab_new(t3, 0, NULL, 0, &v3) != GERBIL_OK) {
        fprintf(stderr, "test_horizon: %s not loadable: %s\n", LLAMA3, gerbil_last_error());
        CHECK(0);
        gerbil_tokenizer_free(t3);
        return;
    }
    static const struct { int kind; const char *src, *text; } cases[] = {
        {GERBIL_GRAMMAR_REGEX, "\"[a-z \\-]{0,40}\"", "\"a ----------------- ab ----------------x\""},
        {GERBIL_GRAMMAR_REGEX, "(ab|c){3,50}d", "abcabababccccababcabcababababababcd"},
        {GERBIL_GRAMMAR_JSON_SCHEMA, "{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\",\"maxLength\":30},"
                                     "\"n\":{\"type\":\"integer\"}},\"required\":[\"s\",\"n\"]}",
         "{\"s\": \"The quick brown fox, jumps ov\", \"n\": 12}"},
    };
    const int nv = gerbil_grammar_vocab_n(v3);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        gerbil_grammar_t g = NULL;
        gerbil_status st = gerbil_grammar_compile(v3, (gerbil_grammar_kind)cases[c].kind, cases[c].src, strlen(cases[c].src), NULL, &g);
        CHECKF(st == GERBIL_OK, "%s: %s", cases[c].src, gerbil_last_error());
        if (st != GERBIL_OK) continue;
        gerbil_grammar_state_t s, tmp;
        gerbil_grammar_state_new(g, &s);
        gerbil_grammar_state_new(g, &tmp);
        uint64_t *m = calloc((size_t)gerbil_grammar_mask_words(g), 8);
        const char *text = cases[c].text;
        int bad = 0, steps = 0;
        for (size_t i = 0; text[i] && !bad; i++) {
            if (gerbil_grammar_mask(s, m) != GERBIL_OK) { bad = 1; break; }
            for (int id = 0; id < nv && bad < 3; id++) {
                gerbil_grammar_state_copy(tmp, s);
                const int ok = gerbil_grammar_accept_token(tmp, id) == GERBIL_OK, bit = (int)((m[id >> 6] >> (id & 63)) & 1);
                if (ok != bit) {
                    if (!bad) fprintf(stderr, "%s after %zu bytes: token %d accepted %d, mask bit %d\n", cases[c].src, i, id, ok, bit);
                    bad++;
                }
            }
            steps++;
            CHECKF(gerbil_grammar_accept_bytes(s, text + i, 1) == 1, "%s: byte %zu of the text refused", cases[c].src, i);
        }
        CHECKF(!bad && steps > 30, "%s: masks differ from token acceptance (%d)", cases[c].src, bad);
        free(m);
        gerbil_grammar_state_free(tmp);
        gerbil_grammar_state_free(s);
        gerbil_grammar_free(g);
    }
    gerbil_grammar_vocab_free(v3);
    gerbil_tokenizer_free(t3);
}

/* gerbil_generate_object on stories260K at temperature 1: the JSON parses and validates */
static void test_generate_object(void) {
    gerbil_model_params mp = gerbil_model_default_params();
    mp.n_threads = 1;
    gerbil_model_t m;
    if (gerbil_model_load(TOK, &mp, &m) != GERBIL_OK) { CHECKF(0, "load: %s", gerbil_last_error()); return; }
    gerbil_session_params sp = gerbil_session_default_params();
    gerbil_session_t s;
    CHECK(gerbil_session_new(m, &sp, &s) == GERBIL_OK);
    int32_t eos[8];
    int n_eos = gerbil_model_eos_ids(m, eos, 8);
    gerbil_grammar_vocab_t mv;
    CHECK(gerbil_grammar_vocab_new(tok, gerbil_model_n_vocab(m), eos, n_eos, &mv) == GERBIL_OK);
    const char *schema = walk_schemas[0];
    cJSON *sj = cJSON_Parse(schema);
    int ok = 0, finished = 0;
    for (uint64_t seed = 1; seed <= 6; seed++) {
        gerbil_sampler_params p = gerbil_sampler_default_params();
        p.temperature = 1.0f;
        p.seed = seed;
        gerbil_sampler_t smp;
        gerbil_sampler_new(&p, gerbil_model_n_vocab(m), &smp);
        gerbil_session_reset(s);
        int32_t prompt[] = {1, 403, 407};
        gerbil_generate_params gp = gerbil_generate_default_params();
        gp.max_tokens = 200;
        gerbil_generate_result res;
        char *json = NULL;
        gerbil_status st = gerbil_generate_object(s, smp, tok, mv, prompt, 3, schema, &gp, &json, &res);
        if (st == GERBIL_OK) {
            finished++;
            cJSON *v = cJSON_Parse(json);
            if (v && validate(sj, v, sj)) ok++;
            else fprintf(stderr, "generate_object: invalid: %s\n", json);
            cJSON_Delete(v);
        } else {
            CHECKF(st == GERBIL_ERR_CONTEXT, "generate_object: %s", gerbil_last_error());
        }
        free(json);
        gerbil_sampler_free(smp);
    }
    CHECKF(finished >= 1 && ok == finished, "generate_object: %d finished, %d valid", finished, ok);
    cJSON_Delete(sj);
    gerbil_grammar_vocab_free(mv);
    gerbil_session_free(s);
    gerbil_model_free(m);
}

int main(void) {
    if (gerbil_tokenizer_load(TOK, &tok) != GERBIL_OK) SKIP("%s not found", TOK);
    if (gerbil_grammar_vocab_new(tok, 0, NULL, 0, &voc) != GERBIL_OK) { fprintf(stderr, "%s\n", gerbil_last_error()); return 1; }
    test_api();
    test_regex_vs_pcre2();
    test_int_ranges();
    test_gbnf();
    test_schema_errors();
    test_documents();
    test_walks();
    test_generate_object();
    test_ambiguity();
    test_horizon();
    gerbil_grammar_vocab_free(voc);
    gerbil_tokenizer_free(tok);
    return test_done();
}
