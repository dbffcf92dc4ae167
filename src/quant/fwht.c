/* Fast Walsh-Hadamard transform, TurboQuant sign vectors and the per-group rotation of rows
 * (forward and transpose), OpenMP over rows. No codebooks or packing here. */
#include "quant/fwht.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/rng.h"
#include "quant/tq_layout.h"

/* Stages h = 1, 2 and 4 on each block of 8, in registers: the same butterflies, on the same
 * values, as the plain loop below, so the same bits; the plain loop's short inner loops
 * (1, 2 and 4 long) are what keeps it from vectorising. */
static void fwht_first3(float *x, int64_t g) {
    for (int64_t i = 0; i < g; i += 8) {
        float *p = x + i;
        float a0 = p[0] + p[1], a1 = p[0] - p[1], a2 = p[2] + p[3], a3 = p[2] - p[3];
        float a4 = p[4] + p[5], a5 = p[4] - p[5], a6 = p[6] + p[7], a7 = p[6] - p[7];
        float b0 = a0 + a2, b2 = a0 - a2, b1 = a1 + a3, b3 = a1 - a3;
        float b4 = a4 + a6, b6 = a4 - a6, b5 = a5 + a7, b7 = a5 - a7;
        p[0] = b0 + b4, p[4] = b0 - b4, p[1] = b1 + b5, p[5] = b1 - b5;
        p[2] = b2 + b6, p[6] = b2 - b6, p[3] = b3 + b7, p[7] = b3 - b7;
    }
}

void tz_fwht(float *x, int64_t g) {
    int64_t h0 = 1;
    if (g >= 8 && g % 8 == 0) {
        fwht_first3(x, g);
        h0 = 8;
    }
    for (int64_t h = h0; h < g; h *= 2) {
        for (int64_t i = 0; i < g; i += 2 * h) {
            float *lo = x + i, *hi = x + i + h;
#pragma omp simd
            for (int64_t k = 0; k < h; k++) {
                float a = lo[k], b = hi[k];
                lo[k] = a + b;
                hi[k] = a - b;
            }
        }
    }
}

void tz_tq_signs(uint64_t seed, int64_t group_index, int64_t g, float *out) {
    tz_rng r = tz_rng_make(seed, (uint64_t)group_index, TZ_RNG_QUANT, 0);
    for (int64_t m = 0; m < g / 64; m++) {
        uint64_t w = tz_rng_u64(&r);
        for (int k = 0; k < 64; k++) out[m * 64 + k] = ((w >> k) & 1u) ? -1.0f : 1.0f;
    }
}

void tz_tq_signs_row(uint64_t seed, int64_t cols, int64_t g, float *out) {
    for (int64_t j = 0; j < cols / g; j++) tz_tq_signs(seed, j, g, out + j * g);
}

int tz_tq_check_shape(int64_t cols, int64_t g, char *err, size_t errlen) {
    if (g != 64 && g != 128 && g != 256) {
        snprintf(err, errlen, "quantization group %lld is not 64, 128 or 256", (long long)g);
        return -1;
    }
    if (cols <= 0 || cols % g != 0) {
        snprintf(err, errlen,
                 "row length %lld is not a positive multiple of the quantization group %lld",
                 (long long)cols, (long long)g);
        return -1;
    }
    return 0;
}

static void check_shape_or_die(int64_t cols, int64_t g) {
    char err[160];
    if (tz_tq_check_shape(cols, g, err, sizeof err)) TZ_FATAL("%s", err);
}

void tz_tq_rotate_signed(float *y, const float *x, int64_t rows, int64_t cols, int64_t g,
                         const float *signs) {
    check_shape_or_die(cols, g);
    const float inv = (float)(1.0 / sqrt((double)g));
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        for (int64_t j = 0; j < cols; j += g) {
            for (int64_t i = 0; i < g; i++) yr[j + i] = signs[j + i] * xr[j + i];
            tz_fwht(yr + j, g);
            for (int64_t i = 0; i < g; i++) yr[j + i] *= inv;
        }
    }
}

void tz_tq_rotate_inv_signed(float *dx, const float *dy, int64_t rows, int64_t cols, int64_t g,
                             const float *signs) {
    check_shape_or_die(cols, g);
    const float inv = (float)(1.0 / sqrt((double)g));
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *dyr = dy + r * cols;
        float *dxr = dx + r * cols;
        if (dxr != dyr) memcpy(dxr, dyr, (size_t)cols * sizeof *dxr);
        for (int64_t j = 0; j < cols; j += g) {
            tz_fwht(dxr + j, g);
            for (int64_t i = 0; i < g; i++) dxr[j + i] *= signs[j + i] * inv;
        }
    }
}

void tz_tq_rotate(float *y, const float *x, int64_t rows, int64_t cols, int64_t g,
                  uint64_t seed) {
    check_shape_or_die(cols, g);
    float *signs = tz_xmalloc((size_t)cols * sizeof *signs);
    tz_tq_signs_row(seed, cols, g, signs);
    tz_tq_rotate_signed(y, x, rows, cols, g, signs);
    free(signs);
}

void tz_tq_rotate_inv(float *dx, const float *dy, int64_t rows, int64_t cols, int64_t g,
                      uint64_t seed) {
    check_shape_or_die(cols, g);
    float *signs = tz_xmalloc((size_t)cols * sizeof *signs);
    tz_tq_signs_row(seed, cols, g, signs);
    tz_tq_rotate_inv_signed(dx, dy, rows, cols, g, signs);
    free(signs);
}
