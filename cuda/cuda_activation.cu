/* CUDA activations, elementwise, forward and backward: SwiGLU (silu(g) * u), GELU with the
 * tanh approximation, SiLU (cpu/cpu_activation.c's twins, with the device's expf). */
#include "cuda/cuda_internal.cuh"

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* T: the output's type; I: g's and u's (fp32, or bf16 bits: TZ_SWIGLU_IN16) */
template <class T, class I>
static __global__ void k_swiglu_fwd(T *out, const I *g, const I *u, int64_t n) {
    TZ_CUDA_FOR(i, n) {
        tz_put(out + i, tz_silu_mul(tz_get(g + i), tz_get(u + i)));
    }
}

/* d silu(g)/dg = sig * (1 + g * (1 - sig)). */
template <class I>
static __global__ void k_swiglu_bwd(float *dg, float *du, const float *dout, const I *g,
                                    const I *u, int64_t n, int accumulate) {
    TZ_CUDA_FOR(i, n) {
        const float gi = tz_get(g + i), ui = tz_get(u + i);
        float sig = sigmoid(gi), silu = gi * sig;
        const float a = dout[i] * ui * (sig * (1.0f + gi * (1.0f - sig))), b = dout[i] * silu;
        dg[i] = accumulate ? dg[i] + a : a;
        du[i] = accumulate ? du[i] + b : b;
    }
}

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f

/* tanh(u) = 1 - 2 / (exp(2u) + 1), the CPU's formula: exact limits +-1 where exp saturates. */
__device__ __forceinline__ float tanh_e(float u) { return 1.0f - 2.0f / (expf(2.0f * u) + 1.0f); }

__device__ __forceinline__ float gelu_v(float v) {
    return 0.5f * v * (1.0f + tanh_e(GELU_K * (v + GELU_A * v * v * v)));
}
__device__ __forceinline__ float gelu_d(float v) {
    const float th = tanh_e(GELU_K * (v + GELU_A * v * v * v));
    return 0.5f * (1.0f + th) +
           0.5f * v * (1.0f - th * th) * GELU_K * (1.0f + 3.0f * GELU_A * v * v);
}

/* swiglu_bwd's gradients written in bf16 (the same products as k_swiglu_bwd's) */
template <class I>
static __global__ void k_swiglu_bwd16(uint16_t *dg, uint16_t *du, const float *dout, const I *g,
                                      const I *u, int64_t n) {
    TZ_CUDA_FOR(i, n) {
        const float gi = tz_get(g + i), ui = tz_get(u + i);
        float sig = sigmoid(gi), silu = gi * sig;
        tz_put(dg + i, dout[i] * ui * (sig * (1.0f + gi * (1.0f - sig))));
        tz_put(du + i, dout[i] * silu);
    }
}

/* T: the output's type; I: x's (fp32, or bf16 bits widened: TZ_GELU_X16) */
template <class T, class I>
static __global__ void k_gelu_fwd(T *out, const I *x, int64_t n) {
    TZ_CUDA_FOR(i, n) tz_put(out + i, gelu_v(tz_get(x + i)));
}

/* What a backward adds to: dx's value (acc) or 0 (written; a bf16 dx is only written) */
__device__ __forceinline__ float prior(const float *p, int acc) { return acc ? *p : 0.0f; }
__device__ __forceinline__ float prior(const uint16_t *, int) { return 0.0f; }

template <class T, class I>
static __global__ void k_gelu_bwd(T *dx, const float *dout, const I *x, int64_t n, int acc) {
    /* (dx not read when written) */
    TZ_CUDA_FOR(i, n) tz_put(dx + i, prior(dx + i, acc) + dout[i] * gelu_d(tz_get(x + i)));
}

/* The row forms: rows in y (grid-stride), a row's columns in x; out (or dout) at stride ld. */
template <class T, class I>
static __global__ void k_gelu_fwd_rows(T *out, const I *x, int64_t rows, int64_t cols,
                                       int64_t ld) {
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
        for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < cols;
             c += (int64_t)gridDim.x * blockDim.x)
            tz_put(out + r * ld + c, gelu_v(tz_get(x + r * cols + c)));
}
template <class T, class I>
static __global__ void k_gelu_bwd_rows(T *dx, const float *dout, const I *x, int64_t rows,
                                       int64_t cols, int64_t ld, int acc) {
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
        for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < cols;
             c += (int64_t)gridDim.x * blockDim.x) {
            const int64_t i = r * cols + c;
            tz_put(dx + i, prior(dx + i, acc) + dout[r * ld + c] * gelu_d(tz_get(x + i)));
        }
}

/* GELU's dx as k_gelu_bwd makes it (accumulate 0: 0 + dout gelu'(x), the same expression),
 * rounded into dx16 as it is summed: bias_bwd's column sums (colsum_a16's) of a dx never
 * stored in fp32 */
template <class I>
struct colsum_gelu16 {
    const float *dout;
    const I *x;
    uint16_t *dx16;
    int64_t T, C;
    __device__ double operator()(int64_t b, int64_t t, int64_t c) const {
        const int64_t i = (b * T + t) * C + c;
        const float v = 0.0f + dout[i] * gelu_d(tz_get(x + i));
        dx16[i] = tz_bf16_bits(v);
        return (double)v;
    }
};

static dim3 rows_grid(int64_t rows, int64_t cols) {
    const int64_t bx = (cols + TZ_CUDA_THREADS - 1) / TZ_CUDA_THREADS;
    return dim3((unsigned)(bx < 64 ? bx : 64), (unsigned)(rows < 65535 ? rows : 65535), 1);
}

static __global__ void k_silu_fwd(float *out, const float *x, int64_t n) {
    TZ_CUDA_FOR(i, n) out[i] = x[i] / (1.0f + expf(-x[i]));
}

static __global__ void k_silu_bwd(float *dx, const float *dout, const float *x, int64_t n,
                                  int acc) {
    TZ_CUDA_FOR(i, n) {
        float sig = sigmoid(x[i]);
        dx[i] = (acc ? dx[i] : 0.0f) + dout[i] * sig * (1.0f + x[i] * (1.0f - sig));
    }
}

static void cuda_swiglu_fwd(tz_backend *be, float *out, const float *g, const float *u,
                            int64_t n, int flags) {
    uint16_t *o16 = (uint16_t *)(void *)out;
    const uint16_t *g16 = (const uint16_t *)(const void *)g, *u16 = (const uint16_t *)(const void *)u;
    switch (flags & (TZ_SWIGLU_OUT16 | TZ_SWIGLU_IN16)) {
    case 0: TZ_CUDA_LAUNCH((k_swiglu_fwd<float, float>), n, out, g, u, n); break;
    case TZ_SWIGLU_OUT16: TZ_CUDA_LAUNCH((k_swiglu_fwd<uint16_t, float>), n, o16, g, u, n); break;
    case TZ_SWIGLU_IN16: TZ_CUDA_LAUNCH((k_swiglu_fwd<float, uint16_t>), n, out, g16, u16, n); break;
    default: TZ_CUDA_LAUNCH((k_swiglu_fwd<uint16_t, uint16_t>), n, o16, g16, u16, n);
    }
}
static void cuda_swiglu_bwd(tz_backend *be, float *dg, float *du, const float *dout,
                            const float *g, const float *u, int64_t n, int accumulate,
                            int flags) {
    const int in16 = (flags & TZ_SWIGLU_IN16) != 0;
    const uint16_t *g16 = (const uint16_t *)(const void *)g, *u16 = (const uint16_t *)(const void *)u;
    if (!(flags & TZ_SWIGLU_OUT16)) {
        if (in16) TZ_CUDA_LAUNCH(k_swiglu_bwd<uint16_t>, n, dg, du, dout, g16, u16, n, accumulate);
        else TZ_CUDA_LAUNCH(k_swiglu_bwd<float>, n, dg, du, dout, g, u, n, accumulate);
        return;
    }
    if (accumulate) TZ_FATAL("swiglu_bwd: bf16 gradients are written, not accumulated");
    uint16_t *dg16 = (uint16_t *)(void *)dg, *du16 = (uint16_t *)(void *)du;
    if (in16) TZ_CUDA_LAUNCH(k_swiglu_bwd16<uint16_t>, n, dg16, du16, dout, g16, u16, n);
    else TZ_CUDA_LAUNCH(k_swiglu_bwd16<float>, n, dg16, du16, dout, g, u, n);
}
static void cuda_gelu_tanh_bwd_bias(tz_backend *be, uint16_t *dx16, float *dbias,
                                    const float *dout, const float *x, int64_t rows, int64_t C,
                                    int x16) {
    if (x16)
        tz_cuda_colsum(be, dbias, 0,
                       colsum_gelu16<uint16_t>{dout, (const uint16_t *)(const void *)x, dx16,
                                               rows, C},
                       1, rows, C);
    else tz_cuda_colsum(be, dbias, 0, colsum_gelu16<float>{dout, x, dx16, rows, C}, 1, rows, C);
}
/* GELU's kernels for an output of type T (float, or bf16 bits) on x of type I */
template <class T, class I>
static void gelu_fwd_as(tz_backend *be, T *out, const I *x, int64_t n, int64_t rows,
                        int64_t cols, int64_t ld) {
    if (!rows) {
        TZ_CUDA_LAUNCH((k_gelu_fwd<T, I>), n, out, x, n);
        return;
    }
    k_gelu_fwd_rows<T, I><<<rows_grid(rows, cols), TZ_CUDA_THREADS, 0, tz_cuda_stream(be)>>>(
        out, x, rows, cols, ld);
    CUDA_LAUNCHED();
}
template <class T, class I>
static void gelu_bwd_as(tz_backend *be, T *dx, const float *dout, const I *x, int64_t n,
                        int acc, int64_t rows, int64_t cols, int64_t ld) {
    if (!rows) {
        TZ_CUDA_LAUNCH((k_gelu_bwd<T, I>), n, dx, dout, x, n, acc);
        return;
    }
    k_gelu_bwd_rows<T, I><<<rows_grid(rows, cols), TZ_CUDA_THREADS, 0, tz_cuda_stream(be)>>>(
        dx, dout, x, rows, cols, ld, acc);
    CUDA_LAUNCHED();
}

static void cuda_gelu_tanh_fwd(tz_backend *be, float *out, const float *x, int64_t n,
                               int64_t cols, int64_t ld, int flags) {
    const int64_t rows = tz_op_rows("gelu_tanh", n, cols, ld);
    uint16_t *o16 = (uint16_t *)(void *)out;
    const uint16_t *x16 = (const uint16_t *)(const void *)x;
    const int out16 = flags & TZ_GELU_OUT16, in16 = flags & TZ_GELU_X16;
    if (out16 && in16) gelu_fwd_as(be, o16, x16, n, rows, cols, ld);
    else if (out16) gelu_fwd_as(be, o16, x, n, rows, cols, ld);
    else if (in16) gelu_fwd_as(be, out, x16, n, rows, cols, ld);
    else gelu_fwd_as(be, out, x, n, rows, cols, ld);
}
static void cuda_gelu_tanh_bwd(tz_backend *be, float *dx, const float *dout, const float *x,
                               int64_t n, int accumulate, int64_t cols, int64_t ld) {
    const int64_t rows = tz_op_rows("gelu_tanh", n, cols, ld);
    uint16_t *d16 = (uint16_t *)(void *)dx;
    const uint16_t *x16 = (const uint16_t *)(const void *)x;
    const int acc = accumulate & ~TZ_GELU_X16, in16 = accumulate & TZ_GELU_X16;
    if (acc == 2 && in16) gelu_bwd_as(be, d16, dout, x16, n, 0, rows, cols, ld);
    else if (acc == 2) gelu_bwd_as(be, d16, dout, x, n, 0, rows, cols, ld);
    else if (in16) gelu_bwd_as(be, dx, dout, x16, n, acc, rows, cols, ld);
    else gelu_bwd_as(be, dx, dout, x, n, acc, rows, cols, ld);
}
static void cuda_silu_fwd(tz_backend *be, float *out, const float *x, int64_t n) {
    TZ_CUDA_LAUNCH(k_silu_fwd, n, out, x, n);
}
static void cuda_silu_bwd(tz_backend *be, float *dx, const float *dout, const float *x,
                          int64_t n, int accumulate) {
    TZ_CUDA_LAUNCH(k_silu_bwd, n, dx, dout, x, n, accumulate);
}

void tz_cuda_install_activation(tz_backend *be) {
    be->swiglu_fwd = cuda_swiglu_fwd;
    be->swiglu_bwd = cuda_swiglu_bwd;
    be->gelu_tanh_fwd = cuda_gelu_tanh_fwd;
    be->gelu_tanh_bwd = cuda_gelu_tanh_bwd;
    be->gelu_tanh_bwd_bias = cuda_gelu_tanh_bwd_bias;
    be->silu_fwd = cuda_silu_fwd;
    be->silu_bwd = cuda_silu_bwd;
}
