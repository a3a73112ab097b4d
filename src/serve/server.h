/* The HTTP side of `gerbil serve`: an OpenAI-compatible API over libmicrohttpd
 * (one thread per connection, so a stream's reader can wait for its tokens), in front
 * of the scheduler (sched.h).
 *
 * Routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health,
 * GET /metrics, POST /tokenize, POST /detokenize, GET / (the chat page), and with --stt-model
 * POST /v1/audio/transcriptions (audio.c). Errors are
 * OpenAI's {"error": {"message", "type", "param", "code"}}. */
#ifndef GB_SERVE_SERVER_H
#define GB_SERVE_SERVER_H

#include "serve/sched.h"

#include <stddef.h>
#include <stdint.h>

struct srv_config {
    const char *host;          /* default 127.0.0.1 */
    int port;                  /* 0: any free port */
    const char *api_key;       /* NULL: no key */
    const char *cors;          /* NULL: no CORS headers */
    const char *alias;         /* the model's name in the API */
    size_t max_body;           /* request body limit in bytes */
    size_t max_header;         /* request header memory limit in bytes */
    int n_ctx_seq;             /* positions per sequence (prompt + completion) */
    int max_n;                 /* the most choices per request */
};

enum { SRV_N_STATUS = 11 };

struct server {
    struct srv_config cfg;
    struct MHD_Daemon *d;
    int port;                  /* the port bound */
    struct sched *s;           /* NULL while loading */
    gerbil_model_t model;
    gerbil_tokenizer_t tok;
    gerbil_chat_template_t tmpl;
    int32_t ctx_tok;           /* a token pieces are decoded after (token_str), or -1 */
    volatile int ready, stopping;
    int active_jobs;           /* requests being answered (atomic) */
    int64_t created;
    pthread_mutex_t mu;        /* the counters below */
    uint64_t by_status[SRV_N_STATUS];
    uint64_t requests_total;
    gerbil_model_t stt;        /* --stt-model: the speech-to-text model of /v1/audio/transcriptions, or NULL */
    gerbil_tokenizer_t stt_tok;
};

/* POST /v1/audio/transcriptions (audio.c): the reply's status, content type and body
 * (malloc'd; http.c sends and frees it). */
struct MHD_Connection;
struct srv_reply {
    int status;
    const char *type;
    char *body;
    size_t len;
};
void srv_audio_transcriptions(struct server *srv, struct MHD_Connection *conn, const char *body, size_t n,
                              struct srv_reply *out);

/* Bind and start serving (every route answers 503 until server_ready). Prints errors. */
int server_start(struct server *srv, const struct srv_config *cfg);
void server_ready(struct server *srv, struct sched *s, gerbil_model_t m, gerbil_tokenizer_t tok,
                  gerbil_chat_template_t tmpl);
/* Stop accepting, end the requests (streams get their last chunks), stop the daemon. */
void server_stop(struct server *srv);

/* Constant-time comparison of a presented key with the expected one (1: equal). */
int srv_key_equal(const char *given, size_t given_len, const char *expected);

/* A chat choice's text split into reasoning (<think>...</think>) and content, as byte ranges
 * [r0, r1) and [c0, c1). think: the prompt already opened <think>. Unless final, text that may
 * still become a tag (a partial "<think>" at the start, a partial "</think>" at the end) is left
 * out of both, so a stream never sends it to the wrong side. */
void srv_think_split(const char *t, size_t n, int think, int final, size_t *r0, size_t *r1, size_t *c0, size_t *c1);

/* The chat page (page.c, generated at build time from src/serve/page/chat.html). */
extern const unsigned char gerbil_chat_page[];
extern const size_t gerbil_chat_page_len;

#endif
