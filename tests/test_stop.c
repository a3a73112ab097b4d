/* Stop strings: however the text is cut into pieces, the output is the text up to
 * the first occurrence of any stop string (reference: a search over the whole text). */
#include "gen/stop.h"
#include "test.h"

#include <string.h>

/* Feed text in pieces at the given cut points; collect the output. */
static int run(const char *const *stops, int n_stops, const char *text, const size_t *cuts, int n_cuts,
               char *out, size_t *n_out) {
    struct stop_matcher m;
    if (stop_init(&m, stops, n_stops)) return -1;
    size_t pos = 0, o = 0;
    int stopped = 0;
    for (int c = 0; c <= n_cuts && !stopped; c++) {
        size_t end = c < n_cuts ? cuts[c] : strlen(text);
        const char *e;
        size_t ne;
        stopped = stop_feed(&m, text + pos, end - pos, &e, &ne);
        memcpy(out + o, e, ne);
        o += ne;
        pos = end;
    }
    if (!stopped) {
        const char *e;
        size_t ne;
        stop_flush(&m, &e, &ne);
        memcpy(out + o, e, ne);
        o += ne;
    }
    stop_free(&m);
    *n_out = o;
    return stopped;
}

static size_t reference(const char *const *stops, int n, const char *text, int *stopped) {
    size_t first = strlen(text);
    *stopped = 0;
    for (int i = 0; i < n; i++) {
        if (!stops[i][0]) continue;
        const char *p = strstr(text, stops[i]);
        if (p && (size_t)(p - text) <= first) { first = (size_t)(p - text); *stopped = 1; }
    }
    return first;
}

int main(void) {
    const char *stops[] = {"<|end|>", "\n\nUser:", "aab", ""};
    char out[512];
    size_t n_out;
    const size_t cuts1[] = {9, 14};
    CHECK(run(stops, 3, "Hello world<|end|> more", cuts1, 2, out, &n_out) == 1);
    CHECK(n_out == 11 && memcmp(out, "Hello world", 11) == 0);
    CHECK(run(stops, 0, "no stops at all", cuts1, 2, out, &n_out) == 0 && n_out == 15);
    CHECK(run(stops, 3, "held <|en but never ends", cuts1, 2, out, &n_out) == 0 && n_out == 24);

    unsigned long long seed = 0x5eed1234ULL;
    const char alphabet[] = "ab<|end>\nUser: ";
    for (int iter = 0; iter < 20000; iter++) {
        char text[64];
        int len = (int)(test_rand_u64(&seed) % 48);
        for (int i = 0; i < len; i++) text[i] = alphabet[test_rand_u64(&seed) % (sizeof alphabet - 1)];
        text[len] = 0;
        size_t cuts[8];
        int n_cuts = (int)(test_rand_u64(&seed) % 8);
        for (int c = 0; c < n_cuts; c++) cuts[c] = len ? test_rand_u64(&seed) % (size_t)(len + 1) : 0;
        for (int a = 0; a < n_cuts; a++) /* sort */
            for (int b = a + 1; b < n_cuts; b++)
                if (cuts[b] < cuts[a]) { size_t t = cuts[a]; cuts[a] = cuts[b]; cuts[b] = t; }
        int want_stop;
        size_t want = reference(stops, 4, text, &want_stop);
        int got_stop = run(stops, 4, text, cuts, n_cuts, out, &n_out);
        if (got_stop != want_stop || n_out != want || memcmp(out, text, want) != 0) {
            CHECKF(0, "text \"%s\": got %d/%zu, want %d/%zu", text, got_stop, n_out, want_stop, want);
            break;
        }
    }
    return test_done();
}
