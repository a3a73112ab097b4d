/* Hyperparameters of a GGUF checkpoint from its metadata ({arch}.* keys as llama.cpp
 * writes them), mapped onto the same model_config the Hugging Face loader fills. */
#include "base/status.h"
#include "io/gguf.h"
#include "model/config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *gguf;
    enum model_arch arch;
} gguf_archs[] = {
    {"llama", ARCH_LLAMA},
    {"qwen2", ARCH_QWEN2},
    {"qwen3", ARCH_QWEN3},
    {"qwen35", ARCH_QWEN35},
    {"gemma3", ARCH_GEMMA3},
    {"qwen3next", ARCH_QWEN3NEXT},
    {"lfm2", ARCH_LFM2},
    {"gemma4", ARCH_GEMMA4},
};

enum { OPTIONAL_ZERO_OK = 1 };

/* "{arch}.{suffix}" as a u32: def when absent; a zero is an error unless zero_ok. */
static gerbil_status arch_u32_x(const struct gguf_file *f, const char *arch, const char *suffix, uint32_t def,
                                int zero_ok, const char *path, uint32_t *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    GB_TRY(gguf_get_u32(f, key, def, out));
    if (*out == 0 && !zero_ok)
        return err_set(GERBIL_ERR_FORMAT, "%s: missing or zero metadata \"%s\"", path, key);
    if (*out > CONFIG_MAX_INT) /* as config.json's sizes: an int, and twice it too */
        return err_set(GERBIL_ERR_FORMAT, "%s: metadata \"%s\" = %u is out of range (at most %d)", path, key, *out,
                       CONFIG_MAX_INT);
    return GERBIL_OK;
}

static gerbil_status arch_u32(const struct gguf_file *f, const char *arch, const char *suffix, uint32_t def,
                              const char *path, uint32_t *out) {
    return arch_u32_x(f, arch, suffix, def, 0, path, out);
}

/* "{arch}.{suffix}" as a finite f32: def when absent. */
static gerbil_status arch_f32(const struct gguf_file *f, const char *arch, const char *suffix, float def,
                              float *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    GB_TRY(gguf_get_f32(f, key, def, out));
    if (!isfinite(*out))
        return err_set(GERBIL_ERR_FORMAT, "%s: metadata \"%s\" = %g is not a finite number", f->map.path, key, *out);
    return GERBIL_OK;
}

/* {arch}.attention.head_count_kv: one number, or (LFM2) one per layer where 0 marks a
 * short-convolution layer; the attention layers must agree. *per_layer: that array or NULL. */
static gerbil_status head_count_kv(const struct gguf_file *f, const char *arch, const char *path,
                                   struct model_config *cfg, const struct gguf_kv **per_layer) {
    char key[128];
    snprintf(key, sizeof key, "%s.attention.head_count_kv", arch);
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv || kv->type != GGUF_VT_ARRAY) {
        uint32_t v;
        GB_TRY(arch_u32(f, arch, "attention.head_count_kv", (uint32_t)cfg->n_head, path, &v));
        cfg->n_head_kv = (int)v;
        return GERBIL_OK;
    }
    GB_TRY(gguf_get_arr(f, key, kv->arr_type, per_layer)); /* validates the element type */
    if (cfg->arch != ARCH_LFM2 || (kv->arr_type != GGUF_VT_U32 && kv->arr_type != GGUF_VT_I32))
        return err_set(GERBIL_ERR_UNSUPPORTED, "%s: per-layer \"%s\" is not supported for GGUF architecture %s "
                       "(only lfm2, as integers)", path, key, arch);
    if (kv->arr_n != (uint64_t)cfg->n_layer)
        return err_set(GERBIL_ERR_FORMAT, "%s: \"%s\" has %llu entries for %d layers", path, key,
                       (unsigned long long)kv->arr_n, cfg->n_layer);
    cfg->n_head_kv = 0;
    for (uint64_t i = 0; i < kv->arr_n; i++) {
        const int64_t n = gguf_arr_int(kv, i);
        if (n < 0 || n > 4096 || (n && cfg->n_head_kv && n != cfg->n_head_kv))
            return err_set(GERBIL_ERR_UNSUPPORTED, "%s: \"%s\"[%llu] = %lld: attention layers with different "
                           "numbers of KV heads are not supported", path, key, (unsigned long long)i, (long long)n);
        if (n) cfg->n_head_kv = (int)n;
    }
    if (!cfg->n_head_kv) cfg->n_head_kv = cfg->n_head; /* no attention layer: unused */
    return GERBIL_OK;
}

/* Gated DeltaNet sizes and which layers are recurrent, as llama.cpp's qwen35 loader
 * reads them. The converter stores value heads grouped by key head in tiled order
 * (value head j * nk + g belongs to key head g) when there are more value heads. */
static gerbil_status gguf_deltanet(const struct gguf_file *f, const char *arch, const char *path,
                                   struct model_config *cfg) {
    struct deltanet_config *d = &cfg->dn;
    uint32_t v, inner;
    GB_TRY(arch_u32(f, arch, "ssm.conv_kernel", 0, path, &v)); d->conv_kernel = (int)v;
    GB_TRY(arch_u32(f, arch, "ssm.state_size", 0, path, &v)); d->k_dim = (int)v;
    GB_TRY(arch_u32(f, arch, "ssm.group_count", 0, path, &v)); d->n_k_heads = (int)v;
    GB_TRY(arch_u32(f, arch, "ssm.time_step_rank", 0, path, &v)); d->n_v_heads = (int)v;
    GB_TRY(arch_u32(f, arch, "ssm.inner_size", 0, path, &inner));
    if (d->conv_kernel > 64 || d->k_dim > 4096 || d->n_v_heads > 4096 || d->n_v_heads % d->n_k_heads ||
        inner % (uint32_t)d->n_v_heads)
        return err_set(GERBIL_ERR_FORMAT, "%s: inconsistent ssm.* metadata for %s", path, arch);
    d->v_dim = (int)(inner / (uint32_t)d->n_v_heads);
    /* qwen3next keeps Hugging Face's grouped order (value head g * r + j: key head g) */
    d->v_heads_tiled = cfg->arch == ARCH_QWEN35 && d->n_v_heads != d->n_k_heads;
    uint32_t every;
    GB_TRY(arch_u32(f, arch, "full_attention_interval", 4, path, &every));
    for (int i = 0; i < cfg->n_layer; i++) cfg->layer_kind[i] = (i + 1) % (int)every ? LAYER_DELTANET : LAYER_ATTENTION;
    return GERBIL_OK;
}

/* qwen3next: in_proj_ba is always fused (ssm_ba); in_proj_qkvz is split into attn_qkv
 * and attn_gate by current converters, fused (ssm_in) by older ones. A layer is MoE
 * when it has a router (ffn_gate_inp), as llama.cpp decides; llama.cpp always
 * renormalises the selected experts' weights. */
static gerbil_status gguf_moe(const struct gguf_file *f, const char *arch, const char *path, struct model_config *cfg) {
    cfg->dn.fused_proj = FUSED_BA | (gguf_find_tensor(f, "blk.0.ssm_in.weight") ? FUSED_QKVZ : 0);
    struct moe_config *m = &cfg->moe;
    uint32_t v;
    cfg->layer_moe = calloc((size_t)cfg->n_layer, 1);
    if (!cfg->layer_moe) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    GB_TRY(arch_u32_x(f, arch, "expert_count", 0, OPTIONAL_ZERO_OK, path, &v));
    if (v > 65536) return err_set(GERBIL_ERR_FORMAT, "%s: %s.expert_count %u is absurd", path, arch, v);
    m->n_expert = (int)v;
    if (!m->n_expert) return GERBIL_OK;
    GB_TRY(arch_u32(f, arch, "expert_used_count", 0, path, &v)); m->n_used = (int)v;
    if (m->n_used > m->n_expert)
        return err_set(GERBIL_ERR_FORMAT, "%s: %s.expert_used_count %d exceeds expert_count %d", path, arch, m->n_used,
                       m->n_expert);
    GB_TRY(arch_u32(f, arch, "expert_feed_forward_length", 0, path, &v)); m->n_ff_exp = (int)v;
    GB_TRY(arch_u32_x(f, arch, "expert_shared_feed_forward_length", 0, OPTIONAL_ZERO_OK, path, &v));
    m->n_ff_shexp = v ? (int)v : cfg->n_ff; /* as llama.cpp: the dense size when absent */
    if (m->n_ff_exp > (1 << 22) || m->n_ff_shexp > (1 << 22))
        return err_set(GERBIL_ERR_FORMAT, "%s: absurd expert sizes in the metadata", path);
    m->norm_topk_prob = 1;
    char name[64];
    for (int l = 0; l < cfg->n_layer; l++) {
        snprintf(name, sizeof name, "blk.%d.ffn_gate_inp.weight", l);
        cfg->layer_moe[l] = gguf_find_tensor(f, name) != NULL;
    }
    return GERBIL_OK;
}

/* "{arch}.{suffix}": one integer (or bool) for every layer, or an array of n_layer; def < 0: required. */
static gerbil_status layer_ints(const struct gguf_file *f, const char *arch, const char *suffix, int64_t def,
                                int n_layer, const char *path, int32_t *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv || kv->type != GGUF_VT_ARRAY) {
        uint32_t v;
        if (kv && kv->type == GGUF_VT_BOOL) {
            int b;
            GB_TRY(gguf_get_bool(f, key, 0, &b));
            v = (uint32_t)b;
        } else {
            if (!kv && def < 0) return err_set(GERBIL_ERR_FORMAT, "%s: missing metadata \"%s\"", path, key);
            GB_TRY(arch_u32_x(f, arch, suffix, (uint32_t)(def < 0 ? 0 : def), OPTIONAL_ZERO_OK, path, &v));
        }
        for (int i = 0; i < n_layer; i++) out[i] = (int32_t)v;
        return GERBIL_OK;
    }
    if (kv->arr_n != (uint64_t)n_layer)
        return err_set(GERBIL_ERR_FORMAT, "%s: \"%s\" has %llu entries for %d layers", path, key,
                       (unsigned long long)kv->arr_n, n_layer);
    const struct gguf_kv *a;
    if (kv->arr_type == GGUF_VT_BOOL) {
        GB_TRY(gguf_get_arr(f, key, GGUF_VT_BOOL, &a));
        for (int i = 0; i < n_layer; i++) out[i] = ((const unsigned char *)a->arr_data)[i] != 0;
        return GERBIL_OK;
    }
    GB_TRY(gguf_get_arr(f, key, kv->arr_type, &a));
    if (kv->arr_type != GGUF_VT_U32 && kv->arr_type != GGUF_VT_I32)
        return err_set(GERBIL_ERR_FORMAT, "%s: \"%s\" must hold integers", path, key);
    for (int i = 0; i < n_layer; i++) {
        int64_t x = gguf_arr_int(a, (uint64_t)i);
        if (x < 0 || x > CONFIG_MAX_INT)
            return err_set(GERBIL_ERR_FORMAT, "%s: \"%s\"[%d] = %lld is out of range", path, key, i, (long long)x);
        out[i] = (int32_t)x;
    }
    return GERBIL_OK;
}

/* Gemma 4 as llama.cpp's converter writes it (conversion/gemma.py Gemma4Model): key_length /
 * key_length_swa the full / sliding head_dim, per-layer head_count_kv and feed_forward_length
 * arrays, sliding_window_pattern a bool per layer, shared_kv_layers, the per-layer-embedding
 * width, norms stored as w, and the full layers' proportional RoPE as rope_freqs (1 for a rotated
 * pair, 1e30 for the others). */
static gerbil_status gguf_gemma4_layers(const struct gguf_file *f, const char *arch, const char *path,
                                        struct model_config *cfg, int32_t *ff, int32_t *kvh, int32_t *swa) {
    const int L = cfg->n_layer;
    uint32_t v;
    GB_TRY(layer_ints(f, arch, "feed_forward_length", -1, L, path, ff));
    GB_TRY(layer_ints(f, arch, "attention.head_count_kv", cfg->n_head, L, path, kvh));
    GB_TRY(layer_ints(f, arch, "attention.sliding_window_pattern", -1, L, path, swa));
    const int hd_full = cfg->head_dim;
    GB_TRY(arch_u32(f, arch, "attention.key_length_swa", (uint32_t)hd_full, path, &v));
    if (v > 65536 || v % 2) return err_set(GERBIL_ERR_FORMAT, "%s: key_length_swa %u", path, v);
    cfg->head_dim = (int)v;
    cfg->head_dim_full = hd_full != cfg->head_dim ? hd_full : 0;
    GB_TRY(arch_u32_x(f, arch, "attention.shared_kv_layers", 0, OPTIONAL_ZERO_OK, path, &v));
    if (v >= (uint32_t)L) return err_set(GERBIL_ERR_FORMAT, "%s: shared_kv_layers %u for %d layers", path, v, L);
    cfg->n_kv_shared = (int)v;
    int kv_swa = 0, kv_full = 0;
    for (int i = 0; i < L; i++) {
        cfg->layer_sliding[i] = (uint8_t)(swa[i] != 0);
        int *k = swa[i] ? &kv_swa : &kv_full;
        if (kvh[i] <= 0 || kvh[i] > 4096 || cfg->n_head % kvh[i] || (*k && *k != kvh[i]))
            return err_set(GERBIL_ERR_UNSUPPORTED, "%s: head_count_kv[%d] = %d is not supported (layers of one type "
                           "must agree and divide head_count %d)", path, i, kvh[i], cfg->n_head);
        *k = kvh[i];
    }
    cfg->n_head_kv = kv_swa ? kv_swa : kv_full;
    cfg->n_head_kv_full = kv_full && kv_full != cfg->n_head_kv ? kv_full : 0;
    GB_TRY(model_kv_sources(path, cfg));
    cfg->n_ff = ff[0];
    for (int i = 0; i < L; i++) {
        const int shared = cfg->layer_kv_src[i] != i;
        if (ff[i] == 2 * cfg->n_ff && shared && cfg->n_ff) cfg->ff_wide_shared = 1;
        else if (ff[i] != cfg->n_ff || ff[i] == 0)
            return err_set(GERBIL_ERR_UNSUPPORTED, "%s: feed_forward_length[%d] = %d (layer 0: %d) is not supported",
                           path, i, ff[i], cfg->n_ff);
    }
    for (int i = 0; i < L; i++)
        if (cfg->ff_wide_shared && cfg->layer_kv_src[i] != i && ff[i] != 2 * cfg->n_ff)
            return err_set(GERBIL_ERR_UNSUPPORTED, "%s: feed_forward_length[%d] = %d: the KV-shared layers' widths "
                           "differ", path, i, ff[i]);
    return GERBIL_OK;
}

static gerbil_status gguf_gemma4(const struct gguf_file *f, const char *arch, const char *path,
                                 struct model_config *cfg) {
    const int L = cfg->n_layer;
    uint32_t v;
    cfg->qk_norm = cfg->v_norm = cfg->post_norms = cfg->embd_scale = 1;
    cfg->act = ACT_GELU_TANH;
    cfg->attn_scale = 1.0f;
    GB_TRY(arch_f32(f, arch, "final_logit_softcapping", 0.0f, &cfg->final_softcap));
    if (cfg->final_softcap < 0) return err_set(GERBIL_ERR_FORMAT, "%s: final_logit_softcapping must not be negative", path);
    if (gguf_find_tensor(f, "blk.0.ffn_gate_inp.weight"))
        return err_set(GERBIL_ERR_UNSUPPORTED, "%s: Gemma 4's mixture-of-experts layers (ffn_gate_inp) are not "
                       "supported", path);
    int32_t *tmp = malloc(3 * (size_t)L * sizeof *tmp);
    if (!tmp) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    gerbil_status st = gguf_gemma4_layers(f, arch, path, cfg, tmp, tmp + L, tmp + 2 * L);
    free(tmp);
    GB_TRY(st);
    for (int l = 0; l < L; l++) /* attention_k_eq_v: the full layers have no attn_v */
        if (!cfg->layer_sliding[l] && cfg->layer_kv_src[l] == l) {
            char name[64];
            snprintf(name, sizeof name, "blk.%d.attn_v.weight", l);
            cfg->attn_k_eq_v = gguf_find_tensor(f, name) == NULL;
            break;
        }
    GB_TRY(arch_u32_x(f, arch, "embedding_length_per_layer_input", 0, OPTIONAL_ZERO_OK, path, &v));
    if (v > 65536) return err_set(GERBIL_ERR_FORMAT, "%s: embedding_length_per_layer_input %u", path, v);
    cfg->ple_dim = (int)v;
    if (cfg->ple_dim) {
        const struct gb_tensor *t = gguf_find_tensor(f, "per_layer_token_embd.weight");
        if (!t || t->n_dims != 2 || t->ne[0] > CONFIG_MAX_INT)
            return err_set(GERBIL_ERR_FORMAT, "%s: no 2-D tensor \"per_layer_token_embd.weight\"", path);
        cfg->ple_vocab = (int)t->ne[0];
    }
    cfg->layer_scalar = gguf_find_tensor(f, "blk.0.layer_output_scale.weight") != NULL;
    GB_TRY(arch_u32(f, arch, "attention.sliding_window", 512, path, &v));
    cfg->sliding_window = (int)v;
    /* RoPE: full layers rope.freq_base over rope.dimension_count (= their head_dim), sliding
     * layers rope.freq_base_swa over rope.dimension_count_swa */
    struct rope_config *r = &cfg->rope;
    const int hdf = max_head_dim(cfg);
    GB_TRY(arch_u32(f, arch, "rope.dimension_count", (uint32_t)hdf, path, &v));
    if ((int)v != hdf) return err_set(GERBIL_ERR_UNSUPPORTED, "%s: rope.dimension_count %u for head_dim %d", path, v, hdf);
    r->n_dims = hdf;
    const struct gb_tensor *rf = gguf_find_tensor(f, "rope_freqs.weight");
    if (rf) {
        if (rf->type != GB_TYPE_F32 || tensor_nelements(rf) != hdf / 2 || (uintptr_t)rf->data % 4)
            return err_set(GERBIL_ERR_FORMAT, "%s: rope_freqs.weight must be %d f32 values", path, hdf / 2);
        const float *x = rf->data;
        int n = 0;
        while (n < hdf / 2 && x[n] == 1.0f) n++;
        for (int i = n; i < hdf / 2; i++)
            if (!(x[i] >= 1e29f))
                return err_set(GERBIL_ERR_UNSUPPORTED, "%s: rope_freqs.weight[%d] = %g: only 1 (rotated) then 1e30 "
                               "(not rotated) is supported", path, i, x[i]);
        r->type = ROPE_PROPORTIONAL;
        r->prop_angles = n;
    }
    float base_swa;
    GB_TRY(arch_f32(f, arch, "rope.freq_base_swa", 10000.0f, &base_swa));
    if (!(base_swa > 1.0f)) return err_set(GERBIL_ERR_FORMAT, "%s: rope.freq_base_swa must be > 1", path);
    GB_TRY(arch_u32(f, arch, "rope.dimension_count_swa", (uint32_t)cfg->head_dim, path, &v));
    if (v < 2 || (int)v > cfg->head_dim || v % 2)
        return err_set(GERBIL_ERR_FORMAT, "%s: rope.dimension_count_swa %u for head_dim %d", path, v, cfg->head_dim);
    cfg->has_rope_local = 1;
    cfg->rope_local = (struct rope_config){
        .type = ROPE_DEFAULT, .theta = base_swa, .factor = 1.0, .n_dims = (int)v, .max_pos = r->max_pos,
    };
    return GERBIL_OK;
}

static gerbil_status from_gguf(const struct gguf_file *f, const char *path, struct model_config *cfg);

/* On failure cfg is freed (and zeroed) here, as model_config_load does. */
gerbil_status model_config_from_gguf(const struct gguf_file *f, const char *path, struct model_config *cfg) {
    gerbil_status st = from_gguf(f, path, cfg);
    if (st != GERBIL_OK) model_config_free(cfg);
    return st;
}

static gerbil_status from_gguf(const struct gguf_file *f, const char *path, struct model_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->bos_id = -1;
    const char *arch = gguf_get_str(f, "general.architecture");
    if (!arch) return err_set(GERBIL_ERR_FORMAT, "%s: no general.architecture in the metadata", path);
    int found = 0;
    for (size_t i = 0; i < sizeof gguf_archs / sizeof gguf_archs[0]; i++)
        if (!strcmp(arch, gguf_archs[i].gguf)) { cfg->arch = gguf_archs[i].arch; found = 1; }
    if (!found)
        return err_set(GERBIL_ERR_UNSUPPORTED, "%s: GGUF architecture \"%s\" is not supported "
                       "(supported: llama, qwen2, qwen3, qwen35, qwen3next, gemma3, gemma4, lfm2)", path, arch);
    snprintf(cfg->arch_name, sizeof cfg->arch_name, "%s (gguf %s)", model_arch_name(cfg->arch), arch);

    uint32_t v;
    GB_TRY(arch_u32(f, arch, "embedding_length", 0, path, &v)); cfg->n_embd = (int)v;
    GB_TRY(arch_u32(f, arch, "block_count", 0, path, &v)); cfg->n_layer = (int)v;
    const int g4 = cfg->arch == ARCH_GEMMA4; /* per-layer widths: read by gguf_gemma4 */
    if (g4) cfg->n_ff = 1;
    else { GB_TRY(arch_u32(f, arch, "feed_forward_length", 0, path, &v)); cfg->n_ff = (int)v; }
    GB_TRY(arch_u32(f, arch, "attention.head_count", 0, path, &v)); cfg->n_head = (int)v;
    const struct gguf_kv *kv_per_layer = NULL;
    if (g4) cfg->n_head_kv = cfg->n_head;
    else GB_TRY(head_count_kv(f, arch, path, cfg, &kv_per_layer));
    GB_TRY(arch_u32(f, arch, "context_length", 2048, path, &v)); cfg->n_ctx_train = (int)v;
    if (cfg->n_layer > MODEL_MAX_LAYERS || cfg->n_embd > (1 << 20) || cfg->n_ff > (1 << 22) || cfg->n_head > 4096)
        return err_set(GERBIL_ERR_FORMAT, "%s: absurd hyperparameters in the metadata", path);
    if (cfg->n_head_kv == 0 || cfg->n_head % cfg->n_head_kv)
        return err_set(GERBIL_ERR_FORMAT, "%s: head_count %d not a multiple of head_count_kv %d", path, cfg->n_head,
                       cfg->n_head_kv);
    GB_TRY(arch_u32(f, arch, "attention.key_length", (uint32_t)(cfg->n_embd / cfg->n_head), path, &v));
    cfg->head_dim = (int)v;
    GB_TRY(arch_u32(f, arch, "attention.value_length", (uint32_t)cfg->head_dim, path, &v));
    if ((int)v != cfg->head_dim)
        return err_set(GERBIL_ERR_UNSUPPORTED, "%s: value_length %u differs from key_length %d", path, v, cfg->head_dim);
    GB_TRY(arch_f32(f, arch, "attention.layer_norm_rms_epsilon", 1e-6f, &cfg->norm_eps));
    if (!(cfg->norm_eps > 0)) return err_set(GERBIL_ERR_FORMAT, "%s: layer_norm_rms_epsilon must be positive", path);

    const struct gb_tensor *emb = gguf_find_tensor(f, "token_embd.weight");
    if (!emb || emb->n_dims != 2) return err_set(GERBIL_ERR_FORMAT, "%s: no 2-D tensor \"token_embd.weight\"", path);
    if (emb->ne[0] > CONFIG_MAX_INT)
        return err_set(GERBIL_ERR_FORMAT, "%s: token_embd.weight has %lld rows, more than %d", path,
                       (long long)emb->ne[0], CONFIG_MAX_INT);
    cfg->n_vocab = (int)emb->ne[0];
    cfg->tie_embeddings = gguf_find_tensor(f, "output.weight") == NULL;
    switch (cfg->arch) {
    case ARCH_LLAMA:
        /* the converter permutes llama q/k rows so llama.cpp can rotate adjacent pairs */
        cfg->rope_interleaved = 1;
        cfg->attn_qkv_bias = gguf_find_tensor(f, "blk.0.attn_q.bias") != NULL;
        cfg->attn_o_bias = gguf_find_tensor(f, "blk.0.attn_output.bias") != NULL;
        cfg->mlp_bias = gguf_find_tensor(f, "blk.0.ffn_up.bias") != NULL;
        break;
    case ARCH_QWEN2: cfg->attn_qkv_bias = 1; break;
    case ARCH_QWEN3: cfg->qk_norm = 1; break;
    case ARCH_QWEN35: cfg->qk_norm = cfg->attn_out_gate = 1; break; /* norms stored as 1 + w */
    case ARCH_LFM2:
        cfg->qk_norm = 1;
        GB_TRY(arch_u32(f, arch, "shortconv.l_cache", 0, path, &v));
        if (v < 2 || v > 64)
            return err_set(GERBIL_ERR_UNSUPPORTED, "%s: %s.shortconv.l_cache %u is not supported (2 to 64)", path,
                           arch, v);
        cfg->sc.kernel = (int)v;
        break;
    case ARCH_GEMMA3:
        /* as llama.cpp runs it: the converter stored norms as 1 + w (no offset to add here),
         * q/k are not permuted (rotate-half), embeddings scale by sqrtf(n_embd) in f32, and
         * attention by 1/sqrt(head_dim) -- 1/sqrt(n_embd/n_head) for the 62-layer 27B, whose
         * query_pre_attn_scalar is that (the file does not carry it). */
        cfg->qk_norm = 1;
        cfg->post_norms = 1;
        cfg->embd_scale = 1;
        cfg->act = ACT_GELU_TANH;
        cfg->attn_scale = cfg->n_layer == 62 ? 1.0f / sqrtf((float)(cfg->n_embd / cfg->n_head))
                                             : 1.0f / sqrtf((float)cfg->head_dim);
        GB_TRY(arch_f32(f, arch, "final_logit_softcapping", 0.0f, &cfg->final_softcap));
        if (cfg->final_softcap < 0)
            return err_set(GERBIL_ERR_FORMAT, "%s: final_logit_softcapping must not be negative", path);
        break;
    case ARCH_QWEN3NEXT: cfg->qk_norm = cfg->attn_out_gate = 1; break;
    default: break;
    }

    struct rope_config *r = &cfg->rope;
    float theta;
    GB_TRY(arch_f32(f, arch, "rope.freq_base", 10000.0f, &theta));
    if (!(theta > 1.0f)) /* as rope_theta in config.json */
        return err_set(GERBIL_ERR_FORMAT, "%s: %s.rope.freq_base = %g must be > 1", path, arch, theta);
    r->theta = theta;
    GB_TRY(arch_u32(f, arch, "rope.dimension_count", (uint32_t)cfg->head_dim, path, &v));
    r->n_dims = (int)v;
    if (r->n_dims < 2 || r->n_dims > cfg->head_dim || r->n_dims % 2)
        return err_set(GERBIL_ERR_FORMAT, "%s: rope.dimension_count %d for head_dim %d", path, r->n_dims, cfg->head_dim);
    r->max_pos = cfg->n_ctx_train;
    r->type = ROPE_DEFAULT;
    r->factor = 1.0;
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    const char *st = gguf_get_str(f, key);
    if (st && strcmp(st, "none") != 0) {
        float factor;
        GB_TRY(arch_f32(f, arch, "rope.scaling.factor", 0.0f, &factor));
        r->factor = factor;
        GB_TRY(arch_u32(f, arch, "rope.scaling.original_context_length", (uint32_t)cfg->n_ctx_train, path, &v));
        r->orig_max_pos = (int)v;
        if (!strcmp(st, "linear")) r->type = ROPE_LINEAR;
        else if (!strcmp(st, "yarn")) {
            r->type = ROPE_YARN;
            r->beta_fast = 32.0;
            r->beta_slow = 1.0;
            r->truncate = 1;
        } else return err_set(GERBIL_ERR_UNSUPPORTED, "%s: rope scaling \"%s\" is not supported", path, st);
        if (!(r->factor > 0)) return err_set(GERBIL_ERR_FORMAT, "%s: rope.scaling.factor must be positive", path);
    }

    cfg->layer_sliding = calloc((size_t)cfg->n_layer, 1);
    cfg->layer_kind = calloc((size_t)cfg->n_layer, 1);
    if (!cfg->layer_sliding || !cfg->layer_kind) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    for (uint64_t i = 0; kv_per_layer && i < kv_per_layer->arr_n; i++)
        if (gguf_arr_int(kv_per_layer, i) == 0) cfg->layer_kind[i] = LAYER_SHORTCONV;
    GB_TRY(arch_u32_x(f, arch, "attention.sliding_window", 0, OPTIONAL_ZERO_OK, path, &v));
    if (v && cfg->arch == ARCH_GEMMA3) {
        /* llama.cpp: layer il slides when il % pattern < pattern - 1 (pattern 6 unless the file
         * says otherwise); sliding layers rotate with freq_base_swa (default 10000), unscaled */
        cfg->sliding_window = (int)v;
        uint32_t pattern;
        GB_TRY(arch_u32(f, arch, "attention.sliding_window_pattern", 6, path, &pattern));
        for (int i = 0; i < cfg->n_layer; i++) cfg->layer_sliding[i] = (uint32_t)i % pattern < pattern - 1;
        float base_swa;
        GB_TRY(arch_f32(f, arch, "rope.freq_base_swa", 10000.0f, &base_swa));
        if (!(base_swa > 1.0f)) return err_set(GERBIL_ERR_FORMAT, "%s: rope.freq_base_swa must be > 1", path);
        cfg->has_rope_local = 1;
        cfg->rope_local = (struct rope_config){
            .type = ROPE_DEFAULT, .theta = base_swa, .factor = 1.0, .n_dims = r->n_dims, .max_pos = r->max_pos,
        };
    } else if (v) {
        cfg->sliding_window = (int)v;
        for (int i = 0; i < cfg->n_layer; i++) cfg->layer_sliding[i] = 1;
    }
    if (g4) GB_TRY(gguf_gemma4(f, arch, path, cfg));
    if (cfg->arch == ARCH_QWEN35 || cfg->arch == ARCH_QWEN3NEXT) GB_TRY(gguf_deltanet(f, arch, path, cfg));
    if (cfg->arch == ARCH_QWEN3NEXT) GB_TRY(gguf_moe(f, arch, path, cfg));

    /* special ids: UINT32_MAX (absent) and anything outside the vocabulary name no token */
    GB_TRY(gguf_get_u32(f, "tokenizer.ggml.bos_token_id", UINT32_MAX, &v));
    if (v < (uint32_t)cfg->n_vocab) cfg->bos_id = (int32_t)v;
    GB_TRY(gguf_get_u32(f, "tokenizer.ggml.eos_token_id", UINT32_MAX, &v));
    if (v < (uint32_t)cfg->n_vocab) cfg->eos_ids[cfg->n_eos++] = (int32_t)v;
    GB_TRY(gguf_get_u32(f, "tokenizer.ggml.eot_token_id", UINT32_MAX, &v));
    if (v < (uint32_t)cfg->n_vocab && (cfg->n_eos == 0 || cfg->eos_ids[0] != (int32_t)v)) cfg->eos_ids[cfg->n_eos++] = (int32_t)v;
    snprintf(cfg->dtype, sizeof cfg->dtype, "gguf");
    return GERBIL_OK;
}
