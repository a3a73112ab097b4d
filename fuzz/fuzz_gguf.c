/* GGUF file -> header validation, model config from the metadata, the tokenizer from
 * tokenizer.ggml.* (encode + decode), and its chat template rendered once. */
#include "fuzz_common.h"
#include "gerbil.h"
#include "io/gguf.h"
#include "model/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct gguf_file f;
    if (gguf_open_memory(data, size, "fuzz.gguf", &f) == GERBIL_OK) gguf_close(&f);
    const char *path = fz_write(0, "m.gguf", data, size);
    if (gguf_open(path, NULL, &f) != GERBIL_OK) return 0;
    struct model_config c;
    if (model_config_from_gguf(&f, path, &c) == GERBIL_OK) model_config_free(&c);
    gguf_close(&f);
    gerbil_tokenizer_t tok = NULL;
    if (gerbil_tokenizer_load_gguf(path, &tok) != GERBIL_OK) return 0;
    static const char text[] = "Hello world! <s> 12345 \xe4\xbd\xa0\xe5\xa5\xbd  \t\n caf\xc3\xa9 \xf0\x9f\x98\x80";
    int32_t *ids = NULL;
    int n = 0;
    if (gerbil_tokenize(tok, text, sizeof text - 1, 1, &ids, &n) == GERBIL_OK) {
        char *out = NULL;
        size_t len;
        if (gerbil_detokenize(tok, ids, n, 0, &out, &len) == GERBIL_OK) free(out);
        free(ids);
    }
    (void)gerbil_tokenizer_max_token_bytes(tok);
    const char *src = gerbil_tokenizer_chat_template(tok, NULL);
    gerbil_chat_template_t ct = NULL;
    if (src && gerbil_chat_template_new(src, "<s>", "</s>", &ct) == GERBIL_OK) {
        char *out = NULL;
        if (gerbil_chat_template_apply(ct, "[{\"role\": \"user\", \"content\": \"Hi\"}]", NULL, 1, NULL, NULL, 0, &out) ==
            GERBIL_OK)
            free(out);
        gerbil_chat_template_free(ct);
    }
    gerbil_tokenizer_free(tok);
    return 0;
}
