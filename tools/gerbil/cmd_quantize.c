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
 * bit-identical to llama.cpp's.
 *
 * Gemma 3 (Gemma3ForCausalLM) is written as llama.cpp's "gemma3": norms stored as 1 + w
 * (added in f32, where llama.cpp's converter adds in the checkpoint dtype), the Gemma
 * names of the four layer norms, rope.freq_base for the global layers and
 * rope.freq_base_swa for the sliding ones, attention.sliding_window(_pattern). The file has
 * no key for the attention scale (llama.cpp uses 1/sqrt(head_dim)), so a model whose
 * query_pre_attn_scalar says otherwise is refused. */
#include "cli.h"

#include "base/fp16.h"
#include "base/status.h"
#include "io/gguf_write.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/weights.h"
#include "tensor/quant_ref.h"
#include "base/threadpool.h"

#include <ctype.h>
#include <stdatomic.h>
#include <errno.h>
#include <math.h>
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
            "usage: gerbil quantize IN OUT --type TYPE [--group-size N] [--threads N]\n\n"
            "Converts a Hugging Face folder IN (config.json + f32/f16/bf16 safetensors; Llama, Mistral,\n"
            "Qwen2, Qwen3, Qwen3.5 text, Qwen3-Next, Gemma 3 text, LFM2), or the cached snapshot of a\n"
            "Hugging Face repo id IN (pulled when missing), into OUT.\n\n"
            "  --type TYPE        f32 f16 bf16 q8_0 q4_0 q4_k q5_k q6_k q4_k_m: OUT is one GGUF v3 file\n"
            "                     laid out as llama.cpp's converter writes it (with the tokenizer when\n"
            "                     IN has a byte-level or SentencePiece-style BPE tokenizer.json);\n"
            "                     mlx4 mlx8: OUT is a folder in mlx-lm's affine-quantized format\n"
            "  --group-size N     MLX group size: 32, 64 (default) or 128\n"
            "  -t, --threads N    threads converting rows (default: the CPU count; the output is the\n"
            "                     same for any number)\n\n"
            "Norms and biases stay unquantized. Matrices whose rows do not fit the block size fall back\n"
            "to a nearby type (reported). Output is written under a temporary name and renamed.\n");
}

/* ---- tensor names (Hugging Face -> GGUF), as llama.cpp's converter ---- */
/* Per layer, in llama.cpp's order. archs: a mask of the architectures a row is for; 0: every
 * architecture unless a row for the same module names the model's; bare: no .weight/.bias
 * suffix (a parameter). Qwen3-Next's in_proj_qkvz is written twice: its q/k/v rows as
 * attn_qkv and its z rows as attn_gate (hybrid_xform picks the rows). */
#define A(a) (1u << (a))
#define HYBRID (A(ARCH_QWEN35) | A(ARCH_QWEN3NEXT))
static const struct { const char *hf, *gguf; unsigned archs; int bare; } layer_names[] = {
    {"input_layernorm", "attn_norm", 0, 0},
    {"self_attn.q_proj", "attn_q", 0, 0},       {"self_attn.k_proj", "attn_k", 0, 0},
    {"self_attn.v_proj", "attn_v", 0, 0},       {"self_attn.o_proj", "attn_output", 0, 0},
    {"self_attn.q_norm", "attn_q_norm", 0, 0},  {"self_attn.k_norm", "attn_k_norm", 0, 0},
    {"linear_attn.in_proj_qkv", "attn_qkv", HYBRID, 0}, {"linear_attn.in_proj_z", "attn_gate", HYBRID, 0},
    {"linear_attn.in_proj_b", "ssm_beta", HYBRID, 0},   {"linear_attn.in_proj_a", "ssm_alpha", HYBRID, 0},
    {"linear_attn.conv1d", "ssm_conv1d", HYBRID, 0},    {"linear_attn.dt_bias", "ssm_dt.bias", HYBRID, 1},
    {"linear_attn.A_log", "ssm_a", HYBRID, 1},          {"linear_attn.norm", "ssm_norm", HYBRID, 0},
    {"linear_attn.out_proj", "ssm_out", HYBRID, 0},
    {"linear_attn.in_proj_qkvz", "attn_qkv", HYBRID, 0}, {"linear_attn.in_proj_qkvz", "attn_gate", HYBRID, 0},
    {"linear_attn.in_proj_ba", "ssm_ba", HYBRID, 0},
    {"mlp.gate", "ffn_gate_inp", HYBRID, 0},            {"mlp.shared_expert_gate", "ffn_gate_inp_shexp", HYBRID, 0},
    {"mlp.shared_expert.gate_proj", "ffn_gate_shexp", HYBRID, 0},
    {"mlp.shared_expert.up_proj", "ffn_up_shexp", HYBRID, 0},
    {"mlp.shared_expert.down_proj", "ffn_down_shexp", HYBRID, 0},
    {"post_attention_layernorm", "ffn_norm", 0, 0},
    {"post_attention_layernorm", "post_attention_norm", HYBRID, 0},
    /* Gemma 2/3 keep a norm after attention, so the ffn norm is the one before the feed-forward */
    {"post_attention_layernorm", "post_attention_norm", A(ARCH_GEMMA3), 0},
    {"pre_feedforward_layernorm", "ffn_norm", A(ARCH_GEMMA3), 0},
    {"mlp.gate_proj", "ffn_gate", 0, 0},        {"mlp.up_proj", "ffn_up", 0, 0},
    {"mlp.down_proj", "ffn_down", 0, 0},
    {"post_feedforward_layernorm", "post_ffw_norm", A(ARCH_GEMMA3), 0},
    /* LFM2 (llama.cpp arch lfm2) */
    {"operator_norm", "attn_norm", A(ARCH_LFM2), 0},
    {"self_attn.q_layernorm", "attn_q_norm", A(ARCH_LFM2), 0}, {"self_attn.k_layernorm", "attn_k_norm", A(ARCH_LFM2), 0},
    {"self_attn.out_proj", "attn_output", A(ARCH_LFM2), 0},
    {"conv.conv", "shortconv.conv", A(ARCH_LFM2), 0},         {"conv.in_proj", "shortconv.in_proj", A(ARCH_LFM2), 0},
    {"conv.out_proj", "shortconv.out_proj", A(ARCH_LFM2), 0},
    {"ffn_norm", "ffn_norm", A(ARCH_LFM2), 0},
    {"feed_forward.w1", "ffn_gate", A(ARCH_LFM2), 0},         {"feed_forward.w3", "ffn_up", A(ARCH_LFM2), 0},
    {"feed_forward.w2", "ffn_down", A(ARCH_LFM2), 0},
};
_Static_assert(ARCH_COUNT <= 32, "an architecture mask fits in unsigned");

static int layer_name_applies(size_t i, enum model_arch arch) {
    if (layer_names[i].archs) return (layer_names[i].archs & A(arch)) != 0;
    for (size_t j = 0; j < sizeof layer_names / sizeof layer_names[0]; j++)
        if ((layer_names[j].archs & A(arch)) && !strcmp(layer_names[j].hf, layer_names[i].hf)) return 0;
    return 1;
}
#undef A
#undef HYBRID

/* RMSNorm weights (not the DeltaNet's gated norm, which scales by w). */
static int is_norm(const char *module) {
    size_t n = strlen(module);
    return (n >= 9 && !strcmp(module + n - 9, "layernorm")) || !strcmp(module, "self_attn.q_norm") ||
           !strcmp(module, "self_attn.k_norm");
}

/* How a tensor's values change on the way to GGUF (llama.cpp's converter). */
struct xform {
    int perm_heads;          /* llama q/k: rows permuted for adjacent-pair RoPE */
    const int64_t *row_src;  /* GGUF row r <- source row row_src[r] (NULL: same) */
    const int64_t *col_src;  /* GGUF column i <- source column col_src[i] (NULL: same) */
    float add;               /* + add (zero-centred norms stored as 1 + w) */
    int neg_exp;             /* -exp(x) (A_log -> A) */
    int64_t n_rows;          /* rows written (with row_src); 0: the source's */
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
    threadpool_t *tp; /* rows are converted in parallel: the output does not depend on the threads */
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

struct conv_job {
    const struct gb_tensor *src;
    enum gb_type t;
    const struct xform *x;
    uint8_t *out;
    int64_t n_out, n_in, hd;
    size_t row_in, row_out;
    struct gb_quant_fns fns;
    _Atomic int nomem;
};

/* Rows [lo, hi) of one conversion: each output row depends on its source row alone. */
static void conv_worker(void *ctx, int ith, int nth) {
    struct conv_job *cj = ctx;
    const struct gb_tensor *src = cj->src;
    const enum gb_type t = cj->t;
    const struct xform *x = cj->x;
    const int64_t n_in = cj->n_in, hd = cj->hd;
    const size_t row_in = cj->row_in, row_out = cj->row_out;
    const struct gb_quant_fns fns = cj->fns;
    uint8_t *out = cj->out;
    long lo, hi;
    tp_range((long)cj->n_out, ith, nth, &lo, &hi);
    if (lo >= hi) return;
    float *row = malloc((size_t)n_in * sizeof *row), *tmp = malloc((size_t)n_in * sizeof *tmp);
    if (!row || !tmp) {
        free(row);
        free(tmp);
        atomic_store(&cj->nomem, 1);
        return;
    }
    for (int64_t r = lo; r < hi; r++) {
        int64_t s = x->row_src ? x->row_src[r] : r;
        if (x->perm_heads) { /* GGUF row h*hd + 2i <- HF row h*hd + i; 2i+1 <- i + hd/2 */
            int64_t h = r / hd, j = r % hd;
            s = h * hd + (j % 2 ? j / 2 + hd / 2 : j / 2);
        }
        const uint8_t *in = (const uint8_t *)src->data + (size_t)s * row_in;
        uint8_t *o = out + (size_t)r * row_out;
        if (t == src->type && !x->col_src && x->add == 0 && !x->neg_exp) { memcpy(o, in, row_in); continue; }
        type_to_f32(src->type, in, row, n_in);
        if (x->col_src) {
            for (int64_t i = 0; i < n_in; i++) tmp[i] = row[x->col_src[i]];
            memcpy(row, tmp, (size_t)n_in * sizeof *row);
        }
        for (int64_t i = 0; i < n_in; i++) row[i] = x->neg_exp ? -expf(row[i]) : row[i] + x->add;
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
    free(tmp);
}

/* Convert src ([n_out, n_in], or 1-D: one row) to type t through x. Returns the buffer
 * (or the source data when nothing changes). Tensors of more dims are read as
 * [ne[0], the rest]. */
static gerbil_status convert(struct qctx *q, const struct gb_tensor *src, enum gb_type t, const struct xform *x,
                             const void **data, size_t *nbytes) {
    int64_t n_out = src->n_dims >= 2 ? src->ne[0] : 1;
    int64_t n_in = tensor_nelements(src) / n_out;
    if (x->n_rows) n_out = x->n_rows;
    size_t row_out = type_row_size(t, n_in), row_in = type_row_size(src->type, n_in);
    *nbytes = row_out * (size_t)n_out;
    int same = !x->perm_heads && !x->row_src && !x->col_src && x->add == 0 && !x->neg_exp;
    if (t == src->type && same) { *data = src->data; return GERBIL_OK; }
    uint8_t *out = qalloc(q, *nbytes);
    if (!out) return err_set(GERBIL_ERR_NOMEM, "out of memory converting %s", src->name);
    struct conv_job j = {.src = src, .t = t, .x = x, .out = out, .n_out = n_out, .n_in = n_in, .row_in = row_in,
                         .row_out = row_out, .hd = x->perm_heads ? n_out / x->perm_heads : 0, .fns = quant_fns(t)};
    atomic_init(&j.nomem, 0);
    tp_run(q->tp, conv_worker, &j);
    if (atomic_load(&j.nomem)) return err_set(GERBIL_ERR_NOMEM, "out of memory converting %s", src->name);
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
                                 const char *gname, int layer, const struct xform *x, int idx, int total) {
    if (t->type != GB_TYPE_F32 && t->type != GB_TYPE_F16 && t->type != GB_TYPE_BF16)
        return err_set(GERBIL_ERR_UNSUPPORTED, "%s: tensor %s is %s; quantize needs f32, f16 or bf16 weights",
                       q->in, t->name, type_name(t->type));
    /* [C, 1, K] conv kernels are squeezed to [C, K] as llama.cpp's converter does */
    int64_t ne[2] = {x->n_rows ? x->n_rows : t->ne[0], tensor_nelements(t) / t->ne[0]};
    int n_dims = t->n_dims == 1 ? 1 : 2;
    for (int d = 1; d < t->n_dims - 1; d++)
        if (t->ne[d] != 1)
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
    GB_TRY(convert(q, t, to, x, &data, &nbytes));
    q->bytes_out += nbytes;
    return gguf_writer_add_tensor(w, gname, to, n_dims, ne, data, nbytes);
}

/* Qwen3.5 with more value heads than key heads: llama.cpp's converter reorders the value
 * heads from grouped (head g * r + j belongs to key head g) to tiled (j * nk + g), in
 * every tensor indexed by value head. Returns the source index of each of n slots of
 * `width` channels starting at `first` (identity outside), or NULL when no reorder. */
static int64_t *v_head_order(struct qctx *q, int64_t n, int64_t first, int width) {
    const struct deltanet_config *d = &q->cfg.dn;
    if (d->n_v_heads == d->n_k_heads || q->cfg.arch != ARCH_QWEN35) return NULL; /* qwen3next: grouped */
    int64_t *m = qalloc(q, (size_t)n * sizeof *m);
    if (!m) return NULL;
    const int r = d->n_v_heads / d->n_k_heads;
    for (int64_t i = 0; i < n; i++) {
        m[i] = i;
        if (i < first || i >= first + (int64_t)d->n_v_heads * width) continue;
        int64_t h = (i - first) / width, c = (i - first) % width; /* tiled slot h = j * nk + g */
        int64_t j = h / d->n_k_heads, g = h % d->n_k_heads;
        m[i] = first + (g * r + j) * width + c;
    }
    return m;
}

/* Qwen3-Next's in_proj_qkvz rows, grouped per key head g as [q_g, k_g, v_g, z_g]: the
 * source rows of attn_qkv ([q | k | v], z == 0) or of attn_gate (z == 1), as llama.cpp's
 * converter un-interleaves them. */
static int64_t *qkvz_rows(struct qctx *q, int z, int64_t *n_rows) {
    const struct deltanet_config *d = &q->cfg.dn;
    const int64_t nk = d->n_k_heads, dk = d->k_dim, rv = (int64_t)(d->n_v_heads / d->n_k_heads) * d->v_dim;
    const int64_t G = 2 * dk + 2 * rv, key_dim = nk * dk;
    *n_rows = z ? nk * rv : 2 * key_dim + nk * rv;
    int64_t *m = qalloc(q, (size_t)*n_rows * sizeof *m);
    if (!m) return NULL;
    for (int64_t i = 0; i < *n_rows; i++) {
        if (z) { m[i] = (i / rv) * G + 2 * dk + rv + i % rv; continue; }
        if (i < 2 * key_dim) m[i] = (i % key_dim) / dk * G + (i / key_dim) * dk + i % dk; /* q, then k */
        else m[i] = (i - 2 * key_dim) / rv * G + 2 * dk + (i - 2 * key_dim) % rv;
    }
    return m;
}

/* The changes a Qwen3.5 / Qwen3-Next DeltaNet tensor needs (module: the path after the
 * layer; gguf: the name it is written under). Norms are handled by the caller. */
static struct xform hybrid_xform(struct qctx *q, const char *module, const char *gguf, const struct gb_tensor *t) {
    const struct deltanet_config *d = &q->cfg.dn;
    struct xform x = {0};
    if (!strcmp(module, "linear_attn.in_proj_qkvz")) {
        x.row_src = qkvz_rows(q, !strcmp(gguf, "attn_gate"), &x.n_rows);
        return x;
    }
    if (!strcmp(module, "linear_attn.in_proj_qkvz")) {
        x.row_src = qkvz_rows(q, !strcmp(gguf, "attn_gate"), &x.n_rows);
        return x;
    }
    const int64_t key2 = 2 * (int64_t)d->n_k_heads * d->k_dim;
    if (!strcmp(module, "linear_attn.A_log")) {
        x.neg_exp = 1;
        x.col_src = v_head_order(q, t->ne[0], 0, 1);
    } else if (!strcmp(module, "linear_attn.dt_bias"))
        x.col_src = v_head_order(q, t->ne[0], 0, 1);
    else if (!strcmp(module, "linear_attn.in_proj_qkv") || !strcmp(module, "linear_attn.conv1d"))
        x.row_src = v_head_order(q, t->ne[0], key2, d->v_dim);
    else if (!strcmp(module, "linear_attn.in_proj_z"))
        x.row_src = v_head_order(q, t->ne[0], 0, d->v_dim);
    else if (!strcmp(module, "linear_attn.in_proj_a") || !strcmp(module, "linear_attn.in_proj_b"))
        x.row_src = v_head_order(q, t->ne[0], 0, 1);
    else if (!strcmp(module, "linear_attn.out_proj"))
        x.col_src = v_head_order(q, t->ne[1], 0, d->v_dim);
    return x;
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

/* A SentencePiece-style BPE tokenizer.json (Llama 2, Mistral, Gemma, TinyLlama): BPE with
 * byte_fallback whose spaces are U+2581 (a Replace ' ' -> U+2581 normalizer or a Metaspace
 * pre-tokenizer), no byte-level alphabet. *space_prefix: whether it prepends U+2581 to the
 * text (a Prepend normalizer, or Metaspace with prepend_scheme other than "never"). */
static int has_type(const cJSON *node, const char *list_key, const char *type, const cJSON **found) {
    if (!node) return 0;
    if (!strcmp(json_get_str(node, "type", ""), type)) return *found = node, 1;
    const cJSON *seq = cJSON_GetObjectItemCaseSensitive(node, list_key), *it;
    cJSON_ArrayForEach(it, seq) if (has_type(it, list_key, type, found)) return 1;
    return 0;
}

static int is_spm_bpe(const cJSON *tj, int *space_prefix) {
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(tj, "model");
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(tj, "normalizer");
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(tj, "pre_tokenizer"), *f = NULL;
    if (strcmp(json_get_str(model, "type", ""), "BPE") || !json_get_bool(model, "byte_fallback", 0) ||
        is_byte_level(pre))
        return 0;
    *space_prefix = 0;
    if (has_type(pre, "pretokenizers", "Metaspace", &f)) {
        const char *scheme = json_get_str(f, "prepend_scheme", NULL);
        *space_prefix = scheme ? strcmp(scheme, "never") != 0 : json_get_bool(f, "add_prefix_space", 1);
        return 1;
    }
    int replace = 0;
    const cJSON *seq = norm ? cJSON_GetObjectItemCaseSensitive(norm, "normalizers") : NULL, *it;
    const cJSON *one[1] = {norm};
    int n = seq ? cJSON_GetArraySize(seq) : norm ? 1 : 0;
    for (int i = 0; i < n; i++) {
        it = seq ? cJSON_GetArrayItem(seq, i) : one[0];
        const char *type = json_get_str(it, "type", "");
        if (!strcmp(type, "Prepend") && !strcmp(json_get_str(it, "prepend", ""), "\xe2\x96\x81")) *space_prefix = 1;
        if (!strcmp(type, "Replace") && !strcmp(json_get_str(it, "content", ""), "\xe2\x96\x81")) replace = 1;
    }
    return replace;
}

struct piece { const char *s; int64_t id; };
static int cmp_piece(const void *a, const void *b) {
    return strcmp(((const struct piece *)a)->s, ((const struct piece *)b)->s);
}

/* Scores for llama.cpp's SentencePiece merging (merge the adjacent pair whose joined piece
 * scores highest, leftmost first; src/text/tok_gguf.c reads them back the same way): a
 * piece scores -(1 + rank of the first merge that produces it), so merges happen in
 * tokenizer.json's order; pieces no merge produces score 0 (single characters, bytes,
 * specials) and are counted in *n_unreached when longer than one character. */
static gerbil_status spm_scores(char **toks, int64_t n, const char **merges, int k, float **out, int *n_unreached) {
    *out = NULL;
    *n_unreached = 0;
    float *sc = calloc((size_t)n, sizeof *sc);
    struct piece *ix = malloc((size_t)n * sizeof *ix);
    char *buf = NULL;
    size_t cap = 0;
    if (!sc || !ix) { free(sc); free(ix); return err_set(GERBIL_ERR_NOMEM, "out of memory"); }
    for (int64_t i = 0; i < n; i++) ix[i] = (struct piece){toks[i], i};
    qsort(ix, (size_t)n, sizeof *ix, cmp_piece);
    for (int r = 0; r < k; r++) {
        const char *m = merges[r], *sp = strchr(m, ' ');
        if (!sp) continue;
        size_t la = (size_t)(sp - m), lb = strlen(sp + 1);
        if (la + lb + 1 > cap) {
            cap = 2 * (la + lb + 1);
            char *nb = realloc(buf, cap);
            if (!nb) { free(buf); free(sc); free(ix); return err_set(GERBIL_ERR_NOMEM, "out of memory"); }
            buf = nb;
        }
        memcpy(buf, m, la);
        memcpy(buf + la, sp + 1, lb + 1);
        struct piece key = {buf, 0}, *hit = bsearch(&key, ix, (size_t)n, sizeof *ix, cmp_piece);
        if (hit && sc[hit->id] == 0.0f) sc[hit->id] = -(float)(r + 1);
    }
    for (int64_t i = 0; i < n; i++) {
        if (sc[i] != 0.0f) continue;
        const unsigned char *t = (const unsigned char *)toks[i];
        size_t chars = 0;
        for (; *t; t++) chars += (*t & 0xC0) != 0x80;
        if (chars > 1 && strncmp(toks[i], "<0x", 3) && toks[i][0] != '<' && toks[i][0] != '[') (*n_unreached)++;
    }
    free(buf);
    free(ix);
    *out = sc;
    return GERBIL_OK;
}

/* tokenizer.ggml.* from IN/tokenizer.json (+ tokenizer_config.json, config.json), as
 * convert_hf_to_gguf.py's _set_vocab_gpt2 + gguf.SpecialVocab for byte-level BPE, and as
 * llama.cpp's "llama" vocabulary (tokens, scores, types) for SentencePiece-style BPE. Writes
 * nothing (and says so) when IN has no tokenizer.json or another kind (Unigram, WordPiece). */
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
    int space_prefix = 0;
    const int spm = cJSON_IsObject(vocab) && cJSON_IsArray(mlist) && is_spm_bpe(tj, &space_prefix);
    if (strcmp(json_get_str(model, "type", ""), "BPE") || !cJSON_IsObject(vocab) || !cJSON_IsArray(mlist) ||
        (!spm && !is_byte_level(cJSON_GetObjectItemCaseSensitive(tj, "pre_tokenizer")))) {
        fprintf(stderr, "gerbil quantize: %s is neither a byte-level BPE nor a SentencePiece-style BPE tokenizer "
                        "(Unigram and WordPiece tokenizers are not converted yet); the GGUF will have no tokenizer\n",
                path);
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
    const char *pre = q->cfg.arch == ARCH_QWEN35 ? "qwen35" : q->cfg.arch == ARCH_LFM2 ? "lfm2"
                      : q->cfg.arch == ARCH_QWEN2 || q->cfg.arch == ARCH_QWEN3 || q->cfg.arch == ARCH_QWEN3NEXT
                          ? "qwen2" : "llama-bpe";
    int n_unreached = 0;
    if (spm) {
        /* llama.cpp's "llama" model: no merges, scores; types: unknown, byte pieces */
        float *scores = NULL;
        if ((st = spm_scores(toks, n, merges, k, &scores, &n_unreached))) goto merges_done;
        const char *unk = tc ? special_content(cJSON_GetObjectItemCaseSensitive(tc, "unk_token")) : NULL;
        int unk_id = unk ? token_id(vocab, added, unk) : -1;
        if (unk_id < 0) unk_id = token_id(vocab, added, json_get_str(model, "unk_token", ""));
        for (int64_t i = 0; i < n; i++) {
            const char *t = toks[i];
            if (types[i] == 1 && strlen(t) == 6 && !strncmp(t, "<0x", 3) && t[5] == '>' && isxdigit((unsigned char)t[3]) &&
                isxdigit((unsigned char)t[4]))
                types[i] = 6; /* BYTE */
        }
        if (unk_id >= 0 && unk_id < n) types[unk_id] = 2; /* UNKNOWN */
        if ((st = gguf_writer_add_str(w, "tokenizer.ggml.model", "llama")) ||
            (st = gguf_writer_add_str_arr(w, "tokenizer.ggml.tokens", (const char *const *)toks, (uint64_t)n)) ||
            (st = gguf_writer_add_arr(w, "tokenizer.ggml.scores", GGUF_VT_F32, scores, (uint64_t)n)) ||
            (st = gguf_writer_add_arr(w, "tokenizer.ggml.token_type", GGUF_VT_I32, types, (uint64_t)n)) ||
            (st = gguf_writer_add_bool(w, "tokenizer.ggml.add_space_prefix", space_prefix))) {
            free(scores);
            goto merges_done;
        }
        free(scores);
    } else if ((st = gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2")) ||
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
    if (!st && spm) {
        fprintf(stderr, "tokenizer: llama (SentencePiece BPE, scores from the merge ranks%s), %lld tokens (%d padding)\n",
                space_prefix ? ", space prefix" : "", (long long)n, n_pad);
        if (n_unreached)
            fprintf(stderr, "gerbil quantize: note: %d multi-character pieces no merge produces; SentencePiece-style "
                            "merging by score may produce them where tokenizer.json would not\n", n_unreached);
    } else if (!st)
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

/* Qwen3-Next MoE layer l: the experts' gate, up and down matrices stacked into
 * ffn_{gate,up,down}_exps [n_expert, out, in], from per-expert tensors
 * (mlp.experts.E.*_proj.weight) or transformers' fused ones (mlp.experts.gate_up_proj
 * [E, 2I, D], mlp.experts.down_proj [E, D, I]). */
static gerbil_status gguf_experts(struct qctx *q, struct gguf_writer *w, int l, int *idx, int total) {
    const struct model_config *c = &q->cfg;
    const int64_t E = c->moe.n_expert, I = c->moe.n_ff_exp, D = c->n_embd;
    static const char *proj[3] = {"gate_proj", "up_proj", "down_proj"};
    static const char *gn[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
    char hname[256], gname[64];
    snprintf(hname, sizeof hname, "model.layers.%d.mlp.experts.gate_up_proj", l);
    const struct gb_tensor *fgu = find_mark(q, hname);
    snprintf(hname, sizeof hname, "model.layers.%d.mlp.experts.down_proj", l);
    const struct gb_tensor *fd = find_mark(q, hname);
    const struct xform none = {0};
    for (int p = 0; p < 3; p++) {
        const int64_t rows = p == 2 ? D : I, cols = p == 2 ? I : D;
        snprintf(gname, sizeof gname, "blk.%d.%s.weight", l, gn[p]);
        enum gb_type wanted, to = matrix_type(q, gname, l, cols, &wanted);
        const size_t per = type_row_size(to, cols) * (size_t)rows;
        uint8_t *buf = qalloc(q, per * (size_t)E);
        if (!buf) return err_set(GERBIL_ERR_NOMEM, "out of memory stacking %s", gname);
        for (int64_t e = 0; e < E; e++) {
            const struct gb_tensor *src = p == 2 ? fd : fgu;
            struct gb_tensor v;
            if (src) { /* one expert's rows of the fused 3-D tensor */
                const int64_t src_rows = p == 2 ? D : 2 * I;
                if (src->n_dims != 3 || src->ne[0] != E || src->ne[1] != src_rows || src->ne[2] != cols)
                    return err_set(GERBIL_ERR_FORMAT, "%s: tensor \"%s\" should be [%lld, %lld, %lld]", q->in,
                                   src->name, (long long)E, (long long)src_rows, (long long)cols);
                const size_t row_in = type_row_size(src->type, cols);
                v = *src;
                v.n_dims = 2;
                v.ne[0] = rows;
                v.ne[1] = cols;
                v.data = (const uint8_t *)src->data + (size_t)(e * src_rows + (p == 1 ? I : 0)) * row_in;
                v.nbytes = (size_t)rows * row_in;
            } else {
                snprintf(hname, sizeof hname, "model.layers.%d.mlp.experts.%lld.%s.weight", l, (long long)e, proj[p]);
                if (!(src = find_mark(q, hname)))
                    return err_set(GERBIL_ERR_FORMAT, "%s: missing tensor \"%s\"", q->in, hname);
                if (src->n_dims != 2 || src->ne[0] != rows || src->ne[1] != cols)
                    return err_set(GERBIL_ERR_FORMAT, "%s: tensor \"%s\" should be [%lld, %lld]", q->in, hname,
                                   (long long)rows, (long long)cols);
                v = *src;
            }
            if (v.type != GB_TYPE_F32 && v.type != GB_TYPE_F16 && v.type != GB_TYPE_BF16)
                return err_set(GERBIL_ERR_UNSUPPORTED, "%s: tensor %s is %s; quantize needs f32, f16 or bf16 weights",
                               q->in, v.name, type_name(v.type));
            const void *data;
            size_t nbytes;
            GB_TRY(convert(q, &v, to, &none, &data, &nbytes));
            GB_ASSERT(nbytes == per);
            memcpy(buf + (size_t)e * per, data, per);
        }
        fprintf(stderr, "[%4d/%4d] %-32s [%lld x %lld x %lld] -> %s\n", ++*idx, total, gname, (long long)E,
                (long long)rows, (long long)cols, type_name(to));
        if (to != wanted) q->n_fallback++;
        q->bytes_out += per * (size_t)E;
        GB_TRY(gguf_writer_add_tensor(w, gname, to, 3, (int64_t[]){E, rows, cols}, buf, per * (size_t)E));
    }
    return GERBIL_OK;
}

static const char *gguf_arch(enum model_arch a) {
    switch (a) {
    case ARCH_QWEN2: return "qwen2";
    case ARCH_QWEN3: return "qwen3";
    case ARCH_QWEN35: return "qwen35";
    case ARCH_GEMMA3: return "gemma3";
    case ARCH_QWEN3NEXT: return "qwen3next";
    case ARCH_LFM2: return "lfm2";
    case ARCH_LLAMA: case ARCH_MISTRAL: return "llama";
    default: return NULL; /* no GGUF writer yet (Gemma 4) */
    }
}

/* The period p of llama.cpp's rule "layer i slides when i % p < p - 1" that gives the
 * model's sliding layers; 0 when none does. */
static uint32_t swa_period(const struct model_config *c) {
    for (int p = 1; p <= c->n_layer + 1; p++) {
        int ok = 1;
        for (int i = 0; ok && i < c->n_layer; i++) ok = c->layer_sliding[i] == (i % p < p - 1);
        if (ok) return (uint32_t)p;
    }
    return 0;
}

/* Gemma 3's keys beyond the common ones (see the top of the file). */
static gerbil_status gemma3_keys(struct qctx *q, struct gguf_writer *w, const char *arch) {
    const struct model_config *c = &q->cfg;
    char key[128];
    float llama_scale = c->n_layer == 62 ? 1.0f / sqrtf((float)(c->n_embd / c->n_head)) : 1.0f / sqrtf((float)c->head_dim);
    if (fabsf(c->attn_scale - llama_scale) > 1e-6f * llama_scale)
        return err_set(GERBIL_ERR_UNSUPPORTED, "%s: query_pre_attn_scalar gives the attention scale %g, but a GGUF "
                       "gemma3 file is run with %g (1/sqrt(head_dim)) and has no key for it", q->in,
                       (double)c->attn_scale, (double)llama_scale);
    if (c->rope_local.type != ROPE_DEFAULT || c->rope_local.n_dims != c->rope.n_dims)
        return err_set(GERBIL_ERR_UNSUPPORTED, "%s: the sliding layers' RoPE has scaling or a partial rotary "
                       "factor; GGUF gemma3 has only rope.freq_base_swa", q->in);
    snprintf(key, sizeof key, "%s.rope.freq_base_swa", arch);
    GB_TRY(gguf_writer_add_f32(w, key, (float)c->rope_local.theta));
    if (c->sliding_window) {
        uint32_t p = swa_period(c);
        if (!p)
            return err_set(GERBIL_ERR_UNSUPPORTED, "%s: the sliding layers do not follow llama.cpp's periodic "
                           "pattern (layer i slides when i %% p < p - 1)", q->in);
        snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", arch);
        GB_TRY(gguf_writer_add_u32(w, key, p));
    }
    if (c->final_softcap > 0) {
        snprintf(key, sizeof key, "%s.final_logit_softcapping", arch);
        GB_TRY(gguf_writer_add_f32(w, key, c->final_softcap));
    }
    return GERBIL_OK;
}

static gerbil_status write_gguf(struct qctx *q) {
    const struct model_config *c = &q->cfg;
    const char *arch = gguf_arch(c->arch);
    if (!arch)
        return err_set(GERBIL_ERR_UNSUPPORTED, "%s: %s cannot be written as GGUF yet (its tensors and keys are not "
                       "mapped); --type mlx4/mlx8 writes an MLX folder", q->in, model_arch_name(c->arch));
    if (c->rope.type != ROPE_DEFAULT && c->rope.type != ROPE_LINEAR && c->rope.type != ROPE_YARN)
        return err_set(GERBIL_ERR_UNSUPPORTED, "%s: this rope_scaling type is not supported in GGUF output yet "
                       "(default, linear and yarn are)", q->in);
    if (c->mlx.bits) return err_set(GERBIL_ERR_UNSUPPORTED, "%s is already MLX-quantized", q->in);
    if (c->arch == ARCH_LFM2 && c->sc.bias)
        return err_set(GERBIL_ERR_UNSUPPORTED, "%s: conv_bias is set; GGUF lfm2 (llama.cpp) has no short-conv biases",
                       q->in);
    struct gguf_writer *w;
    GB_TRY(gguf_writer_new(&w));
    gerbil_status st;
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
        (c->arch != ARCH_LFM2 &&
         (st = gguf_writer_add_u32(w, KEY("attention.head_count_kv"), (uint32_t)c->n_head_kv))) ||
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
    if (c->arch == ARCH_QWEN35 || c->arch == ARCH_QWEN3NEXT) {
        const struct deltanet_config *d = &c->dn;
        int every = 0; /* llama.cpp reads the layer pattern as an interval */
        for (int l = 0; l < c->n_layer && !every; l++)
            if (c->layer_kind[l] == LAYER_ATTENTION) every = l + 1;
        for (int l = 0; l < c->n_layer; l++)
            if ((c->layer_kind[l] == LAYER_ATTENTION) != (every && (l + 1) % every == 0)) {
                st = err_set(GERBIL_ERR_UNSUPPORTED, "%s: GGUF %s needs full-attention layers at a fixed "
                             "interval", q->in, arch);
                goto out;
            }
        const int32_t sections[4] = {11, 11, 10, 0};
        if ((st = gguf_writer_add_u32(w, KEY("ssm.conv_kernel"), (uint32_t)d->conv_kernel)) ||
            (st = gguf_writer_add_u32(w, KEY("ssm.state_size"), (uint32_t)d->k_dim)) ||
            (st = gguf_writer_add_u32(w, KEY("ssm.group_count"), (uint32_t)d->n_k_heads)) ||
            (st = gguf_writer_add_u32(w, KEY("ssm.time_step_rank"), (uint32_t)d->n_v_heads)) ||
            (st = gguf_writer_add_u32(w, KEY("ssm.inner_size"), (uint32_t)(d->v_dim * d->n_v_heads))) ||
            (st = gguf_writer_add_u32(w, KEY("full_attention_interval"), (uint32_t)(every ? every : c->n_layer + 1))) ||
            (c->arch == ARCH_QWEN35 &&
             (st = gguf_writer_add_arr(w, KEY("rope.dimension_sections"), GGUF_VT_I32, sections, 4))))
            goto out;
    }
    if (c->arch == ARCH_QWEN3NEXT && c->moe.n_expert) {
        const struct moe_config *m = &c->moe;
        if (!m->norm_topk_prob) { /* llama.cpp always renormalises the selected weights */
            st = err_set(GERBIL_ERR_UNSUPPORTED, "%s: GGUF qwen3next cannot express norm_topk_prob false", q->in);
            goto out;
        }
        if ((st = gguf_writer_add_u32(w, KEY("expert_count"), (uint32_t)m->n_expert)) ||
            (st = gguf_writer_add_u32(w, KEY("expert_used_count"), (uint32_t)m->n_used)) ||
            (st = gguf_writer_add_u32(w, KEY("expert_feed_forward_length"), (uint32_t)m->n_ff_exp)) ||
            (st = gguf_writer_add_u32(w, KEY("expert_shared_feed_forward_length"), (uint32_t)m->n_ff_shexp)))
            goto out;
    }
    if (c->arch == ARCH_LFM2) { /* KV heads per layer, 0 marking the short-conv layers */
        uint32_t *kv = qalloc(q, (size_t)c->n_layer * sizeof *kv);
        if (!kv) { st = err_set(GERBIL_ERR_NOMEM, "out of memory"); goto out; }
        for (int l = 0; l < c->n_layer; l++) kv[l] = c->layer_kind[l] == LAYER_ATTENTION ? (uint32_t)c->n_head_kv : 0;
        if ((st = gguf_writer_add_arr(w, KEY("attention.head_count_kv"), GGUF_VT_U32, kv, (uint64_t)c->n_layer)) ||
            (st = gguf_writer_add_u32(w, KEY("shortconv.l_cache"), (uint32_t)c->sc.kernel)))
            goto out;
    }
    if (c->arch == ARCH_GEMMA3 && (st = gemma3_keys(q, w, arch))) goto out;
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
    const struct xform none = {0};
    if ((st = gguf_tensor(q, w, t, "token_embd.weight", -1, &none, ++idx, total))) goto out;
    int perm = c->arch == ARCH_LLAMA || c->arch == ARCH_MISTRAL,
        is35 = c->arch == ARCH_QWEN35 || c->arch == ARCH_QWEN3NEXT; /* the hybrids */
    /* norms that scale by 1 + w (Gemma 3, the Qwen hybrids): GGUF stores the sum, which a
     * hybrid source may hold already (norm_weights_shifted) */
    float norm_add = c->norm_add_one ? 1.0f : 0.0f;
    const struct gb_tensor *n0 = st_checkpoint_find(&q->ck, "model.layers.0.input_layernorm.weight");
    if (is35 && n0 && norm_weights_shifted(n0)) norm_add = 0;
    for (int l = 0; l < c->n_layer; l++)
        for (size_t i = 0; i < sizeof layer_names / sizeof layer_names[0]; i++)
            for (int b = 0; b < 2; b++) {
                if (!layer_name_applies(i, c->arch)) continue;
                if (layer_names[i].bare && b) continue;
                const char *sfx = layer_names[i].bare ? "" : b ? ".bias" : ".weight";
                snprintf(hname, sizeof hname, "model.layers.%d.%s%s", l, layer_names[i].hf, sfx);
                if (!(t = find_mark(q, hname))) continue;
                snprintf(gname, sizeof gname, "blk.%d.%s%s", l, layer_names[i].gguf, sfx);
                struct xform x = is35 ? hybrid_xform(q, layer_names[i].hf, layer_names[i].gguf, t) : none;
                if (x.n_rows && !x.row_src) { st = err_set(GERBIL_ERR_NOMEM, "out of memory"); goto out; }
                if (is_norm(layer_names[i].hf)) x.add = norm_add;
                if (perm && !strcmp(layer_names[i].gguf, "attn_q")) x.perm_heads = c->n_head;
                if (perm && !strcmp(layer_names[i].gguf, "attn_k")) x.perm_heads = c->n_head_kv;
                if ((st = gguf_tensor(q, w, t, gname, l, &x, ++idx, total))) goto out;
            }
    for (int l = 0; c->layer_moe && l < c->n_layer; l++)
        if (c->layer_moe[l] && (st = gguf_experts(q, w, l, &idx, total))) goto out;
    struct xform onorm = {.add = norm_add};
    if ((t = find_mark(q, "model.norm.weight")) &&
        (st = gguf_tensor(q, w, t, "output_norm.weight", -1, &onorm, ++idx, total)))
        goto out;
    /* LFM2's final norm, which llama.cpp names token_embd_norm */
    if ((t = find_mark(q, "model.embedding_norm.weight")) &&
        (st = gguf_tensor(q, w, t, "token_embd_norm.weight", -1, &none, ++idx, total)))
        goto out;
    t = find_mark(q, "lm_head.weight");
    if (t && !c->tie_embeddings && (st = gguf_tensor(q, w, t, "output.weight", -1, &none, ++idx, total))) goto out;
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
    int64_t ne[GB_MAX_DIMS];
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

struct mlx_job {
    const struct gb_tensor *t;
    uint32_t *words;
    uint8_t *sc, *bi;
    int64_t rows, cols, wpr, gpr;
    size_t sbs;
    int bits, g;
    _Atomic int nomem;
};

/* Rows [lo, hi) of one MLX quantization (rows are independent). */
static void mlx_worker(void *ctx, int ith, int nth) {
    struct mlx_job *m = ctx;
    long lo, hi;
    tp_range((long)m->rows, ith, nth, &lo, &hi);
    if (lo >= hi) return;
    float *row = malloc((size_t)m->cols * sizeof *row);
    if (!row) { atomic_store(&m->nomem, 1); return; }
    size_t row_in = type_row_size(m->t->type, m->cols);
    for (int64_t r = lo; r < hi; r++) {
        type_to_f32(m->t->type, (const uint8_t *)m->t->data + (size_t)r * row_in, row, m->cols);
        quantize_row_mlx_ref(row, m->words + r * m->wpr, m->sc + (size_t)(r * m->gpr) * m->sbs,
                             m->bi + (size_t)(r * m->gpr) * m->sbs, m->t->type, m->bits, m->g, m->cols);
    }
    free(row);
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
            e[n] = (struct st_entry){strdup(t->name), t->type, t->n_dims, {0}, t->data, t->nbytes};
            memcpy(e[n].ne, t->ne, sizeof t->ne);
            n++;
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
        if (!words || !sc || !bi) { st = err_set(GERBIL_ERR_NOMEM, "out of memory"); goto out; }
        struct mlx_job mj = {.t = t, .words = words, .sc = sc, .bi = bi, .rows = rows, .cols = cols, .wpr = wpr,
                             .gpr = gpr, .sbs = sbs, .bits = bits, .g = g};
        atomic_init(&mj.nomem, 0);
        tp_run(q->tp, mlx_worker, &mj);
        if (atomic_load(&mj.nomem)) { st = err_set(GERBIL_ERR_NOMEM, "out of memory"); goto out; }
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
    int n_threads = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { help(stdout); return 0; }
        if (!strcmp(argv[i], "--type")) {
            if (!(type = cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(argv[i], "--threads") || !strcmp(argv[i], "-t")) {
            const char *v = cli_value(argc, argv, &i);
            if (!v || cli_parse_int("--threads", v, 1, 1024, &n_threads)) return 2;
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
    /* OUT checked before any work: an output that cannot be written costs no conversion */
    char parent[4096];
    snprintf(parent, sizeof parent, "%s", q.out);
    char *slash = strrchr(parent, '/');
    if (!slash) snprintf(parent, sizeof parent, ".");
    else slash[slash == parent] = 0; /* "/x" -> "/" */
    if (stat(q.out, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "gerbil quantize: %s already exists as a folder; %s\n", q.out,
                q.qt->kind == OUT_GGUF ? "a GGUF output is a file path, e.g. OUT/model.gguf"
                                       : "remove it first (MLX output is a new folder)");
        return 2;
    }
    if (stat(parent, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "gerbil quantize: cannot write %s: the folder %s does not exist\n", q.out, parent);
        return 2;
    }
    if (access(parent, W_OK) != 0) {
        fprintf(stderr, "gerbil quantize: cannot write %s: %s: %s\n", q.out, parent, strerror(errno));
        return 2;
    }
    gerbil_status st = model_config_load(q.in, &q.cfg);
    if (st) return cli_fail("quantize", st);
    if ((st = st_checkpoint_open(q.in, &q.ck))) {
        model_config_free(&q.cfg);
        return cli_fail("quantize", st);
    }
    if (n_threads <= 0) {
        long n_cpu = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n_cpu > 0 ? (int)(n_cpu < 64 ? n_cpu : 64) : 1;
    }
    q.used = calloc((size_t)st_checkpoint_n_tensors(&q.ck) + 1, 1);
    q.tp = tp_create(n_threads);
    if (!q.used || !q.tp) st = err_set(GERBIL_ERR_NOMEM, "out of memory");
    else st = q.qt->kind == OUT_GGUF ? write_gguf(&q) : write_mlx(&q);
    if (!st && q.n_fallback)
        fprintf(stderr, "note: %d tensor(s) used a fallback type (see above)\n", q.n_fallback);
    if (!st) fprintf(stderr, "done: %s\n", q.out);
    for (int i = 0; i < q.n_bufs; i++) free(q.bufs[i]);
    free(q.bufs);
    free(q.used);
    if (q.tp) tp_free(q.tp);
    st_checkpoint_close(&q.ck);
    model_config_free(&q.cfg);
    return st ? cli_fail("quantize", st) : 0;
}
