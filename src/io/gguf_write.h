/* A small GGUF v3 writer: metadata of every scalar type, strings, arrays of numbers
 * and of strings, and tensors given in OUR convention (dims outermost first; the
 * writer stores ggml's reversed ne[]). Tensor data is aligned to 32 bytes (no
 * general.alignment key is written). Used by tests and by `gerbil quantize`.
 *
 *   struct gguf_writer *w;
 *   GB_TRY(gguf_writer_new(&w));
 *   gguf_writer_add_str(w, "general.architecture", "llama");
 *   gguf_writer_add_u32(w, "llama.block_count", 5);
 *   gguf_writer_add_tensor(w, "token_embd.weight", GB_TYPE_F32, 2, (int64_t[]){512, 64}, p, n);
 *   s = gguf_writer_write(w, "out.gguf");
 *   gguf_writer_free(w);
 *
 * Every add_* copies the key and value, except tensor data: the writer keeps the
 * pointer, which must stay valid until gguf_writer_write returns. An add that fails
 * (duplicate key or tensor name, bad shape, out of memory) returns an error and
 * leaves the writer as it was, so later calls still work. */
#ifndef GB_GGUF_WRITE_H
#define GB_GGUF_WRITE_H

#include "gerbil.h"
#include "io/gguf.h"
#include "tensor/dtype.h"

#include <stddef.h>
#include <stdint.h>

enum { GGUF_WRITE_ALIGNMENT = 32 };

struct gguf_writer;

gerbil_status gguf_writer_new(struct gguf_writer **out);
void gguf_writer_free(struct gguf_writer *w);

/* A scalar of type t (any of U8..F64 except STRING and ARRAY); value points at a
 * native value of that type (uint8_t for BOOL, 0 or 1). */
gerbil_status gguf_writer_add_scalar(struct gguf_writer *w, const char *key, enum gguf_vtype t,
                                     const void *value);
gerbil_status gguf_writer_add_u32(struct gguf_writer *w, const char *key, uint32_t v);
gerbil_status gguf_writer_add_i32(struct gguf_writer *w, const char *key, int32_t v);
gerbil_status gguf_writer_add_u64(struct gguf_writer *w, const char *key, uint64_t v);
gerbil_status gguf_writer_add_f32(struct gguf_writer *w, const char *key, float v);
gerbil_status gguf_writer_add_bool(struct gguf_writer *w, const char *key, int v);
/* A NUL-terminated string, or len bytes (may hold NULs) with add_strn. */
gerbil_status gguf_writer_add_str(struct gguf_writer *w, const char *key, const char *s);
gerbil_status gguf_writer_add_strn(struct gguf_writer *w, const char *key, const char *s, size_t len);
/* An array of n scalars of type elem, native values packed as in a C array. */
gerbil_status gguf_writer_add_arr(struct gguf_writer *w, const char *key, enum gguf_vtype elem,
                                  const void *elems, uint64_t n);
/* An array of n NUL-terminated strings. */
gerbil_status gguf_writer_add_str_arr(struct gguf_writer *w, const char *key, const char *const *strs,
                                      uint64_t n);

/* A tensor of type (F32, F16, BF16 or a GGML block type) and shape ne[0..n_dims)
 * outermost first; the innermost dim must be a multiple of the block size and nbytes
 * must match the shape. data is kept by pointer (see above). */
gerbil_status gguf_writer_add_tensor(struct gguf_writer *w, const char *name, enum gb_type type,
                                     int n_dims, const int64_t *ne, const void *data, size_t nbytes);

/* The same, with the bytes produced at write time: fill(user, dst, nbytes) writes the
 * tensor's nbytes into dst (a scratch buffer reused across tensors) and returns
 * GERBIL_OK, or an error that aborts the write. `gerbil quantize` uses this so that
 * only one quantized tensor is in memory at a time; user must stay valid until the
 * write. */
typedef gerbil_status (*gguf_fill_fn)(void *user, void *dst, size_t nbytes);
gerbil_status gguf_writer_add_tensor_fn(struct gguf_writer *w, const char *name, enum gb_type type,
                                        int n_dims, const int64_t *ne, size_t nbytes,
                                        gguf_fill_fn fill, void *user);

/* Write everything to path: to path + ".tmp" first, renamed over path on success (the
 * temp file is removed on failure). The writer may be written again or freed. */
gerbil_status gguf_writer_write(struct gguf_writer *w, const char *path);

/* The ggml type id of a gb_type; -1 when GGUF has none. */
int gguf_ggml_type_of(enum gb_type t);

#endif
