/* The CPU backend (backend.h's table for this machine's cores: cpu_backend.c): a thread
 * pool of its own, host memory for every buffer, and the scratch its kernels need, sized by
 * reserve() from the weights it was given (weight_prepare) so a forward allocates nothing.
 * What its op files (cpu_backend.c, recurrent.c, cpu_moe.c) share; internal to
 * src/backend/cpu/. */
#ifndef GB_CPU_H
#define GB_CPU_H

#include "backend/backend.h"
#include "backend/cpu/kernels.h"
#include "base/threadpool.h"

#include <pthread.h>

enum { CPU_MAX_MAPS = 64, CPU_SEG_COUNT_BYTES = 12 };

/* A distinct (format, n_in, layout) among the weights prepared, and its kernels. */
struct cpu_shape {
    struct gb_weight w;
    struct mm_plan plan; /* chosen once (kernels.h); the weights of this shape point at it */
};

struct cpu_backend {
    struct backend base;
    threadpool_t *tp;
    /* matmul scratch (x quantized for the kernels), and what sizes it: one weight of
     * each distinct (format, n_in, group) the model has */
    void *work;
    size_t work_size;
    struct cpu_shape **shapes;
    int n_shapes, cap_shapes;
    int64_t max_n_in, max_n_out;
    /* attention: n_threads rows of attn_floats (the scalar path's scores) */
    float *attn_scratch;
    size_t attn_floats;
    /* delta rule: n_threads rows of delta_floats (grown on first use for a head size) */
    float *delta_scratch;
    size_t delta_floats;
    /* matmul_id: the entries by expert (id_keys), the rows routed to one, gathered (inputs,
     * outputs, entries, spans) */
    float *id_x, *id_y;
    int64_t *id_keys;
    int32_t *id_rows, *id_span;
    void *id_segs;          /* CPU_SEG_COUNT_BYTES per segment */
    size_t id_rows_cap;
    int64_t id_n_in, id_n_out; /* the widths id_x and id_y were sized for */
    int reserved_rows, reserved_kv, reserved_sel;
    /* buffers that are mappings of their own (GB_BUF_LAZY) */
    void *maps[CPU_MAX_MAPS];
    int n_maps;
    pthread_mutex_t map_mu;
};

static inline struct cpu_backend *cpu_of(struct backend *be) { return (struct cpu_backend *)be; }

/* n_threads <= 0: the online CPUs. GERBIL_CPU_ISA (auto, avx512, avx2, scalar) forces the
 * kernels' instruction sets for the process. */
gerbil_status backend_cpu_new(int n_threads, struct backend **out);

/* fn(ctx, lo, hi) over contiguous parts of [0, n); on the caller alone when
 * n * work_per_item is small (decode), where waking workers costs more than the work.
 * Each item is handled by exactly one thread, so results do not depend on the count. */
void parallel_range(struct cpu_backend *cb, long n, long work_per_item, void (*fn)(void *, long, long), void *ctx);

/* Ops defined in recurrent.c. */
void cpu_sigmoid_mul(struct backend *be, float *y, const float *x, const float *g, long n);
void cpu_mul_rows(struct backend *be, float *y, const float *a, int a_stride, const float *b, int b_stride,
                  const float *bias, int n_rows, int n);
void cpu_conv1d(struct backend *be, float *y, const float *x, struct gb_state state, const float *w, int C, int K,
                int silu, const struct gb_seg *segs, int n_segs);
void cpu_l2norm_heads(struct backend *be, float *x, int n_rows, int n_heads, int d, int stride, float eps,
                      float scale);
void cpu_rmsnorm_gated(struct backend *be, float *y, const float *x, const float *z, const float *w, float eps,
                       int n_rows, int n);
void cpu_delta_rule(struct backend *be, const struct delta_args *a);
void cpu_deltanet_gates(struct backend *be, float *beta, float *g, const float *a, const float *dt_bias, int n_rows,
                        int nv);
/* Ops of the speech models (cpu_speech.c). */
void cpu_im2col1d(struct backend *be, float *col, const float *x, int T_in, int C, int K, int stride);
void cpu_layernorm(struct backend *be, float *y, const float *x, const float *w, const float *b, float eps,
                   int n_rows, int n);
void cpu_groupnorm(struct backend *be, float *y, const float *x, const float *w, const float *b, float eps, int T,
                   int C, int G);
void cpu_unary(struct backend *be, float *x, long n, int kind);
void cpu_attention_dense(struct backend *be, float *out, const float *q, const float *k, const float *v, int n_q,
                         int n_kv, int n_head, int n_head_kv, int hd, float scale, float *scratch);
/* Ops of the audio codecs (cpu_codec.c). */
void cpu_im2col1d_pad(struct backend *be, float *col, const float *x, int T_in, int C, int K, int stride,
                      int dilation, int pad, int t0, int n);
void cpu_col2im1d(struct backend *be, float *y, const float *z, const float *b, int T_in, int C, int K, int stride,
                  int pad, int T_out);
void cpu_snake(struct backend *be, float *x, const float *alpha, int T, int C);
/* Floats of delta-rule scratch one thread needs for heads of dk x dv. */
size_t delta_scratch_floats(int dk, int dv);

/* Ops defined in cpu_moe.c. */
void cpu_matmul_id(struct backend *be, float *y, const float *x, int x_per_slot, const struct gb_weight *stack,
                   int n_mat, const int32_t *ids, int n_sel, const struct gb_batch *b, int n);
void cpu_moe_route(struct backend *be, int32_t *ids, float *wsel, float *logits, int n, int n_expert, int k, int norm);
void cpu_moe_combine(struct backend *be, float *out, const float *y, const int32_t *ids, const float *wsel, int n,
                     int k, int width);
void cpu_gated_add_rows(struct backend *be, float *out, const float *a, const float *y, const float *g, int n_rows,
                        int n);
/* cpu_lora.c */
void cpu_lora(struct backend *be, float *y, const float *x, int n_in, int n_out, const struct lora_seg *segs,
              int n_segs);

#endif
