/* CPU gathers, permutations and positions: token embedding, rotate-half RoPE, patchify and
 * unpatchify, strided 2-D copies. Each output element has one writer; no normalisation. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "cpu/cpu_internal.h"

/* ---- embedding ---- */

static void cpu_embedding_fwd(tz_backend *be, float *out, const int32_t *tok, const float *table,
                              int64_t n, int64_t C) {
    int nt = tz_cpu_threads(be);
#pragma omp parallel for schedule(static) num_threads(nt) if (n * C >= TZ_CPU_PAR_MIN)
    for (int64_t t = 0; t < n; t++)
        memcpy(out + t * C, table + (int64_t)tok[t] * C, (size_t)C * sizeof(float));
}

static void cpu_embedding_fwd_w16(tz_backend *be, float *out, const int32_t *tok,
                                  const uint16_t *table, int64_t n, int64_t C) {
    int nt = tz_cpu_threads(be);
#pragma omp parallel for schedule(static) num_threads(nt) if (n * C >= TZ_CPU_PAR_MIN)
    for (int64_t t = 0; t < n; t++) {
        const uint16_t *row = table + (int64_t)tok[t] * C;
        for (int64_t c = 0; c < C; c++) out[t * C + c] = tz_bf16_to_f32(row[c]);
    }
}

/* Threads own column blocks and walk the tokens in order, so repeated token ids add up in
 * the same order whatever the thread count. */
static void cpu_embedding_bwd(tz_backend *be, float *dtable, const int32_t *tok, const float *dout,
                              int64_t n, int64_t C) {
    int nt = tz_cpu_threads(be);
    int64_t nb = (C + TZ_CPU_COLS - 1) / TZ_CPU_COLS;
#pragma omp parallel for schedule(static) num_threads(nt) if (n * C >= TZ_CPU_PAR_MIN)
    for (int64_t cb = 0; cb < nb; cb++) {
        int64_t c0 = cb * TZ_CPU_COLS, c1 = c0 + TZ_CPU_COLS < C ? c0 + TZ_CPU_COLS : C;
        for (int64_t t = 0; t < n; t++) {
            float *d = dtable + (int64_t)tok[t] * C;
            const float *s = dout + t * C;
#pragma omp simd
            for (int64_t c = c0; c < c1; c++) d[c] += s[c];
        }
    }
}

/* ---- RoPE (HF rotate-half) ---- */

/* inv[i] = 1 / theta^((2i)/D) in float, as HF computes it. */
static void rope_inv_freq(float *inv, int64_t D, float theta) {
    for (int64_t i = 0; i < D / 2; i++)
        inv[i] = 1.0f / powf(theta, (float)(2 * i) / (float)D);
}

/* cs[t*half + i] = cos, sn[...] = sin of angle (float)(pos0 + t) * inv[i]. */
static void rope_table(float *cs, float *sn, int64_t T, int64_t D, const float *inv,
                       int64_t pos0, int nt) {
    int64_t half = D / 2;
#pragma omp parallel for schedule(static) num_threads(nt) if (T * half >= 4096)
    for (int64_t t = 0; t < T; t++) {
        for (int64_t i = 0; i < half; i++) {
            float ang = (float)(pos0 + t) * inv[i];
            cs[t * half + i] = cosf(ang);
            sn[t * half + i] = sinf(ang);
        }
    }
}

/* dir = +1: forward rotation; -1: its transpose (the backward). inv: D/2 host floats. */
static void rope_apply(tz_backend *be, float *x, int64_t B, int64_t T, int64_t H, int64_t D,
                       const float *inv, int64_t pos0, float dir) {
    if (B <= 0 || T <= 0 || H <= 0 || D <= 0) return;
    int nt = tz_cpu_threads(be);
    int64_t half = D / 2;
    float *cs = tz_xmalloc((size_t)(T * half) * sizeof(float));
    float *sn = tz_xmalloc((size_t)(T * half) * sizeof(float));
    rope_table(cs, sn, T, D, inv, pos0, nt);
#pragma omp parallel for schedule(static) num_threads(nt) if (B * T * H * D >= TZ_CPU_PAR_MIN)
    for (int64_t bt = 0; bt < B * T; bt++) {
        int64_t t = bt % T;
        const float *c = cs + t * half, *s0 = sn + t * half;
        for (int64_t h = 0; h < H; h++) {
            float *x1 = x + (bt * H + h) * D, *x2 = x1 + half;
#pragma omp simd
            for (int64_t i = 0; i < half; i++) {
                float a = x1[i], b = x2[i], s = dir * s0[i];
                x1[i] = a * c[i] - b * s;
                x2[i] = b * c[i] + a * s;
            }
        }
    }
    free(cs);
    free(sn);
}

static void rope_theta(tz_backend *be, float *x, int64_t B, int64_t T, int64_t H, int64_t D,
                       float theta, float dir) {
    if (D % 2 != 0) TZ_FATAL("rope needs an even head dimension, got D=%lld", (long long)D);
    if (D <= 0) return;
    float *inv = tz_xmalloc((size_t)(D / 2) * sizeof(float));
    rope_inv_freq(inv, D, theta);
    rope_apply(be, x, B, T, H, D, inv, 0, dir);
    free(inv);
}

static void cpu_rope_fwd(tz_backend *be, float *x, int64_t B, int64_t T, int64_t H, int64_t D,
                         float theta) {
    rope_theta(be, x, B, T, H, D, theta, 1.0f);
}

static void cpu_rope_bwd(tz_backend *be, float *dx, int64_t B, int64_t T, int64_t H, int64_t D,
                         float theta) {
    rope_theta(be, dx, B, T, H, D, theta, -1.0f);
}

/* rope on a copy, rounded (the specification; a device backend fuses the two) */
static void rope_theta16(tz_backend *be, uint16_t *y, const float *x, int64_t B, int64_t T,
                         int64_t H, int64_t D, float theta, float dir) {
    const int64_t n = B * T * H * D;
    if (n <= 0) return;
    float *t = tz_xmalloc((size_t)n * sizeof(float));
    memcpy(t, x, (size_t)n * sizeof(float));
    rope_theta(be, t, B, T, H, D, theta, dir);
    be->to_bf16(be, y, t, n);
    free(t);
}

static void cpu_rope_fwd16(tz_backend *be, uint16_t *y, const float *x, int64_t B, int64_t T,
                           int64_t H, int64_t D, float theta) {
    rope_theta16(be, y, x, B, T, H, D, theta, 1.0f);
}

static void cpu_rope_bwd16(tz_backend *be, uint16_t *dy, const float *dx, int64_t B, int64_t T,
                           int64_t H, int64_t D, float theta) {
    rope_theta16(be, dy, dx, B, T, H, D, theta, -1.0f);
}

static void cpu_rope_tab_fwd(tz_backend *be, float *x, int64_t B, int64_t T, int64_t H,
                             int64_t D, const float *inv_freq, int64_t pos0) {
    if (D % 2 != 0) TZ_FATAL("rope needs an even head dimension, got D=%lld", (long long)D);
    rope_apply(be, x, B, T, H, D, inv_freq, pos0, 1.0f);
}

static void cpu_rope_tab_bwd(tz_backend *be, float *dx, int64_t B, int64_t T, int64_t H,
                             int64_t D, const float *inv_freq, int64_t pos0) {
    if (D % 2 != 0) TZ_FATAL("rope needs an even head dimension, got D=%lld", (long long)D);
    rope_apply(be, dx, B, T, H, D, inv_freq, pos0, -1.0f);
}

/* rope_tab on a copy, rounded (the specification, as rope_theta16's) */
static void rope_tab16(tz_backend *be, uint16_t *y, const float *x, int64_t B, int64_t T,
                       int64_t H, int64_t D, const float *inv_freq, int64_t pos0, float dir) {
    if (D % 2 != 0) TZ_FATAL("rope needs an even head dimension, got D=%lld", (long long)D);
    const int64_t n = B * T * H * D;
    if (n <= 0) return;
    float *t = tz_xmalloc((size_t)n * sizeof(float));
    memcpy(t, x, (size_t)n * sizeof(float));
    rope_apply(be, t, B, T, H, D, inv_freq, pos0, dir);
    be->to_bf16(be, y, t, n);
    free(t);
}

static void cpu_rope_tab_fwd16(tz_backend *be, uint16_t *y, const float *x, int64_t B,
                               int64_t T, int64_t H, int64_t D, const float *inv_freq,
                               int64_t pos0) {
    rope_tab16(be, y, x, B, T, H, D, inv_freq, pos0, 1.0f);
}

static void cpu_rope_tab_bwd16(tz_backend *be, uint16_t *y, const float *x, int64_t B,
                               int64_t T, int64_t H, int64_t D, const float *inv_freq,
                               int64_t pos0) {
    rope_tab16(be, y, x, B, T, H, D, inv_freq, pos0, -1.0f);
}

/* Pairs (2i, 2i+1) rotated by the table's angle (dir -1: the inverse); one writer per
 * element. */
static void rope_pairs(tz_backend *be, float *x, int64_t B, int64_t T, int64_t H, int64_t D,
                       const float *cs, float dir) {
    if (D % 2 != 0) TZ_FATAL("rope needs an even head dimension, got D=%lld", (long long)D);
    const int64_t half = D / 2, rows = B * T * H;
    int nt = tz_cpu_threads(be);
#pragma omp parallel for schedule(static) num_threads(nt) if (rows * D >= TZ_CPU_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *t = cs + ((r / H) % T) * D; /* D = 2 * half floats per position */
        float *v = x + r * D;
        for (int64_t i = 0; i < half; i++) {
            const float c = t[2 * i], s = dir * t[2 * i + 1], a = v[2 * i], b = v[2 * i + 1];
            v[2 * i] = a * c - b * s;
            v[2 * i + 1] = b * c + a * s;
        }
    }
}

static void cpu_rope_pairs_fwd(tz_backend *be, float *x, int64_t B, int64_t T, int64_t H,
                               int64_t D, const float *cs) {
    rope_pairs(be, x, B, T, H, D, cs, 1.0f);
}

static void cpu_rope_pairs_bwd(tz_backend *be, float *dx, int64_t B, int64_t T, int64_t H,
                               int64_t D, const float *cs) {
    rope_pairs(be, dx, B, T, H, D, cs, -1.0f);
}

/* The reference: rope_pairs_fwd on a copy of x, then to_bf16 of it. */
static void cpu_rope_pairs_fwd16(tz_backend *be, uint16_t *y, const float *x, int64_t B,
                                 int64_t T, int64_t H, int64_t D, const float *cs) {
    const int64_t n = B * T * H * D;
    float *t = malloc((size_t)(n > 0 ? n : 1) * sizeof *t);
    if (!t) TZ_FATAL("rope_pairs_fwd16: out of host memory");
    memcpy(t, x, (size_t)(n > 0 ? n : 0) * sizeof *t);
    rope_pairs(be, t, B, T, H, D, cs, 1.0f);
    be->to_bf16(be, y, t, n);
    free(t);
}

/* ---- patches ---- */

/* to_tok = 1: tok <- img; 0: img <- tok. One work item per (b, token); every element has one
 * writer. */
static void patch_move(tz_backend *be, float *tok, float *img, int64_t B, int64_t C, int64_t H,
                       int64_t W, int64_t p, int chan_last, int to_tok) {
    if (p <= 0 || H % p || W % p)
        TZ_FATAL("patchify: image %lldx%lld is not a multiple of patch %lld", (long long)H,
                 (long long)W, (long long)p);
    int nt = tz_cpu_threads(be);
    const int64_t gh = H / p, gw = W / p, T = gh * gw, P = C * p * p;
#pragma omp parallel for schedule(static) num_threads(nt) if (B * T * P >= TZ_CPU_PAR_MIN)
    for (int64_t bt = 0; bt < B * T; bt++) {
        int64_t b = bt / T, gy = (bt % T) / gw, gx = bt % gw;
        float *tv = tok + bt * P;
        for (int64_t c = 0; c < C; c++)
            for (int64_t i = 0; i < p; i++) {
                float *row = img + ((b * C + c) * H + gy * p + i) * W + gx * p;
                for (int64_t j = 0; j < p; j++) {
                    int64_t k = chan_last ? (i * p + j) * C + c : (c * p + i) * p + j;
                    if (to_tok) tv[k] = row[j];
                    else row[j] = tv[k];
                }
            }
    }
}

static void cpu_patchify(tz_backend *be, float *tok, const float *img, int64_t B, int64_t C,
                         int64_t H, int64_t W, int64_t p, int chan_last) {
    patch_move(be, tok, (float *)img, B, C, H, W, p, chan_last, 1); /* img is only read */
}

static void cpu_unpatchify(tz_backend *be, float *img, const float *tok, int64_t B, int64_t C,
                           int64_t H, int64_t W, int64_t p, int chan_last) {
    patch_move(be, (float *)tok, img, B, C, H, W, p, chan_last, 0); /* tok is only read */
}

static void cpu_copy2d(tz_backend *be, float *dst, int64_t ldd, const float *src, int64_t lds,
                       int64_t rows, int64_t cols) {
    int nt = tz_cpu_threads(be);
#pragma omp parallel for schedule(static) num_threads(nt) if (rows * cols >= TZ_CPU_PAR_MIN)
    for (int64_t r = 0; r < rows; r++)
        memcpy(dst + r * ldd, src + r * lds, (size_t)cols * sizeof(float));
}

void TZ_CPU_K(tz_cpu_install_layout)(tz_backend *be) {
    be->embedding_fwd = cpu_embedding_fwd;
    be->embedding_fwd_w16 = cpu_embedding_fwd_w16;
    be->embedding_bwd = cpu_embedding_bwd;
    be->rope_fwd = cpu_rope_fwd;
    be->rope_bwd = cpu_rope_bwd;
    be->rope_tab_fwd = cpu_rope_tab_fwd;
    be->rope_tab_bwd = cpu_rope_tab_bwd;
    be->rope_tab_fwd16 = cpu_rope_tab_fwd16;
    be->rope_tab_bwd16 = cpu_rope_tab_bwd16;
    be->rope_pairs_fwd = cpu_rope_pairs_fwd;
    be->rope_pairs_bwd = cpu_rope_pairs_bwd;
    be->rope_pairs_fwd16 = cpu_rope_pairs_fwd16;
    be->rope_fwd16 = cpu_rope_fwd16;
    be->rope_bwd16 = cpu_rope_bwd16;
    be->patchify = cpu_patchify;
    be->unpatchify = cpu_unpatchify;
    be->copy2d = cpu_copy2d;
}
