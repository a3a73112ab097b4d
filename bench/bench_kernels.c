/* Matmul micro-benchmark on Qwen3-0.6B shapes (bf16 weights):
 *   decode  (n_tok = 1): GB/s of weights streamed, for one 1024x3072 matrix (fits in
 *           the last-level cache after the first pass) and for a set of them totalling
 *           BIG_BYTES, walked in turn so every call reads from DRAM;
 *   prefill (n_tok = 128, and 512 for the fast kernels): GFLOP/s (2 flops per
 *           multiply-add), weights from DRAM.
 * Each for the reference and the fast kernels, with 1 and 2 threads.
 * Usage: bench_kernels [seconds per measurement, default 0.5] */
#include "backend/cpu/kernels.h"
#include "base/fp16.h"
#include "base/timer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { HID = 1024, FFN = 3072, PREFILL_TOK = 128, LONG_TOK = 512 };
#define BIG_BYTES (1024u << 20)

static unsigned long long rng = 88172645463325252ULL;
static float frand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

struct run {
    threadpool_t *tp;
    float *y;
    const float *x;
    uint16_t **w; /* n_w matrices, used in turn */
    int n_w, n_tok, n_in, n_out;
};

/* Seconds per call: one warm-up call, then calls until `budget` seconds pass (at
 * least 3). Reports the fastest and the median call: the machine may be shared, and
 * other load only ever makes a call slower (with 2 threads on 2 cores, one preempted
 * worker stalls the whole call), so the fastest is the quiet-machine figure. */
enum { MAX_CALLS = 4096 };
static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static void time_calls(const struct run *r, double budget, double *best, double *median) {
    static double times[MAX_CALLS];
    matmul(r->tp, r->y, r->x, r->w[0], GB_TYPE_BF16, r->n_tok, r->n_in, r->n_out);
    double t_end = time_now_s() + budget;
    int calls = 0;
    do {
        double t0 = time_now_s();
        matmul(r->tp, r->y, r->x, r->w[calls % r->n_w], GB_TYPE_BF16, r->n_tok, r->n_in, r->n_out);
        times[calls++] = time_now_s() - t0;
    } while (calls < MAX_CALLS && (calls < 3 || time_now_s() < t_end));
    qsort(times, (size_t)calls, sizeof times[0], cmp_double);
    *best = times[0];
    *median = times[calls / 2];
}

static void report(const char *kname, int nth, const char *what, const struct run *r, double budget,
                   double amount, const char *unit) {
    double best, median;
    time_calls(r, budget, &best, &median);
    printf("%-5s %-3d %-30s %10.1f %10.1f %9.1f %9.1f %s\n", kname, nth, what, best * 1e6, median * 1e6,
           amount / best * 1e-9, amount / median * 1e-9, unit);
}

int main(int argc, char **argv) {
    double budget = argc > 1 ? atof(argv[1]) : 0.5;
    size_t mat = (size_t)HID * FFN;
    int n_big = (int)(BIG_BYTES / (mat * 2));
    uint16_t **w = malloc((size_t)n_big * sizeof *w);
    for (int m = 0; m < n_big; m++) {
        w[m] = malloc(mat * 2);
        for (size_t i = 0; i < mat; i++) w[m][i] = f32_to_bf16(frand() * 0.05f);
    }
    float *x = malloc((size_t)LONG_TOK * FFN * sizeof(float));
    float *y = malloc((size_t)LONG_TOK * FFN * sizeof(float));
    for (size_t i = 0; i < (size_t)LONG_TOK * FFN; i++) x[i] = frand();

    threadpool_t *pools[2] = {tp_create(1), tp_create(2)};
    printf("matmul bf16, W %dx%d (n_out x n_in); avx2 available: %s\n", FFN, HID,
           cpu_has_avx2() ? "yes" : "no");
    printf("%-5s %-3s %-30s %10s %10s %9s %9s\n", "kern", "thr", "case", "best us", "median us",
           "best", "median");
    for (int fast = 0; fast < 2; fast++) {
        cpu_force_ref(!fast);
        const char *kname = fast ? "fast" : "ref";
        double b = fast ? budget : 0.0; /* the reference is slow: 3 calls will do */
        for (int p = 0; p < 2; p++) {
            struct run r = {pools[p], y, x, w, 1, 1, HID, FFN};
            report(kname, p + 1, "decode, cache-resident", &r, b, (double)mat * 2, "GB/s");
            r.n_w = n_big;
            report(kname, p + 1, "decode, from DRAM", &r, b, (double)mat * 2, "GB/s");
            /* Prefill too walks the whole set: weights come from DRAM in a real model. */
            r.n_tok = PREFILL_TOK;
            report(kname, p + 1, "prefill n_tok=128", &r, b, 2.0 * PREFILL_TOK * (double)mat, "GFLOP/s");
            /* The down projection's shape: n_in = 3072, so x panels come from further away. */
            r.n_in = FFN;
            r.n_out = HID;
            report(kname, p + 1, "prefill n_tok=128, n_in=3072", &r, b, 2.0 * PREFILL_TOK * (double)mat,
                   "GFLOP/s");
            if (fast) { /* a long prompt: the x slab outgrows L2 */
                r.n_tok = LONG_TOK;
                report(kname, p + 1, "prefill n_tok=512, n_in=3072", &r, b, 2.0 * LONG_TOK * (double)mat,
                       "GFLOP/s");
            }
        }
    }
    cpu_force_ref(0);
    for (int p = 0; p < 2; p++) tp_free(pools[p]);
    for (int m = 0; m < n_big; m++) free(w[m]);
    free(w); free(x); free(y);
    return 0;
}
