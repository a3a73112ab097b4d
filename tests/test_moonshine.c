/* Moonshine speech-to-text (src/model/moonshine.c) against transformers 5.17: the fixtures
 * of scripts/gen_moonshine_fixtures.py (tiny random MoonshineForConditionalGeneration
 * checkpoints on ../shared/data/audio/jfk.wav; f32, bf16, and an untied one with an odd
 * rotary dim). For each, on the cpu backend (1 and 2 threads, which must agree bit for bit)
 * and the ref backend:
 *  - the audio as gerbil reads it equals the processor's input_values (exactly: both are
 *    int16 / 32768);
 *  - the encoder output is within 1e-3 of transformers' (values of order 1);
 *  - the decoder's logits at every position of a fixed 12-id decoder prefix (teacher
 *    forcing) are within 1e-3;
 *  - greedy decoding from decoder_start_token_id gives transformers' 24 ids (EOS ignored);
 * plus windowed transcription (segments, the overlap rule) and bad input: audio too short,
 * decoder ids outside the vocabulary, a text model given to the speech calls, a speech
 * model given to a context. The fixtures have no tokenizer (their vocab is 512 random
 * ids): the comparison is by ids and logits. */
#include "gerbil.h"
#include "io/safetensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int fails;
#define CHECK(c, ...) do { if (!(c)) { fails++; printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } } while (0)

static const struct gb_tensor *get(const struct st_file *f, const char *name) {
    const struct gb_tensor *t = st_file_find(f, name);
    if (!t) { printf("FAIL: expected.safetensors lacks %s\n", name); exit(1); }
    return t;
}

static double max_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= m)) m = isnan(d) ? INFINITY : d;
    }
    return m;
}

static void run_fixture(const char *name, const float *audio, int64_t n_audio) {
    char dir[256], path[300];
    snprintf(dir, sizeof dir, "tests/fixtures/%s", name);
    snprintf(path, sizeof path, "%s/expected.safetensors", dir);
    struct st_file ex;
    if (st_file_open(path, &ex) != GERBIL_OK) { CHECK(0, "%s: %s", path, gerbil_last_error()); return; }
    const struct gb_tensor *iv = get(&ex, "input_values"), *enc = get(&ex, "encoder_out"),
                           *dids = get(&ex, "decoder_ids"), *lg = get(&ex, "logits"), *gr = get(&ex, "greedy_ids");
    const int64_t n = iv->ne[0];
    const int T = (int)enc->ne[0], H = (int)enc->ne[1], L = (int)dids->ne[0], V = (int)lg->ne[1], G = (int)gr->ne[0];
    CHECK(n <= n_audio, "%s: %lld input values, the wav has %lld", name, (long long)n, (long long)n_audio);
    CHECK(memcmp(audio, iv->data, (size_t)n * sizeof(float)) == 0, "%s: gerbil's audio differs from input_values", name);
    const char *backs[3] = {"cpu", "cpu", "ref"};
    const int threads[3] = {1, 2, 1};
    float *first = NULL;
    for (int bi = 0; bi < 3; bi++) {
        gerbil_model_params mp = gerbil_model_default_params();
        mp.backend = backs[bi];
        mp.n_threads = threads[bi];
        gerbil_model_t m;
        gerbil_status st = gerbil_model_load(dir, &mp, &m);
        CHECK(st == GERBIL_OK, "%s: load: %s", name, gerbil_last_error());
        if (st != GERBIL_OK) continue;
        CHECK(gerbil_model_is_stt(m) && gerbil_stt_sample_rate(m) == 16000, "%s: not a speech model", name);
        CHECK(gerbil_model_n_vocab(m) == V, "%s: vocab %d", name, gerbil_model_n_vocab(m));
        float *e = NULL;
        int nf = 0;
        st = gerbil_stt_encode(m, audio, n, &e, &nf);
        CHECK(st == GERBIL_OK && nf == T, "%s: encode: %s (%d frames, expected %d)", name, gerbil_last_error(), nf, T);
        double de = st == GERBIL_OK && nf == T ? max_diff(e, enc->data, (size_t)T * H) : INFINITY;
        free(e);
        float *out = malloc((size_t)L * V * sizeof *out);
        st = gerbil_stt_logits(m, audio, n, dids->data, L, out);
        CHECK(st == GERBIL_OK, "%s: logits: %s", name, gerbil_last_error());
        double dl = max_diff(out, lg->data, (size_t)L * V);
        if (bi == 0) first = out;
        else {
            if (bi == 1) CHECK(memcmp(first, out, (size_t)L * V * sizeof *out) == 0, "%s: 1 and 2 threads differ", name);
            free(out);
        }
        gerbil_stt_params sp = gerbil_stt_default_params();
        sp.ignore_eos = 1;
        sp.max_tokens = G;
        sp.window_s = 600;
        gerbil_stt_result *r = NULL;
        st = gerbil_stt_transcribe(m, audio, n, &sp, &r);
        CHECK(st == GERBIL_OK, "%s: transcribe: %s", name, gerbil_last_error());
        int same = r && r->n_ids == G && !memcmp(r->ids, gr->data, (size_t)G * sizeof(int32_t));
        printf("%-22s %s/%d: encoder %d x %d max |diff| %.2e, logits %d x %d max |diff| %.2e, greedy %d ids %s "
               "(encode %.1f ms, decode %.1f ms)\n", name, backs[bi], threads[bi], T, H, de, L, V, dl, G,
               same ? "identical" : "DIFFER", r ? r->encode_ms : 0, r ? r->decode_ms : 0);
        CHECK(de <= 1e-3, "%s/%s: encoder max |diff| %.3g > 1e-3", name, backs[bi], de);
        CHECK(dl <= 1e-3, "%s/%s: logits max |diff| %.3g > 1e-3", name, backs[bi], dl);
        CHECK(same, "%s/%s: greedy ids differ", name, backs[bi]);
        gerbil_stt_result_free(r);
        if (bi == 0 && !strcmp(name, "moonshine-f32")) {
            /* windows: 4 s every 3 s over 11 s -> starts 0, 3, 6 and 9 s (the last ends at 11 s) */
            sp = gerbil_stt_default_params();
            sp.window_s = 4;
            sp.overlap_s = 1;
            sp.max_tokens = 10;
            sp.ignore_eos = 1;
            st = gerbil_stt_transcribe(m, audio, n, &sp, &r);
            CHECK(st == GERBIL_OK && r->n_segments == 4, "windows: %s, %d segments", gerbil_last_error(),
                  r ? r->n_segments : -1);
            if (st == GERBIL_OK) {
                int total = 0;
                for (int s = 0; s < r->n_segments; s++) {
                    const gerbil_stt_segment *g = &r->segments[s];
                    printf("  window %d: %.2f-%.2f s, %d ids, the first %d dropped as overlap\n", s, g->start, g->end,
                           g->n_ids, g->joined_from);
                    CHECK(fabs(g->start - 3.0 * s) < 1e-9 && fabs(g->end - (s == 3 ? 11.0 : 3.0 * s + 4)) < 1e-9,
                          "window %d bounds %.3f-%.3f", s, g->start, g->end);
                    total += g->n_ids - g->joined_from;
                    /* each window = that stretch transcribed alone */
                    gerbil_stt_params one = sp;
                    one.window_s = 600;
                    gerbil_stt_result *r1;
                    int64_t a = (int64_t)(g->start * 16000), b = (int64_t)(g->end * 16000);
                    CHECK(gerbil_stt_transcribe(m, audio + a, b - a, &one, &r1) == GERBIL_OK, "%s", gerbil_last_error());
                    CHECK(r1->n_ids == g->n_ids && !memcmp(r1->ids, g->ids, (size_t)g->n_ids * 4),
                          "window %d differs from its stretch alone", s);
                    gerbil_stt_result_free(r1);
                }
                CHECK(total == r->n_ids, "joined %d ids, segments give %d", r->n_ids, total);
                gerbil_stt_result_free(r);
            }
            /* bad input */
            float *lo = malloc((size_t)L * V * sizeof *lo);
            st = gerbil_stt_logits(m, audio, 800, dids->data, L, lo);
            printf("  800 samples -> %s: %s\n", gerbil_status_name(st), gerbil_last_error());
            CHECK(st == GERBIL_ERR_INVALID_ARG && strstr(gerbil_last_error(), "too short"), "short audio accepted");
            int32_t bad[2] = {1, V};
            st = gerbil_stt_logits(m, audio, n, bad, 2, lo);
            printf("  id %d -> %s: %s\n", V, gerbil_status_name(st), gerbil_last_error());
            CHECK(st == GERBIL_ERR_INVALID_ARG && strstr(gerbil_last_error(), "vocabulary"), "bad id accepted");
            free(lo);
            gerbil_context_t cx;
            st = gerbil_context_new(m, NULL, &cx);
            printf("  context -> %s: %s\n", gerbil_status_name(st), gerbil_last_error());
            CHECK(st == GERBIL_ERR_UNSUPPORTED && strstr(gerbil_last_error(), "speech-to-text"), "context accepted");
        }
        gerbil_model_free(m);
    }
    free(first);
    st_file_close(&ex);
}

int main(void) {
    if (access("tests/fixtures/moonshine-f32/expected.safetensors", R_OK) != 0) {
        printf("SKIP: tests/fixtures/moonshine-f32 missing (scripts/gen_moonshine_fixtures.py)\n");
        return 77;
    }
    float *audio;
    int64_t n;
    if (gerbil_audio_read_file("../shared/data/audio/jfk.wav", 16000, &audio, &n, NULL) != GERBIL_OK) {
        printf("SKIP: ../shared/data/audio/jfk.wav: %s\n", gerbil_last_error());
        return 77;
    }
    run_fixture("moonshine-f32", audio, n);
    run_fixture("moonshine-bf16", audio, n);
    run_fixture("moonshine-untied-f32", audio, n);
    /* a text model given to the speech calls */
    gerbil_model_t tm;
    if (gerbil_model_load("tests/fixtures/llama-f32", NULL, &tm) == GERBIL_OK) {
        float x[4];
        int32_t id = 1;
        gerbil_status st = gerbil_stt_logits(tm, audio, n, &id, 1, x);
        printf("text model -> %s: %s\n", gerbil_status_name(st), gerbil_last_error());
        CHECK(st == GERBIL_ERR_UNSUPPORTED && strstr(gerbil_last_error(), "not a speech-to-text model"),
              "text model accepted");
        CHECK(!gerbil_model_is_stt(tm), "text model is stt");
        gerbil_model_free(tm);
    }
    gerbil_audio_free(audio);
    printf(fails ? "test_moonshine: %d FAILED\n" : "test_moonshine: all passed\n", fails);
    return fails ? 1 : 0;
}
