/* CUDA matmul C = alpha*op(A)*op(B) + beta*C through cuBLAS SGEMM (fp32 in, fp32 out, no TF32:
 * the handle's math mode is set at creation), row-major operands mapped onto the column-major
 * library. */
#include <limits.h>

#include "cuda/cuda_internal.cuh"

static __global__ void k_scale_only(float *C, float beta, int64_t n) {
    TZ_CUDA_FOR(i, n) C[i] = beta == 0.0f ? 0.0f : beta * C[i];
}

/* Row-major C[M,N] = op(A) op(B) is column-major C^T[N,M] = op(B)^T op(A)^T, and a row-major
 * [r, c] array is the column-major [c, r] array with leading dimension c. So cuBLAS computes
 * with m = N, n = M, first operand B (stored [K,N] -> N x K col-major, ld N, no transpose;
 * stored [N,K] -> K x N col-major, ld K, transposed) and second operand A (stored [M,K] -> ld
 * K, no transpose; stored [K,M] -> ld M, transposed); ldc = N. */
static void cuda_matmul(tz_backend *be, float *C, const float *A, const float *B, int64_t M,
                        int64_t N, int64_t K, int transA, int transB, float alpha, float beta) {
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
    cublasOperation_t opA = transA ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t opB = transB ? CUBLAS_OP_T : CUBLAS_OP_N;
    int lda = (int)(transA ? M : K), ldb = (int)(transB ? K : N);
    /* beta == 0: cuBLAS does not read C (NaN there does not propagate) */
    CUBLAS_CHECK(cublasSgemm(tz_cuda_ctx_of(be)->cublas, opB, opA, (int)N, (int)M, (int)K, &alpha,
                             B, ldb, A, lda, &beta, C, (int)N));
}

void tz_cuda_install_matmul(tz_backend *be) { be->matmul = cuda_matmul; }
