/* Sampler: greedy ties, filters (top-k, top-p, min-p), repetition penalty, and the
 * empirical distribution against the exact one for a small vocabulary. */
#include "gerbil.h"
#include "test.h"

#include <math.h>
#include <string.h>

static gerbil_sampler_t make(float temp, int top_k, float top_p, float min_p, float rep, uint64_t seed, int n) {
    gerbil_sampler_params p = {.temperature = temp, .top_k = top_k, .top_p = top_p, .min_p = min_p,
                               .repetition_penalty = rep, .seed = seed};
    gerbil_sampler_t s = NULL;
    CHECK(gerbil_sampler_new(&p, n, &s) == GERBIL_OK);
    return s;
}

/* Draw many samples; counts[i] = how often id i came out. */
static void draw(gerbil_sampler_t s, const float *logits, int n, int times, int *counts) {
    float buf[16];
    int out_of_range = 0;
    memset(counts, 0, (size_t)n * sizeof(int));
    for (int t = 0; t < times; t++) {
        memcpy(buf, logits, (size_t)n * sizeof(float));
        int id = gerbil_sampler_sample(s, buf, NULL, 0);
        if (id < 0 || id >= n) { out_of_range++; continue; }
        counts[id]++;
    }
    CHECK(out_of_range == 0);
}

int main(void) {
    enum { N = 8, TIMES = 200000 };
    const float logits[N] = {1.0f, 3.0f, 0.5f, 3.0f, 2.0f, -1.0f, 0.0f, 2.5f};
    int counts[N];
    float buf[N];

    /* greedy: first max wins */
    gerbil_sampler_t s = make(0.0f, 50, 0.9f, 0, 1.0f, 1, N);
    memcpy(buf, logits, sizeof buf);
    CHECK(gerbil_sampler_sample(s, buf, NULL, 0) == 1);
    gerbil_sampler_free(s);

    /* repetition penalty (CTRL): id 1 seen -> 3/2 = 1.5, so id 3 wins the argmax */
    s = make(0.0f, 0, 1.0f, 0, 2.0f, 1, N);
    memcpy(buf, logits, sizeof buf);
    int32_t hist[] = {1, 5};
    CHECK(gerbil_sampler_sample(s, buf, hist, 2) == 3);
    CHECK(buf[1] == 1.5f && buf[5] == -2.0f);
    gerbil_sampler_free(s);

    /* no filters at T = 1: empirical frequencies match softmax */
    double z = 0, p[N];
    for (int i = 0; i < N; i++) z += exp(logits[i]);
    for (int i = 0; i < N; i++) p[i] = exp(logits[i]) / z;
    s = make(1.0f, 0, 1.0f, 0, 1.0f, 42, N);
    draw(s, logits, N, TIMES, counts);
    for (int i = 0; i < N; i++) {
        double f = (double)counts[i] / TIMES, sd = sqrt(p[i] * (1 - p[i]) / TIMES);
        CHECKF(fabs(f - p[i]) < 5 * sd + 1e-4, "id %d: freq %g vs p %g", i, f, p[i]);
    }
    gerbil_sampler_free(s);

    /* top-k 2: only ids 1 and 3 (equal logits), each about half */
    s = make(1.0f, 2, 1.0f, 0, 1.0f, 7, N);
    draw(s, logits, N, TIMES, counts);
    CHECK(counts[1] + counts[3] == TIMES);
    CHECK(fabs((double)counts[1] / TIMES - 0.5) < 0.01);
    gerbil_sampler_free(s);

    /* top-p: the smallest prefix reaching the mass. Sorted probs: ids 1,3 (p each),
     * then 7, then 4; with top_p just above 2p(1) the prefix is {1, 3, 7}. */
    double two = p[1] + p[3];
    s = make(1.0f, 0, (float)(two + 0.01), 0, 1.0f, 9, N);
    draw(s, logits, N, TIMES, counts);
    CHECK(counts[1] + counts[3] + counts[7] == TIMES && counts[7] > 0);
    gerbil_sampler_free(s);

    /* min-p 0.5: keep ids with p >= 0.5 * p_max: e^(l - 3) >= 0.5 -> l >= 2.307: ids 1, 3, 7 */
    s = make(1.0f, 0, 1.0f, 0.5f, 1.0f, 11, N);
    draw(s, logits, N, TIMES, counts);
    CHECK(counts[1] + counts[3] + counts[7] == TIMES && counts[7] > 0);
    gerbil_sampler_free(s);

    /* same seed, same sequence; another seed, another sequence */
    int32_t a[64], b[64], c[64];
    for (int run = 0; run < 3; run++) {
        s = make(0.9f, 5, 0.95f, 0, 1.0f, run == 2 ? 99 : 5, N);
        for (int i = 0; i < 64; i++) {
            memcpy(buf, logits, sizeof buf);
            int32_t id = gerbil_sampler_sample(s, buf, NULL, 0);
            (run == 0 ? a : run == 1 ? b : c)[i] = id;
        }
        gerbil_sampler_free(s);
    }
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK(memcmp(a, c, sizeof a) != 0);

    /* invalid parameters are refused with a message */
    gerbil_sampler_params bad = gerbil_sampler_default_params();
    bad.top_p = 0;
    CHECK(gerbil_sampler_new(&bad, N, &s) == GERBIL_ERR_INVALID_ARG && strstr(gerbil_last_error(), "top-p"));
    bad = gerbil_sampler_default_params();
    bad.temperature = NAN;
    CHECK(gerbil_sampler_new(&bad, N, &s) == GERBIL_ERR_INVALID_ARG);
    return test_done();
}
