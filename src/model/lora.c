/* LoRA adapters: y = W x + scale * B (A x) after each adapted linear, on top of base
 * weights in any format (never changed, never re-quantized).
 *
 * Layouts read:
 *  - PEFT: a folder with adapter_config.json (peft_type LORA; r, lora_alpha, use_rslora,
 *    rank_pattern / alpha_pattern by module name) and adapter_model.safetensors with
 *    base_model.model.<module>.lora_A.weight [r][in] and .lora_B.weight [out][r]; scale =
 *    lora_alpha / r (use_rslora: lora_alpha / sqrt(r)), as peft's LoraLayer. target_modules
 *    and layers_to_transform decide which tensors were saved, so the tensors themselves say
 *    what is adapted. DoRA (use_dora, lora_magnitude_vector), modules_to_save, LoRA biases and
 *    fan_in_fan_out are refused by name.
 *  - mlx-lm (mlx_lm/tuner): a folder with adapters.safetensors (<module>.lora_a [in][r],
 *    .lora_b [r][out]: the transposes of PEFT's) and adapter_config.json whose
 *    lora_parameters.scale multiplies B (A x) directly; fine_tune_type dora / full refused.
 *  - llama.cpp GGUF adapters (general.type = adapter, adapter.type = lora,
 *    adapter.lora.alpha): blk.N.<tensor>.weight.lora_a [r][in] and .lora_b [out][r]; scale =
 *    alpha / r (alpha 0: 1), as llama.cpp.
 * A and B are converted to f32 at load and kept in backend memory, one block per adapter.
 *
 * Ids: 0 is the bare base; each loaded adapter gets an id, and an id may stand for several
 * adapters summed (gerbil_adapter_stack), applied in the order given. */
#include "model/lora.h"
#include "base/fp16.h"
#include "base/status.h"
#include "io/gguf.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct lora_mat {
    int rank, n_in, n_out;
    float scale;
    float *a, *bt; /* backend memory: A [rank][n_in], B^T [rank][n_out] */
};

struct lora_adapter {
    int refs;
    struct lora_mat *mats; /* [n_layer * LT_COUNT]; rank 0: not adapted */
    void *mem;
    size_t bytes;
};

struct lora_set {
    int used, n;
    struct lora_adapter *part[LORA_MAX_PARTS];
    float scale[LORA_MAX_PARTS];
};

struct lora_registry {
    int cap;
    struct lora_set *sets; /* [cap]; sets[0] is the base */
};

/* ---- names ---- */

static const struct {
    const char *hf, *gguf;
    enum lora_target t;
} target_names[] = {
    {"self_attn.q_proj", "attn_q", LT_Q},
    {"self_attn.k_proj", "attn_k", LT_K},
    {"self_attn.v_proj", "attn_v", LT_V},
    {"self_attn.o_proj", "attn_output", LT_O},
    {"self_attn.out_proj", NULL, LT_O}, /* LFM2 */
    {"mlp.gate_proj", "ffn_gate", LT_GATE},
    {"mlp.up_proj", "ffn_up", LT_UP},
    {"mlp.down_proj", "ffn_down", LT_DOWN},
    {"feed_forward.w1", NULL, LT_GATE}, /* LFM2 */
    {"feed_forward.w3", NULL, LT_UP},
    {"feed_forward.w2", NULL, LT_DOWN},
    {"linear_attn.in_proj_qkv", "attn_qkv", LT_DN_QKV},
    {"linear_attn.in_proj_z", "attn_gate", LT_DN_Z},
    {"linear_attn.in_proj_b", "ssm_beta", LT_DN_B},
    {"linear_attn.in_proj_a", "ssm_alpha", LT_DN_A},
    {"linear_attn.out_proj", "ssm_out", LT_DN_OUT},
};

static const char *target_label(enum lora_target t) {
    for (size_t i = 0; i < sizeof target_names / sizeof *target_names; i++)
        if (target_names[i].t == t) return target_names[i].hf;
    return "?";
}

/* The base linear of target t in layer l, or NULL when the layer has none. */
static const struct gb_weight *target_weight(const struct gerbil_model *m, int l, enum lora_target t) {
    const struct layer_weights *w = &m->layers[l];
    const struct gb_weight *p = NULL;
    switch (t) {
    case LT_Q: p = &w->wq; break;
    case LT_K: p = &w->wk; break;
    case LT_V: p = &w->wv; break;
    case LT_O: p = &w->wo; break;
    case LT_GATE: p = &w->w_gate; break;
    case LT_UP: p = &w->w_up; break;
    case LT_DOWN: p = &w->w_down; break;
    case LT_DN_QKV: p = &w->w_qkv; break;
    case LT_DN_Z: p = &w->w_z; break;
    case LT_DN_B: p = &w->w_b; break;
    case LT_DN_A: p = &w->w_a; break;
    case LT_DN_OUT: p = &w->w_out; break;
    default: return NULL;
    }
    if (m->cfg.layer_kind[l] == LAYER_SHORTCONV && t == LT_DN_OUT) return NULL; /* w_out is LFM2's conv out_proj */
    if (m->cfg.layer_moe && m->cfg.layer_moe[l] && (t == LT_GATE || t == LT_UP || t == LT_DOWN)) return NULL;
    return p->n_out > 0 ? p : NULL;
}

/* "....layers.N.<module>" -> N and the target; -1 when the name has no layer, -2 when the
 * module is not one gerbil adapts. */
static int parse_module(const char *mod, enum lora_target *t) {
    const char *p = mod;
    for (;;) {
        const char *q = strstr(p, "layers.");
        if (!q) return -1;
        if ((q == mod || q[-1] == '.') && q[7] >= '0' && q[7] <= '9') {
            char *end;
            long l = strtol(q + 7, &end, 10);
            if (*end != '.' || l > 1000000) return -1;
            for (size_t i = 0; i < sizeof target_names / sizeof *target_names; i++)
                if (!strcmp(end + 1, target_names[i].hf)) {
                    *t = target_names[i].t;
                    return (int)l;
                }
            return -2;
        }
        p = q + 7;
    }
}

/* ---- what a loader collects ---- */

struct piece {
    int layer;
    enum lora_target t;
    int rank, n_in, n_out;
    float scale;
    float *a, *b; /* host: [rank][n_in], [n_out][rank] */
};

struct pieces {
    int n, cap;
    struct piece *p;
};

static void pieces_free(struct pieces *ps) {
    for (int i = 0; i < ps->n; i++) {
        free(ps->p[i].a);
        free(ps->p[i].b);
    }
    free(ps->p);
}

/* A 2-D float tensor as f32 [rows][cols], transposed when asked (the result is then
 * [ne1][ne0]). */
static gerbil_status tensor_f32(const struct gb_tensor *t, const char *what, int transpose, float **out, int64_t *rows,
                                int64_t *cols) {
    if (t->n_dims != 2)
        return err_set(GERBIL_ERR_FORMAT, "%s: tensor %s has %d dimensions, expected 2", what, t->name, t->n_dims);
    if (t->type != GB_TYPE_F32 && t->type != GB_TYPE_F16 && t->type != GB_TYPE_BF16)
        return err_set(GERBIL_ERR_UNSUPPORTED, "%s: tensor %s is %s; LoRA matrices must be F32, F16 or BF16", what,
                       t->name, type_name(t->type));
    const int64_t r = t->ne[0], c = t->ne[1];
    if (r <= 0 || c <= 0 || r > (1 << 24) || c > (1 << 24))
        return err_set(GERBIL_ERR_FORMAT, "%s: tensor %s has shape [%lld, %lld]", what, t->name, (long long)r,
                       (long long)c);
    float *f = malloc((size_t)r * (size_t)c * sizeof *f);
    if (!f) return err_set(GERBIL_ERR_NOMEM, "out of memory reading %s", t->name);
    for (int64_t i = 0; i < r; i++)
        for (int64_t j = 0; j < c; j++) {
            const size_t k = (size_t)i * (size_t)c + (size_t)j;
            float v;
            if (t->type == GB_TYPE_F32) memcpy(&v, (const char *)t->data + k * 4, 4);
            else {
                uint16_t h;
                memcpy(&h, (const char *)t->data + k * 2, 2);
                v = t->type == GB_TYPE_F16 ? f16_to_f32(h) : bf16_to_f32(h);
            }
            f[transpose ? (size_t)j * (size_t)r + (size_t)i : k] = v;
        }
    *out = f;
    *rows = transpose ? c : r;
    *cols = transpose ? r : c;
    return GERBIL_OK;
}

/* A (stored as [rank][in], or [in][rank] when a_t) and B ([out][rank], or [rank][out] when
 * b_t) of one module as a piece. */
static gerbil_status add_piece(struct pieces *ps, const char *what, const char *mod, int layer, enum lora_target t,
                               const struct gb_tensor *ta, const struct gb_tensor *tb, int transposed, float scale) {
    if (!ta || !tb)
        return err_set(GERBIL_ERR_FORMAT, "%s: module %s has %s but no %s", what, mod, ta ? "A" : "B",
                       ta ? "B" : "A");
    if (ps->n == ps->cap) {
        int cap = ps->cap ? 2 * ps->cap : 64;
        struct piece *p = realloc(ps->p, (size_t)cap * sizeof *p);
        if (!p) return err_set(GERBIL_ERR_NOMEM, "out of memory");
        ps->p = p;
        ps->cap = cap;
    }
    struct piece pc = {.layer = layer, .t = t, .scale = scale};
    int64_t ar, ac, br, bc;
    gerbil_status st = tensor_f32(ta, what, transposed, &pc.a, &ar, &ac);
    if (st == GERBIL_OK) st = tensor_f32(tb, what, transposed, &pc.b, &br, &bc);
    if (st == GERBIL_OK && bc != ar)
        st = err_set(GERBIL_ERR_FORMAT, "%s: module %s: A has rank %lld but B %lld", what, mod, (long long)ar,
                     (long long)bc);
    if (st == GERBIL_OK && ar > LORA_MAX_RANK)
        st = err_set(GERBIL_ERR_UNSUPPORTED, "%s: module %s has rank %lld; gerbil supports ranks up to %d", what, mod,
                     (long long)ar, LORA_MAX_RANK);
    if (st != GERBIL_OK) {
        free(pc.a);
        free(pc.b);
        return st;
    }
    for (int i = 0; i < ps->n; i++)
        if (ps->p[i].layer == layer && ps->p[i].t == t) {
            free(pc.a);
            free(pc.b);
            return err_set(GERBIL_ERR_FORMAT, "%s: module %s appears twice", what, mod);
        }
    pc.rank = (int)ar;
    pc.n_in = (int)ac;
    pc.n_out = (int)br;
    ps->p[ps->n++] = pc;
    return GERBIL_OK;
}

static int is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int is_file(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

static int ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && !strcmp(s + n - k, suf);
}

/* peft's rank_pattern / alpha_pattern: the value of the key that names the module (the
 * whole name or its last dotted parts); keys that are regular expressions are refused. */
static gerbil_status pattern_value(const cJSON *pat, const char *what, const char *mod, double *val) {
    const cJSON *e;
    cJSON_ArrayForEach(e, pat) {
        const char *k = e->string;
        if (strpbrk(k, "^$*+?()[]{}|\\"))
            return err_set(GERBIL_ERR_UNSUPPORTED, "%s: pattern key \"%s\" is a regular expression; gerbil matches "
                           "module names only", what, k);
        size_t n = strlen(mod), kn = strlen(k);
        if (!cJSON_IsNumber(e)) return err_set(GERBIL_ERR_FORMAT, "%s: pattern \"%s\" is not a number", what, k);
        if ((n == kn && !strcmp(mod, k)) || (n > kn && !strcmp(mod + n - kn, k) && mod[n - kn - 1] == '.')) {
            *val = e->valuedouble;
            return GERBIL_OK;
        }
    }
    return GERBIL_OK;
}

static gerbil_status load_peft(const char *dir, struct pieces *ps) {
    char path[4096];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    cJSON *cfg = NULL;
    GB_TRY(json_load_file(path, &cfg));
    struct st_file sf = {0};
    gerbil_status st = GERBIL_OK;
    const char *pt = json_get_str(cfg, "peft_type", "LORA");
    const cJSON *mts = cJSON_GetObjectItemCaseSensitive(cfg, "modules_to_save");
    const char *bias = json_get_str(cfg, "bias", "none");
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(cfg, "rank_pattern");
    const cJSON *ap = cJSON_GetObjectItemCaseSensitive(cfg, "alpha_pattern");
    const double r = (double)json_get_int(cfg, "r", 8), alpha = json_get_num(cfg, "lora_alpha", 8);
    const int rs = json_get_bool(cfg, "use_rslora", 0);
    if (strcmp(pt, "LORA")) {
        st = err_set(GERBIL_ERR_UNSUPPORTED, "%s: peft_type %s is not supported (LoRA adapters are)", path, pt);
    } else if (json_get_bool(cfg, "use_dora", 0)) {
        st = err_set(GERBIL_ERR_UNSUPPORTED, "%s: DoRA adapters (use_dora) are not supported", path);
    } else if (cJSON_IsArray(mts) && cJSON_GetArraySize(mts) > 0) {
        const cJSON *m0 = cJSON_GetArrayItem(mts, 0);
        st = err_set(GERBIL_ERR_UNSUPPORTED, "%s: modules_to_save (%s) is not supported: the adapter replaces whole "
                     "modules", path, cJSON_IsString(m0) ? m0->valuestring : "?");
    } else if (strcmp(bias, "none")) {
        st = err_set(GERBIL_ERR_UNSUPPORTED, "%s: bias \"%s\" is not supported (LoRA without biases is)", path, bias);
    } else if (json_get_bool(cfg, "lora_bias", 0)) {
        st = err_set(GERBIL_ERR_UNSUPPORTED, "%s: lora_bias (a bias on lora_B) is not supported", path);
    } else if (cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(cfg, "target_parameters")) &&
               cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(cfg, "target_parameters")) > 0) {
        st = err_set(GERBIL_ERR_UNSUPPORTED, "%s: target_parameters (LoRA on nn.Parameter, e.g. MoE expert "
                     "tensors) is not supported", path);
    } else if (json_get_bool(cfg, "fan_in_fan_out", 0)) {
        st = err_set(GERBIL_ERR_UNSUPPORTED, "%s: fan_in_fan_out (Conv1D bases) is not supported", path);
    } else if (r <= 0 || !(alpha == alpha)) {
        st = err_set(GERBIL_ERR_FORMAT, "%s: r must be positive", path);
    }
    if (st == GERBIL_OK) {
        snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
        if (!is_file(path))
            st = err_set(GERBIL_ERR_IO, "%s/adapter_model.safetensors is missing (adapter_model.bin, pickled "
                         "torch files, are not read: convert it to safetensors)", dir);
        else st = st_file_open(path, &sf);
    }
    for (int i = 0; st == GERBIL_OK && i < sf.n_tensors; i++) {
        const char *n = sf.tensors[i].name;
        if (strstr(n, "lora_magnitude_vector")) {
            st = err_set(GERBIL_ERR_UNSUPPORTED, "%s: tensor %s is DoRA's magnitude: DoRA is not supported", path, n);
            break;
        }
        if (ends_with(n, ".lora_B.weight")) continue; /* taken with its A */
        if (!ends_with(n, ".lora_A.weight")) {
            st = err_set(GERBIL_ERR_UNSUPPORTED, "%s: tensor %s is not a LoRA A/B matrix (embedding LoRA, biases and "
                         "modules_to_save are not supported)", path, n);
            break;
        }
        char mod[512], bname[600];
        size_t len = strlen(n) - strlen(".lora_A.weight");
        const char *m0 = !strncmp(n, "base_model.model.", 17) ? n + 17 : n;
        len -= (size_t)(m0 - n);
        if (len >= sizeof mod) len = sizeof mod - 1;
        memcpy(mod, m0, len);
        mod[len] = 0;
        enum lora_target t = LT_Q;
        const int l = parse_module(mod, &t);
        if (l < 0) {
            st = err_set(GERBIL_ERR_UNSUPPORTED, "%s: LoRA target %s is not supported (gerbil adapts the attention, "
                         "MLP and Gated DeltaNet projections of each layer)", path, mod);
            break;
        }
        snprintf(bname, sizeof bname, "%.*s.lora_B.weight", (int)(strlen(n) - strlen(".lora_A.weight")), n);
        const struct gb_tensor *ta = &sf.tensors[i], *tb = st_file_find(&sf, bname);
        double rr = r, aa = alpha;
        if (cJSON_IsObject(rp)) st = pattern_value(rp, path, mod, &rr);
        if (st == GERBIL_OK && cJSON_IsObject(ap)) st = pattern_value(ap, path, mod, &aa);
        if (st != GERBIL_OK) break;
        if (ta->n_dims == 2 && ta->ne[0] != (int64_t)rr) {
            st = err_set(GERBIL_ERR_FORMAT, "%s: %s has rank %lld but adapter_config.json says r = %g", path, n,
                         (long long)ta->ne[0], rr);
            break;
        }
        const float scale = (float)(rs ? aa / sqrt(rr) : aa / rr);
        st = add_piece(ps, path, mod, l, t, ta, tb, 0, scale);
    }
    for (int i = 0; st == GERBIL_OK && i < sf.n_tensors; i++) { /* every B has its A */
        const char *n = sf.tensors[i].name;
        if (!ends_with(n, ".lora_B.weight")) continue;
        char aname[600];
        snprintf(aname, sizeof aname, "%.*s.lora_A.weight", (int)(strlen(n) - strlen(".lora_B.weight")), n);
        if (!st_file_find(&sf, aname)) st = err_set(GERBIL_ERR_FORMAT, "%s: %s has no lora_A beside it", path, n);
    }
    if (st == GERBIL_OK && ps->n == 0) st = err_set(GERBIL_ERR_FORMAT, "%s holds no LoRA matrices", path);
    st_file_close(&sf);
    cJSON_Delete(cfg);
    return st;
}

static gerbil_status load_mlx(const char *dir, struct pieces *ps) {
    char path[4096];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    cJSON *cfg = NULL;
    GB_TRY(json_load_file(path, &cfg));
    struct st_file sf = {0};
    gerbil_status st = GERBIL_OK;
    const char *ft = json_get_str(cfg, "fine_tune_type", "lora");
    const cJSON *lp = cJSON_GetObjectItemCaseSensitive(cfg, "lora_parameters");
    if (!strcmp(ft, "dora") || json_get_bool(cfg, "use_dora", 0))
        st = err_set(GERBIL_ERR_UNSUPPORTED, "%s: DoRA adapters (fine_tune_type dora) are not supported", path);
    else if (strcmp(ft, "lora"))
        st = err_set(GERBIL_ERR_UNSUPPORTED, "%s: fine_tune_type %s is not a LoRA adapter", path, ft);
    else if (!cJSON_IsObject(lp) || !json_has(lp, "scale"))
        st = err_set(GERBIL_ERR_FORMAT, "%s: lora_parameters.scale is missing", path);
    const float scale = st == GERBIL_OK ? (float)json_get_num(lp, "scale", 1.0) : 0.0f;
    if (st == GERBIL_OK) {
        snprintf(path, sizeof path, "%s/adapters.safetensors", dir);
        st = st_file_open(path, &sf);
    }
    for (int i = 0; st == GERBIL_OK && i < sf.n_tensors; i++) {
        const char *n = sf.tensors[i].name;
        if (ends_with(n, ".lora_b")) continue;
        if (!ends_with(n, ".lora_a")) {
            st = err_set(GERBIL_ERR_UNSUPPORTED, "%s: tensor %s is not a LoRA matrix (DoRA magnitudes, full "
                         "fine-tunes and embedding adapters are not supported)", path, n);
            break;
        }
        char mod[512], bname[600];
        snprintf(mod, sizeof mod, "%.*s", (int)(strlen(n) - strlen(".lora_a")), n);
        enum lora_target t = LT_Q;
        const int l = parse_module(mod, &t);
        if (l < 0) {
            st = err_set(GERBIL_ERR_UNSUPPORTED, "%s: LoRA target %s is not supported (gerbil adapts the attention, "
                         "MLP and Gated DeltaNet projections of each layer)", path, mod);
            break;
        }
        snprintf(bname, sizeof bname, "%s.lora_b", mod);
        st = add_piece(ps, path, mod, l, t, &sf.tensors[i], st_file_find(&sf, bname), 1, scale);
    }
    if (st == GERBIL_OK && ps->n == 0) st = err_set(GERBIL_ERR_FORMAT, "%s holds no LoRA matrices", path);
    st_file_close(&sf);
    cJSON_Delete(cfg);
    return st;
}

static gerbil_status load_gguf(const char *path, struct pieces *ps) {
    struct gguf_file gf;
    GB_TRY(gguf_open(path, NULL, &gf));
    gerbil_status st = GERBIL_OK;
    const char *gt = gguf_get_str(&gf, "general.type"), *at = gguf_get_str(&gf, "adapter.type");
    float alpha = 0;
    if (!gt || strcmp(gt, "adapter"))
        st = err_set(GERBIL_ERR_FORMAT, "%s: general.type is %s, not adapter: this GGUF is not an adapter", path,
                     gt ? gt : "absent");
    else if (!at || strcmp(at, "lora"))
        st = err_set(GERBIL_ERR_UNSUPPORTED, "%s: adapter.type %s is not supported (lora is)", path, at ? at : "absent");
    else st = gguf_get_f32(&gf, "adapter.lora.alpha", 0.0f, &alpha);
    for (int i = 0; st == GERBIL_OK && i < gf.n_tensors; i++) {
        const char *n = gf.tensors[i].name;
        if (ends_with(n, ".weight.lora_b")) continue;
        int l = -1, off = 0;
        char what[128] = "";
        if (!ends_with(n, ".weight.lora_a") || sscanf(n, "blk.%d.%n", &l, &off) != 1 || off <= 0) {
            st = err_set(GERBIL_ERR_UNSUPPORTED, "%s: tensor %s is not a LoRA matrix of a layer's projection", path, n);
            break;
        }
        snprintf(what, sizeof what, "%.*s", (int)(strlen(n) - off - strlen(".weight.lora_a")), n + off);
        int found = -1;
        for (size_t k = 0; k < sizeof target_names / sizeof *target_names; k++)
            if (target_names[k].gguf && !strcmp(target_names[k].gguf, what)) found = (int)k;
        if (found < 0) {
            st = err_set(GERBIL_ERR_UNSUPPORTED, "%s: LoRA target %s is not supported (gerbil adapts the attention, "
                         "MLP and Gated DeltaNet projections of each layer)", path, n);
            break;
        }
        char bname[300], mod[300];
        snprintf(bname, sizeof bname, "%.*s.lora_b", (int)(strlen(n) - strlen(".lora_a")), n);
        snprintf(mod, sizeof mod, "blk.%d.%s", l, what);
        const struct gb_tensor *tb = gguf_find_tensor(&gf, bname);
        const float scale = tb && tb->n_dims == 2 && alpha != 0.0f ? alpha / (float)tb->ne[1] : 1.0f;
        st = add_piece(ps, path, mod, l, target_names[found].t, &gf.tensors[i], tb, 0, scale);
    }
    if (st == GERBIL_OK && ps->n == 0) st = err_set(GERBIL_ERR_FORMAT, "%s holds no LoRA matrices", path);
    gguf_close(&gf);
    return st;
}

/* ---- the registry ---- */

static void adapter_unref(struct gerbil_model *m, struct lora_adapter *a) {
    if (!a || --a->refs > 0) return;
    if (a->mem) m->be->ops->buf_free(m->be, a->mem, a->bytes);
    free(a->mats);
    free(a);
}

void lora_registry_free(struct gerbil_model *m) {
    struct lora_registry *r = m->lora;
    if (!r) return;
    for (int i = 1; i < r->cap; i++)
        for (int k = 0; r->sets[i].used && k < r->sets[i].n; k++) adapter_unref(m, r->sets[i].part[k]);
    free(r->sets);
    free(r);
    m->lora = NULL;
}

/* A free id for set (the model's lock held). */
static gerbil_status registry_add(struct gerbil_model *m, const struct lora_set *set, int32_t *id) {
    if (!m->lora && !(m->lora = calloc(1, sizeof *m->lora))) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    struct lora_registry *r = m->lora;
    int i = 1;
    while (i < r->cap && r->sets[i].used) i++;
    if (i >= r->cap) {
        int cap = r->cap ? 2 * r->cap : 16;
        struct lora_set *s = realloc(r->sets, (size_t)cap * sizeof *s);
        if (!s) return err_set(GERBIL_ERR_NOMEM, "out of memory");
        memset(s + r->cap, 0, (size_t)(cap - r->cap) * sizeof *s);
        r->sets = s;
        r->cap = cap;
    }
    r->sets[i] = *set;
    r->sets[i].used = 1;
    *id = i;
    return GERBIL_OK;
}

static struct lora_set *set_at(struct gerbil_model *m, int32_t id) {
    struct lora_registry *r = m->lora;
    return r && id > 0 && id < r->cap && r->sets[id].used ? &r->sets[id] : NULL;
}

gerbil_status lora_check_id(struct gerbil_model *m, int row, int32_t id) {
    if (id == 0 || set_at(m, id)) return GERBIL_OK;
    return err_set(GERBIL_ERR_INVALID_ARG, "row %d asks for adapter %d, which is not loaded on this model", row,
                   (int)id);
}

/* The pieces checked against the model's linears and moved to backend memory. */
static gerbil_status adapter_make(struct gerbil_model *m, const char *path, int is_gguf, struct pieces *ps,
                                  struct lora_adapter **out) {
    const int L = m->cfg.n_layer;
    size_t floats = 0;
    for (int i = 0; i < ps->n; i++) {
        const struct piece *p = &ps->p[i];
        if (p->layer >= L)
            return err_set(GERBIL_ERR_INVALID_ARG, "%s: adapts layer %d but the model has %d layers", path, p->layer, L);
        const struct gb_weight *w = target_weight(m, p->layer, p->t);
        if (!w)
            return err_set(GERBIL_ERR_UNSUPPORTED, "%s: adapts %s of layer %d, which this model's layer %d does not "
                           "have (or gerbil does not adapt there: MoE experts, fused Qwen3-Next projections, LFM2 "
                           "convolutions)", path, target_label(p->t), p->layer, p->layer);
        if (w->n_in != p->n_in || w->n_out != p->n_out)
            return err_set(GERBIL_ERR_INVALID_ARG, "%s: %s of layer %d is [%d x %d] (out x in) in the adapter but "
                           "[%lld x %lld] in the model: an adapter for another model?", path, target_label(p->t),
                           p->layer, p->n_out, p->n_in, (long long)w->n_out, (long long)w->n_in);
        if (!is_gguf && m->cfg.rope_interleaved && (p->t == LT_Q || p->t == LT_K))
            return err_set(GERBIL_ERR_UNSUPPORTED, "%s: q_proj / k_proj adapters on a GGUF llama base (rows permuted "
                           "by the converter) need the adapter converted to GGUF too (convert_lora_to_gguf.py)", path);
        floats += (size_t)p->rank * (size_t)(p->n_in + p->n_out);
    }
    struct lora_adapter *a = calloc(1, sizeof *a);
    if (!a || !(a->mats = calloc((size_t)L * LT_COUNT, sizeof *a->mats))) {
        free(a);
        return err_set(GERBIL_ERR_NOMEM, "out of memory");
    }
    a->refs = 1;
    a->bytes = floats * sizeof(float);
    a->mem = m->be->ops->alloc(m->be, a->bytes, 0);
    if (!a->mem) {
        free(a->mats);
        free(a);
        return err_set(GERBIL_ERR_NOMEM, "%s: out of %s memory for %zu bytes of LoRA matrices", path,
                       m->be->ops->name, floats * sizeof(float));
    }
    float *dst = a->mem;
    for (int i = 0; i < ps->n; i++) {
        const struct piece *p = &ps->p[i];
        struct lora_mat *mt = &a->mats[(size_t)p->layer * LT_COUNT + p->t];
        const size_t na = (size_t)p->rank * p->n_in, nb = (size_t)p->n_out * p->rank;
        *mt = (struct lora_mat){.rank = p->rank, .n_in = p->n_in, .n_out = p->n_out, .scale = p->scale, .a = dst,
                                .bt = dst + na};
        float *bt = malloc(nb * sizeof *bt);
        if (!bt) {
            m->be->ops->buf_free(m->be, a->mem, a->bytes);
            free(a->mats);
            free(a);
            return err_set(GERBIL_ERR_NOMEM, "out of memory");
        }
        for (int o = 0; o < p->n_out; o++)
            for (int r = 0; r < p->rank; r++) bt[(size_t)r * p->n_out + o] = p->b[(size_t)o * p->rank + r];
        m->be->ops->upload(m->be, mt->a, p->a, na * sizeof(float));
        m->be->ops->upload(m->be, mt->bt, bt, nb * sizeof(float));
        free(bt);
        dst += na + nb;
    }
    m->be->ops->sync(m->be);
    *out = a;
    return GERBIL_OK;
}

gerbil_status gerbil_adapter_load(gerbil_model_t m, const char *path, float scale, int32_t *id) {
    if (!m || !path || !id) return err_set(GERBIL_ERR_INVALID_ARG, "gerbil_adapter_load: NULL argument");
    *id = -1;
    if (!m->be->ops->lora)
        return err_set(GERBIL_ERR_UNSUPPORTED, "LoRA is not yet on %s: load the model with --device cpu (or the ref "
                       "backend) to use adapters", m->be->ops->name);
    if (!(scale == scale) || isinf(scale)) return err_set(GERBIL_ERR_INVALID_ARG, "adapter scale must be finite");
    struct pieces ps = {0};
    char p2[4096];
    gerbil_status st;
    int gguf = 0;
    if (is_dir(path)) {
        snprintf(p2, sizeof p2, "%s/adapters.safetensors", path);
        if (is_file(p2)) st = load_mlx(path, &ps);
        else {
            snprintf(p2, sizeof p2, "%s/adapter_config.json", path);
            if (!is_file(p2))
                return err_set(GERBIL_ERR_IO, "%s: not an adapter folder (no adapter_config.json: PEFT's "
                               "adapter_config.json + adapter_model.safetensors, or mlx-lm's adapters.safetensors)",
                               path);
            st = load_peft(path, &ps);
        }
    } else if (is_file(path) && ends_with(path, ".gguf")) {
        gguf = 1;
        st = load_gguf(path, &ps);
    } else if (is_file(path)) {
        st = err_set(GERBIL_ERR_UNSUPPORTED, "%s: an adapter is a PEFT or mlx-lm folder or a .gguf file", path);
    } else {
        st = err_set(GERBIL_ERR_IO, "%s: no such adapter (file or folder)", path);
    }
    struct lora_adapter *a = NULL;
    if (st == GERBIL_OK) st = adapter_make(m, path, gguf, &ps, &a);
    pieces_free(&ps);
    if (st != GERBIL_OK) return st;
    struct lora_set set = {.n = 1, .part = {a}, .scale = {scale}};
    pthread_mutex_lock(&m->lock);
    st = registry_add(m, &set, id);
    pthread_mutex_unlock(&m->lock);
    if (st != GERBIL_OK) adapter_unref(m, a);
    return st;
}

gerbil_status gerbil_adapter_stack(gerbil_model_t m, const int32_t *ids, int n, int32_t *id) {
    if (!m || !ids || !id || n <= 0) return err_set(GERBIL_ERR_INVALID_ARG, "gerbil_adapter_stack: no adapters");
    *id = -1;
    struct lora_set set = {0};
    pthread_mutex_lock(&m->lock);
    gerbil_status st = GERBIL_OK;
    for (int i = 0; st == GERBIL_OK && i < n; i++) {
        const struct lora_set *s = set_at(m, ids[i]);
        if (!s) st = err_set(GERBIL_ERR_INVALID_ARG, "adapter %d is not loaded on this model", (int)ids[i]);
        for (int k = 0; st == GERBIL_OK && k < s->n; k++) {
            if (set.n == LORA_MAX_PARTS) {
                st = err_set(GERBIL_ERR_UNSUPPORTED, "more than %d adapters on one sequence", LORA_MAX_PARTS);
                break;
            }
            set.part[set.n] = s->part[k];
            set.scale[set.n++] = s->scale[k];
        }
    }
    if (st == GERBIL_OK) st = registry_add(m, &set, id);
    if (st == GERBIL_OK)
        for (int k = 0; k < set.n; k++) set.part[k]->refs++;
    pthread_mutex_unlock(&m->lock);
    return st;
}

gerbil_status gerbil_adapter_free(gerbil_model_t m, int32_t id) {
    if (!m) return err_set(GERBIL_ERR_INVALID_ARG, "gerbil_adapter_free: no model");
    pthread_mutex_lock(&m->lock);
    struct lora_set *s = set_at(m, id);
    if (!s) {
        pthread_mutex_unlock(&m->lock);
        return err_set(GERBIL_ERR_INVALID_ARG, "adapter %d is not loaded on this model", (int)id);
    }
    for (int k = 0; k < s->n; k++) adapter_unref(m, s->part[k]);
    memset(s, 0, sizeof *s);
    pthread_mutex_unlock(&m->lock);
    return GERBIL_OK;
}

/* ---- forwards ---- */

gerbil_status lora_plan(struct gerbil_context *cx, const gerbil_batch *ub, const int32_t *row_user, int n,
                        const struct lora_fwd **out) {
    *out = NULL;
    if (!ub->adapter) return GERBIL_OK;
    int any = 0;
    for (int i = 0; i < n; i++) { /* under the model's lock: adapters may come and go on other threads */
        any |= ub->adapter[i] != 0;
        GB_TRY(lora_check_id(cx->model, i, ub->adapter[i]));
    }
    if (!any) return GERBIL_OK;
    struct lora_fwd *lf = cx->lora;
    if (!lf || lf->cap < n) {
        struct lora_fwd *nl = calloc(1, sizeof *nl);
        const int cap = cx->n_batch > n ? cx->n_batch : n;
        if (nl) {
            nl->runs = malloc((size_t)cap * sizeof *nl->runs);
            nl->segs = malloc((size_t)cap * LORA_MAX_PARTS * sizeof *nl->segs);
            nl->cap = cap;
        }
        if (!nl || !nl->runs || !nl->segs) {
            if (nl) {
                free(nl->runs);
                free(nl->segs);
                free(nl);
            }
            return err_set(GERBIL_ERR_NOMEM, "out of memory");
        }
        if (lf) {
            free(lf->runs);
            free(lf->segs);
            free(lf);
        }
        cx->lora = lf = nl;
    }
    lf->n_runs = 0;
    for (int t = 0; t < n; t++) {
        const int32_t id = ub->adapter[row_user[t]];
        if (lf->n_runs && lf->runs[lf->n_runs - 1].id == id &&
            lf->runs[lf->n_runs - 1].row0 + lf->runs[lf->n_runs - 1].n_rows == t)
            lf->runs[lf->n_runs - 1].n_rows++;
        else lf->runs[lf->n_runs++] = (struct lora_run){.row0 = t, .n_rows = 1, .id = id};
    }
    *out = lf;
    return GERBIL_OK;
}

void lora_apply(const struct fwd *f, int layer, enum lora_target t, float *y, const float *x) {
    const struct lora_fwd *lf = f->lora;
    if (!lf) return;
    struct gerbil_model *m = f->c->model;
    struct lora_seg *segs = lf->segs;
    int ns = 0, n_in = 0, n_out = 0;
    for (int r = 0; r < lf->n_runs; r++) {
        const struct lora_run *run = &lf->runs[r];
        if (run->id == 0) continue;
        const struct lora_set *s = &m->lora->sets[run->id];
        for (int k = 0; k < s->n; k++) {
            const struct lora_mat *mt = &s->part[k]->mats[(size_t)layer * LT_COUNT + t];
            if (!mt->rank) continue;
            n_in = mt->n_in;
            n_out = mt->n_out;
            segs[ns++] = (struct lora_seg){.row0 = run->row0, .n_rows = run->n_rows, .rank = mt->rank,
                                           .scale = mt->scale * s->scale[k], .a = mt->a, .bt = mt->bt};
        }
    }
    op_lora(f->be, y, x, n_in, n_out, segs, ns);
}
