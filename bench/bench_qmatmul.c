/* matmul_w micro-benchmark over quantized weights on Qwen3-0.6B shapes (1024 x 3072):
 *   decode  (n_tok = 1): GB/s of weight bytes streamed (codes + scales), for one
 *           matrix (from the last-level cache: the kernel's compute roof) and over a
 *           set of matrices totalling >= 512 MiB walked in turn, so every call reads
 *           from DRAM;
 *   prefill (n_tok = 128): GFLOP/s (2 flops per multiply-add), same walk.
 * For Q4_K, Q6_K, Q8_0, MLX 4-bit and MLX 8-bit (group size 64, f16 scales; MLX4p: 4-bit with
 * its rows packed as the model loader packs them where the CPU has AVX-512), the AVX-512
 * (MLX, Q8_0 and the k-quants, where the CPU has it) or VNNI, AVX2 and scalar kernels,
 * 1 and 2 threads.
 * Reports the fastest call and the median: on a shared machine other load only ever
 * slows a call down.
 * Usage: bench_qmatmul [seconds per measurement, default 0.5] [format filter] [l3|fast]
 * With "fast": the fast kernels only (VNNI and AVX2).
 * With "l3": only 2000 decode calls and 20 prefill calls on one matrix with the fast
 * kernels and 1 thread, timed by thread CPU time (unaffected by time slicing on a busy
 * machine; still by a busy SMT sibling), also for `perf stat`. "l3-no512": the same
 * with the AVX-512 kernels switched off (VNNI or AVX2 ones), for A/B ratios.
 * With "gemm": per-token kernels against the prefill GEMM for 1..128 tokens (1 thread,
 * thread CPU time), where qmatmul.c's GEMM_MIN_TOK_BF16 and GEMM_MIN_TOK_MLX come from. */
#include "backend/cpu/gemm_avx512.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/qmatmul_avx512.h"
#include "backend/cpu/qmatmul_vnni.h"
#include "base/fp16.h"
#include "base/timer.h"
#include "tensor/quant_ref.h"
#include "tensor/weight.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { N_IN = 1024, N_OUT = 3072, PREFILL_TOK = 128, MAX_TOK = 512, MAX_CALLS = 4096 };
#define BIG_BYTES ((size_t)512 << 20)

static unsigned long long rng = 88172645463325252ULL;
static float frand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

struct fmt {
    const char *name;
    int mlx_bits;      /* 0: GGML type */
    enum gb_type type;
    int pack;          /* rows packed as the model loader packs them (qmatmul_pack) */
};

/* n_w matrices sharing nothing, each a full copy of a pattern of quantized rows. */
static struct gb_weight *make_set(const struct fmt *f, int *n_w_out, void **mem_out) {
    struct gb_weight proto = {.n_out = N_OUT, .n_in = N_IN};
    size_t rb, sb_bytes = 0;
    if (f->mlx_bits) {
        proto.kind = GB_WEIGHT_MLX;
        proto.type = GB_TYPE_U32;
        proto.bits = f->mlx_bits;
        proto.group_size = 64;
        proto.sb_type = GB_TYPE_F16;
        rb = (size_t)N_IN * f->mlx_bits / 8;
        sb_bytes = (size_t)N_OUT * (N_IN / 64) * 2;
    } else {
        proto.kind = GB_WEIGHT_PLAIN;
        proto.type = f->type;
        rb = type_row_size(f->type, N_IN);
    }
    proto.row_bytes = rb;
    size_t mat_bytes = rb * N_OUT + 2 * sb_bytes;
    int n_w = (int)((BIG_BYTES + mat_bytes - 1) / mat_bytes);
    char *mem = aligned_alloc(64, (mat_bytes * (size_t)n_w + 63) / 64 * 64);
    struct gb_weight *ws = malloc(sizeof *ws * (size_t)n_w);
    /* one matrix made properly, then copied */
    float *src = malloc(sizeof(float) * N_IN);
    for (int o = 0; o < N_OUT; o++) {
        for (int i = 0; i < N_IN; i++) src[i] = frand() * 0.05f;
        if (f->mlx_bits)
            quantize_row_mlx_ref(src, (uint32_t *)(mem + (size_t)o * rb), mem + rb * N_OUT + (size_t)o * (N_IN / 64) * 2,
                                 mem + rb * N_OUT + sb_bytes + (size_t)o * (N_IN / 64) * 2, GB_TYPE_F16, f->mlx_bits, 64,
                                 N_IN);
        else if (o < 64)
            quant_fns(f->type).from_float(src, mem + (size_t)o * rb, N_IN);
        else
            memcpy(mem + (size_t)o * rb, mem + (size_t)(o % 64) * rb, rb);
    }
    free(src);
    for (int k = 0; k < n_w; k++) {
        char *m = mem + (size_t)k * mat_bytes;
        if (k) memcpy(m, mem, mat_bytes);
        ws[k] = proto;
        ws[k].data = m;
        if (f->mlx_bits) {
            ws[k].scales = m + rb * N_OUT;
            ws[k].biases = m + rb * N_OUT + sb_bytes;
        }
    }
    for (int k = 0; k < n_w && f->pack; k++)
        if (qmatmul_wants_pack(&ws[k])) qmatmul_pack(&ws[k]);
    *n_w_out = n_w;
    *mem_out = mem;
    return ws;
}

static double thread_cpu_s(void) {
    struct timespec c;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c);
    return (double)c.tv_sec + (double)c.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void call(threadpool_t *tp, float *y, const float *x, const struct gb_weight *w, int n_tok, void *work) {
    matmul_w(tp, y, x, w, n_tok, work);
}

/* "gemm" mode: one matrix, 1 thread, thread CPU time: the per-token kernels against the
 * prefill GEMM (gemm_avx512.c) for growing token counts (where the GEMM starts to pay). */
static void gemm_crossover(threadpool_t *tp, const char *name, const struct gb_weight *w, float *y, const float *x,
                           void *work) {
    static const int toks[] = {1, 2, 4, 8, 12, 16, 24, 32, 64, 128, 512};
    printf("%s: GFLOP/s of thread CPU time, per-token kernels / GEMM:", name);
    for (size_t k = 0; k < sizeof toks / sizeof toks[0]; k++) {
        int n_tok = toks[k];
        double g[2];
        for (int m = 0; m < 2; m++) {
            qmatmul_set_gemm_min_tok(m ? 1 : 0);
            int reps = 1 + 2048 / n_tok;
            call(tp, y, x, w, n_tok, work);
            double t0 = thread_cpu_s();
            for (int r = 0; r < reps; r++) call(tp, y, x, w, n_tok, work);
            g[m] = 2.0 * reps * n_tok * N_IN * N_OUT / (thread_cpu_s() - t0) * 1e-9;
        }
        printf("  %d: %.0f / %.0f", n_tok, g[0], g[1]);
    }
    qmatmul_set_gemm_min_tok(-1);
    printf("\n");
}

static void measure(threadpool_t *tp, const struct gb_weight *ws, int n_w, int n_tok, float *y, const float *x,
                    void *work, double budget, double *best, double *median) {
    static double times[MAX_CALLS];
    call(tp, y, x, &ws[0], n_tok, work);
    double t_end = time_now_s() + budget;
    int calls = 0;
    do {
        double t0 = time_now_s();
        call(tp, y, x, &ws[calls % n_w], n_tok, work);
        times[calls++] = time_now_s() - t0;
    } while (calls < MAX_CALLS && (calls < 3 || time_now_s() < t_end));
    qsort(times, (size_t)calls, sizeof times[0], cmp_double);
    *best = times[0];
    *median = times[calls / 2];
}

int main(int argc, char **argv) {
    double budget = argc > 1 ? atof(argv[1]) : 0.5;
    const char *filter = argc > 2 ? argv[2] : NULL;
    static const struct fmt fmts[] = {
        {"Q4_K", 0, GB_TYPE_Q4_K, 0}, {"Q6_K", 0, GB_TYPE_Q6_K, 0}, {"Q8_0", 0, GB_TYPE_Q8_0, 0},
        {"Q5_K", 0, GB_TYPE_Q5_K, 0}, {"Q4_0", 0, GB_TYPE_Q4_0, 0},
        {"MLX4", 4, GB_TYPE_U32, 0},  {"MLX8", 8, GB_TYPE_U32, 0}, {"MLX4p", 4, GB_TYPE_U32, 1},
    };
    threadpool_t *tps[2] = {tp_create(1), tp_create(2)};
    float *x = malloc(sizeof(float) * N_IN * MAX_TOK), *y = malloc(sizeof(float) * N_OUT * MAX_TOK);
    for (int i = 0; i < N_IN * MAX_TOK; i++) x[i] = frand();
    printf("matmul_w %d x %d, AVX2: %s, AVX512-VNNI: %s, AVX-512 MLX: %s\n", N_OUT, N_IN,
           cpu_has_avx2() ? "yes" : "no", qmatmul_has_vnni() ? "yes" : "no", qmatmul_has_avx512() ? "yes" : "no");
    printf("%-5s %-6s %3s  %-17s  %-17s   %s\n", "fmt", "kernel", "thr", "decode GB/s, L3", "decode GB/s, DRAM",
           "prefill-128 GFLOP/s (each: best / median)");
    for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++) {
        if (filter && !strstr(filter, fmts[f].name)) continue;
        int n_w;
        void *mem;
        struct gb_weight *ws = make_set(&fmts[f], &n_w, &mem);
        size_t wbytes = weight_nbytes(&ws[0]);
        size_t wsz = matmul_w_work_size(&ws[0], MAX_TOK);
        void *work = malloc(wsz + 64);
        if (argc > 3 && strcmp(argv[3], "gemm") == 0) {
            gemm_crossover(tps[0], fmts[f].name, &ws[0], y, x, work);
            free(work);
            free(ws);
            free(mem);
            continue;
        }
        if (argc > 3 && (strcmp(argv[3], "l3") == 0 || strcmp(argv[3], "l3-no512") == 0)) {
            qmatmul_disable_avx512(strcmp(argv[3], "l3-no512") == 0); /* A/B: the VNNI or AVX2 kernels */
            struct timespec c0, c1;
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
            for (int k = 0; k < 2000; k++) call(tps[0], y, x, &ws[0], 1, work);
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
            double cpu = (double)(c1.tv_sec - c0.tv_sec) + (double)(c1.tv_nsec - c0.tv_nsec) * 1e-9;
            printf("%s: decode from L3, 1 thread: %.1f GB/s of thread CPU time\n", fmts[f].name,
                   2000.0 * (double)wbytes / cpu * 1e-9);
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
            for (int k = 0; k < 20; k++) call(tps[0], y, x, &ws[0], PREFILL_TOK, work);
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
            cpu = (double)(c1.tv_sec - c0.tv_sec) + (double)(c1.tv_nsec - c0.tv_nsec) * 1e-9;
            printf("%s: prefill-%d from L3, 1 thread: %.1f GFLOP/s of thread CPU time\n", fmts[f].name, PREFILL_TOK,
                   20.0 * 2.0 * PREFILL_TOK * N_IN * N_OUT / cpu * 1e-9);
            free(work);
            free(ws);
            free(mem);
            continue;
        }
        int only_fast = argc > 3 && strcmp(argv[3], "fast") == 0;
        /* kernels: 0 VNNI / AVX-512 (where the CPU and the format have one), 1 AVX2, 2 scalar */
        for (int kern = 0; kern < 3 - only_fast; kern++) {
            if (kern == 0 && !(fmts[f].mlx_bits ? qmatmul_has_avx512() : qmatmul_has_vnni())) continue;
            if (kern > 0 && ws[0].packed) continue; /* packed rows: the AVX-512 kernels' */
            int scalar = kern == 2;
            qmatmul_disable_vnni(kern != 0);
            qmatmul_disable_avx512(kern != 0);
            cpu_force_ref(scalar);
            for (int t = 0; t < 2; t++) {
                double b1, m1, bp, mp, bc, mc;
                measure(tps[t], ws, 1, 1, y, x, work, budget / 2, &bc, &mc);
                measure(tps[t], ws, n_w, 1, y, x, work, budget, &b1, &m1);
                measure(tps[t], ws, n_w, PREFILL_TOK, y, x, work, scalar ? budget / 4 : budget, &bp, &mp);
                double flops = 2.0 * PREFILL_TOK * N_IN * N_OUT;
                printf("%-5s %-6s %3d  %7.1f / %-7.1f  %7.1f / %-7.1f   %7.1f / %-7.1f\n", fmts[f].name,
                       scalar ? "scalar"
                       : kern == 0 ? (qmatmul_has_avx512() && (fmts[f].mlx_bits || fmts[f].type == GB_TYPE_Q8_0 ||
                                                               fmts[f].type == GB_TYPE_Q4_K || fmts[f].type == GB_TYPE_Q5_K ||
                                                               fmts[f].type == GB_TYPE_Q6_K)
                                          ? "avx512"
                                          : "vnni")
                                   : "avx2", t + 1, wbytes / bc * 1e-9, wbytes / mc * 1e-9, wbytes / b1 * 1e-9,
                       wbytes / m1 * 1e-9, flops / bp * 1e-9, flops / mp * 1e-9);
                fflush(stdout);
            }
        }
        cpu_force_ref(0);
        qmatmul_disable_vnni(0);
        qmatmul_disable_avx512(0);
        free(work);
        free(ws);
        free(mem);
    }
    tp_free(tps[0]);
    tp_free(tps[1]);
    free(x);
    free(y);
    return 0;
}
