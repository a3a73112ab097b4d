/* The HTTP side of `gerbil serve`: an OpenAI-compatible API over libmicrohttpd
 * (one thread per connection, so a stream's reader can wait for its tokens), in front
 * of the scheduler (sched.h).
 *
 * Routes: POST /v1/chat/completions, POST /v1/completions, POST /v1/embeddings (embed.c), GET /v1/models, GET /health,
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

enum { SRV_N_STATUS = 11, SRV_GRAMMAR_CACHE = 16 };

/* A compiled constraint kept by its source (kind + text), LRU. */
struct srv_gcache {
    char *key;
    size_t key_len;
    struct srv_grammar *g;     /* the cache's reference */
    uint64_t tick;
};

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
    /* structured output: compiled grammars by source (under gmu); the vocabulary trie is the
     * scheduler's (s->gvocab, built on first use, freed with it) */
    pthread_mutex_t gmu;
    struct srv_gcache gcache[SRV_GRAMMAR_CACHE];
    uint64_t gtick;
    int tool_fmt;              /* enum srv_tool_fmt of the chat template */
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

/* ---- tools.c: OpenAI tool calling ---- */
struct cJSON;
/* How a chat template's model writes tool calls (chosen from the template's text, as
 * llama.cpp's common/chat.cpp does). */
enum srv_tool_fmt {
    SRV_TOOLS_NONE = 0,  /* a format gerbil does not parse (e.g. Gemma 4): calls stay content */
    SRV_TOOLS_HERMES,    /* Hermes / Qwen3 / SmolLM3: <tool_call>{"name", "arguments"}</tool_call> */
    SRV_TOOLS_QWEN_XML,  /* Qwen3.5 / Qwen3-Coder: <tool_call><function=N><parameter=K>V</parameter>... */
    SRV_TOOLS_LLAMA3,    /* Llama 3.1 / 3.2: {"name": N, "parameters": {...}} (optionally <|python_tag|>) */
    SRV_TOOLS_MISTRAL,   /* [TOOL_CALLS][{"name", "arguments"}, ...] or [TOOL_CALLS]N[ARGS]{...} */
};
/* The format for a template's source; no template, or one that never mentions tools: Hermes
 * (the generic choice for forced calls). */
enum srv_tool_fmt srv_tool_format(const char *template_src);
const char *srv_tool_format_name(enum srv_tool_fmt f);
/* The tool calls in a choice's content text t[0..n): a cJSON array of OpenAI tool_calls
 * ({"id", "type": "function", "function": {"name", "arguments": JSON text}}), or NULL when
 * there are none or any of them does not parse (the text then stays content). *content_end:
 * where the content before the calls ends (trailing whitespace cut). tools: the request's
 * definitions (names for Llama 3's bare JSON, parameter types for the XML format); parallel 0:
 * the first call only. id_seed makes the call ids. */
struct cJSON *srv_tool_parse(enum srv_tool_fmt f, const char *t, size_t n, const struct cJSON *tools, int parallel,
                             uint64_t id_seed, size_t *content_end);
/* Streaming: how many bytes of t[0..n) are content for sure (never part of a call). */
size_t srv_tool_safe_len(enum srv_tool_fmt f, const char *t, size_t n);
/* A GERBIL_GRAMMAR_SEQUENCE spec (malloc'd JSON text) that forces one call of the function
 * named name (NULL: any of tools; parallel: one or more) in format f, its arguments by the
 * function's parameters schema. NULL with *why set when a tool definition is malformed. */
char *srv_tool_grammar(enum srv_tool_fmt f, const struct cJSON *tools, const char *name, int parallel,
                       const char **why);

/* POST /v1/embeddings (embed.c): the HTTP status and its JSON answer (*json malloc'd).
 * srv_embed_set_dir names the model folder (its modules.json); srv_embed_free at the end. */
int srv_embeddings(struct server *srv, const char *body, size_t len, char **json);
void srv_embed_set_dir(const char *dir);
void srv_embed_free(void);

/* The chat page (page.c, generated at build time from src/serve/page/chat.html). */
extern const unsigned char gerbil_chat_page[];
extern const size_t gerbil_chat_page_len;

#endif
