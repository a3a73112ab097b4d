/* Backends by name (backend.h backend_new). */
#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "backend/ref/ref_backend.h"
#include "base/status.h"

#include <string.h>

gerbil_status backend_new(const char *name, int n_threads, struct backend **out) {
    *out = NULL;
    if (!name || !*name || !strcmp(name, "cpu")) return backend_cpu_new(n_threads, out);
    if (!strcmp(name, "ref")) *out = backend_ref_new();
    else return err_set(GERBIL_ERR_UNSUPPORTED, "unknown backend \"%s\" (this build has: cpu, ref)", name);
    return *out ? GERBIL_OK : GERBIL_ERR_NOMEM;
}
