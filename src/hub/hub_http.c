/* HTTP through libcurl: the common options of every request, the reply headers the
 * hub speaks (X-Error-Code, ETag, X-Linked-Etag, X-Linked-Size), and one place that
 * turns a failed request into a status and a message saying what to do. */
#include "hub/hub.h"
#include "io/json.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;

/* curl_global_init is not thread-safe: once, before any handle exists. */
static void curl_init(void) { curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT); }

/* The token `hf auth login` saved: $HF_TOKEN_PATH, else $HF_HOME/token, else
 * ~/.cache/huggingface/token. NULL when there is none. */
static char *saved_token(void) {
    const char *path = getenv("HF_TOKEN_PATH"), *home = getenv("HF_HOME"), *user = getenv("HOME");
    char *file = path && path[0] ? strdup(path)
                 : home && home[0] ? hub_strf("%s/token", home)
                 : user && user[0] ? hub_strf("%s/.cache/huggingface/token", user) : NULL;
    FILE *f = file ? fopen(file, "rb") : NULL;
    free(file);
    if (!f) return NULL;
    char buf[512] = {0};
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ')) buf[--n] = 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)buf[i] <= ' ') return NULL; /* not a token */
    return n ? strdup(buf) : NULL;
}

gerbil_status hub_http_init(struct hub_http *h, const gerbil_hub_params *p) {
    memset(h, 0, sizeof *h);
    pthread_once(&curl_once, curl_init);
    if (curl_init_rc != CURLE_OK) return err_set(GERBIL_ERR_NETWORK, "cannot initialise libcurl: %s",
                                                 curl_easy_strerror(curl_init_rc));
    const char *ep = p->endpoint && p->endpoint[0] ? p->endpoint : HUB_DEFAULT_ENDPOINT;
    h->endpoint = strdup(ep);
    if (!h->endpoint) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    size_t n = strlen(h->endpoint);
    while (n > 1 && h->endpoint[n - 1] == '/') h->endpoint[--n] = 0;
    h->token = p->token && p->token[0] ? strdup(p->token) : saved_token();
    if (h->token) {
        char *hdr = hub_strf("Authorization: Bearer %s", h->token);
        struct curl_slist *l = hdr ? curl_slist_append(NULL, hdr) : NULL;
        free(hdr);
        if (!l) { hub_http_free(h); return err_set(GERBIL_ERR_NOMEM, "out of memory"); }
        h->headers = l;
    }
    return GERBIL_OK;
}

void hub_http_free(struct hub_http *h) {
    curl_slist_free_all(h->headers);
    free(h->endpoint);
    free(h->token);
    memset(h, 0, sizeof *h);
}

char *hub_http_escape(const char *s, int keep_slash) {
    size_t cap = strlen(s) * 3 + 1;
    char *out = malloc(cap), *o = out;
    if (!out) return NULL;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        int plain = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
                    strchr("-._~", *p) || (keep_slash && *p == '/');
        if (plain) *o++ = (char)*p;
        else o += sprintf(o, "%%%02X", *p);
    }
    *o = 0;
    return out;
}

/* Copy a header value without the surrounding quotes and a weak "W/" prefix. */
static void header_value(char *dst, size_t cap, const char *v, size_t n) {
    while (n && (*v == ' ' || *v == '\t')) { v++; n--; }
    while (n && (v[n - 1] == '\r' || v[n - 1] == '\n' || v[n - 1] == ' ')) n--;
    if (n >= 2 && !strncmp(v, "W/", 2)) { v += 2; n -= 2; }
    if (n >= 2 && v[0] == '"' && v[n - 1] == '"') { v++; n -= 2; }
    if (n >= cap) n = cap - 1;
    memcpy(dst, v, n);
    dst[n] = 0;
}

static int header_is(const char *line, size_t n, const char *name, const char **value, size_t *vlen) {
    size_t k = strlen(name);
    if (n <= k || strncasecmp(line, name, k) || line[k] != ':') return 0;
    *value = line + k + 1;
    *vlen = n - k - 1;
    return 1;
}

/* Headers of every response of a request, redirects included, arrive here. The
 * hub's own (first) response carries the ETag and X-Linked-*; the last one the code. */
static size_t on_header(char *line, size_t size, size_t nitems, void *user) {
    struct hub_http_reply *r = user;
    size_t n = size * nitems;
    const char *v;
    size_t vn;
    char tmp[128];
    if (n >= 5 && !strncmp(line, "HTTP/", 5)) {
        r->error_code[0] = 0;
        const char *sp = memchr(line, ' ', n);
        r->code = sp ? strtol(sp + 1, NULL, 10) : 0;
    } else if (header_is(line, n, "x-error-code", &v, &vn)) {
        header_value(r->error_code, sizeof r->error_code, v, vn);
    } else if (header_is(line, n, "etag", &v, &vn) && !r->etag[0]) {
        header_value(r->etag, sizeof r->etag, v, vn);
    } else if (header_is(line, n, "x-linked-etag", &v, &vn) && !r->linked_etag[0]) {
        header_value(r->linked_etag, sizeof r->linked_etag, v, vn);
    } else if (header_is(line, n, "x-linked-size", &v, &vn) && r->linked_size == HUB_SIZE_UNKNOWN) {
        header_value(tmp, sizeof tmp, v, vn);
        r->linked_size = strtoull(tmp, NULL, 10);
    } else if (header_is(line, n, "content-length", &v, &vn) && r->content_length == HUB_SIZE_UNKNOWN) {
        header_value(tmp, sizeof tmp, v, vn);
        r->content_length = strtoull(tmp, NULL, 10);
    }
    return n;
}

void *hub_http_easy(const struct hub_http *h, const char *url, struct hub_http_reply *reply) {
    CURL *c = curl_easy_init();
    if (!c) return NULL;
    memset(reply, 0, sizeof *reply);
    reply->linked_size = reply->content_length = HUB_SIZE_UNKNOWN;
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "gerbil/0.1 (libcurl)");
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);        /* threads: no SIGALRM for DNS timeouts */
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 20L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);  /* a stalled transfer fails after 60 s */
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 60L);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, reply);
    /* libcurl sends a custom Authorization header only to the first host, so the
     * token does not leak to the CDN a download is redirected to. */
    if (h->headers) curl_easy_setopt(c, CURLOPT_HTTPHEADER, (struct curl_slist *)h->headers);
    return c;
}

static gerbil_status curl_error(CURLcode rc, const char *curl_err, const struct hub_http *h, const char *what) {
    const char *detail = curl_err && curl_err[0] ? curl_err : curl_easy_strerror(rc);
    switch (rc) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
        return err_set(GERBIL_ERR_NETWORK, "cannot reach %s for %s: DNS lookup failed (%s); check the network "
                       "connection (or HF_ENDPOINT), or set HF_HUB_OFFLINE=1 to use only cached models",
                       h->endpoint, what, detail);
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
        return err_set(GERBIL_ERR_NETWORK, "cannot reach %s for %s: %s; check the network connection (or "
                       "HF_ENDPOINT), or set HF_HUB_OFFLINE=1 to use only cached models", h->endpoint, what, detail);
    case CURLE_PARTIAL_FILE:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
        return err_set(GERBIL_ERR_NETWORK, "the connection dropped while downloading %s (%s); run the same "
                       "command again to resume", what, detail);
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CONNECT_ERROR:
        return err_set(GERBIL_ERR_NETWORK, "secure connection to %s for %s failed: %s; install the CA certificates "
                       "(apt-get install ca-certificates) or check the system clock and any proxy", h->endpoint, what,
                       detail);
    default:
        return err_set(GERBIL_ERR_NETWORK, "downloading %s from %s failed: %s", what, h->endpoint, detail);
    }
}

gerbil_status hub_http_check(int curl_rc, const char *curl_err, const struct hub_http_reply *reply,
                             const struct hub_http *h, const struct hub_ref *ref, const char *file) {
    char what[1400];
    if (file) snprintf(what, sizeof what, "%s from %s@%s", file, ref->repo, ref->revision);
    else snprintf(what, sizeof what, "%s@%s", ref->repo, ref->revision);
    if (curl_rc != CURLE_OK) return curl_error((CURLcode)curl_rc, curl_err, h, what);
    long code = reply->code;
    const char *xe = reply->error_code;
    if (code >= 200 && code < 300) return GERBIL_OK;
    if (!strcmp(xe, "RepoNotFound") || (code == 404 && !file && !xe[0] && !strcmp(ref->revision, "main")))
        return err_set(GERBIL_ERR_NOT_FOUND, "no repo %s on %s (HTTP %ld): check the name%s", ref->repo,
                       h->endpoint, code, h->token ? "" : "; if it is private, set HF_TOKEN (or --token)");
    if (!strcmp(xe, "RevisionNotFound") || (code == 404 && !file))
        return err_set(GERBIL_ERR_NOT_FOUND, "%s has no revision \"%s\" (HTTP %ld): check the branch, tag or "
                       "commit after '@'", ref->repo, ref->revision, code);
    if (code == 404)
        return err_set(GERBIL_ERR_NOT_FOUND, "%s (HTTP 404): the file is not in the repo at that revision", what);
    if (code == 401 || code == 403)
        return err_set(GERBIL_ERR_AUTH, "access to %s denied (HTTP %ld%s%s): the repo is gated or private; %s",
                       what, code, xe[0] ? ", " : "", xe,
                       h->token ? "check that your token (HF_TOKEN or --token) is valid and, for a gated repo, that "
                                  "you accepted its terms on its Hugging Face page"
                                : "set HF_TOKEN (or pass --token) to a Hugging Face access token that can read it, "
                                  "and accept the repo's terms on its page if it is gated");
    if (code == 429)
        return err_set(GERBIL_ERR_NETWORK, "%s: the hub is rate-limiting requests (HTTP 429); wait a minute and "
                       "try again%s", what, h->token ? "" : ", or set HF_TOKEN for a higher limit");
    if (code >= 500)
        return err_set(GERBIL_ERR_NETWORK, "%s: the hub answered HTTP %ld (a server error); try again later",
                       what, code);
    return err_set(GERBIL_ERR_NETWORK, "%s: unexpected HTTP %ld from %s", what, code, h->endpoint);
}

struct membuf {
    char *data;
    size_t len;
    int overflow;
};

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *user) {
    struct membuf *b = user;
    size_t n = size * nmemb;
    if (b->len + n > ((size_t)64 << 20)) { b->overflow = 1; return 0; } /* an API reply is small */
    char *d = realloc(b->data, b->len + n + 1);
    if (!d) { b->overflow = 1; return 0; }
    memcpy(d + b->len, ptr, n);
    b->data = d;
    b->len += n;
    d[b->len] = 0;
    return n;
}

gerbil_status hub_http_get_json(const struct hub_http *h, const char *url, const struct hub_ref *ref, cJSON **out) {
    *out = NULL;
    struct hub_http_reply reply;
    struct membuf body = {0};
    char errbuf[CURL_ERROR_SIZE] = {0};
    CURL *c = hub_http_easy(h, url, &reply);
    if (!c) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &body);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(c, CURLOPT_ACCEPT_ENCODING, ""); /* gzip where the server offers it */
    CURLcode rc = curl_easy_perform(c);
    curl_easy_cleanup(c);
    gerbil_status st = body.overflow ? err_set(GERBIL_ERR_FORMAT, "%s: reply too large or out of memory", url)
                                     : hub_http_check(rc, errbuf, &reply, h, ref, NULL);
    if (st == GERBIL_OK) st = json_parse(body.data, body.len, url, out);
    free(body.data);
    return st;
}

gerbil_status hub_http_head_file(const struct hub_http *h, const struct hub_ref *ref, const char *commit,
                                 struct hub_file *f) {
    char *path = hub_http_escape(f->path, 1);
    char *url = path ? hub_strf("%s/%s/resolve/%s/%s", h->endpoint, ref->repo, commit, path) : NULL;
    free(path);
    if (!url) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    struct hub_http_reply reply;
    char errbuf[CURL_ERROR_SIZE] = {0};
    CURL *c = hub_http_easy(h, url, &reply);
    free(url);
    if (!c) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L); /* the hub's own headers, not the CDN's */
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
    CURLcode rc = curl_easy_perform(c);
    curl_easy_cleanup(c);
    if (rc == CURLE_OK && reply.code >= 300 && reply.code < 400) reply.code = 200; /* a redirect is success */
    GB_TRY(hub_http_check(rc, errbuf, &reply, h, ref, f->path));
    const char *etag = reply.linked_etag[0] ? reply.linked_etag : reply.etag;
    if (!etag[0]) return err_set(GERBIL_ERR_FORMAT, "%s: the hub sent no ETag for %s", ref->repo, f->path);
    for (const char *s = etag; *s; s++)
        if (!((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f') || (*s >= 'A' && *s <= 'F')))
            return err_set(GERBIL_ERR_FORMAT, "%s: unexpected ETag \"%s\" for %s", ref->repo, etag, f->path);
    free(f->etag);
    if (!(f->etag = strdup(etag))) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    f->lfs = reply.linked_etag[0] && strlen(etag) == 64;
    f->size = reply.linked_size != HUB_SIZE_UNKNOWN ? reply.linked_size : reply.content_length;
    return GERBIL_OK;
}
