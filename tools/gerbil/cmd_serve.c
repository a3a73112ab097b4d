/* gerbil serve: an OpenAI-compatible HTTP server with continuous batching (src/serve/). */
#include "cli.h"
#include "serve/server.h"
#include "textgen.h"

#include <errno.h>
#include <signal.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: gerbil serve --model M [options]\n\n"
            "An OpenAI-compatible server: POST /v1/chat/completions, /v1/completions, /tokenize, /detokenize;\n"
            "GET /v1/models, /health, /metrics (Prometheus), and a chat page at /.\n"
            "Requests are batched continuously: each joins the running batch at the next step and leaves\n"
            "when it finishes; a request gets exactly the tokens it gets alone.\n\n"
            "options:\n"
            "      --host H         address to listen on (default 127.0.0.1; 0.0.0.0 exposes it)\n"
            "      --port P         port (default 8080; 0: any free port, printed)\n"
            "      --parallel N     sequences evaluated at once (default 8; n > 1 choices take one each)\n"
            "      --queue N        requests waiting beyond those; more get 429 with Retry-After (default 64)\n"
            "      --kv-mem GiB     KV cache memory shared by all sequences (default: --parallel x --ctx-size\n"
            "                       positions); when it runs out the newest request is preempted and recomputed\n"
            "      --api-key K      require \"Authorization: Bearer K\" (default: $GERBIL_API_KEY; none if unset)\n"
            "      --alias NAME     the model's name in the API (default: the repo id, or the file or folder name)\n"
            "      --cors ORIGIN    answer browsers from ORIGIN (or *) with CORS headers (default: off)\n"
            "      --chunk N        prefill chunk in tokens, a multiple of 16 (default 64); prompts are cut at\n"
            "                       multiples of it, and the prefix cache reuses whole chunks\n"
            "      --batch N        most rows per step: decode rows + prefill chunks (default 512)\n"
            "      --no-prefix-cache  do not keep prompts' KV blocks for later requests\n"
            "      --max-body BYTES request body limit (default 16777216)\n"
            "      --stt-model M    a speech-to-text model (Moonshine) for POST /v1/audio/transcriptions\n"
            "                       (multipart: file, model, response_format json|text|verbose_json)\n"
            "  -c, --ctx-size N     positions per sequence, prompt + completion (default: the model's, at most 4096)\n");
    cli_print_model_opts_help(f);
}

static int stop_pipe[2] = {-1, -1};

static void on_signal(int sig) {
    const int saved = errno;
    unsigned char b = (unsigned char)sig;
    if (write(stop_pipe[1], &b, 1) < 0) {}
    errno = saved;
}

static const char *base_name(const char *path) {
    static char b[256];
    snprintf(b, sizeof b, "%s", path);
    size_t n = strlen(b);
    while (n > 1 && b[n - 1] == '/') b[--n] = 0;
    const char *s = strrchr(b, '/');
    return s ? s + 1 : b;
}

int cmd_serve(int argc, char **argv) {
    struct cli_model_opts o = {0};
    struct srv_config cfg = {.host = "127.0.0.1", .port = 8080, .max_body = 16u << 20, .max_header = 64u << 10,
                             .max_n = 16};
    int parallel = 8, queue = 64, chunk = 64, batch = 512, prefix = 1;
    float kv_gib = 0;
    const char *stt_ref = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int r = cli_parse_model_opt(argc, argv, &i, &o);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        if (!strcmp(a, "--no-prefix-cache")) { prefix = 0; continue; }
        static const char *const value_flags[] = {"--host", "--port", "--parallel", "--queue", "--kv-mem", "--api-key",
                                                  "--alias", "--cors", "--chunk", "--batch", "--max-body",
                                                  "--stt-model"};
        int known = 0;
        for (size_t k = 0; k < sizeof value_flags / sizeof value_flags[0]; k++) known |= !strcmp(a, value_flags[k]);
        if (!known) {
            fprintf(stderr, "gerbil serve: unknown option \"%s\" (see gerbil serve --help)\n", a);
            return 2;
        }
        if (!(v = cli_value(argc, argv, &i))) return 2;
        int bad = 0, tmp;
        if (!strcmp(a, "--stt-model")) { stt_ref = v; continue; }
        if (!strcmp(a, "--host")) cfg.host = v;
        else if (!strcmp(a, "--port")) bad = cli_parse_int(a, v, 0, 65535, &cfg.port);
        else if (!strcmp(a, "--parallel")) bad = cli_parse_int(a, v, 1, 1024, &parallel);
        else if (!strcmp(a, "--queue")) bad = cli_parse_int(a, v, 0, 1 << 20, &queue);
        else if (!strcmp(a, "--kv-mem")) {
            bad = cli_parse_float(a, v, &kv_gib);
            if (!bad && !(kv_gib > 0)) {
                fprintf(stderr, "gerbil serve: --kv-mem: expected a size in GiB > 0, got \"%s\"\n", v);
                bad = 1;
            }
        } else if (!strcmp(a, "--api-key")) cfg.api_key = v;
        else if (!strcmp(a, "--alias")) cfg.alias = v;
        else if (!strcmp(a, "--cors")) cfg.cors = v;
        else if (!strcmp(a, "--chunk")) {
            bad = cli_parse_int(a, v, 16, 4096, &chunk);
            if (!bad && chunk % 16) {
                fprintf(stderr, "gerbil serve: --chunk: expected a multiple of 16, got %d\n", chunk);
                bad = 1;
            }
        } else if (!strcmp(a, "--batch")) bad = cli_parse_int(a, v, 16, 65536, &batch);
        else {
            bad = cli_parse_int(a, v, 1024, 1 << 30, &tmp);
            cfg.max_body = (size_t)tmp;
        }
        if (bad) return 2;
    }
    if (!cfg.api_key) {
        const char *k = getenv("GERBIL_API_KEY");
        if (k && k[0]) cfg.api_key = k;
    }
    if (batch < chunk) {
        fprintf(stderr, "gerbil serve: --batch %d is below --chunk %d: a prompt chunk would never fit a step\n", batch,
                chunk);
        return 2;
    }
    /* SIGINT/SIGTERM: the handler (whichever thread takes it) writes the signal to a pipe the
     * main thread waits on, so the server stops in order */
    if (pipe(stop_pipe)) {
        perror("gerbil serve: pipe");
        return 1;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    struct server srv;
    const char *user_alias = cfg.alias;
    if (!cfg.alias) cfg.alias = "model"; /* until loaded */
    cfg.n_ctx_seq = 1; /* set once loaded */
    if (server_start(&srv, &cfg)) return 1;

    gerbil_model_t m = NULL;
    if (cli_open(&o, &m, NULL)) { server_stop(&srv); return 1; }
    struct stat path_st;
    if (!user_alias) /* a repo id names itself (as clients of the hub expect); a path by its last part */
        srv.cfg.alias = o.ref && stat(o.ref, &path_st) != 0 ? o.ref : base_name(o.model);
    struct textgen tg = {.model = m};
    if (textgen_load_text(&tg, o.model)) { gerbil_model_free(m); server_stop(&srv); return 1; }
    int n_ctx = o.n_ctx > 0 ? o.n_ctx : gerbil_model_n_ctx_train(m);
    if (o.n_ctx <= 0 && n_ctx > 4096) n_ctx = 4096;
    if (n_ctx < 16) n_ctx = 16;
    const size_t bpt = gerbil_model_kv_bytes_per_token(m, o.kv_type);
    long long n_kv = (long long)parallel * n_ctx;
    if (kv_gib > 0 && bpt) {
        n_kv = (long long)((double)kv_gib * 1073741824.0 / (double)bpt);
        if (n_kv < n_ctx) {
            fprintf(stderr, "gerbil serve: --kv-mem %.3g GiB holds %lld positions, below one sequence's %d "
                            "(--ctx-size)\n", kv_gib, n_kv, n_ctx);
            gerbil_model_free(m);
            server_stop(&srv);
            return 2;
        }
    }
    if (n_kv > (1LL << 30)) n_kv = 1LL << 30;
    n_kv = (n_kv + 15) / 16 * 16;
    struct sched_params sp = {.n_parallel = parallel, .n_queue = queue, .n_ctx_seq = n_ctx, .n_kv = (int)n_kv,
                              .n_batch = batch, .chunk = chunk, .prefix_cache = prefix, .kv_type = o.kv_type};
    struct sched *s = NULL;
    srv_embed_set_dir(o.model); /* POST /v1/embeddings (src/serve/embed.c) */
    const int embed_only = gerbil_model_is_embedding(m); /* no lm_head: /v1/embeddings alone */
    gerbil_status st = embed_only ? GERBIL_OK : sched_new(m, tg.tok, &sp, &s);
    if (st == GERBIL_OK && !embed_only) st = sched_start(s);
    if (st != GERBIL_OK) {
        cli_fail("cannot start the scheduler", st);
        sched_free(s);
        gerbil_model_free(m);
        server_stop(&srv);
        return 1;
    }
    struct cli_model_opts so = {.model = stt_ref, .n_threads = o.n_threads, .backend = "cpu", .token = o.token};
    if (stt_ref) { /* the speech model of /v1/audio/transcriptions (audio.c) */
        char tp[4200];
        struct stat tst;
        int bad = cli_open(&so, &srv.stt, NULL);
        if (!bad && !gerbil_model_is_stt(srv.stt)) {
            fprintf(stderr, "gerbil serve: --stt-model %s is not a speech-to-text model (Moonshine)\n", stt_ref);
            bad = 1;
        }
        if (!bad) snprintf(tp, sizeof tp, "%s/tokenizer.json", so.model);
        if (!bad && stat(tp, &tst) == 0 && gerbil_tokenizer_load(so.model, &srv.stt_tok) != GERBIL_OK)
            bad = cli_fail("cannot load the speech model's tokenizer", GERBIL_ERR_FORMAT);
        if (bad) {
            gerbil_model_free(srv.stt);
            sched_free(s);
            gerbil_model_free(m);
            server_stop(&srv);
            return 1;
        }
        fprintf(stderr, "gerbil serve: speech-to-text model %s for /v1/audio/transcriptions%s\n", stt_ref,
                srv.stt_tok ? "" : " (no tokenizer.json: texts are empty)");
    }
    srv.cfg.n_ctx_seq = n_ctx;
    if (srv.cfg.max_n > parallel) srv.cfg.max_n = parallel; /* n choices run at once */
    server_ready(&srv, s, m, tg.tok, tg.tmpl);
    /* the architecture and weights lines of the model's description */
    char desc[4096] = "", arch[256] = "?", weights[256] = "?";
    gerbil_model_describe(m, desc, sizeof desc);
    for (char *line = strtok(desc, "\n"); line; line = strtok(NULL, "\n")) {
        char *v = strchr(line, ':');
        if (!v) continue;
        for (v++; *v == ' '; v++) {}
        if (!strncmp(line, "architecture:", 13)) snprintf(arch, sizeof arch, "%s", v);
        if (!strncmp(line, "weights:", 8)) snprintf(weights, sizeof weights, "%s", v);
    }
    fprintf(stderr, "gerbil serve: model %s (%s) as \"%s\"; weights %s\n", o.ref ? o.ref : o.model, arch,
            srv.cfg.alias, weights);
    if (embed_only) fprintf(stderr, "gerbil serve: an embedding model: POST /v1/embeddings\n");
    else fprintf(stderr,
            "gerbil serve: KV cache %lld positions (%.1f MiB, %s), %d sequences of up to %d positions, prefill "
            "chunk %d, %d rows per step, prefix cache %s, queue %d%s\n",
            n_kv, (double)n_kv * (double)bpt / 1048576.0, o.kv_type == GERBIL_KV_F32 ? "f32" : "f16", parallel, n_ctx,
            chunk, s->p.n_batch, s->pc ? (s->n_snaps ? "on (with recurrent-state snapshots)" : "on") : "off", queue,
            cfg.api_key ? ", API key required" : "");
    const int v6 = strchr(cfg.host, ':') != NULL;
    printf("listening on http://%s%s%s:%d\n", v6 ? "[" : "", cfg.host, v6 ? "]" : "", srv.port);
    fflush(stdout);

    unsigned char sig = 0;
    while (read(stop_pipe[0], &sig, 1) < 0 && errno == EINTR) {}
    fprintf(stderr, "gerbil serve: %s: stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    server_stop(&srv);
    sched_free(s);
    srv_embed_free();
    gerbil_chat_template_free(tg.tmpl);
    gerbil_tokenizer_free(tg.tok);
    gerbil_model_free(m);
    if (srv.stt_tok) gerbil_tokenizer_free(srv.stt_tok);
    gerbil_model_free(srv.stt);
    return 0;
}
