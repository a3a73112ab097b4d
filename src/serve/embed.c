/* POST /v1/embeddings (OpenAI's shape): input as a string, an array of strings, an array of
 * token ids or an array of arrays of them; encoding_format float | base64 (little-endian
 * float32); dimensions (Matryoshka). The embedder (src/embed) is made on the first request
 * over the server's model and tokenizer; its context is its own, so requests take turns on
 * it (one mutex) while each forward takes the model's lock like the scheduler's does. */
#include "serve/server.h"
#include "base/status.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { EMBED_MAX_INPUTS = 2048 };

static pthread_mutex_t embed_mu = PTHREAD_MUTEX_INITIALIZER;
static gerbil_embedder_t embedder;
static char *embed_dir;
static char embed_err[512]; /* why the model cannot embed (once tried) */
static int embed_tried;

void srv_embed_set_dir(const char *dir) {
    free(embed_dir);
    embed_dir = dir ? strdup(dir) : NULL;
}

void srv_embed_free(void) {
    pthread_mutex_lock(&embed_mu);
    gerbil_embedder_free(embedder);
    embedder = NULL;
    embed_tried = 0;
    free(embed_dir);
    embed_dir = NULL;
    pthread_mutex_unlock(&embed_mu);
}

static int error_out(char **json, int status, const char *param, const char *code, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cJSON *e = cJSON_CreateObject(), *o = cJSON_AddObjectToObject(e, "error");
    cJSON_AddStringToObject(o, "message", msg);
    cJSON_AddStringToObject(o, "type", status >= 500 ? "server_error" : "invalid_request_error");
    if (param) cJSON_AddStringToObject(o, "param", param);
    else cJSON_AddNullToObject(o, "param");
    if (code) cJSON_AddStringToObject(o, "code", code);
    else cJSON_AddNullToObject(o, "code");
    *json = cJSON_PrintUnformatted(e);
    cJSON_Delete(e);
    return status;
}

static char *base64(const unsigned char *p, size_t n) {
    static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *o = malloc((n + 2) / 3 * 4 + 1), *w = o;
    if (!o) return NULL;
    for (size_t i = 0; i < n; i += 3) {
        const unsigned v = (unsigned)p[i] << 16 | (i + 1 < n ? (unsigned)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        *w++ = a[v >> 18 & 63];
        *w++ = a[v >> 12 & 63];
        *w++ = i + 1 < n ? a[v >> 6 & 63] : '=';
        *w++ = i + 2 < n ? a[v & 63] : '=';
    }
    *w = 0;
    return o;
}

/* A JSON array of token ids (numbers, integral, in int32) into ids; -1 when it is not one. */
static int id_list(const cJSON *a, int32_t **ids, int *n) {
    *n = cJSON_GetArraySize(a);
    *ids = malloc(((size_t)*n + 1) * sizeof **ids);
    if (!*ids) return -1;
    int k = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, a) {
        if (!cJSON_IsNumber(x) || x->valuedouble != (double)(int32_t)x->valuedouble) return -1;
        (*ids)[k++] = (int32_t)x->valuedouble;
    }
    return 0;
}

int srv_embeddings(struct server *srv, const char *body, size_t len, char **json) {
    *json = NULL;
    cJSON *req = cJSON_ParseWithLength(body, len);
    if (!cJSON_IsObject(req)) {
        cJSON_Delete(req);
        return error_out(json, 400, NULL, "invalid_json", "the request body is not a JSON object");
    }
    int status = 200;
    const char **texts = NULL;
    int32_t **ids = NULL;
    int *n_ids = NULL, n = 0, is_ids = 0;
    float *out = NULL;
    const cJSON *in = cJSON_GetObjectItemCaseSensitive(req, "input");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(req, "encoding_format");
    const cJSON *dims = cJSON_GetObjectItemCaseSensitive(req, "dimensions");
    int b64 = 0, dim_req = 0;
    if (fmt && !cJSON_IsNull(fmt)) {
        if (!cJSON_IsString(fmt) || (strcmp(fmt->valuestring, "float") && strcmp(fmt->valuestring, "base64"))) {
            status = error_out(json, 400, "encoding_format", "invalid_value", "encoding_format must be \"float\" or \"base64\"");
            goto done;
        }
        b64 = !strcmp(fmt->valuestring, "base64");
    }
    if (dims && !cJSON_IsNull(dims)) {
        if (!cJSON_IsNumber(dims) || dims->valuedouble < 1 || dims->valuedouble > (1 << 20) ||
            dims->valuedouble != (double)(int)dims->valuedouble) {
            status = error_out(json, 400, "dimensions", "invalid_value", "dimensions must be a positive integer");
            goto done;
        }
        dim_req = (int)dims->valuedouble;
    }
    /* the inputs: a string, [strings], [ids], [[ids]] */
    if (cJSON_IsString(in)) {
        n = 1;
    } else if (cJSON_IsArray(in) && cJSON_GetArraySize(in) > 0) {
        const cJSON *f = cJSON_GetArrayItem(in, 0);
        n = cJSON_IsNumber(f) ? 1 : cJSON_GetArraySize(in);
        is_ids = cJSON_IsNumber(f) || cJSON_IsArray(f);
    }
    if (n < 1) {
        status = error_out(json, 400, "input", "invalid_value",
                           "input must be a non-empty string, array of strings, array of token ids or array of arrays of them");
        goto done;
    }
    if (n > EMBED_MAX_INPUTS) {
        status = error_out(json, 400, "input", "invalid_value", "%d inputs: at most %d per request", n, EMBED_MAX_INPUTS);
        goto done;
    }
    texts = calloc((size_t)n, sizeof *texts);
    ids = calloc((size_t)n, sizeof *ids);
    n_ids = calloc((size_t)n, sizeof *n_ids);
    if (!texts || !ids || !n_ids) {
        status = error_out(json, 500, NULL, NULL, "out of memory");
        goto done;
    }
    for (int i = 0; i < n; i++) {
        const cJSON *x = cJSON_IsString(in) ? in : (is_ids && cJSON_IsNumber(cJSON_GetArrayItem(in, 0))) ? in
                                                                                                  : cJSON_GetArrayItem(in, i);
        if (is_ids) {
            if (!cJSON_IsArray(x) || cJSON_GetArraySize(x) < 1 || id_list(x, &ids[i], &n_ids[i])) {
                status = error_out(json, 400, "input", "invalid_value",
                                   "input[%d]: token ids must be a non-empty array of integers, like every other input", i);
                goto done;
            }
        } else {
            if (!cJSON_IsString(x) || !x->valuestring[0]) {
                status = error_out(json, 400, "input", "invalid_value",
                                   "input[%d]: must be a non-empty string, like every other input", i);
                goto done;
            }
            texts[i] = x->valuestring;
        }
    }
    pthread_mutex_lock(&embed_mu);
    if (!embed_tried) {
        embed_tried = 1;
        gerbil_status st = srv->tok || is_ids ? gerbil_embedder_new(srv->model, srv->tok, embed_dir ? embed_dir : ".", &embedder)
                                              : GERBIL_ERR_UNSUPPORTED;
        if (st != GERBIL_OK) snprintf(embed_err, sizeof embed_err, "%s", srv->tok ? gerbil_last_error() : "no tokenizer");
    }
    if (!embedder) {
        pthread_mutex_unlock(&embed_mu);
        status = error_out(json, 400, "model", "model_not_supported", "model \"%s\" cannot embed: %s", srv->cfg.alias,
                           embed_err);
        goto done;
    }
    const int full = gerbil_embedder_dim(embedder);
    if (dim_req > full) {
        pthread_mutex_unlock(&embed_mu);
        status = error_out(json, 400, "dimensions", "invalid_value",
                           "dimensions %d is out of range: the model's embeddings have %d", dim_req, full);
        goto done;
    }
    const int dim = dim_req ? dim_req : full;
    out = malloc((size_t)n * dim * sizeof(float));
    const gerbil_embed_options eo = {.dimensions = dim_req};
    int n_tok = 0;
    gerbil_status st = !out ? GERBIL_ERR_NOMEM
                     : is_ids ? gerbil_embed_ids(embedder, (const int32_t *const *)ids, n_ids, n, &eo, out, &n_tok)
                              : gerbil_embed(embedder, texts, n, &eo, out, &n_tok);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", gerbil_last_error());
    pthread_mutex_unlock(&embed_mu);
    if (st != GERBIL_OK) {
        status = st == GERBIL_ERR_INVALID_ARG ? error_out(json, 400, "input", "invalid_value", "%s", msg)
                                              : error_out(json, 500, NULL, NULL, "embedding failed: %s", msg);
        goto done;
    }
    cJSON *r = cJSON_CreateObject(), *data = NULL;
    cJSON_AddStringToObject(r, "object", "list");
    data = cJSON_AddArrayToObject(r, "data");
    for (int i = 0; i < n; i++) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "object", "embedding");
        cJSON_AddNumberToObject(d, "index", i);
        const float *v = out + (size_t)i * dim;
        if (b64) {
            char *s = base64((const unsigned char *)v, (size_t)dim * sizeof(float)); /* x86: little-endian */
            cJSON_AddStringToObject(d, "embedding", s ? s : "");
            free(s);
        } else {
            cJSON *a = cJSON_AddArrayToObject(d, "embedding");
            for (int k = 0; k < dim; k++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v[k]));
        }
        cJSON_AddItemToArray(data, d);
    }
    cJSON_AddStringToObject(r, "model", srv->cfg.alias);
    cJSON *u = cJSON_AddObjectToObject(r, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", n_tok);
    cJSON_AddNumberToObject(u, "total_tokens", n_tok);
    *json = cJSON_PrintUnformatted(r);
    cJSON_Delete(r);
    if (!*json) status = error_out(json, 500, NULL, NULL, "out of memory");
done:
    for (int i = 0; ids && i < n; i++) free(ids[i]);
    free(ids);
    free(n_ids);
    free(texts);
    free(out);
    cJSON_Delete(req);
    return status;
}
