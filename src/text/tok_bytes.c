/* Token id -> the bytes it puts into the text (see tok_bytes.h). */
#include "text/tok_bytes.h"
#include "text/tok_internal.h"

#include <stdlib.h>
#include <string.h>

/* Byte-level when no byte fallback and nearly every token maps into the GPT-2 alphabet. */
static int is_byte_level(const struct gerbil_tokenizer *t) {
    if (t->model.byte_fallback || tk_dec_has_byte_fallback(t->decoder)) return 0;
    size_t ok = 0, all = 0;
    for (int32_t id = 0; id < t->model.n_ids; id++) {
        size_t n;
        const char *s = tk_model_token(&t->model, id, &n);
        if (!s) continue;
        all++;
        size_t i = 0;
        int good = 1;
        while (i < n && good) {
            if (tk_utf8_valid_prefix(s + i, n - i) == 0) { good = 0; break; }
            uint32_t cp = tk_utf8_next(s, &i);
            good = tk_cp_to_byte(cp) >= 0;
        }
        ok += good;
    }
    return all && ok * 100 >= all * 99;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

int tok_bytes_mode(gerbil_tokenizer_t t) { return t && is_byte_level(t) ? TOK_BYTES_BYTE_LEVEL : TOK_BYTES_TEXT; }

int tok_token_bytes(gerbil_tokenizer_t t, int mode, int32_t id, char **out, size_t *len, int *special) {
    *out = NULL;
    *len = 0;
    *special = 0;
    if (!t || id < 0 || id >= t->n_vocab) return -1;
    const tk_added_tok *a = tk_added_by_id(&t->added, id);
    if (a) {
        *special = a->special;
        if (!a->len) return 0;
        *out = malloc(a->len);
        if (!*out) return -1;
        memcpy(*out, a->content, a->len);
        *len = a->len;
        return 0;
    }
    size_t n;
    const char *s = tk_model_token(&t->model, id, &n);
    if (!s) return -1;
    const int mode_byte_level = mode == TOK_BYTES_BYTE_LEVEL;
    char *b = malloc(n ? n : 1);
    if (!b) return -1;
    size_t k = 0;
    if (mode_byte_level) {
        size_t i = 0;
        while (i < n) {
            if (tk_utf8_valid_prefix(s + i, n - i) == 0) { b[k++] = s[i++]; continue; }
            uint32_t cp = tk_utf8_next(s, &i);
            int v = tk_cp_to_byte(cp);
            if (v >= 0) b[k++] = (char)v;
            else { /* outside the alphabet: keep its UTF-8 */
                char e[4];
                int m = tk_utf8_encode(e, cp);
                char *nb = realloc(b, n + k + 4);
                if (!nb) { free(b); return -1; }
                b = nb;
                memcpy(b + k, e, (size_t)m);
                k += (size_t)m;
            }
        }
    } else if (n == 6 && !memcmp(s, "<0x", 3) && s[5] == '>' && hexval(s[3]) >= 0 && hexval(s[4]) >= 0 &&
               t->model.byte_fallback) {
        b[k++] = (char)(hexval(s[3]) * 16 + hexval(s[4]));
    } else {
        for (size_t i = 0; i < n;) {
            if (i + 3 <= n && !memcmp(s + i, "\xe2\x96\x81", 3)) { b[k++] = ' '; i += 3; }
            else b[k++] = s[i++];
        }
    }
    *out = b;
    *len = k;
    return 0;
}
