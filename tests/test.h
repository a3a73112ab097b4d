/* Minimal test harness: CHECK records a failure and continues; test_done() prints
 * "N passed, N failed" and returns the exit code. SKIP exits 77 (CTest: skipped). */
#ifndef GB_TEST_H
#define GB_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int test_pass_, test_fail_;

#define CHECK(cond) do { \
    if (cond) test_pass_++; \
    else { test_fail_++; fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); } \
} while (0)

#define CHECKF(cond, ...) do { \
    if (cond) test_pass_++; \
    else { test_fail_++; fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
           fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } \
} while (0)

#define SKIP(...) do { fprintf(stderr, "SKIPPED: "); fprintf(stderr, __VA_ARGS__); \
                       fputc('\n', stderr); exit(77); } while (0)

static inline int test_done(void) {
    printf("%d passed, %d failed\n", test_pass_, test_fail_);
    return test_fail_ ? 1 : 0;
}

/* xorshift64*: deterministic per seed, seeded fresh per run by the tests that want it. */
static inline unsigned long long test_rand_u64(unsigned long long *s) {
    *s ^= *s >> 12; *s ^= *s << 25; *s ^= *s >> 27;
    return *s * 2685821657736338717ULL;
}
static inline float test_rand_f(unsigned long long *s) { /* uniform [-1, 1) */
    return (float)((test_rand_u64(s) >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

#endif
