/* Making a backend of a kind (run.device) and loading the CUDA module (libtzcuda.so): the
 * floor above core that knows every backend built in (src/cpu, cuda/). */
#include "backend/registry.h"

#include <stddef.h>
#include <string.h>

#include "core/error.h"

/* TZ_HAVE_CUDA_BACKEND is defined for this file by cuda/cuda.cmake when cuda/ is built: the
 * backend is then the loadable module libtzcuda.so, opened on first need. */
#ifdef TZ_HAVE_CUDA_BACKEND
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "backend/cuda_module.h"
#include "quant/fwht.h"

const char *tz_backend_names(void) { return "cpu, cuda"; }

/* What the module calls back in the program (besides the error path and allocators every
 * program has): named here so that every program linking core has them to export
 * (backend/cuda_module.h). */
void *tz_cuda_module_needs[] = {(void *)tz_tq_signs_row, (void *)tz_tq_check_shape,
                                (void *)tz_info_all, (void *)tz_xcalloc};

static struct {
    int tried;
    void *handle;
    tz_cuda_device_count_fn *count; /* the module's entry points (backend/cuda_module.h) */
    tz_cuda_create_fn *create;
    char why[1536];
    int count_warned; /* a failing cudaGetDeviceCount was reported */
} g_mod;

/* Opens the module once: $TZ_CUDA_MODULE, else libtzcuda.so beside the program, else where
 * this build made it. 1 when loaded, else 0 with the reason in g_mod.why. */
static int module_load(void) {
    if (g_mod.tried) return g_mod.handle != NULL;
    g_mod.tried = 1;
    char cand[3][PATH_MAX + 32];
    int n = 0;
    const char *env = getenv("TZ_CUDA_MODULE");
    if (env && *env) snprintf(cand[n++], sizeof cand[0], "%s", env);
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) {
        exe[len] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) *slash = 0, snprintf(cand[n++], sizeof cand[0], "%s/libtzcuda.so", exe);
    }
    snprintf(cand[n++], sizeof cand[0], "%s", TZ_CUDA_MODULE_BUILT);
    size_t w = 0;
    for (int i = 0; i < n && !g_mod.handle; i++) {
        if (access(cand[i], F_OK) != 0 && i + 1 < n) continue;
        g_mod.handle = dlopen(cand[i], RTLD_NOW | RTLD_LOCAL);
        if (!g_mod.handle && w < sizeof g_mod.why) {
            const char *e = dlerror();
            w += (size_t)snprintf(g_mod.why + w, sizeof g_mod.why - w, "%s%s", w ? "; " : "",
                                  e ? e : cand[i]);
        }
    }
    if (!g_mod.handle) return 0;
    g_mod.count = (tz_cuda_device_count_fn *)dlsym(g_mod.handle, TZ_CUDA_SYM_DEVICE_COUNT);
    g_mod.create = (tz_cuda_create_fn *)dlsym(g_mod.handle, TZ_CUDA_SYM_CREATE);
    tz_cuda_abi_fn *abi = (tz_cuda_abi_fn *)dlsym(g_mod.handle, TZ_CUDA_SYM_ABI);
    if (!g_mod.count || !g_mod.create || !abi) {
        snprintf(g_mod.why, sizeof g_mod.why, "the CUDA module lacks its entry points (%s)",
                 dlerror());
    } else if (abi() != TZ_CUDA_ABI_STAMP) {
        snprintf(g_mod.why, sizeof g_mod.why, "the CUDA module was built from another version "
                 "of turbozero (layout stamp %llx, this program's %llx): rebuild both together",
                 (unsigned long long)abi(), (unsigned long long)TZ_CUDA_ABI_STAMP);
    } else {
        return 1;
    }
    dlclose(g_mod.handle);
    g_mod.handle = NULL;
    return 0;
}

const char *tz_cuda_module_error(void) { return module_load() ? NULL : g_mod.why; }

void *tz_cuda_module_symbol(const char *name) {
    return g_mod.handle ? dlsym(g_mod.handle, name) : NULL;
}

/* An NVIDIA device node: without one no GPU is usable, and nothing is loaded to find out. */
static int nvidia_present(void) {
    return access("/dev/nvidiactl", F_OK) == 0 || access("/dev/nvidia0", F_OK) == 0;
}

/* Without a device node nothing is loaded, unless $TZ_CUDA_MODULE names a module: that one is
 * asked (the CPU emulation of the backend, libtzcuda_emu.so, has a device without a node).
 * Where a node is there but CUDA counts no device, CUDA's error says why (an old driver, a
 * driver and device that disagree, ...): reported once, as a warning, since run.device =
 * "auto" then quietly computes on the CPU. */
int tz_cuda_device_count(void) {
    const char *env = getenv("TZ_CUDA_MODULE");
    if (!(env && *env) && !nvidia_present()) return 0;
    if (!module_load()) return 0;
    char why[320] = "";
    int n = g_mod.count(why, sizeof why);
    if (n <= 0 && why[0] && !g_mod.count_warned) {
        g_mod.count_warned = 1;
        tz_warn("no usable CUDA device (%s)", why);
    }
    return n;
}

tz_backend *tz_cuda_backend_create(int device) {
    if (!module_load())
        TZ_FATAL_HINT("set run.device = \"cpu\" (or \"auto\"), or install the CUDA runtime "
                      "and cuBLAS this build was made with",
                      "run.device = \"cuda\": the CUDA backend cannot be loaded: %s", g_mod.why);
    return g_mod.create(device);
}
#else
const char *tz_backend_names(void) { return "cpu"; }

int tz_cuda_device_count(void) { return -1; }

const char *tz_cuda_module_error(void) { return "this build has no CUDA backend"; }

void *tz_cuda_module_symbol(const char *name) {
    (void)name;
    return NULL;
}

tz_backend *tz_cuda_backend_create(int device) {
    (void)device;
    TZ_FATAL_HINT("set run.device = \"cpu\" (or \"auto\"), or build with cmake -DTZ_CUDA=ON",
                  "run.device = \"cuda\": this build has no CUDA backend");
}
#endif

tz_backend *tz_backend_create(enum tz_device_kind kind, int device, int threads) {
    if (kind == TZ_DEVICE_AUTO) kind = tz_cuda_device_count() > 0 ? TZ_DEVICE_CUDA : TZ_DEVICE_CPU;
    tz_backend *be;
    if (kind == TZ_DEVICE_CPU) be = tz_cpu_backend_create(threads);
    else if (kind == TZ_DEVICE_CUDA) be = tz_cuda_backend_create(device < 0 ? 0 : device);
    else
        TZ_FATAL("no backend of kind %d (expected auto, or one built in: %s)", (int)kind,
                 tz_backend_names());
    tz_backend_check(be);
    return be;
}

