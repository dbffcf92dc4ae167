/* DDPM and rectified-flow objectives, seeded draws, and the DDIM / Euler samplers with
 * classifier-free guidance, in double on the host. The network runs through model/dit.h;
 * nothing here touches backend memory except through tz_dit. */
#include "model/diffusion.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/rng.h"

void tz_diffusion_init(tz_diffusion *d, int kind) {
    memset(d, 0, sizeof *d);
    d->kind = kind;
    double prod = 1.0;
    for (int i = 0; i < TZ_DIFF_T; i++) {
        /* np.linspace(1e-4, 0.02, T, dtype=np.float64), as DiT's get_beta_schedule */
        d->betas[i] = 1e-4 + (0.02 - 1e-4) * (double)i / (double)(TZ_DIFF_T - 1);
        prod *= 1.0 - d->betas[i];
        d->abar[i] = prod;
    }
}

double tz_diffusion_draw(const tz_diffusion *d, uint64_t seed, uint64_t step, uint64_t index,
                         float *noise, int64_t numel) {
    tz_rng r = tz_rng_make(seed, step, TZ_RNG_NOISE, index);
    double t = d->kind == TZ_DIFF_FLOW ? (double)tz_rng_uniform(&r)
                                       : (double)tz_rng_below(&r, TZ_DIFF_T);
    if (noise)
        for (int64_t i = 0; i < numel; i++) noise[i] = (float)tz_rng_normal(&r);
    return t;
}

void tz_diffusion_q_sample(const tz_diffusion *d, double t, const float *x0, const float *noise,
                           int64_t numel, float *x_t, float *target, float *t_model) {
    if (d->kind == TZ_DIFF_FLOW) {
        for (int64_t i = 0; i < numel; i++) {
            x_t[i] = (float)((1.0 - t) * x0[i] + t * noise[i]);
            target[i] = (float)((double)noise[i] - (double)x0[i]);
        }
        *t_model = (float)(1000.0 * t);
        return;
    }
    int ti = (int)t;
    if (ti < 0 || ti >= TZ_DIFF_T) TZ_FATAL("diffusion: timestep %d outside 0..%d", ti, TZ_DIFF_T - 1);
    double a = sqrt(d->abar[ti]), s = sqrt(1.0 - d->abar[ti]);
    for (int64_t i = 0; i < numel; i++) {
        x_t[i] = (float)(a * x0[i] + s * noise[i]);
        target[i] = noise[i];
    }
    *t_model = (float)ti;
}

int32_t tz_diffusion_drop_label(int32_t y, int32_t null_class, double p, uint64_t seed,
                                uint64_t step, uint64_t index) {
    if (p <= 0.0 || null_class < 0) return y;
    tz_rng r = tz_rng_make(seed, step, TZ_RNG_DROPOUT, index);
    return (double)tz_rng_uniform(&r) < p ? null_class : y;
}

/* Inputs of m->n samples from x0 and y; returns host buffers in one allocation. */
static float *make_batch(tz_dit *m, const tz_diffusion *d, const float *x0, const int32_t *y,
                         uint64_t seed, uint64_t step, uint64_t index0, int dropout,
                         int32_t **ylab) {
    const int64_t n = m->n, numel = tz_dit_image_numel(&m->d);
    float *buf = tz_xmalloc((size_t)(3 * n * numel + n) * sizeof(float));
    float *x_t = buf, *target = buf + n * numel, *noise = buf + 2 * n * numel;
    float *tm = buf + 3 * n * numel;
    int32_t *yl = tz_xmalloc((size_t)n * sizeof *yl);
    for (int64_t b = 0; b < n; b++) {
        double t = tz_diffusion_draw(d, seed, step, index0 + (uint64_t)b, noise, numel);
        tz_diffusion_q_sample(d, t, x0 + b * numel, noise, numel, x_t + b * numel,
                              target + b * numel, &tm[b]);
        yl[b] = dropout ? tz_diffusion_drop_label(y[b], tz_dit_null_class(&m->d),
                                                  m->d.class_dropout_prob, seed, step,
                                                  index0 + (uint64_t)b)
                        : y[b];
    }
    *ylab = yl;
    return buf;
}

double tz_diffusion_train_batch(tz_dit *m, const tz_diffusion *d, const float *x0,
                                const int32_t *y, uint64_t seed, uint64_t step, uint64_t index0,
                                float dloss) {
    const int64_t n = m->n, numel = tz_dit_image_numel(&m->d);
    int32_t *yl;
    float *buf = make_batch(m, d, x0, y, seed, step, index0, 1, &yl);
    double sse = tz_dit_forward_backward(m, buf, buf + 3 * n * numel, yl, buf + n * numel, dloss);
    free(buf);
    free(yl);
    return sse;
}

double tz_diffusion_train_loss(tz_dit *m, const tz_diffusion *d, const float *x0,
                               const int32_t *y, uint64_t seed, uint64_t step, uint64_t index0) {
    const int64_t n = m->n, numel = tz_dit_image_numel(&m->d);
    int32_t *yl;
    float *buf = make_batch(m, d, x0, y, seed, step, index0, 1, &yl);
    double sse = tz_dit_forward_loss(m, buf, buf + 3 * n * numel, yl, buf + n * numel);
    free(buf);
    free(yl);
    return sse;
}

double tz_diffusion_eval_batch(tz_dit *m, const tz_diffusion *d, const float *x0,
                               const int32_t *y, uint64_t seed, uint64_t index0) {
    const int64_t n = m->n, numel = tz_dit_image_numel(&m->d);
    int32_t *yl;
    float *buf = make_batch(m, d, x0, y, seed, TZ_DIFF_EVAL_STEP, index0, 0, &yl);
    double sse = tz_dit_forward_loss(m, buf, buf + 3 * n * numel, yl, buf + n * numel);
    free(buf);
    free(yl);
    return sse;
}

/* ---- samplers ---- */

void tz_diffusion_sample_fn(const tz_diffusion *d, tz_diff_model_fn f, void *ctx,
                            const int32_t *y, int64_t n, int64_t numel, int steps,
                            double guidance, int32_t null_class, uint64_t seed, float *out) {
    if (steps < 1 || steps > TZ_DIFF_T) TZ_FATAL("sample: --steps %d outside 1..%d", steps, TZ_DIFF_T);
    const int cfg = guidance != 1.0;
    if (cfg && null_class < 0)
        TZ_FATAL_HINT("sample with --guidance 1, or train with class_dropout_prob > 0",
                      "sample: guidance %g needs a null class, and this model has none", guidance);
    const int64_t nb = cfg ? 2 * n : n;
    float *x = tz_xmalloc((size_t)(nb * numel) * sizeof *x);
    float *pred = tz_xmalloc((size_t)(nb * numel) * sizeof *pred);
    float *tm = tz_xmalloc((size_t)nb * sizeof *tm);
    int32_t *lab = tz_xmalloc((size_t)nb * sizeof *lab);
    for (int64_t i = 0; i < n; i++) {
        tz_rng r = tz_rng_make(seed, 0, TZ_RNG_NOISE, (uint64_t)i);
        for (int64_t j = 0; j < numel; j++) out[i * numel + j] = (float)tz_rng_normal(&r);
        lab[i] = y[i];
        if (cfg) lab[n + i] = null_class;
    }
    for (int k = steps; k >= 1; k--) {
        /* DDPM: the timestep floor((k-1) T / S) and the previous one (or abar = 1 at the end);
         * flow: t = k / S -> (k-1) / S */
        double tk, a_t = 0.0, a_prev = 1.0;
        if (d->kind == TZ_DIFF_FLOW) {
            tk = 1000.0 * (double)k / (double)steps;
        } else {
            int64_t ti = (int64_t)(k - 1) * TZ_DIFF_T / steps;
            tk = (double)ti;
            a_t = d->abar[ti];
            if (k > 1) a_prev = d->abar[(int64_t)(k - 2) * TZ_DIFF_T / steps];
        }
        memcpy(x, out, (size_t)(n * numel) * sizeof *x);
        if (cfg) memcpy(x + n * numel, out, (size_t)(n * numel) * sizeof *x);
        for (int64_t i = 0; i < nb; i++) tm[i] = (float)tk;
        f(ctx, x, tm, lab, nb, pred);
        for (int64_t i = 0; i < n * numel; i++) {
            double e = pred[i];
            if (cfg) e = (double)pred[n * numel + i] + guidance * (e - (double)pred[n * numel + i]);
            double xi = out[i];
            if (d->kind == TZ_DIFF_FLOW) {
                out[i] = (float)(xi - e / (double)steps);
            } else {
                double x0 = (xi - sqrt(1.0 - a_t) * e) / sqrt(a_t);
                out[i] = (float)(sqrt(a_prev) * x0 + sqrt(1.0 - a_prev) * e);
            }
        }
    }
    free(x);
    free(pred);
    free(tm);
    free(lab);
}

/* The DiT as a tz_diff_model_fn: the first C output channels of each sample. */
static void dit_predict(void *ctx, const float *x, const float *t_model, const int32_t *y,
                        int64_t n, float *out) {
    tz_dit *m = ctx;
    const int64_t numel = tz_dit_image_numel(&m->d);
    const int64_t ld = tz_dit_out_channels(&m->d) * m->d.input_size * m->d.input_size;
    tz_dit_set_batch(m, n);
    tz_dit_forward(m, x, t_model, y);
    for (int64_t b = 0; b < n; b++)
        m->be->download(m->be, out + b * numel, tz_dit_output(m) + b * ld,
                        (size_t)numel * sizeof(float));
}

void tz_diffusion_sample(tz_dit *m, const tz_diffusion *d, const int32_t *y, int64_t n,
                         int steps, double guidance, uint64_t seed, float *out) {
    if (d->kind != m->d.diffusion)
        TZ_FATAL("sample: the model was trained for %s, the sampler is for %s",
                 m->d.diffusion == TZ_DIFF_FLOW ? "flow" : "ddpm",
                 d->kind == TZ_DIFF_FLOW ? "flow" : "ddpm");
    const int64_t need = guidance != 1.0 ? 2 * n : n;
    if (!m->arena.base || m->B < need) tz_dit_setup(m, need);
    tz_diffusion_sample_fn(d, dit_predict, m, y, n, tz_dit_image_numel(&m->d), steps, guidance,
                           tz_dit_null_class(&m->d), seed, out);
}
