/* The generation loop: one batched prefill, then one token per forward. */
#include "base/status.h"
#include "base/timer.h"
#include "gerbil.h"
#include "gen/spec.h"
#include "model/model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

gerbil_generate_params gerbil_generate_default_params(void) {
    return (gerbil_generate_params){.max_tokens = 512};
}

static int is_eos(const struct model_config *c, int32_t id) {
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_ids[i] == id) return 1;
    return 0;
}

/* Logits a model computed for position pos: a NaN or an infinity means broken weights or an
 * overflow inside the model, which no sampler should pick a token from. */
static gerbil_status logits_check(const float *logits, int n, int pos) {
    for (int i = 0; i < n; i++)
        if (!isfinite(logits[i]))
            return err_set(GERBIL_ERR_FORMAT, "the model produced %s at position %d (logit of token %d): "
                           "its weights or configuration are broken", isnan(logits[i]) ? "NaN" : "Inf", pos, i);
    return GERBIL_OK;
}

/* The loop under a grammar constraint: mask -> sample (or take the only allowed token)
 * -> accept; tokens forced after it are appended without sampling and evaluated together
 * with it in one forward. */
static gerbil_status generate_constrained(gerbil_session_t s, gerbil_sampler_t sampler, const gerbil_generate_params *p,
                                          float *logits, int32_t *hist, int n_hist, int32_t *out,
                                          gerbil_generate_result *res) {
    const struct model_config *c = &s->model->cfg;
    const int n_ctx = gerbil_session_n_ctx(s), n_vocab = c->n_vocab;
    gerbil_grammar_state_t gs = p->grammar;
    int words = (n_vocab + 63) / 64;
    uint64_t *mask = malloc((size_t)words * sizeof *mask);
    int32_t *pending = malloc(((size_t)p->max_tokens + 1) * sizeof *pending);
    if (!mask || !pending) { free(mask); free(pending); return err_set(GERBIL_ERR_NOMEM, "out of memory"); }
    gerbil_status st = GERBIL_OK;
    int done = 0;
    while (!done && res->n_generated < p->max_tokens) {
        int n_pending = 0;
        /* one sampled (or forced) token, then the forced ones after it */
        for (int first = 1; res->n_generated < p->max_tokens; first = 0) {
            if (first && (st = logits_check(logits, n_vocab, gerbil_session_n_past(s) - 1)) != GERBIL_OK) { done = 1; break; }
            if ((st = gerbil_grammar_mask(gs, mask)) != GERBIL_OK) { done = 1; break; }
            int32_t only = -1;
            int n_allowed = 0;
            for (int w = 0; w < words && n_allowed < 2; w++)
                if (mask[w]) {
                    n_allowed += (mask[w] & (mask[w] - 1)) ? 2 : 1;
                    only = w * 64 + __builtin_ctzll(mask[w]);
                }
            if (n_allowed == 0) { res->stop = GERBIL_STOP_GRAMMAR; done = 1; break; }
            int32_t id;
            if (n_allowed == 1) id = only;
            else if (!first) break; /* needs the logits of what is pending */
            else {
                gerbil_sampler_apply_mask(logits, n_vocab, mask);
                id = gerbil_sampler_sample(sampler, logits, hist, n_hist);
            }
            if ((st = gerbil_grammar_accept_token(gs, id)) != GERBIL_OK) { done = 1; break; }
            out[res->n_generated++] = id;
            hist[n_hist++] = id;
            if (p->on_token && p->on_token(p->user, id)) { res->stop = GERBIL_STOP_CALLBACK; done = 1; break; }
            if (is_eos(c, id)) { res->stop = GERBIL_STOP_EOS; done = 1; break; }
            pending[n_pending++] = id;
        }
        if (done || res->n_generated >= p->max_tokens || !n_pending) break;
        if (gerbil_session_n_past(s) + n_pending > n_ctx) { res->stop = GERBIL_STOP_CONTEXT; break; }
        if ((st = gerbil_session_eval(s, pending, n_pending, logits, 0)) != GERBIL_OK) break;
    }
    free(mask);
    free(pending);
    return st;
}

gerbil_status gerbil_generate(gerbil_session_t s, gerbil_sampler_t sampler, const int32_t *prompt,
                              int n_prompt, const gerbil_generate_params *p, int32_t *out,
                              gerbil_generate_result *res) {
    const struct model_config *c = &s->model->cfg;
    memset(res, 0, sizeof *res);
    res->n_prompt = n_prompt;
    if (n_prompt <= 0) return err_set(GERBIL_ERR_INVALID_ARG, "empty prompt");
    if (p->max_tokens < 0) return err_set(GERBIL_ERR_INVALID_ARG, "max tokens must be >= 0");
    const int n_ctx = gerbil_session_n_ctx(s), n_past = gerbil_session_n_past(s);
    if (n_past + n_prompt > n_ctx)
        return err_set(GERBIL_ERR_CONTEXT, "prompt of %d tokens does not fit the context of %d tokens "
                       "(%d already used); use a larger --ctx-size or a shorter prompt",
                       n_prompt, n_ctx, n_past);

    GB_TRY(spec_check(s, p));

    const int n_vocab = c->n_vocab;
    float *logits = malloc((size_t)n_vocab * sizeof(float));
    int32_t *hist = malloc(((size_t)n_prompt + (size_t)p->max_tokens) * sizeof(int32_t));
    if (!logits || !hist) {
        free(logits); free(hist);
        return err_set(GERBIL_ERR_NOMEM, "out of memory");
    }
    memcpy(hist, prompt, (size_t)n_prompt * sizeof(int32_t));
    int n_hist = n_prompt;

    double t0 = time_now_s();
    gerbil_status st = session_eval_progress(s, prompt, n_prompt, logits, 0, p->on_prompt_progress, p->user);
    res->prompt_s = time_now_s() - t0;
    res->stop = GERBIL_STOP_MAX_TOKENS;

    t0 = time_now_s();
    if (p->grammar) {
        st = st == GERBIL_OK ? generate_constrained(s, sampler, p, logits, hist, n_hist, out, res) : st;
        res->gen_s = time_now_s() - t0;
        free(logits);
        free(hist);
        return st;
    }
    if (p->spec.kind != GERBIL_SPEC_NONE) {
        st = st == GERBIL_OK ? spec_generate(s, sampler, p, logits, hist, n_hist, out, res) : st;
        res->gen_s = time_now_s() - t0;
        free(logits);
        free(hist);
        return st;
    }
    for (int i = 0; st == GERBIL_OK && i < p->max_tokens; i++) {
        if ((st = logits_check(logits, n_vocab, gerbil_session_n_past(s) - 1)) != GERBIL_OK) break;
        int32_t id = gerbil_sampler_sample(sampler, logits, hist, n_hist);
        out[res->n_generated++] = id;
        hist[n_hist++] = id;
        if (p->on_token && p->on_token(p->user, id)) { res->stop = GERBIL_STOP_CALLBACK; break; }
        if (!p->ignore_eos && is_eos(c, id)) { res->stop = GERBIL_STOP_EOS; break; }
        if (i + 1 == p->max_tokens) break;
        if (gerbil_session_n_past(s) >= n_ctx) { res->stop = GERBIL_STOP_CONTEXT; break; }
        st = gerbil_session_eval(s, &id, 1, logits, 0);
    }
    res->gen_s = time_now_s() - t0;
    free(logits);
    free(hist);
    return st;
}
