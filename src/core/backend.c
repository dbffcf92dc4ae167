/* Choosing a backend by name (run.device), and the check that a backend's table is whole. */
#include <stddef.h>
#include <string.h>

#include "core/backend.h"
#include "core/error.h"

/* TZ_BACKEND_OPS must name every function pointer of struct tz_backend: the struct is those
 * pointers, the three fields before `destroy` and the two byte counters. */
#define TZ_COUNT_OP(op) +1
_Static_assert(sizeof(tz_backend) == offsetof(tz_backend, destroy) +
                                         (0 TZ_BACKEND_OPS(TZ_COUNT_OP)) * sizeof(void (*)(void)) +
                                         2 * sizeof(size_t),
               "TZ_BACKEND_OPS (core/backend.h) must list every op of struct tz_backend");

void tz_backend_check(const tz_backend *be) {
#define TZ_CHECK_OP(op)                                                                       \
    if (!be->op)                                                                              \
        TZ_FATAL("backend %s: op %s is missing from its table (every op of core/backend.h "   \
                 "must be set)", be->name ? be->name : "?", #op);
    TZ_BACKEND_OPS(TZ_CHECK_OP)
#undef TZ_CHECK_OP
}

/* TZ_HAVE_CUDA_BACKEND is defined for this file by cuda/cuda.cmake when cuda/ is built. */
#ifdef TZ_HAVE_CUDA_BACKEND
const char *tz_backend_names(void) { return "cpu, cuda"; }
#else
const char *tz_backend_names(void) { return "cpu"; }

int tz_cuda_device_count(void) { return -1; }

tz_backend *tz_cuda_backend_create(int device) {
    TZ_FATAL_HINT("set run.device = \"cpu\" (or \"auto\"), or build with cmake -DTZ_CUDA=ON",
                  "run.device = \"cuda\": this build has no CUDA backend");
}
#endif

tz_backend *tz_backend_create(const char *name, int device, int threads) {
    if (!name || !*name || !strcmp(name, "auto"))
        name = tz_cuda_device_count() > 0 ? "cuda" : "cpu";
    tz_backend *be;
    if (!strcmp(name, "cpu")) be = tz_cpu_backend_create(threads);
    else if (!strcmp(name, "cuda")) be = tz_cuda_backend_create(device < 0 ? 0 : device);
    else
        TZ_FATAL("no backend named \"%s\" (expected auto, or one built in: %s)", name,
                 tz_backend_names());
    tz_backend_check(be);
    return be;
}

void tz_backend_destroy(tz_backend *be) {
    if (be) be->destroy(be);
}
