/* The reference backend (ref_backend.h): host buffers and backend.h's ops as their
 * definitions, one element at a time, sums in double where an op sums. Nothing here is
 * tuned; where the order of float operations is part of an op's meaning (the norms,
 * the conv taps, the MoE sums) it follows the order the header and torch use, so the
 * fast backends can be held to it. */
#include "backend/ref/ref_backend.h"
#include "backend/cpu/kernels.h"
#include "base/fp16.h"
#include "base/status.h"
#include "tensor/weight.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct ref_backend {
    struct backend base;
};

static inline float ref_sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }
static inline float ref_silu(float v) { return v / (1.0f + expf(-v)); }

/* malloc that aborts: the reference takes its scratch per call (reserve holds none). */
static void *ref_xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    GB_ASSERT(p != NULL);
    return p;
}

static void ref_destroy(struct backend *be) { free(be); }

static int ref_n_threads(const struct backend *be) { return 1; }

/* ---- buffers: host memory ---- */

static void *ref_alloc(struct backend *be, size_t bytes, int flags) {
    /* aligned_alloc wants a size that is a multiple of the alignment (and not 0) */
    size_t n = (bytes + 63) / 64 * 64;
    if (n < bytes) return NULL;
    void *p = aligned_alloc(64, n ? n : 64);
    if (p && (flags & GB_BUF_ZERO)) memset(p, 0, n);
    return p;
}

static void ref_buf_free(struct backend *be, void *p, size_t bytes) { free(p); }

static void ref_upload(struct backend *be, void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }
static void ref_download(struct backend *be, void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }
static void ref_copy(struct backend *be, void *dst, const void *src, size_t bytes) { memmove(dst, src, bytes); }
static void ref_zero(struct backend *be, void *dst, size_t bytes) { memset(dst, 0, bytes); }
static void ref_sync(struct backend *be) {}

/* ---- loading: weights are read as they are stored; scratch is taken per call ---- */

static void ref_weight_prepare(struct backend *be, struct gb_weight *w, int64_t n, int writable) {}

static gerbil_status ref_reserve(struct backend *be, const struct gb_reserve *r) {
    (void)be;
    (void)r;
    return GERBIL_OK;
}

static void ref_batch_begin(struct backend *be, const struct gb_batch *b) {}

/* ---- matmuls ---- */

/* Every row the same way (matmul_w_ref: dequantized rows, sums in double), so the spans
 * that choose a fast backend's method change nothing here. */
static void ref_matmul(struct backend *be, float *y, const float *x, const struct gb_weight *w, const float *bias,
                       struct gb_rows r) {
    matmul_w_ref(y, x, w, r.n);
    if (bias)
        for (int t = 0; t < r.n; t++)
            for (int64_t o = 0; o < w->n_out; o++) y[(size_t)t * (size_t)w->n_out + (size_t)o] += bias[o];
}

static void ref_matmul_multi(struct backend *be, int k, float *const *y, const float *x,
                             const struct gb_weight *const *w, const float *const *bias, struct gb_rows r) {
    for (int i = 0; i < k; i++) ref_matmul(be, y[i], x, w[i], bias ? bias[i] : NULL, r);
}

static void ref_matmul_id(struct backend *be, float *y, const float *x, int x_per_slot,
                          const struct gb_weight *stack, int n_mat, const int32_t *ids, int n_sel,
                          const struct gb_batch *b, int n) {
    const size_t n_in = (size_t)stack[0].n_in, n_out = (size_t)stack[0].n_out;
    for (int t = 0; t < n; t++)
        for (int s = 0; s < n_sel; s++) {
            const size_t ts = (size_t)t * (size_t)n_sel + (size_t)s;
            const int32_t e = ids[ts];
            GB_ASSERT(e >= 0 && e < n_mat);
            GB_ASSERT((size_t)stack[e].n_in == n_in && (size_t)stack[e].n_out == n_out);
            matmul_w_ref(y + ts * n_out, x + (x_per_slot ? ts : (size_t)t) * n_in, &stack[e], 1);
        }
}

/* ---- rows ---- */

static void ref_get_rows(struct backend *be, float *y, const struct gb_weight *table, const int32_t *ids, int n) {
    for (int t = 0; t < n; t++)
        if (ids[t] >= 0) weight_get_row(table, ids[t], y + (size_t)t * (size_t)table->n_in);
}

static void ref_gather_rows(struct backend *be, float *dst, const float *src, const int32_t *idx, int n, int width) {
    for (int t = 0; t < n; t++)
        for (int i = 0; i < width; i++) dst[(size_t)t * width + i] = src[(size_t)idx[t] * width + i];
}

static void ref_copy_strided(struct backend *be, float *dst, int d1, int d2, const float *src, int s1, int s2,
                             int n1, int n2, int width) {
    for (int i = 0; i < n1; i++)
        for (int j = 0; j < n2; j++)
            for (int k = 0; k < width; k++)
                dst[(int64_t)i * d1 + (int64_t)j * d2 + k] = src[(int64_t)i * s1 + (int64_t)j * s2 + k];
}

/* ---- norms ---- */

/* torch's order: x * rsqrt(mean(x^2) + eps) in f32, then times the weight (the mean
 * from a sum in double). */
static float rms_inv(const float *x, int n, float eps) {
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    return 1.0f / sqrtf((float)(ss / n) + eps);
}

static void ref_rmsnorm(struct backend *be, float *y, const float *x, const float *w, float eps, int n_rows, int n) {
    for (int r = 0; r < n_rows; r++) {
        const float *xr = x + (size_t)r * n;
        float *yr = y + (size_t)r * n;
        const float inv = rms_inv(xr, n, eps);
        for (int i = 0; i < n; i++) yr[i] = w[i] * (xr[i] * inv);
    }
}

static void ref_rmsnorm_gated(struct backend *be, float *y, const float *x, const float *z, const float *w,
                              float eps, int n_rows, int n) {
    for (int r = 0; r < n_rows; r++) {
        const float *xr = x + (size_t)r * n, *zr = z + (size_t)r * n;
        float *yr = y + (size_t)r * n;
        const float inv = rms_inv(xr, n, eps);
        for (int i = 0; i < n; i++) yr[i] = w[i] * (xr[i] * inv) * ref_silu(zr[i]);
    }
}

/* The sum in float, as transformers' l2norm computes it (the keys and queries of a
 * delta-rule layer). */
static void ref_l2norm_heads(struct backend *be, float *x, int n_rows, int n_heads, int d, int stride, float eps,
                             float scale) {
    for (int t = 0; t < n_rows; t++)
        for (int h = 0; h < n_heads; h++) {
            float *v = x + (size_t)t * stride + (size_t)h * d;
            float ss = 0.0f;
            for (int i = 0; i < d; i++) ss += v[i] * v[i];
            const float inv = 1.0f / sqrtf(ss + eps);
            for (int i = 0; i < d; i++) v[i] = v[i] * inv * scale;
        }
}

/* ---- element-wise ---- */

static void ref_act_mul(struct backend *be, float *y, const float *g, const float *u, long n, int gelu) {
    if (gelu) gelu_tanh_mul_ref(y, g, u, n);
    else silu_mul_ref(y, g, u, n);
}

static void ref_softcap(struct backend *be, float *x, float cap, long n) { softcap_ref(x, cap, n); }

static void ref_scale(struct backend *be, float *x, float s, long n) {
    for (long i = 0; i < n; i++) x[i] *= s;
}

static void ref_add(struct backend *be, float *y, const float *x, long n) {
    for (long i = 0; i < n; i++) y[i] += x[i];
}

static void ref_sigmoid_mul(struct backend *be, float *y, const float *x, const float *g, long n) {
    for (long i = 0; i < n; i++) y[i] = x[i] * ref_sigmoid(g[i]);
}

static void ref_mul_rows(struct backend *be, float *y, const float *a, int a_stride, const float *b, int b_stride,
                         const float *bias, int n_rows, int n) {
    for (int t = 0; t < n_rows; t++) {
        const float *at = a + (size_t)t * a_stride, *bt = b + (size_t)t * b_stride;
        float *yt = y + (size_t)t * n;
        for (int i = 0; i < n; i++) yt[i] = at[i] * (bias ? bt[i] + bias[i] : bt[i]);
    }
}

static void ref_gated_add_rows(struct backend *be, float *out, const float *a, const float *y, const float *g,
                               int n_rows, int n) {
    for (int t = 0; t < n_rows; t++) {
        const float sg = ref_sigmoid(g[t]);
        for (int i = 0; i < n; i++) {
            const size_t k = (size_t)t * n + i;
            out[k] = a[k] + sg * y[k];
        }
    }
}

/* The angle is the f32 product pos * inv_freq, as torch forms it; only cos and sin are
 * taken in double. */
static void ref_rope(struct backend *be, float *x, const int32_t *pos, const int32_t *freq, const float *inv_freq,
                     float scale, int n_rows, int n_heads, int head_dim, int n_rot, int interleaved) {
    const int half = n_rot / 2;
    for (int t = 0; t < n_rows; t++) {
        const float *f = inv_freq + (size_t)(freq ? freq[t] : 0) * half;
        for (int h = 0; h < n_heads; h++) {
            float *v = x + ((size_t)t * n_heads + h) * head_dim;
            for (int i = 0; i < half; i++) {
                const float ang = (float)pos[t] * f[i];
                const float c = (float)cos((double)ang) * scale, s = (float)sin((double)ang) * scale;
                const int lo = interleaved ? 2 * i : i, hi = interleaved ? 2 * i + 1 : i + half;
                const float a = v[lo], b = v[hi];
                v[lo] = a * c - b * s;
                v[hi] = b * c + a * s;
            }
        }
    }
}

/* ---- the paged KV cache and attention ---- */

static void ref_kv_store(struct backend *be, void *cache, enum gb_type kv_type, const float *x,
                         const int32_t *kv_row, int n, int width, int stride) {
    GB_ASSERT(kv_type == GB_TYPE_F32 || kv_type == GB_TYPE_F16);
    for (int t = 0; t < n; t++) {
        const size_t off = (size_t)kv_row[t] * (size_t)stride;
        const float *xt = x + (size_t)t * width;
        for (int i = 0; i < width; i++) {
            if (kv_type == GB_TYPE_F32) ((float *)cache)[off + i] = xt[i];
            else ((uint16_t *)cache)[off + i] = f32_to_f16(xt[i]);
        }
    }
}

/* Element i of a cache of type t. */
static inline double kv_at(const void *cache, enum gb_type t, size_t i) {
    return t == GB_TYPE_F16 ? f16_to_f32(((const uint16_t *)cache)[i]) : ((const float *)cache)[i];
}

/* Two passes over the keys: the scores and their maximum, then exp(s - max) as the
 * weights of the values, normalised by their sum at the end. */
static void ref_attention(struct backend *be, const struct attn_args *a) {
    GB_ASSERT(a->kv_type == GB_TYPE_F32 || a->kv_type == GB_TYPE_F16);
    GB_ASSERT(a->n_head_kv > 0 && a->n_head % a->n_head_kv == 0);
    const int group = a->n_head / a->n_head_kv, hd = a->head_dim;
    int n_kv = 1;
    for (int s = 0; s < a->n_segs; s++)
        if (a->segs[s].pos0 + a->segs[s].n_rows > n_kv) n_kv = a->segs[s].pos0 + a->segs[s].n_rows;
    double *sc = ref_xmalloc((size_t)n_kv * sizeof *sc);
    for (int s = 0; s < a->n_segs; s++) {
        const struct gb_seg *seg = &a->segs[s];
        for (int i = 0; i < seg->n_rows; i++) {
            const int p = seg->pos0 + i, row = seg->row0 + i;
            int j0, j1;
            attn_key_range(a, seg, p, &j0, &j1);
            for (int h = 0; h < a->n_head; h++) {
                const size_t kv_off = (size_t)(h / group) * hd;
                const float *q = a->q + ((size_t)row * a->n_head + h) * hd;
                float *out = a->out + ((size_t)row * a->n_head + h) * hd;
                double mx = -DBL_MAX, sum = 0.0;
                for (int j = j0; j <= j1; j++) {
                    const size_t off = (size_t)kv_pool_row(seg->blocks, j) * (size_t)a->kv_stride + kv_off;
                    double d = 0.0;
                    for (int c = 0; c < hd; c++) d += (double)q[c] * kv_at(a->k_cache, a->kv_type, off + c);
                    sc[j] = d * a->scale;
                    if (sc[j] > mx) mx = sc[j];
                }
                for (int j = j0; j <= j1; j++) {
                    sc[j] = exp(sc[j] - mx);
                    sum += sc[j];
                }
                for (int c = 0; c < hd; c++) {
                    double acc = 0.0;
                    for (int j = j0; j <= j1; j++) {
                        const size_t off = (size_t)kv_pool_row(seg->blocks, j) * (size_t)a->kv_stride + kv_off;
                        acc += sc[j] * kv_at(a->v_cache, a->kv_type, off + c);
                    }
                    out[c] = (float)(acc / sum);
                }
            }
        }
    }
    free(sc);
}

/* ---- recurrent layers ---- */

/* Over in = state ++ x laid out as one array: the taps then never ask where a row came
 * from, and a segment shorter than K - 1 rows keeps part of its old state for free. */
static void ref_conv1d(struct backend *be, float *y, const float *x, struct gb_state state, const float *w, int C,
                       int K, int silu, const struct gb_seg *segs, int n_segs) {
    GB_ASSERT(K >= 1 && y != x);
    const size_t hist = (size_t)(K - 1) * C;
    for (int s = 0; s < n_segs; s++) {
        const struct gb_seg *seg = &segs[s];
        float *st = state.base + (size_t)seg->state * state.slot_floats;
        const size_t n = (size_t)seg->n_rows * C;
        float *in = ref_xmalloc((hist + n) * sizeof *in);
        memcpy(in, st, hist * sizeof *in);
        memcpy(in + hist, x + (size_t)seg->row0 * C, n * sizeof *in);
        for (int t = 0; t < seg->n_rows; t++) {
            float *yt = y + (size_t)(seg->row0 + t) * C;
            for (int c = 0; c < C; c++) {
                float acc = w[c] * in[(size_t)t * C + c];
                for (int j = 1; j < K; j++) acc += w[(size_t)j * C + c] * in[(size_t)(t + j) * C + c];
                yt[c] = silu ? ref_silu(acc) : acc;
            }
        }
        memcpy(st, in + n, hist * sizeof *in);
        free(in);
    }
}

/* The recurrent form for every segment, whatever its length (the chunked form is a
 * fast backend's reordering of these same sums). The state is S transposed: row j of
 * a head's [dv][dk] is what value channel j reads from the keys, so each step is, per
 * j: decay the row, take the residual of v_j against row . k, add it along k, read
 * row . q. */
static void ref_delta_rule(struct backend *be, const struct delta_args *a) {
    GB_ASSERT(a->nk > 0 && a->nv % a->nk == 0);
    const int dk = a->dk, dv = a->dv;
    for (int s = 0; s < a->n_segs; s++) {
        const struct gb_seg *seg = &a->segs[s];
        float *slot = a->state.base + (size_t)seg->state * a->state.slot_floats;
        for (int h = 0; h < a->nv; h++) {
            const int kh = a->v_tiled ? h % a->nk : h / (a->nv / a->nk);
            float *St = slot + (size_t)h * dv * dk;
            for (int t = 0; t < seg->n_rows; t++) {
                const size_t r = (size_t)(seg->row0 + t);
                const float *q = a->x + r * a->qk_stride + a->q_off + (size_t)kh * dk;
                const float *k = a->x + r * a->qk_stride + a->k_off + (size_t)kh * dk;
                const float *v = a->x + r * a->v_stride + a->v_off + (size_t)h * dv;
                const float decay = expf(a->g[r * a->nv + h]), beta = a->beta[r * a->nv + h];
                float *out = a->out + (r * a->nv + h) * dv;
                for (int j = 0; j < dv; j++) {
                    float *row = St + (size_t)j * dk;
                    double kv = 0.0, o = 0.0;
                    for (int i = 0; i < dk; i++) {
                        row[i] *= decay;
                        kv += (double)row[i] * k[i];
                    }
                    const float delta = (float)((v[j] - kv) * beta);
                    for (int i = 0; i < dk; i++) {
                        row[i] += delta * k[i];
                        o += (double)row[i] * q[i];
                    }
                    out[j] = (float)o;
                }
            }
        }
    }
}

static inline float softplusf(float v) { return v > 20.0f ? v : log1pf(expf(v)); }

static void ref_deltanet_gates(struct backend *be, float *beta, float *g, const float *a, const float *dt_bias,
                               int n_rows, int nv) {
    for (int t = 0; t < n_rows; t++)
        for (int h = 0; h < nv; h++) {
            const size_t i = (size_t)t * nv + h;
            beta[i] = ref_sigmoid(beta[i]);
            g[i] = a[h] * softplusf(g[i] + dt_bias[h]);
        }
}

/* ---- mixture of experts ---- */

static void ref_moe_route(struct backend *be, int32_t *ids, float *wsel, float *logits, int n, int n_expert, int k,
                          int norm) {
    GB_ASSERT(k >= 1 && k <= n_expert);
    unsigned char *taken = ref_xmalloc((size_t)n_expert);
    for (int t = 0; t < n; t++) {
        float *p = logits + (size_t)t * n_expert;
        float mx = p[0], sum = 0.0f;
        for (int e = 1; e < n_expert; e++) mx = p[e] > mx ? p[e] : mx;
        for (int e = 0; e < n_expert; e++) {
            p[e] = expf(p[e] - mx);
            sum += p[e];
        }
        for (int e = 0; e < n_expert; e++) p[e] /= sum;
        memset(taken, 0, (size_t)n_expert);
        int32_t *it = ids + (size_t)t * k;
        float *wt = wsel + (size_t)t * k, wsum = 0.0f;
        for (int s = 0; s < k; s++) {
            int best = -1; /* strictly larger replaces: the lower index wins a tie */
            for (int e = 0; e < n_expert; e++)
                if (!taken[e] && (best < 0 || p[e] > p[best])) best = e;
            taken[best] = 1;
            it[s] = best;
            wt[s] = p[best];
            wsum += p[best];
        }
        if (norm)
            for (int s = 0; s < k; s++) wt[s] /= wsum;
    }
    free(taken);
}

/* In ascending expert id (a stable order, so equal ids keep their slot order): the
 * order transformers visits the experts in, which fixes the rounding of the sum. */
static void ref_moe_combine(struct backend *be, float *out, const float *y, const int32_t *ids, const float *wsel,
                            int n, int k, int width) {
    int *ord = ref_xmalloc((size_t)k * sizeof *ord);
    for (int t = 0; t < n; t++) {
        const int32_t *it = ids + (size_t)t * k;
        for (int s = 0; s < k; s++) { /* insertion sort of the slots by id */
            int i = s;
            for (; i > 0 && it[ord[i - 1]] > it[s]; i--) ord[i] = ord[i - 1];
            ord[i] = s;
        }
        float *o = out + (size_t)t * width;
        for (int j = 0; j < width; j++) o[j] = 0.0f;
        for (int i = 0; i < k; i++) {
            const int s = ord[i];
            const float w = wsel[(size_t)t * k + s], *ys = y + ((size_t)t * k + s) * width;
            for (int j = 0; j < width; j++) o[j] += ys[j] * w;
        }
    }
    free(ord);
}

/* LoRA: h = A x and B h in double, added to y once per segment. */
static void ref_lora(struct backend *be, float *y, const float *x, int n_in, int n_out, const struct lora_seg *segs,
                     int n_segs) {
    (void)be;
    double h[LORA_MAX_RANK];
    for (int s = 0; s < n_segs; s++) {
        const struct lora_seg *g = &segs[s];
        GB_ASSERT(g->rank > 0 && g->rank <= LORA_MAX_RANK);
        for (int t = g->row0; t < g->row0 + g->n_rows; t++) {
            const float *xt = x + (size_t)t * n_in;
            float *yt = y + (size_t)t * n_out;
            for (int r = 0; r < g->rank; r++) {
                double acc = 0;
                for (int i = 0; i < n_in; i++) acc += (double)g->a[(size_t)r * n_in + i] * xt[i];
                h[r] = acc;
            }
            for (int o = 0; o < n_out; o++) {
                double acc = 0;
                for (int r = 0; r < g->rank; r++) acc += (double)g->bt[(size_t)r * n_out + o] * h[r];
                yt[o] += (float)(acc * g->scale);
            }
        }
    }
}

/* ---- speech-model ops (Moonshine) ---- */

static void ref_im2col1d(struct backend *be, float *col, const float *x, int T_in, int C, int K, int stride) {
    (void)be;
    const int T_out = (T_in - K) / stride + 1;
    for (int t = 0; t < T_out; t++)
        for (int c = 0; c < C; c++)
            for (int k = 0; k < K; k++)
                col[((size_t)t * C + c) * K + k] = x[((size_t)t * stride + k) * C + c];
}

/* ---- audio-codec ops (DAC) ---- */

static void ref_im2col1d_pad(struct backend *be, float *col, const float *x, int T_in, int C, int K, int stride,
                             int dilation, int pad, int t0, int n) {
    (void)be;
    for (int r = 0; r < n; r++)
        for (int c = 0; c < C; c++)
            for (int k = 0; k < K; k++) {
                const long i = (long)(t0 + r) * stride + (long)k * dilation - pad;
                col[((size_t)r * C + c) * K + k] = i >= 0 && i < T_in ? x[(size_t)i * C + c] : 0.0f;
            }
}

/* Scatter form (the definition): every z[t][c][k] added where it lands, k ascending per output. */
static void ref_col2im1d(struct backend *be, float *y, const float *z, const float *b, int T_in, int C, int K,
                         int stride, int pad, int T_out) {
    (void)be;
    for (int j = 0; j < T_out; j++)
        for (int c = 0; c < C; c++) y[(size_t)j * C + c] = b ? b[c] : 0.0f;
    for (int k = 0; k < K; k++)
        for (int t = 0; t < T_in; t++) {
            const long j = (long)t * stride + k - pad;
            if (j < 0 || j >= T_out) continue;
            for (int c = 0; c < C; c++) y[(size_t)j * C + c] += z[((size_t)t * C + c) * K + k];
        }
}

static void ref_snake(struct backend *be, float *x, const float *alpha, int T, int C) {
    (void)be;
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++) {
            const float a = alpha[c], inv = 1.0f / (a + 1e-9f), v = x[(size_t)t * C + c], s = sinf(a * v);
            x[(size_t)t * C + c] = v + inv * (s * s);
        }
}

/* Mean and biased variance in double, the result rounded once to f32. */
static void ref_layernorm(struct backend *be, float *y, const float *x, const float *w, const float *b, float eps,
                          int n_rows, int n) {
    (void)be;
    for (int r = 0; r < n_rows; r++) {
        const float *xr = x + (size_t)r * n;
        float *yr = y + (size_t)r * n;
        double m = 0, v = 0;
        for (int i = 0; i < n; i++) m += xr[i];
        m /= n;
        for (int i = 0; i < n; i++) v += (xr[i] - m) * (xr[i] - m);
        v /= n;
        const double inv = 1.0 / sqrt(v + eps);
        for (int i = 0; i < n; i++)
            yr[i] = (float)((xr[i] - m) * inv * (w ? w[i] : 1.0) + (b ? b[i] : 0.0));
    }
}

static void ref_groupnorm(struct backend *be, float *y, const float *x, const float *w, const float *b, float eps,
                          int T, int C, int G) {
    (void)be;
    GB_ASSERT(G > 0 && C % G == 0);
    const int cg = C / G;
    for (int g = 0; g < G; g++) {
        double m = 0, v = 0;
        for (int t = 0; t < T; t++)
            for (int c = g * cg; c < (g + 1) * cg; c++) m += x[(size_t)t * C + c];
        m /= (double)T * cg;
        for (int t = 0; t < T; t++)
            for (int c = g * cg; c < (g + 1) * cg; c++) {
                double d = x[(size_t)t * C + c] - m;
                v += d * d;
            }
        v /= (double)T * cg;
        const double inv = 1.0 / sqrt(v + eps);
        for (int t = 0; t < T; t++)
            for (int c = g * cg; c < (g + 1) * cg; c++)
                y[(size_t)t * C + c] = (float)((x[(size_t)t * C + c] - m) * inv * w[c] + b[c]);
    }
}

static void ref_unary(struct backend *be, float *x, long n, int kind) {
    (void)be;
    for (long i = 0; i < n; i++) {
        const double v = x[i];
        x[i] = (float)(kind == GB_UNARY_TANH ? tanh(v) : 0.5 * v * (1.0 + erf(v / sqrt(2.0))));
    }
}

static void ref_attention_dense(struct backend *be, float *out, const float *q, const float *k, const float *v,
                                int n_q, int n_kv, int n_head, int n_head_kv, int hd, float scale, float *scratch) {
    (void)be;
    (void)scratch;
    const int group = n_head / n_head_kv;
    double *sc = ref_xmalloc((size_t)n_kv * sizeof *sc);
    for (int i = 0; i < n_q; i++)
        for (int h = 0; h < n_head; h++) {
            const float *qi = q + ((size_t)i * n_head + h) * hd;
            const size_t ko = (size_t)(h / group) * hd, ks = (size_t)n_head_kv * hd;
            double mx = -DBL_MAX, sum = 0;
            for (int j = 0; j < n_kv; j++) {
                double d = 0;
                for (int c = 0; c < hd; c++) d += (double)qi[c] * k[j * ks + ko + c];
                sc[j] = d * scale;
                if (sc[j] > mx) mx = sc[j];
            }
            for (int j = 0; j < n_kv; j++) sum += (sc[j] = exp(sc[j] - mx));
            for (int c = 0; c < hd; c++) {
                double acc = 0;
                for (int j = 0; j < n_kv; j++) acc += sc[j] * v[j * ks + ko + c];
                out[((size_t)i * n_head + h) * hd + c] = (float)(acc / sum);
            }
        }
    free(sc);
}

static const struct backend_ops ref_ops = {
    .name = "ref",
    .host_memory = 1,
    .destroy = ref_destroy,
    .n_threads = ref_n_threads,
    .alloc = ref_alloc,
    .buf_free = ref_buf_free,
    .upload = ref_upload,
    .download = ref_download,
    .copy = ref_copy,
    .zero = ref_zero,
    .sync = ref_sync,
    .weight_prepare = ref_weight_prepare,
    .reserve = ref_reserve,
    .batch_begin = ref_batch_begin,
    .matmul = ref_matmul,
    .matmul_multi = ref_matmul_multi,
    .matmul_id = ref_matmul_id,
    .get_rows = ref_get_rows,
    .gather_rows = ref_gather_rows,
    .copy_strided = ref_copy_strided,
    .rmsnorm = ref_rmsnorm,
    .rmsnorm_gated = ref_rmsnorm_gated,
    .l2norm_heads = ref_l2norm_heads,
    .act_mul = ref_act_mul,
    .softcap = ref_softcap,
    .scale = ref_scale,
    .add = ref_add,
    .sigmoid_mul = ref_sigmoid_mul,
    .mul_rows = ref_mul_rows,
    .gated_add_rows = ref_gated_add_rows,
    .rope = ref_rope,
    .kv_store = ref_kv_store,
    .attention = ref_attention,
    .conv1d = ref_conv1d,
    .delta_rule = ref_delta_rule,
    .deltanet_gates = ref_deltanet_gates,
    .moe_route = ref_moe_route,
    .moe_combine = ref_moe_combine,
    .lora = ref_lora,
    .im2col1d = ref_im2col1d,
    .layernorm = ref_layernorm,
    .groupnorm = ref_groupnorm,
    .unary = ref_unary,
    .attention_dense = ref_attention_dense,
    .im2col1d_pad = ref_im2col1d_pad,
    .col2im1d = ref_col2im1d,
    .snake = ref_snake,
};

struct backend *backend_ref_new(void) {
    struct ref_backend *r = calloc(1, sizeof *r);
    if (!r) {
        err_set(GERBIL_ERR_NOMEM, "reference backend: out of memory");
        return NULL;
    }
    r->base.ops = &ref_ops;
    return &r->base;
}
