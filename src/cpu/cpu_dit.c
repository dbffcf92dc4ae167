/* CPU ops of the diffusion transformer: LayerNorm without affine, adaLN modulate, gated
 * residual, GELU-tanh, SiLU, bias, squared error, patchify and strided copies. Attention and
 * matmul are the shared ones (cpu_attention.c, cpu_matmul.c); no op here allocates. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/error.h"
#include "cpu/cpu_internal.h"

#define PAR_MIN 32768 /* elements below which a loop runs on the calling thread */
#define COLS 64       /* column block of the deterministic reductions over rows */

/* ---- column sums: the parameter-like gradients of the per-sample conditioning ---- */

/* dst[b*ld + c] += sum_{t<T} a[b,t,c] * (w ? w[b,t,c] : 1), a and w [B, T, C]. One thread
 * owns each (b, column block) and sums t in order, in double: thread-count independent. */
static void colsum_bt(tz_backend *be, float *dst, int64_t ld, const float *a, const float *w,
                      int64_t B, int64_t T, int64_t C) {
    int nt = tz_cpu_threads(be);
    int64_t nb = (C + COLS - 1) / COLS, items = B * nb;
#pragma omp parallel for schedule(static) num_threads(nt) if (B * T * C >= PAR_MIN)
    for (int64_t it = 0; it < items; it++) {
        int64_t b = it / nb, c0 = (it % nb) * COLS, n = C - c0 < COLS ? C - c0 : COLS;
        double acc[COLS];
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

/* ---- LayerNorm without affine ---- */

static void cpu_layernorm_fwd(tz_backend *be, float *out, float *mean, float *rstd,
                              const float *x, int64_t rows, int64_t C, float eps) {
    int nt = tz_cpu_threads(be);
#pragma omp parallel for schedule(static) num_threads(nt) if (rows * C >= PAR_MIN)
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
#pragma omp parallel for schedule(static) num_threads(nt) if (rows * C >= PAR_MIN)
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

/* ---- modulate and gated residual ---- */

static void cpu_modulate_fwd(tz_backend *be, float *out, const float *x, const float *shift,
                             const float *scale, int64_t ld, int64_t B, int64_t T, int64_t C) {
    int nt = tz_cpu_threads(be);
#pragma omp parallel for schedule(static) num_threads(nt) if (B * T * C >= PAR_MIN)
    for (int64_t r = 0; r < B * T; r++) {
        const float *sh = shift + (r / T) * ld, *sc = scale + (r / T) * ld, *xr = x + r * C;
        float *o = out + r * C;
#pragma omp simd
        for (int64_t c = 0; c < C; c++) o[c] = xr[c] * (1.0f + sc[c]) + sh[c];
    }
}

static void cpu_modulate_bwd(tz_backend *be, float *dx, float *dshift, float *dscale,
                             const float *dout, const float *x, const float *scale, int64_t ld,
                             int64_t B, int64_t T, int64_t C) {
    int nt = tz_cpu_threads(be);
    if (dx) {
#pragma omp parallel for schedule(static) num_threads(nt) if (B * T * C >= PAR_MIN)
        for (int64_t r = 0; r < B * T; r++) {
            const float *sc = scale + (r / T) * ld, *g = dout + r * C;
            float *d = dx + r * C;
#pragma omp simd
            for (int64_t c = 0; c < C; c++) d[c] += g[c] * (1.0f + sc[c]);
        }
    }
    if (dshift) colsum_bt(be, dshift, ld, dout, NULL, B, T, C);
    if (dscale) colsum_bt(be, dscale, ld, dout, x, B, T, C);
}

static void cpu_gate_fwd(tz_backend *be, float *out, const float *x, const float *y,
                         const float *gate, int64_t ld, int64_t B, int64_t T, int64_t C) {
    int nt = tz_cpu_threads(be);
#pragma omp parallel for schedule(static) num_threads(nt) if (B * T * C >= PAR_MIN)
    for (int64_t r = 0; r < B * T; r++) {
        const float *gt = gate + (r / T) * ld, *xr = x + r * C, *yr = y + r * C;
        float *o = out + r * C;
#pragma omp simd
        for (int64_t c = 0; c < C; c++) o[c] = xr[c] + gt[c] * yr[c];
    }
}

static void cpu_gate_bwd(tz_backend *be, float *dy, float *dgate, const float *dout,
                         const float *y, const float *gate, int64_t ld, int64_t B, int64_t T,
                         int64_t C) {
    int nt = tz_cpu_threads(be);
    if (dy) {
#pragma omp parallel for schedule(static) num_threads(nt) if (B * T * C >= PAR_MIN)
        for (int64_t r = 0; r < B * T; r++) {
            const float *gt = gate + (r / T) * ld, *g = dout + r * C;
            float *d = dy + r * C;
#pragma omp simd
            for (int64_t c = 0; c < C; c++) d[c] += g[c] * gt[c];
        }
    }
    if (dgate) colsum_bt(be, dgate, ld, dout, y, B, T, C);
}

/* ---- activations ---- */

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f

/* tanh(u) = 1 - 2 / (exp(2u) + 1) through the vectorisable exp: exact limits +-1 where exp
 * saturates or underflows. */
static inline float tanh_v(float u) { return 1.0f - 2.0f / (tz_cpu_expf(2.0f * u) + 1.0f); }

static void cpu_gelu_tanh_fwd(tz_backend *be, float *out, const float *x, int64_t n) {
    int nt = tz_cpu_threads(be);
#pragma omp parallel for simd schedule(static) num_threads(nt) if (n >= PAR_MIN / 4)
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        out[i] = 0.5f * v * (1.0f + tanh_v(GELU_K * (v + GELU_A * v * v * v)));
    }
}

static void cpu_gelu_tanh_bwd(tz_backend *be, float *dx, const float *dout, const float *x,
                              int64_t n) {
    int nt = tz_cpu_threads(be);
#pragma omp parallel for simd schedule(static) num_threads(nt) if (n >= PAR_MIN / 4)
    for (int64_t i = 0; i < n; i++) {
        float v = x[i], th = tanh_v(GELU_K * (v + GELU_A * v * v * v));
        float d = 0.5f * (1.0f + th) +
                  0.5f * v * (1.0f - th * th) * GELU_K * (1.0f + 3.0f * GELU_A * v * v);
        dx[i] += dout[i] * d;
    }
}

static void cpu_silu_fwd(tz_backend *be, float *out, const float *x, int64_t n) {
    int nt = tz_cpu_threads(be);
#pragma omp parallel for simd schedule(static) num_threads(nt) if (n >= PAR_MIN / 4)
    for (int64_t i = 0; i < n; i++) out[i] = x[i] / (1.0f + tz_cpu_expf(-x[i]));
}

static void cpu_silu_bwd(tz_backend *be, float *dx, const float *dout, const float *x, int64_t n) {
    int nt = tz_cpu_threads(be);
#pragma omp parallel for simd schedule(static) num_threads(nt) if (n >= PAR_MIN / 4)
    for (int64_t i = 0; i < n; i++) {
        float sig = 1.0f / (1.0f + tz_cpu_expf(-x[i]));
        dx[i] += dout[i] * sig * (1.0f + x[i] * (1.0f - sig));
    }
}

/* ---- bias ---- */

static void cpu_bias_add_fwd(tz_backend *be, float *y, const float *bias, int64_t rows,
                             int64_t C) {
    int nt = tz_cpu_threads(be);
#pragma omp parallel for schedule(static) num_threads(nt) if (rows * C >= PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        float *yr = y + r * C;
#pragma omp simd
        for (int64_t c = 0; c < C; c++) yr[c] += bias[c];
    }
}

static void cpu_bias_bwd(tz_backend *be, float *dbias, const float *dy, int64_t rows, int64_t C) {
    colsum_bt(be, dbias, 0, dy, NULL, 1, rows, C);
}

/* ---- squared error ---- */

static void cpu_mse_fwd(tz_backend *be, float *sse, const float *pred, int64_t ld,
                        const float *target, int64_t rows, int64_t n) {
    int nt = tz_cpu_threads(be);
#pragma omp parallel for schedule(static) num_threads(nt) if (rows * n >= PAR_MIN)
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
#pragma omp parallel for schedule(static) num_threads(nt) if (rows * n >= PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *p = pred + r * ld, *t = target + r * n;
        float *d = dpred + r * ld;
#pragma omp simd
        for (int64_t i = 0; i < n; i++) d[i] += k * (p[i] - t[i]);
    }
}

/* ---- patches ---- */

/* to_tok = 1: tok <- img; 0: img <- tok. One work item per (b, token); every element has one
 * writer. */
static void patch_move(tz_backend *be, float *tok, float *img, int64_t B, int64_t C, int64_t H,
                       int64_t W, int64_t p, int chan_last, int to_tok) {
    if (p <= 0 || H % p || W % p)
        TZ_FATAL("patchify: image %lldx%lld is not a multiple of patch %lld", (long long)H,
                 (long long)W, (long long)p);
    int nt = tz_cpu_threads(be);
    const int64_t gh = H / p, gw = W / p, T = gh * gw, P = C * p * p;
#pragma omp parallel for schedule(static) num_threads(nt) if (B * T * P >= PAR_MIN)
    for (int64_t bt = 0; bt < B * T; bt++) {
        int64_t b = bt / T, gy = (bt % T) / gw, gx = bt % gw;
        float *tv = tok + bt * P;
        for (int64_t c = 0; c < C; c++)
            for (int64_t i = 0; i < p; i++) {
                float *row = img + ((b * C + c) * H + gy * p + i) * W + gx * p;
                for (int64_t j = 0; j < p; j++) {
                    int64_t k = chan_last ? (i * p + j) * C + c : (c * p + i) * p + j;
                    if (to_tok) tv[k] = row[j];
                    else row[j] = tv[k];
                }
            }
    }
}

static void cpu_patchify(tz_backend *be, float *tok, const float *img, int64_t B, int64_t C,
                         int64_t H, int64_t W, int64_t p, int chan_last) {
    patch_move(be, tok, (float *)img, B, C, H, W, p, chan_last, 1); /* img is only read */
}

static void cpu_unpatchify(tz_backend *be, float *img, const float *tok, int64_t B, int64_t C,
                           int64_t H, int64_t W, int64_t p, int chan_last) {
    patch_move(be, (float *)tok, img, B, C, H, W, p, chan_last, 0); /* tok is only read */
}

static void cpu_copy2d(tz_backend *be, float *dst, int64_t ldd, const float *src, int64_t lds,
                       int64_t rows, int64_t cols) {
    int nt = tz_cpu_threads(be);
#pragma omp parallel for schedule(static) num_threads(nt) if (rows * cols >= PAR_MIN)
    for (int64_t r = 0; r < rows; r++)
        memcpy(dst + r * ldd, src + r * lds, (size_t)cols * sizeof(float));
}

void tz_cpu_dit_ops_install(tz_backend *be) {
    be->layernorm_fwd = cpu_layernorm_fwd;
    be->layernorm_bwd = cpu_layernorm_bwd;
    be->modulate_fwd = cpu_modulate_fwd;
    be->modulate_bwd = cpu_modulate_bwd;
    be->gate_fwd = cpu_gate_fwd;
    be->gate_bwd = cpu_gate_bwd;
    be->gelu_tanh_fwd = cpu_gelu_tanh_fwd;
    be->gelu_tanh_bwd = cpu_gelu_tanh_bwd;
    be->silu_fwd = cpu_silu_fwd;
    be->silu_bwd = cpu_silu_bwd;
    be->bias_add_fwd = cpu_bias_add_fwd;
    be->bias_bwd = cpu_bias_bwd;
    be->mse_fwd = cpu_mse_fwd;
    be->mse_bwd = cpu_mse_bwd;
    be->patchify = cpu_patchify;
    be->unpatchify = cpu_unpatchify;
    be->copy2d = cpu_copy2d;
}
