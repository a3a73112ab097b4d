/* Backends by name (backend.h backend_new), and the GPUs of this build (gerbil.h). */
#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "backend/ref/ref_backend.h"
#include "base/status.h"
#ifdef GERBIL_HAVE_CUDA
#include "backend/cuda/cuda.h"
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "cuda" -> 0, "cuda:N" -> N; -1 when name is not a CUDA device name, -2 when malformed. */
static int cuda_index(const char *name) {
    if (strncmp(name, "cuda", 4)) return -1;
    if (!name[4]) return 0;
    if (name[4] != ':' || !name[5]) return -2;
    char *end;
    long v = strtol(name + 5, &end, 10);
    return *end || v < 0 || v > 1024 ? -2 : (int)v;
}

gerbil_status backend_new(const char *name, int n_threads, struct backend **out) {
    *out = NULL;
    if (!name || !*name || !strcmp(name, "cpu")) return backend_cpu_new(n_threads, out);
    if (!strcmp(name, "ref")) {
        *out = backend_ref_new();
        return *out ? GERBIL_OK : GERBIL_ERR_NOMEM;
    }
    const int dev = cuda_index(name);
    if (dev == -2) return err_set(GERBIL_ERR_UNSUPPORTED, "bad device \"%s\" (expected cuda or cuda:N)", name);
#ifdef GERBIL_HAVE_CUDA
    if (dev >= 0) return backend_cuda_new(dev, out);
    return err_set(GERBIL_ERR_UNSUPPORTED, "unknown backend \"%s\" (this build has: cpu, ref, cuda[:N])", name);
#else
    if (dev >= 0)
        return err_set(GERBIL_ERR_UNSUPPORTED, "\"%s\": this build has no CUDA backend (configure with -DGERBIL_CUDA=ON "
                       "where nvcc is installed)", name);
    return err_set(GERBIL_ERR_UNSUPPORTED, "unknown backend \"%s\" (this build has: cpu, ref)", name);
#endif
}

int gerbil_gpu_count(void) {
#ifdef GERBIL_HAVE_CUDA
    return cuda_device_count();
#else
    return 0;
#endif
}

gerbil_status gerbil_gpu_info(int i, char *name, size_t cap, size_t *total_bytes, size_t *free_bytes) {
#ifdef GERBIL_HAVE_CUDA
    return cuda_device_info(i, name, cap, total_bytes, free_bytes);
#else
    (void)i; (void)name; (void)cap; (void)total_bytes; (void)free_bytes;
    return err_set(GERBIL_ERR_UNSUPPORTED, "this build has no CUDA backend");
#endif
}
