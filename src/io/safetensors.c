#include "io/safetensors.h"
#include "base/status.h"
#include "io/json.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The reference implementation refuses headers over 100 MB; a real header is a few
 * hundred bytes per tensor, so anything larger is corrupt, and refusing it early
 * keeps a hostile length from making cJSON allocate gigabytes. */
enum { ST_MAX_HEADER = 100 * 1000 * 1000 };

/* Integers in the header arrive as doubles (cJSON); beyond 2^53 they are no longer
 * exact, and no real shape or offset comes near that. */
#define ST_MAX_JSON_INT 9007199254740992.0 /* 2^53 */

/* Dtypes the format defines that gerbil does not read; a string outside this list
 * is still reported as unknown-but-well-formed (UNSUPPORTED): newer writers add
 * dtypes, and "too new for us" is the honest message. */
static const char *const st_known_unsupported[] = {
    "F64", "I16", "U16", "U64", "BOOL", "C64", "F8_E4M3", "F8_E5M2", "F8_E8M0",
    "F6_E2M3", "F6_E3M2", "F4", "E8M0",
};

/* Read a header integer: a JSON number that is integral, >= 0 and exact. */
static int json_uint(const cJSON *it, uint64_t *out) {
    if (!it || !cJSON_IsNumber(it)) return 0;
    double v = it->valuedouble;
    if (!(v >= 0.0) || v >= ST_MAX_JSON_INT || v != (double)(uint64_t)v) return 0;
    *out = (uint64_t)v;
    return 1;
}

/* Describe a JSON value that should have been a non-negative integer, for messages. */
static void describe_value(const cJSON *it, char *buf, size_t cap) {
    if (!it) snprintf(buf, cap, "missing");
    else if (cJSON_IsNumber(it)) snprintf(buf, cap, "%.17g", it->valuedouble);
    else if (cJSON_IsString(it)) snprintf(buf, cap, "a string");
    else if (cJSON_IsArray(it)) snprintf(buf, cap, "an array");
    else if (cJSON_IsObject(it)) snprintf(buf, cap, "an object");
    else if (cJSON_IsBool(it)) snprintf(buf, cap, "a boolean");
    else snprintf(buf, cap, "null");
}

static void format_shape(const struct gb_tensor *t, char *buf, size_t cap) {
    size_t n = 0;
    n += (size_t)snprintf(buf + n, cap - n, "[");
    for (int i = 0; i < t->n_dims && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)t->ne[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

static const char *supported_dtypes(void) {
    return "F32, F16, BF16, I32, U32, U8, I8, I64";
}

/* Parse one tensor entry of the header into *t (name not set) and its offsets. On
 * failure the message names the file and the tensor. */
static gerbil_status parse_entry(const char *path, const cJSON *e, size_t data_size,
                                 struct gb_tensor *t, uint64_t *begin, uint64_t *end) {
    const char *name = e->string;
    if (!cJSON_IsObject(e))
        return err_set(GERBIL_ERR_FORMAT, "%s: tensor \"%s\": entry is not a JSON object",
                       path, name);

    /* dtype */
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    if (!dt || !cJSON_IsString(dt) || !dt->valuestring)
        return err_set(GERBIL_ERR_FORMAT, "%s: tensor \"%s\": dtype is %s, expected a string",
                       path, name, dt ? "not a string" : "missing");
    if (type_from_safetensors(dt->valuestring, &t->type) != 0) {
        int known = 0;
        for (size_t i = 0; i < sizeof st_known_unsupported / sizeof *st_known_unsupported; i++)
            if (strcmp(dt->valuestring, st_known_unsupported[i]) == 0) known = 1;
        return err_set(GERBIL_ERR_UNSUPPORTED, "%s: tensor \"%s\": %s dtype \"%s\" (gerbil reads %s)",
                       path, name, known ? "unsupported" : "unknown", dt->valuestring,
                       supported_dtypes());
    }

    /* shape */
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    if (!sh || !cJSON_IsArray(sh))
        return err_set(GERBIL_ERR_FORMAT, "%s: tensor \"%s\": shape is %s, expected an array",
                       path, name, sh ? "not an array" : "missing");
    int nd = cJSON_GetArraySize(sh);
    if (nd > GB_MAX_DIMS)
        return err_set(GERBIL_ERR_UNSUPPORTED, "%s: tensor \"%s\": shape has %d dimensions, "
                       "at most %d supported", path, name, nd, GB_MAX_DIMS);
    t->n_dims = nd;
    int d = 0;
    const cJSON *dim;
    cJSON_ArrayForEach(dim, sh) {
        uint64_t v;
        if (!json_uint(dim, &v)) {
            char got[64];
            describe_value(dim, got, sizeof got);
            return err_set(GERBIL_ERR_FORMAT, "%s: tensor \"%s\": shape[%d] is %s, expected a "
                           "non-negative integer", path, name, d, got);
        }
        t->ne[d++] = (int64_t)v;
    }
    for (; d < GB_MAX_DIMS; d++) t->ne[d] = 1;

    /* data_offsets */
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!off || !cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2)
        return err_set(GERBIL_ERR_FORMAT, "%s: tensor \"%s\": data_offsets is %s, expected "
                       "[begin, end]", path, name,
                       !off ? "missing" : cJSON_IsArray(off) ? "not of length 2" : "not an array");
    for (int i = 0; i < 2; i++) {
        const cJSON *it = cJSON_GetArrayItem(off, i);
        if (!json_uint(it, i ? end : begin)) {
            char got[64];
            describe_value(it, got, sizeof got);
            return err_set(GERBIL_ERR_FORMAT, "%s: tensor \"%s\": data_offsets[%d] is %s, "
                           "expected a non-negative integer", path, name, i, got);
        }
    }
    if (*begin > *end)
        return err_set(GERBIL_ERR_FORMAT, "%s: tensor \"%s\": data_offsets [%llu, %llu] reversed "
                       "(begin > end)", path, name,
                       (unsigned long long)*begin, (unsigned long long)*end);
    if (*end > data_size)
        return err_set(GERBIL_ERR_FORMAT, "%s: tensor \"%s\": data_offsets end %llu past the end "
                       "of the data section (%zu bytes); file truncated?", path, name,
                       (unsigned long long)*end, data_size);

    /* Byte size. A zero dimension makes the tensor empty whatever the others are, so
     * it must not be reported as an overflow of the product of the rest. */
    char shape[128];
    format_shape(t, shape, sizeof shape);
    size_t tsize = type_traits(t->type)->type_size;
    size_t nbytes = tsize;
    int empty = 0;
    for (int i = 0; i < nd; i++) if (t->ne[i] == 0) empty = 1;
    if (empty) {
        nbytes = 0;
    } else {
        for (int i = 0; i < nd; i++) {
            size_t n = (size_t)t->ne[i];
            if (nbytes > SIZE_MAX / n)
                return err_set(GERBIL_ERR_FORMAT, "%s: tensor \"%s\": shape %s too large "
                               "(byte size overflows)", path, name, shape);
            nbytes *= n;
        }
    }
    if ((uint64_t)nbytes != *end - *begin)
        return err_set(GERBIL_ERR_FORMAT, "%s: tensor \"%s\": size mismatch: shape %s of %s needs "
                       "%zu bytes, data_offsets [%llu, %llu] hold %llu", path, name, shape,
                       type_name(t->type), nbytes, (unsigned long long)*begin,
                       (unsigned long long)*end, (unsigned long long)(*end - *begin));
    t->nbytes = nbytes;
    return GERBIL_OK;
}

static int cmp_by_data(const void *a, const void *b) {
    const struct gb_tensor *x = a, *y = b;
    const char *px = x->data, *py = y->data;
    if (px != py) return px < py ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

static int cmp_by_name(const void *a, const void *b) {
    const struct gb_tensor *x = a, *y = b;
    return strcmp(x->name, y->name);
}

gerbil_status st_file_open(const char *path, struct st_file *out) {
    return st_file_open_opts(path, NULL, out);
}

gerbil_status st_file_open_opts(const char *path, const struct st_load_opts *opts, struct st_file *out) {
    memset(out, 0, sizeof *out);
    struct st_file f = {0};
    cJSON *root = NULL;
    char *what = NULL;
    gerbil_status s;

    GB_TRY(mapped_file_open(path, &f.map));
    if (opts && opts->in_memory) {
        s = mapped_file_copy_to_memory(&f.map, opts->progress, opts->user);
        if (s != GERBIL_OK) { mapped_file_close(&f.map); return s; }
    }
    const unsigned char *base = f.map.data;
    size_t size = f.map.size;

    if (size < 8) {
        s = err_set(GERBIL_ERR_FORMAT, "%s: file is %zu bytes, too short for the 8-byte header "
                    "length", path, size);
        goto fail;
    }
    /* Byte by byte: little-endian whatever the host, and no unaligned load. */
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | base[i];
    if (hlen > size - 8) {
        s = err_set(GERBIL_ERR_FORMAT, "%s: header length %llu past end of file (%zu bytes); "
                    "truncated or not a safetensors file", path, (unsigned long long)hlen, size);
        goto fail;
    }
    if (hlen > ST_MAX_HEADER) {
        s = err_set(GERBIL_ERR_FORMAT, "%s: header length %llu exceeds the %d-byte limit",
                    path, (unsigned long long)hlen, ST_MAX_HEADER);
        goto fail;
    }
    const char *header = (const char *)base + 8;
    const unsigned char *data = base + 8 + hlen;
    size_t data_size = size - 8 - (size_t)hlen;

    size_t wlen = strlen(path) + sizeof ": header";
    what = malloc(wlen);
    if (!what) { s = err_set(GERBIL_ERR_NOMEM, "%s: out of memory", path); goto fail; }
    snprintf(what, wlen, "%s: header", path);
    s = json_parse(header, (size_t)hlen, what, &root);
    if (s != GERBIL_OK) goto fail;
    if (!cJSON_IsObject(root)) {
        s = err_set(GERBIL_ERR_FORMAT, "%s: header is not a JSON object", path);
        goto fail;
    }

    /* Count first so the array is allocated once. __metadata__ holds free-form
     * strings that gerbil does not use; it is skipped whatever its shape. */
    int n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, root) {
        if (e->string && strcmp(e->string, "__metadata__") == 0) continue;
        n++;
    }
    if (n > 0) {
        f.tensors = calloc((size_t)n, sizeof *f.tensors);
        if (!f.tensors) { s = err_set(GERBIL_ERR_NOMEM, "%s: out of memory", path); goto fail; }
    }

    cJSON_ArrayForEach(e, root) {
        if (!e->string) continue; /* cJSON always names object members; defensive */
        if (strcmp(e->string, "__metadata__") == 0) continue;
        struct gb_tensor *t = &f.tensors[f.n_tensors];
        uint64_t begin, end;
        s = parse_entry(path, e, data_size, t, &begin, &end);
        if (s != GERBIL_OK) goto fail;
        t->data = data + begin;
        t->in_memory = f.map.anonymous;
        t->name = strdup(e->string);
        if (!t->name) { s = err_set(GERBIL_ERR_NOMEM, "%s: out of memory", path); goto fail; }
        f.n_tensors++;
    }

    /* Overlap: after sorting by start, each non-empty tensor must begin at or after
     * the end of the furthest-reaching earlier one. Empty tensors occupy no bytes and
     * writers place them anywhere, so they are left out. Gaps are allowed. */
    if (f.n_tensors > 1) {
        qsort(f.tensors, (size_t)f.n_tensors, sizeof *f.tensors, cmp_by_data);
        const struct gb_tensor *reach = NULL; /* the earlier tensor ending last */
        for (int i = 0; i < f.n_tensors; i++) {
            const struct gb_tensor *t = &f.tensors[i];
            if (t->nbytes == 0) continue;
            const unsigned char *tb = t->data;
            if (reach) {
                const unsigned char *rb = reach->data;
                if (tb < rb + reach->nbytes) {
                    s = err_set(GERBIL_ERR_FORMAT, "%s: tensors \"%s\" [%zu, %zu) and \"%s\" "
                                "[%zu, %zu) overlap", path, reach->name, (size_t)(rb - data),
                                (size_t)(rb - data) + reach->nbytes, t->name,
                                (size_t)(tb - data), (size_t)(tb - data) + t->nbytes);
                    goto fail;
                }
            }
            if (!reach || tb + t->nbytes > (const unsigned char *)reach->data + reach->nbytes)
                reach = t;
        }
    }

    /* Sorted by name for st_file_find; cJSON keeps duplicate keys, which would make
     * lookups ambiguous, so they are an error. */
    if (f.n_tensors > 1) {
        qsort(f.tensors, (size_t)f.n_tensors, sizeof *f.tensors, cmp_by_name);
        for (int i = 1; i < f.n_tensors; i++) {
            if (strcmp(f.tensors[i - 1].name, f.tensors[i].name) == 0) {
                s = err_set(GERBIL_ERR_FORMAT, "%s: tensor \"%s\" listed twice in the header",
                            path, f.tensors[i].name);
                goto fail;
            }
        }
    }

    cJSON_Delete(root);
    free(what);
    *out = f;
    return GERBIL_OK;

fail:
    cJSON_Delete(root);
    free(what);
    st_file_close(&f);
    return s;
}

void st_file_close(struct st_file *f) {
    if (!f) return;
    if (f->tensors)
        for (int i = 0; i < f->n_tensors; i++) free((char *)f->tensors[i].name);
    free(f->tensors);
    mapped_file_close(&f->map);
    memset(f, 0, sizeof *f);
}

const struct gb_tensor *st_file_find(const struct st_file *f, const char *name) {
    if (!f || !name) return NULL;
    int lo = 0, hi = f->n_tensors; /* search [lo, hi) */
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(name, f->tensors[mid].name);
        if (c == 0) return &f->tensors[mid];
        if (c < 0) hi = mid;
        else lo = mid + 1;
    }
    return NULL;
}

/* ---- checkpoints ---- */

/* dir + "/" + name in fresh memory, or NULL when out of memory. */
static char *path_join(const char *dir, const char *name) {
    size_t dl = strlen(dir), nl = strlen(name);
    int slash = dl > 0 && dir[dl - 1] != '/';
    char *p = malloc(dl + (size_t)slash + nl + 1);
    if (!p) return NULL;
    memcpy(p, dir, dl);
    if (slash) p[dl] = '/';
    memcpy(p + dl + (size_t)slash, name, nl + 1);
    return p;
}

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && !S_ISDIR(st.st_mode);
}

static int path_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* Open dir/names[i] for every i into ck->files (already allocated for n). */
static gerbil_status open_files(const char *dir, char **names, int n, const struct st_load_opts *opts,
                                struct st_checkpoint *ck) {
    for (int i = 0; i < n; i++) {
        char *p = path_join(dir, names[i]);
        if (!p) return err_set(GERBIL_ERR_NOMEM, "%s: out of memory", dir);
        gerbil_status s = st_file_open_opts(p, opts, &ck->files[ck->n_files]);
        free(p);
        if (s != GERBIL_OK) return s;
        ck->n_files++;
    }
    return GERBIL_OK;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Shard names come from an untrusted index; they must name a file inside dir. */
static int shard_name_ok(const char *s) {
    return s[0] != '\0' && !strchr(s, '/') && !strstr(s, "..");
}

static void free_names(char **names, int n) {
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
}

static gerbil_status open_sharded(const char *dir, const char *index_path, const struct st_load_opts *opts,
                                  struct st_checkpoint *ck) {
    cJSON *root = NULL;
    char **names = NULL;
    int n_names = 0;
    gerbil_status s = json_load_file(index_path, &root);
    if (s != GERBIL_OK) return s;

    const cJSON *wm = cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "weight_map")
                                           : NULL;
    if (!wm || !cJSON_IsObject(wm)) {
        s = err_set(GERBIL_ERR_FORMAT, "%s: \"weight_map\" missing or not an object", index_path);
        goto done;
    }
    int n_entries = cJSON_GetArraySize(wm);
    if (n_entries == 0) {
        s = err_set(GERBIL_ERR_FORMAT, "%s: \"weight_map\" is empty", index_path);
        goto done;
    }

    /* Distinct shard names; a model has at most a few hundred, so a linear scan per
     * entry is fine. */
    names = calloc((size_t)n_entries, sizeof *names);
    if (!names) { s = err_set(GERBIL_ERR_NOMEM, "%s: out of memory", index_path); goto done; }
    const cJSON *e;
    cJSON_ArrayForEach(e, wm) {
        if (!cJSON_IsString(e) || !e->valuestring) {
            s = err_set(GERBIL_ERR_FORMAT, "%s: weight_map[\"%s\"] is not a file name string",
                        index_path, e->string ? e->string : "");
            goto done;
        }
        if (!shard_name_ok(e->valuestring)) {
            s = err_set(GERBIL_ERR_FORMAT, "%s: weight_map[\"%s\"] names \"%s\", which is not a "
                        "plain file name in the checkpoint folder", index_path,
                        e->string ? e->string : "", e->valuestring);
            goto done;
        }
        int seen = 0;
        for (int i = 0; i < n_names && !seen; i++) seen = strcmp(names[i], e->valuestring) == 0;
        if (seen) continue;
        names[n_names] = strdup(e->valuestring);
        if (!names[n_names]) { s = err_set(GERBIL_ERR_NOMEM, "%s: out of memory", index_path); goto done; }
        n_names++;
    }
    /* Sorted so that file order (and st_checkpoint_at) does not depend on JSON order. */
    qsort(names, (size_t)n_names, sizeof *names, cmp_str);

    ck->files = calloc((size_t)n_names, sizeof *ck->files);
    if (!ck->files) { s = err_set(GERBIL_ERR_NOMEM, "%s: out of memory", index_path); goto done; }
    s = open_files(dir, names, n_names, opts, ck);
    if (s != GERBIL_OK) goto done;

    /* The index is a promise about where each tensor lives; a broken promise means a
     * shard is stale or from another model, so fail now rather than at lookup. */
    cJSON_ArrayForEach(e, wm) {
        int fi = 0;
        while (fi < n_names && strcmp(names[fi], e->valuestring) != 0) fi++;
        if (fi == n_names || !st_file_find(&ck->files[fi], e->string)) {
            s = err_set(GERBIL_ERR_FORMAT, "%s: tensor \"%s\" is not in \"%s\", where the "
                        "weight_map says it is", index_path, e->string, e->valuestring);
            goto done;
        }
    }

done:
    cJSON_Delete(root);
    free_names(names, n_names);
    return s;
}

static int has_st_suffix(const char *name) {
    static const char suffix[] = ".safetensors";
    size_t n = strlen(name), k = sizeof suffix - 1;
    return n > k && strcmp(name + n - k, suffix) == 0;
}

static gerbil_status open_all_in_dir(const char *dir, const struct st_load_opts *opts, struct st_checkpoint *ck) {
    DIR *d = opendir(dir);
    if (!d) return err_set(GERBIL_ERR_IO, "%s: %s", dir, strerror(errno));
    char **names = NULL;
    int n = 0, cap = 0;
    gerbil_status s = GERBIL_OK;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (!has_st_suffix(de->d_name)) continue;
        if (n == cap) {
            int ncap = cap ? cap * 2 : 8;
            char **nn = realloc(names, (size_t)ncap * sizeof *nn);
            if (!nn) { s = err_set(GERBIL_ERR_NOMEM, "%s: out of memory", dir); goto done; }
            names = nn;
            cap = ncap;
        }
        names[n] = strdup(de->d_name);
        if (!names[n]) { s = err_set(GERBIL_ERR_NOMEM, "%s: out of memory", dir); goto done; }
        n++;
    }
    if (n == 0) {
        s = err_set(GERBIL_ERR_IO, "no .safetensors files in %s", dir);
        goto done;
    }
    /* readdir order is arbitrary; sort so that loading is reproducible. */
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    ck->files = calloc((size_t)n, sizeof *ck->files);
    if (!ck->files) { s = err_set(GERBIL_ERR_NOMEM, "%s: out of memory", dir); goto done; }
    s = open_files(dir, names, n, opts, ck);

done:
    closedir(d);
    free_names(names, n);
    return s;
}

struct name_ref {
    const char *name;
    int file;
};

static int cmp_name_ref(const void *a, const void *b) {
    const struct name_ref *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->file > y->file) - (x->file < y->file);
}

/* A name in two files would make st_checkpoint_find depend on file order. */
static gerbil_status check_unique(const struct st_checkpoint *ck) {
    if (ck->n_files < 2) return GERBIL_OK; /* each file is unique already */
    /* Counted in size_t: st_checkpoint_n_tensors returns an int. */
    size_t total = 0;
    for (int f = 0; f < ck->n_files; f++) total += (size_t)ck->files[f].n_tensors;
    if (total > INT_MAX) return err_set(GERBIL_ERR_UNSUPPORTED, "checkpoint: %zu tensors, too many", total);
    if (total < 2) return GERBIL_OK;
    struct name_ref *refs = malloc(total * sizeof *refs);
    if (!refs) return err_set(GERBIL_ERR_NOMEM, "checkpoint: out of memory");
    size_t k = 0;
    for (int f = 0; f < ck->n_files; f++)
        for (int i = 0; i < ck->files[f].n_tensors; i++)
            refs[k++] = (struct name_ref){ck->files[f].tensors[i].name, f};
    qsort(refs, total, sizeof *refs, cmp_name_ref);
    gerbil_status s = GERBIL_OK;
    for (size_t i = 1; i < total; i++) {
        if (strcmp(refs[i - 1].name, refs[i].name) == 0) {
            s = err_set(GERBIL_ERR_FORMAT, "tensor \"%s\" is in both %s and %s", refs[i].name,
                        ck->files[refs[i - 1].file].map.path, ck->files[refs[i].file].map.path);
            break;
        }
    }
    free(refs);
    return s;
}

gerbil_status st_checkpoint_open(const char *dir, struct st_checkpoint *out) {
    return st_checkpoint_open_opts(dir, NULL, out);
}

gerbil_status st_checkpoint_open_opts(const char *dir, const struct st_load_opts *opts, struct st_checkpoint *out) {
    memset(out, 0, sizeof *out);
    struct st_checkpoint ck = {0};
    gerbil_status s;

    char *index = path_join(dir, "model.safetensors.index.json");
    char *single = path_join(dir, "model.safetensors");
    if (!index || !single) {
        s = err_set(GERBIL_ERR_NOMEM, "%s: out of memory", dir);
        goto done;
    }
    if (path_exists(index)) {
        s = open_sharded(dir, index, opts, &ck);
    } else if (is_file(single)) {
        ck.files = calloc(1, sizeof *ck.files);
        if (!ck.files) { s = err_set(GERBIL_ERR_NOMEM, "%s: out of memory", dir); goto done; }
        s = st_file_open_opts(single, opts, &ck.files[0]);
        if (s == GERBIL_OK) ck.n_files = 1;
    } else {
        s = open_all_in_dir(dir, opts, &ck);
    }
    if (s == GERBIL_OK) s = check_unique(&ck);

done:
    free(index);
    free(single);
    if (s != GERBIL_OK) st_checkpoint_close(&ck);
    else *out = ck;
    return s;
}

void st_checkpoint_close(struct st_checkpoint *ck) {
    if (!ck) return;
    for (int i = 0; i < ck->n_files; i++) st_file_close(&ck->files[i]);
    free(ck->files);
    memset(ck, 0, sizeof *ck);
}

const struct gb_tensor *st_checkpoint_find(const struct st_checkpoint *ck, const char *name) {
    if (!ck) return NULL;
    for (int i = 0; i < ck->n_files; i++) {
        const struct gb_tensor *t = st_file_find(&ck->files[i], name);
        if (t) return t;
    }
    return NULL;
}

int st_checkpoint_n_tensors(const struct st_checkpoint *ck) {
    if (!ck) return 0;
    int n = 0;
    for (int i = 0; i < ck->n_files; i++) n += ck->files[i].n_tensors;
    return n;
}

const struct gb_tensor *st_checkpoint_at(const struct st_checkpoint *ck, int i) {
    if (!ck || i < 0) return NULL;
    for (int f = 0; f < ck->n_files; f++) {
        if (i < ck->files[f].n_tensors) return &ck->files[f].tensors[i];
        i -= ck->files[f].n_tensors;
    }
    return NULL;
}
