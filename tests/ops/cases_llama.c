/* Rows of the op-case table (op_case.h): the Llama ops (embedding, RMSNorm, RoPE, attention,
 * SwiGLU, cross-entropy) with their fp64 references. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "ops/op_case.h"

/* ---- embedding: out[t] = table[tok[t]]; dtable[tok[t]] += dout[t] ----
 * tensors: 0 tok, 1 table, 2 out, 3 dout, 4 dtable; p: V, C, n */

static void emb_fwd(oc_run *r) {
    r->be->embedding_fwd(r->be, OCF(r, 2), OCI(r, 0), OCF(r, 1), OCP(r, 2), OCP(r, 1));
}
static void emb_bwd(oc_run *r) {
    r->be->embedding_bwd(r->be, OCF(r, 4), OCI(r, 0), OCF(r, 3), OCP(r, 2), OCP(r, 1));
}
static void emb_ref(oc_ref *r) {
    const int64_t C = r->c->p[1], n = r->c->p[2];
    const int32_t *tok = r->raw[0];
    for (int64_t t = 0; t < n; t++)
        memcpy(r->v[2] + t * C, r->v[1] + tok[t] * C, (size_t)C * sizeof(double));
}

static void add_embedding(oc_list *l, int64_t V, int64_t C, int64_t n) {
    oc_case c = {.ops = "embedding_fwd embedding_bwd", .nt = 5, .p = {V, C, n}, .fwd = emb_fwd,
                 .ref = emb_ref, .bwd = emb_bwd,
                 /* a copy; the backward adds a few (n / V ~ 3) values per element in fp32 */
                 .tol_fwd = 0, .tol_bwd = 5e-7};
    c.t[0] = (oc_tensor)OC_T_I32("tok", n, 0, (int)V); /* n > V: ids repeat */
    c.t[1] = (oc_tensor)OC_T_IN("table", V * C);
    c.t[2] = (oc_tensor)OC_T_OUT("out", n * C);
    c.t[3] = (oc_tensor)OC_T_DOUT("dout", 2);
    c.t[4] = (oc_tensor)OC_T_DIN("dtable", 1);
    snprintf(c.name, sizeof c.name, "embedding V %lld C %lld n %lld", (long long)V, (long long)C,
             (long long)n);
    oc_add(l, &c);
}

/* embedding_fwd_w16: the table in bf16. tensors: 0 tok, 1 table (bf16), 2 out */
static void emb16_fwd(oc_run *r) {
    r->be->embedding_fwd_w16(r->be, OCF(r, 2), OCI(r, 0), OCH(r, 1), OCP(r, 2), OCP(r, 1));
}

static void add_embedding_w16(oc_list *l, int64_t V, int64_t C, int64_t n) {
    oc_case c = {.ops = "embedding_fwd_w16", .nt = 3, .p = {V, C, n}, .fwd = emb16_fwd,
                 .ref = emb_ref, .tol_fwd = 0 /* bf16 to fp32 is exact */};
    c.t[0] = (oc_tensor)OC_T_I32("tok", n, 0, (int)V);
    c.t[1] = (oc_tensor)OC_T_BF16("table", V * C, 2.0f);
    c.t[2] = (oc_tensor)OC_T_OUT("out", n * C);
    snprintf(c.name, sizeof c.name, "embedding bf16 table V %lld C %lld n %lld", (long long)V,
             (long long)C, (long long)n);
    oc_add(l, &c);
}

/* ---- RMSNorm: out = x rstd w, rstd = 1 / sqrt(mean(x^2) + eps) ----
 * tensors: 0 x, 1 w, 2 out, 3 rstd, 4 dout, 5 dx, 6 dw (absent: frozen weight, dw NULL);
 * p: rows, C; s: eps */

static void rms_fwd(oc_run *r) {
    r->be->rmsnorm_fwd(r->be, OCF(r, 2), OCF(r, 3), OCF(r, 0), OCF(r, 1), OCP(r, 0), OCP(r, 1),
                       (float)OCS(r, 0));
}
static void rms_bwd(oc_run *r) {
    r->be->rmsnorm_bwd(r->be, OCF(r, 5), r->c->nt > 6 ? OCF(r, 6) : NULL, OCF(r, 4), OCF(r, 0),
                       OCF(r, 1), OCF(r, 3), OCP(r, 0), OCP(r, 1), !OCP(r, 2));
}
static void rms_ref(oc_ref *r) {
    const int64_t rows = r->c->p[0], C = r->c->p[1];
    const double *x = r->v[0], *w = r->v[1];
    for (int64_t i = 0; i < rows; i++) {
        double ss = 0.0;
        for (int64_t j = 0; j < C; j++) ss += x[i * C + j] * x[i * C + j];
        const double rs = 1.0 / sqrt(ss / (double)C + (double)(float)r->c->s[0]);
        r->v[3][i] = rs;
        for (int64_t j = 0; j < C; j++) r->v[2][i * C + j] = x[i * C + j] * rs * w[j];
    }
}

/* write: the backward writes dx (accumulate 0) instead of adding to it */
static void add_rmsnorm_w(oc_list *l, int64_t rows, int64_t C, int frozen, int write) {
    oc_case c = {.ops = "rmsnorm_fwd rmsnorm_bwd", .nt = frozen ? 6 : 7, .p = {rows, C, write},
                 .s = {1e-5}, .fwd = rms_fwd, .ref = rms_ref, .bwd = rms_bwd,
                 /* a sum of C squares and a few fp32 roundings; the backward's row sums over
                  * C and dw's over rows (fp32 or double): some 1e-7 */
                 .tol_fwd = 1e-6, .tol_bwd = 1e-6};
    c.t[0] = (oc_tensor)OC_T_IN("x", rows * C);
    c.t[1] = (oc_tensor)OC_T_INA("w", C, 1.5f);
    c.t[2] = (oc_tensor)OC_T_OUT("out", rows * C);
    c.t[3] = (oc_tensor)OC_T_OUT("rstd", rows);
    c.t[4] = (oc_tensor)OC_T_DOUT("dout", 2);
    c.t[5] = (oc_tensor)OC_T_DIN("dx", 0);
    if (write) c.t[5].flags |= OC_WRITES;
    if (!frozen) c.t[6] = (oc_tensor)OC_T_DIN("dw", 1);
    snprintf(c.name, sizeof c.name, "rmsnorm rows %lld C %lld%s%s", (long long)rows, (long long)C,
             frozen ? " frozen weight (dw NULL)" : "", write ? ", dx written" : "");
    oc_add(l, &c);
}
static void add_rmsnorm(oc_list *l, int64_t rows, int64_t C, int frozen) {
    add_rmsnorm_w(l, rows, C, frozen, 0);
}

/* ---- RoPE, rotate-half, in place on x [B, T, H, D] ----
 * tensors: 0 x (in place), 1 dx (upstream gradient in, input gradient out);
 * p: B, T, H, D (<= 512), pos0 (rope_tab); s: theta */

/* x rotated by angle pos * inv[i] in pair (i, i + D/2), pos = pos0 + t */
static void rope_apply(double *x, const double *inv, int64_t B, int64_t T, int64_t H, int64_t D,
                       int64_t pos0, int float_angle) {
    const int64_t half = D / 2;
    for (int64_t bt = 0; bt < B * T; bt++)
        for (int64_t i = 0; i < half; i++) {
            const int64_t pos = pos0 + bt % T;
            /* rope_tab's angle is the float product (float)pos * inv_freq[i] (backend.h) */
            const double a = float_angle ? (double)((float)pos * (float)inv[i])
                                         : (double)pos * inv[i];
            const double cs = cos(a), sn = sin(a);
            for (int64_t h = 0; h < H; h++) {
                double *xr = x + (bt * H + h) * D;
                const double x0 = xr[i], x1 = xr[i + half];
                xr[i] = x0 * cs - x1 * sn;
                xr[i + half] = x1 * cs + x0 * sn;
            }
        }
}

static void rope_fwd_(oc_run *r) {
    r->be->rope_fwd(r->be, OCF(r, 0), OCP(r, 0), OCP(r, 1), OCP(r, 2), OCP(r, 3),
                    (float)OCS(r, 0));
}
static void rope_bwd_(oc_run *r) {
    r->be->rope_bwd(r->be, OCF(r, 1), OCP(r, 0), OCP(r, 1), OCP(r, 2), OCP(r, 3),
                    (float)OCS(r, 0));
}
/* exact frequencies theta^(-2i/D) in fp64 */
static void rope_ref(oc_ref *r) {
    const int64_t *p = r->c->p, D = p[3];
    double inv[256];
    for (int64_t i = 0; i < D / 2; i++) inv[i] = pow(r->c->s[0], -2.0 * (double)i / (double)D);
    rope_apply(r->v[0], inv, p[0], p[1], p[2], D, 0, 0);
}

/* rope_tab's frequencies: theta^(-2i/D) in float, every third one scaled by 1/8 (a scaled
 * table such as Llama 3's) */
static void rope_tab_freqs(float *inv, int64_t D, double theta) {
    for (int64_t i = 0; i < D / 2; i++)
        inv[i] = 1.0f / powf((float)theta, (float)(2 * i) / (float)D) * (i % 3 ? 1.0f : 0.125f);
}
/* the table in backend memory, freed by the caller */
static float *rope_tab_upload(oc_run *r) {
    float inv[256];
    const int64_t D = OCP(r, 3);
    rope_tab_freqs(inv, D, OCS(r, 0));
    float *d = r->be->alloc(r->be, (size_t)(D / 2) * sizeof(float));
    r->be->upload(r->be, d, inv, (size_t)(D / 2) * sizeof(float));
    return d;
}
static void rope_tab_fwd_(oc_run *r) {
    float *inv = rope_tab_upload(r);
    r->be->rope_tab_fwd(r->be, OCF(r, 0), OCP(r, 0), OCP(r, 1), OCP(r, 2), OCP(r, 3), inv,
                        OCP(r, 4));
    r->be->sync(r->be);
    r->be->release(r->be, inv);
}
static void rope_tab_bwd_(oc_run *r) {
    float *inv = rope_tab_upload(r);
    r->be->rope_tab_bwd(r->be, OCF(r, 1), OCP(r, 0), OCP(r, 1), OCP(r, 2), OCP(r, 3), inv,
                        OCP(r, 4));
    r->be->sync(r->be);
    r->be->release(r->be, inv);
}
static void rope_tab_ref(oc_ref *r) {
    const int64_t *p = r->c->p, D = p[3];
    float invf[256];
    double inv[256];
    rope_tab_freqs(invf, D, r->c->s[0]);
    for (int64_t i = 0; i < D / 2; i++) inv[i] = invf[i];
    rope_apply(r->v[0], inv, p[0], p[1], p[2], D, p[4], 1);
}

/* tab: rope_tab at position offset pos0 (else rope_fwd, pos0 0) */
static void add_rope(oc_list *l, int tab, int64_t B, int64_t T, int64_t H, int64_t D,
                     int64_t pos0, double theta) {
    oc_case c = {.ops = tab ? "alloc upload rope_tab_fwd rope_tab_bwd sync release"
                            : "rope_fwd rope_bwd",
                 .nt = 2, .p = {B, T, H, D, pos0}, .s = {theta},
                 .fwd = tab ? rope_tab_fwd_ : rope_fwd_,
                 .ref = tab ? rope_tab_ref : rope_ref, .bwd = tab ? rope_tab_bwd_ : rope_bwd_};
    if (tab)
        /* the reference takes the same float angle: what is left is cosf and sinf (a few
         * ulps, more at angles of ~1e3 rad after the argument reduction) and two fp32
         * products and a sum */
        c.tol_fwd = c.tol_bwd = 1e-6;
    else
        /* the backend's angle t * inv_freq is a float product of a float power against
         * fp64 frequencies: the angle errs by a few ulps of itself (up to 36 rad here:
         * ~5e-6 rad at worst, ~6e-7 measured) */
        c.tol_fwd = c.tol_bwd = 5e-6;
    c.t[0] = (oc_tensor)OC_T_INOUT("x", B * T * H * D);
    c.t[1] = (oc_tensor)OC_T_DIO("dx", 0);
    snprintf(c.name, sizeof c.name, "%s B %lld T %lld H %lld D %lld pos0 %lld theta %g",
             tab ? "rope_tab" : "rope", (long long)B, (long long)T, (long long)H, (long long)D,
             (long long)pos0, theta);
    oc_add(l, &c);
}

/* ---- attention with grouped-query heads ----
 * fp64 reference for both attention ops: queries q [B, T, Hq, D] at positions pos0 + t
 * against keys and values k, v [B, S, Hkv, D]; causal: key s <= pos0 + t. lse may be NULL. */
static void ref_attend(double *out, double *lse, const double *q, const double *k,
                       const double *v, int64_t B, int64_t T, int64_t S, int64_t pos0,
                       int64_t Hq, int64_t Hkv, int64_t D, int causal) {
    double *p = malloc((size_t)S * sizeof(double));
    const double scale = 1.0 / sqrt((double)D);
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < Hq; h++) {
                const int64_t g = h / (Hq / Hkv), nk = causal ? pos0 + t + 1 : S;
                const double *qr = q + ((b * T + t) * Hq + h) * D;
                double m = -INFINITY, sum = 0.0;
                for (int64_t s = 0; s < nk; s++) {
                    const double *kr = k + ((b * S + s) * Hkv + g) * D;
                    double d = 0.0;
                    for (int64_t i = 0; i < D; i++) d += qr[i] * kr[i];
                    p[s] = scale * d;
                    if (p[s] > m) m = p[s];
                }
                for (int64_t s = 0; s < nk; s++) sum += (p[s] = exp(p[s] - m));
                if (lse) lse[(b * Hq + h) * T + t] = m + log(sum);
                double *o = out + ((b * T + t) * Hq + h) * D;
                for (int64_t i = 0; i < D; i++) o[i] = 0.0;
                for (int64_t s = 0; s < nk; s++) {
                    const double w = p[s] / sum, *vr = v + ((b * S + s) * Hkv + g) * D;
                    for (int64_t i = 0; i < D; i++) o[i] += w * vr[i];
                }
            }
    free(p);
}

/* tensors: 0 q, 1 k, 2 v, 3 out, 4 lse, 5 dout, 6 dq, 7 dk, 8 dv; p: B, T, Hq, Hkv, D, causal.
 * Each call gets the workspace the backend plans for it (tz_attention_ws_bytes), as the
 * models lend it. */
static void *att_lend(tz_backend *be, int64_t B, int64_t T, int64_t Hq, int64_t D, int bwd) {
    const size_t b = tz_attention_ws_bytes(be, B, T, Hq, D, bwd, 0); /* (q, k, v in fp32) */
    void *ws = b ? be->alloc(be, b) : NULL;
    be->att_ws = ws, be->att_ws_bytes = b;
    return ws;
}
static void att_fwd(oc_run *r) {
    tz_backend *be = r->be;
    const int64_t *p = r->c->p;
    void *ws = att_lend(be, p[0], p[1], p[2], p[4], 0);
    be->attention_fwd(be, OCF(r, 3), OCF(r, 4), OCF(r, 0), OCF(r, 1), OCF(r, 2), p[0], p[1],
                      p[2], p[3], p[4], (int)p[5], NULL);
    be->sync(be);
    if (ws) be->release(be, ws);
}
static void att_bwd(oc_run *r) {
    tz_backend *be = r->be;
    const int64_t *p = r->c->p;
    void *ws = att_lend(be, p[0], p[1], p[2], p[4], 1);
    be->attention_bwd(be, OCF(r, 6), OCF(r, 7), OCF(r, 8), OCF(r, 5), OCF(r, 3), OCF(r, 4),
                      OCF(r, 0), OCF(r, 1), OCF(r, 2), p[0], p[1], p[2], p[3], p[4], (int)p[5],
                      !p[6], NULL);
    be->sync(be);
    if (ws) be->release(be, ws);
}
static void att_ref(oc_ref *r) {
    const int64_t *p = r->c->p;
    ref_attend(r->v[3], r->v[4], r->v[0], r->v[1], r->v[2], p[0], p[1], p[1], 0, p[2], p[3],
               p[4], (int)p[5]);
}

/* write: the backward writes dq, dk, dv (accumulate = 0) instead of adding to them */
static void add_attention_w(oc_list *l, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D,
                            int causal, int host_only, int write) {
    const int64_t nq = B * T * Hq * D, nk = B * T * Hkv * D;
    oc_case c = {.ops = "alloc attention_fwd attention_bwd sync release", .nt = 9,
                 .p = {B, T, Hq, Hkv, D, causal, write}, .flags = OC_GEMM | (host_only ? OC_HOST_ONLY : 0), .fwd = att_fwd,
                 .ref = att_ref, .bwd = att_bwd,
                 /* fp32: chained reductions over D <= 72 and T <= 70 in another order, an
                  * online softmax against a two-pass one, exp of the difference: ~(D + T) u
                  * ~ 8e-6 at worst for the backward's longer chains, ~1e-6 measured */
                 .tol_fwd = 3e-6, .tol_bwd = 1e-5,
                 /* bf16 GEMM operands (flash kernels, D <= 128): the inputs are bf16 values,
                  * so the products are exact, but P (and dS) are rounded to bf16 (u = 2^-8,
                  * 2^-9 on average) before the products that make out (and dq, dk, dv):
                  * 2.5u (5u) */
                 .tol_fwd_bf16 = 1e-2, .tol_bwd_bf16 = 2e-2};
    if (D > TZ_ATTENTION_FLASH_MAXD) {
        /* a device's attention above the flash head dimension needs bf16 operands (its fp32
         * form stops with a hint): chunks of query rows through tensor-core GEMMs on bf16
         * values, P and dS rounded to bf16 (u = 2^-8) in longer sums than the flash path's */
        c.flags |= OC_DEVICE_BF16;
        c.tol_fwd_bf16 = c.tol_bwd_bf16 = 3e-3;
    }
    c.t[0] = (oc_tensor)OC_T_INA("q", nq, 1.5f);
    c.t[1] = (oc_tensor)OC_T_INA("k", nk, 1.5f);
    c.t[2] = (oc_tensor)OC_T_IN("v", nk);
    c.t[3] = (oc_tensor)OC_T_OUT("out", nq);
    c.t[4] = (oc_tensor)OC_T_OUT("lse", B * Hq * T);
    c.t[5] = (oc_tensor)OC_T_DOUT("dout", 3);
    c.t[6] = (oc_tensor)OC_T_DIN("dq", 0);
    c.t[7] = (oc_tensor)OC_T_DIN("dk", 1);
    if (T == 1) {
        /* one key: dq and dk are exactly 0, and the backend's are the rounding of
         * dP - delta, which an error relative to a zero result cannot judge: scratch */
        c.t[6] = (oc_tensor)OC_T_OUT("dq", nq);
        c.t[7] = (oc_tensor)OC_T_OUT("dk", nk);
        c.t[6].flags = c.t[7].flags = OC_NOCHECK;
    }
    c.t[8] = (oc_tensor)OC_T_DIN("dv", 2);
    if (write)
        for (int i = 6; i < 9; i++) c.t[i].flags |= OC_WRITES;
    if (T >= 150) c.fd_points = 24; /* the reference is O(T^2) per difference */
    snprintf(c.name, sizeof c.name, "attention B %lld T %lld Hq %lld Hkv %lld D %lld %s%s",
             (long long)B, (long long)T, (long long)Hq, (long long)Hkv, (long long)D,
             causal ? "causal" : "full", write ? ", written" : "");
    oc_add(l, &c);
}
static void add_attention(oc_list *l, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D,
                          int causal, int host_only) {
    add_attention_w(l, B, T, Hq, Hkv, D, causal, host_only, 0);
}

/* Attention at row strides (tz_att_ld), as a fused projection lays q, k and v out: one tensor
 * qkv [B*T, (Hq + 2 Hkv) D] read in place (k and v pointing into its rows), out written into
 * rows of Hq*D + opad (the gaps keep what they held: an INOUT tensor whose start the reference
 * keeps too, so a write into a gap fails), dout read from the same layout, and the gradients
 * into dqkv as qkv is laid out (every element is one of dq, dk, dv: written over NaN, or added
 * to a random start).
 * tensors: 0 qkv, 1 out, 2 lse, 3 dout, 4 dqkv; p: B, T, Hq, Hkv, D, causal, write, opad. */
static tz_att_ld att_ld_of(const int64_t *p) {
    const tz_att_ld ld = {(p[2] + 2 * p[3]) * p[4], (p[2] + 2 * p[3]) * p[4], p[2] * p[4] + p[7],
                          0, 0};
    return ld;
}
static void attl_fwd(oc_run *r) {
    tz_backend *be = r->be;
    const int64_t *p = r->c->p;
    const tz_att_ld ld = att_ld_of(p);
    const float *q = OCF(r, 0), *k = q + p[2] * p[4], *v = k + p[3] * p[4];
    void *ws = att_lend(be, p[0], p[1], p[2], p[4], 0);
    be->attention_fwd(be, OCF(r, 1), OCF(r, 2), q, k, v, p[0], p[1], p[2], p[3], p[4],
                      (int)p[5], &ld);
    be->sync(be);
    if (ws) be->release(be, ws);
}
static void attl_bwd(oc_run *r) {
    tz_backend *be = r->be;
    const int64_t *p = r->c->p;
    const tz_att_ld ld = att_ld_of(p);
    const float *q = OCF(r, 0), *k = q + p[2] * p[4], *v = k + p[3] * p[4];
    float *dq = OCF(r, 4), *dk = dq + p[2] * p[4], *dv = dk + p[3] * p[4];
    void *ws = att_lend(be, p[0], p[1], p[2], p[4], 1);
    be->attention_bwd(be, dq, dk, dv, OCF(r, 3), OCF(r, 1), OCF(r, 2), q, k, v, p[0], p[1], p[2],
                      p[3], p[4], (int)p[5], !p[6], &ld);
    be->sync(be);
    if (ws) be->release(be, ws);
}
/* the dense reference on copies of q, k, v, its out scattered into the strided rows */
static void attl_ref(oc_ref *r) {
    const int64_t *p = r->c->p, B = p[0], T = p[1], Hq = p[2], Hkv = p[3], D = p[4];
    const tz_att_ld ld = att_ld_of(p);
    const int64_t nq = B * T * Hq * D, nk = B * T * Hkv * D;
    double *q = calloc((size_t)(nq + 2 * nk + nq), sizeof(double));
    double *k = q + nq, *v = k + nk, *o = v + nk;
    for (int64_t row = 0; row < B * T; row++) {
        const double *x = r->v[0] + row * ld.q;
        memcpy(q + row * Hq * D, x, (size_t)(Hq * D) * sizeof(double));
        memcpy(k + row * Hkv * D, x + Hq * D, (size_t)(Hkv * D) * sizeof(double));
        memcpy(v + row * Hkv * D, x + (Hq + Hkv) * D, (size_t)(Hkv * D) * sizeof(double));
    }
    ref_attend(o, r->v[2], q, k, v, B, T, T, 0, Hq, Hkv, D, (int)p[5]);
    for (int64_t row = 0; row < B * T; row++)
        memcpy(r->v[1] + row * ld.o, o + row * Hq * D, (size_t)(Hq * D) * sizeof(double));
    free(q);
}
static void add_attention_ld(oc_list *l, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                             int64_t D, int causal, int write, int64_t opad) {
    const int64_t ldq = (Hq + 2 * Hkv) * D, ldo = Hq * D + opad;
    oc_case c = {.ops = "alloc attention_fwd attention_bwd sync release", .nt = 5,
                 .p = {B, T, Hq, Hkv, D, causal, write, opad},
                 .flags = OC_GEMM, .fwd = attl_fwd, .ref = attl_ref, .bwd = attl_bwd,
                 /* as the dense rows (add_attention_w): the same sums in the same order */
                 .tol_fwd = 3e-6, .tol_bwd = 1e-5, .tol_fwd_bf16 = 1e-2, .tol_bwd_bf16 = 2e-2};
    if (D > TZ_ATTENTION_FLASH_MAXD) {
        c.flags |= OC_DEVICE_BF16;
        c.tol_fwd_bf16 = c.tol_bwd_bf16 = 3e-3;
    }
    c.t[0] = (oc_tensor)OC_T_INA("qkv", B * T * ldq, 1.5f);
    c.t[1] = (oc_tensor)OC_T_INOUT("out", B * T * ldo);
    c.t[2] = (oc_tensor)OC_T_OUT("lse", B * Hq * T);
    c.t[3] = (oc_tensor)OC_T_DOUT("dout", 1);
    c.t[4] = (oc_tensor)OC_T_DIN("dqkv", 0);
    if (write) c.t[4].flags |= OC_WRITES;
    snprintf(c.name, sizeof c.name,
             "attention at row strides (qkv fused, out rows +%lld) B %lld T %lld Hq %lld Hkv "
             "%lld D %lld %s%s", (long long)opad, (long long)B, (long long)T, (long long)Hq,
             (long long)Hkv, (long long)D, causal ? "causal" : "full", write ? ", written" : "");
    oc_add(l, &c);
}

/* attention_cache_fwd: T queries at pos0 against a cache of capacity S, in fp32 or (kv16)
 * bf16. tensors: 0 q, 1 kc, 2 vc, 3 out; p: B, T, S, pos0, Hq, Hkv, D, kv16 */
static void attc_fwd(oc_run *r) {
    tz_backend *be = r->be;
    const int64_t *p = r->c->p, B = p[0], T = p[1], S = p[2], pos0 = p[3], row = p[5] * p[6];
    const int kv16 = (int)p[7];
    const size_t es = kv16 ? 2 : 4;
    /* the slots after the filled ones hold NaN: a read of one shows */
    const int64_t free_rows = S - pos0 - T;
    if (free_rows > 0) {
        float *nan = malloc((size_t)(free_rows * row) * sizeof(float));
        for (int64_t i = 0; i < free_rows * row; i++) nan[i] = NAN;
        if (kv16) /* bf16 NaNs: 0x7fc0 */
            for (int64_t i = 0; i < free_rows * row; i++) ((uint16_t *)nan)[i] = 0x7fc0;
        for (int64_t b = 0; b < B; b++)
            for (int i = 1; i <= 2; i++)
                be->upload(be, (char *)r->d[i] + (size_t)((b * S + pos0 + T) * row) * es, nan,
                           (size_t)(free_rows * row) * es);
        free(nan);
    }
    be->attention_cache_fwd(be, OCF(r, 3), OCF(r, 0), r->d[1], r->d[2], B, T, S, pos0, p[4],
                            p[5], p[6], kv16);
}
static void attc_ref(oc_ref *r) {
    const int64_t *p = r->c->p;
    ref_attend(r->v[3], NULL, r->v[0], r->v[1], r->v[2], p[0], p[1], p[2], p[3], p[4], p[5],
               p[6], 1);
}

static void add_attention_cache(oc_list *l, int64_t B, int64_t T, int64_t S, int64_t pos0,
                                int64_t Hq, int64_t Hkv, int64_t D, int kv16) {
    oc_case c = {.ops = "upload attention_cache_fwd", .nt = 4,
                 .p = {B, T, S, pos0, Hq, Hkv, D, kv16}, .fwd = attc_fwd, .ref = attc_ref,
                 /* fp32 everywhere (no GEMM operand type; a bf16 cache's values widened
                  * exactly): attention_fwd's forward */
                 .tol_fwd = 3e-6};
    c.t[0] = (oc_tensor)OC_T_INA("q", B * T * Hq * D, 1.5f);
    if (kv16) {
        c.t[1] = (oc_tensor)OC_T_BF16("kc", B * S * Hkv * D, 1.5f);
        c.t[2] = (oc_tensor)OC_T_BF16("vc", B * S * Hkv * D, 1.0f);
    } else {
        c.t[1] = (oc_tensor)OC_T_INA("kc", B * S * Hkv * D, 1.5f);
        c.t[2] = (oc_tensor)OC_T_IN("vc", B * S * Hkv * D);
    }
    c.t[3] = (oc_tensor)OC_T_OUT("out", B * T * Hq * D);
    snprintf(c.name, sizeof c.name,
             "attention_cache B %lld T %lld S %lld pos0 %lld Hq %lld Hkv %lld D %lld%s",
             (long long)B, (long long)T, (long long)S, (long long)pos0, (long long)Hq,
             (long long)Hkv, (long long)D, kv16 ? ", bf16 cache" : "");
    oc_add(l, &c);
}

/* ---- SwiGLU: out = silu(g) u ----
 * tensors: 0 g, 1 u, 2 out, 3 dout, 4 dg, 5 du; p: n */

static void swi_fwd(oc_run *r) {
    r->be->swiglu_fwd(r->be, OCF(r, 2), OCF(r, 0), OCF(r, 1), OCP(r, 0), OCP(r, 1) == 2);
}
static void swi_bwd(oc_run *r) {
    r->be->swiglu_bwd(r->be, OCF(r, 4), OCF(r, 5), OCF(r, 3), OCF(r, 0), OCF(r, 1), OCP(r, 0),
                      !OCP(r, 1), OCP(r, 1) == 2);
}
static void swi_ref(oc_ref *r) {
    for (int64_t i = 0; i < r->c->p[0]; i++) {
        const double g = r->v[0][i];
        r->v[2][i] = g / (1.0 + exp(-g)) * r->v[1][i];
    }
}

/* write: the backward writes dg, du (accumulate = 0) instead of adding to them; 2: those and
 * the forward's out in bf16 (out_bf16) */
static void add_swiglu(oc_list *l, int64_t n, int write) {
    oc_case c = {.ops = "swiglu_fwd swiglu_bwd", .nt = 6, .p = {n, write}, .fwd = swi_fwd,
                 .ref = swi_ref, .bwd = swi_bwd,
                 /* an expf of a few ulps and a few fp32 roundings per element; in bf16, the
                  * rounding of each gradient: 2^-8 of it at most (bf16 keeps 8 significant
                  * bits; u = 2^-8 = 3.9e-3), so of the largest */
                 .tol_fwd = write == 2 ? 4e-3 : 1e-6, .tol_bwd = write == 2 ? 4e-3 : 1e-6};
    c.t[0] = (oc_tensor)OC_T_INA("g", n, 4.0f);
    c.t[1] = (oc_tensor)OC_T_INA("u", n, 2.0f);
    c.t[2] = write == 2 ? (oc_tensor)OC_T_OUT16("out", n) : (oc_tensor)OC_T_OUT("out", n);
    c.t[3] = (oc_tensor)OC_T_DOUT("dout", 2);
    c.t[4] = (oc_tensor)OC_T_DIN("dg", 0);
    c.t[5] = (oc_tensor)OC_T_DIN("du", 1);
    if (write) c.t[4].flags = c.t[5].flags = OC_WRITES | (write == 2 ? OC_DIN16 : 0);
    snprintf(c.name, sizeof c.name, "swiglu n %lld%s", (long long)n,
             write == 2 ? ", out and gradients written in bf16" : write ? ", written" : "");
    oc_add(l, &c);
}

/* ---- cross-entropy over logits [n, V] ----
 * tensors: 0 logits, 1 target, 2 loss, 3 dloss (one scalar), 4 dlogits (written);
 * p: n, V, in place (the backward on a copy of the logits in dlogits) */

static void xent_fwd_(oc_run *r) {
    r->be->xent_fwd(r->be, OCF(r, 2), OCF(r, 0), OCI(r, 1), OCP(r, 0), OCP(r, 1));
}
static void xent_bwd_(oc_run *r) {
    tz_backend *be = r->be;
    const int64_t n = OCP(r, 0), V = OCP(r, 1);
    if (OCP(r, 2)) {
        be->copy(be, OCF(r, 4), OCF(r, 0), (size_t)(n * V) * sizeof(float));
        be->xent_bwd(be, OCF(r, 4), OCF(r, 4), OCI(r, 1), r->dscal, n, V);
    } else {
        be->xent_bwd(be, OCF(r, 4), OCF(r, 0), OCI(r, 1), r->dscal, n, V);
    }
}
static void xent_ref(oc_ref *r) {
    const int64_t n = r->c->p[0], V = r->c->p[1];
    const int32_t *tgt = r->raw[1];
    for (int64_t i = 0; i < n; i++) {
        const double *x = r->v[0] + i * V;
        double m = -INFINITY, s = 0.0;
        for (int64_t j = 0; j < V; j++) m = x[j] > m ? x[j] : m;
        for (int64_t j = 0; j < V; j++) s += exp(x[j] - m);
        r->v[2][i] = tgt[i] < 0 ? 0.0 : m + log(s) - x[tgt[i]];
    }
}

static void add_xent(oc_list *l, int64_t n, int64_t V, int in_place) {
    oc_case c = {.ops = in_place ? "copy xent_fwd xent_bwd" : "xent_fwd xent_bwd", .nt = 5,
                 .p = {n, V, in_place}, .fwd = xent_fwd_, .ref = xent_ref, .bwd = xent_bwd_,
                 /* a log-sum-exp over V (in double or fp32); the softmax's exp(x - lse) takes
                  * lse's rounding (~|lse| u ~ 6e-7 relative at V 1003) and expf's few ulps */
                 .tol_fwd = 1e-6, .tol_bwd = 5e-6};
    c.t[0] = (oc_tensor)OC_T_INA("logits", n * V, 3.0f);
    /* targets in [-V, V): about half the rows ignored */
    c.t[1] = (oc_tensor)OC_T_I32("target", n, -(int)V, (int)V);
    c.t[2] = (oc_tensor)OC_T_OUT("loss", n);
    c.t[3] = (oc_tensor)OC_T_DOUT("dloss", 2);
    c.t[3].flags = OC_UNIFORM;
    c.t[4] = (oc_tensor)OC_T_DIN("dlogits", 0);
    c.t[4].flags = OC_WRITES;
    snprintf(c.name, sizeof c.name, "xent n %lld V %lld%s", (long long)n, (long long)V,
             in_place ? " in place" : "");
    oc_add(l, &c);
}

/* rope_fwd against rope_tab_fwd given theta's table in float at pos0 0: the same bits (the
 * contract of rope_tab_fwd), at positions where the float angle's rounding is large */
static int rope_same_row(tz_backend *be, const oc_case *c, char *msg, size_t len) {
    const int64_t B = c->p[0], T = c->p[1], H = c->p[2], D = c->p[3], n = B * T * H * D;
    const float theta = (float)c->s[0];
    float *h = malloc((size_t)n * 4), *a = malloc((size_t)n * 4), *b = malloc((size_t)n * 4);
    float inv[256];
    for (int64_t i = 0; i < n; i++) h[i] = (float)((i * 7919) % 2001 - 1000) / 1000.0f;
    for (int64_t i = 0; i < D / 2; i++) inv[i] = 1.0f / powf(theta, (float)(2 * i) / (float)D);
    float *x = be->alloc(be, (size_t)n * 4), *y = be->alloc(be, (size_t)n * 4);
    float *f = be->alloc(be, (size_t)(D / 2) * 4);
    be->upload(be, x, h, (size_t)n * 4);
    be->upload(be, y, h, (size_t)n * 4);
    be->upload(be, f, inv, (size_t)(D / 2) * 4);
    be->rope_fwd(be, x, B, T, H, D, theta);
    be->rope_tab_fwd(be, y, B, T, H, D, f, 0);
    be->download(be, a, x, (size_t)n * 4);
    be->download(be, b, y, (size_t)n * 4);
    be->release(be, x), be->release(be, y), be->release(be, f);
    int64_t diff = 0;
    for (int64_t i = 0; i < n; i++) diff += memcmp(&a[i], &b[i], 4) != 0;
    free(h), free(a), free(b);
    if (diff) snprintf(msg, len, "%lld of %lld elements differ", (long long)diff, (long long)n);
    return diff != 0;
}

/* rope_fwd16 against rope_fwd and to_bf16 (p[4] 1: rope_bwd16 against rope_bwd; p[5] > 0:
 * rope_tab_fwd16 or rope_tab_bwd16 against rope_tab_fwd or rope_tab_bwd, with rope_tab_freqs'
 * scaled table at pos0 p[5] - 1): the same bits, x not changed */
static int rope16_row(tz_backend *be, const oc_case *c, char *msg, size_t len) {
    const int64_t B = c->p[0], T = c->p[1], H = c->p[2], D = c->p[3], n = B * T * H * D;
    const int bwd = c->p[4] != 0, tab = c->p[5] > 0;
    const int64_t pos0 = tab ? c->p[5] - 1 : 0;
    const float theta = (float)c->s[0];
    float freqs[256], *inv = NULL;
    if (tab) {
        rope_tab_freqs(freqs, D, c->s[0]);
        inv = be->alloc(be, (size_t)(D / 2) * sizeof(float));
        be->upload(be, inv, freqs, (size_t)(D / 2) * sizeof(float));
    }
    float *h = malloc((size_t)n * 4), *kept = malloc((size_t)n * 4);
    uint16_t *a = malloc((size_t)n * 2), *b = malloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++) h[i] = (float)((i * 7919) % 2001 - 1000) / 999.0f;
    float *x = be->alloc(be, (size_t)n * 4), *y = be->alloc(be, (size_t)n * 4);
    uint16_t *y16 = be->alloc(be, (size_t)n * 2), *r16 = be->alloc(be, (size_t)n * 2);
    be->upload(be, x, h, (size_t)n * 4);
    be->upload(be, y, h, (size_t)n * 4);
    if (tab) {
        (bwd ? be->rope_tab_bwd16 : be->rope_tab_fwd16)(be, y16, x, B, T, H, D, inv, pos0);
        (bwd ? be->rope_tab_bwd : be->rope_tab_fwd)(be, y, B, T, H, D, inv, pos0);
    } else {
        (bwd ? be->rope_bwd16 : be->rope_fwd16)(be, y16, x, B, T, H, D, theta);
        (bwd ? be->rope_bwd : be->rope_fwd)(be, y, B, T, H, D, theta);
    }
    be->to_bf16(be, r16, y, n);
    be->download(be, a, y16, (size_t)n * 2);
    be->download(be, b, r16, (size_t)n * 2);
    be->download(be, kept, x, (size_t)n * 4);
    be->release(be, x), be->release(be, y), be->release(be, y16), be->release(be, r16);
    if (inv) be->release(be, inv);
    int64_t diff = 0;
    for (int64_t i = 0; i < n; i++) diff += a[i] != b[i];
    const int changed = memcmp(kept, h, (size_t)n * 4) != 0;
    free(h), free(kept), free(a), free(b);
    if (diff || changed)
        snprintf(msg, len, "%lld of %lld elements differ%s", (long long)diff, (long long)n,
                 changed ? "; x was changed" : "");
    return diff || changed;
}

void oc_cases_llama(oc_list *l) {
    oc_case r16 = {.ops = "rope_fwd16 rope_fwd to_bf16", .p = {2, 37, 3, 18}, .s = {10000.0},
                   .custom = rope16_row};
    snprintf(r16.name, sizeof r16.name,
             "rope_fwd16 = rope_fwd then to_bf16, bit for bit, x kept (B 2 T 37 H 3 D 18)");
    oc_add(l, &r16);
    oc_case b16 = {.ops = "rope_bwd16 rope_bwd to_bf16", .p = {2, 37, 3, 18, 1}, .s = {10000.0},
                   .custom = rope16_row};
    snprintf(b16.name, sizeof b16.name,
             "rope_bwd16 = rope_bwd then to_bf16, bit for bit, dx kept (B 2 T 37 H 3 D 18)");
    oc_add(l, &b16);
    for (int bwd = 0; bwd < 2; bwd++) {
        oc_case t16 = {.ops = bwd ? "alloc upload rope_tab_bwd16 rope_tab_bwd to_bf16 release"
                                  : "alloc upload rope_tab_fwd16 rope_tab_fwd to_bf16 release",
                       .p = {2, 37, 3, 18, bwd, 1 + 11}, .s = {500000.0}, .custom = rope16_row};
        snprintf(t16.name, sizeof t16.name, "rope_tab_%s16 = rope_tab_%s then to_bf16, bit for "
                 "bit, x kept (scaled table, pos0 11, B 2 T 37 H 3 D 18)", bwd ? "bwd" : "fwd",
                 bwd ? "bwd" : "fwd");
        oc_add(l, &t16);
    }
    oc_case same = {.ops = "rope_fwd rope_tab_fwd", .p = {2, 300, 2, 64}, .s = {10000.0},
                    .custom = rope_same_row};
    snprintf(same.name, sizeof same.name,
             "rope_fwd = rope_tab_fwd with theta's table, bit for bit (B 2 T 300 H 2 D 64)");
    oc_add(l, &same);
    add_embedding(l, 11, 37, 29);
    add_embedding_w16(l, 13, 37, 31);
    add_rmsnorm(l, 7, 37, 0);
    add_rmsnorm(l, 3, 515, 0); /* vector bodies and tails */
    add_rmsnorm(l, 5, 37, 1);
    add_rmsnorm_w(l, 7, 37, 0, 1);
    add_rmsnorm_w(l, 3, 515, 1, 1);
    add_rope(l, 0, 2, 37, 3, 18, 0, 10000.0);
    add_rope(l, 0, 1, 5, 2, 128, 0, 500000.0);
    add_rope(l, 1, 2, 9, 3, 18, 23, 10000.0);
    add_rope(l, 1, 1, 1, 4, 64, 1000, 500000.0); /* a decode step far into the sequence */
    add_rope(l, 1, 1, 6, 2, 10, 0, 10000.0);
    add_attention(l, 2, 45, 4, 2, 40, 1, 0); /* grouped query heads */
    add_attention(l, 1, 33, 4, 1, 72, 1, 0); /* one kv head */
    add_attention(l, 2, 21, 2, 2, 24, 0, 0); /* not causal */
    add_attention(l, 2, 1, 4, 2, 16, 1, 0);  /* one position */
    add_attention(l, 1, 70, 2, 1, 16, 1, 0);  /* two blocks of 64 query and key rows */
    add_attention(l, 1, 20, 2, 1, 136, 1, 0); /* above the device's flash head dimension */
    /* written gradients (over NaN): the flash paths, grouped and causal, and the chunked one */
    add_attention_w(l, 2, 45, 4, 2, 40, 1, 0, 1);
    add_attention_w(l, 1, 70, 2, 1, 16, 0, 0, 1);
    add_attention_w(l, 1, 20, 2, 1, 136, 1, 0, 1);
    /* at row strides: a fused projection's q, k, v; out into wider rows (16-byte rows and
     * not: the staging's vector and scalar paths), written and added; the chunked path */
    add_attention_ld(l, 2, 45, 4, 2, 40, 1, 1, 8);
    add_attention_ld(l, 1, 70, 2, 2, 18, 0, 0, 3);
    add_attention_ld(l, 2, 21, 2, 1, 16, 1, 0, 0);
    add_attention_ld(l, 1, 20, 2, 1, 136, 1, 1, 5);
    /* the CPU's blocking: several 64-row query blocks with a partial last one (the device's
     * 64-row tiles too); more than 256 keys (several GEMM tiles and K blocks: the CPU's only) */
    add_attention(l, 1, 150, 4, 2, 10, 1, 0);
    add_attention(l, 1, 150, 4, 2, 10, 0, 0);
    add_attention(l, 1, 300, 2, 1, 4, 1, 1);
    add_attention(l, 1, 300, 2, 1, 4, 0, 1);
    add_attention_cache(l, 2, 1, 40, 37, 4, 2, 40, 0); /* a decode step */
    add_attention_cache(l, 1, 7, 90, 60, 4, 1, 72, 0); /* a prefill chunk at an offset */
    add_attention_cache(l, 1, 12, 12, 0, 2, 2, 32, 0); /* pos0 0, S = T: attention_fwd's */
    add_attention_cache(l, 2, 1, 40, 37, 4, 2, 40, 1); /* the same in a bf16 cache */
    add_attention_cache(l, 1, 7, 90, 60, 4, 1, 72, 1);
    add_attention_cache(l, 1, 1, 300, 299, 2, 2, 128, 1); /* a decode step at D = 128 */
    add_swiglu(l, 1001, 0);
    add_swiglu(l, 777, 1);
    add_swiglu(l, 555, 2);
    add_xent(l, 12, 37, 0);
    add_xent(l, 9, 1003, 0);
    add_xent(l, 8, 37, 1);
}
