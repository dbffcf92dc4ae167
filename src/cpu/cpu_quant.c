/* CPU ops of quantized weights: per-group rotation of activation rows (forward and inverse,
 * accumulating) and decoding packed codes into a dense tile. The math is src/quant's; no GEMM. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "cpu/cpu_internal.h"
#include "core/dtype.h"
#include "quant/fwht.h"
#include "quant/tq_layout.h"

static void check_rows(int64_t rows, int64_t cols, int group, const char *op) {
    char err[200];
    if (rows < 0 || tz_tq_check_shape(cols, group, err, sizeof err))
        TZ_FATAL("%s: rows %lld: %s", op, (long long)rows, err);
}

/* The signs of one row, [cols] (the same for every row), once the shape is checked. */
static float *row_signs(int64_t rows, int64_t cols, int group, uint64_t seed, const char *op) {
    check_rows(rows, cols, group, op);
    float *s = tz_xmalloc((size_t)cols * sizeof *s);
    tz_tq_signs_row(seed, cols, group, s);
    return s;
}

/* One group: y = (H (s .* x)) / sqrt(g), y may be x (tz_tq_rotate's arithmetic). */
static void rotate_group(float *y, const float *x, const float *s, int g, float inv) {
    for (int i = 0; i < g; i++) y[i] = s[i] * x[i];
    tz_fwht(y, g);
    for (int i = 0; i < g; i++) y[i] *= inv;
}

static void cpu_tq_rotate(tz_backend *be, float *y, const float *x, int64_t rows, int64_t cols,
                          int group, uint64_t seed) {
    float *s = row_signs(rows, cols, group, seed, "tq_rotate");
    const float inv = (float)(1.0 / sqrt((double)group));
    int nt = tz_cpu_threads(be);
#pragma omp parallel for schedule(static) num_threads(nt) if (rows * cols >= TZ_CPU_PAR_MIN)
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < cols; j += group)
            rotate_group(y + r * cols + j, x + r * cols + j, s + j, group, inv);
    free(s);
}

/* A window's signs: columns [c0, c0 + cols) of a row of wcols (the whole row: c0 = 0, wcols
 * = cols); *base receives what to free. */
static const float *window_signs(int64_t rows, int64_t cols, int group, uint64_t seed,
                                 int64_t c0, int64_t wcols, const char *op, float **base) {
    check_rows(rows, cols, group, op);
    if (c0 < 0 || c0 % group || c0 + cols > wcols)
        TZ_FATAL("%s: columns [%lld, %lld) are not whole groups of %d inside a row of %lld", op,
                 (long long)c0, (long long)(c0 + cols), group, (long long)wcols);
    *base = row_signs(rows, wcols, group, seed, op);
    return *base + c0;
}

/* tq_rotate group by group, each rounded to bf16 as it is stored; s the window's signs. */
static void rotate16_signed(tz_backend *be, uint16_t *y, const float *x, int64_t rows,
                            int64_t cols, int64_t ldy, int group, const float *s, uint16_t *xc,
                            const char *op) {
    if (ldy < cols) TZ_FATAL("%s: row stride %lld below %lld columns", op, (long long)ldy,
                             (long long)cols);
    const float inv = (float)(1.0 / sqrt((double)group));
    int nt = tz_cpu_threads(be);
#pragma omp parallel for schedule(static) num_threads(nt) if (rows * cols >= TZ_CPU_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        float t[TZ_TQ_MAX_GROUP];
        for (int64_t j = 0; j < cols; j += group) {
            rotate_group(t, x + r * cols + j, s + j, group, inv);
            for (int i = 0; i < group; i++) y[r * ldy + j + i] = tz_f32_to_bf16(t[i]);
            if (xc)
                for (int i = 0; i < group; i++)
                    xc[r * cols + j + i] = tz_f32_to_bf16(x[r * cols + j + i]);
        }
    }
}

static void cpu_tq_rotate16(tz_backend *be, uint16_t *y, const float *x, int64_t rows,
                            int64_t cols, int64_t ldy, int group, uint64_t seed, uint16_t *xc) {
    float *s = row_signs(rows, cols, group, seed, "tq_rotate16");
    rotate16_signed(be, y, x, rows, cols, ldy, group, s, xc, "tq_rotate16");
    free(s);
}

static void cpu_tq_rotate16_at(tz_backend *be, uint16_t *y, const float *x, int64_t rows,
                               int64_t cols, int64_t ldy, int group, uint64_t seed, int64_t c0,
                               int64_t wcols, uint16_t *xc) {
    float *base;
    const float *s = window_signs(rows, cols, group, seed, c0, wcols, "tq_rotate16_at", &base);
    rotate16_signed(be, y, x, rows, cols, ldy, group, s, xc, "tq_rotate16_at");
    free(base);
}

/* The inverse rotation with the window's signs s. */
static void rotate_bwd_signed(tz_backend *be, float *dx, const float *dy, int64_t rows,
                              int64_t cols, int group, const float *s, int accumulate) {
    const float inv = (float)(1.0 / sqrt((double)group));
    const int g = group;
    int nt = tz_cpu_threads(be);
#pragma omp parallel for schedule(static) num_threads(nt) if (rows * cols >= TZ_CPU_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *dyr = dy + r * cols;
        float *dxr = dx + r * cols;
        float t[TZ_TQ_MAX_GROUP];
        for (int64_t j = 0; j < cols; j += g) {
            memcpy(t, dyr + j, (size_t)g * sizeof *t);
            tz_fwht(t, g);
            /* same products as tz_tq_rotate_inv_signed: (H dy)_i * (s_i / sqrt(g)) */
            if (accumulate)
                for (int i = 0; i < g; i++) dxr[j + i] += t[i] * (s[j + i] * inv);
            else
                for (int i = 0; i < g; i++) dxr[j + i] = t[i] * (s[j + i] * inv);
        }
    }
}

static void cpu_tq_rotate_bwd(tz_backend *be, float *dx, const float *dy, int64_t rows,
                              int64_t cols, int group, uint64_t seed, int accumulate) {
    float *s = row_signs(rows, cols, group, seed, "tq_rotate_bwd");
    rotate_bwd_signed(be, dx, dy, rows, cols, group, s, accumulate);
    free(s);
}

static void cpu_tq_rotate_bwd_at(tz_backend *be, float *dx, const float *dy, int64_t rows,
                                 int64_t cols, int group, uint64_t seed, int accumulate,
                                 int64_t c0, int64_t wcols) {
    float *base;
    const float *s = window_signs(rows, cols, group, seed, c0, wcols, "tq_rotate_bwd_at", &base);
    rotate_bwd_signed(be, dx, dy, rows, cols, group, s, accumulate);
    free(base);
}

static void cpu_tq_dequant(tz_backend *be, float *w, const uint8_t *codes, const uint16_t *scales,
                           const float *levels, int64_t rows, int64_t cols, int bits, int group) {
    check_rows(rows, cols, group, "tq_dequant");
    if (bits < 1 || bits > TZ_TQ_MAX_BITS) TZ_FATAL("tq_dequant: bits %d out of range", bits);
    const int g = group;
    const int64_t per_row = cols / g, gbytes = TZ_TQ_GROUP_BYTES(g, bits);
    int nt = tz_cpu_threads(be);
#pragma omp parallel for schedule(static) num_threads(nt) if (rows * cols >= TZ_CPU_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        uint8_t idx[TZ_TQ_MAX_GROUP];
        for (int64_t j = 0; j < per_row; j++) {
            const int64_t k = r * per_row + j;
            float *out = w + k * g;
            tz_tq_unpack_group(idx, codes + k * gbytes, g, bits);
            const float sc = tz_bf16_to_f32(scales[k]);
            for (int i = 0; i < g; i++) out[i] = sc * levels[idx[i]];
        }
    }
}

static void cpu_tq_matmul(tz_backend *be, float *C, const void *A, int a_bf16, float *tile,
                          const uint8_t *codes, const uint16_t *scales, const float *levels,
                          int64_t rows, int64_t cols, int bits, int group, int64_t M, int transW,
                          float alpha, float beta) {
    be->tq_dequant(be, tile, codes, scales, levels, rows, cols, bits, group);
    const int64_t N = transW ? rows : cols, K = transW ? cols : rows;
    if (a_bf16) be->matmul16(be, C, A, 1, tile, 0, M, N, K, 0, transW, alpha, beta);
    else be->matmul(be, C, (const float *)A, tile, M, N, K, 0, transW, alpha, beta);
}

/* The reference: A's first cols from bf16 and the decoded W in fp32, h, B and the bias in
 * fp32 (not rounded), C = A W^T + s h B^T + bias (then rounded, c_bf16); A's rest written as
 * the op says (h rounded, the bias's 1, zeros). */
static void cpu_tq_matmul_lora(tz_backend *be, float *C, uint16_t *A, int64_t ld,
                               const float *h, const float *B, int64_t r, float s, float *tile,
                               const uint8_t *codes, const uint16_t *scales,
                               const float *levels, int64_t rows, int64_t cols, int bits,
                               int group, int64_t M, const float *bias, int c_bf16) {
    (void)tile;
    const int64_t nb = bias != NULL;
    if (ld < cols + r + nb || ld % 8)
        TZ_FATAL("tq_matmul_lora: row stride %lld is not a multiple of 8 of at least %lld + %lld",
                 (long long)ld, (long long)cols, (long long)(r + nb));
    float *a = malloc((size_t)(M * cols + rows * cols) * sizeof *a), *w = a + M * cols;
    if (!a) TZ_FATAL("tq_matmul_lora: out of host memory");
    for (int64_t m = 0; m < M; m++) {
        for (int64_t k = 0; k < cols; k++) a[m * cols + k] = tz_bf16_to_f32(A[m * ld + k]);
        for (int64_t k = cols; k < ld; k++)
            A[m * ld + k] = k < cols + r ? tz_f32_to_bf16(h[m * r + k - cols])
                            : k == cols + r && nb ? tz_f32_to_bf16(1.0f)
                                                  : 0;
    }
    be->tq_dequant(be, w, codes, scales, levels, rows, cols, bits, group);
    be->matmul(be, C, a, w, M, rows, cols, 0, 1, 1.0f, 0.0f);
    if (r) be->matmul(be, C, h, B, M, rows, r, 0, 1, s, 1.0f);
    if (bias) be->bias_add_fwd(be, C, bias, M, rows);
    if (c_bf16) /* rounded in place, row-major from the start (the bf16 never overtakes) */
        for (int64_t i = 0; i < M * rows; i++) ((uint16_t *)(void *)C)[i] = tz_f32_to_bf16(C[i]);
    free(a);
}

/* The reference: swiglu_fwd into an fp32 s of its own, then tq_rotate16_at of it. */
static void cpu_swiglu_rot16_at(tz_backend *be, uint16_t *y, const uint16_t *g,
                                const uint16_t *u, int64_t rows, int64_t cols, int64_t ldy,
                                int group, uint64_t seed, int64_t c0, int64_t wcols,
                                uint16_t *sc) {
    const int64_t n = rows * cols;
    float *s = malloc((size_t)(n > 0 ? n : 1) * sizeof *s);
    if (!s) TZ_FATAL("swiglu_rot16_at: out of host memory");
    be->swiglu_fwd(be, s, (const float *)(const void *)g, (const float *)(const void *)u, n,
                   TZ_SWIGLU_IN16);
    be->tq_rotate16_at(be, y, s, rows, cols, ldy, group, seed, c0, wcols, sc);
    free(s);
}

void TZ_CPU_K(tz_cpu_install_quant)(tz_backend *be) {
    be->swiglu_rot16_at = cpu_swiglu_rot16_at;
    be->tq_rotate = cpu_tq_rotate;
    be->tq_rotate16 = cpu_tq_rotate16;
    be->tq_rotate_bwd = cpu_tq_rotate_bwd;
    be->tq_rotate16_at = cpu_tq_rotate16_at;
    be->tq_rotate_bwd_at = cpu_tq_rotate_bwd_at;
    be->tq_dequant = cpu_tq_dequant;
    be->tq_matmul = cpu_tq_matmul;
    be->tq_matmul_lora = cpu_tq_matmul_lora;
}
