/* Chat templates as transformers applies them: find the template beside the model,
 * build the variables apply_chat_template passes, render with the Jinja interpreter. */
#include "base/status.h"
#include "gerbil.h"
#include "io/json.h"
#include "io/mmap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *const special_keys[] = {"bos_token", "eos_token", "unk_token", "pad_token"};
enum { N_SPECIAL = 4 };

struct gerbil_chat_template {
    char *src;
    char *special[N_SPECIAL]; /* NULL when the config has none (the template sees undefined) */
};

/* A whole text file through the project's file mapping (messages name the path). */
static gerbil_status slurp(const char *path, char **out) {
    struct mapped_file mf;
    GB_TRY(mapped_file_open(path, &mf));
    char *p = malloc(mf.size + 1);
    if (p) {
        if (mf.size) memcpy(p, mf.data, mf.size);
        p[mf.size] = 0;
    }
    mapped_file_close(&mf);
    if (!p) return err_set(GERBIL_ERR_NOMEM, "%s: out of memory", path);
    *out = p;
    return GERBIL_OK;
}

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* A special token from tokenizer_config.json: a string, or {"content": ...}. */
static const char *special_token(const cJSON *cfg, const char *key) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsString(t)) return t->valuestring;
    if (cJSON_IsObject(t)) return json_get_str(t, "content", NULL);
    return NULL;
}

static char *config_template(const cJSON *cfg) {
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
    return NULL;
}

void gerbil_chat_template_free(gerbil_chat_template_t t) {
    if (!t) return;
    free(t->src);
    for (int i = 0; i < N_SPECIAL; i++) free(t->special[i]);
    free(t);
}

const char *gerbil_chat_template_source(gerbil_chat_template_t t) { return t ? t->src : NULL; }

gerbil_status gerbil_chat_template_new(const char *src, const char *bos_token, const char *eos_token,
                                       gerbil_chat_template_t *out) {
    *out = NULL;
    struct gerbil_chat_template *t = calloc(1, sizeof *t);
    if (!t || !(t->src = strdup(src)) || (bos_token && !(t->special[0] = strdup(bos_token))) ||
        (eos_token && !(t->special[1] = strdup(eos_token)))) {
        gerbil_chat_template_free(t);
        return err_set(GERBIL_ERR_NOMEM, "out of memory");
    }
    *out = t;
    return GERBIL_OK;
}

gerbil_status gerbil_chat_template_load(const char *dir, const char *template_file, gerbil_chat_template_t *out) {
    *out = NULL;
    struct gerbil_chat_template *t = calloc(1, sizeof *t);
    if (!t) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    cJSON *cfg = NULL;
    gerbil_status st = GERBIL_OK;
    char path[4096];
    if (dir) {
        snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
        if (is_file(path) && (st = json_load_file(path, &cfg)) != GERBIL_OK) goto fail;
        for (int i = 0; cfg && i < N_SPECIAL; i++) {
            const char *s = special_token(cfg, special_keys[i]);
            if (s && !(t->special[i] = strdup(s))) { st = err_set(GERBIL_ERR_NOMEM, "out of memory"); goto fail; }
        }
    }
    if (template_file) {
        if ((st = slurp(template_file, &t->src)) != GERBIL_OK) goto fail;
    } else if (dir) {
        snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
        if (is_file(path)) {
            if ((st = slurp(path, &t->src)) != GERBIL_OK) goto fail;
        } else {
            t->src = config_template(cfg);
        }
    }
    cJSON_Delete(cfg);
    if (!t->src) { gerbil_chat_template_free(t); return GERBIL_OK; } /* no template: not an error */
    *out = t;
    return GERBIL_OK;
fail:
    cJSON_Delete(cfg);
    gerbil_chat_template_free(t);
    return st;
}

/* A growing string. */
struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
};

static void put(struct sbuf *b, const char *s, size_t n) {
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

static void puts_(struct sbuf *b, const char *s) { put(b, s, strlen(s)); }

/* `"key": value` with the key JSON-escaped; value is JSON text, copied verbatim so
 * numbers keep their spelling (1.0 stays a float for the template). */
static void put_member(struct sbuf *b, const char *key, const char *json) {
    cJSON *k = cJSON_CreateString(key);
    char *ks = k ? cJSON_PrintUnformatted(k) : NULL;
    if (!ks) b->oom = 1;
    else {
        puts_(b, b->n > 1 ? ", " : "");
        puts_(b, ks);
        puts_(b, ": ");
        puts_(b, json);
    }
    free(ks);
    cJSON_Delete(k);
}

static gerbil_status check_json(const char *text, const char *what, int want_array) {
    cJSON *doc;
    GB_TRY(json_parse(text, strlen(text), what, &doc));
    int ok = !want_array || cJSON_IsArray(doc);
    cJSON_Delete(doc);
    if (!ok) return err_set(GERBIL_ERR_INVALID_ARG, "%s must be a JSON array", what);
    return GERBIL_OK;
}

gerbil_status gerbil_chat_template_apply(gerbil_chat_template_t t, const char *messages_json, const char *tools_json,
                                         int add_generation_prompt, const char *const *var_names,
                                         const char *const *var_values, int n_vars, char **out) {
    *out = NULL;
    GB_TRY(check_json(messages_json, "messages", 1));
    if (tools_json) GB_TRY(check_json(tools_json, "tools", 1));
    for (int i = 0; i < n_vars; i++) {
        char what[256];
        snprintf(what, sizeof what, "template variable %s", var_names[i]);
        GB_TRY(check_json(var_values[i], what, 0));
    }
    /* the variables apply_chat_template passes: messages, tools, documents,
     * add_generation_prompt, the special tokens, then the extra kwargs (which win) */
    struct sbuf ctx = {0};
    puts_(&ctx, "{");
    put_member(&ctx, "messages", messages_json);
    put_member(&ctx, "tools", tools_json ? tools_json : "null");
    put_member(&ctx, "documents", "null");
    put_member(&ctx, "add_generation_prompt", add_generation_prompt ? "true" : "false");
    for (int k = 0; k < N_SPECIAL; k++) {
        if (!t->special[k]) continue;
        cJSON *s = cJSON_CreateString(t->special[k]);
        char *js = s ? cJSON_PrintUnformatted(s) : NULL;
        if (js) put_member(&ctx, special_keys[k], js);
        else ctx.oom = 1;
        free(js);
        cJSON_Delete(s);
    }
    for (int k = 0; k < n_vars; k++) put_member(&ctx, var_names[k], var_values[k]);
    puts_(&ctx, "}");
    if (ctx.oom) {
        free(ctx.p);
        return err_set(GERBIL_ERR_NOMEM, "out of memory");
    }
    gerbil_status st = gerbil_template_render(t->src, ctx.p, out);
    free(ctx.p);
    return st;
}
