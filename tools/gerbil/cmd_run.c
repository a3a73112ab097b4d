/* gerbil run [MODEL] ("prompt" | - | -f FILE | --ids 1,17,300) [options] */
#include "cli.h"
#include "textgen.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void help(FILE *f) {
    fprintf(f, "usage: gerbil run [MODEL | --model M] [\"prompt\" | - | -f FILE | --ids 1,17,300] [options]\n\n"
               "Generates text after a prompt and streams it to stdout. A text prompt goes through the\n"
               "model's chat template when it has one (as a user message) and its tokenizer; '-' reads\n"
               "the prompt from stdin. With --ids the prompt is token ids and the output is ids.\n"
               "MODEL before the prompt (a folder, a .gguf file or a repo id org/name) is --model's.\n"
               "Without --model (or $GERBIL_MODEL) the model is " CLI_DEFAULT_MODEL ",\n"
               "downloaded from the Hugging Face hub on first use.\n\noptions:\n"
               "      --ids LIST            prompt as comma-separated token ids\n"
               "  -f, --file FILE           read the prompt from FILE (one trailing newline dropped)\n"
               "      --raw                 send the text as is (no chat template; BOS as the tokenizer adds it)\n"
               "      --system TEXT         system message for the chat template\n"
               "      --chat-template FILE  use the Jinja chat template in FILE instead of the model's\n"
               "      --think, --no-think   set the template's enable_thinking (where it supports it)\n"
               "      --stop STR            stop when the text contains STR (repeatable; cut from the output)\n"
               "  -n, --max-tokens N        tokens to generate (default 512)\n"
               "      --temperature T       0 = greedy (default 0.7)\n"
               "      --top-k K             keep the K most likely (default 50; 0 = off)\n"
               "      --top-p P             nucleus mass (default 0.9; 1 = off)\n"
               "      --min-p P             drop below P x top probability (default 0 = off)\n"
               "      --repeat-penalty R    CTRL-style repetition penalty (default 1.0 = off)\n"
               "      --seed S              sampling seed (default -1: a random one, printed by --json and\n"
               "                            -v); the same seed gives the same tokens\n"
               "      --ignore-eos          do not stop at end-of-sequence ids\n"
               "      --json                print one object: {\"text\", \"token_ids\", \"seed\", \"timings\", ...}\n"
               "  -v, --verbose             say what runs: model, prompt tokens, sampling and the seed\n"
               "  -q, --quiet               no stats line, warnings or progress on stderr\n"
               "      --json-schema FILE    constrain the output to JSON matching this JSON Schema\n"
               "      --grammar FILE        constrain the output to a llama.cpp GBNF grammar\n"
               "      --regex RE            constrain the output to match RE (ECMAScript syntax)\n"
               "      --json-object         constrain the output to any JSON object (--json is the output format)\n");
    textgen_spec_help(f);
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
    printf("], \"n_prompt\": %d, \"n_generated\": %d, \"stop_reason\": \"%s\", \"seed\": %llu, "
           "\"timings\": {\"prompt_ms\": %.3f, \"prompt_tokens_per_s\": %.3f, "
           "\"gen_ms\": %.3f, \"gen_tokens_per_s\": %.3f",
           r->n_prompt, r->n_generated, textgen_stop_name(o), (unsigned long long)tg->sampling.seed, r->prompt_s * 1e3,
           pp, r->gen_s * 1e3, tgs);
    if (tg->gen.spec.kind != GERBIL_SPEC_NONE) /* speculative decoding: drafts and verify steps */
        printf(", \"spec\": \"%s\", \"spec_verify_steps\": %d, \"spec_drafted\": %d, \"spec_accepted\": %d, "
               "\"spec_acceptance_rate\": %.4f, \"spec_tokens_per_verify\": %.4f",
               tg->gen.spec.kind == GERBIL_SPEC_NGRAM ? "ngram" : "draft", r->n_verify, r->n_drafted, r->n_accepted,
               r->n_drafted ? (double)r->n_accepted / r->n_drafted : 0.0,
               r->n_verify ? (double)(r->n_accepted + r->n_verify) / r->n_verify : 0.0);
    printf("}}\n");
}

/* A prompt read from a file or stdin: one trailing newline dropped (as llama.cpp's -f),
 * since editors and echo end the text with one. */
static void strip_newline(char *t) {
    size_t n = strlen(t);
    if (n && t[n - 1] == '\n') t[--n] = 0;
    if (n && t[n - 1] == '\r') t[--n] = 0;
}

/* --json-schema / --grammar / --regex / --json-object: a constraint on the generation */
struct run_constraint {
    gerbil_grammar_vocab_t vocab;
    gerbil_grammar_t g;
    gerbil_grammar_state_t s;
};

static int run_constraint_open(struct run_constraint *rc, struct textgen *tg, const char *flag, const char *value) {
    if (!tg->tok) { fprintf(stderr, "gerbil run: %s needs the model's tokenizer\n", flag); return 1; }
    gerbil_grammar_kind kind;
    char *src = NULL;
    size_t len = 0;
    if (cli_grammar_source(flag, value, &kind, &src, &len)) return 1;
    int32_t eos[16];
    int n_eos = gerbil_model_eos_ids(tg->model, eos, 16);
    gerbil_status st = gerbil_grammar_vocab_new(tg->tok, gerbil_model_n_vocab(tg->model), eos, n_eos, &rc->vocab);
    /* at most one whitespace byte between JSON tokens: a small model at temperature 1 would
     * otherwise spend its tokens on whitespace */
    gerbil_grammar_params gp = gerbil_grammar_default_params();
    gp.max_whitespace = 1;
    if (st == GERBIL_OK) st = gerbil_grammar_compile(rc->vocab, kind, src, len, &gp, &rc->g);
    if (st == GERBIL_OK) st = gerbil_grammar_state_new(rc->g, &rc->s);
    free(src);
    if (st != GERBIL_OK) return cli_fail(flag + 2, st);
    tg->gen.grammar = rc->s;
    return 0;
}

static void run_constraint_close(struct run_constraint *rc) {
    gerbil_grammar_state_free(rc->s);
    gerbil_grammar_free(rc->g);
    gerbil_grammar_vocab_free(rc->vocab);
}

static int run_main(int argc, char **argv, const unsigned char *attached) {
    struct cli_model_opts o = {.default_model = 1, .lora_ok = 1};
    struct textgen tg = {.sampling = gerbil_sampler_default_params(), .gen = gerbil_generate_default_params()};
    const char *ids_arg = NULL, *text = NULL, *system = NULL, *v = NULL, *file = NULL, *pos[2];
    int json = 0, raw = 0, n_pos = 0;
    const char *cflag = NULL, *cval = "";
    struct run_constraint rcon = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r = cli_parse_model_opt(argc, argv, &i, &o);
        if (!r) r = textgen_parse_opt(&tg, "run", argc, argv, &i);
        if (r < 0) return 2;
        if (r) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { help(stdout); return 0; }
        if (!strcmp(a, "--json")) { json = 1; continue; }
        if (!strcmp(a, "--json-schema") || !strcmp(a, "--grammar") || !strcmp(a, "--regex") || !strcmp(a, "--json-object")) {
            if (cflag) { fprintf(stderr, "gerbil run: give one of --json-schema, --grammar, --regex, --json-object\n"); return 2; }
            cflag = a;
            if (strcmp(a, "--json-object") && !(cval = cli_value(argc, argv, &i))) return 2;
            continue;
        }
        if (!strcmp(a, "--raw")) { raw = 1; continue; }
        if (!strcmp(a, "--ids") || !strcmp(a, "--system") || !strcmp(a, "-f") || !strcmp(a, "--file")) {
            if (!(v = cli_value(argc, argv, &i))) return 2;
            *(!strcmp(a, "--ids") ? &ids_arg : !strcmp(a, "--system") ? &system : &file) = v;
            continue;
        }
        if (attached[i]) {
            fprintf(stderr, "gerbil run: option %s takes no value (got \"%s\")\n", argv[i - 1], a);
            return 2;
        }
        if (a[0] == '-' && a[1]) {
            cli_unknown_option("run", a, help);
            return 2;
        }
        if (n_pos == 2) { fprintf(stderr, "gerbil run: more than one prompt given\n"); return 2; }
        pos[n_pos++] = a;
    }
    /* MODEL "prompt", as ollama run: the first of two positionals names the model */
    if (n_pos == 2 || (n_pos == 1 && (ids_arg || file) && !o.model && cli_looks_like_model(pos[0]))) {
        if (o.model || !cli_looks_like_model(pos[0])) {
            fprintf(stderr, "gerbil run: more than one prompt given (%s)\n",
                    o.model ? "the model is --model's" : "the first is no model folder, .gguf file or org/name repo id");
            return 2;
        }
        o.model = pos[0];
        pos[0] = pos[1];
        n_pos--;
    }
    if (n_pos == 1) text = pos[0];
    struct stat st;
    if (text && !o.model && !ids_arg && !file && stat(text, &st) == 0 && cli_looks_like_model(text)) {
        fprintf(stderr, "gerbil run: no prompt after the model %s (give text, '-' for stdin, -f FILE or --ids; "
                        "gerbil chat %s for a conversation)\n", text, text);
        return 2;
    }
    if (!ids_arg && !text && !file) {
        fprintf(stderr, "gerbil run: no prompt (give text, '-' for stdin, -f FILE, or --ids 1,17,300)\n");
        return 2;
    }
    if (!!ids_arg + !!text + !!file > 1) {
        fprintf(stderr, "gerbil run: give one prompt: text, '-', -f FILE or --ids, not several\n");
        return 2;
    }
    if (textgen_spec_check(&tg, "run")) return 2;
    textgen_seed(&tg);

    int32_t *prompt = NULL;
    int n_prompt = 0, rc = 1;
    char *stdin_text = NULL, *messages = NULL;
    struct textgen_out out = {0};
    if (ids_arg && cli_parse_ids(ids_arg, &prompt, &n_prompt)) return 2;
    if (file) {
        size_t n_file = 0;
        if (!(text = stdin_text = cli_read_file(file, &n_file))) {
            fprintf(stderr, "gerbil run: -f: cannot read %s: %s\n", file, strerror(errno));
            return 2;
        }
        const char *nul = memchr(stdin_text, 0, n_file); /* a C-string prompt would silently end there */
        if (nul) {
            fprintf(stderr, "gerbil run: -f: %s holds a NUL byte at offset %zu (of %zu); the prompt must be text\n", file,
                    (size_t)(nul - stdin_text), n_file);
            free(stdin_text);
            return 2;
        }
        strip_newline(stdin_text);
    }
    /* the prompt is encoded before the weights load: its mistakes cost no load */
    if (cli_resolve_model(&o)) goto done;
    /* --ids prints ids: the tokenizer is only needed for a text prompt or --json's "text" */
    if ((text || json || cflag) && textgen_load_text(&tg, o.model)) goto done;
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
            strip_newline(stdin_text);
        }
        /* a cheap early bound, before a huge prompt is rendered and tokenized */
        const int mtb = gerbil_tokenizer_max_token_bytes(tg.tok), n_ctx = o.n_ctx > 0 ? o.n_ctx : 4096;
        /* (before the load: --ctx-size, else the default context's upper bound, 4096 positions;
         * the exact count is checked once the prompt is tokenized) */
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
            else if (!raw && !tg.quiet)
                fprintf(stderr, "gerbil run: warning: %s has no chat template, so the prompt is sent as is "
                                "(--chat-template FILE gives one; --raw says this is meant)\n", o.ref);
            gerbil_status s = gerbil_tokenize(tg.tok, text, strlen(text), 1, &prompt, &n_prompt);
            if (s != GERBIL_OK) { cli_fail("tokenize", s); goto done; }
        }
        if (n_prompt == 0) { fprintf(stderr, "gerbil run: the prompt encodes to no tokens\n"); goto done; }
    }
    o.quiet = tg.quiet;
    if (cli_open(&o, &tg.model, &tg.session)) goto done;
    if (textgen_open_draft(&tg, "run", &o)) goto done;
    if (cflag && tg.gen.spec.kind != GERBIL_SPEC_NONE) {
        fprintf(stderr, "gerbil run: --spec does not combine with %s yet\n", cflag);
        goto done;
    }
    /* the constraint needs the model's vocabulary size and EOS ids */
    if (cflag && run_constraint_open(&rcon, &tg, cflag, cval)) goto done;
    if (tg.verbose)
        fprintf(stderr, "gerbil run: model %s; prompt %d tokens; temperature %g, top-k %d, top-p %g, min-p %g, "
                        "repeat-penalty %g; seed %llu\n", o.model, n_prompt, tg.sampling.temperature, tg.sampling.top_k,
                tg.sampling.top_p, tg.sampling.min_p, tg.sampling.repetition_penalty,
                (unsigned long long)tg.sampling.seed);
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
        fflush(stdout);
        if (!tg.quiet)
            fprintf(stderr, "[prompt: %d tokens, %.2f tok/s | generated: %d tokens, %.2f tok/s | stop: %s]\n",
                    r->n_prompt, r->prompt_s > 0 ? r->n_prompt / r->prompt_s : 0, r->n_generated,
                    r->n_generated > 1 && r->gen_s > 0 ? (r->n_generated - 1) / r->gen_s : 0, textgen_stop_name(&out));
    }
    rc = 0;
    goto done;
oom:
    fprintf(stderr, "gerbil run: out of memory\n");
done:
    run_constraint_close(&rcon);
    textgen_out_free(&out);
    free(messages);
    free(stdin_text);
    free(prompt);
    gerbil_chat_template_free(tg.tmpl);
    gerbil_tokenizer_free(tg.tok);
    gerbil_session_free(tg.session);
    gerbil_model_free(tg.model);
    textgen_spec_free(&tg);
    return rc;
}

int cmd_run(int argc, char **argv) {
    struct cli_args a;
    if (cli_args_expand(argc, argv, &a)) return 1;
    int rc = run_main(a.argc, a.argv, a.attached);
    cli_args_free(&a);
    return rc;
}
