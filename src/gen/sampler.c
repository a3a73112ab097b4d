/* Token sampling, in the reference engine's order:
 * repetition penalty -> temperature -> top-k -> softmax -> min-p -> top-p -> draw.
 * Greedy (temperature < 1e-6) is argmax, first index winning ties. */
#include "base/status.h"
#include "gerbil.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct cand {
    float s;
    int32_t id;
};

struct gerbil_sampler {
    gerbil_sampler_params p;
    int n_vocab;
    uint64_t rng[4];     /* xoshiro256** state */
    struct cand *cands;  /* (n_vocab) */
    uint8_t *seen;       /* (n_vocab) repetition-penalty set */
};

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t xoshiro_next(uint64_t *s) {
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

/* Uniform in [0, 1) with 53 random bits. */
static double rng_uniform(uint64_t *s) { return (double)(xoshiro_next(s) >> 11) * (1.0 / 9007199254740992.0); }

gerbil_sampler_params gerbil_sampler_default_params(void) {
    return (gerbil_sampler_params){.temperature = 0.7f, .top_k = 50, .top_p = 0.9f, .min_p = 0.0f,
                                   .repetition_penalty = 1.0f, .seed = 0};
}

gerbil_status gerbil_sampler_new(const gerbil_sampler_params *p, int n_vocab, gerbil_sampler_t *out) {
    *out = NULL;
    if (n_vocab <= 0) return err_set(GERBIL_ERR_INVALID_ARG, "sampler: vocabulary size %d", n_vocab);
    if (!(p->temperature >= 0.0f) || !isfinite(p->temperature))
        return err_set(GERBIL_ERR_INVALID_ARG, "temperature must be >= 0 (got %g)", p->temperature);
    if (!(p->top_p > 0.0f)) return err_set(GERBIL_ERR_INVALID_ARG, "top-p must be > 0 (got %g)", p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return err_set(GERBIL_ERR_INVALID_ARG, "min-p must be in [0, 1] (got %g)", p->min_p);
    if (!(p->repetition_penalty > 0.0f))
        return err_set(GERBIL_ERR_INVALID_ARG, "repetition penalty must be > 0 (got %g)", p->repetition_penalty);
    struct gerbil_sampler *s = calloc(1, sizeof *s);
    if (!s) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    s->p = *p;
    s->n_vocab = n_vocab;
    s->cands = malloc((size_t)n_vocab * sizeof *s->cands);
    s->seen = calloc((size_t)n_vocab, 1);
    if (!s->cands || !s->seen) { gerbil_sampler_free(s); return err_set(GERBIL_ERR_NOMEM, "out of memory"); }
    uint64_t x = p->seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
    *out = s;
    return GERBIL_OK;
}

void gerbil_sampler_free(gerbil_sampler_t s) {
    if (!s) return;
    free(s->cands);
    free(s->seen);
    free(s);
}

/* Total order over sanitized scores (cand_score: never NaN): higher first, then lower id. */
static int cand_desc(const void *a, const void *b) {
    const struct cand *x = a, *y = b;
    if (x->s != y->s) return x->s < y->s ? 1 : -1;
    return (x->id > y->id) - (x->id < y->id); /* stable: lower id first */
}

/* A logit as a candidate score: NaN ranks below everything (-inf), and +inf (or an
 * overflow of logit / temperature) becomes FLT_MAX, so sorting and softmax stay total
 * over any float input. */
static float cand_score(float logit, float temperature) {
    if (isnan(logit)) return -INFINITY;
    float s = logit / temperature;
    return s > FLT_MAX ? FLT_MAX : s;
}

/* Greedy's comparison: a beats b; NaN loses to every number. */
static int logit_beats(float a, float b) { return !isnan(a) && (isnan(b) || a > b); }

/* Move the k largest to the front (quickselect), then sort those k. */
static void top_k_sort(struct cand *c, int n, int k) {
    int lo = 0, hi = n - 1;
    while (k < n && lo < hi) {
        struct cand pivot = c[(lo + hi) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (cand_desc(&c[i], &pivot) < 0) i++;
            while (cand_desc(&c[j], &pivot) > 0) j--;
            if (i <= j) { struct cand t = c[i]; c[i] = c[j]; c[j] = t; i++; j--; }
        }
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else break;
    }
    qsort(c, (size_t)k, sizeof *c, cand_desc);
}

/* The chain every draw comes from: repetition penalty -> temperature -> top-k -> softmax ->
 * min-p -> top-p. Returns k >= 1 candidates s->cands[0..k) (sorted, probabilities summing
 * to *total), or 0 when one token is certain (greedy; every candidate NaN or -inf: the
 * lowest id), then in *only. logits are modified in place. */
static int sampler_chain(gerbil_sampler_t s, float *logits, const int32_t *history, int n_history, double *total,
                         int32_t *only) {
    const int n = s->n_vocab;
    const gerbil_sampler_params *p = &s->p;

    if (p->repetition_penalty != 1.0f) {
        /* CTRL-style: shrink positive logits, push negative ones further down. */
        for (int i = 0; i < n_history; i++)
            if (history[i] >= 0 && history[i] < n) s->seen[history[i]] = 1;
        for (int i = 0; i < n; i++) {
            if (!s->seen[i]) continue;
            logits[i] = logits[i] > 0 ? logits[i] / p->repetition_penalty : logits[i] * p->repetition_penalty;
            s->seen[i] = 0;
        }
    }

    if (p->temperature < 1e-6f) {
        int best = 0;
        for (int i = 1; i < n; i++)
            if (logit_beats(logits[i], logits[best])) best = i;
        *only = best;
        return 0;
    }

    for (int i = 0; i < n; i++) s->cands[i] = (struct cand){cand_score(logits[i], p->temperature), i};
    int k = p->top_k > 0 && p->top_k < n ? p->top_k : n;
    top_k_sort(s->cands, n, k);

    /* softmax over the k candidates (sorted, so cands[0] is the max) */
    const float mx = s->cands[0].s;
    if (mx == -INFINITY) { /* every candidate NaN or -inf: the lowest id */
        *only = s->cands[0].id;
        return 0;
    }
    double sum = 0.0;
    for (int i = 0; i < k; i++) {
        s->cands[i].s = expf(s->cands[i].s - mx);
        sum += s->cands[i].s;
    }
    for (int i = 0; i < k; i++) s->cands[i].s = (float)(s->cands[i].s / sum);

    /* min-p: drop candidates below min_p times the top probability */
    if (p->min_p > 0.0f) {
        float floor_p = p->min_p * s->cands[0].s;
        int m = 1;
        while (m < k && s->cands[m].s >= floor_p) m++;
        k = m;
    }
    /* top-p: the smallest prefix whose mass reaches top_p */
    double mass = 0.0;
    int m = 0;
    for (; m < k; m++) {
        mass += s->cands[m].s;
        if (p->top_p < 1.0f && mass >= p->top_p) { m++; break; }
    }
    k = m;
    *total = 0.0;
    for (int i = 0; i < k; i++) *total += s->cands[i].s;
    return k;
}

int32_t gerbil_sampler_sample(gerbil_sampler_t s, float *logits, const int32_t *history, int n_history) {
    double total;
    int32_t only;
    const int k = sampler_chain(s, logits, history, n_history, &total, &only);
    if (k == 0) return only;
    double r = rng_uniform(s->rng) * total, acc = 0.0;
    for (int i = 0; i < k; i++) {
        acc += s->cands[i].s;
        if (acc > r) return s->cands[i].id;
    }
    return s->cands[k - 1].id;
}

/* Grammar constraints: masked tokens get -inf before any sampling step. */
int gerbil_sampler_apply_mask(float *logits, int n_vocab, const uint64_t *mask) {
    int allowed = 0;
    for (int i = 0; i < n_vocab; i++) {
        if ((mask[i >> 6] >> (i & 63)) & 1) allowed++;
        else logits[i] = -INFINITY;
    }
    return allowed;
}

/* For speculative sampling (spec.c): the distribution gerbil_sampler_sample draws from —
 * the same chain (penalty, temperature, top-k, softmax, min-p, top-p) — as k candidates
 * ids[0..k) with probabilities probs[0..k) summing to 1 (ids and probs: n_vocab entries);
 * greedy is the argmax with probability 1. Returns k. logits are modified in place. */
int sampler_dist(gerbil_sampler_t s, float *logits, const int32_t *history, int n_history, int32_t *ids,
                 double *probs) {
    double total;
    int32_t only;
    const int k = sampler_chain(s, logits, history, n_history, &total, &only);
    if (k == 0) {
        ids[0] = only;
        probs[0] = 1.0;
        return 1;
    }
    for (int i = 0; i < k; i++) {
        ids[i] = s->cands[i].id;
        probs[i] = s->cands[i].s / total;
    }
    return k;
}

/* A uniform draw in [0, 1) from the sampler's generator (spec.c's acceptance tests). */
double sampler_uniform(gerbil_sampler_t s) { return rng_uniform(s->rng); }

/* Whether the sampler is greedy (temperature 0). */
int sampler_greedy(gerbil_sampler_t s) { return s->p.temperature < 1e-6f; }
