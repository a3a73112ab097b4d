/* The CPU backend: backend.h's table over host memory and this machine's cores. The
 * heavy lifting (matmul, the dot products of attention) is in kernels.c, qmatmul.c,
 * gemm_avx512.c and attn_avx512.c; this file holds the buffers, the scratch, the layout
 * and the threading of the per-row ops. recurrent.c and cpu_moe.c hold the rest. */
#include "backend/cpu/cpu.h"
#include "backend/cpu/attn_avx512.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/mlx_packed.h"
#include "backend/cpu/qmatmul_avx512.h" /* qmatmul_has_avx512: the CPU check for every *_avx512.c */
#include "backend/cpu/qmatmul_vnni.h"
#include "base/fp16.h"
#include "base/status.h"

#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/mman.h>

/* ---- buffers: host memory ---- */

/* Buffers from GB_BUF_LAZY on (the KV pool) are their own anonymous mapping in 2 MiB
 * transparent huge pages where the kernel allows them ("madvise"): each token's attention
 * reads a row per position and kv head, and with 4 KiB pages that was a TLB miss every
 * other position (Qwen3-0.6B MLX 4-bit, tg128, 1 thread, perf: attention 5.6-7.4% of the
 * decode profile -> 3.2-4.0%). Pages never written are never resident. The mappings are
 * listed so buf_free knows them from heap blocks. */
enum { LAZY_MIN = 1 << 20 };

static void *cpu_alloc(struct backend *be, size_t bytes, int flags) {
    struct cpu_backend *cb = cpu_of(be);
    if (bytes == 0) bytes = 1;
    if (flags & GB_BUF_LAZY && bytes >= LAZY_MIN) {
        pthread_mutex_lock(&cb->map_mu);
        void *p = NULL;
        if (cb->n_maps < CPU_MAX_MAPS) {
            p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (p == MAP_FAILED) p = NULL;
        }
        if (p) {
#ifdef MADV_HUGEPAGE
            madvise(p, bytes, MADV_HUGEPAGE);
#endif
            cb->maps[cb->n_maps++] = p; /* anonymous pages read as zeros */
        }
        pthread_mutex_unlock(&cb->map_mu);
        if (p) return p;
    }
    size_t n = (bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, n);
    if (p && flags & (GB_BUF_ZERO | GB_BUF_LAZY)) memset(p, 0, n);
    return p;
}

static void cpu_buf_free(struct backend *be, void *p, size_t bytes) {
    struct cpu_backend *cb = cpu_of(be);
    if (!p) return;
    pthread_mutex_lock(&cb->map_mu);
    for (int i = 0; i < cb->n_maps; i++)
        if (cb->maps[i] == p) {
            cb->maps[i] = cb->maps[--cb->n_maps];
            pthread_mutex_unlock(&cb->map_mu);
            munmap(p, bytes);
            return;
        }
    pthread_mutex_unlock(&cb->map_mu);
    free(p);
}

static void cpu_copy(struct backend *be, void *dst, const void *src, size_t n) {
    (void)be;
    if (n) memmove(dst, src, n);
}

static void cpu_zero(struct backend *be, void *dst, size_t n) {
    (void)be;
    if (n) memset(dst, 0, n);
}

static void cpu_nothing(struct backend *be) { (void)be; }
static void cpu_batch_begin(struct backend *be, const struct gb_batch *b) { (void)be; (void)b; }
static int cpu_n_threads(const struct backend *be) { return tp_n_threads(((const struct cpu_backend *)be)->tp); }

/* ---- loading ---- */

static int same_shape(const struct gb_weight *a, const struct gb_weight *b) {
    return a->kind == b->kind && a->type == b->type && a->n_in == b->n_in && a->bits == b->bits &&
           a->group_size == b->group_size && a->packed == b->packed;
}

/* Rearranges w where the kernels want it, notes its shape for reserve(), and gives it the
 * kernels of its shape (one plan per distinct format, n_in and layout: matmul_w_plan). */
static void cpu_weight_prepare(struct backend *be, struct gb_weight *w, int64_t n, int writable) {
    struct cpu_backend *cb = cpu_of(be);
    if (n <= 0) return;
    if (writable && !w[0].packed && qmatmul_wants_pack(&w[0]))
        for (int64_t i = 0; i < n; i++) qmatmul_pack(&w[i]);
    for (int64_t i = 0; i < n; i++) {
        if (w[i].n_in > cb->max_n_in) cb->max_n_in = w[i].n_in;
        if (w[i].n_out > cb->max_n_out) cb->max_n_out = w[i].n_out;
    }
    int k = 0;
    while (k < cb->n_shapes && !same_shape(&cb->shapes[k]->w, &w[0])) k++;
    if (k == cb->n_shapes) {
        struct cpu_shape *sh = malloc(sizeof *sh);
        if (cb->n_shapes == cb->cap_shapes) {
            int cap = cb->cap_shapes ? 2 * cb->cap_shapes : 16;
            struct cpu_shape **ns = realloc(cb->shapes, (size_t)cap * sizeof *ns);
            if (ns) {
                cb->shapes = ns;
                cb->cap_shapes = cap;
            }
        }
        GB_ASSERT(sh && cb->n_shapes < cb->cap_shapes); /* load-time, a few dozen bytes */
        sh->w = w[0];
        matmul_w_plan(&w[0], &sh->plan);
        cb->shapes[cb->n_shapes++] = sh;
    }
    for (int64_t i = 0; i < n; i++) w[i].plan = &cb->shapes[k]->plan;
}

/* *p: n_rows rows of *per bytes; grown (contents dropped) to rows of need bytes. -1: out of
 * memory (nothing changed). */
static int grow(void **p, size_t *per, size_t need, int n_rows) {
    if (need <= *per) return 0;
    void *q = aligned_alloc(64, (need * (size_t)n_rows + 63) & ~(size_t)63);
    if (!q) return -1;
    free(*p);
    *p = q;
    *per = need;
    return 0;
}

static gerbil_status cpu_reserve(struct backend *be, const struct gb_reserve *r) {
    struct cpu_backend *cb = cpu_of(be);
    int n_rows = r->n_rows > cb->reserved_rows ? r->n_rows : cb->reserved_rows;
    int n_kv = r->n_kv > cb->reserved_kv ? r->n_kv : cb->reserved_kv;
    int n_sel = r->n_sel > cb->reserved_sel ? r->n_sel : cb->reserved_sel;
    const int nth = tp_n_threads(cb->tp);
    const int id_rows = n_rows * (n_sel > 0 ? n_sel : 1);
    size_t work = 0;
    for (int i = 0; i < cb->n_shapes; i++) {
        size_t a = matmul_w_work_size(&cb->shapes[i]->w, id_rows > n_rows ? id_rows : n_rows);
        if (a > work) work = a;
    }
    const size_t delta = r->delta_dk > 0 ? delta_scratch_floats(r->delta_dk, r->delta_dv) : 0;
    size_t attn_bytes = cb->attn_floats * sizeof(float), delta_bytes = cb->delta_floats * sizeof(float);
    void *attn = cb->attn_scratch, *dscr = cb->delta_scratch;
    int bad = grow(&cb->work, &cb->work_size, work, 1) ||
              grow(&attn, &attn_bytes, (size_t)n_kv * sizeof(float), nth) ||
              grow(&dscr, &delta_bytes, delta * sizeof(float), nth);
    cb->attn_scratch = attn;
    cb->delta_scratch = dscr;
    cb->attn_floats = attn_bytes / sizeof(float);
    cb->delta_floats = delta_bytes / sizeof(float);
    /* the gathers grow with the rows and with the widest weight prepared so far */
    if (!bad && n_sel > 0 && ((size_t)id_rows > cb->id_rows_cap || cb->max_n_in > cb->id_n_in ||
                              cb->max_n_out > cb->id_n_out)) {
        size_t cap = (size_t)id_rows > cb->id_rows_cap ? (size_t)id_rows : cb->id_rows_cap;
        cb->id_n_in = cb->max_n_in;
        cb->id_n_out = cb->max_n_out;
        free(cb->id_x); free(cb->id_y); free(cb->id_rows); free(cb->id_span); free(cb->id_keys); free(cb->id_segs);
        cb->id_segs = malloc(cap * CPU_SEG_COUNT_BYTES);
        cb->id_x = malloc(cap * (size_t)cb->max_n_in * sizeof(float));
        cb->id_y = malloc(cap * (size_t)cb->max_n_out * sizeof(float));
        cb->id_rows = malloc(cap * sizeof(int32_t));
        cb->id_span = malloc(cap * sizeof(int32_t));
        cb->id_keys = malloc(cap * sizeof(int64_t));
        cb->id_rows_cap = cap;
        bad = !cb->id_x || !cb->id_y || !cb->id_rows || !cb->id_span || !cb->id_keys || !cb->id_segs;
        if (bad) cb->id_rows_cap = 0;
    }
    if (bad) return err_set(GERBIL_ERR_NOMEM, "out of memory reserving scratch for %d rows", n_rows);
    cb->reserved_rows = n_rows;
    cb->reserved_kv = n_kv;
    cb->reserved_sel = n_sel;
    return GERBIL_OK;
}

/* ---- matmul: the method per row by its span (backend.h: batch invariance) ---- */

/* y[t][:] += bias (NULL: nothing) for n_tok rows of n_out. */
static void add_bias(float *y, const float *bias, int n_tok, int n_out) {
    if (bias)
        for (int t = 0; t < n_tok; t++)
            for (int i = 0; i < n_out; i++) y[(size_t)t * n_out + i] += bias[i];
}

/* The first row whose span is at least min_span (rows before it take the per-token
 * method, the rest the method for many rows). */
static int span_split(struct gb_rows r, int min_span) {
    if (min_span == INT_MAX) return r.n;
    if (!r.span) return r.n >= min_span ? 0 : r.n;
    int lo = 0, hi = r.n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (r.span[mid] >= min_span) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

static void cpu_matmul(struct backend *be, float *y, const float *x, const struct gb_weight *w, const float *bias,
                       struct gb_rows r) {
    struct cpu_backend *cb = cpu_of(be);
    if (r.n <= 0) return;
    GB_ASSERT(matmul_w_work_size(w, r.n) <= cb->work_size);
    const int split = span_split(r, matmul_w_min_span(w));
    if (split > 0) matmul_w_method(cb->tp, y, x, w, split, cb->work, 0);
    if (split < r.n)
        matmul_w_method(cb->tp, y + (size_t)split * (size_t)w->n_out, x + (size_t)split * (size_t)w->n_in, w,
                        r.n - split, cb->work, 1);
    add_bias(y, bias, r.n, (int)w->n_out);
}

static void cpu_matmul_multi(struct backend *be, int k, float *const *y, const float *x,
                             const struct gb_weight *const *w, const float *const *bias, struct gb_rows r) {
    struct cpu_backend *cb = cpu_of(be);
    GB_ASSERT(k >= 1 && k <= 4);
    if (r.n <= 0) return;
    const int split = span_split(r, matmul_w_min_span(w[0]));
    int same = 1;
    for (int i = 1; i < k; i++) same &= span_split(r, matmul_w_min_span(w[i])) == split;
    if (!same) { /* the matrices' methods split the rows differently */
        for (int i = 0; i < k; i++) cpu_matmul(be, y[i], x, w[i], bias ? bias[i] : NULL, r);
        return;
    }
    GB_ASSERT(matmul_w_work_size(w[0], r.n) <= cb->work_size);
    for (int part = 0; part < 2; part++) { /* rows [0, split): per token; [split, n): many rows */
        const int t0 = part ? split : 0, nt = part ? r.n - split : split;
        if (nt <= 0) continue;
        float *ys[4];
        for (int i = 0; i < k; i++) ys[i] = y[i] + (size_t)t0 * (size_t)w[i]->n_out;
        const float *xs = x + (size_t)t0 * (size_t)w[0]->n_in;
        if (!matmul_w_multi_method(cb->tp, k, ys, xs, w, nt, cb->work, part))
            for (int i = 0; i < k; i++) matmul_w_method(cb->tp, ys[i], xs, w[i], nt, cb->work, part);
    }
    for (int i = 0; i < k; i++) add_bias(y[i], bias ? bias[i] : NULL, r.n, (int)w[i]->n_out);
}

/* ---- rows ---- */

static void cpu_get_rows(struct backend *be, float *y, const struct gb_weight *e, const int32_t *ids, int n) {
    (void)be;
    for (int t = 0; t < n; t++) {
        if (ids[t] < 0) continue;
        GB_ASSERT(ids[t] < e->n_out);
        cpu_weight_row(e, ids[t], y + (size_t)t * e->n_in);
    }
}

static void cpu_gather_rows(struct backend *be, float *dst, const float *src, const int32_t *idx, int n, int width) {
    (void)be;
    for (int t = 0; t < n; t++)
        memcpy(dst + (size_t)t * width, src + (size_t)idx[t] * width, (size_t)width * sizeof(float));
}

static void cpu_copy_strided(struct backend *be, float *dst, int d1, int d2, const float *src, int s1, int s2, int n1,
                             int n2, int width) {
    (void)be;
    for (int i = 0; i < n1; i++)
        for (int j = 0; j < n2; j++)
            memcpy(dst + (size_t)i * d1 + (size_t)j * d2, src + (size_t)i * s1 + (size_t)j * s2,
                   (size_t)width * sizeof(float));
}

/* ---- norms and element-wise ops ---- */

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

static void cpu_rmsnorm(struct backend *be, float *y, const float *x, const float *w, float eps, int n_rows, int n) {
    struct rms_args a = {.y = y, .x = x, .w = w, .eps = eps, .n = n};
    parallel_range(cpu_of(be), n_rows, n, rmsnorm_rows, &a);
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

static void cpu_act_mul(struct backend *be, float *y, const float *g, const float *u, long n, int gelu) {
    struct ew_args e = {.y = y, .a = g, .b = u, .fn = gelu ? gelu_tanh_mul : silu_mul};
    parallel_range(cpu_of(be), n, gelu ? 16 : 8, ew_range, &e);
}

struct cap_args {
    float *x;
    float c;
};

static void softcap_range(void *p, long lo, long hi) {
    const struct cap_args *a = p;
    softcap(a->x + lo, a->c, hi - lo);
}

static void cpu_softcap(struct backend *be, float *x, float cap, long n) {
    struct cap_args a = {.x = x, .c = cap};
    parallel_range(cpu_of(be), n, 16, softcap_range, &a);
}

static void scale_range(void *p, long lo, long hi) {
    const struct cap_args *a = p;
    for (long i = lo; i < hi; i++) a->x[i] *= a->c;
}

static void cpu_scale(struct backend *be, float *x, float s, long n) {
    struct cap_args a = {.x = x, .c = s};
    parallel_range(cpu_of(be), n, 1, scale_range, &a);
}

static void add_range(void *p, long lo, long hi) {
    const struct ew_args *e = p;
    for (long i = lo; i < hi; i++) e->y[i] += e->a[i];
}

static void cpu_add(struct backend *be, float *y, const float *x, long n) {
    struct ew_args e = {.y = y, .a = x};
    parallel_range(cpu_of(be), n, 1, add_range, &e);
}

/* ---- RoPE ---- */

struct rope_args {
    float *x;
    const int32_t *pos, *freq;
    const float *inv_freq;
    float scale;
    int n_heads, head_dim, n_rot, interleaved;
};

/* Rows lo .. hi - 1: cos and sin of pos * inv_freq[i] (the f32 product, as torch computes
 * it) times scale, then each head's pairs (v[lo], v[hi]): (i, i + half) in the
 * rotate-half layout, (2i, 2i + 1) interleaved. */
static void rope_range(void *p, long lo, long hi) {
    const struct rope_args *a = p;
    const int half = a->n_rot / 2;
    float cs[512], sn[512];
    GB_ASSERT(half <= 512);
    for (long t = lo; t < hi; t++) {
        const float *f = a->inv_freq + (a->freq ? (size_t)a->freq[t] * half : 0);
        for (int i = 0; i < half; i++) {
            float ang = (float)a->pos[t] * f[i];
            cs[i] = (float)cos((double)ang) * a->scale;
            sn[i] = (float)sin((double)ang) * a->scale;
        }
        for (int h = 0; h < a->n_heads; h++) {
            float *v = a->x + ((size_t)t * a->n_heads + h) * a->head_dim;
            for (int i = 0; i < half; i++) {
                const int l = a->interleaved ? 2 * i : i, r = a->interleaved ? 2 * i + 1 : i + half;
                float x0 = v[l], x1 = v[r];
                v[l] = x0 * cs[i] - x1 * sn[i];
                v[r] = x1 * cs[i] + x0 * sn[i];
            }
        }
    }
}

static void cpu_rope(struct backend *be, float *x, const int32_t *pos, const int32_t *freq, const float *inv_freq,
                     float scale, int n_rows, int n_heads, int head_dim, int n_rot, int interleaved) {
    struct rope_args a = {.x = x, .pos = pos, .freq = freq, .inv_freq = inv_freq, .scale = scale, .n_heads = n_heads,
                          .head_dim = head_dim, .n_rot = n_rot, .interleaved = interleaved};
    parallel_range(cpu_of(be), n_rows, (long)n_heads * n_rot, rope_range, &a);
}

/* ---- KV cache ---- */

struct kv_args {
    void *cache;
    const float *x;
    const int32_t *kv_row;
    enum gb_type kv_type;
    int width, stride;
};

static void kv_range(void *p, long lo, long hi) {
    const struct kv_args *a = p;
    for (long t = lo; t < hi; t++) {
        const float *x = a->x + (size_t)t * a->width;
        const size_t off = (size_t)a->kv_row[t] * a->stride;
        if (a->kv_type == GB_TYPE_F32) memcpy((float *)a->cache + off, x, (size_t)a->width * sizeof(float));
        else f32_to_f16_row((uint16_t *)a->cache + off, x, a->width);
    }
}

static void cpu_kv_store(struct backend *be, void *cache, enum gb_type kv_type, const float *x, const int32_t *kv_row,
                         int n, int width, int stride) {
    struct kv_args a = {.cache = cache, .x = x, .kv_row = kv_row, .kv_type = kv_type, .width = width, .stride = stride};
    parallel_range(cpu_of(be), n, width, kv_range, &a);
}

/* ---- attention ---- */

struct attn_job {
    const struct attn_args *a;
    float *scratch;
    size_t scratch_floats;
    _Atomic long next;
};

/* The segment holding batch row `row` (segments in row order). */
static int seg_of_row(const struct attn_args *a, int row) {
    int lo = 0, hi = a->n_segs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (a->segs[mid].row0 <= row) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* One (row, query head) pair per work item: scores, softmax, weighted sum of values. */
static void attention_worker(void *ctx, int ith, int nth) {
    const struct attn_job *j = ctx;
    const struct attn_args *a = j->a;
    const int group = a->n_head / a->n_head_kv, hd = a->head_dim, kv_stride = a->kv_stride;
    const int n_rows = a->segs[a->n_segs - 1].row0 + a->segs[a->n_segs - 1].n_rows;
    float *sc = j->scratch + (size_t)ith * j->scratch_floats;
    long lo, hi;
    tp_range((long)n_rows * a->n_head, ith, nth, &lo, &hi);
    int si = lo < hi ? seg_of_row(a, (int)(lo / a->n_head)) : 0;
    for (long item = lo; item < hi; item++) {
        const int t = (int)(item / a->n_head), h = (int)(item % a->n_head), kvh = h / group;
        while (t >= a->segs[si].row0 + a->segs[si].n_rows) si++;
        const struct gb_seg *s = &a->segs[si];
        const int pos = s->pos0 + (t - s->row0);
        int j0, j1;
        attn_key_range(a, s, pos, &j0, &j1);
        GB_ASSERT((size_t)j1 < j->scratch_floats);
        const float *q = a->q + ((size_t)t * a->n_head + h) * hd;
        float *out = a->out + ((size_t)t * a->n_head + h) * hd;
        float mx = -FLT_MAX;
        for (int jj = j0; jj <= j1; jj++) {
            size_t off = (size_t)kv_pool_row(s->blocks, jj) * kv_stride + (size_t)kvh * hd;
            float v = a->kv_type == GB_TYPE_F16 ? dot_f32_f16(q, (const uint16_t *)a->k_cache + off, hd)
                                                : dot_f32(q, (const float *)a->k_cache + off, hd);
            v *= a->scale;
            sc[jj] = v;
            if (v > mx) mx = v;
        }
        float sum = 0.0f;
        for (int jj = j0; jj <= j1; jj++) { sc[jj] = expf(sc[jj] - mx); sum += sc[jj]; }
        const float inv = 1.0f / sum;
        memset(out, 0, (size_t)hd * sizeof(float));
        for (int jj = j0; jj <= j1; jj++) {
            size_t off = (size_t)kv_pool_row(s->blocks, jj) * kv_stride + (size_t)kvh * hd;
            if (a->kv_type == GB_TYPE_F16) axpy_f16(out, sc[jj] * inv, (const uint16_t *)a->v_cache + off, hd);
            else axpy_f32(out, sc[jj] * inv, (const float *)a->v_cache + off, hd);
        }
    }
}

#ifdef GERBIL_HAVE_X86
/* AVX-512, f16 cache: items of attn512_tokens() rows of one segment x one kv head,
 * claimed one at a time (a thread on a slower CPU takes fewer: on these VMs one vCPU
 * often runs at 70% of the other's speed), kv head by kv head so a thread's keys and
 * values stay in its L2, and within one the largest segments' last rows (the most keys)
 * first so the light items come last. Dealt round-robin instead, a 512-token prompt's
 * attention (Qwen3-0.6B layer, 2 threads, same process) took 8.9 ms against 7.3. Each
 * item's results do not depend on which thread takes it, nor on the other segments. */
static void attention_worker512(void *ctx, int ith, int nth) {
    (void)ith;
    (void)nth;
    struct attn_job *j = ctx;
    const struct attn_args *a = j->a;
    const int tq = attn512_tokens(a->n_head / a->n_head_kv);
    long n_chunks = 0;
    for (int s = 0; s < a->n_segs; s++) n_chunks += (a->segs[s].n_rows + tq - 1) / tq;
    const long n_items = n_chunks * a->n_head_kv;
    for (;;) {
        long item = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (item >= n_items) return;
        long c = item % n_chunks; /* chunks counted from the last segment's last one */
        const int kvh = (int)(item / n_chunks);
        int s = a->n_segs - 1;
        for (;; s--) {
            long nc = (a->segs[s].n_rows + tq - 1) / tq;
            if (c < nc) break;
            c -= nc;
        }
        const struct gb_seg *sg = &a->segs[s];
        const int nc = (sg->n_rows + tq - 1) / tq, t0 = (int)(nc - 1 - c) * tq;
        attn_item_f16_avx512(a, sg, t0, sg->n_rows - t0 < tq ? sg->n_rows - t0 : tq, kvh);
    }
}
#endif

static void cpu_attention(struct backend *be, const struct attn_args *a) {
    struct cpu_backend *cb = cpu_of(be);
    struct attn_job j = {.a = a, .scratch = cb->attn_scratch, .scratch_floats = cb->attn_floats};
    atomic_init(&j.next, 0);
    if (a->n_segs <= 0) return;
#ifdef GERBIL_HAVE_X86
    if (attn512_fits(a) && qmatmul_has_avx512()) {
        tp_run(cb->tp, attention_worker512, &j);
        return;
    }
#endif
    tp_run(cb->tp, attention_worker, &j);
}

/* ---- the table ---- */

static void cpu_destroy(struct backend *be) {
    struct cpu_backend *cb = cpu_of(be);
    tp_free(cb->tp);
    GB_ASSERT(cb->n_maps == 0); /* no KV pool outlives its backend */
    pthread_mutex_destroy(&cb->map_mu);
    for (int i = 0; i < cb->n_shapes; i++) free(cb->shapes[i]);
    free(cb->shapes);
    free(cb->work);
    free(cb->attn_scratch);
    free(cb->delta_scratch);
    free(cb->id_x); free(cb->id_y); free(cb->id_rows); free(cb->id_span); free(cb->id_keys); free(cb->id_segs);
    free(cb);
}

static const struct backend_ops cpu_ops = {
    .name = "cpu",
    .host_memory = 1,
    .destroy = cpu_destroy,
    .n_threads = cpu_n_threads,
    .alloc = cpu_alloc,
    .buf_free = cpu_buf_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .copy = cpu_copy,
    .zero = cpu_zero,
    .sync = cpu_nothing,
    .weight_prepare = cpu_weight_prepare,
    .reserve = cpu_reserve,
    .batch_begin = cpu_batch_begin,
    .matmul = cpu_matmul,
    .matmul_multi = cpu_matmul_multi,
    .matmul_id = cpu_matmul_id,
    .get_rows = cpu_get_rows,
    .gather_rows = cpu_gather_rows,
    .copy_strided = cpu_copy_strided,
    .rmsnorm = cpu_rmsnorm,
    .rmsnorm_gated = cpu_rmsnorm_gated,
    .l2norm_heads = cpu_l2norm_heads,
    .act_mul = cpu_act_mul,
    .softcap = cpu_softcap,
    .scale = cpu_scale,
    .add = cpu_add,
    .sigmoid_mul = cpu_sigmoid_mul,
    .mul_rows = cpu_mul_rows,
    .gated_add_rows = cpu_gated_add_rows,
    .rope = cpu_rope,
    .kv_store = cpu_kv_store,
    .attention = cpu_attention,
    .conv1d = cpu_conv1d,
    .delta_rule = cpu_delta_rule,
    .deltanet_gates = cpu_deltanet_gates,
    .moe_route = cpu_moe_route,
    .moe_combine = cpu_moe_combine,
    .lora = cpu_lora,
    .im2col1d = cpu_im2col1d,
    .layernorm = cpu_layernorm,
    .groupnorm = cpu_groupnorm,
    .unary = cpu_unary,
    .attention_dense = cpu_attention_dense,
    .im2col1d_pad = cpu_im2col1d_pad,
    .col2im1d = cpu_col2im1d,
    .snake = cpu_snake,
};

/* GERBIL_CPU_ISA forces the kernels' instruction sets (process-wide: the switches tests
 * use): avx2 (AVX2/FMA/F16C alone, as on most laptops and AMD before Zen 4: neither the
 * AVX-512 kernels nor the 256-bit AVX512-VNNI ones), scalar (the reference kernels), or auto. */
static gerbil_status apply_isa_env(void) {
    const char *v = getenv("GERBIL_CPU_ISA");
    if (!v || !*v || !strcmp(v, "auto") || !strcmp(v, "avx512")) return GERBIL_OK;
    if (!strcmp(v, "avx2")) {
        qmatmul_disable_avx512(1);
        qmatmul_disable_vnni(1);
    }
    else if (!strcmp(v, "scalar")) cpu_force_ref(1);
    else return err_set(GERBIL_ERR_INVALID_ARG, "GERBIL_CPU_ISA=\"%s\": expected auto, avx512, avx2 or scalar", v);
    return GERBIL_OK;
}

gerbil_status backend_cpu_new(int n_threads, struct backend **out) {
    *out = NULL;
    GB_TRY(apply_isa_env());
    struct cpu_backend *cb = calloc(1, sizeof *cb);
    if (!cb) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    cb->base.ops = &cpu_ops;
    pthread_mutex_init(&cb->map_mu, NULL);
    cb->tp = tp_create(n_threads);
    if (!cb->tp) {
        pthread_mutex_destroy(&cb->map_mu);
        free(cb);
        return GERBIL_ERR_NOMEM; /* tp_create said why */
    }
    *out = &cb->base;
    return GERBIL_OK;
}
