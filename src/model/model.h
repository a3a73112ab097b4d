/* A loaded model: hyperparameters + weight views into the loaded checkpoint. */
#ifndef GB_MODEL_H
#define GB_MODEL_H

#include "backend/ops.h"
#include "model/config.h"
#include "model/weights.h"

struct layer_weights {
    const float *attn_norm;           /* (n_embd) */
    struct gb_weight wq;       /* (n_head * head_dim, n_embd) */
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
};

struct gerbil_model {
    struct model_config cfg;
    struct weight_source src;
    threadpool_t *tp;
    int reference_kernels;
    struct gb_weight tok_embd;        /* (n_vocab, n_embd) */
    const float *out_norm;            /* (n_embd) */
    struct gb_weight lm_head;         /* (n_vocab, n_embd); == tok_embd when tied */
    float embd_scale;                 /* embeddings multiplied by this (Gemma 3); 0: not scaled */
    struct layer_weights *layers;     /* [n_layer] */
    float *f32_store;                 /* norms and biases converted to f32, one block */
    size_t weight_bytes;
    int64_t n_params;
};

/* Per-sequence state and the activation buffers of one forward (sized at creation:
 * nothing is allocated while decoding). */
struct gerbil_session {
    struct gerbil_model *model;
    struct backend be;                /* the model's thread pool + this session's matmul scratch */
    int n_ctx, n_past, n_batch;
    enum gb_type kv_type;
    void **k_cache, **v_cache;        /* [n_layer] -> (n_ctx, n_head_kv * head_dim) */
    float *x, *xn, *q, *k, *v, *att, *gate, *up; /* (n_batch, width) */
    float *attn_scratch;              /* (n_threads, n_ctx) */
    float *inv_freq;                  /* (rope n_dims / 2) */
    float *inv_freq_local;            /* (rope_local n_dims / 2) when the model has a sliding-layer RoPE */
    int32_t *pos;                     /* (n_batch) */
};

/* Bind and validate the weights of cfg's architecture. */
gerbil_status llama_bind_weights(struct gerbil_model *m);
/* Forward n (<= s->n_batch) tokens at s->n_past; logits: NULL, last row, or all rows. */
gerbil_status llama_forward(struct gerbil_session *s, const int32_t *ids, int n, float *logits, int all);

#endif
