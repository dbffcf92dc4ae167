/* Shared by the op tests: fp64 reference helpers (random buffers, relative errors, central
 * differences) and the ok/FAIL line of one comparison. Test code only. */
#ifndef TZ_OPTEST_H
#define TZ_OPTEST_H
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/rng.h"
#include "tz_check.h"

static tz_rng g_rng;
static tz_backend *g_be;

/* ctest runs the op tests once per CPU kernel built in, naming it in TZ_CPU_KERNEL: skip (77)
 * where this CPU cannot run it; say which kernel runs. Call before creating the backend. */
static inline void tz_optest_kernel(void) {
    const char *k = getenv("TZ_CPU_KERNEL");
    if (k && *k && strcmp(k, "auto") && !tz_cpu_kernel_usable(k)) {
        printf("skip: this CPU cannot run the %s kernel\n", k);
        exit(77);
    }
    printf("cpu kernel: %s\n", tz_cpu_kernel_name());
}

static inline void report(const char *name, double err, double tol) {
    check(err <= tol, "%-56s maxrel %.3e (tol %.0e)", name, err, tol); /* NaN fails */
}

static inline float *fbuf(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(float)); }
static inline double *dbuf(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(double)); }

static inline float *frand(int64_t n, float amp) {
    float *x = fbuf(n);
    for (int64_t i = 0; i < n; i++) x[i] = amp * (2.0f * tz_rng_uniform(&g_rng) - 1.0f);
    return x;
}

static inline double *todbl(const float *x, int64_t n) {
    double *d = dbuf(n);
    for (int64_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

static inline float *fcopy(const float *x, int64_t n) {
    float *y = fbuf(n);
    memcpy(y, x, (size_t)n * sizeof(float));
    return y;
}

/* max |got - ref| / max |ref|: error relative to the scale of the result */
static inline double relerr(const float *got, const double *ref, int64_t n) {
    double e = 0.0, s = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double df = fabs((double)got[i] - ref[i]);
        if (!(df <= e)) e = df; /* NaN propagates */
        if (fabs(ref[i]) > s) s = fabs(ref[i]);
    }
    return e / (s > 1e-30 ? s : 1e-30);
}

/* got against 2 * once: the second call of an accumulating backward doubles the result */
static inline double relerr_doubled(const float *twice, const float *once, int64_t n) {
    double *r = dbuf(n);
    for (int64_t i = 0; i < n; i++) r[i] = 2.0 * once[i];
    double e = relerr(twice, r, n);
    free(r);
    return e;
}

static inline double dot_d(const double *a, const double *b, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* Central differences in double of loss(ctx) with respect to x[i], i = 0, stride, 2*stride,
 * ... (stride 1: every element); g[i] is set at those i only. */
typedef double (*loss_fn)(void *ctx);
static inline void fd_grad_strided(loss_fn f, void *ctx, double *x, int64_t n, double *g,
                                   int64_t stride) {
    const double eps = 1e-5;
    for (int64_t i = 0; i < n; i += stride) {
        double x0 = x[i];
        x[i] = x0 + eps;
        double lp = f(ctx);
        x[i] = x0 - eps;
        double lm = f(ctx);
        x[i] = x0;
        g[i] = (lp - lm) / (2.0 * eps);
    }
}

static inline void fd_grad(loss_fn f, void *ctx, double *x, int64_t n, double *g) {
    fd_grad_strided(f, ctx, x, n, g, 1);
}

#endif
