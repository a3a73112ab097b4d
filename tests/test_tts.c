/* Text-to-speech golden tests.
 *
 * dac-tiny (scripts/gen_tts_fixtures.py, run on the device machine with transformers 5.17,
 * f32 on its CPU): transformers' DacModel.decode(audio_codes=codes) for a tiny random
 * DacConfig with weight norm applied (the checkpoint stores parametrizations.weight.
 * original0/1; gerbil folds them at load) and an odd upsampling ratio (3). gerbil's decode of
 * the same codes on the cpu backend (1 and 2 threads) and the ref backend must match the
 * waveform before tanh within 2e-4 relative to its largest magnitude (f32 convolutions
 * summed in another order through ~20 layers; measured below) and after tanh within 1e-4
 * absolute; the output is finite and within [-1, 1]; bad codes give clear errors. */
#include "test.h"

#include "io/safetensors.h"
#include "tts/dac.h"
#include "tts/outetts.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void dac_golden(void) {
    const char *dir = "tests/fixtures/dac-tiny";
    struct st_file ex;
    CHECKF(st_file_open("tests/fixtures/dac-tiny/expected.safetensors", &ex) == GERBIL_OK, "%s", gerbil_last_error());
    const struct gb_tensor *codes = st_file_find(&ex, "codes"), *audio = st_file_find(&ex, "audio"),
                           *pre = st_file_find(&ex, "pre_tanh");
    CHECK(codes && audio);
    if (!codes || !audio) return;
    const int n_cb = (int)codes->ne[0], T = (int)codes->ne[1];
    const int64_t N = audio->ne[0];
    const float *want = audio->data, *want_pre = pre ? pre->data : NULL;
    const char *backs[3] = {"cpu", "cpu", "ref"};
    const int threads[3] = {1, 2, 1};
    for (int bi = 0; bi < 3; bi++) {
        struct dac *d = NULL;
        gerbil_status st = dac_load(dir, backs[bi], threads[bi], &d);
        CHECKF(st == GERBIL_OK, "load: %s", gerbil_last_error());
        if (st != GERBIL_OK) continue;
        CHECK(dac_n_codebooks(d) == 2 && dac_sample_rate(d) == 24000 && dac_samples_out(d, T) == N);
        float *pcm = NULL, *pt = NULL;
        int64_t n = 0;
        st = dac_decode(d, codes->data, n_cb, T, &pcm, &n, &pt);
        CHECKF(st == GERBIL_OK && n == N, "decode: %s (n %lld, want %lld)", gerbil_last_error(), (long long)n,
               (long long)N);
        if (st == GERBIL_OK && n == N) {
            double big = 0, dpre = 0, dpost = 0, dfree = 0;
            int finite = 1, n_free = 0;
            for (int64_t i = 0; i < N; i++) {
                if (want_pre) {
                    big = fmax(big, fabs(want_pre[i]));
                    dpre = fmax(dpre, fabs((double)pt[i] - want_pre[i]));
                }
                dpost = fmax(dpost, fabs((double)pcm[i] - want[i]));
                if (fabs(want[i]) < 0.99) { /* tanh not saturated: the sample shows the pre-tanh value */
                    n_free++;
                    dfree = fmax(dfree, fabs((double)pcm[i] - want[i]));
                }
                if (!isfinite(pcm[i]) || pcm[i] < -1 || pcm[i] > 1) finite = 0;
            }
            printf("dac-tiny %s/%d: %lld samples (%d with |audio| < 0.99: max |diff| %.3g), audio max |diff| %.3g",
                   backs[bi], threads[bi], (long long)N, n_free, dfree, dpost);
            if (want_pre) printf(", pre-tanh max |diff| %.3g (max |x| %.3g)", dpre, big);
            printf("\n");
            CHECK(n_free >= 8);
            if (want_pre) CHECKF(dpre <= 2e-4 * big, "pre-tanh diff %.3g", dpre);
            CHECKF(dpost <= 1e-4, "audio diff %.3g", dpost);
            CHECK(finite);
        }
        free(pcm);
        free(pt);
        if (bi == 0) { /* clear errors */
            int32_t bad[2] = {0, 64};
            CHECK(dac_decode(d, bad, 2, 1, &pcm, &n, NULL) == GERBIL_ERR_INVALID_ARG && !pcm);
            CHECK(strstr(gerbil_last_error(), "code 64") != NULL);
            CHECK(dac_decode(d, bad, 3, 1, &pcm, &n, NULL) == GERBIL_ERR_INVALID_ARG);
            CHECK(dac_decode(d, bad, 2, 0, &pcm, &n, NULL) == GERBIL_ERR_INVALID_ARG);
        }
        dac_free(d);
    }
    st_file_close(&ex);
    struct dac *d = NULL;
    CHECK(dac_load("tests/fixtures/outetts-tiny", "cpu", 1, &d) != GERBIL_OK && !d);
    printf("not a DAC folder: %s\n", gerbil_last_error());
}

/* outetts-tiny: a Qwen3ForCausalLM (OuteTTS-1.0-0.6B's family, tied embeddings), ids 256..511
 * the audio codes; transformers' generate(do_sample=False) with a logits processor keeping
 * only those ids gave greedy_ids (every step's top-2 margin >= 0.04). gerbil's restricted
 * greedy on cpu (1, 2 threads) and ref must give the same ids. */
static void outetts_codes(void) {
    const char *dir = "tests/fixtures/outetts-tiny";
    struct st_file ex;
    CHECKF(st_file_open("tests/fixtures/outetts-tiny/expected.safetensors", &ex) == GERBIL_OK, "%s",
           gerbil_last_error());
    const struct gb_tensor *pr = st_file_find(&ex, "prompt_ids"), *gr = st_file_find(&ex, "greedy_ids");
    CHECK(pr && gr);
    if (!pr || !gr) return;
    const int P = (int)pr->ne[0], G = (int)gr->ne[0];
    const char *backs[3] = {"cpu", "cpu", "ref"};
    const int threads[3] = {1, 2, 1};
    for (int bi = 0; bi < 3; bi++) {
        gerbil_model_params mp = gerbil_model_default_params();
        mp.backend = backs[bi];
        mp.n_threads = threads[bi];
        gerbil_model_t m;
        gerbil_status st = gerbil_model_load(dir, &mp, &m);
        CHECKF(st == GERBIL_OK, "load: %s", gerbil_last_error());
        if (st != GERBIL_OK) continue;
        int32_t *ids = calloc((size_t)G, sizeof *ids);
        st = outetts_greedy_codes(m, pr->data, P, 256, 512, G, ids);
        CHECKF(st == GERBIL_OK, "generate: %s", gerbil_last_error());
        int same = 0;
        while (same < G && ids[same] == ((const int32_t *)gr->data)[same]) same++;
        printf("outetts-tiny %s/%d: %d of %d restricted greedy ids equal transformers'\n", backs[bi], threads[bi],
               same, G);
        CHECK(same == G);
        CHECK(outetts_greedy_codes(m, pr->data, P, 256, 513, G, ids) == GERBIL_ERR_INVALID_ARG);
        free(ids);
        gerbil_model_free(m);
    }
    st_file_close(&ex);
}

int main(void) {
    if (access("tests/fixtures/dac-tiny/expected.safetensors", R_OK) != 0)
        SKIP("tests/fixtures/dac-tiny is missing (scripts/gen_tts_fixtures.py makes it)\n");
    dac_golden();
    if (access("tests/fixtures/outetts-tiny/expected.safetensors", R_OK) == 0) outetts_codes();
    else CHECKF(0, "tests/fixtures/outetts-tiny is missing");
    return test_done();
}
