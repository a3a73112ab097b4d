/* The op interface models are written against. Today one implementation: the CPU
 * (src/backend/cpu/). Activations are f32 row-major [n_tok][width]; weights are
 * gb_tensor views read in place; outputs come first, shapes last. */
#ifndef GB_OPS_H
#define GB_OPS_H

#include "base/threadpool.h"
#include "tensor/tensor.h"
#include "tensor/weight.h"

#include <stdint.h>

struct backend {
    threadpool_t *tp;
    void *work;          /* scratch for quantized matmuls (x quantized to 8-bit blocks) */
    size_t work_size;
    int reference;       /* matmuls through matmul_w_ref (checking numerics) */
};

/* y[t][:] = x[t][:] . W^T (+ bias); W is [n_out][n_in] in any stored format
 * (tensor/weight.h); bias f32 [n_out] or NULL. */
void op_matmul(struct backend *be, float *y, const float *x, const struct gb_weight *w,
               const float *bias, int n_tok);
/* op_matmul for k (<= 4) weights with the same input x and n_in (y[i], w[i], bias[i]; bias
 * may be NULL or hold NULLs): one pass over the thread pool where matmul_w_multi has a
 * fused path, else k op_matmul calls; the same results either way. */
void op_matmul_multi(struct backend *be, int k, float *const *y, const float *x, const struct gb_weight *const *w,
                     const float *const *bias, int n_tok);
/* Whether this machine's matmul reads w faster rearranged in place (the same bytes, moved
 * within groups of 4 rows; w->packed records it), and the rearrangement: w's data must be
 * writable and not yet shared with another weight. */
int op_weight_wants_pack(const struct gb_weight *w);
void op_weight_pack(struct gb_weight *w);
/* Scratch op_matmul needs for w with up to n_tok rows. */
size_t op_matmul_work_size(const struct gb_weight *w, int n_tok);
/* y[t][:] = rows ids[t] of the embedding table E [n_vocab][n_embd] as f32. */
void op_get_rows(struct backend *be, float *y, const struct gb_weight *e, const int32_t *ids, int n_tok);
/* RMSNorm over rows of width n: y = x / sqrt(mean(x^2) + eps) * w. y may alias x. */
void op_rmsnorm(struct backend *be, float *y, const float *x, const float *w, float eps, int n_rows, int n);
/* y[i] = silu(g[i]) * u[i]. */
void op_silu_mul(struct backend *be, float *y, const float *g, const float *u, long n);
/* y[i] = gelu_tanh(g[i]) * u[i], gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
 * (torch's gelu with approximate="tanh"). */
void op_gelu_tanh_mul(struct backend *be, float *y, const float *g, const float *u, long n);
/* x[i] = cap * tanh(x[i] / cap) (logit soft-capping). */
void op_softcap(struct backend *be, float *x, float cap, long n);
/* x[i] *= s. */
void op_scale(struct backend *be, float *x, float s, long n);
/* y[i] += x[i]. */
void op_add(struct backend *be, float *y, const float *x, long n);

/* Rotate (x[2i'], ...) halves, HF "rotate_half" layout: for each head of x
 * ([n_tok][n_heads][head_dim]), the first n_rot dims are split into halves
 * (a, b) = (x[:n_rot/2], x[n_rot/2:n_rot]) and become
 * (a cos - b sin, b cos + a sin) with angle pos[t] * inv_freq[i]; cos and sin are
 * multiplied by scale. */
void op_rope(struct backend *be, float *x, const int32_t *pos, const float *inv_freq, float scale, int n_tok,
             int n_heads, int head_dim, int n_rot);
/* The same rotation over adjacent pairs (x[2i], x[2i+1]) (GPT-J / llama.cpp "norm"
 * layout), for checkpoints whose q/k rows were permuted to it. */
void op_rope_interleaved(struct backend *be, float *x, const int32_t *pos, const float *inv_freq, float scale,
                         int n_tok, int n_heads, int head_dim, int n_rot);

/* Causal attention of n_tok queries at positions pos0 .. pos0+n_tok-1 against the
 * cache rows 0 .. pos0+n_tok-1 (already holding this batch's keys and values).
 * q: [n_tok][n_head][head_dim]; out: same shape. k/v cache: [n_ctx][n_head_kv][head_dim]
 * of kv_type (GB_TYPE_F16 or F32). Query head h reads kv head h / (n_head / n_head_kv).
 * window > 0: a query at position i sees keys j with i - j < window.
 * scratch: n_threads * n_ctx floats. */
struct attn_args {
    const float *q;
    float *out;
    const void *k_cache, *v_cache; /* position j's row of kv head h at j * kv_stride + h * head_dim */
    enum gb_type kv_type;
    int n_tok, pos0, n_head, n_head_kv, head_dim, window;
    int kv_stride;                 /* elements from one position's row to the next (>= n_head_kv * head_dim) */
    float scale;
    float *scratch;
    int scratch_stride;
};
void op_attention(struct backend *be, const struct attn_args *a);

/* Store rows [n_tok][width] of f32 into the cache (f16 or f32) as rows pos0.. of stride
 * elements each. */
void op_kv_store(struct backend *be, void *cache, enum gb_type kv_type, const float *x, int pos0, int n_tok, int width,
                 int stride);

/* ---- recurrent layers (src/backend/cpu/recurrent.c) ---- */

/* y[i] = x[i] * sigmoid(g[i]) (y may alias x). */
void op_sigmoid_mul(struct backend *be, float *y, const float *x, const float *g, long n);
/* Causal depthwise conv1d over time, then SiLU when silu is set. x, y: [n_tok][C]
 * (y must not alias x); w: [K][C] (tap-major: the checkpoint's [C][K] transposed);
 * state: [K-1][C], the inputs of the K-1 steps before x (oldest first, zeros at the
 * start of a sequence), replaced by the last K-1 inputs.
 * y[t][c] = act(sum_j w[j][c] * in[t + j][c]) over in = state ++ x, summed in j order. */
void op_conv1d_causal(struct backend *be, float *y, const float *x, float *state, const float *w,
                      int n_tok, int C, int K, int silu);
/* Gating product over strided rows: y[t][i] = a[t * a_stride + i] * (b[t * b_stride + i]
 * (+ bias[i] when bias is not NULL)) for t < n_rows, i < n; y: [n_rows][n], not aliasing
 * a or b (LFM2 short convolution: B * x, and C * (conv + conv bias)). */
void op_mul_rows(struct backend *be, float *y, const float *a, int a_stride, const float *b, int b_stride,
                 const float *bias, int n_rows, int n);
/* x[t][h][:] = x[t][h][:] / sqrt(sum(x^2) + eps) * scale for n_heads heads of width d
 * at offset 0 of rows of stride `stride` floats (in place). */
void op_l2norm_heads(struct backend *be, float *x, int n_tok, int n_heads, int d, int stride, float eps,
                     float scale);
/* Gated RMSNorm over rows of width n: y = x / sqrt(mean(x^2) + eps) * w * silu(z). */
void op_rmsnorm_gated(struct backend *be, float *y, const float *x, const float *z, const float *w, float eps,
                      int n_rows, int n);

/* The gated delta rule (Gated DeltaNet). Per value head h (its query/key head is
 * h / (nv / nk)) with state S [dk][dv] and, for each token t in order,
 *   S = exp(g[t][h]) * S;  S += k (beta[t][h] * (v - S^T k))^T;  out = S^T q
 * q, k: rows of stride qk_stride ([nk][dk] at offsets q_off, k_off; q already
 * l2-normalised and scaled by dk^-1/2, k l2-normalised); v: stride v_stride at
 * v_off, [nv][dv]; g, beta: [n_tok][nv]; out: [n_tok][nv][dv]; state: [nv][dv][dk]
 * (S transposed), updated (v_tiled: key head h % nk). chunked: the chunked (parallel) form over chunks of DELTA_CHUNK tokens,
 * which computes the same values in another order (prefill); else token by token. */
enum { DELTA_CHUNK = 64 };
struct delta_args {
    const float *x;            /* the conv output holding q, k, v */
    int qk_stride, v_stride, q_off, k_off, v_off;
    const float *g, *beta;
    float *out;
    float *state;
    int n_tok, nk, nv, dk, dv;
    int v_tiled;               /* value head h reads key head h % nk (else h / (nv / nk)) */
    int chunked;
    float *scratch;            /* delta_scratch_floats(dk, dv) per thread */
};
size_t delta_scratch_floats(int dk, int dv);
void op_delta_rule(struct backend *be, const struct delta_args *a);

#endif
