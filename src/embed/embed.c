/* Text embeddings: a sentence-transformers folder over a loaded model (gerbil.h).
 *
 * modules.json chains Transformer -> Pooling -> Dense ... -> Normalize (sentence-transformers
 * 6: base/modules/{transformer,dense,normalize}.py, sentence_transformer/modules/pooling.py).
 * The Transformer is the model: a context with embeddings = 1 gives the final-normed hidden
 * state of each row asked for (all rows for mean / max pooling, one for cls / lasttoken),
 * in the model's own attention (causal, or bidirectional for EmbeddingGemma). Texts are
 * packed into batches, each text its own sequence, evaluated whole (no padding, no chunks);
 * the context's batch invariance makes a text's rows the same in any batch. Pooling, the
 * Dense layers and the normalisation run here on the host in f32 (sums in double). */
#include "model/model.h"
#include "base/status.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "tensor/dtype.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum pool_mode { POOL_CLS, POOL_MEAN, POOL_MAX, POOL_MEAN_SQRT, POOL_WEIGHTED_MEAN, POOL_LAST };
static const char *const pool_names[] = {"cls", "mean", "max", "mean_sqrt_len_tokens", "weightedmean", "lasttoken"};
/* the legacy boolean keys of 1_Pooling/config.json, in the order sentence-transformers reads them */
static const struct { const char *key; enum pool_mode mode; } legacy_pool[] = {
    {"pooling_mode_cls_token", POOL_CLS}, {"pooling_mode_max_tokens", POOL_MAX},
    {"pooling_mode_mean_tokens", POOL_MEAN}, {"pooling_mode_mean_sqrt_len_tokens", POOL_MEAN_SQRT},
    {"pooling_mode_weightedmean_tokens", POOL_WEIGHTED_MEAN}, {"pooling_mode_lasttoken", POOL_LAST},
};

enum act { ACT_IDENTITY, ACT_TANH, ACT_RELU, ACT_SIGMOID, ACT_GELU };
static const struct { const char *name; enum act act; } dense_acts[] = {
    {"torch.nn.modules.linear.Identity", ACT_IDENTITY}, {"torch.nn.modules.activation.Tanh", ACT_TANH},
    {"torch.nn.modules.activation.ReLU", ACT_RELU},     {"torch.nn.modules.activation.Sigmoid", ACT_SIGMOID},
    {"torch.nn.modules.activation.GELU", ACT_GELU},
};

enum { STEP_DENSE, STEP_NORMALIZE, MAX_STEPS = 16, MAX_MODES = 6, EMBED_SEQS = 64, EMBED_MAX_TOKENS = 4096 };

struct step {
    int kind;
    int in, out;
    float *w, *b; /* Dense: [out][in], [out] or NULL */
    enum act act;
};

struct gerbil_embedder {
    struct gerbil_model *model;
    gerbil_tokenizer_t tok;
    gerbil_context_t ctx;
    int D;                   /* hidden size */
    enum pool_mode modes[MAX_MODES];
    int n_modes;
    int include_prompt;
    int all_rows;            /* some mode reads every row */
    struct step steps[MAX_STEPS];
    int n_steps;
    int dim;                 /* the output size */
    int max_tokens;
    int32_t eos_append;      /* lasttoken pooling: appended when a text does not end with it (-1: none) */
    char *prompt_blob;       /* names: NUL-separated, then "" */
    char **prompt_names, **prompt_texts;
    int n_prompts;
    char *default_prompt;
    float *work;             /* 2 x widest */
    int widest;
};

/* ---- the folder ---- */

static gerbil_status load_json(const char *dir, const char *sub, const char *file, int required, cJSON **out) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s%s%s", dir, sub, sub[0] ? "/" : "", file);
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return required ? err_set(GERBIL_ERR_IO, "%s: missing (a sentence-transformers module needs it)", path)
                            : GERBIL_OK;
    fclose(f);
    return json_load_file(path, out);
}

static gerbil_status read_pooling(struct gerbil_embedder *e, const char *dir, const char *sub) {
    cJSON *c;
    GB_TRY(load_json(dir, sub, "config.json", 1, &c));
    gerbil_status st = GERBIL_OK;
    int dim = (int)json_get_int(c, "embedding_dimension", json_get_int(c, "word_embedding_dimension", e->D));
    if (dim != e->D) {
        st = err_set(GERBIL_ERR_FORMAT, "%s/%s/config.json: embedding dimension %d, but the model's hidden size is %d",
                     dir, sub, dim, e->D);
        goto done;
    }
    e->include_prompt = json_get_bool(c, "include_prompt", 1);
    const cJSON *pm = cJSON_GetObjectItemCaseSensitive(c, "pooling_mode");
    if (cJSON_IsString(pm) || cJSON_IsArray(pm)) {
        int n = cJSON_IsArray(pm) ? cJSON_GetArraySize(pm) : 1;
        for (int i = 0; i < n; i++) {
            const cJSON *s = cJSON_IsArray(pm) ? cJSON_GetArrayItem(pm, i) : pm;
            int found = -1;
            for (int k = 0; cJSON_IsString(s) && k < (int)(sizeof pool_names / sizeof pool_names[0]); k++)
                if (!strcmp(s->valuestring, pool_names[k])) found = k;
            if (found < 0 || e->n_modes >= MAX_MODES) {
                st = err_set(GERBIL_ERR_UNSUPPORTED, "%s/%s/config.json: pooling_mode \"%s\" is not one of cls, mean, "
                             "max, mean_sqrt_len_tokens, weightedmean, lasttoken", dir, sub,
                             cJSON_IsString(s) ? s->valuestring : "?");
                goto done;
            }
            e->modes[e->n_modes++] = (enum pool_mode)found;
        }
    } else {
        for (size_t k = 0; k < sizeof legacy_pool / sizeof legacy_pool[0]; k++)
            if (json_get_bool(c, legacy_pool[k].key, 0)) e->modes[e->n_modes++] = legacy_pool[k].mode;
        if (!e->n_modes) e->modes[e->n_modes++] = POOL_MEAN; /* sentence-transformers' default */
    }
    for (int i = 0; i < e->n_modes; i++) e->all_rows |= e->modes[i] != POOL_CLS && e->modes[i] != POOL_LAST;
    e->dim = e->n_modes * e->D;
done:
    cJSON_Delete(c);
    return st;
}

/* A float tensor of exactly n elements as f32 (malloc'd). */
static gerbil_status tensor_f32(const struct st_file *f, const char *path, const char *name, int64_t n, float **out) {
    const struct gb_tensor *t = st_file_find(f, name);
    if (!t) return err_set(GERBIL_ERR_FORMAT, "%s: missing tensor \"%s\"", path, name);
    if (tensor_nelements(t) != n || (t->type != GB_TYPE_F32 && t->type != GB_TYPE_F16 && t->type != GB_TYPE_BF16))
        return err_set(GERBIL_ERR_FORMAT, "%s: tensor \"%s\" is %s with %lld elements, expected %lld floats", path,
                       name, type_name(t->type), (long long)tensor_nelements(t), (long long)n);
    *out = malloc((size_t)n * sizeof(float));
    if (!*out) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    type_to_f32(t->type, t->data, *out, n);
    return GERBIL_OK;
}

static gerbil_status read_dense(struct gerbil_embedder *e, const char *dir, const char *sub, int in) {
    if (e->n_steps >= MAX_STEPS) return err_set(GERBIL_ERR_UNSUPPORTED, "%s/modules.json: too many modules", dir);
    cJSON *c;
    GB_TRY(load_json(dir, sub, "config.json", 1, &c));
    struct step *s = &e->steps[e->n_steps];
    *s = (struct step){.kind = STEP_DENSE, .in = (int)json_get_int(c, "in_features", 0),
                       .out = (int)json_get_int(c, "out_features", 0)};
    const int bias = json_get_bool(c, "bias", 1);
    const char *act = json_get_str(c, "activation_function", "torch.nn.modules.activation.Tanh");
    gerbil_status st = GERBIL_OK;
    int found = -1;
    for (size_t k = 0; k < sizeof dense_acts / sizeof dense_acts[0]; k++)
        if (!strcmp(act, dense_acts[k].name)) found = (int)k;
    if (found < 0)
        st = err_set(GERBIL_ERR_UNSUPPORTED, "%s/%s/config.json: activation_function \"%s\" is not supported "
                     "(Identity, Tanh, ReLU, Sigmoid, GELU)", dir, sub, act);
    else if (json_get_bool(c, "use_residual", 0))
        st = err_set(GERBIL_ERR_UNSUPPORTED, "%s/%s/config.json: use_residual is not supported", dir, sub);
    else if (s->in != in || s->out < 1 || s->out > (1 << 20))
        st = err_set(GERBIL_ERR_FORMAT, "%s/%s/config.json: in_features %d / out_features %d, but the embedding "
                     "coming in has %d", dir, sub, s->in, s->out, in);
    else if (strcmp(json_get_str(c, "module_input_name", "sentence_embedding"), "sentence_embedding") ||
             strcmp(json_get_str(c, "module_output_name", "sentence_embedding"), "sentence_embedding"))
        st = err_set(GERBIL_ERR_UNSUPPORTED, "%s/%s/config.json: a Dense module on other features than "
                     "sentence_embedding is not supported", dir, sub);
    cJSON_Delete(c);
    if (st != GERBIL_OK) return st;
    s->act = dense_acts[found].act;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s/model.safetensors", dir, sub);
    struct st_file f;
    st = st_file_open(path, &f);
    if (st != GERBIL_OK) return st;
    st = tensor_f32(&f, path, "linear.weight", (int64_t)s->in * s->out, &s->w);
    if (st == GERBIL_OK && bias) st = tensor_f32(&f, path, "linear.bias", s->out, &s->b);
    st_file_close(&f);
    e->n_steps++; /* freed with the embedder either way */
    return st;
}

static gerbil_status read_prompts(struct gerbil_embedder *e, const char *dir) {
    cJSON *c;
    GB_TRY(load_json(dir, "", "config_sentence_transformers.json", 0, &c));
    if (!c) return GERBIL_OK;
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(c, "prompts"), *it;
    if (!cJSON_IsObject(p)) p = NULL;
    gerbil_status st = GERBIL_OK;
    size_t blob = 1;
    int n = 0;
    cJSON_ArrayForEach(it, p) {
        if (!cJSON_IsString(it)) {
            st = err_set(GERBIL_ERR_FORMAT, "%s/config_sentence_transformers.json: prompt \"%s\" is not a string", dir,
                         it->string);
            goto done;
        }
        blob += strlen(it->string) + 1;
        n++;
    }
    e->prompt_blob = calloc(blob, 1);
    e->prompt_names = calloc((size_t)n + 1, sizeof *e->prompt_names);
    e->prompt_texts = calloc((size_t)n + 1, sizeof *e->prompt_texts);
    if (!e->prompt_blob || !e->prompt_names || !e->prompt_texts) {
        st = err_set(GERBIL_ERR_NOMEM, "out of memory");
        goto done;
    }
    char *w = e->prompt_blob;
    cJSON_ArrayForEach(it, p) {
        e->prompt_names[e->n_prompts] = w;
        e->prompt_texts[e->n_prompts] = strdup(it->valuestring);
        if (!e->prompt_texts[e->n_prompts]) {
            st = err_set(GERBIL_ERR_NOMEM, "out of memory");
            goto done;
        }
        e->n_prompts++;
        strcpy(w, it->string);
        w += strlen(it->string) + 1;
    }
    const char *def = json_get_str(c, "default_prompt_name", NULL);
    if (def && !(e->default_prompt = strdup(def))) st = err_set(GERBIL_ERR_NOMEM, "out of memory");
done:
    cJSON_Delete(c);
    return st;
}

/* modules.json, or for a bare model folder the pooling its family uses. */
static gerbil_status read_modules(struct gerbil_embedder *e, const char *dir) {
    const struct model_config *c = &e->model->cfg;
    cJSON *mods;
    GB_TRY(load_json(dir, "", "modules.json", 0, &mods));
    if (!mods) {
        if (!c->no_lm_head)
            return err_set(GERBIL_ERR_UNSUPPORTED, "%s is not an embedding model: %s generates text, and the folder "
                           "has no modules.json (a sentence-transformers model)", dir, c->arch_name);
        /* Qwen3-Embedding: the last token; EmbeddingGemma and the rest: the mean */
        e->modes[e->n_modes++] = c->arch == ARCH_QWEN3 ? POOL_LAST : POOL_MEAN;
        e->all_rows = e->modes[0] != POOL_LAST;
        e->include_prompt = 1;
        e->dim = e->D;
        e->steps[e->n_steps++] = (struct step){.kind = STEP_NORMALIZE};
        return GERBIL_OK;
    }
    gerbil_status st = GERBIL_OK;
    if (!cJSON_IsArray(mods) || cJSON_GetArraySize(mods) < 1) {
        st = err_set(GERBIL_ERR_FORMAT, "%s/modules.json: not a list of modules", dir);
        goto done;
    }
    int pooled = 0, i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, mods) {
        const char *type = json_get_str(m, "type", ""), *path = json_get_str(m, "path", "");
        const char *cls = strrchr(type, '.') ? strrchr(type, '.') + 1 : type;
        if (strstr(path, "..")) {
            st = err_set(GERBIL_ERR_FORMAT, "%s/modules.json: module path \"%s\" leaves the folder", dir, path);
            goto done;
        }
        if (i == 0 && strcmp(cls, "Transformer")) {
            st = err_set(GERBIL_ERR_UNSUPPORTED, "%s/modules.json: the first module is %s, not a Transformer", dir, type);
            goto done;
        }
        if (i == 0) {
            if (path[0] && strcmp(path, ".")) {
                st = err_set(GERBIL_ERR_UNSUPPORTED, "%s/modules.json: the Transformer in \"%s/\" (give that folder as "
                             "the model: only a Transformer at the folder's root is read)", dir, path);
                goto done;
            }
        } else if (!strcmp(cls, "Pooling") && !pooled) {
            if ((st = read_pooling(e, dir, path)) != GERBIL_OK) goto done;
            pooled = 1;
        } else if (!strcmp(cls, "Dense") && pooled) {
            if ((st = read_dense(e, dir, path, e->dim)) != GERBIL_OK) goto done;
            e->dim = e->steps[e->n_steps - 1].out;
        } else if (!strcmp(cls, "Normalize") && pooled && e->n_steps < MAX_STEPS) {
            e->steps[e->n_steps++] = (struct step){.kind = STEP_NORMALIZE};
        } else {
            st = err_set(GERBIL_ERR_UNSUPPORTED, "%s/modules.json: module %d (%s) is not supported%s: gerbil runs "
                         "Transformer -> Pooling -> Dense ... -> Normalize", dir, i, type,
                         pooled || strcmp(cls, "Dense") ? "" : " before a Pooling");
            goto done;
        }
        i++;
    }
    if (!pooled) st = err_set(GERBIL_ERR_UNSUPPORTED, "%s/modules.json: no Pooling module", dir);
done:
    cJSON_Delete(mods);
    return st;
}

/* The longest input: sentence_bert_config.json's max_seq_length, else the trained context,
 * capped at EMBED_MAX_TOKENS (each text is one batch). */
static gerbil_status read_max_tokens(struct gerbil_embedder *e, const char *dir) {
    cJSON *c;
    GB_TRY(load_json(dir, "", "sentence_bert_config.json", 0, &c));
    int64_t n = json_get_int(c, "max_seq_length", e->model->cfg.n_ctx_train);
    gerbil_status st = GERBIL_OK;
    if (c && json_get_bool(c, "do_lower_case", 0))
        st = err_set(GERBIL_ERR_UNSUPPORTED, "%s/sentence_bert_config.json: do_lower_case is not supported", dir);
    cJSON_Delete(c);
    if (n < 1) n = e->model->cfg.n_ctx_train;
    if (n > e->model->cfg.n_ctx_train) n = e->model->cfg.n_ctx_train;
    e->max_tokens = n > EMBED_MAX_TOKENS ? EMBED_MAX_TOKENS : (int)n;
    return st;
}

gerbil_status gerbil_embedder_new(gerbil_model_t model, gerbil_tokenizer_t tok, const char *dir,
                                  gerbil_embedder_t *out) {
    *out = NULL;
    if (!model || !tok || !dir) return err_set(GERBIL_ERR_INVALID_ARG, "an embedder needs a model, a tokenizer and a folder");
    struct gerbil_embedder *e = calloc(1, sizeof *e);
    if (!e) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    e->model = model;
    e->tok = tok;
    e->D = model->cfg.n_embd;
    e->eos_append = -1;
    gerbil_status st = read_modules(e, dir);
    if (st == GERBIL_OK) st = read_prompts(e, dir);
    if (st == GERBIL_OK) st = read_max_tokens(e, dir);
    if (st == GERBIL_OK) {
        e->widest = e->n_modes * e->D;
        for (int i = 0; i < e->n_steps; i++) if (e->steps[i].out > e->widest) e->widest = e->steps[i].out;
        if (!(e->work = malloc(2 * (size_t)e->widest * sizeof(float)))) st = err_set(GERBIL_ERR_NOMEM, "out of memory");
    }
    if (st == GERBIL_OK) {
        for (int i = 0; i < e->n_modes; i++)
            if (e->modes[i] == POOL_LAST) { /* Qwen3-Embedding ends every input with <|endoftext|> */
                int32_t *ids = NULL;
                int n = 0;
                if (gerbil_tokenize(tok, "<|endoftext|>", 13, 0, &ids, &n) == GERBIL_OK && n == 1) e->eos_append = ids[0];
                else e->eos_append = gerbil_tokenizer_eos(tok);
                free(ids);
            }
        gerbil_context_params p = gerbil_context_default_params();
        p.n_ctx = p.n_batch = e->max_tokens;
        p.n_seq_max = EMBED_SEQS;
        p.kv_type = GERBIL_KV_F32;
        p.embeddings = 1;
        st = gerbil_context_new(model, &p, &e->ctx);
    }
    if (st != GERBIL_OK) {
        gerbil_embedder_free(e);
        return st;
    }
    *out = e;
    return GERBIL_OK;
}

void gerbil_embedder_free(gerbil_embedder_t e) {
    if (!e) return;
    gerbil_context_free(e->ctx);
    for (int i = 0; i < e->n_steps; i++) {
        free(e->steps[i].w);
        free(e->steps[i].b);
    }
    for (int i = 0; i < e->n_prompts; i++) free(e->prompt_texts[i]);
    free(e->prompt_texts);
    free(e->prompt_names);
    free(e->prompt_blob);
    free(e->default_prompt);
    free(e->work);
    free(e);
}

int gerbil_model_is_embedding(gerbil_model_t m) { return m->cfg.no_lm_head; }
int gerbil_embedder_dim(gerbil_embedder_t e) { return e->dim; }
int gerbil_embedder_max_tokens(gerbil_embedder_t e) { return e->max_tokens; }
const char *gerbil_embedder_prompt_names(gerbil_embedder_t e) { return e->n_prompts ? e->prompt_blob : NULL; }
const char *gerbil_embedder_default_prompt(gerbil_embedder_t e) { return e->default_prompt; }

/* ---- embedding ---- */

/* One input, tokenized: its ids and where pooling starts (after the prompt). */
struct item {
    int32_t *ids;
    int n, first;
};

static gerbil_status check_dims(gerbil_embedder_t e, const gerbil_embed_options *o, int *dim) {
    *dim = e->dim;
    if (o && o->dimensions) {
        if (o->dimensions < 1 || o->dimensions > e->dim)
            return err_set(GERBIL_ERR_INVALID_ARG, "dimensions %d is out of range: the model's embeddings have %d "
                           "(1 .. %d)", o->dimensions, e->dim, e->dim);
        *dim = o->dimensions;
    }
    return GERBIL_OK;
}

/* The prompt to prepend ("" when none). */
static gerbil_status find_prompt(gerbil_embedder_t e, const gerbil_embed_options *o, const char **prompt) {
    *prompt = "";
    if (o && o->prompt) {
        *prompt = o->prompt;
        return GERBIL_OK;
    }
    const char *name = o && o->prompt_name ? o->prompt_name : e->default_prompt;
    if (!name) return GERBIL_OK;
    for (int i = 0; i < e->n_prompts; i++)
        if (!strcmp(e->prompt_names[i], name)) {
            *prompt = e->prompt_texts[i];
            return GERBIL_OK;
        }
    char known[1024] = "";
    size_t k = 0;
    for (int i = 0; i < e->n_prompts && k + 4 < sizeof known; i++)
        k += (size_t)snprintf(known + k, sizeof known - k, "%s%s", i ? ", " : "", e->prompt_names[i]);
    if (k >= sizeof known) k = sizeof known - 1;
    return err_set(GERBIL_ERR_INVALID_ARG, "unknown prompt name \"%s\"; this model's prompts: %s", name,
                   e->n_prompts ? known : "(none: config_sentence_transformers.json lists no prompts)");
}

/* Cut an encoding to max_tokens as transformers' truncation does: the tokens of the text
 * go, the special tokens the post-processor put around them stay. */
static gerbil_status truncate_item(gerbil_embedder_t e, const char *text, size_t len, struct item *it) {
    int32_t *plain = NULL;
    int np = 0;
    GB_TRY(gerbil_tokenize(e->tok, text, len, 0, &plain, &np));
    int pre = -1;
    for (int s = 0; s + np <= it->n; s++)
        if (!memcmp(it->ids + s, plain, (size_t)np * sizeof *plain)) { pre = s; break; }
    if (pre < 0) { /* the post-processor rewrote tokens: keep the first max_tokens */
        it->n = e->max_tokens;
    } else {
        const int suf = it->n - pre - np, keep = e->max_tokens - pre - suf;
        if (keep < 0) {
            free(plain);
            return err_set(GERBIL_ERR_INVALID_ARG, "%d special tokens exceed max_seq_length %d", pre + suf, e->max_tokens);
        }
        memmove(it->ids + pre + keep, it->ids + pre + np, (size_t)suf * sizeof *it->ids);
        it->n = pre + keep + suf;
    }
    free(plain);
    return GERBIL_OK;
}

/* Tokenize prompt + text, truncate to max_tokens, append the EOS lasttoken pooling wants. */
static gerbil_status encode_text(gerbil_embedder_t e, const char *prompt, int prompt_len, const char *text,
                                 struct item *it) {
    const size_t pl = strlen(prompt), tl = strlen(text);
    char *full = malloc(pl + tl + 1);
    if (!full) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    memcpy(full, prompt, pl);
    memcpy(full + pl, text, tl + 1);
    gerbil_status st = gerbil_tokenize(e->tok, full, pl + tl, 1, &it->ids, &it->n);
    if (st == GERBIL_OK && e->eos_append >= 0) {
        int32_t *g = realloc(it->ids, ((size_t)it->n + 1) * sizeof *g);
        if (!g) st = err_set(GERBIL_ERR_NOMEM, "out of memory");
        else it->ids = g;
    }
    const int add_eos = st == GERBIL_OK && e->eos_append >= 0 && (it->n == 0 || it->ids[it->n - 1] != e->eos_append);
    if (st == GERBIL_OK && it->n + add_eos > e->max_tokens) {
        const int mt = e->max_tokens;
        e->max_tokens -= add_eos; /* room for the EOS, as the reference engine keeps it */
        st = truncate_item(e, full, pl + tl, it);
        e->max_tokens = mt;
    }
    if (add_eos && st == GERBIL_OK) it->ids[it->n++] = e->eos_append;
    free(full);
    if (st == GERBIL_OK && it->n == 0)
        st = err_set(GERBIL_ERR_INVALID_ARG, "an empty input (no tokens) has no embedding");
    it->first = e->include_prompt ? 0 : (prompt_len < it->n ? prompt_len : it->n - 1);
    return st;
}

/* Prompt tokens that pooling skips when include_prompt is false (sentence-transformers'
 * _get_prompt_length: the prompt's encoding, less a trailing special token). */
static gerbil_status prompt_tokens(gerbil_embedder_t e, const char *prompt, int *n) {
    *n = 0;
    if (e->include_prompt || !prompt[0]) return GERBIL_OK;
    int32_t *a = NULL, *b = NULL;
    int na = 0, nb = 0;
    gerbil_status st = gerbil_tokenize(e->tok, prompt, strlen(prompt), 1, &a, &na);
    if (st == GERBIL_OK) st = gerbil_tokenize(e->tok, prompt, strlen(prompt), 0, &b, &nb);
    if (st == GERBIL_OK) *n = na > 0 && na > nb && (nb == 0 || a[na - 1] != b[nb - 1]) ? na - 1 : na;
    free(a);
    free(b);
    return st;
}

/* Pool rows h[0 .. n) (hidden states of positions first .. first + n - 1 of the input, in
 * order) into out[n_modes * D], as sentence-transformers' Pooling._forward_padded. */
static void pool(const gerbil_embedder_t e, const float *const *h, int n, int first, float *out) {
    const int D = e->D;
    for (int m = 0; m < e->n_modes; m++) {
        float *o = out + (size_t)m * D;
        for (int d = 0; d < D; d++) {
            double acc = 0, wsum = 0;
            float mx = -INFINITY;
            switch (e->modes[m]) {
            case POOL_CLS: o[d] = h[0][d]; break;
            case POOL_LAST: o[d] = h[n - 1][d]; break;
            case POOL_MAX:
                for (int t = 0; t < n; t++) mx = h[t][d] > mx ? h[t][d] : mx;
                o[d] = mx;
                break;
            case POOL_MEAN:
            case POOL_MEAN_SQRT:
                for (int t = 0; t < n; t++) acc += h[t][d];
                o[d] = (float)(e->modes[m] == POOL_MEAN ? acc / n : acc / sqrt((double)n));
                break;
            case POOL_WEIGHTED_MEAN: /* weights 1, 2, ... by position in the input */
                for (int t = 0; t < n; t++) {
                    acc += (double)(first + t + 1) * h[t][d];
                    wsum += first + t + 1;
                }
                o[d] = (float)(acc / wsum);
                break;
            }
        }
    }
}

static float activate(enum act a, float x) {
    switch (a) {
    case ACT_TANH: return tanhf(x);
    case ACT_RELU: return x > 0 ? x : 0;
    case ACT_SIGMOID: return 1.0f / (1.0f + expf(-x));
    case ACT_GELU: return (float)(0.5 * x * (1.0 + erf(x / sqrt(2.0))));
    default: return x;
    }
}

static void l2_normalize(float *x, int n) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    double nrm = sqrt(ss);
    if (nrm < 1e-12) nrm = 1e-12; /* torch.nn.functional.normalize's eps */
    for (int i = 0; i < n; i++) x[i] = (float)(x[i] / nrm);
}

/* The steps after pooling: pooled (n_modes x D) -> out[dim], then the Matryoshka cut's
 * renormalisation when asked. */
static void finish(gerbil_embedder_t e, const float *pooled, int dim, int renorm, float *out) {
    float *bufs[2] = {e->work, e->work + e->widest};
    int w = e->n_modes * e->D, cur = 0;
    memcpy(bufs[0], pooled, (size_t)w * sizeof(float));
    for (int i = 0; i < e->n_steps; i++) {
        const struct step *s = &e->steps[i];
        if (s->kind == STEP_NORMALIZE) {
            l2_normalize(bufs[cur], w);
            continue;
        }
        const float *in = bufs[cur];
        float *o = bufs[cur ^ 1];
        for (int r = 0; r < s->out; r++) {
            double acc = s->b ? s->b[r] : 0.0;
            const float *wr = s->w + (size_t)r * s->in;
            for (int c = 0; c < s->in; c++) acc += (double)wr[c] * in[c];
            o[r] = activate(s->act, (float)acc);
        }
        w = s->out;
        cur ^= 1;
    }
    memcpy(out, bufs[cur], (size_t)dim * sizeof(float));
    if (renorm) l2_normalize(out, dim);
}

/* Embed items[0 .. n) into out (n x dim), as many texts per batch as fit. */
static gerbil_status run_items(gerbil_embedder_t e, struct item *items, int n, int dim, int renorm, float *out) {
    const int nb = gerbil_context_n_batch(e->ctx), D = e->D;
    int32_t *tok = malloc((size_t)nb * sizeof *tok), *seq = malloc((size_t)nb * sizeof *seq);
    int8_t *flag = malloc((size_t)nb);
    const float **rows = malloc((size_t)nb * sizeof *rows);
    int32_t seqs[EMBED_SEQS];
    int out0[EMBED_SEQS];
    float *pooled = malloc((size_t)e->n_modes * D * sizeof(float));
    gerbil_status st = tok && seq && flag && rows && pooled ? GERBIL_OK : err_set(GERBIL_ERR_NOMEM, "out of memory");
    for (int i = 0; st == GERBIL_OK && i < n;) {
        int k = 0, r = 0, outs = 0;
        while (i + k < n && k < EMBED_SEQS && r + items[i + k].n <= nb) r += items[i + k++].n;
        if (k == 0) {
            st = err_set(GERBIL_ERR_INVALID_ARG, "input %d has %d tokens, more than the %d the model takes", i,
                         items[i].n, nb);
            break;
        }
        r = 0;
        int made = 0;
        for (int j = 0; j < k && st == GERBIL_OK; j++, made++) {
            const struct item *it = &items[i + j];
            if ((st = gerbil_seq_new(e->ctx, &seqs[j])) != GERBIL_OK) break;
            out0[j] = outs;
            for (int t = 0; t < it->n; t++, r++) {
                tok[r] = it->ids[t];
                seq[r] = seqs[j];
                /* the rows pooling reads: from first on for mean/max, else the first / last */
                flag[r] = e->all_rows ? t >= it->first : (t == it->first || t == it->n - 1);
                outs += flag[r];
            }
        }
        if (st == GERBIL_OK) {
            const gerbil_batch b = {.n_rows = r, .tokens = tok, .seq = seq, .logits = flag};
            st = gerbil_context_eval(e->ctx, &b);
        }
        for (int j = 0; st == GERBIL_OK && j < k; j++) {
            const struct item *it = &items[i + j];
            const int m = e->all_rows ? it->n - it->first : (it->n - 1 > it->first ? 2 : 1);
            for (int t = 0; t < m; t++) rows[t] = gerbil_context_embedding(e->ctx, out0[j] + t);
            if (e->all_rows) {
                pool(e, rows, m, it->first, pooled);
            } else { /* cls reads rows[0], lasttoken rows[m - 1] */
                const float *two[2] = {rows[0], rows[m - 1]};
                for (int md = 0; md < e->n_modes; md++)
                    memcpy(pooled + (size_t)md * D, e->modes[md] == POOL_CLS ? two[0] : two[1], (size_t)D * sizeof(float));
            }
            finish(e, pooled, dim, renorm, out + (size_t)(i + j) * dim);
        }
        for (int j = 0; j < made; j++) gerbil_seq_free(e->ctx, seqs[j]);
        i += k;
    }
    free(tok);
    free(seq);
    free(flag);
    free(rows);
    free(pooled);
    return st;
}

gerbil_status gerbil_embed(gerbil_embedder_t e, const char *const *texts, int n, const gerbil_embed_options *o,
                           float *out, int *n_tokens) {
    if (n_tokens) *n_tokens = 0;
    if (n < 0 || (n > 0 && (!texts || !out))) return err_set(GERBIL_ERR_INVALID_ARG, "no texts to embed");
    int dim, plen;
    const char *prompt;
    GB_TRY(check_dims(e, o, &dim));
    GB_TRY(find_prompt(e, o, &prompt));
    GB_TRY(prompt_tokens(e, prompt, &plen));
    struct item *items = calloc((size_t)n + 1, sizeof *items);
    if (!items) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    gerbil_status st = GERBIL_OK;
    int total = 0;
    for (int i = 0; i < n && st == GERBIL_OK; i++) {
        if (!texts[i]) st = err_set(GERBIL_ERR_INVALID_ARG, "input %d is NULL", i);
        else if ((st = encode_text(e, prompt, plen, texts[i], &items[i])) != GERBIL_OK)
            err_set(st, "input %d: %s", i, gerbil_last_error());
        total += items[i].n;
    }
    if (st == GERBIL_OK) st = run_items(e, items, n, dim, o && o->dimensions, out);
    for (int i = 0; i < n; i++) free(items[i].ids);
    free(items);
    if (st == GERBIL_OK && n_tokens) *n_tokens = total;
    return st;
}

gerbil_status gerbil_embed_ids(gerbil_embedder_t e, const int32_t *const *ids, const int *n_ids, int n,
                               const gerbil_embed_options *o, float *out, int *n_tokens) {
    if (n_tokens) *n_tokens = 0;
    if (n < 0 || (n > 0 && (!ids || !n_ids || !out))) return err_set(GERBIL_ERR_INVALID_ARG, "no inputs to embed");
    int dim;
    GB_TRY(check_dims(e, o, &dim));
    struct item *items = calloc((size_t)n + 1, sizeof *items);
    if (!items) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    gerbil_status st = GERBIL_OK;
    int total = 0;
    const int V = e->model->cfg.n_vocab;
    for (int i = 0; i < n && st == GERBIL_OK; i++) {
        if (n_ids[i] < 1) {
            st = err_set(GERBIL_ERR_INVALID_ARG, "input %d: an empty list of token ids has no embedding", i);
            break;
        }
        if (n_ids[i] > e->max_tokens) {
            st = err_set(GERBIL_ERR_INVALID_ARG, "input %d: %d tokens, more than the %d the model takes", i, n_ids[i],
                         e->max_tokens);
            break;
        }
        for (int t = 0; t < n_ids[i]; t++)
            if (ids[i][t] < 0 || ids[i][t] >= V) {
                st = err_set(GERBIL_ERR_INVALID_ARG, "input %d: token id %d is outside the vocabulary [0, %d)", i,
                             (int)ids[i][t], V);
                break;
            }
        items[i] = (struct item){.ids = (int32_t *)ids[i], .n = n_ids[i]};
        total += n_ids[i];
    }
    if (st == GERBIL_OK) st = run_items(e, items, n, dim, o && o->dimensions, out);
    free(items);
    if (st == GERBIL_OK && n_tokens) *n_tokens = total;
    return st;
}
