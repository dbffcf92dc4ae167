/* CPU AdamW over a contiguous shard, written as one flat loop the compiler vectorises, and
 * the LR schedule. Knows nothing of parameters or ranks: the caller hands it the slice. */
#include "train/adamw.h"

#include <math.h>
#include <stddef.h>

void tz_adamw_step(float *restrict w, float *restrict m, float *restrict v,
                   const float *restrict g, const uint8_t *restrict decay, int64_t n, int64_t t,
                   const tz_adamw_hparams *h, float grad_scale) {
    const float b1 = (float)h->beta1, b2 = (float)h->beta2, eps = (float)h->eps;
    const float lr = (float)h->lr, wd = (float)h->weight_decay;
    const float c1 = (float)(1.0 / (1.0 - pow(h->beta1, (double)t)));
    const float c2 = (float)(1.0 / (1.0 - pow(h->beta2, (double)t)));
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i] * grad_scale;
        float mi = b1 * m[i] + (1.0f - b1) * gi;
        float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float upd = (mi * c1) / (sqrtf(vi * c2) + eps);
        float d = (decay == NULL || decay[i]) ? wd : 0.0f;
        w[i] -= lr * (upd + d * w[i]);
    }
}

double tz_lr_at(int64_t step, int64_t total, int64_t warmup, double lr, double min_ratio) {
    if (warmup > 0 && step < warmup) return lr * (double)(step + 1) / (double)warmup;
    int64_t span = total - warmup;
    if (span <= 1) return lr;
    double p = (double)(step - warmup) / (double)(span - 1);
    if (p > 1.0) p = 1.0;
    return lr * (min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + cos(M_PI * p)));
}
