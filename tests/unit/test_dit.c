/* The DiT model in C: presets and dims checks, adaLN-Zero init (zero output), bitwise
 * equality with checkpointing and at 1 vs 2 threads, gradient readiness (hook values, and no
 * gradient changes once reported final), partial batches, save/load and adapter round trips.
 * Agreement with PyTorch is tests/ref/dit_ref.py's job. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/registry.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/adapter_io.h"
#include "model/dit_io.h"
#include "tz_check.h"

static tz_backend *g_be;

static tz_dit_dims small_dims(int sigma) {
    tz_dit_dims d = {.input_size = 8, .patch_size = 2, .in_channels = 2, .hidden = 32,
                     .depth = 3, .num_heads = 4, .mlp_ratio = 4.0, .num_classes = 5,
                     .class_dropout_prob = 0.1, .learn_sigma = sigma, .freq_dim = 64};
    return d;
}

/* Every parameter (and, with lora, lora_B) given random values so nothing is trivially 0. */
static void randomize(tz_dit *m, uint64_t seed) {
    tz_dit_init_random(m, seed);
    tz_model_init_lora(&m->params, m->be, seed);
    for (int i = 0; i < m->params.n; i++) {
        tz_param *p = m->params.p[i];
        if (p->adapter && !strstr(p->name, "lora_B")) continue;
        tz_rng r = tz_rng_make(seed, (uint64_t)i, TZ_RNG_TEST, 7);
        float *h = malloc((size_t)p->numel * sizeof *h);
        g_be->download(g_be, h, p->w, (size_t)p->numel * sizeof *h);
        for (int64_t j = 0; j < p->numel; j++) h[j] += (float)(0.05 * tz_rng_normal(&r));
        g_be->upload(g_be, p->w, h, (size_t)p->numel * sizeof *h);
        free(h);
    }
}

typedef struct {
    int64_t B, numel;
    float *x, *t, *tgt;
    int32_t *y;
} batch;

static batch make_batch(const tz_dit_dims *d, int64_t B, uint64_t seed) {
    batch b = {B, tz_dit_image_numel(d), NULL, NULL, NULL, NULL};
    b.x = malloc((size_t)(B * b.numel) * sizeof(float));
    b.tgt = malloc((size_t)(B * b.numel) * sizeof(float));
    b.t = malloc((size_t)B * sizeof(float));
    b.y = malloc((size_t)B * sizeof(int32_t));
    tz_rng r = tz_rng_make(seed, 0, TZ_RNG_TEST, 3);
    for (int64_t i = 0; i < B * b.numel; i++) b.x[i] = (float)tz_rng_normal(&r);
    for (int64_t i = 0; i < B * b.numel; i++) b.tgt[i] = (float)tz_rng_normal(&r);
    for (int64_t i = 0; i < B; i++) b.t[i] = (float)tz_rng_below(&r, 1000);
    for (int64_t i = 0; i < B; i++) b.y[i] = (int32_t)(i % (d->num_classes + 1));
    return b;
}

static void free_batch(batch *b) { free(b->x), free(b->t), free(b->tgt), free(b->y); }

typedef struct {
    tz_dit *m;
    float *grad;          /* backend flat gradients */
    int calls;
    int64_t last;
    int monotone;
    float *snap;          /* host copy of the gradients at each hook */
    int64_t *snap_ready;
    float **snaps;
} hook_ctx;

static void hook(void *p, int64_t ready) {
    hook_ctx *h = p;
    if (ready < h->last) h->monotone = 0;
    h->last = ready;
    int64_t n = h->m->params.flat_numel;
    h->snaps[h->calls] = malloc((size_t)n * sizeof(float));
    g_be->download(g_be, h->snaps[h->calls], h->grad, (size_t)n * sizeof(float));
    h->snap_ready[h->calls] = ready;
    h->calls++;
}

/* Loss and the flat gradients (host copy, *n floats) of one forward_backward. */
static double run(tz_dit *m, const batch *b, float **g_out, hook_ctx *h) {
    float *grad = g_be->alloc(g_be, (size_t)m->params.flat_numel * sizeof(float));
    tz_params_bind_grads(&m->params, grad);
    if (h) {
        h->grad = grad, h->m = m, h->calls = 0, h->last = 0, h->monotone = 1;
        tz_params_set_grad_hook(&m->params, hook, h);
    }
    double loss = tz_dit_forward_backward(m, b->x, b->t, b->y, b->tgt, 0.01f);
    tz_params_set_grad_hook(&m->params, NULL, NULL);
    *g_out = malloc((size_t)m->params.flat_numel * sizeof(float));
    g_be->download(g_be, *g_out, grad, (size_t)m->params.flat_numel * sizeof(float));
    g_be->release(g_be, grad);
    return loss;
}

static void test_dims(void) {
    tz_dit_dims d;
    char err[256];
    check(!tz_dit_preset("tiny", &d, err, sizeof err) && d.hidden == 64 && d.depth == 2 &&
              d.patch_size == 4 && tz_dit_tokens(&d) == 49,
          "preset tiny: hidden 64, depth 2, patch 4 (49 tokens of 28x28)");
    tz_model_opts o = {.full = 1};
    tz_dit *m = tz_dit_create(g_be, &d, &o);
    printf("tiny: %lld parameters\n", (long long)m->params.n_total);
    tz_dit_free(m);
    check(!tz_dit_preset("small", &d, err, sizeof err) && d.hidden == 128 && d.depth == 4,
          "preset small: hidden 128, depth 4");
    check(tz_dit_preset("huge", &d, err, sizeof err) && strstr(err, "huge"),
          "unknown preset rejected: %s", err);
    d = small_dims(0);
    d.input_size = 9;
    check(tz_dit_check_dims(&d, err, sizeof err) && strstr(err, "patch_size"),
          "input_size not a multiple of the patch rejected: %s", err);
    d = small_dims(0);
    d.num_heads = 5;
    check(tz_dit_check_dims(&d, err, sizeof err) && strstr(err, "num_heads"),
          "heads not dividing hidden rejected: %s", err);
}

static void test_zero_init(void) {
    tz_dit_dims d = small_dims(1);
    tz_model_opts o = {.full = 1};
    tz_dit *m = tz_dit_create(g_be, &d, &o);
    tz_dit_init_random(m, 5);
    tz_dit_setup(m, 3);
    batch b = make_batch(&d, 3, 1);
    tz_dit_forward(m, b.x, b.t, b.y);
    int64_t n = 3 * tz_dit_out_channels(&d) * 64, nz = 0;
    float *out = malloc((size_t)n * sizeof *out);
    g_be->download(g_be, out, tz_dit_output(m), (size_t)n * sizeof *out);
    for (int64_t i = 0; i < n; i++) nz += out[i] != 0.0f;
    check(nz == 0, "adaLN-Zero init: the prediction is exactly 0 (%lld nonzero)", (long long)nz);
    free(out);
    free_batch(&b);
    tz_dit_free(m);
}

static int same(const float *a, const float *b, int64_t n) { return !memcmp(a, b, (size_t)n * 4); }

/* 16 images of 16x16 (64 tokens): B*T*hidden = 32768, large enough for every op to split
 * its work over threads. */
static void test_equivalences(int full) {
    tz_dit_dims d = small_dims(1);
    d.input_size = 16;
    tz_model_opts o = {.full = full, .lora.targets = full ? 0 : 31, .lora.rank = 3, .lora.alpha = 6};
    const char *tag = full ? "full" : "lora";
    tz_dit *m = tz_dit_create(g_be, &d, &o);
    randomize(m, 9);
    tz_dit_setup(m, 16);
    batch b = make_batch(&d, 16, 2);
    int64_t n = m->params.flat_numel;
    float *g0, *g1, *g2, *g3;
    hook_ctx h = {0};
    h.snaps = calloc((size_t)d.depth + 3, sizeof *h.snaps);
    h.snap_ready = calloc((size_t)d.depth + 3, sizeof *h.snap_ready);
    omp_set_num_threads(1);
    double l0 = run(m, &b, &g0, &h);
    omp_set_num_threads(2);
    double l1 = run(m, &b, &g1, NULL);
    check(l0 == l1 && same(g0, g1, n), "%s: loss and gradients bitwise equal, 1 vs 2 threads", tag);
    check(h.calls == d.depth + 2 && h.monotone && h.last == n,
          "%s: grad_hook called %d times (depth + 2), ready non-decreasing, last = flat size",
          tag, h.calls);
    int64_t changed = 0; /* nothing below a reported watermark changes afterwards */
    for (int c = 0; c < h.calls; c++) {
        for (int64_t i = 0; i < h.snap_ready[c]; i++) changed += h.snaps[c][i] != g0[i];
        free(h.snaps[c]);
    }
    check(changed == 0, "%s: no gradient below a reported watermark changes afterwards (%lld)",
          tag, (long long)changed);
    int64_t nonzero = 0;
    for (int64_t i = 0; i < n; i++) nonzero += g0[i] != 0.0f;
    check(nonzero > n / 2, "%s: gradients are mostly nonzero (%lld of %lld)", tag,
          (long long)nonzero, (long long)n);
    /* checkpointing recomputes the same numbers */
    tz_model_opts oc = o;
    oc.checkpointing = 1;
    tz_dit *mc = tz_dit_create(g_be, &d, &oc);
    for (int i = 0; i < m->params.n; i++)
        g_be->copy(g_be, mc->params.p[i]->w, m->params.p[i]->w, (size_t)m->params.p[i]->numel * 4);
    tz_dit_setup(mc, 16);
    double l2 = run(mc, &b, &g2, NULL);
    check(l2 == l1 && same(g2, g1, n), "%s: checkpointing gives bitwise the same loss and gradients", tag);
    check(tz_dit_arena_bytes(mc, 16) < tz_dit_arena_bytes(m, 16),
          "%s: checkpointing arena %zu < %zu bytes", tag, tz_dit_arena_bytes(mc, 16),
          tz_dit_arena_bytes(m, 16));
    /* a partial batch: the first 2 samples alone */
    tz_dit_set_batch(m, 2);
    double l3 = run(m, &b, &g3, NULL);
    tz_dit_set_batch(mc, 2);
    double l4 = tz_dit_forward_loss(mc, b.x, b.t, b.y, b.tgt);
    check(fabs(l3 - l4) <= 1e-6 * l3 && l3 < l1, "%s: set_batch(2): loss of the first two (%.6f)", tag, l3);
    tz_dit_setup(mc, 2);
    double l5 = tz_dit_forward_loss(mc, b.x, b.t, b.y, b.tgt);
    check(fabs(l5 - l3) <= 1e-6 * l3, "%s: set_batch(2) equals setup(2): %.8f vs %.8f", tag, l3, l5);
    free(g0), free(g1), free(g2), free(g3), free(h.snaps), free(h.snap_ready);
    free_batch(&b);
    tz_dit_free(m);
    tz_dit_free(mc);
}

static void test_io(void) {
    char dir[256], sub[300], ad[300];
    snprintf(dir, sizeof dir, "%s/tz_dit_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(dir)) return;
    snprintf(sub, sizeof sub, "%s/model", dir);
    snprintf(ad, sizeof ad, "%s/adapter", dir);
    tz_dit_dims d = small_dims(1);
    d.diffusion = TZ_DIFF_FLOW;
    tz_model_opts o = {.full = 0, .lora.targets = (1 << TZ_DIT_QKV) | (1 << TZ_DIT_ADALN),
                     .lora.rank = 2, .lora.alpha = 4};
    tz_dit *m = tz_dit_create(g_be, &d, &o);
    randomize(m, 3);
    tz_dit_save(m, sub, 0);
    tz_adapter_save(&m->params, g_be, ad, tz_dit_lin_names, TZ_DIT_LIN_N, &o.lora, sub, NULL);
    tz_model_opts o2 = {0};
    tz_adapter_read_spec(ad, tz_dit_lin_names, TZ_DIT_LIN_N, &o2.lora);
    check(o2.lora.targets == o.lora.targets && o2.lora.rank == 2 && o2.lora.alpha == 4.0,
          "adapter_config.json round trip: targets attn.qkv + adaLN_modulation.1, r 2, alpha 4");
    tz_dit *m2 = tz_dit_load(g_be, sub, &o2);
    tz_adapter_load(&m2->params, g_be, ad, NULL);
    const tz_dit_dims *x = &m->d, *z = &m2->d; /* field by field: padding bytes are not data */
    check(x->input_size == z->input_size && x->patch_size == z->patch_size &&
              x->in_channels == z->in_channels && x->hidden == z->hidden && x->depth == z->depth &&
              x->num_heads == z->num_heads && x->mlp_ratio == z->mlp_ratio &&
              x->num_classes == z->num_classes && x->class_dropout_prob == z->class_dropout_prob &&
              x->learn_sigma == z->learn_sigma && x->freq_dim == z->freq_dim &&
              x->diffusion == z->diffusion,
          "config.json round trip: the same dims (flow, learn_sigma)");
    tz_dit_setup(m, 3);
    tz_dit_setup(m2, 3);
    batch b = make_batch(&d, 3, 4);
    double l1 = tz_dit_forward_loss(m, b.x, b.t, b.y, b.tgt);
    double l2 = tz_dit_forward_loss(m2, b.x, b.t, b.y, b.tgt);
    check(l1 == l2, "save + load (model and adapter): the same loss bitwise (%.8f)", l1);
    snprintf(sub, sizeof sub, "%s/bf16", dir);
    tz_dit_save(m, sub, 1);
    tz_dit *m3 = tz_dit_load(g_be, sub, &o2);
    tz_adapter_load(&m3->params, g_be, ad, NULL);
    tz_dit_setup(m3, 3);
    double l3 = tz_dit_forward_loss(m3, b.x, b.t, b.y, b.tgt);
    check(fabs(l3 - l1) < 1e-2 * l1 && l3 != l1, "bf16 save loads with a close loss (%.6f vs %.6f)", l3, l1);
    free_batch(&b);
    tz_dit_free(m), tz_dit_free(m2), tz_dit_free(m3);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) printf("note: could not remove %s\n", dir);
}

int main(void) {
    g_be = tz_cpu_backend_create(0);
    double t0 = omp_get_wtime();
    test_dims();
    test_zero_init();
    test_equivalences(1);
    test_equivalences(0);
    test_io();
    tz_cpu_backend_destroy(g_be);
    printf("(%.1f s)\n", omp_get_wtime() - t0);
    return tz_check_done("dit");
}
