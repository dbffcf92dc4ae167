/* The NCCL side of the comm table (comm/comm_nccl.h): libnccl.so.2 loaded with dlopen when a
 * comm is created (so this module loads, and every other backend op works, where NCCL is
 * absent), the few NCCL types declared here (their values are NCCL's ABI; checked against
 * nccl.h where the header is present), collectives queued on the backend's copy stream after
 * the compute stream's work, one event per operation (test = cudaEventQuery, wait = event
 * sync). The communicator is bootstrapped by comm/comm_nccl.c, on the run's MPI communicator.
 * Under TZ_CUDA_SYNC_DEBUG each collective is synchronised and checked like an op. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_internal.cuh"
extern "C" {
#include "core/dtype.h"
#include "backend/cuda_module.h"
}

/* ---- NCCL's ABI, as used here ---- */
typedef struct tz_nccl_comm_s *tz_nccl_comm; /* ncclComm_t */
typedef struct {
    char internal[TZ_NCCL_ID_BYTES];
} tz_nccl_id; /* ncclUniqueId */
enum { TZ_NC_INT8 = 0, TZ_NC_UINT8 = 1, TZ_NC_INT32 = 2, TZ_NC_INT64 = 4, TZ_NC_FLOAT16 = 6,
       TZ_NC_FLOAT32 = 7, TZ_NC_FLOAT64 = 8, TZ_NC_BFLOAT16 = 9 };
enum { TZ_NC_SUM = 0 };
#if defined(__has_include)
#if __has_include(<nccl.h>)
#include <nccl.h>
static_assert((int)TZ_NC_UINT8 == (int)ncclUint8 && (int)TZ_NC_INT32 == (int)ncclInt32 &&
                  (int)TZ_NC_INT64 == (int)ncclInt64 && (int)TZ_NC_FLOAT16 == (int)ncclFloat16 &&
                  (int)TZ_NC_FLOAT32 == (int)ncclFloat32 &&
                  (int)TZ_NC_FLOAT64 == (int)ncclFloat64 &&
                  (int)TZ_NC_BFLOAT16 == (int)ncclBfloat16 && (int)TZ_NC_SUM == (int)ncclSum &&
                  sizeof(tz_nccl_id) == sizeof(ncclUniqueId),
              "NCCL's data types moved: update cuda/cuda_comm_nccl.cu");
#endif
#endif

static struct {
    int tried, ok;
    char why[1024];
    void *lib;
    tz_nccl_result (*get_unique_id)(tz_nccl_id *);
    tz_nccl_result (*comm_init_rank)(tz_nccl_comm *, int, tz_nccl_id, int);
    tz_nccl_result (*comm_destroy)(tz_nccl_comm);
    const char *(*get_error_string)(tz_nccl_result);
    tz_nccl_result (*reduce_scatter)(const void *, void *, size_t, int, int, tz_nccl_comm,
                                     cudaStream_t);
    tz_nccl_result (*all_gather)(const void *, void *, size_t, int, tz_nccl_comm, cudaStream_t);
    tz_nccl_result (*all_reduce)(const void *, void *, size_t, int, int, tz_nccl_comm,
                                 cudaStream_t);
    tz_nccl_result (*broadcast)(const void *, void *, size_t, int, int, tz_nccl_comm,
                                cudaStream_t);
    tz_nccl_result (*group_start)(void);
    tz_nccl_result (*group_end)(void);
    tz_nccl_result (*get_version)(int *);
} g_nc;

const char *tz_nccl_error_string(tz_nccl_result rc) {
    return g_nc.get_error_string ? g_nc.get_error_string(rc) : "NCCL not loaded";
}

/* The entry points below are declared, with their types, in backend/cuda_module.h. */

/* Loads the library once: $TZ_NCCL_LIBRARY when set, else libnccl.so.2 on the loader's path. */
int tz_cuda_module_nccl_load(char *why, size_t n) {
    if (!g_nc.tried) {
        g_nc.tried = 1;
        const char *env = getenv("TZ_NCCL_LIBRARY");
        const char *name = env && *env ? env : "libnccl.so.2";
        g_nc.lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
        if (!g_nc.lib) {
            const char *e = dlerror();
            snprintf(g_nc.why, sizeof g_nc.why,
                     "cannot load %s (%s): install NCCL, add the folder of libnccl.so.2 to "
                     "LD_LIBRARY_PATH (e.g. a Python environment's nvidia/nccl/lib), or set "
                     "TZ_NCCL_LIBRARY to the library's path", name, e ? e : "not found");
        } else {
            const char *missing = NULL;
#define TZ_NC_SYM(field, sym)                                                                  \
    if (!missing && !(*(void **)&g_nc.field = dlsym(g_nc.lib, sym))) missing = sym;
            TZ_NC_SYM(get_unique_id, "ncclGetUniqueId")
            TZ_NC_SYM(comm_init_rank, "ncclCommInitRank")
            TZ_NC_SYM(comm_destroy, "ncclCommDestroy")
            TZ_NC_SYM(get_error_string, "ncclGetErrorString")
            TZ_NC_SYM(reduce_scatter, "ncclReduceScatter")
            TZ_NC_SYM(all_gather, "ncclAllGather")
            TZ_NC_SYM(all_reduce, "ncclAllReduce")
            TZ_NC_SYM(broadcast, "ncclBroadcast")
            TZ_NC_SYM(group_start, "ncclGroupStart")
            TZ_NC_SYM(group_end, "ncclGroupEnd")
            TZ_NC_SYM(get_version, "ncclGetVersion")
#undef TZ_NC_SYM
            if (missing) {
                snprintf(g_nc.why, sizeof g_nc.why, "%s lacks %s (not an NCCL 2 library?)", name,
                         missing);
                g_nc.get_error_string = NULL;
                dlclose(g_nc.lib);
                g_nc.lib = NULL;
            } else {
                g_nc.ok = 1;
            }
        }
    }
    if (!g_nc.ok && why && n) snprintf(why, n, "%s", g_nc.why);
    return g_nc.ok ? 0 : 1;
}

int tz_cuda_module_nccl_unique_id(void *id, char *why, size_t n) {
    if (tz_cuda_module_nccl_load(why, n)) return 1;
    tz_nccl_id u;
    tz_nccl_result rc = g_nc.get_unique_id(&u);
    if (rc != 0) {
        snprintf(why, n, "ncclGetUniqueId failed: %s", tz_nccl_error_string(rc));
        return 1;
    }
    memcpy(id, u.internal, sizeof u.internal);
    return 0;
}

typedef struct nccl_h {
    tz_backend *be;
    tz_cuda_ctx *c;
    tz_nccl_comm comm;
    int rank, size;
    cudaEvent_t join; /* the compute stream's point each operation waits for */
    int *one;         /* device int, the barrier's payload */
} nccl_h;

void *tz_cuda_module_nccl_init(tz_backend *be, const void *id, int rank, int size) {
    char why[1024];
    if (tz_cuda_module_nccl_load(why, sizeof why)) TZ_FATAL("comm.backend = \"nccl\": %s", why);
    nccl_h *h = (nccl_h *)tz_xcalloc(1, sizeof *h);
    h->be = be;
    h->c = tz_cuda_ctx_of(be);
    h->rank = rank;
    h->size = size;
    CUDA_CHECK(cudaSetDevice(h->c->device));
    tz_nccl_id u;
    memcpy(u.internal, id, sizeof u.internal);
    NCCL_CHECK(g_nc.comm_init_rank(&h->comm, size, u, rank));
    CUDA_CHECK(cudaEventCreateWithFlags(&h->join, cudaEventDisableTiming));
    CUDA_CHECK(cudaMalloc((void **)&h->one, sizeof(int)));
    int v = 0;
    NCCL_CHECK(g_nc.get_version(&v));
    if (rank == 0) tz_info("comm: NCCL %d.%d.%d on %d ranks", v / 10000, v / 100 % 100, v % 100, size);
    return h;
}

static int nc_type(int dt) {
    switch (dt) {
    case TZ_DT_F32: return TZ_NC_FLOAT32;
    case TZ_DT_F64: return TZ_NC_FLOAT64;
    case TZ_DT_BF16: return TZ_NC_BFLOAT16;
    case TZ_DT_F16: return TZ_NC_FLOAT16;
    case TZ_DT_I32: return TZ_NC_INT32;
    case TZ_DT_I64: return TZ_NC_INT64;
    case TZ_DT_U8: return TZ_NC_UINT8;
    default: TZ_FATAL("nccl: dtype %d is not supported", dt);
    }
}

void *tz_cuda_module_nccl_start(void *hp, int op, const void *send, void *recv, int64_t count,
                                const int64_t *counts, int dtype, int root) {
    nccl_h *h = (nccl_h *)hp;
    cudaStream_t s = h->c->copy_stream;
    const int T = nc_type(dtype);
    const size_t es = dtype == TZ_DT_F64 || dtype == TZ_DT_I64 ? 8
                    : dtype == TZ_DT_F32 || dtype == TZ_DT_I32 ? 4
                    : dtype == TZ_DT_U8                        ? 1
                                                               : 2;
    /* after everything queued so far on the compute stream (the buffers' producers) */
    CUDA_CHECK(cudaEventRecord(h->join, h->c->stream));
    CUDA_CHECK(cudaStreamWaitEvent(s, h->join, 0));
    switch (op) {
    case TZ_NCCL_REDUCE_SCATTER:
        NCCL_CHECK(g_nc.reduce_scatter(send, recv, (size_t)count, T, TZ_NC_SUM, h->comm, s));
        break;
    case TZ_NCCL_ALL_GATHER:
        NCCL_CHECK(g_nc.all_gather(send, recv, (size_t)count, T, h->comm, s));
        break;
    case TZ_NCCL_ALL_REDUCE:
        NCCL_CHECK(g_nc.all_reduce(send, recv, (size_t)count, T, TZ_NC_SUM, h->comm, s));
        break;
    case TZ_NCCL_BCAST:
        NCCL_CHECK(g_nc.broadcast(recv, recv, (size_t)count, T, root, h->comm, s));
        break;
    case TZ_NCCL_ALL_GATHERV: { /* NCCL has no all-gatherv: one broadcast per rank, grouped */
        NCCL_CHECK(g_nc.group_start());
        int64_t off = 0;
        for (int r = 0; r < h->size; off += counts[r], r++) {
            char *dst = (char *)recv + (size_t)off * es;
            if (counts[r] > 0)
                NCCL_CHECK(g_nc.broadcast(r == h->rank ? send : dst, dst, (size_t)counts[r], T, r,
                                          h->comm, s));
        }
        NCCL_CHECK(g_nc.group_end());
        break;
    }
    case -1: /* the barrier: a one-int all-reduce */
        NCCL_CHECK(g_nc.all_reduce(h->one, h->one, 1, TZ_NC_INT32, TZ_NC_SUM, h->comm, s));
        break;
    default: TZ_FATAL("nccl: unknown operation %d", op);
    }
    cudaEvent_t ev;
    CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(ev, s));
    static const char *const names[] = {"nccl reduce_scatter", "nccl all_gather",
                                        "nccl all_gatherv", "nccl all_reduce", "nccl bcast"};
    tz_cuda_sync_check(h->be, op >= 0 && op <= TZ_NCCL_BCAST ? names[op] : "nccl barrier");
    return (void *)ev;
}

int tz_cuda_module_nccl_test(void *hp, void *ev) {
    cudaError_t rc = cudaEventQuery((cudaEvent_t)ev);
    if (rc == cudaErrorNotReady) return 0;
    CUDA_CHECK(rc);
    return 1;
}

void tz_cuda_module_nccl_wait(void *hp, void *ev) {
    CUDA_CHECK(cudaEventSynchronize((cudaEvent_t)ev));
    CUDA_CHECK(cudaEventDestroy((cudaEvent_t)ev));
}

void tz_cuda_module_nccl_destroy(void *hp) {
    nccl_h *h = (nccl_h *)hp;
    if (!h) return;
    cudaStreamSynchronize(h->c->copy_stream);
    g_nc.comm_destroy(h->comm);
    cudaEventDestroy(h->join);
    cudaFree(h->one);
    free(h);
}
