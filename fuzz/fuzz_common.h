/* Shared by the fuzz harnesses (fuzz/fuzz_*.c): a per-process scratch folder on tmpfs for
 * the loaders that take paths, and the split of one input into several files. Each harness
 * defines LLVMFuzzerTestOneInput; built with -DGERBIL_FUZZ=ON (clang, libFuzzer) or, in the
 * normal build, linked with fuzz/replay.c to replay a corpus (tests/fuzz-regress). */
#ifndef GB_FUZZ_COMMON_H
#define GB_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Parts of one input are separated by this line (in the dictionaries too). */
#define FZ_SEP "\n--8<--\n"
enum { FZ_SEP_LEN = sizeof FZ_SEP - 1 };

static char fz_dir_[64];

static inline void fz_cleanup(void) {
    char cmd[96];
    if (!fz_dir_[0]) return;
    snprintf(cmd, sizeof cmd, "rm -rf %s", fz_dir_);
    if (system(cmd)) { /* nothing to do */ }
}

/* The scratch folder (created on first use, removed at exit). */
static inline const char *fz_dir(void) {
    if (!fz_dir_[0]) {
        const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
        snprintf(fz_dir_, sizeof fz_dir_, "%s/gerbil-fuzz-XXXXXX", base);
        if (!mkdtemp(fz_dir_)) abort();
        atexit(fz_cleanup);
    }
    return fz_dir_;
}

/* Write n bytes to DIR/name (name may be "" for the folder itself); returns the path in a
 * static buffer per slot (0..3). */
static inline const char *fz_write(int slot, const char *name, const void *data, size_t n) {
    static char paths[4][160];
    snprintf(paths[slot], sizeof paths[slot], "%s/%s", fz_dir(), name);
    FILE *f = fopen(paths[slot], "wb");
    if (!f) abort();
    if (n && fwrite(data, 1, n, f) != n) abort();
    fclose(f);
    return paths[slot];
}

static inline void fz_remove(const char *name) {
    char p[160];
    snprintf(p, sizeof p, "%s/%s", fz_dir(), name);
    unlink(p);
}

/* Split data at FZ_SEP into at most max parts (the last part keeps any further separators);
 * returns the number of parts (>= 1). */
static inline int fz_split(const uint8_t *data, size_t n, const uint8_t **part, size_t *len, int max) {
    int k = 0;
    const uint8_t *p = data, *end = data + n;
    while (k < max - 1) {
        const uint8_t *q = NULL;
        for (const uint8_t *s = p; s + FZ_SEP_LEN <= end; s++)
            if (*s == '\n' && !memcmp(s, FZ_SEP, FZ_SEP_LEN)) { q = s; break; }
        if (!q) break;
        part[k] = p;
        len[k++] = (size_t)(q - p);
        p = q + FZ_SEP_LEN;
    }
    part[k] = p;
    len[k++] = (size_t)(end - p);
    return k;
}

/* A NUL-terminated copy (malloc'd). */
static inline char *fz_str(const uint8_t *p, size_t n) {
    char *s = malloc(n + 1);
    if (!s) abort();
    memcpy(s, p, n);
    s[n] = 0;
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
