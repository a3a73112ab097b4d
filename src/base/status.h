/* Errors are values: a status plus a thread-local message naming the culprit. */
#ifndef GB_STATUS_H
#define GB_STATUS_H

#include "gerbil.h"

#if defined(__GNUC__)
#define GB_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define GB_PRINTF(a, b)
#endif

/* Record a message for this thread and return s, so callers write
 *   return err_set(GERBIL_ERR_FORMAT, "%s: header length %llu past end of file", path, n); */
gerbil_status err_set(gerbil_status s, const char *fmt, ...) GB_PRINTF(2, 3);
/* Prefix the current message with more context ("loading model: ..."), return s. */
gerbil_status err_prefix(gerbil_status s, const char *fmt, ...) GB_PRINTF(2, 3);
void err_clear(void);

/* Invariant checks that stay on in release builds; abort with file:line. */
void gb_abort(const char *file, int line, const char *msg);
#define GB_ASSERT(x) do { if (!(x)) gb_abort(__FILE__, __LINE__, #x); } while (0)

#define GB_TRY(expr) do { gerbil_status st_ = (expr); if (st_ != GERBIL_OK) return st_; } while (0)

#endif
