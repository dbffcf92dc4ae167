/* Test tool for tests/ref/dit_ref.py: a tiny random DiT (every weight and bias nonzero,
 * adaLN-Zero included), one diffusion batch, its loss and every trainable gradient (of a
 * second call on the same model); or, with
 * --sampler, the DDIM / Euler samplers run on a fixed fake model. Not installed. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/world.h"
#include "backend/registry.h"
#include "core/error.h"
#include "core/rng.h"
#include "io/safetensors.h"
#include "model/diffusion.h"
#include "model/dit_io.h"

static const char *arg(int argc, char **argv, const char *name, const char *def) {
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], name)) return argv[i + 1];
    return def;
}

/* Adds normal(0, std) to every element of p (downloaded, perturbed, uploaded). */
static void perturb(tz_backend *be, tz_param *p, double std, tz_rng *r) {
    float *h = tz_xmalloc((size_t)p->numel * sizeof *h);
    be->download(be, h, p->w, (size_t)p->numel * sizeof *h);
    for (int64_t i = 0; i < p->numel; i++) h[i] += (float)(std * tz_rng_normal(r));
    be->upload(be, p->w, h, (size_t)p->numel * sizeof *h);
    free(h);
}

typedef struct {
    tz_st_writer w;
    void *bufs[512];
    int nb;
} dump;

static void put(dump *d, const char *name, enum tz_dtype dt, int ndim, const int64_t *shape,
                const void *src, size_t bytes) {
    char err[1024];
    if (d->nb == 512) TZ_FATAL("dump: too many tensors");
    void *c = tz_xmalloc(bytes ? bytes : 1);
    memcpy(c, src, bytes);
    d->bufs[d->nb++] = c;
    if (tz_st_writer_add(&d->w, name, dt, ndim, shape, c, err, sizeof err)) TZ_FATAL("%s", err);
}

/* ---- the fake model of the sampler check: out = 0.5 sin(x) + 5e-4 t + 0.1 (y+1) cos(j) ---- */

typedef struct {
    int64_t numel;
} fake_ctx;

static void fake_model(void *ctx, const float *x, const float *t, const int32_t *y, int64_t n,
                       float *out) {
    int64_t numel = ((fake_ctx *)ctx)->numel;
    for (int64_t b = 0; b < n; b++)
        for (int64_t j = 0; j < numel; j++)
            out[b * numel + j] = (float)(0.5 * sin((double)x[b * numel + j]) + 5e-4 * t[b] +
                                         0.1 * (y[b] + 1) * cos((double)j));
}

static void run_sampler(const char *kind, const char *out) {
    const int64_t n = 3, numel = 20;
    const int steps = 10;
    const double w = 3.0;
    const uint64_t seed = 11;
    tz_diffusion d;
    tz_diffusion_init(&d, !strcmp(kind, "euler") ? TZ_DIFF_FLOW : TZ_DIFF_DDPM);
    int32_t y[3] = {0, 2, 4};
    float x[60], x0[60];
    fake_ctx c = {numel};
    tz_diffusion_sample_fn(&d, fake_model, &c, y, n, numel, steps, w, 5, seed, x);
    for (int64_t i = 0; i < n; i++) { /* the start noise, as the sampler draws it */
        tz_rng r = tz_rng_make(seed, 0, TZ_RNG_NOISE, (uint64_t)i);
        for (int64_t j = 0; j < numel; j++) x0[i * numel + j] = (float)tz_rng_normal(&r);
    }
    dump dm = {0};
    tz_st_writer_init(&dm.w);
    int64_t sh[2] = {n, numel}, three = 3;
    float meta[3] = {(float)steps, (float)w, 5.0f};
    put(&dm, "samples", TZ_DT_F32, 2, sh, x, sizeof x);
    put(&dm, "noise", TZ_DT_F32, 2, sh, x0, sizeof x0);
    put(&dm, "labels", TZ_DT_I32, 1, &three, y, sizeof y);
    put(&dm, "steps_guidance_null", TZ_DT_F32, 1, &three, meta, sizeof meta);
    char err[1024];
    if (tz_st_writer_save(&dm.w, out, err, sizeof err)) TZ_FATAL("%s", err);
    for (int i = 0; i < dm.nb; i++) free(dm.bufs[i]);
    tz_st_writer_free(&dm.w);
    printf("sampler %s: %lld samples written to %s\n", kind, (long long)n, out);
}

int main(int argc, char **argv) {
    tz_mpi_singleton_defaults();
    MPI_Init(&argc, &argv);
    const char *out = arg(argc, argv, "--out", NULL), *sampler = arg(argc, argv, "--sampler", NULL);
    const char *mdir = arg(argc, argv, "--model-out", NULL);
    if (out && sampler) {
        run_sampler(sampler, out);
        MPI_Finalize();
        return 0;
    }
    if (!out || !mdir)
        TZ_FATAL("usage: tz_dit_dump --model-out DIR --out FILE [--mode lora|full] [--sigma 0|1] "
                 "[--diffusion ddpm|flow] [--ckpt 0|1] [--B n] [--seed s] [--targets bits] "
                 "[--rank r] [--alpha a] | --sampler ddim|euler --out FILE");
    int full = !strcmp(arg(argc, argv, "--mode", "lora"), "full");
    int64_t B = atoll(arg(argc, argv, "--B", "3"));
    uint64_t seed = (uint64_t)atoll(arg(argc, argv, "--seed", "1"));
    tz_dit_dims dd = {.input_size = 8, .patch_size = 2, .in_channels = 2, .hidden = 32,
                      .depth = 2, .num_heads = 4, .mlp_ratio = 4.0, .num_classes = 5,
                      .class_dropout_prob = 0.1, .freq_dim = 256};
    dd.learn_sigma = atoi(arg(argc, argv, "--sigma", "0"));
    dd.diffusion = !strcmp(arg(argc, argv, "--diffusion", "ddpm"), "flow") ? TZ_DIFF_FLOW
                                                                             : TZ_DIFF_DDPM;
    tz_model_opts o = {0};
    o.full = full;
    o.lora.targets = full ? 0 : atoi(arg(argc, argv, "--targets", "31"));
    o.lora.rank = atoll(arg(argc, argv, "--rank", "4"));
    o.lora.alpha = atof(arg(argc, argv, "--alpha", "8"));
    o.checkpointing = atoi(arg(argc, argv, "--ckpt", "0"));
    tz_backend *be = tz_cpu_backend_create(0);
    tz_dit *m = tz_dit_create(be, &dd, &o);
    tz_dit_init_random(m, seed);
    tz_model_init_lora(&m->params, m->be, seed);
    for (int i = 0; i < m->params.n; i++) { /* no zero (adaLN-Zero, biases, lora_B) left */
        tz_param *p = m->params.p[i];
        tz_rng r = tz_rng_make(seed, (uint64_t)i, TZ_RNG_TEST, 0);
        if (!p->adapter || strstr(p->name, "lora_B")) perturb(be, p, p->ndim == 1 ? 0.1 : 0.05, &r);
    }
    tz_dit_save(m, mdir, 0);

    const int64_t numel = tz_dit_image_numel(&dd);
    tz_diffusion df;
    tz_diffusion_init(&df, dd.diffusion);
    float *x0 = tz_xmalloc((size_t)(B * numel) * sizeof(float)), *noise = tz_xmalloc((size_t)(B * numel) * sizeof(float));
    float *xt = tz_xmalloc((size_t)(B * numel) * sizeof(float)), *tgt = tz_xmalloc((size_t)(B * numel) * sizeof(float));
    float *tm = tz_xmalloc((size_t)B * sizeof(float)), *traw = tz_xmalloc((size_t)B * sizeof(float));
    int32_t *y = tz_xmalloc((size_t)B * sizeof(int32_t));
    tz_rng r = tz_rng_make(seed, 1, TZ_RNG_TEST, 1);
    for (int64_t i = 0; i < B * numel; i++) x0[i] = (float)(0.7 * tz_rng_normal(&r));
    for (int64_t b = 0; b < B; b++) {
        traw[b] = (float)tz_diffusion_draw(&df, seed, 5, (uint64_t)b, noise + b * numel, numel);
        tz_diffusion_q_sample(&df, traw[b], x0 + b * numel, noise + b * numel, numel,
                              xt + b * numel, tgt + b * numel, &tm[b]);
        y[b] = (int32_t)(b % (dd.num_classes + 1)); /* the last one is the null class */
    }
    if (B > 5) y[B - 1] = (int32_t)dd.num_classes;
    tz_dit_setup(m, B);
    float *grad = be->alloc(be, (size_t)m->params.flat_numel * sizeof(float));
    tz_params_bind_grads(&m->params, grad);
    double dloss = 1.0 / (double)(B * numel);
    /* twice, the gradients zeroed between, and the second call's loss and gradients dumped: a
     * buffer that an op adds into while it still holds the first call's values shows in the
     * second (on a first call the arena's zeros hide it) */
    (void)tz_dit_forward_backward(m, xt, tm, y, tgt, (float)dloss);
    be->fill(be, grad, 0.0f, m->params.flat_numel);
    double loss = tz_dit_forward_backward(m, xt, tm, y, tgt, (float)dloss) * dloss;

    dump dm = {0};
    tz_st_writer_init(&dm.w);
    int64_t one = 1, ish[4] = {B, dd.in_channels, dd.input_size, dd.input_size};
    float lossf = (float)loss;
    put(&dm, "loss", TZ_DT_F32, 1, &one, &lossf, sizeof lossf);
    put(&dm, "x0", TZ_DT_F32, 4, ish, x0, (size_t)(B * numel) * sizeof(float));
    put(&dm, "noise", TZ_DT_F32, 4, ish, noise, (size_t)(B * numel) * sizeof(float));
    put(&dm, "x_t", TZ_DT_F32, 4, ish, xt, (size_t)(B * numel) * sizeof(float));
    put(&dm, "t", TZ_DT_F32, 1, &B, traw, (size_t)B * sizeof(float));
    put(&dm, "y", TZ_DT_I32, 1, &B, y, (size_t)B * sizeof(int32_t));
    char name[300];
    float *h = tz_xmalloc((size_t)m->params.flat_numel * sizeof(float) + 4);
    for (int i = 0; i < m->params.n; i++) {
        tz_param *p = m->params.p[i];
        size_t bytes = (size_t)p->numel * sizeof(float);
        if (p->adapter) {
            be->download(be, h, p->w, bytes);
            snprintf(name, sizeof name, "w:%s", p->name);
            put(&dm, name, TZ_DT_F32, p->ndim, p->shape, h, bytes);
        }
        if (p->g) {
            be->download(be, h, p->g, bytes);
            snprintf(name, sizeof name, "g:%s", p->name);
            put(&dm, name, TZ_DT_F32, p->ndim, p->shape, h, bytes);
        }
    }
    char err[1024];
    if (tz_st_writer_save(&dm.w, out, err, sizeof err)) TZ_FATAL("%s", err);
    printf("loss %.8f; %d tensors written to %s\n", loss, dm.nb, out);
    for (int i = 0; i < dm.nb; i++) free(dm.bufs[i]);
    tz_st_writer_free(&dm.w);
    free(h), free(x0), free(noise), free(xt), free(tgt), free(tm), free(traw), free(y);
    be->release(be, grad);
    tz_dit_free(m);
    tz_cpu_backend_destroy(be);
    MPI_Finalize();
    return 0;
}
