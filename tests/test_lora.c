/* LoRA adapters (src/model/lora.c, backend.h lora):
 *  - the op: the CPU backend against the reference on random odd sizes, segments of mixed
 *    ranks (overlapping ones adding up, rows of no segment untouched), and a row's result
 *    the same, bit for bit, whether it is computed alone or among others;
 *  - golden: transformers + peft logits (scripts/gen_lora_fixtures.py) at every prompt
 *    position within 1e-3 for tiny Qwen3 and Qwen3.5 (Gated DeltaNet) f32 bases, two
 *    adapters of different ranks (rank 8 on every linear; rank 4 rsLoRA on some modules of
 *    layers 0-1), both summed, and the bare base; on the cpu and ref backends; the same
 *    adapters in mlx-lm's and llama.cpp's GGUF layouts; an MLX 4-bit base (reference: peft
 *    on the dequantized weights): 1e-3 on ref, 2e-2 of the logit scale on cpu;
 *  - one batch mixing adapter a, adapter b and the base (prefill rows, then decode rows):
 *    every row equal, bit for bit, to its sequence run alone. */
#include "backend/backend.h"
#include "gerbil.h"
#include "io/safetensors.h"
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the op ---- */

static void test_op(void) {
    struct backend *cpu = NULL, *ref = NULL;
    CHECK(backend_new("cpu", 3, &cpu) == GERBIL_OK);
    CHECK(backend_new("ref", 1, &ref) == GERBIL_OK);
    if (!cpu || !ref) return;
    unsigned long long seed = 0x10a7a5eedULL;
    /* the last two are big enough for the thread pool: rows split (11 rows), outputs split (1 row) */
    const int shapes[][3] = {{37, 53, 1}, {64, 17, 1}, {129, 131, 1}, {8, 8, 1}, {1, 300, 1}, {1024, 1537, 16},
                             {1031, 1536, 64}};
    for (size_t sh = 0; sh < sizeof shapes / sizeof *shapes; sh++) {
        const int n_in = shapes[sh][0], n_out = shapes[sh][1], rows = 11, mul = shapes[sh][2];
        const int ranks[4] = {3 * mul, 7 * mul, 5 * mul, 1 * mul};
        float *a[4], *b[4];
        for (int k = 0; k < 4; k++) {
            a[k] = malloc(sizeof(float) * (size_t)ranks[k] * n_in);
            b[k] = malloc(sizeof(float) * (size_t)ranks[k] * n_out);
            for (int i = 0; i < ranks[k] * n_in; i++) a[k][i] = test_rand_f(&seed);
            for (int i = 0; i < ranks[k] * n_out; i++) b[k][i] = test_rand_f(&seed) * 0.3f;
        }
        /* rows 0-2 rank 3, 3-5 rank 7, 1-4 rank 5 on top, row 10 rank 1; 6-9 none */
        const struct lora_seg segs[4] = {
            {.row0 = 0, .n_rows = 3, .rank = ranks[0], .scale = 2.0f, .a = a[0], .bt = b[0]},
            {.row0 = 3, .n_rows = 3, .rank = ranks[1], .scale = 0.5f, .a = a[1], .bt = b[1]},
            {.row0 = 1, .n_rows = 4, .rank = ranks[2], .scale = -1.25f, .a = a[2], .bt = b[2]},
            {.row0 = 10, .n_rows = 1, .rank = ranks[3], .scale = 1.0f, .a = a[3], .bt = b[3]},
        };
        float *x = malloc(sizeof(float) * (size_t)rows * n_in);
        float *y0 = malloc(sizeof(float) * (size_t)rows * n_out), *yc = malloc(sizeof(float) * (size_t)rows * n_out),
              *yr = malloc(sizeof(float) * (size_t)rows * n_out), *y1 = malloc(sizeof(float) * (size_t)n_out);
        for (int i = 0; i < rows * n_in; i++) x[i] = test_rand_f(&seed);
        for (int i = 0; i < rows * n_out; i++) y0[i] = test_rand_f(&seed);
        memcpy(yc, y0, sizeof(float) * (size_t)rows * n_out);
        memcpy(yr, y0, sizeof(float) * (size_t)rows * n_out);
        cpu->ops->lora(cpu, yc, x, n_in, n_out, segs, 4);
        ref->ops->lora(ref, yr, x, n_in, n_out, segs, 4);
        double worst = 0;
        for (int i = 0; i < rows * n_out; i++) {
            double d = fabs((double)yc[i] - yr[i]) / (1.0 + fabs((double)yr[i]));
            if (!(d <= worst)) worst = d;
        }
        const double tol = 1e-6 + 3e-7 * sqrt((double)n_in * ranks[1]); /* f32 sums of n_in, then rank, terms */
        CHECKF(worst < tol, "shape %d x %d: cpu vs ref %.3g (limit %.3g)", n_in, n_out, worst, tol);
        CHECK(!memcmp(yc + 6 * n_out, y0 + 6 * n_out, sizeof(float) * 4 * (size_t)n_out)); /* rows 6-9 */
        int moved = 0;
        for (int i = 0; i < n_out; i++) moved += yc[i] != y0[i];
        CHECK(moved > 0);
        /* row 2 alone (its segments 0 and 2 over just it) gives the same bits as in the call */
        for (int t = 0; t < rows; t++) {
            struct lora_seg one[4];
            int n1 = 0;
            for (int s = 0; s < 4; s++)
                if (t >= segs[s].row0 && t < segs[s].row0 + segs[s].n_rows) {
                    one[n1] = segs[s];
                    one[n1].row0 = 0;
                    one[n1++].n_rows = 1;
                }
            memcpy(y1, y0 + (size_t)t * n_out, sizeof(float) * (size_t)n_out);
            cpu->ops->lora(cpu, y1, x + (size_t)t * n_in, n_in, n_out, one, n1);
            CHECKF(!memcmp(y1, yc + (size_t)t * n_out, sizeof(float) * (size_t)n_out), "shape %d x %d row %d", n_in,
                   n_out, t);
        }
        for (int k = 0; k < 4; k++) {
            free(a[k]);
            free(b[k]);
        }
        free(x); free(y0); free(yc); free(yr); free(y1);
    }
    backend_free(cpu);
    backend_free(ref);
}

/* ---- golden ---- */

struct expected {
    struct st_file f;
    const int32_t *ids;
    int n, V;
};

static const float *exp_logits(const struct expected *e, const char *name) {
    const struct gb_tensor *t = st_file_find(&e->f, name);
    if (!t || t->type != GB_TYPE_F32 || t->n_dims != 2 || t->ne[0] != e->n || t->ne[1] != e->V) return NULL;
    return t->data;
}

static int load_expected(const char *dir, struct expected *e) {
    char path[512];
    snprintf(path, sizeof path, "%s/expected.safetensors", dir);
    if (st_file_open(path, &e->f) != GERBIL_OK) return -1;
    const struct gb_tensor *ids = st_file_find(&e->f, "input_ids"), *lg = st_file_find(&e->f, "logits_base");
    if (!ids || !lg || ids->type != GB_TYPE_I32 || lg->n_dims != 2) {
        st_file_close(&e->f);
        return -1;
    }
    e->ids = ids->data;
    e->n = (int)ids->ne[0];
    e->V = (int)lg->ne[1];
    return 0;
}

static gerbil_model_t load_model(const char *dir, const char *backend, int threads) {
    gerbil_model_params mp = gerbil_model_default_params();
    mp.n_threads = threads;
    mp.backend = backend;
    gerbil_model_t m = NULL;
    if (gerbil_model_load(dir, &mp, &m) != GERBIL_OK) {
        fprintf(stderr, "%s: %s\n", dir, gerbil_last_error());
        return NULL;
    }
    return m;
}

/* All-position logits of the prompt under adapter id (one eval). */
static int prompt_logits(gerbil_model_t m, int32_t id, const struct expected *e, float *out) {
    gerbil_session_params sp = gerbil_session_default_params();
    sp.n_ctx = 64;
    sp.kv_type = GERBIL_KV_F32;
    gerbil_session_t s;
    if (gerbil_session_new(m, &sp, &s) != GERBIL_OK) return -1;
    gerbil_status st = gerbil_session_set_adapter(s, id);
    if (st == GERBIL_OK) st = gerbil_session_eval(s, e->ids, e->n, out, 1);
    if (st != GERBIL_OK) fprintf(stderr, "eval: %s\n", gerbil_last_error());
    gerbil_session_free(s);
    return st == GERBIL_OK ? 0 : -1;
}

static double max_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= m)) m = d;
    }
    return m;
}

static double abs_max(const float *a, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fabs(a[i]) > m ? fabs(a[i]) : m;
    return m;
}

/* base (a model fixture), fx (lora fixture), adapters in layouts: the PEFT folders a, b, and
 * when present a-mlx (mlx-lm) and a.gguf (llama.cpp). tol < 0: -tol of the logit scale. */
static void golden(const char *base, const char *fx, const char *backend, int threads, double tol) {
    char bdir[256], dir[256], pa[300], pb[300];
    snprintf(bdir, sizeof bdir, "tests/fixtures/%s", base);
    snprintf(dir, sizeof dir, "tests/fixtures/%s", fx);
    struct expected e;
    if (load_expected(dir, &e)) {
        CHECKF(0, "%s: no expected.safetensors", dir);
        return;
    }
    gerbil_model_t m = load_model(bdir, backend, threads);
    CHECK(m != NULL);
    if (!m) return;
    const char *lfx = strstr(fx, "mlx4") ? "tests/fixtures/lora-qwen3" : dir; /* the mlx4 base uses qwen3's */
    snprintf(pa, sizeof pa, "%s/a", lfx);
    snprintf(pb, sizeof pb, "%s/b", lfx);
    int32_t ia = -1, ib = -1, iab = -1;
    CHECKF(gerbil_adapter_load(m, pa, 1.0f, &ia) == GERBIL_OK, "%s: %s", pa, gerbil_last_error());
    CHECKF(gerbil_adapter_load(m, pb, 1.0f, &ib) == GERBIL_OK, "%s: %s", pb, gerbil_last_error());
    const int32_t both[2] = {ia, ib};
    CHECK(gerbil_adapter_stack(m, both, 2, &iab) == GERBIL_OK);
    const size_t n = (size_t)e.n * e.V;
    float *got = malloc(n * sizeof *got);
    const struct { const char *name; int32_t id; } cases[] = {
        {"logits_base", 0}, {"logits_a", ia}, {"logits_b", ib}, {"logits_ab", iab}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const float *want = exp_logits(&e, cases[c].name);
        if (!want) continue; /* logits_ab is not in every fixture */
        if (cases[c].id < 0 || prompt_logits(m, cases[c].id, &e, got)) {
            CHECKF(0, "%s %s %s: eval failed", fx, backend, cases[c].name);
            continue;
        }
        const double d = max_diff(got, want, n), lim = tol > 0 ? tol : -tol * abs_max(want, n);
        printf("%-16s %-4s %-12s max |diff| %.3g (limit %.3g)\n", fx, backend, cases[c].name, d, lim);
        CHECKF(d <= lim, "%s %s %s: %.3g > %.3g", fx, backend, cases[c].name, d, lim);
    }
    /* the same adapter a in the mlx-lm and GGUF layouts */
    const char *alts[] = {"a-mlx", "a.gguf"};
    for (int k = 0; k < 2; k++) {
        char p[320], probe[360];
        snprintf(p, sizeof p, "%s/%s", lfx, alts[k]);
        snprintf(probe, sizeof probe, "%s%s", p, k ? "" : "/adapter_config.json");
        FILE *fp = fopen(probe, "r");
        if (!fp) continue;
        fclose(fp);
        int32_t id = -1;
        gerbil_status st = gerbil_adapter_load(m, p, 1.0f, &id);
        CHECKF(st == GERBIL_OK, "%s: %s", p, gerbil_last_error());
        if (st != GERBIL_OK || prompt_logits(m, id, &e, got)) continue;
        const float *want = exp_logits(&e, "logits_a");
        const double d = max_diff(got, want, n), lim = tol > 0 ? tol : -tol * abs_max(want, n);
        printf("%-16s %-4s %-12s max |diff| %.3g (limit %.3g)\n", fx, backend, alts[k], d, lim);
        CHECKF(d <= lim, "%s %s %s: %.3g > %.3g", fx, backend, alts[k], d, lim);
        CHECK(gerbil_adapter_free(m, id) == GERBIL_OK);
    }
    /* a scale of 0 is the base, exactly */
    int32_t iz = -1;
    if (gerbil_adapter_load(m, pa, 0.0f, &iz) == GERBIL_OK) {
        float *b0 = malloc(n * sizeof *b0);
        CHECK(prompt_logits(m, 0, &e, b0) == 0 && prompt_logits(m, iz, &e, got) == 0);
        CHECK(!memcmp(b0, got, n * sizeof *got));
        free(b0);
    }
    /* an unloaded id is refused */
    CHECK(gerbil_adapter_free(m, ia) == GERBIL_OK);
    CHECK(gerbil_adapter_free(m, ia) == GERBIL_ERR_INVALID_ARG);
    CHECK(prompt_logits(m, ia, &e, got) != 0);
    /* the stack keeps a's matrices alive */
    const float *want = exp_logits(&e, "logits_ab");
    if (want && prompt_logits(m, iab, &e, got) == 0) CHECK(max_diff(got, want, n) <= (tol > 0 ? tol : -tol * abs_max(want, n)));
    free(got);
    gerbil_model_free(m);
    st_file_close(&e.f);
}

/* ---- one batch mixing a, b and the base ---- */

static void mixed_batch(const char *base, const char *fx) {
    char bdir[256], pa[300], pb[300];
    snprintf(bdir, sizeof bdir, "tests/fixtures/%s", base);
    snprintf(pa, sizeof pa, "tests/fixtures/%s/a", fx);
    snprintf(pb, sizeof pb, "tests/fixtures/%s/b", fx);
    gerbil_model_t m = load_model(bdir, "cpu", 2);
    if (!m) {
        CHECK(0);
        return;
    }
    int32_t ia, ib;
    CHECK(gerbil_adapter_load(m, pa, 1.0f, &ia) == GERBIL_OK);
    CHECK(gerbil_adapter_load(m, pb, 0.7f, &ib) == GERBIL_OK);
    const int V = gerbil_model_n_vocab(m), P = 13, S = 3, STEPS = 4;
    const int32_t ad[3] = {ia, ib, 0};
    int32_t prompt[3][13];
    for (int s = 0; s < S; s++)
        for (int i = 0; i < P; i++) prompt[s][i] = 3 + (s * 31 + i * 17) % (V - 3);
    /* solo: each sequence alone, its prompt in one eval, then STEPS decode evals */
    float *solo = malloc(sizeof(float) * (size_t)S * (P + STEPS) * V);
    gerbil_context_params cp = gerbil_context_default_params();
    cp.n_ctx = 128;
    cp.n_seq_max = 3;
    cp.n_batch = 64;
    cp.kv_type = GERBIL_KV_F32;
    for (int s = 0; s < S; s++) {
        gerbil_context_t c;
        int32_t sq;
        CHECK(gerbil_context_new(m, &cp, &c) == GERBIL_OK);
        CHECK(gerbil_seq_new(c, &sq) == GERBIL_OK);
        int32_t seqv[13], adv[13];
        int8_t fl[13];
        for (int i = 0; i < P; i++) seqv[i] = sq, adv[i] = ad[s], fl[i] = 1;
        gerbil_batch b = {.n_rows = P, .tokens = prompt[s], .seq = seqv, .logits = fl, .adapter = adv};
        CHECK(gerbil_context_eval(c, &b) == GERBIL_OK);
        for (int i = 0; i < P; i++) memcpy(solo + ((size_t)s * (P + STEPS) + i) * V, gerbil_context_logits(c, i), sizeof(float) * V);
        for (int k = 0; k < STEPS; k++) {
            int32_t tok = 3 + (s * 7 + k * 5) % (V - 3);
            gerbil_batch d = {.n_rows = 1, .tokens = &tok, .seq = &sq, .adapter = &ad[s]};
            CHECK(gerbil_context_eval(c, &d) == GERBIL_OK);
            memcpy(solo + ((size_t)s * (P + STEPS) + P + k) * V, gerbil_context_logits(c, 0), sizeof(float) * V);
        }
        gerbil_context_free(c);
    }
    /* together: the three prompts interleaved row by row in one eval, then decode rows of all three */
    gerbil_context_t c;
    CHECK(gerbil_context_new(m, &cp, &c) == GERBIL_OK);
    int32_t sq[3];
    for (int s = 0; s < S; s++) CHECK(gerbil_seq_new(c, &sq[s]) == GERBIL_OK);
    int32_t tok[39], seqv[39], adv[39];
    int8_t fl[39];
    for (int i = 0; i < P; i++)
        for (int s = 0; s < S; s++) {
            const int r = i * S + s;
            tok[r] = prompt[s][i], seqv[r] = sq[s], adv[r] = ad[s], fl[r] = 1;
        }
    gerbil_batch b = {.n_rows = P * S, .tokens = tok, .seq = seqv, .logits = fl, .adapter = adv};
    CHECK(gerbil_context_eval(c, &b) == GERBIL_OK);
    int same = 1;
    for (int i = 0; i < P; i++)
        for (int s = 0; s < S; s++)
            same &= !memcmp(gerbil_context_logits(c, i * S + s), solo + ((size_t)s * (P + STEPS) + i) * V,
                            sizeof(float) * V);
    CHECKF(same, "%s: mixed prefill rows differ from their solo runs", fx);
    int differs = memcmp(solo, solo + (size_t)(P + STEPS) * V, sizeof(float) * V) != 0; /* the adapters matter */
    CHECK(differs);
    for (int k = 0; k < STEPS; k++) {
        int32_t dt[3], ds[3], da[3];
        for (int s = 0; s < S; s++) { /* rows in another order each step */
            const int r = (s + k) % S;
            dt[r] = 3 + (s * 7 + k * 5) % (V - 3), ds[r] = sq[s], da[r] = ad[s];
        }
        gerbil_batch d = {.n_rows = S, .tokens = dt, .seq = ds, .adapter = da};
        CHECK(gerbil_context_eval(c, &d) == GERBIL_OK);
        same = 1;
        for (int s = 0; s < S; s++)
            same &= !memcmp(gerbil_context_logits(c, (s + k) % S), solo + ((size_t)s * (P + STEPS) + P + k) * V,
                            sizeof(float) * V);
        CHECKF(same, "%s: mixed decode step %d differs from the solo runs", fx, k);
    }
    /* a row naming an adapter that is not loaded: refused, nothing evaluated */
    int32_t bad = 99, t0 = 5;
    gerbil_batch d = {.n_rows = 1, .tokens = &t0, .seq = &sq[0], .adapter = &bad};
    const int len = gerbil_seq_len(c, sq[0]);
    CHECK(gerbil_context_eval(c, &d) == GERBIL_ERR_INVALID_ARG);
    CHECK(gerbil_seq_len(c, sq[0]) == len);
    gerbil_context_free(c);
    free(solo);
    gerbil_model_free(m);
}

int main(int argc, char **argv) {
    const char *only = argc > 1 ? argv[1] : NULL;
    if (!only || strstr("op", only)) test_op();
    if (!only || strstr("golden", only)) {
        golden("qwen3-f32", "lora-qwen3", "cpu", 2, 1e-3);
        golden("qwen3-f32", "lora-qwen3", "ref", 1, 1e-3);
        golden("qwen35-f32", "lora-qwen35", "cpu", 2, 1e-3);
        golden("qwen35-f32", "lora-qwen35", "ref", 1, 1e-3);
        golden("qwen3-mlx4", "lora-qwen3-mlx4", "ref", 1, 1e-3);
        golden("qwen3-mlx4", "lora-qwen3-mlx4", "cpu", 2, -2e-2);
    }
    if (!only || strstr("mixed", only)) {
        mixed_batch("qwen3-f32", "lora-qwen3");
        mixed_batch("qwen35-f32", "lora-qwen35");
    }
    return test_done();
}
