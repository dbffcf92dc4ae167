/* CUDA scaled dot-product attention with grouped-query heads (causal or not): the forward
 * saves the log-sum-exp, the backward recomputes the probabilities from q, k and lse, so memory
 * is never B*H*T*T; and attention against a key/value cache (generation). Three ways to the
 * same results, chosen by the GEMM operand type (be->matmul_dtype, run.precision) and the head
 * dimension D:
 *   bf16, D <= 128 (a GPU's default): flash style on the tensor cores, bf16 mma.sync tiles
 *     (cuda/cuda_mma.cuh), the scores kept in registers, online softmax in fp32, the next
 *     tile copied into shared memory by cp.async while the current one is computed (bf16
 *     inputs); no workspace but the backward's delta, lse in base 2 and dO in bf16.
 *   bf16, D > 128: chunks of query rows through cuBLAS strided-batched GEMMs on the tensor
 *     cores (TF32 products of the fp32 activations, fp32 sums), the chunk's scores in the
 *     workspace the caller lends (be->att_ws, core/backend.h), an fp32 softmax kernel between
 *     the GEMMs. Memory O(chunk * T) for the scores, O(B H T) for lse and delta.
 *   fp32: flash style on CUDA cores with the CPU's arithmetic (fp32 products): keys streamed
 *     through shared memory with an online softmax, no workspace; head dimension <= 128.
 * Why these, the tiles, the chunk size and the GQA batching: docs/design/cuda.md ("Attention
 * on tensor cores", "Flash attention on the tensor cores", under "The CUDA backend"). */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_internal.cuh"
#include "cuda/cuda_mma.cuh"

/* ================= fp32: flash style on CUDA cores =================
 * Work split (no atomics; every output row has one writer):
 *   forward and dq: a block of ROWS warps, one query row each, of one (b, query head);
 *   dk, dv:         a block of ROWS warps, one key row each, of one (b, kv head), adding the
 *                   group's query heads in order.
 * Within a warp, lane j takes key (or query) j of the TILE-long tile in shared memory for the
 * scores, and lane l owns head dimensions l, l + 32, ... of the accumulators (D <= 128: four
 * values per lane). */
#define ROWS 8  /* warps per block */
#define TILE 32 /* keys (queries) per shared-memory tile: one per lane */
#define MAXD 128
#define FA_LOG2E 1.4426950408889634f

typedef struct {
    int64_t B, T, Hq, Hkv, D, rep;
    int64_t ldq, ldkv, ldo; /* row strides: q and dq; k, v, dk, dv; out and dout (tz_att_ld) */
    int causal;
    float scale;
    int vec4; /* the tensor-core kernels' staging may read float4s (fa_vec4) */
    int acc;  /* backward: add into dq, dk, dv (1), or write them (0: never read) */
    int in16; /* q, k, v given in bf16 (tz_att_ld.in16): the flash kernels' TI */
    int pipe; /* the flash kernels' bf16 tiles copied ahead by cp.async (fa_pipe) */
    int d16;  /* backward: the gradients written in bf16 (tz_att_ld.d16: TZ_ATT_DQ16, DK16,
               * DV16; the flash kernels on the tensor cores, accumulate 0) */
} att_shape;

/* The flash backward's score gradients kept (fa_bwd, be->att_ds), a parameter of their kernels
 * alone (in att_shape, 32 bytes more of it, ptxas spilled 40 bytes more of k_fa_fwd_wide):
 * one group's tiles, its first (sequence, kv head) pair, its pairs, tiles per query head */
typedef struct {
    uint16_t *ds;
    int64_t p0, np, tiles;
} fa_dsp;

/* A backward output element: added to, or written without reading what was there. */
__device__ __forceinline__ void att_out(float *p, float x, const att_shape &sh) {
    if (sh.acc) *p += x;
    else *p = x;
}


/* Whether query t sees key s: both within the sequence, and s <= t when causal. */
__device__ __forceinline__ bool visible(const att_shape &sh, int64_t t, int64_t s) {
    return t < sh.T && s < sh.T && (!sh.causal || s <= t);
}

/* Element offset of head h of row (b, t) in a tensor of T rows per sequence at stride ld. */
__host__ __device__ __forceinline__ int64_t at(int64_t b, int64_t t, int64_t h, int64_t T,
                                               int64_t ld, int64_t D) {
    return (b * T + t) * ld + h * D;
}

/* Loads rows [t0, t0 + TILE) of head h of x (rows at stride ld) into dst[TILE][D + 1] (rows
 * past T are zeros), by the whole block. */
__device__ void load_tile(float *dst, const float *x, int64_t b, int64_t t0, int64_t h,
                          int64_t T, int64_t ld, int64_t D) {
    for (int64_t e = threadIdx.x; e < TILE * D; e += blockDim.x) {
        int64_t j = e / D, d = e % D, t = t0 + j;
        dst[j * (D + 1) + d] = t < T ? x[at(b, t, h, T, ld, D) + d] : 0.0f;
    }
}

/* a . b over D, a in shared memory read by every lane (broadcast), b a padded tile row. */
__device__ __forceinline__ float dot_row(const float *a, const float *b, int64_t D) {
    float s = 0.0f;
    for (int64_t d = 0; d < D; d++) s += a[d] * b[d];
    return s;
}

/* ---- forward ---- */

template <int DPL>
__global__ void k_att_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
                          att_shape sh) {
    extern __shared__ float smem[];
    const int64_t D = sh.D, T = sh.T, ldt = D + 1;
    float *Ks = smem, *Vs = Ks + TILE * ldt, *Qs = Vs + TILE * ldt;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int64_t b = blockIdx.z, h = blockIdx.y, g = h / sh.rep;
    const int64_t t = (int64_t)blockIdx.x * ROWS + w, t_last_blk = (int64_t)blockIdx.x * ROWS + ROWS - 1;
    const bool active = t < T;
    float *qs = Qs + w * D;
    if (active)
        for (int64_t d = lane; d < D; d += 32) qs[d] = q[at(b, t, h, T, sh.ldq, D) + d];

    float m = -INFINITY, l = 0.0f, acc[DPL];
#pragma unroll
    for (int i = 0; i < DPL; i++) acc[i] = 0.0f;
    const int64_t nkeys = sh.causal ? (t_last_blk + 1 < T ? t_last_blk + 1 : T) : T;
    for (int64_t s0 = 0; s0 < nkeys; s0 += TILE) {
        __syncthreads(); /* the previous tile is no longer read (and qs is written) */
        load_tile(Ks, k, b, s0, g, T, sh.ldkv, D);
        load_tile(Vs, v, b, s0, g, T, sh.ldkv, D);
        __syncthreads();
        if (!active) continue;
        const int64_t s = s0 + lane;
        const bool valid = visible(sh, t, s);
        float sc = valid ? sh.scale * dot_row(qs, Ks + lane * ldt, D) : -INFINITY;
        float mt = tz_warp_max_f(sc), mn = fmaxf(m, mt);
        if (mn == -INFINITY) continue; /* nothing visible yet (not reached for s0 = 0) */
        float p = valid ? expf(sc - mn) : 0.0f;
        float corr = expf(m - mn); /* m = -inf: 0 */
        l = l * corr + tz_warp_sum_f(p);
#pragma unroll
        for (int i = 0; i < DPL; i++) acc[i] *= corr;
        for (int j = 0; j < TILE; j++) {
            float pj = __shfl_sync(0xffffffffu, p, j);
            const float *vr = Vs + j * ldt;
#pragma unroll
            for (int i = 0; i < DPL; i++) {
                int64_t d = lane + 32 * i;
                if (d < D) acc[i] += pj * vr[d];
            }
        }
        m = mn;
    }
    if (!active) return;
    float *o = out + at(b, t, h, T, sh.ldo, D);
    float inv = 1.0f / l;
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        int64_t d = lane + 32 * i;
        if (d < D) o[d] = acc[i] * inv;
    }
    if (lane == 0) lse[(b * sh.Hq + h) * T + t] = m + logf(l);
}

/* ---- backward ---- */

/* delta[b, h, t] = dO . O over D, a warp per row; bf16_dout: dO rounded to bf16 first, as the
 * flash kernels' dP = dO . v sees it (then sum_s P_ts dP_ts - delta_t cancels the rounding of
 * dO, which is common to a row's every dP, instead of leaving it in every dS). For the flash
 * kernels that copy their tiles ahead (sh.pipe), also lse2 = lse log2(e) (the base-2 lse they
 * use) and the rounded dO into dout16 [B, T, Hq, D] (dense): what their staging made of lse
 * and dO, ready to be copied as it is. */
static __global__ void k_att_delta(float *delta, const float *dout, const float *out,
                                   att_shape sh, int bf16_dout = 0, float *lse2 = nullptr,
                                   const float *lse = nullptr, uint16_t *dout16 = nullptr) {
    const int lane = threadIdx.x & 31;
    const int64_t rows = sh.B * sh.Hq * sh.T;
    for (int64_t idx = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; idx < rows;
         idx += ((int64_t)gridDim.x * blockDim.x) / 32) {
        int64_t b = idx / (sh.Hq * sh.T), h = (idx / sh.T) % sh.Hq, t = idx % sh.T;
        const float *o = out + at(b, t, h, sh.T, sh.ldo, sh.D);
        const float *d = dout + at(b, t, h, sh.T, sh.ldo, sh.D);
        uint16_t *d16 = dout16 ? dout16 + at(b, t, h, sh.T, sh.Hq * sh.D, sh.D) : nullptr;
        float s = 0.0f;
        for (int64_t i = lane; i < sh.D; i += 32) {
            if (!bf16_dout) {
                s += o[i] * d[i];
                continue;
            }
            const __nv_bfloat16 r = __float2bfloat16_rn(d[i]);
            if (d16) d16[i] = __bfloat16_as_ushort(r);
            s += o[i] * __bfloat162float(r);
        }
        s = tz_warp_sum_f(s);
        if (lane == 0) delta[idx] = s;
        if (lane == 0 && lse2) lse2[idx] = lse[idx] * FA_LOG2E;
    }
}

/* dq[t] += scale * sum_s P_ts (dP_ts - delta_t) k_s, dP_ts = dO_t . v_s. */
template <int DPL>
__global__ void k_att_dq(float *dq, const float *dout, const float *lse, const float *delta,
                         const float *q, const float *k, const float *v, att_shape sh) {
    extern __shared__ float smem[];
    const int64_t D = sh.D, T = sh.T, ldt = D + 1;
    float *Ks = smem, *Vs = Ks + TILE * ldt, *Qs = Vs + TILE * ldt, *Gs = Qs + ROWS * D;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int64_t b = blockIdx.z, h = blockIdx.y, g = h / sh.rep;
    const int64_t t = (int64_t)blockIdx.x * ROWS + w, t_last_blk = (int64_t)blockIdx.x * ROWS + ROWS - 1;
    const bool active = t < T;
    float *qs = Qs + w * D, *gs = Gs + w * D;
    float l = 0.0f, dl = 0.0f;
    if (active) {
        const int64_t rq = at(b, t, h, T, sh.ldq, D), ro = at(b, t, h, T, sh.ldo, D);
        for (int64_t d = lane; d < D; d += 32) {
            qs[d] = q[rq + d];
            gs[d] = dout[ro + d];
        }
        l = lse[(b * sh.Hq + h) * T + t];
        dl = delta[(b * sh.Hq + h) * T + t];
    }
    float acc[DPL];
#pragma unroll
    for (int i = 0; i < DPL; i++) acc[i] = 0.0f;
    const int64_t nkeys = sh.causal ? (t_last_blk + 1 < T ? t_last_blk + 1 : T) : T;
    for (int64_t s0 = 0; s0 < nkeys; s0 += TILE) {
        __syncthreads();
        load_tile(Ks, k, b, s0, g, T, sh.ldkv, D);
        load_tile(Vs, v, b, s0, g, T, sh.ldkv, D);
        __syncthreads();
        if (!active) continue;
        const int64_t s = s0 + lane;
        const bool valid = visible(sh, t, s);
        float ds = 0.0f;
        if (valid) {
            float p = expf(sh.scale * dot_row(qs, Ks + lane * ldt, D) - l);
            ds = p * (dot_row(gs, Vs + lane * ldt, D) - dl);
        }
        for (int j = 0; j < TILE; j++) {
            float dj = __shfl_sync(0xffffffffu, ds, j);
            const float *kr = Ks + j * ldt;
#pragma unroll
            for (int i = 0; i < DPL; i++) {
                int64_t d = lane + 32 * i;
                if (d < D) acc[i] += dj * kr[d];
            }
        }
    }
    if (!active) return;
    float *o = dq + at(b, t, h, T, sh.ldq, D);
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        int64_t d = lane + 32 * i;
        if (d < D) att_out(o + d, sh.scale * acc[i], sh);
    }
}

/* dv[s] += sum_{h in group, t} P_ts dO_t;  dk[s] += scale * sum P_ts (dP_ts - delta_t) q_t. */
template <int DPL>
__global__ void k_att_dkv(float *dk, float *dv, const float *dout, const float *lse,
                          const float *delta, const float *q, const float *k, const float *v,
                          att_shape sh) {
    extern __shared__ float smem[];
    const int64_t D = sh.D, T = sh.T, ldt = D + 1;
    float *Qt = smem, *Gt = Qt + TILE * ldt, *Ks = Gt + TILE * ldt, *Vr = Ks + ROWS * D;
    float *Lt = Vr + ROWS * D, *Dt = Lt + TILE;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int64_t b = blockIdx.z, g = blockIdx.y;
    const int64_t s = (int64_t)blockIdx.x * ROWS + w, s_first_blk = (int64_t)blockIdx.x * ROWS;
    const bool active = s < T;
    float *ks = Ks + w * D, *vs = Vr + w * D;
    if (active) {
        int64_t r = at(b, s, g, T, sh.ldkv, D);
        for (int64_t d = lane; d < D; d += 32) {
            ks[d] = k[r + d];
            vs[d] = v[r + d];
        }
    }
    float ak[DPL], av[DPL];
#pragma unroll
    for (int i = 0; i < DPL; i++) ak[i] = av[i] = 0.0f;
    /* queries that can see a key of this block: t >= s_first_blk when causal */
    const int64_t tq0 = sh.causal ? s_first_blk / TILE * TILE : 0;
    for (int64_t r = 0; r < sh.rep; r++) {
        const int64_t h = g * sh.rep + r;
        const float *lr = lse + (b * sh.Hq + h) * T, *dr = delta + (b * sh.Hq + h) * T;
        for (int64_t t0 = tq0; t0 < T; t0 += TILE) {
            __syncthreads();
            load_tile(Qt, q, b, t0, h, T, sh.ldq, D);
            load_tile(Gt, dout, b, t0, h, T, sh.ldo, D);
            if (threadIdx.x < TILE) {
                int64_t t = t0 + threadIdx.x;
                Lt[threadIdx.x] = t < T ? lr[t] : 0.0f;
                Dt[threadIdx.x] = t < T ? dr[t] : 0.0f;
            }
            __syncthreads();
            if (!active) continue;
            const int64_t t = t0 + lane;
            const bool valid = visible(sh, t, s);
            float p = 0.0f, ds = 0.0f;
            if (valid) {
                p = expf(sh.scale * dot_row(ks, Qt + lane * ldt, D) - Lt[lane]);
                ds = p * (dot_row(vs, Gt + lane * ldt, D) - Dt[lane]);
            }
            for (int j = 0; j < TILE; j++) {
                float pj = __shfl_sync(0xffffffffu, p, j);
                float dj = __shfl_sync(0xffffffffu, ds, j);
                const float *qr = Qt + j * ldt, *gr = Gt + j * ldt;
#pragma unroll
                for (int i = 0; i < DPL; i++) {
                    int64_t d = lane + 32 * i;
                    if (d < D) {
                        av[i] += pj * gr[d];
                        ak[i] += dj * qr[d];
                    }
                }
            }
        }
    }
    if (!active) return;
    int64_t r0 = at(b, s, g, T, sh.ldkv, D);
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        int64_t d = lane + 32 * i;
        if (d < D) {
            att_out(dv + r0 + d, av[i], sh);
            att_out(dk + r0 + d, sh.scale * ak[i], sh);
        }
    }
}

static att_shape make_shape(int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D,
                            int causal, const tz_att_ld *ldp) {
    if (Hkv <= 0 || Hq % Hkv != 0)
        TZ_FATAL("attention: Hq=%lld is not a multiple of Hkv=%lld", (long long)Hq,
                 (long long)Hkv);
    const tz_att_ld ld = tz_att_ld_of(ldp, Hq, Hkv, D);
    att_shape s = {B, T, Hq, Hkv, D, Hq / Hkv, ld.q, ld.kv, ld.o, causal,
                   1.0f / sqrtf((float)D), 0, 1, ld.in16, 0, ld.d16};
    return s;
}

/* The limits of the flash kernels: D <= MAXD, the grid's y and z, the query blocks. */
static void flash_check(const att_shape *sh) {
    if (sh->D > MAXD)
        TZ_FATAL_HINT("run.precision = \"bf16\" (attention on tensor cores takes any head "
                      "dimension)", "attention: head dimension %lld is above the fp32 CUDA "
                      "kernel's %d", (long long)sh->D, MAXD);
    if (sh->Hq > 65535 || sh->B > 65535 || (sh->T + ROWS - 1) / ROWS > 2147483647LL)
        TZ_FATAL("attention: B=%lld, T=%lld, Hq=%lld exceed the kernel's grid", (long long)sh->B,
                 (long long)sh->T, (long long)sh->Hq);
}

/* Shared bytes: two padded tiles, two sets of ROWS rows, two TILE vectors (the largest of the
 * three kernels; at D = 128: 41.5 KB, under the 48 KB every GPU gives without opt-in). */
static size_t smem_bytes(int64_t D) {
    return (size_t)(2 * TILE * (D + 1) + 2 * ROWS * D + 2 * TILE) * sizeof(float);
}

static void flash_fwd(tz_backend *be, float *out, float *lse, const float *q, const float *k,
                      const float *v, const att_shape *shp) {
    const att_shape sh = *shp;
    flash_check(&sh);
    dim3 grid((unsigned)((sh.T + ROWS - 1) / ROWS), (unsigned)sh.Hq, (unsigned)sh.B);
    size_t sm = smem_bytes(sh.D);
    cudaStream_t st = tz_cuda_stream(be);
    int dpl = (int)((sh.D + 31) / 32);
    if (dpl == 1) k_att_fwd<1><<<grid, ROWS * 32, sm, st>>>(out, lse, q, k, v, sh);
    else if (dpl == 2) k_att_fwd<2><<<grid, ROWS * 32, sm, st>>>(out, lse, q, k, v, sh);
    else if (dpl == 3) k_att_fwd<3><<<grid, ROWS * 32, sm, st>>>(out, lse, q, k, v, sh);
    else k_att_fwd<4><<<grid, ROWS * 32, sm, st>>>(out, lse, q, k, v, sh);
    CUDA_LAUNCHED();
}

static void flash_bwd(tz_backend *be, float *dq, float *dk, float *dv, const float *dout,
                      const float *out, const float *lse, const float *q, const float *k,
                      const float *v, const att_shape *shp) {
    const att_shape sh = *shp;
    flash_check(&sh);
    cudaStream_t st = tz_cuda_stream(be);
    int64_t rows = sh.B * sh.Hq * sh.T;
    float *delta = (float *)tz_cuda_scratch(be, (size_t)rows * sizeof(float));
    k_att_delta<<<tz_cuda_blocks(rows * 32, 256), 256, 0, st>>>(delta, dout, out, sh);
    CUDA_LAUNCHED();
    size_t sm = smem_bytes(sh.D);
    int dpl = (int)((sh.D + 31) / 32);
    dim3 gq((unsigned)((sh.T + ROWS - 1) / ROWS), (unsigned)sh.Hq, (unsigned)sh.B);
    if (dpl == 1) k_att_dq<1><<<gq, ROWS * 32, sm, st>>>(dq, dout, lse, delta, q, k, v, sh);
    else if (dpl == 2) k_att_dq<2><<<gq, ROWS * 32, sm, st>>>(dq, dout, lse, delta, q, k, v, sh);
    else if (dpl == 3) k_att_dq<3><<<gq, ROWS * 32, sm, st>>>(dq, dout, lse, delta, q, k, v, sh);
    else k_att_dq<4><<<gq, ROWS * 32, sm, st>>>(dq, dout, lse, delta, q, k, v, sh);
    CUDA_LAUNCHED();
    dim3 gk((unsigned)((sh.T + ROWS - 1) / ROWS), (unsigned)sh.Hkv, (unsigned)sh.B);
    if (dpl == 1)
        k_att_dkv<1><<<gk, ROWS * 32, sm, st>>>(dk, dv, dout, lse, delta, q, k, v, sh);
    else if (dpl == 2)
        k_att_dkv<2><<<gk, ROWS * 32, sm, st>>>(dk, dv, dout, lse, delta, q, k, v, sh);
    else if (dpl == 3)
        k_att_dkv<3><<<gk, ROWS * 32, sm, st>>>(dk, dv, dout, lse, delta, q, k, v, sh);
    else k_att_dkv<4><<<gk, ROWS * 32, sm, st>>>(dk, dv, dout, lse, delta, q, k, v, sh);
    CUDA_LAUNCHED();
}

/* ================= bf16: chunks of query rows on the tensor cores =================
 * For the chunk of query rows [t0, t0 + nq), nq <= c, which sees the keys [0, nk) (nk = t0 + nq
 * when causal, else T), every (sequence b, query head h) pair at once:
 *   forward:  S = scale Q_c K^T (GEMM) -> P = softmax(S) in place, lse (kernel) -> O_c = P V;
 *   backward: S = scale Q_c K^T, dP = dO_c V^T (GEMMs) -> P = exp(S - lse) in place of S and
 *             dS = P * (dP - delta) in place of dP (kernel) -> dQ_c += scale dS K,
 *             dK += scale dS^T Q_c, dV += P^T dO_c (GEMMs, accumulating in fp32).
 * Only the causal triangle inside the chunk's last nq keys is computed and then masked.
 * The chunk's scores are [B*Hq][nq][ldS] floats of the workspace, ldS = nk rounded up to 4
 * (16-byte rows). Row-major matrices are handed to the column-major cuBLAS as their
 * transposes, as in cuda_matmul.cu. */

/* The GEMMs' operand and compute types. fp32 activations: fp32 operands, TF32 tensor-core
 * products, fp32 sums and results. bf16 activations will make the operands CUDA_R_16BF with
 * CUBLAS_COMPUTE_32F, and the two kernels below then store P and dS as bf16 (beside the fp32
 * scores, which the softmax keeps reading in fp32) for the GEMMs that read them; lse, delta and
 * every result stay fp32. */
#define ATT_OPERAND CUDA_R_32F
#define ATT_COMPUTE CUBLAS_COMPUTE_32F_FAST_TF32

/* Forward softmax of the chunk, in place: row r = (b*Hq + h)*nq + i of S (query t = t0 + i,
 * which sees keys s < n: n = t + 1 when causal, else nk) becomes its probabilities, 0 for the
 * keys it cannot see up to nk; lse[b, h, t] = max + log(sum). A warp per row: one pass for the
 * maximum and the sum (rescaled when the maximum grows), one to write; the lanes' partial sums
 * are combined in a fixed tree. */
static __global__ void k_att_softmax(float *S, float *lse, int64_t rows, int64_t nq,
                                     int64_t ldS, int64_t nk, int64_t t0, int64_t T,
                                     int causal) {
    const int lane = threadIdx.x & 31;
    const int64_t step = ((int64_t)gridDim.x * blockDim.x) / 32;
    for (int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; r < rows;
         r += step) {
        const int64_t i = r % nq, n = causal ? t0 + i + 1 : nk;
        float *sr = S + r * ldS;
        float m = -INFINITY, l = 0.0f;
        for (int64_t s = lane; s < n; s += 32) {
            const float x = sr[s];
            if (x > m) {
                l = l * expf(m - x) + 1.0f; /* m = -inf: 0 * 0 + 1 */
                m = x;
            } else
                l += expf(x - m);
        }
        const float mx = tz_warp_max_f(m);
        const float sum = tz_warp_sum_f(m == -INFINITY ? 0.0f : l * expf(m - mx));
        const float inv = 1.0f / sum;
        for (int64_t s = lane; s < nk; s += 32) sr[s] = s < n ? expf(sr[s] - mx) * inv : 0.0f;
        if (lane == 0) lse[(r / nq) * T + t0 + i] = mx + logf(sum);
    }
}

/* Backward of the chunk, in place: P = exp(S - lse) over S and dS = P * (dP - delta) over dP,
 * both 0 where the query cannot see the key. A warp per row, as k_att_softmax. */
static __global__ void k_att_dscores(float *S, float *dP, const float *lse, const float *delta,
                                     int64_t rows, int64_t nq, int64_t ldS, int64_t nk,
                                     int64_t t0, int64_t T, int causal) {
    const int lane = threadIdx.x & 31;
    const int64_t step = ((int64_t)gridDim.x * blockDim.x) / 32;
    for (int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; r < rows;
         r += step) {
        const int64_t i = r % nq, n = causal ? t0 + i + 1 : nk, st = (r / nq) * T + t0 + i;
        const float l = lse[st], dl = delta[st];
        float *sr = S + r * ldS, *dr = dP + r * ldS;
        for (int64_t s = lane; s < nk; s += 32) {
            float p = 0.0f, ds = 0.0f;
            if (s < n) {
                p = expf(sr[s] - l);
                ds = p * (dr[s] - dl);
            }
            sr[s] = p;
            dr[s] = ds;
        }
    }
}

/* How the B*Hq (sequence, query head) GEMMs of one step are issued as strided batches. One
 * strided batch steps each pointer by one stride, and query head h reads kv head h / rep, so
 * either one launch per (b, member r of a group) batched over the Hkv groups (query head
 * g*rep + r reads kv head g: the query pointer steps by rep heads, the kv pointer by one), or
 * one launch per query head batched over the B sequences; whichever makes fewer launches
 * (Llama-2-7B at micro-batch 1: one launch of 32; DiT-XL/2 at batch 32: 16 launches of 32). */
typedef struct {
    att_shape sh;
    int64_t launches, batch, db, dh; /* (b, h) step between the GEMMs of a launch */
    int64_t t0, nq, ldS;             /* the chunk */
    cublasHandle_t hd;
} att_tc;

/* The four kinds of operand: the chunk's rows of a query-shaped tensor (q and dq at stride
 * ldq; out and dO at ldo), all rows of a key-shaped one (k, v, dk, dv at ldkv: kv head
 * h / rep), the chunk's scores. */
enum { ON_Q, ON_O, ON_KV, ON_S };
typedef struct {
    const void *p;
    int on;
} att_mat;

static size_t esize(cudaDataType t) { return t == CUDA_R_16BF ? 2 : 4; }

/* Element offset of pair (b, h) in m, its leading dimension, and the batch stride. */
static int64_t mat_off(const att_tc *a, int on, int64_t b, int64_t h) {
    const att_shape *s = &a->sh;
    if (on == ON_Q) return at(b, a->t0, h, s->T, s->ldq, s->D);
    if (on == ON_O) return at(b, a->t0, h, s->T, s->ldo, s->D);
    if (on == ON_KV) return at(b, 0, h / s->rep, s->T, s->ldkv, s->D);
    return (b * s->Hq + h) * a->nq * a->ldS;
}
static int64_t mat_ld(const att_tc *a, int on) {
    return on == ON_Q ? a->sh.ldq : on == ON_O ? a->sh.ldo : on == ON_KV ? a->sh.ldkv : a->ldS;
}
static int64_t mat_stride(const att_tc *a, int on) {
    return mat_off(a, on, a->db, a->dh) - mat_off(a, on, 0, 0);
}

/* C = alpha op(A) op(B) + beta C for every (b, h) of the chunk, column-major m x n x k as
 * cuBLAS sees it; A and B of type ATT_OPERAND, C fp32. */
static void gemm_pairs(const att_tc *a, cublasOperation_t ta, cublasOperation_t tb, int64_t m,
                       int64_t n, int64_t k, float alpha, att_mat A, att_mat B, float beta,
                       float *C, int c_on) {
    const cudaDataType tA = ATT_OPERAND, tB = ATT_OPERAND;
    for (int64_t L = 0; L < a->launches; L++) {
        const int64_t b = a->db ? 0 : L / a->sh.rep, h = a->db ? L : L % a->sh.rep;
        const char *pa = (const char *)A.p + mat_off(a, A.on, b, h) * (int64_t)esize(tA);
        const char *pb = (const char *)B.p + mat_off(a, B.on, b, h) * (int64_t)esize(tB);
        CUBLAS_CHECK(cublasGemmStridedBatchedEx(
            a->hd, ta, tb, (int)m, (int)n, (int)k, &alpha, pa, tA, (int)mat_ld(a, A.on),
            (long long)mat_stride(a, A.on), pb, tB, (int)mat_ld(a, B.on),
            (long long)mat_stride(a, B.on), &beta, C + mat_off(a, c_on, b, h), CUDA_R_32F,
            (int)mat_ld(a, c_on), (long long)mat_stride(a, c_on), (int)a->batch, ATT_COMPUTE,
            CUBLAS_GEMM_DEFAULT));
    }
}

static att_tc tc_begin(tz_backend *be, const att_shape *sh) {
    if (sh->T > INT_MAX / 4 || sh->ldq > INT_MAX || sh->ldkv > INT_MAX || sh->ldo > INT_MAX ||
        sh->B * sh->Hq > INT_MAX)
        TZ_FATAL("attention: B=%lld, T=%lld, Hq=%lld, D=%lld exceed cuBLAS's int dimensions",
                 (long long)sh->B, (long long)sh->T, (long long)sh->Hq, (long long)sh->D);
    att_tc a;
    a.sh = *sh;
    const int by_group = sh->B * sh->rep <= sh->Hq;
    a.launches = by_group ? sh->B * sh->rep : sh->Hq;
    a.batch = by_group ? sh->Hkv : sh->B;
    a.db = by_group ? 0 : 1;
    a.dh = by_group ? sh->rep : 0;
    a.t0 = a.nq = a.ldS = 0;
    a.hd = tz_cuda_ctx_of(be)->cublas;
    /* TF32 (or bf16) products on the tensor cores, asked for by the compute type; the
     * handle's pedantic mode, kept for the fp32 GEMMs, is lifted for the op's duration */
    CUBLAS_CHECK(cublasSetMathMode(a.hd, CUBLAS_DEFAULT_MATH));
    return a;
}
static void tc_end(att_tc *a) { CUBLAS_CHECK(cublasSetMathMode(a->hd, CUBLAS_PEDANTIC_MATH)); }

/* Moves a to the chunk starting at t0 of at most c rows; returns its visible keys nk. */
static int64_t tc_chunk(att_tc *a, int64_t t0, int64_t c) {
    a->t0 = t0;
    a->nq = a->sh.T - t0 < c ? a->sh.T - t0 : c;
    const int64_t nk = a->sh.causal ? t0 + a->nq : a->sh.T;
    a->ldS = (nk + 3) / 4 * 4;
    return nk;
}

static unsigned warp_blocks(int64_t rows) { return tz_cuda_blocks(rows * 32, 256); }

static void tc_fwd(tz_backend *be, float *out, float *lse, const float *q, const float *k,
                   const float *v, const att_shape *sh, void *ws, size_t ws_bytes) {
    const int64_t c = tz_attention_chunk(ws_bytes, sh->B, sh->T, sh->Hq, 1);
    if (!ws || c < 1)
        TZ_FATAL("attention_fwd with bf16 GEMM operands: %zu bytes of workspace lent, %zu "
                 "planned for B=%lld T=%lld Hq=%lld (be->att_ws, tz_attention_ws_bytes)",
                 ws ? ws_bytes : 0, tz_attention_ws_bytes(be, sh->B, sh->T, sh->Hq, sh->D, 0, 0),
                 (long long)sh->B, (long long)sh->T, (long long)sh->Hq);
    float *P = (float *)ws;
    cudaStream_t st = tz_cuda_stream(be);
    att_tc a = tc_begin(be, sh);
    for (int64_t t0 = 0; t0 < sh->T; t0 += c) {
        const int64_t nk = tc_chunk(&a, t0, c), rows = sh->B * sh->Hq * a.nq;
        gemm_pairs(&a, CUBLAS_OP_T, CUBLAS_OP_N, nk, a.nq, sh->D, sh->scale, {k, ON_KV},
                   {q, ON_Q}, 0.0f, P, ON_S);
        k_att_softmax<<<warp_blocks(rows), 256, 0, st>>>(P, lse, rows, a.nq, a.ldS, nk, t0,
                                                         sh->T, sh->causal);
        CUDA_LAUNCHED();
        gemm_pairs(&a, CUBLAS_OP_N, CUBLAS_OP_N, sh->D, a.nq, nk, 1.0f, {v, ON_KV}, {P, ON_S},
                   0.0f, out, ON_O);
    }
    tc_end(&a);
}

/* The first w elements of each of n rows at stride ld set to 0, the rest of a row untouched. */
static __global__ void k_zero_rows(float *p, int64_t n, int64_t ld, int64_t w) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n * w; e += step)
        p[e / w * ld + e % w] = 0.0f;
}
static void zero_rows(tz_backend *be, float *p, int64_t n, int64_t ld, int64_t w) {
    if (ld == w) {
        be->fill(be, p, 0.0f, n * w);
        return;
    }
    k_zero_rows<<<tz_cuda_blocks(n * w, 256), 256, 0, tz_cuda_stream(be)>>>(p, n, ld, w);
    CUDA_LAUNCHED();
}

static void tc_bwd(tz_backend *be, float *dq, float *dk, float *dv, const float *dout,
                   const float *out, const float *lse, const float *q, const float *k,
                   const float *v, const att_shape *sh, void *ws, size_t ws_bytes) {
    const size_t db = tz_attention_delta_bytes(sh->B, sh->T, sh->Hq);
    const int64_t c =
        ws_bytes > db ? tz_attention_chunk(ws_bytes - db, sh->B, sh->T, sh->Hq, 2) : 0;
    if (!ws || c < 1)
        TZ_FATAL("attention_bwd with bf16 GEMM operands: %zu bytes of workspace lent, %zu "
                 "planned for B=%lld T=%lld Hq=%lld (be->att_ws, tz_attention_ws_bytes)",
                 ws ? ws_bytes : 0, tz_attention_ws_bytes(be, sh->B, sh->T, sh->Hq, sh->D, 1, 0),
                 (long long)sh->B, (long long)sh->T, (long long)sh->Hq);
    float *delta = (float *)ws;
    float *S = (float *)((char *)ws + db);
    float *dS = S + (size_t)(c * sh->B * sh->Hq) * (size_t)((sh->T + 3) / 4 * 4);
    cudaStream_t st = tz_cuda_stream(be);
    const int64_t rows_all = sh->B * sh->Hq * sh->T;
    k_att_delta<<<warp_blocks(rows_all), 256, 0, st>>>(delta, dout, out, *sh);
    CUDA_LAUNCHED();
    if (!sh->acc) { /* dk, dv gather from every chunk: they start at zero */
        zero_rows(be, dk, sh->B * sh->T, sh->ldkv, sh->Hkv * sh->D);
        zero_rows(be, dv, sh->B * sh->T, sh->ldkv, sh->Hkv * sh->D);
    }
    att_tc a = tc_begin(be, sh);
    for (int64_t t0 = 0; t0 < sh->T; t0 += c) {
        const int64_t nk = tc_chunk(&a, t0, c), rows = sh->B * sh->Hq * a.nq, D = sh->D;
        gemm_pairs(&a, CUBLAS_OP_T, CUBLAS_OP_N, nk, a.nq, D, sh->scale, {k, ON_KV}, {q, ON_Q},
                   0.0f, S, ON_S);
        gemm_pairs(&a, CUBLAS_OP_T, CUBLAS_OP_N, nk, a.nq, D, 1.0f, {v, ON_KV}, {dout, ON_O},
                   0.0f, dS, ON_S);
        k_att_dscores<<<warp_blocks(rows), 256, 0, st>>>(S, dS, lse, delta, rows, a.nq, a.ldS,
                                                         nk, t0, sh->T, sh->causal);
        CUDA_LAUNCHED();
        gemm_pairs(&a, CUBLAS_OP_N, CUBLAS_OP_N, D, a.nq, nk, sh->scale, {k, ON_KV}, {dS, ON_S},
                   sh->acc ? 1.0f : 0.0f, dq, ON_Q); /* (each chunk its own query rows) */
        gemm_pairs(&a, CUBLAS_OP_N, CUBLAS_OP_T, D, nk, a.nq, sh->scale, {q, ON_Q}, {dS, ON_S},
                   1.0f, dk, ON_KV);
        gemm_pairs(&a, CUBLAS_OP_N, CUBLAS_OP_T, D, nk, a.nq, 1.0f, {dout, ON_O}, {S, ON_S},
                   1.0f, dv, ON_KV);
    }
    tc_end(&a);
}

/* ================= bf16: flash style on the tensor cores (head dimension <= 128) =========
 * FlashAttention-2's schedule with mma.sync m16n8k16 (cuda/cuda_mma.cuh): the scores and
 * probabilities of a tile never leave the registers, so no workspace but the backward's delta
 * (and, for the kernels that copy their tiles ahead, lse in base 2 and the rounded dO).
 * Operands are rounded to bf16 (q, k, v, dO as they are staged; P and dS before their
 * products), every product is summed in fp32, and the softmax statistics, lse, delta and the
 * results stay fp32. The head dimension is padded with zeros to DP, a multiple of 16.
 *   forward, dq: a block of 4 warps owns FQ = 64 query rows of one (b, query head), a warp 16
 *     rows; K and V pass through shared memory in tiles of FK = 64 keys (bf16); the warp
 *     keeps its Q (and dO) as A fragments in registers, S = Q K^T in C fragments, and turns
 *     them into the A fragments of P V (dS K) without leaving the registers (the C layout of
 *     two 8-column tiles is the A layout of one 16-column step). The forward on bf16 inputs
 *     copied ahead takes FQW = 128 rows a block instead, a warp 32 (k_fa_fwd_wide, below).
 *   dk, dv: a block of 4 warps owns FKV = 64 keys of one (b, kv head), a warp 16 keys; the
 *     group's query heads pass in order, their rows in tiles of FQT = 32 with dO, lse and
 *     delta; S^T = K Q^T and dP^T = V dO^T put the keys on the rows, so P^T and dS^T are
 *     the A fragments of dV += P^T dO and dK += dS^T Q.
 * No atomics: every output element has one writer and a fixed order of summation (dq apart
 * from dk and dv, each recomputing P), so results are reproducible bit for bit. */
#define FA_MAXD TZ_ATTENTION_FLASH_MAXD
#define FQ 64   /* query rows per forward / dq block */
#define FK 64   /* keys per shared tile of the forward and dq */
#define FKV 64  /* keys per dk/dv block */
#define FQT 32  /* query rows per shared tile of dk/dv */
#define FA_THREADS 128

/* The score gradients kept (fa_dsp, from be->att_ds; core/backend.h, tz_attention_ds_group): for
 * each query head of a group, tiles of FA_DS_T queries by FA_DS_T keys, dk/dv's kernel writing
 * them and dq's reading them (k_fa_dq_ds). Tile (query block qb, key block kb) of a head is
 * number qb (qb + 1) / 2 + kb of the causal lower triangle (kb <= qb), else qb nkb + kb. A tile
 * holds dS^T (key rows) in 8 x 8 blocks of 128 bytes, block (keys i, queries j) at fa_ds_at(i,
 * j), each row-major: a warp of dk/dv's stores one block in one instruction, and a warp of dq's
 * loads four with one ldmatrix.x4.trans as the A fragments of dS. */
#define FA_DS_T 64
#define FA_DS_TILE_ELEMS (FA_DS_T * FA_DS_T)
static_assert(FA_DS_T == TZ_ATTENTION_DS_TILE && FQ == FA_DS_T && FK == FA_DS_T &&
                  FKV == FA_DS_T && FQT * 2 == FA_DS_T,
              "the kept dS tiles are dq's and dk/dv's blocks");
__device__ __forceinline__ int fa_ds_at(int kblk, int qblk) { return (kblk * 8 + qblk) * 64; }
/* The number of tile (qb, kb) of the group's query head `slot` in dsp.ds (32 bits: fa_ds_group
 * keeps the group's tiles under 2^31) */
__device__ __forceinline__ unsigned fa_ds_tile(const att_shape &sh, const fa_dsp &dsp, int slot,
                                               int qb, int kb) {
    const int nb = (int)((sh.T + FA_DS_T - 1) / FA_DS_T);
    const int n = sh.causal ? qb * (qb + 1) / 2 + kb : qb * nb + kb;
    return (unsigned)(slot * (int)dsp.tiles + n);
}

/* The softmax in base 2 (FlashAttention-2's way): a score s enters as exp2(s scale log2(e) -
 * m), one FFMA and one ex2 (tz_ex2: the flushing form, one instruction where exp2f takes
 * four) instead of expf's range reduction and a scale multiply, and the causal and
 * sequence-end masks are applied only to the tiles that cross them (fa_mask_tile), a
 * block-uniform test, so most tiles take no per-element comparison. On an H200 the per-score
 * instructions, not the mma, set the kernels' pace (docs/benchmarks.md, "A third H200
 * lease"). Masked scores are -inf, whose exp2 is 0. */
__device__ __forceinline__ bool fa_mask_tile(bool causal, int64_t r0, int nr, int64_t c0, int nc,
                                             int64_t T, bool keys_rows) {
    /* rows [r0, r0 + nr) by columns [c0, c0 + nc); queries are the rows unless keys_rows */
    const int64_t q_lo = keys_rows ? c0 : r0, k_hi = keys_rows ? r0 + nr - 1 : c0 + nc - 1;
    return r0 + nr > T || c0 + nc > T || (causal && k_hi > q_lo);
}
/* x clamped to [-1, n]: a tile-relative column bound, int (the masked tiles' comparisons are
 * 32-bit) */
__device__ __forceinline__ int fa_clamp(int64_t x, int n) {
    return x < -1 ? -1 : x > n ? n : (int)x;
}
/* The last of the n columns from key c0 that query t sees (-1: none; fa_clamp). */
__device__ __forceinline__ int fa_last_key(const att_shape &sh, int64_t t, int64_t c0, int n) {
    return t < sh.T ? fa_clamp((sh.causal && t < sh.T - 1 ? t : sh.T - 1) - c0, n) : -1;
}

/* The staging helpers take x at one (sequence, head): x + at(b, 0, h, T, ld, D), row t at
 * x + t ld (the kernels compute the base once, outside their loops). */

/* Rows [r0, r0 + n) of x (rows at stride ld) into dst[n][DP + 8] as bf16, zeros past T and
 * D (the 8 bf16 of padding per row spread a warp's 32-bit reads of 8 rows over the banks). */
template <int DP>
__device__ void fa_stage(uint16_t *dst, const float *x, int64_t r0, int n, int64_t T,
                         int64_t ld, int64_t D) {
    constexpr int LD = DP + 8;
    for (int e = threadIdx.x; e < n * (DP / 2); e += blockDim.x) {
        const int j = e / (DP / 2), d = 2 * (e % (DP / 2));
        const int64_t t = r0 + j;
        float lo = 0.0f, hi = 0.0f;
        if (t < T) {
            const float *row = x + t * ld;
            if (d < D) lo = row[d];
            if (d + 1 < D) hi = row[d + 1];
        }
        *(uint32_t *)(dst + j * LD + d) = tz_pack_bf16(lo, hi);
    }
}

/* fa_stage for N rows with D a multiple of 4 and x 16-byte aligned (sh.vec4): each thread
 * issues a batch of up to 8 float4 loads before it converts and stores any, so a tile costs
 * a few memory round trips instead of one per element pair (the per-pair loop, latency-bound,
 * took 1,940 us a 7B forward on an H200, this 653; docs/benchmarks.md). Rows past T and
 * columns past D are zeros, as in fa_stage. */
template <int DP, int N>
__device__ void fa_stage4(uint16_t *dst, const float *x, int64_t r0, int64_t T, int64_t ld,
                          int64_t D) {
    constexpr int LD = DP + 8, C4 = DP / 4, PER = N * C4 / FA_THREADS;
    constexpr int NB = PER <= 8 ? PER : PER % 8 == 0 ? 8 : PER % 5 == 0 ? 5 : PER % 4 == 0 ? 4 : 1;
    static_assert(N * C4 % FA_THREADS == 0 && PER % NB == 0, "fa_stage4: slots per thread");
#pragma unroll
    for (int g0 = 0; g0 < PER; g0 += NB) {
        float4 v[NB];
#pragma unroll
        for (int i = 0; i < NB; i++) {
            const int e = (int)threadIdx.x + (g0 + i) * FA_THREADS, j = e / C4, d = 4 * (e % C4);
            const int64_t t = r0 + j;
            v[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (t < T && d < D) v[i] = *(const float4 *)(x + t * ld + d);
        }
#pragma unroll
        for (int i = 0; i < NB; i++) {
            const int e = (int)threadIdx.x + (g0 + i) * FA_THREADS, j = e / C4, d = 4 * (e % C4);
            *(uint2 *)(dst + j * LD + d) =
                make_uint2(tz_pack_bf16(v[i].x, v[i].y), tz_pack_bf16(v[i].z, v[i].w));
        }
    }
}
/* fa_stage and fa_stage4 for x already in bf16 (tz_att_ld.in16): the same tiles, copied
 * (fa_stage4's slots of 4 elements as one 8-byte load, x 8-byte aligned). Twins of the fp32
 * forms rather than one template over the element type (as fa_load_a's bf16 twin below):
 * written as one template, through a per-element bf16 conversion and tz_pack_u16, the fp32
 * dk/dv kernel at D = 128 spilled 36 bytes instead of 4 (nvcc 13 -Xptxas -v, sm_80 and
 * sm_90), where tz_pack_bf16 on the fp32 pairs keeps it as it was. */
template <int DP>
__device__ void fa_stage(uint16_t *dst, const uint16_t *x, int64_t r0, int n, int64_t T,
                         int64_t ld, int64_t D) {
    constexpr int LD = DP + 8;
    for (int e = threadIdx.x; e < n * (DP / 2); e += blockDim.x) {
        const int j = e / (DP / 2), d = 2 * (e % (DP / 2));
        const int64_t t = r0 + j;
        uint16_t lo = 0, hi = 0;
        if (t < T) {
            const uint16_t *row = x + t * ld;
            if (d < D) lo = row[d];
            if (d + 1 < D) hi = row[d + 1];
        }
        *(uint32_t *)(dst + j * LD + d) = tz_pack_u16(lo, hi);
    }
}
template <int DP, int N>
__device__ void fa_stage4(uint16_t *dst, const uint16_t *x, int64_t r0, int64_t T, int64_t ld,
                          int64_t D) {
    constexpr int LD = DP + 8, C4 = DP / 4, PER = N * C4 / FA_THREADS;
    constexpr int NB = PER <= 8 ? PER : PER % 8 == 0 ? 8 : PER % 5 == 0 ? 5 : PER % 4 == 0 ? 4 : 1;
    static_assert(N * C4 % FA_THREADS == 0 && PER % NB == 0, "fa_stage4: slots per thread");
#pragma unroll
    for (int g0 = 0; g0 < PER; g0 += NB) {
        uint2 v[NB];
#pragma unroll
        for (int i = 0; i < NB; i++) {
            const int e = (int)threadIdx.x + (g0 + i) * FA_THREADS, j = e / C4, d = 4 * (e % C4);
            const int64_t t = r0 + j;
            v[i] = make_uint2(0u, 0u);
            if (t < T && d < D) v[i] = *(const uint2 *)(x + t * ld + d);
        }
#pragma unroll
        for (int i = 0; i < NB; i++) {
            const int e = (int)threadIdx.x + (g0 + i) * FA_THREADS, j = e / C4, d = 4 * (e % C4);
            *(uint2 *)(dst + j * LD + d) = v[i];
        }
    }
}
/* A tile of N rows: vectorised where the shape allows. */
template <int DP, int N, class TI>
__device__ __forceinline__ void fa_tile(uint16_t *dst, const TI *x, int64_t r0, int64_t T,
                                        int64_t ld, int64_t D, int vec4) {
    if (vec4) fa_stage4<DP, N>(dst, x, r0, T, ld, D);
    else fa_stage<DP>(dst, x, r0, N, T, ld, D);
}

/* Rows [r0, r0 + N) of bf16 x (rows at stride ld) into dst[N][DP + 8] by cp.async, 8
 * elements (16 bytes) a copy, zeros past T and D; issued, not waited for (the caller commits
 * and waits: tz_cp_async_wait, then __syncthreads). D and ld multiples of 8 and x 16-byte
 * aligned (sh.pipe), so a copy is wholly inside D or wholly past it. UNROLL: how far the
 * loop over a thread's copies is unrolled (all of it by default; 1 where the hoisted addresses
 * of unrolled copies cost registers a kernel lacks: k_fa_fwd_wide). */
template <int DP, int N, int UNROLL = (N * (DP / 8) + FA_THREADS - 1) / FA_THREADS>
__device__ __forceinline__ void fa_stage_async(uint16_t *dst, const uint16_t *x, int64_t r0,
                                               int64_t T, int64_t ld, int64_t D) {
    constexpr int LD = DP + 8, C8 = DP / 8, PER = (N * C8 + FA_THREADS - 1) / FA_THREADS;
#pragma unroll(UNROLL)
    for (int i = 0; i < PER; i++) {
        const int e = (int)threadIdx.x + i * FA_THREADS, j = e / C8, d = 8 * (e % C8);
        if (N * C8 % FA_THREADS && e >= N * C8) break;
        const int64_t t = r0 + j;
        const bool in = t < T && d < D;
        tz_cp_async<16>(dst + j * LD + d, in ? x + t * ld + d : x, in);
    }
}

/* The A fragments of rows rows[0] (g) and rows[1] (g + 8) of x (rows at stride ld), KS
 * steps of 16 columns, rounded to bf16; zeros past T and D. */
template <int KS>
__device__ __forceinline__ void fa_load_a(uint32_t a[KS][4], const float *x,
                                          const int64_t rows[2], int64_t T, int64_t ld,
                                          int64_t D) {
    const int t4 = threadIdx.x & 3;
#pragma unroll
    for (int kk = 0; kk < KS; kk++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int64_t t = rows[i & 1], d = kk * 16 + 2 * t4 + (i & 2 ? 8 : 0);
            float lo = 0.0f, hi = 0.0f;
            if (t < T) {
                const float *row = x + t * ld;
                if (d < D) lo = row[d];
                if (d + 1 < D) hi = row[d + 1];
            }
            a[kk][i] = tz_pack_bf16(lo, hi);
        }
}
/* fa_load_a for x already in bf16 (a twin: see fa_stage's) */
template <int KS>
__device__ __forceinline__ void fa_load_a(uint32_t a[KS][4], const uint16_t *x,
                                          const int64_t rows[2], int64_t T, int64_t ld,
                                          int64_t D) {
    const int t4 = threadIdx.x & 3;
#pragma unroll
    for (int kk = 0; kk < KS; kk++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int64_t t = rows[i & 1], d = kk * 16 + 2 * t4 + (i & 2 ? 8 : 0);
            uint16_t lo = 0, hi = 0;
            if (t < T) {
                const uint16_t *row = x + t * ld;
                if (d < D) lo = row[d];
                if (d + 1 < D) hi = row[d + 1];
            }
            a[kk][i] = tz_pack_u16(lo, hi);
        }
}

/* C[NT][4] (+)= A B^T over DP columns: B's rows are rows n*8 + g of the staged tile s (the
 * "col" B fragment of an [n][k] row-major tile is two adjacent bf16: one 32-bit read). LDM:
 * the B fragments of two n-tiles by one ldmatrix.x4 (tz_ldmatrix_x4, cuda_mma.cuh: lane
 * 8j + i addresses row (nt + j/2) * 8 + i, columns kk * 16 + (j % 2) * 8), else by 32-bit
 * reads; the same values and the same products in the same order either way. */
template <int DP, int NT, bool LDM>
__device__ __forceinline__ void fa_mma_abt(float c[NT][4], const uint32_t a[DP / 16][4],
                                           const uint16_t *s) {
    constexpr int LD = DP + 8;
    const int lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int kk = 0; kk < DP / 16; kk++)
#pragma unroll
        for (int nt = 0; nt < NT; nt += 2) {
            uint32_t b[4];
            if (LDM) {
                const int j = lane >> 3, i = lane & 7;
                tz_ldmatrix_x4<false>(b,
                                      s + ((nt + (j >> 1)) * 8 + i) * LD + kk * 16 + (j & 1) * 8);
            } else {
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const uint16_t *p = s + ((nt + h) * 8 + g) * LD + kk * 16 + 2 * t4;
                    b[2 * h] = *(const uint32_t *)p;
                    b[2 * h + 1] = *(const uint32_t *)(p + 8);
                }
            }
            tz_mma_bf16_16816(c[nt], a[kk], b);
            tz_mma_bf16_16816(c[nt + 1], a[kk], b + 2);
        }
}

/* C[DP/8][4] += A s[kk * 16 .. kk * 16 + 15][0 .. DP) for one 16-row step kk of the staged
 * tile s [..][DP], A the bf16 A fragments of a 16 x 16 block of P. B[k][n] = s[k][n]: two bf16
 * of adjacent rows, two 16-bit reads; LDM: two n-tiles' B fragments by one
 * ldmatrix.x4.trans (lane 8j + i addresses row kk * 16 + (j % 2) * 8 + i, columns
 * (dn + j/2) * 8), the same values either way. */
template <int DP, bool LDM>
__device__ __forceinline__ void fa_mma_pv_step(float c[DP / 8][4], const uint32_t a[4],
                                               const uint16_t *s, int kk) {
    constexpr int LD = DP + 8;
    const int lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const uint16_t *r = s + (kk * 16 + 2 * t4) * LD + g;
#pragma unroll
    for (int dn = 0; dn < DP / 8; dn += 2) {
        uint32_t b[4];
        if (LDM) {
            const int j = lane >> 3, i = lane & 7;
            tz_ldmatrix_x4<true>(b, s + (kk * 16 + (j & 1) * 8 + i) * LD + (dn + (j >> 1)) * 8);
        } else {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint16_t *q = r + (dn + h) * 8;
                b[2 * h] = tz_pack_u16(q[0], q[LD]);
                b[2 * h + 1] = tz_pack_u16(q[8 * LD], q[9 * LD]);
            }
        }
        tz_mma_bf16_16816(c[dn], a, b);
        tz_mma_bf16_16816(c[dn + 1], a, b + 2);
    }
}

/* C[DP/8][4] += P s over KT = 2 * NT rows of the staged tile s [KT][DP], P the fp32 C
 * fragments p[NT][4] of a 16 x KT product rounded to bf16 into A fragments (C tiles 2kk and
 * 2kk + 1 are A step kk). */
template <int DP, int NT, bool LDM>
__device__ __forceinline__ void fa_mma_ps(float c[DP / 8][4], const float p[NT][4],
                                          const uint16_t *s) {
#pragma unroll
    for (int kk = 0; kk < NT / 2; kk++) {
        const uint32_t a[4] = {tz_pack_bf16(p[2 * kk][0], p[2 * kk][1]),
                               tz_pack_bf16(p[2 * kk][2], p[2 * kk][3]),
                               tz_pack_bf16(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                               tz_pack_bf16(p[2 * kk + 1][2], p[2 * kk + 1][3])};
        fa_mma_pv_step<DP, LDM>(c, a, s, kk);
    }
}

/* The sum of a row's value over the 4 lanes that hold it (lanes 4g .. 4g + 3), in a fixed
 * order; and the maximum. */
__device__ __forceinline__ float fa_quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
__device__ __forceinline__ float fa_quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

/* The forward's online softmax over one tile of FK keys from s0, for a warp's 16 rows (rows[0]
 * and rows[1] its lane's two): the scores s masked where `masked` (the tile crosses the
 * causal diagonal or the sequence's end), the running maximum m of raw scores and the sum l
 * updated, o rescaled (where a maximum moved), and P = exp2(s scale log2(e) - m) rounded to
 * bf16 as it is made, into pa as the A fragments of P V (C tiles 2kk and 2kk + 1 are A step
 * kk): half the registers of the fp32 scores. Masked scores are -inf, whose exp2 is 0. */
template <int DP, class R>
__device__ __forceinline__ void fa_softmax_tile(float (&s)[FK / 8][4], float (&m)[2], float (&l)[2],
                                                float (&o)[DP / 8][4], uint32_t (&pa)[FK / 16][4],
                                                const att_shape &sh, bool masked, int64_t s0,
                                                const R (&rows)[2], float sl2) {
    constexpr int DN = DP / 8, NT = FK / 8;
    const int t4 = threadIdx.x & 3;
    if (masked) {
        const int last[2] = {fa_last_key(sh, rows[0], s0, FK), fa_last_key(sh, rows[1], s0, FK)};
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                if (nt * 8 + 2 * t4 + (i & 1) > last[i >> 1]) s[nt][i] = -INFINITY;
    }
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) mx[i >> 1] = fmaxf(mx[i >> 1], s[nt][i]);
    float corr[2], mb[2];
    bool kept = true; /* neither of the lane's rows has a new maximum */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        mx[r] = fa_quad_max(mx[r]);
        kept = kept && mx[r] == m[r];
        corr[r] = mx[r] == m[r] ? 1.0f : m[r] == -INFINITY ? 0.0f : tz_ex2((m[r] - mx[r]) * sl2);
        l[r] *= corr[r];
        m[r] = mx[r];
        mb[r] = mx[r] == -INFINITY ? 0.0f : mx[r] * sl2; /* (a row past T: nothing seen) */
    }
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i += 2) {
            const float p0 = tz_ex2(fmaf(s[nt][i], sl2, -mb[i >> 1]));
            const float p1 = tz_ex2(fmaf(s[nt][i + 1], sl2, -mb[i >> 1]));
            l[i >> 1] += p0;
            l[i >> 1] += p1;
            pa[nt >> 1][(nt & 1) * 2 + (i >> 1)] = tz_pack_bf16(p0, p1);
        }
    /* o rescaled only when a row of the warp has a new maximum (a warp-uniform vote): o *= 1
     * changes no bit, so the skip gives the same results, without DP / 2 multiplies a lane on
     * the tiles (most of a long row's, once its largest scores are seen) that move no maximum */
    if (!__all_sync(0xffffffffu, kept)) {
#pragma unroll
        for (int dn = 0; dn < DN; dn++)
#pragma unroll
            for (int i = 0; i < 4; i++) o[dn][i] *= corr[i >> 1];
    }
}

/* One tile of FK keys from s0 in the forward, for a warp's rows: S = Q K^T, the online softmax
 * (fa_softmax_tile) and o += P V. Ks, Vs: the staged tiles. */
template <int DP, bool LDM>
__device__ __forceinline__ void fa_fwd_tile(float (&o)[DP / 8][4], float (&m)[2], float (&l)[2],
                                            const uint32_t (&qa)[DP / 16][4], const uint16_t *Ks,
                                            const uint16_t *Vs, const att_shape &sh, int64_t q0,
                                            int64_t s0, const int64_t (&rows)[2], float sl2) {
    constexpr int NT = FK / 8;
    float s[NT][4];
    uint32_t pa[NT / 2][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
    fa_mma_abt<DP, NT, LDM>(s, qa, Ks);
    fa_softmax_tile<DP>(s, m, l, o, pa, sh, fa_mask_tile(sh.causal, q0, FQ, s0, FK, sh.T, false),
                        s0, rows, sl2);
#pragma unroll
    for (int kk = 0; kk < NT / 2; kk++) fa_mma_pv_step<DP, LDM>(o, pa[kk], Vs, kk);
}

/* Blocks a multiprocessor can hold by registers as before the base-2 softmax (four at DP = 32,
 * three up to 80: at most 128 and 168 registers, about what it needs; ptxas -v) */
template <int DP, bool LDM, class TI, bool PIPE>
__global__ void __launch_bounds__(FA_THREADS, DP <= 32 ? 4 : DP <= 80 ? 3 : 1)
    k_fa_fwd(float *out, float *lse, const TI *q, const TI *k, const TI *v, att_shape sh) {
    constexpr int KS = DP / 16, DN = DP / 8, LD = DP + 8;
    extern __shared__ float smem[];
    uint16_t *Ks = (uint16_t *)smem, *Vs = Ks + FK * LD;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, t4 = lane & 3;
    const int64_t b = blockIdx.z, h = blockIdx.y, kvh = h / sh.rep, T = sh.T, D = sh.D;
    const int64_t q0 = (int64_t)blockIdx.x * FQ;
    const int64_t rows[2] = {q0 + w * 16 + (lane >> 2), q0 + w * 16 + (lane >> 2) + 8};
    uint32_t qa[KS][4];
    const TI *kb = k + at(b, 0, kvh, T, sh.ldkv, D), *vb = v + at(b, 0, kvh, T, sh.ldkv, D);
    fa_load_a<KS>(qa, q + at(b, 0, h, T, sh.ldq, D), rows, T, sh.ldq, D);
    float o[DN][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int dn = 0; dn < DN; dn++) o[dn][0] = o[dn][1] = o[dn][2] = o[dn][3] = 0.0f;
    const int64_t nkeys = sh.causal ? (q0 + FQ < T ? q0 + FQ : T) : T;
    const float sl2 = sh.scale * FA_LOG2E; /* m: the rows' largest raw score so far */
    if constexpr (PIPE) { /* two buffers: tile i + 1 copied in while tile i is computed */
        uint16_t *Kn = Vs + FK * LD, *Vn = Kn + FK * LD;
        fa_stage_async<DP, FK>(Ks, kb, 0, T, sh.ldkv, D);
        fa_stage_async<DP, FK>(Vs, vb, 0, T, sh.ldkv, D);
        tz_cp_async_commit();
        for (int64_t s0 = 0; s0 < nkeys; s0 += FK) {
            if (s0 + FK < nkeys) { /* (Kn, Vn were last read before the last barrier) */
                fa_stage_async<DP, FK>(Kn, kb, s0 + FK, T, sh.ldkv, D);
                fa_stage_async<DP, FK>(Vn, vb, s0 + FK, T, sh.ldkv, D);
                tz_cp_async_commit();
                tz_cp_async_wait<1>();
            } else tz_cp_async_wait<0>();
            __syncthreads(); /* tile s0 in Ks, Vs for every thread */
            fa_fwd_tile<DP, LDM>(o, m, l, qa, Ks, Vs, sh, q0, s0, rows, sl2);
            __syncthreads(); /* Ks, Vs no longer read: the next copies may go there */
            uint16_t *sw = Ks;
            Ks = Kn, Kn = sw, sw = Vs, Vs = Vn, Vn = sw;
        }
    } else {
        for (int64_t s0 = 0; s0 < nkeys; s0 += FK) {
            __syncthreads(); /* the previous tiles are no longer read */
            fa_tile<DP, FK>(Ks, kb, s0, T, sh.ldkv, D, sh.vec4);
            fa_tile<DP, FK>(Vs, vb, s0, T, sh.ldkv, D, sh.vec4);
            __syncthreads();
            fa_fwd_tile<DP, LDM>(o, m, l, qa, Ks, Vs, sh, q0, s0, rows, sl2);
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) l[r] = fa_quad_sum(l[r]);
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int64_t t = rows[r];
        if (t >= T) continue;
        float *orow = out + at(b, t, h, T, sh.ldo, D);
        const float inv = 1.0f / l[r];
#pragma unroll
        for (int dn = 0; dn < DN; dn++)
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const int64_t d = dn * 8 + 2 * t4 + j;
                if (d < D) orow[d] = o[dn][2 * r + j] * inv;
            }
        if (t4 == 0) lse[(b * sh.Hq + h) * T + t] = m[r] * sh.scale + logf(l[r]);
    }
}

/* ---- the forward with 32 query rows a warp (FQW = 128 a block) ----
 * FlashAttention-2's forward shape at D = 128 (128 query rows by 64 keys, 4 warps): each warp
 * owns two 16-row m-tiles, so a staged tile serves 128 queries instead of 64 (half the global
 * and L2 reads of K and V per query), each V fragment loaded from shared memory feeds both
 * m-tiles' mma (up to D = 80 each K fragment too: fa_fwd_tile_wide), and a warp has two
 * chains of mma and softmax to interleave. Two m-tiles' o take 128 registers at D = 128, so
 * Q cannot stay in registers as in k_fa_fwd (64 more): it is copied into shared memory with
 * the first K and V tiles, and its A fragments are loaded by ldmatrix at each 16-column step
 * (one ldmatrix.x4 per m-tile and step). A warp skips the tiles its rows cannot see (causal:
 * keys past its last row; rows past T): a warp-uniform test with no barrier inside. The same
 * products in the same order for every output as k_fa_fwd's, so the same bits (test_cuda_ops:
 * bf16 against fp32 staged). The cp.async form only (sh.pipe with q aligned as k and v:
 * fa_wide); TZ_FA_ROWS=64 takes k_fa_fwd, for measuring what it gives. Blocks run the last
 * query rows (the most keys) first. */
#define FQW 128 /* query rows per block of k_fa_fwd_wide */
#define FMR 2   /* 16-row m-tiles per warp */

/* The A fragments of step kk of a 16-row m-tile whose row 0 is s (a row-major [16][DP + 8]
 * bf16 tile in shared memory), by one ldmatrix.x4: lane 8j + i addresses row (j % 2) * 8 + i,
 * columns kk * 16 + (j / 2) * 8, so register j is a[j] of the mma A layout (cuda_mma.cuh). */
template <int DP>
__device__ __forceinline__ void fa_ldm_a(uint32_t a[4], const uint16_t *s, int kk) {
    constexpr int LD = DP + 8;
    const int lane = threadIdx.x & 31, j = lane >> 3, i = lane & 7;
    tz_ldmatrix_x4<false>(a, s + ((j & 1) * 8 + i) * LD + kk * 16 + (j >> 1) * 8);
}

/* fa_fwd_tile for a warp's FMR m-tiles, their Q rows in shared memory from Qw (row r0 + 16 mt
 * + i at Qw + (16 mt + i) (DP + 8)): S = Q K^T (fa_mma_abt's order: kk outer), the softmax of
 * each m-tile (fa_softmax_tile), o += P V with each V fragment loaded once for all m-tiles.
 * Up to DP = 80 each K fragment is loaded once for all m-tiles too; at 128 the m-tiles' scores
 * are made one after the other (a K fragment loaded per m-tile) over 16-column steps not
 * unrolled, so that one m-tile's 32 fp32 scores, not two, live beside the 128 of o: both at
 * once spilled 64 to 112 bytes (nvcc 13, sm_90 -Xptxas -v), the steps unrolled 44, this 8
 * (sm_80: none). */
template <int DP>
__device__ __forceinline__ void fa_fwd_tile_wide(float (&o)[FMR][DP / 8][4], float (&m)[FMR][2],
                                                 float (&l)[FMR][2], const uint16_t *Qw,
                                                 const uint16_t *Ks, const uint16_t *Vs,
                                                 const att_shape &sh, int r0, int s0,
                                                 const int (&rows)[FMR][2], float sl2) {
    constexpr int DN = DP / 8, NT = FK / 8, LD = DP + 8;
    constexpr bool SEQ = DP > 80;
    const int lane = threadIdx.x & 31, j = lane >> 3, i8 = lane & 7;
    const bool masked = fa_mask_tile(sh.causal, r0, 16 * FMR, s0, FK, sh.T, false);
    uint32_t pa[FMR][NT / 2][4];
    if constexpr (SEQ) {
#pragma unroll
        for (int mt = 0; mt < FMR; mt++) {
            float s[NT][4];
#pragma unroll
            for (int nt = 0; nt < NT; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll 1
            for (int kk = 0; kk < DP / 16; kk++) {
                uint32_t a[4];
                fa_ldm_a<DP>(a, Qw + mt * 16 * LD, kk);
#pragma unroll
                for (int nt = 0; nt < NT; nt += 2) {
                    uint32_t b[4];
                    tz_ldmatrix_x4<false>(b, Ks + ((nt + (j >> 1)) * 8 + i8) * LD + kk * 16 +
                                                 (j & 1) * 8);
                    tz_mma_bf16_16816(s[nt], a, b);
                    tz_mma_bf16_16816(s[nt + 1], a, b + 2);
                }
            }
            fa_softmax_tile<DP>(s, m[mt], l[mt], o[mt], pa[mt], sh, masked, s0, rows[mt], sl2);
        }
    } else {
        float s[FMR][NT][4];
#pragma unroll
        for (int mt = 0; mt < FMR; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
                s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < DP / 16; kk++) {
            uint32_t a[FMR][4];
#pragma unroll
            for (int mt = 0; mt < FMR; mt++) fa_ldm_a<DP>(a[mt], Qw + mt * 16 * LD, kk);
#pragma unroll
            for (int nt = 0; nt < NT; nt += 2) {
                uint32_t b[4];
                tz_ldmatrix_x4<false>(b, Ks + ((nt + (j >> 1)) * 8 + i8) * LD + kk * 16 +
                                             (j & 1) * 8);
#pragma unroll
                for (int mt = 0; mt < FMR; mt++) {
                    tz_mma_bf16_16816(s[mt][nt], a[mt], b);
                    tz_mma_bf16_16816(s[mt][nt + 1], a[mt], b + 2);
                }
            }
        }
#pragma unroll
        for (int mt = 0; mt < FMR; mt++)
            fa_softmax_tile<DP>(s[mt], m[mt], l[mt], o[mt], pa[mt], sh, masked, s0, rows[mt], sl2);
    }
#pragma unroll
    for (int kk = 0; kk < NT / 2; kk++) /* (fa_mma_ps's order) */
#pragma unroll
        for (int dn = 0; dn < DN; dn += 2) {
            uint32_t b[4];
            tz_ldmatrix_x4<true>(b, Vs + (kk * 16 + (j & 1) * 8 + i8) * LD + (dn + (j >> 1)) * 8);
#pragma unroll
            for (int mt = 0; mt < FMR; mt++) {
                tz_mma_bf16_16816(o[mt][dn], pa[mt][kk], b);
                tz_mma_bf16_16816(o[mt][dn + 1], pa[mt][kk], b + 2);
            }
        }
}

template <int DP>
__global__ void __launch_bounds__(FA_THREADS)
    k_fa_fwd_wide(float *out, float *lse, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                  att_shape sh) {
    constexpr int DN = DP / 8, LD = DP + 8;
    extern __shared__ float smem[];
    uint16_t *Qs = (uint16_t *)smem, *Ks = Qs + FQW * LD, *Vs = Ks + FK * LD;
    uint16_t *Kn = Vs + FK * LD, *Vn = Kn + FK * LD;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, t4 = lane & 3;
    const int64_t b = blockIdx.z, h = blockIdx.y, kvh = h / sh.rep, T = sh.T, D = sh.D;
    /* (row and key indices in int: fa_wide takes T < 2^31 - FQW) */
    const int q0 = (int)(gridDim.x - 1 - blockIdx.x) * FQW, r0 = q0 + w * 16 * FMR, Ti = (int)T;
    int rows[FMR][2];
#pragma unroll
    for (int mt = 0; mt < FMR; mt++)
        rows[mt][0] = r0 + mt * 16 + (lane >> 2), rows[mt][1] = rows[mt][0] + 8;
    const uint16_t *kb = k + at(b, 0, kvh, T, sh.ldkv, D), *vb = v + at(b, 0, kvh, T, sh.ldkv, D);
    fa_stage_async<DP, FQW>(Qs, q + at(b, 0, h, T, sh.ldq, D), q0, T, sh.ldq, D);
    fa_stage_async<DP, FK>(Ks, kb, 0, T, sh.ldkv, D);
    fa_stage_async<DP, FK>(Vs, vb, 0, T, sh.ldkv, D);
    tz_cp_async_commit();
    float o[FMR][DN][4], m[FMR][2], l[FMR][2];
#pragma unroll
    for (int mt = 0; mt < FMR; mt++) {
        m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.0f;
#pragma unroll
        for (int dn = 0; dn < DN; dn++) o[mt][dn][0] = o[mt][dn][1] = o[mt][dn][2] = o[mt][dn][3] = 0.0f;
    }
    const int nkeys = sh.causal ? (q0 + FQW < Ti ? q0 + FQW : Ti) : Ti;
    /* the next tiles' copies issued one at a time (not unrolled) up to DP = 80: unrolled,
     * their hoisted addresses spilled 12 bytes at 80 (nvcc 13 sm_90 -Xptxas -v), so none */
    constexpr int SU = DP <= 80 ? 1 : (FK * (DP / 8) + FA_THREADS - 1) / FA_THREADS;
    /* the keys the warp's rows see: [0, wkeys); none where its rows are past T */
    const int wkeys = r0 >= Ti ? 0 : sh.causal && r0 + 16 * FMR < Ti ? r0 + 16 * FMR : Ti;
    const float sl2 = sh.scale * FA_LOG2E;
    /* one barrier a tile: after it, tile s0 (and Q) is in shared memory for every thread and
     * no thread still reads tile s0 - FK's buffers, which then take tile s0 + FK while tile s0
     * is computed (the barrier stays the loop's first statement: the emulation tells barriers
     * apart by where they are called from, and a barrier just after the warp's branch would
     * be one the host compiler may copy into both of its arms) */
    for (int s0 = 0; s0 < nkeys; s0 += FK) {
        tz_cp_async_wait<0>();
        __syncthreads();
        if (s0 + FK < nkeys) {
            fa_stage_async<DP, FK, SU>(Kn, kb, s0 + FK, T, sh.ldkv, D);
            fa_stage_async<DP, FK, SU>(Vn, vb, s0 + FK, T, sh.ldkv, D);
            tz_cp_async_commit();
        }
        if (s0 < wkeys)
            fa_fwd_tile_wide<DP>(o, m, l, Qs + w * 16 * FMR * LD, Ks, Vs, sh, r0, s0, rows, sl2);
        uint16_t *sw = Ks;
        Ks = Kn, Kn = sw, sw = Vs, Vs = Vn, Vn = sw;
    }
#pragma unroll
    for (int mt = 0; mt < FMR; mt++) {
#pragma unroll
        for (int r = 0; r < 2; r++) l[mt][r] = fa_quad_sum(l[mt][r]);
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int t = rows[mt][r];
            if (t >= Ti) continue;
            float *orow = out + at(b, t, h, T, sh.ldo, D);
            const float inv = 1.0f / l[mt][r];
#pragma unroll
            for (int dn = 0; dn < DN; dn++)
#pragma unroll
                for (int jj = 0; jj < 2; jj++) {
                    const int64_t d = dn * 8 + 2 * t4 + jj;
                    if (d < D) orow[d] = o[mt][dn][2 * r + jj] * inv;
                }
            if (t4 == 0) lse[(b * sh.Hq + h) * T + t] = m[mt][r] * sh.scale + logf(l[mt][r]);
        }
    }
}

/* One tile of FK keys from s0 in dq's kernel, for a warp's rows: acc += dS K over the tile,
 * dS = P (dP - delta), P = exp2(s scale log2(e) - lr), dP = dO V^T. */
template <int DP, bool LDM>
__device__ __forceinline__ void fa_dq_tile(float (&acc)[DP / 8][4], const uint32_t (&qa)[DP / 16][4],
                                           const uint32_t (&ga)[DP / 16][4], const float (&lr)[2],
                                           const float (&dl)[2], const uint16_t *Ks,
                                           const uint16_t *Vs, const att_shape &sh, int64_t q0,
                                           int64_t s0, const int64_t (&rows)[2], float sl2) {
    constexpr int NT = FK / 8, LD = DP + 8;
    const int t4 = threadIdx.x & 3;
    const int64_t T = sh.T;
    /* the tile's keys in two halves (HT n-tiles of S and dP at a time: 32 registers
     * fewer than the whole tile's, which at D = 128 spilled), each half's dS K added onto
     * acc in the order of the keys, as the whole tile's would be */
#pragma unroll
    for (int half = 0; half < 2; half++) {
        constexpr int HT = NT / 2;
        const uint16_t *kh = Ks + half * (FK / 2) * LD, *vh = Vs + half * (FK / 2) * LD;
        float s[HT][4], dp[HT][4];
#pragma unroll
        for (int nt = 0; nt < HT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) s[nt][i] = dp[nt][i] = 0.0f;
        fa_mma_abt<DP, HT, LDM>(s, qa, kh);
        fa_mma_abt<DP, HT, LDM>(dp, ga, vh);
        const int64_t k0 = s0 + half * (FK / 2);
        if (fa_mask_tile(sh.causal, q0, FQ, k0, FK / 2, T, false)) {
            const int last[2] = {fa_last_key(sh, rows[0], k0, FK / 2),
                                 fa_last_key(sh, rows[1], k0, FK / 2)};
#pragma unroll
            for (int nt = 0; nt < HT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    if (nt * 8 + 2 * t4 + (i & 1) > last[i >> 1]) s[nt][i] = -INFINITY;
        }
#pragma unroll
        for (int nt = 0; nt < HT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float p = tz_ex2(fmaf(s[nt][i], sl2, -lr[i >> 1]));
                s[nt][i] = p * (dp[nt][i] - dl[i >> 1]); /* dS */
            }
        fa_mma_ps<DP, HT, LDM>(acc, s, kh);
    }
}

/* k_fa_dq's stores of a warp's rows: in bf16 (G16: tz_att_ld.d16's TZ_ATT_DQ16), or as
 * att_out (a tail of its own, so that the fp32 one keeps its registers) */
template <int DN, bool G16>
__device__ __forceinline__ void fa_dq_out(float *dq, const float (&acc)[DN][4],
                                          const int64_t (&rows)[2], int64_t b, int64_t h, int t4,
                                          const att_shape &sh) {
    const int64_t T = sh.T, D = sh.D;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (rows[r] >= T) continue;
        const int64_t row = at(b, rows[r], h, T, sh.ldq, D);
#pragma unroll
        for (int dn = 0; dn < DN; dn++)
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const int64_t d = dn * 8 + 2 * t4 + j;
                if (d >= D) continue;
                if constexpr (G16)
                    ((uint16_t *)dq)[row + d] = tz_bf16_bits(sh.scale * acc[dn][2 * r + j]);
                else att_out(dq + row + d, sh.scale * acc[dn][2 * r + j], sh);
            }
    }
}

/* dq[t] += scale sum_s P_ts (dP_ts - delta_t) k_s, P = exp(scale q.k - lse), dP = dO . v. */
template <int DP, bool LDM, class TI, bool PIPE>
__global__ void __launch_bounds__(FA_THREADS)
    k_fa_dq(float *dq, const float *dout, const float *lse, const float *delta, const TI *q,
            const TI *k, const TI *v, att_shape sh, const uint16_t *dout16, const float *lse2) {
    constexpr int KS = DP / 16, DN = DP / 8, LD = DP + 8;
    extern __shared__ float smem[];
    uint16_t *Ks = (uint16_t *)smem, *Vs = Ks + FK * LD;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, t4 = lane & 3;
    const int64_t b = blockIdx.z, h = blockIdx.y, kvh = h / sh.rep, T = sh.T, D = sh.D;
    /* the last query rows (causal: the most keys) first, as k_fa_fwd_wide's, so the longest
     * blocks do not start last and leave the GPU a tail of them */
    const int64_t q0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * FQ;
    const int64_t rows[2] = {q0 + w * 16 + (lane >> 2), q0 + w * 16 + (lane >> 2) + 8};
    uint32_t qa[KS][4], ga[KS][4];
    const TI *kb = k + at(b, 0, kvh, T, sh.ldkv, D), *vb = v + at(b, 0, kvh, T, sh.ldkv, D);
    fa_load_a<KS>(qa, q + at(b, 0, h, T, sh.ldq, D), rows, T, sh.ldq, D);
    if constexpr (PIPE) /* dO as k_att_delta rounded it (the same values) */
        fa_load_a<KS>(ga, dout16 + at(b, 0, h, T, sh.Hq * D, D), rows, T, sh.Hq * D, D);
    else fa_load_a<KS>(ga, dout + at(b, 0, h, T, sh.ldo, D), rows, T, sh.ldo, D);
    float lr[2], dl[2], acc[DN][4]; /* lr: lse in base 2 */
    const float sl2 = sh.scale * FA_LOG2E;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int64_t st = (b * sh.Hq + h) * T + rows[r];
        lr[r] = rows[r] < T ? lse[st] * FA_LOG2E : 0.0f;
        dl[r] = rows[r] < T ? delta[st] : 0.0f;
    }
#pragma unroll
    for (int dn = 0; dn < DN; dn++) acc[dn][0] = acc[dn][1] = acc[dn][2] = acc[dn][3] = 0.0f;
    const int64_t nkeys = sh.causal ? (q0 + FQ < T ? q0 + FQ : T) : T;
    if constexpr (PIPE) { /* as k_fa_fwd's: tile i + 1 copied in while tile i is computed */
        uint16_t *Kn = Vs + FK * LD, *Vn = Kn + FK * LD;
        fa_stage_async<DP, FK>(Ks, kb, 0, T, sh.ldkv, D);
        fa_stage_async<DP, FK>(Vs, vb, 0, T, sh.ldkv, D);
        tz_cp_async_commit();
        for (int64_t s0 = 0; s0 < nkeys; s0 += FK) {
            if (s0 + FK < nkeys) {
                fa_stage_async<DP, FK>(Kn, kb, s0 + FK, T, sh.ldkv, D);
                fa_stage_async<DP, FK>(Vn, vb, s0 + FK, T, sh.ldkv, D);
                tz_cp_async_commit();
                tz_cp_async_wait<1>();
            } else tz_cp_async_wait<0>();
            __syncthreads();
            fa_dq_tile<DP, LDM>(acc, qa, ga, lr, dl, Ks, Vs, sh, q0, s0, rows, sl2);
            __syncthreads();
            uint16_t *sw = Ks;
            Ks = Kn, Kn = sw, sw = Vs, Vs = Vn, Vn = sw;
        }
    } else {
        for (int64_t s0 = 0; s0 < nkeys; s0 += FK) {
            __syncthreads();
            fa_tile<DP, FK>(Ks, kb, s0, T, sh.ldkv, D, sh.vec4);
            fa_tile<DP, FK>(Vs, vb, s0, T, sh.ldkv, D, sh.vec4);
            __syncthreads();
            fa_dq_tile<DP, LDM>(acc, qa, ga, lr, dl, Ks, Vs, sh, q0, s0, rows, sl2);
        }
    }
    if (sh.d16 & TZ_ATT_DQ16) fa_dq_out<DN, true>(dq, acc, rows, b, h, t4, sh);
    else fa_dq_out<DN, false>(dq, acc, rows, b, h, t4, sh);
}

/* A kept dS tile into shared memory by cp.async: 8 KiB, 4 copies of 16 bytes a thread */
__device__ __forceinline__ void fa_stage_ds(uint16_t *dst, const uint16_t *src) {
#pragma unroll
    for (int i = 0; i < FA_DS_TILE_ELEMS / 8 / FA_THREADS; i++) {
        const int e = (i * FA_THREADS + (int)threadIdx.x) * 8;
        tz_cp_async<16>(dst + e, src + e, true);
    }
}
/* dq[t] = scale sum_s dS_ts k_s from the tiles of dS that k_fa_dkv<.., DS> kept (dsp,
 * fa_ds_tile): a block of FQ query rows of one query head of the group, a warp 16 rows; K's
 * tiles and the dS tiles copied ahead by cp.async (two buffers of each), dS's A fragments by
 * ldmatrix.x4.trans. blockIdx.x = (query block from the last) x (the group's query heads) +
 * head, so every head's last rows (causal: the most keys) start first. The products and their
 * order are k_fa_dq's (its tile's dS K, 16 keys a step), on the same bf16 values: the same
 * bits. */
template <int DP>
__global__ void __launch_bounds__(FA_THREADS)
    k_fa_dq_ds(float *dq, const uint16_t *k, att_shape sh, fa_dsp dsp) {
    constexpr int DN = DP / 8, LD = DP + 8;
    extern __shared__ float smem[];
    uint16_t *Ks = (uint16_t *)smem, *Kn = Ks + FK * LD;
    uint16_t *Ss = Kn + FK * LD, *Sn = Ss + FA_DS_TILE_ELEMS;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, t4 = lane & 3;
    const int64_t heads = dsp.np * sh.rep, slot = blockIdx.x % heads;
    const int64_t nqb = (sh.T + FQ - 1) / FQ, qb = nqb - 1 - (int64_t)(blockIdx.x / heads);
    const int64_t p = dsp.p0 + slot / sh.rep, b = p / sh.Hkv, kvh = p % sh.Hkv;
    const int64_t h = kvh * sh.rep + slot % sh.rep, T = sh.T, D = sh.D, q0 = qb * FQ;
    const int64_t rows[2] = {q0 + w * 16 + (lane >> 2), q0 + w * 16 + (lane >> 2) + 8};
    const uint16_t *kb = k + at(b, 0, kvh, T, sh.ldkv, D);
    float acc[DN][4];
#pragma unroll
    for (int dn = 0; dn < DN; dn++) acc[dn][0] = acc[dn][1] = acc[dn][2] = acc[dn][3] = 0.0f;
    const int64_t ntiles = sh.causal ? qb + 1 : (T + FK - 1) / FK;
    /* dS's tiles of this head's query block, in the order of their keys */
    const uint16_t *dsq =
        dsp.ds + (size_t)fa_ds_tile(sh, dsp, (int)slot, (int)qb, 0) * FA_DS_TILE_ELEMS;
    fa_stage_async<DP, FK>(Ks, kb, 0, T, sh.ldkv, D);
    fa_stage_ds(Ss, dsq);
    tz_cp_async_commit();
    for (int64_t kt = 0; kt < ntiles; kt++) {
        if (kt + 1 < ntiles) {
            fa_stage_async<DP, FK>(Kn, kb, (kt + 1) * FK, T, sh.ldkv, D);
            fa_stage_ds(Sn, dsq + (kt + 1) * FA_DS_TILE_ELEMS);
            tz_cp_async_commit();
            tz_cp_async_wait<1>();
        } else tz_cp_async_wait<0>();
        __syncthreads();
        const int j = lane >> 3, i = lane & 7;
#pragma unroll
        for (int kk = 0; kk < FK / 16; kk++) {
            /* matrix j: keys 16 kk + 8 (j / 2), queries 16 w + 8 (j % 2) of the tile */
            uint32_t a[4];
            tz_ldmatrix_x4<true>(a, Ss + fa_ds_at(2 * kk + (j >> 1), 2 * w + (j & 1)) + i * 8);
            fa_mma_pv_step<DP, true>(acc, a, Ks, kk);
        }
        __syncthreads();
        uint16_t *sw = Ks;
        Ks = Kn, Kn = sw, sw = Ss, Ss = Sn, Sn = sw;
    }
    if (sh.d16 & TZ_ATT_DQ16) fa_dq_out<DN, true>(dq, acc, rows, b, h, t4, sh);
    else fa_dq_out<DN, false>(dq, acc, rows, b, h, t4, sh);
}

/* One tile of FQT query rows from t0 in dk/dv's kernel, for a warp's keys: av += P^T dO and
 * ak += dS^T Q over the tile, from the staged Q, dO (Qs, Gs), base-2 lse and delta (Ls, Ds). */
template <int DP, bool LDM, bool DS = false>
__device__ __forceinline__ void fa_dkv_tile(float (&ak)[DP / 8][4], float (&av)[DP / 8][4],
                                            const uint32_t (&ka)[DP / 16][4],
                                            const uint32_t (&va)[DP / 16][4], const uint16_t *Qs,
                                            const uint16_t *Gs, const float *Ls, const float *Ds,
                                            const att_shape &sh, int64_t k0, int64_t t0,
                                            const int64_t (&keys)[2], float sl2,
                                            const fa_dsp &dsp, unsigned dtile) {
    constexpr int NT = FQT / 8, LD = DP + 8;
    const int t4 = threadIdx.x & 3;
    const int64_t T = sh.T;
    /* the tile's queries in two halves (as k_fa_dq's keys: fewer registers live, the
     * same sums in the same order) */
#pragma unroll
    for (int half = 0; half < 2; half++) {
        constexpr int HT = NT / 2;
        const uint16_t *qh = Qs + half * (FQT / 2) * LD, *gh = Gs + half * (FQT / 2) * LD;
        float s[HT][4], dp[HT][4];
#pragma unroll
        for (int nt = 0; nt < HT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) s[nt][i] = dp[nt][i] = 0.0f;
        fa_mma_abt<DP, HT, LDM>(s, ka, qh);  /* S^T: keys x queries */
        fa_mma_abt<DP, HT, LDM>(dp, va, gh); /* dP^T */
        const int64_t th = t0 + half * (FQT / 2);
        if (fa_mask_tile(sh.causal, k0, FKV, th, FQT / 2, T, true)) {
            /* key s sees the queries t in [s if causal else 0, T - 1] */
            int lo[2], hi[2];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const bool in = keys[r] < T;
                lo[r] = in ? fa_clamp((sh.causal ? keys[r] : 0) - th, FQT / 2) : FQT / 2;
                hi[r] = in ? fa_clamp(T - 1 - th, FQT / 2) : -1;
            }
#pragma unroll
            for (int nt = 0; nt < HT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int j = nt * 8 + 2 * t4 + (i & 1);
                    if (j < lo[i >> 1] || j > hi[i >> 1]) s[nt][i] = -INFINITY;
                }
        }
#pragma unroll
        for (int nt = 0; nt < HT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int j = half * (FQT / 2) + nt * 8 + 2 * t4 + (i & 1);
                const float p = tz_ex2(fmaf(s[nt][i], sl2, -Ls[j]));
                s[nt][i] = p;                        /* P^T */
                dp[nt][i] = p * (dp[nt][i] - Ds[j]); /* dS^T */
            }
        if constexpr (DS) {
            /* dS^T rounded to bf16 as fa_mma_ps rounds it, into A fragments (8 registers where
             * the fp32 values took 16) stored into the tile (fa_ds_at) before the products:
             * register r of step kk holds keys g + 8 (r % 2) of the warp's 16 (key block 2w +
             * r % 2), queries 2 t4, 2 t4 + 1 of n-tile 2 kk + r / 2 (query block qs + 2 kk +
             * r / 2); a warp's store, 128 bytes in a row */
            const int w = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2;
            const int qs = (int)((th % FA_DS_T) >> 3);
            uint16_t *dst = dsp.ds + (size_t)dtile * FA_DS_TILE_ELEMS + g * 8 + 2 * t4;
            uint32_t a[HT / 2][4];
#pragma unroll
            for (int kk = 0; kk < HT / 2; kk++) {
                a[kk][0] = tz_pack_bf16(dp[2 * kk][0], dp[2 * kk][1]);
                a[kk][1] = tz_pack_bf16(dp[2 * kk][2], dp[2 * kk][3]);
                a[kk][2] = tz_pack_bf16(dp[2 * kk + 1][0], dp[2 * kk + 1][1]);
                a[kk][3] = tz_pack_bf16(dp[2 * kk + 1][2], dp[2 * kk + 1][3]);
#pragma unroll
                for (int r = 0; r < 4; r++)
                    *(uint32_t *)(dst + fa_ds_at(2 * w + (r & 1), qs + 2 * kk + (r >> 1))) =
                        a[kk][r];
            }
            fa_mma_ps<DP, HT, LDM>(av, s, gh);
#pragma unroll
            for (int kk = 0; kk < HT / 2; kk++) fa_mma_pv_step<DP, LDM>(ak, a[kk], qh, kk);
        } else {
            fa_mma_ps<DP, HT, LDM>(av, s, gh);
            fa_mma_ps<DP, HT, LDM>(ak, dp, qh);
        }
    }
}

/* dk/dv's staging by cp.async (sh.pipe): query head h's rows [t0, t0 + FQT) of q (bf16) and
 * of the rounded dO (dout16), and their base-2 lse and delta (k_att_delta's), zeros past T. */
template <int DP>
__device__ __forceinline__ void fa_dkv_stage_async(uint16_t *Qd, uint16_t *Gd, float *Ld,
                                                   float *Dd, const uint16_t *q,
                                                   const uint16_t *dout16, const float *lse2,
                                                   const float *delta, const att_shape &sh,
                                                   int64_t b, int64_t h, int64_t t0) {
    const int64_t T = sh.T, D = sh.D, ld16 = sh.Hq * D;
    fa_stage_async<DP, FQT>(Qd, q + at(b, 0, h, T, sh.ldq, D), t0, T, sh.ldq, D);
    fa_stage_async<DP, FQT>(Gd, dout16 + at(b, 0, h, T, ld16, D), t0, T, ld16, D);
    const int i = (int)threadIdx.x, j = i % FQT; /* threads 0 .. 2 FQT - 1: lse2, then delta */
    const int64_t t = t0 + j;
    const float *src = (i < FQT ? lse2 : delta) + (b * sh.Hq + h) * T;
    if (i < 2 * FQT) tz_cp_async<4>((i < FQT ? Ld : Dd) + j, t < T ? src + t : src, t < T);
}

/* k_fa_dkv's stores of a warp's keys: dk (K16) and dv (V16) in bf16 bit patterns (sh.d16's
 * TZ_ATT_DK16, TZ_ATT_DV16; written) or as att_out; a tail for each form, so that each keeps
 * only the registers it needs */
template <int DN, bool K16, bool V16>
__device__ __forceinline__ void fa_dkv_out(float *dk, float *dv, const float (&ak)[DN][4],
                                           const float (&av)[DN][4], const int64_t (&keys)[2],
                                           int64_t b, int64_t kvh, int t4, const att_shape &sh) {
    const int64_t T = sh.T, D = sh.D;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (keys[r] >= T) continue;
        const int64_t o = at(b, keys[r], kvh, T, sh.ldkv, D);
#pragma unroll
        for (int dn = 0; dn < DN; dn++)
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const int64_t d = dn * 8 + 2 * t4 + j;
                if (d >= D) continue;
                if constexpr (V16) ((uint16_t *)dv)[o + d] = tz_bf16_bits(av[dn][2 * r + j]);
                else att_out(dv + o + d, av[dn][2 * r + j], sh);
                if constexpr (K16)
                    ((uint16_t *)dk)[o + d] = tz_bf16_bits(sh.scale * ak[dn][2 * r + j]);
                else att_out(dk + o + d, sh.scale * ak[dn][2 * r + j], sh);
            }
    }
}

/* dv[s] += sum_{h in group, t} P_ts dO_t;  dk[s] += scale sum P_ts (dP_ts - delta_t) q_t.
 * DS (sh.pipe only): dS^T kept for k_fa_dq_ds too, the grid one group's (dsp.p0, dsp.np). */
template <int DP, bool LDM, class TI, bool PIPE, bool DS = false>
__global__ void __launch_bounds__(FA_THREADS)
    k_fa_dkv(float *dk, float *dv, const float *dout, const float *lse, const float *delta,
             const TI *q, const TI *k, const TI *v, att_shape sh, const uint16_t *dout16,
             const float *lse2, fa_dsp dsp = {}) {
    static_assert(!DS || PIPE, "dS is kept by the tiles-ahead kernel");
    constexpr int KS = DP / 16, DN = DP / 8, LD = DP + 8;
    extern __shared__ float smem[];
    uint16_t *Qs = (uint16_t *)smem, *Gs = Qs + FQT * LD;
    float *Ls = (float *)(Gs + FQT * LD), *Ds = Ls + FQT;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, t4 = lane & 3;
    const int64_t T = sh.T, D = sh.D;
    int64_t b = blockIdx.z, kvh = blockIdx.y, k0 = (int64_t)blockIdx.x * FKV;
    int slot0 = 0; /* DS: the group's slot of the pair's first query head */
    if constexpr (DS) { /* (grid y: key blocks, x: the group's pairs, so that every pair's first
                         * keys, the most queries when causal, start first) */
        const int p = (int)dsp.p0 + (int)blockIdx.x, hkv = (int)sh.Hkv;
        b = p / hkv, kvh = p % hkv, k0 = (int64_t)blockIdx.y * FKV;
        slot0 = (int)blockIdx.x * (int)sh.rep;
    }
    const int64_t keys[2] = {k0 + w * 16 + (lane >> 2), k0 + w * 16 + (lane >> 2) + 8};
    uint32_t ka[KS][4], va[KS][4];
    fa_load_a<KS>(ka, k + at(b, 0, kvh, T, sh.ldkv, D), keys, T, sh.ldkv, D);
    fa_load_a<KS>(va, v + at(b, 0, kvh, T, sh.ldkv, D), keys, T, sh.ldkv, D);
    float ak[DN][4], av[DN][4];
#pragma unroll
    for (int dn = 0; dn < DN; dn++)
#pragma unroll
        for (int i = 0; i < 4; i++) ak[dn][i] = av[dn][i] = 0.0f;
    /* queries that can see a key of this block: t >= k0 when causal */
    const int64_t tq0 = sh.causal ? k0 / FQT * FQT : 0;
    const float sl2 = sh.scale * FA_LOG2E;
    if constexpr (PIPE) { /* the group's tiles in one sequence, head after head: tile i + 1
                           * copied in while tile i is computed (as k_fa_fwd's) */
        uint16_t *Qn = (uint16_t *)(Ds + FQT), *Gn = Qn + FQT * LD;
        float *Ln = (float *)(Gn + FQT * LD), *Dn = Ln + FQT;
        const int64_t nq = (T - tq0 + FQT - 1) / FQT, ntiles = sh.rep * nq, h0 = kvh * sh.rep;
        const int64_t tq_end = tq0 + nq * FQT;
        /* tile i's query head (as its slot in the group) and first row, and tile i + 1's: the
         * head's tiles in order, then the next head's, counted on rather than divided out of i
         * (a 64-bit division and remainder a tile in the loop); rows in 32 bits (fa_pipe: T <=
         * INT_MAX - FQW), which ptxas gives fewer spilled bytes at D = 128 on sm_90 */
        int r = 0, rn = tq0 + FQT < tq_end ? 0 : 1;
        int t0 = (int)tq0, tn = rn ? (int)tq0 : (int)tq0 + FQT;
        fa_dkv_stage_async<DP>(Qs, Gs, Ls, Ds, q, dout16, lse2, delta, sh, b, h0, tq0);
        tz_cp_async_commit();
        for (int64_t i = 0; i < ntiles; i++) {
            if (i + 1 < ntiles) {
                fa_dkv_stage_async<DP>(Qn, Gn, Ln, Dn, q, dout16, lse2, delta, sh, b, h0 + rn, tn);
                tz_cp_async_commit();
                tz_cp_async_wait<1>();
            } else tz_cp_async_wait<0>();
            __syncthreads(); /* tile i in Qs, Gs, Ls, Ds for every thread */
            if constexpr (DS)
                fa_dkv_tile<DP, LDM, true>(ak, av, ka, va, Qs, Gs, Ls, Ds, sh, k0, t0, keys, sl2,
                                           dsp,
                                           fa_ds_tile(sh, dsp, slot0 + r, (int)(t0 / FA_DS_T),
                                                      (int)(k0 / FA_DS_T)));
            else
                fa_dkv_tile<DP, LDM>(ak, av, ka, va, Qs, Gs, Ls, Ds, sh, k0, t0, keys, sl2, dsp,
                                     0);
            __syncthreads(); /* no longer read: the next copies may go there */
            uint16_t *sw = Qs;
            Qs = Qn, Qn = sw, sw = Gs, Gs = Gn, Gn = sw;
            float *fw = Ls;
            Ls = Ln, Ln = fw, fw = Ds, Ds = Dn, Dn = fw;
            r = rn, t0 = tn;
            tn += FQT;
            if (tn >= tq_end) tn = (int)tq0, rn++;
        }
    } else {
        for (int64_t r = 0; r < sh.rep; r++) {
            const int64_t h = kvh * sh.rep + r;
            const float *lr = lse + (b * sh.Hq + h) * T, *dr = delta + (b * sh.Hq + h) * T;
            for (int64_t t0 = tq0; t0 < T; t0 += FQT) {
                __syncthreads();
                fa_tile<DP, FQT>(Qs, q + at(b, 0, h, T, sh.ldq, D), t0, T, sh.ldq, D, sh.vec4);
                fa_tile<DP, FQT>(Gs, dout + at(b, 0, h, T, sh.ldo, D), t0, T, sh.ldo, D, sh.vec4);
                if (threadIdx.x < FQT) {
                    const int64_t t = t0 + threadIdx.x;
                    Ls[threadIdx.x] = t < T ? lr[t] * FA_LOG2E : 0.0f; /* lse in base 2 */
                    Ds[threadIdx.x] = t < T ? dr[t] : 0.0f;
                }
                __syncthreads();
                fa_dkv_tile<DP, LDM>(ak, av, ka, va, Qs, Gs, Ls, Ds, sh, k0, t0, keys, sl2, dsp,
                                     0);
            }
        }
    }
    if (sh.d16 & TZ_ATT_DK16) fa_dkv_out<DN, true, true>(dk, dv, ak, av, keys, b, kvh, t4, sh);
    else if (sh.d16 & TZ_ATT_DV16)
        fa_dkv_out<DN, false, true>(dk, dv, ak, av, keys, b, kvh, t4, sh);
    else fa_dkv_out<DN, false, false>(dk, dv, ak, av, keys, b, kvh, t4, sh);
}

/* DP for a head dimension: the instantiations (D padded to 32, 64, 80 or 128: DiT-XL/2's 72
 * to 80, Llama's 128 as it is). */
static int fa_dp(int64_t D) { return D <= 32 ? 32 : D <= 64 ? 64 : D <= 80 ? 80 : 128; }
/* the forward's and dq's K and V tiles (two of each with sh.pipe: at DP = 128, 68 KiB) */
static size_t fa_smem_fwd(int dp, int pipe) { return (size_t)(pipe ? 4 : 2) * FK * (dp + 8) * 2; }
/* dk/dv's Q and dO tiles and their rows' lse and delta (two sets with sh.pipe: 34.5 KiB at 128) */
static size_t fa_smem_dkv(int dp, int pipe) {
    return (size_t)(pipe ? 2 : 1) * (2 * FQT * (dp + 8) * 2 + 2 * FQT * 4);
}

/* Whether every tensor the flash kernels stage is aligned to 4 of its elements (esz bytes
 * each: 16 bytes in fp32, 8 in bf16) with D and its row stride multiples of 4 (every row's
 * slots of 4 aligned). */
static int fa_vec4(int64_t D, const void *const *p, const int64_t *ld, const int *esz, int n) {
    if (D % 4) return 0;
    for (int i = 0; i < n; i++)
        if ((uintptr_t)p[i] % (uintptr_t)(4 * esz[i]) || ld[i] % 4) return 0;
    return 1;
}

/* k_fa_fwd_wide's Q tile and two buffers of K and V (at DP = 128, 102 KiB: two blocks a
 * multiprocessor on an H100, as the registers allow) */
static size_t fa_smem_wide(int dp) { return (size_t)(FQW + 4 * FK) * (dp + 8) * 2; }
/* Whether a block of `bytes` of dynamic shared memory fits the device (its opt-in limit per
 * block: 227 KiB on an H100, 163 on an A100, 99 on sm_86 and sm_89, which run the sm_80
 * code): a form that does not fit is not taken, its fallback is. */
static int fa_fits(tz_backend *be, size_t bytes) {
    return bytes <= tz_cuda_ctx_of(be)->smem_optin;
}

/* Whether the flash kernels' bf16 tiles are copied ahead by cp.async, two buffers of each
 * (sh.pipe): q, k, v in bf16 with D and k, v's row stride multiples of 8 and k, v 16-byte
 * aligned (every copy of 8 elements whole, inside D or past it; the backward's q too) and T
 * below INT_MAX - FQW (dk/dv's rows counted in 32 bits), where the forward's and dk/dv's
 * buffers fit the device (fa_fits), unless TZ_FA_ASYNC=0 (read at
 * every call, for measuring what it gives: the same bits either way, which test_cuda_ops
 * checks) or TZ_FA_LDMATRIX=0 (the cp.async kernels load with ldmatrix only). */
static int fa_ldmatrix(void);
static int fa_pipe(tz_backend *be, const att_shape *sh, const void *k, const void *v) {
    const int dp = fa_dp(sh->D);
    if (!sh->in16 || sh->D % 8 || sh->ldkv % 8 || (uintptr_t)k % 16 || (uintptr_t)v % 16 ||
        sh->T > INT_MAX - FQW || !fa_ldmatrix() || !fa_fits(be, fa_smem_fwd(dp, 1)) ||
        !fa_fits(be, fa_smem_dkv(dp, 1)))
        return 0;
    const char *e = getenv("TZ_FA_ASYNC");
    return !(e && !strcmp(e, "0"));
}

/* Whether the forward takes k_fa_fwd_wide (128 query rows a block): the cp.async form
 * (sh.pipe) with q aligned and strided as k and v are (its Q tile copied too) where a
 * multiprocessor holds two of its blocks, as it does k_fa_fwd's (each block's shared memory
 * and the 1 KiB the runtime keeps for it: an H100's 228 KiB holds two at D = 128, an A100's
 * 164 one, sm_86's and sm_89's 100 none), unless TZ_FA_ROWS=64 (k_fa_fwd: for measuring what
 * it gives; the same bits either way, which test_cuda_ops checks; read at every call). */
static int fa_wide(tz_backend *be, const att_shape *sh, const void *q) {
    const size_t bytes = fa_smem_wide(fa_dp(sh->D));
    if (!sh->pipe || (uintptr_t)q % 16 || sh->ldq % 8 || sh->T > INT_MAX - FQW ||
        !fa_fits(be, bytes) || 2 * (bytes + 1024) > tz_cuda_ctx_of(be)->smem_sm)
        return 0;
    const char *e = getenv("TZ_FA_ROWS");
    return !(e && !strcmp(e, "64"));
}

static void fa_check(const att_shape *sh) {
    if (sh->Hq > 65535 || sh->B > 65535 || (sh->T + FQ - 1) / FQ > 2147483647LL)
        TZ_FATAL("attention: B=%lld, T=%lld, Hq=%lld exceed the kernel's grid", (long long)sh->B,
                 (long long)sh->T, (long long)sh->Hq);
}

/* Whether the flash kernels load their B fragments with ldmatrix (default) or by 16- and
 * 32-bit reads: TZ_FA_LDMATRIX=0, for measuring what ldmatrix gives (the results are the
 * same bits either way, which test_cuda_ops checks; read at every call, so that it can). */
static int fa_ldmatrix(void) {
    const char *e = getenv("TZ_FA_LDMATRIX");
    return !(e && !strcmp(e, "0"));
}

/* Lets kernel f take up to `bytes` of dynamic shared memory, past the 48 KiB every launch gets
 * (cudaFuncAttributeMaxDynamicSharedMemorySize); once per kernel and size, the first time a
 * launch needs it. */
template <class F> static void fa_optin(F *f, size_t bytes) {
    if (bytes <= 48 * 1024) return;
    static const void *done[64];
    static size_t done_bytes[64];
    static int n = 0;
    for (int i = 0; i < n; i++)
        if (done[i] == (const void *)f && done_bytes[i] >= bytes) return;
    CUDA_CHECK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    if (n < 64) done[n] = (const void *)f, done_bytes[n++] = bytes;
}

/* KERNEL<ARGS> launched with smem bytes of dynamic shared memory (ARGS: dp, ldm, TI[, PIPE];
 * TI: q, k and v's element type, float or bf16 bits) */
#define FA_GO(KERNEL, grid, smem, st, ...)                                                    \
    do {                                                                                      \
        fa_optin(KERNEL, smem);                                                               \
        KERNEL<<<grid, FA_THREADS, smem, st>>>(__VA_ARGS__);                                  \
    } while (0)
#define FA_COMMA ,
/* KERNEL<dp, ldm, TI, PIPE>, the cp.async form (sh.pipe: bf16 inputs only, and only with
 * ldmatrix) a kernel of its own, since one kernel holding both loops spilled registers (at
 * DP = 128 the dq kernel 96 bytes, at 80 the forward 80; each alone none; nvcc 13 -Xptxas -v,
 * sm_90) */
#define FA_LAUNCH_P(dp, ldm, pipe, TI, KERNEL, grid, smem, st, ...)                           \
    do {                                                                                      \
        if constexpr (sizeof(TI) == 2) {                                                      \
            if (pipe) {                                                                       \
                FA_GO(KERNEL<dp FA_COMMA true FA_COMMA TI FA_COMMA true>, grid, smem, st,     \
                      __VA_ARGS__);                                                           \
                break;                                                                        \
            }                                                                                 \
        }                                                                                     \
        if (ldm)                                                                              \
            FA_GO(KERNEL<dp FA_COMMA true FA_COMMA TI FA_COMMA false>, grid, smem, st,        \
                  __VA_ARGS__);                                                               \
        else                                                                                  \
            FA_GO(KERNEL<dp FA_COMMA false FA_COMMA TI FA_COMMA false>, grid, smem, st,       \
                  __VA_ARGS__);                                                               \
    } while (0)
#define FA_DISPATCH_P(dp, pipe, TI, KERNEL, grid, smem, st, ...)                              \
    do {                                                                                      \
        const int ldm_ = fa_ldmatrix();                                                       \
        if ((dp) == 32) FA_LAUNCH_P(32, ldm_, pipe, TI, KERNEL, grid, smem, st, __VA_ARGS__); \
        else if ((dp) == 64)                                                                  \
            FA_LAUNCH_P(64, ldm_, pipe, TI, KERNEL, grid, smem, st, __VA_ARGS__);             \
        else if ((dp) == 80)                                                                  \
            FA_LAUNCH_P(80, ldm_, pipe, TI, KERNEL, grid, smem, st, __VA_ARGS__);             \
        else FA_LAUNCH_P(128, ldm_, pipe, TI, KERNEL, grid, smem, st, __VA_ARGS__);           \
        CUDA_LAUNCHED();                                                                      \
    } while (0)

template <class TI>
static void fa_fwd(tz_backend *be, float *out, float *lse, const TI *q, const TI *k,
                   const TI *v, const att_shape *shp) {
    att_shape sh = *shp;
    fa_check(&sh);
    const void *staged[] = {k, v};
    const int64_t lds[] = {sh.ldkv, sh.ldkv};
    const int esz[] = {(int)sizeof(TI), (int)sizeof(TI)};
    sh.vec4 = fa_vec4(sh.D, staged, lds, esz, 2);
    sh.pipe = fa_pipe(be, &sh, k, v);
    const int dp = fa_dp(sh.D);
    cudaStream_t st = tz_cuda_stream(be);
    if constexpr (sizeof(TI) == 2) {
        if (fa_wide(be, &sh, q)) {
            dim3 grid((unsigned)((sh.T + FQW - 1) / FQW), (unsigned)sh.Hq, (unsigned)sh.B);
            const size_t smem = fa_smem_wide(dp);
            if (dp == 32) FA_GO(k_fa_fwd_wide<32>, grid, smem, st, out, lse, q, k, v, sh);
            else if (dp == 64) FA_GO(k_fa_fwd_wide<64>, grid, smem, st, out, lse, q, k, v, sh);
            else if (dp == 80) FA_GO(k_fa_fwd_wide<80>, grid, smem, st, out, lse, q, k, v, sh);
            else FA_GO(k_fa_fwd_wide<128>, grid, smem, st, out, lse, q, k, v, sh);
            CUDA_LAUNCHED();
            return;
        }
    }
    dim3 grid((unsigned)((sh.T + FQ - 1) / FQ), (unsigned)sh.Hq, (unsigned)sh.B);
    FA_DISPATCH_P(dp, sh.pipe, TI, k_fa_fwd, grid, fa_smem_fwd(dp, sh.pipe), st, out, lse, q, k,
                  v, sh);
}

/* dq's kernel reading the kept dS: two buffers of K's tiles and of dS's */
static size_t fa_smem_dq_ds(int dp) {
    return (size_t)(2 * FK * (dp + 8) + 2 * FA_DS_TILE_ELEMS) * 2;
}
/* Whether TZ_FA_DS=0 asks for dq's kernel computing dS again (for measuring what keeping it
 * gives: the same bits either way, which test_cuda_ops checks; read at every call). */
static int fa_ds_on(void) {
    const char *e = getenv("TZ_FA_DS");
    return !(e && !strcmp(e, "0"));
}
/* A query head's dS tiles (tz_attention_ds_head_bytes' count) */
static int64_t fa_ds_tiles(const att_shape *sh) {
    return (int64_t)(tz_attention_ds_head_bytes(sh->T, sh->causal) / (FA_DS_TILE_ELEMS * 2));
}
/* The pairs of a group whose dS the backward keeps in the memory lent (be->att_ds), or 0:
 * dq's kernel computes it again. Only the tiles-ahead kernels (sh.pipe) keep it. */
static int64_t fa_ds_group(tz_backend *be, const att_shape *sh, const void *ds, size_t bytes) {
    if (!sh->pipe || !ds || (uintptr_t)ds % 16 || !fa_ds_on() ||
        !fa_fits(be, fa_smem_dq_ds(fa_dp(sh->D))) || sh->T > INT_MAX - FA_DS_T)
        return 0;
    const int64_t g = tz_attention_ds_group(sh->B, sh->T, sh->Hq, sh->Hkv, sh->causal, bytes);
    const int64_t nb = (sh->T + FA_DS_T - 1) / FA_DS_T;
    const int64_t tiles = fa_ds_tiles(sh);
    /* (dk/dv's grid: key blocks on y; dq's on x with the heads; the tile numbers in 32 bits) */
    return g && nb <= 65535 && nb * g * sh->rep <= INT_MAX && tiles * g * sh->rep <= INT_MAX
               ? g
               : 0;
}

/* One group's dk, dv (dS kept) and dq from dS (dsp.p0, dsp.np) */
template <int DP>
static void fa_bwd_ds(tz_backend *be, cudaStream_t st, const att_shape &sh, const fa_dsp &dsp,
                      float *dq, float *dk, float *dv, const float *dout, const float *lse,
                      const float *delta, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                      const uint16_t *dout16, const float *lse2) {
    const int64_t nb = (sh.T + FA_DS_T - 1) / FA_DS_T;
    FA_GO(k_fa_dkv<DP FA_COMMA true FA_COMMA uint16_t FA_COMMA true FA_COMMA true>,
          dim3((unsigned)dsp.np, (unsigned)nb), fa_smem_dkv(DP, 1), st, dk, dv, dout, lse, delta,
          q, k, v, sh, dout16, lse2, dsp);
    CUDA_LAUNCHED();
    tz_cuda_part(be, "attention_bwd: k_fa_dkv_ds");
    FA_GO(k_fa_dq_ds<DP>, (unsigned)(nb * dsp.np * sh.rep), fa_smem_dq_ds(DP), st, dq, k, sh,
          dsp);
    CUDA_LAUNCHED();
    tz_cuda_part(be, "attention_bwd: k_fa_dq_ds");
}

template <class TI>
static void fa_bwd(tz_backend *be, float *dq, float *dk, float *dv, const float *dout,
                   const float *out, const float *lse, const TI *q, const TI *k, const TI *v,
                   const att_shape *shp, void *ws, size_t ws_bytes, void *ds, size_t ds_bytes) {
    att_shape sh = *shp;
    fa_check(&sh);
    const void *staged[] = {q, k, v, dout};
    const int64_t lds[] = {sh.ldq, sh.ldkv, sh.ldkv, sh.ldo};
    const int e = (int)sizeof(TI), esz[] = {e, e, e, 4};
    sh.vec4 = fa_vec4(sh.D, staged, lds, esz, 4);
    /* (dk/dv's kernel copies q's tiles too: q as k and v) */
    sh.pipe = fa_pipe(be, &sh, k, v) && (uintptr_t)q % 16 == 0 && sh.ldq % 8 == 0;
    const size_t db = tz_attention_delta_bytes(sh.B, sh.T, sh.Hq);
    const size_t need = sh.pipe ? tz_attention_flash_ws_bytes(sh.B, sh.T, sh.Hq, sh.D) : db;
    if (!ws || ws_bytes < need)
        TZ_FATAL("attention_bwd with bf16 GEMM operands: %zu bytes of workspace lent, %zu "
                 "planned for B=%lld T=%lld Hq=%lld D=%lld (be->att_ws, tz_attention_ws_bytes)",
                 ws ? ws_bytes : 0, tz_attention_ws_bytes(be, sh.B, sh.T, sh.Hq, sh.D, 1, sh.in16),
                 (long long)sh.B, (long long)sh.T, (long long)sh.Hq, (long long)sh.D);
    /* the workspace: delta, then (sh.pipe) lse in base 2 and dO in bf16 for the copies */
    float *delta = (float *)ws;
    float *lse2 = sh.pipe ? (float *)((char *)ws + db) : nullptr;
    uint16_t *dout16 = sh.pipe ? (uint16_t *)((char *)ws + 2 * db) : nullptr;
    cudaStream_t st = tz_cuda_stream(be);
    const int64_t rows = sh.B * sh.Hq * sh.T;
    if constexpr (sizeof(TI) != 2) (void)ds, (void)ds_bytes; /* (kept by the bf16 kernels only) */
    k_att_delta<<<tz_cuda_blocks(rows * 32, 256), 256, 0, st>>>(delta, dout, out, sh, 1, lse2,
                                                                 lse, dout16);
    CUDA_LAUNCHED();
    tz_cuda_part(be, "attention_bwd: k_att_delta");
    const int dp = fa_dp(sh.D);
    if constexpr (sizeof(TI) == 2) {
        /* dS kept: dk/dv's kernel, then dq's from it, a group of pairs at a time */
        if (const int64_t group = fa_ds_group(be, &sh, ds, ds_bytes)) {
            const int64_t pairs = sh.B * sh.Hkv;
            fa_dsp dsp = {(uint16_t *)ds, 0, 0, fa_ds_tiles(&sh)};
            for (int64_t p0 = 0; p0 < pairs; p0 += group) {
                dsp.p0 = p0, dsp.np = pairs - p0 < group ? pairs - p0 : group;
                auto go = [&](auto f) {
                    f(be, st, sh, dsp, dq, dk, dv, dout, lse, delta, q, k, v, dout16, lse2);
                };
                if (dp == 32) go(fa_bwd_ds<32>);
                else if (dp == 64) go(fa_bwd_ds<64>);
                else if (dp == 80) go(fa_bwd_ds<80>);
                else go(fa_bwd_ds<128>);
            }
            return;
        }
    }
    dim3 gq((unsigned)((sh.T + FQ - 1) / FQ), (unsigned)sh.Hq, (unsigned)sh.B);
    FA_DISPATCH_P(dp, sh.pipe, TI, k_fa_dq, gq, fa_smem_fwd(dp, sh.pipe), st, dq, dout, lse,
                  delta, q, k, v, sh, dout16, lse2);
    tz_cuda_part(be, "attention_bwd: k_fa_dq");
    dim3 gk((unsigned)((sh.T + FKV - 1) / FKV), (unsigned)sh.Hkv, (unsigned)sh.B);
    FA_DISPATCH_P(dp, sh.pipe, TI, k_fa_dkv, gk, fa_smem_dkv(dp, sh.pipe), st, dk, dv, dout,
                  lse, delta, q, k, v, sh, dout16, lse2);
    tz_cuda_part(be, "attention_bwd: k_fa_dkv");
}

/* ================= the table's entries ================= */

/* q, k, v in bf16 (tz_att_ld.in16) are read by the flash kernels on the tensor cores only */
static void need_flash16(const tz_backend *be, int64_t D) {
    if (!tz_attention_takes_bf16(be, D))
        TZ_FATAL("attention: q, k and v in bf16 need the tensor-core flash kernels (bf16 GEMM "
                 "operands, head dimension <= %d; here %s, D = %lld)", FA_MAXD,
                 be->matmul_dtype == TZ_DT_BF16 ? "bf16" : "fp32", (long long)D);
}

static void cuda_attention_fwd(tz_backend *be, float *out, float *lse, const float *q,
                               const float *k, const float *v, int64_t B, int64_t T, int64_t Hq,
                               int64_t Hkv, int64_t D, int causal, const tz_att_ld *ld) {
    void *ws = be->att_ws;
    const size_t ws_bytes = be->att_ws_bytes;
    be->att_ws = NULL, be->att_ws_bytes = 0; /* the loan ends with the call */
    att_shape sh = make_shape(B, T, Hq, Hkv, D, causal, ld);
    if (B <= 0 || T <= 0 || D <= 0 || Hq <= 0) return;
    /* out and lse may be on their way to the host on the copy queue (a model keeping them for
     * backward): on the emulation, checked against such copies as a copy into them would be */
    CUDA_CHECK(tz_cuda_kernel_writes(tz_cuda_stream(be), out,
                                     (size_t)((B * T - 1) * sh.ldo + Hq * D) * sizeof *out,
                                     "attention output"));
    CUDA_CHECK(tz_cuda_kernel_writes(tz_cuda_stream(be), lse, (size_t)(B * T * Hq) * sizeof *lse,
                                     "attention lse"));
    if (sh.in16) {
        need_flash16(be, D);
        fa_fwd(be, out, lse, (const uint16_t *)(const void *)q, (const uint16_t *)(const void *)k,
               (const uint16_t *)(const void *)v, &sh);
    } else if (be->matmul_dtype != TZ_DT_BF16) flash_fwd(be, out, lse, q, k, v, &sh);
    else if (D <= FA_MAXD) fa_fwd(be, out, lse, q, k, v, &sh);
    else tc_fwd(be, out, lse, q, k, v, &sh, ws, ws_bytes);
}

static void cuda_attention_bwd(tz_backend *be, float *dq, float *dk, float *dv,
                               const float *dout, const float *out, const float *lse,
                               const float *q, const float *k, const float *v, int64_t B,
                               int64_t T, int64_t Hq, int64_t Hkv, int64_t D, int causal,
                               int accumulate, const tz_att_ld *ld) {
    void *ws = be->att_ws, *ds = be->att_ds;
    const size_t ws_bytes = be->att_ws_bytes, ds_bytes = be->att_ds_bytes;
    be->att_ws = NULL, be->att_ws_bytes = 0, be->att_ds = NULL, be->att_ds_bytes = 0;
    att_shape sh = make_shape(B, T, Hq, Hkv, D, causal, ld);
    sh.acc = accumulate != 0;
    if (sh.d16 && (sh.acc || !tz_attention_takes_bf16(be, D)))
        TZ_FATAL("attention_bwd: gradients in bf16 (tz_att_ld.d16) are written by the "
                 "tensor-core flash kernels only (bf16 GEMM operands, head dimension <= %d, "
                 "accumulate 0; here %s, D = %lld, accumulate %d)", FA_MAXD,
                 be->matmul_dtype == TZ_DT_BF16 ? "bf16" : "fp32", (long long)D, accumulate);
    if (B <= 0 || T <= 0 || D <= 0 || Hq <= 0) return;
    /* the forward's out and lse may have come back from the host on the copy queue (a model
     * keeping them for backward): on the emulation, checked against such copies */
    TZ_CUDA_KERNEL_READS(be, out, (size_t)((B * T - 1) * sh.ldo + Hq * D) * sizeof *out,
                         "attention output");
    TZ_CUDA_KERNEL_READS(be, lse, (size_t)(B * T * Hq) * sizeof *lse, "attention lse");
    if (sh.in16) {
        need_flash16(be, D);
        fa_bwd(be, dq, dk, dv, dout, out, lse, (const uint16_t *)(const void *)q,
               (const uint16_t *)(const void *)k, (const uint16_t *)(const void *)v, &sh, ws,
               ws_bytes, ds, ds_bytes);
    } else if (be->matmul_dtype != TZ_DT_BF16)
        flash_bwd(be, dq, dk, dv, dout, out, lse, q, k, v, &sh);
    else if (D <= FA_MAXD)
        fa_bwd(be, dq, dk, dv, dout, out, lse, q, k, v, &sh, ws, ws_bytes, ds, ds_bytes);
    else tc_bwd(be, dq, dk, dv, dout, out, lse, q, k, v, &sh, ws, ws_bytes);
}

/* ---- attention against a key/value cache (generation, forward only) ----
 * One warp per query row (b, t, h) at position pos0 + t and split of its keys (or per R rows
 * of one key/value head's group: below, k_att_cache's R). A decode step
 * has a few dozen rows (Hq at T = 1), a few warps for the whole GPU, each walking every key in
 * turn: so where rows are few, each row's keys are cut into splits of AC_SPLIT, one warp
 * each, which write their unnormalised sums with their running max and sum into part
 * [row][split][D + 2], and k_att_cache_join adds each row's splits in their order (flash
 * decoding; the splits follow the shape alone: the same bits every run).
 * A warp takes its keys 32 at a time. Lane i holds elements [i DPL, (i + 1) DPL) of q and of
 * every key and value row (one load a row where the rows allow it: DPL 2 or 4 elements, 8 or
 * 16 bytes of fp32, 4 or 8 of bf16), so the 32 rows of a step are 32 independent loads, all
 * in flight at once, each a contiguous read of the warp's. Each lane's 32 partial dot products
 * are then summed across the warp by a transposing tree (at width w, a lane keeps one half of
 * its w pairs and sends the other: 31 shuffles a step, not 5 a key), which leaves key s0 + i's
 * score in lane i; its exponential is lane i's, and P V adds the 32 value rows, each weighted
 * by its lane's p. A cache in bf16 (kv16, KT = uint16_t) is read as bf16 and widened. */
#define AC_SPLIT 256   /* keys a split */
#define AC_WARPS 2048  /* splits stop where rows x splits reach this many warps */
#define AC_THREADS 128 /* threads a block (__launch_bounds__(AC_THREADS, 1): up to 255 registers
                        * a thread, which the unrolled steps take; fewer spilled, ptxas -v) */

/* Lane's DPL elements of row from element lane DPL, widened (zeros past D, or all zeros
 * where !in). VEC: one load (DPL 2 or 4, D a multiple of DPL, rows DPL elements aligned). */
template <int DPL, bool VEC>
__device__ __forceinline__ void ac_load(float (&x)[DPL], const float *row, int lane, int64_t D,
                                        bool in) {
    const int d0 = lane * DPL;
    if constexpr (VEC && DPL == 4) {
        const float4 t = in && d0 < D ? *(const float4 *)(row + d0) : make_float4(0, 0, 0, 0);
        x[0] = t.x, x[1] = t.y, x[2] = t.z, x[3] = t.w;
    } else if constexpr (VEC && DPL == 2) {
        const float2 t = in && d0 < D ? *(const float2 *)(row + d0) : make_float2(0, 0);
        x[0] = t.x, x[1] = t.y;
    } else {
#pragma unroll
        for (int i = 0; i < DPL; i++) x[i] = in && d0 + i < D ? row[d0 + i] : 0.0f;
    }
}
template <int DPL, bool VEC>
__device__ __forceinline__ void ac_load(float (&x)[DPL], const uint16_t *row, int lane,
                                        int64_t D, bool in) {
    const int d0 = lane * DPL;
    if constexpr (VEC && DPL == 4) {
        const uint2 t = in && d0 < D ? *(const uint2 *)(row + d0) : make_uint2(0, 0);
        x[0] = tz_bf16_lo(t.x), x[1] = tz_bf16_hi(t.x), x[2] = tz_bf16_lo(t.y);
        x[3] = tz_bf16_hi(t.y);
    } else if constexpr (VEC && DPL == 2) {
        const uint32_t t = in && d0 < D ? *(const uint32_t *)(row + d0) : 0u;
        x[0] = tz_bf16_lo(t), x[1] = tz_bf16_hi(t);
    } else {
#pragma unroll
        for (int i = 0; i < DPL; i++) x[i] = in && d0 + i < D ? tz_get(row + d0 + i) : 0.0f;
    }
}

/* One width W of the transposing tree over sc[0 .. 2W): a lane with bit W keeps the upper
 * half, adding its partner's (lane ^ W) upper half, the other the lower: the halves are chosen
 * by a bit mask of the values, not by indexing (a select between two elements would put sc in
 * local memory); W a template parameter so that every loop unrolls into registers. */
template <int W>
__device__ __forceinline__ void ac_tree(float (&sc)[32], int lane) {
    const uint32_t up = lane & W ? 0xffffffffu : 0u;
#pragma unroll
    for (int i = 0; i < W; i++) {
        const uint32_t lo = __float_as_uint(sc[i]), hi = __float_as_uint(sc[i + W]);
        const float send = __uint_as_float((lo & up) | (hi & ~up));
        const float keep = __uint_as_float((hi & up) | (lo & ~up));
        sc[i] = keep + __shfl_xor_sync(0xffffffffu, send, W);
    }
}

/* The maximum and the sum over the lanes of a group of G (lanes G r .. G r + G - 1). */
template <int G>
__device__ __forceinline__ float ac_group_max(float v) {
#pragma unroll
    for (int o = G / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
template <int G>
__device__ __forceinline__ float ac_group_sum(float v) {
#pragma unroll
    for (int o = G / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* R query heads of one key/value head (grouped-query attention: R divides its group, 1 to 8)
 * in one warp, so that each key and value row read serves R queries: a step takes KPS keys
 * (32 / R rounded down to a power of two: 32, 16, 8 or 4), and the tree's values are (query
 * r, key j) at r KPS + j, so that lane i ends with query i / KPS's score of key i % KPS (the
 * lanes from R KPS on, where R is not a power of two, hold no query's: zeros, never live);
 * the softmax's max and sum are over each query's KPS lanes, and P V adds each value row to
 * the R queries' sums (each lane holds its D elements of all R). R = 1 is one query a warp,
 * 32 keys a step. */
template <int DPL, class KT, bool VEC, int R>
__global__ void __launch_bounds__(AC_THREADS, 1)
    k_att_cache(float *out, float *part, int64_t ns, const float *q, const KT *kc, const KT *vc,
                int64_t B, int64_t T, int64_t S, int64_t pos0, int64_t Hq, int64_t Hkv, int64_t D,
                float scale) {
    constexpr int KPS = R == 1 ? 32 : R == 2 ? 16 : R <= 4 ? 8 : 4;
    static_assert(R >= 1 && R <= 8, "k_att_cache: 1 to 8 queries a warp");
    const int lane = threadIdx.x & 31;
    const int64_t rep = Hq / Hkv, sets = rep / R; /* warps a (b, t, kv head) and split */
    const int64_t wid = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    if (wid >= B * T * Hkv * sets * ns) return; /* the whole warp leaves together */
    const int64_t item = wid / ns, sp = wid - item * ns;
    const int64_t set = item % sets, g = item / sets % Hkv, bt = item / sets / Hkv, t = bt % T;
    const int64_t b = bt / T, row0 = bt * Hq + g * rep + set * R; /* query r: row0 + r */
    float qv[R][DPL];
#pragma unroll
    for (int r = 0; r < R; r++) ac_load<DPL, false>(qv[r], q + (row0 + r) * D, lane, D, true);
    const int64_t nkeys = pos0 + t + 1; /* keys 0 .. pos0 + t */
    /* this warp's keys: [k0, k1) (all of them without splits; empty past the row's keys) */
    const int64_t k0 = ns > 1 ? sp * AC_SPLIT : 0;
    const int64_t k1 = ns > 1 ? (k0 + AC_SPLIT < nkeys ? k0 + AC_SPLIT : nkeys) : nkeys;
    const int64_t ks = Hkv * D; /* elements from one position's row to the next */
    const KT *kb = kc + (b * S * Hkv + g) * D, *vb = vc + (b * S * Hkv + g) * D;
    /* m, ls: those of this lane's query (lane / KPS), ls this lane's part of the sum */
    float m = -INFINITY, ls = 0.0f, acc[R][DPL];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int i = 0; i < DPL; i++) acc[r][i] = 0.0f;
    for (int64_t s0 = k0; s0 < k1; s0 += KPS) {
        const int n = k1 - s0 < KPS ? (int)(k1 - s0) : KPS; /* keys of this step */
        float sc[32];
#pragma unroll
        for (int v = R * KPS; v < 32; v++) sc[v] = 0.0f; /* no query's */
#pragma unroll
        for (int j = 0; j < KPS; j++) {
            float x[DPL];
            ac_load<DPL, VEC>(x, kb + (s0 + j) * ks, lane, D, j < n);
#pragma unroll
            for (int r = 0; r < R; r++) {
                float a = 0.0f;
#pragma unroll
                for (int i = 0; i < DPL; i++) a = fmaf(qv[r][i], x[i], a);
                sc[r * KPS + j] = a;
            }
        }
        /* the transposing tree: after width w, lane i's sc[0 .. w) hold values (i & ~(w - 1))
         * + 0 .. w - 1 summed over the lanes that differ from i in bits >= w alone; after
         * width 1, sc[0] is value i's dot product over all 32 lanes: query i / KPS, key
         * s0 + i % KPS */
        ac_tree<16>(sc, lane), ac_tree<8>(sc, lane), ac_tree<4>(sc, lane);
        ac_tree<2>(sc, lane), ac_tree<1>(sc, lane);
        const bool live = lane < R * KPS && lane % KPS < n;
        const float s = live ? sc[0] * scale : -INFINITY;
        const float mn = fmaxf(m, ac_group_max<KPS>(s)); /* finite where a query is: its first key */
        const float p = live ? expf(s - mn) : 0.0f;
        /* m = -inf < mn: 0; m = mn: 1 (also in the lanes of no query, where both are -inf) */
        const float corr = m == mn ? 1.0f : expf(m - mn);
        ls = ls * corr + p;
#pragma unroll
        for (int r = 0; r < R; r++) {
            const float cr = R == 1 ? corr : __shfl_sync(0xffffffffu, corr, r * KPS);
#pragma unroll
            for (int i = 0; i < DPL; i++) acc[r][i] *= cr;
        }
#pragma unroll
        for (int j = 0; j < KPS; j++) {
            float x[DPL];
            ac_load<DPL, VEC>(x, vb + (s0 + j) * ks, lane, D, j < n);
#pragma unroll
            for (int r = 0; r < R; r++) {
                const float pj = __shfl_sync(0xffffffffu, p, r * KPS + j);
#pragma unroll
                for (int i = 0; i < DPL; i++) acc[r][i] = fmaf(pj, x[i], acc[r][i]);
            }
        }
        m = mn;
    }
    const float l = ac_group_sum<KPS>(ls);
    const int d0 = lane * DPL;
#pragma unroll
    for (int r = 0; r < R; r++) {
        const float lr = __shfl_sync(0xffffffffu, l, r * KPS);
        const float mr = __shfl_sync(0xffffffffu, m, r * KPS);
        const int64_t row = row0 + r;
        if (ns > 1) { /* the split's sums, its max and its sum of exponentials */
            float *pr = part + (row * ns + sp) * (D + 2);
#pragma unroll
            for (int i = 0; i < DPL; i++)
                if (d0 + i < D) pr[d0 + i] = acc[r][i];
            if (lane == 0) pr[D] = mr, pr[D + 1] = lr;
        } else {
            float *o = out + row * D, inv = 1.0f / lr;
#pragma unroll
            for (int i = 0; i < DPL; i++)
                if (d0 + i < D) o[d0 + i] = acc[r][i] * inv;
        }
    }
}

/* One warp a row: its ns splits (max m_i, sum l_i, sums acc_i; an empty split has m_i = -inf)
 * joined in order: m = max m_i, out = (sum acc_i e^(m_i - m)) / (sum l_i e^(m_i - m)). */
static __global__ void k_att_cache_join(float *out, const float *part, int64_t rows, int64_t ns,
                                        int64_t D) {
    const int lane = threadIdx.x & 31;
    const int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    if (row >= rows) return;
    const float *pr = part + row * ns * (D + 2);
    float m = -INFINITY;
    for (int64_t i = 0; i < ns; i++) m = fmaxf(m, pr[i * (D + 2) + D]);
    float l = 0.0f;
    for (int64_t i = 0; i < ns; i++) {
        const float mi = pr[i * (D + 2) + D];
        if (mi != -INFINITY) l += pr[i * (D + 2) + D + 1] * expf(mi - m);
    }
    const float inv = 1.0f / l;
    for (int64_t d = lane; d < D; d += 32) {
        float a = 0.0f;
        for (int64_t i = 0; i < ns; i++) {
            const float mi = pr[i * (D + 2) + D];
            if (mi != -INFINITY) a += pr[i * (D + 2) + d] * expf(mi - m);
        }
        out[row * D + d] = a * inv;
    }
}

/* The splits of each row's keys: one where the rows alone make AC_WARPS warps or there are at
 * most AC_SPLIT keys; else as many as the longest row's keys need, up to AC_WARPS warps. */
static int64_t att_cache_splits(int64_t rows, int64_t keys) {
    const int64_t need = (keys + AC_SPLIT - 1) / AC_SPLIT, room = AC_WARPS / rows;
    return need < 2 || room < 2 ? 1 : need < room ? need : room;
}

static void cuda_attention_cache_fwd(tz_backend *be, float *out, const float *q,
                                     const void *kc, const void *vc, int64_t B, int64_t T,
                                     int64_t S, int64_t pos0, int64_t Hq, int64_t Hkv,
                                     int64_t D, int kv16) {
    if (B <= 0 || T <= 0 || D <= 0 || Hq <= 0) return;
    if (Hkv <= 0 || Hq % Hkv != 0)
        TZ_FATAL("attention: Hq=%lld is not a multiple of Hkv=%lld", (long long)Hq,
                 (long long)Hkv);
    if (D > MAXD)
        TZ_FATAL("attention: head dimension %lld exceeds the CUDA kernel's %d", (long long)D,
                 MAXD);
    if (pos0 < 0 || pos0 + T > S)
        TZ_FATAL("attention_cache: positions %lld..%lld exceed the cache's %lld",
                 (long long)pos0, (long long)(pos0 + T - 1), (long long)S);
    const int dpl = (int)((D + 31) / 32);
    const uintptr_t align = (uintptr_t)dpl * (kv16 ? 2 : 4);
    /* one load a lane's row where it is DPL whole, aligned elements */
    const int vec = (dpl == 2 || dpl == 4) && D % dpl == 0 && (uintptr_t)kc % align == 0 &&
                    (uintptr_t)vc % align == 0;
    const int64_t rep = Hq / Hkv;
    /* R, the query heads a warp takes of a group: its largest divisor up to 8, on the paths of
     * one load a row */
    int R = 1;
    for (int r = 8; vec && r > 1 && R == 1; r--)
        if (rep % r == 0) R = r;
    const int64_t rows = B * T * Hq, ns = att_cache_splits(rows / R, pos0 + T);
    const int64_t warps = rows / R * ns;
    const unsigned blocks = (unsigned)((warps * 32 + AC_THREADS - 1) / AC_THREADS);
    const float scale = 1.0f / sqrtf((float)D);
    cudaStream_t st = tz_cuda_stream(be);
    float *part = ns > 1 ? (float *)tz_cuda_scratch(be, (size_t)(rows * ns * (D + 2)) * sizeof(float))
                         : NULL;
#define AC_GO(DPL, KT, VEC, R)                                                                  \
    k_att_cache<DPL, KT, VEC, R><<<blocks, AC_THREADS, 0, st>>>(out, part, ns, q,             \
                                                                (const KT *)kc, (const KT *)vc, \
                                                                B, T, S, pos0, Hq, Hkv, D, scale)
#define AC_VEC(DPL, KT)                                                                         \
    do {                                                                                        \
        switch (R) {                                                                            \
        case 8: AC_GO(DPL, KT, true, 8); break;                                                 \
        case 7: AC_GO(DPL, KT, true, 7); break;                                                 \
        case 6: AC_GO(DPL, KT, true, 6); break;                                                 \
        case 5: AC_GO(DPL, KT, true, 5); break;                                                 \
        case 4: AC_GO(DPL, KT, true, 4); break;                                                 \
        case 3: AC_GO(DPL, KT, true, 3); break;                                                 \
        case 2: AC_GO(DPL, KT, true, 2); break;                                                 \
        default: AC_GO(DPL, KT, true, 1);                                                       \
        }                                                                                       \
    } while (0)
#define AC_TYPE(KT)                                                                             \
    do {                                                                                        \
        if (dpl == 1) AC_GO(1, KT, false, 1);                                                   \
        else if (dpl == 2 && vec) AC_VEC(2, KT);                                                \
        else if (dpl == 2) AC_GO(2, KT, false, 1);                                              \
        else if (dpl == 3) AC_GO(3, KT, false, 1);                                              \
        else if (vec) AC_VEC(4, KT);                                                            \
        else AC_GO(4, KT, false, 1);                                                            \
    } while (0)
    if (kv16) AC_TYPE(uint16_t);
    else AC_TYPE(float);
#undef AC_TYPE
#undef AC_VEC
#undef AC_GO
    CUDA_LAUNCHED();
    tz_cuda_part(be, "attention_cache_fwd: k_att_cache");
    if (ns > 1) {
        k_att_cache_join<<<(unsigned)((rows * 32 + 255) / 256), 256, 0, st>>>(out, part, rows,
                                                                             ns, D);
        CUDA_LAUNCHED();
        tz_cuda_part(be, "attention_cache_fwd: k_att_cache_join");
    }
}

void tz_cuda_install_attention(tz_backend *be) {
    be->attention_fwd = cuda_attention_fwd;
    be->attention_bwd = cuda_attention_bwd;
    be->attention_cache_fwd = cuda_attention_cache_fwd;
}
