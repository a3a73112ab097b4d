/* gerbil info --model M */
#include "cli.h"

#include <string.h>

static void help(FILE *f) {
    fprintf(f, "usage: gerbil info [--model] M\n\n"
               "Prints the architecture, parameter count, weight dtypes and the memory needed,\n"
               "the backend the model loaded on and the devices --device can choose.\n"
               "M is a folder, a .gguf file or a Hugging Face repo id (downloaded when not cached).\n");
    cli_print_model_opts_help(f);
}

int cmd_info(int argc, char **argv) {
    struct cli_model_opts o = {.n_threads = 1};
    for (int i = 1; i < argc; i++) {
        int r = cli_parse_model_opt(argc, argv, &i, &o);
        if (r < 0) return 2;
        if (r) continue;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { help(stdout); return 0; }
        if (argv[i][0] != '-' && !o.model) { o.model = argv[i]; continue; }
        fprintf(stderr, "gerbil info: unknown option \"%s\"\n", argv[i]);
        help(stderr);
        return 2;
    }
    gerbil_model_t m;
    if (cli_open(&o, &m, NULL)) return 1;
    char buf[4096];
    gerbil_model_describe(m, buf, sizeof buf);
    if (strcmp(o.ref, o.path)) printf("model:          %s\npath:           %s\n%s", o.ref, o.path, buf);
    else printf("model:          %s\n%s", o.ref, buf);
    printf("backend:        %s\n", gerbil_model_backend(m));
    /* the devices --device can pick */
    printf("devices:        cpu\n");
    for (int i = 0; i < gerbil_gpu_count(); i++) {
        char name[256];
        size_t total = 0, avail = 0;
        if (gerbil_gpu_info(i, name, sizeof name, &total, &avail) == GERBIL_OK)
            printf("                cuda:%d  %s, %.1f GiB (%.1f GiB free)\n", i, name, total / 1073741824.0,
                   avail / 1073741824.0);
    }
    gerbil_model_free(m);
    return 0;
}
