/* OuteTTS 1.0 audio-code generation over gerbil's Qwen3 / Llama backbone: sampling restricted
 * to the audio-code tokens. The prompt builder (speaker profile), the c1_/c2_ token map and
 * the DAC hand-off are the next step (docs/ARCHITECTURE.md, "Text-to-speech"). */
#include "tts/outetts.h"

#include "base/status.h"

#include <stdlib.h>

gerbil_status outetts_greedy_codes(gerbil_model_t m, const int32_t *prompt, int n_prompt, int32_t lo, int32_t hi,
                                   int n_gen, int32_t *out) {
    const int V = gerbil_model_n_vocab(m);
    if (n_prompt < 1) return err_set(GERBIL_ERR_INVALID_ARG, "OuteTTS: empty prompt");
    if (lo < 0 || hi > V || lo >= hi)
        return err_set(GERBIL_ERR_INVALID_ARG, "OuteTTS: audio-code range [%d, %d) is not inside the vocabulary "
                       "(%d)", lo, hi, V);
    gerbil_session_params sp = gerbil_session_default_params();
    sp.n_ctx = n_prompt + n_gen + 1;
    gerbil_session_t s;
    GB_TRY(gerbil_session_new(m, &sp, &s));
    float *lg = malloc((size_t)V * sizeof *lg);
    gerbil_status st = lg ? gerbil_session_eval(s, prompt, n_prompt, lg, 0)
                          : err_set(GERBIL_ERR_NOMEM, "out of memory");
    for (int g = 0; g < n_gen && st == GERBIL_OK; g++) {
        int32_t best = lo;
        for (int32_t i = lo + 1; i < hi; i++)
            if (lg[i] > lg[best]) best = i;
        out[g] = best;
        if (g + 1 < n_gen) st = gerbil_session_eval(s, &best, 1, lg, 0);
    }
    free(lg);
    gerbil_session_free(s);
    return st;
}
