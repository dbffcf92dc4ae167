/* The build's identity for --version, run records and checkpoints: version, git commit, CUDA
 * or not. Nothing here reads files, the environment or the hardware. */
#ifndef TZ_BUILD_INFO_H
#define TZ_BUILD_INFO_H

/* The project version (CMake's PROJECT_VERSION), e.g. "0.1.0". */
const char *tz_build_version(void);
/* The short git commit of the source tree at configure time ("+dirty" when it had local
 * changes), or "unknown" outside a git checkout. */
const char *tz_build_commit(void);
/* 1 when the CUDA backend was compiled in. */
int tz_build_has_cuda(void);

#endif
