/* A safetensors file (the header and the tensor table against the data) and a sharded
 * checkpoint's model.safetensors.index.json. Input: FILE [SEP index.json]. With an index,
 * the file is its only shard "model-00001-of-00001.safetensors"; the index's hostile paths
 * (.., absolute, missing shards) must be refused by name. */
#include "fuzz_common.h"
#include "gerbil.h"
#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *part[2];
    size_t len[2];
    int k = fz_split(data, size, part, len, 2);
    fz_remove("model.safetensors");
    fz_remove("model-00001-of-00001.safetensors");
    fz_remove("model.safetensors.index.json");
    if (k == 1) {
        const char *p = fz_write(0, "model.safetensors", part[0], len[0]);
        struct st_file f;
        if (st_file_open(p, &f) == GERBIL_OK) {
            for (int i = 0; i < f.n_tensors; i++) (void)st_file_find(&f, f.tensors[i].name);
            st_file_close(&f);
        }
    } else {
        fz_write(0, "model-00001-of-00001.safetensors", part[0], len[0]);
        fz_write(1, "model.safetensors.index.json", part[1], len[1]);
    }
    struct st_checkpoint ck;
    if (st_checkpoint_open(fz_dir(), &ck) == GERBIL_OK) {
        for (int i = 0; i < st_checkpoint_n_tensors(&ck); i++) {
            const struct gb_tensor *t = st_checkpoint_at(&ck, i);
            (void)st_checkpoint_find(&ck, t->name);
        }
        st_checkpoint_close(&ck);
    }
    return 0;
}
