/* Hyperparameters of a Llama-family model, read from config.json (and
 * generation_config.json). Architecture deltas are fields, not code paths; Gemma 3
 * is the family plus the fields marked "Gemma 3" below. */
#ifndef GB_MODEL_CONFIG_H
#define GB_MODEL_CONFIG_H

#include "gerbil.h"
#include <stdint.h>

enum model_arch {
    ARCH_LLAMA = 0, /* LlamaForCausalLM */
    ARCH_MISTRAL,   /* MistralForCausalLM */
    ARCH_QWEN2,     /* Qwen2ForCausalLM: q/k/v bias */
    ARCH_QWEN3,     /* Qwen3ForCausalLM: per-head q/k RMSNorm */
    ARCH_QWEN35,    /* Qwen3_5ForCausalLM / the text of Qwen3_5ForConditionalGeneration:
                       Gated DeltaNet layers + gated full attention */
    ARCH_GEMMA3,    /* Gemma3ForCausalLM, and the text tower of Gemma3ForConditionalGeneration */
    ARCH_QWEN3NEXT, /* Qwen3NextForCausalLM: Qwen3.5's hybrid with fused, per-key-head
                       interleaved DeltaNet input projections and sparse MoE feed-forwards */
    ARCH_LFM2,      /* Lfm2ForCausalLM (Liquid AI): gated short-convolution layers + attention
                       with per-head q/k norms; its own module names (see llama.c) */
    ARCH_GEMMA4,    /* Gemma4ForCausalLM, and the text tower of Gemma4ForConditionalGeneration:
                       Gemma 3's layout plus the fields marked "Gemma 4" below */
    ARCH_COUNT,
};

/* ROPE_PROPORTIONAL (Gemma 4's full layers): every head_dim/2 pair (i, i + head_dim/2) has a
 * frequency base^(-2i/head_dim) for i < prop_angles and 0 (no rotation) above. */
enum rope_type { ROPE_DEFAULT = 0, ROPE_LINEAR, ROPE_DYNAMIC, ROPE_LLAMA3, ROPE_YARN, ROPE_PROPORTIONAL };

/* The feed-forward activation applied to gate before the product with up. */
enum ffn_act { ACT_SILU = 0, ACT_GELU_TANH /* gelu_pytorch_tanh */ };

struct rope_config {
    enum rope_type type;
    double theta;
    double factor;             /* linear, dynamic, llama3, yarn */
    int n_dims;                /* rotated dims per head (head_dim * partial_rotary_factor) */
    int max_pos;               /* max_position_embeddings (dynamic: the trained length) */
    int orig_max_pos;          /* original_max_position_embeddings (llama3, yarn) */
    double low_freq_factor;    /* llama3 */
    double high_freq_factor;   /* llama3 */
    double attention_factor;   /* yarn: <= 0 means derive from factor / mscale */
    double beta_fast, beta_slow; /* yarn */
    double mscale, mscale_all_dim; /* yarn (DeepSeek style), 0 when absent */
    int truncate;              /* yarn: round the correction range to integers */
    int prop_angles;           /* proportional: rotated pairs, int(partial_rotary_factor * head_dim // 2) */
};

enum { MODEL_MAX_EOS = 8, MODEL_MAX_LAYERS = 1024 };
/* The largest integer a config.json size or GGUF u32 metadata value may hold (INT_MAX / 2),
 * so sums and products of two stay in range (docs/ARCHITECTURE.md, Limits). */
enum { CONFIG_MAX_INT = 1073741823 };

/* What mixes tokens in a layer. */
enum layer_kind {
    LAYER_ATTENTION = 0,   /* softmax attention over the KV cache */
    LAYER_DELTANET,        /* Gated DeltaNet (linear attention with a recurrent state) */
    LAYER_SHORTCONV,       /* LFM2 gated short convolution (a rolling conv state) */
};

/* LFM2 short-convolution hyperparameters. */
struct shortconv_config {
    int kernel;                /* conv_L_cache: taps of the causal depthwise conv */
    int bias;                  /* conv_bias: in_proj, conv and out_proj have biases */
};

/* Gated DeltaNet hyperparameters (Qwen3.5 / Qwen3-Next "linear_*"). */
struct deltanet_config {
    int n_k_heads, n_v_heads;  /* linear_num_key_heads, linear_num_value_heads */
    int k_dim, v_dim;          /* linear_key_head_dim, linear_value_head_dim */
    int conv_kernel;           /* linear_conv_kernel_dim */
    int v_heads_tiled;         /* value head h reads key head h % nk (GGUF order), not h / (nv / nk) */
    int fused_proj;            /* Qwen3-Next, bits FUSED_QKVZ / FUSED_BA: in_proj_qkvz / in_proj_ba,
                                  grouped per key head, instead of in_proj_qkv + in_proj_z / b + a */
};

enum { FUSED_QKVZ = 1, FUSED_BA = 2 };

/* Sparse mixture-of-experts feed-forward (Qwen3-Next): a router picks n_used of n_expert
 * SwiGLU experts per token; a shared SwiGLU expert is added, gated by a sigmoid. */
struct moe_config {
    int n_expert;              /* num_experts (0: no MoE layers) */
    int n_used;                /* num_experts_per_tok */
    int n_ff_exp;              /* moe_intermediate_size */
    int n_ff_shexp;            /* shared_expert_intermediate_size */
    int norm_topk_prob;        /* renormalise the selected probabilities to sum 1 */
};

/* MLX affine quantization declared in config.json ("quantization" or
 * "quantization_config"): defaults plus per-module overrides keyed by the module
 * path ("model.layers.0.mlp.down_proj": {"group_size": 64, "bits": 8}, or false for
 * a module left unquantized). */
struct mlx_quant_override {
    char *module;
    int bits, group_size; /* bits 0: not quantized */
};

struct mlx_quant {
    int bits, group_size; /* bits 0: the checkpoint is not MLX-quantized */
    int n_over;
    struct mlx_quant_override *over;
};

struct model_config {
    enum model_arch arch;
    char arch_name[64];        /* as in config.json "architectures" */
    int n_vocab;
    int n_embd;                /* hidden_size */
    int n_layer;
    int n_head;
    int n_head_kv;
    int head_dim;
    int n_ff;                  /* intermediate_size */
    float norm_eps;
    int n_ctx_train;           /* max_position_embeddings */
    int tie_embeddings;
    int attn_qkv_bias;         /* q/k/v projections have biases */
    int attn_o_bias;           /* o_proj has a bias (Llama attention_bias) */
    int mlp_bias;
    int qk_norm;               /* Qwen3 */
    int sliding_window;        /* 0: none */
    uint8_t *layer_sliding;    /* [n_layer]: 1 where the layer uses the window */
    uint8_t *layer_kind;       /* [n_layer]: enum layer_kind */
    struct deltanet_config dn; /* when any layer is LAYER_DELTANET */
    struct moe_config moe;
    uint8_t *layer_moe;        /* [n_layer]: 1 where the feed-forward is the MoE block */
    struct shortconv_config sc; /* when any layer is LAYER_SHORTCONV */
    int attn_out_gate;         /* q_proj also yields a per-head gate: out *= sigmoid(gate) (Qwen3.5) */
    struct rope_config rope;
    int has_rope_local;        /* Gemma 3: sliding layers rotate with rope_local (own base, no scaling) */
    struct rope_config rope_local;
    enum ffn_act act;
    int norm_add_one;          /* Gemma 3 HF/MLX checkpoints: norms scale by (1 + w); added once at load
                                  (GGUF files store 1 + w already) */
    int post_norms;            /* Gemma 3: RMSNorm on the attention output and on the ffn output before each
                                  residual add; the ffn input norm is pre_feedforward_layernorm */
    int embd_scale;            /* Gemma 3: embeddings multiplied by sqrt(n_embd) (rounding: see llama.c) */
    float attn_scale;          /* q.k multiplier; 0: 1/sqrt(head_dim) */
    float final_softcap;       /* logits = cap * tanh(logits / cap); 0: none */
    /* Gemma 4 (each 0 / NULL elsewhere) */
    int head_dim_full;         /* full_attention layers' head_dim (global_head_dim); 0: head_dim */
    int n_head_kv_full;        /* their KV heads (num_global_key_value_heads); 0: n_head_kv */
    int attn_k_eq_v;           /* full layers have no v_proj: v is the k projection (before k_norm) */
    int v_norm;                /* values RMS-normalised per head, without a weight */
    int n_kv_shared;           /* num_kv_shared_layers: the last n layers reuse the KV of layer_kv_src */
    int32_t *layer_kv_src;     /* [n_layer] the layer whose KV cache a layer reads (itself unless shared) */
    int ff_wide_shared;        /* use_double_wide_mlp: the KV-shared layers' ffn is 2 * n_ff wide */
    int ple_dim;               /* hidden_size_per_layer_input: per-layer embeddings (0: none) */
    int ple_vocab;             /* vocab_size_per_layer_input */
    int layer_scalar;          /* each layer's output multiplied by its layer_scalar */
    char dtype[16];            /* torch_dtype / dtype as declared */
    struct mlx_quant mlx;
    int rope_interleaved;      /* rotate pairs (2i, 2i+1): GGUF "llama" checkpoints, whose
                                  q/k rows the converter permuted for it */
    int no_lm_head;            /* a bare transformer (Qwen3Model, Gemma3TextModel): hidden states only */
    int bidirectional;         /* attention sees the whole sequence, not only earlier positions
                                  (use_bidirectional_attention); sliding windows are symmetric */
    int32_t bos_id;            /* -1: none */
    int n_eos;
    int32_t eos_ids[MODEL_MAX_EOS];
};

/* Per-layer attention geometry and ffn width (Gemma 4's full layers differ from its sliding ones). */
static inline int layer_head_dim(const struct model_config *c, int l) {
    return c->head_dim_full && !c->layer_sliding[l] ? c->head_dim_full : c->head_dim;
}
static inline int layer_n_kv(const struct model_config *c, int l) {
    return c->n_head_kv_full && !c->layer_sliding[l] ? c->n_head_kv_full : c->n_head_kv;
}
static inline int layer_kv_shared(const struct model_config *c, int l) {
    return c->layer_kv_src && c->layer_kv_src[l] != l;
}
static inline int layer_n_ff(const struct model_config *c, int l) {
    return c->ff_wide_shared && layer_kv_shared(c, l) ? 2 * c->n_ff : c->n_ff;
}
static inline int max_head_dim(const struct model_config *c) {
    return c->head_dim_full > c->head_dim ? c->head_dim_full : c->head_dim;
}

/* Read dir/config.json (+ dir/generation_config.json when present) and validate. */
gerbil_status model_config_load(const char *dir, struct model_config *cfg);
void model_config_free(struct model_config *cfg);
/* The MLX quantization of module (e.g. "model.layers.3.self_attn.q_proj"): bits 0 = plain. */
void mlx_quant_for(const struct mlx_quant *q, const char *module, int *bits, int *group_size);
/* Fill cfg from a GGUF file's metadata (src/model/config_gguf.c). */
struct gguf_file;
gerbil_status model_config_from_gguf(const struct gguf_file *f, const char *path, struct model_config *cfg);
/* Gemma 4 KV sharing (both loaders): cfg->layer_kv_src from n_kv_shared and the layer types. */
gerbil_status model_kv_sources(const char *path, struct model_config *cfg);
/* Shared by both loaders: the architecture from its HF class or model_type name. */
int model_arch_from_name(const char *hf_class, const char *model_type, enum model_arch *out);
const char *model_arch_name(enum model_arch a);

#endif
