#include "cli.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <ctype.h>
#include <dirent.h>
#include <sys/stat.h>

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
    if (!strcmp(a, "--device")) {
        if (!(v = cli_value(argc, argv, i))) return -1;
        const char *n = !strncmp(v, "cuda:", 5) ? v + 5 : "";
        int ok = !strcmp(v, "cpu") || !strcmp(v, "cuda") || (*n && strspn(n, "0123456789") == strlen(n) && strlen(n) < 5);
        if (!ok) {
            fprintf(stderr, "gerbil: --device: expected cpu, cuda or cuda:N, got \"%s\"\n", v);
            return -1;
        }
        o->backend = v;
        return 1;
    }
    if (!strcmp(a, "--lora")) {
        if (!(v = cli_value(argc, argv, i))) return -1;
        if (o->n_lora == 8) {
            fprintf(stderr, "gerbil: --lora: at most 8 adapters\n");
            return -1;
        }
        /* PATH:SCALE when the text after the last ':' is a number and PATH the rest */
        const char *colon = strrchr(v, ':');
        char *end = NULL;
        float sc = 1.0f;
        struct stat sb;
        if (colon && colon[1] && stat(v, &sb) != 0) {
            sc = strtof(colon + 1, &end);
            if (*end || !(sc == sc)) {
                fprintf(stderr, "gerbil: --lora: \"%s\": expected PATH or PATH:SCALE (SCALE a number)\n", v);
                return -1;
            }
            static char paths[8][4096]; /* the PATH parts, for as long as the process runs */
            if ((size_t)(colon - v) >= sizeof paths[0]) {
                fprintf(stderr, "gerbil: --lora: path too long\n");
                return -1;
            }
            memcpy(paths[o->n_lora], v, (size_t)(colon - v));
            paths[o->n_lora][colon - v] = 0;
            v = paths[o->n_lora];
        }
        o->lora[o->n_lora] = v;
        o->lora_scale[o->n_lora++] = sc;
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
            "                       scalar reference kernel: slow, for checking numerics)\n"
            "      --device D       cpu, cuda or cuda:N (GPU N); default: GPU 0 when this build has\n"
            "                       CUDA and the machine a GPU, else cpu (gerbil info lists them)\n"
            "      --lora P[:S]     apply a LoRA adapter (PEFT or mlx-lm folder, GGUF adapter) at scale S\n"
            "                       (default 1); repeatable: the adapters are summed (run, chat, logits, bench)\n");
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
int cli_resolve_model(struct cli_model_opts *o) {
    const char *env = getenv("GERBIL_MODEL");
    if (!o->model && env && env[0]) o->model = env, o->from_env = 1;
    if (!o->model && o->default_model) o->model = CLI_DEFAULT_MODEL;
    if (!o->model) {
        fprintf(stderr, "gerbil: no model given (use --model DIR, FILE.gguf or org/name, or set GERBIL_MODEL)\n");
        return 1;
    }
    o->ref = o->model;
    /* a file of a Hugging Face folder: the folder is what loads */
    struct stat st;
    const char *base = strrchr(o->model, '/') ? strrchr(o->model, '/') + 1 : o->model;
    size_t bl = strlen(base);
    if (stat(o->model, &st) == 0 && S_ISREG(st.st_mode) &&
        ((bl > 12 && !strcmp(base + bl - 12, ".safetensors")) || (bl > 5 && !strcmp(base + bl - 5, ".json")))) {
        int dl = (int)(base - o->model) - 1; /* the folder part, without its last '/' */
        fprintf(stderr, "gerbil: %s%s is a file of a model folder; pass the folder: --model %.*s\n", o->model,
                o->from_env ? " (from $GERBIL_MODEL)" : "", dl > 0 ? dl : 1, dl > 0 ? o->model : dl ? "." : "/");
        return 1;
    }
    if (cli_resolve_ref(o->model, o->token, o->path, sizeof o->path)) {
        if (o->from_env) fprintf(stderr, "gerbil: (the model \"%s\" came from $GERBIL_MODEL)\n", o->ref);
        return 1;
    }
    o->model = o->path;
    if (stat(o->model, &st) != 0) {
        fprintf(stderr, "gerbil: cannot load model: %s: %s%s\n", o->model,
                errno == ENOENT ? "no such file or directory (expected a Hugging Face model folder or a .gguf file)"
                                : strerror(errno),
                o->from_env ? " (from $GERBIL_MODEL)" : "");
        return 1;
    }
    return 0;
}

int cli_looks_like_model(const char *ref) {
    struct stat st;
    size_t n = strlen(ref);
    int gguf = n > 5 && !strcmp(ref + n - 5, ".gguf");
    if (stat(ref, &st) == 0) return S_ISDIR(st.st_mode) || gguf;
    if (gguf) return 1;
    /* org/name[@rev][:FILE]: one slash between two names of [A-Za-z0-9._-], no spaces after */
    size_t id_len = strcspn(ref, "@:");
    int slashes = 0;
    for (size_t i = 0; i < id_len; i++) {
        if (ref[i] == '/') {
            if (i == 0 || i + 1 == id_len) return 0;
            slashes++;
        } else if (!isalnum((unsigned char)ref[i]) && !strchr("._-", ref[i])) {
            return 0;
        }
    }
    if (slashes != 1) return 0;
    for (const char *p = ref + id_len; *p; p++)
        if (isspace((unsigned char)*p)) return 0;
    return 1;
}

/* After a load ran out of memory: how much the weights take (their files' size) and
 * how much the machine has available. */
static void explain_oom(const char *path) {
    struct stat st;
    double bytes = 0;
    if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
        bytes = (double)st.st_size;
    } else {
        DIR *d = opendir(path);
        struct dirent *e;
        char f[4096];
        while (d && (e = readdir(d))) {
            size_t n = strlen(e->d_name);
            if (n < 12 || strcmp(e->d_name + n - 12, ".safetensors")) continue;
            snprintf(f, sizeof f, "%s/%s", path, e->d_name);
            if (stat(f, &st) == 0) bytes += (double)st.st_size;
        }
        if (d) closedir(d);
    }
    long avail_kb = -1;
    FILE *mi = fopen("/proc/meminfo", "r");
    char line[256];
    while (mi && fgets(line, sizeof line, mi))
        if (sscanf(line, "MemAvailable: %ld kB", &avail_kb) == 1) break;
    if (mi) fclose(mi);
    fprintf(stderr, "gerbil: the weights need %.1f MiB (the size of their files)", bytes / 1048576.0);
    if (avail_kb >= 0) fprintf(stderr, "; %.1f MiB of memory is available", avail_kb / 1024.0);
    fprintf(stderr, " (a process limit such as ulimit -v may be lower)\n");
}

int cli_open(struct cli_model_opts *o, gerbil_model_t *m, gerbil_session_t *s) {
    if (o->model != o->path && cli_resolve_model(o)) return 1;
    long n_cpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (n_cpu > 0 && o->n_threads > n_cpu && !o->quiet)
        fprintf(stderr, "gerbil: warning: --threads %d exceeds the %ld CPUs; more threads than CPUs is slower\n",
                o->n_threads, n_cpu);
    gerbil_model_params mp = gerbil_model_default_params();
    mp.n_threads = o->n_threads;
    mp.use_mmap = o->use_mmap;
    mp.backend = o->backend;
    if (!mp.backend && gerbil_gpu_count() > 0) mp.backend = "cuda"; /* --device's default: the GPU */
    mp.progress = load_progress;
    gerbil_status st = gerbil_model_load(o->model, &mp, m);
    if (st != GERBIL_OK) {
        cli_fail("cannot load model", st);
        if (st == GERBIL_ERR_NOMEM || strstr(gerbil_last_error(), "Cannot allocate memory")) explain_oom(o->model);
        if (o->from_env) fprintf(stderr, "gerbil: (the model \"%s\" came from $GERBIL_MODEL)\n", o->ref);
        return 1;
    }
    if (o->n_lora && !o->lora_ok) {
        fprintf(stderr, "gerbil: --lora: this command does not apply adapters yet (run, chat, logits and bench do)\n");
        gerbil_model_free(*m);
        *m = NULL;
        return 1;
    }
    int32_t ids[8];
    for (int k = 0; k < o->n_lora; k++) {
        st = gerbil_adapter_load(*m, o->lora[k], o->lora_scale[k], &ids[k]);
        if (st != GERBIL_OK) {
            cli_fail("cannot load adapter", st);
            gerbil_model_free(*m);
            *m = NULL;
            return 1;
        }
    }
    o->adapter = o->n_lora == 1 ? ids[0] : 0;
    if (o->n_lora > 1 && (st = gerbil_adapter_stack(*m, ids, o->n_lora, &o->adapter)) != GERBIL_OK) {
        cli_fail("cannot stack adapters", st);
        gerbil_model_free(*m);
        *m = NULL;
        return 1;
    }
    if (!s) return 0;
    if (o->n_ctx > gerbil_model_n_ctx_train(*m) && gerbil_model_n_ctx_train(*m) > 0 && !o->quiet)
        fprintf(stderr, "gerbil: warning: --ctx-size %d exceeds the %d tokens the model was trained on; "
                        "beyond them its output degrades\n", o->n_ctx, gerbil_model_n_ctx_train(*m));
    gerbil_session_params sp = gerbil_session_default_params();
    sp.n_ctx = o->n_ctx;
    sp.kv_type = o->kv_type;
    st = gerbil_session_new(*m, &sp, s);
    if (st == GERBIL_OK && o->adapter && (st = gerbil_session_set_adapter(*s, o->adapter)) != GERBIL_OK)
        gerbil_session_free(*s);
    if (st != GERBIL_OK) {
        gerbil_model_free(*m);
        *m = NULL;
        return cli_fail("cannot create session", st);
    }
    return 0;
}

int cli_args_expand(int argc, char **argv, struct cli_args *out) {
    memset(out, 0, sizeof *out);
    out->argv = calloc((size_t)argc * 2 + 1, sizeof *out->argv);
    out->attached = calloc((size_t)argc * 2 + 1, 1);
    out->owned = calloc((size_t)argc + 1, sizeof *out->owned);
    if (!out->argv || !out->attached || !out->owned) goto oom;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *eq = strchr(a, '=');
        size_t name_len = 0;
        if (i > 0 && a[0] == '-' && a[1] == '-' && a[2] && eq) name_len = (size_t)(eq - a);  /* --flag=value */
        else if (i > 0 && a[0] == '-' && a[1] && strchr("nmtcf", a[1]) && a[2]) name_len = 2; /* -n5 */
        if (!name_len) {
            out->argv[out->argc++] = argv[i];
            continue;
        }
        char *name = strndup(a, name_len);
        if (!name) goto oom;
        out->owned[out->n_owned++] = name;
        out->argv[out->argc++] = name;
        out->attached[out->argc] = 1;
        out->argv[out->argc++] = (char *)a + name_len + (a[name_len] == '=');
    }
    return 0;
oom:
    fprintf(stderr, "gerbil: out of memory\n");
    cli_args_free(out);
    return -1;
}

void cli_args_free(struct cli_args *a) {
    for (int i = 0; a->owned && i < a->n_owned; i++) free(a->owned[i]);
    free(a->owned);
    free(a->argv);
    free(a->attached);
    memset(a, 0, sizeof *a);
}

/* Levenshtein distance of two short strings (longer ones count as far apart). */
static int edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return 1 << 20;
    int row[64];
    for (size_t j = 0; j <= lb; j++) row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int up = row[j], best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            diag = up;
            row[j] = best;
        }
    }
    return row[lb];
}

const char *cli_nearest(const char *s, const char *const *cands, int n) {
    const char *best = NULL;
    int best_d = 1 << 20;
    for (int i = 0; i < n; i++) {
        int d = edit_distance(s, cands[i]);
        if (d < best_d) best_d = d, best = cands[i];
    }
    int limit = strlen(s) > 6 ? 3 : strlen(s) > 3 ? 2 : 1;
    return best && best_d <= limit ? best : NULL;
}

void cli_unknown_option(const char *cmd, const char *opt, void (*help)(FILE *)) {
    char *text = NULL, *flags[256];
    size_t len = 0;
    int n = 0;
    FILE *f = help ? open_memstream(&text, &len) : NULL;
    if (f) {
        help(f);
        fclose(f);
    }
    /* the flags the help text names: "--word-word" and "-x" after a space or comma */
    for (char *p = text; p && *p && n < 256; p++) {
        if (*p != '-' || (p > text && !strchr(" ,[(|\n", p[-1]))) continue;
        size_t k = p[1] == '-' ? 2 : 1;
        while (isalnum((unsigned char)p[k]) || p[k] == '-') k++;
        if (k < 2 || (k == 2 && p[1] == '-')) continue;
        if (!(flags[n] = strndup(p, k))) break;
        n++;
        p += k - 1;
    }
    char *bare = strndup(opt, strcspn(opt, "="));
    const char *near = bare ? cli_nearest(bare, (const char *const *)flags, n) : NULL;
    fprintf(stderr, "gerbil %s: unknown option \"%s\"", cmd, opt);
    if (near) fprintf(stderr, "; did you mean %s?", near);
    fprintf(stderr, " ('gerbil %s --help' lists the options)\n", cmd);
    for (int i = 0; i < n; i++) free(flags[i]);
    free(bare);
    free(text);
}
