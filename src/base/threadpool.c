/* Thread pool with a generation counter: tp_run bumps `gen`, workers that are
 * spinning see it at once; workers that have gone to sleep (after SPIN_ITERS idle
 * polls) are woken through the condition variable.
 *
 * Each worker's share (fn(ctx, i, nth)) of job g is claimed once, by a compare-and-swap
 * of claimed[i] from g - 1 to g: by worker i when it sees the job, or by the caller
 * once its own share is done, which then runs it itself. The caller waits only for the
 * shares workers claimed (done[i] == g). A worker that is not running when the job
 * comes (the other core busy with another process) so costs its share's time on the
 * caller, not a scheduler time slice: with the machine's 2 cores shared (load ~4),
 * waiting for every worker ran a 2-thread MLX 4-bit matmul at 1.3 GB/s against 25 on 1
 * thread. Results are unchanged: share i is the same call whoever runs it. */
#include "base/threadpool.h"
#include "base/status.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

/* Spinning threads yield every YIELD_EVERY polls (pause is ~33 ns on this Zen 5 VM, so
 * ~8 us; a sched_yield ~2 us): where other processes share the cores, a worker or caller
 * spinning on a core keeps a thread of this pool that is runnable there waiting. 2 threads
 * at load ~3: decode spent 31% of its samples spinning in worker_main and tp_run; at load
 * ~5, MLX 4-bit tg64 18-20 -> 23-29 tok/s. On an idle core the call returns at once. */
enum { SPIN_ITERS = 1 << 16, YIELD_EVERY = 256 };

struct worker {
    threadpool_t *tp;
    int ith;
    pthread_t thread;
    _Atomic unsigned claimed; /* the last job whose share ith someone took */
    _Atomic unsigned done;    /* the last job whose share this worker finished */
};

struct threadpool {
    int n_threads;
    struct worker *workers;       /* [n_threads - 1]: worker 0 is the caller */
    _Atomic unsigned gen;         /* bumped once per job */
    _Atomic int n_sleeping;
    _Atomic int stop;
    tp_fn fn;
    void *ctx;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

/* One poll of a spinning thread: pause, or yield every YIELD_EVERY polls. */
static void spin_pause(int spins) {
    if (spins % YIELD_EVERY == 0) sched_yield();
    else CPU_RELAX();
}

/* Take share w->ith of job g for the calling thread; 0 where someone took it already. */
static int claim(struct worker *w, unsigned g) {
    unsigned expect = g - 1u;
    return atomic_compare_exchange_strong_explicit(&w->claimed, &expect, g, memory_order_acq_rel,
                                                   memory_order_relaxed);
}

static void *worker_main(void *arg) {
    struct worker *w = arg;
    threadpool_t *tp = w->tp;
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&tp->gen, memory_order_acquire)) == seen &&
               !atomic_load_explicit(&tp->stop, memory_order_acquire)) {
            if (++spins < SPIN_ITERS) {
                spin_pause(spins);
                continue;
            }
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
        /* fails where the caller ran this share already (and may have started job g + 1:
         * the next poll sees that one) */
        if (!claim(w, g)) continue;
        tp->fn(tp->ctx, w->ith, tp->n_threads);
        atomic_store_explicit(&w->done, g, memory_order_release);
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
            atomic_init(&w->claimed, 0u); /* gen starts at 0: job 1 claims from 0 */
            atomic_init(&w->done, 0u);
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
    unsigned g = atomic_fetch_add(&tp->gen, 1) + 1u; /* seq_cst: pairs with n_sleeping below */
    if (atomic_load(&tp->n_sleeping) > 0) {
        pthread_mutex_lock(&tp->mu);
        pthread_cond_broadcast(&tp->cv);
        pthread_mutex_unlock(&tp->mu);
    }
    fn(ctx, 0, tp->n_threads);
    for (int i = 1; i < tp->n_threads; i++) {
        struct worker *w = &tp->workers[i - 1];
        if (claim(w, g)) fn(ctx, i, tp->n_threads); /* not taken yet: run it here */
        else
            for (int spins = 1; atomic_load_explicit(&w->done, memory_order_acquire) != g; spins++) spin_pause(spins);
    }
}
