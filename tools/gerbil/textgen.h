/* Text generation for the CLI: prompt rendering (chat template or raw), streaming
 * detokenization, stop strings. Shared by `run` and `chat`. */
#ifndef GERBIL_TEXTGEN_H
#define GERBIL_TEXTGEN_H

#include "gerbil.h"
#include "cli.h"

#include <signal.h>
#include <stdio.h>

enum { TEXTGEN_MAX_STOPS = 16, TEXTGEN_MAX_VARS = 8 };

struct textgen {
    gerbil_model_t model;
    gerbil_session_t session;
    gerbil_tokenizer_t tok;        /* NULL when the folder has no tokenizer */
    gerbil_chat_template_t tmpl;   /* NULL when it has no chat template */
    gerbil_sampler_params sampling;
    gerbil_generate_params gen;    /* max_tokens, ignore_eos */
    const char *stops[TEXTGEN_MAX_STOPS];
    int n_stops;
    const char *var_names[TEXTGEN_MAX_VARS], *var_values[TEXTGEN_MAX_VARS];
    int n_vars;
    volatile sig_atomic_t *interrupted; /* set asynchronously to stop the current answer */
    int seed_fixed;                /* --seed S given (else a random seed, --seed -1) */
    int verbose, quiet;            /* -v/--verbose, -q/--quiet */
    const char *template_file;     /* --chat-template FILE: replaces the model's template */
    /* speculative decoding: --spec KIND (in gen.spec), --draft MODEL, --draft-max/--draft-min K */
    const char *draft_ref;
    gerbil_model_t draft_model;
    gerbil_session_t draft_session;
    int draft_max_set;
};

struct textgen_out {
    char *text;                    /* the generated text, stop string cut (malloc'd) */
    size_t text_len;
    int32_t *ids;                  /* generated ids (malloc'd) */
    int n_ids;
    int stop_string;               /* stopped on a stop string */
    gerbil_generate_result res;
};

/* The generation flags run and chat share (sampling, -n, --stop, --ignore-eos,
 * --think/--no-think). Returns 1 if argv[*i] (and its value) was one, 0 if not, -1 on
 * a bad value (message printed). */
int textgen_parse_opt(struct textgen *tg, const char *cmd, int argc, char **argv, int *i);

/* --spec / --draft / --draft-max / --draft-min, parsed by textgen_parse_opt: their
 * consistency (dflash: not yet implemented; draft needs --draft) before anything loads,
 * then the draft model loaded with the target's options (o) and checked against the
 * target's vocabulary. Print errors; 0 on success. */
int textgen_spec_check(struct textgen *tg, const char *cmd);
int textgen_open_draft(struct textgen *tg, const char *cmd, const struct cli_model_opts *o);
/* Make the draft session hold ids[0..n) (what the target session holds), as chat turns need. */
int textgen_draft_sync(struct textgen *tg, const int32_t *ids, int n);
void textgen_spec_help(FILE *f);
void textgen_spec_free(struct textgen *tg);

/* The seed sampling uses: --seed's, else a random one (stored in tg->sampling.seed). */
uint64_t textgen_seed(struct textgen *tg);

/* Load the tokenizer and chat template of dir (both optional; --chat-template's file
 * replaces the model's template). Prints errors. */
int textgen_load_text(struct textgen *tg, const char *dir);
/* Render messages (a JSON array) with the chat template and tokenize the result for
 * the next assistant turn. Prints errors. */
int textgen_render(struct textgen *tg, const char *messages_json, int32_t **ids, int *n);
/* Generate after prompt (the session already holds what comes before it), streaming
 * text to stream when not NULL. Prints errors. */
int textgen_run(struct textgen *tg, const int32_t *prompt, int n_prompt, FILE *stream, struct textgen_out *out);
void textgen_out_free(struct textgen_out *out);
/* "{"role": role, "content": content}" appended to a JSON array held as cJSON text. */
char *textgen_messages_add(char *messages_json, const char *role, const char *content);
const char *textgen_stop_name(const struct textgen_out *out);

#endif
