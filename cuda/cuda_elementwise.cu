/* CUDA elementwise and broadcast ops: fill, scale, axpy, sum of squares, bias, adaLN modulate
 * and the gated residual, with their column-sum backwards (cpu/cpu_elementwise.c's twins). */
#include "cuda/cuda_internal.cuh"

/* ---- elementwise and reductions ---- */

static __global__ void k_fill(float *x, float v, int64_t n) {
    TZ_CUDA_FOR(i, n) x[i] = v;
}
static __global__ void k_scale(float *x, float a, int64_t n) {
    TZ_CUDA_FOR(i, n) x[i] *= a;
}
static __global__ void k_axpy(float *y, float a, const float *x, int64_t n) {
    TZ_CUDA_FOR(i, n) y[i] += a * x[i];
}

static void cuda_fill(tz_backend *be, float *x, float v, int64_t n) { TZ_CUDA_LAUNCH(k_fill, n, x, v, n); }
static void cuda_scale(tz_backend *be, float *x, float a, int64_t n) {
    TZ_CUDA_LAUNCH(k_scale, n, x, a, n);
}
static void cuda_axpy(tz_backend *be, float *y, float a, const float *x, int64_t n) {
    TZ_CUDA_LAUNCH(k_axpy, n, y, a, x, n);
}

/* sumsq: SUMSQ_BLOCKS partial sums (block b takes elements b, b + stride, ... in a fixed
 * pattern), then one block adds them in a fixed tree: the count of blocks depends on nothing
 * but the constant, so the result is the same bits on every run. */
#define SUMSQ_BLOCKS 1024
#define SUMSQ_THREADS 256
static __global__ void k_sumsq_part(double *part, const float *x, int64_t n) {
    double s = 0.0;
    for (int64_t i = (int64_t)blockIdx.x * SUMSQ_THREADS + threadIdx.x; i < n;
         i += (int64_t)SUMSQ_BLOCKS * SUMSQ_THREADS)
        s += (double)x[i] * (double)x[i];
    s = tz_block_sum_d(s);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}
static __global__ void k_sumsq_final(double *out, const double *part) {
    double s = 0.0;
    for (int i = threadIdx.x; i < SUMSQ_BLOCKS; i += SUMSQ_THREADS) s += part[i];
    s = tz_block_sum_d(s);
    if (threadIdx.x == 0) *out = s;
}

static double cuda_sumsq(tz_backend *be, const float *x, int64_t n) {
    if (n <= 0) return 0.0;
    tz_cuda_ctx *c = tz_cuda_ctx_of(be);
    double *part = (double *)tz_cuda_scratch(be, (SUMSQ_BLOCKS + 1) * sizeof(double));
    k_sumsq_part<<<SUMSQ_BLOCKS, SUMSQ_THREADS, 0, c->stream>>>(part, x, n);
    CUDA_LAUNCHED();
    k_sumsq_final<<<1, SUMSQ_THREADS, 0, c->stream>>>(part + SUMSQ_BLOCKS, part);
    CUDA_LAUNCHED();
    CUDA_CHECK(cudaMemcpyAsync(c->host_d, part + SUMSQ_BLOCKS, sizeof(double),
                               cudaMemcpyDeviceToHost, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    return *c->host_d;
}

/* AdamW, one element per thread: tz_adamw_elem (the CPU's arithmetic), with the compiler's
 * contractions (fused multiply-adds) the only difference. */
static __global__ void k_adamw(float *w, float *m, float *v, const float *g,
                               const uint8_t *decay, int64_t n, tz_adamw_args a) {
    TZ_CUDA_FOR(i, n) tz_adamw_elem(&w[i], &m[i], &v[i], g[i], decay == NULL || decay[i], &a);
}
static void cuda_adamw(tz_backend *be, float *w, float *m, float *v, const float *g,
                       const uint8_t *decay, int64_t n, const tz_adamw_args *a) {
    if (n <= 0) return;
    TZ_CUDA_LAUNCH(k_adamw, n, w, m, v, g, decay, n, *a);
}

/* ---- column sums of [B, T, C] products (functors for tz_cuda_colsum) ---- */

struct colsum_a { /* a[b,t,c] */
    const float *a;
    int64_t T, C;
    __device__ double operator()(int64_t b, int64_t t, int64_t c) const {
        return (double)a[(b * T + t) * C + c];
    }
};
struct colsum_aw { /* a[b,t,c] * w[b,t,c], the product rounded to float as on the CPU */
    const float *a, *w;
    int64_t T, C;
    __device__ double operator()(int64_t b, int64_t t, int64_t c) const {
        int64_t i = (b * T + t) * C + c;
        return (double)(a[i] * w[i]);
    }
};

/* ---- modulate and gated residual ---- */

template <class O>
static __global__ void k_modulate_fwd(O *out, const float *x, const float *shift,
                                      const float *scale, int64_t ld, int64_t T, int64_t C,
                                      int64_t n) {
    TZ_CUDA_FOR(i, n) {
        int64_t r = i / C, c = i % C, b = r / T;
        tz_put(out + i, x[i] * (1.0f + scale[b * ld + c]) + shift[b * ld + c]);
    }
}
static __global__ void k_scaled_add(float *dx, const float *dout, const float *s, float one,
                                    int64_t ld, int64_t T, int64_t C, int64_t n, int acc) {
    /* dx += dout * (one + s[b, c]); acc 0: dx = ..., not read */
    TZ_CUDA_FOR(i, n) {
        int64_t r = i / C, c = i % C, b = r / T;
        dx[i] = (acc ? dx[i] : 0.0f) + dout[i] * (one + s[b * ld + c]);
    }
}
/* k_scaled_add's acc 0, written in bf16 (the same sum, rounded as to_bf16 rounds) */
static __global__ void k_scaled_set16(uint16_t *dx, const float *dout, const float *s, float one,
                                      int64_t ld, int64_t T, int64_t C, int64_t n) {
    TZ_CUDA_FOR(i, n) {
        int64_t r = i / C, c = i % C, b = r / T;
        dx[i] = tz_bf16_bits(0.0f + dout[i] * (one + s[b * ld + c]));
    }
}

static void cuda_modulate_fwd(tz_backend *be, float *out, const float *x, const float *shift,
                              const float *scale, int64_t ld, int64_t B, int64_t T, int64_t C,
                              int out_bf16) {
    int64_t n = B * T * C;
    if (out_bf16)
        TZ_CUDA_LAUNCH(k_modulate_fwd<uint16_t>, n, (uint16_t *)(void *)out, x, shift, scale, ld,
                       T, C, n);
    else TZ_CUDA_LAUNCH(k_modulate_fwd<float>, n, out, x, shift, scale, ld, T, C, n);
}

static void cuda_modulate_bwd(tz_backend *be, float *dx, float *dshift, float *dscale,
                              const float *dout, const float *x, const float *scale, int64_t ld,
                              int64_t B, int64_t T, int64_t C, int accumulate) {
    int64_t n = B * T * C;
    if (dx) TZ_CUDA_LAUNCH(k_scaled_add, n, dx, dout, scale, 1.0f, ld, T, C, n, accumulate);
    if (dshift) tz_cuda_colsum(be, dshift, ld, colsum_a{dout, T, C}, B, T, C);
    if (dscale) tz_cuda_colsum(be, dscale, ld, colsum_aw{dout, x, T, C}, B, T, C);
}

static __global__ void k_gate_fwd(float *out, const float *x, const float *y, const float *gate,
                                  int64_t ld, int64_t T, int64_t C, int64_t n) {
    TZ_CUDA_FOR(i, n) {
        int64_t r = i / C, c = i % C, b = r / T;
        out[i] = x[i] + gate[b * ld + c] * y[i];
    }
}

static void cuda_gate_fwd(tz_backend *be, float *out, const float *x, const float *y,
                          const float *gate, int64_t ld, int64_t B, int64_t T, int64_t C) {
    int64_t n = B * T * C;
    TZ_CUDA_LAUNCH(k_gate_fwd, n, out, x, y, gate, ld, T, C, n);
}

static void cuda_gate_bwd(tz_backend *be, float *dy, float *dgate, const float *dout,
                          const float *y, const float *gate, int64_t ld, int64_t B, int64_t T,
                          int64_t C, int accumulate) {
    int64_t n = B * T * C;
    if (dy && accumulate == 2)
        TZ_CUDA_LAUNCH(k_scaled_set16, n, (uint16_t *)(void *)dy, dout, gate, 0.0f, ld, T, C, n);
    else if (dy) TZ_CUDA_LAUNCH(k_scaled_add, n, dy, dout, gate, 0.0f, ld, T, C, n, accumulate);
    if (dgate) tz_cuda_colsum(be, dgate, ld, colsum_aw{dout, y, T, C}, B, T, C);
}

/* ---- bias ---- */

static __global__ void k_bias_add(float *y, const float *bias, int64_t C, int64_t n) {
    TZ_CUDA_FOR(i, n) y[i] += bias[i % C];
}

static void cuda_bias_add_fwd(tz_backend *be, float *y, const float *bias, int64_t rows,
                              int64_t C) {
    int64_t n = rows * C;
    if (n > 0) TZ_CUDA_KERNEL_READS(be, bias, (size_t)C * sizeof *bias, "bias");
    TZ_CUDA_LAUNCH(k_bias_add, n, y, bias, C, n);
}

/* colsum_a that also writes each element it reads rounded to bf16 (the column sum's first
 * stage reads every element once) */
struct colsum_a16 {
    const float *a;
    uint16_t *a16;
    int64_t T, C;
    __device__ double operator()(int64_t b, int64_t t, int64_t c) const {
        const int64_t i = (b * T + t) * C + c;
        const float v = a[i];
        a16[i] = tz_bf16_bits(v);
        return (double)v;
    }
};

static void cuda_bias_bwd(tz_backend *be, float *dbias, const float *dy, int64_t rows, int64_t C,
                          uint16_t *dy16) {
    if (dy16) tz_cuda_colsum(be, dbias, 0, colsum_a16{dy, dy16, rows, C}, 1, rows, C);
    else tz_cuda_colsum(be, dbias, 0, colsum_a{dy, rows, C}, 1, rows, C);
}

static __global__ void k_to_bf16(__nv_bfloat16 *dst, const float *src, int64_t n) {
    TZ_CUDA_FOR(i, n) dst[i] = __float2bfloat16_rn(src[i]);
}
static __global__ void k_from_bf16(float *dst, const uint16_t *src, int64_t n) {
    TZ_CUDA_FOR(i, n) dst[i] = __uint_as_float((unsigned)src[i] << 16);
}

void tz_cuda_to_bf16(tz_backend *be, uint16_t *dst, const float *src, int64_t n) {
    TZ_CUDA_LAUNCH(k_to_bf16, n, (__nv_bfloat16 *)dst, src, n);
}

void tz_cuda_from_bf16(tz_backend *be, float *dst, const uint16_t *src, int64_t n) {
    TZ_CUDA_LAUNCH(k_from_bf16, n, dst, src, n);
}

void tz_cuda_install_elementwise(tz_backend *be) {
    be->fill = cuda_fill;
    be->scale = cuda_scale;
    be->axpy = cuda_axpy;
    be->to_bf16 = tz_cuda_to_bf16;
    be->from_bf16 = tz_cuda_from_bf16;
    be->sumsq = cuda_sumsq;
    be->adamw = cuda_adamw;
    be->modulate_fwd = cuda_modulate_fwd;
    be->modulate_bwd = cuda_modulate_bwd;
    be->gate_fwd = cuda_gate_fwd;
    be->gate_bwd = cuda_gate_bwd;
    be->bias_add_fwd = cuda_bias_add_fwd;
    be->bias_bwd = cuda_bias_bwd;
}
