/* The CUDA backend (cuda.h): buffers, loading, the batch's host arrays, and every op but
 * the matmuls (cuda_matmul.cu). Kernels follow ref_backend.c op by op: sums in double
 * where the reference sums in double, the same f32 products elsewhere; transcendental
 * functions are CUDA's (within 2 ulp of the host's), so results agree with the reference
 * to rounding, not bit for bit (tests/test_backend_cuda.c holds each op to its bound).
 * Every result of a row is computed from its own inputs in a fixed order, whatever the
 * rest of the batch holds (batch invariance). */
#include "backend/cuda/cuda_impl.cuh"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void cu_fatal(const char *what, cudaError_t e, const char *file, int line) {
    char msg[512];
    snprintf(msg, sizeof msg, "CUDA error %s (%s) in %s", cudaGetErrorName(e), cudaGetErrorString(e), what);
    gb_abort(file, line, msg);
}

namespace {

inline void use(struct cuda_backend *cb) { CU(cudaSetDevice(cb->dev)); }

__device__ __forceinline__ float silu_f(float v) { return v / (1.0f + expf(-v)); }
__device__ __forceinline__ float sigmoid_f(float v) { return 1.0f / (1.0f + expf(-v)); }

inline unsigned blocks_for(long n, int threads) { return (unsigned)((n + threads - 1) / threads); }

/* ---- buffers ---- */

void cu_destroy(struct backend *be) {
    struct cuda_backend *cb = cu_of(be);
    use(cb);
    cudaStreamSynchronize(cb->st);
    for (int i = 0; i < cb->n_regions; i++) cudaFree(cb->regions[i].dev);
    free(cb->regions);
    cudaFree(cb->batch_dev);
    free(cb->batch_host);
    cudaFree(cb->stage);
    cudaFree(cb->tmp);
    cudaStreamDestroy(cb->st);
    free(cb);
}

int cu_n_threads(const struct backend *be) { return 1; }

void *cu_alloc(struct backend *be, size_t bytes, int flags) {
    struct cuda_backend *cb = cu_of(be);
    use(cb);
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError(); /* out of memory is not sticky: clear it */
        return NULL;
    }
    if (flags & (GB_BUF_ZERO | GB_BUF_LAZY)) {
        CU(cudaMemsetAsync(p, 0, bytes, cb->st));
        CU(cudaStreamSynchronize(cb->st));
    }
    return p;
}

void cu_buf_free(struct backend *be, void *p, size_t bytes) {
    struct cuda_backend *cb = cu_of(be);
    if (!p) return;
    use(cb);
    CU(cudaStreamSynchronize(cb->st));
    CU(cudaFree(p));
}

void cu_upload(struct backend *be, void *dst, const void *src, size_t bytes) {
    struct cuda_backend *cb = cu_of(be);
    if (!bytes) return;
    CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cb->st));
}

void cu_download(struct backend *be, void *dst, const void *src, size_t bytes) {
    struct cuda_backend *cb = cu_of(be);
    if (!bytes) return;
    CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cb->st));
    CU(cudaStreamSynchronize(cb->st));
}

void cu_copy(struct backend *be, void *dst, const void *src, size_t bytes) {
    struct cuda_backend *cb = cu_of(be);
    if (!bytes || dst == src) return;
    const char *d = (const char *)dst, *s = (const char *)src;
    if (d + bytes <= s || s + bytes <= d) {
        CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cb->st));
        return;
    }
    if (bytes > cb->tmp_cap) { /* overlapping: through scratch */
        CU(cudaStreamSynchronize(cb->st));
        cudaFree(cb->tmp);
        cb->tmp = NULL;
        cb->tmp_cap = 0;
        CU(cudaMalloc(&cb->tmp, bytes));
        cb->tmp_cap = bytes;
    }
    CU(cudaMemcpyAsync(cb->tmp, src, bytes, cudaMemcpyDeviceToDevice, cb->st));
    CU(cudaMemcpyAsync(dst, cb->tmp, bytes, cudaMemcpyDeviceToDevice, cb->st));
}

void cu_zero(struct backend *be, void *dst, size_t bytes) {
    struct cuda_backend *cb = cu_of(be);
    if (bytes) CU(cudaMemsetAsync(dst, 0, bytes, cb->st));
}

void cu_sync(struct backend *be) {
    struct cuda_backend *cb = cu_of(be);
    CU(cudaStreamSynchronize(cb->st));
}

/* ---- loading ---- */

void set_load_err(struct cuda_backend *cb, gerbil_status st) {
    if (cb->load_err == GERBIL_OK) cb->load_err = st;
}

/* The device copy of host bytes [p, p + n): the earlier upload of exactly these bytes (a
 * tied embedding is prepared twice), else a new one. Host weights must outlive the
 * backend (the loader's checkpoint does), or a new tensor at a freed one's address would
 * find the old copy. NULL when out of device memory
 * (message set). */
const char *region_for(struct cuda_backend *cb, const void *p, size_t n, const char *what) {
    for (int i = 0; i < cb->n_regions; i++)
        if (cb->regions[i].host == p && cb->regions[i].bytes == n) return (const char *)cb->regions[i].dev;
    if (cb->n_regions == cb->cap_regions) {
        int cap = cb->cap_regions ? 2 * cb->cap_regions : 256;
        struct cuda_region *nr = (struct cuda_region *)realloc(cb->regions, (size_t)cap * sizeof *nr);
        if (!nr) {
            set_load_err(cb, err_set(GERBIL_ERR_NOMEM, "out of host memory"));
            return NULL;
        }
        cb->regions = nr;
        cb->cap_regions = cap;
    }
    void *d = NULL;
    if (cudaMalloc(&d, n ? n : 1) != cudaSuccess) {
        cudaGetLastError();
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        set_load_err(cb, err_set(GERBIL_ERR_NOMEM,
                                 "CUDA device %d: out of memory for weight \"%s\" (%.1f MiB; %.1f of %.1f MiB free)",
                                 cb->dev, what, n / 1048576.0, fr / 1048576.0, tot / 1048576.0));
        return NULL;
    }
    CU(cudaMemcpy(d, p, n, cudaMemcpyHostToDevice));
    cb->regions[cb->n_regions++] = (struct cuda_region){p, n, d};
    return (const char *)d;
}

/* w[0 .. n): views of one tensor (and its MLX scales and biases): uploaded once as they
 * are stored, the views moved onto the device copy. */
void cu_weight_prepare(struct backend *be, struct gb_weight *w, int64_t n, int writable) {
    struct cuda_backend *cb = cu_of(be);
    if (n <= 0 || cb->load_err != GERBIL_OK) return;
    use(cb);
    char why[160];
    if (!cu_weight_supported(&w[0], why, sizeof why)) {
        set_load_err(cb, err_set(GERBIL_ERR_UNSUPPORTED, "tensor \"%s\": the CUDA backend cannot read it: %s",
                                 w[0].name ? w[0].name : "?", why));
        return;
    }
    for (int part = 0; part < 3; part++) {
        if (part && w[0].kind != GB_WEIGHT_MLX) break;
        const char *lo = NULL, *hi = NULL;
        for (int64_t i = 0; i < n; i++) {
            const char *p = (const char *)(part == 0 ? w[i].data : part == 1 ? w[i].scales : w[i].biases);
            const size_t bytes = part == 0 ? (size_t)w[i].n_out * w[i].row_bytes
                                           : (size_t)w[i].n_out * (size_t)(w[i].n_in / w[i].group_size) *
                                                 type_traits(w[i].sb_type)->type_size;
            if (!lo || p < lo) lo = p;
            if (!hi || p + bytes > hi) hi = p + bytes;
        }
        const char *d = region_for(cb, lo, (size_t)(hi - lo), w[0].name ? w[0].name : "?");
        if (!d) return;
        for (int64_t i = 0; i < n; i++) {
            const void **f = part == 0 ? &w[i].data : part == 1 ? &w[i].scales : &w[i].biases;
            *f = d + ((const char *)*f - lo);
        }
    }
    for (int64_t i = 0; i < n; i++) w[i].plan = cb;
}

gerbil_status cu_weight_status(struct backend *be) { return cu_of(be)->load_err; }

gerbil_status cu_reserve(struct backend *be, const struct gb_reserve *r) {
    struct cuda_backend *cb = cu_of(be);
    if (cb->load_err != GERBIL_OK) return err_set(cb->load_err, "the model's weights did not load onto CUDA device %d", cb->dev);
    return GERBIL_OK;
}

/* The device copies of the batch's host arrays, in one upload. */
void cu_batch_begin(struct backend *be, const struct gb_batch *b) {
    struct cuda_backend *cb = cu_of(be);
    use(cb);
    const int n = b->n_rows;
    size_t n_blk = 0;
    int max_rows = 0;
    for (int s = 0; s < b->n_segs; s++) {
        const struct gb_seg *g = &b->segs[s];
        if (g->blocks) n_blk += (size_t)((g->pos0 + g->n_rows + KV_BLOCK - 1) / KV_BLOCK);
        if (g->n_rows > max_rows) max_rows = g->n_rows;
    }
    const size_t a_rows = ((size_t)n * 4 + 255) & ~(size_t)255;
    const size_t a_segs = ((size_t)b->n_segs * sizeof(cu_seg) + 255) & ~(size_t)255;
    const size_t need = 5 * a_rows + a_segs + n_blk * 4 + 256;
    if (need > cb->batch_cap) {
        CU(cudaStreamSynchronize(cb->st));
        cudaFree(cb->batch_dev);
        free(cb->batch_host);
        size_t cap = need * 2;
        CU(cudaMalloc(&cb->batch_dev, cap));
        cb->batch_host = (char *)malloc(cap);
        GB_ASSERT(cb->batch_host);
        cb->batch_cap = cap;
    }
    char *h = cb->batch_host;
    const int32_t *src[5] = {b->tok, b->kv_row, b->pos, b->seg_of, b->span};
    for (int k = 0; k < 5; k++)
        if (src[k]) memcpy(h + k * a_rows, src[k], (size_t)n * 4);
    cu_seg *sg = (cu_seg *)(h + 5 * a_rows);
    int32_t *blk = (int32_t *)(h + 5 * a_rows + a_segs);
    size_t off = 0;
    for (int s = 0; s < b->n_segs; s++) {
        const struct gb_seg *g = &b->segs[s];
        sg[s] = (cu_seg){g->row0, g->n_rows, g->pos0, g->state, (int)off};
        if (g->blocks) {
            const size_t k = (size_t)((g->pos0 + g->n_rows + KV_BLOCK - 1) / KV_BLOCK);
            memcpy(blk + off, g->blocks, k * 4);
            off += k;
        }
    }
    CU(cudaMemcpyAsync(cb->batch_dev, h, 5 * a_rows + a_segs + off * 4, cudaMemcpyHostToDevice, cb->st));
    const int32_t **dst[5] = {&cb->d_tok, &cb->d_kv, &cb->d_pos, &cb->d_segof, &cb->d_span};
    const void **hs[5] = {&cb->h_tok, &cb->h_kv, &cb->h_pos, &cb->h_segof, &cb->h_span};
    for (int k = 0; k < 5; k++) {
        *dst[k] = (const int32_t *)(cb->batch_dev + k * a_rows);
        *hs[k] = src[k];
    }
    cb->d_segs = (const cu_seg *)(cb->batch_dev + 5 * a_rows);
    cb->d_blocks = (const int32_t *)(cb->batch_dev + 5 * a_rows + a_segs);
    cb->h_segs = b->segs;
    cb->n_segs = b->n_segs;
    cb->n_rows = n;
    cb->max_seg_rows = max_rows;
    cb->stage_off = 0;
}

/* ---- matmuls (cuda_matmul.cu) ---- */

void cu_mm(struct backend *be, float *y, const float *x, const struct gb_weight *w, const float *bias,
           struct gb_rows r) {
    cu_matmul(cu_of(be), y, x, w, bias, r);
}

void cu_mm_multi(struct backend *be, int k, float *const *y, const float *x, const struct gb_weight *const *w,
                 const float *const *bias, struct gb_rows r) {
    for (int i = 0; i < k; i++) cu_matmul(cu_of(be), y[i], x, w[i], bias ? bias[i] : NULL, r);
}

void cu_mm_id(struct backend *be, float *y, const float *x, int x_per_slot, const struct gb_weight *stack, int n_mat,
              const int32_t *ids, int n_sel, const struct gb_batch *b, int n) {
    cu_matmul_id(cu_of(be), y, x, x_per_slot, stack, n_mat, ids, n_sel, n);
}

void cu_rows(struct backend *be, float *y, const struct gb_weight *table, const int32_t *ids, int n) {
    cu_get_rows(cu_of(be), y, table, ids, n);
}

/* ---- rows ---- */

__global__ void gather_k(float *dst, const float *src, const int32_t *idx, int n, int width) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)n * width) return;
    const int t = (int)(i / width), c = (int)(i % width);
    dst[i] = src[(long)idx[t] * width + c];
}

void cu_gather_rows(struct backend *be, float *dst, const float *src, const int32_t *idx, int n, int width) {
    struct cuda_backend *cb = cu_of(be);
    if (n <= 0 || width <= 0) return;
    gather_k<<<blocks_for((long)n * width, 256), 256, 0, cb->st>>>(dst, src, idx, n, width);
    CU_LAUNCHED();
}

__global__ void strided_k(float *dst, int d1, int d2, const float *src, int s1, int s2, int n1, int n2, int width) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)n1 * n2 * width) return;
    const int k = (int)(i % width), j = (int)(i / width % n2), a = (int)(i / width / n2);
    dst[(long)a * d1 + (long)j * d2 + k] = src[(long)a * s1 + (long)j * s2 + k];
}

void cu_copy_strided(struct backend *be, float *dst, int d1, int d2, const float *src, int s1, int s2, int n1, int n2,
                     int width) {
    struct cuda_backend *cb = cu_of(be);
    const long n = (long)n1 * n2 * width;
    if (n <= 0) return;
    strided_k<<<blocks_for(n, 256), 256, 0, cb->st>>>(dst, d1, d2, src, s1, s2, n1, n2, width);
    CU_LAUNCHED();
}

/* ---- norms: one block of 256 per row ---- */

template <typename T>
__device__ T block_sum(T v, T *sh) {
    for (int off = 16; off; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    const int w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh[w] = v;
    __syncthreads();
    T s = 0;
    for (int i = 0; i < nw; i++) s += sh[i]; /* the same order in every thread */
    return s;
}

__global__ void rmsnorm_k(float *y, const float *x, const float *z, const float *w, float eps, int n) {
    __shared__ double sh[32];
    const float *xr = x + (long)blockIdx.x * n;
    float *yr = y + (long)blockIdx.x * n;
    double ss = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += (double)xr[i] * xr[i];
    ss = block_sum(ss, sh);
    const float inv = 1.0f / sqrtf((float)(ss / n) + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = w[i] * (xr[i] * inv);
        if (z) v = v * silu_f(z[(long)blockIdx.x * n + i]);
        yr[i] = v;
    }
}

void cu_rmsnorm(struct backend *be, float *y, const float *x, const float *w, float eps, int n_rows, int n) {
    struct cuda_backend *cb = cu_of(be);
    if (n_rows <= 0) return;
    rmsnorm_k<<<n_rows, 256, 0, cb->st>>>(y, x, NULL, w, eps, n);
    CU_LAUNCHED();
}

void cu_rmsnorm_gated(struct backend *be, float *y, const float *x, const float *z, const float *w, float eps,
                      int n_rows, int n) {
    struct cuda_backend *cb = cu_of(be);
    if (n_rows <= 0) return;
    rmsnorm_k<<<n_rows, 256, 0, cb->st>>>(y, x, z, w, eps, n);
    CU_LAUNCHED();
}

/* One thread per head: the sum in float in index order, as the reference. */
__global__ void l2norm_k(float *x, int n_rows, int n_heads, int d, int stride, float eps, float scale) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_rows * n_heads) return;
    float *v = x + (long)(i / n_heads) * stride + (long)(i % n_heads) * d;
    float ss = 0.0f;
    for (int k = 0; k < d; k++) ss = __fadd_rn(ss, __fmul_rn(v[k], v[k]));
    const float inv = 1.0f / sqrtf(ss + eps);
    for (int k = 0; k < d; k++) v[k] = __fmul_rn(__fmul_rn(v[k], inv), scale);
}

void cu_l2norm_heads(struct backend *be, float *x, int n_rows, int n_heads, int d, int stride, float eps,
                     float scale) {
    struct cuda_backend *cb = cu_of(be);
    if (n_rows * n_heads <= 0) return;
    l2norm_k<<<blocks_for((long)n_rows * n_heads, 128), 128, 0, cb->st>>>(x, n_rows, n_heads, d, stride, eps, scale);
    CU_LAUNCHED();
}

/* ---- element-wise ---- */

__global__ void act_mul_k(float *y, const float *g, const float *u, long n, int gelu) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const double x = g[i];
    if (gelu) {
        const double k = 0.79788456080286535588; /* sqrt(2 / pi) */
        const double t = tanh(k * (x + 0.044715 * x * x * x));
        y[i] = (float)(0.5 * x * (1.0 + t) * u[i]);
    } else {
        y[i] = (float)(x / (1.0 + exp(-x)) * u[i]);
    }
}

void cu_act_mul(struct backend *be, float *y, const float *g, const float *u, long n, int gelu) {
    struct cuda_backend *cb = cu_of(be);
    if (n <= 0) return;
    act_mul_k<<<blocks_for(n, 256), 256, 0, cb->st>>>(y, g, u, n, gelu);
    CU_LAUNCHED();
}

/* op: 0 softcap, 1 scale, 2 add, 3 sigmoid_mul */
__global__ void ew_k(int op, float *y, const float *x, const float *g, float s, long n) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    switch (op) {
    case 0: y[i] = (float)((double)s * tanh((double)y[i] / s)); break;
    case 1: y[i] = __fmul_rn(y[i], s); break;
    case 2: y[i] = __fadd_rn(y[i], x[i]); break;
    default: y[i] = x[i] * sigmoid_f(g[i]); break;
    }
}

void ew(struct backend *be, int op, float *y, const float *x, const float *g, float s, long n) {
    struct cuda_backend *cb = cu_of(be);
    if (n <= 0) return;
    ew_k<<<blocks_for(n, 256), 256, 0, cb->st>>>(op, y, x, g, s, n);
    CU_LAUNCHED();
}
void cu_softcap(struct backend *be, float *x, float cap, long n) { ew(be, 0, x, NULL, NULL, cap, n); }
void cu_scale(struct backend *be, float *x, float s, long n) { ew(be, 1, x, NULL, NULL, s, n); }
void cu_add(struct backend *be, float *y, const float *x, long n) { ew(be, 2, y, x, NULL, 0, n); }
void cu_sigmoid_mul(struct backend *be, float *y, const float *x, const float *g, long n) { ew(be, 3, y, x, g, 0, n); }

__global__ void mul_rows_k(float *y, const float *a, int as, const float *b, int bs, const float *bias, int n_rows,
                           int n) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)n_rows * n) return;
    const int t = (int)(i / n), c = (int)(i % n);
    const float bv = b[(long)t * bs + c];
    y[i] = __fmul_rn(a[(long)t * as + c], bias ? __fadd_rn(bv, bias[c]) : bv);
}

void cu_mul_rows(struct backend *be, float *y, const float *a, int a_stride, const float *b, int b_stride,
                 const float *bias, int n_rows, int n) {
    struct cuda_backend *cb = cu_of(be);
    if ((long)n_rows * n <= 0) return;
    mul_rows_k<<<blocks_for((long)n_rows * n, 256), 256, 0, cb->st>>>(y, a, a_stride, b, b_stride, bias, n_rows, n);
    CU_LAUNCHED();
}

__global__ void gated_add_k(float *out, const float *a, const float *y, const float *g, int n_rows, int n) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)n_rows * n) return;
    out[i] = __fadd_rn(a[i], __fmul_rn(sigmoid_f(g[i / n]), y[i]));
}

void cu_gated_add_rows(struct backend *be, float *out, const float *a, const float *y, const float *g, int n_rows,
                       int n) {
    struct cuda_backend *cb = cu_of(be);
    if ((long)n_rows * n <= 0) return;
    gated_add_k<<<blocks_for((long)n_rows * n, 256), 256, 0, cb->st>>>(out, a, y, g, n_rows, n);
    CU_LAUNCHED();
}

/* ---- RoPE and the KV cache ---- */

__global__ void rope_k(float *x, const int32_t *pos, const int32_t *freq, const float *inv_freq, float scale,
                       int n_rows, int n_heads, int head_dim, int half, int interleaved) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)n_rows * n_heads * half) return;
    const int k = (int)(i % half), h = (int)(i / half % n_heads), t = (int)(i / half / n_heads);
    const float *f = inv_freq + (long)(freq ? freq[t] : 0) * half;
    const float ang = __fmul_rn((float)pos[t], f[k]);
    const float c = __fmul_rn((float)cos((double)ang), scale), s = __fmul_rn((float)sin((double)ang), scale);
    float *v = x + ((long)t * n_heads + h) * head_dim;
    const int lo = interleaved ? 2 * k : k, hi = interleaved ? 2 * k + 1 : k + half;
    const float a = v[lo], b = v[hi];
    v[lo] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    v[hi] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
}

void cu_rope(struct backend *be, float *x, const int32_t *pos, const int32_t *freq, const float *inv_freq, float scale,
             int n_rows, int n_heads, int head_dim, int n_rot, int interleaved) {
    struct cuda_backend *cb = cu_of(be);
    const int half = n_rot / 2;
    if ((long)n_rows * n_heads * half <= 0) return;
    const int32_t *dp = (const int32_t *)cu_dev_array(cb, pos, (size_t)n_rows * 4);
    const int32_t *df = freq ? (const int32_t *)cu_dev_array(cb, freq, (size_t)n_rows * 4) : NULL;
    rope_k<<<blocks_for((long)n_rows * n_heads * half, 256), 256, 0, cb->st>>>(x, dp, df, inv_freq, scale, n_rows,
                                                                              n_heads, head_dim, half, interleaved);
    CU_LAUNCHED();
}

__global__ void kv_store_k(void *cache, int f16, const float *x, const int32_t *kv_row, int n, int width, int stride) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)n * width) return;
    const int t = (int)(i / width), c = (int)(i % width);
    const long off = (long)kv_row[t] * stride + c;
    if (f16) ((__half *)cache)[off] = __float2half_rn(x[i]);
    else ((float *)cache)[off] = x[i];
}

void cu_kv_store(struct backend *be, void *cache, enum gb_type kv_type, const float *x, const int32_t *kv_row, int n,
                 int width, int stride) {
    struct cuda_backend *cb = cu_of(be);
    GB_ASSERT(kv_type == GB_TYPE_F32 || kv_type == GB_TYPE_F16);
    if ((long)n * width <= 0) return;
    const int32_t *dr = (const int32_t *)cu_dev_array(cb, kv_row, (size_t)n * 4);
    kv_store_k<<<blocks_for((long)n * width, 256), 256, 0, cb->st>>>(cache, kv_type == GB_TYPE_F16, x, dr, n, width,
                                                                    stride);
    CU_LAUNCHED();
}

/* One block of ATT_T threads per (query row, head): keys in tiles of ATT_T (thread t scores
 * key t; in segments of 16 rows or more each warp's 32 keys are scored one at a time across
 * its lanes instead, thread t keeping key t's score), an online softmax
 * over the tiles (running max and sum), each thread owning output channels c = tid,
 * tid + ATT_T, ... */
enum { ATT_T = 128, ATT_MAX_HD = 512 };

template <bool F16>
__global__ void __launch_bounds__(ATT_T) attn_k(const float *q, float *out, const void *kc, const void *vc,
                                                int kv_stride, int n_head, int group, int hd, int window, int bidir, float scale,
                                                const cu_seg *segs, const int32_t *blocks) {
    __shared__ float sq[ATT_MAX_HD], sp[ATT_T], sred[ATT_T / 32];
    __shared__ long srow[ATT_T];
    const cu_seg sg = segs[blockIdx.z];
    const int i = blockIdx.y;
    if (i >= sg.n_rows) return;
    const int h = blockIdx.x, tid = threadIdx.x;
    const int p = sg.pos0 + i, row = sg.row0 + i;
    const int j0 = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
    int j1 = p; /* the last key it sees: p, or with bidirectional attention the segment's last */
    if (bidir) j1 = window > 0 && p + window - 1 < sg.pos0 + sg.n_rows - 1 ? p + window - 1 : sg.pos0 + sg.n_rows - 1;
    const bool lanes = sg.n_rows >= 16; /* the method by the segment's rows, never by the batch */
    const long kv_off = (long)(h / group) * hd;
    const float *qr = q + ((long)row * n_head + h) * hd;
    for (int c = tid; c < hd; c += ATT_T) sq[c] = qr[c];
    const int32_t *bt = blocks + sg.blk;
    float m = -INFINITY, l = 0.0f, acc[ATT_MAX_HD / ATT_T];
#pragma unroll
    for (int u = 0; u < ATT_MAX_HD / ATT_T; u++) acc[u] = 0.0f;
    __syncthreads();
    for (int t0 = j0; t0 <= j1; t0 += ATT_T) {
        const int j = t0 + tid, lane = tid & 31, wj = t0 + (tid & ~31);
        float s = -INFINITY;
        if (!lanes && j <= j1) { /* a short segment (decode): each thread its own key's dot */
            const long base = (((long)bt[j >> KV_BLOCK_SHIFT] << KV_BLOCK_SHIFT) | (j & (KV_BLOCK - 1))) * kv_stride + kv_off;
            srow[tid] = base;
            float d = 0.0f;
            if (F16) {
                const __half *k = (const __half *)kc + base;
                for (int c = 0; c < hd; c++) d = fmaf(sq[c], __half2float(k[c]), d);
            } else {
                const float *k = (const float *)kc + base;
                for (int c = 0; c < hd; c++) d = fmaf(sq[c], k[c], d);
            }
            s = d * scale;
        }
        /* a long segment (prefill): the warp's 32 keys one after another, each dot product
         * across the lanes (coalesced rows); lane kk keeps key wj + kk's score */
        for (int kk = 0; lanes && kk < 32 && wj + kk <= j1; kk++) {
            const int jk = wj + kk;
            const long base = (((long)bt[jk >> KV_BLOCK_SHIFT] << KV_BLOCK_SHIFT) | (jk & (KV_BLOCK - 1))) * kv_stride +
                              kv_off;
            float d = 0.0f;
            if (F16) {
                const __half *k = (const __half *)kc + base;
                for (int c = lane; c < hd; c += 32) d = fmaf(sq[c], __half2float(k[c]), d);
            } else {
                const float *k = (const float *)kc + base;
                for (int c = lane; c < hd; c += 32) d = fmaf(sq[c], k[c], d);
            }
            for (int off = 16; off; off >>= 1) d += __shfl_xor_sync(0xffffffffu, d, off);
            if (lane == kk) {
                s = d * scale;
                srow[tid] = base;
            }
        }
        /* the tile's max */
        float mx = s;
        for (int off = 16; off; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
        if ((tid & 31) == 0) sred[tid >> 5] = mx;
        __syncthreads();
        mx = sred[0];
        for (int w = 1; w < ATT_T / 32; w++) mx = fmaxf(mx, sred[w]);
        const float m_new = fmaxf(m, mx);
        const float pj = j <= j1 ? expf(s - m_new) : 0.0f;
        sp[tid] = pj;
        const float corr = m == -INFINITY ? 0.0f : expf(m - m_new);
        __syncthreads();
        const int cnt = min(ATT_T, j1 - t0 + 1);
        float psum = 0.0f;
        for (int jj = 0; jj < cnt; jj++) psum += sp[jj];
        l = l * corr + psum;
#pragma unroll
        for (int u = 0; u < ATT_MAX_HD / ATT_T; u++) {
            const int c = tid + u * ATT_T;
            if (c < hd) {
                float a = acc[u] * corr;
                for (int jj = 0; jj < cnt; jj++) {
                    const float vv = F16 ? __half2float(((const __half *)vc)[srow[jj] + c]) : ((const float *)vc)[srow[jj] + c];
                    a = fmaf(sp[jj], vv, a);
                }
                acc[u] = a;
            }
        }
        m = m_new;
        __syncthreads();
    }
    float *o = out + ((long)row * n_head + h) * hd;
#pragma unroll
    for (int u = 0; u < ATT_MAX_HD / ATT_T; u++) {
        const int c = tid + u * ATT_T;
        if (c < hd) o[c] = acc[u] / l;
    }
}

void cu_attention(struct backend *be, const struct attn_args *a) {
    struct cuda_backend *cb = cu_of(be);
    GB_ASSERT(a->kv_type == GB_TYPE_F32 || a->kv_type == GB_TYPE_F16);
    GB_ASSERT(a->n_head_kv > 0 && a->n_head % a->n_head_kv == 0);
    GB_ASSERT(a->head_dim <= ATT_MAX_HD);
    if (a->n_segs <= 0) return;
    int max_rows = 0;
    for (int s = 0; s < a->n_segs; s++)
        if (a->segs[s].n_rows > max_rows) max_rows = a->segs[s].n_rows;
    if (max_rows <= 0) return;
    const int32_t *blocks;
    const cu_seg *ds = cu_dev_segs(cb, a->segs, a->n_segs, &blocks);
    const dim3 grid(a->n_head, max_rows, a->n_segs);
    const int group = a->n_head / a->n_head_kv;
    if (a->kv_type == GB_TYPE_F16)
        attn_k<true><<<grid, ATT_T, 0, cb->st>>>(a->q, a->out, a->k_cache, a->v_cache, a->kv_stride, a->n_head, group,
                                                 a->head_dim, a->window, a->bidirectional, a->scale, ds, blocks);
    else
        attn_k<false><<<grid, ATT_T, 0, cb->st>>>(a->q, a->out, a->k_cache, a->v_cache, a->kv_stride, a->n_head, group,
                                                  a->head_dim, a->window, a->bidirectional, a->scale, ds, blocks);
    CU_LAUNCHED();
}

/* ---- recurrent layers ---- */

/* One thread per (segment, channel): the outputs in row order over in = state ++ x, then
 * the state shifted to the last K - 1 inputs. */
__global__ void conv1d_k(float *y, const float *x, float *state, long slot_floats, const float *w, int C, int K,
                         int silu, const cu_seg *segs, int n_segs) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)n_segs * C) return;
    const int c = (int)(i % C);
    const cu_seg sg = segs[i / C];
    float *st = state + (long)sg.state * slot_floats;
    const int H = K - 1, n = sg.n_rows;
    for (int t = 0; t < n; t++) {
        float acc = 0.0f;
        for (int j = 0; j < K; j++) {
            const int k = t + j; /* index into in */
            const float v = k < H ? st[(long)k * C + c] : x[(long)(sg.row0 + k - H) * C + c];
            acc = j == 0 ? __fmul_rn(w[c], v) : __fadd_rn(acc, __fmul_rn(w[(long)j * C + c], v));
        }
        y[(long)(sg.row0 + t) * C + c] = silu ? silu_f(acc) : acc;
    }
    for (int k = 0; k < H; k++) {
        const int src = n + k;
        st[(long)k * C + c] = src < H ? st[(long)src * C + c] : x[(long)(sg.row0 + src - H) * C + c];
    }
}

void cu_conv1d(struct backend *be, float *y, const float *x, struct gb_state state, const float *w, int C, int K,
               int silu, const struct gb_seg *segs, int n_segs) {
    struct cuda_backend *cb = cu_of(be);
    GB_ASSERT(K >= 1 && y != x);
    if (n_segs <= 0 || C <= 0) return;
    const int32_t *blocks;
    const cu_seg *ds = cu_dev_segs(cb, segs, n_segs, &blocks);
    conv1d_k<<<blocks_for((long)n_segs * C, 128), 128, 0, cb->st>>>(y, x, state.base, (long)state.slot_floats, w, C, K,
                                                                    silu, ds, n_segs);
    CU_LAUNCHED();
}

/* The recurrence, one block per (segment, value head), thread j owning row j of S^T
 * (value channel j): S^T in shared memory as [dk][dv] (conflict-free across j) when it
 * fits, else in place in the state slot. Sums in double, as the reference. */
__global__ void delta_k(const float *x, int qk_stride, int v_stride, int q_off, int k_off, int v_off, const float *g,
                        const float *beta, float *out, float *state, long slot_floats, int nk, int nv, int dk, int dv,
                        int v_tiled, const cu_seg *segs, int use_smem) {
    extern __shared__ float smem[];
    const cu_seg sg = segs[blockIdx.y];
    const int h = blockIdx.x;
    const int kh = v_tiled ? h % nk : h / (nv / nk);
    float *St = state + (long)sg.state * slot_floats + (long)h * dv * dk; /* [dv][dk] */
    float *sq = smem, *sk = smem + dk;
    float *S = smem + 2 * dk;
    long si, sj; /* element (i, j) of S^T at S[i * si + j * sj] */
    if (use_smem) {
        si = dv;
        sj = 1;
        for (int e = threadIdx.x; e < dk * dv; e += blockDim.x) {
            const int j = e / dk, i = e % dk;
            S[(long)i * dv + j] = St[e];
        }
    } else {
        S = St;
        si = 1;
        sj = dk;
    }
    __syncthreads();
    for (int t = 0; t < sg.n_rows; t++) {
        const long r = sg.row0 + t;
        const float *q = x + r * qk_stride + q_off + (long)kh * dk;
        const float *k = x + r * qk_stride + k_off + (long)kh * dk;
        const float *v = x + r * v_stride + v_off + (long)h * dv;
        for (int i = threadIdx.x; i < dk; i += blockDim.x) { sq[i] = q[i]; sk[i] = k[i]; }
        __syncthreads();
        const float decay = expf(g[r * nv + h]), bt = beta[r * nv + h];
        for (int j = threadIdx.x; j < dv; j += blockDim.x) {
            float *row = S + j * sj;
            double kv = 0.0, o = 0.0;
            for (int i = 0; i < dk; i++) {
                const float s = __fmul_rn(row[i * si], decay);
                row[i * si] = s;
                kv += (double)s * sk[i];
            }
            const float delta = (float)((v[j] - kv) * bt);
            for (int i = 0; i < dk; i++) {
                const float s = __fadd_rn(row[i * si], __fmul_rn(delta, sk[i]));
                row[i * si] = s;
                o += (double)s * sq[i];
            }
            out[(r * nv + h) * dv + j] = (float)o;
        }
        __syncthreads();
    }
    if (use_smem)
        for (int e = threadIdx.x; e < dk * dv; e += blockDim.x) {
            const int j = e / dk, i = e % dk;
            St[e] = S[(long)i * dv + j];
        }
}

void cu_delta_rule(struct backend *be, const struct delta_args *a) {
    struct cuda_backend *cb = cu_of(be);
    GB_ASSERT(a->nk > 0 && a->nv % a->nk == 0);
    if (a->n_segs <= 0) return;
    const int32_t *blocks;
    const cu_seg *ds = cu_dev_segs(cb, a->segs, a->n_segs, &blocks);
    size_t sm = ((size_t)2 * a->dk + (size_t)a->dk * a->dv) * sizeof(float);
    int use_smem = sm <= 200 * 1024;
    if (!use_smem) sm = (size_t)2 * a->dk * sizeof(float);
    if (sm > 48 * 1024) CU(cudaFuncSetAttribute(delta_k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    const int threads = a->dv >= 128 ? 128 : ((a->dv + 31) / 32) * 32;
    delta_k<<<dim3(a->nv, a->n_segs), threads, sm, cb->st>>>(a->x, a->qk_stride, a->v_stride, a->q_off, a->k_off,
                                                            a->v_off, a->g, a->beta, a->out, a->state.base,
                                                            (long)a->state.slot_floats, a->nk, a->nv, a->dk, a->dv,
                                                            a->v_tiled, ds, use_smem);
    CU_LAUNCHED();
}

__global__ void gates_k(float *beta, float *g, const float *a, const float *dt_bias, int n_rows, int nv) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)n_rows * nv) return;
    const int h = (int)(i % nv);
    beta[i] = sigmoid_f(beta[i]);
    const float v = __fadd_rn(g[i], dt_bias[h]);
    g[i] = __fmul_rn(a[h], v > 20.0f ? v : log1pf(expf(v)));
}

void cu_deltanet_gates(struct backend *be, float *beta, float *g, const float *a, const float *dt_bias, int n_rows,
                       int nv) {
    struct cuda_backend *cb = cu_of(be);
    if ((long)n_rows * nv <= 0) return;
    gates_k<<<blocks_for((long)n_rows * nv, 256), 256, 0, cb->st>>>(beta, g, a, dt_bias, n_rows, nv);
    CU_LAUNCHED();
}

/* ---- mixture of experts: one thread per row ---- */

enum { MOE_MAX_EXPERT = 2048, MOE_MAX_K = 64 };

__global__ void route_k(int32_t *ids, float *wsel, float *logits, int n, int n_expert, int k, int norm) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    float *p = logits + (long)t * n_expert;
    float mx = p[0], sum = 0.0f;
    for (int e = 1; e < n_expert; e++) mx = p[e] > mx ? p[e] : mx;
    for (int e = 0; e < n_expert; e++) {
        p[e] = expf(p[e] - mx);
        sum = __fadd_rn(sum, p[e]);
    }
    for (int e = 0; e < n_expert; e++) p[e] = p[e] / sum;
    uint32_t taken[MOE_MAX_EXPERT / 32];
    for (int e = 0; e < (n_expert + 31) / 32; e++) taken[e] = 0;
    int32_t *it = ids + (long)t * k;
    float *wt = wsel + (long)t * k, wsum = 0.0f;
    for (int s = 0; s < k; s++) {
        int best = -1;
        for (int e = 0; e < n_expert; e++)
            if (!(taken[e >> 5] >> (e & 31) & 1) && (best < 0 || p[e] > p[best])) best = e;
        taken[best >> 5] |= 1u << (best & 31);
        it[s] = best;
        wt[s] = p[best];
        wsum = __fadd_rn(wsum, p[best]);
    }
    if (norm)
        for (int s = 0; s < k; s++) wt[s] = wt[s] / wsum;
}

void cu_moe_route(struct backend *be, int32_t *ids, float *wsel, float *logits, int n, int n_expert, int k, int norm) {
    struct cuda_backend *cb = cu_of(be);
    GB_ASSERT(k >= 1 && k <= n_expert && n_expert <= MOE_MAX_EXPERT);
    if (n <= 0) return;
    route_k<<<blocks_for(n, 64), 64, 0, cb->st>>>(ids, wsel, logits, n, n_expert, k, norm);
    CU_LAUNCHED();
}

__global__ void combine_k(float *out, const float *y, const int32_t *ids, const float *wsel, int n, int k, int width) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)n * width) return;
    const int t = (int)(i / width), j = (int)(i % width);
    const int32_t *it = ids + (long)t * k;
    int ord[MOE_MAX_K];
    for (int s = 0; s < k; s++) { /* insertion sort of the slots by id (stable) */
        int a = s;
        for (; a > 0 && it[ord[a - 1]] > it[s]; a--) ord[a] = ord[a - 1];
        ord[a] = s;
    }
    float o = 0.0f;
    for (int a = 0; a < k; a++) {
        const int s = ord[a];
        o = __fadd_rn(o, __fmul_rn(y[((long)t * k + s) * width + j], wsel[(long)t * k + s]));
    }
    out[i] = o;
}

void cu_moe_combine(struct backend *be, float *out, const float *y, const int32_t *ids, const float *wsel, int n,
                    int k, int width) {
    struct cuda_backend *cb = cu_of(be);
    GB_ASSERT(k >= 1 && k <= MOE_MAX_K);
    if ((long)n * width <= 0) return;
    combine_k<<<blocks_for((long)n * width, 256), 256, 0, cb->st>>>(out, y, ids, wsel, n, k, width);
    CU_LAUNCHED();
}

const struct backend_ops cuda_ops = {
    /* .name */ "cuda",
    /* .host_memory */ 0,
    cu_destroy,
    cu_n_threads,
    cu_alloc,
    cu_buf_free,
    cu_upload,
    cu_download,
    cu_copy,
    cu_zero,
    cu_sync,
    cu_weight_prepare,
    cu_reserve,
    cu_batch_begin,
    cu_mm,
    cu_mm_multi,
    cu_mm_id,
    cu_rows,
    cu_gather_rows,
    cu_copy_strided,
    cu_rmsnorm,
    cu_rmsnorm_gated,
    cu_l2norm_heads,
    cu_act_mul,
    cu_softcap,
    cu_scale,
    cu_add,
    cu_sigmoid_mul,
    cu_mul_rows,
    cu_gated_add_rows,
    cu_rope,
    cu_kv_store,
    cu_attention,
    cu_conv1d,
    cu_delta_rule,
    cu_deltanet_gates,
    cu_moe_route,
    cu_moe_combine,
    NULL, /* lora: not yet on CUDA (gerbil_adapter_load refuses) */
    cu_weight_status,
    /* im2col1d, layernorm, groupnorm, unary, attention_dense (the speech models): not on
     * CUDA yet; a Moonshine model refuses to load here, naming the op */
    nullptr,
    nullptr,
    nullptr,
    nullptr,
    nullptr,
    /* im2col1d_pad, col2im1d, snake (the audio codecs): not on CUDA yet; dac_load refuses
     * here, naming the op */
    nullptr,
    nullptr,
    nullptr,
};

} // namespace

/* ---- the batch's arrays and staging ---- */

static void *stage_put(struct cuda_backend *cb, const void *h, size_t bytes) {
    const size_t need = (bytes + 255) & ~(size_t)255;
    if (cb->stage_off + need > cb->stage_cap) {
        if (need > cb->stage_cap) {
            CU(cudaStreamSynchronize(cb->st));
            cudaFree(cb->stage);
            size_t cap = need > ((size_t)1 << 20) ? need : (size_t)1 << 20;
            CU(cudaMalloc(&cb->stage, cap));
            cb->stage_cap = cap;
        }
        cb->stage_off = 0; /* stream order: earlier ops read their copies first */
    }
    char *d = cb->stage + cb->stage_off;
    cb->stage_off += need;
    CU(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, cb->st));
    return d;
}

const void *cu_dev_array(struct cuda_backend *cb, const void *h, size_t bytes) {
    if (!h) return NULL;
    if (h == cb->h_tok) return cb->d_tok;
    if (h == cb->h_kv) return cb->d_kv;
    if (h == cb->h_pos) return cb->d_pos;
    if (h == cb->h_segof) return cb->d_segof;
    if (h == cb->h_span) return cb->d_span;
    return stage_put(cb, h, bytes);
}

const struct cu_seg *cu_dev_segs(struct cuda_backend *cb, const struct gb_seg *segs, int n_segs,
                                 const int32_t **blocks) {
    if (segs == cb->h_segs && n_segs == cb->n_segs) {
        *blocks = cb->d_blocks;
        return cb->d_segs;
    }
    size_t n_blk = 0;
    for (int s = 0; s < n_segs; s++)
        if (segs[s].blocks) n_blk += (size_t)((segs[s].pos0 + segs[s].n_rows + KV_BLOCK - 1) / KV_BLOCK);
    const size_t a = ((size_t)n_segs * sizeof(cu_seg) + 255) & ~(size_t)255;
    char *h = (char *)malloc(a + n_blk * 4 + 4);
    GB_ASSERT(h);
    cu_seg *sg = (cu_seg *)h;
    int32_t *blk = (int32_t *)(h + a);
    size_t off = 0;
    for (int s = 0; s < n_segs; s++) {
        sg[s] = (cu_seg){segs[s].row0, segs[s].n_rows, segs[s].pos0, segs[s].state, (int)off};
        if (segs[s].blocks) {
            const size_t k = (size_t)((segs[s].pos0 + segs[s].n_rows + KV_BLOCK - 1) / KV_BLOCK);
            memcpy(blk + off, segs[s].blocks, k * 4);
            off += k;
        }
    }
    char *d = (char *)stage_put(cb, h, a + off * 4 + 4);
    free(h);
    *blocks = (const int32_t *)(d + a);
    return (const cu_seg *)d;
}

/* ---- devices ---- */

extern "C" int cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" gerbil_status cuda_device_info(int i, char *name, size_t cap, size_t *total_bytes, size_t *free_bytes) {
    const int n = cuda_device_count();
    if (i < 0 || i >= n)
        return err_set(GERBIL_ERR_UNSUPPORTED, "no CUDA device %d (%d found)", i, n);
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) {
        cudaGetLastError();
        return err_set(GERBIL_ERR_UNSUPPORTED, "CUDA device %d: cannot read its properties", i);
    }
    if (name && cap) snprintf(name, cap, "%s (compute %d.%d, %d SMs)", p.name, p.major, p.minor, p.multiProcessorCount);
    size_t fr = 0, tot = p.totalGlobalMem;
    int prev = 0;
    cudaGetDevice(&prev);
    if (cudaSetDevice(i) == cudaSuccess && cudaMemGetInfo(&fr, &tot) != cudaSuccess) cudaGetLastError();
    cudaSetDevice(prev);
    if (total_bytes) *total_bytes = tot;
    if (free_bytes) *free_bytes = fr;
    return GERBIL_OK;
}

extern "C" gerbil_status backend_cuda_new(int device, struct backend **out) {
    *out = NULL;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        cudaGetLastError();
        return err_set(GERBIL_ERR_UNSUPPORTED, "no CUDA device (%s)",
                       e != cudaSuccess ? cudaGetErrorString(e) : "the driver sees none");
    }
    if (device < 0 || device >= n)
        return err_set(GERBIL_ERR_UNSUPPORTED, "no CUDA device %d (this machine has %d: 0..%d)", device, n, n - 1);
    cudaDeviceProp p;
    CU(cudaGetDeviceProperties(&p, device));
    if (p.major < 7)
        return err_set(GERBIL_ERR_UNSUPPORTED, "CUDA device %d (%s) has compute capability %d.%d; this build needs 7.0+",
                       device, p.name, p.major, p.minor);
    struct cuda_backend *cb = (struct cuda_backend *)calloc(1, sizeof *cb);
    if (!cb) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    cb->base.ops = &cuda_ops;
    cb->dev = device;
    if (cudaSetDevice(device) != cudaSuccess || cudaStreamCreateWithFlags(&cb->st, cudaStreamNonBlocking) != cudaSuccess) {
        cudaGetLastError();
        free(cb);
        return err_set(GERBIL_ERR_UNSUPPORTED, "CUDA device %d: cannot create a stream", device);
    }
    *out = &cb->base;
    return GERBIL_OK;
}
