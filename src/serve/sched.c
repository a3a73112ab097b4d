/* The request scheduler (sched.h). */
#include "serve/sched.h"
#include "base/status.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* ---- requests ---- */

struct srv_grammar *srv_grammar_ref(struct srv_grammar *g) {
    if (g) __atomic_add_fetch(&g->refs, 1, __ATOMIC_ACQ_REL);
    return g;
}

void srv_grammar_release(struct srv_grammar *g) {
    if (!g || __atomic_sub_fetch(&g->refs, 1, __ATOMIC_ACQ_REL)) return;
    gerbil_grammar_free(g->g);
    free(g);
}

void srv_params_free(struct srv_params *p) {
    srv_grammar_release(p->grammar);
    free(p->bias_ids);
    free(p->bias_vals);
    for (int i = 0; i < p->n_stops; i++) free(p->stops[i]);
    memset(p, 0, sizeof *p);
}

struct srv_req *srv_req_new(const int32_t *prompt, int n, const struct srv_params *p) {
    struct srv_req *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->p = *p;
    if (r->p.n < 1) r->p.n = 1;
    r->prompt = malloc((size_t)(n > 0 ? n : 1) * sizeof *r->prompt);
    r->ch = calloc((size_t)r->p.n, sizeof *r->ch);
    if (!r->prompt || !r->ch) {
        free(r->prompt);
        free(r->ch);
        free(r);
        return NULL;
    }
    memcpy(r->prompt, prompt, (size_t)n * sizeof *prompt);
    r->n_prompt = n;
    for (int i = 0; i < r->p.n; i++) {
        r->ch[i].seq = -1;
        r->ch[i].follower = i > 0;
    }
    r->refs = 1;
    pthread_cond_init(&r->cv, NULL);
    return r;
}

static void req_free(struct srv_req *r) {
    for (int i = 0; i < r->p.n; i++) {
        struct srv_choice *c = &r->ch[i];
        gerbil_sampler_free(c->sampler);
        gerbil_detok_free(c->detok);
        gerbil_grammar_state_free(c->gs);
        stop_free(&c->stop);
        free(c->gen);
        free(c->text);
        free(c->lps);
    }
    free(r->ch);
    free(r->prompt);
    srv_params_free(&r->p);
    pthread_cond_destroy(&r->cv);
    free(r);
}

/* with s->mu held */
static void unref_locked(struct srv_req *r) {
    if (--r->refs == 0) req_free(r);
}

void sched_release(struct sched *s, struct srv_req *r) {
    if (!r) return;
    pthread_mutex_lock(&s->mu);
    unref_locked(r);
    pthread_mutex_unlock(&s->mu);
}

void sched_wait(struct sched *s, struct srv_req *r, int timeout_ms) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_sec += timeout_ms / 1000;
    t.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (t.tv_nsec >= 1000000000L) { t.tv_sec++; t.tv_nsec -= 1000000000L; }
    pthread_cond_timedwait(&r->cv, &s->mu, &t);
}

/* ---- the scheduler ---- */

gerbil_status sched_new(gerbil_model_t model, gerbil_tokenizer_t tok, const struct sched_params *p, struct sched **out) {
    *out = NULL;
    if (p->chunk < GERBIL_KV_BLOCK || p->chunk % GERBIL_KV_BLOCK)
        return err_set(GERBIL_ERR_INVALID_ARG, "the prefill chunk (%d) must be a multiple of %d", p->chunk,
                       GERBIL_KV_BLOCK);
    if (p->n_batch < p->chunk)
        return err_set(GERBIL_ERR_INVALID_ARG, "the step budget (%d rows) is below the prefill chunk (%d)", p->n_batch,
                       p->chunk);
    if (p->n_parallel < 1 || p->n_ctx_seq < 2 || p->n_kv < p->n_ctx_seq)
        return err_set(GERBIL_ERR_INVALID_ARG, "bad scheduler sizes: %d sequences, %d positions each, a pool of %d",
                       p->n_parallel, p->n_ctx_seq, p->n_kv);
    struct sched *s = calloc(1, sizeof *s);
    if (!s) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    s->model = model;
    s->tok = tok;
    s->p = *p;
    s->n_vocab = gerbil_model_n_vocab(model);
    s->n_eos = gerbil_model_eos_ids(model, s->eos, 8);
    if (!s->n_eos && tok && gerbil_tokenizer_eos(tok) >= 0) s->eos[s->n_eos++] = gerbil_tokenizer_eos(tok);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work, NULL);
    const char *delay = getenv("GERBIL_SERVE_STEP_DELAY_US");
    if (delay) s->step_delay_us = atoi(delay);
    gerbil_context_params cp = gerbil_context_default_params();
    cp.n_ctx = p->n_kv;
    cp.n_seq_max = p->n_parallel;
    cp.n_batch = p->n_batch;
    cp.kv_type = p->kv_type;
    gerbil_status st = gerbil_context_new(model, &cp, &s->ctx);
    if (st != GERBIL_OK) {
        sched_free(s);
        return st;
    }
    if (gerbil_context_n_batch(s->ctx) < p->n_batch) s->p.n_batch = gerbil_context_n_batch(s->ctx);
    const size_t B = (size_t)s->p.n_batch, V = (size_t)s->n_vocab;
    s->b_tok = malloc(B * sizeof *s->b_tok);
    s->b_seq = malloc(B * sizeof *s->b_seq);
    s->b_logits = malloc(B);
    s->b_ch = malloc(B * sizeof *s->b_ch);
    s->lbuf = malloc(V * sizeof *s->lbuf);
    s->lsm = malloc(V * sizeof *s->lsm);
    s->counts = calloc(V, sizeof *s->counts);
    s->mask = malloc((V + 63) / 64 * sizeof *s->mask);
    s->blk = malloc(((size_t)p->n_kv / GERBIL_KV_BLOCK + 2) * sizeof *s->blk);
    if (p->prefix_cache) s->pc = prefix_new(gerbil_context_n_blocks(s->ctx));
    s->state_bytes = gerbil_context_state_bytes(s->ctx);
    if (p->prefix_cache && s->state_bytes) {
        s->n_snaps = 2 * p->n_parallel < 8 ? 8 : 2 * p->n_parallel;
        s->snaps = calloc((size_t)s->n_snaps, sizeof *s->snaps);
    }
    if (!s->b_tok || !s->b_seq || !s->b_logits || !s->b_ch || !s->lbuf || !s->lsm || !s->counts || !s->mask || !s->blk ||
        (p->prefix_cache && !s->pc) || (s->n_snaps && !s->snaps)) {
        sched_free(s);
        return err_set(GERBIL_ERR_NOMEM, "out of memory");
    }
    *out = s;
    return GERBIL_OK;
}

static void *sched_main(void *arg);

gerbil_status sched_start(struct sched *s) {
    if (pthread_create(&s->thread, NULL, sched_main, s))
        return err_set(GERBIL_ERR_NOMEM, "cannot start the scheduler thread");
    s->started = 1;
    return GERBIL_OK;
}

void sched_shutdown(struct sched *s) {
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_broadcast(&s->work);
    pthread_mutex_unlock(&s->mu);
}

void sched_free(struct sched *s) {
    if (!s) return;
    if (s->started) {
        sched_shutdown(s);
        pthread_join(s->thread, NULL);
    }
    prefix_free(s->pc, s->ctx);
    for (int i = 0; i < s->n_snaps; i++) free(s->snaps[i].state);
    free(s->snaps);
    gerbil_context_free(s->ctx);
    gerbil_grammar_vocab_free(s->gvocab);
    free(s->b_tok);
    free(s->b_seq);
    free(s->b_logits);
    free(s->b_ch);
    free(s->lbuf);
    free(s->lsm);
    free(s->counts);
    free(s->mask);
    free(s->blk);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->work);
    free(s);
}

int sched_submit(struct sched *s, struct srv_req *r) {
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    if (s->stop) rc = -2;
    else if (s->n_queued - (s->p.n_parallel - s->n_running_seqs > 0 ? s->p.n_parallel - s->n_running_seqs : 0) >=
             s->p.n_queue)
        rc = -1; /* more waiting than free sequences + the queue's length */
    else {
        r->id = ++s->next_id;
        r->t_submit = now_s();
        r->state = SRV_QUEUED;
        r->refs++;
        r->next = NULL;
        if (s->queue_tail) s->queue_tail->next = r;
        else s->queue = r;
        s->queue_tail = r;
        s->n_queued++;
        s->m.prompt_tokens += (uint64_t)r->n_prompt;
        pthread_cond_signal(&s->work);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void sched_cancel(struct sched *s, struct srv_req *r) {
    pthread_mutex_lock(&s->mu);
    if (r->state != SRV_DONE) {
        r->cancel = 1;
        pthread_cond_signal(&s->work);
    }
    pthread_mutex_unlock(&s->mu);
}

void sched_counts(struct sched *s, int *running, int *queued, int *kv_free, int *kv_total) {
    pthread_mutex_lock(&s->mu);
    int n = 0;
    for (struct srv_req *r = s->running; r; r = r->next) n++;
    *running = n;
    *queued = s->n_queued;
    *kv_free = gerbil_context_n_free_blocks(s->ctx);
    *kv_total = gerbil_context_n_blocks(s->ctx);
    pthread_mutex_unlock(&s->mu);
}

/* ---- choices ---- */

static int grow(void **p, int *cap, int want, size_t elt) {
    if (want <= *cap) return 0;
    int c = *cap ? *cap * 2 : 64;
    while (c < want) c *= 2;
    void *q = realloc(*p, (size_t)c * elt);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

/* Appends to the choice's text; -1 when out of memory (the caller fails the choice: an
 * answer is never silently cut). */
static int text_add(struct srv_choice *c, const char *t, size_t n) {
    if (!n) return 0;
    if (c->len + n + 1 > c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 256;
        while (cap < c->len + n + 1) cap *= 2;
        char *q = realloc(c->text, cap);
        if (!q) return -1;
        c->text = q;
        c->cap = cap;
    }
    memcpy(c->text + c->len, t, n);
    c->len += n;
    c->text[c->len] = 0;
    return 0;
}

/* The sampler, detokenizer and stop matcher of a choice, made when first admitted. */
static int choice_setup(struct sched *s, struct srv_req *r, int i) {
    struct srv_choice *c = &r->ch[i];
    if (c->sampler) return 0;
    gerbil_sampler_params sp = gerbil_sampler_default_params();
    sp.temperature = r->p.temperature;
    sp.top_k = r->p.top_k;
    sp.top_p = r->p.top_p;
    sp.min_p = r->p.min_p;
    sp.repetition_penalty = 1.0f; /* applied by srv_apply_penalties */
    sp.seed = r->p.seed + (uint64_t)i;
    gerbil_status st = gerbil_sampler_new(&sp, s->n_vocab, &c->sampler);
    if (st == GERBIL_OK && s->tok) {
        st = gerbil_detok_new(s->tok, 1, &c->detok);
        if (st == GERBIL_OK) st = gerbil_detok_prime(c->detok, r->prompt, r->n_prompt);
    }
    if (st == GERBIL_OK && r->p.grammar) st = gerbil_grammar_state_new(r->p.grammar->g, &c->gs);
    if (st == GERBIL_OK && stop_init(&c->stop, (const char *const *)r->p.stops, r->p.n_stops))
        st = err_set(GERBIL_ERR_NOMEM, "out of memory");
    if (st != GERBIL_OK) {
        snprintf(r->err, sizeof r->err, "%s", gerbil_last_error());
        return -1;
    }
    return 0;
}

static void choice_release_seq(struct sched *s, struct srv_choice *c) {
    if (c->seq >= 0) {
        gerbil_seq_free(s->ctx, c->seq);
        s->n_running_seqs--;
    }
    c->seq = -1;
    c->n_eval = 0;
    c->chain = 0;
    c->n_chain = 0;
}

static void choice_finish(struct sched *s, struct srv_choice *c, enum srv_finish f) {
    if (c->finish) return;
    c->finish = f;
    choice_release_seq(s, c);
    c->follower = 0;
}

/* Whatever the detokenizer and the stop matcher still hold, at the end of a choice;
 * -1 when out of memory. */
static int choice_flush(struct srv_choice *c) {
    const char *e;
    size_t n;
    if (c->stopped) return 0;
    if (c->detok && gerbil_detok_flush(c->detok, &e, &n) == GERBIL_OK && n) {
        if (stop_feed(&c->stop, e, n, &e, &n)) {
            c->stopped = 1;
            return text_add(c, e, n);
        }
        if (text_add(c, e, n)) return -1;
    }
    stop_flush(&c->stop, &e, &n);
    return text_add(c, e, n);
}

/* Ends a choice with f once its held-back text is out; out of memory fails it instead. */
static void choice_end(struct sched *s, struct srv_req *r, struct srv_choice *c, enum srv_finish f) {
    if (choice_flush(c)) {
        snprintf(r->err, sizeof r->err, "out of memory for the answer's text");
        f = SRV_FIN_ERROR;
    }
    choice_finish(s, c, f);
}

/* ---- the prefix cache ---- */

/* The snapshot of the state after the prefix with chain hash key (pos positions), or NULL. */
static struct srv_snap *snap_find(struct sched *s, uint64_t key, int pos) {
    for (int i = 0; i < s->n_snaps; i++)
        if (s->snaps[i].state && s->snaps[i].key == key && s->snaps[i].pos == pos) {
            s->snaps[i].tick = ++s->snap_tick;
            return &s->snaps[i];
        }
    return NULL;
}

/* Keep choice c's state after its registered prefix (the least recently used slot goes). */
static void snap_take(struct sched *s, struct srv_choice *c) {
    if (!s->n_snaps || snap_find(s, c->chain, c->n_chain)) return;
    struct srv_snap *v = &s->snaps[0];
    for (int i = 0; i < s->n_snaps; i++) {
        if (!s->snaps[i].state) { v = &s->snaps[i]; break; }
        if (s->snaps[i].tick < v->tick) v = &s->snaps[i];
    }
    if (!v->state && !(v->state = malloc(s->state_bytes))) return;
    if (gerbil_seq_state_save(s->ctx, c->seq, v->state) != GERBIL_OK) return;
    v->key = c->chain;
    v->pos = c->n_chain;
    v->tick = ++s->snap_tick;
    s->m.snapshots++;
}

/* Attach the cached blocks of r's prompt to choice c's empty sequence: whole chunks only,
 * never the last prompt token unless generated tokens follow (their replay gives the
 * logits). */
static void prefix_attach(struct sched *s, struct srv_req *r, struct srv_choice *c) {
    if (!s->pc || !r->p.cache_prompt) return;
    const int C = s->p.chunk, B = GERBIL_KV_BLOCK;
    const int limit = (c->n_gen > 0 ? r->n_prompt : r->n_prompt - 1) / C * C;
    int n = 0, n_ok = 0;
    uint64_t h = 0, h_ok = 0;
    const void *state = NULL;
    for (; (n + 1) * B <= limit; n++) {
        uint64_t key;
        int32_t b = prefix_lookup(s->pc, h, r->prompt + (size_t)n * B, &key);
        if (b < 0) break;
        s->blk[n] = b;
        h = key;
        if (((n + 1) * B) % C) continue;
        if (s->state_bytes) { /* a recurrent model resumes only where its state was kept */
            struct srv_snap *sn = snap_find(s, h, (n + 1) * B);
            if (!sn) continue;
            state = sn->state;
        }
        n_ok = n + 1;
        h_ok = h;
    }
    s->m.prefix_queries += (uint64_t)(limit / B);
    if (!n_ok) return;
    if (s->state_bytes) state = snap_find(s, h_ok, n_ok * B)->state;
    if (gerbil_seq_attach(s->ctx, c->seq, s->blk, n_ok, state) != GERBIL_OK) return;
    s->m.prefix_hits += (uint64_t)n_ok;
    c->n_eval = n_ok * B;
    c->chain = h_ok;
    c->n_chain = c->n_eval;
    if (c->n_eval > r->n_cached) r->n_cached = c->n_eval;
    s->m.cached_tokens += (uint64_t)c->n_eval;
}

/* After a full prompt chunk [end - C, end) of c: keep its blocks. */
static void prefix_register(struct sched *s, struct srv_req *r, struct srv_choice *c, int end) {
    const int C = s->p.chunk, B = GERBIL_KV_BLOCK;
    if (!s->pc || !r->p.cache_prompt || end % C || c->n_chain != end - C) return;
    int n = gerbil_seq_blocks(s->ctx, c->seq, s->blk, gerbil_context_n_blocks(s->ctx));
    if (n < end / B) return;
    for (int j = (end - C) / B; j < end / B; j++) {
        uint64_t key = prefix_hash(c->chain, r->prompt + (size_t)j * B);
        prefix_insert(s->pc, s->ctx, c->chain, r->prompt + (size_t)j * B, s->blk[j]);
        c->chain = key;
    }
    c->n_chain = end;
    /* hybrids: the state at the prompt's last whole-chunk boundary, where a longer prompt
     * with the same start (the next chat turn) picks up */
    if (s->state_bytes && end == r->n_prompt / C * C) snap_take(s, c);
}

/* ---- admission, preemption ---- */

static void running_remove(struct sched *s, struct srv_req *r) {
    for (struct srv_req **pp = &s->running; *pp; pp = &(*pp)->next)
        if (*pp == r) {
            *pp = r->next;
            r->next = NULL;
            return;
        }
}

static void running_append(struct sched *s, struct srv_req *r) {
    struct srv_req **pp = &s->running;
    while (*pp) pp = &(*pp)->next;
    r->next = NULL;
    *pp = r;
}

/* r (removed from its list) is done: every choice finished with f where still open. */
static void req_done(struct sched *s, struct srv_req *r, enum srv_finish f) {
    for (int i = 0; i < r->p.n; i++) {
        if (!r->ch[i].finish) choice_end(s, r, &r->ch[i], f);
    }
    r->state = SRV_DONE;
    s->m.finished++;
    pthread_cond_broadcast(&r->cv);
    unref_locked(r);
}

static int open_choices(const struct srv_req *r) {
    int n = 0;
    for (int i = 0; i < r->p.n; i++) n += !r->ch[i].finish;
    return n;
}

/* Free the newest running request's sequences and put it back at the head of the queue. */
static int preempt_newest(struct sched *s) {
    struct srv_req *last = NULL;
    for (struct srv_req *r = s->running; r; r = r->next) last = r;
    if (!last || last == s->running) return -1; /* the oldest always runs */
    running_remove(s, last);
    for (int i = 0; i < last->p.n; i++) {
        struct srv_choice *c = &last->ch[i];
        choice_release_seq(s, c);
        if (c->n_gen > 0 || i == 0) c->follower = 0;
    }
    last->state = SRV_QUEUED;
    last->n_preempted++;
    last->next = s->queue;
    s->queue = last;
    if (!s->queue_tail) s->queue_tail = last;
    s->n_queued++;
    s->m.preemptions++;
    return 0;
}

static int free_blocks(struct sched *s) {
    int cached = 0, ev = 0;
    if (s->pc) prefix_counts(s->pc, s->ctx, &cached, &ev);
    return gerbil_context_n_free_blocks(s->ctx) + ev;
}

static void make_room(struct sched *s, int need) {
    const int free = gerbil_context_n_free_blocks(s->ctx);
    if (need > free && s->pc) prefix_evict(s->pc, s->ctx, need - free);
}

static void admit(struct sched *s) {
    while (s->queue) {
        struct srv_req *r = s->queue;
        if (r->cancel) {
            s->queue = r->next;
            if (!s->queue) s->queue_tail = NULL;
            s->n_queued--;
            req_done(s, r, SRV_FIN_CANCELLED);
            continue;
        }
        int need_seqs = 0;
        for (int i = 0; i < r->p.n; i++) need_seqs += !r->ch[i].finish;
        if (s->n_running_seqs + need_seqs > s->p.n_parallel) break;
        /* room for its first chunk (+1 block per running sequence for their growth) */
        const int first = r->n_prompt < s->p.chunk ? r->n_prompt : s->p.chunk;
        const int need = (first + GERBIL_KV_BLOCK) / GERBIL_KV_BLOCK + s->n_running_seqs;
        if (s->running && free_blocks(s) < need) break;
        s->queue = r->next;
        if (!s->queue) s->queue_tail = NULL;
        s->n_queued--;
        r->state = SRV_RUNNING;
        r->order = ++s->next_order;
        running_append(s, r);
        int failed = 0;
        for (int i = 0; i < r->p.n && !failed; i++) {
            struct srv_choice *c = &r->ch[i];
            if (c->finish) continue;
            if (choice_setup(s, r, i)) { failed = 1; break; }
            if (c->follower) continue;
            if (gerbil_seq_new(s->ctx, &c->seq) != GERBIL_OK) {
                snprintf(r->err, sizeof r->err, "%s", gerbil_last_error());
                failed = 1;
                break;
            }
            s->n_running_seqs++;
            c->n_eval = 0;
            prefix_attach(s, r, c);
        }
        if (failed) {
            running_remove(s, r);
            req_done(s, r, SRV_FIN_ERROR);
        }
    }
}

/* ---- a step ---- */

/* Rows of one step into the b_* buffers; returns how many. */
static int build_batch(struct sched *s) {
    const int B = s->p.n_batch, C = s->p.chunk;
    int n = 0;
    for (struct srv_req *r = s->running; r; r = r->next)
        for (int i = 0; i < r->p.n && n < B; i++) {
            struct srv_choice *c = &r->ch[i];
            if (c->finish || c->seq < 0 || c->n_eval < r->n_prompt) continue;
            const int k = c->n_eval - r->n_prompt; /* a generated token: evaluated, or replayed */
            s->b_tok[n] = c->gen[k];
            s->b_seq[n] = c->seq;
            s->b_logits[n] = c->n_eval + 1 == r->n_prompt + c->n_gen;
            s->b_ch[n++] = c;
        }
    for (struct srv_req *r = s->running; r; r = r->next)
        for (int i = 0; i < r->p.n; i++) {
            struct srv_choice *c = &r->ch[i];
            if (c->finish || c->seq < 0 || c->n_eval >= r->n_prompt) continue;
            int end = (c->n_eval / C + 1) * C;
            if (end > r->n_prompt) end = r->n_prompt;
            const int len = end - c->n_eval;
            if (n + len > B) continue;
            for (int j = 0; j < len; j++) {
                s->b_tok[n] = r->prompt[c->n_eval + j];
                s->b_seq[n] = c->seq;
                s->b_logits[n] = j == len - 1 && end == r->n_prompt && c->n_gen == 0;
                s->b_ch[n++] = c;
            }
        }
    return n;
}

/* Blocks the step's rows take (an upper bound: shared blocks copied by each). */
static int batch_blocks(struct sched *s, int n) {
    int need = 0;
    for (int i = 0; i < n;) {
        int j = i;
        while (j < n && s->b_ch[j] == s->b_ch[i]) j++;
        need += gerbil_seq_blocks_needed(s->ctx, s->b_seq[i], j - i);
        i = j;
    }
    return need;
}

static struct srv_req *req_of(struct sched *s, const struct srv_choice *c) {
    for (struct srv_req *r = s->running; r; r = r->next)
        if (c >= r->ch && c < r->ch + r->p.n) return r;
    return NULL;
}

static int is_eos(const struct sched *s, int32_t id) {
    for (int i = 0; i < s->n_eos; i++)
        if (s->eos[i] == id) return 1;
    return 0;
}

/* Sample choice c's next token from logits and deliver it. */
static void sample(struct sched *s, struct srv_req *r, struct srv_choice *c, const float *logits, double t) {
    const int V = s->n_vocab;
    memcpy(s->lbuf, logits, (size_t)V * sizeof *s->lbuf);
    srv_apply_penalties(s->lbuf, V, &r->p, r->prompt, r->n_prompt, c->gen, c->n_gen, s->counts);
    int32_t forced = -1;
    if (c->gs) {
        /* the grammar's mask, as gerbil_generate applies it: -inf outside it (EOS only where
         * the grammar may end); a token that is the only one allowed is taken unsampled */
        const double t0 = now_s();
        gerbil_status gst = gerbil_grammar_mask(c->gs, s->mask);
        s->m.mask_s += now_s() - t0;
        s->m.masks++;
        if (gst != GERBIL_OK) {
            snprintf(r->err, sizeof r->err, "the grammar failed: %s", gerbil_last_error());
            choice_finish(s, c, SRV_FIN_ERROR);
            return;
        }
        int n_allowed = 0;
        for (int w = 0, W = (V + 63) / 64; w < W && n_allowed < 2; w++)
            if (s->mask[w]) {
                n_allowed += (s->mask[w] & (s->mask[w] - 1)) ? 2 : 1;
                forced = w * 64 + __builtin_ctzll(s->mask[w]);
            }
        if (n_allowed == 0) { /* a dead end: nothing can follow */
            choice_end(s, r, c, SRV_FIN_STOP);
            return;
        }
        if (n_allowed > 1) forced = -1;
        gerbil_sampler_apply_mask(s->lbuf, V, s->mask);
    }
    struct srv_logprob lp;
    if (r->p.logprobs) srv_logprobs(s->lbuf, V, s->lsm, -1, r->p.top_logprobs, &lp);
    const int32_t id = forced >= 0 ? forced : gerbil_sampler_sample(c->sampler, s->lbuf, NULL, 0);
    if (c->gs && gerbil_grammar_accept_token(c->gs, id) != GERBIL_OK) {
        snprintf(r->err, sizeof r->err, "the grammar rejected token %d: %s", (int)id, gerbil_last_error());
        choice_finish(s, c, SRV_FIN_ERROR);
        return;
    }
    if (grow((void **)&c->gen, &c->cap_gen, c->n_gen + 1, sizeof *c->gen)) {
        snprintf(r->err, sizeof r->err, "out of memory");
        choice_finish(s, c, SRV_FIN_ERROR);
        return;
    }
    if (r->p.logprobs) {
        int cap = c->cap_gen;
        struct srv_logprob *q = realloc(c->lps, (size_t)cap * sizeof *q);
        if (!q) {
            snprintf(r->err, sizeof r->err, "out of memory");
            choice_finish(s, c, SRV_FIN_ERROR);
            return;
        }
        c->lps = q;
        lp.id = id;
        lp.lp = s->lsm[id];
        c->lps[c->n_gen] = lp;
    }
    c->gen[c->n_gen++] = id;
    s->m.gen_tokens++;
    if (!r->t_first) {
        r->t_first = t;
        srv_hist_add(&s->m.ttft, t - r->t_submit);
    } else if (c->t_last > 0) {
        srv_hist_add(&s->m.itl, t - c->t_last);
    }
    c->t_last = t;
    if ((!r->p.ignore_eos || c->gs) && is_eos(s, id)) { /* under a grammar EOS is allowed only at its end */
        choice_end(s, r, c, SRV_FIN_STOP);
        return;
    }
    if (c->detok && !c->stopped) {
        const char *piece, *e;
        size_t n, ne;
        if (gerbil_detok_push(c->detok, id, &piece, &n) != GERBIL_OK) {
            snprintf(r->err, sizeof r->err, "detokenizing the answer failed: %s", gerbil_last_error());
            choice_finish(s, c, SRV_FIN_ERROR);
            return;
        }
        int hit = stop_feed(&c->stop, piece, n, &e, &ne);
        if (text_add(c, e, ne)) {
            snprintf(r->err, sizeof r->err, "out of memory for the answer's text");
            choice_finish(s, c, SRV_FIN_ERROR);
            return;
        }
        if (hit) {
            c->stopped = 1;
            choice_finish(s, c, SRV_FIN_STOP);
            return;
        }
    }
    if (c->n_gen >= r->p.max_tokens || r->n_prompt + c->n_gen >= s->p.n_ctx_seq) {
        choice_end(s, r, c, SRV_FIN_LENGTH);
    }
}

/* Outputs of the step of n rows: evaluated counts, cache registration, forks, samples. */
static void deliver(struct sched *s, int n) {
    const double t = now_s();
    int out = 0;
    for (int i = 0; i < n;) {
        int j = i;
        while (j < n && s->b_ch[j] == s->b_ch[i]) j++;
        struct srv_choice *c = s->b_ch[i];
        struct srv_req *r = req_of(s, c);
        const int was = c->n_eval;
        c->n_eval += j - i;
        if (was < r->n_prompt) {
            s->m.prefill_tokens += (uint64_t)(j - i);
            if (j - i == s->p.chunk) prefix_register(s, r, c, c->n_eval);
        }
        const int want = s->b_logits[j - 1];
        for (int k = i; k < j - 1; k++) out += s->b_logits[k];
        if (want) {
            const float *lg = gerbil_context_logits(s->ctx, out++);
            if (c == &r->ch[0] && c->n_eval == r->n_prompt && c->n_gen == 0) {
                /* choice 0 read the prompt: the others fork it and sample the same logits */
                for (int f = 1; f < r->p.n; f++) {
                    struct srv_choice *o = &r->ch[f];
                    if (!o->follower || o->finish) continue;
                    if (gerbil_seq_fork(s->ctx, c->seq, &o->seq) != GERBIL_OK) {
                        o->seq = -1;
                        o->follower = 0; /* it reads the prompt itself next step */
                        if (gerbil_seq_new(s->ctx, &o->seq) == GERBIL_OK) s->n_running_seqs++;
                        else o->seq = -1;
                        continue;
                    }
                    s->n_running_seqs++;
                    o->follower = 0;
                    o->n_eval = r->n_prompt;
                    sample(s, r, o, lg, t);
                }
            }
            if (lg) sample(s, r, c, lg, t);
        }
        i = j;
    }
    /* requests whose choices all finished leave now */
    for (struct srv_req *r = s->running, *next; r; r = next) {
        next = r->next;
        pthread_cond_broadcast(&r->cv);
        if (!open_choices(r)) {
            running_remove(s, r);
            req_done(s, r, SRV_FIN_STOP);
        }
    }
}

static void fail_all_running(struct sched *s, const char *why) {
    while (s->running) {
        struct srv_req *r = s->running;
        running_remove(s, r);
        snprintf(r->err, sizeof r->err, "%s", why);
        req_done(s, r, SRV_FIN_ERROR);
    }
}

static void *sched_main(void *arg) {
    struct sched *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        if (s->stop) {
            while (s->running) {
                struct srv_req *r = s->running;
                running_remove(s, r);
                req_done(s, r, SRV_FIN_CANCELLED);
            }
            while (s->queue) {
                struct srv_req *r = s->queue;
                s->queue = r->next;
                s->n_queued--;
                req_done(s, r, SRV_FIN_CANCELLED);
            }
            s->queue_tail = NULL;
            break;
        }
        for (struct srv_req *r = s->running, *next; r; r = next) {
            next = r->next;
            if (r->cancel) {
                running_remove(s, r);
                req_done(s, r, SRV_FIN_CANCELLED);
            }
        }
        admit(s);
        if (!s->running) {
            pthread_cond_wait(&s->work, &s->mu);
            continue;
        }
        int n = build_batch(s), need = batch_blocks(s, n);
        make_room(s, need);
        while (need > gerbil_context_n_free_blocks(s->ctx) && !preempt_newest(s)) {
            n = build_batch(s);
            need = batch_blocks(s, n);
            make_room(s, need);
        }
        if (need > gerbil_context_n_free_blocks(s->ctx) || n == 0) {
            /* the oldest request alone does not fit the pool (several choices of a long
             * context): it cannot finish */
            struct srv_req *r = s->running;
            running_remove(s, r);
            snprintf(r->err, sizeof r->err, "the KV cache (%d blocks of %d positions) cannot hold this request",
                     gerbil_context_n_blocks(s->ctx), GERBIL_KV_BLOCK);
            req_done(s, r, SRV_FIN_ERROR);
            continue;
        }
        if (n > s->m.max_step_rows) s->m.max_step_rows = n;
        const gerbil_batch b = {.n_rows = n, .tokens = s->b_tok, .seq = s->b_seq, .logits = s->b_logits};
        pthread_mutex_unlock(&s->mu);
        gerbil_status st = gerbil_context_eval(s->ctx, &b);
        pthread_mutex_lock(&s->mu);
        s->m.steps++;
        if (st == GERBIL_ERR_CONTEXT && s->running && s->running->next) {
            preempt_newest(s);
            continue;
        }
        if (st != GERBIL_OK) {
            char why[256];
            snprintf(why, sizeof why, "evaluation failed: %s", gerbil_last_error());
            fail_all_running(s, why);
            continue;
        }
        deliver(s, n);
        if (s->step_delay_us) {
            pthread_mutex_unlock(&s->mu);
            usleep((useconds_t)s->step_delay_us);
            pthread_mutex_lock(&s->mu);
        }
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ---- metrics ---- */

static const double hist_bounds[SRV_HIST_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15,
                                                     0.25,  0.5,  1.0,   2.5,  5.0,   10.0, 30.0};

void srv_hist_add(struct srv_hist *h, double v) {
    h->n++;
    h->sum += v;
    for (int i = 0; i < SRV_HIST_BUCKETS; i++)
        if (v <= hist_bounds[i]) h->counts[i]++;
}

static void append(char **buf, size_t *len, size_t *cap, const char *fmt, ...) GB_PRINTF(4, 5);
#include <stdarg.h>
static void append(char **buf, size_t *len, size_t *cap, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(*buf ? *buf + *len : NULL, *buf ? *cap - *len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) return;
        if (*buf && *len + (size_t)n < *cap) {
            *len += (size_t)n;
            return;
        }
        size_t c = *cap ? *cap * 2 : 4096;
        while (c < *len + (size_t)n + 1) c *= 2;
        char *q = realloc(*buf, c);
        if (!q) return;
        *buf = q;
        *cap = c;
    }
}

static void hist_text(char **b, size_t *l, size_t *c, const char *name, const char *help, const struct srv_hist *h) {
    append(b, l, c, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (int i = 0; i < SRV_HIST_BUCKETS; i++)
        append(b, l, c, "%s_bucket{le=\"%g\"} %llu\n", name, hist_bounds[i], (unsigned long long)h->counts[i]);
    append(b, l, c, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, (unsigned long long)h->n, name,
           h->sum, name, (unsigned long long)h->n);
}

void sched_metrics_text(struct sched *s, char **b, size_t *l, size_t *c) {
    pthread_mutex_lock(&s->mu);
    int running = 0, cached = 0, ev = 0;
    for (struct srv_req *r = s->running; r; r = r->next) running++;
    if (s->pc) prefix_counts(s->pc, s->ctx, &cached, &ev);
    const int total = gerbil_context_n_blocks(s->ctx), fr = gerbil_context_n_free_blocks(s->ctx);
    const struct srv_metrics *m = &s->m;
#define GAUGE(name, help, type, v) \
    append(b, l, c, "# HELP gerbil_" name " " help "\n# TYPE gerbil_" name " " type "\ngerbil_" name " %llu\n", \
           (unsigned long long)(v))
    GAUGE("requests_running", "Requests being evaluated.", "gauge", running);
    GAUGE("requests_queued", "Requests waiting for a slot.", "gauge", s->n_queued);
    GAUGE("sequences_running", "Sequences (choices) holding KV blocks.", "gauge", s->n_running_seqs);
    GAUGE("kv_blocks_total", "KV cache blocks of 16 positions.", "gauge", total);
    GAUGE("kv_blocks_free", "KV cache blocks no sequence or cache entry holds.", "gauge", fr);
    GAUGE("kv_blocks_used", "KV cache blocks held.", "gauge", total - fr);
    GAUGE("prefix_cache_blocks", "Blocks kept by the prefix cache.", "gauge", cached);
    GAUGE("prefix_cache_evictable_blocks", "Cached blocks no sequence holds.", "gauge", ev);
    GAUGE("prefix_cache_queries_total", "Prompt blocks looked up in the prefix cache.", "counter", m->prefix_queries);
    GAUGE("prefix_cache_hits_total", "Prompt blocks found in the prefix cache.", "counter", m->prefix_hits);
    GAUGE("prompt_tokens_total", "Prompt tokens of submitted requests.", "counter", m->prompt_tokens);
    GAUGE("prompt_tokens_cached_total", "Prompt tokens taken from the prefix cache.", "counter", m->cached_tokens);
    GAUGE("prefill_tokens_total", "Prompt tokens evaluated.", "counter", m->prefill_tokens);
    GAUGE("generation_tokens_total", "Tokens generated.", "counter", m->gen_tokens);
    GAUGE("preemptions_total", "Requests preempted (KV cache full) and recomputed later.", "counter",
          m->preemptions);
    GAUGE("steps_total", "Batched forwards.", "counter", m->steps);
    GAUGE("grammar_masks_total", "Grammar masks computed (constrained tokens).", "counter", m->masks);
    append(b, l, c, "# HELP gerbil_grammar_mask_seconds_total Time spent computing grammar masks.\n"
                    "# TYPE gerbil_grammar_mask_seconds_total counter\ngerbil_grammar_mask_seconds_total %.6f\n",
           m->mask_s);
    GAUGE("state_snapshots_total", "Recurrent-state snapshots taken for the prefix cache (hybrid models).",
          "counter", m->snapshots);
#undef GAUGE
    append(b, l, c, "# HELP gerbil_prefix_cache_hit_rate Prompt blocks found / looked up.\n"
                    "# TYPE gerbil_prefix_cache_hit_rate gauge\ngerbil_prefix_cache_hit_rate %.6f\n",
           m->prefix_queries ? (double)m->prefix_hits / (double)m->prefix_queries : 0.0);
    hist_text(b, l, c, "gerbil_time_to_first_token_seconds", "From arrival to the first generated token.", &m->ttft);
    hist_text(b, l, c, "gerbil_inter_token_latency_seconds", "Between a choice's consecutive tokens.", &m->itl);
    pthread_mutex_unlock(&s->mu);
}
