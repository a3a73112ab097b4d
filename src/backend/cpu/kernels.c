/* Kernel dispatch: the AVX2/FMA/F16C versions when the CPU (and OS) support them and
 * the reference ones are not forced; the scalar references otherwise. matmul splits
 * its output columns (rows of w) into chunks shared out over the thread pool, never
 * the reduction, so each y element is summed by one thread in an order that does not
 * depend on the split. */
#include "backend/cpu/kernels.h"
#include "base/status.h"

#ifdef GERBIL_HAVE_X86
#include "backend/cpu/kernels_avx2.h"
#include <cpuid.h>
#endif

#include <stdatomic.h>
#include <stddef.h>

static _Atomic int force_ref;

/* -1 until first asked; the check is idempotent, so a race only repeats it. */
static _Atomic int avx2_ok = -1;

static int detect_avx2(void) {
#ifdef GERBIL_HAVE_X86
    /* __builtin_cpu_supports reports AVX features only when the OS saves the ymm state
     * (XGETBV). Clang's does not know "f16c", so that bit (CPUID.1:ECX[29]) is read
     * directly; F16C works on ymm registers, so the avx2 check covers its OS side. */
    __builtin_cpu_init();
    unsigned eax, ebx, ecx = 0, edx;
    int f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && ((ecx >> 29) & 1u);
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
#else
    return 0;
#endif
}

static int use_avx2(void) {
    if (atomic_load_explicit(&force_ref, memory_order_relaxed)) return 0;
    int ok = atomic_load_explicit(&avx2_ok, memory_order_relaxed);
    if (ok < 0) {
        ok = detect_avx2();
        atomic_store_explicit(&avx2_ok, ok, memory_order_relaxed);
    }
    return ok;
}

int cpu_has_avx2(void) { return use_avx2(); }

static _Atomic unsigned isa_epoch;
unsigned cpu_isa_epoch(void) { return atomic_load_explicit(&isa_epoch, memory_order_relaxed); }
void cpu_isa_changed(void) { atomic_fetch_add_explicit(&isa_epoch, 1, memory_order_relaxed); }

void cpu_force_ref(int on) {
    atomic_store_explicit(&force_ref, on ? 1 : 0, memory_order_relaxed);
    cpu_isa_changed();
}

/* ---- matmul ---------------------------------------------------------------------- */

enum {
    /* Chunks are whole multiples of this many columns: a multiple of the AVX2 tile
     * height (4), so no chunk leaves a ragged tile in mid-matrix. */
    COL_QUANTUM = 8,
    /* Chunks per thread. Threads take chunks from a shared counter, so a thread that
     * is preempted (other processes, or one more thread than free cores) or slower
     * leaves its share to the others instead of stalling the call; more chunks
     * balance better but restart the decode prefetch and the prefill x slab more
     * often. Which thread sums an element never changes its value (see matmul). */
    CHUNKS_PER_THREAD = 8,
    /* Below this many multiply-adds, waking the pool costs more than it saves. */
    MIN_PARALLEL_MACS = 1 << 16,
};

struct matmul_job {
    float *y;
    const float *x;
    const void *w;
    enum gb_type wtype;
    int n_tok, n_in, n_out;
    int fast;
    int per_token;     /* every token through the decode kernel (matmul_per_token) */
    int chunk;         /* columns per chunk, a multiple of COL_QUANTUM */
    _Atomic int next;  /* next chunk to take */
};

static void matmul_worker(void *ctx, int ith, int nth) {
    struct matmul_job *j = ctx;
    for (;;) {
        long o_lo = (long)atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed) * j->chunk;
        if (o_lo >= j->n_out) return;
        int o_hi = o_lo + j->chunk < j->n_out ? (int)o_lo + j->chunk : j->n_out;
#ifdef GERBIL_HAVE_X86
        if (j->fast) {
            matmul_rows_avx2(j->y, j->x, j->w, j->wtype, j->n_tok, j->n_in, j->n_out, (int)o_lo, o_hi, j->per_token);
            continue;
        }
#endif
        matmul_rows_ref(j->y, j->x, j->w, j->wtype, j->n_tok, j->n_in, j->n_out, (int)o_lo, o_hi);
    }
}

/* Every kernel computes each y element from its own row of w and token of x in an
 * order fixed by n_in alone, so neither the thread count nor the chunking (which
 * depends on it) can change a result bit. */
static void matmul_run(threadpool_t *tp, float *y, const float *x, const void *w, enum gb_type wtype,
                       int n_tok, int n_in, int n_out, int per_token) {
    GB_ASSERT(wtype == GB_TYPE_F32 || wtype == GB_TYPE_F16 || wtype == GB_TYPE_BF16);
    GB_ASSERT(n_tok >= 0 && n_in >= 0 && n_out >= 0);
    if (n_tok == 0 || n_out == 0) return;
    struct matmul_job job = {
        .y = y, .x = x, .w = w, .wtype = wtype,
        .n_tok = n_tok, .n_in = n_in, .n_out = n_out,
        .fast = use_avx2(), .per_token = per_token,
    };
    atomic_init(&job.next, 0);
    double macs = (double)n_tok * n_in * n_out;
    int nth = macs < MIN_PARALLEL_MACS ? 1 : tp_n_threads(tp);
    long n_chunks = (long)nth * CHUNKS_PER_THREAD;
    long chunk = (n_out + n_chunks - 1) / n_chunks;
    job.chunk = (int)((chunk + COL_QUANTUM - 1) / COL_QUANTUM * COL_QUANTUM);
    if (nth == 1) {
        job.chunk = n_out; /* one chunk: nothing to balance */
        matmul_worker(&job, 0, 1);
    } else {
        tp_run(tp, matmul_worker, &job);
    }
}

void matmul(threadpool_t *tp, float *y, const float *x, const void *w, enum gb_type wtype,
            int n_tok, int n_in, int n_out) {
    matmul_run(tp, y, x, w, wtype, n_tok, n_in, n_out, 0);
}

void matmul_per_token(threadpool_t *tp, float *y, const float *x, const void *w, enum gb_type wtype,
                      int n_tok, int n_in, int n_out) {
    matmul_run(tp, y, x, w, wtype, n_tok, n_in, n_out, 1);
}

/* ---- attention helpers ------------------------------------------------------------ */

float dot_f32(const float *a, const float *b, int n) {
#ifdef GERBIL_HAVE_X86
    if (use_avx2()) return dot_f32_avx2(a, b, n);
#endif
    return dot_f32_ref(a, b, n);
}

float dot_f32_f16(const float *a, const uint16_t *b, int n) {
#ifdef GERBIL_HAVE_X86
    if (use_avx2()) return dot_f32_f16_avx2(a, b, n);
#endif
    return dot_f32_f16_ref(a, b, n);
}

void axpy_f32(float *y, float a, const float *v, int n) {
#ifdef GERBIL_HAVE_X86
    if (use_avx2()) { axpy_f32_avx2(y, a, v, n); return; }
#endif
    axpy_f32_ref(y, a, v, n);
}

void axpy_f16(float *y, float a, const uint16_t *v, int n) {
#ifdef GERBIL_HAVE_X86
    if (use_avx2()) { axpy_f16_avx2(y, a, v, n); return; }
#endif
    axpy_f16_ref(y, a, v, n);
}

/* ---- element-wise activations ----------------------------------------------------- */

double sumsq_f32(const float *x, int n) {
#ifdef GERBIL_HAVE_X86
    if (use_avx2()) return sumsq_f32_avx2(x, n);
#endif
    return sumsq_f32_ref(x, n);
}

void f32_to_f16_row(uint16_t *y, const float *x, long n) {
#ifdef GERBIL_HAVE_X86
    if (use_avx2()) { f32_to_f16_row_avx2(y, x, n); return; }
#endif
    f32_to_f16_row_ref(y, x, n);
}

void silu_mul(float *y, const float *g, const float *u, long n) {
#ifdef GERBIL_HAVE_X86
    if (use_avx2()) { silu_mul_avx2(y, g, u, n); return; }
#endif
    silu_mul_ref(y, g, u, n);
}

void gelu_tanh_mul(float *y, const float *g, const float *u, long n) {
#ifdef GERBIL_HAVE_X86
    if (use_avx2()) { gelu_tanh_mul_avx2(y, g, u, n); return; }
#endif
    gelu_tanh_mul_ref(y, g, u, n);
}

void softcap(float *x, float cap, long n) {
#ifdef GERBIL_HAVE_X86
    if (use_avx2()) { softcap_avx2(x, cap, n); return; }
#endif
    softcap_ref(x, cap, n);
}
