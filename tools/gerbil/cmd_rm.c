/* gerbil rm org/name ...: delete repos from the Hugging Face cache. */
#include "cli.h"

#include <string.h>

static void help(FILE *f) {
    fprintf(f, "usage: gerbil rm org/name ...\n\n"
               "Deletes each repo from the Hugging Face cache: every snapshot, revision and file of it\n"
               "(also those downloaded by Python tools). `gerbil list` shows what is there.\n");
}

int cmd_rm(int argc, char **argv) {
    int n = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { help(stdout); return 0; }
        if (argv[i][0] == '-') {
            fprintf(stderr, "gerbil rm: unknown option \"%s\"\n", argv[i]);
            help(stderr);
            return 2;
        }
        n++;
    }
    if (!n) { fprintf(stderr, "gerbil rm: give the repo to remove, e.g. gerbil rm Qwen/Qwen3-0.6B\n"); return 2; }
    gerbil_hub_params p = gerbil_hub_default_params();
    int rc = 0;
    for (int i = 1; i < argc; i++) {
        uint64_t freed = 0;
        gerbil_status st = gerbil_hub_remove(argv[i], &p, &freed);
        if (st != GERBIL_OK) {
            fprintf(stderr, "gerbil rm: %s: %s\n", gerbil_status_name(st), gerbil_last_error());
            rc = 1;
            continue;
        }
        printf("removed %s (%.1f MiB freed)\n", argv[i], freed / 1048576.0);
    }
    return rc;
}
