/* config.json [SEP generation_config.json] -> struct model_config (every architecture's
 * fields, RoPE variants, layer types, MLX quantization, special ids). */
#include "fuzz_common.h"
#include "gerbil.h"
#include "model/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *part[2];
    size_t len[2];
    int k = fz_split(data, size, part, len, 2);
    fz_write(0, "config.json", part[0], len[0]);
    if (k > 1) fz_write(1, "generation_config.json", part[1], len[1]);
    else fz_remove("generation_config.json");
    struct model_config c;
    if (model_config_load(fz_dir(), &c) == GERBIL_OK) {
        /* what the loader then indexes with the config's numbers */
        for (int l = 0; l < c.n_layer; l++)
            if (c.layer_kind[l] > LAYER_SHORTCONV || c.layer_sliding[l] > 1 || (c.layer_moe && c.layer_moe[l] > 1))
                abort();
        /* Gemma 4's full layers have their own head_dim (head_dim_full), rotated by c.rope */
        const int widest = c.head_dim_full > c.head_dim ? c.head_dim_full : c.head_dim;
        if (c.n_eos < 0 || c.n_eos > MODEL_MAX_EOS || c.sliding_window < 0 || c.rope.n_dims > widest ||
            (c.has_rope_local && c.rope_local.n_dims > c.head_dim))
            abort();
        model_config_free(&c);
    }
    return 0;
}
