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
    GB_TYPE_COUNT,
};

struct gb_type_traits {
    const char *name;      /* as safetensors spells it: "F32", "BF16", ... */
    int block_size;        /* elements per block (1 for plain types) */
    size_t type_size;      /* bytes per block */
    int is_float;          /* can be a weight read by matmul */
};

const struct gb_type_traits *type_traits(enum gb_type t);
const char *type_name(enum gb_type t);
/* Parse a safetensors dtype string; returns 0 on success. */
int type_from_safetensors(const char *s, enum gb_type *out);
/* Bytes for n elements (n a multiple of the block size). */
size_t type_row_size(enum gb_type t, int64_t n);

/* Convert n elements of a float type to f32 (reference; used for norms, embeddings). */
void type_to_f32(enum gb_type t, const void *src, float *dst, int64_t n);

#endif
