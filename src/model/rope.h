/* RoPE frequencies for the variants Hugging Face configs use. The math follows
 * transformers' modeling_rope_utils (computed in double, stored as f32 like torch). */
#ifndef GB_ROPE_H
#define GB_ROPE_H

#include "model/config.h"

/* inv_freq[n_dims/2] and the cos/sin multiplier (yarn's attention factor, else 1)
 * for a forward call whose largest position is seq_len - 1. Only the dynamic type
 * depends on seq_len: transformers recomputes its base once the sequence outgrows
 * max_position_embeddings. */
void rope_freqs(const struct rope_config *r, int seq_len, float *inv_freq, float *attn_scale);

#endif
