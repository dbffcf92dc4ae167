/* What this binary is: version, git commit (known when CMake configured the build), CUDA or
 * not. Reads no files and starts nothing; the CPU kernel is asked of the backend. */
#include "core/build_info.h"

#ifndef TZ_GIT_COMMIT
#define TZ_GIT_COMMIT "unknown"
#endif
#ifndef TZ_BUILD_CUDA
#define TZ_BUILD_CUDA 0
#endif

const char *tz_build_version(void) { return TZ_VERSION; }

const char *tz_build_commit(void) { return TZ_GIT_COMMIT; }

int tz_build_has_cuda(void) { return TZ_BUILD_CUDA; }
