/* Binding a checkpoint's tensors to a model: matrices handed to the backend in their stored
 * format, vectors (norms, biases, conv kernels) converted to f32 on the host and uploaded
 * in one block once the model is bound. Shared by llama.c and the layer files. */
#include "model/model.h"
#include "base/status.h"

#include <stdint.h>
#include <stdlib.h>

/* A matrix in whatever format the source stores it. */
gerbil_status bind_matrix(struct binder *b, const char *name, int64_t rows, int64_t cols, struct gb_weight *out) {
    GB_TRY(wsrc_matrix(&b->m->src, name, rows, cols, out));
    b->m->weight_bytes += weight_nbytes(out);
    b->m->n_params += rows * cols;
    return GERBIL_OK;
}

/* A vector (norm weight, bias, conv kernel) converted to f32 once at load. */
gerbil_status bind_vector(struct binder *b, const char *name, int64_t n, float add, const float **out) {
    const struct gb_tensor *t = wsrc_find(&b->m->src, name);
    char fname[256];
    if (!t)
        return err_set(GERBIL_ERR_FORMAT, "missing tensor \"%s\"", wsrc_file_name(&b->m->src, name, fname, sizeof fname));
    name = t->name;
    if (tensor_nelements(t) != n)
        return err_set(GERBIL_ERR_FORMAT, "tensor \"%s\": expected %lld elements (shape [%lld]), found %lld", name,
                       (long long)n, (long long)n, (long long)tensor_nelements(t));
    if (!type_traits(t->type)->is_float)
        return err_set(GERBIL_ERR_UNSUPPORTED, "tensor \"%s\": dtype %s is not a float type (F32, F16, BF16)",
                       name, type_name(t->type));
    if ((uintptr_t)t->data % type_traits(t->type)->type_size)
        return err_set(GERBIL_ERR_FORMAT, "tensor \"%s\": data is not aligned to its %zu-byte elements", name,
                       type_traits(t->type)->type_size);
    GB_ASSERT((size_t)n <= b->f32_left);
    if (b->n_slots == b->cap_slots) { /* where the pointer goes, rebased once the block is uploaded */
        int cap = b->cap_slots ? 2 * b->cap_slots : 256;
        const float ***ns = realloc(b->slots, (size_t)cap * sizeof *ns);
        if (!ns) return err_set(GERBIL_ERR_NOMEM, "out of memory binding weights");
        b->slots = ns;
        b->cap_slots = cap;
    }
    b->slots[b->n_slots++] = out;
    type_to_f32(t->type, t->data, b->f32_next, n);
    if (add != 0.0f)
        for (int64_t i = 0; i < n; i++) b->f32_next[i] += add;
    *out = b->f32_next;
    b->f32_next += n;
    b->f32_left -= (size_t)n;
    b->m->weight_bytes += t->nbytes;
    b->m->n_params += n;
    return GERBIL_OK;
}

/* The f32 vectors, converted into m->f32_store on the host, go to backend memory in one
 * block (m->f32_dev); the pointers bound to them follow. */
gerbil_status bind_upload_vectors(struct binder *b) {
    struct gerbil_model *m = b->m;
    struct backend *be = m->be;
    m->f32_bytes = (size_t)(b->f32_next - m->f32_store) * sizeof(float);
    m->f32_dev = be->ops->alloc(be, m->f32_bytes, 0);
    if (!m->f32_dev) return err_set(GERBIL_ERR_NOMEM, "out of memory for %zu bytes of norms and biases", m->f32_bytes);
    be->ops->upload(be, m->f32_dev, m->f32_store, m->f32_bytes);
    for (int i = 0; i < b->n_slots; i++) *b->slots[i] = m->f32_dev + (*b->slots[i] - m->f32_store);
    free(m->f32_store);
    m->f32_store = NULL;
    return GERBIL_OK;
}
