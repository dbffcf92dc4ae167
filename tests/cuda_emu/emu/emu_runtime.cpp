/* The CUDA runtime of the CPU emulation (tests/cuda_emu/emu/): device memory, streams, events, the
 * device's description, and kernel execution with cooperative fibers.
 *
 * Kernels: the blocks of a launch run one after another on the calling thread. A block's
 * threads are fibers (their own stacks, 256 KiB each with a guard page, reused from launch
 * to launch): a thread runs until it waits at __syncthreads or at a warp collective, or
 * returns, then switches to the next thread that can run, the lanes of its own warp first
 * (a warp runs ahead of the others); the last thread to reach a barrier releases the
 * others and goes on. A block whose threads never wait runs on one fiber, thread after
 * thread, without a switch. Threads that returned no longer count toward __syncthreads.
 * Misuses that the hardware would turn into a hang or an undefined result are errors naming
 * the kernel, its block and the threads involved:
 *   - a deadlock (no thread can run, the block not done: some wait at a barrier others
 *     never reach);
 *   - threads released from one __syncthreads reached at different places (divergent code);
 *   - a warp collective whose mask leaves out the calling lane, names a lane that returned
 *     or that the block does not have, or whose lanes disagree on the operation or the mask;
 *   - a shuffle reading a lane outside the mask;
 *   - a fault (SIGSEGV, SIGBUS) inside a kernel.
 * Device memory is mapped memory, 256-byte aligned, filled with 0xff bytes (a NaN in every
 * float and double) so that reading what was never written shows, and ending at a guard page
 * (so does the dynamic shared memory); copies and sets are checked against the allocations
 * (a device operand must lie inside one) and the copy's direction. Every stream operation
 * runs at once: streams and events only keep their API contracts, and copies and sets are
 * checked for the order a GPU would need between streams (see "stream order" below).
 *
 * Failures on demand, for the tests of the backend's error paths (read at each call, so that
 * a test may set them in a child process):
 *   TZ_CUDA_EMU_DRIVER=old      cudaGetDeviceCount fails with cudaErrorInsufficientDriver;
 *   TZ_CUDA_EMU_FAULT=<kernel>  the next launch of that kernel (its name as launched, template
 *                               arguments left out) faults as an illegal address would on a
 *                               GPU: the launch returns, no kernel runs from then on, the next
 *                               synchronisation fails with cudaErrorIllegalAddress, and so
 *                               does every call after it (sticky: the context is lost);
 *   TZ_CUDA_EMU_REGISTER_MB=<n> cudaHostRegister pins at most n MiB in all, then fails with
 *                               cudaErrorMemoryAllocation (a low locked-memory limit). */
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "emu_internal.h"

/* The context switch: hand-written on x86-64 (a few registers, no system call), ucontext
 * elsewhere or with -DTZ_EMU_UCONTEXT (which also tests that path on x86-64). */
#if defined(__x86_64__) && !defined(TZ_EMU_UCONTEXT)
#define TZ_EMU_ASM_SWITCH 1
#else
#include <ucontext.h>
#endif

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

namespace {

/* ---- errors ---- */

thread_local cudaError_t g_last = cudaSuccess; /* per host thread, as in CUDA */
cudaError_t fail(cudaError_t e) {
    g_last = e;
    return e;
}
/* A lost context (TZ_CUDA_EMU_FAULT): the fault is pending from the launch on, and, as on a
 * GPU, found by the next synchronising call; from then on it is the error every call returns
 * (else cudaSuccess). */
int g_pending = cudaSuccess, g_sticky = cudaSuccess;
cudaError_t sticky(void) { return (cudaError_t)__atomic_load_n(&g_sticky, __ATOMIC_RELAXED); }
int pending(void) { return __atomic_load_n(&g_pending, __ATOMIC_RELAXED) != cudaSuccess; }
/* A synchronising call: a pending fault is found. Returns the sticky error. */
cudaError_t synced(void) {
    int p = __atomic_load_n(&g_pending, __ATOMIC_RELAXED);
    if (p != cudaSuccess) __atomic_store_n(&g_sticky, p, __ATOMIC_RELAXED);
    return sticky();
}
/* An environment variable's value, NULL when unset or empty. */
const char *env_of(const char *name) {
    const char *e = getenv(name);
    return e && *e ? e : NULL;
}

[[noreturn]] void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("CUDA emulation: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    fflush(stderr);
    abort();
}

/* Memory whose end touches an inaccessible page: `bytes` (rounded up to `align`) end where
 * the guard page begins, so a kernel running past the end of a device allocation or of its
 * shared memory faults at once (and the fault handler names the kernel) instead of reading
 * a neighbour. *map, *maplen: the mapping, for guarded_free. */
char *guarded_alloc(size_t bytes, size_t align, char **map, size_t *maplen) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t body = (bytes + page - 1) / page * page, len = body + page;
    char *m = (char *)mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    if (mprotect(m + body, page, PROT_NONE) != 0) {
        munmap(m, len);
        return NULL;
    }
    *map = m;
    *maplen = len;
    return m + body - (bytes + align - 1) / align * align;
}

/* ---- the emulated devices ---- */

int device_count(void) {
    static int n = 0;
    if (!n) {
        const char *e = getenv("TZ_CUDA_EMU_DEVICES");
        n = e && *e ? atoi(e) : 1;
        if (n < 1) n = 1;
        if (n > 16) n = 16;
    }
    return n;
}
thread_local int g_device = 0;

size_t mem_total(void) {
    static size_t total = 0;
    if (!total) {
        const char *e = getenv("TZ_CUDA_EMU_MEM_MB");
        long long mb = e && *e ? atoll(e) : 4096;
        if (mb < 1) mb = 1;
        total = (size_t)mb << 20;
    }
    return total;
}

/* ---- allocations: device, pinned host (cudaMallocHost), registered host ---- */

enum { MEM_DEVICE, MEM_PINNED, MEM_REGISTERED };
struct Alloc {
    char *base;
    size_t size;
    int kind;
    char *map; /* device memory: its guarded mapping */
    size_t maplen;
    /* device memory: the latest copies and sets that wrote it, with the bytes each wrote
     * (stream order, below): ALLOC_WRITES records (replaced as order_check says), so an access is checked against the
     * writes of the ranges it touches (an allocation shared by many buffers, e.g. an arena,
     * is written by one stream in one place while another reads elsewhere) */
#define ALLOC_WRITES 32
    struct Write {
        const char *fn;
        int sid;
        uint64_t t; /* 0: none */
        const char *lo, *hi;
        int read;   /* a kernel's declared read (tz_emu_kernel_reads): a later write by another
                     * stream must be ordered after it */
    } w[ALLOC_WRITES];
    int w_next;
};
pthread_mutex_t g_mem_mu = PTHREAD_MUTEX_INITIALIZER;
Alloc *g_alloc;
size_t g_nalloc, g_calloc, g_used, g_registered;

/* Index of the first allocation whose base is > p (sorted by base). */
size_t upper(const void *p) {
    size_t lo = 0, hi = g_nalloc;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (g_alloc[mid].base <= (const char *)p) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}
/* The allocation holding p, or NULL. */
Alloc *holding(const void *p) {
    size_t i = upper(p);
    if (!i) return NULL;
    Alloc *a = &g_alloc[i - 1];
    return (const char *)p < a->base + (a->size ? a->size : 1) ? a : NULL;
}
void add_alloc(char *base, size_t size, int kind, char *map = NULL, size_t maplen = 0) {
    if (g_nalloc == g_calloc) {
        g_calloc = g_calloc ? 2 * g_calloc : 256;
        g_alloc = (Alloc *)realloc(g_alloc, g_calloc * sizeof *g_alloc);
        if (!g_alloc) die("out of host memory for the allocation table");
    }
    size_t i = upper(base);
    memmove(&g_alloc[i + 1], &g_alloc[i], (g_nalloc - i) * sizeof *g_alloc);
    g_alloc[i] = Alloc{base, size, kind, map, maplen, {}, 0};
    g_nalloc++;
}
void remove_alloc(Alloc *a) {
    size_t i = (size_t)(a - g_alloc);
    memmove(&g_alloc[i], &g_alloc[i + 1], (g_nalloc - i - 1) * sizeof *g_alloc);
    g_nalloc--;
}

/* Device allocation containing p: 1 when [p, p + bytes) fits in it, 0 when p is not device
 * memory, -1 when p is device memory but the range runs past its allocation. */
int dev_state(const void *p, size_t bytes) {
    Alloc *a = holding(p);
    if (!a || a->kind != MEM_DEVICE) return 0;
    return (size_t)((const char *)p - a->base) + bytes <= a->size ? 1 : -1;
}

const char *kind_name(cudaMemcpyKind k) {
    switch (k) {
    case cudaMemcpyHostToHost: return "HostToHost";
    case cudaMemcpyHostToDevice: return "HostToDevice";
    case cudaMemcpyDeviceToHost: return "DeviceToHost";
    case cudaMemcpyDeviceToDevice: return "DeviceToDevice";
    case cudaMemcpyDefault: return "Default";
    }
    return "?";
}

/* Checks one side of a copy: `want` 1 device, 0 host, -1 either. */
cudaError_t check_side(const char *fn, const char *side, const void *p, size_t bytes, int want,
                       cudaMemcpyKind k) {
    int st = dev_state(p, bytes);
    if (st < 0) {
        tz_emu_note("%s(%s): the %s %p + %zu bytes runs past the end of its device allocation",
                    fn, kind_name(k), side, p, bytes);
        return cudaErrorInvalidValue;
    }
    if (want == 1 && st != 1) {
        tz_emu_note("%s(%s): the %s %p is not device memory", fn, kind_name(k), side, p);
        return cudaErrorInvalidValue;
    }
    if (want == 0 && st == 1) {
        tz_emu_note("%s(%s): the %s %p is device memory", fn, kind_name(k), side, p);
        return cudaErrorInvalidValue;
    }
    return cudaSuccess;
}

cudaError_t order_access(const char *fn, cudaStream_t s, void *dst, size_t dspan,
                         const void *src, size_t sspan, int record_read = 0);

cudaError_t do_copy(const char *fn, void *dst, size_t dpitch, const void *src, size_t spitch,
                    size_t width, size_t height, cudaMemcpyKind k, cudaStream_t s) {
    if (!tz_emu_stream_ok(s)) return fail(cudaErrorInvalidResourceHandle);
    if (sticky()) return fail(sticky());
    if (!width || !height) return cudaSuccess;
    if (width > dpitch || width > spitch) return fail(cudaErrorInvalidPitchValue);
    if ((unsigned)k > (unsigned)cudaMemcpyDefault) return fail(cudaErrorInvalidMemcpyDirection);
    if (!dst || !src) {
        tz_emu_note("%s(%s): a NULL %s", fn, kind_name(k), dst ? "source" : "destination");
        return fail(cudaErrorInvalidValue);
    }
    size_t dspan = dpitch * (height - 1) + width, sspan = spitch * (height - 1) + width;
    int wd = k == cudaMemcpyHostToDevice || k == cudaMemcpyDeviceToDevice ? 1
             : k == cudaMemcpyDefault                                    ? -1
                                                                         : 0;
    int ws = k == cudaMemcpyDeviceToHost || k == cudaMemcpyDeviceToDevice ? 1
             : k == cudaMemcpyDefault                                    ? -1
                                                                         : 0;
    pthread_mutex_lock(&g_mem_mu);
    cudaError_t e = check_side(fn, "destination", dst, dspan, wd, k);
    if (e == cudaSuccess) e = check_side(fn, "source", src, sspan, ws, k);
    pthread_mutex_unlock(&g_mem_mu);
    if (e != cudaSuccess) return fail(e);
    const char *d0 = (const char *)dst, *s0 = (const char *)src;
    if (d0 < s0 + sspan && s0 < d0 + dspan && dst != src) {
        tz_emu_note("%s(%s): the destination %p + %zu and the source %p + %zu overlap", fn,
                    kind_name(k), dst, dspan, src, sspan);
        return fail(cudaErrorInvalidValue);
    }
    if ((e = order_access(fn, s, dst, dspan, src, sspan, 1)) != cudaSuccess) return fail(e);
    for (size_t r = 0; r < height; r++)
        memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    return cudaSuccess;
}

/* ---- streams and events: live handles in small tables ---- */

struct Handles {
    void **p;
    size_t n, cap;
    int has(const void *h) const {
        for (size_t i = 0; i < n; i++)
            if (p[i] == h) return 1;
        return 0;
    }
    void add(void *h) {
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            p = (void **)realloc(p, cap * sizeof *p);
            if (!p) die("out of host memory for handles");
        }
        p[n++] = h;
    }
    int drop(const void *h) {
        for (size_t i = 0; i < n; i++)
            if (p[i] == h) {
                p[i] = p[--n];
                return 1;
            }
        return 0;
    }
};
Handles g_streams, g_events;
pthread_mutex_t g_handle_mu = PTHREAD_MUTEX_INITIALIZER;

double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* ---- stream order ----
 * Streams run at once here, but on a GPU work on two streams is ordered only by events
 * (cudaEventRecord, then cudaStreamWaitEvent) or by the host waiting for one stream before it
 * queues work on the other. Vector clocks keep that order: each stream (an index, 0 the
 * default stream) counts its operations and knows how far every other stream had got when
 * it was last ordered after it; the host knows what it has waited for, and work it queues
 * comes after that. Each device allocation remembers the last copies and sets that wrote it
 * or read it (a copy's device source); a copy or set on another stream that reads the
 * allocation with no order after such a write, or writes it with no order after such a write
 * or read, fails with cudaErrorInvalidValue and a note naming both (a race a GPU may or may
 * not show). Kernels' accesses are not known here and are checked only where the backend
 * declares them (tz_emu_kernel_reads, tz_emu_kernel_writes). */
enum { MAX_SIDS = 64 };
struct Clock {
    uint64_t t[MAX_SIDS];
    void join(const Clock &o) {
        for (int i = 0; i < MAX_SIDS; i++)
            if (o.t[i] > t[i]) t[i] = o.t[i];
    }
};
pthread_mutex_t g_order_mu = PTHREAD_MUTEX_INITIALIZER;
Clock g_stream_clock[MAX_SIDS], g_host_clock;
uint64_t g_sid_used = 1; /* bit i: index i taken (0: the default stream) */

} // namespace

struct tz_emu_stream {
    unsigned flags;
    int sid; /* stream order: its index, 0 when all are taken (then ordered as the default) */
};
struct tz_emu_event {
    unsigned flags;
    int recorded;
    double t_ms;
    Clock at; /* the recording stream's clock */
};

namespace {

int sid_of(cudaStream_t s) {
    return !s || s == cudaStreamLegacy || s == cudaStreamPerThread ? 0 : s->sid;
}

/* The host waited for what clock c says: later work it queues comes after. */
void host_joins(const Clock &c) {
    pthread_mutex_lock(&g_order_mu);
    g_host_clock.join(c);
    pthread_mutex_unlock(&g_order_mu);
}
void host_joins_stream(cudaStream_t s) {
    pthread_mutex_lock(&g_order_mu);
    g_host_clock.join(g_stream_clock[sid_of(s)]);
    pthread_mutex_unlock(&g_order_mu);
}
void host_joins_all(void) {
    pthread_mutex_lock(&g_order_mu);
    for (int i = 0; i < MAX_SIDS; i++) g_host_clock.join(g_stream_clock[i]);
    pthread_mutex_unlock(&g_order_mu);
}

/* Whether every stream in use and the host are ordered after write w (g_order_mu held). */
int known_to_all(const Alloc::Write &w) {
    if (g_host_clock.t[w.sid] < w.t || g_stream_clock[0].t[w.sid] < w.t) return 0;
    for (int i = 1; i < MAX_SIDS; i++)
        if ((g_sid_used >> i & 1) && g_stream_clock[i].t[w.sid] < w.t) return 0;
    return 1;
}

/* One access of a copy or set on stream s to bytes [p, p + span) (g_mem_mu held): every
 * recorded write of those bytes by another stream must be ordered before it; a write is then
 * recorded. */
cudaError_t order_check(const char *fn, int sid, Alloc *a, const char *side, const void *p,
                        size_t span, uint64_t now, int writes, int record_read = 0) {
    if (!a || a->kind != MEM_DEVICE) return cudaSuccess;
    const char *lo = (const char *)p, *hi = lo + span;
    for (int k = 0; k < ALLOC_WRITES; k++) {
        const Alloc::Write &w = a->w[k];
        if (w.t && w.sid != sid && (writes || !w.read) && w.lo < hi && lo < w.hi &&
            g_stream_clock[sid].t[w.sid] < w.t) {
            tz_emu_note("%s on stream %d: its %s %p (+%zu bytes) was %s by %s on stream %d, and "
                        "nothing orders the two (an event recorded after that %s and waited for "
                        "by this stream, or the host waiting for it before queueing this)", fn,
                        sid, side, p, span, w.read ? "read" : "written", w.fn, w.sid,
                        w.read ? "read" : "write");
            return cudaErrorInvalidValue;
        }
    }
    if (writes || record_read) {
        /* the record replaced: a free one, else one this write supersedes (same stream, its
         * bytes within these), else one every stream (and the host) is already ordered after,
         * so that no later access can race with it, else the oldest */
        int k = -1;
        for (int i = 0; i < ALLOC_WRITES && k < 0; i++)
            if (!a->w[i].t) k = i;
        for (int i = 0; i < ALLOC_WRITES && k < 0; i++)
            if (a->w[i].sid == sid && a->w[i].read == !writes && lo <= a->w[i].lo &&
                a->w[i].hi <= hi)
                k = i;
        for (int i = 0; i < ALLOC_WRITES && k < 0; i++)
            if (known_to_all(a->w[i])) k = i;
        if (k < 0) {
            k = a->w_next;
            a->w_next = (a->w_next + 1) % ALLOC_WRITES;
        }
        Alloc::Write &w = a->w[k];
        w.fn = fn, w.sid = sid, w.t = now, w.lo = lo, w.hi = hi, w.read = !writes;
    }
    return cudaSuccess;
}

cudaError_t order_access(const char *fn, cudaStream_t s, void *dst, size_t dspan,
                         const void *src, size_t sspan, int record_read) {
    const int sid = sid_of(s);
    pthread_mutex_lock(&g_mem_mu);
    pthread_mutex_lock(&g_order_mu);
    Clock &c = g_stream_clock[sid];
    c.join(g_host_clock);
    const uint64_t now = ++c.t[sid];
    cudaError_t e =
        src ? order_check(fn, sid, holding(src), "source", src, sspan, now, 0, record_read)
            : cudaSuccess;
    if (e == cudaSuccess) e = order_check(fn, sid, holding(dst), "destination", dst, dspan, now, 1);
    pthread_mutex_unlock(&g_order_mu);
    pthread_mutex_unlock(&g_mem_mu);
    return e;
}

} // namespace

void tz_emu_note(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("CUDA emulation: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

int tz_emu_dev_range(const void *p, size_t bytes) {
    pthread_mutex_lock(&g_mem_mu);
    int st = dev_state(p, bytes);
    pthread_mutex_unlock(&g_mem_mu);
    return st == 1;
}

int tz_emu_stream_ok(cudaStream_t s) {
    if (!s || s == cudaStreamLegacy || s == cudaStreamPerThread) return 1;
    pthread_mutex_lock(&g_handle_mu);
    int ok = g_streams.has(s);
    pthread_mutex_unlock(&g_handle_mu);
    return ok;
}

/* ==== kernels: fibers and the block scheduler ==== */

namespace {

const size_t STACK_BYTES = 256 * 1024;

#if TZ_EMU_ASM_SWITCH
/* tz_emu_switch(save, load): saves the callee-saved registers and the stack pointer in *save,
 * and resumes the context whose stack pointer is load. The SSE and x87 control words (which
 * the ABI also counts as callee-saved) are not switched: all fibers run on one thread whose
 * rounding and exception state nothing in a kernel changes, and loading them at each switch
 * (ldmxcsr, fldcw) was about a tenth of the emulation's time. */
extern "C" void tz_emu_switch(void **save, void *load);
__asm__(".text\n"
        ".p2align 4\n"
        ".type tz_emu_switch,@function\n"
        "tz_emu_switch:\n"
        "  pushq %rbp\n"
        "  pushq %rbx\n"
        "  pushq %r12\n"
        "  pushq %r13\n"
        "  pushq %r14\n"
        "  pushq %r15\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  popq %r15\n"
        "  popq %r14\n"
        "  popq %r13\n"
        "  popq %r12\n"
        "  popq %rbx\n"
        "  popq %rbp\n"
        "  ret\n"
        ".size tz_emu_switch,.-tz_emu_switch\n");
#endif

struct Fiber {
    char *mem; /* guard page, then the stack */
#if TZ_EMU_ASM_SWITCH
    void *sp;
#else
    ucontext_t uc;
#endif
};

enum { T_NEW, T_READY, T_SYNC, T_WARP, T_DONE }; /* runnable: state <= T_READY */
struct Thread {
    int state;
    int fiber;
    int kind;          /* warp collective kind */
    unsigned mask;     /* its mask */
    int arg, width;    /* its lane argument and width */
    int pred;          /* __syncthreads_count/and/or predicate */
    uint64_t val, res; /* the value put in and the one taken out */
    const void *site;  /* where it waits (a return address in the kernel) */
    int npend;         /* cp.async copies issued and not yet done (tz_emu_cp_async) */
    int ngroups;       /* of the committed ones, the groups not yet waited for */
    int gend[16];      /* each such group's end in the thread's copies */
};

/* The launch being run (one at a time: g_launch_mu). */
struct Launch {
    const char *name;
    void (*call)(const void *);
    const void *fn;
    unsigned n;  /* threads per block */
    int live;    /* threads of the block that have not returned */
    int nsync;   /* of them, waiting at __syncthreads */
    int cur;     /* the running thread */
    int reverse; /* run threads in descending order (TZ_CUDA_EMU_ORDER=reverse) */
    int async_early; /* cp.async copies done at issue (TZ_CUDA_EMU_ASYNC=early), not at the wait */
    char *smem;
    size_t smem_bytes;
    Thread *th;
    unsigned th_cap;
    int waiting[32];       /* per warp: lanes waiting at a collective */
    unsigned exited[32];   /* per warp: lanes that returned */
    int fiber;             /* the fiber running now, -1 the scheduler */
    uint64_t block_seq;    /* blocks run so far, for tz_emu_shared_fresh */
    volatile sig_atomic_t in_kernel;
} L;
pthread_mutex_t g_launch_mu = PTHREAD_MUTEX_INITIALIZER;
size_t g_smem_limit = 48 * 1024;
/* The most dynamic shared memory a block may opt in to: an H100's 227 KiB, or
 * TZ_CUDA_EMU_SMEM_OPTIN bytes (a smaller GPU's: 101376 for sm_86 and sm_89; from 16 KiB, below
 * any GPU's 48, so that the small head sizes of the tests reach the kernels' fallbacks too),
 * which the device properties report and cudaFuncSetAttribute holds to. */
size_t smem_optin(void) {
    static size_t v = 0;
    if (!v) {
        const char *e = getenv("TZ_CUDA_EMU_SMEM_OPTIN");
        char *end = NULL;
        const long long x = e && *e ? strtoll(e, &end, 10) : 0;
        if (e && *e && (*end || x < 16 * 1024 || x > 227 * 1024))
            die("TZ_CUDA_EMU_SMEM_OPTIN=%s: expected bytes from 16384 to 232448", e);
        v = x ? (size_t)x : 227 * 1024;
    }
    return v;
}

/* cp.async: each thread's copies issued and not done, in order (g_async + i * ASYNC_MAX) */
enum { ASYNC_MAX = 256, ASYNC_GROUPS = 16 };
struct AsyncCopy {
    void *dst;
    const void *src;
    int bytes, src_bytes;
};
AsyncCopy *g_async;

Fiber *g_fib;
int g_nfib, g_cfib;
int *g_free; /* free fibers (stack) */
int g_nfree;
#if TZ_EMU_ASM_SWITCH
void *g_sched_sp;
#else
ucontext_t g_sched_uc;
#endif

void set_coords(int i) {
    unsigned u = (unsigned)i;
    if (blockDim.y == 1 && blockDim.z == 1) { /* the usual case, without divisions */
        threadIdx.x = u;
        return;
    }
    threadIdx.x = u % blockDim.x;
    threadIdx.y = (u / blockDim.x) % blockDim.y;
    threadIdx.z = u / (blockDim.x * blockDim.y);
}

/* Saves the running context (a fiber or the scheduler) and resumes fiber f. */
void switch_to_fiber(int f) {
    int from = L.fiber;
    L.fiber = f;
#if TZ_EMU_ASM_SWITCH
    tz_emu_switch(from < 0 ? &g_sched_sp : &g_fib[from].sp, g_fib[f].sp);
#else
    swapcontext(from < 0 ? &g_sched_uc : &g_fib[from].uc, &g_fib[f].uc);
#endif
}
/* From a fiber back to the scheduler (nothing else can run). */
void switch_to_scheduler(void) {
    int from = L.fiber;
    L.fiber = -1;
#if TZ_EMU_ASM_SWITCH
    tz_emu_switch(&g_fib[from].sp, g_sched_sp);
#else
    swapcontext(&g_fib[from].uc, &g_sched_uc);
#endif
}

void thread_exit(void);

/* Every fiber runs this forever: the kernel for the thread it is given, then back. */
[[noreturn]] void fiber_main(void) {
    for (;;) {
        L.call(L.fn);
        thread_exit();
    }
}

#if TZ_EMU_ASM_SWITCH
extern "C" void tz_emu_fiber_entry(void) { fiber_main(); }
#endif

int new_fiber(void) {
    if (g_nfib == g_cfib) {
        g_cfib = g_cfib ? 2 * g_cfib : 64;
        g_fib = (Fiber *)realloc(g_fib, (size_t)g_cfib * sizeof *g_fib);
        g_free = (int *)realloc(g_free, (size_t)g_cfib * sizeof *g_free);
        if (!g_fib || !g_free) die("out of host memory for fibers");
    }
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    char *mem = (char *)mmap(NULL, STACK_BYTES + page, PROT_READ | PROT_WRITE,
                             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mem == MAP_FAILED) die("cannot map a %zu-byte thread stack", STACK_BYTES);
    mprotect(mem, page, PROT_NONE); /* a stack overflow faults instead of corrupting */
    Fiber *f = &g_fib[g_nfib];
    f->mem = mem;
#if TZ_EMU_ASM_SWITCH
    /* each stack starts at its own offset within a page: the fibers of a block stop at the
     * same depth of the same code, and stacks at one offset all fall in the same few L1
     * cache sets, a miss at nearly every switch */
    char *top = mem + page + STACK_BYTES - (size_t)(g_nfib % 64) * 64;
    uint64_t *sp = (uint64_t *)((uintptr_t)top & ~(uintptr_t)15);
    *--sp = 0;                                 /* the entry's return address: none */
    *--sp = (uint64_t)(uintptr_t)&tz_emu_fiber_entry; /* where the first switch returns */
    for (int r = 0; r < 6; r++) *--sp = 0;     /* rbp rbx r12 r13 r14 r15 */
    f->sp = sp;
#else
    getcontext(&f->uc);
    f->uc.uc_stack.ss_sp = mem + page;
    f->uc.uc_stack.ss_size = STACK_BYTES;
    f->uc.uc_link = NULL;
    makecontext(&f->uc, (void (*)(void))fiber_main, 0);
#endif
    return g_nfib++;
}

/* The next thread that can run after thread `from` (-1: from the start), in the block's
 * order (ascending, or descending with TZ_CUDA_EMU_ORDER=reverse); -1 when none can. The
 * lanes of from's warp come first: a warp runs ahead as far as it can (to a __syncthreads
 * or its end) before another starts, the schedule that most often exposes a missing
 * barrier between warps (one warp overwriting shared memory that others have yet to read). */
int next_runnable(int from) {
    const int n = (int)L.n, rev = L.reverse;
    const Thread *th = L.th;
    /* (no divisions: this runs at every switch, 32 times a warp collective) */
    if (from >= 0) {
        const int w0 = from & ~31, last = (n - w0 < 32 ? n : w0 + 32) - 1;
        int i = from;
        for (int k = w0; k < last; k++) {
            i = rev ? (i == w0 ? last : i - 1) : (i == last ? w0 : i + 1);
            if (th[i].state <= T_READY) return i;
        }
    }
    int i = from >= 0 ? from : rev ? n : -1;
    for (int k = 0; k < n; k++) {
        i = rev ? (i == 0 ? n - 1 : i - 1) : (i + 1 == n ? 0 : i + 1);
        if (th[i].state <= T_READY) return i;
    }
    return -1;
}

/* Makes thread i the running one and switches to its fiber (a new thread gets a fiber). */
void resume(int i) {
    Thread *t = &L.th[i];
    if (t->state == T_NEW) {
        t->fiber = g_nfree ? g_free[--g_nfree] : new_fiber();
        t->state = T_READY;
    }
    L.cur = i;
    set_coords(i);
    switch_to_fiber(t->fiber);
}

/* The running thread waits: another thread runs, or the scheduler when none can. Returns
 * when this thread is resumed. */
void yield(void) {
    int j = next_runnable(L.cur);
    if (j < 0) switch_to_scheduler();
    else resume(j);
}

/* "0-31, 64" style list of the threads in state st (-1: all not returned), into buf. */
void thread_list(char *buf, size_t cap, int st) {
    size_t w = 0;
    buf[0] = 0;
    for (unsigned i = 0; i < L.n && w + 32 < cap;) {
        int s = L.th[i].state;
        if (st >= 0 ? s != st : s == T_DONE) {
            i++;
            continue;
        }
        unsigned j = i;
        while (j + 1 < L.n && (st >= 0 ? L.th[j + 1].state == st : L.th[j + 1].state != T_DONE))
            j++;
        w += (size_t)snprintf(buf + w, cap - w, "%s%u", w ? ", " : "", i);
        if (j > i) w += (size_t)snprintf(buf + w, cap - w, "-%u", j);
        i = j + 1;
    }
    if (!buf[0]) snprintf(buf, cap, "none");
}

const char *site_name(const void *site, char *buf, size_t cap) {
    /* file+offset, for addr2line -e FILE OFFSET (kernels are static: no symbol names) */
    Dl_info di;
    if (site && dladdr(site, &di) && di.dli_fname) {
        const char *base = strrchr(di.dli_fname, '/');
        snprintf(buf, cap, "%s+%#lx", base ? base + 1 : di.dli_fname,
                 (unsigned long)((const char *)site - (const char *)di.dli_fbase));
    } else snprintf(buf, cap, "%p", site);
    return buf;
}

const char *coll_name(int kind) {
    switch (kind) {
    case TZ_EMU_SHFL_IDX: return "__shfl_sync";
    case TZ_EMU_SHFL_UP: return "__shfl_up_sync";
    case TZ_EMU_SHFL_DOWN: return "__shfl_down_sync";
    case TZ_EMU_SHFL_XOR: return "__shfl_xor_sync";
    case TZ_EMU_BALLOT: return "__ballot_sync/__any_sync/__all_sync";
    case TZ_EMU_SYNCWARP: return "__syncwarp";
    }
    return "?";
}

[[noreturn]] void kernel_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void kernel_error(const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    die("kernel %s, block (%u,%u,%u) of grid (%u,%u,%u), block size (%u,%u,%u): %s", L.name,
        blockIdx.x, blockIdx.y, blockIdx.z, gridDim.x, gridDim.y, gridDim.z, blockDim.x,
        blockDim.y, blockDim.z, msg);
}

[[noreturn]] void deadlock(void) {
    char sync[512], warp[512], done[512], site[160];
    thread_list(sync, sizeof sync, T_SYNC);
    thread_list(warp, sizeof warp, T_WARP);
    thread_list(done, sizeof done, T_DONE);
    const void *ws = NULL;
    int wk = 0;
    for (unsigned i = 0; i < L.n; i++)
        if (L.th[i].state == T_WARP) {
            ws = L.th[i].site;
            wk = L.th[i].kind;
            break;
        }
    kernel_error("deadlock: no thread can go on. Waiting at __syncthreads: %s; waiting at a "
                 "warp collective (first: %s at %s): %s; returned: %s",
                 sync, coll_name(wk), site_name(ws, site, sizeof site), warp, done);
}

/* Releases the threads waiting at __syncthreads (all live ones are there). */
void release_sync(void) {
    const void *site = NULL;
    int count = 0, first = -1;
    for (unsigned i = 0; i < L.n; i++)
        if (L.th[i].state == T_SYNC) {
            if (first < 0) site = L.th[i].site, first = (int)i;
            else if (L.th[i].site != site) {
                char a[160], b[160];
                kernel_error("threads %d and %u wait at different __syncthreads (%s, %s): "
                             "a barrier in divergent code",
                             first, i, site_name(site, a, sizeof a),
                             site_name(L.th[i].site, b, sizeof b));
            }
            count += L.th[i].pred != 0;
        }
    for (unsigned i = 0; i < L.n; i++)
        if (L.th[i].state == T_SYNC) {
            L.th[i].state = T_READY;
            L.th[i].res = (uint64_t)count;
        }
    L.nsync = 0;
}

/* Thread L.cur returned from the kernel. On return, L.cur is the thread this fiber runs next
 * (fiber_main calls the kernel again). */
void thread_exit(void) {
    int i = L.cur;
    Thread *t = &L.th[i];
    if (t->npend)
        kernel_error("thread %d returned with %d cp.async copies not waited for "
                     "(cp.async.wait_group)", i, t->npend);
    t->state = T_DONE;
    L.live--;
    unsigned w = (unsigned)i >> 5, lane = (unsigned)i & 31u, w0 = w * 32;
    L.exited[w] |= 1u << lane;
    /* a lane of the warp waiting at a collective that names this lane can never finish */
    if (L.waiting[w])
        for (unsigned j = w0; j < w0 + 32 && j < L.n; j++)
            if (L.th[j].state == T_WARP && (L.th[j].mask >> lane & 1u))
                kernel_error("thread %d returned while thread %u waits for it at %s (mask %#x)",
                             i, j, coll_name(L.th[j].kind), L.th[j].mask);
    if (L.live > 0 && L.nsync == L.live) release_sync();
    int f = t->fiber, j = next_runnable(i);
    if (j >= 0 && L.th[j].state == T_NEW) { /* this fiber runs it: no switch */
        L.th[j].fiber = f;
        L.th[j].state = T_READY;
        L.cur = j;
        set_coords(j);
        return;
    }
    g_free[g_nfree++] = f;
    /* resumed later only for a new thread, L.cur set by whoever resumes it */
    if (j < 0) switch_to_scheduler();
    else resume(j);
}

void run_block(void) {
    unsigned n = L.n;
    for (unsigned i = 0; i < n; i++) L.th[i].state = T_NEW, L.th[i].npend = L.th[i].ngroups = 0;
    memset(L.waiting, 0, sizeof L.waiting);
    memset(L.exited, 0, sizeof L.exited);
    L.live = (int)n;
    L.nsync = 0;
    L.fiber = -1;
    L.block_seq++;
    if (L.smem_bytes) memset(L.smem, 0xff, L.smem_bytes);
    /* the threads switch among themselves; back here when none can run */
    resume(next_runnable(-1));
    if (L.live) deadlock();
}

/* ---- faults inside kernels: say where, then let the fault take its usual course ---- */

struct sigaction g_old_segv, g_old_bus;
int g_handlers;

void on_fault(int sig, siginfo_t *si, void *uc) {
    (void)uc;
    sigaction(SIGSEGV, &g_old_segv, NULL);
    sigaction(SIGBUS, &g_old_bus, NULL);
    g_handlers = 0;
    if (L.in_kernel) {
        char msg[512];
        int len = snprintf(msg, sizeof msg,
                           "\nCUDA emulation: kernel %s faulted (%s at address %p) in block "
                           "(%u,%u,%u), thread (%u,%u,%u): an out-of-bounds or host pointer "
                           "access on a GPU\n",
                           L.name, sig == SIGSEGV ? "SIGSEGV" : "SIGBUS", si->si_addr,
                           blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y,
                           threadIdx.z);
        if (len > 0 && write(2, msg, (size_t)len) < 0) {
        }
    }
    /* returning re-runs the faulting access under the previous handler */
}

void install_fault_handler(void) {
    if (g_handlers) return;
    static thread_local int alt = 0;
    if (!alt) { /* a stack of its own: a thread stack overflow must still be reported */
        stack_t old;
        if (sigaltstack(NULL, &old) == 0 && (old.ss_flags & SS_DISABLE)) {
            static thread_local char *mem = NULL;
            size_t bytes = 64 * 1024;
            mem = (char *)malloc(bytes);
            if (mem) {
                stack_t st;
                st.ss_sp = mem;
                st.ss_size = bytes;
                st.ss_flags = 0;
                sigaltstack(&st, NULL);
            }
        }
        alt = 1;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_old_segv);
    sigaction(SIGBUS, &sa, &g_old_bus);
    g_handlers = 1;
}

} // namespace

/* ---- barriers and warp collectives (called by the kernels' threads) ---- */

static int sync_impl(int pred, const void *site) {
    Thread *t = &L.th[L.cur];
    t->state = T_SYNC;
    t->pred = pred;
    t->site = site;
    L.nsync++;
    if (L.nsync == L.live) release_sync(); /* the last one: everyone goes on, this one first */
    else yield();
    return (int)t->res;
}

__attribute__((noinline)) void __syncthreads(void) {
    if (!L.in_kernel) die("__syncthreads called outside a kernel");
    sync_impl(0, __builtin_return_address(0));
}
__attribute__((noinline)) int __syncthreads_count(int pred) {
    return sync_impl(pred, __builtin_return_address(0));
}
__attribute__((noinline)) int __syncthreads_and(int pred) {
    return sync_impl(pred, __builtin_return_address(0)) == L.live;
}
__attribute__((noinline)) int __syncthreads_or(int pred) {
    return sync_impl(pred, __builtin_return_address(0)) != 0;
}

__attribute__((noinline)) uint64_t tz_emu_warp(int kind, unsigned mask, uint64_t bits, int arg,
                                               int width) {
    if (!L.in_kernel) die("%s called outside a kernel", coll_name(kind));
    int i = L.cur;
    Thread *t = &L.th[i];
    unsigned lane = (unsigned)i & 31u, w0 = (unsigned)i & ~31u;
    if (!(mask >> lane & 1u))
        kernel_error("thread %d calls %s with mask %#x, which leaves out its own lane %u", i,
                     coll_name(kind), mask, lane);
    if (width < 1 || width > 32 || (width & (width - 1)))
        kernel_error("thread %d calls %s with width %d (a power of 2 up to 32)", i,
                     coll_name(kind), width);
    unsigned w = w0 / 32, have = L.n - w0 >= 32 ? ~0u : (1u << (L.n - w0)) - 1u;
    if (mask & ~have)
        kernel_error("thread %d calls %s with mask %#x naming lanes this block (%u threads) "
                     "does not have", i, coll_name(kind), mask, L.n);
    if (mask & L.exited[w])
        kernel_error("thread %d calls %s with mask %#x naming lane %d, which has returned", i,
                     coll_name(kind), mask, __builtin_ctz(mask & L.exited[w]));
    t->kind = kind;
    t->mask = mask;
    t->val = bits;
    t->arg = arg;
    t->width = width;
    t->site = __builtin_return_address(0);
    t->state = T_WARP;
    /* complete when every lane of the mask waits here (a full mask: all 32 are, at some
     * collective; a partial one: each lane of it must be checked) */
    int need = mask == ~0u ? 32 : __builtin_popcount(mask);
    if (++L.waiting[w] < need) {
        yield();
        return t->res;
    }
    if (mask != ~0u)
        for (unsigned m = mask; m; m &= m - 1)
            if (L.th[w0 + (unsigned)__builtin_ctz(m)].state != T_WARP) {
                yield();
                return t->res;
            }
    L.waiting[w] -= need;
    /* all here: the same operation and mask everywhere, then each lane's result */
    unsigned ballot = 0;
    if (kind == TZ_EMU_BALLOT)
        for (unsigned m = mask; m; m &= m - 1) {
            unsigned l = (unsigned)__builtin_ctz(m);
            if (L.th[w0 + l].val) ballot |= 1u << l;
        }
    for (unsigned m = mask; m; m &= m - 1) {
        unsigned l = (unsigned)__builtin_ctz(m);
        Thread *o = &L.th[w0 + l];
        if (o->kind != kind || o->mask != mask || o->width != width) {
            char a[160], b[160];
            kernel_error("lanes of warp %u disagree: lane %u at %s (mask %#x, %s), lane %u at "
                         "%s (mask %#x, %s)", w0 / 32, lane, coll_name(kind), mask,
                         site_name(t->site, a, sizeof a), l, coll_name(o->kind), o->mask,
                         site_name(o->site, b, sizeof b));
        }
        unsigned base = l & ~(unsigned)(width - 1), src = l;
        switch (kind) {
        case TZ_EMU_SHFL_IDX: src = base + ((unsigned)o->arg & (unsigned)(width - 1)); break;
        case TZ_EMU_SHFL_UP:
            src = l - (unsigned)o->arg;
            if (o->arg < 0 || (int)l - o->arg < (int)base) src = l;
            break;
        case TZ_EMU_SHFL_DOWN:
            src = l + (unsigned)o->arg;
            if (o->arg < 0 || src >= base + (unsigned)width) src = l;
            break;
        case TZ_EMU_SHFL_XOR:
            src = l ^ ((unsigned)o->arg & 31u);
            if (src >= base + (unsigned)width) src = l;
            break;
        default: break;
        }
        if (kind == TZ_EMU_BALLOT) o->res = ballot;
        else if (kind == TZ_EMU_SYNCWARP) o->res = 0;
        else {
            if (!(mask >> src & 1u))
                kernel_error("lane %u of warp %u reads lane %u at %s, outside the mask %#x", l,
                             w0 / 32, src, coll_name(kind), mask);
            o->res = L.th[w0 + src].val;
        }
        o->state = T_READY;
    }
    return t->res; /* the last lane goes on at once */
}

void *tz_emu_dyn_smem(void) { return L.smem_bytes ? L.smem : NULL; }

/* cp.async (sm_80): a copy of `bytes` from global to shared memory, src_bytes of them read and
 * the rest zeros, that completes at some time before the thread's cp.async.wait_group says
 * its group is done, and is seen by other threads only after a barrier after that. Done here
 * as late as that allows: at the wait, so a read of the destination before it finds the NaN
 * bytes shared memory starts with, and another thread's read before the barrier finds them
 * while the issuing thread has not reached its wait (the warps run ahead of each other). With
 * TZ_CUDA_EMU_ASYNC=early, as early: at the issue, so a copy into a buffer that other warps
 * still read (a missing barrier before it) overwrites what they have not read yet. */
static void async_do(const AsyncCopy &c) {
    if (c.src_bytes) memcpy(c.dst, c.src, (size_t)c.src_bytes);
    memset((char *)c.dst + c.src_bytes, 0, (size_t)(c.bytes - c.src_bytes));
}
void tz_emu_cp_async(void *dst, const void *src, int bytes, int src_bytes) {
    if (!L.in_kernel) die("cp.async issued outside a kernel");
    const int i = L.cur;
    Thread *t = &L.th[i];
    const char *d = (const char *)dst;
    if (bytes != 4 && bytes != 8 && bytes != 16)
        kernel_error("thread %d: cp.async of %d bytes (4, 8 or 16)", i, bytes);
    if (src_bytes < 0 || src_bytes > bytes)
        kernel_error("thread %d: cp.async reads %d of its %d bytes", i, src_bytes, bytes);
    if (!L.smem_bytes || d < L.smem || d + bytes > L.smem + L.smem_bytes)
        kernel_error("thread %d: cp.async destination %p outside the launch's %zu bytes of "
                     "dynamic shared memory", i, dst, L.smem_bytes);
    if ((uintptr_t)dst % (uintptr_t)bytes || (src_bytes && (uintptr_t)src % (uintptr_t)bytes))
        kernel_error("thread %d: cp.async of %d bytes from %p to %p, not aligned to its size",
                     i, bytes, src, dst);
    if (L.async_early) {
        async_do(AsyncCopy{dst, src, bytes, src_bytes});
        return;
    }
    if (t->npend == ASYNC_MAX)
        kernel_error("thread %d: more than %d cp.async copies in flight", i, (int)ASYNC_MAX);
    g_async[(size_t)i * ASYNC_MAX + (size_t)t->npend++] = AsyncCopy{dst, src, bytes, src_bytes};
}

void tz_emu_cp_async_commit(void) {
    if (!L.in_kernel) die("cp.async.commit_group outside a kernel");
    Thread *t = &L.th[L.cur];
    if (t->ngroups == ASYNC_GROUPS)
        kernel_error("thread %d: more than %d cp.async groups in flight", L.cur,
                     (int)ASYNC_GROUPS);
    t->gend[t->ngroups++] = t->npend;
}

/* cp.async.wait_group n: every committed group but the newest n done */
void tz_emu_cp_async_wait(int n) {
    if (!L.in_kernel) die("cp.async.wait_group outside a kernel");
    Thread *t = &L.th[L.cur];
    const int k = t->ngroups - n;
    if (k <= 0) return;
    AsyncCopy *c = g_async + (size_t)L.cur * ASYNC_MAX;
    const int upto = t->gend[k - 1];
    for (int j = 0; j < upto; j++) async_do(c[j]);
    memmove(c, c + upto, (size_t)(t->npend - upto) * sizeof *c);
    t->npend -= upto;
    for (int g = k; g < t->ngroups; g++) t->gend[g - k] = t->gend[g] - upto;
    t->ngroups = n;
}

void tz_emu_shared_fresh(void *p, size_t bytes) {
    /* the static shared variables seen so far and the block that last filled each */
    static struct {
        void *p;
        uint64_t seq;
    } seen[64];
    static int nseen = 0;
    if (!L.in_kernel) return;
    int i = 0;
    while (i < nseen && seen[i].p != p) i++;
    if (i == nseen) {
        if (nseen == 64) return; /* more than any kernel here declares: left as they are */
        seen[nseen++].p = p;
    } else if (seen[i].seq == L.block_seq) return;
    seen[i].seq = L.block_seq;
    memset(p, 0xff, bytes);
}

/* TZ_CUDA_EMU_FAULT names this kernel (`name` as launched: "k", "k<T>", "k<4>"). */
static int fault_here(const char *name) {
    const char *f = env_of("TZ_CUDA_EMU_FAULT");
    if (!f) return 0;
    size_t n = strcspn(name, "<");
    while (n && name[n - 1] == ' ') n--;
    return strlen(f) == n && !strncmp(name, f, n);
}

cudaError_t tz_emu_launch_impl(const char *name, dim3 grid, dim3 block, size_t smem,
                               cudaStream_t s, void (*call)(const void *), const void *fn) {
    if (!tz_emu_stream_ok(s)) return fail(cudaErrorInvalidResourceHandle);
    if (sticky()) return fail(sticky());
    unsigned long long nt = (unsigned long long)block.x * block.y * block.z;
    if (!block.x || !block.y || !block.z || block.x > 1024 || block.y > 1024 || block.z > 64 ||
        nt > 1024) {
        tz_emu_note("kernel %s: block (%u,%u,%u) is not a valid block (at most 1024 threads; "
                    "x, y <= 1024, z <= 64)", name, block.x, block.y, block.z);
        return fail(cudaErrorInvalidConfiguration);
    }
    if (!grid.x || !grid.y || !grid.z || grid.x > 2147483647u || grid.y > 65535 ||
        grid.z > 65535) {
        tz_emu_note("kernel %s: grid (%u,%u,%u) is not a valid grid (x < 2^31, y, z <= 65535)",
                    name, grid.x, grid.y, grid.z);
        return fail(cudaErrorInvalidConfiguration);
    }
    if (smem > g_smem_limit) {
        tz_emu_note("kernel %s: %zu bytes of dynamic shared memory exceed the %zu a launch gets "
                    "without cudaFuncSetAttribute", name, smem, g_smem_limit);
        return fail(cudaErrorInvalidValue);
    }
    if (smem > smem_optin()) { /* (TZ_CUDA_EMU_SMEM_OPTIN below 48 KiB) */
        tz_emu_note("kernel %s: %zu bytes of dynamic shared memory exceed the device's %zu",
                    name, smem, smem_optin());
        return fail(cudaErrorInvalidValue);
    }
    if (pending()) return cudaSuccess; /* a lost context runs nothing more */
    if (fault_here(name)) { /* found by the next synchronising call, as a GPU's fault is */
        __atomic_store_n(&g_pending, (int)cudaErrorIllegalAddress, __ATOMIC_RELAXED);
        return cudaSuccess;
    }
    pthread_mutex_lock(&g_launch_mu);
    if (L.in_kernel) die("kernel %s launched from inside kernel %s", name, L.name);
    static int order = -1;
    if (order < 0) {
        const char *e = getenv("TZ_CUDA_EMU_ORDER");
        order = e && !strcmp(e, "reverse");
    }
    L.reverse = order;
    const char *ae = getenv("TZ_CUDA_EMU_ASYNC"); /* (read at each launch: tests switch it) */
    L.async_early = ae && !strcmp(ae, "early");
    L.name = name;
    L.call = call;
    L.fn = fn;
    L.n = (unsigned)nt;
    if (L.th_cap < L.n) {
        free(L.th);
        L.th = (Thread *)calloc(1024, sizeof *L.th);
        g_async = (AsyncCopy *)calloc((size_t)1024 * ASYNC_MAX, sizeof *g_async);
        if (!L.th || !g_async) die("out of host memory");
        L.th_cap = 1024;
    }
    if (smem && L.smem_bytes != smem) { /* its end against a guard page */
        static char *map = NULL;
        static size_t maplen = 0;
        if (map) munmap(map, maplen);
        L.smem = guarded_alloc(smem, 16, &map, &maplen);
        if (!L.smem) die("out of host memory for %zu bytes of shared memory", smem);
    }
    L.smem_bytes = smem;
    gridDim = grid;
    blockDim = block;
    install_fault_handler();
    threadIdx.x = threadIdx.y = threadIdx.z = 0; /* y, z stay 0 in 1-D blocks */
    L.in_kernel = 1;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                blockIdx.x = x, blockIdx.y = y, blockIdx.z = z;
                run_block();
            }
    L.in_kernel = 0;
    pthread_mutex_unlock(&g_launch_mu);
    return cudaSuccess;
}

/* ==== the runtime API ==== */

extern "C" {

const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
#define TZ_EMU_ERR(x)                                                                         \
    case x: return #x;
        TZ_EMU_ERR(cudaSuccess)
        TZ_EMU_ERR(cudaErrorInvalidValue)
        TZ_EMU_ERR(cudaErrorMemoryAllocation)
        TZ_EMU_ERR(cudaErrorInitializationError)
        TZ_EMU_ERR(cudaErrorInvalidConfiguration)
        TZ_EMU_ERR(cudaErrorInvalidPitchValue)
        TZ_EMU_ERR(cudaErrorInvalidSymbol)
        TZ_EMU_ERR(cudaErrorInvalidDevicePointer)
        TZ_EMU_ERR(cudaErrorInvalidMemcpyDirection)
        TZ_EMU_ERR(cudaErrorInsufficientDriver)
        TZ_EMU_ERR(cudaErrorNoDevice)
        TZ_EMU_ERR(cudaErrorInvalidDevice)
        TZ_EMU_ERR(cudaErrorInvalidResourceHandle)
        TZ_EMU_ERR(cudaErrorNotReady)
        TZ_EMU_ERR(cudaErrorIllegalAddress)
        TZ_EMU_ERR(cudaErrorHostMemoryAlreadyRegistered)
        TZ_EMU_ERR(cudaErrorHostMemoryNotRegistered)
        TZ_EMU_ERR(cudaErrorLaunchFailure)
        TZ_EMU_ERR(cudaErrorNotSupported)
        TZ_EMU_ERR(cudaErrorUnknown)
#undef TZ_EMU_ERR
    }
    return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidPitchValue: return "invalid pitch argument";
    case cudaErrorInvalidSymbol: return "invalid device symbol";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorInsufficientDriver:
        return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorHostMemoryAlreadyRegistered:
        return "part or all of the requested memory range is already mapped";
    case cudaErrorHostMemoryNotRegistered: return "pointer does not correspond to a registered "
                                                  "memory region";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorNotSupported: return "operation not supported";
    case cudaErrorUnknown: return "unknown error";
    }
    return "unknown error";
}

cudaError_t cudaGetLastError(void) {
    cudaError_t e = g_last;
    g_last = cudaSuccess;
    return e != cudaSuccess ? e : sticky();
}
cudaError_t cudaPeekAtLastError(void) { return g_last != cudaSuccess ? g_last : sticky(); }

cudaError_t cudaGetDeviceCount(int *n) {
    if (!n) return fail(cudaErrorInvalidValue);
    const char *drv = env_of("TZ_CUDA_EMU_DRIVER");
    if (drv && !strcmp(drv, "old")) {
        *n = 0;
        return fail(cudaErrorInsufficientDriver);
    }
    *n = device_count();
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
    if (d < 0 || d >= device_count()) return fail(cudaErrorInvalidDevice);
    g_device = d;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *d) {
    if (!d) return fail(cudaErrorInvalidValue);
    *d = g_device;
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d) {
    if (!p) return fail(cudaErrorInvalidValue);
    if (d < 0 || d >= device_count()) return fail(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    /* the name says what it is wherever the backend prints its device */
    snprintf(p->name, sizeof p->name, "CPU emulation of CUDA, not a GPU");
    p->totalGlobalMem = mem_total();
    p->sharedMemPerBlock = 48 * 1024;
    p->sharedMemPerBlockOptin = smem_optin();
    p->sharedMemPerMultiprocessor = smem_optin() + 1024; /* (an H100's 228 KiB by default) */
    p->totalConstMem = 64 * 1024;
    p->regsPerBlock = 65536;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647;
    p->maxGridSize[1] = p->maxGridSize[2] = 65535;
    p->major = 9; /* the architecture the backend is built for (sm_90) */
    p->minor = 0;
    p->multiProcessorCount = 1;
    p->maxThreadsPerMultiProcessor = 2048;
    p->pciBusID = d + 1;
    p->canMapHostMemory = 1;
    p->unifiedAddressing = 1;
    p->asyncEngineCount = 1;
    p->uuid[0] = (char)d;
    return cudaSuccess;
}
cudaError_t cudaDeviceGetPCIBusId(char *id, int len, int d) {
    if (!id || len <= 0) return fail(cudaErrorInvalidValue);
    if (d < 0 || d >= device_count()) return fail(cudaErrorInvalidDevice);
    snprintf(id, (size_t)len, "0000:%02x:00.0", d + 1); /* made up, one per emulated device */
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
    host_joins_all();
    return synced() ? fail(sticky()) : cudaSuccess;
}
cudaError_t cudaDeviceReset(void) { return cudaSuccess; }

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    pthread_mutex_lock(&g_mem_mu);
    size_t used = g_used;
    pthread_mutex_unlock(&g_mem_mu);
    if (free_bytes) *free_bytes = mem_total() - used;
    if (total_bytes) *total_bytes = mem_total();
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t bytes) {
    if (!p) return fail(cudaErrorInvalidValue);
    *p = NULL;
    if (!bytes) return cudaSuccess;
    pthread_mutex_lock(&g_mem_mu);
    if (bytes > mem_total() - g_used) {
        pthread_mutex_unlock(&g_mem_mu);
        return fail(cudaErrorMemoryAllocation);
    }
    char *map = NULL;
    size_t maplen = 0;
    char *m = guarded_alloc(bytes, 256, &map, &maplen);
    if (!m) {
        pthread_mutex_unlock(&g_mem_mu);
        return fail(cudaErrorMemoryAllocation);
    }
    memset(m, 0xff, bytes); /* NaN bytes: uninitialised reads show */
    add_alloc(m, bytes, MEM_DEVICE, map, maplen);
    g_used += bytes;
    pthread_mutex_unlock(&g_mem_mu);
    *p = m;
    return cudaSuccess;
}
cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t s) {
    if (!tz_emu_stream_ok(s)) return fail(cudaErrorInvalidResourceHandle);
    return cudaMalloc(p, bytes);
}

cudaError_t cudaFree(void *p) {
    if (!p) return cudaSuccess;
    pthread_mutex_lock(&g_mem_mu);
    Alloc *a = holding(p);
    if (!a || a->kind != MEM_DEVICE || a->base != (char *)p) {
        pthread_mutex_unlock(&g_mem_mu);
        tz_emu_note("cudaFree(%p): not the start of a live device allocation", p);
        return fail(cudaErrorInvalidValue);
    }
    g_used -= a->size;
    char *map = a->map;
    size_t maplen = a->maplen;
    remove_alloc(a);
    pthread_mutex_unlock(&g_mem_mu);
    munmap(map, maplen); /* a kernel using it after the free faults */
    host_joins_all();    /* cudaFree waits for the device */
    return cudaSuccess;
}
cudaError_t cudaFreeAsync(void *p, cudaStream_t s) {
    if (!tz_emu_stream_ok(s)) return fail(cudaErrorInvalidResourceHandle);
    return cudaFree(p);
}

cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags) {
    if (!p) return fail(cudaErrorInvalidValue);
    (void)flags;
    *p = NULL;
    if (!bytes) return cudaSuccess;
    char *m = (char *)aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    if (!m) return fail(cudaErrorMemoryAllocation);
    memset(m, 0xff, bytes);
    pthread_mutex_lock(&g_mem_mu);
    add_alloc(m, bytes, MEM_PINNED);
    pthread_mutex_unlock(&g_mem_mu);
    *p = m;
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t bytes) { return cudaHostAlloc(p, bytes, 0); }
cudaError_t cudaFreeHost(void *p) {
    if (!p) return cudaSuccess;
    pthread_mutex_lock(&g_mem_mu);
    Alloc *a = holding(p);
    if (!a || a->kind != MEM_PINNED || a->base != (char *)p) {
        pthread_mutex_unlock(&g_mem_mu);
        tz_emu_note("cudaFreeHost(%p): not the start of a cudaMallocHost/cudaHostAlloc block",
                    p);
        return fail(cudaErrorInvalidValue);
    }
    remove_alloc(a);
    pthread_mutex_unlock(&g_mem_mu);
    free(p);
    return cudaSuccess;
}

cudaError_t cudaHostRegister(void *p, size_t bytes, unsigned flags) {
    (void)flags;
    if (!p || !bytes) return fail(cudaErrorInvalidValue);
    const char *lim = env_of("TZ_CUDA_EMU_REGISTER_MB");
    pthread_mutex_lock(&g_mem_mu);
    if (lim && g_registered + bytes > ((size_t)atoll(lim) << 20)) {
        pthread_mutex_unlock(&g_mem_mu);
        return fail(cudaErrorMemoryAllocation); /* as under a low locked-memory limit */
    }
    size_t i = upper((char *)p + bytes - 1); /* any allocation starting before the end */
    cudaError_t e = cudaSuccess;
    if (i) {
        Alloc *a = &g_alloc[i - 1];
        if (a->base + a->size > (char *)p)
            e = a->kind == MEM_DEVICE ? cudaErrorInvalidValue
                                      : cudaErrorHostMemoryAlreadyRegistered;
    }
    if (e == cudaSuccess) add_alloc((char *)p, bytes, MEM_REGISTERED), g_registered += bytes;
    pthread_mutex_unlock(&g_mem_mu);
    if (e != cudaSuccess) {
        tz_emu_note("cudaHostRegister(%p, %zu): overlaps %s", p, bytes,
                    e == cudaErrorInvalidValue ? "device memory" : "pinned or registered memory");
        return fail(e);
    }
    return cudaSuccess;
}
cudaError_t cudaHostUnregister(void *p) {
    pthread_mutex_lock(&g_mem_mu);
    Alloc *a = p ? holding(p) : NULL;
    cudaError_t e = cudaSuccess;
    if (!a || a->kind != MEM_REGISTERED || a->base != (char *)p)
        e = cudaErrorHostMemoryNotRegistered;
    else g_registered -= a->size, remove_alloc(a);
    pthread_mutex_unlock(&g_mem_mu);
    return e == cudaSuccess ? e : fail(e);
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *at, const void *p) {
    if (!at) return fail(cudaErrorInvalidValue);
    pthread_mutex_lock(&g_mem_mu);
    Alloc *a = p ? holding(p) : NULL;
    int kind = a ? a->kind : -1;
    pthread_mutex_unlock(&g_mem_mu);
    memset(at, 0, sizeof *at);
    at->device = kind == MEM_DEVICE ? g_device : -1;
    at->type = kind == MEM_DEVICE ? cudaMemoryTypeDevice
               : kind >= 0        ? cudaMemoryTypeHost
                                  : cudaMemoryTypeUnregistered;
    if (kind == MEM_DEVICE) at->devicePointer = (void *)p;
    else if (kind >= 0) at->hostPointer = at->devicePointer = (void *)p;
    else at->hostPointer = (void *)p;
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind k) {
    cudaError_t e = do_copy("cudaMemcpy", dst, bytes, src, bytes, bytes, 1, k, 0);
    host_joins_stream(0); /* returns once the copy is done */
    return e == cudaSuccess && synced() ? fail(sticky()) : e;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind k,
                            cudaStream_t s) {
    return do_copy("cudaMemcpyAsync", dst, bytes, src, bytes, bytes, 1, k, s);
}
cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                         size_t height, enum cudaMemcpyKind k) {
    cudaError_t e = do_copy("cudaMemcpy2D", dst, dpitch, src, spitch, width, height, k, 0);
    host_joins_stream(0);
    return e == cudaSuccess && synced() ? fail(sticky()) : e;
}
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, enum cudaMemcpyKind k,
                              cudaStream_t s) {
    return do_copy("cudaMemcpy2DAsync", dst, dpitch, src, spitch, width, height, k, s);
}

/* A kernel on stream s is about to read [p, p + bytes): checked against other streams' copies
 * into those bytes as a copy's source is (kernels do not say what they read; the backend
 * declares the reads it wants checked: TZ_CUDA_KERNEL_READS). */
cudaError_t tz_emu_kernel_reads(cudaStream_t s, const void *p, size_t bytes, const char *kernel) {
    const cudaError_t e = order_access(kernel, s, NULL, 0, p, bytes, 1);
    return e == cudaSuccess ? e : fail(e);
}

cudaError_t tz_emu_kernel_writes(cudaStream_t s, void *p, size_t bytes, const char *kernel) {
    const cudaError_t e = order_access(kernel, s, p, bytes, NULL, 0);
    return e == cudaSuccess ? e : fail(e);
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t s) {
    if (!tz_emu_stream_ok(s)) return fail(cudaErrorInvalidResourceHandle);
    if (sticky()) return fail(sticky());
    if (!bytes) return cudaSuccess;
    pthread_mutex_lock(&g_mem_mu);
    int st = dev_state(p, bytes);
    pthread_mutex_unlock(&g_mem_mu);
    if (st != 1) {
        tz_emu_note("cudaMemset(%p, %zu bytes): %s", p, bytes,
                    st ? "runs past the end of its device allocation" : "not device memory");
        return fail(cudaErrorInvalidValue);
    }
    cudaError_t e = order_access("cudaMemsetAsync", s, p, bytes, NULL, 0);
    if (e != cudaSuccess) return fail(e);
    memset(p, v, bytes);
    return cudaSuccess;
}
cudaError_t cudaMemset(void *p, int v, size_t bytes) { return cudaMemsetAsync(p, v, bytes, 0); }

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned flags, int priority) {
    (void)priority;
    if (!s) return fail(cudaErrorInvalidValue);
    tz_emu_stream *st = (tz_emu_stream *)calloc(1, sizeof *st);
    if (!st) return fail(cudaErrorMemoryAllocation);
    st->flags = flags;
    pthread_mutex_lock(&g_handle_mu);
    g_streams.add(st);
    pthread_mutex_unlock(&g_handle_mu);
    pthread_mutex_lock(&g_order_mu);
    for (int i = 1; i < MAX_SIDS && !st->sid; i++)
        if (!(g_sid_used >> i & 1)) {
            st->sid = i;
            g_sid_used |= 1ull << i;
            Clock &c = g_stream_clock[i]; /* after what the host has seen; its own count goes on */
            const uint64_t own = c.t[i];
            c = g_host_clock;
            if (own > c.t[i]) c.t[i] = own;
        }
    pthread_mutex_unlock(&g_order_mu);
    *s = st;
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    return cudaStreamCreateWithPriority(s, flags, 0);
}
cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithPriority(s, 0, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    pthread_mutex_lock(&g_handle_mu);
    int ok = s && g_streams.drop(s);
    pthread_mutex_unlock(&g_handle_mu);
    if (!ok) return fail(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&g_order_mu);
    if (s->sid) g_sid_used &= ~(1ull << s->sid);
    pthread_mutex_unlock(&g_order_mu);
    free(s);
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    if (!tz_emu_stream_ok(s)) return fail(cudaErrorInvalidResourceHandle);
    host_joins_stream(s);
    return synced() ? fail(sticky()) : cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t s) { return cudaStreamSynchronize(s); }

static int event_ok(cudaEvent_t e) {
    pthread_mutex_lock(&g_handle_mu);
    int ok = e && g_events.has(e);
    pthread_mutex_unlock(&g_handle_mu);
    return ok;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
    (void)flags;
    if (!tz_emu_stream_ok(s) || !event_ok(e)) return fail(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&g_order_mu);
    if (e->recorded) g_stream_clock[sid_of(s)].join(e->at);
    pthread_mutex_unlock(&g_order_mu);
    return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
    if (!e) return fail(cudaErrorInvalidValue);
    tz_emu_event *ev = (tz_emu_event *)calloc(1, sizeof *ev);
    if (!ev) return fail(cudaErrorMemoryAllocation);
    ev->flags = flags;
    pthread_mutex_lock(&g_handle_mu);
    g_events.add(ev);
    pthread_mutex_unlock(&g_handle_mu);
    *e = ev;
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    if (!event_ok(e) || !tz_emu_stream_ok(s)) return fail(cudaErrorInvalidResourceHandle);
    e->recorded = 1;
    e->t_ms = now_ms();
    pthread_mutex_lock(&g_order_mu);
    Clock &c = g_stream_clock[sid_of(s)];
    c.join(g_host_clock);
    e->at = c;
    pthread_mutex_unlock(&g_order_mu);
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    if (!event_ok(e)) return fail(cudaErrorInvalidResourceHandle);
    if (e->recorded) host_joins(e->at);
    return synced() ? fail(sticky()) : cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) { return cudaEventSynchronize(e); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    pthread_mutex_lock(&g_handle_mu);
    int ok = e && g_events.drop(e);
    pthread_mutex_unlock(&g_handle_mu);
    if (!ok) return fail(cudaErrorInvalidResourceHandle);
    free(e);
    return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    if (!ms) return fail(cudaErrorInvalidValue);
    if (!event_ok(a) || !event_ok(b)) return fail(cudaErrorInvalidResourceHandle);
    if ((a->flags | b->flags) & cudaEventDisableTiming) return fail(cudaErrorInvalidResourceHandle);
    if (!a->recorded || !b->recorded) return fail(cudaErrorInvalidResourceHandle);
    *ms = (float)(b->t_ms - a->t_ms);
    return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void *f, enum cudaFuncAttribute a, int v) {
    if (!f) return fail(cudaErrorInvalidValue);
    if (a == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (v < 0 || (size_t)v > smem_optin()) return fail(cudaErrorInvalidValue);
        /* one limit for all kernels here (launches do not say which function they run) */
        if ((size_t)v > g_smem_limit) g_smem_limit = (size_t)v;
    }
    return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *user) {
    if (!tz_emu_stream_ok(s)) return fail(cudaErrorInvalidResourceHandle);
    if (!fn) return fail(cudaErrorInvalidValue);
    fn(user); /* the stream's earlier work is done: everything runs at once */
    return cudaSuccess;
}

cudaError_t cudaHostGetDevicePointer(void **dev, void *host, unsigned flags) {
    (void)flags;
    if (!dev) return fail(cudaErrorInvalidValue);
    pthread_mutex_lock(&g_mem_mu);
    Alloc *a = host ? holding(host) : NULL;
    int ok = a && a->kind != MEM_DEVICE;
    pthread_mutex_unlock(&g_mem_mu);
    if (!ok) return fail(cudaErrorInvalidValue); /* only pinned or registered memory maps */
    *dev = host;
    return cudaSuccess;
}

cudaError_t cudaSetDeviceFlags(unsigned flags) {
    (void)flags;
    return cudaSuccess;
}

cudaError_t cudaStreamGetFlags(cudaStream_t s, unsigned *flags) {
    if (!flags) return fail(cudaErrorInvalidValue);
    if (!tz_emu_stream_ok(s)) return fail(cudaErrorInvalidResourceHandle);
    *flags = s && s != cudaStreamLegacy && s != cudaStreamPerThread ? s->flags : 0;
    return cudaSuccess;
}

} // extern "C"
