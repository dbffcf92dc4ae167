/* CPU losses: softmax cross-entropy over logits rows (fused, in place allowed) and the squared
 * error of a prediction against a target, forward and backward. Reductions are in double. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/error.h"
#include "cpu/cpu_internal.h"

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

/* ---- squared error ---- */

static void cpu_mse_fwd(tz_backend *be, float *sse, const float *pred, int64_t ld,
                        const float *target, int64_t rows, int64_t n) {
    int nt = tz_cpu_threads(be);
#pragma omp parallel for schedule(static) num_threads(nt) if (rows * n >= TZ_CPU_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *p = pred + r * ld, *t = target + r * n;
        double s = 0.0;
#pragma omp simd reduction(+ : s)
        for (int64_t i = 0; i < n; i++) {
            double d = (double)p[i] - (double)t[i];
            s += d * d;
        }
        sse[r] = (float)s;
    }
}

static void cpu_mse_bwd(tz_backend *be, float *dpred, const float *pred, int64_t ld,
                        const float *target, float dloss, int64_t rows, int64_t n) {
    int nt = tz_cpu_threads(be);
    float k = 2.0f * dloss;
#pragma omp parallel for schedule(static) num_threads(nt) if (rows * n >= TZ_CPU_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *p = pred + r * ld, *t = target + r * n;
        float *d = dpred + r * ld;
#pragma omp simd
        for (int64_t i = 0; i < n; i++) d[i] += k * (p[i] - t[i]);
    }
}

void TZ_CPU_K(tz_cpu_install_loss)(tz_backend *be) {
    be->xent_fwd = cpu_xent_fwd;
    be->xent_bwd = cpu_xent_bwd;
    be->mse_fwd = cpu_mse_fwd;
    be->mse_bwd = cpu_mse_bwd;
}
