/* The Llama family: Llama, Mistral, Qwen2 (q/k/v bias), Qwen3 (per-head q/k norm),
 * Gemma 3 (q/k norm, (1 + w) norms, norms after attention and ffn, scaled embeddings,
 * GELU-tanh, a RoPE of their own for sliding layers, logit soft-capping) and the hybrids
 * built on it: Qwen3.5 (Gated DeltaNet layers beside gated attention, deltanet.c),
 * Qwen3-Next (the same plus sparse MoE feed-forwards, moe.c) and LFM2 (gated
 * short-convolution layers beside attention with q/k norms, shortconv.c). One forward;
 * the differences are config fields, per-layer kinds and module names. */
#include "model/model.h"
#include "base/fp16.h"
#include "base/status.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- binding ---- */

/* Norms that scale by (1 + w) (Gemma 3, the Qwen hybrids): checkpoints store w and torch
 * adds 1.0 to the f32 weight on every call; adding it once at load gives the same f32
 * numbers. GGUF conversions store 1 + w already; Qwen3.5 / Qwen3-Next MLX conversions
 * usually do (mlx-lm's sanitize), which the weights' values tell (norm_weights_shifted). */
static float norm_offset(const struct gerbil_model *m) {
    const struct model_config *c = &m->cfg;
    if (!c->norm_add_one || m->src.is_gguf) return 0.0f;
    if (c->arch != ARCH_QWEN35 && c->arch != ARCH_QWEN3NEXT) return 1.0f;
    const struct gb_tensor *t = wsrc_find(&m->src, "model.layers.0.input_layernorm.weight");
    return t && norm_weights_shifted(t) ? 0.0f : 1.0f;
}

/* transformers multiplies the embeddings by hidden_size ** 0.5 cast to the embedding
 * weight's dtype (bf16: sqrt(3072) = 55.4256 becomes 55.5); llama.cpp by sqrtf(n_embd). */
static float embedding_scale_of(const struct gerbil_model *m, const struct gb_weight *e, int dim) {
    float s = (float)sqrt((double)dim);
    if (m->src.is_gguf) return sqrtf((float)dim);
    enum gb_type t = e->kind == GB_WEIGHT_MLX ? e->sb_type : e->type;
    if (t == GB_TYPE_BF16) return bf16_to_f32(f32_to_bf16(s));
    if (t == GB_TYPE_F16) return f16_to_f32(f32_to_f16(s));
    return s;
}
static float embedding_scale(const struct gerbil_model *m) { return embedding_scale_of(m, &m->tok_embd, m->cfg.n_embd); }

/* A vector of n ones in the f32 block (Gemma 4's weightless value norm). */
static gerbil_status bind_ones(struct binder *b, int64_t n, const float **out) {
    if (b->n_slots == b->cap_slots) {
        int cap = b->cap_slots ? 2 * b->cap_slots : 256;
        const float ***ns = realloc(b->slots, (size_t)cap * sizeof *ns);
        if (!ns) return err_set(GERBIL_ERR_NOMEM, "out of memory binding weights");
        b->slots = ns;
        b->cap_slots = cap;
    }
    GB_ASSERT((size_t)n <= b->f32_left);
    b->slots[b->n_slots++] = out;
    for (int64_t i = 0; i < n; i++) b->f32_next[i] = 1.0f;
    *out = b->f32_next;
    b->f32_next += n;
    b->f32_left -= (size_t)n;
    return GERBIL_OK;
}

/* A one-element float tensor's value (Gemma 4 layer_scalar), read on the host. */
static gerbil_status read_scalar(struct binder *b, const char *name, float *out) {
    const struct gb_tensor *t = wsrc_find(&b->m->src, name);
    char fname[256];
    if (!t)
        return err_set(GERBIL_ERR_FORMAT, "missing tensor \"%s\"", wsrc_file_name(&b->m->src, name, fname, sizeof fname));
    if (tensor_nelements(t) != 1 || !type_traits(t->type)->is_float)
        return err_set(GERBIL_ERR_FORMAT, "tensor \"%s\": expected one float, found %lld elements of %s", t->name,
                       (long long)tensor_nelements(t), type_name(t->type));
    unsigned char raw[8] = {0};
    memcpy(raw, t->data, type_traits(t->type)->type_size); /* the file may leave it unaligned */
    type_to_f32(t->type, raw, out, 1);
    if (!isfinite(*out)) return err_set(GERBIL_ERR_FORMAT, "tensor \"%s\" is not finite", t->name);
    b->m->weight_bytes += t->nbytes;
    b->m->n_params += 1;
    return GERBIL_OK;
}

/* Gemma 4's per-layer-embedding weights of the model, and of layer l (l < 0: the model's). */
static gerbil_status ple_bind(struct binder *b, int l, struct layer_weights *w) {
    struct gerbil_model *m = b->m;
    const struct model_config *c = &m->cfg;
    const int64_t D = c->n_embd, P = c->ple_dim;
    char name[256];
    if (l < 0) {
        GB_TRY(bind_matrix(b, "model.embed_tokens_per_layer.weight", c->ple_vocab, P * c->n_layer, &m->ple_embd));
        GB_TRY(bind_matrix(b, "model.per_layer_model_projection.weight", P * c->n_layer, D, &m->ple_model_proj));
        GB_TRY(bind_vector(b, "model.per_layer_projection_norm.weight", P, 0, &m->ple_proj_norm));
        m->ple_embd_scale = embedding_scale_of(m, &m->ple_embd, (int)P);
        return GERBIL_OK;
    }
    snprintf(name, sizeof name, "model.layers.%d.per_layer_input_gate.weight", l);
    GB_TRY(bind_matrix(b, name, P, D, &w->w_ple_gate));
    snprintf(name, sizeof name, "model.layers.%d.per_layer_projection.weight", l);
    GB_TRY(bind_matrix(b, name, D, P, &w->w_ple_proj));
    snprintf(name, sizeof name, "model.layers.%d.post_per_layer_input_norm.weight", l);
    return bind_vector(b, name, D, 0, &w->ple_post_norm);
}

/* Module names of an architecture's checkpoints, Hugging Face spelling (GGUF files are
 * asked by the same names; weights.c translates them). Layer modules are relative to
 * model.layers.N; attn_post / ffn_post only with post_norms. */
struct module_names {
    const char *final_norm;
    const char *attn_norm, *ffn_norm, *attn_post, *ffn_post;
    const char *q, *k, *v, *o, *q_norm, *k_norm;
    const char *gate, *up, *down;
};

static const struct module_names llama_names = {
    .final_norm = "model.norm", .attn_norm = "input_layernorm", .ffn_norm = "post_attention_layernorm",
    .q = "self_attn.q_proj", .k = "self_attn.k_proj", .v = "self_attn.v_proj", .o = "self_attn.o_proj",
    .q_norm = "self_attn.q_norm", .k_norm = "self_attn.k_norm",
    .gate = "mlp.gate_proj", .up = "mlp.up_proj", .down = "mlp.down_proj",
};

/* Gemma 3: a norm before and after each of attention and the feed-forward. */
static const struct module_names gemma3_names = {
    .final_norm = "model.norm", .attn_norm = "input_layernorm", .ffn_norm = "pre_feedforward_layernorm",
    .attn_post = "post_attention_layernorm", .ffn_post = "post_feedforward_layernorm",
    .q = "self_attn.q_proj", .k = "self_attn.k_proj", .v = "self_attn.v_proj", .o = "self_attn.o_proj",
    .q_norm = "self_attn.q_norm", .k_norm = "self_attn.k_norm",
    .gate = "mlp.gate_proj", .up = "mlp.up_proj", .down = "mlp.down_proj",
};

/* Lfm2DecoderLayer: operator_norm before the mixer, ffn_norm before feed_forward (w1 gate,
 * w3 up, w2 down); Lfm2Model applies embedding_norm after the last layer (it is the final
 * norm, not a norm of the embeddings). */
static const struct module_names lfm2_names = {
    .final_norm = "model.embedding_norm", .attn_norm = "operator_norm", .ffn_norm = "ffn_norm",
    .q = "self_attn.q_proj", .k = "self_attn.k_proj", .v = "self_attn.v_proj", .o = "self_attn.out_proj",
    .q_norm = "self_attn.q_layernorm", .k_norm = "self_attn.k_layernorm",
    .gate = "feed_forward.w1", .up = "feed_forward.w3", .down = "feed_forward.w2",
};

static const struct module_names *module_names_for(const struct model_config *c) {
    if (c->arch == ARCH_LFM2) return &lfm2_names;
    return c->post_norms ? &gemma3_names : &llama_names;
}

/* Every weight of the model into b (which it sets up): matrices handed to the backend,
 * vectors converted on the host. */
static gerbil_status bind_all(struct gerbil_model *m, struct binder *b) {
    const struct model_config *c = &m->cfg;
    const int64_t D = c->n_embd, F = c->n_ff, Q = (int64_t)c->n_head * c->head_dim,
                  KV = (int64_t)c->n_head_kv * c->head_dim;
    /* Upper bound of f32 vector elements: norms, biases, q/k norms, DeltaNet vectors. */
    const int64_t HDM = max_head_dim(c), QM = (int64_t)c->n_head * HDM, FM = c->ff_wide_shared ? 2 * F : F;
    size_t per_layer = (size_t)(4 * D + 2 * QM + 2 * (int64_t)c->n_head * HDM + D + 3 * HDM + 2 * FM + D) +
                       deltanet_f32_floats(c) + shortconv_f32_floats(c) + (c->layer_scalar ? 1 : 0) +
                       (c->ple_dim ? (size_t)D : 0);
    size_t total = per_layer * (size_t)c->n_layer + (size_t)D + (size_t)c->ple_dim;
    int n_moe = 0;
    for (int l = 0; c->layer_moe && l < c->n_layer; l++) n_moe += c->layer_moe[l];
    m->f32_store = malloc(total * sizeof(float));
    m->layers = calloc((size_t)c->n_layer, sizeof *m->layers);
    if (n_moe) m->experts = calloc((size_t)n_moe * 3 * (size_t)c->moe.n_expert, sizeof *m->experts);
    if (!m->f32_store || !m->layers || (n_moe && !m->experts))
        return err_set(GERBIL_ERR_NOMEM, "out of memory binding weights");
    struct gb_weight *experts = m->experts;
    *b = (struct binder){.m = m, .f32_next = m->f32_store, .f32_left = total, .norm_add = norm_offset(m)};

    GB_TRY(bind_matrix(b, "model.embed_tokens.weight", c->n_vocab, D, &m->tok_embd));
    const struct module_names *nm = module_names_for(c);
    char name[256];
    snprintf(name, sizeof name, "%s.weight", nm->final_norm);
    GB_TRY(bind_vector(b, name, D, b->norm_add, &m->out_norm));
    if (c->no_lm_head) {
        /* an embedding model: hidden states only (contexts with embeddings = 1) */
    } else if (c->tie_embeddings) {
        m->lm_head = m->tok_embd;
    } else {
        if (!wsrc_find(&m->src, "lm_head.weight"))
            return err_set(GERBIL_ERR_FORMAT, "missing tensor \"lm_head.weight\" "
                           "(config.json says tie_word_embeddings is false)");
        GB_TRY(bind_matrix(b, "lm_head.weight", c->n_vocab, D, &m->lm_head));
    }
    m->embd_scale = c->embd_scale ? embedding_scale(m) : 0.0f;
    if (c->ple_dim) GB_TRY(ple_bind(b, -1, NULL));

#define NAME(mod, what) (snprintf(name, sizeof name, "model.layers.%d.%s.%s", l, nm->mod, what), name)
    for (int l = 0; l < c->n_layer; l++) {
        struct layer_weights *w = &m->layers[l];
        /* Gemma 4: this layer's geometry */
        const int64_t hd = layer_head_dim(c, l), Ql = (int64_t)c->n_head * hd, KVl = (int64_t)layer_n_kv(c, l) * hd,
                      Fl = layer_n_ff(c, l);
        const int shared = layer_kv_shared(c, l), no_v = c->attn_k_eq_v && !c->layer_sliding[l];
        GB_TRY(bind_vector(b, NAME(attn_norm, "weight"), D, b->norm_add, &w->attn_norm));
        GB_TRY(bind_vector(b, NAME(ffn_norm, "weight"), D, b->norm_add, &w->ffn_norm));
        if (c->post_norms) {                                          /* Gemma 3 */
            GB_TRY(bind_vector(b, NAME(attn_post, "weight"), D, b->norm_add, &w->attn_post_norm));
            GB_TRY(bind_vector(b, NAME(ffn_post, "weight"), D, b->norm_add, &w->ffn_post_norm));
        }
        if (c->layer_moe && c->layer_moe[l]) {
            GB_TRY(moe_bind(b, l, w, experts));
            experts += 3 * (size_t)c->moe.n_expert;
        } else {
            GB_TRY(bind_matrix(b, NAME(gate, "weight"), Fl, D, &w->w_gate));
            GB_TRY(bind_matrix(b, NAME(up, "weight"), Fl, D, &w->w_up));
            GB_TRY(bind_matrix(b, NAME(down, "weight"), D, Fl, &w->w_down));
        }
        if (c->ple_dim) GB_TRY(ple_bind(b, l, w));
        if (c->layer_scalar) { /* a host value: op_scale takes it by value */
            snprintf(name, sizeof name, "model.layers.%d.layer_scalar", l);
            GB_TRY(read_scalar(b, name, &w->out_scale));
        }
        if (c->mlp_bias) {
            GB_TRY(bind_vector(b, NAME(gate, "bias"), F, 0, &w->b_gate));
            GB_TRY(bind_vector(b, NAME(up, "bias"), F, 0, &w->b_up));
            GB_TRY(bind_vector(b, NAME(down, "bias"), D, 0, &w->b_down));
        }
        if (c->layer_kind[l] == LAYER_DELTANET) {
            GB_TRY(deltanet_bind(b, l, w));
            continue;
        }
        if (c->layer_kind[l] == LAYER_SHORTCONV) {
            GB_TRY(shortconv_bind(b, l, w));
            continue;
        }
        (void)Q;
        (void)KV;
        GB_TRY(bind_matrix(b, NAME(q, "weight"), c->attn_out_gate ? 2 * Ql : Ql, D, &w->wq));
        if (!shared) GB_TRY(bind_matrix(b, NAME(k, "weight"), KVl, D, &w->wk));
        if (!shared && !no_v) GB_TRY(bind_matrix(b, NAME(v, "weight"), KVl, D, &w->wv));
        GB_TRY(bind_matrix(b, NAME(o, "weight"), D, Ql, &w->wo));
        if (c->attn_qkv_bias) {
            GB_TRY(bind_vector(b, NAME(q, "bias"), c->attn_out_gate ? 2 * Ql : Ql, 0, &w->bq));
            if (!shared) GB_TRY(bind_vector(b, NAME(k, "bias"), KVl, 0, &w->bk));
            if (!shared && !no_v) GB_TRY(bind_vector(b, NAME(v, "bias"), KVl, 0, &w->bv));
        }
        if (c->attn_o_bias) GB_TRY(bind_vector(b, NAME(o, "bias"), D, 0, &w->bo));
        if (c->qk_norm) {
            GB_TRY(bind_vector(b, NAME(q_norm, "weight"), hd, b->norm_add, &w->q_norm));
            if (!shared) GB_TRY(bind_vector(b, NAME(k_norm, "weight"), hd, b->norm_add, &w->k_norm));
        }
        if (c->v_norm && !shared) GB_TRY(bind_ones(b, hd, &w->v_ones));
    }
#undef NAME
    return GERBIL_OK;
}

gerbil_status llama_bind_weights(struct gerbil_model *m) {
    struct binder b = {.m = m};
    gerbil_status st = bind_all(m, &b);
    if (st == GERBIL_OK) st = bind_upload_vectors(&b);
    free(b.slots);
    return st;
}

/* ---- forward ---- */

/* Self-attention of layer l over each sequence's KV blocks: xn (normed input) -> xn (output). */
static void attention_block(const struct fwd *f, int l) {
    const struct model_config *c = f->cfg;
    struct gerbil_context *cx = f->c;
    const struct layer_weights *w = &cx->model->layers[l];
    struct backend *be = f->be;
    const struct act_bufs *a = &cx->a;
    const int n = f->n, hd = layer_head_dim(c, l), nkv = layer_n_kv(c, l), Q = c->n_head * hd, KV = nkv * hd;
    const int shared = layer_kv_shared(c, l);                        /* Gemma 4: K, V from an earlier layer */

    if (c->attn_out_gate) {                                          /* Qwen3.5: [q | gate] per head */
        op_matmul(be, a->qg, a->xn, &w->wq, w->bq, f->rows);
        lora_apply(f, l, LT_Q, a->qg, a->xn);                        /* LoRA on q_proj: [q | gate] */
        op_copy_strided(be, a->q, Q, hd, a->qg, 2 * Q, 2 * hd, n, c->n_head, hd);
        op_copy_strided(be, a->gate, Q, hd, a->qg + hd, 2 * Q, 2 * hd, n, c->n_head, hd);
        op_matmul(be, a->k, a->xn, &w->wk, w->bk, f->rows);          /* k = xn Wk^T */
        op_matmul(be, a->v, a->xn, &w->wv, w->bv, f->rows);          /* v = xn Wv^T */
        lora_apply(f, l, LT_K, a->k, a->xn);
        lora_apply(f, l, LT_V, a->v, a->xn);
    } else if (shared) {                                             /* Gemma 4: q only */
        op_matmul(be, a->q, a->xn, &w->wq, w->bq, f->rows);
        lora_apply(f, l, LT_Q, a->q, a->xn);
    } else if (!w->wv.data) {                                        /* Gemma 4 attention_k_eq_v: v = k */
        float *const ys[2] = {a->q, a->k};
        const struct gb_weight *const ws[2] = {&w->wq, &w->wk};
        const float *const bs[2] = {w->bq, w->bk};
        op_matmul_multi(be, 2, ys, a->xn, ws, bs, f->rows);
        lora_apply(f, l, LT_Q, a->q, a->xn);
        lora_apply(f, l, LT_K, a->k, a->xn);                         /* v is k_proj's output, adapter included */
        op_copy_strided(be, a->v, KV, 0, a->k, KV, 0, n, 1, KV);
    } else {                                                         /* q, k, v = xn W^T */
        float *const ys[3] = {a->q, a->k, a->v};
        const struct gb_weight *const ws[3] = {&w->wq, &w->wk, &w->wv};
        const float *const bs[3] = {w->bq, w->bk, w->bv};
        op_matmul_multi(be, 3, ys, a->xn, ws, bs, f->rows);
        lora_apply(f, l, LT_Q, a->q, a->xn);                         /* + LoRA, per row's adapter */
        lora_apply(f, l, LT_K, a->k, a->xn);
        lora_apply(f, l, LT_V, a->v, a->xn);
    }
    if (w->q_norm) {                                                 /* Qwen3, LFM2, Gemma: per-head norms */
        op_rmsnorm(be, a->q, a->q, w->q_norm, c->norm_eps, n * c->n_head, hd);
        if (!shared) op_rmsnorm(be, a->k, a->k, w->k_norm, c->norm_eps, n * nkv, hd);
    }
    if (w->v_ones) op_rmsnorm(be, a->v, a->v, w->v_ones, c->norm_eps, n * nkv, hd); /* Gemma 4: v_norm */
    const int local = c->has_rope_local && c->layer_sliding[l];      /* Gemma: sliding layers' RoPE */
    const struct rope_config *rc = local ? &c->rope_local : &c->rope;
    const float *inv_freq = local ? a->inv_freq_local : a->inv_freq;
    const int32_t *freq = cx->rope_dynamic[local] ? f->b->seg_of : NULL; /* dynamic: a table per sequence */
    op_rope(be, a->q, f->b->pos, freq, inv_freq, cx->rope_scale[local], n, c->n_head, hd, rc->n_dims,
            c->rope_interleaved);
    if (!shared) {
        op_rope(be, a->k, f->b->pos, freq, inv_freq, cx->rope_scale[local], n, nkv, hd, rc->n_dims,
                c->rope_interleaved);
        op_kv_store(be, cx->kv_k[l], cx->kv_type, a->k, f->b->kv_row, n, KV, cx->kv_stride); /* cache k, v */
        op_kv_store(be, cx->kv_v[l], cx->kv_type, a->v, f->b->kv_row, n, KV, cx->kv_stride);
    }
    struct attn_args aa = {
        .q = a->q, .out = a->att, .k_cache = cx->kv_k[l], .v_cache = cx->kv_v[l],
        .kv_type = cx->kv_type, .kv_stride = cx->kv_stride, .n_head = c->n_head,
        .n_head_kv = nkv, .head_dim = hd,
        .window = c->layer_sliding[l] ? c->sliding_window : 0, .bidirectional = cx->bidirectional,
        .scale = c->attn_scale != 0.0f ? c->attn_scale : 1.0f / sqrtf((float)hd),
        .segs = f->b->segs, .n_segs = f->b->n_segs,
    };
    op_attention(be, &aa);                                           /* att = softmax(q k^T) v */
    if (c->attn_out_gate) op_sigmoid_mul(be, a->att, a->att, a->gate, (long)n * Q);
    op_matmul(be, a->xn, a->att, &w->wo, w->bo, f->rows);            /* xn = att Wo^T */
    lora_apply(f, l, LT_O, a->xn, a->att);
    if (w->attn_post_norm)                                           /* Gemma: xn = norm(xn) */
        op_rmsnorm(be, a->xn, a->xn, w->attn_post_norm, c->norm_eps, n, c->n_embd);
}

/* Gated feed-forward of layer l (SwiGLU, or GELU-tanh for Gemma): xn (normed input) -> xn. */
static void ffn_block(const struct fwd *f, int l) {
    const struct model_config *c = f->cfg;
    const struct layer_weights *w = &f->c->model->layers[l];
    struct backend *be = f->be;
    const struct act_bufs *a = &f->c->a;
    const long nf = (long)f->n * layer_n_ff(c, l);
    float *const ys[2] = {a->gate, a->up};                           /* gate, up = xn W^T */
    const struct gb_weight *const ws[2] = {&w->w_gate, &w->w_up};
    const float *const bs[2] = {w->b_gate, w->b_up};
    op_matmul_multi(be, 2, ys, a->xn, ws, bs, f->rows);
    lora_apply(f, l, LT_GATE, a->gate, a->xn);
    lora_apply(f, l, LT_UP, a->up, a->xn);
    if (c->act == ACT_GELU_TANH) op_gelu_tanh_mul(be, a->gate, a->gate, a->up, nf);
    else op_silu_mul(be, a->gate, a->gate, a->up, nf);               /* gate = act(gate) * up */
    op_matmul(be, a->xn, a->gate, &w->w_down, w->b_down, f->rows);   /* xn = gate Wd^T */
    lora_apply(f, l, LT_DOWN, a->xn, a->gate);
    if (w->ffn_post_norm)                                            /* Gemma: xn = norm(xn) */
        op_rmsnorm(be, a->xn, a->xn, w->ffn_post_norm, c->norm_eps, f->n, c->n_embd);
}

/* Gemma 4 per-layer inputs of the batch (Gemma4TextModel.get_per_layer_inputs and
 * project_per_layer_inputs): ple = (norm(x Wp^T / sqrt(D)) + embed_per_layer(ids) * sqrt(P)) / sqrt(2),
 * the norm over each layer's P values; x is the scaled embedding. */
static void ple_inputs(const struct fwd *f) {
    const struct gerbil_model *m = f->c->model;
    const struct model_config *c = f->cfg;
    const struct act_bufs *a = &f->c->a;
    struct backend *be = f->be;
    const long LP = (long)c->n_layer * c->ple_dim, nlp = (long)f->n * LP;
    op_get_rows(be, a->ple_tmp, &m->ple_embd, f->b->tok, f->n);
    op_scale(be, a->ple_tmp, m->ple_embd_scale, nlp);
    op_matmul(be, a->ple, a->x, &m->ple_model_proj, NULL, f->rows);
    op_scale(be, a->ple, (float)pow((double)c->n_embd, -0.5), nlp);
    op_rmsnorm(be, a->ple, a->ple, m->ple_proj_norm, c->norm_eps, f->n * c->n_layer, c->ple_dim);
    op_add(be, a->ple, a->ple_tmp, nlp);
    op_scale(be, a->ple, (float)pow(2.0, -0.5), nlp);
}

void llama_embed(const struct fwd *f) {
    const struct gerbil_model *m = f->c->model;
    op_get_rows(f->be, f->c->a.x, &m->tok_embd, f->b->tok, f->n);   /* x = embed(ids) */
    if (m->embd_scale != 0.0f)                                       /* Gemma: x *= sqrt(D) */
        op_scale(f->be, f->c->a.x, m->embd_scale, (long)f->n * m->cfg.n_embd);
    if (m->cfg.ple_dim) ple_inputs(f);                               /* Gemma 4 */
}

/* Gemma 4, the end of layer l: x += norm(gelu(x Wg^T) * ple_l Wproj^T); x *= layer_scalar. */
static void ple_block(const struct fwd *f, int l) {
    const struct model_config *c = f->cfg;
    const struct layer_weights *w = &f->c->model->layers[l];
    const struct act_bufs *a = &f->c->a;
    struct backend *be = f->be;
    const int P = c->ple_dim, D = c->n_embd, n = f->n;
    op_matmul(be, a->ple_tmp, a->x, &w->w_ple_gate, NULL, f->rows);  /* g = x Wg^T */
    op_copy_strided(be, a->ple_g, P, 0, a->ple + (size_t)l * P, c->n_layer * P, 0, n, 1, P);
    op_gelu_tanh_mul(be, a->ple_tmp, a->ple_tmp, a->ple_g, (long)n * P);
    op_matmul(be, a->xn, a->ple_tmp, &w->w_ple_proj, NULL, f->rows);
    op_rmsnorm(be, a->xn, a->xn, w->ple_post_norm, c->norm_eps, n, D);
    op_add(be, a->x, a->xn, (long)n * D);
}

void llama_layers(const struct fwd *f) {
    struct gerbil_context *cx = f->c;
    const struct model_config *c = f->cfg;
    struct backend *be = f->be;
    const struct act_bufs *a = &cx->a;
    const int D = c->n_embd, n = f->n;
    for (int l = 0; l < c->n_layer; l++) {
        const struct layer_weights *w = &cx->model->layers[l];
        op_rmsnorm(be, a->xn, a->x, w->attn_norm, c->norm_eps, n, D);  /* xn = norm(x) */
        switch (c->layer_kind[l]) {
        case LAYER_DELTANET: deltanet_forward(f, l); break;
        case LAYER_SHORTCONV: shortconv_forward(f, l); break;
        default: attention_block(f, l); break;
        }
        op_add(be, a->x, a->xn, (long)n * D);                        /* x += mixer(xn) */
        op_rmsnorm(be, a->xn, a->x, w->ffn_norm, c->norm_eps, n, D);   /* xn = norm(x) */
        if (c->layer_moe && c->layer_moe[l]) moe_forward(f, l);
        else ffn_block(f, l);
        op_add(be, a->x, a->xn, (long)n * D);                        /* x += ffn(xn) */
        if (c->ple_dim) ple_block(f, l);                             /* Gemma 4 */
        if (w->out_scale != 0.0f) op_scale(be, a->x, w->out_scale, (long)n * D);
        for (int k = 0; k < cx->n_taps; k++)                         /* hidden states for the caller */
            if (cx->tap_layers[k] == l && f->n_out > 0)
                op_gather_rows(be, a->taps + (size_t)k * cx->n_batch * D, a->x, a->out_idx, f->n_out, D);
    }
}

void llama_logits(const struct fwd *f, int n, const int32_t *span, float *logits) {
    const struct gerbil_model *m = f->c->model;
    const struct model_config *c = f->cfg;
    const struct act_bufs *a = &f->c->a;
    op_rmsnorm(f->be, a->out_x, a->out_x, m->out_norm, c->norm_eps, n, c->n_embd);   /* final norm */
    op_matmul(f->be, logits, a->out_x, &m->lm_head, NULL, (struct gb_rows){n, span}); /* logits = xn E^T */
    if (c->final_softcap > 0.0f)                                     /* cap tanh(logits / cap) */
        op_softcap(f->be, logits, c->final_softcap, (long)n * c->n_vocab);
}
