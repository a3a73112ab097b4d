/* gerbil serve's tool calling without a server (src/serve/tools.c): the format chosen from
 * each chat template in ../shared/data, the parser of every format on well-formed, parallel,
 * malformed and cut-off output (a call that does not parse leaves the text as content), the
 * streaming hold-back, and the grammar that forces a call: it compiles over a real tokenizer,
 * accepts the call text the parser reads and rejects arguments outside the schema. */
#include "serve/server.h"
#include "test.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

#define TPL "../shared/data/tokenizers/chat_templates/"

static const char *TOOLS =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":7}},"
    "\"required\":[\"city\"],\"additionalProperties\":false}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"get_time\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"zone\":{\"type\":\"string\"}}}}}]";

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) { free(s); s = NULL; }
    if (s) s[n] = 0;
    fclose(f);
    return s;
}

static void test_formats(void) {
    static const struct { const char *file; enum srv_tool_fmt f; } cases[] = {
        {"Qwen-Qwen3-0.6B.jinja", SRV_TOOLS_HERMES},
        {"Qwen3.5-4B.jinja", SRV_TOOLS_QWEN_XML},
        {"meta-llama-Llama-3.1-8B-Instruct.jinja", SRV_TOOLS_LLAMA3},
        {"meta-llama-Llama-3.2-3B-Instruct.jinja", SRV_TOOLS_LLAMA3},
        {"google-gemma-4-31B-it.jinja", SRV_TOOLS_NONE},   /* its own call syntax: stays content */
        {"google-gemma-2-2b-it.jinja", SRV_TOOLS_HERMES},  /* no tools in the template: the generic format */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[256];
        snprintf(path, sizeof path, TPL "%s", cases[i].file);
        char *src = slurp(path);
        if (!src) SKIP("%s not found", path);
        enum srv_tool_fmt f = srv_tool_format(src);
        CHECKF(f == cases[i].f, "%s: format %s, want %s", cases[i].file, srv_tool_format_name(f),
               srv_tool_format_name(cases[i].f));
        free(src);
    }
    CHECK(srv_tool_format(NULL) == SRV_TOOLS_HERMES);
    CHECK(srv_tool_format("{{ bos_token }}[TOOL_CALLS]") == SRV_TOOLS_MISTRAL);
}

/* Parse t in format f: want n calls (0: none, the text stays content), the first named name
 * with arguments args (compared as JSON), content before them want_content. */
static void parse(enum srv_tool_fmt f, const char *t, int parallel, int n, const char *name, const char *args,
                  const char *want_content) {
    cJSON *tools = cJSON_Parse(TOOLS);
    size_t ce = 0;
    cJSON *calls = srv_tool_parse(f, t, strlen(t), tools, parallel, 42, &ce);
    const int got = calls ? cJSON_GetArraySize(calls) : 0;
    CHECKF(got == n, "%s \"%s\": %d calls, want %d", srv_tool_format_name(f), t, got, n);
    if (!calls) {
        CHECKF(ce == strlen(t), "%s \"%s\": no calls but content cut at %zu", srv_tool_format_name(f), t, ce);
    } else {
        const cJSON *c0 = cJSON_GetArrayItem(calls, 0), *fn = cJSON_GetObjectItem(c0, "function");
        const cJSON *id = cJSON_GetObjectItem(c0, "id"), *ty = cJSON_GetObjectItem(c0, "type");
        CHECK(cJSON_IsString(id) && !strncmp(id->valuestring, "call_", 5));
        CHECK(cJSON_IsString(ty) && !strcmp(ty->valuestring, "function"));
        const cJSON *nm = cJSON_GetObjectItem(fn, "name"), *ar = cJSON_GetObjectItem(fn, "arguments");
        CHECKF(cJSON_IsString(nm) && !strcmp(nm->valuestring, name), "\"%s\": name %s, want %s", t,
               cJSON_IsString(nm) ? nm->valuestring : "?", name);
        CHECKF(cJSON_IsString(ar), "\"%s\": arguments must be a JSON string", t);
        if (cJSON_IsString(ar)) {
            cJSON *a = cJSON_Parse(ar->valuestring), *w = cJSON_Parse(args);
            CHECKF(a && w && cJSON_Compare(a, w, 1), "\"%s\": arguments %s, want %s", t, ar->valuestring, args);
            cJSON_Delete(a);
            cJSON_Delete(w);
        }
        CHECKF(ce == strlen(want_content) && !memcmp(t, want_content, ce), "\"%s\": content \"%.*s\", want \"%s\"", t,
               (int)ce, t, want_content);
        if (n == 2) { /* distinct ids */
            const char *i0 = cJSON_GetObjectItem(cJSON_GetArrayItem(calls, 0), "id")->valuestring;
            const char *i1 = cJSON_GetObjectItem(cJSON_GetArrayItem(calls, 1), "id")->valuestring;
            CHECK(strcmp(i0, i1));
        }
    }
    cJSON_Delete(calls);
    cJSON_Delete(tools);
}

static void test_parsers(void) {
    const enum srv_tool_fmt H = SRV_TOOLS_HERMES, X = SRV_TOOLS_QWEN_XML, L = SRV_TOOLS_LLAMA3, M = SRV_TOOLS_MISTRAL;
    /* Hermes / Qwen3 */
    parse(H, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", 1, 1,
          "get_weather", "{\"city\":\"Paris\"}", "");
    parse(H, "Let me check.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 2}}\n"
             "</tool_call>", 1, 1, "get_weather", "{\"city\":\"Oslo\",\"days\":2}", "Let me check.");
    parse(H, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"A\"}}\n</tool_call>\n<tool_call>\n"
             "{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>", 1, 2, "get_weather", "{\"city\":\"A\"}", "");
    parse(H, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"A\"}}\n</tool_call>\n<tool_call>\n"
             "{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>", 0, 1, "get_weather", "{\"city\":\"A\"}", "");
    parse(H, "<tool_call>{\"name\": \"get_time\", \"arguments\": \"{\\\"zone\\\": \\\"UTC\\\"}\"}</tool_call>", 1, 1,
          "get_time", "{\"zone\":\"UTC\"}", ""); /* arguments as a string of JSON */
    parse(H, "Just an answer.", 1, 0, NULL, NULL, NULL);
    parse(H, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par", 1, 0, NULL, NULL, NULL); /* cut off */
    parse(H, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"P\"}}\n", 1, 0, NULL, NULL, NULL); /* no close */
    parse(H, "<tool_call>\n{\"arguments\": {}}\n</tool_call>", 1, 0, NULL, NULL, NULL);                  /* no name */
    parse(H, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": [1]}\n</tool_call>", 1, 0, NULL, NULL, NULL); /* not an object */
    parse(H, "<tool_call>\nnot json\n</tool_call>", 1, 0, NULL, NULL, NULL);
    parse(H, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call> and then more text", 1, 0, NULL, NULL, NULL);
    parse(H, "", 1, 0, NULL, NULL, NULL);
    /* Qwen3.5 XML: string parameters stay strings, others are JSON */
    parse(X, "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n3\n"
             "</parameter>\n</function>\n</tool_call>", 1, 1, "get_weather", "{\"city\":\"New York\",\"days\":3}", "");
    parse(X, "Sure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n</parameter>\n</function>\n</tool_call>",
          1, 1, "get_weather", "{\"city\":\"42\"}", "Sure.");
    parse(X, "<tool_call>\n<function=get_time>\n</function>\n</tool_call>", 1, 1, "get_time", "{}", "");
    parse(X, "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome", 1, 0, NULL, NULL, NULL);
    parse(X, "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n</tool_call>", 1, 0, NULL, NULL, NULL);
    parse(X, "<tool_call>\n<function=>\n</function>\n</tool_call>", 1, 0, NULL, NULL, NULL);
    /* Llama 3: a bare JSON call of a known function */
    parse(L, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Lima\"}}", 1, 1, "get_weather", "{\"city\":\"Lima\"}", "");
    parse(L, "<|python_tag|>{\"name\": \"get_time\", \"parameters\": {\"zone\": \"CET\"}}", 1, 1, "get_time",
          "{\"zone\":\"CET\"}", "");
    parse(L, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"A\"}}; {\"name\": \"get_time\", \"parameters\": {}}",
          1, 2, "get_weather", "{\"city\":\"A\"}", "");
    parse(L, "{\"name\": \"unknown_fn\", \"parameters\": {}}", 1, 0, NULL, NULL, NULL); /* JSON, but no call */
    parse(L, "{\"answer\": 42}", 1, 0, NULL, NULL, NULL);
    parse(L, "The weather is nice.", 1, 0, NULL, NULL, NULL);
    parse(L, "{\"name\": \"get_weather\", \"parameters\": {\"city\": ", 1, 0, NULL, NULL, NULL);
    /* Mistral: a JSON list, or NAME[ARGS]{...} */
    parse(M, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Nice\"}}]", 1, 1, "get_weather",
          "{\"city\":\"Nice\"}", "");
    parse(M, "ok [TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"B\"}}, {\"name\": \"get_time\", "
             "\"arguments\": {}}]", 1, 2, "get_weather", "{\"city\":\"B\"}", "ok");
    parse(M, "[TOOL_CALLS]get_time[ARGS]{\"zone\": \"PST\"}", 1, 1, "get_time", "{\"zone\":\"PST\"}", "");
    parse(M, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\"", 1, 0, NULL, NULL, NULL);
    parse(M, "[TOOL_CALLS][]", 1, 0, NULL, NULL, NULL);
    /* a format gerbil does not parse: content */
    parse(SRV_TOOLS_NONE, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>", 1, 0, NULL, NULL, NULL);
}

static void safe(enum srv_tool_fmt f, const char *t, size_t want) {
    size_t got = srv_tool_safe_len(f, t, strlen(t));
    CHECKF(got == want, "%s safe_len(\"%s\") = %zu, want %zu", srv_tool_format_name(f), t, got, want);
}

static void test_stream_hold(void) {
    safe(SRV_TOOLS_HERMES, "Hello", 5);
    safe(SRV_TOOLS_HERMES, "Hello <tool", 5);       /* may become <tool_call> */
    safe(SRV_TOOLS_HERMES, "Hello <toolbox>", 15);
    safe(SRV_TOOLS_HERMES, "Hi\n\n<tool_call>\n{\"na", 2);
    safe(SRV_TOOLS_HERMES, "a<", 1);
    safe(SRV_TOOLS_LLAMA3, "{\"name\"", 0);
    safe(SRV_TOOLS_LLAMA3, "  ", 0);
    safe(SRV_TOOLS_LLAMA3, "<|python", 0);
    safe(SRV_TOOLS_LLAMA3, "The answer", 10);
    safe(SRV_TOOLS_MISTRAL, "x [TOOL_C", 1);
    safe(SRV_TOOLS_NONE, "<tool_call>", 11);
}

/* The forced-call grammar over the Qwen3 tokenizer: the call text is accepted and complete,
 * and parses back into the same call; arguments outside the schema are rejected. */
static void forced(gerbil_grammar_vocab_t voc, enum srv_tool_fmt f, const char *name, int parallel, const char *good,
                   const char *bad) {
    cJSON *tools = cJSON_Parse(TOOLS);
    const char *why = NULL;
    char *spec = srv_tool_grammar(f, tools, name, parallel, &why);
    CHECKF(spec != NULL, "%s: no grammar: %s", srv_tool_format_name(f), why ? why : "?");
    gerbil_grammar_params gp = gerbil_grammar_default_params();
    gp.compact = 1;
    gerbil_grammar_t g = NULL;
    gerbil_grammar_state_t s = NULL;
    if (spec && gerbil_grammar_compile(voc, GERBIL_GRAMMAR_SEQUENCE, spec, strlen(spec), &gp, &g) != GERBIL_OK)
        CHECKF(0, "%s: compile: %s", srv_tool_format_name(f), gerbil_last_error());
    if (g && gerbil_grammar_state_new(g, &s) == GERBIL_OK) {
        size_t n = gerbil_grammar_accept_bytes(s, good, strlen(good));
        CHECKF(n == strlen(good) && gerbil_grammar_is_accepting(s), "%s: \"%s\" accepted %zu of %zu bytes, complete %d",
               srv_tool_format_name(f), good, n, strlen(good), gerbil_grammar_is_accepting(s));
        size_t ce;
        cJSON *calls = srv_tool_parse(f, good, strlen(good), tools, parallel, 1, &ce);
        CHECKF(calls != NULL, "%s: the forced text \"%s\" does not parse back", srv_tool_format_name(f), good);
        cJSON_Delete(calls);
        gerbil_grammar_state_reset(s);
        n = gerbil_grammar_accept_bytes(s, bad, strlen(bad));
        CHECKF(n < strlen(bad), "%s: \"%s\" should be rejected", srv_tool_format_name(f), bad);
    }
    gerbil_grammar_state_free(s);
    gerbil_grammar_free(g);
    free(spec);
    cJSON_Delete(tools);
}

static void test_forced(void) {
    gerbil_tokenizer_t tok = NULL;
    gerbil_grammar_vocab_t voc = NULL;
    if (gerbil_tokenizer_load("../shared/data/tokenizers/qwen3/tokenizer.json", &tok) != GERBIL_OK ||
        gerbil_grammar_vocab_new(tok, 0, NULL, 0, &voc) != GERBIL_OK) {
        CHECKF(0, "the Qwen3 tokenizer: %s", gerbil_last_error());
        gerbil_tokenizer_free(tok);
        return;
    }
    forced(voc, SRV_TOOLS_HERMES, "get_weather", 0,
           "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\",\"days\":3}}\n</tool_call>",
           "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\",\"days\":9}}"); /* days > 7 */
    forced(voc, SRV_TOOLS_HERMES, NULL, 1,
           "<tool_call>\n{\"name\":\"get_time\",\"arguments\":{}}\n</tool_call>\n<tool_call>\n"
           "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"X\"}}\n</tool_call>",
           "<tool_call>\n{\"name\":\"get_news\""); /* not a tool */
    forced(voc, SRV_TOOLS_HERMES, "get_weather", 0, "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"P\"}}\n</tool_call>",
           "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"days\":2}}"); /* city is required */
    forced(voc, SRV_TOOLS_QWEN_XML, "get_weather", 0,
           "<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Jose\n</parameter>\n<parameter=days>\n2\n"
           "</parameter>\n</function>\n</tool_call>",
           "<tool_call>\n<function=get_weather>\n<parameter=city>\nA\n</parameter>\n<parameter=days>\n\"two\"");
    forced(voc, SRV_TOOLS_LLAMA3, "get_time", 0, "{\"name\":\"get_time\",\"parameters\":{\"zone\":\"UTC\"}}",
           "{\"name\":\"get_time\",\"parameters\":{\"zone\":5}}");
    forced(voc, SRV_TOOLS_MISTRAL, NULL, 1,
           "[TOOL_CALLS][{\"name\":\"get_time\",\"arguments\":{}}, {\"name\":\"get_time\",\"arguments\":{}}]",
           "[TOOL_CALLS][{\"name\":\"get_time\",\"arguments\":[]");
    /* malformed definitions are refused with a reason, never a grammar that cannot parse back */
    cJSON *bad = cJSON_Parse("[{\"type\":\"function\",\"function\":{\"name\":\"a<b\"}}]");
    const char *why = NULL;
    char *spec = srv_tool_grammar(SRV_TOOLS_HERMES, bad, NULL, 1, &why);
    CHECK(spec == NULL && why != NULL);
    free(spec);
    cJSON_Delete(bad);
    /* the sequence spec's own errors */
    gerbil_grammar_t g = NULL;
    const char *specs[] = {"{}", "{\"items\": []}", "{\"items\": [[{\"nope\": 1}]]}", "{\"items\": [[\"a\"]], \"min\": 3, \"max\": 1}",
                           "{\"items\": [[{\"schema\": {\"type\": \"object\", \"not\": {}}}]]}", "[1"};
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        CHECKF(gerbil_grammar_compile(voc, GERBIL_GRAMMAR_SEQUENCE, specs[i], strlen(specs[i]), NULL, &g) != GERBIL_OK,
               "spec %s compiled", specs[i]);
        gerbil_grammar_free(g);
        g = NULL;
    }
    /* open/close, separator, optional parts, min 0 */
    const char *sp = "{\"open\": \"[\", \"close\": \"]\", \"separator\": \",\", \"min\": 0, \"max\": 3, "
                     "\"items\": [[\"a\", {\"optional\": [\"b\"]}], [{\"regex\": \"c+\"}]]}";
    if (gerbil_grammar_compile(voc, GERBIL_GRAMMAR_SEQUENCE, sp, strlen(sp), NULL, &g) == GERBIL_OK) {
        gerbil_grammar_state_t s = NULL;
        gerbil_grammar_state_new(g, &s);
        const char *ok[] = {"[]", "[a]", "[ab,ccc]", "[a,a,cc]"}, *no[] = {"[a,a,a,a]", "[b]", "[a,]", "a"};
        for (int i = 0; i < 4; i++) {
            gerbil_grammar_state_reset(s);
            size_t n = gerbil_grammar_accept_bytes(s, ok[i], strlen(ok[i]));
            CHECKF(n == strlen(ok[i]) && gerbil_grammar_is_accepting(s), "sequence: \"%s\" should match", ok[i]);
            gerbil_grammar_state_reset(s);
            n = gerbil_grammar_accept_bytes(s, no[i], strlen(no[i]));
            CHECKF(n < strlen(no[i]) || !gerbil_grammar_is_accepting(s), "sequence: \"%s\" should not match", no[i]);
        }
        gerbil_grammar_state_free(s);
        gerbil_grammar_free(g);
    } else {
        CHECKF(0, "sequence spec: %s", gerbil_last_error());
    }
    gerbil_grammar_vocab_free(voc);
    gerbil_tokenizer_free(tok);
}

/* The library's entry point, with a template loaded from its text. */
static void test_library(void) {
    char *src = slurp(TPL "Qwen3.5-4B.jinja");
    if (!src) SKIP("Qwen3.5-4B.jinja not found");
    gerbil_chat_template_t t = NULL;
    CHECK(gerbil_chat_template_new(src, NULL, "<|im_end|>", &t) == GERBIL_OK);
    free(src);
    const char *out = "I will look.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nBern\n</parameter>\n"
                      "</function>\n</tool_call>";
    size_t cl = 0;
    char *calls = gerbil_chat_parse_tool_calls(t, out, strlen(out), TOOLS, &cl);
    cJSON *j = calls ? cJSON_Parse(calls) : NULL;
    const cJSON *fn = cJSON_GetObjectItem(cJSON_GetArrayItem(j, 0), "function");
    CHECKF(j && cJSON_GetArraySize(j) == 1 && !strcmp(cJSON_GetObjectItem(fn, "name")->valuestring, "get_weather") &&
           !strcmp(cJSON_GetObjectItem(fn, "arguments")->valuestring, "{\"city\":\"Bern\"}"), "library: %s", calls ? calls : "NULL");
    CHECK(cl == 12);
    cJSON_Delete(j);
    free(calls);
    cl = 0;
    CHECK(gerbil_chat_parse_tool_calls(t, "plain", 5, NULL, &cl) == NULL && cl == 5);
    /* no template: Hermes */
    const char *h = "<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>";
    char *hc = gerbil_chat_parse_tool_calls(NULL, h, strlen(h), NULL, NULL);
    CHECK(hc != NULL);
    free(hc);
    gerbil_chat_template_free(t);
}

int main(void) {
    test_library();
    test_formats();
    test_parsers();
    test_stream_hold();
    test_forced();
    return test_done();
}
