/* Element types: one traits table with the format facts (name, block size, bytes). */
#ifndef GB_DTYPE_H
#define GB_DTYPE_H

#include <stddef.h>
#include <stdint.h>

/* Append-only: values may be stored in files we write later. */
enum gb_type {
    GB_TYPE_F32 = 0,
    GB_TYPE_F16,
    GB_TYPE_BF16,
    GB_TYPE_I32,
    GB_TYPE_U32,
    GB_TYPE_U8,
    GB_TYPE_I8,
    GB_TYPE_I64,
    /* GGML block types (tensor/quant.h); never a safetensors dtype */
    GB_TYPE_Q8_0,
    GB_TYPE_Q4_0,
    GB_TYPE_Q4_1,
    GB_TYPE_Q5_0,
    GB_TYPE_Q5_1,
    GB_TYPE_Q2_K,
    GB_TYPE_Q3_K,
    GB_TYPE_Q4_K,
    GB_TYPE_Q5_K,
    GB_TYPE_Q6_K,
    GB_TYPE_Q8_K,
    GB_TYPE_COUNT,
};

struct gb_type_traits {
    const char *name;      /* as safetensors / llama.cpp spell it: "F32", "BF16", "Q4_K", ... */
    int block_size;        /* elements per block (1 for plain types) */
    size_t type_size;      /* bytes per block */
    int is_float;          /* a plain float type (F32/F16/BF16) */
    int is_quant;          /* a GGML block type (dequantize through tensor/quant_ref.h) */
};

const struct gb_type_traits *type_traits(enum gb_type t);
const char *type_name(enum gb_type t);
/* Parse a safetensors dtype string (plain types only); returns 0 on success. */
int type_from_safetensors(const char *s, enum gb_type *out);
/* Map a GGML type id (enum ggml_type in ggml.h, as stored in GGUF tensor infos) to
 * ours: returns 0 and sets *out, or -1 for a type gerbil does not support
 * (Q8_1, the IQ and TQ types, MXFP4, I16, F64, unknown ids). */
int type_from_ggml(uint32_t ggml_type, enum gb_type *out);
/* ggml's name of a GGML type id ("Q4_K", "IQ2_XXS", "MXFP4", ...), for messages;
 * "unknown" for ids ggml never defined or has retired. Never NULL. */
const char *ggml_type_name(uint32_t ggml_type);
/* Bytes for n elements (n a multiple of the block size). */
size_t type_row_size(enum gb_type t, int64_t n);

/* Convert n elements of a float or GGML block type to f32 (reference; used for norms,
 * embeddings); for block types n must be a multiple of the block size. */
void type_to_f32(enum gb_type t, const void *src, float *dst, int64_t n);

#endif
