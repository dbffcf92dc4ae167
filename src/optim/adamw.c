/* CPU AdamW over a range of a shard, written as one flat loop the compiler vectorises. Knows
 * nothing of parameters, ranks or threads: the shard (optim/optim.c) hands it the ranges. */
#include "optim/adamw.h"

#include <math.h>
#include <stddef.h>

const tz_optim tz_optim_adamw = {
    .name = "adamw",
    .n_states = 2,
    .state_names = {"exp_avg", "exp_avg_sq"},
    .step = tz_adamw_step,
};

tz_adamw_args tz_adamw_args_of(const tz_optim_hparams *h, int64_t t, float grad_scale) {
    const tz_adamw_args a = {.lr = (float)h->lr, .beta1 = (float)h->beta1,
                             .beta2 = (float)h->beta2, .eps = (float)h->eps,
                             .weight_decay = (float)h->weight_decay,
                             .c1 = (float)(1.0 / (1.0 - pow(h->beta1, (double)t))),
                             .c2 = (float)(1.0 / (1.0 - pow(h->beta2, (double)t))),
                             .grad_scale = grad_scale};
    return a;
}

static void adamw_range(float *restrict w, float *restrict m, float *restrict v,
                        const float *restrict g, const uint8_t *restrict decay, int64_t n,
                        const tz_optim_hparams *h, int64_t t, float grad_scale) {
    const tz_adamw_args a = tz_adamw_args_of(h, t, grad_scale);
#pragma omp simd
    for (int64_t i = 0; i < n; i++)
        tz_adamw_elem(&w[i], &m[i], &v[i], g[i], decay == NULL || decay[i], &a);
}

void tz_adamw_step(const tz_optim_arrays *a, int64_t lo, int64_t hi, int64_t t,
                   const tz_optim_hparams *h, float grad_scale) {
    if (hi <= lo) return;
    adamw_range(a->w + lo, (float *)a->state[0] + lo, (float *)a->state[1] + lo, a->g + lo,
                a->decay ? a->decay + lo : NULL, hi - lo, h, t, grad_scale);
}
