/* Rows of the op-case table (op_case.h): the DiT ops (layernorm, adaLN modulate and the gated
 * residual, GELU-tanh and SiLU, bias, squared error, patches and strided copies). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/op_case.h"

/* ---- layernorm: out = (x - mean) * rstd, mean and rstd saved ----
 * tensors: 0 x, 1 out, 2 mean, 3 rstd, 4 dout, 5 dx; p: rows, C; s: eps */

static void ln_fwd(oc_run *r) {
    r->be->layernorm_fwd(r->be, OCF(r, 1), OCF(r, 2), OCF(r, 3), OCF(r, 0), OCP(r, 0),
                         OCP(r, 1), (float)OCS(r, 0));
}
static void ln_bwd(oc_run *r) {
    r->be->layernorm_bwd(r->be, OCF(r, 5), OCF(r, 4), OCF(r, 0), OCF(r, 2), OCF(r, 3),
                         OCP(r, 0), OCP(r, 1));
}
static void ln_ref(oc_ref *r) {
    const int64_t rows = r->c->p[0], C = r->c->p[1];
    /* eps as the backend gets it: a float */
    const double eps = (double)(float)r->c->s[0];
    for (int64_t i = 0; i < rows; i++) {
        const double *x = r->v[0] + i * C;
        double m = 0.0, v = 0.0;
        for (int64_t c = 0; c < C; c++) m += x[c];
        m /= (double)C;
        for (int64_t c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
        double rs = 1.0 / sqrt(v / (double)C + eps);
        r->v[2][i] = m, r->v[3][i] = rs;
        for (int64_t c = 0; c < C; c++) r->v[1][i * C + c] = (x[c] - m) * rs;
    }
}

static void add_layernorm(oc_list *l, int64_t rows, int64_t C, float mid, float amp, double eps) {
    oc_case c = {.ops = "layernorm_fwd layernorm_bwd", .nt = 6, .p = {rows, C}, .s = {eps},
                 .fwd = ln_fwd, .ref = ln_ref, .bwd = ln_bwd,
                 /* sums in double; mean, rstd rounded to float, then (x - mean) * rstd */
                 .tol_fwd = 1e-6,
                 /* the same, plus the two row means as floats and 4 fp32 operations */
                 .tol_bwd = 1e-6};
    c.t[0] = (oc_tensor)OC_T_INA("x", rows * C, amp);
    c.t[0].mid = mid;
    c.t[1] = (oc_tensor)OC_T_OUT("out", rows * C);
    c.t[2] = (oc_tensor)OC_T_OUT("mean", rows);
    c.t[3] = (oc_tensor)OC_T_OUT("rstd", rows);
    c.t[4] = (oc_tensor)OC_T_DOUT("dout", 1);
    c.t[5] = (oc_tensor)OC_T_DIN("dx", 0);
    snprintf(c.name, sizeof c.name, "layernorm rows %lld C %lld (x in %g +-%g) eps %g",
             (long long)rows, (long long)C, mid, amp, eps);
    oc_add(l, &c);
}

/* ---- modulate (out = x (1 + scale) + shift) and gate (out = x + gate y) ----
 * tensors: 0 x, 1 shift | y, 2 scale | gate, 3 out (absent where out aliases x: x is then
 * INOUT), then dout, then the gradients of the inputs whose bit in p[5] is clear, in input
 * order (gate: never x's, the identity left to the caller). The conditioning rows are the
 * [B, ld] matrices of tensors 1, 2 (modulate) or 2 (gate) from column p[4].
 * p: B, T, C, ld, column, mask of NULL gradients, out aliases x, the elementwise gradient
 * (modulate's dx, gate's dy) written instead of added to (1: accumulate 0; 2: gate's dy
 * written in bf16, accumulate 2) */

/* A backward's accumulate argument from a row's write parameter (0 added, 1 written, 2
 * written in bf16) */
static int acc_of(int64_t write) { return write == 2 ? 2 : !write; }

enum { MG_X = 0, MG_A = 1, MG_B = 2 };

static int mg_out(const oc_case *c) { return c->p[6] ? 0 : 3; }
static int mg_dout(const oc_case *c) { return c->p[6] ? 3 : 4; }
/* tensor of the gradient of input `in`, or -1 (NULL) */
static int mg_grad(const oc_case *c, int in) {
    if ((c->p[5] >> in) & 1) return -1;
    int k = mg_dout(c) + 1;
    for (int j = 0; j < in; j++) k += !((c->p[5] >> j) & 1);
    return k;
}
/* the gradient's pointer at the conditioning column (cond: a [B, ld] input), or NULL */
static float *mg_gptr(oc_run *r, int in, int cond) {
    int k = mg_grad(r->c, in);
    return k < 0 ? NULL : OCF(r, k) + (cond ? OCP(r, 4) : 0);
}

static void mod_fwd(oc_run *r) {
    int64_t o = OCP(r, 4);
    r->be->modulate_fwd(r->be, OCF(r, mg_out(r->c)), OCF(r, 0), OCF(r, 1) + o, OCF(r, 2) + o,
                        OCP(r, 3), OCP(r, 0), OCP(r, 1), OCP(r, 2), 0);
}
/* modulate's forward writing out in bf16 (its values as to_bf16 rounds them): tensors 0 x,
 * 1 shift, 2 scale, 3 out (bf16); p as the rows above */
static void mod16_fwd(oc_run *r) {
    int64_t o = OCP(r, 4);
    r->be->modulate_fwd(r->be, OCF(r, 3), OCF(r, 0), OCF(r, 1) + o, OCF(r, 2) + o, OCP(r, 3),
                        OCP(r, 0), OCP(r, 1), OCP(r, 2), 1);
}
static void mod_bwd(oc_run *r) {
    r->be->modulate_bwd(r->be, mg_gptr(r, MG_X, 0), mg_gptr(r, MG_A, 1), mg_gptr(r, MG_B, 1),
                        OCF(r, mg_dout(r->c)), OCF(r, 0), OCF(r, 2) + OCP(r, 4), OCP(r, 3),
                        OCP(r, 0), OCP(r, 1), OCP(r, 2), !OCP(r, 7));
}
static void gate_fwd(oc_run *r) {
    r->be->gate_fwd(r->be, OCF(r, mg_out(r->c)), OCF(r, 0), OCF(r, 1), OCF(r, 2) + OCP(r, 4),
                    OCP(r, 3), OCP(r, 0), OCP(r, 1), OCP(r, 2));
}
static void gate_bwd(oc_run *r) {
    r->be->gate_bwd(r->be, mg_gptr(r, MG_A, 0), mg_gptr(r, MG_B, 1), OCF(r, mg_dout(r->c)),
                    OCF(r, 1), OCF(r, 2) + OCP(r, 4), OCP(r, 3), OCP(r, 0), OCP(r, 1), OCP(r, 2),
                    acc_of(OCP(r, 7)));
}
/* both: elementwise, so in place is safe (out[k] reads only x[k]) */
static void mg_ref(oc_ref *r, int gate) {
    const int64_t B = r->c->p[0], T = r->c->p[1], C = r->c->p[2], ld = r->c->p[3];
    const int64_t col = r->c->p[4];
    const double *x = r->v[0], *a = r->v[1], *b = r->v[2] + col; /* b: scale | gate rows */
    double *out = r->v[mg_out(r->c)];
    for (int64_t i = 0; i < B * T; i++)
        for (int64_t c = 0; c < C; c++) {
            int64_t k = i * C + c, m = (i / T) * ld + c;
            out[k] = gate ? x[k] + b[m] * a[k] : x[k] * (1.0 + b[m]) + a[col + m];
        }
}
static void mod_ref(oc_ref *r) { mg_ref(r, 0); }
static void gate_ref(oc_ref *r) { mg_ref(r, 1); }

static void add_modgate_w(oc_list *l, int gate, int64_t B, int64_t T, int64_t C, int64_t ld,
                          int64_t col, int nullmask, int alias, int write) {
    if (gate) nullmask |= 1 << MG_X;
    oc_case c = {.ops = gate ? "gate_fwd gate_bwd" : "modulate_fwd modulate_bwd",
                 .p = {B, T, C, ld, col, nullmask, alias, write},
                 .fwd = gate ? gate_fwd : mod_fwd, .ref = gate ? gate_ref : mod_ref,
                 .bwd = gate ? gate_bwd : mod_bwd,
                 /* two or three fp32 roundings (each <= 6e-8 of the scale) */
                 .tol_fwd = 5e-7,
                 /* one product; the conditioning: double sums over T of fp32 products; dy in
                  * bf16: its rounding, 2^-8 of each value at most (u = 2^-8) */
                 .tol_bwd = write == 2 ? 4e-3 : 1e-6};
    const int64_t n = B * T * C;
    int nt = 0;
    c.t[nt++] = alias ? (oc_tensor)OC_T_INOUT("x", n) : (oc_tensor)OC_T_IN("x", n);
    c.t[0].amp = 1.5f;
    c.t[nt++] = gate ? (oc_tensor)OC_T_INA("y", n, 1.5f) : (oc_tensor)OC_T_IN("shift", B * ld);
    c.t[nt++] = (oc_tensor)OC_T_IN(gate ? "gate" : "scale", B * ld);
    if (!alias) c.t[nt++] = (oc_tensor)OC_T_OUT("out", n);
    c.t[nt++] = (oc_tensor)OC_T_DOUT("dout", mg_out(&c));
    static const char *const gname[2][3] = {{"dx", "dshift", "dscale"}, {"", "dy", "dgate"}};
    for (int in = 0; in < 3; in++)
        if (!((nullmask >> in) & 1)) {
            c.t[nt] = (oc_tensor)OC_T_DIN(gname[gate][in], in);
            if (write && in == (gate ? MG_A : MG_X))
                c.t[nt].flags |= OC_WRITES | (write == 2 ? OC_DIN16 : 0);
            nt++;
        }
    c.nt = nt;
    char extra[64] = "";
    for (int in = 0; in < 3; in++)
        if (((nullmask >> in) & 1) && !(gate && in == MG_X))
            snprintf(extra + strlen(extra), sizeof extra - strlen(extra), ", %s NULL",
                     gname[gate][in]);
    snprintf(c.name, sizeof c.name, "%s B %lld T %lld C %lld, rows of ld %lld from column %lld%s%s%s",
             gate ? "gate" : "modulate", (long long)B, (long long)T, (long long)C, (long long)ld,
             (long long)col, alias ? ", out aliases x" : "", extra,
             write == 2 ? ", dy written in bf16" : write ? (gate ? ", dy written" : ", dx written")
                                                     : "");
    oc_add(l, &c);
}
static void add_modgate(oc_list *l, int gate, int64_t B, int64_t T, int64_t C, int64_t ld,
                        int64_t col, int nullmask, int alias) {
    add_modgate_w(l, gate, B, T, C, ld, col, nullmask, alias, 0);
}
static void add_modulate16(oc_list *l, int64_t B, int64_t T, int64_t C, int64_t ld, int64_t col) {
    oc_case c = {.ops = "modulate_fwd", .nt = 4, .p = {B, T, C, ld, col, 0, 0, 0},
                 .fwd = mod16_fwd, .ref = mod_ref,
                 /* the rounding to bf16 of each value: 2^-8 of it at most (u = 2^-8) */
                 .tol_fwd = 4e-3};
    c.t[0] = (oc_tensor)OC_T_INA("x", B * T * C, 1.5f);
    c.t[1] = (oc_tensor)OC_T_IN("shift", B * ld);
    c.t[2] = (oc_tensor)OC_T_IN("scale", B * ld);
    c.t[3] = (oc_tensor)OC_T_OUT16("out", B * T * C);
    snprintf(c.name, sizeof c.name,
             "modulate B %lld T %lld C %lld, rows of ld %lld from column %lld, out in bf16",
             (long long)B, (long long)T, (long long)C, (long long)ld, (long long)col);
    oc_add(l, &c);
}

/* ---- GELU (tanh approximation) and SiLU, elementwise ----
 * tensors: 0 x, 1 out, 2 dout, 3 dx (in place: 0 x INOUT, forward only); p: n, silu */

static double act(double x, int silu) {
    if (silu) return x / (1.0 + exp(-x));
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}
static void act_fwd(oc_run *r) {
    float *out = OCF(r, r->c->nt == 1 ? 0 : 1);
    if (OCP(r, 1)) r->be->silu_fwd(r->be, out, OCF(r, 0), OCP(r, 0));
    else r->be->gelu_tanh_fwd(r->be, out, OCF(r, 0), OCP(r, 0), 0, 0, 0);
}
static void act_bwd(oc_run *r) {
    if (OCP(r, 1)) r->be->silu_bwd(r->be, OCF(r, 3), OCF(r, 2), OCF(r, 0), OCP(r, 0), !OCP(r, 2));
    else r->be->gelu_tanh_bwd(r->be, OCF(r, 3), OCF(r, 2), OCF(r, 0), OCP(r, 0), acc_of(OCP(r, 2)),
                              0, 0);
}
static void act_ref(oc_ref *r) {
    double *out = r->v[r->c->nt == 1 ? 0 : 1];
    for (int64_t i = 0; i < r->c->p[0]; i++) out[i] = act(r->v[0][i], (int)r->c->p[1]);
}

/* GELU over rows: x [rows, cols] dense, out and dout rows at stride ld (as the Flux single
 * block writes into its concatenation); out is in place over a random start whose gaps the
 * op must leave alone (the reference keeps them).
 * tensors: 0 x, 1 out [rows, ld], 2 dout, 3 dx; p: n, 0, write, cols, ld */
static void gelu_rows_fwd(oc_run *r) {
    r->be->gelu_tanh_fwd(r->be, OCF(r, 1), OCF(r, 0), OCP(r, 0), OCP(r, 3), OCP(r, 4), 0);
}
static void gelu_rows_bwd(oc_run *r) {
    r->be->gelu_tanh_bwd(r->be, OCF(r, 3), OCF(r, 2), OCF(r, 0), OCP(r, 0), acc_of(OCP(r, 2)),
                         OCP(r, 3), OCP(r, 4));
}
static void gelu_rows_ref(oc_ref *r) {
    const int64_t n = r->c->p[0], cols = r->c->p[3], ld = r->c->p[4];
    for (int64_t i = 0; i < n; i++) r->v[1][i / cols * ld + i % cols] = act(r->v[0][i], 0);
}
static void add_gelu_rows(oc_list *l, int64_t rows, int64_t cols, int64_t ld, int write) {
    oc_case c = {.ops = "gelu_tanh_fwd gelu_tanh_bwd", .nt = 4,
                 .p = {rows * cols, 0, write, cols, ld}, .fwd = gelu_rows_fwd,
                 .ref = gelu_rows_ref, .bwd = gelu_rows_bwd,
                 /* as the dense rows (add_act_w); dx in bf16: its rounding (u = 2^-8) */
                 .tol_fwd = 5e-7, .tol_bwd = write == 2 ? 4e-3 : 5e-6};
    c.t[0] = (oc_tensor)OC_T_INA("x", rows * cols, 4.0f);
    c.t[1] = (oc_tensor)OC_T_INOUT("out", rows * ld);
    c.t[2] = (oc_tensor)OC_T_DOUT("dout", 1);
    c.t[3] = (oc_tensor)OC_T_DIN("dx", 0);
    if (write) c.t[3].flags |= OC_WRITES | (write == 2 ? OC_DIN16 : 0);
    snprintf(c.name, sizeof c.name, "gelu_tanh rows %lld x %lld, out rows at stride %lld%s",
             (long long)rows, (long long)cols, (long long)ld,
             write == 2 ? ", dx written in bf16" : write ? ", dx written" : "");
    oc_add(l, &c);
}

/* GELU's forward with a bf16 output, each value rounded to nearest even as to_bf16 rounds it:
 * one dense run, or through the row form with rows of cols at a stride of cols (the row
 * kernels' bf16 stores; the strides themselves are add_gelu_rows's). tensors: 0 x, 1 out (bf16);
 * p: n, 0, 0, cols (0: dense), ld */
static void gelu16_fwd(oc_run *r) {
    r->be->gelu_tanh_fwd(r->be, OCF(r, 1), OCF(r, 0), OCP(r, 0), OCP(r, 3), OCP(r, 4), 1);
}
static void gelu16_ref(oc_ref *r) {
    for (int64_t i = 0; i < r->c->p[0]; i++) r->v[1][i] = act(r->v[0][i], 0);
}
static void add_gelu16(oc_list *l, int64_t rows, int64_t cols) {
    oc_case c = {.ops = "gelu_tanh_fwd", .nt = 2, .p = {rows * cols, 0, 0, rows > 1 ? cols : 0,
                 cols}, .fwd = gelu16_fwd, .ref = gelu16_ref,
                 /* the rounding to bf16 of each value: 2^-8 of it at most (bf16 keeps 8
                  * significant bits; u = 2^-8 = 3.9e-3), so of the largest */
                 .tol_fwd = 4e-3};
    c.t[0] = (oc_tensor)OC_T_INA("x", rows * cols, 4.0f);
    c.t[1] = (oc_tensor)OC_T_OUT16("out", rows * cols);
    snprintf(c.name, sizeof c.name, "gelu_tanh into bf16, %lld x %lld%s", (long long)rows,
             (long long)cols, rows > 1 ? " (as rows)" : "");
    oc_add(l, &c);
}

/* write: the backward writes dx (accumulate 0) instead of adding to it */
static void add_act_w(oc_list *l, int silu, int64_t n, float amp, int inplace, int write) {
    oc_case c = {.p = {n, silu, write}, .fwd = act_fwd, .ref = act_ref, .bwd = inplace ? NULL : act_bwd,
                 /* expf (<= 2 ulp) and 3-5 fp32 operations after it */
                 .tol_fwd = 5e-7,
                 /* sigmoid, tanh round to 1 within 3e-8 and x * (1 - sig), the gelu factor
                  * 0.5 x sqrt(2/pi) (1 + 3a x^2) multiply that by up to ~17 or ~9: ~5e-7 */
                 .tol_bwd = write == 2 ? 4e-3 : 5e-6}; /* dx in bf16: its rounding, u = 2^-8 */
    if (inplace) {
        c.ops = silu ? "silu_fwd" : "gelu_tanh_fwd";
        c.nt = 1;
        c.t[0] = (oc_tensor)OC_T_INOUT("x", n);
        c.t[0].amp = amp;
    } else {
        c.ops = silu ? "silu_fwd silu_bwd" : "gelu_tanh_fwd gelu_tanh_bwd";
        c.nt = 4;
        c.t[0] = (oc_tensor)OC_T_INA("x", n, amp);
        c.t[1] = (oc_tensor)OC_T_OUT("out", n);
        c.t[2] = (oc_tensor)OC_T_DOUT("dout", 1);
        c.t[3] = (oc_tensor)OC_T_DIN("dx", 0);
        if (write) c.t[3].flags |= OC_WRITES | (write == 2 ? OC_DIN16 : 0);
    }
    snprintf(c.name, sizeof c.name, "%s n %lld (x in +-%g)%s%s", silu ? "silu" : "gelu_tanh",
             (long long)n, amp, inplace ? ", in place" : "",
             write == 2 ? ", dx written in bf16" : write ? ", dx written" : "");
    oc_add(l, &c);
}
static void add_act(oc_list *l, int silu, int64_t n, float amp, int inplace) {
    add_act_w(l, silu, n, amp, inplace, 0);
}

/* ---- bias: y += bias per row; dbias = column sums of dy ----
 * tensors: 0 y (INOUT), 1 bias, 2 dy, 3 dbias; p: rows, C */

static void bias_fwd(oc_run *r) {
    r->be->bias_add_fwd(r->be, OCF(r, 0), OCF(r, 1), OCP(r, 0), OCP(r, 1));
}
static void bias_bwd(oc_run *r) {
    r->be->bias_bwd(r->be, OCF(r, 3), OCF(r, 2), OCP(r, 0), OCP(r, 1), NULL);
}
static void bias_ref(oc_ref *r) {
    const int64_t rows = r->c->p[0], C = r->c->p[1];
    for (int64_t i = 0; i < rows; i++)
        for (int64_t c = 0; c < C; c++) r->v[0][i * C + c] += r->v[1][c];
}

static void add_bias(oc_list *l, int64_t rows, int64_t C) {
    oc_case c = {.ops = "bias_add_fwd bias_bwd", .nt = 4, .p = {rows, C}, .fwd = bias_fwd,
                 .ref = bias_ref, .bwd = bias_bwd,
                 /* one fp32 addition: half an ulp (6e-8) */
                 .tol_fwd = 1e-7,
                 /* a double column sum rounded to float, then added to the start: ~1.2e-7 */
                 .tol_bwd = 5e-7};
    c.t[0] = (oc_tensor)OC_T_INOUT("y", rows * C);
    c.t[1] = (oc_tensor)OC_T_IN("bias", C);
    c.t[2] = (oc_tensor)OC_T_DOUT("dy", 0);
    c.t[3] = (oc_tensor)OC_T_DIN("dbias", 1);
    snprintf(c.name, sizeof c.name, "bias_add rows %lld C %lld", (long long)rows, (long long)C);
    oc_add(l, &c);
}

/* ---- squared error per row: sse[r] = sum_{i<n} (pred[r*ld+i] - target[r*n+i])^2 ----
 * tensors: 0 pred [rows, ld], 1 target [rows, n], 2 sse, 3 dsse (one scalar: dloss),
 * 4 dpred; p: rows, n, ld */

static void mse_fwd(oc_run *r) {
    r->be->mse_fwd(r->be, OCF(r, 2), OCF(r, 0), OCP(r, 2), OCF(r, 1), OCP(r, 0), OCP(r, 1));
}
static void mse_bwd(oc_run *r) {
    r->be->mse_bwd(r->be, OCF(r, 4), OCF(r, 0), OCP(r, 2), OCF(r, 1), r->dscal, OCP(r, 0),
                   OCP(r, 1));
}
static void mse_ref(oc_ref *r) {
    const int64_t rows = r->c->p[0], n = r->c->p[1], ld = r->c->p[2];
    for (int64_t i = 0; i < rows; i++) {
        double s = 0.0;
        for (int64_t k = 0; k < n; k++) {
            double d = r->v[0][i * ld + k] - r->v[1][i * n + k];
            s += d * d;
        }
        r->v[2][i] = s;
    }
}

static void add_mse(oc_list *l, int64_t rows, int64_t n, int64_t ld) {
    oc_case c = {.ops = "mse_fwd mse_bwd", .nt = 5, .p = {rows, n, ld}, .fwd = mse_fwd,
                 .ref = mse_ref, .bwd = mse_bwd,
                 /* a double sum of squares stored as float: half an ulp (6e-8) */
                 .tol_fwd = 3e-7,
                 /* 2 dloss (p - t) in fp32, added to the start: 2-3 roundings (~1.5e-7) */
                 .tol_bwd = 5e-7};
    c.t[0] = (oc_tensor)OC_T_IN("pred", rows * ld);
    c.t[1] = (oc_tensor)OC_T_IN("target", rows * n);
    c.t[2] = (oc_tensor)OC_T_OUT("sse", rows);
    c.t[3] = (oc_tensor){.name = "dsse", .kind = OC_DOUT, .of = 2, .flags = OC_UNIFORM};
    c.t[4] = (oc_tensor)OC_T_DIN("dpred", 0);
    snprintf(c.name, sizeof c.name, "mse rows %lld n %lld, pred rows of ld %lld", (long long)rows,
             (long long)n, (long long)ld);
    oc_add(l, &c);
}

/* ---- patchify / unpatchify: each the other's backward, both write ----
 * tensors: 0 the input, 1 the output, 2 its upstream gradient, 3 the input's gradient
 * (written); p: B, C, H, W, p, chan_last, unpatchify (the forward is unpatchify) */

/* index in tok [B, T, C*p*p] of img [B, C, H, W]'s element (b, c, y, x) */
static int64_t tok_index(const int64_t *p, int64_t b, int64_t c, int64_t y, int64_t x) {
    const int64_t C = p[1], W = p[3], ps = p[4], gw = W / ps, T = (p[2] / ps) * gw;
    const int64_t t = (y / ps) * gw + x / ps, i = y % ps, j = x % ps;
    const int64_t k = p[5] ? (i * ps + j) * C + c : (c * ps + i) * ps + j;
    return (b * T + t) * C * ps * ps + k;
}
static void patch_call(oc_run *r, int unpatch, float *dst, const float *src) {
    const int64_t *p = r->c->p;
    if (unpatch) r->be->unpatchify(r->be, dst, src, p[0], p[1], p[2], p[3], p[4], (int)p[5]);
    else r->be->patchify(r->be, dst, src, p[0], p[1], p[2], p[3], p[4], (int)p[5]);
}
static void patch_fwd(oc_run *r) { patch_call(r, (int)OCP(r, 6), OCF(r, 1), OCF(r, 0)); }
static void patch_bwd(oc_run *r) { patch_call(r, !OCP(r, 6), OCF(r, 3), OCF(r, 2)); }
static void patch_ref(oc_ref *r) {
    const int64_t *p = r->c->p;
    for (int64_t b = 0, e = 0; b < p[0]; b++)
        for (int64_t c = 0; c < p[1]; c++)
            for (int64_t y = 0; y < p[2]; y++)
                for (int64_t x = 0; x < p[3]; x++, e++) {
                    int64_t t = tok_index(p, b, c, y, x);
                    if (p[6]) r->v[1][e] = r->v[0][t];
                    else r->v[1][t] = r->v[0][e];
                }
}

static void add_patch(oc_list *l, int64_t B, int64_t C, int64_t H, int64_t W, int64_t ps,
                      int chan_last, int unpatch) {
    const int64_t n = B * C * H * W;
    oc_case c = {.ops = "patchify unpatchify", .nt = 4, .p = {B, C, H, W, ps, chan_last, unpatch},
                 .fwd = patch_fwd, .ref = patch_ref, .bwd = patch_bwd,
                 /* a permutation: exact */
                 .tol_fwd = 0.0,
                 /* the differences' rounding only: ~sqrt(n) 1e-16 over 2h = 2e-4, ~1e-11
                  * (a wrong or missed element: O(1), or NaN) */
                 .tol_bwd = 1e-9};
    c.t[0] = (oc_tensor)OC_T_IN(unpatch ? "tok" : "img", n);
    c.t[1] = (oc_tensor)OC_T_OUT(unpatch ? "img" : "tok", n);
    c.t[2] = (oc_tensor)OC_T_DOUT(unpatch ? "dimg" : "dtok", 1);
    c.t[3] = (oc_tensor){.name = unpatch ? "dtok" : "dimg", .kind = OC_DIN, .of = 0,
                         .flags = OC_WRITES};
    snprintf(c.name, sizeof c.name, "%s B %lld C %lld H %lld W %lld p %lld chan_last %d",
             unpatch ? "unpatchify" : "patchify", (long long)B, (long long)C, (long long)H,
             (long long)W, (long long)ps, chan_last);
    oc_add(l, &c);
}

/* ---- copy2d: dst[r*ldd + c] = src[r*lds + c], c < cols ----
 * tensors: 0 src [rows, lds], 1 dst [rows, ldd] (INOUT where it has gaps: they must stay;
 * OUT where it is dense: every element written), 2 ddst, 3 dsrc (written: copy2d back, after
 * fill 0 where src has gaps); p: rows, cols, lds, ldd, column of src, column of dst */

static void c2_fwd(oc_run *r) {
    r->be->copy2d(r->be, OCF(r, 1) + OCP(r, 5), OCP(r, 3), OCF(r, 0) + OCP(r, 4), OCP(r, 2),
                  OCP(r, 0), OCP(r, 1));
}
static void c2_bwd(oc_run *r) {
    if (OCP(r, 2) > OCP(r, 1)) r->be->fill(r->be, OCF(r, 3), 0.0f, OCP(r, 0) * OCP(r, 2));
    r->be->copy2d(r->be, OCF(r, 3) + OCP(r, 4), OCP(r, 2), OCF(r, 2) + OCP(r, 5), OCP(r, 3),
                  OCP(r, 0), OCP(r, 1));
}
static void c2_ref(oc_ref *r) {
    const int64_t *p = r->c->p;
    for (int64_t i = 0; i < p[0]; i++)
        for (int64_t c = 0; c < p[1]; c++)
            r->v[1][i * p[3] + p[5] + c] = r->v[0][i * p[2] + p[4] + c];
}

static void add_copy2d(oc_list *l, int64_t rows, int64_t cols, int64_t lds, int64_t ldd,
                       int64_t cs, int64_t cd) {
    oc_case c = {.ops = lds > cols ? "copy2d fill" : "copy2d", .nt = 4,
                 .p = {rows, cols, lds, ldd, cs, cd}, .fwd = c2_fwd, .ref = c2_ref, .bwd = c2_bwd,
                 /* a copy: exact */
                 .tol_fwd = 0.0,
                 /* the differences' rounding, as for the patches */
                 .tol_bwd = 1e-9};
    c.t[0] = (oc_tensor)OC_T_IN("src", rows * lds);
    c.t[1] = ldd > cols ? (oc_tensor)OC_T_INOUT("dst", rows * ldd)
                        : (oc_tensor)OC_T_OUT("dst", rows * ldd);
    c.t[2] = (oc_tensor)OC_T_DOUT("ddst", 1);
    c.t[3] = (oc_tensor){.name = "dsrc", .kind = OC_DIN, .of = 0, .flags = OC_WRITES};
    snprintf(c.name, sizeof c.name,
             "copy2d rows %lld cols %lld, src ld %lld from column %lld, dst ld %lld from column "
             "%lld", (long long)rows, (long long)cols, (long long)lds, (long long)cs,
             (long long)ldd, (long long)cd);
    oc_add(l, &c);
}

/* Shapes are chosen so that the runner's differences (every ceil(n/96)-th element) reach
 * each gradient's last element. */
/* ---- RoPE of adjacent pairs with a per-position (cos, sin) table (Flux) ----
 * tensors: 0 x [B, T, H, D] (in place), 1 the table [T, D/2, 2], 2 the gradient (in place).
 * The table is any pair of numbers per position and pair: the op is linear in x, and its
 * backward, the rotation by (c, -s), is the transpose for any (c, s). */
static void rp_fwd(oc_run *r) {
    r->be->rope_pairs_fwd(r->be, OCF(r, 0), OCP(r, 0), OCP(r, 1), OCP(r, 2), OCP(r, 3), OCF(r, 1));
}
static void rp_bwd(oc_run *r) {
    r->be->rope_pairs_bwd(r->be, OCF(r, 2), OCP(r, 0), OCP(r, 1), OCP(r, 2), OCP(r, 3), OCF(r, 1));
}
static void rp_ref(oc_ref *r) {
    const int64_t B = r->c->p[0], T = r->c->p[1], H = r->c->p[2], D = r->c->p[3];
    double *x = r->v[0];
    const double *cs = r->v[1];
    for (int64_t row = 0; row < B * T * H; row++) {
        const double *t = cs + ((row / H) % T) * D;
        double *v = x + row * D;
        for (int64_t i = 0; i < D / 2; i++) {
            const double c = t[2 * i], s = t[2 * i + 1], a = v[2 * i], b = v[2 * i + 1];
            v[2 * i] = a * c - b * s;
            v[2 * i + 1] = b * c + a * s;
        }
    }
}
static void add_rope_pairs(oc_list *l, int64_t B, int64_t T, int64_t H, int64_t D) {
    oc_case c = {.ops = "rope_pairs_fwd rope_pairs_bwd", .nt = 3, .p = {B, T, H, D},
                 .fwd = rp_fwd, .ref = rp_ref, .bwd = rp_bwd,
                 /* two rounded products and a sum per element (u each) */
                 .tol_fwd = 5e-7, .tol_bwd = 5e-7};
    c.t[0] = (oc_tensor)OC_T_INOUT("x", B * T * H * D);
    c.t[1] = (oc_tensor)OC_T_IN("cos, sin", T * D);
    c.t[2] = (oc_tensor)OC_T_DIO("dx", 0);
    snprintf(c.name, sizeof c.name, "rope_pairs B %lld T %lld H %lld D %lld", (long long)B,
             (long long)T, (long long)H, (long long)D);
    oc_add(l, &c);
}

/* rope_pairs_fwd16 against rope_pairs_fwd (in place on a copy) then to_bf16: the same bits,
 * x kept. p: B, T, H, D. */
static int rope_pairs16_row(tz_backend *be, const oc_case *c, char *msg, size_t len) {
    const int64_t B = c->p[0], T = c->p[1], H = c->p[2], D = c->p[3], n = B * T * H * D;
    float *h = malloc((size_t)(2 * n + T * D) * 4), *kept = h + n, *tab = kept + n;
    uint16_t *a = malloc((size_t)(2 * n) * 2), *b = a + n;
    for (int64_t i = 0; i < n; i++) h[i] = (float)((i * 7919) % 2001 - 1000) / 999.0f;
    for (int64_t i = 0; i < T * D; i++) tab[i] = (float)((i * 104729) % 1999 - 999) / 1000.0f;
    float *x = be->alloc(be, (size_t)n * 4), *y = be->alloc(be, (size_t)n * 4);
    float *cs = be->alloc(be, (size_t)(T * D) * 4);
    uint16_t *y16 = be->alloc(be, (size_t)n * 2), *r16 = be->alloc(be, (size_t)n * 2);
    be->upload(be, x, h, (size_t)n * 4), be->upload(be, y, h, (size_t)n * 4);
    be->upload(be, cs, tab, (size_t)(T * D) * 4);
    be->rope_pairs_fwd16(be, y16, x, B, T, H, D, cs);
    be->rope_pairs_fwd(be, y, B, T, H, D, cs);
    be->to_bf16(be, r16, y, n);
    be->download(be, a, y16, (size_t)n * 2), be->download(be, b, r16, (size_t)n * 2);
    be->download(be, kept, x, (size_t)n * 4);
    be->release(be, x), be->release(be, y), be->release(be, cs), be->release(be, y16);
    be->release(be, r16);
    int64_t diff = 0;
    for (int64_t i = 0; i < n; i++) diff += a[i] != b[i];
    const int changed = memcmp(kept, h, (size_t)n * 4) != 0;
    free(h), free(a);
    if (diff || changed)
        snprintf(msg, len, "%lld of %lld elements differ%s", (long long)diff, (long long)n,
                 changed ? "; x was changed" : "");
    return diff || changed;
}

/* rms_rope_pairs16 against rmsnorm_fwd, the rows placed at their joint positions by
 * upload, and rope_pairs_fwd16 of the joint rows: the stream's rows the same bits, rstd the
 * same, y's other rows untouched. p: B, Ts, off, T, H, D. */
static int rms_rope_row(tz_backend *be, const oc_case *c, char *msg, size_t len) {
    const int64_t B = c->p[0], Ts = c->p[1], off = c->p[2], T = c->p[3], H = c->p[4],
                  D = c->p[5], row = H * D, ns = B * Ts * row, n = B * T * row;
    float *h = malloc((size_t)(ns + D + T * D + ns + n + 2 * B * Ts * H) * 4);
    float *w = h + ns, *tab = w + D, *hn = tab + T * D, *j = hn + ns, *r1 = j + n, *r2 = r1 + B * Ts * H;
    uint16_t *a = malloc((size_t)(2 * n) * 2), *b = a + n;
    for (int64_t i = 0; i < ns; i++) h[i] = (float)((i * 7919) % 2001 - 1000) / 333.0f;
    for (int64_t i = 0; i < D; i++) w[i] = 0.5f + (float)(i % 5) * 0.25f;
    for (int64_t i = 0; i < T * D; i++) tab[i] = (float)((i * 104729) % 1999 - 999) / 1000.0f;
    for (int64_t i = 0; i < n; i++) j[i] = 0.0f;
    float *x = be->alloc(be, (size_t)ns * 4), *dw = be->alloc(be, (size_t)D * 4);
    float *cs = be->alloc(be, (size_t)(T * D) * 4), *hd = be->alloc(be, (size_t)ns * 4);
    float *jd = be->alloc(be, (size_t)n * 4), *rs1 = be->alloc(be, (size_t)(B * Ts * H) * 4);
    float *rs2 = be->alloc(be, (size_t)(B * Ts * H) * 4);
    uint16_t *y1 = be->alloc(be, (size_t)n * 2), *y2 = be->alloc(be, (size_t)n * 2);
    be->upload(be, x, h, (size_t)ns * 4), be->upload(be, dw, w, (size_t)D * 4);
    be->upload(be, cs, tab, (size_t)(T * D) * 4);
    be->fill(be, (float *)(void *)y1, 0.0f, n / 2), be->fill(be, (float *)(void *)y2, 0.0f, n / 2);
    be->rms_rope_pairs16(be, y1, rs1, x, dw, B, Ts, off, T, H, D, 1e-6f, cs);
    be->rmsnorm_fwd(be, hd, rs2, x, dw, B * Ts * H, D, 1e-6f);
    be->download(be, hn, hd, (size_t)ns * 4);
    for (int64_t bb = 0; bb < B; bb++)
        memcpy(j + (bb * T + off) * row, hn + bb * Ts * row, (size_t)(Ts * row) * 4);
    be->upload(be, jd, j, (size_t)n * 4);
    be->rope_pairs_fwd16(be, y2, jd, B, T, H, D, cs);
    be->download(be, a, y1, (size_t)n * 2), be->download(be, b, y2, (size_t)n * 2);
    be->download(be, r1, rs1, (size_t)(B * Ts * H) * 4), be->download(be, r2, rs2, (size_t)(B * Ts * H) * 4);
    int64_t diff = 0, other = 0;
    for (int64_t bb = 0; bb < B; bb++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t k = 0; k < row; k++) {
                const int64_t i = (bb * T + t) * row + k;
                if (t >= off && t < off + Ts) diff += a[i] != b[i];
                else other += a[i] != 0;
            }
    const int rdiff = memcmp(r1, r2, (size_t)(B * Ts * H) * 4) != 0;
    be->release(be, x), be->release(be, dw), be->release(be, cs), be->release(be, hd);
    be->release(be, jd), be->release(be, rs1), be->release(be, rs2), be->release(be, y1);
    be->release(be, y2);
    free(h), free(a);
    if (diff || other || rdiff)
        snprintf(msg, len, "%lld of %lld elements differ, %lld outside the stream written, rstd %s",
                 (long long)diff, (long long)ns, (long long)other, rdiff ? "differs" : "the same");
    return diff || other || rdiff;
}

static void add_rms_rope(oc_list *l, int64_t B, int64_t Ts, int64_t off, int64_t T, int64_t H,
                         int64_t D) {
    oc_case c = {.ops = "rms_rope_pairs16 rmsnorm_fwd rope_pairs_fwd16 alloc upload download "
                        "fill release",
                 .p = {B, Ts, off, T, H, D}, .custom = rms_rope_row};
    snprintf(c.name, sizeof c.name,
             "rms_rope_pairs16 = rmsnorm_fwd then rope_pairs_fwd16 at the joint positions, bit "
             "for bit (B %lld, tokens [%lld, %lld) of %lld, H %lld, D %lld)", (long long)B,
             (long long)off, (long long)(off + Ts), (long long)T, (long long)H, (long long)D);
    oc_add(l, &c);
}

/* gelu_tanh_bwd_bias against gelu_tanh_bwd (written) then bias_bwd with its bf16 copy: dbias
 * (added to what it held) and dx16 the same bits, dout and x kept. p: rows, C. The same
 * arithmetic in the same order on the same values (the column sums in bias_bwd's order): bit
 * for bit on every backend. */
static int gelu_bias_row(tz_backend *be, const oc_case *c, char *msg, size_t len) {
    const int64_t rows = c->p[0], C = c->p[1], n = rows * C;
    float *h = malloc((size_t)(3 * n + 2 * C) * 4), *db0 = h + 2 * n, *back = db0 + C;
    uint16_t *a = malloc((size_t)(2 * n) * 2), *b = a + n;
    for (int64_t i = 0; i < 2 * n; i++) /* dout in [-1, 1), x in [-4, 4) */
        h[i] = (float)((i * 7919) % 2003 - 1001) / (i < n ? 1001.0f : 250.0f);
    for (int64_t j = 0; j < C; j++) db0[j] = 0.125f * (float)(j % 7) - 0.25f;
    float *dout = be->alloc(be, (size_t)n * 4), *x = be->alloc(be, (size_t)n * 4);
    float *dx = be->alloc(be, (size_t)n * 4), *d1 = be->alloc(be, (size_t)C * 4);
    float *d2 = be->alloc(be, (size_t)C * 4);
    uint16_t *x1 = be->alloc(be, (size_t)n * 2), *x2 = be->alloc(be, (size_t)n * 2);
    be->upload(be, dout, h, (size_t)n * 4), be->upload(be, x, h + n, (size_t)n * 4);
    be->upload(be, d1, db0, (size_t)C * 4), be->upload(be, d2, db0, (size_t)C * 4);
    be->gelu_tanh_bwd_bias(be, x1, d1, dout, x, rows, C, 0);
    be->gelu_tanh_bwd(be, dx, dout, x, n, 0, 0, 0);
    be->bias_bwd(be, d2, dx, rows, C, x2);
    be->download(be, a, x1, (size_t)n * 2), be->download(be, b, x2, (size_t)n * 2);
    int64_t diff = 0;
    for (int64_t i = 0; i < n; i++) diff += a[i] != b[i];
    float *g1 = back, *g2 = back + C;
    be->download(be, g1, d1, (size_t)C * 4), be->download(be, g2, d2, (size_t)C * 4);
    const int64_t ddiff = memcmp(g1, g2, (size_t)C * 4) != 0;
    float *kept = malloc((size_t)(2 * n) * 4);
    be->download(be, kept, dout, (size_t)n * 4), be->download(be, kept + n, x, (size_t)n * 4);
    const int changed = memcmp(kept, h, (size_t)(2 * n) * 4) != 0;
    be->release(be, dout), be->release(be, x), be->release(be, dx), be->release(be, d1);
    be->release(be, d2), be->release(be, x1), be->release(be, x2);
    free(h), free(a), free(kept);
    if (diff || ddiff || changed)
        snprintf(msg, len, "%lld of %lld dx elements differ, the bias gradient %s%s",
                 (long long)diff, (long long)n, ddiff ? "differs" : "the same",
                 changed ? "; dout or x was changed" : "");
    return diff || ddiff || changed;
}

static void add_gelu_bias(oc_list *l, int64_t rows, int64_t C) {
    oc_case c = {.ops = "gelu_tanh_bwd_bias gelu_tanh_bwd bias_bwd alloc upload download "
                        "release",
                 .p = {rows, C}, .custom = gelu_bias_row};
    snprintf(c.name, sizeof c.name,
             "gelu_tanh_bwd_bias = gelu_tanh_bwd then bias_bwd with dy in bf16, bit for bit, the "
             "bias gradient added to (%lld x %lld)", (long long)rows, (long long)C);
    oc_add(l, &c);
}

void oc_cases_dit(oc_list *l) {
    oc_case rp16 = {.ops = "rope_pairs_fwd16 rope_pairs_fwd to_bf16 alloc upload download release",
                    .p = {2, 37, 3, 18}, .custom = rope_pairs16_row};
    snprintf(rp16.name, sizeof rp16.name,
             "rope_pairs_fwd16 = rope_pairs_fwd then to_bf16, bit for bit, x kept (B 2 T 37 H 3 "
             "D 18)");
    oc_add(l, &rp16);
    add_rms_rope(l, 2, 5, 3, 11, 3, 18);  /* a stream in the middle of the joint rows */
    add_rms_rope(l, 1, 7, 0, 7, 2, 128);  /* all of them, a 128-wide head */
    add_rms_rope(l, 1, 3, 0, 9, 2, 300);  /* the first tokens; rows wider than a block */
    add_gelu_bias(l, 37, 129);
    add_gelu_bias(l, 300, 64); /* rows in more than one of the column sums' chunks */
    add_rope_pairs(l, 2, 7, 3, 16);
    add_rope_pairs(l, 1, 1, 1, 2);
    add_layernorm(l, 13, 37, 0.0f, 2.0f, 1e-6);
    add_layernorm(l, 3, 297, 0.0f, 0.05f, 1e-3); /* variance near eps */
    add_layernorm(l, 5, 37, 3.0f, 2.0f, 1e-6);   /* a large mean: the variance is not E x^2 - m^2 */
    for (int gate = 0; gate < 2; gate++) {
        add_modgate(l, gate, 2, 9, 37, 3 * 37 + 5, 41, 0, 0); /* slices of a wider matrix */
        add_modgate(l, gate, 2, 8, 16, 16, 0, 0, 0);          /* dense conditioning rows */
        /* each optional gradient NULL in turn */
        for (int in = gate ? MG_A : MG_X; in <= MG_B; in++)
            add_modgate(l, gate, 2, 9, 37, 40, 3, 1 << in, 0);
        /* out aliases x (modulate: x is overwritten, so no dscale) */
        add_modgate(l, gate, 3, 3, 37, 37, 0, gate ? 0 : 1 << MG_B, 1);
        add_modgate_w(l, gate, 2, 9, 37, 3 * 37 + 5, 41, 0, 0, 1); /* dx (dy) written */
        if (gate) add_modgate_w(l, gate, 2, 9, 37, 3 * 37 + 5, 41, 0, 0, 2); /* dy in bf16 */
        else add_modulate16(l, 2, 9, 37, 3 * 37 + 5, 41);
    }
    for (int silu = 0; silu < 2; silu++) {
        add_act(l, silu, 193, 4.0f, 0);
        add_act(l, silu, 95, 100.0f, 0); /* saturation, exp overflow */
        add_act(l, silu, 61, 4.0f, 1);
        add_act_w(l, silu, 77, 4.0f, 0, 1);
    }
    add_gelu_rows(l, 7, 37, 37 + 29, 0); /* out rows beside 29 other columns, dx added */
    add_gelu_rows(l, 5, 33, 40, 1);      /* dx written */
    add_gelu_rows(l, 4, 35, 50, 2);      /* dx written in bf16 */
    add_act_w(l, 0, 89, 4.0f, 0, 2);     /* GELU's dx written in bf16, dense */
    add_gelu16(l, 1, 301);
    add_gelu16(l, 7, 37);
    add_bias(l, 13, 37);
    add_bias(l, 130, 19);
    add_mse(l, 13, 37, 37);
    add_mse(l, 13, 24, 48); /* learned-sigma channels past n */
    for (int unpatch = 0; unpatch < 2; unpatch++)
        for (int cl = 0; cl < 2; cl++) {
            add_patch(l, 3, 5, 9, 15, 3, cl, unpatch);
            add_patch(l, 2, 2, 4, 6, 2, cl, unpatch);
            add_patch(l, 1, 3, 5, 7, 1, cl, unpatch);
        }
    add_copy2d(l, 13, 37, 37, 41, 0, 0);      /* dense to strided: the gaps stay */
    add_copy2d(l, 6, 37, 3 * 37, 37, 37, 0);  /* a slice of a wider matrix to dense */
    add_copy2d(l, 6, 5, 11, 8, 4, 2);         /* strided to strided */
}
