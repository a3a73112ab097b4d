/* Images in (src/image/) against transformers 5.17 + Pillow, from fixtures made on the GPU
 * machine by scripts/gen_vision_fixtures.py (tests/fixtures/qwen35-vl-image/):
 *  - decoding: the RGB bytes of every real photo and every made test image (RGBA, LA,
 *    palette with transparency and grey PNGs; lossless, lossy and alpha WebP; progressive and
 *    grey JPEGs; JPEGs with EXIF orientations 2..8) equal, byte for byte (sha256), what
 *    transformers' load_image returns;
 *  - resizing: Pillow's Image.resize(BICUBIC) of the fjord photo to 9 sizes (down, up, one
 *    side only), byte for byte;
 *  - the Qwen3.5 image processor: pixel_values and image_grid_thw of the 3 photos at the
 *    Qwen3.5 pixel bounds and two smaller ones equal Qwen2VLImageProcessorPil's bit for bit
 *    (sha256 of the f32 array), and are compared with the default (torchvision) backend's
 *    within the bound printed;
 *  - errors: truncated, corrupted, empty and non-image files, and headers with huge sizes
 *    (refused before allocation) give clear errors, no crash (the suite runs under ASan). */
#include "gerbil.h"
#include "test.h"

#include <cjson/cJSON.h>
#include <openssl/evp.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#define FX "tests/fixtures/qwen35-vl-image/"
#define IMG "../shared/data/images/"

static void sha_hex(const void *p, size_t n, char out[65]) {
    unsigned char md[32];
    unsigned len = 0;
    EVP_Digest(p, n, md, &len, EVP_sha256(), NULL);
    for (int i = 0; i < 32; i++) sprintf(out + 2 * i, "%02x", md[i]);
}

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    rewind(f);
    char *b = malloc((size_t)sz + 1);
    if (b && fread(b, 1, (size_t)sz, f) != (size_t)sz) { free(b); b = NULL; }
    fclose(f);
    if (b) b[sz] = 0;
    if (n) *n = (size_t)sz;
    return b;
}

static cJSON *load_json(const char *path) {
    char *s = slurp(path, NULL);
    if (!s) return NULL;
    cJSON *j = cJSON_Parse(s);
    free(s);
    return j;
}

static const char *path_of(const char *name, char *buf, size_t n) {
    if (strncmp(name, "coco_", 5) == 0 || strncmp(name, "llamacpp_", 9) == 0) snprintf(buf, n, IMG "%s", name);
    else snprintf(buf, n, FX "images/%s", name);
    return buf;
}

static void test_decode(void) {
    cJSON *d = load_json(FX "decode.json");
    CHECK(d != NULL);
    int n = 0;
    cJSON *it;
    cJSON_ArrayForEach(it, d) {
        char p[512], h[65];
        path_of(it->string, p, sizeof p);
        gerbil_image im;
        gerbil_status st = gerbil_image_read_file(p, &im);
        CHECKF(st == GERBIL_OK, "%s: %s", p, gerbil_last_error());
        if (st) continue;
        CHECKF(im.width == cJSON_GetObjectItem(it, "w")->valueint && im.height == cJSON_GetObjectItem(it, "h")->valueint,
               "%s: %dx%d", p, im.width, im.height);
        sha_hex(im.rgb, (size_t)im.width * im.height * 3, h);
        CHECKF(strcmp(h, cJSON_GetObjectItem(it, "sha256")->valuestring) == 0, "%s: RGB differs from load_image's", p);
        gerbil_image_free(&im);
        n++;
    }
    printf("decode: %d images byte-identical to transformers' load_image\n", n);
    CHECK(n >= 18);
    cJSON_Delete(d);
}

static void test_resize(void) {
    cJSON *d = load_json(FX "resize.json");
    CHECK(d != NULL);
    gerbil_image im;
    CHECK(gerbil_image_read_file(IMG "llamacpp_ui_fixture_1_fjord.jpg", &im) == GERBIL_OK);
    int n = 0;
    cJSON *it;
    cJSON_ArrayForEach(it, d) {
        int w, h;
        if (sscanf(it->string, "%dx%d", &w, &h) != 2) continue;
        gerbil_image r;
        char s[65];
        CHECK(gerbil_image_resize_bicubic(&im, w, h, &r) == GERBIL_OK);
        sha_hex(r.rgb, (size_t)w * h * 3, s);
        CHECKF(strcmp(s, it->valuestring) == 0, "resize to %dx%d differs from Pillow's", w, h);
        gerbil_image_free(&r);
        n++;
    }
    printf("resize: %d sizes byte-identical to Pillow's BICUBIC\n", n);
    gerbil_image_free(&im);
    cJSON_Delete(d);
}

static void test_processor(void) {
    cJSON *d = load_json(FX "proc.json");
    CHECK(d != NULL);
    cJSON *items = cJSON_GetObjectItem(d, "items"), *it;
    int exact = 0;
    double tv_max = 0;
    int64_t tv_diff = 0, tv_n = 0;
    cJSON_ArrayForEach(it, items) {
        char cls[64], cfgn[16], img[256], p[512];
        if (sscanf(it->string, "%63[^/]/%15[^/]/%255s", cls, cfgn, img) != 3) continue;
        gerbil_qwen_image_config c = {16, 2, 2, 65536, 16777216, 1.0 / 255, {0.5f, 0.5f, 0.5f}, {0.5f, 0.5f, 0.5f}};
        if (!strcmp(cfgn, "small")) { c.min_pixels = 1024; c.max_pixels = 40960; }
        if (!strcmp(cfgn, "tiny")) { c.min_pixels = 4096; c.max_pixels = 8192; }
        gerbil_image im;
        CHECK(gerbil_image_read_file(path_of(img, p, sizeof p), &im) == GERBIL_OK);
        float *pv = NULL;
        int64_t np = 0, pd = 0;
        int thw[3];
        gerbil_status st = gerbil_image_qwen_patches(&im, &c, &pv, &np, &pd, thw);
        CHECKF(st == GERBIL_OK, "%s: %s", it->string, gerbil_last_error());
        gerbil_image_free(&im);
        if (st) continue;
        cJSON *g = cJSON_GetObjectItem(it, "grid_thw"), *sh = cJSON_GetObjectItem(it, "shape");
        CHECKF(thw[0] == cJSON_GetArrayItem(g, 0)->valueint && thw[1] == cJSON_GetArrayItem(g, 1)->valueint &&
               thw[2] == cJSON_GetArrayItem(g, 2)->valueint, "%s: grid %d %d %d", it->string, thw[0], thw[1], thw[2]);
        CHECK(np == cJSON_GetArrayItem(sh, 0)->valueint && pd == cJSON_GetArrayItem(sh, 1)->valueint);
        if (np != cJSON_GetArrayItem(sh, 0)->valueint) { free(pv); continue; }
        char s[65];
        sha_hex(pv, (size_t)(np * pd) * sizeof(float), s);
        const int is_pil = strstr(cls, "Pil") != NULL;
        if (is_pil) {
            CHECKF(strcmp(s, cJSON_GetObjectItem(it, "sha256_f32")->valuestring) == 0,
                   "%s: pixel_values differ from the PIL processor's", it->string);
            exact += strcmp(s, cJSON_GetObjectItem(it, "sha256_f32")->valuestring) == 0;
        }
        /* the stored bytes (first temporal slot of each patch) */
        char fp[600];
        snprintf(fp, sizeof fp, FX "proc/%s", cJSON_GetObjectItem(it, "file")->valuestring);
        size_t n = 0;
        unsigned char *u = (unsigned char *)slurp(fp, &n);
        if (u) {
            CHECK(n == (size_t)np * 768);
            for (int64_t k = 0; k < np && n == (size_t)np * 768; k++)
                for (int cc = 0; cc < 3; cc++)
                    for (int t = 0; t < 2; t++)
                        for (int q = 0; q < 256; q++) {
                            const float ref = ((float)(u[k * 768 + cc * 256 + q] * (1.0 / 255)) - 0.5f) / 0.5f;
                            const double e = fabs((double)pv[k * pd + cc * 512 + t * 256 + q] - ref);
                            if (is_pil) CHECKF(e == 0, "%s: patch %lld", it->string, (long long)k);
                            else {
                                tv_n++;
                                tv_diff += e > 1e-6;
                                if (e > tv_max) tv_max = e;
                            }
                            if (is_pil && e != 0) { k = np; cc = 3; t = 2; break; }
                        }
            free(u);
        }
        free(pv);
    }
    printf("processor: %d/9 PIL-backend pixel_values bit-identical; vs the default (torchvision) backend: "
           "%lld of %lld values differ, max |diff| %.5f (%.1f/255 in pixel levels)\n",
           exact, (long long)tv_diff, (long long)tv_n, tv_max, tv_max * 127.5);
    CHECK(exact == 9);
    /* torchvision's uint8 antialiased bicubic is a port of Pillow's; it may round a level apart */
    CHECKF(tv_max <= 2.0 / 127.5 + 1e-6, "torchvision backend differs by %g", tv_max);
    cJSON_Delete(d);
}

static uint32_t crc32_(const unsigned char *p, size_t n) {
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0xedb88320u : c >> 1;
    }
    return ~c;
}
static void be32(unsigned char *p, uint32_t v) { p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v; }

static void test_errors(void) {
    gerbil_image im;
    CHECK(gerbil_image_read_file("/nonexistent/x.png", &im) == GERBIL_ERR_IO);
    CHECK(gerbil_image_read_memory("", 0, "empty", &im) == GERBIL_ERR_FORMAT);
    CHECK(gerbil_image_read_memory("hello world, not an image", 25, "text", &im) == GERBIL_ERR_FORMAT);
    CHECK(strstr(gerbil_last_error(), "not a PNG, JPEG or WebP") != NULL);
    const char *files[] = {IMG "coco_000000039769_two_cats.png", IMG "llamacpp_mtmd_test-1_newspaper.jpeg",
                           FX "images/lossy.webp", FX "images/lossless.webp", FX "images/progressive.jpg",
                           FX "images/palette.png"};
    int trunc_err = 0, trunc_n = 0, flip_n = 0;
    for (size_t f = 0; f < sizeof files / sizeof *files; f++) {
        size_t n;
        unsigned char *b = (unsigned char *)slurp(files[f], &n);
        CHECK(b != NULL);
        if (!b) continue;
        const double cuts[] = {0.05, 0.3, 0.6, 0.9, 0.99};
        for (int c = 0; c < 5; c++) {
            size_t m = (size_t)(n * cuts[c]);
            unsigned char *t = malloc(m);
            memcpy(t, b, m);
            gerbil_status st = gerbil_image_read_memory(t, m, files[f], &im);
            trunc_n++;
            trunc_err += st == GERBIL_ERR_FORMAT;
            CHECKF(st == GERBIL_ERR_FORMAT, "%s cut to %zu of %zu bytes: status %d", files[f], m, n, st);
            if (!st) gerbil_image_free(&im);
            free(t);
        }
        unsigned long long seed = 0x9e3779b97f4a7c15ULL + f;
        for (int r = 0; r < 20; r++) { /* corrupt bytes past the signature: an error or an image, no crash */
            unsigned char *t = malloc(n);
            memcpy(t, b, n);
            for (int k = 0; k < 8; k++) t[12 + test_rand_u64(&seed) % (n - 12)] ^= (unsigned char)(1 + test_rand_u64(&seed) % 255);
            gerbil_status st = gerbil_image_read_memory(t, n, files[f], &im);
            if (!st) gerbil_image_free(&im);
            else CHECK(gerbil_last_error()[0] != 0);
            flip_n++;
            free(t);
        }
        free(b);
    }
    printf("errors: %d/%d truncated files refused; %d corrupted copies decoded or refused cleanly\n", trunc_err, trunc_n, flip_n);

    /* huge sizes, refused from the header (a 30000x30000 PNG is 2.7 GB of RGB) */
    unsigned char png[8 + 25] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0, 0, 13, 'I', 'H', 'D', 'R'};
    be32(png + 16, 30000); be32(png + 20, 30000);
    png[24] = 8; png[25] = 2; png[26] = 0; png[27] = 0; png[28] = 0;
    be32(png + 29, crc32_(png + 12, 17));
    CHECK(gerbil_image_read_memory(png, sizeof png, "huge.png", &im) == GERBIL_ERR_INVALID_ARG);
    CHECK(strstr(gerbil_last_error(), "larger than gerbil reads") != NULL);
    printf("huge PNG: %s\n", gerbil_last_error());
    be32(png + 16, 100000); be32(png + 20, 10);
    be32(png + 29, crc32_(png + 12, 17));
    CHECK(gerbil_image_read_memory(png, sizeof png, "wide.png", &im) != GERBIL_OK);
    /* JPEG: SOI, SOF0 60000x60000 */
    unsigned char jpg[] = {0xff, 0xd8, 0xff, 0xc0, 0, 17, 8, 0xea, 0x60, 0xea, 0x60, 3, 1, 0x22, 0, 2, 0x11, 1, 3, 0x11, 1,
                           0xff, 0xda, 0, 12, 3, 1, 0, 2, 0x11, 3, 0x11, 0, 0x3f, 0, 0xff, 0xd9};
    gerbil_status st = gerbil_image_read_memory(jpg, sizeof jpg, "huge.jpg", &im);
    CHECK(st == GERBIL_ERR_INVALID_ARG);
    printf("huge JPEG: %s\n", gerbil_last_error());
    /* WebP lossless: 16384x16384 (268 M pixels) */
    unsigned char wp[] = {'R', 'I', 'F', 'F', 26, 0, 0, 0, 'W', 'E', 'B', 'P', 'V', 'P', '8', 'L', 10, 0, 0, 0, 0x2f,
                          0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    uint32_t bits = (16384 - 1) | (uint32_t)(16384 - 1) << 14 | 0u << 28;
    wp[21] = bits; wp[22] = bits >> 8; wp[23] = bits >> 16; wp[24] = bits >> 24;
    st = gerbil_image_read_memory(wp, sizeof wp, "huge.webp", &im);
    CHECK(st == GERBIL_ERR_INVALID_ARG);
    printf("huge WebP: %s\n", gerbil_last_error());
    /* smart_resize refuses what transformers refuses */
    int h, w;
    CHECK(gerbil_image_smart_resize(20, 500, 32, 65536, 16777216, &h, &w) == GERBIL_ERR_INVALID_ARG);
    CHECK(gerbil_image_smart_resize(32, 7000, 32, 1024, 16777216, &h, &w) == GERBIL_ERR_INVALID_ARG);
    CHECK(gerbil_image_smart_resize(368, 550, 32, 65536, 16777216, &h, &w) == GERBIL_OK && h == 384 && w == 544);
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) { fputs(text, f); fclose(f); }
}

/* preprocessor_config.json: Qwen3.5's (as the Qwen/Qwen3.5 repos ship it), defaults, errors */
static void test_config(void) {
    char p[] = "/tmp/gerbil_test_image_XXXXXX";
    int fd = mkstemp(p);
    CHECK(fd >= 0);
    if (fd < 0) return;
    close(fd);
    write_file(p, "{\"size\": {\"longest_edge\": 16777216, \"shortest_edge\": 65536}, \"patch_size\": 16,"
                  " \"temporal_patch_size\": 2, \"merge_size\": 2, \"image_mean\": [0.5, 0.5, 0.5],"
                  " \"image_std\": [0.5, 0.5, 0.5], \"processor_class\": \"Qwen3VLProcessor\","
                  " \"image_processor_type\": \"Qwen2VLImageProcessorFast\"}");
    gerbil_qwen_image_config c;
    CHECK(gerbil_qwen_image_config_read(p, &c) == GERBIL_OK);
    CHECK(c.patch_size == 16 && c.temporal_patch_size == 2 && c.merge_size == 2 && c.min_pixels == 65536 &&
          c.max_pixels == 16777216 && c.image_mean[1] == 0.5f && c.image_std[2] == 0.5f && c.rescale_factor == 1.0 / 255);
    /* with it, the cats photo gives the PIL processor's pixel_values (proc.json, "full") */
    gerbil_image im;
    CHECK(gerbil_image_read_file(IMG "coco_000000039769_two_cats.png", &im) == GERBIL_OK);
    float *pv = NULL;
    int64_t np, pd;
    int thw[3];
    if (gerbil_image_qwen_patches(&im, &c, &pv, &np, &pd, thw) == GERBIL_OK) {
        char s[65];
        sha_hex(pv, (size_t)(np * pd) * sizeof(float), s);
        CHECK(strcmp(s, "dd228dcf7e5473a274adff10edc018a9918f6d33d4e41379a69b52d5a7380680") == 0);
        free(pv);
    } else CHECK(0);
    gerbil_image_free(&im);
    write_file(p, "{\"min_pixels\": 3136, \"max_pixels\": 1003520, \"size\": {\"shortest_edge\": 1, \"longest_edge\": 2}}");
    CHECK(gerbil_qwen_image_config_read(p, &c) == GERBIL_OK);
    CHECK(c.patch_size == 14 && c.min_pixels == 3136 && c.max_pixels == 1003520 && fabsf(c.image_mean[0] - 0.48145466f) < 1e-7f);
    write_file(p, "{\"patch_size\": \"sixteen\"}");
    CHECK(gerbil_qwen_image_config_read(p, &c) == GERBIL_ERR_FORMAT && strstr(gerbil_last_error(), "patch_size"));
    write_file(p, "{\"image_std\": [0.5, 0, 0.5]}");
    CHECK(gerbil_qwen_image_config_read(p, &c) == GERBIL_ERR_FORMAT && strstr(gerbil_last_error(), "image_std"));
    write_file(p, "{\"min_pixels\": 5000, \"max_pixels\": 4000}");
    CHECK(gerbil_qwen_image_config_read(p, &c) == GERBIL_ERR_FORMAT);
    write_file(p, "[1, 2");
    CHECK(gerbil_qwen_image_config_read(p, &c) == GERBIL_ERR_FORMAT);
    unlink(p);
    CHECK(gerbil_qwen_image_config_read(p, &c) == GERBIL_ERR_IO);
}

int main(void) {
    test_decode();
    test_resize();
    test_processor();
    test_errors();
    test_config();
    return test_done();
}
