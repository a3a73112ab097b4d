/* GGUF v2/v3 reader. The whole header is parsed through one bounds-checked cursor
 * and validated before the file is handed out.
 *
 * Layout (all little-endian):
 *   "GGUF" | u32 version | u64 n_tensors | u64 n_kv
 *   n_kv x   { string key | u32 value type | value }
 *   n_tensors x { string name | u32 n_dims | u64 ne[n_dims] (ggml order, innermost
 *                 first) | u32 ggml type | u64 offset (relative to the data section) }
 *   padding to general.alignment | data section
 * where string = u64 length + bytes (no NUL), and an array value is u32 element type
 * + u64 count + elements. */
#include "io/gguf.h"
#include "base/status.h"
#include "tensor/dtype.h"

#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Caps on counts that only a corrupt or hostile file reaches. The size checks below
 * (each kv or tensor info takes at least a dozen bytes of the file) already bound
 * memory by the file size; these keep the bound small for a huge file of garbage.
 * The largest real files have a few thousand tensors and ~50 keys. */
enum {
    GGUF_MAX_TENSORS = 1 << 20,
    GGUF_MAX_KV = 1 << 20,
    GGUF_MAX_DEPTH = 8,             /* arrays of arrays of ...; none in practice */
    GGUF_MAX_ALIGNMENT = 1 << 30,
    GGUF_MSG_NAME = 96,             /* a key or tensor name is cut to this in messages */
};

static const char *const vtype_names[] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};

static const char *vtype_name(uint32_t t) {
    return t < sizeof vtype_names / sizeof *vtype_names ? vtype_names[t] : "unknown";
}

size_t gguf_scalar_size(uint32_t t) {
    switch (t) {
    case GGUF_VT_U8: case GGUF_VT_I8: case GGUF_VT_BOOL: return 1;
    case GGUF_VT_U16: case GGUF_VT_I16: return 2;
    case GGUF_VT_U32: case GGUF_VT_I32: case GGUF_VT_F32: return 4;
    case GGUF_VT_U64: case GGUF_VT_I64: case GGUF_VT_F64: return 8;
    default: return 0;
    }
}

static int is_int_type(uint32_t t) {
    return t == GGUF_VT_U8 || t == GGUF_VT_I8 || t == GGUF_VT_U16 || t == GGUF_VT_I16 ||
           t == GGUF_VT_U32 || t == GGUF_VT_I32 || t == GGUF_VT_U64 || t == GGUF_VT_I64;
}

static int is_signed_type(uint32_t t) {
    return t == GGUF_VT_I8 || t == GGUF_VT_I16 || t == GGUF_VT_I32 || t == GGUF_VT_I64;
}

/* ---- the cursor ---- */

struct cursor {
    const unsigned char *p;
    size_t size, pos;
    const char *path;
};

static uint64_t load_le(const unsigned char *p, size_t n) {
    uint64_t v = 0;
    for (size_t i = n; i-- > 0;) v = (v << 8) | p[i];
    return v;
}

/* Fail unless n more bytes remain. what names the field for the message. */
static gerbil_status need(const struct cursor *c, uint64_t n, const char *what) {
    if (n > c->size - c->pos)
        return err_set(GERBIL_ERR_FORMAT, "%s: %s at offset %zu: needs %llu bytes, %zu left before "
                       "the end of the file (truncated?)", c->path, what, c->pos,
                       (unsigned long long)n, c->size - c->pos);
    return GERBIL_OK;
}

static gerbil_status rd_uint(struct cursor *c, size_t n, uint64_t *v, const char *what) {
    GB_TRY(need(c, n, what));
    *v = load_le(c->p + c->pos, n);
    c->pos += n;
    return GERBIL_OK;
}

static gerbil_status rd_u32(struct cursor *c, uint32_t *v, const char *what) {
    uint64_t x;
    GB_TRY(rd_uint(c, 4, &x, what));
    *v = (uint32_t)x;
    return GERBIL_OK;
}

/* A string in place: *s points into the file, *len its length. */
static gerbil_status rd_str(struct cursor *c, const char **s, uint64_t *len, const char *what) {
    GB_TRY(rd_uint(c, 8, len, what));
    GB_TRY(need(c, *len, what));
    *s = (const char *)c->p + c->pos;
    c->pos += (size_t)*len;
    return GERBIL_OK;
}

static char *dup_bytes(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (!d) return NULL;
    if (n) memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

/* ---- values ---- */

/* Skip one value of type t (for elements of nested arrays, which gerbil keeps as raw
 * bytes). depth counts the arrays we are inside. */
static gerbil_status skip_value(struct cursor *c, uint32_t t, int depth, const char *what) {
    size_t sz = gguf_scalar_size(t);
    if (sz) {
        GB_TRY(need(c, sz, what));
        c->pos += sz;
        return GERBIL_OK;
    }
    if (t == GGUF_VT_STRING) {
        const char *s;
        uint64_t n;
        return rd_str(c, &s, &n, what);
    }
    if (t != GGUF_VT_ARRAY)
        return err_set(GERBIL_ERR_FORMAT, "%s: %s: unknown value type %u", c->path, what, t);
    if (depth >= GGUF_MAX_DEPTH)
        return err_set(GERBIL_ERR_FORMAT, "%s: %s: arrays nested more than %d deep", c->path, what,
                       GGUF_MAX_DEPTH);
    uint32_t et;
    uint64_t n;
    GB_TRY(rd_u32(c, &et, what));
    GB_TRY(rd_uint(c, 8, &n, what));
    size_t esz = gguf_scalar_size(et);
    if (esz) { /* a block of scalars: one bounds check */
        if (n > (c->size - c->pos) / esz)
            return err_set(GERBIL_ERR_FORMAT, "%s: %s: array of %llu %s past the end of the file",
                           c->path, what, (unsigned long long)n, vtype_name(et));
        c->pos += (size_t)n * esz;
        return GERBIL_OK;
    }
    if (et != GGUF_VT_STRING && et != GGUF_VT_ARRAY)
        return err_set(GERBIL_ERR_FORMAT, "%s: %s: unknown array element type %u", c->path, what, et);
    /* Each string takes >= 8 bytes, each array >= 12: an absurd count fails here
     * rather than after looping 2^62 times. */
    if (n > (c->size - c->pos) / 8)
        return err_set(GERBIL_ERR_FORMAT, "%s: %s: array count %llu past the end of the file",
                       c->path, what, (unsigned long long)n);
    for (uint64_t i = 0; i < n; i++) GB_TRY(skip_value(c, et, depth + 1, what));
    return GERBIL_OK;
}

/* Read the array value of kv (cursor after the value type). */
static gerbil_status rd_array(struct cursor *c, struct gguf_kv *kv, const char *what) {
    uint32_t et;
    uint64_t n;
    GB_TRY(rd_u32(c, &et, what));
    GB_TRY(rd_uint(c, 8, &n, what));
    kv->arr_type = (enum gguf_vtype)et;
    kv->arr_n = n;
    size_t esz = gguf_scalar_size(et);
    if (esz) {
        if (n > (c->size - c->pos) / esz)
            return err_set(GERBIL_ERR_FORMAT, "%s: %s: array of %llu %s past the end of the file "
                           "(%zu bytes left)", c->path, what, (unsigned long long)n, vtype_name(et),
                           c->size - c->pos);
        kv->arr_data = c->p + c->pos;
        c->pos += (size_t)n * esz;
        return GERBIL_OK;
    }
    if (et == GGUF_VT_ARRAY) {
        /* Kept as the raw serialized elements; nothing gerbil reads uses them. */
        size_t start = c->pos;
        if (n > (c->size - c->pos) / 12)
            return err_set(GERBIL_ERR_FORMAT, "%s: %s: array count %llu past the end of the file",
                           c->path, what, (unsigned long long)n);
        for (uint64_t i = 0; i < n; i++) GB_TRY(skip_value(c, GGUF_VT_ARRAY, 1, what));
        kv->arr_data = c->p + start;
        return GERBIL_OK;
    }
    if (et != GGUF_VT_STRING)
        return err_set(GERBIL_ERR_FORMAT, "%s: %s: unknown array element type %u", c->path, what, et);

    /* Strings: one pass to validate and size, one to copy, all into one block
     * (arr_strs[0] is its start), since a vocabulary has 10^5 of them. */
    if (n > (c->size - c->pos) / 8)
        return err_set(GERBIL_ERR_FORMAT, "%s: %s: array of %llu strings past the end of the file",
                       c->path, what, (unsigned long long)n);
    size_t start = c->pos, total = 0;
    for (uint64_t i = 0; i < n; i++) {
        const char *s;
        uint64_t len;
        GB_TRY(rd_str(c, &s, &len, what));
        total += (size_t)len + 1; /* <= file size + n: no overflow */
    }
    if (n == 0) return GERBIL_OK;
    kv->arr_strs = malloc((size_t)n * sizeof *kv->arr_strs);
    kv->arr_str_lens = malloc((size_t)n * sizeof *kv->arr_str_lens);
    char *blob = kv->arr_strs ? malloc(total) : NULL;
    if (!kv->arr_strs || !kv->arr_str_lens || !blob) {
        free(blob);
        free(kv->arr_strs);
        kv->arr_strs = NULL; /* gguf_close frees arr_strs[0] only when arr_strs is set */
        return err_set(GERBIL_ERR_NOMEM, "%s: %s: out of memory for %llu strings", c->path, what,
                       (unsigned long long)n);
    }
    c->pos = start;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t len = load_le(c->p + c->pos, 8);
        memcpy(blob, c->p + c->pos + 8, (size_t)len);
        blob[len] = '\0';
        kv->arr_strs[i] = blob;
        kv->arr_str_lens[i] = len;
        blob += len + 1;
        c->pos += 8 + (size_t)len;
    }
    return GERBIL_OK;
}

static gerbil_status rd_value(struct cursor *c, struct gguf_kv *kv, const char *what) {
    uint32_t t = kv->type;
    size_t sz = gguf_scalar_size(t);
    if (sz) {
        uint64_t x;
        GB_TRY(rd_uint(c, sz, &x, what));
        switch (t) {
        case GGUF_VT_I8: kv->v.i = (int8_t)x; break;
        case GGUF_VT_I16: kv->v.i = (int16_t)x; break;
        case GGUF_VT_I32: kv->v.i = (int32_t)x; break;
        case GGUF_VT_I64: kv->v.i = (int64_t)x; break;
        case GGUF_VT_F32: { float f; uint32_t b = (uint32_t)x; memcpy(&f, &b, 4); kv->v.f = f; break; }
        case GGUF_VT_F64: { double d; memcpy(&d, &x, 8); kv->v.f = d; break; }
        case GGUF_VT_BOOL: kv->v.u = x != 0; break;
        default: kv->v.u = x; break;
        }
        return GERBIL_OK;
    }
    if (t == GGUF_VT_STRING) {
        const char *s;
        GB_TRY(rd_str(c, &s, &kv->str_len, what));
        kv->str = dup_bytes(s, (size_t)kv->str_len);
        if (!kv->str) return err_set(GERBIL_ERR_NOMEM, "%s: %s: out of memory", c->path, what);
        return GERBIL_OK;
    }
    if (t == GGUF_VT_ARRAY) return rd_array(c, kv, what);
    return err_set(GERBIL_ERR_FORMAT, "%s: %s: unknown value type %u", c->path, what, t);
}

/* ---- lookups: sorted index arrays ---- */

/* qsort has no user pointer in C11; the file being sorted is passed through a
 * thread-local, so files may be opened on several threads at once. */
static _Thread_local const struct gguf_file *sort_ctx;

static int cmp_kv_idx(const void *a, const void *b) {
    return strcmp(sort_ctx->kv[*(const uint32_t *)a].key, sort_ctx->kv[*(const uint32_t *)b].key);
}

static int cmp_tensor_idx(const void *a, const void *b) {
    return strcmp(sort_ctx->tensors[*(const uint32_t *)a].name,
                  sort_ctx->tensors[*(const uint32_t *)b].name);
}

/* Tensors by data offset; ties by size so that an overlap check sees the smaller first. */
static int cmp_tensor_pos(const void *a, const void *b) {
    const struct gb_tensor *x = &sort_ctx->tensors[*(const uint32_t *)a];
    const struct gb_tensor *y = &sort_ctx->tensors[*(const uint32_t *)b];
    const char *px = x->data, *py = y->data;
    if (px != py) return px < py ? -1 : 1;
    return (x->nbytes > y->nbytes) - (x->nbytes < y->nbytes);
}

static void sort_idx(const struct gguf_file *f, uint32_t *idx, size_t n,
                     int (*cmp)(const void *, const void *)) {
    sort_ctx = f;
    qsort(idx, n, sizeof *idx, cmp);
    sort_ctx = NULL;
}

/* ---- tensor infos ---- */

/* Parse tensor info i into f->tensors[i]; the data pointer is set later, once the
 * data section start is known (its offset is kept in *offset). */
static gerbil_status rd_tensor_info(struct cursor *c, struct gguf_file *f, int i, uint64_t *offset) {
    char what[GGUF_MSG_NAME + 64];
    snprintf(what, sizeof what, "tensor info %d", i);
    const char *name;
    uint64_t name_len;
    GB_TRY(rd_str(c, &name, &name_len, what));
    if (memchr(name, '\0', (size_t)name_len))
        return err_set(GERBIL_ERR_FORMAT, "%s: tensor %d: name contains a NUL byte", c->path, i);
    struct gb_tensor *t = &f->tensors[i];
    char *nm = dup_bytes(name, (size_t)name_len);
    if (!nm) return err_set(GERBIL_ERR_NOMEM, "%s: out of memory", c->path);
    t->name = nm;
    snprintf(what, sizeof what, "tensor \"%.*s\"", GGUF_MSG_NAME, nm);

    uint32_t nd, gtype;
    GB_TRY(rd_u32(c, &nd, what));
    /* ggml reads n_dims 0 (a scalar) and dims of 0 (empty tensors); no model has them
     * and the loader would have to special-case them, so they are UNSUPPORTED. */
    if (nd == 0)
        return err_set(GERBIL_ERR_UNSUPPORTED, "%s: %s: n_dims 0 (scalar tensors are not supported)",
                       c->path, what);
    if (nd > GGUF_MAX_DIMS)
        return err_set(GERBIL_ERR_FORMAT, "%s: %s: n_dims %u, expected 1 to %d", c->path, what, nd,
                       GGUF_MAX_DIMS);
    uint64_t ne[GB_MAX_DIMS]; /* ggml order: ne[0] innermost */
    for (uint32_t d = 0; d < nd; d++) GB_TRY(rd_uint(c, 8, &ne[d], what));
    GB_TRY(rd_u32(c, &gtype, what));
    GB_TRY(rd_uint(c, 8, offset, what));

    char shape[128]; /* as ggml lists it, for messages */
    size_t sn = (size_t)snprintf(shape, sizeof shape, "[");
    for (uint32_t d = 0; d < nd && sn < sizeof shape; d++)
        sn += (size_t)snprintf(shape + sn, sizeof shape - sn, "%s%llu", d ? ", " : "",
                               (unsigned long long)ne[d]);
    if (sn < sizeof shape) snprintf(shape + sn, sizeof shape - sn, "]");

    for (uint32_t d = 0; d < nd; d++) {
        if (ne[d] == 0)
            return err_set(GERBIL_ERR_UNSUPPORTED, "%s: %s: ne %s has a zero dimension (empty "
                           "tensors are not supported)", c->path, what, shape);
        if (ne[d] > (uint64_t)INT64_MAX)
            return err_set(GERBIL_ERR_FORMAT, "%s: %s: ne %s: dimension %u too large", c->path,
                           what, shape, d);
    }
    if (type_from_ggml(gtype, &t->type) != 0)
        return err_set(GERBIL_ERR_UNSUPPORTED, "%s: %s: unsupported ggml type %s (id %u); gerbil "
                       "reads F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K, Q8_K",
                       c->path, what, ggml_type_name(gtype), gtype);
    const struct gb_type_traits *tt = type_traits(t->type);
    if (ne[0] % (uint64_t)tt->block_size != 0)
        return err_set(GERBIL_ERR_FORMAT, "%s: %s: ne %s: innermost dimension %llu is not a "
                       "multiple of the %s block size %d", c->path, what, shape,
                       (unsigned long long)ne[0], tt->name, tt->block_size);
    /* bytes = blocks per row * block bytes * the other dims; elements must fit int64. */
    /* Counted in u64 and kept <= SIZE_MAX, so this holds on 32-bit hosts too. */
    uint64_t nel = 1, nbytes = ne[0] / (uint64_t)tt->block_size;
    int overflow = nbytes > SIZE_MAX / tt->type_size;
    if (!overflow) nbytes *= tt->type_size;
    for (uint32_t d = 0; d < nd && !overflow; d++) {
        if (nel > (uint64_t)INT64_MAX / ne[d]) overflow = 1;
        else nel *= ne[d];
        if (d > 0 && !overflow) {
            if (nbytes > SIZE_MAX / ne[d]) overflow = 1;
            else nbytes *= ne[d];
        }
    }
    if (overflow)
        return err_set(GERBIL_ERR_FORMAT, "%s: %s: ne %s too large (element count or byte size "
                       "overflows)", c->path, what, shape);
    if (*offset % f->alignment != 0)
        return err_set(GERBIL_ERR_FORMAT, "%s: %s: offset %llu is not a multiple of the "
                       "alignment %zu", c->path, what, (unsigned long long)*offset, f->alignment);
    t->n_dims = (int)nd;
    for (int d = 0; d < (int)nd; d++) t->ne[d] = (int64_t)ne[nd - 1 - (uint32_t)d];
    for (int d = (int)nd; d < GB_MAX_DIMS; d++) t->ne[d] = 1;
    t->nbytes = (size_t)nbytes;
    return GERBIL_OK;
}

/* ---- open ---- */

static gerbil_status parse(struct gguf_file *f) {
    const char *path = f->map.path;
    struct cursor c = {.p = f->map.data, .size = f->map.size, .pos = 0, .path = path};

    if (c.size < 4 || memcmp(c.p, "GGUF", 4) != 0)
        return err_set(GERBIL_ERR_FORMAT, "%s: bad magic: %s, expected \"GGUF\"; not a GGUF file",
                       path, c.size < 4 ? "file shorter than 4 bytes" : "first bytes differ");
    c.pos = 4;
    GB_TRY(rd_u32(&c, &f->version, "version"));
    if (f->version != 2 && f->version != 3) {
        uint32_t v = f->version;
        uint32_t sw = (v >> 24) | ((v >> 8) & 0xFF00u) | ((v << 8) & 0xFF0000u) | (v << 24);
        if (sw == 2 || sw == 3)
            return err_set(GERBIL_ERR_UNSUPPORTED, "%s: GGUF version %u read big-endian: big-endian "
                           "GGUF files are not supported", path, sw);
        if (v == 1)
            return err_set(GERBIL_ERR_UNSUPPORTED, "%s: GGUF version 1 is not supported (it used "
                           "32-bit counts); convert the model again with current llama.cpp tools",
                           path);
        return err_set(GERBIL_ERR_UNSUPPORTED, "%s: GGUF version %u is not supported (gerbil reads "
                       "versions 2 and 3)", path, v);
    }
    uint64_t n_tensors, n_kv;
    GB_TRY(rd_uint(&c, 8, &n_tensors, "tensor count"));
    GB_TRY(rd_uint(&c, 8, &n_kv, "kv count"));
    /* A kv takes >= 13 bytes (key length, type, one byte of value), a tensor info
     * >= 32 (name length, n_dims, one dim, type, offset). */
    size_t left = c.size - c.pos;
    if (n_kv > GGUF_MAX_KV)
        return err_set(GERBIL_ERR_FORMAT, "%s: kv count %llu is absurd (limit %d)", path,
                       (unsigned long long)n_kv, GGUF_MAX_KV);
    if (n_tensors > GGUF_MAX_TENSORS)
        return err_set(GERBIL_ERR_FORMAT, "%s: tensor count %llu is absurd (limit %d)", path,
                       (unsigned long long)n_tensors, GGUF_MAX_TENSORS);
    if (n_kv * 13 + n_tensors * 32 > left) /* both < 2^20: no overflow */
        return err_set(GERBIL_ERR_FORMAT, "%s: %llu kv pairs and %llu tensor infos need at least "
                       "%llu bytes, %zu left before the end of the file (truncated?)", path,
                       (unsigned long long)n_kv, (unsigned long long)n_tensors,
                       (unsigned long long)(n_kv * 13 + n_tensors * 32), left);

    /* metadata */
    if (n_kv) {
        f->kv = calloc((size_t)n_kv, sizeof *f->kv);
        if (!f->kv) return err_set(GERBIL_ERR_NOMEM, "%s: out of memory", path);
    }
    for (uint64_t i = 0; i < n_kv; i++) {
        char what[GGUF_MSG_NAME + 64];
        snprintf(what, sizeof what, "key of kv %llu", (unsigned long long)i);
        const char *key;
        uint64_t key_len;
        GB_TRY(rd_str(&c, &key, &key_len, what));
        struct gguf_kv *kv = &f->kv[i];
        kv->key = dup_bytes(key, (size_t)key_len);
        if (!kv->key) return err_set(GERBIL_ERR_NOMEM, "%s: out of memory", path);
        f->n_kv = (int64_t)i + 1; /* so gguf_close frees it */
        if (memchr(key, '\0', (size_t)key_len))
            return err_set(GERBIL_ERR_FORMAT, "%s: key of kv %llu contains a NUL byte", path,
                           (unsigned long long)i);
        snprintf(what, sizeof what, "value of \"%.*s\"", GGUF_MSG_NAME, kv->key);
        uint32_t t;
        GB_TRY(rd_u32(&c, &t, what));
        if (t > GGUF_VT_F64)
            return err_set(GERBIL_ERR_FORMAT, "%s: %s: unknown value type %u", path, what, t);
        kv->type = (enum gguf_vtype)t;
        GB_TRY(rd_value(&c, kv, what));
    }

    /* Duplicate keys would make lookups ambiguous. */
    if (n_kv) {
        f->kv_sorted = malloc((size_t)n_kv * sizeof *f->kv_sorted);
        if (!f->kv_sorted) return err_set(GERBIL_ERR_NOMEM, "%s: out of memory", path);
        for (uint32_t i = 0; i < (uint32_t)n_kv; i++) f->kv_sorted[i] = i;
        sort_idx(f, f->kv_sorted, (size_t)n_kv, cmp_kv_idx);
        for (size_t i = 1; i < (size_t)n_kv; i++)
            if (strcmp(f->kv[f->kv_sorted[i - 1]].key, f->kv[f->kv_sorted[i]].key) == 0)
                return err_set(GERBIL_ERR_FORMAT, "%s: duplicate key \"%.*s\"", path, GGUF_MSG_NAME,
                               f->kv[f->kv_sorted[i]].key);
    }

    f->alignment = 32;
    const struct gguf_kv *al = gguf_find_kv(f, "general.alignment");
    if (al) {
        if (al->type != GGUF_VT_U32)
            return err_set(GERBIL_ERR_FORMAT, "%s: general.alignment is a %s, expected u32", path,
                           vtype_name(al->type));
        if (al->v.u == 0 || (al->v.u & (al->v.u - 1)) != 0 || al->v.u > GGUF_MAX_ALIGNMENT)
            return err_set(GERBIL_ERR_FORMAT, "%s: general.alignment %llu is not a power of two "
                           "(up to 2^30)", path, (unsigned long long)al->v.u);
        f->alignment = (size_t)al->v.u;
    }

    /* tensor infos */
    uint64_t *offsets = NULL;
    if (n_tensors) {
        f->tensors = calloc((size_t)n_tensors, sizeof *f->tensors);
        offsets = malloc((size_t)n_tensors * sizeof *offsets);
        if (!f->tensors || !offsets) {
            free(offsets);
            return err_set(GERBIL_ERR_NOMEM, "%s: out of memory", path);
        }
    }
    gerbil_status s = GERBIL_OK;
    for (int i = 0; i < (int)n_tensors && s == GERBIL_OK; i++) {
        f->n_tensors = i + 1; /* so gguf_close frees the name */
        s = rd_tensor_info(&c, f, i, &offsets[i]);
    }
    if (s != GERBIL_OK) { free(offsets); return s; }

    /* data section: header end rounded up to the alignment */
    size_t pad = (f->alignment - c.pos % f->alignment) % f->alignment;
    f->data_offset = c.pos + pad; /* c.pos <= size, pad < 2^30: no overflow */
    size_t data_size = f->data_offset <= c.size ? c.size - f->data_offset : 0;
    const unsigned char *data = c.p + (f->data_offset <= c.size ? f->data_offset : c.size);
    for (int i = 0; i < f->n_tensors; i++) {
        struct gb_tensor *t = &f->tensors[i];
        if (f->data_offset > c.size || offsets[i] > data_size || t->nbytes > data_size - offsets[i]) {
            s = err_set(GERBIL_ERR_FORMAT, "%s: tensor \"%.*s\": bytes [%llu, +%zu) of the data "
                        "section (at file offset %zu) go past the end of the file (%zu bytes); "
                        "truncated?", path, GGUF_MSG_NAME, t->name, (unsigned long long)offsets[i],
                        t->nbytes, f->data_offset, c.size);
            break;
        }
        t->data = data + offsets[i];
        t->in_memory = f->map.anonymous;
    }
    free(offsets);
    if (s != GERBIL_OK) return s;

    if (f->n_tensors) {
        size_t n = (size_t)f->n_tensors;
        f->tensor_sorted = malloc(n * sizeof *f->tensor_sorted);
        if (!f->tensor_sorted) return err_set(GERBIL_ERR_NOMEM, "%s: out of memory", path);
        /* Overlap: by position, each tensor must start at or after the end of the
         * previous one (no tensor is empty). Gaps are allowed. */
        for (uint32_t i = 0; i < (uint32_t)n; i++) f->tensor_sorted[i] = i;
        sort_idx(f, f->tensor_sorted, n, cmp_tensor_pos);
        for (size_t i = 1; i < n; i++) {
            const struct gb_tensor *a = &f->tensors[f->tensor_sorted[i - 1]];
            const struct gb_tensor *b = &f->tensors[f->tensor_sorted[i]];
            if ((const char *)b->data < (const char *)a->data + a->nbytes)
                return err_set(GERBIL_ERR_FORMAT, "%s: tensors \"%.*s\" and \"%.*s\" overlap in "
                               "the data section", path, GGUF_MSG_NAME, a->name, GGUF_MSG_NAME,
                               b->name);
        }
        /* Then by name, for gguf_find_tensor; a name twice would be ambiguous. */
        sort_idx(f, f->tensor_sorted, n, cmp_tensor_idx);
        for (size_t i = 1; i < n; i++)
            if (strcmp(f->tensors[f->tensor_sorted[i - 1]].name,
                       f->tensors[f->tensor_sorted[i]].name) == 0)
                return err_set(GERBIL_ERR_FORMAT, "%s: duplicate tensor name \"%.*s\"", path,
                               GGUF_MSG_NAME, f->tensors[f->tensor_sorted[i]].name);
    }
    return GERBIL_OK;
}

gerbil_status gguf_open(const char *path, const struct st_load_opts *opts, struct gguf_file *out) {
    memset(out, 0, sizeof *out);
    const uint16_t one = 1;
    if (*(const unsigned char *)&one != 1)
        return err_set(GERBIL_ERR_UNSUPPORTED, "%s: GGUF reading needs a little-endian host", path);
    struct gguf_file f = {0};
    GB_TRY(mapped_file_open(path, &f.map));
    gerbil_status s = GERBIL_OK;
    if (opts && opts->in_memory) s = mapped_file_copy_to_memory(&f.map, opts->progress, opts->user);
    if (s == GERBIL_OK) s = parse(&f);
    if (s != GERBIL_OK) {
        gguf_close(&f);
        return s;
    }
    *out = f;
    return GERBIL_OK;
}

gerbil_status gguf_open_memory(const void *data, size_t size, const char *name, struct gguf_file *out) {
    memset(out, 0, sizeof *out);
    struct gguf_file f = {0};
    f.map.path = strdup(name);
    if (!f.map.path) return err_set(GERBIL_ERR_NOMEM, "%s: out of memory", name);
    f.map.data = size ? data : NULL;
    f.map.size = size;
    f.borrowed = 1;
    gerbil_status s = parse(&f);
    if (s != GERBIL_OK) {
        gguf_close(&f);
        return s;
    }
    *out = f;
    return GERBIL_OK;
}

void gguf_close(struct gguf_file *f) {
    if (!f) return;
    if (f->borrowed) f->map.data = NULL; /* the caller's buffer: not ours to unmap */
    for (int64_t i = 0; i < f->n_kv; i++) {
        struct gguf_kv *kv = &f->kv[i];
        free(kv->key);
        free(kv->str);
        if (kv->arr_strs) free(kv->arr_strs[0]); /* the block holding every string */
        free(kv->arr_strs);
        free(kv->arr_str_lens);
    }
    free(f->kv);
    for (int i = 0; i < f->n_tensors; i++) free((char *)f->tensors[i].name);
    free(f->tensors);
    free(f->kv_sorted);
    free(f->tensor_sorted);
    mapped_file_close(&f->map);
    memset(f, 0, sizeof *f);
}

/* ---- lookups ---- */

const struct gguf_kv *gguf_find_kv(const struct gguf_file *f, const char *key) {
    if (!f || !key || !f->kv_sorted) return NULL;
    size_t lo = 0, hi = (size_t)f->n_kv;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const struct gguf_kv *kv = &f->kv[f->kv_sorted[mid]];
        int c = strcmp(key, kv->key);
        if (c == 0) return kv;
        if (c < 0) hi = mid;
        else lo = mid + 1;
    }
    return NULL;
}

const struct gb_tensor *gguf_find_tensor(const struct gguf_file *f, const char *name) {
    if (!f || !name || !f->tensor_sorted) return NULL;
    size_t lo = 0, hi = (size_t)f->n_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const struct gb_tensor *t = &f->tensors[f->tensor_sorted[mid]];
        int c = strcmp(name, t->name);
        if (c == 0) return t;
        if (c < 0) hi = mid;
        else lo = mid + 1;
    }
    return NULL;
}

static gerbil_status wrong_type(const struct gguf_file *f, const struct gguf_kv *kv, const char *want) {
    return err_set(GERBIL_ERR_FORMAT, "%s: metadata \"%s\" has type %s, expected %s", f->map.path,
                   kv->key, vtype_name(kv->type), want);
}

gerbil_status gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t def, uint32_t *out) {
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) { *out = def; return GERBIL_OK; }
    if (!is_int_type(kv->type)) return wrong_type(f, kv, "an unsigned integer");
    int neg = is_signed_type(kv->type) && kv->v.i < 0;
    uint64_t v = is_signed_type(kv->type) ? (uint64_t)kv->v.i : kv->v.u;
    if (neg || v > UINT32_MAX)
        return err_set(GERBIL_ERR_FORMAT, "%s: metadata \"%s\" = %s%llu is out of range for u32",
                       f->map.path, key, neg ? "-" : "",
                       neg ? (unsigned long long)(-(kv->v.i + 1)) + 1 : (unsigned long long)v);
    *out = (uint32_t)v;
    return GERBIL_OK;
}

gerbil_status gguf_get_u64(const struct gguf_file *f, const char *key, uint64_t def, uint64_t *out) {
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) { *out = def; return GERBIL_OK; }
    if (!is_int_type(kv->type)) return wrong_type(f, kv, "an unsigned integer");
    if (is_signed_type(kv->type) && kv->v.i < 0)
        return err_set(GERBIL_ERR_FORMAT, "%s: metadata \"%s\" = %lld is negative", f->map.path,
                       key, (long long)kv->v.i);
    *out = is_signed_type(kv->type) ? (uint64_t)kv->v.i : kv->v.u;
    return GERBIL_OK;
}

gerbil_status gguf_get_f32(const struct gguf_file *f, const char *key, float def, float *out) {
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) { *out = def; return GERBIL_OK; }
    if ((kv->type == GGUF_VT_F32 || kv->type == GGUF_VT_F64) && fabs(kv->v.f) > FLT_MAX && isfinite(kv->v.f))
        return err_set(GERBIL_ERR_FORMAT, "%s: metadata \"%s\" = %g is out of range for f32", f->map.path, key,
                       kv->v.f);
    if (kv->type == GGUF_VT_F32 || kv->type == GGUF_VT_F64) *out = (float)kv->v.f;
    else if (is_signed_type(kv->type)) *out = (float)kv->v.i;
    else if (is_int_type(kv->type)) *out = (float)kv->v.u;
    else return wrong_type(f, kv, "a number");
    return GERBIL_OK;
}

gerbil_status gguf_get_bool(const struct gguf_file *f, const char *key, int def, int *out) {
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) { *out = def; return GERBIL_OK; }
    if (kv->type != GGUF_VT_BOOL) return wrong_type(f, kv, "a bool");
    *out = kv->v.u != 0;
    return GERBIL_OK;
}

const char *gguf_get_str(const struct gguf_file *f, const char *key) {
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    return kv && kv->type == GGUF_VT_STRING ? kv->str : NULL;
}

gerbil_status gguf_get_arr(const struct gguf_file *f, const char *key, enum gguf_vtype elem,
                           const struct gguf_kv **out) {
    *out = NULL;
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return GERBIL_OK;
    if (kv->type != GGUF_VT_ARRAY || kv->arr_type != elem) {
        char want[32];
        snprintf(want, sizeof want, "an array of %s", vtype_name(elem));
        if (kv->type == GGUF_VT_ARRAY)
            return err_set(GERBIL_ERR_FORMAT, "%s: metadata \"%s\" is an array of %s, expected %s",
                           f->map.path, key, vtype_name(kv->arr_type), want);
        return wrong_type(f, kv, want);
    }
    *out = kv;
    return GERBIL_OK;
}

int64_t gguf_arr_int(const struct gguf_kv *kv, uint64_t i) {
    GB_ASSERT(kv->type == GGUF_VT_ARRAY && i < kv->arr_n && is_int_type(kv->arr_type));
    size_t sz = gguf_scalar_size(kv->arr_type);
    uint64_t x = load_le((const unsigned char *)kv->arr_data + i * sz, sz);
    switch (kv->arr_type) {
    case GGUF_VT_I8: return (int8_t)x;
    case GGUF_VT_I16: return (int16_t)x;
    case GGUF_VT_I32: return (int32_t)x;
    default: return (int64_t)x;
    }
}

double gguf_arr_float(const struct gguf_kv *kv, uint64_t i) {
    GB_ASSERT(kv->type == GGUF_VT_ARRAY && i < kv->arr_n);
    if (kv->arr_type == GGUF_VT_F32) {
        uint32_t b = (uint32_t)load_le((const unsigned char *)kv->arr_data + i * 4, 4);
        float v;
        memcpy(&v, &b, 4);
        return v;
    }
    if (kv->arr_type == GGUF_VT_F64) {
        uint64_t b = load_le((const unsigned char *)kv->arr_data + i * 8, 8);
        double v;
        memcpy(&v, &b, 8);
        return v;
    }
    GB_ASSERT(is_int_type(kv->arr_type));
    return is_signed_type(kv->arr_type) ? (double)gguf_arr_int(kv, i) : (double)(uint64_t)gguf_arr_int(kv, i);
}

const char *gguf_vtype_name(enum gguf_vtype t) { return vtype_name((uint32_t)t); }
