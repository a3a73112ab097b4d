/* gerbil pull org/name[@revision][:FILE.gguf] ... */
#include "cli.h"

#include <stdlib.h>
#include <string.h>

static void help(FILE *f) {
    fprintf(f, "usage: gerbil pull org/name[@revision][:FILE.gguf] ... [--token T]\n\n"
               "Downloads a model from the Hugging Face hub into the Hugging Face cache (shared with\n"
               "Python tools), fetching only what gerbil runs: config.json, generation_config.json,\n"
               "the tokenizer and chat template files, and the weights of one format: the\n"
               "*.safetensors (sharded or not), or one .gguf file. A repo holding several GGUF files\n"
               "needs :FILE.gguf or a tag such as :Q8_0; without one the Q4_K_M file is taken when\n"
               "there is one. Files already in the cache are not fetched again; an interrupted pull\n"
               "resumes where it stopped. Prints the local path of each model on stdout.\n\n"
               "options:\n"
               "      --token T    Hugging Face access token for gated or private repos\n"
               "                   (default: $HF_TOKEN)\n\n"
               "environment:\n"
               "  HF_TOKEN         access token, sent as Authorization: Bearer\n"
               "  HF_ENDPOINT      the hub (default https://huggingface.co)\n"
               "  HF_HUB_CACHE     the cache folder (default $HF_HOME/hub, ~/.cache/huggingface/hub)\n"
               "  HF_HUB_OFFLINE   1: never use the network (pull only checks the cache)\n");
}

int cmd_pull(int argc, char **argv) {
    const char *token = NULL;
    int n_refs = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { help(stdout); return 0; }
        if (!strcmp(argv[i], "--token")) {
            if (!(token = cli_value(argc, argv, &i))) return 2;
            continue;
        }
        if (argv[i][0] == '-') {
            fprintf(stderr, "gerbil pull: unknown option \"%s\"\n", argv[i]);
            help(stderr);
            return 2;
        }
        n_refs++;
    }
    if (!n_refs) { fprintf(stderr, "gerbil pull: give a repo id such as Qwen/Qwen3-0.6B\n"); help(stderr); return 2; }
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--token")) { i++; continue; }
        gerbil_hub_params p = cli_hub_params(token);
        char *path = NULL;
        gerbil_status st = gerbil_hub_pull(argv[i], &p, &path);
        if (st != GERBIL_OK) {
            fprintf(stderr, "gerbil pull: %s: %s: %s\n", argv[i], gerbil_status_name(st), gerbil_last_error());
            return 1;
        }
        if (!cli_hub_transferred())
            fprintf(stderr, "%s is up to date%s\n", argv[i], p.offline ? " (offline: not checked with the hub)" : "");
        printf("%s\n", path);
        free(path);
    }
    return 0;
}
