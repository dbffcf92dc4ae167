/* Flux forward and backward on the backend op table: the embedders, double-stream blocks
 * (two streams, one joint attention), single-stream blocks, the final layer and the squared
 * error. The residual stream of every block is [n, Tt + Ti, inner], text tokens first in each
 * sample (the order of diffusers' joint attention); a double block splits it into its two
 * streams and merges its outputs back. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/flux.h"

#define EPS 1e-6f

/* diffusers' Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=0) of 1000 t, in
 * double: [cos(1000 t f_k), sin(1000 t f_k)], f_k = exp(-ln(10000) k / 128). */
static void timestep_features(float *out, const float *t, int64_t n) {
    for (int64_t b = 0; b < n; b++)
        for (int64_t k = 0; k < 128; k++) {
            const double a = 1000.0 * (double)t[b] * exp(-log(10000.0) * (double)k / 128.0);
            out[b * 256 + k] = (float)cos(a);
            out[b * 256 + 128 + k] = (float)sin(a);
        }
}

/* The RoPE table of the T = Tt + Ti positions (text first): per position, for each axis a
 * and k < axes[a] / 2, the angle id[a] / theta^(2k / axes[a]) (double) as (cos, sin). */
static void rope_table(float *cs, const tz_flux_dims *d, const float *txt_ids,
                       const float *img_ids, int64_t Tt, int64_t Ti) {
    for (int64_t p = 0; p < Tt + Ti; p++) {
        const float *id = p < Tt ? txt_ids + p * 3 : img_ids + (p - Tt) * 3;
        float *row = cs + p * d->head_dim;
        int64_t j = 0;
        for (int a = 0; a < 3; a++)
            for (int64_t k = 0; k < d->axes[a] / 2; k++, j++) {
                const double f = 1.0 / pow(d->theta, (double)(2 * k) / (double)d->axes[a]);
                const double ang = (double)id[a] * f;
                row[2 * j] = (float)cos(ang);
                row[2 * j + 1] = (float)sin(ang);
            }
    }
}

/* ---- the two streams in the joint token order ---- */

/* src [n, T, I] -> text rows c [n*Tt, I] and image rows i [n*Ti, I]; a stream that already
 * is its slice of src (one sample: stream_rows) is not copied */
static void split(tz_backend *be, float *c, float *i, const float *src, int64_t n, int64_t Tt,
                  int64_t Ti, int64_t I) {
    const int64_t T = Tt + Ti;
    for (int64_t b = 0; b < n; b++) {
        if (c && c != src) be->copy2d(be, c + b * Tt * I, I, src + b * T * I, I, Tt, I);
        if (i && i != src + Tt * I)
            be->copy2d(be, i + b * Ti * I, I, src + (b * T + Tt) * I, I, Ti, I);
    }
}

/* text rows c and image rows i -> dst [n, T, I], the same way */
static void merge(tz_backend *be, float *dst, const float *c, const float *i, int64_t n,
                  int64_t Tt, int64_t Ti, int64_t I) {
    const int64_t T = Tt + Ti;
    for (int64_t b = 0; b < n; b++) {
        if (c != dst) be->copy2d(be, dst + b * T * I, I, c + b * Tt * I, I, Tt, I);
        if (i != dst + Tt * I)
            be->copy2d(be, dst + (b * T + Tt) * I, I, i + b * Ti * I, I, Ti, I);
    }
}

/* Where a stream's rows of the joint tensor j [n, T, I] are worked on: with one sample they are
 * a slice of j (the text's first, then the image's), used in place; else the stream's own
 * buffer, which split fills and merge empties. (A slice is a stream's rows only for n = 1:
 * with more samples each sample's text and image rows alternate.) */
static float *text_rows(const tz_flux *m, const float *j, float *own) {
    return m->n == 1 ? (float *)j : own;
}
static float *image_rows(const tz_flux *m, const float *j, float *own) {
    return m->n == 1 ? (float *)j + m->Tt * tz_flux_inner(&m->d) : own;
}

/* Per-head RMSNorm of one stream's projection x [n*Ts, I] into its rows of the joint Q (or K)
 * [n, T, I] at token offset off; r: 1/rms per (token, head). */
static void rms_into(tz_backend *be, float *Q, float *r, const float *x, const tz_param *w,
                     int64_t n, int64_t Ts, int64_t off, int64_t T, int64_t H, int64_t D) {
    const int64_t I = H * D;
    for (int64_t b = 0; b < n; b++)
        be->rmsnorm_fwd(be, Q + (b * T + off) * I, r + b * Ts * H, x + b * Ts * I, w->w, Ts * H,
                        D, EPS);
}

/* Its backward: dx from the rows of dQ (written, not added to); dw += where the weight
 * trains. */
static void rms_back(tz_backend *be, float *dx, const float *dQ, const float *x, const float *r,
                     const tz_param *w, int64_t n, int64_t Ts, int64_t off, int64_t T, int64_t H,
                     int64_t D) {
    const int64_t I = H * D;
    for (int64_t b = 0; b < n; b++)
        be->rmsnorm_bwd(be, dx + b * Ts * I, w->trainable ? w->g : NULL, dQ + (b * T + off) * I,
                        x + b * Ts * I, w->w, r + b * Ts * H, Ts * H, D, 0);
}

static tz_flux_acts *acts_of(tz_flux *m, int64_t k) { return tz_layer_stack_set(&m->stack, k); }

/* Attention's inputs as a holds them: Q and K after RoPE and V (fp32), or (att16) their
 * bf16 copies */
static void att_inputs(const tz_flux *m, const tz_flux_acts *a, const float *V,
                       const float *in[3]) {
    in[0] = m->att16 ? (const float *)(const void *)a->Q16 : a->Q;
    in[1] = m->att16 ? (const float *)(const void *)a->K16 : a->K;
    in[2] = m->att16 ? (const float *)(const void *)a->V16 : V;
}

/* The per-head RMSNorms of one stream's q and k (its Ts tokens from off in the joint T):
 * into the joint Q and K (fp32, RoPE applied by attend), or with att16 straight into Q16 and
 * K16 with RoPE, in one pass each (rms_rope_pairs16: no fp32 Q or K) */
static void qk_norms(tz_flux *m, tz_flux_acts *a, const float *q, const float *k, float *rq,
                     float *rk, const tz_param *nq, const tz_param *nk, int64_t Ts, int64_t off) {
    tz_backend *be = m->be;
    const int64_t n = m->n, T = m->Ti + m->Tt, H = m->d.heads, D = m->d.head_dim;
    if (m->att16) {
        be->rms_rope_pairs16(be, a->Q16, rq, q, nq->w, n, Ts, off, T, H, D, EPS, m->cs);
        be->rms_rope_pairs16(be, a->K16, rk, k, nk->w, n, Ts, off, T, H, D, EPS, m->cs);
    } else {
        rms_into(be, a->Q, rq, q, nq, n, Ts, off, T, H, D);
        rms_into(be, a->K, rk, k, nk, n, Ts, off, T, H, D);
    }
}

/* The joint attention into out, rows at stride ldo (a single block's go straight into the
 * first I columns of its cat, where proj_out reads them). kept (a recomputation reading
 * attention's outputs kept from the forward, tz_flux.keep): its inputs made as backward reads
 * them, attention itself not run. */
static void attend(tz_flux *m, tz_flux_acts *a, const float *V, float *out, int64_t ldo,
                   int64_t n, int64_t T, int v16_made, int kept) {
    tz_backend *be = m->be;
    const int64_t H = m->d.heads, D = m->d.head_dim;
    const float *in[3];
    if (m->att16) { /* (Q16 and K16 made by the norms, qk_norms) V rounded, unless its GEMM
                     * wrote V16 itself (v16_made) */
        if (!v16_made) be->to_bf16(be, a->V16, V, n * T * H * D);
    } else {
        be->rope_pairs_fwd(be, a->Q, n, T, H, D, m->cs);
        be->rope_pairs_fwd(be, a->K, n, T, H, D, m->cs);
    }
    if (kept) return;
    att_inputs(m, a, V, in);
    const tz_att_ld ld = {0, 0, ldo, m->att16, 0};
    be->att_ws = m->att_ws, be->att_ws_bytes = m->att_ws_bytes;
    be->attention_fwd(be, out, a->lse, in[0], in[1], in[2], n, T, H, H, D, 0, &ld);
}

/* ---- forward ---- */

/* One stream's half of a double block after the attention: x2 = x + gate_msa * ao, then
 * y = x2 + gate_mlp * ff(modulate(LN(x2))). mod: the stream's six chunks. */
static void stream_mlp_fwd(tz_flux *m, const tz_linear *ff1, const tz_linear *ff2, float **lh1,
                           float **lh2, const float *mod, const float *x, const float *ao,
                           float *x2, float *ln2, float *mean2, float *rstd2, float *h2, float *f,
                           float *mo, float *y, int64_t Ts) {
    tz_backend *be = m->be;
    float *g = m->wide1; /* the GELU output: recomputed from f by the backward */
    const int64_t n = m->n, I = tz_flux_inner(&m->d), M = 6 * I, R = n * Ts;
    be->gate_fwd(be, x2, x, ao, mod + 2 * I, M, n, Ts, I);
    be->layernorm_fwd(be, ln2, mean2, rstd2, x2, R, I, EPS);
    be->modulate_fwd(be, h2, ln2, mod + 3 * I, mod + 4 * I, M, n, Ts, I, 0);
    /* f in bf16 where ff1's GEMM can write it so (GELU reads it widened, here and in the
     * backward: tz_linear_fwd_writes_y16 decides both) */
    const int f16 = tz_linear_fwd_writes_y16(be, ff1, R);
    tz_linear_fwd16(be, ff1, f, *lh1, h2, R, f16);
    be->gelu_tanh_fwd(be, g, f, R * tz_flux_mlp(&m->d), 0, 0, f16 ? TZ_GELU_X16 : 0);
    tz_linear_fwd(be, ff2, mo, *lh2, g, R);
    be->gate_fwd(be, y, x2, mo, mod + 5 * I, M, n, Ts, I);
}

static void double_fwd(tz_flux *m, const tz_flux_block *blk, tz_flux_acts *a, const float *x,
                       float *out, int kept) {
    tz_backend *be = m->be;
    const tz_flux_dims *d = &m->d;
    const int64_t n = m->n, Ti = m->Ti, Tt = m->Tt, T = Ti + Tt, I = tz_flux_inner(d);
    const int64_t M = 6 * I, Bi = n * Ti, Bc = n * Tt;
    const tz_linear *L = blk->lin;
    /* the streams: the block input's rows (slices of it with one sample, copies else), the
     * joint V and the attention's output likewise, and the outputs written into out */
    float *xc = text_rows(m, x, a->xc), *xi = image_rows(m, x, a->xi);
    float *vc = text_rows(m, a->V, a->vc), *vi = image_rows(m, a->V, a->vi);
    float *attc = text_rows(m, a->att, a->attc), *atti = image_rows(m, a->att, a->atti);
    float *yc = text_rows(m, out, m->yc), *yi_ = image_rows(m, out, m->yi);
    split(be, xc, xi, x, n, Tt, Ti, I);
    tz_linear_fwd(be, &L[TZ_FLUX_NORM1], a->modi, a->lh[TZ_FLUX_NORM1], m->sc, n);
    tz_linear_fwd(be, &L[TZ_FLUX_NORM1C], a->modc, a->lh[TZ_FLUX_NORM1C], m->sc, n);
    be->layernorm_fwd(be, a->ln1i, a->mean1i, a->rstd1i, xi, Bi, I, EPS);
    be->modulate_fwd(be, a->h1i, a->ln1i, a->modi, a->modi + I, M, n, Ti, I, 0);
    be->layernorm_fwd(be, a->ln1c, a->mean1c, a->rstd1c, xc, Bc, I, EPS);
    be->modulate_fwd(be, a->h1c, a->ln1c, a->modc, a->modc + I, M, n, Tt, I, 0);
    /* each stream's q, k, v read one input: rotated (and rounded) once for the three */
    const tz_linear *qkvi[3] = {&L[TZ_FLUX_Q], &L[TZ_FLUX_K], &L[TZ_FLUX_V]};
    const tz_linear *qkvc[3] = {&L[TZ_FLUX_AQ], &L[TZ_FLUX_AK], &L[TZ_FLUX_AV]};
    float *pi[3] = {a->qi, a->ki, vi}, *pc[3] = {a->qc, a->kc, vc};
    tz_linear_fwd_shared(be, qkvi, pi, a->lh + TZ_FLUX_Q, 3, a->h1i, Bi);
    tz_linear_fwd_shared(be, qkvc, pc, a->lh + TZ_FLUX_AQ, 3, a->h1c, Bc);
    qk_norms(m, a, a->qc, a->kc, a->rqc, a->rkc, blk->naq, blk->nak, Tt, 0);
    qk_norms(m, a, a->qi, a->ki, a->rqi, a->rki, blk->nq, blk->nk, Ti, Tt);
    merge(be, a->V, vc, vi, n, Tt, Ti, I);
    attend(m, a, a->V, a->att, 0, n, T, 0, kept);
    split(be, attc, atti, a->att, n, Tt, Ti, I);
    tz_linear_fwd(be, &L[TZ_FLUX_OUT], a->aoi, a->lh[TZ_FLUX_OUT], atti, Bi);
    tz_linear_fwd(be, &L[TZ_FLUX_AOUT], a->aoc, a->lh[TZ_FLUX_AOUT], attc, Bc);
    stream_mlp_fwd(m, &L[TZ_FLUX_FF1], &L[TZ_FLUX_FF2], &a->lh[TZ_FLUX_FF1], &a->lh[TZ_FLUX_FF2],
                   a->modi, xi, a->aoi, a->x2i, a->ln2i, a->mean2i, a->rstd2i, a->h2i, a->fi,
                   a->moi, yi_, Ti);
    stream_mlp_fwd(m, &L[TZ_FLUX_CFF1], &L[TZ_FLUX_CFF2], &a->lh[TZ_FLUX_CFF1],
                   &a->lh[TZ_FLUX_CFF2], a->modc, xc, a->aoc, a->x2c, a->ln2c, a->mean2c,
                   a->rstd2c, a->h2c, a->fc, a->moc, yc, Tt);
    merge(be, out, yc, yi_, n, Tt, Ti, I);
}

/* Whether a single block's MLP and q, k, v, which read one input, write their outputs in
 * bf16 on the shared path (tz_linear_shared_y16): fi for the GELU (and V for attention) */
static int single_f16(const tz_flux *m, const tz_flux_block *blk) {
    const tz_linear *L = blk->lin;
    const tz_linear *in4[4] = {&L[TZ_FLUX_MLP], &L[TZ_FLUX_Q], &L[TZ_FLUX_K], &L[TZ_FLUX_V]};
    return tz_linear_shared_y16(m->be, in4, 4, m->n * (m->Ti + m->Tt));
}

/* kept: backward's recomputation, with the attention's output kept from the forward in
 * `att` (tz_flux.keep), copied into cat; else (att not NULL) the forward's copied from cat
 * into att for the recomputation */
static void single_fwd(tz_flux *m, const tz_flux_block *blk, tz_flux_acts *a, const float *x,
                       float *out, int kept, float *att) {
    tz_backend *be = m->be;
    const tz_flux_dims *d = &m->d;
    const int64_t n = m->n, T = m->Ti + m->Tt, BT = n * T, I = tz_flux_inner(d);
    const int64_t F = tz_flux_mlp(d), M = 3 * I;
    const tz_linear *L = blk->lin;
    tz_linear_fwd(be, &L[TZ_FLUX_NORM], a->modi, a->lh[TZ_FLUX_NORM], m->sc, n);
    be->layernorm_fwd(be, a->ln1i, a->mean1i, a->rstd1i, x, BT, I, EPS);
    be->modulate_fwd(be, a->h1i, a->ln1i, a->modi, a->modi + I, M, n, T, I, 0);
    /* the MLP's first linear and q, k, v read one input: rotated (and rounded) once */
    const tz_linear *in4[4] = {&L[TZ_FLUX_MLP], &L[TZ_FLUX_Q], &L[TZ_FLUX_K], &L[TZ_FLUX_V]};
    /* where the shared path can, the MLP's hidden fi in bf16 by its GEMM (GELU reads it
     * widened, here and in the backward: single_f16) and, with att16, V straight into bf16
     * (the bits to_bf16 makes of its fp32 output on the emulation: attention alone reads it) */
    const int f16 = single_f16(m, blk), v16 = m->att16 && f16;
    float *y4[4] = {a->fi, a->qi, a->ki, v16 ? (float *)(void *)a->V16 : a->vi};
    float *h4[4] = {a->lh[TZ_FLUX_MLP], a->lh[TZ_FLUX_Q], a->lh[TZ_FLUX_K], a->lh[TZ_FLUX_V]};
    tz_linear_fwd_shared16(be, in4, y4, h4, 4, a->h1i, BT, (f16 ? 1 : 0) | (v16 ? 8 : 0));
    /* the GELU output straight into the second part of cat, where proj_out reads it */
    be->gelu_tanh_fwd(be, a->cat + I, a->fi, BT * F, F, I + F, f16 ? TZ_GELU_X16 : 0);
    qk_norms(m, a, a->qi, a->ki, a->rqi, a->rki, blk->nq, blk->nk, T, 0);
    attend(m, a, a->vi, a->cat, I + F, n, T, v16, kept);
    if (kept) be->copy2d(be, a->cat, I + F, att, I, BT, I);
    else if (att) be->copy2d(be, att, I, a->cat, I + F, BT, I);
    tz_linear_fwd(be, &L[TZ_FLUX_POUT], a->o, a->lh[TZ_FLUX_POUT], a->cat, BT);
    be->gate_fwd(be, out, x, a->o, a->modi + 2 * I, M, n, T, I);
}

/* Block k; with tz_flux.keep, its attention output and lse in their buffer (bwd: a backward
 * follows, which will read them; kept: backward's recomputation, which does) */
static void block_fwd(tz_flux *m, int64_t k, const float *x, float *out, int bwd, int kept) {
    tz_flux_acts *a = acts_of(m, k);
    float *att = NULL;
    if (m->keep.on) {
        const int i = tz_att_keep_take(&m->keep, k);
        a->lse = m->keep.lse2[i];
        if (k < m->d.layers) a->att = m->keep.att2[i];
        else if ((bwd && k < m->d.layers + m->d.single_layers - 1) || kept)
            att = m->keep.att2[i]; /* (the last block is not recomputed) */
    }
    if (k < m->d.layers) double_fwd(m, &m->blocks[k], a, x, out, kept);
    else single_fwd(m, &m->blocks[k], a, x, out, kept, att);
}

/* One embedder: out = lin2(silu(lin1(in))) (+= when add), hidden h, its silu s. */
static void embed(tz_flux *m, const tz_linear *l1, const tz_linear *l2, const float *in, float *h,
                  float *s, float *out, int add) {
    tz_backend *be = m->be;
    const int64_t n = m->n, I = tz_flux_inner(&m->d);
    tz_linear_fwd(be, l1, h, NULL, in, n);
    be->silu_fwd(be, s, h, n * I);
    if (!add) {
        tz_linear_fwd(be, l2, out, NULL, s, n);
        return;
    }
    tz_linear_fwd(be, l2, m->fmod, NULL, s, n); /* fmod is free until the final layer */
    be->axpy(be, out, 1.0f, m->fmod, n * I);
}

/* The forward; bwd: a backward follows (with tz_flux.keep, the blocks' attention outputs are
 * kept for it) */
static void forward_body(tz_flux *m, const tz_flux_batch *in, int bwd) {
    tz_backend *be = m->be;
    const tz_flux_dims *d = &m->d;
    if (!m->arena.base) TZ_FATAL("flux: tz_flux_setup was not called");
    const int64_t n = m->n, Ti = m->Ti, Tt = m->Tt, T = Ti + Tt, I = tz_flux_inner(d);
    const int64_t Bi = n * Ti, Bc = n * Tt, L = d->layers + d->single_layers;
    be->upload(be, m->xt, in->x_t, (size_t)(Bi * d->in_channels) * sizeof(float));
    be->upload(be, m->txt, in->txt, (size_t)(Bc * d->joint_dim) * sizeof(float));
    be->upload(be, m->pooled, in->pooled, (size_t)(n * d->pooled_dim) * sizeof(float));
    timestep_features(m->feat_host, in->sigma, n);
    be->upload(be, m->tfeat, m->feat_host, (size_t)(n * 256) * sizeof(float));
    if (d->guidance) {
        timestep_features(m->feat_host + n * 256, in->guidance, n);
        be->upload(be, m->gfeat, m->feat_host + n * 256, (size_t)(n * 256) * sizeof(float));
    }
    rope_table(m->cs_host, d, in->txt_ids, in->img_ids, Tt, Ti);
    be->upload(be, m->cs, m->cs_host, (size_t)(T * d->head_dim) * sizeof(float));
    /* the two streams, merged into the first residual stream; each stage's trainable
     * weights as the pass reaches them (the optimizer's uploads of later blocks may still be
     * on their way) */
    tz_params_weights_needed(&m->params, (int)L + 1);
    tz_layer_stack *st = &m->stack;
    float *h0 = tz_layer_stack_out(st, 0);
    float *hc = text_rows(m, h0, m->hc), *hi = image_rows(m, h0, m->hi);
    tz_linear_fwd(be, &m->x_emb, hi, NULL, m->xt, Bi);
    tz_linear_fwd(be, &m->ctx_emb, hc, NULL, m->txt, Bc);
    merge(be, h0, hc, hi, n, Tt, Ti, I);
    tz_layer_stack_put(st, be, 0);
    /* conditioning: timestep + guidance + pooled text; every adaLN reads silu of it */
    embed(m, &m->t1, &m->t2, m->tfeat, m->th, m->ts, m->temb, 0);
    if (d->guidance) embed(m, &m->g1, &m->g2, m->gfeat, m->gh, m->gs, m->temb, 1);
    embed(m, &m->p1, &m->p2, m->pooled, m->ph, m->pss, m->temb, 1);
    be->silu_fwd(be, m->sc, m->temb, n * I);
    for (int64_t k = 0; k < L; k++) {
        tz_wstream_use(&m->ws, k, k + 1 < L ? k + 1 : -1);
        tz_params_weights_needed(&m->params, (int)(L - k));
        block_fwd(m, k, tz_layer_stack_in(st, be, k), tz_layer_stack_out(st, k + 1), bwd, 0);
        if (m->keep.on && bwd) /* to the host (the first L - 2 blocks') */
            tz_att_keep_copy(&m->keep, k, 1, n * T * I, n * T * d->heads);
        tz_wstream_done(&m->ws, k);
        tz_layer_stack_put(st, be, k + 1);
    }
    /* the final layer on the image tokens: scale, shift = chunk(2) (scale first) */
    tz_params_weights_needed(&m->params, 0);
    split(be, NULL, m->fx, tz_layer_stack_in(st, be, L), n, Tt, Ti, I);
    tz_linear_fwd(be, &m->norm_out, m->fmod, m->f_lh, m->sc, n);
    be->layernorm_fwd(be, m->fln, m->fmean, m->frstd, m->fx, Bi, I, EPS);
    be->modulate_fwd(be, m->fh, m->fln, m->fmod + I, m->fmod, 2 * I, n, Ti, I, 0);
    tz_linear_fwd(be, &m->proj_out, m->pred, NULL, m->fh, Bi);
}

void tz_flux_forward(tz_flux *m, const tz_flux_batch *in) { forward_body(m, in, 0); }

/* The target into backend memory, before the forward pass (an upload waits for the compute
 * queue: here it has nothing to wait for). */
static void target_up(tz_flux *m, const float *target) {
    const int64_t n = m->n, per = m->Ti * m->d.out_channels;
    m->be->upload(m->be, m->target, target, (size_t)(n * per) * sizeof(float));
}

/* Per sample, the SSE of the prediction against the target, sent to the host on the copy
 * queue after the forward pass's work without the host waiting for it (backward is queued
 * at once); loss_sum waits and adds (done: loss_send's event). */
static void *loss_send(tz_flux *m) {
    tz_backend *be = m->be;
    const int64_t n = m->n, per = m->Ti * m->d.out_channels;
    be->mse_fwd(be, m->sse, m->pred, per, m->target, n, per);
    return tz_model_send_host(be, m->sse_host, m->sse, (size_t)n * sizeof(float));
}

static double loss_sum(tz_flux *m, void *done) {
    tz_model_received(m->be, done);
    double s = 0.0;
    for (int64_t b = 0; b < m->n; b++) s += m->sse_host[b];
    return s;
}

double tz_flux_forward_loss(tz_flux *m, const tz_flux_batch *in, const float *target) {
    target_up(m, target);
    tz_flux_forward(m, in);
    return loss_sum(m, loss_send(m));
}

/* ---- backward ---- */

/* tz_linear_bwd_set from a dy its op wrote in mode (tz_linear_dy_mode) */
static void lin_bwd_set(tz_backend *be, const tz_linear *l, int mode, float *dx, const float *dy,
                        const float *x, const float *h, float *scratch, int64_t n) {
    const uint16_t *d16 = mode == 2 ? (const uint16_t *)(const void *)dy : NULL;
    tz_linear_bwd_set16(be, l, dx, d16 ? NULL : dy, d16, x, h, scratch, n);
}

/* One stream's half of a double block backward, from dy = dL/dy (the stream's output); on
 * return dy holds dL/dx2 and d_att its attention output's gradient (written). */
static void stream_mlp_bwd(tz_flux *m, const tz_linear *ff1, const tz_linear *ff2,
                           const tz_linear *out_proj, float *const *lh1, float *const *lh2,
                           float *const *lho, const float *mod, float *dmod, float *dy,
                           const float *att, const float *ao, const float *x2, const float *ln2,
                           const float *mean2, const float *rstd2, const float *h2, const float *f,
                           const float *mo, float *d_att, int64_t Ts) {
    tz_backend *be = m->be;
    const int64_t n = m->n, I = tz_flux_inner(&m->d), F = tz_flux_mlp(&m->d), M = 6 * I;
    const int64_t R = n * Ts;
    /* the GELU output again (the forward's op on the same f: the same values), then its
     * gradient; the pre-GELU gradient takes the GELU output's place once that is read. Only
     * ff2's backward GEMMs read that output (its weight's and adapter's gradients; its dx
     * goes through the weight): where they round it to bf16, the GELU writes it so (the same
     * bits, without an fp32 write and a rounding pass) */
    float *g = m->wide0, *dg = m->wide1, *df = m->wide0;
    const int g16 = tz_linear_rounds_bf16(be), g_read = tz_linear_bwd_reads_x(ff2);
    const int fx = tz_linear_fwd_writes_y16(be, ff1, R) ? TZ_GELU_X16 : 0; /* f as kept */
    if (g_read) /* (else nothing reads it) */
        be->gelu_tanh_fwd(be, g, f, R * F, 0, 0, (g16 ? TZ_GELU_OUT16 : 0) | fx);
    /* y = x2 + gate_mlp * mo */
    /* each activation gradient written by the op that first makes it: no zeroing */
    const int m2 = tz_linear_dy_mode(be, ff2), m1 = tz_linear_dy_mode(be, ff1);
    const int mo_ = tz_linear_dy_mode(be, out_proj);
    be->gate_bwd(be, m->dc, dmod + 5 * I, dy, mo, mod + 5 * I, M, n, Ts, I, m2);
    if (!g_read) {
        lin_bwd_set(be, ff2, m2, dg, m->dc, NULL, *lh2, m->dlora, R);
    } else if (g16) {
        const uint16_t *dc16 = m2 == 2 ? (const uint16_t *)(const void *)m->dc : NULL;
        tz_linear_bwd_set_x16(be, ff2, dg, dc16 ? NULL : m->dc, dc16,
                              (const uint16_t *)(const void *)g, *lh2, m->dlora, R);
    } else {
        lin_bwd_set(be, ff2, m2, dg, m->dc, g, *lh2, m->dlora, R);
    }
    be->gelu_tanh_bwd(be, df, dg, f, R * F, m1 | fx, 0, 0);
    lin_bwd_set(be, ff1, m1, m->da, df, h2, *lh1, m->dlora, R);
    be->modulate_bwd(be, m->db, dmod + 3 * I, dmod + 4 * I, m->da, ln2, mod + 4 * I, M, n, Ts, I,
                     0);
    be->layernorm_bwd(be, dy, m->db, x2, mean2, rstd2, R, I); /* dy: now dL/dx2 */
    /* x2 = x + gate_msa * ao, ao = out_proj(att) */
    be->gate_bwd(be, m->dc, dmod + 2 * I, dy, ao, mod + 2 * I, M, n, Ts, I, mo_);
    lin_bwd_set(be, out_proj, mo_, d_att, m->dc, att, *lho, m->dlora, R);
}

/* One stream's input side backward: dL/dh1 from its q, k, v gradients, then through the
 * modulation and LN into dy (dL/dx2 on entry: the residual), dmod's first two chunks. */
static void stream_in_bwd(tz_flux *m, const tz_linear *lq, const tz_linear *lk,
                          const tz_linear *lv, float *const *lhq, float *const *lhk,
                          float *const *lhv, const float *dq, const float *dk, const float *dv,
                          const float *h1, const float *ln1, const float *mean1,
                          const float *rstd1, const float *x, const float *mod, float *dmod,
                          float *dy, int64_t Ts) {
    tz_backend *be = m->be;
    const int64_t n = m->n, I = tz_flux_inner(&m->d), R = n * Ts, M = 6 * I;
    const tz_linear *ls[3] = {lq, lk, lv};
    const float *dys[3] = {dq, dk, dv}, *hs[3] = {*lhq, *lhk, *lhv};
    tz_linear_bwd_shared(be, ls, 3, m->da, dys, h1, hs, m->dlora, R, 1); /* da written */
    be->modulate_bwd(be, m->db, dmod, dmod + I, m->da, ln1, mod + I, M, n, Ts, I, 0);
    be->layernorm_bwd(be, dy, m->db, x, mean1, rstd1, R, I); /* dy: now dL/dx */
}

/* Its backward: out and dout rows at stride ldo (a single block's in its cat and dcat). */
static void attend_bwd(tz_flux *m, tz_flux_acts *a, const float *V, const float *out,
                       const float *dout, int64_t ldo, int64_t n, int64_t T) {
    tz_backend *be = m->be;
    const int64_t H = m->d.heads, D = m->d.head_dim;
    const tz_att_ld ld = {0, 0, ldo, m->att16, 0};
    const float *in[3];
    att_inputs(m, a, V, in);
    be->att_ws = m->att_ws, be->att_ws_bytes = m->att_ws_bytes;
    be->attention_bwd(be, m->dQ, m->dK, m->dV, dout, out, a->lse, in[0], in[1], in[2], n, T, H,
                      H, D, 0, 0, &ld); /* dQ, dK, dV written */
    be->rope_pairs_bwd(be, m->dQ, n, T, H, D, m->cs);
    be->rope_pairs_bwd(be, m->dK, n, T, H, D, m->cs);
}

/* m->dres: dL/d(block output) on entry, dL/d(block input) on return; x: the block's input. */
static void double_bwd(tz_flux *m, const tz_flux_block *blk, tz_flux_acts *a, const float *x) {
    tz_backend *be = m->be;
    const tz_flux_dims *d = &m->d;
    const int64_t n = m->n, Ti = m->Ti, Tt = m->Tt, T = Ti + Tt, I = tz_flux_inner(d);
    const int64_t H = d->heads, D = d->head_dim, M = 6 * I;
    const tz_linear *L = blk->lin;
    /* the streams' rows as the forward took them (text_rows, image_rows), and their
     * gradients in dres, datt and dV likewise: in place with one sample */
    const float *xc = text_rows(m, x, a->xc), *xi = image_rows(m, x, a->xi);
    const float *attc = text_rows(m, a->att, a->attc), *atti = image_rows(m, a->att, a->atti);
    float *dyc = text_rows(m, m->dres, m->dyc), *dyi = image_rows(m, m->dres, m->dyi);
    float *dattc = text_rows(m, m->datt, m->dqc), *datti = image_rows(m, m->datt, m->dd);
    float *dvc = text_rows(m, m->dV, m->dvc), *dvi = image_rows(m, m->dV, m->dvi);
    split(be, dyc, dyi, m->dres, n, Tt, Ti, I);
    be->fill(be, m->dmodi, 0.0f, n * M);
    be->fill(be, m->dmodc, 0.0f, n * M);
    stream_mlp_bwd(m, &L[TZ_FLUX_FF1], &L[TZ_FLUX_FF2], &L[TZ_FLUX_OUT], &a->lh[TZ_FLUX_FF1],
                   &a->lh[TZ_FLUX_FF2], &a->lh[TZ_FLUX_OUT], a->modi, m->dmodi, dyi, atti,
                   a->aoi, a->x2i, a->ln2i, a->mean2i, a->rstd2i, a->h2i, a->fi, a->moi, datti,
                   Ti);
    stream_mlp_bwd(m, &L[TZ_FLUX_CFF1], &L[TZ_FLUX_CFF2], &L[TZ_FLUX_AOUT],
                   &a->lh[TZ_FLUX_CFF1], &a->lh[TZ_FLUX_CFF2], &a->lh[TZ_FLUX_AOUT], a->modc,
                   m->dmodc, dyc, attc, a->aoc, a->x2c, a->ln2c, a->mean2c, a->rstd2c,
                   a->h2c, a->fc, a->moc, dattc, Tt);
    merge(be, m->datt, dattc, datti, n, Tt, Ti, I);
    attend_bwd(m, a, a->V, a->att, m->datt, 0, n, T);
    split(be, dvc, dvi, m->dV, n, Tt, Ti, I);
    rms_back(be, m->dqc, m->dQ, a->qc, a->rqc, blk->naq, n, Tt, 0, T, H, D);
    rms_back(be, m->dqi, m->dQ, a->qi, a->rqi, blk->nq, n, Ti, Tt, T, H, D);
    rms_back(be, m->dkc, m->dK, a->kc, a->rkc, blk->nak, n, Tt, 0, T, H, D);
    rms_back(be, m->dki, m->dK, a->ki, a->rki, blk->nk, n, Ti, Tt, T, H, D);
    stream_in_bwd(m, &L[TZ_FLUX_Q], &L[TZ_FLUX_K], &L[TZ_FLUX_V], &a->lh[TZ_FLUX_Q],
                  &a->lh[TZ_FLUX_K], &a->lh[TZ_FLUX_V], m->dqi, m->dki, dvi, a->h1i, a->ln1i,
                  a->mean1i, a->rstd1i, xi, a->modi, m->dmodi, dyi, Ti);
    stream_in_bwd(m, &L[TZ_FLUX_AQ], &L[TZ_FLUX_AK], &L[TZ_FLUX_AV], &a->lh[TZ_FLUX_AQ],
                  &a->lh[TZ_FLUX_AK], &a->lh[TZ_FLUX_AV], m->dqc, m->dkc, dvc, a->h1c,
                  a->ln1c, a->mean1c, a->rstd1c, xc, a->modc, m->dmodc, dyc, Tt);
    float *dsc = m->cond_trainable ? m->dsc : NULL;
    tz_linear_bwd(be, &L[TZ_FLUX_NORM1], dsc, m->dmodi, m->sc, a->lh[TZ_FLUX_NORM1], m->dlora, n);
    tz_linear_bwd(be, &L[TZ_FLUX_NORM1C], dsc, m->dmodc, m->sc, a->lh[TZ_FLUX_NORM1C], m->dlora,
                  n);
    merge(be, m->dres, dyc, dyi, n, Tt, Ti, I);
}

static void single_bwd(tz_flux *m, const tz_flux_block *blk, tz_flux_acts *a, const float *x) {
    tz_backend *be = m->be;
    const tz_flux_dims *d = &m->d;
    const int64_t n = m->n, T = m->Ti + m->Tt, BT = n * T, I = tz_flux_inner(d);
    const int64_t F = tz_flux_mlp(d), H = d->heads, D = d->head_dim, M = 3 * I;
    const tz_linear *L = blk->lin;
    be->fill(be, m->dmodi, 0.0f, n * M);
    /* out = x + gate * proj_out([att, gelu(proj_mlp(h))]) */
    const int mp = tz_linear_dy_mode(be, &L[TZ_FLUX_POUT]);
    const int mm = tz_linear_dy_mode(be, &L[TZ_FLUX_MLP]);
    be->gate_bwd(be, m->dc, m->dmodi + 2 * I, m->dres, a->o, a->modi + 2 * I, M, n, T, I, mp);
    /* d[att, gelu] in wide0, both parts read where they are: the attention's dout (the first
     * I columns) and the GELU's (the rest), whose input gradient goes to wide1 */
    float *dcat = m->wide0, *df = m->wide1;
    lin_bwd_set(be, &L[TZ_FLUX_POUT], mp, dcat, m->dc, a->cat, a->lh[TZ_FLUX_POUT], m->dlora, BT);
    attend_bwd(m, a, a->vi, a->cat, dcat, I + F, n, T);
    be->gelu_tanh_bwd(be, df, dcat + I, a->fi, BT * F, mm | (single_f16(m, blk) ? TZ_GELU_X16 : 0),
                      F, I + F);
    lin_bwd_set(be, &L[TZ_FLUX_MLP], mm, m->da, df, a->h1i, a->lh[TZ_FLUX_MLP], m->dlora, BT);
    be->rmsnorm_bwd(be, m->dqi, blk->nq->trainable ? blk->nq->g : NULL, m->dQ, a->qi, blk->nq->w,
                    a->rqi, BT * H, D, 0); /* written */
    be->rmsnorm_bwd(be, m->dki, blk->nk->trainable ? blk->nk->g : NULL, m->dK, a->ki, blk->nk->w,
                    a->rki, BT * H, D, 0);
    const tz_linear *qkv[3] = {&L[TZ_FLUX_Q], &L[TZ_FLUX_K], &L[TZ_FLUX_V]};
    const float *dqkv[3] = {m->dqi, m->dki, m->dV};
    const float *lqkv[3] = {a->lh[TZ_FLUX_Q], a->lh[TZ_FLUX_K], a->lh[TZ_FLUX_V]};
    tz_linear_bwd_shared(be, qkv, 3, m->da, dqkv, a->h1i, lqkv, m->dlora, BT, 0);
    be->modulate_bwd(be, m->db, m->dmodi, m->dmodi + I, m->da, a->ln1i, a->modi + I, M, n, T, I,
                     0);
    be->layernorm_bwd(be, m->dres, m->db, x, a->mean1i, a->rstd1i, BT, I);
    tz_linear_bwd(be, &L[TZ_FLUX_NORM], m->cond_trainable ? m->dsc : NULL, m->dmodi, m->sc,
                  a->lh[TZ_FLUX_NORM], m->dlora, n);
}

/* One embedder backward from dout: dL/d its weights (where they train). */
static void embed_bwd(tz_flux *m, const tz_linear *l1, const tz_linear *l2, const float *in,
                      const float *h, const float *s, const float *dout) {
    tz_backend *be = m->be;
    const int64_t n = m->n, I = tz_flux_inner(&m->d);
    tz_linear_bwd_set(be, l2, m->dts, dout, s, NULL, m->dlora, n);
    be->silu_bwd(be, m->dth, m->dts, h, n * I, 0);
    tz_linear_bwd(be, l1, NULL, m->dth, in, NULL, m->dlora, n);
}

double tz_flux_forward_backward(tz_flux *m, const tz_flux_batch *in, const float *target,
                                float dloss) {
    tz_backend *be = m->be;
    const tz_flux_dims *d = &m->d;
    const int64_t n = m->n, Ti = m->Ti, Tt = m->Tt, T = Ti + Tt, I = tz_flux_inner(d);
    const int64_t Bi = n * Ti, Bc = n * Tt, L = d->layers + d->single_layers;
    const int64_t per = Ti * d->out_channels;
    if (m->o.forward_only) TZ_FATAL("flux: built for forward passes only (no backward buffers)");
    target_up(m, target);
    forward_body(m, in, 1);
    void *loss_done = loss_send(m);
    tz_params_backward_begins(&m->params);
    /* the final layer */
    be->fill(be, m->dpred, 0.0f, n * per);
    be->mse_bwd(be, m->dpred, m->pred, per, m->target, dloss, n, per);
    tz_linear_bwd_set(be, &m->proj_out, m->da, m->dpred, m->fh, NULL, m->dlora, Bi);
    be->fill(be, m->dmodi, 0.0f, n * 2 * I);
    be->modulate_bwd(be, m->db, m->dmodi + I, m->dmodi, m->da, m->fln, m->fmod, 2 * I, n, Ti, I, 0);
    /* dres: 0 on the text rows, the final layer's dx on the image rows (added into zeros) */
    float *dfx = image_rows(m, m->dres, m->dyi);
    be->fill(be, m->dres, 0.0f, n * T * I);
    if (dfx == m->dyi) be->fill(be, m->dyi, 0.0f, Bi * I);
    be->layernorm_bwd(be, dfx, m->db, m->fx, m->fmean, m->frstd, Bi, I);
    if (dfx == m->dyi)
        for (int64_t b = 0; b < n; b++)
            be->copy2d(be, m->dres + (b * T + Tt) * I, I, m->dyi + b * Ti * I, I, Ti, I);
    be->fill(be, m->dsc, 0.0f, n * I);
    tz_linear_bwd(be, &m->norm_out, m->cond_trainable ? m->dsc : NULL, m->dmodi, m->sc, m->f_lh,
                  m->dlora, n);
    tz_params_stage_done(&m->params, 0);
    for (int64_t k = L - 1; k >= 0; k--) {
        const float *x = tz_layer_stack_in(&m->stack, be, k);
        tz_wstream_use(&m->ws, k, k - 1);
        /* block k - 1's kept attention outputs on their way back while this one runs */
        if (m->keep.on) tz_att_keep_copy(&m->keep, k - 1, 0, n * T * I, n * T * d->heads);
        if (tz_layer_stack_recompute(&m->stack, k)) block_fwd(m, k, x, m->dc, 0, m->keep.on);
        if (k < d->layers) double_bwd(m, &m->blocks[k], acts_of(m, k), x);
        else single_bwd(m, &m->blocks[k], acts_of(m, k), x);
        tz_wstream_done(&m->ws, k);
        tz_params_stage_done(&m->params, (int)(L - k));
    }
    /* the embedders */
    float *dyc = text_rows(m, m->dres, m->dyc), *dyi = image_rows(m, m->dres, m->dyi);
    split(be, dyc, dyi, m->dres, n, Tt, Ti, I);
    tz_linear_bwd(be, &m->x_emb, NULL, dyi, m->xt, NULL, m->dlora, Bi);
    tz_linear_bwd(be, &m->ctx_emb, NULL, dyc, m->txt, NULL, m->dlora, Bc);
    if (m->cond_trainable) {
        be->silu_bwd(be, m->dtemb, m->dsc, m->temb, n * I, 0);
        embed_bwd(m, &m->t1, &m->t2, m->tfeat, m->th, m->ts, m->dtemb);
        if (d->guidance) embed_bwd(m, &m->g1, &m->g2, m->gfeat, m->gh, m->gs, m->dtemb);
        embed_bwd(m, &m->p1, &m->p2, m->pooled, m->ph, m->pss, m->dtemb);
    }
    tz_params_stage_done(&m->params, (int)L + 1);
    return loss_sum(m, loss_done);
}
