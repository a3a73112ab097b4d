/* gerbil transcribe FILE [--model M] [--json]: speech to text with a Moonshine model
 * (default UsefulSensors/moonshine-base). The audio (WAV, FLAC, OGG Vorbis/Opus, MP3) is
 * decoded, mixed to mono and resampled to 16 kHz (src/audio/); audio longer than the
 * window is transcribed in overlapping windows whose texts are joined (gerbil.h,
 * gerbil_stt_params). Prints the text, or with --json {"text", "token_ids", "segments",
 * "timings"}. */
#include "cli.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define STT_DEFAULT_MODEL "UsefulSensors/moonshine-base"

static void help(FILE *f) {
    fprintf(f, "usage: gerbil transcribe FILE [--model M] [--json] [options]\n\n"
               "Transcribes speech in FILE (WAV, FLAC, OGG Vorbis, OGG Opus, MP3; any rate and channel count:\n"
               "mixed to mono and resampled to 16 kHz) with a Moonshine model (MoonshineForConditionalGeneration;\n"
               "default %s, or $GERBIL_MODEL). Greedy decoding; audio longer than the window is cut into\n"
               "windows that overlap, and the words the overlap repeats are dropped where the windows join.\n\n"
               "options:\n"
               "      --json           print {\"text\", \"token_ids\", \"segments\", \"timings\"}\n"
               "      --window S       window length in seconds (default 24; Moonshine holds ~30 s)\n"
               "      --overlap S      overlap of consecutive windows in seconds (default 2)\n"
               "      --max-tokens N   tokens per window at most (default 6.5 per second + 8)\n",
            STT_DEFAULT_MODEL);
    cli_print_model_opts_help(f);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static char *detok(gerbil_tokenizer_t tok, const int32_t *ids, int n) {
    char *t = NULL;
    size_t len = 0;
    if (!tok || n == 0 || gerbil_detokenize(tok, ids, n, 1, &t, &len) != GERBIL_OK) {
        free(t);
        return strdup("");
    }
    /* Moonshine's SentencePiece-style text starts with the word boundary's space */
    if (t[0] == ' ') memmove(t, t + 1, len);
    return t;
}

static cJSON *id_array(const int32_t *ids, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
    return a;
}

/* The model folder's tokenizer, or NULL (with a warning) when it has none. 1 on a broken one. */
static int load_tok(const char *dir, gerbil_tokenizer_t *tok) {
    *tok = NULL;
    char p[4200];
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    struct stat sb;
    if (stat(p, &sb) != 0) {
        fprintf(stderr, "gerbil transcribe: warning: %s has no tokenizer.json: the text is left empty (token ids "
                        "with --json)\n", dir);
        return 0;
    }
    gerbil_status st = gerbil_tokenizer_load(dir, tok);
    if (st != GERBIL_OK) return cli_fail("cannot load the tokenizer", st);
    return 0;
}

int cmd_transcribe(int argc, char **argv) {
    struct cli_model_opts o = {0};
    const char *file = NULL;
    int json = 0;
    gerbil_stt_params sp = gerbil_stt_default_params();
    for (int i = 1; i < argc; i++) {
        int r = cli_parse_model_opt(argc, argv, &i, &o);
        if (r < 0) return 2;
        if (r) continue;
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { help(stdout); return 0; }
        if (!strcmp(a, "--json")) { json = 1; continue; }
        if (!strcmp(a, "--window") || !strcmp(a, "--overlap")) {
            const char *v = cli_value(argc, argv, &i);
            float x;
            if (!v || cli_parse_float(a, v, &x)) return 2;
            if (!strcmp(a, "--window")) sp.window_s = x;
            else sp.overlap_s = x;
            continue;
        }
        if (!strcmp(a, "--max-tokens")) {
            const char *v = cli_value(argc, argv, &i);
            if (!v || cli_parse_int(a, v, 1, 1 << 20, &sp.max_tokens)) return 2;
            continue;
        }
        if (a[0] == '-' && a[1]) {
            fprintf(stderr, "gerbil transcribe: unknown option \"%s\"\n", a);
            help(stderr);
            return 2;
        }
        if (file) {
            fprintf(stderr, "gerbil transcribe: one audio file at a time (got \"%s\" and \"%s\")\n", file, a);
            return 2;
        }
        file = a;
    }
    if (!file) {
        fprintf(stderr, "gerbil transcribe: no audio file given\n");
        help(stderr);
        return 2;
    }
    if (!(sp.window_s >= 1.0) || !(sp.overlap_s >= 0 && sp.overlap_s < sp.window_s / 2)) {
        fprintf(stderr, "gerbil transcribe: --window %.3g --overlap %.3g: the window must be 1 s or more and the "
                        "overlap below half of it\n", sp.window_s, sp.overlap_s);
        return 2;
    }
    double t0 = now_ms();
    float *pcm;
    int64_t n;
    int rate_in;
    gerbil_status st = gerbil_audio_read_file(file, 16000, &pcm, &n, &rate_in);
    if (st != GERBIL_OK) return cli_fail("cannot read the audio", st);
    double t1 = now_ms();
    if (!o.model && !getenv("GERBIL_MODEL")) o.model = STT_DEFAULT_MODEL;
    if (!o.backend) o.backend = "cpu"; /* Moonshine's ops are not on CUDA yet */
    gerbil_model_t m;
    if (cli_open(&o, &m, NULL)) { gerbil_audio_free(pcm); return 1; }
    if (!gerbil_model_is_stt(m)) {
        fprintf(stderr, "gerbil transcribe: %s is not a speech-to-text model (gerbil transcribes with "
                        "MoonshineForConditionalGeneration, e.g. %s)\n", o.ref ? o.ref : o.model, STT_DEFAULT_MODEL);
        gerbil_model_free(m);
        gerbil_audio_free(pcm);
        return 1;
    }
    gerbil_tokenizer_t tok;
    if (load_tok(o.model, &tok)) { gerbil_model_free(m); gerbil_audio_free(pcm); return 1; }
    gerbil_stt_result *r;
    double t2 = now_ms();
    st = gerbil_stt_transcribe(m, pcm, n, &sp, &r);
    double t3 = now_ms();
    int rc = 0;
    if (st != GERBIL_OK) {
        rc = cli_fail("transcription failed", st);
    } else {
        char *text = detok(tok, r->ids, r->n_ids);
        if (!json) {
            printf("%s\n", text);
        } else {
            cJSON *j = cJSON_CreateObject();
            cJSON_AddStringToObject(j, "text", text);
            cJSON_AddItemToObject(j, "token_ids", id_array(r->ids, r->n_ids));
            cJSON *segs = cJSON_AddArrayToObject(j, "segments");
            for (int s = 0; s < r->n_segments; s++) {
                const gerbil_stt_segment *g = &r->segments[s];
                cJSON *o2 = cJSON_CreateObject();
                cJSON_AddNumberToObject(o2, "id", s);
                cJSON_AddNumberToObject(o2, "start", g->start);
                cJSON_AddNumberToObject(o2, "end", g->end);
                char *st_text = detok(tok, g->ids, g->n_ids);
                cJSON_AddStringToObject(o2, "text", st_text);
                free(st_text);
                cJSON_AddItemToObject(o2, "token_ids", id_array(g->ids, g->n_ids));
                cJSON_AddNumberToObject(o2, "overlap_ids", g->joined_from);
                cJSON_AddItemToArray(segs, o2);
            }
            cJSON *tm = cJSON_AddObjectToObject(j, "timings");
            cJSON_AddNumberToObject(tm, "audio_s", r->audio_s);
            cJSON_AddNumberToObject(tm, "audio_rate_in", rate_in);
            cJSON_AddNumberToObject(tm, "read_audio_ms", t1 - t0);
            cJSON_AddNumberToObject(tm, "encode_ms", r->encode_ms);
            cJSON_AddNumberToObject(tm, "decode_ms", r->decode_ms);
            cJSON_AddNumberToObject(tm, "transcribe_ms", t3 - t2);
            cJSON_AddNumberToObject(tm, "rtf", (t3 - t2) / 1000.0 / r->audio_s);
            char *out = cJSON_PrintUnformatted(j);
            printf("%s\n", out);
            free(out);
            cJSON_Delete(j);
        }
        free(text);
        gerbil_stt_result_free(r);
    }
    if (tok) gerbil_tokenizer_free(tok);
    gerbil_model_free(m);
    gerbil_audio_free(pcm);
    return rc;
}
