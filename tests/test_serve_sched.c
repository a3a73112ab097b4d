/* The scheduler of gerbil serve (src/serve/sched.c) on real models: stories260K (Llama,
 * f32) and a random tiny hybrid (Gated DeltaNet + attention, made by bench_make_model):
 *
 *  - batch invariance: 8 greedy requests with different prompts submitted together give
 *    exactly the tokens each gives alone; short prompts also equal gerbil_generate's;
 *  - chunk budget: no step has more rows than --batch, and a long prompt's prefill
 *    interleaves with the decodes of the others (they keep getting tokens);
 *  - preemption and recompute: a KV pool too small for all requests at once preempts the
 *    newest and recomputes it later, and every result still equals its solo run;
 *  - cancellation: a cancelled request ends within a step and its blocks are free;
 *  - queue limits: requests beyond free sequences + --queue are refused;
 *  - prefix cache: a second request sharing whole chunks attaches them (cached tokens
 *    counted), returns what a cold run returns, and LRU eviction makes room when blocks
 *    run short; hashes chain (same block tokens after a different prefix differ);
 *  - a second chat turn (prompt = the first's + more) reuses the first's whole chunks and
 *    answers as a cold run: for the hybrid through the state snapshot at the boundary;
 *  - the same on the golden fixtures: Qwen3, Qwen3.5, Qwen3-Next, Gemma 3, LFM2, and GGUF
 *    Q4_K(_M) with 64-row chunks (above the prefill GEMM threshold);
 *  - n > 1 choices share the prompt (one prefill) and choice i equals a single-choice
 *    request with seed + i; stop strings end a choice with finish stop. */
#include "gerbil.h"
#include "serve/sched.h"
#include "test.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static gerbil_model_t model;
static gerbil_tokenizer_t tok;
static int V;

static struct sched_params base_params(void) {
    return (struct sched_params){.n_parallel = 8, .n_queue = 64, .n_ctx_seq = 256, .n_kv = 8 * 256, .n_batch = 128,
                                 .chunk = 16, .prefix_cache = 1, .kv_type = GERBIL_KV_F16};
}

static struct srv_params greedy(int max_tokens) {
    struct srv_params p = {0};
    p.temperature = 0;
    p.top_p = 1;
    p.repetition_penalty = 1;
    p.max_tokens = max_tokens;
    p.n = 1;
    p.cache_prompt = 1;
    return p;
}

static void wait_done(struct sched *s, struct srv_req *r) {
    pthread_mutex_lock(&s->mu);
    while (r->state != SRV_DONE) sched_wait(s, r, 100);
    pthread_mutex_unlock(&s->mu);
}

/* Run prompt alone on a fresh scheduler of params sp; returns the generated ids (malloc'd). */
static int32_t *solo(const struct sched_params *sp, const int32_t *prompt, int n, const struct srv_params *p0,
                     int choice, int *n_out) {
    struct sched *s;
    CHECK(sched_new(model, tok, sp, &s) == GERBIL_OK);
    CHECK(sched_start(s) == GERBIL_OK);
    struct srv_params p = *p0;
    struct srv_req *r = srv_req_new(prompt, n, &p);
    CHECK(sched_submit(s, r) == 0);
    wait_done(s, r);
    *n_out = r->ch[choice].n_gen;
    int32_t *ids = malloc(sizeof *ids * (size_t)(*n_out + 1));
    memcpy(ids, r->ch[choice].gen, sizeof *ids * (size_t)*n_out);
    sched_release(s, r);
    sched_free(s);
    return ids;
}

static unsigned long long rng = 12345;

static void random_prompt(int32_t *p, int n, int lo) {
    for (int i = 0; i < n; i++) p[i] = lo + (int32_t)(test_rand_u64(&rng) % (unsigned long long)(V - lo));
}

enum { NREQ = 8, MAXP = 96 };

/* 8 requests at once == each alone, under params sp. */
static void invariance(const char *what, const struct sched_params *sp, int max_tokens) {
    int32_t prompts[NREQ][MAXP];
    int lens[NREQ];
    for (int i = 0; i < NREQ; i++) {
        lens[i] = 3 + (i * 13) % 70; /* 3 .. 72 tokens: one to five chunks of 16 */
        random_prompt(prompts[i], lens[i], 3);
        prompts[i][0] = gerbil_model_bos_id(model) >= 0 ? gerbil_model_bos_id(model) : prompts[i][0];
    }
    struct sched *s;
    CHECK(sched_new(model, tok, sp, &s) == GERBIL_OK);
    struct srv_req *r[NREQ];
    struct srv_params p = greedy(max_tokens);
    p.ignore_eos = 1;
    for (int i = 0; i < NREQ; i++) {
        r[i] = srv_req_new(prompts[i], lens[i], &p);
        CHECK(sched_submit(s, r[i]) == 0);
    }
    CHECK(sched_start(s) == GERBIL_OK);
    for (int i = 0; i < NREQ; i++) wait_done(s, r[i]);
    int same = 0;
    for (int i = 0; i < NREQ; i++) {
        int n;
        int32_t *alone = solo(sp, prompts[i], lens[i], &p, 0, &n);
        const int ok = n == r[i]->ch[0].n_gen && !memcmp(alone, r[i]->ch[0].gen, sizeof *alone * (size_t)n);
        CHECKF(ok, "%s: request %d (%d prompt tokens): batched differs from alone", what, i, lens[i]);
        CHECKF(r[i]->ch[0].finish == SRV_FIN_LENGTH && n == max_tokens, "%s: request %d finish %d n %d", what, i,
               r[i]->ch[0].finish, n);
        same += ok;
        free(alone);
    }
    printf("%s: %d of %d batched requests equal their solo runs; %llu steps, most rows %d, %llu preemptions\n",
           what, same, NREQ, (unsigned long long)s->m.steps, s->m.max_step_rows,
           (unsigned long long)s->m.preemptions);
    CHECKF(s->m.max_step_rows <= sp->n_batch, "%s: a step had %d rows > budget %d", what, s->m.max_step_rows,
           sp->n_batch);
    if (sp->n_kv < NREQ * (MAXP + max_tokens)) CHECKF(s->m.preemptions > 0, "%s: expected preemptions", what);
    int cached = 0, ev = 0;
    if (s->pc) prefix_counts(s->pc, s->ctx, &cached, &ev);
    CHECKF(gerbil_context_n_free_blocks(s->ctx) + cached == gerbil_context_n_blocks(s->ctx),
           "%s: blocks leaked: %d free + %d cached of %d", what, gerbil_context_n_free_blocks(s->ctx), cached,
           gerbil_context_n_blocks(s->ctx));
    for (int i = 0; i < NREQ; i++) sched_release(s, r[i]);
    sched_free(s);
}

/* Short prompts (one chunk) through the scheduler equal gerbil_generate on a session. */
static void against_generate(void) {
    struct sched_params sp = base_params();
    for (int t = 0; t < 3; t++) {
        int32_t prompt[12];
        const int n = 5 + t * 3;
        random_prompt(prompt, n, 3);
        prompt[0] = 1;
        struct srv_params p = greedy(30);
        p.ignore_eos = 1;
        int ng;
        int32_t *ids = solo(&sp, prompt, n, &p, 0, &ng);
        gerbil_session_t sess;
        gerbil_session_params ssp = gerbil_session_default_params();
        ssp.n_ctx = 256;
        CHECK(gerbil_session_new(model, &ssp, &sess) == GERBIL_OK);
        gerbil_sampler_params smp = gerbil_sampler_default_params();
        smp.temperature = 0;
        gerbil_sampler_t sm;
        CHECK(gerbil_sampler_new(&smp, V, &sm) == GERBIL_OK);
        gerbil_generate_params gp = gerbil_generate_default_params();
        gp.max_tokens = 30;
        gp.ignore_eos = 1;
        int32_t out[30];
        gerbil_generate_result res;
        CHECK(gerbil_generate(sess, sm, prompt, n, &gp, out, &res) == GERBIL_OK);
        CHECKF(res.n_generated == ng && !memcmp(out, ids, sizeof *out * (size_t)ng),
               "prompt %d: scheduler differs from gerbil_generate", t);
        gerbil_sampler_free(sm);
        gerbil_session_free(sess);
        free(ids);
    }
}

static void cancellation(void) {
    struct sched_params sp = base_params();
    struct sched *s;
    CHECK(sched_new(model, tok, &sp, &s) == GERBIL_OK);
    CHECK(sched_start(s) == GERBIL_OK);
    int32_t prompt[20];
    random_prompt(prompt, 20, 3);
    struct srv_params p = greedy(230);
    p.ignore_eos = 1;
    struct srv_req *r = srv_req_new(prompt, 20, &p);
    CHECK(sched_submit(s, r) == 0);
    pthread_mutex_lock(&s->mu);
    while (r->ch[0].n_gen < 5 && r->state != SRV_DONE) sched_wait(s, r, 10);
    pthread_mutex_unlock(&s->mu);
    sched_cancel(s, r);
    wait_done(s, r);
    CHECKF(r->ch[0].finish == SRV_FIN_CANCELLED, "finish %d", r->ch[0].finish);
    CHECKF(r->ch[0].n_gen < 230, "cancelled after %d tokens", r->ch[0].n_gen);
    int cached, ev;
    prefix_counts(s->pc, s->ctx, &cached, &ev);
    CHECKF(gerbil_context_n_free_blocks(s->ctx) + cached == gerbil_context_n_blocks(s->ctx),
           "blocks still held after cancel: %d free + %d cached of %d", gerbil_context_n_free_blocks(s->ctx), cached,
           gerbil_context_n_blocks(s->ctx));
    sched_release(s, r);
    sched_free(s);
}

static void queue_limits(void) {
    struct sched_params sp = base_params();
    sp.n_parallel = 1;
    sp.n_queue = 1;
    struct sched *s;
    CHECK(sched_new(model, tok, &sp, &s) == GERBIL_OK);
    int32_t prompt[4] = {1, 50, 60, 70};
    struct srv_params p = greedy(4);
    struct srv_req *r[3];
    int rc[3];
    for (int i = 0; i < 3; i++) {
        r[i] = srv_req_new(prompt, 4, &p);
        rc[i] = sched_submit(s, r[i]);
    }
    CHECKF(rc[0] == 0 && rc[1] == 0 && rc[2] == -1, "queue: %d %d %d (one slot + one waiting, then refused)", rc[0],
           rc[1], rc[2]);
    CHECK(sched_start(s) == GERBIL_OK);
    wait_done(s, r[0]);
    wait_done(s, r[1]);
    CHECK(r[0]->ch[0].n_gen == 4 && r[1]->ch[0].n_gen == 4);
    sched_shutdown(s);
    CHECK(sched_submit(s, r[2]) == -2);
    for (int i = 0; i < 3; i++) sched_release(s, r[i]);
    sched_free(s);
}

static void prefix_cache(void) {
    /* hashes chain: the same 16 tokens after different parents differ */
    int32_t blk[16];
    for (int i = 0; i < 16; i++) blk[i] = 7 + i;
    CHECK(prefix_hash(0, blk) != prefix_hash(prefix_hash(0, blk), blk));
    struct sched_params sp = base_params();
    struct sched *s;
    CHECK(sched_new(model, tok, &sp, &s) == GERBIL_OK);
    CHECK(sched_start(s) == GERBIL_OK);
    int32_t a[60], b[60];
    random_prompt(a, 60, 3);
    a[0] = 1;
    memcpy(b, a, sizeof a);
    random_prompt(b + 40, 20, 3); /* shares a's first 40 tokens: two whole chunks of 16 */
    struct srv_params p = greedy(20);
    p.ignore_eos = 1;
    struct srv_req *ra = srv_req_new(a, 60, &p);
    CHECK(sched_submit(s, ra) == 0);
    wait_done(s, ra);
    CHECK(ra->n_cached == 0);
    struct srv_req *rb = srv_req_new(b, 60, &p);
    CHECK(sched_submit(s, rb) == 0);
    wait_done(s, rb);
    CHECKF(rb->n_cached == 32, "second request took %d cached tokens, want 32", rb->n_cached);
    struct sched_params cold = sp;
    cold.prefix_cache = 0;
    int n;
    int32_t *ref = solo(&cold, b, 60, &p, 0, &n);
    CHECKF(n == rb->ch[0].n_gen && !memcmp(ref, rb->ch[0].gen, sizeof *ref * (size_t)n),
           "a cached prefix changed the answer");
    free(ref);
    /* the same prompt again: all but the last chunk boundary (48 of 60) */
    struct srv_req *rc = srv_req_new(a, 60, &p);
    CHECK(sched_submit(s, rc) == 0);
    wait_done(s, rc);
    CHECKF(rc->n_cached == 48, "repeat took %d cached tokens, want 48", rc->n_cached);
    CHECK(rc->ch[0].n_gen == ra->ch[0].n_gen && !memcmp(rc->ch[0].gen, ra->ch[0].gen, sizeof(int32_t) * 20));
    printf("prefix cache: %llu of %llu blocks hit\n", (unsigned long long)s->m.prefix_hits,
           (unsigned long long)s->m.prefix_queries);
    sched_release(s, ra);
    sched_release(s, rb);
    sched_release(s, rc);
    sched_free(s);

    /* eviction: a pool of 256 positions (16 blocks) and prompts that fill it with cache */
    sp.n_kv = 256;
    sp.n_parallel = 2;
    CHECK(sched_new(model, tok, &sp, &s) == GERBIL_OK);
    CHECK(sched_start(s) == GERBIL_OK);
    int ok = 1;
    for (int t = 0; t < 8; t++) {
        int32_t q[100];
        random_prompt(q, 100, 3);
        struct srv_req *r = srv_req_new(q, 100, &p);
        CHECK(sched_submit(s, r) == 0);
        wait_done(s, r);
        ok &= r->ch[0].finish == SRV_FIN_LENGTH && r->ch[0].n_gen == 20;
        sched_release(s, r);
    }
    int cached, ev;
    prefix_counts(s->pc, s->ctx, &cached, &ev);
    CHECKF(ok, "requests failed when the cache filled the pool");
    CHECKF(cached > 0 && cached <= 16, "cached %d blocks", cached);
    sched_free(s);
}

/* A second chat turn: its prompt is the first turn's prompt + more. It attaches the first
 * turn's whole chunks (for a hybrid: with the state snapshot taken at the last of them) and
 * answers exactly as a cold run. */
static void second_turn(const char *what) {
    struct sched_params sp = base_params();
    struct sched *s;
    CHECK(sched_new(model, tok, &sp, &s) == GERBIL_OK);
    CHECK(sched_start(s) == GERBIL_OK);
    int32_t t1[60], t2[90];
    random_prompt(t1, 60, 3);
    memcpy(t2, t1, sizeof t1);
    random_prompt(t2 + 60, 30, 3);
    struct srv_params p = greedy(16);
    p.ignore_eos = 1;
    struct srv_req *a = srv_req_new(t1, 60, &p);
    CHECK(sched_submit(s, a) == 0);
    wait_done(s, a);
    struct srv_req *b = srv_req_new(t2, 90, &p);
    CHECK(sched_submit(s, b) == 0);
    wait_done(s, b);
    CHECKF(b->n_cached == 48, "%s: the second turn took %d cached tokens, want 48", what, b->n_cached);
    struct sched_params cold = sp;
    cold.prefix_cache = 0;
    int n;
    int32_t *ref = solo(&cold, t2, 90, &p, 0, &n);
    CHECKF(n == b->ch[0].n_gen && !memcmp(ref, b->ch[0].gen, sizeof *ref * (size_t)n),
           "%s: the cached second turn differs from a cold run", what);
    free(ref);
    printf("%s: second turn reused %d of %d prompt tokens (%llu state snapshots)\n", what, b->n_cached, 90,
           (unsigned long long)s->m.snapshots);
    sched_release(s, a);
    sched_release(s, b);
    sched_free(s);
}

static void choices_and_stops(void) {
    struct sched_params sp = base_params();
    int32_t prompt[24];
    random_prompt(prompt, 24, 3);
    prompt[0] = 1;
    struct srv_params p = greedy(25);
    p.temperature = 0.9f;
    p.seed = 77;
    p.n = 3;
    p.ignore_eos = 1;
    struct sched *s;
    CHECK(sched_new(model, tok, &sp, &s) == GERBIL_OK);
    CHECK(sched_start(s) == GERBIL_OK);
    struct srv_req *r = srv_req_new(prompt, 24, &p);
    CHECK(sched_submit(s, r) == 0);
    wait_done(s, r);
    CHECKF(s->m.prefill_tokens == 24, "3 choices read the prompt %llu tokens (want once: 24)",
           (unsigned long long)s->m.prefill_tokens);
    for (int i = 0; i < 3; i++) {
        struct srv_params q = p;
        q.n = 1;
        q.seed = 77 + (uint64_t)i;
        int n;
        int32_t *ids = solo(&sp, prompt, 24, &q, 0, &n);
        CHECKF(n == r->ch[i].n_gen && !memcmp(ids, r->ch[i].gen, sizeof *ids * (size_t)n),
               "choice %d differs from a single request with seed + %d", i, i);
        free(ids);
    }
    CHECK(memcmp(r->ch[0].gen, r->ch[1].gen, sizeof(int32_t) * 25) != 0);
    sched_release(s, r);
    if (tok) {
        int32_t *ids;
        int n;
        CHECK(gerbil_tokenize(tok, "Once upon a time", 16, 1, &ids, &n) == GERBIL_OK);
        struct srv_params g = greedy(60);
        g.stops[0] = strdup(" girl");
        g.n_stops = 1;
        struct srv_req *rs = srv_req_new(ids, n, &g);
        CHECK(sched_submit(s, rs) == 0);
        wait_done(s, rs);
        CHECKF(rs->ch[0].finish == SRV_FIN_STOP && rs->ch[0].text && !strstr(rs->ch[0].text, "girl"),
               "stop string: finish %d text \"%s\"", rs->ch[0].finish, rs->ch[0].text ? rs->ch[0].text : "");
        printf("stop \" girl\": \"%s\"\n", rs->ch[0].text ? rs->ch[0].text : "");
        sched_release(s, rs);
        free(ids);
    }
    sched_free(s);
}

/* A long prompt arriving while others decode: its chunks share steps with their decode
 * rows, so every step stays within the budget and the others keep getting tokens. */
static void chunk_budget(void) {
    struct sched_params sp = base_params();
    sp.n_batch = 24; /* one chunk of 16 + up to 8 decode rows */
    struct sched *s;
    CHECK(sched_new(model, tok, &sp, &s) == GERBIL_OK);
    CHECK(sched_start(s) == GERBIL_OK);
    int32_t shortp[4] = {1, 40, 41, 42}, longp[200];
    random_prompt(longp, 200, 3);
    struct srv_params p = greedy(40);
    p.ignore_eos = 1;
    struct srv_req *a = srv_req_new(shortp, 4, &p);
    CHECK(sched_submit(s, a) == 0);
    pthread_mutex_lock(&s->mu);
    while (a->ch[0].n_gen < 2) sched_wait(s, a, 10);
    pthread_mutex_unlock(&s->mu);
    struct srv_req *b = srv_req_new(longp, 200, &p);
    CHECK(sched_submit(s, b) == 0);
    pthread_mutex_lock(&s->mu);
    const int a_before = a->ch[0].n_gen;
    while (b->ch[0].n_gen == 0 && b->state != SRV_DONE) sched_wait(s, b, 5);
    const int a_during = a->ch[0].n_gen - a_before; /* tokens a got while b read its 13 chunks */
    pthread_mutex_unlock(&s->mu);
    wait_done(s, a);
    wait_done(s, b);
    CHECKF(a_during >= 10 || a->ch[0].n_gen == 40, "the short request got %d tokens during a 13-chunk prefill",
           a_during);
    CHECKF(s->m.max_step_rows <= 24, "a step had %d rows", s->m.max_step_rows);
    sched_release(s, a);
    sched_release(s, b);
    sched_free(s);
}

static int load(const char *path) {
    gerbil_model_params mp = gerbil_model_default_params();
    mp.n_threads = 2;
    if (gerbil_model_load(path, &mp, &model) != GERBIL_OK) return -1;
    V = gerbil_model_n_vocab(model);
    return 0;
}

int main(void) {
    const char *stories = "../shared/data/models/stories260K/hf";
    struct stat st;
    if (stat(stories, &st) != 0) SKIP("%s not found", stories);
    CHECK(load(stories) == 0);
    CHECK(gerbil_tokenizer_load(stories, &tok) == GERBIL_OK);
    against_generate();
    struct sched_params sp = base_params();
    invariance("stories260K", &sp, 40);
    sp.n_batch = 40; /* tight: prefill chunks wait for room */
    invariance("stories260K, 40-row steps", &sp, 40);
    sp = base_params();
    sp.n_kv = 256; /* 8 requests of up to 72 + 40 positions in 256: preemption */
    sp.n_ctx_seq = 256;
    invariance("stories260K, 256-position pool", &sp, 40);
    chunk_budget();
    cancellation();
    queue_limits();
    prefix_cache();
    second_turn("stories260K");
    choices_and_stops();
    gerbil_tokenizer_free(tok);
    tok = NULL;
    gerbil_model_free(model);

    /* the golden architectures' tiny fixtures (random weights, no tokenizer): Qwen3, Qwen3.5
     * and Qwen3-Next (hybrids), Gemma 3 (sliding window), LFM2 (short convolutions), and a
     * quantized GGUF with 64-row chunks (its prefill GEMM threshold is 48 rows) */
    static const struct { const char *dir; int chunk; } fx[] = {
        {"tests/fixtures/qwen3-f32", 16}, {"tests/fixtures/qwen35-f32", 16}, {"tests/fixtures/qwen3next-f32", 16},
        {"tests/fixtures/gemma3-f32", 16}, {"tests/fixtures/lfm2-f32", 16},
        {"tests/fixtures/qwen3-gguf-q4_k_m", 64}, {"tests/fixtures/llama-gguf-q4_k", 64},
    };
    for (size_t k = 0; k < sizeof fx / sizeof fx[0]; k++) {
        char path[512];
        snprintf(path, sizeof path, "%s", fx[k].dir);
        if (stat(path, &st) != 0) { /* a GGUF fixture is a file inside the folder */
            fprintf(stderr, "%s not found: skipped\n", path);
            continue;
        }
        if (S_ISDIR(st.st_mode)) {
            char g[512];
            snprintf(g, sizeof g, "%.400s/model.gguf", path);
            if (stat(g, &st) == 0) memcpy(path, g, sizeof g);
        }
        if (load(path) != 0) {
            CHECKF(0, "%s: cannot load: %s", path, gerbil_last_error());
            continue;
        }
        sp = base_params();
        sp.chunk = fx[k].chunk;
        invariance(fx[k].dir + 15, &sp, 16);
        if (fx[k].chunk == 16) second_turn(fx[k].dir + 15);
        gerbil_model_free(model);
    }

    /* the hybrid: recurrent state per sequence, snapshots for the prefix cache */
    const char *mk = getenv("GERBIL_MAKE_MODEL");
    if (!mk) {
        fprintf(stderr, "GERBIL_MAKE_MODEL not set: the hybrid part is skipped\n");
        return test_done();
    }
    char dir[] = "/tmp/gerbil-serve-test-XXXXXX", cmd[1024];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(cmd, sizeof cmd, "'%s' '%s/h' --shape tiny-hybrid --dtype f32 >/dev/null 2>&1", mk, dir);
    CHECK(system(cmd) == 0);
    snprintf(cmd, sizeof cmd, "%s/h", dir);
    CHECK(load(cmd) == 0);
    sp = base_params();
    invariance("tiny-hybrid", &sp, 24);
    sp.n_kv = 256;
    invariance("tiny-hybrid, 256-position pool", &sp, 24);
    second_turn("tiny-hybrid");
    gerbil_model_free(model);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
    return test_done();
}
