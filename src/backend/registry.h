/* The backends built in, by kind (run.device), and the CUDA module (cuda/, libtzcuda.so,
 * loaded on first need): the floor above core/ that knows them all. core/backend.h is the op
 * table every backend fills; this is where one is made. */
#ifndef TZ_BACKEND_REGISTRY_H
#define TZ_BACKEND_REGISTRY_H
#include "core/backend.h"
#include "cpu/cpu_backend.h"

/* A backend of a kind: TZ_DEVICE_CPU, TZ_DEVICE_CUDA, or TZ_DEVICE_AUTO (cuda when this build
 * has the CUDA backend and a GPU is visible, else cpu); the run.device key. device: the GPU ordinal hint (taken
 * modulo the visible GPUs; < 0: 0), ignored by cpu. threads: CPU threads (<= 0: OpenMP
 * default), used by cpu. Fatal, with a hint, when the backend named cannot be created
 * (a build without CUDA, no GPU), or when the table it fills has a NULL op. */
tz_backend *tz_backend_create(enum tz_device_kind kind, int device, int threads);
/* Names of the backends built in, e.g. "cpu, cuda" (a static string). */
const char *tz_backend_names(void);

/* The CUDA backend (cuda/, built as the module libtzcuda.so and loaded on first need; present
 * in builds configured with it, see tz_cuda_device_count). Creating it without a GPU, or
 * where the module cannot be loaded, is fatal. */
tz_backend *tz_cuda_backend_create(int device);
/* Visible CUDA devices; 0 when none (no NVIDIA device node, no driver, or the module cannot
 * be loaded); -1 in a build without CUDA. */
int tz_cuda_device_count(void);
/* NULL when the CUDA module loads (opening it if not yet open), else why not (a build
 * without CUDA, a missing library, an unresolved symbol). */
const char *tz_cuda_module_error(void);
/* A symbol of the loaded CUDA module (dlsym), e.g. the NCCL comm's entry points (comm/); NULL
 * when the module is not loaded, lacks it, or the build has no CUDA backend. */
void *tz_cuda_module_symbol(const char *name);

#endif
