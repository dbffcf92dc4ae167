/* CUDA ops of quantized weights: per-group rotation of activation rows (forward and inverse,
 * accumulating) and decoding packed codes into a dense tile (cpu/cpu_quant.c's twins; the
 * layout is quant/tq_layout.h's, shared with the host). */
#include <cuda_bf16.h>
#include <math.h>

#include "cuda/cuda_internal.cuh"
extern "C" {
#include "quant/fwht.h"
}
#include "quant/tq_layout.h"

static void check_rows(int64_t rows, int64_t cols, int group, const char *op) {
    char err[200];
    if (rows < 0 || tz_tq_check_shape(cols, group, err, sizeof err))
        TZ_FATAL("%s: rows %lld: %s", op, (long long)rows, err);
}

/* The signs of one row, [cols] on the device, made on the host by the rule of tq_layout.h and
 * kept in a small cache keyed by (seed, cols, group). */
static const float *row_signs(tz_backend *be, int64_t rows, int64_t cols, int group,
                              uint64_t seed, const char *op) {
    check_rows(rows, cols, group, op);
    tz_cuda_ctx *c = tz_cuda_ctx_of(be);
    tz_cuda_sign_cache *sc = &c->signs;
    for (int i = 0; i < TZ_CUDA_SIGN_SLOTS; i++)
        if (sc->s[i] && sc->seed[i] == seed && sc->cols[i] == cols && sc->group[i] == group)
            return sc->s[i];
    int k = sc->next;
    sc->next = (k + 1) % TZ_CUDA_SIGN_SLOTS;
    size_t bytes = (size_t)cols * sizeof(float);
    float *h = (float *)tz_xmalloc(bytes);
    tz_tq_signs_row(seed, cols, group, h);
    CUDA_CHECK(cudaFree(sc->s[k])); /* waits for kernels still reading the old slot */
    sc->s[k] = NULL;
    CUDA_CHECK(cudaMalloc((void **)&sc->s[k], bytes));
    CUDA_CHECK(cudaMemcpyAsync(sc->s[k], h, bytes, cudaMemcpyHostToDevice, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    free(h);
    sc->seed[k] = seed;
    sc->cols[k] = cols;
    sc->group[k] = group;
    return sc->s[k];
}

/* A block holds ROT_FLOATS consecutive elements of one row (ROT_FLOATS / g whole groups; the
 * row's last block may hold fewer, cols being a multiple of g only) in
 * shared memory and runs the Walsh-Hadamard butterflies level by level, h = 1, 2, 4, ...: the
 * same additions on the same values as tz_fwht, so the same bits. One butterfly per thread
 * per level (ROT_FLOATS / 2 threads). */
#define ROT_FLOATS 256
#define ROT_THREADS (ROT_FLOATS / 2)

__device__ void block_fwht(float *v, int g) {
    int b = threadIdx.x;          /* butterfly index within the block */
    int gi = b / (g / 2), k = b % (g / 2);
    float *x = v + gi * g;
    for (int h = 1; h < g; h *= 2) {
        __syncthreads();
        int i = (k / h) * 2 * h + (k % h);
        float a = x[i], c = x[i + h];
        x[i] = a + c;
        x[i + h] = a - c;
    }
    __syncthreads();
}

/* grid.x: chunks of ROT_FLOATS in a row, grid.y: rows. inverse = 0: y = (H (s*x)) * inv,
 * written; inverse = 1: dx += (H dy) * (s * inv). */
static __global__ void k_rotate(float *out, const float *in, const float *signs, int64_t cols,
                                int g, float inv, int inverse) {
    __shared__ float v[ROT_FLOATS];
    int64_t r = blockIdx.y, j0 = (int64_t)blockIdx.x * ROT_FLOATS;
    const float *ir = in + r * cols + j0;
    float *orow = out + r * cols + j0;
    const float *s = signs + j0;
    /* the last block of a row may hold fewer groups: the rest is zeros, never stored */
    int nv = cols - j0 < ROT_FLOATS ? (int)(cols - j0) : ROT_FLOATS;
    for (int e = threadIdx.x; e < ROT_FLOATS; e += blockDim.x)
        v[e] = e >= nv ? 0.0f : inverse ? ir[e] : s[e] * ir[e];
    block_fwht(v, g); /* begins with a barrier: the loads are done */
    for (int e = threadIdx.x; e < nv; e += blockDim.x) {
        if (inverse) orow[e] += v[e] * (s[e] * inv);
        else orow[e] = v[e] * inv;
    }
}

static void rotate(tz_backend *be, float *out, const float *in, int64_t rows, int64_t cols,
                   int group, uint64_t seed, int inverse, const char *op) {
    const float *s = row_signs(be, rows, cols, group, seed, op);
    if (rows <= 0) return;
    if (rows > 65535) { /* grid.y limit: in slices of rows */
        for (int64_t r0 = 0; r0 < rows; r0 += 65535) {
            int64_t n = rows - r0 < 65535 ? rows - r0 : 65535;
            rotate(be, out + r0 * cols, in + r0 * cols, n, cols, group, seed, inverse, op);
        }
        return;
    }
    const float inv = (float)(1.0 / sqrt((double)group));
    dim3 grid((unsigned)((cols + ROT_FLOATS - 1) / ROT_FLOATS), (unsigned)rows);
    k_rotate<<<grid, ROT_THREADS, 0, tz_cuda_stream(be)>>>(out, in, s, cols, group, inv,
                                                          inverse);
    CUDA_LAUNCHED();
}

static void cuda_tq_rotate(tz_backend *be, float *y, const float *x, int64_t rows, int64_t cols,
                           int group, uint64_t seed) {
    rotate(be, y, x, rows, cols, group, seed, 0, "tq_rotate");
}

static void cuda_tq_rotate_bwd(tz_backend *be, float *dx, const float *dy, int64_t rows,
                               int64_t cols, int group, uint64_t seed) {
    rotate(be, dx, dy, rows, cols, group, seed, 1, "tq_rotate_bwd");
}

/* One thread per weight: group k = e / g, element i = e % g. */
/* One decoded element: fp32, or rounded to bf16 (nearest even) for a bf16 GEMM operand. */
static __device__ __forceinline__ void store_w(float *w, int64_t e, float v) { w[e] = v; }
static __device__ __forceinline__ void store_w(__nv_bfloat16 *w, int64_t e, float v) {
    w[e] = __float2bfloat16_rn(v);
}

template <class T>
static __global__ void k_dequant(T *w, const uint8_t *codes, const uint16_t *scales,
                                 const float *levels, int g, int bits, int64_t gbytes,
                                 int64_t total) {
    TZ_CUDA_FOR(e, total) {
        int64_t k = e / g;
        int i = (int)(e % g);
        unsigned code = tz_tq_code_at(codes + k * gbytes, i, bits);
        float sc = __uint_as_float((unsigned)scales[k] << 16); /* bf16 bits -> fp32 */
        store_w(w, e, sc * levels[code]);
    }
}

template <class T>
static void dequant(tz_backend *be, T *w, const uint8_t *codes, const uint16_t *scales,
                    const float *levels, int64_t rows, int64_t cols, int bits, int group,
                    const char *op) {
    check_rows(rows, cols, group, op);
    if (bits < 1 || bits > TZ_TQ_MAX_BITS) TZ_FATAL("%s: bits %d out of range", op, bits);
    int64_t total = rows * cols;
    if (total <= 0) return;
    k_dequant<T><<<tz_cuda_blocks(total, TZ_CUDA_THREADS), TZ_CUDA_THREADS, 0,
                   tz_cuda_stream(be)>>>(w, codes, scales, levels, group, bits,
                                         TZ_TQ_GROUP_BYTES(group, bits), total);
    CUDA_LAUNCHED();
}

static void cuda_tq_dequant(tz_backend *be, float *w, const uint8_t *codes,
                            const uint16_t *scales, const float *levels, int64_t rows,
                            int64_t cols, int bits, int group) {
    dequant(be, w, codes, scales, levels, rows, cols, bits, group, "tq_dequant");
}

/* With bf16 GEMMs the weight is decoded straight into bf16 (the tile holds bf16 elements):
 * the same bits matmul would make by rounding the fp32 tile, one pass fewer and no fp32
 * copy. */
static void cuda_tq_matmul(tz_backend *be, float *C, const float *A, float *tile,
                           const uint8_t *codes, const uint16_t *scales, const float *levels,
                           int64_t rows, int64_t cols, int bits, int group, int64_t M,
                           int transW, float alpha, float beta) {
    const int64_t N = transW ? rows : cols, K = transW ? cols : rows;
    if (be->matmul_dtype == TZ_DT_BF16) {
        __nv_bfloat16 *w16 = (__nv_bfloat16 *)tile;
        dequant(be, w16, codes, scales, levels, rows, cols, bits, group, "tq_matmul");
        tz_cuda_gemm(be, C, A, 0, w16, 1, M, N, K, 0, transW, alpha, beta);
    } else {
        dequant(be, tile, codes, scales, levels, rows, cols, bits, group, "tq_matmul");
        tz_cuda_gemm(be, C, A, 0, tile, 0, M, N, K, 0, transW, alpha, beta);
    }
}

void tz_cuda_install_quant(tz_backend *be) {
    be->tq_rotate = cuda_tq_rotate;
    be->tq_rotate_bwd = cuda_tq_rotate_bwd;
    be->tq_dequant = cuda_tq_dequant;
    be->tq_matmul = cuda_tq_matmul;
}
