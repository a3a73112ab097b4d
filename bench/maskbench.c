/* MaskBench (guidance-ai/jsonschemabench maskbench/) for gerbil's grammar engine, one thread.
 *   python3 bench/maskbench_prep.py JSONSCHEMABENCH/maskbench/data /tmp/mb.jsonl
 *   build/maskbench /tmp/mb.jsonl ../shared/data/tokenizers/llama3 [--limit N] [--skip N] [--stride N]
 *                   [--timeout S] [--out results.jsonl]      (--stride N: every Nth schema, a sample)
 * As the benchmark's runner.py: per schema, compile (TTFM); per test instance, a fresh state,
 * then for each token of the instance mask + commit (TBM); a valid instance rejected is a
 * validation error, an invalid one accepted an invalidation error. Each schema runs in a forked
 * child, so a crash or a timeout is counted, not fatal. Prints the benchmark's table. */
#include "gerbil.h"

#include <cjson/cJSON.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

enum { R_PASS, R_COMPILE, R_VALIDATION, R_INVALIDATION, R_CRASH, R_TIMEOUT, R_N };
static const char *const rname[] = {"passing", "compile error", "validation error", "invalidation error",
                                    "crash", "timeout"};

/* child: run one schema; write "result ttfm_us n_tok t1 t2 ...\n" + message line to fd */
static void run_one(gerbil_grammar_vocab_t voc, gerbil_tokenizer_t tok, const cJSON *rec, FILE *out) {
    const cJSON *sch = cJSON_GetObjectItem(rec, "schema"), *tests = cJSON_GetObjectItem(rec, "tests");
    double t0 = now_us();
    gerbil_grammar_t g = NULL;
    gerbil_grammar_params p = gerbil_grammar_default_params();
    gerbil_status st = gerbil_grammar_compile(voc, GERBIL_GRAMMAR_JSON_SCHEMA, sch->valuestring, strlen(sch->valuestring), &p, &g);
    double ttfm = now_us() - t0;
    if (st != GERBIL_OK) {
        fprintf(out, "%d %.1f 0\n%s\n", R_COMPILE, ttfm, gerbil_last_error());
        return;
    }
    int words = gerbil_grammar_mask_words(g);
    uint64_t *mask = malloc((size_t)words * 8);
    int result = R_PASS;
    char msg[512] = "";
    size_t cap = 1024, n = 0;
    float *times = malloc(cap * sizeof *times);
    int ti = 0;
    for (const cJSON *t = tests ? tests->child : NULL; t; t = t->next, ti++) {
        int valid = cJSON_IsTrue(cJSON_GetObjectItem(t, "valid"));
        const char *text = cJSON_GetObjectItem(t, "text")->valuestring;
        int32_t *ids = NULL;
        int n_ids = 0;
        gerbil_tokenize(tok, text, strlen(text), 0, &ids, &n_ids);
        gerbil_grammar_state_t s;
        gerbil_grammar_state_new(g, &s);
        int accepted = 1;
        for (int i = 0; i < n_ids; i++) {
            double a = now_us();
            gerbil_status ms = gerbil_grammar_mask(s, mask);
            int32_t id = ids[i];
            int ok = ms == GERBIL_OK && ((mask[id >> 6] >> (id & 63)) & 1) && gerbil_grammar_accept_token(s, id) == GERBIL_OK;
            double b = now_us();
            if (n == cap) { cap *= 2; times = realloc(times, cap * sizeof *times); }
            times[n++] = (float)(b - a);
            if (!ok) { accepted = 0; break; }
        }
        gerbil_grammar_state_free(s);
        free(ids);
        if (result == R_PASS && accepted != valid) {
            result = valid ? R_VALIDATION : R_INVALIDATION;
            snprintf(msg, sizeof msg, "test #%d: should %s but didn't", ti, valid ? "accept" : "reject");
        }
    }
    fprintf(out, "%d %.1f %zu", result, ttfm, n);
    for (size_t i = 0; i < n; i++) fprintf(out, " %.1f", times[i]);
    fprintf(out, "\n%s\n", msg);
    free(times);
    free(mask);
    gerbil_grammar_free(g);
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(const double *v, size_t n, double p) { return n ? v[(size_t)(p * (double)(n - 1) + 0.5)] : 0; }

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: maskbench DATA.jsonl TOKENIZER [--limit N] [--skip N] [--stride N] [--timeout S] [--no-fork] [--out RESULTS.jsonl]\n");
        return 2;
    }
    long limit = -1, skip = 0, stride = 1;
    int no_fork = 0;
    int timeout = 60;
    const char *outp = NULL;
    for (int i = 3; i < argc; i++)
        if (!strcmp(argv[i], "--no-fork")) { no_fork = 1; memmove(argv + i, argv + i + 1, (size_t)(argc - i - 1) * sizeof *argv); argc--; i--; }
    for (int i = 3; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--limit")) limit = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--skip")) skip = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--stride")) stride = atol(argv[i + 1]) > 0 ? atol(argv[i + 1]) : 1;
        else if (!strcmp(argv[i], "--timeout")) timeout = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--out")) outp = argv[i + 1];
    }
    gerbil_tokenizer_t tok;
    if (gerbil_tokenizer_load(argv[2], &tok) != GERBIL_OK) { fprintf(stderr, "tokenizer: %s\n", gerbil_last_error()); return 1; }
    gerbil_grammar_vocab_t voc;
    double v0 = now_us();
    if (gerbil_grammar_vocab_new(tok, 0, NULL, 0, &voc) != GERBIL_OK) { fprintf(stderr, "vocab: %s\n", gerbil_last_error()); return 1; }
    fprintf(stderr, "vocabulary trie: %.1f ms\n", (now_us() - v0) / 1e3);
    FILE *in = fopen(argv[1], "r");
    if (!in) { perror(argv[1]); return 1; }
    FILE *res = outp ? fopen(outp, "w") : NULL;
    size_t lcap = 1 << 20;
    char *line = malloc(lcap);
    size_t counts[R_N] = {0}, n_schemas = 0, tcap = 1 << 20, tn = 0, fcap = 1 << 14, fn = 0, n_tokens = 0;
    double *tbm = malloc(tcap * sizeof *tbm), *ttfm = malloc(fcap * sizeof *ttfm);
    ssize_t len;
    long idx = 0;
    double start = now_us();
    while ((len = getline(&line, &lcap, in)) > 0) {
        if (idx++ < skip || (idx - 1 - skip) % stride) continue;
        if (limit >= 0 && (long)n_schemas >= limit) break;
        cJSON *rec = cJSON_Parse(line);
        if (!rec) continue;
        const char *id = cJSON_GetObjectItem(rec, "id")->valuestring;
        char tmpl[] = "/tmp/maskbench.XXXXXX";
        int fd = mkstemp(tmpl);
        unlink(tmpl);
        pid_t pid = no_fork ? 1 : fork();
        if (no_fork) {
            /* in this process: the vocabulary's shared cache carries over between schemas, as in
             * a server; a crash ends the run */
            FILE *o = fdopen(dup(fd), "w");
            run_one(voc, tok, rec, o);
            fclose(o);
        } else if (pid == 0) {
            alarm((unsigned)timeout);
            FILE *o = fdopen(fd, "w");
            run_one(voc, tok, rec, o);
            fclose(o);
            _exit(0);
        }
        int wst = 0;
        if (!no_fork) waitpid(pid, &wst, 0);
        int result;
        double tt = 0;
        size_t nt = 0;
        char msg[600] = "";
        if (WIFSIGNALED(wst)) {
            result = WTERMSIG(wst) == SIGALRM ? R_TIMEOUT : R_CRASH;
            snprintf(msg, sizeof msg, "signal %d", WTERMSIG(wst));
        } else {
            FILE *o = fdopen(fd, "r");
            rewind(o);
            if (fscanf(o, "%d %lf %zu", &result, &tt, &nt) != 3) { result = R_CRASH; nt = 0; }
            for (size_t i = 0; i < nt; i++) {
                double x;
                if (fscanf(o, "%lf", &x) != 1) break;
                if (tn == tcap) { tcap *= 2; tbm = realloc(tbm, tcap * sizeof *tbm); }
                tbm[tn++] = x;
            }
            int ch = fgetc(o);
            (void)ch;
            if (!fgets(msg, sizeof msg, o)) msg[0] = 0;
            msg[strcspn(msg, "\n")] = 0;
            fclose(o);
            fd = -1;
            if (result != R_COMPILE) {
                if (fn == fcap) { fcap *= 2; ttfm = realloc(ttfm, fcap * sizeof *ttfm); }
                ttfm[fn++] = tt;
            }
            n_tokens += nt;
        }
        if (fd >= 0) close(fd);
        counts[result]++;
        n_schemas++;
        if (res) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "id", id);
            cJSON_AddStringToObject(o, "result", rname[result]);
            cJSON_AddNumberToObject(o, "ttfm_us", tt);
            cJSON_AddNumberToObject(o, "tokens", (double)nt);
            cJSON_AddStringToObject(o, "message", msg);
            char *t = cJSON_PrintUnformatted(o);
            fprintf(res, "%s\n", t);
            free(t);
            cJSON_Delete(o);
        }
        if (n_schemas % 500 == 0)
            fprintf(stderr, "%zu schemas, %.0f s, passing %zu\n", n_schemas, (now_us() - start) / 1e6, counts[R_PASS]);
        cJSON_Delete(rec);
    }
    qsort(tbm, tn, sizeof *tbm, cmp_d);
    qsort(ttfm, fn, sizeof *ttfm, cmp_d);
    double tsum = 0, fsum = 0;
    for (size_t i = 0; i < tn; i++) tsum += tbm[i];
    for (size_t i = 0; i < fn; i++) fsum += ttfm[i];
    printf("| metric             |     gerbil |\n|:-------------------|-----------:|\n");
    printf("| TBM avg            | %10.0f |\n", tn ? tsum / (double)tn : 0);
    static const double ps[] = {0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999, 1.0};
    static const char *const pn[] = {"p25", "p50", "p75", "p90", "p95", "p99", "p99.9", "p100"};
    for (int i = 0; i < 8; i++) printf("| TBM %-14s | %10.0f |\n", pn[i], pct(tbm, tn, ps[i]));
    printf("| TTFM avg           | %10.0f |\n", fn ? fsum / (double)fn : 0);
    for (int i = 0; i < 8; i++) printf("| TTFM %-13s | %10.0f |\n", pn[i], pct(ttfm, fn, ps[i]));
    printf("| tokens             | %10zu |\n| schemas            | %10zu |\n", n_tokens, n_schemas);
    for (int r = 0; r < R_N; r++) printf("| %-18s | %10zu |\n", rname[r], counts[r]);
    printf("(times in microseconds; %.0f s wall)\n", (now_us() - start) / 1e6);
    if (res) fclose(res);
    fclose(in);
    free(line);
    free(tbm);
    free(ttfm);
    gerbil_grammar_vocab_free(voc);
    gerbil_tokenizer_free(tok);
    return 0;
}
