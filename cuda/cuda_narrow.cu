/* The narrow GEMMs (docs/design/cuda.md, "Narrow GEMMs"): products where one side of C is at
 * most TZ_NARROW_MAXR wide, which a GEMM library's 128-wide tiles would cut into a few dozen
 * blocks. In their terms Y [P, R] = X [P, K] S [R, K]^T (core/backend.h's tz_narrow_plan): a
 * block of NW_THREADS threads takes TZ_NARROW_ROWS rows of P (a warp 16, one mma row tile) and
 * kc of K, in stages of TZ_NARROW_KC; its sums go to its own slice of a workspace, ws
 * [nsplit][P][R rounded up to 4], and the last block of a row of blocks to finish (a ticket:
 * threadfence, then an atomic count) adds the row's slices in the order of the splits into C.
 * Where X comes from is the kernel's one difference:
 *   k_narrow_part: X in bf16 as stored, each stage's tile copied ahead by cp.async (matmul,
 *     matmul16, matmul_bw16: tz_cuda_gemm's narrow path);
 *   k_narrow_tq: X a TurboQuant weight's codes, loaded into registers two stages ahead and
 *     decoded into the stage (level times the group's scale, rounded to bf16: the bits the
 *     decode writes) after the compute of the stage before, so that the weight is read at its
 *     1 to 4 bits and never written out in bf16 (tq_matmul and tq_matmul_lora on at most 64 rows: a decode
 *     step's, a diffusion transformer's modulation); LoRA's and the bias's columns after W's
 *     (tq_matmul_lora) from a small bf16 [rows, ld - cols] buffer, copied as k_narrow_part
 *     copies. */
#include <cuda_bf16.h>

#include "cuda/cuda_internal.cuh"
#include "cuda/cuda_mma.cuh"

extern "C" {
#include "quant/fwht.h"
}
#include "quant/tq_layout.h"

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

/* Where a narrow kernel's X comes from, one stage at a time: issue (before the compute of
 * the stage before: cp.async into the stage's buffer), load (likewise, into registers) and
 * store (after that compute, from the registers into the buffer). */
struct nx_bf16 { /* X bf16 as stored, [P, K] or (XK) [K, P] at row stride ldx */
    const uint16_t *X;
    int64_t ldx;
    struct regs {};
    __device__ __forceinline__ void init(float *) {}
    template <bool XK>
    __device__ __forceinline__ void issue(uint16_t *Xs, int64_t P, int64_t K, int64_t p0,
                                          int64_t k0) const {
        nw_stage<XK>(Xs, X, ldx, P, K, p0, k0);
    }
    template <bool XK>
    __device__ __forceinline__ void load(regs &, int64_t, int64_t, int64_t, int64_t) const {}
    __device__ __forceinline__ void store(uint16_t *, const regs &) const {}
};

/* Code j (0..31) of 32 consecutive codes of BITS bits, packed little-endian in c. */
template <int BITS>
__device__ __forceinline__ unsigned tq_code(const uint32_t (&c)[BITS], int j) {
    const int bit = j * BITS, w = bit >> 5, s = bit & 31;
    unsigned v = c[w] >> s;
    if (s + BITS > 32) v |= (w + 1 < BITS ? c[w + 1] : 0u) << (32 - s);
    return v & ((1u << BITS) - 1u);
}

/* X a TurboQuant weight W [rows, cols] (cols a multiple of 64; codes of BITS bits in octets,
 * one bf16 scale a group of 1 << gshift): XK = 0, X = [W | T] [P = rows, K = cols + tw] (T the
 * columns after W's, bf16 [rows, tw], tw a multiple of 8); XK = 1, X = W^T, W stored [K =
 * rows, P = cols]. A stage is 64 rows of the tile by 64 columns; a thread takes 32 of a row
 * (thread t: row t / 2, half t % 2), BITS words of codes and a scale (W's rows and columns lie
 * within one group at a time: groups of 64 to 256, stages at multiples of 64). wide: codes
 * 4-byte aligned (word loads; else bytes: the same values). */
template <int BITS>
struct nx_tq {
    const uint8_t *codes;
    const uint16_t *scales;
    const float *levels;
    int64_t cols;
    int gshift, wide;
    const uint16_t *T;
    int64_t tw;
    const float *lv; /* the levels in shared memory (init) */
    struct regs {
        uint32_t c[BITS];
        float sc;
        int st; /* 0: nothing to store (a stage of T's, copied by issue); 1: decode; 2: zeros */
    };
    __device__ __forceinline__ void init(float *sh) {
        if (threadIdx.x < (1u << BITS)) sh[threadIdx.x] = levels[threadIdx.x];
        lv = sh;
    }
    template <bool XK>
    __device__ __forceinline__ void issue(uint16_t *Xs, int64_t P, int64_t K, int64_t p0,
                                          int64_t k0) const {
        if (!XK && k0 >= cols) nw_stage<false>(Xs, T, tw, P, tw, p0, k0 - cols);
    }
    template <bool XK>
    __device__ __forceinline__ void load(regs &x, int64_t P, int64_t K, int64_t p0,
                                         int64_t k0) const {
        const int r = threadIdx.x >> 1, h = threadIdx.x & 1;
        x.st = 0;
        if (!XK && k0 >= cols) return;
        const int64_t wr = XK ? k0 + r : p0 + r, wc = XK ? p0 + 32 * h : k0 + 32 * h;
        x.st = (XK ? wr < K && wc < P : wr < P) ? 1 : 2;
        if (x.st == 2) return;
        const int64_t e = wr * cols + wc;
        x.sc = __uint_as_float((unsigned)scales[e >> gshift] << 16); /* bf16 -> fp32 */
        const uint8_t *p = codes + (e >> 3) * BITS;
#pragma unroll
        for (int b = 0; b < BITS; b++)
            x.c[b] = wide ? reinterpret_cast<const uint32_t *>(p)[b]
                          : (uint32_t)p[4 * b] | (uint32_t)p[4 * b + 1] << 8 |
                                (uint32_t)p[4 * b + 2] << 16 | (uint32_t)p[4 * b + 3] << 24;
    }
    __device__ __forceinline__ void store(uint16_t *Xs, const regs &x) const {
        if (x.st == 0) return;
        uint4 *dst = reinterpret_cast<uint4 *>(Xs + (threadIdx.x >> 1) * NW_LD +
                                               (threadIdx.x & 1) * 32);
        uint32_t pk[16];
        if (x.st == 2) { /* past W's rows (or columns): zeros */
#pragma unroll
            for (int j = 0; j < 16; j++) pk[j] = 0u;
        } else {
#pragma unroll
            for (int j = 0; j < 16; j++)
                pk[j] = (uint32_t)tz_bf16_bits(x.sc * lv[tq_code<BITS>(x.c, 2 * j)]) |
                        (uint32_t)tz_bf16_bits(x.sc * lv[tq_code<BITS>(x.c, 2 * j + 1)]) << 16;
        }
#pragma unroll
        for (int q = 0; q < 4; q++) {
            uint4 u;
            u.x = pk[4 * q], u.y = pk[4 * q + 1], u.z = pk[4 * q + 2], u.w = pk[4 * q + 3];
            dst[q] = u;
        }
    }
};

/* ws [blockIdx.y][p][j] = sum over the block's kc of K of X[p][k] S[j][k], for its 64 p; the
 * row's last block then C = alpha (the splits' sums added in order) + beta C for those p (C
 * [P, R], or yt: [R, P]; fp32, or c16: bf16 bits; beta = 0 does not read C) and resets the
 * row's ticket. NT: rpad / 8 mma column tiles; XK: X stored [K, P]; xs: where X comes from.
 * Stages: three (two ahead) up to 32 columns, two at 64 (under the 48 KiB every launch may
 * take). */
template <int NT, bool XK, class XS, class TS>
__device__ __forceinline__ void nw_body(float *ws, const XS &xs, const TS *S, int sk, int64_t P,
                                        int64_t K, int64_t kc, void *C, int c16, int yt,
                                        int64_t R, float alpha, float beta, unsigned *count) {
    constexpr int ST = NT == 8 ? 2 : 3, PER = (64 + NT * 8) * NW_LD;
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
    /* X's, where it is loaded into registers: stage nx's (loaded the round before) and nx +
     * 1's (loaded in round i), so that a load has two rounds to arrive, not one */
    typename XS::regs xv, xn;
#pragma unroll
    for (int s = 0; s < ST - 1; s++) {
        if (s < nch) {
            uint16_t *buf = sm + s * PER;
            xs.template issue<XK>(buf, P, K, p0, kb + s * 64);
            xs.template load<XK>(xv, P, K, p0, kb + s * 64);
            xs.store(buf, xv);
            nw_s_load<NT>(sv, S, sk, R, K, kb + s * 64);
            nw_s_store<NT>(buf + 64 * NW_LD, sv, sk);
        }
        tz_cp_async_commit();
    }
    if (ST - 1 < nch) xs.template load<XK>(xv, P, K, p0, kb + (ST - 1) * 64);
    for (int i = 0; i < nch; i++) {
        tz_cp_async_wait<ST - 2>(); /* stage i copied (this thread's part) */
        __syncthreads();            /* everyone's part; and stage i - 1 no longer read */
        const int nx = i + ST - 1;
        if (nx < nch) {
            xs.template issue<XK>(sm + (nx % ST) * PER, P, K, p0, kb + (int64_t)nx * 64);
            if (nx + 1 < nch) xs.template load<XK>(xn, P, K, p0, kb + (int64_t)(nx + 1) * 64);
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
        if (nx < nch) {
            xs.store(sm + (nx % ST) * PER, xv);
            xv = xn;
            nw_s_store<NT>(sm + (nx % ST) * PER + 64 * NW_LD, sv, sk);
        }
    }
    tz_cp_async_wait<0>(); /* (the empty groups of the last stages) */
    /* the columns of R rounded up to 4 (a pair of them wholly in or out), at that stride: a
     * decode step's one row writes and reads 4 floats a row of P, not rpad */
    const int R4 = (int)((R + 3) & ~(int64_t)3);
    float *o = ws + (int64_t)blockIdx.y * P * R4;
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int64_t p = p0 + w * 16 + g + 8 * h;
        if (p >= P) continue;
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
            if (nt * 8 + 2 * t < R4) {
                o[p * R4 + nt * 8 + 2 * t] = acc[nt][2 * h];
                o[p * R4 + nt * 8 + 2 * t + 1] = acc[nt][2 * h + 1];
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
    /* a thread's 4 columns of a row at a time (up to RP / 8 such a thread), the splits'
     * float4s loaded 4 at a time before any is added, so that the tail waits for the L2 a few
     * times rather than once a split; each element's sum in the order of the splits */
    const int64_t ns = gridDim.y;
#pragma unroll 1
    for (int e = threadIdx.x; e < 64 * (R4 / 4); e += NW_THREADS) {
        const int64_t p = p0 + e % 64;
        const int q = e / 64;
        if (p >= P) continue;
        const float4 *src = (const float4 *)(ws + p * R4) + q;
        const int64_t step = P * R4 / 4; /* one split's slice, in float4s */
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
                const int64_t at = yt ? j * P + p : p * R + j;
                if (c16) {
                    uint16_t *c = (uint16_t *)C + at;
                    *c = tz_bf16_bits(beta == 0.0f ? alpha * v[u]
                                                   : alpha * v[u] + beta * tz_get(c));
                } else {
                    float *c = (float *)C + at;
                    *c = beta == 0.0f ? alpha * v[u] : alpha * v[u] + beta * *c;
                }
            }
        }
    }
    if (threadIdx.x == 0) count[blockIdx.x] = 0u;
}


template <int NT, bool XK, class TS>
__global__ void __launch_bounds__(NW_THREADS)
    k_narrow_part(float *ws, nx_bf16 xs, const TS *S, int sk, int64_t P, int64_t K, int64_t kc,
                  float *C, int yt, int64_t R, float alpha, float beta, unsigned *count) {
    nw_body<NT, XK>(ws, xs, S, sk, P, K, kc, C, 0, yt, R, alpha, beta, count);
}
/* M narrow (C = Y^T [R, P]), S = A [R, K] in bf16 */
template <int NT, bool XK, int BITS>
__global__ void __launch_bounds__(NW_THREADS)
    k_narrow_tq(float *ws, nx_tq<BITS> xs, const uint16_t *S, int64_t P, int64_t K, int64_t kc,
                void *C, int c16, int64_t R, float alpha, float beta, unsigned *count) {
    __shared__ float lv[1 << BITS];
    xs.init(lv);
    __syncthreads();
    nw_body<NT, XK>(ws, xs, S, 0, P, K, kc, C, c16, 1, R, alpha, beta, count);
}

/* A narrow kernel's dynamic shared memory at rpad columns: 34.5 KiB at 16, 40.5 at 32, 36 at
 * 64 (k_narrow_tq's levels are static, 64 bytes at most) */
static size_t narrow_smem(int64_t rpad) {
    return (size_t)(rpad == 64 ? 2 : 3) * (size_t)(64 + rpad) * NW_LD * 2 + 16;
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

/* Whether a plan's kernel fits the device's blocks (no GPU since sm_70 has under 48 KiB; the
 * emulation can) */
static int narrow_fits(tz_backend *be, const tz_narrow &np) {
    return narrow_smem(np.rpad) <= tz_cuda_ctx_of(be)->smem_optin;
}

static dim3 narrow_grid(const tz_narrow &np) {
    return dim3((unsigned)((np.P + 63) / 64), (unsigned)np.nsplit);
}

template <int NT, bool XK, class TS>
static void narrow_launch(tz_backend *be, const tz_narrow &np, float *ws, const uint16_t *X,
                          const TS *S, float *C, float alpha, float beta, unsigned *count) {
    const nx_bf16 xs = {X, XK ? np.P : np.K};
    k_narrow_part<NT, XK, TS><<<narrow_grid(np), NW_THREADS, narrow_smem(NT * 8),
                                tz_cuda_stream(be)>>>(ws, xs, S, np.sk, np.P, np.K, np.kc, C,
                                                      np.yt, np.R, alpha, beta, count);
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

/* A bf16 GEMM by k_narrow_part where tz_narrow_plan takes it: X as stored where it is bf16
 * and 16-byte aligned (else rounded, or copied, into the GEMM operands' buffer), S read as
 * stored (rounded to bf16 on its way into shared memory), the workspace in the operands'
 * buffer. 1: done. */
int tz_cuda_narrow_gemm(tz_backend *be, float *C, const void *A, int a16, const void *B,
                        int b16, int64_t M, int64_t N, int64_t K, int ta, int tb, float alpha,
                        float beta) {
    tz_narrow np;
    if (!tz_narrow_plan(be->narrow_gemm, M, N, K, ta, tb, &np) || !narrow_fits(be, np)) return 0;
    const void *X = np.yt ? B : A, *S = np.yt ? A : B;
    const int x16 = np.yt ? b16 : a16, s16in = np.yt ? a16 : b16;
    const int xin = x16 && (uintptr_t)X % 16 == 0; /* X read where it is */
    const int64_t nx16 = xin ? 0 : (np.P * K + 127) / 128 * 128;
    const size_t bytes = (size_t)nx16 * 2 + (size_t)(np.nsplit * np.P * np.rpad) * 4;
    uint16_t *xb = (uint16_t *)tz_cuda_gemm_operands(be, bytes);
    float *ws = (float *)(xb + nx16);
    tz_cuda_check_apart(S, s16in ? (np.R * K + 1) / 2 : np.R * K, xb, bytes, "S");
    tz_cuda_check_apart(X, x16 ? (np.P * K + 1) / 2 : np.P * K, xb, bytes, "X");
    tz_cuda_check_apart(C, M * N, xb, bytes, "C");
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

template <int NT, bool XK, int BITS>
static void narrow_tq_launch(tz_backend *be, const tz_narrow &np, float *ws,
                             const nx_tq<BITS> &xs, const uint16_t *S, void *C, int c16,
                             float alpha, float beta, unsigned *count) {
    k_narrow_tq<NT, XK, BITS><<<narrow_grid(np), NW_THREADS, narrow_smem(NT * 8),
                                tz_cuda_stream(be)>>>(ws, xs, S, np.P, np.K, np.kc, C, c16,
                                                      np.R, alpha, beta, count);
    CUDA_LAUNCHED();
}
template <int BITS>
static void narrow_tq_go(tz_backend *be, const tz_narrow &np, float *ws, const nx_tq<BITS> &xs,
                         const uint16_t *S, void *C, int c16, float alpha, float beta,
                         unsigned *tk) {
#define NQ_GO(NT, XK) narrow_tq_launch<NT, XK, BITS>(be, np, ws, xs, S, C, c16, alpha, beta, tk)
    if (np.rpad == 16) np.xk ? NQ_GO(2, true) : NQ_GO(2, false);
    else if (np.rpad == 32) np.xk ? NQ_GO(4, true) : NQ_GO(4, false);
    else np.xk ? NQ_GO(8, true) : NQ_GO(8, false);
#undef NQ_GO
}

/* tq_matmul's and tq_matmul_lora's product by k_narrow_tq (cuda_internal.cuh): the operands'
 * buffer holds the workspace, then T (LoRA's and the bias's columns, [rows, ld - cols] bf16,
 * written by tz_cuda_lora_cols), then A rounded to bf16 where it comes in fp32. */
int tz_cuda_narrow_tq(tz_backend *be, void *C, int c16, const void *A, int a16,
                      const uint8_t *codes, const uint16_t *scales, const float *levels,
                      int64_t rows, int64_t cols, int64_t ld, int bits, int group,
                      const float *B, int64_t r, float s, const float *bias, int64_t M,
                      int transW, float alpha, float beta) {
    tz_narrow np;
    if (!tz_tq_fused_plan(be, M, rows, cols, ld, transW, &np) || !narrow_fits(be, np)) return 0;
    char err[200]; /* (the callers checked the shape; the kernel's group shift relies on it) */
    if (tz_tq_check_shape(cols, group, err, sizeof err)) TZ_FATAL("tq_matmul: %s", err);
    if (bits < 1 || bits > TZ_TQ_MAX_BITS)
        TZ_FATAL("tq_matmul: bits %d out of range (1 to %d)", bits, TZ_TQ_MAX_BITS);
    const int64_t tw = transW ? ld - cols : 0, K = np.K;
    const int64_t nws = (np.nsplit * np.P * np.rpad + 63) / 64 * 64; /* floats, 256 bytes */
    const int64_t nt = (rows * tw + 127) / 128 * 128, na = a16 ? 0 : M * K;
    const size_t bytes = (size_t)nws * 4 + (size_t)(nt + na) * 2;
    float *ws = (float *)tz_cuda_gemm_operands(be, bytes);
    uint16_t *T = (uint16_t *)(ws + nws), *a = T + nt;
    tz_cuda_check_apart(C, c16 ? (M * np.P + 1) / 2 : M * np.P, ws, bytes, "C");
    tz_cuda_check_apart(A, a16 ? (M * K + 1) / 2 : M * K, ws, bytes, "A");
    cudaStream_t st = tz_cuda_stream(be);
    /* codes may be streamed in: the emulation checks the reads against the stream */
    CUDA_CHECK(tz_cuda_kernel_reads(st, codes, (size_t)(rows * (cols / 8) * bits), "tq_matmul"));
    CUDA_CHECK(tz_cuda_kernel_reads(st, scales, (size_t)(rows * (cols / group)) * 2, "tq_matmul"));
    CUDA_CHECK(tz_cuda_kernel_reads(st, A, (size_t)(M * K) * (a16 ? 2 : 4), "tq_matmul"));
    if (tw) tz_cuda_lora_cols(st, T, tw, 0, B, B ? r : 0, s, bias != NULL, bias, rows);
    if (!a16) tz_cuda_to_bf16(be, a, (const float *)A, M * K), A = a;
    const int gshift = group == 64 ? 6 : group == 128 ? 7 : 8;
    const int wide = (uintptr_t)codes % 4 == 0;
    unsigned *tk = narrow_tickets(be, (np.P + 63) / 64);
    const uint16_t *S = (const uint16_t *)A;
#define NQ_BITS(BITS)                                                                           \
    narrow_tq_go<BITS>(be, np, ws, nx_tq<BITS>{codes, scales, levels, cols, gshift, wide, T, tw, \
                                               NULL},                                           \
                       S, C, c16, alpha, beta, tk)
    switch (bits) {
    case 1: NQ_BITS(1); break;
    case 2: NQ_BITS(2); break;
    case 3: NQ_BITS(3); break;
    default: NQ_BITS(4); break;
    }
#undef NQ_BITS
    return 1;
}
