/* safetensors reader: a valid file reads back exactly; every malformed header the
 * reader promises to reject is rejected with the right status and a message naming
 * the culprit; sharded checkpoints; random corruption never crashes. Files are
 * written from C into a fresh temp dir, so the test needs no fixtures. */
#include "test.h"

#include "base/status.h"
#include "io/json.h"
#include "io/safetensors.h"

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

static void put_u64le(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* A safetensors image in memory: length prefix, header, data. Caller frees. */
static unsigned char *build_st(const char *header, const void *data, size_t dlen, size_t *out_len) {
    size_t hlen = strlen(header);
    unsigned char *b = malloc(8 + hlen + dlen + 1);
    put_u64le(b, hlen);
    memcpy(b + 8, header, hlen);
    if (dlen) memcpy(b + 8 + hlen, data, dlen);
    *out_len = 8 + hlen + dlen;
    return b;
}

static void write_st(const char *path, const char *header, const void *data, size_t dlen) {
    size_t n;
    unsigned char *b = build_st(header, data, dlen, &n);
    write_bytes(path, b, n);
    free(b);
}

/* Open path and require status want; when want is an error, require the message to
 * contain each of the (up to two) key words. */
static void expect_open(const char *path, gerbil_status want, const char *key1, const char *key2,
                        int line) {
    struct st_file f;
    err_clear();
    gerbil_status s = st_file_open(path, &f);
    const char *msg = gerbil_last_error();
    CHECKF(s == want, "line %d: %s: got %s, want %s (%s)", line, path, gerbil_status_name(s),
           gerbil_status_name(want), msg);
    if (s == GERBIL_OK) st_file_close(&f);
    if (want != GERBIL_OK) {
        CHECKF(!key1 || strstr(msg, key1), "line %d: message lacks \"%s\": %s", line, key1, msg);
        CHECKF(!key2 || strstr(msg, key2), "line %d: message lacks \"%s\": %s", line, key2, msg);
    }
}

/* Write a file with this header over 64 zero bytes of data and expect_open it. */
static void expect_header(const char *header, gerbil_status want, const char *key1,
                          const char *key2, int line) {
    static const unsigned char zeros[64];
    const char *p = tmp_path("case.safetensors");
    write_st(p, header, zeros, sizeof zeros);
    expect_open(p, want, key1, key2, line);
}
#define EXPECT_HEADER(h, st, k1, k2) expect_header(h, st, k1, k2, __LINE__)
#define EXPECT_OPEN(p, st, k1, k2) expect_open(p, st, k1, k2, __LINE__)

/* ---- the valid file ---- */

struct builder {
    char header[4096];
    size_t hlen;
    unsigned char data[1024];
    size_t dlen;
};

/* Append one tensor at the end of the data section (or at a given offset when
 * at != SIZE_MAX, for a zero-byte tensor placed inside another). */
static void add_tensor(struct builder *b, const char *name, const char *dtype, const char *shape,
                       const void *bytes, size_t n, size_t at) {
    size_t begin = at == SIZE_MAX ? b->dlen : at;
    if (at == SIZE_MAX) {
        memcpy(b->data + b->dlen, bytes, n);
        b->dlen += n;
    }
    b->hlen += (size_t)snprintf(b->header + b->hlen, sizeof b->header - b->hlen,
                                "%s\"%s\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[%zu,%zu]}",
                                b->hlen > 1 ? "," : "", name, dtype, shape, begin, begin + n);
}

static const float a_f32[6] = {0.0f, 1.5f, -3.25f, 1e-8f, 65504.0f, -0.0f};
static const uint16_t b_f16[4] = {0x3C00, 0xC000, 0x0000, 0x3800}; /* 1, -2, 0, 0.5 */
static const uint16_t c_bf16[4] = {0x3F80, 0xC040, 0x4120, 0xBF00}; /* 1, -3, 10, -0.5 */
static const int32_t d_i32[3] = {-7, 0, 2147483647};
static const uint8_t e_u8[5] = {0, 1, 127, 128, 255};
static const int64_t f_i64[1] = {-1234567890123LL};
static const int8_t g_i8[1] = {-128};
static const uint32_t i_u32[2] = {0xDEADBEEFu, 42};

/* Tensors listed out of name order, metadata in the middle, a zero-element tensor
 * placed inside another's bytes (allowed: it occupies none), and spaces padding the
 * header to 8 bytes as writers do. */
static unsigned char *build_valid(size_t *out_len) {
    static struct builder b;
    memset(&b, 0, sizeof b);
    b.hlen = (size_t)snprintf(b.header, sizeof b.header, "{");
    add_tensor(&b, "model.i.u32", "U32", "[1,1,1,2]", i_u32, sizeof i_u32, SIZE_MAX);
    add_tensor(&b, "model.a.f32", "F32", "[2, 3]", a_f32, sizeof a_f32, SIZE_MAX);
    add_tensor(&b, "model.b.f16", "F16", "[4]", b_f16, sizeof b_f16, SIZE_MAX);
    b.hlen += (size_t)snprintf(b.header + b.hlen, sizeof b.header - b.hlen,
                               ",\"__metadata__\":{\"format\":\"pt\"}");
    add_tensor(&b, "model.c.bf16", "BF16", "[2,2]", c_bf16, sizeof c_bf16, SIZE_MAX);
    add_tensor(&b, "model.d.i32", "I32", "[3]", d_i32, sizeof d_i32, SIZE_MAX);
    add_tensor(&b, "model.e.u8", "U8", "[5]", e_u8, sizeof e_u8, SIZE_MAX);
    add_tensor(&b, "model.f.i64", "I64", "[1]", f_i64, sizeof f_i64, SIZE_MAX);
    add_tensor(&b, "model.g.i8", "I8", "[]", g_i8, sizeof g_i8, SIZE_MAX);
    add_tensor(&b, "model.h.empty", "F32", "[0, 7]", NULL, 0, 12);
    b.hlen += (size_t)snprintf(b.header + b.hlen, sizeof b.header - b.hlen, "}");
    while (b.hlen % 8) b.header[b.hlen++] = ' ';
    b.header[b.hlen] = '\0';
    return build_st(b.header, b.data, b.dlen, out_len);
}

static void check_tensor(const struct st_file *f, const char *name, enum gb_type type, int nd,
                         const int64_t *ne, const void *bytes, size_t n) {
    const struct gb_tensor *t = st_file_find(f, name);
    CHECKF(t != NULL, "tensor %s not found", name);
    if (!t) return;
    CHECKF(t->type == type, "%s: type %s", name, type_name(t->type));
    CHECKF(t->n_dims == nd, "%s: n_dims %d want %d", name, t->n_dims, nd);
    for (int i = 0; i < nd && i < t->n_dims; i++)
        CHECKF(t->ne[i] == ne[i], "%s: ne[%d] = %lld want %lld", name, i, (long long)t->ne[i],
               (long long)ne[i]);
    CHECKF(t->nbytes == n, "%s: nbytes %zu want %zu", name, t->nbytes, n);
    CHECKF(n == 0 || memcmp(t->data, bytes, n) == 0, "%s: data differs", name);
    CHECK(strcmp(t->name, name) == 0);
}

static void test_valid(void) {
    size_t len;
    unsigned char *img = build_valid(&len);
    const char *p = tmp_path("valid.safetensors");
    write_bytes(p, img, len);
    free(img);

    struct st_file f;
    gerbil_status s = st_file_open(p, &f);
    CHECKF(s == GERBIL_OK, "valid file: %s", gerbil_last_error());
    if (s != GERBIL_OK) return;
    CHECK(f.n_tensors == 9);
    for (int i = 1; i < f.n_tensors; i++)
        CHECKF(strcmp(f.tensors[i - 1].name, f.tensors[i].name) < 0, "not sorted at %d", i);

    check_tensor(&f, "model.a.f32", GB_TYPE_F32, 2, (int64_t[]){2, 3}, a_f32, sizeof a_f32);
    check_tensor(&f, "model.b.f16", GB_TYPE_F16, 1, (int64_t[]){4}, b_f16, sizeof b_f16);
    check_tensor(&f, "model.c.bf16", GB_TYPE_BF16, 2, (int64_t[]){2, 2}, c_bf16, sizeof c_bf16);
    check_tensor(&f, "model.d.i32", GB_TYPE_I32, 1, (int64_t[]){3}, d_i32, sizeof d_i32);
    check_tensor(&f, "model.e.u8", GB_TYPE_U8, 1, (int64_t[]){5}, e_u8, sizeof e_u8);
    check_tensor(&f, "model.f.i64", GB_TYPE_I64, 1, (int64_t[]){1}, f_i64, sizeof f_i64);
    check_tensor(&f, "model.g.i8", GB_TYPE_I8, 0, NULL, g_i8, sizeof g_i8);
    check_tensor(&f, "model.h.empty", GB_TYPE_F32, 2, (int64_t[]){0, 7}, NULL, 0);
    check_tensor(&f, "model.i.u32", GB_TYPE_U32, 4, (int64_t[]){1, 1, 1, 2}, i_u32, sizeof i_u32);

    const struct gb_tensor *t = st_file_find(&f, "model.g.i8");
    CHECK(t && tensor_nelements(t) == 1);
    t = st_file_find(&f, "model.h.empty");
    CHECK(t && tensor_nelements(t) == 0);

    /* Float views convert to the values they encode. */
    float v[4];
    t = st_file_find(&f, "model.b.f16");
    if (t) {
        type_to_f32(t->type, t->data, v, 4);
        CHECK(v[0] == 1.0f && v[1] == -2.0f && v[2] == 0.0f && v[3] == 0.5f);
    }
    t = st_file_find(&f, "model.c.bf16");
    if (t) {
        type_to_f32(t->type, t->data, v, 4);
        CHECK(v[0] == 1.0f && v[1] == -3.0f && v[2] == 10.0f && v[3] == -0.5f);
    }

    CHECK(st_file_find(&f, "model.zzz") == NULL);
    CHECK(st_file_find(&f, "") == NULL);
    CHECK(st_file_find(&f, "__metadata__") == NULL);
    CHECK(st_file_find(&f, "model.a") == NULL);
    st_file_close(&f);
    CHECK(f.tensors == NULL && f.n_tensors == 0);
    st_file_close(&f); /* closing twice is harmless */

    /* An empty header object is a valid file with no tensors. */
    EXPECT_HEADER("{}", GERBIL_OK, NULL, NULL);
    EXPECT_HEADER("{\"__metadata__\":{\"a\":\"b\"}}   ", GERBIL_OK, NULL, NULL);
}

/* ---- malformed files ---- */

static void test_truncated(void) {
    size_t len;
    unsigned char *img = build_valid(&len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | img[i];
    const char *p = tmp_path("cut.safetensors");

    write_bytes(p, img, 0);
    EXPECT_OPEN(p, GERBIL_ERR_FORMAT, "too short", p);
    write_bytes(p, img, 5);
    EXPECT_OPEN(p, GERBIL_ERR_FORMAT, "too short", NULL);
    write_bytes(p, img, 8 + hlen / 2); /* cut in the header */
    EXPECT_OPEN(p, GERBIL_ERR_FORMAT, "header length", p);
    write_bytes(p, img, len - 1); /* cut in the data: the last tensor (model.g.i8) spills */
    EXPECT_OPEN(p, GERBIL_ERR_FORMAT, "past the end", "model.g.i8");
    write_bytes(p, img, 8 + hlen); /* header only, no data at all */
    EXPECT_OPEN(p, GERBIL_ERR_FORMAT, "past the end", NULL);

    /* Header length field lies. */
    unsigned char raw[64] = {0};
    put_u64le(raw, 1000);
    memcpy(raw + 8, "{}", 2);
    write_bytes(p, raw, sizeof raw);
    EXPECT_OPEN(p, GERBIL_ERR_FORMAT, "header length", "1000");
    put_u64le(raw, (uint64_t)1 << 63);
    write_bytes(p, raw, sizeof raw);
    EXPECT_OPEN(p, GERBIL_ERR_FORMAT, "header length", "9223372036854775808");
    put_u64le(raw, UINT64_MAX);
    write_bytes(p, raw, sizeof raw);
    EXPECT_OPEN(p, GERBIL_ERR_FORMAT, "header length", NULL);
    put_u64le(raw, 0);
    write_bytes(p, raw, sizeof raw);
    EXPECT_OPEN(p, GERBIL_ERR_FORMAT, "empty", NULL);
    free(img);

    /* Not files at all. */
    EXPECT_OPEN(tmp_path("missing.safetensors"), GERBIL_ERR_IO, "missing.safetensors",
                "No such file");
    EXPECT_OPEN(tmpdir, GERBIL_ERR_IO, tmpdir, "directory");
}

static void test_bad_headers(void) {
    const gerbil_status F = GERBIL_ERR_FORMAT, U = GERBIL_ERR_UNSUPPORTED;
    /* The JSON itself */
    EXPECT_HEADER("{\"x\": {\"dtype\": \"F32\", ", F, "malformed JSON", "header");
    EXPECT_HEADER("this is not json", F, "malformed JSON", NULL);
    EXPECT_HEADER("[1, 2, 3]", F, "not a JSON object", NULL);
    EXPECT_HEADER("\"str\"", F, "not a JSON object", NULL);
    EXPECT_HEADER("{} {}", F, "malformed JSON", NULL);
    EXPECT_HEADER("{\"x\": 5}", F, "\"x\"", "not a JSON object");
    EXPECT_HEADER("{\"x\": [\"F32\"]}", F, "\"x\"", "not a JSON object");

    /* dtype */
    EXPECT_HEADER("{\"x\":{\"dtype\":5,\"shape\":[1],\"data_offsets\":[0,4]}}", F, "\"x\"", "dtype");
    EXPECT_HEADER("{\"x\":{\"shape\":[1],\"data_offsets\":[0,4]}}", F, "\"x\"", "dtype");
    EXPECT_HEADER("{\"x\":{\"dtype\":\"F8_E4M3\",\"shape\":[1],\"data_offsets\":[0,1]}}", U,
                  "\"x\"", "\"F8_E4M3\"");
    EXPECT_HEADER("{\"x\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", U,
                  "\"x\"", "\"F64\"");
    EXPECT_HEADER("{\"wq\":{\"dtype\":\"Q9_Z\",\"shape\":[1],\"data_offsets\":[0,8]}}", U,
                  "unknown dtype", "\"Q9_Z\"");
    EXPECT_HEADER("{\"x\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", U,
                  "\"x\"", "\"f32\"");

    /* shape */
    EXPECT_HEADER("{\"x\":{\"dtype\":\"F32\",\"shape\":[-2,3],\"data_offsets\":[0,24]}}", F,
                  "\"x\"", "shape[0]");
    EXPECT_HEADER("{\"x\":{\"dtype\":\"F32\",\"shape\":[2,1.5],\"data_offsets\":[0,12]}}", F,
                  "\"x\"", "shape[1]");
    EXPECT_HEADER("{\"x\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", F,
                  "\"x\"", "shape[0]");
    EXPECT_HEADER("{\"x\":{\"dtype\":\"F32\",\"shape\":[1e300],\"data_offsets\":[0,8]}}", F,
                  "\"x\"", "shape[0]");
    EXPECT_HEADER("{\"x\":{\"dtype\":\"F32\",\"shape\":[null],\"data_offsets\":[0,8]}}", F,
                  "\"x\"", "shape[0]");
    EXPECT_HEADER("{\"x\":{\"dtype\":\"F32\",\"shape\":4,\"data_offsets\":[0,16]}}", F,
                  "\"x\"", "shape");
    EXPECT_HEADER("{\"x\":{\"dtype\":\"F32\",\"data_offsets\":[0,16]}}", F, "\"x\"", "shape");
    EXPECT_HEADER("{\"x\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,2],\"data_offsets\":[0,2]}}", U,
                  "\"x\"", "9 dimensions");
    /* Each dimension fits; their product does not fit in size_t. */
    EXPECT_HEADER("{\"x\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
                  "\"data_offsets\":[0,0]}}", F, "\"x\"", "overflow");
    EXPECT_HEADER("{\"x\":{\"dtype\":\"BF16\",\"shape\":[9007199254740991,4096,3,3],"
                  "\"data_offsets\":[0,64]}}", F, "\"x\"", "overflow");
    /* ...but 2^62 elements times 8 bytes overflows only in the multiply by the size. */
    EXPECT_HEADER("{\"x\":{\"dtype\":\"I64\",\"shape\":[2147483648,2147483648],"
                  "\"data_offsets\":[0,0]}}", F, "\"x\"", "overflow");
    /* A zero dimension makes the rest irrelevant: empty, not overflowing. */
    EXPECT_HEADER("{\"x\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,0],"
                  "\"data_offsets\":[0,0]}}", GERBIL_OK, NULL, NULL);

    /* data_offsets */
    EXPECT_HEADER("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", F,
                  "\"x\"", "reversed");
    EXPECT_HEADER("{\"x\":{\"dtype\":\"F32\",\"shape\":[17],\"data_offsets\":[0,68]}}", F,
                  "\"x\"", "past the end");
    EXPECT_HEADER("{\"x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[64,65]}}", F,
                  "\"x\"", "past the end");
    EXPECT_HEADER("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", F,
                  "\"x\"", "data_offsets");
    EXPECT_HEADER("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", F,
                  "\"x\"", "data_offsets");
    EXPECT_HEADER("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", F,
                  "\"x\"", "data_offsets[0]");
    EXPECT_HEADER("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4.5]}}", F,
                  "\"x\"", "data_offsets[1]");
    EXPECT_HEADER("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":\"0-4\"}}", F,
                  "\"x\"", "data_offsets");
    EXPECT_HEADER("{\"x\":{\"dtype\":\"F32\",\"shape\":[1]}}", F, "\"x\"", "data_offsets");
    EXPECT_HEADER("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],"
                  "\"data_offsets\":[0,18446744073709551616]}}", F, "\"x\"", "data_offsets[1]");

    /* size */
    EXPECT_HEADER("{\"x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", F,
                  "\"x\"", "size mismatch");
    EXPECT_HEADER("{\"x\":{\"dtype\":\"F16\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", F,
                  "\"x\"", "size mismatch");
    EXPECT_HEADER("{\"x\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,4]}}", F,
                  "\"x\"", "size mismatch");

    /* overlap, in either header order, and full containment */
    EXPECT_HEADER("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                  "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}", F,
                  "\"a\"", "\"b\"");
    EXPECT_HEADER("{\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]},"
                  "\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", F,
                  "overlap", NULL);
    EXPECT_HEADER("{\"big\":{\"dtype\":\"U8\",\"shape\":[40],\"data_offsets\":[0,40]},"
                  "\"mid\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]},"
                  "\"late\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[30,34]}}", F,
                  "overlap", "\"big\"");
    EXPECT_HEADER("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                  "\"b\":{\"dtype\":\"U8\",\"shape\":[16],\"data_offsets\":[0,16]}}", F,
                  "overlap", NULL);
    /* adjacent and gapped tensors are fine */
    EXPECT_HEADER("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                  "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,32]},"
                  "\"c\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[40,48]}}",
                  GERBIL_OK, NULL, NULL);

    /* the same name twice (cJSON keeps both) */
    EXPECT_HEADER("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                  "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", F,
                  "\"a\"", "twice");
}

/* ---- checkpoints ---- */

static const char *shard_hdr1 =
    "{\"w.a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
    "\"w.b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[8,12]}}";
static const char *shard_hdr2 =
    "{\"w.c\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
static const unsigned char shard_data[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};

/* A fresh subdirectory of tmpdir holding the two shards and the given index (none
 * when NULL). Returns its path in static storage. */
static const char *make_ckpt(const char *sub, const char *index, const char *hdr2) {
    static char dir[256];
    char p[512];
    snprintf(dir, sizeof dir, "%s/%s", tmpdir, sub);
    if (mkdir(dir, 0700) != 0) { perror(dir); exit(1); }
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir);
    write_st(p, shard_hdr1, shard_data, 12);
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    write_st(p, hdr2 ? hdr2 : shard_hdr2, shard_data, 4);
    if (index) {
        snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
        write_bytes(p, index, strlen(index));
    }
    return dir;
}

static const char *good_index =
    "{\"metadata\":{\"total_size\":16},\"weight_map\":{"
    "\"w.a\":\"model-00001-of-00002.safetensors\","
    "\"w.c\":\"model-00002-of-00002.safetensors\","
    "\"w.b\":\"model-00001-of-00002.safetensors\"}}";

static void expect_ckpt(const char *dir, gerbil_status want, const char *key1, const char *key2,
                        int line) {
    struct st_checkpoint ck;
    err_clear();
    gerbil_status s = st_checkpoint_open(dir, &ck);
    const char *msg = gerbil_last_error();
    CHECKF(s == want, "line %d: %s: got %s, want %s (%s)", line, dir, gerbil_status_name(s),
           gerbil_status_name(want), msg);
    if (s == GERBIL_OK) st_checkpoint_close(&ck);
    else CHECK(ck.n_files == 0 && ck.files == NULL);
    if (want != GERBIL_OK) {
        CHECKF(!key1 || strstr(msg, key1), "line %d: message lacks \"%s\": %s", line, key1, msg);
        CHECKF(!key2 || strstr(msg, key2), "line %d: message lacks \"%s\": %s", line, key2, msg);
    }
}
#define EXPECT_CKPT(d, st, k1, k2) expect_ckpt(d, st, k1, k2, __LINE__)

static void test_checkpoint(void) {
    const gerbil_status F = GERBIL_ERR_FORMAT;

    /* Sharded, valid. */
    const char *dir = make_ckpt("sharded", good_index, NULL);
    struct st_checkpoint ck;
    gerbil_status s = st_checkpoint_open(dir, &ck);
    CHECKF(s == GERBIL_OK, "sharded: %s", gerbil_last_error());
    if (s == GERBIL_OK) {
        CHECK(ck.n_files == 2);
        CHECK(st_checkpoint_n_tensors(&ck) == 3);
        const struct gb_tensor *t = st_checkpoint_find(&ck, "w.c");
        CHECK(t && t->type == GB_TYPE_I32 && t->nbytes == 4 && memcmp(t->data, shard_data, 4) == 0);
        t = st_checkpoint_find(&ck, "w.b");
        CHECK(t && t->type == GB_TYPE_U8 && memcmp(t->data, shard_data + 8, 4) == 0);
        CHECK(st_checkpoint_find(&ck, "w.d") == NULL);
        int seen = 0;
        for (int i = 0; i < st_checkpoint_n_tensors(&ck); i++) {
            t = st_checkpoint_at(&ck, i);
            CHECK(t != NULL);
            if (t && st_checkpoint_find(&ck, t->name) == t) seen++;
        }
        CHECK(seen == 3);
        CHECK(st_checkpoint_at(&ck, 3) == NULL && st_checkpoint_at(&ck, -1) == NULL);
        st_checkpoint_close(&ck);
    }

    /* No index: every *.safetensors, sorted (the two shards). */
    dir = make_ckpt("noindex", NULL, NULL);
    char p[512];
    snprintf(p, sizeof p, "%s/notes.txt", dir);
    write_bytes(p, "hi", 2);
    s = st_checkpoint_open(dir, &ck);
    CHECKF(s == GERBIL_OK, "noindex: %s", gerbil_last_error());
    if (s == GERBIL_OK) {
        CHECK(ck.n_files == 2 && st_checkpoint_n_tensors(&ck) == 3);
        CHECK(ck.n_files == 2 && strstr(ck.files[0].map.path, "00001") != NULL);
        st_checkpoint_close(&ck);
    }
    /* model.safetensors wins over the other files when there is no index. */
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    write_st(p, shard_hdr2, shard_data, 4);
    s = st_checkpoint_open(dir, &ck);
    CHECKF(s == GERBIL_OK, "single: %s", gerbil_last_error());
    if (s == GERBIL_OK) {
        CHECK(ck.n_files == 1 && st_checkpoint_n_tensors(&ck) == 1);
        CHECK(st_checkpoint_find(&ck, "w.c") != NULL && st_checkpoint_find(&ck, "w.a") == NULL);
        st_checkpoint_close(&ck);
    }

    /* No index and both shards hold w.c. */
    dir = make_ckpt("dup_noindex", NULL, "{\"w.c\":{\"dtype\":\"I32\",\"shape\":[1],"
                    "\"data_offsets\":[0,4]},\"w.a\":{\"dtype\":\"F32\",\"shape\":[0],"
                    "\"data_offsets\":[0,0]}}");
    EXPECT_CKPT(dir, F, "\"w.a\"", "both");

    /* Errors. */
    snprintf(p, sizeof p, "%s/empty", tmpdir);
    mkdir(p, 0700);
    EXPECT_CKPT(p, GERBIL_ERR_IO, "no .safetensors files", p);
    snprintf(p, sizeof p, "%s/does-not-exist", tmpdir);
    EXPECT_CKPT(p, GERBIL_ERR_IO, "does-not-exist", NULL);

    dir = make_ckpt("missing_shard", "{\"weight_map\":{\"w.a\":\"model-00001-of-00002.safetensors\","
                    "\"w.z\":\"model-00003-of-00003.safetensors\"}}", NULL);
    EXPECT_CKPT(dir, GERBIL_ERR_IO, "model-00003-of-00003.safetensors", NULL);

    dir = make_ckpt("absent_tensor", "{\"weight_map\":{\"w.a\":\"model-00001-of-00002.safetensors\","
                    "\"w.q\":\"model-00002-of-00002.safetensors\"}}", NULL);
    EXPECT_CKPT(dir, F, "\"w.q\"", "model-00002-of-00002.safetensors");

    dir = make_ckpt("wrong_shard", "{\"weight_map\":{\"w.a\":\"model-00001-of-00002.safetensors\","
                    "\"w.c\":\"model-00001-of-00002.safetensors\"}}", NULL);
    EXPECT_CKPT(dir, F, "\"w.c\"", "model-00001-of-00002.safetensors");

    dir = make_ckpt("dup_shard", good_index, "{\"w.c\":{\"dtype\":\"I32\",\"shape\":[1],"
                    "\"data_offsets\":[0,4]},\"w.b\":{\"dtype\":\"U8\",\"shape\":[0],"
                    "\"data_offsets\":[4,4]}}");
    EXPECT_CKPT(dir, F, "\"w.b\"", "both");

    dir = make_ckpt("bad_json", "{\"weight_map\": {\"w.a\": ", NULL);
    EXPECT_CKPT(dir, F, "model.safetensors.index.json", "malformed JSON");

    dir = make_ckpt("no_map", "{\"metadata\":{}}", NULL);
    EXPECT_CKPT(dir, F, "weight_map", NULL);

    dir = make_ckpt("map_array", "{\"weight_map\":[\"model-00001-of-00002.safetensors\"]}", NULL);
    EXPECT_CKPT(dir, F, "weight_map", NULL);

    dir = make_ckpt("map_num", "{\"weight_map\":{\"w.a\":1}}", NULL);
    EXPECT_CKPT(dir, F, "\"w.a\"", NULL);

    dir = make_ckpt("escape", "{\"weight_map\":{\"w.a\":\"../sharded/model-00001-of-00002.safetensors\"}}",
                    NULL);
    EXPECT_CKPT(dir, F, "\"w.a\"", "../sharded");

    dir = make_ckpt("abs", "{\"weight_map\":{\"w.a\":\"/etc/passwd\"}}", NULL);
    EXPECT_CKPT(dir, F, "/etc/passwd", NULL);

    /* A bad shard reports the shard's own error. */
    dir = make_ckpt("bad_shard", good_index, "{\"w.c\":{\"dtype\":\"F64\",\"shape\":[1],"
                    "\"data_offsets\":[0,8]}}");
    EXPECT_CKPT(dir, GERBIL_ERR_UNSUPPORTED, "\"F64\"", "model-00002-of-00002.safetensors");
}

/* ---- the real model, when the shared data is present ---- */

static void test_stories260k(void) {
    const char *path = "../shared/data/models/stories260K/hf/model.safetensors";
    if (access(path, R_OK) != 0) {
        fprintf(stderr, "note: %s absent, skipping the real-model check\n", path);
        return;
    }
    struct st_file f;
    gerbil_status s = st_file_open(path, &f);
    CHECKF(s == GERBIL_OK, "%s", gerbil_last_error());
    if (s != GERBIL_OK) return;
    CHECKF(f.n_tensors == 47, "n_tensors %d", f.n_tensors);
    const struct gb_tensor *t = st_file_find(&f, "model.embed_tokens.weight");
    CHECK(t && t->type == GB_TYPE_F32 && t->n_dims == 2 && t->ne[0] == 512 && t->ne[1] == 64);
    st_file_close(&f);

    struct st_checkpoint ck;
    s = st_checkpoint_open("../shared/data/models/stories260K/hf", &ck);
    CHECKF(s == GERBIL_OK, "%s", gerbil_last_error());
    if (s == GERBIL_OK) {
        CHECK(st_checkpoint_n_tensors(&ck) == 47);
        CHECK(st_checkpoint_find(&ck, "model.embed_tokens.weight") != NULL);
        st_checkpoint_close(&ck);
    }
}

/* ---- json.c ---- */

static void test_json(void) {
    cJSON *j;
    const char *src = "{\"a\": 3, \"b\": 2.5, \"t\": true, \"s\": \"hi\", \"n\": null,"
                      " \"big\": 1e30, \"neg\": -1e30, \"i\": 1}";
    CHECK(json_parse(src, strlen(src), "cfg", &j) == GERBIL_OK);
    CHECK(json_get_int(j, "a", -1) == 3);
    CHECK(json_get_num(j, "b", 0) == 2.5);
    CHECK(json_get_num(j, "zz", 7.0) == 7.0);
    CHECK(json_get_num(j, "n", 7.0) == 7.0);
    CHECK(json_get_num(j, "s", 7.0) == 7.0);
    CHECK(json_get_bool(j, "t", 0) == 1);
    CHECK(json_get_bool(j, "i", 0) == 1);
    CHECK(json_get_bool(j, "zz", 1) == 1);
    CHECK(strcmp(json_get_str(j, "s", "x"), "hi") == 0);
    CHECK(strcmp(json_get_str(j, "a", "x"), "x") == 0);
    CHECK(json_get_int(j, "big", 0) == INT64_MAX);
    CHECK(json_get_int(j, "neg", 0) == INT64_MIN);
    CHECK(json_has(j, "a") && !json_has(j, "n") && !json_has(j, "zz"));
    CHECK(json_get_int(NULL, "a", 5) == 5);
    cJSON_Delete(j);

    /* Not NUL-terminated: the parser must stop at len. */
    char buf[8] = {'{', '}', ' ', 'x', 'x', 'x', 'x', 'x'};
    CHECK(json_parse(buf, 3, "buf", &j) == GERBIL_OK);
    cJSON_Delete(j);
    CHECK(json_parse(buf, 4, "buf", &j) == GERBIL_ERR_FORMAT && j == NULL);
    CHECK(json_parse(buf, 1, "buf", &j) == GERBIL_ERR_FORMAT);

    const char *p = tmp_path("bad.json");
    write_bytes(p, "{\"a\": 1,\n \"b\": ]}", 17);
    CHECK(json_load_file(p, &j) == GERBIL_ERR_FORMAT && j == NULL);
    CHECKF(strstr(gerbil_last_error(), "bad.json") && strstr(gerbil_last_error(), "byte "),
           "%s", gerbil_last_error());
    write_bytes(p, "", 0);
    CHECK(json_load_file(p, &j) == GERBIL_ERR_FORMAT);
    CHECK(json_load_file(tmp_path("nope.json"), &j) == GERBIL_ERR_IO);
    CHECK(strstr(gerbil_last_error(), "nope.json") != NULL);
}

/* ---- random corruption ---- */

/* The reader's only promise on garbage is to return: OK with every view inside the
 * mapping, or an error with a message. Run under ASan/UBSan in CI. */
static void test_fuzz(void) {
    size_t len;
    unsigned char *img = build_valid(&len);
    unsigned char *buf = malloc(len + 16);
    const char *p = tmp_path("fuzz.safetensors");
    unsigned long long seed = 0x5AFE7E4505ULL;
    int n_ok = 0, n_err = 0, bad = 0;
    static const char digits[] = "0123456789-.e,[]\"";

    for (int it = 0; it < 2000; it++) {
        memcpy(buf, img, len);
        size_t n = len;
        unsigned r = (unsigned)(test_rand_u64(&seed) % 5);
        int k = 1 + (int)(test_rand_u64(&seed) % 4);
        for (int j = 0; j < k; j++) {
            size_t pos = (size_t)(test_rand_u64(&seed) % n);
            if (r == 0) {        /* random bytes anywhere */
                buf[pos] = (unsigned char)test_rand_u64(&seed);
            } else if (r == 1) { /* JSON-ish bytes in the header, so parsing gets further */
                buf[8 + pos % (len > 8 ? len - 8 : 1)] =
                    (unsigned char)digits[test_rand_u64(&seed) % (sizeof digits - 1)];
            } else if (r == 2) { /* truncation */
                n = pos;
                break;
            } else if (r == 3) { /* a lying length field */
                put_u64le(buf, test_rand_u64(&seed) % (len + 8));
                break;
            } else {             /* single bit flips */
                buf[pos] ^= (unsigned char)(1u << (test_rand_u64(&seed) % 8));
            }
        }
        /* The reader parses straight out of the mmap, where reading a little past
         * the header would go unseen (the page is zero-padded); an exact-size heap
         * copy lets ASan catch any read beyond the length given to the parser. */
        if (n > 8) {
            char *h = malloc(n - 8);
            memcpy(h, buf + 8, n - 8);
            cJSON *j = NULL;
            if (json_parse(h, n - 8, "fuzz", &j) == GERBIL_OK) cJSON_Delete(j);
            else if (gerbil_last_error()[0] == '\0') bad++;
            free(h);
        }
        write_bytes(p, buf, n);
        struct st_file f;
        err_clear();
        gerbil_status s = st_file_open(p, &f);
        if (s == GERBIL_OK) {
            n_ok++;
            const unsigned char *lo = f.map.data, *hi = lo + f.map.size;
            for (int i = 0; i < f.n_tensors; i++) {
                const unsigned char *d = f.tensors[i].data;
                if (f.tensors[i].nbytes && (d < lo || d + f.tensors[i].nbytes > hi)) bad++;
            }
            st_file_close(&f);
        } else {
            n_err++;
            if (gerbil_last_error()[0] == '\0') bad++;
        }
    }
    CHECKF(bad == 0, "%d fuzz cases broke the contract", bad);
    CHECK(n_ok > 0 && n_err > 0);
    printf("fuzz: %d opened, %d rejected\n", n_ok, n_err);
    free(buf);
    free(img);
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    return remove(path);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/gerbil_st_XXXXXX");
    if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 1; }

    test_valid();
    test_truncated();
    test_bad_headers();
    test_checkpoint();
    test_stories260k();
    test_json();
    test_fuzz();

    nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return test_done();
}
