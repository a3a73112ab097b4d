/* End to end on a real trained model: Karpathy's stories260K (Llama architecture,
 * GQA, tied embeddings), both in its Hugging Face layout and as GGUF (llama.cpp's
 * layout: interleaved RoPE), must reproduce llama2.c's published greedy outputs token
 * for token. Skips when ../shared/data is absent. */
#include "gerbil.h"
#include "io/json.h"
#include "test.h"

#include <string.h>
#include <sys/stat.h>

#define DATA "../shared/data/models/stories260K"

static int read_ids(const cJSON *root, const char *key, int32_t *out, int cap) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(root, key);
    int n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, a) {
        if (n < cap) out[n] = (int32_t)e->valuedouble;
        n++;
    }
    return n;
}

/* Greedy from prompt; expected = what llama2.c prints after BOS (prompt tokens past
 * BOS first, then the generated ones). */
static void check_case(gerbil_model_t m, const char *file, const char *prompt_key, const char *out_key) {
    char path[512];
    snprintf(path, sizeof path, DATA "/expected/%s", file);
    cJSON *root;
    if (json_load_file(path, &root) != GERBIL_OK) { CHECKF(0, "%s", gerbil_last_error()); return; }
    int32_t prompt[64], want[512], got[512];
    int n_prompt = read_ids(root, prompt_key, prompt, 64);
    int n_want = read_ids(root, out_key, want, 512);
    cJSON_Delete(root);
    CHECK(n_prompt >= 1 && n_prompt <= 64 && n_want > n_prompt && n_want <= 512);
    int n_echo = n_prompt - 1; /* prompt tokens after BOS that the expected list starts with */
    CHECK(memcmp(want, prompt + 1, (size_t)n_echo * sizeof(int32_t)) == 0);

    gerbil_session_t s;
    gerbil_sampler_t smp;
    gerbil_sampler_params sp = gerbil_sampler_default_params();
    sp.temperature = 0;
    CHECK(gerbil_session_new(m, NULL, &s) == GERBIL_OK);
    CHECK(gerbil_sampler_new(&sp, gerbil_model_n_vocab(m), &smp) == GERBIL_OK);
    gerbil_generate_params gp = gerbil_generate_default_params();
    gp.max_tokens = n_want - n_echo;
    gp.ignore_eos = 1; /* llama2.c's run.c stops on BOS only */
    gerbil_generate_result res;
    CHECK(gerbil_generate(s, smp, prompt, n_prompt, &gp, got, &res) == GERBIL_OK);
    CHECK(res.n_generated == n_want - n_echo);
    int first_bad = -1;
    for (int i = 0; i < res.n_generated && first_bad < 0; i++)
        if (got[i] != want[n_echo + i]) first_bad = i;
    CHECKF(first_bad < 0, "%s: generated token %d is %d, llama2.c gives %d", file, first_bad,
           first_bad >= 0 ? got[first_bad] : 0, first_bad >= 0 ? want[n_echo + first_bad] : 0);
    printf("%s: %d tokens identical\n", file, res.n_generated);
    gerbil_sampler_free(smp);
    gerbil_session_free(s);
}

int main(void) {
    struct stat st;
    if (stat(DATA "/hf/model.safetensors", &st) != 0) SKIP("%s not found (shared test data absent)", DATA);
    for (int run = 0; run < 3; run++) {
        const int threads = run == 1 ? 2 : 1;
        const char *path = run < 2 ? DATA "/hf" : DATA "/gguf/stories260K-f32.gguf";
        gerbil_model_params mp = gerbil_model_default_params();
        mp.n_threads = threads;
        gerbil_model_t m;
        gerbil_status s = gerbil_model_load(path, &mp, &m);
        CHECKF(s == GERBIL_OK, "%s", gerbil_last_error());
        if (s != GERBIL_OK) break;
        check_case(m, "greedy_from_bos_256.json", "start_ids", "output_ids");
        check_case(m, "greedy_from_bos_200_llama2c_test_all.json", "start_ids", "output_ids");
        check_case(m, "prompt_Once_upon_a_time_steps64.json", "prompt_ids_with_bos", "output_ids_after_bos");
        check_case(m, "prompt_Zoo_steps60.json", "prompt_ids_with_bos", "output_ids_after_bos");
        gerbil_model_free(m);
    }
    return test_done();
}
