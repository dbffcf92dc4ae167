/* DiT forward and backward on the backend op table: embedders, adaLN-Zero blocks (saved or
 * recomputed activations), final layer, squared-error loss. No diffusion maths (noise,
 * schedules, samplers: diffusion.c) and no file formats (dit_io.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/dit.h"

/* DiT's TimestepEmbedder.timestep_embedding, in double: [cos(t f_k), sin(t f_k)], f_k =
 * exp(-ln(10000) k / half), k < half = freq_dim / 2. */
static void timestep_features(float *out, const float *t, int64_t n, int64_t dim) {
    const int64_t half = dim / 2;
    for (int64_t b = 0; b < n; b++)
        for (int64_t k = 0; k < half; k++) {
            double a = (double)t[b] * exp(-log(10000.0) * (double)k / (double)half);
            out[b * dim + k] = (float)cos(a);
            out[b * dim + half + k] = (float)sin(a);
        }
}

/* ---- forward ---- */

/* A block linear's forward on its input x as the op before wrote it: fp32, or (m->x16) bf16
 * bit patterns, rounded as the GEMMs would round the fp32 x, so the same bits either way. */
static void lin_fwd(tz_dit *m, const tz_linear *l, float *y, float *h, const float *x,
                    int64_t rows) {
    if (m->x16) tz_linear_fwd_x16(m->be, l, y, h, (const uint16_t *)(const void *)x, rows, 0);
    else tz_linear_fwd(m->be, l, y, h, x, rows);
}
/* Whether fc1 writes f (GELU's input) in bf16, its GEMM's epilogue rounding it: with the
 * block's inputs kept in bf16 (m->x16) and no adapter on fc1 (tz_linear_writes_y16: full
 * fine-tuning); GELU then reads it widened (TZ_GELU_X16) in the forward and the backward */
static int fc1_out16(const tz_dit *m, const tz_linear *L) {
    return m->x16 && tz_linear_writes_y16(m->be, &L[TZ_DIT_FC1]);
}
/* Its backward, dx written, from x as lin_fwd kept it (xk: the block's linears keep theirs,
 * m->x16) and dy as its op wrote it in mode (tz_linear_dy_mode). */
static void lin_bwd(tz_dit *m, const tz_linear *l, int mode, int xk, float *dx, const float *dy,
                    const float *x, const float *h, int64_t rows) {
    const uint16_t *d16 = mode == 2 ? (const uint16_t *)(const void *)dy : NULL;
    if (d16) dy = NULL;
    if (xk && m->x16)
        tz_linear_bwd_set_x16(m->be, l, dx, dy, d16, (const uint16_t *)(const void *)x, h,
                              m->dlora, rows);
    else tz_linear_bwd_set16(m->be, l, dx, dy, d16, x, h, m->dlora, rows);
}

/* Part j (0 q, 1 k, 2 v) of the fused projection's rows as kept in a (bf16 bits where
 * m->qkv16), and the strides attention reads them at. */
static const float *qkv_part(const tz_dit *m, const tz_dit_acts *a, int j) {
    const int64_t o = j * m->d.hidden;
    return m->qkv16 ? (const float *)(const void *)((const uint16_t *)(const void *)a->qkv + o)
                    : a->qkv + o;
}
static tz_att_ld qkv_ld(const tz_dit *m) {
    const int64_t w = 3 * m->d.hidden;
    return (tz_att_ld){w, w, 0, m->qkv16, 0};
}

/* One block: x -> out, saving its activations in a. kept (backward's recomputation,
 * tz_dit.keep): a->att and a->lse already hold what attention made of this block's q, k, v. */
static void block_fwd(tz_dit *m, const tz_dit_block *blk, tz_dit_acts *a, const float *x,
                      float *out, int kept) {
    tz_backend *be = m->be;
    const tz_dit_dims *d = &m->d;
    const int64_t n = m->n, T = tz_dit_tokens(d), BT = n * T, Hd = d->hidden, M = 6 * Hd;
    const tz_linear *L = blk->lin;
    /* shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = chunk(6) */
    tz_linear_fwd(be, &L[TZ_DIT_ADALN], a->mod, a->lh[TZ_DIT_ADALN], m->sc, n);
    be->layernorm_fwd(be, a->ln1, a->mean1, a->rstd1, x, BT, Hd, 1e-6f);
    /* with m->x16, modulate writes h1 and h2 in bf16 (its values as to_bf16 would round them) */
    be->modulate_fwd(be, a->h1, a->ln1, a->mod, a->mod + Hd, M, n, T, Hd, m->x16);
    /* attention reads q, k and v where the fused projection writes them (rows of 3 hidden);
     * with m->qkv16 kept in bf16: written so by the GEMM's epilogue where the linear can
     * (tz_linear_writes_y16: no adapter), else made in df and rounded once */
    if (m->qkv16 && tz_linear_writes_y16(be, &L[TZ_DIT_QKV]))
        tz_linear_fwd_x16(be, &L[TZ_DIT_QKV], a->qkv, NULL, (const uint16_t *)(const void *)a->h1,
                          BT, 1);
    else if (m->qkv16) {
        lin_fwd(m, &L[TZ_DIT_QKV], m->df, a->lh[TZ_DIT_QKV], a->h1, BT);
        be->to_bf16(be, (uint16_t *)(void *)a->qkv, m->df, BT * 3 * Hd);
    } else lin_fwd(m, &L[TZ_DIT_QKV], a->qkv, a->lh[TZ_DIT_QKV], a->h1, BT);
    const tz_att_ld ld = qkv_ld(m);
    be->att_ws = m->att_ws, be->att_ws_bytes = m->att_ws_bytes;
    if (!kept)
        be->attention_fwd(be, a->att, a->lse, qkv_part(m, a, 0), qkv_part(m, a, 1),
                          qkv_part(m, a, 2), n, T, d->num_heads, d->num_heads, Hd / d->num_heads,
                          0, &ld);
    tz_linear_fwd(be, &L[TZ_DIT_PROJ], a->ao, a->lh[TZ_DIT_PROJ], a->att, BT);
    be->gate_fwd(be, a->x2, x, a->ao, a->mod + 2 * Hd, M, n, T, Hd);
    be->layernorm_fwd(be, a->ln2, a->mean2, a->rstd2, a->x2, BT, Hd, 1e-6f);
    be->modulate_fwd(be, a->h2, a->ln2, a->mod + 3 * Hd, a->mod + 4 * Hd, M, n, T, Hd, m->x16);
    const int f16 = fc1_out16(m, L);
    if (f16)
        tz_linear_fwd_x16(be, &L[TZ_DIT_FC1], a->f, NULL, (const uint16_t *)(const void *)a->h2,
                          BT, 1);
    else lin_fwd(m, &L[TZ_DIT_FC1], a->f, a->lh[TZ_DIT_FC1], a->h2, BT);
    /* g likewise, straight from the GELU */
    be->gelu_tanh_fwd(be, a->g, a->f, BT * tz_dit_mlp_hidden(d), 0, 0,
                      (m->x16 ? TZ_GELU_OUT16 : 0) | (f16 ? TZ_GELU_X16 : 0));
    lin_fwd(m, &L[TZ_DIT_FC2], a->mo, a->lh[TZ_DIT_FC2], a->g, BT);
    be->gate_fwd(be, out, a->x2, a->mo, a->mod + 5 * Hd, M, n, T, Hd);
}

static tz_dit_acts *acts_of(tz_dit *m, int64_t i) { return tz_layer_stack_set(&m->stack, i); }

/* tz_dit.keep: block i's set points at its buffer, once the copy queue is done with it */
static tz_dit_acts *acts_kept(tz_dit *m, int64_t i) {
    tz_dit_acts *a = acts_of(m, i);
    if (m->keep.on) {
        const int k = tz_att_keep_take(&m->keep, i);
        a->att = m->keep.att2[k], a->lse = m->keep.lse2[k];
    }
    return a;
}

/* tz_dit.keep: block i's att and lse to the host (to_host) or back */
static void att_copy(tz_dit *m, int64_t i, int to_host) {
    const int64_t BT = m->n * tz_dit_tokens(&m->d);
    if (m->keep.on)
        tz_att_keep_copy(&m->keep, i, to_host, BT * m->d.hidden, BT * m->d.num_heads);
}

static void check_labels(const tz_dit *m, const int32_t *y) {
    const int64_t rows = tz_dit_label_rows(&m->d);
    for (int64_t b = 0; b < m->n; b++)
        if (y[b] < 0 || y[b] >= rows)
            TZ_FATAL("dit: label %d of sample %lld outside 0..%lld%s", y[b], (long long)b,
                     (long long)rows - 1,
                     rows > m->d.num_classes ? " (the last is the null class)"
                                             : " (this model has no null class)");
}

/* The forward; bwd: a backward follows (with tz_dit.keep, the blocks' attention outputs go to
 * the host for it) */
static void forward_body(tz_dit *m, const float *x_t, const float *t, const int32_t *y, int bwd) {
    tz_backend *be = m->be;
    const tz_dit_dims *d = &m->d;
    if (!m->arena.base) TZ_FATAL("dit: tz_dit_setup was not called");
    check_labels(m, y);
    const int64_t n = m->n, T = tz_dit_tokens(d), BT = n * T, Hd = d->hidden;
    const int64_t S = d->input_size, p = d->patch_size;
    be->upload(be, m->img, x_t, (size_t)(n * tz_dit_image_numel(d)) * sizeof(float));
    be->upload(be, m->labels, y, (size_t)n * sizeof(int32_t));
    timestep_features(m->tfreq_host, t, n, d->freq_dim);
    be->upload(be, m->tfreq, m->tfreq_host, (size_t)(n * d->freq_dim) * sizeof(float));
    /* patch embedding + positions; each stage's trainable weights as the pass reaches them
     * (the optimizer's uploads of later blocks may still be on their way) */
    tz_params_weights_needed(&m->params, (int)d->depth + 1);
    be->patchify(be, m->patches, m->img, n, d->in_channels, S, S, p, 0);
    tz_layer_stack *st = &m->stack;
    float *x0 = tz_layer_stack_out(st, 0);
    tz_linear_fwd(be, &m->x_emb, x0, NULL, m->patches, BT);
    for (int64_t b = 0; b < n; b++) be->axpy(be, x0 + b * T * Hd, 1.0f, m->pos_embed, T * Hd);
    tz_layer_stack_put(st, be, 0);
    /* conditioning c = t_embedder(t) + y_embedder(y); every adaLN reads silu(c) */
    tz_linear_fwd(be, &m->t_fc1, m->t_h, NULL, m->tfreq, n);
    be->silu_fwd(be, m->t_s, m->t_h, n * Hd);
    tz_linear_fwd(be, &m->t_fc2, m->temb, NULL, m->t_s, n);
    tz_embedding_w(be, m->c, m->labels, m->y_table, n, Hd);
    be->axpy(be, m->c, 1.0f, m->temb, n * Hd);
    be->silu_fwd(be, m->sc, m->c, n * Hd);
    for (int64_t i = 0; i < d->depth; i++) {
        tz_params_weights_needed(&m->params, (int)(d->depth - i));
        block_fwd(m, &m->blocks[i], acts_kept(m, i), tz_layer_stack_in(st, be, i),
                  tz_layer_stack_out(st, i + 1), 0);
        if (bwd) att_copy(m, i, 1); /* (the first depth - 2 blocks') */
        tz_layer_stack_put(st, be, i + 1);
    }
    /* final layer: shift, scale = chunk(2); LN, modulate, linear, unpatchify */
    tz_params_weights_needed(&m->params, 0);
    tz_linear_fwd(be, &m->f_ada, m->fmod, m->f_lh, m->sc, n);
    be->layernorm_fwd(be, m->fln, m->fmean, m->frstd, tz_layer_stack_in(st, be, d->depth), BT,
                      Hd, 1e-6f);
    be->modulate_fwd(be, m->fh, m->fln, m->fmod, m->fmod + Hd, 2 * Hd, n, T, Hd, 0);
    tz_linear_fwd(be, &m->f_lin, m->fo, NULL, m->fh, BT);
    be->unpatchify(be, m->out_img, m->fo, n, tz_dit_out_channels(d), S, S, p, 1);
}

void tz_dit_forward(tz_dit *m, const float *x_t, const float *t, const int32_t *y) {
    forward_body(m, x_t, t, y, 0);
}

/* The target into backend memory, before the forward pass (an upload waits for the compute
 * queue: here it has nothing to wait for). */
static void target_up(tz_dit *m, const float *target) {
    const int64_t n = m->n, img = tz_dit_image_numel(&m->d);
    m->be->upload(m->be, m->target, target, (size_t)(n * img) * sizeof(float));
}

/* Per image, the SSE of the first C channels of the prediction against the target, sent to
 * the host on the copy queue after the forward pass's work without the host waiting for it
 * (backward is queued at once); loss_sum waits and adds (done: loss_send's event). */
static void *loss_send(tz_dit *m) {
    tz_backend *be = m->be;
    const int64_t n = m->n, img = tz_dit_image_numel(&m->d);
    const int64_t ld = tz_dit_out_channels(&m->d) * m->d.input_size * m->d.input_size;
    be->mse_fwd(be, m->sse, m->out_img, ld, m->target, n, img);
    return tz_model_send_host(be, m->sse_host, m->sse, (size_t)n * sizeof(float));
}

static double loss_sum(tz_dit *m, void *done) {
    tz_model_received(m->be, done);
    double s = 0.0;
    for (int64_t b = 0; b < m->n; b++) s += m->sse_host[b];
    return s;
}

double tz_dit_forward_loss(tz_dit *m, const float *x_t, const float *t, const int32_t *y,
                           const float *target) {
    target_up(m, target);
    tz_dit_forward(m, x_t, t, y);
    return loss_sum(m, loss_send(m));
}

/* ---- backward ---- */

/* m->dres holds dL/d(block output) on entry and dL/d(block input) on return; the block's
 * adaLN input gradient is added into m->dsc when the embedders need it. */
static void block_bwd(tz_dit *m, const tz_dit_block *blk, tz_dit_acts *a, const float *x) {
    tz_backend *be = m->be;
    const tz_dit_dims *d = &m->d;
    const int64_t n = m->n, T = tz_dit_tokens(d), BT = n * T, Hd = d->hidden, M = 6 * Hd;
    const int64_t F = tz_dit_mlp_hidden(d), nh = d->num_heads;
    const tz_linear *L = blk->lin;
    be->fill(be, m->dmod, 0.0f, n * M); /* (the six chunks' column sums add into it) */
    /* MLP branch: out = x2 + gate_mlp * fc2(gelu(fc1(modulate(LN(x2))))); each activation
     * gradient written by the op that first makes it (no zeroing) */
    const int m2 = tz_linear_dy_mode(be, &L[TZ_DIT_FC2]);
    const int m1 = tz_linear_dy_mode(be, &L[TZ_DIT_FC1]);
    const int mp = tz_linear_dy_mode(be, &L[TZ_DIT_PROJ]);
    be->gate_bwd(be, m->da, m->dmod + 5 * Hd, m->dres, a->mo, a->mod + 5 * Hd, M, n, T, Hd, m2);
    lin_bwd(m, &L[TZ_DIT_FC2], m2, 1, m->dg, m->da, a->g, a->lh[TZ_DIT_FC2], BT);
    if (!m1 && be->gelu_tanh_bwd_bias && tz_linear_takes_dy16_db(be, &L[TZ_DIT_FC1])) {
        /* fc1's trained bias: its gradient summed in GELU's backward pass, which writes dy
         * only in bf16 (no fp32 df written and read again) */
        uint16_t *df16 = (uint16_t *)(void *)m->df;
        be->gelu_tanh_bwd_bias(be, df16, L[TZ_DIT_FC1].bias->g, m->dg, a->f, BT, F,
                               fc1_out16(m, L));
        tz_linear_bwd_set_db16(be, &L[TZ_DIT_FC1], m->db, df16, a->h2, m->x16,
                               a->lh[TZ_DIT_FC1], m->dlora, BT);
    } else {
        be->gelu_tanh_bwd(be, m->df, m->dg, a->f, BT * F, m1 | (fc1_out16(m, L) ? TZ_GELU_X16 : 0),
                          0, 0);
        lin_bwd(m, &L[TZ_DIT_FC1], m1, 1, m->db, m->df, a->h2, a->lh[TZ_DIT_FC1], BT);
    }
    be->modulate_bwd(be, m->da, m->dmod + 3 * Hd, m->dmod + 4 * Hd, m->db, a->ln2,
                     a->mod + 4 * Hd, M, n, T, Hd, 0);
    be->layernorm_bwd(be, m->dres, m->da, a->x2, a->mean2, a->rstd2, BT, Hd); /* now dL/dx2 */
    /* attention branch: x2 = x + gate_msa * proj(attn(qkv(modulate(LN(x))))) */
    be->gate_bwd(be, m->da, m->dmod + 2 * Hd, m->dres, a->ao, a->mod + 2 * Hd, M, n, T, Hd, mp);
    lin_bwd(m, &L[TZ_DIT_PROJ], mp, 0, m->db, m->da, a->att, a->lh[TZ_DIT_PROJ], BT);
    be->att_ws = m->att_ws, be->att_ws_bytes = m->att_ws_bytes;
    /* dq, dk, dv written into the fused projection's gradient rows, as the forward read them;
     * in bf16 (tz_att_ld.d16) where attention reads q, k, v so (qkv16: its flash kernels) and
     * the projection's backward GEMMs read its dy so (no bias gradient, which sums the fp32
     * dy: LoRA), the bits those GEMMs would have rounded */
    const int mq = m->qkv16 ? tz_linear_dy_mode(be, &L[TZ_DIT_QKV]) : 0;
    tz_att_ld ld = qkv_ld(m);
    float *dqkv[3] = {m->dqkv, m->dqkv + Hd, m->dqkv + 2 * Hd};
    if (mq == 2) {
        ld.d16 = TZ_ATT_DQ16 | TZ_ATT_DK16 | TZ_ATT_DV16;
        for (int j = 0; j < 3; j++) /* the same rows in bf16: [B*T, 3 Hd] at stride 3 Hd */
            dqkv[j] = (float *)(void *)((uint16_t *)(void *)m->dqkv + j * Hd);
    }
    /* dg and df are read for the last time above: dg lent for attention's score gradients */
    be->att_ds = m->dg, be->att_ds_bytes = (size_t)(BT * F) * sizeof(float);
    be->attention_bwd(be, dqkv[0], dqkv[1], dqkv[2], m->db, a->att, a->lse, qkv_part(m, a, 0),
                      qkv_part(m, a, 1), qkv_part(m, a, 2), n, T, nh, nh, Hd / nh, 0, 0, &ld);
    lin_bwd(m, &L[TZ_DIT_QKV], mq, 1, m->da, m->dqkv, a->h1, a->lh[TZ_DIT_QKV], BT);
    be->modulate_bwd(be, m->db, m->dmod, m->dmod + Hd, m->da, a->ln1, a->mod + Hd, M, n, T, Hd, 0);
    be->layernorm_bwd(be, m->dres, m->db, x, a->mean1, a->rstd1, BT, Hd); /* now dL/dx */
    /* the modulation: mod = adaLN(silu(c)) */
    tz_linear_bwd(m->be, &L[TZ_DIT_ADALN], m->cond_trainable ? m->dsc : NULL, m->dmod, m->sc, a->lh[TZ_DIT_ADALN], m->dlora, n);
}

double tz_dit_forward_backward(tz_dit *m, const float *x_t, const float *t, const int32_t *y,
                               const float *target, float dloss) {
    tz_backend *be = m->be;
    const tz_dit_dims *d = &m->d;
    const int64_t n = m->n, T = tz_dit_tokens(d), BT = n * T, Hd = d->hidden;
    const int64_t S = d->input_size, p = d->patch_size, Cout = tz_dit_out_channels(d);
    const int64_t ld = Cout * S * S, L = d->depth;
    if (m->o.forward_only) TZ_FATAL("dit: built for forward passes only (no backward buffers)");
    target_up(m, target);
    forward_body(m, x_t, t, y, 1);
    void *loss_done = loss_send(m);
    tz_params_backward_begins(&m->params);
    /* loss -> prediction -> final linear (token layout) */
    be->fill(be, m->dimg, 0.0f, n * ld);
    be->mse_bwd(be, m->dimg, m->out_img, ld, m->target, dloss, n, tz_dit_image_numel(d));
    be->patchify(be, m->dfo, m->dimg, n, Cout, S, S, p, 1);
    tz_linear_bwd_set(m->be, &m->f_lin, m->da, m->dfo, m->fh, NULL, m->dlora, BT);
    be->fill(be, m->dmod, 0.0f, n * 2 * Hd);
    be->modulate_bwd(be, m->db, m->dmod, m->dmod + Hd, m->da, m->fln, m->fmod + Hd, 2 * Hd, n,
                     T, Hd, 0);
    be->fill(be, m->dres, 0.0f, BT * Hd);
    be->layernorm_bwd(be, m->dres, m->db, tz_layer_stack_in(&m->stack, be, L), m->fmean,
                      m->frstd, BT, Hd);
    be->fill(be, m->dsc, 0.0f, n * Hd);
    tz_linear_bwd(m->be, &m->f_ada, m->cond_trainable ? m->dsc : NULL, m->dmod, m->sc, m->f_lh, m->dlora, n);
    tz_params_stage_done(&m->params, 0);
    for (int64_t i = L - 1; i >= 0; i--) {
        att_copy(m, i - 1, 0); /* (tz_dit.keep) block i - 1's on their way back meanwhile */
        tz_dit_acts *a = acts_kept(m, i);
        /* checkpointing: recompute the block (the last one's activations are still there);
         * its output goes to da, free until block_bwd fills it */
        const float *x = tz_layer_stack_in(&m->stack, be, i);
        if (tz_layer_stack_recompute(&m->stack, i))
            block_fwd(m, &m->blocks[i], a, x, m->da, m->keep.on);
        block_bwd(m, &m->blocks[i], a, x);
        tz_params_stage_done(&m->params, (int)(L - i));
    }
    /* embedders: c = t_fc2(silu(t_fc1(features(t)))) + table[y]; x0 = x_emb(patches) + pos */
    if (m->cond_trainable) {
        be->silu_bwd(be, m->dc, m->dsc, m->c, n * Hd, 0);
        if (m->y_table->g) be->embedding_bwd(be, m->y_table->g, m->labels, m->dc, n, Hd);
        tz_linear_bwd_set(m->be, &m->t_fc2, m->dt, m->dc, m->t_s, NULL, m->dlora, n);
        be->silu_bwd(be, m->dsc, m->dt, m->t_h, n * Hd, 0); /* dsc reused: d t_h, written */
        tz_linear_bwd(m->be, &m->t_fc1, NULL, m->dsc, m->tfreq, NULL, m->dlora, n);
    }
    tz_linear_bwd(m->be, &m->x_emb, NULL, m->dres, m->patches, NULL, m->dlora, BT);
    tz_params_stage_done(&m->params, (int)L + 1);
    return loss_sum(m, loss_done);
}
