/* Rows of the op-case table (op_case.h): the quantized-weight ops (rotation, its inverse,
 * decoding, the GEMM with a quantized weight). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/rng.h"
#include "ops/op_case.h"
#include "quant/tq_layout.h"

/* Largest tensor (elements) a row's reference keeps on the stack. */
#define QMAX 4096

/* ---- fp64 helpers: the format's definitions, written out ---- */

/* Sign of element i (< group) of group column j: the rule of tq_layout.h (word i/64 is the
 * (i/64 + 1)-th output of the column's stream; bit i%64 set: negative). */
static double ref_sign(uint64_t seed, int64_t j, int i) {
    tz_rng st = tz_rng_make(seed, (uint64_t)j, TZ_RNG_QUANT, 0);
    uint64_t w = 0;
    for (int m = 0; m <= i / 64; m++) w = tz_rng_u64(&st);
    return (w >> (i % 64)) & 1u ? -1.0 : 1.0;
}

/* Code i of a group's packed bytes: bits [i*b, i*b + b) of the group's bit stream, bit n of
 * the stream being bit n%8 of byte n/8. */
static unsigned ref_code(const uint8_t *grp, int64_t i, int bits) {
    unsigned c = 0;
    for (int k = 0; k < bits; k++) {
        int64_t n = i * bits + k;
        c |= (unsigned)((grp[n / 8] >> (n % 8)) & 1u) << k;
    }
    return c;
}

/* w[rows, cols] = scale_k * levels[code] (tq_dequant) in double. */
static void ref_decode(double *w, const uint8_t *codes, const double *scales,
                       const double *levels, int64_t rows, int64_t cols, int bits, int g) {
    const int64_t ng = rows * cols / g, gb = (int64_t)g * bits / 8;
    for (int64_t k = 0; k < ng; k++)
        for (int64_t i = 0; i < g; i++)
            w[k * g + i] = scales[k] * levels[ref_code(codes + k * gb, i, bits)];
}

/* Parity of the set bits of v. */
static int parity(unsigned v) {
    int p = 0;
    for (; v; v &= v - 1) p ^= 1;
    return p;
}

/* y[r, group j] = R_j x[r, group j] (inv = 0) or R_j^T x (inv = 1), R_j = H diag(s_j)/sqrt(g)
 * with H[i][k] = (-1)^popcount(i & k), as an explicit matrix. y and x distinct. */
/* ref_rotate of the columns of a window whose first group is group column j0 of the row */
static void ref_rotate_at(double *y, const double *x, int64_t rows, int64_t cols, int g,
                          uint64_t seed, int inv, int64_t j0) {
    double s[256];
    const double nrm = 1.0 / sqrt((double)g);
    for (int64_t j = 0; j < cols / g; j++) {
        for (int i = 0; i < g; i++) s[i] = ref_sign(seed, j0 + j, i);
        for (int64_t r = 0; r < rows; r++) {
            const double *xg = x + r * cols + j * g;
            double *yg = y + r * cols + j * g;
            for (int i = 0; i < g; i++) {
                double acc = 0.0;
                for (int k = 0; k < g; k++) {
                    double h = parity((unsigned)(i & k)) ? -1.0 : 1.0;
                    /* R[i][k] = H[i][k] s_k; R^T[i][k] = s_i H[k][i] = s_i H[i][k] */
                    acc += h * (inv ? s[i] : s[k]) * xg[k];
                }
                yg[i] = acc * nrm;
            }
        }
    }
}

static void ref_rotate(double *y, const double *x, int64_t rows, int64_t cols, int g,
                       uint64_t seed, int inv) {
    ref_rotate_at(y, x, rows, cols, g, seed, inv, 0);
}

/* ---- tq_rotate forward, tq_rotate_bwd backward ----
 * p: rows, cols, group, seed, in place. tensors: out of place 0 x, 1 y, 2 dy, 3 dx;
 * in place 0 x (INOUT), 1 dy, 2 dx. */

static void rot_fwd(oc_run *r) {
    float *x = OCF(r, 0), *y = OCP(r, 4) ? x : OCF(r, 1);
    r->be->tq_rotate(r->be, y, x, OCP(r, 0), OCP(r, 1), (int)OCP(r, 2), (uint64_t)OCP(r, 3));
}
static void rot_bwd(oc_run *r) {
    int ip = (int)OCP(r, 4);
    r->be->tq_rotate_bwd(r->be, OCF(r, ip ? 2 : 3), OCF(r, ip ? 1 : 2), OCP(r, 0), OCP(r, 1),
                         (int)OCP(r, 2), (uint64_t)OCP(r, 3), !OCP(r, 5));
}
static void rot_ref(oc_ref *r) {
    const oc_case *c = r->c;
    const int64_t n = c->p[0] * c->p[1];
    if (c->p[4]) { /* in place: rotate a copy of the start */
        double tmp[QMAX];
        for (int64_t k = 0; k < n; k++) tmp[k] = r->v[0][k];
        ref_rotate(r->v[0], tmp, c->p[0], c->p[1], (int)c->p[2], (uint64_t)c->p[3], 0);
    } else {
        ref_rotate(r->v[1], r->v[0], c->p[0], c->p[1], (int)c->p[2], (uint64_t)c->p[3], 0);
    }
}

/* write: tq_rotate_bwd writes dx instead of adding to it (accumulate = 0) */
static void add_rotate(oc_list *l, int64_t rows, int64_t cols, int g, uint64_t seed, int inplace,
                       int write) {
    if (rows * cols > QMAX) abort();
    oc_case c = {.ops = "tq_rotate tq_rotate_bwd",
                 .p = {rows, cols, g, (int64_t)seed, inplace, write},
                 .fwd = rot_fwd, .ref = rot_ref, .bwd = rot_bwd,
                 /* an orthogonal g x g transform in fp32: up to log2(g) butterfly levels of
                  * roundings of 2^-24 each, relative to the largest output (2e-7 seen) */
                 .tol_fwd = 1e-6, .tol_bwd = 1e-6};
    if (inplace) {
        c.nt = 3;
        c.t[0] = (oc_tensor)OC_T_INOUT("x", rows * cols);
        c.t[1] = (oc_tensor)OC_T_DOUT("dy", 0);
        c.t[2] = (oc_tensor)OC_T_DIN("dx", 0);
    } else {
        c.nt = 4;
        c.t[0] = (oc_tensor)OC_T_IN("x", rows * cols);
        c.t[1] = (oc_tensor)OC_T_OUT("y", rows * cols);
        c.t[2] = (oc_tensor)OC_T_DOUT("dy", 1);
        c.t[3] = (oc_tensor)OC_T_DIN("dx", 0);
    }
    if (write) c.t[c.nt - 1].flags = OC_WRITES;
    snprintf(c.name, sizeof c.name, "tq_rotate rows %lld cols %lld group %d seed %llu%s%s",
             (long long)rows, (long long)cols, g, (unsigned long long)seed,
             inplace ? " in place" : "", write ? ", dx written" : "");
    oc_add(l, &c);
}

/* ---- tq_rotate16: tq_rotate rounded to bf16, read back through from_bf16 ----
 * p: rows, cols, group, seed. tensors: 0 x, 1 y16 (bf16 scratch, not compared), 2 y */
static void rot16_fwd(oc_run *r) {
    const int64_t n = OCP(r, 0) * OCP(r, 1);
    r->be->tq_rotate16(r->be, OCH(r, 1), OCF(r, 0), OCP(r, 0), OCP(r, 1), OCP(r, 1),
                       (int)OCP(r, 2), (uint64_t)OCP(r, 3), NULL);
    r->be->from_bf16(r->be, OCF(r, 2), OCH(r, 1), n);
}
static void rot16_ref(oc_ref *r) {
    const oc_case *c = r->c;
    ref_rotate(r->v[2], r->v[0], c->p[0], c->p[1], (int)c->p[2], (uint64_t)c->p[3], 0);
    for (int64_t k = 0; k < c->p[0] * c->p[1]; k++) /* to bf16, as the op rounds its fp32 */
        r->v[2][k] = tz_bf16_to_f32(tz_f32_to_bf16((float)r->v[2][k]));
}

static void add_rotate16(oc_list *l, int64_t rows, int64_t cols, int g, uint64_t seed) {
    if (rows * cols > QMAX) abort();
    oc_case c = {.ops = "tq_rotate16 from_bf16", .nt = 3,
                 .p = {rows, cols, g, (int64_t)seed}, .fwd = rot16_fwd, .ref = rot16_ref,
                 /* the op's fp32 value and the reference's differ by up to ~2e-7 of the
                  * largest output (tq_rotate's rows); where that straddles a bf16 rounding
                  * boundary the two round to neighbours, one bf16 step (2^-8 of the element)
                  * apart. A wrong sign or group moves elements by far more */
                 .tol_fwd = 4e-3};
    c.t[0] = (oc_tensor)OC_T_IN("x", rows * cols);
    c.t[1] = (oc_tensor)OC_T_OUT("y16", (rows * cols + 1) / 2);
    c.t[1].flags = OC_NOCHECK;
    c.t[2] = (oc_tensor)OC_T_OUT("y", rows * cols);
    snprintf(c.name, sizeof c.name, "tq_rotate16 rows %lld cols %lld group %d seed %llu",
             (long long)rows, (long long)cols, g, (unsigned long long)seed);
    oc_add(l, &c);
}

/* ---- tq_rotate16_at forward (read back through from_bf16), tq_rotate_bwd_at backward: a
 * window of columns [c0, c0 + cols) of rows of wcols ----
 * p: rows, cols, group, seed, c0, wcols, write. tensors: 0 x, 1 y16 (bf16 scratch, not
 * compared), 2 y, 3 dy, 4 dx. The reference is the exact rotation (the backward's
 * differences need it smooth); the forward's bf16 rounding is in its tolerance. */
static void rot_at_fwd(oc_run *r) {
    const int64_t n = OCP(r, 0) * OCP(r, 1);
    r->be->tq_rotate16_at(r->be, OCH(r, 1), OCF(r, 0), OCP(r, 0), OCP(r, 1), OCP(r, 1),
                          (int)OCP(r, 2), (uint64_t)OCP(r, 3), OCP(r, 4), OCP(r, 5), NULL);
    r->be->from_bf16(r->be, OCF(r, 2), OCH(r, 1), n);
}
static void rot_at_bwd(oc_run *r) {
    r->be->tq_rotate_bwd_at(r->be, OCF(r, 4), OCF(r, 3), OCP(r, 0), OCP(r, 1), (int)OCP(r, 2),
                            (uint64_t)OCP(r, 3), !OCP(r, 6), OCP(r, 4), OCP(r, 5));
}
static void rot_at_ref(oc_ref *r) {
    const oc_case *c = r->c;
    ref_rotate_at(r->v[2], r->v[0], c->p[0], c->p[1], (int)c->p[2], (uint64_t)c->p[3], 0,
                  c->p[4] / c->p[2]);
}

static void add_rotate_at(oc_list *l, int64_t rows, int64_t cols, int g, uint64_t seed,
                          int64_t c0, int64_t wcols, int write) {
    if (rows * cols > QMAX) abort();
    oc_case c = {.ops = "tq_rotate16_at tq_rotate_bwd_at from_bf16", .nt = 5,
                 .p = {rows, cols, g, (int64_t)seed, c0, wcols, write}, .fwd = rot_at_fwd,
                 .ref = rot_at_ref, .bwd = rot_at_bwd,
                 /* forward: bf16's rounding, 2^-8 of an element at most (a group column's
                  * wrong signs move elements by far more); backward: tq_rotate_bwd's */
                 .tol_fwd = 4e-3, .tol_bwd = 1e-6};
    c.t[0] = (oc_tensor)OC_T_IN("x", rows * cols);
    c.t[1] = (oc_tensor)OC_T_OUT("y16", (rows * cols + 1) / 2);
    c.t[1].flags = OC_NOCHECK;
    c.t[2] = (oc_tensor)OC_T_OUT("y", rows * cols);
    c.t[3] = (oc_tensor)OC_T_DOUT("dy", 2);
    c.t[4] = (oc_tensor)OC_T_DIN("dx", 0);
    if (write) c.t[4].flags = OC_WRITES;
    snprintf(c.name, sizeof c.name,
             "tq_rotate16_at rows %lld cols %lld group %d seed %llu, columns from %lld of %lld%s",
             (long long)rows, (long long)cols, g, (unsigned long long)seed, (long long)c0,
             (long long)wcols, write ? ", dx written" : "");
    oc_add(l, &c);
}

/* ---- tq_dequant ----
 * p: rows, cols, bits, group. tensors: 0 codes, 1 scales, 2 levels, 3 w. */

static void dq_fwd(oc_run *r) {
    r->be->tq_dequant(r->be, OCF(r, 3), OCB(r, 0), OCH(r, 1), OCF(r, 2), OCP(r, 0), OCP(r, 1),
                      (int)OCP(r, 2), (int)OCP(r, 3));
}
static void dq_ref(oc_ref *r) {
    const oc_case *c = r->c;
    ref_decode(r->v[3], r->raw[0], r->v[1], r->v[2], c->p[0], c->p[1], (int)c->p[2],
               (int)c->p[3]);
}

static void add_dequant(oc_list *l, int64_t rows, int64_t cols, int bits, int g) {
    oc_case c = {.ops = "tq_dequant", .nt = 4, .p = {rows, cols, bits, g}, .fwd = dq_fwd,
                 .ref = dq_ref,
                 /* one fp32 product of a bf16 scale and an fp32 level: at most half an ulp,
                  * 2^-24 of the element; five times that (a wrong code is off by a level) */
                 .tol_fwd = 3e-7};
    c.t[0] = (oc_tensor)OC_T_U8("codes", rows * cols * bits / 8, 0, 0);
    c.t[1] = (oc_tensor)OC_T_BF16("scales", rows * cols / g, 0.5f);
    c.t[2] = (oc_tensor)OC_T_INA("levels", 1 << bits, 2.0f);
    c.t[3] = (oc_tensor)OC_T_OUT("w", rows * cols);
    snprintf(c.name, sizeof c.name, "tq_dequant rows %lld cols %lld bits %d group %d",
             (long long)rows, (long long)cols, bits, g);
    oc_add(l, &c);
}

/* ---- tq_matmul: forward one way round, backward (A's gradient) the other ----
 * p: rows, cols, bits, group, M, transW; s: alpha, beta. tensors: 0 A, 1 codes, 2 scales,
 * 3 levels, 4 C (OUT when beta = 0: it may hold NaN), 5 tile (scratch, fp32-sized), 6 dC,
 * 7 dA. */

static void tqm_fwd(oc_run *r) {
    r->be->tq_matmul(r->be, OCF(r, 4), r->d[0], (int)OCP(r, 6), OCF(r, 5), OCB(r, 1), OCH(r, 2),
                     OCF(r, 3),
                     OCP(r, 0), OCP(r, 1), (int)OCP(r, 2), (int)OCP(r, 3), OCP(r, 4),
                     (int)OCP(r, 5), (float)OCS(r, 0), (float)OCS(r, 1));
}
/* transW = 1: dA[M, cols] += alpha dC W; transW = 0: dA[M, rows] += alpha dC W^T */
static void tqm_bwd(oc_run *r) {
    r->be->tq_matmul(r->be, OCF(r, 7), OCF(r, 6), 0, OCF(r, 5), OCB(r, 1), OCH(r, 2), OCF(r, 3),
                     OCP(r, 0), OCP(r, 1), (int)OCP(r, 2), (int)OCP(r, 3), OCP(r, 4),
                     !(int)OCP(r, 5), (float)OCS(r, 0), 1.0f);
}
static void tqm_ref(oc_ref *r) {
    const oc_case *c = r->c;
    const int64_t rows = c->p[0], cols = c->p[1], M = c->p[4];
    const int tw = (int)c->p[5];
    double w[QMAX];
    ref_decode(w, r->raw[1], r->v[2], r->v[3], rows, cols, (int)c->p[2], (int)c->p[3]);
    if (tw) oc_ref_matmul(r->v[4], r->v[0], w, M, rows, cols, 0, 1, c->s[0], c->s[1]);
    else oc_ref_matmul(r->v[4], r->v[0], w, M, cols, rows, 0, 0, c->s[0], c->s[1]);
}

static void add_tq_matmul(oc_list *l, int64_t rows, int64_t cols, int bits, int g, int64_t M,
                          int tw, double alpha, double beta, int a16) {
    const int64_t K = tw ? cols : rows, N = tw ? rows : cols;
    if (rows * cols > QMAX) abort();
    oc_case c = {.ops = "tq_matmul", .nt = 8, .p = {rows, cols, bits, g, M, tw, a16},
                 .s = {alpha, beta}, .flags = OC_GEMM, .fwd = tqm_fwd, .ref = tqm_ref,
                 .bwd = tqm_bwd,
                 /* fp32: the decode's one rounding per weight, then sums of K <= 512 products
                  * in another order (up to 2e-6 of the result's scale) */
                 .tol_fwd = 1e-5, .tol_bwd = 1e-5,
                 /* bf16 (A, levels, C bf16 values): each decoded weight rounded once to bf16
                  * (up to 2^-8 relative, 2^-9 on average), those errors summed over K
                  * random-signed products, ~2^-9 of the result's scale and up to ~3x that at
                  * the largest element; 15 x 2^-9. A wrong code or group moves many outputs by
                  * a level: >> this */
                 .tol_fwd_bf16 = 3e-2, .tol_bwd_bf16 = 3e-2};
    /* A in bf16: the forward reads its values as stored; no backward (A is no float input) */
    c.t[0] = a16 ? (oc_tensor)OC_T_BF16("A", M * K, 1.0f) : (oc_tensor)OC_T_IN("A", M * K);
    c.t[1] = (oc_tensor)OC_T_U8("codes", rows * cols * bits / 8, 0, 0);
    c.t[2] = (oc_tensor)OC_T_BF16("scales", rows * cols / g, 0.5f);
    c.t[3] = (oc_tensor)OC_T_INA("levels", 1 << bits, 2.0f);
    if (beta != 0.0) c.t[4] = (oc_tensor)OC_T_INOUT("C", M * N);
    else c.t[4] = (oc_tensor)OC_T_OUT("C", M * N);
    c.t[5] = (oc_tensor)OC_T_OUT("tile", rows * cols);
    c.t[5].flags = OC_NOCHECK;
    c.t[6] = (oc_tensor)OC_T_DOUT("dC", 4);
    c.t[7] = (oc_tensor)OC_T_DIN("dA", 0);
    if (a16) c.nt = 6, c.bwd = NULL;
    snprintf(c.name, sizeof c.name,
             "tq_matmul rows %lld cols %lld bits %d group %d M %lld transW %d alpha %g beta %g%s",
             (long long)rows, (long long)cols, bits, g, (long long)M, tw, alpha, beta,
             a16 ? " A bf16" : "");
    oc_add(l, &c);
}

/* ---- tq_matmul_lora: C = [A | h | 1] [W | s B | b]^T, one GEMM along cols + (ld - cols) ----
 * p: rows, cols, bits, group, M, r, ld, flags (1: a bias, 2: C in bf16); s: scale. tensors:
 * 0 A (bf16 [M, ld]: the first cols of each row read, the rest written by the op), 1 h [M, r],
 * 2 B [rows, r], 3 codes, 4 scales, 5 levels, 6 C, 7 tile (bf16 [rows, ld], scratch), 8 bias
 * [rows] (read where p[7] & 1). */
static void tql_fwd(oc_run *r) {
    r->be->tq_matmul_lora(r->be, OCF(r, 6), OCH(r, 0), OCP(r, 6), OCF(r, 1), OCF(r, 2),
                          OCP(r, 5), (float)OCS(r, 0), OCF(r, 7), OCB(r, 3), OCH(r, 4),
                          OCF(r, 5), OCP(r, 0), OCP(r, 1), (int)OCP(r, 2), (int)OCP(r, 3),
                          OCP(r, 4), OCP(r, 7) & 1 ? OCF(r, 8) : NULL, (int)(OCP(r, 7) >> 1));
}
static void tql_ref(oc_ref *r) {
    const oc_case *c = r->c;
    const int64_t rows = c->p[0], cols = c->p[1], M = c->p[4], rk = c->p[5], ld = c->p[6];
    double w[QMAX];
    ref_decode(w, r->raw[3], r->v[4], r->v[5], rows, cols, (int)c->p[2], (int)c->p[3]);
    for (int64_t m = 0; m < M; m++)
        for (int64_t o = 0; o < rows; o++) {
            double acc = 0.0, lo = 0.0;
            for (int64_t k = 0; k < cols; k++) acc += r->v[0][m * ld + k] * w[o * cols + k];
            for (int64_t j = 0; j < rk; j++) lo += r->v[1][m * rk + j] * r->v[2][o * rk + j];
            r->v[6][m * rows + o] = acc + c->s[0] * lo + (c->p[7] & 1 ? r->v[8][o] : 0.0);
        }
}

/* bias: a bias folded in too (its column after h's); c16: C written in bf16 (c_bf16) */
static void add_tq_matmul_lora_bc(oc_list *l, int64_t rows, int64_t cols, int bits, int g,
                                  int64_t M, int64_t rk, double scale, int bias, int c16) {
    const int64_t ld = cols + ((rk + bias + 7) & ~(int64_t)7);
    if (rows * cols > QMAX) abort();
    oc_case c = {.ops = "tq_matmul_lora", .nt = 9,
                 .p = {rows, cols, bits, g, M, rk, ld, bias | c16 << 1}, .s = {scale},
                 .flags = OC_GEMM | OC_DEVICE_BF16, .fwd = tql_fwd, .ref = tql_ref,
                 /* fp32 (the CPU's, the reference's arithmetic): sums in another order; C in
                  * bf16: its rounding, 2^-8 of the largest at most */
                 .tol_fwd = c16 ? 4e-3 : 1e-5,
                 /* bf16: tq_matmul's (each decoded weight rounded once, 3e-2 of the scale),
                  * and h and s B rounded to bf16 (2^-8 relative each at most, summed over r
                  * products, well inside it); the bias rounded to bf16 too (2^-8). Leaving the
                  * adapter out moves the output by s h B^T, of the order of the result, and
                  * leaving the bias out by the bias (values up to 4, against outputs of ~8):
                  * >> this */
                 .tol_fwd_bf16 = 3e-2};
    c.t[0] = (oc_tensor)OC_T_BF16("A", M * ld, 1.0f);
    c.t[1] = (oc_tensor)OC_T_IN("h", M * (rk ? rk : 1));
    c.t[2] = (oc_tensor)OC_T_IN("B", rows * (rk ? rk : 1));
    c.t[3] = (oc_tensor)OC_T_U8("codes", rows * cols * bits / 8, 0, 0);
    c.t[4] = (oc_tensor)OC_T_BF16("scales", rows * cols / g, 0.5f);
    c.t[5] = (oc_tensor)OC_T_INA("levels", 1 << bits, 2.0f);
    c.t[6] = c16 ? (oc_tensor)OC_T_OUT16("C", M * rows) : (oc_tensor)OC_T_OUT("C", M * rows);
    c.t[7] = (oc_tensor)OC_T_OUT("tile", (rows * ld + 1) / 2);
    c.t[7].flags = OC_NOCHECK;
    c.t[8] = (oc_tensor)OC_T_INA("bias", rows, 4.0f);
    snprintf(c.name, sizeof c.name,
             "tq_matmul_lora rows %lld cols %lld bits %d group %d M %lld r %lld ld %lld scale %g%s%s",
             (long long)rows, (long long)cols, bits, g, (long long)M, (long long)rk,
             (long long)ld, scale, bias ? ", bias" : "", c16 ? ", C in bf16" : "");
    oc_add(l, &c);
}
static void add_tq_matmul_lora_b(oc_list *l, int64_t rows, int64_t cols, int bits, int g,
                                 int64_t M, int64_t rk, double scale, int bias) {
    add_tq_matmul_lora_bc(l, rows, cols, bits, g, M, rk, scale, bias, 0);
}
static void add_tq_matmul_lora(oc_list *l, int64_t rows, int64_t cols, int bits, int g,
                               int64_t M, int64_t rk, double scale) {
    add_tq_matmul_lora_b(l, rows, cols, bits, g, M, rk, scale, 0);
}

/* swiglu_rot16_at against swiglu_fwd (TZ_SWIGLU_IN16) into an fp32 s, then tq_rotate16_at of
 * s with its bf16 copy: the rotated bits and the copy the same, g and u kept. p: rows, cols
 * (the window's), group, c0, wcols, ldy, sc (1: the copy asked for), unaligned (1: g, u, y
 * and the copy 2 bytes past an alignment). The same arithmetic in the same order on the
 * same values: bit for bit on the CPU and the emulation; on a GPU the compiler may contract
 * another way in the one kernel than in the two, so within one bf16 unit there. */
static int swiglu_rot_row(tz_backend *be, const oc_case *c, char *msg, size_t len) {
    const int64_t rows = c->p[0], cols = c->p[1], c0 = c->p[3], wcols = c->p[4], ldy = c->p[5];
    const int group = (int)c->p[2], sc = c->p[6] != 0, off = c->p[7] ? 1 : 0;
    const int64_t n = rows * cols, ny = rows * ldy;
    tz_device_info di;
    be->device_info(be, &di);
    const int gpu = be->device && !strstr(di.name, "CPU emulation");
    uint16_t *h = malloc((size_t)(2 * n + 4 * ny + 4 * n + 8) * 2);
    uint16_t *a = h + 2 * n + 4, *b = a + ny, *ca = b + ny, *cb = ca + n, *back = cb + n;
    for (int64_t i = 0; i < 2 * n; i++) /* g in [-6, 6), u in [-2, 2) */
        h[i] = tz_f32_to_bf16((float)((i * 7919) % 2003 - 1001) / (i < n ? 167.0f : 500.0f));
    uint16_t *gu = be->alloc(be, (size_t)(2 * n + 8) * 2);
    uint16_t *y1 = be->alloc(be, (size_t)(ny + 8) * 2), *y2 = be->alloc(be, (size_t)(ny + 8) * 2);
    uint16_t *c1 = be->alloc(be, (size_t)(n + 8) * 2), *c2 = be->alloc(be, (size_t)(n + 8) * 2);
    float *s = be->alloc(be, (size_t)(n > 0 ? n : 1) * 4);
    be->fill(be, (float *)(void *)y1, 0.0f, (ny + 8) / 2), be->fill(be, (float *)(void *)y2, 0.0f, (ny + 8) / 2);
    uint16_t *g = gu + off, *u = gu + off + n + 4;
    be->upload(be, g, h, (size_t)n * 2);
    be->upload(be, u, h + n, (size_t)n * 2);
    be->swiglu_rot16_at(be, y1 + off, g, u, rows, cols, ldy, group, 99, c0, wcols,
                        sc ? c1 + off : NULL);
    be->swiglu_fwd(be, s, (const float *)(const void *)g, (const float *)(const void *)u, n,
                   TZ_SWIGLU_IN16);
    be->tq_rotate16_at(be, y2 + off, s, rows, cols, ldy, group, 99, c0, wcols,
                       sc ? c2 + off : NULL);
    be->download(be, a, y1 + off, (size_t)ny * 2), be->download(be, b, y2 + off, (size_t)ny * 2);
    if (sc) be->download(be, ca, c1 + off, (size_t)n * 2), be->download(be, cb, c2 + off, (size_t)n * 2);
    be->download(be, back, g, (size_t)n * 2);
    int changed = memcmp(back, h, (size_t)n * 2) != 0;
    be->download(be, back, u, (size_t)n * 2);
    changed |= memcmp(back, h + n, (size_t)n * 2) != 0;
    be->release(be, gu), be->release(be, y1), be->release(be, y2), be->release(be, c1);
    be->release(be, c2), be->release(be, s);
    int64_t diff = 0, far = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < ldy; j++) { /* (the row's gap past cols: left as it was) */
            const int d = (int)a[r * ldy + j] - (int)b[r * ldy + j];
            diff += d != 0, far += d < -1 || d > 1 || (a[r * ldy + j] ^ b[r * ldy + j]) >> 15;
        }
    for (int64_t i = 0; sc && i < n; i++) diff += ca[i] != cb[i], far += ca[i] != cb[i];
    free(h);
    const int bad = changed || far || (diff && !gpu);
    if (bad || diff)
        snprintf(msg, len, "%lld of %lld elements differ (%lld by more than one bf16 unit)%s",
                 (long long)diff, (long long)(ny + (sc ? n : 0)), (long long)far,
                 changed ? "; g or u was changed" : "");
    return bad;
}

static void add_swiglu_rot(oc_list *l, int64_t rows, int64_t cols, int g, int64_t c0,
                           int64_t wcols, int64_t ldy, int sc, int off) {
    oc_case c = {.ops = "swiglu_rot16_at swiglu_fwd tq_rotate16_at alloc upload download fill "
                        "release device_info",
                 .p = {rows, cols, g, c0, wcols, ldy, sc, off}, .custom = swiglu_rot_row};
    snprintf(c.name, sizeof c.name,
             "swiglu_rot16_at = swiglu_fwd (g, u in bf16) then tq_rotate16_at, bit for bit (%lld x "
             "%lld, group %d, columns from %lld of %lld, row stride %lld%s%s)",
             (long long)rows, (long long)cols, g, (long long)c0, (long long)wcols, (long long)ldy,
             sc ? ", s in bf16 beside it" : "", off ? ", unaligned" : "");
    oc_add(l, &c);
}

void oc_cases_quant(oc_list *l) {
    /* SwiGLU into the rotation: a window inside the row, the first, with and without the
     * copy of s, at a wider row stride, unaligned */
    add_swiglu_rot(l, 3, 128, 64, 128, 384, 128, 1, 0);
    add_swiglu_rot(l, 5, 256, 128, 0, 512, 256, 0, 0);
    add_swiglu_rot(l, 2, 256, 256, 256, 512, 264, 1, 1);
    /* three, two and one group columns (distinct signs per column), several rows */
    add_rotate(l, 3, 192, 64, 7, 0, 0);
    add_rotate(l, 2, 256, 128, 0x9E3779B97F4A7C15ull, 0, 0);
    add_rotate(l, 2, 512, 256, 12345, 0, 0);
    add_rotate(l, 1, 256, 256, 3, 1, 0);
    add_rotate(l, 3, 128, 64, 0xFFFFFFFFFFFFFFFFull, 1, 0);
    /* the backward writing dx (a linear's first input gradient): every group */
    add_rotate(l, 3, 192, 64, 11, 0, 1);
    add_rotate(l, 2, 384, 128, 12, 0, 1);
    add_rotate(l, 1, 512, 256, 13, 1, 1);
    /* every bit width at every group; 3 bits: codes straddle bytes */
    for (int bits = 1; bits <= 4; bits++)
        for (int g = 64; g <= 256; g *= 2) add_dequant(l, 3, 2 * (int64_t)g, bits, g);
    add_dequant(l, 5, 192, 3, 64);
    /* both ways round, beta 0 (C may be NaN) and beta != 0, every bit width and group */
    add_tq_matmul(l, 5, 128, 4, 64, 3, 1, 1.0, 0.0, 0);
    add_tq_matmul(l, 4, 256, 3, 128, 2, 1, 0.75, 0.5, 0);
    add_tq_matmul(l, 3, 512, 2, 256, 2, 1, 1.0, -1.0, 0);
    add_tq_matmul(l, 6, 192, 1, 64, 3, 1, 0.5, 0.0, 0);
    add_tq_matmul(l, 6, 128, 4, 128, 3, 0, 1.0, 0.0, 0);
    add_tq_matmul(l, 3, 256, 2, 256, 2, 0, 0.75, 0.5, 0);
    add_tq_matmul(l, 5, 192, 3, 64, 4, 0, 1.0, 0.0, 0);
    add_tq_matmul(l, 4, 128, 1, 64, 3, 0, 2.0, -0.5, 0);
    /* A already in bf16 (tz_linear_fwd_shared's rotated input), both ways round */
    add_tq_matmul(l, 5, 256, 4, 128, 3, 1, 1.0, 0.0, 1);
    add_tq_matmul(l, 4, 192, 3, 64, 2, 0, 0.5, 1.0, 1);
    /* LoRA folded along K: rank 16 (no padding), 4 and 5 (padding zeros), 0 (none) */
    add_tq_matmul_lora(l, 5, 256, 4, 128, 3, 16, 2.0);
    add_tq_matmul_lora(l, 6, 192, 3, 64, 2, 4, 0.75);
    add_tq_matmul_lora(l, 3, 512, 2, 256, 4, 5, 1.5);
    add_tq_matmul_lora(l, 4, 128, 4, 64, 3, 0, 1.0);
    add_tq_matmul_lora_b(l, 5, 256, 4, 128, 3, 16, 2.0, 1); /* r 16 + bias: ld cols + 24 */
    add_tq_matmul_lora_b(l, 6, 192, 3, 64, 2, 7, 0.75, 1);  /* r 7 + bias: one block of 8 */
    add_tq_matmul_lora_b(l, 4, 128, 4, 64, 3, 0, 1.0, 1);   /* the bias alone */
    add_tq_matmul_lora_bc(l, 6, 192, 3, 64, 2, 7, 0.75, 1, 1); /* C in bf16 */
    add_tq_matmul_lora_bc(l, 5, 256, 4, 128, 3, 0, 1.0, 0, 1); /* nothing folded, C in bf16 */
    /* tq_rotate16: every group, two and three group columns */
    add_rotate16(l, 3, 192, 64, 7);
    add_rotate16(l, 2, 256, 128, 0x9E3779B97F4A7C15ull);
    add_rotate16(l, 2, 512, 256, 12345);
    /* windows: the middle two group columns of six, the last of three, the first of four */
    add_rotate_at(l, 3, 128, 64, 7, 128, 384, 0);
    add_rotate_at(l, 2, 128, 128, 0x9E3779B97F4A7C15ull, 256, 384, 1);
    add_rotate_at(l, 2, 256, 256, 12345, 0, 1024, 0);
}
