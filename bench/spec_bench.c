/* spec_bench MODEL [--threads N] [-p P] [-n N] [-k K] [-r R] [--rates 1,0.9,...] [--json]
 *
 * Speculative decoding's speed against plain greedy decoding as a function of the
 * acceptance rate, with the drafter's cost taken out: an oracle drafter (GERBIL_SPEC_CUSTOM)
 * knows plain greedy's continuation (generated first) and proposes it with each draft
 * token replaced, with probability 1 - a, by a wrong one (deterministic per position), so
 * the rate of accepted drafts is set by a. Every run's tokens are checked against plain's.
 * Plain and speculative runs alternate in one process (best of R each), so the ratio
 * compares runs under the same conditions. Output: one line per rate (or JSON lines). */
#include "gerbil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct oracle {
    const int32_t *truth; /* plain greedy's tokens after the prompt */
    int n_truth, n_prompt, V;
    double rate;
    long proposed, wrong;
};

static unsigned long long mix(unsigned long long x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* hist = prompt + generated; the next tokens of truth after it, each wrong with 1 - rate */
static int oracle_draft(void *user, const int32_t *hist, int n_hist, int k, int32_t *out) {
    struct oracle *o = user;
    const int g = n_hist - o->n_prompt; /* tokens generated so far */
    int n = 0;
    for (int i = 0; i < k && g + i < o->n_truth; i++) {
        const int at = g + i;
        const double u = (mix((unsigned long long)at * 1315423911ULL + (unsigned long long)n_hist) >> 11) * (1.0 / 9007199254740992.0);
        out[n] = u < o->rate ? o->truth[at] : (o->truth[at] + 1) % o->V;
        o->wrong += out[n] != o->truth[at];
        n++;
    }
    (void)hist;
    o->proposed += n;
    return n;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help")) {
        fprintf(stderr, "usage: spec_bench MODEL [--threads N] [-p P] [-n N] [-k K] [-r R] [--rates 1,0.9,0.5] "
                        "[--adaptive] [--json]\n");
        return argc < 2 ? 2 : 0;
    }
    const char *path = argv[1], *rates_arg = "1,0.95,0.9,0.8,0.7,0.5,0.3,0";
    int threads = 2, np = 64, n_gen = 128, K = 5, reps = 3, json = 0, adaptive = 0;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json")) { json = 1; continue; }
        if (!strcmp(a, "--adaptive")) { adaptive = 1; continue; }
        if (!v) { fprintf(stderr, "spec_bench: %s needs a value\n", a); return 2; }
        i++;
        if (!strcmp(a, "--threads")) threads = atoi(v);
        else if (!strcmp(a, "-p")) np = atoi(v);
        else if (!strcmp(a, "-n")) n_gen = atoi(v);
        else if (!strcmp(a, "-k")) K = atoi(v);
        else if (!strcmp(a, "-r")) reps = atoi(v);
        else if (!strcmp(a, "--rates")) rates_arg = v;
        else { fprintf(stderr, "spec_bench: unknown option %s\n", a); return 2; }
    }
    if (np < 1 || n_gen < 2 || K < 1 || K > 32 || reps < 1) { fprintf(stderr, "spec_bench: bad sizes\n"); return 2; }
    gerbil_model_params mp = gerbil_model_default_params();
    mp.n_threads = threads;
    gerbil_model_t m;
    if (gerbil_model_load(path, &mp, &m) != GERBIL_OK) { fprintf(stderr, "spec_bench: %s\n", gerbil_last_error()); return 1; }
    const int V = gerbil_model_n_vocab(m);
    gerbil_session_params spp = gerbil_session_default_params();
    spp.n_ctx = np + n_gen + 64;
    gerbil_session_t s;
    if (gerbil_session_new(m, &spp, &s) != GERBIL_OK) { fprintf(stderr, "spec_bench: %s\n", gerbil_last_error()); return 1; }
    int32_t *prompt = malloc(sizeof(int32_t) * np), *truth = malloc(sizeof(int32_t) * n_gen),
            *got = malloc(sizeof(int32_t) * n_gen);
    unsigned long long x = 12345;
    for (int i = 0; i < np; i++) prompt[i] = (int32_t)((x = mix(x)) % (unsigned)V);
    gerbil_sampler_params sp = gerbil_sampler_default_params();
    sp.temperature = 0;
    gerbil_generate_params gp = gerbil_generate_default_params();
    gp.max_tokens = n_gen;
    gp.ignore_eos = 1;
    gerbil_generate_result res;
    double best_plain = 0;
    /* plain greedy: the truth, then its speed (best of reps, interleaved below too) */
    for (int r = 0; r <= reps; r++) {
        gerbil_sampler_t smp;
        gerbil_sampler_new(&sp, V, &smp);
        gerbil_session_reset(s);
        if (gerbil_generate(s, smp, prompt, np, &gp, r ? got : truth, &res) != GERBIL_OK) {
            fprintf(stderr, "spec_bench: %s\n", gerbil_last_error());
            return 1;
        }
        gerbil_sampler_free(smp);
        const double tps = (res.n_generated - 1) / res.gen_s;
        if (r && tps > best_plain) best_plain = tps;
    }
    if (!json)
        printf("%s, %d threads, prompt %d, %d tokens, drafts of %d%s: plain greedy %.2f tok/s (best of %d)\n", path,
               threads, np, n_gen, K, adaptive ? " (adaptive)" : " (fixed)", best_plain, reps);
    for (const char *p = rates_arg; p && *p;) {
        const double rate = atof(p);
        p = strchr(p, ',');
        if (p) p++;
        struct oracle o = {.truth = truth, .n_truth = n_gen, .n_prompt = np, .V = V, .rate = rate};
        double best = 0, plain = 0;
        int same = 1;
        gerbil_generate_result sres = {0};
        for (int r = 0; r < reps; r++) {
            for (int mode = 0; mode < 2; mode++) { /* plain, then speculative: the ratio under the same load */
                gerbil_sampler_t smp;
                gerbil_sampler_new(&sp, V, &smp);
                gerbil_session_reset(s);
                gerbil_generate_params g = gp;
                if (mode) {
                    g.spec.kind = GERBIL_SPEC_CUSTOM;
                    g.spec.draft_fn = oracle_draft;
                    g.spec.draft_user = &o;
                    g.spec.draft_max = K;
                    g.spec.draft_min = adaptive ? 0 : K;
                }
                if (gerbil_generate(s, smp, prompt, np, &g, got, &res) != GERBIL_OK) {
                    fprintf(stderr, "spec_bench: %s\n", gerbil_last_error());
                    return 1;
                }
                gerbil_sampler_free(smp);
                const double tps = (res.n_generated - 1) / res.gen_s;
                if (mode) {
                    same &= res.n_generated == n_gen && !memcmp(got, truth, sizeof(int32_t) * n_gen);
                    if (tps > best) { best = tps; sres = res; }
                } else if (tps > plain) plain = tps;
            }
        }
        const double acc = sres.n_drafted ? (double)sres.n_accepted / sres.n_drafted : 0;
        const double tpv = sres.n_verify ? (double)(sres.n_accepted + sres.n_verify) / sres.n_verify : 0;
        if (json)
            printf("{\"model\": \"%s\", \"threads\": %d, \"draft\": %d, \"adaptive\": %d, \"rate\": %.3f, "
                   "\"acceptance\": %.4f, \"tokens_per_verify\": %.3f, \"plain_tokens_per_s\": %.3f, "
                   "\"spec_tokens_per_s\": %.3f, \"speedup\": %.4f, \"same_tokens\": %s}\n",
                   path, threads, K, adaptive, rate, acc, tpv, plain, best, best / plain, same ? "true" : "false");
        else
            printf("  oracle rate %.2f: acceptance %5.1f%%, %.2f tokens/verify, %8.2f tok/s vs plain %8.2f: %.2fx%s\n",
                   rate, 100 * acc, tpv, best, plain, best / plain, same ? "" : "  TOKENS DIFFER");
        fflush(stdout);
        if (!same) return 1;
    }
    free(prompt);
    free(truth);
    free(got);
    gerbil_session_free(s);
    gerbil_model_free(m);
    return 0;
}
