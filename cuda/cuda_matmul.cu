/* CUDA matmul C = alpha*op(A)*op(B) + beta*C, row-major operands mapped onto the column-major
 * cuBLAS. be->matmul_dtype chooses the operands' type:
 *   TZ_DT_F32:  SGEMM, fp32 products without TF32 (the handle's pedantic math mode), the
 *               CPU's arithmetic up to the order of the sums;
 *   TZ_DT_BF16: A and B rounded to bf16 (to nearest even) into a buffer of their own, then
 *               cublasGemmEx with bf16 inputs, fp32 accumulation (CUBLAS_COMPUTE_32F) and an
 *               fp32 C: the tensor-core GEMM. Every product of two bf16 values is exact in
 *               fp32, so the error against fp32 operands is the two roundings (relative
 *               2^-8 each) plus the fp32 sums. */
#include <cuda_bf16.h>
#include <limits.h>

#include "cuda/cuda_internal.cuh"

static __global__ void k_scale_only(float *C, float beta, int64_t n) {
    TZ_CUDA_FOR(i, n) C[i] = beta == 0.0f ? 0.0f : beta * C[i];
}

/* Where the fp32 operands of a bf16 GEMM are rounded to (and the narrow kernels' workspace,
 * cuda_narrow.cu): a device buffer of at least `bytes` kept for this alone, not the ops'
 * scratch (tz_cuda_scratch), which may hold an operand of the same GEMM (matmul_bw16 widens
 * its weight there) and which growing would free under it. Grown like the scratch. */
void *tz_cuda_gemm_operands(tz_backend *be, size_t bytes) {
    tz_cuda_ctx *c = tz_cuda_ctx_of(be);
    if (bytes <= c->gemm16_cap) return c->gemm16;
    size_t cap = c->gemm16_cap * 2 > bytes ? c->gemm16_cap * 2 : bytes;
    if (c->gemm16) CUDA_CHECK(cudaFree(c->gemm16)); /* waits for GEMMs still reading it */
    c->gemm16 = NULL;
    c->gemm16_cap = 0;
    cudaError_t rc = cudaMalloc(&c->gemm16, cap);
    if (rc != cudaSuccess)
        TZ_FATAL("out of GPU memory on %s: cannot allocate %zu bytes for a bf16 GEMM's operands "
                 "(%s)", c->name, cap, cudaGetErrorString(rc));
    c->gemm16_cap = cap;
    return c->gemm16;
}

/* An operand element as bf16 bits: a float rounded (nearest even), a bf16 one as it is. */
static __device__ __forceinline__ uint16_t to_bf16_bits(float x) { return tz_bf16_bits(x); }
static __device__ __forceinline__ uint16_t to_bf16_bits(uint16_t x) { return x; }

/* Row-major C[M,N] = op(A) op(B) is column-major C^T[N,M] = op(B)^T op(A)^T, and a row-major
 * [r, c] array is the column-major [c, r] array with leading dimension c. So cuBLAS computes
 * with m = N, n = M, first operand B (stored [K,N] -> N x K col-major, ld N, no transpose;
 * stored [N,K] -> K x N col-major, ld K, transposed) and second operand A (stored [M,K] -> ld
 * K, no transpose; stored [K,M] -> ld M, transposed); ldc = N. */
void tz_cuda_gemm(tz_backend *be, float *C, const void *A, int a_bf16, const void *B, int b_bf16,
                  int64_t M, int64_t N, int64_t K, int transA, int transB, float alpha,
                  float beta) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0 || alpha == 0.0f) { /* C = beta*C; beta == 0 writes zeros (C may be garbage) */
        if (beta != 1.0f) {
            k_scale_only<<<tz_cuda_blocks(M * N, TZ_CUDA_THREADS), TZ_CUDA_THREADS, 0,
                           tz_cuda_stream(be)>>>(C, beta, M * N);
            CUDA_LAUNCHED();
        }
        return;
    }
    if (M > INT_MAX || N > INT_MAX || K > INT_MAX)
        TZ_FATAL("matmul: %lld x %lld x %lld exceeds cuBLAS's int dimensions", (long long)M,
                 (long long)N, (long long)K);
    /* on the emulation: both operands' reads checked for stream order (a weight uploaded on
     * the copy queue must be waited for before a GEMM reads it) */
    TZ_CUDA_KERNEL_READS(be, A, (size_t)(M * K) * (a_bf16 ? 2 : 4), "gemm operand A");
    TZ_CUDA_KERNEL_READS(be, B, (size_t)(K * N) * (b_bf16 ? 2 : 4), "gemm operand B");
    const int bf16 = be->matmul_dtype == TZ_DT_BF16;
    if (!bf16 && (a_bf16 || b_bf16))
        TZ_FATAL("matmul: a bf16 operand with fp32 GEMMs (run.precision = \"fp32\")");
    /* (the operands' reads declared above for either path) */
    if (bf16 && tz_cuda_narrow_gemm(be, C, A, a_bf16, B, b_bf16, M, N, K, transA, transB, alpha, beta))
        return;
    cublasOperation_t opA = transA ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t opB = transB ? CUBLAS_OP_T : CUBLAS_OP_N;
    int lda = (int)(transA ? M : K), ldb = (int)(transB ? K : N);
    cublasHandle_t h = tz_cuda_ctx_of(be)->cublas;
    if (bf16) {
        /* the fp32 operands rounded into disjoint parts of their own buffer (A's part
         * rounded up to 128 elements, so B's starts 256-byte aligned like the buffer) */
        const int64_t na = a_bf16 ? 0 : M * K, nb = b_bf16 ? 0 : K * N;
        const int64_t na_pad = (na + 127) / 128 * 128;
        const void *a16 = A, *b16 = B;
        if (na + nb > 0) {
            const size_t bytes = (size_t)(na_pad + nb) * sizeof(__nv_bfloat16);
            __nv_bfloat16 *s = (__nv_bfloat16 *)tz_cuda_gemm_operands(be, bytes);
            tz_cuda_check_apart(A, na, s, bytes, "A");
            tz_cuda_check_apart(B, nb, s, bytes, "B");
            if (na) tz_cuda_to_bf16(be, (uint16_t *)s, (const float *)A, na), a16 = s;
            if (nb)
                tz_cuda_to_bf16(be, (uint16_t *)(s + na_pad), (const float *)B, nb),
                    b16 = s + na_pad;
        }
        /* the default math mode lets cuBLAS use tensor cores for bf16 inputs (fp32
         * accumulation either way); pedantic mode is restored for the fp32 GEMMs */
        CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
        CUBLAS_CHECK(cublasGemmEx(h, opB, opA, (int)N, (int)M, (int)K, &alpha, b16, CUDA_R_16BF,
                                  ldb, a16, CUDA_R_16BF, lda, &beta, C, CUDA_R_32F, (int)N,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH));
        return;
    }
    /* beta == 0: cuBLAS does not read C (NaN there does not propagate) */
    CUBLAS_CHECK(cublasSgemm(h, opB, opA, (int)N, (int)M, (int)K, &alpha, (const float *)B, ldb,
                             (const float *)A, lda, &beta, C, (int)N));
}

/* tz_cuda_gemm16_ld with C fp32 or (c_bf16) bf16 bits, the fp32 result rounded by the
 * GEMM's epilogue */
static void gemm16_ld(tz_backend *be, void *C, int c_bf16, int64_t ldc, const uint16_t *A,
                      int64_t lda, const uint16_t *B, int64_t ldb, int transB, int64_t M,
                      int64_t N, int64_t K, float alpha, float beta) {
    if (M <= 0 || N <= 0) return;
    if (be->matmul_dtype != TZ_DT_BF16) TZ_FATAL("matmul: strided bf16 operands with fp32 GEMMs");
    const int64_t bcols = transB ? K : N;
    const size_t bspan = (size_t)(((transB ? N : K) - 1) * ldb + bcols) * 2;
    (void)bspan; /* (read only on the emulation) */
    if (M > INT_MAX || N > INT_MAX || K <= 0 || K > INT_MAX || lda > INT_MAX || ldb > INT_MAX ||
        ldc > INT_MAX || lda < K || ldb < bcols || ldc < N)
        TZ_FATAL("matmul: %lld x %lld x %lld at strides %lld, %lld, %lld out of cuBLAS's range",
                 (long long)M, (long long)N, (long long)K, (long long)lda, (long long)ldb,
                 (long long)ldc);
    TZ_CUDA_KERNEL_READS(be, A, (size_t)((M - 1) * lda + K) * 2, "gemm operand A");
    TZ_CUDA_KERNEL_READS(be, B, bspan, "gemm operand B");
    cublasHandle_t h = tz_cuda_ctx_of(be)->cublas;
    CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
    CUBLAS_CHECK(cublasGemmEx(h, transB ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, (int)N, (int)M,
                              (int)K, &alpha, B, CUDA_R_16BF, (int)ldb, A, CUDA_R_16BF, (int)lda,
                              &beta, C, c_bf16 ? CUDA_R_16BF : CUDA_R_32F, (int)ldc,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH));
}
void tz_cuda_gemm16_ld(tz_backend *be, float *C, int64_t ldc, const uint16_t *A, int64_t lda,
                       const uint16_t *B, int64_t ldb, int transB, int64_t M, int64_t N,
                       int64_t K, float alpha, float beta) {
    gemm16_ld(be, C, 0, ldc, A, lda, B, ldb, transB, M, N, K, alpha, beta);
}
void tz_cuda_gemm16_ld_c16(tz_backend *be, uint16_t *C, int64_t ldc, const uint16_t *A,
                           int64_t lda, const uint16_t *B, int64_t ldb, int transB, int64_t M,
                           int64_t N, int64_t K, float alpha, float beta) {
    gemm16_ld(be, C, 1, ldc, A, lda, B, ldb, transB, M, N, K, alpha, beta);
}

const uint16_t *tz_cuda_gemm_round(tz_backend *be, const float *A, int64_t n) {
    const size_t bytes = (size_t)n * sizeof(__nv_bfloat16);
    uint16_t *s = (uint16_t *)tz_cuda_gemm_operands(be, bytes > 0 ? bytes : 1);
    tz_cuda_check_apart(A, n, s, bytes, "A");
    tz_cuda_to_bf16(be, s, A, n);
    return s;
}

static void cuda_matmul(tz_backend *be, float *C, const float *A, const float *B, int64_t M,
                        int64_t N, int64_t K, int transA, int transB, float alpha, float beta) {
    tz_cuda_gemm(be, C, A, 0, B, 0, M, N, K, transA, transB, alpha, beta);
}

/* Either operand in bf16: read by the bf16 GEMM as stored; with fp32 GEMMs widened first
 * (exact), A's part first in the scratch, B's after it at a 256-byte boundary. */
static void cuda_matmul16(tz_backend *be, float *C, const void *A, int a_bf16, const void *B,
                          int b_bf16, int64_t M, int64_t N, int64_t K, int transA, int transB,
                          float alpha, float beta) {
    if (be->matmul_dtype == TZ_DT_BF16 || !(a_bf16 || b_bf16)) {
        tz_cuda_gemm(be, C, A, a_bf16, B, b_bf16, M, N, K, transA, transB, alpha, beta);
        return;
    }
    const int64_t na = a_bf16 ? M * K : 0, nb = b_bf16 ? K * N : 0;
    const int64_t na_pad = (na + 63) / 64 * 64;
    float *w = (float *)tz_cuda_scratch(be, (size_t)(na_pad + nb > 0 ? na_pad + nb : 1) *
                                                sizeof(float));
    if (na) tz_cuda_from_bf16(be, w, (const uint16_t *)A, na), A = w;
    if (nb) tz_cuda_from_bf16(be, w + na_pad, (const uint16_t *)B, nb), B = w + na_pad;
    tz_cuda_gemm(be, C, A, 0, B, 0, M, N, K, transA, transB, alpha, beta);
}

/* B stored in bf16 (a frozen weight): matmul16 with B's flag alone. */
static void cuda_matmul_bw16(tz_backend *be, float *C, const float *A, const uint16_t *B,
                             int64_t M, int64_t N, int64_t K, int transA, int transB,
                             float alpha, float beta) {
    cuda_matmul16(be, C, A, 0, B, 1, M, N, K, transA, transB, alpha, beta);
}


/* Row m of the fp32 [rows, K] src (bf16: already bf16) rounded into dst's row of ld, then r
 * columns bf16(s * ext[m, :]) (LoRA's h with s = 1, or its B scaled), then where `one`:
 * bf16(col[m]) (col NULL: 1), then zeros: an operand of matmul_bias (r = 0, one = 1) and
 * matmul_lora. */
template <class T>
static __global__ void k_fold_rows(uint16_t *dst, const T *src, const float *ext, int64_t r,
                                   float s, const float *col, int one, int64_t rows, int64_t K,
                                   int64_t ld) {
    TZ_CUDA_FOR(i, rows * ld) {
        const int64_t m = i / ld, k = i - m * ld;
        uint16_t v = 0;
        if (k < K) v = to_bf16_bits(src[m * K + k]);
        else if (k < K + r) v = to_bf16_bits(s * ext[m * r + (k - K)]);
        else if (k == K + r && one) v = to_bf16_bits(col ? col[m] : 1.0f);
        dst[i] = v;
    }
}

/* An operand [rows, K] (fp32, or bf16 where b16) with its extra columns into dst's rows of ld
 * (k_fold_rows). */
static void fold_rows(tz_backend *be, uint16_t *dst, const void *src, int b16, const float *ext,
                      int64_t r, float s, const float *col, int one, int64_t rows, int64_t K,
                      int64_t ld) {
    cudaStream_t st = tz_cuda_stream(be);
    if (b16)
        k_fold_rows<uint16_t><<<tz_cuda_blocks(rows * ld, TZ_CUDA_THREADS), TZ_CUDA_THREADS, 0,
                                st>>>(dst, (const uint16_t *)src, ext, r, s, col, one, rows, K,
                                      ld);
    else
        k_fold_rows<float><<<tz_cuda_blocks(rows * ld, TZ_CUDA_THREADS), TZ_CUDA_THREADS, 0,
                             st>>>(dst, (const float *)src, ext, r, s, col, one, rows, K, ld);
    CUDA_LAUNCHED();
}

static void cuda_matmul_bias(tz_backend *be, float *C, const void *A, int a_bf16, const void *W,
                             int w_bf16, const float *bias, int64_t M, int64_t N, int64_t K,
                             int c_bf16) {
    if (M <= 0 || N <= 0) return;
    if (c_bf16 && (be->matmul_dtype != TZ_DT_BF16 || K <= 0))
        TZ_FATAL("matmul_bias: a bf16 output needs bf16 GEMMs and K > 0 (K = %lld)",
                 (long long)K);
    if (be->matmul_dtype != TZ_DT_BF16 || K <= 0) { /* fp32: the product, then the bias */
        cuda_matmul16(be, C, A, a_bf16, W, w_bf16, M, N, K, 0, 1, 1.0f, 0.0f);
        be->bias_add_fwd(be, C, bias, M, N);
        return;
    }
    /* [A | 1] [W | b]^T over K + 8 columns, both rounded into the GEMM operands' buffer */
    const int64_t ld = K + 8, na = (M * ld + 127) / 128 * 128;
    const size_t bytes = (size_t)(na + N * ld) * 2;
    uint16_t *s = (uint16_t *)tz_cuda_gemm_operands(be, bytes);
    if (!a_bf16) tz_cuda_check_apart(A, M * K, s, bytes, "A");
    if (!w_bf16) tz_cuda_check_apart(W, N * K, s, bytes, "B");
    TZ_CUDA_KERNEL_READS(be, A, (size_t)(M * K) * (a_bf16 ? 2 : 4), "gemm operand A");
    TZ_CUDA_KERNEL_READS(be, W, (size_t)(N * K) * (w_bf16 ? 2 : 4), "gemm operand B");
    TZ_CUDA_KERNEL_READS(be, bias, (size_t)N * 4, "bias");
    fold_rows(be, s, A, a_bf16, NULL, 0, 1.0f, NULL, 1, M, K, ld);
    fold_rows(be, s + na, W, w_bf16, NULL, 0, 1.0f, bias, 1, N, K, ld);
    gemm16_ld(be, C, c_bf16, N, s, ld, s + na, ld, 1, M, N, ld, 1.0f, 0.0f);
}

/* [A | h | 1] [W | s B | b]^T over K + (r + 1 with a bias) rounded up to 8 columns, both
 * operands rounded into the GEMM operands' buffer (as matmul_bias and tq_matmul_lora fold). */
static void cuda_matmul_lora(tz_backend *be, float *C, const void *A, int a_bf16, const void *W,
                             int w_bf16, const float *h, const float *B, int64_t r, float s,
                             const float *bias, int64_t M, int64_t N, int64_t K) {
    if (M <= 0 || N <= 0) return;
    if (r <= 0) {
        if (bias) cuda_matmul_bias(be, C, A, a_bf16, W, w_bf16, bias, M, N, K, 0);
        else cuda_matmul16(be, C, A, a_bf16, W, w_bf16, M, N, K, 0, 1, 1.0f, 0.0f);
        return;
    }
    if (be->matmul_dtype != TZ_DT_BF16 || K <= 0) { /* fp32: the products, then the bias */
        cuda_matmul16(be, C, A, a_bf16, W, w_bf16, M, N, K, 0, 1, 1.0f, 0.0f);
        cuda_matmul(be, C, h, B, M, N, r, 0, 1, s, 1.0f);
        if (bias) be->bias_add_fwd(be, C, bias, M, N);
        return;
    }
    const int nb = bias != NULL;
    const int64_t ld = K + ((r + nb + 7) & ~(int64_t)7), na = (M * ld + 127) / 128 * 128;
    const size_t bytes = (size_t)(na + N * ld) * 2;
    uint16_t *o = (uint16_t *)tz_cuda_gemm_operands(be, bytes);
    if (!a_bf16) tz_cuda_check_apart(A, M * K, o, bytes, "A");
    if (!w_bf16) tz_cuda_check_apart(W, N * K, o, bytes, "B");
    tz_cuda_check_apart(h, M * r, o, bytes, "h");
    tz_cuda_check_apart(B, N * r, o, bytes, "LoRA's B");
    TZ_CUDA_KERNEL_READS(be, A, (size_t)(M * K) * (a_bf16 ? 2 : 4), "gemm operand A");
    TZ_CUDA_KERNEL_READS(be, W, (size_t)(N * K) * (w_bf16 ? 2 : 4), "gemm operand B");
    TZ_CUDA_KERNEL_READS(be, h, (size_t)(M * r) * 4, "LoRA's h");
    TZ_CUDA_KERNEL_READS(be, B, (size_t)(N * r) * 4, "LoRA's B");
    if (bias) TZ_CUDA_KERNEL_READS(be, bias, (size_t)N * 4, "bias");
    fold_rows(be, o, A, a_bf16, h, r, 1.0f, NULL, nb, M, K, ld);
    fold_rows(be, o + na, W, w_bf16, B, r, s, bias, nb, N, K, ld);
    gemm16_ld(be, C, 0, N, o, ld, o + na, ld, 1, M, N, ld, 1.0f, 0.0f);
}

void tz_cuda_install_matmul(tz_backend *be) {
    be->matmul = cuda_matmul;
    be->matmul_bw16 = cuda_matmul_bw16;
    be->matmul16 = cuda_matmul16;
    be->matmul_bias = cuda_matmul_bias;
    be->matmul_lora = cuda_matmul_lora;
}
