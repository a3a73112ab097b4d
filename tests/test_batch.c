/* Batches of many sequences against the same sequences alone, for every golden
 * architecture (Llama, Qwen3, Qwen3.5, Qwen3-Next, Gemma 3, LFM2) and weight format
 * (f32, bf16, MLX 4-bit, GGUF Q4_K(_M) and Q8_0; the hybrids' GGUF files are made at
 * test time by `gerbil quantize`), at 1 and 2 threads, f16 and f32 KV caches:
 *
 *  - invariance: 1 to 16 sequences of different lengths, each cut into a fixed plan of
 *    prefill chunks (some above the prefill GEMMs' 32/48-row thresholds) and then decode
 *    rows, started at staggered steps so every batch mixes prefill chunks of some
 *    sequences with decode rows of others, their rows interleaved in the batch: every
 *    row's logits equal, bit for bit, that sequence's own logits evaluated alone with the
 *    same chunks;
 *  - the first sequence is the fixture's prompt: alone it still matches transformers
 *    (the golden bounds: 1e-3 f32 weights, and test_golden_quant's for quantized ones);
 *  - sequences: a fork shares its source's blocks and each continues as if alone;
 *    truncate + re-eval equals a fresh eval; a recurrent checkpoint restored equals
 *    re-running; a full KV cache and bad rows are refused with nothing changed;
 *  - hidden-state taps and embedding rows: a row given as its token's embedding equals
 *    the token row, and taps of the last layer feed the logits;
 *  - two sessions of one model evaluating from two threads at once get what they get alone.
 * GERBIL_TEST_BACKEND=cuda (or cuda:N) loads every model on that backend instead of the CPU
 * (the same checks: batch invariance on the GPU); it skips (77) without a GPU. */
#include "gerbil.h"
#include "io/safetensors.h"
#include "test.h"

#include <pthread.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static unsigned long long rng;

enum { MAX_SEQ = 16, MAX_CHUNKS = 8, MAX_TOK = 128, N_BATCH = 72 };

/* A sequence: its tokens and how they are cut: chunk[0..n_chunks) rows per eval. */
struct seq_plan {
    int32_t tok[MAX_TOK];
    int n_tok, n_chunks, chunk[MAX_CHUNKS], start; /* start: the batched run's step of its first chunk */
    float *solo;                                   /* [n_tok][V] logits alone */
};

static const char *tmpdir;

struct fixture {
    const char *name;  /* tests/fixtures/NAME, or a quantized copy of SRC */
    const char *src, *type;
};

static const struct fixture fixtures[] = {
    {"llama-f32", 0, 0}, {"llama-bf16", 0, 0}, {"llama-mlx4", 0, 0}, {"llama-gguf-q4_k", 0, 0},
    {"llama-gguf-q8_0", 0, 0},
    {"qwen3-f32", 0, 0}, {"qwen3-bf16", 0, 0}, {"qwen3-mlx4", 0, 0}, {"qwen3-gguf-q4_k_m", 0, 0},
    {"qwen3-gguf-q8_0", 0, 0},
    {"qwen35-f32", 0, 0}, {"qwen35-bf16", 0, 0}, {"qwen35-mlx4", 0, 0},
    {"qwen35-q8_0", "qwen35-f32", "q8_0"}, {"qwen35-q4_k_m", "qwen35-f32", "q4_k_m"},
    {"qwen3next-f32", 0, 0}, {"qwen3next-bf16", 0, 0}, {"qwen3next-mlx4", 0, 0},
    {"qwen3next-q8_0", "qwen3next-f32", "q8_0"}, {"qwen3next-q4_k_m", "qwen3next-f32", "q4_k_m"},
    {"gemma3-f32", 0, 0}, {"gemma3-bf16", 0, 0}, {"gemma3-mlx4", 0, 0}, {"gemma3-gguf-q4_k", 0, 0},
    {"gemma3-gguf-q8_0", 0, 0},
    {"lfm2-f32", 0, 0}, {"lfm2-bf16", 0, 0}, {"lfm2-mlx4", 0, 0}, {"lfm2-gguf-q8_0", 0, 0},
    {"lfm2-q4_k_m", "lfm2-f32", "q4_k_m"},
    {"gemma4-f32", 0, 0}, {"gemma4-bf16", 0, 0}, {"gemma4-mlx4", 0, 0}, {"gemma4-kv-f32", 0, 0},
    {"gemma4-gguf-f32", 0, 0},
    /* the fixtures' 64-wide rows take Q5_0/Q8_0 under q4_k_m: a hybrid of 256-wide rows (random
     * weights, bench_make_model) has real Q4_K and Q6_K rows */
    {"tiny-hybrid-q4_k_m", "@tiny-hybrid", "q4_k_m"},
    {"tiny-hybrid-f32", "@tiny-hybrid", NULL},
};

/* The model file of a fixture (quantizing it first for the made-up ones); 0 on success. */
static int fixture_path(const struct fixture *f, char *out, size_t cap) {
    struct stat st;
    if (!f->src) {
        snprintf(out, cap, "tests/fixtures/%s/model.gguf", f->name);
        if (stat(out, &st) != 0) snprintf(out, cap, "tests/fixtures/%s", f->name);
        return 0;
    }
    const char *bin = getenv("GERBIL_BIN"), *mk = getenv("GERBIL_MAKE_MODEL");
    if (!bin || !tmpdir) return -1;
    char src[512], cmd[1536];
    if (f->src[0] == '@') { /* a random-weight model of this shape */
        if (!mk) return -1;
        snprintf(src, sizeof src, "%s/%s", tmpdir, f->src + 1);
        if (stat(src, &st) != 0) {
            snprintf(cmd, sizeof cmd, "'%s' '%s' --shape %s --dtype f32 >/dev/null 2>&1", mk, src, f->src + 1);
            if (system(cmd) != 0) return -1;
        }
        if (!f->type) {
            snprintf(out, cap, "%s", src);
            return 0;
        }
    } else {
        snprintf(src, sizeof src, "tests/fixtures/%s", f->src);
    }
    snprintf(out, cap, "%s/%s.gguf", tmpdir, f->name);
    if (stat(out, &st) == 0) return 0;
    snprintf(cmd, sizeof cmd, "'%s' quantize '%s' '%s' --type %s >/dev/null 2>&1", bin, src, out, f->type);
    return system(cmd) == 0 ? 0 : -1;
}

static const char *test_backend; /* $GERBIL_TEST_BACKEND (NULL: cpu) */

static gerbil_model_t load(const char *path, int threads) {
    gerbil_model_params mp = gerbil_model_default_params();
    mp.n_threads = threads;
    mp.backend = test_backend;
    gerbil_model_t m = NULL;
    if (gerbil_model_load(path, &mp, &m) != GERBIL_OK) {
        CHECKF(0, "%s: %s", path, gerbil_last_error());
        return NULL;
    }
    return m;
}

/* The plans: sequence 0 is the fixture's prompt (chunks 60% / 40%) then 5 decode rows;
 * the others random tokens, lengths 1..~70, in 1-3 chunks (one of 50 rows: past the
 * GEMM thresholds), then 2-6 decode rows. */
static int make_plans(struct seq_plan *p, int n_seq, const int32_t *prompt, int n_prompt, int V) {
    for (int s = 0; s < n_seq; s++) {
        struct seq_plan *q = &p[s];
        memset(q->chunk, 0, sizeof q->chunk);
        q->n_chunks = 0;
        int len;
        if (s == 0) {
            len = n_prompt;
            for (int i = 0; i < len; i++) q->tok[i] = prompt[i];
            q->chunk[q->n_chunks++] = len * 3 / 5 > 0 ? len * 3 / 5 : 1;
            if (len - q->chunk[0] > 0) q->chunk[q->n_chunks++] = len - q->chunk[0];
        } else {
            static const int lens[] = {1, 3, 50, 7, 20, 33, 9, 2, 64, 5, 12, 1, 40, 17, 4, 28};
            len = lens[s % 16];
            for (int i = 0; i < len; i++) q->tok[i] = (int32_t)(test_rand_u64(&rng) % (unsigned)V);
            if (len > 10 && s % 3 == 1) { /* two chunks */
                q->chunk[q->n_chunks++] = len / 2;
                q->chunk[q->n_chunks++] = len - len / 2;
            } else {
                q->chunk[q->n_chunks++] = len;
            }
        }
        const int dec = s == 0 ? 5 : 2 + s % 5;
        for (int k = 0; k < dec && q->n_chunks < MAX_CHUNKS; k++) {
            q->tok[len++] = (int32_t)(test_rand_u64(&rng) % (unsigned)V);
            q->chunk[q->n_chunks++] = 1;
        }
        q->n_tok = len;
        q->start = s % 4; /* staggered: some decode while others prefill */
        if (len > MAX_TOK) return -1;
    }
    return 0;
}

/* The logits of every row of sequence plan q, alone in a context, chunk by chunk. */
static int run_solo(gerbil_model_t m, struct seq_plan *q, gerbil_kv_type kv) {
    const int V = gerbil_model_n_vocab(m);
    gerbil_context_params cp = gerbil_context_default_params();
    cp.n_ctx = q->n_tok + 4;
    cp.n_batch = N_BATCH;
    cp.kv_type = kv;
    gerbil_context_t c;
    int32_t sid;
    if (gerbil_context_new(m, &cp, &c) != GERBIL_OK || gerbil_seq_new(c, &sid) != GERBIL_OK) return -1;
    int32_t seqs[MAX_TOK];
    int8_t flags[MAX_TOK];
    for (int i = 0; i < MAX_TOK; i++) { seqs[i] = sid; flags[i] = 1; }
    int done = 0, rc = 0;
    for (int k = 0; k < q->n_chunks && !rc; k++) {
        gerbil_batch b = {.n_rows = q->chunk[k], .tokens = q->tok + done, .seq = seqs, .logits = flags};
        rc = gerbil_context_eval(c, &b) != GERBIL_OK;
        for (int i = 0; !rc && i < q->chunk[k]; i++)
            memcpy(q->solo + (size_t)(done + i) * V, gerbil_context_logits(c, i), sizeof(float) * V);
        done += q->chunk[k];
    }
    gerbil_context_free(c);
    return rc;
}

/* All sequences in one context: at step k each sequence started by then contributes its
 * next chunk; the rows of a step are interleaved round-robin across sequences. Every
 * row's logits against the solo ones, bit for bit. */
static void run_batched(gerbil_model_t m, struct seq_plan *p, int n_seq, gerbil_kv_type kv, const char *what) {
    const int V = gerbil_model_n_vocab(m);
    gerbil_context_params cp = gerbil_context_default_params();
    int total = 0;
    for (int s = 0; s < n_seq; s++) total += p[s].n_tok;
    cp.n_ctx = total + 16 * n_seq;
    cp.n_seq_max = n_seq;
    cp.n_batch = 16 * N_BATCH;
    cp.kv_type = kv;
    gerbil_context_t c;
    if (gerbil_context_new(m, &cp, &c) != GERBIL_OK) { CHECKF(0, "%s: %s", what, gerbil_last_error()); return; }
    int32_t sid[MAX_SEQ];
    int next[MAX_SEQ] = {0}, pos[MAX_SEQ] = {0};
    for (int s = 0; s < n_seq; s++) CHECK(gerbil_seq_new(c, &sid[s]) == GERBIL_OK);
    int32_t tok[16 * N_BATCH], seq[16 * N_BATCH], row_s[16 * N_BATCH], row_p[16 * N_BATCH];
    int bad = 0, rows_checked = 0, mixed = 0;
    for (int step = 0;; step++) {
        int left[MAX_SEQ], n = 0, any = 0, n_pre = 0, n_dec = 0;
        for (int s = 0; s < n_seq; s++) {
            left[s] = step >= p[s].start && next[s] < p[s].n_chunks ? p[s].chunk[next[s]] : 0;
            any |= next[s] < p[s].n_chunks;
            if (left[s] > 1) n_pre++;
            if (left[s] == 1) n_dec++;
        }
        if (!any) break;
        mixed += n_pre && n_dec;
        for (int more = 1; more;) { /* round-robin over the sequences' chunks */
            more = 0;
            for (int s = 0; s < n_seq; s++)
                if (left[s]) {
                    tok[n] = p[s].tok[pos[s]];
                    seq[n] = sid[s];
                    row_s[n] = s;
                    row_p[n++] = pos[s]++;
                    more |= --left[s] > 0;
                }
        }
        for (int s = 0; s < n_seq; s++) next[s] += step >= p[s].start && next[s] < p[s].n_chunks;
        if (!n) continue;
        int8_t flags[16 * N_BATCH];
        memset(flags, 1, (size_t)n);
        gerbil_batch b = {.n_rows = n, .tokens = tok, .seq = seq, .logits = flags};
        if (gerbil_context_eval(c, &b) != GERBIL_OK) { CHECKF(0, "%s: step %d: %s", what, step, gerbil_last_error()); break; }
        for (int i = 0; i < n; i++) {
            const float *got = gerbil_context_logits(c, i), *want = p[row_s[i]].solo + (size_t)row_p[i] * V;
            rows_checked++;
            if (memcmp(got, want, sizeof(float) * V) && bad++ < 3)
                fprintf(stderr, "%s: step %d: sequence %d position %d differs from the sequence alone\n", what, step,
                        row_s[i], row_p[i]);
        }
    }
    CHECKF(!bad, "%s: %d of %d rows differ from their sequence alone (batch invariance)", what, bad, rows_checked);
    CHECKF(n_seq < 4 || mixed > 0, "%s: no batch mixed prefill chunks and decode rows", what);
    for (int s = 0; s < n_seq; s++)
        CHECKF(gerbil_seq_len(c, sid[s]) == p[s].n_tok, "%s: sequence %d holds %d tokens, want %d", what, s,
               gerbil_seq_len(c, sid[s]), p[s].n_tok);
    gerbil_context_free(c);
}

struct expected {
    struct st_file f;
    const int32_t *ids;
    const float *logits;
    int n, V, ok;
};

static void load_expected(const char *name, struct expected *e) {
    char path[512];
    memset(e, 0, sizeof *e);
    snprintf(path, sizeof path, "tests/fixtures/%s/expected.safetensors", name);
    if (st_file_open(path, &e->f) != GERBIL_OK) return;
    const struct gb_tensor *ids = st_file_find(&e->f, "input_ids"), *lg = st_file_find(&e->f, "logits");
    if (!ids || !lg || ids->type != GB_TYPE_I32 || lg->type != GB_TYPE_F32) { st_file_close(&e->f); return; }
    e->ids = ids->data;
    e->logits = lg->data;
    e->n = (int)ids->ne[0];
    e->V = (int)lg->ne[1];
    e->ok = 1;
}

static void test_model(const struct fixture *fx, int threads, gerbil_kv_type kv, int n_seq) {
    char path[600], what[200];
    if (fixture_path(fx, path, sizeof path)) { CHECKF(0, "%s: cannot make the model", fx->name); return; }
    gerbil_model_t m = load(path, threads);
    if (!m) return;
    const int V = gerbil_model_n_vocab(m);
    struct expected e;
    if (!fx->src || fx->src[0] != '@') load_expected(fx->src ? fx->src : fx->name, &e);
    else memset(&e, 0, sizeof e);
    int32_t prompt[MAX_TOK];
    int n_prompt = e.ok ? (e.n < 60 ? e.n : 60) : 24;
    for (int i = 0; i < n_prompt; i++) prompt[i] = e.ok ? e.ids[i] : (int32_t)(3 + i * 7 % (V - 3));
    struct seq_plan *p = calloc(MAX_SEQ, sizeof *p);
    CHECK(make_plans(p, n_seq, prompt, n_prompt, V) == 0);
    int rc = 0;
    for (int s = 0; s < n_seq && !rc; s++) {
        p[s].solo = malloc(sizeof(float) * (size_t)V * p[s].n_tok);
        rc = run_solo(m, &p[s], kv);
    }
    snprintf(what, sizeof what, "%s (%d threads, %s KV, %d sequences)", fx->name, threads,
             kv == GERBIL_KV_F32 ? "f32" : "f16", n_seq);
    CHECKF(!rc, "%s: a solo run failed: %s", what, gerbil_last_error());
    if (!rc) run_batched(m, p, n_seq, kv, what);
    /* the fixture's prompt alone, chunked as in the batch, still matches transformers */
    if (!rc && e.ok && kv == GERBIL_KV_F32 && e.V == V) {
        const int quant = strstr(fx->name, "mlx") || strstr(fx->name, "q4") || strstr(fx->name, "q8");
        const int act8 = quant && !strstr(fx->name, "mlx"); /* GGUF block types: 8-bit activations */
        double ss = 0;
        for (int i = 0; i < n_prompt * V; i++) ss += (double)e.logits[i] * e.logits[i];
        const float rms = (float)sqrt(ss / ((double)n_prompt * V));
        float d = 0;
        for (int i = 0; i < n_prompt * V; i++) d = fmaxf(d, fabsf(p[0].solo[i] - e.logits[i]));
        const float bound = !quant ? 1e-3f : act8 ? 0.2f * rms : 2e-2f * rms;
        if (!fx->src) /* made-up files: no reference of their own */
            CHECKF(d <= bound, "%s: the prompt in chunks: max |logit - transformers| = %g > %g", what, d, bound);
    }
    for (int s = 0; s < n_seq; s++) free(p[s].solo);
    free(p);
    if (e.ok) st_file_close(&e.f);
    gerbil_model_free(m);
}

/* ---- sequences: fork, truncate, checkpoints, limits ---- */

static void eval_chunk(gerbil_context_t c, int32_t sid, const int32_t *tok, int n, float *out, int V) {
    int32_t seq[N_BATCH];
    int8_t flags[N_BATCH];
    for (int i = 0; i < n; i++) { seq[i] = sid; flags[i] = 1; }
    gerbil_batch b = {.n_rows = n, .tokens = tok, .seq = seq, .logits = flags};
    gerbil_status st = gerbil_context_eval(c, &b);
    CHECKF(st == GERBIL_OK, "eval: %s", gerbil_last_error());
    for (int i = 0; out && st == GERBIL_OK && i < n; i++) memcpy(out + (size_t)i * V, gerbil_context_logits(c, i), sizeof(float) * V);
}

static void test_sequences(const char *name, int recurrent) {
    char path[300];
    snprintf(path, sizeof path, "tests/fixtures/%s", name);
    gerbil_model_t m = load(path, 2);
    if (!m) return;
    const int V = gerbil_model_n_vocab(m);
    int32_t tok[64];
    for (int i = 0; i < 64; i++) tok[i] = (int32_t)(test_rand_u64(&rng) % (unsigned)V);
    float *a = malloc(sizeof(float) * V * 64), *b = malloc(sizeof(float) * V * 64);
    gerbil_context_params cp = gerbil_context_default_params();
    cp.n_ctx = 200;
    cp.n_seq_max = 4;
    cp.n_batch = N_BATCH;
    gerbil_context_t c, c1;
    CHECK(gerbil_context_new(m, &cp, &c) == GERBIL_OK);
    CHECK(gerbil_context_new(m, &cp, &c1) == GERBIL_OK);
    int32_t s0, s1, f;
    /* fork at 21 (a partial block): both continue with their own tokens, each as if alone */
    CHECK(gerbil_seq_new(c, &s0) == GERBIL_OK);
    eval_chunk(c, s0, tok, 21, NULL, V);
    const int free0 = gerbil_context_n_free(c);
    CHECK(gerbil_seq_fork(c, s0, &f) == GERBIL_OK);
    CHECKF(gerbil_context_n_free(c) == free0, "%s: a fork took blocks of its own", name);
    eval_chunk(c, f, tok + 40, 5, a, V);          /* copy-on-write of the shared last block */
    eval_chunk(c, s0, tok + 21, 5, b + 5 * V, V);
    CHECK(gerbil_seq_new(c1, &s1) == GERBIL_OK);
    int32_t ft[26];
    memcpy(ft, tok, 21 * sizeof *ft);
    memcpy(ft + 21, tok + 40, 5 * sizeof *ft);
    float *w = malloc(sizeof(float) * V * 26);
    eval_chunk(c1, s1, ft, 21, NULL, V);
    eval_chunk(c1, s1, ft + 21, 5, w, V);
    CHECKF(!memcmp(a, w, sizeof(float) * V * 5), "%s: a fork continues differently from the same tokens alone", name);
    gerbil_seq_truncate(c1, s1, 0);
    eval_chunk(c1, s1, tok, 21, NULL, V);
    eval_chunk(c1, s1, tok + 21, 5, w, V);
    CHECKF(!memcmp(b + 5 * V, w, sizeof(float) * V * 5), "%s: the fork's source changed after the fork wrote", name);
    /* truncate + re-eval equals a fresh eval (recurrent: back to a checkpoint) */
    gerbil_seq_free(c, f);
    gerbil_seq_truncate(c, s0, 0);
    eval_chunk(c, s0, tok, 30, NULL, V);
    gerbil_seq_checkpoint(c, s0);
    eval_chunk(c, s0, tok + 30, 10, a, V);
    eval_chunk(c, s0, tok + 40, 1, NULL, V);
    gerbil_seq_truncate(c, s0, 33);
    CHECKF(gerbil_seq_len(c, s0) == (recurrent ? 30 : 33), "%s: truncate(33): length %d", name, gerbil_seq_len(c, s0));
    if (!recurrent) {
        gerbil_seq_truncate(c, s0, 30);
        CHECK(gerbil_seq_len(c, s0) == 30);
    }
    eval_chunk(c, s0, tok + 30, 10, b, V);
    CHECKF(!memcmp(a, b, sizeof(float) * V * 10), "%s: truncate + re-eval differs from the first eval", name);
    gerbil_seq_truncate(c, s0, 5); /* before the checkpoint: recurrent models start over */
    CHECKF(gerbil_seq_len(c, s0) == (recurrent ? 0 : 5), "%s: truncate(5): length %d", name, gerbil_seq_len(c, s0));
    /* a full cache: refused, nothing changed */
    gerbil_context_params sp = cp;
    sp.n_ctx = 40;
    sp.n_seq_max = 2;
    gerbil_context_t cs;
    CHECK(gerbil_context_new(m, &sp, &cs) == GERBIL_OK);
    int32_t q0, q1;
    CHECK(gerbil_seq_new(cs, &q0) == GERBIL_OK && gerbil_seq_new(cs, &q1) == GERBIL_OK);
    int32_t third;
    CHECKF(gerbil_seq_new(cs, &third) == GERBIL_ERR_CONTEXT, "%s: a third sequence in a context of 2", name);
    eval_chunk(cs, q0, tok, 30, NULL, V);
    int32_t seq2[20] = {0};
    for (int i = 0; i < 20; i++) seq2[i] = q1;
    gerbil_batch big = {.n_rows = 20, .tokens = tok, .seq = seq2};
    CHECKF(gerbil_context_eval(cs, &big) == GERBIL_ERR_CONTEXT, "%s: 30 + 20 positions in a cache of 40", name);
    CHECKF(gerbil_seq_len(cs, q1) == 0 && gerbil_seq_len(cs, q0) == 30, "%s: a refused batch changed a sequence", name);
    int32_t badtok = V;
    gerbil_batch bad = {.n_rows = 1, .tokens = &badtok, .seq = &q0};
    CHECK(gerbil_context_eval(cs, &bad) == GERBIL_ERR_INVALID_ARG);
    int32_t nosuch = 7;
    gerbil_batch bad2 = {.n_rows = 1, .tokens = tok, .seq = &nosuch};
    CHECK(gerbil_context_eval(cs, &bad2) == GERBIL_ERR_INVALID_ARG);
    gerbil_batch bad3 = {.n_rows = 0, .tokens = tok, .seq = &q0};
    CHECK(gerbil_context_eval(cs, &bad3) == GERBIL_ERR_INVALID_ARG);
    CHECK(gerbil_seq_len(cs, q0) == 30);
    gerbil_context_free(cs);
    /* a block shared by two sequences that both extend it in one batch is copied once: a
     * pool with one free block takes the batch */
    gerbil_context_params tp = cp;
    tp.n_ctx = 48; /* 3 blocks */
    tp.n_seq_max = 2;
    gerbil_context_t ct;
    CHECK(gerbil_context_new(m, &tp, &ct) == GERBIL_OK);
    int32_t t0, t1;
    CHECK(gerbil_seq_new(ct, &t0) == GERBIL_OK);
    eval_chunk(ct, t0, tok, 20, NULL, V);                 /* blocks 0, 1 (4 positions of it) */
    CHECK(gerbil_seq_fork(ct, t0, &t1) == GERBIL_OK);
    CHECKF(gerbil_context_n_free(ct) == 16, "%s: %d positions free, want one block", name, gerbil_context_n_free(ct));
    int32_t two[2] = {tok[20], tok[20]}, sq[2] = {t0, t1};
    gerbil_batch both = {.n_rows = 2, .tokens = two, .seq = sq};
    CHECKF(gerbil_context_eval(ct, &both) == GERBIL_OK, "%s: two sequences extending their shared block: %s", name,
           gerbil_last_error());
    CHECK(gerbil_context_n_outputs(ct) == 2 && gerbil_context_n_free(ct) == 0);
    CHECKF(!memcmp(gerbil_context_logits(ct, 0), gerbil_context_logits(ct, 1), sizeof(float) * V),
           "%s: a fork and its source differ on the same token", name);
    gerbil_context_free(ct);
    gerbil_context_free(c);
    gerbil_context_free(c1);
    free(a); free(b); free(w);
    gerbil_model_free(m);
}

/* A row given as an embedding: the token's own embedding row gives the token's logits;
 * a tap after the last layer holds the hidden state before the final norm. */
static void test_embd_and_taps(void) {
    gerbil_model_t m = load("tests/fixtures/llama-f32", 1);
    if (!m) return;
    const int V = gerbil_model_n_vocab(m), D = gerbil_model_n_embd(m), L = gerbil_model_n_layer(m);
    const int taps[2] = {0, L - 1};
    gerbil_context_params cp = gerbil_context_default_params();
    cp.n_ctx = 64;
    cp.n_seq_max = 2;
    cp.tap_layers = taps;
    cp.n_taps = 2;
    gerbil_context_t c;
    CHECK(gerbil_context_new(m, &cp, &c) == GERBIL_OK);
    int32_t s0, s1;
    CHECK(gerbil_seq_new(c, &s0) == GERBIL_OK && gerbil_seq_new(c, &s1) == GERBIL_OK);
    int32_t tok[6] = {5, 9, 17, 33, 2, 100};
    /* embeddings: the hidden state after no layer is not tapped, so take them from the
     * embedding table as the model sees them: a one-token eval's logits with token vs row */
    float *emb = calloc((size_t)6 * D, sizeof(float));
    /* llama-f32: unscaled embeddings read from the checkpoint */
    struct st_checkpoint ck;
    CHECK(st_checkpoint_open("tests/fixtures/llama-f32", &ck) == GERBIL_OK);
    const struct gb_tensor *et = st_checkpoint_find(&ck, "model.embed_tokens.weight");
    CHECK(et && et->type == GB_TYPE_F32);
    for (int i = 0; et && i < 6; i++) memcpy(emb + (size_t)i * D, (const float *)et->data + (size_t)tok[i] * D, sizeof(float) * D);
    int32_t t2[12], q2[12];
    int8_t fl[12];
    for (int i = 0; i < 6; i++) {
        t2[i] = tok[i]; q2[i] = s0; fl[i] = 1;
        t2[6 + i] = i % 2 ? GERBIL_TOKEN_EMBD : tok[i]; q2[6 + i] = s1; fl[6 + i] = 1;
    }
    float *e2 = calloc((size_t)12 * D, sizeof(float));
    memcpy(e2 + (size_t)6 * D, emb, sizeof(float) * 6 * D);
    gerbil_batch b = {.n_rows = 12, .tokens = t2, .embd = e2, .seq = q2, .logits = fl};
    CHECKF(gerbil_context_eval(c, &b) == GERBIL_OK, "embedding rows: %s", gerbil_last_error());
    CHECK(gerbil_context_n_outputs(c) == 12);
    int diff = 0;
    for (int i = 0; i < 6; i++) {
        diff |= memcmp(gerbil_context_logits(c, i), gerbil_context_logits(c, 6 + i), sizeof(float) * V) != 0;
        for (int k = 0; k < 2; k++)
            diff |= memcmp(gerbil_context_hidden(c, i, k), gerbil_context_hidden(c, 6 + i, k), sizeof(float) * D) != 0;
    }
    CHECKF(!diff, "rows given as their tokens' embeddings differ from the token rows");
    CHECK(gerbil_context_hidden(c, 0, 2) == NULL && gerbil_context_logits(c, 12) == NULL);
    /* the last layer's tap is the hidden state the logits come from: norm(h) W^T in double */
    const struct gb_tensor *nw = st_checkpoint_find(&ck, "model.norm.weight"), *hw = st_checkpoint_find(&ck, "lm_head.weight");
    CHECK(nw && hw && nw->type == GB_TYPE_F32 && hw->type == GB_TYPE_F32);
    for (int i = 0; nw && hw && i < 6; i++) {
        const float *h = gerbil_context_hidden(c, i, 1), *lg = gerbil_context_logits(c, i);
        double ss = 0, worst = 0;
        for (int j = 0; j < D; j++) ss += (double)h[j] * h[j];
        const double inv = 1.0 / sqrt(ss / D + 1e-5);
        for (int v = 0; v < V; v++) {
            double acc = 0;
            for (int j = 0; j < D; j++) acc += h[j] * inv * ((const float *)nw->data)[j] * ((const float *)hw->data)[(size_t)v * D + j];
            worst = fmax(worst, fabs(acc - lg[v]));
        }
        CHECKF(worst < 1e-4, "row %d: norm(last tap) W^T is %g from its logits", i, worst);
    }
    gerbil_batch noemb = {.n_rows = 1, .tokens = (int32_t[]){GERBIL_TOKEN_EMBD}, .seq = &s0};
    CHECK(gerbil_context_eval(c, &noemb) == GERBIL_ERR_INVALID_ARG);
    st_checkpoint_close(&ck);
    free(emb); free(e2);
    gerbil_context_free(c);
    gerbil_model_free(m);
}

/* Two contexts of one model evaluated from two threads at once: each gets what it gets
 * alone (their evals take turns on the model's backend). */
struct worker_arg {
    gerbil_model_t m;
    const int32_t *tok;
    int n;
    float *out; /* [n][V]: one token per eval after a prompt of n / 2 */
    int rc;
};

static void *worker(void *p) {
    struct worker_arg *w = p;
    const int V = gerbil_model_n_vocab(w->m);
    gerbil_session_params sp = gerbil_session_default_params();
    sp.n_ctx = w->n + 8;
    gerbil_session_t s;
    w->rc = gerbil_session_new(w->m, &sp, &s) != GERBIL_OK;
    for (int rep = 0; rep < 20 && !w->rc; rep++) {
        gerbil_session_reset(s);
        w->rc |= gerbil_session_eval(s, w->tok, w->n / 2, w->out, 1) != GERBIL_OK;
        for (int t = w->n / 2; t < w->n && !w->rc; t++)
            w->rc |= gerbil_session_eval(s, w->tok + t, 1, w->out + (size_t)t * V, 0) != GERBIL_OK;
    }
    if (!w->rc) gerbil_session_free(s);
    return NULL;
}

static void test_threads(void) {
    gerbil_model_t m = load("tests/fixtures/qwen35-f32", 2);
    if (!m) return;
    const int V = gerbil_model_n_vocab(m), n = 24;
    int32_t tok[2][24];
    for (int i = 0; i < n; i++) { tok[0][i] = (int32_t)(3 + i * 11 % (V - 3)); tok[1][i] = (int32_t)(5 + i * 29 % (V - 5)); }
    struct worker_arg a[2], solo[2];
    for (int k = 0; k < 2; k++) {
        a[k] = (struct worker_arg){.m = m, .tok = tok[k], .n = n, .out = malloc(sizeof(float) * V * n)};
        solo[k] = a[k];
        solo[k].out = malloc(sizeof(float) * V * n);
        worker(&solo[k]);
    }
    pthread_t th[2];
    for (int k = 0; k < 2; k++) CHECK(pthread_create(&th[k], NULL, worker, &a[k]) == 0);
    for (int k = 0; k < 2; k++) pthread_join(th[k], NULL);
    for (int k = 0; k < 2; k++) {
        CHECKF(!a[k].rc && !solo[k].rc, "thread %d: an eval failed", k);
        CHECKF(!memcmp(a[k].out, solo[k].out, sizeof(float) * V * n), "thread %d: results differ from a run alone", k);
        free(a[k].out);
        free(solo[k].out);
    }
    gerbil_model_free(m);
}

int main(int argc, char **argv) {
    rng = argc > 1 ? strtoull(argv[1], NULL, 0) : (unsigned long long)time(NULL) * 2654435761ULL | 1;
    test_backend = getenv("GERBIL_TEST_BACKEND");
    if (test_backend && !*test_backend) test_backend = NULL;
    if (test_backend && !strncmp(test_backend, "cuda", 4) && gerbil_gpu_count() == 0)
        SKIP("GERBIL_TEST_BACKEND=%s: no CUDA device in this build or machine", test_backend);
    printf("test_batch: seed %llu (rerun with this argument to reproduce)%s%s\n", rng,
           test_backend ? ", backend " : "", test_backend ? test_backend : "");
    char tmpl[] = "/tmp/gerbil-test-batch-XXXXXX";
    tmpdir = mkdtemp(tmpl);
    for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++) {
        const struct fixture *fx = &fixtures[i];
        for (int threads = 1; threads <= 2; threads++) {
            test_model(fx, threads, GERBIL_KV_F16, threads == 1 ? 6 : 16);
            if (threads == 2) test_model(fx, threads, GERBIL_KV_F32, 5);
        }
    }
    test_sequences("llama-f32", 0);
    test_sequences("gemma3-f32", 0);
    test_sequences("qwen35-f32", 1);
    test_sequences("qwen3next-f32", 1);
    test_sequences("lfm2-f32", 1);
    test_sequences("gemma4-f32", 0);
    test_embd_and_taps();
    test_threads();
    if (tmpdir) {
        char cmd[256];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    }
    return test_done();
}
