#include "model/rope.h"

#include <math.h>

static double yarn_mscale(double scale, double mscale) {
    return scale <= 1.0 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

/* The rotary dimension at which a frequency makes num_rot turns over max_pos. */
static double yarn_correction_dim(double num_rot, int dim, double base, int max_pos) {
    return (dim * log(max_pos / (num_rot * 2.0 * M_PI))) / (2.0 * log(base));
}

void rope_freqs(const struct rope_config *r, int seq_len, float *inv_freq, float *attn_scale) {
    const int dim = r->n_dims, half = dim / 2;
    double base = r->theta;
    *attn_scale = 1.0f;

    if (r->type == ROPE_DYNAMIC && seq_len > r->max_pos) {
        /* NTK-aware: grow the base with the sequence. */
        double f = r->factor;
        base *= pow(f * seq_len / r->max_pos - (f - 1.0), (double)dim / (dim - 2));
    }
    for (int i = 0; i < half; i++) {
        /* torch computes base ** (arange(0, dim, 2).float() / dim) in f32 */
        float expo = (float)(2 * i) / (float)dim;
        inv_freq[i] = (float)(1.0 / pow(base, (double)expo));
    }

    switch (r->type) {
    case ROPE_DEFAULT:
    case ROPE_DYNAMIC:
        break;
    case ROPE_LINEAR:
        for (int i = 0; i < half; i++) inv_freq[i] = (float)(inv_freq[i] / r->factor);
        break;
    case ROPE_PROPORTIONAL: /* the first prop_angles pairs rotate, the rest get frequency 0 */
        for (int i = 0; i < half; i++) inv_freq[i] = i < r->prop_angles ? (float)(inv_freq[i] / r->factor) : 0.0f;
        break;
    case ROPE_LLAMA3: {
        /* Keep high frequencies, divide low ones by factor, blend in between. */
        double low_wl = r->orig_max_pos / r->low_freq_factor;
        double high_wl = r->orig_max_pos / r->high_freq_factor;
        for (int i = 0; i < half; i++) {
            double f = inv_freq[i], wl = 2.0 * M_PI / f;
            if (wl > low_wl) {
                inv_freq[i] = (float)(f / r->factor);
            } else if (wl >= high_wl) {
                double smooth = (r->orig_max_pos / wl - r->low_freq_factor) /
                                (r->high_freq_factor - r->low_freq_factor);
                inv_freq[i] = (float)((1.0 - smooth) * f / r->factor + smooth * f);
            }
        }
        break;
    }
    case ROPE_YARN: {
        double af = r->attention_factor;
        if (af <= 0.0) {
            if (r->mscale > 0.0 && r->mscale_all_dim > 0.0)
                af = yarn_mscale(r->factor, r->mscale) / yarn_mscale(r->factor, r->mscale_all_dim);
            else
                af = yarn_mscale(r->factor, 1.0);
        }
        *attn_scale = (float)af;
        double lo = yarn_correction_dim(r->beta_fast, dim, base, r->orig_max_pos);
        double hi = yarn_correction_dim(r->beta_slow, dim, base, r->orig_max_pos);
        if (r->truncate) { lo = floor(lo); hi = ceil(hi); }
        if (lo < 0) lo = 0;
        if (hi > dim - 1) hi = dim - 1;
        if (lo == hi) hi += 0.001; /* avoid a zero-width ramp */
        for (int i = 0; i < half; i++) {
            double ramp = ((double)i - lo) / (hi - lo);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            double extrap = 1.0 - ramp; /* 1: keep the original frequency */
            double f = inv_freq[i];
            inv_freq[i] = (float)(f / r->factor * (1.0 - extrap) + f * extrap);
        }
        break;
    }
    }
}
