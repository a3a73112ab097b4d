/* LFM2 gated short-convolution layers (transformers' Lfm2ShortConv): in_proj gives three
 * chunks of n_embd per token, [B | C | x]; Bx = B * x; a causal depthwise conv1d of
 * conv_L_cache taps over time, no activation, whose rolling state holds the last
 * conv_L_cache - 1 values of Bx; y = C * conv; out_proj. With conv_bias, in_proj, the conv
 * and out_proj add biases. */
#include "base/status.h"
#include "model/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

size_t shortconv_f32_floats(const struct model_config *c) {
    for (int l = 0; l < c->n_layer; l++)
        if (c->layer_kind[l] == LAYER_SHORTCONV)
            return (size_t)c->n_embd * c->sc.kernel + (c->sc.bias ? 5 * (size_t)c->n_embd : 0);
    return 0;
}

/* The depthwise kernel: one row of K taps per channel, stored [C, 1, K] (Hugging Face),
 * [C, K, 1] (MLX) or [C, K] (GGUF): the same order of elements in each. */
static gerbil_status check_kernel(struct binder *b, const char *name, int64_t C, int K) {
    const struct gb_tensor *t = wsrc_find(&b->m->src, name);
    if (!t) return GERBIL_OK; /* bind_vector names the missing tensor */
    int64_t rest = 1;
    int ok = t->n_dims >= 2 && t->n_dims <= 3 && t->ne[0] == C;
    for (int i = 1; i < t->n_dims; i++) {
        rest *= t->ne[i];
        ok &= t->ne[i] == K || t->ne[i] == 1;
    }
    if (ok && rest == K) return GERBIL_OK;
    char got[96] = "";
    int off = 0;
    for (int i = 0; i < t->n_dims && off < (int)sizeof got - 24; i++)
        off += snprintf(got + off, sizeof got - (size_t)off, "%s%lld", i ? ", " : "", (long long)t->ne[i]);
    return err_set(GERBIL_ERR_FORMAT, "tensor \"%s\": expected a depthwise conv kernel of shape [%lld, 1, %d] "
                   "(conv_L_cache %d), found [%s]", t->name, (long long)C, K, K, got);
}

gerbil_status shortconv_bind(struct binder *b, int l, struct layer_weights *w) {
    const struct model_config *c = &b->m->cfg;
    const int64_t D = c->n_embd;
    const int K = c->sc.kernel;
    char name[256];
#define NAME(fmt) (snprintf(name, sizeof name, "model.layers.%d.conv." fmt, l), name)
    GB_TRY(bind_matrix(b, NAME("in_proj.weight"), 3 * D, D, &w->w_sc_in));
    GB_TRY(bind_matrix(b, NAME("out_proj.weight"), D, D, &w->w_out));
    GB_TRY(check_kernel(b, NAME("conv.weight"), D, K));
    GB_TRY(bind_vector(b, name, D * K, 0, &w->conv_w));
    /* tap-major ([K][C]), the layout op_conv1d_causal reads along channels */
    float *tmp = malloc((size_t)(D * K) * sizeof *tmp), *cw = (float *)w->conv_w;
    if (!tmp) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    for (int64_t c = 0; c < D; c++)
        for (int j = 0; j < K; j++) tmp[(size_t)j * D + c] = cw[(size_t)c * K + j];
    memcpy(cw, tmp, (size_t)(D * K) * sizeof *tmp);
    free(tmp);
    if (c->sc.bias) {
        GB_TRY(bind_vector(b, NAME("in_proj.bias"), 3 * D, 0, &w->b_sc_in));
        GB_TRY(bind_vector(b, NAME("conv.bias"), D, 0, &w->b_conv));
        GB_TRY(bind_vector(b, NAME("out_proj.bias"), D, 0, &w->b_out));
    }
#undef NAME
    return GERBIL_OK;
}

void shortconv_forward(const struct fwd *f, int l) {
    const struct model_config *c = f->cfg;
    struct gerbil_context *cx = f->c;
    const struct layer_weights *w = &cx->model->layers[l];
    const struct act_bufs *a = &cx->a;
    struct backend *be = f->be;
    const int D = c->n_embd, n = f->n;
    const float *B = a->sc_in, *C = a->sc_in + D, *X = a->sc_in + 2 * D;

    op_matmul(be, a->sc_in, a->xn, &w->w_sc_in, w->b_sc_in, f->rows);      /* [B | C | x] */
    op_mul_rows(be, a->sc_bx, B, 3 * D, X, 3 * D, NULL, n, D);             /* Bx = B * x */
    op_conv1d(be, a->sc_conv, a->sc_bx, ctx_state(cx, cx->conv_off[l]), w->conv_w, D, c->sc.kernel, 0,
              f->b->rsegs, f->b->n_rsegs);
    op_mul_rows(be, a->sc_bx, C, 3 * D, a->sc_conv, D, w->b_conv, n, D);   /* y = C * (conv + bias) */
    op_matmul(be, a->xn, a->sc_bx, &w->w_out, w->b_out, f->rows);          /* xn = y W_out^T */
}
