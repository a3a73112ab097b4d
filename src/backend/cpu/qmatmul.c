/* matmul over quantized weights (tensor/weight.h): y[t][o] = dot(w row o, x row t).
 *
 * GGML block types: each row of x is quantized once per call into `work` -- Q8_K
 * blocks for the k-quants, struct qx8 blocks (32 int8 + f32 scale + scaled sum) for
 * the 32-element types -- and each output is a sum of integer dot products inside
 * blocks, scaled by the blocks' f16 scales (ggml's vec_dot_*_q8_* scheme). Integer
 * block sums are exact, so the fast and the scalar kernels differ only in the order
 * of the f32 adds that combine them.
 *
 * MLX affine: w = s q + b per group, so dot(w, x) = sum_g s_g (q . x)_g + b_g xsum_g.
 * x is quantized per 32 elements to 16 bits (struct qx16), so (q . x)_g is a sum over
 * the group's blocks of dx_b * (exact integer dot), and xsum_g is the sum of the
 * quantized x (sum of the blocks' s), so the whole error is w . (x~ - x), as for the
 * GGML types, but 256 times smaller. Measured: 8-bit activations moved the logits of
 * the MLX golden models by up to 0.5 x RMS (unsigned codes with the bias outside the
 * integer dot amplify it), against the 2e-2 x RMS the issue asks for; f32
 * activations (codes widened to floats) ran MLX 4-bit decode at 5 GB/s from L3;
 * 16-bit integers keep the error near f32's and cost half the f32 instructions
 * (vpmaddwd on codes widened to 16 bits). For the AVX2 4-bit kernel each block's
 * 16-bit x is permuted to the order in which it unpacks nibbles.
 *
 * Threading as in kernels.c: output rows are cut into chunks taken from a shared
 * counter; each y element is computed by one kernel call whose arithmetic depends
 * on n_in and n_tok only, so results never depend on the thread count. */
#include "backend/cpu/kernels.h"
#include "base/fp16.h"
#include "base/status.h"
#include "tensor/quant.h"
#include "tensor/quant_ref.h"
#include "tensor/weight.h"

#include "backend/cpu/mlx_packed.h"
#include "backend/cpu/qmatmul_avx2.h" /* struct qx8, qx16; kernels called on x86 only */
#include "backend/cpu/qmatmul_vnni.h" /* the same, fused multiply-adds, where AVX512-VNNI is */
#include "backend/cpu/qmatmul_avx512.h" /* MLX 4/8-bit, 512-bit vectors, where AVX-512 is */
#include "backend/cpu/gemm_avx512.h" /* prefill GEMMs, where AVX512-BF16 is */

#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Activations of the 32-element types are struct qx8 (qmatmul_avx2.h): x ~ d * qs;
 * s = d * sum(qs), which the offset types (Q4_0's -8, Q4_1's m, ...) multiply
 * instead of summing qs again. */
_Static_assert(sizeof(struct qx8) == 40, "qx8");
_Static_assert(sizeof(struct qx16) == 72, "qx16");
_Static_assert(sizeof(struct qx128) == 384, "qx128");

/* ---- CPU check for the AVX-512 kernels (here: qmatmul_avx512.c is compiled for AVX-512
 * throughout, so not even its CPU check may run before the check) ------------------- */

static _Atomic int avx512_off;

int qmatmul_has_avx512(void) {
#ifdef GERBIL_HAVE_X86
    static _Atomic int has = -1; /* first calls may race: all compute the same value */
    if (atomic_load_explicit(&avx512_off, memory_order_relaxed)) return 0;
    int h = atomic_load_explicit(&has, memory_order_relaxed);
    if (h < 0) {
        __builtin_cpu_init();
        h = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
        atomic_store_explicit(&has, h, memory_order_relaxed);
    }
    return h && cpu_has_avx2(); /* not cached: 0 while cpu_force_ref */
#else
    return 0;
#endif
}

void qmatmul_disable_avx512(int on) {
    atomic_store_explicit(&avx512_off, on ? 1 : 0, memory_order_relaxed);
    cpu_isa_changed();
}

int qmatmul_has_bf16(void) {
#ifdef GERBIL_HAVE_X86
    static _Atomic int has = -1;
    int h = atomic_load_explicit(&has, memory_order_relaxed);
    if (h < 0) {
        __builtin_cpu_init();
        h = __builtin_cpu_supports("avx512bf16");
        atomic_store_explicit(&has, h, memory_order_relaxed);
    }
    return h && qmatmul_has_avx512();
#else
    return 0;
#endif
}

/* Prompts of at least this many tokens go through the prefill GEMMs (gemm_avx512.c), which
 * unpack each weight once per call. Where they overtake the 512-bit per-token kernels
 * (`bench_qmatmul 0.25 FMT gemm`, 3072 x 1024, 1 thread, Zen 5): Q4_K, Q6_K, Q8_0 between 32
 * and 64 tokens (at 32: 170-183 against 197-209 GFLOP/s; at 64: 228-247 against 197-205);
 * MLX 4-bit (codes straight into the panel) at 16-24 (16: 207 / 208; 24: 241 / 210); end to
 * end (gerbil bench, 2 threads, with the per-token kernels' rows in blocks) pp24 ran 257-264
 * tok/s through the GEMM against 273-282, pp32 300-308 against 284-293. At 512 tokens the
 * GEMMs run 1.5-1.8x the per-token kernels. */
enum { GEMM_MIN_TOK_BF16 = 48, GEMM_MIN_TOK_MLX = 32 };
static _Atomic int gemm_min_tok = -1; /* -1: the defaults above */

void qmatmul_set_gemm_min_tok(int n) {
    atomic_store_explicit(&gemm_min_tok, n < 0 ? -1 : n, memory_order_relaxed);
}

/* k matrices' chunks taken from one counter, matrix i owning chunks first[i] .. first[i + 1]
 * - 1: the next chunk's index within its matrix (that matrix in *i), or -1 when none is left. */
static int claim_chunk(_Atomic int *next, const int *first, int k, int *i) {
    int c = atomic_fetch_add_explicit(next, 1, memory_order_relaxed), m = 0;
    if (c >= first[k]) return -1;
    while (c >= first[m + 1]) m++;
    *i = m;
    return c - first[m];
}

/* f32/f16/bf16 rows: matmul() (kernels.c), never the quantized paths */
static int is_float_plain(const struct gb_weight *w) {
    return w->kind == GB_WEIGHT_PLAIN &&
           (w->type == GB_TYPE_F32 || w->type == GB_TYPE_F16 || w->type == GB_TYPE_BF16);
}

/* ---- the prefill GEMMs (gemm_avx512.c): x prepared once, row panels of 32 over
 * the threads; k matrices reading the same x (q/k/v, gate/up) share its preparation and
 * one pass over the pool, their panels claimed from one counter ---------------------- */

enum { GEMM_ROWS = 32, GEMM_MULTI = 4 };

struct gjob {
    float *y[GEMM_MULTI];
    const struct gb_weight *w[GEMM_MULTI];
    int k, first[GEMM_MULTI + 1]; /* matrix i owns panels first[i] .. first[i + 1] - 1 */
    const float *x;
    enum gemm_kind kind;
    uint32_t *xp;      /* x in GEMM tiles (bf16, or 16-bit integers for MLX), then */
    float *xd, *xsum;  /* MLX: per token and group, the step and the sum of the quantized x */
    char *panels;      /* per thread, panel_bytes each: its weight panel (gemm_panel_bytes) */
    size_t panel_bytes;
    int n_tok, ng;
    _Atomic int next;
};

static void gemm_prep_worker(void *ctx, int ith, int nth) {
    struct gjob *j = ctx;
    long lo, hi;
    tp_range(j->n_tok, ith, nth, &lo, &hi);
    size_t n = (size_t)j->w[0]->n_in;
    for (long t = lo; t < hi; t++) {
        if (j->kind == GEMM_BF16)
            gemm_bf16_x_avx512(j->x + (size_t)t * n, (int)n, (int)t, j->xp);
        else
            gemm_mlx_x_avx512(j->x + (size_t)t * n, (int)n, j->w[0]->group_size, (int)t, j->xp,
                              j->xd + (size_t)t * (size_t)j->ng, j->xsum + (size_t)t * (size_t)j->ng);
    }
}

static void gemm_worker(void *ctx, int ith, int nth) {
    (void)nth;
    struct gjob *j = ctx;
    void *pan = j->panels + (size_t)ith * j->panel_bytes;
    for (int i, c; (c = claim_chunk(&j->next, j->first, j->k, &i)) >= 0;) {
        const struct gb_weight *w = j->w[i];
        int n_out = (int)w->n_out, o = c * GEMM_ROWS;
        int nr = n_out - o < GEMM_ROWS ? n_out - o : GEMM_ROWS;
        if (j->kind == GEMM_BF16)
            gemm_bf16_rows_avx512(w, o, nr, j->xp, j->n_tok, j->y[i], (size_t)n_out, pan);
        else
            gemm_mlx_rows_avx512(w, o, nr, j->xp, j->xd, j->xsum, (size_t)j->ng, j->n_tok, j->y[i], (size_t)n_out,
                                 pan);
    }
}

/* y[i] = x . w[i]^T, i < k, through the GEMMs, whatever n_tok (the callers choose by
 * matmul_w_min_span); 1 when it ran (the CPU and the formats allow it: one GEMM kind, the
 * same n_in and, for MLX, group size). */
static int gemm_run(threadpool_t *tp, int k, float *const *y, const float *x, const struct gb_weight *const *w,
                    int n_tok, void *work) {
#ifdef GERBIL_HAVE_X86
    if (k < 1 || k > GEMM_MULTI || !qmatmul_has_bf16()) return 0;
    struct gjob j = {.x = x, .kind = gemm_kind_of(w[0]), .n_tok = n_tok, .k = k};
    if (j.kind == GEMM_NONE || n_tok < 1) return 0;
    for (int i = 0; i < k; i++) {
        if (is_float_plain(w[i]) || gemm_kind_of(w[i]) != j.kind || w[i]->n_in != w[0]->n_in ||
            (j.kind == GEMM_MLX16 && w[i]->group_size != w[0]->group_size))
            return 0;
        j.w[i] = w[i];
        j.y[i] = y[i];
        j.first[i + 1] = j.first[i] + (int)((w[i]->n_out + GEMM_ROWS - 1) / GEMM_ROWS);
    }
    j.xp = (uint32_t *)(((uintptr_t)work + 63) & ~(uintptr_t)63);
    if (j.kind == GEMM_MLX16) {
        j.ng = (int)(w[0]->n_in / w[0]->group_size);
        j.xd = (float *)(j.xp + gemm_x_words(n_tok, (int)w[0]->n_in, GEMM_T));
        j.xsum = j.xd + (size_t)n_tok * (size_t)j.ng;
    }
    atomic_init(&j.next, 0);
    int nth = tp_n_threads(tp);
    /* the panels (up to ~290 KB a thread) from the heap, not the stack of whichever thread calls;
     * without them the per-token kernels do the work */
    j.panel_bytes = (gemm_panel_bytes(w[0]) + 63) & ~(size_t)63;
    j.panels = aligned_alloc(64, j.panel_bytes * (size_t)nth);
    if (!j.panels) return 0;
    if (nth > 1 && n_tok >= 4) tp_run(tp, gemm_prep_worker, &j);
    else gemm_prep_worker(&j, 0, 1);
    if (nth > 1) tp_run(tp, gemm_worker, &j);
    else gemm_worker(&j, 0, 1);
    free(j.panels);
    return 1;
#else
    (void)tp; (void)k; (void)y; (void)x; (void)w; (void)n_tok; (void)work;
    return 0;
#endif
}

/* One weight row (n elements) against nt tokens of prepared activations:
 * y[u * ldy] = dot(row, xq + u * xs bytes). */
typedef void (*qdot_fn)(int n, const void *row, const void *xq, size_t xs, int nt, float *y, size_t ldy);
/* The same for nr <= 4 consecutive rows (rb bytes apart; row r's values at y[u * ldy + r]);
 * with one token (nt == 1), any nr. */
typedef void (*qrows_fn)(int n, int nr, const void *row0, size_t rb, const void *xq, size_t xs, int nt, float *y,
                         size_t ldy);

enum act_kind {
    ACT_NONE, ACT_X8, ACT_Q8K,
    ACT_X64, /* struct qx64, the AVX-512 Q8_0 kernel */
    ACT_XK, ACT_XK4 /* struct qxk, the AVX-512 k-quant kernels: natural order (Q6_K), nibble order (Q4_K/Q5_K) */
};

/* ---- activation quantization ---------------------------------------------------- */

/* Round to nearest even for |v| < 2^22 (what lrintf does in the default rounding
 * mode, without the libm call): adding 1.5 * 2^23 leaves no fraction bits. */
static inline int round_near(float v) { v = v < 4194304.0f ? (v > -4194304.0f ? v : v == v ? -4194304.0f : 0.0f) : (v == v ? 4194304.0f : 0.0f); return (int)((v + 12582912.0f) - 12582912.0f); } /* NaN/Inf activations (broken weights): clamped, not UB */

/* fmaxf(m, |v|) for m >= 0 (a NaN v leaves m), without the libm call fmaxf is at -O2
 * (it was 2.6% of a Q4_K_M prefill) */
static inline float max_abs(float m, float v) {
    float a = fabsf(v);
    return a > m ? a : m;
}

static void quantize_x8(const float *x, struct qx8 *b, int n) {
    for (int i = 0; i < n / 32; i++, x += 32) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = max_abs(amax, x[j]);
        float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
        int sum = 0;
        for (int j = 0; j < 32; j++) {
            int q = round_near(x[j] * id);
            b[i].qs[j] = (int8_t)q;
            sum += q;
        }
        b[i].d = d;
        b[i].s = d * (float)sum;
    }
}

/* 16-bit blocks; perm: store each block's even elements first, then the odd ones. */
static void quantize_x16(const float *x, struct qx16 *b, int n, int perm) {
    for (int i = 0; i < n / 32; i++, x += 32) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = max_abs(amax, x[j]);
        float d = amax / 32767.0f, id = amax > 0.0f ? 32767.0f / amax : 0.0f;
        int sum = 0;
        for (int j = 0; j < 32; j++) {
            int q = round_near(x[j] * id);
            b[i].qs[perm ? (j & 1) * 16 + j / 2 : j] = (int16_t)q;
            sum += q;
        }
        b[i].d = d;
        b[i].s = d * (float)sum;
    }
}

static void quantize_q8K(const float *x, block_q8_K *b, int n) {
    for (int i = 0; i < n / QK_K; i++, x += QK_K) {
        float amax = 0.0f;
        for (int j = 0; j < QK_K; j++) amax = max_abs(amax, x[j]);
        float id = amax > 0.0f ? 127.0f / amax : 0.0f;
        b[i].d = amax / 127.0f;
        for (int g = 0; g < QK_K / 16; g++) {
            int sum = 0;
            for (int j = 16 * g; j < 16 * g + 16; j++) {
                int q = round_near(x[j] * id);
                b[i].qs[j] = (int8_t)q;
                sum += q;
            }
            b[i].bsums[g] = (int16_t)sum;
        }
    }
}

/* ---- scalar kernels: 32-element types -------------------------------------------- */

/* Weights of one 32-element block as integers q (w = d q + m) into q[32]. */
static inline float unpack32(enum gb_type t, const uint8_t *blk, int q[32], float *m) {
    *m = 0.0f;
    switch (t) {
    case GB_TYPE_Q8_0: {
        const block_q8_0 *b = (const block_q8_0 *)blk;
        for (int j = 0; j < 32; j++) q[j] = b->qs[j];
        return f16_to_f32(b->d);
    }
    case GB_TYPE_Q4_0: {
        const block_q4_0 *b = (const block_q4_0 *)blk;
        for (int j = 0; j < 16; j++) { q[j] = b->qs[j] & 15; q[j + 16] = b->qs[j] >> 4; }
        *m = -8.0f; /* in units of d: handled by the caller through s */
        return f16_to_f32(b->d);
    }
    case GB_TYPE_Q4_1: {
        const block_q4_1 *b = (const block_q4_1 *)blk;
        for (int j = 0; j < 16; j++) { q[j] = b->qs[j] & 15; q[j + 16] = b->qs[j] >> 4; }
        *m = f16_to_f32(b->m);
        return f16_to_f32(b->d);
    }
    case GB_TYPE_Q5_0:
    case GB_TYPE_Q5_1: {
        const uint8_t *qh4, *qs;
        float d;
        if (t == GB_TYPE_Q5_0) {
            const block_q5_0 *b = (const block_q5_0 *)blk;
            qh4 = b->qh; qs = b->qs; d = f16_to_f32(b->d);
            *m = -16.0f;
        } else {
            const block_q5_1 *b = (const block_q5_1 *)blk;
            qh4 = b->qh; qs = b->qs; d = f16_to_f32(b->d);
            *m = f16_to_f32(b->m);
        }
        uint32_t qh = (uint32_t)qh4[0] | (uint32_t)qh4[1] << 8 | (uint32_t)qh4[2] << 16 | (uint32_t)qh4[3] << 24;
        for (int j = 0; j < 16; j++) {
            q[j] = (qs[j] & 15) | (int)((qh >> j) & 1) << 4;
            q[j + 16] = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
        }
        return d;
    }
    default: GB_ASSERT(!"unpack32: not a 32-element type"); return 0.0f;
    }
}

/* Per block: sumi = sum q * qx (exact); y += (dw dx) sumi + offset term, where the
 * offset term is m s for Q4_1/Q5_1 (m in real units) and (o dw) s for Q4_0/Q5_0
 * (o = -8 or -16 in units of dw). */
static inline void qdot32_generic(enum gb_type t, size_t bsz, int n, const void *row, const void *xq,
                                  size_t xs, int nt, float *y, size_t ldy) {
    for (int u = 0; u < nt; u++) {
        const struct qx8 *xb = (const struct qx8 *)((const char *)xq + (size_t)u * xs);
        float acc = 0.0f;
        for (int i = 0; i < n / 32; i++) {
            int q[32];
            float m;
            float d = unpack32(t, (const uint8_t *)row + (size_t)i * bsz, q, &m);
            int sumi = 0;
            for (int j = 0; j < 32; j++) sumi += q[j] * xb[i].qs[j];
            float off = (t == GB_TYPE_Q4_0 || t == GB_TYPE_Q5_0) ? m * d : m;
            acc += d * xb[i].d * (float)sumi + off * xb[i].s;
        }
        y[(size_t)u * ldy] = acc;
    }
}

static void qdot_q8_0_generic(int n, const void *r, const void *xq, size_t xs, int nt, float *y, size_t ldy) {
    qdot32_generic(GB_TYPE_Q8_0, sizeof(block_q8_0), n, r, xq, xs, nt, y, ldy);
}
static void qdot_q4_0_generic(int n, const void *r, const void *xq, size_t xs, int nt, float *y, size_t ldy) {
    qdot32_generic(GB_TYPE_Q4_0, sizeof(block_q4_0), n, r, xq, xs, nt, y, ldy);
}
static void qdot_q4_1_generic(int n, const void *r, const void *xq, size_t xs, int nt, float *y, size_t ldy) {
    qdot32_generic(GB_TYPE_Q4_1, sizeof(block_q4_1), n, r, xq, xs, nt, y, ldy);
}
static void qdot_q5_0_generic(int n, const void *r, const void *xq, size_t xs, int nt, float *y, size_t ldy) {
    qdot32_generic(GB_TYPE_Q5_0, sizeof(block_q5_0), n, r, xq, xs, nt, y, ldy);
}
static void qdot_q5_1_generic(int n, const void *r, const void *xq, size_t xs, int nt, float *y, size_t ldy) {
    qdot32_generic(GB_TYPE_Q5_1, sizeof(block_q5_1), n, r, xq, xs, nt, y, ldy);
}

/* ---- scalar kernels: k-quants -------------------------------------------------------- */

/* A super-block as w = d sc[g] q - dmin mn[g] for the 16 groups g of 16 elements. */
struct kunpack {
    int8_t q[QK_K];
    int sc[16], mn[16];
    float d, dmin;
};

/* The 6-bit scale and min of sub-block j (of 8) in Q4_K/Q5_K's 12 scale bytes. */
static inline void scale_min_k4(int j, const uint8_t *s, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

static inline void unpack_k(enum gb_type t, const uint8_t *blk, struct kunpack *k) {
    switch (t) {
    case GB_TYPE_Q2_K: {
        const block_q2_K *b = (const block_q2_K *)blk;
        k->d = f16_to_f32(b->d);
        k->dmin = f16_to_f32(b->dmin);
        for (int g = 0; g < 16; g++) { k->sc[g] = b->scales[g] & 15; k->mn[g] = b->scales[g] >> 4; }
        /* element 128 h + 32 j + l (l < 32) is bits 2j of qs[32 h + l] */
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 4; j++)
                for (int l = 0; l < 32; l++) k->q[128 * h + 32 * j + l] = (int8_t)((b->qs[32 * h + l] >> (2 * j)) & 3);
        return;
    }
    case GB_TYPE_Q3_K: {
        const block_q3_K *b = (const block_q3_K *)blk;
        k->d = f16_to_f32(b->d);
        k->dmin = 0.0f;
        /* 16 6-bit scales: low 4 bits from bytes 0..7 (low then high nibbles), high 2
         * bits from bytes 8..11 */
        const uint8_t *s = b->scales;
        for (int g = 0; g < 16; g++) {
            int lo = g < 8 ? s[g] & 15 : s[g - 8] >> 4;
            int hi = (s[8 + (g & 3)] >> (2 * (g >> 2))) & 3;
            k->sc[g] = (lo | hi << 4) - 32;
            k->mn[g] = 0;
        }
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 4; j++)
                for (int l = 0; l < 32; l++) {
                    int q = (b->qs[32 * h + l] >> (2 * j)) & 3;
                    int hb = (b->hmask[l] >> (4 * h + j)) & 1;
                    k->q[128 * h + 32 * j + l] = (int8_t)(q - (hb ? 0 : 4));
                }
        return;
    }
    case GB_TYPE_Q4_K:
    case GB_TYPE_Q5_K: {
        const uint8_t *scales, *qs, *qh = NULL;
        if (t == GB_TYPE_Q4_K) {
            const block_q4_K *b = (const block_q4_K *)blk;
            k->d = f16_to_f32(b->d); k->dmin = f16_to_f32(b->dmin);
            scales = b->scales; qs = b->qs;
        } else {
            const block_q5_K *b = (const block_q5_K *)blk;
            k->d = f16_to_f32(b->d); k->dmin = f16_to_f32(b->dmin);
            scales = b->scales; qs = b->qs; qh = b->qh;
        }
        for (int j = 0; j < 8; j++) {
            int sc, mn;
            scale_min_k4(j, scales, &sc, &mn);
            k->sc[2 * j] = k->sc[2 * j + 1] = sc;
            k->mn[2 * j] = k->mn[2 * j + 1] = mn;
        }
        /* element 64 c + l: low nibble of qs[32 c + l]; 64 c + 32 + l: high nibble;
         * Q5_K's fifth bit of sub-block j is bit j of qh[l] */
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                int lo = qs[32 * c + l] & 15, hi = qs[32 * c + l] >> 4;
                if (qh) {
                    lo |= ((qh[l] >> (2 * c)) & 1) << 4;
                    hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
                }
                k->q[64 * c + l] = (int8_t)lo;
                k->q[64 * c + 32 + l] = (int8_t)hi;
            }
        return;
    }
    case GB_TYPE_Q6_K: {
        const block_q6_K *b = (const block_q6_K *)blk;
        k->d = f16_to_f32(b->d);
        k->dmin = 0.0f;
        for (int g = 0; g < 16; g++) { k->sc[g] = b->scales[g]; k->mn[g] = 0; }
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
            int8_t *q = k->q + 128 * h;
            for (int l = 0; l < 32; l++) {
                q[l] = (int8_t)(((ql[l] & 15) | ((qh[l] & 3) << 4)) - 32);
                q[l + 32] = (int8_t)(((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32);
                q[l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                q[l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
            }
        }
        return;
    }
    default: GB_ASSERT(!"unpack_k: not a k-quant"); return;
    }
}

/* Per super-block: sumi = sum_g sc[g] (q . qx)_g, summ = sum_g mn[g] bsums[g] (both
 * exact); y += (d dx) sumi - (dmin dx) summ. */
static inline void qdotK_generic(enum gb_type t, size_t bsz, int n, const void *row, const void *xq,
                                 size_t xs, int nt, float *y, size_t ldy) {
    float acc[16];
    GB_ASSERT(nt <= 16);
    for (int u = 0; u < nt; u++) acc[u] = 0.0f;
    for (int i = 0; i < n / QK_K; i++) {
        struct kunpack k;
        unpack_k(t, (const uint8_t *)row + (size_t)i * bsz, &k);
        for (int u = 0; u < nt; u++) {
            const block_q8_K *xb = (const block_q8_K *)((const char *)xq + (size_t)u * xs) + i;
            int sumi = 0, summ = 0;
            for (int g = 0; g < 16; g++) {
                int s = 0;
                for (int l = 16 * g; l < 16 * g + 16; l++) s += k.q[l] * xb->qs[l];
                sumi += k.sc[g] * s;
                summ += k.mn[g] * xb->bsums[g];
            }
            acc[u] += k.d * xb->d * (float)sumi - k.dmin * xb->d * (float)summ;
        }
    }
    for (int u = 0; u < nt; u++) y[(size_t)u * ldy] = acc[u];
}

#define QDOTK(name, T, B)                                                                          \
    static void qdot_##name##_generic(int n, const void *r, const void *xq, size_t xs, int nt,     \
                                      float *y, size_t ldy) {                                      \
        for (int u = 0; u < nt; u += 16)                                                           \
            qdotK_generic(T, sizeof(B), n, r, (const char *)xq + (size_t)u * xs, xs,               \
                          nt - u < 16 ? nt - u : 16, y + (size_t)u * ldy, ldy);                    \
    }
QDOTK(q2_K, GB_TYPE_Q2_K, block_q2_K)
QDOTK(q3_K, GB_TYPE_Q3_K, block_q3_K)
QDOTK(q4_K, GB_TYPE_Q4_K, block_q4_K)
QDOTK(q5_K, GB_TYPE_Q5_K, block_q5_K)
QDOTK(q6_K, GB_TYPE_Q6_K, block_q6_K)
#undef QDOTK

/* ---- GGML type table ----------------------------------------------------------------- */

struct qkernel {
    enum act_kind act;     /* activations of the scalar kernel (and of fast, unless fast_act) */
    qdot_fn generic, fast; /* fast: NULL where only the scalar kernel exists */
    enum act_kind fast_act;
    qrows_fn fast_rows;    /* replaces fast where set: 4 rows per call */
};

static struct qkernel qkernel_of(enum gb_type t) {
    struct qkernel k = {ACT_NONE, NULL, NULL, ACT_NONE, NULL};
    switch (t) {
    case GB_TYPE_Q8_0: k = (struct qkernel){ACT_X8, qdot_q8_0_generic, NULL, ACT_NONE, NULL}; break;
    case GB_TYPE_Q4_0: k = (struct qkernel){ACT_X8, qdot_q4_0_generic, NULL, ACT_NONE, NULL}; break;
    case GB_TYPE_Q4_1: k = (struct qkernel){ACT_X8, qdot_q4_1_generic, NULL, ACT_NONE, NULL}; break;
    case GB_TYPE_Q5_0: k = (struct qkernel){ACT_X8, qdot_q5_0_generic, NULL, ACT_NONE, NULL}; break;
    case GB_TYPE_Q5_1: k = (struct qkernel){ACT_X8, qdot_q5_1_generic, NULL, ACT_NONE, NULL}; break;
    case GB_TYPE_Q2_K: k = (struct qkernel){ACT_Q8K, qdot_q2_K_generic, NULL, ACT_NONE, NULL}; break;
    case GB_TYPE_Q3_K: k = (struct qkernel){ACT_Q8K, qdot_q3_K_generic, NULL, ACT_NONE, NULL}; break;
    case GB_TYPE_Q4_K: k = (struct qkernel){ACT_Q8K, qdot_q4_K_generic, NULL, ACT_NONE, NULL}; break;
    case GB_TYPE_Q5_K: k = (struct qkernel){ACT_Q8K, qdot_q5_K_generic, NULL, ACT_NONE, NULL}; break;
    case GB_TYPE_Q6_K: k = (struct qkernel){ACT_Q8K, qdot_q6_K_generic, NULL, ACT_NONE, NULL}; break;
    default: break;
    }
#ifdef GERBIL_HAVE_X86
    switch (t) {
    case GB_TYPE_Q8_0: k.fast = qdot_q8_0_avx2; k.fast_rows = qrows_q8_0_avx2; break; /* rows: over VNNI's too */
    case GB_TYPE_Q4_0: k.fast = qdot_q4_0_avx2; break;
    case GB_TYPE_Q4_K: k.fast = qdot_q4_K_avx2; break;
    case GB_TYPE_Q5_K: k.fast = qdot_q5_K_avx2; break;
    case GB_TYPE_Q6_K: k.fast = qdot_q6_K_avx2; break;
    default: break;
    }
    if (qmatmul_has_vnni()) {
        switch (t) {
        case GB_TYPE_Q8_0: k.fast = qdot_q8_0_vnni; break;
        case GB_TYPE_Q4_K: k.fast = qdot_q4_K_vnni; break;
        case GB_TYPE_Q5_K: k.fast = qdot_q5_K_vnni; break;
        case GB_TYPE_Q6_K: k.fast = qdot_q6_K_vnni; break;
        default: break;
        }
    }
    if (qmatmul_has_avx512()) {
        switch (t) {
        case GB_TYPE_Q8_0: k.fast_rows = qrows_q8_0_avx512; k.fast_act = ACT_X64; break;
        case GB_TYPE_Q4_K: k.fast_rows = qrows_q4_K_avx512; k.fast_act = ACT_XK4; break;
        case GB_TYPE_Q5_K: k.fast_rows = qrows_q5_K_avx512; k.fast_act = ACT_XK4; break;
        case GB_TYPE_Q6_K: k.fast_rows = qrows_q6_K_avx512; k.fast_act = ACT_XK; break;
        default: break;
        }
    }
#endif
    if (k.fast_act == ACT_NONE) k.fast_act = k.act;
    return k;
}

static size_t act_row_bytes(enum act_kind a, int64_t n_in) {
    switch (a) {
    case ACT_X8: return (size_t)(n_in / 32) * sizeof(struct qx8);
    case ACT_Q8K: return (size_t)(n_in / QK_K) * sizeof(block_q8_K);
    case ACT_X64: return (size_t)((n_in / 32 + 1) / 2) * sizeof(struct qx64);
    case ACT_XK:
    case ACT_XK4: return (size_t)(n_in / QK_K) * sizeof(struct qxk);
    default: return 0;
    }
}

/* ---- MLX affine ------------------------------------------------------------------------ */

/* Code c of a row's little-endian bit stream of `bits`-wide codes (nbytes long). */
static inline int mlx_code(const uint8_t *codes, size_t nbytes, int bits, size_t c) {
    size_t bit = c * (size_t)bits, byte = bit >> 3;
    unsigned v = codes[byte];
    if (byte + 1 < nbytes) v |= (unsigned)codes[byte + 1] << 8;
    return (int)((v >> (bit & 7)) & ((1u << bits) - 1u));
}

/* Per group g: gacc = sum over its blocks b of dx_b * (q . qx)_b (exact integer dots);
 * tot[g & 1] += scale_g gacc; then y = (tot0 + tot1) + sum_g bias_g xsum_g. The AVX2
 * kernels sum the same terms in another order. */
static void mlxdot_generic(int n, int gs, int bits, const uint8_t *codes, size_t nbytes,
                           const void *sc, const void *bi, enum gb_type sbt, const struct qx16 *xq,
                           size_t xs, const float *gsum, size_t gstr, int nt, float *y, size_t ldy) {
    int ng = n / gs;
    for (int u = 0; u < nt; u++) {
        const struct qx16 *xu = (const struct qx16 *)((const char *)xq + (size_t)u * xs);
        const float *gu = gsum + (size_t)u * gstr;
        float tot[2] = {0.0f, 0.0f}, bsum = 0.0f;
        for (int g = 0; g < ng; g++) {
            float gacc = 0.0f;
            for (int b = g * gs / 32; b < (g + 1) * gs / 32; b++) {
                int sumi = 0;
                for (int i = 0; i < 32; i++) sumi += mlx_code(codes, nbytes, bits, (size_t)(32 * b + i)) * xu[b].qs[i];
                gacc += xu[b].d * (float)sumi;
            }
            tot[g & 1] += mlx_sb_value(sbt, sc, (size_t)g) * gacc;
        }
        for (int g = 0; g < ng; g++) bsum += mlx_sb_value(sbt, bi, (size_t)g) * gu[g];
        y[(size_t)u * ldy] = (tot[0] + tot[1]) + bsum;
    }
}

/* ---- driver ------------------------------------------------------------------------------ */

enum {
    CHUNKS_PER_THREAD = 8,        /* see kernels.c */
    MIN_PARALLEL_MACS = 1 << 16,  /* below this, waking the pool costs more than it saves */
    XBLOCK_BYTES = 256 << 10,     /* prepared x of one token block stays in L2 */
    MAX_NT = 16,                  /* tokens per kernel call */
    MAX_PACKED_N = 1 << 16,       /* longest packed row (the fallback's stack copy) */
};

struct qjob {
    float *y;
    const float *x;
    const struct gb_weight *w;
    int n_tok, fast;
    /* GGML */
    enum act_kind act;
    qdot_fn fn;
    qrows_fn rows_fn; /* instead of fn where set */
    const char *xq;
    size_t xs;
    /* MLX: x quantized in xq (qx16, permuted for the AVX2 4-bit kernel) and */
    float *gsum;       /* [n_tok][n_in / gs] group sums of the quantized x */
    int permuted;
    int x512;          /* the AVX-512 kernels: x as struct qx128 chunks */
    int packed;        /* 4-bit packed rows: mlxdot4p_avx512, x as struct qx512 */
    int chunk;
    _Atomic int next;
};

/* Prepare activations of tokens [t0, t1). */
static void prep_tokens(struct qjob *j, int t0, int t1) {
    const struct gb_weight *w = j->w;
    int n = (int)w->n_in;
    for (int t = t0; t < t1; t++) {
        const float *xt = j->x + (size_t)t * (size_t)n;
        if (w->kind == GB_WEIGHT_MLX) {
            int gs = w->group_size, ng = n / gs;
#ifdef GERBIL_HAVE_X86
            if (j->packed) {
                mlx_quant_x4p_avx512(xt, n, gs, (struct qx512 *)(j->xq + (size_t)t * j->xs), j->gsum + (size_t)t * (size_t)ng);
                continue;
            }
            if (j->x512) {
                mlx_quant_x_avx512(xt, n, w->bits, gs, (struct qx128 *)(j->xq + (size_t)t * j->xs),
                                   j->gsum + (size_t)t * (size_t)ng);
                continue;
            }
#endif
            struct qx16 *qt = (struct qx16 *)(j->xq + (size_t)t * j->xs);
            quantize_x16(xt, qt, n, j->permuted);
            float *gt = j->gsum + (size_t)t * (size_t)ng;
            for (int g = 0; g < ng; g++) {
                float s = 0.0f;
                for (int b = g * gs / 32; b < (g + 1) * gs / 32; b++) s += qt[b].s;
                gt[g] = s;
            }
#ifdef GERBIL_HAVE_X86
        } else if (j->act == ACT_X64) {
            q8_quant_x_avx512(xt, n, (struct qx64 *)(j->xq + (size_t)t * j->xs));
        } else if (j->act == ACT_XK || j->act == ACT_XK4) {
            qk_quant_x_avx512(xt, n, j->act == ACT_XK4, (struct qxk *)(j->xq + (size_t)t * j->xs));
#endif
        } else if (j->act == ACT_X8) {
            quantize_x8(xt, (struct qx8 *)(j->xq + (size_t)t * j->xs), n);
        } else {
            quantize_q8K(xt, (block_q8_K *)(j->xq + (size_t)t * j->xs), n);
        }
    }
}

static void prep_worker(void *ctx, int ith, int nth) {
    struct qjob *j = ctx;
    long lo, hi;
    tp_range(j->n_tok, ith, nth, &lo, &hi);
    prep_tokens(j, (int)lo, (int)hi);
}

/* mlxdot_generic for packed row o: the row put back in MLX's order first. */
static __attribute__((noinline)) void mlxdot_generic_packed(const struct gb_weight *w, int o, const void *sc,
                                                            const void *bi, const struct qx16 *x, size_t xs,
                                                            const float *g, size_t gstr, int nt, float *y) {
    uint32_t words[MAX_PACKED_N / 8];
    int n = (int)w->n_in;
    GB_ASSERT(n <= MAX_PACKED_N);
    cpu_mlx_words(w, o, 0, (size_t)n / 8, words);
    mlxdot_generic(n, w->group_size, w->bits, (const uint8_t *)words, (size_t)n / 2, sc, bi, w->sb_type, x, xs, g,
                   gstr, nt, y, (size_t)w->n_out);
}

/* Rows o..o + nr - 1 (nr <= 4 with the AVX-512 kernels, any when packed, else 1). */
static void mlx_rows(struct qjob *j, int o, int nr, int u0, int nt) {
    const struct gb_weight *w = j->w;
    int n = (int)w->n_in, gs = w->group_size, ng = n >> __builtin_ctz((unsigned)gs); /* no idiv per row */
    size_t esz = w->sb_type == GB_TYPE_F32 ? 4 : 2;
    const uint8_t *codes = (const uint8_t *)w->data + (size_t)o * w->row_bytes;
    const char *sc = (const char *)w->scales + (size_t)o * (size_t)ng * esz;
    const char *bi = (const char *)w->biases + (size_t)o * (size_t)ng * esz;
    const struct qx16 *x = (const struct qx16 *)(j->xq + (size_t)u0 * j->xs);
    const float *g = j->gsum + (size_t)u0 * (size_t)ng;
    float *y = j->y + (size_t)u0 * (size_t)w->n_out + o;
#ifdef GERBIL_HAVE_X86
    if (j->packed) {
        mlxdot4p_avx512(n, gs, w->n_out, w->data, w->row_bytes, w->scales, w->biases, (size_t)ng * esz, w->sb_type, o,
                        nr, (const struct qx512 *)x, j->xs, g, (size_t)ng, nt, y, (size_t)w->n_out);
        return;
    }
    if (j->x512) {
        (w->bits == 4 ? mlxdot4_avx512 : mlxdot8_avx512)(n, gs, nr, codes, w->row_bytes, sc, bi, (size_t)ng * esz,
                                                         w->sb_type, x, j->xs, g, (size_t)ng, nt, y,
                                                         (size_t)w->n_out);
        return;
    }
    if (j->fast && w->bits == 4 && !w->packed) {
        mlxdot4_avx2(n, gs, codes, sc, bi, w->sb_type, x, j->xs, g, (size_t)ng, nt, y, (size_t)w->n_out);
        return;
    }
    if (j->fast && w->bits == 8) {
        mlxdot8_avx2(n, gs, codes, sc, bi, w->sb_type, x, j->xs, g, (size_t)ng, nt, y, (size_t)w->n_out);
        return;
    }
#endif
    if (w->packed) { /* without the AVX-512 kernels (switched off) */
        GB_ASSERT(nr == 1);
        mlxdot_generic_packed(w, o, sc, bi, x, j->xs, g, (size_t)ng, nt, y);
        return;
    }
    mlxdot_generic(n, gs, w->bits, codes, (size_t)n * (size_t)w->bits / 8, sc, bi, w->sb_type, x, j->xs,
                   g, (size_t)ng, nt, y, (size_t)w->n_out);
}

static void row_worker(void *ctx, int ith, int nth) {
    struct qjob *j = ctx;
    const struct gb_weight *w = j->w;
    int n_out = (int)w->n_out, n_in = (int)w->n_in;
    int tb = (int)(XBLOCK_BYTES / j->xs);
    if (tb < 4) tb = 4;
    for (;;) {
        long o_lo = (long)atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed) * j->chunk;
        if (o_lo >= n_out) return;
        int o_hi = o_lo + j->chunk < n_out ? (int)o_lo + j->chunk : n_out;
        /* token blocks whose prepared x stays in L2; within one, each weight row is
         * read once (from L1 after the first kernel call) for all its tokens */
        for (int t0 = 0; t0 < j->n_tok; t0 += tb) {
            int t1 = j->n_tok - t0 < tb ? j->n_tok : t0 + tb;
            if (j->packed) { /* the whole chunk per call (per-4-row calls were 2.6% of decode), for
                              * MAX_NT tokens at a time: their x stays in L1 */
                for (int u = t0; u < t1; u += MAX_NT)
                    mlx_rows(j, (int)o_lo, o_hi - (int)o_lo, u, t1 - u < MAX_NT ? t1 - u : MAX_NT);
                continue;
            }
            if (j->rows_fn && j->n_tok == 1) { /* decode: the whole chunk in one call */
                j->rows_fn(n_in, o_hi - (int)o_lo, (const char *)w->data + (size_t)o_lo * w->row_bytes, w->row_bytes,
                           j->xq, j->xs, 1, j->y + o_lo, (size_t)n_out);
                continue;
            }
            int rstep = j->x512 || j->rows_fn ? 4 : 1; /* rows per kernel call */
            for (int o = (int)o_lo; o < o_hi; o += rstep) {
                for (int u = t0; u < t1; u += MAX_NT) {
                    int nt = t1 - u < MAX_NT ? t1 - u : MAX_NT;
                    int nr = o_hi - o < rstep ? o_hi - o : rstep;
                    if (w->kind == GB_WEIGHT_MLX) {
                        mlx_rows(j, o, nr, u, nt);
                    } else if (j->rows_fn) {
                        j->rows_fn(n_in, nr, (const char *)w->data + (size_t)o * w->row_bytes, w->row_bytes,
                                   j->xq + (size_t)u * j->xs, j->xs, nt, j->y + (size_t)u * (size_t)n_out + o,
                                   (size_t)n_out);
                    } else {
                        j->fn(n_in, (const char *)w->data + (size_t)o * w->row_bytes, j->xq + (size_t)u * j->xs,
                              j->xs, nt, j->y + (size_t)u * (size_t)n_out + o, (size_t)n_out);
                    }
                }
            }
        }
    }
}

/* Rows per work item: all of them on one thread, else CHUNKS_PER_THREAD items per thread. */
static int row_chunk(int64_t n_out, int nth) {
    long n_chunks = (long)nth * CHUNKS_PER_THREAD;
    return nth == 1 ? (int)n_out : (int)((n_out + n_chunks - 1) / n_chunks);
}

int qmatmul_wants_pack(const struct gb_weight *w) {
    return w->kind == GB_WEIGHT_MLX && w->bits == 4 && !w->packed && w->group_size >= 32 && w->group_size <= 128 &&
           w->n_in > 0 && w->n_in % 128 == 0 && w->n_in <= MAX_PACKED_N && cpu_has_avx2() && qmatmul_has_avx512();
}

void qmatmul_pack(struct gb_weight *w) {
    GB_ASSERT(qmatmul_wants_pack(w));
    mlx4_pack(w);
}

size_t matmul_w_work_size(const struct gb_weight *w, int n_tok) {
    if (n_tok <= 0 || is_float_plain(w)) return 0;
    size_t a, b;
    if (w->kind == GB_WEIGHT_MLX) { /* any activation layout */
        a = (size_t)(w->n_in + 127) / 128 * sizeof(struct qx128);
        b = (size_t)(w->n_in + 511) / 512 * sizeof(struct qx512);
        a = (a > b ? a : b) + (size_t)(w->n_in / w->group_size) * sizeof(float);
    } else {
        struct qkernel k = qkernel_of(w->type);
        a = act_row_bytes(k.act, w->n_in);
        b = act_row_bytes(k.fast_act, w->n_in);
        if (b > a) a = b;
    }
    a *= (size_t)n_tok;
    /* the GEMMs' x: token tiles of bf16 pairs, or of 16-bit pairs + 2 floats per group (MLX) */
    b = gemm_x_words(n_tok, (int)w->n_in, GEMM_T) * 4;
    if (w->kind == GB_WEIGHT_MLX) b += (size_t)n_tok * (size_t)(w->n_in / w->group_size) * 8;
    return 64 + (a > b ? a : b); /* any kernel's activations, 64-byte aligned */
}

/* ---- the plan: the kernels of a weight, chosen once ---------------------------------------- */

enum mm_kind { MM_FLOAT, MM_GGML, MM_MLX, MM_REF /* a type without kernels: the oracle */ };

void matmul_w_plan(const struct gb_weight *w, struct mm_plan *p) {
    memset(p, 0, sizeof *p);
    p->epoch = cpu_isa_epoch();
    p->fast = cpu_has_avx2();
#ifdef GERBIL_HAVE_X86
    p->gemm = p->fast && qmatmul_has_bf16() ? gemm_kind_of(w) : GEMM_NONE;
#else
    p->gemm = GEMM_NONE;
#endif
    if (is_float_plain(w)) {
        p->kind = MM_FLOAT;
        return;
    }
    if (w->kind == GB_WEIGHT_MLX) {
        /* group sizes are powers of two (32, 64, 128): the kernels divide by shifts */
        GB_ASSERT(w->bits >= 2 && w->bits <= 8 && w->group_size >= 32 && (w->group_size & (w->group_size - 1)) == 0 &&
                  w->n_in % w->group_size == 0);
        p->kind = MM_MLX;
        p->x512 = p->fast && (w->bits == 4 || w->bits == 8) && w->group_size <= 128 && w->n_in % 128 == 0 &&
                  qmatmul_has_avx512();
        p->packed = p->x512 && w->packed;
        if (w->packed) GB_ASSERT(w->bits == 4 && w->n_in <= MAX_PACKED_N);
        p->permuted = p->fast && w->bits == 4 && !w->packed;
        p->xs = p->packed ? (size_t)(w->n_in + 511) / 512 * sizeof(struct qx512)
                : p->x512 ? (size_t)(w->n_in / 128) * sizeof(struct qx128)
                          : (size_t)(w->n_in / 32) * sizeof(struct qx16);
        return;
    }
    struct qkernel k = qkernel_of(w->type);
    if (k.act == ACT_NONE) {
        p->kind = MM_REF;
        return;
    }
    GB_ASSERT(w->n_in % type_traits(w->type)->block_size == 0);
    p->kind = MM_GGML;
    int use_fast = p->fast && (k.fast || k.fast_rows);
    p->act = use_fast ? k.fast_act : k.act;
    p->fn = (void (*)(void))(use_fast && k.fast ? k.fast : k.generic);
    p->rows_fn = (void (*)(void))(use_fast ? k.fast_rows : NULL);
    p->xs = act_row_bytes(p->act, w->n_in);
}

/* w's plan: the one made at weight_prepare while the ISA switches stand, else a fresh one in *tmp. */
static const struct mm_plan *plan_of(const struct gb_weight *w, struct mm_plan *tmp) {
    const struct mm_plan *p = w->plan;
    if (p && p->epoch == cpu_isa_epoch()) return p;
    matmul_w_plan(w, tmp);
    return tmp;
}

static int min_span_of(const struct mm_plan *p) {
    if (p->kind == MM_FLOAT) return 2; /* the prefill tiles from 2 tokens, the decode kernel for 1 */
    if (p->gemm == GEMM_NONE) return INT_MAX;
    int min_tok = atomic_load_explicit(&gemm_min_tok, memory_order_relaxed);
    if (min_tok < 0) min_tok = p->gemm == GEMM_MLX16 ? GEMM_MIN_TOK_MLX : GEMM_MIN_TOK_BF16;
    return min_tok == 0 ? INT_MAX : min_tok;
}

int matmul_w_min_span(const struct gb_weight *w) {
    struct mm_plan tmp;
    return min_span_of(plan_of(w, &tmp));
}

void matmul_w(threadpool_t *tp, float *y, const float *x, const struct gb_weight *w, int n_tok, void *work) {
    matmul_w_method(tp, y, x, w, n_tok, work, n_tok >= matmul_w_min_span(w));
}

void matmul_w_method(threadpool_t *tp, float *y, const float *x, const struct gb_weight *w, int n_tok, void *work,
                     int many) {
    GB_ASSERT(n_tok >= 0 && w->n_in >= 0 && w->n_out >= 0);
    if (n_tok == 0 || w->n_out == 0) return;
    struct mm_plan tmp;
    const struct mm_plan *p = plan_of(w, &tmp);
    if (p->kind == MM_FLOAT) {
        (many ? matmul : matmul_per_token)(tp, y, x, w->data, w->type, n_tok, (int)w->n_in, (int)w->n_out);
        return;
    }
    if (p->kind == MM_REF) { /* no kernel for this type: the reference, correct but slow */
        matmul_w_ref(y, x, w, n_tok);
        return;
    }
    if (many && p->gemm != GEMM_NONE && gemm_run(tp, 1, &y, x, &w, n_tok, work)) return;
    struct qjob j = {.y = y, .x = x, .w = w, .n_tok = n_tok, .fast = p->fast, .act = (enum act_kind)p->act,
                     .fn = (qdot_fn)p->fn, .rows_fn = (qrows_fn)p->rows_fn, .x512 = p->x512, .packed = p->packed,
                     .permuted = p->permuted, .xs = p->xs};
    atomic_init(&j.next, 0);
    j.xq = (char *)(((uintptr_t)work + 63) & ~(uintptr_t)63); /* 64-byte loads: no line splits */
    if (p->kind == MM_MLX) j.gsum = (float *)(j.xq + (size_t)n_tok * j.xs);
    if (w->n_in == 0) {
        for (size_t i = 0; i < (size_t)n_tok * (size_t)w->n_out; i++) y[i] = 0.0f;
        return;
    }
    double macs = (double)n_tok * (double)w->n_in * (double)w->n_out;
    int nth = macs < MIN_PARALLEL_MACS ? 1 : tp_n_threads(tp);
    if (nth > 1 && n_tok >= 4) tp_run(tp, prep_worker, &j);
    else prep_tokens(&j, 0, n_tok);
    if (nth == 1) {
        j.chunk = (int)w->n_out;
        row_worker(&j, 0, 1);
    } else {
        j.chunk = row_chunk(w->n_out, nth);
        if (j.x512 || j.rows_fn) j.chunk = (j.chunk + 3) & ~3; /* whole 4-row tiles (packed: quads) */
        tp_run(tp, row_worker, &j);
    }
}

/* ---- decode: several MLX 4-bit matrices against one token ---------------------------------
 * q/k/v and gate/up read the same x: one x preparation and one tp_run for all of them
 * (3 + 2 pool round trips per layer become 2). Chunks as matmul_w's for each matrix, taken
 * from one counter; each row is computed by the same kernel call on the same prepared x,
 * so the results are matmul_w's bit for bit. */

enum { MULTI_MAX = 4 };

struct mjob {
    struct qjob j[MULTI_MAX];
    int k, first[MULTI_MAX + 1]; /* matrix i owns chunks first[i] .. first[i + 1] - 1 */
    _Atomic int next;
};

static void multi_worker(void *ctx, int ith, int nth) {
    struct mjob *m = ctx;
    (void)ith;
    (void)nth;
    for (int i, c; (c = claim_chunk(&m->next, m->first, m->k, &i)) >= 0;) {
        struct qjob *j = &m->j[i];
        int n_out = (int)j->w->n_out, o_lo = c * j->chunk;
        int o_hi = o_lo + j->chunk < n_out ? o_lo + j->chunk : n_out;
        mlx_rows(j, o_lo, o_hi - o_lo, 0, 1);
    }
}

int matmul_w_multi(threadpool_t *tp, int k, float *const *y, const float *x, const struct gb_weight *const *w,
                   int n_tok, void *work) {
    return matmul_w_multi_method(tp, k, y, x, w, n_tok, work, n_tok > 1 && n_tok >= matmul_w_min_span(w[0]));
}

int matmul_w_multi_method(threadpool_t *tp, int k, float *const *y, const float *x,
                          const struct gb_weight *const *w, int n_tok, void *work, int many) {
#ifdef GERBIL_HAVE_X86
    if (many) return cpu_has_avx2() && gemm_run(tp, k, y, x, w, n_tok, work); /* prefill */
    if (n_tok != 1 || k < 1 || k > MULTI_MAX) return 0;
    const struct gb_weight *w0 = w[0];
    for (int i = 0; i < k; i++) {
        struct mm_plan tmp;
        if (!plan_of(w[i], &tmp)->packed || w[i]->n_in != w0->n_in || w[i]->group_size != w0->group_size ||
            w[i]->n_out <= 0) /* the packed MLX 4-bit kernels for all, one x */
            return 0;
    }
    int n = (int)w0->n_in, gs = w0->group_size; /* packed: 4-bit, n % 128 == 0, gs in 32..128 */
    struct mjob m;
    m.k = k;
    atomic_init(&m.next, 0);
    char *xq = (char *)(((uintptr_t)work + 63) & ~(uintptr_t)63);
    size_t xs = (size_t)(n + 511) / 512 * sizeof(struct qx512);
    float *gsum = (float *)(xq + xs);
    mlx_quant_x4p_avx512(x, n, gs, (struct qx512 *)xq, gsum);
    double macs = 0.0;
    for (int i = 0; i < k; i++) macs += (double)w[i]->n_in * (double)w[i]->n_out;
    int nth = macs < MIN_PARALLEL_MACS ? 1 : tp_n_threads(tp);
    m.first[0] = 0;
    for (int i = 0; i < k; i++) {
        struct qjob *j = &m.j[i];
        memset(j, 0, sizeof *j);
        j->y = y[i];
        j->x = x;
        j->w = w[i];
        j->n_tok = 1;
        j->fast = 1;
        j->x512 = j->packed = 1;
        j->xq = xq;
        j->xs = xs;
        j->gsum = gsum;
        j->chunk = (row_chunk(w[i]->n_out, nth) + 3) & ~3; /* whole quads */
        m.first[i + 1] = m.first[i] + (int)((w[i]->n_out + j->chunk - 1) / j->chunk);
    }
    if (nth == 1) multi_worker(&m, 0, 1);
    else tp_run(tp, multi_worker, &m);
    return 1;
#else
    (void)tp; (void)k; (void)y; (void)x; (void)w; (void)n_tok; (void)work; (void)many;
    return 0;
#endif
}
