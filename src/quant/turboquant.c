/* TurboQuant quantize / dequantize (plain and rotated basis), the absmax baseline and the
 * relative error, OpenMP over groups. No I/O and no model code; the math is in turboquant.h. */
#include "quant/turboquant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/dtype.h"
#include "quant/fwht.h"

int tz_tq_tensor_init(tz_tq_tensor *t, int bits, int group, int64_t rows, int64_t cols,
                      uint64_t seed, char *err, size_t errlen) {
    memset(t, 0, sizeof *t);
    if (bits < 1 || bits > TZ_TQ_MAX_BITS) {
        snprintf(err, errlen, "quantization bits %d out of range (1..%d)", bits,
                 TZ_TQ_MAX_BITS);
        return -1;
    }
    if (tz_tq_check_shape(cols, group, err, errlen)) return -1;
    if (rows <= 0 || rows > INT64_MAX / cols) {
        snprintf(err, errlen, "quantized tensor rows %lld invalid for %lld columns",
                 (long long)rows, (long long)cols);
        return -1;
    }
    t->bits = bits;
    t->group = group;
    t->rows = rows;
    t->cols = cols;
    t->seed = seed;
    t->codes = tz_xcalloc((size_t)tz_tq_codes_bytes(rows, cols, bits), 1);
    t->scales = tz_xcalloc((size_t)tz_tq_scales_count(rows, cols, group), sizeof *t->scales);
    return 0;
}

void tz_tq_tensor_free(tz_tq_tensor *t) {
    free(t->codes);
    free(t->scales);
    memset(t, 0, sizeof *t);
}

void tz_tq_tensor_header(const tz_tq_tensor *t, tz_tq_header *h) {
    memset(h, 0, sizeof *h);
    h->magic = TZ_TQ_MAGIC;
    h->version = TZ_TQ_VERSION;
    h->bits = (uint8_t)t->bits;
    h->codebook = TZ_TQ_CODEBOOK_LLOYD_GAUSS;
    h->group = (uint32_t)t->group;
    h->scale_dtype = TZ_TQ_SCALE_BF16;
    h->rows = t->rows;
    h->cols = t->cols;
    h->seed = t->seed;
}

static void check_codebook(const tz_tq_tensor *t, const tz_tq_codebook *cb) {
    if (!cb || cb->bits != t->bits || cb->n != (1 << t->bits))
        TZ_FATAL("codebook of %d bits given for a %d-bit tensor", cb ? cb->bits : -1, t->bits);
}

/* Quantizes one group w (length g) with its signs s into packed codes and a bf16 scale. */
/* A uniform in [0, 1) for element i of global group gi under seed sr (a pure function of
 * the three: the same on any thread count). */
static float sr_uniform(uint64_t sr, int64_t gi, int i) {
    uint64_t x = sr ^ ((uint64_t)gi * 0x9e3779b97f4a7c15ULL + (uint64_t)i * 0xbf58476d1ce4e5b9ULL);
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return (float)(x >> 40) * (1.0f / 16777216.0f);
}

/* sr != 0: stochastic rounding. The scale is the nearest codes' least-squares fit lambda (the
 * reconstruction of r is lambda * c); then each element takes one of the two centroids around
 * r / lambda with the probabilities that make its expected reconstruction r (clamped at the
 * outermost centroids), seeded by (sr, global group gi, element). */
static void quantize_group(const float *w, const float *s, int g, const tz_tq_codebook *cb,
                           uint8_t *packed, uint16_t *scale, uint64_t sr, int64_t gi) {
    float r[TZ_TQ_MAX_GROUP];
    uint8_t idx[TZ_TQ_MAX_GROUP];
    double nn = 0.0;
    for (int i = 0; i < g; i++) {
        r[i] = s[i] * w[i];
        nn += (double)w[i] * (double)w[i];
    }
    tz_fwht(r, g);
    double norm = sqrt(nn);
    if (norm == 0.0) { /* all zero: the code nearest 0 and a zero scale decode to zeros */
        memset(idx, cb->n / 2, (size_t)g);
        *scale = tz_f32_to_bf16(0.0f);
    } else {
        double inv = 1.0 / norm, num = 0.0, den = 0.0;
        /* the nearest centroid = the number of decision thresholds below z: the same index
         * as tz_tq_codebook_nearest's binary search (ties and NaN included), branch-free */
        const int nt = cb->n - 1;
        for (int i = 0; i < g; i++) {
            const float z = (float)((double)r[i] * inv);
            int k = 0;
            for (int j = 0; j < nt; j++) k += z > cb->thresholds[j];
            idx[i] = (uint8_t)k;
        }
        for (int i = 0; i < g; i++) {
            double c = cb->centroids[idx[i]];
            num += (double)r[i] * c;
            den += c * c;
        }
        *scale = tz_f32_to_bf16((float)(num / (sqrt((double)g) * den)));
        const double lambda = tz_bf16_to_f32(*scale) * sqrt((double)g);
        if (sr && lambda > 0) {
            const float *c = cb->centroids;
            for (int i = 0; i < g; i++) {
                const double u = (double)r[i] / lambda;
                int lo = 0; /* the last centroid <= u */
                while (lo + 1 < cb->n && c[lo + 1] <= u) lo++;
                if (u <= c[0]) idx[i] = 0;
                else if (lo == cb->n - 1) idx[i] = (uint8_t)lo;
                else {
                    const double p = (u - c[lo]) / ((double)c[lo + 1] - c[lo]);
                    idx[i] = (uint8_t)(sr_uniform(sr, gi, i) < p ? lo + 1 : lo);
                }
            }
        }
    }
    tz_tq_pack_group(packed, idx, g, cb->bits);
}

/* Absmax round-to-nearest of one group x (length g) into packed codes and a bf16 step. */
static void absmax_group(const float *x, int g, int bits, uint8_t *packed, uint16_t *scale) {
    const int n = 1 << bits;
    const float half = 0.5f * (float)(n - 1);
    uint8_t idx[TZ_TQ_MAX_GROUP];
    float amax = 0.0f;
    for (int i = 0; i < g; i++) amax = fmaxf(amax, fabsf(x[i]));
    uint16_t sb = tz_f32_to_bf16(2.0f * amax / (float)(n - 1));
    float step = tz_bf16_to_f32(sb);
    if (step == 0.0f) {
        memset(idx, n / 2, (size_t)g);
    } else {
        float inv = 1.0f / step;
        for (int i = 0; i < g; i++) {
            float q = floorf(x[i] * inv + half + 0.5f); /* nearest level */
            q = q < 0.0f ? 0.0f : (q > (float)(n - 1) ? (float)(n - 1) : q);
            idx[i] = (uint8_t)q;
        }
    }
    *scale = sb;
    tz_tq_pack_group(packed, idx, g, bits);
}

void tz_tq_quantize_range(int method, const tz_tq_codebook *cb, int bits, int group,
                          int64_t cols, uint64_t seed, const float *w, int64_t first,
                          int64_t count, uint8_t *codes, uint16_t *scales) {
    tz_tq_quantize_range_sr(method, cb, bits, group, cols, seed, w, first, count, codes, scales, 0);
}

void tz_tq_quantize_range_sr(int method, const tz_tq_codebook *cb, int bits, int group,
                             int64_t cols, uint64_t seed, const float *w, int64_t first,
                             int64_t count, uint8_t *codes, uint16_t *scales, uint64_t sr) {
    if (bits < 1 || bits > TZ_TQ_MAX_BITS || (group != 64 && group != 128 && group != 256) ||
        cols <= 0 || cols % group || first < 0 || count < 0)
        TZ_FATAL("quantize_range: %d bits, group %d, %lld columns, groups [%lld, +%lld)", bits,
                 group, (long long)cols, (long long)first, (long long)count);
    const int g = group;
    const int64_t gbytes = TZ_TQ_GROUP_BYTES(g, bits), per_row = cols / g;
    if (method == TZ_TQ_ABSMAX) {
#pragma omp parallel for schedule(static)
        for (int64_t k = 0; k < count; k++)
            absmax_group(w + k * g, g, bits, codes + k * gbytes, scales + k);
        return;
    }
    if (!cb || cb->bits != bits || cb->n != (1 << bits))
        TZ_FATAL("codebook of %d bits given for %d-bit codes", cb ? cb->bits : -1, bits);
    float *signs = tz_xmalloc((size_t)cols * sizeof *signs);
    tz_tq_signs_row(seed, cols, g, signs);
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < count; k++) {
        int64_t j = (first + k) % per_row;
        quantize_group(w + k * g, signs + j * g, g, cb, codes + k * gbytes, scales + k, sr,
                       first + k);
    }
    free(signs);
}

void tz_tq_quantize_groups(tz_tq_tensor *t, const tz_tq_codebook *cb, const float *w,
                           int64_t first, int64_t count) {
    check_codebook(t, cb);
    int64_t total = tz_tq_tensor_groups(t);
    if (first < 0 || count < 0 || first > total || count > total - first)
        TZ_FATAL("groups [%lld, %lld) outside the tensor's %lld groups", (long long)first,
                 (long long)(first + count), (long long)total);
    const int64_t g = t->group, gbytes = TZ_TQ_GROUP_BYTES(t->group, t->bits);
    tz_tq_quantize_range(TZ_TQ_TURBOQUANT, cb, t->bits, t->group, t->cols, t->seed,
                         w + first * g, first, count, t->codes + first * gbytes,
                         t->scales + first);
}

void tz_tq_quantize(tz_tq_tensor *t, const tz_tq_codebook *cb, const float *w) {
    tz_tq_quantize_groups(t, cb, w, 0, tz_tq_tensor_groups(t));
}

/* out[i] = scale * c[idx_i] for one group: the code vector q in the rotated basis. */
static void decode_group(const uint8_t *packed, uint16_t scale, int g, const tz_tq_codebook *cb,
                         float *out) {
    uint8_t idx[TZ_TQ_MAX_GROUP];
    tz_tq_unpack_group(idx, packed, g, cb->bits);
    float sc = tz_bf16_to_f32(scale);
    for (int i = 0; i < g; i++) out[i] = sc * cb->centroids[idx[i]];
}

void tz_tq_dequantize_rotated(const tz_tq_tensor *t, const tz_tq_codebook *cb, float *w_rot) {
    check_codebook(t, cb);
    const int g = t->group;
    const int64_t gbytes = TZ_TQ_GROUP_BYTES(g, t->bits), total = tz_tq_tensor_groups(t);
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < total; k++)
        decode_group(t->codes + k * gbytes, t->scales[k], g, cb, w_rot + k * g);
}

void tz_tq_dequantize(const tz_tq_tensor *t, const tz_tq_codebook *cb, float *w_hat) {
    check_codebook(t, cb);
    const int g = t->group;
    const int64_t gbytes = TZ_TQ_GROUP_BYTES(g, t->bits), total = tz_tq_tensor_groups(t);
    const int64_t per_row = t->cols / g;
    const float inv = (float)(1.0 / sqrt((double)g));
    float *signs = tz_xmalloc((size_t)t->cols * sizeof *signs);
    tz_tq_signs_row(t->seed, t->cols, g, signs);
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < total; k++) {
        float *out = w_hat + k * g;
        const float *s = signs + (k % per_row) * g;
        decode_group(t->codes + k * gbytes, t->scales[k], g, cb, out);
        tz_fwht(out, g);
        for (int i = 0; i < g; i++) out[i] = s[i] * (out[i] * inv);
    }
    free(signs);
}

void tz_tq_dequantize_range(int method, const tz_tq_codebook *cb, int bits, int group,
                            int64_t cols, uint64_t seed, const uint8_t *codes,
                            const uint16_t *scales, int64_t first, int64_t count, float *w_hat) {
    if (bits < 1 || bits > TZ_TQ_MAX_BITS || (group != 64 && group != 128 && group != 256) ||
        cols <= 0 || cols % group || first < 0 || count < 0)
        TZ_FATAL("dequantize_range: %d bits, group %d, %lld columns, groups [%lld, +%lld)",
                 bits, group, (long long)cols, (long long)first, (long long)count);
    const int g = group;
    const int64_t gbytes = TZ_TQ_GROUP_BYTES(g, bits), per_row = cols / g;
    if (method == TZ_TQ_ABSMAX) {
        const float half = 0.5f * (float)((1 << bits) - 1);
#pragma omp parallel for schedule(static)
        for (int64_t k = 0; k < count; k++) {
            uint8_t idx[TZ_TQ_MAX_GROUP];
            tz_tq_unpack_group(idx, codes + k * gbytes, g, bits);
            float step = tz_bf16_to_f32(scales[k]);
            for (int i = 0; i < g; i++) w_hat[k * g + i] = ((float)idx[i] - half) * step;
        }
        return;
    }
    if (!cb || cb->bits != bits || cb->n != (1 << bits))
        TZ_FATAL("codebook of %d bits given for %d-bit codes", cb ? cb->bits : -1, bits);
    const float inv = (float)(1.0 / sqrt((double)g));
    float *signs = tz_xmalloc((size_t)cols * sizeof *signs);
    tz_tq_signs_row(seed, cols, g, signs);
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < count; k++) {
        float *out = w_hat + k * g;
        const float *s = signs + ((first + k) % per_row) * g;
        decode_group(codes + k * gbytes, scales[k], g, cb, out);
        tz_fwht(out, g);
        for (int i = 0; i < g; i++) out[i] = s[i] * (out[i] * inv);
    }
    free(signs);
}

/* ---- absmax round-to-nearest baseline ---- */

void tz_tq_absmax_quantize(tz_tq_tensor *t, const float *w) {
    tz_tq_quantize_range(TZ_TQ_ABSMAX, NULL, t->bits, t->group, t->cols, t->seed, w, 0,
                         tz_tq_tensor_groups(t), t->codes, t->scales);
}

void tz_tq_absmax_dequantize(const tz_tq_tensor *t, float *w_hat) {
    const int g = t->group, n = 1 << t->bits;
    const int64_t gbytes = TZ_TQ_GROUP_BYTES(g, t->bits), total = tz_tq_tensor_groups(t);
    const float half = 0.5f * (float)(n - 1);
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < total; k++) {
        uint8_t idx[TZ_TQ_MAX_GROUP];
        tz_tq_unpack_group(idx, t->codes + k * gbytes, g, t->bits);
        float step = tz_bf16_to_f32(t->scales[k]);
        for (int i = 0; i < g; i++) w_hat[k * g + i] = ((float)idx[i] - half) * step;
    }
}

/* ---- by method ---- */

const char *tz_tq_method_name(int method) {
    return method == TZ_TQ_TURBOQUANT ? "turboquant" : method == TZ_TQ_ABSMAX ? "absmax" : "?";
}

int tz_tq_method_from_name(const char *name, int *method) {
    if (!strcmp(name, "turboquant")) *method = TZ_TQ_TURBOQUANT;
    else if (!strcmp(name, "absmax")) *method = TZ_TQ_ABSMAX;
    else return -1;
    return 0;
}

int tz_tq_group_for(int64_t cols, int group) {
    if (group != 64 && group != 128 && group != 256) return 0;
    for (int g = group; g >= TZ_TQ_MIN_GROUP; g /= 2)
        if (cols > 0 && cols % g == 0) return g;
    return 0;
}

void tz_tq_levels(int method, int bits, const tz_tq_codebook *cb, float *levels) {
    const int n = 1 << bits;
    if (method == TZ_TQ_ABSMAX) {
        const float half = 0.5f * (float)(n - 1);
        for (int k = 0; k < n; k++) levels[k] = (float)k - half;
        return;
    }
    if (!cb || cb->bits != bits) TZ_FATAL("codebook of %d bits given for %d-bit levels",
                                          cb ? cb->bits : -1, bits);
    for (int k = 0; k < n; k++) levels[k] = cb->centroids[k];
}

void tz_tq_quantize_as(tz_tq_tensor *t, int method, const tz_tq_codebook *cb, const float *w) {
    if (method == TZ_TQ_ABSMAX) tz_tq_absmax_quantize(t, w);
    else tz_tq_quantize(t, cb, w);
}

void tz_tq_dequantize_as(const tz_tq_tensor *t, int method, const tz_tq_codebook *cb,
                         float *w_hat) {
    if (method == TZ_TQ_ABSMAX) tz_tq_absmax_dequantize(t, w_hat);
    else tz_tq_dequantize(t, cb, w_hat);
}

/* ---- error metric ---- */

#define TZ_ERR_BLOCK 4096

double tz_tq_relative_error(const float *w, const float *w_hat, int64_t n) {
    int64_t nb = (n + TZ_ERR_BLOCK - 1) / TZ_ERR_BLOCK;
    double *part = tz_xcalloc((size_t)(2 * nb), sizeof *part);
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < nb; b++) {
        int64_t lo = b * TZ_ERR_BLOCK, hi = lo + TZ_ERR_BLOCK < n ? lo + TZ_ERR_BLOCK : n;
        double e = 0.0, s = 0.0;
        for (int64_t i = lo; i < hi; i++) {
            double d = (double)w[i] - (double)w_hat[i];
            e += d * d;
            s += (double)w[i] * (double)w[i];
        }
        part[2 * b] = e;
        part[2 * b + 1] = s;
    }
    double err = 0.0, ref = 0.0;
    for (int64_t b = 0; b < nb; b++) {
        err += part[2 * b];
        ref += part[2 * b + 1];
    }
    free(part);
    if (ref == 0.0) return err == 0.0 ? 0.0 : INFINITY;
    return err / ref;
}
