#include "model/weights.h"
#include "backend/backend.h"
#include "base/status.h"
#include "io/mmap.h"

#include <stdint.h>

#include <stdio.h>
#include <string.h>

/* Hugging Face module names -> GGUF tensor names, as llama.cpp's converter writes them;
 * arch ARCH_COUNT: every architecture. The first row matching (arch, module) wins. */
static const struct { const char *hf, *gguf; int arch; } layer_names[] = {
    {"post_attention_layernorm", "post_attention_norm", ARCH_QWEN35},
    /* Gemma 2/3 keep a norm after attention, so the ffn norm is the one before the feed-forward */
    {"post_attention_layernorm", "post_attention_norm", ARCH_GEMMA3},
    {"pre_feedforward_layernorm", "ffn_norm", ARCH_GEMMA3},
    {"post_feedforward_layernorm", "post_ffw_norm", ARCH_GEMMA3},
    {"post_attention_layernorm", "post_attention_norm", ARCH_GEMMA4},
    {"pre_feedforward_layernorm", "ffn_norm", ARCH_GEMMA4},
    {"post_feedforward_layernorm", "post_ffw_norm", ARCH_GEMMA4},
    {"per_layer_input_gate", "inp_gate", ARCH_GEMMA4},
    {"per_layer_projection", "proj", ARCH_GEMMA4},
    {"post_per_layer_input_norm", "post_norm", ARCH_GEMMA4},
    {"post_attention_layernorm", "post_attention_norm", ARCH_QWEN3NEXT},
    {"input_layernorm", "attn_norm", ARCH_COUNT},
    {"self_attn.q_proj", "attn_q", ARCH_COUNT},
    {"self_attn.k_proj", "attn_k", ARCH_COUNT},
    {"self_attn.v_proj", "attn_v", ARCH_COUNT},
    {"self_attn.o_proj", "attn_output", ARCH_COUNT},
    {"self_attn.q_norm", "attn_q_norm", ARCH_COUNT},
    {"self_attn.k_norm", "attn_k_norm", ARCH_COUNT},
    {"post_attention_layernorm", "ffn_norm", ARCH_COUNT},
    {"mlp.gate_proj", "ffn_gate", ARCH_COUNT},
    {"mlp.up_proj", "ffn_up", ARCH_COUNT},
    {"mlp.down_proj", "ffn_down", ARCH_COUNT},
    {"linear_attn.in_proj_qkv", "attn_qkv", ARCH_COUNT},
    {"linear_attn.in_proj_z", "attn_gate", ARCH_COUNT},
    {"linear_attn.in_proj_b", "ssm_beta", ARCH_COUNT},
    {"linear_attn.in_proj_a", "ssm_alpha", ARCH_COUNT},
    {"linear_attn.out_proj", "ssm_out", ARCH_COUNT},
    {"linear_attn.norm", "ssm_norm", ARCH_COUNT},
    {"linear_attn.conv1d", "ssm_conv1d", ARCH_COUNT},
    {"linear_attn.in_proj_qkvz", "ssm_in", ARCH_COUNT},  /* older qwen3next conversions */
    {"linear_attn.in_proj_ba", "ssm_ba", ARCH_COUNT},
    /* Qwen3-Next MoE: the router, the shared expert and its gate, the experts stacked
     * [n_expert, out, in] (named here as mlx-lm's stacked switch_mlp) */
    {"mlp.gate", "ffn_gate_inp", ARCH_COUNT},
    {"mlp.shared_expert_gate", "ffn_gate_inp_shexp", ARCH_COUNT},
    {"mlp.shared_expert.gate_proj", "ffn_gate_shexp", ARCH_COUNT},
    {"mlp.shared_expert.up_proj", "ffn_up_shexp", ARCH_COUNT},
    {"mlp.shared_expert.down_proj", "ffn_down_shexp", ARCH_COUNT},
    {"mlp.switch_mlp.gate_proj", "ffn_gate_exps", ARCH_COUNT},
    {"mlp.switch_mlp.up_proj", "ffn_up_exps", ARCH_COUNT},
    {"mlp.switch_mlp.down_proj", "ffn_down_exps", ARCH_COUNT},
    /* LFM2 (llama.cpp arch lfm2) */
    {"operator_norm", "attn_norm", ARCH_LFM2},
    {"ffn_norm", "ffn_norm", ARCH_LFM2},
    {"self_attn.out_proj", "attn_output", ARCH_LFM2},
    {"self_attn.q_layernorm", "attn_q_norm", ARCH_LFM2},
    {"self_attn.k_layernorm", "attn_k_norm", ARCH_LFM2},
    {"feed_forward.w1", "ffn_gate", ARCH_LFM2},
    {"feed_forward.w3", "ffn_up", ARCH_LFM2},
    {"feed_forward.w2", "ffn_down", ARCH_LFM2},
    {"conv.conv", "shortconv.conv", ARCH_LFM2},
    {"conv.in_proj", "shortconv.in_proj", ARCH_LFM2},
    {"conv.out_proj", "shortconv.out_proj", ARCH_LFM2},
};

/* Parameters without a .weight/.bias suffix. */
static const struct { const char *hf, *gguf; } layer_params[] = {
    {"linear_attn.dt_bias", "ssm_dt.bias"},   /* the converter renames it dt_proj.bias */
    {"linear_attn.A_log", "ssm_a"},           /* stored as -exp(A_log) */
    {"layer_scalar", "layer_output_scale.weight"}, /* Gemma 4 */
};

static int gguf_name(const struct weight_source *s, const char *hf, char *out, size_t cap) {
    static const struct { const char *hf, *gguf; } top[] = {
        {"model.embed_tokens.weight", "token_embd.weight"},
        {"model.norm.weight", "output_norm.weight"},
        {"lm_head.weight", "output.weight"},
        {"model.embedding_norm.weight", "token_embd_norm.weight"}, /* LFM2's final norm, so named by llama.cpp */
        {"model.embed_tokens_per_layer.weight", "per_layer_token_embd.weight"}, /* Gemma 4 */
        {"model.per_layer_model_projection.weight", "per_layer_model_proj.weight"},
        {"model.per_layer_projection_norm.weight", "per_layer_proj_norm.weight"},
    };
    for (size_t i = 0; i < sizeof top / sizeof top[0]; i++)
        if (!strcmp(hf, top[i].hf)) return snprintf(out, cap, "%s", top[i].gguf) < (int)cap ? 0 : -1;
    int layer, n = 0;
    if (sscanf(hf, "model.layers.%d.%n", &layer, &n) != 1 || n == 0) return -1;
    const char *rest = hf + n;
    for (size_t i = 0; i < sizeof layer_params / sizeof layer_params[0]; i++)
        if (!strcmp(rest, layer_params[i].hf))
            return snprintf(out, cap, "blk.%d.%s", layer, layer_params[i].gguf) < (int)cap ? 0 : -1;
    for (size_t i = 0; i < sizeof layer_names / sizeof layer_names[0]; i++) {
        size_t len = strlen(layer_names[i].hf);
        if (layer_names[i].arch != ARCH_COUNT && layer_names[i].arch != (int)s->arch) continue;
        if (!strncmp(rest, layer_names[i].hf, len) && rest[len] == '.')
            return snprintf(out, cap, "blk.%d.%s%s", layer, layer_names[i].gguf, rest + len) < (int)cap ? 0 : -1;
    }
    return -1;
}

void wsrc_detect_prefix(struct weight_source *s) {
    static const struct { const char *model, *head; } layouts[] = {
        {"model.", ""}, {"model.language_model.", ""}, {"language_model.model.", "language_model."},
        {"", ""}, /* a bare transformer (Qwen3Model, Gemma3TextModel: sentence-transformers' layout) */
    };
    snprintf(s->model_prefix, sizeof s->model_prefix, "model.");
    s->head_prefix[0] = 0;
    if (s->is_gguf) return;
    char name[96];
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
        snprintf(name, sizeof name, "%sembed_tokens.weight", layouts[i].model);
        if (st_checkpoint_find(&s->ck, name)) {
            snprintf(s->model_prefix, sizeof s->model_prefix, "%s", layouts[i].model);
            snprintf(s->head_prefix, sizeof s->head_prefix, "%s", layouts[i].head);
            s->bare = !layouts[i].model[0];
            return;
        }
    }
}

const struct gb_tensor *wsrc_find(const struct weight_source *s, const char *hf_name) {
    if (!s->is_gguf) {
        char name[320];
        if (!strncmp(hf_name, "model.", 6) && strcmp(s->model_prefix, "model.") && (s->model_prefix[0] || s->bare)) {
            snprintf(name, sizeof name, "%s%s", s->model_prefix, hf_name + 6);
            hf_name = name;
        } else if (!strncmp(hf_name, "lm_head.", 8) && s->head_prefix[0]) {
            snprintf(name, sizeof name, "%s%s", s->head_prefix, hf_name);
            hf_name = name;
        }
        return st_checkpoint_find(&s->ck, hf_name);
    }
    char name[256];
    if (gguf_name(s, hf_name, name, sizeof name)) return NULL;
    return gguf_find_tensor(&s->gg, name);
}

const char *wsrc_file_name(const struct weight_source *s, const char *hf_name, char *buf, size_t cap) {
    if (!s->is_gguf || gguf_name(s, hf_name, buf, cap)) return hf_name;
    return buf;
}

int wsrc_n_tensors(const struct weight_source *s) {
    return s->is_gguf ? s->gg.n_tensors : st_checkpoint_n_tensors(&s->ck);
}

const struct gb_tensor *wsrc_at(const struct weight_source *s, int i) {
    return s->is_gguf ? &s->gg.tensors[i] : st_checkpoint_at(&s->ck, i);
}

int norm_weights_shifted(const struct gb_tensor *t) {
    const int64_t n = tensor_nelements(t);
    if (!type_traits(t->type)->is_float || n <= 0 || n > (1 << 20)) return 0;
    /* misaligned data (an odd-length safetensors header) is refused when it is bound */
    if ((uintptr_t)t->data % type_traits(t->type)->type_size) return 0;
    float buf[256];
    double sum = 0;
    for (int64_t i = 0; i < n; i += 256) {
        const int64_t k = n - i < 256 ? n - i : 256;
        type_to_f32(t->type, (const uint8_t *)t->data + (size_t)i * type_traits(t->type)->type_size, buf, k);
        for (int64_t j = 0; j < k; j++) sum += buf[j];
    }
    return sum / (double)n > 0.5;
}

void wsrc_seal(struct weight_source *s) {
    if (s->is_gguf) mapped_file_seal(&s->gg.map);
    else
        for (int i = 0; i < s->ck.n_files; i++) mapped_file_seal(&s->ck.files[i].map);
}

void wsrc_close(struct weight_source *s) {
    if (s->is_gguf) gguf_close(&s->gg);
    else st_checkpoint_close(&s->ck);
}

/* n_mat > 0: a stack of n_mat matrices, shape [n_mat, d0, d1]; 0: one matrix [d0, d1]. */
static gerbil_status shape_error(const struct gb_tensor *t, const char *name, int64_t n_mat, int64_t d0, int64_t d1) {
    char got[96] = "", want[32] = "";
    int off = 0;
    for (int i = 0; i < t->n_dims && off < (int)sizeof got - 24; i++)
        off += snprintf(got + off, sizeof got - (size_t)off, "%s%lld", i ? ", " : "", (long long)t->ne[i]);
    if (n_mat) snprintf(want, sizeof want, "%lld, ", (long long)n_mat);
    return err_set(GERBIL_ERR_FORMAT, "tensor \"%s\": expected shape [%s%lld, %lld], found [%s]", name, want,
                   (long long)d0, (long long)d1, got);
}

static int has_shape(const struct gb_tensor *t, int64_t n_mat, int64_t d0, int64_t d1) {
    if (n_mat) return t->n_dims == 3 && t->ne[0] == n_mat && t->ne[1] == d0 && t->ne[2] == d1;
    if (d0 == 1 && t->n_dims == 1) return t->ne[0] == d1; /* one row stored as a vector (GGUF) */
    return t->n_dims == 2 && t->ne[0] == d0 && t->ne[1] == d1;
}

/* out[0 .. max(n_mat, 1)) from one view of the whole stack: matrix i starts i * rows rows in. */
static void split_stack(const struct gb_weight *all, int64_t n_mat, int64_t rows, struct gb_weight *out) {
    for (int64_t i = 0; i < (n_mat ? n_mat : 1); i++) out[i] = weight_rows(all, i * rows, rows);
}

static gerbil_status check_aligned(const struct gb_tensor *t, const char *name) {
    size_t a = type_traits(t->type)->type_size;
    if (a > 8) a = 2; /* block types: their f16 fields */
    if ((uintptr_t)t->data % a)
        return err_set(GERBIL_ERR_FORMAT, "tensor \"%s\": data is not aligned to its %zu-byte elements", name, a);
    return GERBIL_OK;
}

/* Rearrange t's data, the n matrices w[0 .. n) (a stack's, or one), each on its own, for
 * the kernels where they want it and the data is the loader's own copy (not the file's
 * pages). Once per tensor: a tied embedding binds it twice. */
static gerbil_status pack(const struct weight_source *s, const struct gb_tensor *t, struct gb_weight *w, int64_t n) {
    struct gb_tensor *mt = (struct gb_tensor *)(uintptr_t)t; /* the checkpoint's own table */
    for (int64_t i = 0; i < n; i++) w[i].packed = mt->packed;
    if (!s->be) return GERBIL_OK;
    s->be->ops->weight_prepare(s->be, w, n, mt->in_memory && !mt->packed);
    mt->packed = w[0].packed;
    return s->be->ops->weight_status ? s->be->ops->weight_status(s->be) : GERBIL_OK;
}

/* MLX: name.weight holds u32 words, name.scales / name.biases the per-group affine. */
static gerbil_status mlx_matrix(const struct weight_source *s, const char *name, const struct gb_tensor *t,
                                int64_t n_mat, int64_t rows, int64_t cols, struct gb_weight *out) {
    char module[256], sn[272], bn[272];
    name = t->name; /* the file's spelling: overrides in config.json are keyed by it */
    size_t len = strlen(name);
    if (len < 8 || strcmp(name + len - 7, ".weight") || len - 7 >= sizeof module)
        return err_set(GERBIL_ERR_FORMAT, "tensor \"%s\": MLX scales beside a tensor not named *.weight", name);
    memcpy(module, name, len - 7);
    module[len - 7] = 0;
    snprintf(sn, sizeof sn, "%s.scales", module);
    snprintf(bn, sizeof bn, "%s.biases", module);
    const struct gb_tensor *sc = st_checkpoint_find(&s->ck, sn), *bi = st_checkpoint_find(&s->ck, bn);
    int bits, gs;
    mlx_quant_for(s->mlx, module, &bits, &gs);
    if (bits == 0)
        return err_set(GERBIL_ERR_FORMAT, "tensor \"%s\" has MLX scales but config.json declares no quantization "
                       "for \"%s\"", name, module);
    if (!bi) return err_set(GERBIL_ERR_FORMAT, "missing tensor \"%s\" (MLX affine quantization needs biases)", bn);
    if (cols % gs || (cols * bits) % 32)
        return err_set(GERBIL_ERR_FORMAT, "tensor \"%s\": %lld columns do not split into groups of %d at %d bits",
                       name, (long long)cols, gs, bits);
    if (t->type != GB_TYPE_U32 || !has_shape(t, n_mat, rows, cols * bits / 32)) {
        if (t->type != GB_TYPE_U32)
            return err_set(GERBIL_ERR_FORMAT, "tensor \"%s\": MLX %d-bit weights must be U32, found %s", name, bits,
                           type_name(t->type));
        return shape_error(t, name, n_mat, rows, cols * bits / 32);
    }
    for (int k = 0; k < 2; k++) {
        const struct gb_tensor *x = k ? bi : sc;
        const char *xn = k ? bn : sn;
        if (!has_shape(x, n_mat, rows, cols / gs)) return shape_error(x, xn, n_mat, rows, cols / gs);
        if (!type_traits(x->type)->is_float || x->type != sc->type)
            return err_set(GERBIL_ERR_FORMAT, "tensor \"%s\": MLX scales and biases must share a float type "
                           "(found %s and %s)", xn, type_name(sc->type), type_name(bi->type));
        GB_TRY(check_aligned(x, xn));
    }
    GB_TRY(check_aligned(t, name));
    struct gb_weight all = {
        .kind = GB_WEIGHT_MLX, .type = GB_TYPE_U32, .n_out = (n_mat ? n_mat : 1) * rows, .n_in = cols,
        .data = t->data, .row_bytes = (size_t)(cols * bits / 8), .bits = bits, .group_size = gs,
        .sb_type = sc->type, .scales = sc->data, .biases = bi->data, .name = t->name,
    };
    split_stack(&all, n_mat, rows, out);
    return pack(s, t, out, n_mat ? n_mat : 1);
}

static gerbil_status matrices(const struct weight_source *s, const char *name, int64_t n_mat, int64_t rows,
                              int64_t cols, struct gb_weight *out) {
    const struct gb_tensor *t = wsrc_find(s, name);
    char fname[256];
    if (!t) return err_set(GERBIL_ERR_FORMAT, "missing tensor \"%s\"", wsrc_file_name(s, name, fname, sizeof fname));
    if (!s->is_gguf) {
        char sn[272];
        size_t len = strlen(name);
        if (len > 7 && !strcmp(name + len - 7, ".weight")) {
            snprintf(sn, sizeof sn, "%.*s.scales", (int)(len - 7), name);
            if (wsrc_find(s, sn)) return mlx_matrix(s, name, t, n_mat, rows, cols, out);
        }
    }
    if (!has_shape(t, n_mat, rows, cols)) return shape_error(t, t->name, n_mat, rows, cols);
    const struct gb_type_traits *tt = type_traits(t->type);
    if (!tt->is_float && !tt->is_quant)
        return err_set(GERBIL_ERR_UNSUPPORTED, "tensor \"%s\": dtype %s cannot be a weight matrix", name,
                       type_name(t->type));
    GB_TRY(check_aligned(t, name));
    const struct gb_weight all = {
        .kind = GB_WEIGHT_PLAIN, .type = t->type, .n_out = (n_mat ? n_mat : 1) * rows, .n_in = cols,
        .data = t->data, .row_bytes = type_row_size(t->type, cols), .name = t->name,
    };
    split_stack(&all, n_mat, rows, out);
    return pack(s, t, out, n_mat ? n_mat : 1);
}

gerbil_status wsrc_matrix(const struct weight_source *s, const char *name, int64_t rows, int64_t cols,
                          struct gb_weight *out) {
    return matrices(s, name, 0, rows, cols, out);
}

gerbil_status wsrc_matrix_stack(const struct weight_source *s, const char *name, int64_t n_mat, int64_t rows,
                                int64_t cols, struct gb_weight *out) {
    GB_ASSERT(n_mat > 0);
    return matrices(s, name, n_mat, rows, cols, out);
}
