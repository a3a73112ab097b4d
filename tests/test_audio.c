/* Audio input (src/audio/audio.c) against reference decodes made here by Debian's tools:
 * jfk.wav is converted with sox to FLAC, OGG Vorbis, MP3, a 44.1 kHz stereo WAV (right
 * channel at half gain), and with opusenc to OGG Opus; each file is then decoded by gerbil
 * (libsndfile) and by the tool (sox to raw f32; opusdec --float for Opus) and the two must
 * agree: exactly for the lossless ones, within a small tolerance for the lossy ones (another
 * decoder: sox reads MP3 through libmad, libsndfile through libmpg123), after finding the
 * lag between the two decodes (MP3 decoders differ in the encoder delay they skip).
 * Resampling (libsoxr SOXR_HQ) is compared with sox's `rate` effect (-r), the algorithm
 * libsoxr was taken from. Corrupt, empty and truncated files must give clear errors.
 * Skips (77) when sox or opusenc is missing. */
#include "gerbil.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *JFK = "../shared/data/audio/jfk.wav";
static const char *MP3 = "../shared/data/audio/llamacpp_mtmd_test-2.mp3";
static char dir[256];
static int fails;

#define CHECK(c, ...) do { if (!(c)) { fails++; printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } } while (0)

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int r = system(cmd);
    if (r != 0) printf("command failed (%d): %s\n", r, cmd);
    return r;
}

static float *read_raw(const char *path, int64_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    float *x = malloc((size_t)sz + 4);
    *n = (int64_t)(fread(x, 1, (size_t)sz, f) / sizeof(float));
    fclose(f);
    return x;
}

/* The lag d in [-maxlag, maxlag] where b[t + d] best matches a[t], by the sum of squared
 * differences over a stretch in the middle. */
static int best_lag(const float *a, int64_t na, const float *b, int64_t nb, int maxlag) {
    int64_t t0 = na / 4, len = na / 4;
    if (t0 + len + maxlag > nb || t0 < maxlag) return 0;
    double best = INFINITY;
    int bd = 0;
    for (int d = -maxlag; d <= maxlag; d++) {
        double s = 0;
        for (int64_t t = t0; t < t0 + len; t += 3) {
            double e = a[t] - b[t + d];
            s += e * e;
        }
        if (s < best) { best = s; bd = d; }
    }
    return bd;
}

/* Max |a - b| and RMS of a - b over the overlap once b is shifted by its lag. */
static void compare(const char *what, const float *a, int64_t na, const float *b, int64_t nb, int maxlag,
                    double tol_max, double tol_rms, int64_t len_slack) {
    int d = maxlag ? best_lag(a, na, b, nb, maxlag) : 0;
    double mx = 0, ss = 0;
    int64_t cnt = 0;
    for (int64_t t = 0; t < na; t++) {
        int64_t u = t + d;
        if (u < 0 || u >= nb) continue;
        double e = fabs((double)a[t] - b[u]);
        if (e > mx) mx = e;
        ss += e * e;
        cnt++;
    }
    double rms = cnt ? sqrt(ss / cnt) : INFINITY;
    if (tol_rms < 0) { /* relative: rms of the difference over the reference's rms */
        double e = 0;
        for (int64_t u = 0; u < nb; u++) e += (double)b[u] * b[u];
        rms /= sqrt(e / nb);
        tol_rms = -tol_rms;
    }
    printf("%-34s gerbil %lld samples, reference %lld, lag %d: max |diff| %.3g, rms %.3g\n", what, (long long)na,
           (long long)nb, d, mx, rms);
    CHECK(llabs(na - nb) <= len_slack, "%s: %lld samples vs the reference's %lld", what, (long long)na, (long long)nb);
    CHECK(cnt > na * 9 / 10, "%s: overlap %lld of %lld", what, (long long)cnt, (long long)na);
    CHECK(mx <= tol_max, "%s: max |diff| %.3g > %.3g", what, mx, tol_max);
    CHECK(rms <= tol_rms, "%s: rms %.3g > %.3g", what, rms, tol_rms);
}

static void decode_vs(const char *file, const char *ref, int rate, int maxlag, double tol_max, double tol_rms,
                      int64_t len_slack) {
    float *x = NULL;
    int64_t n = 0;
    int rin = 0;
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    gerbil_status st = gerbil_audio_read_file(path, rate, &x, &n, &rin);
    CHECK(st == GERBIL_OK, "%s: %s", file, gerbil_last_error());
    if (st != GERBIL_OK) return;
    int64_t nr = 0;
    snprintf(path, sizeof path, "%s/%s", dir, ref);
    float *r = read_raw(path, &nr);
    CHECK(r != NULL, "reference %s missing", ref);
    if (r) {
        char what[128];
        snprintf(what, sizeof what, "%s (%d Hz -> %d Hz)", file, rin, rate ? rate : rin);
        compare(what, x, n, r, nr, maxlag, tol_max, tol_rms, len_slack);
    }
    free(r);
    gerbil_audio_free(x);
}

static void expect_error(const char *path, gerbil_status want, const char *needle) {
    float *x = (float *)1;
    int64_t n = 5;
    gerbil_status st = gerbil_audio_read_file(path, 16000, &x, &n, NULL);
    printf("%-34s -> %s: %s\n", strrchr(path, '/') ? strrchr(path, '/') + 1 : path, gerbil_status_name(st),
           gerbil_last_error());
    CHECK(st == want, "%s: status %s, expected %s", path, gerbil_status_name(st), gerbil_status_name(want));
    CHECK(x == NULL && n == 0, "%s: outputs not cleared on failure", path);
    CHECK(strstr(gerbil_last_error(), needle) != NULL, "%s: message lacks \"%s\"", path, needle);
    gerbil_audio_free(x);
}

int main(void) {
    if (system("command -v sox >/dev/null 2>&1") != 0 || system("command -v opusenc >/dev/null 2>&1") != 0 ||
        system("command -v opusdec >/dev/null 2>&1") != 0) {
        printf("SKIP: sox and opus-tools (opusenc, opusdec) are needed for the reference decodes "
               "(apt-get install sox libsox-fmt-all opus-tools)\n");
        return 77;
    }
    if (access(JFK, R_OK) != 0) {
        printf("SKIP: %s missing\n", JFK);
        return 77;
    }
    snprintf(dir, sizeof dir, "/tmp/gerbil_test_audio_%d", (int)getpid());
    if (sh("mkdir -p %s", dir)) return 1;
    const char *d = dir;
    /* the files, then the reference decodes (raw f32, mono, the file's own rate) */
    int bad = sh("sox %s %s/j.flac", JFK, d) || sh("sox %s %s/j.ogg", JFK, d) || sh("sox %s %s/j.mp3", JFK, d) ||
              sh("sox %s -r 44100 %s/st.wav remix 1 1v0.5", JFK, d) ||
              sh("opusenc --quiet --bitrate 128 %s %s/j.opus", JFK, d) ||
              sh("sox %s -t f32 %s/wav.f32", JFK, d) || sh("sox %s/j.flac -t f32 %s/flac.f32", d, d) ||
              sh("sox %s/j.ogg -t f32 %s/ogg.f32", d, d) || sh("sox %s/j.mp3 -t f32 %s/mp3.f32", d, d) ||
              sh("sox %s/st.wav -t f32 -c 1 %s/st.f32", d, d) ||
              sh("opusdec --quiet --float --rate 16000 %s/j.opus %s/opus.wav", d, d) ||
              sh("sox %s/opus.wav -t f32 %s/opus.f32", d, d) ||
              sh("sox %s -t f32 -r 8000 %s/r8k.f32", JFK, d) || sh("sox %s -t f32 -r 44100 %s/r44k.f32", JFK, d) ||
              sh("sox %s -t f32 %s/mp3_44k.f32", MP3, d) || sh("cp %s %s/long.mp3", MP3, d);
    if (bad) {
        printf("FAIL: could not make the test files\n");
        return 1;
    }
    /* each container against the tool's decode */
    decode_vs("j.flac", "flac.f32", 0, 0, 1e-7, 1e-8, 0);
    decode_vs("j.ogg", "ogg.f32", 0, 0, 1e-4, 1e-5, 0);
    decode_vs("j.mp3", "mp3.f32", 0, 2000, 2e-3, 2e-4, 2000);
    decode_vs("st.wav", "st.f32", 0, 0, 1e-6, 1e-7, 0);
    /* 128 kb/s (CELT): libopus decodes it the same at 16 kHz in both tools, to ~1e-4 of the
     * signal's rms (at opusenc's default bit rate, SILK/hybrid frames decoded by opusdec at
     * 48 kHz and resampled differ from a 16 kHz decode by ~20%, as each does from the source) */
    decode_vs("j.opus", "opus.f32", 0, 400, 2e-3, -1e-3, 400);
    /* resampling against sox's rate effect */
    char path[512];
    snprintf(path, sizeof path, "%s", JFK);
    {
        float *x;
        int64_t n;
        CHECK(gerbil_audio_read_file(JFK, 0, &x, &n, NULL) == GERBIL_OK, "%s", gerbil_last_error());
        int64_t nr;
        snprintf(path, sizeof path, "%s/wav.f32", d);
        float *r = read_raw(path, &nr);
        compare("jfk.wav (16 kHz)", x, n, r, nr, 0, 1e-7, 1e-8, 0);
        CHECK(n == 176000, "jfk.wav: %lld samples, expected 176000", (long long)n);
        free(r);
        gerbil_audio_free(x);
    }
    snprintf(path, sizeof path, "../../%s", JFK);
    sh("cp %s %s/jfk.wav", JFK, d);
    decode_vs("jfk.wav", "r8k.f32", 8000, 0, 2e-3, 2e-4, 1);
    decode_vs("jfk.wav", "r44k.f32", 44100, 0, 2e-3, 2e-4, 1);
    /* a 44.1 kHz MP3 from elsewhere; libmad (sox) keeps the encoder delay, libmpg123 skips it (2257 samples) */
    decode_vs("long.mp3", "mp3_44k.f32", 0, 3000, 2e-3, 2e-4, 3000);
    /* memory decode = file decode */
    {
        FILE *f = fopen(JFK, "rb");
        static unsigned char buf[400000];
        size_t sz = fread(buf, 1, sizeof buf, f);
        fclose(f);
        float *a, *b;
        int64_t na, nb;
        CHECK(gerbil_audio_read_memory(buf, sz, 16000, &a, &na, NULL) == GERBIL_OK, "%s", gerbil_last_error());
        CHECK(gerbil_audio_read_file(JFK, 16000, &b, &nb, NULL) == GERBIL_OK, "%s", gerbil_last_error());
        CHECK(na == nb && memcmp(a, b, (size_t)na * sizeof *a) == 0, "memory decode differs from the file's");
        gerbil_audio_free(a);
        gerbil_audio_free(b);
        float *x = (float *)1;
        int64_t n = 3;
        CHECK(gerbil_audio_read_memory("not audio at all, just text", 27, 16000, &x, &n, NULL) == GERBIL_ERR_FORMAT,
              "text upload accepted");
        CHECK(x == NULL && n == 0, "outputs not cleared");
        CHECK(gerbil_audio_read_memory(buf, 0, 16000, &x, &n, NULL) == GERBIL_ERR_FORMAT, "empty upload accepted");
        CHECK(gerbil_audio_read_memory(buf, 30000, 16000, &x, &n, NULL) == GERBIL_ERR_FORMAT,
              "truncated upload accepted");
        printf("truncated upload -> %s\n", gerbil_last_error());
    }
    /* bad input */
    sh(": > %s/empty.wav", d);
    sh("printf 'hello, this is not audio\\n' > %s/text.wav", d);
    sh("head -c 30000 %s > %s/trunc.wav", JFK, d);
    sh("head -c 44 %s > %s/header_only.wav", JFK, d);
    sh("head -c 20000 %s/j.flac > %s/trunc.flac", d, d);
    sh("head -c 8000 %s/j.ogg > %s/trunc.ogg", d, d);
    sh("head -c 4000 /dev/urandom > %s/noise.mp3", d);
    sh("sox -n -r 16000 -c 1 %s/zero.wav trim 0 0", d);
    snprintf(path, sizeof path, "%s/missing.wav", d);
    expect_error(path, GERBIL_ERR_IO, "cannot open");
    snprintf(path, sizeof path, "%s/empty.wav", d);
    expect_error(path, GERBIL_ERR_FORMAT, "empty");
    snprintf(path, sizeof path, "%s/text.wav", d);
    expect_error(path, GERBIL_ERR_FORMAT, "not an audio file");
    snprintf(path, sizeof path, "%s/trunc.wav", d);
    expect_error(path, GERBIL_ERR_FORMAT, "truncated");
    snprintf(path, sizeof path, "%s/header_only.wav", d);
    expect_error(path, GERBIL_ERR_FORMAT, "");
    snprintf(path, sizeof path, "%s/trunc.flac", d);
    expect_error(path, GERBIL_ERR_FORMAT, "");
    /* OGG and MP3 are streams of pages/frames: a cut file decodes to a prefix of the whole */
    {
        float *a, *b;
        int64_t na, nb;
        snprintf(path, sizeof path, "%s/trunc.ogg", d);
        CHECK(gerbil_audio_read_file(path, 0, &a, &na, NULL) == GERBIL_OK, "%s", gerbil_last_error());
        snprintf(path, sizeof path, "%s/j.ogg", d);
        CHECK(gerbil_audio_read_file(path, 0, &b, &nb, NULL) == GERBIL_OK, "%s", gerbil_last_error());
        double mx = 0;
        for (int64_t t = 0; t < na && t < nb; t++) mx = fmax(mx, fabs(a[t] - b[t]));
        printf("trunc.ogg: %lld samples of %lld, max |diff| to the whole file's decode %.3g\n", (long long)na,
               (long long)nb, mx);
        CHECK(na > 0 && na < nb && mx == 0, "cut OGG is not a prefix of the whole");
        gerbil_audio_free(a);
        gerbil_audio_free(b);
    }
    snprintf(path, sizeof path, "%s/noise.mp3", d);
    expect_error(path, GERBIL_ERR_FORMAT, "");
    snprintf(path, sizeof path, "%s/zero.wav", d);
    expect_error(path, GERBIL_ERR_FORMAT, "no audio samples");
    {
        float *y;
        int64_t ny;
        float one = 0.5f;
        CHECK(gerbil_audio_resample(&one, 1, 0, 16000, &y, &ny) == GERBIL_ERR_INVALID_ARG, "rate 0 accepted");
        CHECK(gerbil_audio_resample(&one, 0, 8000, 16000, &y, &ny) == GERBIL_ERR_INVALID_ARG, "no samples accepted");
    }
    sh("rm -rf %s", d);
    printf(fails ? "test_audio: %d FAILED\n" : "test_audio: all passed\n", fails);
    return fails ? 1 : 0;
}
