/* A loaded model: hyperparameters + weight views into the loaded checkpoint. */
#ifndef GB_MODEL_H
#define GB_MODEL_H

#include "backend/backend.h"
#include "model/config.h"
#include "model/kv_blocks.h"
#include "model/lora.h"
#include "model/weights.h"

#include <pthread.h>

struct layer_weights {
    const float *attn_norm;           /* (n_embd) */
    struct gb_weight wq;       /* (n_head * head_dim, n_embd); x2 with attn_out_gate:
                                  per head head_dim query rows, then head_dim gate rows */
    struct gb_weight wk;       /* (n_head_kv * head_dim, n_embd) */
    struct gb_weight wv;       /* (n_head_kv * head_dim, n_embd) */
    struct gb_weight wo;       /* (n_embd, n_head * head_dim) */
    const float *bq, *bk, *bv, *bo;   /* biases or NULL */
    const float *q_norm, *k_norm;     /* (head_dim) Qwen3, else NULL */
    const float *attn_post_norm;      /* (n_embd) Gemma 3: on the attention output, else NULL */
    const float *ffn_norm;            /* (n_embd) before the ffn (Gemma 3: pre_feedforward_layernorm) */
    const float *ffn_post_norm;       /* (n_embd) Gemma 3: on the ffn output, else NULL */
    struct gb_weight w_gate;   /* (n_ff, n_embd) */
    struct gb_weight w_up;     /* (n_ff, n_embd) */
    struct gb_weight w_down;   /* (n_embd, n_ff) */
    const float *b_gate, *b_up, *b_down;
    /* Gated DeltaNet (LAYER_DELTANET): conv_dim = 2 * nk * dk + nv * dv */
    struct gb_weight w_qkv;    /* (conv_dim, n_embd) in_proj_qkv */
    struct gb_weight w_z;      /* (nv * dv, n_embd) in_proj_z: the output gate */
    struct gb_weight w_b;      /* (nv, n_embd) in_proj_b: beta = sigmoid(x W_b^T) */
    struct gb_weight w_a;      /* (nv, n_embd) in_proj_a: decay input */
    /* Qwen3-Next (dn.fused_proj): the four above fused, grouped per key head g of nk:
     * in_proj_qkvz rows [q_g (dk), k_g (dk), v_g (r * dv), z_g (r * dv)], in_proj_ba rows
     * [b_g (r), a_g (r)], r = nv / nk value heads per key head */
    struct gb_weight w_qkvz;   /* (2 * nk * dk + 2 * nv * dv, n_embd) */
    struct gb_weight w_ba;     /* (2 * nv, n_embd) */
    struct gb_weight w_out;    /* (n_embd, nv * dv) out_proj */
    const float *conv_w;              /* (conv_kernel, conv_dim): tap-major, transposed at load */
    const float *ssm_a;               /* (nv): -exp(A_log) */
    const float *dt_bias;             /* (nv) */
    const float *dn_norm;             /* (dv): gated RMSNorm weight */
    /* sparse MoE feed-forward (cfg.layer_moe[l]); w_gate/w_up/w_down unused then */
    struct gb_weight w_router;        /* (n_expert, n_embd) mlp.gate */
    struct gb_weight *exp_gate, *exp_up, *exp_down; /* [n_expert]: (n_ff_exp, n_embd) x2, (n_embd, n_ff_exp) */
    struct gb_weight w_sh_gate, w_sh_up, w_sh_down; /* shared expert: (n_ff_shexp, n_embd) x2, (n_embd, n_ff_shexp) */
    struct gb_weight w_sh_router;     /* (1, n_embd) shared_expert_gate */
    /* LFM2 short convolution (LAYER_SHORTCONV); also w_out (n_embd, n_embd) out_proj and
     * conv_w (conv_L_cache, n_embd), tap-major */
    struct gb_weight w_sc_in;  /* (3 * n_embd, n_embd) in_proj: [B | C | x] */
    const float *b_sc_in, *b_conv, *b_out; /* conv_bias: (3 * n_embd), (n_embd), (n_embd) or NULL */
    /* Gemma 4 */
    const float *v_ones;              /* (head_dim) ones: the values' weightless RMSNorm */
    struct gb_weight w_ple_gate;      /* (ple_dim, n_embd) per_layer_input_gate */
    struct gb_weight w_ple_proj;      /* (n_embd, ple_dim) per_layer_projection */
    const float *ple_post_norm;       /* (n_embd) post_per_layer_input_norm */
    float out_scale;                  /* layer_scalar (host value); 0: none */
};

struct gerbil_model {
    struct model_config cfg;
    struct weight_source src;
    struct backend *be;               /* where the weights live and every op runs */
    pthread_mutex_t lock;             /* one forward at a time on be (contexts of one model may
                                         eval from different threads) */
    int lock_ready;
    struct gb_weight tok_embd;        /* (n_vocab, n_embd) */
    const float *out_norm;            /* (n_embd) */
    struct gb_weight lm_head;         /* (n_vocab, n_embd); == tok_embd when tied */
    float embd_scale;                 /* embeddings multiplied by this (Gemma 3); 0: not scaled */
    struct gb_weight ple_embd;        /* Gemma 4: (ple_vocab, n_layer * ple_dim) embed_tokens_per_layer */
    struct gb_weight ple_model_proj;  /* (n_layer * ple_dim, n_embd) per_layer_model_projection */
    const float *ple_proj_norm;       /* (ple_dim) per_layer_projection_norm */
    float ple_embd_scale;             /* sqrt(ple_dim) in the embedding's dtype */
    struct layer_weights *layers;     /* [n_layer] */
    struct gb_weight *experts;        /* 3 * n_expert per MoE layer, one block */
    float *f32_store;                 /* norms and biases converted to f32 at load (host), then */
    float *f32_dev;                   /* their copy in backend memory, which the layers point into */
    size_t f32_bytes;
    size_t weight_bytes;
    int64_t n_params;
    struct lora_registry *lora;       /* loaded LoRA adapters by id (lora.c), or NULL */
    struct moonshine *stt;            /* a speech-to-text model (moonshine.c), else NULL */
};

/* ---- contexts: many sequences, one batch per forward (context.c) ---- */

/* A sequence of a context. */
struct ctx_seq {
    int used;
    int len;                /* KV positions held (= tokens evaluated) */
    struct kv_table kv;     /* its blocks */
    int ckpt_pos;           /* its recurrent state's checkpoint holds the state after ckpt_pos tokens (-1: none) */
};

/* The activation arena's buffers (backend memory) for n_batch rows. */
struct act_bufs {
    float *x, *xn, *q, *k, *v, *att, *gate, *up; /* (n_batch, width) */
    float *qg;                        /* (n_batch, 2 * n_head * head_dim) attn_out_gate */
    float *ple, *ple_tmp;             /* (n_batch, n_layer * ple_dim) Gemma 4 per-layer inputs, scratch */
    float *ple_g;                     /* (n_batch, ple_dim) a layer's per-layer input, then its gate */
    float *dn_in, *dn_conv, *dn_z, *dn_out, *dn_g, *dn_beta, *dn_qkvz, *dn_ba; /* DeltaNet */
    float *moe_prob, *moe_wsel;       /* (n_batch, n_expert), (n_batch, n_used) */
    int32_t *moe_sel;                 /* (n_batch, n_used) */
    float *moe_gate, *moe_up, *moe_y; /* (n_batch * n_used, n_ff_exp) x2, (n_batch * n_used, n_embd) */
    float *moe_acc, *moe_shy, *moe_shg; /* (n_batch, n_embd) x2, (n_batch) */
    float *sc_in, *sc_bx, *sc_conv;   /* short conv */
    float *inv_freq, *inv_freq_local; /* (n_batch or 1, rope n_dims / 2): a table per segment for dynamic RoPE */
    float *out_x;                     /* (OUT_CHUNK, n_embd) the rows whose outputs are wanted */
    float *logits;                    /* (OUT_CHUNK, n_vocab) */
    int32_t *out_idx;                 /* (n_batch) */
    float *taps;                      /* (n_taps, n_batch, n_embd) */
};

enum { OUT_CHUNK = 64 }; /* output rows through the final norm and lm_head at a time */

struct gerbil_context {
    struct gerbil_model *model;
    struct backend *be;
    int n_ctx, n_batch, n_seq_max;
    enum gb_type kv_type;
    /* the KV pool (backend memory): n_blocks * KV_BLOCK rows, each every attention layer's
     * K and V row (kv_stride elements); layer l's K of row 0 at kv_k[l], V at kv_v[l] */
    void *kv_mem;
    size_t kv_bytes;
    int kv_stride;
    void **kv_k, **kv_v;
    struct kv_blocks blocks;
    /* recurrent state (backend memory): n_seq_max slots, then n_seq_max checkpoints, each
     * slot_floats; layer l's conv state at conv_off[l], delta-rule state at delta_off[l] */
    float *rstate;
    size_t slot_floats;
    size_t *conv_off, *delta_off;
    struct ctx_seq *seqs;             /* [n_seq_max] */
    /* the arena */
    void *arena;
    size_t arena_bytes;
    struct act_bufs a;
    /* one forward's description (host), for n_batch rows */
    struct gb_seg *segs;
    int32_t *span, *seg_of, *tok, *kv_row, *pos;           /* (n_batch) gb_batch's arrays */
    int32_t *row_user, *row_rank;     /* (n_batch) a row's place in the caller's batch, its output number or -1 */
    int32_t *out_idx_host, *out_span, *out_user; /* (n_batch) output rows in lm_head order: row, span, number */
    int32_t *seg_seq, *seg_n, *seg_outs, *seg_sorted; /* (n_batch) per segment: sequence, rows, outputs, an order */
    int32_t *seq_rows, *seq_seg;      /* (n_seq_max) per sequence: rows counted, its segment */
    struct gb_seg *rsegs;             /* (n_batch) the recurrent segments (gb_batch.rsegs) */
    int32_t *seg_key, *seg_first, *seg_rw; /* (n_batch) per segment: sort key, first row segment, verify */
    float *freq_host;                 /* (n_batch, half) dynamic RoPE tables */
    float rope_scale[2];              /* [global, local] attention factors (YaRN) */
    int rope_dynamic[2];
    int embeddings;                   /* outputs: final-normed hidden states in `logits` ([cap_out][n_embd]) */
    int bidirectional;                /* attention sees the whole sequence */
    /* taps and outputs of the last eval (host) */
    int *tap_layers, n_taps;
    int n_out;
    float *logits;                    /* (cap_out, n_vocab) */
    float *hidden;                    /* (n_taps, cap_out, n_embd) */
    int cap_out;
    struct lora_fwd *lora;            /* the rows' adapters in a forward (lora.c), or NULL */
};

/* A context's internals shared with the session layer (context.c). */
gerbil_status ctx_eval(struct gerbil_context *cx, const gerbil_batch *b, float *dest);
void ctx_seq_reset(struct gerbil_context *cx, int32_t seq);
/* dst's sequence did becomes a copy of src's sid (KV rows, recurrent state, checkpoint). */
gerbil_status ctx_seq_copy(struct gerbil_context *dst, int32_t did, struct gerbil_context *src, int32_t sid);

/* A session: one sequence in a context of its own. */
struct gerbil_session {
    struct gerbil_model *model;
    struct gerbil_context *ctx;
    int32_t seq;
    int32_t *seq_ids;                 /* (n_batch) all seq */
    int8_t *flags;                    /* (n_batch) logits wanted */
    int32_t *adapters;                /* (n_batch) its adapter id, or NULL: the bare base */
};
/* gerbil_session_eval with progress(user, done, n) called before the first chunk and after
 * each (progress may be NULL). */
gerbil_status session_eval_progress(gerbil_session_t s, const int32_t *ids, int n, float *logits, int all_logits,
                                    void (*progress)(void *user, int done, int total), void *user);

/* Moonshine speech-to-text (moonshine.c): a folder whose config.json names it; load it
 * into m (config, checkpoint, backend, weights); free what it added. */
int moonshine_detect(const char *dir);
gerbil_status moonshine_load(struct gerbil_model *m, const char *dir, const gerbil_model_params *p,
                             const struct st_load_opts *lo);
void moonshine_free(struct gerbil_model *m);

/* Bind and validate the weights of cfg's architecture. */
gerbil_status llama_bind_weights(struct gerbil_model *m);

/* Weight binding helpers (bind.c), shared by llama.c and the layer files. */
struct binder {
    struct gerbil_model *m;
    float *f32_next;   /* bump pointer into m->f32_store */
    size_t f32_left;
    float norm_add;    /* added to RMSNorm weights: 1 for zero-centred norms stored as w - 1 */
    const float ***slots; /* the pointers bind_vector set, rebased when the block is uploaded */
    int n_slots, cap_slots;
};
gerbil_status bind_matrix(struct binder *b, const char *name, int64_t rows, int64_t cols, struct gb_weight *out);
/* A float tensor of n elements (any shape with that many) converted to f32, + add. */
gerbil_status bind_vector(struct binder *b, const char *name, int64_t n, float add, const float **out);
/* The vectors bound so far to backend memory in one block (m->f32_dev); the pointers
 * bind_vector set follow them. */
gerbil_status bind_upload_vectors(struct binder *b);

/* One forward's view for the layer code: the context, its batch, its rows. */
struct fwd {
    struct gerbil_context *c;
    const struct model_config *cfg;
    struct backend *be;
    const struct gb_batch *b;
    int n;                /* rows */
    struct gb_rows rows;  /* all of them, with their spans */
    int n_out;            /* rows whose outputs are wanted: a.out_idx[0 .. n_out) */
    const struct lora_fwd *lora; /* the rows' LoRA adapters, or NULL (lora_apply) */
};

/* The recurrent state of layer l: its conv window (off 0) or delta-rule state. */
static inline struct gb_state ctx_state(const struct gerbil_context *c, size_t off) {
    return (struct gb_state){c->rstate + off, c->slot_floats};
}

/* Gated DeltaNet layers (deltanet.c). */
size_t deltanet_f32_floats(const struct model_config *c);
gerbil_status deltanet_bind(struct binder *b, int layer, struct layer_weights *w);
/* xn: the normed input rows; the mixer output replaces xn. */
void deltanet_forward(const struct fwd *f, int layer);
/* Sparse MoE feed-forward (moe.c). */
gerbil_status moe_bind(struct binder *b, int layer, struct layer_weights *w, struct gb_weight *experts);
/* xn: the normed input rows; the block's output replaces xn. */
void moe_forward(const struct fwd *f, int layer);
/* LFM2 short-convolution layers (shortconv.c). */
size_t shortconv_f32_floats(const struct model_config *c);
gerbil_status shortconv_bind(struct binder *b, int layer, struct layer_weights *w);
/* xn: the normed input rows; the mixer output replaces xn. */
void shortconv_forward(const struct fwd *f, int layer);
/* x = the embeddings of the batch's token rows (rows given as embeddings are left alone). */
void llama_embed(const struct fwd *f);
/* The layers over a batch: x becomes the last hidden state; the output rows' hidden
 * states after the tapped layers are gathered into the taps. */
void llama_layers(const struct fwd *f);
/* The final norm, lm_head (and softcap) of rows out_x[0 .. n) (spans as given) into logits
 * ([n][n_vocab], backend memory). */
void llama_logits(const struct fwd *f, int n, const int32_t *span, float *logits);

/* Recurrent layers' state sizes: a layer's floats and its conv part (context.c, model.c). */
size_t layer_state_floats(const struct model_config *c, int l, size_t *conv);
size_t kv_bytes_per_token(const struct model_config *c, size_t elt);
enum { DEFAULT_MAX_CTX = 4096, DEFAULT_BATCH = 512 };

#endif
