/* tokenizer.json SEP tokenizer_config.json SEP text -> load (every model, normalizer,
 * pre-tokenizer, post-processor, decoder, added tokens), encode the text with and without
 * special tokens, decode the ids (also with skip_special), and stream-detokenize them. */
#include "fuzz_common.h"
#include "gerbil.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *part[3];
    size_t len[3];
    int k = fz_split(data, size, part, len, 3);
    fz_write(0, "tokenizer.json", part[0], len[0]);
    if (k > 1) fz_write(1, "tokenizer_config.json", part[1], len[1]);
    else fz_remove("tokenizer_config.json");
    gerbil_tokenizer_t tok = NULL;
    if (gerbil_tokenizer_load(fz_dir(), &tok) != GERBIL_OK) return 0;
    static const char def[] = "Hello world! 12345 <s>  caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd\xff";
    const char *text = k > 2 ? (const char *)part[2] : def;
    const size_t n_text = k > 2 ? len[2] : sizeof def - 1;
    for (int special = 0; special < 2; special++) {
        int32_t *ids = NULL;
        int n = 0;
        if (gerbil_tokenize(tok, text, n_text, special, &ids, &n) != GERBIL_OK) continue;
        const int nv = gerbil_tokenizer_n_vocab(tok);
        for (int i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= nv) abort(); /* every id the encoder gives is in the vocabulary */
        char *out = NULL;
        size_t olen;
        if (gerbil_detokenize(tok, ids, n, special, &out, &olen) == GERBIL_OK) free(out);
        gerbil_detok_t dt = NULL;
        if (gerbil_detok_new(tok, special, &dt) == GERBIL_OK) {
            for (int i = 0; i < n; i++) {
                const char *piece;
                size_t plen;
                if (gerbil_detok_push(dt, ids[i], &piece, &plen) != GERBIL_OK) break;
            }
            gerbil_detok_free(dt);
        }
        free(ids);
    }
    (void)gerbil_tokenizer_max_token_bytes(tok);
    gerbil_tokenizer_free(tok);
    return 0;
}
