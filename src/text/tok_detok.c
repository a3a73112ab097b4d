/* Streaming detokenizer. Each push decodes a short window of ids (some context + the
 * new ones) and emits what the window's text gained. The context absorbs the
 * first-token rules of the decoders (Metaspace/Strip drop a leading space, WordPiece
 * adds none), so the pieces concatenate to exactly gerbil_detokenize of all ids:
 *  - text ending in U+FFFD (an incomplete UTF-8 sequence so far) is held back;
 *  - with a ByteFallback decoder, runs of <0xNN> tokens are held until a non-byte
 *    token ends them, since HF decodes a whole run at once (an invalid byte later in
 *    the run turns every byte of it into U+FFFD);
 *  - after emitting, the window is cut to the shortest tail whose own decoding is
 *    non-empty, which is the context for the next ids. */
#include "text/tok_internal.h"

#include <stdlib.h>
#include <string.h>

struct gerbil_detok {
    gerbil_tokenizer_t t;
    int skip_special, byte_fallback;
    tk_ids win;       /* context + pending ids */
    size_t emitted;   /* bytes of decode(win) already given out */
    tk_buf text;      /* decode(win) */
    tk_buf piece;     /* what the last call returned */
    tk_strs strs;
    tk_ctx cx;
};

static gerbil_status decode_win(struct gerbil_detok *d, size_t from, tk_buf *out) {
    tk_strs_clear(&d->strs);
    out->n = 0;
    GB_TRY(tk_ids_to_strs(d->t, d->win.v + from, (int)(d->win.n - from), d->skip_special, &d->strs));
    GB_TRY(tk_dec_apply(d->t->decoder, &d->cx, &d->strs, out));
    return GERBIL_OK;
}

gerbil_status gerbil_detok_new(gerbil_tokenizer_t tok, int skip_special, gerbil_detok_t *out) {
    if (!tok || !out) return err_set(GERBIL_ERR_INVALID_ARG, "gerbil_detok_new: NULL argument");
    struct gerbil_detok *d = calloc(1, sizeof *d);
    if (!d) return err_set(GERBIL_ERR_NOMEM, "gerbil_detok_new: out of memory");
    d->t = tok;
    d->skip_special = skip_special;
    d->byte_fallback = tk_dec_has_byte_fallback(tok->decoder);
    *out = d;
    return GERBIL_OK;
}

void gerbil_detok_free(gerbil_detok_t d) {
    if (!d) return;
    tk_ids_free(&d->win);
    tk_buf_free(&d->text);
    tk_buf_free(&d->piece);
    tk_strs_free(&d->strs);
    tk_ctx_free(&d->cx);
    free(d);
}

static int is_byte_tok(const struct gerbil_detok *d, int32_t id) {
    if (!d->byte_fallback || tk_added_by_id(&d->t->added, id)) return 0;
    size_t n;
    const char *s = tk_model_token(&d->t->model, id, &n);
    return s && n == 6 && !memcmp(s, "<0x", 3) && s[5] == '>';
}

static gerbil_status set_piece(struct gerbil_detok *d, const char *s, size_t n, const char **piece, size_t *len) {
    d->piece.n = 0;
    if (tk_buf_put(&d->piece, s, n) || tk_buf_reserve(&d->piece, 1)) return err_set(GERBIL_ERR_NOMEM, "detokenizer: out of memory");
    d->piece.p[d->piece.n] = 0;
    *piece = d->piece.p;
    *len = n;
    return GERBIL_OK;
}

gerbil_status gerbil_detok_push(gerbil_detok_t d, int32_t id, const char **piece, size_t *len) {
    if (!d || !piece || !len) return err_set(GERBIL_ERR_INVALID_ARG, "gerbil_detok_push: NULL argument");
    *piece = "";
    *len = 0;
    /* ids that decode to nothing at all (unknown, skipped specials) change nothing */
    tk_strs_clear(&d->strs);
    GB_TRY(tk_ids_to_strs(d->t, &id, 1, d->skip_special, &d->strs));
    if (d->strs.n == 0) return GERBIL_OK;
    if (tk_ids_push(&d->win, id)) return err_set(GERBIL_ERR_NOMEM, "detokenizer: out of memory");
    if (is_byte_tok(d, id)) return GERBIL_OK; /* the run may go on */
    GB_TRY(decode_win(d, 0, &d->text));
    const char *s = d->text.p ? d->text.p : "";
    size_t n = d->text.n;
    if (n >= 3 && !memcmp(s + n - 3, "\xEF\xBF\xBD", 3)) return GERBIL_OK;
    size_t from = d->emitted <= n ? d->emitted : n;
    GB_TRY(set_piece(d, s + from, n - from, piece, len));
    /* new context: the shortest tail of the window that decodes to something */
    tk_buf tail = {0};
    size_t keep = d->win.n;
    for (size_t k = d->win.n; k-- > 0;) {
        gerbil_status st = decode_win(d, k, &tail);
        if (st) {
            tk_buf_free(&tail);
            return st;
        }
        if (tail.n) {
            keep = d->win.n - k;
            break;
        }
    }
    if (keep < d->win.n) {
        memmove(d->win.v, d->win.v + (d->win.n - keep), keep * sizeof *d->win.v);
        d->win.n = keep;
        d->emitted = tail.n;
    } else {
        d->emitted = n;
    }
    tk_buf_free(&tail);
    return GERBIL_OK;
}

gerbil_status gerbil_detok_prime(gerbil_detok_t d, const int32_t *ids, int n) {
    if (!d || (n > 0 && !ids) || n < 0) return err_set(GERBIL_ERR_INVALID_ARG, "gerbil_detok_prime: bad argument");
    /* the last ids are enough context: a decoder's first-token rules reach one token,
     * a byte-fallback run or an incomplete character a few more */
    int from = n > 64 ? n - 64 : 0;
    d->win.n = 0;
    for (int i = from; i < n; i++) {
        tk_strs_clear(&d->strs);
        GB_TRY(tk_ids_to_strs(d->t, &ids[i], 1, d->skip_special, &d->strs));
        if (d->strs.n == 0) continue;
        if (tk_ids_push(&d->win, ids[i])) return err_set(GERBIL_ERR_NOMEM, "detokenizer: out of memory");
    }
    /* what the context decodes to counts as already given out */
    GB_TRY(decode_win(d, 0, &d->text));
    d->emitted = d->text.n;
    return GERBIL_OK;
}

gerbil_status gerbil_detok_flush(gerbil_detok_t d, const char **piece, size_t *len) {
    if (!d || !piece || !len) return err_set(GERBIL_ERR_INVALID_ARG, "gerbil_detok_flush: NULL argument");
    *piece = "";
    *len = 0;
    if (!d->win.n) return GERBIL_OK;
    GB_TRY(decode_win(d, 0, &d->text));
    size_t n = d->text.n, from = d->emitted <= n ? d->emitted : n;
    GB_TRY(set_piece(d, d->text.p ? d->text.p + from : "", n - from, piece, len));
    d->win.n = 0;
    d->emitted = 0;
    return GERBIL_OK;
}
