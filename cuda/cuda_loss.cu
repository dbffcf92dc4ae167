/* CUDA losses: softmax cross-entropy over logits rows (fused, in place allowed; one block per
 * row, the vocabulary in chunks of the block's threads) and the squared error of a prediction
 * against a target, forward and backward (cpu/cpu_loss.c's twins). */
#include "cuda/cuda_internal.cuh"

#define ROW_THREADS 512

/* log-sum-exp of one row by the whole block: max in float, sum of exponentials in double. */
__device__ float row_lse(const float *l, int64_t V) {
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, l[j]);
    m = tz_block_max_f(m);
    double s = 0.0;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) s += (double)expf(l[j] - m);
    s = tz_block_sum_d(s);
    return m + (float)log(s);
}

static __global__ void k_xent_fwd(float *loss, const float *logits, const int32_t *target,
                                  int64_t V) {
    int64_t r = blockIdx.x;
    int32_t t = target[r];
    if (t < 0) { /* the whole block leaves: no barrier is left waiting */
        if (threadIdx.x == 0) loss[r] = 0.0f;
        return;
    }
    const float *l = logits + r * V;
    float lse = row_lse(l, V);
    if (threadIdx.x == 0) loss[r] = lse - l[t];
}

/* dlogits may alias logits: l[t] is read before any write, and every element is read by the
 * thread that writes it, after the row's log-sum-exp (whose barriers follow all its reads). */
static __global__ void k_xent_bwd(float *dlogits, const float *logits, const int32_t *target,
                                  float dloss, int64_t V) {
    int64_t r = blockIdx.x;
    int32_t t = target[r];
    const float *l = logits + r * V;
    float *d = dlogits + r * V;
    if (t < 0) {
        for (int64_t j = threadIdx.x; j < V; j += blockDim.x) d[j] = 0.0f;
        return;
    }
    float lt = l[t];
    float lse = row_lse(l, V);
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x)
        d[j] = j == t ? dloss * (expf(lt - lse) - 1.0f) : dloss * expf(l[j] - lse);
}

static void check_rows(int64_t n, const char *op) {
    if (n > 2147483647LL) TZ_FATAL("%s: %lld rows exceed one grid", op, (long long)n);
}

static void cuda_xent_fwd(tz_backend *be, float *loss, const float *logits,
                          const int32_t *target, int64_t n, int64_t V) {
    if (n <= 0) return;
    check_rows(n, "xent");
    k_xent_fwd<<<(unsigned)n, ROW_THREADS, 0, tz_cuda_stream(be)>>>(loss, logits, target, V);
    CUDA_LAUNCHED();
}

static void cuda_xent_bwd(tz_backend *be, float *dlogits, const float *logits,
                          const int32_t *target, float dloss, int64_t n, int64_t V) {
    if (n <= 0) return;
    check_rows(n, "xent_bwd");
    k_xent_bwd<<<(unsigned)n, ROW_THREADS, 0, tz_cuda_stream(be)>>>(dlogits, logits, target,
                                                                     dloss, V);
    CUDA_LAUNCHED();
}

/* ---- squared error ---- */

static __global__ void k_mse_fwd(float *sse, const float *pred, int64_t ld, const float *target,
                                 int64_t n) {
    const float *p = pred + blockIdx.x * ld, *t = target + blockIdx.x * n;
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        double d = (double)p[i] - (double)t[i];
        s += d * d;
    }
    s = tz_block_sum_d(s);
    if (threadIdx.x == 0) sse[blockIdx.x] = (float)s;
}

static __global__ void k_mse_bwd(float *dpred, const float *pred, int64_t ld,
                                 const float *target, float k, int64_t n, int64_t total) {
    TZ_CUDA_FOR(i, total) {
        int64_t r = i / n, c = i % n;
        dpred[r * ld + c] += k * (pred[r * ld + c] - target[i]);
    }
}

static void cuda_mse_fwd(tz_backend *be, float *sse, const float *pred, int64_t ld,
                         const float *target, int64_t rows, int64_t n) {
    if (rows <= 0) return;
    check_rows(rows, "mse");
    k_mse_fwd<<<(unsigned)rows, 256, 0, tz_cuda_stream(be)>>>(sse, pred, ld, target, n);
    CUDA_LAUNCHED();
}

static void cuda_mse_bwd(tz_backend *be, float *dpred, const float *pred, int64_t ld,
                         const float *target, float dloss, int64_t rows, int64_t n) {
    int64_t total = rows * n;
    if (total <= 0) return;
    k_mse_bwd<<<tz_cuda_blocks(total, TZ_CUDA_THREADS), TZ_CUDA_THREADS, 0,
                tz_cuda_stream(be)>>>(dpred, pred, ld, target, 2.0f * dloss, n, total);
    CUDA_LAUNCHED();
}

void tz_cuda_install_loss(tz_backend *be) {
    be->xent_fwd = cuda_xent_fwd;
    be->xent_bwd = cuda_xent_bwd;
    be->mse_fwd = cuda_mse_fwd;
    be->mse_bwd = cuda_mse_bwd;
}
