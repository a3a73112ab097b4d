/* gerbil_template_render: a chat template rendered as transformers' apply_chat_template
 * renders it (see jinja.h for the interpreter). */
#include "text/jinja.h"
#include "base/status.h"

#include <stdlib.h>
#include <string.h>

gerbil_status gerbil_template_render(const char *template_src, const char *context_json, char **out) {
    if (!template_src || !out) return err_set(GERBIL_ERR_INVALID_ARG, "template render: NULL argument");
    *out = NULL;
    jctx c = {.status = GERBIL_OK};
    jtok *toks;
    int ntoks;
    jnode *body;
    jsb text = {0};
    const char *ctx = context_json && *context_json ? context_json : "{}";
    c.globals = jv_parse_json(&c, ctx, strlen(ctx));
    if (c.globals && c.globals->type != JV_DICT) {
        c.status = err_set(GERBIL_ERR_INVALID_ARG, "template context must be a JSON object");
        c.globals = NULL;
    }
    if (c.globals && jinja_lex(&c, template_src, &toks, &ntoks) == 0 && (body = jinja_parse(&c, toks, ntoks)) &&
        jinja_render(&c, body, &text) == 0 && jsb_put(&c, &text, "", 0) == 0) {
        *out = malloc(text.n + 1);
        if (!*out) c.status = err_set(GERBIL_ERR_NOMEM, "template render: out of memory");
        else memcpy(*out, text.p, text.n + 1);
    }
    if (c.status == GERBIL_OK && !*out) c.status = err_set(GERBIL_ERR_FORMAT, "template render failed");
    if (c.arena.oom && c.status == GERBIL_ERR_FORMAT)
        c.status = err_set(GERBIL_ERR_NOMEM, "template render: out of memory (over %d MiB)", JINJA_MAX_MEMORY >> 20);
    ja_free_all(&c.arena);
    return c.status;
}
