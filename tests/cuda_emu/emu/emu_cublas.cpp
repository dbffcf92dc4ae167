/* cuBLAS of the CPU emulation (tests/cuda_emu/emu/): the handle and the GEMMs, by plain loops.
 *
 * C = alpha * op(A) * op(B) + beta * C, column-major, with the reference BLAS rules: beta == 0
 * writes C without reading it, alpha == 0 or k == 0 reads neither A nor B. Each element is one
 * fp32 sum over k in order (products of bf16 inputs are exact in fp32; fp32 inputs give a
 * rounded product, then a rounded sum: no fused multiply-add). The TF32 modes
 * (CUBLAS_TF32_TENSOR_OP_MATH, CUBLAS_COMPUTE_32F_FAST_TF32) round fp32 inputs to TF32 first,
 * CUBLAS_COMPUTE_32F_FAST_16BF to bf16, as the tensor cores would. The arguments are checked
 * as cuBLAS does (CUBLAS_STATUS_INVALID_VALUE), and every operand must lie inside one device
 * allocation (else CUBLAS_STATUS_EXECUTION_FAILED, with a line on stderr saying which). */
#include <stdlib.h>

#include "cublas_v2.h"
#include "emu_internal.h"

struct tz_emu_cublas {
    cudaStream_t stream;
    cublasMath_t math;
};

namespace {

float bf16_to_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
uint16_t f32_to_bf16(float f) {
    uint32_t x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x0040u);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
/* fp32 -> TF32 (10 explicit mantissa bits), to nearest even, kept in an fp32 */
float to_tf32(float f) {
    uint32_t x = __float_as_uint(f);
    if ((x & 0x7f800000u) == 0x7f800000u) return f;
    x = (x + 0xfffu + ((x >> 13) & 1u)) & ~0x1fffu;
    return __uint_as_float(x);
}

enum { RND_NONE, RND_TF32, RND_BF16 };

float load(const void *p, cudaDataType t, size_t i, int rnd) {
    if (t == CUDA_R_16BF) return bf16_to_f32(((const uint16_t *)p)[i]);
    float v = ((const float *)p)[i];
    if (rnd == RND_TF32) return to_tf32(v);
    if (rnd == RND_BF16) return bf16_to_f32(f32_to_bf16(v));
    return v;
}
size_t esize(cudaDataType t) { return t == CUDA_R_16BF ? 2 : 4; }

cublasStatus_t invalid(const char *fn, const char *what) {
    tz_emu_note("%s: %s", fn, what);
    return CUBLAS_STATUS_INVALID_VALUE;
}

/* Elements spanned by a column-major rows x cols operand with leading dimension ld. */
size_t span(int rows, int cols, int ld) { return (size_t)(cols - 1) * (size_t)ld + (size_t)rows; }

cublasStatus_t operand(const char *fn, const char *name, const void *p, size_t elems,
                       size_t es, long long stride, int batch) {
    size_t bytes = (elems + (size_t)(batch - 1) * (size_t)stride) * es;
    if (!tz_emu_dev_range(p, bytes)) {
        tz_emu_note("%s: operand %s (%p, %zu bytes over %d batch(es)) is not inside one device "
                    "allocation", fn, name, p, bytes, batch);
        return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t gemm(const char *fn, cublasHandle_t h, cublasOperation_t ta,
                    cublasOperation_t tb, int m, int n, int k, float alpha, const void *A,
                    cudaDataType tA, int lda, long long sa, const void *B, cudaDataType tB,
                    int ldb, long long sb, float beta, void *C, cudaDataType tC, int ldc,
                    long long sc, int batch, int rnd) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if ((unsigned)ta > CUBLAS_OP_C || (unsigned)tb > CUBLAS_OP_C)
        return invalid(fn, "transa/transb is not N, T or C");
    if (m < 0 || n < 0 || k < 0 || batch < 0) return invalid(fn, "m, n, k or batch < 0");
    int ar = ta == CUBLAS_OP_N ? m : k, ac = ta == CUBLAS_OP_N ? k : m;
    int br = tb == CUBLAS_OP_N ? k : n, bc = tb == CUBLAS_OP_N ? n : k;
    if (lda < (ar > 1 ? ar : 1)) return invalid(fn, "lda is below the rows of A");
    if (ldb < (br > 1 ? br : 1)) return invalid(fn, "ldb is below the rows of B");
    if (ldc < (m > 1 ? m : 1)) return invalid(fn, "ldc is below m");
    if (!m || !n || !batch) return CUBLAS_STATUS_SUCCESS;
    const int ab = alpha != 0.0f && k > 0; /* A and B are read */
    cublasStatus_t st = operand(fn, "C", C, span(m, n, ldc), esize(tC), sc, batch);
    if (st == CUBLAS_STATUS_SUCCESS && ab)
        st = operand(fn, "A", A, span(ar, ac, lda), esize(tA), sa, batch);
    if (st == CUBLAS_STATUS_SUCCESS && ab)
        st = operand(fn, "B", B, span(br, bc, ldb), esize(tB), sb, batch);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    float *pa = ab ? (float *)malloc((size_t)m * (size_t)k * sizeof(float)) : NULL;
    float *pb = ab ? (float *)malloc((size_t)n * (size_t)k * sizeof(float)) : NULL;
    if (ab && (!pa || !pb)) {
        free(pa);
        free(pb);
        return CUBLAS_STATUS_ALLOC_FAILED;
    }
    for (int b = 0; b < batch; b++) {
        const char *Ab = (const char *)A + (size_t)b * (size_t)sa * esize(tA);
        const char *Bb = (const char *)B + (size_t)b * (size_t)sb * esize(tB);
        char *Cb = (char *)C + (size_t)b * (size_t)sc * esize(tC);
        if (ab) {
            /* row i of op(A) and column j of op(B), each contiguous over k */
            for (int i = 0; i < m; i++)
                for (int l = 0; l < k; l++) {
                    size_t e = ta == CUBLAS_OP_N ? (size_t)l * lda + i : (size_t)i * lda + l;
                    pa[(size_t)i * k + l] = load(Ab, tA, e, rnd);
                }
            for (int j = 0; j < n; j++)
                for (int l = 0; l < k; l++) {
                    size_t e = tb == CUBLAS_OP_N ? (size_t)j * ldb + l : (size_t)l * ldb + j;
                    pb[(size_t)j * k + l] = load(Bb, tB, e, rnd);
                }
        }
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                float acc = 0.0f;
                if (ab) {
                    const float *x = pa + (size_t)i * k, *y = pb + (size_t)j * k;
                    for (int l = 0; l < k; l++) acc += x[l] * y[l];
                }
                size_t ci = (size_t)j * ldc + i;
                float c = alpha * acc;
                if (beta != 0.0f)
                    c += beta * (tC == CUDA_R_16BF ? bf16_to_f32(((uint16_t *)Cb)[ci])
                                                   : ((float *)Cb)[ci]);
                if (tC == CUDA_R_16BF) ((uint16_t *)Cb)[ci] = f32_to_bf16(c);
                else ((float *)Cb)[ci] = c;
            }
    }
    free(pa);
    free(pb);
    return CUBLAS_STATUS_SUCCESS;
}

/* Rounding of fp32 inputs for the handle's math mode and the compute type; -1 unsupported. */
int rounding(cublasHandle_t h, cublasComputeType_t compute) {
    switch (compute) {
    case CUBLAS_COMPUTE_32F_PEDANTIC: return RND_NONE;
    case CUBLAS_COMPUTE_32F:
        return h && (h->math & 15) == CUBLAS_TF32_TENSOR_OP_MATH ? RND_TF32 : RND_NONE;
    case CUBLAS_COMPUTE_32F_FAST_TF32: return RND_TF32;
    case CUBLAS_COMPUTE_32F_FAST_16BF: return RND_BF16;
    default: return -1;
    }
}

cublasStatus_t gemm_ex(const char *fn, cublasHandle_t h, cublasOperation_t ta,
                       cublasOperation_t tb, int m, int n, int k, const void *alpha,
                       const void *A, cudaDataType tA, int lda, long long sa, const void *B,
                       cudaDataType tB, int ldb, long long sb, const void *beta, void *C,
                       cudaDataType tC, int ldc, long long sc, int batch,
                       cublasComputeType_t compute) {
    int rnd = rounding(h, compute);
    if (rnd < 0) {
        tz_emu_note("%s: compute type %d is not emulated (32F, 32F_PEDANTIC, 32F_FAST_TF32, "
                    "32F_FAST_16BF are)", fn, (int)compute);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if ((tA != CUDA_R_32F && tA != CUDA_R_16BF) || tB != tA ||
        (tC != CUDA_R_32F && tC != CUDA_R_16BF)) {
        tz_emu_note("%s: types A %d, B %d, C %d are not emulated (A and B both 32F or both "
                    "16BF; C 32F or 16BF)", fn, (int)tA, (int)tB, (int)tC);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (!alpha || !beta) return invalid(fn, "alpha or beta is NULL");
    return gemm(fn, h, ta, tb, m, n, k, *(const float *)alpha, A, tA, lda, sa, B, tB, ldb, sb,
                *(const float *)beta, C, tC, ldc, sc, batch, rnd);
}

} // namespace

extern "C" {

cublasStatus_t cublasCreate(cublasHandle_t *h) {
    if (!h) return CUBLAS_STATUS_INVALID_VALUE;
    *h = (cublasHandle_t)calloc(1, sizeof **h);
    return *h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}
cublasStatus_t cublasDestroy(cublasHandle_t h) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    free(h);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!tz_emu_stream_ok(s)) return invalid("cublasSetStream", "not a live stream");
    h->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasGetStream(cublasHandle_t h, cudaStream_t *s) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!s) return CUBLAS_STATUS_INVALID_VALUE;
    *s = h->stream;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t m) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    int base = (int)m & 15;
    if (base > CUBLAS_TF32_TENSOR_OP_MATH || ((int)m & ~31)) return CUBLAS_STATUS_INVALID_VALUE;
    h->math = m;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasGetMathMode(cublasHandle_t h, cublasMath_t *m) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!m) return CUBLAS_STATUS_INVALID_VALUE;
    *m = h->math;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetPointerMode(cublasHandle_t h, cublasPointerMode_t m) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    return m == CUBLAS_POINTER_MODE_HOST ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
}
cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *ws, size_t bytes) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (bytes && !tz_emu_dev_range(ws, bytes))
        return invalid("cublasSetWorkspace", "the workspace is not device memory");
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusName(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}
const char *cublasGetStatusString(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "the functionality requested requires some license";
    }
    return "unknown status";
}

cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                           int n, int k, const float *alpha, const float *A, int lda,
                           const float *B, int ldb, const float *beta, float *C, int ldc) {
    if (!alpha || !beta) return invalid("cublasSgemm", "alpha or beta is NULL");
    int rnd = h && (h->math & 15) == CUBLAS_TF32_TENSOR_OP_MATH ? RND_TF32 : RND_NONE;
    return gemm("cublasSgemm", h, ta, tb, m, n, k, *alpha, A, CUDA_R_32F, lda, 0, B, CUDA_R_32F,
                ldb, 0, *beta, C, CUDA_R_32F, ldc, 0, 1, rnd);
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta,
                                         cublasOperation_t tb, int m, int n, int k,
                                         const float *alpha, const float *A, int lda,
                                         long long sa, const float *B, int ldb, long long sb,
                                         const float *beta, float *C, int ldc, long long sc,
                                         int batch) {
    if (!alpha || !beta) return invalid("cublasSgemmStridedBatched", "alpha or beta is NULL");
    int rnd = h && (h->math & 15) == CUBLAS_TF32_TENSOR_OP_MATH ? RND_TF32 : RND_NONE;
    return gemm("cublasSgemmStridedBatched", h, ta, tb, m, n, k, *alpha, A, CUDA_R_32F, lda, sa,
                B, CUDA_R_32F, ldb, sb, *beta, C, CUDA_R_32F, ldc, sc, batch, rnd);
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *A, cudaDataType tA,
                            int lda, const void *B, cudaDataType tB, int ldb, const void *beta,
                            void *C, cudaDataType tC, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo) {
    (void)algo;
    return gemm_ex("cublasGemmEx", h, ta, tb, m, n, k, alpha, A, tA, lda, 0, B, tB, ldb, 0, beta,
                   C, tC, ldc, 0, 1, compute);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta,
                                          cublasOperation_t tb, int m, int n, int k,
                                          const void *alpha, const void *A, cudaDataType tA,
                                          int lda, long long sa, const void *B,
                                          cudaDataType tB, int ldb, long long sb,
                                          const void *beta, void *C, cudaDataType tC, int ldc,
                                          long long sc, int batch, cublasComputeType_t compute,
                                          cublasGemmAlgo_t algo) {
    (void)algo;
    return gemm_ex("cublasGemmStridedBatchedEx", h, ta, tb, m, n, k, alpha, A, tA, lda, sa, B,
                   tB, ldb, sb, beta, C, tC, ldc, sc, batch, compute);
}

} // extern "C"
