/* Dense linear layer with optional LoRA, as matmuls on the backend. Quantized weights are
 * not handled here yet; this file is where they will be dequantized for the GEMM. */
#include "model/linear.h"

void tz_linear_fwd(tz_backend *be, const tz_linear *l, float *y, float *h, const float *x,
                   int64_t n) {
    /* y[n,out] = x[n,in] . W[out,in]^T */
    be->matmul(be, y, x, l->w->w, n, l->out, l->in, 0, 1, 1.0f, 0.0f);
    if (l->a) {
        be->matmul(be, h, x, l->a->w, n, l->r, l->in, 0, 1, 1.0f, 0.0f);        /* h = x A^T */
        be->matmul(be, y, h, l->b->w, n, l->out, l->r, 0, 1, l->scale, 1.0f); /* y += s h B^T */
    }
}

void tz_linear_bwd(tz_backend *be, const tz_linear *l, float *dx, const float *dy,
                   const float *x, const float *h, float *scratch, int64_t n) {
    if (l->w->g) /* dW[out,in] += dy^T x */
        be->matmul(be, l->w->g, dy, x, l->out, l->in, n, 1, 0, 1.0f, 1.0f);
    if (dx) /* dx[n,in] += dy[n,out] W[out,in] */
        be->matmul(be, dx, dy, l->w->w, n, l->in, l->out, 0, 0, 1.0f, 1.0f);
    if (!l->a) return;
    if (l->b->g) /* dB[out,r] += s dy^T h */
        be->matmul(be, l->b->g, dy, h, l->out, l->r, n, 1, 0, l->scale, 1.0f);
    /* dh[n,r] = s dy B */
    be->matmul(be, scratch, dy, l->b->w, n, l->r, l->out, 0, 0, l->scale, 0.0f);
    if (l->a->g) /* dA[r,in] += dh^T x */
        be->matmul(be, l->a->g, scratch, x, l->r, l->in, n, 1, 0, 1.0f, 1.0f);
    if (dx) /* dx += dh A */
        be->matmul(be, dx, scratch, l->a->w, n, l->in, l->r, 0, 0, 1.0f, 1.0f);
}
