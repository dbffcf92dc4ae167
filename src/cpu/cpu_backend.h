/* The CPU backend's constructor (src/cpu/cpu_backend.c): the reference for every op, always
 * built. Programs choose a backend by name through backend/registry.h. */
#ifndef TZ_CPU_BACKEND_H
#define TZ_CPU_BACKEND_H
#include "core/backend.h"

/* The CPU backend (always available). threads <= 0: OpenMP default. */
tz_backend *tz_cpu_backend_create(int threads);
void tz_cpu_backend_destroy(tz_backend *be);

#endif
