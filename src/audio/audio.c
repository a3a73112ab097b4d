/* Audio input: decode a file or a memory buffer through libsndfile (WAV, FLAC, OGG Vorbis,
 * OGG Opus, MP3 and the rest of what Debian's libsndfile 1.2 reads), mix the channels down
 * to mono (their mean, as sox -c 1), resample with libsoxr (SOXR_HQ, the algorithm of
 * sox's own `rate` effect, which the tests use as the reference) to the rate asked for.
 *
 * Limits are checked before anything is allocated from the file's header: at most
 * GERBIL_AUDIO_MAX_SECONDS of audio and GERBIL_AUDIO_MAX_CHANNELS channels; samples are
 * then read in blocks into a buffer that grows up to that limit, so a header that lies
 * about its length cannot make us allocate more. A file that decodes to no samples, or
 * to fewer frames than its header states (truncated), or that libsndfile cannot open,
 * is an error naming the file and the reason. */
#include "gerbil.h"
#include "base/status.h"

#include <math.h>
#include <sndfile.h>
#include <soxr.h>
#include <stdlib.h>
#include <string.h>

struct mem_io {
    const unsigned char *data;
    sf_count_t size, pos;
};

static sf_count_t mem_len(void *u) { return ((struct mem_io *)u)->size; }
static sf_count_t mem_seek(sf_count_t off, int whence, void *u) {
    struct mem_io *m = u;
    sf_count_t p = whence == SEEK_SET ? off : whence == SEEK_CUR ? m->pos + off : m->size + off;
    if (p < 0 || p > m->size) return -1;
    m->pos = p;
    return p;
}
static sf_count_t mem_read(void *dst, sf_count_t n, void *u) {
    struct mem_io *m = u;
    if (n > m->size - m->pos) n = m->size - m->pos;
    if (n <= 0) return 0;
    memcpy(dst, m->data + m->pos, (size_t)n);
    m->pos += n;
    return n;
}
static sf_count_t mem_write(const void *src, sf_count_t n, void *u) { (void)src; (void)n; (void)u; return 0; }
static sf_count_t mem_tell(void *u) { return ((struct mem_io *)u)->pos; }

/* Read every frame of an open file as mono f32 at its own rate. */
static gerbil_status read_mono(SNDFILE *f, const SF_INFO *info, const char *what, float **out, int64_t *n_out) {
    *out = NULL;
    *n_out = 0;
    const int ch = info->channels;
    if (info->samplerate <= 0 || info->samplerate > GERBIL_AUDIO_MAX_RATE)
        return err_set(GERBIL_ERR_FORMAT, "%s: sample rate %d Hz is not one gerbil reads (1 to %d Hz)", what,
                       info->samplerate, GERBIL_AUDIO_MAX_RATE);
    if (ch <= 0 || ch > GERBIL_AUDIO_MAX_CHANNELS)
        return err_set(GERBIL_ERR_FORMAT, "%s: %d channels (gerbil reads 1 to %d)", what, ch, GERBIL_AUDIO_MAX_CHANNELS);
    const int64_t max_frames = (int64_t)GERBIL_AUDIO_MAX_SECONDS * info->samplerate;
    /* libsndfile reports SF_COUNT_MAX (or a guess) for streams without a length */
    const int known = info->frames > 0 && info->frames < SF_COUNT_MAX;
    if (known && info->frames > max_frames)
        return err_set(GERBIL_ERR_INVALID_ARG, "%s: %.1f s of audio is longer than the limit of %d s", what,
                       (double)info->frames / info->samplerate, GERBIL_AUDIO_MAX_SECONDS);
    if (info->frames == 0)
        return err_set(GERBIL_ERR_FORMAT, "%s: the file holds no audio samples", what);
    enum { BLOCK = 4096 };
    float *blk = malloc((size_t)BLOCK * (size_t)ch * sizeof *blk);
    int64_t cap = known ? info->frames : 16 * BLOCK, n = 0;
    float *pcm = malloc((size_t)cap * sizeof *pcm);
    if (!blk || !pcm) {
        free(blk);
        free(pcm);
        return err_set(GERBIL_ERR_NOMEM, "%s: out of memory for %lld samples", what, (long long)cap);
    }
    for (;;) {
        sf_count_t got = sf_readf_float(f, blk, BLOCK);
        if (got <= 0) break;
        if (n + got > max_frames) {
            free(blk);
            free(pcm);
            return err_set(GERBIL_ERR_INVALID_ARG, "%s: the audio is longer than the limit of %d s", what,
                           GERBIL_AUDIO_MAX_SECONDS);
        }
        if (n + got > cap) {
            int64_t nc = cap * 2 > n + got ? cap * 2 : n + got;
            if (nc > max_frames) nc = max_frames;
            float *np = realloc(pcm, (size_t)nc * sizeof *np);
            if (!np) {
                free(blk);
                free(pcm);
                return err_set(GERBIL_ERR_NOMEM, "%s: out of memory for %lld samples", what, (long long)nc);
            }
            pcm = np;
            cap = nc;
        }
        for (sf_count_t t = 0; t < got; t++) {
            double s = 0;
            for (int c = 0; c < ch; c++) s += blk[t * ch + c];
            pcm[n + t] = (float)(s / ch);
        }
        n += got;
    }
    free(blk);
    const int err = sf_error(f);
    if (err != SF_ERR_NO_ERROR) {
        free(pcm);
        return err_set(GERBIL_ERR_FORMAT, "%s: decoding failed after %lld frames: %s", what, (long long)n,
                       sf_error_number(err));
    }
    if (n == 0) {
        free(pcm);
        return err_set(GERBIL_ERR_FORMAT, "%s: the file holds no audio samples (empty or truncated)", what);
    }
    /* fewer frames than the header promised: the file was cut short. (MP3's count is an
     * estimate from the bit rate; a short read there is not an error.) */
    const int major = info->format & SF_FORMAT_TYPEMASK;
    if (known && n < info->frames && major != SF_FORMAT_MPEG) {
        free(pcm);
        return err_set(GERBIL_ERR_FORMAT, "%s: truncated: the header says %lld frames, the data holds %lld", what,
                       (long long)info->frames, (long long)n);
    }
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(pcm[i])) {
            free(pcm);
            return err_set(GERBIL_ERR_FORMAT, "%s: sample %lld is not a finite number", what, (long long)i);
        }
    *out = pcm;
    *n_out = n;
    return GERBIL_OK;
}

gerbil_status gerbil_audio_resample(const float *in, int64_t n, int rate_in, int rate_out, float **out,
                                    int64_t *n_out) {
    *out = NULL;
    *n_out = 0;
    if (rate_in <= 0 || rate_out <= 0 || rate_in > GERBIL_AUDIO_MAX_RATE || rate_out > GERBIL_AUDIO_MAX_RATE)
        return err_set(GERBIL_ERR_INVALID_ARG, "resample: rates %d -> %d Hz (1 to %d Hz)", rate_in, rate_out,
                       GERBIL_AUDIO_MAX_RATE);
    if (n <= 0) return err_set(GERBIL_ERR_INVALID_ARG, "resample: no samples");
    const double ratio = (double)rate_out / rate_in;
    const int64_t cap = (int64_t)ceil((double)n * ratio) + 1;
    float *y = malloc((size_t)cap * sizeof *y);
    if (!y) return err_set(GERBIL_ERR_NOMEM, "resample: out of memory for %lld samples", (long long)cap);
    if (rate_in == rate_out) {
        memcpy(y, in, (size_t)n * sizeof *y);
        *out = y;
        *n_out = n;
        return GERBIL_OK;
    }
    soxr_io_spec_t io = soxr_io_spec(SOXR_FLOAT32_I, SOXR_FLOAT32_I);
    soxr_quality_spec_t q = soxr_quality_spec(SOXR_HQ, 0);
    size_t done = 0;
    soxr_error_t e = soxr_oneshot(rate_in, rate_out, 1, in, (size_t)n, NULL, y, (size_t)cap, &done, &io, &q, NULL);
    if (e) {
        free(y);
        return err_set(GERBIL_ERR_FORMAT, "resample %d -> %d Hz: %s", rate_in, rate_out, e);
    }
    *out = y;
    *n_out = (int64_t)done;
    return GERBIL_OK;
}

/* libsndfile clamps a WAV/AIFF/... data chunk that runs past the end of the file to what is
 * there and notes it in its log ("data : 352000 (should be 29922)"): a truncated file. */
static int header_data_too_long(SNDFILE *f) {
    char log[8192] = "";
    sf_command(f, SFC_GET_LOG_INFO, log, sizeof log);
    for (const char *p = log; (p = strstr(p, "data :")) != NULL; p++) {
        const char *eol = strchr(p, '\n');
        const char *sb = strstr(p, "should be");
        if (sb && (!eol || sb < eol) && (p == log || p[-1] == '\n')) return 1;
    }
    return 0;
}

static gerbil_status finish(SNDFILE *f, SF_INFO *info, const char *what, int rate, float **pcm, int64_t *n,
                            int *rate_in) {
    float *x;
    int64_t nx;
    if (header_data_too_long(f)) {
        sf_close(f);
        return err_set(GERBIL_ERR_FORMAT, "%s: truncated: the audio data stops before the length its header gives",
                       what);
    }
    gerbil_status st = read_mono(f, info, what, &x, &nx);
    sf_close(f);
    if (st != GERBIL_OK) return st;
    if (rate_in) *rate_in = info->samplerate;
    if (rate <= 0 || rate == info->samplerate) {
        *pcm = x;
        *n = nx;
        return GERBIL_OK;
    }
    st = gerbil_audio_resample(x, nx, info->samplerate, rate, pcm, n);
    free(x);
    if (st != GERBIL_OK) err_prefix(st, "%s", what);
    return st;
}

gerbil_status gerbil_audio_read_file(const char *path, int rate, float **pcm, int64_t *n, int *rate_in) {
    *pcm = NULL;
    *n = 0;
    err_clear();
    FILE *probe = fopen(path, "rb");
    if (!probe) return err_set(GERBIL_ERR_IO, "%s: cannot open the audio file", path);
    fseek(probe, 0, SEEK_END);
    long size = ftell(probe);
    fclose(probe);
    if (size == 0) return err_set(GERBIL_ERR_FORMAT, "%s: the file is empty", path);
    SF_INFO info = {0};
    SNDFILE *f = sf_open(path, SFM_READ, &info);
    if (!f)
        return err_set(GERBIL_ERR_FORMAT, "%s: not an audio file gerbil reads (WAV, FLAC, OGG Vorbis/Opus, MP3): %s",
                       path, sf_strerror(NULL));
    return finish(f, &info, path, rate, pcm, n, rate_in);
}

gerbil_status gerbil_audio_read_memory(const void *data, size_t size, int rate, float **pcm, int64_t *n,
                                       int *rate_in) {
    *pcm = NULL;
    *n = 0;
    err_clear();
    if (!data || size == 0) return err_set(GERBIL_ERR_FORMAT, "audio: the upload is empty");
    struct mem_io m = {data, (sf_count_t)size, 0};
    SF_VIRTUAL_IO vio = {mem_len, mem_seek, mem_read, mem_write, mem_tell};
    SF_INFO info = {0};
    SNDFILE *f = sf_open_virtual(&vio, SFM_READ, &info, &m);
    if (!f)
        return err_set(GERBIL_ERR_FORMAT, "audio: not an audio format gerbil reads (WAV, FLAC, OGG Vorbis/Opus, MP3): "
                       "%s", sf_strerror(NULL));
    return finish(f, &info, "audio", rate, pcm, n, rate_in);
}

void gerbil_audio_free(float *pcm) { free(pcm); }
