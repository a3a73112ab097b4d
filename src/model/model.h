/* A loaded model: hyperparameters + weight views into the mmap'd checkpoint. */
#ifndef GB_MODEL_H
#define GB_MODEL_H

#include "backend/ops.h"
#include "io/safetensors.h"
#include "model/config.h"

struct layer_weights {
    const float *attn_norm;           /* (n_embd) */
    const struct gb_tensor *wq;       /* (n_head * head_dim, n_embd) */
    const struct gb_tensor *wk;       /* (n_head_kv * head_dim, n_embd) */
    const struct gb_tensor *wv;       /* (n_head_kv * head_dim, n_embd) */
    const struct gb_tensor *wo;       /* (n_embd, n_head * head_dim) */
    const float *bq, *bk, *bv, *bo;   /* biases or NULL */
    const float *q_norm, *k_norm;     /* (head_dim) Qwen3, else NULL */
    const float *ffn_norm;            /* (n_embd) */
    const struct gb_tensor *w_gate;   /* (n_ff, n_embd) */
    const struct gb_tensor *w_up;     /* (n_ff, n_embd) */
    const struct gb_tensor *w_down;   /* (n_embd, n_ff) */
    const float *b_gate, *b_up, *b_down;
};

struct gerbil_model {
    struct model_config cfg;
    struct st_checkpoint ck;
    struct backend be;
    const struct gb_tensor *tok_embd; /* (n_vocab, n_embd) */
    const float *out_norm;            /* (n_embd) */
    const struct gb_tensor *lm_head;  /* (n_vocab, n_embd); == tok_embd when tied */
    struct layer_weights *layers;     /* [n_layer] */
    float *f32_store;                 /* norms and biases converted to f32, one block */
    size_t weight_bytes;
    int64_t n_params;
};

/* Per-sequence state and the activation buffers of one forward (sized at creation:
 * nothing is allocated while decoding). */
struct gerbil_session {
    struct gerbil_model *model;
    int n_ctx, n_past, n_batch;
    enum gb_type kv_type;
    void **k_cache, **v_cache;        /* [n_layer] -> (n_ctx, n_head_kv * head_dim) */
    float *x, *xn, *q, *k, *v, *att, *gate, *up; /* (n_batch, width) */
    float *attn_scratch;              /* (n_threads, n_ctx) */
    float *inv_freq;                  /* (rope n_dims / 2) */
    int32_t *pos;                     /* (n_batch) */
};

/* Bind and validate the weights of cfg's architecture. */
gerbil_status llama_bind_weights(struct gerbil_model *m);
/* Forward n (<= s->n_batch) tokens at s->n_past; logits: NULL, last row, or all rows. */
gerbil_status llama_forward(struct gerbil_session *s, const int32_t *ids, int n, float *logits, int all);

#endif
