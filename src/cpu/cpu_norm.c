/* CPU row-wise and elementwise layers: embedding, RMSNorm, rotate-half RoPE and SwiGLU,
 * forward and backward. Matmul and attention are elsewhere (cpu_matmul.c, cpu_attention.c). */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/error.h"
#include "cpu/cpu_internal.h"

#define PAR_MIN 32768 /* elements below which a loop runs on the calling thread */
#define COLS 64       /* column block of the deterministic reductions over rows */

/* ---- embedding ---- */

void tz_cpu_embedding_fwd(tz_backend *be, float *out, const int32_t *tok, const float *table,
                          int64_t n, int64_t C) {
    int nt = tz_cpu_threads(be);
#pragma omp parallel for schedule(static) num_threads(nt) if (n * C >= PAR_MIN)
    for (int64_t t = 0; t < n; t++)
        memcpy(out + t * C, table + (int64_t)tok[t] * C, (size_t)C * sizeof(float));
}

/* Threads own column blocks and walk the tokens in order, so repeated token ids add up in
 * the same order whatever the thread count. */
void tz_cpu_embedding_bwd(tz_backend *be, float *dtable, const int32_t *tok, const float *dout,
                          int64_t n, int64_t C) {
    int nt = tz_cpu_threads(be);
    int64_t nb = (C + COLS - 1) / COLS;
#pragma omp parallel for schedule(static) num_threads(nt) if (n * C >= PAR_MIN)
    for (int64_t cb = 0; cb < nb; cb++) {
        int64_t c0 = cb * COLS, c1 = c0 + COLS < C ? c0 + COLS : C;
        for (int64_t t = 0; t < n; t++) {
            float *d = dtable + (int64_t)tok[t] * C;
            const float *s = dout + t * C;
#pragma omp simd
            for (int64_t c = c0; c < c1; c++) d[c] += s[c];
        }
    }
}

/* ---- RMSNorm ---- */

void tz_cpu_rmsnorm_fwd(tz_backend *be, float *out, float *rstd, const float *x, const float *w,
                        int64_t rows, int64_t C, float eps) {
    int nt = tz_cpu_threads(be);
#pragma omp parallel for schedule(static) num_threads(nt) if (rows * C >= PAR_MIN)
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
void tz_cpu_rmsnorm_bwd(tz_backend *be, float *dx, float *dw, const float *dout, const float *x,
                        const float *w, const float *rstd, int64_t rows, int64_t C) {
    int nt = tz_cpu_threads(be);
#pragma omp parallel for schedule(static) num_threads(nt) if (rows * C >= PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * C, *gr = dout + r * C;
        float *d = dx + r * C;
        float rs = rstd[r];
        double dot = 0.0;
#pragma omp simd reduction(+ : dot)
        for (int64_t c = 0; c < C; c++) dot += (double)(gr[c] * w[c]) * (double)xr[c];
        float coef = (float)(dot / (double)C) * rs * rs;
#pragma omp simd
        for (int64_t c = 0; c < C; c++) d[c] += rs * (gr[c] * w[c] - xr[c] * coef);
    }
    if (!dw) return;
    int64_t nb = (C + COLS - 1) / COLS;
#pragma omp parallel for schedule(static) num_threads(nt) if (rows * C >= PAR_MIN)
    for (int64_t cb = 0; cb < nb; cb++) {
        int64_t c0 = cb * COLS, n = C - c0 < COLS ? C - c0 : COLS;
        double acc[COLS];
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

/* ---- RoPE (HF rotate-half) ---- */

/* cs[t*half + i] = cos, sn[...] = sin of angle (float)t * inv_freq[i], with inv_freq in float
 * as HF computes it: 1 / theta^((2i)/D). */
static void rope_table(float *cs, float *sn, int64_t T, int64_t D, float theta, int nt) {
    int64_t half = D / 2;
    float *inv = tz_xmalloc((size_t)half * sizeof(float));
    for (int64_t i = 0; i < half; i++)
        inv[i] = 1.0f / powf(theta, (float)(2 * i) / (float)D);
#pragma omp parallel for schedule(static) num_threads(nt) if (T * half >= 4096)
    for (int64_t t = 0; t < T; t++) {
        for (int64_t i = 0; i < half; i++) {
            float ang = (float)t * inv[i];
            cs[t * half + i] = cosf(ang);
            sn[t * half + i] = sinf(ang);
        }
    }
    free(inv);
}

/* dir = +1: forward rotation; -1: its transpose (the backward). */
static void rope_apply(tz_backend *be, float *x, int64_t B, int64_t T, int64_t H, int64_t D,
                       float theta, float dir) {
    if (D % 2 != 0) TZ_FATAL("rope needs an even head dimension, got D=%lld", (long long)D);
    if (B <= 0 || T <= 0 || H <= 0 || D <= 0) return;
    int nt = tz_cpu_threads(be);
    int64_t half = D / 2;
    float *cs = tz_xmalloc((size_t)(T * half) * sizeof(float));
    float *sn = tz_xmalloc((size_t)(T * half) * sizeof(float));
    rope_table(cs, sn, T, D, theta, nt);
#pragma omp parallel for schedule(static) num_threads(nt) if (B * T * H * D >= PAR_MIN)
    for (int64_t bt = 0; bt < B * T; bt++) {
        int64_t t = bt % T;
        const float *c = cs + t * half, *s0 = sn + t * half;
        for (int64_t h = 0; h < H; h++) {
            float *x1 = x + (bt * H + h) * D, *x2 = x1 + half;
#pragma omp simd
            for (int64_t i = 0; i < half; i++) {
                float a = x1[i], b = x2[i], s = dir * s0[i];
                x1[i] = a * c[i] - b * s;
                x2[i] = b * c[i] + a * s;
            }
        }
    }
    free(cs);
    free(sn);
}

void tz_cpu_rope_fwd(tz_backend *be, float *x, int64_t B, int64_t T, int64_t H, int64_t D,
                     float theta) {
    rope_apply(be, x, B, T, H, D, theta, 1.0f);
}

void tz_cpu_rope_bwd(tz_backend *be, float *dx, int64_t B, int64_t T, int64_t H, int64_t D,
                     float theta) {
    rope_apply(be, dx, B, T, H, D, theta, -1.0f);
}

/* ---- SwiGLU: out = silu(g) * u ---- */

void tz_cpu_swiglu_fwd(tz_backend *be, float *out, const float *g, const float *u, int64_t n) {
    int nt = tz_cpu_threads(be);
#pragma omp parallel for simd schedule(static) num_threads(nt) if (n >= PAR_MIN / 4)
    for (int64_t i = 0; i < n; i++) {
        float sig = 1.0f / (1.0f + tz_cpu_expf(-g[i]));
        out[i] = g[i] * sig * u[i];
    }
}

/* d silu(g)/dg = sig * (1 + g * (1 - sig)). */
void tz_cpu_swiglu_bwd(tz_backend *be, float *dg, float *du, const float *dout, const float *g,
                       const float *u, int64_t n) {
    int nt = tz_cpu_threads(be);
#pragma omp parallel for simd schedule(static) num_threads(nt) if (n >= PAR_MIN / 4)
    for (int64_t i = 0; i < n; i++) {
        float sig = 1.0f / (1.0f + tz_cpu_expf(-g[i]));
        float silu = g[i] * sig;
        dg[i] += dout[i] * u[i] * (sig * (1.0f + g[i] * (1.0f - sig)));
        du[i] += dout[i] * silu;
    }
}
