#include "model/config.h"
#include "base/status.h"
#include "io/json.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Architectures by Hugging Face class and model_type; the first row of an architecture
 * names it. */
static const struct {
    const char *hf_class;
    const char *model_type;
    enum model_arch arch;
} arch_table[] = {
    {"LlamaForCausalLM", "llama", ARCH_LLAMA},
    {"MistralForCausalLM", "mistral", ARCH_MISTRAL},
    {"Qwen2ForCausalLM", "qwen2", ARCH_QWEN2},
    {"Qwen3ForCausalLM", "qwen3", ARCH_QWEN3},
    {"Qwen3_5ForCausalLM", "qwen3_5_text", ARCH_QWEN35},
    {"Qwen3_5ForConditionalGeneration", "qwen3_5", ARCH_QWEN35},
    {"Gemma3ForCausalLM", "gemma3_text", ARCH_GEMMA3},
    {"Gemma3ForConditionalGeneration", "gemma3", ARCH_GEMMA3},
    {"Qwen3NextForCausalLM", "qwen3_next", ARCH_QWEN3NEXT},
    {"Lfm2ForCausalLM", "lfm2", ARCH_LFM2},
    {"Gemma4ForCausalLM", "gemma4_text", ARCH_GEMMA4},
    {"Gemma4ForConditionalGeneration", "gemma4", ARCH_GEMMA4},
    /* the bare transformers (no lm_head) that sentence-transformers embedding models wrap:
     * Qwen3-Embedding, EmbeddingGemma */
    {"Qwen3Model", "qwen3", ARCH_QWEN3},
    {"Gemma3TextModel", "gemma3_text", ARCH_GEMMA3},
};

/* Architectures with Gated DeltaNet layers. */
static int is_hybrid(enum model_arch a) { return a == ARCH_QWEN35 || a == ARCH_QWEN3NEXT; }
enum { N_ARCH_ROWS = sizeof arch_table / sizeof arch_table[0] };

const char *model_arch_name(enum model_arch a) {
    for (int i = 0; i < N_ARCH_ROWS; i++)
        if (arch_table[i].arch == a) return arch_table[i].hf_class;
    return "?";
}

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* A positive int field; the message names the file and the field. */
static gerbil_status get_pos_int(const cJSON *root, const char *key, int def, const char *path,
                                 int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) {
        if (def > 0) { *out = def; return GERBIL_OK; }
        return err_set(GERBIL_ERR_FORMAT, "%s: missing required field \"%s\"", path, key);
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
        return err_set(GERBIL_ERR_FORMAT, "%s: field \"%s\" must be a positive integer", path, key);
    if (v->valuedouble < 1 || v->valuedouble > CONFIG_MAX_INT)
        return err_set(GERBIL_ERR_FORMAT, "%s: field \"%s\" = %.17g is out of range (a positive integer up to %d)",
                       path, key, v->valuedouble, CONFIG_MAX_INT);
    *out = (int)v->valuedouble;
    return GERBIL_OK;
}

/* An optional int field in [lo, hi]: def when absent or null; anything else (a fraction, a
 * string, a value out of range) is an error naming the field, never a silent cast. */
static gerbil_status get_int_in(const cJSON *root, const char *key, int def, int lo, int hi, const char *path,
                                int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) { *out = def; return GERBIL_OK; }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi)
        return err_set(GERBIL_ERR_FORMAT, "%s: field \"%s\" must be an integer in [%d, %d]", path, key, lo, hi);
    *out = (int)v->valuedouble;
    return GERBIL_OK;
}

/* A token id from config.json / generation_config.json: an integer in [0, INT32_MAX - 1];
 * negative ids (some configs write -1 for "none") are skipped (*out = -1). */
static gerbil_status token_id(const cJSON *v, const char *key, const char *path, int32_t *out) {
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble >= (double)INT32_MAX)
        return err_set(GERBIL_ERR_FORMAT, "%s: \"%s\" must hold token ids (integers below %d)", path, key,
                       INT32_MAX);
    *out = v->valuedouble < 0 ? -1 : (int32_t)v->valuedouble;
    return GERBIL_OK;
}

/* eos_token_id may be an int or a list of ints. Replaces cfg->eos_ids. */
static gerbil_status read_eos(const cJSON *root, const char *path, struct model_config *cfg) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "eos_token_id");
    if (!v || cJSON_IsNull(v)) return GERBIL_OK;
    cfg->n_eos = 0;
    int32_t id;
    if (cJSON_IsNumber(v)) {
        GB_TRY(token_id(v, "eos_token_id", path, &id));
        if (id >= 0) cfg->eos_ids[cfg->n_eos++] = id;
    } else if (cJSON_IsArray(v)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, v) {
            if (!cJSON_IsNumber(e)) continue;
            GB_TRY(token_id(e, "eos_token_id", path, &id));
            if (id >= 0 && cfg->n_eos < MODEL_MAX_EOS) cfg->eos_ids[cfg->n_eos++] = id;
        }
    }
    return GERBIL_OK;
}

static gerbil_status read_bos(const cJSON *root, const char *path, struct model_config *cfg) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "bos_token_id");
    if (v && cJSON_IsNumber(v)) GB_TRY(token_id(v, "bos_token_id", path, &cfg->bos_id));
    return GERBIL_OK;
}

/* One RoPE description: rp is the rope_parameters / rope_scaling object (or NULL),
 * theta_def the base when rp has no rope_theta; what names rp in messages. */
static gerbil_status rope_from(const cJSON *root, const cJSON *rp, double theta_def, const char *path,
                               const char *what, const struct model_config *cfg, struct rope_config *r) {
    r->theta = rp ? json_get_num(rp, "rope_theta", theta_def) : theta_def;
    if (!(r->theta > 1.0) || !isfinite(r->theta)) return err_set(GERBIL_ERR_FORMAT, "%s: %s: rope_theta must be > 1", path, what);

    double prf = json_get_num(root, "partial_rotary_factor", is_hybrid(cfg->arch) ? 0.25 : 1.0);
    if (rp) prf = json_get_num(rp, "partial_rotary_factor", prf);
    if (!(prf > 0.0 && prf <= 1.0))
        return err_set(GERBIL_ERR_FORMAT, "%s: partial_rotary_factor %g must be in (0, 1]", path, prf);
    /* Gemma 4: the global rope (cfg->rope) belongs to the full layers and their head_dim */
    const int hd = r == &cfg->rope && cfg->head_dim_full ? cfg->head_dim_full : cfg->head_dim;
    r->n_dims = (int)(hd * prf);
    if (cfg->arch == ARCH_GEMMA4) r->n_dims = hd; /* transformers' Gemma 4 default rope ignores the factor */
    if (r->n_dims < 2 || r->n_dims > hd || r->n_dims % 2)
        return err_set(GERBIL_ERR_FORMAT, "%s: partial_rotary_factor %g gives %d rotary dims for head_dim %d",
                       path, prf, r->n_dims, hd);

    r->max_pos = cfg->n_ctx_train;
    r->type = ROPE_DEFAULT;
    r->factor = 1.0;
    if (!rp) return GERBIL_OK;

    const char *type = json_get_str(rp, "rope_type", NULL);
    if (!type) type = json_get_str(rp, "type", "default");
    static const struct { const char *name; enum rope_type t; } types[] = {
        {"default", ROPE_DEFAULT}, {"linear", ROPE_LINEAR}, {"dynamic", ROPE_DYNAMIC},
        {"llama3", ROPE_LLAMA3}, {"yarn", ROPE_YARN}, {"proportional", ROPE_PROPORTIONAL},
    };
    int found = 0;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (strcmp(type, types[i].name) == 0) { r->type = types[i].t; found = 1; }
    if (!found)
        return err_set(GERBIL_ERR_UNSUPPORTED, "%s: %s: rope type \"%s\" is not supported "
                       "(supported: default, linear, dynamic, llama3, yarn, proportional)", path, what, type);
    if (r->type == ROPE_DEFAULT) return GERBIL_OK;
    if (r->type == ROPE_PROPORTIONAL) {
        /* transformers: rope_angles = int(partial_rotary_factor * head_dim // 2) of head_dim / 2
         * pairs rotate, every pair (i, i + head_dim / 2) of the whole head */
        r->n_dims = hd;
        r->prop_angles = (int)floor(prf * hd / 2.0);
        r->factor = json_get_num(rp, "factor", 1.0);
        if (!(r->factor > 0.0) || !isfinite(r->factor))
            return err_set(GERBIL_ERR_FORMAT, "%s: %s: proportional rope needs a positive \"factor\"", path, what);
        if (hd % 2) return err_set(GERBIL_ERR_FORMAT, "%s: %s: head_dim %d is odd", path, what, hd);
        return GERBIL_OK;
    }

    r->factor = json_get_num(rp, "factor", 0.0);
    if (!(r->factor > 0.0) || !isfinite(r->factor))
        return err_set(GERBIL_ERR_FORMAT, "%s: %s: rope type \"%s\" needs a positive \"factor\"", path, what, type);
    GB_TRY(get_int_in(rp, "original_max_position_embeddings", cfg->n_ctx_train, 1, CONFIG_MAX_INT, path,
                      &r->orig_max_pos));
    if (r->type == ROPE_LLAMA3) {
        r->low_freq_factor = json_get_num(rp, "low_freq_factor", 1.0);
        r->high_freq_factor = json_get_num(rp, "high_freq_factor", 4.0);
        if (!(r->high_freq_factor > r->low_freq_factor) || !isfinite(r->high_freq_factor) ||
            !isfinite(r->low_freq_factor))
            return err_set(GERBIL_ERR_FORMAT, "%s: llama3 rope needs high_freq_factor > low_freq_factor", path);
    }
    if (r->type == ROPE_YARN) {
        r->attention_factor = json_get_num(rp, "attention_factor", 0.0);
        r->beta_fast = json_get_num(rp, "beta_fast", 32.0);
        r->beta_slow = json_get_num(rp, "beta_slow", 1.0);
        r->mscale = json_get_num(rp, "mscale", 0.0);
        r->mscale_all_dim = json_get_num(rp, "mscale_all_dim", 0.0);
        r->truncate = json_get_bool(rp, "truncate", 1);
        if (!isfinite(r->attention_factor) || !isfinite(r->beta_fast) || !isfinite(r->beta_slow) ||
            !isfinite(r->mscale) || !isfinite(r->mscale_all_dim) || r->attention_factor < 0)
            return err_set(GERBIL_ERR_FORMAT, "%s: %s: yarn parameters must be finite numbers", path, what);
    }
    return GERBIL_OK;
}

static gerbil_status read_rope(const cJSON *root, const char *path, struct model_config *cfg) {
    /* transformers 5 writes rope_parameters (with rope_theta inside); older configs
     * write rope_theta at the top level and an optional rope_scaling object. */
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    if (!rp || cJSON_IsNull(rp)) rp = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    if (rp && cJSON_IsNull(rp)) rp = NULL;
    if (rp && !cJSON_IsObject(rp))
        return err_set(GERBIL_ERR_FORMAT, "%s: rope_parameters/rope_scaling must be an object", path);
    if (cfg->arch == ARCH_LFM2) {
        /* the original LFM2 configs write "theta"; rope_parameters may be keyed by layer type */
        const cJSON *full = rp ? cJSON_GetObjectItemCaseSensitive(rp, "full_attention") : NULL;
        if (cJSON_IsObject(full)) rp = full;
        return rope_from(root, rp, json_get_num(root, "rope_theta", json_get_num(root, "theta", 1e6)), path, "rope",
                         cfg, &cfg->rope);
    }
    if (cfg->arch != ARCH_GEMMA3 && cfg->arch != ARCH_GEMMA4)
        return rope_from(root, rp, json_get_num(root, "rope_theta", 10000.0), path, "rope", cfg, &cfg->rope);

    /* Gemma 3: global (full_attention) and sliding layers rotate differently. transformers 5:
     * rope_parameters = {"full_attention": {...}, "sliding_attention": {...}}; older configs:
     * rope_theta + rope_scaling for the global layers, rope_local_base_freq (no scaling) for
     * the sliding ones. */
    cfg->has_rope_local = 1;
    const cJSON *full = rp ? cJSON_GetObjectItemCaseSensitive(rp, "full_attention") : NULL;
    const cJSON *slide = rp ? cJSON_GetObjectItemCaseSensitive(rp, "sliding_attention") : NULL;
    if (full || slide) {
        if (!cJSON_IsObject(full) || !cJSON_IsObject(slide))
            return err_set(GERBIL_ERR_FORMAT, "%s: rope_parameters needs both \"full_attention\" and "
                           "\"sliding_attention\" objects", path);
        GB_TRY(rope_from(root, full, 1e6, path, "rope_parameters.full_attention", cfg, &cfg->rope));
        return rope_from(root, slide, 1e4, path, "rope_parameters.sliding_attention", cfg, &cfg->rope_local);
    }
    GB_TRY(rope_from(root, rp, json_get_num(root, "rope_theta", 1e6), path, "rope", cfg, &cfg->rope));
    return rope_from(root, NULL, json_get_num(root, "rope_local_base_freq", 1e4), path, "rope_local_base_freq",
                     cfg, &cfg->rope_local);
}

/* What each layer is: full, sliding-window or linear attention. transformers 5 writes
 * "layer_types"; older Qwen2/Qwen3 configs say use_sliding_window + max_window_layers;
 * Mistral applies sliding_window to every layer; Qwen3.5 / Qwen3-Next configs without layer_types
 * put a full-attention layer every full_attention_interval layers. */
/* LFM2 configs without layer_types list the attention layers in full_attn_idxs; the
 * others are short-convolution layers (every layer is attention when neither is given). */
static gerbil_status read_full_attn_idxs(const cJSON *root, const char *path, struct model_config *cfg) {
    const cJSON *idx = cJSON_GetObjectItemCaseSensitive(root, "full_attn_idxs");
    if (!idx || cJSON_IsNull(idx)) return GERBIL_OK;
    if (!cJSON_IsArray(idx)) return err_set(GERBIL_ERR_FORMAT, "%s: full_attn_idxs must be a list of layer indices", path);
    for (int i = 0; i < cfg->n_layer; i++) cfg->layer_kind[i] = LAYER_SHORTCONV;
    const cJSON *e;
    cJSON_ArrayForEach(e, idx) {
        if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || e->valuedouble < 0 ||
            e->valuedouble >= cfg->n_layer)
            return err_set(GERBIL_ERR_FORMAT, "%s: full_attn_idxs holds %s, not a layer index below %d", path,
                           cJSON_IsNumber(e) ? "a number out of range" : "a non-number", cfg->n_layer);
        cfg->layer_kind[(int)e->valuedouble] = LAYER_ATTENTION;
    }
    return GERBIL_OK;
}

static gerbil_status read_layer_types(const cJSON *root, const char *path, struct model_config *cfg) {
    cfg->layer_sliding = calloc((size_t)cfg->n_layer, 1);
    cfg->layer_kind = calloc((size_t)cfg->n_layer, 1);
    if (!cfg->layer_sliding || !cfg->layer_kind) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(root, "sliding_window");
    int window = 0;
    /* 0 and negative windows mean "none" in some configs; huge or fractional ones are errors */
    if (sw && cJSON_IsNumber(sw) && sw->valuedouble >= 1) GB_TRY(get_int_in(root, "sliding_window", 0, 1, CONFIG_MAX_INT, path, &window));
    if (cfg->arch == ARCH_GEMMA3 && !sw) window = 4096; /* Gemma3TextConfig's default */
    if (cfg->arch == ARCH_GEMMA4 && !sw) window = 512;  /* Gemma4TextConfig's default */
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(root, "layer_types");
    if (lt && cJSON_IsArray(lt)) {
        if (cJSON_GetArraySize(lt) != cfg->n_layer)
            return err_set(GERBIL_ERR_FORMAT, "%s: layer_types has %d entries for %d layers", path,
                           cJSON_GetArraySize(lt), cfg->n_layer);
        int i = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, lt) {
            const char *s = cJSON_IsString(e) ? e->valuestring : "";
            if (strcmp(s, "sliding_attention") == 0) cfg->layer_sliding[i] = 1;
            else if (strcmp(s, "linear_attention") == 0 && is_hybrid(cfg->arch)) cfg->layer_kind[i] = LAYER_DELTANET;
            else if (strcmp(s, "conv") == 0 && cfg->arch == ARCH_LFM2) cfg->layer_kind[i] = LAYER_SHORTCONV;
            else if (strcmp(s, "full_attention") != 0)
                return err_set(GERBIL_ERR_UNSUPPORTED, "%s: layer_types[%d] = \"%s\" is not supported for %s", path,
                               i, s, model_arch_name(cfg->arch));
            i++;
        }
    } else if (cfg->arch == ARCH_LFM2) {
        GB_TRY(read_full_attn_idxs(root, path, cfg));
    } else if (is_hybrid(cfg->arch)) {
        int every;
        GB_TRY(get_int_in(root, "full_attention_interval", 4, 1, CONFIG_MAX_INT, path, &every));
        for (int i = 0; i < cfg->n_layer; i++) cfg->layer_kind[i] = (i + 1) % every ? LAYER_DELTANET : LAYER_ATTENTION;
    } else if (cfg->arch == ARCH_GEMMA4) {
        /* Gemma4TextConfig: every 6th layer is full, and the last one always */
        for (int i = 0; i < cfg->n_layer; i++) cfg->layer_sliding[i] = (i + 1) % 6 != 0;
    } else if (cfg->arch == ARCH_GEMMA3) {
        /* older Gemma 3 configs: every sliding_window_pattern-th layer is global */
        int pattern;
        GB_TRY(get_int_in(root, "sliding_window_pattern", 6, 1, CONFIG_MAX_INT, path, &pattern));
        for (int i = 0; window > 0 && i < cfg->n_layer; i++) cfg->layer_sliding[i] = (i + 1) % pattern != 0;
    } else if (window > 0) {
        int use = 1, first = 0;
        if (cfg->arch == ARCH_QWEN2 || cfg->arch == ARCH_QWEN3) {
            use = json_get_bool(root, "use_sliding_window", 0);
            /* transformers: layer i slides when i >= max_window_layers (a negative value: every
             * layer; past the last layer: none) */
            GB_TRY(get_int_in(root, "max_window_layers", cfg->n_layer, -CONFIG_MAX_INT, CONFIG_MAX_INT, path, &first));
            if (first < 0) first = 0;
        } else if (cfg->arch == ARCH_LLAMA) {
            use = 0;
        }
        for (int i = first; use && i < cfg->n_layer; i++) cfg->layer_sliding[i] = 1;
    }
    if (cfg->arch == ARCH_GEMMA4) cfg->layer_sliding[cfg->n_layer - 1] = 0; /* as Gemma4TextConfig forces */
    int any = 0;
    for (int i = 0; i < cfg->n_layer; i++) any |= cfg->layer_sliding[i];
    if (any && window == 0)
        return err_set(GERBIL_ERR_FORMAT, "%s: sliding layers configured but sliding_window is not set", path);
    /* Bidirectional Gemma 3 (Gemma3TextConfig.__post_init__): the window becomes
     * sliding_window // 2 + 1 and query i sees keys j with |i - j| below it */
    if (any && cfg->bidirectional) window = window / 2 + 1;
    cfg->sliding_window = any ? window : 0;
    return GERBIL_OK;
}

/* Gated DeltaNet sizes (Qwen3.5). */
static gerbil_status read_deltanet(const cJSON *root, const char *path, struct model_config *cfg) {
    struct deltanet_config *d = &cfg->dn;
    GB_TRY(get_pos_int(root, "linear_num_key_heads", 16, path, &d->n_k_heads));
    GB_TRY(get_pos_int(root, "linear_num_value_heads", 32, path, &d->n_v_heads));
    GB_TRY(get_pos_int(root, "linear_key_head_dim", 128, path, &d->k_dim));
    GB_TRY(get_pos_int(root, "linear_value_head_dim", 128, path, &d->v_dim));
    GB_TRY(get_pos_int(root, "linear_conv_kernel_dim", 4, path, &d->conv_kernel));
    if (d->n_v_heads % d->n_k_heads)
        return err_set(GERBIL_ERR_FORMAT, "%s: linear_num_value_heads %d is not a multiple of linear_num_key_heads %d",
                       path, d->n_v_heads, d->n_k_heads);
    if (d->k_dim > 4096 || d->v_dim > 4096 || d->conv_kernel > 64 || d->n_v_heads > 4096)
        return err_set(GERBIL_ERR_FORMAT, "%s: linear attention sizes are absurd", path);
    return GERBIL_OK;
}

/* LFM2's feed-forward width (transformers' Lfm2MLP): block_ff_dim (the original key) or
 * intermediate_size; with block_auto_adjust_ff_dim, int(2 * d / 3), then, when
 * block_ffn_dim_multiplier is not null, int(multiplier * d) rounded up to a multiple of
 * block_multiple_of. Python's float arithmetic and truncation, in double. */
static gerbil_status read_lfm2(const cJSON *root, const char *path, struct model_config *cfg) {
    const char *key = json_has(root, "block_ff_dim") ? "block_ff_dim" : "intermediate_size";
    int ff;
    GB_TRY(get_pos_int(root, key, 12288, path, &ff));
    if (json_get_bool(root, "block_auto_adjust_ff_dim", 1)) {
        double d = trunc(2.0 * ff / 3.0);
        const cJSON *mult = cJSON_GetObjectItemCaseSensitive(root, "block_ffn_dim_multiplier");
        if (!mult || !cJSON_IsNull(mult)) {
            double k = mult ? (cJSON_IsNumber(mult) ? mult->valuedouble : -1.0) : 1.0;
            if (!(k > 0.0 && k < 1e3))
                return err_set(GERBIL_ERR_FORMAT, "%s: block_ffn_dim_multiplier must be a positive number", path);
            int multiple;
            GB_TRY(get_pos_int(root, "block_multiple_of", 256, path, &multiple));
            d = trunc(k * d);
            d = multiple * ceil(d / multiple);
        }
        if (!(d >= 1.0 && d <= (double)(1 << 24)))
            return err_set(GERBIL_ERR_FORMAT, "%s: %s %d gives a feed-forward width of %g", path, key, ff, d);
        ff = (int)d;
    }
    cfg->n_ff = ff;
    GB_TRY(get_pos_int(root, "conv_L_cache", 3, path, &cfg->sc.kernel));
    if (cfg->sc.kernel < 2 || cfg->sc.kernel > 64)
        return err_set(GERBIL_ERR_UNSUPPORTED, "%s: conv_L_cache %d is not supported (2 to 64)", path, cfg->sc.kernel);
    cfg->sc.bias = json_get_bool(root, "conv_bias", 0);
    cfg->qk_norm = 1;
    return GERBIL_OK;
}

/* Qwen3-Next's sparse MoE: which layers use it and its sizes (configuration_qwen3_next.py
 * defaults). Layer l is MoE unless listed in mlp_only_layers, when num_experts > 0 and
 * (l + 1) % decoder_sparse_step == 0; the others keep the dense SwiGLU MLP. */
static gerbil_status read_moe(const cJSON *root, const char *path, struct model_config *cfg) {
    struct moe_config *m = &cfg->moe;
    const cJSON *ne = cJSON_GetObjectItemCaseSensitive(root, "num_experts");
    int64_t n_expert = ne && !cJSON_IsNull(ne) ? json_get_int(root, "num_experts", -1) : 512;
    if (n_expert < 0 || n_expert > 65536)
        return err_set(GERBIL_ERR_FORMAT, "%s: num_experts must be an integer in [0, 65536]", path);
    m->n_expert = (int)n_expert;
    cfg->layer_moe = calloc((size_t)cfg->n_layer, 1);
    if (!cfg->layer_moe) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    if (m->n_expert == 0) return GERBIL_OK;
    GB_TRY(get_pos_int(root, "num_experts_per_tok", 10, path, &m->n_used));
    GB_TRY(get_pos_int(root, "moe_intermediate_size", 512, path, &m->n_ff_exp));
    GB_TRY(get_pos_int(root, "shared_expert_intermediate_size", 512, path, &m->n_ff_shexp));
    if (m->n_used > m->n_expert)
        return err_set(GERBIL_ERR_FORMAT, "%s: num_experts_per_tok %d exceeds num_experts %d", path, m->n_used,
                       m->n_expert);
    m->norm_topk_prob = json_get_bool(root, "norm_topk_prob", 1);
    int step;
    GB_TRY(get_pos_int(root, "decoder_sparse_step", 1, path, &step));
    for (int l = 0; l < cfg->n_layer; l++) cfg->layer_moe[l] = (l + 1) % step == 0;
    const cJSON *only = cJSON_GetObjectItemCaseSensitive(root, "mlp_only_layers");
    if (only && !cJSON_IsNull(only)) {
        if (!cJSON_IsArray(only))
            return err_set(GERBIL_ERR_FORMAT, "%s: mlp_only_layers must be a list of layer indices", path);
        const cJSON *e;
        cJSON_ArrayForEach(e, only) {
            if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble))
                return err_set(GERBIL_ERR_FORMAT, "%s: mlp_only_layers must be a list of layer indices", path);
            /* indices past the last layer name no layer (as in transformers) */
            if (e->valuedouble >= 0 && e->valuedouble < cfg->n_layer) cfg->layer_moe[(int)e->valuedouble] = 0;
        }
    }
    return GERBIL_OK;
}

int model_arch_from_name(const char *hf_class, const char *model_type, enum model_arch *out) {
    for (int i = 0; i < N_ARCH_ROWS; i++) {
        if ((hf_class && strcmp(hf_class, arch_table[i].hf_class) == 0) ||
            (!hf_class && model_type && strcmp(model_type, arch_table[i].model_type) == 0)) {
            *out = arch_table[i].arch;
            return 0;
        }
    }
    return -1;
}

static gerbil_status read_mlx_quant(const cJSON *root, const char *path, struct model_config *cfg) {
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(root, "quantization");
    if (!q || cJSON_IsNull(q)) q = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
    if (!q || cJSON_IsNull(q)) return GERBIL_OK;
    if (!cJSON_IsObject(q)) return err_set(GERBIL_ERR_FORMAT, "%s: \"quantization\" must be an object", path);
    /* Other quantizers (GPTQ, AWQ, bitsandbytes, fp8...) write quantization_config
     * with a quant_method; only MLX's affine scheme (bits + group_size) is read here. */
    const char *method = json_get_str(q, "quant_method", NULL);
    if (method && strcmp(method, "mlx") != 0 && strcmp(method, "affine") != 0)
        return err_set(GERBIL_ERR_UNSUPPORTED, "%s: quantization method \"%s\" is not supported "
                       "(supported: MLX affine safetensors, GGUF)", path, method);
    struct mlx_quant *m = &cfg->mlx;
    GB_TRY(get_int_in(q, "bits", 0, 0, 64, path, &m->bits));
    GB_TRY(get_int_in(q, "group_size", 64, 0, 1 << 20, path, &m->group_size));
    const char *mode = json_get_str(q, "mode", "affine");
    if (strcmp(mode, "affine") != 0)
        return err_set(GERBIL_ERR_UNSUPPORTED, "%s: MLX quantization mode \"%s\" is not supported (only affine)",
                       path, mode);
    int n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, q) n += cJSON_IsObject(e) || cJSON_IsFalse(e);
    if (n) {
        m->over = calloc((size_t)n, sizeof *m->over);
        if (!m->over) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    }
    cJSON_ArrayForEach(e, q) {
        if (!cJSON_IsObject(e) && !cJSON_IsFalse(e)) continue;
        struct mlx_quant_override *o = &m->over[m->n_over++];
        if (!(o->module = strdup(e->string))) return err_set(GERBIL_ERR_NOMEM, "out of memory");
        if (cJSON_IsFalse(e)) continue;
        GB_TRY(get_int_in(e, "bits", m->bits, 0, 64, path, &o->bits));
        GB_TRY(get_int_in(e, "group_size", m->group_size, 0, 1 << 20, path, &o->group_size));
    }
    for (int i = -1; i < m->n_over; i++) {
        int bits = i < 0 ? m->bits : m->over[i].bits, gs = i < 0 ? m->group_size : m->over[i].group_size;
        if (i >= 0 && bits == 0) continue;
        if (bits != 2 && bits != 3 && bits != 4 && bits != 6 && bits != 8)
            return err_set(GERBIL_ERR_UNSUPPORTED, "%s: MLX quantization with %d bits%s%s is not supported "
                           "(2, 3, 4, 6 or 8)", path, bits, i >= 0 ? " for " : "", i >= 0 ? m->over[i].module : "");
        if (gs != 32 && gs != 64 && gs != 128)
            return err_set(GERBIL_ERR_UNSUPPORTED, "%s: MLX group size %d is not supported (32, 64 or 128)", path, gs);
    }
    return GERBIL_OK;
}

void mlx_quant_for(const struct mlx_quant *q, const char *module, int *bits, int *group_size) {
    *bits = q->bits;
    *group_size = q->group_size;
    for (int i = 0; i < q->n_over; i++)
        if (strcmp(q->over[i].module, module) == 0) {
            *bits = q->over[i].bits;
            *group_size = q->over[i].group_size;
        }
}

/* An activation name as transformers' ACT2FN spells it. */
static gerbil_status parse_act(const char *act, const char *field, const char *path, enum ffn_act *out) {
    if (!strcmp(act, "silu") || !strcmp(act, "swish")) *out = ACT_SILU;
    else if (!strcmp(act, "gelu_pytorch_tanh")) *out = ACT_GELU_TANH;
    else
        return err_set(GERBIL_ERR_UNSUPPORTED, "%s: %s \"%s\" is not supported (supported: silu, "
                       "gelu_pytorch_tanh)", path, field, act);
    return GERBIL_OK;
}

/* Gemma 3's own fields (Gemma3TextConfig defaults where a key is absent). */
static gerbil_status read_gemma3(const cJSON *root, const char *path, struct model_config *cfg) {
    cfg->qk_norm = 1;
    cfg->norm_add_one = 1;
    cfg->post_norms = 1;
    cfg->embd_scale = 1;
    cfg->attn_qkv_bias = cfg->attn_o_bias = json_get_bool(root, "attention_bias", 0);
    double qpas = json_get_num(root, "query_pre_attn_scalar", 256.0);
    if (!(qpas >= 1e-6 && qpas <= 1e12)) return err_set(GERBIL_ERR_FORMAT, "%s: query_pre_attn_scalar must be positive", path);
    cfg->attn_scale = (float)pow(qpas, -0.5); /* torch: scores * (query_pre_attn_scalar ** -0.5) */
    const cJSON *cap = cJSON_GetObjectItemCaseSensitive(root, "final_logit_softcapping");
    if (cap && !cJSON_IsNull(cap)) {
        if (!cJSON_IsNumber(cap) || !(cap->valuedouble > 0 && cap->valuedouble <= 1e30))
            return err_set(GERBIL_ERR_FORMAT, "%s: final_logit_softcapping must be a positive number or null", path);
        cfg->final_softcap = (float)cap->valuedouble;
    }
    /* attn_logit_softcapping is deliberately not read: transformers' Gemma3Attention never
     * passes it to the attention function (Gemma 2 did), so it changes nothing there. */
    /* EmbeddingGemma: every query sees the whole sequence (read_layer_types makes the
     * window symmetric) */
    cfg->bidirectional = json_get_bool(root, "use_bidirectional_attention", 0);
    return parse_act(json_get_str(root, "hidden_activation", "gelu_pytorch_tanh"), "hidden_activation", path,
                     &cfg->act);
}

/* Gemma 4's attention geometry overrides: global_head_dim / num_global_key_value_heads (the
 * released configs), or transformers 5.17's per_layer_config {"<layer>": {"head_dim": ..,
 * "num_key_value_heads": ..}} (what save_pretrained writes). A sliding layer must keep head_dim
 * and num_key_value_heads; any other override is refused by name. */
static gerbil_status read_gemma4_geometry(const cJSON *root, const char *path, struct model_config *cfg) {
    const int k_eq_v = cfg->attn_k_eq_v;
    const cJSON *plc = cJSON_GetObjectItemCaseSensitive(root, "per_layer_config");
    if (plc && !cJSON_IsNull(plc)) {
        if (!cJSON_IsObject(plc)) return err_set(GERBIL_ERR_FORMAT, "%s: per_layer_config must be an object", path);
        const cJSON *lt = cJSON_GetObjectItemCaseSensitive(root, "layer_types");
        const cJSON *e;
        cJSON_ArrayForEach(e, plc) {
            char *end = NULL;
            long idx = strtol(e->string, &end, 10);
            if (!cJSON_IsObject(e) || !*e->string || *end || idx < 0 || idx >= cfg->n_layer)
                return err_set(GERBIL_ERR_FORMAT, "%s: per_layer_config key \"%s\" is not a layer index below %d "
                               "with an object", path, e->string, cfg->n_layer);
            const cJSON *t = cJSON_IsArray(lt) ? cJSON_GetArrayItem(lt, (int)idx) : NULL;
            int full = t && cJSON_IsString(t) ? strcmp(t->valuestring, "full_attention") == 0
                                              : (idx + 1) % 6 == 0 || idx == cfg->n_layer - 1;
            const cJSON *f;
            cJSON_ArrayForEach(f, e) {
                int v = 0;
                int is_hd = !strcmp(f->string, "head_dim"), is_kv = !strcmp(f->string, "num_key_value_heads");
                if (!is_hd && !is_kv)
                    return err_set(GERBIL_ERR_UNSUPPORTED, "%s: per_layer_config[%s].%s is not supported", path,
                                   e->string, f->string);
                GB_TRY(get_pos_int(e, f->string, 0, path, &v));
                int *dst = is_hd ? &cfg->head_dim_full : &cfg->n_head_kv_full;
                int base = is_hd ? cfg->head_dim : cfg->n_head_kv;
                if (!full) {
                    if (v != base)
                        return err_set(GERBIL_ERR_UNSUPPORTED, "%s: per_layer_config[%s].%s = %d on a sliding layer "
                                       "(%d elsewhere) is not supported", path, e->string, f->string, v, base);
                } else if (*dst && *dst != v) {
                    return err_set(GERBIL_ERR_UNSUPPORTED, "%s: per_layer_config gives full layers different %s "
                                   "(%d and %d)", path, f->string, *dst, v);
                } else {
                    *dst = v;
                }
            }
        }
    } else {
        GB_TRY(get_int_in(root, "global_head_dim", 512, 1, 65536, path, &cfg->head_dim_full));
        const cJSON *g = cJSON_GetObjectItemCaseSensitive(root, "num_global_key_value_heads");
        if (k_eq_v && g && !cJSON_IsNull(g)) GB_TRY(get_pos_int(root, "num_global_key_value_heads", 0, path, &cfg->n_head_kv_full));
    }
    if (cfg->head_dim_full == cfg->head_dim) cfg->head_dim_full = 0;
    if (cfg->n_head_kv_full == cfg->n_head_kv) cfg->n_head_kv_full = 0;
    if (cfg->head_dim_full > 65536 || cfg->head_dim_full % 2)
        return err_set(GERBIL_ERR_FORMAT, "%s: the full layers' head_dim %d must be even and at most 65536", path,
                       cfg->head_dim_full);
    if (cfg->n_head_kv_full && cfg->n_head % cfg->n_head_kv_full)
        return err_set(GERBIL_ERR_FORMAT, "%s: num_attention_heads %d not a multiple of the full layers' %d KV heads",
                       path, cfg->n_head, cfg->n_head_kv_full);
    return GERBIL_OK;
}

/* Gemma 4's own fields (Gemma4TextConfig defaults where a key is absent); the sizes are required. */
static gerbil_status read_gemma4(const cJSON *root, const char *path, struct model_config *cfg) {
    cfg->qk_norm = cfg->v_norm = cfg->post_norms = cfg->embd_scale = cfg->layer_scalar = 1;
    cfg->norm_add_one = 0;   /* Gemma4RMSNorm scales by w */
    cfg->attn_scale = 1.0f;  /* Gemma4TextAttention.scaling = 1.0 (q and k are RMS-normalised) */
    cfg->attn_qkv_bias = cfg->attn_o_bias = json_get_bool(root, "attention_bias", 0);
    const cJSON *cap = cJSON_GetObjectItemCaseSensitive(root, "final_logit_softcapping");
    if (cap && !cJSON_IsNull(cap)) {
        if (!cJSON_IsNumber(cap) || !(cap->valuedouble > 0 && cap->valuedouble <= 1e30))
            return err_set(GERBIL_ERR_FORMAT, "%s: final_logit_softcapping must be a positive number or null", path);
        cfg->final_softcap = (float)cap->valuedouble;
    }
    const cJSON *bd = cJSON_GetObjectItemCaseSensitive(root, "use_bidirectional_attention");
    /* "vision" makes only image tokens bidirectional: text-only prompts stay causal */
    if (bd && !cJSON_IsNull(bd) && !(cJSON_IsString(bd) && !strcmp(bd->valuestring, "vision")) && !cJSON_IsFalse(bd))
        return err_set(GERBIL_ERR_UNSUPPORTED, "%s: use_bidirectional_attention = %s is not supported (only null or "
                       "\"vision\")", path, cJSON_IsString(bd) ? bd->valuestring : "(not a string)");
    if (json_get_bool(root, "enable_moe_block", 0))
        return err_set(GERBIL_ERR_UNSUPPORTED, "%s: enable_moe_block (Gemma 4's mixture-of-experts feed-forward) is "
                       "not supported", path);
    cfg->attn_k_eq_v = json_get_bool(root, "attention_k_eq_v", 0);
    GB_TRY(read_gemma4_geometry(root, path, cfg));
    GB_TRY(get_int_in(root, "num_kv_shared_layers", 0, 0, cfg->n_layer - 1, path, &cfg->n_kv_shared));
    cfg->ff_wide_shared = json_get_bool(root, "use_double_wide_mlp", 0);
    const cJSON *ple = cJSON_GetObjectItemCaseSensitive(root, "hidden_size_per_layer_input");
    if (!ple) cfg->ple_dim = 256;
    else if (!cJSON_IsNull(ple)) GB_TRY(get_int_in(root, "hidden_size_per_layer_input", 0, 0, 65536, path, &cfg->ple_dim));
    if (cfg->ple_dim) GB_TRY(get_pos_int(root, "vocab_size_per_layer_input", 262144, path, &cfg->ple_vocab));
    if ((int64_t)cfg->ple_dim * cfg->n_layer > CONFIG_MAX_INT)
        return err_set(GERBIL_ERR_FORMAT, "%s: hidden_size_per_layer_input %d x %d layers is too large", path,
                       cfg->ple_dim, cfg->n_layer);
    return parse_act(json_get_str(root, "hidden_activation", "gelu_pytorch_tanh"), "hidden_activation", path,
                     &cfg->act);
}

/* Gemma 4 KV sharing: layer l >= n_layer - num_kv_shared_layers reads the cache of the last
 * earlier (unshared) layer of its type. */
gerbil_status model_kv_sources(const char *path, struct model_config *cfg) {
    cfg->layer_kv_src = malloc((size_t)cfg->n_layer * sizeof *cfg->layer_kv_src);
    if (!cfg->layer_kv_src) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    const int first = cfg->n_layer - cfg->n_kv_shared;
    for (int l = 0; l < cfg->n_layer; l++) {
        cfg->layer_kv_src[l] = l;
        if (l < first) continue;
        int src = -1;
        for (int j = first - 1; j >= 0 && src < 0; j--)
            if (cfg->layer_sliding[j] == cfg->layer_sliding[l]) src = j;
        if (src < 0)
            return err_set(GERBIL_ERR_FORMAT, "%s: num_kv_shared_layers %d: layer %d (%s) has no earlier layer of its "
                           "type to share the KV of", path, cfg->n_kv_shared, l,
                           cfg->layer_sliding[l] ? "sliding_attention" : "full_attention");
        cfg->layer_kv_src[l] = src;
    }
    return GERBIL_OK;
}

static gerbil_status parse_config(const cJSON *top, const char *path, struct model_config *cfg) {
    if (!cJSON_IsObject(top)) return err_set(GERBIL_ERR_FORMAT, "%s: not a JSON object", path);

    const char *cls = NULL;
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(top, "architectures");
    if (cJSON_IsArray(archs) && cJSON_GetArraySize(archs) > 0 && cJSON_IsString(cJSON_GetArrayItem(archs, 0)))
        cls = cJSON_GetArrayItem(archs, 0)->valuestring;
    const char *mtype = json_get_str(top, "model_type", NULL);
    if (model_arch_from_name(cls, mtype, &cfg->arch) != 0)
        return err_set(GERBIL_ERR_UNSUPPORTED,
                       "%s: unknown architecture \"%s\" (model_type \"%s\"); supported: "
                       "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
                       "Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration (text), Qwen3NextForCausalLM, "
                       "Gemma3ForCausalLM, Gemma3ForConditionalGeneration (text), Gemma4ForCausalLM, "
                       "Gemma4ForConditionalGeneration (text), Lfm2ForCausalLM",
                       path, cls ? cls : "(none)", mtype ? mtype : "(none)");
    /* root: where the text model's hyperparameters are, text_config in a multimodal
     * checkpoint (whose top level still holds quantization and, often, tie_word_embeddings) */
    const cJSON *root = top, *tc = cJSON_GetObjectItemCaseSensitive(top, "text_config");
    if (cJSON_IsObject(tc)) root = tc;
    else if (cls && strstr(cls, "ForConditionalGeneration"))
        return err_set(GERBIL_ERR_FORMAT, "%s: %s without a \"text_config\" object", path, cls);
    snprintf(cfg->arch_name, sizeof cfg->arch_name, "%s%s", cls ? cls : model_arch_name(cfg->arch),
             root != top ? " (text)" : "");
    const int g = cfg->arch == ARCH_GEMMA3; /* Gemma3TextConfig has defaults for every size */
    const size_t cls_len = cls ? strlen(cls) : 0;
    cfg->no_lm_head = cls_len > 5 && strcmp(cls + cls_len - 5, "Model") == 0; /* Qwen3Model, Gemma3TextModel */

    GB_TRY(get_pos_int(root, "vocab_size", g ? 262208 : 0, path, &cfg->n_vocab));
    GB_TRY(get_pos_int(root, "hidden_size", g ? 2304 : 0, path, &cfg->n_embd));
    GB_TRY(get_pos_int(root, "num_hidden_layers", g ? 26 : 0, path, &cfg->n_layer));
    GB_TRY(get_pos_int(root, "num_attention_heads", g ? 8 : 0, path, &cfg->n_head));
    const int lfm2 = cfg->arch == ARCH_LFM2; /* its own keys and defaults (Lfm2Config) */
    GB_TRY(get_pos_int(root, "num_key_value_heads", g ? 4 : lfm2 ? 8 : cfg->n_head, path, &cfg->n_head_kv));
    if (lfm2) GB_TRY(read_lfm2(root, path, cfg));
    else GB_TRY(get_pos_int(root, "intermediate_size", g ? 9216 : 0, path, &cfg->n_ff));
    GB_TRY(get_pos_int(root, "max_position_embeddings", g ? 131072 : lfm2 ? 128000 : 2048, path, &cfg->n_ctx_train));
    if (!g && cfg->n_embd % cfg->n_head && !json_has(root, "head_dim"))
        return err_set(GERBIL_ERR_FORMAT, "%s: hidden_size %d not divisible by num_attention_heads %d",
                       path, cfg->n_embd, cfg->n_head);
    GB_TRY(get_pos_int(root, "head_dim", g ? 256 : cfg->n_embd / cfg->n_head, path, &cfg->head_dim));
    if (cfg->n_head % cfg->n_head_kv)
        return err_set(GERBIL_ERR_FORMAT, "%s: num_attention_heads %d not a multiple of num_key_value_heads %d",
                       path, cfg->n_head, cfg->n_head_kv);
    if (cfg->n_layer > MODEL_MAX_LAYERS)
        return err_set(GERBIL_ERR_FORMAT, "%s: num_hidden_layers %d is absurd", path, cfg->n_layer);
    const char *eps_key = lfm2 ? "norm_eps" : "rms_norm_eps";
    const double eps = json_get_num(root, eps_key, lfm2 ? 1e-5 : 1e-6);
    if (!(eps > 0 && eps <= 1)) return err_set(GERBIL_ERR_FORMAT, "%s: %s must be in (0, 1]", path, eps_key);
    cfg->norm_eps = (float)eps;
    if (!(cfg->norm_eps > 0)) return err_set(GERBIL_ERR_FORMAT, "%s: %s must be positive", path, eps_key);

    cfg->tie_embeddings = json_get_bool(root, "tie_word_embeddings",
                                        json_get_bool(top, "tie_word_embeddings", g || lfm2 || cfg->arch == ARCH_GEMMA4));
    if (lfm2) cfg->tie_embeddings = json_get_bool(root, "tie_embedding", cfg->tie_embeddings); /* the original key wins */
    int attention_bias = json_get_bool(root, "attention_bias", 0);
    switch (cfg->arch) {
    case ARCH_QWEN2: cfg->attn_qkv_bias = 1; break;
    case ARCH_MISTRAL: break;
    case ARCH_LLAMA:
        cfg->attn_qkv_bias = cfg->attn_o_bias = attention_bias;
        cfg->mlp_bias = json_get_bool(root, "mlp_bias", 0);
        break;
    case ARCH_QWEN3:
        cfg->attn_qkv_bias = cfg->attn_o_bias = attention_bias;
        cfg->qk_norm = 1;
        break;
    case ARCH_QWEN35:
        cfg->attn_qkv_bias = cfg->attn_o_bias = attention_bias;
        cfg->qk_norm = cfg->norm_add_one = cfg->attn_out_gate = 1;
        GB_TRY(read_deltanet(root, path, cfg));
        break;
    case ARCH_GEMMA3: GB_TRY(read_gemma3(root, path, cfg)); break;
    case ARCH_GEMMA4: GB_TRY(read_gemma4(root, path, cfg)); break;
    case ARCH_QWEN3NEXT:
        cfg->attn_qkv_bias = cfg->attn_o_bias = attention_bias;
        cfg->qk_norm = cfg->norm_add_one = cfg->attn_out_gate = 1;
        GB_TRY(read_deltanet(root, path, cfg));
        cfg->dn.fused_proj = FUSED_QKVZ | FUSED_BA;
        GB_TRY(read_moe(root, path, cfg));
        break;
    default: break;
    }
    if (!g && cfg->arch != ARCH_GEMMA4) GB_TRY(parse_act(json_get_str(root, "hidden_act", "silu"), "hidden_act", path, &cfg->act));

    const char *dt = json_get_str(root, "torch_dtype", NULL);
    if (!dt) dt = json_get_str(root, "dtype", NULL);
    if (!dt) dt = json_get_str(top, "torch_dtype", NULL);
    if (!dt) dt = json_get_str(top, "dtype", "");
    snprintf(cfg->dtype, sizeof cfg->dtype, "%s", dt);

    GB_TRY(read_bos(root, path, cfg));
    GB_TRY(read_eos(root, path, cfg));
    if (root != top) { GB_TRY(read_bos(top, path, cfg)); GB_TRY(read_eos(top, path, cfg)); }
    GB_TRY(read_rope(root, path, cfg));
    GB_TRY(read_layer_types(root, path, cfg));
    if (cfg->arch == ARCH_GEMMA4) GB_TRY(model_kv_sources(path, cfg));
    GB_TRY(read_mlx_quant(top, path, cfg));
    return GERBIL_OK;
}

gerbil_status model_config_load(const char *dir, struct model_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->bos_id = -1;
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (!file_exists(path))
        return err_set(GERBIL_ERR_IO, "%s: no config.json (expected a Hugging Face model folder)", dir);
    cJSON *root = NULL;
    GB_TRY(json_load_file(path, &root));
    gerbil_status st = parse_config(root, path, cfg);
    cJSON_Delete(root);
    if (st != GERBIL_OK) { model_config_free(cfg); return st; }

    /* generation_config.json overrides the special ids. */
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    if (file_exists(path)) {
        st = json_load_file(path, &root);
        if (st != GERBIL_OK) { model_config_free(cfg); return st; }
        if (cJSON_IsObject(root)) {
            st = read_bos(root, path, cfg);
            if (st == GERBIL_OK) st = read_eos(root, path, cfg);
        }
        cJSON_Delete(root);
        if (st != GERBIL_OK) { model_config_free(cfg); return st; }
    }
    return GERBIL_OK;
}

void model_config_free(struct model_config *cfg) {
    free(cfg->layer_sliding);
    free(cfg->layer_kind);
    free(cfg->layer_moe);
    free(cfg->layer_kv_src);
    cfg->layer_kv_src = NULL;
    cfg->layer_sliding = NULL;
    cfg->layer_kind = NULL;
    cfg->layer_moe = NULL;
    for (int i = 0; i < cfg->mlx.n_over; i++) free(cfg->mlx.over[i].module);
    free(cfg->mlx.over);
    memset(&cfg->mlx, 0, sizeof cfg->mlx);
}
