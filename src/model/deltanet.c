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
static void fused_projections(struct gerbil_session *s, const struct layer_weights *w, int n) {
    const struct deltanet_config *d = &s->model->cfg.dn;
    const int nk = d->n_k_heads, dk = d->k_dim, r = d->n_v_heads / nk, rv = r * d->v_dim;
    const int C = conv_dim(d), VD = d->n_v_heads * d->v_dim, NV = d->n_v_heads, key_dim = nk * dk;
    const int W = C + VD, G = 2 * dk + 2 * rv;
    const int fused = d->fused_proj;
    if (fused & FUSED_QKVZ) {
        op_matmul(&s->be, s->dn_qkvz, s->xn, &w->w_qkvz, NULL, n);
    } else {
        op_matmul(&s->be, s->dn_in, s->xn, &w->w_qkv, NULL, n);
        op_matmul(&s->be, s->dn_z, s->xn, &w->w_z, NULL, n);
    }
    if (fused & FUSED_BA) {
        op_matmul(&s->be, s->dn_ba, s->xn, &w->w_ba, NULL, n);
    } else {
        op_matmul(&s->be, s->dn_beta, s->xn, &w->w_b, NULL, n);
        op_matmul(&s->be, s->dn_g, s->xn, &w->w_a, NULL, n);
    }
    for (int t = 0; t < n; t++) {
        float *in = s->dn_in + (size_t)t * C, *z = s->dn_z + (size_t)t * VD;
        for (int g = 0; g < nk; g++) {
            if (fused & FUSED_QKVZ) {
                const float *src = s->dn_qkvz + (size_t)t * W + (size_t)g * G;
                memcpy(in + g * dk, src, (size_t)dk * sizeof(float));
                memcpy(in + key_dim + g * dk, src + dk, (size_t)dk * sizeof(float));
                memcpy(in + 2 * key_dim + g * rv, src + 2 * dk, (size_t)rv * sizeof(float));
                memcpy(z + g * rv, src + 2 * dk + rv, (size_t)rv * sizeof(float));
            }
            if (fused & FUSED_BA) {
                const float *ba = s->dn_ba + (size_t)t * 2 * NV + (size_t)g * 2 * r;
                memcpy(s->dn_beta + (size_t)t * NV + g * r, ba, (size_t)r * sizeof(float));
                memcpy(s->dn_g + (size_t)t * NV + g * r, ba + r, (size_t)r * sizeof(float));
            }
        }
    }
}

static inline float softplusf(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

void deltanet_forward(struct gerbil_session *s, int l, int n) {
    const struct model_config *c = &s->model->cfg;
    const struct deltanet_config *d = &c->dn;
    const struct layer_weights *w = &s->model->layers[l];
    struct backend *be = &s->be;
    const int C = conv_dim(d), NV = d->n_v_heads, key_dim = d->n_k_heads * d->k_dim;

    if (d->fused_proj) {
        fused_projections(s, w, n);
    } else {
        op_matmul(be, s->dn_in, s->xn, &w->w_qkv, NULL, n);           /* [q | k | v] before the conv */
        op_matmul(be, s->dn_z, s->xn, &w->w_z, NULL, n);              /* output gate */
        op_matmul(be, s->dn_beta, s->xn, &w->w_b, NULL, n);
        op_matmul(be, s->dn_g, s->xn, &w->w_a, NULL, n);
    }
    op_conv1d_causal(be, s->dn_conv, s->dn_in, s->conv_state[l], w->conv_w, n, C, d->conv_kernel, 1);
    op_l2norm_heads(be, s->dn_conv, n, d->n_k_heads, d->k_dim, C, 1e-6f, 1.0f / sqrtf((float)d->k_dim));
    op_l2norm_heads(be, s->dn_conv + key_dim, n, d->n_k_heads, d->k_dim, C, 1e-6f, 1.0f);
    for (int t = 0; t < n; t++)
        for (int h = 0; h < NV; h++) {
            const size_t i = (size_t)t * NV + h;
            s->dn_beta[i] = 1.0f / (1.0f + expf(-s->dn_beta[i]));
            s->dn_g[i] = w->ssm_a[h] * softplusf(s->dn_g[i] + w->dt_bias[h]);
        }
    struct delta_args da = {
        .x = s->dn_conv, .qk_stride = C, .v_stride = C, .q_off = 0, .k_off = key_dim, .v_off = 2 * key_dim,
        .g = s->dn_g, .beta = s->dn_beta, .out = s->dn_out, .state = s->delta_state[l],
        .n_tok = n, .nk = d->n_k_heads, .nv = NV, .dk = d->k_dim, .dv = d->v_dim, .v_tiled = d->v_heads_tiled,
        .chunked = n > 1, .scratch = s->dn_scratch,
    };
    op_delta_rule(be, &da);
    op_rmsnorm_gated(be, s->dn_out, s->dn_out, s->dn_z, w->dn_norm, c->norm_eps, n * NV, d->v_dim);
    op_matmul(be, s->xn, s->dn_out, &w->w_out, NULL, n);              /* xn = out W_out^T */
}
