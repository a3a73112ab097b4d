/* OpenAI tool calling for `gerbil serve` (server.h): which format a chat template's model
 * writes its calls in, the parsers that turn its output into `tool_calls`, and the grammar
 * specs that force a call (tool_choice "required" or a named function).
 *
 * The formats are those of the templates in the wild, recognised by their markers as
 * llama.cpp's common/chat.cpp does: Hermes (Qwen2.5, Qwen3, SmolLM3, Hermes) writes
 * <tool_call>\n{"name": N, "arguments": {...}}\n</tool_call>; Qwen3.5 (Qwen3-Coder) writes
 * <tool_call>\n<function=N>\n<parameter=K>\nV\n</parameter>\n</function>\n</tool_call>;
 * Llama 3.1/3.2 a bare {"name": N, "parameters": {...}} (3.1 may put <|python_tag|> first);
 * Mistral [TOOL_CALLS] then a JSON list of calls (or, in its newer templates, N[ARGS]{...}).
 * A call that does not parse leaves the whole text as content: never an error. */
#include "serve/server.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum srv_tool_fmt srv_tool_format(const char *src) {
    if (!src) return SRV_TOOLS_HERMES;
    if (strstr(src, "<tool_call>")) return strstr(src, "<function=") ? SRV_TOOLS_QWEN_XML : SRV_TOOLS_HERMES;
    if (strstr(src, "[TOOL_CALLS]")) return SRV_TOOLS_MISTRAL;
    if (strstr(src, "<|python_tag|>") || (strstr(src, "\"parameters\"") && strstr(src, "{\"name\"")))
        return SRV_TOOLS_LLAMA3;
    if (strstr(src, "tool_calls") || strstr(src, "tools")) return SRV_TOOLS_NONE; /* its own format */
    return SRV_TOOLS_HERMES;
}

const char *srv_tool_format_name(enum srv_tool_fmt f) {
    switch (f) {
    case SRV_TOOLS_HERMES: return "hermes";
    case SRV_TOOLS_QWEN_XML: return "qwen-xml";
    case SRV_TOOLS_LLAMA3: return "llama3-json";
    case SRV_TOOLS_MISTRAL: return "mistral";
    default: return "none";
    }
}

static int is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

static const char *skip_ws(const char *p, const char *e) {
    while (p < e && is_ws(*p)) p++;
    return p;
}

static const char *find(const char *p, const char *e, const char *needle) {
    const size_t k = strlen(needle);
    for (; p + k <= e; p++)
        if (!memcmp(p, needle, k)) return p;
    return NULL;
}

static int starts(const char *p, const char *e, const char *lit) {
    const size_t k = strlen(lit);
    return (size_t)(e - p) >= k && !memcmp(p, lit, k);
}

/* The JSON value at p (within e): parsed, *end after it; NULL when it does not parse. */
static cJSON *json_at(const char *p, const char *e, const char **end) {
    const char *q = NULL;
    *end = p;
    cJSON *j = cJSON_ParseWithLengthOpts(p, (size_t)(e - p), &q, 0);
    if (!j) return NULL;
    *end = q;
    return j;
}

static const cJSON *tool_fn(const cJSON *tools, const char *name) {
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (cJSON_IsString(nm) && !strcmp(nm->valuestring, name)) return fn;
    }
    return NULL;
}

/* One OpenAI tool call from a name and arguments (an object, or a string of JSON). */
static cJSON *make_call(const char *name, const cJSON *args, uint64_t *seed) {
    if (!name || !name[0]) return NULL;
    char *at = NULL;
    if (!args) at = strdup("{}");
    else if (cJSON_IsString(args)) {
        cJSON *chk = cJSON_Parse(args->valuestring);
        const int ok = cJSON_IsObject(chk);
        cJSON_Delete(chk);
        if (!ok) return NULL;
        at = strdup(args->valuestring);
    } else if (cJSON_IsObject(args)) {
        at = cJSON_PrintUnformatted(args);
    } else {
        return NULL;
    }
    if (!at) return NULL;
    *seed = *seed * 6364136223846793005ULL + 1442695040888963407ULL;
    char id[40];
    snprintf(id, sizeof id, "call_%016llx", (unsigned long long)(*seed ^ (*seed >> 29)));
    cJSON *c = cJSON_CreateObject(), *fn;
    cJSON_AddStringToObject(c, "id", id);
    cJSON_AddStringToObject(c, "type", "function");
    fn = cJSON_AddObjectToObject(c, "function");
    cJSON_AddStringToObject(fn, "name", name);
    cJSON_AddStringToObject(fn, "arguments", at);
    free(at);
    return c;
}

/* A {"name": N, "arguments"|"parameters": {...}} object as a call. */
static cJSON *call_from_obj(const cJSON *o, const cJSON *tools, int need_known, uint64_t *seed) {
    if (!cJSON_IsObject(o)) return NULL;
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(o, "name");
    if (!cJSON_IsString(nm)) return NULL;
    if (need_known && !tool_fn(tools, nm->valuestring)) return NULL;
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "arguments");
    if (!a) a = cJSON_GetObjectItemCaseSensitive(o, "parameters");
    return make_call(nm->valuestring, a, seed);
}

/* <tool_call> JSON </tool_call>, repeated. */
static const char *parse_hermes(const char *p, const char *e, cJSON *out, uint64_t *seed) {
    const char *end;
    for (;;) {
        p = skip_ws(p, e);
        if (p == e) return p;
        if (!starts(p, e, "<tool_call>")) return NULL;
        p = skip_ws(p + 11, e);
        cJSON *o = json_at(p, e, &end);
        cJSON *c = o ? call_from_obj(o, NULL, 0, seed) : NULL;
        cJSON_Delete(o);
        if (!c) return NULL;
        cJSON_AddItemToArray(out, c);
        p = skip_ws(end, e);
        if (!starts(p, e, "</tool_call>")) return NULL;
        p += 12;
    }
}

/* The type a function's parameter declares ("string", ...), or NULL. */
static const char *param_type(const cJSON *tools, const char *fn_name, const char *param) {
    const cJSON *fn = tool_fn(tools, fn_name);
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(fn, "parameters"), "properties");
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(props, param), "type");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

/* <tool_call> <function=N> (<parameter=K> V </parameter>)* </function> </tool_call>, repeated. */
static const char *parse_qwen_xml(const char *p, const char *e, const cJSON *tools, cJSON *out, uint64_t *seed) {
    for (;;) {
        p = skip_ws(p, e);
        if (p == e) return p;
        if (!starts(p, e, "<tool_call>")) return NULL;
        p = skip_ws(p + 11, e);
        if (!starts(p, e, "<function=")) return NULL;
        p += 10;
        const char *q = memchr(p, '>', (size_t)(e - p));
        if (!q || q == p) return NULL;
        char *name = strndup(p, (size_t)(q - p));
        cJSON *args = cJSON_CreateObject();
        p = q + 1;
        int ok = 1;
        for (;;) {
            p = skip_ws(p, e);
            if (!starts(p, e, "<parameter=")) break;
            p += 11;
            q = memchr(p, '>', (size_t)(e - p));
            if (!q || q == p) { ok = 0; break; }
            char *key = strndup(p, (size_t)(q - p));
            p = q + 1;
            const char *ve = find(p, e, "</parameter>");
            if (!ve) { free(key); ok = 0; break; }
            const char *vs = p, *vend = ve;
            if (vs < vend && *vs == '\n') vs++;
            if (vend > vs && vend[-1] == '\n') vend--;
            const char *ty = param_type(tools, name, key);
            cJSON *v = NULL;
            if (!ty || strcmp(ty, "string")) {
                const char *je;
                v = json_at(vs, vend, &je);
                if (v && skip_ws(je, vend) != vend) { cJSON_Delete(v); v = NULL; }
            }
            if (!v) {
                char *sv = strndup(vs, (size_t)(vend - vs));
                v = cJSON_CreateString(sv);
                free(sv);
            }
            if (!cJSON_GetObjectItemCaseSensitive(args, key)) cJSON_AddItemToObject(args, key, v);
            else cJSON_Delete(v);
            free(key);
            p = ve + 12;
        }
        if (ok) {
            p = skip_ws(p, e);
            ok = starts(p, e, "</function>");
            if (ok) p = skip_ws(p + 11, e);
            ok = ok && starts(p, e, "</tool_call>");
            if (ok) p += 12;
        }
        cJSON *c = ok ? make_call(name, args, seed) : NULL;
        free(name);
        cJSON_Delete(args);
        if (!c) return NULL;
        cJSON_AddItemToArray(out, c);
    }
}

/* [<|python_tag|>] {"name", "parameters"} ([;] {...})* */
static const char *parse_llama3(const char *p, const char *e, const cJSON *tools, cJSON *out, uint64_t *seed) {
    p = skip_ws(p, e);
    if (starts(p, e, "<|python_tag|>")) p += 14;
    for (int first = 1;; first = 0) {
        p = skip_ws(p, e);
        if (p == e) return first ? NULL : p;
        if (!first && *p == ';') p = skip_ws(p + 1, e);
        const char *end;
        cJSON *o = json_at(p, e, &end);
        cJSON *c = o ? call_from_obj(o, tools, 1, seed) : NULL;
        cJSON_Delete(o);
        if (!c) return NULL;
        cJSON_AddItemToArray(out, c);
        p = end;
    }
}

/* [TOOL_CALLS] [{...}, ...]  or  [TOOL_CALLS]N[ARGS]{...} (repeated) */
static const char *parse_mistral(const char *p, const char *e, cJSON *out, uint64_t *seed) {
    for (;;) {
        p = skip_ws(p, e);
        if (p == e) return p;
        if (!starts(p, e, "[TOOL_CALLS]")) return NULL;
        p = skip_ws(p + 12, e);
        if (p < e && *p == '[') {
            const char *end;
            cJSON *a = json_at(p, e, &end), *it;
            if (!cJSON_IsArray(a) || !cJSON_GetArraySize(a)) { cJSON_Delete(a); return NULL; }
            cJSON_ArrayForEach(it, a) {
                cJSON *c = call_from_obj(it, NULL, 0, seed);
                if (!c) { cJSON_Delete(a); return NULL; }
                cJSON_AddItemToArray(out, c);
            }
            cJSON_Delete(a);
            p = end;
        } else {
            const char *q = find(p, e, "[ARGS]");
            if (!q || q == p) return NULL;
            char *name = strndup(p, (size_t)(q - p));
            const char *end;
            cJSON *a = json_at(q + 6, e, &end);
            cJSON *c = cJSON_IsObject(a) ? make_call(name, a, seed) : NULL;
            free(name);
            cJSON_Delete(a);
            if (!c) return NULL;
            cJSON_AddItemToArray(out, c);
            p = end;
        }
    }
}

static const char *marker(enum srv_tool_fmt f) {
    switch (f) {
    case SRV_TOOLS_HERMES: case SRV_TOOLS_QWEN_XML: return "<tool_call>";
    case SRV_TOOLS_MISTRAL: return "[TOOL_CALLS]";
    default: return NULL;
    }
}

cJSON *srv_tool_parse(enum srv_tool_fmt f, const char *t, size_t n, const cJSON *tools, int parallel, uint64_t id_seed,
                      size_t *content_end) {
    *content_end = n;
    if (f == SRV_TOOLS_NONE || !t) return NULL;
    const char *e = t + n, *start;
    if (f == SRV_TOOLS_LLAMA3) {
        start = t; /* the whole answer is the call */
    } else {
        start = find(t, e, marker(f));
        if (!start) return NULL;
    }
    cJSON *calls = cJSON_CreateArray();
    uint64_t seed = id_seed ? id_seed : 0x9e3779b97f4a7c15ULL;
    const char *end = NULL;
    switch (f) {
    case SRV_TOOLS_HERMES: end = parse_hermes(start, e, calls, &seed); break;
    case SRV_TOOLS_QWEN_XML: end = parse_qwen_xml(start, e, tools, calls, &seed); break;
    case SRV_TOOLS_LLAMA3: end = parse_llama3(start, e, tools, calls, &seed); break;
    case SRV_TOOLS_MISTRAL: end = parse_mistral(start, e, calls, &seed); break;
    default: break;
    }
    if (!end || !cJSON_GetArraySize(calls)) {
        cJSON_Delete(calls);
        return NULL;
    }
    while (!parallel && cJSON_GetArraySize(calls) > 1) cJSON_DeleteItemFromArray(calls, cJSON_GetArraySize(calls) - 1);
    size_t c = (size_t)(start - t);
    while (c && is_ws(t[c - 1])) c--;
    *content_end = c;
    return calls;
}

size_t srv_tool_safe_len(enum srv_tool_fmt f, const char *t, size_t n) {
    if (f == SRV_TOOLS_NONE) return n;
    if (f == SRV_TOOLS_LLAMA3) {
        /* a call is the whole answer: hold everything while it may be one */
        const char *p = skip_ws(t, t + n);
        const size_t k = (size_t)(t + n - p);
        if (k == 0 || *p == '{' || (k < 14 ? !memcmp(p, "<|python_tag|>", k) : starts(p, t + n, "<|python_tag|>")))
            return 0;
        return n;
    }
    const char *m = marker(f), *hit = find(t, t + n, m);
    size_t safe = hit ? (size_t)(hit - t) : n;
    if (!hit) /* a suffix that may still become the marker */
        for (size_t h = strlen(m) - 1; h > 0; h--)
            if (n >= h && !memcmp(t + n - h, m, h)) { safe = n - h; break; }
    while (safe && is_ws(t[safe - 1])) safe--; /* whitespace before a call is not content */
    return safe;
}

/* ---- forced calls: the grammar ---- */

static cJSON *params_of(const cJSON *fn) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
    if (cJSON_IsObject(p)) return cJSON_Duplicate(p, 1);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "object");
    return o;
}

/* {"name": const N, ARGKEY: parameters} as a JSON Schema part. */
static cJSON *call_schema_part(const char *name, const cJSON *fn, const char *argkey) {
    cJSON *s = cJSON_CreateObject(), *props, *nm, *req;
    cJSON_AddStringToObject(s, "type", "object");
    props = cJSON_AddObjectToObject(s, "properties");
    nm = cJSON_AddObjectToObject(props, "name");
    cJSON_AddStringToObject(nm, "const", name);
    cJSON_AddItemToObject(props, argkey, params_of(fn));
    req = cJSON_AddArrayToObject(s, "required");
    cJSON_AddItemToArray(req, cJSON_CreateString("name"));
    cJSON_AddItemToArray(req, cJSON_CreateString(argkey));
    cJSON_AddFalseToObject(s, "additionalProperties");
    cJSON *part = cJSON_CreateObject();
    cJSON_AddItemToObject(part, "schema", s);
    return part;
}

static int is_plain_string(const cJSON *schema) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(schema, "type");
    return cJSON_IsString(t) && !strcmp(t->valuestring, "string") && !cJSON_GetObjectItemCaseSensitive(schema, "enum") &&
           !cJSON_GetObjectItemCaseSensitive(schema, "const") && !cJSON_GetObjectItemCaseSensitive(schema, "pattern") &&
           !cJSON_GetObjectItemCaseSensitive(schema, "format");
}

/* The parts of one call in format f. */
static cJSON *call_parts(enum srv_tool_fmt f, const char *name, const cJSON *fn) {
    cJSON *a = cJSON_CreateArray();
    char buf[320];
    switch (f) {
    case SRV_TOOLS_QWEN_XML: {
        snprintf(buf, sizeof buf, "<tool_call>\n<function=%s>\n", name);
        cJSON_AddItemToArray(a, cJSON_CreateString(buf));
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(params, "properties");
        const cJSON *req = cJSON_GetObjectItemCaseSensitive(params, "required"), *p;
        cJSON_ArrayForEach(p, props) {
            int required = 0;
            const cJSON *r;
            cJSON_ArrayForEach(r, req) required |= cJSON_IsString(r) && !strcmp(r->valuestring, p->string);
            cJSON *one = cJSON_CreateArray();
            snprintf(buf, sizeof buf, "<parameter=%s>\n", p->string);
            cJSON_AddItemToArray(one, cJSON_CreateString(buf));
            cJSON *v = cJSON_CreateObject();
            if (is_plain_string(p)) { /* the raw text up to the closing tag, maxLength honoured */
                const cJSON *ml = cJSON_GetObjectItemCaseSensitive(p, "maxLength");
                char re[48] = "[^<]*";
                if (cJSON_IsNumber(ml) && ml->valuedouble >= 0 && ml->valuedouble <= 4096)
                    snprintf(re, sizeof re, "[^<]{0,%d}", (int)ml->valuedouble);
                cJSON_AddStringToObject(v, "regex", re);
            }
            else cJSON_AddItemToObject(v, "schema", cJSON_Duplicate(p, 1));
            cJSON_AddItemToArray(one, v);
            cJSON_AddItemToArray(one, cJSON_CreateString("\n</parameter>\n"));
            if (required) {
                cJSON *it;
                while ((it = cJSON_DetachItemFromArray(one, 0))) cJSON_AddItemToArray(a, it);
                cJSON_Delete(one);
            } else {
                cJSON *opt = cJSON_CreateObject();
                cJSON_AddItemToObject(opt, "optional", one);
                cJSON_AddItemToArray(a, opt);
            }
        }
        cJSON_AddItemToArray(a, cJSON_CreateString("</function>\n</tool_call>"));
        break;
    }
    case SRV_TOOLS_LLAMA3: cJSON_AddItemToArray(a, call_schema_part(name, fn, "parameters")); break;
    case SRV_TOOLS_MISTRAL: cJSON_AddItemToArray(a, call_schema_part(name, fn, "arguments")); break;
    default:
        cJSON_AddItemToArray(a, cJSON_CreateString("<tool_call>\n"));
        cJSON_AddItemToArray(a, call_schema_part(name, fn, "arguments"));
        cJSON_AddItemToArray(a, cJSON_CreateString("\n</tool_call>"));
        break;
    }
    return a;
}

char *srv_tool_grammar(enum srv_tool_fmt f, const cJSON *tools, const char *name, int parallel, const char **why) {
    *why = NULL;
    if (f == SRV_TOOLS_NONE) f = SRV_TOOLS_HERMES;
    cJSON *spec = cJSON_CreateObject(), *items = cJSON_AddArrayToObject(spec, "items");
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsString(nm) || !nm->valuestring[0] || strlen(nm->valuestring) > 200 ||
            strpbrk(nm->valuestring, "<>\"\\\n")) {
            *why = "each tool needs a function with a plain 'name' (no <, >, quotes, backslashes or newlines, at most 200 bytes)";
            cJSON_Delete(spec);
            return NULL;
        }
        if (name && strcmp(name, nm->valuestring)) continue;
        cJSON_AddItemToArray(items, call_parts(f, nm->valuestring, fn));
    }
    if (!cJSON_GetArraySize(items)) {
        *why = "no tool matches the forced function";
        cJSON_Delete(spec);
        return NULL;
    }
    const int many = parallel && !name;
    cJSON_AddNumberToObject(spec, "min", 1);
    cJSON_AddNumberToObject(spec, "max", many ? -1 : 1);
    if (f == SRV_TOOLS_MISTRAL) {
        cJSON_AddStringToObject(spec, "open", "[TOOL_CALLS][");
        cJSON_AddStringToObject(spec, "close", "]");
        cJSON_AddStringToObject(spec, "separator", ", ");
    } else {
        cJSON_AddStringToObject(spec, "separator", f == SRV_TOOLS_LLAMA3 ? "; " : "\n");
    }
    char *s = cJSON_PrintUnformatted(spec);
    cJSON_Delete(spec);
    return s;
}

/* ---- the library's entry point ---- */

char *gerbil_chat_parse_tool_calls(gerbil_chat_template_t t, const char *text, size_t n, const char *tools_json,
                                   size_t *content_len) {
    if (content_len) *content_len = n;
    if (!text) return NULL;
    cJSON *tools = tools_json ? cJSON_Parse(tools_json) : NULL;
    size_t ce = n;
    cJSON *calls = srv_tool_parse(srv_tool_format(t ? gerbil_chat_template_source(t) : NULL), text, n, tools, 1, 0, &ce);
    cJSON_Delete(tools);
    if (!calls) return NULL;
    char *out = cJSON_PrintUnformatted(calls);
    cJSON_Delete(calls);
    if (out && content_len) *content_len = ce;
    return out;
}
