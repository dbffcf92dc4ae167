/* The CPU backend: the choice of kernel from the CPU's features, the table (each op family file
 * installs its ops), host memory, threads, GEMM workspaces. The ops live in the family files. */
#define _GNU_SOURCE /* sysconf's _SC_AVPHYS_PAGES */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/backend.h"
#include "core/error.h"
#include "cpu/cpu_backend.h"
#include "cpu/cpu_internal.h"

static tz_cpu_ctx *ctx_of(tz_backend *be) { return (tz_cpu_ctx *)be->ctx; }

int tz_cpu_threads(tz_backend *be) {
    int t = ctx_of(be)->threads;
    return t > 0 ? t : omp_get_max_threads();
}

void *tz_cpu_aligned_alloc(size_t bytes) {
    size_t rounded = (bytes + 63) & ~(size_t)63;
    if (rounded == 0) rounded = 64;
    void *p = aligned_alloc(64, rounded);
    if (!p) TZ_FATAL("out of host memory: cannot allocate %zu bytes", bytes);
    return p;
}

void tz_cpu_ws_reserve(tz_backend *be, int nthreads) {
    tz_cpu_ctx *c = ctx_of(be);
    if (nthreads <= c->nws) return;
    c->ws = tz_xrealloc(c->ws, (size_t)nthreads * sizeof(*c->ws));
    for (int i = c->nws; i < nthreads; i++) {
        c->ws[i].buf = NULL;
        c->ws[i].cap = 0;
    }
    c->nws = nthreads;
}

float *tz_cpu_ws_get(tz_backend *be, int tid, size_t floats) {
    tz_cpu_ws *w = &ctx_of(be)->ws[tid];
    if (w->cap < floats) {
        free(w->buf);
        w->buf = tz_cpu_aligned_alloc(floats * sizeof(float));
        w->cap = floats;
    }
    return w->buf;
}

/* ---- memory ---- */

/* Each block carries its size in a 64-byte header (the user pointer stays 64-aligned), so
 * release can keep live_bytes. */
#define TZ_CPU_HDR 64
static void *cpu_alloc(tz_backend *be, size_t bytes) {
    char *p = tz_cpu_aligned_alloc(bytes + TZ_CPU_HDR);
    memset(p + TZ_CPU_HDR, 0, bytes);
    memcpy(p, &bytes, sizeof bytes);
    be->live_bytes += bytes;
    if (be->live_bytes > be->peak_bytes) be->peak_bytes = be->live_bytes;
    return p + TZ_CPU_HDR;
}

static void cpu_release(tz_backend *be, void *p) {
    if (!p) return;
    char *h = (char *)p - TZ_CPU_HDR;
    size_t bytes;
    memcpy(&bytes, h, sizeof bytes);
    be->live_bytes -= bytes;
    free(h);
}

static void cpu_memcpy(tz_backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes) memcpy(dst, src, bytes);
}

static void cpu_sync(tz_backend *be) {}

/* ---- the offload's memory, copies and events: host memory, done at once ---- */

static void *cpu_host_alloc(tz_backend *be, size_t bytes) {
    void *p = tz_cpu_aligned_alloc(bytes);
    memset(p, 0, bytes);
    return p;
}

static void cpu_host_free(tz_backend *be, void *p) { free(p); }

static void cpu_host_register(tz_backend *be, void *p, size_t bytes) {}

static void cpu_host_unregister(tz_backend *be, void *p) {}

/* every queue is the caller: an event is done when marked (a non-NULL token) */
static void *cpu_event_mark(tz_backend *be, int queue) { return be; }

static void cpu_event_wait(tz_backend *be, void *ev, int queue) {}

static int cpu_event_done(tz_backend *be, void *ev) { return 1; }

static void cpu_event_free(tz_backend *be, void *ev) {}

static void cpu_device_info(tz_backend *be, tz_device_info *out) {
    memset(out, 0, sizeof *out);
    out->ordinal = -1;
    snprintf(out->name, sizeof out->name, "host CPU (%s kernel)", tz_cpu_kernel_name());
    /* the host's RAM: free pages (not counting the page cache) and all pages */
    long page = sysconf(_SC_PAGESIZE), av = sysconf(_SC_AVPHYS_PAGES), all = sysconf(_SC_PHYS_PAGES);
    out->free_bytes = page > 0 && av > 0 ? (size_t)av * (size_t)page : 0;
    out->total_bytes = page > 0 && all > 0 ? (size_t)all * (size_t)page : 0;
}

static void install_memory(tz_backend *be) {
    be->host_alloc = cpu_host_alloc;
    be->host_free = cpu_host_free;
    be->host_register = cpu_host_register;
    be->host_unregister = cpu_host_unregister;
    be->download_async = cpu_memcpy;
    be->upload_async = cpu_memcpy;
    be->event_mark = cpu_event_mark;
    be->event_wait = cpu_event_wait;
    be->event_done = cpu_event_done;
    be->event_free = cpu_event_free;
    be->device_info = cpu_device_info;
    be->alloc = cpu_alloc;
    be->release = cpu_release;
    be->upload = cpu_memcpy;
    be->download = cpu_memcpy;
    be->copy = cpu_memcpy;
    be->sync = cpu_sync;
}

/* ---- kernels: which build of the family files this CPU runs ---- */

/* What each x86 kernel needs. GCC names the levels its flags target (-march=x86-64-v3/v4);
 * Clang tests features only, and AVX2 + FMA + BMI1/2 (AVX-512 F/VL/BW/DQ/CD) are the ones of
 * each level that a compiled loop can use (every CPU with them has the rest: F16C, LZCNT,
 * MOVBE). The checks include the operating system's support of the wide registers. */
#if defined(TZ_CPU_HAVE_AVX2) || defined(TZ_CPU_HAVE_AVX512)
#if !defined(__x86_64__) || !defined(__GNUC__)
#error "the avx2 and avx512 CPU kernels are x86-64 builds for GCC or Clang"
#endif
static int cpu_has_avx2(void) {
    __builtin_cpu_init();
#if !defined(__clang__) && __GNUC__ >= 12
    return __builtin_cpu_supports("x86-64-v3") != 0;
#else
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2");
#endif
}
#endif

#ifdef TZ_CPU_HAVE_AVX512
static int cpu_has_avx512(void) {
    __builtin_cpu_init();
#if !defined(__clang__) && __GNUC__ >= 12
    return __builtin_cpu_supports("x86-64-v4") != 0;
#else
    return cpu_has_avx2() && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512cd");
#endif
}
#endif

/* portable: the compiler's baseline; native: built for the machine that compiled it */
static int cpu_has_baseline(void) { return 1; }

/* install_<kernel>(be): every family's install function of that kernel's build */
#define CALL_INSTALL(family, kernel) tz_cpu_install_##family##_##kernel(be);
#define KERNEL_INSTALL(kernel)                                         \
    TZ_CPU_FAMILIES(TZ_CPU_DECLARE_INSTALL, kernel)                    \
    static void install_##kernel(tz_backend *be) {                     \
        TZ_CPU_FAMILIES(CALL_INSTALL, kernel)                          \
    }
#ifdef TZ_CPU_HAVE_NATIVE
KERNEL_INSTALL(native)
#endif
#ifdef TZ_CPU_HAVE_AVX512
KERNEL_INSTALL(avx512)
#endif
#ifdef TZ_CPU_HAVE_AVX2
KERNEL_INSTALL(avx2)
#endif
#ifdef TZ_CPU_HAVE_PORTABLE
KERNEL_INSTALL(portable)
#endif

typedef struct cpu_kernel {
    const char *name;
    const char *needs;         /* what the CPU must have, for messages */
    int (*usable)(void);       /* 1: this CPU can run it */
    void (*install)(tz_backend *be);
} cpu_kernel;

/* The kernels built into this binary, the fastest first (CMake's TZ_CPU_HAVE_<kernel>). */
static const cpu_kernel k_kernels[] = {
#ifdef TZ_CPU_HAVE_NATIVE
    {"native", "the instruction set of the build machine", cpu_has_baseline, install_native},
#endif
#ifdef TZ_CPU_HAVE_AVX512
    {"avx512", "x86-64-v4: AVX-512 F, VL, BW, DQ, CD besides AVX2 and FMA", cpu_has_avx512,
     install_avx512},
#endif
#ifdef TZ_CPU_HAVE_AVX2
    {"avx2", "x86-64-v3: AVX2, FMA, BMI2", cpu_has_avx2, install_avx2},
#endif
#ifdef TZ_CPU_HAVE_PORTABLE
    {"portable", "nothing beyond the compiler's baseline", cpu_has_baseline, install_portable},
#endif
};
#define NKERNELS ((int)(sizeof k_kernels / sizeof k_kernels[0]))

static const cpu_kernel *kernel_find(const char *name) {
    for (int i = 0; i < NKERNELS; i++)
        if (!strcmp(k_kernels[i].name, name)) return &k_kernels[i];
    return NULL;
}

/* TZ_CPU_KERNEL when set (and not "auto"), else the fastest kernel this CPU runs. */
static const cpu_kernel *kernel_pick(void) {
    const char *want = getenv("TZ_CPU_KERNEL");
    if (want && *want && strcmp(want, "auto")) {
        const cpu_kernel *k = kernel_find(want);
        if (!k) {
            char built[128] = "";
            for (int i = 0; i < NKERNELS; i++)
                snprintf(built + strlen(built), sizeof built - strlen(built), "%s%s",
                         i ? ", " : "", k_kernels[i].name);
            TZ_FATAL_HINT("unset TZ_CPU_KERNEL (or set it to auto) to let the CPU choose",
                          "TZ_CPU_KERNEL=%s: no such CPU kernel in this build (built: %s)", want,
                          built);
        }
        if (!k->usable())
            TZ_FATAL_HINT("unset TZ_CPU_KERNEL (or set it to auto) to let the CPU choose",
                          "TZ_CPU_KERNEL=%s: this CPU cannot run it (it needs %s)", want,
                          k->needs);
        return k;
    }
    for (int i = 0; i < NKERNELS; i++)
        if (k_kernels[i].usable()) return &k_kernels[i];
    TZ_FATAL("no CPU kernel of this build runs on this CPU"); /* portable always does */
}

const char *tz_cpu_kernel_name(void) { return kernel_pick()->name; }

int tz_cpu_kernel_usable(const char *name) {
    const cpu_kernel *k = kernel_find(name);
    return k && k->usable();
}

/* ---- the table ---- */

tz_backend *tz_cpu_backend_create(int threads) {
    tz_backend *be = tz_xcalloc(1, sizeof(*be));
    tz_cpu_ctx *c = tz_xcalloc(1, sizeof(*c));
    c->threads = threads > 0 ? threads : 0;
    be->name = "cpu";
    be->device = 0;
    be->matmul_dtypes = 1u << TZ_DT_F32; /* matmul_dtype stays TZ_DT_F32 */
    be->ctx = c;
    tz_cpu_ws_reserve(be, tz_cpu_threads(be));
    be->destroy = tz_cpu_backend_destroy;
    install_memory(be);
    kernel_pick()->install(be);
    tz_backend_check(be);
    return be;
}

void tz_cpu_backend_destroy(tz_backend *be) {
    if (!be) return;
    tz_cpu_ctx *c = ctx_of(be);
    for (int i = 0; i < c->nws; i++) free(c->ws[i].buf);
    free(c->ws);
    free(c);
    free(be);
}
