/* Golden tests for quantized checkpoints (fixtures from scripts/gen_quant_fixtures.py):
 * MLX affine 4/8-bit safetensors folders and GGUF files of every supported type. The
 * reference is transformers run in f32 on the DEQUANTIZED weights.
 *  - reference kernels (f32 activations): every format within 1e-4 and the greedy
 *    continuation identical: the dequantizers, the GGUF/MLX loaders and the
 *    interleaved RoPE of permuted llama q/k are exact.
 *  - fast kernels: float formats keep f32 activations and MLX quantizes them to
 *    16-bit blocks: within 2e-2 x RMS of the reference logits (the bound),
 *    top-1 identical everywhere, greedy identical. GGUF
 *    quantized formats quantize activations to 8-bit blocks (as llama.cpp does): on
 *    these deliberately hot random-weight models that moves logits by up to ~0.15 x
 *    RMS, so the bound is 0.2 x RMS, top-1 must agree wherever the reference's top-2
 *    margin exceeds twice the observed error, and greedy must agree until a step
 *    whose reference margin is that close.
 * The prompt's logits are checked twice: from one call with the prefill GEMMs forced
 * for any length (where the CPU has AVX512-BF16; by default prompts of 48 or more tokens
 * take them: bf16 for GGML types, 16-bit integers for MLX) and from one token per call (the
 * per-token kernels, which also make the greedy continuation); "observed error" is the
 * larger of the two.
 * GERBIL_TEST_BACKEND=cuda (or cuda:N): each fixture once on that backend, held to the
 * reference kernels' bounds (f32 activations, exact dequantization); skips (77) without a GPU. */
#include "gerbil.h"
#include "backend/cpu/gemm_avx512.h"
#include "io/safetensors.h"
#include "test.h"

#include <math.h>
#include <string.h>
#include <sys/stat.h>

static const char *test_backend; /* $GERBIL_TEST_BACKEND (NULL: the CPU) */

static const char *fixtures[] = {
    "qwen3-mlx4", "qwen3-mlx8", "llama-mlx4", "qwen35-mlx4", "qwen3next-mlx4", "lfm2-mlx4",
    "qwen3-gguf-f32", "qwen3-gguf-f16", "qwen3-gguf-bf16", "qwen3-gguf-q8_0", "qwen3-gguf-q4_0",
    "qwen3-gguf-q4_1", "qwen3-gguf-q5_0", "qwen3-gguf-q5_1", "qwen3-gguf-q2_k", "qwen3-gguf-q3_k",
    "qwen3-gguf-q4_k", "qwen3-gguf-q5_k", "qwen3-gguf-q6_k", "qwen3-gguf-q4_k_m",
    "llama-gguf-q8_0", "llama-gguf-q4_k", "qwen2-gguf-q8_0",
    "gemma3-mlx4", "gemma3-gguf-q8_0", "gemma3-gguf-q4_k",
    "lfm2-gguf-bf16", "lfm2-gguf-q8_0",
    "gemma4-mlx4", "gemma4-gguf-f32", "gemma4-kv-gguf-f32",
};

static int argmax(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

/* mmap: weights read in place from the file (MLX: in MLX's own code order; loaded
 * copies of 4-bit MLX weights are packed for the AVX-512 kernels where the CPU has them) */
static void test_fixture(const char *name, int reference, int mmap) {
    char dir[256], model[300], path[300];
    snprintf(dir, sizeof dir, "tests/fixtures/%s", name);
    snprintf(model, sizeof model, "%s/model.gguf", dir);
    struct stat st;
    if (stat(model, &st) != 0) snprintf(model, sizeof model, "%s", dir); /* MLX: the folder */
    snprintf(path, sizeof path, "%s/expected.safetensors", dir);
    struct st_file e;
    if (st_file_open(path, &e) != GERBIL_OK) { CHECKF(0, "%s: %s", name, gerbil_last_error()); return; }
    const struct gb_tensor *ids = st_file_find(&e, "input_ids"), *ref = st_file_find(&e, "logits"),
                           *greedy = st_file_find(&e, "greedy_ids"), *margin = st_file_find(&e, "greedy_margin");
    if (!ids || !ref || !greedy || !margin) { CHECKF(0, "%s: expected.safetensors incomplete", name); st_file_close(&e); return; }
    const int T = (int)ids->ne[0], V = (int)ref->ne[1], G = (int)greedy->ne[0];
    const float *R = ref->data;

    gerbil_model_params mp = gerbil_model_default_params();
    mp.n_threads = 2;
    mp.reference_kernels = reference && !test_backend;
    mp.backend = test_backend;
    mp.use_mmap = mmap;
    /* 8-bit activation blocks are used for GGUF block types only */
    const int act_quant = !reference && strstr(name, "gguf") && !strstr(name, "f32") && !strstr(name, "f16");
    gerbil_model_t m;
    gerbil_status s = gerbil_model_load(model, &mp, &m);
    CHECKF(s == GERBIL_OK, "%s: load: %s", name, gerbil_last_error());
    if (s != GERBIL_OK) { st_file_close(&e); return; }
    gerbil_session_params sp = gerbil_session_default_params();
    sp.kv_type = GERBIL_KV_F32;
    gerbil_session_t sess;
    CHECK(gerbil_session_new(m, &sp, &sess) == GERBIL_OK);
    float *lg = malloc((size_t)T * V * sizeof(float));
    qmatmul_set_gemm_min_tok(1); /* the prompt through the prefill GEMMs, however short */
    CHECK(gerbil_session_eval(sess, ids->data, T, lg, 1) == GERBIL_OK);
    qmatmul_set_gemm_min_tok(-1);

    /* the prompt again one token per call: decode's kernels (the prompt may have gone
     * through the bf16 prefill GEMM instead) */
    float *lg1 = malloc((size_t)T * V * sizeof(float));
    gerbil_session_reset(sess);
    for (int t = 0; t < T; t++)
        CHECK(gerbil_session_eval(sess, (const int32_t *)ids->data + t, 1, lg1 + (size_t)t * V, 0) == GERBIL_OK);

    double ss = 0;
    for (int i = 0; i < T * V; i++) ss += (double)R[i] * R[i];
    const float rms = (float)sqrt(ss / (T * V));
    float d = 0, d1 = 0;
    for (int i = 0; i < T * V; i++) {
        d = fmaxf(d, fabsf(lg[i] - R[i]));
        d1 = fmaxf(d1, fabsf(lg1[i] - R[i]));
    }
    const float bound = reference ? 1e-4f : act_quant ? 0.2f * rms : 2e-2f * rms;
    CHECKF(d <= bound, "%s%s: max |logit - reference| = %g > %g (rms %g)", name, reference ? " (reference)" : "",
           d, bound, rms);
    CHECKF(d1 <= bound, "%s%s: one token per call: max |logit - reference| = %g > %g (rms %g)", name,
           reference ? " (reference)" : "", d1, bound, rms);
    /* reference margins closer than this may flip */
    const float decidable = act_quant ? 2 * fmaxf(d, d1) : 0;
    int top1_bad = 0;
    for (int t = 0; t < T; t++) {
        const float *r = R + (size_t)t * V;
        int a = argmax(r, V);
        float second = -INFINITY;
        for (int i = 0; i < V; i++)
            if (i != a && r[i] > second) second = r[i];
        top1_bad += (argmax(lg + (size_t)t * V, V) != a || argmax(lg1 + (size_t)t * V, V) != a) && r[a] - second > decidable;
    }
    CHECKF(top1_bad == 0, "%s: top-1 differs from the reference at %d of %d positions", name, top1_bad, T);
    free(lg1);

    /* greedy, compared until the reference itself is too close to call */
    gerbil_session_reset(sess);
    gerbil_sampler_params smp = gerbil_sampler_default_params();
    smp.temperature = 0;
    gerbil_sampler_t sampler;
    CHECK(gerbil_sampler_new(&smp, V, &sampler) == GERBIL_OK);
    gerbil_generate_params gp = gerbil_generate_default_params();
    gp.max_tokens = G;
    gp.ignore_eos = 1;
    int32_t out[64];
    gerbil_generate_result res;
    CHECK(gerbil_generate(sess, sampler, ids->data, T, &gp, out, &res) == GERBIL_OK);
    const int32_t *want = greedy->data;
    const float *mg = margin->data;
    int same = 0;
    while (same < G && out[same] == want[same]) same++;
    CHECKF(same == G || (act_quant && mg[same] < decidable), "%s: greedy token %d is %d, reference %d (reference margin %g)",
           name, same, same < G ? out[same] : -1, same < G ? want[same] : -1, same < G ? mg[same] : 0);
    printf("%-20s %-9s max|d| %.3g, one token per call %.3g (rms %.3g), greedy %d/%d identical\n", name,
           test_backend ? test_backend : reference ? "reference" : mmap ? "fast mmap" : "fast", d, d1, rms, same, G);
    gerbil_sampler_free(sampler);
    free(lg);
    gerbil_session_free(sess);
    gerbil_model_free(m);
    st_file_close(&e);
}

int main(int argc, char **argv) {
    test_backend = getenv("GERBIL_TEST_BACKEND");
    if (test_backend && !*test_backend) test_backend = NULL;
    if (test_backend && !strncmp(test_backend, "cuda", 4) && gerbil_gpu_count() == 0)
        SKIP("GERBIL_TEST_BACKEND=%s: no CUDA device in this build or machine", test_backend);
    for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++)
        if (test_backend && (argc < 2 || strstr(fixtures[i], argv[1]))) test_fixture(fixtures[i], 1, 0);
        else if (argc < 2 || strstr(fixtures[i], argv[1])) {
            test_fixture(fixtures[i], 1, 0);
            test_fixture(fixtures[i], 0, 0);
            if (strstr(fixtures[i], "mlx4")) test_fixture(fixtures[i], 0, 1);
        }
    return test_done();
}
