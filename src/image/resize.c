/* Image resampling as Pillow's Image.resize(BICUBIC) does it on an 8-bit RGB image
 * (libImaging/Resample.c, read as the spec): separable, horizontal pass then vertical, a
 * cubic with a = -0.5 and support 2 stretched by the downscale factor (antialiasing), the
 * weights normalised in double then rounded to 22-bit fixed point, each pass rounded and
 * clipped to 8 bits. A pass whose size does not change is skipped, as Pillow does.
 *
 * And the Qwen2-VL / Qwen3-VL / Qwen3.5 image processor of transformers (smart_resize,
 * resize, rescale by 1/255, normalise, patchify with temporal_patch_size and merge_size). */
#include "gerbil.h"
#include "base/status.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { PREC_BITS = 32 - 8 - 2 };

static double cubic(double x) {
    const double a = -0.5;
    x = fabs(x);
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
    if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
    return 0.0;
}

/* Fixed-point weights: k[out * ksize + i] for input pixels bounds[2 out] + i, i < bounds[2 out + 1]. */
static int coeffs(int in_size, int out_size, int **kk_out, int **bounds_out, int *ksize_out) {
    const double scale = (double)in_size / out_size;
    const double fscale = scale < 1.0 ? 1.0 : scale;
    const double support = 2.0 * fscale;
    const int ksize = (int)ceil(support) * 2 + 1;
    double *pre = malloc(sizeof(double) * (size_t)ksize);
    int *kk = malloc(sizeof(int) * (size_t)out_size * ksize);
    int *bounds = malloc(sizeof(int) * 2 * (size_t)out_size);
    if (!pre || !kk || !bounds) { free(pre); free(kk); free(bounds); return -1; }
    for (int xx = 0; xx < out_size; xx++) {
        const double center = (xx + 0.5) * scale, ss = 1.0 / fscale;
        int xmin = (int)(center - support + 0.5);
        if (xmin < 0) xmin = 0;
        int xmax = (int)(center + support + 0.5);
        if (xmax > in_size) xmax = in_size;
        xmax -= xmin;
        double ww = 0.0;
        for (int x = 0; x < xmax; x++) {
            const double w = cubic((x + xmin - center + 0.5) * ss);
            pre[x] = w;
            ww += w;
        }
        int *k = kk + (size_t)xx * ksize;
        for (int x = 0; x < ksize; x++) {
            const double v = x < xmax ? (ww != 0.0 ? pre[x] / ww : pre[x]) : 0.0;
            k[x] = v < 0 ? (int)(-0.5 + v * (1 << PREC_BITS)) : (int)(0.5 + v * (1 << PREC_BITS));
        }
        bounds[2 * xx] = xmin;
        bounds[2 * xx + 1] = xmax;
    }
    free(pre);
    *kk_out = kk;
    *bounds_out = bounds;
    *ksize_out = ksize;
    return 0;
}

static inline unsigned char clip8(int64_t v) {
    v >>= PREC_BITS;
    return v < 0 ? 0 : v > 255 ? 255 : (unsigned char)v;
}

gerbil_status gerbil_image_resize_bicubic(const gerbil_image *in, int out_w, int out_h, gerbil_image *out) {
    memset(out, 0, sizeof *out);
    if (!in || !in->rgb || in->width <= 0 || in->height <= 0 || out_w <= 0 || out_h <= 0 ||
        out_w > GERBIL_IMAGE_MAX_SIDE || out_h > GERBIL_IMAGE_MAX_SIDE ||
        (int64_t)out_w * out_h > GERBIL_IMAGE_MAX_PIXELS)
        return err_set(GERBIL_ERR_INVALID_ARG, "image resize: bad size %dx%d -> %dx%d", in ? in->width : 0,
                       in ? in->height : 0, out_w, out_h);
    const int W = in->width, H = in->height;
    unsigned char *cur = malloc((size_t)W * H * 3);
    if (!cur) return err_set(GERBIL_ERR_NOMEM, "image resize: out of memory");
    memcpy(cur, in->rgb, (size_t)W * H * 3);
    int cw = W;
    if (out_w != W) { /* horizontal */
        int *kk, *b, ks;
        unsigned char *dst = malloc((size_t)out_w * H * 3);
        if (!dst || coeffs(W, out_w, &kk, &b, &ks)) { free(dst); free(cur); return err_set(GERBIL_ERR_NOMEM, "image resize: out of memory"); }
        for (int y = 0; y < H; y++) {
            const unsigned char *row = cur + (size_t)y * W * 3;
            for (int xx = 0; xx < out_w; xx++) {
                const int *k = kk + (size_t)xx * ks, xmin = b[2 * xx], xn = b[2 * xx + 1];
                for (int c = 0; c < 3; c++) {
                    int64_t s = 1 << (PREC_BITS - 1);
                    for (int x = 0; x < xn; x++) s += (int64_t)row[(size_t)(x + xmin) * 3 + c] * k[x];
                    dst[((size_t)y * out_w + xx) * 3 + c] = clip8(s);
                }
            }
        }
        free(kk); free(b); free(cur);
        cur = dst;
        cw = out_w;
    }
    if (out_h != H) { /* vertical */
        int *kk, *b, ks;
        unsigned char *dst = malloc((size_t)cw * out_h * 3);
        if (!dst || coeffs(H, out_h, &kk, &b, &ks)) { free(dst); free(cur); return err_set(GERBIL_ERR_NOMEM, "image resize: out of memory"); }
        for (int yy = 0; yy < out_h; yy++) {
            const int *k = kk + (size_t)yy * ks, ymin = b[2 * yy], yn = b[2 * yy + 1];
            for (int xc = 0; xc < cw * 3; xc++) {
                int64_t s = 1 << (PREC_BITS - 1);
                for (int y = 0; y < yn; y++) s += (int64_t)cur[(size_t)(y + ymin) * cw * 3 + xc] * k[y];
                dst[(size_t)yy * cw * 3 + xc] = clip8(s);
            }
        }
        free(kk); free(b); free(cur);
        cur = dst;
    }
    out->width = out_w;
    out->height = out_h;
    out->rgb = cur;
    return GERBIL_OK;
}

/* transformers' smart_resize (Python's round: half to even, which rint does). */
gerbil_status gerbil_image_smart_resize(int height, int width, int factor, int64_t min_pixels, int64_t max_pixels,
                                        int *out_h, int *out_w) {
    if (factor <= 0 || height <= 0 || width <= 0)
        return err_set(GERBIL_ERR_INVALID_ARG, "smart_resize: bad size %dx%d or factor %d", width, height, factor);
    if (height < factor || width < factor)
        return err_set(GERBIL_ERR_INVALID_ARG, "image %dx%d: both sides must be at least %d pixels", width, height, factor);
    const int mx = height > width ? height : width, mn = height > width ? width : height;
    if ((double)mx / mn > 200)
        return err_set(GERBIL_ERR_INVALID_ARG, "image %dx%d: aspect ratio over 200", width, height);
    double hb = rint((double)height / factor) * factor, wb = rint((double)width / factor) * factor;
    if (hb * wb > (double)max_pixels) {
        const double beta = sqrt((double)height * width / (double)max_pixels);
        hb = floor(height / beta / factor) * factor;
        wb = floor(width / beta / factor) * factor;
        if (hb < factor) hb = factor;
        if (wb < factor) wb = factor;
    } else if (hb * wb < (double)min_pixels) {
        const double beta = sqrt((double)min_pixels / ((double)height * width));
        hb = ceil(height * beta / factor) * factor;
        wb = ceil(width * beta / factor) * factor;
    }
    if (hb > GERBIL_IMAGE_MAX_SIDE || wb > GERBIL_IMAGE_MAX_SIDE || hb * wb > GERBIL_IMAGE_MAX_PIXELS)
        return err_set(GERBIL_ERR_INVALID_ARG, "image %dx%d: resized size %.0fx%.0f is too large", width, height, wb, hb);
    *out_h = (int)hb;
    *out_w = (int)wb;
    return GERBIL_OK;
}

gerbil_status gerbil_image_qwen_patches(const gerbil_image *im, const gerbil_qwen_image_config *cfg, float **pixels,
                                        int64_t *n_patches, int64_t *patch_dim, int grid_thw[3]) {
    *pixels = NULL;
    const int P = cfg->patch_size, T = cfg->temporal_patch_size, M = cfg->merge_size;
    if (P <= 0 || T <= 0 || M <= 0 || P > 64 || T > 8 || M > 8)
        return err_set(GERBIL_ERR_INVALID_ARG, "image processor: bad patch %d / temporal %d / merge %d", P, T, M);
    int rh, rw;
    gerbil_status st = gerbil_image_smart_resize(im->height, im->width, P * M, cfg->min_pixels, cfg->max_pixels, &rh, &rw);
    if (st) return st;
    gerbil_image r;
    st = gerbil_image_resize_bicubic(im, rw, rh, &r);
    if (st) return st;
    const int gh = rh / P, gw = rw / P;
    const int64_t np = (int64_t)gh * gw, pd = 3LL * T * P * P;
    float *out = malloc(sizeof(float) * (size_t)(np * pd));
    float lut[3][256];
    if (!out) { gerbil_image_free(&r); return err_set(GERBIL_ERR_NOMEM, "image processor: out of memory"); }
    /* transformers: rescale in double cast to f32, then (x - mean) / std in f32 */
    for (int c = 0; c < 3; c++)
        for (int v = 0; v < 256; v++) {
            const float x = (float)((double)v * cfg->rescale_factor);
            lut[c][v] = (x - cfg->image_mean[c]) / cfg->image_std[c];
        }
    /* patch order (grid_t, bh, bw, mh, mw); within a patch (c, t, py, px); the one frame
     * repeated over the temporal patch */
    int64_t k = 0;
    for (int bh = 0; bh < gh / M; bh++)
        for (int bw = 0; bw < gw / M; bw++)
            for (int mh = 0; mh < M; mh++)
                for (int mw = 0; mw < M; mw++, k++) {
                    float *o = out + k * pd;
                    const int y0 = (bh * M + mh) * P, x0 = (bw * M + mw) * P;
                    for (int c = 0; c < 3; c++)
                        for (int t = 0; t < T; t++)
                            for (int py = 0; py < P; py++)
                                for (int px = 0; px < P; px++)
                                    *o++ = lut[c][r.rgb[((size_t)(y0 + py) * rw + x0 + px) * 3 + c]];
                }
    gerbil_image_free(&r);
    *pixels = out;
    *n_patches = np;
    *patch_dim = pd;
    grid_thw[0] = 1;
    grid_thw[1] = gh;
    grid_thw[2] = gw;
    return GERBIL_OK;
}

static gerbil_status num_field(const cJSON *o, const char *key, double lo, double hi, const char *path, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return GERBIL_OK;
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi))
        return err_set(GERBIL_ERR_FORMAT, "%s: \"%s\" must be a number in [%g, %g]", path, key, lo, hi);
    *out = v->valuedouble;
    return GERBIL_OK;
}

static gerbil_status triple_field(const cJSON *o, const char *key, int positive, const char *path, float out[3]) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return GERBIL_OK;
    if (cJSON_IsNumber(v)) { out[0] = out[1] = out[2] = (float)v->valuedouble; }
    else if (cJSON_IsArray(v) && cJSON_GetArraySize(v) == 3) {
        for (int i = 0; i < 3; i++) {
            const cJSON *e = cJSON_GetArrayItem(v, i);
            if (!cJSON_IsNumber(e)) return err_set(GERBIL_ERR_FORMAT, "%s: \"%s\" must hold 3 numbers", path, key);
            out[i] = (float)e->valuedouble;
        }
    } else return err_set(GERBIL_ERR_FORMAT, "%s: \"%s\" must be a number or 3 numbers", path, key);
    for (int i = 0; i < 3; i++)
        if (!isfinite(out[i]) || (positive && !(out[i] > 0)))
            return err_set(GERBIL_ERR_FORMAT, "%s: \"%s\" has a bad value %g", path, key, out[i]);
    return GERBIL_OK;
}

/* preprocessor_config.json as transformers' Qwen2VLImageProcessor reads it: the defaults of
 * its constructor (patch 14, temporal 2, merge 2, size 56*56 .. 28*28*1280, CLIP mean/std),
 * then the file's fields; min_pixels / max_pixels, where given, override size's
 * shortest_edge / longest_edge. */
gerbil_status gerbil_qwen_image_config_read(const char *path, gerbil_qwen_image_config *cfg) {
    *cfg = (gerbil_qwen_image_config){14, 2, 2, 56 * 56, 28 * 28 * 1280, 1.0 / 255,
                                      {0.48145466f, 0.4578275f, 0.40821073f}, {0.26862954f, 0.26130258f, 0.27577711f}};
    FILE *f = fopen(path, "rb");
    if (!f) return err_set(GERBIL_ERR_IO, "%s: cannot open", path);
    char buf[65536];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    const int more = fgetc(f) != EOF;
    fclose(f);
    if (more) return err_set(GERBIL_ERR_FORMAT, "%s: larger than 64 KiB", path);
    buf[n] = 0;
    cJSON *j = cJSON_Parse(buf);
    if (!cJSON_IsObject(j)) { cJSON_Delete(j); return err_set(GERBIL_ERR_FORMAT, "%s: not a JSON object", path); }
    double p = cfg->patch_size, t = cfg->temporal_patch_size, m = cfg->merge_size, lo = (double)cfg->min_pixels,
           hi = (double)cfg->max_pixels, rf = cfg->rescale_factor;
    gerbil_status st = GERBIL_OK;
    const cJSON *size = cJSON_GetObjectItemCaseSensitive(j, "size");
    if (!st) st = num_field(j, "patch_size", 1, 64, path, &p);
    if (!st) st = num_field(j, "temporal_patch_size", 1, 8, path, &t);
    if (!st) st = num_field(j, "merge_size", 1, 8, path, &m);
    if (!st && cJSON_IsObject(size)) st = num_field(size, "shortest_edge", 1, 1e12, path, &lo);
    if (!st && cJSON_IsObject(size)) st = num_field(size, "longest_edge", 1, 1e12, path, &hi);
    if (!st) st = num_field(j, "min_pixels", 1, 1e12, path, &lo);
    if (!st) st = num_field(j, "max_pixels", 1, 1e12, path, &hi);
    if (!st) st = num_field(j, "rescale_factor", 1e-9, 1e9, path, &rf);
    if (!st) st = triple_field(j, "image_mean", 0, path, cfg->image_mean);
    if (!st) st = triple_field(j, "image_std", 1, path, cfg->image_std);
    cJSON_Delete(j);
    if (st) return st;
    if (p != (int)p || t != (int)t || m != (int)m)
        return err_set(GERBIL_ERR_FORMAT, "%s: patch_size, temporal_patch_size and merge_size must be integers", path);
    if (lo > hi) return err_set(GERBIL_ERR_FORMAT, "%s: min pixels %.0f above max pixels %.0f", path, lo, hi);
    cfg->patch_size = (int)p;
    cfg->temporal_patch_size = (int)t;
    cfg->merge_size = (int)m;
    cfg->min_pixels = (int64_t)lo;
    cfg->max_pixels = (int64_t)hi;
    cfg->rescale_factor = rf;
    return GERBIL_OK;
}
