/* gerbil run --model DIR ("prompt" | - | --ids 1,17,300) [options] */
#include "cli.h"
#include "textgen.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

static void help(FILE *f) {
    fprintf(f, "usage: gerbil run [--model M] [\"prompt\" | - | --ids 1,17,300] [options]\n\n"
               "Generates text after a prompt and streams it to stdout. A text prompt goes through the\n"
               "model's chat template when it has one (as a user message) and its tokenizer; '-' reads\n"
               "the prompt from stdin. With --ids the prompt is token ids and the output is ids.\n"
               "Without --model (or $GERBIL_MODEL) the model is " CLI_DEFAULT_MODEL ",\n"
               "downloaded from the Hugging Face hub on first use.\n\noptions:\n"
               "      --ids LIST            prompt as comma-separated token ids\n"
               "      --raw                 send the text as is (no chat template; BOS as the tokenizer adds it)\n"
               "      --system TEXT         system message for the chat template\n"
               "      --think, --no-think   set the template's enable_thinking (where it supports it)\n"
               "      --stop STR            stop when the text contains STR (repeatable; cut from the output)\n"
               "  -n, --max-tokens N        tokens to generate (default 512)\n"
               "      --temperature T       0 = greedy (default 0.7)\n"
               "      --top-k K             keep the K most likely (default 50; 0 = off)\n"
               "      --top-p P             nucleus mass (default 0.9; 1 = off)\n"
               "      --min-p P             drop below P x top probability (default 0 = off)\n"
               "      --repeat-penalty R    CTRL-style repetition penalty (default 1.0 = off)\n"
               "      --seed S              sampling seed (default 0); same seed, same tokens\n"
               "      --ignore-eos          do not stop at end-of-sequence ids\n"
               "      --json                print one object: {\"text\", \"token_ids\", \"timings\", ...}\n");
    cli_print_model_opts_help(f);
}

static void print_json(const struct textgen *tg, const int32_t *prompt, int n_prompt, const struct textgen_out *o) {
    const gerbil_generate_result *r = &o->res;
    double pp = r->prompt_s > 0 ? r->n_prompt / r->prompt_s : 0;
    double tgs = r->n_generated > 1 && r->gen_s > 0 ? (r->n_generated - 1) / r->gen_s : 0;
    printf("{");
    if (tg->tok) {
        cJSON *s = cJSON_CreateString(o->text);
        char *js = s ? cJSON_PrintUnformatted(s) : NULL;
        printf("\"text\": %s, ", js ? js : "\"\"");
        free(js);
        cJSON_Delete(s);
    }
    printf("\"prompt_ids\": [");
    for (int i = 0; i < n_prompt; i++) printf(i ? ", %d" : "%d", (int)prompt[i]);
    printf("], \"token_ids\": [");
    for (int i = 0; i < o->n_ids; i++) printf(i ? ", %d" : "%d", (int)o->ids[i]);
    printf("], \"n_prompt\": %d, \"n_generated\": %d, \"stop_reason\": \"%s\", "
           "\"timings\": {\"prompt_ms\": %.3f, \"prompt_tokens_per_s\": %.3f, "
           "\"gen_ms\": %.3f, \"gen_tokens_per_s\": %.3f}}\n",
           r->n_prompt, r->n_generated, textgen_stop_name(o), r->prompt_s * 1e3, pp, r->gen_s * 1e3, tgs);
}


int cmd_run(int argc, char **argv) {
    struct cli_model_opts o = {.default_model = 1};
    struct textgen tg = {.sampling = gerbil_sampler_default_params(), .gen = gerbil_generate_default_params()};
    const char *ids_arg = NULL, *text = NULL, *system = NULL, *v = NULL;
    int json = 0, raw = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r = cli_parse_model_opt(argc, argv, &i, &o);
        if (!r) r = textgen_parse_opt(&tg, "run", argc, argv, &i);
        if (r < 0) return 2;
        if (r) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { help(stdout); return 0; }
        if (!strcmp(a, "--json")) { json = 1; continue; }
        if (!strcmp(a, "--raw")) { raw = 1; continue; }
        if (!strcmp(a, "--ids") || !strcmp(a, "--system")) {
            if (!(v = cli_value(argc, argv, &i))) return 2;
            *(!strcmp(a, "--ids") ? &ids_arg : &system) = v;
            continue;
        }
        if (a[0] == '-' && a[1]) {
            fprintf(stderr, "gerbil run: unknown option \"%s\"\n", a);
            help(stderr);
            return 2;
        }
        if (text) { fprintf(stderr, "gerbil run: more than one prompt given\n"); return 2; }
        text = a;
    }
    if (!ids_arg && !text) { fprintf(stderr, "gerbil run: no prompt (give text, '-' for stdin, or --ids 1,17,300)\n"); return 2; }
    if (ids_arg && text) { fprintf(stderr, "gerbil run: give either a text prompt or --ids, not both\n"); return 2; }

    int32_t *prompt = NULL;
    int n_prompt = 0, rc = 1;
    char *stdin_text = NULL, *messages = NULL;
    struct textgen_out out = {0};
    if (ids_arg && cli_parse_ids(ids_arg, &prompt, &n_prompt)) return 2;
    if (cli_open(&o, &tg.model, &tg.session)) { free(prompt); return 1; }
    /* --ids prints ids: the tokenizer is only needed for a text prompt or --json's "text" */
    if ((text || json) && textgen_load_text(&tg, o.model)) goto done;
    if (text) {
        if (!tg.tok) {
            fprintf(stderr, "gerbil run: %s has no tokenizer (%s), so text prompts cannot be encoded; "
                            "pass token ids with --ids\n", o.model,
                    strstr(o.model, ".gguf") ? "no tokenizer.ggml.* metadata" : "no tokenizer.json");
            goto done;
        }
        if (!strcmp(text, "-")) {
            size_t n_in = 0;
            if (!(text = stdin_text = cli_read_all(stdin, &n_in))) { fprintf(stderr, "gerbil run: cannot read stdin\n"); goto done; }
            const char *nul = memchr(stdin_text, 0, n_in); /* a C-string prompt would silently end there */
            if (nul) {
                fprintf(stderr, "gerbil run: stdin holds a NUL byte at offset %zu (of %zu); the prompt must be text\n",
                        (size_t)(nul - stdin_text), n_in);
                goto done;
            }
        }
        /* a cheap early bound, before a huge prompt is rendered and tokenized */
        const int mtb = gerbil_tokenizer_max_token_bytes(tg.tok), n_ctx = gerbil_session_n_ctx(tg.session);
        if (mtb > 0 && strlen(text) / (size_t)mtb > (size_t)n_ctx) {
            fprintf(stderr, "gerbil run: the prompt of %zu bytes is at least %zu tokens (at most %d bytes a token), "
                            "so it does not fit the context of %d tokens; use a larger --ctx-size or a shorter prompt\n",
                    strlen(text), strlen(text) / (size_t)mtb, mtb, n_ctx);
            goto done;
        }
        if (tg.tmpl && !raw) {
            if (system && !(messages = textgen_messages_add(messages, "system", system))) goto oom;
            if (!(messages = textgen_messages_add(messages, "user", text))) goto oom;
            if (textgen_render(&tg, messages, &prompt, &n_prompt)) goto done;
        } else {
            if (system) fprintf(stderr, "gerbil run: --system ignored: %s\n",
                                raw ? "--raw sends the text as is" : "the model has no chat template");
            gerbil_status s = gerbil_tokenize(tg.tok, text, strlen(text), 1, &prompt, &n_prompt);
            if (s != GERBIL_OK) { cli_fail("tokenize", s); goto done; }
        }
        if (n_prompt == 0) { fprintf(stderr, "gerbil run: the prompt encodes to no tokens\n"); goto done; }
    }
    /* Text prompts stream text; --ids prompts keep printing ids (the parity contract). */
    FILE *stream = json || ids_arg ? NULL : stdout;
    if (textgen_run(&tg, prompt, n_prompt, stream, &out)) goto done;
    const gerbil_generate_result *r = &out.res;
    if (json) {
        print_json(&tg, prompt, n_prompt, &out);
    } else {
        if (ids_arg)
            for (int i = 0; i < out.n_ids; i++) printf(i ? " %d" : "%d", (int)out.ids[i]);
        printf("\n");
        fprintf(stderr, "[prompt: %d tokens, %.2f tok/s | generated: %d tokens, %.2f tok/s | stop: %s]\n", r->n_prompt,
                r->prompt_s > 0 ? r->n_prompt / r->prompt_s : 0, r->n_generated,
                r->n_generated > 1 && r->gen_s > 0 ? (r->n_generated - 1) / r->gen_s : 0, textgen_stop_name(&out));
    }
    rc = 0;
    goto done;
oom:
    fprintf(stderr, "gerbil run: out of memory\n");
done:
    textgen_out_free(&out);
    free(messages);
    free(stdin_text);
    free(prompt);
    gerbil_chat_template_free(tg.tmpl);
    gerbil_tokenizer_free(tg.tok);
    gerbil_session_free(tg.session);
    gerbil_model_free(tg.model);
    return rc;
}
