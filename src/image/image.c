/* Image input: PNG (libpng), JPEG (libjpeg-turbo) and WebP (libwebp) decoded to 8-bit RGB,
 * the way transformers' load_image + convert_to_rgb sees a file through Pillow:
 *  - JPEG EXIF orientation (APP1 "Exif", IFD0 tag 0x0112) applied as PIL.ImageOps.exif_transpose;
 *  - alpha dropped, as PIL's convert("RGB") does (transformers does not composite: an RGBA
 *    pixel keeps its stored colour), palettes expanded, grey replicated, 16-bit taken to 8;
 *  - JPEG with libjpeg's defaults (JDCT_ISLOW, fancy upsampling), which Pillow keeps.
 * Limits are checked from the header before the pixel buffer is allocated: at most
 * GERBIL_IMAGE_MAX_SIDE per side and GERBIL_IMAGE_MAX_PIXELS in all; files over
 * GERBIL_IMAGE_MAX_BYTES are refused before they are read. Truncated and corrupt files are
 * errors naming the file and the library's reason. */
#include "gerbil.h"
#include "base/status.h"

#include <stdio.h> /* before jpeglib.h, which uses FILE */
#include <jpeglib.h>
#include <png.h>
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>
#include <webp/decode.h>

static gerbil_status check_dims(const char *what, int64_t w, int64_t h) {
    if (w <= 0 || h <= 0) return err_set(GERBIL_ERR_FORMAT, "%s: image has no pixels (%lldx%lld)", what, (long long)w, (long long)h);
    if (w > GERBIL_IMAGE_MAX_SIDE || h > GERBIL_IMAGE_MAX_SIDE || w * h > GERBIL_IMAGE_MAX_PIXELS)
        return err_set(GERBIL_ERR_INVALID_ARG, "%s: %lldx%lld pixels is larger than gerbil reads (at most %d per side, %d pixels)",
                       what, (long long)w, (long long)h, GERBIL_IMAGE_MAX_SIDE, GERBIL_IMAGE_MAX_PIXELS);
    return GERBIL_OK;
}

static unsigned rd16(const unsigned char *p, int be) { return be ? (unsigned)p[0] << 8 | p[1] : (unsigned)p[1] << 8 | p[0]; }
static uint32_t rd32(const unsigned char *p, int be) {
    return be ? (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]
              : (uint32_t)p[3] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[1] << 8 | p[0];
}
/* ---- PNG ---- */
struct png_src { const unsigned char *p; size_t n, pos; };
struct png_err { jmp_buf jb; char msg[200]; };

static void png_rd(png_structp png, png_bytep out, png_size_t n) {
    struct png_src *s = png_get_io_ptr(png);
    if (n > s->n - s->pos) png_error(png, "file is truncated");
    memcpy(out, s->p + s->pos, n);
    s->pos += n;
}
static void png_on_error(png_structp png, png_const_charp msg) {
    struct png_err *e = png_get_error_ptr(png);
    snprintf(e->msg, sizeof e->msg, "%s", msg);
    longjmp(e->jb, 1);
}
static void png_on_warning(png_structp png, png_const_charp msg) { (void)png; (void)msg; }

static gerbil_status decode_png(const unsigned char *data, size_t size, const char *what, gerbil_image *out) {
    /* the size from IHDR before libpng reads on (it reads up to the first IDAT) */
    if (size >= 24 && memcmp(data + 12, "IHDR", 4) == 0) {
        const int64_t w = (int64_t)rd32(data + 16, 1), h = (int64_t)rd32(data + 20, 1);
        gerbil_status st0 = check_dims(what, w, h);
        if (st0) return st0;
    }
    struct png_src src = {data, size, 0};
    struct png_err e = {.msg = ""};
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &e, png_on_error, png_on_warning);
    if (!png) return err_set(GERBIL_ERR_NOMEM, "%s: out of memory", what);
    png_infop info = png_create_info_struct(png);
    unsigned char *volatile rgb = NULL;
    png_bytep *volatile rows = NULL;
    if (!info) { png_destroy_read_struct(&png, NULL, NULL); return err_set(GERBIL_ERR_NOMEM, "%s: out of memory", what); }
    if (setjmp(e.jb)) {
        free(rgb); free(rows);
        png_destroy_read_struct(&png, &info, NULL);
        return err_set(GERBIL_ERR_FORMAT, "%s: corrupt PNG: %s", what, e.msg);
    }
    png_set_read_fn(png, &src, png_rd);
    png_set_user_limits(png, GERBIL_IMAGE_MAX_SIDE, GERBIL_IMAGE_MAX_SIDE);
    png_read_info(png, info);
    png_uint_32 w = png_get_image_width(png, info), h = png_get_image_height(png, info);
    gerbil_status st = check_dims(what, w, h);
    if (st) { png_destroy_read_struct(&png, &info, NULL); return st; }
    int ct = png_get_color_type(png, info), bd = png_get_bit_depth(png, info);
    if (bd == 16) png_set_strip_16(png);
    if (ct == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (ct == PNG_COLOR_TYPE_GRAY && bd < 8) png_set_expand_gray_1_2_4_to_8(png);
    if (ct == PNG_COLOR_TYPE_GRAY || ct == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
    /* alpha, and the tRNS transparency libpng turns into alpha, dropped as Pillow convert("RGB") */
    if ((ct & PNG_COLOR_MASK_ALPHA) || png_get_valid(png, info, PNG_INFO_tRNS)) png_set_strip_alpha(png);
    (void)png_set_interlace_handling(png);
    png_read_update_info(png, info);
    if (png_get_rowbytes(png, info) != (size_t)w * 3) png_error(png, "unexpected row layout after conversion");
    rgb = malloc((size_t)w * h * 3);
    rows = malloc(sizeof(png_bytep) * h);
    if (!rgb || !rows) png_error(png, "out of memory");
    for (png_uint_32 y = 0; y < h; y++) rows[y] = rgb + (size_t)y * w * 3;
    png_read_image(png, rows);
    png_read_end(png, NULL);
    free(rows);
    png_destroy_read_struct(&png, &info, NULL);
    out->width = (int)w;
    out->height = (int)h;
    out->rgb = rgb;
    return GERBIL_OK;
}

/* ---- JPEG ---- */
struct jpg_err { struct jpeg_error_mgr mgr; jmp_buf jb; char msg[JMSG_LENGTH_MAX]; };
static void jpg_on_error(j_common_ptr c) {
    struct jpg_err *e = (struct jpg_err *)c->err;
    c->err->format_message(c, e->msg);
    longjmp(e->jb, 1);
}
static void jpg_on_message(j_common_ptr c, int level) {
    /* corrupt-data warnings (level -1) are errors: a truncated file must not decode to grey */
    if (level < 0) {
        struct jpg_err *e = (struct jpg_err *)c->err;
        c->err->format_message(c, e->msg);
        longjmp(e->jb, 1);
    }
}

/* The EXIF orientation (1..8) in an APP1 payload, 1 where absent or malformed. */
static int exif_orientation(const unsigned char *p, size_t n) {
    if (n < 14 || memcmp(p, "Exif\0\0", 6) != 0) return 1;
    p += 6; n -= 6;
    int be;
    if (p[0] == 'M' && p[1] == 'M') be = 1;
    else if (p[0] == 'I' && p[1] == 'I') be = 0;
    else return 1;
    if (rd16(p + 2, be) != 42) return 1;
    uint32_t ifd = rd32(p + 4, be);
    if (ifd > n - 2 || ifd < 8) return 1;
    unsigned cnt = rd16(p + ifd, be);
    for (unsigned i = 0; i < cnt; i++) {
        size_t off = (size_t)ifd + 2 + (size_t)i * 12;
        if (off + 12 > n) return 1;
        if (rd16(p + off, be) == 0x0112 && rd16(p + off + 2, be) == 3 /* SHORT */) {
            unsigned v = rd16(p + off + 8, be);
            return v >= 1 && v <= 8 ? (int)v : 1;
        }
    }
    return 1;
}

/* PIL.ImageOps.exif_transpose: 2 mirror, 3 rotate 180, 4 flip, 5 transpose, 6 rotate 90
 * clockwise, 7 transverse, 8 rotate 90 counter-clockwise. */
static gerbil_status apply_orientation(gerbil_image *im, int o, const char *what) {
    if (o <= 1) return GERBIL_OK;
    const int W = im->width, H = im->height;
    const int swap = o >= 5;
    const int ow = swap ? H : W, oh = swap ? W : H;
    unsigned char *dst = malloc((size_t)W * H * 3);
    if (!dst) return err_set(GERBIL_ERR_NOMEM, "%s: out of memory", what);
    for (int y = 0; y < oh; y++)
        for (int x = 0; x < ow; x++) {
            int sx, sy;
            switch (o) {
            case 2: sx = W - 1 - x; sy = y; break;
            case 3: sx = W - 1 - x; sy = H - 1 - y; break;
            case 4: sx = x; sy = H - 1 - y; break;
            case 5: sx = y; sy = x; break;
            case 6: sx = y; sy = H - 1 - x; break;
            case 7: sx = W - 1 - y; sy = H - 1 - x; break;
            default: sx = W - 1 - y; sy = x; break; /* 8 */
            }
            memcpy(dst + ((size_t)y * ow + x) * 3, im->rgb + ((size_t)sy * W + sx) * 3, 3);
        }
    free(im->rgb);
    im->rgb = dst;
    im->width = ow;
    im->height = oh;
    return GERBIL_OK;
}

static gerbil_status decode_jpeg(const unsigned char *data, size_t size, const char *what, gerbil_image *out) {
    struct jpeg_decompress_struct c;
    struct jpg_err e;
    unsigned char *volatile rgb = NULL;
    c.err = jpeg_std_error(&e.mgr);
    e.mgr.error_exit = jpg_on_error;
    e.mgr.emit_message = jpg_on_message;
    e.msg[0] = 0;
    if (setjmp(e.jb)) {
        free(rgb);
        jpeg_destroy_decompress(&c);
        return err_set(GERBIL_ERR_FORMAT, "%s: corrupt JPEG: %s", what, e.msg);
    }
    jpeg_create_decompress(&c);
    jpeg_mem_src(&c, data, (unsigned long)size);
    jpeg_save_markers(&c, JPEG_APP0 + 1, 0xffff);
    jpeg_read_header(&c, TRUE);
    gerbil_status st = check_dims(what, c.image_width, c.image_height);
    if (st) { jpeg_destroy_decompress(&c); return st; }
    if (c.jpeg_color_space == JCS_CMYK || c.jpeg_color_space == JCS_YCCK) {
        jpeg_destroy_decompress(&c);
        return err_set(GERBIL_ERR_UNSUPPORTED, "%s: CMYK JPEG is not supported (convert it to RGB)", what);
    }
    int orient = 1;
    for (jpeg_saved_marker_ptr m = c.marker_list; m; m = m->next)
        if (m->marker == JPEG_APP0 + 1 && (orient = exif_orientation(m->data, m->data_length)) != 1) break;
    c.out_color_space = JCS_RGB;
    jpeg_start_decompress(&c);
    if (c.output_components != 3) { strcpy(e.msg, "not 3 components after conversion"); longjmp(e.jb, 1); }
    const size_t W = c.output_width, H = c.output_height;
    rgb = malloc(W * H * 3);
    if (!rgb) { strcpy(e.msg, "out of memory"); longjmp(e.jb, 1); }
    while (c.output_scanline < c.output_height) {
        JSAMPROW row = rgb + (size_t)c.output_scanline * W * 3;
        if (jpeg_read_scanlines(&c, &row, 1) != 1) { strcpy(e.msg, "no scanline decoded"); longjmp(e.jb, 1); }
    }
    jpeg_finish_decompress(&c);
    jpeg_destroy_decompress(&c);
    out->width = (int)W;
    out->height = (int)H;
    out->rgb = rgb;
    return apply_orientation(out, orient, what);
}

/* ---- WebP ---- */
static gerbil_status decode_webp(const unsigned char *data, size_t size, const char *what, gerbil_image *out) {
    WebPBitstreamFeatures f;
    VP8StatusCode vs = WebPGetFeatures(data, size, &f);
    if (vs != VP8_STATUS_OK)
        return err_set(GERBIL_ERR_FORMAT, "%s: corrupt WebP (%s)", what,
                       vs == VP8_STATUS_NOT_ENOUGH_DATA ? "file is truncated" : "bad header");
    if (f.has_animation) return err_set(GERBIL_ERR_UNSUPPORTED, "%s: animated WebP is not supported", what);
    gerbil_status st = check_dims(what, f.width, f.height);
    if (st) return st;
    const size_t stride = (size_t)f.width * 3, n = stride * (size_t)f.height;
    unsigned char *rgb = malloc(n);
    if (!rgb) return err_set(GERBIL_ERR_NOMEM, "%s: out of memory", what);
    if (!WebPDecodeRGBInto(data, size, rgb, n, (int)stride)) {
        free(rgb);
        return err_set(GERBIL_ERR_FORMAT, "%s: corrupt or truncated WebP", what);
    }
    out->width = f.width;
    out->height = f.height;
    out->rgb = rgb;
    return GERBIL_OK;
}

gerbil_status gerbil_image_read_memory(const void *data, size_t size, const char *what, gerbil_image *out) {
    const unsigned char *p = data;
    if (!what) what = "image";
    if (!out) return err_set(GERBIL_ERR_INVALID_ARG, "gerbil_image_read_memory: out is NULL");
    memset(out, 0, sizeof *out);
    if (!p || size == 0) return err_set(GERBIL_ERR_FORMAT, "%s: empty file", what);
    if (size > GERBIL_IMAGE_MAX_BYTES)
        return err_set(GERBIL_ERR_INVALID_ARG, "%s: %zu bytes is larger than the limit of %d", what, size, GERBIL_IMAGE_MAX_BYTES);
    if (size >= 8 && memcmp(p, "\x89PNG\r\n\x1a\n", 8) == 0) return decode_png(p, size, what, out);
    if (size >= 3 && p[0] == 0xff && p[1] == 0xd8 && p[2] == 0xff) return decode_jpeg(p, size, what, out);
    if (size >= 12 && memcmp(p, "RIFF", 4) == 0 && memcmp(p + 8, "WEBP", 4) == 0) return decode_webp(p, size, what, out);
    return err_set(GERBIL_ERR_FORMAT, "%s: not a PNG, JPEG or WebP file", what);
}

gerbil_status gerbil_image_read_file(const char *path, gerbil_image *out) {
    if (!out) return err_set(GERBIL_ERR_INVALID_ARG, "gerbil_image_read_file: out is NULL");
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    if (!f) return err_set(GERBIL_ERR_IO, "%s: cannot open", path);
    if (fseek(f, 0, SEEK_END) != 0) { fclose(f); return err_set(GERBIL_ERR_IO, "%s: cannot seek", path); }
    long n = ftell(f);
    if (n < 0) { fclose(f); return err_set(GERBIL_ERR_IO, "%s: cannot read its size", path); }
    if (n > GERBIL_IMAGE_MAX_BYTES) {
        fclose(f);
        return err_set(GERBIL_ERR_INVALID_ARG, "%s: %ld bytes is larger than the limit of %d", path, n, GERBIL_IMAGE_MAX_BYTES);
    }
    rewind(f);
    unsigned char *buf = malloc(n ? (size_t)n : 1);
    if (!buf) { fclose(f); return err_set(GERBIL_ERR_NOMEM, "%s: out of memory", path); }
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    if (got != (size_t)n) { free(buf); return err_set(GERBIL_ERR_IO, "%s: read failed", path); }
    gerbil_status st = gerbil_image_read_memory(buf, (size_t)n, path, out);
    free(buf);
    return st;
}

void gerbil_image_free(gerbil_image *im) {
    if (!im) return;
    free(im->rgb);
    im->rgb = NULL;
    im->width = im->height = 0;
}
