/* Lloyd-Max codebooks of N(0,1): Lloyd iteration with closed-form segment moments (erf, erfc
 * and the density), symmetric, to 1e-13. No tables pasted here: turboquant.md's table is the test. */
#include "quant/codebook.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define TZ_INV_SQRT2 0.70710678118654752440
#define TZ_INV_SQRT_2PI 0.39894228040143267794

static double gauss_pdf(double x) {
    if (isinf(x)) return 0.0;
    return TZ_INV_SQRT_2PI * exp(-0.5 * x * x);
}

/* x * pdf(x), 0 at the infinite ends. */
static double gauss_xpdf(double x) {
    if (isinf(x)) return 0.0;
    return x * gauss_pdf(x);
}

/* P(a < z < b), accurate in both tails: differences of erfc on the side away from 0. */
static double gauss_mass(double a, double b) {
    if (a >= 0.0) return 0.5 * (erfc(a * TZ_INV_SQRT2) - erfc(b * TZ_INV_SQRT2));
    if (b <= 0.0) return 0.5 * (erfc(-b * TZ_INV_SQRT2) - erfc(-a * TZ_INV_SQRT2));
    return 0.5 * (erf(b * TZ_INV_SQRT2) - erf(a * TZ_INV_SQRT2));
}

void tz_tq_gauss_moments(double a, double b, double *m0, double *m1, double *m2) {
    double p = gauss_mass(a, b);
    *m0 = p;
    *m1 = gauss_pdf(a) - gauss_pdf(b);             /* int_a^b z phi(z) dz */
    *m2 = p + gauss_xpdf(a) - gauss_xpdf(b);       /* int_a^b z^2 phi(z) dz */
}

/* Lower and upper edge of segment k given the midpoints of the centroids c[0..n-1]. */
static void segment_edges(const double *c, int n, int k, double *lo, double *hi) {
    *lo = k == 0 ? -INFINITY : 0.5 * (c[k - 1] + c[k]);
    *hi = k == n - 1 ? INFINITY : 0.5 * (c[k] + c[k + 1]);
}

int tz_tq_codebook_init(tz_tq_codebook *cb, int bits, char *err, size_t errlen) {
    memset(cb, 0, sizeof *cb);
    if (bits < 1 || bits > TZ_TQ_MAX_BITS) {
        snprintf(err, errlen, "codebook bits %d out of range (1..%d)", bits, TZ_TQ_MAX_BITS);
        return -1;
    }
    int n = 1 << bits;
    double c[TZ_TQ_MAX_LEVELS], next[TZ_TQ_MAX_LEVELS];
    /* Start from uniform levels over [-2, 2] (any ascending start converges: the Gaussian
     * is log-concave, so the Lloyd-Max fixed point is unique). */
    for (int k = 0; k < n; k++) c[k] = n == 2 ? (k ? 1.0 : -1.0) : -2.0 + 4.0 * k / (n - 1);
    const int max_iter = 1000000;
    int it = 0;
    for (; it < max_iter; it++) {
        double moved = 0.0;
        for (int k = 0; k < n; k++) {
            double lo, hi, m0, m1, m2;
            segment_edges(c, n, k, &lo, &hi);
            tz_tq_gauss_moments(lo, hi, &m0, &m1, &m2);
            next[k] = m1 / m0; /* centroid of the segment */
        }
        for (int k = 0; k < n / 2; k++) { /* exact symmetry */
            double v = 0.5 * (next[n - 1 - k] - next[k]);
            next[k] = -v;
            next[n - 1 - k] = v;
        }
        for (int k = 0; k < n; k++) {
            double d = fabs(next[k] - c[k]);
            if (d > moved) moved = d;
            c[k] = next[k];
        }
        if (moved < 1e-13) break;
    }
    if (it == max_iter) {
        snprintf(err, errlen, "Lloyd iteration for %d bits did not converge", bits);
        return -1;
    }
    double mse = 0.0;
    for (int k = 0; k < n; k++) {
        double lo, hi, m0, m1, m2;
        segment_edges(c, n, k, &lo, &hi);
        tz_tq_gauss_moments(lo, hi, &m0, &m1, &m2);
        mse += m2 - 2.0 * c[k] * m1 + c[k] * c[k] * m0; /* E[(z - c_k)^2; segment k] */
    }
    cb->bits = bits;
    cb->n = n;
    cb->mse = mse;
    cb->iterations = it + 1;
    for (int k = 0; k < n; k++) {
        cb->centroids_f64[k] = c[k];
        cb->centroids[k] = (float)c[k];
    }
    for (int k = 0; k + 1 < n; k++) cb->thresholds[k] = (float)(0.5 * (c[k] + c[k + 1]));
    return 0;
}
