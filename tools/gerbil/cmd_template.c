/* gerbil template --model DIR --messages messages.json [--tools tools.json]
 *                 [--add-generation-prompt] [--template FILE.jinja] [--var NAME=JSON ...]
 * prints the chat template rendered as transformers' apply_chat_template(tokenize=False)
 * renders it, with no newline added. */
#include "cli.h"
#include "io/json.h"

#include <stdlib.h>
#include <string.h>

enum { MAX_VARS = 64 };

static void help(FILE *f) {
    fprintf(f, "usage: gerbil template --model DIR --messages messages.json [options]\n\n"
               "Renders the model's chat template over the messages and prints the prompt exactly\n"
               "(no newline added), as transformers' apply_chat_template(tokenize=False) does.\n\noptions:\n"
               "      --model DIR              folder with tokenizer_config.json and/or chat_template.jinja\n"
               "      --messages FILE          JSON array of messages ({\"role\", \"content\", ...})\n"
               "      --tools FILE             JSON array of tool definitions\n"
               "      --add-generation-prompt  end with the assistant turn header\n"
               "      --template FILE          use this Jinja template instead of the model's\n"
               "      --var NAME=JSON          extra template variable, e.g. enable_thinking=false\n"
               "                               or date_string='\"26 Jul 2024\"' (repeatable)\n");
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *p = malloc(cap);
    while (p) {
        size_t k = fread(p + n, 1, cap - n - 1, f);
        n += k;
        if (n < cap - 1) break;
        char *np = realloc(p, cap * 2);
        if (!np) { free(p); p = NULL; break; }
        p = np;
        cap *= 2;
    }
    fclose(f);
    if (p) { p[n] = 0; if (len) *len = n; }
    return p;
}

/* A growing string for the context JSON. */
typedef struct { char *p; size_t n, cap; int oom; } buf;
static void put(buf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->n + n + 1) cap *= 2;
        char *np = realloc(b->p, cap);
        if (!np) { b->oom = 1; return; }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void puts_(buf *b, const char *s) { put(b, s, strlen(s)); }

/* "key": <json text>, with the key JSON-escaped. */
static void put_member(buf *b, const char *key, size_t klen, const char *json) {
    cJSON *k = cJSON_CreateString("");
    char *tmp = malloc(klen + 1);
    if (!k || !tmp) { b->oom = 1; cJSON_Delete(k); free(tmp); return; }
    memcpy(tmp, key, klen);
    tmp[klen] = 0;
    cJSON_SetValuestring(k, tmp);
    char *ks = cJSON_PrintUnformatted(k);
    puts_(b, b->n > 1 ? ", " : "");
    if (ks) puts_(b, ks); else b->oom = 1;
    puts_(b, ": ");
    puts_(b, json);
    free(ks);
    free(tmp);
    cJSON_Delete(k);
}

/* A special token from tokenizer_config.json: a string, or {"content": ...}; NULL if none. */
static const char *special_token(const cJSON *cfg, const char *key) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsString(t)) return t->valuestring;
    if (cJSON_IsObject(t)) return json_get_str(t, "content", NULL);
    return NULL;
}

/* The model's template: chat_template.jinja (it wins, as in transformers), else
 * tokenizer_config.json "chat_template" (a string, or [{"name", "template"}]: "default"
 * or the first). Returns malloc'd text or NULL with a message printed. */
static char *model_template(const char *dir, const cJSON *cfg) {
    char path[4096];
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    char *t = slurp(path, NULL);
    if (t) return t;
    const cJSON *ct = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "chat_template") : NULL;
    if (cJSON_IsString(ct)) return strdup(ct->valuestring);
    if (cJSON_IsArray(ct)) {
        const cJSON *it, *first = NULL;
        cJSON_ArrayForEach(it, ct) {
            const char *name = json_get_str(it, "name", NULL), *tpl = json_get_str(it, "template", NULL);
            if (!tpl) continue;
            if (!first) first = it;
            if (name && !strcmp(name, "default")) return strdup(tpl);
        }
        if (first) return strdup(json_get_str(first, "template", ""));
    }
    fprintf(stderr, "gerbil template: %s has no chat template (no chat_template.jinja, no \"chat_template\" "
                    "in tokenizer_config.json); pass --template FILE\n", dir);
    return NULL;
}

/* Read a JSON file, check it parses (and is an array when want_array), return its text. */
static char *json_file(const char *what, const char *path, int want_array) {
    size_t n;
    char *text = slurp(path, &n);
    if (!text) { fprintf(stderr, "gerbil template: cannot read %s file %s\n", what, path); return NULL; }
    cJSON *doc;
    gerbil_status st = json_parse(text, n, path, &doc);
    if (st != GERBIL_OK) { cli_fail("bad JSON", st); free(text); return NULL; }
    int ok = !want_array || cJSON_IsArray(doc);
    cJSON_Delete(doc);
    if (!ok) { fprintf(stderr, "gerbil template: %s must hold a JSON array of %s\n", path, what); free(text); return NULL; }
    return text;
}

int cmd_template(int argc, char **argv) {
    const char *model = NULL, *messages = NULL, *tools = NULL, *tfile = NULL, *vars[MAX_VARS];
    int nvars = 0, agp = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { help(stdout); return 0; }
        if (!strcmp(a, "--add-generation-prompt")) { agp = 1; continue; }
        const char **dst = !strcmp(a, "--model") || !strcmp(a, "-m") ? &model : !strcmp(a, "--messages") ? &messages
                         : !strcmp(a, "--tools") ? &tools : !strcmp(a, "--template") ? &tfile : NULL;
        if (dst) {
            if (!(*dst = cli_value(argc, argv, &i))) return 2;
            continue;
        }
        if (!strcmp(a, "--var")) {
            const char *v = cli_value(argc, argv, &i);
            if (!v) return 2;
            if (nvars == MAX_VARS) { fprintf(stderr, "gerbil template: more than %d --var\n", MAX_VARS); return 2; }
            const char *eq = strchr(v, '=');
            if (!eq || eq == v) { fprintf(stderr, "gerbil template: --var wants NAME=JSON, got \"%s\"\n", v); return 2; }
            vars[nvars++] = v;
            continue;
        }
        fprintf(stderr, "gerbil template: unknown option \"%s\"\n", a);
        help(stderr);
        return 2;
    }
    if (!messages) { fprintf(stderr, "gerbil template: --messages is required\n"); help(stderr); return 2; }
    if (!model && !tfile) { fprintf(stderr, "gerbil template: --model or --template is required\n"); return 2; }

    int rc = 1;
    cJSON *cfg = NULL;
    char *tpl = NULL, *msgs = NULL, *tls = NULL, *out = NULL;
    buf ctx = {0};
    if (model) {
        char path[4096];
        snprintf(path, sizeof path, "%s/tokenizer_config.json", model);
        FILE *probe = fopen(path, "rb");
        if (probe) {
            fclose(probe);
            gerbil_status st = json_load_file(path, &cfg);
            if (st != GERBIL_OK) { cli_fail("cannot read tokenizer_config.json", st); goto done; }
        }
    }
    if (tfile) {
        if (!(tpl = slurp(tfile, NULL))) { fprintf(stderr, "gerbil template: cannot read %s\n", tfile); goto done; }
    } else if (!(tpl = model_template(model, cfg))) goto done;
    if (!(msgs = json_file("messages", messages, 1))) goto done;
    if (tools && !(tls = json_file("tools", tools, 1))) goto done;

    /* the variables apply_chat_template passes: messages, tools, documents,
     * add_generation_prompt, the special tokens, then the extra kwargs (which win) */
    puts_(&ctx, "{");
    put_member(&ctx, "messages", 8, msgs);
    put_member(&ctx, "tools", 5, tls ? tls : "null");
    put_member(&ctx, "documents", 9, "null");
    put_member(&ctx, "add_generation_prompt", 21, agp ? "true" : "false");
    static const char *specials[] = {"bos_token", "eos_token", "unk_token", "pad_token"};
    for (int k = 0; k < 4 && cfg; k++) {
        const char *tok = special_token(cfg, specials[k]);
        if (!tok) continue;
        cJSON *s = cJSON_CreateString(tok);
        char *js = s ? cJSON_PrintUnformatted(s) : NULL;
        if (js) put_member(&ctx, specials[k], strlen(specials[k]), js); else ctx.oom = 1;
        free(js);
        cJSON_Delete(s);
    }
    for (int k = 0; k < nvars; k++) {
        const char *eq = strchr(vars[k], '=');
        cJSON *v;
        char what[256];
        snprintf(what, sizeof what, "--var %.*s", (int)(eq - vars[k]), vars[k]);
        gerbil_status st = json_parse(eq + 1, strlen(eq + 1), what, &v);
        if (st != GERBIL_OK) { cli_fail("bad --var value (it is JSON: strings need quotes)", st); goto done; }
        cJSON_Delete(v);
        put_member(&ctx, vars[k], (size_t)(eq - vars[k]), eq + 1);
    }
    puts_(&ctx, "}");
    if (ctx.oom) { fprintf(stderr, "gerbil template: out of memory\n"); goto done; }

    gerbil_status st = gerbil_template_render(tpl, ctx.p, &out);
    if (st != GERBIL_OK) {
        cli_fail(st == GERBIL_ERR_INVALID_ARG ? "the template raised an exception" : "template error", st);
        goto done;
    }
    fwrite(out, 1, strlen(out), stdout);
    rc = fflush(stdout) ? 1 : 0;
done:
    free(out);
    free(ctx.p);
    free(tls);
    free(msgs);
    free(tpl);
    cJSON_Delete(cfg);
    return rc;
}
