/* Linear layers: y = x W^T (+ LoRA: scale * (x A^T) B^T), forward and backward through the
 * backend. The one place where weights meet adapters (and, later, quantization). */
#ifndef TZ_LINEAR_H
#define TZ_LINEAR_H
#include <stdint.h>

#include "core/arena.h"
#include "core/backend.h"
#include "model/params.h"

typedef struct tz_linear {
    int64_t in, out;
    tz_param *w;   /* [out, in] */
    tz_param *a;   /* LoRA A [r, in], NULL without adapter */
    tz_param *b;   /* LoRA B [out, r] */
    int64_t r;
    float scale;   /* alpha / r */
} tz_linear;

/* y[n, out] = x[n, in] W^T (+ LoRA). h[n, r] receives x A^T when adapted (saved for
 * backward); h may be NULL without adapter. */
void tz_linear_fwd(tz_backend *be, const tz_linear *l, float *y, float *h, const float *x,
                   int64_t n);
/* Accumulates dx += dy W (+ LoRA path), and the weight / adapter gradients where trainable.
 * dx may be NULL (input gradient not needed). scratch: n * r floats when adapted. */
void tz_linear_bwd(tz_backend *be, const tz_linear *l, float *dx, const float *dy,
                   const float *x, const float *h, float *scratch, int64_t n);

#endif
