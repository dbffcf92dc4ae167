/* AdamW, the first optimizer behind the tz_optim interface (optim/optim.h): decoupled weight
 * decay, bias-corrected moments, over a range of a host shard. No parameters, no ranks. */
#ifndef TZ_ADAMW_H
#define TZ_ADAMW_H
#include <stdint.h>

#include "optim/optim.h"

/* "adamw", states "exp_avg" (m) and "exp_avg_sq" (v), as torch.optim.AdamW names them.
 * Reads lr, beta1, beta2, eps, weight_decay. */
extern const tz_optim tz_optim_adamw;

/* Elements [lo, hi): g = a->g * grad_scale; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 * w -= lr * (m c1 / (sqrt(v c2) + eps) + wd w), c1 = 1/(1-b1^t), c2 = 1/(1-b2^t), wd where
 * decay[i] != 0 (NULL: everywhere). fp32 arithmetic, one flat vectorised loop; t 1-based. */
void tz_adamw_step(const tz_optim_arrays *a, int64_t lo, int64_t hi, int64_t t,
                   const tz_optim_hparams *h, float grad_scale);

#endif
