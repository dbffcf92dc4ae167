/* Shared by the quantized-model tests (test_tq_model.c, test_dit_quant.c): a counting
 * wrapper around the CPU backend's memory (live bytes and allocations, to show that no dense
 * copy of a quantized weight is ever allocated), the arena's 64-byte rounding, a relative
 * max error, and a quantized weight's dequantization (plain basis) on the host. */
#ifndef TZ_TQ_TEST_H
#define TZ_TQ_TEST_H
#include <math.h>
#include <string.h>

#include "core/backend.h"
#include "model/params.h"
#include "quant/turboquant.h"

static void *(*g_alloc)(tz_backend *, size_t);
static void (*g_release)(tz_backend *, void *);
#define MAX_LIVE 4096
static void *g_ptr[MAX_LIVE];
static size_t g_size[MAX_LIVE];
static size_t g_live, g_allocs;

static inline void *count_alloc(tz_backend *be, size_t bytes) {
    void *p = g_alloc(be, bytes);
    for (int i = 0; i < MAX_LIVE; i++)
        if (!g_ptr[i]) {
            g_ptr[i] = p, g_size[i] = bytes;
            break;
        }
    g_live += bytes;
    g_allocs++;
    return p;
}

static inline void count_release(tz_backend *be, void *p) {
    for (int i = 0; i < MAX_LIVE; i++)
        if (g_ptr[i] == p) {
            g_live -= g_size[i];
            g_ptr[i] = NULL;
            break;
        }
    g_release(be, p);
}

/* Routes be's alloc / release through the counters (undo: count_stop). */
static inline void count_start(tz_backend *be) {
    g_alloc = be->alloc, g_release = be->release;
    be->alloc = count_alloc, be->release = count_release;
}
static inline void count_stop(tz_backend *be) { be->alloc = g_alloc, be->release = g_release; }

static inline size_t round64(size_t b) { return (b + 63) & ~(size_t)63; }

static inline double maxrel(const float *a, const float *b, int64_t n) {
    double e = 0.0, s = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= e)) e = d;
        if (fabs((double)b[i]) > s) s = fabs((double)b[i]);
    }
    return e / (s > 0 ? s : 1e-30);
}

/* out[numel] = the weight p's quantized storage holds (CPU backend: host memory). */
static inline void dequantize_param(const tz_param *p, float *out) {
    char err[200];
    tz_tq_codebook cb;
    memset(&cb, 0, sizeof cb);
    if (p->q->method == TZ_TQ_TURBOQUANT) tz_tq_codebook_init(&cb, p->q->bits, err, sizeof err);
    tz_tq_tensor t;
    tz_tq_tensor_init(&t, p->q->bits, p->q->group, p->shape[0], p->shape[1], p->q->seed, err,
                      sizeof err);
    memcpy(t.codes, p->q->codes, (size_t)tz_tq_codes_bytes(t.rows, t.cols, t.bits));
    memcpy(t.scales, p->q->scales, (size_t)tz_tq_scales_count(t.rows, t.cols, t.group) * 2);
    tz_tq_dequantize_as(&t, p->q->method, &cb, out);
    tz_tq_tensor_free(&t);
}

/* Bytes of codes + scales + levels of a quantized [rows, cols] weight. */
static inline size_t quant_bytes(const tz_param *p) {
    return (size_t)tz_tq_codes_bytes(p->shape[0], p->shape[1], p->q->bits) +
           (size_t)tz_tq_scales_count(p->shape[0], p->shape[1], p->q->group) * 2 +
           ((size_t)1 << p->q->bits) * 4;
}

#endif
