/* Diffusion maths in C: the DDPM schedule, seeded draws and label dropout, q_sample, the
 * samplers on exact oracles (DDIM and Euler recover x0 from a model that knows it), sampler
 * determinism on a real DiT, reproducible eval, and a short training run that lowers the
 * loss. The fp64 Python check of the sampler formulas is tests/ref/dit_ref.py --sampler. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/registry.h"
#include "core/rng.h"
#include "model/diffusion.h"
#include "tz_check.h"

static tz_backend *g_be;

static void test_schedule_and_draws(void) {
    tz_diffusion d;
    tz_diffusion_init(&d, TZ_DIFF_DDPM);
    /* DDPM's linear schedule: abar_0 = 1 - 1e-4, abar_999 = 4.0358e-5 */
    check(fabs(d.abar[0] - 0.9999) < 1e-15 && fabs(d.abar[999] / 4.0358e-5 - 1) < 1e-3 &&
              fabs(d.betas[999] - 0.02) < 1e-15,
          "linear betas 1e-4 .. 0.02: abar_0 = %.6f, abar_999 = %.4e", d.abar[0], d.abar[999]);
    float n1[16], n2[16], n3[16];
    double t1 = tz_diffusion_draw(&d, 7, 3, 11, n1, 16), t2 = tz_diffusion_draw(&d, 7, 3, 11, n2, 16);
    tz_diffusion_draw(&d, 7, 3, 12, n3, 16);
    check(t1 == t2 && !memcmp(n1, n2, sizeof n1) && memcmp(n1, n3, sizeof n1),
          "draws: same (seed, step, index) -> same timestep and noise; another index differs");
    int ok = 1;
    double mean = 0.0, var = 0.0;
    for (int i = 0; i < 4000; i++) {
        double t = tz_diffusion_draw(&d, 1, 0, (uint64_t)i, n1, 4);
        ok &= t >= 0 && t < 1000 && t == floor(t);
        for (int j = 0; j < 4; j++) mean += n1[j], var += (double)n1[j] * n1[j];
    }
    mean /= 16000, var = var / 16000 - mean * mean;
    check(ok && fabs(mean) < 0.03 && fabs(var - 1) < 0.05,
          "DDPM timesteps are integers in [0, 1000); noise mean %.3f variance %.3f", mean, var);
    tz_diffusion f;
    tz_diffusion_init(&f, TZ_DIFF_FLOW);
    ok = 1;
    for (int i = 0; i < 1000; i++) {
        double t = tz_diffusion_draw(&f, 1, 0, (uint64_t)i, NULL, 0);
        ok &= t >= 0 && t < 1;
    }
    check(ok, "flow times are in [0, 1)");
    int dropped = 0;
    for (int i = 0; i < 20000; i++) dropped += tz_diffusion_drop_label(3, 10, 0.1, 5, 1, (uint64_t)i) == 10;
    check(fabs(dropped / 20000.0 - 0.1) < 0.01 && tz_diffusion_drop_label(3, -1, 0.5, 5, 1, 0) == 3,
          "label dropout p = 0.1: %.4f dropped; no null class: never", dropped / 20000.0);
    float x0[3] = {1, -2, 0.5f}, e[3] = {0.3f, 0.1f, -1}, xt[3], tg[3], tm;
    tz_diffusion_q_sample(&d, 500, x0, e, 3, xt, tg, &tm);
    double a = sqrt(d.abar[500]), s = sqrt(1 - d.abar[500]);
    check(fabs(xt[1] - (a * -2 + s * 0.1)) < 1e-6 && tg[2] == -1 && tm == 500.0f,
          "DDPM q_sample: x_t = sqrt(abar) x0 + sqrt(1-abar) eps, target eps, model time t");
    tz_diffusion_q_sample(&f, 0.25, x0, e, 3, xt, tg, &tm);
    check(fabs(xt[0] - (0.75 + 0.25 * 0.3)) < 1e-6 && fabs(tg[1] - 2.1f) < 1e-6 && tm == 250.0f,
          "flow q_sample: x_t = (1-t) x0 + t eps, target eps - x0, model time 1000 t");
}

/* Oracles that know x0: DDIM with eta 0 and Euler on the straight flow path then land on x0. */
typedef struct {
    const tz_diffusion *d;
    const float *x0;
    int64_t numel;
} oracle;

static void oracle_fn(void *ctx, const float *x, const float *t, const int32_t *y, int64_t n,
                      float *out) {
    oracle *o = ctx;
    for (int64_t b = 0; b < n; b++)
        for (int64_t j = 0; j < o->numel; j++) {
            double xi = x[b * o->numel + j], x0 = o->x0[b * o->numel + j];
            if (o->d->kind == TZ_DIFF_FLOW) {
                out[b * o->numel + j] = (float)((xi - x0) / (t[b] / 1000.0)); /* v = (x_t - x0)/t */
            } else {
                double ab = o->d->abar[(int)t[b]];
                out[b * o->numel + j] = (float)((xi - sqrt(ab) * x0) / sqrt(1 - ab));
            }
        }
}

static void test_oracles(void) {
    const int64_t n = 2, numel = 10;
    float x0[20], out[20];
    tz_rng r = tz_rng_make(1, 0, TZ_RNG_TEST, 0);
    for (int i = 0; i < 20; i++) x0[i] = (float)tz_rng_normal(&r);
    int32_t y[2] = {0, 1};
    for (int kind = 0; kind < 2; kind++)
        for (int steps = 1000; steps >= 10; steps /= 10) {
            tz_diffusion d;
            tz_diffusion_init(&d, kind);
            oracle o = {&d, x0, numel};
            tz_diffusion_sample_fn(&d, oracle_fn, &o, y, n, numel, steps, 1.0, -1, 3, out);
            double e = 0.0;
            for (int i = 0; i < 20; i++) e = fmax(e, fabs(out[i] - x0[i]));
            check(e < 2e-3, "%s with %d steps on an exact oracle recovers x0 (max err %.1e)",
                  kind ? "Euler (flow)" : "DDIM (ddpm)", steps, e);
        }
}

static tz_dit *tiny_model(int kind) {
    tz_dit_dims d = {.input_size = 8, .patch_size = 4, .in_channels = 1, .hidden = 32,
                     .depth = 2, .num_heads = 2, .mlp_ratio = 2.0, .num_classes = 3,
                     .class_dropout_prob = 0.1, .freq_dim = 32, .diffusion = kind};
    tz_model_opts o = {.full = 1};
    tz_dit *m = tz_dit_create(g_be, &d, &o);
    tz_dit_init_random(m, 2);
    return m;
}

/* Gives the adaLN-Zero weights random values (an untrained DiT predicts exactly 0). */
static void wake(tz_dit *m) {
    for (int i = 0; i < m->params.n; i++) {
        tz_param *p = m->params.p[i];
        tz_rng r = tz_rng_make(4, (uint64_t)i, TZ_RNG_TEST, 0);
        float *h = malloc((size_t)p->numel * sizeof *h);
        g_be->download(g_be, h, p->w, (size_t)p->numel * sizeof *h);
        for (int64_t j = 0; j < p->numel; j++) h[j] += (float)(0.05 * tz_rng_normal(&r));
        g_be->upload(g_be, p->w, h, (size_t)p->numel * sizeof *h);
        free(h);
    }
}

static void test_sample_determinism(void) {
    for (int kind = 0; kind < 2; kind++) {
        tz_dit *m = tiny_model(kind);
        wake(m);
        tz_diffusion d;
        tz_diffusion_init(&d, kind);
        int32_t y[3] = {0, 2, 1};
        float a[192], b[192], c[192], one[64];
        tz_diffusion_sample(m, &d, y, 3, 8, 4.0, 42, a);
        tz_diffusion_sample(m, &d, y, 3, 8, 4.0, 42, b);
        tz_diffusion_sample(m, &d, y, 3, 8, 4.0, 43, c);
        tz_diffusion_sample(m, &d, y, 1, 8, 4.0, 42, one);
        double e = 0.0;
        for (int i = 0; i < 64; i++) e = fmax(e, fabs(one[i] - a[i]));
        const char *nm = kind ? "Euler" : "DDIM";
        check(!memcmp(a, b, sizeof a), "%s + guidance on a DiT: same seed, identical samples", nm);
        check(memcmp(a, c, sizeof a) != 0, "%s: another seed, other samples", nm);
        check(e < 1e-5, "%s: sample 0 does not depend on the batch size (max diff %.1e)", nm, e);
        tz_dit_free(m);
    }
}

/* A few SGD steps on 8 images lower the reproducible eval loss. */
static void test_train_eval(void) {
    tz_dit *m = tiny_model(TZ_DIFF_DDPM);
    tz_diffusion d;
    tz_diffusion_init(&d, TZ_DIFF_DDPM);
    const int64_t B = 8, numel = 64;
    float x0[8 * 64];
    int32_t y[8];
    for (int b = 0; b < B; b++) {
        y[b] = b % 3;
        for (int j = 0; j < numel; j++) x0[b * numel + j] = (j / 8 + j % 8) % 2 ? 0.8f : -0.8f;
    }
    tz_dit_setup(m, B);
    float *grad = g_be->alloc(g_be, (size_t)m->params.flat_numel * sizeof(float));
    tz_params_bind_grads(&m->params, grad);
    const double elems = (double)(B * numel);
    double e0 = tz_diffusion_eval_batch(m, &d, x0, y, 9, 0) / elems;
    double e0b = tz_diffusion_eval_batch(m, &d, x0, y, 9, 0) / elems;
    check(e0 == e0b, "eval loss is reproducible (%.6f)", e0);
    for (int step = 0; step < 30; step++) {
        g_be->fill(g_be, grad, 0.0f, m->params.flat_numel);
        tz_diffusion_train_batch(m, &d, x0, y, 9, (uint64_t)step, 0, (float)(1.0 / elems));
        for (int i = 0; i < m->params.n; i++)
            if (m->params.p[i]->g)
                g_be->axpy(g_be, m->params.p[i]->w, -0.2f, m->params.p[i]->g, m->params.p[i]->numel);
    }
    double e1 = tz_diffusion_eval_batch(m, &d, x0, y, 9, 0) / elems;
    check(e1 < 0.9 * e0, "30 SGD steps lower the eval loss: %.4f -> %.4f", e0, e1);
    g_be->release(g_be, grad);
    tz_dit_free(m);
}

int main(void) {
    g_be = tz_cpu_backend_create(0);
    double t0 = omp_get_wtime();
    test_schedule_and_draws();
    test_oracles();
    test_sample_determinism();
    test_train_eval();
    tz_cpu_backend_destroy(g_be);
    printf("(%.1f s)\n", omp_get_wtime() - t0);
    return tz_check_done("diffusion");
}
