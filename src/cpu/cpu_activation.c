/* CPU activations, elementwise, forward and backward: SwiGLU (silu(g) * u), GELU with the tanh
 * approximation, SiLU; exponentials through tz_cpu_expf so the loops vectorise. No GEMM. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "cpu/cpu_internal.h"

/* ---- SwiGLU: out = silu(g) * u ---- */

/* n bf16 bit patterns (an input given in bf16: TZ_SWIGLU_IN16, TZ_GELU_X16) widened into an
 * fp32 copy of its own: the CPU is the reference, its fp32 path on the widened values, bit for
 * bit. Freed by the caller. */
static float *widen16(tz_backend *be, const float *p, int64_t n) {
    float *w = malloc((size_t)(n > 0 ? n : 1) * sizeof *w);
    if (!w) TZ_FATAL("an activation's bf16 input: out of host memory");
    be->from_bf16(be, w, (const uint16_t *)(const void *)p, n);
    return w;
}

static void cpu_swiglu_fwd(tz_backend *be, float *out, const float *g, const float *u, int64_t n,
                           int flags) {
    if (flags & TZ_SWIGLU_IN16) {
        float *gw = widen16(be, g, n), *uw = widen16(be, u, n);
        cpu_swiglu_fwd(be, out, gw, uw, n, flags & ~TZ_SWIGLU_IN16);
        free(gw), free(uw);
        return;
    }
    int nt = tz_cpu_threads(be);
    if (flags & TZ_SWIGLU_OUT16) {
        uint16_t *o16 = (uint16_t *)(void *)out;
#pragma omp parallel for schedule(static) num_threads(nt) if (n >= TZ_CPU_PAR_MIN / 4)
        for (int64_t i = 0; i < n; i++) {
            float sig = 1.0f / (1.0f + tz_cpu_expf(-g[i]));
            o16[i] = tz_f32_to_bf16(g[i] * sig * u[i]);
        }
        return;
    }
#pragma omp parallel for simd schedule(static) num_threads(nt) if (n >= TZ_CPU_PAR_MIN / 4)
    for (int64_t i = 0; i < n; i++) {
        float sig = 1.0f / (1.0f + tz_cpu_expf(-g[i]));
        out[i] = g[i] * sig * u[i];
    }
}

/* d silu(g)/dg = sig * (1 + g * (1 - sig)). */
static void cpu_swiglu_bwd(tz_backend *be, float *dg, float *du, const float *dout, const float *g,
                           const float *u, int64_t n, int accumulate, int flags) {
    if (flags & TZ_SWIGLU_IN16) {
        float *gw = widen16(be, g, n), *uw = widen16(be, u, n);
        cpu_swiglu_bwd(be, dg, du, dout, gw, uw, n, accumulate, flags & ~TZ_SWIGLU_IN16);
        free(gw), free(uw);
        return;
    }
    int nt = tz_cpu_threads(be);
    if (flags & TZ_SWIGLU_OUT16) {
        if (accumulate) TZ_FATAL("swiglu_bwd: bf16 gradients are written, not accumulated");
        uint16_t *g16 = (uint16_t *)(void *)dg, *u16 = (uint16_t *)(void *)du;
#pragma omp parallel for schedule(static) num_threads(nt) if (n >= TZ_CPU_PAR_MIN / 4)
        for (int64_t i = 0; i < n; i++) {
            float sig = 1.0f / (1.0f + tz_cpu_expf(-g[i]));
            float silu = g[i] * sig;
            g16[i] = tz_f32_to_bf16(dout[i] * u[i] * (sig * (1.0f + g[i] * (1.0f - sig))));
            u16[i] = tz_f32_to_bf16(dout[i] * silu);
        }
        return;
    }
#pragma omp parallel for simd schedule(static) num_threads(nt) if (n >= TZ_CPU_PAR_MIN / 4)
    for (int64_t i = 0; i < n; i++) {
        float sig = 1.0f / (1.0f + tz_cpu_expf(-g[i]));
        float silu = g[i] * sig;
        const float a = dout[i] * u[i] * (sig * (1.0f + g[i] * (1.0f - sig))), b = dout[i] * silu;
        dg[i] = accumulate ? dg[i] + a : a;
        du[i] = accumulate ? du[i] + b : b;
    }
}

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f

/* tanh(u) = 1 - 2 / (exp(2u) + 1) through the vectorisable exp: exact limits +-1 where exp
 * saturates or underflows. */
static inline float tanh_v(float u) { return 1.0f - 2.0f / (tz_cpu_expf(2.0f * u) + 1.0f); }

/* The rows of a GELU op (backend.h, tz_op_rows): rows of cols elements, the strided side's
 * at ld; the dense form one row of n. */
static void gelu_rows(int64_t n, int64_t cols, int64_t ld, int64_t *rows, int64_t *c,
                      int64_t *l) {
    *rows = tz_op_rows("gelu_tanh", n, cols, ld);
    if (*rows) *c = cols, *l = ld;
    else *rows = n > 0 ? 1 : 0, *c = n, *l = n;
}

static inline float gelu_v(float v) {
    return 0.5f * v * (1.0f + tanh_v(GELU_K * (v + GELU_A * v * v * v)));
}
static inline float gelu_d(float v) {
    const float th = tanh_v(GELU_K * (v + GELU_A * v * v * v));
    return 0.5f * (1.0f + th) +
           0.5f * v * (1.0f - th * th) * GELU_K * (1.0f + 3.0f * GELU_A * v * v);
}

static void cpu_gelu_tanh_fwd(tz_backend *be, float *out, const float *x, int64_t n,
                              int64_t cols, int64_t ld, int flags) {
    if (flags & TZ_GELU_X16) {
        float *w = widen16(be, x, n);
        cpu_gelu_tanh_fwd(be, out, w, n, cols, ld, flags & ~TZ_GELU_X16);
        free(w);
        return;
    }
    const int out_bf16 = flags & TZ_GELU_OUT16;
    int64_t rows, c, l;
    gelu_rows(n, cols, ld, &rows, &c, &l);
    int nt = tz_cpu_threads(be);
    uint16_t *o16 = (uint16_t *)(void *)out;
    if (rows <= 1) {
        if (out_bf16) {
#pragma omp parallel for schedule(static) num_threads(nt) if (n >= TZ_CPU_PAR_MIN / 4)
            for (int64_t i = 0; i < n; i++) o16[i] = tz_f32_to_bf16(gelu_v(x[i]));
            return;
        }
#pragma omp parallel for simd schedule(static) num_threads(nt) if (n >= TZ_CPU_PAR_MIN / 4)
        for (int64_t i = 0; i < n; i++) out[i] = gelu_v(x[i]);
        return;
    }
#pragma omp parallel for schedule(static) num_threads(nt) if (n >= TZ_CPU_PAR_MIN / 4)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * c;
        if (out_bf16)
            for (int64_t i = 0; i < c; i++) o16[r * l + i] = tz_f32_to_bf16(gelu_v(xr[i]));
        else {
            float *o = out + r * l;
#pragma omp simd
            for (int64_t i = 0; i < c; i++) o[i] = gelu_v(xr[i]);
        }
    }
}

static void cpu_gelu_tanh_bwd(tz_backend *be, float *dx, const float *dout, const float *x,
                              int64_t n, int accumulate, int64_t cols, int64_t ld) {
    if (accumulate & TZ_GELU_X16) {
        float *w = widen16(be, x, n);
        cpu_gelu_tanh_bwd(be, dx, dout, w, n, accumulate & ~TZ_GELU_X16, cols, ld);
        free(w);
        return;
    }
    const float keep = accumulate == 1 ? 1.0f : 0.0f; /* (a select: written, dx is not read) */
    int64_t rows, c, l;
    gelu_rows(n, cols, ld, &rows, &c, &l);
    int nt = tz_cpu_threads(be);
    if (accumulate == 2) { /* dx written in bf16 */
        uint16_t *d16 = (uint16_t *)(void *)dx;
#pragma omp parallel for schedule(static) num_threads(nt) if (n >= TZ_CPU_PAR_MIN / 4)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t i = 0; i < c; i++)
                d16[r * c + i] = tz_f32_to_bf16(0.0f + dout[r * l + i] * gelu_d(x[r * c + i]));
        return;
    }
    if (rows <= 1) {
#pragma omp parallel for simd schedule(static) num_threads(nt) if (n >= TZ_CPU_PAR_MIN / 4)
        for (int64_t i = 0; i < n; i++)
            dx[i] = (keep != 0.0f ? dx[i] : 0.0f) + dout[i] * gelu_d(x[i]);
        return;
    }
#pragma omp parallel for schedule(static) num_threads(nt) if (n >= TZ_CPU_PAR_MIN / 4)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * c, *g = dout + r * l;
        float *dr = dx + r * c;
#pragma omp simd
        for (int64_t i = 0; i < c; i++)
            dr[i] = (keep != 0.0f ? dr[i] : 0.0f) + g[i] * gelu_d(xr[i]);
    }
}

/* The reference: gelu_tanh_bwd into an fp32 dx of its own, then bias_bwd of it. */
static void cpu_gelu_tanh_bwd_bias(tz_backend *be, uint16_t *dx16, float *dbias,
                                   const float *dout, const float *x, int64_t rows, int64_t C,
                                   int x16) {
    const int64_t n = rows * C;
    float *dx = malloc((size_t)(n > 0 ? n : 1) * sizeof *dx);
    if (!dx) TZ_FATAL("gelu_tanh_bwd_bias: out of host memory");
    be->gelu_tanh_bwd(be, dx, dout, x, n, x16 ? TZ_GELU_X16 : 0, 0, 0);
    be->bias_bwd(be, dbias, dx, rows, C, dx16);
    free(dx);
}

static void cpu_silu_fwd(tz_backend *be, float *out, const float *x, int64_t n) {
    int nt = tz_cpu_threads(be);
#pragma omp parallel for simd schedule(static) num_threads(nt) if (n >= TZ_CPU_PAR_MIN / 4)
    for (int64_t i = 0; i < n; i++) out[i] = x[i] / (1.0f + tz_cpu_expf(-x[i]));
}

static void cpu_silu_bwd(tz_backend *be, float *dx, const float *dout, const float *x, int64_t n,
                         int accumulate) {
    int nt = tz_cpu_threads(be);
    const float keep = accumulate ? 1.0f : 0.0f;
#pragma omp parallel for simd schedule(static) num_threads(nt) if (n >= TZ_CPU_PAR_MIN / 4)
    for (int64_t i = 0; i < n; i++) {
        float sig = 1.0f / (1.0f + tz_cpu_expf(-x[i]));
        dx[i] = (keep != 0.0f ? dx[i] : 0.0f) + dout[i] * sig * (1.0f + x[i] * (1.0f - sig));
    }
}

void TZ_CPU_K(tz_cpu_install_activation)(tz_backend *be) {
    be->swiglu_fwd = cpu_swiglu_fwd;
    be->swiglu_bwd = cpu_swiglu_bwd;
    be->gelu_tanh_bwd_bias = cpu_gelu_tanh_bwd_bias;
    be->gelu_tanh_fwd = cpu_gelu_tanh_fwd;
    be->gelu_tanh_bwd = cpu_gelu_tanh_bwd;
    be->silu_fwd = cpu_silu_fwd;
    be->silu_bwd = cpu_silu_bwd;
}
