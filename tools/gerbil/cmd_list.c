/* gerbil list: the models in the Hugging Face cache. */
#include "cli.h"
#include "hub/hub.h"

#include <stdlib.h>
#include <string.h>

static void help(FILE *f) {
    fprintf(f, "usage: gerbil list\n\n"
               "Lists the models in the Hugging Face cache ($HF_HUB_CACHE, $HF_HOME/hub or\n"
               "~/.cache/huggingface/hub), those of Python tools included: one line per snapshot with\n"
               "the repo, the revisions pointing at it, the commit, the format gerbil would run\n"
               "(safetensors, gguf, or incomplete) and the size of its files.\n");
}

int cmd_list(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { help(stdout); return 0; }
        fprintf(stderr, "gerbil list: unknown option \"%s\"\n", argv[i]);
        help(stderr);
        return 2;
    }
    gerbil_hub_params p = gerbil_hub_default_params();
    gerbil_hub_entry *e;
    int n;
    gerbil_status st = gerbil_hub_list(&p, &e, &n);
    if (st != GERBIL_OK) return cli_fail("cannot list the cache", st);
    if (n == 0) {
        char *dir = gerbil_hub_cache_dir(&p);
        printf("no models in %s (gerbil pull org/name downloads one)\n", dir ? dir : "the cache");
        free(dir);
        return 0;
    }
    int w = 4;
    for (int i = 0; i < n; i++)
        if ((int)strlen(e[i].repo) > w) w = (int)strlen(e[i].repo);
    printf("%-*s  %-12s  %-12s  %-11s  %10s\n", w, "REPO", "REVISION", "COMMIT", "FORMAT", "SIZE");
    for (int i = 0; i < n; i++) {
        char size[32];
        printf("%-*s  %-12s  %-12.12s  %-11s  %10s\n", w, e[i].repo, e[i].revisions[0] ? e[i].revisions : "-",
               e[i].commit, e[i].format, hub_fmt_bytes(e[i].bytes, size, sizeof size));
    }
    gerbil_hub_list_free(e, n);
    return 0;
}
