/* gerbil quantize IN OUT --type T [--group-size N]
 *
 * IN: a Hugging Face folder (config.json + f32/f16/bf16 safetensors) of a supported
 * architecture. GGUF types write OUT as one GGUF v3 file laid out as llama.cpp's
 * convert_hf_to_gguf.py + llama-quantize would (metadata, tensor names, llama q/k row
 * permutation, tokenizer.ggml.* for byte-level BPE tokenizers); mlx4/mlx8 write OUT
 * as an mlx-lm style folder (U32 codes + scales + biases per Linear and embedding).
 *
 * Type choice per tensor (GGUF), following llama.cpp's llama_tensor_get_type for the
 * types offered here:
 *   - 1-D tensors (norms, biases): F32.
 *   - f32/f16/bf16: every matrix in that type.
 *   - q8_0, q4_0, q4_k, q5_k, q6_k: every matrix in that type, except the output
 *     matrix (output.weight, or token_embd when the embeddings are tied) which is
 *     Q6_K for every type but q8_0.
 *   - q4_k_m: Q4_K, with Q6_K for the output matrix and for attn_v / ffn_down of the
 *     layers where use_more_bits(i, n) = i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2.
 *     (llama.cpp's Q4_K_S/Q4_K_M tweaks for 70B and MoE models are not applied.)
 *   - Row length not a multiple of the block size: Q4_K -> Q5_0, Q5_K -> Q5_1,
 *     Q6_K -> Q8_0 (as llama-quantize), then F16 when still not a multiple of 32.
 *     Each fallback is reported on stderr.
 * The k-quant quantizers are gerbil's reference ones (tensor/quant_ref.h), not
 * bit-identical to llama.cpp's. */
#include "cli.h"

#include "base/fp16.h"
#include "base/status.h"
#include "io/gguf_write.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "tensor/quant_ref.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { OUT_GGUF, OUT_MLX };

static const struct qtype {
    const char *name;
    int kind;
    enum gb_type type;  /* GGUF: the default matrix type */
    uint32_t ftype;     /* GGUF general.file_type (llama_ftype) */
    int bits;           /* MLX */
} qtypes[] = {
    {"f32", OUT_GGUF, GB_TYPE_F32, 0, 0},    {"f16", OUT_GGUF, GB_TYPE_F16, 1, 0},
    {"bf16", OUT_GGUF, GB_TYPE_BF16, 32, 0}, {"q8_0", OUT_GGUF, GB_TYPE_Q8_0, 7, 0},
    {"q4_0", OUT_GGUF, GB_TYPE_Q4_0, 2, 0},  {"q4_k", OUT_GGUF, GB_TYPE_Q4_K, 14, 0},
    {"q5_k", OUT_GGUF, GB_TYPE_Q5_K, 16, 0}, {"q6_k", OUT_GGUF, GB_TYPE_Q6_K, 18, 0},
    {"q4_k_m", OUT_GGUF, GB_TYPE_Q4_K, 15, 0}, {"mlx4", OUT_MLX, GB_TYPE_U32, 0, 4},
    {"mlx8", OUT_MLX, GB_TYPE_U32, 0, 8},
};

static void help(FILE *f) {
    fprintf(f,
            "usage: gerbil quantize IN OUT --type TYPE [--group-size N]\n\n"
            "Converts a Hugging Face folder IN (config.json + f32/f16/bf16 safetensors; Llama, Mistral,\n"
            "Qwen2, Qwen3), or the cached snapshot of a Hugging Face repo id IN (pulled when missing),\n"
            "into OUT.\n\n"
            "  --type TYPE        f32 f16 bf16 q8_0 q4_0 q4_k q5_k q6_k q4_k_m: OUT is one GGUF v3 file\n"
            "                     laid out as llama.cpp's converter writes it (with the tokenizer when\n"
            "                     IN has a byte-level BPE tokenizer.json);\n"
            "                     mlx4 mlx8: OUT is a folder in mlx-lm's affine-quantized format\n"
            "  --group-size N     MLX group size: 32, 64 (default) or 128\n\n"
            "Norms and biases stay unquantized. Matrices whose rows do not fit the block size fall back\n"
            "to a nearby type (reported). Output is written under a temporary name and renamed.\n");
}

/* ---- tensor names (Hugging Face -> GGUF), as llama.cpp's converter ---- */
static const struct { const char *hf, *gguf; } layer_names[] = {
    {"input_layernorm", "attn_norm"},       {"self_attn.q_proj", "attn_q"},
    {"self_attn.k_proj", "attn_k"},         {"self_attn.v_proj", "attn_v"},
    {"self_attn.o_proj", "attn_output"},    {"self_attn.q_norm", "attn_q_norm"},
    {"self_attn.k_norm", "attn_k_norm"},    {"post_attention_layernorm", "ffn_norm"},
    {"mlp.gate_proj", "ffn_gate"},          {"mlp.up_proj", "ffn_up"},
    {"mlp.down_proj", "ffn_down"},
};

struct qctx {
    const char *in, *out;
    const struct qtype *qt;
    int group_size;
    struct model_config cfg;
    struct st_checkpoint ck;
    uint8_t *used;        /* [n_tensors]: consumed by the conversion */
    void **bufs;          /* buffers to free after writing */
    int n_bufs, cap_bufs;
    int n_fallback;
    size_t bytes_out;
};

static void *qalloc(struct qctx *q, size_t n) {
    if (q->n_bufs == q->cap_bufs) {
        int cap = q->cap_bufs ? 2 * q->cap_bufs : 256;
        void **b = realloc(q->bufs, (size_t)cap * sizeof *b);
        if (!b) return NULL;
        q->bufs = b;
        q->cap_bufs = cap;
    }
    void *p = malloc(n ? n : 1);
    if (p) q->bufs[q->n_bufs++] = p;
    return p;
}

static const struct gb_tensor *find_mark(struct qctx *q, const char *name) {
    int n = st_checkpoint_n_tensors(&q->ck);
    for (int i = 0; i < n; i++) {
        const struct gb_tensor *t = st_checkpoint_at(&q->ck, i);
        if (!strcmp(t->name, name)) { q->used[i] = 1; return t; }
    }
    return NULL;
}

static int use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

/* The GGUF type of a matrix [n_out, n_in]; *why set when a fallback was taken. */
static enum gb_type matrix_type(const struct qctx *q, const char *gname, int layer, int64_t n_in,
                                enum gb_type *wanted) {
    enum gb_type t = q->qt->type;
    const struct gb_type_traits *tr = type_traits(t);
    if (tr->is_quant) {
        int is_output = !strcmp(gname, "output.weight") ||
                        (q->cfg.tie_embeddings && !strcmp(gname, "token_embd.weight"));
        if (is_output && t != GB_TYPE_Q8_0) t = GB_TYPE_Q6_K;
        if (q->qt->ftype == 15 && layer >= 0 && (strstr(gname, ".attn_v.") || strstr(gname, ".ffn_down.")) &&
            use_more_bits(layer, q->cfg.n_layer))
            t = GB_TYPE_Q6_K;
    }
    *wanted = t;
    if (n_in % type_traits(t)->block_size) {
        if (t == GB_TYPE_Q4_K) t = GB_TYPE_Q5_0;
        else if (t == GB_TYPE_Q5_K) t = GB_TYPE_Q5_1;
        else if (t == GB_TYPE_Q6_K) t = GB_TYPE_Q8_0;
        if (n_in % type_traits(t)->block_size) t = GB_TYPE_F16;
    }
    return t;
}

/* Convert src ([n_out, n_in] or 1-D) to type t, permuting rows in llama's q/k order
 * when perm_heads > 0. Returns the buffer (or the source data when nothing changes). */
static gerbil_status convert(struct qctx *q, const struct gb_tensor *src, enum gb_type t, int perm_heads,
                             const void **data, size_t *nbytes) {
    int64_t n_out = src->n_dims == 2 ? src->ne[0] : 1;
    int64_t n_in = src->n_dims == 2 ? src->ne[1] : src->ne[0];
    size_t row_out = type_row_size(t, n_in), row_in = type_row_size(src->type, n_in);
    *nbytes = row_out * (size_t)n_out;
    if (t == src->type && !perm_heads) { *data = src->data; return GERBIL_OK; }
    uint8_t *out = qalloc(q, *nbytes);
    float *row = malloc((size_t)n_in * sizeof *row);
    if (!out || !row) { free(row); return err_set(GERBIL_ERR_NOMEM, "out of memory converting %s", src->name); }
    int64_t hd = perm_heads ? n_out / perm_heads : 0;
    struct gb_quant_fns fns = quant_fns(t);
    for (int64_t r = 0; r < n_out; r++) {
        int64_t s = r;
        if (perm_heads) { /* GGUF row h*hd + 2i <- HF row h*hd + i; 2i+1 <- i + hd/2 */
            int64_t h = r / hd, j = r % hd;
            s = h * hd + (j % 2 ? j / 2 + hd / 2 : j / 2);
        }
        const uint8_t *in = (const uint8_t *)src->data + (size_t)s * row_in;
        uint8_t *o = out + (size_t)r * row_out;
        if (t == src->type) { memcpy(o, in, row_in); continue; }
        type_to_f32(src->type, in, row, n_in);
        switch (t) {
        case GB_TYPE_F32: memcpy(o, row, (size_t)n_in * 4); break;
        case GB_TYPE_F16:
            for (int64_t i = 0; i < n_in; i++) { uint16_t h = f32_to_f16(row[i]); memcpy(o + 2 * i, &h, 2); }
            break;
        case GB_TYPE_BF16:
            for (int64_t i = 0; i < n_in; i++) { uint16_t h = f32_to_bf16(row[i]); memcpy(o + 2 * i, &h, 2); }
            break;
        default:
            GB_ASSERT(fns.from_float);
            fns.from_float(row, o, n_in);
        }
    }
    free(row);
    *data = out;
    return GERBIL_OK;
}

static void progress(struct qctx *q, int i, int n, const char *name, const struct gb_tensor *t, const char *to) {
    if (t->n_dims == 2)
        fprintf(stderr, "[%4d/%4d] %-32s %-4s [%5lld x %5lld] -> %s\n", i, n, name, type_name(t->type),
                (long long)t->ne[0], (long long)t->ne[1], to);
    else
        fprintf(stderr, "[%4d/%4d] %-32s %-4s [%5lld] -> %s\n", i, n, name, type_name(t->type),
                (long long)t->ne[0], to);
    (void)q;
}

/* ---- GGUF ---- */

static gerbil_status gguf_tensor(struct qctx *q, struct gguf_writer *w, const struct gb_tensor *t,
                                 const char *gname, int layer, int perm_heads, int idx, int total) {
    if (t->type != GB_TYPE_F32 && t->type != GB_TYPE_F16 && t->type != GB_TYPE_BF16)
        return err_set(GERBIL_ERR_UNSUPPORTED, "%s: tensor %s is %s; quantize needs f32, f16 or bf16 weights",
                       q->in, t->name, type_name(t->type));
    if (t->n_dims < 1 || t->n_dims > 2)
        return err_set(GERBIL_ERR_UNSUPPORTED, "%s: tensor %s has %d dims", q->in, t->name, t->n_dims);
    enum gb_type to = GB_TYPE_F32, wanted = GB_TYPE_F32;
    if (t->n_dims == 2) to = matrix_type(q, gname, layer, t->ne[1], &wanted);
    progress(q, idx, total, gname, t, type_name(to));
    if (to != wanted) {
        fprintf(stderr, "           fallback: %s row length %lld is not a multiple of %s's block of %d; using %s\n",
                gname, (long long)t->ne[1], type_name(wanted), type_traits(wanted)->block_size, type_name(to));
        q->n_fallback++;
    }
    const void *data = NULL;
    size_t nbytes = 0;
    GB_TRY(convert(q, t, to, perm_heads, &data, &nbytes));
    q->bytes_out += nbytes;
    return gguf_writer_add_tensor(w, gname, to, t->n_dims, t->ne, data, nbytes);
}

static const char *special_content(const cJSON *v) {
    if (cJSON_IsString(v)) return v->valuestring;
    if (cJSON_IsObject(v)) return json_get_str(v, "content", NULL);
    return NULL;
}

/* Token text -> id through the vocab object and added_tokens; -1 when absent. */
static int token_id(const cJSON *vocab, const cJSON *added, const char *s) {
    if (!s) return -1;
    const cJSON *it;
    cJSON_ArrayForEach(it, added) {
        const char *c = json_get_str(it, "content", NULL);
        if (c && !strcmp(c, s)) return (int)json_get_int(it, "id", -1);
    }
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(vocab, s);
    return cJSON_IsNumber(v) ? v->valueint : -1;
}

static int is_byte_level(const cJSON *pre) {
    if (!pre) return 0;
    const char *type = json_get_str(pre, "type", "");
    if (!strcmp(type, "ByteLevel")) return 1;
    const cJSON *seq = cJSON_GetObjectItemCaseSensitive(pre, "pretokenizers"), *it;
    cJSON_ArrayForEach(it, seq) if (is_byte_level(it)) return 1;
    return 0;
}

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* tokenizer.ggml.* from IN/tokenizer.json (+ tokenizer_config.json, config.json), as
 * convert_hf_to_gguf.py's _set_vocab_gpt2 + gguf.SpecialVocab. Writes nothing (and
 * says so) when IN has no tokenizer.json or one that is not a byte-level BPE. */
static gerbil_status gguf_tokenizer(struct qctx *q, struct gguf_writer *w) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", q->in);
    if (!file_exists(path)) {
        fprintf(stderr, "gerbil quantize: %s has no tokenizer.json; the GGUF will have no tokenizer\n", q->in);
        return GERBIL_OK;
    }
    cJSON *tj = NULL, *tc = NULL, *cj = NULL;
    char **toks = NULL;
    int32_t *types = NULL;
    const char **merges = NULL;
    gerbil_status st = json_load_file(path, &tj);
    if (st) return st;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(tj, "model");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *mlist = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(tj, "added_tokens");
    if (strcmp(json_get_str(model, "type", ""), "BPE") || !cJSON_IsObject(vocab) || !cJSON_IsArray(mlist) ||
        !is_byte_level(cJSON_GetObjectItemCaseSensitive(tj, "pre_tokenizer"))) {
        fprintf(stderr, "gerbil quantize: %s is not a byte-level BPE tokenizer (SentencePiece-style tokenizers "
                        "are not converted yet); the GGUF will have no tokenizer\n", path);
        cJSON_Delete(tj);
        return GERBIL_OK;
    }
    snprintf(path, sizeof path, "%s/tokenizer_config.json", q->in);
    if (file_exists(path) && (st = json_load_file(path, &tc))) goto done;
    snprintf(path, sizeof path, "%s/config.json", q->in);
    if ((st = json_load_file(path, &cj))) goto done;

    /* ids: the vocab, the added tokens, padded to vocab_size with [PAD{id}] */
    int64_t n = q->cfg.n_vocab;
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab) if (cJSON_IsNumber(it) && it->valueint + 1 > n) n = it->valueint + 1;
    cJSON_ArrayForEach(it, added) {
        int64_t id = json_get_int(it, "id", -1);
        if (id + 1 > n) n = id + 1;
    }
    if (n > (1 << 24)) { st = err_set(GERBIL_ERR_FORMAT, "%s: absurd vocabulary size %lld", q->in, (long long)n); goto done; }
    toks = calloc((size_t)n, sizeof *toks);
    types = calloc((size_t)n, sizeof *types);
    if (!toks || !types) { st = err_set(GERBIL_ERR_NOMEM, "out of memory"); goto done; }
    cJSON_ArrayForEach(it, vocab) {
        if (!cJSON_IsNumber(it) || it->valueint < 0) continue;
        toks[it->valueint] = it->string;
        types[it->valueint] = 1; /* NORMAL */
    }
    const cJSON *decoder = tc ? cJSON_GetObjectItemCaseSensitive(tc, "added_tokens_decoder") : NULL;
    cJSON_ArrayForEach(it, added) {
        int64_t id = json_get_int(it, "id", -1);
        const char *c = json_get_str(it, "content", NULL);
        if (id < 0 || !c) continue;
        int special = json_get_bool(it, "special", 0);
        char key[32];
        snprintf(key, sizeof key, "%lld", (long long)id);
        const cJSON *d = decoder ? cJSON_GetObjectItemCaseSensitive(decoder, key) : NULL;
        if (d) special = json_get_bool(d, "special", special);
        toks[id] = (char *)c;
        types[id] = special ? 3 /* CONTROL */ : 4 /* USER_DEFINED */;
    }
    char **pads = NULL;
    int n_pad = 0;
    for (int64_t i = 0; i < n; i++) if (!toks[i]) n_pad++;
    if (n_pad) {
        pads = calloc((size_t)n_pad, sizeof *pads);
        if (!pads) { st = err_set(GERBIL_ERR_NOMEM, "out of memory"); goto done; }
        int k = 0;
        for (int64_t i = 0; i < n; i++)
            if (!toks[i]) {
                char b[32];
                snprintf(b, sizeof b, "[PAD%lld]", (long long)i);
                pads[k] = strdup(b);
                toks[i] = pads[k++];
                types[i] = 5; /* UNUSED */
            }
    }
    int nm = cJSON_GetArraySize(mlist), k = 0;
    merges = calloc((size_t)nm + 1, sizeof *merges);
    char **mbuf = calloc((size_t)nm + 1, sizeof *mbuf);
    if (!merges || !mbuf) { free(mbuf); st = err_set(GERBIL_ERR_NOMEM, "out of memory"); goto pads_done; }
    cJSON_ArrayForEach(it, mlist) {
        if (cJSON_IsString(it)) merges[k++] = it->valuestring;
        else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2) { /* newer ["a", "b"] form */
            const char *a = cJSON_GetArrayItem(it, 0)->valuestring, *b = cJSON_GetArrayItem(it, 1)->valuestring;
            if (!a || !b) continue;
            size_t len = strlen(a) + strlen(b) + 2;
            mbuf[k] = malloc(len);
            if (!mbuf[k]) break;
            snprintf(mbuf[k], len, "%s %s", a, b);
            merges[k] = mbuf[k];
            k++;
        }
    }
    const char *pre = q->cfg.arch == ARCH_QWEN2 || q->cfg.arch == ARCH_QWEN3 ? "qwen2" : "llama-bpe";
    if ((st = gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2")) ||
        (st = gguf_writer_add_str(w, "tokenizer.ggml.pre", pre)) ||
        (st = gguf_writer_add_str_arr(w, "tokenizer.ggml.tokens", (const char *const *)toks, (uint64_t)n)) ||
        (st = gguf_writer_add_arr(w, "tokenizer.ggml.token_type", GGUF_VT_I32, types, (uint64_t)n)) ||
        (st = gguf_writer_add_str_arr(w, "tokenizer.ggml.merges", merges, (uint64_t)k)))
        goto merges_done;
    /* special ids: tokenizer_config.json "<x>_token", else config.json "<x>_token_id" */
    static const struct { const char *cfg, *key; } specials[] = {
        {"bos", "tokenizer.ggml.bos_token_id"}, {"eos", "tokenizer.ggml.eos_token_id"},
        {"unk", "tokenizer.ggml.unknown_token_id"}, {"pad", "tokenizer.ggml.padding_token_id"},
    };
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++) {
        char key[32];
        snprintf(key, sizeof key, "%s_token", specials[i].cfg);
        int id = tc ? token_id(vocab, added, special_content(cJSON_GetObjectItemCaseSensitive(tc, key))) : -1;
        if (id < 0) {
            snprintf(key, sizeof key, "%s_token_id", specials[i].cfg);
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(cj, key);
            if (cJSON_IsArray(v)) v = cJSON_GetArrayItem(v, 0);
            if (cJSON_IsNumber(v)) id = v->valueint;
        }
        if (id >= 0 && id < n && (st = gguf_writer_add_u32(w, specials[i].key, (uint32_t)id))) goto merges_done;
    }
    if (tc) {
        static const char *flags[] = {"add_bos_token", "add_eos_token"};
        for (int i = 0; i < 2; i++) {
            const cJSON *b = cJSON_GetObjectItemCaseSensitive(tc, flags[i]);
            char key[64];
            snprintf(key, sizeof key, "tokenizer.ggml.%s", flags[i]);
            if (cJSON_IsBool(b) && (st = gguf_writer_add_bool(w, key, cJSON_IsTrue(b)))) goto merges_done;
        }
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(tc, "chat_template");
        const char *tmpl = cJSON_IsString(ct) ? ct->valuestring : NULL;
        if (cJSON_IsArray(ct)) /* [{"name": "default", "template": ...}, ...] */
            cJSON_ArrayForEach(it, ct) if (!strcmp(json_get_str(it, "name", ""), "default"))
                tmpl = json_get_str(it, "template", NULL);
        if (!tmpl) { /* newer transformers keep it in chat_template.jinja */
            snprintf(path, sizeof path, "%s/chat_template.jinja", q->in);
            FILE *f = fopen(path, "rb");
            if (f) {
                static char buf[1 << 20];
                size_t len = fread(buf, 1, sizeof buf - 1, f);
                fclose(f);
                buf[len] = 0;
                st = gguf_writer_add_str(w, "tokenizer.chat_template", buf);
            }
        } else st = gguf_writer_add_str(w, "tokenizer.chat_template", tmpl);
    }
    if (!st)
        fprintf(stderr, "tokenizer: gpt2 (pre \"%s\"), %lld tokens (%d padding), %d merges\n", pre, (long long)n,
                n_pad, k);
merges_done:
    for (int i = 0; i < nm; i++) free(mbuf[i]);
    free(mbuf);
pads_done:
    for (int i = 0; i < n_pad; i++) free(pads[i]);
    free(pads);
done:
    free((void *)merges);
    free(toks);
    free(types);
    cJSON_Delete(tj);
    cJSON_Delete(tc);
    cJSON_Delete(cj);
    return st;
}

static const char *gguf_arch(enum model_arch a) {
    switch (a) {
    case ARCH_QWEN2: return "qwen2";
    case ARCH_QWEN3: return "qwen3";
    default: return "llama";
    }
}

static gerbil_status write_gguf(struct qctx *q) {
    const struct model_config *c = &q->cfg;
    if (c->rope.type != ROPE_DEFAULT && c->rope.type != ROPE_LINEAR && c->rope.type != ROPE_YARN)
        return err_set(GERBIL_ERR_UNSUPPORTED, "%s: this rope_scaling type is not supported in GGUF output yet "
                       "(default, linear and yarn are)", q->in);
    if (c->mlx.bits) return err_set(GERBIL_ERR_UNSUPPORTED, "%s is already MLX-quantized", q->in);
    struct gguf_writer *w;
    GB_TRY(gguf_writer_new(&w));
    gerbil_status st;
    const char *arch = gguf_arch(c->arch);
    char key[128];
#define KEY(suffix) (snprintf(key, sizeof key, "%s.%s", arch, suffix), key)
    const char *base = strrchr(q->in, '/');
    char name[256];
    snprintf(name, sizeof name, "%s", base && base[1] ? base + 1 : q->in);
    size_t nl = strlen(name);
    while (nl > 1 && name[nl - 1] == '/') name[--nl] = 0;
    if ((st = gguf_writer_add_str(w, "general.architecture", arch)) ||
        (st = gguf_writer_add_str(w, "general.name", name)) ||
        (st = gguf_writer_add_u32(w, "general.file_type", q->qt->ftype)) ||
        (st = gguf_writer_add_u32(w, "general.quantization_version", 2)) ||
        (st = gguf_writer_add_u32(w, KEY("vocab_size"), (uint32_t)c->n_vocab)) ||
        (st = gguf_writer_add_u32(w, KEY("context_length"), (uint32_t)c->n_ctx_train)) ||
        (st = gguf_writer_add_u32(w, KEY("embedding_length"), (uint32_t)c->n_embd)) ||
        (st = gguf_writer_add_u32(w, KEY("block_count"), (uint32_t)c->n_layer)) ||
        (st = gguf_writer_add_u32(w, KEY("feed_forward_length"), (uint32_t)c->n_ff)) ||
        (st = gguf_writer_add_u32(w, KEY("attention.head_count"), (uint32_t)c->n_head)) ||
        (st = gguf_writer_add_u32(w, KEY("attention.head_count_kv"), (uint32_t)c->n_head_kv)) ||
        (st = gguf_writer_add_u32(w, KEY("attention.key_length"), (uint32_t)c->head_dim)) ||
        (st = gguf_writer_add_u32(w, KEY("attention.value_length"), (uint32_t)c->head_dim)) ||
        (st = gguf_writer_add_f32(w, KEY("rope.freq_base"), (float)c->rope.theta)) ||
        (st = gguf_writer_add_u32(w, KEY("rope.dimension_count"), (uint32_t)c->rope.n_dims)) ||
        (st = gguf_writer_add_f32(w, KEY("attention.layer_norm_rms_epsilon"), c->norm_eps)))
        goto out;
    if (c->rope.type != ROPE_DEFAULT &&
        ((st = gguf_writer_add_str(w, KEY("rope.scaling.type"), c->rope.type == ROPE_LINEAR ? "linear" : "yarn")) ||
         (st = gguf_writer_add_f32(w, KEY("rope.scaling.factor"), (float)c->rope.factor)) ||
         (c->rope.orig_max_pos &&
          (st = gguf_writer_add_u32(w, KEY("rope.scaling.original_context_length"), (uint32_t)c->rope.orig_max_pos)))))
        goto out;
    if (c->sliding_window && (st = gguf_writer_add_u32(w, KEY("attention.sliding_window"), (uint32_t)c->sliding_window)))
        goto out;
#undef KEY
    if ((st = gguf_tokenizer(q, w))) goto out;

    /* tensors in llama.cpp's order: embedding, layers, final norm, output */
    int total = st_checkpoint_n_tensors(&q->ck), idx = 0;
    const struct gb_tensor *t;
    char gname[256], hname[256];
    if (!(t = find_mark(q, "model.embed_tokens.weight"))) {
        st = err_set(GERBIL_ERR_FORMAT, "%s: no model.embed_tokens.weight", q->in);
        goto out;
    }
    if ((st = gguf_tensor(q, w, t, "token_embd.weight", -1, 0, ++idx, total))) goto out;
    int perm = c->arch == ARCH_LLAMA || c->arch == ARCH_MISTRAL;
    for (int l = 0; l < c->n_layer; l++)
        for (size_t i = 0; i < sizeof layer_names / sizeof layer_names[0]; i++)
            for (int b = 0; b < 2; b++) {
                const char *sfx = b ? "bias" : "weight";
                snprintf(hname, sizeof hname, "model.layers.%d.%s.%s", l, layer_names[i].hf, sfx);
                if (!(t = find_mark(q, hname))) continue;
                snprintf(gname, sizeof gname, "blk.%d.%s.%s", l, layer_names[i].gguf, sfx);
                int heads = 0;
                if (perm && !strcmp(layer_names[i].gguf, "attn_q")) heads = c->n_head;
                if (perm && !strcmp(layer_names[i].gguf, "attn_k")) heads = c->n_head_kv;
                if ((st = gguf_tensor(q, w, t, gname, l, heads, ++idx, total))) goto out;
            }
    if ((t = find_mark(q, "model.norm.weight")) && (st = gguf_tensor(q, w, t, "output_norm.weight", -1, 0, ++idx, total)))
        goto out;
    t = find_mark(q, "lm_head.weight");
    if (t && !c->tie_embeddings && (st = gguf_tensor(q, w, t, "output.weight", -1, 0, ++idx, total))) goto out;
    for (int i = 0; i < total; i++) {
        const char *nm = st_checkpoint_at(&q->ck, i)->name;
        if (!q->used[i] && !strstr(nm, "rotary_emb.inv_freq")) {
            st = err_set(GERBIL_ERR_UNSUPPORTED, "%s: tensor \"%s\" has no GGUF name (unsupported model layout)",
                         q->in, nm);
            goto out;
        }
    }
    fprintf(stderr, "writing %s (%.1f MB of tensor data)\n", q->out, (double)q->bytes_out / 1e6);
    st = gguf_writer_write(w, q->out);
out:
    gguf_writer_free(w);
    return st;
}

/* ---- MLX folder ---- */

struct st_entry {
    char *name;
    enum gb_type type;
    int n_dims;
    int64_t ne[2];
    const void *data;
    size_t nbytes;
};

static const char *st_dtype(enum gb_type t) {
    switch (t) {
    case GB_TYPE_F32: return "F32";
    case GB_TYPE_F16: return "F16";
    case GB_TYPE_BF16: return "BF16";
    case GB_TYPE_U32: return "U32";
    default: return NULL;
    }
}

/* A safetensors file: u64 header length, JSON header (padded with spaces to 8 bytes), data. */
static gerbil_status write_safetensors(const char *path, const struct st_entry *e, int n) {
    cJSON *h = cJSON_CreateObject(), *meta = cJSON_CreateObject();
    gerbil_status st = GERBIL_OK;
    char *js = NULL;
    FILE *f = NULL;
    if (!h || !meta) { cJSON_Delete(h); cJSON_Delete(meta); return err_set(GERBIL_ERR_NOMEM, "out of memory"); }
    cJSON_AddItemToObject(h, "__metadata__", meta);
    cJSON_AddStringToObject(meta, "format", "mlx");
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        cJSON *o = cJSON_CreateObject(), *shape = cJSON_CreateArray(), *offs = cJSON_CreateArray();
        cJSON_AddItemToObject(h, e[i].name, o);
        cJSON_AddStringToObject(o, "dtype", st_dtype(e[i].type));
        for (int d = 0; d < e[i].n_dims; d++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)e[i].ne[d]));
        cJSON_AddItemToObject(o, "shape", shape);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(off + e[i].nbytes)));
        cJSON_AddItemToObject(o, "data_offsets", offs);
        off += e[i].nbytes;
    }
    js = cJSON_PrintUnformatted(h);
    if (!js) { st = err_set(GERBIL_ERR_NOMEM, "out of memory"); goto out; }
    size_t len = strlen(js), padded = (len + 7) / 8 * 8;
    uint64_t hl = padded;
    f = fopen(path, "wb");
    if (!f) { st = err_set(GERBIL_ERR_IO, "%s: %s", path, strerror(errno)); goto out; }
    int ok = fwrite(&hl, 8, 1, f) == 1 && fwrite(js, 1, len, f) == len;
    for (size_t i = len; ok && i < padded; i++) ok = fputc(' ', f) != EOF;
    for (int i = 0; ok && i < n; i++) ok = fwrite(e[i].data, 1, e[i].nbytes, f) == e[i].nbytes;
    if (fclose(f) != 0) ok = 0;
    if (!ok) st = err_set(GERBIL_ERR_IO, "%s: write failed: %s", path, strerror(errno));
out:
    free(js);
    cJSON_Delete(h);
    return st;
}

static gerbil_status copy_file(const char *from, const char *to) {
    FILE *a = fopen(from, "rb");
    if (!a) return GERBIL_OK; /* optional files */
    FILE *b = fopen(to, "wb");
    if (!b) { fclose(a); return err_set(GERBIL_ERR_IO, "%s: %s", to, strerror(errno)); }
    char buf[1 << 16];
    size_t n;
    int ok = 1;
    while (ok && (n = fread(buf, 1, sizeof buf, a)) > 0) ok = fwrite(buf, 1, n, b) == n;
    fclose(a);
    if (fclose(b) != 0) ok = 0;
    return ok ? GERBIL_OK : err_set(GERBIL_ERR_IO, "%s: write failed", to);
}

static void remove_tree(const char *dir) { /* dir: shorter than 2048 */
    static const char *files[] = {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json",
                                  "special_tokens_map.json", "vocab.json", "merges.txt", "tokenizer.model",
                                  "generation_config.json", "chat_template.jinja", "added_tokens.json"};
    char p[4200];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        unlink(p);
    }
    rmdir(dir);
}

static gerbil_status write_mlx(struct qctx *q) {
    const struct model_config *c = &q->cfg;
    int bits = q->qt->bits, g = q->group_size;
    if (c->mlx.bits) return err_set(GERBIL_ERR_UNSUPPORTED, "%s is already MLX-quantized", q->in);
    struct stat sb;
    if (stat(q->out, &sb) == 0)
        return err_set(GERBIL_ERR_INVALID_ARG, "%s already exists; remove it first (MLX output is a folder)", q->out);
    char tmp[2048], p[4200], p2[4200];
    if (strlen(q->out) > 1900) return err_set(GERBIL_ERR_INVALID_ARG, "output path too long");
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", q->out, (long)getpid());
    if (mkdir(tmp, 0777) != 0) return err_set(GERBIL_ERR_IO, "%s: %s", tmp, strerror(errno));
    int total = st_checkpoint_n_tensors(&q->ck), n = 0;
    struct st_entry *e = calloc((size_t)total * 3 + 1, sizeof *e);
    cJSON *cfgj = NULL;
    char *js = NULL;
    gerbil_status st = GERBIL_OK;
    if (!e) { st = err_set(GERBIL_ERR_NOMEM, "out of memory"); goto out; }
    for (int i = 0; i < total; i++) {
        const struct gb_tensor *t = st_checkpoint_at(&q->ck, i);
        if (strstr(t->name, "rotary_emb.inv_freq")) continue;
        if (c->tie_embeddings && !strcmp(t->name, "lm_head.weight")) continue;
        if (t->type != GB_TYPE_F32 && t->type != GB_TYPE_F16 && t->type != GB_TYPE_BF16) {
            st = err_set(GERBIL_ERR_UNSUPPORTED, "%s: tensor %s is %s; quantize needs f32, f16 or bf16 weights",
                         q->in, t->name, type_name(t->type));
            goto out;
        }
        size_t nl = strlen(t->name);
        /* mlx-lm quantizes every Linear and Embedding whose input dim is a multiple of the group */
        int quant = t->n_dims == 2 && nl > 7 && !strcmp(t->name + nl - 7, ".weight") && t->ne[1] % g == 0 &&
                    t->ne[1] % 32 == 0;
        if (!quant) {
            progress(q, i + 1, total, t->name, t, type_name(t->type));
            e[n++] = (struct st_entry){strdup(t->name), t->type, t->n_dims, {t->ne[0], t->n_dims > 1 ? t->ne[1] : 0},
                                       t->data, t->nbytes};
            if (!e[n - 1].name) { st = err_set(GERBIL_ERR_NOMEM, "out of memory"); goto out; }
            continue;
        }
        char to[32];
        snprintf(to, sizeof to, "mlx %d-bit g%d", bits, g);
        progress(q, i + 1, total, t->name, t, to);
        int64_t rows = t->ne[0], cols = t->ne[1], wpr = cols * bits / 32, gpr = cols / g;
        size_t sbs = type_traits(t->type)->type_size;
        uint32_t *words = qalloc(q, (size_t)(rows * wpr) * 4);
        uint8_t *sc = qalloc(q, (size_t)(rows * gpr) * sbs), *bi = qalloc(q, (size_t)(rows * gpr) * sbs);
        float *row = malloc((size_t)cols * sizeof *row);
        if (!words || !sc || !bi || !row) { free(row); st = err_set(GERBIL_ERR_NOMEM, "out of memory"); goto out; }
        size_t row_in = type_row_size(t->type, cols);
        for (int64_t r = 0; r < rows; r++) {
            type_to_f32(t->type, (const uint8_t *)t->data + (size_t)r * row_in, row, cols);
            quantize_row_mlx_ref(row, words + r * wpr, sc + (size_t)(r * gpr) * sbs, bi + (size_t)(r * gpr) * sbs,
                                 t->type, bits, g, cols);
        }
        free(row);
        char base[512];
        snprintf(base, sizeof base, "%.*s", (int)(nl - 7), t->name);
        const struct { const char *sfx; enum gb_type ty; int64_t c; const void *d; size_t nb; } parts[] = {
            {"weight", GB_TYPE_U32, wpr, words, (size_t)(rows * wpr) * 4},
            {"scales", t->type, gpr, sc, (size_t)(rows * gpr) * sbs},
            {"biases", t->type, gpr, bi, (size_t)(rows * gpr) * sbs},
        };
        for (int k = 0; k < 3; k++) {
            char nm[600];
            snprintf(nm, sizeof nm, "%s.%s", base, parts[k].sfx);
            e[n++] = (struct st_entry){strdup(nm), parts[k].ty, 2, {rows, parts[k].c}, parts[k].d, parts[k].nb};
            if (!e[n - 1].name) { st = err_set(GERBIL_ERR_NOMEM, "out of memory"); goto out; }
        }
    }
    snprintf(p, sizeof p, "%s/model.safetensors", tmp);
    fprintf(stderr, "writing %s\n", q->out);
    if ((st = write_safetensors(p, e, n))) goto out;

    /* config.json: the source's plus mlx-lm's quantization blocks */
    snprintf(p, sizeof p, "%.2000s/config.json", q->in);
    if ((st = json_load_file(p, &cfgj))) goto out;
    cJSON_DeleteItemFromObjectCaseSensitive(cfgj, "quantization");
    cJSON_DeleteItemFromObjectCaseSensitive(cfgj, "quantization_config");
    for (int k = 0; k < 2; k++) {
        cJSON *qo = cJSON_CreateObject();
        cJSON_AddNumberToObject(qo, "group_size", g);
        cJSON_AddNumberToObject(qo, "bits", bits);
        cJSON_AddItemToObject(cfgj, k ? "quantization_config" : "quantization", qo);
    }
    js = cJSON_Print(cfgj);
    snprintf(p, sizeof p, "%s/config.json", tmp);
    FILE *f = fopen(p, "wb");
    if (!js || !f || fputs(js, f) < 0 || fclose(f) != 0) {
        st = err_set(GERBIL_ERR_IO, "%s: write failed", p);
        goto out;
    }
    static const char *copies[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                   "vocab.json", "merges.txt", "tokenizer.model", "generation_config.json",
                                   "chat_template.jinja", "added_tokens.json"};
    for (size_t k = 0; k < sizeof copies / sizeof copies[0]; k++) {
        snprintf(p, sizeof p, "%.2000s/%s", q->in, copies[k]);
        snprintf(p2, sizeof p2, "%s/%s", tmp, copies[k]);
        if ((st = copy_file(p, p2))) goto out;
    }
    if (rename(tmp, q->out) != 0) st = err_set(GERBIL_ERR_IO, "rename %s -> %s: %s", tmp, q->out, strerror(errno));
out:
    if (st) remove_tree(tmp);
    for (int i = 0; i < n; i++) free(e[i].name);
    free(e);
    free(js);
    cJSON_Delete(cfgj);
    return st;
}

int cmd_quantize(int argc, char **argv) {
    struct qctx q = {.group_size = 64};
    const char *type = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { help(stdout); return 0; }
        if (!strcmp(argv[i], "--type")) {
            if (!(type = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(argv[i], "--group-size")) {
            const char *v = cli_value(argc, argv, &i);
            if (!v || cli_parse_int("--group-size", v, 32, 128, &q.group_size)) return 2;
            if (q.group_size != 32 && q.group_size != 64 && q.group_size != 128) {
                fprintf(stderr, "gerbil quantize: --group-size must be 32, 64 or 128\n");
                return 2;
            }
        } else if (argv[i][0] != '-' && !q.in) q.in = argv[i];
        else if (argv[i][0] != '-' && !q.out) q.out = argv[i];
        else {
            fprintf(stderr, "gerbil quantize: unknown option \"%s\"\n", argv[i]);
            help(stderr);
            return 2;
        }
    }
    if (!q.in || !q.out || !type) {
        fprintf(stderr, "gerbil quantize: IN, OUT and --type are required\n");
        help(stderr);
        return 2;
    }
    for (size_t i = 0; i < sizeof qtypes / sizeof qtypes[0]; i++)
        if (!strcmp(type, qtypes[i].name)) q.qt = &qtypes[i];
    if (!q.qt) {
        fprintf(stderr, "gerbil quantize: unknown --type \"%s\" (f32 f16 bf16 q8_0 q4_0 q4_k q5_k q6_k q4_k_m "
                        "mlx4 mlx8)\n", type);
        return 2;
    }
    char in_path[4096]; /* IN may be a repo id: its cached snapshot folder */
    if (cli_resolve_ref(q.in, NULL, in_path, sizeof in_path)) return 1;
    q.in = in_path;
    struct stat sb;
    if (stat(q.in, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "gerbil quantize: %s is not a folder (IN must be a Hugging Face model folder)\n", q.in);
        return 1;
    }
    gerbil_status st = model_config_load(q.in, &q.cfg);
    if (st) return cli_fail("quantize", st);
    if ((st = st_checkpoint_open(q.in, &q.ck))) {
        model_config_free(&q.cfg);
        return cli_fail("quantize", st);
    }
    q.used = calloc((size_t)st_checkpoint_n_tensors(&q.ck) + 1, 1);
    if (!q.used) st = err_set(GERBIL_ERR_NOMEM, "out of memory");
    else st = q.qt->kind == OUT_GGUF ? write_gguf(&q) : write_mlx(&q);
    if (!st && q.n_fallback)
        fprintf(stderr, "note: %d tensor(s) used a fallback type (see above)\n", q.n_fallback);
    if (!st) fprintf(stderr, "done: %s\n", q.out);
    for (int i = 0; i < q.n_bufs; i++) free(q.bufs[i]);
    free(q.bufs);
    free(q.used);
    st_checkpoint_close(&q.ck);
    model_config_free(&q.cfg);
    return st ? cli_fail("quantize", st) : 0;
}
