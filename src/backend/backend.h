/* The backend interface: a table of functions that owns buffers and computes ops on
 * them. A model is loaded onto one backend (`cpu`: src/backend/cpu/; `ref`: the scalar
 * reference kernels, src/backend/ref/; `cuda`: src/backend/cuda/) and its code only holds handles
 * (pointers into backend memory it never dereferences) and calls the op_* wrappers
 * below. Weights are bound from the checkpoint and handed to the backend once
 * (weight_prepare); activations live in one arena per context, KV blocks in one pool,
 * recurrent state in slots, all allocated through the table.
 *
 * Activations are f32 row-major [n_rows][width]; outputs come first, shapes last.
 *
 * A forward works on a batch: rows from many sequences, grouped by sequence into
 * segments (struct gb_seg) in ascending order of their size. Per-row ops (matmul, norms,
 * RoPE, element-wise) treat rows independently; attention and the recurrent layers work
 * per segment over that sequence's own KV blocks and state slot.
 *
 * Batch invariance: a row's result never depends on the other rows of its batch. Every
 * kernel computes each output from its own row and weights in a fixed order; where a
 * backend has several methods for one weight (a per-token kernel and a GEMM that
 * unpacks weight panels once for many rows), it chooses by the row's span (the number
 * of rows of its own segment in this call, gb_rows.span), never by the call's size. */
#ifndef GB_BACKEND_H
#define GB_BACKEND_H

#include "gerbil.h"
#include "tensor/weight.h"

#include <stddef.h>
#include <stdint.h>

/* KV positions per block of the paged cache. 16 keeps the last partial block of a
 * sequence (and the copy-on-write of a forked one) small; attention reads a block's rows
 * through one pointer per position, so the block size does not change its speed. */
enum { KV_BLOCK = 16, KV_BLOCK_SHIFT = 4 };

/* The pool row that holds position p of a sequence with block table `blocks`. */
static inline int64_t kv_pool_row(const int32_t *blocks, int p) {
    return (int64_t)blocks[p >> KV_BLOCK_SHIFT] << KV_BLOCK_SHIFT | (p & (KV_BLOCK - 1));
}

/* One sequence's rows in a forward. */
struct gb_seg {
    int row0, n_rows;      /* the batch rows row0 .. row0 + n_rows - 1 */
    int pos0;              /* their KV positions pos0 .. pos0 + n_rows - 1 (the sequence held pos0) */
    const int32_t *blocks; /* its block table: position p in pool block blocks[p / KV_BLOCK] */
    int state;             /* its recurrent state slot */
    int rowwise;           /* (recurrent segments) rows given as single decodes: recurrent
                              layers take the token-by-token form, never a chunked one */
};

/* Which rows a matmul runs over and, for batch invariance, how each row's method is
 * chosen: span[t] = the rows of t's own segment in this call, non-decreasing in t
 * (NULL: every row's span is n). */
struct gb_rows {
    int n;
    const int32_t *span;
};

/* What the ops of one forward share. It and the arrays it points to are host memory, and
 * ops are handed those pointers (segs, tok, kv_row, pos, seg_of as freq): a backend whose
 * ops run elsewhere copies them in batch_begin and finds its copies by them. Every other
 * pointer an op gets is backend memory. Rows are grouped by segment, segments by ascending
 * n_rows. */
struct gb_batch {
    int n_rows, n_segs;
    const struct gb_seg *segs;  /* [n_segs] */
    const int32_t *span;        /* [n_rows] the n_rows of the row's segment */
    const int32_t *seg_of;      /* [n_rows] the row's segment */
    const int32_t *tok;         /* [n_rows] token id, or -1 for a row given as an embedding */
    const int32_t *kv_row;      /* [n_rows] the pool row its K and V go to */
    const int32_t *pos;         /* [n_rows] its RoPE position */
    /* The segments recurrent layers (conv1d, delta rule) run over: one per sequence. They
     * equal segs except where a sequence's rows are evaluated as single decodes
     * (gerbil_batch.verify): segs then has a segment of one row for each of them, at
     * positions pos0, pos0 + 1, ... (attention, spans, RoPE tables, experts see single
     * rows), and its recurrent segment is marked rowwise. */
    int n_rsegs;
    const struct gb_seg *rsegs;
};

static inline struct gb_rows batch_rows(const struct gb_batch *b) { return (struct gb_rows){b->n_rows, b->span}; }

/* A layer's recurrent state: the state of slot s starts at base + s * slot_floats. */
struct gb_state {
    float *base;
    size_t slot_floats;
};

/* Attention of a batch: for each segment, its rows' queries at positions pos0 .. against
 * its KV positions 0 .. pos0 + n_rows - 1 (this batch's keys and values already stored).
 * q: [n_rows][n_head][head_dim]; out: the same. k/v pool: pool row r's kv head h at
 * r * kv_stride + h * head_dim elements of kv_type (GB_TYPE_F16 or F32) from k_cache /
 * v_cache (the layer's rows of pool row 0). Query head h reads kv head h / (n_head /
 * n_head_kv); its scores are (q . k) * scale. window > 0: a query at position i sees keys j
 * with i - j < window. bidirectional: a query sees every key of its segment's sequence,
 * 0 .. pos0 + n_rows - 1 (window > 0: those with |i - j| < window). */
struct attn_args {
    const float *q;
    float *out;
    const void *k_cache, *v_cache;
    enum gb_type kv_type;
    int kv_stride;
    int n_head, n_head_kv, head_dim, window;
    int bidirectional;
    float scale;
    const struct gb_seg *segs;
    int n_segs;
};

/* The gated delta rule (Gated DeltaNet), per segment, per value head h (its query/key
 * head is h / (nv / nk), or h % nk when v_tiled) with state S [dk][dv] and, for each
 * of the segment's rows t in order,
 *   S = exp(g[t][h]) * S;  S += k (beta[t][h] * (v - S^T k))^T;  out = S^T q
 * q, k: rows of stride qk_stride ([nk][dk] at offsets q_off, k_off; q already
 * l2-normalised and scaled by dk^-1/2, k l2-normalised); v: stride v_stride at v_off,
 * [nv][dv]; g, beta: [n_rows][nv]; out: [n_rows][nv][dv]; the state of a segment: its
 * slot of `state`, [nv][dv][dk] (S transposed). A backend may compute a segment of more
 * than one row in the chunked (parallel) form over chunks of DELTA_CHUNK rows from the
 * segment's start, which gives the same values in another order (the CPU backend does; the
 * reference is the recurrence itself); a single row is the recurrent step. */
enum { DELTA_CHUNK = 64 };
struct delta_args {
    const float *x;
    int qk_stride, v_stride, q_off, k_off, v_off;
    const float *g, *beta;
    float *out;
    struct gb_state state;
    int nk, nv, dk, dv;
    int v_tiled;
    const struct gb_seg *segs;
    int n_segs;
};

enum gb_buf_flags {
    GB_BUF_ZERO = 1, /* zero-filled */
    GB_BUF_LAZY = 2, /* large and touched in order (the KV pool): memory only where written, huge pages */
};

/* What the forwards of a context will ask of the backend at most. */
struct gb_reserve {
    int n_rows;       /* rows per forward */
    int n_kv;         /* KV positions one segment's attention reads */
    int n_sel;        /* matrices matmul_id routes each row to (0: no matmul_id) */
    int delta_dk, delta_dv; /* head sizes of delta_rule (0: none) */
};

/* One segment of a LoRA op: the rows row0 .. row0 + n_rows - 1 of the call get
 *   y[t][:] += scale * (B (A x[t]))       A [rank][n_in], bt = B^T [rank][n_out], f32 (backend memory)
 * h = A x[t] first (rank sums over n_in), then each output's sum over rank in rank order,
 * times scale, added to y. B is kept transposed (mlx-lm's lora_b layout) so the second step
 * runs along the outputs. */
enum { LORA_MAX_RANK = 1024 };
struct lora_seg {
    int row0, n_rows, rank;
    float scale;
    const float *a, *bt;
};

struct backend;

struct backend_ops {
    const char *name;
    int host_memory; /* its buffers are host memory: results may be written straight into the caller's */
    void (*destroy)(struct backend *be);
    int (*n_threads)(const struct backend *be);

    /* ---- buffers (backend memory) ---- */
    void *(*alloc)(struct backend *be, size_t bytes, int flags);  /* NULL when out of memory */
    void (*buf_free)(struct backend *be, void *p, size_t bytes);
    void (*upload)(struct backend *be, void *dst, const void *src, size_t bytes);   /* host -> backend */
    void (*download)(struct backend *be, void *dst, const void *src, size_t bytes); /* backend -> host */
    void (*copy)(struct backend *be, void *dst, const void *src, size_t bytes); /* may overlap */
    void (*zero)(struct backend *be, void *dst, size_t bytes);
    void (*sync)(struct backend *be);

    /* ---- loading ---- */
    /* Matrices w[0 .. n) (a stack of one tensor, or one) are bound: the backend may
     * rearrange them in place once when `writable` (the loader's own copy) and sets
     * w[i].packed; it notes the scratch their matmuls need. */
    void (*weight_prepare)(struct backend *be, struct gb_weight *w, int64_t n, int writable);
    /* Scratch for the forwards described (the largest of all calls is kept; nothing is
     * allocated in a forward after this). */
    gerbil_status (*reserve)(struct backend *be, const struct gb_reserve *r);
    /* Called once per forward before its ops. */
    void (*batch_begin)(struct backend *be, const struct gb_batch *b);

    /* ---- ops ---- */
    /* y[t][:] = x[t][:] . W^T (+ bias) for the rows r (W [n_out][n_in] in any stored format;
     * bias f32 [n_out] or NULL). */
    void (*matmul)(struct backend *be, float *y, const float *x, const struct gb_weight *w, const float *bias,
                   struct gb_rows r);
    /* k (<= 4) matmuls with the same input x and n_in; the same results as k matmul calls. */
    void (*matmul_multi)(struct backend *be, int k, float *const *y, const float *x, const struct gb_weight *const *w,
                         const float *const *bias, struct gb_rows r);
    /* Mixture of experts: for each row t < n (the batch's rows, n = b->n_rows) and slot s <
     * n_sel, y[t][s][:] = x_t . W_e^T with e = ids[t][s] (W: the n_mat matrices of `stack`, all
     * of one shape), x_t = x[t] (x_per_slot 0) or x[t][s]; the rows routed to one expert are
     * computed together, each with the span of its own segment's rows routed there. */
    void (*matmul_id)(struct backend *be, float *y, const float *x, int x_per_slot, const struct gb_weight *stack,
                      int n_mat, const int32_t *ids, int n_sel, const struct gb_batch *b, int n);
    /* y[t][:] = row ids[t] of the table as f32 for t < n; rows with ids[t] < 0 are left alone. */
    void (*get_rows)(struct backend *be, float *y, const struct gb_weight *table, const int32_t *ids, int n);
    /* dst[t][:] = src[idx[t]][:] (width floats), t < n. */
    void (*gather_rows)(struct backend *be, float *dst, const float *src, const int32_t *idx, int n, int width);
    /* dst[i * d1 + j * d2 + k] = src[i * s1 + j * s2 + k] for i < n1, j < n2, k < width
     * (dst and src do not overlap). */
    void (*copy_strided)(struct backend *be, float *dst, int d1, int d2, const float *src, int s1, int s2, int n1,
                         int n2, int width);
    /* RMSNorm over rows of width n: y = x / sqrt(mean(x^2) + eps) * w (y may alias x). */
    void (*rmsnorm)(struct backend *be, float *y, const float *x, const float *w, float eps, int n_rows, int n);
    /* y = x / sqrt(mean(x^2) + eps) * w * silu(z). */
    void (*rmsnorm_gated)(struct backend *be, float *y, const float *x, const float *z, const float *w, float eps,
                          int n_rows, int n);
    /* x[t][h][:] = x / sqrt(sum(x^2) + eps) * scale for n_heads heads of width d at offset 0
     * of rows of stride `stride` floats (in place). */
    void (*l2norm_heads)(struct backend *be, float *x, int n_rows, int n_heads, int d, int stride, float eps,
                         float scale);
    /* y[i] = act(g[i]) * u[i], act = silu (gelu 0) or gelu_tanh (gelu 1); y may alias g. */
    void (*act_mul)(struct backend *be, float *y, const float *g, const float *u, long n, int gelu);
    void (*softcap)(struct backend *be, float *x, float cap, long n);     /* x = cap tanh(x / cap) */
    void (*scale)(struct backend *be, float *x, float s, long n);         /* x *= s */
    void (*add)(struct backend *be, float *y, const float *x, long n);    /* y += x */
    void (*sigmoid_mul)(struct backend *be, float *y, const float *x, const float *g, long n); /* y = x sigmoid(g) */
    /* y[t][i] = a[t * a_stride + i] * (b[t * b_stride + i] (+ bias[i])), t < n_rows, i < n. */
    void (*mul_rows)(struct backend *be, float *y, const float *a, int a_stride, const float *b, int b_stride,
                     const float *bias, int n_rows, int n);
    /* out[t][i] = a[t][i] + sigmoid(g[t]) * y[t][i] (Qwen3-Next's gated shared expert). */
    void (*gated_add_rows)(struct backend *be, float *out, const float *a, const float *y, const float *g, int n_rows,
                           int n);
    /* Rotary embedding of x [rows][n_heads][head_dim] in place: per head the first n_rot
     * dims, pairs (i, i + n_rot / 2) (interleaved: (2i, 2i + 1)) rotated by pos[t] *
     * inv_freq[f][i] with cos and sin times scale; f = freq[t] (freq NULL: 0); inv_freq
     * [*][n_rot / 2]. */
    void (*rope)(struct backend *be, float *x, const int32_t *pos, const int32_t *freq, const float *inv_freq,
                 float scale, int n_rows, int n_heads, int head_dim, int n_rot, int interleaved);
    /* Rows x [n][width] f32 into the cache (kv_type) as pool rows kv_row[t] of stride elements. */
    void (*kv_store)(struct backend *be, void *cache, enum gb_type kv_type, const float *x, const int32_t *kv_row,
                     int n, int width, int stride);
    void (*attention)(struct backend *be, const struct attn_args *a);
    /* Causal depthwise conv1d over each segment's rows, then SiLU when silu is set. x, y:
     * [n_rows][C] (y not aliasing x); w: [K][C] (tap-major); a segment's state (its slot
     * of `state`, [K-1][C]): the inputs of the K-1 steps before its rows (oldest first),
     * replaced by its last K-1 inputs. y[t][c] = act(sum_j w[j][c] in[t + j][c]) over
     * in = state ++ x, summed in j order. */
    void (*conv1d)(struct backend *be, float *y, const float *x, struct gb_state state, const float *w, int C, int K,
                   int silu, const struct gb_seg *segs, int n_segs);
    void (*delta_rule)(struct backend *be, const struct delta_args *a);
    /* Gated DeltaNet gates, in place: beta = sigmoid(beta), g = a[h] softplus(g + dt_bias[h])
     * for [n_rows][nv]. */
    void (*deltanet_gates)(struct backend *be, float *beta, float *g, const float *a, const float *dt_bias,
                           int n_rows, int nv);
    /* Router of a mixture of experts, per row of logits [n][n_expert]: probabilities p =
     * softmax (f32, the sum in index order); the k largest (ties: the lower index) into ids
     * [n][k] (descending p) and wsel [n][k] (renormalised to sum 1 when norm, the sum in pick
     * order). logits is overwritten. */
    void (*moe_route)(struct backend *be, int32_t *ids, float *wsel, float *logits, int n, int n_expert, int k,
                      int norm);
    /* out[t][:] = sum over s < k of wsel[t][s] y[t][s][:], from 0, added in ascending expert
     * id (equal ids in slot order), each term y * w. */
    void (*moe_combine)(struct backend *be, float *out, const float *y, const int32_t *ids, const float *wsel, int n,
                        int k, int width);

    /* LoRA after a linear (y: [rows][n_out], x: [rows][n_in] of the same call): the segments
     * (host memory, rank <= LORA_MAX_RANK) in list order, each as lora_seg says; rows of no
     * segment are left alone, several segments over one row add up in list order. A row's
     * result depends on its own x and its segments only (batch invariance). NULL: the backend
     * has no LoRA (adapters are refused at load). */
    void (*lora)(struct backend *be, float *y, const float *x, int n_in, int n_out, const struct lora_seg *segs,
                 int n_segs);

    /* ---- loading, continued ---- */
    /* The first failure of weight_prepare so far (a format the backend has no kernel for, a
     * device out of memory; the message set when it happened), else GERBIL_OK. NULL: the
     * backend's weight_prepare never fails. The loader asks after each tensor. */
    gerbil_status (*weight_status)(struct backend *be);

    /* ---- ops of the encoder-decoder speech models (Moonshine); NULL where a backend lacks
     * them (the model refuses to load there, naming the op) ---- */
    /* The columns of a 1-D convolution (a conv is then im2col1d + matmul with the weight
     * [C_out][C * K] as PyTorch stores it): x [T_in][C] time-major, kernel K, stride s,
     * col [T_out][C * K] with col[t][c * K + k] = x[t * s + k][c], T_out = (T_in - K) / s + 1. */
    void (*im2col1d)(struct backend *be, float *col, const float *x, int T_in, int C, int K, int stride);
    /* LayerNorm over rows of width n: y = (x - mean) / sqrt(var + eps) * w + b, var the
     * biased variance; w and b may each be NULL (1 and 0). y may alias x. */
    void (*layernorm)(struct backend *be, float *y, const float *x, const float *w, const float *b, float eps,
                      int n_rows, int n);
    /* GroupNorm of x [T][C] (C channels at T positions, time-major) in G groups of C / G
     * consecutive channels: statistics over all T positions of a group's channels, then
     * y[t][c] = (x - mean_g) / sqrt(var_g + eps) * w[c] + b[c]. y may alias x. */
    void (*groupnorm)(struct backend *be, float *y, const float *x, const float *w, const float *b, float eps, int T,
                      int C, int G);
    /* x = f(x) in place, f: GB_UNARY_TANH or GB_UNARY_GELU (the erf form, torch's default). */
    void (*unary)(struct backend *be, float *x, long n, int kind);
    /* Attention without a KV pool, every query over every key (the encoder's self-attention,
     * the decoder's cross-attention): q, out [n_q][n_head][hd]; k, v [n_kv][n_head_kv][hd];
     * query head h reads kv head h / (n_head / n_head_kv); scores (q . k) * scale, softmax
     * over the n_kv keys. scratch: attn_dense_floats(n_q, n_kv, hd) floats of backend memory. */
    void (*attention_dense)(struct backend *be, float *out, const float *q, const float *k, const float *v, int n_q,
                            int n_kv, int n_head, int n_head_kv, int hd, float scale, float *scratch);

    /* ---- ops of the audio codecs (DAC, dac.c); NULL where a backend lacks them (the codec
     * refuses to load there, naming the op) ---- */
    /* im2col1d with zero padding and dilation (a general conv1d is this + matmul with the
     * weight [C_out][C * K]): col[t][c * K + k] = x[t * s + k * d - pad][c], 0 outside [0, T_in);
     * T_out = (T_in + 2 pad - d (K - 1) - 1) / s + 1. Only rows t0 .. t0 + n - 1 are made, into
     * col[0 .. n) (a long conv runs in tiles of rows). */
    void (*im2col1d_pad)(struct backend *be, float *col, const float *x, int T_in, int C, int K, int stride,
                         int dilation, int pad, int t0, int n);
    /* The overlap-add of a transposed conv1d (a ConvTranspose1d is matmul x [T_in][C_in] by
     * the weight as [C * K][C_in], then this): y[j][c] = b[c] + sum over t, k with
     * t * s + k - pad = j of z[t][c * K + k], for j < T_out (T_out = (T_in - 1) s - 2 pad + K);
     * the sum runs over k ascending. b may be NULL. */
    void (*col2im1d)(struct backend *be, float *y, const float *z, const float *b, int T_in, int C, int K,
                     int stride, int pad, int T_out);
    /* Snake, in place on x [T][C]: x += 1 / (alpha[c] + 1e-9) * sin(alpha[c] * x)^2 (f32, as
     * torch computes it). */
    void (*snake)(struct backend *be, float *x, const float *alpha, int T, int C);
};

static inline size_t attn_dense_floats(int n_q, int n_kv, int hd) {
    return (size_t)n_q * hd * 2 + 2 * (size_t)n_kv * hd + (size_t)n_q * n_kv;
}

enum { GB_UNARY_TANH = 0, GB_UNARY_GELU = 1 };

struct backend {
    const struct backend_ops *ops;
};

/* A backend by name: "cpu", "ref", "cuda" or "cuda:N" (GPU N; builds with GERBIL_CUDA)
 * (NULL or "": the default, cpu). n_threads <= 0: the number of online CPUs.
 * GERBIL_ERR_UNSUPPORTED for an unknown name or a GPU that is not there. */
gerbil_status backend_new(const char *name, int n_threads, struct backend **out);
static inline void backend_free(struct backend *be) { if (be) be->ops->destroy(be); }

/* ---- what model code calls ---- */
static inline void op_matmul(struct backend *be, float *y, const float *x, const struct gb_weight *w,
                             const float *bias, struct gb_rows r) {
    be->ops->matmul(be, y, x, w, bias, r);
}
static inline void op_matmul_multi(struct backend *be, int k, float *const *y, const float *x,
                                   const struct gb_weight *const *w, const float *const *bias, struct gb_rows r) {
    be->ops->matmul_multi(be, k, y, x, w, bias, r);
}
static inline void op_matmul_id(struct backend *be, float *y, const float *x, int x_per_slot,
                                const struct gb_weight *stack, int n_mat, const int32_t *ids, int n_sel,
                                const struct gb_batch *b, int n) {
    be->ops->matmul_id(be, y, x, x_per_slot, stack, n_mat, ids, n_sel, b, n);
}
static inline void op_get_rows(struct backend *be, float *y, const struct gb_weight *e, const int32_t *ids, int n) {
    be->ops->get_rows(be, y, e, ids, n);
}
static inline void op_gather_rows(struct backend *be, float *dst, const float *src, const int32_t *idx, int n,
                                  int width) {
    be->ops->gather_rows(be, dst, src, idx, n, width);
}
static inline void op_copy_strided(struct backend *be, float *dst, int d1, int d2, const float *src, int s1, int s2,
                                   int n1, int n2, int width) {
    be->ops->copy_strided(be, dst, d1, d2, src, s1, s2, n1, n2, width);
}
static inline void op_rmsnorm(struct backend *be, float *y, const float *x, const float *w, float eps, int n_rows,
                              int n) {
    be->ops->rmsnorm(be, y, x, w, eps, n_rows, n);
}
static inline void op_rmsnorm_gated(struct backend *be, float *y, const float *x, const float *z, const float *w,
                                    float eps, int n_rows, int n) {
    be->ops->rmsnorm_gated(be, y, x, z, w, eps, n_rows, n);
}
static inline void op_l2norm_heads(struct backend *be, float *x, int n_rows, int n_heads, int d, int stride,
                                   float eps, float scale) {
    be->ops->l2norm_heads(be, x, n_rows, n_heads, d, stride, eps, scale);
}
static inline void op_silu_mul(struct backend *be, float *y, const float *g, const float *u, long n) {
    be->ops->act_mul(be, y, g, u, n, 0);
}
static inline void op_gelu_tanh_mul(struct backend *be, float *y, const float *g, const float *u, long n) {
    be->ops->act_mul(be, y, g, u, n, 1);
}
static inline void op_softcap(struct backend *be, float *x, float cap, long n) { be->ops->softcap(be, x, cap, n); }
static inline void op_scale(struct backend *be, float *x, float s, long n) { be->ops->scale(be, x, s, n); }
static inline void op_add(struct backend *be, float *y, const float *x, long n) { be->ops->add(be, y, x, n); }
static inline void op_sigmoid_mul(struct backend *be, float *y, const float *x, const float *g, long n) {
    be->ops->sigmoid_mul(be, y, x, g, n);
}
static inline void op_mul_rows(struct backend *be, float *y, const float *a, int a_stride, const float *b,
                               int b_stride, const float *bias, int n_rows, int n) {
    be->ops->mul_rows(be, y, a, a_stride, b, b_stride, bias, n_rows, n);
}
static inline void op_gated_add_rows(struct backend *be, float *out, const float *a, const float *y, const float *g,
                                     int n_rows, int n) {
    be->ops->gated_add_rows(be, out, a, y, g, n_rows, n);
}
static inline void op_rope(struct backend *be, float *x, const int32_t *pos, const int32_t *freq,
                           const float *inv_freq, float scale, int n_rows, int n_heads, int head_dim, int n_rot,
                           int interleaved) {
    be->ops->rope(be, x, pos, freq, inv_freq, scale, n_rows, n_heads, head_dim, n_rot, interleaved);
}
static inline void op_kv_store(struct backend *be, void *cache, enum gb_type kv_type, const float *x,
                               const int32_t *kv_row, int n, int width, int stride) {
    be->ops->kv_store(be, cache, kv_type, x, kv_row, n, width, stride);
}
static inline void op_attention(struct backend *be, const struct attn_args *a) { be->ops->attention(be, a); }
/* The keys the query at position p of segment s sees: [*lo, *hi]. */
static inline void attn_key_range(const struct attn_args *a, const struct gb_seg *s, int p, int *lo, int *hi) {
    *lo = a->window > 0 && p - a->window + 1 > 0 ? p - a->window + 1 : 0;
    *hi = p;
    if (a->bidirectional) {
        *hi = s->pos0 + s->n_rows - 1;
        if (a->window > 0 && p + a->window - 1 < *hi) *hi = p + a->window - 1;
    }
}
static inline void op_conv1d(struct backend *be, float *y, const float *x, struct gb_state state, const float *w,
                             int C, int K, int silu, const struct gb_seg *segs, int n_segs) {
    be->ops->conv1d(be, y, x, state, w, C, K, silu, segs, n_segs);
}
static inline void op_delta_rule(struct backend *be, const struct delta_args *a) { be->ops->delta_rule(be, a); }
static inline void op_deltanet_gates(struct backend *be, float *beta, float *g, const float *a, const float *dt_bias,
                                     int n_rows, int nv) {
    be->ops->deltanet_gates(be, beta, g, a, dt_bias, n_rows, nv);
}
static inline void op_moe_route(struct backend *be, int32_t *ids, float *wsel, float *logits, int n, int n_expert,
                                int k, int norm) {
    be->ops->moe_route(be, ids, wsel, logits, n, n_expert, k, norm);
}
static inline void op_moe_combine(struct backend *be, float *out, const float *y, const int32_t *ids,
                                  const float *wsel, int n, int k, int width) {
    be->ops->moe_combine(be, out, y, ids, wsel, n, k, width);
}

static inline void op_lora(struct backend *be, float *y, const float *x, int n_in, int n_out,
                           const struct lora_seg *segs, int n_segs) {
    if (n_segs > 0) be->ops->lora(be, y, x, n_in, n_out, segs, n_segs);
}
static inline void op_im2col1d(struct backend *be, float *col, const float *x, int T_in, int C, int K, int stride) {
    be->ops->im2col1d(be, col, x, T_in, C, K, stride);
}
static inline void op_layernorm(struct backend *be, float *y, const float *x, const float *w, const float *b,
                                float eps, int n_rows, int n) {
    be->ops->layernorm(be, y, x, w, b, eps, n_rows, n);
}
static inline void op_groupnorm(struct backend *be, float *y, const float *x, const float *w, const float *b,
                                float eps, int T, int C, int G) {
    be->ops->groupnorm(be, y, x, w, b, eps, T, C, G);
}
static inline void op_unary(struct backend *be, float *x, long n, int kind) { be->ops->unary(be, x, n, kind); }
static inline void op_attention_dense(struct backend *be, float *out, const float *q, const float *k, const float *v,
                                      int n_q, int n_kv, int n_head, int n_head_kv, int hd, float scale,
                                      float *scratch) {
    be->ops->attention_dense(be, out, q, k, v, n_q, n_kv, n_head, n_head_kv, hd, scale, scratch);
}

static inline void op_im2col1d_pad(struct backend *be, float *col, const float *x, int T_in, int C, int K,
                                   int stride, int dilation, int pad, int t0, int n) {
    be->ops->im2col1d_pad(be, col, x, T_in, C, K, stride, dilation, pad, t0, n);
}
static inline void op_col2im1d(struct backend *be, float *y, const float *z, const float *b, int T_in, int C, int K,
                               int stride, int pad, int T_out) {
    be->ops->col2im1d(be, y, z, b, T_in, C, K, stride, pad, T_out);
}
static inline void op_snake(struct backend *be, float *x, const float *alpha, int T, int C) {
    be->ops->snake(be, x, alpha, T, C);
}

#endif
