/* The NCCL comm (comm.backend = "nccl"): a tz_comm whose buffers are device memory of a CUDA
 * backend, its collectives ordered on that backend's copy queue (TZ_QUEUE_COPY). NCCL itself
 * lives in the CUDA module (cuda/cuda_comm_nccl.cu), which loads libnccl.so.2 with dlopen
 * when a comm is created; this side bootstraps it over the run's host comm (rank 0's
 * ncclUniqueId broadcast) and wraps the module's entry points, found by dlsym, into the comm
 * table. No MPI types in this header: src/train may include it. The module includes it too,
 * for the entry points' names and the operation codes. */
#ifndef TZ_COMM_NCCL_H
#define TZ_COMM_NCCL_H
#include <stddef.h>
#include <stdint.h>

#include "core/backend.h"
#include "comm/fwd.h"

/* 1 when `be` is a CUDA backend whose module has the NCCL entry points and libnccl.so.2 (or
 * $TZ_NCCL_LIBRARY) loads; else 0 with the reason in why. Not collective. */
int tz_comm_nccl_available(tz_backend *be, char *why, size_t n);
/* An NCCL comm over the ranks of host (the run's MPI comm: its ranks and size, and the
 * broadcast of the unique id), each rank on its backend's GPU (two ranks on one GPU: NCCL
 * refuses it; the caller checks first). Collective over host; fatal, with the reason, when
 * NCCL cannot be loaded or initialised. */
tz_comm *tz_comm_nccl_create(tz_backend *be, tz_comm *host);

/* comm.backend (want: 0 "auto", 1 "mpi", 2 "nccl"): NULL when the gradients go through
 * the host comm (MPI), else a new NCCL comm. auto picks nccl only on more than one rank, when
 * every rank's backend is a GPU of its own (no two ranks of a host with the same PCI bus id)
 * and NCCL loads on every rank; "nccl" where that does not hold is fatal, saying why (on one
 * rank it is made as asked). Rank 0 prints the choice. Collective over host (the run's MPI
 * comm). */
tz_comm *tz_comm_select(int want, tz_backend *be, tz_comm *host);

/* ---- the module's side (cuda/cuda_comm_nccl.cu), found by name ---- */
#define TZ_NCCL_ID_BYTES 128 /* ncclUniqueId */
enum { TZ_NCCL_REDUCE_SCATTER, TZ_NCCL_ALL_GATHER, TZ_NCCL_ALL_GATHERV, TZ_NCCL_ALL_REDUCE,
       TZ_NCCL_BCAST };
/* "tz_cuda_module_nccl_load": int (char *why, size_t n): 0 when libnccl loads (once).
 * "tz_cuda_module_nccl_unique_id": int (void *id, char *why, size_t n): 0 on success.
 * "tz_cuda_module_nccl_init": void *(tz_backend *be, const void *id, int rank, int size).
 * "tz_cuda_module_nccl_start": void *(void *h, int op, const void *send, void *recv,
 *     int64_t count, const int64_t *counts, int dtype, int root): the operation queued on
 *     the copy stream after the work queued so far on the compute stream; returns an event.
 * "tz_cuda_module_nccl_test": int (void *h, void *ev): 1 when done (cudaEventQuery).
 * "tz_cuda_module_nccl_wait": void (void *h, void *ev): host waits (event sync), frees ev.
 * "tz_cuda_module_nccl_destroy": void (void *h). */
typedef int (*tz_nccl_load_fn)(char *why, size_t n);
typedef int (*tz_nccl_unique_id_fn)(void *id, char *why, size_t n);
typedef void *(*tz_nccl_init_fn)(tz_backend *be, const void *id, int rank, int size);
typedef void *(*tz_nccl_start_fn)(void *h, int op, const void *send, void *recv, int64_t count,
                                  const int64_t *counts, int dtype, int root);
typedef int (*tz_nccl_test_fn)(void *h, void *ev);
typedef void (*tz_nccl_wait_fn)(void *h, void *ev);
typedef void (*tz_nccl_destroy_fn)(void *h);

#endif
