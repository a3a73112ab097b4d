/* Internals of the Hugging Face tokenizer.json implementation (src/text/tok_*.c,
 * tokenizer.c). The pipeline follows the `tokenizers` crate exactly:
 *
 *   text -> added tokens split out (non-normalized ones first, on the raw text)
 *        -> normalizer on each remaining piece, then normalized added tokens split out
 *        -> pre-tokenizer (pieces -> smaller pieces)
 *        -> model (BPE / Unigram / WordPiece / WordLevel) on each piece
 *        -> post-processor (BOS/EOS templates) when add_special
 *   ids  -> token strings -> decoder chain -> text
 *
 * Offsets are not tracked (gerbil needs ids, not alignments); where HF consults an
 * original offset (Metaspace prepend_scheme "first") a piece carries a flag instead. */
#ifndef GB_TOK_INTERNAL_H
#define GB_TOK_INTERNAL_H

#include "gerbil.h"
#include "base/status.h"

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

/* ---- growable byte buffer ---- */
typedef struct tk_buf {
    char *p;
    size_t n, cap;
} tk_buf;

int tk_buf_reserve(tk_buf *b, size_t extra); /* 0 ok, -1 out of memory */
int tk_buf_put(tk_buf *b, const void *s, size_t n);
static inline int tk_buf_putc(tk_buf *b, char c) { return tk_buf_put(b, &c, 1); }
int tk_buf_put_cp(tk_buf *b, uint32_t cp); /* UTF-8 encode */
void tk_buf_free(tk_buf *b);

/* ---- growable int32 array ---- */
typedef struct tk_ids {
    int32_t *v;
    size_t n, cap;
} tk_ids;
int tk_ids_push(tk_ids *a, int32_t x);
void tk_ids_free(tk_ids *a);

/* ---- hash maps ---- */
uint64_t tk_hash(const void *s, size_t n);

/* bytes -> int32. Keys are copied into an internal arena; entries keep insertion order. */
typedef struct tk_strmap_ent {
    uint64_t head;  /* the key's first 8 bytes, zero-padded: short keys compare here */
    uint64_t off;   /* into arena */
    uint32_t len;
    int32_t val;
} tk_strmap_ent;
typedef struct tk_strmap {
    uint64_t *slots; /* hash tag << 32 | entry index + 1, 0 = empty */
    size_t mask;
    tk_strmap_ent *ents;
    size_t n, cap;
    tk_buf arena;
} tk_strmap;
/* Insert or overwrite; returns the entry index or -1 (out of memory). */
int64_t tk_strmap_put(tk_strmap *m, const char *k, size_t n, int32_t val);
/* Entry index of k, or -1. */
int64_t tk_strmap_find(const tk_strmap *m, const char *k, size_t n);
static inline int32_t tk_strmap_get(const tk_strmap *m, const char *k, size_t n, int32_t def) {
    int64_t e = tk_strmap_find(m, k, n);
    return e < 0 ? def : m->ents[e].val;
}
static inline const char *tk_strmap_key(const tk_strmap *m, int64_t e) { return m->arena.p + m->ents[e].off; }
void tk_strmap_free(tk_strmap *m);
int tk_strmap_reserve(tk_strmap *m, size_t n, size_t key_bytes); /* 0 ok */
/* Many lookups at once (cnt <= TK_BATCH), overlapping their cache misses. */
#define TK_BATCH 384
/* Vocabulary ids past the number of entries a tokenizer.json holds (holes that added tokens
 * fill); a file naming id 2147483646 with one entry is refused, not a 16 GB table. */
enum { TK_MAX_ID_HOLES = 1 << 20 };
void tk_strmap_find_batch(const tk_strmap *m, const char *const *k, const size_t *n, int64_t *out, size_t cnt);

/* u64 -> u64 (keys != UINT64_MAX). */
typedef struct tk_u64map {
    uint64_t *keys, *vals;
    size_t mask, n;
} tk_u64map;
int tk_u64map_put(tk_u64map *m, uint64_t k, uint64_t v); /* 0 ok, -1 nomem */
int tk_u64map_get(const tk_u64map *m, uint64_t k, uint64_t *v); /* 1 found */
void tk_u64map_free(tk_u64map *m);
int tk_u64map_reserve(tk_u64map *m, size_t n);

/* ---- UTF-8 and Unicode properties ---- */
/* Decode the code point at s[*i] (valid UTF-8 assumed) and advance *i. */
static inline uint32_t tk_utf8_next(const char *s, size_t *i) {
    const unsigned char *u = (const unsigned char *)s + *i;
    if (u[0] < 0x80) { *i += 1; return u[0]; }
    if (u[0] < 0xE0) { *i += 2; return ((uint32_t)(u[0] & 0x1F) << 6) | (u[1] & 0x3F); }
    if (u[0] < 0xF0) { *i += 3; return ((uint32_t)(u[0] & 0x0F) << 12) | ((uint32_t)(u[1] & 0x3F) << 6) | (u[2] & 0x3F); }
    *i += 4;
    return ((uint32_t)(u[0] & 0x07) << 18) | ((uint32_t)(u[1] & 0x3F) << 12) | ((uint32_t)(u[2] & 0x3F) << 6) | (u[3] & 0x3F);
}
static inline size_t tk_utf8_len(unsigned char lead) {
    return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}
int tk_utf8_encode(char out[4], uint32_t cp); /* bytes written */
/* Length of the valid UTF-8 prefix of s. */
size_t tk_utf8_valid_prefix(const char *s, size_t n);
/* Append s to out with each maximal invalid subpart replaced by U+FFFD, exactly as
 * Rust's String::from_utf8_lossy. */
int tk_utf8_lossy(const char *s, size_t n, tk_buf *out);

int tk_is_whitespace(uint32_t c);  /* Rust char::is_whitespace (White_Space) */
int tk_is_word(uint32_t c);        /* Rust regex \w */
int tk_is_numeric(uint32_t c);     /* Rust char::is_numeric (N*) */
int tk_is_punct(uint32_t c);       /* ASCII punctuation or P* */
int tk_is_mark(uint32_t c);        /* M* */
int tk_is_mark_nonspacing(uint32_t c); /* Mn */
int tk_is_other(uint32_t c);       /* C* */
int tk_is_chinese(uint32_t c);     /* BERT's CJK ranges */
/* Rust char::to_lowercase, appended to out. */
int tk_put_lower(tk_buf *out, uint32_t c);

enum { TK_NFC, TK_NFD, TK_NFKC, TK_NFKD };
int tk_unicode_normalize(const char *s, size_t n, int form, tk_buf *out);

/* ---- regex (PCRE2, UTF + UCP, JIT) ---- */
typedef struct tk_regex {
    pcre2_code *code;
} tk_regex;
gerbil_status tk_regex_compile(tk_regex *re, const char *pat, size_t len, int literal, const char *path);
void tk_regex_free(tk_regex *re);
/* {"String": s} (a literal; "" matches nothing: re->code stays NULL) or {"Regex": r}. */
gerbil_status tk_parse_pattern(const cJSON *pat, tk_regex *re, const char *what, const char *path);

/* A match list that covers a string: alternating non-matches and matches, as HF's
 * Pattern::find_matches. */
typedef struct tk_span {
    uint32_t s, e;
    uint8_t match;
} tk_span;
typedef struct tk_spans {
    tk_span *v;
    size_t n, cap;
} tk_spans;
int tk_spans_push(tk_spans *a, uint32_t s, uint32_t e, int match);
void tk_spans_free(tk_spans *a);

/* Per-call scratch (thread safety: one per encode call, nothing shared is mutated
 * except the BPE cache, which has its own lock). */
typedef struct tk_ctx {
    pcre2_match_data *md;
    tk_spans spans;
    tk_buf tmp, tmp2;
} tk_ctx;

/* Find every match of re in s[0..n) (non-overlapping, leftmost-first, an empty match
 * advances one character) and write the covering span list. */
gerbil_status tk_regex_find_matches(const tk_regex *re, tk_ctx *cx, const char *s, size_t n, tk_spans *out);

/* ---- pieces: the pre-tokenized string ---- */
typedef struct tk_piece {
    uint64_t off;   /* into tk_pieces.text */
    uint32_t len;
    int32_t id;     /* added token id, or -1 for text still to tokenize */
    uint8_t first;  /* starts at original offset 0 (Metaspace prepend_scheme "first") */
} tk_piece;
typedef struct tk_pieces {
    tk_piece *v;
    size_t n, cap;
    tk_buf *text;   /* shared arena; offsets stay valid when it grows */
} tk_pieces;
int tk_pieces_push(tk_pieces *p, uint64_t off, uint32_t len, int32_t id, int first);
void tk_pieces_free(tk_pieces *p);

/* Split behaviours (SplitDelimiterBehavior). */
enum { TK_SPLIT_REMOVED, TK_SPLIT_ISOLATED, TK_SPLIT_PREV, TK_SPLIT_NEXT, TK_SPLIT_CONTIGUOUS };
gerbil_status tk_parse_behavior(const cJSON *j, int *out, const char *path);
/* Apply a behaviour to the span list of piece pc (text at the arena) and push the
 * resulting sub-pieces to out. */
int tk_split_piece(const tk_piece *pc, const tk_spans *m, int behavior, tk_pieces *out);

/* ---- normalizers ---- */
typedef struct tk_norm tk_norm;
gerbil_status tk_norm_parse(const cJSON *j, const char *path, tk_norm **out);
void tk_norm_free(tk_norm *n);
/* How much the normalizer can shrink text: input bytes <= the result * (bytes of output);
 * 1: never shrinks; 0: no bound (it deletes characters). For gerbil_tokenizer_max_token_bytes. */
int tk_norm_shrink(const tk_norm *n);
/* Normalize s in place. *first_lost is set when leading characters were removed (the
 * piece then no longer starts at original offset 0). */
gerbil_status tk_norm_apply(const tk_norm *n, tk_ctx *cx, tk_buf *s, int *first_lost);

/* ---- pre-tokenizers ---- */
typedef struct tk_pretok tk_pretok;
gerbil_status tk_pretok_parse(const cJSON *j, const char *path, tk_pretok **out);
void tk_pretok_free(tk_pretok *p);
/* Every byte of the text ends up in some piece (no split behaviour removes text). */
int tk_pretok_keeps_text(const tk_pretok *p);
/* Split the pieces without an id; *pcs is replaced. */
gerbil_status tk_pretok_apply(const tk_pretok *p, tk_ctx *cx, tk_pieces *pcs);
/* The GPT-2 byte <-> char tables. */
extern const uint16_t tk_byte_to_cp[256];
int tk_cp_to_byte(uint32_t cp); /* -1 if not one of the 256 */

/* ---- models ---- */
enum { TK_MODEL_BPE, TK_MODEL_UNIGRAM, TK_MODEL_WORDPIECE, TK_MODEL_WORDLEVEL };

/* Vocabulary as read from the file: strings in an arena, with an id or a score. */
typedef struct tk_rawvocab {
    int is_list;        /* Unigram: [[piece, score], ...] */
    tk_buf strs;
    uint64_t *off;
    uint32_t *len;
    double *num;        /* id (dict) or score (list) */
    size_t n, cap;
    /* merges: pairs of strings */
    uint32_t *m_off;    /* 4 per merge: a_off, a_len, b_off, b_len (files < 4 GiB) */
    size_t n_merges, m_cap;
    int has_merges;
} tk_rawvocab;
/* Append entry (off, len, num) (off, len: a piece of v->strs); -1 when out of memory. */
int tk_rawvocab_push(tk_rawvocab *rv, uint64_t off, uint32_t len, double num);
void tk_rawvocab_free(tk_rawvocab *v);

typedef struct tk_model {
    int type;
    tk_strmap vocab;          /* token -> id */
    int64_t *id_ent;          /* id -> vocab entry, -1 if none */
    int32_t n_ids;            /* max id + 1 */
    int32_t unk_id;           /* -1 when none */
    /* BPE */
    tk_u64map merges;         /* (a << 32 | b) -> (rank << 32 | new_id) */
    char *prefix, *suffix;    /* continuing_subword_prefix, end_of_word_suffix */
    size_t prefix_len, suffix_len;
    int fuse_unk, byte_fallback, ignore_merges;
    int32_t byte_ids[256];    /* <0xNN> ids, -1 when absent */
    struct tk_bpe_cache *cache;
    /* Unigram */
    double *scores;
    double min_score;
    tk_strmap prefixes;       /* every prefix of a piece -> 1 */
    /* WordPiece */
    int max_input_chars_per_word;
} tk_model;

gerbil_status tk_model_build(tk_model *m, const cJSON *cfg, tk_rawvocab *rv, const char *path);
void tk_model_free(tk_model *m);
gerbil_status tk_model_tokenize(const tk_model *m, tk_ctx *cx, const char *s, size_t n, tk_ids *out);
/* Token string of id, or NULL. */
const char *tk_model_token(const tk_model *m, int32_t id, size_t *len);

gerbil_status tk_bpe_build(tk_model *m, const cJSON *cfg, tk_rawvocab *rv, const char *path);
gerbil_status tk_bpe_tokenize(const tk_model *m, tk_ctx *cx, const char *s, size_t n, tk_ids *out);
void tk_bpe_free(tk_model *m);
gerbil_status tk_unigram_build(tk_model *m, const cJSON *cfg, tk_rawvocab *rv, const char *path);
gerbil_status tk_unigram_tokenize(const tk_model *m, tk_ctx *cx, const char *s, size_t n, tk_ids *out);
gerbil_status tk_wordpiece_tokenize(const tk_model *m, tk_ctx *cx, const char *s, size_t n, tk_ids *out);

/* ---- added vocabulary ---- */
typedef struct tk_added_tok {
    char *content;
    size_t len;
    char *norm;          /* content through the normalizer (normalized tokens), else NULL */
    size_t norm_len;
    int32_t id;
    uint8_t special, normalized, lstrip, rstrip, single_word;
} tk_added_tok;
typedef struct tk_trie {
    tk_u64map edges;     /* (node << 8 | byte) -> child */
    int32_t *term;       /* node -> added token index, -1 */
    size_t n_nodes, cap;
    uint8_t first[256];  /* bytes some token starts with */
} tk_trie;
typedef struct tk_added {
    tk_added_tok *v;
    size_t n, cap;
    tk_strmap by_content; /* content -> index */
    tk_u64map by_id;      /* id -> index */
    tk_trie raw, norm;    /* non-normalized / normalized tokens */
    int split_special;    /* special tokens in the text are plain text (split_special_tokens) */
} tk_added;
void tk_added_free(tk_added *a);
/* Register a token as HF's AddedVocabulary::add_tokens does (ids from the vocab when
 * the content is there, else the next free id). */
gerbil_status tk_added_add(tk_added *a, const tk_model *m, const tk_norm *norm, tk_ctx *cx,
                           const char *content, size_t len, int special, int normalized, int lstrip,
                           int rstrip, int single_word, int32_t *next_id);
gerbil_status tk_added_build_tries(tk_added *a);
/* Split s[0..n) on the tokens of the given trie: push pieces (id >= 0 for tokens). */
int tk_added_split(const tk_added *a, const tk_trie *t, uint64_t off, uint32_t n, int first, tk_pieces *out);
const tk_added_tok *tk_added_by_id(const tk_added *a, int32_t id);

/* ---- post-processors ---- */
typedef struct tk_post tk_post;
gerbil_status tk_post_parse(const cJSON *j, const char *path, tk_post **out);
void tk_post_free(tk_post *p);
gerbil_status tk_post_apply(const tk_post *p, tk_ids *ids, int add_special);
/* Build "bos $A eos" (transformers' update_post_processor); ids -1 = left out. */
gerbil_status tk_post_bos_eos(int32_t bos, int32_t eos, tk_post **out);
/* First/last special id the single template adds, -1 when none. */
int32_t tk_post_first_special(const tk_post *p);
int32_t tk_post_last_special(const tk_post *p);

/* ---- decoders ---- */
/* A list of strings in one arena. */
typedef struct tk_strs {
    tk_buf data;
    uint64_t *off;
    uint32_t *len;
    size_t n, cap;
} tk_strs;
int tk_strs_push(tk_strs *l, const char *s, size_t n);
int tk_strs_begin(tk_strs *l);                          /* start a string built with tk_strs_append */
int tk_strs_append(tk_strs *l, const char *s, size_t n);/* append to the last string */
void tk_strs_clear(tk_strs *l);
void tk_strs_free(tk_strs *l);
static inline const char *tk_strs_at(const tk_strs *l, size_t i) { return l->data.p + l->off[i]; }

typedef struct tk_dec tk_dec;
gerbil_status tk_dec_parse(const cJSON *j, const char *path, tk_dec **out);
void tk_dec_free(tk_dec *d);
/* Decode the token list (consumed) and append the text to out. d NULL: join with " ". */
gerbil_status tk_dec_apply(const tk_dec *d, tk_ctx *cx, tk_strs *toks, tk_buf *out);
/* The decoder chain holds a ByteFallback step (the streaming detokenizer holds runs
 * of <0xNN> tokens back). */
int tk_dec_has_byte_fallback(const tk_dec *d);

/* ---- the tokenizer ---- */
struct gerbil_tokenizer {
    char *path;
    tk_norm *normalizer;
    tk_pretok *pretok;
    tk_model model;
    tk_post *post;
    tk_dec *decoder;
    tk_added added;
    int32_t n_vocab;
    int32_t bos, eos;
    char **tpl_names, **tpl_srcs;
    int n_tpl;
};

/* Allocate a tokenizer, run load_fn(t, path) on it, and free it again on failure;
 * fn names the public entry point in argument errors. Shared by tokenizer.json and
 * GGUF loading. */
gerbil_status tk_tokenizer_new(const char *path, const char *fn,
                               gerbil_status (*load_fn)(struct gerbil_tokenizer *, const char *),
                               gerbil_tokenizer_t *out);

/* tokenizer.json fast reader: vocab and merges go to rv, every other value is parsed
 * by cJSON into *root (model keys other than vocab/merges under root.model). */
gerbil_status tk_json_read(const char *buf, size_t len, const char *path, cJSON **root, tk_rawvocab *rv);

/* Shared by decode and the streaming detokenizer: token strings of ids (skipping
 * unknown ids and, with skip_special, special added tokens). */
gerbil_status tk_ids_to_strs(const struct gerbil_tokenizer *t, const int32_t *ids, int n, int skip_special,
                             tk_strs *out);
void tk_ctx_free(tk_ctx *cx);

#endif
