/* The NCCL comm (comm.backend = "nccl"): a tz_comm whose buffers are device memory of a CUDA
 * backend, its collectives ordered on that backend's copy queue (TZ_QUEUE_COPY). NCCL itself
 * lives in the CUDA module (cuda/cuda_comm_nccl.cu), which loads libnccl.so.2 with dlopen
 * when a comm is created; this side bootstraps it over the run's host comm (rank 0's
 * ncclUniqueId broadcast) and wraps the module's entry points, found by dlsym, into the comm
 * table. No MPI types in this header: src/train may include it. */
#ifndef TZ_COMM_NCCL_H
#define TZ_COMM_NCCL_H
#include <stddef.h>
#include <stdint.h>

#include "backend/cuda_module.h"
#include "comm/fwd.h"
#include "core/backend.h"

/* 1 when `be` is a CUDA backend whose module has the NCCL entry points and libnccl.so.2 (or
 * $TZ_NCCL_LIBRARY) loads; else 0 with the reason in why. Not collective. */
int tz_comm_nccl_available(tz_backend *be, char *why, size_t n);
/* An NCCL comm over the ranks of host (the run's MPI comm: its ranks and size, and the
 * broadcast of the unique id), each rank on its backend's GPU (two ranks on one GPU: NCCL
 * refuses it; the caller checks first). Collective over host; fatal, with the reason, when
 * NCCL cannot be loaded or initialised. */
tz_comm *tz_comm_nccl_create(tz_backend *be, tz_comm *host);


/* The module's side of the comm (its entry points, the operation codes): backend/cuda_module.h. */

#endif
