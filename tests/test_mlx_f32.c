/* The f32-activation MLX matmul (backend/cpu/mlx_f32.c) against the oracle
 * matmul_w_ref on fresh random weights of every bit width and group size; the AVX2
 * and generic kernels; and thread-count invariance. */
#include "backend/cpu/kernels.h"
#include "backend/cpu/mlx_f32.h"
#include "tensor/quant_ref.h"
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static unsigned long long seed;

static void run_case(int bits, int gs, int n_in, int n_out, int n_tok, enum gb_type sbt, threadpool_t **pools) {
    const int ng = n_in / gs;
    size_t sb_elt = sbt == GB_TYPE_F32 ? 4 : 2;
    uint32_t *words = malloc((size_t)n_out * n_in * bits / 32 * 4);
    char *sc = malloc((size_t)n_out * ng * sb_elt), *bi = malloc((size_t)n_out * ng * sb_elt);
    float *row = malloc((size_t)n_in * sizeof(float)), *x = malloc((size_t)n_tok * n_in * sizeof(float));
    for (int o = 0; o < n_out; o++) {
        for (int i = 0; i < n_in; i++) row[i] = test_rand_f(&seed) * 0.3f;
        quantize_row_mlx_ref(row, words + (size_t)o * n_in * bits / 32, sc + (size_t)o * ng * sb_elt,
                             bi + (size_t)o * ng * sb_elt, sbt, bits, gs, n_in);
    }
    for (int i = 0; i < n_tok * n_in; i++) x[i] = test_rand_f(&seed);
    struct gb_weight w = {.kind = GB_WEIGHT_MLX, .type = GB_TYPE_U32, .n_out = n_out, .n_in = n_in, .data = words,
                          .row_bytes = (size_t)n_in * bits / 8, .bits = bits, .group_size = gs, .sb_type = sbt,
                          .scales = sc, .biases = bi, .name = "w"};
    size_t ny = (size_t)n_tok * n_out;
    float *ref = malloc(ny * sizeof(float)), *y[3];
    matmul_w_ref(ref, x, &w, n_tok);
    void *work = malloc(mlx_f32_work_size(&w, n_tok) + 1);
    for (int p = 0; p < 3; p++) {
        y[p] = malloc(ny * sizeof(float));
        for (size_t i = 0; i < ny; i++) y[p][i] = NAN;
        mlx_f32_matmul(pools[p], y[p], x, &w, n_tok, work);
    }
    /* bound: f32 reordering against double sums, relative to sum |w x| ~ sqrt(n) scale */
    float worst = 0;
    for (size_t i = 0; i < ny; i++) worst = fmaxf(worst, fabsf(y[0][i] - ref[i]));
    CHECKF(worst <= 1e-4f * sqrtf((float)n_in), "bits %d gs %d n_in %d n_tok %d: max |d| %g", bits, gs, n_in, n_tok,
           worst);
    CHECKF(memcmp(y[0], y[1], ny * 4) == 0 && memcmp(y[0], y[2], ny * 4) == 0,
           "bits %d gs %d: results depend on the thread count", bits, gs);
    /* the generic kernel too */
    float *yg = malloc(ny * sizeof(float));
    float *gsum = malloc((size_t)n_tok * ng * sizeof(float));
    for (int t = 0; t < n_tok; t++)
        for (int g = 0; g < ng; g++) {
            float s = 0;
            for (int i = 0; i < gs; i++) s += x[(size_t)t * n_in + g * gs + i];
            gsum[t * ng + g] = s;
        }
    for (int o = 0; o < n_out; o++) mlx_f32_row_generic(&w, o, x, gsum, 0, n_tok, yg);
    worst = 0;
    for (size_t i = 0; i < ny; i++) worst = fmaxf(worst, fabsf(yg[i] - ref[i]));
    CHECKF(worst <= 1e-4f * sqrtf((float)n_in), "generic bits %d gs %d: max |d| %g", bits, gs, worst);
    free(yg); free(gsum);
    for (int p = 0; p < 3; p++) free(y[p]);
    free(ref); free(work); free(words); free(sc); free(bi); free(row); free(x);
}

int main(int argc, char **argv) {
    seed = argc > 1 ? strtoull(argv[1], NULL, 10) : (unsigned long long)time(NULL);
    printf("seed %llu\n", seed);
    seed |= 1;
    threadpool_t *pools[3] = {tp_create(1), tp_create(2), tp_create(3)};
    const int bits[] = {2, 3, 4, 5, 6, 8}, gss[] = {32, 64, 128};
    const enum gb_type sbts[] = {GB_TYPE_BF16, GB_TYPE_F16, GB_TYPE_F32};
    for (int b = 0; b < 6; b++)
        for (int g = 0; g < 3; g++) {
            const int n_tok[] = {1, 3, 6};
            for (int k = 0; k < 3; k++) run_case(bits[b], gss[g], gss[g] * (k + 2), 5 + 14 * k, n_tok[k], sbts[k], pools);
        }
    for (int p = 0; p < 3; p++) tp_free(pools[p]);
    return test_done();
}
