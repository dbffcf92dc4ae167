/* The Flux family: cached latents and text embeddings (io/latents_h5.h) into a Flux.1
 * transformer with the flow-matching loss Flux trainers use (the shifted timestep sampling of
 * diffusers' FlowMatchEulerDiscreteScheduler, shift 3: sigma = 3u / (1 + 2u), u uniform); its
 * registry entry (LoRA targets by diffusers module names, init-model presets). The trainer's
 * rows are samples; a loss term is one squared error of the velocity. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/registry.h"
#include "core/error.h"
#include "core/rng.h"
#include "io/latents_h5.h"
#include "model/flux.h"
#include "task/task.h"
#include "train/data.h"

/* lora.targets names: the diffusers module names (model/flux.h) */
static const char *const targets[] = {
    "to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out",
    "ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj", "ff_context.net.2", "norm1.linear",
    "norm1_context.linear", "proj_mlp", "proj_out", "norm.linear", NULL};
_Static_assert(sizeof targets / sizeof targets[0] == TZ_FLUX_LIN_N + 1, "one name per projection");

#define FLUX_SHIFT 3.0    /* the timestep shift of Flux.1's scheduler */
#define FLUX_GUIDANCE 3.5f /* the guidance a guidance-distilled model (dev) is trained at */
#define EVAL_STEP 0x5EEDull

/* The data of a named shape (model.path "preset:NAME"): image tokens per sample from
 * data.seq_len (bench presets set it: 4,096 for 1024 x 1024, 128 x 128 latents packed 2 x 2;
 * 1,536 for 512 x 768), text tokens T5's 512 (8 for the tiny shape). */
static void preset_tokens(const char *shape, int64_t seq_len, int64_t *Ti, int64_t *Tt) {
    *Ti = seq_len;
    *Tt = !strcmp(shape, "flux-tiny") ? 8 : 512;
}

typedef struct rows {
    tz_latents f;  /* a file, or (random) nothing */
    int random;
    int64_t n;
} rows;

typedef struct flux_task {
    tz_task t;
    tz_flux *m;
    rows train, val;
    int have_val;
    tz_order order;
    int64_t Ti, Tt;
    float *img_ids, *txt_ids; /* the positions of every sample */
    float *lat, *noise, *xt, *target, *txt, *pooled, *sigma, *guidance;
} flux_task;

static tz_params *load(tz_task *t) {
    flux_task *k = (flux_task *)t;
    const char *shape = tz_model_preset_name(t->cfg->model.path);
    if (shape) {
        tz_flux_dims d;
        char err[256];
        if (tz_flux_preset(shape, &d, err, sizeof err))
            TZ_FATAL("model.path %s: no such shape of the flux family (%s)", t->cfg->model.path, err);
        k->m = tz_flux_create(t->be, &d, &t->opts);
        tz_params_fill_random(&k->m->params, t->be, k->m->levels, (uint64_t)t->cfg->run.seed);
    } else {
        if (t->opts.random_base)
            TZ_FATAL("model.path %s: a Flux folder is planned from its weights", t->cfg->model.path);
        k->m = tz_flux_load(t->be, t->cfg->model.path, &t->opts);
    }
    return &k->m->params;
}

static void open_rows(flux_task *k, rows *r, const char *path, const char *key) {
    char err[1200];
    const tz_flux_dims *d = &k->m->d;
    if (!path[0]) TZ_FATAL_HINT("set it in the config or with --set", "%s is not set", key);
    if (tz_latents_open(&r->f, path, err, sizeof err))
        TZ_FATAL_HINT("make the cache with tools/latents.py flux-cache (docs/dit.md, \"Flux\")",
                      "%s: %s", key, err);
    if (r->f.C != d->in_channels || r->f.J != d->joint_dim || r->f.P != d->pooled_dim)
        TZ_FATAL("%s: %s holds latent tokens of %lld, text embeddings of %lld and pooled "
                 "embeddings of %lld; the model takes %lld, %lld and %lld (in_channels, "
                 "joint_attention_dim, pooled_projection_dim)", key, path, (long long)r->f.C,
                 (long long)r->f.J, (long long)r->f.P, (long long)d->in_channels,
                 (long long)d->joint_dim, (long long)d->pooled_dim);
    if (k->Ti && (r->f.Ti != k->Ti || r->f.Tt != k->Tt))
        TZ_FATAL("%s: %s has %lld image and %lld text tokens per sample, data.train %lld and "
                 "%lld: one size per run", key, path, (long long)r->f.Ti, (long long)r->f.Tt,
                 (long long)k->Ti, (long long)k->Tt);
    if (!k->Ti) {
        k->Ti = r->f.Ti, k->Tt = r->f.Tt;
        k->img_ids = tz_xmalloc((size_t)(k->Ti * 3) * sizeof(float));
        k->txt_ids = tz_xmalloc((size_t)(k->Tt * 3) * sizeof(float));
        memcpy(k->img_ids, r->f.img_ids, (size_t)(k->Ti * 3) * sizeof(float));
        memcpy(k->txt_ids, r->f.txt_ids, (size_t)(k->Tt * 3) * sizeof(float));
    }
    r->n = r->f.n;
}

/* A named shape's data: 64 samples drawn from the seed, positions on a square grid. */
static void random_rows(flux_task *k, rows *r, const char *shape, int64_t seq_len) {
    preset_tokens(shape, seq_len, &k->Ti, &k->Tt);
    r->random = 1;
    r->n = 64;
    /* the grid: the most nearly square h x w of Ti tokens (64 x 64, 32 x 48, 4 x 4) */
    int64_t h = (int64_t)sqrt((double)k->Ti);
    while (h > 1 && k->Ti % h) h--;
    const int64_t w = k->Ti / (h > 0 ? h : 1);
    k->img_ids = tz_xcalloc((size_t)(k->Ti * 3), sizeof(float));
    k->txt_ids = tz_xcalloc((size_t)(k->Tt * 3), sizeof(float));
    for (int64_t i = 0; i < k->Ti; i++)
        k->img_ids[i * 3 + 1] = (float)(i / w), k->img_ids[i * 3 + 2] = (float)(i % w);
}

static void open_task(tz_task *t) {
    flux_task *k = (flux_task *)t;
    const tz_config *cfg = t->cfg;
    tz_flux *m = k->m;
    const tz_flux_dims *d = &m->d;
    const char *shape = tz_model_preset_name(cfg->model.path);
    if (t->training) {
        if (shape) random_rows(k, &k->train, shape, cfg->data.seq_len);
        else open_rows(k, &k->train, cfg->data.train, "data.train");
        tz_order_init(&k->order, k->train.n, (uint64_t)cfg->run.seed);
        t->n_train = k->train.n;
        snprintf(t->data_line, sizeof t->data_line, "%s: %lld samples of %lld image and %lld "
                 "text tokens", cfg->data.train, (long long)k->train.n, (long long)k->Ti,
                 (long long)k->Tt);
    }
    k->have_val = cfg->data.val[0] != 0 && !shape;
    if (k->have_val) {
        open_rows(k, &k->val, cfg->data.val, "data.val");
        t->n_val = k->val.n;
    }
    if (!k->Ti) TZ_FATAL_HINT("set data.val (cached latents) to evaluate", "flux: no data");
    const int64_t B = t->B, Ti = k->Ti, Tt = k->Tt, per = Ti * d->in_channels;
    tz_flux_setup(m, B, Ti, Tt);
    t->unit = "samples";
    t->row_name = "samples";
    t->arena_bytes = m->arena.cap;
    tz_task_host_acts(t, &m->stack, &m->keep);
    t->row_elems = Ti * d->out_channels;
    t->row_count = 1;
    snprintf(t->describe, sizeof t->describe,
             "flux %s | %lld double + %lld single blocks, %lld heads of %lld, %s, %lld image + "
             "%lld text tokens", cfg->model.path, (long long)d->layers,
             (long long)d->single_layers, (long long)d->heads, (long long)d->head_dim,
             d->guidance ? "guidance-distilled" : "no guidance embedder", (long long)Ti,
             (long long)Tt);
    k->lat = tz_xmalloc((size_t)(B * per) * sizeof(float));
    k->noise = tz_xmalloc((size_t)per * sizeof(float));
    k->xt = tz_xmalloc((size_t)(B * per) * sizeof(float));
    k->target = tz_xmalloc((size_t)(B * per) * sizeof(float));
    k->txt = tz_xmalloc((size_t)(B * Tt * d->joint_dim) * sizeof(float));
    k->pooled = tz_xmalloc((size_t)(B * d->pooled_dim) * sizeof(float));
    k->sigma = tz_xmalloc((size_t)B * sizeof(float));
    k->guidance = tz_xmalloc((size_t)B * sizeof(float));
}

/* Samples [first, first + n) (through the order when given): the cached inputs, then each
 * sample's draws from (seed, step, its index): u uniform, sigma = shift u / (1 + (shift-1) u),
 * the noise; x_t = (1 - sigma) x0 + sigma noise, target = noise - x0. */
static void gather(flux_task *k, rows *r, tz_order *order, int64_t first, int64_t n,
                   uint64_t seed, uint64_t step) {
    const tz_flux_dims *d = &k->m->d;
    const int64_t Ti = k->Ti, Tt = k->Tt, per = Ti * d->in_channels;
    char err[1200];
    for (int64_t i = 0; i < n; i++) {
        const int64_t row = order ? tz_order_at(order, first + i) : first + i;
        float *lat = k->lat + i * per, *txt = k->txt + i * Tt * d->joint_dim;
        float *pooled = k->pooled + i * d->pooled_dim;
        if (r->random) {
            tz_rng g = tz_rng_make(seed, (uint64_t)row, TZ_RNG_DATA, 2);
            for (int64_t j = 0; j < per; j++) lat[j] = (float)tz_rng_normal(&g);
            for (int64_t j = 0; j < Tt * d->joint_dim; j++) txt[j] = (float)tz_rng_normal(&g);
            for (int64_t j = 0; j < d->pooled_dim; j++) pooled[j] = (float)tz_rng_normal(&g);
        } else if (tz_latents_read(&r->f, row, lat, txt, pooled, err, sizeof err)) {
            TZ_FATAL("%s", err);
        }
        tz_rng g = tz_rng_make(seed, step, TZ_RNG_NOISE, (uint64_t)(first + i));
        const double u = (double)tz_rng_uniform(&g);
        const double s = FLUX_SHIFT * u / (1.0 + (FLUX_SHIFT - 1.0) * u);
        for (int64_t j = 0; j < per; j++) k->noise[j] = (float)tz_rng_normal(&g);
        for (int64_t j = 0; j < per; j++) {
            k->xt[i * per + j] = (float)((1.0 - s) * lat[j] + s * k->noise[j]);
            k->target[i * per + j] = (float)((double)k->noise[j] - (double)lat[j]);
        }
        k->sigma[i] = (float)s;
        k->guidance[i] = FLUX_GUIDANCE;
    }
}

static tz_flux_batch batch_of(const flux_task *k) {
    return (tz_flux_batch){k->xt, k->txt, k->pooled, k->sigma, k->guidance, k->img_ids,
                           k->txt_ids};
}

static double train_rows(tz_task *t, int64_t first, float dloss) {
    flux_task *k = (flux_task *)t;
    gather(k, &k->train, &k->order, first, t->B, (uint64_t)t->cfg->run.seed, 0);
    tz_flux_set_batch(k->m, t->B);
    const tz_flux_batch in = batch_of(k);
    return tz_flux_forward_backward(k->m, &in, k->target, dloss);
}

static double train_loss(tz_task *t, int64_t first) {
    flux_task *k = (flux_task *)t;
    gather(k, &k->train, &k->order, first, t->B, (uint64_t)t->cfg->run.seed, 0);
    tz_flux_set_batch(k->m, t->B);
    const tz_flux_batch in = batch_of(k);
    return tz_flux_forward_loss(k->m, &in, k->target);
}

static double eval_rows(tz_task *t, int64_t first, int64_t n) {
    flux_task *k = (flux_task *)t;
    gather(k, &k->val, NULL, first, n, (uint64_t)t->cfg->train.eval_seed, EVAL_STEP);
    tz_flux_set_batch(k->m, n);
    const tz_flux_batch in = batch_of(k);
    return tz_flux_forward_loss(k->m, &in, k->target);
}

static void save_model(tz_task *t, const char *dir, int bf16) {
    tz_flux_save(((flux_task *)t)->m, dir, bf16);
}

static void close_task(tz_task *t) {
    flux_task *k = (flux_task *)t;
    if (t->training) {
        if (!k->train.random) tz_latents_close(&k->train.f);
        tz_order_free(&k->order);
    }
    if (k->have_val) tz_latents_close(&k->val.f);
    free(k->img_ids), free(k->txt_ids), free(k->lat), free(k->noise), free(k->xt);
    free(k->target), free(k->txt), free(k->pooled), free(k->sigma), free(k->guidance);
    tz_flux_free(k->m);
}

/* The sigmas of diffusers' FluxPipeline (FlowMatchEulerDiscreteScheduler): linspace(1, 1/S, S),
 * shifted, then 0. shift > 0: s' = shift s / (1 + (shift - 1) s); otherwise a
 * guidance-distilled model (dev: use_dynamic_shifting) by its image tokens, mu = 0.5 + (1.15 -
 * 0.5) (Ti - 256) / (4096 - 256), s' = e^mu / (e^mu + 1/s - 1), and one without (schnell) not
 * at all. */
static void flux_sigmas(double *sig, int64_t steps, int64_t Ti, int guidance, double shift) {
    const double mu = 0.5 + (1.15 - 0.5) * (double)(Ti - 256) / (4096.0 - 256.0);
    for (int64_t i = 0; i < steps; i++) {
        double s = steps > 1 ? 1.0 + (double)i * (1.0 / (double)steps - 1.0) / (double)(steps - 1)
                             : 1.0;
        if (shift > 0) s = shift * s / (1.0 + (shift - 1.0) * s);
        else if (guidance) s = exp(mu) / (exp(mu) + (1.0 / s - 1.0));
        sig[i] = s;
    }
    sig[steps] = 0.0;
}

/* sample: Euler over the flow from noise to latents, conditioned on the text embeddings of a
 * cache's rows (--prompts; sample i takes row i mod N), one sample at a time; the latents
 * (packed tokens, in the space the cache holds) to an HDF5 file for tools/latents.py. */
static int sample(const tz_config *cfg, const tz_sample_args *a) {
    char err[1200];
    if (a->given & TZ_SAMPLE_CLASS)
        TZ_FATAL("sample: --class is for DiT models; a Flux model is conditioned on --prompts "
                 "(cached text embeddings)");
    if (!a->prompts[0])
        TZ_FATAL_HINT("make one with tools/latents.py flux-prompts, or pass a training cache "
                      "(docs/dit.md, \"Flux\")", "sample: a Flux model needs --prompts FILE.h5, "
                      "the text embeddings of its prompts");
    if (!tz_sample_out_h5(a->out))
        TZ_FATAL_HINT("decode them with tools/latents.py flux-decode", "sample: --out %s: a Flux "
                      "model writes latents, to an .h5 file", a->out);
    if (tz_model_preset_name(cfg->model.path))
        TZ_FATAL("sample: model.path %s: sampling needs a model folder", cfg->model.path);
    tz_latents f;
    if (tz_latents_open(&f, a->prompts, err, sizeof err))
        TZ_FATAL_HINT("make it with tools/latents.py (docs/dit.md, \"Flux\")", "sample: --prompts "
                      "%s", err);
    tz_model_opts o;
    tz_backend *be = tz_task_forward_setup(&tz_family_flux, cfg, &o);
    tz_flux *m = tz_flux_load(be, cfg->model.path, &o);
    tz_task_load_adapters(cfg, &o, &m->params, be);
    const tz_flux_dims *d = &m->d;
    if (f.C != d->in_channels || f.J != d->joint_dim || f.P != d->pooled_dim)
        TZ_FATAL("sample: --prompts %s holds latent tokens of %lld, text embeddings of %lld and "
                 "pooled embeddings of %lld; %s takes %lld, %lld and %lld", a->prompts,
                 (long long)f.C, (long long)f.J, (long long)f.P, cfg->model.path,
                 (long long)d->in_channels, (long long)d->joint_dim, (long long)d->pooled_dim);
    if (d->out_channels != d->in_channels)
        TZ_FATAL("sample: %s predicts %lld channels per token for latents of %lld",
                 cfg->model.path, (long long)d->out_channels, (long long)d->in_channels);
    if ((a->given & TZ_SAMPLE_GUIDANCE) && !d->guidance)
        TZ_FATAL_HINT("leave --guidance out", "sample: %s has no guidance embedder (a model "
                      "like schnell is sampled without guidance)", cfg->model.path);
    const int64_t steps = (a->given & TZ_SAMPLE_STEPS) ? a->steps : d->guidance ? 28 : 4;
    const float g = d->guidance ? (float)((a->given & TZ_SAMPLE_GUIDANCE) ? a->guidance
                                                                          : FLUX_GUIDANCE)
                                : 0.0f;
    const int64_t Ti = f.Ti, Tt = f.Tt, per = Ti * d->in_channels, n = a->n;
    tz_flux_setup(m, 1, Ti, Tt);
    double *sig = tz_xmalloc((size_t)(steps + 1) * sizeof *sig);
    flux_sigmas(sig, steps, Ti, d->guidance, a->shift);
    float *x = tz_xmalloc((size_t)per * sizeof *x), *v = tz_xmalloc((size_t)per * sizeof *v);
    float *txt = tz_xmalloc((size_t)(Tt * d->joint_dim) * sizeof *txt);
    float *pooled = tz_xmalloc((size_t)d->pooled_dim * sizeof *pooled);
    float *out = tz_xmalloc((size_t)(n * per) * sizeof *out);
    float *noise = tz_xmalloc((size_t)(n * per) * sizeof *noise);
    int64_t *prow = tz_xmalloc((size_t)n * sizeof *prow);
    for (int64_t i = 0; i < n; i++) {
        prow[i] = i % f.n;
        if (tz_latents_read(&f, prow[i], v, txt, pooled, err, sizeof err))
            TZ_FATAL("sample: %s", err);
        tz_rng r = tz_rng_make((uint64_t)a->seed, 0, TZ_RNG_NOISE, (uint64_t)i);
        for (int64_t j = 0; j < per; j++) x[j] = (float)tz_rng_normal(&r);
        memcpy(noise + i * per, x, (size_t)per * sizeof *x);
        for (int64_t k = 0; k < steps; k++) {
            const float s = (float)sig[k];
            const tz_flux_batch in = {x, txt, pooled, &s, &g, f.img_ids, f.txt_ids};
            tz_flux_forward(m, &in);
            be->download(be, v, tz_flux_output(m), (size_t)per * sizeof(float));
            const double dt = sig[k + 1] - sig[k];
            for (int64_t j = 0; j < per; j++) x[j] = (float)((double)x[j] + dt * (double)v[j]);
        }
        memcpy(out + i * per, x, (size_t)per * sizeof *x);
        tz_info("sample %lld/%lld: prompt row %lld, %lld Euler steps", (long long)(i + 1),
                (long long)n, (long long)prow[i], (long long)steps);
    }
    const tz_latents_out lo = {n, Ti, d->in_channels, steps, a->seed, g, out, noise, f.img_ids, prow};
    if (tz_latents_write(a->out, &lo, err, sizeof err)) TZ_FATAL("sample: %s", err);
    tz_info("wrote %s: %lld latents of %lld tokens from the prompts of %s, %lld steps, guidance "
            "%g, seed %lld", a->out, (long long)n, (long long)Ti, a->prompts, (long long)steps,
            (double)g, (long long)a->seed);
    free(sig), free(x), free(v), free(txt), free(pooled), free(out), free(noise), free(prow);
    tz_latents_close(&f);
    tz_flux_free(m);
    tz_backend_destroy(be);
    return 0;
}

/* init-model --arch flux --preset P: a random Flux transformer in the diffusers layout, every
 * weight drawn (the adaLN and output projections included, so it predicts something). */
static int64_t init_model(const tz_init_args *a, char *about, size_t n) {
    tz_flux_dims d;
    char err[512];
    if (tz_flux_preset(a->preset, &d, err, sizeof err))
        TZ_FATAL("init-model: --preset %s: %s", a->preset, err);
    tz_model_opts o = {0};
    tz_flux *m = tz_flux_create(a->be, &d, &o);
    tz_params_fill_random(&m->params, a->be, m->levels, a->seed);
    tz_flux_save(m, a->out, 0);
    snprintf(about, n, "%lld double + %lld single blocks, %lld heads of %lld, latent tokens of "
             "%lld, text %lld, pooled %lld%s", (long long)d.layers, (long long)d.single_layers,
             (long long)d.heads, (long long)d.head_dim, (long long)d.in_channels,
             (long long)d.joint_dim, (long long)d.pooled_dim, d.guidance ? ", guidance" : "");
    const int64_t count = m->params.n_total;
    tz_flux_free(m);
    return count;
}

static const char *const init_flags[] = {NULL};
static const tz_task_ops ops = {sizeof(flux_task), load, open_task, train_rows, eval_rows,
                                save_model, close_task, train_loss};
const tz_family tz_family_flux = {"flux", targets, tz_flux_lin_names, &ops, init_flags,
                                  init_model, sample, NULL, NULL, "transformer", NULL, 1};
