/* Gated DeltaNet layers (Qwen3.5, Qwen3-Next "linear_attention"): in_proj_qkv -> causal
 * depthwise conv1d (+SiLU, rolling state) -> q, k L2-normalised -> the gated delta rule
 * (state per value head [dk][dv]) -> gated RMSNorm with silu(z) -> out_proj.
 * beta = sigmoid(x W_b^T); decay g = -exp(A_log) * softplus(x W_a^T + dt_bias).
 * Qwen3-Next fuses the projections into in_proj_qkvz and in_proj_ba, grouped per key
 * head; their outputs are gathered back into the [q | k | v], z, b, a order after the
 * matmul (which works for every weight format, quantized rows included). */
#include "base/status.h"
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int conv_dim(const struct deltanet_config *d) { return 2 * d->n_k_heads * d->k_dim + d->n_v_heads * d->v_dim; }

size_t deltanet_f32_floats(const struct model_config *c) {
    const struct deltanet_config *d = &c->dn;
    for (int l = 0; l < c->n_layer; l++)
        if (c->layer_kind[l] == LAYER_DELTANET)
            return (size_t)conv_dim(d) * d->conv_kernel + 2 * (size_t)d->n_v_heads + (size_t)d->v_dim;
    return 0;
}

gerbil_status deltanet_bind(struct binder *b, int l, struct layer_weights *w) {
    const struct model_config *c = &b->m->cfg;
    const struct deltanet_config *d = &c->dn;
    const int64_t D = c->n_embd, VD = (int64_t)d->n_v_heads * d->v_dim, NV = d->n_v_heads;
    char name[256];
#define NAME(fmt) (snprintf(name, sizeof name, "model.layers.%d.linear_attn." fmt, l), name)
    if (d->fused_proj & FUSED_QKVZ) {
        GB_TRY(bind_matrix(b, NAME("in_proj_qkvz.weight"), conv_dim(d) + VD, D, &w->w_qkvz));
    } else {
        GB_TRY(bind_matrix(b, NAME("in_proj_qkv.weight"), conv_dim(d), D, &w->w_qkv));
        GB_TRY(bind_matrix(b, NAME("in_proj_z.weight"), VD, D, &w->w_z));
    }
    if (d->fused_proj & FUSED_BA) {
        GB_TRY(bind_matrix(b, NAME("in_proj_ba.weight"), 2 * NV, D, &w->w_ba));
    } else {
        GB_TRY(bind_matrix(b, NAME("in_proj_b.weight"), NV, D, &w->w_b));
        GB_TRY(bind_matrix(b, NAME("in_proj_a.weight"), NV, D, &w->w_a));
    }
    GB_TRY(bind_matrix(b, NAME("out_proj.weight"), D, VD, &w->w_out));
    GB_TRY(bind_vector(b, NAME("conv1d.weight"), (int64_t)conv_dim(d) * d->conv_kernel, 0, &w->conv_w));
    GB_TRY(bind_vector(b, NAME("dt_bias"), NV, 0, &w->dt_bias));
    GB_TRY(bind_vector(b, NAME("norm.weight"), d->v_dim, 0, &w->dn_norm));
    GB_TRY(bind_vector(b, NAME("A_log"), NV, 0, &w->ssm_a));
#undef NAME
    if (!b->m->src.is_gguf) { /* GGUF stores -exp(A_log) already */
        float *a = (float *)w->ssm_a;
        for (int h = 0; h < NV; h++) a[h] = -expf(a[h]);
    }
    /* the conv kernel tap-major ([K][C]) so the conv runs along channels */
    const int C = conv_dim(d), K = d->conv_kernel;
    float *tmp = malloc((size_t)C * K * sizeof *tmp), *cw = (float *)w->conv_w;
    if (!tmp) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    for (int c = 0; c < C; c++)
        for (int j = 0; j < K; j++) tmp[(size_t)j * C + c] = cw[(size_t)c * K + j];
    memcpy(cw, tmp, (size_t)C * K * sizeof *tmp);
    free(tmp);
    return GERBIL_OK;
}

/* Qwen3-Next: x W_qkvz^T and x W_ba^T, then per key head g the rows' pieces moved to
 * where the unfused projections put them: q_g, k_g, v_g into dn_in ([q | k | v]), z_g
 * into dn_z, b_g into dn_beta and a_g into dn_g (value heads g * r .. g * r + r - 1).
 * GGUF conversions keep only in_proj_ba fused (qkvz is stored as attn_qkv + attn_gate). */
static void fused_projections(const struct fwd *f, const struct layer_weights *w, int l) {
    const struct deltanet_config *d = &f->cfg->dn;
    const struct act_bufs *a = &f->c->a;
    struct backend *be = f->be;
    const int n = f->n, nk = d->n_k_heads, dk = d->k_dim, r = d->n_v_heads / nk, rv = r * d->v_dim;
    const int C = conv_dim(d), VD = d->n_v_heads * d->v_dim, NV = d->n_v_heads, key_dim = nk * dk;
    const int W = C + VD, G = 2 * dk + 2 * rv;
    const int fused = d->fused_proj;
    if (fused & FUSED_QKVZ) {
        op_matmul(be, a->dn_qkvz, a->xn, &w->w_qkvz, NULL, f->rows);
        op_copy_strided(be, a->dn_in, C, dk, a->dn_qkvz, W, G, n, nk, dk);                        /* q_g */
        op_copy_strided(be, a->dn_in + key_dim, C, dk, a->dn_qkvz + dk, W, G, n, nk, dk);         /* k_g */
        op_copy_strided(be, a->dn_in + 2 * key_dim, C, rv, a->dn_qkvz + 2 * dk, W, G, n, nk, rv); /* v_g */
        op_copy_strided(be, a->dn_z, VD, rv, a->dn_qkvz + 2 * dk + rv, W, G, n, nk, rv);         /* z_g */
    } else {
        op_matmul(be, a->dn_in, a->xn, &w->w_qkv, NULL, f->rows);
        op_matmul(be, a->dn_z, a->xn, &w->w_z, NULL, f->rows);
        lora_apply(f, l, LT_DN_QKV, a->dn_in, a->xn);
        lora_apply(f, l, LT_DN_Z, a->dn_z, a->xn);
    }
    if (fused & FUSED_BA) {
        op_matmul(be, a->dn_ba, a->xn, &w->w_ba, NULL, f->rows);
        op_copy_strided(be, a->dn_beta, NV, r, a->dn_ba, 2 * NV, 2 * r, n, nk, r);               /* b_g */
        op_copy_strided(be, a->dn_g, NV, r, a->dn_ba + r, 2 * NV, 2 * r, n, nk, r);              /* a_g */
    } else {
        op_matmul(be, a->dn_beta, a->xn, &w->w_b, NULL, f->rows);
        op_matmul(be, a->dn_g, a->xn, &w->w_a, NULL, f->rows);
        lora_apply(f, l, LT_DN_B, a->dn_beta, a->xn);
        lora_apply(f, l, LT_DN_A, a->dn_g, a->xn);
    }
}

void deltanet_forward(const struct fwd *f, int l) {
    const struct model_config *c = f->cfg;
    const struct deltanet_config *d = &c->dn;
    struct gerbil_context *cx = f->c;
    const struct layer_weights *w = &cx->model->layers[l];
    const struct act_bufs *a = &cx->a;
    struct backend *be = f->be;
    const int n = f->n, C = conv_dim(d), NV = d->n_v_heads, key_dim = d->n_k_heads * d->k_dim;

    if (d->fused_proj) {
        fused_projections(f, w, l);
    } else {
        op_matmul(be, a->dn_in, a->xn, &w->w_qkv, NULL, f->rows);      /* [q | k | v] before the conv */
        op_matmul(be, a->dn_z, a->xn, &w->w_z, NULL, f->rows);         /* output gate */
        op_matmul(be, a->dn_beta, a->xn, &w->w_b, NULL, f->rows);
        op_matmul(be, a->dn_g, a->xn, &w->w_a, NULL, f->rows);
        lora_apply(f, l, LT_DN_QKV, a->dn_in, a->xn);                  /* + LoRA, per row's adapter */
        lora_apply(f, l, LT_DN_Z, a->dn_z, a->xn);
        lora_apply(f, l, LT_DN_B, a->dn_beta, a->xn);
        lora_apply(f, l, LT_DN_A, a->dn_g, a->xn);
    }
    op_conv1d(be, a->dn_conv, a->dn_in, ctx_state(cx, cx->conv_off[l]), w->conv_w, C, d->conv_kernel, 1,
              f->b->rsegs, f->b->n_rsegs);
    op_l2norm_heads(be, a->dn_conv, n, d->n_k_heads, d->k_dim, C, 1e-6f, 1.0f / sqrtf((float)d->k_dim));
    op_l2norm_heads(be, a->dn_conv + key_dim, n, d->n_k_heads, d->k_dim, C, 1e-6f, 1.0f);
    op_deltanet_gates(be, a->dn_beta, a->dn_g, w->ssm_a, w->dt_bias, n, NV);
    struct delta_args da = {
        .x = a->dn_conv, .qk_stride = C, .v_stride = C, .q_off = 0, .k_off = key_dim, .v_off = 2 * key_dim,
        .g = a->dn_g, .beta = a->dn_beta, .out = a->dn_out, .state = ctx_state(cx, cx->delta_off[l]),
        .nk = d->n_k_heads, .nv = NV, .dk = d->k_dim, .dv = d->v_dim, .v_tiled = d->v_heads_tiled,
        .segs = f->b->rsegs, .n_segs = f->b->n_rsegs,
    };
    op_delta_rule(be, &da);
    op_rmsnorm_gated(be, a->dn_out, a->dn_out, a->dn_z, w->dn_norm, c->norm_eps, n * NV, d->v_dim);
    op_matmul(be, a->xn, a->dn_out, &w->w_out, NULL, f->rows);         /* xn = out W_out^T */
    lora_apply(f, l, LT_DN_OUT, a->xn, a->dn_out);
}
