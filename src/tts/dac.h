/* The DAC audio codec's decoder (transformers' DacModel.decode from audio_codes), as used by
 * OuteTTS 1.0 (2 codebooks, 24 kHz) and Parler-TTS (44 kHz). dac.c. */
#ifndef GB_DAC_H
#define GB_DAC_H

#include "gerbil.h"
#include <stdint.h>

struct dac;

/* A folder with config.json (DacConfig) and model.safetensors (a DacModel state dict; the
 * weight-norm parametrizations, weight_g/weight_v or parametrizations.weight.original0/1,
 * are folded here). backend: NULL for the default; the codec refuses a backend that lacks
 * its ops, naming the op. */
gerbil_status dac_load(const char *dir, const char *backend, int n_threads, struct dac **out);
void dac_free(struct dac *d);
int dac_n_codebooks(const struct dac *d);
int dac_codebook_size(const struct dac *d);
int dac_sample_rate(const struct dac *d);
/* Samples per code frame (the product of the upsampling ratios, for even ratios). */
int64_t dac_samples_out(const struct dac *d, int n_frames);
/* codes [n_cb][T] (n_cb <= the config's n_codebooks: the first n_cb quantizers, as
 * from_codes does) -> pcm [dac_samples_out(T)] (malloc'd, in [-1, 1]). pre_tanh, when not
 * NULL, gets the waveform before the final tanh (malloc'd; for tests). */
gerbil_status dac_decode(struct dac *d, const int32_t *codes, int n_cb, int T, float **pcm, int64_t *n_out,
                         float **pre_tanh);

#endif
