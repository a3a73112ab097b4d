/* GGUF v3 writer: the metadata is serialized as it is added (one growing buffer);
 * tensor infos are kept as a list and laid out, each padded to 32 bytes, at write. */
#include "io/gguf_write.h"
#include "base/status.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct wtensor {
    char *name;
    uint32_t ggml_type;
    int n_dims;
    int64_t ne[GB_MAX_DIMS]; /* ours: outermost first */
    const void *data;        /* or NULL and fill */
    size_t nbytes;
    gguf_fill_fn fill;
    void *user;
};

struct gguf_writer {
    unsigned char *kv;       /* serialized kv pairs */
    size_t kv_len, kv_cap;
    uint64_t n_kv;
    char **keys;             /* for the duplicate check */
    size_t keys_cap;
    struct wtensor *tensors;
    size_t n_tensors, tensors_cap;
};

gerbil_status gguf_writer_new(struct gguf_writer **out) {
    *out = calloc(1, sizeof **out);
    return *out ? GERBIL_OK : err_set(GERBIL_ERR_NOMEM, "gguf writer: out of memory");
}

void gguf_writer_free(struct gguf_writer *w) {
    if (!w) return;
    for (uint64_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
    free(w->keys);
    for (size_t i = 0; i < w->n_tensors; i++) free(w->tensors[i].name);
    free(w->tensors);
    free(w->kv);
    free(w);
}

int gguf_ggml_type_of(enum gb_type t) {
    for (uint32_t id = 0; id < 64; id++) {
        enum gb_type g;
        if (type_from_ggml(id, &g) == 0 && g == t) return (int)id;
    }
    return -1;
}

/* ---- the kv buffer ---- */

static int reserve(struct gguf_writer *w, size_t more) {
    if (more <= w->kv_cap - w->kv_len) return 1;
    if (more > SIZE_MAX / 2 - w->kv_len) return 0;
    size_t cap = w->kv_cap ? w->kv_cap : 256;
    while (cap - w->kv_len < more) cap *= 2;
    unsigned char *p = realloc(w->kv, cap);
    if (!p) return 0;
    w->kv = p;
    w->kv_cap = cap;
    return 1;
}

/* Callers reserve first. */
static void put_le(struct gguf_writer *w, uint64_t v, size_t n) {
    for (size_t i = 0; i < n; i++) w->kv[w->kv_len++] = (unsigned char)(v >> (8 * i));
}

static void put_bytes(struct gguf_writer *w, const void *p, size_t n) {
    if (n) memcpy(w->kv + w->kv_len, p, n);
    w->kv_len += n;
}

/* A native scalar at p as little-endian bits. */
static uint64_t scalar_bits(enum gguf_vtype t, const void *p) {
    switch (gguf_scalar_size(t)) {
    case 1: { uint8_t v; memcpy(&v, p, 1); return t == GGUF_VT_BOOL ? v != 0 : v; }
    case 2: { uint16_t v; memcpy(&v, p, 2); return v; }
    case 4: { uint32_t v; memcpy(&v, p, 4); return v; }
    default: { uint64_t v; memcpy(&v, p, 8); return v; }
    }
}

/* Start a kv: check the key, reserve room for key + type + body bytes, write the key
 * and type. On failure nothing has been written. */
static gerbil_status begin_kv(struct gguf_writer *w, const char *key, enum gguf_vtype t, size_t body) {
    if (!key) return err_set(GERBIL_ERR_INVALID_ARG, "gguf writer: NULL key");
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->keys[i], key) == 0)
            return err_set(GERBIL_ERR_INVALID_ARG, "gguf writer: duplicate key \"%s\"", key);
    size_t kl = strlen(key);
    if (body > SIZE_MAX - kl - 12 || !reserve(w, 12 + kl + body))
        return err_set(GERBIL_ERR_NOMEM, "gguf writer: out of memory for \"%s\"", key);
    if (w->n_kv == w->keys_cap) {
        size_t cap = w->keys_cap ? w->keys_cap * 2 : 16;
        char **k = realloc(w->keys, cap * sizeof *k);
        if (!k) return err_set(GERBIL_ERR_NOMEM, "gguf writer: out of memory");
        w->keys = k;
        w->keys_cap = cap;
    }
    char *copy = strdup(key);
    if (!copy) return err_set(GERBIL_ERR_NOMEM, "gguf writer: out of memory");
    w->keys[w->n_kv++] = copy;
    put_le(w, kl, 8);
    put_bytes(w, key, kl);
    put_le(w, (uint64_t)t, 4);
    return GERBIL_OK;
}

gerbil_status gguf_writer_add_scalar(struct gguf_writer *w, const char *key, enum gguf_vtype t,
                                     const void *value) {
    size_t n = gguf_scalar_size(t);
    if (!n) return err_set(GERBIL_ERR_INVALID_ARG, "gguf writer: \"%s\": type %d is not a scalar",
                           key ? key : "", (int)t);
    GB_TRY(begin_kv(w, key, t, n));
    put_le(w, scalar_bits(t, value), n);
    return GERBIL_OK;
}

gerbil_status gguf_writer_add_u32(struct gguf_writer *w, const char *key, uint32_t v) {
    return gguf_writer_add_scalar(w, key, GGUF_VT_U32, &v);
}
gerbil_status gguf_writer_add_i32(struct gguf_writer *w, const char *key, int32_t v) {
    return gguf_writer_add_scalar(w, key, GGUF_VT_I32, &v);
}
gerbil_status gguf_writer_add_u64(struct gguf_writer *w, const char *key, uint64_t v) {
    return gguf_writer_add_scalar(w, key, GGUF_VT_U64, &v);
}
gerbil_status gguf_writer_add_f32(struct gguf_writer *w, const char *key, float v) {
    return gguf_writer_add_scalar(w, key, GGUF_VT_F32, &v);
}
gerbil_status gguf_writer_add_bool(struct gguf_writer *w, const char *key, int v) {
    uint8_t b = v != 0;
    return gguf_writer_add_scalar(w, key, GGUF_VT_BOOL, &b);
}

gerbil_status gguf_writer_add_strn(struct gguf_writer *w, const char *key, const char *s, size_t len) {
    if (len > SIZE_MAX - 8) return err_set(GERBIL_ERR_NOMEM, "gguf writer: string too long");
    GB_TRY(begin_kv(w, key, GGUF_VT_STRING, 8 + len));
    put_le(w, len, 8);
    put_bytes(w, s, len);
    return GERBIL_OK;
}

gerbil_status gguf_writer_add_str(struct gguf_writer *w, const char *key, const char *s) {
    return gguf_writer_add_strn(w, key, s, strlen(s));
}

gerbil_status gguf_writer_add_arr(struct gguf_writer *w, const char *key, enum gguf_vtype elem,
                                  const void *elems, uint64_t n) {
    size_t es = gguf_scalar_size(elem);
    if (!es) return err_set(GERBIL_ERR_INVALID_ARG, "gguf writer: \"%s\": array element type %d is "
                            "not a scalar", key ? key : "", (int)elem);
    if (n > (SIZE_MAX - 12) / es) return err_set(GERBIL_ERR_NOMEM, "gguf writer: array too long");
    GB_TRY(begin_kv(w, key, GGUF_VT_ARRAY, 12 + (size_t)n * es));
    put_le(w, (uint64_t)elem, 4);
    put_le(w, n, 8);
    const unsigned char *p = elems;
    for (uint64_t i = 0; i < n; i++) put_le(w, scalar_bits(elem, p + i * es), es);
    return GERBIL_OK;
}

gerbil_status gguf_writer_add_str_arr(struct gguf_writer *w, const char *key, const char *const *strs,
                                      uint64_t n) {
    size_t body = 12;
    for (uint64_t i = 0; i < n; i++) {
        size_t l = strlen(strs[i]);
        if (l > SIZE_MAX / 2 - body - 8) return err_set(GERBIL_ERR_NOMEM, "gguf writer: array too long");
        body += 8 + l;
    }
    GB_TRY(begin_kv(w, key, GGUF_VT_ARRAY, body));
    put_le(w, GGUF_VT_STRING, 4);
    put_le(w, n, 8);
    for (uint64_t i = 0; i < n; i++) {
        size_t l = strlen(strs[i]);
        put_le(w, l, 8);
        put_bytes(w, strs[i], l);
    }
    return GERBIL_OK;
}

static gerbil_status add_tensor(struct gguf_writer *w, const char *name, enum gb_type type, int n_dims,
                                const int64_t *ne, const void *data, size_t nbytes, gguf_fill_fn fill,
                                void *user) {
    if (!name) return err_set(GERBIL_ERR_INVALID_ARG, "gguf writer: NULL tensor name");
    if ((unsigned)type >= GB_TYPE_COUNT || gguf_ggml_type_of(type) < 0)
        return err_set(GERBIL_ERR_INVALID_ARG, "gguf writer: tensor \"%s\": type %d has no GGUF id",
                       name, (int)type);
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
        return err_set(GERBIL_ERR_INVALID_ARG, "gguf writer: tensor \"%s\": %d dims, expected 1 to %d",
                       name, n_dims, GGUF_MAX_DIMS);
    const struct gb_type_traits *tt = type_traits(type);
    size_t want = tt->type_size;
    for (int d = 0; d < n_dims; d++) {
        if (ne[d] < 1)
            return err_set(GERBIL_ERR_INVALID_ARG, "gguf writer: tensor \"%s\": dim %d is %lld",
                           name, d, (long long)ne[d]);
        size_t k = (size_t)ne[d];
        if (d == n_dims - 1) {
            if (ne[d] % tt->block_size)
                return err_set(GERBIL_ERR_INVALID_ARG, "gguf writer: tensor \"%s\": innermost dim "
                               "%lld not a multiple of the %s block size %d", name,
                               (long long)ne[d], tt->name, tt->block_size);
            k /= (size_t)tt->block_size;
        }
        if (k && want > SIZE_MAX / k)
            return err_set(GERBIL_ERR_INVALID_ARG, "gguf writer: tensor \"%s\": too large", name);
        want *= k;
    }
    if (want != nbytes)
        return err_set(GERBIL_ERR_INVALID_ARG, "gguf writer: tensor \"%s\": %zu bytes given, the "
                       "shape needs %zu", name, nbytes, want);
    for (size_t i = 0; i < w->n_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0)
            return err_set(GERBIL_ERR_INVALID_ARG, "gguf writer: duplicate tensor \"%s\"", name);
    if (w->n_tensors == w->tensors_cap) {
        size_t cap = w->tensors_cap ? w->tensors_cap * 2 : 16;
        struct wtensor *t = realloc(w->tensors, cap * sizeof *t);
        if (!t) return err_set(GERBIL_ERR_NOMEM, "gguf writer: out of memory");
        w->tensors = t;
        w->tensors_cap = cap;
    }
    struct wtensor *t = &w->tensors[w->n_tensors];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    if (!t->name) return err_set(GERBIL_ERR_NOMEM, "gguf writer: out of memory");
    t->ggml_type = (uint32_t)gguf_ggml_type_of(type);
    t->n_dims = n_dims;
    for (int d = 0; d < n_dims; d++) t->ne[d] = ne[d];
    t->data = data;
    t->nbytes = nbytes;
    t->fill = fill;
    t->user = user;
    w->n_tensors++;
    return GERBIL_OK;
}

gerbil_status gguf_writer_add_tensor(struct gguf_writer *w, const char *name, enum gb_type type,
                                     int n_dims, const int64_t *ne, const void *data, size_t nbytes) {
    if (!data) return err_set(GERBIL_ERR_INVALID_ARG, "gguf writer: tensor \"%s\": NULL data",
                              name ? name : "");
    return add_tensor(w, name, type, n_dims, ne, data, nbytes, NULL, NULL);
}

gerbil_status gguf_writer_add_tensor_fn(struct gguf_writer *w, const char *name, enum gb_type type,
                                        int n_dims, const int64_t *ne, size_t nbytes,
                                        gguf_fill_fn fill, void *user) {
    if (!fill) return err_set(GERBIL_ERR_INVALID_ARG, "gguf writer: tensor \"%s\": NULL fill",
                              name ? name : "");
    return add_tensor(w, name, type, n_dims, ne, NULL, nbytes, fill, user);
}

/* ---- writing ---- */

static int write_le(FILE *f, uint64_t v, size_t n) {
    unsigned char b[8];
    for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(v >> (8 * i));
    return fwrite(b, 1, n, f) == n;
}

static int write_pad(FILE *f, uint64_t pos) {
    static const unsigned char zeros[GGUF_WRITE_ALIGNMENT];
    size_t pad = (size_t)((GGUF_WRITE_ALIGNMENT - pos % GGUF_WRITE_ALIGNMENT) % GGUF_WRITE_ALIGNMENT);
    return fwrite(zeros, 1, pad, f) == pad;
}

static size_t padded(size_t n) {
    return (n + GGUF_WRITE_ALIGNMENT - 1) / GGUF_WRITE_ALIGNMENT * GGUF_WRITE_ALIGNMENT;
}

/* 1 on success; 0 with errno set on an I/O error; -1 when a fill callback failed
 * (its message is set) or scratch memory ran out. */
static int write_all(struct gguf_writer *w, FILE *f, gerbil_status *fail) {
    int ok = fwrite("GGUF", 1, 4, f) == 4 && write_le(f, 3, 4) && write_le(f, w->n_tensors, 8) &&
             write_le(f, w->n_kv, 8) && (w->kv_len == 0 || fwrite(w->kv, 1, w->kv_len, f) == w->kv_len);
    uint64_t pos = 24 + w->kv_len, off = 0;
    size_t scratch_size = 0;
    for (size_t i = 0; i < w->n_tensors && ok; i++) {
        const struct wtensor *t = &w->tensors[i];
        size_t nl = strlen(t->name);
        ok = write_le(f, nl, 8) && fwrite(t->name, 1, nl, f) == nl && write_le(f, (uint64_t)t->n_dims, 4);
        for (int d = t->n_dims - 1; d >= 0 && ok; d--) ok = write_le(f, (uint64_t)t->ne[d], 8);
        ok = ok && write_le(f, t->ggml_type, 4) && write_le(f, off, 8);
        pos += 8 + nl + 4 + 8 * (uint64_t)t->n_dims + 4 + 8;
        off += padded(t->nbytes);
        if (t->fill && t->nbytes > scratch_size) scratch_size = t->nbytes;
    }
    ok = ok && write_pad(f, pos);
    void *scratch = NULL;
    if (ok && scratch_size) {
        scratch = malloc(scratch_size);
        if (!scratch) {
            *fail = err_set(GERBIL_ERR_NOMEM, "gguf writer: out of memory for a %zu-byte tensor",
                            scratch_size);
            return -1;
        }
    }
    for (size_t i = 0; i < w->n_tensors && ok == 1; i++) {
        const struct wtensor *t = &w->tensors[i];
        const void *data = t->data;
        if (t->fill) {
            gerbil_status st = t->fill(t->user, scratch, t->nbytes);
            if (st != GERBIL_OK) {
                *fail = err_prefix(st, "writing tensor \"%s\"", t->name);
                ok = -1;
                break;
            }
            data = scratch;
        }
        ok = fwrite(data, 1, t->nbytes, f) == t->nbytes && write_pad(f, t->nbytes);
    }
    free(scratch);
    return ok;
}

gerbil_status gguf_writer_write(struct gguf_writer *w, const char *path) {
    size_t pl = strlen(path);
    char *tmp = malloc(pl + 5);
    if (!tmp) return err_set(GERBIL_ERR_NOMEM, "%s: out of memory", path);
    memcpy(tmp, path, pl);
    memcpy(tmp + pl, ".tmp", 5);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        gerbil_status s = err_set(GERBIL_ERR_IO, "%s: %s", tmp, strerror(errno));
        free(tmp);
        return s;
    }
    errno = 0;
    gerbil_status fail = GERBIL_OK;
    int ok = write_all(w, f, &fail);
    int e = errno;
    if (fclose(f) != 0 && ok == 1) { ok = 0; e = errno; }
    gerbil_status s = GERBIL_OK;
    if (ok == -1) s = err_prefix(fail, "%s", path);
    else if (!ok) s = err_set(GERBIL_ERR_IO, "%s: write failed: %s", tmp, strerror(e ? e : EIO));
    else if (rename(tmp, path) != 0)
        s = err_set(GERBIL_ERR_IO, "%s: rename to %s: %s", tmp, path, strerror(errno));
    if (s != GERBIL_OK) remove(tmp);
    free(tmp);
    return s;
}
