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
#include "cuda/cuda_mma.cuh"

static __global__ void k_scale_only(float *C, float beta, int64_t n) {
    TZ_CUDA_FOR(i, n) C[i] = beta == 0.0f ? 0.0f : beta * C[i];
}

/* Where the fp32 operands of a bf16 GEMM are rounded to: a device buffer of at least `bytes`
 * kept for this alone, not the ops' scratch (tz_cuda_scratch), which may hold an operand of
 * the same GEMM (matmul_bw16 widens its weight there) and which growing would free under it.
 * Grown like the scratch. */
static void *gemm_operands(tz_backend *be, size_t bytes) {
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

/* Fatal when the fp32 operand p (n elements) overlaps [dst, dst + bytes), where an operand is
 * rounded to: the conversion would overwrite what it, or the other operand, still reads. */
static void check_apart(const void *p, int64_t n, const void *dst, size_t bytes,
                        const char *which) {
    const char *a = (const char *)p, *d = (const char *)dst;
    if (n > 0 && a < d + bytes && d < a + (size_t)n * sizeof(float))
        TZ_FATAL("matmul: operand %s lies in the buffer the bf16 operands are rounded into", which);
}


/* An operand element as bf16 bits: a float rounded (nearest even), a bf16 one as it is. */
static __device__ __forceinline__ uint16_t to_bf16_bits(float x) { return tz_bf16_bits(x); }
static __device__ __forceinline__ uint16_t to_bf16_bits(uint16_t x) { return x; }

/* ---- the narrow GEMM (core/backend.h's tz_narrow_plan; docs/design/cuda.md "Narrow GEMMs") ----
 * Y [P, R] = X [P, K] S [R, K]^T: a block of NW_THREADS threads takes TZ_NARROW_ROWS rows of P
 * (a warp 16, one mma row tile) and kc of K, in stages of TZ_NARROW_KC (X's tile copied ahead
 * by cp.async, S's loaded ahead into registers and rounded into shared memory after the
 * compute); its sums go to its own slice of a workspace, ws [nsplit][P][rpad], and the last
 * block of a row of blocks to finish (a ticket: threadfence, then an atomic count) adds the
 * row's slices in the order of the splits into C. */
#define NW_THREADS 128
#define NW_LD (TZ_NARROW_KC + 8) /* a staged row's stride in elements (both tiles are 64 wide:
                                  * 144 bytes, so ldmatrix's 8 rows fall on distinct banks) */
static_assert(TZ_NARROW_ROWS == 64 && TZ_NARROW_KC == 64, "the narrow tiles are 64 x 64");

/* One stage of X: its tile (xk: rows k, 64 of P each; else rows p, 64 of K each; zeros past P
 * and K, whose 8-element pieces lie wholly in or out: the row stride is a multiple of 8, and
 * so is K (or P) where it is the stride), copied by cp.async. */
template <bool XK>
__device__ __forceinline__ void nw_stage(uint16_t *Xs, const uint16_t *X, int64_t ldx, int64_t P,
                                         int64_t K, int64_t p0, int64_t k0) {
    for (int c = threadIdx.x; c < 64 * 8; c += NW_THREADS) {
        const int r = c >> 3, q = (c & 7) * 8;
        const int64_t p = XK ? p0 + q : p0 + r, k = XK ? k0 + r : k0 + q;
        const bool in = p < P && k < K;
        tz_cp_async<16>(Xs + r * NW_LD + q, in ? X + (XK ? k * ldx + p : p * ldx + k) : X, in);
    }
}

/* One stage of S, [rpad, 64] from k0, in two halves: nw_s_load reads a thread's 4 NT elements
 * (zeros past R and K) into registers, from S [R, K] (sk 0: consecutive threads along K) or
 * [K, R] (consecutive threads along R), fp32 or bf16; nw_s_store writes them to the stage
 * rounded to bf16, after the compute they were loaded ahead of. */
template <int NT, class TS>
__device__ __forceinline__ void nw_s_load(float (&v)[4 * NT], const TS *S, int sk, int64_t R,
                                          int64_t K, int64_t k0) {
#pragma unroll
    for (int u = 0; u < 4 * NT; u++) {
        const int e = threadIdx.x + NW_THREADS * u;
        const int j = sk ? e % (NT * 8) : e / 64, kk = sk ? e / (NT * 8) : e % 64;
        const int64_t k = k0 + kk;
        v[u] = j < R && k < K ? tz_get(S + (sk ? k * R + j : j * K + k)) : 0.0f;
    }
}
template <int NT>
__device__ __forceinline__ void nw_s_store(uint16_t *Ss, const float (&v)[4 * NT], int sk) {
#pragma unroll
    for (int u = 0; u < 4 * NT; u++) {
        const int e = threadIdx.x + NW_THREADS * u;
        const int j = sk ? e % (NT * 8) : e / 64, kk = sk ? e / (NT * 8) : e % 64;
        Ss[j * NW_LD + kk] = tz_bf16_bits(v[u]);
    }
}

/* ws [blockIdx.y][p][j] = sum over the block's kc of K of X[p][k] S[j][k], for its 64 p; the
 * row's last block then C = alpha (the splits' sums added in order) + beta C for those p (C
 * [P, R], or yt: [R, P]; beta = 0 does not read C) and resets the row's ticket. NT: rpad / 8
 * mma column tiles; XK: X stored [K, P]. Stages: three (two copied ahead) up to 32 columns,
 * two at 64 (under the 48 KiB every launch may take). */
template <int NT, bool XK, class TS>
__global__ void __launch_bounds__(NW_THREADS)
    k_narrow_part(float *ws, const uint16_t *X, int64_t ldx, const TS *S, int sk, int64_t P,
                  int64_t K, int64_t kc, float *C, int yt, int64_t R, float alpha, float beta,
                  unsigned *count) {
    constexpr int ST = NT == 8 ? 2 : 3, PER = (64 + NT * 8) * NW_LD, RP = NT * 8;
    extern __shared__ float smem[];
    uint16_t *sm = (uint16_t *)smem;
    int *last = (int *)(sm + ST * PER); /* (after the stages: narrow_smem's 16 bytes more) */
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, mi = lane >> 3, ri = lane & 7;
    const int64_t p0 = (int64_t)blockIdx.x * 64, kb = (int64_t)blockIdx.y * kc;
    const int64_t ke = kb + kc < K ? kb + kc : K;
    const int nch = (int)((ke - kb + 63) / 64);
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
    float sv[4 * NT]; /* S's next stage, loaded ahead of the compute */
#pragma unroll
    for (int s = 0; s < ST - 1; s++) {
        if (s < nch) {
            nw_stage<XK>(sm + s * PER, X, ldx, P, K, p0, kb + s * 64);
            nw_s_load<NT>(sv, S, sk, R, K, kb + s * 64);
            nw_s_store<NT>(sm + s * PER + 64 * NW_LD, sv, sk);
        }
        tz_cp_async_commit();
    }
    for (int i = 0; i < nch; i++) {
        tz_cp_async_wait<ST - 2>(); /* stage i copied (this thread's part) */
        __syncthreads();            /* everyone's part; and stage i - 1 no longer read */
        const int nx = i + ST - 1;
        if (nx < nch) {
            nw_stage<XK>(sm + (nx % ST) * PER, X, ldx, P, K, p0, kb + (int64_t)nx * 64);
            nw_s_load<NT>(sv, S, sk, R, K, kb + (int64_t)nx * 64);
        }
        tz_cp_async_commit();
        const uint16_t *Xs = sm + (i % ST) * PER, *Ss = Xs + 64 * NW_LD;
#pragma unroll
        for (int kk = 0; kk < 64; kk += 16) {
            /* the warp's 16 rows of P by 16 of K: matrices (p, k), (p + 8, k), (p, k + 8),
             * (p + 8, k + 8), rows of the tile p (plain) or k (.trans) */
            uint32_t a[4];
            if constexpr (XK)
                tz_ldmatrix_x4<true>(a, Xs + (kk + (mi >> 1) * 8 + ri) * NW_LD + w * 16 +
                                            (mi & 1) * 8);
            else
                tz_ldmatrix_x4<false>(a, Xs + (w * 16 + (mi & 1) * 8 + ri) * NW_LD + kk +
                                             (mi >> 1) * 8);
#pragma unroll
            for (int nt = 0; nt < NT; nt += 2) { /* B of column tiles nt and nt + 1 */
                uint32_t b[4];
                tz_ldmatrix_x4<false>(b, Ss + (nt * 8 + (mi >> 1) * 8 + ri) * NW_LD + kk +
                                             (mi & 1) * 8);
                tz_mma_bf16_16816(acc[nt], a, b);
                tz_mma_bf16_16816(acc[nt + 1], a, b + 2);
            }
        }
        /* into stage nx's buffer, which stage i - 1 left before the barrier above and which
         * no one reads before the barrier of round nx */
        if (nx < nch) nw_s_store<NT>(sm + (nx % ST) * PER + 64 * NW_LD, sv, sk);
    }
    tz_cp_async_wait<0>(); /* (the empty groups of the last stages) */
    float *o = ws + (int64_t)blockIdx.y * P * RP;
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int64_t p = p0 + w * 16 + g + 8 * h;
        if (p >= P) continue;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            o[p * RP + nt * 8 + 2 * t] = acc[nt][2 * h];
            o[p * RP + nt * 8 + 2 * t + 1] = acc[nt][2 * h + 1];
        }
    }
    /* the row's last block adds its slices: every block's sums are visible to the device
     * before it takes its ticket, and are read past L1 (the CUDA guide's threadfence
     * reduction). Which block is last varies; the order of the sums does not. */
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last[0] = atomicAdd(count + blockIdx.x, 1u) == gridDim.y - 1;
    __syncthreads();
    if (!last[0]) return;
    /* a thread's 4 columns of a row at a time (RP / 8 such a thread), the splits' float4s
     * loaded 4 at a time before any is added, so that the tail waits for the L2 a few times
     * rather than once a split; each element's sum in the order of the splits */
    const int64_t ns = gridDim.y;
#pragma unroll 1
    for (int e = threadIdx.x; e < 64 * (RP / 4); e += NW_THREADS) {
        const int64_t p = p0 + e % 64;
        const int q = e / 64;
        if (p >= P) continue;
        const float4 *src = (const float4 *)(ws + p * RP) + q;
        const int64_t step = P * RP / 4; /* one split's slice, in float4s */
        float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        int64_t sp = 0;
        for (; sp + 4 <= ns; sp += 4) {
            float4 t[4];
#pragma unroll
            for (int u = 0; u < 4; u++) t[u] = __ldcg(src + (sp + u) * step);
#pragma unroll
            for (int u = 0; u < 4; u++)
                v[0] += t[u].x, v[1] += t[u].y, v[2] += t[u].z, v[3] += t[u].w;
        }
        for (; sp < ns; sp++) {
            const float4 t = __ldcg(src + sp * step);
            v[0] += t.x, v[1] += t.y, v[2] += t.z, v[3] += t.w;
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int64_t j = 4 * q + u;
            if (j < R) {
                float *c = C + (yt ? j * P + p : p * R + j);
                *c = beta == 0.0f ? alpha * v[u] : alpha * v[u] + beta * *c;
            }
        }
    }
    if (threadIdx.x == 0) count[blockIdx.x] = 0u;
}

/* k_narrow_part's dynamic shared memory at rpad columns: 34.5 KiB at 16, 40.5 at 32, 36 at 64 */
static size_t narrow_smem(int64_t rpad) {
    return (size_t)(rpad == 64 ? 2 : 3) * (size_t)(64 + rpad) * NW_LD * 2 + 16;
}

template <int NT, bool XK, class TS>
static void narrow_launch(tz_backend *be, const tz_narrow &np, float *ws, const uint16_t *X,
                          const TS *S, float *C, float alpha, float beta, unsigned *count) {
    const size_t smem = narrow_smem(NT * 8);
    const dim3 grid((unsigned)((np.P + 63) / 64), (unsigned)np.nsplit);
    k_narrow_part<NT, XK, TS><<<grid, NW_THREADS, smem, tz_cuda_stream(be)>>>(
        ws, X, XK ? np.P : np.K, S, np.sk, np.P, np.K, np.kc, C, np.yt, np.R, alpha, beta,
        count);
    CUDA_LAUNCHED();
}
template <class TS>
static void narrow_go(tz_backend *be, const tz_narrow &np, float *ws, const uint16_t *x,
                      const TS *S, float *C, float alpha, float beta, unsigned *tk) {
#define NW_GO(NT, XK) narrow_launch<NT, XK, TS>(be, np, ws, x, S, C, alpha, beta, tk)
    if (np.rpad == 16) np.xk ? NW_GO(2, true) : NW_GO(2, false);
    else if (np.rpad == 32) np.xk ? NW_GO(4, true) : NW_GO(4, false);
    else np.xk ? NW_GO(8, true) : NW_GO(8, false);
#undef NW_GO
}

/* The tickets of n rows of blocks, zeroed (once: each row's last block resets its own; grown
 * in the first step, like the operands' buffer). */
static unsigned *narrow_tickets(tz_backend *be, int64_t n) {
    tz_cuda_ctx *c = tz_cuda_ctx_of(be);
    if (n <= c->narrow_count_n) return c->narrow_count;
    const int64_t cap = n > 4096 ? n : 4096;
    if (c->narrow_count) CUDA_CHECK(cudaFree(c->narrow_count)); /* waits for its readers */
    c->narrow_count = NULL, c->narrow_count_n = 0;
    cudaError_t rc = cudaMalloc(&c->narrow_count, (size_t)cap * sizeof(unsigned));
    if (rc != cudaSuccess)
        TZ_FATAL("out of GPU memory on %s: cannot allocate %lld narrow GEMM tickets (%s)",
                 c->name, (long long)cap, cudaGetErrorString(rc));
    CUDA_CHECK(cudaMemsetAsync(c->narrow_count, 0, (size_t)cap * sizeof(unsigned),
                               tz_cuda_stream(be)));
    c->narrow_count_n = cap;
    return c->narrow_count;
}

/* A bf16 GEMM by the narrow kernel where tz_narrow_plan takes it: X as stored where it is
 * bf16 and 16-byte aligned (else rounded, or copied, into the GEMM operands' buffer), S read
 * as stored (rounded to bf16 on its way into shared memory), the workspace in the operands'
 * buffer. 1: done. */
static int narrow_gemm(tz_backend *be, float *C, const void *A, int a16, const void *B,
                       int b16, int64_t M, int64_t N, int64_t K, int ta, int tb, float alpha,
                       float beta) {
    tz_narrow np;
    if (!tz_narrow_plan(be->narrow_gemm, M, N, K, ta, tb, &np)) return 0;
    /* (a block's shared memory: no GPU since sm_70 has under 48 KiB; the emulation can) */
    if (narrow_smem(np.rpad) > tz_cuda_ctx_of(be)->smem_optin) return 0;
    const void *X = np.yt ? B : A, *S = np.yt ? A : B;
    const int x16 = np.yt ? b16 : a16, s16in = np.yt ? a16 : b16;
    const int xin = x16 && (uintptr_t)X % 16 == 0; /* X read where it is */
    const int64_t nx16 = xin ? 0 : (np.P * K + 127) / 128 * 128;
    const size_t bytes = (size_t)nx16 * 2 + (size_t)(np.nsplit * np.P * np.rpad) * 4;
    uint16_t *xb = (uint16_t *)gemm_operands(be, bytes);
    float *ws = (float *)(xb + nx16);
    check_apart(S, s16in ? (np.R * K + 1) / 2 : np.R * K, xb, bytes, "S");
    check_apart(X, x16 ? (np.P * K + 1) / 2 : np.P * K, xb, bytes, "X");
    check_apart(C, M * N, xb, bytes, "C");
    if (!x16) tz_cuda_to_bf16(be, xb, (const float *)X, np.P * K), X = xb;
    else if (!xin) {
        CUDA_CHECK(cudaMemcpyAsync(xb, X, (size_t)(np.P * K) * 2, cudaMemcpyDeviceToDevice,
                                   tz_cuda_stream(be)));
        X = xb;
    }
    const uint16_t *x = (const uint16_t *)X;
    unsigned *tk = narrow_tickets(be, (np.P + 63) / 64);
    if (s16in) narrow_go(be, np, ws, x, (const uint16_t *)S, C, alpha, beta, tk);
    else narrow_go(be, np, ws, x, (const float *)S, C, alpha, beta, tk);
    return 1;
}

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
    if (bf16 && narrow_gemm(be, C, A, a_bf16, B, b_bf16, M, N, K, transA, transB, alpha, beta))
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
            __nv_bfloat16 *s = (__nv_bfloat16 *)gemm_operands(be, bytes);
            check_apart(A, na, s, bytes, "A");
            check_apart(B, nb, s, bytes, "B");
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
    uint16_t *s = (uint16_t *)gemm_operands(be, bytes > 0 ? bytes : 1);
    check_apart(A, n, s, bytes, "A");
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
    uint16_t *s = (uint16_t *)gemm_operands(be, bytes);
    if (!a_bf16) check_apart(A, M * K, s, bytes, "A");
    if (!w_bf16) check_apart(W, N * K, s, bytes, "B");
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
    uint16_t *o = (uint16_t *)gemm_operands(be, bytes);
    if (!a_bf16) check_apart(A, M * K, o, bytes, "A");
    if (!w_bf16) check_apart(W, N * K, o, bytes, "B");
    check_apart(h, M * r, o, bytes, "h");
    check_apart(B, N * r, o, bytes, "LoRA's B");
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
