/* Speculative decoding (src/gen/spec.c and gerbil_batch.verify), for every golden architecture
 * (Llama, Qwen3, Qwen3.5, Qwen3-Next, Gemma 3, LFM2) and format (f32, bf16, MLX 4-bit, GGUF
 * Q4_K(_M) and Q8_0; the hybrids' GGUF files are made at test time by `gerbil quantize`), and a
 * random-weight hybrid of 256-wide rows (bench_make_model), at 2 threads:
 *
 *  - verify rows: K + 1 rows (K = 1..8) of one sequence evaluated as verify rows, beside a
 *    prefill chunk of another sequence, give every row the logits that K + 1 single-row
 *    decodes give, bit for bit, and leave the same recurrent state; positions cross a KV block;
 *  - rewind: from a checkpoint before the verify, truncate + replay of the kept rows (every
 *    keep length 0..K+1) leaves the recurrent state and the next logits of running only the kept
 *    rows, bit for bit;
 *  - exactness: gerbil_generate greedy with --spec ngram, a draft model = the target (every
 *    draft accepted) and a draft model = another format of the same checkpoint (some rejected),
 *    draft lengths 1..8 (fixed) and adaptive, gives the tokens and stop reason of plain greedy,
 *    across n_batch chunk boundaries and into a full context;
 *  - bad input: a draft model of another vocabulary, DFlash, a grammar, bad lengths;
 *  - sampling: speculative sampling with rejection against the exact distribution of the
 *    first two tokens (top-k 6, top-p 0.95, temperature 1.3; chi-square at p = 0.001 over
 *    3000 seeded draws each, n-gram and draft-model drafters), and seeded runs reproducible.
 * Exits 77 when the fixtures are missing. */
#include "gerbil.h"
#include "test.h"

#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct fixture {
    const char *name, *src, *type; /* tests/fixtures/NAME, or a quantized copy of SRC */
    const char *draft;             /* another format of the same checkpoint (a perturbed draft) */
};

static const struct fixture fixtures[] = {
    {"llama-f32", 0, 0, "llama-mlx4"}, {"llama-bf16", 0, 0, "llama-f32"}, {"llama-mlx4", 0, 0, "llama-f32"},
    {"llama-gguf-q4_k", 0, 0, "llama-f32"}, {"llama-gguf-q8_0", 0, 0, "llama-f32"},
    {"qwen3-f32", 0, 0, "qwen3-mlx4"}, {"qwen3-bf16", 0, 0, "qwen3-f32"}, {"qwen3-mlx4", 0, 0, "qwen3-f32"},
    {"qwen3-gguf-q4_k_m", 0, 0, "qwen3-f32"}, {"qwen3-gguf-q8_0", 0, 0, "qwen3-f32"},
    {"qwen35-f32", 0, 0, "qwen35-mlx4"}, {"qwen35-bf16", 0, 0, "qwen35-f32"}, {"qwen35-mlx4", 0, 0, "qwen35-f32"},
    {"qwen35-q8_0", "qwen35-f32", "q8_0", "qwen35-f32"}, {"qwen35-q4_k_m", "qwen35-f32", "q4_k_m", "qwen35-f32"},
    {"qwen3next-f32", 0, 0, "qwen3next-mlx4"}, {"qwen3next-bf16", 0, 0, "qwen3next-f32"},
    {"qwen3next-mlx4", 0, 0, "qwen3next-f32"},
    {"qwen3next-q4_k_m", "qwen3next-f32", "q4_k_m", "qwen3next-f32"},
    {"gemma3-f32", 0, 0, "gemma3-mlx4"}, {"gemma3-bf16", 0, 0, "gemma3-f32"}, {"gemma3-mlx4", 0, 0, "gemma3-f32"},
    {"gemma3-gguf-q4_k", 0, 0, "gemma3-f32"}, {"gemma3-gguf-q8_0", 0, 0, "gemma3-f32"},
    {"lfm2-f32", 0, 0, "lfm2-mlx4"}, {"lfm2-bf16", 0, 0, "lfm2-f32"}, {"lfm2-mlx4", 0, 0, "lfm2-f32"},
    {"lfm2-gguf-q8_0", 0, 0, "lfm2-f32"}, {"lfm2-q4_k_m", "lfm2-f32", "q4_k_m", "lfm2-f32"},
    {"llama-rope-dynamic", 0, 0, NULL},
    {"tiny-hybrid-q4_k_m", "@tiny-hybrid", "q4_k_m", NULL},
    /* trained (Karpathy's stories260K), its GGUF f32 conversion as the draft */
    {"../shared/data/models/stories260K/hf", 0, 0, "../shared/data/models/stories260K/gguf/stories260K-f32.gguf"},
};

static const char *tmpdir;

static int fixture_path(const char *name, const char *srcname, const char *type, char *out, size_t cap) {
    struct stat st;
    if (!srcname && name[0] == '.') { /* a path: ../shared/data */
        snprintf(out, cap, "%s", name);
        return stat(out, &st) == 0 ? 0 : -1;
    }
    if (!srcname) {
        snprintf(out, cap, "tests/fixtures/%s/model.gguf", name);
        if (stat(out, &st) != 0) snprintf(out, cap, "tests/fixtures/%s", name);
        return stat(out, &st) == 0 ? 0 : -1;
    }
    const char *bin = getenv("GERBIL_BIN"), *mk = getenv("GERBIL_MAKE_MODEL");
    if (!bin || !tmpdir) return -1;
    char src[512], cmd[1536];
    if (srcname[0] == '@') {
        if (!mk) return -1;
        snprintf(src, sizeof src, "%s/%s", tmpdir, srcname + 1);
        if (stat(src, &st) != 0) {
            snprintf(cmd, sizeof cmd, "'%s' '%s' --shape %s --dtype f32 >/dev/null 2>&1", mk, src, srcname + 1);
            if (system(cmd) != 0) return -1;
        }
    } else {
        snprintf(src, sizeof src, "tests/fixtures/%s", srcname);
    }
    snprintf(out, cap, "%s/%s.gguf", tmpdir, name);
    if (stat(out, &st) == 0) return 0;
    snprintf(cmd, sizeof cmd, "'%s' quantize '%s' '%s' --type %s >/dev/null 2>&1", bin, src, out, type);
    return system(cmd) == 0 ? 0 : -1;
}

static gerbil_model_t load(const char *path) {
    gerbil_model_params mp = gerbil_model_default_params();
    mp.n_threads = 2;
    gerbil_model_t m = NULL;
    if (gerbil_model_load(path, &mp, &m) != GERBIL_OK) {
        CHECKF(0, "%s: %s", path, gerbil_last_error());
        return NULL;
    }
    return m;
}

static unsigned long long rng = 0x5eed;

enum { MAXR = 9, PRE = 13 }; /* PRE + up to 9 rows crosses the 16-position block */

/* Verify rows against single decodes, and rewind to every keep length. */
static void check_verify(gerbil_model_t m, const char *what) {
    const int V = gerbil_model_n_vocab(m);
    gerbil_context_params cp = gerbil_context_default_params();
    cp.n_ctx = 128;
    cp.n_seq_max = 4;
    cp.n_batch = 64;
    gerbil_context_t c;
    if (gerbil_context_new(m, &cp, &c) != GERBIL_OK) { CHECKF(0, "%s: %s", what, gerbil_last_error()); return; }
    const size_t SB = gerbil_context_state_bytes(c);
    unsigned char *st_a = SB ? malloc(SB) : NULL, *st_b = SB ? malloc(SB) : NULL;
    float *single = malloc(sizeof(float) * V * MAXR);
    int32_t pre[PRE], other[20], rows[MAXR];
    for (int i = 0; i < PRE; i++) pre[i] = (int32_t)(test_rand_u64(&rng) % (unsigned)V);
    for (int i = 0; i < 20; i++) other[i] = (int32_t)(test_rand_u64(&rng) % (unsigned)V);
    int bad_logits = 0, bad_state = 0, bad_rewind = 0, n_cases = 0;
    for (int K = 1; K <= MAXR - 1; K++) {
        const int R = K + 1;
        for (int i = 0; i < R; i++) rows[i] = (int32_t)(test_rand_u64(&rng) % (unsigned)V);
        int32_t a, b, o;
        CHECK(gerbil_seq_new(c, &a) == GERBIL_OK && gerbil_seq_new(c, &b) == GERBIL_OK &&
              gerbil_seq_new(c, &o) == GERBIL_OK);
        int32_t sq[64];
        int8_t fl[64], vf[64], ones[64];
        for (int i = 0; i < 64; i++) { sq[i] = a; fl[i] = 1; vf[i] = 0; ones[i] = 1; }
        gerbil_batch pb = {.n_rows = PRE, .tokens = pre, .seq = sq};
        CHECK(gerbil_context_eval(c, &pb) == GERBIL_OK);
        for (int i = 0; i < PRE; i++) sq[i] = b;
        CHECK(gerbil_context_eval(c, &pb) == GERBIL_OK);
        /* b: single decodes */
        for (int i = 0; i < R; i++) {
            gerbil_batch db = {.n_rows = 1, .tokens = rows + i, .seq = &b};
            CHECK(gerbil_context_eval(c, &db) == GERBIL_OK);
            memcpy(single + (size_t)i * V, gerbil_context_logits(c, 0), sizeof(float) * V);
        }
        /* a: R verify rows, interleaved with a 20-row prefill chunk of o */
        gerbil_seq_checkpoint(c, a);
        int32_t tok[64];
        int n = 0, ia = 0, io = 0, where[MAXR];
        while (ia < R || io < 20) {
            if (io < 20) { tok[n] = other[io++]; sq[n] = o; vf[n] = 0; fl[n++] = 0; }
            if (ia < R && (io % 3 == 0 || io == 20)) { where[ia] = n; tok[n] = rows[ia++]; sq[n] = a; vf[n] = 1; fl[n++] = 1; }
        }
        gerbil_batch vb = {.n_rows = n, .tokens = tok, .seq = sq, .logits = fl, .verify = vf};
        CHECK(gerbil_context_eval(c, &vb) == GERBIL_OK);
        (void)where;
        for (int i = 0; i < R; i++)
            if (memcmp(gerbil_context_logits(c, i), single + (size_t)i * V, sizeof(float) * V)) {
                if (bad_logits++ < 3) fprintf(stderr, "%s: K=%d: verify row %d differs from a single decode\n", what, K, i);
            }
        if (SB) {
            gerbil_seq_state_save(c, a, st_a);
            gerbil_seq_state_save(c, b, st_b);
            bad_state += memcmp(st_a, st_b, SB) != 0;
        }
        /* rewind to every keep length: truncate (back to the checkpoint), replay the kept rows
         * as verify rows, against a fresh sequence that ran pre + the kept rows one at a time */
        for (int keep = 0; keep <= R; keep++) {
            gerbil_seq_truncate(c, a, PRE + keep);
            const int at = gerbil_seq_len(c, a);
            if (at < PRE + keep) {
                for (int i = 0; i < PRE + keep - at; i++) sq[i] = a;
                gerbil_batch rb = {.n_rows = PRE + keep - at, .tokens = rows + (at - PRE), .seq = sq, .verify = ones};
                CHECK(at >= PRE && gerbil_context_eval(c, &rb) == GERBIL_OK);
            }
            CHECK(gerbil_seq_len(c, a) == PRE + keep);
            int32_t f;
            CHECK(gerbil_seq_new(c, &f) == GERBIL_OK);
            for (int i = 0; i < PRE; i++) sq[i] = f;
            gerbil_batch fb = {.n_rows = PRE, .tokens = pre, .seq = sq};
            CHECK(gerbil_context_eval(c, &fb) == GERBIL_OK);
            for (int i = 0; i < keep; i++) {
                gerbil_batch db = {.n_rows = 1, .tokens = rows + i, .seq = &f};
                CHECK(gerbil_context_eval(c, &db) == GERBIL_OK);
            }
            if (SB) {
                gerbil_seq_state_save(c, a, st_a);
                gerbil_seq_state_save(c, f, st_b);
                if (memcmp(st_a, st_b, SB) && bad_rewind++ < 3)
                    fprintf(stderr, "%s: K=%d keep %d: the rewound state differs from running the kept rows\n", what,
                            K, keep);
            }
            /* the next token's logits after the rewind */
            const int32_t nxt = other[keep];
            gerbil_batch na = {.n_rows = 1, .tokens = &nxt, .seq = &a}, nf = {.n_rows = 1, .tokens = &nxt, .seq = &f};
            CHECK(gerbil_context_eval(c, &na) == GERBIL_OK);
            memcpy(single, gerbil_context_logits(c, 0), sizeof(float) * V);
            CHECK(gerbil_context_eval(c, &nf) == GERBIL_OK);
            if (memcmp(single, gerbil_context_logits(c, 0), sizeof(float) * V) && bad_rewind++ < 3)
                fprintf(stderr, "%s: K=%d keep %d: logits after the rewind differ\n", what, K, keep);
            /* back to the verify's end for the next keep length: redo it */
            gerbil_seq_free(c, f);
            gerbil_seq_truncate(c, a, PRE);
            if (gerbil_seq_len(c, a) != PRE) { CHECKF(0, "%s: truncate to the checkpoint", what); break; }
            gerbil_seq_checkpoint(c, a);
            for (int i = 0; i < R; i++) sq[i] = a;
            gerbil_batch rb = {.n_rows = R, .tokens = rows, .seq = sq, .verify = ones};
            CHECK(gerbil_context_eval(c, &rb) == GERBIL_OK);
            n_cases++;
        }
        gerbil_seq_free(c, a);
        gerbil_seq_free(c, b);
        gerbil_seq_free(c, o);
    }
    CHECKF(!bad_logits, "%s: %d verify rows differ from single decodes", what, bad_logits);
    CHECKF(!bad_state, "%s: %d recurrent states after verify rows differ from single decodes", what, bad_state);
    CHECKF(!bad_rewind, "%s: %d of %d rewinds differ from running only the kept rows", what, bad_rewind, n_cases);
    free(st_a);
    free(st_b);
    free(single);
    gerbil_context_free(c);
}

enum { NGEN = 48, NCTX = 56 };

/* Greedy generation, plain or speculative; returns the count (-1 on error). */
static int gen(gerbil_model_t m, gerbil_model_t dm, gerbil_spec_kind kind, int kmin, int kmax, const int32_t *prompt,
               int np, int32_t *out, gerbil_generate_result *res) {
    gerbil_session_params spp = gerbil_session_default_params();
    spp.n_ctx = NCTX;
    gerbil_session_t s = NULL, ds = NULL;
    if (gerbil_session_new(m, &spp, &s) != GERBIL_OK) return -1;
    if (dm && gerbil_session_new(dm, &spp, &ds) != GERBIL_OK) { gerbil_session_free(s); return -1; }
    gerbil_sampler_params sp = gerbil_sampler_default_params();
    sp.temperature = 0;
    gerbil_sampler_t smp;
    gerbil_sampler_new(&sp, gerbil_model_n_vocab(m), &smp);
    gerbil_generate_params gp = gerbil_generate_default_params();
    gp.max_tokens = NGEN;
    gp.ignore_eos = 1;
    gp.spec.kind = kind;
    gp.spec.draft = ds;
    gp.spec.draft_min = kmin;
    gp.spec.draft_max = kmax;
    gerbil_status st = gerbil_generate(s, smp, prompt, np, &gp, out, res);
    if (st != GERBIL_OK) fprintf(stderr, "generate: %s\n", gerbil_last_error());
    const int n_past = gerbil_session_n_past(s);
    gerbil_sampler_free(smp);
    gerbil_session_free(s);
    gerbil_session_free(ds);
    if (st != GERBIL_OK) return -1;
    return n_past == np + res->n_generated - 1 ? res->n_generated : -2; /* as plain decoding leaves it */
}

static void check_exact(gerbil_model_t m, gerbil_model_t dm, const char *what) {
    const int V = gerbil_model_n_vocab(m);
    /* a repetitive prompt (n-gram matches) of 20 tokens */
    int32_t prompt[20], want[NGEN], got[NGEN];
    for (int i = 0; i < 7; i++) prompt[i] = (int32_t)(test_rand_u64(&rng) % (unsigned)V);
    for (int i = 7; i < 20; i++) prompt[i] = prompt[i % 7];
    gerbil_generate_result r0, r;
    const int n0 = gen(m, NULL, GERBIL_SPEC_NONE, 0, 0, prompt, 20, want, &r0);
    CHECKF(n0 > 0 && r0.stop == GERBIL_STOP_CONTEXT, "%s: plain run (%d, stop %d)", what, n0, r0.stop);
    if (n0 <= 0) return;
    int bad = 0, runs = 0;
    long drafted[3] = {0}, accepted[3] = {0};
    for (int kind = 0; kind < 3; kind++) {
        if (kind == 2 && !dm) continue;
        const gerbil_spec_kind sk = kind == 0 ? GERBIL_SPEC_NGRAM : GERBIL_SPEC_DRAFT;
        gerbil_model_t d = kind == 1 ? m : kind == 2 ? dm : NULL;
        for (int K = 0; K <= 8; K++) { /* K = 0: adaptive 0..5 */
            const int n = gen(m, d, sk, K ? K : 0, K ? K : 5, prompt, 20, got, &r);
            runs++;
            drafted[kind] += r.n_drafted;
            accepted[kind] += r.n_accepted;
            if (n != n0 || r.stop != r0.stop || memcmp(got, want, sizeof(int32_t) * n0)) {
                if (bad++ < 3)
                    fprintf(stderr, "%s: %s K=%d: %d tokens (want %d), stop %d (want %d)%s\n", what,
                            kind == 0 ? "ngram" : kind == 1 ? "draft=target" : "draft=perturbed", K, n, n0, r.stop,
                            r0.stop, n == n0 ? ", tokens differ" : "");
            }
            if (kind == 1)
                CHECKF(r.n_accepted == r.n_drafted && r.n_drafted > 0, "%s: draft = target K=%d accepted %d of %d",
                       what, K, r.n_accepted, r.n_drafted);
        }
    }
    CHECKF(!bad, "%s: %d of %d speculative runs differ from plain greedy", what, bad, runs);
    printf("%-22s exact over %d runs; acceptance ngram %ld/%ld, draft=target %ld/%ld, perturbed %ld/%ld\n", what,
           runs, accepted[0], drafted[0], accepted[1], drafted[1], accepted[2], drafted[2]);
}

static void check_errors(gerbil_model_t m, gerbil_model_t other) {
    gerbil_session_t s, ds;
    CHECK(gerbil_session_new(m, NULL, &s) == GERBIL_OK && gerbil_session_new(other, NULL, &ds) == GERBIL_OK);
    gerbil_sampler_params sp = gerbil_sampler_default_params();
    gerbil_sampler_t smp;
    gerbil_sampler_new(&sp, gerbil_model_n_vocab(m), &smp);
    int32_t prompt[3] = {1, 2, 3}, out[4];
    gerbil_generate_result r;
    gerbil_generate_params gp = gerbil_generate_default_params();
    gp.max_tokens = 4;
    gp.spec.kind = GERBIL_SPEC_DRAFT;
    gp.spec.draft = ds;
    CHECK(gerbil_generate(s, smp, prompt, 3, &gp, out, &r) == GERBIL_ERR_INVALID_ARG &&
          strstr(gerbil_last_error(), "vocabulary"));
    gp.spec.kind = GERBIL_SPEC_DFLASH;
    CHECK(gerbil_generate(s, smp, prompt, 3, &gp, out, &r) == GERBIL_ERR_UNSUPPORTED &&
          strstr(gerbil_last_error(), "not yet implemented"));
    gp.spec.kind = GERBIL_SPEC_NGRAM;
    gp.spec.draft_max = 40;
    CHECK(gerbil_generate(s, smp, prompt, 3, &gp, out, &r) == GERBIL_ERR_INVALID_ARG);
    gp.spec.draft_max = 4;
    gp.spec.draft_min = 5;
    CHECK(gerbil_generate(s, smp, prompt, 3, &gp, out, &r) == GERBIL_ERR_INVALID_ARG);
    CHECK(gerbil_session_n_past(s) == 0); /* refused before the prefill */
    gerbil_sampler_free(smp);
    gerbil_session_free(s);
    gerbil_session_free(ds);
}

/* ---- sampling ---- */

enum { TOPK = 6, DRAWS = 3000 };

static gerbil_sampler_params samp_params(uint64_t seed) {
    gerbil_sampler_params sp = gerbil_sampler_default_params();
    sp.temperature = 1.3f;
    sp.top_k = TOPK;
    sp.top_p = 0.95f;
    sp.seed = seed;
    return sp;
}

/* The chain's distribution over the vocabulary for logits (p[V]), by the definition:
 * softmax(l / T) over the top-k, then the smallest prefix reaching top-p, renormalised. */
static void chain_dist(const float *logits, int V, double *p) {
    int idx[TOPK];
    for (int j = 0; j < TOPK; j++) {
        int best = -1;
        for (int i = 0; i < V; i++) {
            int used = 0;
            for (int u = 0; u < j; u++) used |= idx[u] == i;
            if (!used && (best < 0 || logits[i] > logits[best])) best = i;
        }
        idx[j] = best;
    }
    double e[TOPK], sum = 0;
    for (int j = 0; j < TOPK; j++) sum += e[j] = exp(((double)logits[idx[j]] - logits[idx[0]]) / 1.3);
    int m = 0;
    double mass = 0;
    for (; m < TOPK;) {
        mass += e[m] / sum;
        m++;
        if (mass >= 0.95) break;
    }
    double tot = 0;
    for (int j = 0; j < m; j++) tot += e[j];
    for (int i = 0; i < V; i++) p[i] = 0;
    for (int j = 0; j < m; j++) p[idx[j]] = e[j] / tot;
}

/* Chi-square critical value at p = 0.001 (Wilson-Hilferty). */
static double chi2_crit(int df) {
    const double z = 3.0902, a = 2.0 / (9.0 * df);
    const double t = 1.0 - a + z * sqrt(a);
    return df * t * t * t;
}

static void check_sampling(gerbil_model_t m, gerbil_model_t dm, const char *what) {
    const int V = gerbil_model_n_vocab(m);
    /* the prompt holds every token the first draw may give, so the n-gram drafter always
     * proposes the token after it: 24 random tokens, with the first token's support put in
     * front until it is all inside */
    double *p1 = malloc(sizeof(double) * V), *p2 = malloc(sizeof(double) * V), *joint = calloc((size_t)V * V, sizeof(double));
    float *lg = malloc(sizeof(float) * V);
    int32_t *prompt = malloc(sizeof(int32_t) * (24 + 10 * TOPK)), NP = 24;
    for (int i = 0; i < NP; i++) prompt[i] = (int32_t)(test_rand_u64(&rng) % (unsigned)V);
    gerbil_session_params spp = gerbil_session_default_params();
    spp.n_ctx = 24 + 10 * TOPK + 16;
    for (int round = 0; round < 10; round++) {
        gerbil_session_t s0;
        CHECK(gerbil_session_new(m, &spp, &s0) == GERBIL_OK);
        CHECK(gerbil_session_eval(s0, prompt, NP, lg, 0) == GERBIL_OK);
        gerbil_session_free(s0);
        chain_dist(lg, V, p1);
        int32_t miss[TOPK];
        int n_miss = 0;
        for (int t = 0; t < V; t++) {
            int in = 0;
            for (int i = 0; i < NP - 1; i++) in |= prompt[i] == t;
            if (p1[t] > 0 && !in) miss[n_miss++] = t;
        }
        if (!n_miss) break;
        memmove(prompt + n_miss, prompt, sizeof(int32_t) * NP);
        memcpy(prompt, miss, sizeof(int32_t) * n_miss);
        NP += n_miss;
    }
    /* the exact joint distribution of the first two tokens */
    gerbil_session_t s;
    CHECK(gerbil_session_new(m, &spp, &s) == GERBIL_OK);
    CHECK(gerbil_session_eval(s, prompt, NP, lg, 0) == GERBIL_OK);
    chain_dist(lg, V, p1);
    for (int t = 0; t < V; t++) {
        if (p1[t] == 0) continue;
        gerbil_session_truncate(s, NP);
        if (gerbil_session_n_past(s) != NP) { gerbil_session_reset(s); gerbil_session_eval(s, prompt, NP, lg, 0); }
        const int32_t t1 = t;
        CHECK(gerbil_session_eval(s, &t1, 1, lg, 0) == GERBIL_OK);
        chain_dist(lg, V, p2);
        for (int u = 0; u < V; u++) joint[(size_t)t * V + u] = p1[t] * p2[u];
    }
    for (int kind = 0; kind < 2; kind++) {
        long *count = calloc((size_t)V * V, sizeof(long));
        long drafted = 0, acc = 0;
        int errs = 0;
        gerbil_session_t ts, ds = NULL;
        gerbil_session_new(m, &spp, &ts);
        if (kind == 1) gerbil_session_new(dm, &spp, &ds);
        for (int d = 0; d < DRAWS; d++) {
            gerbil_session_reset(ts);
            if (ds) gerbil_session_reset(ds);
            gerbil_sampler_params sp = samp_params(1000 + (uint64_t)d);
            gerbil_sampler_t smp;
            gerbil_sampler_new(&sp, V, &smp);
            gerbil_generate_params gp = gerbil_generate_default_params();
            gp.max_tokens = 3; /* the second token comes from a verify row */
            gp.ignore_eos = 1;
            gp.spec.kind = kind ? GERBIL_SPEC_DRAFT : GERBIL_SPEC_NGRAM;
            gp.spec.draft = ds;
            gp.spec.draft_min = gp.spec.draft_max = 1;
            int32_t out[3];
            gerbil_generate_result r;
            if (gerbil_generate(ts, smp, prompt, NP, &gp, out, &r) != GERBIL_OK || r.n_generated != 3) errs++;
            else count[(size_t)out[0] * V + out[1]]++;
            drafted += r.n_drafted;
            acc += r.n_accepted;
            gerbil_sampler_free(smp);
        }
        gerbil_session_free(ts);
        gerbil_session_free(ds);
        CHECKF(!errs, "%s: %d generations failed", what, errs);
        /* chi-square over cells with expected >= 5, the rest pooled */
        double chi = 0, pool_e = 0;
        long pool_o = 0, outside = 0;
        int cells = 0;
        for (size_t i = 0; i < (size_t)V * V; i++) {
            const double e = joint[i] * DRAWS;
            if (e == 0) { outside += count[i]; continue; }
            if (e < 5) { pool_e += e; pool_o += count[i]; continue; }
            chi += (count[i] - e) * (count[i] - e) / e;
            cells++;
        }
        if (pool_e > 0) { chi += (pool_o - pool_e) * (pool_o - pool_e) / pool_e; cells++; }
        const double crit = chi2_crit(cells - 1);
        CHECKF(outside == 0, "%s: %ld draws outside the chain's support", what, outside);
        CHECKF(chi < crit && cells > 3, "%s %s: chi-square %.1f over %d cells >= %.1f (p = 0.001)", what,
               kind ? "draft" : "ngram", chi, cells, crit);
        /* n-gram drafts here are random tokens the chain mostly gives probability 0 */
        CHECKF(drafted > DRAWS / 2 && (kind == 0 || (acc > 0 && acc < drafted)), "%s: %ld of %ld drafts accepted",
               what, acc, drafted);
        printf("%s sampling (%s): chi-square %.1f over %d cells (critical %.1f), %ld of %ld drafts accepted\n", what,
               kind ? "draft model" : "ngram", chi, cells, crit, acc, drafted);
        free(count);
    }
    /* seeded runs reproducible */
    int32_t a[NGEN], b[NGEN];
    for (int rep = 0; rep < 2; rep++) {
        gerbil_session_t ts, ds;
        spp.n_ctx = NP + 48;
        gerbil_session_new(m, &spp, &ts);
        gerbil_session_new(dm, &spp, &ds);
        gerbil_sampler_params sp = samp_params(77);
        gerbil_sampler_t smp;
        gerbil_sampler_new(&sp, V, &smp);
        gerbil_generate_params gp = gerbil_generate_default_params();
        gp.max_tokens = 40;
        gp.ignore_eos = 1;
        gp.spec.kind = GERBIL_SPEC_DRAFT;
        gp.spec.draft = ds;
        gerbil_generate_result r;
        CHECK(gerbil_generate(ts, smp, prompt, NP, &gp, rep ? b : a, &r) == GERBIL_OK && r.n_generated == 40);
        gerbil_sampler_free(smp);
        gerbil_session_free(ts);
        gerbil_session_free(ds);
    }
    CHECKF(!memcmp(a, b, sizeof(int32_t) * 40), "%s: a seeded speculative run is not reproducible", what);
    gerbil_session_free(s);
    free(p1); free(p2); free(joint); free(lg); free(prompt);
}

int main(void) {
    struct stat st;
    if (stat("tests/fixtures/llama-f32/config.json", &st) != 0) SKIP("tests/fixtures missing");
    char tmpl[] = "/tmp/gerbil-spec-XXXXXX";
    tmpdir = mkdtemp(tmpl);
    const char *only = getenv("GERBIL_SPEC_ONLY");
    for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++) {
        const struct fixture *f = &fixtures[i];
        if (only && !strstr(f->name, only)) continue;
        char path[1024], dpath[1024];
        if (fixture_path(f->name, f->src, f->type, path, sizeof path) != 0) {
            CHECKF(0, "%s: fixture missing (or gerbil quantize failed)", f->name);
            continue;
        }
        gerbil_model_t m = load(path), dm = NULL;
        if (!m) continue;
        if (f->draft && fixture_path(f->draft, NULL, NULL, dpath, sizeof dpath) == 0) dm = load(dpath);
        check_verify(m, f->name);
        check_exact(m, dm, f->name);
        if (!strcmp(f->name, "llama-f32")) check_sampling(m, dm, f->name);
        gerbil_model_free(dm);
        gerbil_model_free(m);
    }
    if (!only) { /* a draft of another vocabulary */
        char a[1024], b[1024];
        gerbil_model_t m = NULL, o = NULL;
        if (fixture_path("llama-f32", NULL, NULL, a, sizeof a) == 0) m = load(a);
        if (fixture_path("../shared/data/models/stories260K/hf", NULL, NULL, b, sizeof b) == 0) o = load(b);
        if (m && o && gerbil_model_n_vocab(m) != gerbil_model_n_vocab(o)) check_errors(m, o);
        else CHECKF(0, "no two fixtures of different vocabularies");
        gerbil_model_free(m);
        gerbil_model_free(o);
    }
    if (tmpdir) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    }
    return test_done();
}
