#ifndef GB_TIMER_H
#define GB_TIMER_H
#include <time.h>
/* Monotonic seconds. */
static inline double time_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
#endif
