/* Speculative decoding: draft, verify, accept, rewind (gerbil.h gerbil_spec_params).
 *
 * Each step has a pending token: sampled and emitted, not yet evaluated. A drafter
 * proposes d[0..k) to follow it; one forward of the target over [pending, d0 .. d(k-1)]
 * as verify rows (gerbil_batch.verify: each row computes what a single decode computes,
 * bit for bit) gives k + 1 rows of logits. Row j is sampled exactly as plain decoding
 * would sample it after d[0..j): greedy takes the sampler's own choice and keeps going
 * while it equals d[j]; sampled decoding accepts d[j] with probability min(1, p/q) and
 * otherwise draws from max(0, p - q) renormalised (Leviathan et al. 2023, Chen et al.
 * 2023; p and q through the same sampler chain), so the output has the target's
 * distribution. The first token that differs (or the one after the last draft) is the
 * next pending token; the rows after it are cut from the KV cache. A recurrent state
 * (Gated DeltaNet, LFM2 conv) cannot drop rows: it is checkpointed before the verify and,
 * when rows are dropped, restored and the kept rows replayed as verify rows (which again
 * compute what single decodes compute), so the state is bit for bit that of plain
 * decoding. Per-row states (no replay) would save that forward; see docs/ARCHITECTURE.md. */
#include "gen/spec.h"

#include "base/status.h"
#include "model/model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { SPEC_MAX_DRAFT = 32, NGRAM_MAX = 4, PROBE_MAX = 64 };

struct spec {
    gerbil_session_t s;
    struct gerbil_context *cx;
    int32_t seq;
    int V, base, recurrent, greedy;
    const gerbil_generate_params *p;
    gerbil_sampler_t sampler;
    int32_t *hist;
    int n_hist, n_prompt;
    /* verify batch */
    int32_t vtok[SPEC_MAX_DRAFT + 1], vseq[SPEC_MAX_DRAFT + 1];
    int8_t vflag[SPEC_MAX_DRAFT + 1], vnone[SPEC_MAX_DRAFT + 1];
    float *vlogits;   /* (draft_max + 1, V) */
    /* sampling: the chain's distribution (sparse) and the drafts' q (dense, draft model) */
    int32_t *ids;
    double *probs, *q, *resid;
    /* draft model */
    gerbil_session_t ds;
    int32_t *dhist; /* the tokens the draft session holds after base */
    int n_dhist;
    float *dlogits;
    /* adaptive length */
    int k_cur, k_min, k_max, plain_left, backoff;
};

static int is_eos(const struct model_config *c, int32_t id) {
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_ids[i] == id) return 1;
    return 0;
}

static gerbil_status logits_check(const float *logits, int n, int pos) {
    for (int i = 0; i < n; i++)
        if (!isfinite(logits[i]))
            return err_set(GERBIL_ERR_FORMAT, "the model produced %s at position %d (logit of token %d): "
                           "its weights or configuration are broken", isnan(logits[i]) ? "NaN" : "Inf", pos, i);
    return GERBIL_OK;
}

gerbil_status spec_check(gerbil_session_t s, const gerbil_generate_params *p) {
    const gerbil_spec_params *sp = &p->spec;
    if (sp->kind == GERBIL_SPEC_NONE) return GERBIL_OK;
    if (sp->kind == GERBIL_SPEC_DFLASH)
        return err_set(GERBIL_ERR_UNSUPPORTED, "speculative decoding with DFlash drafters is not yet implemented "
                       "(use ngram or draft)");
    if (sp->kind == GERBIL_SPEC_CUSTOM && !sp->draft_fn)
        return err_set(GERBIL_ERR_INVALID_ARG, "a custom drafter needs draft_fn");
    if (sp->kind != GERBIL_SPEC_NGRAM && sp->kind != GERBIL_SPEC_DRAFT && sp->kind != GERBIL_SPEC_CUSTOM)
        return err_set(GERBIL_ERR_INVALID_ARG, "unknown speculative decoding kind %d", (int)sp->kind);
    if (p->grammar)
        return err_set(GERBIL_ERR_UNSUPPORTED, "speculative decoding together with a grammar constraint is not supported");
    const int kmax = sp->draft_max <= 0 ? 5 : sp->draft_max;
    if (kmax > SPEC_MAX_DRAFT)
        return err_set(GERBIL_ERR_INVALID_ARG, "draft length %d exceeds the most supported, %d", kmax, SPEC_MAX_DRAFT);
    if (sp->draft_min < 0 || sp->draft_min > kmax)
        return err_set(GERBIL_ERR_INVALID_ARG, "draft minimum %d must be in [0, draft maximum %d]", sp->draft_min, kmax);
    if (kmax + 1 > s->ctx->n_batch)
        return err_set(GERBIL_ERR_INVALID_ARG, "draft length %d needs %d rows per forward; the context has %d", kmax,
                       kmax + 1, s->ctx->n_batch);
    if (sp->kind == GERBIL_SPEC_DRAFT) {
        if (!sp->draft) return err_set(GERBIL_ERR_INVALID_ARG, "speculative decoding with a draft model needs the draft session");
        const int vt = s->model->cfg.n_vocab, vd = sp->draft->model->cfg.n_vocab;
        if (vt != vd)
            return err_set(GERBIL_ERR_INVALID_ARG, "the draft model's vocabulary has %d tokens, the target's %d: "
                           "a draft model needs the target's tokenizer", vd, vt);
        if (gerbil_session_n_past(sp->draft) != gerbil_session_n_past(s))
            return err_set(GERBIL_ERR_INVALID_ARG, "the draft session holds %d tokens, the target session %d: "
                           "they must hold the same tokens", gerbil_session_n_past(sp->draft), gerbil_session_n_past(s));
    }
    return GERBIL_OK;
}

/* ---- drafters ---- */

/* Prompt lookup: the latest earlier occurrence of the last n tokens (n = 4 down to 1)
 * that is followed by at least one token; up to k of those tokens. */
static int draft_ngram(const int32_t *h, int n_h, int k, int32_t *out) {
    for (int n = n_h - 1 < NGRAM_MAX ? n_h - 1 : NGRAM_MAX; n >= 1; n--) {
        const int32_t *suf = h + n_h - n;
        for (int i = n_h - n - 1; i >= 0; i--) {
            if (memcmp(h + i, suf, (size_t)n * sizeof *h) != 0) continue;
            int m = n_h - (i + n);
            if (m > k) m = k;
            memcpy(out, h + i + n, (size_t)m * sizeof *h);
            return m;
        }
    }
    return 0;
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* The draft model: bring its session to hist (cut back to the common prefix, feed the
 * rest), then k tokens one at a time: greedy, or sampled through the sampler chain (their
 * distributions into sp->q). */
static gerbil_status draft_model(struct spec *sp, int k, int32_t *out, int *n_out) {
    *n_out = 0;
    int c = 0;
    while (c < sp->n_dhist && c < sp->n_hist && sp->dhist[c] == sp->hist[c]) c++;
    if (c < sp->n_dhist) {
        gerbil_session_truncate(sp->ds, sp->base + c);
        sp->n_dhist = gerbil_session_n_past(sp->ds) - sp->base;
        if (sp->n_dhist < 0) { /* it went back before this call's prompt: start over */
            return err_set(GERBIL_ERR_INVALID_ARG, "the draft session lost the tokens before the prompt");
        }
    }
    const int room = gerbil_session_n_ctx(sp->ds) - gerbil_session_n_past(sp->ds);
    if (room < sp->n_hist - sp->n_dhist + k) k = room - (sp->n_hist - sp->n_dhist);
    if (k <= 0) return GERBIL_OK;
    /* the prompt as the target read it (chunks at multiples of n_batch), what came after as
     * verify rows: the draft's rows compute what the target's did (a draft = the target
     * accepts everything) */
    for (int at = sp->n_dhist; at < sp->n_hist;) {
        if (at < sp->n_prompt) {
            GB_TRY(gerbil_session_eval(sp->ds, sp->hist + at, sp->n_prompt - at, sp->dlogits, 0));
            at = sp->n_prompt;
            continue;
        }
        int n = sp->n_hist - at;
        if (n > SPEC_MAX_DRAFT + 1) n = SPEC_MAX_DRAFT + 1;
        int32_t dseq[SPEC_MAX_DRAFT + 1];
        int8_t last[SPEC_MAX_DRAFT + 1] = {0};
        for (int i = 0; i < n; i++) dseq[i] = sp->ds->seq;
        last[n - 1] = 1;
        const gerbil_batch b = {.n_rows = n, .tokens = sp->hist + at, .seq = dseq, .logits = last, .verify = sp->vflag};
        GB_TRY(ctx_eval(sp->ds->ctx, &b, sp->dlogits));
        at += n;
    }
    memcpy(sp->dhist + sp->n_dhist, sp->hist + sp->n_dhist, (size_t)(sp->n_hist - sp->n_dhist) * sizeof(int32_t));
    sp->n_dhist = sp->n_hist;
    gerbil_seq_checkpoint(sp->ds->ctx, sp->ds->seq);
    for (int j = 0; j < k; j++) {
        int32_t t;
        if (sp->greedy) {
            t = argmax(sp->dlogits, sp->V);
        } else {
            /* the draft's history: hist then the drafts so far, which dhist holds */
            double *q = sp->q + (size_t)j * sp->V;
            const int m = sampler_dist(sp->sampler, sp->dlogits, sp->dhist, sp->n_dhist, sp->ids, sp->probs);
            memset(q, 0, (size_t)sp->V * sizeof *q);
            for (int i = 0; i < m; i++) q[sp->ids[i]] = sp->probs[i];
            const double u = sampler_uniform(sp->sampler);
            double acc = 0.0;
            t = sp->ids[m - 1];
            for (int i = 0; i < m; i++) {
                acc += sp->probs[i];
                if (acc > u) { t = sp->ids[i]; break; }
            }
        }
        out[j] = t;
        *n_out = j + 1;
        if (j + 1 == k) break;
        GB_TRY(gerbil_session_eval(sp->ds, &t, 1, sp->dlogits, 0));
        sp->dhist[sp->n_dhist++] = t;
    }
    return GERBIL_OK;
}

/* The draft length for this step. */
static int adaptive_k(struct spec *sp) {
    if (sp->k_cur > 0) return sp->k_cur;
    if (--sp->plain_left > 0) return 0;
    return 1; /* a probe */
}

static void adapt(struct spec *sp, int k, int accepted) {
    if (sp->k_min == sp->k_max || k == 0) return;
    if (accepted == k) {
        sp->k_cur = sp->k_cur + 1 > sp->k_max ? sp->k_max : sp->k_cur + 1;
        if (sp->k_cur < 1) sp->k_cur = 1;
        sp->backoff = 4;
    } else if (accepted == 0 && k <= 1) {
        if (sp->k_min == 0) { /* collapsed: plain steps, probing again after a growing pause */
            sp->k_cur = 0;
            sp->plain_left = sp->backoff;
            sp->backoff = sp->backoff * 2 > PROBE_MAX ? PROBE_MAX : sp->backoff * 2;
        } else {
            sp->k_cur = sp->k_min;
        }
    } else {
        int nk = accepted + 1;
        sp->k_cur = nk < sp->k_min ? sp->k_min : nk;
    }
}

/* ---- verify and rewind ---- */

/* Make the target hold exactly base + keep tokens, the first of them hist[0..keep):
 * cut the KV cache; a recurrent state goes back to its checkpoint and the rows from there
 * are replayed as verify rows. */
static gerbil_status rewind_to(struct spec *sp, int keep) {
    const int len = gerbil_seq_len(sp->cx, sp->seq), want = sp->base + keep;
    if (len <= want) return GERBIL_OK;
    gerbil_seq_truncate(sp->cx, sp->seq, want);
    for (int at = gerbil_seq_len(sp->cx, sp->seq); at < want;) {
        if (at < sp->base) return err_set(GERBIL_ERR_INVALID_ARG, "speculative rewind went back before the prompt");
        int n = want - at;
        if (n > SPEC_MAX_DRAFT + 1) n = SPEC_MAX_DRAFT + 1;
        const gerbil_batch b = {.n_rows = n, .tokens = sp->hist + (at - sp->base), .seq = sp->vseq,
                                .logits = sp->vnone, .verify = sp->vflag};
        GB_TRY(ctx_eval(sp->cx, &b, sp->vlogits));
        at += n;
    }
    return GERBIL_OK;
}

/* Emit a token: 1 when generation stops with it. */
static int emit(struct spec *sp, int32_t id, int32_t *out, gerbil_generate_result *res) {
    const gerbil_generate_params *p = sp->p;
    out[res->n_generated++] = id;
    sp->hist[sp->n_hist++] = id;
    if (p->on_token && p->on_token(p->user, id)) { res->stop = GERBIL_STOP_CALLBACK; return 1; }
    if (!p->ignore_eos && is_eos(&sp->s->model->cfg, id)) { res->stop = GERBIL_STOP_EOS; return 1; }
    return res->n_generated >= p->max_tokens;
}

/* Sample from row (sampled decoding): a draw from the chain's distribution. */
static int32_t draw(struct spec *sp, int m) {
    const double u = sampler_uniform(sp->sampler);
    double acc = 0.0;
    for (int i = 0; i < m; i++) {
        acc += sp->probs[i];
        if (acc > u) return sp->ids[i];
    }
    return sp->ids[m - 1];
}

/* Row j's token given draft d (d < 0: no draft, the bonus row); *accepted: it is d. */
static int32_t decide(struct spec *sp, float *row, int32_t d, const double *q, int *accepted) {
    *accepted = 0;
    if (sp->greedy) {
        const int32_t t = gerbil_sampler_sample(sp->sampler, row, sp->hist, sp->n_hist);
        *accepted = d >= 0 && t == d;
        return t;
    }
    const int m = sampler_dist(sp->sampler, row, sp->hist, sp->n_hist, sp->ids, sp->probs);
    if (d < 0) return draw(sp, m);
    double pd = 0.0;
    for (int i = 0; i < m; i++)
        if (sp->ids[i] == d) pd = sp->probs[i];
    const double qd = q ? q[d] : 1.0; /* n-gram drafts: q is one-hot */
    const double u = sampler_uniform(sp->sampler);
    if (qd > 0.0 && u * qd < pd) {
        *accepted = 1;
        return d;
    }
    /* rejected: from max(0, p - q), renormalised */
    double total = 0.0;
    for (int i = 0; i < m; i++) {
        const double qi = q ? q[sp->ids[i]] : (sp->ids[i] == d ? 1.0 : 0.0);
        sp->resid[i] = sp->probs[i] > qi ? sp->probs[i] - qi : 0.0;
        total += sp->resid[i];
    }
    if (total <= 0.0) return draw(sp, m); /* p == q: cannot happen after a rejection but for rounding */
    for (int i = 0; i < m; i++) sp->probs[i] = sp->resid[i] / total;
    return draw(sp, m);
}

gerbil_status spec_generate(gerbil_session_t s, gerbil_sampler_t sampler, const gerbil_generate_params *p,
                            float *logits, int32_t *hist, int n_hist, int32_t *out, gerbil_generate_result *res) {
    const gerbil_spec_params *gp = &p->spec;
    struct spec sp = {.s = s, .cx = s->ctx, .seq = s->seq, .V = s->model->cfg.n_vocab, .p = p, .sampler = sampler,
                      .hist = hist, .n_hist = n_hist, .n_prompt = n_hist, .greedy = sampler_greedy(sampler)};
    sp.base = gerbil_seq_len(sp.cx, sp.seq) - n_hist;
    sp.recurrent = gerbil_context_has_recurrent(sp.cx);
    sp.k_max = gp->draft_max <= 0 ? 5 : gp->draft_max;
    sp.k_min = gp->draft_min;
    sp.k_cur = sp.k_max;
    sp.backoff = 4;
    for (int i = 0; i <= SPEC_MAX_DRAFT; i++) {
        sp.vseq[i] = sp.seq;
        sp.vflag[i] = 1;
        sp.vnone[i] = 0;
    }
    const size_t V = (size_t)sp.V;
    sp.vlogits = malloc((size_t)(sp.k_max + 1) * V * sizeof(float));
    int ok = sp.vlogits != NULL;
    if (!sp.greedy) {
        sp.ids = malloc(V * sizeof *sp.ids);
        sp.probs = malloc(V * sizeof *sp.probs);
        sp.resid = malloc(V * sizeof *sp.resid);
        ok &= sp.ids && sp.probs && sp.resid;
    }
    if (gp->kind == GERBIL_SPEC_DRAFT) {
        sp.ds = gp->draft;
        sp.dhist = malloc(((size_t)n_hist + (size_t)p->max_tokens + SPEC_MAX_DRAFT + 1) * sizeof *sp.dhist);
        sp.dlogits = malloc(V * sizeof(float));
        if (!sp.greedy) sp.q = malloc((size_t)sp.k_max * V * sizeof *sp.q);
        ok &= sp.dhist && sp.dlogits && (sp.greedy || sp.q);
    }
    gerbil_status st = ok ? GERBIL_OK : err_set(GERBIL_ERR_NOMEM, "out of memory for speculative decoding");
    const int n_ctx = gerbil_session_n_ctx(s);
    int32_t d[SPEC_MAX_DRAFT];
    int accepted, stop = p->max_tokens == 0;
    /* the first token, from the prompt's logits */
    if (st == GERBIL_OK && !stop && (st = logits_check(logits, sp.V, gerbil_session_n_past(s) - 1)) == GERBIL_OK)
        stop = emit(&sp, decide(&sp, logits, -1, NULL, &accepted), out, res);
    while (st == GERBIL_OK && !stop) {
        const int len = gerbil_seq_len(sp.cx, sp.seq);
        if (len >= n_ctx) { res->stop = GERBIL_STOP_CONTEXT; break; }
        /* drafts: at most the tokens still wanted after the pending one, and the room */
        int k = adaptive_k(&sp);
        if (k > p->max_tokens - res->n_generated - 1) k = p->max_tokens - res->n_generated - 1;
        if (k > n_ctx - len - 1) k = n_ctx - len - 1;
        int nd = 0;
        if (k > 0) {
            if (gp->kind == GERBIL_SPEC_NGRAM) nd = draft_ngram(sp.hist, sp.n_hist, k, d);
            else if (gp->kind == GERBIL_SPEC_CUSTOM) {
                nd = gp->draft_fn(gp->draft_user, sp.hist, sp.n_hist, k, d);
                if (nd < 0 || nd > k) { st = err_set(GERBIL_ERR_INVALID_ARG, "the drafter returned %d tokens (0..%d)", nd, k); break; }
                for (int i = 0; i < nd; i++)
                    if (d[i] < 0 || d[i] >= sp.V) { st = err_set(GERBIL_ERR_INVALID_ARG, "the drafter proposed token %d outside the vocabulary", (int)d[i]); break; }
                if (st != GERBIL_OK) break;
            }
            else if ((st = draft_model(&sp, k, d, &nd)) != GERBIL_OK) break;
        }
        const int32_t pending = sp.hist[sp.n_hist - 1];
        if (nd == 0) { /* a plain decode step */
            if ((st = gerbil_session_eval(s, &pending, 1, logits, 0)) != GERBIL_OK) break;
            if ((st = logits_check(logits, sp.V, len)) != GERBIL_OK) break;
            stop = emit(&sp, decide(&sp, logits, -1, NULL, &accepted), out, res);
            continue;
        }
        if (sp.recurrent) gerbil_seq_checkpoint(sp.cx, sp.seq);
        sp.vtok[0] = pending;
        memcpy(sp.vtok + 1, d, (size_t)nd * sizeof *d);
        const gerbil_batch b = {.n_rows = nd + 1, .tokens = sp.vtok, .seq = sp.vseq, .logits = sp.vflag,
                                .verify = sp.vflag};
        if ((st = ctx_eval(sp.cx, &b, sp.vlogits)) != GERBIL_OK) break;
        res->n_verify++;
        res->n_drafted += nd;
        int j = 0, n_acc = 0;
        for (; j <= nd; j++) {
            float *row = sp.vlogits + (size_t)j * V;
            if ((st = logits_check(row, sp.V, len + j)) != GERBIL_OK) break;
            const int32_t t = decide(&sp, row, j < nd ? d[j] : -1, sp.q ? sp.q + (size_t)j * V : NULL, &accepted);
            n_acc += accepted;
            stop = emit(&sp, t, out, res);
            if (stop || !accepted) break;
        }
        res->n_accepted += n_acc;
        if (st != GERBIL_OK) break;
        adapt(&sp, nd, n_acc);
        /* rows kept: pending and the accepted drafts (all of them when the bonus row was reached) */
        if (!stop && (st = rewind_to(&sp, sp.n_hist - 1)) != GERBIL_OK) break;
    }
    /* as plain decoding leaves it: every token but the last generated one evaluated; the
     * draft holding a prefix of that */
    if (st == GERBIL_OK && res->n_generated > 0) st = rewind_to(&sp, sp.n_hist - 1);
    if (st == GERBIL_OK && sp.ds) {
        int c = 0;
        while (c < sp.n_dhist && c < sp.n_hist - 1 && sp.dhist[c] == sp.hist[c]) c++;
        gerbil_session_truncate(sp.ds, sp.base + c);
    }
    free(sp.vlogits);
    free(sp.ids);
    free(sp.probs);
    free(sp.resid);
    free(sp.dhist);
    free(sp.dlogits);
    free(sp.q);
    return st;
}
