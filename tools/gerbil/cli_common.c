#include "cli.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int cli_fail(const char *what, gerbil_status st) {
    const char *msg = gerbil_last_error();
    const char *name = gerbil_status_name(st);
    if (!strncmp(msg, name, strlen(name))) name = ""; /* "out of memory ..." says it already */
    fprintf(stderr, "gerbil: %s: %s%s%s\n", what, name, msg[0] && name[0] ? ": " : "", msg);
    return 1;
}

char *cli_read_all(FILE *f, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (cap - n < 2) {
            char *b = realloc(buf, cap * 2);
            if (!b) break;
            buf = b;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        if (!r) {
            if (ferror(f)) break;
            buf[n] = 0;
            if (len) *len = n;
            return buf;
        }
        n += r;
    }
    free(buf);
    return NULL;
}

char *cli_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *text = cli_read_all(f, len);
    fclose(f);
    return text;
}

const char *cli_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "gerbil: option %s needs a value\n", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

int cli_parse_int(const char *flag, const char *s, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "gerbil: %s: expected an integer in [%ld, %ld], got \"%s\"\n", flag, lo, hi, s);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int cli_parse_float(const char *flag, const char *s, float *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v)) {
        fprintf(stderr, "gerbil: %s: expected a number, got \"%s\"\n", flag, s);
        return -1;
    }
    *out = (float)v;
    return 0;
}

int cli_parse_ids(const char *s, int32_t **ids, int *n) {
    size_t cap = 1;
    for (const char *p = s; *p; p++) cap += *p == ',';
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) return -1;
    int k = 0;
    const char *p = s;
    for (;;) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < INT32_MIN || x > INT32_MAX || (*end && *end != ',')) {
            fprintf(stderr, "gerbil: --ids: expected comma-separated integers like 1,17,300, got \"%s\"\n", s);
            free(v);
            return -1;
        }
        v[k++] = (int32_t)x;
        if (!*end) break;
        p = end + 1;
    }
    *ids = v;
    *n = k;
    return 0;
}

int cli_parse_model_opt(int argc, char **argv, int *i, struct cli_model_opts *o) {
    const char *a = argv[*i], *v;
    if (!strcmp(a, "--model") || !strcmp(a, "-m")) {
        if (!(v = cli_value(argc, argv, i))) return -1;
        o->model = v;
        return 1;
    }
    if (!strcmp(a, "--token")) {
        if (!(v = cli_value(argc, argv, i))) return -1;
        o->token = v;
        return 1;
    }
    if (!strcmp(a, "--threads") || !strcmp(a, "-t")) {
        if (!(v = cli_value(argc, argv, i))) return -1;
        return cli_parse_int(a, v, 1, 1024, &o->n_threads) ? -1 : 1;
    }
    if (!strcmp(a, "--ctx-size") || !strcmp(a, "-c")) {
        if (!(v = cli_value(argc, argv, i))) return -1;
        return cli_parse_int(a, v, 1, 1 << 24, &o->n_ctx) ? -1 : 1;
    }
    if (!strcmp(a, "--mmap")) {
        o->use_mmap = 1;
        return 1;
    }
    if (!strcmp(a, "--backend")) {
        if (!(v = cli_value(argc, argv, i))) return -1;
        if (strcmp(v, "cpu") && strcmp(v, "ref")) {
            fprintf(stderr, "gerbil: --backend: expected cpu or ref, got \"%s\"\n", v);
            return -1;
        }
        o->backend = v;
        return 1;
    }
    if (!strcmp(a, "--kv-type")) {
        if (!(v = cli_value(argc, argv, i))) return -1;
        if (!strcmp(v, "f16")) o->kv_type = GERBIL_KV_F16;
        else if (!strcmp(v, "f32")) o->kv_type = GERBIL_KV_F32;
        else {
            fprintf(stderr, "gerbil: --kv-type: expected f16 or f32, got \"%s\"\n", v);
            return -1;
        }
        return 1;
    }
    return 0;
}

void cli_print_model_opts_help(FILE *f) {
    fprintf(f,
            "  -m, --model M        a Hugging Face model folder (config.json + *.safetensors), a .gguf\n"
            "                       file, or a repo id org/name[@revision][:FILE.gguf] (downloaded into\n"
            "                       the Hugging Face cache on first use; see gerbil pull --help);\n"
            "                       default: $GERBIL_MODEL\n"
            "      --token T        Hugging Face access token for gated/private repos (default: $HF_TOKEN)\n"
            "  -t, --threads N      worker threads (default: all CPUs)\n"
            "  -c, --ctx-size N     context size in tokens (default: the model's, at most 4096)\n"
            "      --kv-type T      KV cache type: f16 (default) or f32\n"
            "      --mmap           read weights in place from the file mapping instead of\n"
            "                       copying them into memory (less memory, slower decode)\n"
            "      --backend B      where the model runs: cpu (default) or ref (every op through its\n"
            "                       scalar reference kernel: slow, for checking numerics)\n");
}

/* A progress line for loads of big files: redrawn in place on a terminal, a line per
 * quarter otherwise. Small files load too fast to need one. */
static void load_progress(void *user, const char *path, size_t done, size_t total) {
    (void)user;
    static int last_quarter = -1;
    if (total < ((size_t)256 << 20)) return;
    const char *name = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    if (isatty(2)) {
        fprintf(stderr, "\rloading %s: %3.0f%% (%zu / %zu MiB)", name, 100.0 * done / total, done >> 20, total >> 20);
        if (done == total) fputc('\n', stderr);
    } else {
        int q = (int)(4.0 * done / total);
        if (q != last_quarter) fprintf(stderr, "loading %s: %d%%\n", name, q * 25);
        last_quarter = done == total ? -1 : q;
    }
}

/* o->model -> a local path in o->path. */
static int resolve_model(struct cli_model_opts *o) {
    const char *env = getenv("GERBIL_MODEL");
    if (!o->model && env && env[0]) o->model = env;
    if (!o->model && o->default_model) o->model = CLI_DEFAULT_MODEL;
    if (!o->model) {
        fprintf(stderr, "gerbil: no model given (use --model DIR, FILE.gguf or org/name, or set GERBIL_MODEL)\n");
        return 1;
    }
    o->ref = o->model;
    if (cli_resolve_ref(o->model, o->token, o->path, sizeof o->path)) return 1;
    o->model = o->path;
    return 0;
}

int cli_open(struct cli_model_opts *o, gerbil_model_t *m, gerbil_session_t *s) {
    if (resolve_model(o)) return 1;
    gerbil_model_params mp = gerbil_model_default_params();
    mp.n_threads = o->n_threads;
    mp.use_mmap = o->use_mmap;
    mp.backend = o->backend;
    mp.progress = load_progress;
    gerbil_status st = gerbil_model_load(o->model, &mp, m);
    if (st != GERBIL_OK) return cli_fail("cannot load model", st);
    if (!s) return 0;
    gerbil_session_params sp = gerbil_session_default_params();
    sp.n_ctx = o->n_ctx;
    sp.kv_type = o->kv_type;
    st = gerbil_session_new(*m, &sp, s);
    if (st != GERBIL_OK) {
        gerbil_model_free(*m);
        *m = NULL;
        return cli_fail("cannot create session", st);
    }
    return 0;
}
