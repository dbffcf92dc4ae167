/* CPU matmul C = alpha*op(A)*op(B) + beta*C: cache-blocked (packed panels), register-blocked
 * FMA micro-kernel, OpenMP over output tiles; a strided one-thread form for attention. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/error.h"
#include "cpu/cpu_internal.h"

/* The micro-kernel computes an MR x NR block of C from a packed MR-row sliver of op(A) and a
 * packed NR-column sliver of op(B), both stored k-major. Accumulators stay in registers: the
 * AVX-512 kernel uses 2*MR of the 32 zmm registers, AVX2 2*MR of the 16 ymm registers. FMA
 * intrinsics are used because ISO C mode (-std=c11) turns off floating-point contraction.
 * Which one is the instruction set this build of the file is compiled for (one build per CPU
 * kernel, chosen at run time: cpu_internal.h). AVX-512 and AVX2 give the same bits (each
 * element is fused-multiply-added over k in the same order); the portable one rounds each
 * product before adding it. */
#if defined(__AVX512F__)
#include <immintrin.h>
typedef __m512 vf;
#define VW 16
#define MR 12
#define V_ZERO() _mm512_setzero_ps()
#define V_LOAD(p) _mm512_load_ps(p)
#define V_STORE(p, x) _mm512_store_ps(p, x)
#define V_BCAST(s) _mm512_set1_ps(s)
#define V_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
typedef __m256 vf;
#define VW 8
#define MR 6
#define V_ZERO() _mm256_setzero_ps()
#define V_LOAD(p) _mm256_load_ps(p)
#define V_STORE(p, x) _mm256_store_ps(p, x)
#define V_BCAST(s) _mm256_set1_ps(s)
#define V_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#else
/* Portable: GCC/Clang vector extension, multiply then add, in 128-bit vectors, which every
 * 64-bit target has (SSE2, NEON): wider ones are split by the compiler and spill registers
 * (32-byte vectors ran ten times slower on x86-64's baseline). */
typedef float vf __attribute__((vector_size(16), aligned(16)));
#define VW 4
#define MR 6
#define V_ZERO() ((vf){0})
#define V_LOAD(p) (*(const vf *)(p))
#define V_STORE(p, x) (*(vf *)(p) = (x))
#define V_BCAST(s) ((vf){0} + (s))
#define V_FMA(a, b, c) ((a) * (b) + (c))
#endif

#define NR (2 * VW)
/* Cache blocks: a KC x NR sliver of B stays in L1 while the MC x KC block of A (L2) streams
 * past it; the KC x NC block of B sits in L2 as well. KC is fixed: it sets the order of the
 * additions into C, so it must not depend on the thread count (tile shapes do not). */
#define KC 256
#define MC (MR * 8)
#define NC (NR * 8)

static void kernel(int64_t kc, const float *restrict a, const float *restrict b,
                   float *restrict out) {
    vf c0[MR], c1[MR];
#pragma GCC unroll 16
    for (int i = 0; i < MR; i++) c0[i] = c1[i] = V_ZERO();
    for (int64_t k = 0; k < kc; k++) {
        vf b0 = V_LOAD(b), b1 = V_LOAD(b + VW);
#pragma GCC unroll 16
        for (int i = 0; i < MR; i++) {
            vf ai = V_BCAST(a[i]);
            c0[i] = V_FMA(ai, b0, c0[i]);
            c1[i] = V_FMA(ai, b1, c1[i]);
        }
        a += MR;
        b += NR;
    }
#pragma GCC unroll 16
    for (int i = 0; i < MR; i++) {
        V_STORE(out + i * NR, c0[i]);
        V_STORE(out + i * NR + VW, c1[i]);
    }
}

/* Packs rows [i0, i0+mc) x cols [p0, p0+kc) of op(A) into MR-row slivers, zero padded.
 * Element (i, k) of op(A) is A[i*lda + k], or A[k*lda + i] when transposed. */
static void pack_a(float *restrict dst, const float *A, int64_t lda, int transA, int64_t i0,
                   int64_t mc, int64_t p0, int64_t kc) {
    for (int64_t is = 0; is < mc; is += MR) {
        int64_t mr = mc - is < MR ? mc - is : MR;
        float *d = dst + is * kc;
        if (transA) { /* A stored [K, M]: rows of the sliver are contiguous in memory */
            for (int64_t k = 0; k < kc; k++) {
                const float *s = A + (p0 + k) * lda + i0 + is;
                int64_t i = 0;
                for (; i < mr; i++) d[k * MR + i] = s[i];
                for (; i < MR; i++) d[k * MR + i] = 0.0f;
            }
        } else { /* A stored [M, K] */
            for (int64_t i = 0; i < MR; i++) {
                if (i < mr) {
                    const float *s = A + (i0 + is + i) * lda + p0;
                    for (int64_t k = 0; k < kc; k++) d[k * MR + i] = s[k];
                } else {
                    for (int64_t k = 0; k < kc; k++) d[k * MR + i] = 0.0f;
                }
            }
        }
    }
}

/* Packs rows [p0, p0+kc) x cols [j0, j0+nc) of op(B) into NR-column slivers, zero padded.
 * Element (k, j) of op(B) is B[k*ldb + j], or B[j*ldb + k] when transposed. */
static void pack_b(float *restrict dst, const float *B, int64_t ldb, int transB, int64_t p0,
                   int64_t kc, int64_t j0, int64_t nc) {
    for (int64_t js = 0; js < nc; js += NR) {
        int64_t nr = nc - js < NR ? nc - js : NR;
        float *d = dst + js * kc;
        if (!transB) { /* B stored [K, N] */
            for (int64_t k = 0; k < kc; k++) {
                const float *s = B + (p0 + k) * ldb + j0 + js;
                int64_t j = 0;
                for (; j < nr; j++) d[k * NR + j] = s[j];
                for (; j < NR; j++) d[k * NR + j] = 0.0f;
            }
        } else { /* B stored [N, K] */
            for (int64_t j = 0; j < NR; j++) {
                if (j < nr) {
                    const float *s = B + (j0 + js + j) * ldb + p0;
                    for (int64_t k = 0; k < kc; k++) d[k * NR + j] = s[k];
                } else {
                    for (int64_t k = 0; k < kc; k++) d[k * NR + j] = 0.0f;
                }
            }
        }
    }
}

/* Writes an mr x nr block (of the MR x NR kernel result t) into C. The first K block
 * applies beta (beta == 0 never reads C), later ones add. */
static void store_block(float *C, int64_t ldc, const float *t, int64_t mr, int64_t nr,
                        float alpha, float beta, int first) {
    for (int64_t i = 0; i < mr; i++) {
        float *c = C + i * ldc;
        const float *s = t + i * NR;
        if (!first) {
#pragma omp simd
            for (int64_t j = 0; j < nr; j++) c[j] += alpha * s[j];
        } else if (beta == 0.0f) {
#pragma omp simd
            for (int64_t j = 0; j < nr; j++) c[j] = alpha * s[j];
        } else {
#pragma omp simd
            for (int64_t j = 0; j < nr; j++) c[j] = beta * c[j] + alpha * s[j];
        }
    }
}

/* Rows [i0, i0+mt) x cols [j0, j0+nc) of C, all of K, by one thread: per K block, the
 * B block is packed once and the rows go past it MC at a time. */
static void tile(const tz_cpu_gemm_args *g, int64_t i0, int64_t mt, int64_t j0, int64_t nc,
                 float *ws) {
    float *ap = ws;                   /* MC x KC */
    float *bp = ws + (size_t)MC * KC; /* KC x NC */
    _Alignas(64) float t[MR * NR];
    for (int64_t p0 = 0; p0 < g->K; p0 += KC) {
        int64_t kc = g->K - p0 < KC ? g->K - p0 : KC;
        pack_b(bp, g->B, g->ldb, g->transB, p0, kc, j0, nc);
        for (int64_t ic = i0; ic < i0 + mt; ic += MC) {
            int64_t mc = i0 + mt - ic < MC ? i0 + mt - ic : MC;
            pack_a(ap, g->A, g->lda, g->transA, ic, mc, p0, kc);
            for (int64_t js = 0; js < nc; js += NR) {
                int64_t nr = nc - js < NR ? nc - js : NR;
                for (int64_t is = 0; is < mc; is += MR) {
                    int64_t mr = mc - is < MR ? mc - is : MR;
                    kernel(kc, ap + is * kc, bp + js * kc, t);
                    store_block(g->C + (ic + is) * g->ldc + j0 + js, g->ldc, t, mr, nr,
                                g->alpha, g->beta, p0 == 0);
                }
            }
        }
    }
}

size_t TZ_CPU_K(tz_cpu_gemm_ws_floats)(void) { return (size_t)MC * KC + (size_t)KC * NC; }

void TZ_CPU_K(tz_cpu_gemm_serial)(const tz_cpu_gemm_args *g, float *ws) {
    if (g->M <= 0 || g->N <= 0) return;
    if (g->K <= 0 || g->alpha == 0.0f) { /* C = beta*C, rows of a strided C */
        for (int64_t i = 0; i < g->M; i++) {
            float *c = g->C + i * g->ldc;
            for (int64_t j = 0; j < g->N; j++) c[j] = g->beta == 0.0f ? 0.0f : g->beta * c[j];
        }
        return;
    }
    for (int64_t j0 = 0; j0 < g->N; j0 += NC)
        tile(g, 0, g->M, j0, g->N - j0 < NC ? g->N - j0 : NC, ws);
}

/* C = beta*C (beta == 0 writes zeros), for K == 0 or alpha == 0. */
static void scale_only(tz_backend *be, float *C, int64_t n, float beta) {
    int nt = tz_cpu_threads(be);
    if (beta == 0.0f) {
#pragma omp parallel for simd schedule(static) num_threads(nt) if (n >= TZ_CPU_PAR_MIN)
        for (int64_t i = 0; i < n; i++) C[i] = 0.0f;
    } else if (beta != 1.0f) {
#pragma omp parallel for simd schedule(static) num_threads(nt) if (n >= TZ_CPU_PAR_MIN)
        for (int64_t i = 0; i < n; i++) C[i] *= beta;
    }
}

static void cpu_matmul(tz_backend *be, float *C, const float *A, const float *B, int64_t M,
                       int64_t N, int64_t K, int transA, int transB, float alpha, float beta) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0 || alpha == 0.0f) {
        scale_only(be, C, M * N, beta);
        return;
    }
    /* Tiles of C, one thread each: column strips NC wide (each packs its B blocks once),
     * cut into row bands (each packs its rows of A once per strip) until there are two
     * tiles per thread; narrower strips when M is too small to cut. Tile shapes change
     * which thread computes an element, never the order of its additions. */
    int nt = tz_cpu_threads(be);
    if (2.0 * (double)M * (double)N * (double)K < 1e6) nt = 1; /* not worth a team */
    int64_t want = nt > 1 ? 2 * (int64_t)nt : 1, nc = NC, mt = M;
    if ((N + nc - 1) / nc < want) {
        int64_t bands = (want + (N + nc - 1) / nc - 1) / ((N + nc - 1) / nc);
        mt = ((M + bands - 1) / bands + MR - 1) / MR * MR;
    }
    while (((M + mt - 1) / mt) * ((N + nc - 1) / nc) < want && nc > NR) nc -= NR;
    int64_t tm = (M + mt - 1) / mt, tn = (N + nc - 1) / nc, ntiles = tm * tn;
    if (ntiles < nt) nt = (int)ntiles;
    tz_cpu_ws_reserve(be, nt);
    size_t wsz = TZ_CPU_K(tz_cpu_gemm_ws_floats)();
    tz_cpu_gemm_args g = {C, N, A, transA ? M : K, transA, B, transB ? K : N, transB,
                          M, N, K, alpha, beta};
#pragma omp parallel num_threads(nt)
    {
        float *ws = tz_cpu_ws_get(be, omp_get_thread_num(), wsz);
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < ntiles; t++) {
            int64_t i0 = (t % tm) * mt, j0 = (t / tm) * nc;
            int64_t m = M - i0 < mt ? M - i0 : mt, n = N - j0 < nc ? N - j0 : nc;
            tile(&g, i0, m, j0, n, ws);
        }
    }
}

/* Either operand in bf16: widened (exact) into a temporary of its own, then the fp32 GEMM. */
static void cpu_matmul16(tz_backend *be, float *C, const void *A, int a_bf16, const void *B,
                         int b_bf16, int64_t M, int64_t N, int64_t K, int transA, int transB,
                         float alpha, float beta) {
    float *a = NULL, *b = NULL;
    if (a_bf16) {
        a = tz_xmalloc((size_t)(M * K > 0 ? M * K : 1) * sizeof *a);
        be->from_bf16(be, a, (const uint16_t *)A, M * K);
    }
    if (b_bf16) {
        b = tz_xmalloc((size_t)(K * N > 0 ? K * N : 1) * sizeof *b);
        be->from_bf16(be, b, (const uint16_t *)B, K * N);
    }
    cpu_matmul(be, C, a ? a : (const float *)A, b ? b : (const float *)B, M, N, K, transA,
               transB, alpha, beta);
    free(a);
    free(b);
}

/* The reference: the product (W widened exactly where stored in bf16), then the bias in fp32. */
static void cpu_matmul_bias(tz_backend *be, float *C, const void *A, int a_bf16, const void *W,
                            int w_bf16, const float *bias, int64_t M, int64_t N, int64_t K,
                            int c_bf16) {
    float *c = c_bf16 ? tz_cpu_aligned_alloc((size_t)(M * N > 0 ? M * N : 1) * sizeof *c) : C;
    be->matmul16(be, c, A, a_bf16, W, w_bf16, M, N, K, 0, 1, 1.0f, 0.0f);
    be->bias_add_fwd(be, c, bias, M, N);
    if (!c_bf16) return;
    be->to_bf16(be, (uint16_t *)(void *)C, c, M * N);
    free(c);
}

/* The reference: the product, LoRA's path in fp32 (C += s h B^T), then the bias. */
static void cpu_matmul_lora(tz_backend *be, float *C, const void *A, int a_bf16, const void *W,
                            int w_bf16, const float *h, const float *B, int64_t r, float s,
                            const float *bias, int64_t M, int64_t N, int64_t K) {
    be->matmul16(be, C, A, a_bf16, W, w_bf16, M, N, K, 0, 1, 1.0f, 0.0f);
    if (r > 0) be->matmul(be, C, h, B, M, N, r, 0, 1, s, 1.0f);
    if (bias) be->bias_add_fwd(be, C, bias, M, N);
}

/* B in bf16 (a frozen weight): matmul16 with B's flag alone. */
static void cpu_matmul_bw16(tz_backend *be, float *C, const float *A, const uint16_t *B,
                            int64_t M, int64_t N, int64_t K, int transA, int transB, float alpha,
                            float beta) {
    cpu_matmul16(be, C, A, 0, B, 1, M, N, K, transA, transB, alpha, beta);
}

void TZ_CPU_K(tz_cpu_install_matmul)(tz_backend *be) {
    be->matmul = cpu_matmul;
    be->matmul_bw16 = cpu_matmul_bw16;
    be->matmul16 = cpu_matmul16;
    be->matmul_bias = cpu_matmul_bias;
    be->matmul_lora = cpu_matmul_lora;
}
