/* gerbil serve's HTTP side under hostile clients: a real server (libmicrohttpd + the
 * scheduler) on stories260K with the Qwen3 chat template, started once per process on a
 * loopback port; each input is one request over a fresh TCP connection. Input: a route byte
 * (which method and path), a mode byte (bit 0: the rest is the whole raw request, framing
 * included; otherwise it is the body of a well-formed request to the route), then the bytes.
 * Invariants (abort on violation): every request gets a reply with a status line within
 * 30 s, and no reply is a 500 (a client's mistake is a 4xx; the server's own faults are
 * what the fuzzer hunts) — a sanitizer report ends the process on its own. The server must
 * also still answer GET /health afterwards. Needs ../shared/data (run from the repo root);
 * without it the harness exits 77 (skipped). GERBIL_FUZZ_VERBOSE=1 prints each reply's status. */
#include "fuzz_common.h"
#include "gerbil.h"
#include "serve/server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>

static const char *MODEL = "../shared/data/models/stories260K/hf";
static const char *TEMPLATE = "../shared/data/tokenizers/chat_templates/Qwen-Qwen3-0.6B.jinja";

static struct server srv;
static int port;

static const struct { const char *method, *path; } routes[] = {
    {"POST", "/v1/chat/completions"}, {"POST", "/v1/completions"}, {"POST", "/tokenize"},
    {"POST", "/detokenize"},          {"POST", "/v1/embeddings"},  {"GET", "/v1/models"},
    {"GET", "/metrics"},              {"GET", "/health"},          {"POST", "/v1/audio/transcriptions"},
    {"GET", "/"},                     {"DELETE", "/v1/chat/completions"}, {"POST", "/v1/unknown"},
};
enum { N_ROUTES = sizeof routes / sizeof routes[0] };

static void setup(void) {
    signal(SIGPIPE, SIG_IGN);
    if (access(MODEL, R_OK) != 0 || access(TEMPLATE, R_OK) != 0) {
        fprintf(stderr, "fuzz_http: %s or %s not found: skipped\n", MODEL, TEMPLATE);
        exit(77);
    }
    gerbil_model_params mp = gerbil_model_default_params();
    mp.n_threads = 1;
    gerbil_model_t m = NULL;
    gerbil_tokenizer_t tok = NULL;
    gerbil_chat_template_t tmpl = NULL;
    if (gerbil_model_load(MODEL, &mp, &m) != GERBIL_OK || gerbil_tokenizer_load(MODEL, &tok) != GERBIL_OK ||
        gerbil_chat_template_load(MODEL, TEMPLATE, &tmpl) != GERBIL_OK) {
        fprintf(stderr, "fuzz_http: cannot load %s: %s\n", MODEL, gerbil_last_error());
        abort();
    }
    struct srv_config cfg = {.host = "127.0.0.1", .port = 0, .max_body = 1u << 20, .max_header = 16u << 10,
                             .alias = "stories", .n_ctx_seq = 512, .max_n = 4};
    struct sched_params sp = {.n_parallel = 4, .n_queue = 8, .n_ctx_seq = 512, .n_kv = 2048,
                              .n_batch = 128, .chunk = 64, .prefix_cache = 1, .kv_type = GERBIL_KV_F16};
    struct sched *s = NULL;
    if (server_start(&srv, &cfg) || sched_new(m, tok, &sp, &s) != GERBIL_OK || sched_start(s) != GERBIL_OK) {
        fprintf(stderr, "fuzz_http: cannot start the server: %s\n", gerbil_last_error());
        abort();
    }
    server_ready(&srv, s, m, tok, tmpl);
    port = srv.port;
}

/* Send req (half_close: then shut the sending side), read the whole reply; its status, or -1 when none came within the timeout. */
static char reply_[1 << 16];
static int reset_; /* the errno of a connection reset before any reply byte */
static size_t reply_n_;

static int exchange(const char *req, size_t n, int half_close) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) abort();
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {.tv_sec = 30};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) { perror("fuzz_http: connect"); abort(); }
    for (size_t off = 0; off < n;) {
        ssize_t w = send(fd, req + off, n - off, MSG_NOSIGNAL);
        if (w <= 0) break; /* the server may close on a bad request before reading it all */
        off += (size_t)w;
    }
    if (half_close) shutdown(fd, SHUT_WR); /* a raw request may be cut short: say no more comes */
    char *head = reply_;
    reset_ = 0;
    size_t got = 0;
    int timed_out = 0;
    for (char buf[4096];;) {
        ssize_t r = recv(fd, buf, sizeof buf, 0);
        if (r == 0) break;
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) { timed_out = 1; break; }
        if (r < 0) { /* reset: a reply (if any) was cut short */
            if (!got) reset_ = errno;
            break;
        }
        for (ssize_t i = 0; i < r && got < sizeof reply_ - 1; i++) head[got++] = buf[i];
    }
    close(fd);
    head[got] = 0;
    reply_n_ = got;
    if (getenv("GERBIL_FUZZ_VERBOSE")) {
        const char *b = strstr(head, "\r\n\r\n");
        fprintf(stderr, "fuzz_http: reply body: %.200s\n", b ? b + 4 : head);
    }
    if (timed_out) return -1;
    if (got < 12 || memcmp(head, "HTTP/1.", 7)) return 0; /* closed without a reply: a framing error */
    return atoi(head + 9);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!port) setup();
    if (size < 2) return 0;
    const int route = data[0] % N_ROUTES, raw = data[1] & 1;
    const char *body = (const char *)data + 2;
    const size_t n = size - 2;
    char *req;
    size_t len;
    if (raw) {
        req = malloc(n + 1);
        if (!req) abort();
        memcpy(req, body, n);
        len = n;
    } else {
        const char *type = route == 8 ? "multipart/form-data; boundary=XyZ" : "application/json";
        char hdr[512];
        int h = snprintf(hdr, sizeof hdr,
                         "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: %s\r\n"
                         "Content-Length: %zu\r\n\r\n",
                         routes[route].method, routes[route].path, type, n);
        req = malloc((size_t)h + n);
        if (!req) abort();
        memcpy(req, hdr, (size_t)h);
        memcpy(req + h, body, n);
        len = (size_t)h + n;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const int status = exchange(req, len, raw);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    static int prev_route = -1, prev_raw;
    if (status < 0 && prev_route >= 0)
        fprintf(stderr, "fuzz_http: the input before was %s %s%s\n", routes[prev_route].method, routes[prev_route].path,
                prev_raw ? " (raw)" : "");
    prev_route = route;
    prev_raw = raw;
    free(req);
    if (getenv("GERBIL_FUZZ_VERBOSE")) fprintf(stderr, "fuzz_http: %s %s%s -> %d in %.3f s\n", routes[route].method, routes[route].path, raw ? " (raw)" : "", status, secs);
    if (status < 0) {
        fprintf(stderr, "fuzz_http: no reply within 30 s (%s %s)\n", routes[route].method, routes[route].path);
        static const char metrics[] = "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
        for (int k = 0; k < 2; k++) {
            if (k) sleep(3);
            exchange(metrics, sizeof metrics - 1, 0);
            const char *b = strstr(reply_, "gerbil_requests_running");
            const char *e = b ? strstr(b, "gerbil_prefix_cache_hits_total") : NULL;
            fprintf(stderr, "fuzz_http: the server's /metrics%s:\n%.*s\n", k ? " 3 s later" : "",
                    b && e ? (int)(e - b) : 0, b ? b : "");
            const char *st = strstr(reply_, "gerbil_steps_total");
            if (st) fprintf(stderr, "%.40s\n", st);
        }
        abort();
    }
    if (status == 0 && reset_ && !raw) { /* a well-formed request must get a reply, not a reset */
        fprintf(stderr, "fuzz_http: %s %s: the connection was reset without a reply (%s)\n", routes[route].method,
                routes[route].path, strerror(reset_));
        abort();
    }
    if (status == 0 && reset_ && !raw) { /* a well-formed request must get a reply, not a reset */
        fprintf(stderr, "fuzz_http: %s %s: the connection was reset without a reply (%s)\n", routes[route].method,
                routes[route].path, strerror(reset_));
        abort();
    }
    if (status == 500) { fprintf(stderr, "fuzz_http: 500 for %s %s\n", routes[route].method, routes[route].path); abort(); }
    static const char health[] = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    const int hs = exchange(health, sizeof health - 1, 0);
    if (hs != 200) { fprintf(stderr, "fuzz_http: GET /health answered %d after the request\n", hs); abort(); }
    return 0;
}
