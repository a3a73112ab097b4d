/* gerbil chat --model DIR: an interactive conversation through the chat template.
 * Each turn re-renders the whole conversation, keeps the KV cache for the prefix it
 * shares with what the session already holds, and prefills only the rest. */
#include "cli.h"
#include "textgen.h"

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

static void help(FILE *f) {
    fprintf(f, "usage: gerbil chat [--model M] [options]\n\n"
               "An interactive conversation with the model through its chat template.\n"
               "End a line with \\ to continue on the next; a line of \"\"\" starts and ends a block.\n"
               "Ctrl-C stops the current answer; Ctrl-D or /exit quits. Without --model (or $GERBIL_MODEL)\n"
               "the model is " CLI_DEFAULT_MODEL ", downloaded on first use.\n\n"
               "commands:  /reset (forget the conversation)  /system TEXT (set the system prompt and reset)\n"
               "           /exit  /help\n\noptions:\n"
               "      --system TEXT         system prompt\n"
               "      --think, --no-think   set the template's enable_thinking\n"
               "  -n, --max-tokens N        most tokens per answer (default 512)\n"
               "      --temperature T, --top-k K, --top-p P, --min-p P, --repeat-penalty R, --seed S\n"
               "                            sampling, as for gerbil run\n");
    cli_print_model_opts_help(f);
}

/* Read one user message: continuation lines and """ blocks joined with newlines.
 * Returns NULL at end of input; sets *was_interrupted on Ctrl-C at the prompt. */
static char *read_message(int tty, int *was_interrupted) {
    char *msg = NULL, *line = NULL;
    size_t msg_len = 0, cap = 0;
    int block = 0;
    *was_interrupted = 0;
    for (;;) {
        if (tty) fputs(msg_len || block ? "... " : "> ", stdout), fflush(stdout);
        errno = 0;
        ssize_t n = getline(&line, &cap, stdin);
        if (n < 0) {
            if (errno == EINTR) { clearerr(stdin); *was_interrupted = 1; }
            free(line);
            if (*was_interrupted || !msg) { free(msg); return NULL; }
            return msg; /* EOF after a partial message: send it */
        }
        if (n && line[n - 1] == '\n') line[--n] = 0;
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

int cmd_chat(int argc, char **argv) {
    struct cli_model_opts o = {.default_model = 1};
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
        fprintf(stderr, "gerbil chat: unknown option \"%s\"\n", a);
        help(stderr);
        free(system);
        return 2;
    }

    int rc = 1;
    char *messages = NULL;
    int32_t *held = NULL; /* the ids the session holds */
    int n_held = 0;
    if (cli_open(&o, &tg.model, &tg.session)) { free(system); return 1; }
    if (textgen_load_text(&tg, o.model)) goto done;
    if (!tg.tok || !tg.tmpl) {
        fprintf(stderr, "gerbil chat: %s has no %s; use gerbil run%s\n", o.model,
                !tg.tok ? "tokenizer.json" : "chat template", !tg.tok ? " --ids" : " --raw");
        goto done;
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_sigint; /* no SA_RESTART: Ctrl-C at the prompt interrupts getline */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);

    int tty = isatty(0);
    if (tty) fprintf(stderr, "gerbil chat — %s. /help for commands, Ctrl-D to quit.\n", o.ref);
    for (;;) {
        int was_int;
        char *msg = read_message(tty, &was_int);
        if (!msg) {
            if (was_int) { interrupted = 0; fputs("\n(Ctrl-D or /exit quits)\n", stderr); continue; }
            if (tty) fputc('\n', stdout);
            break;
        }
        if (!strcmp(msg, "/exit") || !strcmp(msg, "/quit")) { free(msg); break; }
        if (!strcmp(msg, "/help")) { help(stdout); free(msg); continue; }
        if (!strcmp(msg, "/reset") || !strncmp(msg, "/system", 7)) {
            if (!strncmp(msg, "/system", 7)) {
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
            free(msg);
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
        if (!next || textgen_render(&tg, next, &ids, &n)) { free(next); continue; }
        /* reuse the cached prefix; always feed at least one token */
        int keep = 0;
        while (keep < n_held && keep < n - 1 && held[keep] == ids[keep]) keep++;
        gerbil_session_truncate(tg.session, keep);
        keep = gerbil_session_n_past(tg.session); /* recurrent models rewind to a checkpoint */
        struct textgen_out out;
        interrupted = 0;
        int bad = textgen_run(&tg, ids + keep, n - keep, stdout, &out);
        fputc('\n', stdout);
        if (!bad) {
            const gerbil_generate_result *r = &out.res;
            fprintf(stderr, "[%d tokens, %.2f tok/s%s]\n", r->n_generated,
                    r->n_generated > 1 && r->gen_s > 0 ? (r->n_generated - 1) / r->gen_s : 0,
                    out.res.stop == GERBIL_STOP_CALLBACK ? ", interrupted" : "");
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
            /* e.g. the context is full: drop the turn, keep the conversation */
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
    return rc;
}
