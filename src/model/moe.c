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

void moe_forward(const struct fwd *f, int l) {
    const struct model_config *c = f->cfg;
    const struct moe_config *m = &c->moe;
    const struct layer_weights *w = &f->c->model->layers[l];
    const struct act_bufs *a = &f->c->a;
    struct backend *be = f->be;
    const int n = f->n, D = c->n_embd, E = m->n_expert, K = m->n_used;

    op_matmul(be, a->moe_prob, a->xn, &w->w_router, NULL, f->rows);   /* router logits */
    op_moe_route(be, a->moe_sel, a->moe_wsel, a->moe_prob, n, E, K, m->norm_topk_prob);
    /* each row through its K experts (rows routed to one expert together) */
    op_matmul_id(be, a->moe_gate, a->xn, 0, w->exp_gate, E, a->moe_sel, K, f->b, n);
    op_matmul_id(be, a->moe_up, a->xn, 0, w->exp_up, E, a->moe_sel, K, f->b, n);
    op_silu_mul(be, a->moe_gate, a->moe_gate, a->moe_up, (long)n * K * m->n_ff_exp);
    op_matmul_id(be, a->moe_y, a->moe_gate, 1, w->exp_down, E, a->moe_sel, K, f->b, n);
    op_moe_combine(be, a->moe_acc, a->moe_y, a->moe_sel, a->moe_wsel, n, K, D);
    /* the shared expert, gated per token */
    op_matmul(be, a->gate, a->xn, &w->w_sh_gate, NULL, f->rows);
    op_matmul(be, a->up, a->xn, &w->w_sh_up, NULL, f->rows);
    op_silu_mul(be, a->gate, a->gate, a->up, (long)n * m->n_ff_shexp);
    op_matmul(be, a->moe_shy, a->gate, &w->w_sh_down, NULL, f->rows);
    op_matmul(be, a->moe_shg, a->xn, &w->w_sh_router, NULL, f->rows);
    op_gated_add_rows(be, a->xn, a->moe_acc, a->moe_shy, a->moe_shg, n, D);
}
