/* POST /v1/audio/transcriptions (OpenAI's form): a multipart/form-data body with "file" (the
 * audio: WAV, FLAC, OGG Vorbis/Opus, MP3), "model" (any name: the server has one speech
 * model, `gerbil serve --stt-model M`), "response_format" json (default) | text |
 * verbose_json; "language", "prompt" and "temperature" are accepted and ignored (greedy,
 * English Moonshine). The form is parsed by libmicrohttpd's post processor over the body
 * http.c collected. Bad audio, a missing file, an unknown format: 400 with OpenAI's error
 * object; no speech model loaded: 400 naming the flag. */
#include "serve/server.h"

#include <cjson/cJSON.h>
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct form {
    char *file;
    size_t file_n, file_cap;
    int has_file, too_big;
    char format[32], model[128];
    size_t limit;
};

static enum MHD_Result form_iter(void *cls, enum MHD_ValueKind kind, const char *key, const char *filename,
                                 const char *content_type, const char *transfer_encoding, const char *data,
                                 uint64_t off, size_t size) {
    (void)kind;
    (void)filename;
    (void)content_type;
    (void)transfer_encoding;
    struct form *f = cls;
    if (!strcmp(key, "file")) {
        f->has_file = 1;
        if (f->file_n + size > f->limit) { f->too_big = 1; return MHD_NO; }
        if (f->file_n + size > f->file_cap) {
            size_t cap = (f->file_n + size) * 2 + 4096;
            char *p = realloc(f->file, cap);
            if (!p) { f->too_big = 1; return MHD_NO; }
            f->file = p;
            f->file_cap = cap;
        }
        memcpy(f->file + f->file_n, data, size);
        f->file_n += size;
    } else if (!strcmp(key, "response_format") || !strcmp(key, "model")) {
        char *dst = key[0] == 'r' ? f->format : f->model;
        size_t cap = key[0] == 'r' ? sizeof f->format : sizeof f->model;
        if (off + size < cap) {
            memcpy(dst + off, data, size);
            dst[off + size] = 0;
        }
    }
    return MHD_YES;
}

static void reply(struct srv_reply *out, int status, const char *type, char *body) {
    out->status = status;
    out->type = type;
    out->body = body;
    out->len = body ? strlen(body) : 0;
}

static void reply_error(struct srv_reply *out, int status, const char *param, const char *code, const char *msg) {
    cJSON *j = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(j, "error");
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddStringToObject(e, "type", status >= 500 ? "server_error" : "invalid_request_error");
    if (param) cJSON_AddStringToObject(e, "param", param);
    else cJSON_AddNullToObject(e, "param");
    cJSON_AddStringToObject(e, "code", code);
    reply(out, status, "application/json", cJSON_PrintUnformatted(j));
    cJSON_Delete(j);
}

static char *detok(gerbil_tokenizer_t tok, const int32_t *ids, int n) {
    char *t = NULL;
    size_t len = 0;
    if (!tok || n == 0 || gerbil_detokenize(tok, ids, n, 1, &t, &len) != GERBIL_OK) {
        free(t);
        return strdup("");
    }
    if (t[0] == ' ') memmove(t, t + 1, len);
    return t;
}

void srv_audio_transcriptions(struct server *srv, struct MHD_Connection *conn, const char *body, size_t n,
                              struct srv_reply *out) {
    memset(out, 0, sizeof *out);
    if (!srv->stt) {
        reply_error(out, 400, "model", "model_not_found",
                    "this server has no speech-to-text model: start gerbil serve with --stt-model M (a Moonshine "
                    "folder or repo id, e.g. UsefulSensors/moonshine-base)");
        return;
    }
    struct form f = {.limit = srv->cfg.max_body};
    struct MHD_PostProcessor *pp = MHD_create_post_processor(conn, 64 * 1024, form_iter, &f);
    if (!pp) {
        reply_error(out, 400, NULL, "invalid_request",
                    "the body must be multipart/form-data with a \"file\" field (the audio)");
        return;
    }
    enum MHD_Result pr = MHD_post_process(pp, body, n);
    MHD_destroy_post_processor(pp);
    if (f.too_big) {
        free(f.file);
        reply_error(out, 413, "file", "request_too_large", "the audio file exceeds the request limit");
        return;
    }
    if (pr != MHD_YES || !f.has_file || f.file_n == 0) {
        free(f.file);
        reply_error(out, 400, "file", "invalid_request",
                    pr != MHD_YES ? "the multipart form could not be parsed" : "the form has no (or an empty) \"file\" field");
        return;
    }
    const char *fmt = f.format[0] ? f.format : "json";
    if (strcmp(fmt, "json") && strcmp(fmt, "text") && strcmp(fmt, "verbose_json")) {
        free(f.file);
        char msg[128];
        snprintf(msg, sizeof msg, "response_format \"%s\" is not one of json, text, verbose_json", fmt);
        reply_error(out, 400, "response_format", "invalid_value", msg);
        return;
    }
    float *pcm;
    int64_t ns;
    gerbil_status st = gerbil_audio_read_memory(f.file, f.file_n, gerbil_stt_sample_rate(srv->stt), &pcm, &ns, NULL);
    free(f.file);
    if (st != GERBIL_OK) {
        char msg[600];
        snprintf(msg, sizeof msg, "the audio file cannot be read: %s", gerbil_last_error());
        reply_error(out, st == GERBIL_ERR_NOMEM ? 500 : 400, "file", "invalid_audio", msg);
        return;
    }
    gerbil_stt_result *r;
    st = gerbil_stt_transcribe(srv->stt, pcm, ns, NULL, &r);
    gerbil_audio_free(pcm);
    if (st != GERBIL_OK) {
        char msg[600];
        snprintf(msg, sizeof msg, "%s", gerbil_last_error());
        int bad = st == GERBIL_ERR_INVALID_ARG;
        reply_error(out, bad ? 400 : 500, bad ? "file" : NULL, bad ? "invalid_audio" : "transcription_failed", msg);
        return;
    }
    char *text = detok(srv->stt_tok, r->ids, r->n_ids);
    if (!strcmp(fmt, "text")) {
        size_t l = strlen(text);
        char *t = malloc(l + 2);
        if (t) {
            memcpy(t, text, l);
            t[l] = '\n';
            t[l + 1] = 0;
        }
        reply(out, 200, "text/plain; charset=utf-8", t);
    } else {
        cJSON *j = cJSON_CreateObject();
        if (!strcmp(fmt, "verbose_json")) {
            cJSON_AddStringToObject(j, "task", "transcribe");
            cJSON_AddStringToObject(j, "language", "english");
            cJSON_AddNumberToObject(j, "duration", r->audio_s);
        }
        cJSON_AddStringToObject(j, "text", text);
        if (!strcmp(fmt, "verbose_json")) {
            cJSON *segs = cJSON_AddArrayToObject(j, "segments");
            for (int s = 0; s < r->n_segments; s++) {
                const gerbil_stt_segment *g = &r->segments[s];
                cJSON *o = cJSON_CreateObject();
                cJSON_AddNumberToObject(o, "id", s);
                cJSON_AddNumberToObject(o, "start", g->start);
                cJSON_AddNumberToObject(o, "end", g->end);
                char *t = detok(srv->stt_tok, g->ids, g->n_ids);
                cJSON_AddStringToObject(o, "text", t);
                free(t);
                cJSON *ids = cJSON_AddArrayToObject(o, "tokens");
                for (int i = 0; i < g->n_ids; i++) cJSON_AddItemToArray(ids, cJSON_CreateNumber(g->ids[i]));
                cJSON_AddItemToArray(segs, o);
            }
        }
        reply(out, 200, "application/json", cJSON_PrintUnformatted(j));
        cJSON_Delete(j);
    }
    free(text);
    gerbil_stt_result_free(r);
    if (!out->body) reply_error(out, 500, NULL, "out_of_memory", "out of memory");
}
