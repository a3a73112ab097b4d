/* The grammar engine's internals. Every input (GBNF, regex, JSON Schema) compiles to
 * one intermediate form: a context-free grammar over BYTES. A rule is a list of
 * alternatives; an alternative is a sequence of elements, each a byte set (a terminal:
 * one byte out of a 256-bit set) or a reference to a rule. Alternatives live in one
 * flat element array, each ended by GE_END, so a parser position is one int.
 *
 * The engine (grammar_engine.c) runs it as a pushdown automaton whose stacks are
 * interned (node = (position, parent node)); a parser state is the sorted set of the
 * stacks alive after the bytes so far (an Earley-like set, but without items for
 * finished rules: a reference in tail position reuses its caller's frame, so loops
 * written as right recursion keep constant depth). States are interned too, with a
 * lazily filled 256-entry transition table each, which makes the pushdown automaton
 * a lazily built DFA over stack sets; masks are a walk of the vocabulary's byte trie
 * through those transitions, cached per state. */
#ifndef GB_GRAMMAR_H
#define GB_GRAMMAR_H

#include "gerbil.h"

#include <stddef.h>
#include <stdint.h>

enum { GE_END = 0, GE_BYTES = 1, GE_RULE = 2 };

typedef struct gelem {
    uint32_t kind : 2;
    uint32_t arg : 30; /* GE_BYTES: byte-set index; GE_RULE: rule id */
} gelem;

typedef struct gbyteset {
    uint64_t w[4];
} gbyteset;

static inline int gbs_has(const gbyteset *s, unsigned b) { return (int)((s->w[b >> 6] >> (b & 63)) & 1); }
static inline void gbs_add(gbyteset *s, unsigned b) { s->w[b >> 6] |= 1ULL << (b & 63); }
static inline void gbs_add_range(gbyteset *s, unsigned lo, unsigned hi) {
    for (unsigned b = lo; b <= hi; b++) gbs_add(s, b);
}

typedef struct gseq {
    gelem *v;
    int n, cap;
    int oom;
} gseq;

typedef struct grule {
    char *name;
    int32_t *alts; /* start positions in el */
    int n_alts, cap_alts;
    int defined;
    int32_t horizon_of; /* 1 + the rule this one equals within GIR_HORIZON bytes (a long counter), or 0 */
} grule;

/* Counters longer than this many bytes of lookahead behave alike for any shorter input:
 * x{0,40} after 2 copies and after 3 accept the same strings of under GIR_HORIZON bytes.
 * The engine computes the masks of such states once (grammar_engine.c, trunc_state). */
enum { GIR_HORIZON = 16 };

typedef struct gir {
    gelem *el;
    int n_el, cap_el;
    gbyteset *sets;
    int n_sets, cap_sets;
    grule *rules;
    int n_rules, cap_rules;
    int root;
    int oom;
    /* byte-set dedup: open addressing on the set's words */
    int32_t *set_slots;
    int set_mask;
} gir;

void gir_init(gir *g);
void gir_free(gir *g);
/* A new (empty, undefined) rule; name is copied (may be NULL: an anonymous rule). */
int gir_rule(gir *g, const char *name);
/* Find a named rule, or -1. */
int gir_find(const gir *g, const char *name);
/* Add an alternative to rule r (the sequence is copied; seq is reset to empty). */
void gir_alt(gir *g, int r, gseq *seq);
int gir_set(gir *g, const gbyteset *s); /* interned byte-set index */

void gseq_free(gseq *s);
void gseq_push(gseq *s, int kind, int arg);
static inline void gseq_rule(gseq *s, int r) { gseq_push(s, GE_RULE, r); }
void gseq_byteset(gir *g, gseq *s, const gbyteset *set);
void gseq_byte(gir *g, gseq *s, unsigned b);
void gseq_lit(gir *g, gseq *s, const char *p, size_t n);

/* Rules built from pieces. */
int gir_rule_lit(gir *g, const char *p, size_t n);         /* matches exactly p */
/* A rule for repetitions of rule x: min..max times (max < 0: unbounded). */
int gir_repeat(gir *g, int x, int min, int max);
/* A rule for one character out of a set of code-point ranges (lo[i]..hi[i], sorted or
 * not, may overlap), as UTF-8 byte sequences; surrogates are never produced. negate:
 * the complement within U+0000..U+10FFFF. */
int gir_char_class(gir *g, const uint32_t *lo, const uint32_t *hi, int n, int negate);
/* A rule of one alternative holding one element. */
int gir_wrap_set(gir *g, const gbyteset *s);

/* Check the grammar: every referenced rule defined, the root defined, no left recursion
 * (a rule reaching itself at its leftmost position other than in tail position).
 * Returns GERBIL_OK or an error naming the rule. */
gerbil_status gir_check(gir *g);

/* ---- front ends ---- */
gerbil_status gir_from_gbnf(gir *g, const char *src, size_t len);
/* A regex (ECMAScript syntax subset) matching the whole text; into rule *out. */
enum { GRX_PLAIN = 0, GRX_JSON_STRING = 1 }; /* JSON_STRING: the body of a JSON string (escaped) */
gerbil_status gir_from_regex(gir *g, const char *re, size_t len, int mode, int search, int *out);
struct cJSON;
typedef struct gschema_opts {
    int compact;       /* no whitespace between tokens */
    int max_ws;        /* flexible mode: at most this many whitespace bytes in a row (0: unbounded) */
} gschema_opts;
gerbil_status gir_from_schema(gir *g, const struct cJSON *schema, const gschema_opts *o);
/* GERBIL_GRAMMAR_SEQUENCE's spec (grammar_seq.c): sets g->root. */
gerbil_status gir_from_sequence(gir *g, const struct cJSON *spec, const gschema_opts *o);
/* Any JSON value / object (json_object mode). */
int gir_json_value(gir *g, const gschema_opts *o);
int gir_json_object(gir *g, const gschema_opts *o);

#endif
