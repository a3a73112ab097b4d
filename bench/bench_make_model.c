/* bench_make_model: write a random-weight Hugging Face model folder (config.json,
 * generation_config.json, model.safetensors) so speed can be measured without
 * downloading weights. The numbers it produces are meaningless as text; the shapes,
 * dtypes and byte counts are those of the real model, which is all a speed
 * benchmark reads.
 *
 *   bench_make_model OUT_DIR [--shape qwen3-0.6b|qwen3.5-0.8b|tiny|tiny-hybrid] [--dtype bf16|f16|f32] [--seed N]
 *
 * Weights are approximately N(0, 0.02) (Irwin-Hall sum of four uniforms, rescaled),
 * norm weights are 1.0 (Qwen3.5's zero-centred norms 0.0, its A_log and dt_bias small
 * constants). Each tensor draws from its own stream seeded by (seed, tensor
 * index), so the output is a pure function of the arguments. The safetensors file is
 * written to a temporary name and renamed at the end, so an interrupted run never
 * leaves a folder that looks complete. */
#include "base/fp16.h"

#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

struct shape {
    const char *name;
    int hidden, ff, layers, heads, kv_heads, head_dim, vocab, max_pos;
    double rope_theta;
    int bos, eos;
    /* Qwen3.5 hybrids: Gated DeltaNet layers except every full_every-th (0: none) */
    int full_every, lin_k_heads, lin_v_heads, lin_k_dim, lin_v_dim, conv_k;
};

static const struct shape shapes[] = {
    {"qwen3-0.6b", 1024, 3072, 28, 16, 8, 128, 151936, 40960, 1000000.0, 151643, 151645, 0, 0, 0, 0, 0, 0},
    /* Qwen/Qwen3.5-0.8B's text model: 18 DeltaNet + 6 gated-attention layers */
    {"qwen3.5-0.8b", 1024, 3584, 24, 8, 2, 256, 248320, 262144, 10000000.0, 248044, 248046, 4, 16, 16, 128, 128, 4},
    {"tiny", 64, 128, 2, 4, 2, 16, 256, 2048, 1000000.0, 1, 2, 0, 0, 0, 0, 0, 0},
    /* a Qwen3.5 hybrid whose rows are whole k-quant super-blocks (256): tests quantize it to Q4_K */
    {"tiny-hybrid", 256, 512, 4, 4, 2, 64, 256, 2048, 1000000.0, 1, 2, 2, 2, 4, 64, 64, 4},
};

enum wdtype { W_BF16, W_F16, W_F32 };
static const char *st_dtype_name[] = {"BF16", "F16", "F32"};
static const char *hf_dtype_name[] = {"bfloat16", "float16", "float32"};
static const int dtype_size[] = {2, 2, 4};

/* One tensor of the output file. */
struct tdesc {
    char name[96];
    int ndim;
    int64_t dims[3];
    int is_norm; /* filled with the constant `value` instead of noise */
    float value;
    uint64_t off0, off1;
};

/* splitmix64: a 64-bit state, one multiply-xorshift chain per output; plenty for
 * filler weights and fast enough that the disk is the bottleneck. */
static inline uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Four 16-bit uniforms summed: mean 2, variance 1/3 in units of 65536. Scale so the
 * result has standard deviation 0.02: (sum/65536 - 2) * sqrt(3) * 0.02. */
static inline float gauss_approx(uint64_t r) {
    uint32_t s = (uint32_t)(r & 0xffff) + (uint32_t)((r >> 16) & 0xffff) + (uint32_t)((r >> 32) & 0xffff) +
                 (uint32_t)(r >> 48);
    return ((float)s * (1.0f / 65536.0f) - 2.0f) * (1.7320508f * 0.02f);
}

static void fill(void *buf, size_t n, enum wdtype dt, int is_norm, float value, uint64_t *rng) {
    for (size_t i = 0; i < n; i++) {
        float v = is_norm ? value : gauss_approx(splitmix64(rng));
        switch (dt) {
        case W_BF16: ((uint16_t *)buf)[i] = f32_to_bf16(v); break;
        case W_F16: ((uint16_t *)buf)[i] = f32_to_f16(v); break;
        case W_F32: ((float *)buf)[i] = v; break;
        }
    }
}

static int mkdir_p(const char *path) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp) return -1;
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, 0755) && errno != EEXIST) return -1;
        *p = '/';
    }
    if (mkdir(tmp, 0755) && errno != EEXIST) return -1;
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* d1, d2 = 0: fewer dims. is_norm: every element = value. */
static int add_tensor3(struct tdesc *t, int *n, int cap, const char *name, int64_t d0, int64_t d1, int64_t d2,
                       int is_norm, float value) {
    if (*n >= cap) return -1;
    struct tdesc *e = &t[(*n)++];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", name);
    e->ndim = d2 > 0 ? 3 : d1 > 0 ? 2 : 1;
    e->dims[0] = d0;
    e->dims[1] = d1;
    e->dims[2] = d2;
    e->is_norm = is_norm;
    e->value = value;
    return 0;
}

static int add_tensor(struct tdesc *t, int *n, int cap, const char *name, int64_t d0, int64_t d1, int is_norm) {
    return add_tensor3(t, n, cap, name, d0, d1, 0, is_norm, 1.0f);
}

static int write_text(const char *dir, const char *file, const char *text) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "w");
    if (!f) { fprintf(stderr, "bench_make_model: %s: %s\n", path, strerror(errno)); return -1; }
    fputs(text, f);
    if (fclose(f)) { fprintf(stderr, "bench_make_model: %s: write failed\n", path); return -1; }
    return 0;
}

static void usage(FILE *f) {
    fprintf(f, "usage: bench_make_model OUT_DIR [--shape qwen3-0.6b|qwen3.5-0.8b|tiny|tiny-hybrid] [--dtype bf16|f16|f32] [--seed N]\n"
               "Writes config.json, generation_config.json and model.safetensors with random weights.\n");
}

int main(int argc, char **argv) {
    const char *out = NULL;
    const struct shape *sh = &shapes[0];
    enum wdtype dt = W_BF16;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        if (!strcmp(a, "--shape") || !strcmp(a, "--dtype") || !strcmp(a, "--seed")) {
            if (i + 1 >= argc) { fprintf(stderr, "bench_make_model: %s needs a value\n", a); return 2; }
            const char *v = argv[++i];
            if (!strcmp(a, "--shape")) {
                sh = NULL;
                for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
                    if (!strcmp(v, shapes[k].name)) sh = &shapes[k];
                if (!sh) { fprintf(stderr, "bench_make_model: unknown shape \"%s\"\n", v); return 2; }
            } else if (!strcmp(a, "--dtype")) {
                if (!strcmp(v, "bf16")) dt = W_BF16;
                else if (!strcmp(v, "f16")) dt = W_F16;
                else if (!strcmp(v, "f32")) dt = W_F32;
                else { fprintf(stderr, "bench_make_model: unknown dtype \"%s\"\n", v); return 2; }
            } else {
                char *end;
                errno = 0;
                unsigned long long s = strtoull(v, &end, 10);
                if (errno || end == v || *end) { fprintf(stderr, "bench_make_model: bad seed \"%s\"\n", v); return 2; }
                seed = s;
            }
            continue;
        }
        if (a[0] == '-' || out) { fprintf(stderr, "bench_make_model: unexpected argument \"%s\"\n", a); usage(stderr); return 2; }
        out = a;
    }
    if (!out) { usage(stderr); return 2; }
    if (mkdir_p(out)) { fprintf(stderr, "bench_make_model: cannot create %s: %s\n", out, strerror(errno)); return 1; }

    /* ---- tensor list, in the order HF writes them (sorted by name is not required) */
    const int D = sh->hidden, F = sh->ff, H = sh->heads, KV = sh->kv_heads, hd = sh->head_dim;
    int cap = 2 + 16 * sh->layers, nt = 0;
    const float norm1 = sh->full_every ? 0.0f : 1.0f; /* Qwen3.5 norms multiply by 1 + w */
    struct tdesc *t = calloc((size_t)cap, sizeof *t);
    if (!t) { fprintf(stderr, "bench_make_model: out of memory\n"); return 1; }
    char nm[96];
    add_tensor(t, &nt, cap, "model.embed_tokens.weight", sh->vocab, D, 0);
    for (int l = 0; l < sh->layers; l++) {
#define T(suffix, d0, d1, norm)                                          \
    snprintf(nm, sizeof nm, "model.layers.%d.%s", l, suffix);            \
    add_tensor(t, &nt, cap, nm, d0, d1, norm)
        const int linear = sh->full_every && (l + 1) % sh->full_every;
        snprintf(nm, sizeof nm, "model.layers.%d.input_layernorm.weight", l);
        add_tensor3(t, &nt, cap, nm, D, 0, 0, 1, norm1);
        if (linear) {
            const int64_t kd = (int64_t)sh->lin_k_heads * sh->lin_k_dim, vd = (int64_t)sh->lin_v_heads * sh->lin_v_dim;
            T("linear_attn.in_proj_qkv.weight", 2 * kd + vd, D, 0);
            T("linear_attn.in_proj_z.weight", vd, D, 0);
            T("linear_attn.in_proj_b.weight", sh->lin_v_heads, D, 0);
            T("linear_attn.in_proj_a.weight", sh->lin_v_heads, D, 0);
            snprintf(nm, sizeof nm, "model.layers.%d.linear_attn.conv1d.weight", l);
            add_tensor3(t, &nt, cap, nm, 2 * kd + vd, 1, sh->conv_k, 0, 0);
            snprintf(nm, sizeof nm, "model.layers.%d.linear_attn.A_log", l);
            add_tensor3(t, &nt, cap, nm, sh->lin_v_heads, 0, 0, 1, -1.0f);
            snprintf(nm, sizeof nm, "model.layers.%d.linear_attn.dt_bias", l);
            add_tensor3(t, &nt, cap, nm, sh->lin_v_heads, 0, 0, 1, 0.5f);
            T("linear_attn.norm.weight", sh->lin_v_dim, 0, 1);
            T("linear_attn.out_proj.weight", D, vd, 0);
        } else {
            T("self_attn.q_proj.weight", (int64_t)H * hd * (sh->full_every ? 2 : 1), D, 0);
            T("self_attn.k_proj.weight", (int64_t)KV * hd, D, 0);
            T("self_attn.v_proj.weight", (int64_t)KV * hd, D, 0);
            T("self_attn.o_proj.weight", D, (int64_t)H * hd, 0);
            snprintf(nm, sizeof nm, "model.layers.%d.self_attn.q_norm.weight", l);
            add_tensor3(t, &nt, cap, nm, hd, 0, 0, 1, norm1);
            snprintf(nm, sizeof nm, "model.layers.%d.self_attn.k_norm.weight", l);
            add_tensor3(t, &nt, cap, nm, hd, 0, 0, 1, norm1);
        }
        snprintf(nm, sizeof nm, "model.layers.%d.post_attention_layernorm.weight", l);
        add_tensor3(t, &nt, cap, nm, D, 0, 0, 1, norm1);
        T("mlp.gate_proj.weight", F, D, 0);
        T("mlp.up_proj.weight", F, D, 0);
        T("mlp.down_proj.weight", D, F, 0);
#undef T
    }
    add_tensor3(t, &nt, cap, "model.norm.weight", D, 0, 0, 1, norm1);

    uint64_t off = 0, n_params = 0;
    for (int i = 0; i < nt; i++) {
        uint64_t n = (uint64_t)t[i].dims[0];
        for (int d = 1; d < t[i].ndim; d++) n *= (uint64_t)t[i].dims[d];
        t[i].off0 = off;
        off += n * (uint64_t)dtype_size[dt];
        t[i].off1 = off;
        n_params += n;
    }
    const uint64_t data_bytes = off;

    /* ---- safetensors header: JSON padded with spaces to a multiple of 8 */
    size_t hcap = 256 + (size_t)nt * 200, hlen = 0;
    char *hdr = malloc(hcap);
    if (!hdr) { fprintf(stderr, "bench_make_model: out of memory\n"); return 1; }
    hlen += (size_t)snprintf(hdr + hlen, hcap - hlen, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < nt; i++) {
        hlen += (size_t)snprintf(hdr + hlen, hcap - hlen, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%" PRId64, t[i].name,
                                 st_dtype_name[dt], t[i].dims[0]);
        for (int d = 1; d < t[i].ndim; d++) hlen += (size_t)snprintf(hdr + hlen, hcap - hlen, ",%" PRId64, t[i].dims[d]);
        hlen += (size_t)snprintf(hdr + hlen, hcap - hlen, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", t[i].off0,
                                 t[i].off1);
    }
    hlen += (size_t)snprintf(hdr + hlen, hcap - hlen, "}");
    while (hlen % 8) hdr[hlen++] = ' ';
    if (hlen >= hcap) { fprintf(stderr, "bench_make_model: header overflow\n"); return 1; }

    char path[4200], tmp_path[4300];
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    snprintf(tmp_path, sizeof tmp_path, "%s.tmp", path);
    FILE *f = fopen(tmp_path, "wb");
    if (!f) { fprintf(stderr, "bench_make_model: %s: %s\n", tmp_path, strerror(errno)); return 1; }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    int ok = fwrite(len8, 1, 8, f) == 8 && fwrite(hdr, 1, hlen, f) == hlen;

    fprintf(stderr, "bench_make_model: %s, %d tensors, %.1f M params, %.2f GB %s -> %s\n", sh->name, nt,
            n_params / 1e6, data_bytes / 1e9, st_dtype_name[dt], path);

    /* ---- data: generate into a 16 MiB buffer and write it in one fwrite */
    const size_t chunk_elems = (size_t)16 << 20 >> (dt == W_F32 ? 2 : 1);
    void *buf = malloc(chunk_elems * (size_t)dtype_size[dt]);
    if (!buf) { fprintf(stderr, "bench_make_model: out of memory\n"); return 1; }
    double t0 = now_s(), last = t0;
    uint64_t written = 0;
    for (int i = 0; i < nt && ok; i++) {
        uint64_t rng = seed * 0x100000001b3ull + (uint64_t)i * 0x9e3779b97f4a7c15ull;
        uint64_t n = (t[i].off1 - t[i].off0) / (uint64_t)dtype_size[dt];
        while (n > 0 && ok) {
            size_t k = n < chunk_elems ? (size_t)n : chunk_elems;
            fill(buf, k, dt, t[i].is_norm, t[i].value, &rng);
            ok = fwrite(buf, (size_t)dtype_size[dt], k, f) == k;
            n -= k;
            written += (uint64_t)k * (uint64_t)dtype_size[dt];
            double now = now_s();
            if (now - last > 1.0) {
                fprintf(stderr, "  %5.1f%%  %.2f / %.2f GB  %.0f MB/s\n", 100.0 * written / data_bytes, written / 1e9,
                        data_bytes / 1e9, written / 1e6 / (now - t0));
                last = now;
            }
        }
    }
    free(buf);
    if (fclose(f)) ok = 0;
    if (!ok) {
        fprintf(stderr, "bench_make_model: writing %s failed: %s\n", tmp_path, strerror(errno));
        remove(tmp_path);
        return 1;
    }

    /* ---- config.json / generation_config.json */
    char cfg[4096];
    size_t c = 0;
    if (sh->full_every) {
        c += (size_t)snprintf(cfg + c, sizeof cfg - c,
                              "{\n  \"architectures\": [\"Qwen3_5ForCausalLM\"],\n  \"model_type\": \"qwen3_5_text\",\n"
                              "  \"attention_bias\": false,\n  \"bos_token_id\": %d,\n  \"eos_token_id\": %d,\n"
                              "  \"dtype\": \"%s\",\n  \"head_dim\": %d,\n  \"hidden_act\": \"silu\",\n  \"hidden_size\": %d,\n"
                              "  \"intermediate_size\": %d,\n  \"full_attention_interval\": %d,\n"
                              "  \"linear_conv_kernel_dim\": %d,\n  \"linear_key_head_dim\": %d,\n"
                              "  \"linear_num_key_heads\": %d,\n  \"linear_num_value_heads\": %d,\n"
                              "  \"linear_value_head_dim\": %d,\n  \"max_position_embeddings\": %d,\n"
                              "  \"num_attention_heads\": %d,\n  \"num_hidden_layers\": %d,\n  \"num_key_value_heads\": %d,\n"
                              "  \"rms_norm_eps\": 1e-06,\n  \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": %.1f, "
                              "\"partial_rotary_factor\": 0.25, \"mrope_section\": [11, 11, 10], \"mrope_interleaved\": true},\n"
                              "  \"tie_word_embeddings\": true,\n  \"vocab_size\": %d\n}\n",
                              sh->bos, sh->eos, hf_dtype_name[dt], hd, D, F, sh->full_every, sh->conv_k, sh->lin_k_dim,
                              sh->lin_k_heads, sh->lin_v_heads, sh->lin_v_dim, sh->max_pos, H, sh->layers, KV,
                              sh->rope_theta, sh->vocab);
    } else {
    c += (size_t)snprintf(cfg + c, sizeof cfg - c,
                          "{\n  \"architectures\": [\"Qwen3ForCausalLM\"],\n  \"model_type\": \"qwen3\",\n"
                          "  \"attention_bias\": false,\n  \"attention_dropout\": 0.0,\n"
                          "  \"bos_token_id\": %d,\n  \"eos_token_id\": %d,\n  \"dtype\": \"%s\",\n"
                          "  \"head_dim\": %d,\n  \"hidden_act\": \"silu\",\n  \"hidden_size\": %d,\n"
                          "  \"initializer_range\": 0.02,\n  \"intermediate_size\": %d,\n  \"layer_types\": [",
                          sh->bos, sh->eos, hf_dtype_name[dt], hd, D, F);
    for (int l = 0; l < sh->layers && c < sizeof cfg - 64; l++)
        c += (size_t)snprintf(cfg + c, sizeof cfg - c, "%s\"full_attention\"", l ? ", " : "");
    c += (size_t)snprintf(cfg + c, sizeof cfg - c,
                          "],\n  \"max_position_embeddings\": %d,\n  \"max_window_layers\": %d,\n"
                          "  \"num_attention_heads\": %d,\n  \"num_hidden_layers\": %d,\n  \"num_key_value_heads\": %d,\n"
                          "  \"rms_norm_eps\": 1e-06,\n"
                          "  \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": %.1f},\n"
                          "  \"sliding_window\": null,\n  \"tie_word_embeddings\": true,\n  \"use_cache\": true,\n"
                          "  \"use_sliding_window\": false,\n  \"vocab_size\": %d\n}\n",
                          sh->max_pos, sh->layers, H, sh->layers, KV, sh->rope_theta, sh->vocab);
    }
    if (c >= sizeof cfg) { fprintf(stderr, "bench_make_model: config overflow\n"); return 1; }
    char gen[256];
    snprintf(gen, sizeof gen, "{\n  \"bos_token_id\": %d,\n  \"eos_token_id\": %d,\n  \"do_sample\": false\n}\n", sh->bos,
             sh->eos);
    if (write_text(out, "config.json", cfg) || write_text(out, "generation_config.json", gen)) {
        remove(tmp_path);
        return 1;
    }
    if (rename(tmp_path, path)) {
        fprintf(stderr, "bench_make_model: rename to %s: %s\n", path, strerror(errno));
        return 1;
    }
    double el = now_s() - t0;
    fprintf(stderr, "bench_make_model: wrote %.2f GB in %.1f s (%.0f MB/s)\n", (8 + hlen + data_bytes) / 1e9, el,
            (8 + hlen + data_bytes) / 1e6 / (el > 0 ? el : 1e-9));
    free(hdr);
    free(t);
    return 0;
}
