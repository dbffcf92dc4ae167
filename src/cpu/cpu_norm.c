/* CPU row normalisations: RMSNorm (HF LlamaRMSNorm, with weight) and LayerNorm without affine
 * (DiT), forward and backward, statistics in double. The adaLN modulation is elementwise. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/error.h"
#include "cpu/cpu_internal.h"

/* ---- RMSNorm ---- */

static void cpu_rmsnorm_fwd(tz_backend *be, float *out, float *rstd, const float *x, const float *w,
                            int64_t rows, int64_t C, float eps) {
    int nt = tz_cpu_threads(be);
#pragma omp parallel for schedule(static) num_threads(nt) if (rows * C >= TZ_CPU_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * C;
        float *o = out + r * C;
        double ss = 0.0;
#pragma omp simd reduction(+ : ss)
        for (int64_t c = 0; c < C; c++) ss += (double)xr[c] * (double)xr[c];
        float rs = (float)(1.0 / sqrt(ss / (double)C + (double)eps));
        rstd[r] = rs;
#pragma omp simd
        for (int64_t c = 0; c < C; c++) o[c] = xr[c] * rs * w[c];
    }
}

/* y = x*r*w, r = (mean(x^2) + eps)^-1/2:
 * dx = r * (g - x * r^2 * mean(g*x)) with g = dout*w;  dw = sum over rows of dout*x*r. */
static void cpu_rmsnorm_bwd(tz_backend *be, float *dx, float *dw, const float *dout, const float *x,
                            const float *w, const float *rstd, int64_t rows, int64_t C,
                            int accumulate) {
    int nt = tz_cpu_threads(be);
    const float keep = accumulate ? 1.0f : 0.0f; /* 0: dx written, not read */
#pragma omp parallel for schedule(static) num_threads(nt) if (rows * C >= TZ_CPU_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * C, *gr = dout + r * C;
        float *d = dx + r * C;
        float rs = rstd[r];
        double dot = 0.0;
#pragma omp simd reduction(+ : dot)
        for (int64_t c = 0; c < C; c++) dot += (double)(gr[c] * w[c]) * (double)xr[c];
        float coef = (float)(dot / (double)C) * rs * rs;
#pragma omp simd
        for (int64_t c = 0; c < C; c++)
            d[c] = (keep != 0.0f ? d[c] : 0.0f) + rs * (gr[c] * w[c] - xr[c] * coef);
    }
    if (!dw) return;
    int64_t nb = (C + TZ_CPU_COLS - 1) / TZ_CPU_COLS;
#pragma omp parallel for schedule(static) num_threads(nt) if (rows * C >= TZ_CPU_PAR_MIN)
    for (int64_t cb = 0; cb < nb; cb++) {
        int64_t c0 = cb * TZ_CPU_COLS, n = C - c0 < TZ_CPU_COLS ? C - c0 : TZ_CPU_COLS;
        double acc[TZ_CPU_COLS];
        for (int64_t c = 0; c < n; c++) acc[c] = 0.0;
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = x + r * C + c0, *gr = dout + r * C + c0;
            float rs = rstd[r];
#pragma omp simd
            for (int64_t c = 0; c < n; c++) acc[c] += (double)(gr[c] * xr[c] * rs);
        }
        for (int64_t c = 0; c < n; c++) dw[c0 + c] += (float)acc[c];
    }
}

/* ---- LayerNorm without affine ---- */

static void cpu_layernorm_fwd(tz_backend *be, float *out, float *mean, float *rstd,
                              const float *x, int64_t rows, int64_t C, float eps) {
    int nt = tz_cpu_threads(be);
#pragma omp parallel for schedule(static) num_threads(nt) if (rows * C >= TZ_CPU_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * C;
        float *o = out + r * C;
        double s = 0.0, ss = 0.0;
#pragma omp simd reduction(+ : s)
        for (int64_t c = 0; c < C; c++) s += (double)xr[c];
        double mu = s / (double)C;
#pragma omp simd reduction(+ : ss)
        for (int64_t c = 0; c < C; c++) ss += ((double)xr[c] - mu) * ((double)xr[c] - mu);
        float m = (float)mu, rs = (float)(1.0 / sqrt(ss / (double)C + (double)eps));
        mean[r] = m;
        rstd[r] = rs;
#pragma omp simd
        for (int64_t c = 0; c < C; c++) o[c] = (xr[c] - m) * rs;
    }
}

static void cpu_layernorm_bwd(tz_backend *be, float *dx, const float *dout, const float *x,
                              const float *mean, const float *rstd, int64_t rows, int64_t C) {
    int nt = tz_cpu_threads(be);
#pragma omp parallel for schedule(static) num_threads(nt) if (rows * C >= TZ_CPU_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * C, *g = dout + r * C;
        float *d = dx + r * C;
        float m = mean[r], rs = rstd[r];
        double sg = 0.0, sgx = 0.0;
#pragma omp simd reduction(+ : sg, sgx)
        for (int64_t c = 0; c < C; c++) {
            sg += (double)g[c];
            sgx += (double)g[c] * (double)((xr[c] - m) * rs);
        }
        float mg = (float)(sg / (double)C), mgx = (float)(sgx / (double)C);
#pragma omp simd
        for (int64_t c = 0; c < C; c++) d[c] += rs * (g[c] - mg - (xr[c] - m) * rs * mgx);
    }
}

/* The reference: rmsnorm_fwd of the stream, its rows placed in a joint [B, T, H, D] (the
 * rest zeros), rope_pairs_fwd16 of that, and the stream's rows copied into y. */
static void cpu_rms_rope_pairs16(tz_backend *be, uint16_t *y, float *rstd, const float *x,
                                 const float *w, int64_t B, int64_t Ts, int64_t off, int64_t T,
                                 int64_t H, int64_t D, float eps, const float *cs) {
    if (off < 0 || off + Ts > T)
        TZ_FATAL("rms_rope_pairs16: tokens [%lld, %lld) outside a sequence of %lld",
                 (long long)off, (long long)(off + Ts), (long long)T);
    const int64_t row = H * D, n = B * T * row;
    if (B <= 0 || Ts <= 0 || row <= 0) return;
    float *h = malloc((size_t)(B * Ts * row) * sizeof *h), *j = calloc((size_t)n, sizeof *j);
    uint16_t *j16 = malloc((size_t)n * sizeof *j16);
    if (!h || !j || !j16) TZ_FATAL("rms_rope_pairs16: out of host memory");
    be->rmsnorm_fwd(be, h, rstd, x, w, B * Ts * H, D, eps);
    for (int64_t b = 0; b < B; b++)
        memcpy(j + (b * T + off) * row, h + b * Ts * row, (size_t)(Ts * row) * sizeof *j);
    be->rope_pairs_fwd16(be, j16, j, B, T, H, D, cs);
    for (int64_t b = 0; b < B; b++)
        memcpy(y + (b * T + off) * row, j16 + (b * T + off) * row,
               (size_t)(Ts * row) * sizeof *y);
    free(h), free(j), free(j16);
}

void TZ_CPU_K(tz_cpu_install_norm)(tz_backend *be) {
    be->rms_rope_pairs16 = cpu_rms_rope_pairs16;
    be->rmsnorm_fwd = cpu_rmsnorm_fwd;
    be->rmsnorm_bwd = cpu_rmsnorm_bwd;
    be->layernorm_fwd = cpu_layernorm_fwd;
    be->layernorm_bwd = cpu_layernorm_bwd;
}
