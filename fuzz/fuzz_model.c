/* A one-layer llama model behind the GGUF loader, its weights taken from the input (any
 * bits: NaN, Inf, denormals, hostile block scales), run through the forward pass, the
 * sampler and the generation loop. Input: 4 control bytes (matrix type, vector type,
 * backend, RoPE base), then the bytes the weights are filled with (repeated as needed). */
#include "fuzz_common.h"
#include "gerbil.h"
#include "io/gguf_write.h"
#include "tensor/dtype.h"

#include <math.h>

enum { V = 32, D = 32, F = 64, NH = 2, NKV = 1, HD = 16 };

static const uint8_t *src_;
static size_t src_n_, src_at_;

static void fill(uint8_t *dst, size_t n) {
    for (size_t i = 0; i < n; i++) {
        dst[i] = src_n_ ? src_[src_at_] : 0;
        if (src_n_ && ++src_at_ == src_n_) src_at_ = 0;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const enum gb_type mats[] = {GB_TYPE_F32, GB_TYPE_F16, GB_TYPE_BF16, GB_TYPE_Q8_0,
                                        GB_TYPE_Q4_0, GB_TYPE_Q4_1, GB_TYPE_Q5_0, GB_TYPE_Q5_1};
    static const enum gb_type vecs[] = {GB_TYPE_F32, GB_TYPE_F16, GB_TYPE_BF16};
    static const float bases[] = {10000.0f, 1e6f, 1.5f, 3e38f};
    if (size < 4) return 0;
    const enum gb_type mt = mats[data[0] % 8], vt = vecs[data[1] % 3];
    const int ref = data[2] & 1;
    const float base = bases[data[3] % 4];
    src_ = data + 4;
    src_n_ = size - 4;
    src_at_ = 0;

    struct { const char *name; int vec; int64_t rows, cols; } ts[] = {
        {"token_embd.weight", 0, V, D},       {"output_norm.weight", 1, 1, D},
        {"blk.0.attn_norm.weight", 1, 1, D},  {"blk.0.attn_q.weight", 0, NH * HD, D},
        {"blk.0.attn_k.weight", 0, NKV * HD, D}, {"blk.0.attn_v.weight", 0, NKV * HD, D},
        {"blk.0.attn_output.weight", 0, D, NH * HD}, {"blk.0.ffn_norm.weight", 1, 1, D},
        {"blk.0.ffn_gate.weight", 0, F, D},   {"blk.0.ffn_up.weight", 0, F, D},
        {"blk.0.ffn_down.weight", 0, D, F},
    };
    enum { NT = sizeof ts / sizeof ts[0] };
    uint8_t *buf[NT] = {0};
    struct gguf_writer *w;
    if (gguf_writer_new(&w) != GERBIL_OK) abort();
    gguf_writer_add_str(w, "general.architecture", "llama");
    gguf_writer_add_u32(w, "llama.embedding_length", D);
    gguf_writer_add_u32(w, "llama.block_count", 1);
    gguf_writer_add_u32(w, "llama.feed_forward_length", F);
    gguf_writer_add_u32(w, "llama.attention.head_count", NH);
    gguf_writer_add_u32(w, "llama.attention.head_count_kv", NKV);
    gguf_writer_add_u32(w, "llama.context_length", 64);
    gguf_writer_add_f32(w, "llama.rope.freq_base", base);
    gguf_writer_add_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-6f);
    for (int i = 0; i < NT; i++) {
        const enum gb_type t = ts[i].vec ? vt : mt;
        const size_t nb = (size_t)ts[i].rows * type_row_size(t, ts[i].cols);
        buf[i] = malloc(nb);
        if (!buf[i]) abort();
        fill(buf[i], nb);
        if (ts[i].vec)
            gguf_writer_add_tensor(w, ts[i].name, t, 1, (int64_t[]){ts[i].cols}, buf[i], nb);
        else
            gguf_writer_add_tensor(w, ts[i].name, t, 2, (int64_t[]){ts[i].rows, ts[i].cols}, buf[i], nb);
    }
    char path[160];
    snprintf(path, sizeof path, "%s/m.gguf", fz_dir());
    gerbil_status st = gguf_writer_write(w, path);
    gguf_writer_free(w);
    for (int i = 0; i < NT; i++) free(buf[i]);
    if (st != GERBIL_OK) return 0;

    gerbil_model_params mp = gerbil_model_default_params();
    mp.n_threads = 1;
    mp.use_mmap = 1;
    mp.backend = ref ? "ref" : "cpu";
    gerbil_model_t m = NULL;
    if (gerbil_model_load(path, &mp, &m) != GERBIL_OK) return 0;
    gerbil_session_params sp = gerbil_session_default_params();
    sp.n_ctx = 16;
    gerbil_session_t s = NULL;
    if (gerbil_session_new(m, &sp, &s) == GERBIL_OK) {
        gerbil_sampler_params p = gerbil_sampler_default_params();
        p.temperature = (data[2] & 2) ? 0.0f : 0.8f;
        p.top_k = data[2] >> 4;
        p.repetition_penalty = (data[2] & 4) ? 1.3f : 1.0f;
        gerbil_sampler_t sm = NULL;
        if (gerbil_sampler_new(&p, V, &sm) == GERBIL_OK) {
            const int32_t prompt[] = {1, (int32_t)(data[3] % V), 7, 30};
            int32_t out[4];
            gerbil_generate_params gp = gerbil_generate_default_params();
            gp.max_tokens = 3;
            gerbil_generate_result res;
            if (gerbil_generate(s, sm, prompt, 4, &gp, out, &res) == GERBIL_OK)
                for (int i = 0; i < res.n_generated; i++)
                    if (out[i] < 0 || out[i] >= V) abort();
            gerbil_sampler_free(sm);
        }
        gerbil_session_free(s);
    }
    gerbil_model_free(m);
    return 0;
}
