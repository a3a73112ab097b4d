/* The reference backend: backend.h's table in plain scalar C, single-threaded, every
 * op written as its definition. It is the oracle the other backends are tested
 * against and a second implementation that keeps the table honest. */
#ifndef GB_REF_BACKEND_H
#define GB_REF_BACKEND_H

#include "backend/backend.h"

/* NULL with the message set when out of memory. */
struct backend *backend_ref_new(void);

#endif
