/* Shared state, error checks and small device helpers of the CUDA backend, between its .cu
 * files (one per op family, mirroring src/cpu/). Not a public interface: the program reaches
 * these ops through tz_backend (core/backend.h). Only cuda/ includes CUDA headers.
 *
 * Conventions of every op here: fp32 tensors in device memory, the shapes and contracts of
 * core/backend.h; every kernel runs on the backend's one stream (ctx->stream), so ops are
 * ordered among themselves and with upload/download/copy; results are reproducible bit for
 * bit on one GPU and one shape (no atomics: every output element has one writer, and the
 * reductions split their work by shape only, never by the device's size). */
#ifndef TZ_CUDA_INTERNAL_CUH
#define TZ_CUDA_INTERNAL_CUH
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "core/backend.h"
#include "core/error.h"
}

/* CUDA_CHECK(call) / CUBLAS_CHECK(call): a failing runtime or cuBLAS call into the one fatal
 * path (TZ_FATAL: message, then every rank aborts), with the call and the library's text. */
#define CUDA_CHECK(call)                                                                      \
    do {                                                                                      \
        cudaError_t tz_cu_rc_ = (call);                                                       \
        if (tz_cu_rc_ != cudaSuccess)                                                         \
            TZ_FATAL("%s failed: %s (%s)", #call, cudaGetErrorString(tz_cu_rc_),              \
                     cudaGetErrorName(tz_cu_rc_));                                            \
    } while (0)
#define CUBLAS_CHECK(call)                                                                    \
    do {                                                                                      \
        cublasStatus_t tz_cb_rc_ = (call);                                                    \
        if (tz_cb_rc_ != CUBLAS_STATUS_SUCCESS)                                               \
            TZ_FATAL("%s failed: %s (%s)", #call, cublasGetStatusString(tz_cb_rc_),           \
                     cublasGetStatusName(tz_cb_rc_));                                         \
    } while (0)
/* NCCL_CHECK(call): a failing NCCL call (cuda/cuda_comm_nccl.cu, which loads the library
 * with dlopen and declares the few types it uses) into the same fatal path, with NCCL's own
 * text for the result; `tz_nccl_error_string` is that file's pointer to ncclGetErrorString. */
typedef int tz_nccl_result; /* ncclResult_t: 0 is ncclSuccess */
const char *tz_nccl_error_string(tz_nccl_result rc);
#define NCCL_CHECK(call)                                                                      \
    do {                                                                                      \
        int tz_nc_rc_ = (int)(call);                                                          \
        if (tz_nc_rc_ != 0)                                                                   \
            TZ_FATAL("%s failed: %s (ncclResult_t %d)", #call,                                \
                     tz_nccl_error_string((tz_nccl_result)tz_nc_rc_), tz_nc_rc_);             \
    } while (0)
/* After a kernel launch: launch errors (bad configuration) at once. Faults inside kernels
 * surface at the next synchronising call (download, sync, sumsq). */
#define CUDA_LAUNCHED() CUDA_CHECK(cudaGetLastError())
/* A kernel about to be launched on be's compute stream reads [p, p + bytes) of memory another
 * stream may have written (a weight streamed in on the copy stream): on the CPU emulation the
 * read is checked for stream order, as copies are; on a GPU nothing is done. */
#ifdef TZ_CUDA_EMULATION
#define TZ_CUDA_KERNEL_READS(be, p, bytes, kernel)                                            \
    CUDA_CHECK(tz_emu_kernel_reads(tz_cuda_stream(be), (p), (bytes), (kernel)))
#else
#define TZ_CUDA_KERNEL_READS(be, p, bytes, kernel) ((void)0)
#endif
/* The same on a given stream, and a kernel's writes (a kernel on a side stream writing what
 * the compute stream then reads: tq_matmul's decode, cuda_quant.cu); cudaSuccess on a GPU. */
static inline cudaError_t tz_cuda_kernel_reads(cudaStream_t s, const void *p, size_t bytes,
                                               const char *kernel) {
#ifdef TZ_CUDA_EMULATION
    return tz_emu_kernel_reads(s, p, bytes, kernel);
#else
    (void)s, (void)p, (void)bytes, (void)kernel;
    return cudaSuccess;
#endif
}
static inline cudaError_t tz_cuda_kernel_writes(cudaStream_t s, void *p, size_t bytes,
                                                const char *kernel) {
#ifdef TZ_CUDA_EMULATION
    return tz_emu_kernel_writes(s, p, bytes, kernel);
#else
    (void)s, (void)p, (void)bytes, (void)kernel;
    return cudaSuccess;
#endif
}

/* A table of pointer -> size for live_bytes (cudaMalloc does not say a block's size). Open
 * addressing, linear probing, tombstones; grown when 3/4 full. */
typedef struct tz_cuda_sizes {
    void **key;
    size_t *bytes;
    int64_t cap, used; /* used counts live entries and tombstones */
} tz_cuda_sizes;

/* Host-made tables the ops cache on the device: RoPE cos/sin for (T, D, theta) and the
 * TurboQuant signs of a row for (seed, cols, group). */
typedef struct tz_cuda_rope_cache {
    float *cs, *sn; /* [T, D/2] each, device */
    int64_t T, D;
    float theta;
} tz_cuda_rope_cache;
/* The rotation's signs per (seed, cols, group) a model uses: made on first use and kept
 * until the backend ends (a model has a handful: one per distinct input width), so that no
 * step after the first allocates, frees or synchronises for them. */
typedef struct tz_cuda_sign_entry {
    float *s; /* [cols] device */
    uint64_t seed;
    int64_t cols;
    int group;
} tz_cuda_sign_entry;
typedef struct tz_cuda_sign_cache {
    tz_cuda_sign_entry *e;
    int n, cap;
} tz_cuda_sign_cache;

#define TZ_CUDA_PARTS 32 /* named parts of ops that TZ_CUDA_OP_TIMES times (tz_cuda_part) */
struct tz_cuda_op_time {
    const char *name;
    long calls;
    double gpu_ms;  /* compute stream, event to event around the op */
    double wall_ms; /* host clock, until both streams are done */
};

typedef struct tz_cuda_ctx {
    int device;
    cudaStream_t stream;      /* TZ_QUEUE_COMPUTE: every op */
    cudaStream_t copy_stream; /* TZ_QUEUE_COPY: the async copies, and the NCCL comm's ops */
    cudaStream_t dec_stream;  /* tq_matmul's decode in chunks (cuda_quant.cu), joined back to
                               * stream by events within the op */
    cudaEvent_t dec_start, dec_ready[2], dec_free[2];
    cublasHandle_t cublas;
    void *scratch;       /* ops' device scratch (not in live_bytes), grown on demand */
    size_t scratch_cap;
    void *gemm16;        /* the bf16 GEMM's rounded operands (cuda_matmul.cu), apart from */
    size_t gemm16_cap;   /* scratch, which may hold an operand of the same GEMM */
    unsigned *narrow_count; /* the narrow GEMM's tickets, one per block row (cuda_narrow.cu): */
    int64_t narrow_count_n; /* zero between its launches (its last block of a row resets it) */
    cudaEvent_t zeroed;  /* alloc's zeroing on stream, which copy_stream waits for */
    double *host_d;      /* pinned host double, for sumsq's result */
    tz_cuda_sizes sizes;
    tz_cuda_sizes pinned; /* host buffers host_register pinned -> bytes */
    int pin_warned;       /* a refused host_register was reported */
    int sync_debug;       /* TZ_CUDA_SYNC_DEBUG: every op synchronised and checked */
    int op_times;         /* TZ_CUDA_OP_TIMES: every op synchronised and timed */
    int op_depth;         /* table entries in progress (an op calling another counts once) */
    cudaEvent_t op_t0, op_t1;
    struct tz_cuda_op_time *times; /* per op of the table, in TZ_BACKEND_OPS order */
    cudaEvent_t part_ev[2];        /* tz_cuda_part's marks, in turn */
    int part_last;                 /* -1: the op's start (op_t0) is its last mark, else part_ev[i] */
    struct tz_cuda_op_time parts[TZ_CUDA_PARTS]; /* by name, in order of first use */
    int nparts;
    double times_t0;      /* the host clock at the first timed op */
    tz_backend *ops;      /* then: the table's own ops, which the wrappers call */
    tz_cuda_rope_cache rope;
    tz_cuda_sign_cache signs;
    char name[320];      /* the device's name, for messages */
    size_t smem_optin;   /* the most dynamic shared memory a block may opt in to */
    size_t smem_sm;      /* shared memory a multiprocessor has for its blocks */
} tz_cuda_ctx;

static inline tz_cuda_ctx *tz_cuda_ctx_of(tz_backend *be) { return (tz_cuda_ctx *)be->ctx; }
static inline cudaStream_t tz_cuda_stream(tz_backend *be) { return tz_cuda_ctx_of(be)->stream; }

/* TZ_CUDA_OP_TIMES: the GPU time of an op's launches since its start or its last part,
 * counted under `name` (a string literal, e.g. "attention_bwd: k_fa_dq"), reported beside the
 * op table: where a many-kernel op's time goes. Nothing without the mode. */
void tz_cuda_part(tz_backend *be, const char *name);

/* Device scratch of at least `bytes` (256-aligned), valid until the next call; the previous
 * contents are lost when it grows. Ops use it between their own kernels on the stream. */
void *tz_cuda_scratch(tz_backend *be, size_t bytes);

/* TZ_CUDA_SYNC_DEBUG: after `op`, cudaGetLastError and a synchronisation of both streams;
 * any error is fatal, naming op (cuda_backend.cu wraps every op of the table with it; the
 * NCCL comm calls it after each collective). Nothing when the mode is off. */
void tz_cuda_sync_check(tz_backend *be, const char *op);

/* Launch geometry of elementwise kernels: 256 threads, a grid-stride loop over n, at most
 * TZ_CUDA_MAX_BLOCKS blocks (the grid changes which thread does an element, never a result). */
#define TZ_CUDA_THREADS 256
#define TZ_CUDA_MAX_BLOCKS 65535
static inline unsigned tz_cuda_blocks(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    return (unsigned)(b < TZ_CUDA_MAX_BLOCKS ? b : TZ_CUDA_MAX_BLOCKS);
}
/* An elementwise kernel over n elements on be's stream (nothing when n <= 0), in the geometry
 * above; `be` must be in scope. */
#define TZ_CUDA_LAUNCH(kernel, n, ...)                                                        \
    do {                                                                                      \
        if ((n) > 0) {                                                                        \
            kernel<<<tz_cuda_blocks((n), TZ_CUDA_THREADS), TZ_CUDA_THREADS, 0,                \
                     tz_cuda_stream(be)>>>(__VA_ARGS__);                                      \
            CUDA_LAUNCHED();                                                                  \
        }                                                                                     \
    } while (0)
#define TZ_CUDA_FOR(i, n)                                                                     \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                 \
         i += (int64_t)gridDim.x * blockDim.x)

/* One float as bf16 bits (nearest even, as to_bf16 rounds). */
__device__ __forceinline__ uint16_t tz_bf16_bits(float x) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}
/* An output element: fp32, or bf16 bits rounded as to_bf16 rounds (kernels templated on the
 * type they write). */
__device__ __forceinline__ void tz_put(float *p, float v) { *p = v; }
__device__ __forceinline__ void tz_put(uint16_t *p, float v) { *p = tz_bf16_bits(v); }
/* An input element: fp32, or bf16 bits widened exactly (kernels templated on the type they
 * read). */
__device__ __forceinline__ float tz_get(const float *p) { return *p; }
__device__ __forceinline__ float tz_get(const uint16_t *p) {
    return __uint_as_float((unsigned)*p << 16);
}
/* SwiGLU's value silu(g) * u, as every kernel that makes it computes it (swiglu_fwd,
 * swiglu_rot16_at: the same bits) */
__device__ __forceinline__ float tz_silu_mul(float g, float u) {
    return g * (1.0f / (1.0f + expf(-g))) * u;
}

/* Block-wide reductions in a fixed tree (warp shuffles, then the warps' partials in order):
 * the same inputs give the same bits every time. blockDim.x a multiple of 32, at most 1024;
 * every thread of the block calls them and gets the result. */
__device__ __forceinline__ double tz_warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float tz_warp_sum_f(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float tz_warp_max_f(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ double tz_block_sum_d(double v) {
    __shared__ double part[32];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = tz_warp_sum_d(v);
    __syncthreads(); /* part may still be read by a previous call */
    if (lane == 0) part[w] = v;
    __syncthreads();
    v = lane < nw ? part[lane] : 0.0;
    return tz_warp_sum_d(v);
}
__device__ __forceinline__ float tz_block_max_f(float v) {
    __shared__ float part[32];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = tz_warp_max_f(v);
    __syncthreads();
    if (lane == 0) part[w] = v;
    __syncthreads();
    v = lane < nw ? part[lane] : -INFINITY;
    return tz_warp_max_f(v);
}

/* Column sums of the parameter-like gradients, deterministic without atomics:
 *   dst[b*ld + c] += (float) sum_{t<T} f(b, t, c), in double,
 * for b < B, c < C. Stage 1 sums fixed chunks of t (chunk count from T alone) into a
 * double scratch; stage 2 adds the chunks in order. F is a device functor
 * `double operator()(int64_t b, int64_t t, int64_t c) const`. */
#define TZ_CUDA_COLSUM_CHUNK 64
template <class F>
__global__ void tz_colsum_stage1(double *part, F f, int64_t T, int64_t C, int64_t nch) {
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t ch = blockIdx.y, b = blockIdx.z;
    if (c >= C) return;
    int64_t t0 = ch * TZ_CUDA_COLSUM_CHUNK, t1 = t0 + TZ_CUDA_COLSUM_CHUNK < T ? t0 + TZ_CUDA_COLSUM_CHUNK : T;
    double acc = 0.0;
    for (int64_t t = t0; t < t1; t++) acc += f(b, t, c);
    part[(b * nch + ch) * C + c] = acc;
}
static __global__ void tz_colsum_stage2(float *dst, int64_t ld, const double *part, int64_t B,
                                        int64_t C, int64_t nch) {
    TZ_CUDA_FOR(i, B * C) {
        int64_t b = i / C, c = i % C;
        double acc = 0.0;
        for (int64_t ch = 0; ch < nch; ch++) acc += part[(b * nch + ch) * C + c];
        dst[b * ld + c] += (float)acc;
    }
}
template <class F>
static void tz_cuda_colsum(tz_backend *be, float *dst, int64_t ld, F f, int64_t B, int64_t T,
                           int64_t C) {
    if (B <= 0 || C <= 0 || T <= 0) return;
    int64_t nch = (T + TZ_CUDA_COLSUM_CHUNK - 1) / TZ_CUDA_COLSUM_CHUNK;
    if (nch > 65535 || B > 65535)
        TZ_FATAL("column sum: %lld rows in %lld batches is beyond this kernel's grid",
                 (long long)T, (long long)B);
    double *part = (double *)tz_cuda_scratch(be, (size_t)(B * nch * C) * sizeof(double));
    dim3 grid((unsigned)((C + 127) / 128), (unsigned)nch, (unsigned)B);
    tz_colsum_stage1<<<grid, 128, 0, tz_cuda_stream(be)>>>(part, f, T, C, nch);
    CUDA_LAUNCHED();
    tz_colsum_stage2<<<tz_cuda_blocks(B * C, 256), 256, 0, tz_cuda_stream(be)>>>(dst, ld, part,
                                                                                 B, C, nch);
    CUDA_LAUNCHED();
}

/* dst[i] = bf16(src[i]) (bit patterns; round to nearest even, NaN stays NaN) and back (exact),
 * n elements on the backend's stream: the to_bf16 / from_bf16 ops (cuda_elementwise.cu). */
void tz_cuda_to_bf16(tz_backend *be, uint16_t *dst, const float *src, int64_t n);
void tz_cuda_from_bf16(tz_backend *be, float *dst, const uint16_t *src, int64_t n);

/* The GEMM behind matmul (cuda_matmul.cu), C[M,N] = alpha op(A) op(B) + beta C with matmul's
 * conventions, where either operand may already be bf16 (a_bf16 / b_bf16: the pointer holds
 * bf16 elements, as a decoded quantized tile does); fp32 operands are rounded to bf16 first
 * when be->matmul_dtype is TZ_DT_BF16. A bf16 operand with fp32 GEMMs is fatal. */
void tz_cuda_gemm(tz_backend *be, float *C, const void *A, int a_bf16, const void *B, int b_bf16,
                  int64_t M, int64_t N, int64_t K, int transA, int transB, float alpha,
                  float beta);

/* C[M,N] (rows at stride ldc) = alpha A op(B) + beta C with both operands bf16 and rows at a
 * stride: A [M, K] at lda elements a row; B [N, K] (transB) or [K, N] at ldb (a product over a
 * part of a wider buffer: tq_matmul's chunks, tq_matmul_lora's columns). bf16 GEMMs only. */
void tz_cuda_gemm16_ld(tz_backend *be, float *C, int64_t ldc, const uint16_t *A, int64_t lda,
                       const uint16_t *B, int64_t ldb, int transB, int64_t M, int64_t N,
                       int64_t K, float alpha, float beta);
/* The same with C in bf16 bits, the fp32 result rounded by the GEMM's epilogue (beta then
 * reads C as bf16: the callers give 0). */
void tz_cuda_gemm16_ld_c16(tz_backend *be, uint16_t *C, int64_t ldc, const uint16_t *A,
                           int64_t lda, const uint16_t *B, int64_t ldb, int transB, int64_t M,
                           int64_t N, int64_t K, float alpha, float beta);
/* The bf16 GEMM's own device buffer of at least `bytes` (cuda_matmul.cu): where fp32 operands
 * are rounded to, and the narrow kernels' workspace (cuda_narrow.cu), apart from the ops'
 * scratch, which may hold an operand of the same GEMM. Valid until the next call. */
void *tz_cuda_gemm_operands(tz_backend *be, size_t bytes);
/* Fatal when the fp32 operand p (n elements) overlaps [dst, dst + bytes), where an operand is
 * rounded to: the conversion would overwrite what it, or the other operand, still reads. */
static inline void tz_cuda_check_apart(const void *p, int64_t n, const void *dst, size_t bytes,
                                       const char *which) {
    const char *a = (const char *)p, *d = (const char *)dst;
    if (n > 0 && a < d + bytes && d < a + (size_t)n * sizeof(float))
        TZ_FATAL("matmul: operand %s lies in the buffer the bf16 operands are rounded into", which);
}
/* tz_cuda_gemm's narrow path (cuda_narrow.cu; core/backend.h's tz_narrow_plan): 1 where it
 * took the product, 0 where the GEMM library should. */
int tz_cuda_narrow_gemm(tz_backend *be, float *C, const void *A, int a16, const void *B,
                        int b16, int64_t M, int64_t N, int64_t K, int ta, int tb, float alpha,
                        float beta);
/* tq_matmul's and tq_matmul_lora's product in one kernel where at most TZ_NARROW_MAXR rows
 * multiply a TurboQuant weight W [rows, cols] (core/backend.h's tz_tq_fused_plan;
 * cuda_narrow.cu): W's codes decoded on their way into shared memory, never written out.
 * transW = 1: C [M, rows] = alpha [A] [W | s B | b | 0]^T + beta C, A bf16 (a16) or fp32 [M,
 * ld], LoRA's and the bias's columns after cols (B NULL, r 0: none; bias NULL: none; the
 * padding to ld zeros); transW = 0 (ld = cols, no B or bias): C [M, cols] = alpha A W + beta
 * C, A [M, rows]. c16: C in bf16 bits. 1: done; 0: not a shape it takes (the caller decodes
 * and multiplies). */
int tz_cuda_narrow_tq(tz_backend *be, void *C, int c16, const void *A, int a16,
                      const uint8_t *codes, const uint16_t *scales, const float *levels,
                      int64_t rows, int64_t cols, int64_t ld, int bits, int group,
                      const float *B, int64_t r, float s, const float *bias, int64_t M,
                      int transW, float alpha, float beta);
/* dst[row * ld + cols + j], j < ld - cols, for `rows` rows: bf16(s src[row, j]) for j < r
 * (LoRA's columns: B's rows scaled, or h), at j = r where nb bf16(bias[row]) (bias NULL: 1),
 * zeros after (cuda_quant.cu), on stream st. */
void tz_cuda_lora_cols(cudaStream_t st, uint16_t *dst, int64_t ld, int64_t cols,
                       const float *src, int64_t r, float s, int nb, const float *bias,
                       int64_t rows);
/* A [n] fp32 rounded to bf16 into the bf16 GEMM's operand buffer (valid until the next GEMM
 * that rounds an operand), for several GEMMs on it. */
const uint16_t *tz_cuda_gemm_round(tz_backend *be, const float *A, int64_t n);

/* Each family file sets its entries of the table (cuda_backend.c calls them all). */
#define TZ_CUDA_FAMILIES(X)                                                                   \
    X(elementwise) X(norm) X(activation) X(attention) X(matmul) X(loss) X(layout) X(quant)
#define TZ_CUDA_DECLARE_INSTALL(family) void tz_cuda_install_##family(tz_backend *be);
TZ_CUDA_FAMILIES(TZ_CUDA_DECLARE_INSTALL)

#endif
