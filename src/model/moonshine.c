/* Moonshine speech-to-text (MoonshineForConditionalGeneration, UsefulSensors/moonshine-tiny
 * and -base; transformers' models/moonshine/ is the reference).
 *
 * Encoder: the raw 16 kHz waveform through three convolutions (conv1 k127 s64 no bias ->
 * tanh -> GroupNorm(1 group) ; conv2 k7 s3 -> GELU ; conv3 k3 s2 -> GELU), each an
 * im2col1d + matmul with the weight [C_out][C_in * K] as PyTorch stores it; then
 * pre-LayerNorm (weight only) layers of bidirectional self-attention with partial
 * interleaved rotary (pairs 2i, 2i+1 over the first 2 * ceil(dim / 2) dims, dim =
 * int(head_dim * partial_rotary_factor)) and a fc1 -> GELU -> fc2 MLP with biases; a final
 * LayerNorm. Decoder: token embeddings, layers of causal self-attention (rotary, its own
 * KV cache), cross-attention over the encoder output (its K and V projected once per
 * utterance), a gated MLP (fc1 -> [hidden | gate], silu(gate) * hidden -> fc2), a final
 * LayerNorm and proj_out (tied to the embedding unless tie_word_embeddings is false).
 *
 * Every computation is a backend op. The encoder's non-causal self-attention and the
 * decoder's cross-attention are attention_dense (every query over every key; on the CPU
 * two float GEMMs per head); the decoder's causal self-attention is the table's paged
 * attention over an f32 cache of its own laid out as an identity block table (pool row p =
 * position p). */
#include "model/model.h"
#include "base/status.h"
#include "base/timer.h"
#include "io/json.h"
#include "tensor/dtype.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { MS_RATE = 16000, MS_MAX_EOS = 8 };

struct ms_attn {
    struct gb_weight q, k, v, o;
    const float *bq, *bk, *bv; /* attention_bias, else NULL */
};

struct ms_layer {
    const float *ln1, *ln2, *ln3; /* input_layernorm, post_attention_layernorm, final_layernorm (decoder) */
    struct ms_attn sa, ca;        /* self-attention; cross-attention (decoder: encoder_attn) */
    struct gb_weight fc1, fc2;    /* encoder: [I][H], [H][I]; decoder: [2I][H] as two views, [H][I] */
    struct gb_weight fc1_up, fc1_gate;
    const float *b1, *b2;
};

struct moonshine {
    int H, I, n_enc, n_dec, enc_heads, enc_kv, dec_heads, dec_kv, enc_hd, dec_hd, n_freq, vocab, max_pos;
    int attn_bias, tied;
    float theta, partial;
    int32_t start_id, eos[MS_MAX_EOS];
    int n_eos;
    struct gb_weight conv1, conv2, conv3;
    const float *b_conv2, *b_conv3, *gn_w, *gn_b, *enc_norm, *dec_norm;
    struct ms_layer *enc, *dec;
    struct gb_weight embed, proj_out;
    float *inv_freq; /* backend memory [n_freq] */
};

/* ---- config ---- */

int moonshine_detect(const char *dir) {
    char p[4096];
    snprintf(p, sizeof p, "%s/config.json", dir);
    cJSON *j = NULL;
    if (json_load_file(p, &j) != GERBIL_OK) {
        err_clear();
        return 0;
    }
    int yes = 0;
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "architectures");
    const cJSON *a0 = cJSON_IsArray(a) ? cJSON_GetArrayItem(a, 0) : NULL;
    if (cJSON_IsString(a0) && !strcmp(a0->valuestring, "MoonshineForConditionalGeneration")) yes = 1;
    const char *mt = json_get_str(j, "model_type", "");
    if (!strcmp(mt, "moonshine")) yes = 1;
    cJSON_Delete(j);
    return yes;
}

static int read_eos(const cJSON *j, int32_t *eos, int cap) {
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "eos_token_id");
    int n = 0;
    if (cJSON_IsNumber(e)) eos[n++] = (int32_t)e->valuedouble;
    else if (cJSON_IsArray(e))
        for (const cJSON *x = e->child; x && n < cap; x = x->next)
            if (cJSON_IsNumber(x)) eos[n++] = (int32_t)x->valuedouble;
    return n;
}

static gerbil_status ms_config(const char *dir, struct moonshine *c, struct model_config *cfg) {
    char p[4096];
    snprintf(p, sizeof p, "%s/config.json", dir);
    cJSON *j;
    GB_TRY(json_load_file(p, &j));
    gerbil_status st = GERBIL_OK;
    c->H = (int)json_get_int(j, "hidden_size", 288);
    c->I = (int)json_get_int(j, "intermediate_size", 1152);
    c->n_enc = (int)json_get_int(j, "encoder_num_hidden_layers", 6);
    c->n_dec = (int)json_get_int(j, "decoder_num_hidden_layers", 6);
    c->enc_heads = (int)json_get_int(j, "encoder_num_attention_heads", 8);
    c->dec_heads = (int)json_get_int(j, "decoder_num_attention_heads", 8);
    c->enc_kv = (int)json_get_int(j, "encoder_num_key_value_heads", c->enc_heads);
    c->dec_kv = (int)json_get_int(j, "decoder_num_key_value_heads", c->dec_heads);
    if (json_has(j, "encoder_num_key_value_heads") && cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, "encoder_num_key_value_heads")))
        c->enc_kv = c->enc_heads;
    if (json_has(j, "decoder_num_key_value_heads") && cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, "decoder_num_key_value_heads")))
        c->dec_kv = c->dec_heads;
    c->vocab = (int)json_get_int(j, "vocab_size", 32768);
    c->max_pos = (int)json_get_int(j, "max_position_embeddings", 512);
    c->attn_bias = json_get_bool(j, "attention_bias", 0);
    c->tied = json_get_bool(j, "tie_word_embeddings", 1);
    c->start_id = (int32_t)json_get_int(j, "decoder_start_token_id", 1);
    /* rope: rope_parameters (transformers 5) first, then the top-level keys (4.x configs) */
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(j, "rope_parameters");
    if (!cJSON_IsObject(rp)) rp = cJSON_GetObjectItemCaseSensitive(j, "rope_scaling");
    c->theta = (float)json_get_num(j, "rope_theta", 10000.0);
    c->partial = (float)json_get_num(j, "partial_rotary_factor", 0.9);
    if (cJSON_IsObject(rp)) {
        c->theta = (float)json_get_num(rp, "rope_theta", c->theta);
        c->partial = (float)json_get_num(rp, "partial_rotary_factor", c->partial);
        const char *rt = json_get_str(rp, "rope_type", json_get_str(rp, "type", "default"));
        if (strcmp(rt, "default")) {
            st = err_set(GERBIL_ERR_UNSUPPORTED, "%s: Moonshine with rope_type \"%s\" (gerbil runs \"default\")", p, rt);
            goto out;
        }
    }
    const char *ea = json_get_str(j, "encoder_hidden_act", "gelu"), *da = json_get_str(j, "decoder_hidden_act", "silu");
    if (strcmp(ea, "gelu")) {
        st = err_set(GERBIL_ERR_UNSUPPORTED, "%s: encoder_hidden_act \"%s\" (gerbil runs \"gelu\")", p, ea);
        goto out;
    }
    if (strcmp(da, "silu")) {
        st = err_set(GERBIL_ERR_UNSUPPORTED, "%s: decoder_hidden_act \"%s\" (gerbil runs \"silu\")", p, da);
        goto out;
    }
    const struct { const char *what; int v, lo, hi; } lim[] = {
        {"hidden_size", c->H, 1, 65536}, {"intermediate_size", c->I, 1, 1 << 20},
        {"encoder_num_hidden_layers", c->n_enc, 1, 1024}, {"decoder_num_hidden_layers", c->n_dec, 1, 1024},
        {"encoder_num_attention_heads", c->enc_heads, 1, 1024}, {"decoder_num_attention_heads", c->dec_heads, 1, 1024},
        {"encoder_num_key_value_heads", c->enc_kv, 1, 1024}, {"decoder_num_key_value_heads", c->dec_kv, 1, 1024},
        {"vocab_size", c->vocab, 1, 1 << 24}, {"max_position_embeddings", c->max_pos, 2, 1 << 20},
    };
    for (size_t i = 0; i < sizeof lim / sizeof lim[0]; i++)
        if (lim[i].v < lim[i].lo || lim[i].v > lim[i].hi) {
            st = err_set(GERBIL_ERR_FORMAT, "%s: %s = %d is out of range (%d to %d)", p, lim[i].what, lim[i].v,
                         lim[i].lo, lim[i].hi);
            goto out;
        }
    if (c->H % c->enc_heads || c->H % c->dec_heads || c->enc_heads % c->enc_kv || c->dec_heads % c->dec_kv) {
        st = err_set(GERBIL_ERR_FORMAT, "%s: hidden_size %d, heads %d/%d, kv heads %d/%d do not divide", p, c->H,
                     c->enc_heads, c->dec_heads, c->enc_kv, c->dec_kv);
        goto out;
    }
    c->enc_hd = c->H / c->enc_heads;
    c->dec_hd = c->H / c->dec_heads;
    if (c->enc_hd != c->dec_hd) {
        /* one rotary table for both, as transformers builds it from the shared config */
        st = err_set(GERBIL_ERR_UNSUPPORTED, "%s: encoder and decoder head sizes differ (%d, %d)", p, c->enc_hd,
                     c->dec_hd);
        goto out;
    }
    if (!(c->partial > 0 && c->partial <= 1) || !(c->theta > 0)) {
        st = err_set(GERBIL_ERR_FORMAT, "%s: partial_rotary_factor %g / rope_theta %g out of range", p, c->partial,
                     c->theta);
        goto out;
    }
    const int dim = (int)(c->enc_hd * c->partial);
    c->n_freq = (dim + 1) / 2;
    if (2 * c->n_freq > c->enc_hd || dim < 1) {
        st = err_set(GERBIL_ERR_FORMAT, "%s: rotary dims %d do not fit head_dim %d", p, 2 * c->n_freq, c->enc_hd);
        goto out;
    }
    c->n_eos = read_eos(j, c->eos, MS_MAX_EOS);
    cJSON_Delete(j);
    j = NULL;
    snprintf(p, sizeof p, "%s/generation_config.json", dir);
    struct stat sb;
    if (stat(p, &sb) == 0 && json_load_file(p, &j) == GERBIL_OK) {
        int n = read_eos(j, c->eos, MS_MAX_EOS);
        if (n) c->n_eos = n;
        c->start_id = (int32_t)json_get_int(j, "decoder_start_token_id", c->start_id);
    }
    err_clear();
    if (c->start_id < 0 || c->start_id >= c->vocab) {
        st = err_set(GERBIL_ERR_FORMAT, "%s: decoder_start_token_id %d is outside the vocabulary (%d)", dir,
                     c->start_id, c->vocab);
        goto out;
    }
    snprintf(cfg->arch_name, sizeof cfg->arch_name, "MoonshineForConditionalGeneration");
    cfg->n_vocab = c->vocab;
    cfg->n_embd = c->H;
    cfg->n_layer = c->n_dec;
    cfg->n_head = c->dec_heads;
    cfg->n_head_kv = c->dec_kv;
    cfg->head_dim = c->dec_hd;
    cfg->n_ff = c->I;
    cfg->n_ctx_train = c->max_pos;
    cfg->tie_embeddings = c->tied;
    cfg->bos_id = c->start_id;
    cfg->n_eos = c->n_eos < (int)(sizeof cfg->eos_ids / sizeof cfg->eos_ids[0]) ? c->n_eos
                                                                                : (int)(sizeof cfg->eos_ids / sizeof cfg->eos_ids[0]);
    for (int i = 0; i < cfg->n_eos; i++) cfg->eos_ids[i] = c->eos[i];
out:
    cJSON_Delete(j);
    return st;
}

/* ---- binding ---- */

/* A conv weight [C_out][C_in][K] as one matrix [C_out][C_in * K]. */
static gerbil_status bind_conv(struct binder *b, const char *name, int64_t c_out, int64_t c_in, int64_t k,
                               struct gb_weight *out) {
    struct gerbil_model *m = b->m;
    const struct gb_tensor *t = wsrc_find(&m->src, name);
    if (!t) return err_set(GERBIL_ERR_FORMAT, "missing tensor \"%s\"", name);
    if (t->n_dims != 3 || t->ne[0] != c_out || t->ne[1] != c_in || t->ne[2] != k)
        return err_set(GERBIL_ERR_FORMAT, "tensor \"%s\": expected shape [%lld, %lld, %lld]", name, (long long)c_out,
                       (long long)c_in, (long long)k);
    if (!type_traits(t->type)->is_float)
        return err_set(GERBIL_ERR_UNSUPPORTED, "tensor \"%s\": dtype %s (a convolution must be F32, F16 or BF16)",
                       name, type_name(t->type));
    if ((uintptr_t)t->data % type_traits(t->type)->type_size)
        return err_set(GERBIL_ERR_FORMAT, "tensor \"%s\": data is not aligned", name);
    *out = (struct gb_weight){.kind = GB_WEIGHT_PLAIN, .type = t->type, .n_out = c_out, .n_in = c_in * k,
                              .data = t->data, .row_bytes = type_row_size(t->type, c_in * k), .name = t->name};
    m->be->ops->weight_prepare(m->be, out, 1, 0);
    if (m->be->ops->weight_status) GB_TRY(m->be->ops->weight_status(m->be));
    m->weight_bytes += t->nbytes;
    m->n_params += c_out * c_in * k;
    return GERBIL_OK;
}

static gerbil_status bind_attn(struct binder *b, const struct moonshine *c, const char *pre, int heads, int kv,
                               int hd, struct ms_attn *a) {
    char n[256];
    const int64_t H = c->H;
    snprintf(n, sizeof n, "%s.q_proj.weight", pre);
    GB_TRY(bind_matrix(b, n, (int64_t)heads * hd, H, &a->q));
    snprintf(n, sizeof n, "%s.k_proj.weight", pre);
    GB_TRY(bind_matrix(b, n, (int64_t)kv * hd, H, &a->k));
    snprintf(n, sizeof n, "%s.v_proj.weight", pre);
    GB_TRY(bind_matrix(b, n, (int64_t)kv * hd, H, &a->v));
    snprintf(n, sizeof n, "%s.o_proj.weight", pre);
    GB_TRY(bind_matrix(b, n, H, (int64_t)heads * hd, &a->o));
    if (c->attn_bias) {
        snprintf(n, sizeof n, "%s.q_proj.bias", pre);
        GB_TRY(bind_vector(b, n, (int64_t)heads * hd, 0, &a->bq));
        snprintf(n, sizeof n, "%s.k_proj.bias", pre);
        GB_TRY(bind_vector(b, n, (int64_t)kv * hd, 0, &a->bk));
        snprintf(n, sizeof n, "%s.v_proj.bias", pre);
        GB_TRY(bind_vector(b, n, (int64_t)kv * hd, 0, &a->bv));
    }
    return GERBIL_OK;
}

static gerbil_status ms_bind(struct gerbil_model *m, struct moonshine *c) {
    const int64_t H = c->H, I = c->I;
    size_t total = 16 * (size_t)H + (size_t)(c->n_enc + c->n_dec) * (6 * (size_t)H + 2 * (size_t)I + 6 * (size_t)H);
    m->f32_store = malloc(total * sizeof(float));
    c->enc = calloc((size_t)c->n_enc, sizeof *c->enc);
    c->dec = calloc((size_t)c->n_dec, sizeof *c->dec);
    if (!m->f32_store || !c->enc || !c->dec) return err_set(GERBIL_ERR_NOMEM, "out of memory binding Moonshine");
    struct binder b = {.m = m, .f32_next = m->f32_store, .f32_left = total};
    gerbil_status st;
#define T(x) do { st = (x); if (st != GERBIL_OK) goto out; } while (0)
    T(bind_conv(&b, "model.encoder.conv1.weight", H, 1, 127, &c->conv1));
    T(bind_conv(&b, "model.encoder.conv2.weight", 2 * H, H, 7, &c->conv2));
    T(bind_conv(&b, "model.encoder.conv3.weight", H, 2 * H, 3, &c->conv3));
    T(bind_vector(&b, "model.encoder.conv2.bias", 2 * H, 0, &c->b_conv2));
    T(bind_vector(&b, "model.encoder.conv3.bias", H, 0, &c->b_conv3));
    T(bind_vector(&b, "model.encoder.groupnorm.weight", H, 0, &c->gn_w));
    T(bind_vector(&b, "model.encoder.groupnorm.bias", H, 0, &c->gn_b));
    T(bind_vector(&b, "model.encoder.layer_norm.weight", H, 0, &c->enc_norm));
    T(bind_vector(&b, "model.decoder.norm.weight", H, 0, &c->dec_norm));
    char n[256], pre[128];
    for (int l = 0; l < c->n_enc; l++) {
        struct ms_layer *L = &c->enc[l];
        snprintf(pre, sizeof pre, "model.encoder.layers.%d", l);
        snprintf(n, sizeof n, "%s.self_attn", pre);
        T(bind_attn(&b, c, n, c->enc_heads, c->enc_kv, c->enc_hd, &L->sa));
        snprintf(n, sizeof n, "%s.input_layernorm.weight", pre);
        T(bind_vector(&b, n, H, 0, &L->ln1));
        snprintf(n, sizeof n, "%s.post_attention_layernorm.weight", pre);
        T(bind_vector(&b, n, H, 0, &L->ln2));
        snprintf(n, sizeof n, "%s.mlp.fc1.weight", pre);
        T(bind_matrix(&b, n, I, H, &L->fc1));
        snprintf(n, sizeof n, "%s.mlp.fc2.weight", pre);
        T(bind_matrix(&b, n, H, I, &L->fc2));
        snprintf(n, sizeof n, "%s.mlp.fc1.bias", pre);
        T(bind_vector(&b, n, I, 0, &L->b1));
        snprintf(n, sizeof n, "%s.mlp.fc2.bias", pre);
        T(bind_vector(&b, n, H, 0, &L->b2));
    }
    for (int l = 0; l < c->n_dec; l++) {
        struct ms_layer *L = &c->dec[l];
        snprintf(pre, sizeof pre, "model.decoder.layers.%d", l);
        snprintf(n, sizeof n, "%s.self_attn", pre);
        T(bind_attn(&b, c, n, c->dec_heads, c->dec_kv, c->dec_hd, &L->sa));
        snprintf(n, sizeof n, "%s.encoder_attn", pre);
        T(bind_attn(&b, c, n, c->dec_heads, c->dec_kv, c->dec_hd, &L->ca));
        snprintf(n, sizeof n, "%s.input_layernorm.weight", pre);
        T(bind_vector(&b, n, H, 0, &L->ln1));
        snprintf(n, sizeof n, "%s.post_attention_layernorm.weight", pre);
        T(bind_vector(&b, n, H, 0, &L->ln2));
        snprintf(n, sizeof n, "%s.final_layernorm.weight", pre);
        T(bind_vector(&b, n, H, 0, &L->ln3));
        snprintf(n, sizeof n, "%s.mlp.fc1.weight", pre);
        T(bind_matrix(&b, n, 2 * I, H, &L->fc1));
        L->fc1_up = weight_rows(&L->fc1, 0, I);
        L->fc1_gate = weight_rows(&L->fc1, I, I);
        snprintf(n, sizeof n, "%s.mlp.fc2.weight", pre);
        T(bind_matrix(&b, n, H, I, &L->fc2));
        snprintf(n, sizeof n, "%s.mlp.fc1.bias", pre);
        T(bind_vector(&b, n, 2 * I, 0, &L->b1));
        snprintf(n, sizeof n, "%s.mlp.fc2.bias", pre);
        T(bind_vector(&b, n, H, 0, &L->b2));
    }
    T(bind_matrix(&b, "model.decoder.embed_tokens.weight", c->vocab, H, &c->embed));
    if (c->tied || !wsrc_find(&m->src, "proj_out.weight")) {
        if (!c->tied) {
            st = err_set(GERBIL_ERR_FORMAT, "missing tensor \"proj_out.weight\" (tie_word_embeddings is false)");
            goto out;
        }
        c->proj_out = c->embed;
    } else {
        T(bind_matrix(&b, "proj_out.weight", c->vocab, H, &c->proj_out));
    }
    T(bind_upload_vectors(&b));
    /* rotary: inv_freq[i] = theta^(-2i / dim), dim = int(head_dim * partial) */
    {
        const int dim = (int)(c->enc_hd * c->partial);
        float f[512];
        if (c->n_freq > 512) {
            st = err_set(GERBIL_ERR_UNSUPPORTED, "rotary dims %d", 2 * c->n_freq);
            goto out;
        }
        for (int i = 0; i < c->n_freq; i++) f[i] = (float)(1.0 / pow((double)c->theta, (double)(2 * i) / dim));
        c->inv_freq = m->be->ops->alloc(m->be, (size_t)c->n_freq * sizeof(float), 0);
        if (!c->inv_freq) {
            st = err_set(GERBIL_ERR_NOMEM, "out of memory");
            goto out;
        }
        m->be->ops->upload(m->be, c->inv_freq, f, (size_t)c->n_freq * sizeof(float));
    }
#undef T
out:
    free(b.slots);
    return st;
}

gerbil_status moonshine_load(struct gerbil_model *m, const char *dir, const gerbil_model_params *p,
                             const struct st_load_opts *lo) {
    struct moonshine *c = calloc(1, sizeof *c);
    if (!c) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    m->stt = c;
    GB_TRY(ms_config(dir, c, &m->cfg));
    GB_TRY(st_checkpoint_open_opts(dir, lo, &m->src.ck));
    m->src.mlx = &m->cfg.mlx;
    GB_TRY(backend_new(p->backend ? p->backend : p->reference_kernels ? "ref" : NULL, p->n_threads, &m->be));
    const struct backend_ops *o = m->be->ops;
    const struct { const char *name; const void *fn; } need[] = {
        {"im2col1d", (const void *)o->im2col1d}, {"layernorm", (const void *)o->layernorm},
        {"groupnorm", (const void *)o->groupnorm}, {"unary (tanh, GELU)", (const void *)o->unary},
        {"attention_dense", (const void *)o->attention_dense},
    };
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        if (!need[i].fn)
            return err_set(GERBIL_ERR_UNSUPPORTED, "the %s backend has no %s op, which Moonshine needs (run it with "
                           "--device cpu)", o->name, need[i].name);
    m->src.be = m->be;
    GB_TRY(ms_bind(m, c));
    return GERBIL_OK;
}

void moonshine_free(struct gerbil_model *m) {
    struct moonshine *c = m->stt;
    if (!c) return;
    if (c->inv_freq) m->be->ops->buf_free(m->be, c->inv_freq, (size_t)c->n_freq * sizeof(float));
    free(c->enc);
    free(c->dec);
    free(c);
    m->stt = NULL;
}

/* ---- forward ---- */

/* Frames after the three convolutions. */
static int64_t conv_out(int64_t n, int k, int s) { return n < k ? 0 : (n - k) / s + 1; }
static int64_t ms_frames(int64_t n) { return conv_out(conv_out(conv_out(n, 127, 64), 7, 3), 3, 2); }
enum { MS_MIN_SAMPLES = 127 + 64 * 12 }; /* one frame: conv1 13, conv2 3, conv3 1 */

/* The buffers of one utterance: encoder activations (T rows), the decoder's (up to
 * n_dec_rows), the cross K/V of every decoder layer, the self-attention caches. */
struct ms_run {
    struct gerbil_model *m;
    struct backend *be;
    const struct moonshine *c;
    int64_t n_samples;
    int T, cap_dec;           /* encoder frames; decoder positions held at most */
    int n_pos;                /* decoder positions evaluated so far */
    void *mem;
    size_t bytes;
    float *enc;               /* [T][H] encoder output */
    float **ck, **cv;         /* [n_dec] [T][kv * hd] */
    float **sk, **sv;         /* [n_dec] [cap_dec][kv * hd] */
    float *x, *xn, *q, *k, *v, *att, *up, *gate, *logits; /* activations, rows = max(T, cap_dec) */
    float *big;               /* conv scratch */
    float *scratch;           /* attention_dense's */
    int32_t *blocks;          /* identity block table */
    struct gb_seg *segs;      /* one per row */
    int32_t *pos, *kvrow;
    int rows;
};

static void ms_run_free(struct ms_run *r) {
    if (r->mem) r->be->ops->buf_free(r->be, r->mem, r->bytes);
    free(r->ck);
    free(r->blocks);
    free(r->segs);
    free(r->pos);
    memset(r, 0, sizeof *r);
}

static gerbil_status ms_run_init(struct ms_run *r, struct gerbil_model *m, int64_t n_samples, int cap_dec) {
    memset(r, 0, sizeof *r);
    const struct moonshine *c = m->stt;
    r->m = m;
    r->be = m->be;
    r->c = c;
    r->n_samples = n_samples;
    if (n_samples < MS_MIN_SAMPLES)
        return err_set(GERBIL_ERR_INVALID_ARG, "the audio is too short: %lld samples at 16 kHz (Moonshine needs at "
                       "least %d, %.3f s)", (long long)n_samples, MS_MIN_SAMPLES, (double)MS_MIN_SAMPLES / MS_RATE);
    const int64_t T = ms_frames(n_samples);
    const int64_t T1 = conv_out(n_samples, 127, 64), T2 = conv_out(T1, 7, 3);
    if (T > (1 << 20)) return err_set(GERBIL_ERR_INVALID_ARG, "the audio is too long for one window (%lld frames)", (long long)T);
    r->T = (int)T;
    r->cap_dec = cap_dec;
    const int H = c->H, I = c->I, hd = c->dec_hd;
    const int qw = (c->enc_heads > c->dec_heads ? c->enc_heads : c->dec_heads) * hd;
    const int kvw = (c->enc_kv > c->dec_kv ? c->enc_kv : c->dec_kv) * hd;
    const int rows = r->rows = (int)(T > cap_dec ? T : cap_dec);
    const int dkv = c->dec_kv * hd;
    /* conv scratch, stage after stage: input (n) | col1 [T1][127] | y1 [T1][H] | col2 [T2][7H] |
     * y2 [T2][2H] | col3 [T][6H] */
    size_t big = (size_t)n_samples + (size_t)T1 * 127 + (size_t)T1 * H + (size_t)T2 * 7 * H + (size_t)T2 * 2 * H +
                 (size_t)T * 6 * H;
    size_t floats = (size_t)T * H + 2 * (size_t)c->n_dec * T * dkv + 2 * (size_t)c->n_dec * cap_dec * dkv +
                    (size_t)rows * (2 * (size_t)H + 2 * (size_t)qw + 2 * (size_t)kvw + 2 * (size_t)I) +
                    (size_t)cap_dec * c->vocab + big + attn_dense_floats(rows, (int)T, hd) + 64;
    r->bytes = floats * sizeof(float);
    r->mem = r->be->ops->alloc(r->be, r->bytes, 0);
    r->ck = calloc(4 * (size_t)c->n_dec, sizeof *r->ck);
    const int nblk = (rows + KV_BLOCK - 1) / KV_BLOCK + 1;
    r->blocks = malloc((size_t)nblk * sizeof *r->blocks);
    r->segs = malloc((size_t)rows * sizeof *r->segs);
    r->pos = malloc(2 * (size_t)rows * sizeof *r->pos);
    if (!r->mem || !r->ck || !r->blocks || !r->segs || !r->pos) {
        ms_run_free(r);
        return err_set(GERBIL_ERR_NOMEM, "out of memory for a Moonshine utterance (%.1f MiB)", (double)floats * 4 / 1048576);
    }
    r->cv = r->ck + c->n_dec;
    r->sk = r->cv + c->n_dec;
    r->sv = r->sk + c->n_dec;
    r->kvrow = r->pos + rows;
    for (int i = 0; i < nblk; i++) r->blocks[i] = i;
    float *p = r->mem;
#define TAKE(ptr, n) do { (ptr) = p; p += (n); } while (0)
    TAKE(r->enc, (size_t)T * H);
    for (int l = 0; l < c->n_dec; l++) {
        TAKE(r->ck[l], (size_t)T * dkv);
        TAKE(r->cv[l], (size_t)T * dkv);
        TAKE(r->sk[l], (size_t)cap_dec * dkv);
        TAKE(r->sv[l], (size_t)cap_dec * dkv);
    }
    TAKE(r->x, (size_t)rows * H);
    TAKE(r->xn, (size_t)rows * H);
    TAKE(r->q, (size_t)rows * qw);
    TAKE(r->att, (size_t)rows * qw);
    TAKE(r->k, (size_t)rows * kvw);
    TAKE(r->v, (size_t)rows * kvw);
    TAKE(r->up, (size_t)rows * I);
    TAKE(r->gate, (size_t)rows * I);
    TAKE(r->logits, (size_t)cap_dec * c->vocab);
    TAKE(r->big, big);
    TAKE(r->scratch, attn_dense_floats(rows, (int)T, hd));
#undef TAKE
    const struct gb_reserve rs = {.n_rows = (int)(T1 > rows ? T1 : rows), .n_kv = rows + 1};
    GB_TRY(r->be->ops->reserve(r->be, &rs));
    return GERBIL_OK;
}

/* Attention of n query rows (q: [n][heads][hd]) over keys/values [n_kv][kv * hd]: causal
 * from position pos0 (one segment), or every row over all n_kv keys (causal = 0). */
static void ms_attend(struct ms_run *r, float *out, const float *q, const float *kc, const float *vc, int n, int n_kv,
                      int heads, int kv, int hd, int causal, int pos0) {
    if (!causal) {
        op_attention_dense(r->be, out, q, kc, vc, n, n_kv, heads, kv, hd, 1.0f / sqrtf((float)hd), r->scratch);
        return;
    }
    r->segs[0] = (struct gb_seg){.row0 = 0, .n_rows = n, .pos0 = pos0, .blocks = r->blocks};
    const struct attn_args a = {
        .q = q, .out = out, .k_cache = kc, .v_cache = vc, .kv_type = GB_TYPE_F32, .kv_stride = kv * hd,
        .n_head = heads, .n_head_kv = kv, .head_dim = hd, .window = 0, .scale = 1.0f / sqrtf((float)hd),
        .segs = r->segs, .n_segs = 1,
    };
    op_attention(r->be, &a);
}

static void ms_batch(struct ms_run *r, int n) {
    struct gb_batch b = {.n_rows = n, .n_segs = 1, .segs = r->segs, .pos = r->pos, .kv_row = r->kvrow};
    r->be->ops->batch_begin(r->be, &b);
}

/* GERBIL_MS_PROFILE=1: per-stage times of the encoder on stderr (after a sync each). */
static void prof(struct backend *be, const char *what, double *t) {
    static int on = -1;
    if (on < 0) on = getenv("GERBIL_MS_PROFILE") != NULL;
    if (!on) return;
    be->ops->sync(be);
    double n = time_now_s() * 1000.0;
    if (what) fprintf(stderr, "moonshine: %-14s %8.2f ms\n", what, n - *t);
    *t = n;
}

/* The encoder over the run's samples (host pcm) into r->enc, then every decoder layer's
 * cross-attention K and V. */
static gerbil_status ms_encode(struct ms_run *r, const float *pcm) {
    struct backend *be = r->be;
    const struct moonshine *c = r->c;
    const int H = c->H, I = c->I, hd = c->enc_hd, T = r->T;
    const int64_t n = r->n_samples, T1 = conv_out(n, 127, 64), T2 = conv_out(T1, 7, 3);
    float *in = r->big, *col1 = in + n, *y1 = col1 + T1 * 127, *col2 = y1 + T1 * H, *y2 = col2 + T2 * 7 * H,
          *col3 = y2 + T2 * 2 * H;
    double tp = 0;
    prof(be, NULL, &tp);
    be->ops->upload(be, in, pcm, (size_t)n * sizeof(float));
    /* conv1 -> tanh -> groupnorm(1 group) */
    op_im2col1d(be, col1, in, (int)n, 1, 127, 64);
    op_matmul(be, y1, col1, &c->conv1, NULL, (struct gb_rows){(int)T1, NULL});
    op_unary(be, y1, T1 * H, GB_UNARY_TANH);
    op_groupnorm(be, y1, y1, c->gn_w, c->gn_b, 1e-5f, (int)T1, H, 1);
    prof(be, "conv1", &tp);
    /* conv2 -> gelu */
    op_im2col1d(be, col2, y1, (int)T1, H, 7, 3);
    prof(be, "im2col2", &tp);
    op_matmul(be, y2, col2, &c->conv2, c->b_conv2, (struct gb_rows){(int)T2, NULL});
    prof(be, "conv2 matmul", &tp);
    op_unary(be, y2, T2 * 2 * H, GB_UNARY_GELU);
    prof(be, "conv2 gelu", &tp);
    /* conv3 -> gelu into x */
    op_im2col1d(be, col3, y2, (int)T2, 2 * H, 3, 2);
    op_matmul(be, r->x, col3, &c->conv3, c->b_conv3, (struct gb_rows){T, NULL});
    op_unary(be, r->x, (long)T * H, GB_UNARY_GELU);
    prof(be, "conv3", &tp);
    /* layers */
    for (int t = 0; t < T; t++) r->pos[t] = t;
    ms_batch(r, T);
    const struct gb_rows rows = {T, NULL};
    const int qw = c->enc_heads * hd, kvw = c->enc_kv * hd;
    for (int l = 0; l < c->n_enc; l++) {
        const struct ms_layer *L = &c->enc[l];
        op_layernorm(be, r->xn, r->x, L->ln1, NULL, 1e-5f, T, H);
        float *ys[3] = {r->q, r->k, r->v};
        const struct gb_weight *ws[3] = {&L->sa.q, &L->sa.k, &L->sa.v};
        const float *bs[3] = {L->sa.bq, L->sa.bk, L->sa.bv};
        op_matmul_multi(be, 3, ys, r->xn, ws, bs, rows);
        prof(be, "qkv", &tp);
        op_rope(be, r->q, r->pos, NULL, c->inv_freq, 1.0f, T, c->enc_heads, hd, 2 * c->n_freq, 1);
        op_rope(be, r->k, r->pos, NULL, c->inv_freq, 1.0f, T, c->enc_kv, hd, 2 * c->n_freq, 1);
        (void)qw;
        (void)kvw;
        ms_attend(r, r->att, r->q, r->k, r->v, T, T, c->enc_heads, c->enc_kv, hd, 0, 0);
        prof(be, "attention", &tp);
        op_matmul(be, r->xn, r->att, &L->sa.o, NULL, rows);
        op_add(be, r->x, r->xn, (long)T * H);
        op_layernorm(be, r->xn, r->x, L->ln2, NULL, 1e-5f, T, H);
        prof(be, "o + norms", &tp);
        op_matmul(be, r->up, r->xn, &L->fc1, L->b1, rows);
        prof(be, "fc1", &tp);
        op_unary(be, r->up, (long)T * I, GB_UNARY_GELU);
        prof(be, "gelu", &tp);
        op_matmul(be, r->xn, r->up, &L->fc2, L->b2, rows);
        op_add(be, r->x, r->xn, (long)T * H);
        prof(be, "fc2", &tp);
    }
    op_layernorm(be, r->enc, r->x, c->enc_norm, NULL, 1e-5f, T, H);
    /* the decoder's cross K/V, once */
    for (int l = 0; l < c->n_dec; l++) {
        const struct ms_layer *L = &c->dec[l];
        float *ys[2] = {r->ck[l], r->cv[l]};
        const struct gb_weight *ws[2] = {&L->ca.k, &L->ca.v};
        const float *bs[2] = {L->ca.bk, L->ca.bv};
        op_matmul_multi(be, 2, ys, r->enc, ws, bs, rows);
    }
    r->n_pos = 0;
    return GERBIL_OK;
}

/* Decoder rows ids[0 .. n) at positions n_pos .. into logits ([n][vocab], backend memory:
 * r->logits). */
static gerbil_status ms_decode(struct ms_run *r, const int32_t *ids, int n) {
    struct backend *be = r->be;
    const struct moonshine *c = r->c;
    const int H = c->H, I = c->I, hd = c->dec_hd, T = r->T;
    if (r->n_pos + n > r->cap_dec)
        return err_set(GERBIL_ERR_CONTEXT, "%d decoder positions are more than the %d this run holds", r->n_pos + n,
                       r->cap_dec);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab)
            return err_set(GERBIL_ERR_INVALID_ARG, "decoder id %d at %d is outside the vocabulary (%d)", ids[i], i,
                           c->vocab);
    for (int t = 0; t < n; t++) r->pos[t] = r->kvrow[t] = r->n_pos + t;
    ms_batch(r, n);
    const struct gb_rows rows = {n, NULL};
    const int dkv = c->dec_kv * hd;
    op_get_rows(be, r->x, &c->embed, ids, n);
    for (int l = 0; l < c->n_dec; l++) {
        const struct ms_layer *L = &c->dec[l];
        op_layernorm(be, r->xn, r->x, L->ln1, NULL, 1e-5f, n, H);
        float *ys[3] = {r->q, r->k, r->v};
        const struct gb_weight *ws[3] = {&L->sa.q, &L->sa.k, &L->sa.v};
        const float *bs[3] = {L->sa.bq, L->sa.bk, L->sa.bv};
        op_matmul_multi(be, 3, ys, r->xn, ws, bs, rows);
        op_rope(be, r->q, r->pos, NULL, c->inv_freq, 1.0f, n, c->dec_heads, hd, 2 * c->n_freq, 1);
        op_rope(be, r->k, r->pos, NULL, c->inv_freq, 1.0f, n, c->dec_kv, hd, 2 * c->n_freq, 1);
        op_kv_store(be, r->sk[l], GB_TYPE_F32, r->k, r->kvrow, n, dkv, dkv);
        op_kv_store(be, r->sv[l], GB_TYPE_F32, r->v, r->kvrow, n, dkv, dkv);
        ms_attend(r, r->att, r->q, r->sk[l], r->sv[l], n, 0, c->dec_heads, c->dec_kv, hd, 1, r->n_pos);
        op_matmul(be, r->xn, r->att, &L->sa.o, NULL, rows);
        op_add(be, r->x, r->xn, (long)n * H);
        /* cross-attention */
        op_layernorm(be, r->xn, r->x, L->ln2, NULL, 1e-5f, n, H);
        op_matmul(be, r->q, r->xn, &L->ca.q, L->ca.bq, rows);
        ms_attend(r, r->att, r->q, r->ck[l], r->cv[l], n, T, c->dec_heads, c->dec_kv, hd, 0, 0);
        op_matmul(be, r->xn, r->att, &L->ca.o, NULL, rows);
        op_add(be, r->x, r->xn, (long)n * H);
        /* gated MLP: fc1 -> [hidden | gate]; silu(gate) * hidden */
        op_layernorm(be, r->xn, r->x, L->ln3, NULL, 1e-5f, n, H);
        float *ys2[2] = {r->up, r->gate};
        const struct gb_weight *ws2[2] = {&L->fc1_up, &L->fc1_gate};
        const float *bs2[2] = {L->b1, L->b1 + I};
        op_matmul_multi(be, 2, ys2, r->xn, ws2, bs2, rows);
        op_silu_mul(be, r->up, r->gate, r->up, (long)n * I);
        op_matmul(be, r->xn, r->up, &L->fc2, L->b2, rows);
        op_add(be, r->x, r->xn, (long)n * H);
    }
    op_layernorm(be, r->xn, r->x, c->dec_norm, NULL, 1e-5f, n, H);
    op_matmul(be, r->logits, r->xn, &c->proj_out, NULL, rows);
    r->n_pos += n;
    return GERBIL_OK;
}

/* ---- public ---- */

int gerbil_model_is_stt(gerbil_model_t m) { return m && m->stt != NULL; }
int gerbil_stt_sample_rate(gerbil_model_t m) { (void)m; return MS_RATE; }

static gerbil_status need_stt(gerbil_model_t m) {
    if (!m || !m->stt)
        return err_set(GERBIL_ERR_UNSUPPORTED, "%s is not a speech-to-text model (gerbil transcribes with "
                       "MoonshineForConditionalGeneration)", m ? m->cfg.arch_name : "(null)");
    return GERBIL_OK;
}

gerbil_status gerbil_stt_encode(gerbil_model_t m, const float *pcm, int64_t n, float **out, int *n_frames) {
    *out = NULL;
    *n_frames = 0;
    err_clear();
    GB_TRY(need_stt(m));
    pthread_mutex_lock(&m->lock);
    struct ms_run r;
    gerbil_status st = ms_run_init(&r, m, n, 1);
    if (st == GERBIL_OK) st = ms_encode(&r, pcm);
    if (st == GERBIL_OK) {
        const size_t bytes = (size_t)r.T * m->stt->H * sizeof(float);
        *out = malloc(bytes);
        if (!*out) st = err_set(GERBIL_ERR_NOMEM, "out of memory");
        else {
            m->be->ops->download(m->be, *out, r.enc, bytes);
            *n_frames = r.T;
        }
    }
    if (r.mem) ms_run_free(&r);
    pthread_mutex_unlock(&m->lock);
    return st;
}

gerbil_status gerbil_stt_logits(gerbil_model_t m, const float *pcm, int64_t n, const int32_t *ids, int n_ids,
                                float *logits) {
    err_clear();
    GB_TRY(need_stt(m));
    if (n_ids <= 0) return err_set(GERBIL_ERR_INVALID_ARG, "no decoder ids");
    if (n_ids > m->stt->max_pos)
        return err_set(GERBIL_ERR_CONTEXT, "%d decoder ids are more than the model's %d positions", n_ids,
                       m->stt->max_pos);
    pthread_mutex_lock(&m->lock);
    struct ms_run r;
    gerbil_status st = ms_run_init(&r, m, n, n_ids);
    if (st == GERBIL_OK) st = ms_encode(&r, pcm);
    if (st == GERBIL_OK) st = ms_decode(&r, ids, n_ids);
    if (st == GERBIL_OK)
        m->be->ops->download(m->be, logits, r.logits, (size_t)n_ids * m->stt->vocab * sizeof(float));
    if (r.mem) ms_run_free(&r);
    pthread_mutex_unlock(&m->lock);
    return st;
}

static int is_eos(const struct moonshine *c, int32_t id) {
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos[i] == id) return 1;
    return 0;
}

static int32_t argmax(const float *x, int n) {
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Greedy decoding of one window: ids after the start token until EOS or max_new. */
static gerbil_status ms_window(struct gerbil_model *m, const float *pcm, int64_t n, int max_new, int ignore_eos,
                               int32_t **ids, int *n_ids, double *enc_ms, double *dec_ms) {
    const struct moonshine *c = m->stt;
    struct ms_run r;
    float *lg = malloc((size_t)c->vocab * sizeof *lg);
    int32_t *out = malloc((size_t)(max_new + 1) * sizeof *out);
    if (!lg || !out) {
        free(lg);
        free(out);
        return err_set(GERBIL_ERR_NOMEM, "out of memory");
    }
    gerbil_status st = ms_run_init(&r, m, n, max_new + 1);
    double t0 = (time_now_s() * 1000.0);
    if (st == GERBIL_OK) st = ms_encode(&r, pcm);
    m->be->ops->sync(m->be);
    double t1 = (time_now_s() * 1000.0);
    int k = 0;
    int32_t tok = c->start_id;
    while (st == GERBIL_OK && k < max_new) {
        st = ms_decode(&r, &tok, 1);
        if (st != GERBIL_OK) break;
        m->be->ops->download(m->be, lg, r.logits, (size_t)c->vocab * sizeof *lg);
        tok = argmax(lg, c->vocab);
        if (!ignore_eos && is_eos(c, tok)) break;
        out[k++] = tok;
    }
    double t2 = (time_now_s() * 1000.0);
    *enc_ms += t1 - t0;
    *dec_ms += t2 - t1;
    if (r.mem) ms_run_free(&r);
    free(lg);
    if (st != GERBIL_OK) {
        free(out);
        return st;
    }
    *ids = out;
    *n_ids = k;
    return GERBIL_OK;
}

/* Joining windows that overlap: the longest run of k >= 2 ids (k <= 24) that ends the
 * previous window's ids and appears in the next window's first k + 4 ids is dropped from
 * the next (with whatever came before it there); with no such run the two are joined as
 * they are. */
static int overlap_skip(const int32_t *prev, int np, const int32_t *next, int nn) {
    for (int k = np < 24 ? np : 24; k >= 2; k--)
        for (int j = 0; j <= 4 && j + k <= nn; j++)
            if (!memcmp(prev + np - k, next + j, (size_t)k * sizeof *prev)) return j + k;
    return 0;
}

gerbil_stt_params gerbil_stt_default_params(void) {
    return (gerbil_stt_params){.window_s = 24.0, .overlap_s = 2.0, .max_tokens = 0, .ignore_eos = 0};
}

gerbil_status gerbil_stt_transcribe(gerbil_model_t m, const float *pcm, int64_t n, const gerbil_stt_params *pp,
                                    gerbil_stt_result **out) {
    *out = NULL;
    err_clear();
    GB_TRY(need_stt(m));
    gerbil_stt_params p = pp ? *pp : gerbil_stt_default_params();
    if (!(p.window_s >= 1.0 && p.window_s <= 3600) || !(p.overlap_s >= 0 && p.overlap_s < p.window_s / 2))
        return err_set(GERBIL_ERR_INVALID_ARG, "window %.2f s / overlap %.2f s (a window of 1 s or more, an overlap "
                       "below half of it)", p.window_s, p.overlap_s);
    if (n < MS_MIN_SAMPLES)
        return err_set(GERBIL_ERR_INVALID_ARG, "the audio is too short: %lld samples at 16 kHz (Moonshine needs at "
                       "least %d, %.3f s)", (long long)n, MS_MIN_SAMPLES, (double)MS_MIN_SAMPLES / MS_RATE);
    const struct moonshine *c = m->stt;
    const int64_t W = (int64_t)(p.window_s * MS_RATE), step = W - (int64_t)(p.overlap_s * MS_RATE);
    gerbil_stt_result *res = calloc(1, sizeof *res);
    if (!res) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    res->audio_s = (double)n / MS_RATE;
    int n_win = 1;
    while ((int64_t)n_win * step + (W - step) < n) n_win++; /* windows start every step; the last reaches the end */
    res->segments = calloc((size_t)n_win, sizeof *res->segments);
    res->ids = malloc(1);
    gerbil_status st = res->segments && res->ids ? GERBIL_OK : err_set(GERBIL_ERR_NOMEM, "out of memory");
    pthread_mutex_lock(&m->lock);
    for (int w = 0; w < n_win && st == GERBIL_OK; w++) {
        int64_t a = (int64_t)w * step, b = a + W < n ? a + W : n;
        if (b - a < MS_MIN_SAMPLES) a = b - MS_MIN_SAMPLES > 0 ? b - MS_MIN_SAMPLES : 0;
        /* about 6.5 tokens a second (transformers' Moonshine example), within the positions */
        int max_new = p.max_tokens > 0 ? p.max_tokens : (int)ceil((double)(b - a) / MS_RATE * 6.5) + 8;
        if (max_new > c->max_pos - 1) max_new = c->max_pos - 1;
        int32_t *ids = NULL;
        int k = 0;
        st = ms_window(m, pcm + a, b - a, max_new, p.ignore_eos, &ids, &k, &res->encode_ms, &res->decode_ms);
        if (st != GERBIL_OK) break;
        gerbil_stt_segment *sg = &res->segments[res->n_segments++];
        sg->start = (double)a / MS_RATE;
        sg->end = (double)b / MS_RATE;
        sg->ids = ids;
        sg->n_ids = k;
        const int skip = w ? overlap_skip(res->ids, res->n_ids, ids, k) : 0;
        sg->joined_from = skip;
        int32_t *all = realloc(res->ids, (size_t)(res->n_ids + k - skip + 1) * sizeof *all);
        if (!all) {
            st = err_set(GERBIL_ERR_NOMEM, "out of memory");
            break;
        }
        res->ids = all;
        memcpy(res->ids + res->n_ids, ids + skip, (size_t)(k - skip) * sizeof *ids);
        res->n_ids += k - skip;
    }
    pthread_mutex_unlock(&m->lock);
    if (st != GERBIL_OK) {
        gerbil_stt_result_free(res);
        return st;
    }
    *out = res;
    return GERBIL_OK;
}

void gerbil_stt_result_free(gerbil_stt_result *r) {
    if (!r) return;
    for (int i = 0; i < r->n_segments; i++) free(r->segments[i].ids);
    free(r->segments);
    free(r->ids);
    free(r);
}
