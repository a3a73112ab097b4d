/* CPU implementation of backend/ops.h. The heavy lifting (matmul, the dot products
 * of attention) is in kernels.c; this file does the layout and the threading. */
#include "backend/ops.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/parallel.h"
#include "backend/cpu/attn_avx512.h"
#include "backend/cpu/qmatmul_avx512.h" /* qmatmul_has_avx512: the CPU check for every *_avx512.c */
#include "base/fp16.h"
#include "base/status.h"

#include <float.h>
#include <math.h>
#include <stdatomic.h>
#include <string.h>

/* y[t][:] += bias (NULL: nothing) for n_tok rows of n_out. */
static void add_bias(float *y, const float *bias, int n_tok, int n_out) {
    if (bias)
        for (int t = 0; t < n_tok; t++)
            for (int i = 0; i < n_out; i++) y[(size_t)t * n_out + i] += bias[i];
}

void op_matmul(struct backend *be, float *y, const float *x, const struct gb_weight *w,
               const float *bias, int n_tok) {
    if (be->reference) {
        matmul_w_ref(y, x, w, n_tok);
    } else {
        GB_ASSERT(matmul_w_work_size(w, n_tok) <= be->work_size);
        matmul_w(be->tp, y, x, w, n_tok, be->work);
    }
    add_bias(y, bias, n_tok, (int)w->n_out);
}

void op_matmul_multi(struct backend *be, int k, float *const *y, const float *x, const struct gb_weight *const *w,
                     const float *const *bias, int n_tok) {
    if (!be->reference) {
        GB_ASSERT(matmul_w_work_size(w[0], n_tok) <= be->work_size);
        if (matmul_w_multi(be->tp, k, y, x, w, n_tok, be->work)) {
            for (int i = 0; i < k; i++) add_bias(y[i], bias ? bias[i] : NULL, n_tok, (int)w[i]->n_out);
            return;
        }
    }
    for (int i = 0; i < k; i++) op_matmul(be, y[i], x, w[i], bias ? bias[i] : NULL, n_tok);
}

size_t op_matmul_work_size(const struct gb_weight *w, int n_tok) { return matmul_w_work_size(w, n_tok); }

int op_weight_wants_pack(const struct gb_weight *w) { return qmatmul_wants_pack(w); }

void op_weight_pack(struct gb_weight *w) { qmatmul_pack(w); }

void op_get_rows(struct backend *be, float *y, const struct gb_weight *e, const int32_t *ids, int n_tok) {
    for (int t = 0; t < n_tok; t++) {
        GB_ASSERT(ids[t] >= 0 && ids[t] < e->n_out);
        weight_get_row(e, ids[t], y + (size_t)t * e->n_in);
    }
}

/* Element-wise work split over the pool in contiguous ranges; small ranges (decode)
 * run on the caller, where waking the workers would cost more than the work. Each
 * element is computed by exactly one thread, so results do not depend on the count. */
struct range_job {
    void (*fn)(void *ctx, long lo, long hi);
    void *ctx;
    long n;
};

static void range_worker(void *p, int ith, int nth) {
    const struct range_job *j = p;
    long lo, hi;
    tp_range(j->n, ith, nth, &lo, &hi);
    if (lo < hi) j->fn(j->ctx, lo, hi);
}

void parallel_range(struct backend *be, long n, long work_per_item, void (*fn)(void *, long, long), void *ctx) {
    struct range_job j = {.fn = fn, .ctx = ctx, .n = n};
    if (n * work_per_item < (1L << 15) || tp_n_threads(be->tp) == 1) fn(ctx, 0, n);
    else tp_run(be->tp, range_worker, &j);
}

struct rms_args {
    float *y;
    const float *x, *w;
    float eps;
    int n;
};

static void rmsnorm_rows(void *p, long lo, long hi) {
    const struct rms_args *a = p;
    for (long r = lo; r < hi; r++) {
        const float *xr = a->x + (size_t)r * a->n;
        float *yr = a->y + (size_t)r * a->n;
        double ss = sumsq_f32(xr, a->n);
        /* torch: x * rsqrt(mean(x^2) + eps) in f32, then * weight */
        float inv = 1.0f / sqrtf((float)(ss / a->n) + a->eps);
        for (int i = 0; i < a->n; i++) yr[i] = a->w[i] * (xr[i] * inv);
    }
}

void op_rmsnorm(struct backend *be, float *y, const float *x, const float *w, float eps, int n_rows, int n) {
    struct rms_args a = {.y = y, .x = x, .w = w, .eps = eps, .n = n};
    parallel_range(be, n_rows, n, rmsnorm_rows, &a);
}

/* y = fn(a, b) element-wise (silu_mul, gelu_tanh_mul), split over the pool. */
struct ew_args {
    float *y;
    const float *a, *b;
    void (*fn)(float *y, const float *a, const float *b, long n);
};

static void ew_range(void *p, long lo, long hi) {
    const struct ew_args *e = p;
    e->fn(e->y + lo, e->a + lo, e->b + lo, hi - lo);
}

void op_silu_mul(struct backend *be, float *y, const float *g, const float *u, long n) {
    struct ew_args e = {.y = y, .a = g, .b = u, .fn = silu_mul};
    parallel_range(be, n, 8, ew_range, &e);
}

void op_gelu_tanh_mul(struct backend *be, float *y, const float *g, const float *u, long n) {
    struct ew_args e = {.y = y, .a = g, .b = u, .fn = gelu_tanh_mul};
    parallel_range(be, n, 16, ew_range, &e);
}

struct cap_args {
    float *x;
    float c;
};

static void softcap_range(void *p, long lo, long hi) {
    const struct cap_args *a = p;
    softcap(a->x + lo, a->c, hi - lo);
}

void op_softcap(struct backend *be, float *x, float cap, long n) {
    struct cap_args a = {.x = x, .c = cap};
    parallel_range(be, n, 16, softcap_range, &a);
}

static void scale_range(void *p, long lo, long hi) {
    const struct cap_args *a = p;
    for (long i = lo; i < hi; i++) a->x[i] *= a->c;
}

void op_scale(struct backend *be, float *x, float s, long n) {
    struct cap_args a = {.x = x, .c = s};
    parallel_range(be, n, 1, scale_range, &a);
}

static void add_range(void *p, long lo, long hi) {
    const struct ew_args *e = p;
    for (long i = lo; i < hi; i++) e->y[i] += e->a[i];
}

void op_add(struct backend *be, float *y, const float *x, long n) {
    struct ew_args e = {.y = y, .a = x};
    parallel_range(be, n, 1, add_range, &e);
}

/* cos and sin of pos * inv_freq[i] (the f32 product, as torch computes it), times scale. */
static void rope_angles(int32_t pos, const float *inv_freq, float scale, int half, float *cs, float *sn) {
    for (int i = 0; i < half; i++) {
        float ang = (float)pos * inv_freq[i];
        cs[i] = (float)cos((double)ang) * scale;
        sn[i] = (float)sin((double)ang) * scale;
    }
}

/* Rotate pairs (v[lo], v[hi]): (i, i + half) in the rotate-half layout, (2i, 2i + 1) interleaved. */
static void rope_apply(float *x, const int32_t *pos, const float *inv_freq, float scale, int n_tok, int n_heads,
                       int head_dim, int n_rot, int interleaved) {
    const int half = n_rot / 2;
    float cs[512], sn[512];
    GB_ASSERT(half <= 512);
    for (int t = 0; t < n_tok; t++) {
        rope_angles(pos[t], inv_freq, scale, half, cs, sn);
        for (int h = 0; h < n_heads; h++) {
            float *v = x + ((size_t)t * n_heads + h) * head_dim;
            for (int i = 0; i < half; i++) {
                const int lo = interleaved ? 2 * i : i, hi = interleaved ? 2 * i + 1 : i + half;
                float a = v[lo], b = v[hi];
                v[lo] = a * cs[i] - b * sn[i];
                v[hi] = b * cs[i] + a * sn[i];
            }
        }
    }
}

struct rope_args {
    float *x;
    const int32_t *pos;
    const float *inv_freq;
    float scale;
    int n_heads, head_dim, n_rot, interleaved;
};

static void rope_range(void *p, long lo, long hi) { /* tokens lo .. hi - 1 */
    const struct rope_args *a = p;
    rope_apply(a->x + (size_t)lo * a->n_heads * a->head_dim, a->pos + lo, a->inv_freq, a->scale, (int)(hi - lo),
               a->n_heads, a->head_dim, a->n_rot, a->interleaved);
}

static void rope_tokens(struct backend *be, float *x, const int32_t *pos, const float *inv_freq, float scale, int n_tok,
                        int n_heads, int head_dim, int n_rot, int interleaved) {
    struct rope_args a = {.x = x, .pos = pos, .inv_freq = inv_freq, .scale = scale, .n_heads = n_heads,
                          .head_dim = head_dim, .n_rot = n_rot, .interleaved = interleaved};
    parallel_range(be, n_tok, (long)n_heads * n_rot, rope_range, &a);
}

void op_rope(struct backend *be, float *x, const int32_t *pos, const float *inv_freq, float scale, int n_tok,
             int n_heads, int head_dim, int n_rot) {
    rope_tokens(be, x, pos, inv_freq, scale, n_tok, n_heads, head_dim, n_rot, 0);
}

void op_rope_interleaved(struct backend *be, float *x, const int32_t *pos, const float *inv_freq, float scale,
                         int n_tok, int n_heads, int head_dim, int n_rot) {
    rope_tokens(be, x, pos, inv_freq, scale, n_tok, n_heads, head_dim, n_rot, 1);
}

struct kv_args {
    void *dst; /* the cache at row pos0 */
    const float *x;
    enum gb_type kv_type;
    int width, stride;
};

static void kv_range(void *p, long lo, long hi) { /* rows lo .. hi - 1 */
    const struct kv_args *a = p;
    for (long t = lo; t < hi; t++) {
        const float *x = a->x + (size_t)t * a->width;
        if (a->kv_type == GB_TYPE_F32) memcpy((float *)a->dst + (size_t)t * a->stride, x, (size_t)a->width * sizeof(float));
        else f32_to_f16_row((uint16_t *)a->dst + (size_t)t * a->stride, x, a->width);
    }
}

void op_kv_store(struct backend *be, void *cache, enum gb_type kv_type, const float *x, int pos0, int n_tok, int width,
                 int stride) {
    const size_t off = (size_t)pos0 * stride;
    struct kv_args a = {.dst = kv_type == GB_TYPE_F32 ? (void *)((float *)cache + off) : (void *)((uint16_t *)cache + off),
                        .x = x, .kv_type = kv_type, .width = width, .stride = stride};
    parallel_range(be, n_tok, width, kv_range, &a);
}

/* One (token, head) pair per work item: scores, softmax, weighted sum of values. */
static void attention_worker(void *ctx, int ith, int nth) {
    const struct attn_args *a = ctx;
    const int group = a->n_head / a->n_head_kv, hd = a->head_dim;
    const int kv_stride = a->kv_stride;
    float *sc = a->scratch + (size_t)ith * a->scratch_stride;
    long lo, hi;
    tp_range((long)a->n_tok * a->n_head, ith, nth, &lo, &hi);
    for (long item = lo; item < hi; item++) {
        const int t = (int)(item / a->n_head), h = (int)(item % a->n_head), kvh = h / group;
        const int pos = a->pos0 + t;
        const int j0 = (a->window > 0 && pos - a->window + 1 > 0) ? pos - a->window + 1 : 0;
        const float *q = a->q + ((size_t)t * a->n_head + h) * hd;
        float *out = a->out + ((size_t)t * a->n_head + h) * hd;
        float mx = -FLT_MAX;
        for (int j = j0; j <= pos; j++) {
            size_t off = (size_t)j * kv_stride + (size_t)kvh * hd;
            float s = a->kv_type == GB_TYPE_F16 ? dot_f32_f16(q, (const uint16_t *)a->k_cache + off, hd)
                                                : dot_f32(q, (const float *)a->k_cache + off, hd);
            s *= a->scale;
            sc[j] = s;
            if (s > mx) mx = s;
        }
        float sum = 0.0f;
        for (int j = j0; j <= pos; j++) { sc[j] = expf(sc[j] - mx); sum += sc[j]; }
        const float inv = 1.0f / sum;
        memset(out, 0, (size_t)hd * sizeof(float));
        for (int j = j0; j <= pos; j++) {
            size_t off = (size_t)j * kv_stride + (size_t)kvh * hd;
            if (a->kv_type == GB_TYPE_F16) axpy_f16(out, sc[j] * inv, (const uint16_t *)a->v_cache + off, hd);
            else axpy_f32(out, sc[j] * inv, (const float *)a->v_cache + off, hd);
        }
    }
}

#ifdef GERBIL_HAVE_X86
struct attn_job {
    const struct attn_args *a;
    _Atomic long next;
};

/* AVX-512, f16 cache: items of attn512_tokens() tokens x one kv head, claimed one at a
 * time (a thread on a slower CPU takes fewer: on these VMs one vCPU often runs at 70% of
 * the other's speed), kv head by kv head so a thread's keys and values stay in its L2,
 * and within one the last tokens (the most keys) first so the light items come last.
 * Dealt round-robin instead, a 512-token prompt's attention (Qwen3-0.6B layer, 2 threads,
 * same process) took 8.9 ms against 7.3. Each item's results do not depend on which
 * thread takes it. */
static void attention_worker512(void *ctx, int ith, int nth) {
    (void)ith;
    (void)nth;
    struct attn_job *j = ctx;
    const struct attn_args *a = j->a;
    const int tq = attn512_tokens(a->n_head / a->n_head_kv);
    const long n_chunks = (a->n_tok + tq - 1) / tq, n_items = n_chunks * a->n_head_kv;
    for (;;) {
        long item = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (item >= n_items) return;
        int t0 = (int)(n_chunks - 1 - item % n_chunks) * tq, kvh = (int)(item / n_chunks);
        attn_item_f16_avx512(a, t0, a->n_tok - t0 < tq ? a->n_tok - t0 : tq, kvh);
    }
}
#endif

void op_attention(struct backend *be, const struct attn_args *a) {
#ifdef GERBIL_HAVE_X86
    if (attn512_fits(a) && qmatmul_has_avx512()) {
        struct attn_job j = {.a = a};
        atomic_init(&j.next, 0);
        tp_run(be->tp, attention_worker512, &j);
        return;
    }
#endif
    tp_run(be->tp, attention_worker, (void *)a);
}
