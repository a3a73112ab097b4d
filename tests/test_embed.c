/* Text embeddings against sentence-transformers 6.0.1 (scripts/gen_embed_fixtures.py): tiny
 * Qwen3-Embedding (Qwen3Model, last token, normalize) and EmbeddingGemma (bidirectional
 * Gemma3TextModel with sliding and full layers, mean, two Dense, normalize) folders in f32, bf16
 * and MLX 4-bit, with the real tokenizers from ../shared/data. Per input: the same token ids,
 * cosine >= 0.99999 (f32) / 0.999 (bf16, MLX); a batch of mixed lengths equal to one-by-one bit
 * for bit, at 1 and 2 threads; Matryoshka dimensions; the ref backend; the errors. */
#include "gerbil.h"
#include "io/safetensors.h"
#include "test.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) { free(b); b = NULL; }
    if (b) b[n] = 0;
    fclose(f);
    return b;
}

static double cosine(const float *a, const float *b, int n) {
    double ab = 0, aa = 0, bb = 0;
    for (int i = 0; i < n; i++) { ab += (double)a[i] * b[i]; aa += (double)a[i] * a[i]; bb += (double)b[i] * b[i]; }
    return ab / sqrt(aa * bb);
}

static char tmp_root[64];

/* Unpack tests/fixtures/NAME.tar.gz into the temp folder and link the family's tokenizer. */
static int unpack(const char *name, const char *family, char *dir, size_t cap) {
    char cmd[1024], tok[PATH_MAX], src[PATH_MAX + 64], dst[PATH_MAX + 64];
    snprintf(cmd, sizeof cmd, "tar xzf tests/fixtures/%s.tar.gz -C %s", name, tmp_root);
    if (system(cmd) != 0) return -1;
    snprintf(dir, cap, "%s/%s", tmp_root, name);
    snprintf(src, sizeof src, "../shared/data/tokenizers/%s", family);
    if (!realpath(src, tok)) return -1;
    const char *files[] = {"tokenizer.json", "tokenizer_config.json"};
    for (int i = 0; i < 2; i++) {
        snprintf(src, sizeof src, "%s/%s", tok, files[i]);
        snprintf(dst, sizeof dst, "%s/%s", dir, files[i]);
        if (symlink(src, dst) != 0) return -1;
    }
    return 0;
}

struct fx {
    const char *name, *family;
    double min_cos;
};

static void run_fixture(const struct fx *fx, gerbil_tokenizer_t tok, const char *backend, int threads) {
    char dir[PATH_MAX], path[PATH_MAX + 32];
    CHECKF(unpack(fx->name, fx->family, dir, sizeof dir) == 0, "%s: cannot unpack", fx->name);
    snprintf(path, sizeof path, "%s/expected.json", dir);
    char *js = read_file(path);
    cJSON *exp = js ? cJSON_Parse(js) : NULL;
    free(js);
    CHECKF(exp != NULL, "%s: expected.json", fx->name);
    if (!exp) return;
    gerbil_model_params mp = gerbil_model_default_params();
    mp.n_threads = threads;
    mp.backend = backend;
    gerbil_model_t m = NULL;
    gerbil_embedder_t e = NULL;
    gerbil_status st = gerbil_model_load(dir, &mp, &m);
    CHECKF(st == GERBIL_OK, "%s: load: %s", fx->name, gerbil_last_error());
    if (st == GERBIL_OK) st = gerbil_embedder_new(m, tok, dir, &e);
    CHECKF(st == GERBIL_OK, "%s: embedder: %s", fx->name, gerbil_last_error());
    if (st != GERBIL_OK) goto out;
    const int dim = (int)cJSON_GetObjectItem(exp, "dim")->valuedouble;
    CHECKF(gerbil_embedder_dim(e) == dim, "%s: dim %d, expected %d", fx->name, gerbil_embedder_dim(e), dim);
    const cJSON *texts = cJSON_GetObjectItem(exp, "texts"), *t;
    const int n = cJSON_GetArraySize(texts);
    float *one = calloc((size_t)n * dim, sizeof(float)), *ref = calloc((size_t)n * dim, sizeof(float));
    const char **plain = calloc((size_t)n, sizeof *plain);
    int32_t **st_ids = calloc((size_t)n, sizeof *st_ids);
    int *n_ids = calloc((size_t)n, sizeof *n_ids);
    int n_plain = 0, i = 0;
    double worst = 1.0;
    cJSON_ArrayForEach(t, texts) {
        const char *text = cJSON_GetObjectItem(t, "text")->valuestring;
        const cJSON *pn = cJSON_GetObjectItem(t, "prompt_name");
        const cJSON *emb = cJSON_GetObjectItem(t, "embedding");
        for (int d = 0; d < dim; d++) ref[(size_t)i * dim + d] = (float)cJSON_GetArrayItem(emb, d)->valuedouble;
        if (!cJSON_IsString(pn)) plain[n_plain++] = text;
        /* the text path: prompt + text with the tokenizer's specials (+ <|endoftext|> for
         * Qwen3-Embedding, which gerbil appends itself) = what the HF tokenizer gives */
        const char *input = cJSON_GetObjectItem(t, "input")->valuestring;
        int32_t *ids = NULL;
        int nid = 0;
        char *in2 = strdup(input), *cut = strstr(in2, "<|endoftext|>");
        if (cut) *cut = 0;
        CHECK(gerbil_tokenize(tok, in2, strlen(in2), 1, &ids, &nid) == GERBIL_OK);
        free(in2);
        const cJSON *tids = cJSON_GetObjectItem(t, "tokenizer_ids");
        const int nt = cJSON_GetArraySize(tids), extra = cut ? 1 : 0;
        int same = nid + extra == nt;
        for (int k = 0; same && k < nid; k++) same = ids[k] == (int32_t)cJSON_GetArrayItem(tids, k)->valuedouble;
        CHECKF(same, "%s: text %d: %d ids, the HF tokenizer gave %d (or different ones)", fx->name, i, nid + extra, nt);
        free(ids);
        gerbil_embed_options o = {.prompt_name = cJSON_IsString(pn) ? pn->valuestring : NULL};
        float tv[64];
        int ntok = 0;
        st = gerbil_embed(e, &text, 1, &o, tv, &ntok);
        CHECKF(st == GERBIL_OK && ntok == nt, "%s: embed %d: %s (%d tokens, %d expected)", fx->name, i,
               gerbil_last_error(), ntok, nt);
        /* the model, pooling, Dense and Normalize: the ids sentence-transformers evaluated
         * (sentence-transformers 6 renders inputs through the tokenizer's chat template) */
        const cJSON *sids = cJSON_GetObjectItem(t, "ids");
        n_ids[i] = cJSON_GetArraySize(sids);
        st_ids[i] = malloc((size_t)n_ids[i] * sizeof(int32_t));
        for (int k = 0; k < n_ids[i]; k++) st_ids[i][k] = (int32_t)cJSON_GetArrayItem(sids, k)->valuedouble;
        float *v = one + (size_t)i * dim;
        st = gerbil_embed_ids(e, (const int32_t *const *)&st_ids[i], &n_ids[i], 1, NULL, v, &ntok);
        CHECKF(st == GERBIL_OK && ntok == n_ids[i], "%s: embed ids %d: %s", fx->name, i, gerbil_last_error());
        double c = cosine(v, ref + (size_t)i * dim, dim);
        if (c < worst) worst = c;
        CHECKF(c >= fx->min_cos, "%s (%s, %d threads): text %d (prompt %s): cosine %.7f < %.5f", fx->name, backend,
               threads, i, o.prompt_name ? o.prompt_name : "-", c, fx->min_cos);
        i++;
    }
    printf("%s (%s, %d threads): %d inputs, worst 1 - cosine %.2e\n", fx->name, backend ? backend : "cpu", threads, n, 1.0 - worst);
    /* one batch of all the mixed-length inputs = each alone, bit for bit */
    float *batch = calloc((size_t)n * dim, sizeof(float));
    st = gerbil_embed_ids(e, (const int32_t *const *)st_ids, n_ids, n, NULL, batch, NULL);
    CHECKF(st == GERBIL_OK, "%s: batch: %s", fx->name, gerbil_last_error());
    CHECKF(!memcmp(batch, one, (size_t)n * dim * sizeof(float)), "%s: a batch of %d differs from one by one",
           fx->name, n);
    /* and through the text path */
    float *tb = calloc((size_t)n_plain * dim, sizeof(float)), *t1 = calloc((size_t)dim, sizeof(float));
    CHECK(gerbil_embed(e, plain, n_plain, NULL, tb, NULL) == GERBIL_OK);
    for (int k = 0; k < n_plain; k++) {
        CHECK(gerbil_embed(e, &plain[k], 1, NULL, t1, NULL) == GERBIL_OK);
        CHECKF(!memcmp(t1, tb + (size_t)k * dim, (size_t)dim * sizeof(float)), "%s: text %d in a batch differs",
               fx->name, k);
    }
    free(tb);
    free(t1);
    /* Matryoshka: the first 8, renormalised */
    gerbil_embed_options o8 = {.dimensions = 8};
    float v8[8];
    CHECK(gerbil_embed_ids(e, (const int32_t *const *)&st_ids[1], &n_ids[1], 1, &o8, v8, NULL) == GERBIL_OK);
    double nn = 0;
    for (int d = 0; d < 8; d++) nn += (double)v8[d] * v8[d];
    CHECKF(fabs(nn - 1.0) < 1e-5, "%s: dimensions 8: norm^2 %.7f", fx->name, nn);
    CHECKF(cosine(v8, ref + (size_t)1 * dim, 8) >= fx->min_cos, "%s: dimensions 8: cosine %.7f", fx->name,
           cosine(v8, ref + (size_t)1 * dim, 8));
    /* errors */
    gerbil_embed_options bad = {.prompt_name = "nope"};
    st = gerbil_embed(e, &plain[0], 1, &bad, v8, NULL);
    CHECKF(st == GERBIL_ERR_INVALID_ARG && strstr(gerbil_last_error(), "nope") && strstr(gerbil_last_error(), "query"),
           "unknown prompt: %s", gerbil_last_error());
    gerbil_embed_options big = {.dimensions = dim + 1};
    st = gerbil_embed(e, &plain[0], 1, &big, v8, NULL);
    CHECKF(st == GERBIL_ERR_INVALID_ARG && strstr(gerbil_last_error(), "out of range"), "dimensions: %s",
           gerbil_last_error());
    for (int k = 0; k < n; k++) free(st_ids[k]);
    free(st_ids);
    free(n_ids);
    free(batch);
    free(one);
    free(ref);
    free(plain);
out:
    gerbil_embedder_free(e);
    gerbil_model_free(m);
    cJSON_Delete(exp);
    snprintf(path, sizeof path, "rm -rf %s", dir);
    if (system(path) != 0) fprintf(stderr, "cannot remove %s\n", dir);
}

/* Bidirectional attention with an f16 KV cache (the CPU's AVX-512 attention where the CPU has
 * it) against the ref backend, on the EmbeddingGemma fixture's longest input (longer than its
 * sliding window); a second batch onto a bidirectional sequence is refused. */
static void bidirectional_f16(void) {
    char dir[PATH_MAX], path[PATH_MAX + 32];
    if (unpack("embed-gemma3-f32", "gemma3", dir, sizeof dir)) { CHECK(0); return; }
    snprintf(path, sizeof path, "%s/expected.json", dir);
    char *js = read_file(path);
    cJSON *exp = js ? cJSON_Parse(js) : NULL;
    free(js);
    const cJSON *ids = exp ? cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(exp, "texts"), 4), "ids") : NULL;
    const int n = ids ? cJSON_GetArraySize(ids) : 0;
    CHECK(n > 20 && n <= 128);
    int32_t tok[128], seq[128];
    int8_t fl[128];
    for (int i = 0; i < n && i < 128; i++) { tok[i] = (int32_t)cJSON_GetArrayItem(ids, i)->valuedouble; fl[i] = 1; }
    float *h[3] = {NULL, NULL, NULL};
    const char *backends[3] = {"cpu", "ref", "cpu"};
    for (int b = 0; b < 3 && n > 20 && n <= 128; b++) {
        gerbil_model_params mp = gerbil_model_default_params();
        mp.n_threads = 2;
        mp.backend = backends[b];
        gerbil_model_t m = NULL;
        gerbil_context_t c = NULL;
        gerbil_context_params p = gerbil_context_default_params();
        p.embeddings = 1;
        p.kv_type = GERBIL_KV_F16;
        p.n_ctx = 256;
        p.attention = b == 2 ? GERBIL_ATTENTION_CAUSAL : GERBIL_ATTENTION_MODEL;
        int32_t s = -1;
        if (gerbil_model_load(dir, &mp, &m) != GERBIL_OK || gerbil_context_new(m, &p, &c) != GERBIL_OK ||
            gerbil_seq_new(c, &s) != GERBIL_OK) {
            CHECKF(0, "bidirectional f16 (%s): %s", backends[b], gerbil_last_error());
        } else {
            for (int i = 0; i < n; i++) seq[i] = s;
            const gerbil_batch bt = {.n_rows = n, .tokens = tok, .seq = seq, .logits = fl};
            CHECK(gerbil_context_eval(c, &bt) == GERBIL_OK);
            const int D = gerbil_model_n_embd(m);
            h[b] = malloc((size_t)n * D * sizeof(float));
            for (int i = 0; i < n; i++) memcpy(h[b] + (size_t)i * D, gerbil_context_embedding(c, i), (size_t)D * sizeof(float));
            const gerbil_batch more = {.n_rows = 1, .tokens = tok, .seq = seq, .logits = fl};
            gerbil_status st = gerbil_context_eval(c, &more);
            if (b < 2) CHECKF(st == GERBIL_ERR_INVALID_ARG && strstr(gerbil_last_error(), "one batch"), "%s", gerbil_last_error());
            else CHECK(st == GERBIL_OK); /* causal: a sequence grows batch by batch */
        }
        gerbil_context_free(c);
        if (b == 2 && h[0] && h[1] && h[2]) {
            const int D = gerbil_model_n_embd(m);
            double d01 = 0, d02 = 0;
            for (size_t k = 0; k < (size_t)n * D; k++) {
                if (fabs(h[0][k] - h[1][k]) > d01) d01 = fabs(h[0][k] - h[1][k]);
                if (fabs(h[0][k] - h[2][k]) > d02) d02 = fabs(h[0][k] - h[2][k]);
            }
            CHECKF(d01 < 1e-3, "bidirectional, f16 KV: cpu vs ref max |diff| %g", d01);
            CHECKF(d02 > 1e-2, "bidirectional = causal? max |diff| %g", d02);
            printf("bidirectional f16 KV, %d rows: cpu vs ref max |diff| %.2e (vs causal %.2e)\n", n, d01, d02);
        }
        gerbil_model_free(m);
    }
    for (int b = 0; b < 3; b++) free(h[b]);
    cJSON_Delete(exp);
    snprintf(path, sizeof path, "rm -rf %s", dir);
    if (system(path) != 0) fprintf(stderr, "cannot remove %s\n", dir);
}

/* A text generator is not an embedding model, and an embedding model does not generate. */
static void errors(void) {
    gerbil_model_t m = NULL;
    gerbil_tokenizer_t tok = NULL;
    gerbil_embedder_t e = NULL;
    if (gerbil_model_load("tests/fixtures/qwen3-f32", NULL, &m) != GERBIL_OK) return;
    char dir[PATH_MAX] = "";
    if (unpack("embed-qwen3-f32", "qwen3", dir, sizeof dir) == 0 && gerbil_tokenizer_load(dir, &tok) == GERBIL_OK) {
        gerbil_status st = gerbil_embedder_new(m, tok, "tests/fixtures/qwen3-f32", &e);
        CHECKF(st == GERBIL_ERR_UNSUPPORTED && strstr(gerbil_last_error(), "not an embedding model"), "%s",
               gerbil_last_error());
        gerbil_model_t em = NULL;
        if (gerbil_model_load(dir, NULL, &em) == GERBIL_OK) {
            gerbil_session_t s = NULL;
            st = gerbil_session_new(em, NULL, &s);
            CHECKF(st != GERBIL_OK && strstr(gerbil_last_error(), "embedding model"), "session: %s", gerbil_last_error());
            gerbil_session_free(s);
            gerbil_model_free(em);
        }
    }
    gerbil_tokenizer_free(tok);
    gerbil_model_free(m);
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", dir);
}

/* The embeddings path on a causal model: hidden states of every row (embeddings = 1) times
 * the tied embedding = the logits transformers computed (tests/fixtures/qwen3-f32). */
static void hidden_rows(void) {
    gerbil_model_t m = NULL;
    gerbil_context_t c = NULL;
    struct st_file ex = {0}, w = {0};
    if (gerbil_model_load("tests/fixtures/qwen3-f32", NULL, &m) != GERBIL_OK ||
        st_file_open("tests/fixtures/qwen3-f32/expected.safetensors", &ex) != GERBIL_OK ||
        st_file_open("tests/fixtures/qwen3-f32/model.safetensors", &w) != GERBIL_OK) {
        CHECKF(0, "qwen3-f32: %s", gerbil_last_error());
        return;
    }
    const struct gb_tensor *ids = st_file_find(&ex, "input_ids"), *lg = st_file_find(&ex, "logits"),
                           *E = st_file_find(&w, "model.embed_tokens.weight");
    const int n = (int)ids->ne[0], V = (int)E->ne[0], D = (int)E->ne[1];
    gerbil_context_params p = gerbil_context_default_params();
    p.embeddings = 1;
    p.kv_type = GERBIL_KV_F32;
    int32_t s, seq[64];
    int8_t fl[64];
    CHECK(gerbil_context_new(m, &p, &c) == GERBIL_OK && gerbil_seq_new(c, &s) == GERBIL_OK && n <= 64);
    for (int i = 0; i < n; i++) { seq[i] = s; fl[i] = 1; }
    const gerbil_batch b = {.n_rows = n, .tokens = ids->data, .seq = seq, .logits = fl};
    CHECK(gerbil_context_eval(c, &b) == GERBIL_OK && gerbil_context_n_outputs(c) == n);
    CHECK(gerbil_context_logits(c, 0) == NULL);
    double mx = 0;
    for (int t = 0; t < n; t++) {
        const float *h = gerbil_context_embedding(c, t);
        for (int v = 0; v < V; v++) {
            double a = 0;
            for (int d = 0; d < D; d++) a += (double)h[d] * ((const float *)E->data)[(size_t)v * D + d];
            double df = fabs(a - ((const float *)lg->data)[(size_t)t * V + v]);
            if (df > mx) mx = df;
        }
    }
    CHECKF(mx < 1e-3, "hidden rows x lm_head vs transformers' logits: max |diff| %g", mx);
    printf("qwen3-f32 hidden rows x lm_head: max |logit diff| %.2e over %d rows\n", mx, n);
    gerbil_context_free(c);
    st_file_close(&ex);
    st_file_close(&w);
    gerbil_model_free(m);
}

int main(void) {
    if (access("../shared/data/tokenizers/qwen3/tokenizer.json", R_OK) ||
        access("../shared/data/tokenizers/gemma3/tokenizer.json", R_OK))
        SKIP("../shared/data/tokenizers/{qwen3,gemma3} not found");
    snprintf(tmp_root, sizeof tmp_root, "/tmp/gerbil-embed-XXXXXX");
    if (!mkdtemp(tmp_root)) SKIP("no temporary folder");
    static const struct fx fixtures[] = {
        {"embed-qwen3-f32", "qwen3", 0.99999},  {"embed-qwen3-bf16", "qwen3", 0.999},
        {"embed-qwen3-mlx4", "qwen3", 0.999},   {"embed-gemma3-f32", "gemma3", 0.99999},
        {"embed-gemma3-bf16", "gemma3", 0.999}, {"embed-gemma3-mlx4", "gemma3", 0.999},
    };
    hidden_rows();
    gerbil_tokenizer_t toks[2] = {NULL, NULL}; /* qwen3, gemma3: loaded once */
    CHECK(gerbil_tokenizer_load("../shared/data/tokenizers/qwen3", &toks[0]) == GERBIL_OK);
    CHECK(gerbil_tokenizer_load("../shared/data/tokenizers/gemma3", &toks[1]) == GERBIL_OK);
    for (size_t i = 0; toks[0] && toks[1] && i < sizeof fixtures / sizeof fixtures[0]; i++) {
        gerbil_tokenizer_t tk = toks[strcmp(fixtures[i].family, "gemma3") == 0];
        run_fixture(&fixtures[i], tk, NULL, 2);
        run_fixture(&fixtures[i], tk, NULL, 1);
        if (strstr(fixtures[i].name, "-f32")) run_fixture(&fixtures[i], tk, "ref", 1);
    }
    gerbil_tokenizer_free(toks[0]);
    gerbil_tokenizer_free(toks[1]);
    bidirectional_f16();
    errors();
    rmdir(tmp_root);
    return test_done();
}
