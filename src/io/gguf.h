/* GGUF v2/v3 reader: validates the whole header (metadata, tensor infos, alignment,
 * every offset and size against the file) before anything is used. Tensors are
 * views into the mapping, described in OUR convention: dims outermost first (ggml's
 * ne[] reversed), so a weight is [n_out][n_in] as with safetensors. */
#ifndef GB_GGUF_H
#define GB_GGUF_H

#include "gerbil.h"
#include "io/mmap.h"
#include "io/safetensors.h" /* struct st_load_opts */
#include "tensor/tensor.h"

#include <stdint.h>

enum { GGUF_MAX_DIMS = 4 }; /* GGML_MAX_DIMS */

enum gguf_vtype {
    GGUF_VT_U8 = 0, GGUF_VT_I8 = 1, GGUF_VT_U16 = 2, GGUF_VT_I16 = 3, GGUF_VT_U32 = 4, GGUF_VT_I32 = 5,
    GGUF_VT_F32 = 6, GGUF_VT_BOOL = 7, GGUF_VT_STRING = 8, GGUF_VT_ARRAY = 9, GGUF_VT_U64 = 10,
    GGUF_VT_I64 = 11, GGUF_VT_F64 = 12,
};

/* One metadata pair. Nested arrays (arrays of arrays, rare, read up to 8 deep) are
 * kept as their serialized bytes: arr_type ARRAY, arr_n elements at arr_data. */
struct gguf_kv {
    char *key;                 /* NUL-terminated copy */
    enum gguf_vtype type;
    union {
        uint64_t u;            /* U8..U64, BOOL */
        int64_t i;             /* I8..I64 */
        double f;              /* F32, F64 */
    } v;
    char *str;                 /* STRING: NUL-terminated copy (may contain NULs; see str_len) */
    uint64_t str_len;
    /* ARRAY */
    enum gguf_vtype arr_type;
    uint64_t arr_n;
    const void *arr_data;      /* numeric arrays: the elements in the mapping (little-endian, packed) */
    char **arr_strs;           /* string arrays: NUL-terminated copies */
    uint64_t *arr_str_lens;
};

struct gguf_file {
    struct mapped_file map;
    uint32_t version;
    int64_t n_kv;
    struct gguf_kv *kv;
    int n_tensors;
    struct gb_tensor *tensors; /* in file order; names owned here */
    size_t alignment;          /* general.alignment, default 32 */
    size_t data_offset;        /* start of the tensor data section (a file without tensors may end before it) */
    /* private: lookup indexes sorted by key / tensor name; map.data is the caller's */
    uint32_t *kv_sorted;
    uint32_t *tensor_sorted;
    int borrowed;
};

/* Open and validate path (opts NULL = map in place; opts->in_memory copies the file to
 * anonymous memory first). Guarantees on GERBIL_OK: version 2 or 3; keys unique and
 * NUL-free; alignment a power of two; every tensor has 1..4 dims, each >= 1, a type
 * gerbil reads (type_from_ggml), an innermost dim that is a multiple of the block
 * size, nbytes = ne[last]/block_size * type_size * the other dims, an aligned offset,
 * data inside the file, no overlap with another tensor, a unique NUL-free name.
 * Errors: GERBIL_ERR_FORMAT (corrupt/truncated), GERBIL_ERR_UNSUPPORTED (version 1 or
 * > 3, big-endian, scalar (n_dims 0) or empty tensors, a ggml type gerbil does not read: the message names
 * the tensor and the type), GERBIL_ERR_IO, GERBIL_ERR_NOMEM. On failure *out is zeroed. */
gerbil_status gguf_open(const char *path, const struct st_load_opts *opts, struct gguf_file *out);
/* The same over size bytes at data (which must outlive the file; nothing is copied).
 * name stands for the path in messages. */
gerbil_status gguf_open_memory(const void *data, size_t size, const char *name, struct gguf_file *out);
void gguf_close(struct gguf_file *f);
const struct gguf_kv *gguf_find_kv(const struct gguf_file *f, const char *key);
const struct gb_tensor *gguf_find_tensor(const struct gguf_file *f, const char *name);
/* Typed getters: def when absent; a present key of the wrong type is a format error. */
gerbil_status gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t def, uint32_t *out);
gerbil_status gguf_get_f32(const struct gguf_file *f, const char *key, float def, float *out);
const char *gguf_get_str(const struct gguf_file *f, const char *key); /* NULL when absent or not a string */
/* get_u32/get_u64 accept any integer type whose value fits; get_f32 accepts f32, f64
 * and integers; get_bool only bool. */
gerbil_status gguf_get_u64(const struct gguf_file *f, const char *key, uint64_t def, uint64_t *out);
gerbil_status gguf_get_bool(const struct gguf_file *f, const char *key, int def, int *out);
/* *out = the array kv with elements of type elem, or NULL when absent; present with
 * another type (or element type) is a format error. */
gerbil_status gguf_get_arr(const struct gguf_file *f, const char *key, enum gguf_vtype elem,
                           const struct gguf_kv **out);
/* Element i (< arr_n) of a numeric array, read little-endian from the (unaligned)
 * mapping: gguf_arr_int for integer element types (sign- or zero-extended),
 * gguf_arr_float for f32/f64 (and integers). A u64 element above INT64_MAX comes back
 * from gguf_arr_int as its two's complement: cast the result to uint64_t. */
int64_t gguf_arr_int(const struct gguf_kv *kv, uint64_t i);
double gguf_arr_float(const struct gguf_kv *kv, uint64_t i);
const char *gguf_vtype_name(enum gguf_vtype t); /* "u32", "string", ... */
/* Bytes of one scalar of type t; 0 for string, array and unknown types. */
size_t gguf_scalar_size(uint32_t t);

#endif
