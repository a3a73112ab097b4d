/* A Jinja2 interpreter for chat templates, rendering as transformers does:
 * ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, loopcontrols),
 * tojson as json.dumps(ensure_ascii=False), raise_exception, strftime_now.
 *
 * Pipeline: jinja_lex (source -> tokens, whitespace control applied) -> jinja_parse
 * (tokens -> AST) -> jinja_eval (AST + context -> text). Every allocation of one render
 * lives in one arena that is freed at the end, so values are plain pointers without
 * reference counts and error paths never leak. Values follow Python semantics
 * (int/float/str/list/dict with insertion order, None, bool as an int) and print
 * the way Python's str() prints them. */
#ifndef GB_JINJA_H
#define GB_JINJA_H

#include "gerbil.h"
#include <stddef.h>
#include <stdint.h>

/* ---- arena ---- */
struct jarena_chunk;
typedef struct jarena {
    struct jarena_chunk *head;
    size_t used_total; /* bytes handed out, checked against JINJA_MAX_MEMORY */
    int oom;           /* set once an allocation failed or hit the cap */
} jarena;

enum {
    JINJA_MAX_MEMORY = 512 << 20, /* arena cap for one render */
    JINJA_MAX_OUTPUT = 32 << 20,  /* largest string a template may build */
    JINJA_MAX_DEPTH = 400,        /* nesting of the parser and of the evaluator */
    JINJA_MAX_CALLS = 120,        /* nested macro calls */
    JINJA_MAX_RANGE = 100000,     /* range() limit, as the sandbox's MAX_RANGE */
    JINJA_MAX_STEPS = 20000000,   /* loop iterations + macro calls per render */
};

void *ja_alloc(jarena *a, size_t n); /* zeroed; NULL when over the cap */
void *ja_alloc_raw(jarena *a, size_t n); /* not zeroed */
void ja_free_all(jarena *a);
char *ja_strndup(jarena *a, const char *s, size_t n);

/* ---- values ---- */
typedef enum {
    JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT,
    JV_NS,     /* namespace(): a dict whose attributes may be assigned */
    JV_MACRO,  /* a template macro (or caller) */
    JV_NATIVE, /* a builtin function or bound method */
    JV_LOOP,   /* the loop variable of a for */
} jv_type;

typedef struct jv jv;
typedef struct jctx jctx;
struct jnode;
struct jframe;
struct jloop;

/* Arguments of a call: positional then keyword. */
typedef struct jargs {
    jv **pos;
    int npos;
    const char **kwn;
    jv **kwv;
    int nkw;
} jargs;

typedef jv *(*jv_native_fn)(jctx *c, jv *self, jargs *a, int line);

struct jv {
    uint8_t type;
    uint8_t tuple;  /* a list that prints as a tuple */
    uint8_t markup; /* a str marked safe (Markup): escape() leaves it alone */
    union {
        int64_t i; /* bool and int */
        double f;
        struct { char *p; size_t n; } s;           /* NUL-terminated UTF-8 */
        struct { jv **v; size_t n, cap; } l;        /* list / tuple */
        struct { jv **k, **v; size_t n, cap; } d;   /* dict / namespace, insertion order */
        struct { const char *hint; } u;             /* undefined: the error when it is used */
        struct { jv_native_fn fn; jv *self; const char *name; } nat;
        struct { struct jnode *node; struct jframe *closure; } mac;
        struct jloop *loop;
    };
};

extern jv jv_undef_v, jv_none_v, jv_true_v, jv_false_v;
#define JV_UNDEFINED (&jv_undef_v)
#define JV_NONEV (&jv_none_v)
#define JV_TRUE (&jv_true_v)
#define JV_FALSE (&jv_false_v)

/* The state behind a for loop's "loop" variable. */
struct jloop {
    jv *items; /* what is iterated, after the loop's if-filter */
    size_t idx;
    int depth;
    jv *last_changed;
};

/* ---- the render context ---- */
typedef struct jsb { char *p; size_t n, cap; } jsb; /* string builder in the arena */

struct jctx {
    jarena arena;
    jv *globals;          /* the render variables (a dict) */
    gerbil_status status; /* of the first error; GERBIL_OK while none */
    int depth, calls;
    long steps;
    jv *blockval;         /* the captured body a filter block / set block filters */
};

/* Record an error (first one wins) and return NULL, for `return jerr(...)`. */
void *jerr(jctx *c, int line, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
void *jerr_raise(jctx *c, const char *msg); /* raise_exception(): INVALID_ARG, message as is */

/* Constructors (arena). NULL on out-of-memory (error recorded). */
jv *jv_bool(int b);
jv *jv_int(jctx *c, int64_t i);
jv *jv_float(jctx *c, double f);
jv *jv_str(jctx *c, const char *s, size_t n);
jv *jv_cstr(jctx *c, const char *s);
jv *jv_list(jctx *c, size_t cap);
jv *jv_dict(jctx *c, size_t cap);
jv *jv_undef_hint(jctx *c, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
jv *jv_native(jctx *c, jv_native_fn fn, jv *self, const char *name);
int jv_list_push(jctx *c, jv *l, jv *x);          /* 0 ok, -1 oom */
int jv_dict_set(jctx *c, jv *d, jv *k, jv *x);    /* replaces in place when present */
jv *jv_dict_get(jv *d, jv *k);                    /* NULL when absent */
jv *jv_dict_gets(jv *d, const char *k);           /* string key */

/* Python semantics. */
int jv_truthy(const jv *v);
int jv_equal(const jv *a, const jv *b);
/* -1/0/1 into *out; returns -1 (error recorded) for unorderable types. */
int jv_compare(jctx *c, int line, const jv *a, const jv *b, int *out);
const char *jv_type_name(const jv *v); /* Python's type name: "str", "dict", ... */
int jv_is_seq(const jv *v);            /* list or tuple */
int jv_is_num(const jv *v);            /* bool, int or float */
double jv_num(const jv *v);
size_t jv_utf8_len(const char *s, size_t n); /* code points */

/* str(), repr() and json.dumps() into a builder; -1 on error (recorded). */
int jv_str_into(jctx *c, jsb *b, const jv *v);
int jv_repr_into(jctx *c, jsb *b, const jv *v);
jv *jv_to_str(jctx *c, jv *v); /* str(v) as a value; strings are returned as they are */
typedef struct { int indent; const char *indent_str; int sort_keys; int ensure_ascii;
                 const char *item_sep, *key_sep; } jjson_opts;
int jv_json_into(jctx *c, int line, jsb *b, const jv *v, const jjson_opts *o, int level);
/* Parse JSON text (as Python's json.loads: int vs float kept, key order kept). */
jv *jv_parse_json(jctx *c, const char *s, size_t n);
void jv_float_repr(double f, char *buf, size_t cap); /* Python repr(float) */

int jsb_put(jctx *c, jsb *b, const char *s, size_t n);
int jsb_puts(jctx *c, jsb *b, const char *s);
int jsb_putc(jctx *c, jsb *b, char ch);
int jsb_printf(jctx *c, jsb *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
jv *jsb_to_str(jctx *c, jsb *b);

/* UTF-8 helpers. */
int ju_decode(const char *s, size_t n, size_t *i); /* next code point (bad bytes: U+FFFD) */
int ju_encode(int cp, char *out);                  /* bytes written (1..4) */
int ju_isspace(int cp);                            /* Python str.isspace() */

/* ---- lexer ---- */
typedef enum {
    JT_EOF, JT_DATA, JT_VAR_BEGIN, JT_VAR_END, JT_BLOCK_BEGIN, JT_BLOCK_END,
    JT_NAME, JT_STRING, JT_INT, JT_FLOAT, JT_OP,
} jtok_type;

typedef struct jtok {
    jtok_type type;
    int line;
    const char *p; /* text of names, operators and data */
    size_t n;
    jv *val;       /* literal value of strings and numbers */
} jtok;

/* Tokenize src with trim_blocks and lstrip_blocks on. *toks lives in the arena. */
int jinja_lex(jctx *c, const char *src, jtok **toks, int *ntoks);

/* ---- AST ---- */
typedef enum {
    /* statements */
    N_BODY, N_TEXT, N_OUTPUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_CALLBLOCK,
    N_FILTERBLOCK, N_WITH, N_BREAK, N_CONTINUE,
    /* expressions */
    N_CONST, N_NAME, N_GETATTR, N_GETITEM, N_SLICE, N_CALL, N_FILTER, N_TEST, N_NOT, N_NEG,
    N_POS, N_BIN, N_AND, N_OR, N_CMP, N_COND, N_LIST, N_TUPLE, N_DICT, N_BLOCKVAL,
} jnode_kind;

/* Binary and comparison operators. */
enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_CONCAT,
       OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN };

typedef struct jnode {
    jnode_kind kind;
    int line;
    int op;               /* N_BIN/N_CMP operator; N_TEST: negated */
    const char *str;      /* name, attribute, filter or test name, text */
    size_t slen;
    jv *val;              /* N_CONST */
    struct jnode *a, *b, *c, *d, *e;
    struct jnode **kids;  /* statements, items, positional args, params, comparison operands */
    int nkids;
    const char **kwn;     /* keyword names (call args) */
    struct jnode **kwv;   /* keyword values, dict values, macro defaults (NULL: none) */
    int nkw;
    uint8_t *ops;         /* N_CMP: nkids-1 operators */
} jnode;
/*
 * Field use by kind:
 *  N_IF     a=cond b=body c=else (N_BODY, or N_IF for elif) or NULL
 *  N_FOR    a=target b=iter c=body d=else e=filter
 *  N_SET    a=target (N_NAME, N_TUPLE of names, N_GETATTR on a namespace) b=value
 *  N_SETBLOCK a=target b=body c=filter chain over N_BLOCKVAL or NULL
 *  N_MACRO  str=name kids=params (N_NAME) kwv=defaults b=body
 *  N_CALLBLOCK a=N_CALL b=body kids/kwv=caller params/defaults
 *  N_FILTERBLOCK a=filter chain over N_BLOCKVAL b=body
 *  N_WITH   kids=targets kwv=values b=body
 *  N_SLICE  a=obj b=start c=stop d=step
 *  N_COND   a=cond b=then c=else
 *  N_DICT   kids=keys kwv=values
 */

/* Parse the tokens into a N_BODY. NULL on a syntax error (recorded). */
jnode *jinja_parse(jctx *c, jtok *toks, int ntoks);

/* ---- evaluation ---- */
typedef struct jframe {
    struct jframe *parent;
    jv *vars;     /* dict */
    int captured; /* a macro closes over it: never reuse it */
} jframe;

int jinja_render(jctx *c, jnode *body, jsb *out); /* 0 ok, -1 error (recorded) */

/* Used by the filter / method library. */
jv *jinja_call(jctx *c, jv *fn, jargs *a, int line);
jv *jinja_getattr(jctx *c, jv *obj, const char *name, int line);
jv *jinja_getitem(jctx *c, jv *obj, jv *key, int line);
jv *jinja_iter_list(jctx *c, jv *v, int line); /* list()/iter(): list of items (dict: keys) */
jv *jinja_str_method(jctx *c, jv *s, const char *name);  /* NULL when no such method */
jv *jinja_dict_method(jctx *c, jv *d, const char *name);
jv *jinja_global(const char *name);                       /* builtins: range, namespace, ... */
jv *jinja_filter(jctx *c, const char *name, jv *v, jargs *a, int line, int *found);
int jinja_test(jctx *c, const char *name, jv *v, jargs *a, int line, int *found); /* 1/0, -1 error */
int jinja_is_filter(const char *name);
int jinja_is_test(const char *name);

/* Argument helpers: the idx-th positional argument or the keyword name, else NULL. */
jv *jarg(jargs *a, int idx, const char *name);

#endif
