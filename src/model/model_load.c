/* Public model API: load a folder or GGUF file onto a backend, describe it. */
#include "model/model.h"
#include "base/status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

gerbil_model_params gerbil_model_default_params(void) {
    return (gerbil_model_params){.n_threads = 0};
}

static int is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The sizes a config states, checked against the tensors before anything is allocated
 * from them: the embedding must be [vocab, hidden] (MLX: hidden packed into u32 words),
 * and no size may exceed the largest dimension of any tensor in the file (every size is
 * the dimension of some weight), so the loader's allocations stay bounded by the file. */
static gerbil_status check_sizes(const struct gerbil_model *m) {
    const struct model_config *c = &m->cfg;
    const struct gb_tensor *e = wsrc_find(&m->src, "model.embed_tokens.weight");
    char fname[256];
    const char *en = wsrc_file_name(&m->src, "model.embed_tokens.weight", fname, sizeof fname);
    if (!e) return err_set(GERBIL_ERR_FORMAT, "missing tensor \"%s\"", en);
    const int mlx = e->type == GB_TYPE_U32; /* packed words: 2 to 8 bits per value */
    if (e->n_dims != 2 || e->ne[0] != c->n_vocab || (mlx ? e->ne[1] * 16 < c->n_embd : e->ne[1] != c->n_embd))
        return err_set(GERBIL_ERR_FORMAT, "tensor \"%s\" has shape [%lld, %lld]%s, but the configuration says "
                       "vocabulary %d and hidden size %d", e->name, (long long)e->ne[0],
                       (long long)(e->n_dims > 1 ? e->ne[1] : 0), mlx ? " (packed)" : "", c->n_vocab, c->n_embd);
    int64_t max_dim = 0;
    for (int i = 0; i < wsrc_n_tensors(&m->src); i++) {
        const struct gb_tensor *t = wsrc_at(&m->src, i);
        for (int d = 0; d < t->n_dims; d++) {
            int64_t n = t->ne[d] * (t->type == GB_TYPE_U32 ? 16 : 1);
            if (n > max_dim) max_dim = n;
        }
    }
    const struct { const char *what; int64_t n; } sizes[] = {
        {"intermediate size", c->n_ff}, {"attention width (heads x head_dim)", (int64_t)c->n_head * c->head_dim},
        {"KV width (kv heads x head_dim)", (int64_t)c->n_head_kv * c->head_dim},
        {"full layers' attention width", (int64_t)c->n_head * c->head_dim_full},
        {"per-layer embedding width", (int64_t)c->ple_dim * c->n_layer},
        {"expert width", c->moe.n_expert ? c->moe.n_ff_exp : 0},
        {"shared expert width", c->moe.n_expert ? c->moe.n_ff_shexp : 0},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (sizes[i].n > max_dim)
            return err_set(GERBIL_ERR_FORMAT, "the configuration's %s %lld is larger than any tensor dimension in the "
                           "checkpoint (at most %lld)", sizes[i].what, (long long)sizes[i].n, (long long)max_dim);
    return GERBIL_OK;
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
    if (is_dir(path) && moonshine_detect(path)) { /* speech-to-text: its own loader (moonshine.c) */
        st = moonshine_load(m, path, &p, &lo);
        if (st != GERBIL_OK) { err_prefix(st, "%s", path); goto fail; }
        wsrc_seal(&m->src);
        pthread_mutex_init(&m->lock, NULL);
        m->lock_ready = 1;
        *out = m;
        return GERBIL_OK;
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
    st = check_sizes(m);
    if (st != GERBIL_OK) { err_prefix(st, "%s", path); goto fail; }
    st = backend_new(p.backend ? p.backend : p.reference_kernels ? "ref" : NULL, p.n_threads, &m->be);
    if (st != GERBIL_OK) goto fail;
    m->src.be = m->be;
    st = llama_bind_weights(m);
    if (st != GERBIL_OK) { err_prefix(st, "%s", path); goto fail; }
    wsrc_seal(&m->src);
    pthread_mutex_init(&m->lock, NULL);
    m->lock_ready = 1;
    *out = m;
    return GERBIL_OK;
fail:
    gerbil_model_free(m);
    return st;
}

void gerbil_model_free(gerbil_model_t m) {
    if (!m) return;
    lora_registry_free(m);
    moonshine_free(m);
    if (m->f32_dev) m->be->ops->buf_free(m->be, m->f32_dev, m->f32_bytes);
    backend_free(m->be);
    wsrc_close(&m->src);
    model_config_free(&m->cfg);
    free(m->layers);
    free(m->experts);
    free(m->f32_store);
    if (m->lock_ready) pthread_mutex_destroy(&m->lock);
    free(m);
}

const char *gerbil_model_backend(gerbil_model_t m) { return m->be->ops->name; }

int gerbil_model_n_vocab(gerbil_model_t m) { return m->cfg.n_vocab; }
int gerbil_model_n_embd(gerbil_model_t m) { return m->cfg.n_embd; }
int gerbil_model_n_layer(gerbil_model_t m) { return m->cfg.n_layer; }
int gerbil_model_n_ctx_train(gerbil_model_t m) { return m->cfg.n_ctx_train; }
int32_t gerbil_model_bos_id(gerbil_model_t m) { return m->cfg.bos_id; }

int gerbil_model_eos_ids(gerbil_model_t m, int32_t *ids, int cap) {
    int n = m->cfg.n_eos < cap ? m->cfg.n_eos : cap;
    memcpy(ids, m->cfg.eos_ids, (size_t)n * sizeof *ids);
    return n;
}

/* Bytes of KV cache per token of context. */
size_t kv_bytes_per_token(const struct model_config *c, size_t elt) {
    size_t n = 0; /* K and V widths of the attention layers with their own cache (Gemma 4: per layer) */
    for (int l = 0; l < c->n_layer; l++)
        if (c->layer_kind[l] == LAYER_ATTENTION && !layer_kv_shared(c, l))
            n += 2 * (size_t)layer_n_kv(c, l) * (size_t)layer_head_dim(c, l);
    return n * elt;
}

/* Floats of recurrent state a layer keeps between calls: the DeltaNet conv window and
 * delta-rule state, or the short convolution's conv window; 0 for attention. */
size_t layer_state_floats(const struct model_config *c, int l, size_t *conv) {
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

gerbil_status gerbil_model_describe(gerbil_model_t m, char *buf, size_t cap) {
    const struct model_config *c = &m->cfg;
    if (m->stt) {
        snprintf(buf, cap,
                 "architecture:   %s (speech-to-text, 16 kHz audio in)\n"
                 "parameters:     %lld (%.2f M)\n"
                 "decoder layers: %d\n"
                 "hidden size:    %d\n"
                 "ffn size:       %d\n"
                 "heads:          %d (kv %d, head_dim %d)\n"
                 "vocab:          %d\n"
                 "positions:      %d\n"
                 "tied embedding: %s\n"
                 "weights:        %.1f MiB\n",
                 c->arch_name, (long long)m->n_params, m->n_params / 1e6, c->n_layer, c->n_embd, c->n_ff, c->n_head,
                 c->n_head_kv, c->head_dim, c->n_vocab, c->n_ctx_train, c->tie_embeddings ? "yes" : "no",
                 m->weight_bytes / 1048576.0);
        return GERBIL_OK;
    }
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
    /* the format as users name it: "MLX 4-bit, group 64", "GGUF Q4_K" (most weights), "BF16" */
    int top = 0;
    for (int t = 0; t < GB_TYPE_COUNT; t++)
        if (by_type[t] > by_type[top]) top = t;
    char format[64];
    if (c->mlx.bits) snprintf(format, sizeof format, "MLX %d-bit, group %d", c->mlx.bits, c->mlx.group_size);
    else snprintf(format, sizeof format, "%s%s", m->src.is_gguf ? "GGUF " : "", type_name((enum gb_type)top));
    int n_ctx = c->n_ctx_train < DEFAULT_MAX_CTX ? c->n_ctx_train : DEFAULT_MAX_CTX;
    int n_dn, n_sc;
    const size_t state = recurrent_layers(c, &n_dn, &n_sc);
    char kinds[96] = "";
    if (n_dn || n_sc)
        snprintf(kinds, sizeof kinds, " (%d %s, %d attention; recurrent state %.1f MiB)", n_dn + n_sc,
                 n_dn ? "Gated DeltaNet" : "short conv", c->n_layer - n_dn - n_sc, (double)state * 4 / 1048576.0);
    double kv16 = (double)kv_bytes_per_token(c, 2) * n_ctx;
    const char *rope_names[] = {"default", "linear", "dynamic", "llama3", "yarn", "proportional"};
    char local[96] = "";
    if (c->has_rope_local)
        snprintf(local, sizeof local, "; sliding layers %s, theta %g, factor %g", rope_names[c->rope_local.type],
                 c->rope_local.theta, c->rope_local.factor);
    snprintf(buf, cap,
             "architecture:   %s\n"
             "parameters:     %lld (%.2f M)\n"
             "format:         %s\n"
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
             c->arch_name, (long long)m->n_params, m->n_params / 1e6, format, dtypes, c->n_layer, kinds, c->n_embd, c->n_ff,
             c->n_head, c->n_head_kv, c->head_dim, c->n_vocab, c->n_ctx_train, rope_names[c->rope.type],
             c->rope.theta, c->rope.factor, c->rope.n_dims, local, c->sliding_window, c->tie_embeddings ? "yes" : "no",
             m->weight_bytes / 1048576.0, kv16 / 1048576.0, n_ctx, kv_bytes_per_token(c, 2) / 1024.0,
             (m->weight_bytes + kv16) / 1048576.0, n_ctx);
    int n_moe = 0;
    for (int l = 0; c->layer_moe && l < c->n_layer; l++) n_moe += c->layer_moe[l];
    size_t len = strlen(buf);
    if (c->arch == ARCH_GEMMA4 && len < cap) /* Gemma 4: what differs per layer */
        len += (size_t)snprintf(buf + len, cap - len, "gemma 4:        full layers head_dim %d, kv %d%s; per-layer "
                                "embeddings %d; %d layers share KV%s\n", layer_head_dim(c, c->n_layer - 1),
                                layer_n_kv(c, c->n_layer - 1), c->attn_k_eq_v ? " (v = k)" : "", c->ple_dim,
                                c->n_kv_shared, c->ff_wide_shared ? " (their ffn 2x wide)" : "");
    if (len > cap) len = cap;
    if (n_moe && len < cap)
        snprintf(buf + len, cap - len, "experts:        %d (%d per token, ffn %d; shared expert ffn %d) in %d of %d layers\n",
                 c->moe.n_expert, c->moe.n_used, c->moe.n_ff_exp, c->moe.n_ff_shexp, n_moe, c->n_layer);
    return GERBIL_OK;
}

