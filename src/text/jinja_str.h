/* Python str operations on UTF-8 values, shared by the Jinja filters and methods. */
#ifndef GB_JINJA_STR_H
#define GB_JINJA_STR_H

#include "text/jinja.h"

jv *jstr_case(jctx *c, jv *s, int upper);            /* str.upper() / str.lower() */
jv *jstr_capitalize(jctx *c, jv *s);                 /* str.capitalize() */
jv *jstr_title_filter(jctx *c, jv *s);               /* Jinja's title filter */
jv *jstr_title_method(jctx *c, jv *s);               /* str.title() */
/* strip chars (a str, or NULL: whitespace) from the left (1), right (2) or both (3) */
jv *jstr_strip(jctx *c, jv *s, jv *chars, int which);
jv *jstr_replace(jctx *c, jv *s, jv *old, jv *new_, int64_t count);
int jstr_parse_int(const jv *s, int base, int64_t *out);  /* Python int(str, base) */
int jstr_parse_float(const jv *s, double *out);            /* Python float(str) */
jv *jstr_splitlines(jctx *c, const char *p, size_t n);     /* str.splitlines() */
jv *jstr_pad(jctx *c, jv *s, int64_t width, char mode, const char *fill); /* center/ljust/rjust */
int64_t jstr_wordcount(jv *s);
jv *jstr_striptags(jctx *c, jv *s);
jv *jstr_percent_format(jctx *c, jv *fmt, jargs *a, int line); /* "%s" % args */
int jstr_is_case(jv *s, int upper);                          /* str.isupper() / islower() */

#endif
