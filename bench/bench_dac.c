/* Real-time factor of the DAC decoder for the real 24 kHz DacConfig shape (descript/dac_24khz
 * and OuteTTS 1.0's codec: hidden_size 1024, decoder_hidden_size 1536, upsampling_ratios
 * [8, 5, 4, 2] = 320 samples per frame, codebook_dim 8, 1024 entries; 2 codebooks as OuteTTS
 * uses) with random weights, written here as a safetensors folder.
 *
 *   bench_dac [SECONDS=4] [THREADS=2] [DIR=/tmp/gerbil-dac24k]
 *
 * Prints wall time of dac_decode and RTF = decode time / audio seconds (best of 3). */
#include "tts/dac.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

struct tdesc { char name[160]; int nd; int64_t ne[3]; };
static struct tdesc T[256];
static int nT;

static void add(const char *name, int nd, int64_t a, int64_t b, int64_t c) {
    struct tdesc *t = &T[nT++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->nd = nd, t->ne[0] = a, t->ne[1] = b, t->ne[2] = c;
}
static int64_t numel(const struct tdesc *t) { int64_t n = 1; for (int i = 0; i < t->nd; i++) n *= t->ne[i]; return n; }

static void conv(const char *pre, int64_t a, int64_t b, int64_t k) {
    char n[128];
    snprintf(n, sizeof n, "%s.weight", pre);
    add(n, 3, a, b, k);
    snprintf(n, sizeof n, "%s.bias", pre);
    add(n, 1, pre[strlen(pre) - 1] == '1' && strstr(pre, "conv_t") ? b : a, 0, 0);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    const double secs = argc > 1 ? atof(argv[1]) : 4;
    const int threads = argc > 2 ? atoi(argv[2]) : 2;
    const char *dir = argc > 3 ? argv[3] : "/tmp/gerbil-dac24k";
    const int H = 1024, D = 1536, up[4] = {8, 5, 4, 2}, ncb = 2;
    char n[128], p[512];
    for (int i = 0; i < ncb; i++) {
        snprintf(n, sizeof n, "quantizer.quantizers.%d.codebook.weight", i);
        add(n, 2, 1024, 8, 0);
        snprintf(n, sizeof n, "quantizer.quantizers.%d.out_proj", i);
        conv(n, H, 8, 1);
    }
    conv("decoder.conv1", D, H, 7);
    int C = D;
    for (int b = 0; b < 4; b++) {
        snprintf(n, sizeof n, "decoder.block.%d.snake1.alpha", b);
        add(n, 3, 1, C, 1);
        snprintf(n, sizeof n, "decoder.block.%d.conv_t1", b);
        conv(n, C, C / 2, 2 * up[b]);
        for (int r = 1; r <= 3; r++) {
            snprintf(n, sizeof n, "decoder.block.%d.res_unit%d.snake1.alpha", b, r);
            add(n, 3, 1, C / 2, 1);
            snprintf(n, sizeof n, "decoder.block.%d.res_unit%d.snake2.alpha", b, r);
            add(n, 3, 1, C / 2, 1);
            snprintf(n, sizeof n, "decoder.block.%d.res_unit%d.conv1", b, r);
            conv(n, C / 2, C / 2, 7);
            snprintf(n, sizeof n, "decoder.block.%d.res_unit%d.conv2", b, r);
            conv(n, C / 2, C / 2, 1);
        }
        C /= 2;
    }
    add("decoder.snake1.alpha", 3, 1, C, 1);
    conv("decoder.conv2", 1, C, 7);
    mkdir(dir, 0755);
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *f = fopen(p, "w");
    if (!f) { perror(p); return 1; }
    fprintf(f, "{\"model_type\": \"dac\", \"hidden_size\": %d, \"decoder_hidden_size\": %d, \"n_codebooks\": %d, "
               "\"codebook_size\": 1024, \"codebook_dim\": 8, \"upsampling_ratios\": [8, 5, 4, 2], "
               "\"sampling_rate\": 24000}\n", H, D, ncb);
    fclose(f);
    /* safetensors: u64 header length, JSON header, data */
    size_t cap = 65536, len = 0;
    char *hdr = malloc(cap);
    int64_t off = 0;
    len += (size_t)snprintf(hdr + len, cap - len, "{");
    for (int i = 0; i < nT; i++) {
        const int64_t bytes = numel(&T[i]) * 4;
        len += (size_t)snprintf(hdr + len, cap - len, "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[", i ? "," : "", T[i].name);
        for (int d = 0; d < T[i].nd; d++) len += (size_t)snprintf(hdr + len, cap - len, "%s%lld", d ? "," : "", (long long)T[i].ne[d]);
        len += (size_t)snprintf(hdr + len, cap - len, "],\"data_offsets\":[%lld,%lld]}", (long long)off, (long long)(off + bytes));
        off += bytes;
    }
    len += (size_t)snprintf(hdr + len, cap - len, "}");
    while (len % 8) hdr[len++] = ' ';
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    f = fopen(p, "wb");
    if (!f) { perror(p); return 1; }
    uint64_t hl = len;
    fwrite(&hl, 8, 1, f);
    fwrite(hdr, 1, len, f);
    uint64_t s = 0x9E3779B97F4A7C15ull;
    float buf[4096];
    for (int i = 0; i < nT; i++) {
        const int alpha = strstr(T[i].name, "alpha") != NULL;
        for (int64_t left = numel(&T[i]); left > 0;) {
            const int m = left < 4096 ? (int)left : 4096;
            for (int j = 0; j < m; j++) {
                s ^= s << 13, s ^= s >> 7, s ^= s << 17;
                const float u = (float)((s >> 40) * (1.0 / 16777216.0)) * 2 - 1;
                buf[j] = alpha ? 1 + 0.3f * u : 0.02f * u;
            }
            fwrite(buf, 4, (size_t)m, f);
            left -= m;
        }
    }
    fclose(f);
    free(hdr);
    struct dac *d;
    if (dac_load(dir, "cpu", threads, &d) != GERBIL_OK) { fprintf(stderr, "load: %s\n", gerbil_last_error()); return 1; }
    const int frames = (int)(secs * 75 + 0.5);
    int32_t *codes = malloc((size_t)ncb * frames * sizeof *codes);
    for (int i = 0; i < ncb * frames; i++) codes[i] = (i * 7919) % 1024;
    double best = 1e30;
    int64_t N = 0;
    for (int rep = 0; rep < 3; rep++) {
        float *pcm;
        const double t0 = now();
        if (dac_decode(d, codes, ncb, frames, &pcm, &N, NULL) != GERBIL_OK) {
            fprintf(stderr, "decode: %s\n", gerbil_last_error());
            return 1;
        }
        const double t = now() - t0;
        if (t < best) best = t;
        free(pcm);
    }
    const double audio_s = (double)N / 24000;
    printf("dac 24 kHz decode, %d threads: %d frames -> %lld samples (%.2f s audio) in %.3f s: RTF %.3f\n", threads,
           frames, (long long)N, audio_s, best, best / audio_s);
    dac_free(d);
    free(codes);
    return 0;
}
