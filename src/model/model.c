/* Public model and session API: load a folder, hold KV caches, run tokens. */
#include "model/model.h"
#include "base/status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

enum { DEFAULT_MAX_CTX = 4096, DEFAULT_BATCH = 512 };

gerbil_model_params gerbil_model_default_params(void) {
    return (gerbil_model_params){.n_threads = 0};
}

gerbil_session_params gerbil_session_default_params(void) {
    return (gerbil_session_params){.n_ctx = 0, .kv_type = GERBIL_KV_F16};
}

static int is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

gerbil_status gerbil_model_load(const char *path, const gerbil_model_params *params,
                                gerbil_model_t *out) {
    *out = NULL;
    err_clear();
    gerbil_model_params p = params ? *params : gerbil_model_default_params();
    struct gerbil_model *m = calloc(1, sizeof *m);
    if (!m) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    struct st_load_opts lo = {.in_memory = !p.use_mmap, .progress = p.progress, .user = p.progress_user};
    gerbil_status st;
    struct stat sb;
    if (stat(path, &sb) != 0) {
        free(m);
        return err_set(GERBIL_ERR_IO, "%s: no such file or directory (expected a Hugging Face model folder "
                       "or a .gguf file)", path);
    }
    if (is_dir(path)) {
        /* a Hugging Face folder: config.json + safetensors (plain or MLX-quantized) */
        st = model_config_load(path, &m->cfg);
        if (st != GERBIL_OK) goto fail;
        st = st_checkpoint_open_opts(path, &lo, &m->src.ck);
        if (st != GERBIL_OK) goto fail;
    } else {
        /* a single GGUF file */
        m->src.is_gguf = 1;
        st = gguf_open(path, &lo, &m->src.gg);
        if (st != GERBIL_OK) goto fail;
        st = model_config_from_gguf(&m->src.gg, path, &m->cfg);
        if (st != GERBIL_OK) goto fail;
    }
    m->src.mlx = &m->cfg.mlx;
    m->src.arch = m->cfg.arch;
    wsrc_detect_prefix(&m->src);
    st = llama_bind_weights(m);
    if (st != GERBIL_OK) { err_prefix(st, "%s", path); goto fail; }
    wsrc_seal(&m->src);
    m->reference_kernels = p.reference_kernels;
    m->tp = tp_create(p.n_threads);
    if (!m->tp) { st = GERBIL_ERR_NOMEM; goto fail; }
    *out = m;
    return GERBIL_OK;
fail:
    gerbil_model_free(m);
    return st;
}

void gerbil_model_free(gerbil_model_t m) {
    if (!m) return;
    tp_free(m->tp);
    wsrc_close(&m->src);
    model_config_free(&m->cfg);
    free(m->layers);
    free(m->experts);
    free(m->f32_store);
    free(m);
}

int gerbil_model_n_vocab(gerbil_model_t m) { return m->cfg.n_vocab; }
int gerbil_model_n_ctx_train(gerbil_model_t m) { return m->cfg.n_ctx_train; }
int32_t gerbil_model_bos_id(gerbil_model_t m) { return m->cfg.bos_id; }

int gerbil_model_eos_ids(gerbil_model_t m, int32_t *ids, int cap) {
    int n = m->cfg.n_eos < cap ? m->cfg.n_eos : cap;
    memcpy(ids, m->cfg.eos_ids, (size_t)n * sizeof *ids);
    return n;
}

/* Bytes of KV cache per token of context. */
static size_t kv_bytes_per_token(const struct model_config *c, size_t elt) {
    size_t n_attn = 0;
    for (int l = 0; l < c->n_layer; l++) n_attn += c->layer_kind[l] == LAYER_ATTENTION;
    return 2 * n_attn * (size_t)c->n_head_kv * (size_t)c->head_dim * elt;
}

/* Bytes of a session's KV mapping for its first n positions. */
static size_t kv_mem_bytes(const struct gerbil_session *s, int n) {
    return (size_t)n * (size_t)s->kv_stride * type_traits(s->kv_type)->type_size;
}

static size_t layer_state_floats(const struct model_config *c, int l, size_t *conv);
static size_t recurrent_layers(const struct model_config *c, int *n_dn, int *n_sc);

gerbil_status gerbil_model_describe(gerbil_model_t m, char *buf, size_t cap) {
    const struct model_config *c = &m->cfg;
    /* dtype histogram over the weights actually bound */
    int64_t by_type[GB_TYPE_COUNT] = {0};
    int64_t n_elems = 0;
    for (int i = 0; i < wsrc_n_tensors(&m->src); i++) {
        const struct gb_tensor *t = wsrc_at(&m->src, i);
        by_type[t->type] += tensor_nelements(t);
        n_elems += tensor_nelements(t);
    }
    char dtypes[128] = "";
    size_t off = 0;
    for (int t = 0; t < GB_TYPE_COUNT; t++)
        if (by_type[t] && off < sizeof dtypes)
            off += (size_t)snprintf(dtypes + off, sizeof dtypes - off, "%s%s (%.1f%%)", off ? ", " : "",
                                    type_name((enum gb_type)t), 100.0 * by_type[t] / (double)n_elems);
    int n_ctx = c->n_ctx_train < DEFAULT_MAX_CTX ? c->n_ctx_train : DEFAULT_MAX_CTX;
    int n_dn, n_sc;
    const size_t state = recurrent_layers(c, &n_dn, &n_sc);
    char kinds[96] = "";
    if (n_dn || n_sc)
        snprintf(kinds, sizeof kinds, " (%d %s, %d attention; recurrent state %.1f MiB)", n_dn + n_sc,
                 n_dn ? "Gated DeltaNet" : "short conv", c->n_layer - n_dn - n_sc, (double)state * 4 / 1048576.0);
    double kv16 = (double)kv_bytes_per_token(c, 2) * n_ctx;
    const char *rope_names[] = {"default", "linear", "dynamic", "llama3", "yarn"};
    char local[96] = "";
    if (c->has_rope_local)
        snprintf(local, sizeof local, "; sliding layers %s, theta %g, factor %g", rope_names[c->rope_local.type],
                 c->rope_local.theta, c->rope_local.factor);
    snprintf(buf, cap,
             "architecture:   %s\n"
             "parameters:     %lld (%.2f M)\n"
             "dtypes:         %s\n"
             "layers:         %d%s\n"
             "hidden size:    %d\n"
             "ffn size:       %d\n"
             "heads:          %d (kv %d, head_dim %d)\n"
             "vocab:          %d\n"
             "context:        %d (trained)\n"
             "rope:           %s, theta %g, factor %g, %d rotary dims%s\n"
             "sliding window: %d\n"
             "tied embedding: %s\n"
             "weights:        %.1f MiB (read in their stored format)\n"
             "kv cache:       %.1f MiB at %d tokens (f16), %.1f KiB/token\n"
             "memory needed:  %.1f MiB (weights + f16 kv cache at %d tokens)\n",
             c->arch_name, (long long)m->n_params, m->n_params / 1e6, dtypes, c->n_layer, kinds, c->n_embd, c->n_ff,
             c->n_head, c->n_head_kv, c->head_dim, c->n_vocab, c->n_ctx_train, rope_names[c->rope.type],
             c->rope.theta, c->rope.factor, c->rope.n_dims, local, c->sliding_window, c->tie_embeddings ? "yes" : "no",
             m->weight_bytes / 1048576.0, kv16 / 1048576.0, n_ctx, kv_bytes_per_token(c, 2) / 1024.0,
             (m->weight_bytes + kv16) / 1048576.0, n_ctx);
    int n_moe = 0;
    for (int l = 0; c->layer_moe && l < c->n_layer; l++) n_moe += c->layer_moe[l];
    size_t len = strlen(buf);
    if (n_moe && len < cap)
        snprintf(buf + len, cap - len, "experts:        %d (%d per token, ffn %d; shared expert ffn %d) in %d of %d layers\n",
                 c->moe.n_expert, c->moe.n_used, c->moe.n_ff_exp, c->moe.n_ff_shexp, n_moe, c->n_layer);
    return GERBIL_OK;
}

/* ---- sessions ---- */

/* Floats of recurrent state a layer keeps between calls: the DeltaNet conv window and
 * delta-rule state, or the short convolution's conv window; 0 for attention. */
static size_t layer_state_floats(const struct model_config *c, int l, size_t *conv) {
    const struct deltanet_config *d = &c->dn;
    switch (c->layer_kind[l]) {
    case LAYER_DELTANET:
        *conv = (size_t)(d->conv_kernel - 1) * (2 * (size_t)d->n_k_heads * d->k_dim + (size_t)d->n_v_heads * d->v_dim);
        return *conv + (size_t)d->n_v_heads * d->k_dim * d->v_dim;
    case LAYER_SHORTCONV:
        *conv = (size_t)(c->sc.kernel - 1) * (size_t)c->n_embd;
        return *conv;
    default:
        *conv = 0;
        return 0;
    }
}

/* How many DeltaNet and short-conv layers; returns the floats of their state together. */
static size_t recurrent_layers(const struct model_config *c, int *n_dn, int *n_sc) {
    size_t total = 0, conv;
    *n_dn = *n_sc = 0;
    for (int l = 0; l < c->n_layer; l++) {
        *n_dn += c->layer_kind[l] == LAYER_DELTANET;
        *n_sc += c->layer_kind[l] == LAYER_SHORTCONV;
        total += layer_state_floats(c, l, &conv);
    }
    return total;
}

/* Recurrent layers: one block holding every layer's state (and one for its checkpoint),
 * and the activation buffers of the DeltaNet and short-convolution layers. 0 on success. */
static int recurrent_alloc(struct gerbil_session *s) {
    const struct model_config *c = &s->model->cfg;
    const struct deltanet_config *d = &c->dn;
    const size_t B = (size_t)s->n_batch, C = 2 * (size_t)d->n_k_heads * d->k_dim + (size_t)d->n_v_heads * d->v_dim;
    const size_t D = (size_t)c->n_embd;
    s->ckpt_pos = -1;
    if (c->attn_out_gate && !(s->qg = malloc(B * 2 * (size_t)c->n_head * c->head_dim * sizeof(float)))) return -1;
    int n_dn, n_sc;
    size_t conv;
    const size_t total = recurrent_layers(c, &n_dn, &n_sc);
    if (!total) return 0;
    s->rstate_floats = total;
    s->rstate = calloc(s->rstate_floats, sizeof(float));
    s->ckpt = malloc(s->rstate_floats * sizeof(float));
    s->conv_state = calloc((size_t)c->n_layer, sizeof(float *));
    s->delta_state = calloc((size_t)c->n_layer, sizeof(float *));
    if (!s->rstate || !s->ckpt || !s->conv_state || !s->delta_state) return -1;
    if (n_dn) {
        const size_t VD = (size_t)d->n_v_heads * d->v_dim;
        s->dn_in = malloc(B * C * sizeof(float));
        s->dn_conv = malloc(B * C * sizeof(float));
        s->dn_z = malloc(B * VD * sizeof(float));
        s->dn_out = malloc(B * VD * sizeof(float));
        s->dn_g = malloc(B * d->n_v_heads * sizeof(float));
        s->dn_beta = malloc(B * d->n_v_heads * sizeof(float));
        s->dn_scratch = malloc((size_t)tp_n_threads(s->model->tp) * delta_scratch_floats(d->k_dim, d->v_dim) *
                               sizeof(float));
        if (d->fused_proj & FUSED_QKVZ && !(s->dn_qkvz = malloc(B * (C + VD) * sizeof(float)))) return -1;
        if (d->fused_proj & FUSED_BA && !(s->dn_ba = malloc(B * 2 * d->n_v_heads * sizeof(float)))) return -1;
        if (!s->dn_in || !s->dn_conv || !s->dn_z || !s->dn_out || !s->dn_g || !s->dn_beta || !s->dn_scratch)
            return -1;
    }
    if (n_sc) {
        s->sc_in = malloc(B * 3 * D * sizeof(float));
        s->sc_bx = malloc(B * D * sizeof(float));
        s->sc_conv = malloc(B * D * sizeof(float));
        if (!s->sc_in || !s->sc_bx || !s->sc_conv) return -1;
    }
    float *p = s->rstate;
    for (int l = 0; l < c->n_layer; l++) {
        const size_t n = layer_state_floats(c, l, &conv);
        if (!n) continue;
        s->conv_state[l] = p;
        if (c->layer_kind[l] == LAYER_DELTANET) s->delta_state[l] = p + conv;
        p += n;
    }
    return 0;
}

/* MoE layers: router, selection and per-expert buffers. 0 on success. */
static int moe_alloc(struct gerbil_session *s) {
    const struct model_config *c = &s->model->cfg;
    int any = 0;
    for (int l = 0; c->layer_moe && l < c->n_layer; l++) any |= c->layer_moe[l];
    if (!any) return 0;
    const size_t B = (size_t)s->n_batch, D = (size_t)c->n_embd, K = (size_t)c->moe.n_used;
    s->moe_prob = malloc(B * (size_t)c->moe.n_expert * sizeof(float));
    s->moe_sel = malloc(B * K * sizeof(int32_t));
    s->moe_wsel = malloc(B * K * sizeof(float));
    s->moe_rows = malloc(B * sizeof(int32_t));
    s->moe_rw = malloc(B * sizeof(float));
    s->moe_x = malloc(B * D * sizeof(float));
    s->moe_y = malloc(B * D * sizeof(float));
    s->moe_acc = malloc(B * D * sizeof(float));
    s->moe_shg = malloc(B * sizeof(float));
    return s->moe_prob && s->moe_sel && s->moe_wsel && s->moe_rows && s->moe_rw && s->moe_x && s->moe_y &&
                   s->moe_acc && s->moe_shg ? 0 : -1;
}

/* The largest matmul scratch any weight of the model needs for n_tok rows. */
static void grow_work(size_t *work, const struct gb_weight *w, int n_tok) {
    if (!w->data) return; /* not in this layer's kind */
    size_t need = op_matmul_work_size(w, n_tok);
    if (need > *work) *work = need;
}

gerbil_status gerbil_session_new(gerbil_model_t m, const gerbil_session_params *params,
                                 gerbil_session_t *out) {
    *out = NULL;
    const struct model_config *c = &m->cfg;
    gerbil_session_params p = params ? *params : gerbil_session_default_params();
    int n_ctx = p.n_ctx > 0 ? p.n_ctx : (c->n_ctx_train < DEFAULT_MAX_CTX ? c->n_ctx_train : DEFAULT_MAX_CTX);
    if (p.kv_type != GERBIL_KV_F16 && p.kv_type != GERBIL_KV_F32)
        return err_set(GERBIL_ERR_INVALID_ARG, "unknown kv cache type %d", (int)p.kv_type);
    struct gerbil_session *s = calloc(1, sizeof *s);
    if (!s) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    s->model = m;
    s->n_ctx = n_ctx;
    s->n_batch = n_ctx < DEFAULT_BATCH ? n_ctx : DEFAULT_BATCH;
    s->kv_type = p.kv_type == GERBIL_KV_F32 ? GB_TYPE_F32 : GB_TYPE_F16;
    const size_t B = (size_t)s->n_batch, elt = type_traits(s->kv_type)->type_size;
    s->be.tp = m->tp;
    s->be.reference = m->reference_kernels;
    /* scratch for the largest quantized matmul of one batch */
    const struct gb_weight *all[] = {&m->tok_embd, &m->lm_head};
    for (int i = 0; i < 2; i++) {
        size_t w = op_matmul_work_size(all[i], s->n_batch);
        if (w > s->be.work_size) s->be.work_size = w;
    }
    for (int l = 0; l < c->n_layer; l++) {
        const struct layer_weights *lw = &m->layers[l];
        const struct gb_weight *ws[] = {&lw->wq, &lw->wk, &lw->wv, &lw->wo, &lw->w_gate, &lw->w_up, &lw->w_down,
                                        &lw->w_qkv, &lw->w_z, &lw->w_b, &lw->w_a, &lw->w_out, &lw->w_sc_in, &lw->w_qkvz,
                                        &lw->w_ba, &lw->w_router, &lw->w_sh_gate, &lw->w_sh_up, &lw->w_sh_down,
                                        &lw->w_sh_router};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) grow_work(&s->be.work_size, ws[i], s->n_batch);
        for (int e = 0; lw->exp_gate && e < c->moe.n_expert; e++) {
            grow_work(&s->be.work_size, &lw->exp_gate[e], s->n_batch);
            grow_work(&s->be.work_size, &lw->exp_up[e], s->n_batch);
            grow_work(&s->be.work_size, &lw->exp_down[e], s->n_batch);
        }
    }
    const size_t Q = (size_t)c->n_head * c->head_dim, KV = (size_t)c->n_head_kv * c->head_dim;
    const size_t n_layer = (unsigned)c->n_layer;
    s->k_cache = calloc(n_layer, sizeof(void *));
    s->v_cache = calloc(n_layer, sizeof(void *));
    int ok = s->k_cache && s->v_cache;
    /* One anonymous mapping, position-major: position j's rows of every attention layer's K
     * and V together, so the cache grows with the positions used, in 2 MiB pages where
     * transparent huge pages are "madvise" (a hint). Each token's attention reads a 256-byte
     * row per position and kv head; with 4 KiB pages and one region per layer that was a
     * TLB miss every other position. Measured (Qwen3-0.6B MLX 4-bit, tg128, 1 thread, perf):
     * attention 5.6-7.4% of the decode profile -> 3.2-4.0%, the cache store 1.3% -> 0.15%.
     * Pages of context never reached are never touched, so never resident. */
    s->kv_stride = (int)(kv_bytes_per_token(c, elt) / elt);
    const size_t kv_bytes = kv_mem_bytes(s, n_ctx);
    if (ok && kv_bytes) {
        void *kv = mmap(NULL, kv_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        ok = kv != MAP_FAILED;
        s->kv_mem = ok ? kv : NULL;
#ifdef MADV_HUGEPAGE
        if (ok) madvise(kv, kv_bytes, MADV_HUGEPAGE);
#endif
        char *p = s->kv_mem;
        for (int l = 0; ok && l < c->n_layer; l++) {
            if (c->layer_kind[l] != LAYER_ATTENTION) continue;
            s->k_cache[l] = p;
            s->v_cache[l] = p + KV * elt;
            p += 2 * KV * elt;
        }
    }
    ok = ok && recurrent_alloc(s) == 0 && moe_alloc(s) == 0;
    /* feed-forward hidden width: dense, routed experts and the shared expert share s->gate, s->up */
    size_t ff = (size_t)c->n_ff;
    if (c->layer_moe && c->moe.n_expert) {
        if ((size_t)c->moe.n_ff_exp > ff) ff = (size_t)c->moe.n_ff_exp;
        if ((size_t)c->moe.n_ff_shexp > ff) ff = (size_t)c->moe.n_ff_shexp;
    }
    if (ok) {
        s->x = malloc(B * c->n_embd * sizeof(float));
        s->xn = malloc(B * c->n_embd * sizeof(float));
        s->q = malloc(B * Q * sizeof(float));
        s->att = malloc(B * Q * sizeof(float));
        s->k = malloc(B * KV * sizeof(float));
        s->v = malloc(B * KV * sizeof(float));
        s->gate = malloc(B * (ff > Q ? ff : Q) * sizeof(float));
        s->up = malloc(B * ff * sizeof(float));
        s->attn_scratch = malloc((size_t)tp_n_threads(m->tp) * n_ctx * sizeof(float));
        if (s->be.work_size) s->be.work = malloc(s->be.work_size);
        s->inv_freq = malloc((size_t)c->rope.n_dims / 2 * sizeof(float));
        if (c->has_rope_local) s->inv_freq_local = malloc((size_t)c->rope_local.n_dims / 2 * sizeof(float));
        s->pos = malloc(B * sizeof(int32_t));
        ok = s->x && s->xn && s->q && s->att && s->k && s->v && s->gate && s->up && s->attn_scratch &&
             s->inv_freq && (!c->has_rope_local || s->inv_freq_local) && s->pos && (!s->be.work_size || s->be.work);
    }
    if (!ok) {
        gerbil_session_free(s);
        return err_set(GERBIL_ERR_NOMEM, "out of memory allocating a %d-token context", n_ctx);
    }
    *out = s;
    return GERBIL_OK;
}

void gerbil_session_free(gerbil_session_t s) {
    if (!s) return;
    if (s->kv_mem) munmap(s->kv_mem, kv_mem_bytes(s, s->n_ctx));
    free(s->k_cache);
    free(s->v_cache);
    free(s->x); free(s->xn); free(s->q); free(s->att); free(s->k); free(s->v);
    free(s->gate); free(s->up); free(s->attn_scratch); free(s->inv_freq); free(s->inv_freq_local); free(s->pos); free(s->be.work);
    free(s->rstate); free(s->ckpt); free(s->conv_state); free(s->delta_state);
    free(s->qg); free(s->dn_in); free(s->dn_conv); free(s->dn_z); free(s->dn_out); free(s->dn_g); free(s->dn_beta);
    free(s->dn_scratch); free(s->dn_qkvz); free(s->dn_ba);
    free(s->sc_in); free(s->sc_bx); free(s->sc_conv);
    free(s->moe_prob); free(s->moe_sel); free(s->moe_wsel); free(s->moe_rows); free(s->moe_rw);
    free(s->moe_x); free(s->moe_y); free(s->moe_acc); free(s->moe_shg);
    free(s);
}

void gerbil_session_reset(gerbil_session_t s) {
    s->n_past = 0;
    s->ckpt_pos = -1;
    if (s->rstate) memset(s->rstate, 0, s->rstate_floats * sizeof(float));
}

/* A recurrent state cannot be rewound token by token: go back to the checkpoint when it
 * lies at or before n, else to the start. */
void gerbil_session_truncate(gerbil_session_t s, int n) {
    if (n < 0 || n >= s->n_past) return;
    if (!s->rstate) { s->n_past = n; return; }
    if (s->ckpt_pos >= 0 && s->ckpt_pos <= n) {
        memcpy(s->rstate, s->ckpt, s->rstate_floats * sizeof(float));
        s->n_past = s->ckpt_pos;
    } else {
        gerbil_session_reset(s);
    }
}

gerbil_status gerbil_session_copy(gerbil_session_t dst, gerbil_session_t src) {
    if (dst->model != src->model || dst->n_ctx < src->n_past || dst->kv_type != src->kv_type)
        return err_set(GERBIL_ERR_INVALID_ARG, "session copy needs the same model and kv type and room for %d tokens",
                       src->n_past);
    /* the same model and kv type: the same position rows */
    if (src->kv_mem) memcpy(dst->kv_mem, src->kv_mem, kv_mem_bytes(src, src->n_past));
    if (src->rstate) {
        memcpy(dst->rstate, src->rstate, src->rstate_floats * sizeof(float));
        memcpy(dst->ckpt, src->ckpt, src->rstate_floats * sizeof(float));
    }
    dst->n_past = src->n_past;
    dst->ckpt_pos = src->ckpt_pos;
    return GERBIL_OK;
}
int gerbil_session_n_past(gerbil_session_t s) { return s->n_past; }
int gerbil_session_n_ctx(gerbil_session_t s) { return s->n_ctx; }

gerbil_status gerbil_session_eval(gerbil_session_t s, const int32_t *ids, int n, float *logits,
                                  int all_logits) {
    const struct model_config *c = &s->model->cfg;
    if (n <= 0) return err_set(GERBIL_ERR_INVALID_ARG, "no tokens to evaluate");
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->n_vocab)
            return err_set(GERBIL_ERR_INVALID_ARG, "token id %d at position %d is outside the vocabulary [0, %d)",
                           (int)ids[i], i, c->n_vocab);
    if (s->n_past + n > s->n_ctx)
        return err_set(GERBIL_ERR_CONTEXT, "%d tokens after %d already in context exceed the context size %d",
                       n, s->n_past, s->n_ctx);
    /* The prompt goes through in batches of n_batch rows. */
    for (int done = 0; done < n;) {
        int chunk = n - done < s->n_batch ? n - done : s->n_batch;
        int last = done + chunk == n;
        float *out = NULL;
        if (logits && all_logits) out = logits + (size_t)done * c->n_vocab;
        else if (logits && last) out = logits;
        GB_TRY(llama_forward(s, ids + done, chunk, out, all_logits));
        done += chunk;
    }
    if (s->rstate && n > 1) { /* the state after a prompt: where a follow-up can rewind to */
        memcpy(s->ckpt, s->rstate, s->rstate_floats * sizeof(float));
        s->ckpt_pos = s->n_past;
    }
    return GERBIL_OK;
}
