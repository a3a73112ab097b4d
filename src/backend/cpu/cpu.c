/* What the CPU backend's op files share (cpu.h): element-wise work split over the pool. */
#include "backend/cpu/cpu.h"

/* Work split over the pool in contiguous ranges; small ranges (decode) run on the caller,
 * where waking the workers would cost more than the work. Each element is computed by
 * exactly one thread, so results do not depend on the count. */
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

void parallel_range(struct cpu_backend *cb, long n, long work_per_item, void (*fn)(void *, long, long), void *ctx) {
    struct range_job j = {.fn = fn, .ctx = ctx, .n = n};
    if (n * work_per_item < (1L << 15) || tp_n_threads(cb->tp) == 1) fn(ctx, 0, n);
    else tp_run(cb->tp, range_worker, &j);
}
