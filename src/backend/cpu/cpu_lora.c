/* The CPU backend's LoRA op (backend.h lora): y += scale * B (A x) per segment of rows.
 * Every row is computed the same way whatever the call (h = A x by fixed-order dot
 * products; B h along the outputs, each output summed over the rank in rank order, in
 * blocks of outputs that do not change any sum), so a row's result never depends on its
 * batch. Threads split the rows, or, for fewer rows than threads, each row's outputs (every
 * thread then forms the row's h itself, the same numbers); small calls run on the caller. AVX2/FMA inner
 * loops (cpu_lora_avx2.c) where the CPU has them. */
#include "backend/cpu/cpu.h"
#include "backend/cpu/kernels.h"
#include "base/status.h"

#include <stddef.h>
#include <string.h>

#ifdef GERBIL_HAVE_X86
float lora_dot_avx2(const float *a, const float *x, int n);
void lora_axpy_avx2(float *z, float h, const float *b, int n);
#endif

static float dot_ref(const float *a, const float *b, int n) {
    float s[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) s[k] += a[i + k] * b[i + k];
    float t = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
    for (; i < n; i++) t += a[i] * b[i];
    return t;
}

static void axpy_ref(float *z, float h, const float *b, int n) {
    for (int i = 0; i < n; i++) z[i] += h * b[i];
}

enum { OUT_BLOCK = 8192 }; /* B^T rows read in long runs (the prefetchers follow them), z in L1/L2 */

struct lora_job {
    float *y;
    const float *x;
    int n_in, n_out, row_lo, row_hi, by_rows, avx2;
    const struct lora_seg *segs;
    int n_segs;
};

static void lora_rows(const struct lora_job *j, int t_lo, int t_hi, int o_lo, int o_hi) {
    float h[LORA_MAX_RANK], z[OUT_BLOCK];
    float (*dot)(const float *, const float *, int) = dot_ref;
    void (*axpy)(float *, float, const float *, int) = axpy_ref;
#ifdef GERBIL_HAVE_X86
    if (j->avx2) {
        dot = lora_dot_avx2;
        axpy = lora_axpy_avx2;
    }
#endif
    for (int s = 0; s < j->n_segs; s++) {
        const struct lora_seg *g = &j->segs[s];
        const int lo = g->row0 > t_lo ? g->row0 : t_lo;
        const int hi = g->row0 + g->n_rows < t_hi ? g->row0 + g->n_rows : t_hi;
        for (int t = lo; t < hi; t++) {
            const float *xt = j->x + (size_t)t * j->n_in;
            float *yt = j->y + (size_t)t * j->n_out;
            for (int r = 0; r < g->rank; r++) h[r] = dot(g->a + (size_t)r * j->n_in, xt, j->n_in);
            for (int o0 = o_lo; o0 < o_hi; o0 += OUT_BLOCK) {
                const int nb = o_hi - o0 < OUT_BLOCK ? o_hi - o0 : OUT_BLOCK;
                memset(z, 0, (size_t)nb * sizeof *z);
                for (int r = 0; r < g->rank; r++) axpy(z, h[r], g->bt + (size_t)r * j->n_out + o0, nb);
                for (int o = 0; o < nb; o++) yt[o0 + o] += g->scale * z[o];
            }
        }
    }
}

static void lora_worker(void *ctx, int ith, int nth) {
    const struct lora_job *j = ctx;
    long lo, hi;
    if (j->by_rows) {
        tp_range(j->row_hi - j->row_lo, ith, nth, &lo, &hi);
        lora_rows(j, j->row_lo + (int)lo, j->row_lo + (int)hi, 0, j->n_out);
    } else {
        tp_range(j->n_out, ith, nth, &lo, &hi);
        lora_rows(j, j->row_lo, j->row_hi, (int)lo, (int)hi);
    }
}

void cpu_lora(struct backend *be, float *y, const float *x, int n_in, int n_out, const struct lora_seg *segs,
              int n_segs) {
    struct cpu_backend *cb = cpu_of(be);
    if (n_segs <= 0) return;
    int lo = segs[0].row0, hi = segs[0].row0 + segs[0].n_rows;
    for (int s = 0; s < n_segs; s++) {
        GB_ASSERT(segs[s].rank > 0 && segs[s].rank <= LORA_MAX_RANK);
        if (segs[s].row0 < lo) lo = segs[s].row0;
        if (segs[s].row0 + segs[s].n_rows > hi) hi = segs[s].row0 + segs[s].n_rows;
    }
    struct lora_job j = {.y = y, .x = x, .n_in = n_in, .n_out = n_out, .row_lo = lo, .row_hi = hi,
                         .by_rows = hi - lo >= tp_n_threads(cb->tp), .avx2 = cpu_has_avx2(), .segs = segs,
                         .n_segs = n_segs};
    /* small calls (decode rows: rank x (n_in + n_out) multiply-adds a row) run on the calling
     * thread: waking the pool costs more than they do (the same numbers either way) */
    long work = 0;
    for (int s = 0; s < n_segs; s++) work += (long)segs[s].n_rows * segs[s].rank * (n_in + n_out);
    if (work < (1L << 20)) {
        j.by_rows = 1;
        lora_worker(&j, 0, 1);
        return;
    }
    tp_run(cb->tp, lora_worker, &j);
}
