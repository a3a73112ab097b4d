/* The DAC decoder (transformers 5.17 models/dac/modeling_dac.py, DacModel.decode with
 * audio_codes) over the backend ops. Activations are f32 time-major [T][C].
 *
 *   z = sum_i out_proj_i(codebook_i[codes_i])          (1x1 convs, hidden_size channels)
 *   conv1 (k7, pad 3) -> decoder_hidden_size channels
 *   per upsampling ratio s (channels halve): snake -> ConvTranspose1d(k 2s, stride s,
 *     pad ceil(s/2)) -> 3 residual units (dilation 1, 3, 9):
 *       x + conv2_k1(snake(conv1_k7_dil(snake(x))))     (lengths are equal: pad 3 dil)
 *   snake -> conv2 (k7, pad 3, 1 channel) -> tanh
 *
 * A conv is im2col1d_pad + matmul with the weight [C_out][C_in * K] as PyTorch stores it,
 * run in tiles of output rows (the columns of a long waveform would not fit); a transposed
 * conv is matmul with the weight rearranged to [C_out * K][C_in] then col2im1d. Weight
 * norm is folded at load: w = g * v / ||v|| with the norm over all but dim 0 (torch's
 * weight_norm(dim=0)), summed in double. */
#include "tts/dac.h"

#include "backend/backend.h"
#include "base/fp16.h"
#include "base/status.h"
#include "io/json.h"
#include "io/safetensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { DAC_MAX_UP = 8, DAC_TILE = 2048 };

struct dac_conv {
    struct gb_weight w; /* conv: [C_out][C_in * K]; transposed: [C_out * K][C_in] */
    float *wdata, *bias;
    int cin, cout, K;
};
struct dac_res {
    float *a1, *a2;
    struct dac_conv c1, c2;
};
struct dac_block {
    float *alpha;
    struct dac_conv ct;
    int stride;
    struct dac_res r[3];
};
struct dac {
    struct st_checkpoint ck;
    struct backend *be;
    int hidden, dec_hidden, n_cb, cb_size, cb_dim, n_up, up[DAC_MAX_UP], sample_rate;
    float **codebook;          /* [n_cb][cb_size * cb_dim] */
    struct dac_conv *out_proj; /* [n_cb] */
    struct dac_conv conv1, conv2;
    struct dac_block blk[DAC_MAX_UP];
    float *alpha_out;
};

/* A tensor of a float type as f32 (malloc'd), its element count checked. */
static gerbil_status tensor_f32(const struct dac *d, const char *name, int64_t n, float **out) {
    const struct gb_tensor *t = st_checkpoint_find(&d->ck, name);
    if (!t) return err_set(GERBIL_ERR_FORMAT, "DAC checkpoint: missing tensor \"%s\"", name);
    if (tensor_nelements(t) != n)
        return err_set(GERBIL_ERR_FORMAT, "DAC checkpoint: tensor \"%s\" has %lld elements, expected %lld", name,
                       (long long)tensor_nelements(t), (long long)n);
    float *f = malloc((size_t)n * sizeof *f + 1);
    if (!f) return err_set(GERBIL_ERR_NOMEM, "out of memory loading \"%s\"", name);
    for (int64_t i = 0; i < n; i++) {
        switch (t->type) {
        case GB_TYPE_F32: memcpy(&f[i], (const char *)t->data + 4 * i, 4); break;
        case GB_TYPE_F16: f[i] = f16_to_f32(((const uint16_t *)t->data)[i]); break;
        case GB_TYPE_BF16: f[i] = bf16_to_f32(((const uint16_t *)t->data)[i]); break;
        default:
            free(f);
            return err_set(GERBIL_ERR_UNSUPPORTED, "DAC checkpoint: tensor \"%s\": dtype %s (the codec must be "
                           "F32, F16 or BF16)", name, type_name(t->type));
        }
    }
    *out = f;
    return GERBIL_OK;
}

/* The weight of the module at pre (n = d0 * rest elements, dim 0 of size d0), plain or
 * weight-normed, as f32. */
static gerbil_status conv_weight(const struct dac *d, const char *pre, int64_t d0, int64_t rest, float **out) {
    char n1[400], n2[400];
    snprintf(n1, sizeof n1, "%s.weight", pre);
    if (st_checkpoint_find(&d->ck, n1)) return tensor_f32(d, n1, d0 * rest, out);
    snprintf(n1, sizeof n1, "%s.parametrizations.weight.original0", pre);
    snprintf(n2, sizeof n2, "%s.parametrizations.weight.original1", pre);
    if (!st_checkpoint_find(&d->ck, n1)) {
        snprintf(n1, sizeof n1, "%s.weight_g", pre);
        snprintf(n2, sizeof n2, "%s.weight_v", pre);
    }
    if (!st_checkpoint_find(&d->ck, n1))
        return err_set(GERBIL_ERR_FORMAT, "DAC checkpoint: missing tensor \"%s.weight\" (nor its weight-norm "
                       "g and v)", pre);
    float *g = NULL, *v = NULL;
    gerbil_status st = tensor_f32(d, n1, d0, &g);
    if (st == GERBIL_OK) st = tensor_f32(d, n2, d0 * rest, &v);
    if (st != GERBIL_OK) {
        free(g);
        free(v);
        return st;
    }
    for (int64_t i = 0; i < d0; i++) {
        double s = 0;
        for (int64_t j = 0; j < rest; j++) s += (double)v[i * rest + j] * v[i * rest + j];
        const double f = s > 0 ? g[i] / sqrt(s) : 0;
        for (int64_t j = 0; j < rest; j++) v[i * rest + j] = (float)(v[i * rest + j] * f);
    }
    free(g);
    *out = v;
    return GERBIL_OK;
}

static void conv_weight_set(struct dac *d, struct dac_conv *c, int64_t n_out, int64_t n_in, const char *name) {
    c->w = (struct gb_weight){.kind = GB_WEIGHT_PLAIN, .type = GB_TYPE_F32, .n_out = n_out, .n_in = n_in,
                              .data = c->wdata, .row_bytes = (size_t)n_in * sizeof(float), .name = name};
    d->be->ops->weight_prepare(d->be, &c->w, 1, 0);
}

static gerbil_status load_conv(struct dac *d, const char *pre, int cin, int cout, int K, int transposed,
                               struct dac_conv *c) {
    c->cin = cin, c->cout = cout, c->K = K;
    char n[320];
    if (!transposed) {
        GB_TRY(conv_weight(d, pre, cout, (int64_t)cin * K, &c->wdata));
        conv_weight_set(d, c, cout, (int64_t)cin * K, pre);
    } else { /* stored [C_in][C_out][K] -> [C_out * K][C_in] */
        float *w = NULL;
        GB_TRY(conv_weight(d, pre, cin, (int64_t)cout * K, &w));
        c->wdata = malloc((size_t)cin * cout * K * sizeof(float));
        if (!c->wdata) {
            free(w);
            return err_set(GERBIL_ERR_NOMEM, "out of memory loading \"%s\"", pre);
        }
        for (int ci = 0; ci < cin; ci++)
            for (int r = 0; r < cout * K; r++) c->wdata[(size_t)r * cin + ci] = w[(size_t)ci * cout * K + r];
        free(w);
        conv_weight_set(d, c, (int64_t)cout * K, cin, pre);
    }
    snprintf(n, sizeof n, "%s.bias", pre);
    return tensor_f32(d, n, cout, &c->bias);
}

static gerbil_status load_alpha(struct dac *d, const char *pre, int C, float **out) {
    char n[400];
    snprintf(n, sizeof n, "%s.alpha", pre);
    return tensor_f32(d, n, C, out);
}

static gerbil_status dac_config(struct dac *d, const char *dir) {
    char p[4096];
    snprintf(p, sizeof p, "%s/config.json", dir);
    cJSON *j = NULL;
    GB_TRY(json_load_file(p, &j));
    d->hidden = (int)json_get_int(j, "hidden_size", 1024);
    d->dec_hidden = (int)json_get_int(j, "decoder_hidden_size", 1536);
    d->n_cb = (int)json_get_int(j, "n_codebooks", 9);
    d->cb_size = (int)json_get_int(j, "codebook_size", 1024);
    d->cb_dim = (int)json_get_int(j, "codebook_dim", 8);
    d->sample_rate = (int)json_get_int(j, "sampling_rate", 16000);
    const cJSON *up = cJSON_GetObjectItemCaseSensitive(j, "upsampling_ratios");
    d->n_up = cJSON_IsArray(up) ? cJSON_GetArraySize(up) : 0;
    gerbil_status st = GERBIL_OK;
    if (d->n_up < 1 || d->n_up > DAC_MAX_UP) {
        st = err_set(GERBIL_ERR_FORMAT, "%s: upsampling_ratios must be a list of 1 to %d ratios", p, DAC_MAX_UP);
    } else {
        for (int i = 0; i < d->n_up; i++) {
            const cJSON *e = cJSON_GetArrayItem(up, i);
            d->up[i] = cJSON_IsNumber(e) ? (int)e->valuedouble : 0;
            if (d->up[i] < 1 || d->up[i] > 64) st = err_set(GERBIL_ERR_FORMAT, "%s: upsampling ratio %d is not in "
                                                         "1..64", p, d->up[i]);
        }
    }
    if (st == GERBIL_OK && (d->hidden < 1 || d->dec_hidden < 1 || d->n_cb < 1 || d->n_cb > 64 || d->cb_size < 1 ||
                            d->cb_dim < 1 || d->hidden > 65536 || d->dec_hidden > 65536 || d->cb_dim > 4096 ||
                            d->cb_size > (1 << 20) || d->sample_rate < 1))
        st = err_set(GERBIL_ERR_FORMAT, "%s: a DacConfig size is out of range", p);
    if (st == GERBIL_OK && d->dec_hidden >> d->n_up < 1)
        st = err_set(GERBIL_ERR_FORMAT, "%s: decoder_hidden_size %d halves to 0 over %d upsampling blocks", p,
                     d->dec_hidden, d->n_up);
    cJSON_Delete(j);
    return st;
}

static gerbil_status dac_bind(struct dac *d) {
    char n[128];
    d->codebook = calloc((size_t)d->n_cb, sizeof *d->codebook);
    d->out_proj = calloc((size_t)d->n_cb, sizeof *d->out_proj);
    if (!d->codebook || !d->out_proj) return err_set(GERBIL_ERR_NOMEM, "out of memory loading DAC");
    for (int i = 0; i < d->n_cb; i++) {
        snprintf(n, sizeof n, "quantizer.quantizers.%d.codebook.weight", i);
        GB_TRY(tensor_f32(d, n, (int64_t)d->cb_size * d->cb_dim, &d->codebook[i]));
        snprintf(n, sizeof n, "quantizer.quantizers.%d.out_proj", i);
        GB_TRY(load_conv(d, n, d->cb_dim, d->hidden, 1, 0, &d->out_proj[i]));
    }
    GB_TRY(load_conv(d, "decoder.conv1", d->hidden, d->dec_hidden, 7, 0, &d->conv1));
    int C = d->dec_hidden;
    for (int b = 0; b < d->n_up; b++) {
        struct dac_block *B = &d->blk[b];
        const int s = d->up[b], Co = C / 2;
        B->stride = s;
        snprintf(n, sizeof n, "decoder.block.%d.snake1", b);
        GB_TRY(load_alpha(d, n, C, &B->alpha));
        snprintf(n, sizeof n, "decoder.block.%d.conv_t1", b);
        GB_TRY(load_conv(d, n, C, Co, 2 * s, 1, &B->ct));
        for (int r = 0; r < 3; r++) {
            snprintf(n, sizeof n, "decoder.block.%d.res_unit%d.snake1", b, r + 1);
            GB_TRY(load_alpha(d, n, Co, &B->r[r].a1));
            snprintf(n, sizeof n, "decoder.block.%d.res_unit%d.snake2", b, r + 1);
            GB_TRY(load_alpha(d, n, Co, &B->r[r].a2));
            snprintf(n, sizeof n, "decoder.block.%d.res_unit%d.conv1", b, r + 1);
            GB_TRY(load_conv(d, n, Co, Co, 7, 0, &B->r[r].c1));
            snprintf(n, sizeof n, "decoder.block.%d.res_unit%d.conv2", b, r + 1);
            GB_TRY(load_conv(d, n, Co, Co, 1, 0, &B->r[r].c2));
        }
        C = Co;
    }
    GB_TRY(load_alpha(d, "decoder.snake1", C, &d->alpha_out));
    GB_TRY(load_conv(d, "decoder.conv2", C, 1, 7, 0, &d->conv2));
    if (d->be->ops->weight_status) GB_TRY(d->be->ops->weight_status(d->be));
    return GERBIL_OK;
}

gerbil_status dac_load(const char *dir, const char *backend, int n_threads, struct dac **out) {
    *out = NULL;
    struct dac *d = calloc(1, sizeof *d);
    if (!d) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    gerbil_status st = dac_config(d, dir);
    if (st == GERBIL_OK) st = st_checkpoint_open(dir, &d->ck);
    if (st == GERBIL_OK) st = backend_new(backend, n_threads, &d->be);
    if (st == GERBIL_OK) {
        const struct backend_ops *o = d->be->ops;
        const struct { const char *name; const void *fn; } need[] = {
            {"im2col1d_pad", (const void *)o->im2col1d_pad}, {"col2im1d", (const void *)o->col2im1d},
            {"snake", (const void *)o->snake}, {"unary (tanh)", (const void *)o->unary},
        };
        for (size_t i = 0; i < sizeof need / sizeof need[0] && st == GERBIL_OK; i++)
            if (!need[i].fn)
                st = err_set(GERBIL_ERR_UNSUPPORTED, "the %s backend has no %s op, which the DAC codec needs (run "
                             "it with --device cpu)", o->name, need[i].name);
    }
    if (st == GERBIL_OK) st = dac_bind(d);
    if (st != GERBIL_OK) {
        dac_free(d);
        return st;
    }
    *out = d;
    return GERBIL_OK;
}

static void conv_free(struct dac_conv *c) {
    free(c->wdata);
    free(c->bias);
}

void dac_free(struct dac *d) {
    if (!d) return;
    for (int i = 0; d->codebook && i < d->n_cb; i++) free(d->codebook[i]);
    for (int i = 0; d->out_proj && i < d->n_cb; i++) conv_free(&d->out_proj[i]);
    free(d->codebook);
    free(d->out_proj);
    conv_free(&d->conv1);
    conv_free(&d->conv2);
    for (int b = 0; b < d->n_up; b++) {
        struct dac_block *B = &d->blk[b];
        free(B->alpha);
        conv_free(&B->ct);
        for (int r = 0; r < 3; r++) {
            free(B->r[r].a1);
            free(B->r[r].a2);
            conv_free(&B->r[r].c1);
            conv_free(&B->r[r].c2);
        }
    }
    free(d->alpha_out);
    if (d->be) backend_free(d->be);
    st_checkpoint_close(&d->ck);
    free(d);
}

int dac_n_codebooks(const struct dac *d) { return d->n_cb; }
int dac_codebook_size(const struct dac *d) { return d->cb_size; }
int dac_sample_rate(const struct dac *d) { return d->sample_rate; }

static int64_t up_len(int64_t T, int s) { return (T - 1) * s - 2 * ((s + 1) / 2) + 2 * s; }

int64_t dac_samples_out(const struct dac *d, int n_frames) {
    int64_t T = n_frames;
    for (int b = 0; b < d->n_up; b++) T = up_len(T, d->up[b]);
    return T;
}

/* y [T][cout] = conv(x [T][cin]) with kernel K, dilation dil, pad (K - 1) dil / 2 (same length). */
static void conv_same(struct backend *be, float *y, const float *x, int T, const struct dac_conv *c, int dil,
                      float *col) {
    if (c->K == 1) {
        op_matmul(be, y, x, &c->w, c->bias, (struct gb_rows){T, NULL});
        return;
    }
    const int pad = (c->K - 1) * dil / 2;
    for (int t0 = 0; t0 < T; t0 += DAC_TILE) {
        const int n = T - t0 < DAC_TILE ? T - t0 : DAC_TILE;
        op_im2col1d_pad(be, col, x, T, c->cin, c->K, 1, dil, pad, t0, n);
        op_matmul(be, y + (size_t)t0 * c->cout, col, &c->w, c->bias, (struct gb_rows){n, NULL});
    }
}

gerbil_status dac_decode(struct dac *d, const int32_t *codes, int n_cb, int T, float **pcm, int64_t *n_out,
                         float **pre_tanh) {
    *pcm = NULL;
    *n_out = 0;
    if (pre_tanh) *pre_tanh = NULL;
    if (n_cb < 1 || n_cb > d->n_cb)
        return err_set(GERBIL_ERR_INVALID_ARG, "DAC decode: %d codebooks given, the codec has %d", n_cb, d->n_cb);
    if (T < 1) return err_set(GERBIL_ERR_INVALID_ARG, "DAC decode: no code frames");
    for (int64_t i = 0; i < (int64_t)n_cb * T; i++)
        if (codes[i] < 0 || codes[i] >= d->cb_size)
            return err_set(GERBIL_ERR_INVALID_ARG, "DAC decode: code %d (codebook %d, frame %d) is not in 0..%d",
                           codes[i], (int)(i / T), (int)(i % T), d->cb_size - 1);
    struct backend *be = d->be;
    /* sizes: the largest activation and the largest column tile */
    size_t max_act = (size_t)T * (d->hidden > d->dec_hidden ? d->hidden : d->dec_hidden), max_col = 0;
    size_t colw = (size_t)7 * (d->hidden > d->dec_hidden ? d->hidden : d->dec_hidden);
    int64_t Tb = T;
    int C = d->dec_hidden;
    for (int b = 0; b < d->n_up; b++) {
        Tb = up_len(Tb, d->up[b]);
        if (Tb < 1 || Tb > ((int64_t)1 << 30)) return err_set(GERBIL_ERR_INVALID_ARG, "DAC decode: %d frames are "
                                                              "too many", T);
        const size_t z = (size_t)(Tb > T ? Tb : T) * C; /* the transposed conv's z: T_in * C/2 * 2s */
        const size_t a = (size_t)Tb * (C / 2);
        if (z * 2 > max_act) max_act = z * 2;
        if (a > max_act) max_act = a;
        C /= 2;
        if ((size_t)7 * C > colw) colw = (size_t)7 * C;
    }
    max_col = colw * DAC_TILE;
    const int64_t N = Tb;
    float *A = malloc(max_act * sizeof(float)), *B = malloc(max_act * sizeof(float)),
          *H = malloc(max_act * sizeof(float)), *col = malloc(max_col * sizeof(float)),
          *e = malloc((size_t)T * d->cb_dim * sizeof(float)), *out = malloc((size_t)N * sizeof(float) + 4);
    gerbil_status st = GERBIL_OK;
    if (!A || !B || !H || !col || !e || !out) {
        st = err_set(GERBIL_ERR_NOMEM, "out of memory decoding %d DAC frames", T);
        goto done;
    }
    /* quantizer.from_codes: A = sum_i out_proj_i(codebook_i[codes_i]) */
    for (int i = 0; i < n_cb; i++) {
        for (int t = 0; t < T; t++)
            memcpy(e + (size_t)t * d->cb_dim, d->codebook[i] + (size_t)codes[(size_t)i * T + t] * d->cb_dim,
                   (size_t)d->cb_dim * sizeof(float));
        op_matmul(be, i ? B : A, e, &d->out_proj[i].w, d->out_proj[i].bias, (struct gb_rows){T, NULL});
        if (i)
            for (size_t k = 0; k < (size_t)T * d->hidden; k++) A[k] += B[k];
    }
    conv_same(be, B, A, T, &d->conv1, 1, col);
    float *x = B, *y = A;
    int64_t Tc = T;
    C = d->dec_hidden;
    for (int b = 0; b < d->n_up; b++) {
        const struct dac_block *Bk = &d->blk[b];
        const int s = Bk->stride, Co = C / 2, K = 2 * s;
        const int64_t To = up_len(Tc, s);
        op_snake(be, x, Bk->alpha, (int)Tc, C);
        op_matmul(be, y, x, &Bk->ct.w, NULL, (struct gb_rows){(int)Tc, NULL}); /* z [Tc][Co * K] */
        op_col2im1d(be, x, y, Bk->ct.bias, (int)Tc, Co, K, s, (s + 1) / 2, (int)To);
        Tc = To;
        C = Co;
        for (int r = 0; r < 3; r++) {
            const struct dac_res *R = &Bk->r[r];
            memcpy(H, x, (size_t)Tc * C * sizeof(float));
            op_snake(be, H, R->a1, (int)Tc, C);
            conv_same(be, y, H, (int)Tc, &R->c1, r == 0 ? 1 : r == 1 ? 3 : 9, col);
            op_snake(be, y, R->a2, (int)Tc, C);
            op_matmul(be, H, y, &R->c2.w, R->c2.bias, (struct gb_rows){(int)Tc, NULL});
            for (size_t k = 0; k < (size_t)Tc * C; k++) x[k] += H[k];
        }
    }
    op_snake(be, x, d->alpha_out, (int)Tc, C);
    conv_same(be, out, x, (int)Tc, &d->conv2, 1, col);
    if (pre_tanh) {
        *pre_tanh = malloc((size_t)N * sizeof(float) + 4);
        if (!*pre_tanh) {
            st = err_set(GERBIL_ERR_NOMEM, "out of memory");
            goto done;
        }
        memcpy(*pre_tanh, out, (size_t)N * sizeof(float));
    }
    op_unary(be, out, (long)N, GB_UNARY_TANH);
    *pcm = out;
    *n_out = N;
    out = NULL;
done:
    free(A);
    free(B);
    free(H);
    free(col);
    free(e);
    free(out);
    return st;
}
