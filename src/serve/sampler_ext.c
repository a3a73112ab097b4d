/* What the server adds to gerbil_sampler: logit_bias, OpenAI's presence and frequency
 * penalties, and logprobs (sched.h). gerbil_sampler then does temperature, top-k,
 * min-p, top-p and the draw (its own repetition penalty is left off: applied here). */
#include "serve/sched.h"

#include <math.h>

void srv_apply_penalties(float *logits, int n_vocab, const struct srv_params *p, const int32_t *prompt, int n_prompt,
                         const int32_t *gen, int n_gen, int32_t *counts) {
    for (int i = 0; i < p->n_bias; i++)
        if (p->bias_ids[i] >= 0 && p->bias_ids[i] < n_vocab) logits[p->bias_ids[i]] += p->bias_vals[i];
    if (p->repetition_penalty != 1.0f) {
        /* CTRL-style, once per distinct id of the prompt and the generated text */
        const float r = p->repetition_penalty;
        for (int pass = 0; pass < 2; pass++) {
            const int32_t *ids = pass ? gen : prompt;
            const int n = pass ? n_gen : n_prompt;
            for (int i = 0; i < n; i++) {
                const int32_t t = ids[i];
                if (t < 0 || t >= n_vocab || counts[t]) continue;
                counts[t] = 1;
                logits[t] = logits[t] > 0 ? logits[t] / r : logits[t] * r;
            }
        }
        for (int pass = 0; pass < 2; pass++) {
            const int32_t *ids = pass ? gen : prompt;
            const int n = pass ? n_gen : n_prompt;
            for (int i = 0; i < n; i++)
                if (ids[i] >= 0 && ids[i] < n_vocab) counts[ids[i]] = 0;
        }
    }
    if (p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f) {
        /* OpenAI: logit -= count * frequency + (count > 0) * presence, over the completion */
        for (int i = 0; i < n_gen; i++)
            if (gen[i] >= 0 && gen[i] < n_vocab) counts[gen[i]]++;
        for (int i = 0; i < n_gen; i++) {
            const int32_t t = gen[i];
            if (t < 0 || t >= n_vocab || !counts[t]) continue;
            logits[t] -= (float)counts[t] * p->frequency_penalty + p->presence_penalty;
            counts[t] = 0;
        }
    }
}

void srv_logprobs(const float *logits, int n_vocab, float *lsm, int32_t id, int top_n, struct srv_logprob *out) {
    float mx = -INFINITY;
    for (int i = 0; i < n_vocab; i++)
        if (logits[i] > mx) mx = logits[i];
    double sum = 0.0;
    for (int i = 0; i < n_vocab; i++) sum += exp((double)logits[i] - mx);
    const float lse = (float)(mx + log(sum));
    for (int i = 0; i < n_vocab; i++) lsm[i] = logits[i] - lse;
    out->id = id;
    out->lp = id >= 0 && id < n_vocab ? lsm[id] : -INFINITY;
    if (top_n > SRV_MAX_TOP_LOGPROBS) top_n = SRV_MAX_TOP_LOGPROBS;
    if (top_n > n_vocab) top_n = n_vocab;
    out->n_top = 0;
    /* insertion into a short sorted list: highest first, lower id first on ties */
    for (int i = 0; i < n_vocab && top_n > 0; i++) {
        const float v = lsm[i];
        int k = out->n_top;
        if (k == top_n && !(v > out->top_lp[k - 1])) continue;
        if (k < top_n) out->n_top++;
        else k--;
        while (k > 0 && v > out->top_lp[k - 1]) {
            out->top_lp[k] = out->top_lp[k - 1];
            out->top_ids[k] = out->top_ids[k - 1];
            k--;
        }
        out->top_lp[k] = v;
        out->top_ids[k] = i;
    }
}
