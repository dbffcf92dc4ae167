/* A Llama with TurboQuant projections: its memory (exactly one decode tile and one rotation
 * buffer in the arena, codes + scales instead of fp32 weights, no backend allocation during
 * forward/backward, so no dense copy of a quantized weight outlives its layer's use), and
 * its loss and LoRA gradients against a dense Llama holding the dequantized weights. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/world.h"
#include "backend/registry.h"
#include "core/rng.h"
#include "model/llama.h"
#include "quant/turboquant.h"
#include "tz_check.h"
#include "tz_tq_test.h"

static const tz_llama_dims k_dims = {.vocab = 64, .dim = 128, .hidden = 192, .n_layers = 2,
                                     .n_heads = 4, .n_kv_heads = 2, .head_dim = 32,
                                     .max_pos = 64, .eps = 1e-5, .theta = 10000.0, .tied = 1};

static tz_llama *make(tz_backend *be, const tz_quant_opts *q, int checkpointing) {
    tz_model_opts o = {.lora.targets = 0x7f, .lora.rank = 4, .lora.alpha = 8.0,
                       .checkpointing = checkpointing};
    if (q) o.quant = *q;
    tz_llama *m = tz_llama_create(be, &k_dims, &o);
    tz_llama_init_random(m, 3);
    tz_model_init_lora(&m->params, m->be, 4);
    for (int i = 0; i < m->params.n; i++) /* nonzero B so the adapters act */
        if (strstr(m->params.p[i]->name, "lora_B"))
            for (int64_t j = 0; j < m->params.p[i]->numel; j++)
                m->params.p[i]->w[j] = 0.02f * (float)((j % 9) - 4);
    return m;
}

/* dense's projections = the dequantized weights of q's (plain basis) */
static void copy_dequantized(tz_llama *dense, const tz_llama *q) {
    for (int64_t l = 0; l < k_dims.n_layers; l++)
        for (int j = 0; j < TZ_LIN_N; j++)
            dequantize_param(q->layers[l].lin[j].w, dense->layers[l].lin[j].w->w);
}

static float *bind(tz_backend *be, tz_llama *m) {
    float *g = be->alloc(be, (size_t)m->params.flat_numel * sizeof(float));
    tz_params_bind_grads(&m->params, g);
    return g;
}

int main(int argc, char **argv) {
    tz_mpi_singleton_defaults();
    MPI_Init(&argc, &argv);
    tz_backend *be = tz_cpu_backend_create(2);
    count_start(be);
    const int64_t B = 2, T = 16, BT = B * T;
    const tz_quant_opts q4 = {.method = TZ_TQ_TURBOQUANT, .bits = 4, .group = 128, .seed = 5};

    size_t live0 = g_live;
    tz_llama *d = make(be, NULL, 0);
    size_t dense_weights = g_live - live0;
    live0 = g_live;
    tz_llama *q = make(be, &q4, 0);
    size_t quant_weights = g_live - live0;
    copy_dequantized(d, q);

    /* the weights: codes + scales + levels instead of fp32, nothing else */
    size_t expect = dense_weights, tile = 0, rot_in = 0;
    int groups_ok = 1;
    for (int64_t l = 0; l < k_dims.n_layers; l++)
        for (int j = 0; j < TZ_LIN_N; j++) {
            const tz_param *p = q->layers[l].lin[j].w;
            int want_group = p->shape[1] % 128 ? 64 : 128; /* in = 192 (down): 64 */
            groups_ok &= p->q && !p->w && p->q->group == want_group;
            expect -= (size_t)p->numel * 4;
            expect += quant_bytes(p);
            if ((size_t)p->numel > tile) tile = (size_t)p->numel;
            if ((size_t)p->shape[1] > rot_in) rot_in = (size_t)p->shape[1];
        }
    check(groups_ok, "every projection quantized, group 128 where it divides the row, else 64");
    check(quant_weights == expect, "backend bytes of the weights: %zu, expected %zu (dense: %zu)",
          quant_weights, expect, dense_weights);

    /* the arena: one tile for the largest projection and one rotation buffer, no more */
    tz_llama_setup(d, B, T);
    tz_llama_setup(q, B, T);
    check(q->tq.tile_elems == (int64_t)tile && q->tq.act_floats == (int64_t)(BT * rot_in),
          "one tile of %lld floats (largest projection %zu), rotation buffer %lld = BT x %zu",
          (long long)q->tq.tile_elems, tile, (long long)q->tq.act_floats, rot_in);
    size_t extra = round64(tile * 4) + round64((size_t)BT * rot_in * 4);
    check(q->arena.cap == d->arena.cap + extra,
          "arena %zu bytes = dense model's %zu + tile and rotation buffer %zu", q->arena.cap,
          d->arena.cap, extra);
    int shared = 1;
    for (int64_t l = 0; l < k_dims.n_layers; l++)
        for (int j = 0; j < TZ_LIN_N; j++) shared &= q->layers[l].lin[j].tq == &q->tq;
    check(shared, "every quantized projection decodes into the model's one tile");

    float *gd = bind(be, d), *gq = bind(be, q);
    int32_t in[32], tg[32];
    tz_rng r = tz_rng_make(8, 0, TZ_RNG_TEST, 0);
    for (int i = 0; i < BT; i++)
        in[i] = (int32_t)tz_rng_below(&r, 64), tg[i] = (int32_t)tz_rng_below(&r, 64);
    double ld = tz_llama_forward_backward(d, in, tg, 1.0f / (float)BT);
    size_t allocs = g_allocs, live = g_live;
    double lq = tz_llama_forward_backward(q, in, tg, 1.0f / (float)BT);
    check(g_allocs == allocs && g_live == live,
          "forward + backward allocate no backend memory (%zu allocations, %zu bytes live)",
          g_allocs - allocs, g_live - live);
    check(fabs(lq - ld) <= 1e-5 * fabs(ld), "loss %.7f = dense model on the dequantized "
          "weights %.7f (rel %.1e)", lq / BT, ld / BT, fabs(lq - ld) / fabs(ld));
    double eg = maxrel(gq, gd, q->params.flat_numel);
    check(q->params.flat_numel == d->params.flat_numel && eg < 1e-4,
          "LoRA gradients = the dense model's (max rel %.1e)", eg);
    check(q->arena.peak <= q->arena.cap, "arena peak %zu within its %zu bytes", q->arena.peak,
          q->arena.cap);

    /* checkpointing recomputes layers: the tile is decoded again, same results */
    tz_llama *c = make(be, &q4, 1);
    tz_llama_setup(c, B, T);
    float *gc = bind(be, c);
    double lc = tz_llama_forward_backward(c, in, tg, 1.0f / (float)BT);
    check(lc == lq && !memcmp(gc, gq, (size_t)c->params.flat_numel * sizeof(float)),
          "with activation checkpointing: same loss and gradients, bit for bit");

    /* absmax baseline: the plain-basis kind, no rotation buffer */
    const tz_quant_opts a4 = {.method = TZ_TQ_ABSMAX, .bits = 4, .group = 128, .seed = 0};
    tz_llama *a = make(be, &a4, 0);
    tz_llama_setup(a, B, T);
    check(a->tq.act == NULL && a->arena.cap == d->arena.cap + round64(tile * 4),
          "absmax: one tile, no rotation buffer (arena %zu)", a->arena.cap);
    tz_llama *ad = make(be, NULL, 0);
    copy_dequantized(ad, a);
    tz_llama_setup(ad, B, T);
    double la = tz_llama_forward(a, in, tg), lad = tz_llama_forward(ad, in, tg);
    check(la == lad, "absmax: loss %.7f = dense model on the dequantized weights, bit for bit",
          la / BT);

    be->release(be, gd), be->release(be, gq), be->release(be, gc);
    tz_llama_free(d), tz_llama_free(q), tz_llama_free(c), tz_llama_free(a), tz_llama_free(ad);
    check(g_live == 0, "every backend allocation released (%zu bytes left)", g_live);
    count_stop(be);
    tz_cpu_backend_destroy(be);
    MPI_Finalize();
    return tz_check_done("tq_model");
}
