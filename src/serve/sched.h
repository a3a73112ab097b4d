/* The request scheduler of `gerbil serve`: continuous batching over one context.
 *
 * One thread (sched_run) owns the context. Each step it admits queued requests (FCFS,
 * while sequences and KV blocks allow), builds one batch — a decode row for every
 * sequence that is generating, then whole prefill chunks of the sequences still reading
 * their prompts, under a per-step row budget — evaluates it with gerbil_context_eval,
 * samples, detokenizes and appends each choice's text. A request leaves the batch the
 * step it finishes.
 *
 * Batch invariance: a prompt is cut only at multiples of the chunk size (chunk k covers
 * positions [k*C, (k+1)*C)), one chunk per sequence per step, and every generated token
 * is one row of its own; so every row of a request is evaluated with the same rows of its
 * sequence however busy the server is, and greedy output equals the request alone.
 * Preemption (the KV pool ran out) frees the newest request's sequences and later
 * recomputes it the same way: its prompt in the same chunks, then its generated tokens
 * one row each (replayed, not sampled), so it also continues exactly.
 *
 * Prefix cache: blocks of full prompt chunks (computed as C-row chunks from position 0)
 * are kept under chained hashes of their tokens; a later request whose prompt starts with
 * the same chunks attaches those blocks instead of computing them. Models with recurrent
 * layers also need the state at the attach point: the scheduler snapshots it at the last
 * whole-chunk boundary of every prompt (where a later, longer prompt with the same start —
 * the next turn of a chat — picks up), and attaches only where a snapshot exists.
 * Unreferenced cached blocks are evicted LRU when blocks run short; snapshots are LRU too. */
#ifndef GB_SERVE_SCHED_H
#define GB_SERVE_SCHED_H

#include "gen/stop.h"
#include "gerbil.h"

#include <pthread.h>
#include <stdint.h>

enum { SRV_MAX_STOPS = 16, SRV_MAX_TOP_LOGPROBS = 20 };

enum srv_finish { SRV_FIN_NONE = 0, SRV_FIN_STOP, SRV_FIN_LENGTH, SRV_FIN_CANCELLED, SRV_FIN_ERROR };

/* A compiled grammar shared by requests (the server caches them by source text); the last
 * reference frees it. */
struct srv_grammar {
    gerbil_grammar_t g;
    int refs;              /* atomic */
};
struct srv_grammar *srv_grammar_ref(struct srv_grammar *g);
void srv_grammar_release(struct srv_grammar *g);

struct srv_params {
    float temperature, top_p, min_p;
    int top_k;
    float repetition_penalty, presence_penalty, frequency_penalty;
    uint64_t seed;
    int max_tokens;        /* the most tokens per choice (the caller bounds it by the context) */
    int ignore_eos;
    int n;                 /* choices */
    int logprobs;          /* 1: keep each chosen token's logprob */
    int top_logprobs;      /* alternatives per token (0..SRV_MAX_TOP_LOGPROBS) */
    int cache_prompt;      /* use the prefix cache (default 1) */
    int n_bias;
    int32_t *bias_ids;     /* logit_bias (malloc'd, freed with the request) */
    float *bias_vals;
    char *stops[SRV_MAX_STOPS];
    int n_stops;
    struct srv_grammar *grammar; /* a constraint on every choice (a reference, released with the request), or NULL */
};

/* One chosen token's logprob and its alternatives. */
struct srv_logprob {
    int32_t id;
    float lp;
    int n_top;
    int32_t top_ids[SRV_MAX_TOP_LOGPROBS];
    float top_lp[SRV_MAX_TOP_LOGPROBS];
};

struct srv_choice {
    /* the scheduler's (its thread only) */
    int32_t seq;           /* -1: none */
    int n_eval;            /* tokens of prompt + gen evaluated in seq */
    int follower;          /* waits for choice 0's prompt, then forks it */
    gerbil_sampler_t sampler;
    gerbil_detok_t detok;
    struct stop_matcher stop;
    int stopped;           /* the stop matcher matched: feed it no more */
    gerbil_grammar_state_t gs; /* the choice's grammar state (params.grammar), or NULL */
    uint64_t chain;        /* prefix-cache hash after its registered/attached chunks */
    int n_chain;           /* positions covered by chain */
    /* shared, under sched.mu */
    int32_t *gen;
    int n_gen, cap_gen;
    char *text;            /* the text so far (stop strings cut) */
    size_t len, cap;
    struct srv_logprob *lps; /* [n_gen] when params.logprobs */
    enum srv_finish finish;
    double t_last;         /* when its last token came (inter-token latency) */
};

enum srv_state { SRV_QUEUED = 0, SRV_RUNNING, SRV_DONE };

struct srv_req {
    int refs;              /* under sched.mu */
    uint64_t id;
    int32_t *prompt;
    int n_prompt;
    struct srv_params p;
    struct srv_choice *ch; /* [p.n] */
    enum srv_state state;
    int cancel;            /* asked to stop (client gone, shutdown) */
    int n_cached;          /* prompt tokens taken from the prefix cache */
    uint64_t order;        /* admission order (preemption takes the newest) */
    int n_preempted;
    double t_submit, t_first;
    char err[256];         /* why it failed (SRV_FIN_ERROR) */
    pthread_cond_t cv;     /* signalled on every change (with sched.mu) */
    struct srv_req *next;  /* queue / running list */
};

struct sched_params {
    int n_parallel;        /* sequences at once */
    int n_queue;           /* requests waiting beyond the running ones; more are refused */
    int n_ctx_seq;         /* the most positions one sequence may hold */
    int n_kv;              /* KV pool positions (>= n_ctx_seq) */
    int n_batch;           /* rows per step (>= chunk) */
    int chunk;             /* prefill chunk (multiple of 16) */
    int prefix_cache;      /* 1: on (models without recurrent layers) */
    gerbil_kv_type kv_type;
};

enum { SRV_HIST_BUCKETS = 14 };

struct srv_hist {
    uint64_t n, counts[SRV_HIST_BUCKETS];
    double sum;
};

struct srv_metrics {
    uint64_t prompt_tokens, gen_tokens, cached_tokens, prefill_tokens;
    uint64_t prefix_queries, prefix_hits; /* blocks looked up, found */
    uint64_t preemptions, steps, finished, snapshots;
    int max_step_rows;     /* the most rows one step had */
    uint64_t masks;        /* grammar masks computed */
    double mask_s;         /* time spent computing them */
    struct srv_hist ttft, itl;
};

struct prefix_cache;

/* A recurrent-state snapshot (hybrid models): the state after the prompt prefix whose chain
 * hash is key (pos positions). */
struct srv_snap {
    uint64_t key, tick;
    int pos;
    void *state;           /* NULL: empty slot */
};

struct sched {
    gerbil_model_t model;
    gerbil_tokenizer_t tok;    /* may be NULL */
    gerbil_context_t ctx;
    struct sched_params p;
    int n_vocab;
    int32_t eos[8];
    int n_eos;
    pthread_mutex_t mu;
    pthread_cond_t work;       /* new work or stop */
    pthread_t thread;
    int started, stop;
    struct srv_req *queue, *queue_tail;
    int n_queued;
    struct srv_req *running;   /* in admission order */
    int n_running_seqs;
    uint64_t next_id, next_order;
    struct prefix_cache *pc;
    struct srv_snap *snaps;    /* [n_snaps] when the model has recurrent layers */
    int n_snaps;
    size_t state_bytes;
    uint64_t snap_tick;
    struct srv_metrics m;
    /* step buffers */
    int32_t *b_tok, *b_seq;
    int8_t *b_logits;
    struct srv_choice **b_ch;  /* the choice of each row */
    float *lbuf;               /* [n_vocab] a working copy of logits */
    float *lsm;                /* [n_vocab] log-softmax scratch */
    int32_t *counts;           /* [n_vocab] penalties' counts */
    int32_t *blk;              /* [n_ctx_seq / 16 + 1] block ids */
    uint64_t *mask;            /* [(n_vocab + 63) / 64] a grammar mask */
    gerbil_grammar_vocab_t gvocab; /* the tokenizer's trie for grammars (the server builds it on first use) */
    int step_delay_us;         /* $GERBIL_SERVE_STEP_DELAY_US: a pause after each step, for tests that
                                  act mid-stream on a model too fast to catch (never set in use) */
};

/* Make the context (n_parallel sequences over n_kv positions) and the scheduler; the
 * tokenizer (may be NULL: ids only) is the caller's. */
gerbil_status sched_new(gerbil_model_t model, gerbil_tokenizer_t tok, const struct sched_params *p, struct sched **out);
/* Stops the thread (requests still running are cancelled) and frees everything. */
void sched_free(struct sched *s);
gerbil_status sched_start(struct sched *s);
/* Ask the thread to stop after cancelling everything (sched_free waits for it). */
void sched_shutdown(struct sched *s);

/* A new request (refs 1, the caller's) for prompt[0..n) (copied) with p (its malloc'd
 * fields are taken over). */
struct srv_req *srv_req_new(const int32_t *prompt, int n, const struct srv_params *p);
void srv_params_free(struct srv_params *p);
/* Queue it (the scheduler takes a reference). Returns 0, or -1 when the queue is full,
 * -2 when shutting down. */
int sched_submit(struct sched *s, struct srv_req *r);
/* Ask a request to stop; its sequences are freed at the next step. */
void sched_cancel(struct sched *s, struct srv_req *r);
void sched_release(struct sched *s, struct srv_req *r);
/* Wait (with s->mu held) until r changes or timeout_ms passes. */
void sched_wait(struct sched *s, struct srv_req *r, int timeout_ms);

/* Prometheus text of the scheduler's gauges and counters, appended to buf. */
void sched_metrics_text(struct sched *s, char **buf, size_t *len, size_t *cap);
void srv_hist_add(struct srv_hist *h, double seconds);
/* Running requests, queued requests, KV blocks free / total (a snapshot). */
void sched_counts(struct sched *s, int *running, int *queued, int *kv_free, int *kv_total);

/* ---- sampler_ext.c: what the server adds to gerbil_sampler ---- */
/* logit_bias, then the repetition penalty (CTRL, over prompt + generated), then OpenAI's
 * presence and frequency penalties (over generated), in place. counts: [n_vocab] zeroed
 * scratch, left zeroed. */
void srv_apply_penalties(float *logits, int n_vocab, const struct srv_params *p, const int32_t *prompt, int n_prompt,
                         const int32_t *gen, int n_gen, int32_t *counts);
/* log-softmax of logits into lsm; the logprob of id and the top_n best alternatives. */
void srv_logprobs(const float *logits, int n_vocab, float *lsm, int32_t id, int top_n, struct srv_logprob *out);

/* ---- prefix.c: the prefix cache ---- */
uint64_t prefix_hash(uint64_t parent, const int32_t *tokens);
struct prefix_cache *prefix_new(int capacity);
void prefix_free(struct prefix_cache *pc, gerbil_context_t ctx);
/* The block cached for (parent, tokens[0..16)), or -1; a hit refreshes its LRU time. */
int32_t prefix_lookup(struct prefix_cache *pc, uint64_t parent, const int32_t *tokens, uint64_t *hash);
/* Keep block b (retained) under (parent, tokens); no-op when already cached. */
void prefix_insert(struct prefix_cache *pc, gerbil_context_t ctx, uint64_t parent, const int32_t *tokens, int32_t b);
/* Release up to want least recently used blocks that only the cache holds; returns how many. */
int prefix_evict(struct prefix_cache *pc, gerbil_context_t ctx, int want);
/* Blocks cached, and those only the cache holds (evictable). */
void prefix_counts(struct prefix_cache *pc, gerbil_context_t ctx, int *cached, int *evictable);

#endif
