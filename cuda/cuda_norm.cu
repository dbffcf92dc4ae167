/* CUDA row normalisations: RMSNorm (with weight) and LayerNorm without affine, forward and
 * backward; one block per row, statistics in double (cpu/cpu_norm.c's twins). */
#include "cuda/cuda_internal.cuh"

#define ROW_THREADS 256

static void check_rows(int64_t rows, const char *op) {
    if (rows > 2147483647LL) TZ_FATAL("%s: %lld rows exceed one grid", op, (long long)rows);
}

/* ---- RMSNorm ---- */

static __global__ void k_rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w,
                                     int64_t C, float eps) {
    const float *xr = x + blockIdx.x * C;
    float *o = out + blockIdx.x * C;
    double ss = 0.0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) ss += (double)xr[c] * (double)xr[c];
    ss = tz_block_sum_d(ss);
    float rs = (float)(1.0 / sqrt(ss / (double)C + (double)eps));
    if (threadIdx.x == 0) rstd[blockIdx.x] = rs;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) o[c] = __fmul_rn(xr[c], rs) * w[c];
}

static void cuda_rmsnorm_fwd(tz_backend *be, float *out, float *rstd, const float *x,
                             const float *w, int64_t rows, int64_t C, float eps) {
    if (rows <= 0 || C <= 0) return;
    check_rows(rows, "rmsnorm");
    TZ_CUDA_KERNEL_READS(be, w, (size_t)C * sizeof *w, "rmsnorm weight");
    k_rmsnorm_fwd<<<(unsigned)rows, ROW_THREADS, 0, tz_cuda_stream(be)>>>(out, rstd, x, w, C,
                                                                           eps);
    CUDA_LAUNCHED();
}

/* k_rmsnorm_fwd's statistics and normalised values (the same loop, tree and products), then
 * k_rope_pairs' rotation of each pair at the row's joint position, rounded to bf16: x's row
 * r = (b, t, h) of a stream of Ts tokens into y's row (b, off + t, h) of T. */
static __global__ void k_rms_rope16(uint16_t *y, float *rstd, const float *x, const float *w,
                                    int64_t Ts, int64_t off, int64_t T, int64_t H, int64_t D,
                                    float eps, const float *cs) {
    const int64_t r = blockIdx.x;
    const float *xr = x + r * D;
    double ss = 0.0;
    for (int64_t c = threadIdx.x; c < D; c += blockDim.x) ss += (double)xr[c] * (double)xr[c];
    ss = tz_block_sum_d(ss);
    float rs = (float)(1.0 / sqrt(ss / (double)D + (double)eps));
    if (threadIdx.x == 0) rstd[r] = rs;
    const int64_t h = r % H, bt = r / H, pos = off + bt % Ts, b = bt / Ts;
    uint16_t *yr = y + ((b * T + pos) * H + h) * D;
    const float *tab = cs + pos * D;
    for (int64_t c = 2 * (int64_t)threadIdx.x; c < D; c += 2 * (int64_t)blockDim.x) {
        const float a = __fmul_rn(xr[c], rs) * w[c], bb = __fmul_rn(xr[c + 1], rs) * w[c + 1];
        const float co = tab[c], si = 1.0f * tab[c + 1];
        tz_put(yr + c, __fmul_rn(a, co) - __fmul_rn(bb, si));
        tz_put(yr + c + 1, __fmul_rn(bb, co) + __fmul_rn(a, si));
    }
}

static void cuda_rms_rope_pairs16(tz_backend *be, uint16_t *y, float *rstd, const float *x,
                                  const float *w, int64_t B, int64_t Ts, int64_t off, int64_t T,
                                  int64_t H, int64_t D, float eps, const float *cs) {
    if (D % 2 != 0) TZ_FATAL("rope needs an even head dimension, got D=%lld", (long long)D);
    if (off < 0 || off + Ts > T)
        TZ_FATAL("rms_rope_pairs16: tokens [%lld, %lld) outside a sequence of %lld",
                 (long long)off, (long long)(off + Ts), (long long)T);
    const int64_t rows = B * Ts * H;
    if (rows <= 0 || D <= 0) return;
    check_rows(rows, "rms_rope_pairs16");
    TZ_CUDA_KERNEL_READS(be, w, (size_t)D * sizeof *w, "rmsnorm weight");
    k_rms_rope16<<<(unsigned)rows, ROW_THREADS, 0, tz_cuda_stream(be)>>>(y, rstd, x, w, Ts, off,
                                                                         T, H, D, eps, cs);
    CUDA_LAUNCHED();
}

/* dx += r * (g - x * r^2 * mean(g*x)), g = dout * w. */
static __global__ void k_rmsnorm_bwd_dx(float *dx, const float *dout, const float *x,
                                        const float *w, const float *rstd, int64_t C, int acc) {
    const float *xr = x + blockIdx.x * C, *gr = dout + blockIdx.x * C;
    float *d = dx + blockIdx.x * C;
    float rs = rstd[blockIdx.x];
    double dot = 0.0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
        dot += (double)__fmul_rn(gr[c], w[c]) * (double)xr[c];
    dot = tz_block_sum_d(dot);
    float coef = (float)(dot / (double)C) * rs * rs;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
        d[c] = (acc ? d[c] : 0.0f) + rs * (__fmul_rn(gr[c], w[c]) - __fmul_rn(xr[c], coef));
}

struct rms_dw { /* dout[r,c] * x[r,c] * rstd[r], rounded to float as on the CPU */
    const float *dout, *x, *rstd;
    int64_t C;
    __device__ double operator()(int64_t b, int64_t r, int64_t c) const {
        return (double)__fmul_rn(__fmul_rn(dout[r * C + c], x[r * C + c]), rstd[r]);
    }
};

static void cuda_rmsnorm_bwd(tz_backend *be, float *dx, float *dw, const float *dout,
                             const float *x, const float *w, const float *rstd, int64_t rows,
                             int64_t C, int accumulate) {
    if (rows <= 0 || C <= 0) return;
    check_rows(rows, "rmsnorm_bwd");
    TZ_CUDA_KERNEL_READS(be, w, (size_t)C * sizeof *w, "rmsnorm weight");
    k_rmsnorm_bwd_dx<<<(unsigned)rows, ROW_THREADS, 0, tz_cuda_stream(be)>>>(dx, dout, x, w,
                                                                              rstd, C, accumulate);
    CUDA_LAUNCHED();
    if (dw) tz_cuda_colsum(be, dw, 0, rms_dw{dout, x, rstd, C}, 1, rows, C);
}

/* ---- LayerNorm without affine ---- */

static __global__ void k_layernorm_fwd(float *out, float *mean, float *rstd, const float *x,
                                       int64_t C, float eps) {
    const float *xr = x + blockIdx.x * C;
    float *o = out + blockIdx.x * C;
    double s = 0.0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += (double)xr[c];
    double mu = tz_block_sum_d(s) / (double)C;
    double ss = 0.0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
        ss += ((double)xr[c] - mu) * ((double)xr[c] - mu);
    ss = tz_block_sum_d(ss);
    float m = (float)mu, rs = (float)(1.0 / sqrt(ss / (double)C + (double)eps));
    if (threadIdx.x == 0) {
        mean[blockIdx.x] = m;
        rstd[blockIdx.x] = rs;
    }
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) o[c] = (xr[c] - m) * rs;
}

static void cuda_layernorm_fwd(tz_backend *be, float *out, float *mean, float *rstd,
                               const float *x, int64_t rows, int64_t C, float eps) {
    if (rows <= 0 || C <= 0) return;
    check_rows(rows, "layernorm");
    k_layernorm_fwd<<<(unsigned)rows, ROW_THREADS, 0, tz_cuda_stream(be)>>>(out, mean, rstd, x,
                                                                             C, eps);
    CUDA_LAUNCHED();
}

/* dx += rstd * (g - mean(g) - xhat * mean(g * xhat)), xhat = (x - mean) * rstd. */
static __global__ void k_layernorm_bwd(float *dx, const float *dout, const float *x,
                                       const float *mean, const float *rstd, int64_t C) {
    const float *xr = x + blockIdx.x * C, *g = dout + blockIdx.x * C;
    float *d = dx + blockIdx.x * C;
    float m = mean[blockIdx.x], rs = rstd[blockIdx.x];
    double sg = 0.0, sgx = 0.0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        sg += (double)g[c];
        sgx += (double)g[c] * (double)((xr[c] - m) * rs);
    }
    sg = tz_block_sum_d(sg);
    sgx = tz_block_sum_d(sgx);
    float mg = (float)(sg / (double)C), mgx = (float)(sgx / (double)C);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
        d[c] += rs * (g[c] - mg - (xr[c] - m) * rs * mgx);
}

static void cuda_layernorm_bwd(tz_backend *be, float *dx, const float *dout, const float *x,
                               const float *mean, const float *rstd, int64_t rows, int64_t C) {
    if (rows <= 0 || C <= 0) return;
    check_rows(rows, "layernorm_bwd");
    k_layernorm_bwd<<<(unsigned)rows, ROW_THREADS, 0, tz_cuda_stream(be)>>>(dx, dout, x, mean,
                                                                             rstd, C);
    CUDA_LAUNCHED();
}

void tz_cuda_install_norm(tz_backend *be) {
    be->rmsnorm_fwd = cuda_rmsnorm_fwd;
    be->rmsnorm_bwd = cuda_rmsnorm_bwd;
    be->rms_rope_pairs16 = cuda_rms_rope_pairs16;
    be->layernorm_fwd = cuda_layernorm_fwd;
    be->layernorm_bwd = cuda_layernorm_bwd;
}
