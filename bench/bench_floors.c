/* bench_floors: this machine's speed limits, so engine numbers can be read as a
 * fraction of what the hardware allows (STYLE-EXAMPLES §7: report against the
 * roofline).
 *
 *   bench_floors [--threads N] [--mib M] [--reps R] [--model-bytes B --params P] [--json]
 *
 * (a) Memory read bandwidth: sum a buffer of floats (default 1 GiB, far above any
 *     cache) split across T threads; best of R passes. Also a cache-resident size
 *     (256 KiB per thread) for contrast.
 * (b) Peak f32 FMA throughput: a register-resident loop of independent FMA chains,
 *     AVX2 (8 lanes) and, where the CPU has it, AVX-512 (16 lanes); and the peak of
 *     AVX512-VNNI vpdpbusd (u8 x s8 products/s), the integer dot of the quantized kernels,
 *     which bounds batched decode (many rows per weight pass: compute, not memory).
 * (c) With --model-bytes/--params, the floors for a model:
 *       decode  tok/s <= bandwidth / bytes of weights read per token
 *       prefill tok/s <= FMA peak / (2 * params)         (attention FLOPs ignored)
 *     The prefill floor uses the AVX2 peak because that is the widest path the
 *     engine's kernels use; the AVX-512 figure is printed alongside.
 * Measures thread counts 1..N (default: online CPUs). */
#include "base/threadpool.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define HAVE_X86 1
#else
#define HAVE_X86 0
#endif

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------- bandwidth */

struct sum_job {
    const uint32_t *buf;
    size_t n;          /* 4-byte words in buf */
    int inner;         /* passes over each thread's slice per call (cache-resident case) */
    double part[64];   /* per-thread results, kept so the compiler cannot drop the loads */
};

/* Integer adds, so the data's bit patterns (a bf16 weight file read as f32 may hold
 * NaNs or subnormals) cannot change the speed. */
static uint32_t sum_scalar(const uint32_t *p, size_t n) {
    uint32_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) { s0 += p[i]; s1 += p[i + 1]; s2 += p[i + 2]; s3 += p[i + 3]; }
    for (; i < n; i++) s0 += p[i];
    return s0 + s1 + s2 + s3;
}

#if HAVE_X86
/* 8 independent accumulators, 256 bytes per iteration: enough loads in flight that
 * the loop, not the adds, is limited by memory. */
__attribute__((target("avx2"))) static uint32_t sum_avx2(const uint32_t *p, size_t n) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    const __m256i *v = (const __m256i *)p;
    size_t i = 0;
    for (; i + 64 <= n; i += 64, v += 8) {
        a0 = _mm256_add_epi32(a0, _mm256_loadu_si256(v + 0));
        a1 = _mm256_add_epi32(a1, _mm256_loadu_si256(v + 1));
        a2 = _mm256_add_epi32(a2, _mm256_loadu_si256(v + 2));
        a3 = _mm256_add_epi32(a3, _mm256_loadu_si256(v + 3));
        a4 = _mm256_add_epi32(a4, _mm256_loadu_si256(v + 4));
        a5 = _mm256_add_epi32(a5, _mm256_loadu_si256(v + 5));
        a6 = _mm256_add_epi32(a6, _mm256_loadu_si256(v + 6));
        a7 = _mm256_add_epi32(a7, _mm256_loadu_si256(v + 7));
    }
    a0 = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(a0, a1), _mm256_add_epi32(a2, a3)),
                          _mm256_add_epi32(_mm256_add_epi32(a4, a5), _mm256_add_epi32(a6, a7)));
    uint32_t t[8];
    _mm256_storeu_si256((__m256i *)t, a0);
    return t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7] + sum_scalar(p + i, n - i);
}
#endif

static int g_use_avx2;

static void sum_worker(void *ctx, int ith, int nth) {
    struct sum_job *j = ctx;
    long lo, hi;
    tp_range((long)j->n, ith, nth, &lo, &hi);
    double s = 0;
    for (int r = 0; r < j->inner; r++) {
#if HAVE_X86
        if (g_use_avx2) { s += sum_avx2(j->buf + lo, (size_t)(hi - lo)); continue; }
#endif
        s += sum_scalar(j->buf + lo, (size_t)(hi - lo));
    }
    j->part[ith] = s;
}

struct init_job { uint32_t *buf; size_t n; };

/* Written by the threads that will read it (first touch), with non-trivial values
 * so no page is the shared zero page. */
static void init_worker(void *ctx, int ith, int nth) {
    struct init_job *j = ctx;
    long lo, hi;
    tp_range((long)j->n, ith, nth, &lo, &hi);
    for (long i = lo; i < hi; i++) j->buf[i] = (uint32_t)i * 2654435761u;
}

/* Best-of-reps read bandwidth in GB/s (1e9 bytes). Each timed call reads
 * n * 4 * inner bytes. */
static double measure_bw(threadpool_t *tp, const uint32_t *buf, size_t n, int inner, int reps, double *sink) {
    struct sum_job j = {.buf = buf, .n = n, .inner = inner};
    tp_run(tp, sum_worker, &j); /* warm-up: page tables, caches, worker wake-up */
    double best = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        tp_run(tp, sum_worker, &j);
        double dt = now_s() - t0;
        double gbs = (double)n * sizeof(uint32_t) * inner / dt / 1e9;
        if (gbs > best) best = gbs;
        for (int k = 0; k < tp_n_threads(tp); k++) *sink += j.part[k];
    }
    return best;
}

/* ---------------------------------------------------------------- FMA peak */

#define FMA_ITERS 20000000L

struct fma_job {
    int isa;          /* 0 scalar, 1 avx2, 2 avx512 */
    long iters;
    double out[64];
};

static double fma_scalar(long iters) {
    float a[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    const float m = 0.999999f, c = 1e-7f;
    for (long i = 0; i < iters; i++)
        for (int k = 0; k < 8; k++) a[k] = a[k] * m + c;
    return a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
}

#if HAVE_X86
/* 12 independent chains of 8-lane FMAs: with a 4-cycle FMA latency and two FMA
 * pipes, 8 chains already saturate; 12 leaves margin and still fits in 16 ymm
 * registers alongside the two constants. 12 * 8 * 2 = 192 flops per iteration. */
__attribute__((target("avx2,fma"))) static double fma_avx2(long iters) {
    __m256 a0 = _mm256_set1_ps(1.0f), a1 = _mm256_set1_ps(1.1f), a2 = _mm256_set1_ps(1.2f), a3 = _mm256_set1_ps(1.3f);
    __m256 a4 = _mm256_set1_ps(1.4f), a5 = _mm256_set1_ps(1.5f), a6 = _mm256_set1_ps(1.6f), a7 = _mm256_set1_ps(1.7f);
    __m256 a8 = _mm256_set1_ps(1.8f), a9 = _mm256_set1_ps(1.9f), a10 = _mm256_set1_ps(2.0f), a11 = _mm256_set1_ps(2.1f);
    const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    for (long i = 0; i < iters; i++) {
        a0 = _mm256_fmadd_ps(a0, m, c); a1 = _mm256_fmadd_ps(a1, m, c); a2 = _mm256_fmadd_ps(a2, m, c);
        a3 = _mm256_fmadd_ps(a3, m, c); a4 = _mm256_fmadd_ps(a4, m, c); a5 = _mm256_fmadd_ps(a5, m, c);
        a6 = _mm256_fmadd_ps(a6, m, c); a7 = _mm256_fmadd_ps(a7, m, c); a8 = _mm256_fmadd_ps(a8, m, c);
        a9 = _mm256_fmadd_ps(a9, m, c); a10 = _mm256_fmadd_ps(a10, m, c); a11 = _mm256_fmadd_ps(a11, m, c);
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                             _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
    s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
    float t[8];
    _mm256_storeu_ps(t, s);
    return (double)t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}

/* Same with 16-lane zmm registers (32 of them, so the same 12 chains fit easily):
 * 12 * 16 * 2 = 384 flops per iteration. */
__attribute__((target("avx512f"))) static double fma_avx512(long iters) {
    __m512 a0 = _mm512_set1_ps(1.0f), a1 = _mm512_set1_ps(1.1f), a2 = _mm512_set1_ps(1.2f), a3 = _mm512_set1_ps(1.3f);
    __m512 a4 = _mm512_set1_ps(1.4f), a5 = _mm512_set1_ps(1.5f), a6 = _mm512_set1_ps(1.6f), a7 = _mm512_set1_ps(1.7f);
    __m512 a8 = _mm512_set1_ps(1.8f), a9 = _mm512_set1_ps(1.9f), a10 = _mm512_set1_ps(2.0f), a11 = _mm512_set1_ps(2.1f);
    const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    for (long i = 0; i < iters; i++) {
        a0 = _mm512_fmadd_ps(a0, m, c); a1 = _mm512_fmadd_ps(a1, m, c); a2 = _mm512_fmadd_ps(a2, m, c);
        a3 = _mm512_fmadd_ps(a3, m, c); a4 = _mm512_fmadd_ps(a4, m, c); a5 = _mm512_fmadd_ps(a5, m, c);
        a6 = _mm512_fmadd_ps(a6, m, c); a7 = _mm512_fmadd_ps(a7, m, c); a8 = _mm512_fmadd_ps(a8, m, c);
        a9 = _mm512_fmadd_ps(a9, m, c); a10 = _mm512_fmadd_ps(a10, m, c); a11 = _mm512_fmadd_ps(a11, m, c);
    }
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                             _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
    s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
    return (double)_mm512_reduce_add_ps(s);
}

/* AVX512-VNNI vpdpbusd (64 u8 x s8 products into 16 int32 lanes): the instruction the
 * integer-dot kernels of quantized weights run on (GGML types: 64 multiply-adds of 8-bit
 * activations each; MLX: 32 of 16-bit activations, as a high and a low byte). 16
 * independent chains cover its latency. Reported as products per second (x 2 = "GOP/s"). */
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static double vnni_avx512(long iters) {
    __m512i a[16];
    for (int k = 0; k < 16; k++) a[k] = _mm512_set1_epi32(k);
    const __m512i w0 = _mm512_set1_epi8(3), w1 = _mm512_set1_epi8(4), x0 = _mm512_set1_epi8(5), x1 = _mm512_set1_epi8(6);
    for (long i = 0; i < iters; i++) {
#pragma GCC unroll 16
        for (int k = 0; k < 16; k++) a[k] = _mm512_dpbusd_epi32(a[k], k & 1 ? w0 : w1, k & 2 ? x0 : x1);
    }
    __m512i s = a[0];
    for (int k = 1; k < 16; k++) s = _mm512_add_epi32(s, a[k]);
    return (double)_mm512_reduce_add_epi32(s);
}
#endif

static void fma_worker(void *ctx, int ith, int nth) {
    struct fma_job *j = ctx;
    double r;
#if HAVE_X86
    if (j->isa == 3) r = vnni_avx512(j->iters);
    else if (j->isa == 2) r = fma_avx512(j->iters);
    else if (j->isa == 1) r = fma_avx2(j->iters);
    else
#endif
        r = fma_scalar(j->iters);
    j->out[ith] = r;
}

static double flops_per_iter(int isa) {
    return isa == 3 ? 16 * 64 : isa == 2 ? 12 * 16 * 2 : isa == 1 ? 12 * 8 * 2 : 8 * 2;
}

/* Best-of-reps GFLOP/s summed over all threads. */
static double measure_fma(threadpool_t *tp, int isa, int reps, double *sink) {
    struct fma_job j = {.isa = isa, .iters = isa ? FMA_ITERS : FMA_ITERS / 4};
    struct fma_job warm = {.isa = isa, .iters = j.iters / 10};
    tp_run(tp, fma_worker, &warm); /* lets the clock ramp and the workers spin up */
    double best = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        tp_run(tp, fma_worker, &j);
        double dt = now_s() - t0;
        double g = flops_per_iter(isa) * (double)j.iters * tp_n_threads(tp) / dt / 1e9;
        if (g > best) best = g;
        *sink += j.out[0];
    }
    return best;
}

/* ---------------------------------------------------------------- main */

static void usage(FILE *f) {
    fprintf(f, "usage: bench_floors [--threads N] [--mib M] [--reps R] [--model-bytes B --params P] [--json]\n"
               "  --threads N      measure 1..N threads (default: online CPUs)\n"
               "  --mib M          bandwidth buffer size in MiB (default 1024)\n"
               "  --reps R         timed passes per measurement, best kept (default 5)\n"
               "  --model-bytes B  weight bytes read per generated token\n"
               "  --params P       parameters multiplied per token (2*P flops per token)\n"
               "  --file PATH      also time reading PATH through a read-only mmap, the way the\n"
               "                   engine reads weights (page-cache pages, not anonymous memory)\n"
               "  --json           one JSON object instead of the table\n");
}

static int parse_num(const char *flag, const char *s, double lo, double *out) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !(v >= lo)) {
        fprintf(stderr, "bench_floors: %s: bad value \"%s\"\n", flag, s);
        return -1;
    }
    *out = v;
    return 0;
}

enum { MAX_T = 64 };

int main(int argc, char **argv) {
    double max_t = (double)sysconf(_SC_NPROCESSORS_ONLN), mib = 1024, reps = 5, model_bytes = 0, params = 0;
    int json = 0;
    const char *file = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        if (!strcmp(a, "--json")) { json = 1; continue; }
        if (!strcmp(a, "--file")) {
            if (i + 1 >= argc) { fprintf(stderr, "bench_floors: --file needs a value\n"); return 2; }
            file = argv[++i];
            continue;
        }
        double *dst = !strcmp(a, "--threads")       ? &max_t
                      : !strcmp(a, "--mib")         ? &mib
                      : !strcmp(a, "--reps")        ? &reps
                      : !strcmp(a, "--model-bytes") ? &model_bytes
                      : !strcmp(a, "--params")      ? &params
                                                    : NULL;
        if (!dst) { fprintf(stderr, "bench_floors: unknown option \"%s\"\n", a); usage(stderr); return 2; }
        if (i + 1 >= argc) { fprintf(stderr, "bench_floors: %s needs a value\n", a); return 2; }
        double lo = (dst == &model_bytes || dst == &params) ? 0 : 1;
        if (parse_num(a, argv[++i], lo, dst)) return 2;
    }
    int nthr = (int)max_t > MAX_T ? MAX_T : (int)max_t;
    const int has_model = model_bytes > 0 && params > 0;

#if HAVE_X86
    __builtin_cpu_init();
    g_use_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    const int has_avx512 = __builtin_cpu_supports("avx512f");
    const int has_vnni = has_avx512 && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni");
#else
    const int has_avx512 = 0, has_vnni = 0;
#endif

    size_t n = (size_t)(mib * 1024 * 1024) / sizeof(uint32_t);
    n &= ~(size_t)63;
    uint32_t *buf = aligned_alloc(64, n * sizeof(uint32_t));
    if (!buf) { fprintf(stderr, "bench_floors: cannot allocate %.0f MiB\n", mib); return 1; }

    /* The file is mapped like src/io/mmap.c does it (PROT_READ, MAP_PRIVATE) and read
     * once untimed so every page is in the page cache and mapped before timing. */
    const uint32_t *fmap = NULL;
    size_t fsize = 0;
    if (file) {
        int fd = open(file, O_RDONLY);
        struct stat sb;
        if (fd < 0 || fstat(fd, &sb) || sb.st_size < 256) {
            fprintf(stderr, "bench_floors: cannot open %s (or it is tiny)\n", file);
            return 1;
        }
        fsize = (size_t)sb.st_size & ~(size_t)255;
        void *m = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        close(fd);
        if (m == MAP_FAILED) { fprintf(stderr, "bench_floors: mmap %s failed\n", file); return 1; }
        fmap = m;
    }

    double bw[MAX_T + 1] = {0}, bw_cache[MAX_T + 1] = {0}, fl2[MAX_T + 1] = {0}, fl5[MAX_T + 1] = {0}, vn[MAX_T + 1] = {0};
    double bw_file[MAX_T + 1] = {0};
    double sink = 0;
    for (int t = 1; t <= nthr; t++) {
        threadpool_t *tp = tp_create(t);
        if (!tp) { fprintf(stderr, "bench_floors: cannot start %d threads\n", t); return 1; }
        if (t == 1) {
            struct init_job ij = {buf, n};
            tp_run(tp, init_worker, &ij);
        }
        bw[t] = measure_bw(tp, buf, n, 1, (int)reps, &sink);
        /* 256 KiB per thread, re-read 512 times per call: fits in L2 on anything recent. */
        size_t nc = (size_t)t * (256 * 1024 / sizeof(uint32_t));
        if (nc > n) nc = n;
        bw_cache[t] = measure_bw(tp, buf, nc, 512, (int)reps, &sink);
        if (fmap) bw_file[t] = measure_bw(tp, fmap, fsize / sizeof(uint32_t), 1, (int)reps, &sink);
        fl2[t] = measure_fma(tp, g_use_avx2 ? 1 : 0, (int)reps, &sink);
        if (has_avx512) fl5[t] = measure_fma(tp, 2, (int)reps, &sink);
        if (has_vnni) vn[t] = measure_fma(tp, 3, (int)reps, &sink);
        tp_free(tp);
        if (!json)
            fprintf(stderr, "bench_floors: %d thread%s: read %.1f GB/s, L2 read %.1f GB/s, mmap file read %.1f GB/s, fma %.1f GFLOP/s\n",
                    t, t > 1 ? "s" : "", bw[t], bw_cache[t], bw_file[t], fl2[t]);
    }
    free(buf);
    if (sink == 12345.678) fprintf(stderr, "(sink)\n"); /* keeps the results observable */

    if (json) {
        printf("{\"threads\": [");
        for (int t = 1; t <= nthr; t++) printf("%s%d", t > 1 ? ", " : "", t);
        printf("], \"buffer_mib\": %.0f, \"avx2\": %s, \"avx512\": %s", mib, g_use_avx2 ? "true" : "false",
               has_avx512 ? "true" : "false");
        for (int t = 1; t <= nthr; t++) {
            printf(", \"read_gbs_%dt\": %.2f, \"l2_read_gbs_%dt\": %.2f, \"fma_gflops_%dt\": %.2f", t, bw[t], t,
                   bw_cache[t], t, fl2[t]);
            if (has_avx512) printf(", \"fma512_gflops_%dt\": %.2f", t, fl5[t]);
            if (has_vnni) printf(", \"vnni_gmacs_%dt\": %.2f", t, vn[t]);
            if (fmap) printf(", \"file_read_gbs_%dt\": %.2f", t, bw_file[t]);
            if (has_model)
                printf(", \"decode_floor_tps_%dt\": %.3f, \"prefill_floor_tps_%dt\": %.3f", t, bw[t] * 1e9 / model_bytes,
                       t, fl2[t] * 1e9 / (2 * params));
        }
        if (has_model) printf(", \"model_bytes\": %.0f, \"params\": %.0f", model_bytes, params);
        printf("}\n");
        return 0;
    }

    printf("| threads | DRAM read GB/s | L2 read GB/s |%s %s FMA GFLOP/s |", fmap ? " mmap file read GB/s |" : "",
           g_use_avx2 ? "AVX2" : "scalar");
    if (has_avx512) printf(" AVX-512 FMA GFLOP/s |");
    if (has_vnni) printf(" VNNI u8 x s8 G products/s |");
    printf("\n|---:|---:|---:|---:|%s%s%s\n", fmap ? "---:|" : "", has_avx512 ? "---:|" : "", has_vnni ? "---:|" : "");
    for (int t = 1; t <= nthr; t++) {
        printf("| %7d | %14.1f | %12.1f |", t, bw[t], bw_cache[t]);
        if (fmap) printf(" %19.1f |", bw_file[t]);
        printf(" %16.1f |", fl2[t]);
        if (has_avx512) printf(" %19.1f |", fl5[t]);
        if (has_vnni) printf(" %25.1f |", vn[t]);
        printf("\n");
    }
    if (has_model) {
        printf("\nmodel: %.3f GB of weights read per token, %.1f M params (2*P = %.2f GFLOP per token)\n",
               model_bytes / 1e9, params / 1e6, 2 * params / 1e9);
        printf("| threads | decode floor tok/s | prefill floor tok/s |%s\n",
               has_avx512 ? " prefill floor tok/s (AVX-512) |" : "");
        printf("|---:|---:|---:|%s\n", has_avx512 ? "---:|" : "");
        for (int t = 1; t <= nthr; t++) {
            printf("| %7d | %18.2f | %19.2f |", t, bw[t] * 1e9 / model_bytes, fl2[t] * 1e9 / (2 * params));
            if (has_avx512) printf(" %29.2f |", fl5[t] * 1e9 / (2 * params));
            printf("\n");
        }
    }
    return 0;
}
