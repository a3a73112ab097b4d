/* Where a model's tensors come from: a Hugging Face folder (safetensors, plain or MLX
 * affine-quantized) or a GGUF file. The binder asks for tensors by their Hugging Face
 * names; GGUF names are translated (blk.N.attn_q.weight, ...). */
#ifndef GB_WEIGHTS_H
#define GB_WEIGHTS_H

#include "io/gguf.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "tensor/weight.h"

struct backend;

struct weight_source {
    int is_gguf;
    enum model_arch arch;         /* GGUF names differ by architecture */
    struct st_checkpoint ck;
    struct gguf_file gg;
    const struct mlx_quant *mlx;  /* from config.json; bits 0 when not MLX */
    /* Multimodal checkpoints nest the language model: "model.X" is stored as
     * model_prefix + "X" and "lm_head.X" as head_prefix + "lm_head.X". */
    char model_prefix[32], head_prefix[32];
    int bare;             /* model_prefix "": the tensors are named without "model." */
    /* the backend the matrices are bound for: it may rearrange them once (weight_prepare) */
    struct backend *be;
};

/* Find where a safetensors checkpoint keeps the language model: "model." (text-only),
 * "model.language_model." (transformers 5 multimodal) or "language_model.model."
 * (MLX and older multimodal conversions). */
void wsrc_detect_prefix(struct weight_source *s);

/* NULL when absent. */
const struct gb_tensor *wsrc_find(const struct weight_source *s, const char *hf_name);
int wsrc_n_tensors(const struct weight_source *s);
/* hf_name as the file spells it (the GGUF name for GGUF files), for messages. */
const char *wsrc_file_name(const struct weight_source *s, const char *hf_name, char *buf, size_t cap);
const struct gb_tensor *wsrc_at(const struct weight_source *s, int i);
/* A [rows][cols] matrix named hf_name ("...weight"): a float type, a GGML block type,
 * or MLX affine (hf_name's .scales/.biases beside it). The message names the tensor
 * and what was expected when the shape or type is wrong. */
gerbil_status wsrc_matrix(const struct weight_source *s, const char *hf_name, int64_t rows, int64_t cols,
                          struct gb_weight *out);
/* A stack of n_mat [rows][cols] matrices stored as one [n_mat][rows][cols] tensor (MLX:
 * with [n_mat][rows][cols / group] scales and biases), as out[0 .. n_mat). */
gerbil_status wsrc_matrix_stack(const struct weight_source *s, const char *hf_name, int64_t n_mat, int64_t rows,
                                int64_t cols, struct gb_weight *out);
/* After the weights are bound (and packed): the loaded copies become read-only. */
void wsrc_seal(struct weight_source *s);
void wsrc_close(struct weight_source *s);

/* Whether an RMSNorm weight of a (1 + w) norm is stored with the 1 already added: its mean
 * is near 1 rather than near 0. Qwen3.5 / Qwen3-Next conversions disagree on this (mlx-lm
 * shifts when it converts, other converters do not, and the conv layout does not tell
 * reliably), so the values decide. */
int norm_weights_shifted(const struct gb_tensor *t);

#endif
