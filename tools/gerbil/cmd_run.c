/* gerbil run --model DIR --ids 1,17,300 [--max-tokens N] [sampling] [--json] */
#include "cli.h"

#include <stdlib.h>
#include <string.h>

static void help(FILE *f) {
    fprintf(f, "usage: gerbil run --model DIR --ids 1,17,300 [options]\n\n"
               "Generates tokens after the prompt ids and prints them as they come (ids separated\n"
               "by spaces), or one JSON object with --json.\n\noptions:\n"
               "      --ids LIST            prompt as comma-separated token ids\n"
               "  -n, --max-tokens N        tokens to generate (default 512)\n"
               "      --temperature T       0 = greedy (default 0.7)\n"
               "      --top-k K             keep the K most likely (default 50; 0 = off)\n"
               "      --top-p P             nucleus mass (default 0.9; 1 = off)\n"
               "      --min-p P             drop below P x top probability (default 0 = off)\n"
               "      --repeat-penalty R    CTRL-style repetition penalty (default 1.0 = off)\n"
               "      --seed S              sampling seed (default 0); same seed, same tokens\n"
               "      --ignore-eos          do not stop at end-of-sequence ids\n"
               "      --json                print {\"token_ids\": [...], \"timings\": {...}, ...}\n");
    cli_print_model_opts_help(f);
}

struct stream {
    int json;
    int n;
};

static int on_token(void *user, int32_t id) {
    struct stream *st = user;
    if (!st->json) {
        printf(st->n++ ? " %d" : "%d", (int)id);
        fflush(stdout);
    }
    return 0;
}

static const char *stop_name(gerbil_stop_reason r) {
    switch (r) {
    case GERBIL_STOP_EOS: return "eos";
    case GERBIL_STOP_CONTEXT: return "context";
    case GERBIL_STOP_CALLBACK: return "stopped";
    default: return "max_tokens";
    }
}

int cmd_run(int argc, char **argv) {
    struct cli_model_opts o = {0};
    gerbil_sampler_params sp = gerbil_sampler_default_params();
    gerbil_generate_params gp = gerbil_generate_default_params();
    const char *ids_arg = NULL, *text = NULL, *v = NULL;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r = cli_parse_model_opt(argc, argv, &i, &o);
        if (r < 0) return 2;
        if (r) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { help(stdout); return 0; }
        if (!strcmp(a, "--json")) { json = 1; continue; }
        if (!strcmp(a, "--ignore-eos")) { gp.ignore_eos = 1; continue; }
        static const char *value_flags[] = {"--ids", "--max-tokens", "-n", "--temperature", "--temp", "--top-k",
                                            "--top-p", "--min-p", "--repeat-penalty", "--repetition-penalty",
                                            "--seed"};
        int takes_value = 0;
        for (size_t k = 0; k < sizeof value_flags / sizeof value_flags[0]; k++) takes_value |= !strcmp(a, value_flags[k]);
        if (a[0] == '-' && a[1] && !takes_value) {
            fprintf(stderr, "gerbil run: unknown option \"%s\"\n", a);
            help(stderr);
            return 2;
        }
        if (takes_value && !(v = cli_value(argc, argv, &i))) return 2;
        int bad = 0;
        if (!strcmp(a, "--ids")) ids_arg = v;
        else if (!strcmp(a, "--max-tokens") || !strcmp(a, "-n")) bad = cli_parse_int(a, v, 0, 1 << 24, &gp.max_tokens);
        else if (!strcmp(a, "--temperature") || !strcmp(a, "--temp")) bad = cli_parse_float(a, v, &sp.temperature);
        else if (!strcmp(a, "--top-k")) bad = cli_parse_int(a, v, 0, 1 << 30, &sp.top_k);
        else if (!strcmp(a, "--top-p")) bad = cli_parse_float(a, v, &sp.top_p);
        else if (!strcmp(a, "--min-p")) bad = cli_parse_float(a, v, &sp.min_p);
        else if (!strcmp(a, "--repeat-penalty") || !strcmp(a, "--repetition-penalty"))
            bad = cli_parse_float(a, v, &sp.repetition_penalty);
        else if (!strcmp(a, "--seed")) {
            char *end;
            unsigned long long s = strtoull(v, &end, 10);
            if (end == v || *end) { fprintf(stderr, "gerbil run: --seed: expected an integer, got \"%s\"\n", v); return 2; }
            sp.seed = s;
        } else {
            if (text) { fprintf(stderr, "gerbil run: more than one prompt given\n"); return 2; }
            text = a;
        }
        if (bad) return 2;
    }
    if (text) {
        fprintf(stderr, "gerbil run: text prompts need the model's tokenizer, which this build does not "
                        "support yet; pass the prompt as token ids with --ids\n");
        return 2;
    }
    if (!ids_arg) { fprintf(stderr, "gerbil run: no prompt (use --ids 1,17,300)\n"); return 2; }
    int32_t *ids;
    int n;
    if (cli_parse_ids(ids_arg, &ids, &n)) return 2;

    gerbil_model_t m;
    gerbil_session_t s;
    if (cli_open(&o, &m, &s)) { free(ids); return 1; }
    gerbil_sampler_t sampler = NULL;
    int32_t *out = malloc(((size_t)gp.max_tokens + 1) * sizeof *out);
    gerbil_status st = out ? gerbil_sampler_new(&sp, gerbil_model_n_vocab(m), &sampler) : GERBIL_ERR_NOMEM;
    struct stream stream = {.json = json};
    gp.on_token = on_token;
    gp.user = &stream;
    gerbil_generate_result res = {0};
    if (st == GERBIL_OK) st = gerbil_generate(s, sampler, ids, n, &gp, out, &res);
    int rc = 0;
    double pp = res.prompt_s > 0 ? res.n_prompt / res.prompt_s : 0;
    double tg = res.n_generated > 1 && res.gen_s > 0 ? (res.n_generated - 1) / res.gen_s : 0;
    if (st != GERBIL_OK) {
        if (!json && stream.n) printf("\n");
        rc = cli_fail("generation failed", st);
    } else if (json) {
        printf("{\"prompt_ids\": [");
        for (int i = 0; i < n; i++) printf(i ? ", %d" : "%d", (int)ids[i]);
        printf("], \"token_ids\": [");
        for (int i = 0; i < res.n_generated; i++) printf(i ? ", %d" : "%d", (int)out[i]);
        printf("], \"n_prompt\": %d, \"n_generated\": %d, \"stop_reason\": \"%s\", "
               "\"timings\": {\"prompt_ms\": %.3f, \"prompt_tokens_per_s\": %.3f, "
               "\"gen_ms\": %.3f, \"gen_tokens_per_s\": %.3f}}\n",
               res.n_prompt, res.n_generated, stop_name(res.stop), res.prompt_s * 1e3, pp, res.gen_s * 1e3, tg);
    } else {
        printf("\n");
        fprintf(stderr, "[prompt: %d tokens, %.2f tok/s | generated: %d tokens, %.2f tok/s | stop: %s]\n",
                res.n_prompt, pp, res.n_generated, tg, stop_name(res.stop));
    }
    gerbil_sampler_free(sampler);
    free(out);
    free(ids);
    gerbil_session_free(s);
    gerbil_model_free(m);
    return rc;
}
