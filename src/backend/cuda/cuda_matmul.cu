/* Matmuls of the CUDA backend over every stored weight format, and the embedding gather.
 *
 * Each output element is one warp's: lane l dequantizes the 32-element chunks l, l + 32, ...
 * of the weight row (deq32 below, the same values as weight_get_row), sums its products
 * with the input row in element order (fused multiply-adds), and the 32 lane sums are added
 * by a butterfly. A warp runs RT input rows over each dequantized chunk, so a weight row is
 * read once for RT rows; every row's sums are the same operations whatever RT is and
 * whatever else the call holds. Rows of segments of 16 rows or more (prefill) take a tiled
 * GEMM instead (gemm_kernel); the method is chosen by the row's span, so a row's result
 * never depends on its batch (backend.h, batch invariance). */
#include "backend/cuda/cuda_impl.cuh"

#include <stdio.h>

namespace {

__device__ __forceinline__ float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ float bf2f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
__device__ __forceinline__ uint16_t ld16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
__device__ __forceinline__ uint32_t ld32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
__device__ __forceinline__ float sbval(int sbt, const void *p, long long i) {
    if (sbt == 0) return ((const float *)p)[i];
    if (sbt == 1) return h2f(((const uint16_t *)p)[i]);
    return bf2f(((const uint16_t *)p)[i]);
}

enum { MLX_BASE = 100 }; /* template type ids MLX_BASE + bits for MLX affine */

/* Elements 32 j .. 32 j + 31 of weight row o as f32 (quant_ref.c's dequantizers; float
 * rows: n valid elements, the rest 0). */
template <int T>
__device__ __forceinline__ void deq32(const cu_w &w, int o, int j, float *v, int n) {
    const uint8_t *row = w.data + (long long)o * w.row_bytes;
    if constexpr (T == GB_TYPE_F32) {
        const float *r = (const float *)row + 32 * j;
        if (n == 32 && ((uintptr_t)r & 15) == 0) { /* 16-byte loads */
#pragma unroll
            for (int i = 0; i < 32; i += 4) {
                const float4 q = *(const float4 *)(r + i);
                v[i] = q.x, v[i + 1] = q.y, v[i + 2] = q.z, v[i + 3] = q.w;
            }
        } else {
#pragma unroll
            for (int i = 0; i < 32; i++) v[i] = i < n ? r[i] : 0.0f;
        }
    } else if constexpr (T == GB_TYPE_F16 || T == GB_TYPE_BF16) {
        const uint16_t *r = (const uint16_t *)row + 32 * j;
        if (n == 32 && ((uintptr_t)r & 15) == 0) {
#pragma unroll
            for (int i = 0; i < 32; i += 8) {
                const uint4 q = *(const uint4 *)(r + i);
                const uint32_t u[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    const uint16_t lo = (uint16_t)(u[k] & 0xffff), hi = (uint16_t)(u[k] >> 16);
                    v[i + 2 * k] = T == GB_TYPE_F16 ? h2f(lo) : bf2f(lo);
                    v[i + 2 * k + 1] = T == GB_TYPE_F16 ? h2f(hi) : bf2f(hi);
                }
            }
        } else {
#pragma unroll
            for (int i = 0; i < 32; i++) v[i] = i < n ? (T == GB_TYPE_F16 ? h2f(r[i]) : bf2f(r[i])) : 0.0f;
        }
    } else if constexpr (T == GB_TYPE_Q8_0) {
        const uint8_t *b = row + (long long)j * 34;
        const float d = h2f(ld16(b));
#pragma unroll
        for (int i = 0; i < 32; i++) v[i] = (int8_t)b[2 + i] * d;
    } else if constexpr (T == GB_TYPE_Q4_0 || T == GB_TYPE_Q4_1) {
        const int sz = T == GB_TYPE_Q4_0 ? 18 : 20;
        const uint8_t *b = row + (long long)j * sz, *qs = b + (T == GB_TYPE_Q4_0 ? 2 : 4);
        const float d = h2f(ld16(b)), m = T == GB_TYPE_Q4_1 ? h2f(ld16(b + 2)) : 0.0f;
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const int q0 = qs[i] & 15, q1 = qs[i] >> 4;
            if (T == GB_TYPE_Q4_0) { v[i] = (q0 - 8) * d; v[i + 16] = (q1 - 8) * d; }
            else { v[i] = q0 * d + m; v[i + 16] = q1 * d + m; }
        }
    } else if constexpr (T == GB_TYPE_Q5_0 || T == GB_TYPE_Q5_1) {
        const int sz = T == GB_TYPE_Q5_0 ? 22 : 24, hoff = T == GB_TYPE_Q5_0 ? 2 : 4;
        const uint8_t *b = row + (long long)j * sz, *qs = b + hoff + 4;
        const float d = h2f(ld16(b)), m = T == GB_TYPE_Q5_1 ? h2f(ld16(b + 2)) : 0.0f;
        const uint32_t qh = ld32(b + hoff);
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const int q0 = (qs[i] & 15) | ((qh >> i) & 1) << 4, q1 = (qs[i] >> 4) | ((qh >> (i + 16)) & 1) << 4;
            if (T == GB_TYPE_Q5_0) { v[i] = (q0 - 16) * d; v[i + 16] = (q1 - 16) * d; }
            else { v[i] = q0 * d + m; v[i + 16] = q1 * d + m; }
        }
    } else if constexpr (T == GB_TYPE_Q2_K) { /* 84 bytes: scales[16] qs[64] d dmin */
        const uint8_t *b = row + (long long)(j >> 3) * 84;
        const int c = j & 7, h = c >> 2, k = c & 3;
        const float d = h2f(ld16(b + 80)), dmin = h2f(ld16(b + 82));
        const uint8_t *q = b + 16 + h * 32;
#pragma unroll
        for (int part = 0; part < 2; part++) {
            const uint8_t sc = b[h * 8 + k * 2 + part];
            const float dl = d * (sc & 15), ml = dmin * (sc >> 4);
#pragma unroll
            for (int l = 0; l < 16; l++) v[part * 16 + l] = dl * (int8_t)((q[part * 16 + l] >> (2 * k)) & 3) - ml;
        }
    } else if constexpr (T == GB_TYPE_Q3_K) { /* 110 bytes: hmask[32] qs[64] scales[12] d */
        const uint8_t *b = row + (long long)(j >> 3) * 110;
        const int c = j & 7, h = c >> 2, k = c & 3;
        const float d_all = h2f(ld16(b + 108));
        const uint8_t *hm = b, *q = b + 32 + h * 32, *s = b + 96;
        const uint8_t mask = (uint8_t)(1u << (h * 4 + k));
#pragma unroll
        for (int part = 0; part < 2; part++) {
            const int js = h * 8 + k * 2 + part;
            const int lo = js < 8 ? (s[js] & 15) : (s[js - 8] >> 4);
            const int hi = (s[8 + js % 4] >> (2 * (js / 4))) & 3;
            const float dl = d_all * (int8_t)((lo | hi << 4) - 32);
#pragma unroll
            for (int l = part * 16; l < part * 16 + 16; l++)
                v[l] = dl * ((int8_t)((q[l] >> (2 * k)) & 3) - ((hm[l] & mask) ? 0 : 4));
        }
    } else if constexpr (T == GB_TYPE_Q4_K || T == GB_TYPE_Q5_K) { /* d dmin scales[12] (qh[32]) qs[128] */
        const int sz = T == GB_TYPE_Q4_K ? 144 : 176;
        const uint8_t *b = row + (long long)(j >> 3) * sz;
        const int c = j & 7, p = c >> 1;
        const float d = h2f(ld16(b)), dmin = h2f(ld16(b + 2));
        const uint8_t *s = b + 4;
        uint8_t sc, m;
        if (c < 4) { sc = s[c] & 63; m = s[c + 4] & 63; }
        else { sc = (uint8_t)((s[c + 4] & 15) | ((s[c - 4] >> 6) << 4)); m = (uint8_t)((s[c + 4] >> 4) | ((s[c] >> 6) << 4)); }
        const float d1 = d * sc, m1 = dmin * m;
        const uint8_t *qs = b + (T == GB_TYPE_Q4_K ? 16 : 48) + 32 * p, *qh = b + 16;
#pragma unroll
        for (int l = 0; l < 32; l++) {
            int q = (c & 1) ? qs[l] >> 4 : qs[l] & 15;
            if (T == GB_TYPE_Q5_K) q += (qh[l] >> c) & 1 ? 16 : 0;
            v[l] = d1 * q - m1;
        }
    } else if constexpr (T == GB_TYPE_Q6_K) { /* 210 bytes: ql[128] qh[64] scales[16] d */
        const uint8_t *b = row + (long long)(j >> 3) * 210;
        const int c = j & 7, h = c >> 2, k = c & 3;
        const float d = h2f(ld16(b + 208));
        const uint8_t *ql = b + h * 64 + 32 * (k & 1), *qh = b + 128 + h * 32;
        const int8_t *sc = (const int8_t *)(b + 192) + h * 8 + 2 * k;
#pragma unroll
        for (int l = 0; l < 32; l++) {
            const int lo = k < 2 ? ql[l] & 15 : ql[l] >> 4;
            const int q = (int8_t)(lo | ((qh[l] >> (2 * k)) & 3) << 4) - 32;
            v[l] = d * sc[l / 16] * q;
        }
    } else { /* MLX affine, T - MLX_BASE bits: chunk j is `bits` words */
        const int bits = T - MLX_BASE;
        const uint32_t *wd = (const uint32_t *)row + (long long)j * bits;
        const long long g = (long long)o * (w.n_in / w.gs) + (32 * j) / w.gs;
        const float s = sbval(w.sbt, w.sc, g), bb = sbval(w.sbt, w.bi, g);
#pragma unroll
        for (int i = 0; i < 32; i++) {
            const int bit = i * bits, k = bit >> 5, off = bit & 31;
            uint64_t u = wd[k] >> off;
            if (off + bits > 32) u |= (uint64_t)wd[k + 1] << (32 - off);
            v[i] = s * (float)(unsigned)(u & ((1u << bits) - 1u)) + bb;
        }
    }
}

__host__ __device__ constexpr bool is_float_t(int T) { return T == GB_TYPE_F32 || T == GB_TYPE_F16 || T == GB_TYPE_BF16; }

/* y[r][o] for the warp's output o and rows r0 .. r0 + RT - 1 (< n_rows); ids: matmul_id
 * (RT 1, row = blockIdx.y = t * n_sel + s, expert ids[row]). */
template <int T, int RT>
__global__ void __launch_bounds__(128) mm_kernel(float *__restrict__ y, const float *__restrict__ x, cu_w w,
                                                 const float *__restrict__ bias, int n_rows, const int32_t *ids,
                                                 int n_sel, int x_per_slot) {
    const int lane = threadIdx.x & 31, o = blockIdx.x * 4 + (threadIdx.x >> 5);
    if (o >= w.n_out) return;
    const int n_in = w.n_in, nch = (n_in + 31) / 32;
    const int r0 = blockIdx.y * RT;
    if (ids) {
        const int ts = blockIdx.y, e = ids[ts];
        if (e < 0 || e >= w.n_mat) __trap();
        w.data += (long long)e * w.e_data;
        if (w.sc) { w.sc = (const char *)w.sc + (long long)e * w.e_sb; w.bi = (const char *)w.bi + (long long)e * w.e_sb; }
        x += (long long)(x_per_slot ? ts : ts / n_sel) * n_in;
        y += (long long)ts * w.n_out;
    } else {
        x += (long long)r0 * n_in;
        y += (long long)r0 * w.n_out;
    }
    const int nr = ids ? 1 : min(RT, n_rows - r0);
    float acc[RT];
#pragma unroll
    for (int r = 0; r < RT; r++) acc[r] = 0.0f;
    for (int j = lane; j < nch; j += 32) {
        float v[32];
        const int nv = is_float_t(T) ? min(32, n_in - 32 * j) : 32;
        deq32<T>(w, o, j, v, nv);
#pragma unroll
        for (int r = 0; r < RT; r++) {
            if (r < nr) {
                const float *xp = x + (long long)r * n_in + 32 * j;
                float s = acc[r];
                if (is_float_t(T)) {
                    for (int i = 0; i < nv; i++) s = __fmaf_rn(v[i], xp[i], s);
                } else if ((n_in & 3) == 0) {
#pragma unroll
                    for (int i = 0; i < 32; i += 4) {
                        const float4 q = *(const float4 *)(xp + i);
                        s = __fmaf_rn(v[i], q.x, s);
                        s = __fmaf_rn(v[i + 1], q.y, s);
                        s = __fmaf_rn(v[i + 2], q.z, s);
                        s = __fmaf_rn(v[i + 3], q.w, s);
                    }
                } else {
#pragma unroll
                    for (int i = 0; i < 32; i++) s = __fmaf_rn(v[i], xp[i], s);
                }
                acc[r] = s;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < RT; r++) {
        float s = acc[r];
#pragma unroll
        for (int off = 16; off; off >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, off));
        if (lane == 0 && r < nr) y[(long long)r * w.n_out + o] = bias ? __fadd_rn(s, bias[o]) : s;
    }
}

/* y[t][:] = row ids[t] of the table, rows with ids[t] < 0 left alone. */
template <int T>
__global__ void rows_kernel(float *y, cu_w w, const int32_t *ids) {
    const int t = blockIdx.y, id = ids[t];
    if (id < 0) return;
    const int nch = (w.n_in + 31) / 32;
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < nch; j += gridDim.x * blockDim.x) {
        float v[32];
        const int nv = min(32, w.n_in - 32 * j);
        deq32<T>(w, id, j, v, nv);
        float *yt = y + (long long)t * w.n_in + 32 * j;
        for (int i = 0; i < nv; i++) yt[i] = v[i];
    }
}

/* Many rows (prefill): a 64 x 64 tile of y per block of 256 threads, over chunks of 32 of
 * n_in: 64 weight rows dequantized into shared memory once for 64 input rows, each thread
 * 4 rows x 4 outputs. Every output is one fused multiply-add chain over k in order, so a
 * row's bits depend only on its own input (not on the tile it shares). */
enum { GM = 64, GN = 64, GK = 32 };

template <int T>
__global__ void __launch_bounds__(256) gemm_kernel(float *__restrict__ y, const float *__restrict__ x, cu_w w,
                                                   const float *__restrict__ bias, int n_rows) {
    __shared__ __align__(16) float xs[GK][GM + 4];
    __shared__ __align__(16) float ws[GK][GN + 4];
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const int m0 = blockIdx.y * GM, o0 = blockIdx.x * GN, n_in = w.n_in, nch = (n_in + GK - 1) / GK;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
    for (int c = 0; c < nch; c++) {
        const int kv = min(GK, n_in - c * GK);
        if (tid < GN) { /* one weight row's chunk per thread */
            const int o = o0 + tid;
            float v[32];
            if (o < w.n_out) deq32<T>(w, o, c, v, is_float_t(T) ? kv : 32);
            else {
#pragma unroll
                for (int i = 0; i < 32; i++) v[i] = 0.0f;
            }
#pragma unroll
            for (int i = 0; i < 32; i++) ws[i][tid] = v[i];
        }
        for (int e = tid; e < GM * GK; e += 256) { /* x: 64 rows x 32, coalesced along k */
            const int r = e / GK, k = e % GK;
            xs[k][r] = m0 + r < n_rows && k < kv ? x[(long long)(m0 + r) * n_in + c * GK + k] : 0.0f;
        }
        __syncthreads();
#pragma unroll 8
        for (int k = 0; k < GK; k++) {
            const float4 a = *(const float4 *)&xs[k][ty * 4], b = *(const float4 *)&ws[k][tx * 4];
            const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] = __fmaf_rn(av[i], bv[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int r = m0 + ty * 4 + i;
        if (r >= n_rows) continue;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int o = o0 + tx * 4 + j;
            if (o < w.n_out) y[(long long)r * w.n_out + o] = bias ? __fadd_rn(acc[i][j], bias[o]) : acc[i][j];
        }
    }
}

cu_w cu_weight(const struct gb_weight *w) {
    cu_w c = {};
    c.data = (const uint8_t *)w->data;
    c.row_bytes = (long long)w->row_bytes;
    c.n_in = (int)w->n_in;
    c.n_out = (int)w->n_out;
    c.n_mat = 1;
    if (w->kind == GB_WEIGHT_MLX) {
        c.sc = w->scales;
        c.bi = w->biases;
        c.bits = w->bits;
        c.gs = w->group_size;
        c.sbt = w->sb_type == GB_TYPE_F32 ? 0 : w->sb_type == GB_TYPE_F16 ? 1 : 2;
    }
    return c;
}

int type_id(const struct gb_weight *w) { return w->kind == GB_WEIGHT_MLX ? MLX_BASE + w->bits : (int)w->type; }

template <int T>
void launch_t(cudaStream_t st, float *y, const float *x, const cu_w &w, const float *bias, int n, const int32_t *ids,
              int n_sel, int x_per_slot, int gemm) {
    const dim3 blk(128);
    if (gemm) {
        gemm_kernel<T><<<dim3((w.n_out + GN - 1) / GN, (n + GM - 1) / GM), 256, 0, st>>>(y, x, w, bias, n);
    } else if (ids) {
        mm_kernel<T, 1><<<dim3((w.n_out + 3) / 4, n), blk, 0, st>>>(y, x, w, bias, n, ids, n_sel, x_per_slot);
    } else if (n < 4) {
        mm_kernel<T, 1><<<dim3((w.n_out + 3) / 4, n), blk, 0, st>>>(y, x, w, bias, n, NULL, 0, 0);
    } else if (n >= 32) { /* batched decode: a weight row read once for 32 rows */
        mm_kernel<T, 32><<<dim3((w.n_out + 3) / 4, (n + 31) / 32), blk, 0, st>>>(y, x, w, bias, n, NULL, 0, 0);
    } else {
        mm_kernel<T, 8><<<dim3((w.n_out + 3) / 4, (n + 7) / 8), blk, 0, st>>>(y, x, w, bias, n, NULL, 0, 0);
    }
    CU_LAUNCHED();
}

template <int T>
void launch_rows(cudaStream_t st, float *y, const cu_w &w, const int32_t *ids, int n) {
    const int nch = (w.n_in + 31) / 32;
    rows_kernel<T><<<dim3((nch + 63) / 64, n), 64, 0, st>>>(y, w, ids);
    CU_LAUNCHED();
}

#define GB_CUDA_TYPES(X)                                                                                          \
    X(GB_TYPE_F32) X(GB_TYPE_F16) X(GB_TYPE_BF16) X(GB_TYPE_Q8_0) X(GB_TYPE_Q4_0) X(GB_TYPE_Q4_1) X(GB_TYPE_Q5_0) \
    X(GB_TYPE_Q5_1) X(GB_TYPE_Q2_K) X(GB_TYPE_Q3_K) X(GB_TYPE_Q4_K) X(GB_TYPE_Q5_K) X(GB_TYPE_Q6_K)               \
    X(MLX_BASE + 2) X(MLX_BASE + 3) X(MLX_BASE + 4) X(MLX_BASE + 5) X(MLX_BASE + 6) X(MLX_BASE + 8)

void launch(cudaStream_t st, float *y, const float *x, const cu_w &w, int tid, const float *bias, int n,
            const int32_t *ids, int n_sel, int x_per_slot, int gemm = 0) {
    switch (tid) {
#define X(T) case T: launch_t<T>(st, y, x, w, bias, n, ids, n_sel, x_per_slot, gemm); return;
        GB_CUDA_TYPES(X)
#undef X
    default: gb_abort(__FILE__, __LINE__, "cuda matmul: a weight format weight_prepare refused");
    }
}

} // namespace

/* Whether the kernels read w; why not into why. */
int cu_weight_supported(const struct gb_weight *w, char *why, size_t cap) {
    if (w->packed) { snprintf(why, cap, "it was rearranged for another backend"); return 0; }
    if (w->kind == GB_WEIGHT_MLX) {
        const int b = w->bits;
        if (b != 2 && b != 3 && b != 4 && b != 5 && b != 6 && b != 8) {
            snprintf(why, cap, "MLX %d-bit weights are not supported (2, 3, 4, 5, 6, 8 are)", b);
            return 0;
        }
        if (w->group_size % 32 || w->n_in % w->group_size) {
            snprintf(why, cap, "MLX group size %d does not split rows of %lld into 32-element chunks", w->group_size,
                     (long long)w->n_in);
            return 0;
        }
        if (w->sb_type != GB_TYPE_F32 && w->sb_type != GB_TYPE_F16 && w->sb_type != GB_TYPE_BF16) {
            snprintf(why, cap, "MLX scales of type %s", type_name(w->sb_type));
            return 0;
        }
        return 1;
    }
    switch ((int)w->type) {
#define X(T) case T:
        GB_CUDA_TYPES(X)
#undef X
        return 1;
    default: snprintf(why, cap, "weights of type %s have no CUDA kernel", type_name(w->type)); return 0;
    }
}

/* Rows whose span (their segment's rows in this call) is at least this take the tiled GEMM,
 * the others the per-row kernel (backend.h: the method by span, never by the call's size). */
enum { GEMM_MIN_SPAN = 16 };

void cu_matmul(struct cuda_backend *cb, float *y, const float *x, const struct gb_weight *w, const float *bias,
               struct gb_rows r) {
    if (r.n <= 0) return;
    int split = r.n; /* rows [0, split) per row, [split, n) GEMM; spans are non-decreasing */
    if (!r.span) split = r.n >= GEMM_MIN_SPAN ? 0 : r.n;
    else {
        int lo = 0, hi = r.n;
        while (lo < hi) {
            const int mid = lo + (hi - lo) / 2;
            if (r.span[mid] >= GEMM_MIN_SPAN) hi = mid;
            else lo = mid + 1;
        }
        split = lo;
    }
    const cu_w cw = cu_weight(w);
    if (split > 0) launch(cb->st, y, x, cw, type_id(w), bias, split, NULL, 0, 0);
    if (split < r.n)
        launch(cb->st, y + (size_t)split * (size_t)w->n_out, x + (size_t)split * (size_t)w->n_in, cw, type_id(w), bias,
               r.n - split, NULL, 0, 0, 1);
}

void cu_matmul_id(struct cuda_backend *cb, float *y, const float *x, int x_per_slot, const struct gb_weight *stack,
                  int n_mat, const int32_t *ids, int n_sel, int n) {
    if (n <= 0 || n_sel <= 0) return;
    cu_w w = cu_weight(&stack[0]);
    w.n_mat = n_mat;
    if (n_mat > 1) {
        w.e_data = (const char *)stack[1].data - (const char *)stack[0].data;
        if (stack[0].kind == GB_WEIGHT_MLX) w.e_sb = (const char *)stack[1].scales - (const char *)stack[0].scales;
        for (int e = 2; e < n_mat; e++) /* one tensor's experts: equally spaced (weights.c split_stack) */
            GB_ASSERT((const char *)stack[e].data - (const char *)stack[e - 1].data == w.e_data);
    }
    launch(cb->st, y, x, w, type_id(&stack[0]), NULL, n * n_sel, ids, n_sel, x_per_slot);
}

void cu_get_rows(struct cuda_backend *cb, float *y, const struct gb_weight *table, const int32_t *ids, int n) {
    if (n <= 0) return;
    const int32_t *d_ids = (const int32_t *)cu_dev_array(cb, ids, (size_t)n * sizeof *ids);
    const cu_w w = cu_weight(table);
    switch (type_id(table)) {
#define X(T) case T: launch_rows<T>(cb->st, y, w, d_ids, n); return;
        GB_CUDA_TYPES(X)
#undef X
    default: gb_abort(__FILE__, __LINE__, "cuda get_rows: a weight format weight_prepare refused");
    }
}
