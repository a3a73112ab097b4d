/* OuteTTS 1.0's audio-code generation (outetts.c). */
#ifndef GB_OUTETTS_H
#define GB_OUTETTS_H

#include "gerbil.h"
#include <stdint.h>

/* Greedy generation restricted to the audio-code tokens [lo, hi) (the rest of the vocabulary
 * masked out, as the reference's logits processor does): evaluates the prompt, then n_gen
 * tokens each the argmax of the allowed logits (ties: the lowest id), into out. */
gerbil_status outetts_greedy_codes(gerbil_model_t m, const int32_t *prompt, int n_prompt, int32_t lo, int32_t hi,
                                   int n_gen, int32_t *out);

#endif
