/* Sparse mixture-of-experts feed-forward (Qwen3-Next "Qwen3NextSparseMoeBlock"):
 *   p = softmax(x W_router^T) in f32; the n_used most probable experts per token, their
 *   probabilities renormalised to sum 1 when norm_topk_prob;
 *   y = sum over the selected e of p_e * down_e(silu(gate_e x) * up_e x)
 *       + sigmoid(x w_shared_gate) * down_s(silu(gate_s x) * up_s x).
 * Each expert runs its matmuls once over the rows routed to it; experts are visited in
 * index order, as transformers accumulates them. Expert weights come per expert
 * (mlp.experts.E.{gate,up,down}_proj.weight: Hugging Face hub checkpoints), fused in
 * 3-D tensors (mlp.experts.gate_up_proj [E, 2I, D] and mlp.experts.down_proj [E, D, I]:
 * transformers 5 in memory) or stacked (mlp.switch_mlp.{gate,up,down}_proj.weight
 * [E, out, in]: mlx-lm conversions, quantized with [E, out, in / group] scales). */
#include "base/status.h"
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* n_mat matrices of one [n_mat][rows][cols] tensor, counted into the model's size. */
static gerbil_status bind_stack(struct binder *b, const char *name, int64_t n_mat, int64_t rows, int64_t cols,
                                struct gb_weight *out) {
    GB_TRY(wsrc_matrix_stack(&b->m->src, name, n_mat, rows, cols, out));
    for (int64_t i = 0; i < n_mat; i++) b->m->weight_bytes += weight_nbytes(&out[i]);
    b->m->n_params += n_mat * rows * cols;
    return GERBIL_OK;
}

gerbil_status moe_bind(struct binder *b, int l, struct layer_weights *w, struct gb_weight *experts) {
    const struct model_config *c = &b->m->cfg;
    const struct moe_config *m = &c->moe;
    const int64_t D = c->n_embd, E = m->n_expert, I = m->n_ff_exp, S = m->n_ff_shexp;
    char name[256];
#define NAME(fmt) (snprintf(name, sizeof name, "model.layers.%d.mlp." fmt, l), name)
#define EXPERT(e, proj) (snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%lld." proj ".weight", l, (long long)(e)), name)
    w->exp_gate = experts;
    w->exp_up = experts + E;
    w->exp_down = experts + 2 * E;
    GB_TRY(bind_matrix(b, NAME("gate.weight"), E, D, &w->w_router));
    GB_TRY(bind_matrix(b, NAME("shared_expert.gate_proj.weight"), S, D, &w->w_sh_gate));
    GB_TRY(bind_matrix(b, NAME("shared_expert.up_proj.weight"), S, D, &w->w_sh_up));
    GB_TRY(bind_matrix(b, NAME("shared_expert.down_proj.weight"), D, S, &w->w_sh_down));
    GB_TRY(bind_matrix(b, NAME("shared_expert_gate.weight"), 1, D, &w->w_sh_router));

    if (wsrc_find(&b->m->src, NAME("experts.0.gate_proj.weight"))) {
        for (int64_t e = 0; e < E; e++) {
            GB_TRY(bind_matrix(b, EXPERT(e, "gate_proj"), I, D, &w->exp_gate[e]));
            GB_TRY(bind_matrix(b, EXPERT(e, "up_proj"), I, D, &w->exp_up[e]));
            GB_TRY(bind_matrix(b, EXPERT(e, "down_proj"), D, I, &w->exp_down[e]));
        }
    } else if (wsrc_find(&b->m->src, NAME("experts.gate_up_proj"))) {
        /* each expert's [gate; up] rows: bind them whole, then split */
        GB_TRY(bind_stack(b, name, E, 2 * I, D, w->exp_gate));
        for (int64_t e = 0; e < E; e++) {
            w->exp_up[e] = weight_rows(&w->exp_gate[e], I, I);
            w->exp_gate[e] = weight_rows(&w->exp_gate[e], 0, I);
        }
        GB_TRY(bind_stack(b, NAME("experts.down_proj"), E, D, I, w->exp_down));
    } else if (wsrc_find(&b->m->src, NAME("switch_mlp.gate_proj.weight"))) {
        GB_TRY(bind_stack(b, name, E, I, D, w->exp_gate));
        GB_TRY(bind_stack(b, NAME("switch_mlp.up_proj.weight"), E, I, D, w->exp_up));
        GB_TRY(bind_stack(b, NAME("switch_mlp.down_proj.weight"), E, D, I, w->exp_down));
    } else if (b->m->src.is_gguf) {
        char gname[256];
        return err_set(GERBIL_ERR_FORMAT, "missing tensor \"%s\" (the experts of an MoE layer)",
                       wsrc_file_name(&b->m->src, NAME("switch_mlp.gate_proj.weight"), gname, sizeof gname));
    } else {
        char fused[256], mlx[256];
        snprintf(fused, sizeof fused, "model.layers.%d.mlp.experts.gate_up_proj", l);
        snprintf(mlx, sizeof mlx, "model.layers.%d.mlp.switch_mlp.gate_proj.weight", l);
        return err_set(GERBIL_ERR_FORMAT, "missing tensor \"%s\" (the experts of an MoE layer; also looked for "
                       "\"%s\" and \"%s\")", NAME("experts.0.gate_proj.weight"), fused, mlx);
    }
#undef NAME
#undef EXPERT
    return GERBIL_OK;
}

/* Softmax over the n_expert router logits of each token, then its n_used largest
 * probabilities (ties: the lower index) and their weights. */
static void route(struct gerbil_session *s, int n) {
    const struct moe_config *m = &s->model->cfg.moe;
    const int E = m->n_expert, K = m->n_used;
    for (int t = 0; t < n; t++) {
        float *p = s->moe_prob + (size_t)t * E;
        float mx = p[0], sum = 0.0f;
        for (int e = 1; e < E; e++) mx = p[e] > mx ? p[e] : mx;
        for (int e = 0; e < E; e++) {
            p[e] = expf(p[e] - mx);
            sum += p[e];
        }
        for (int e = 0; e < E; e++) p[e] /= sum;
        int32_t *sel = s->moe_sel + (size_t)t * K;
        float *wsel = s->moe_wsel + (size_t)t * K, wsum = 0.0f;
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int e = 0; e < E; e++)
                if (p[e] != -1.0f && (best < 0 || p[e] > p[best])) best = e;
            sel[k] = best;
            wsel[k] = p[best];
            wsum += p[best];
            p[best] = -1.0f; /* taken */
        }
        if (m->norm_topk_prob)
            for (int k = 0; k < K; k++) wsel[k] /= wsum;
    }
}

void moe_forward(struct gerbil_session *s, int l, int n) {
    const struct model_config *c = &s->model->cfg;
    const struct moe_config *m = &c->moe;
    const struct layer_weights *w = &s->model->layers[l];
    struct backend *be = &s->be;
    const int D = c->n_embd, E = m->n_expert, K = m->n_used;
    const size_t row = (size_t)D * sizeof(float);

    op_matmul(be, s->moe_prob, s->xn, &w->w_router, NULL, n);         /* router logits */
    route(s, n);
    memset(s->moe_acc, 0, (size_t)n * row);
    for (int e = 0; e < E; e++) {
        int cnt = 0;                                                  /* the rows routed to e */
        for (int t = 0; t < n; t++)
            for (int k = 0; k < K; k++)
                if (s->moe_sel[(size_t)t * K + k] == e) {
                    s->moe_rows[cnt] = t;
                    s->moe_rw[cnt] = s->moe_wsel[(size_t)t * K + k];
                    memcpy(s->moe_x + (size_t)cnt * D, s->xn + (size_t)t * D, row);
                    cnt++;
                }
        if (!cnt) continue;
        op_matmul(be, s->gate, s->moe_x, &w->exp_gate[e], NULL, cnt);
        op_matmul(be, s->up, s->moe_x, &w->exp_up[e], NULL, cnt);
        op_silu_mul(be, s->gate, s->gate, s->up, (long)cnt * m->n_ff_exp);
        op_matmul(be, s->moe_y, s->gate, &w->exp_down[e], NULL, cnt);
        for (int i = 0; i < cnt; i++) {
            float *acc = s->moe_acc + (size_t)s->moe_rows[i] * D;
            const float *y = s->moe_y + (size_t)i * D, rw = s->moe_rw[i];
            for (int j = 0; j < D; j++) acc[j] += y[j] * rw;
        }
    }
    /* the shared expert, gated per token */
    op_matmul(be, s->gate, s->xn, &w->w_sh_gate, NULL, n);
    op_matmul(be, s->up, s->xn, &w->w_sh_up, NULL, n);
    op_silu_mul(be, s->gate, s->gate, s->up, (long)n * m->n_ff_shexp);
    op_matmul(be, s->moe_y, s->gate, &w->w_sh_down, NULL, n);
    op_matmul(be, s->moe_shg, s->xn, &w->w_sh_router, NULL, n);
    for (int t = 0; t < n; t++) {
        const float g = 1.0f / (1.0f + expf(-s->moe_shg[t]));
        const float *acc = s->moe_acc + (size_t)t * D, *y = s->moe_y + (size_t)t * D;
        float *out = s->xn + (size_t)t * D;
        for (int j = 0; j < D; j++) out[j] = acc[j] + g * y[j];
    }
}
