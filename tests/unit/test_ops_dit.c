/* The DiT ops of the CPU table against fp64 references written here: forwards against the
 * formulas, every backward against central differences of L = sum(out * R), accumulation
 * (a second call doubles), and bitwise equality at 1, 2 and 3 threads. No CUDA, no speed. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/registry.h"
#include "core/backend.h"
#include "core/rng.h"
#include "tz_check.h"

#include "tz_optest.h"

/* ---- layernorm ---- */

typedef struct {
    double *x, *R, *out, *mean, *rstd;
    int64_t rows, C;
    double eps;
} ln_ctx;

static double ln_loss(void *p) {
    ln_ctx *c = p;
    for (int64_t r = 0; r < c->rows; r++) {
        const double *x = c->x + r * c->C;
        double m = 0.0, v = 0.0;
        for (int64_t i = 0; i < c->C; i++) m += x[i];
        m /= (double)c->C;
        for (int64_t i = 0; i < c->C; i++) v += (x[i] - m) * (x[i] - m);
        double rs = 1.0 / sqrt(v / (double)c->C + c->eps);
        c->mean[r] = m, c->rstd[r] = rs;
        for (int64_t i = 0; i < c->C; i++) c->out[r * c->C + i] = (x[i] - m) * rs;
    }
    return dot_d(c->out, c->R, c->rows * c->C);
}

static void test_layernorm(void) {
    const int64_t rows = 5, C = 37, n = rows * C;
    float *x = frand(n, 2.0f), *R = frand(n, 1.0f), *out = fbuf(n), *mean = fbuf(rows);
    float *rstd = fbuf(rows), *dx = fbuf(n);
    for (int64_t i = 0; i < C; i++) x[i] += 3.0f; /* a row with a large mean */
    ln_ctx c = {todbl(x, n), todbl(R, n), dbuf(n), dbuf(rows), dbuf(rows), rows, C, 1e-6};
    ln_loss(&c);
    g_be->layernorm_fwd(g_be, out, mean, rstd, x, rows, C, 1e-6f);
    report("layernorm fwd out", relerr(out, c.out, n), 1e-6);
    report("layernorm fwd mean", relerr(mean, c.mean, rows), 1e-6);
    report("layernorm fwd rstd", relerr(rstd, c.rstd, rows), 1e-6);
    double *g = dbuf(n);
    fd_grad(ln_loss, &c, c.x, n, g);
    g_be->layernorm_bwd(g_be, dx, R, x, mean, rstd, rows, C);
    report("layernorm bwd dx", relerr(dx, g, n), 1e-5);
    float *dx1 = fcopy(dx, n);
    g_be->layernorm_bwd(g_be, dx, R, x, mean, rstd, rows, C);
    report("layernorm bwd accumulates dx", relerr_doubled(dx, dx1, n), 1e-6);
    free(x), free(R), free(out), free(mean), free(rstd), free(dx), free(dx1), free(g);
    free(c.x), free(c.R), free(c.out), free(c.mean), free(c.rstd);
}

/* ---- modulate and gate: conditioning rows are slices of a [B, 3C] matrix ---- */

typedef struct {
    double *x, *mod, *R, *out;
    int64_t B, T, C, ld;
    int gate; /* 0: modulate(x, mod[:, 0:C], mod[:, C:2C]); 1: x + mod[:, 2C:3C] * y(=x2) */
    double *y;
} mod_ctx;

static double mod_loss(void *p) {
    mod_ctx *c = p;
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t t = 0; t < c->T; t++)
            for (int64_t i = 0; i < c->C; i++) {
                int64_t k = (b * c->T + t) * c->C + i;
                const double *m = c->mod + b * c->ld;
                c->out[k] = c->gate ? c->x[k] + m[2 * c->C + i] * c->y[k]
                                    : c->x[k] * (1.0 + m[c->C + i]) + m[i];
            }
    return dot_d(c->out, c->R, c->B * c->T * c->C);
}

static void test_modulate_gate(int gate) {
    const int64_t B = 2, T = 5, C = 7, ld = 3 * C, n = B * T * C, nm = B * ld;
    float *x = frand(n, 1.5f), *y = frand(n, 1.5f), *mod = frand(nm, 1.0f), *R = frand(n, 1.0f);
    float *out = fbuf(n), *dx = fbuf(n), *dmod = fbuf(nm);
    mod_ctx c = {todbl(x, n), todbl(mod, nm), todbl(R, n), dbuf(n), B, T, C, ld, gate,
                 todbl(y, n)};
    mod_loss(&c);
    const char *nm_op = gate ? "gate" : "modulate";
    char name[96];
    if (gate) g_be->gate_fwd(g_be, out, x, y, mod + 2 * C, ld, B, T, C);
    else g_be->modulate_fwd(g_be, out, x, mod, mod + C, ld, B, T, C);
    snprintf(name, sizeof name, "%s fwd (strided conditioning rows)", nm_op);
    report(name, relerr(out, c.out, n), 1e-6);
    double *gx = dbuf(n), *gm = dbuf(nm);
    fd_grad(mod_loss, &c, gate ? c.y : c.x, n, gx);
    fd_grad(mod_loss, &c, c.mod, nm, gm);
    if (gate) g_be->gate_bwd(g_be, dx, dmod + 2 * C, R, y, mod + 2 * C, ld, B, T, C);
    else g_be->modulate_bwd(g_be, dx, dmod, dmod + C, R, x, mod + C, ld, B, T, C);
    snprintf(name, sizeof name, "%s bwd %s", nm_op, gate ? "dy" : "dx");
    report(name, relerr(dx, gx, n), 1e-5);
    snprintf(name, sizeof name, "%s bwd %s (other columns stay 0)", nm_op,
             gate ? "dgate" : "dshift dscale");
    report(name, relerr(dmod, gm, nm), 1e-5);
    float *dx1 = fcopy(dx, n), *dm1 = fcopy(dmod, nm);
    if (gate) g_be->gate_bwd(g_be, dx, dmod + 2 * C, R, y, mod + 2 * C, ld, B, T, C);
    else g_be->modulate_bwd(g_be, dx, dmod, dmod + C, R, x, mod + C, ld, B, T, C);
    double e = relerr_doubled(dx, dx1, n), e2 = relerr_doubled(dmod, dm1, nm);
    snprintf(name, sizeof name, "%s bwd accumulates", nm_op);
    report(name, e > e2 ? e : e2, 1e-6);
    /* NULL input gradient: the conditioning gradients alone, the same bits */
    float *dm2 = fbuf(nm);
    if (gate) g_be->gate_bwd(g_be, NULL, dm2 + 2 * C, R, y, mod + 2 * C, ld, B, T, C);
    else g_be->modulate_bwd(g_be, NULL, dm2, dm2 + C, R, x, mod + C, ld, B, T, C);
    snprintf(name, sizeof name, "%s bwd with NULL input gradient (bitwise)", nm_op);
    report(name, memcmp(dm2, dm1, (size_t)nm * sizeof(float)) ? 1.0 : 0.0, 0.0);
    free(x), free(y), free(mod), free(R), free(out), free(dx), free(dmod), free(gx), free(gm);
    free(dx1), free(dm1), free(dm2), free(c.x), free(c.mod), free(c.R), free(c.out), free(c.y);
}

/* ---- activations ---- */

typedef struct {
    double *x, *R;
    int64_t n;
    int silu;
} act_ctx;

static double act_ref(double x, int silu) {
    if (silu) return x / (1.0 + exp(-x));
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

static double act_loss(void *p) {
    act_ctx *c = p;
    double s = 0.0;
    for (int64_t i = 0; i < c->n; i++) s += act_ref(c->x[i], c->silu) * c->R[i];
    return s;
}

static void test_activation(int silu) {
    const int64_t n = 61;
    float *x = frand(n, 5.0f), *R = frand(n, 1.0f), *out = fbuf(n), *dx = fbuf(n);
    x[0] = 0.0f, x[1] = 1e-4f, x[2] = -30.0f, x[3] = 30.0f, x[4] = -100.0f;
    act_ctx c = {todbl(x, n), todbl(R, n), n, silu};
    double *ref = dbuf(n), *g = dbuf(n);
    for (int64_t i = 0; i < n; i++) ref[i] = act_ref(c.x[i], silu);
    const char *nm = silu ? "silu" : "gelu_tanh";
    char name[96];
    if (silu) g_be->silu_fwd(g_be, out, x, n);
    else g_be->gelu_tanh_fwd(g_be, out, x, n);
    snprintf(name, sizeof name, "%s fwd (incl. 0, +-30, -100)", nm);
    report(name, relerr(out, ref, n), 1e-6);
    fd_grad(act_loss, &c, c.x, n, g);
    if (silu) g_be->silu_bwd(g_be, dx, R, x, n);
    else g_be->gelu_tanh_bwd(g_be, dx, R, x, n);
    snprintf(name, sizeof name, "%s bwd dx", nm);
    report(name, relerr(dx, g, n), 1e-5);
    float *dx1 = fcopy(dx, n);
    if (silu) g_be->silu_bwd(g_be, dx, R, x, n);
    else g_be->gelu_tanh_bwd(g_be, dx, R, x, n);
    snprintf(name, sizeof name, "%s bwd accumulates", nm);
    report(name, relerr_doubled(dx, dx1, n), 1e-6);
    float *inpl = fcopy(x, n);
    if (silu) g_be->silu_fwd(g_be, inpl, inpl, n);
    else g_be->gelu_tanh_fwd(g_be, inpl, inpl, n);
    snprintf(name, sizeof name, "%s fwd in place (bitwise)", nm);
    report(name, memcmp(inpl, out, (size_t)n * sizeof(float)) ? 1.0 : 0.0, 0.0);
    free(x), free(R), free(out), free(dx), free(dx1), free(ref), free(g), free(inpl);
    free(c.x), free(c.R);
}

/* ---- bias and squared error ---- */

typedef struct {
    double *a, *b, *R;
    int64_t rows, n, ld;
    double dloss;
} pair_ctx;

static double bias_loss(void *p) { /* sum_r,c (y + bias) * R: a = bias (y is constant) */
    pair_ctx *c = p;
    double s = 0.0;
    for (int64_t r = 0; r < c->rows; r++)
        for (int64_t i = 0; i < c->n; i++) s += c->a[i] * c->R[r * c->n + i];
    return s;
}

static double mse_loss(void *p) { /* dloss * sum (pred[r*ld+i] - target)^2, a = pred */
    pair_ctx *c = p;
    double s = 0.0;
    for (int64_t r = 0; r < c->rows; r++)
        for (int64_t i = 0; i < c->n; i++) {
            double d = c->a[r * c->ld + i] - c->b[r * c->n + i];
            s += d * d;
        }
    return c->dloss * s;
}

static void test_bias_mse(void) {
    const int64_t rows = 9, C = 70; /* two column blocks */
    float *y = frand(rows * C, 1.0f), *bias = frand(C, 1.0f), *R = frand(rows * C, 1.0f);
    double *yref = todbl(y, rows * C);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < C; i++) yref[r * C + i] += bias[i];
    g_be->bias_add_fwd(g_be, y, bias, rows, C);
    report("bias_add fwd", relerr(y, yref, rows * C), 1e-7);
    pair_ctx c = {todbl(bias, C), NULL, todbl(R, rows * C), rows, C, C, 1.0};
    double *g = dbuf(C);
    fd_grad(bias_loss, &c, c.a, C, g);
    float *db = fbuf(C);
    g_be->bias_bwd(g_be, db, R, rows, C);
    report("bias bwd dbias", relerr(db, g, C), 1e-6);
    float *db1 = fcopy(db, C);
    g_be->bias_bwd(g_be, db, R, rows, C);
    report("bias bwd accumulates", relerr_doubled(db, db1, C), 1e-7);
    free(y), free(bias), free(R), free(yref), free(g), free(db), free(db1), free(c.a), free(c.R);

    const int64_t mr = 3, n = 10, ld = 13; /* pred rows longer than the target rows */
    float *pred = frand(mr * ld, 1.0f), *tgt = frand(mr * n, 1.0f), *sse = fbuf(mr);
    pair_ctx m = {todbl(pred, mr * ld), todbl(tgt, mr * n), NULL, mr, n, ld, 0.3};
    double ref[3];
    for (int64_t r = 0; r < mr; r++) {
        pair_ctx one = m;
        one.rows = 1, one.a = m.a + r * ld, one.b = m.b + r * n, one.dloss = 1.0;
        ref[r] = mse_loss(&one);
    }
    g_be->mse_fwd(g_be, sse, pred, ld, tgt, mr, n);
    report("mse fwd per-row sums (strided pred)", relerr(sse, ref, mr), 1e-7);
    double *gp = dbuf(mr * ld);
    fd_grad(mse_loss, &m, m.a, mr * ld, gp);
    float *dp = fbuf(mr * ld);
    g_be->mse_bwd(g_be, dp, pred, ld, tgt, 0.3f, mr, n);
    report("mse bwd dpred (extra columns stay 0)", relerr(dp, gp, mr * ld), 1e-5);
    float *dp1 = fcopy(dp, mr * ld);
    g_be->mse_bwd(g_be, dp, pred, ld, tgt, 0.3f, mr, n);
    report("mse bwd accumulates", relerr_doubled(dp, dp1, mr * ld), 1e-7);
    free(pred), free(tgt), free(sse), free(gp), free(dp), free(dp1), free(m.a), free(m.b);
}

/* ---- patches and copies ---- */

static void test_patches(void) {
    const int64_t B = 2, C = 3, H = 6, W = 4, p = 2, gw = W / p, T = (H / p) * gw, P = C * p * p;
    const int64_t n = B * C * H * W;
    float *img = frand(n, 1.0f), *tok = fbuf(n), *back = fbuf(n), *R = frand(n, 1.0f);
    for (int cl = 0; cl < 2; cl++) {
        g_be->patchify(g_be, tok, img, B, C, H, W, p, cl);
        double bad = 0.0; /* element by element against the definition */
        for (int64_t b = 0; b < B; b++)
            for (int64_t c = 0; c < C; c++)
                for (int64_t y = 0; y < H; y++)
                    for (int64_t x = 0; x < W; x++) {
                        int64_t t = (y / p) * gw + x / p, i = y % p, j = x % p;
                        int64_t k = cl ? (i * p + j) * C + c : (c * p + i) * p + j;
                        bad += tok[(b * T + t) * P + k] != img[((b * C + c) * H + y) * W + x];
                    }
        char name[96];
        snprintf(name, sizeof name, "patchify chan_last=%d matches the definition", cl);
        report(name, bad, 0.0);
        g_be->unpatchify(g_be, back, tok, B, C, H, W, p, cl);
        snprintf(name, sizeof name, "unpatchify(patchify(x)) == x, chan_last=%d", cl);
        report(name, memcmp(back, img, (size_t)n * sizeof(float)) ? 1.0 : 0.0, 0.0);
        /* adjoint: <patchify(x), R> = <x, unpatchify(R)>, so unpatchify is the backward */
        g_be->unpatchify(g_be, back, R, B, C, H, W, p, cl);
        double l = 0.0, r = 0.0;
        for (int64_t i = 0; i < n; i++) l += (double)tok[i] * R[i], r += (double)img[i] * back[i];
        snprintf(name, sizeof name, "unpatchify is the transpose of patchify, chan_last=%d", cl);
        report(name, fabs(l - r) / fabs(l), 1e-12);
    }
    float src[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, dst[8] = {0};
    g_be->copy2d(g_be, dst, 4, src + 1, 6, 2, 3); /* 2 rows of 3 from stride 6 to stride 4 */
    float want[8] = {1, 2, 3, 0, 7, 8, 9, 0};
    report("copy2d strided rows", memcmp(dst, want, sizeof dst) ? 1.0 : 0.0, 0.0);
    free(img), free(tok), free(back), free(R);
}

/* ---- results do not depend on the thread count ---- */

enum { DB = 4, DT = 256, DC = 96 }; /* above every op's parallel threshold */

static float *det_run(const float *x, const float *mod, const float *R, int64_t *len) {
    const int64_t n = (int64_t)DB * DT * DC, ld = 3 * DC, nm = DB * ld, rows = DB * DT;
    int64_t total = 12 * n + 3 * rows + 2 * nm + DC;
    float *o = fbuf(total), *p = o;
    tz_backend *be = g_be;
    be->layernorm_fwd(be, p, p + n, p + n + rows, x, rows, DC, 1e-6f);
    be->layernorm_bwd(be, p + n + 2 * rows, R, x, p + n, p + n + rows, rows, DC);
    p += 2 * n + 2 * rows;
    be->modulate_fwd(be, p, x, mod, mod + DC, ld, DB, DT, DC);
    be->modulate_bwd(be, p + n, p + 2 * n, p + 2 * n + DC, R, x, mod + DC, ld, DB, DT, DC);
    p += 2 * n + nm;
    be->gate_fwd(be, p, x, R, mod + 2 * DC, ld, DB, DT, DC);
    be->gate_bwd(be, p + n, p + 2 * n + 2 * DC, R, x, mod + 2 * DC, ld, DB, DT, DC);
    p += 2 * n + nm;
    be->gelu_tanh_fwd(be, p, x, n);
    be->gelu_tanh_bwd(be, p + n, R, x, n);
    be->silu_fwd(be, p + 2 * n, x, n);
    be->silu_bwd(be, p + 3 * n, R, x, n);
    p += 4 * n;
    be->bias_bwd(be, p, R, rows, DC);
    p += DC;
    be->mse_fwd(be, p, x, DC, R, rows, DC);
    be->mse_bwd(be, p + rows, x, DC, R, 0.5f, rows, DC);
    p += rows + n;
    be->patchify(be, p, x, DB, 6, 64, 64, 4, 1);
    p += n;
    *len = (int64_t)(p - o);
    return o;
}

static void test_threads(void) {
    const int64_t n = (int64_t)DB * DT * DC;
    float *x = frand(n, 3.0f), *mod = frand((int64_t)DB * 3 * DC, 1.0f), *R = frand(n, 1.0f);
    int64_t len;
    omp_set_num_threads(1);
    float *ref = det_run(x, mod, R, &len);
    for (int th = 2; th <= 3; th++) {
        omp_set_num_threads(th);
        float *got = det_run(x, mod, R, &len);
        char name[96];
        snprintf(name, sizeof name, "DiT ops bitwise equal, 1 vs %d threads", th);
        report(name, memcmp(got, ref, (size_t)len * sizeof(float)) ? 1.0 : 0.0, 0.0);
        free(got);
    }
    free(ref), free(x), free(mod), free(R);
}

int main(void) {
    tz_optest_kernel();
    g_rng = tz_rng_make(4321, 0, TZ_RNG_TEST, 0);
    g_be = tz_cpu_backend_create(0);
    double t0 = omp_get_wtime();
    test_layernorm();
    test_modulate_gate(0);
    test_modulate_gate(1);
    test_activation(0);
    test_activation(1);
    test_bias_mse();
    test_patches();
    test_threads();
    tz_cpu_backend_destroy(g_be);
    printf("(%.1f s)\n", omp_get_wtime() - t0);
    return tz_check_done("ops_dit");
}
