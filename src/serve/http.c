/* The HTTP server (server.h): routing, authentication, CORS, limits, errors, and the
 * OpenAI endpoints' requests and responses (streamed as server-sent events). */
#include "serve/server.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#define GB_PRINTF_HTTP __attribute__((format(printf, 6, 7)))
#define GB_PRINTF_HTTP2 __attribute__((format(printf, 5, 6)))

/* ---- small things ---- */

int srv_key_equal(const char *given, size_t given_len, const char *expected) {
    const size_t n = strlen(expected);
    unsigned diff = (unsigned)(given_len ^ n);
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)(given_len ? given[i % given_len] : 0) ^ (unsigned char)expected[i];
    return diff == 0;
}

struct buf {
    char *p;
    size_t n, cap;
};

static void buf_add(struct buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap * 2 : 1024;
        while (c < b->n + n + 1) c *= 2;
        char *q = realloc(b->p, c);
        if (!q) return;
        b->p = q;
        b->cap = c;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void buf_str(struct buf *b, const char *s) { buf_add(b, s, strlen(s)); }

static void count_status(struct server *srv, int status) {
    static const int codes[SRV_N_STATUS] = {200, 204, 400, 401, 404, 405, 413, 429, 500, 503, 0};
    int k = SRV_N_STATUS - 1;
    for (int i = 0; i < SRV_N_STATUS - 1; i++)
        if (codes[i] == status) k = i;
    pthread_mutex_lock(&srv->mu);
    srv->by_status[k]++;
    srv->requests_total++;
    pthread_mutex_unlock(&srv->mu);
}

static void add_common_headers(struct server *srv, struct MHD_Response *r) {
    if (srv->cfg.cors) {
        MHD_add_response_header(r, "Access-Control-Allow-Origin", srv->cfg.cors);
        MHD_add_response_header(r, "Vary", "Origin");
    }
}

static enum MHD_Result send_body(struct server *srv, struct MHD_Connection *conn, int status, const char *type,
                                 const void *body, size_t len, const char *retry_after) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    if (retry_after) MHD_add_response_header(r, "Retry-After", retry_after);
    add_common_headers(srv, r);
    enum MHD_Result ret = MHD_queue_response(conn, (unsigned)status, r);
    MHD_destroy_response(r);
    count_status(srv, status);
    return ret;
}

static enum MHD_Result send_json(struct server *srv, struct MHD_Connection *conn, int status, cJSON *j) {
    char *t = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!t) return send_body(srv, conn, 500, "text/plain", "out of memory", 13, NULL);
    enum MHD_Result r = send_body(srv, conn, status, "application/json", t, strlen(t), NULL);
    free(t);
    return r;
}

static cJSON *error_json(const char *type, const char *param, const char *code, const char *msg) {
    cJSON *e = cJSON_CreateObject(), *o = cJSON_AddObjectToObject(e, "error");
    cJSON_AddStringToObject(o, "message", msg);
    cJSON_AddStringToObject(o, "type", type);
    if (param) cJSON_AddStringToObject(o, "param", param);
    else cJSON_AddNullToObject(o, "param");
    if (code) cJSON_AddStringToObject(o, "code", code);
    else cJSON_AddNullToObject(o, "code");
    return e;
}

static enum MHD_Result send_error(struct server *srv, struct MHD_Connection *conn, int status, const char *param,
                                  const char *code, const char *fmt, ...) GB_PRINTF_HTTP;

static const char *error_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    case 500: return "server_error";
    case 503: return "server_error";
    default: return "invalid_request_error";
    }
}

static enum MHD_Result send_error(struct server *srv, struct MHD_Connection *conn, int status, const char *param,
                                  const char *code, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cJSON *e = error_json(error_type(status), param, code, msg);
    char *t = cJSON_PrintUnformatted(e);
    cJSON_Delete(e);
    enum MHD_Result r = send_body(srv, conn, status, "application/json", t ? t : "{}", t ? strlen(t) : 2,
                                  status == 429 || status == 503 ? "1" : NULL);
    free(t);
    return r;
}

/* ---- request bodies ---- */

struct conn_ctx {
    struct buf body;
    int too_big;
    int answered;
};

/* An API error found while reading a request. */
struct api_err {
    int status;
    const char *param, *code;
    char msg[512];
};

static int fail(struct api_err *e, int status, const char *param, const char *code, const char *fmt, ...)
    GB_PRINTF_HTTP2;
static int fail(struct api_err *e, int status, const char *param, const char *code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    e->status = status;
    e->param = param;
    e->code = code;
    return -1;
}

static const cJSON *field(const cJSON *o, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

static int get_bool(const cJSON *o, const char *name, int *out, struct api_err *e) {
    const cJSON *v = field(o, name);
    if (!v) return 0;
    if (!cJSON_IsBool(v)) return fail(e, 400, name, "invalid_type", "'%s' must be a boolean", name);
    *out = cJSON_IsTrue(v);
    return 0;
}

static int get_num(const cJSON *o, const char *name, double lo, double hi, float *out, struct api_err *e) {
    const cJSON *v = field(o, name);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return fail(e, 400, name, "invalid_type", "'%s' must be a number", name);
    if (v->valuedouble < lo || v->valuedouble > hi)
        return fail(e, 400, name, "invalid_value", "'%s' must be in [%g, %g], got %g", name, lo, hi, v->valuedouble);
    *out = (float)v->valuedouble;
    return 0;
}

static int get_int(const cJSON *o, const char *name, double lo, double hi, int *out, struct api_err *e) {
    const cJSON *v = field(o, name);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
        return fail(e, 400, name, "invalid_type", "'%s' must be an integer", name);
    if (v->valuedouble < lo || v->valuedouble > hi)
        return fail(e, 400, name, "invalid_value", "'%s' must be in [%.0f, %.0f], got %.0f", name, lo, hi,
                    v->valuedouble);
    *out = (int)v->valuedouble;
    return 0;
}

static uint64_t random_seed(void) {
    static uint64_t counter;
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return ((uint64_t)t.tv_nsec << 20) ^ (uint64_t)t.tv_sec ^ (__atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED) * 0x9e3779b97f4a7c15ULL);
}

/* The sampling and generation fields shared by chat and completions. */
static int parse_params(struct server *srv, const cJSON *o, int chat, struct srv_params *p, struct api_err *e) {
    memset(p, 0, sizeof *p);
    p->temperature = 1.0f;
    p->top_p = 1.0f;
    p->repetition_penalty = 1.0f;
    p->max_tokens = -1;
    p->n = 1;
    p->cache_prompt = 1;
    const cJSON *v;
    if ((v = field(o, "model"))) {
        if (!cJSON_IsString(v)) return fail(e, 400, "model", "invalid_type", "'model' must be a string");
        if (strcmp(v->valuestring, srv->cfg.alias))
            return fail(e, 404, "model", "model_not_found", "The model '%s' does not exist (this server serves '%s')",
                        v->valuestring, srv->cfg.alias);
    }
    if (get_num(o, "temperature", 0, 100, &p->temperature, e) || get_num(o, "top_p", 0, 1, &p->top_p, e) ||
        get_num(o, "min_p", 0, 1, &p->min_p, e) || get_int(o, "top_k", -1, 1 << 30, &p->top_k, e) ||
        get_num(o, "repetition_penalty", 1e-3, 100, &p->repetition_penalty, e) ||
        get_num(o, "repeat_penalty", 1e-3, 100, &p->repetition_penalty, e) ||
        get_num(o, "presence_penalty", -2, 2, &p->presence_penalty, e) ||
        get_num(o, "frequency_penalty", -2, 2, &p->frequency_penalty, e) ||
        get_int(o, "n", 1, srv->cfg.max_n, &p->n, e) || get_bool(o, "ignore_eos", &p->ignore_eos, e) ||
        get_bool(o, "cache_prompt", &p->cache_prompt, e))
        return -1;
    if (p->top_p <= 0.0f) return fail(e, 400, "top_p", "invalid_value", "'top_p' must be > 0");
    if (p->top_k < 0) p->top_k = 0;
    int mt = -1, mct = -1;
    if (get_int(o, "max_tokens", 1, 1 << 24, &mt, e) || get_int(o, "max_completion_tokens", 1, 1 << 24, &mct, e))
        return -1;
    p->max_tokens = mct > 0 ? mct : mt;
    p->seed = random_seed();
    if ((v = field(o, "seed"))) {
        if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
            return fail(e, 400, "seed", "invalid_type", "'seed' must be an integer");
        p->seed = (uint64_t)(int64_t)v->valuedouble;
    }
    if ((v = field(o, "stop"))) {
        if (cJSON_IsString(v)) {
            if (v->valuestring[0]) p->stops[p->n_stops++] = strdup(v->valuestring);
        } else if (cJSON_IsArray(v)) {
            const cJSON *it;
            cJSON_ArrayForEach(it, v) {
                if (!cJSON_IsString(it)) return fail(e, 400, "stop", "invalid_type", "'stop' must hold strings");
                if (p->n_stops == SRV_MAX_STOPS)
                    return fail(e, 400, "stop", "invalid_value", "at most %d stop strings", SRV_MAX_STOPS);
                if (it->valuestring[0]) p->stops[p->n_stops++] = strdup(it->valuestring);
            }
        } else {
            return fail(e, 400, "stop", "invalid_type", "'stop' must be a string or an array of strings");
        }
    }
    if ((v = field(o, "logit_bias"))) {
        if (!cJSON_IsObject(v)) return fail(e, 400, "logit_bias", "invalid_type", "'logit_bias' must be an object");
        const int n = cJSON_GetArraySize(v), V = gerbil_model_n_vocab(srv->model);
        p->bias_ids = malloc((size_t)(n ? n : 1) * sizeof *p->bias_ids);
        p->bias_vals = malloc((size_t)(n ? n : 1) * sizeof *p->bias_vals);
        if (!p->bias_ids || !p->bias_vals) return fail(e, 500, NULL, NULL, "out of memory");
        const cJSON *it;
        cJSON_ArrayForEach(it, v) {
            char *end;
            long id = strtol(it->string, &end, 10);
            if (end == it->string || *end || id < 0 || id >= V)
                return fail(e, 400, "logit_bias", "invalid_value", "logit_bias key \"%s\" is not a token id in [0, %d)",
                            it->string, V);
            if (!cJSON_IsNumber(it) || it->valuedouble < -100 || it->valuedouble > 100)
                return fail(e, 400, "logit_bias", "invalid_value", "logit_bias values must be numbers in [-100, 100]");
            p->bias_ids[p->n_bias] = (int32_t)id;
            p->bias_vals[p->n_bias++] = (float)it->valuedouble;
        }
    }
    if (chat) {
        if (get_bool(o, "logprobs", &p->logprobs, e) ||
            get_int(o, "top_logprobs", 0, SRV_MAX_TOP_LOGPROBS, &p->top_logprobs, e))
            return -1;
        if (p->top_logprobs && !p->logprobs)
            return fail(e, 400, "top_logprobs", "invalid_value", "'top_logprobs' needs 'logprobs': true");
    } else {
        int lp = -1;
        if (get_int(o, "logprobs", 0, SRV_MAX_TOP_LOGPROBS, &lp, e)) return -1;
        if (lp >= 0) {
            p->logprobs = 1;
            p->top_logprobs = lp;
        }
    }
    return 0;
}

/* Prompt length against the context: the completion's budget. */
static int fit_context(struct server *srv, int n_prompt, struct srv_params *p, struct api_err *e) {
    const int n_ctx = srv->cfg.n_ctx_seq;
    if (n_prompt < 1) return fail(e, 400, "prompt", "invalid_value", "the prompt is empty (0 tokens)");
    if (p->max_tokens < 0) {
        if (n_prompt >= n_ctx)
            return fail(e, 400, "messages", "context_length_exceeded",
                        "This model's maximum context length is %d tokens. However, your prompt is %d tokens, "
                        "leaving no room for a completion.", n_ctx, n_prompt);
        p->max_tokens = n_ctx - n_prompt;
    } else if (n_prompt + p->max_tokens > n_ctx) {
        return fail(e, 400, "max_tokens", "context_length_exceeded",
                    "This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the "
                    "prompt, %d for the completion). Please reduce the prompt or the completion length.",
                    n_ctx, n_prompt + p->max_tokens, n_prompt, p->max_tokens);
    }
    return 0;
}

/* Text of a message's content: a string, or the text parts of a content-part array. */
static int content_text(const cJSON *c, struct buf *out, struct api_err *e) {
    if (!c) return 0;
    if (cJSON_IsString(c)) { buf_str(out, c->valuestring); return 0; }
    if (!cJSON_IsArray(c))
        return fail(e, 400, "messages", "invalid_type", "a message's content must be a string or an array of parts");
    const cJSON *part;
    cJSON_ArrayForEach(part, c) {
        const cJSON *type = field(part, "type"), *text = field(part, "text");
        if (!cJSON_IsObject(part) || !cJSON_IsString(type))
            return fail(e, 400, "messages", "invalid_type", "a content part must be an object with a 'type'");
        if (strcmp(type->valuestring, "text"))
            return fail(e, 400, "messages", "invalid_value", "content parts of type '%s' are not supported (text only)",
                        type->valuestring);
        if (!cJSON_IsString(text)) return fail(e, 400, "messages", "invalid_type", "a text part needs a string 'text'");
        buf_str(out, text->valuestring);
    }
    return 0;
}

/* A chat request's prompt ids; *think: the prompt leaves the model inside <think>. */
/* An assistant message's tool_calls as templates read them: arguments (a JSON string in
 * OpenAI's API) parsed into an object, as transformers' templates expect a mapping. */
static int norm_tool_calls(cJSON *msg, struct api_err *e) {
    cJSON *tc = cJSON_GetObjectItemCaseSensitive(msg, "tool_calls"), *c;
    if (!tc || cJSON_IsNull(tc)) {
        if (tc) cJSON_DeleteItemFromObjectCaseSensitive(msg, "tool_calls");
        return 0;
    }
    if (!cJSON_IsArray(tc)) return fail(e, 400, "messages", "invalid_type", "a message's 'tool_calls' must be an array");
    cJSON_ArrayForEach(c, tc) {
        cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsObject(c) || !cJSON_IsObject(fn) || !cJSON_IsString(nm))
            return fail(e, 400, "messages", "invalid_value",
                        "each tool call needs a 'function' object with a string 'name'");
        cJSON *a = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        if (cJSON_IsString(a)) {
            cJSON *parsed = cJSON_Parse(a->valuestring);
            if (!cJSON_IsObject(parsed)) {
                cJSON_Delete(parsed);
                return fail(e, 400, "messages", "invalid_value",
                            "the arguments of the tool call to '%s' are not a JSON object", nm->valuestring);
            }
            cJSON_ReplaceItemInObjectCaseSensitive(fn, "arguments", parsed);
        } else if (a && !cJSON_IsObject(a)) {
            return fail(e, 400, "messages", "invalid_type", "a tool call's 'arguments' must be a JSON string or object");
        } else if (!a) {
            cJSON_AddObjectToObject(fn, "arguments");
        }
    }
    return 0;
}

static int chat_prompt(struct server *srv, const cJSON *o, int use_tools, int32_t **ids, int *n, int *think,
                       struct api_err *e) {
    const cJSON *msgs = field(o, "messages");
    if (!msgs) return fail(e, 400, "messages", "missing_required_parameter", "'messages' is required");
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0)
        return fail(e, 400, "messages", "invalid_type", "'messages' must be a non-empty array");
    cJSON *norm = cJSON_CreateArray();
    struct buf joined = {0};
    const cJSON *m;
    int rc = 0;
    cJSON_ArrayForEach(m, msgs) {
        const cJSON *role = field(m, "role");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role)) {
            rc = fail(e, 400, "messages", "invalid_type", "each message must be an object with a string 'role'");
            break;
        }
        const char *r = role->valuestring;
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "tool") &&
            strcmp(r, "developer")) {
            rc = fail(e, 400, "messages", "invalid_value", "unknown message role '%s'", r);
            break;
        }
        struct buf text = {0};
        if (content_text(field(m, "content"), &text, e)) { free(text.p); rc = -1; break; }
        cJSON *copy = cJSON_Duplicate(m, 1);
        cJSON_DeleteItemFromObjectCaseSensitive(copy, "content");
        cJSON_AddStringToObject(copy, "content", text.p ? text.p : "");
        if (!strcmp(r, "developer")) cJSON_ReplaceItemInObjectCaseSensitive(copy, "role", cJSON_CreateString("system"));
        if (norm_tool_calls(copy, e)) { cJSON_Delete(copy); free(text.p); rc = -1; break; }
        cJSON_AddItemToArray(norm, copy);
        if (joined.n) buf_str(&joined, "\n");
        buf_str(&joined, text.p ? text.p : "");
        free(text.p);
    }
    char *prompt = NULL;
    gerbil_status st = GERBIL_OK;
    int add_special = 0;
    if (!rc && srv->tmpl) {
        char *mj = cJSON_PrintUnformatted(norm), *tj = NULL;
        const cJSON *tools = use_tools ? field(o, "tools") : NULL;
        if (tools) tj = cJSON_PrintUnformatted(tools);
        const char *names[16], *vals[16];
        char *owned[16];
        int nv = 0;
        const cJSON *kw = field(o, "chat_template_kwargs");
        if (kw && !cJSON_IsObject(kw)) rc = fail(e, 400, "chat_template_kwargs", "invalid_type", "must be an object");
        const cJSON *it;
        if (kw && !rc)
            cJSON_ArrayForEach(it, kw) {
                if (nv == 16) break;
                names[nv] = it->string;
                owned[nv] = cJSON_PrintUnformatted(it);
                vals[nv] = owned[nv];
                nv++;
            }
        if (!rc) {
            st = gerbil_chat_template_apply(srv->tmpl, mj, tj, 1, names, vals, nv, &prompt);
            if (st != GERBIL_OK)
                rc = fail(e, 400, "messages", "invalid_value", "the chat template failed: %s", gerbil_last_error());
        }
        for (int i = 0; i < nv; i++) free(owned[i]);
        free(mj);
        free(tj);
    } else if (!rc) {
        prompt = joined.p ? strdup(joined.p) : strdup(""); /* no template: the contents, one per line */
        add_special = 1;
    }
    cJSON_Delete(norm);
    free(joined.p);
    if (rc) { free(prompt); return -1; }
    *think = 0;
    size_t L = strlen(prompt);
    while (L && (prompt[L - 1] == '\n' || prompt[L - 1] == ' ')) L--;
    if (L >= 7 && !memcmp(prompt + L - 7, "<think>", 7)) *think = 1;
    st = gerbil_tokenize(srv->tok, prompt, strlen(prompt), add_special, ids, n);
    free(prompt);
    if (st != GERBIL_OK) return fail(e, 400, "messages", "invalid_value", "cannot tokenize: %s", gerbil_last_error());
    return 0;
}

/* One prompt of /v1/completions: a string or an array of token ids. */
static int completion_prompt(struct server *srv, const cJSON *v, int32_t **ids, int *n, struct api_err *e) {
    if (cJSON_IsString(v)) {
        if (!srv->tok) return fail(e, 400, "prompt", "invalid_value", "this model has no tokenizer: send token ids");
        gerbil_status st = gerbil_tokenize(srv->tok, v->valuestring, strlen(v->valuestring), 1, ids, n);
        if (st != GERBIL_OK) return fail(e, 400, "prompt", "invalid_value", "cannot tokenize: %s", gerbil_last_error());
        return 0;
    }
    const int len = cJSON_GetArraySize(v), V = gerbil_model_n_vocab(srv->model);
    *ids = malloc((size_t)(len ? len : 1) * sizeof **ids);
    *n = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, v) {
        if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) || it->valuedouble < 0 ||
            it->valuedouble >= V) {
            free(*ids);
            *ids = NULL;
            return fail(e, 400, "prompt", "invalid_value", "prompt token ids must be integers in [0, %d)", V);
        }
        (*ids)[(*n)++] = (int32_t)it->valuedouble;
    }
    return 0;
}

static int is_id_array(const cJSON *v) {
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) == 0) return 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, v) if (!cJSON_IsNumber(it)) return 0;
    return 1;
}

/* ---- jobs: the requests one HTTP request made ---- */

enum { JOB_MAX_PROMPTS = 64 };

struct job {
    struct server *srv;
    int chat, stream, include_usage, echo;
    int think;                 /* chat: the prompt opened <think> */
    int tool_mode;             /* TOOLS_* */
    int parallel_tools;        /* parallel_tool_calls */
    cJSON *tools;              /* the request's tools (a copy), when tool_mode */
    int c_kind;                /* the constraint (gerbil_grammar_kind), compiled after the prompt */
    char *c_src;               /* its source, or NULL: none */
    const char *c_param;       /* the field it came from */
    uint64_t id_seed;          /* tool call ids */
    int n_reqs;
    struct srv_req *reqs[JOB_MAX_PROMPTS];
    int n_choices;             /* n_reqs * n */
    char id[48];
    int64_t created;
    int fd;                    /* the client socket (hangup checks) */
    /* streaming state, per choice */
    struct {
        int role_sent, fin_sent, think;
        size_t sent_r, sent_c; /* text bytes sent as reasoning / content (absolute offsets) */
        int sent_tok;          /* logprob entries sent */
    } *st;
    struct buf out;            /* SSE bytes not yet handed to MHD */
    size_t out_pos;
    int finished;              /* [DONE] queued */
};

static void job_free(struct job *j) {
    if (!j) return;
    __atomic_sub_fetch(&j->srv->active_jobs, 1, __ATOMIC_ACQ_REL);
    for (int i = 0; i < j->n_reqs; i++) {
        sched_cancel(j->srv->s, j->reqs[i]);
        sched_release(j->srv->s, j->reqs[i]);
    }
    free(j->st);
    cJSON_Delete(j->tools);
    free(j->c_src);
    free(j->out.p);
    free(j);
}

static struct srv_choice *job_choice(struct job *j, int k, struct srv_req **r) {
    const int n = j->reqs[0]->p.n;
    *r = j->reqs[k / n];
    return &(*r)->ch[k % n];
}

enum { TOOLS_OFF = 0, TOOLS_AUTO, TOOLS_REQUIRED, TOOLS_NAMED };

/* The format the job's calls come in: the template's; a forced call in a format gerbil does
 * not parse is written (by its grammar) and parsed as Hermes. */
static enum srv_tool_fmt job_tool_fmt(const struct job *j) {
    const enum srv_tool_fmt f = (enum srv_tool_fmt)j->srv->tool_fmt;
    return f == SRV_TOOLS_NONE && j->tool_mode >= TOOLS_REQUIRED ? SRV_TOOLS_HERMES : f;
}

/* The tool calls in choice k's content text[c0, c1) (NULL: none; then the text is content),
 * *ce: where the content before them ends. */
static cJSON *choice_calls(struct job *j, int k, const char *text, size_t c0, size_t c1, size_t *ce) {
    *ce = c1;
    if (j->tool_mode == TOOLS_OFF) return NULL;
    size_t e = 0;
    cJSON *calls = srv_tool_parse(job_tool_fmt(j), text + c0, c1 - c0, j->tools,
                                  j->parallel_tools, j->id_seed + (uint64_t)k * 0x9e3779b97f4a7c15ULL, &e);
    if (calls) *ce = c0 + e;
    return calls;
}

static const char *finish_name(enum srv_finish f) {
    switch (f) {
    case SRV_FIN_STOP: return "stop";
    case SRV_FIN_LENGTH: return "length";
    case SRV_FIN_CANCELLED: return "abort";
    default: return "error";
    }
}

/* Split a chat choice's text into reasoning (inside <think>...</think>) and content.
 * final: no more text comes. Outputs byte ranges; the *_safe ends exclude text that may
 * still turn out to be part of a tag. */
void srv_think_split(const char *t, size_t n, int think, int final, size_t *r0, size_t *r1, size_t *c0,
                     size_t *c1) {
    static const char open[] = "<think>", close[] = "</think>";
    size_t off = 0;
    *r0 = *r1 = *c0 = *c1 = 0;
    if (!think) {
        size_t k = 0;
        while (k < n && (t[k] == '\n' || t[k] == ' ')) k++;
        if (n - k >= 7 && !memcmp(t + k, open, 7)) {
            think = 1;
            off = k + 7;
        } else if (!final && n - k < 7 && !memcmp(t + k, open, n - k)) {
            return; /* could still become <think> */
        }
    }
    if (!think) {
        *c0 = 0;
        *c1 = n;
        return;
    }
    while (off < n && t[off] == '\n') off++; /* reasoning without its surrounding newlines */
    *r0 = off;
    const char *end = NULL;
    for (size_t i = off; i + 8 <= n && !end; i++)
        if (!memcmp(t + i, close, 8)) end = t + i;
    if (!end) {
        size_t hold = 0;
        if (!final)
            for (size_t h = 7; h > 0; h--)
                if (n >= off + h && !memcmp(t + n - h, close, h)) { hold = h; break; }
        *r1 = n - hold;
        if (!final)
            while (*r1 > *r0 && t[*r1 - 1] == '\n') (*r1)--; /* may be the newline before </think> */
        if (*r1 < *r0) *r1 = *r0;
        *c0 = *c1 = n;
        return;
    }
    *r1 = (size_t)(end - t);
    size_t k = *r1 + 8;
    while (k < n && (t[k] == '\n' || t[k] == ' ')) k++;
    if (k == n && !final) { *c0 = *c1 = n; return; }
    *c0 = k;
    *c1 = n;
    while (*r1 > *r0 && t[*r1 - 1] == '\n') (*r1)--;
}

/* The text of one token (logprobs, pieces): decoded after a fixed token and cut from its
 * text, so a SentencePiece piece keeps its leading space. */
static char *token_str(struct server *srv, int32_t id) {
    char *t = NULL, *pre = NULL;
    size_t n, np;
    int32_t two[2] = {srv->ctx_tok, id};
    if (srv->tok && srv->ctx_tok >= 0 && gerbil_detokenize(srv->tok, two, 1, 0, &pre, &np) == GERBIL_OK &&
        gerbil_detokenize(srv->tok, two, 2, 0, &t, &n) == GERBIL_OK && n >= np && !memcmp(t, pre, np)) {
        memmove(t, t + np, n - np + 1);
        free(pre);
        return t;
    }
    free(pre);
    free(t);
    t = NULL;
    if (!srv->tok || gerbil_detokenize(srv->tok, &id, 1, 0, &t, &n) != GERBIL_OK) {
        char b[24];
        snprintf(b, sizeof b, "<%d>", (int)id);
        return strdup(b);
    }
    return t;
}

static cJSON *bytes_array(const char *s) {
    cJSON *a = cJSON_CreateArray();
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) cJSON_AddItemToArray(a, cJSON_CreateNumber(*p));
    return a;
}

/* Logprob entries [from, to) of a choice, in chat's shape or the legacy completions one. */
static cJSON *logprobs_json(struct job *j, struct srv_choice *c, int from, int to, size_t text_base) {
    struct server *srv = j->srv;
    if (j->chat) {
        cJSON *o = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(o, "content");
        for (int k = from; k < to; k++) {
            const struct srv_logprob *lp = &c->lps[k];
            cJSON *e = cJSON_CreateObject();
            char *ts = token_str(srv, lp->id);
            cJSON_AddStringToObject(e, "token", ts);
            cJSON_AddNumberToObject(e, "logprob", lp->lp);
            cJSON_AddItemToObject(e, "bytes", bytes_array(ts));
            free(ts);
            cJSON *tops = cJSON_AddArrayToObject(e, "top_logprobs");
            for (int t = 0; t < lp->n_top; t++) {
                cJSON *x = cJSON_CreateObject();
                char *s = token_str(srv, lp->top_ids[t]);
                cJSON_AddStringToObject(x, "token", s);
                cJSON_AddNumberToObject(x, "logprob", lp->top_lp[t]);
                cJSON_AddItemToObject(x, "bytes", bytes_array(s));
                free(s);
                cJSON_AddItemToArray(tops, x);
            }
            cJSON_AddItemToArray(arr, e);
        }
        return o;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON *toks = cJSON_AddArrayToObject(o, "tokens"), *lps = cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(o, "top_logprobs"), *offs = cJSON_AddArrayToObject(o, "text_offset");
    size_t off = text_base;
    for (int k = from; k < to; k++) {
        const struct srv_logprob *lp = &c->lps[k];
        char *ts = token_str(srv, lp->id);
        cJSON_AddItemToArray(toks, cJSON_CreateString(ts));
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(lp->lp));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        off += strlen(ts);
        free(ts);
        cJSON *t = cJSON_CreateObject();
        for (int q = 0; q < lp->n_top; q++) {
            char *s = token_str(srv, lp->top_ids[q]);
            if (!cJSON_GetObjectItemCaseSensitive(t, s)) cJSON_AddNumberToObject(t, s, lp->top_lp[q]);
            free(s);
        }
        cJSON_AddItemToArray(tops, t);
    }
    return o;
}

static cJSON *usage_json(struct job *j) {
    int prompt = 0, completion = 0, cached = 0;
    for (int i = 0; i < j->n_reqs; i++) {
        prompt += j->reqs[i]->n_prompt;
        cached += j->reqs[i]->n_cached;
        for (int c = 0; c < j->reqs[i]->p.n; c++) completion += j->reqs[i]->ch[c].n_gen;
    }
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", completion);
    cJSON_AddNumberToObject(u, "total_tokens", prompt + completion);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", cached);
    return u;
}

static cJSON *chunk_head(struct job *j) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", j->id);
    cJSON_AddStringToObject(o, "object", j->chat ? "chat.completion.chunk" : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)j->created);
    cJSON_AddStringToObject(o, "model", j->srv->cfg.alias);
    return o;
}

static void sse(struct job *j, cJSON *o) {
    char *t = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!t) return;
    buf_str(&j->out, "data: ");
    buf_str(&j->out, t);
    buf_str(&j->out, "\n\n");
    free(t);
}

static char *echo_text(struct job *j, struct srv_req *r) {
    char *t = NULL;
    size_t n;
    if (!j->srv->tok || gerbil_detokenize(j->srv->tok, r->prompt, r->n_prompt, 1, &t, &n) != GERBIL_OK)
        return strdup("");
    return t;
}

/* New SSE events from every choice (with sched.mu held); returns 1 when all are done. */
static int stream_collect(struct job *j) {
    int all_done = 1;
    for (int k = 0; k < j->n_choices; k++) {
        struct srv_req *r;
        struct srv_choice *c = job_choice(j, k, &r);
        const int done = c->finish != SRV_FIN_NONE;
        if (j->st[k].fin_sent) continue;
        all_done &= done;
        if (c->finish == SRV_FIN_ERROR) {
            cJSON *e = error_json("server_error", NULL, NULL, r->err[0] ? r->err : "generation failed");
            sse(j, e);
            j->st[k].fin_sent = 1;
            continue;
        }
        size_t r0, r1, c0, c1;
        if (j->chat) srv_think_split(c->text ? c->text : "", c->len, j->st[k].think, done, &r0, &r1, &c0, &c1);
        else r0 = r1 = 0, c0 = 0, c1 = c->len;
        cJSON *calls = NULL;
        if (j->chat && j->tool_mode != TOOLS_OFF && c1 > c0) {
            /* text that may be (the start of) a tool call waits for the end of the choice */
            if (done) calls = choice_calls(j, k, c->text, c0, c1, &c1);
            else c1 = c0 + srv_tool_safe_len(job_tool_fmt(j), c->text + c0, c1 - c0);
        }
        const size_t sr = j->st[k].sent_r > r0 ? j->st[k].sent_r : r0;
        const size_t sc = j->st[k].sent_c > c0 ? j->st[k].sent_c : c0;
        const int has_r = r1 > sr, has_c = c1 > sc, has_lp = r->p.logprobs && c->n_gen > j->st[k].sent_tok;
        const int echo_now = !j->chat && j->echo && !j->st[k].role_sent;
        if (!has_r && !has_c && !has_lp && !echo_now && !(j->chat && !j->st[k].role_sent) && !done) continue;
        cJSON *o = chunk_head(j), *chs = cJSON_AddArrayToObject(o, "choices"), *ch = cJSON_CreateObject();
        cJSON_AddItemToArray(chs, ch);
        cJSON_AddNumberToObject(ch, "index", k);
        if (j->chat) {
            cJSON *d = cJSON_AddObjectToObject(ch, "delta");
            if (!j->st[k].role_sent) cJSON_AddStringToObject(d, "role", "assistant");
            if (has_r) {
                char *s = strndup(c->text + sr, r1 - sr);
                cJSON_AddStringToObject(d, "reasoning_content", s);
                free(s);
            }
            if (has_c || (!j->st[k].role_sent && !calls)) {
                char *s = has_c ? strndup(c->text + sc, c1 - sc) : strdup("");
                cJSON_AddStringToObject(d, "content", s);
                free(s);
            }
            if (calls) { /* OpenAI's tool_call deltas: index, id, type, name and the arguments whole */
                cJSON *it;
                int idx = 0;
                cJSON_ArrayForEach(it, calls) cJSON_AddNumberToObject(it, "index", idx++);
                cJSON_AddItemToObject(d, "tool_calls", calls);
            }
        } else {
            struct buf t = {0};
            if (echo_now) {
                char *e = echo_text(j, r);
                buf_str(&t, e);
                free(e);
            }
            if (has_c) buf_add(&t, c->text + sc, c1 - sc);
            cJSON_AddStringToObject(ch, "text", t.p ? t.p : "");
            free(t.p);
        }
        if (has_lp) {
            cJSON_AddItemToObject(ch, "logprobs", logprobs_json(j, c, j->st[k].sent_tok, c->n_gen, sc));
            j->st[k].sent_tok = c->n_gen;
        } else {
            cJSON_AddNullToObject(ch, "logprobs");
        }
        if (done) {
            cJSON_AddStringToObject(ch, "finish_reason",
                                    calls && c->finish == SRV_FIN_STOP ? "tool_calls" : finish_name(c->finish));
            j->st[k].fin_sent = 1;
        } else {
            cJSON_AddNullToObject(ch, "finish_reason");
        }
        j->st[k].role_sent = 1;
        if (has_r) j->st[k].sent_r = r1;
        if (has_c) j->st[k].sent_c = c1;
        sse(j, o);
    }
    return all_done;
}

static int peer_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *dst, size_t max) {
    (void)pos;
    struct job *j = cls;
    struct sched *s = j->srv->s;
    for (;;) {
        if (j->out_pos < j->out.n) {
            size_t n = j->out.n - j->out_pos;
            if (n > max) n = max;
            memcpy(dst, j->out.p + j->out_pos, n);
            j->out_pos += n;
            if (j->out_pos == j->out.n) j->out_pos = j->out.n = 0;
            return (ssize_t)n;
        }
        if (j->finished) return MHD_CONTENT_READER_END_OF_STREAM;
        pthread_mutex_lock(&s->mu);
        int done = stream_collect(j);
        if (done) {
            int all = 1;
            for (int k = 0; k < j->n_choices; k++) all &= j->st[k].fin_sent;
            if (all) {
                if (j->include_usage) {
                    cJSON *o = chunk_head(j);
                    cJSON_AddArrayToObject(o, "choices");
                    cJSON_AddItemToObject(o, "usage", usage_json(j));
                    sse(j, o);
                }
                buf_str(&j->out, "data: [DONE]\n\n");
                j->finished = 1;
            }
        }
        if (j->out.n == 0 && !j->finished) {
            struct srv_req *wait = NULL;
            for (int i = 0; i < j->n_reqs && !wait; i++)
                if (j->reqs[i]->state != SRV_DONE) wait = j->reqs[i];
            if (wait) sched_wait(s, wait, 100);
        }
        pthread_mutex_unlock(&s->mu);
        if (j->out.n == 0 && !j->finished && peer_gone(j->fd)) {
            for (int i = 0; i < j->n_reqs; i++) sched_cancel(s, j->reqs[i]);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

static void stream_free(void *cls) { job_free(cls); }

/* The full response of a finished job. */
static cJSON *final_json(struct job *j) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", j->id);
    cJSON_AddStringToObject(o, "object", j->chat ? "chat.completion" : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)j->created);
    cJSON_AddStringToObject(o, "model", j->srv->cfg.alias);
    cJSON *chs = cJSON_AddArrayToObject(o, "choices");
    for (int k = 0; k < j->n_choices; k++) {
        struct srv_req *r;
        struct srv_choice *c = job_choice(j, k, &r);
        cJSON *ch = cJSON_CreateObject();
        cJSON_AddNumberToObject(ch, "index", k);
        const char *text = c->text ? c->text : "";
        cJSON *calls = NULL;
        if (j->chat) {
            size_t r0, r1, c0, c1, ce;
            srv_think_split(text, c->len, j->think, 1, &r0, &r1, &c0, &c1);
            calls = choice_calls(j, k, text, c0, c1, &ce);
            cJSON *m = cJSON_AddObjectToObject(ch, "message");
            cJSON_AddStringToObject(m, "role", "assistant");
            char *cs = strndup(text + c0, ce - c0);
            if (calls && !cs[0]) cJSON_AddNullToObject(m, "content");
            else cJSON_AddStringToObject(m, "content", cs);
            free(cs);
            if (calls) cJSON_AddItemToObject(m, "tool_calls", calls);
            if (r1 > r0) {
                char *rs = strndup(text + r0, r1 - r0);
                cJSON_AddStringToObject(m, "reasoning_content", rs);
                free(rs);
            }
        } else {
            struct buf t = {0};
            if (j->echo) {
                char *e = echo_text(j, r);
                buf_str(&t, e);
                free(e);
            }
            buf_add(&t, text, c->len);
            cJSON_AddStringToObject(ch, "text", t.p ? t.p : "");
            free(t.p);
        }
        if (r->p.logprobs) cJSON_AddItemToObject(ch, "logprobs", logprobs_json(j, c, 0, c->n_gen, 0));
        else cJSON_AddNullToObject(ch, "logprobs");
        cJSON_AddStringToObject(ch, "finish_reason",
                                calls && c->finish == SRV_FIN_STOP ? "tool_calls" : finish_name(c->finish));
        cJSON_AddItemToArray(chs, ch);
    }
    cJSON_AddItemToObject(o, "usage", usage_json(j));
    return o;
}

static enum MHD_Result run_job(struct server *srv, struct MHD_Connection *conn, struct job *j) {
    struct sched *s = srv->s;
    for (int i = 0; i < j->n_reqs; i++) {
        int rc = sched_submit(s, j->reqs[i]);
        if (rc) {
            job_free(j);
            if (rc == -1)
                return send_error(srv, conn, 429, NULL, "queue_full",
                                  "The server is busy: %d requests are waiting (--queue). Retry later.",
                                  s->p.n_queue);
            return send_error(srv, conn, 503, NULL, "shutting_down", "The server is shutting down");
        }
    }
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    j->fd = ci ? ci->connect_fd : -1;
    if (j->stream) {
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, j,
                                                                   stream_free);
        if (!r) { job_free(j); return MHD_NO; }
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        add_common_headers(srv, r);
        enum MHD_Result ret = MHD_queue_response(conn, 200, r);
        MHD_destroy_response(r);
        count_status(srv, 200);
        return ret;
    }
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < j->n_reqs; i++)
        while (j->reqs[i]->state != SRV_DONE) {
            sched_wait(s, j->reqs[i], 100);
            if (j->reqs[i]->state != SRV_DONE && peer_gone(j->fd)) {
                for (int k = 0; k < j->n_reqs; k++) j->reqs[k]->cancel = 1;
                pthread_cond_signal(&s->work);
            }
        }
    const char *err = NULL;
    for (int k = 0; k < j->n_choices; k++) {
        struct srv_req *r;
        struct srv_choice *c = job_choice(j, k, &r);
        if (c->finish == SRV_FIN_ERROR) err = r->err[0] ? r->err : "generation failed";
    }
    cJSON *o = err ? NULL : final_json(j);
    char ebuf[300];
    if (err) snprintf(ebuf, sizeof ebuf, "%s", err);
    pthread_mutex_unlock(&s->mu);
    job_free(j);
    if (err) return send_error(srv, conn, 500, NULL, NULL, "%s", ebuf);
    return send_json(srv, conn, 200, o);
}

static struct job *job_new(struct server *srv, int chat) {
    struct job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    __atomic_add_fetch(&srv->active_jobs, 1, __ATOMIC_ACQ_REL);
    j->srv = srv;
    j->chat = chat;
    j->created = (int64_t)time(NULL);
    static uint64_t counter;
    snprintf(j->id, sizeof j->id, "%s-%llx%04llx", chat ? "chatcmpl" : "cmpl", (unsigned long long)time(NULL),
             (unsigned long long)(__atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED) & 0xffff));
    j->fd = -1;
    return j;
}

static int job_add(struct job *j, int32_t *ids, int n, const struct srv_params *p, struct api_err *e) {
    if (j->n_reqs == JOB_MAX_PROMPTS) return fail(e, 400, "prompt", "invalid_value", "at most %d prompts", JOB_MAX_PROMPTS);
    struct srv_req *r = srv_req_new(ids, n, p);
    if (!r) return fail(e, 500, NULL, NULL, "out of memory");
    j->reqs[j->n_reqs++] = r;
    return 0;
}

/* Duplicate the malloc'd parts of p (each request owns its copy). */
static int params_dup(const struct srv_params *p, struct srv_params *q) {
    *q = *p;
    q->bias_ids = NULL;
    q->bias_vals = NULL;
    srv_grammar_ref(q->grammar);
    for (int i = 0; i < p->n_stops; i++) q->stops[i] = strdup(p->stops[i]);
    if (p->n_bias) {
        q->bias_ids = malloc((size_t)p->n_bias * sizeof *q->bias_ids);
        q->bias_vals = malloc((size_t)p->n_bias * sizeof *q->bias_vals);
        if (!q->bias_ids || !q->bias_vals) return -1;
        memcpy(q->bias_ids, p->bias_ids, (size_t)p->n_bias * sizeof *q->bias_ids);
        memcpy(q->bias_vals, p->bias_vals, (size_t)p->n_bias * sizeof *q->bias_vals);
    }
    return 0;
}

/* ---- structured output and tools ---- */

/* The compiled constraint for (kind, src): from the cache, or compiled and kept (LRU); a
 * reference for the caller. A source that does not compile is a 400 naming param. */
static struct srv_grammar *grammar_get(struct server *srv, gerbil_grammar_kind kind, const char *src, int compact,
                                       const char *param, struct api_err *e) {
    const size_t n = strlen(src) + 1; /* the key: kind, compact, src */
    char *key = malloc(n + 2);
    if (!key) { fail(e, 500, NULL, NULL, "out of memory"); return NULL; }
    key[0] = (char)('0' + (int)kind);
    key[1] = (char)('0' + compact);
    memcpy(key + 2, src, n);
    struct srv_grammar *out = NULL;
    pthread_mutex_lock(&srv->gmu);
    struct sched *s = srv->s;
    if (!s->gvocab && gerbil_grammar_vocab_new(srv->tok, s->n_vocab, s->eos, s->n_eos, &s->gvocab) != GERBIL_OK) {
        fail(e, 400, param, "invalid_value", "constrained output needs the model's tokenizer: %s", gerbil_last_error());
        goto done;
    }
    struct srv_gcache *victim = &srv->gcache[0];
    for (int i = 0; i < SRV_GRAMMAR_CACHE; i++) {
        struct srv_gcache *c = &srv->gcache[i];
        if (c->key && c->key_len == n + 1 && !memcmp(c->key, key, n + 1)) {
            c->tick = ++srv->gtick;
            out = srv_grammar_ref(c->g);
            goto done;
        }
        if (!c->key) victim = c;
        else if (victim->key && c->tick < victim->tick) victim = c;
    }
    gerbil_grammar_params gp = gerbil_grammar_default_params();
    gp.max_whitespace = 1; /* as gerbil run: no model spends its budget on whitespace */
    gp.compact = compact;
    gerbil_grammar_t g = NULL;
    if (gerbil_grammar_compile(s->gvocab, kind, src, n - 1, &gp, &g) != GERBIL_OK) {
        fail(e, 400, param, "invalid_schema", "%s cannot be enforced: %s",
             kind == GERBIL_GRAMMAR_GBNF ? "the grammar" : kind == GERBIL_GRAMMAR_SEQUENCE ? "the tools' parameters"
                                                                                          : "the JSON Schema",
             gerbil_last_error());
        goto done;
    }
    { /* a constraint no output can meet (schema false, an empty enum) is the client's mistake */
        gerbil_grammar_state_t st = NULL;
        uint64_t *mask = malloc((size_t)gerbil_grammar_mask_words(g) * sizeof *mask);
        int any = 0;
        if (mask && gerbil_grammar_state_new(g, &st) == GERBIL_OK && gerbil_grammar_mask(st, mask) == GERBIL_OK)
            for (int w = 0; w < gerbil_grammar_mask_words(g) && !any; w++) any = mask[w] != 0;
        else any = 1; /* out of memory here: let the request find out */
        gerbil_grammar_state_free(st);
        free(mask);
        if (!any) {
            gerbil_grammar_free(g);
            fail(e, 400, param, "invalid_schema", "the constraint in '%s' allows no output at all", param);
            goto done;
        }
    }
    struct srv_grammar *sg = calloc(1, sizeof *sg);
    if (!sg) { gerbil_grammar_free(g); fail(e, 500, NULL, NULL, "out of memory"); goto done; }
    sg->g = g;
    sg->refs = 1;
    if (victim->key) { srv_grammar_release(victim->g); free(victim->key); }
    victim->key = key;
    victim->key_len = n + 1;
    victim->g = sg;
    victim->tick = ++srv->gtick;
    key = NULL;
    out = srv_grammar_ref(sg);
done:
    pthread_mutex_unlock(&srv->gmu);
    free(key);
    return out;
}

/* tools, tool_choice, parallel_tool_calls, response_format and llama.cpp's grammar /
 * json_schema: the job's tool mode and the constraint of every choice (p->grammar). */
static int parse_constraints(struct server *srv, const cJSON *o, int chat, struct job *j, struct srv_params *p,
                             struct api_err *e) {
    const cJSON *tools = field(o, "tools"), *tc = field(o, "tool_choice"), *v;
    const char *named = NULL;
    j->tool_mode = TOOLS_OFF;
    j->parallel_tools = 1;
    if (get_bool(o, "parallel_tool_calls", &j->parallel_tools, e)) return -1;
    if (tools && chat) {
        if (!cJSON_IsArray(tools)) return fail(e, 400, "tools", "invalid_type", "'tools' must be an array");
        const cJSON *t;
        cJSON_ArrayForEach(t, tools) {
            const cJSON *ty = field(t, "type"), *fn = field(t, "function");
            if (!cJSON_IsObject(t) || (ty && (!cJSON_IsString(ty) || strcmp(ty->valuestring, "function"))))
                return fail(e, 400, "tools", "invalid_value", "each tool must be an object of type 'function'");
            const cJSON *nm = field(fn, "name"), *pa = field(fn, "parameters");
            if (!cJSON_IsObject(fn) || !cJSON_IsString(nm) || !nm->valuestring[0])
                return fail(e, 400, "tools", "invalid_value", "each tool needs a 'function' with a string 'name'");
            if (pa && !cJSON_IsObject(pa))
                return fail(e, 400, "tools", "invalid_type", "the parameters of tool '%s' must be a JSON Schema object",
                            nm->valuestring);
        }
        j->tool_mode = cJSON_GetArraySize(tools) ? TOOLS_AUTO : TOOLS_OFF;
    }
    if (tc && chat) {
        if (cJSON_IsString(tc)) {
            const char *c = tc->valuestring;
            if (!strcmp(c, "none")) j->tool_mode = TOOLS_OFF;
            else if (!strcmp(c, "auto")) {
                /* with no tools there is nothing to call: plain text */
            } else if (!strcmp(c, "required")) {
                if (j->tool_mode == TOOLS_OFF)
                    return fail(e, 400, "tool_choice", "invalid_value", "'tool_choice' \"%s\" needs 'tools'", c);
                j->tool_mode = TOOLS_REQUIRED;
            } else {
                return fail(e, 400, "tool_choice", "invalid_value",
                            "'tool_choice' must be \"none\", \"auto\", \"required\" or a function, got \"%s\"", c);
            }
        } else if (cJSON_IsObject(tc)) {
            const cJSON *fn = field(tc, "function"), *nm = field(fn, "name");
            if (!cJSON_IsString(nm))
                return fail(e, 400, "tool_choice", "invalid_value",
                            "'tool_choice' as an object must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
            if (j->tool_mode == TOOLS_OFF)
                return fail(e, 400, "tool_choice", "invalid_value", "'tool_choice' names a function but 'tools' is empty");
            int found = 0;
            const cJSON *t;
            cJSON_ArrayForEach(t, tools) found |= !strcmp(field(field(t, "function"), "name")->valuestring, nm->valuestring);
            if (!found)
                return fail(e, 400, "tool_choice", "invalid_value", "'tool_choice' names '%s', which is not among 'tools'",
                            nm->valuestring);
            named = nm->valuestring;
            j->tool_mode = TOOLS_NAMED;
        } else {
            return fail(e, 400, "tool_choice", "invalid_type", "'tool_choice' must be a string or an object");
        }
    }
    if (j->tool_mode != TOOLS_OFF && !(j->tools = cJSON_Duplicate(tools, 1)))
        return fail(e, 500, NULL, NULL, "out of memory");
    j->id_seed = random_seed();

    /* the constraint: at most one source */
    gerbil_grammar_kind kind = GERBIL_GRAMMAR_JSON_OBJECT;
    char *src = NULL;
    const char *param = NULL;
    int n_src = 0;
    if ((v = field(o, "response_format"))) {
        const cJSON *ty = field(v, "type");
        if (!cJSON_IsObject(v) || !cJSON_IsString(ty))
            return fail(e, 400, "response_format", "invalid_type", "'response_format' must be an object with a 'type'");
        if (!strcmp(ty->valuestring, "json_object")) {
            const cJSON *sc = field(v, "schema"); /* llama.cpp's extension */
            if (sc) { kind = GERBIL_GRAMMAR_JSON_SCHEMA; src = cJSON_PrintUnformatted(sc); }
            else src = strdup("");
            n_src++;
        } else if (!strcmp(ty->valuestring, "json_schema")) {
            const cJSON *js = field(v, "json_schema"), *sc = field(js, "schema");
            if (!cJSON_IsObject(js))
                return fail(e, 400, "response_format", "invalid_value",
                            "response_format of type 'json_schema' needs a 'json_schema' object");
            if (!sc) return fail(e, 400, "response_format", "invalid_value", "'json_schema' needs a 'schema'");
            if (!cJSON_IsObject(sc) && !cJSON_IsBool(sc))
                return fail(e, 400, "response_format", "invalid_type", "'json_schema.schema' must be a JSON Schema object");
            kind = GERBIL_GRAMMAR_JSON_SCHEMA;
            src = cJSON_PrintUnformatted(sc);
            n_src++;
        } else if (strcmp(ty->valuestring, "text")) {
            return fail(e, 400, "response_format", "invalid_value",
                        "response_format type must be 'text', 'json_object' or 'json_schema', got '%s'", ty->valuestring);
        }
        param = "response_format";
    }
    if ((v = field(o, "json_schema"))) { /* llama.cpp */
        if (!cJSON_IsObject(v) && !cJSON_IsBool(v))
            return fail(e, 400, "json_schema", "invalid_type", "'json_schema' must be a JSON Schema object");
        if (!n_src++) { kind = GERBIL_GRAMMAR_JSON_SCHEMA; src = cJSON_PrintUnformatted(v); param = "json_schema"; }
    }
    if ((v = field(o, "grammar"))) { /* llama.cpp: GBNF */
        if (!cJSON_IsString(v)) { free(src); return fail(e, 400, "grammar", "invalid_type", "'grammar' must be a string of GBNF"); }
        if (!n_src++) { kind = GERBIL_GRAMMAR_GBNF; src = strdup(v->valuestring); param = "grammar"; }
    }
    if (j->tool_mode == TOOLS_REQUIRED || j->tool_mode == TOOLS_NAMED) {
        const char *why = NULL;
        char *spec = srv_tool_grammar((enum srv_tool_fmt)srv->tool_fmt, tools, named, j->parallel_tools, &why);
        if (!spec) { free(src); return fail(e, 400, "tools", "invalid_value", "%s", why ? why : "out of memory"); }
        if (!n_src++) { kind = GERBIL_GRAMMAR_SEQUENCE; src = spec; param = "tools"; }
        else free(spec);
    }
    if (n_src > 1) {
        free(src);
        return fail(e, 400, param, "invalid_value",
                    "give one constraint: response_format, json_schema, grammar or a forced tool_choice");
    }
    if (!n_src) return 0;
    if (!src) return fail(e, 500, NULL, NULL, "out of memory");
    if (!srv->tok) { free(src); return fail(e, 400, param, "invalid_value", "constrained output needs the model's tokenizer"); }
    j->c_kind = (int)kind;
    j->c_src = src;
    j->c_param = param;
    return 0;
}

/* The job's constraint compiled into p->grammar. A chat prompt that opened <think> (a
 * thinking model) gets the thought closed first, so the JSON or the call is the content. */
static int constraint_compile(struct server *srv, struct job *j, struct srv_params *p, struct api_err *e) {
    if (!j->c_src) return 0;
    gerbil_grammar_kind kind = (gerbil_grammar_kind)j->c_kind;
    char *src = j->c_src;
    if (j->chat && j->think && kind != GERBIL_GRAMMAR_GBNF) {
        cJSON *spec = NULL;
        if (kind == GERBIL_GRAMMAR_SEQUENCE) {
            spec = cJSON_Parse(src);
            const cJSON *op = cJSON_GetObjectItemCaseSensitive(spec, "open");
            const char *o0 = cJSON_IsString(op) ? op->valuestring : "";
            char *open = malloc(strlen(o0) + 11);
            if (open) snprintf(open, strlen(o0) + 11, "</think>\n\n%s", o0);
            cJSON_DeleteItemFromObjectCaseSensitive(spec, "open");
            if (open) cJSON_AddStringToObject(spec, "open", open);
            free(open);
        } else {
            spec = cJSON_CreateObject();
            cJSON_AddStringToObject(spec, "open", "</think>\n\n");
            cJSON *items = cJSON_AddArrayToObject(spec, "items"), *alt = cJSON_CreateArray(), *part = cJSON_CreateObject();
            cJSON_AddItemToObject(part, "schema", kind == GERBIL_GRAMMAR_JSON_SCHEMA ? cJSON_Parse(src)
                                                  : cJSON_Parse("{\"type\": \"object\"}"));
            cJSON_AddItemToArray(alt, part);
            cJSON_AddItemToArray(items, alt);
        }
        char *t = spec ? cJSON_PrintUnformatted(spec) : NULL;
        cJSON_Delete(spec);
        if (!t) return fail(e, 500, NULL, NULL, "out of memory");
        src = t;
        kind = GERBIL_GRAMMAR_SEQUENCE;
    }
    /* a forced call's JSON is written compact: mostly forced bytes, no budget spent on spaces */
    p->grammar = grammar_get(srv, kind, src, !strcmp(j->c_param, "tools"), j->c_param, e);
    if (src != j->c_src) free(src);
    return p->grammar ? 0 : -1;
}

static enum MHD_Result handle_generate(struct server *srv, struct MHD_Connection *conn, const char *body, size_t len,
                                       int chat) {
    struct api_err e = {0};
    cJSON *o = cJSON_ParseWithLength(body, len);
    if (!o) return send_error(srv, conn, 400, NULL, "invalid_json", "the request body is not valid JSON");
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return send_error(srv, conn, 400, NULL, "invalid_json", "the request body must be a JSON object");
    }
    struct srv_params p = {0};
    struct job *j = job_new(srv, chat);
    int rc = j ? parse_params(srv, o, chat, &p, &e) : fail(&e, 500, NULL, NULL, "out of memory");
    if (!rc) {
        if (get_bool(o, "stream", &j->stream, &e)) rc = -1;
        const cJSON *so = field(o, "stream_options");
        if (!rc && so) {
            if (!cJSON_IsObject(so)) rc = fail(&e, 400, "stream_options", "invalid_type", "must be an object");
            else rc = get_bool(so, "include_usage", &j->include_usage, &e);
        }
        if (!rc && !chat) rc = get_bool(o, "echo", &j->echo, &e);
        if (!rc) rc = parse_constraints(srv, o, chat, j, &p, &e);
    }
    if (!rc && chat) {
        if (!srv->tok) rc = fail(&e, 400, "messages", "invalid_value", "this model has no tokenizer: use /v1/completions with token ids");
        int32_t *ids = NULL;
        int n = 0;
        if (!rc) rc = chat_prompt(srv, o, j->tool_mode != TOOLS_OFF, &ids, &n, &j->think, &e);
        if (!rc) rc = constraint_compile(srv, j, &p, &e);
        if (!rc) rc = fit_context(srv, n, &p, &e);
        if (!rc) {
            rc = job_add(j, ids, n, &p, &e);
            if (!rc) memset(&p, 0, sizeof p); /* taken over */
        }
        free(ids);
    } else if (!rc) {
        const cJSON *pr = field(o, "prompt");
        if (!pr) rc = fail(&e, 400, "prompt", "missing_required_parameter", "'prompt' is required");
        else if (!cJSON_IsString(pr) && !cJSON_IsArray(pr))
            rc = fail(&e, 400, "prompt", "invalid_type", "'prompt' must be a string, token ids, or a list of them");
        else if (cJSON_IsArray(pr) && cJSON_GetArraySize(pr) == 0)
            rc = fail(&e, 400, "prompt", "invalid_value", "'prompt' is empty");
        if (!rc) rc = constraint_compile(srv, j, &p, &e);
        const cJSON *list = NULL;
        if (!rc && cJSON_IsArray(pr) && !is_id_array(pr)) list = pr;
        const int n_prompts = list ? cJSON_GetArraySize(list) : 1;
        const int max_tokens = p.max_tokens;
        for (int i = 0; !rc && i < n_prompts; i++) {
            const cJSON *one = list ? cJSON_GetArrayItem(list, i) : pr;
            if (list && !cJSON_IsString(one) && !is_id_array(one)) {
                rc = fail(&e, 400, "prompt", "invalid_type", "each prompt of the list must be a string or token ids");
                break;
            }
            int32_t *ids = NULL;
            int n = 0;
            rc = completion_prompt(srv, one, &ids, &n, &e);
            struct srv_params q;
            if (!rc) {
                if (params_dup(&p, &q)) rc = fail(&e, 500, NULL, NULL, "out of memory");
                else {
                    q.max_tokens = max_tokens;
                    rc = fit_context(srv, n, &q, &e);
                    if (!rc) rc = job_add(j, ids, n, &q, &e);
                    if (rc) srv_params_free(&q);
                }
            }
            free(ids);
        }
        srv_params_free(&p);
    }
    srv_params_free(&p);
    cJSON_Delete(o);
    if (rc || !j) {
        job_free(j);
        return send_error(srv, conn, e.status, e.param, e.code, "%s", e.msg);
    }
    j->n_choices = j->n_reqs * j->reqs[0]->p.n;
    j->st = calloc((size_t)j->n_choices, sizeof *j->st);
    if (!j->st) {
        job_free(j);
        return send_error(srv, conn, 500, NULL, NULL, "out of memory");
    }
    for (int k = 0; k < j->n_choices; k++) j->st[k].think = j->think;
    return run_job(srv, conn, j);
}

/* ---- the other routes ---- */

static enum MHD_Result handle_models(struct server *srv, struct MHD_Connection *conn) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *d = cJSON_AddArrayToObject(o, "data"), *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", srv->cfg.alias);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)srv->created);
    cJSON_AddStringToObject(m, "owned_by", "gerbil");
    cJSON_AddNumberToObject(m, "context_length", srv->cfg.n_ctx_seq);
    cJSON_AddItemToArray(d, m);
    return send_json(srv, conn, 200, o);
}

static enum MHD_Result handle_tokenize(struct server *srv, struct MHD_Connection *conn, const char *body, size_t len) {
    cJSON *o = cJSON_ParseWithLength(body, len);
    if (!o || !cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return send_error(srv, conn, 400, NULL, "invalid_json", "the request body must be a JSON object");
    }
    struct api_err e = {0};
    const cJSON *c = field(o, "content");
    int add_special = 0, with_pieces = 0;
    int rc = get_bool(o, "add_special", &add_special, &e);
    if (!rc) rc = get_bool(o, "with_pieces", &with_pieces, &e);
    if (!rc && !cJSON_IsString(c)) rc = fail(&e, 400, "content", "invalid_type", "'content' must be a string");
    if (!rc && !srv->tok) rc = fail(&e, 400, "content", "invalid_value", "this model has no tokenizer");
    int32_t *ids = NULL;
    int n = 0;
    if (!rc && gerbil_tokenize(srv->tok, c->valuestring, strlen(c->valuestring), add_special, &ids, &n) != GERBIL_OK)
        rc = fail(&e, 400, "content", "invalid_value", "cannot tokenize: %s", gerbil_last_error());
    cJSON_Delete(o);
    if (rc) return send_error(srv, conn, e.status, e.param, e.code, "%s", e.msg);
    cJSON *r = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(r, "tokens");
    for (int i = 0; i < n; i++) {
        if (with_pieces) {
            cJSON *t = cJSON_CreateObject();
            cJSON_AddNumberToObject(t, "id", ids[i]);
            char *s = token_str(srv, ids[i]);
            cJSON_AddStringToObject(t, "piece", s);
            free(s);
            cJSON_AddItemToArray(arr, t);
        } else {
            cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
        }
    }
    free(ids);
    return send_json(srv, conn, 200, r);
}

static enum MHD_Result handle_detokenize(struct server *srv, struct MHD_Connection *conn, const char *body,
                                         size_t len) {
    cJSON *o = cJSON_ParseWithLength(body, len);
    if (!o || !cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return send_error(srv, conn, 400, NULL, "invalid_json", "the request body must be a JSON object");
    }
    struct api_err e = {0};
    int32_t *ids = NULL;
    int n = 0, rc = 0;
    const cJSON *t = field(o, "tokens");
    if (!t || !cJSON_IsArray(t)) rc = fail(&e, 400, "tokens", "invalid_type", "'tokens' must be an array of token ids");
    else if (!srv->tok) rc = fail(&e, 400, "tokens", "invalid_value", "this model has no tokenizer");
    else if (cJSON_GetArraySize(t) > 0) rc = completion_prompt(srv, t, &ids, &n, &e);
    char *text = NULL;
    size_t tl = 0;
    if (!rc && n && gerbil_detokenize(srv->tok, ids, n, 0, &text, &tl) != GERBIL_OK)
        rc = fail(&e, 400, "tokens", "invalid_value", "cannot detokenize: %s", gerbil_last_error());
    if (e.param && !strcmp(e.param, "prompt")) e.param = "tokens";
    free(ids);
    cJSON_Delete(o);
    if (rc) { free(text); return send_error(srv, conn, e.status, e.param, e.code, "%s", e.msg); }
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "content", text ? text : "");
    free(text);
    return send_json(srv, conn, 200, r);
}

static enum MHD_Result handle_metrics(struct server *srv, struct MHD_Connection *conn) {
    char *b = NULL;
    size_t l = 0, c = 0;
    sched_metrics_text(srv->s, &b, &l, &c);
    static const int codes[SRV_N_STATUS] = {200, 204, 400, 401, 404, 405, 413, 429, 500, 503, 0};
    char line[160];
    struct buf out = {0};
    buf_str(&out, "# HELP gerbil_http_requests_total HTTP requests answered, by status.\n"
                  "# TYPE gerbil_http_requests_total counter\n");
    pthread_mutex_lock(&srv->mu);
    for (int i = 0; i < SRV_N_STATUS; i++) {
        if (codes[i]) snprintf(line, sizeof line, "gerbil_http_requests_total{status=\"%d\"} %llu\n", codes[i],
                               (unsigned long long)srv->by_status[i]);
        else snprintf(line, sizeof line, "gerbil_http_requests_total{status=\"other\"} %llu\n",
                      (unsigned long long)srv->by_status[i]);
        buf_str(&out, line);
    }
    pthread_mutex_unlock(&srv->mu);
    if (b) buf_add(&out, b, l);
    free(b);
    enum MHD_Result r = send_body(srv, conn, 200, "text/plain; version=0.0.4", out.p ? out.p : "", out.n, NULL);
    free(out.p);
    return r;
}

/* ---- dispatch ---- */

static int authorized(struct server *srv, struct MHD_Connection *conn) {
    if (!srv->cfg.api_key) return 1;
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7)) return 0;
    h += 7;
    while (*h == ' ') h++;
    return srv_key_equal(h, strlen(h), srv->cfg.api_key);
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                               const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    struct server *srv = cls;
    struct conn_ctx *cc = *con_cls;
    if (!cc) {
        cc = calloc(1, sizeof *cc);
        if (!cc) return MHD_NO;
        *con_cls = cc;
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > srv->cfg.max_body) {
            cc->answered = 1;
            return send_error(srv, conn, 413, NULL, "request_too_large",
                              "the request body (%s bytes) exceeds the limit of %zu bytes", cl, srv->cfg.max_body);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (!cc->too_big && cc->body.n + *upload_size > srv->cfg.max_body) cc->too_big = 1;
        if (!cc->too_big) buf_add(&cc->body, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    if (cc->answered) return MHD_YES;
    cc->answered = 1;
    if (cc->too_big)
        return send_error(srv, conn, 413, NULL, "request_too_large", "the request body exceeds the limit of %zu bytes",
                          srv->cfg.max_body);
    const int get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
    if (!strcmp(method, "OPTIONS") && srv->cfg.cors) {
        struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
        add_common_headers(srv, r);
        MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        MHD_add_response_header(r, "Access-Control-Allow-Headers", "Authorization, Content-Type");
        MHD_add_response_header(r, "Access-Control-Max-Age", "600");
        enum MHD_Result ret = MHD_queue_response(conn, 204, r);
        MHD_destroy_response(r);
        count_status(srv, 204);
        return ret;
    }
    if (get && (!strcmp(url, "/") || !strcmp(url, "/index.html")))
        return send_body(srv, conn, 200, "text/html; charset=utf-8", gerbil_chat_page, gerbil_chat_page_len, NULL);
    if (get && !strcmp(url, "/health")) {
        if (!srv->ready) return send_body(srv, conn, 503, "application/json", "{\"status\":\"loading\"}", 20, "1");
        return send_body(srv, conn, 200, "application/json", "{\"status\":\"ok\"}", 15, NULL);
    }
    static const struct { const char *path; int post; } routes[] = {
        {"/v1/chat/completions", 1}, {"/chat/completions", 1}, {"/v1/completions", 1}, {"/completions", 1},
        {"/v1/models", 0}, {"/models", 0}, {"/metrics", 0}, {"/tokenize", 1}, {"/detokenize", 1},
        {"/v1/embeddings", 1}, {"/embeddings", 1},
        {"/v1/audio/transcriptions", 1}, {"/audio/transcriptions", 1}, /* audio.c */
    };
    int route = -1;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (!strcmp(url, routes[i].path)) route = (int)i;
    if (route < 0) return send_error(srv, conn, 404, NULL, "not_found", "no route %s %s", method, url);
    if (routes[route].post ? !post : !get)
        return send_error(srv, conn, 405, NULL, "method_not_allowed", "%s %s: use %s", method, url,
                          routes[route].post ? "POST" : "GET");
    if (!authorized(srv, conn))
        return send_error(srv, conn, 401, NULL, "invalid_api_key", "a valid API key is needed (Authorization: Bearer KEY)");
    if (!srv->ready || srv->stopping)
        return send_error(srv, conn, 503, NULL, srv->stopping ? "shutting_down" : "loading",
                          srv->stopping ? "The server is shutting down" : "The model is still loading");
    const char *body = cc->body.p ? cc->body.p : "";
    enum { R_EMBED = 9, R_AUDIO = 11 }; /* the routes[] indexes of /v1/embeddings and /v1/audio/transcriptions */
    if (route == R_EMBED || route == R_EMBED + 1) { /* embeddings (embed.c) */
        char *t = NULL;
        const int status = srv_embeddings(srv, body, cc->body.n, &t);
        enum MHD_Result r = send_body(srv, conn, status, "application/json", t ? t : "{}", t ? strlen(t) : 2, NULL);
        free(t);
        return r;
    }
    if (!srv->s && route != 4 && route != 5 && route != 7 && route != 8 && route != R_AUDIO &&
        route != R_AUDIO + 1) /* an embedding model: no scheduler */
        return send_error(srv, conn, 400, "model", "model_not_supported",
                          "model \"%s\" is an embedding model: use /v1/embeddings", srv->cfg.alias);
    switch (route) {
    case 0: case 1: return handle_generate(srv, conn, body, cc->body.n, 1);
    case 2: case 3: return handle_generate(srv, conn, body, cc->body.n, 0);
    case 4: case 5: return handle_models(srv, conn);
    case 6: return handle_metrics(srv, conn);
    case 7: return handle_tokenize(srv, conn, body, cc->body.n);
    case R_AUDIO: case R_AUDIO + 1: {
        struct srv_reply rp;
        srv_audio_transcriptions(srv, conn, body, cc->body.n, &rp);
        enum MHD_Result r = send_body(srv, conn, rp.status, rp.type, rp.body ? rp.body : "", rp.len, NULL);
        free(rp.body);
        return r;
    }
    default: return handle_detokenize(srv, conn, body, cc->body.n);
    }
}

static void completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)cls;
    (void)conn;
    (void)toe;
    struct conn_ctx *cc = *con_cls;
    if (!cc) return;
    free(cc->body.p);
    free(cc);
    *con_cls = NULL;
}

int server_start(struct server *srv, const struct srv_config *cfg) {
    memset(srv, 0, sizeof *srv);
    srv->cfg = *cfg;
    srv->created = (int64_t)time(NULL);
    pthread_mutex_init(&srv->mu, NULL);
    pthread_mutex_init(&srv->gmu, NULL);
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG | MHD_USE_ITC;
    const char *host = cfg->host ? cfg->host : "127.0.0.1";
    struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)cfg->port);
    } else if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)cfg->port);
        flags |= MHD_USE_IPv6;
    } else {
        fprintf(stderr, "gerbil serve: --host: \"%s\" is not an IPv4 or IPv6 address\n", host);
        return 1;
    }
    srv->d = MHD_start_daemon(flags, (uint16_t)cfg->port, NULL, NULL, handler, srv, MHD_OPTION_SOCK_ADDR,
                              (struct sockaddr *)&ss, MHD_OPTION_CONNECTION_MEMORY_LIMIT, cfg->max_header,
                              MHD_OPTION_CONNECTION_LIMIT, 512u, MHD_OPTION_CONNECTION_TIMEOUT, 600u,
                              MHD_OPTION_NOTIFY_COMPLETED, completed, srv, MHD_OPTION_END);
    if (!srv->d) {
        fprintf(stderr, "gerbil serve: cannot listen on %s:%d (in use, or not allowed)\n", host, cfg->port);
        return 1;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(srv->d, MHD_DAEMON_INFO_BIND_PORT);
    srv->port = di ? di->port : cfg->port;
    return 0;
}

void server_ready(struct server *srv, struct sched *s, gerbil_model_t m, gerbil_tokenizer_t tok,
                  gerbil_chat_template_t tmpl) {
    srv->s = s;
    srv->model = m;
    srv->tok = tok;
    srv->tmpl = tmpl;
    srv->tool_fmt = (int)srv_tool_format(tmpl ? gerbil_chat_template_source(tmpl) : NULL);
    srv->ctx_tok = -1;
    int32_t *ids = NULL;
    int n = 0;
    if (tok && gerbil_tokenize(tok, "a", 1, 0, &ids, &n) == GERBIL_OK && n > 0) srv->ctx_tok = ids[n - 1];
    free(ids);
    __atomic_store_n(&srv->ready, 1, __ATOMIC_RELEASE);
}

void server_stop(struct server *srv) {
    if (!srv->d) return;
    srv->stopping = 1;
    MHD_socket fd = MHD_quiesce_daemon(srv->d);
    if (srv->s) sched_shutdown(srv->s); /* running requests end; their streams send their last chunks */
    /* let every answer in progress finish (streams: their last chunks and [DONE]) before the
     * daemon closes the connections; at most 10 s */
    for (int i = 0; i < 1000 && __atomic_load_n(&srv->active_jobs, __ATOMIC_ACQUIRE) > 0; i++) usleep(10000);
    MHD_stop_daemon(srv->d);            /* waits for the connection threads */
    if (fd != MHD_INVALID_SOCKET) close(fd);
    srv->d = NULL;
    for (int i = 0; i < SRV_GRAMMAR_CACHE; i++) { /* requests still holding one keep theirs */
        srv_grammar_release(srv->gcache[i].g);
        free(srv->gcache[i].key);
        srv->gcache[i] = (struct srv_gcache){0};
    }
    pthread_mutex_destroy(&srv->gmu);
    pthread_mutex_destroy(&srv->mu);
}
