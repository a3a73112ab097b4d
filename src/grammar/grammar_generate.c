/* gerbil_generate_object: generation under a JSON Schema constraint, returning the JSON. */
#include "base/status.h"
#include "gerbil.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

gerbil_status gerbil_generate_object(gerbil_session_t s, gerbil_sampler_t sampler, gerbil_tokenizer_t tok,
                                     gerbil_grammar_vocab_t vocab, const int32_t *prompt, int n_prompt,
                                     const char *schema_json, const gerbil_generate_params *p, char **json,
                                     gerbil_generate_result *res) {
    *json = NULL;
    if (!s || !sampler || !tok || !vocab || !p || !res) return err_set(GERBIL_ERR_INVALID_ARG, "gerbil_generate_object: NULL argument");
    gerbil_grammar_t g = NULL;
    gerbil_grammar_state_t gs = NULL;
    int32_t *out = NULL;
    char *text = NULL;
    gerbil_grammar_params gpar = gerbil_grammar_default_params();
    gpar.max_whitespace = 1; /* between tokens: no model can spend its budget on whitespace */
    gerbil_status st = schema_json
        ? gerbil_grammar_compile(vocab, GERBIL_GRAMMAR_JSON_SCHEMA, schema_json, strlen(schema_json), &gpar, &g)
        : gerbil_grammar_compile(vocab, GERBIL_GRAMMAR_JSON_OBJECT, "", 0, &gpar, &g);
    if (st != GERBIL_OK) return st;
    if ((st = gerbil_grammar_state_new(g, &gs)) != GERBIL_OK) goto done;
    out = malloc(((size_t)p->max_tokens + 1) * sizeof *out);
    if (!out) { st = err_set(GERBIL_ERR_NOMEM, "out of memory"); goto done; }
    gerbil_generate_params gp = *p;
    gp.grammar = gs;
    gp.ignore_eos = 0;
    if ((st = gerbil_generate(s, sampler, prompt, n_prompt, &gp, out, res)) != GERBIL_OK) goto done;
    if (!gerbil_grammar_is_accepting(gs)) {
        st = err_set(GERBIL_ERR_CONTEXT, "generate_object: the object was not finished after %d tokens (%s)",
                     res->n_generated, res->stop == GERBIL_STOP_CONTEXT ? "the context is full" : "max_tokens");
        goto done;
    }
    size_t len;
    if ((st = gerbil_detokenize(tok, out, res->n_generated, 1, &text, &len)) != GERBIL_OK) goto done;
    cJSON *j = cJSON_ParseWithLength(text, len);
    if (!j) { st = err_set(GERBIL_ERR_FORMAT, "generate_object: the output does not parse as JSON"); goto done; }
    cJSON_Delete(j);
    /* trim the whitespace the grammar allowed around the value */
    size_t a = 0, b = len;
    while (a < b && strchr(" \t\r\n", text[a])) a++;
    while (b > a && strchr(" \t\r\n", text[b - 1])) b--;
    memmove(text, text + a, b - a);
    text[b - a] = 0;
    *json = text;
    text = NULL;
done:
    free(text);
    free(out);
    gerbil_grammar_state_free(gs);
    gerbil_grammar_free(g);
    return st;
}
