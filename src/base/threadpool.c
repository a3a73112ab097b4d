/* Thread pool with a generation counter: tp_run bumps `gen`, workers that are
 * spinning see it at once; workers that have gone to sleep (after SPIN_ITERS idle
 * polls) are woken through the condition variable. Completion is a countdown the
 * caller spins on. */
#include "base/threadpool.h"
#include "base/status.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

enum { SPIN_ITERS = 1 << 16 };

struct worker {
    threadpool_t *tp;
    int ith;
    pthread_t thread;
};

struct threadpool {
    int n_threads;
    struct worker *workers;       /* [n_threads - 1]: worker 0 is the caller */
    _Atomic unsigned gen;         /* bumped once per job */
    _Atomic int pending;          /* workers still running the current job */
    _Atomic int n_sleeping;
    _Atomic int stop;
    tp_fn fn;
    void *ctx;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

static void *worker_main(void *arg) {
    struct worker *w = arg;
    threadpool_t *tp = w->tp;
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&tp->gen, memory_order_acquire)) == seen &&
               !atomic_load_explicit(&tp->stop, memory_order_acquire)) {
            if (++spins < SPIN_ITERS) { CPU_RELAX(); continue; }
            pthread_mutex_lock(&tp->mu);
            atomic_fetch_add(&tp->n_sleeping, 1);
            while (atomic_load(&tp->gen) == seen && !atomic_load(&tp->stop))
                pthread_cond_wait(&tp->cv, &tp->mu);
            atomic_fetch_sub(&tp->n_sleeping, 1);
            pthread_mutex_unlock(&tp->mu);
            spins = 0;
        }
        if (atomic_load_explicit(&tp->stop, memory_order_acquire)) return NULL;
        seen = g;
        tp->fn(tp->ctx, w->ith, tp->n_threads);
        atomic_fetch_sub_explicit(&tp->pending, 1, memory_order_release);
    }
}

threadpool_t *tp_create(int n_threads) {
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    threadpool_t *tp = calloc(1, sizeof *tp);
    if (!tp) { err_set(GERBIL_ERR_NOMEM, "thread pool: out of memory"); return NULL; }
    tp->n_threads = n_threads;
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->cv, NULL);
    if (n_threads > 1) {
        tp->workers = calloc((size_t)n_threads - 1, sizeof *tp->workers);
        if (!tp->workers) { free(tp); err_set(GERBIL_ERR_NOMEM, "thread pool: out of memory"); return NULL; }
        for (int i = 1; i < n_threads; i++) {
            struct worker *w = &tp->workers[i - 1];
            w->tp = tp;
            w->ith = i;
            if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
                tp->n_threads = i; /* tp_free joins the ones that started */
                tp_free(tp);
                err_set(GERBIL_ERR_NOMEM, "thread pool: cannot start thread %d of %d", i, n_threads);
                return NULL;
            }
        }
    }
    return tp;
}

void tp_free(threadpool_t *tp) {
    if (!tp) return;
    pthread_mutex_lock(&tp->mu);
    atomic_store(&tp->stop, 1);
    pthread_cond_broadcast(&tp->cv);
    pthread_mutex_unlock(&tp->mu);
    for (int i = 1; i < tp->n_threads; i++) pthread_join(tp->workers[i - 1].thread, NULL);
    pthread_mutex_destroy(&tp->mu);
    pthread_cond_destroy(&tp->cv);
    free(tp->workers);
    free(tp);
}

int tp_n_threads(const threadpool_t *tp) { return tp ? tp->n_threads : 1; }

void tp_run(threadpool_t *tp, tp_fn fn, void *ctx) {
    if (!tp || tp->n_threads == 1) { fn(ctx, 0, 1); return; }
    tp->fn = fn;
    tp->ctx = ctx;
    atomic_store_explicit(&tp->pending, tp->n_threads - 1, memory_order_relaxed);
    atomic_fetch_add(&tp->gen, 1); /* seq_cst: pairs with n_sleeping below */
    if (atomic_load(&tp->n_sleeping) > 0) {
        pthread_mutex_lock(&tp->mu);
        pthread_cond_broadcast(&tp->cv);
        pthread_mutex_unlock(&tp->mu);
    }
    fn(ctx, 0, tp->n_threads);
    while (atomic_load_explicit(&tp->pending, memory_order_acquire) > 0) CPU_RELAX();
}
