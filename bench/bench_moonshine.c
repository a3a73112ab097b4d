/* bench_moonshine: real-time factor of Moonshine speech-to-text on this CPU for a model of
 * the shape of UsefulSensors/moonshine-base (or -tiny) with random f32 weights (the
 * published checkpoints are f32), on ../shared/data/audio/jfk.wav (11 s).
 *
 *   bench_moonshine [--shape base|tiny] [--dtype f32|bf16] [--threads N] [--tokens N] [--runs N] [--keep DIR]
 *
 * Writes the checkpoint into a temporary folder (or DIR), loads it, then transcribes the
 * file --runs times (greedy, EOS ignored, --tokens tokens: default 30, about what the real
 * model writes for this file; the window's budget is 6.5 per second + 8 = 80) and prints
 * the best run: encode ms, decode ms, ms per token, RTF = transcription time / audio time.
 * The weights are N(0, 0.02) (Irwin-Hall), norms 1, biases 0: the text is meaningless, the
 * work is the real model's. */
#include "gerbil.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct shape { const char *name; int H, I, enc, dec, heads, vocab; double partial; };
static const struct shape shapes[] = {
    {"base", 416, 1664, 8, 8, 8, 32768, 0.62},
    {"tiny", 288, 1152, 6, 6, 8, 32768, 0.9},
};

struct tdesc { char name[128]; int64_t d[3]; int nd; int kind; /* 0 weight, 1 norm (1), 2 bias (0) */ };

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static uint64_t rng_state = 0x2300;
static float gauss(void) {
    double s = 0;
    for (int i = 0; i < 4; i++) {
        rng_state += 0x9E3779B97F4A7C15ull;
        uint64_t z = rng_state;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        s += (z >> 11) * (1.0 / 9007199254740992.0);
    }
    return (float)((s - 2.0) * sqrt(3.0)); /* variance 4/12 -> 1 */
}

static int n_t;
static struct tdesc ts[512];
static void add(const char *name, int kind, int nd, int64_t a, int64_t b, int64_t c) {
    struct tdesc *t = &ts[n_t++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->nd = nd; t->d[0] = a; t->d[1] = b; t->d[2] = c; t->kind = kind;
}
static int64_t numel(const struct tdesc *t) { int64_t n = 1; for (int i = 0; i < t->nd; i++) n *= t->d[i]; return n; }

static int bf16;
static int write_model(const char *dir, const struct shape *s) {
    char n[128];
    const int H = s->H, I = s->I;
    add("model.encoder.conv1.weight", 0, 3, H, 1, 127);
    add("model.encoder.conv2.weight", 0, 3, 2 * H, H, 7);
    add("model.encoder.conv2.bias", 2, 1, 2 * H, 0, 0);
    add("model.encoder.conv3.weight", 0, 3, H, 2 * H, 3);
    add("model.encoder.conv3.bias", 2, 1, H, 0, 0);
    add("model.encoder.groupnorm.weight", 1, 1, H, 0, 0);
    add("model.encoder.groupnorm.bias", 2, 1, H, 0, 0);
    add("model.encoder.layer_norm.weight", 1, 1, H, 0, 0);
    add("model.decoder.norm.weight", 1, 1, H, 0, 0);
    add("model.decoder.embed_tokens.weight", 0, 2, s->vocab, H, 0);
    const char *proj[4] = {"q_proj", "k_proj", "v_proj", "o_proj"};
    for (int side = 0; side < 2; side++)
        for (int l = 0; l < (side ? s->dec : s->enc); l++) {
            const char *pre = side ? "model.decoder.layers" : "model.encoder.layers";
            for (int a = 0; a < (side ? 2 : 1); a++)
                for (int p = 0; p < 4; p++) {
                    snprintf(n, sizeof n, "%s.%d.%s.%s.weight", pre, l, a ? "encoder_attn" : "self_attn", proj[p]);
                    add(n, 0, 2, H, H, 0);
                }
            const char *lns[3] = {"input_layernorm", "post_attention_layernorm", "final_layernorm"};
            for (int k = 0; k < (side ? 3 : 2); k++) {
                snprintf(n, sizeof n, "%s.%d.%s.weight", pre, l, lns[k]);
                add(n, 1, 1, H, 0, 0);
            }
            const int f1 = side ? 2 * I : I;
            snprintf(n, sizeof n, "%s.%d.mlp.fc1.weight", pre, l); add(n, 0, 2, f1, H, 0);
            snprintf(n, sizeof n, "%s.%d.mlp.fc1.bias", pre, l); add(n, 2, 1, f1, 0, 0);
            snprintf(n, sizeof n, "%s.%d.mlp.fc2.weight", pre, l); add(n, 0, 2, H, I, 0);
            snprintf(n, sizeof n, "%s.%d.mlp.fc2.bias", pre, l); add(n, 2, 1, H, 0, 0);
        }
    mkdir(dir, 0755);
    char p[4200];
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *f = fopen(p, "w");
    if (!f) return 1;
    fprintf(f, "{\"architectures\": [\"MoonshineForConditionalGeneration\"], \"model_type\": \"moonshine\", "
               "\"hidden_size\": %d, \"intermediate_size\": %d, \"encoder_num_hidden_layers\": %d, "
               "\"decoder_num_hidden_layers\": %d, \"encoder_num_attention_heads\": %d, "
               "\"decoder_num_attention_heads\": %d, \"vocab_size\": %d, \"max_position_embeddings\": 194, "
               "\"partial_rotary_factor\": %g, \"rope_theta\": 10000.0, \"decoder_start_token_id\": 1, "
               "\"bos_token_id\": 1, \"eos_token_id\": 2, \"tie_word_embeddings\": true, \"pad_head_dim_to_multiple_of\": 8}\n",
            H, I, s->enc, s->dec, s->heads, s->heads, s->vocab, s->partial);
    fclose(f);
    /* safetensors: 8-byte header length, JSON header, data */
    size_t cap = 65536, len = 0;
    char *hdr = malloc(cap);
    len += (size_t)snprintf(hdr + len, cap - len, "{");
    int64_t off = 0;
    for (int i = 0; i < n_t; i++) {
        const int wb = bf16 && ts[i].kind == 0;
        int64_t b = numel(&ts[i]) * (wb ? 2 : 4);
        len += (size_t)snprintf(hdr + len, cap - len, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "", ts[i].name,
                                wb ? "BF16" : "F32");
        for (int d = 0; d < ts[i].nd; d++) len += (size_t)snprintf(hdr + len, cap - len, d ? ",%lld" : "%lld", (long long)ts[i].d[d]);
        len += (size_t)snprintf(hdr + len, cap - len, "],\"data_offsets\":[%lld,%lld]}", (long long)off, (long long)(off + b));
        off += b;
    }
    len += (size_t)snprintf(hdr + len, cap - len, "}");
    while (len % 8) hdr[len++] = ' ';
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    f = fopen(p, "wb");
    if (!f) return 1;
    uint64_t hl = len;
    fwrite(&hl, 8, 1, f);
    fwrite(hdr, 1, len, f);
    free(hdr);
    for (int i = 0; i < n_t; i++) {
        int64_t ne = numel(&ts[i]);
        float *x = malloc((size_t)ne * 4);
        for (int64_t j = 0; j < ne; j++) x[j] = ts[i].kind == 1 ? 1.0f : ts[i].kind == 2 ? 0.0f : 0.02f * gauss();
        if (bf16 && ts[i].kind == 0) {
            uint16_t *h = (uint16_t *)x; /* round to nearest even, in place (h[j] is behind x[j]) */
            for (int64_t j = 0; j < ne; j++) {
                uint32_t u;
                memcpy(&u, &x[j], 4);
                h[j] = (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
            }
            fwrite(h, 2, (size_t)ne, f);
        } else {
            fwrite(x, 4, (size_t)ne, f);
        }
        free(x);
    }
    fclose(f);
    return 0;
}

int main(int argc, char **argv) {
    const struct shape *s = &shapes[0];
    int threads = 2, tokens = 30, runs = 3;
    const char *keep = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--shape") && i + 1 < argc) {
            const char *v = argv[++i];
            s = !strcmp(v, "tiny") ? &shapes[1] : !strcmp(v, "base") ? &shapes[0] : NULL;
            if (!s) { fprintf(stderr, "--shape base|tiny\n"); return 2; }
        } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) tokens = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--runs") && i + 1 < argc) runs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--keep") && i + 1 < argc) keep = argv[++i];
        else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) bf16 = !strcmp(argv[++i], "bf16");
        else {
            fprintf(stderr, "usage: bench_moonshine [--shape base|tiny] [--threads N] [--tokens N] [--runs N] [--keep DIR]\n");
            return !strcmp(argv[i], "--help") ? 0 : 2;
        }
    }
    char dir[256];
    if (keep) snprintf(dir, sizeof dir, "%s", keep);
    else snprintf(dir, sizeof dir, "/tmp/bench_moonshine_%d", (int)getpid());
    struct stat sb;
    char cfg[300];
    snprintf(cfg, sizeof cfg, "%s/model.safetensors", dir);
    if (stat(cfg, &sb) != 0 && write_model(dir, s)) { fprintf(stderr, "cannot write %s\n", dir); return 1; }
    float *pcm;
    int64_t n;
    if (gerbil_audio_read_file("../shared/data/audio/jfk.wav", 16000, &pcm, &n, NULL) != GERBIL_OK) {
        fprintf(stderr, "%s\n", gerbil_last_error());
        return 1;
    }
    gerbil_model_params mp = gerbil_model_default_params();
    mp.n_threads = threads;
    mp.backend = "cpu";
    gerbil_model_t m;
    if (gerbil_model_load(dir, &mp, &m) != GERBIL_OK) { fprintf(stderr, "%s\n", gerbil_last_error()); return 1; }
    gerbil_stt_params sp = gerbil_stt_default_params();
    sp.ignore_eos = 1;
    sp.max_tokens = tokens;
    double best = INFINITY, be = 0, bd = 0;
    for (int r = 0; r < runs; r++) {
        gerbil_stt_result *res;
        double t0 = now_ms();
        if (gerbil_stt_transcribe(m, pcm, n, &sp, &res) != GERBIL_OK) { fprintf(stderr, "%s\n", gerbil_last_error()); return 1; }
        double t = now_ms() - t0;
        if (t < best) { best = t; be = res->encode_ms; bd = res->decode_ms; }
        gerbil_stt_result_free(res);
    }
    const double audio_s = (double)n / 16000;
    printf("moonshine-%s shape (random %s), %d threads, jfk.wav %.2f s, %d tokens: encode %.1f ms, decode %.1f ms "
           "(%.2f ms/token), total %.1f ms, RTF %.4f (best of %d)\n", s->name, bf16 ? "bf16" : "f32", threads, audio_s, tokens, be, bd,
           bd / tokens, best, best / 1000.0 / audio_s, runs);
    gerbil_model_free(m);
    gerbil_audio_free(pcm);
    if (!keep) {
        char c[600];
        snprintf(c, sizeof c, "rm -rf '%s'", dir);
        if (system(c)) return 1;
    }
    return 0;
}
