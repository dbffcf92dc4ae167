/* The CPU backend: the table (each op family file installs its ops), host memory, threads and
 * per-thread GEMM workspaces, create/destroy. The ops themselves live in the family files. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/error.h"
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

static void *cpu_alloc(tz_backend *be, size_t bytes) {
    void *p = tz_cpu_aligned_alloc(bytes);
    memset(p, 0, bytes);
    return p;
}

static void cpu_release(tz_backend *be, void *p) { free(p); }

static void cpu_memcpy(tz_backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes) memcpy(dst, src, bytes);
}

static void cpu_sync(tz_backend *be) {}

static void install_memory(tz_backend *be) {
    be->alloc = cpu_alloc;
    be->release = cpu_release;
    be->upload = cpu_memcpy;
    be->download = cpu_memcpy;
    be->copy = cpu_memcpy;
    be->sync = cpu_sync;
}

/* ---- the table ---- */

tz_backend *tz_cpu_backend_create(int threads) {
    tz_backend *be = tz_xcalloc(1, sizeof(*be));
    tz_cpu_ctx *c = tz_xcalloc(1, sizeof(*c));
    c->threads = threads > 0 ? threads : 0;
    be->name = "cpu";
    be->device = 0;
    be->ctx = c;
    tz_cpu_ws_reserve(be, tz_cpu_threads(be));
    install_memory(be);
    tz_cpu_install_elementwise(be);
    tz_cpu_install_norm(be);
    tz_cpu_install_activation(be);
    tz_cpu_install_attention(be);
    tz_cpu_install_matmul(be);
    tz_cpu_install_loss(be);
    tz_cpu_install_layout(be);
    tz_cpu_install_quant(be);
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
