/* A loaded model: hyperparameters + weight views into the loaded checkpoint. */
#ifndef GB_MODEL_H
#define GB_MODEL_H

#include "backend/ops.h"
#include "model/config.h"
#include "model/weights.h"

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
    struct gb_weight *experts;        /* 3 * n_expert per MoE layer, one block */
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
    void **k_cache, **v_cache;        /* [n_layer] -> rows of n_head_kv * head_dim, kv_stride apart */
    void *kv_mem;                     /* the mapping they point into, n_ctx positions of: */
    int kv_stride;                    /* every attention layer's K and V row (elements) */
    float *x, *xn, *q, *k, *v, *att, *gate, *up; /* (n_batch, width) */
    float *attn_scratch;              /* (n_threads, n_ctx) */
    /* recurrent layers: one block holding every layer's conv and delta-rule state, so
     * a snapshot is one copy; ckpt holds the state after token ckpt_pos (-1: none) */
    float *rstate, *ckpt;
    size_t rstate_floats;
    int ckpt_pos;
    float **conv_state;               /* [n_layer] -> (conv_kernel - 1, conv_dim) or NULL */
    float **delta_state;              /* [n_layer] -> (nv, dv, dk): S^T per value head, or NULL */
    /* conv_state of a LAYER_SHORTCONV layer: (conv_L_cache - 1, n_embd) */
    float *qg;                        /* (n_batch, 2 * n_head * head_dim) attn_out_gate */
    float *dn_in, *dn_conv, *dn_z, *dn_out, *dn_g, *dn_beta; /* (n_batch, ...) DeltaNet */
    float *dn_scratch;                /* (n_threads, delta_scratch_floats) */
    float *dn_qkvz, *dn_ba;           /* (n_batch, ...) fused projections before un-interleaving */
    /* MoE: router probabilities, each token's experts and weights, per-expert row lists */
    float *moe_prob;                  /* (n_batch, n_expert) */
    int32_t *moe_sel;                 /* (n_batch, n_used) */
    float *moe_wsel;                  /* (n_batch, n_used) */
    int32_t *moe_rows;                /* (n_batch): the tokens routed to one expert */
    float *moe_rw;                    /* (n_batch): their routing weights */
    float *moe_x, *moe_y, *moe_acc;   /* (n_batch, n_embd) */
    float *moe_shg;                   /* (n_batch) shared-expert gate logits */
    float *sc_in, *sc_bx, *sc_conv;   /* (n_batch, 3 * n_embd), (n_batch, n_embd) x2: short conv */
    float *inv_freq;                  /* (rope n_dims / 2) */
    float *inv_freq_local;            /* (rope_local n_dims / 2) when the model has a sliding-layer RoPE */
    int32_t *pos;                     /* (n_batch) */
};

/* Bind and validate the weights of cfg's architecture. */
gerbil_status llama_bind_weights(struct gerbil_model *m);

/* Weight binding helpers (llama.c), shared by the layer files. */
struct binder {
    struct gerbil_model *m;
    float *f32_next;   /* bump pointer into m->f32_store */
    size_t f32_left;
    float norm_add;    /* added to RMSNorm weights: 1 for zero-centred norms stored as w - 1 */
};
gerbil_status bind_matrix(struct binder *b, const char *name, int64_t rows, int64_t cols, struct gb_weight *out);
/* A float tensor of n elements (any shape with that many) converted to f32, + add. */
gerbil_status bind_vector(struct binder *b, const char *name, int64_t n, float add, const float **out);

/* Gated DeltaNet layers (deltanet.c). */
size_t deltanet_f32_floats(const struct model_config *c);
gerbil_status deltanet_bind(struct binder *b, int layer, struct layer_weights *w);
/* xn: the normed input rows; the mixer output replaces xn. */
void deltanet_forward(struct gerbil_session *s, int layer, int n);
/* Sparse MoE feed-forward (moe.c). */
gerbil_status moe_bind(struct binder *b, int layer, struct layer_weights *w, struct gb_weight *experts);
/* xn: the normed input rows; the block's output replaces xn. */
void moe_forward(struct gerbil_session *s, int layer, int n);
/* LFM2 short-convolution layers (shortconv.c). */
size_t shortconv_f32_floats(const struct model_config *c);
gerbil_status shortconv_bind(struct binder *b, int layer, struct layer_weights *w);
/* xn: the normed input rows; the mixer output replaces xn. */
void shortconv_forward(struct gerbil_session *s, int layer, int n);
/* Forward n (<= s->n_batch) tokens at s->n_past; logits: NULL, last row, or all rows. */
gerbil_status llama_forward(struct gerbil_session *s, const int32_t *ids, int n, float *logits, int all);

#endif
