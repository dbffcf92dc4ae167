/* The CUDA backend: device choice, the stream and cuBLAS handle, device memory with live and
 * peak bytes, the ops' scratch, the table (each op family file installs its ops) and its
 * checked mode (TZ_CUDA_SYNC_DEBUG). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/cuda_internal.cuh"
extern "C" {
#include "backend/cuda_module.h"
}

/* ---- pointer sizes (for live_bytes) ---- */

#define TZ_TOMB ((void *)1)

static uint64_t hash_ptr(const void *p) {
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

static void sizes_put(tz_cuda_sizes *t, void *p, size_t bytes);

/* Rehashes without the tombstones, doubling the table only when live entries fill more than
 * a quarter of it (alloc/release cycles do not grow it). */
static void sizes_grow(tz_cuda_sizes *t) {
    tz_cuda_sizes old = *t;
    int64_t live = 0;
    for (int64_t i = 0; i < old.cap; i++) live += old.key[i] && old.key[i] != TZ_TOMB;
    t->cap = !old.cap ? 1024 : 4 * live > old.cap ? old.cap * 2 : old.cap;
    t->used = 0;
    t->key = (void **)tz_xcalloc((size_t)t->cap, sizeof(void *));
    t->bytes = (size_t *)tz_xcalloc((size_t)t->cap, sizeof(size_t));
    for (int64_t i = 0; i < old.cap; i++)
        if (old.key[i] && old.key[i] != TZ_TOMB) sizes_put(t, old.key[i], old.bytes[i]);
    free(old.key);
    free(old.bytes);
}

static void sizes_put(tz_cuda_sizes *t, void *p, size_t bytes) {
    if (4 * (t->used + 1) > 3 * t->cap) sizes_grow(t);
    int64_t i = (int64_t)(hash_ptr(p) & (uint64_t)(t->cap - 1));
    while (t->key[i] && t->key[i] != TZ_TOMB) i = (i + 1) & (t->cap - 1);
    if (!t->key[i]) t->used++;
    t->key[i] = p;
    t->bytes[i] = bytes;
}

/* Removes p and gives its size: 1, or 0 when p is not in the table. */
static int sizes_remove(tz_cuda_sizes *t, void *p, size_t *bytes) {
    if (t->cap) {
        int64_t i = (int64_t)(hash_ptr(p) & (uint64_t)(t->cap - 1));
        while (t->key[i]) {
            if (t->key[i] == p) {
                t->key[i] = TZ_TOMB;
                *bytes = t->bytes[i];
                return 1;
            }
            i = (i + 1) & (t->cap - 1);
        }
    }
    return 0;
}

/* Removes p and returns its size; fatal when p was not allocated here. */
static size_t sizes_take(tz_cuda_sizes *t, void *p) {
    size_t bytes = 0;
    if (!sizes_remove(t, p, &bytes))
        TZ_FATAL("cuda release: %p was not allocated by this backend", p);
    return bytes;
}

/* ---- memory ---- */

static void *cuda_alloc(tz_backend *be, size_t bytes) {
    tz_cuda_ctx *c = tz_cuda_ctx_of(be);
    void *p = NULL;
    cudaError_t rc = cudaMalloc(&p, bytes ? bytes : 1); /* 256-byte aligned */
    if (rc != cudaSuccess) {
        size_t fr = 0, tot = 0;
        cudaGetLastError();
        cudaMemGetInfo(&fr, &tot);
        TZ_FATAL_HINT("use fewer or shorter sequences per micro-batch (train.micro_batch, "
                      "data.seq_len), train.checkpointing = true, or more ranks",
                      "out of GPU memory on %s: cannot allocate %zu bytes (%s; %.1f of %.1f "
                      "GiB free, %.1f GiB allocated by turbozero)", c->name, bytes,
                      cudaGetErrorString(rc), (double)fr / 1073741824.0,
                      (double)tot / 1073741824.0, (double)be->live_bytes / 1073741824.0);
    }
    /* zeroed on the compute stream; the copy stream, which may write p first (upload_async,
     * the NCCL comm), waits for that */
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, c->stream));
    CUDA_CHECK(cudaEventRecord(c->zeroed, c->stream));
    CUDA_CHECK(cudaStreamWaitEvent(c->copy_stream, c->zeroed, 0));
    sizes_put(&c->sizes, p, bytes);
    be->live_bytes += bytes;
    if (be->live_bytes > be->peak_bytes) be->peak_bytes = be->live_bytes;
    return p;
}

static void cuda_release(tz_backend *be, void *p) {
    if (!p) return;
    tz_cuda_ctx *c = tz_cuda_ctx_of(be);
    be->live_bytes -= sizes_take(&c->sizes, p);
    CUDA_CHECK(cudaFree(p)); /* waits for the device: no kernel still reads p */
}

/* upload and download return once the copy is done (the host buffer may be reused or read);
 * copy is ordered on the stream like every op. */
static void cuda_upload(tz_backend *be, void *dst, const void *host_src, size_t bytes) {
    if (!bytes) return;
    cudaStream_t s = tz_cuda_stream(be);
    CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
}

static void cuda_download(tz_backend *be, void *host_dst, const void *src, size_t bytes) {
    if (!bytes) return;
    cudaStream_t s = tz_cuda_stream(be);
    CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
}

static void cuda_copy(tz_backend *be, void *dst, const void *src, size_t bytes) {
    if (!bytes || dst == src) return;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, tz_cuda_stream(be)));
}

static void cuda_sync(tz_backend *be) { CUDA_CHECK(cudaStreamSynchronize(tz_cuda_stream(be))); }

/* ---- the offload: pinned host memory, the copy stream, events ---- */

static void *cuda_host_alloc(tz_backend *be, size_t bytes) {
    void *p = NULL;
    cudaError_t rc = cudaMallocHost(&p, bytes ? bytes : 1); /* page-aligned */
    if (rc != cudaSuccess) {
        cudaGetLastError();
        TZ_FATAL_HINT("lower zero.bucket_mb, or raise the locked-memory limit (ulimit -l)",
                      "cannot allocate %zu bytes of pinned host memory (%s)", bytes,
                      cudaGetErrorString(rc));
    }
    memset(p, 0, bytes);
    return p;
}

static void cuda_host_free(tz_backend *be, void *p) {
    if (p) CUDA_CHECK(cudaFreeHost(p));
}

/* Pinning is a speed-up, not a need: where it is refused (a low locked-memory limit, a
 * container) the buffer stays pageable, the copies to and from it still work (staged by the
 * driver, slower and not overlapping), and the first refusal is reported. */
static void cuda_host_register(tz_backend *be, void *p, size_t bytes) {
    if (!p || !bytes) return;
    tz_cuda_ctx *c = tz_cuda_ctx_of(be);
    cudaError_t rc = cudaHostRegister(p, bytes, cudaHostRegisterDefault);
    if (rc == cudaSuccess) {
        sizes_put(&c->pinned, p, bytes);
        return;
    }
    cudaGetLastError();
    if (!c->pin_warned) {
        c->pin_warned = 1;
        tz_warn("cannot pin %zu bytes (%.2f MiB) of host memory for %s (cudaHostRegister: %s: "
                "%s): it stays pageable, and copies to and from it are slower", bytes,
                (double)bytes / 1048576.0, c->name, cudaGetErrorName(rc),
                cudaGetErrorString(rc));
        tz_warn("HINT: raise the locked-memory limit (ulimit -l unlimited; in Slurm, "
                "PropagateResourceLimits or --propagate=MEMLOCK)");
    }
}

static void cuda_host_unregister(tz_backend *be, void *p) {
    size_t bytes;
    if (p && sizes_remove(&tz_cuda_ctx_of(be)->pinned, p, &bytes))
        CUDA_CHECK(cudaHostUnregister(p));
}

static void cuda_download_async(tz_backend *be, void *host_dst, const void *src, size_t bytes) {
    if (!bytes) return;
    CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost,
                               tz_cuda_ctx_of(be)->copy_stream));
}

static void cuda_upload_async(tz_backend *be, void *dst, const void *host_src, size_t bytes) {
    if (!bytes) return;
    CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice,
                               tz_cuda_ctx_of(be)->copy_stream));
}

static cudaStream_t queue_stream(tz_backend *be, int queue) {
    tz_cuda_ctx *c = tz_cuda_ctx_of(be);
    if (queue == TZ_QUEUE_COMPUTE) return c->stream;
    if (queue == TZ_QUEUE_COPY) return c->copy_stream;
    TZ_FATAL("cuda: queue %d is not TZ_QUEUE_COMPUTE or TZ_QUEUE_COPY", queue);
}

static void *cuda_event_mark(tz_backend *be, int queue) {
    cudaEvent_t ev;
    CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(ev, queue_stream(be, queue)));
    return (void *)ev;
}

static void cuda_event_wait(tz_backend *be, void *ev, int queue) {
    if (queue == TZ_QUEUE_HOST) CUDA_CHECK(cudaEventSynchronize((cudaEvent_t)ev));
    else CUDA_CHECK(cudaStreamWaitEvent(queue_stream(be, queue), (cudaEvent_t)ev, 0));
}

static int cuda_event_done(tz_backend *be, void *ev) {
    cudaError_t rc = cudaEventQuery((cudaEvent_t)ev);
    if (rc == cudaErrorNotReady) return 0;
    CUDA_CHECK(rc);
    return 1;
}

static void cuda_event_free(tz_backend *be, void *ev) {
    if (ev) CUDA_CHECK(cudaEventDestroy((cudaEvent_t)ev));
}

static void cuda_device_info(tz_backend *be, tz_device_info *out) {
    tz_cuda_ctx *c = tz_cuda_ctx_of(be);
    memset(out, 0, sizeof *out);
    out->ordinal = c->device;
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, c->device));
    snprintf(out->name, sizeof out->name, "%s", prop.name);
    if (cudaDeviceGetPCIBusId(out->bus_id, (int)sizeof out->bus_id, c->device) != cudaSuccess) {
        cudaGetLastError();
        out->bus_id[0] = 0;
    }
    if (cudaMemGetInfo(&out->free_bytes, &out->total_bytes) != cudaSuccess) {
        cudaGetLastError();
        out->free_bytes = out->total_bytes = 0;
    }
}

void *tz_cuda_scratch(tz_backend *be, size_t bytes) {
    tz_cuda_ctx *c = tz_cuda_ctx_of(be);
    if (bytes <= c->scratch_cap) return c->scratch;
    size_t cap = c->scratch_cap * 2 > bytes ? c->scratch_cap * 2 : bytes;
    if (c->scratch) CUDA_CHECK(cudaFree(c->scratch)); /* waits for kernels still using it */
    c->scratch = NULL;
    cudaError_t rc = cudaMalloc(&c->scratch, cap);
    if (rc != cudaSuccess)
        TZ_FATAL("out of GPU memory on %s: cannot allocate %zu bytes of op scratch (%s)",
                 c->name, cap, cudaGetErrorString(rc));
    c->scratch_cap = cap;
    return c->scratch;
}

/* ---- TZ_CUDA_SYNC_DEBUG: every op synchronised and checked ----
 * For a first run on a new GPU or driver: an op's launch error or fault is otherwise reported
 * by whichever later call synchronises, far from its cause. In this mode every entry of the
 * table is wrapped: an error left by earlier work is reported before the op, and after it
 * both streams are synchronised and checked, naming the op. Slow (no overlap). */

void tz_cuda_sync_check(tz_backend *be, const char *op) {
    tz_cuda_ctx *c = tz_cuda_ctx_of(be);
    if (!c->sync_debug) return;
    const char *where = "its launches";
    cudaError_t rc = cudaGetLastError();
    if (rc == cudaSuccess) rc = cudaStreamSynchronize(c->stream), where = "the compute stream";
    if (rc == cudaSuccess) rc = cudaStreamSynchronize(c->copy_stream), where = "the copy stream";
    if (rc == cudaSuccess) rc = cudaGetLastError(), where = "its work";
    if (rc != cudaSuccess)
        TZ_FATAL_HINT("run it again with compute-sanitizer for the kernel and the address",
                      "TZ_CUDA_SYNC_DEBUG: op %s failed on %s (%s): %s: %s", op, c->name, where,
                      cudaGetErrorName(rc), cudaGetErrorString(rc));
}

static double op_clock_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

/* Checks before (an error an earlier call left) and, when it ends, after the op; with
 * TZ_CUDA_OP_TIMES also times it (the outermost entry only: an op that calls another table
 * entry counts once, under its own name). */
struct sync_debug_scope {
    tz_backend *be;
    const char *op;
    int index, timed;
    double w0;
    sync_debug_scope(tz_backend *b, const char *o, int i) : be(b), op(o), index(i), timed(0) {
        tz_cuda_ctx *c = tz_cuda_ctx_of(be);
        if (c->sync_debug) {
            cudaError_t rc = cudaGetLastError();
            if (rc != cudaSuccess)
                TZ_FATAL("TZ_CUDA_SYNC_DEBUG: before op %s on %s: an error left by work outside "
                         "the op table: %s: %s", op, c->name, cudaGetErrorName(rc),
                         cudaGetErrorString(rc));
        }
        if (c->op_times && c->op_depth++ == 0) {
            timed = 1;
            CUDA_CHECK(cudaStreamSynchronize(c->stream)); /* work queued outside the table */
            CUDA_CHECK(cudaStreamSynchronize(c->copy_stream));
            w0 = op_clock_ms();
            if (c->times_t0 == 0) c->times_t0 = w0;
            CUDA_CHECK(cudaEventRecord(c->op_t0, c->stream));
            c->part_last = -1;
        }
    }
    ~sync_debug_scope() {
        tz_cuda_ctx *c = tz_cuda_ctx_of(be);
        tz_cuda_sync_check(be, op);
        if (!c->op_times) return;
        c->op_depth--;
        if (!timed) return;
        CUDA_CHECK(cudaEventRecord(c->op_t1, c->stream));
        CUDA_CHECK(cudaStreamSynchronize(c->stream));
        CUDA_CHECK(cudaStreamSynchronize(c->copy_stream));
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, c->op_t0, c->op_t1));
        struct tz_cuda_op_time *t = &c->times[index];
        t->name = op, t->calls++, t->gpu_ms += ms, t->wall_ms += op_clock_ms() - w0;
    }
};

/* For a table entry of type F: call<M, Name, Index> is the wrapper of the entry M (a pointer
 * to a member of tz_backend) named Name, which calls the backend's own op, kept in ctx->ops,
 * inside a scope that checks (and times). */
template <class F> struct sync_debug_op;
template <class R, class... A> struct sync_debug_op<R (*)(tz_backend *, A...)> {
    template <R (*tz_backend::*M)(tz_backend *, A...), const char *Name, int Index>
    static R call(tz_backend *be, A... a) {
        sync_debug_scope scope(be, Name, Index);
        return (tz_cuda_ctx_of(be)->ops->*M)(be, a...);
    }
};

#define TZ_OP_INDEX(op) op_index_##op,
enum { TZ_BACKEND_OPS(TZ_OP_INDEX) op_count };
#undef TZ_OP_INDEX

#define TZ_SYNC_DEBUG_NAME(op) static constexpr char sync_debug_name_##op[] = #op;
TZ_BACKEND_OPS(TZ_SYNC_DEBUG_NAME)
#undef TZ_SYNC_DEBUG_NAME

static int cmp_op_time(const void *a, const void *b) {
    double x = ((const struct tz_cuda_op_time *)a)->gpu_ms,
           y = ((const struct tz_cuda_op_time *)b)->gpu_ms;
    return (x < y) - (x > y);
}

void tz_cuda_part(tz_backend *be, const char *name) {
    tz_cuda_ctx *c = tz_cuda_ctx_of(be);
    if (!c->op_times || c->op_depth == 0) return;
    const int i = c->part_last == 0 ? 1 : 0;
    CUDA_CHECK(cudaEventRecord(c->part_ev[i], c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, c->part_last < 0 ? c->op_t0 : c->part_ev[c->part_last],
                                    c->part_ev[i]));
    c->part_last = i;
    int k = 0;
    while (k < c->nparts && strcmp(c->parts[k].name, name)) k++;
    if (k == TZ_CUDA_PARTS) return; /* (more names than the table holds: not counted) */
    if (k == c->nparts) c->parts[c->nparts++].name = name;
    c->parts[k].calls++, c->parts[k].gpu_ms += ms;
}

/* TZ_CUDA_OP_TIMES: the table of GPU and wall time per op, largest first, at the backend's end. */
static void op_times_report(tz_cuda_ctx *c) {
    if (!c->op_times || !c->times) return;
    const double span = c->times_t0 ? op_clock_ms() - c->times_t0 : 0;
    double gpu = 0, wall = 0;
    for (int i = 0; i < op_count; i++) gpu += c->times[i].gpu_ms, wall += c->times[i].wall_ms;
    qsort(c->times, op_count, sizeof *c->times, cmp_op_time);
    fprintf(stderr, "TZ_CUDA_OP_TIMES on %s: %.1f ms of GPU time in ops, %.1f ms of wall time "
            "in ops, %.1f ms since the first op (each op synchronised: no overlap)\n",
            c->name, gpu, wall, span);
    fprintf(stderr, "  %-24s %9s %12s %7s %12s %10s\n", "op", "calls", "gpu ms", "share",
            "wall ms", "us/call");
    for (int i = 0; i < op_count; i++) {
        const struct tz_cuda_op_time *t = &c->times[i];
        if (!t->calls) continue;
        fprintf(stderr, "  %-24s %9ld %12.2f %6.1f%% %12.2f %10.1f\n", t->name, t->calls,
                t->gpu_ms, gpu > 0 ? 100 * t->gpu_ms / gpu : 0, t->wall_ms,
                1e3 * t->gpu_ms / t->calls);
    }
    if (!c->nparts) return;
    fprintf(stderr, "TZ_CUDA_OP_TIMES: parts of ops (the launches since the op's start or its "
            "last part; within the op's time above)\n  %-32s %9s %12s %10s\n", "op: part",
            "calls", "gpu ms", "us/call");
    for (int i = 0; i < c->nparts; i++)
        fprintf(stderr, "  %-32s %9ld %12.2f %10.1f\n", c->parts[i].name, c->parts[i].calls,
                c->parts[i].gpu_ms, 1e3 * c->parts[i].gpu_ms / c->parts[i].calls);
}

static void sync_debug_install(tz_backend *be, int sync_debug, int op_times) {
    tz_cuda_ctx *c = tz_cuda_ctx_of(be);
    c->ops = (tz_backend *)tz_xmalloc(sizeof *be);
    *c->ops = *be;
#define TZ_SYNC_DEBUG_WRAP(op)                                                                \
    be->op = sync_debug_op<decltype(tz_backend::op)>::call<&tz_backend::op,                    \
                                                           sync_debug_name_##op, op_index_##op>;
    TZ_BACKEND_OPS(TZ_SYNC_DEBUG_WRAP)
#undef TZ_SYNC_DEBUG_WRAP
    be->destroy = c->ops->destroy; /* the table goes away with it: nothing to check after */
    c->sync_debug = sync_debug;
    if (op_times) {
        c->op_times = 1;
        c->times = (struct tz_cuda_op_time *)calloc(op_count, sizeof *c->times);
        if (!c->times) TZ_FATAL("out of memory for TZ_CUDA_OP_TIMES");
        CUDA_CHECK(cudaEventCreate(&c->op_t0));
        CUDA_CHECK(cudaEventCreate(&c->op_t1));
        CUDA_CHECK(cudaEventCreate(&c->part_ev[0]));
        CUDA_CHECK(cudaEventCreate(&c->part_ev[1]));
    }
}

/* ---- the table ---- */

/* The module's two entry points, found by name (dlsym) by backend/registry.c, which loads
 * this library (libtzcuda.so) only when a run may use a GPU: the program itself never links
 * the CUDA runtime or cuBLAS. Their types: backend/cuda_module.h. */

/* The visible devices; 0 with CUDA's error, named, in why (when not NULL) where
 * cudaGetDeviceCount fails: no driver, an old one, no device, ... ("" when it says 0). */
static int device_count(char *why, size_t n, cudaError_t *err) {
    int count = 0;
    cudaError_t rc = cudaGetDeviceCount(&count);
    if (err) *err = rc;
    if (why && n) why[0] = 0;
    if (rc != cudaSuccess) {
        cudaGetLastError(); /* not sticky */
        if (why && n)
            snprintf(why, n, "cudaGetDeviceCount: %s: %s", cudaGetErrorName(rc),
                     cudaGetErrorString(rc));
        return 0;
    }
    return count;
}

uint64_t tz_cuda_module_abi(void) { return TZ_CUDA_ABI_STAMP; }
int tz_cuda_module_device_count(char *why, size_t n) { return device_count(why, n, NULL); }

static void cuda_destroy(tz_backend *be) {
    if (!be) return;
    tz_cuda_ctx *c = tz_cuda_ctx_of(be);
    cudaStreamSynchronize(c->stream);
    cudaStreamSynchronize(c->copy_stream);
    op_times_report(c);
    if (c->times) {
        cudaEventDestroy(c->op_t0), cudaEventDestroy(c->op_t1), free(c->times);
        cudaEventDestroy(c->part_ev[0]), cudaEventDestroy(c->part_ev[1]);
    }
    cudaFree(c->scratch);
    cudaFree(c->gemm16);
    cudaFree(c->narrow_count);
    cudaEventDestroy(c->zeroed);
    cudaStreamSynchronize(c->dec_stream);
    cudaEventDestroy(c->dec_start);
    for (int i = 0; i < 2; i++) cudaEventDestroy(c->dec_ready[i]), cudaEventDestroy(c->dec_free[i]);
    cudaStreamDestroy(c->dec_stream);
    cudaFree(c->rope.cs);
    cudaFree(c->rope.sn);
    for (int i = 0; i < c->signs.n; i++) cudaFree(c->signs.e[i].s);
    free(c->signs.e);
    cudaFreeHost(c->host_d);
    cublasDestroy(c->cublas);
    cudaStreamDestroy(c->stream);
    cudaStreamDestroy(c->copy_stream);
    free(c->sizes.key);
    free(c->sizes.bytes);
    free(c->pinned.key); /* still pinned: their owners unregister them */
    free(c->pinned.bytes);
    free(c->ops);
    free(c);
    free(be);
}

tz_backend *tz_cuda_module_create(int device) {
    char why[320];
    cudaError_t err;
    int n = device_count(why, sizeof why, &err);
    if (n <= 0 && err == cudaErrorInsufficientDriver)
        TZ_FATAL_HINT("update the NVIDIA driver to one that supports this build's CUDA "
                      "(nvidia-smi shows the CUDA version the driver supports), or set "
                      "run.device = \"cpu\"",
                      "run.device = \"cuda\": no CUDA device is visible to this process (%s; "
                      "this build's CUDA runtime is %d.%d)", why, CUDART_VERSION / 1000,
                      CUDART_VERSION % 1000 / 10);
    if (n <= 0)
        TZ_FATAL_HINT("set run.device = \"cpu\" (or \"auto\"), or run where a GPU is visible "
                      "(check nvidia-smi and CUDA_VISIBLE_DEVICES)",
                      "run.device = \"cuda\": no CUDA device is visible to this process (%s)",
                      why[0] ? why : "cudaGetDeviceCount: 0 devices");
    tz_cuda_ctx *c = (tz_cuda_ctx *)tz_xcalloc(1, sizeof *c);
    c->device = (device < 0 ? 0 : device) % n;
    CUDA_CHECK(cudaSetDevice(c->device));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, c->device));
    snprintf(c->name, sizeof c->name, "GPU %d (%s, sm_%d%d)", c->device, prop.name, prop.major,
             prop.minor);
    c->smem_optin = prop.sharedMemPerBlockOptin;
    c->smem_sm = prop.sharedMemPerMultiprocessor;
    CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&c->copy_stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&c->zeroed, cudaEventDisableTiming));
    CUDA_CHECK(cudaStreamCreateWithFlags(&c->dec_stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&c->dec_start, cudaEventDisableTiming));
    for (int i = 0; i < 2; i++) {
        CUDA_CHECK(cudaEventCreateWithFlags(&c->dec_ready[i], cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreateWithFlags(&c->dec_free[i], cudaEventDisableTiming));
    }
    CUBLAS_CHECK(cublasCreate(&c->cublas));
    CUBLAS_CHECK(cublasSetStream(c->cublas, c->stream));
    /* fp32 products in fp32 (no TF32), so the ops compare with the CPU's; cuBLAS results
     * are reproducible on one GPU and stream with the default workspace. */
    CUBLAS_CHECK(cublasSetMathMode(c->cublas, CUBLAS_PEDANTIC_MATH));
    CUDA_CHECK(cudaMallocHost((void **)&c->host_d, sizeof(double)));

    tz_backend *be = (tz_backend *)tz_xcalloc(1, sizeof *be);
    be->name = "cuda";
    be->device = 1;
    be->matmul_dtypes = (1u << TZ_DT_F32) | (1u << TZ_DT_BF16); /* fp32 until set */
    be->tq_chunks = tz_tq_device_chunks(); /* with bf16 GEMMs (cuda_quant.cu); TZ_TQ_CHUNKS */
    be->narrow_gemm = tz_narrow_gemm_enabled(); /* cuda_narrow.cu; TZ_NARROW_GEMM */
    be->tq_fused = tz_tq_fused_enabled();       /* cuda_narrow.cu; TZ_TQ_FUSED */
    be->ctx = c;
    be->destroy = cuda_destroy;
    be->alloc = cuda_alloc;
    be->release = cuda_release;
    be->upload = cuda_upload;
    be->download = cuda_download;
    be->copy = cuda_copy;
    be->sync = cuda_sync;
    be->host_alloc = cuda_host_alloc;
    be->host_free = cuda_host_free;
    be->host_register = cuda_host_register;
    be->host_unregister = cuda_host_unregister;
    be->download_async = cuda_download_async;
    be->upload_async = cuda_upload_async;
    be->event_mark = cuda_event_mark;
    be->event_wait = cuda_event_wait;
    be->event_done = cuda_event_done;
    be->event_free = cuda_event_free;
    be->device_info = cuda_device_info;
#define TZ_CUDA_CALL_INSTALL(family) tz_cuda_install_##family(be);
    TZ_CUDA_FAMILIES(TZ_CUDA_CALL_INSTALL)
#undef TZ_CUDA_CALL_INSTALL
    tz_backend_check(be);
    const char *dbg = getenv("TZ_CUDA_SYNC_DEBUG"), *tim = getenv("TZ_CUDA_OP_TIMES");
    const int want_dbg = dbg && *dbg && strcmp(dbg, "0") != 0;
    const int want_tim = tim && *tim && strcmp(tim, "0") != 0;
    if (want_dbg || want_tim) sync_debug_install(be, want_dbg, want_tim);
    tz_info_all("cuda backend on %s%s%s", c->name,
                c->sync_debug ? " (TZ_CUDA_SYNC_DEBUG: every op synchronised and checked)" : "",
                c->op_times ? " (TZ_CUDA_OP_TIMES: every op synchronised and timed)" : "");
    return be;
}
