/* gerbil logits --model M --ids 1,17,300 [--all]
 * prints {"n_vocab": V, "logits": [[...], ...]}: the last position, or every one. */
#include "cli.h"

#include <stdlib.h>
#include <string.h>

static void help(FILE *f) {
    fprintf(f, "usage: gerbil logits --model M --ids 1,17,300 [--all] [options]\n\n"
               "Runs the ids through the model and prints JSON {\"n_vocab\": V, \"logits\": [[...]]}:\n"
               "the logits of the last position, or of every position with --all.\n\noptions:\n"
               "      --ids LIST       comma-separated token ids\n"
               "      --all            print the logits of every position\n");
    cli_print_model_opts_help(f);
}

int cmd_logits(int argc, char **argv) {
    struct cli_model_opts o = {.lora_ok = 1};
    const char *ids_arg = NULL;
    int all = 0;
    for (int i = 1; i < argc; i++) {
        int r = cli_parse_model_opt(argc, argv, &i, &o);
        if (r < 0) return 2;
        if (r) continue;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { help(stdout); return 0; }
        if (!strcmp(argv[i], "--all")) { all = 1; continue; }
        if (!strcmp(argv[i], "--ids")) {
            if (!(ids_arg = cli_value(argc, argv, &i))) return 2;
            continue;
        }
        fprintf(stderr, "gerbil logits: unknown option \"%s\"\n", argv[i]);
        help(stderr);
        return 2;
    }
    if (!ids_arg) { fprintf(stderr, "gerbil logits: --ids is required\n"); return 2; }
    int32_t *ids;
    int n;
    if (cli_parse_ids(ids_arg, &ids, &n)) return 2;

    gerbil_model_t m;
    gerbil_session_t s;
    if (cli_open(&o, &m, &s)) { free(ids); return 1; }
    const int V = gerbil_model_n_vocab(m);
    const int rows = all ? n : 1;
    float *logits = malloc((size_t)rows * V * sizeof(float));
    gerbil_status st = logits ? gerbil_session_eval(s, ids, n, logits, all) : GERBIL_ERR_NOMEM;
    int rc = 0;
    if (st != GERBIL_OK) {
        rc = cli_fail("evaluation failed", st);
    } else {
        printf("{\"n_vocab\": %d, \"logits\": [", V);
        for (int r = 0; r < rows; r++) {
            printf(r ? ", [" : "[");
            for (int i = 0; i < V; i++) printf(i ? ", %.9g" : "%.9g", logits[(size_t)r * V + i]);
            printf("]");
        }
        printf("]}\n");
    }
    free(logits);
    free(ids);
    gerbil_session_free(s);
    gerbil_model_free(m);
    return rc;
}
