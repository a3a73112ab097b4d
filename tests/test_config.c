/* config.json compatibility: checkpoints written before transformers 5 put rope_theta
 * at the top level and scaling under "rope_scaling" (with "type" or "rope_type");
 * LiquidAI's LFM2 configs use their original keys (block_ff_dim, full_attn_idxs,
 * tie_embedding, theta). Rewriting a fixture's config that way must give the same
 * logits; inconsistent configs are refused with a message naming the problem. */
#include "gerbil.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[] = "/tmp/gerbil-config-XXXXXX";

/* Copy fixture `name` to tmpdir/name with config.json passed through edit(). */
static int make_variant(const char *name, const char *out, void (*edit)(cJSON *)) {
    char src[512], dst[512];
    snprintf(dst, sizeof dst, "%s/%s", tmpdir, out);
    CHECK(mkdir(dst, 0700) == 0);
    snprintf(src, sizeof src, "tests/fixtures/%s/model.safetensors", name);
    char abs_src[1024];
    CHECK(realpath(src, abs_src) != NULL);
    snprintf(dst, sizeof dst, "%s/%s/model.safetensors", tmpdir, out);
    CHECK(symlink(abs_src, dst) == 0);
    snprintf(src, sizeof src, "tests/fixtures/%s/config.json", name);
    cJSON *cfg;
    if (json_load_file(src, &cfg) != GERBIL_OK) return -1;
    edit(cfg);
    char *text = cJSON_Print(cfg);
    snprintf(dst, sizeof dst, "%s/%s/config.json", tmpdir, out);
    FILE *f = fopen(dst, "w");
    fputs(text, f);
    fclose(f);
    free(text);
    cJSON_Delete(cfg);
    return 0;
}

/* rope_parameters {rope_theta, rope_type, ...} -> rope_theta + rope_scaling {type, ...} */
static void to_v4_style(cJSON *cfg) {
    cJSON *rp = cJSON_DetachItemFromObject(cfg, "rope_parameters");
    cJSON *theta = cJSON_DetachItemFromObject(rp, "rope_theta");
    cJSON_AddItemToObject(cfg, "rope_theta", theta);
    cJSON *type = cJSON_DetachItemFromObject(rp, "rope_type");
    cJSON_AddItemToObject(rp, "type", type);
    cJSON_AddItemToObject(cfg, "rope_scaling", rp);
    cJSON_DeleteItemFromObject(cfg, "dtype");
    cJSON_AddStringToObject(cfg, "torch_dtype", "float32");
}

static void to_longrope(cJSON *cfg) {
    cJSON *rp = cJSON_GetObjectItem(cfg, "rope_parameters");
    cJSON_ReplaceItemInObject(rp, "rope_type", cJSON_CreateString("longrope"));
}

/* Gemma 3 configs that must be refused, each with a message naming the field. */
static void g_act(cJSON *c) { cJSON_ReplaceItemInObject(c, "hidden_activation", cJSON_CreateString("relu")); }
static void g_cap(cJSON *c) { cJSON_ReplaceItemInObject(c, "final_logit_softcapping", cJSON_CreateNumber(-1)); }
static void g_bidir(cJSON *c) { cJSON_ReplaceItemInObject(c, "use_bidirectional_attention", cJSON_CreateTrue()); }
static void g_rope(cJSON *c) {
    cJSON_DeleteItemFromObject(cJSON_GetObjectItem(c, "rope_parameters"), "sliding_attention");
}
static void g_untied(cJSON *c) { cJSON_ReplaceItemInObject(c, "tie_word_embeddings", cJSON_CreateFalse()); }
static void g_ffn(cJSON *c) { cJSON_ReplaceItemInObject(c, "intermediate_size", cJSON_CreateNumber(96)); }
static void g_mm(cJSON *c) {
    cJSON_ReplaceItemInObject(c, "architectures", cJSON_Parse("[\"Gemma3ForConditionalGeneration\"]"));
}

/* Gemma 4 as Google's released config.json spells the full layers' geometry (transformers 5.17's
 * save_pretrained writes per_layer_config instead): the same model. */
static void g4_released(cJSON *c) {
    cJSON_DeleteItemFromObject(c, "per_layer_config");
    cJSON_AddNumberToObject(c, "global_head_dim", 32);
}
/* Gemma 4 configs that must be refused, each with a message naming the field. */
static void g4_moe(cJSON *c) { cJSON_ReplaceItemInObject(c, "enable_moe_block", cJSON_CreateTrue()); }
static void g4_bidir(cJSON *c) { cJSON_ReplaceItemInObject(c, "use_bidirectional_attention", cJSON_CreateString("all")); }
static void g4_plc(cJSON *c) {
    cJSON_AddNumberToObject(cJSON_GetObjectItem(cJSON_GetObjectItem(c, "per_layer_config"), "2"), "sliding_window", 4);
}
static void g4_share(cJSON *c) { cJSON_ReplaceItemInObject(c, "num_kv_shared_layers", cJSON_CreateNumber(5)); }
static void g4_rope(cJSON *c) {
    cJSON *full = cJSON_GetObjectItem(cJSON_GetObjectItem(c, "rope_parameters"), "full_attention");
    cJSON_ReplaceItemInObject(full, "rope_type", cJSON_CreateString("longrope"));
}

/* LFM2 as LiquidAI's config.json spells it */
static void to_lfm2_original(cJSON *cfg) {
    cJSON_DeleteItemFromObject(cfg, "intermediate_size");
    cJSON_AddNumberToObject(cfg, "block_ff_dim", 170);
    cJSON_DeleteItemFromObject(cfg, "layer_types");
    cJSON_ReplaceItemInObject(cfg, "full_attn_idxs", cJSON_CreateIntArray((const int[]){1, 3}, 2));
    cJSON_DeleteItemFromObject(cfg, "tie_word_embeddings");
    cJSON_AddTrueToObject(cfg, "tie_embedding");
    cJSON_DeleteItemFromObject(cfg, "rope_parameters");
    cJSON_AddNumberToObject(cfg, "theta", 1e6);
}

/* rope_parameters keyed by layer type */
static void to_lfm2_rope_per_type(cJSON *cfg) {
    cJSON *rp = cJSON_DetachItemFromObject(cfg, "rope_parameters");
    cJSON *outer = cJSON_CreateObject();
    cJSON_AddItemToObject(outer, "full_attention", rp);
    cJSON_AddItemToObject(cfg, "rope_parameters", outer);
}

/* LFM2 configs that must be refused */
static void lfm2_kernel_1(cJSON *cfg) { cJSON_ReplaceItemInObject(cfg, "conv_L_cache", cJSON_CreateNumber(1)); }
static void lfm2_kernel_4(cJSON *cfg) { cJSON_ReplaceItemInObject(cfg, "conv_L_cache", cJSON_CreateNumber(4)); }
static void lfm2_multiple_256(cJSON *cfg) {
    cJSON_ReplaceItemInObject(cfg, "block_multiple_of", cJSON_CreateNumber(256));
}
static void lfm2_bad_idx(cJSON *cfg) {
    cJSON_DeleteItemFromObject(cfg, "layer_types");
    cJSON_ReplaceItemInObject(cfg, "full_attn_idxs", cJSON_CreateIntArray((const int[]){1, 7}, 2));
}

static void check_refused(const char *fixture, const char *variant, void (*edit)(cJSON *), gerbil_status want,
                          const char *what) {
    CHECK(make_variant(fixture, variant, edit) == 0);
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", tmpdir, variant);
    gerbil_model_t m = NULL;
    gerbil_status st = gerbil_model_load(dir, NULL, &m);
    CHECKF(st == want, "%s: status %d, want %d (%s)", variant, (int)st, (int)want, gerbil_last_error());
    CHECKF(strstr(gerbil_last_error(), what) != NULL, "%s: message lacks \"%s\": %s", variant, what,
           gerbil_last_error());
    gerbil_model_free(m);
}

static void check_logits(const char *fixture, const char *variant) {
    char dir[512], path[512];
    snprintf(dir, sizeof dir, "%s/%s", tmpdir, variant);
    snprintf(path, sizeof path, "tests/fixtures/%s/expected.safetensors", fixture);
    struct st_file e;
    CHECK(st_file_open(path, &e) == GERBIL_OK);
    const struct gb_tensor *ids = st_file_find(&e, "input_ids"), *ref = st_file_find(&e, "logits");
    gerbil_model_t m;
    gerbil_session_t s;
    gerbil_status st = gerbil_model_load(dir, NULL, &m);
    CHECKF(st == GERBIL_OK, "%s: %s", variant, gerbil_last_error());
    if (st != GERBIL_OK) { st_file_close(&e); return; }
    gerbil_session_params sp = gerbil_session_default_params();
    sp.kv_type = GERBIL_KV_F32;
    CHECK(gerbil_session_new(m, &sp, &s) == GERBIL_OK);
    const int n = (int)ids->ne[0], V = (int)ref->ne[1];
    float *lg = malloc((size_t)n * V * sizeof(float));
    CHECK(gerbil_session_eval(s, ids->data, n, lg, 1) == GERBIL_OK);
    float d = 0;
    for (int i = 0; i < n * V; i++) d = fmaxf(d, fabsf(lg[i] - ((const float *)ref->data)[i]));
    CHECKF(d <= 1e-3f, "%s: max |d| = %g", variant, d);
    free(lg);
    gerbil_session_free(s);
    gerbil_model_free(m);
    st_file_close(&e);
}

int main(void) {
    CHECK(mkdtemp(tmpdir) != NULL);
    const char *fx[] = {"llama-rope-linear", "llama-rope-llama3", "llama-rope-yarn", "qwen3-f32"};
    for (int i = 0; i < 4; i++) {
        char out[128];
        snprintf(out, sizeof out, "%s-v4", fx[i]);
        CHECK(make_variant(fx[i], out, to_v4_style) == 0);
        check_logits(fx[i], out);
    }
    CHECK(make_variant("llama-rope-linear", "longrope", to_longrope) == 0);
    char dir[512];
    snprintf(dir, sizeof dir, "%s/longrope", tmpdir);
    gerbil_model_t m;
    CHECK(gerbil_model_load(dir, NULL, &m) == GERBIL_ERR_UNSUPPORTED);
    CHECKF(strstr(gerbil_last_error(), "\"longrope\"") != NULL, "message: %s", gerbil_last_error());
    check_refused("gemma3-f32", "g-act", g_act, GERBIL_ERR_UNSUPPORTED, "hidden_activation \"relu\"");
    check_refused("gemma3-f32", "g-cap", g_cap, GERBIL_ERR_FORMAT, "final_logit_softcapping");
    /* use_bidirectional_attention (EmbeddingGemma) is read now: such a checkpoint loads (tests/test_embed.c
     * checks its numbers against sentence-transformers) */
    CHECK(make_variant("gemma3-f32", "g-bidir", g_bidir) == 0);
    snprintf(dir, sizeof dir, "%s/g-bidir", tmpdir);
    gerbil_model_t mb = NULL;
    CHECKF(gerbil_model_load(dir, NULL, &mb) == GERBIL_OK, "g-bidir: %s", gerbil_last_error());
    gerbil_model_free(mb);
    check_refused("gemma3-f32", "g-rope", g_rope, GERBIL_ERR_FORMAT, "sliding_attention");
    check_refused("gemma3-f32", "g-untied", g_untied, GERBIL_ERR_FORMAT, "missing tensor \"lm_head.weight\"");
    check_refused("gemma3-f32", "g-ffn", g_ffn, GERBIL_ERR_FORMAT, "model.layers.0.mlp.gate_proj.weight");
    check_refused("gemma3-f32", "g-mm", g_mm, GERBIL_ERR_FORMAT, "text_config");
    CHECK(make_variant("gemma4-f32", "g4-released", g4_released) == 0);
    check_logits("gemma4-f32", "g4-released");
    check_refused("gemma4-f32", "g4-moe", g4_moe, GERBIL_ERR_UNSUPPORTED, "enable_moe_block");
    check_refused("gemma4-f32", "g4-bidir", g4_bidir, GERBIL_ERR_UNSUPPORTED, "use_bidirectional_attention = all");
    check_refused("gemma4-f32", "g4-plc", g4_plc, GERBIL_ERR_UNSUPPORTED, "per_layer_config[2].sliding_window");
    check_refused("gemma4-f32", "g4-share", g4_share, GERBIL_ERR_FORMAT, "no earlier layer of its type");
    check_refused("gemma4-f32", "g4-rope", g4_rope, GERBIL_ERR_UNSUPPORTED, "\"longrope\"");
    CHECK(make_variant("lfm2-f32", "lfm2-original", to_lfm2_original) == 0);
    check_logits("lfm2-f32", "lfm2-original");
    CHECK(make_variant("lfm2-f32", "lfm2-rope-per-type", to_lfm2_rope_per_type) == 0);
    check_logits("lfm2-f32", "lfm2-rope-per-type");
    check_refused("lfm2-f32", "lfm2-k1", lfm2_kernel_1, GERBIL_ERR_UNSUPPORTED, "conv_L_cache 1");
    check_refused("lfm2-f32", "lfm2-k4", lfm2_kernel_4, GERBIL_ERR_FORMAT, "model.layers.0.conv.conv.weight");
    check_refused("lfm2-f32", "lfm2-ff256", lfm2_multiple_256, GERBIL_ERR_FORMAT, "feed_forward.w1.weight");
    check_refused("lfm2-f32", "lfm2-idx", lfm2_bad_idx, GERBIL_ERR_FORMAT, "full_attn_idxs");
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    CHECK(system(cmd) == 0);
    return test_done();
}
