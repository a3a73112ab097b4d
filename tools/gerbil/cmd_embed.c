/* gerbil embed --model M [--prompt-name NAME] [--dimensions N] (TEXT... | -)
 * prints {"model": M, "dim": N, "embeddings": [[...], ...]} in input order. */
#include "cli.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void help(FILE *f) {
    fprintf(f, "usage: gerbil embed --model M [--prompt-name NAME] [--dimensions N] (TEXT... | -) [options]\n\n"
               "Embeds each TEXT (or each line of standard input with -) with a sentence-transformers model\n"
               "(modules.json: Transformer -> Pooling -> Dense ... -> Normalize; e.g. Qwen3-Embedding,\n"
               "EmbeddingGemma) and prints JSON {\"model\", \"dim\", \"embeddings\": [[...], ...]} in input\n"
               "order. The texts are evaluated together in batches; each one's embedding is what it gets alone.\n\n"
               "options:\n"
               "      --prompt-name NAME  prepend the folder's prompt NAME (config_sentence_transformers.json,\n"
               "                          e.g. query, document); default: its default_prompt_name, if any\n"
               "      --prompt TEXT       prepend TEXT instead (e.g. \"Instruct: TASK\\nQuery:\" for Qwen3-Embedding)\n"
               "      --dimensions N      keep the first N values and renormalise (Matryoshka)\n");
    cli_print_model_opts_help(f);
}

static void print_json_string(const char *s) {
    cJSON *j = cJSON_CreateString(s);
    char *p = j ? cJSON_PrintUnformatted(j) : NULL;
    fputs(p ? p : "\"\"", stdout);
    free(p);
    cJSON_Delete(j);
}

int cmd_embed(int argc, char **argv) {
    struct cli_model_opts o = {0};
    const char *prompt_name = NULL, *prompt = NULL, *given = NULL;
    int dims = 0, from_stdin = 0, n = 0;
    const char **texts = calloc((size_t)argc + 1, sizeof *texts);
    if (!texts) return cli_fail("out of memory", GERBIL_ERR_NOMEM);
    int rc = 0;
    for (int i = 1; i < argc; i++) {
        int r = cli_parse_model_opt(argc, argv, &i, &o);
        if (r < 0) { rc = 2; goto done; }
        if (r) continue;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { help(stdout); goto done; }
        if (!strcmp(argv[i], "--prompt-name")) {
            if (!(prompt_name = cli_value(argc, argv, &i))) { rc = 2; goto done; }
        } else if (!strcmp(argv[i], "--prompt")) {
            if (!(prompt = cli_value(argc, argv, &i))) { rc = 2; goto done; }
        } else if (!strcmp(argv[i], "--dimensions")) {
            const char *v = cli_value(argc, argv, &i);
            if (!v || cli_parse_int("--dimensions", v, 1, 1 << 20, &dims)) { rc = 2; goto done; }
        } else if (!strcmp(argv[i], "-")) {
            from_stdin = 1;
        } else if (!strcmp(argv[i], "--")) {
            while (++i < argc) texts[n++] = argv[i];
        } else if (argv[i][0] == '-' && argv[i][1]) {
            cli_unknown_option("embed", argv[i], help);
            rc = 2;
            goto done;
        } else {
            texts[n++] = argv[i];
        }
    }
    if (from_stdin && n) {
        fprintf(stderr, "gerbil embed: give TEXT arguments or - (standard input), not both\n");
        rc = 2;
        goto done;
    }
    if (!from_stdin && !n) {
        fprintf(stderr, "gerbil embed: TEXT (or - for one input per line of standard input) is required\n");
        help(stderr);
        rc = 2;
        goto done;
    }
    given = o.model ? o.model : getenv("GERBIL_MODEL");
    char *input = NULL;
    if (from_stdin) { /* one input per line; a last newline ends the last line */
        size_t len = 0;
        if (!(input = cli_read_all(stdin, &len))) {
            fprintf(stderr, "gerbil embed: cannot read standard input\n");
            rc = 1;
            goto done;
        }
        if (memchr(input, 0, len)) {
            fprintf(stderr, "gerbil embed: standard input holds a NUL byte\n");
            free(input);
            rc = 2;
            goto done;
        }
        size_t lines = 1;
        for (size_t k = 0; k < len; k++) lines += input[k] == '\n';
        free(texts);
        texts = calloc(lines + 1, sizeof *texts);
        if (!texts) { free(input); return cli_fail("out of memory", GERBIL_ERR_NOMEM); }
        for (char *p = input; p < input + len;) {
            char *nl = memchr(p, '\n', (size_t)(input + len - p));
            char *end = nl ? nl : input + len;
            if (end > p && end[-1] == '\r') end[-1] = 0;
            *end = 0;
            texts[n++] = p;
            p = end + 1;
        }
        if (!n) {
            fprintf(stderr, "gerbil embed: standard input holds no lines\n");
            free(input);
            rc = 2;
            goto done;
        }
    }
    gerbil_model_t m = NULL;
    gerbil_tokenizer_t tok = NULL;
    gerbil_embedder_t e = NULL;
    if (cli_open(&o, &m, NULL)) { rc = 1; goto free_input; }
    if (cli_load_tokenizer(o.model, &tok)) { rc = 1; goto free_model; }
    gerbil_status st = gerbil_embedder_new(m, tok, o.model, &e);
    if (st != GERBIL_OK) { rc = cli_fail("cannot embed with this model", st); goto free_model; }
    const gerbil_embed_options eo = {.prompt_name = prompt_name, .prompt = prompt, .dimensions = dims};
    if (dims > gerbil_embedder_dim(e)) {
        fprintf(stderr, "gerbil embed: --dimensions %d is out of range: this model's embeddings have %d (1 .. %d)\n",
                dims, gerbil_embedder_dim(e), gerbil_embedder_dim(e));
        rc = 2;
        goto free_model;
    }
    const int dim = dims ? dims : gerbil_embedder_dim(e);
    float *out = malloc((size_t)n * dim * sizeof(float));
    if (!out) { rc = cli_fail("out of memory", GERBIL_ERR_NOMEM); goto free_model; }
    const int show = isatty(2) && n > 256, step = 256; /* progress on a terminal for many inputs */
    for (int i = 0; i < n && !rc; i += step) {
        const int k = n - i < step ? n - i : step;
        st = gerbil_embed(e, texts + i, k, &eo, out + (size_t)i * dim, NULL);
        if (st != GERBIL_OK) {
            if (st == GERBIL_ERR_INVALID_ARG) {
                fprintf(stderr, "gerbil embed: %s\n", gerbil_last_error());
                rc = 2;
            } else {
                rc = cli_fail("embedding failed", st);
            }
        }
        if (show) fprintf(stderr, "\rembedded %d of %d", i + k, n);
    }
    if (show) fputc('\n', stderr);
    if (!rc) {
        fputs("{\"model\": ", stdout);
        print_json_string(given ? given : o.model);
        printf(", \"dim\": %d, \"embeddings\": [", dim);
        for (int i = 0; i < n; i++) {
            fputs(i ? ", [" : "[", stdout);
            for (int d = 0; d < dim; d++) printf(d ? ", %.9g" : "%.9g", out[(size_t)i * dim + d]);
            fputc(']', stdout);
        }
        fputs("]}\n", stdout);
    }
    free(out);
free_model:
    gerbil_embedder_free(e);
    gerbil_tokenizer_free(tok);
    gerbil_model_free(m);
free_input:
    free(input);
done:
    free(texts);
    return rc;
}
