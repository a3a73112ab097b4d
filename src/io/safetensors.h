/* safetensors reader: validates the header completely before any tensor is used.
 *
 * File layout: u64 little-endian header length N, N bytes of JSON
 *   {"__metadata__": {...}, "name": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}, ...}
 * then the data section; offsets are relative to its start. We require: JSON well
 * formed, an object of objects; dtype known; shape of non-negative ints (<= 4 dims);
 * 0 <= b <= e <= data section size; e - b == elements * dtype size (overflow-checked);
 * tensors do not overlap. Tensors are views into the mmap (no copy). */
#ifndef GB_SAFETENSORS_H
#define GB_SAFETENSORS_H

#include "gerbil.h"
#include "io/mmap.h"
#include "tensor/tensor.h"

struct st_file {
    struct mapped_file map;
    int n_tensors;
    struct gb_tensor *tensors; /* [n_tensors], sorted by name; names owned here */
};

/* How to bring the bytes in: NULL opts = map the file in place. */
struct st_load_opts {
    int in_memory;               /* copy into anonymous memory (see mapped_file_copy_to_memory) */
    load_progress_fn progress;   /* may be NULL */
    void *user;
};

gerbil_status st_file_open(const char *path, struct st_file *out);
gerbil_status st_file_open_opts(const char *path, const struct st_load_opts *opts, struct st_file *out);
void st_file_close(struct st_file *f);
/* NULL when absent. */
const struct gb_tensor *st_file_find(const struct st_file *f, const char *name);

/* All the weights of one model: a single model.safetensors, or the shards listed by
 * model.safetensors.index.json ("weight_map": name -> file). */
struct st_checkpoint {
    int n_files;
    struct st_file *files;
};

/* dir holds model.safetensors.index.json (sharded) or model.safetensors; failing
 * both, every *.safetensors file in dir (sorted). A tensor name present in two
 * files is an error. */
gerbil_status st_checkpoint_open(const char *dir, struct st_checkpoint *out);
gerbil_status st_checkpoint_open_opts(const char *dir, const struct st_load_opts *opts, struct st_checkpoint *out);
void st_checkpoint_close(struct st_checkpoint *ck);
const struct gb_tensor *st_checkpoint_find(const struct st_checkpoint *ck, const char *name);
/* Total tensors over all files; st_checkpoint_at(i) for 0 <= i < that. */
int st_checkpoint_n_tensors(const struct st_checkpoint *ck);
const struct gb_tensor *st_checkpoint_at(const struct st_checkpoint *ck, int i);

#endif
