/* Hostile input (issue #15): each case a fuzzing pass found, built here from a fixture or
 * from scratch, must end in a clear error naming the problem (or, where the reference
 * accepts the input, in its answer), never a crash, a sanitizer report, an unbounded
 * allocation or a silent wrong value. The fuzz harnesses' crashes, when they find any,
 * are replayed by tests/cli_hostile.sh from tests/fuzz-regress/. */
#include "gerbil.h"
#include "io/gguf.h"
#include "io/gguf_write.h"
#include "io/json.h"
#include "model/config.h"
#include "test.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[] = "/tmp/gerbil-hostile-XXXXXX";

/* The status is an error and the message holds want. */
#define CHECK_ERR(st, want) do { \
    gerbil_status st_ = (st); \
    CHECKF(st_ != GERBIL_OK && strstr(gerbil_last_error(), want), "status %d, message \"%s\", want \"%s\"", \
           (int)st_, st_ == GERBIL_OK ? "" : gerbil_last_error(), want); \
} while (0)

static void write_file(const char *path, const char *text, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    CHECK(fwrite(text, 1, n, f) == n);
    fclose(f);
}

/* ---- sampler: total over any float input ---- */
static int sample(float temp, int top_k, float top_p, float min_p, float rep, const float *in, int n) {
    gerbil_sampler_params p = {.temperature = temp, .top_k = top_k, .top_p = top_p, .min_p = min_p,
                               .repetition_penalty = rep, .seed = 3};
    gerbil_sampler_t s = NULL;
    CHECK(gerbil_sampler_new(&p, n, &s) == GERBIL_OK);
    float buf[64];
    memcpy(buf, in, (size_t)n * sizeof *buf);
    int32_t hist[2] = {0, 1};
    int id = gerbil_sampler_sample(s, buf, hist, 2);
    gerbil_sampler_free(s);
    return id;
}

static void test_sampler(void) {
    const float nan = NAN, inf = INFINITY;
    const float cases[][8] = {
        {nan, 1, 2, 3, nan, 0, -1, nan},       /* NaN pivots once broke the quickselect */
        {nan, nan, nan, nan, nan, nan, nan, nan},
        {-inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf},
        {inf, 1, inf, 0, -inf, nan, 2, 3},
        {FLT_MAX, -FLT_MAX, FLT_MAX, 0, 1e-45f, -0.0f, 3e38f, nan},
        {nan, -inf, inf, nan, -inf, inf, nan, 0},
    };
    const struct { float temp, top_p, min_p, rep; int top_k; } settings[] = {
        {0, 1, 0, 1, 0},   {1, 1, 0, 1, 0},     {1, 0.9f, 0, 1, 3}, {0.7f, 0.5f, 0.1f, 1.3f, 2},
        {1e-6f, 1, 0, 1, 0}, {100, 0.99f, 0.5f, 1, 8}, {2, 1, 1, 0.5f, 1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (size_t k = 0; k < sizeof settings / sizeof settings[0]; k++) {
            int id = sample(settings[k].temp, settings[k].top_k, settings[k].top_p, settings[k].min_p,
                            settings[k].rep, cases[c], 8);
            CHECKF(id >= 0 && id < 8, "case %zu setting %zu: id %d", c, k, id);
            /* a NaN is never drawn while a number is there */
            int any_num = 0;
            for (int i = 0; i < 8; i++) any_num |= !isnan(cases[c][i]);
            if (id >= 0 && id < 8 && any_num) CHECKF(!isnan(cases[c][id]), "case %zu setting %zu: drew NaN id %d", c, k, id);
        }
    /* greedy: +inf wins, NaN loses to everything (case 0: id 3 holds the max, 3) */
    CHECK(sample(0, 0, 1, 0, 1, cases[0], 8) == 3);
    CHECK(sample(0, 0, 1, 0, 1, cases[3], 8) == 0);
    /* top-k 2 over {+inf, +inf, ...}: only those two */
    for (int seed = 0; seed < 20; seed++) {
        int id = sample(1, 2, 1, 0, 1, cases[3], 8);
        CHECK(id == 0 || id == 2);
    }
}

/* ---- config.json: every integer range-checked, no silent float->int cast ---- */
static int n_variant;

/* A folder holding qwen2-f32's weights and its config.json with `edits` merged in (a JSON
 * object; a null value deletes the key). Returns the folder. */
static const char *variant(const char *edits) {
    static char dir[600];
    snprintf(dir, sizeof dir, "%s/cfg%d", tmpdir, n_variant++);
    CHECK(mkdir(dir, 0700) == 0);
    char src[1024], dst[700];
    CHECK(realpath("tests/fixtures/qwen2-f32/model.safetensors", src) != NULL);
    snprintf(dst, sizeof dst, "%s/model.safetensors", dir);
    CHECK(symlink(src, dst) == 0);
    cJSON *cfg = NULL, *ed = cJSON_Parse(edits);
    CHECK(json_load_file("tests/fixtures/qwen2-f32/config.json", &cfg) == GERBIL_OK && ed);
    const cJSON *e;
    cJSON_ArrayForEach(e, ed) {
        cJSON_DeleteItemFromObjectCaseSensitive(cfg, e->string);
        if (!cJSON_IsNull(e)) cJSON_AddItemToObject(cfg, e->string, cJSON_Duplicate(e, 1));
    }
    char *text = cJSON_Print(cfg);
    snprintf(dst, sizeof dst, "%s/config.json", dir);
    write_file(dst, text, strlen(text));
    free(text);
    cJSON_Delete(cfg);
    cJSON_Delete(ed);
    return dir;
}

static gerbil_status load_cfg(const char *edits, struct model_config *c) {
    gerbil_status st = model_config_load(variant(edits), c);
    return st;
}

static gerbil_status load_model(const char *dir) {
    gerbil_model_t m = NULL;
    gerbil_status st = gerbil_model_load(dir, NULL, &m);
    gerbil_model_free(m);
    return st;
}

static void test_config(void) {
    struct model_config c;
    /* negative max_window_layers: as transformers (layer i slides when i >= it), every layer */
    gerbil_status st = load_cfg("{\"layer_types\": null, \"use_sliding_window\": true, \"sliding_window\": 4, "
                                "\"max_window_layers\": -5}", &c);
    CHECK(st == GERBIL_OK);
    if (st == GERBIL_OK) {
        CHECK(c.sliding_window == 4 && c.layer_sliding[0] && c.layer_sliding[1] && c.layer_sliding[2]);
        model_config_free(&c);
    }
    st = load_cfg("{\"layer_types\": null, \"use_sliding_window\": true, \"sliding_window\": 4, "
                  "\"max_window_layers\": 2}", &c);
    CHECK(st == GERBIL_OK);
    if (st == GERBIL_OK) {
        CHECK(!c.layer_sliding[0] && !c.layer_sliding[1] && c.layer_sliding[2]);
        model_config_free(&c);
    }
    CHECK_ERR(load_cfg("{\"layer_types\": null, \"use_sliding_window\": true, \"sliding_window\": 4, "
                       "\"max_window_layers\": -1e300}", &c), "\"max_window_layers\" must be an integer in");
    /* float -> int casts out of range (clang's float-cast-overflow) */
    CHECK_ERR(load_cfg("{\"layer_types\": null, \"use_sliding_window\": true, \"sliding_window\": 1e20}", &c),
              "\"sliding_window\" must be an integer in [1, 1073741823]");
    CHECK_ERR(load_cfg("{\"eos_token_id\": 1e20}", &c), "\"eos_token_id\" must hold token ids");
    CHECK_ERR(load_cfg("{\"eos_token_id\": [2, 1e20]}", &c), "\"eos_token_id\" must hold token ids");
    CHECK_ERR(load_cfg("{\"bos_token_id\": 2.5}", &c), "\"bos_token_id\" must hold token ids");
    CHECK_ERR(load_cfg("{\"partial_rotary_factor\": 1e20}", &c), "partial_rotary_factor 1e+20 must be in (0, 1]");
    CHECK_ERR(load_cfg("{\"rms_norm_eps\": 1e300}", &c), "rms_norm_eps must be in (0, 1]");
    CHECK_ERR(load_cfg("{\"rope_parameters\": {\"rope_theta\": 0.5}}", &c), "rope_theta must be > 1");
    CHECK_ERR(load_cfg("{\"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 4, "
                       "\"original_max_position_embeddings\": 2147483648}}", &c),
              "\"original_max_position_embeddings\" must be an integer in [1, 1073741823]");
    CHECK_ERR(load_cfg("{\"rope_parameters\": {\"rope_type\": \"linear\", \"factor\": 1e400}}", &c),
              "needs a positive \"factor\"");
    /* the message says what the range is */
    CHECK_ERR(load_cfg("{\"max_position_embeddings\": 1073741824}", &c),
              "field \"max_position_embeddings\" = 1073741824 is out of range (a positive integer up to 1073741823)");
    CHECK_ERR(load_cfg("{\"quantization\": {\"bits\": 4294967300, \"group_size\": 64}}", &c),
              "\"bits\" must be an integer in [0, 64]");
    /* generation_config.json is checked the same way */
    const char *dir = variant("{}");
    char path[700];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    write_file(path, "{\"eos_token_id\": 1e30}", 22);
    CHECK_ERR(model_config_load(dir, &c), "generation_config.json: \"eos_token_id\" must hold token ids");

    /* sizes trusted before shapes: hidden_size 1e9 must fail on the shape, before allocating */
    CHECK_ERR(load_model(variant("{\"hidden_size\": 1000000000, \"head_dim\": 16}")),
              "has shape [256, 64], but the configuration says vocabulary 256 and hidden size 1000000000");
    CHECK_ERR(load_model(variant("{\"intermediate_size\": 1000000000}")),
              "intermediate size 1000000000 is larger than any tensor dimension in the checkpoint (at most 256)");
    CHECK_ERR(load_model(variant("{\"num_attention_heads\": 4, \"head_dim\": 100000000}")),
              "attention width (heads x head_dim) 400000000 is larger than any tensor dimension");
    CHECK_ERR(load_model(variant("{\"vocab_size\": 1000000000}")), "vocabulary 1000000000");
}

/* ---- GGUF metadata: as strictly as config.json ---- */
struct kv_override { const char *key; int type; uint64_t u; double f; };

/* A GGUF with a llama architecture's metadata (one override applied) and one embedding
 * tensor: enough for model_config_from_gguf. */
static gerbil_status gguf_cfg(const struct kv_override *o, struct model_config *c) {
    static float emb[16 * 64];
    struct gguf_writer *w;
    CHECK(gguf_writer_new(&w) == GERBIL_OK);
    gguf_writer_add_str(w, "general.architecture", "llama");
    const struct { const char *key; uint32_t v; } base[] = {
        {"llama.embedding_length", 64}, {"llama.block_count", 2}, {"llama.feed_forward_length", 128},
        {"llama.attention.head_count", 4}, {"llama.attention.head_count_kv", 2}, {"llama.context_length", 256},
    };
    for (size_t i = 0; i < sizeof base / sizeof base[0]; i++)
        if (!o || strcmp(o->key, base[i].key)) gguf_writer_add_u32(w, base[i].key, base[i].v);
    if (o) {
        if (o->type == GGUF_VT_U32) gguf_writer_add_u32(w, o->key, (uint32_t)o->u);
        else if (o->type == GGUF_VT_F32) gguf_writer_add_f32(w, o->key, (float)o->f);
        else gguf_writer_add_scalar(w, o->key, GGUF_VT_F64, &o->f);
    }
    gguf_writer_add_tensor(w, "token_embd.weight", GB_TYPE_F32, 2, (int64_t[]){16, 64}, emb, sizeof emb);
    char path[600];
    snprintf(path, sizeof path, "%s/m.gguf", tmpdir);
    CHECK(gguf_writer_write(w, path) == GERBIL_OK);
    gguf_writer_free(w);
    struct gguf_file f;
    gerbil_status st = gguf_open(path, NULL, &f);
    CHECK(st == GERBIL_OK);
    if (st != GERBIL_OK) return st;
    st = model_config_from_gguf(&f, path, c);
    if (st == GERBIL_OK) model_config_free(c);
    gguf_close(&f);
    return st;
}

static void test_gguf(void) {
    struct model_config c;
    CHECK(gguf_cfg(NULL, &c) == GERBIL_OK);
    const char *big[] = {"llama.context_length", "llama.embedding_length", "llama.block_count",
                         "llama.attention.sliding_window", "llama.feed_forward_length"};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
        struct kv_override o = {big[i], GGUF_VT_U32, 0x80000000u, 0};
        char want[128];
        snprintf(want, sizeof want, "metadata \"%s\" = 2147483648 is out of range (at most 1073741823)", big[i]);
        CHECK_ERR(gguf_cfg(&o, &c), want);
    }
    const double bad_base[] = {0.0, -10000.0, 0.5, NAN};
    for (size_t i = 0; i < sizeof bad_base / sizeof bad_base[0]; i++) {
        struct kv_override o = {"llama.rope.freq_base", GGUF_VT_F32, 0, bad_base[i]};
        CHECK_ERR(gguf_cfg(&o, &c), isnan(bad_base[i]) ? "is not a finite number" : "rope.freq_base");
    }
    struct kv_override inf = {"llama.rope.freq_base", GGUF_VT_F32, 0, INFINITY};
    CHECK_ERR(gguf_cfg(&inf, &c), "is not a finite number");
    struct kv_override f64 = {"llama.rope.freq_base", GGUF_VT_F64, 0, 1e300};
    CHECK_ERR(gguf_cfg(&f64, &c), "is out of range for f32");
    struct kv_override eps = {"llama.attention.layer_norm_rms_epsilon", GGUF_VT_F32, 0, NAN};
    CHECK_ERR(gguf_cfg(&eps, &c), "is not a finite number");
}

/* ---- tokenizer.json: allocations bounded by the file ---- */
static void test_tokenizer(void) {
    char path[600];
    snprintf(path, sizeof path, "%s/tokenizer.json", tmpdir);
    const char *tj = "{\"model\": {\"type\": \"WordLevel\", \"vocab\": {\"a\": 2147483646}, \"unk_token\": \"a\"}}";
    write_file(path, tj, strlen(tj));
    gerbil_tokenizer_t t = NULL;
    CHECK_ERR(gerbil_tokenizer_load(path, &t), "id 2147483646 with only 1 entries");
    gerbil_tokenizer_free(t);
    tj = "{\"model\": {\"type\": \"WordLevel\", \"vocab\": {\"a\": 0, \"b\": 5}, \"unk_token\": \"a\"}}";
    write_file(path, tj, strlen(tj));
    t = NULL;
    CHECK(gerbil_tokenizer_load(path, &t) == GERBIL_OK); /* small holes are fine */
    gerbil_tokenizer_free(t);
}

/* ---- JSON: nesting limit named ---- */
static void test_json_depth(void) {
    enum { N = 1500 };
    char *buf = malloc(2 * N + 1);
    for (int i = 0; i < N; i++) buf[i] = '[', buf[2 * N - 1 - i] = ']';
    cJSON *j = NULL;
    CHECK_ERR(json_parse(buf, 2 * N, "deep.json", &j), "deep.json: JSON nested too deeply (more than 1000 levels");
    memset(buf, '[', 100);
    memset(buf + 100, ']', 99);
    CHECK_ERR(json_parse(buf, 199, "short.json", &j), "malformed JSON near byte");
    free(buf);
}

/* ---- Jinja: oversize results raise, never clamp; whole-render limits name no line 0 ---- */
static void test_jinja(void) {
    const char *srcs[] = {"{{ 'a'|center(100000000) }}", "{{ 'a'.rjust(100000000) }}", "{{ 'a'.ljust(100000000) }}",
                          "{{ 'a'.center(100000000) }}"};
    for (size_t i = 0; i < sizeof srcs / sizeof srcs[0]; i++) {
        char *out = NULL;
        CHECK_ERR(gerbil_template_render(srcs[i], "{}", &out), "width 100000000 is past the 32 MiB string limit");
        free(out);
    }
    char *out = NULL;
    CHECK(gerbil_template_render("{{ 'ab'.rjust(5) }}|{{ 'ab'.ljust(4, '*') }}", "{}", &out) == GERBIL_OK);
    CHECKF(out && !strcmp(out, "   ab|ab**"), "got \"%s\"", out ? out : "(null)");
    free(out);
    out = NULL;
    gerbil_status st = gerbil_template_render("{% for i in range(40) %}{{ 'x' * 1000000 }}{% endfor %}", "{}", &out);
    CHECK(st != GERBIL_OK && !strstr(gerbil_last_error(), "line 0") && strstr(gerbil_last_error(), "MiB"));
    free(out);
}

int main(void) {
    if (!mkdtemp(tmpdir)) SKIP("cannot create a temporary folder");
    test_sampler();
    test_config();
    test_gguf();
    test_tokenizer();
    test_json_depth();
    test_jinja();
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    CHECK(system(cmd) == 0);
    return test_done();
}
