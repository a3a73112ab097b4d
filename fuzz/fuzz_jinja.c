/* A chat template SEP messages JSON [SEP tools JSON] -> parse and render as
 * apply_chat_template does (bos/eos tokens set, add_generation_prompt, one variable). */
#include "fuzz_common.h"
#include "gerbil.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *part[3];
    size_t len[3];
    int k = fz_split(data, size, part, len, 3);
    char *src = fz_str(part[0], len[0]);
    char *msgs = k > 1 ? fz_str(part[1], len[1]) : fz_str((const uint8_t *)"[{\"role\": \"user\", \"content\": \"Hi\"}]", 36);
    char *tools = k > 2 ? fz_str(part[2], len[2]) : NULL;
    gerbil_chat_template_t ct = NULL;
    if (gerbil_chat_template_new(src, "<s>", "</s>", &ct) == GERBIL_OK) {
        const char *names[] = {"enable_thinking"}, *values[] = {"false"};
        char *out = NULL;
        if (gerbil_chat_template_apply(ct, msgs, tools, 1, names, values, 1, &out) == GERBIL_OK) free(out);
        gerbil_chat_template_free(ct);
    }
    char *out = NULL;
    if (gerbil_template_render(src, "{\"messages\": [], \"x\": [1, 2.5, \"s\", null, {\"a\": true}]}", &out) == GERBIL_OK)
        free(out);
    free(src);
    free(msgs);
    free(tools);
    return 0;
}
