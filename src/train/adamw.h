/* AdamW on a host shard of the flat trainable space (fp32 master, m, v), the LR schedule
 * (linear warmup, cosine decay to a floor). The shard is whatever slice this rank owns. */
#ifndef TZ_ADAMW_H
#define TZ_ADAMW_H
#include <stdint.h>

typedef struct tz_adamw_hparams {
    double lr, beta1, beta2, eps, weight_decay;
} tz_adamw_hparams;

/* One step t (1-based) over n elements: g is the (already clipped, scaled) gradient;
 * decay[i] != 0 where weight decay applies (NULL: everywhere). Decoupled decay:
 * w -= lr * (mhat / (sqrt(vhat) + eps) + wd * w). OpenMP over elements. */
void tz_adamw_step(float *w, float *m, float *v, const float *g, const uint8_t *decay,
                   int64_t n, int64_t t, const tz_adamw_hparams *h, float grad_scale);

/* Learning rate at step (0-based) of total: linear warmup over `warmup` steps to lr, then
 * cosine from lr down to lr * min_ratio at the last step. */
double tz_lr_at(int64_t step, int64_t total, int64_t warmup, double lr, double min_ratio);

#endif
