/* Contexts: many sequences of one model and the batches that evaluate them (gerbil.h).
 *
 * A batch's rows are regrouped by sequence into segments, the segments in ascending order
 * of their size (stable), so every row's span (its own segment's rows in the call) is
 * non-decreasing along the rows: the backend picks each row's method by it (backend.h),
 * which is what makes a row's result independent of the rest of the batch. Output rows go
 * through the final norm and lm_head in the same way, ordered by their segment's output
 * count. The KV cache is paged (kv_blocks.h): a forward first takes the blocks its rows
 * need, copying shared last blocks, then every K/V row is written at its pool row. */
#include "model/model.h"
#include "base/status.h"
#include "model/rope.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

gerbil_context_params gerbil_context_default_params(void) {
    return (gerbil_context_params){.n_ctx = 0, .n_seq_max = 1, .n_batch = 0, .kv_type = GERBIL_KV_F16};
}

/* ---- the arena: every activation buffer of one forward, one allocation ---- */

static int any_kind(const struct model_config *c, enum layer_kind k) {
    for (int l = 0; l < c->n_layer; l++)
        if (c->layer_kind[l] == k) return 1;
    return 0;
}

static int any_moe(const struct model_config *c) {
    for (int l = 0; c->layer_moe && l < c->n_layer; l++)
        if (c->layer_moe[l]) return 1;
    return 0;
}

/* Buffers for B rows at base (0: only their total size, the returned value); 0-sized ones
 * (a layer kind the model lacks) take no room. Every buffer starts 64-byte aligned. */
static size_t lay_out_arena(struct gerbil_context *cx, uintptr_t base) {
    const struct model_config *c = &cx->model->cfg;
    const struct deltanet_config *d = &c->dn;
    struct act_bufs *a = &cx->a;
    const size_t B = (size_t)cx->n_batch, D = (size_t)c->n_embd, F = sizeof(float);
    size_t Q = 0, KV = 0, ff = 0, off = 0; /* the widest layer's (Gemma 4: they differ) */
    for (int l = 0; l < c->n_layer; l++) {
        const size_t hd = (size_t)layer_head_dim(c, l), kv = (size_t)layer_n_kv(c, l) * hd;
        if ((size_t)c->n_head * hd > Q) Q = (size_t)c->n_head * hd;
        if (kv > KV) KV = kv;
        if ((size_t)layer_n_ff(c, l) > ff) ff = (size_t)layer_n_ff(c, l);
    }
    if (!c->n_layer) Q = KV = ff = 1;
    const size_t P = (size_t)c->ple_dim * (size_t)c->n_layer; /* Gemma 4 per-layer inputs */
    const int moe = any_moe(c);
    if (moe && (size_t)c->moe.n_ff_shexp > ff) ff = (size_t)c->moe.n_ff_shexp;
#define TAKE(f, n, sz) (a->f = (void *)(base + off), off += ((size_t)(n) * (sz) + 63) & ~(size_t)63)
    TAKE(x, B * D, F);
    TAKE(xn, B * D, F);
    TAKE(q, B * Q, F);
    TAKE(att, B * Q, F);
    TAKE(k, B * KV, F);
    TAKE(v, B * KV, F);
    TAKE(gate, B * (ff > Q ? ff : Q), F);
    TAKE(up, B * ff, F);
    TAKE(qg, c->attn_out_gate ? B * 2 * Q : 0, F);
    TAKE(ple, B * P, F);
    TAKE(ple_tmp, B * P, F);
    TAKE(ple_g, c->ple_dim ? B * (size_t)c->ple_dim : 0, F);
    const int dn = any_kind(c, LAYER_DELTANET);
    const size_t C = 2 * (size_t)d->n_k_heads * d->k_dim + (size_t)d->n_v_heads * d->v_dim;
    const size_t VD = (size_t)d->n_v_heads * d->v_dim, NV = (size_t)d->n_v_heads;
    TAKE(dn_in, dn ? B * C : 0, F);
    TAKE(dn_conv, dn ? B * C : 0, F);
    TAKE(dn_z, dn ? B * VD : 0, F);
    TAKE(dn_out, dn ? B * VD : 0, F);
    TAKE(dn_g, dn ? B * NV : 0, F);
    TAKE(dn_beta, dn ? B * NV : 0, F);
    TAKE(dn_qkvz, dn && d->fused_proj & FUSED_QKVZ ? B * (C + VD) : 0, F);
    TAKE(dn_ba, dn && d->fused_proj & FUSED_BA ? B * 2 * NV : 0, F);
    const size_t E = moe ? (size_t)c->moe.n_expert : 0, K = moe ? (size_t)c->moe.n_used : 0;
    const size_t FE = moe ? (size_t)c->moe.n_ff_exp : 0;
    TAKE(moe_prob, B * E, F);
    TAKE(moe_wsel, B * K, F);
    TAKE(moe_sel, B * K, sizeof(int32_t));
    TAKE(moe_gate, B * K * FE, F);
    TAKE(moe_up, B * K * FE, F);
    TAKE(moe_y, B * K * D, F);
    TAKE(moe_acc, moe ? B * D : 0, F);
    TAKE(moe_shy, moe ? B * D : 0, F);
    TAKE(moe_shg, moe ? B : 0, F);
    const int sc = any_kind(c, LAYER_SHORTCONV);
    TAKE(sc_in, sc ? B * 3 * D : 0, F);
    TAKE(sc_bx, sc ? B * D : 0, F);
    TAKE(sc_conv, sc ? B * D : 0, F);
    TAKE(inv_freq, (cx->rope_dynamic[0] ? B : 1) * (size_t)(c->rope.n_dims / 2), F);
    TAKE(inv_freq_local, c->has_rope_local ? (cx->rope_dynamic[1] ? B : 1) * (size_t)(c->rope_local.n_dims / 2) : 0, F);
    const size_t out = B < OUT_CHUNK ? B : OUT_CHUNK;
    TAKE(out_x, out * D, F);
    TAKE(logits, cx->embeddings ? 0 : out * (size_t)c->n_vocab, F);
    TAKE(out_idx, B, sizeof(int32_t));
    TAKE(taps, (size_t)cx->n_taps * B * D, F);
#undef TAKE
    return off;
}

/* ---- creation ---- */

static gerbil_status alloc_host(struct gerbil_context *cx) {
    const size_t B = (size_t)cx->n_batch;
    const int half = cx->model->cfg.rope.n_dims / 2 > cx->model->cfg.rope_local.n_dims / 2
                         ? cx->model->cfg.rope.n_dims / 2 : cx->model->cfg.rope_local.n_dims / 2;
    cx->segs = calloc(B, sizeof *cx->segs);
    cx->rsegs = calloc(B, sizeof *cx->rsegs);
    int32_t **arrs[] = {&cx->span, &cx->seg_of, &cx->tok, &cx->kv_row, &cx->pos, &cx->row_user, &cx->row_rank,
                        &cx->out_span, &cx->out_user, &cx->out_idx_host, &cx->seg_seq, &cx->seg_n, &cx->seg_outs,
                        &cx->seg_sorted, &cx->seg_key, &cx->seg_first, &cx->seg_rw};
    int ok = cx->segs != NULL && cx->rsegs != NULL;
    for (size_t i = 0; i < sizeof arrs / sizeof arrs[0]; i++) ok &= (*arrs[i] = malloc(B * sizeof(int32_t))) != NULL;
    cx->seq_rows = calloc((size_t)cx->n_seq_max, sizeof *cx->seq_rows);
    cx->seq_seg = malloc((size_t)cx->n_seq_max * sizeof *cx->seq_seg);
    cx->freq_host = malloc(B * (size_t)(half > 0 ? half : 1) * sizeof(float));
    cx->seqs = calloc((size_t)cx->n_seq_max, sizeof *cx->seqs);
    ok &= cx->seq_rows && cx->seq_seg && cx->freq_host && cx->seqs;
    for (int i = 0; ok && i < cx->n_seq_max; i++) ok = kvt_init(&cx->seqs[i].kv, cx->n_ctx) == GERBIL_OK;
    return ok ? GERBIL_OK : err_set(GERBIL_ERR_NOMEM, "out of memory");
}

/* A KV block's pool rows: their bytes, and where block b's are. */
static size_t kv_block_bytes(const struct gerbil_context *cx) {
    return (size_t)KV_BLOCK * (size_t)cx->kv_stride * type_traits(cx->kv_type)->type_size;
}
static void *kv_block_at(const struct gerbil_context *cx, int32_t b) {
    return (char *)cx->kv_mem + (size_t)b * kv_block_bytes(cx);
}

/* The KV pool: whole blocks for n_ctx positions, each row every attention layer's K and V. */
static gerbil_status alloc_kv(struct gerbil_context *cx) {
    const struct model_config *c = &cx->model->cfg;
    const size_t elt = type_traits(cx->kv_type)->type_size;
    const int n_blocks = (cx->n_ctx + KV_BLOCK - 1) / KV_BLOCK;
    GB_TRY(kvb_init(&cx->blocks, n_blocks));
    cx->kv_stride = (int)(kv_bytes_per_token(c, elt) / elt);
    cx->kv_k = calloc((size_t)c->n_layer, sizeof *cx->kv_k);
    cx->kv_v = calloc((size_t)c->n_layer, sizeof *cx->kv_v);
    if (!cx->kv_k || !cx->kv_v) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    cx->kv_bytes = (size_t)n_blocks * kv_block_bytes(cx);
    if (!cx->kv_bytes) return GERBIL_OK;
    cx->kv_mem = cx->be->ops->alloc(cx->be, cx->kv_bytes, GB_BUF_LAZY);
    if (!cx->kv_mem)
        return err_set(GERBIL_ERR_NOMEM, "out of memory for a KV cache of %d positions (%.1f MiB)", cx->n_ctx,
                       cx->kv_bytes / 1048576.0);
    char *p = cx->kv_mem;
    for (int l = 0; l < c->n_layer; l++) {
        if (c->layer_kind[l] != LAYER_ATTENTION || layer_kv_shared(c, l)) continue;
        const size_t KV = (size_t)layer_n_kv(c, l) * (size_t)layer_head_dim(c, l);
        cx->kv_k[l] = p;
        cx->kv_v[l] = p + KV * elt;
        p += 2 * KV * elt;
    }
    for (int l = 0; l < c->n_layer; l++) /* Gemma 4: a KV-shared layer reads an earlier layer's cache */
        if (layer_kv_shared(c, l)) {
            cx->kv_k[l] = cx->kv_k[c->layer_kv_src[l]];
            cx->kv_v[l] = cx->kv_v[c->layer_kv_src[l]];
        }
    return GERBIL_OK;
}

/* Recurrent state: n_seq_max slots, then their checkpoints, each every layer's state. */
static gerbil_status alloc_state(struct gerbil_context *cx) {
    const struct model_config *c = &cx->model->cfg;
    cx->conv_off = calloc((size_t)c->n_layer, sizeof *cx->conv_off);
    cx->delta_off = calloc((size_t)c->n_layer, sizeof *cx->delta_off);
    if (!cx->conv_off || !cx->delta_off) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    size_t off = 0, conv;
    for (int l = 0; l < c->n_layer; l++) {
        size_t n = layer_state_floats(c, l, &conv);
        cx->conv_off[l] = off;
        cx->delta_off[l] = off + conv;
        off += n;
    }
    cx->slot_floats = off;
    if (!off) return GERBIL_OK;
    const size_t bytes = 2 * (size_t)cx->n_seq_max * off * sizeof(float);
    cx->rstate = cx->be->ops->alloc(cx->be, bytes, GB_BUF_ZERO);
    return cx->rstate ? GERBIL_OK
                      : err_set(GERBIL_ERR_NOMEM, "out of memory for recurrent state (%.1f MiB)", bytes / 1048576.0);
}

/* RoPE tables that do not depend on the sequence are computed once. */
static void rope_setup(struct gerbil_context *cx) {
    const struct model_config *c = &cx->model->cfg;
    const struct rope_config *rc[2] = {&c->rope, &c->rope_local};
    float *dst[2] = {cx->a.inv_freq, cx->a.inv_freq_local};
    cx->rope_scale[0] = cx->rope_scale[1] = 1.0f;
    for (int i = 0; i < 1 + c->has_rope_local; i++) {
        rope_freqs(rc[i], 1, cx->freq_host, &cx->rope_scale[i]);
        if (!cx->rope_dynamic[i])
            cx->be->ops->upload(cx->be, dst[i], cx->freq_host, (size_t)(rc[i]->n_dims / 2) * sizeof(float));
    }
}

gerbil_status gerbil_context_new(gerbil_model_t m, const gerbil_context_params *params, gerbil_context_t *out) {
    *out = NULL;
    const struct model_config *c = &m->cfg;
    gerbil_context_params p = params ? *params : gerbil_context_default_params();
    if (m->stt)
        return err_set(GERBIL_ERR_UNSUPPORTED, "%s is a speech-to-text model: it transcribes audio (gerbil transcribe, "
                       "gerbil logits --audio), it does not generate text from a prompt", c->arch_name);
    if (p.kv_type != GERBIL_KV_F16 && p.kv_type != GERBIL_KV_F32)
        return err_set(GERBIL_ERR_INVALID_ARG, "unknown kv cache type %d", (int)p.kv_type);
    if (p.n_taps < 0 || (p.n_taps > 0 && !p.tap_layers))
        return err_set(GERBIL_ERR_INVALID_ARG, "%d tap layers but no list of them", p.n_taps);
    for (int i = 0; i < p.n_taps; i++)
        if (p.tap_layers[i] < 0 || p.tap_layers[i] >= c->n_layer)
            return err_set(GERBIL_ERR_INVALID_ARG, "tap layer %d is outside the model's layers [0, %d)",
                           p.tap_layers[i], c->n_layer);
    if (c->no_lm_head && !p.embeddings)
        return err_set(GERBIL_ERR_UNSUPPORTED, "%s has no lm_head: it is an embedding model (gerbil embed), not a "
                       "text generator", c->arch_name);
    if (p.attention < GERBIL_ATTENTION_MODEL || p.attention > GERBIL_ATTENTION_BIDIRECTIONAL)
        return err_set(GERBIL_ERR_INVALID_ARG, "unknown attention type %d", (int)p.attention);
    if (p.attention == GERBIL_ATTENTION_BIDIRECTIONAL && (any_kind(c, LAYER_DELTANET) || any_kind(c, LAYER_SHORTCONV)))
        return err_set(GERBIL_ERR_UNSUPPORTED, "bidirectional attention: %s has recurrent layers", c->arch_name);
    const int n_ctx = p.n_ctx > 0 ? p.n_ctx : (c->n_ctx_train < DEFAULT_MAX_CTX ? c->n_ctx_train : DEFAULT_MAX_CTX);
    struct gerbil_context *cx = calloc(1, sizeof *cx);
    if (!cx) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    cx->model = m;
    cx->be = m->be;
    cx->embeddings = p.embeddings != 0;
    cx->bidirectional = p.attention == GERBIL_ATTENTION_MODEL ? c->bidirectional
                                                               : p.attention == GERBIL_ATTENTION_BIDIRECTIONAL;
    cx->n_ctx = n_ctx;
    cx->n_seq_max = p.n_seq_max > 0 ? p.n_seq_max : 1;
    cx->n_batch = p.n_batch > 0 ? p.n_batch : DEFAULT_BATCH;
    if (cx->n_batch > n_ctx) cx->n_batch = n_ctx;
    cx->kv_type = p.kv_type == GERBIL_KV_F32 ? GB_TYPE_F32 : GB_TYPE_F16;
    cx->rope_dynamic[0] = c->rope.type == ROPE_DYNAMIC;
    cx->rope_dynamic[1] = c->has_rope_local && c->rope_local.type == ROPE_DYNAMIC;
    gerbil_status st = GERBIL_OK;
    if (p.n_taps) {
        cx->tap_layers = malloc((size_t)p.n_taps * sizeof *cx->tap_layers);
        if (!cx->tap_layers) st = err_set(GERBIL_ERR_NOMEM, "out of memory");
        else memcpy(cx->tap_layers, p.tap_layers, (size_t)p.n_taps * sizeof *cx->tap_layers);
        cx->n_taps = p.n_taps;
    }
    if (st == GERBIL_OK) st = alloc_host(cx);
    if (st == GERBIL_OK) st = alloc_kv(cx);
    if (st == GERBIL_OK) st = alloc_state(cx);
    if (st == GERBIL_OK) {
        cx->arena_bytes = lay_out_arena(cx, 0);
        cx->arena = cx->be->ops->alloc(cx->be, cx->arena_bytes, 0);
        if (!cx->arena)
            st = err_set(GERBIL_ERR_NOMEM, "out of memory for the activations of %d-row batches (%.1f MiB)",
                         cx->n_batch, cx->arena_bytes / 1048576.0);
        else lay_out_arena(cx, (uintptr_t)cx->arena);
    }
    if (st == GERBIL_OK) {
        struct gb_reserve r = {.n_rows = cx->n_batch > OUT_CHUNK ? cx->n_batch : OUT_CHUNK,
                               .n_kv = cx->blocks.n_blocks * KV_BLOCK,
                               .n_sel = any_moe(c) ? c->moe.n_used : 0};
        if (any_kind(c, LAYER_DELTANET)) {
            r.delta_dk = c->dn.k_dim;
            r.delta_dv = c->dn.v_dim;
        }
        pthread_mutex_lock(&m->lock);
        st = cx->be->ops->reserve(cx->be, &r);
        pthread_mutex_unlock(&m->lock);
    }
    if (st != GERBIL_OK) {
        gerbil_context_free(cx);
        return st;
    }
    rope_setup(cx);
    *out = cx;
    return GERBIL_OK;
}

void gerbil_context_free(gerbil_context_t cx) {
    if (!cx) return;
    struct backend *be = cx->be;
    for (int i = 0; cx->seqs && i < cx->n_seq_max; i++) kvt_destroy(&cx->blocks, &cx->seqs[i].kv);
    kvb_destroy(&cx->blocks);
    if (cx->kv_mem) be->ops->buf_free(be, cx->kv_mem, cx->kv_bytes);
    if (cx->rstate) be->ops->buf_free(be, cx->rstate, 2 * (size_t)cx->n_seq_max * cx->slot_floats * sizeof(float));
    if (cx->arena) be->ops->buf_free(be, cx->arena, cx->arena_bytes);
    free(cx->kv_k); free(cx->kv_v); free(cx->conv_off); free(cx->delta_off); free(cx->seqs);
    free(cx->segs); free(cx->span); free(cx->seg_of); free(cx->tok); free(cx->kv_row); free(cx->pos);
    free(cx->row_user); free(cx->row_rank); free(cx->out_span); free(cx->out_user); free(cx->out_idx_host);
    free(cx->seg_seq); free(cx->seg_n); free(cx->seg_outs); free(cx->seg_sorted);
    if (cx->lora) { free(cx->lora->runs); free(cx->lora->segs); free(cx->lora); }
    free(cx->rsegs); free(cx->seg_key); free(cx->seg_first); free(cx->seg_rw);
    free(cx->seq_rows); free(cx->seq_seg); free(cx->freq_host);
    free(cx->tap_layers); free(cx->logits); free(cx->hidden);
    free(cx);
}

int gerbil_context_n_ctx(gerbil_context_t cx) { return cx->n_ctx; }
int gerbil_context_n_batch(gerbil_context_t cx) { return cx->n_batch; }
int gerbil_context_n_free(gerbil_context_t cx) { return cx->blocks.n_free * KV_BLOCK; }

/* ---- sequences ---- */

static struct ctx_seq *seq_at(struct gerbil_context *cx, int32_t id) {
    return id >= 0 && id < cx->n_seq_max && cx->seqs[id].used ? &cx->seqs[id] : NULL;
}

static float *slot_state(struct gerbil_context *cx, int32_t id) { return cx->rstate + (size_t)id * cx->slot_floats; }
static float *slot_ckpt(struct gerbil_context *cx, int32_t id) {
    return cx->rstate + ((size_t)cx->n_seq_max + (size_t)id) * cx->slot_floats;
}

/* Sequence did of dc takes the recurrent state and checkpoint of sid of sc. */
static void copy_state(struct gerbil_context *dc, int32_t did, struct gerbil_context *sc, int32_t sid) {
    if (!dc->rstate) return;
    const size_t bytes = dc->slot_floats * sizeof(float);
    dc->be->ops->copy(dc->be, slot_state(dc, did), slot_state(sc, sid), bytes);
    dc->be->ops->copy(dc->be, slot_ckpt(dc, did), slot_ckpt(sc, sid), bytes);
}

void ctx_seq_reset(struct gerbil_context *cx, int32_t id) {
    struct ctx_seq *s = &cx->seqs[id];
    kvb_truncate(&cx->blocks, &s->kv, 0);
    s->len = 0;
    s->ckpt_pos = -1;
    if (cx->rstate) cx->be->ops->zero(cx->be, slot_state(cx, id), cx->slot_floats * sizeof(float));
}

gerbil_status gerbil_seq_new(gerbil_context_t cx, int32_t *out) {
    *out = -1;
    for (int32_t i = 0; i < cx->n_seq_max; i++)
        if (!cx->seqs[i].used) {
            cx->seqs[i].used = 1;
            ctx_seq_reset(cx, i);
            *out = i;
            return GERBIL_OK;
        }
    return err_set(GERBIL_ERR_CONTEXT, "all %d sequences of the context are in use", cx->n_seq_max);
}

void gerbil_seq_free(gerbil_context_t cx, int32_t id) {
    struct ctx_seq *s = seq_at(cx, id);
    if (!s) return;
    kvb_truncate(&cx->blocks, &s->kv, 0);
    s->used = 0;
}

gerbil_status gerbil_seq_fork(gerbil_context_t cx, int32_t src, int32_t *out) {
    *out = -1;
    struct ctx_seq *s = seq_at(cx, src);
    if (!s) return err_set(GERBIL_ERR_INVALID_ARG, "no sequence %d to fork", (int)src);
    int32_t id;
    GB_TRY(gerbil_seq_new(cx, &id));
    struct ctx_seq *d = &cx->seqs[id];
    kvb_fork(&cx->blocks, &d->kv, &s->kv);
    d->len = s->len;
    d->ckpt_pos = s->ckpt_pos;
    copy_state(cx, id, cx, src);
    *out = id;
    return GERBIL_OK;
}

/* A recurrent state cannot be rewound token by token: go back to the checkpoint when it
 * lies at or before n, else to the start. */
void gerbil_seq_truncate(gerbil_context_t cx, int32_t id, int n) {
    struct ctx_seq *s = seq_at(cx, id);
    if (!s || n < 0 || n >= s->len) return;
    if (!cx->rstate) {
        kvb_truncate(&cx->blocks, &s->kv, n);
        s->len = n;
    } else if (s->ckpt_pos >= 0 && s->ckpt_pos <= n) {
        cx->be->ops->copy(cx->be, slot_state(cx, id), slot_ckpt(cx, id), cx->slot_floats * sizeof(float));
        kvb_truncate(&cx->blocks, &s->kv, s->ckpt_pos);
        s->len = s->ckpt_pos;
    } else {
        ctx_seq_reset(cx, id);
    }
}

void gerbil_seq_checkpoint(gerbil_context_t cx, int32_t id) {
    struct ctx_seq *s = seq_at(cx, id);
    if (!s || !cx->rstate) return;
    cx->be->ops->copy(cx->be, slot_ckpt(cx, id), slot_state(cx, id), cx->slot_floats * sizeof(float));
    s->ckpt_pos = s->len;
}

int gerbil_seq_len(gerbil_context_t cx, int32_t id) {
    struct ctx_seq *s = seq_at(cx, id);
    return s ? s->len : -1;
}

/* ---- block sharing, for schedulers and prefix caches ---- */

size_t gerbil_model_kv_bytes_per_token(gerbil_model_t m, gerbil_kv_type t) {
    return kv_bytes_per_token(&m->cfg, t == GERBIL_KV_F32 ? 4 : 2);
}

int gerbil_context_has_recurrent(gerbil_context_t cx) { return cx->rstate != NULL; }
int gerbil_context_n_blocks(gerbil_context_t cx) { return cx->blocks.n_blocks; }
int gerbil_context_n_free_blocks(gerbil_context_t cx) { return cx->blocks.n_free; }

int gerbil_seq_blocks_needed(gerbil_context_t cx, int32_t id, int n_new) {
    struct ctx_seq *s = seq_at(cx, id);
    if (!s) return -1;
    if (!cx->kv_mem || n_new <= 0) return 0;
    return kvb_needed(&cx->blocks, &s->kv, s->len, s->len + n_new);
}

int gerbil_seq_blocks(gerbil_context_t cx, int32_t id, int32_t *out, int cap) {
    struct ctx_seq *s = seq_at(cx, id);
    if (!s) return 0;
    for (int i = 0; i < s->kv.n && i < cap; i++) out[i] = s->kv.blocks[i];
    return s->kv.n;
}

static int block_held(struct gerbil_context *cx, int32_t b) {
    return b >= 0 && b < cx->blocks.n_blocks && cx->blocks.ref[b] > 0;
}

void gerbil_kv_block_retain(gerbil_context_t cx, int32_t b) {
    if (block_held(cx, b)) kvb_ref(&cx->blocks, b);
}

void gerbil_kv_block_release(gerbil_context_t cx, int32_t b) {
    if (block_held(cx, b)) kvb_unref(&cx->blocks, b);
}

int gerbil_kv_block_refs(gerbil_context_t cx, int32_t b) {
    return b >= 0 && b < cx->blocks.n_blocks ? cx->blocks.ref[b] : 0;
}

size_t gerbil_context_state_bytes(gerbil_context_t cx) { return cx->rstate ? cx->slot_floats * sizeof(float) : 0; }

gerbil_status gerbil_seq_state_save(gerbil_context_t cx, int32_t id, void *dst) {
    if (!seq_at(cx, id)) return err_set(GERBIL_ERR_INVALID_ARG, "no sequence %d", (int)id);
    if (cx->rstate) cx->be->ops->download(cx->be, dst, slot_state(cx, id), cx->slot_floats * sizeof(float));
    return GERBIL_OK;
}

gerbil_status gerbil_seq_attach(gerbil_context_t cx, int32_t id, const int32_t *blocks, int n, const void *state) {
    struct ctx_seq *s = seq_at(cx, id);
    if (!s) return err_set(GERBIL_ERR_INVALID_ARG, "no sequence %d to attach blocks to", (int)id);
    if (s->len) return err_set(GERBIL_ERR_INVALID_ARG, "sequence %d is not empty (%d positions)", (int)id, s->len);
    if (cx->rstate && !state)
        return err_set(GERBIL_ERR_INVALID_ARG, "the model has recurrent layers: KV blocks alone do not hold its state");
    if (n < 0 || n > s->kv.cap)
        return err_set(GERBIL_ERR_INVALID_ARG, "%d blocks exceed a sequence's %d", n, s->kv.cap);
    for (int i = 0; i < n; i++)
        if (!block_held(cx, blocks[i]))
            return err_set(GERBIL_ERR_INVALID_ARG, "block %d is not a held block of the pool", (int)blocks[i]);
    if (!cx->kv_mem) return err_set(GERBIL_ERR_INVALID_ARG, "the model has no KV cache");
    kvb_attach(&cx->blocks, &s->kv, blocks, n);
    s->len = n * KV_BLOCK;
    if (cx->rstate) {
        const size_t bytes = cx->slot_floats * sizeof(float);
        cx->be->ops->upload(cx->be, slot_state(cx, id), state, bytes);
        cx->be->ops->upload(cx->be, slot_ckpt(cx, id), state, bytes);
        s->ckpt_pos = s->len;
    }
    return GERBIL_OK;
}

/* Block src's pool rows to block dst (copy-on-write of a shared last block). */
static void copy_block(void *user, int32_t dst, int32_t src) {
    struct gerbil_context *cx = user;
    cx->be->ops->copy(cx->be, kv_block_at(cx, dst), kv_block_at(cx, src), kv_block_bytes(cx));
}

gerbil_status ctx_seq_copy(struct gerbil_context *dc, int32_t did, struct gerbil_context *sc, int32_t sid) {
    struct ctx_seq *d = &dc->seqs[did], *s = &sc->seqs[sid];
    if (dc->model != sc->model || dc->kv_type != sc->kv_type || dc->n_ctx < s->len)
        return err_set(GERBIL_ERR_INVALID_ARG, "session copy needs the same model and kv type and room for %d tokens",
                       s->len);
    ctx_seq_reset(dc, did);
    if (dc->kv_mem) {
        GB_TRY(kvb_extend(&dc->blocks, &d->kv, 0, s->len, copy_block, dc));
        for (int i = 0; i < d->kv.n; i++)
            dc->be->ops->copy(dc->be, kv_block_at(dc, d->kv.blocks[i]), kv_block_at(sc, s->kv.blocks[i]),
                              kv_block_bytes(dc));
    }
    copy_state(dc, did, sc, sid);
    d->len = s->len;
    d->ckpt_pos = s->ckpt_pos;
    return GERBIL_OK;
}

/* ---- eval ---- */

static gerbil_status check_batch(struct gerbil_context *cx, const gerbil_batch *b) {
    const struct model_config *c = &cx->model->cfg;
    if (!b || b->n_rows <= 0) return err_set(GERBIL_ERR_INVALID_ARG, "no tokens to evaluate");
    if (b->n_rows > cx->n_batch)
        return err_set(GERBIL_ERR_INVALID_ARG, "a batch of %d rows exceeds the context's n_batch %d", b->n_rows,
                       cx->n_batch);
    if (!b->tokens || !b->seq) return err_set(GERBIL_ERR_INVALID_ARG, "a batch needs tokens and seq");
    for (int i = 0; i < b->n_rows; i++) {
        const int32_t t = b->tokens[i];
        if (t == GERBIL_TOKEN_EMBD) {
            if (!b->embd)
                return err_set(GERBIL_ERR_INVALID_ARG, "row %d is an embedding row but the batch has no embd", i);
            if (c->ple_dim) /* their per-layer inputs would need the token id behind the embedding */
                return err_set(GERBIL_ERR_UNSUPPORTED, "row %d is an embedding row: not supported yet for a model "
                               "with per-layer embeddings (Gemma 4 hidden_size_per_layer_input)", i);
        } else if (t < 0 || t >= c->n_vocab) {
            return err_set(GERBIL_ERR_INVALID_ARG, "token id %d at position %d is outside the vocabulary [0, %d)",
                           (int)t, i, c->n_vocab);
        }
        if (!seq_at(cx, b->seq[i]))
            return err_set(GERBIL_ERR_INVALID_ARG, "row %d: no sequence %d in this context", i, (int)b->seq[i]);
        if (cx->bidirectional && cx->seqs[b->seq[i]].len > 0)
            return err_set(GERBIL_ERR_INVALID_ARG, "row %d: sequence %d already holds %d positions; with "
                           "bidirectional attention a sequence is evaluated in one batch", i, (int)b->seq[i],
                           cx->seqs[b->seq[i]].len);
    }
    return GERBIL_OK;
}

/* Stable order of the segments by key ascending (insertion: batches have few segments). */
static void sort_by(int32_t *idx, int n, const int32_t *key) {
    for (int i = 1; i < n; i++) {
        int32_t v = idx[i];
        int j = i;
        while (j > 0 && key[idx[j - 1]] > key[v]) {
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = v;
    }
}

/* The batch's segments and rows (host) and the KV blocks its rows need; nothing changes
 * on failure. */
static gerbil_status plan_batch(struct gerbil_context *cx, const gerbil_batch *ub, struct gb_batch *gb, int *n_out) {
    const int n = ub->n_rows;
    int n_segs = 0;
    for (int i = 0; i < n; i++) { /* segments in order of first appearance */
        const int32_t sid = ub->seq[i];
        if (cx->seq_rows[sid]++ == 0) {
            cx->seq_seg[sid] = n_segs;
            cx->seg_rw[n_segs] = 0;
            cx->seg_seq[n_segs++] = sid;
        }
        if (ub->verify && ub->verify[i]) cx->seg_rw[cx->seq_seg[sid]] = 1;
    }
    for (int k = 0; k < n_segs; k++) cx->seg_n[k] = cx->seq_rows[cx->seg_seq[k]];
    /* a verified sequence's rows are segments of one row each: they sort as size 1 */
    for (int k = 0; k < n_segs; k++) cx->seg_key[k] = cx->seg_rw[k] ? 1 : cx->seg_n[k];
    for (int i = 0; i < n; i++) cx->seq_rows[ub->seq[i]] = 0;
    int need = 0;
    for (int k = 0; k < n_segs; k++) {
        const struct ctx_seq *s = &cx->seqs[cx->seg_seq[k]];
        if (s->len + cx->seg_n[k] > cx->n_ctx)
            return err_set(GERBIL_ERR_CONTEXT, "%d tokens after %d already in sequence %d exceed the context size %d",
                           cx->seg_n[k], s->len, (int)cx->seg_seq[k], cx->n_ctx);
        if (!cx->kv_mem) continue;
        need += kvb_needed(&cx->blocks, &s->kv, s->len, s->len + cx->seg_n[k]);
        /* a shared last block that several of the batch's sequences extend is copied by all
         * but its last holder (ref - 1 copies at most), which then writes it in place */
        const int32_t b = kvb_cow_block(&cx->blocks, &s->kv, s->len, s->len + cx->seg_n[k]);
        int before = 0;
        for (int j = 0; b >= 0 && j < k; j++) {
            const struct ctx_seq *o = &cx->seqs[cx->seg_seq[j]];
            before += kvb_cow_block(&cx->blocks, &o->kv, o->len, o->len + cx->seg_n[j]) == b;
        }
        if (b >= 0 && before >= cx->blocks.ref[b] - 1) need--;
    }
    if (need > cx->blocks.n_free)
        return err_set(GERBIL_ERR_CONTEXT, "the KV cache is full: this batch needs %d more blocks of %d positions, "
                       "%d of %d are free", need, KV_BLOCK, cx->blocks.n_free, cx->blocks.n_blocks);

    for (int k = 0; k < n_segs; k++) cx->seg_sorted[k] = k;
    sort_by(cx->seg_sorted, n_segs, cx->seg_key);                /* segments by size */
    int n_rs = 0; /* row segments (segs) */
    for (int r = 0, row = 0; r < n_segs; r++) {
        const int k = cx->seg_sorted[r];
        const int32_t sid = cx->seg_seq[k];
        struct ctx_seq *s = &cx->seqs[sid];
        if (cx->kv_mem) {
            gerbil_status st = kvb_extend(&cx->blocks, &s->kv, s->len, s->len + cx->seg_n[k], copy_block, cx);
            GB_ASSERT(st == GERBIL_OK); /* the blocks were counted above */
        }
        const int rw = cx->seg_rw[k] && cx->seg_n[k] > 1;
        cx->rsegs[r] = (struct gb_seg){.row0 = row, .n_rows = cx->seg_n[k], .pos0 = s->len, .blocks = s->kv.blocks,
                                       .state = sid, .rowwise = rw};
        cx->seg_first[r] = n_rs;
        if (rw)
            for (int i = 0; i < cx->seg_n[k]; i++)
                cx->segs[n_rs++] = (struct gb_seg){.row0 = row + i, .n_rows = 1, .pos0 = s->len + i,
                                                   .blocks = s->kv.blocks, .state = sid};
        else cx->segs[n_rs++] = cx->rsegs[r];
        cx->seq_seg[sid] = r;
        row += cx->seg_n[k];
    }
    /* rows: a sequence's k-th row of the batch at its segment's row0 + k; outputs (flagged
     * rows, or each sequence's last) numbered in batch order */
    int outs = 0;
    for (int i = 0; i < n; i++) {
        const int32_t sid = ub->seq[i];
        const int r = cx->seq_seg[sid];
        const struct gb_seg *sg = &cx->rsegs[r];
        const int k = cx->seq_rows[sid]++, t = sg->row0 + k;
        cx->row_user[t] = i;
        cx->tok[t] = ub->tokens[i];
        cx->span[t] = sg->rowwise ? 1 : sg->n_rows;
        cx->seg_of[t] = cx->seg_first[r] + (sg->rowwise ? k : 0);
        cx->kv_row[t] = cx->kv_mem ? (int32_t)kv_pool_row(sg->blocks, sg->pos0 + k) : 0;
        cx->pos[t] = ub->pos ? ub->pos[i] : sg->pos0 + k;
        const int want = ub->logits ? ub->logits[i] != 0 : k == sg->n_rows - 1;
        cx->row_rank[t] = want ? outs++ : -1;
    }
    for (int i = 0; i < n; i++) cx->seq_rows[ub->seq[i]] = 0;
    /* the output rows by segment, the segments in ascending order of their output count */
    for (int r = 0; r < n_rs; r++) cx->seg_outs[r] = 0;
    for (int t = 0; t < n; t++) cx->seg_outs[cx->seg_of[t]] += cx->row_rank[t] >= 0;
    for (int r = 0; r < n_rs; r++) cx->seg_sorted[r] = r;
    sort_by(cx->seg_sorted, n_rs, cx->seg_outs);
    for (int j = 0, o = 0; j < n_rs; j++) {
        const int r = cx->seg_sorted[j];
        for (int t = cx->segs[r].row0; t < cx->segs[r].row0 + cx->segs[r].n_rows; t++)
            if (cx->row_rank[t] >= 0) {
                cx->out_idx_host[o] = t;
                cx->out_span[o] = cx->seg_outs[r];
                cx->out_user[o++] = cx->row_rank[t];
            }
    }
    *n_out = outs;
    *gb = (struct gb_batch){.n_rows = n, .n_segs = n_rs, .segs = cx->segs, .span = cx->span, .seg_of = cx->seg_of,
                            .tok = cx->tok, .kv_row = cx->kv_row, .pos = cx->pos, .n_rsegs = n_segs,
                            .rsegs = n_rs == n_segs ? cx->segs : cx->rsegs};
    return GERBIL_OK;
}

/* Dynamic RoPE: a table per segment, for its own length (transformers grows the base with
 * the sequence). */
static void rope_tables(struct gerbil_context *cx, const struct gb_batch *gb) {
    const struct model_config *c = &cx->model->cfg;
    const struct rope_config *rc[2] = {&c->rope, &c->rope_local};
    float *dst[2] = {cx->a.inv_freq, cx->a.inv_freq_local};
    for (int i = 0; i < 2; i++) {
        if (!cx->rope_dynamic[i]) continue;
        const int half = rc[i]->n_dims / 2;
        float scale;
        for (int r = 0; r < gb->n_segs; r++)
            rope_freqs(rc[i], gb->segs[r].pos0 + gb->segs[r].n_rows, cx->freq_host + (size_t)r * half, &scale);
        cx->be->ops->upload(cx->be, dst[i], cx->freq_host, (size_t)gb->n_segs * half * sizeof(float));
    }
}

static gerbil_status grow_outputs(struct gerbil_context *cx, int n_out) {
    if (n_out <= cx->cap_out) return GERBIL_OK;
    const struct model_config *c = &cx->model->cfg;
    float *lg = malloc((size_t)n_out * (cx->embeddings ? c->n_embd : c->n_vocab) * sizeof(float));
    float *hd = cx->n_taps ? malloc((size_t)cx->n_taps * n_out * c->n_embd * sizeof(float)) : NULL;
    if (!lg || (cx->n_taps && !hd)) {
        free(lg);
        free(hd);
        return err_set(GERBIL_ERR_NOMEM, "out of memory for the logits of %d rows", n_out);
    }
    free(cx->logits);
    free(cx->hidden);
    cx->logits = lg;
    cx->hidden = hd;
    cx->cap_out = n_out;
    return GERBIL_OK;
}

gerbil_status ctx_eval(struct gerbil_context *cx, const gerbil_batch *ub, float *dest) {
    GB_TRY(check_batch(cx, ub));
    struct gerbil_model *m = cx->model;
    const struct model_config *c = &m->cfg;
    struct backend *be = cx->be;
    const int D = c->n_embd, V = c->n_vocab;
    pthread_mutex_lock(&m->lock);
    struct gb_batch gb;
    int n_out = 0;
    gerbil_status st = plan_batch(cx, ub, &gb, &n_out);
    const struct lora_fwd *lora = NULL;
    if (st == GERBIL_OK && (st = lora_plan(cx, ub, cx->row_user, gb.n_rows, &lora)) != GERBIL_OK)
        for (int r = 0; r < gb.n_segs; r++) { /* give back the blocks the rows took */
            struct ctx_seq *s = &cx->seqs[gb.segs[r].state];
            kvb_truncate(&cx->blocks, &s->kv, s->len);
        }
    if (st == GERBIL_OK && !dest && (st = grow_outputs(cx, n_out)) != GERBIL_OK)
        for (int r = 0; r < gb.n_rsegs; r++) { /* give back the blocks the rows took */
            struct ctx_seq *s = &cx->seqs[gb.rsegs[r].state];
            kvb_truncate(&cx->blocks, &s->kv, s->len);
        }
    if (st != GERBIL_OK) {
        pthread_mutex_unlock(&m->lock);
        return st;
    }
    if (!dest || cx->embeddings) dest = cx->logits;
    const struct fwd f = {.c = cx, .cfg = c, .be = be, .b = &gb, .n = gb.n_rows, .rows = batch_rows(&gb),
                          .n_out = n_out, .lora = lora};
    be->ops->batch_begin(be, &gb);
    rope_tables(cx, &gb);
    if (n_out) be->ops->upload(be, cx->a.out_idx, cx->out_idx_host, (size_t)n_out * sizeof(int32_t));
    llama_embed(&f);
    for (int t = 0; t < gb.n_rows; t++) /* rows given as embeddings */
        if (gb.tok[t] == GERBIL_TOKEN_EMBD)
            be->ops->upload(be, cx->a.x + (size_t)t * D, ub->embd + (size_t)cx->row_user[t] * D, (size_t)D * sizeof(float));
    llama_layers(&f);
    for (int o0 = 0; o0 < n_out; o0 += OUT_CHUNK) {
        const int k = n_out - o0 < OUT_CHUNK ? n_out - o0 : OUT_CHUNK;
        op_gather_rows(be, cx->a.out_x, cx->a.x, cx->a.out_idx + o0, k, D);
        if (cx->embeddings) { /* the final norm only: hidden states, in batch order */
            op_rmsnorm(be, cx->a.out_x, cx->a.out_x, m->out_norm, c->norm_eps, k, D);
            for (int i = 0; i < k; i++)
                be->ops->download(be, dest + (size_t)cx->out_user[o0 + i] * D, cx->a.out_x + (size_t)i * D,
                                  (size_t)D * sizeof(float));
            continue;
        }
        int in_order = be->ops->host_memory; /* then lm_head may write the caller's rows itself */
        for (int i = 0; in_order && i < k; i++) in_order = cx->out_user[o0 + i] == cx->out_user[o0] + i;
        if (in_order) {
            llama_logits(&f, k, cx->out_span + o0, dest + (size_t)cx->out_user[o0] * V);
            continue;
        }
        llama_logits(&f, k, cx->out_span + o0, cx->a.logits);
        for (int i = 0; i < k; i++)
            be->ops->download(be, dest + (size_t)cx->out_user[o0 + i] * V, cx->a.logits + (size_t)i * V,
                              (size_t)V * sizeof(float));
    }
    for (int tp = 0; tp < cx->n_taps && dest == cx->logits; tp++)
        for (int i = 0; i < n_out; i++)
            be->ops->download(be, cx->hidden + ((size_t)tp * cx->cap_out + cx->out_user[i]) * D,
                              cx->a.taps + ((size_t)tp * cx->n_batch + i) * D, (size_t)D * sizeof(float));
    be->ops->sync(be);
    for (int r = 0; r < gb.n_rsegs; r++) cx->seqs[gb.rsegs[r].state].len += gb.rsegs[r].n_rows;
    cx->n_out = dest == cx->logits ? n_out : 0;
    pthread_mutex_unlock(&m->lock);
    return GERBIL_OK;
}

gerbil_status gerbil_context_eval(gerbil_context_t cx, const gerbil_batch *b) { return ctx_eval(cx, b, NULL); }

int gerbil_context_n_outputs(gerbil_context_t cx) { return cx->n_out; }

const float *gerbil_context_logits(gerbil_context_t cx, int i) {
    return i >= 0 && i < cx->n_out && !cx->embeddings ? cx->logits + (size_t)i * cx->model->cfg.n_vocab : NULL;
}

const float *gerbil_context_embedding(gerbil_context_t cx, int i) {
    return i >= 0 && i < cx->n_out && cx->embeddings ? cx->logits + (size_t)i * cx->model->cfg.n_embd : NULL;
}

const float *gerbil_context_hidden(gerbil_context_t cx, int i, int tap) {
    if (i < 0 || i >= cx->n_out || tap < 0 || tap >= cx->n_taps) return NULL;
    return cx->hidden + ((size_t)tap * cx->cap_out + i) * cx->model->cfg.n_embd;
}
