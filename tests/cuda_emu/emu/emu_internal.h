/* Between the CUDA emulation's own files (tests/cuda_emu/emu/): the device-memory checks cuBLAS needs
 * and the one error path. */
#ifndef TZ_EMU_INTERNAL_H
#define TZ_EMU_INTERNAL_H
#include "cuda_runtime.h"

#pragma GCC visibility push(hidden)
/* 1 when [p, p + bytes) lies inside one live device allocation. */
int tz_emu_dev_range(const void *p, size_t bytes);
/* 1 when s is 0, a special stream or a live stream of cudaStreamCreate*. */
int tz_emu_stream_ok(cudaStream_t s);
/* A misuse the emulation reports but the API would only return as a code: one stderr line,
 * "CUDA emulation: ..." (the caller then returns the code). */
void tz_emu_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#pragma GCC visibility pop
#endif
