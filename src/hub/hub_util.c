/* Small helpers of the hub layer: formatted paths, mkdir -p, byte counts. */
#include "hub/hub.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

char *hub_strf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) return NULL;
    char *s = malloc((size_t)n + 1);
    if (!s) return NULL;
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

gerbil_status hub_mkdirs(const char *path) {
    char *p = strdup(path);
    if (!p) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s) continue;
        char c = *s;
        *s = 0;
        if (mkdir(p, 0755) != 0 && errno != EEXIST) {
            gerbil_status st = err_set(GERBIL_ERR_IO, "cannot create folder %s: %s (the model cache must be "
                                       "writable: set HF_HUB_CACHE to a folder you can write)", p, strerror(errno));
            free(p);
            return st;
        }
        if (!c) break;
        *s = c;
    }
    free(p);
    return GERBIL_OK;
}

const char *hub_fmt_bytes(uint64_t n, char *buf, size_t cap) {
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)n;
    int u = 0;
    while (v >= 1024 && u < 4) { v /= 1024; u++; }
    if (u == 0) snprintf(buf, cap, "%llu B", (unsigned long long)n);
    else snprintf(buf, cap, "%.1f %s", v, units[u]);
    return buf;
}

int hub_ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcasecmp(s + n - m, suffix);
}
