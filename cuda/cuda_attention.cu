/* CUDA scaled dot-product attention with grouped-query heads (causal or not), flash style:
 * the forward streams keys through shared memory with an online softmax and saves the
 * log-sum-exp; the backward recomputes the probabilities from q, k and lse. Memory is O(T)
 * (lse and the backward's delta = rowsum(dO * O)), never B*H*T*T. fp32 throughout, head
 * dimension D <= 128 (four values per lane).
 *
 * Work split (no atomics; every output row has one writer):
 *   forward and dq: a block of ROWS warps, one query row each, of one (b, query head);
 *   dk, dv:         a block of ROWS warps, one key row each, of one (b, kv head), adding the
 *                   group's query heads in order.
 * Within a warp, lane j takes key (or query) j of the TILE-long tile in shared memory for the
 * scores, and lane l owns head dimensions l, l + 32, ... of the accumulators. */
#include <math.h>

#include "cuda/cuda_internal.cuh"

#define ROWS 8  /* warps per block */
#define TILE 32 /* keys (queries) per shared-memory tile: one per lane */
#define MAXD 128

typedef struct {
    int64_t B, T, Hq, Hkv, D, rep;
    int causal;
    float scale;
} att_shape;

/* Row (b, t, head) of a [B, T, H, D] tensor. */
__device__ __forceinline__ int64_t row_of(int64_t b, int64_t t, int64_t h, int64_t T,
                                          int64_t H) {
    return (b * T + t) * H + h;
}

/* Loads rows [t0, t0 + TILE) of head h of x [B, T, H, D] into dst[TILE][D + 1] (rows past T
 * are zeros), by the whole block. */
__device__ void load_tile(float *dst, const float *x, int64_t b, int64_t t0, int64_t h,
                          int64_t T, int64_t H, int64_t D) {
    for (int64_t e = threadIdx.x; e < TILE * D; e += blockDim.x) {
        int64_t j = e / D, d = e % D, t = t0 + j;
        dst[j * (D + 1) + d] = t < T ? x[row_of(b, t, h, T, H) * D + d] : 0.0f;
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
        for (int64_t d = lane; d < D; d += 32) qs[d] = q[row_of(b, t, h, T, sh.Hq) * D + d];

    float m = -INFINITY, l = 0.0f, acc[DPL];
#pragma unroll
    for (int i = 0; i < DPL; i++) acc[i] = 0.0f;
    const int64_t nkeys = sh.causal ? (t_last_blk + 1 < T ? t_last_blk + 1 : T) : T;
    for (int64_t s0 = 0; s0 < nkeys; s0 += TILE) {
        __syncthreads(); /* the previous tile is no longer read (and qs is written) */
        load_tile(Ks, k, b, s0, g, T, sh.Hkv, D);
        load_tile(Vs, v, b, s0, g, T, sh.Hkv, D);
        __syncthreads();
        if (!active) continue;
        const int64_t s = s0 + lane;
        const bool valid = s < T && (!sh.causal || s <= t);
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
    float *o = out + row_of(b, t, h, T, sh.Hq) * D;
    float inv = 1.0f / l;
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        int64_t d = lane + 32 * i;
        if (d < D) o[d] = acc[i] * inv;
    }
    if (lane == 0) lse[(b * sh.Hq + h) * T + t] = m + logf(l);
}

/* ---- backward ---- */

/* delta[b, h, t] = dO . O over D, a warp per row. */
static __global__ void k_att_delta(float *delta, const float *dout, const float *out,
                                   att_shape sh) {
    const int lane = threadIdx.x & 31;
    const int64_t rows = sh.B * sh.Hq * sh.T;
    for (int64_t idx = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; idx < rows;
         idx += ((int64_t)gridDim.x * blockDim.x) / 32) {
        int64_t b = idx / (sh.Hq * sh.T), h = (idx / sh.T) % sh.Hq, t = idx % sh.T;
        const float *o = out + row_of(b, t, h, sh.T, sh.Hq) * sh.D;
        const float *d = dout + row_of(b, t, h, sh.T, sh.Hq) * sh.D;
        float s = 0.0f;
        for (int64_t i = lane; i < sh.D; i += 32) s += o[i] * d[i];
        s = tz_warp_sum_f(s);
        if (lane == 0) delta[idx] = s;
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
        int64_t r = row_of(b, t, h, T, sh.Hq) * D;
        for (int64_t d = lane; d < D; d += 32) {
            qs[d] = q[r + d];
            gs[d] = dout[r + d];
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
        load_tile(Ks, k, b, s0, g, T, sh.Hkv, D);
        load_tile(Vs, v, b, s0, g, T, sh.Hkv, D);
        __syncthreads();
        if (!active) continue;
        const int64_t s = s0 + lane;
        const bool valid = s < T && (!sh.causal || s <= t);
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
    float *o = dq + row_of(b, t, h, T, sh.Hq) * D;
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        int64_t d = lane + 32 * i;
        if (d < D) o[d] += sh.scale * acc[i];
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
        int64_t r = row_of(b, s, g, T, sh.Hkv) * D;
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
            load_tile(Qt, q, b, t0, h, T, sh.Hq, D);
            load_tile(Gt, dout, b, t0, h, T, sh.Hq, D);
            if (threadIdx.x < TILE) {
                int64_t t = t0 + threadIdx.x;
                Lt[threadIdx.x] = t < T ? lr[t] : 0.0f;
                Dt[threadIdx.x] = t < T ? dr[t] : 0.0f;
            }
            __syncthreads();
            if (!active) continue;
            const int64_t t = t0 + lane;
            const bool valid = t < T && (!sh.causal || t >= s);
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
    int64_t r0 = row_of(b, s, g, T, sh.Hkv) * D;
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        int64_t d = lane + 32 * i;
        if (d < D) {
            dv[r0 + d] += av[i];
            dk[r0 + d] += sh.scale * ak[i];
        }
    }
}

/* ---- launches ---- */

static att_shape make_shape(int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D,
                            int causal) {
    if (Hkv <= 0 || Hq % Hkv != 0)
        TZ_FATAL("attention: Hq=%lld is not a multiple of Hkv=%lld", (long long)Hq,
                 (long long)Hkv);
    if (D > MAXD)
        TZ_FATAL("attention: head dimension %lld is above the CUDA kernel's %d", (long long)D,
                 MAXD);
    if (Hq > 65535 || B > 65535 || (T + ROWS - 1) / ROWS > 2147483647LL)
        TZ_FATAL("attention: B=%lld, T=%lld, Hq=%lld exceed the kernel's grid", (long long)B,
                 (long long)T, (long long)Hq);
    att_shape s = {B, T, Hq, Hkv, D, Hq / Hkv, causal, 1.0f / sqrtf((float)D)};
    return s;
}

/* Shared bytes: two padded tiles, two sets of ROWS rows, two TILE vectors (the largest of the
 * three kernels; at D = 128: 41.5 KB, under the 48 KB every GPU gives without opt-in). */
static size_t smem_bytes(int64_t D) {
    return (size_t)(2 * TILE * (D + 1) + 2 * ROWS * D + 2 * TILE) * sizeof(float);
}

static void cuda_attention_fwd(tz_backend *be, float *out, float *lse, const float *q,
                               const float *k, const float *v, int64_t B, int64_t T, int64_t Hq,
                               int64_t Hkv, int64_t D, int causal) {
    att_shape sh = make_shape(B, T, Hq, Hkv, D, causal);
    if (B <= 0 || T <= 0 || D <= 0 || Hq <= 0) return;
    dim3 grid((unsigned)((T + ROWS - 1) / ROWS), (unsigned)Hq, (unsigned)B);
    size_t sm = smem_bytes(D);
    cudaStream_t st = tz_cuda_stream(be);
    int dpl = (int)((D + 31) / 32);
    if (dpl == 1) k_att_fwd<1><<<grid, ROWS * 32, sm, st>>>(out, lse, q, k, v, sh);
    else if (dpl == 2) k_att_fwd<2><<<grid, ROWS * 32, sm, st>>>(out, lse, q, k, v, sh);
    else if (dpl == 3) k_att_fwd<3><<<grid, ROWS * 32, sm, st>>>(out, lse, q, k, v, sh);
    else k_att_fwd<4><<<grid, ROWS * 32, sm, st>>>(out, lse, q, k, v, sh);
    CUDA_LAUNCHED();
}

static void cuda_attention_bwd(tz_backend *be, float *dq, float *dk, float *dv,
                               const float *dout, const float *out, const float *lse,
                               const float *q, const float *k, const float *v, int64_t B,
                               int64_t T, int64_t Hq, int64_t Hkv, int64_t D, int causal) {
    att_shape sh = make_shape(B, T, Hq, Hkv, D, causal);
    if (B <= 0 || T <= 0 || D <= 0 || Hq <= 0) return;
    cudaStream_t st = tz_cuda_stream(be);
    int64_t rows = B * Hq * T;
    float *delta = (float *)tz_cuda_scratch(be, (size_t)rows * sizeof(float));
    k_att_delta<<<tz_cuda_blocks(rows * 32, 256), 256, 0, st>>>(delta, dout, out, sh);
    CUDA_LAUNCHED();
    size_t sm = smem_bytes(D);
    int dpl = (int)((D + 31) / 32);
    dim3 gq((unsigned)((T + ROWS - 1) / ROWS), (unsigned)Hq, (unsigned)B);
    if (dpl == 1) k_att_dq<1><<<gq, ROWS * 32, sm, st>>>(dq, dout, lse, delta, q, k, v, sh);
    else if (dpl == 2) k_att_dq<2><<<gq, ROWS * 32, sm, st>>>(dq, dout, lse, delta, q, k, v, sh);
    else if (dpl == 3) k_att_dq<3><<<gq, ROWS * 32, sm, st>>>(dq, dout, lse, delta, q, k, v, sh);
    else k_att_dq<4><<<gq, ROWS * 32, sm, st>>>(dq, dout, lse, delta, q, k, v, sh);
    CUDA_LAUNCHED();
    dim3 gk((unsigned)((T + ROWS - 1) / ROWS), (unsigned)Hkv, (unsigned)B);
    if (dpl == 1)
        k_att_dkv<1><<<gk, ROWS * 32, sm, st>>>(dk, dv, dout, lse, delta, q, k, v, sh);
    else if (dpl == 2)
        k_att_dkv<2><<<gk, ROWS * 32, sm, st>>>(dk, dv, dout, lse, delta, q, k, v, sh);
    else if (dpl == 3)
        k_att_dkv<3><<<gk, ROWS * 32, sm, st>>>(dk, dv, dout, lse, delta, q, k, v, sh);
    else k_att_dkv<4><<<gk, ROWS * 32, sm, st>>>(dk, dv, dout, lse, delta, q, k, v, sh);
    CUDA_LAUNCHED();
}

/* ---- attention against a key/value cache (generation, forward only) ----
 * One warp per query row (b, t, h) at position pos0 + t; lane j scores key s0 + j of each
 * 32-key step straight from the cache (decode is bound by reading the cache, which every
 * query row of a (b, kv head) group reads once more; T is 1 or a prefill chunk). */
template <int DPL>
__global__ void k_att_cache(float *out, const float *q, const float *kc, const float *vc,
                            int64_t B, int64_t T, int64_t S, int64_t pos0, int64_t Hq,
                            int64_t Hkv, int64_t D, float scale) {
    const int lane = threadIdx.x & 31;
    const int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    if (row >= B * T * Hq) return; /* the whole warp leaves together */
    const int64_t h = row % Hq, bt = row / Hq, t = bt % T, b = bt / T, g = h / (Hq / Hkv);
    const float *qr = q + row * D;
    float qv[DPL];
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        int64_t d = lane + 32 * i;
        qv[i] = d < D ? qr[d] : 0.0f;
    }
    const int64_t nkeys = pos0 + t + 1; /* keys 0 .. pos0 + t */
    float m = -INFINITY, l = 0.0f, acc[DPL];
#pragma unroll
    for (int i = 0; i < DPL; i++) acc[i] = 0.0f;
    for (int64_t s0 = 0; s0 < nkeys; s0 += 32) {
        /* scores of the step: lane j ends with key s0 + j's score */
        float mine = -INFINITY;
        for (int j = 0; j < 32 && s0 + j < nkeys; j++) {
            const float *kr = kc + ((b * S + s0 + j) * Hkv + g) * D;
            float part = 0.0f;
#pragma unroll
            for (int i = 0; i < DPL; i++) {
                int64_t d = lane + 32 * i;
                if (d < D) part += qv[i] * kr[d];
            }
            float sc = scale * tz_warp_sum_f(part);
            if (lane == j) mine = sc;
        }
        float mn = fmaxf(m, tz_warp_max_f(mine));
        float p = s0 + lane < nkeys ? expf(mine - mn) : 0.0f;
        float corr = expf(m - mn); /* m = -inf: 0 */
        l = l * corr + tz_warp_sum_f(p);
#pragma unroll
        for (int i = 0; i < DPL; i++) acc[i] *= corr;
        for (int j = 0; j < 32 && s0 + j < nkeys; j++) {
            float pj = __shfl_sync(0xffffffffu, p, j);
            const float *vr = vc + ((b * S + s0 + j) * Hkv + g) * D;
#pragma unroll
            for (int i = 0; i < DPL; i++) {
                int64_t d = lane + 32 * i;
                if (d < D) acc[i] += pj * vr[d];
            }
        }
        m = mn;
    }
    float *o = out + row * D, inv = 1.0f / l;
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        int64_t d = lane + 32 * i;
        if (d < D) o[d] = acc[i] * inv;
    }
}

static void cuda_attention_cache_fwd(tz_backend *be, float *out, const float *q,
                                     const float *kc, const float *vc, int64_t B, int64_t T,
                                     int64_t S, int64_t pos0, int64_t Hq, int64_t Hkv,
                                     int64_t D) {
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
    const int64_t warps = B * T * Hq;
    const unsigned blocks = (unsigned)((warps * 32 + 255) / 256);
    const float scale = 1.0f / sqrtf((float)D);
    cudaStream_t st = tz_cuda_stream(be);
    int dpl = (int)((D + 31) / 32);
    if (dpl == 1) k_att_cache<1><<<blocks, 256, 0, st>>>(out, q, kc, vc, B, T, S, pos0, Hq, Hkv, D, scale);
    else if (dpl == 2) k_att_cache<2><<<blocks, 256, 0, st>>>(out, q, kc, vc, B, T, S, pos0, Hq, Hkv, D, scale);
    else if (dpl == 3) k_att_cache<3><<<blocks, 256, 0, st>>>(out, q, kc, vc, B, T, S, pos0, Hq, Hkv, D, scale);
    else k_att_cache<4><<<blocks, 256, 0, st>>>(out, q, kc, vc, B, T, S, pos0, Hq, Hkv, D, scale);
    CUDA_LAUNCHED();
}

void tz_cuda_install_attention(tz_backend *be) {
    be->attention_fwd = cuda_attention_fwd;
    be->attention_bwd = cuda_attention_bwd;
    be->attention_cache_fwd = cuda_attention_cache_fwd;
}
