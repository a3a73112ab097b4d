#include "textgen.h"
#include "cli.h"
#include "gen/stop.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int textgen_parse_opt(struct textgen *tg, const char *cmd, int argc, char **argv, int *i) {
    const char *a = argv[*i], *v;
    gerbil_sampler_params *sp = &tg->sampling;
    if (!strcmp(a, "--ignore-eos")) { tg->gen.ignore_eos = 1; return 1; }
    if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) { tg->verbose = 1; return 1; }
    if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) { tg->quiet = 1; return 1; }
    if (!strcmp(a, "--chat-template")) {
        if (!(v = cli_value(argc, argv, i))) return -1;
        tg->template_file = v;
        return 1;
    }
    if (!strcmp(a, "--think") || !strcmp(a, "--no-think")) {
        tg->var_names[0] = "enable_thinking";
        tg->var_values[0] = !strcmp(a, "--think") ? "true" : "false";
        tg->n_vars = 1;
        return 1;
    }
    if (!strcmp(a, "--spec")) {
        if (!(v = cli_value(argc, argv, i))) return -1;
        if (!strcmp(v, "ngram")) tg->gen.spec.kind = GERBIL_SPEC_NGRAM;
        else if (!strcmp(v, "draft")) tg->gen.spec.kind = GERBIL_SPEC_DRAFT;
        else if (!strcmp(v, "dflash")) tg->gen.spec.kind = GERBIL_SPEC_DFLASH;
        else {
            fprintf(stderr, "gerbil %s: --spec: expected ngram, draft or dflash, got \"%s\"\n", cmd, v);
            return -1;
        }
        return 1;
    }
    if (!strcmp(a, "--draft")) {
        if (!(v = cli_value(argc, argv, i))) return -1;
        tg->draft_ref = v;
        return 1;
    }
    if (!strcmp(a, "--draft-max") || !strcmp(a, "--draft-min")) {
        if (!(v = cli_value(argc, argv, i))) return -1;
        const int mx = !strcmp(a, "--draft-max");
        if (cli_parse_int(a, v, mx ? 1 : 0, 32, mx ? &tg->gen.spec.draft_max : &tg->gen.spec.draft_min)) return -1;
        tg->draft_max_set |= mx;
        return 1;
    }
    static const char *const value_flags[] = {"--max-tokens", "-n", "--temperature", "--temp", "--top-k", "--top-p",
                                              "--min-p", "--repeat-penalty", "--repetition-penalty", "--seed",
                                              "--stop"};
    int known = 0;
    for (size_t k = 0; k < sizeof value_flags / sizeof value_flags[0]; k++) known |= !strcmp(a, value_flags[k]);
    if (!known) return 0;
    if (!(v = cli_value(argc, argv, i))) return -1;
    if (!strcmp(a, "--stop")) {
        if (tg->n_stops == TEXTGEN_MAX_STOPS) {
            fprintf(stderr, "gerbil %s: at most %d --stop\n", cmd, TEXTGEN_MAX_STOPS);
            return -1;
        }
        tg->stops[tg->n_stops++] = v;
        return 1;
    }
    if (!strcmp(a, "--seed")) {
        char *end;
        errno = 0;
        if (!strcmp(v, "-1")) { tg->seed_fixed = 0; return 1; } /* random, as llama.cpp */
        sp->seed = strtoull(v, &end, 10);
        if (end == v || *end || errno || v[0] == '-' || v[0] == '+') {
            fprintf(stderr, "gerbil %s: --seed: expected an integer >= 0, or -1 for a random seed, got \"%s\"\n", cmd, v);
            return -1;
        }
        tg->seed_fixed = 1;
        return 1;
    }
    int bad;
    if (!strcmp(a, "--max-tokens") || !strcmp(a, "-n")) bad = cli_parse_int(a, v, 0, 1 << 24, &tg->gen.max_tokens);
    else if (!strcmp(a, "--temperature") || !strcmp(a, "--temp")) bad = cli_parse_float(a, v, &sp->temperature);
    else if (!strcmp(a, "--top-k")) bad = cli_parse_int(a, v, 0, 1 << 30, &sp->top_k);
    else if (!strcmp(a, "--top-p")) bad = cli_parse_float(a, v, &sp->top_p);
    else if (!strcmp(a, "--min-p")) bad = cli_parse_float(a, v, &sp->min_p);
    else bad = cli_parse_float(a, v, &sp->repetition_penalty);
    if (bad) return -1;
    /* the sampler's ranges, checked here so that a typo fails before the model loads */
    const char *range = NULL;
    if ((!strcmp(a, "--temperature") || !strcmp(a, "--temp")) && sp->temperature < 0) range = "temperature must be >= 0";
    else if (!strcmp(a, "--top-p") && !(sp->top_p > 0 && sp->top_p <= 1)) range = "top-p must be in (0, 1]";
    else if (!strcmp(a, "--min-p") && !(sp->min_p >= 0 && sp->min_p <= 1)) range = "min-p must be in [0, 1]";
    else if ((!strcmp(a, "--repeat-penalty") || !strcmp(a, "--repetition-penalty")) && !(sp->repetition_penalty > 0))
        range = "repetition penalty must be > 0";
    if (range) {
        fprintf(stderr, "gerbil %s: %s: %s, got \"%s\"\n", cmd, a, range, v);
        return -1;
    }
    return 1;
}

uint64_t textgen_seed(struct textgen *tg) {
    if (!tg->seed_fixed) {
        uint32_t r = 0;
        if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            r = (uint32_t)(ts.tv_nsec ^ ts.tv_sec ^ getpid());
        }
        tg->sampling.seed = r; /* 32 bits, as llama.cpp: short enough to pass back as --seed */
        tg->seed_fixed = 1;
    }
    return tg->sampling.seed;
}

/* The text of a special token id, or NULL. */
static char *token_text(gerbil_tokenizer_t tok, int32_t id) {
    char *text = NULL;
    size_t len;
    if (id < 0 || gerbil_detokenize(tok, &id, 1, 0, &text, &len) != GERBIL_OK) return NULL;
    return text;
}

/* A GGUF file carries its tokenizer and chat template in its metadata. */
static int load_gguf_text(struct textgen *tg, const char *path) {
    gerbil_status s = gerbil_tokenizer_load_gguf(path, &tg->tok);
    if (s == GERBIL_ERR_FORMAT && strstr(gerbil_last_error(), "tokenizer.ggml.model")) {
        tg->tok = NULL; /* a GGUF without a vocabulary: ids only */
        return 0;
    }
    if (s != GERBIL_OK) return cli_fail("cannot load the tokenizer from the GGUF metadata", s);
    const char *src = gerbil_tokenizer_chat_template(tg->tok, NULL);
    char *file_src = NULL;
    if (tg->template_file && !(src = file_src = cli_read_file(tg->template_file, NULL))) {
        fprintf(stderr, "gerbil: --chat-template: cannot read %s: %s\n", tg->template_file, strerror(errno));
        return 1;
    }
    if (!src) return 0;
    char *bos = token_text(tg->tok, gerbil_tokenizer_bos(tg->tok));
    char *eos = token_text(tg->tok, gerbil_tokenizer_eos(tg->tok));
    s = gerbil_chat_template_new(src, bos, eos, &tg->tmpl);
    free(bos);
    free(eos);
    free(file_src);
    return s == GERBIL_OK ? 0 : cli_fail("chat template", s);
}

int textgen_load_text(struct textgen *tg, const char *dir) {
    char path[4096];
    struct stat st;
    if (stat(dir, &st) == 0 && S_ISREG(st.st_mode)) return load_gguf_text(tg, dir);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (stat(path, &st) != 0) return 0;
    gerbil_status s = gerbil_tokenizer_load(dir, &tg->tok);
    if (s != GERBIL_OK) return cli_fail("cannot load the tokenizer", s);
    if (tg->template_file && access(tg->template_file, R_OK) != 0) {
        fprintf(stderr, "gerbil: --chat-template: cannot read %s: %s\n", tg->template_file, strerror(errno));
        return 1;
    }
    s = gerbil_chat_template_load(dir, tg->template_file, &tg->tmpl);
    if (s != GERBIL_OK) return cli_fail("cannot load the chat template", s);
    return 0;
}

char *textgen_messages_add(char *messages_json, const char *role, const char *content) {
    cJSON *arr = messages_json ? cJSON_Parse(messages_json) : cJSON_CreateArray();
    cJSON *msg = cJSON_CreateObject();
    char *out = NULL;
    if (arr && msg && cJSON_AddStringToObject(msg, "role", role) && cJSON_AddStringToObject(msg, "content", content)) {
        cJSON_AddItemToArray(arr, msg);
        msg = NULL;
        out = cJSON_PrintUnformatted(arr);
    }
    cJSON_Delete(msg);
    cJSON_Delete(arr);
    free(messages_json);
    return out;
}

int textgen_render(struct textgen *tg, const char *messages_json, int32_t **ids, int *n) {
    char *prompt = NULL;
    gerbil_status s = gerbil_chat_template_apply(tg->tmpl, messages_json, NULL, 1, tg->var_names, tg->var_values,
                                                 tg->n_vars, &prompt);
    if (s != GERBIL_OK) return cli_fail("chat template", s);
    /* the template writes the special tokens itself, as apply_chat_template(tokenize=True) */
    s = gerbil_tokenize(tg->tok, prompt, strlen(prompt), 0, ids, n);
    free(prompt);
    if (s != GERBIL_OK) return cli_fail("tokenize", s);
    return 0;
}

struct stream_ctx {
    struct textgen *tg;
    gerbil_detok_t detok;
    struct stop_matcher stop;
    FILE *stream;
    char *text;
    size_t len, cap;
    int stopped, oom;
    double t_prompt;               /* when the prefill started (progress line) */
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* "prompt: 512/1400 tokens, 11.2 tok/s", redrawn in place on the terminal and erased
 * when the prefill ends (the answer then starts where it stood). */
static void on_prompt_progress(void *user, int done, int total) {
    struct stream_ctx *c = user;
    if (done == 0) c->t_prompt = now_s();
    double dt = now_s() - c->t_prompt;
    fprintf(stderr, "\rprompt: %d/%d tokens", done, total);
    if (done > 0 && dt > 0) fprintf(stderr, ", %.1f tok/s", done / dt);
    fputs("\033[K", stderr);
    if (done == total) fputs("\r\033[K", stderr);
    fflush(stderr);
}

static void emit(struct stream_ctx *c, const char *p, size_t n) {
    if (!n) return;
    if (c->stream) {
        fwrite(p, 1, n, c->stream);
        fflush(c->stream);
    }
    if (c->len + n + 1 > c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 4096;
        while (cap < c->len + n + 1) cap *= 2;
        char *t = realloc(c->text, cap);
        if (!t) { c->oom = 1; return; }
        c->text = t;
        c->cap = cap;
    }
    memcpy(c->text + c->len, p, n);
    c->len += n;
    c->text[c->len] = 0;
}

/* Text through the stop matcher; returns 1 once a stop string matched. */
static int feed(struct stream_ctx *c, const char *p, size_t n) {
    const char *e;
    size_t ne;
    int hit = stop_feed(&c->stop, p, n, &e, &ne);
    emit(c, e, ne);
    if (hit) c->stopped = 1;
    return hit;
}

static int on_token(void *user, int32_t id) {
    struct stream_ctx *c = user;
    if (c->tg->interrupted && *c->tg->interrupted) return 1;
    if (!c->detok) return 0;
    const char *piece;
    size_t n;
    if (gerbil_detok_push(c->detok, id, &piece, &n) != GERBIL_OK) return 0;
    return feed(c, piece, n);
}

int textgen_run(struct textgen *tg, const int32_t *prompt, int n_prompt, FILE *stream, struct textgen_out *out) {
    memset(out, 0, sizeof *out);
    struct stream_ctx c = {.tg = tg, .stream = stream};
    gerbil_sampler_t sampler = NULL;
    int rc = 1;
    if (stop_init(&c.stop, tg->stops, tg->n_stops)) { fprintf(stderr, "gerbil: out of memory\n"); return 1; }
    gerbil_status s = GERBIL_OK;
    if (tg->tok) s = gerbil_detok_new(tg->tok, 1, &c.detok);
    /* the continuation is decoded in the prompt's context (its leading space stays) */
    if (s == GERBIL_OK && c.detok) s = gerbil_detok_prime(c.detok, prompt, n_prompt);
    if (s == GERBIL_OK) s = gerbil_sampler_new(&tg->sampling, gerbil_model_n_vocab(tg->model), &sampler);
    out->ids = malloc(((size_t)tg->gen.max_tokens + 1) * sizeof *out->ids);
    if (s != GERBIL_OK || !out->ids) {
        cli_fail("cannot start generation", s != GERBIL_OK ? s : GERBIL_ERR_NOMEM);
        goto done;
    }
    gerbil_generate_params gp = tg->gen;
    gp.on_token = on_token;
    gp.user = &c;
    if (!tg->quiet && isatty(2)) gp.on_prompt_progress = on_prompt_progress; /* nothing when not a terminal */
    s = gerbil_generate(tg->session, sampler, prompt, n_prompt, &gp, out->ids, &out->res);
    out->n_ids = out->res.n_generated;
    if (s != GERBIL_OK) {
        if (stream && c.len) fputc('\n', stream);
        cli_fail("generation failed", s);
        goto done;
    }
    if (!c.stopped && c.detok) {
        const char *piece;
        size_t n;
        if (gerbil_detok_flush(c.detok, &piece, &n) == GERBIL_OK) feed(&c, piece, n);
    }
    if (!c.stopped) {
        const char *e;
        size_t ne;
        stop_flush(&c.stop, &e, &ne);
        emit(&c, e, ne);
    }
    if (c.oom) { fprintf(stderr, "gerbil: out of memory\n"); goto done; }
    rc = 0;
done:
    out->text = c.text ? c.text : strdup("");
    out->text_len = c.len;
    out->stop_string = c.stopped;
    stop_free(&c.stop);
    gerbil_detok_free(c.detok);
    gerbil_sampler_free(sampler);
    return rc;
}

void textgen_out_free(struct textgen_out *out) {
    free(out->text);
    free(out->ids);
    memset(out, 0, sizeof *out);
}

const char *textgen_stop_name(const struct textgen_out *out) {
    if (out->stop_string) return "stop_string";
    switch (out->res.stop) {
    case GERBIL_STOP_EOS: return "eos";
    case GERBIL_STOP_CONTEXT: return "context";
    case GERBIL_STOP_CALLBACK: return "interrupted";
    case GERBIL_STOP_GRAMMAR: return "grammar";
    default: return "max_tokens";
    }
}

/* ---- speculative decoding ---- */

void textgen_spec_help(FILE *f) {
    fprintf(f, "      --spec ngram|draft|dflash  speculative decoding (the same tokens, faster when drafts are\n"
               "                            accepted): ngram = prompt lookup, draft = a draft model (--draft);\n"
               "                            dflash: not yet implemented\n"
               "      --draft MODEL         the draft model (same vocabulary as the model; implies --spec draft)\n"
               "      --draft-max K         most draft tokens per verify step (1-32, default 5)\n"
               "      --draft-min K         fewest while acceptance is low (0-32, default 0: plain steps,\n"
               "                            probing again now and then; = --draft-max: a fixed length)\n");
}

int textgen_spec_check(struct textgen *tg, const char *cmd) {
    gerbil_spec_params *sp = &tg->gen.spec;
    if (tg->draft_ref && sp->kind == GERBIL_SPEC_NONE) sp->kind = GERBIL_SPEC_DRAFT;
    if (sp->kind == GERBIL_SPEC_DFLASH) {
        fprintf(stderr, "gerbil %s: --spec dflash: DFlash block drafters are not yet implemented "
                        "(use --spec ngram, or --spec draft --draft MODEL)\n", cmd);
        return 1;
    }
    if (sp->kind == GERBIL_SPEC_DRAFT && !tg->draft_ref) {
        fprintf(stderr, "gerbil %s: --spec draft needs --draft MODEL\n", cmd);
        return 1;
    }
    if (sp->kind == GERBIL_SPEC_NGRAM && tg->draft_ref) {
        fprintf(stderr, "gerbil %s: --draft is for --spec draft, not --spec ngram\n", cmd);
        return 1;
    }
    if (sp->kind == GERBIL_SPEC_NONE && (tg->draft_max_set || sp->draft_min)) {
        fprintf(stderr, "gerbil %s: --draft-max/--draft-min need --spec ngram|draft\n", cmd);
        return 1;
    }
    const int mx = sp->draft_max > 0 ? sp->draft_max : 5;
    if (sp->draft_min > mx) {
        fprintf(stderr, "gerbil %s: --draft-min %d exceeds --draft-max %d\n", cmd, sp->draft_min, mx);
        return 1;
    }
    return 0;
}

int textgen_open_draft(struct textgen *tg, const char *cmd, const struct cli_model_opts *o) {
    if (tg->gen.spec.kind != GERBIL_SPEC_DRAFT) return 0;
    struct cli_model_opts d = *o;
    d.model = tg->draft_ref;
    d.ref = tg->draft_ref;
    d.default_model = 0;
    d.from_env = 0;
    if (cli_open(&d, &tg->draft_model, &tg->draft_session)) {
        fprintf(stderr, "gerbil %s: (that was the draft model, --draft %s)\n", cmd, tg->draft_ref);
        return 1;
    }
    const int vt = gerbil_model_n_vocab(tg->model), vd = gerbil_model_n_vocab(tg->draft_model);
    if (vt != vd) {
        fprintf(stderr, "gerbil %s: --draft %s: its vocabulary has %d tokens, the model's %d; a draft model needs "
                        "the model's tokenizer\n", cmd, tg->draft_ref, vd, vt);
        return 1;
    }
    tg->gen.spec.draft = tg->draft_session;
    return 0;
}

int textgen_draft_sync(struct textgen *tg, const int32_t *ids, int n) {
    if (!tg->draft_session) return 0;
    gerbil_session_truncate(tg->draft_session, n);
    const int at = gerbil_session_n_past(tg->draft_session);
    if (at < n) {
        gerbil_status s = gerbil_session_eval(tg->draft_session, ids + at, n - at, NULL, 0);
        if (s != GERBIL_OK) return cli_fail("draft model", s);
    }
    return 0;
}

void textgen_spec_free(struct textgen *tg) {
    gerbil_session_free(tg->draft_session);
    gerbil_model_free(tg->draft_model);
    tg->draft_session = NULL;
    tg->draft_model = NULL;
}
