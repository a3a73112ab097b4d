#include "base/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ERR_CAP = 1024 };
static _Thread_local char err_msg[ERR_CAP];

gerbil_status err_set(gerbil_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_msg, sizeof err_msg, fmt, ap);
    va_end(ap);
    return s;
}

gerbil_status err_prefix(gerbil_status s, const char *fmt, ...) {
    char prefix[ERR_CAP], old[ERR_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err_msg, sizeof old);
    /* truncation of very long messages is fine */
    size_t n = strlen(prefix);
    if (n > ERR_CAP - 3) n = ERR_CAP - 3;
    memcpy(err_msg, prefix, n);
    memcpy(err_msg + n, ": ", 2);
    size_t m = strlen(old);
    if (m > ERR_CAP - 1 - (n + 2)) m = ERR_CAP - 1 - (n + 2);
    memcpy(err_msg + n + 2, old, m);
    err_msg[n + 2 + m] = '\0';
    return s;
}

void err_clear(void) { err_msg[0] = '\0'; }

const char *gerbil_last_error(void) { return err_msg; }

const char *gerbil_status_name(gerbil_status s) {
    switch (s) {
    case GERBIL_OK: return "ok";
    case GERBIL_ERR_IO: return "io error";
    case GERBIL_ERR_FORMAT: return "format error";
    case GERBIL_ERR_UNSUPPORTED: return "unsupported";
    case GERBIL_ERR_INVALID_ARG: return "invalid argument";
    case GERBIL_ERR_NOMEM: return "out of memory";
    case GERBIL_ERR_CONTEXT: return "context full";
    case GERBIL_ERR_NETWORK: return "network error";
    case GERBIL_ERR_AUTH: return "access denied";
    case GERBIL_ERR_NOT_FOUND: return "not found";
    }
    return "unknown status";
}

void gb_abort(const char *file, int line, const char *msg) {
    fprintf(stderr, "gerbil: internal error at %s:%d: %s\n", file, line, msg);
    abort();
}
