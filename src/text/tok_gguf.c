/* Tokenizers from GGUF metadata (tokenizer.ggml.*), built as the same in-memory
 * pipeline a tokenizer.json gives, so one mechanism encodes both. The metadata is
 * interpreted the way llama.cpp's llama-vocab.cpp does:
 *
 *   "gpt2"  byte-level BPE: vocab + tokenizer.ggml.merges; tokenizer.ggml.pre names a
 *           regex split (the pieces HF's Split(Isolated) pre-tokenizers give), then
 *           ByteLevel; decoder ByteLevel.
 *   "llama" SentencePiece BPE: no merges in the file. SentencePiece merges the adjacent
 *           pair whose concatenation is the highest-scoring piece (ties: leftmost), so
 *           every split (a, b) of a piece whose halves are pieces becomes a merge with
 *           rank = the dense rank of the piece's score (equal scores share a rank, and
 *           the BPE heap then takes the leftmost, as llama.cpp's queue does). Byte
 *           fallback to <0xNN>, unknown pieces fused. add_space_prefix prepends U+2581
 *           to every run of text (llama.cpp: at the start and after each special token,
 *           as HF's legacy Prepend normalizer), spaces become U+2581.
 *   "bert"  WordPiece: llama.cpp's vocab writes word-initial pieces with a U+2581
 *           prefix and continuation pieces bare; both are mapped back to HF's form
 *           ("##" for continuations). BertNormalizer (lowercase) + BertPreTokenizer.
 *   "t5"    Unigram over the scores, when tokenizer.ggml.precompiled_charsmap is absent
 *           or empty (the SentencePiece charsmap normalizer is not implemented).
 *
 * Token types: control (3) and unknown (2) become special added tokens, user-defined
 * (4) plain added tokens (matched on the raw text, as llama.cpp does); normal (1),
 * unused (5) and byte (6) tokens are only vocabulary. add_bos/add_eos build the
 * post-processor "bos $A eos" that gerbil_tokenize(add_special=1) applies. */
#include "text/tok_internal.h"
#include "io/gguf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER = 4, TT_UNUSED = 5, TT_BYTE = 6 };
enum { GV_BPE, GV_SPM, GV_WPM, GV_UGM };

/* What the metadata says, validated. Strings point into the gguf_file. */
struct gv {
    const char *path;
    int type;                 /* GV_* */
    uint64_t n;
    char **toks;
    const uint64_t *lens;
    float *scores;            /* n, zeros when absent */
    int32_t *types;           /* n, TT_NORMAL when absent */
    const struct gguf_kv *merges;
    int32_t bos, eos, unk, sep, pad;
    int add_bos, add_eos, add_space_prefix;
};

/* ---- metadata access ---- */
/* A token id key. Out of range is an error for the ids gerbil uses (bos/eos/unk); for
 * the others (lenient) it is ignored, as llama.cpp does with a warning (files with
 * padding_token_id = -1 as u32 exist). */
static gerbil_status get_id_(const struct gguf_file *f, const struct gv *v, const char *key, int32_t def, int lenient,
                             int32_t *out) {
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    *out = def;
    if (!kv) return GERBIL_OK;
    int64_t x;
    switch (kv->type) {
    case GGUF_VT_I8: case GGUF_VT_I16: case GGUF_VT_I32: case GGUF_VT_I64: x = kv->v.i; break;
    case GGUF_VT_U8: case GGUF_VT_U16: case GGUF_VT_U32: case GGUF_VT_U64:
        x = kv->v.u > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)kv->v.u;
        break;
    default: return err_set(GERBIL_ERR_FORMAT, "%s: %s must be an integer token id", v->path, key);
    }
    if ((x < 0 || (uint64_t)x >= v->n) && lenient) return GERBIL_OK;
    if (x < 0 || (uint64_t)x >= v->n)
        return err_set(GERBIL_ERR_FORMAT, "%s: %s = %lld is outside the vocabulary of %llu tokens", v->path, key,
                       (long long)x, (unsigned long long)v->n);
    *out = (int32_t)x;
    return GERBIL_OK;
}

static gerbil_status get_id(const struct gguf_file *f, const struct gv *v, const char *key, int32_t def, int32_t *out) {
    return get_id_(f, v, key, def, 0, out);
}

static gerbil_status get_bool(const struct gguf_file *f, const char *path, const char *key, int def, int *out) {
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    *out = def;
    if (!kv) return GERBIL_OK;
    if (kv->type != GGUF_VT_BOOL) return err_set(GERBIL_ERR_FORMAT, "%s: %s must be a bool", path, key);
    *out = kv->v.u != 0;
    return GERBIL_OK;
}

/* An array kv of n elements (n = 0: any length) of one of the allowed element types. */
static gerbil_status get_arr(const struct gguf_file *f, const char *path, const char *key, const enum gguf_vtype *types,
                             int n_types, uint64_t n, const char *want, const struct gguf_kv **out) {
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    *out = NULL;
    if (!kv) return GERBIL_OK;
    int ok = kv->type == GGUF_VT_ARRAY;
    if (ok) {
        ok = 0;
        for (int i = 0; i < n_types; i++) ok |= kv->arr_type == types[i];
    }
    if (!ok) return err_set(GERBIL_ERR_FORMAT, "%s: %s must be an array of %s", path, key, want);
    if (n && kv->arr_n != n)
        return err_set(GERBIL_ERR_FORMAT, "%s: %s has %llu entries, expected one per token (%llu)", path, key,
                       (unsigned long long)kv->arr_n, (unsigned long long)n);
    *out = kv;
    return GERBIL_OK;
}

static int64_t arr_int(const struct gguf_kv *kv, uint64_t i) {
    const unsigned char *p = kv->arr_data;
    switch (kv->arr_type) {
    case GGUF_VT_I8: return (int8_t)p[i];
    case GGUF_VT_U8: return p[i];
    case GGUF_VT_I16: { int16_t x; memcpy(&x, p + 2 * i, 2); return x; }
    case GGUF_VT_U16: { uint16_t x; memcpy(&x, p + 2 * i, 2); return x; }
    case GGUF_VT_U32: { uint32_t x; memcpy(&x, p + 4 * i, 4); return x; }
    default: { int32_t x; memcpy(&x, p + 4 * i, 4); return x; }
    }
}

static gerbil_status read_meta(const struct gguf_file *f, struct gv *v) {
    const char *model = gguf_get_str(f, "tokenizer.ggml.model");
    if (!model) {
        if (gguf_find_kv(f, "tokenizer.ggml.model"))
            return err_set(GERBIL_ERR_FORMAT, "%s: tokenizer.ggml.model must be a string", v->path);
        return err_set(GERBIL_ERR_FORMAT, "%s: no tokenizer in this file (tokenizer.ggml.model is missing)", v->path);
    }
    if (!strcmp(model, "gpt2")) v->type = GV_BPE;
    else if (!strcmp(model, "llama")) v->type = GV_SPM;
    else if (!strcmp(model, "bert")) v->type = GV_WPM;
    else if (!strcmp(model, "t5")) v->type = GV_UGM;
    else
        return err_set(GERBIL_ERR_UNSUPPORTED,
                       "%s: tokenizer.ggml.model \"%s\" is not supported (supported: gpt2, llama, bert, t5)", v->path, model);

    static const enum gguf_vtype str_t[] = {GGUF_VT_STRING}, f32_t[] = {GGUF_VT_F32},
                                 int_t[] = {GGUF_VT_I32, GGUF_VT_U32, GGUF_VT_I8, GGUF_VT_U8, GGUF_VT_I16, GGUF_VT_U16};
    const struct gguf_kv *toks, *scores, *types;
    GB_TRY(get_arr(f, v->path, "tokenizer.ggml.tokens", str_t, 1, 0, "strings", &toks));
    if (!toks || !toks->arr_n) return err_set(GERBIL_ERR_FORMAT, "%s: tokenizer.ggml.tokens is missing or empty", v->path);
    if (toks->arr_n > (uint64_t)INT32_MAX - 1)
        return err_set(GERBIL_ERR_FORMAT, "%s: tokenizer.ggml.tokens has %llu entries (too many)", v->path,
                       (unsigned long long)toks->arr_n);
    v->n = toks->arr_n;
    v->toks = toks->arr_strs;
    v->lens = toks->arr_str_lens;
    for (uint64_t i = 0; i < v->n; i++) {
        if (v->lens[i] > UINT32_MAX / 2) return err_set(GERBIL_ERR_FORMAT, "%s: token %llu is too long", v->path, (unsigned long long)i);
        if (tk_utf8_valid_prefix(v->toks[i], v->lens[i]) != v->lens[i])
            return err_set(GERBIL_ERR_FORMAT, "%s: token %llu is not valid UTF-8", v->path, (unsigned long long)i);
    }
    GB_TRY(get_arr(f, v->path, "tokenizer.ggml.scores", f32_t, 1, v->n, "f32", &scores));
    GB_TRY(get_arr(f, v->path, "tokenizer.ggml.token_type", int_t, 6, v->n, "integers", &types));
    GB_TRY(get_arr(f, v->path, "tokenizer.ggml.merges", str_t, 1, 0, "strings", &v->merges));
    if (v->type == GV_BPE && !v->merges)
        return err_set(GERBIL_ERR_FORMAT, "%s: a gpt2 (BPE) tokenizer needs tokenizer.ggml.merges", v->path);
    v->scores = calloc(v->n, sizeof *v->scores);
    v->types = malloc(v->n * sizeof *v->types);
    if (!v->scores || !v->types) return GERBIL_ERR_NOMEM;
    for (uint64_t i = 0; i < v->n; i++) {
        if (scores) {
            memcpy(&v->scores[i], (const char *)scores->arr_data + 4 * i, 4);
            if (isnan(v->scores[i])) return err_set(GERBIL_ERR_FORMAT, "%s: score of token %llu is NaN", v->path, (unsigned long long)i);
        }
        int64_t t = types ? arr_int(types, i) : TT_NORMAL;
        if (t < 0 || t > TT_BYTE)
            return err_set(GERBIL_ERR_FORMAT, "%s: token %llu has token_type %lld (expected 0..6)", v->path,
                           (unsigned long long)i, (long long)t);
        v->types[i] = (int32_t)t;
    }

    /* llama.cpp's defaults per model type, then the keys */
    int spm = v->type == GV_SPM;
    int32_t cls;
    GB_TRY(get_id_(f, v, "tokenizer.ggml.cls_token_id", -1, 1, &cls));
    GB_TRY(get_id(f, v, "tokenizer.ggml.bos_token_id", spm && v->n > 1 ? 1 : v->type == GV_WPM ? cls : -1, &v->bos));
    GB_TRY(get_id(f, v, "tokenizer.ggml.eos_token_id", spm && v->n > 2 ? 2 : -1, &v->eos));
    GB_TRY(get_id(f, v, "tokenizer.ggml.unknown_token_id", spm ? 0 : -1, &v->unk));
    GB_TRY(get_id_(f, v, "tokenizer.ggml.seperator_token_id", -1, 1, &v->sep));
    GB_TRY(get_id_(f, v, "tokenizer.ggml.padding_token_id", -1, 1, &v->pad));
    int def_bos = v->type == GV_SPM || v->type == GV_WPM, def_eos = v->type == GV_UGM;
    if (v->type == GV_BPE) {
        const char *pre = gguf_get_str(f, "tokenizer.ggml.pre");
        if (pre && (!strcmp(pre, "llama3") || !strcmp(pre, "llama-v3") || !strcmp(pre, "llama-bpe") ||
                    !strcmp(pre, "falcon3") || !strcmp(pre, "tekken") || !strcmp(pre, "chameleon") ||
                    !strcmp(pre, "lfm2")))
            def_bos = 1;
    }
    GB_TRY(get_bool(f, v->path, "tokenizer.ggml.add_bos_token", def_bos, &v->add_bos));
    GB_TRY(get_bool(f, v->path, "tokenizer.ggml.add_eos_token", def_eos, &v->add_eos));
    GB_TRY(get_bool(f, v->path, "tokenizer.ggml.add_space_prefix", v->type == GV_SPM || v->type == GV_UGM,
                    &v->add_space_prefix));
    if (v->type == GV_WPM && v->sep < 0) v->sep = v->eos;
    /* a default with no token to add adds nothing; the keys themselves are checked later */
    if (v->bos < 0 && !gguf_find_kv(f, "tokenizer.ggml.add_bos_token")) v->add_bos = 0;
    if ((v->type == GV_WPM ? v->sep : v->eos) < 0 && !gguf_find_kv(f, "tokenizer.ggml.add_eos_token")) v->add_eos = 0;
    return GERBIL_OK;
}

/* ---- pre-tokenizer regexes (llama.cpp's llm_tokenizer_bpe, HF's originals where the
 * family has a tokenizer.json) ---- */
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define RE_LLAMA3 "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2 "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_GPT2_NOWS "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_BLOOM " ?[^(\\s|.,!?…。，、।۔،)]+"

struct pre_family {
    const char *names;   /* space-separated tokenizer.ggml.pre values */
    int ignore_merges;
    int nfc;             /* the HF tokenizer normalizes to NFC first (llama.cpp does not) */
    const char *re[6];   /* applied in order, each as Split(Isolated) */
};

static const struct pre_family PRE_FAMILIES[] = {
    {"default", 0, 0, {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2_NOWS, "\\p{N}+", "[0-9][0-9][0-9]"}},
    {"llama3 llama-v3 llama-bpe falcon3 pixtral lfm2", 1, 0, {RE_LLAMA3}},
    {"dbrx smaug-bpe chatglm-bpe", 0, 0, {RE_LLAMA3}},
    {"gpt-2 phi-2 jina-es jina-de gigachat jina-v1-en jina-v2-es jina-v2-de jina-v2-code roberta-bpe mpt olmo jais", 0, 0,
     {RE_GPT2}},
    /* Qwen2/2.5/3's tokenizer.json normalizes to NFC; llama.cpp skips it, which only
     * differs on decomposed text, where NFC is what the model was trained on */
    {"qwen2 megrez deepseek-r1-qwen", 0, 1, {RE_QWEN2}},
    /* Qwen3.5: letters take their combining marks (\\p{M}) along */
    {"qwen35", 0, 1,
     {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*"
      "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"stablelm2", 0, 0, {RE_QWEN2}},
    {"starcoder refact command-r smollm codeshell exaone minerva-7b", 0, 0, {"\\p{N}", RE_GPT2_NOWS}},
    {"falcon", 0, 0, {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2_NOWS, "[0-9][0-9][0-9]"}},
    {"deepseek-coder", 0, 0, {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[一-龥ࠀ-一가-퟿]+", "\\p{N}"}},
    {"deepseek-llm", 0, 0,
     {"[\\r\\n]",
      "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝ\\x{1F5F}-\\x{1F7D}ᾀ-ᾴᾶ-ᾼ\\x{1FBE}ῂ-ῄῆ-ῌ\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}ῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\\x{2126}ℨ\\x{212A}-\\x{212D}ℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
      "\\s?[!-/:-~！-／：-～‘-‟　-。]+", "\\s+$", "[一-龥ࠀ-一가-퟿]+", "\\p{N}+"}},
    {"deepseek-v3", 0, 0,
     {"\\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+",
      "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"gpt-4o llama4", 0, 0, /* tiktoken's o200k_base pattern */
     {"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
      "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
      "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"poro-chat bloom gpt3-finnish", 0, 0, {RE_BLOOM}},
    {"viking", 0, 0, {RE_BLOOM, "\\p{N}"}},
    {"tekken", 1, 0,
     {"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"chameleon", 0, 0,
     {"<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )", "\\p{N}",
      "[\\p{P}!-/:-@\\[-`{-~]", RE_GPT2_NOWS}},
};

static const struct pre_family *find_pre(const char *name) {
    size_t n = strlen(name);
    for (size_t i = 0; i < sizeof PRE_FAMILIES / sizeof PRE_FAMILIES[0]; i++) {
        const char *s = PRE_FAMILIES[i].names;
        while (*s) {
            size_t k = strcspn(s, " ");
            if (k == n && !memcmp(s, name, n)) return &PRE_FAMILIES[i];
            s += k;
            while (*s == ' ') s++;
        }
    }
    return NULL;
}

/* ---- cJSON builders for the pipeline stages ---- */
static cJSON *obj_type(const char *type) {
    cJSON *o = cJSON_CreateObject();
    if (o && !cJSON_AddStringToObject(o, "type", type)) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* {"type": "Sequence", key: [items...]} taking ownership of items (NULL ones = OOM). */
static cJSON *sequence(const char *key, cJSON **items, int n) {
    cJSON *o = obj_type("Sequence"), *a = cJSON_CreateArray();
    int ok = o && a;
    for (int i = 0; i < n; i++) {
        if (ok && items[i]) cJSON_AddItemToArray(a, items[i]);
        else {
            ok = 0;
            cJSON_Delete(items[i]);
        }
    }
    if (!ok) {
        cJSON_Delete(o);
        cJSON_Delete(a);
        return NULL;
    }
    cJSON_AddItemToObject(o, key, a);
    return o;
}

/* {"type": type, pattern: {"String"|"Regex": pat}, "content": content} */
static cJSON *with_pattern(const char *type, const char *kind, const char *pat, const char *content) {
    cJSON *o = obj_type(type), *p = cJSON_CreateObject();
    if (!o || !p || !cJSON_AddStringToObject(p, kind, pat)) goto fail;
    cJSON_AddItemToObject(o, "pattern", p);
    p = NULL;
    if (content && !cJSON_AddStringToObject(o, "content", content)) goto fail;
    return o;
fail:
    cJSON_Delete(o);
    cJSON_Delete(p);
    return NULL;
}

static cJSON *split_isolated(const char *re) {
    cJSON *o = with_pattern("Split", "Regex", re, NULL);
    if (o && (!cJSON_AddStringToObject(o, "behavior", "Isolated") || !cJSON_AddFalseToObject(o, "invert"))) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

static cJSON *bytelevel(int use_regex) {
    cJSON *o = obj_type("ByteLevel");
    if (o && (!cJSON_AddFalseToObject(o, "add_prefix_space") || !cJSON_AddTrueToObject(o, "trim_offsets") ||
              !cJSON_AddBoolToObject(o, "use_regex", use_regex))) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

#define SPACE_MARK "\xE2\x96\x81" /* U+2581 */

/* The normalizer, pre-tokenizer and decoder of each vocabulary type (NULL = none). */
static gerbil_status build_stages(struct gerbil_tokenizer *t, const struct gv *v, const struct pre_family *pre) {
    cJSON *norm = NULL, *pt = NULL, *dec = NULL;
    int oom = 0;
    switch (v->type) {
    case GV_BPE: {
        cJSON *items[8];
        int n = 0;
        for (int i = 0; i < 6 && pre->re[i]; i++) items[n++] = split_isolated(pre->re[i]);
        items[n++] = bytelevel(0);
        oom = !(pt = sequence("pretokenizers", items, n)) || !(dec = bytelevel(1));
        if (!oom && pre->nfc) oom = !(norm = obj_type("NFC"));
        break;
    }
    case GV_SPM: {
        cJSON *items[4];
        int n = 0;
        if (v->add_space_prefix) {
            cJSON *p = obj_type("Prepend");
            if (p && !cJSON_AddStringToObject(p, "prepend", SPACE_MARK)) {
                cJSON_Delete(p);
                p = NULL;
            }
            items[n++] = p;
        }
        items[n++] = with_pattern("Replace", "String", " ", SPACE_MARK);
        oom = !(norm = sequence("normalizers", items, n));
        n = 0;
        items[n++] = with_pattern("Replace", "String", SPACE_MARK, " ");
        items[n++] = obj_type("ByteFallback");
        items[n++] = obj_type("Fuse");
        if (v->add_space_prefix) {
            cJSON *s = with_pattern("Strip", "String", " ", NULL);
            if (s) cJSON_DeleteItemFromObject(s, "pattern");
            if (s && (!cJSON_AddStringToObject(s, "content", " ") || !cJSON_AddNumberToObject(s, "start", 1) ||
                      !cJSON_AddNumberToObject(s, "stop", 0))) {
                cJSON_Delete(s);
                s = NULL;
            }
            items[n++] = s;
        }
        oom |= !(dec = sequence("decoders", items, n));
        break;
    }
    case GV_WPM: {
        norm = obj_type("BertNormalizer");
        oom = !norm || !cJSON_AddTrueToObject(norm, "clean_text") || !cJSON_AddTrueToObject(norm, "handle_chinese_chars") ||
              !cJSON_AddNullToObject(norm, "strip_accents") || !cJSON_AddTrueToObject(norm, "lowercase");
        oom |= !(pt = obj_type("BertPreTokenizer"));
        dec = obj_type("WordPiece");
        oom |= !dec || !cJSON_AddStringToObject(dec, "prefix", "##") || !cJSON_AddTrueToObject(dec, "cleanup");
        break;
    }
    default: { /* GV_UGM: SentencePiece without a charsmap: spaces -> U+2581, a leading one */
        pt = obj_type("Metaspace");
        oom = !pt || !cJSON_AddStringToObject(pt, "replacement", SPACE_MARK) ||
              !cJSON_AddStringToObject(pt, "prepend_scheme", v->add_space_prefix ? "always" : "never") ||
              !cJSON_AddFalseToObject(pt, "split");
        dec = obj_type("Metaspace");
        oom |= !dec || !cJSON_AddStringToObject(dec, "replacement", SPACE_MARK) ||
               !cJSON_AddStringToObject(dec, "prepend_scheme", v->add_space_prefix ? "always" : "never");
        break;
    }
    }
    gerbil_status st = oom ? GERBIL_ERR_NOMEM : GERBIL_OK;
    if (!st && norm) st = tk_norm_parse(norm, v->path, &t->normalizer);
    if (!st && pt) st = tk_pretok_parse(pt, v->path, &t->pretok);
    if (!st && dec) st = tk_dec_parse(dec, v->path, &t->decoder);
    cJSON_Delete(norm);
    cJSON_Delete(pt);
    cJSON_Delete(dec);
    return st;
}

/* ---- the model ---- */
static int rv_push(tk_rawvocab *rv, const char *s, size_t n, double num) {
    return tk_rawvocab_push(rv, rv->strs.n, (uint32_t)n, num) || tk_buf_put(&rv->strs, s, n);
}

/* WordPiece: llama.cpp's "\u2581word" is HF's "word", its bare "piece" is "##piece"
 * ("[...]" pieces are kept, as convert_hf_to_gguf.py's phantom-space mapping does). */
static int wpm_piece(const struct gv *v, uint64_t i, tk_buf *tmp) {
    const char *s = v->toks[i];
    size_t n = v->lens[i];
    tmp->n = 0;
    if (v->types[i] != TT_NORMAL || (n >= 2 && s[0] == '[' && s[n - 1] == ']')) return tk_buf_put(tmp, s, n);
    if (n >= 3 && !memcmp(s, SPACE_MARK, 3)) return tk_buf_put(tmp, s + 3, n - 3);
    return tk_buf_put(tmp, "##", 2) || tk_buf_put(tmp, s, n);
}

static gerbil_status fill_rawvocab(const struct gv *v, tk_rawvocab *rv) {
    size_t bytes = 0;
    for (uint64_t i = 0; i < v->n; i++) bytes += v->lens[i] + 2;
    if (tk_buf_reserve(&rv->strs, bytes + 1)) return GERBIL_ERR_NOMEM;
    rv->is_list = v->type == GV_UGM;
    tk_buf tmp = {0};
    int oom = 0;
    for (uint64_t i = 0; i < v->n && !oom; i++) {
        double num = rv->is_list ? (double)v->scores[i] : (double)i;
        if (v->type == GV_WPM) oom = wpm_piece(v, i, &tmp) || rv_push(rv, tmp.p ? tmp.p : "", tmp.n, num);
        else oom = rv_push(rv, v->toks[i], v->lens[i], num);
    }
    tk_buf_free(&tmp);
    if (oom) return GERBIL_ERR_NOMEM;
    if (v->type != GV_BPE) return GERBIL_OK;
    rv->has_merges = 1;
    for (uint64_t i = 0; i < v->merges->arr_n; i++) {
        const char *s = v->merges->arr_strs[i];
        size_t n = v->merges->arr_str_lens[i];
        /* "a b": the first space after the first byte separates the halves (llama.cpp) */
        const char *sp = n > 1 ? memchr(s + 1, ' ', n - 1) : NULL;
        if (!sp)
            return err_set(GERBIL_ERR_FORMAT, "%s: tokenizer.ggml.merges[%llu] \"%.*s\" is not two tokens separated by a space",
                           v->path, (unsigned long long)i, (int)(n > 100 ? 100 : n), s);
        uint64_t off = rv->strs.n;
        if (tk_buf_put(&rv->strs, s, n)) return GERBIL_ERR_NOMEM;
        uint64_t al = (uint64_t)(sp - s);
        if (off + n > UINT32_MAX) return err_set(GERBIL_ERR_FORMAT, "%s: merges too large", v->path);
        if (rv->n_merges == rv->m_cap) {
            size_t cap = rv->m_cap ? rv->m_cap * 2 : 1024;
            uint32_t *m = realloc(rv->m_off, cap * 4 * sizeof *m);
            if (!m) return GERBIL_ERR_NOMEM;
            rv->m_off = m;
            rv->m_cap = cap;
        }
        uint32_t *m = rv->m_off + rv->n_merges * 4;
        m[0] = (uint32_t)off, m[1] = (uint32_t)al, m[2] = (uint32_t)(off + al + 1), m[3] = (uint32_t)(n - al - 1);
        rv->n_merges++;
    }
    return GERBIL_OK;
}

typedef struct { float score; int32_t id; } scored;
static int cmp_scored(const void *a, const void *b) {
    const scored *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* SentencePiece BPE as merges: every split (a, b) of a piece into two pieces, ranked by
 * the dense rank of the merged piece's score (see the file comment). */
static gerbil_status spm_merges(tk_model *m, const struct gv *v) {
    scored *order = malloc(v->n * sizeof *order);
    if (!order) return GERBIL_ERR_NOMEM;
    size_t k = 0;
    for (uint64_t i = 0; i < v->n; i++) {
        int ty = v->types[i];
        if ((ty == TT_NORMAL || ty == TT_USER || ty == TT_UNUSED) && v->lens[i] > 1)
            order[k++] = (scored){v->scores[i], (int32_t)i};
    }
    qsort(order, k, sizeof *order, cmp_scored);
    gerbil_status st = tk_u64map_reserve(&m->merges, k * 2) ? GERBIL_ERR_NOMEM : GERBIL_OK;
    uint32_t rank = 0;
    for (size_t r = 0; r < k && !st; r++) {
        if (r && order[r].score != order[r - 1].score) rank++;
        int32_t id = order[r].id;
        /* the piece must be what the vocabulary maps its text to (duplicates: the last) */
        const char *s = v->toks[id];
        size_t n = v->lens[id];
        if (tk_strmap_get(&m->vocab, s, n, -1) != id) continue;
        for (size_t cut = tk_utf8_len((unsigned char)s[0]); cut < n; cut += tk_utf8_len((unsigned char)s[cut])) {
            int32_t a = tk_strmap_get(&m->vocab, s, cut, -1), b = tk_strmap_get(&m->vocab, s + cut, n - cut, -1);
            if (a < 0 || b < 0) continue;
            if (v->types[a] == TT_BYTE || v->types[b] == TT_BYTE || v->types[a] == TT_CONTROL || v->types[b] == TT_CONTROL)
                continue;
            uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
            if (tk_u64map_put(&m->merges, key, ((uint64_t)rank << 32) | (uint32_t)id)) {
                st = GERBIL_ERR_NOMEM;
                break;
            }
        }
    }
    free(order);
    return st;
}

static gerbil_status build_model(struct gerbil_tokenizer *t, const struct gv *v, const struct pre_family *pre) {
    tk_rawvocab rv = {0};
    gerbil_status st = fill_rawvocab(v, &rv);
    cJSON *cfg = NULL;
    if (!st) {
        static const char *names[] = {"BPE", "BPE", "WordPiece", "Unigram"};
        cfg = obj_type(names[v->type]);
        int oom = !cfg;
        if (!oom && v->type == GV_SPM) {
            oom = !cJSON_AddTrueToObject(cfg, "byte_fallback") || !cJSON_AddTrueToObject(cfg, "fuse_unk");
            if (!oom && v->unk >= 0) oom = !cJSON_AddStringToObject(cfg, "unk_token", v->toks[v->unk]);
        } else if (!oom && v->type == GV_BPE) {
            oom = !cJSON_AddBoolToObject(cfg, "ignore_merges", pre->ignore_merges);
        } else if (!oom && v->type == GV_WPM) {
            oom = !cJSON_AddStringToObject(cfg, "unk_token", v->unk >= 0 ? v->toks[v->unk] : "[UNK]") ||
                  !cJSON_AddStringToObject(cfg, "continuing_subword_prefix", "##");
        } else if (!oom) {
            oom = !cJSON_AddNumberToObject(cfg, "unk_id", v->unk) || !cJSON_AddTrueToObject(cfg, "byte_fallback");
        }
        st = oom ? GERBIL_ERR_NOMEM : GERBIL_OK;
    }
    if (!st) st = tk_model_build(&t->model, cfg, &rv, v->path);
    if (!st && v->type == GV_SPM) st = spm_merges(&t->model, v);
    cJSON_Delete(cfg);
    tk_rawvocab_free(&rv);
    return st;
}

/* ---- added tokens, post-processor, templates ---- */
static gerbil_status build_added(struct gerbil_tokenizer *t, const struct gv *v, int phi3) {
    tk_ctx cx = {0};
    int32_t next_id = (int32_t)v->n;
    gerbil_status st = GERBIL_OK;
    for (uint64_t i = 0; i < v->n && !st; i++) {
        int ty = v->types[i];
        if (ty != TT_CONTROL && ty != TT_UNKNOWN && ty != TT_USER) continue;
        const char *s = v->toks[i];
        size_t n = v->lens[i];
        /* llama.cpp gives Phi-3's special tokens rstrip, except <unk>, <s>, <|endoftext|> */
        int rstrip = phi3 && ty != TT_USER && strcmp(s, "<unk>") && strcmp(s, "<s>") && strcmp(s, "<|endoftext|>");
        if (phi3 && !strcmp(s, "</s>")) rstrip = 1;
        st = tk_added_add(&t->added, &t->model, t->normalizer, &cx, s, n, ty != TT_USER, 0, 0, rstrip, 0, &next_id);
    }
    if (!st) st = tk_added_build_tries(&t->added);
    tk_ctx_free(&cx);
    return st;
}

static gerbil_status add_template(struct gerbil_tokenizer *t, const char *name, const char *src, int cap) {
    if (t->n_tpl >= cap) return GERBIL_OK;
    t->tpl_names[t->n_tpl] = strdup(name);
    t->tpl_srcs[t->n_tpl] = strdup(src);
    if (!t->tpl_names[t->n_tpl] || !t->tpl_srcs[t->n_tpl]) {
        free(t->tpl_names[t->n_tpl]);
        free(t->tpl_srcs[t->n_tpl]);
        t->tpl_names[t->n_tpl] = t->tpl_srcs[t->n_tpl] = NULL;
        return GERBIL_ERR_NOMEM;
    }
    t->n_tpl++;
    return GERBIL_OK;
}

/* tokenizer.chat_template is "default"; tokenizer.chat_template.NAME are named ones. */
static gerbil_status load_templates(struct gerbil_tokenizer *t, const struct gguf_file *f) {
    static const char pfx[] = "tokenizer.chat_template.";
    int cap = 1;
    for (int64_t i = 0; i < f->n_kv; i++)
        if (!strncmp(f->kv[i].key, pfx, sizeof pfx - 1) && f->kv[i].type == GGUF_VT_STRING) cap++;
    t->tpl_names = calloc((size_t)cap, sizeof *t->tpl_names);
    t->tpl_srcs = calloc((size_t)cap, sizeof *t->tpl_srcs);
    if (!t->tpl_names || !t->tpl_srcs) return GERBIL_ERR_NOMEM;
    const char *def = gguf_get_str(f, "tokenizer.chat_template");
    if (def) GB_TRY(add_template(t, "default", def, cap));
    for (int64_t i = 0; i < f->n_kv; i++) {
        const struct gguf_kv *kv = &f->kv[i];
        if (strncmp(kv->key, pfx, sizeof pfx - 1) || kv->type != GGUF_VT_STRING || !kv->key[sizeof pfx - 1]) continue;
        GB_TRY(add_template(t, kv->key + sizeof pfx - 1, kv->str, cap));
    }
    return GERBIL_OK;
}

static gerbil_status load(struct gerbil_tokenizer *t, const char *path) {
    struct gguf_file f;
    GB_TRY(gguf_open(path, NULL, &f));
    struct gv v = {.path = t->path};
    gerbil_status st = read_meta(&f, &v);
    const struct pre_family *pre = NULL;
    if (!st && v.type == GV_BPE) {
        const char *name = gguf_get_str(&f, "tokenizer.ggml.pre");
        if (!name && gguf_find_kv(&f, "tokenizer.ggml.pre"))
            st = err_set(GERBIL_ERR_FORMAT, "%s: tokenizer.ggml.pre must be a string", path);
        else if (!(pre = find_pre(name ? name : "default")))
            st = err_set(GERBIL_ERR_UNSUPPORTED, "%s: unknown pre-tokenizer type tokenizer.ggml.pre = \"%s\"", path, name);
    }
    if (!st && v.type == GV_UGM) {
        const struct gguf_kv *cm = gguf_find_kv(&f, "tokenizer.ggml.precompiled_charsmap");
        if (cm && !(cm->type == GGUF_VT_ARRAY && cm->arr_n == 0))
            st = err_set(GERBIL_ERR_UNSUPPORTED,
                         "%s: a t5 tokenizer with tokenizer.ggml.precompiled_charsmap (SentencePiece normalization) "
                         "is not supported", path);
    }
    if (!st) st = build_stages(t, &v, pre);
    if (!st) st = build_model(t, &v, pre);
    if (!st) {
        const char *name = gguf_get_str(&f, "general.name");
        int phi3 = name && (strstr(name, "phi-3") || strstr(name, "phi3") || strstr(name, "Phi-3") || strstr(name, "Phi3"));
        st = build_added(t, &v, phi3 && v.type == GV_SPM);
    }
    if (!st && ((v.add_bos && v.bos < 0) || (v.add_eos && v.eos < 0)))
        st = err_set(GERBIL_ERR_FORMAT, "%s: tokenizer.ggml.add_%s_token is set but the file has no %s token id", path,
                     v.add_bos && v.bos < 0 ? "bos" : "eos", v.add_bos && v.bos < 0 ? "bos" : "eos");
    if (!st) {
        int32_t last = v.type == GV_WPM ? v.sep : v.eos;
        st = tk_post_bos_eos(v.add_bos ? v.bos : -1, (v.type == GV_WPM ? v.add_bos : v.add_eos) ? last : -1, &t->post);
    }
    if (!st) st = load_templates(t, &f);
    t->bos = v.bos;
    t->eos = v.eos;
    t->n_vocab = (int32_t)v.n;
    free(v.scores);
    free(v.types);
    gguf_close(&f);
    return st;
}

/* load() of tokenizer.c's constructor for GGUF files: the path is kept for messages. */
static gerbil_status load_gguf(struct gerbil_tokenizer *t, const char *path) {
    if (!(t->path = strdup(path))) return GERBIL_ERR_NOMEM;
    return load(t, path);
}

gerbil_status gerbil_tokenizer_load_gguf(const char *path, gerbil_tokenizer_t *out) {
    return tk_tokenizer_new(path, "gerbil_tokenizer_load_gguf", load_gguf, out);
}
