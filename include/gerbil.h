/* gerbil — local-AI inference engine. Public C API.
 *
 * Every fallible call returns a gerbil_status. On failure the calling thread's
 * message (gerbil_last_error) names the file, tensor, field or argument at fault.
 * The library never exits the process. */
#ifndef GERBIL_H
#define GERBIL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum gerbil_status {
    GERBIL_OK = 0,
    GERBIL_ERR_IO,          /* file missing, unreadable, mmap failed */
    GERBIL_ERR_FORMAT,      /* corrupt or truncated file, malformed JSON */
    GERBIL_ERR_UNSUPPORTED, /* unknown architecture, dtype or option */
    GERBIL_ERR_INVALID_ARG, /* bad argument from the caller (id out of vocab, ...) */
    GERBIL_ERR_NOMEM,       /* allocation failed */
    GERBIL_ERR_CONTEXT,     /* sequence longer than the context window */
    GERBIL_ERR_NETWORK,     /* no connection, DNS failure, dropped transfer, server error */
    GERBIL_ERR_AUTH,        /* 401/403 from the hub: gated or private repo, bad token */
    GERBIL_ERR_NOT_FOUND,   /* no such repo, revision or file (hub or cache) */
} gerbil_status;

/* The message of the last failure on this thread ("" if none). */
const char *gerbil_last_error(void);
const char *gerbil_status_name(gerbil_status s);

typedef enum gerbil_kv_type {
    GERBIL_KV_F16 = 0, /* default */
    GERBIL_KV_F32 = 1,
} gerbil_kv_type;

typedef struct gerbil_model *gerbil_model_t;   /* weights + hyperparameters, shareable */
typedef struct gerbil_session *gerbil_session_t; /* one sequence of a context of its own */

typedef struct gerbil_model_params {
    int n_threads;        /* <= 0: number of online CPUs */
    int use_mmap;         /* 1: read weights in place from the file mapping; 0 (default):
                             copy them into memory at load, which decodes faster */
    /* 1: the "ref" backend (below): every op through its scalar reference (matmuls with
     * weights dequantized row by row, f32 activations, double sums). Slow; for checking
     * numerics. The default fast kernels quantize activations to 8-bit blocks for GGUF
     * quantized weights, as llama.cpp does. */
    int reference_kernels;
    /* Where the model runs: "cpu" (the default), "ref" (every op through the scalar
     * reference kernels: the specification, slow; reference_kernels = 1 is the same), or
     * "cuda" / "cuda:N" (GPU N, in builds with the CUDA backend). NULL: the default. */
    const char *backend;
    /* Called while loading with bytes done of total (may be NULL). */
    void (*progress)(void *user, const char *path, size_t done, size_t total);
    void *progress_user;
} gerbil_model_params;

typedef struct gerbil_session_params {
    int n_ctx;            /* <= 0: the model's max_position_embeddings (capped at 4096) */
    gerbil_kv_type kv_type;
} gerbil_session_params;

gerbil_model_params gerbil_model_default_params(void);
gerbil_session_params gerbil_session_default_params(void);

/* Load a Hugging Face model folder (config.json + *.safetensors). */
gerbil_status gerbil_model_load(const char *path, const gerbil_model_params *params,
                                gerbil_model_t *out);
void gerbil_model_free(gerbil_model_t model);

int gerbil_model_n_vocab(gerbil_model_t model);
int gerbil_model_n_ctx_train(gerbil_model_t model);
/* EOS ids from generation_config.json / config.json; returns how many (<= cap). */
int gerbil_model_eos_ids(gerbil_model_t model, int32_t *ids, int cap);
int32_t gerbil_model_bos_id(gerbil_model_t model); /* -1 if none */
/* Human-readable multi-line description (architecture, params, dtypes, memory). */
gerbil_status gerbil_model_describe(gerbil_model_t model, char *buf, size_t cap);
/* The backend the model was loaded on ("cpu", "ref", "cuda"). */
const char *gerbil_model_backend(gerbil_model_t model);
/* GPUs the CUDA backend can run on: their count (0 in a build without CUDA, or with no
 * driver or device), and GPU i's name and memory (bytes; free as of the call). A model
 * goes onto GPU i with gerbil_model_params.backend = "cuda:i" ("cuda": GPU 0). */
int gerbil_gpu_count(void);
gerbil_status gerbil_gpu_info(int i, char *name, size_t cap, size_t *total_bytes, size_t *free_bytes);
int gerbil_model_n_embd(gerbil_model_t model);
int gerbil_model_n_layer(gerbil_model_t model);

/* ---- contexts: many sequences, evaluated together in batches ----
 * A context holds the state of up to n_seq_max sequences of one model: a KV cache of
 * n_ctx positions in blocks of 16 that all of them share (a sequence takes blocks as it
 * grows and gives them back when truncated or freed; a fork shares its source's blocks
 * until one of them writes), a recurrent-state slot per sequence (with a checkpoint),
 * and the buffers of one forward of up to n_batch rows.
 *
 * gerbil_context_eval runs one batch: rows from any of the context's sequences, each a
 * token id (or an input embedding) appended to its sequence. A sequence's rows go, in
 * batch order, at its next positions. Batch invariance: the logits of a row do not depend
 * on the other sequences in the batch, bit for bit: a sequence evaluated alone and inside
 * any batch gives the same results, given the same rows of it in each call.
 *
 * Threads: a context (and its sequences) is used by one thread at a time. Contexts of one
 * model may be used from different threads at once; their evals take turns on the
 * model's backend (the same holds for sessions). */
typedef struct gerbil_context *gerbil_context_t;

/* Attention within a sequence. Bidirectional (EmbeddingGemma's use_bidirectional_attention):
 * every row sees every position of its sequence (sliding windows: |i - j| < window), so a
 * sequence must be evaluated in one batch, from empty. */
typedef enum {
    GERBIL_ATTENTION_MODEL = 0, /* as the model's config says */
    GERBIL_ATTENTION_CAUSAL,
    GERBIL_ATTENTION_BIDIRECTIONAL,
} gerbil_attention;

typedef struct gerbil_context_params {
    int n_ctx;             /* KV positions shared by all sequences, and the most one may hold
                              (<= 0: the model's max_position_embeddings capped at 4096) */
    int n_seq_max;         /* sequences at once (<= 0: 1) */
    int n_batch;           /* most rows per eval (<= 0: min(n_ctx, 512)) */
    gerbil_kv_type kv_type;
    /* Hidden states to keep for the output rows: after layer tap_layers[i] (0-based,
     * < n_layer) for i < n_taps (may be 0 / NULL). */
    const int *tap_layers;
    int n_taps;
    /* 1: outputs are final-normed hidden states ([n_embd], gerbil_context_embedding), no
     * lm_head (required for models without one: Qwen3Model, Gemma3TextModel) */
    int embeddings;
    gerbil_attention attention; /* causal or bidirectional within a sequence (default: the model's) */
} gerbil_context_params;

/* A row whose input is an embedding (gerbil_batch.embd) rather than a token id. */
#define GERBIL_TOKEN_EMBD (-1)

typedef struct gerbil_batch {
    int n_rows;
    const int32_t *tokens;   /* [n_rows] token ids; GERBIL_TOKEN_EMBD: row i's input is embd[i] */
    const float *embd;       /* [n_rows][n_embd] input embeddings, or NULL when no row has one */
    const int32_t *seq;      /* [n_rows] the sequence each row extends */
    const int32_t *pos;      /* [n_rows] RoPE positions, or NULL: each row's place in its sequence */
    const int8_t *logits;    /* [n_rows] 1: this row's logits (and taps) are wanted; NULL: the last
                                row of each sequence */
    const int32_t *adapter;  /* [n_rows] LoRA adapter ids (gerbil_adapter_load; 0: the bare base), or NULL: all 0.
                                Rows of one batch may use different adapters (of different ranks). */
    /* [n_rows] 1: this row's sequence's rows in this batch compute exactly (bit for bit) what
     * evaluating them one row per call computes, e.g. to verify a speculative draft: its
     * matmuls take the single-row method, attention the per-query path, recurrent layers
     * the token-by-token form. A sequence is such when any of its rows is flagged. NULL: none. */
    const int8_t *verify;
} gerbil_batch;

gerbil_context_params gerbil_context_default_params(void);
gerbil_status gerbil_context_new(gerbil_model_t model, const gerbil_context_params *params, gerbil_context_t *out);
void gerbil_context_free(gerbil_context_t ctx);
int gerbil_context_n_ctx(gerbil_context_t ctx);
int gerbil_context_n_batch(gerbil_context_t ctx);
/* KV positions not held by any sequence (in whole blocks). */
int gerbil_context_n_free(gerbil_context_t ctx);

/* A new empty sequence; GERBIL_ERR_CONTEXT when n_seq_max are in use. */
gerbil_status gerbil_seq_new(gerbil_context_t ctx, int32_t *seq);
void gerbil_seq_free(gerbil_context_t ctx, int32_t seq);
/* A new sequence holding what src holds (its KV blocks shared, its recurrent state and
 * checkpoint copied). */
gerbil_status gerbil_seq_fork(gerbil_context_t ctx, int32_t src, int32_t *seq);
/* Keep the first n tokens (n <= length), as gerbil_session_truncate: a sequence with
 * recurrent layers goes back to its checkpoint when that lies at or before n, else to
 * the start; read gerbil_seq_len afterwards. */
void gerbil_seq_truncate(gerbil_context_t ctx, int32_t seq, int n);
/* Snapshot the sequence's recurrent state as its checkpoint (what truncate goes back to);
 * sequences without recurrent layers need none. */
void gerbil_seq_checkpoint(gerbil_context_t ctx, int32_t seq);
int gerbil_seq_len(gerbil_context_t ctx, int32_t seq);

/* Evaluate a batch (1 .. n_batch rows). Errors (nothing evaluated): GERBIL_ERR_INVALID_ARG
 * for a bad row (token outside the vocabulary, unknown sequence, an embedding row without
 * embd, adapters), GERBIL_ERR_CONTEXT when a sequence would exceed n_ctx or the KV cache
 * has too few free blocks. */
gerbil_status gerbil_context_eval(gerbil_context_t ctx, const gerbil_batch *batch);
/* The outputs of the last eval: rows with logits set (or each sequence's last row), in
 * batch order. */
int gerbil_context_n_outputs(gerbil_context_t ctx);
/* [n_vocab] logits of output i; NULL when out of range. */
const float *gerbil_context_logits(gerbil_context_t ctx, int i);
/* [n_embd] hidden state of output i after tap layer tap_layers[tap]; NULL when out of range. */
const float *gerbil_context_hidden(gerbil_context_t ctx, int i, int tap);
/* [n_embd] final-normed hidden state of output i (contexts with embeddings = 1); NULL when
 * out of range. */
const float *gerbil_context_embedding(gerbil_context_t ctx, int i);

/* ---- contexts, for schedulers and prefix caches (gerbil serve) ----
 * KV bytes one position takes in a context of this kv type (every attention layer's K and V). */
size_t gerbil_model_kv_bytes_per_token(gerbil_model_t model, gerbil_kv_type kv_type);
/* Whether the context's model has recurrent layers (their state cannot be shared by blocks). */
int gerbil_context_has_recurrent(gerbil_context_t ctx);
/* Blocks (of GERBIL_KV_BLOCK positions) in the pool, and those not held by a sequence or a retain. */
#define GERBIL_KV_BLOCK 16
int gerbil_context_n_blocks(gerbil_context_t ctx);
int gerbil_context_n_free_blocks(gerbil_context_t ctx);
/* Blocks an eval of n_new more rows of seq would take from the pool (new blocks, plus a copy
 * of a shared last block), counted as if seq were the only one extending it; -1 for no seq. */
int gerbil_seq_blocks_needed(gerbil_context_t ctx, int32_t seq, int n_new);
/* The ids of the blocks seq holds, in position order (at most cap written); returns how many it holds. */
int gerbil_seq_blocks(gerbil_context_t ctx, int32_t seq, int32_t *out, int cap);
/* An extra reference to block b (a prefix cache keeping it past its sequences), and its release;
 * a block is free again when its last reference goes. refs: references held now (0: free). */
void gerbil_kv_block_retain(gerbil_context_t ctx, int32_t b);
void gerbil_kv_block_release(gerbil_context_t ctx, int32_t b);
int gerbil_kv_block_refs(gerbil_context_t ctx, int32_t b);
/* An empty sequence takes full blocks[0..n) (shared, each referenced once more) as its first
 * n * GERBIL_KV_BLOCK positions, as if it had evaluated the tokens they hold. A model with
 * recurrent layers also needs state: the recurrent state after those positions, as
 * gerbil_seq_state_save wrote it (it becomes the sequence's state and its checkpoint); NULL
 * otherwise. GERBIL_ERR_INVALID_ARG for a non-empty sequence, a missing state, a bad or free
 * block, or more positions than a sequence may hold. */
gerbil_status gerbil_seq_attach(gerbil_context_t ctx, int32_t seq, const int32_t *blocks, int n, const void *state);
/* Bytes of one sequence's recurrent state (0: the model has no recurrent layers), and a copy
 * of seq's current state into dst (that many bytes). */
size_t gerbil_context_state_bytes(gerbil_context_t ctx);
gerbil_status gerbil_seq_state_save(gerbil_context_t ctx, int32_t seq, void *dst);

/* ---- LoRA adapters ----
 * An adapter is loaded onto a model (its base weights untouched, any format) and named by
 * an id > 0; id 0 is the bare base. path: a PEFT folder (adapter_config.json +
 * adapter_model.safetensors), an mlx-lm folder (adapters.safetensors + adapter_config.json)
 * or a llama.cpp GGUF adapter (.gguf). scale multiplies the adapter's own scale (1: as
 * trained). The adapters' linears are applied per row: gerbil_batch.adapter, or
 * gerbil_session_set_adapter. GERBIL_ERR_UNSUPPORTED names what is not supported (DoRA,
 * modules_to_save, a target gerbil does not adapt, a backend without LoRA). */
gerbil_status gerbil_adapter_load(gerbil_model_t model, const char *path, float scale, int32_t *id);
/* A new id applying the adapters of ids[0 .. n) together (their updates summed, in that order). */
gerbil_status gerbil_adapter_stack(gerbil_model_t model, const int32_t *ids, int n, int32_t *id);
/* Unload (ids stacked from it keep their own reference). No eval may use id afterwards. */
gerbil_status gerbil_adapter_free(gerbil_model_t model, int32_t id);

gerbil_status gerbil_session_new(gerbil_model_t model, const gerbil_session_params *params,
                                 gerbil_session_t *out);
void gerbil_session_free(gerbil_session_t s);
/* Forget all tokens (position back to 0, recurrent state zeroed). */
void gerbil_session_reset(gerbil_session_t s);
/* Keep only the first n tokens (n <= n_past), e.g. the prefix a new chat turn shares
 * with the conversation so far. Models with recurrent layers (Qwen3.5's Gated
 * DeltaNet) cannot rewind their state token by token: the session keeps a checkpoint
 * of the state taken at the end of each multi-token eval (a prompt) and goes back to
 * it when it lies at or before n, else to the start. Read gerbil_session_n_past
 * afterwards to know where the session stands. */
void gerbil_session_truncate(gerbil_session_t s, int n);
/* Make dst hold what src holds (KV rows, recurrent state and its checkpoint): a fork
 * of a sequence, e.g. a shared prompt. Same model and kv type; dst needs room. */
gerbil_status gerbil_session_copy(gerbil_session_t dst, gerbil_session_t src);
int gerbil_session_n_past(gerbil_session_t s);
/* The adapter the session's evals use from now on (0: the bare base). */
gerbil_status gerbil_session_set_adapter(gerbil_session_t s, int32_t id);
int gerbil_session_n_ctx(gerbil_session_t s);

/* Run ids[0..n) at the next positions. If logits != NULL it receives the logits:
 * of every position ([n][n_vocab]) when all_logits, else of the last one ([n_vocab]).
 * Prompts go through in chunks that end at multiples of 512 positions (or of a smaller
 * context), so how a prompt is split never depends on how it was handed over. */
gerbil_status gerbil_session_eval(gerbil_session_t s, const int32_t *ids, int n,
                                  float *logits, int all_logits);

/* ---- sampling ---- */
typedef struct gerbil_sampler_params {
    float temperature;        /* 0: greedy. default 0.7 */
    int top_k;                /* <= 0: off. default 50 */
    float top_p;              /* >= 1: off. default 0.9 */
    float min_p;              /* <= 0: off. default 0 */
    float repetition_penalty; /* 1: off. default 1.0 */
    uint64_t seed;            /* default 0 */
} gerbil_sampler_params;

typedef struct gerbil_sampler *gerbil_sampler_t;

gerbil_sampler_params gerbil_sampler_default_params(void);
gerbil_status gerbil_sampler_new(const gerbil_sampler_params *p, int n_vocab, gerbil_sampler_t *out);
void gerbil_sampler_free(gerbil_sampler_t s);
/* Pick a token from logits (modified in place); history = ids seen so far (for the
 * repetition penalty). */
int32_t gerbil_sampler_sample(gerbil_sampler_t s, float *logits, const int32_t *history,
                              int n_history);

/* Set the logits of tokens whose bit is clear in mask (bit i of mask[i / 64]) to -infinity,
 * so sampling picks among the allowed ones; returns how many are allowed. */
int gerbil_sampler_apply_mask(float *logits, int n_vocab, const uint64_t *mask);

/* ---- generation ---- */
typedef enum gerbil_stop_reason {
    GERBIL_STOP_MAX_TOKENS = 0,
    GERBIL_STOP_EOS,
    GERBIL_STOP_CONTEXT,    /* the context window filled up */
    GERBIL_STOP_CALLBACK,   /* on_token returned non-zero */
    GERBIL_STOP_GRAMMAR,    /* the grammar constraint allows no token at all (a dead end) */
} gerbil_stop_reason;

/* Speculative decoding (src/gen/spec.c): a drafter proposes tokens, one forward of the
 * target over [last token + draft] (gerbil_batch.verify rows) checks them, and the
 * longest prefix plain decoding would produce is kept; the KV cache is cut back and a
 * recurrent state restored (checkpoint before the verify, replay of the kept rows). The
 * tokens are those of plain decoding: greedy token for token; sampled (temperature > 0)
 * with rejection sampling (Leviathan et al.), so the output distribution is the
 * sampler chain's, reproducible for a seed (its draws differ from plain sampling's). */
typedef enum gerbil_spec_kind {
    GERBIL_SPEC_NONE = 0,
    GERBIL_SPEC_NGRAM,  /* prompt lookup: the tokens after the latest earlier match of the last 1-4 tokens */
    GERBIL_SPEC_DRAFT,  /* a draft model with the target's vocabulary (spec.draft) */
    GERBIL_SPEC_DFLASH, /* DFlash-2 block drafter: not yet implemented (GERBIL_ERR_UNSUPPORTED) */
    GERBIL_SPEC_CUSTOM, /* the caller's drafter (spec.draft_fn), e.g. for benchmarks; greedy drafts (q one-hot) */
} gerbil_spec_kind;

typedef struct gerbil_spec_params {
    gerbil_spec_kind kind;
    /* GERBIL_SPEC_DRAFT: a session of the draft model, holding the same tokens as the target
     * session when gerbil_generate is called (both new, or both truncated alike); it is fed
     * the prompt and the drafts. */
    gerbil_session_t draft;
    int draft_max;   /* most draft tokens per verify step (1..32; <= 0: 5) */
    int draft_min;   /* fewest while acceptance is low (0..draft_max; 0: plain decode steps, probing
                        again now and then); draft_min == draft_max: a fixed length */
    /* GERBIL_SPEC_CUSTOM: write up to k tokens to follow hist[0..n_hist) (the call's prompt and
     * the tokens generated so far) into out; return how many (0: a plain decode step). */
    int (*draft_fn)(void *user, const int32_t *hist, int n_hist, int k, int32_t *out);
    void *draft_user;
} gerbil_spec_params;

typedef struct gerbil_generate_params {
    int max_tokens;          /* default 512, as in the reference engine */
    int ignore_eos;          /* keep going past EOS ids */
    /* Called with each generated id; return non-zero to stop. May be NULL. */
    int (*on_token)(void *user, int32_t id);
    void *user;
    /* Called during the prompt's prefill with the tokens evaluated so far: 0 first, then
     * after each chunk (done == total last), e.g. for a progress line. May be NULL. */
    void (*on_prompt_progress)(void *user, int done, int total);
    /* A grammar constraint for this sequence (gerbil_grammar_*; NULL: none). Each step's
     * logits are masked to the tokens it allows before sampling (EOS only where it may end;
     * its EOS ids end generation); a token that is the only one allowed is taken without
     * sampling, and runs of such forced tokens go through one forward. */
    struct gerbil_grammar_state *grammar;
    gerbil_spec_params spec; /* speculative decoding (kind 0: off); not with a grammar */
} gerbil_generate_params;

typedef struct gerbil_generate_result {
    int n_prompt, n_generated;
    gerbil_stop_reason stop;
    double prompt_s, gen_s;  /* wall time of prefill and of the decode steps */
    /* speculative decoding: verify forwards, draft tokens proposed, and accepted */
    int n_verify, n_drafted, n_accepted;
} gerbil_generate_result;

gerbil_generate_params gerbil_generate_default_params(void);
/* Prefill prompt[0..n_prompt) after what the session already holds, then sample up
 * to max_tokens ids into out (capacity max_tokens). The sampler's repetition history
 * is the prompt plus the generated ids. */
gerbil_status gerbil_generate(gerbil_session_t s, gerbil_sampler_t sampler, const int32_t *prompt,
                              int n_prompt, const gerbil_generate_params *p, int32_t *out,
                              gerbil_generate_result *res);

/* ---- text: tokenizers (src/text/) ---- */
typedef struct gerbil_tokenizer *gerbil_tokenizer_t;

/* path: a folder holding tokenizer.json (and optionally tokenizer_config.json and
 * chat_template.jinja), or a tokenizer.json file. */
gerbil_status gerbil_tokenizer_load(const char *path, gerbil_tokenizer_t *out);
void gerbil_tokenizer_free(gerbil_tokenizer_t tok);
int gerbil_tokenizer_n_vocab(gerbil_tokenizer_t tok);
/* A cheap bound: a text of n bytes encodes to at least n / gerbil_tokenizer_max_token_bytes()
 * tokens (special tokens come on top), so an oversized prompt can be refused before it is
 * tokenized. 0 when the tokenizer gives no such bound (a normalizer or pre-tokenizer that
 * deletes text, WordPiece's [UNK] for a whole word, fused unknown tokens). */
int gerbil_tokenizer_max_token_bytes(gerbil_tokenizer_t tok);
/* Encode len bytes of UTF-8 text. add_special: apply the post-processor (adds BOS
 * etc. as HF's add_special_tokens=True). *ids is malloc'd; the caller frees it. */
gerbil_status gerbil_tokenize(gerbil_tokenizer_t tok, const char *text, size_t len, int add_special,
                              int32_t **ids, int *n_ids);
/* Decode ids to text (HF decode; skip_special drops special tokens). *text is malloc'd
 * and NUL-terminated; the caller frees it. */
gerbil_status gerbil_detokenize(gerbil_tokenizer_t tok, const int32_t *ids, int n_ids, int skip_special,
                                char **text, size_t *len);
/* Special ids from tokenizer_config.json / the post-processor; -1 when none. */
int32_t gerbil_tokenizer_bos(gerbil_tokenizer_t tok);
int32_t gerbil_tokenizer_eos(gerbil_tokenizer_t tok);
/* The chat template found beside the tokenizer (tokenizer_config.json "chat_template",
 * or chat_template.jinja), or NULL. name selects one of a named list (NULL: "default"). */
const char *gerbil_tokenizer_chat_template(gerbil_tokenizer_t tok, const char *name);
/* The tokenizer stored in a GGUF file's metadata (tokenizer.ggml.*), interpreted as
 * llama.cpp does and encoded by the same pipeline as tokenizer.json. Supported
 * tokenizer.ggml.model: "gpt2" (byte-level BPE; tokenizer.ggml.pre selects the regex
 * split: default, llama3/llama-bpe, qwen2, gpt-2, deepseek-*, starcoder, falcon, ...),
 * "llama" (SentencePiece: scores, byte fallback, add_space_prefix), "bert" (WordPiece)
 * and "t5" (Unigram, only without a precompiled_charsmap). Control and unknown tokens
 * are special added tokens, user-defined ones plain added tokens; add_bos_token /
 * add_eos_token decide what gerbil_tokenize(add_special=1) adds; bos/eos come from
 * tokenizer.ggml.bos_token_id / eos_token_id; gerbil_tokenizer_chat_template returns
 * tokenizer.chat_template ("default") and tokenizer.chat_template.NAME. Errors:
 * GERBIL_ERR_IO (unreadable), GERBIL_ERR_FORMAT (corrupt file, tokens missing, arrays
 * of the wrong type or length, merges naming unknown tokens, ids out of range),
 * GERBIL_ERR_UNSUPPORTED (unknown model or pre-tokenizer type); *out is NULL then. */
gerbil_status gerbil_tokenizer_load_gguf(const char *path, gerbil_tokenizer_t *out);

/* Streaming detokenizer: feed ids one at a time, get text that is always whole UTF-8
 * characters (bytes of an incomplete character are held back until it completes). */
typedef struct gerbil_detok *gerbil_detok_t;
gerbil_status gerbil_detok_new(gerbil_tokenizer_t tok, int skip_special, gerbil_detok_t *out);
void gerbil_detok_free(gerbil_detok_t d);
/* *piece points into the detokenizer (valid until the next call); may be empty. */
gerbil_status gerbil_detok_push(gerbil_detok_t d, int32_t id, const char **piece, size_t *len);
/* Start in the context of ids already shown (the prompt): their text is not returned,
 * and later pieces are decoded after them, so a continuation is exactly
 * decode(prompt + generated) minus decode(prompt) (a SentencePiece continuation keeps
 * its leading space, as llama.cpp prints it). Replaces any earlier context. */
gerbil_status gerbil_detok_prime(gerbil_detok_t d, const int32_t *ids, int n);
/* Whatever is held back at the end (replacement characters for broken UTF-8). */
gerbil_status gerbil_detok_flush(gerbil_detok_t d, const char **piece, size_t *len);

/* ---- text: chat templates (a Jinja2 subset, rendered as transformers does) ---- */
/* Render template_src with the variables of the JSON object context_json (messages,
 * tools, documents, add_generation_prompt, bos_token, eos_token, extra variables).
 * trim_blocks and lstrip_blocks are on, as transformers sets them. *out is malloc'd.
 * A template error, or raise_exception(), returns GERBIL_ERR_FORMAT / GERBIL_ERR_INVALID_ARG
 * with a message naming the line and construct (or the exception's message). */
gerbil_status gerbil_template_render(const char *template_src, const char *context_json, char **out);

/* A model's chat template with the special tokens it is rendered with. */
typedef struct gerbil_chat_template *gerbil_chat_template_t;
/* From dir: chat_template.jinja (it wins, as in transformers), else tokenizer_config.json
 * "chat_template" (a string, or a list of {"name", "template"}: "default" or the first);
 * bos/eos/unk/pad tokens from tokenizer_config.json. template_file (may be NULL)
 * replaces the template text. *out is NULL (and GERBIL_OK) when there is no template. */
gerbil_status gerbil_chat_template_load(const char *dir, const char *template_file, gerbil_chat_template_t *out);
/* From template text (e.g. a GGUF file's tokenizer.chat_template) and the special
 * tokens' text (either may be NULL). */
gerbil_status gerbil_chat_template_new(const char *src, const char *bos_token, const char *eos_token,
                                       gerbil_chat_template_t *out);
void gerbil_chat_template_free(gerbil_chat_template_t t);
/* The template's Jinja source (owned by t). */
const char *gerbil_chat_template_source(gerbil_chat_template_t t);
/* The tool calls in a model's answer text[0..n), in the format the template's model writes
 * them (Hermes / Qwen3 <tool_call>, Qwen3.5 XML, Llama 3 JSON, Mistral [TOOL_CALLS]; chosen from
 * the template's text; t NULL: Hermes): a malloc'd JSON array of OpenAI tool_calls
 * ({"id", "type": "function", "function": {"name", "arguments": JSON text}}), or NULL when
 * there are none or one does not parse (the text is then all content). tools_json: the tool
 * definitions (JSON array) or NULL; *content_len (may be NULL): the content before the calls. */
char *gerbil_chat_parse_tool_calls(gerbil_chat_template_t t, const char *text, size_t n, const char *tools_json,
                                   size_t *content_len);
/* Render as apply_chat_template(tokenize=False): messages_json is a JSON array,
 * tools_json a JSON array or NULL; extra variables are NAME = JSON text pairs (they
 * win over the built-in ones). *out is malloc'd. */
gerbil_status gerbil_chat_template_apply(gerbil_chat_template_t t, const char *messages_json, const char *tools_json,
                                         int add_generation_prompt, const char *const *var_names,
                                         const char *const *var_values, int n_vars, char **out);

/* ---- structured output: grammar-constrained decoding (src/grammar/) ----
 * A constraint compiles once (JSON Schema, llama.cpp GBNF, a regex, or any JSON object)
 * against a vocabulary; each sequence then holds its own small state. Per step: the
 * mask (bit i of words[i / 64] set = token i allowed; EOS ids only where the grammar may
 * end), then gerbil_grammar_accept_token with the chosen id. Everything is byte-level:
 * each token's bytes (byte-level BPE and SentencePiece byte fallback alike) are run
 * through the grammar, so a token may end inside a UTF-8 character or a JSON string.
 * A compiled grammar may be shared by sequences on several threads (its caches are
 * behind a lock); a state belongs to one sequence. */
typedef struct gerbil_grammar_vocab *gerbil_grammar_vocab_t;
typedef struct gerbil_grammar *gerbil_grammar_t;
typedef struct gerbil_grammar_state *gerbil_grammar_state_t;

typedef enum gerbil_grammar_kind {
    GERBIL_GRAMMAR_JSON_SCHEMA = 0, /* src: a JSON Schema document */
    GERBIL_GRAMMAR_GBNF,            /* src: llama.cpp GBNF; the start rule is "root" */
    GERBIL_GRAMMAR_REGEX,           /* src: an ECMAScript regex the whole output must match */
    GERBIL_GRAMMAR_JSON_OBJECT,     /* any JSON object (src ignored) */
    /* src: a JSON spec of repeated, wrapped items (tool calls): {"open": S, "close": S,
     * "separator": S, "min": N, "max": N (-1: unbounded), "items": [[PART, ...], ...]}; the
     * output is open, then min..max items (each one of the alternatives) joined by
     * separator, then close; a PART is a literal string, {"schema": JSON Schema} (a JSON
     * value), {"regex": RE} or {"optional": [PART, ...]}. */
    GERBIL_GRAMMAR_SEQUENCE,
} gerbil_grammar_kind;

typedef struct gerbil_grammar_params {
    int compact;          /* JSON: no whitespace between tokens (default 0: whitespace as JSON allows) */
    int max_whitespace;   /* JSON, flexible: at most this many whitespace bytes in a row (0: unbounded) */
} gerbil_grammar_params;

gerbil_grammar_params gerbil_grammar_default_params(void);
/* The vocabulary's byte trie, built once per tokenizer (tens of ms for 128k tokens).
 * n_vocab: the mask width (the model's vocabulary; <= 0: the tokenizer's); eos_ids: the
 * ids allowed where the grammar may end (n_eos <= 0: the tokenizer's EOS). Special
 * tokens other than those are never allowed. */
gerbil_status gerbil_grammar_vocab_new(gerbil_tokenizer_t tok, int n_vocab, const int32_t *eos_ids, int n_eos,
                                       gerbil_grammar_vocab_t *out);
void gerbil_grammar_vocab_free(gerbil_grammar_vocab_t v);
int gerbil_grammar_vocab_n(gerbil_grammar_vocab_t v);
/* Compile a constraint (the vocabulary must outlive it). Errors: GERBIL_ERR_FORMAT (syntax
 * error, with the line/offset), GERBIL_ERR_UNSUPPORTED (a JSON Schema keyword or regex
 * feature that cannot be enforced, named in the message: never silently ignored). */
gerbil_status gerbil_grammar_compile(gerbil_grammar_vocab_t v, gerbil_grammar_kind kind, const char *src, size_t len,
                                     const gerbil_grammar_params *p, gerbil_grammar_t *out);
void gerbil_grammar_free(gerbil_grammar_t g);
/* 64-bit words a mask needs: (n_vocab + 63) / 64. */
int gerbil_grammar_mask_words(gerbil_grammar_t g);
gerbil_status gerbil_grammar_state_new(gerbil_grammar_t g, gerbil_grammar_state_t *out);
void gerbil_grammar_state_free(gerbil_grammar_state_t s);
void gerbil_grammar_state_reset(gerbil_grammar_state_t s);
void gerbil_grammar_state_copy(gerbil_grammar_state_t dst, gerbil_grammar_state_t src); /* a fork */
/* The allowed tokens now, into words[gerbil_grammar_mask_words]. */
gerbil_status gerbil_grammar_mask(gerbil_grammar_state_t s, uint64_t *words);
/* Advance by a token; GERBIL_ERR_INVALID_ARG (state unchanged) when it is not allowed. An
 * EOS id is allowed only where the grammar may end, and ends the constraint. */
gerbil_status gerbil_grammar_accept_token(gerbil_grammar_state_t s, int32_t id);
/* Advance byte by byte; returns how many of the n bytes were accepted (stops at the first
 * byte the grammar rejects, the state then being after the accepted ones). */
size_t gerbil_grammar_accept_bytes(gerbil_grammar_state_t s, const char *p, size_t n);
/* The grammar may end here. */
int gerbil_grammar_is_accepting(gerbil_grammar_state_t s);
/* Nothing more can follow (EOS taken, or complete with no possible continuation). */
int gerbil_grammar_is_finished(gerbil_grammar_state_t s);
/* The bytes that must come next (up to cap), without changing the state. */
size_t gerbil_grammar_forced_bytes(gerbil_grammar_state_t s, char *buf, size_t cap);
/* The only allowed token, or -1 when zero or several are (scratch: mask_words words). */
int32_t gerbil_grammar_forced_token(gerbil_grammar_state_t s, uint64_t *scratch);
/* Sizes, for diagnostics. */
void gerbil_grammar_stats(gerbil_grammar_t g, int *n_states, int *n_nodes, int *n_rules);

/* The reference engine's generateObject, with the constraint instead of retries: generate
 * after prompt under schema_json (a JSON Schema; NULL: any JSON object) and return the JSON
 * text (*json malloc'd), which parses and matches the schema. The vocabulary is the model's
 * (gerbil_grammar_vocab_new with its tokenizer and EOS ids). Errors: the schema's compile
 * errors; GERBIL_ERR_CONTEXT when max_tokens or the context ran out before the object ended. */
gerbil_status gerbil_generate_object(gerbil_session_t s, gerbil_sampler_t sampler, gerbil_tokenizer_t tok,
                                     gerbil_grammar_vocab_t vocab, const int32_t *prompt, int n_prompt,
                                     const char *schema_json, const gerbil_generate_params *p, char **json,
                                     gerbil_generate_result *res);

/* ---- hub: models by name (src/hub/) ----
 * A model reference is a local folder, a .gguf file, or a Hugging Face repo id
 * "org/name[@revision][:FILE.gguf]" (":FILE" may also be a GGUF quantization tag such
 * as ":Q4_K_M"). Repos live in the huggingface_hub cache layout, shared with Python
 * tools: CACHE/models--org--name/{blobs/ETAG, snapshots/COMMIT/PATH -> ../../blobs/ETAG,
 * refs/REVISION = COMMIT}. Only what gerbil runs is fetched: config, tokenizer and
 * template files plus the weights of one format (*.safetensors, or one .gguf). */
typedef struct gerbil_hub_progress {
    const char *repo, *revision, *commit;
    int n_files;               /* files to transfer in this pull */
    int n_files_done;
    uint64_t bytes_total;      /* bytes still to transfer when the pull started */
    uint64_t bytes_done;       /* of bytes_total */
    double elapsed_s;
    int done;                  /* 0: start (bytes_done = 0) or update, 1: finished */
} gerbil_hub_progress;

typedef struct gerbil_hub_params {
    const char *endpoint;      /* default: $HF_ENDPOINT, else https://huggingface.co */
    const char *token;         /* default: $HF_TOKEN; sent as Authorization: Bearer */
    const char *cache_dir;     /* default: $HF_HUB_CACHE, $HF_HOME/hub,
                                  $XDG_CACHE_HOME/huggingface/hub, ~/.cache/huggingface/hub */
    int offline;               /* never touch the network; default: HF_HUB_OFFLINE=1 */
    int n_parallel;            /* concurrent file transfers (default 4) */
    /* Called from the calling thread about every 100 ms while files transfer (may be NULL). */
    void (*progress)(void *user, const gerbil_hub_progress *p);
    /* Called with one-line remarks worth showing, e.g. which GGUF was chosen (may be NULL). */
    void (*notice)(void *user, const char *message);
    void *user;
} gerbil_hub_params;

/* Defaults, with the environment variables above read now. */
gerbil_hub_params gerbil_hub_default_params(void);
/* 1 when ref names a repo (not an existing local path and shaped org/name...). */
int gerbil_hub_is_repo_ref(const char *ref);
/* A local path for ref: a path as given, or the cached snapshot of a repo id (its
 * folder, or the chosen .gguf file), pulled first when the cache lacks it. *path is
 * malloc'd. Errors: GERBIL_ERR_NOT_FOUND (no such path/repo/revision/file, or offline and
 * not cached), GERBIL_ERR_AUTH, GERBIL_ERR_NETWORK, GERBIL_ERR_IO (disk full, ...),
 * GERBIL_ERR_FORMAT (checksum mismatch, bad hub reply), GERBIL_ERR_UNSUPPORTED (no format
 * gerbil runs); the message says what to do. */
gerbil_status gerbil_hub_resolve(const char *ref, const gerbil_hub_params *p, char **path);
/* Ask the hub for the revision's file list and fetch what is missing: parallel,
 * resumable (.incomplete files, HTTP Range), size- and hash-checked, each file
 * appearing atomically. Safe to run concurrently with itself and with huggingface_hub
 * (the same .locks files). *path as for gerbil_hub_resolve (may be NULL). */
gerbil_status gerbil_hub_pull(const char *ref, const gerbil_hub_params *p, char **path);

typedef struct gerbil_hub_entry {
    char *repo;                /* "org/name" */
    char *revisions;           /* refs pointing at this snapshot, comma-separated ("" if none) */
    char *commit;
    const char *format;        /* "safetensors", "gguf" or "incomplete" */
    uint64_t bytes;            /* size of the snapshot's files on disk */
} gerbil_hub_entry;
/* One entry per cached snapshot, sorted by repo. */
gerbil_status gerbil_hub_list(const gerbil_hub_params *p, gerbil_hub_entry **entries, int *n);
void gerbil_hub_list_free(gerbil_hub_entry *entries, int n);
/* Delete a repo ("org/name") from the cache; *freed = bytes of its blobs (may be NULL).
 * GERBIL_ERR_NOT_FOUND when it is not cached. */
gerbil_status gerbil_hub_remove(const char *repo, const gerbil_hub_params *p, uint64_t *freed);
/* The cache folder in use (from p or the environment); malloc'd. */
char *gerbil_hub_cache_dir(const gerbil_hub_params *p);

/* ---- text embeddings (src/embed/) ----
 * A sentence-transformers folder (modules.json: Transformer -> Pooling -> Dense ... ->
 * Normalize; prompts from config_sentence_transformers.json), or a bare model folder
 * (Qwen3Model / Gemma3TextModel: last-token pooling and normalisation for Qwen3, mean for
 * Gemma 3). Many texts go into one batch (each its own sequence, no padding); a text's
 * embedding does not depend on the others in its batch, bit for bit. */
typedef struct gerbil_embedder *gerbil_embedder_t;

typedef struct gerbil_embed_options {
    const char *prompt_name;  /* a key of the folder's prompts ("query", "document", ...), or NULL */
    const char *prompt;       /* a prompt given as text (wins over prompt_name), or NULL */
    int dimensions;           /* Matryoshka: keep the first N and renormalise; 0: all */
} gerbil_embed_options;

/* dir: the folder (its modules.json etc.; the weights are model's); tok: its tokenizer. The
 * embedder keeps pointers to both (free them after it). Refuses models that are not
 * embedding models, naming why. */
gerbil_status gerbil_embedder_new(gerbil_model_t model, gerbil_tokenizer_t tok, const char *dir,
                                  gerbil_embedder_t *out);
void gerbil_embedder_free(gerbil_embedder_t e);
/* 1 for a model without lm_head (Qwen3Model, Gemma3TextModel): it embeds and cannot generate. */
int gerbil_model_is_embedding(gerbil_model_t model);
int gerbil_embedder_dim(gerbil_embedder_t e);         /* output size before --dimensions */
int gerbil_embedder_max_tokens(gerbil_embedder_t e);  /* longest input, in tokens */
/* The folder's prompt names, NUL-separated then "" (NULL when none); its default one or NULL. */
const char *gerbil_embedder_prompt_names(gerbil_embedder_t e);
const char *gerbil_embedder_default_prompt(gerbil_embedder_t e);
/* out: n x dim floats (dim = o->dimensions or gerbil_embedder_dim), in input order;
 * *n_tokens (may be NULL): tokens evaluated. Texts get the prompt and the tokenizer's
 * special tokens; ids are used as given (no prompt, no special tokens added). */
gerbil_status gerbil_embed(gerbil_embedder_t e, const char *const *texts, int n, const gerbil_embed_options *o,
                           float *out, int *n_tokens);
gerbil_status gerbil_embed_ids(gerbil_embedder_t e, const int32_t *const *ids, const int *n_ids, int n,
                               const gerbil_embed_options *o, float *out, int *n_tokens);
/* ---- audio in (src/audio/) and speech-to-text (Moonshine) ---- */
/* Limits checked before anything is allocated from a file's header. */
enum { GERBIL_AUDIO_MAX_SECONDS = 4 * 3600, GERBIL_AUDIO_MAX_CHANNELS = 64, GERBIL_AUDIO_MAX_RATE = 768000 };
/* Decode an audio file (WAV, FLAC, OGG Vorbis, OGG Opus, MP3, ... through libsndfile) to mono
 * f32 samples in [-1, 1] (channels averaged), resampled to `rate` Hz with libsoxr (rate <= 0:
 * the file's own rate). *pcm: malloc'd (gerbil_audio_free), *n samples; *rate_in (may be
 * NULL) = the file's rate. GERBIL_ERR_IO (cannot open), GERBIL_ERR_FORMAT (not audio,
 * empty, truncated, corrupt), GERBIL_ERR_INVALID_ARG (longer than the limit). */
gerbil_status gerbil_audio_read_file(const char *path, int rate, float **pcm, int64_t *n, int *rate_in);
/* The same from a file's bytes in memory (an upload). */
gerbil_status gerbil_audio_read_memory(const void *data, size_t size, int rate, float **pcm, int64_t *n,
                                       int *rate_in);
/* Mono f32 from rate_in to rate_out Hz (libsoxr, SOXR_HQ). */
gerbil_status gerbil_audio_resample(const float *in, int64_t n, int rate_in, int rate_out, float **out,
                                    int64_t *n_out);
void gerbil_audio_free(float *pcm);

/* Speech-to-text models (MoonshineForConditionalGeneration folders) load with
 * gerbil_model_load; contexts and sessions refuse them. Input: mono f32 at
 * gerbil_stt_sample_rate() (16 kHz). */
int gerbil_model_is_stt(gerbil_model_t m);
int gerbil_stt_sample_rate(gerbil_model_t m);
typedef struct gerbil_stt_params {
    double window_s;   /* audio longer than this is transcribed in windows of it (default 24 s) */
    double overlap_s;  /* consecutive windows overlap by this much (default 2 s) */
    int max_tokens;    /* tokens per window at most (0: 6.5 a second + 8, within the positions) */
    int ignore_eos;    /* 1: decode max_tokens regardless of EOS */
} gerbil_stt_params;
gerbil_stt_params gerbil_stt_default_params(void);
typedef struct gerbil_stt_segment {
    double start, end; /* seconds */
    int32_t *ids;      /* the window's tokens (no start token, no EOS) */
    int n_ids;
    int joined_from;   /* ids[0 .. joined_from) repeat the previous window's end and were left out of the join */
} gerbil_stt_segment;
typedef struct gerbil_stt_result {
    int32_t *ids;      /* every window's tokens, joined */
    int n_ids;
    gerbil_stt_segment *segments;
    int n_segments;
    double audio_s, encode_ms, decode_ms;
} gerbil_stt_result;
/* Greedy transcription (decoder start token, EOS from generation_config.json), in
 * overlapping windows for long audio (p may be NULL: the defaults). */
gerbil_status gerbil_stt_transcribe(gerbil_model_t m, const float *pcm, int64_t n, const gerbil_stt_params *p,
                                    gerbil_stt_result **out);
void gerbil_stt_result_free(gerbil_stt_result *r);
/* The decoder's logits [n_ids][n_vocab] for decoder ids ids[0 .. n_ids) (teacher forcing)
 * over the encoding of pcm (one window). */
gerbil_status gerbil_stt_logits(gerbil_model_t m, const float *pcm, int64_t n, const int32_t *ids, int n_ids,
                                float *logits);
/* The encoder's output [*n_frames][n_embd] (malloc'd; free()). */
gerbil_status gerbil_stt_encode(gerbil_model_t m, const float *pcm, int64_t n, float **out, int *n_frames);

/* ---- images in (src/image/) ---- */
/* Limits checked from a file's header before its pixels are allocated (Pillow's own
 * decompression-bomb limit is 178956970 pixels; ours is half of that). */
enum { GERBIL_IMAGE_MAX_SIDE = 32768, GERBIL_IMAGE_MAX_PIXELS = 89478485, GERBIL_IMAGE_MAX_BYTES = 256 << 20 };
/* 8-bit RGB, row-major (height rows of width * 3 bytes). */
typedef struct {
    int width, height;
    unsigned char *rgb;
} gerbil_image;
/* Decode a PNG, JPEG or WebP file as transformers' load_image sees it through Pillow:
 * JPEG EXIF orientation applied, alpha dropped (Pillow's convert("RGB"); transformers does
 * not composite), palette / grey / 16-bit converted to 8-bit RGB. GERBIL_ERR_IO (cannot
 * open), GERBIL_ERR_FORMAT (not an image, truncated, corrupt), GERBIL_ERR_INVALID_ARG
 * (over the limits), GERBIL_ERR_UNSUPPORTED (CMYK JPEG, animated WebP). */
gerbil_status gerbil_image_read_file(const char *path, gerbil_image *out);
/* The same from a file's bytes; what names it in errors (may be NULL). */
gerbil_status gerbil_image_read_memory(const void *data, size_t size, const char *what, gerbil_image *out);
void gerbil_image_free(gerbil_image *im);
/* Pillow's Image.resize(BICUBIC) on 8-bit RGB, bit for bit (antialiased when shrinking). */
gerbil_status gerbil_image_resize_bicubic(const gerbil_image *in, int out_w, int out_h, gerbil_image *out);
/* transformers' Qwen2-VL smart_resize: sides multiples of factor, pixels within bounds. */
gerbil_status gerbil_image_smart_resize(int height, int width, int factor, int64_t min_pixels, int64_t max_pixels,
                                        int *out_h, int *out_w);
/* The Qwen2-VL / Qwen3-VL / Qwen3.5 image processor (preprocessor_config.json's fields). */
typedef struct {
    int patch_size, temporal_patch_size, merge_size; /* Qwen3.5: 16, 2, 2 */
    int64_t min_pixels, max_pixels;                  /* size.shortest_edge, size.longest_edge */
    double rescale_factor;                           /* 1/255 */
    float image_mean[3], image_std[3];               /* 0.5, 0.5 */
} gerbil_qwen_image_config;
/* Read preprocessor_config.json (transformers' constructor defaults, then the file's
 * patch_size, temporal_patch_size, merge_size, size.shortest_edge / longest_edge,
 * min_pixels / max_pixels (these win), rescale_factor, image_mean, image_std). */
gerbil_status gerbil_qwen_image_config_read(const char *path, gerbil_qwen_image_config *cfg);
/* pixel_values [n_patches, patch_dim] (malloc'd, free()) and image_grid_thw, as the HF
 * processor returns them for one image. */
gerbil_status gerbil_image_qwen_patches(const gerbil_image *im, const gerbil_qwen_image_config *cfg, float **pixels,
                                        int64_t *n_patches, int64_t *patch_dim, int grid_thw[3]);

#ifdef __cplusplus
}
#endif
#endif
