/* Diffusion objectives and samplers around a DiT: DDPM epsilon prediction (linear betas
 * 1e-4 .. 0.02, T = 1000) and rectified flow (velocity); seeded draws of timesteps, noise and
 * label dropout; DDIM (eta 0) and Euler samplers with classifier-free guidance. Host maths;
 * the network is model/dit.h. No VLB term, no learned-variance sampling.
 *
 * Conventions (docs/dit.md):
 *  DDPM: t integer in [0, T); abar_t = prod_{s<=t} (1 - beta_s) (double);
 *        x_t = sqrt(abar_t) x0 + sqrt(1 - abar_t) eps; target eps; model time t.
 *  flow: t in [0, 1); x_t = (1 - t) x0 + t eps (t = 1 is pure noise); target v = eps - x0;
 *        model time 1000 t (the same range as DDPM for the sinusoidal embedding).
 *  Draws of one sample come from the stream tz_rng_make(seed, step, TZ_RNG_NOISE, index):
 *  first the timestep, then the noise values in order; label dropout from
 *  tz_rng_make(seed, step, TZ_RNG_DROPOUT, index). Eval uses step TZ_DIFF_EVAL_STEP. */
#ifndef TZ_DIFFUSION_H
#define TZ_DIFFUSION_H
#include <stdint.h>

#include "model/dit.h"

#define TZ_DIFF_T 1000
#define TZ_DIFF_EVAL_STEP UINT64_MAX /* the fixed `step` of every eval draw */

typedef struct tz_diffusion {
    int kind; /* enum tz_diff_kind (model/dit.h) */
    double betas[TZ_DIFF_T];
    double abar[TZ_DIFF_T]; /* alphas_cumprod */
} tz_diffusion;

void tz_diffusion_init(tz_diffusion *d, int kind);

/* The timestep of one sample (DDPM: an integer in [0, T) as a double; flow: [0, 1)) and, if
 * noise is not NULL, numel standard normal values, from (seed, step, index). */
double tz_diffusion_draw(const tz_diffusion *d, uint64_t seed, uint64_t step, uint64_t index,
                         float *noise, int64_t numel);
/* x_t, the regression target and the model time of one sample (conventions above). */
void tz_diffusion_q_sample(const tz_diffusion *d, double t, const float *x0, const float *noise,
                           int64_t numel, float *x_t, float *target, float *t_model);
/* y, or null_class with probability p (p <= 0 or null_class < 0: y). */
int32_t tz_diffusion_drop_label(int32_t y, int32_t null_class, double p, uint64_t seed,
                                uint64_t step, uint64_t index);

/* One training micro-batch of the current batch size m->n: draws for samples index0 ..
 * index0+n-1 of step `step`, label dropout with m's class_dropout_prob, then
 * tz_dit_forward_backward with dloss. x0 [n, C, H, W] and y [n] on the host. Returns the SSE
 * (divide by n * C * H * W for the mean). index0: the first sample's position in the global
 * batch, so the draws do not depend on how the batch is split over ranks. */
double tz_diffusion_train_batch(tz_dit *m, const tz_diffusion *d, const float *x0,
                                const int32_t *y, uint64_t seed, uint64_t step, uint64_t index0,
                                float dloss);
/* The loss of tz_diffusion_train_batch (the same draws and label dropout), forward only. */
double tz_diffusion_train_loss(tz_dit *m, const tz_diffusion *d, const float *x0,
                               const int32_t *y, uint64_t seed, uint64_t step, uint64_t index0);
/* The same forward without dropout or backward, drawn at step TZ_DIFF_EVAL_STEP: a held-out
 * image always meets the same timestep and noise, so losses compare across runs. SSE. */
double tz_diffusion_eval_batch(tz_dit *m, const tz_diffusion *d, const float *x0,
                               const int32_t *y, uint64_t seed, uint64_t index0);

/* A prediction function for the samplers: out[n, numel] = eps (DDPM) or v (flow) for x
 * [n, numel] at model times t_model [n] and labels y [n]. */
typedef void (*tz_diff_model_fn)(void *ctx, const float *x, const float *t_model,
                                 const int32_t *y, int64_t n, float *out);

/* Samples n images of numel values into out from labels y: DDIM with eta 0 (DDPM) over the
 * timesteps floor(k T / S), k = S-1 .. 0, or Euler (flow) from t = 1 to 0 in S equal steps.
 * guidance w != 1 batches each step as [x; x] with labels [y; null_class] and uses
 * u + w (c - u). The start noise of sample i is tz_rng_make(seed, 0, TZ_RNG_NOISE, i), so a
 * sample does not depend on n; the result is deterministic for a seed. */
void tz_diffusion_sample_fn(const tz_diffusion *d, tz_diff_model_fn f, void *ctx,
                            const int32_t *y, int64_t n, int64_t numel, int steps,
                            double guidance, int32_t null_class, uint64_t seed, float *out);
/* The same with a DiT (d->kind must be the model's diffusion): out [n, C, H, W], values as
 * trained (pixels in [-1, 1], or latents). Calls tz_dit_setup when the model's batch is
 * smaller than n (2n with guidance): set the model up again before training. */
void tz_diffusion_sample(tz_dit *m, const tz_diffusion *d, const int32_t *y, int64_t n,
                         int steps, double guidance, uint64_t seed, float *out);

#endif
