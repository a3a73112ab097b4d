/* gerbil bench: prompt processing (pp) and text generation (tg) speed, reported the
 * way llama-bench does: pp = one batch of P tokens from an empty context; tg = N
 * single-token steps from an empty context; mean and standard deviation over reps.
 * --batch B: B sequences in one context (llama-batched-bench's shape): pp = each
 * sequence's prompt evaluated in turn, tg = all B decoding together, one row each per
 * step; both aggregate tokens/s. */
#include "cli.h"
#include "textgen.h"
#include "base/timer.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void help(FILE *f) {
    fprintf(f, "usage: gerbil bench --model M [-p 512] [-n 128] [-r 3] [--batch B] [--json] [options]\n\n"
               "Measures prompt processing (P tokens in one batch) and generation (N tokens one at\n"
               "a time) in tokens/s, averaged over R repetitions after one warm-up (of at most 512\n"
               "prompt tokens). The table names the model as llama-bench does: architecture, size, format.\n\noptions:\n"
               "  -p, --n-prompt P     prompt tokens (default 512; 0 skips)\n"
               "  -n, --n-gen N        generated tokens (default 128; 0 skips)\n"
               "  -r, --repetitions R  repetitions (default 3)\n"
               "  -b, --batch B        B sequences decoding together: generation is B rows per step\n"
               "                       and tokens/s the total of all B (prompts: each in turn)\n"
               "      --json           one JSON object with prompt_tokens_per_s and gen_tokens_per_s\n"
               "                       (and \"batch\": B with --batch)\n"
               "      --spec ngram|draft  generation is N greedy tokens after the prompt through gerbil_generate,\n"
               "                       plain and speculative in the same run: both t/s, the speed-up, the\n"
               "                       acceptance rate and tokens per verify step (\"spec_*\" in --json)\n"
               "      --draft MODEL, --draft-max K, --draft-min K   as gerbil run's\n"
               "  -f, --file FILE      the prompt: FILE's text through the model's tokenizer (with --spec;\n"
               "                       default: P pseudo-random ids)\n");
    cli_print_model_opts_help(f);
}

/* The value of "name:   value" in the model's description, or "". */
static void describe_field(const char *desc, const char *name, char *out, size_t cap) {
    const char *p = strstr(desc, name);
    out[0] = 0;
    if (!p) return;
    p += strlen(name);
    while (*p == ' ') p++;
    snprintf(out, cap, "%.*s", (int)strcspn(p, "\n"), p);
}

/* llama-bench's model column: "qwen3 0.6B Q4_K", "llama 0.26M F32"; size (MiB) and parameters. */
static void model_label(gerbil_model_t m, char *label, size_t cap, double *size_mib, double *n_params) {
    char desc[4096], arch[64], params[64], format[64], weights[64];
    gerbil_model_describe(m, desc, sizeof desc);
    describe_field(desc, "architecture:", arch, sizeof arch);
    describe_field(desc, "parameters:", params, sizeof params);
    describe_field(desc, "format:", format, sizeof format);
    describe_field(desc, "weights:", weights, sizeof weights);
    char *cut = strstr(arch, "For");
    if (cut) *cut = 0;
    for (char *c = arch; *c; c++) *c = (char)tolower((unsigned char)*c);
    *n_params = atof(params);
    *size_mib = atof(weights);
    char sz[32];
    double n = *n_params;
    if (n >= 1e8) snprintf(sz, sizeof sz, "%.1fB", n / 1e9);
    else if (n >= 1e6) snprintf(sz, sizeof sz, "%.0fM", n / 1e6);
    else snprintf(sz, sizeof sz, "%.2fM", n / 1e6);
    snprintf(label, cap, "%s %s %s", arch, sz, !strncmp(format, "GGUF ", 5) ? format + 5 : format);
}

static void mean_sd(const double *x, int n, double *mean, double *sd) {
    double s = 0, s2 = 0;
    for (int i = 0; i < n; i++) s += x[i];
    *mean = s / n;
    for (int i = 0; i < n; i++) s2 += (x[i] - *mean) * (x[i] - *mean);
    *sd = n > 1 ? sqrt(s2 / (n - 1)) : 0;
}

/* --spec: greedy generation of n_gen tokens after prompt[0..n) from empty sessions, plain
 * (spec off) or speculative; tokens/s of the decode steps into *tps. */
static gerbil_status bench_generate(struct textgen *tx, int spec, const int32_t *prompt, int n, int n_gen, int32_t *out,
                                    double *tps, gerbil_generate_result *res) {
    gerbil_sampler_params sp = gerbil_sampler_default_params();
    sp.temperature = 0;
    gerbil_sampler_t smp;
    gerbil_status st = gerbil_sampler_new(&sp, gerbil_model_n_vocab(tx->model), &smp);
    if (st != GERBIL_OK) return st;
    gerbil_session_reset(tx->session);
    if (tx->draft_session) gerbil_session_reset(tx->draft_session);
    gerbil_generate_params gp = tx->gen;
    gp.max_tokens = n_gen;
    gp.ignore_eos = 1;
    if (!spec) gp.spec.kind = GERBIL_SPEC_NONE;
    st = gerbil_generate(tx->session, smp, prompt, n, &gp, out, res);
    gerbil_sampler_free(smp);
    *tps = res->n_generated > 1 && res->gen_s > 0 ? (res->n_generated - 1) / res->gen_s : 0;
    return st;
}

/* --batch B: B sequences of one context; pp[r] / tg[r] aggregate tokens/s. */
static gerbil_status bench_batch(gerbil_model_t m, const struct cli_model_opts *o, int B, int n_prompt, int n_gen,
                                 int reps, const int32_t *ids, double *pp, double *tg) {
    gerbil_context_params cp = gerbil_context_default_params();
    const int per = n_prompt + n_gen + 16; /* positions a sequence takes, a block spare */
    cp.n_ctx = per * B;
    cp.n_seq_max = B;
    cp.n_batch = n_prompt > B ? (n_prompt < 512 ? n_prompt : 512) : B;
    cp.kv_type = o->kv_type;
    gerbil_context_t c;
    gerbil_status st = gerbil_context_new(m, &cp, &c);
    if (st != GERBIL_OK) return st;
    int32_t *seq = malloc(sizeof(int32_t) * (size_t)(B > cp.n_batch ? B : cp.n_batch));
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)B), *sid = malloc(sizeof(int32_t) * (size_t)B);
    int32_t *ad = malloc(sizeof(int32_t) * (size_t)(B > cp.n_batch ? B : cp.n_batch)); /* --lora: every row's */
    if (!seq || !tok || !sid || !ad) st = GERBIL_ERR_NOMEM;
    for (int i = 0; ad && i < (B > cp.n_batch ? B : cp.n_batch); i++) ad[i] = o->adapter;
    for (int i = 0; st == GERBIL_OK && i < B; i++) st = gerbil_seq_new(c, &sid[i]);
    for (int r = -1; r < reps && st == GERBIL_OK; r++) { /* r = -1: warm-up */
        if (n_prompt > 0) {
            for (int i = 0; i < B; i++) gerbil_seq_truncate(c, sid[i], 0);
            double t0 = time_now_s();
            for (int i = 0; i < B && st == GERBIL_OK; i++)
                for (int done = 0; done < n_prompt && st == GERBIL_OK;) {
                    int k = n_prompt - done < cp.n_batch ? n_prompt - done : cp.n_batch;
                    for (int j = 0; j < k; j++) seq[j] = sid[i];
                    gerbil_batch b = {.n_rows = k, .tokens = ids + done, .seq = seq, .adapter = ad};
                    st = gerbil_context_eval(c, &b);
                    done += k;
                }
            if (r >= 0) pp[r] = (double)B * n_prompt / (time_now_s() - t0);
        }
        if (n_gen > 0 && st == GERBIL_OK) {
            for (int i = 0; i < B; i++) gerbil_seq_truncate(c, sid[i], 0);
            double t0 = time_now_s();
            for (int g = 0; g < n_gen && st == GERBIL_OK; g++) {
                for (int i = 0; i < B; i++) { tok[i] = ids[(g + 7 * i) % (n_gen + 1)]; seq[i] = sid[i]; }
                gerbil_batch b = {.n_rows = B, .tokens = tok, .seq = seq, .adapter = ad};
                st = gerbil_context_eval(c, &b);
            }
            if (r >= 0) tg[r] = (double)B * n_gen / (time_now_s() - t0);
        }
    }
    free(seq);
    free(tok);
    free(sid);
    free(ad);
    gerbil_context_free(c);
    return st;
}

int cmd_bench(int argc, char **argv) {
    struct cli_model_opts o = {.lora_ok = 1};
    int n_prompt = 512, n_gen = 128, reps = 3, json = 0, batch = 0;
    struct textgen tx = {.gen = gerbil_generate_default_params()};
    const char *file = NULL;
    int32_t *file_ids = NULL;
    int n_file = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int r = cli_parse_model_opt(argc, argv, &i, &o);
        if (r < 0) return 2;
        if (r) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { help(stdout); return 0; }
        if (!strcmp(a, "--json")) { json = 1; continue; }
        int bad;
        if (!strcmp(a, "-p") || !strcmp(a, "--n-prompt")) bad = !(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, 0, 1 << 20, &n_prompt);
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-gen")) bad = !(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, 0, 1 << 20, &n_gen);
        else if (!strcmp(a, "-r") || !strcmp(a, "--repetitions")) bad = !(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, 1, 1000, &reps);
        else if (!strcmp(a, "-b") || !strcmp(a, "--batch")) bad = !(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, 1, 4096, &batch);
        else if (!strcmp(a, "--spec") || !strcmp(a, "--draft") || !strcmp(a, "--draft-max") || !strcmp(a, "--draft-min"))
            bad = textgen_parse_opt(&tx, "bench", argc, argv, &i) < 0;
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) bad = !(file = cli_value(argc, argv, &i));
        else { fprintf(stderr, "gerbil bench: unknown option \"%s\"\n", a); help(stderr); return 2; }
        if (bad) return 2;
    }
    const int spec = tx.gen.spec.kind != GERBIL_SPEC_NONE;
    if (textgen_spec_check(&tx, "bench")) return 2;
    if (spec && batch) { fprintf(stderr, "gerbil bench: --spec does not combine with --batch yet\n"); return 2; }
    if (file && !spec) { fprintf(stderr, "gerbil bench: --file is the prompt of --spec runs\n"); return 2; }
    if (file) {
        size_t len = 0;
        char *text = cli_read_file(file, &len);
        gerbil_tokenizer_t tok = NULL;
        if (!text) { fprintf(stderr, "gerbil bench: --file: cannot read %s\n", file); return 2; }
        if (cli_resolve_model(&o) || cli_load_tokenizer(o.model, &tok)) { free(text); return 1; }
        gerbil_status ts = gerbil_tokenize(tok, text, len, 1, &file_ids, &n_file);
        gerbil_tokenizer_free(tok);
        free(text);
        if (ts != GERBIL_OK || n_file == 0) { fprintf(stderr, "gerbil bench: --file: %s\n", gerbil_last_error()); return 1; }
        n_prompt = n_file;
    }
    if (o.n_ctx == 0) o.n_ctx = n_prompt + n_gen > 0 ? n_prompt + n_gen + (spec ? 40 : 0) : 1;
    gerbil_model_t m;
    gerbil_session_t s = NULL;
    if (cli_open(&o, &m, batch ? NULL : &s)) return 1;
    tx.model = m;
    tx.session = s;
    if (textgen_open_draft(&tx, "bench", &o)) { gerbil_session_free(s); gerbil_model_free(m); textgen_spec_free(&tx); return 1; }
    if (s && (n_prompt > gerbil_session_n_ctx(s) || n_gen > gerbil_session_n_ctx(s))) {
        fprintf(stderr, "gerbil bench: -p/-n larger than the context size %d\n", gerbil_session_n_ctx(s));
        gerbil_session_free(s);
        gerbil_model_free(m);
        return 2;
    }
    const int V = gerbil_model_n_vocab(m);
    int max_n = n_prompt > n_gen ? n_prompt : n_gen;
    int32_t *ids = malloc(((size_t)max_n + 1) * sizeof *ids);
    float *logits = malloc((size_t)V * sizeof *logits);
    double *pp = calloc((size_t)reps, sizeof *pp), *tg = calloc((size_t)reps, sizeof *tg);
    double *stg = calloc((size_t)reps, sizeof *stg);
    int32_t *gen_a = malloc(((size_t)n_gen + 1) * sizeof *gen_a), *gen_b = malloc(((size_t)n_gen + 1) * sizeof *gen_b);
    if (!ids || !logits || !pp || !tg || !stg || !gen_a || !gen_b) { fprintf(stderr, "gerbil bench: out of memory\n"); return 1; }
    /* Fixed pseudo-random ids: the work does not depend on them. */
    unsigned x = 12345;
    for (int i = 0; i <= max_n; i++) { x = x * 1103515245u + 12345u; ids[i] = (int32_t)((x >> 8) % (unsigned)V); }
    if (file_ids) memcpy(ids, file_ids, (size_t)n_file * sizeof *ids);
    gerbil_generate_result sres = {0};
    int differ = 0;

    gerbil_status st = GERBIL_OK;
    if (batch) st = bench_batch(m, &o, batch, n_prompt, n_gen, reps, ids, pp, tg);
    for (int r = -1; !batch && r < reps && st == GERBIL_OK; r++) { /* r = -1: warm-up */
        if (n_prompt > 0) {
            gerbil_session_reset(s);
            double t0 = time_now_s();
            /* the warm-up touches every weight with one chunk; a full pass of a huge -p is not needed */
            st = gerbil_session_eval(s, ids, r < 0 && n_prompt > 512 ? 512 : n_prompt, logits, 0);
            if (r >= 0) pp[r] = n_prompt / (time_now_s() - t0);
        }
        if (n_gen > 0 && st == GERBIL_OK && spec) { /* plain and speculative greedy generation, the same tokens */
            gerbil_generate_result pres;
            double a = 0, b = 0;
            st = bench_generate(&tx, 0, ids, n_prompt > 0 ? n_prompt : 1, n_gen, gen_a, &a, &pres);
            if (st == GERBIL_OK) st = bench_generate(&tx, 1, ids, n_prompt > 0 ? n_prompt : 1, n_gen, gen_b, &b, &sres);
            if (st == GERBIL_OK)
                differ |= pres.n_generated != sres.n_generated ||
                          memcmp(gen_a, gen_b, (size_t)pres.n_generated * sizeof *gen_a);
            if (r >= 0) { tg[r] = a; stg[r] = b; }
        } else if (n_gen > 0 && st == GERBIL_OK) {
            gerbil_session_reset(s);
            double t0 = time_now_s();
            for (int i = 0; i < n_gen && st == GERBIL_OK; i++) st = gerbil_session_eval(s, &ids[i], 1, logits, 0);
            if (r >= 0) tg[r] = n_gen / (time_now_s() - t0);
        }
    }
    int rc = 0;
    if (st != GERBIL_OK) {
        rc = cli_fail("benchmark failed", st);
    } else {
        double ppm = 0, pps = 0, tgm = 0, tgs = 0;
        if (n_prompt > 0) mean_sd(pp, reps, &ppm, &pps);
        if (n_gen > 0) mean_sd(tg, reps, &tgm, &tgs);
        long n_cpu = sysconf(_SC_NPROCESSORS_ONLN);
        int threads = o.n_threads > 0 ? o.n_threads : n_cpu > 0 ? (int)n_cpu : 1; /* as the thread pool counts */
        char label[160];
        double size_mib, n_params;
        model_label(m, label, sizeof label, &size_mib, &n_params);
        char bfield[32] = "", btest[16] = "";
        if (batch) {
            snprintf(bfield, sizeof bfield, ", \"batch\": %d", batch);
            snprintf(btest, sizeof btest, " x%d", batch);
        }
        double stm = 0, sts = 0;
        if (spec && n_gen > 0) mean_sd(stg, reps, &stm, &sts);
        const char *skind = tx.gen.spec.kind == GERBIL_SPEC_NGRAM ? "ngram" : "draft";
        const double acc = sres.n_drafted ? (double)sres.n_accepted / sres.n_drafted : 0;
        const double tpv = sres.n_verify ? (double)(sres.n_accepted + sres.n_verify) / sres.n_verify : 0;
        char sfield[400] = "";
        if (spec)
            snprintf(sfield, sizeof sfield, ", \"spec\": \"%s\", \"spec_draft_max\": %d, \"spec_gen_tokens_per_s\": %.3f, "
                     "\"spec_gen_tokens_per_s_sd\": %.3f, \"spec_speedup\": %.4f, \"spec_acceptance_rate\": %.4f, "
                     "\"spec_tokens_per_verify\": %.4f, \"spec_verify_steps\": %d, \"spec_same_tokens\": %s",
                     skind, tx.gen.spec.draft_max > 0 ? tx.gen.spec.draft_max : 5, stm, sts, tgm > 0 ? stm / tgm : 0,
                     acc, tpv, sres.n_verify, differ ? "false" : "true");
        if (json) {
            printf("{\"model\": \"%s\", \"model_type\": \"%s\", \"model_size_mib\": %.2f, \"model_n_params\": %.0f, "
                   "\"n_threads\": %d, \"n_prompt\": %d, \"n_gen\": %d, \"repetitions\": %d, "
                   "\"kv_type\": \"%s\", \"prompt_tokens_per_s\": %.3f, \"prompt_tokens_per_s_sd\": %.3f, "
                   "\"gen_tokens_per_s\": %.3f, \"gen_tokens_per_s_sd\": %.3f%s%s}\n",
                   o.ref, label, size_mib, n_params, threads, n_prompt, n_gen, reps, o.kv_type == GERBIL_KV_F32 ? "f32" : "f16",
                   ppm, pps, tgm, tgs, bfield, sfield);
        } else {
            printf("| %-30s | %10s | %10s | %7s | %12s | %16s |\n", "model", "size", "params", "threads", "test", "t/s");
            printf("| %-30s | %10s | %10s | %7s | %12s | %16s |\n", "----", "----", "----", "----", "----", "----");
            for (int k = 0; k < 2; k++) {
                if (!(k ? n_gen : n_prompt)) continue;
                char sz[32], np[32];
                snprintf(sz, sizeof sz, "%.2f MiB", size_mib);
                snprintf(np, sizeof np, n_params >= 1e9 ? "%.2f B" : "%.2f M", n_params >= 1e9 ? n_params / 1e9 : n_params / 1e6);
                printf("| %-30.30s | %10s | %10s | %7d | %5s%-3d%-4s | %8.2f ± %5.2f |\n", label, sz, np, threads,
                       k ? "tg" : "pp", k ? n_gen : n_prompt, btest, k ? tgm : ppm, k ? tgs : pps);
            }
            if (spec && n_gen > 0) {
                char sz[32], np[32], test[32];
                snprintf(sz, sizeof sz, "%.2f MiB", size_mib);
                snprintf(np, sizeof np, n_params >= 1e9 ? "%.2f B" : "%.2f M", n_params >= 1e9 ? n_params / 1e9 : n_params / 1e6);
                snprintf(test, sizeof test, "tg%d %s", n_gen, skind);
                printf("| %-30.30s | %10s | %10s | %7d | %12s | %8.2f ± %5.2f |\n", label, sz, np, threads, test, stm, sts);
                printf("spec %s: %.2fx plain greedy generation (the tg row), acceptance %.1f%%, %.2f tokens per verify "
                       "step%s\n", skind, tgm > 0 ? stm / tgm : 0, 100 * acc, tpv,
                       differ ? "; TOKENS DIFFER FROM PLAIN" : ", the same tokens");
            }
            printf("model: %s\n", o.ref);
        }
    }
    if (differ && rc == 0) { fprintf(stderr, "gerbil bench: speculative tokens differ from plain decoding\n"); rc = 1; }
    free(ids); free(logits); free(pp); free(tg); free(stg); free(gen_a); free(gen_b); free(file_ids);
    gerbil_session_free(s);
    gerbil_model_free(m);
    textgen_spec_free(&tx);
    return rc;
}
