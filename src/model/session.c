/* Sessions: one sequence in a context of its own, the single-stream API that run, chat,
 * logits, bench and the tests use (gerbil.h). A prompt goes through in chunks ending at
 * multiples of the context's n_batch positions, so its chunking depends on positions
 * only. */
#include "model/model.h"
#include "base/status.h"

#include <stdlib.h>
#include <string.h>

gerbil_session_params gerbil_session_default_params(void) {
    return (gerbil_session_params){.n_ctx = 0, .kv_type = GERBIL_KV_F16};
}

gerbil_status gerbil_session_new(gerbil_model_t m, const gerbil_session_params *params, gerbil_session_t *out) {
    *out = NULL;
    gerbil_session_params p = params ? *params : gerbil_session_default_params();
    gerbil_context_params cp = gerbil_context_default_params();
    cp.n_ctx = p.n_ctx;
    cp.kv_type = p.kv_type;
    struct gerbil_session *s = calloc(1, sizeof *s);
    if (!s) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    s->model = m;
    gerbil_status st = gerbil_context_new(m, &cp, &s->ctx);
    if (st == GERBIL_OK) st = gerbil_seq_new(s->ctx, &s->seq);
    if (st == GERBIL_OK) {
        const size_t B = (size_t)s->ctx->n_batch;
        s->seq_ids = malloc(B * sizeof *s->seq_ids);
        s->flags = calloc(B, sizeof *s->flags);
        if (!s->seq_ids || !s->flags) st = err_set(GERBIL_ERR_NOMEM, "out of memory");
        for (size_t i = 0; s->seq_ids && i < B; i++) s->seq_ids[i] = s->seq;
    }
    if (st != GERBIL_OK) {
        gerbil_session_free(s);
        return st;
    }
    *out = s;
    return GERBIL_OK;
}

void gerbil_session_free(gerbil_session_t s) {
    if (!s) return;
    gerbil_context_free(s->ctx);
    free(s->seq_ids);
    free(s->flags);
    free(s->adapters);
    free(s);
}

gerbil_status gerbil_session_set_adapter(gerbil_session_t s, int32_t id) {
    pthread_mutex_lock(&s->model->lock);
    gerbil_status st = lora_check_id(s->model, 0, id);
    pthread_mutex_unlock(&s->model->lock);
    GB_TRY(st);
    if (!s->adapters && !(s->adapters = malloc((size_t)s->ctx->n_batch * sizeof *s->adapters)))
        return err_set(GERBIL_ERR_NOMEM, "out of memory");
    for (int i = 0; i < s->ctx->n_batch; i++) s->adapters[i] = id;
    return GERBIL_OK;
}

void gerbil_session_reset(gerbil_session_t s) { ctx_seq_reset(s->ctx, s->seq); }

void gerbil_session_truncate(gerbil_session_t s, int n) { gerbil_seq_truncate(s->ctx, s->seq, n); }

gerbil_status gerbil_session_copy(gerbil_session_t dst, gerbil_session_t src) {
    return ctx_seq_copy(dst->ctx, dst->seq, src->ctx, src->seq);
}

int gerbil_session_n_past(gerbil_session_t s) { return gerbil_seq_len(s->ctx, s->seq); }
int gerbil_session_n_ctx(gerbil_session_t s) { return s->ctx->n_ctx; }

gerbil_status gerbil_session_eval(gerbil_session_t s, const int32_t *ids, int n, float *logits, int all_logits) {
    return session_eval_progress(s, ids, n, logits, all_logits, NULL, NULL);
}

gerbil_status session_eval_progress(gerbil_session_t s, const int32_t *ids, int n, float *logits, int all_logits,
                                    void (*progress)(void *user, int done, int total), void *user) {
    const struct model_config *c = &s->model->cfg;
    struct gerbil_context *cx = s->ctx;
    if (n <= 0) return err_set(GERBIL_ERR_INVALID_ARG, "no tokens to evaluate");
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->n_vocab)
            return err_set(GERBIL_ERR_INVALID_ARG, "token id %d at position %d is outside the vocabulary [0, %d)",
                           (int)ids[i], i, c->n_vocab);
    const int n_past = gerbil_seq_len(cx, s->seq);
    if (n_past + n > cx->n_ctx)
        return err_set(GERBIL_ERR_CONTEXT, "%d tokens after %d already in context exceed the context size %d",
                       n, n_past, cx->n_ctx);
    const int nb = cx->n_batch;
    if (progress) progress(user, 0, n);
    for (int done = 0; done < n;) {
        const int pos = n_past + done, end = (pos / nb + 1) * nb; /* chunks end at multiples of n_batch */
        const int chunk = n - done < end - pos ? n - done : end - pos;
        const int last = done + chunk == n;
        memset(s->flags, all_logits && logits ? 1 : 0, (size_t)chunk);
        if (logits && !all_logits && last) s->flags[chunk - 1] = 1;
        float *dest = logits && all_logits ? logits + (size_t)done * c->n_vocab : logits;
        const gerbil_batch b = {.n_rows = chunk, .tokens = ids + done, .seq = s->seq_ids, .logits = s->flags,
                               .adapter = s->adapters};
        GB_TRY(ctx_eval(cx, &b, dest));
        done += chunk;
        if (progress) progress(user, done, n);
    }
    if (n > 1) gerbil_seq_checkpoint(cx, s->seq); /* the state after a prompt: where a follow-up can rewind to */
    return GERBIL_OK;
}
