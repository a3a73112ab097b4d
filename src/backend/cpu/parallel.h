/* Element-wise work split over the model's pool (src/backend/cpu/ops.c). */
#ifndef GB_CPU_PARALLEL_H
#define GB_CPU_PARALLEL_H

#include "backend/ops.h"

/* fn(ctx, lo, hi) over contiguous parts of [0, n); on the caller alone when
 * n * work_per_item is small (decode), where waking workers costs more than the work.
 * Each item is handled by exactly one thread, so results do not depend on the count. */
void parallel_range(struct backend *be, long n, long work_per_item, void (*fn)(void *, long, long), void *ctx);

#endif
