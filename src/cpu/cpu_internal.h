/* Shared state and op declarations of the CPU backend, between its source files.
 * Not a public interface: the rest of the program reaches these ops through tz_backend. */
#ifndef TZ_CPU_INTERNAL_H
#define TZ_CPU_INTERNAL_H
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/backend.h"

/* Below this many elements a loop runs on the calling thread only (transcendental loops use a
 * quarter of it). Threads never change results: see core/backend.h. */
#define TZ_CPU_PAR_MIN 32768
/* Column block of the deterministic reductions over rows (one thread owns a block and adds
 * the rows in order). */
#define TZ_CPU_COLS 64

/* exp(x) in float, branch-free so that loops calling it vectorise (glibc's expf does not
 * without -ffast-math). Cody-Waite reduction x = n ln2 + r, |r| <~ ln2/2, and the Cephes
 * degree-7 polynomial for e^r: measured within 1 ulp of exp. Below -87 (and at -inf) it
 * returns 0; above 88 it saturates at exp(88) (softmax inputs are <= 0 once the row max is
 * subtracted); NaN propagates. */
static inline float tz_cpu_expf(float x) {
    float xc = x > -87.0f ? (x < 88.0f ? x : 88.0f) : -87.0f; /* NaN -> -87: n stays finite */
    /* n = round(x / ln2): adding and removing 1.5 * 2^23 rounds to an integer (floorf would
     * not vectorise under the default -ftrapping-math) */
    float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = xc - n * 0.693359375f;  /* ln2 high part, exact in n * hi */
    r = r - n * -2.12194440e-4f;       /* ln2 low part */
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23; /* 2^n, n in [-126, 127] */
    float two_n;
    memcpy(&two_n, &bits, sizeof two_n);
    float y = p * two_n;
    y = x < -87.0f ? 0.0f : y;
    return x != x ? x : y;
}

/* max of x[0..n), -inf for n = 0. GCC vectorises the simd max reduction; Clang does not (and
 * warns, an error under -Werror), so there 16 independent lanes do the same. */
static inline float tz_cpu_maxf(const float *x, int64_t n) {
    float m = -INFINITY;
#if defined(__GNUC__) && !defined(__clang__)
#pragma omp simd reduction(max : m)
    for (int64_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
#else
    float lane[16];
    for (int l = 0; l < 16; l++) lane[l] = -INFINITY;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) lane[l] = x[i + l] > lane[l] ? x[i + l] : lane[l];
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    for (int l = 0; l < 16; l++) m = lane[l] > m ? lane[l] : m;
#endif
    return m;
}

/* Per-thread packing workspace of the GEMMs (matmul, attention blocks), grown on demand,
 * indexed by OpenMP thread number. The workspaces belong to the backend, so one backend is
 * driven by one host thread at a time (as its arena is). */
typedef struct tz_cpu_ws {
    float *buf;
    size_t cap; /* floats */
} tz_cpu_ws;

typedef struct tz_cpu_ctx {
    int threads;    /* > 0: fixed team size; 0: OpenMP default at each call */
    int nws;        /* slots in ws */
    tz_cpu_ws *ws;
} tz_cpu_ctx;

/* Team size for the next parallel region of this backend. */
int tz_cpu_threads(tz_backend *be);
/* Workspace of at least `floats` floats for thread `tid` (called inside a parallel region,
 * each thread with its own tid; slots were made by tz_cpu_ws_reserve before it). */
float *tz_cpu_ws_get(tz_backend *be, int tid, size_t floats);
/* Makes sure there are `nthreads` slots (called outside parallel regions). */
void tz_cpu_ws_reserve(tz_backend *be, int nthreads);
/* 64-byte aligned host memory, fatal on failure; free with free(). */
void *tz_cpu_aligned_alloc(size_t bytes);

/* The product cpu_matmul.c exports for attention blocks, a strided one on one thread:
 * C[i*ldc + j] = alpha * sum_k op(A)(i,k) op(B)(k,j) + beta * C (beta == 0 never reads C),
 * op(A)(i,k) = A[i*lda + k] (transA = 0) or A[k*lda + i]; op(B)(k,j) = B[k*ldb + j] or
 * B[j*ldb + k]. Same blocking and summation order as the matmul op. */
typedef struct tz_cpu_gemm_args {
    float *C;
    int64_t ldc;
    const float *A;
    int64_t lda;
    int transA;
    const float *B;
    int64_t ldb;
    int transB;
    int64_t M, N, K;
    float alpha, beta;
} tz_cpu_gemm_args;

/* ---- kernels and families ----
 * The family files (every src/cpu/cpu_*.c but cpu_backend.c) are compiled once per CPU
 * kernel, each time for that kernel's instruction set: portable (the compiler's baseline),
 * avx2 (x86-64-v3: AVX2, FMA), avx512 (x86-64-v4), or only native (-march=native) in a
 * TZ_NATIVE build. CMake defines TZ_CPU_KERNEL_ID to the kernel's name, and the few names a
 * family file exports carry it: TZ_CPU_K(tz_cpu_install_norm) is tz_cpu_install_norm_avx512
 * in the AVX-512 build of cpu_norm.c. cpu_backend.c picks one kernel per backend at run time
 * from the CPU's features, so one binary runs everywhere and fast where it can. */
#define TZ_CPU_K(name) TZ_CPU_K_(name, TZ_CPU_KERNEL_ID)
#define TZ_CPU_K_(name, kernel) TZ_CPU_K__(name, kernel)
#define TZ_CPU_K__(name, kernel) name##_##kernel

/* The op families, one file each (cuda/ mirrors them file for file): X(family, kernel) for
 * each. Each file keeps its ops static and exports one install function,
 * tz_cpu_install_<family>_<kernel>(be), that sets its entries of the table; the backend calls
 * every family's, and nothing else writes the table.
 *   elementwise: fill scale axpy sumsq bias modulate gate    norm: rmsnorm layernorm
 *   activation: swiglu gelu_tanh silu    attention    matmul    loss: xent mse
 *   layout: embedding rope patchify unpatchify copy2d    quant: tq_rotate tq_dequant */
#define TZ_CPU_FAMILIES(X, kernel)                                                         \
    X(elementwise, kernel) X(norm, kernel) X(activation, kernel) X(attention, kernel)     \
    X(matmul, kernel) X(loss, kernel) X(layout, kernel) X(quant, kernel)
#define TZ_CPU_DECLARE_INSTALL(family, kernel) \
    void tz_cpu_install_##family##_##kernel(tz_backend *be);

#ifdef TZ_CPU_KERNEL_ID /* in a family file */
TZ_CPU_FAMILIES(TZ_CPU_DECLARE_INSTALL, TZ_CPU_KERNEL_ID)
/* cpu_matmul.c, for attention: the workspace size of tz_cpu_gemm_serial, and the product */
size_t TZ_CPU_K(tz_cpu_gemm_ws_floats)(void);
void TZ_CPU_K(tz_cpu_gemm_serial)(const tz_cpu_gemm_args *g, float *ws);
#endif

#endif
