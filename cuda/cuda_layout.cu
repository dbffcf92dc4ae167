/* CUDA gathers, permutations and positions: token embedding, rotate-half RoPE, patchify and
 * unpatchify, strided 2-D copies (cpu/cpu_layout.c's twins). Each output element has one
 * writer. */
#include <math.h>
#include <stdlib.h>

#include "cuda/cuda_internal.cuh"

/* ---- embedding ---- */

/* A table element as fp32: a float, or bf16 bits (exact). */
static __device__ __forceinline__ float table_at(const float *t, int64_t i) { return t[i]; }
static __device__ __forceinline__ float table_at(const uint16_t *t, int64_t i) {
    return __uint_as_float((unsigned)t[i] << 16);
}

template <class T>
static __global__ void k_embedding_fwd(float *out, const int32_t *tok, const T *table,
                                       int64_t C, int64_t total) {
    TZ_CUDA_FOR(i, total) {
        int64_t t = i / C, c = i % C;
        out[i] = table_at(table, (int64_t)tok[t] * C + c);
    }
}

/* One thread per column walks the tokens in order: repeated ids add up in the CPU's order,
 * without atomics (so the same bits as the CPU op). Parallel over C only. */
static __global__ void k_embedding_bwd(float *dtable, const int32_t *tok, const float *dout,
                                       int64_t n, int64_t C) {
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    for (int64_t t = 0; t < n; t++) dtable[(int64_t)tok[t] * C + c] += dout[t * C + c];
}

template <class T>
static void embedding_fwd(tz_backend *be, float *out, const int32_t *tok, const T *table,
                          int64_t n, int64_t C) {
    int64_t total = n * C;
    if (total <= 0) return;
#ifdef TZ_CUDA_EMULATION /* the rows it reads (the emulated device's memory is the host's) */
    for (int64_t t = 0; t < n; t++)
        TZ_CUDA_KERNEL_READS(be, table + (int64_t)tok[t] * C, (size_t)C * sizeof *table,
                             "embedding row");
#endif
    k_embedding_fwd<T><<<tz_cuda_blocks(total, TZ_CUDA_THREADS), TZ_CUDA_THREADS, 0,
                         tz_cuda_stream(be)>>>(out, tok, table, C, total);
    CUDA_LAUNCHED();
}

static void cuda_embedding_fwd(tz_backend *be, float *out, const int32_t *tok,
                               const float *table, int64_t n, int64_t C) {
    embedding_fwd(be, out, tok, table, n, C);
}

static void cuda_embedding_fwd_w16(tz_backend *be, float *out, const int32_t *tok,
                                   const uint16_t *table, int64_t n, int64_t C) {
    embedding_fwd(be, out, tok, table, n, C);
}

static void cuda_embedding_bwd(tz_backend *be, float *dtable, const int32_t *tok,
                               const float *dout, int64_t n, int64_t C) {
    if (n <= 0 || C <= 0) return;
    k_embedding_bwd<<<(unsigned)((C + 127) / 128), 128, 0, tz_cuda_stream(be)>>>(dtable, tok,
                                                                                 dout, n, C);
    CUDA_LAUNCHED();
}

/* ---- RoPE (HF rotate-half) ---- */

/* The cos/sin table of (T, D, theta), computed on the host exactly as the CPU op does (same
 * float powf, cosf, sinf), uploaded once and kept until the shape changes. */
static void rope_table(tz_backend *be, int64_t T, int64_t D, float theta, const float **cs,
                       const float **sn) {
    tz_cuda_ctx *c = tz_cuda_ctx_of(be);
    tz_cuda_rope_cache *rc = &c->rope;
    if (!(rc->cs && rc->T == T && rc->D == D && rc->theta == theta)) {
        int64_t half = D / 2;
        size_t bytes = (size_t)(T * half) * sizeof(float);
        float *hc = (float *)tz_xmalloc(bytes), *hs = (float *)tz_xmalloc(bytes);
        float *inv = (float *)tz_xmalloc((size_t)half * sizeof(float));
        for (int64_t i = 0; i < half; i++)
            inv[i] = 1.0f / powf(theta, (float)(2 * i) / (float)D);
        for (int64_t t = 0; t < T; t++)
            for (int64_t i = 0; i < half; i++) {
                float ang = (float)t * inv[i];
                hc[t * half + i] = cosf(ang);
                hs[t * half + i] = sinf(ang);
            }
        CUDA_CHECK(cudaFree(rc->cs)); /* waits for kernels still reading the old table */
        CUDA_CHECK(cudaFree(rc->sn));
        rc->cs = rc->sn = NULL;
        CUDA_CHECK(cudaMalloc((void **)&rc->cs, bytes ? bytes : 1));
        CUDA_CHECK(cudaMalloc((void **)&rc->sn, bytes ? bytes : 1));
        CUDA_CHECK(cudaMemcpyAsync(rc->cs, hc, bytes, cudaMemcpyHostToDevice, c->stream));
        CUDA_CHECK(cudaMemcpyAsync(rc->sn, hs, bytes, cudaMemcpyHostToDevice, c->stream));
        CUDA_CHECK(cudaStreamSynchronize(c->stream)); /* before the host buffers go */
        free(hc);
        free(hs);
        free(inv);
        rc->T = T;
        rc->D = D;
        rc->theta = theta;
    }
    *cs = rc->cs;
    *sn = rc->sn;
}

/* One thread per rotated pair (row bt, head h, i < D/2). dir = +1 forward, -1 transpose. x
 * rotated into y: in place (y = x, fp32), or into bf16 bit patterns (rope_fwd16, rope_bwd16:
 * the same fp32 values, rounded as to_bf16 rounds). */
template <class O>
static __global__ void k_rope(O *y, const float *x, const float *cs, const float *sn, int64_t T,
                              int64_t H, int64_t D, float dir, int64_t total) {
    int64_t half = D / 2;
    TZ_CUDA_FOR(p, total) {
        int64_t i = p % half, bh = p / half, bt = bh / H, t = bt % T;
        const float *x1 = x + bh * D, *x2 = x1 + half;
        O *y1 = y + bh * D, *y2 = y1 + half;
        float c = cs[t * half + i], s = dir * sn[t * half + i];
        float a = x1[i], b = x2[i];
        tz_put(y1 + i, __fmul_rn(a, c) - __fmul_rn(b, s));
        tz_put(y2 + i, __fmul_rn(b, c) + __fmul_rn(a, s));
    }
}

template <class O>
static void rope_apply(tz_backend *be, O *y, const float *x, int64_t B, int64_t T, int64_t H,
                       int64_t D, float theta, float dir) {
    if (D % 2 != 0) TZ_FATAL("rope needs an even head dimension, got D=%lld", (long long)D);
    if (B <= 0 || T <= 0 || H <= 0 || D <= 0) return;
    const float *cs, *sn;
    rope_table(be, T, D, theta, &cs, &sn);
    int64_t total = B * T * H * (D / 2);
    k_rope<O><<<tz_cuda_blocks(total, TZ_CUDA_THREADS), TZ_CUDA_THREADS, 0, tz_cuda_stream(be)>>>(
        y, x, cs, sn, T, H, D, dir, total);
    CUDA_LAUNCHED();
}

static void cuda_rope_fwd(tz_backend *be, float *x, int64_t B, int64_t T, int64_t H, int64_t D,
                          float theta) {
    rope_apply(be, x, x, B, T, H, D, theta, 1.0f);
}

static void cuda_rope_bwd(tz_backend *be, float *dx, int64_t B, int64_t T, int64_t H, int64_t D,
                          float theta) {
    rope_apply(be, dx, dx, B, T, H, D, theta, -1.0f);
}

static void cuda_rope_fwd16(tz_backend *be, uint16_t *y, const float *x, int64_t B, int64_t T,
                            int64_t H, int64_t D, float theta) {
    rope_apply(be, y, x, B, T, H, D, theta, 1.0f);
}

static void cuda_rope_bwd16(tz_backend *be, uint16_t *dy, const float *dx, int64_t B, int64_t T,
                            int64_t H, int64_t D, float theta) {
    rope_apply(be, dy, dx, B, T, H, D, theta, -1.0f);
}

/* RoPE from a frequency table (D/2 floats of device memory) at positions pos0 + t: the angle
 * is (float)(pos0 + t) * inv_freq[i] as on the CPU, cos and sin by the device's cosf/sinf
 * (within 2 ulp of the host's). One thread per rotated pair. x rotated into y: in place (y =
 * x, fp32), or into bf16 bit patterns (rope_tab_fwd16, rope_tab_bwd16), as k_rope's. */
template <class O>
static __global__ void k_rope_tab(O *y, const float *x, const float *inv, int64_t T, int64_t H,
                                  int64_t D, int64_t pos0, float dir, int64_t total) {
    int64_t half = D / 2;
    TZ_CUDA_FOR(p, total) {
        int64_t i = p % half, bh = p / half, bt = bh / H, t = bt % T;
        const float *x1 = x + bh * D, *x2 = x1 + half;
        O *y1 = y + bh * D, *y2 = y1 + half;
        float ang = (float)(pos0 + t) * inv[i];
        float c = cosf(ang), s = dir * sinf(ang);
        float a = x1[i], b = x2[i];
        tz_put(y1 + i, __fmul_rn(a, c) - __fmul_rn(b, s));
        tz_put(y2 + i, __fmul_rn(b, c) + __fmul_rn(a, s));
    }
}

template <class O>
static void rope_tab_apply(tz_backend *be, O *y, const float *x, int64_t B, int64_t T, int64_t H,
                           int64_t D, const float *inv_freq, int64_t pos0, float dir) {
    if (D % 2 != 0) TZ_FATAL("rope needs an even head dimension, got D=%lld", (long long)D);
    if (B <= 0 || T <= 0 || H <= 0 || D <= 0) return;
    int64_t total = B * T * H * (D / 2);
    k_rope_tab<O><<<tz_cuda_blocks(total, TZ_CUDA_THREADS), TZ_CUDA_THREADS, 0,
                    tz_cuda_stream(be)>>>(y, x, inv_freq, T, H, D, pos0, dir, total);
    CUDA_LAUNCHED();
}

static void cuda_rope_tab_fwd(tz_backend *be, float *x, int64_t B, int64_t T, int64_t H,
                              int64_t D, const float *inv_freq, int64_t pos0) {
    rope_tab_apply(be, x, x, B, T, H, D, inv_freq, pos0, 1.0f);
}

static void cuda_rope_tab_bwd(tz_backend *be, float *dx, int64_t B, int64_t T, int64_t H,
                              int64_t D, const float *inv_freq, int64_t pos0) {
    rope_tab_apply(be, dx, dx, B, T, H, D, inv_freq, pos0, -1.0f);
}

static void cuda_rope_tab_fwd16(tz_backend *be, uint16_t *y, const float *x, int64_t B,
                                int64_t T, int64_t H, int64_t D, const float *inv_freq,
                                int64_t pos0) {
    rope_tab_apply(be, y, x, B, T, H, D, inv_freq, pos0, 1.0f);
}

static void cuda_rope_tab_bwd16(tz_backend *be, uint16_t *y, const float *x, int64_t B,
                                int64_t T, int64_t H, int64_t D, const float *inv_freq,
                                int64_t pos0) {
    rope_tab_apply(be, y, x, B, T, H, D, inv_freq, pos0, -1.0f);
}

/* RoPE of adjacent pairs from a (cos, sin) table per position; one thread per pair. The
 * products rounded apart (__fmul_rn), as the CPU rounds them. */
template <class O>
static __global__ void k_rope_pairs(O *y, const float *x, const float *cs, int64_t T, int64_t H,
                                    int64_t D, float dir, int64_t total) {
    const int64_t half = D / 2;
    TZ_CUDA_FOR(p, total) {
        const int64_t i = p % half, r = p / half, t = (r / H) % T;
        const float *v = x + r * D;
        O *w = y + r * D;
        const float c = cs[t * D + 2 * i], s = dir * cs[t * D + 2 * i + 1];
        const float a = v[2 * i], b = v[2 * i + 1];
        tz_put(w + 2 * i, __fmul_rn(a, c) - __fmul_rn(b, s));
        tz_put(w + 2 * i + 1, __fmul_rn(b, c) + __fmul_rn(a, s));
    }
}

/* y = x (in place, fp32) or y in bf16 bits (rope_pairs_fwd16) */
template <class O>
static void rope_pairs_apply(tz_backend *be, O *y, const float *x, int64_t B, int64_t T,
                             int64_t H, int64_t D, const float *cs, float dir) {
    if (D % 2 != 0) TZ_FATAL("rope needs an even head dimension, got D=%lld", (long long)D);
    if (B <= 0 || T <= 0 || H <= 0 || D <= 0) return;
    const int64_t total = B * T * H * (D / 2);
    k_rope_pairs<O><<<tz_cuda_blocks(total, TZ_CUDA_THREADS), TZ_CUDA_THREADS, 0,
                      tz_cuda_stream(be)>>>(y, x, cs, T, H, D, dir, total);
    CUDA_LAUNCHED();
}

static void cuda_rope_pairs_fwd(tz_backend *be, float *x, int64_t B, int64_t T, int64_t H,
                                int64_t D, const float *cs) {
    rope_pairs_apply(be, x, x, B, T, H, D, cs, 1.0f);
}

static void cuda_rope_pairs_bwd(tz_backend *be, float *dx, int64_t B, int64_t T, int64_t H,
                                int64_t D, const float *cs) {
    rope_pairs_apply(be, dx, dx, B, T, H, D, cs, -1.0f);
}

static void cuda_rope_pairs_fwd16(tz_backend *be, uint16_t *y, const float *x, int64_t B,
                                  int64_t T, int64_t H, int64_t D, const float *cs) {
    rope_pairs_apply(be, y, x, B, T, H, D, cs, 1.0f);
}

/* ---- patches ---- */

/* One thread per token element (bt, k); to_tok = 1: tok <- img, 0: img <- tok. */
static __global__ void k_patch(float *tok, float *img, int64_t C, int64_t H, int64_t W,
                               int64_t p, int chan_last, int to_tok, int64_t total) {
    const int64_t gw = W / p, T = (H / p) * gw, P = C * p * p;
    TZ_CUDA_FOR(e, total) {
        int64_t bt = e / P, k = e % P, b = bt / T, gy = (bt % T) / gw, gx = bt % gw;
        int64_t c, i, j;
        if (chan_last) {
            c = k % C;
            j = (k / C) % p;
            i = k / (C * p);
        } else {
            j = k % p;
            i = (k / p) % p;
            c = k / (p * p);
        }
        int64_t pix = ((b * C + c) * H + gy * p + i) * W + gx * p + j;
        if (to_tok) tok[e] = img[pix];
        else img[pix] = tok[e];
    }
}

static void patch_move(tz_backend *be, float *tok, float *img, int64_t B, int64_t C, int64_t H,
                       int64_t W, int64_t p, int chan_last, int to_tok) {
    if (p <= 0 || H % p || W % p)
        TZ_FATAL("patchify: image %lldx%lld is not a multiple of patch %lld", (long long)H,
                 (long long)W, (long long)p);
    int64_t total = B * C * H * W;
    if (total <= 0) return;
    k_patch<<<tz_cuda_blocks(total, TZ_CUDA_THREADS), TZ_CUDA_THREADS, 0, tz_cuda_stream(be)>>>(
        tok, img, C, H, W, p, chan_last, to_tok, total);
    CUDA_LAUNCHED();
}

static void cuda_patchify(tz_backend *be, float *tok, const float *img, int64_t B, int64_t C,
                          int64_t H, int64_t W, int64_t p, int chan_last) {
    patch_move(be, tok, (float *)img, B, C, H, W, p, chan_last, 1); /* img is only read */
}

static void cuda_unpatchify(tz_backend *be, float *img, const float *tok, int64_t B, int64_t C,
                            int64_t H, int64_t W, int64_t p, int chan_last) {
    patch_move(be, (float *)tok, img, B, C, H, W, p, chan_last, 0); /* tok is only read */
}

static void cuda_copy2d(tz_backend *be, float *dst, int64_t ldd, const float *src, int64_t lds,
                        int64_t rows, int64_t cols) {
    if (rows <= 0 || cols <= 0) return;
    CUDA_CHECK(cudaMemcpy2DAsync(dst, (size_t)ldd * sizeof(float), src,
                                 (size_t)lds * sizeof(float), (size_t)cols * sizeof(float),
                                 (size_t)rows, cudaMemcpyDeviceToDevice, tz_cuda_stream(be)));
}

void tz_cuda_install_layout(tz_backend *be) {
    be->embedding_fwd = cuda_embedding_fwd;
    be->embedding_fwd_w16 = cuda_embedding_fwd_w16;
    be->embedding_bwd = cuda_embedding_bwd;
    be->rope_fwd = cuda_rope_fwd;
    be->rope_fwd16 = cuda_rope_fwd16;
    be->rope_bwd16 = cuda_rope_bwd16;
    be->rope_bwd = cuda_rope_bwd;
    be->rope_tab_fwd = cuda_rope_tab_fwd;
    be->rope_tab_bwd = cuda_rope_tab_bwd;
    be->rope_tab_fwd16 = cuda_rope_tab_fwd16;
    be->rope_tab_bwd16 = cuda_rope_tab_bwd16;
    be->rope_pairs_fwd = cuda_rope_pairs_fwd;
    be->rope_pairs_bwd = cuda_rope_pairs_bwd;
    be->rope_pairs_fwd16 = cuda_rope_pairs_fwd16;
    be->patchify = cuda_patchify;
    be->unpatchify = cuda_unpatchify;
    be->copy2d = cuda_copy2d;
}
