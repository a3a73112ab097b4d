/* gerbil info --model M */
#include "cli.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

static void help(FILE *f) {
    fprintf(f, "usage: gerbil info [--model] M [--json]\n\n"
               "Prints the architecture, parameter count, format, weight dtypes and the memory needed,\n"
               "from the model's metadata (the weights are mapped, not read: instant, little memory),\n"
               "the backend the model loaded on and the devices --device can choose.\n"
               "M is a folder, a .gguf file or a Hugging Face repo id (downloaded when not cached).\n"
               "      --json           one JSON object: the same fields, named as the lines are\n");
    cli_print_model_opts_help(f);
}

/* The description's "name:   value" lines as one JSON object ("memory needed" -> "memory_needed"). */
static void print_json(const char *ref, const char *path, const char *desc) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model", ref);
    cJSON_AddStringToObject(o, "path", path);
    for (const char *p = desc; p && *p;) {
        const char *nl = strchr(p, '\n'), *end = nl ? nl : p + strlen(p), *colon = memchr(p, ':', (size_t)(end - p));
        if (colon) {
            char key[64], val[1024];
            snprintf(key, sizeof key, "%.*s", (int)(colon - p), p);
            for (char *k = key; *k; k++)
                if (*k == ' ') *k = '_';
            const char *v = colon + 1;
            while (*v == ' ') v++;
            snprintf(val, sizeof val, "%.*s", (int)(end - v), v);
            char *num_end;
            double x = strtod(val, &num_end);
            /* numbers as numbers: "4", and the count of "parameters: 596049920 (596.05 M)" */
            if (num_end != val && (!*num_end || !strcmp(key, "parameters"))) cJSON_AddNumberToObject(o, key, x);
            else cJSON_AddStringToObject(o, key, val);
        }
        p = nl ? nl + 1 : NULL;
    }
    char *js = cJSON_Print(o);
    if (js) printf("%s\n", js);
    free(js);
    cJSON_Delete(o);
}

int cmd_info(int argc, char **argv) {
    struct cli_model_opts o = {.n_threads = 1, .use_mmap = 1}; /* mapped: the weights are never read */
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ctx-size") || !strcmp(argv[i], "-c") || !strcmp(argv[i], "--kv-type")) {
            fprintf(stderr, "gerbil info: %s is not used: info reports the KV cache per token and at the trained "
                            "context (at most 4096), f16\n", argv[i]);
            return 2;
        }
        int r = cli_parse_model_opt(argc, argv, &i, &o);
        if (r < 0) return 2;
        if (r) continue;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { help(stdout); return 0; }
        if (!strcmp(argv[i], "--json")) { json = 1; continue; }
        if (argv[i][0] != '-' && !o.model) { o.model = argv[i]; continue; }
        fprintf(stderr, "gerbil info: unknown option \"%s\"\n", argv[i]);
        help(stderr);
        return 2;
    }
    gerbil_model_t m;
    if (cli_open(&o, &m, NULL)) return 1;
    char buf[4096];
    gerbil_model_describe(m, buf, sizeof buf);
    if (json) print_json(o.ref, o.path, buf);
    else if (strcmp(o.ref, o.path)) printf("model:          %s\npath:           %s\n%s", o.ref, o.path, buf);
    else printf("model:          %s\n%s", o.ref, buf);
    if (!json) printf("backend:        %s\n", gerbil_model_backend(m));
    /* the devices --device can pick */
    if (!json) printf("devices:        cpu\n");
    for (int i = 0; !json && i < gerbil_gpu_count(); i++) {
        char name[256];
        size_t total = 0, avail = 0;
        if (gerbil_gpu_info(i, name, sizeof name, &total, &avail) == GERBIL_OK)
            printf("                cuda:%d  %s, %.1f GiB (%.1f GiB free)\n", i, name, total / 1073741824.0,
                   avail / 1073741824.0);
    }
    gerbil_model_free(m);
    return 0;
}
