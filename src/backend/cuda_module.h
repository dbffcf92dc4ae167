/* The ABI between the program and the CUDA module (cuda/, built as libtzcuda.so, opened with
 * dlopen by backend/registry.c): every entry point the program finds by name, its C type, and
 * what the module calls back in the program. Both sides include this header (the module
 * inside extern "C"), so a signature that changes on one side fails to compile on the other.
 * No CUDA types here: the program never sees a CUDA header. */
#ifndef TZ_BACKEND_CUDA_MODULE_H
#define TZ_BACKEND_CUDA_MODULE_H
#include <stddef.h>
#include <stdint.h>

#include "core/backend.h"

/* ---- the layout both sides were built with ---- */
/* A stamp of the structs that cross the boundary (today the op table, struct tz_backend):
 * its size, the offset of its last member and TZ_CUDA_ABI_VERSION, which a change of an op's
 * arguments that keeps the layout must raise (the layout alone does not show it). A module
 * built from another tree (a stale libtzcuda.so beside a new binary) gives another stamp and
 * is refused at load. */
#define TZ_CUDA_ABI_VERSION 2 /* 1: attention_cache_fwd's kv16 (2026-11-28); 2: att_ds */
#define TZ_CUDA_ABI_STAMP                                                                     \
    ((uint64_t)sizeof(tz_backend) << 32 | (uint64_t)offsetof(tz_backend, device_info) << 8 |  \
     (uint64_t)TZ_CUDA_ABI_VERSION)
typedef uint64_t tz_cuda_abi_fn(void);
#define TZ_CUDA_SYM_ABI "tz_cuda_module_abi"

/* ---- the backend (cuda/cuda_backend.cu) ---- */
/* The visible devices; 0 with CUDA's error, named, in why (when not NULL) where
 * cudaGetDeviceCount fails. */
typedef int tz_cuda_device_count_fn(char *why, size_t n);
#define TZ_CUDA_SYM_DEVICE_COUNT "tz_cuda_module_device_count"
/* The backend on GPU `device` (taken modulo the visible devices). */
typedef tz_backend *tz_cuda_create_fn(int device);
#define TZ_CUDA_SYM_CREATE "tz_cuda_module_create"

/* ---- the NCCL comm's device side (cuda/cuda_comm_nccl.cu; comm/comm_nccl.c wraps it) ---- */
#define TZ_NCCL_ID_BYTES 128 /* ncclUniqueId */
enum { TZ_NCCL_REDUCE_SCATTER, TZ_NCCL_ALL_GATHER, TZ_NCCL_ALL_GATHERV, TZ_NCCL_ALL_REDUCE,
       TZ_NCCL_BCAST };
/* 0 when libnccl.so.2 (or $TZ_NCCL_LIBRARY) loads (once), else 1 with why. */
typedef int tz_nccl_load_fn(char *why, size_t n);
/* 0 with a new ncclUniqueId in id (TZ_NCCL_ID_BYTES), else 1 with why. */
typedef int tz_nccl_unique_id_fn(void *id, char *why, size_t n);
/* A communicator of `size` ranks on be's GPU (this rank `rank`), from rank 0's id. */
typedef void *tz_nccl_init_fn(tz_backend *be, const void *id, int rank, int size);
/* Operation op (TZ_NCCL_*) queued on the copy stream after the work queued so far on the
 * compute stream; counts: all_gatherv's per-rank counts; dtype: enum tz_dtype. Returns an
 * event. */
typedef void *tz_nccl_start_fn(void *h, int op, const void *send, void *recv, int64_t count,
                               const int64_t *counts, int dtype, int root);
/* 1 when the operation of ev is done (cudaEventQuery). */
typedef int tz_nccl_test_fn(void *h, void *ev);
/* The host waits for ev (event sync), then frees it. */
typedef void tz_nccl_wait_fn(void *h, void *ev);
typedef void tz_nccl_destroy_fn(void *h);
#define TZ_NCCL_SYM_LOAD "tz_cuda_module_nccl_load"
#define TZ_NCCL_SYM_UNIQUE_ID "tz_cuda_module_nccl_unique_id"
#define TZ_NCCL_SYM_INIT "tz_cuda_module_nccl_init"
#define TZ_NCCL_SYM_START "tz_cuda_module_nccl_start"
#define TZ_NCCL_SYM_TEST "tz_cuda_module_nccl_test"
#define TZ_NCCL_SYM_WAIT "tz_cuda_module_nccl_wait"
#define TZ_NCCL_SYM_DESTROY "tz_cuda_module_nccl_destroy"

/* The module's definitions, declared with their types (only the module defines them; the
 * program reaches them through dlsym by the names above). */
tz_cuda_abi_fn tz_cuda_module_abi;
tz_cuda_device_count_fn tz_cuda_module_device_count;
tz_cuda_create_fn tz_cuda_module_create;
tz_nccl_load_fn tz_cuda_module_nccl_load;
tz_nccl_unique_id_fn tz_cuda_module_nccl_unique_id;
tz_nccl_init_fn tz_cuda_module_nccl_init;
tz_nccl_start_fn tz_cuda_module_nccl_start;
tz_nccl_test_fn tz_cuda_module_nccl_test;
tz_nccl_wait_fn tz_cuda_module_nccl_wait;
tz_nccl_destroy_fn tz_cuda_module_nccl_destroy;

/* ---- what the module calls back in the program ----
 * Besides the error path (core/error.h: tz_fatal_at and the logs) and the allocators every
 * program has (tz_xcalloc, ...), the module calls tz_tq_signs_row and tz_tq_check_shape
 * (quant/fwht.h) and tz_info_all. backend/registry.c names them in tz_cuda_module_needs so
 * that every program linking the core library has them to export (-rdynamic). */
extern void *tz_cuda_module_needs[];

#endif
