/* Lloyd-Max scalar codebooks for N(0,1) at 1-4 bits, computed by Lloyd iteration on the
 * Gaussian density with exact (erf-based) segment moments. No quantization of tensors here. */
#ifndef TZ_CODEBOOK_H
#define TZ_CODEBOOK_H
#include <stddef.h>
#include <stdint.h>

#include "quant/tq_layout.h"

#define TZ_TQ_MAX_LEVELS (1 << TZ_TQ_MAX_BITS)

/* The b-bit codebook: n = 2^b centroids sorted ascending, symmetric (c[n-1-k] = -c[k]),
 * decision thresholds t[k] = (c[k] + c[k+1]) / 2 between code k and k+1, and the MSE per
 * coordinate D(b) = E[(z - c(z))^2] for z ~ N(0,1). Plain data: copy it, upload it. */
typedef struct tz_tq_codebook {
    int bits;
    int n;                                  /* 2^bits */
    float centroids[TZ_TQ_MAX_LEVELS];      /* fp32, what the quantizer uses */
    float thresholds[TZ_TQ_MAX_LEVELS - 1]; /* fp32 midpoints */
    double centroids_f64[TZ_TQ_MAX_LEVELS]; /* the converged values */
    double mse;                             /* D(b) */
    int iterations;                         /* Lloyd iterations to convergence */
} tz_tq_codebook;

/* Computes the b-bit codebook (1 <= bits <= 4) by Lloyd iteration until no centroid moves
 * by more than 1e-13. 0 on success; -1 with a message in err for bits out of range. */
int tz_tq_codebook_init(tz_tq_codebook *cb, int bits, char *err, size_t errlen);

/* Index of the nearest centroid of z: the number of thresholds below z (binary search).
 * NaN maps to an unspecified valid index. */
static inline int tz_tq_codebook_nearest(const tz_tq_codebook *cb, float z) {
    int lo = 0, hi = cb->n - 1; /* answer in [lo, hi] */
    while (lo < hi) {
        int mid = (lo + hi) >> 1;
        if (z > cb->thresholds[mid]) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* The segment moments of N(0,1) on [a, b] (a or b may be +-INFINITY): mass P(a<z<b),
 * first moment E[z; a<z<b] and second moment E[z^2; a<z<b]. Exposed for tests. */
void tz_tq_gauss_moments(double a, double b, double *m0, double *m1, double *m2);

#endif
