/* Speculative decoding (spec.c), behind gerbil_generate, and what it needs of sampler.c. */
#ifndef GB_GEN_SPEC_H
#define GB_GEN_SPEC_H

#include "gerbil.h"

/* gerbil_generate's decode loop with spec.kind != NONE, after the prefill: logits are the
 * prompt's last logits, hist[0..n_hist) the prompt (capacity n_hist + max_tokens). */
gerbil_status spec_generate(gerbil_session_t s, gerbil_sampler_t sampler, const gerbil_generate_params *p,
                            float *logits, int32_t *hist, int n_hist, int32_t *out, gerbil_generate_result *res);
/* Checks of the parameters before anything runs (draft vocabulary, lengths). */
gerbil_status spec_check(gerbil_session_t s, const gerbil_generate_params *p);

/* sampler.c: the distribution sampling draws from (ids/probs: n_vocab entries; returns how
 * many), a uniform draw from its generator, and whether it is greedy. */
int sampler_dist(gerbil_sampler_t s, float *logits, const int32_t *history, int n_history, int32_t *ids,
                 double *probs);
double sampler_uniform(gerbil_sampler_t s);
int sampler_greedy(gerbil_sampler_t s);

#endif
