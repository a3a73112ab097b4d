/* gerbil tokenize --model DIR [--special] (TEXT | -)      -> {"ids": [...]}
 * gerbil tokenize --model DIR --decode 1,2,3 [--skip-special] -> {"text": "..."}
 * DIR may also be a .gguf file: its tokenizer.ggml.* metadata is the tokenizer. */
#include "cli.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static void help(FILE *f) {
    fprintf(f, "usage: gerbil tokenize --model DIR [--special] (TEXT | -)\n"
               "       gerbil tokenize --model DIR --decode 1,2,3 [--skip-special]\n\n"
               "Encodes TEXT (or standard input with -) with the tokenizer.json in DIR and prints\n"
               "JSON {\"ids\": [...]}; with --decode prints {\"text\": \"...\"}. Added and special\n"
               "tokens written in the text are recognised as Hugging Face tokenizers does.\n\noptions:\n"
               "      --model M        a folder holding tokenizer.json (tokenizer_config.json is\n"
               "                       used as transformers' AutoTokenizer does), a tokenizer.json file,\n"
               "                       a .gguf file (the vocabulary in its tokenizer.ggml.* metadata),\n"
               "                       or a Hugging Face repo id org/name (downloaded when not cached)\n"
               "      --special        add the special tokens of the post-processor (BOS etc.),\n"
               "                       as add_special_tokens=True\n"
               "      --decode LIST    decode comma-separated ids instead\n"
               "      --skip-special   with --decode: leave special tokens out\n");
}

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *text = NULL, *decode = NULL;
    int special = 0, skip_special = 0, have_text = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { help(stdout); return 0; }
        if (!strcmp(argv[i], "--special")) { special = 1; continue; }
        if (!strcmp(argv[i], "--skip-special")) { skip_special = 1; continue; }
        if (!strcmp(argv[i], "--model") || !strcmp(argv[i], "-m")) {
            if (!(model = cli_value(argc, argv, &i))) return 2;
            continue;
        }
        if (!strcmp(argv[i], "--decode")) {
            if (!(decode = cli_value(argc, argv, &i))) return 2;
            continue;
        }
        if (!strcmp(argv[i], "--")) {
            if (i + 1 < argc && !have_text) { text = argv[++i]; have_text = 1; continue; }
        }
        if (argv[i][0] == '-' && argv[i][1] && !have_text) {
            fprintf(stderr, "gerbil tokenize: unknown option \"%s\"\n", argv[i]);
            help(stderr);
            return 2;
        }
        if (have_text) {
            fprintf(stderr, "gerbil tokenize: give one TEXT (quote it), got a second: \"%s\"\n", argv[i]);
            return 2;
        }
        text = argv[i];
        have_text = 1;
    }
    if (!model && getenv("GERBIL_MODEL") && getenv("GERBIL_MODEL")[0]) model = getenv("GERBIL_MODEL");
    if (!model) { fprintf(stderr, "gerbil tokenize: --model is required (or set GERBIL_MODEL)\n"); help(stderr); return 2; }
    if (decode && have_text) { fprintf(stderr, "gerbil tokenize: --decode takes no TEXT\n"); return 2; }
    if (!decode && !have_text) { fprintf(stderr, "gerbil tokenize: TEXT (or - for standard input) is required\n"); return 2; }

    int32_t *ids = NULL;
    int n = 0;
    if (decode && cli_parse_ids(decode, &ids, &n)) return 2;
    char path[4096];
    if (cli_resolve_ref(model, NULL, path, sizeof path)) { free(ids); return 1; }
    model = path;
    gerbil_tokenizer_t tok;
    size_t ml = strlen(model);
    int gguf = ml >= 5 && !strcasecmp(model + ml - 5, ".gguf");
    gerbil_status st = gguf ? gerbil_tokenizer_load_gguf(model, &tok) : gerbil_tokenizer_load(model, &tok);
    if (st != GERBIL_OK) {
        free(ids);
        return cli_fail("cannot load the tokenizer", st);
    }
    int rc = 0;
    if (decode) {
        for (int i = 0; i < n; i++) {
            if (ids[i] < 0 || ids[i] >= gerbil_tokenizer_n_vocab(tok)) {
                fprintf(stderr, "gerbil tokenize: --decode: id %d is outside the vocabulary [0, %d)\n", ids[i],
                        gerbil_tokenizer_n_vocab(tok));
                rc = 2;
                break;
            }
        }
        char *out = NULL;
        size_t len = 0;
        if (!rc && (st = gerbil_detokenize(tok, ids, n, skip_special, &out, &len)) != GERBIL_OK)
            rc = cli_fail("decoding failed", st);
        if (!rc) {
            /* cJSON strings stop at NUL: print U+0000 as \u0000 ourselves */
            fputs("{\"text\": \"", stdout);
            size_t i = 0;
            while (i <= len) {
                size_t j = i;
                while (j < len && out[j]) j++;
                cJSON *s = cJSON_CreateString(out + i);
                char *js = s ? cJSON_PrintUnformatted(s) : NULL;
                if (!js) { rc = cli_fail("out of memory", GERBIL_ERR_NOMEM); cJSON_Delete(s); break; }
                size_t jl = strlen(js);
                fwrite(js + 1, 1, jl - 2, stdout);
                free(js);
                cJSON_Delete(s);
                if (j < len) fputs("\\u0000", stdout);
                i = j + 1;
            }
            if (!rc) fputs("\"}\n", stdout);
        }
        free(out);
    } else {
        size_t len = 0;
        char *buf = NULL;
        if (!strcmp(text, "-")) {
            if (!(buf = cli_read_all(stdin, &len))) {
                fprintf(stderr, "gerbil tokenize: cannot read standard input\n");
                rc = 1;
            }
        } else {
            len = strlen(text);
        }
        if (!rc && (st = gerbil_tokenize(tok, buf ? buf : text, len, special, &ids, &n)) != GERBIL_OK)
            rc = cli_fail("tokenization failed", st);
        if (!rc) {
            fputs("{\"ids\": [", stdout);
            for (int i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
            fputs("]}\n", stdout);
        }
        free(buf);
    }
    free(ids);
    gerbil_tokenizer_free(tok);
    return rc;
}
