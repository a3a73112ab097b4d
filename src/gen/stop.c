#include "gen/stop.h"

#include <stdlib.h>
#include <string.h>

int stop_init(struct stop_matcher *m, const char *const *stops, int n) {
    memset(m, 0, sizeof *m);
    if (n <= 0) return 0;
    m->stops = calloc((size_t)n, sizeof *m->stops);
    m->lens = calloc((size_t)n, sizeof *m->lens);
    if (!m->stops || !m->lens) { stop_free(m); return -1; }
    for (int i = 0; i < n; i++) {
        size_t len = strlen(stops[i]);
        if (!len) continue;
        if (!(m->stops[m->n] = strdup(stops[i]))) { stop_free(m); return -1; }
        m->lens[m->n++] = len;
    }
    return 0;
}

void stop_free(struct stop_matcher *m) {
    for (int i = 0; i < m->n; i++) free(m->stops[i]);
    free(m->stops);
    free(m->lens);
    free(m->buf);
    memset(m, 0, sizeof *m);
}

/* Longest suffix of buf[0..n) that is a proper prefix of some stop string. */
static size_t held_suffix(const struct stop_matcher *m, const char *buf, size_t n) {
    size_t best = 0;
    for (int i = 0; i < m->n; i++) {
        size_t k = m->lens[i] - 1 < n ? m->lens[i] - 1 : n;
        for (; k > best; k--)
            if (memcmp(buf + n - k, m->stops[i], k) == 0) { best = k; break; }
    }
    return best;
}

int stop_feed(struct stop_matcher *m, const char *text, size_t len, const char **emit, size_t *n_emit) {
    if (m->n == 0) { *emit = text; *n_emit = len; return 0; }
    /* drop what was handed out last time */
    if (m->n_emit) memmove(m->buf, m->buf + m->n_emit, m->n_buf - m->n_emit);
    m->n_buf -= m->n_emit;
    m->n_emit = 0;
    if (m->n_buf + len > m->cap) {
        size_t cap = m->cap ? m->cap : 256;
        while (cap < m->n_buf + len) cap *= 2;
        char *nb = realloc(m->buf, cap);
        if (!nb) { *emit = text; *n_emit = len; return 0; } /* degrade: show it unmatched */
        m->buf = nb;
        m->cap = cap;
    }
    if (len) memcpy(m->buf + m->n_buf, text, len);
    m->n_buf += len;

    /* earliest complete match wins */
    size_t first = (size_t)-1;
    for (int i = 0; i < m->n; i++) {
        for (size_t p = 0; p + m->lens[i] <= m->n_buf && p < first; p++)
            if (memcmp(m->buf + p, m->stops[i], m->lens[i]) == 0) { first = p; break; }
    }
    *emit = m->buf ? m->buf : "";
    if (first != (size_t)-1) {
        *n_emit = m->n_emit = first;
        return 1;
    }
    *n_emit = m->n_emit = m->n_buf - held_suffix(m, m->buf, m->n_buf);
    return 0;
}

void stop_flush(struct stop_matcher *m, const char **emit, size_t *n_emit) {
    if (m->n == 0) { *emit = ""; *n_emit = 0; return; }
    *emit = m->buf ? m->buf + m->n_emit : "";
    *n_emit = m->n_buf - m->n_emit;
    m->n_emit = m->n_buf;
}
