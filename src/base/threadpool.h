/* One thread pool per model. tp_run splits a job over n_threads workers (the caller
 * is worker 0) and returns when all are done. Workers spin briefly before sleeping so
 * the wake-up cost is small against a decode step. */
#ifndef GB_THREADPOOL_H
#define GB_THREADPOOL_H

typedef struct threadpool threadpool_t;

/* fn(ctx, ith, nth): worker ith of nth. */
typedef void (*tp_fn)(void *ctx, int ith, int nth);

/* n_threads <= 0: number of online CPUs. Returns NULL on failure (message set). */
threadpool_t *tp_create(int n_threads);
void tp_free(threadpool_t *tp);
int tp_n_threads(const threadpool_t *tp);
/* Run fn on every worker; tp may be NULL (runs fn(ctx, 0, 1) inline). */
void tp_run(threadpool_t *tp, tp_fn fn, void *ctx);

/* Split [0, n) into nth nearly equal parts; part ith is [*lo, *hi). */
static inline void tp_range(long n, int ith, int nth, long *lo, long *hi) {
    long q = n / nth, r = n % nth;
    *lo = ith * q + (ith < r ? ith : r);
    *hi = *lo + q + (ith < r ? 1 : 0);
}

#endif
