/* GGUF reader and writer: a written file reads back exactly (every value type, dims
 * reversed to our order); the real GGUF files in ../shared/data; every malformed
 * header the reader promises to reject is rejected with the right status and a
 * telling message; random corruption never crashes; files written by
 * scripts/gguf_py.py read back (when python3 is present). */
#include "test.h"

#include "base/status.h"
#include "io/gguf.h"
#include "io/gguf_write.h"
#include "tensor/quant.h"

#include <ftw.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[64];

static char *tmp_path(const char *name) {
    static char buf[512];
    snprintf(buf, sizeof buf, "%s/%s", tmpdir, name);
    return buf;
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); exit(1); }
    if (n && fwrite(p, 1, n, f) != n) { perror(path); exit(1); }
    fclose(f);
}

static unsigned char *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *p = malloc((size_t)len + 1);
    if (fread(p, 1, (size_t)len, f) != (size_t)len) { perror(path); exit(1); }
    fclose(f);
    *n = (size_t)len;
    return p;
}

/* ---- raw images, for files the writer would refuse to produce ---- */

struct img {
    unsigned char *p;
    size_t n, cap;
};

static void b_bytes(struct img *b, const void *p, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    if (n) memcpy(b->p + b->n, p, n);
    b->n += n;
}
static void b_le(struct img *b, uint64_t v, size_t n) {
    unsigned char t[8];
    for (size_t i = 0; i < n; i++) t[i] = (unsigned char)(v >> (8 * i));
    b_bytes(b, t, n);
}
static void b_u32(struct img *b, uint32_t v) { b_le(b, v, 4); }
static void b_u64(struct img *b, uint64_t v) { b_le(b, v, 8); }
static void b_str(struct img *b, const char *s) { b_u64(b, strlen(s)); b_bytes(b, s, strlen(s)); }
static void b_pad(struct img *b, size_t a) { while (b->n % a) b_le(b, 0, 1); }

/* One variable tensor ("b") and one fixed ("a", F32 ggml ne [4, 2] at offset 0), plus
 * metadata; every field defaults to a valid file and a case changes one. */
struct spec {
    const unsigned char *magic;
    uint32_t version;
    int64_t n_tensors, n_kv;    /* -1: the true count */
    uint32_t align_type;        /* type of general.alignment */
    uint64_t alignment;
    const char *b_name;
    uint32_t b_nd;
    uint64_t b_ne[5];           /* ggml order */
    uint32_t b_type;
    uint64_t b_off;
    size_t data_len;            /* bytes after the padded header */
    void (*extra)(struct img *);/* more kv pairs */
    int n_extra;
};

static struct spec valid_spec(void) {
    struct spec s = {
        .magic = (const unsigned char *)"GGUF", .version = 3, .n_tensors = -1, .n_kv = -1,
        .align_type = GGUF_VT_U32, .alignment = 32, .b_name = "b", .b_nd = 1, .b_ne = {8},
        .b_type = 1 /* F16 */, .b_off = 32, .data_len = 64,
    };
    return s;
}

static size_t header_end; /* of the last build_spec image */

static void build_spec(const struct spec *s, struct img *b) {
    b->n = 0;
    b_bytes(b, s->magic, 4);
    b_u32(b, s->version);
    b_u64(b, s->n_tensors >= 0 ? (uint64_t)s->n_tensors : 2);
    b_u64(b, s->n_kv >= 0 ? (uint64_t)s->n_kv : 3 + (uint64_t)s->n_extra);
    b_str(b, "general.architecture");
    b_u32(b, GGUF_VT_STRING);
    b_str(b, "llama");
    b_str(b, "general.alignment");
    b_u32(b, s->align_type);
    b_le(b, s->alignment, s->align_type == GGUF_VT_U64 ? 8 : 4);
    b_str(b, "x.arr");
    b_u32(b, GGUF_VT_ARRAY);
    b_u32(b, GGUF_VT_I32);
    b_u64(b, 3);
    b_u32(b, 1); b_u32(b, (uint32_t)-2); b_u32(b, 3);
    if (s->extra) s->extra(b);
    /* tensor a */
    b_str(b, "a");
    b_u32(b, 2);
    b_u64(b, 4);
    b_u64(b, 2);
    b_u32(b, 0);
    b_u64(b, 0);
    /* tensor b */
    b_str(b, s->b_name);
    b_u32(b, s->b_nd);
    for (uint32_t d = 0; d < s->b_nd && d < 5; d++) b_u64(b, s->b_ne[d]);
    b_u32(b, s->b_type);
    b_u64(b, s->b_off);
    header_end = b->n;
    b_pad(b, 32);
    for (size_t i = 0; i < s->data_len; i++) b_le(b, i * 7 + 1, 1);
}

/* Open path and require status want; when want is an error, require the message to
 * contain each of the (up to two) key words. */
static void expect_open(const char *path, gerbil_status want, const char *key1, const char *key2,
                        int line) {
    struct gguf_file f;
    err_clear();
    gerbil_status s = gguf_open(path, NULL, &f);
    const char *msg = gerbil_last_error();
    CHECKF(s == want, "line %d: %s: got %s, want %s (%s)", line, path, gerbil_status_name(s),
           gerbil_status_name(want), msg);
    if (s == GERBIL_OK) gguf_close(&f);
    else CHECK(f.kv == NULL && f.tensors == NULL && f.n_tensors == 0);
    if (want != GERBIL_OK) {
        CHECKF(!key1 || strstr(msg, key1), "line %d: message lacks \"%s\": %s", line, key1, msg);
        CHECKF(!key2 || strstr(msg, key2), "line %d: message lacks \"%s\": %s", line, key2, msg);
    }
}
#define EXPECT_OPEN(p, st, k1, k2) expect_open(p, st, k1, k2, __LINE__)

static void expect_spec(const struct spec *s, gerbil_status want, const char *key1, const char *key2,
                        int line) {
    struct img b = {0};
    build_spec(s, &b);
    const char *p = tmp_path("case.gguf");
    write_bytes(p, b.p, b.n);
    free(b.p);
    expect_open(p, want, key1, key2, line);
}
#define EXPECT_SPEC(s, st, k1, k2) expect_spec(&(s), st, k1, k2, __LINE__)

/* ---- the writer round trip ---- */

static const float a_f32[6] = {0.0f, 1.5f, -3.25f, 1e-8f, 65504.0f, -0.0f};
static const uint16_t b_f16[4] = {0x3C00, 0xC000, 0x0000, 0x3800}; /* 1, -2, 0, 0.5 */
static const uint16_t c_bf16[4] = {0x3F80, 0xC040, 0x4120, 0xBF00}; /* 1, -3, 10, -0.5 */
static float d_f32[24];
static block_q8_0 e_q8[2 * 2];   /* [2, 64] */
static block_q4_K f_q4k[3];      /* [3, 256] */
static const char *const strs[] = {"hello", "", "w\xc3\xb6rld", "\xe2\x96\x81the"};

static gerbil_status write_round_trip(const char *path) {
    struct gguf_writer *w;
    GB_TRY(gguf_writer_new(&w));
    uint8_t u8 = 200; int8_t i8 = -100; uint16_t u16 = 60000; int16_t i16 = -30000;
    uint8_t bo = 1; int64_t i64 = -1234567890123LL; double f64 = 3.141592653589793;
    static const int32_t ai32[5] = {-1, 0, 1, 2147483647, -2147483647 - 1};
    static const float af32[3] = {0.5f, -1e10f, 3.0f};
    static const uint8_t au8[4] = {0, 1, 254, 255};
    static const int16_t ai16[2] = {-32768, 32767};
    static const uint64_t au64[2] = {0, UINT64_MAX};
    static const double af64[2] = {1e300, -2.5};
    for (size_t i = 0; i < sizeof d_f32 / sizeof *d_f32; i++) d_f32[i] = (float)i * 0.25f - 2.0f;
    for (size_t i = 0; i < sizeof e_q8; i++) ((unsigned char *)e_q8)[i] = (unsigned char)(i * 13 + 5);
    for (size_t i = 0; i < sizeof f_q4k; i++) ((unsigned char *)f_q4k)[i] = (unsigned char)(i * 31 + 7);

    gerbil_status s = GERBIL_OK;
#define W(call) do { if (s == GERBIL_OK) s = (call); } while (0)
    W(gguf_writer_add_str(w, "general.architecture", "llama"));
    W(gguf_writer_add_scalar(w, "t.u8", GGUF_VT_U8, &u8));
    W(gguf_writer_add_scalar(w, "t.i8", GGUF_VT_I8, &i8));
    W(gguf_writer_add_scalar(w, "t.u16", GGUF_VT_U16, &u16));
    W(gguf_writer_add_scalar(w, "t.i16", GGUF_VT_I16, &i16));
    W(gguf_writer_add_u32(w, "t.u32", 4000000000u));
    W(gguf_writer_add_i32(w, "t.i32", -7));
    W(gguf_writer_add_f32(w, "t.f32", 1e-5f));
    W(gguf_writer_add_scalar(w, "t.bool", GGUF_VT_BOOL, &bo));
    W(gguf_writer_add_bool(w, "t.bool0", 0));
    W(gguf_writer_add_u64(w, "t.u64", 0x123456789ABCDEF0ULL));
    W(gguf_writer_add_scalar(w, "t.i64", GGUF_VT_I64, &i64));
    W(gguf_writer_add_scalar(w, "t.f64", GGUF_VT_F64, &f64));
    W(gguf_writer_add_strn(w, "t.str_nul", "a\0b", 3));
    W(gguf_writer_add_str(w, "t.str_empty", ""));
    W(gguf_writer_add_arr(w, "t.arr_i32", GGUF_VT_I32, ai32, 5));
    W(gguf_writer_add_arr(w, "t.arr_f32", GGUF_VT_F32, af32, 3));
    W(gguf_writer_add_arr(w, "t.arr_u8", GGUF_VT_U8, au8, 4));
    W(gguf_writer_add_arr(w, "t.arr_i16", GGUF_VT_I16, ai16, 2));
    W(gguf_writer_add_arr(w, "t.arr_u64", GGUF_VT_U64, au64, 2));
    W(gguf_writer_add_arr(w, "t.arr_f64", GGUF_VT_F64, af64, 2));
    W(gguf_writer_add_arr(w, "t.arr_empty", GGUF_VT_U32, NULL, 0));
    W(gguf_writer_add_str_arr(w, "t.arr_str", strs, 4));
    W(gguf_writer_add_str_arr(w, "t.arr_str_empty", NULL, 0));
    W(gguf_writer_add_tensor(w, "a.f32", GB_TYPE_F32, 2, (int64_t[]){2, 3}, a_f32, sizeof a_f32));
    W(gguf_writer_add_tensor(w, "b.f16", GB_TYPE_F16, 1, (int64_t[]){4}, b_f16, sizeof b_f16));
    W(gguf_writer_add_tensor(w, "c.bf16", GB_TYPE_BF16, 2, (int64_t[]){2, 2}, c_bf16, sizeof c_bf16));
    W(gguf_writer_add_tensor(w, "d.f32.4d", GB_TYPE_F32, 4, (int64_t[]){2, 1, 3, 4}, d_f32, sizeof d_f32));
    W(gguf_writer_add_tensor(w, "e.q8_0", GB_TYPE_Q8_0, 2, (int64_t[]){2, 64}, e_q8, sizeof e_q8));
    W(gguf_writer_add_tensor(w, "f.q4_k", GB_TYPE_Q4_K, 2, (int64_t[]){3, 256}, f_q4k, sizeof f_q4k));
#undef W
    if (s == GERBIL_OK) s = gguf_writer_write(w, path);
    gguf_writer_free(w);
    return s;
}

static void check_tensor(const struct gguf_file *f, const char *name, enum gb_type type, int nd,
                         const int64_t *ne, const void *bytes, size_t n) {
    const struct gb_tensor *t = gguf_find_tensor(f, name);
    CHECKF(t != NULL, "tensor %s not found", name);
    if (!t) return;
    CHECKF(t->type == type, "%s: type %s", name, type_name(t->type));
    CHECKF(t->n_dims == nd, "%s: n_dims %d want %d", name, t->n_dims, nd);
    for (int i = 0; i < nd && i < t->n_dims; i++)
        CHECKF(t->ne[i] == ne[i], "%s: ne[%d] = %lld want %lld", name, i, (long long)t->ne[i],
               (long long)ne[i]);
    CHECKF(t->nbytes == n, "%s: nbytes %zu want %zu", name, t->nbytes, n);
    CHECKF(memcmp(t->data, bytes, n) == 0, "%s: data differs", name);
    size_t off = (size_t)((const char *)t->data - (const char *)f->map.data);
    CHECKF(off % 32 == 0 && off >= f->data_offset, "%s: at file offset %zu", name, off);
}

static const struct gguf_kv *kv_of(const struct gguf_file *f, const char *key, enum gguf_vtype t) {
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    CHECKF(kv && kv->type == t, "%s: missing or type %d", key, kv ? (int)kv->type : -1);
    return kv && kv->type == t ? kv : NULL;
}

static void check_round_trip(const struct gguf_file *f) {
    CHECK(f->version == 3);
    CHECK(f->n_kv == 24);
    CHECK(f->n_tensors == 6);
    CHECK(f->alignment == 32);
    CHECK(f->data_offset % 32 == 0);
    CHECK(strcmp(f->kv[0].key, "general.architecture") == 0); /* file order kept */
    CHECK(strcmp(f->tensors[0].name, "a.f32") == 0 && strcmp(f->tensors[5].name, "f.q4_k") == 0);
    const struct gguf_kv *kv;
    if ((kv = kv_of(f, "t.u8", GGUF_VT_U8))) CHECK(kv->v.u == 200);
    if ((kv = kv_of(f, "t.i8", GGUF_VT_I8))) CHECK(kv->v.i == -100);
    if ((kv = kv_of(f, "t.u16", GGUF_VT_U16))) CHECK(kv->v.u == 60000);
    if ((kv = kv_of(f, "t.i16", GGUF_VT_I16))) CHECK(kv->v.i == -30000);
    if ((kv = kv_of(f, "t.u32", GGUF_VT_U32))) CHECK(kv->v.u == 4000000000u);
    if ((kv = kv_of(f, "t.i32", GGUF_VT_I32))) CHECK(kv->v.i == -7);
    if ((kv = kv_of(f, "t.f32", GGUF_VT_F32))) CHECK(kv->v.f == (double)1e-5f);
    if ((kv = kv_of(f, "t.bool", GGUF_VT_BOOL))) CHECK(kv->v.u == 1);
    if ((kv = kv_of(f, "t.bool0", GGUF_VT_BOOL))) CHECK(kv->v.u == 0);
    if ((kv = kv_of(f, "t.u64", GGUF_VT_U64))) CHECK(kv->v.u == 0x123456789ABCDEF0ULL);
    if ((kv = kv_of(f, "t.i64", GGUF_VT_I64))) CHECK(kv->v.i == -1234567890123LL);
    if ((kv = kv_of(f, "t.f64", GGUF_VT_F64))) CHECK(kv->v.f == 3.141592653589793);
    if ((kv = kv_of(f, "t.str_nul", GGUF_VT_STRING)))
        CHECK(kv->str_len == 3 && memcmp(kv->str, "a\0b", 4) == 0);
    if ((kv = kv_of(f, "t.str_empty", GGUF_VT_STRING))) CHECK(kv->str_len == 0 && kv->str[0] == 0);
    if ((kv = kv_of(f, "t.arr_i32", GGUF_VT_ARRAY))) {
        CHECK(kv->arr_type == GGUF_VT_I32 && kv->arr_n == 5);
        CHECK(gguf_arr_int(kv, 0) == -1 && gguf_arr_int(kv, 3) == 2147483647 &&
              gguf_arr_int(kv, 4) == -2147483647LL - 1);
    }
    if ((kv = kv_of(f, "t.arr_f32", GGUF_VT_ARRAY)))
        CHECK(kv->arr_n == 3 && gguf_arr_float(kv, 1) == -1e10f && gguf_arr_float(kv, 2) == 3.0);
    if ((kv = kv_of(f, "t.arr_u8", GGUF_VT_ARRAY)))
        CHECK(kv->arr_n == 4 && gguf_arr_int(kv, 3) == 255 && gguf_arr_float(kv, 2) == 254.0);
    if ((kv = kv_of(f, "t.arr_i16", GGUF_VT_ARRAY)))
        CHECK(kv->arr_n == 2 && gguf_arr_int(kv, 0) == -32768 && gguf_arr_int(kv, 1) == 32767);
    if ((kv = kv_of(f, "t.arr_u64", GGUF_VT_ARRAY)))
        CHECK(kv->arr_n == 2 && (uint64_t)gguf_arr_int(kv, 1) == UINT64_MAX);
    if ((kv = kv_of(f, "t.arr_f64", GGUF_VT_ARRAY)))
        CHECK(kv->arr_n == 2 && gguf_arr_float(kv, 0) == 1e300 && gguf_arr_float(kv, 1) == -2.5);
    if ((kv = kv_of(f, "t.arr_empty", GGUF_VT_ARRAY))) CHECK(kv->arr_n == 0 && kv->arr_type == GGUF_VT_U32);
    if ((kv = kv_of(f, "t.arr_str", GGUF_VT_ARRAY))) {
        CHECK(kv->arr_type == GGUF_VT_STRING && kv->arr_n == 4 && kv->arr_strs);
        for (int i = 0; i < 4 && kv->arr_strs; i++)
            CHECKF(strcmp(kv->arr_strs[i], strs[i]) == 0 && kv->arr_str_lens[i] == strlen(strs[i]),
                   "arr_str[%d] = \"%s\"", i, kv->arr_strs[i]);
    }
    if ((kv = kv_of(f, "t.arr_str_empty", GGUF_VT_ARRAY)))
        CHECK(kv->arr_n == 0 && kv->arr_type == GGUF_VT_STRING && kv->arr_strs == NULL);

    /* getters */
    uint32_t u;
    uint64_t u64;
    float x;
    int b;
    const struct gguf_kv *arr;
    CHECK(gguf_get_u32(f, "t.u32", 5, &u) == GERBIL_OK && u == 4000000000u);
    CHECK(gguf_get_u32(f, "t.u8", 5, &u) == GERBIL_OK && u == 200);
    CHECK(gguf_get_u32(f, "absent", 5, &u) == GERBIL_OK && u == 5);
    CHECK(gguf_get_u32(f, "t.i32", 5, &u) == GERBIL_ERR_FORMAT && strstr(gerbil_last_error(), "t.i32"));
    CHECK(gguf_get_u32(f, "t.u64", 5, &u) == GERBIL_ERR_FORMAT && strstr(gerbil_last_error(), "range"));
    CHECK(gguf_get_u32(f, "general.architecture", 5, &u) == GERBIL_ERR_FORMAT &&
          strstr(gerbil_last_error(), "string"));
    CHECK(gguf_get_u64(f, "t.u64", 0, &u64) == GERBIL_OK && u64 == 0x123456789ABCDEF0ULL);
    CHECK(gguf_get_f32(f, "t.f32", 0, &x) == GERBIL_OK && x == 1e-5f);
    CHECK(gguf_get_f32(f, "t.i32", 0, &x) == GERBIL_OK && x == -7.0f);
    CHECK(gguf_get_f32(f, "absent", 2.5f, &x) == GERBIL_OK && x == 2.5f);
    CHECK(gguf_get_f32(f, "t.arr_f32", 0, &x) == GERBIL_ERR_FORMAT && strstr(gerbil_last_error(), "array"));
    CHECK(gguf_get_bool(f, "t.bool", 0, &b) == GERBIL_OK && b == 1);
    CHECK(gguf_get_bool(f, "absent", 1, &b) == GERBIL_OK && b == 1);
    CHECK(gguf_get_bool(f, "t.u8", 0, &b) == GERBIL_ERR_FORMAT);
    CHECK(gguf_get_str(f, "general.architecture") && strcmp(gguf_get_str(f, "general.architecture"), "llama") == 0);
    CHECK(gguf_get_str(f, "t.u8") == NULL && gguf_get_str(f, "absent") == NULL);
    CHECK(gguf_get_arr(f, "t.arr_str", GGUF_VT_STRING, &arr) == GERBIL_OK && arr && arr->arr_n == 4);
    CHECK(gguf_get_arr(f, "absent", GGUF_VT_STRING, &arr) == GERBIL_OK && arr == NULL);
    CHECK(gguf_get_arr(f, "t.arr_f32", GGUF_VT_I32, &arr) == GERBIL_ERR_FORMAT && arr == NULL &&
          strstr(gerbil_last_error(), "array of f32"));
    CHECK(gguf_get_arr(f, "t.u8", GGUF_VT_I32, &arr) == GERBIL_ERR_FORMAT);

    /* tensors: our shapes are ggml's reversed */
    check_tensor(f, "a.f32", GB_TYPE_F32, 2, (int64_t[]){2, 3}, a_f32, sizeof a_f32);
    check_tensor(f, "b.f16", GB_TYPE_F16, 1, (int64_t[]){4}, b_f16, sizeof b_f16);
    check_tensor(f, "c.bf16", GB_TYPE_BF16, 2, (int64_t[]){2, 2}, c_bf16, sizeof c_bf16);
    check_tensor(f, "d.f32.4d", GB_TYPE_F32, 4, (int64_t[]){2, 1, 3, 4}, d_f32, sizeof d_f32);
    check_tensor(f, "e.q8_0", GB_TYPE_Q8_0, 2, (int64_t[]){2, 64}, e_q8, sizeof e_q8);
    check_tensor(f, "f.q4_k", GB_TYPE_Q4_K, 2, (int64_t[]){3, 256}, f_q4k, sizeof f_q4k);
    CHECK(gguf_find_tensor(f, "a") == NULL && gguf_find_tensor(f, "zzz") == NULL &&
          gguf_find_tensor(f, "") == NULL);
    const struct gb_tensor *t = gguf_find_tensor(f, "b.f16");
    if (t) {
        float v[4];
        type_to_f32(t->type, t->data, v, 4);
        CHECK(v[0] == 1.0f && v[1] == -2.0f && v[2] == 0.0f && v[3] == 0.5f);
    }
}

/* In the file itself, a.f32 ([2, 3] ours) is stored with ggml's ne = {3, 2}. */
static void check_raw_dims(const char *path) {
    size_t n;
    unsigned char *p = read_all(path, &n);
    if (!p) { CHECK(0); return; }
    const unsigned char *hit = NULL;
    for (size_t i = 0; i + 13 <= n && !hit; i++)
        if (memcmp(p + i, "\x05\0\0\0\0\0\0\0a.f32", 13) == 0) hit = p + i + 13;
    CHECK(hit != NULL);
    if (hit) {
        CHECK(hit[0] == 2 && hit[1] == 0); /* n_dims */
        CHECK(hit[4] == 3 && hit[12] == 2); /* ne[0] = 3 (innermost), ne[1] = 2 */
    }
    free(p);
}

static void test_round_trip(void) {
    char p[512];
    snprintf(p, sizeof p, "%s", tmp_path("rt.gguf"));
    gerbil_status s = write_round_trip(p);
    CHECKF(s == GERBIL_OK, "write: %s", gerbil_last_error());
    if (s != GERBIL_OK) return;
    CHECK(access(tmp_path("rt.gguf.tmp"), F_OK) != 0);
    check_raw_dims(p);
    struct gguf_file f;
    s = gguf_open(p, NULL, &f);
    CHECKF(s == GERBIL_OK, "open: %s", gerbil_last_error());
    if (s != GERBIL_OK) return;
    CHECK(!f.map.anonymous);
    check_round_trip(&f);
    gguf_close(&f);
    CHECK(f.kv == NULL && f.tensors == NULL);
    gguf_close(&f); /* twice is harmless */

    size_t n;
    unsigned char *bytes = read_all(p, &n);
    s = gguf_open_memory(bytes, n, "rt in a buffer", &f);
    CHECKF(s == GERBIL_OK, "open_memory: %s", gerbil_last_error());
    if (s == GERBIL_OK) {
        check_round_trip(&f);
        gguf_close(&f);
    }
    CHECK(bytes[0] == 'G'); /* the buffer is still the caller's */
    CHECK(gguf_open_memory(bytes, 10, "cut buffer", &f) == GERBIL_ERR_FORMAT &&
          strstr(gerbil_last_error(), "cut buffer"));
    free(bytes);

    struct st_load_opts opts = {.in_memory = 1};
    s = gguf_open(p, &opts, &f);
    CHECKF(s == GERBIL_OK, "open in memory: %s", gerbil_last_error());
    if (s != GERBIL_OK) return;
    CHECK(f.map.anonymous);
    check_round_trip(&f);
    gguf_close(&f);

    /* Writer refusals leave it usable. */
    struct gguf_writer *w;
    CHECK(gguf_writer_new(&w) == GERBIL_OK);
    CHECK(gguf_writer_add_u32(w, "k", 1) == GERBIL_OK);
    CHECK(gguf_writer_add_str(w, "k", "x") == GERBIL_ERR_INVALID_ARG && strstr(gerbil_last_error(), "duplicate"));
    CHECK(gguf_writer_add_tensor(w, "t", GB_TYPE_F32, 1, (int64_t[]){2}, a_f32, 8) == GERBIL_OK);
    CHECK(gguf_writer_add_tensor(w, "t", GB_TYPE_F32, 1, (int64_t[]){2}, a_f32, 8) == GERBIL_ERR_INVALID_ARG);
    CHECK(gguf_writer_add_tensor(w, "u", GB_TYPE_F32, 1, (int64_t[]){2}, a_f32, 12) == GERBIL_ERR_INVALID_ARG &&
          strstr(gerbil_last_error(), "bytes"));
    CHECK(gguf_writer_add_tensor(w, "u", GB_TYPE_Q8_0, 1, (int64_t[]){16}, e_q8, 17) == GERBIL_ERR_INVALID_ARG &&
          strstr(gerbil_last_error(), "block size"));
    CHECK(gguf_writer_add_tensor(w, "u", GB_TYPE_U32, 1, (int64_t[]){1}, a_f32, 4) == GERBIL_ERR_INVALID_ARG);
    CHECK(gguf_writer_add_tensor(w, "u", GB_TYPE_F32, 5, (int64_t[]){1, 1, 1, 1, 1}, a_f32, 4) == GERBIL_ERR_INVALID_ARG);
    CHECK(gguf_writer_add_scalar(w, "s", GGUF_VT_STRING, "x") == GERBIL_ERR_INVALID_ARG);
    CHECK(gguf_writer_write(w, tmp_path("no/such/dir.gguf")) == GERBIL_ERR_IO);
    snprintf(p, sizeof p, "%s", tmp_path("small.gguf"));
    CHECK(gguf_writer_write(w, p) == GERBIL_OK);
    gguf_writer_free(w);
    s = gguf_open(p, NULL, &f);
    CHECKF(s == GERBIL_OK, "small: %s", gerbil_last_error());
    if (s == GERBIL_OK) {
        CHECK(f.n_kv == 1 && f.n_tensors == 1 && gguf_find_tensor(&f, "t"));
        gguf_close(&f);
    }
    /* An empty file: no kv, no tensors. */
    CHECK(gguf_writer_new(&w) == GERBIL_OK);
    CHECK(gguf_writer_write(w, p) == GERBIL_OK);
    gguf_writer_free(w);
    s = gguf_open(p, NULL, &f);
    CHECKF(s == GERBIL_OK, "empty: %s", gerbil_last_error());
    if (s == GERBIL_OK) {
        CHECK(f.n_kv == 0 && f.n_tensors == 0 && gguf_find_kv(&f, "x") == NULL);
        gguf_close(&f);
    }
}

/* Tensor bytes produced at write time. */
static gerbil_status fill_ramp(void *user, void *dst, size_t n) {
    int *calls = user;
    (*calls)++;
    for (size_t i = 0; i < n; i++) ((unsigned char *)dst)[i] = (unsigned char)(i * 3 + (size_t)*calls);
    return GERBIL_OK;
}
static gerbil_status fill_fail(void *user, void *dst, size_t n) {
    return err_set(GERBIL_ERR_INVALID_ARG, "quantizer refused");
}

static void test_writer_fill(void) {
    char p[512];
    snprintf(p, sizeof p, "%s", tmp_path("fill.gguf"));
    int calls = 0;
    struct gguf_writer *w;
    CHECK(gguf_writer_new(&w) == GERBIL_OK);
    CHECK(gguf_writer_add_tensor_fn(w, "q", GB_TYPE_Q8_0, 2, (int64_t[]){3, 64}, 3 * 2 * 34, fill_ramp, &calls) == GERBIL_OK);
    CHECK(gguf_writer_add_tensor(w, "plain", GB_TYPE_F32, 1, (int64_t[]){6}, a_f32, sizeof a_f32) == GERBIL_OK);
    CHECK(gguf_writer_add_tensor_fn(w, "r", GB_TYPE_F16, 1, (int64_t[]){5}, 10, fill_ramp, &calls) == GERBIL_OK);
    CHECK(gguf_writer_add_tensor_fn(w, "bad", GB_TYPE_F16, 1, (int64_t[]){5}, 12, fill_ramp, &calls) == GERBIL_ERR_INVALID_ARG);
    CHECK(gguf_writer_add_tensor_fn(w, "nofill", GB_TYPE_F16, 1, (int64_t[]){5}, 10, NULL, NULL) == GERBIL_ERR_INVALID_ARG);
    CHECK(gguf_writer_write(w, p) == GERBIL_OK && calls == 2);
    struct gguf_file f;
    gerbil_status s = gguf_open(p, NULL, &f);
    CHECKF(s == GERBIL_OK, "fill: %s", gerbil_last_error());
    if (s == GERBIL_OK) {
        const struct gb_tensor *t = gguf_find_tensor(&f, "q");
        CHECK(t && t->type == GB_TYPE_Q8_0 && t->ne[0] == 3 && t->ne[1] == 64 && t->nbytes == 204);
        if (t) CHECK(((const unsigned char *)t->data)[0] == 1 && ((const unsigned char *)t->data)[203] == (unsigned char)(203 * 3 + 1));
        t = gguf_find_tensor(&f, "r");
        CHECK(t && t->nbytes == 10 && ((const unsigned char *)t->data)[9] == 29);
        t = gguf_find_tensor(&f, "plain");
        CHECK(t && memcmp(t->data, a_f32, sizeof a_f32) == 0);
        gguf_close(&f);
    }
    /* A failing fill aborts the write: the old file stays, no temp file is left. */
    CHECK(gguf_writer_add_tensor_fn(w, "zz", GB_TYPE_F32, 1, (int64_t[]){1}, 4, fill_fail, NULL) == GERBIL_OK);
    err_clear();
    CHECK(gguf_writer_write(w, p) == GERBIL_ERR_INVALID_ARG);
    CHECKF(strstr(gerbil_last_error(), "quantizer refused") && strstr(gerbil_last_error(), "\"zz\"") &&
           strstr(gerbil_last_error(), "fill.gguf"), "%s", gerbil_last_error());
    CHECK(access(tmp_path("fill.gguf.tmp"), F_OK) != 0);
    s = gguf_open(p, NULL, &f);
    CHECK(s == GERBIL_OK && f.n_tensors == 3);
    if (s == GERBIL_OK) gguf_close(&f);
    gguf_writer_free(w);
}

/* ---- malformed files ---- */

static void kv_dup(struct img *b) {
    b_str(b, "x.arr");
    b_u32(b, GGUF_VT_U8);
    b_le(b, 1, 1);
}
static void kv_str_past_end(struct img *b) {
    b_str(b, "s");
    b_u32(b, GGUF_VT_STRING);
    b_u64(b, (uint64_t)1 << 62);
}
static void kv_str_just_past(struct img *b) { /* claims all the rest + 1 */
    b_str(b, "s");
    b_u32(b, GGUF_VT_STRING);
    b_u64(b, 1000);
}
static void kv_arr_absurd(struct img *b) {
    b_str(b, "a");
    b_u32(b, GGUF_VT_ARRAY);
    b_u32(b, GGUF_VT_U32);
    b_u64(b, (uint64_t)1 << 62);
}
static void kv_str_arr_absurd(struct img *b) {
    b_str(b, "a");
    b_u32(b, GGUF_VT_ARRAY);
    b_u32(b, GGUF_VT_STRING);
    b_u64(b, (uint64_t)1 << 62);
}
static void kv_unknown_type(struct img *b) {
    b_str(b, "u");
    b_u32(b, 13);
    b_u32(b, 0);
}
static void kv_unknown_elem(struct img *b) {
    b_str(b, "u");
    b_u32(b, GGUF_VT_ARRAY);
    b_u32(b, 77);
    b_u64(b, 1);
}
static void kv_nul_key(struct img *b) {
    b_u64(b, 3);
    b_bytes(b, "a\0b", 3);
    b_u32(b, GGUF_VT_U8);
    b_le(b, 1, 1);
}
/* An array body (element type, count, elements): `levels` levels of arrays of two
 * elements above arrays of two strings. */
static void b_arr_body(struct img *b, int levels) {
    if (levels == 0) {
        b_u32(b, GGUF_VT_STRING);
        b_u64(b, 2);
        b_str(b, "x");
        b_str(b, "yz");
        return;
    }
    b_u32(b, GGUF_VT_ARRAY);
    b_u64(b, 2);
    for (int i = 0; i < 2; i++) b_arr_body(b, levels - 1);
}
static void kv_nested3(struct img *b) {
    b_str(b, "nested");
    b_u32(b, GGUF_VT_ARRAY);
    b_arr_body(b, 3);
}
static void kv_nested_bomb(struct img *b) {
    /* 1000 arrays each holding one array: depth far past the cap, a few KB. */
    b_str(b, "bomb");
    b_u32(b, GGUF_VT_ARRAY);
    for (int i = 0; i < 1000; i++) { b_u32(b, GGUF_VT_ARRAY); b_u64(b, 1); }
    b_u32(b, GGUF_VT_U8);
    b_u64(b, 0);
}

static void test_malformed(void) {
    const gerbil_status F = GERBIL_ERR_FORMAT, U = GERBIL_ERR_UNSUPPORTED;
    struct spec s = valid_spec();
    EXPECT_SPEC(s, GERBIL_OK, NULL, NULL);

    /* magic and version */
    s = valid_spec(); s.magic = (const unsigned char *)"GGML"; EXPECT_SPEC(s, F, "magic", "GGUF");
    s = valid_spec(); s.version = 1; EXPECT_SPEC(s, U, "version 1", NULL);
    s = valid_spec(); s.version = 99; EXPECT_SPEC(s, U, "version 99", NULL);
    s = valid_spec(); s.version = 0; EXPECT_SPEC(s, U, "version 0", NULL);
    s = valid_spec(); s.version = 3u << 24; EXPECT_SPEC(s, U, "big-endian", NULL);
    s = valid_spec(); s.version = 2; EXPECT_SPEC(s, GERBIL_OK, NULL, NULL);

    /* counts */
    s = valid_spec(); s.n_kv = (int64_t)1 << 40; EXPECT_SPEC(s, F, "kv count", "absurd");
    s = valid_spec(); s.n_kv = INT64_MAX; EXPECT_SPEC(s, F, "kv count", NULL);
    s = valid_spec(); s.n_tensors = (int64_t)1 << 40; EXPECT_SPEC(s, F, "tensor count", "absurd");
    s = valid_spec(); s.n_tensors = 3; EXPECT_SPEC(s, F, "end of the file", NULL);
    s = valid_spec(); s.n_kv = 4; EXPECT_SPEC(s, F, NULL, NULL); /* reads a tensor info as a kv */
    s = valid_spec(); s.n_tensors = 1; s.data_len = 32; EXPECT_SPEC(s, GERBIL_OK, NULL, NULL); /* b's info is data */

    /* metadata values */
    s = valid_spec(); s.extra = kv_dup; s.n_extra = 1; EXPECT_SPEC(s, F, "duplicate key", "x.arr");
    s = valid_spec(); s.extra = kv_str_past_end; s.n_extra = 1; EXPECT_SPEC(s, F, "end of the file", "\"s\"");
    s = valid_spec(); s.extra = kv_str_just_past; s.n_extra = 1; EXPECT_SPEC(s, F, NULL, NULL);
    s = valid_spec(); s.extra = kv_arr_absurd; s.n_extra = 1; EXPECT_SPEC(s, F, "end of the file", "4611686018427387904");
    s = valid_spec(); s.extra = kv_str_arr_absurd; s.n_extra = 1; EXPECT_SPEC(s, F, "end of the file", "strings");
    s = valid_spec(); s.extra = kv_unknown_type; s.n_extra = 1; EXPECT_SPEC(s, F, "unknown value type 13", "\"u\"");
    s = valid_spec(); s.extra = kv_unknown_elem; s.n_extra = 1; EXPECT_SPEC(s, F, "unknown array element type 77", NULL);
    s = valid_spec(); s.extra = kv_nul_key; s.n_extra = 1; EXPECT_SPEC(s, F, "NUL", NULL);
    s = valid_spec(); s.extra = kv_nested_bomb; s.n_extra = 1; EXPECT_SPEC(s, F, "nested", "\"bomb\"");
    s = valid_spec(); s.extra = kv_nested3; s.n_extra = 1; EXPECT_SPEC(s, GERBIL_OK, NULL, NULL);

    /* alignment */
    s = valid_spec(); s.alignment = 0; EXPECT_SPEC(s, F, "general.alignment", "power of two");
    s = valid_spec(); s.alignment = 48; EXPECT_SPEC(s, F, "general.alignment", "power of two");
    s = valid_spec(); s.alignment = (uint64_t)1 << 31; EXPECT_SPEC(s, F, "general.alignment", NULL);
    s = valid_spec(); s.align_type = GGUF_VT_U64; EXPECT_SPEC(s, F, "general.alignment", "u64");
    s = valid_spec(); s.align_type = GGUF_VT_I32; EXPECT_SPEC(s, F, "general.alignment", "i32");
    s = valid_spec(); s.alignment = 16; s.b_off = 32; EXPECT_SPEC(s, GERBIL_OK, NULL, NULL);
    s = valid_spec(); s.alignment = 64; s.b_off = 32; EXPECT_SPEC(s, F, "alignment 64", "\"b\"");

    /* tensor infos */
    s = valid_spec(); s.b_nd = 0; EXPECT_SPEC(s, U, "n_dims 0", "\"b\"");
    s = valid_spec(); s.b_nd = 5; s.b_ne[1] = s.b_ne[2] = s.b_ne[3] = s.b_ne[4] = 1;
    EXPECT_SPEC(s, F, "n_dims 5", "\"b\"");
    s = valid_spec(); s.b_nd = 4; s.b_ne[1] = s.b_ne[2] = s.b_ne[3] = 1; EXPECT_SPEC(s, GERBIL_OK, NULL, NULL);
    s = valid_spec(); s.b_nd = 2; s.b_ne[0] = 8; s.b_ne[1] = 0; EXPECT_SPEC(s, U, "zero", "\"b\"");
    s = valid_spec(); s.b_ne[0] = UINT64_MAX; EXPECT_SPEC(s, F, "too large", "\"b\"");
    s = valid_spec(); s.b_nd = 3; s.b_ne[0] = s.b_ne[1] = s.b_ne[2] = (uint64_t)1 << 32;
    EXPECT_SPEC(s, F, "overflow", "\"b\"");
    s = valid_spec(); s.b_nd = 2; s.b_ne[0] = (uint64_t)1 << 62; s.b_ne[1] = 2; s.b_type = 0;
    EXPECT_SPEC(s, F, "overflow", NULL); /* 2^63 elements: past int64 */
    s = valid_spec(); s.b_nd = 1; s.b_ne[0] = (uint64_t)1 << 62; s.b_type = 0;
    EXPECT_SPEC(s, F, "overflow", NULL); /* 2^62 f32: 2^64 bytes */
    s = valid_spec(); s.b_nd = 1; s.b_ne[0] = (uint64_t)1 << 40; s.b_type = 0;
    EXPECT_SPEC(s, F, "past the end", "\"b\"");
    s = valid_spec(); s.b_type = 8; s.b_ne[0] = 16; EXPECT_SPEC(s, F, "block size", "Q8_0");
    s = valid_spec(); s.b_type = 8; s.b_ne[0] = 32; EXPECT_SPEC(s, F, "past the end", NULL); /* 34 > 32 left */
    s = valid_spec(); s.b_type = 8; s.b_ne[0] = 32; s.data_len = 66; EXPECT_SPEC(s, GERBIL_OK, NULL, NULL);
    s = valid_spec(); s.b_type = 16; EXPECT_SPEC(s, U, "IQ2_XXS", "\"b\"");
    s = valid_spec(); s.b_type = 9; EXPECT_SPEC(s, U, "Q8_1", "\"b\"");
    s = valid_spec(); s.b_type = 4; EXPECT_SPEC(s, U, "unknown", "id 4");
    s = valid_spec(); s.b_type = 12345; EXPECT_SPEC(s, U, "unknown", "id 12345");
    s = valid_spec(); s.b_off = 8; EXPECT_SPEC(s, F, "not a multiple of the alignment", "\"b\"");
    s = valid_spec(); s.b_off = 64; EXPECT_SPEC(s, F, "past the end", "\"b\"");
    s = valid_spec(); s.b_off = UINT64_MAX - 31; EXPECT_SPEC(s, F, "past the end", NULL);
    s = valid_spec(); s.data_len = 47; EXPECT_SPEC(s, F, "past the end", "truncated");
    s = valid_spec(); s.data_len = 48; EXPECT_SPEC(s, GERBIL_OK, NULL, NULL);
    s = valid_spec(); s.b_off = 0; EXPECT_SPEC(s, F, "overlap", "\"a\"");
    s = valid_spec(); s.b_ne[0] = 4; s.b_off = 0; s.b_type = 0; EXPECT_SPEC(s, F, "overlap", NULL);
    s = valid_spec(); s.b_name = "a"; EXPECT_SPEC(s, F, "duplicate tensor", "\"a\"");
    s = valid_spec(); s.b_name = ""; EXPECT_SPEC(s, GERBIL_OK, NULL, NULL);

    /* Truncation: every prefix of the file short of the end of b's data fails cleanly. */
    s = valid_spec();
    struct img b = {0};
    build_spec(&s, &b);
    size_t data_start = (header_end + 31) / 32 * 32, end = data_start + 48;
    const char *p = tmp_path("cut.gguf");
    int bad = 0;
    for (size_t n = 0; n < end; n++) {
        write_bytes(p, b.p, n);
        struct gguf_file f;
        err_clear();
        gerbil_status st = gguf_open(p, NULL, &f);
        if (st != F || gerbil_last_error()[0] == '\0') {
            bad++;
            fprintf(stderr, "prefix %zu: %s %s\n", n, gerbil_status_name(st), gerbil_last_error());
        }
        if (st == GERBIL_OK) gguf_close(&f);
        if (n == 0 && !strstr(gerbil_last_error(), "magic")) bad++;
        if (n > 30 && n < header_end && !strstr(gerbil_last_error(), "end of the file")) {
            bad++;
            fprintf(stderr, "prefix %zu: %s\n", n, gerbil_last_error());
        }
    }
    CHECKF(bad == 0, "%d truncated files misread", bad);
    write_bytes(p, b.p, end);
    EXPECT_OPEN(p, GERBIL_OK, NULL, NULL);
    free(b.p);

    EXPECT_OPEN(tmp_path("missing.gguf"), GERBIL_ERR_IO, "missing.gguf", NULL);
    EXPECT_OPEN(tmpdir, GERBIL_ERR_IO, NULL, NULL);
}

/* ---- real files ---- */

static int file_exists(const char *p) { return access(p, R_OK) == 0; }

static void test_stories(void) {
    const char *p = "../shared/data/models/stories260K/gguf/stories260K-f32.gguf";
    if (!file_exists(p)) { fprintf(stderr, "note: %s absent, skipped\n", p); return; }
    struct gguf_file f;
    gerbil_status s = gguf_open(p, NULL, &f);
    CHECKF(s == GERBIL_OK, "%s", gerbil_last_error());
    if (s != GERBIL_OK) return;
    CHECK(f.version == 3 && f.n_tensors == 47 && f.n_kv == 23 && f.alignment == 32);
    CHECK(gguf_get_str(&f, "general.architecture") && !strcmp(gguf_get_str(&f, "general.architecture"), "llama"));
    CHECK(gguf_get_str(&f, "tokenizer.ggml.model") && !strcmp(gguf_get_str(&f, "tokenizer.ggml.model"), "llama"));
    uint32_t u;
    float x;
    int b;
    CHECK(gguf_get_u32(&f, "llama.embedding_length", 0, &u) == GERBIL_OK && u == 64);
    CHECK(gguf_get_u32(&f, "llama.block_count", 0, &u) == GERBIL_OK && u == 5);
    CHECK(gguf_get_u32(&f, "llama.attention.head_count_kv", 0, &u) == GERBIL_OK && u == 4);
    CHECK(gguf_get_f32(&f, "llama.attention.layer_norm_rms_epsilon", 0, &x) == GERBIL_OK && x == 1e-5f);
    CHECK(gguf_get_bool(&f, "tokenizer.ggml.add_bos_token", 0, &b) == GERBIL_OK && b == 1);
    const struct gguf_kv *tok, *scores, *types;
    CHECK(gguf_get_arr(&f, "tokenizer.ggml.tokens", GGUF_VT_STRING, &tok) == GERBIL_OK && tok && tok->arr_n == 512);
    CHECK(gguf_get_arr(&f, "tokenizer.ggml.scores", GGUF_VT_F32, &scores) == GERBIL_OK && scores && scores->arr_n == 512);
    CHECK(gguf_get_arr(&f, "tokenizer.ggml.token_type", GGUF_VT_I32, &types) == GERBIL_OK && types && types->arr_n == 512);
    if (tok && tok->arr_n == 512) CHECK(!strcmp(tok->arr_strs[1], "<s>") && !strcmp(tok->arr_strs[2], "</s>"));
    if (types && types->arr_n == 512) CHECK(gguf_arr_int(types, 0) == 2 && gguf_arr_int(types, 1) == 3);
    const struct gb_tensor *t = gguf_find_tensor(&f, "token_embd.weight");
    CHECK(t && t->type == GB_TYPE_F32 && t->n_dims == 2 && t->ne[0] == 512 && t->ne[1] == 64);
    t = gguf_find_tensor(&f, "blk.0.attn_k.weight");
    CHECK(t && t->n_dims == 2 && t->ne[0] == 32 && t->ne[1] == 64 && t->nbytes == 32 * 64 * 4);
    t = gguf_find_tensor(&f, "blk.4.ffn_down.weight");
    CHECK(t && t->ne[0] == 64 && t->ne[1] == 172);
    t = gguf_find_tensor(&f, "output_norm.weight");
    CHECK(t && t->n_dims == 1 && t->ne[0] == 64);
    CHECK(gguf_find_tensor(&f, "output.weight") == NULL);
    gguf_close(&f);
}

static void test_vocab(const char *name, uint64_t n_vocab, const char *model, uint64_t n_merges) {
    char p[256];
    snprintf(p, sizeof p, "../shared/data/tokenizers/llamacpp_vocab_tests/%s", name);
    if (!file_exists(p)) { fprintf(stderr, "note: %s absent, skipped\n", p); return; }
    struct gguf_file f;
    gerbil_status s = gguf_open(p, NULL, &f);
    CHECKF(s == GERBIL_OK, "%s", gerbil_last_error());
    if (s != GERBIL_OK) return;
    CHECK(f.version == 3 && f.n_tensors == 0);
    const char *m = gguf_get_str(&f, "tokenizer.ggml.model");
    CHECKF(m && !strcmp(m, model), "%s: model %s", name, m ? m : "(none)");
    const struct gguf_kv *kv;
    CHECK(gguf_get_arr(&f, "tokenizer.ggml.tokens", GGUF_VT_STRING, &kv) == GERBIL_OK && kv);
    CHECKF(kv && kv->arr_n == n_vocab, "%s: %llu tokens", name, kv ? (unsigned long long)kv->arr_n : 0ULL);
    if (n_merges) {
        CHECK(gguf_get_arr(&f, "tokenizer.ggml.merges", GGUF_VT_STRING, &kv) == GERBIL_OK && kv);
        CHECKF(kv && kv->arr_n == n_merges, "%s: merges", name);
        if (kv && kv->arr_n) CHECK(strchr(kv->arr_strs[0], ' ') != NULL);
    }
    gguf_close(&f);
}

/* ---- random corruption ---- */

/* On garbage the reader must return: OK with every view inside the mapping, or an
 * error with a message. Run under ASan/UBSan in CI. */
static void test_fuzz(void) {
    /* Two sources: the writer's file (every value type, quantized tensors) and a raw
     * image with nested arrays; iterations alternate. */
    const char *vp = tmp_path("fuzz_src.gguf");
    if (write_round_trip(vp) != GERBIL_OK) { CHECK(0); return; }
    size_t lens[2];
    unsigned char *imgs[2];
    imgs[0] = read_all(vp, &lens[0]);
    struct spec sp = valid_spec();
    sp.extra = kv_nested3;
    sp.n_extra = 1;
    struct img nb = {0};
    build_spec(&sp, &nb);
    imgs[1] = nb.p;
    lens[1] = nb.n;
    unsigned char *buf = malloc(lens[0] > lens[1] ? lens[0] : lens[1]);
    const char *p = tmp_path("fuzz.gguf");
    unsigned long long seed = 0x66756E6775ULL;
    int n_ok = 0, n_err = 0, bad = 0;
    for (int it = 0; it < 2000; it++) {
        size_t len = lens[it & 1];
        memcpy(buf, imgs[it & 1], len);
        size_t n = len;
        unsigned r = (unsigned)(test_rand_u64(&seed) % 5);
        int k = 1 + (int)(test_rand_u64(&seed) % 4);
        for (int j = 0; j < k; j++) {
            /* Most of the interest is in the header: aim there 3 times in 4. */
            size_t span = test_rand_u64(&seed) % 4 ? 900 : n;
            size_t pos = (size_t)(test_rand_u64(&seed) % (span < n ? span : n));
            if (r == 0) buf[pos] = (unsigned char)test_rand_u64(&seed);
            else if (r == 1) buf[pos] ^= (unsigned char)(1u << (test_rand_u64(&seed) % 8));
            else if (r == 2) { n = pos; break; }
            else if (r == 3) buf[pos] = (unsigned char)(test_rand_u64(&seed) % 3 ? 0xFF : 0);
            else { /* a small integer where a count or length may be */
                buf[pos] = (unsigned char)(test_rand_u64(&seed) % 16);
            }
        }
        /* Every 8th case goes through a file; the others through an exact-size heap
         * copy, where ASan sees any read past the end (in a mapping it would land in
         * the zero-filled rest of the page). */
        struct gguf_file f;
        unsigned char *exact = NULL;
        err_clear();
        gerbil_status s;
        if (it % 8 < 2) {
            write_bytes(p, buf, n);
            s = gguf_open(p, NULL, &f);
        } else {
            exact = malloc(n ? n : 1);
            memcpy(exact, buf, n);
            s = gguf_open_memory(exact, n, "fuzz", &f);
        }
        if (s == GERBIL_OK) {
            n_ok++;
            const unsigned char *lo = f.map.data, *hi = lo + f.map.size;
            for (int i = 0; i < f.n_tensors; i++) {
                const unsigned char *d = f.tensors[i].data;
                if (d < lo || f.tensors[i].nbytes > (size_t)(hi - d) || f.tensors[i].nbytes == 0) bad++;
            }
            volatile double sink = 0;
            for (int64_t i = 0; i < f.n_kv; i++) {
                const struct gguf_kv *kv = &f.kv[i];
                if (gguf_find_kv(&f, kv->key) != kv) bad++;
                if (kv->type == GGUF_VT_STRING && (!kv->str || strlen(kv->str) > kv->str_len)) bad++;
                if (kv->type != GGUF_VT_ARRAY) continue;
                if (kv->arr_type == GGUF_VT_STRING) {
                    for (uint64_t e = 0; e < kv->arr_n; e++) sink += (double)strlen(kv->arr_strs[e]);
                } else if (kv->arr_type != GGUF_VT_ARRAY && kv->arr_type != GGUF_VT_BOOL) {
                    for (uint64_t e = 0; e < kv->arr_n; e++) sink += gguf_arr_float(kv, e);
                }
            }
            (void)sink;
            gguf_close(&f);
        } else {
            n_err++;
            if (gerbil_last_error()[0] == '\0') bad++;
        }
        free(exact);
    }
    CHECKF(bad == 0, "%d fuzz cases broke the contract", bad);
    CHECK(n_ok > 0 && n_err > 0);
    printf("fuzz: %d opened, %d rejected\n", n_ok, n_err);
    free(buf);
    free(imgs[0]);
    free(imgs[1]);
}

/* ---- scripts/gguf_py.py ---- */

static void test_python(void) {
    if (system("python3 -c 'import sys; sys.exit(0)' >/dev/null 2>&1") != 0 || !file_exists("scripts/gguf_py.py")) {
        fprintf(stderr, "note: python3 or scripts/gguf_py.py absent; gguf_py checks skipped\n");
        return;
    }
    /* Python writes, C reads. */
    char cmd[2048], q[512], dumpp[512];
    const char *p = tmp_path("py.gguf");
    snprintf(cmd, sizeof cmd, "python3 scripts/gguf_py.py selftest-write %s", p);
    CHECK(system(cmd) == 0);
    struct gguf_file f;
    gerbil_status s = gguf_open(p, NULL, &f);
    CHECKF(s == GERBIL_OK, "py file: %s", gerbil_last_error());
    if (s == GERBIL_OK) {
        const char *arch = gguf_get_str(&f, "general.architecture");
        CHECK(arch && !strcmp(arch, "llama"));
        uint32_t u;
        float x;
        CHECK(gguf_get_u32(&f, "llama.block_count", 0, &u) == GERBIL_OK && u == 2);
        CHECK(gguf_get_f32(&f, "llama.rope.freq_base", 0, &x) == GERBIL_OK && x == 10000.0f);
        const struct gguf_kv *kv;
        CHECK(gguf_get_arr(&f, "tokenizer.ggml.tokens", GGUF_VT_STRING, &kv) == GERBIL_OK && kv &&
              kv->arr_n == 3 && !strcmp(kv->arr_strs[2], "w\xc3\xb6rld"));
        CHECK(gguf_get_arr(&f, "x.i64s", GGUF_VT_I64, &kv) == GERBIL_OK && kv && kv->arr_n == 2 &&
              gguf_arr_int(kv, 0) == -5);
        const struct gb_tensor *t = gguf_find_tensor(&f, "w.f32");
        CHECK(t && t->type == GB_TYPE_F32 && t->n_dims == 2 && t->ne[0] == 2 && t->ne[1] == 3);
        if (t) CHECK(((const float *)t->data)[5] == 5.0f);
        t = gguf_find_tensor(&f, "w.q8_0");
        CHECK(t && t->type == GB_TYPE_Q8_0 && t->ne[0] == 2 && t->ne[1] == 32 && t->nbytes == 68);
        if (t) CHECK(((const unsigned char *)t->data)[67] == 67);
        t = gguf_find_tensor(&f, "w.f16");
        CHECK(t && t->type == GB_TYPE_F16 && t->n_dims == 1 && t->ne[0] == 3);
        gguf_close(&f);
    }
    /* C writes, Python reads. */
    snprintf(q, sizeof q, "%s", tmp_path("rt.gguf"));
    snprintf(dumpp, sizeof dumpp, "%s", tmp_path("dump.txt"));
    snprintf(cmd, sizeof cmd, "python3 scripts/gguf_py.py dump %s > %s 2>&1", q, dumpp);
    CHECK(system(cmd) == 0);
    size_t n;
    char *dump = (char *)read_all(dumpp, &n);
    if (dump) {
        dump[n] = '\0';
        CHECKF(strstr(dump, "e.q8_0 Q8_0 [2, 64]") && strstr(dump, "t.u64 u64 1311768467463790320") &&
               strstr(dump, "d.f32.4d F32 [2, 1, 3, 4]"), "python dump:\n%s", dump);
        free(dump);
    }
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    return remove(path);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/gerbil_gguf_XXXXXX");
    if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 1; }

    test_round_trip();
    test_writer_fill();
    test_malformed();
    test_stories();
    test_vocab("ggml-vocab-llama-spm.gguf", 32000, "llama", 0);
    test_vocab("ggml-vocab-phi-3.gguf", 32064, "llama", 0);
    test_vocab("ggml-vocab-gpt-2.gguf", 50257, "gpt2", 50000);
    test_python();
    test_fuzz();

    nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return test_done();
}
