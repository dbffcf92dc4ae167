/* The CPU backend table: create/destroy, host memory ops, elementwise ops, reductions and
 * the fused softmax cross-entropy. Matmul, norms, rope and attention live in sibling files. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/error.h"
#include "cpu/cpu_internal.h"

/* Below this many elements an elementwise op runs on the calling thread only. */
#define TZ_CPU_PAR_MIN 32768
/* sumsq: fixed chunk, so the partial sums (and their order) do not depend on threads. */
#define TZ_CPU_SUMSQ_CHUNK 16384

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

/* ---- elementwise and reductions ---- */

static void cpu_fill(tz_backend *be, float *x, float v, int64_t n) {
    int nt = tz_cpu_threads(be);
#pragma omp parallel for simd schedule(static) num_threads(nt) if (n >= TZ_CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) x[i] = v;
}

static void cpu_scale(tz_backend *be, float *x, float a, int64_t n) {
    int nt = tz_cpu_threads(be);
#pragma omp parallel for simd schedule(static) num_threads(nt) if (n >= TZ_CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) x[i] *= a;
}

static void cpu_axpy(tz_backend *be, float *y, float a, const float *x, int64_t n) {
    int nt = tz_cpu_threads(be);
#pragma omp parallel for simd schedule(static) num_threads(nt) if (n >= TZ_CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

static double sumsq_chunk(const float *x, int64_t n) {
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; i++) s += (double)x[i] * (double)x[i];
    return s;
}

static double cpu_sumsq(tz_backend *be, const float *x, int64_t n) {
    if (n <= 0) return 0.0;
    int64_t nch = (n + TZ_CPU_SUMSQ_CHUNK - 1) / TZ_CPU_SUMSQ_CHUNK;
    if (nch == 1) return sumsq_chunk(x, n);
    double *part = tz_xmalloc((size_t)nch * sizeof(double));
    int nt = tz_cpu_threads(be);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t c = 0; c < nch; c++) {
        int64_t lo = c * TZ_CPU_SUMSQ_CHUNK;
        int64_t len = n - lo < TZ_CPU_SUMSQ_CHUNK ? n - lo : TZ_CPU_SUMSQ_CHUNK;
        part[c] = sumsq_chunk(x + lo, len);
    }
    double s = 0.0;
    for (int64_t c = 0; c < nch; c++) s += part[c];
    free(part);
    return s;
}

/* ---- cross-entropy fused with softmax ---- */

/* log-sum-exp of one row: max in float, sum of exponentials in double. */
static float row_lse(const float *l, int64_t V) {
    float m = tz_cpu_maxf(l, V);
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < V; j++) s += (double)tz_cpu_expf(l[j] - m);
    return m + (float)log(s);
}

static void cpu_xent_fwd(tz_backend *be, float *loss, const float *logits, const int32_t *target,
                         int64_t n, int64_t V) {
    int nt = tz_cpu_threads(be);
#pragma omp parallel for schedule(static) num_threads(nt) if (n * V >= TZ_CPU_PAR_MIN)
    for (int64_t r = 0; r < n; r++) {
        int32_t t = target[r];
        if (t < 0) {
            loss[r] = 0.0f;
            continue;
        }
        const float *l = logits + r * V;
        loss[r] = row_lse(l, V) - l[t];
    }
}

/* dlogits may alias logits: each element is read before it is written, and the row's
 * log-sum-exp is computed before the first write. */
static void cpu_xent_bwd(tz_backend *be, float *dlogits, const float *logits,
                         const int32_t *target, float dloss, int64_t n, int64_t V) {
    int nt = tz_cpu_threads(be);
#pragma omp parallel for schedule(static) num_threads(nt) if (n * V >= TZ_CPU_PAR_MIN)
    for (int64_t r = 0; r < n; r++) {
        int32_t t = target[r];
        const float *l = logits + r * V;
        float *d = dlogits + r * V;
        if (t < 0) {
            for (int64_t j = 0; j < V; j++) d[j] = 0.0f;
            continue;
        }
        float lse = row_lse(l, V), lt = l[t];
        /* d and l may be one array: each iteration reads its element before writing it */
#pragma omp simd
        for (int64_t j = 0; j < V; j++) d[j] = dloss * tz_cpu_expf(l[j] - lse);
        d[t] = dloss * (tz_cpu_expf(lt - lse) - 1.0f);
    }
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

    be->alloc = cpu_alloc;
    be->release = cpu_release;
    be->upload = cpu_memcpy;
    be->download = cpu_memcpy;
    be->copy = cpu_memcpy;
    be->sync = cpu_sync;

    be->fill = cpu_fill;
    be->scale = cpu_scale;
    be->axpy = cpu_axpy;
    be->sumsq = cpu_sumsq;

    be->matmul = tz_cpu_matmul;
    be->embedding_fwd = tz_cpu_embedding_fwd;
    be->embedding_bwd = tz_cpu_embedding_bwd;
    be->rmsnorm_fwd = tz_cpu_rmsnorm_fwd;
    be->rmsnorm_bwd = tz_cpu_rmsnorm_bwd;
    be->rope_fwd = tz_cpu_rope_fwd;
    be->rope_bwd = tz_cpu_rope_bwd;
    be->attention_fwd = tz_cpu_attention_fwd;
    be->attention_bwd = tz_cpu_attention_bwd;
    be->swiglu_fwd = tz_cpu_swiglu_fwd;
    be->swiglu_bwd = tz_cpu_swiglu_bwd;
    be->xent_fwd = cpu_xent_fwd;
    be->xent_bwd = cpu_xent_bwd;
    tz_cpu_dit_ops_install(be);
    be->tq_rotate = tz_cpu_tq_rotate;
    be->tq_rotate_bwd = tz_cpu_tq_rotate_bwd;
    be->tq_dequant = tz_cpu_tq_dequant;
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
