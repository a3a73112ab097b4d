/* Stop strings over streamed text: matched across token boundaries and cut from the
 * output. Text that could still be the start of a stop string is held back until it
 * is known not to be. */
#ifndef GB_STOP_H
#define GB_STOP_H

#include <stddef.h>

struct stop_matcher {
    char **stops;
    size_t *lens;
    int n;
    char *buf;        /* held-back text + the newest piece */
    size_t n_buf, cap;
    size_t n_emit;    /* bytes of buf handed out by the last call */
};

/* Copies the strings; empty strings are ignored. Returns 0, or -1 out of memory. */
int stop_init(struct stop_matcher *m, const char *const *stops, int n);
void stop_free(struct stop_matcher *m);
/* Add text. *emit and *n_emit: what may be shown now (valid until the next call).
 * Returns 1 when a stop string matched: *emit is the text before it, and the
 * matcher should not be fed again. */
int stop_feed(struct stop_matcher *m, const char *text, size_t len, const char **emit, size_t *n_emit);
/* End of generation: everything still held back. */
void stop_flush(struct stop_matcher *m, const char **emit, size_t *n_emit);

#endif
