/* A DiT on a TurboQuant base: exactly the block weights (qkv, proj, fc1, fc2, adaLN) are
 * quantized, nothing dense of them is allocated, the arena holds one decode tile and one
 * rotation buffer, forward / backward allocate nothing, and the prediction, loss and LoRA
 * gradients equal those of a dense DiT holding the dequantized weights. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/registry.h"
#include "core/rng.h"
#include "model/dit.h"
#include "quant/turboquant.h"
#include "tz_check.h"
#include "tz_tq_test.h"

static const tz_dit_dims k_dims = {.input_size = 8, .patch_size = 2, .in_channels = 2,
                                   .hidden = 64, .depth = 2, .num_heads = 4, .mlp_ratio = 4.0,
                                   .num_classes = 5, .class_dropout_prob = 0.1,
                                   .learn_sigma = 1, .freq_dim = 64};

/* Every weight random (adaLN-Zero would make the blocks and output trivially zero): dense
 * ones get the same values in every model (same registration index, same draws), quantized
 * ones the quantization of such draws. lora_B non-zero so the adapters act. */
static tz_dit *make(tz_backend *be, const tz_quant_opts *q, int checkpointing) {
    tz_model_opts o = {.lora.targets = 0x1f, .lora.rank = 4, .lora.alpha = 8.0,
                     .checkpointing = checkpointing};
    if (q) o.quant = *q;
    tz_dit *m = tz_dit_create(be, &k_dims, &o);
    tz_dit_init_random(m, 3);
    tz_model_init_lora(&m->params, m->be, 4);
    for (int i = 0; i < m->params.n; i++) {
        tz_param *p = m->params.p[i];
        if (p->adapter && !strstr(p->name, "lora_B")) continue;
        tz_rng r = tz_rng_make(11, (uint64_t)i, TZ_RNG_TEST, 0);
        float *h = malloc((size_t)p->numel * sizeof *h);
        for (int64_t j = 0; j < p->numel; j++) h[j] = (float)(0.05 * tz_rng_normal(&r));
        if (p->q) tz_quant_upload(be, &m->cb, p, h);
        else memcpy(p->w, h, (size_t)p->numel * sizeof *h);
        free(h);
    }
    return m;
}

static int is_block_weight(const tz_dit *m, const tz_param *p) {
    for (int64_t i = 0; i < m->d.depth; i++)
        for (int j = 0; j < TZ_DIT_LIN_N; j++)
            if (m->blocks[i].lin[j].w == p) return 1;
    return 0;
}

static float *bind(tz_backend *be, tz_dit *m) {
    float *g = be->alloc(be, (size_t)m->params.flat_numel * sizeof(float));
    memset(g, 0, (size_t)m->params.flat_numel * sizeof(float));
    tz_params_bind_grads(&m->params, g);
    return g;
}

int main(void) {
    tz_backend *be = tz_cpu_backend_create(2);
    count_start(be);
    const int64_t B = 3, T = tz_dit_tokens(&k_dims), BT = B * T, N = tz_dit_image_numel(&k_dims);
    const tz_quant_opts q4 = {.method = TZ_TQ_TURBOQUANT, .bits = 4, .group = 64, .seed = 5};

    size_t live0 = g_live;
    tz_dit *d = make(be, NULL, 0);
    size_t dense_weights = g_live - live0;
    live0 = g_live;
    tz_dit *q = make(be, &q4, 0);
    size_t quant_weights = g_live - live0;

    /* exactly the block weights quantized; the dense model takes their dequantized values */
    size_t expect = dense_weights, tile = 0, rot_in = 0;
    int which_ok = 1, nq = 0;
    for (int i = 0; i < q->params.n; i++) {
        const tz_param *p = q->params.p[i];
        which_ok &= !strcmp(p->name, d->params.p[i]->name) && !!p->q == is_block_weight(q, p);
        if (!p->q) continue;
        nq++;
        which_ok &= !p->w && !p->trainable && p->q->group == 64;
        dequantize_param(p, d->params.p[i]->w);
        expect += quant_bytes(p) - (size_t)p->numel * 4;
        if ((size_t)p->numel > tile) tile = (size_t)p->numel;
        if ((size_t)p->shape[1] > rot_in) rot_in = (size_t)p->shape[1];
    }
    check(which_ok && nq == 5 * k_dims.depth, "%d block weights quantized (group 64), biases, "
          "embedders and final layer dense", nq);
    check(quant_weights == expect, "backend bytes of the weights: %zu, expected %zu (dense: %zu)",
          quant_weights, expect, dense_weights);

    tz_dit_setup(d, B);
    tz_dit_setup(q, B);
    check(q->tq.tile_elems == (int64_t)tile && q->tq.act_floats == (int64_t)(BT * rot_in),
          "one tile of %lld floats (largest block weight), rotation buffer %lld = BT x %zu",
          (long long)q->tq.tile_elems, (long long)q->tq.act_floats, rot_in);
    size_t extra = round64(tile * 4) + round64((size_t)BT * rot_in * 4);
    check(q->arena.cap == d->arena.cap + extra,
          "arena %zu bytes = dense model's %zu + tile and rotation buffer %zu", q->arena.cap,
          d->arena.cap, extra);
    int shared = 1;
    for (int64_t i = 0; i < k_dims.depth; i++)
        for (int j = 0; j < TZ_DIT_LIN_N; j++) shared &= q->blocks[i].lin[j].tq == &q->tq;
    check(shared, "every quantized weight decodes into the model's one tile");

    float *x = malloc((size_t)(B * N) * sizeof *x), *tg = malloc((size_t)(B * N) * sizeof *tg);
    float t[3] = {17.0f, 503.0f, 941.0f};
    int32_t y[3] = {0, 4, 5}; /* 5: the null class */
    tz_rng r = tz_rng_make(8, 0, TZ_RNG_TEST, 0);
    for (int64_t i = 0; i < B * N; i++) x[i] = (float)tz_rng_normal(&r);
    for (int64_t i = 0; i < B * N; i++) tg[i] = (float)tz_rng_normal(&r);

    tz_dit_forward(d, x, t, y);
    tz_dit_forward(q, x, t, y);
    const int64_t no = B * tz_dit_out_channels(&k_dims) * k_dims.input_size * k_dims.input_size;
    double ef = maxrel(tz_dit_output(q), tz_dit_output(d), no);
    check(ef < 1e-5, "prediction = the dense DiT's on the dequantized weights (max rel %.1e)", ef);

    float *gd = bind(be, d), *gq = bind(be, q);
    double ld = tz_dit_forward_backward(d, x, t, y, tg, 0.01f);
    size_t allocs = g_allocs, live = g_live;
    double lq = tz_dit_forward_backward(q, x, t, y, tg, 0.01f);
    check(g_allocs == allocs && g_live == live,
          "forward + backward allocate no backend memory (%zu allocations, %zu bytes live)",
          g_allocs - allocs, g_live - live);
    check(fabs(lq - ld) <= 1e-5 * fabs(ld), "loss %.7f = dense model's %.7f (rel %.1e)", lq, ld,
          fabs(lq - ld) / fabs(ld));
    double eg = maxrel(gq, gd, q->params.flat_numel);
    check(q->params.flat_numel == d->params.flat_numel && eg < 1e-4,
          "LoRA gradients = the dense model's (max rel %.1e)", eg);
    check(q->arena.peak <= q->arena.cap, "arena peak %zu within its %zu bytes", q->arena.peak,
          q->arena.cap);

    tz_dit *c = make(be, &q4, 1);
    tz_dit_setup(c, B);
    float *gc = bind(be, c);
    double lc = tz_dit_forward_backward(c, x, t, y, tg, 0.01f);
    check(lc == lq && !memcmp(gc, gq, (size_t)c->params.flat_numel * sizeof(float)),
          "with activation checkpointing: same loss and gradients, bit for bit");

    free(x), free(tg);
    be->release(be, gd), be->release(be, gq), be->release(be, gc);
    tz_dit_free(d), tz_dit_free(q), tz_dit_free(c);
    check(g_live == 0, "every backend allocation released (%zu bytes left)", g_live);
    count_stop(be);
    tz_cpu_backend_destroy(be);
    return tz_check_done("dit_quant");
}
