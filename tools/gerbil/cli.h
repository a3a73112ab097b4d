/* Shared pieces of the gerbil subcommands. */
#ifndef GERBIL_CLI_H
#define GERBIL_CLI_H

#include "gerbil.h"
#include <stdint.h>
#include <stdio.h>

/* Options common to the model-running subcommands. */
struct cli_model_opts {
    const char *model;          /* as given (a path or a repo id); the local path after cli_open */
    const char *ref;            /* as given, for messages */
    const char *token;          /* --token: Hugging Face access token (else $HF_TOKEN) */
    int default_model;          /* no --model and no $GERBIL_MODEL: use CLI_DEFAULT_MODEL (run, chat) */
    int n_threads;
    int n_ctx;
    gerbil_kv_type kv_type;
    int use_mmap;
    const char *backend;        /* --backend: cpu, ref (NULL: the default) */
    char path[4096];            /* the resolved local path */
    int from_env;               /* the model came from $GERBIL_MODEL (named in errors) */
    int quiet;                  /* -q: no warnings from cli_open */
    /* --lora PATH[:SCALE] (repeatable; several are summed): loaded by cli_open, which sets
     * the session's adapter; commands that apply them set lora_ok (others refuse the flag) */
    const char *lora[8];
    float lora_scale[8];
    int n_lora, lora_ok;
    int32_t adapter;            /* after cli_open: the id to put in batches (0: none) */
};

/* The model `gerbil run` and `gerbil chat` use when none is given. */
#define CLI_DEFAULT_MODEL "mlx-community/Qwen3.5-0.8B-4bit"

/* Try to consume argv[*i] (and its value) as a common option. Returns 1 if consumed,
 * 0 if not a common option, -1 on a bad value (message printed). */
int cli_parse_model_opt(int argc, char **argv, int *i, struct cli_model_opts *o);
/* "--threads N  --kv-type f16|f32  --ctx-size N  --backend B ..." help lines. */
void cli_print_model_opts_help(FILE *f);

/* Strict number parsing: the whole string must be a number in range. */
int cli_parse_int(const char *flag, const char *s, long lo, long hi, int *out);
int cli_parse_float(const char *flag, const char *s, float *out);
/* "1,17,300" -> malloc'd ids. Returns 0 on success. */
int cli_parse_ids(const char *s, int32_t **ids, int *n);
/* All of f (or of the file at path) until EOF, NUL-terminated (the text may hold
 * NULs: *len counts them; len may be NULL). NULL on a read error or out of memory. */
char *cli_read_all(FILE *f, size_t *len);
char *cli_read_file(const char *path, size_t *len);
/* Value of an option that takes one; prints an error when missing. */
const char *cli_value(int argc, char **argv, int *i);

/* Resolve o->model (a folder, a .gguf file or a repo id, pulled when not cached; when
 * NULL: $GERBIL_MODEL, else the default model where o->default_model), load it and open
 * a session (s may be NULL). o->model is the local path afterwards. Prints the error
 * and returns non-zero on failure. */
int cli_open(struct cli_model_opts *o, gerbil_model_t *m, gerbil_session_t *s);
/* The resolution step of cli_open alone (o->path, o->model), e.g. to read the tokenizer
 * and chat template before the weights; cli_open does not resolve again afterwards. */
int cli_resolve_model(struct cli_model_opts *o);
/* Whether ref names a model rather than text: an existing folder, a .gguf file, or a
 * string shaped like a Hugging Face repo id (org/name[@rev][:FILE]). */
int cli_looks_like_model(const char *ref);

/* argv with "--flag=value" and "-n5" (the short options taking a value: -n -m -t -c -f)
 * split in two; attached[i] marks a value that came attached, so that a flag taking
 * none can be told so. */
struct cli_args {
    int argc;
    char **argv;
    unsigned char *attached;
    char **owned;
    int n_owned;
};
int cli_args_expand(int argc, char **argv, struct cli_args *out);
void cli_args_free(struct cli_args *a);
/* "gerbil CMD: unknown option "OPT"" with a "did you mean" among the flags that
 * help() prints, and a pointer to CMD --help. */
void cli_unknown_option(const char *cmd, const char *opt, void (*help)(FILE *));
/* The closest of the n candidates to s (edit distance), or NULL when none is close. */
const char *cli_nearest(const char *s, const char *const *cands, int n);

/* ---- cli_hub.c: models by name ---- */
/* Hub parameters from the environment, --token (may be NULL), and a progress bar on stderr. */
gerbil_hub_params cli_hub_params(const char *token);
/* ref -> local path in out (pulled with progress when missing). Prints the error and
 * returns non-zero on failure. */
int cli_resolve_ref(const char *ref, const char *token, char *out, size_t cap);
/* Whether the last pull through cli_hub_params transferred anything. */
int cli_hub_transferred(void);
/* Print "gerbil: <status>: <message>" to stderr; returns 1 (the exit code). */
int cli_fail(const char *what, gerbil_status st);

int cmd_run(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_transcribe(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_template(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_pull(int argc, char **argv);
int cmd_list(int argc, char **argv);
int cmd_rm(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_grammar(int argc, char **argv);
int cmd_embed(int argc, char **argv);

/* ---- cmd_grammar.c: constraints from the command line ---- */
/* A constraint from flag (--schema/--json-schema FILE, --gbnf/--grammar FILE, --regex RE,
 * --json-object) and its value: *src malloc'd. Prints errors; 0 on success. */
int cli_grammar_source(const char *flag, const char *value, gerbil_grammar_kind *kind, char **src, size_t *len);
/* The tokenizer of a model folder, tokenizer folder/file, .gguf or repo id. Prints errors. */
int cli_load_tokenizer(const char *model, gerbil_tokenizer_t *tok);

#endif
