/* A tensor view: shape, type and a pointer into memory someone else owns (usually
 * the mmap of a checkpoint). ne[0] is the OUTERMOST dimension, as safetensors and
 * PyTorch list shapes: a Linear weight is [n_out, n_in], row-major. */
#ifndef GB_TENSOR_H
#define GB_TENSOR_H

#include "tensor/dtype.h"

enum { GB_MAX_DIMS = 8 };  /* safetensors (vision towers have 5-D kernels); GGUF allows 4 */

struct gb_tensor {
    const char *name;        /* owned by the file that describes it */
    enum gb_type type;
    int n_dims;
    int64_t ne[GB_MAX_DIMS]; /* shape, outermost first */
    const void *data;
    size_t nbytes;
    int in_memory;           /* data is the loader's private copy (may be rearranged in place) */
    int packed;              /* data was rearranged for the kernels (op_weight_pack) */
};

static inline int64_t tensor_nelements(const struct gb_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->n_dims; i++) n *= t->ne[i];
    return n;
}

#endif
