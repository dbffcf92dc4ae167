/* CPU elementwise and broadcast ops: fill, scale, axpy, sum of squares, bias, adaLN modulate
 * and the gated residual, with their column-sum backwards. No row normalisation, no GEMM. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "cpu/cpu_internal.h"

/* sumsq: fixed chunk, so the partial sums (and their order) do not depend on threads. */
#define TZ_CPU_SUMSQ_CHUNK 16384

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

static void cpu_to_bf16(tz_backend *be, uint16_t *dst, const float *src, int64_t n) {
    int nt = tz_cpu_threads(be);
#pragma omp parallel for schedule(static) num_threads(nt) if (n >= TZ_CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) dst[i] = tz_f32_to_bf16(src[i]);
}

static void cpu_from_bf16(tz_backend *be, float *dst, const uint16_t *src, int64_t n) {
    int nt = tz_cpu_threads(be);
#pragma omp parallel for schedule(static) num_threads(nt) if (n >= TZ_CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) dst[i] = tz_bf16_to_f32(src[i]);
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

/* AdamW: tz_adamw_elem, the host shard's arithmetic (optim/adamw.c), so the two agree (the
 * threads' split does not change an element). */
static void cpu_adamw(tz_backend *be, float *restrict w, float *restrict m, float *restrict v,
                      const float *restrict g, const uint8_t *restrict decay, int64_t n,
                      const tz_adamw_args *a) {
    const tz_adamw_args args = *a;
    int nt = tz_cpu_threads(be);
#pragma omp parallel for simd schedule(static) num_threads(nt) if (n >= 32768)
    for (int64_t i = 0; i < n; i++)
        tz_adamw_elem(&w[i], &m[i], &v[i], g[i], decay == NULL || decay[i], &args);
}

/* ---- column sums: the parameter-like gradients of the per-sample conditioning ---- */

/* dst[b*ld + c] += sum_{t<T} a[b,t,c] * (w ? w[b,t,c] : 1), a and w [B, T, C]. One thread
 * owns each (b, column block) and sums t in order, in double: thread-count independent. */
static void colsum_bt(tz_backend *be, float *dst, int64_t ld, const float *a, const float *w,
                      int64_t B, int64_t T, int64_t C) {
    int nt = tz_cpu_threads(be);
    int64_t nb = (C + TZ_CPU_COLS - 1) / TZ_CPU_COLS, items = B * nb;
#pragma omp parallel for schedule(static) num_threads(nt) if (B * T * C >= TZ_CPU_PAR_MIN)
    for (int64_t it = 0; it < items; it++) {
        int64_t b = it / nb, c0 = (it % nb) * TZ_CPU_COLS;
        int64_t n = C - c0 < TZ_CPU_COLS ? C - c0 : TZ_CPU_COLS;
        double acc[TZ_CPU_COLS];
        for (int64_t c = 0; c < n; c++) acc[c] = 0.0;
        for (int64_t t = 0; t < T; t++) {
            const float *ar = a + (b * T + t) * C + c0;
            if (w) {
                const float *wr = w + (b * T + t) * C + c0;
#pragma omp simd
                for (int64_t c = 0; c < n; c++) acc[c] += (double)(ar[c] * wr[c]);
            } else {
#pragma omp simd
                for (int64_t c = 0; c < n; c++) acc[c] += (double)ar[c];
            }
        }
        float *d = dst + b * ld + c0;
        for (int64_t c = 0; c < n; c++) d[c] += (float)acc[c];
    }
}

/* ---- modulate and gated residual ---- */

static void cpu_modulate_fwd(tz_backend *be, float *out, const float *x, const float *shift,
                             const float *scale, int64_t ld, int64_t B, int64_t T, int64_t C,
                             int out_bf16) {
    int nt = tz_cpu_threads(be);
    if (out_bf16) {
        uint16_t *o16 = (uint16_t *)(void *)out;
#pragma omp parallel for schedule(static) num_threads(nt) if (B * T * C >= TZ_CPU_PAR_MIN)
        for (int64_t r = 0; r < B * T; r++) {
            const float *sh = shift + (r / T) * ld, *sc = scale + (r / T) * ld, *xr = x + r * C;
            for (int64_t c = 0; c < C; c++)
                o16[r * C + c] = tz_f32_to_bf16(xr[c] * (1.0f + sc[c]) + sh[c]);
        }
        return;
    }
#pragma omp parallel for schedule(static) num_threads(nt) if (B * T * C >= TZ_CPU_PAR_MIN)
    for (int64_t r = 0; r < B * T; r++) {
        const float *sh = shift + (r / T) * ld, *sc = scale + (r / T) * ld, *xr = x + r * C;
        float *o = out + r * C;
#pragma omp simd
        for (int64_t c = 0; c < C; c++) o[c] = xr[c] * (1.0f + sc[c]) + sh[c];
    }
}

static void cpu_modulate_bwd(tz_backend *be, float *dx, float *dshift, float *dscale,
                             const float *dout, const float *x, const float *scale, int64_t ld,
                             int64_t B, int64_t T, int64_t C, int accumulate) {
    int nt = tz_cpu_threads(be);
    const float keep = accumulate ? 1.0f : 0.0f; /* 0: dx written, not read */
    if (dx) {
#pragma omp parallel for schedule(static) num_threads(nt) if (B * T * C >= TZ_CPU_PAR_MIN)
        for (int64_t r = 0; r < B * T; r++) {
            const float *sc = scale + (r / T) * ld, *g = dout + r * C;
            float *d = dx + r * C;
#pragma omp simd
            for (int64_t c = 0; c < C; c++) d[c] = (keep != 0.0f ? d[c] : 0.0f) + g[c] * (1.0f + sc[c]);
        }
    }
    if (dshift) colsum_bt(be, dshift, ld, dout, NULL, B, T, C);
    if (dscale) colsum_bt(be, dscale, ld, dout, x, B, T, C);
}

static void cpu_gate_fwd(tz_backend *be, float *out, const float *x, const float *y,
                         const float *gate, int64_t ld, int64_t B, int64_t T, int64_t C) {
    int nt = tz_cpu_threads(be);
#pragma omp parallel for schedule(static) num_threads(nt) if (B * T * C >= TZ_CPU_PAR_MIN)
    for (int64_t r = 0; r < B * T; r++) {
        const float *gt = gate + (r / T) * ld, *xr = x + r * C, *yr = y + r * C;
        float *o = out + r * C;
#pragma omp simd
        for (int64_t c = 0; c < C; c++) o[c] = xr[c] + gt[c] * yr[c];
    }
}

static void cpu_gate_bwd(tz_backend *be, float *dy, float *dgate, const float *dout,
                         const float *y, const float *gate, int64_t ld, int64_t B, int64_t T,
                         int64_t C, int accumulate) {
    int nt = tz_cpu_threads(be);
    const float keep = accumulate == 1 ? 1.0f : 0.0f; /* 0: dy written, not read */
    if (dy && accumulate == 2) { /* written in bf16 */
        uint16_t *d16 = (uint16_t *)(void *)dy;
#pragma omp parallel for schedule(static) num_threads(nt) if (B * T * C >= TZ_CPU_PAR_MIN)
        for (int64_t r = 0; r < B * T; r++) {
            const float *gt = gate + (r / T) * ld, *g = dout + r * C;
            for (int64_t c = 0; c < C; c++) d16[r * C + c] = tz_f32_to_bf16(0.0f + g[c] * gt[c]);
        }
    } else if (dy) {
#pragma omp parallel for schedule(static) num_threads(nt) if (B * T * C >= TZ_CPU_PAR_MIN)
        for (int64_t r = 0; r < B * T; r++) {
            const float *gt = gate + (r / T) * ld, *g = dout + r * C;
            float *d = dy + r * C;
#pragma omp simd
            for (int64_t c = 0; c < C; c++) d[c] = (keep != 0.0f ? d[c] : 0.0f) + g[c] * gt[c];
        }
    }
    if (dgate) colsum_bt(be, dgate, ld, dout, y, B, T, C);
}

/* ---- bias ---- */

static void cpu_bias_add_fwd(tz_backend *be, float *y, const float *bias, int64_t rows,
                             int64_t C) {
    int nt = tz_cpu_threads(be);
#pragma omp parallel for schedule(static) num_threads(nt) if (rows * C >= TZ_CPU_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        float *yr = y + r * C;
#pragma omp simd
        for (int64_t c = 0; c < C; c++) yr[c] += bias[c];
    }
}

static void cpu_bias_bwd(tz_backend *be, float *dbias, const float *dy, int64_t rows, int64_t C,
                         uint16_t *dy16) {
    colsum_bt(be, dbias, 0, dy, NULL, 1, rows, C);
    if (dy16) cpu_to_bf16(be, dy16, dy, rows * C);
}

void TZ_CPU_K(tz_cpu_install_elementwise)(tz_backend *be) {
    be->fill = cpu_fill;
    be->scale = cpu_scale;
    be->axpy = cpu_axpy;
    be->to_bf16 = cpu_to_bf16;
    be->from_bf16 = cpu_from_bf16;
    be->sumsq = cpu_sumsq;
    be->adamw = cpu_adamw;
    be->modulate_fwd = cpu_modulate_fwd;
    be->modulate_bwd = cpu_modulate_bwd;
    be->gate_fwd = cpu_gate_fwd;
    be->gate_bwd = cpu_gate_bwd;
    be->bias_add_fwd = cpu_bias_add_fwd;
    be->bias_bwd = cpu_bias_bwd;
}
