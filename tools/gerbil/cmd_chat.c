/* gerbil chat [MODEL]: an interactive conversation through the chat template.
 * Each turn re-renders the whole conversation, keeps the KV cache for the prefix it
 * shares with what the session already holds, and prefills only the rest. When the
 * conversation outgrows the context the oldest turns go (the system message stays).
 * On a terminal lines are read through libedit (editing keys, history). */
#include "cli.h"
#include "textgen.h"

#include <cjson/cJSON.h>
#include <editline/readline.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
}

/* What /help prints: the commands of the conversation. */
static void chat_commands(FILE *f) {
    fprintf(f, "commands:\n"
               "  /help, /?          this list\n"
               "  /reset, /clear     forget the conversation (the system prompt stays)\n"
               "  /system TEXT       set the system prompt and reset; /system alone clears it\n"
               "  /bye, /exit        quit (as Ctrl-D)\n"
               "End a line with \\ to continue on the next; a line of \"\"\" starts and ends a block.\n"
               "Ctrl-C stops the current answer. When the conversation outgrows the context, the oldest\n"
               "turns are dropped (the system prompt stays).\n");
}

static void help(FILE *f) {
    fprintf(f, "usage: gerbil chat [MODEL | --model M] [options]\n\n"
               "An interactive conversation with the model through its chat template.\n"
               "End a line with \\ to continue on the next; a line of \"\"\" starts and ends a block.\n"
               "On a terminal: line editing (arrows, Ctrl-A/Ctrl-E, ...) and history of earlier messages.\n"
               "Ctrl-C stops the current answer; Ctrl-D or /bye quits. Without a model (or $GERBIL_MODEL)\n"
               "the model is " CLI_DEFAULT_MODEL ", downloaded on first use.\n\n");
    chat_commands(f);
    fprintf(f, "\noptions:\n"
               "      --system TEXT         system prompt\n"
               "      --chat-template FILE  use the Jinja chat template in FILE instead of the model's\n"
               "      --think, --no-think   set the template's enable_thinking\n"
               "  -n, --max-tokens N        most tokens per answer (default 512)\n"
               "      --temperature T, --top-k K, --top-p P, --min-p P, --repeat-penalty R, --seed S\n"
               "                            sampling, as for gerbil run (--seed -1, the default: random)\n"
               "  -v, --verbose             say the seed and the model\n"
               "  -q, --quiet               no tokens/s line after each answer\n");
    textgen_spec_help(f);
    cli_print_model_opts_help(f);
}

/* One line without its newline (malloc'd), or NULL at the end of input or on Ctrl-C
 * (interrupted set). edit: through libedit (a terminal), else getline (as before it). */
static char *read_line(int tty, int edit, const char *prompt, char **buf, size_t *cap) {
    if (edit) {
        char *line = readline(prompt);
        if (!line) return NULL;
        free(*buf);
        *buf = line;
        return line;
    }
    if (tty) fputs(prompt, stdout), fflush(stdout);
    errno = 0;
    ssize_t n = getline(buf, cap, stdin);
    if (n < 0) {
        if (errno == EINTR) { clearerr(stdin); interrupted = 1; }
        return NULL;
    }
    if (n && (*buf)[n - 1] == '\n') (*buf)[n - 1] = 0;
    return *buf;
}

/* Read one user message: continuation lines and """ blocks joined with newlines.
 * Returns NULL at end of input; sets *was_interrupted on Ctrl-C at the prompt. */
static char *read_message(int tty, int edit, int *was_interrupted) {
    char *msg = NULL, *line = NULL;
    size_t msg_len = 0, cap = 0;
    int block = 0;
    *was_interrupted = 0;
    for (;;) {
        interrupted = 0;
        if (!read_line(tty, edit, msg_len || block ? "... " : ">>> ", &line, &cap)) {
            *was_interrupted = interrupted;
            free(line);
            if (*was_interrupted || !msg) { free(msg); return NULL; }
            return msg; /* EOF after a partial message: send it */
        }
        ssize_t n = (ssize_t)strlen(line);
        int cont = 0;
        if (!strcmp(line, "\"\"\"")) {
            block = !block;
            if (block) continue;
            break;
        }
        if (!block && n && line[n - 1] == '\\') { line[--n] = 0; cont = 1; }
        char *m = realloc(msg, msg_len + (size_t)n + 2);
        if (!m) { free(msg); free(line); return NULL; }
        msg = m;
        if (msg_len) msg[msg_len++] = '\n';
        memcpy(msg + msg_len, line, (size_t)n);
        msg_len += (size_t)n;
        msg[msg_len] = 0;
        if (!block && !cont) break;
    }
    free(line);
    if (!msg) msg = strdup("");
    return msg;
}

/* messages (a JSON array) without its oldest turn: the first user message after the
 * system one and the answers up to the next user message. 0 (messages unchanged) when
 * the only turn left is the last one. */
static int drop_oldest_turn(char **messages) {
    cJSON *arr = cJSON_Parse(*messages);
    int n = cJSON_GetArraySize(arr), first = 0, next = -1;
    for (; first < n; first++) {
        const cJSON *role = cJSON_GetObjectItem(cJSON_GetArrayItem(arr, first), "role");
        if (!cJSON_IsString(role) || strcmp(role->valuestring, "system")) break;
    }
    for (int j = first + 1; j < n && next < 0; j++) {
        const cJSON *role = cJSON_GetObjectItem(cJSON_GetArrayItem(arr, j), "role");
        if (cJSON_IsString(role) && !strcmp(role->valuestring, "user")) next = j;
    }
    char *out = NULL;
    if (next > first) {
        for (int j = first; j < next; j++) cJSON_DeleteItemFromArray(arr, first);
        out = cJSON_PrintUnformatted(arr);
    }
    cJSON_Delete(arr);
    if (!out) return 0;
    free(*messages);
    *messages = out;
    return 1;
}

/* "/word" alone or before a space: a chat command (a path such as /usr/bin is text). */
static int is_command(const char *msg) {
    if (msg[0] != '/') return 0;
    size_t k = 1;
    while (msg[k] && msg[k] != ' ' && msg[k] != '\n' && msg[k] != '/') k++;
    return msg[k] != '/';
}

static int command_is(const char *msg, const char *name) {
    size_t n = strlen(name);
    return !strncmp(msg, name, n) && (!msg[n] || msg[n] == ' ' || msg[n] == '\n');
}

static int chat_main(int argc, char **argv, const unsigned char *attached) {
    struct cli_model_opts o = {.default_model = 1, .lora_ok = 1};
    struct textgen tg = {.sampling = gerbil_sampler_default_params(), .gen = gerbil_generate_default_params(),
                         .interrupted = &interrupted};
    const char *v = NULL;
    char *system = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r = cli_parse_model_opt(argc, argv, &i, &o);
        if (!r) r = textgen_parse_opt(&tg, "chat", argc, argv, &i);
        if (r < 0) { free(system); return 2; }
        if (r) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { help(stdout); free(system); return 0; }
        if (!strcmp(a, "--system")) {
            if (!(v = cli_value(argc, argv, &i))) { free(system); return 2; }
            free(system);
            system = strdup(v);
            continue;
        }
        if (attached[i]) fprintf(stderr, "gerbil chat: option %s takes no value (got \"%s\")\n", argv[i - 1], a);
        else if (a[0] == '-' && a[1]) cli_unknown_option("chat", a, help);
        else if (!o.model) { o.model = a; continue; } /* gerbil chat MODEL, as ollama run MODEL */
        else fprintf(stderr, "gerbil chat: \"%s\": one model only, and the messages come from stdin\n", a);
        free(system);
        return 2;
    }
    if (textgen_spec_check(&tg, "chat")) return 2;
    textgen_seed(&tg);

    int rc = 1;
    char *messages = NULL;
    int32_t *held = NULL; /* the ids the session holds */
    int n_held = 0;
    /* the tokenizer and template first: a model chat cannot use is refused before its weights load */
    if (cli_resolve_model(&o) || textgen_load_text(&tg, o.model)) goto done;
    if (!tg.tok || !tg.tmpl) {
        if (!tg.tok)
            fprintf(stderr, "gerbil chat: %s has no tokenizer (%s); use gerbil run --ids\n", o.ref,
                    strstr(o.model, ".gguf") ? "no tokenizer.ggml.* metadata" : "no tokenizer.json");
        else
            fprintf(stderr, "gerbil chat: %s has no chat template; give one with --chat-template FILE, "
                            "or send raw text with gerbil run --raw\n", o.ref);
        goto done;
    }
    o.quiet = tg.quiet;
    if (cli_open(&o, &tg.model, &tg.session)) goto done;
    if (textgen_open_draft(&tg, "chat", &o)) goto done;
    const int n_ctx = gerbil_session_n_ctx(tg.session);
    struct sigaction sa = {0};
    sa.sa_handler = on_sigint; /* no SA_RESTART: Ctrl-C at the prompt interrupts getline */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);

    int tty = isatty(0), edit = tty && isatty(1);
    if (edit) {
        rl_readline_name = "gerbil";
        using_history();
    }
    if (tty) fprintf(stderr, "gerbil chat — %s. /help for commands, Ctrl-D or /bye to quit.\n", o.ref);
    if (tg.verbose)
        fprintf(stderr, "gerbil chat: model %s; context %d tokens; seed %llu\n", o.model, n_ctx,
                (unsigned long long)tg.sampling.seed);
    for (;;) {
        int was_int;
        char *msg = read_message(tty, edit, &was_int);
        if (!msg) {
            if (was_int) { interrupted = 0; fputs("\n(Ctrl-D or /bye quits)\n", stderr); continue; }
            if (tty) fputc('\n', stdout);
            break;
        }
        if (edit && msg[0]) add_history(msg);
        if (is_command(msg)) {
            int quit = 0;
            if (command_is(msg, "/exit") || command_is(msg, "/bye") || command_is(msg, "/quit")) {
                quit = 1;
            } else if (command_is(msg, "/help") || command_is(msg, "/?")) {
                chat_commands(stdout);
                fflush(stdout);
            } else if (command_is(msg, "/reset") || command_is(msg, "/clear") || command_is(msg, "/system")) {
                if (command_is(msg, "/system")) {
                    const char *s = msg + 7;
                    while (*s == ' ') s++;
                    free(system);
                    system = *s ? strdup(s) : NULL;
                    fprintf(stderr, "(system prompt %s; conversation reset)\n", system ? "set" : "cleared");
                } else {
                    fprintf(stderr, "(conversation reset)\n");
                }
                free(messages);
                messages = NULL;
                n_held = 0;
                gerbil_session_reset(tg.session);
            } else {
                fprintf(stderr, "(unknown command %.*s; /help lists them)\n", (int)strcspn(msg, " \n"), msg);
            }
            free(msg);
            if (quit) break;
            continue;
        }
        if (!msg[0]) { free(msg); continue; }

        char *next = messages ? strdup(messages) : NULL;
        if (!next && messages) { free(msg); break; }
        if (!messages && system) next = textgen_messages_add(next, "system", system);
        next = next ? textgen_messages_add(next, "user", msg) : textgen_messages_add(NULL, "user", msg);
        free(msg);
        int32_t *ids = NULL;
        int n = 0;
        if (!next || textgen_render(&tg, next, &ids, &n)) {
            fprintf(stderr, "(that message is not kept in the conversation)\n");
            free(next);
            continue;
        }
        /* the conversation must leave room for an answer: the oldest turns go first */
        int reserve = tg.gen.max_tokens < n_ctx / 4 ? tg.gen.max_tokens : n_ctx / 4, dropped = 0, bad = 0;
        while (n > n_ctx - reserve && drop_oldest_turn(&next)) {
            dropped++;
            free(ids);
            ids = NULL;
            if ((bad = textgen_render(&tg, next, &ids, &n))) break;
        }
        if (bad || n >= n_ctx) {
            if (!bad)
                fprintf(stderr, "(this message does not fit the context: with the system prompt it is %d tokens, the "
                                "context holds %d; send a shorter one, or restart with a larger --ctx-size; it is "
                                "not kept)\n", n, n_ctx);
            free(next);
            free(ids);
            continue;
        }
        if (dropped)
            fprintf(stderr, "(the conversation outgrew the context of %d tokens: dropped the oldest %d turn%s, the "
                            "system prompt kept; /reset starts over)\n", n_ctx, dropped, dropped > 1 ? "s" : "");
        /* reuse the cached prefix; always feed at least one token */
        int keep = 0;
        while (keep < n_held && keep < n - 1 && held[keep] == ids[keep]) keep++;
        gerbil_session_truncate(tg.session, keep);
        keep = gerbil_session_n_past(tg.session); /* recurrent models rewind to a checkpoint */
        struct textgen_out out;
        interrupted = 0;
        bad = textgen_draft_sync(&tg, ids, keep); /* the draft model holds what the model holds */
        if (!bad) bad = textgen_run(&tg, ids + keep, n - keep, stdout, &out);
        else memset(&out, 0, sizeof out);
        fputc('\n', stdout);
        fflush(stdout);
        if (!bad) {
            const gerbil_generate_result *r = &out.res;
            if (!tg.quiet)
                fprintf(stderr, "[%d tokens, %.2f tok/s%s]\n", r->n_generated,
                        r->n_generated > 1 && r->gen_s > 0 ? (r->n_generated - 1) / r->gen_s : 0,
                        r->stop == GERBIL_STOP_CALLBACK ? ", interrupted"
                        : r->stop == GERBIL_STOP_CONTEXT ? ", cut: the context is full" : "");
            if (r->stop == GERBIL_STOP_CONTEXT)
                fprintf(stderr, "(the answer was cut at the end of the context of %d tokens; the next message "
                                "drops the oldest turns, /reset starts over)\n", n_ctx);
            free(messages);
            messages = textgen_messages_add(next, "assistant", out.text);
            next = NULL;
            int32_t *h = realloc(held, ((size_t)n + (size_t)out.n_ids) * sizeof *h);
            if (h) {
                held = h;
                memcpy(held, ids, (size_t)n * sizeof *ids);
                memcpy(held + n, out.ids, (size_t)out.n_ids * sizeof *ids);
                n_held = gerbil_session_n_past(tg.session);
            } else {
                n_held = 0;
                gerbil_session_reset(tg.session);
            }
        } else {
            /* the turn failed: it is not kept, the conversation stays as it was */
            fprintf(stderr, "(that message is not kept in the conversation)\n");
            gerbil_session_reset(tg.session);
            n_held = 0;
        }
        textgen_out_free(&out);
        free(next);
        free(ids);
    }
    rc = 0;
done:
    free(held);
    free(messages);
    free(system);
    gerbil_chat_template_free(tg.tmpl);
    gerbil_tokenizer_free(tg.tok);
    gerbil_session_free(tg.session);
    gerbil_model_free(tg.model);
    textgen_spec_free(&tg);
    return rc;
}

int cmd_chat(int argc, char **argv) {
    struct cli_args a;
    if (cli_args_expand(argc, argv, &a)) return 1;
    int rc = chat_main(a.argc, a.argv, a.attached);
    cli_args_free(&a);
    return rc;
}
