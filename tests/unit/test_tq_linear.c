/* The quantized-weight ops and the `tq` linear layer: the CPU ops against src/quant (bit for
 * bit, any thread count); the layer's forward against a dense layer on the dequantized weight,
 * its input and LoRA gradients against that layer and against central differences of its own
 * forward, for TurboQuant and absmax at 2-4 bits; the straight-through weight gradient of
 * full fine-tuning against the dense layer on W_hat, its central differences, and the same
 * gradient taken in the rotated basis. Model-level memory checks: test_tq_model. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/registry.h"
#include "core/backend.h"
#include "core/rng.h"
#include "model/linear.h"
#include "model/params.h"
#include "quant/codebook.h"
#include "quant/fwht.h"
#include "quant/turboquant.h"
#include "tz_check.h"

static tz_backend *g_be;
static tz_rng g_rng;
static tz_tq_codebook g_cb[TZ_TQ_MAX_BITS + 1];

static float *frand(int64_t n, float amp) {
    float *x = malloc((size_t)n * sizeof *x);
    for (int64_t i = 0; i < n; i++) x[i] = amp * (2.0f * tz_rng_uniform(&g_rng) - 1.0f);
    return x;
}

static float *fnormal(int64_t n, double std) {
    float *x = malloc((size_t)n * sizeof *x);
    for (int64_t i = 0; i < n; i++) x[i] = (float)(std * tz_rng_normal(&g_rng));
    return x;
}

/* max |a - b| / max |b| */
static double maxrel(const float *a, const float *b, int64_t n) {
    double e = 0.0, s = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= e)) e = d;
        if (fabs((double)b[i]) > s) s = fabs((double)b[i]);
    }
    return e / (s > 0 ? s : 1e-30);
}

static float *copy_of(const float *x, int64_t n) {
    float *y = malloc((size_t)n * sizeof *y);
    memcpy(y, x, (size_t)n * sizeof *y);
    return y;
}

/* ---- ops against src/quant ---- */

static void test_ops(void) {
    const int64_t rows = 37, cols = 768;
    tz_backend *be1 = tz_cpu_backend_create(1), *be3 = tz_cpu_backend_create(3);
    for (int gi = 0; gi < 3; gi++) {
        const int g = 64 << gi;
        const uint64_t seed = 11 + (uint64_t)g;
        float *x = frand(rows * cols, 1.0f), *y = malloc((size_t)(rows * cols) * sizeof *y);
        float *ref = malloc((size_t)(rows * cols) * sizeof *ref);
        tz_tq_rotate(ref, x, rows, cols, g, seed);
        g_be->tq_rotate(g_be, y, x, rows, cols, g, seed);
        check(!memcmp(y, ref, (size_t)(rows * cols) * sizeof *y),
              "tq_rotate g=%d equals tz_tq_rotate bit for bit", g);
        float *inplace = copy_of(x, rows * cols);
        be3->tq_rotate(be3, inplace, inplace, rows, cols, g, seed);
        check(!memcmp(inplace, ref, (size_t)(rows * cols) * sizeof *y),
              "tq_rotate g=%d in place, 3 threads: same bits", g);
        /* backward accumulates the inverse rotation */
        float *dx0 = frand(rows * cols, 0.5f), *dx = copy_of(dx0, rows * cols);
        tz_tq_rotate_inv(ref, x, rows, cols, g, seed);
        for (int64_t i = 0; i < rows * cols; i++) ref[i] += dx0[i];
        g_be->tq_rotate_bwd(g_be, dx, x, rows, cols, g, seed, 1);
        check(!memcmp(dx, ref, (size_t)(rows * cols) * sizeof *dx),
              "tq_rotate_bwd g=%d: dx += tz_tq_rotate_inv(dy), bit for bit", g);
        memcpy(dx, dx0, (size_t)(rows * cols) * sizeof *dx);
        be1->tq_rotate_bwd(be1, dx, x, rows, cols, g, seed, 1);
        check(!memcmp(dx, ref, (size_t)(rows * cols) * sizeof *dx),
              "tq_rotate_bwd g=%d, 1 thread: same bits", g);
        /* rotate then its inverse is the identity to rounding */
        memset(dx, 0, (size_t)(rows * cols) * sizeof *dx);
        g_be->tq_rotate(g_be, y, x, rows, cols, g, seed);
        g_be->tq_rotate_bwd(g_be, dx, y, rows, cols, g, seed, 1);
        check(maxrel(dx, x, rows * cols) < 1e-6, "tq_rotate_bwd(tq_rotate(x)) = x, g=%d (%.1e)",
              g, maxrel(dx, x, rows * cols));
        free(x), free(y), free(ref), free(inplace), free(dx0), free(dx);

        for (int bits = 2; bits <= 4; bits++) {
            float *w = fnormal(rows * cols, 1.0), *got = malloc((size_t)(rows * cols) * 4);
            float *want = malloc((size_t)(rows * cols) * 4), levels[16];
            char err[200];
            for (int method = TZ_TQ_TURBOQUANT; method <= TZ_TQ_ABSMAX; method++) {
                tz_tq_tensor t;
                tz_tq_tensor_init(&t, bits, g, rows, cols, seed, err, sizeof err);
                tz_tq_quantize_as(&t, method, &g_cb[bits], w);
                tz_tq_levels(method, bits, &g_cb[bits], levels);
                if (method == TZ_TQ_TURBOQUANT) tz_tq_dequantize_rotated(&t, &g_cb[bits], want);
                else tz_tq_absmax_dequantize(&t, want);
                tz_backend *be = bits == 3 ? be3 : g_be;
                be->tq_dequant(be, got, t.codes, t.scales, levels, rows, cols, bits, g);
                check(!memcmp(got, want, (size_t)(rows * cols) * sizeof *got),
                      "tq_dequant %s b=%d g=%d equals src/quant's %s, bit for bit",
                      tz_tq_method_name(method), bits, g,
                      method == TZ_TQ_TURBOQUANT ? "rotated basis" : "dequantize");
                tz_tq_tensor_free(&t);
            }
            free(w), free(got), free(want);
        }
    }
    tz_cpu_backend_destroy(be1);
    tz_cpu_backend_destroy(be3);
}

/* ---- the layer ---- */

typedef struct lcase {
    int method, bits, group;
    int64_t in, out, n, r;
} lcase;

/* sum(r .* y) in double, y = l(x) */
static double layer_loss(const tz_linear *l, const float *x, const float *r, float *y, float *h,
                         int64_t n) {
    tz_linear_fwd(g_be, l, y, h, x, n);
    double s = 0.0;
    for (int64_t i = 0; i < n * l->out; i++) s += (double)r[i] * (double)y[i];
    return s;
}

static tz_param *lora_param(tz_params *ps, const char *name, int64_t d0, int64_t d1,
                            const float *vals) {
    tz_param *p = tz_params_add(ps, g_be, name, 2, d0, d1, 1, 1, 1);
    memcpy(p->w, vals, (size_t)p->numel * sizeof(float));
    p->g = g_be->alloc(g_be, (size_t)p->numel * sizeof(float));
    return p;
}

static void test_layer(const lcase *c) {
    const int64_t in = c->in, out = c->out, n = c->n, r = c->r;
    char err[200], what[96];
    snprintf(what, sizeof what, "%s b=%d g=%d %lldx%lld n=%lld", tz_tq_method_name(c->method),
             c->bits, c->group, (long long)out, (long long)in, (long long)n);
    float levels[16];
    tz_tq_levels(c->method, c->bits, &g_cb[c->bits], levels);
    float *w = fnormal(out * in, 0.05), *w_hat = malloc((size_t)(out * in) * sizeof(float));
    tz_tq_tensor t;
    tz_tq_tensor_init(&t, c->bits, c->group, out, in, 77, err, sizeof err);
    tz_tq_quantize_as(&t, c->method, &g_cb[c->bits], w);
    tz_tq_dequantize_as(&t, c->method, &g_cb[c->bits], w_hat);

    tz_params ps;
    tz_params_init(&ps);
    tz_param *pq = tz_params_add_quant(&ps, g_be, "wq", out, in, c->method, c->bits, c->group,
                                       77, levels);
    g_be->upload(g_be, pq->q->codes, t.codes, (size_t)tz_tq_codes_bytes(out, in, c->bits));
    g_be->upload(g_be, pq->q->scales, t.scales, (size_t)tz_tq_scales_count(out, in, c->group) * 2);
    tz_param *pd = tz_params_add(&ps, g_be, "wd", 2, out, in, 0, 1, 0);
    memcpy(pd->w, w_hat, (size_t)(out * in) * sizeof(float));
    float *av = frand(r * in, 0.2f), *bv = frand(out * r, 0.2f);
    tz_tq_scratch s = {g_be->alloc(g_be, (size_t)(out * in) * 4), out * in,
                       g_be->alloc(g_be, (size_t)(n * in) * 4), n * in};
    tz_linear lq = {.in = in, .out = out, .w = pq, .r = r, .scale = 0.75f, .tq = &s};
    tz_linear ld = {.in = in, .out = out, .w = pd, .r = r, .scale = 0.75f};
    if (r) {
        lq.a = lora_param(&ps, "aq", r, in, av), lq.b = lora_param(&ps, "bq", out, r, bv);
        ld.a = lora_param(&ps, "ad", r, in, av), ld.b = lora_param(&ps, "bd", out, r, bv);
    }
    float *x = frand(n * in, 1.0f), *dy = frand(n * out, 1.0f);
    float *yq = malloc((size_t)(n * out) * 4), *yd = malloc((size_t)(n * out) * 4);
    float *hq = malloc((size_t)(n * (r ? r : 1)) * 4), *hd = malloc((size_t)(n * (r ? r : 1)) * 4);
    float *scr = malloc((size_t)(n * (r ? r : 1)) * 4);
    tz_linear_fwd(g_be, &lq, yq, hq, x, n);
    tz_linear_fwd(g_be, &ld, yd, hd, x, n);
    double e = maxrel(yq, yd, n * out);
    check(e < 1e-5, "%s: forward = dense layer on the dequantized weight (rel %.1e)", what, e);

    /* full fine-tuning: both weights trainable, the quantized one straight-through */
    pq->g = g_be->alloc(g_be, (size_t)(out * in) * sizeof(float));
    pd->g = g_be->alloc(g_be, (size_t)(out * in) * sizeof(float));
    /* backward on a nonzero dx: both accumulate */
    float *dx0 = frand(n * in, 0.3f), *dxq = copy_of(dx0, n * in), *dxd = copy_of(dx0, n * in);
    tz_linear_bwd(g_be, &lq, dxq, dy, x, hq, scr, n);
    tz_linear_bwd(g_be, &ld, dxd, dy, x, hd, scr, n);
    e = maxrel(dxq, dxd, n * in);
    check(e < 1e-5, "%s: dx += dy W_hat (+ LoRA) = the dense layer's (rel %.1e)", what, e);
    if (r) {
        double ea = maxrel(lq.a->g, ld.a->g, r * in), eb = maxrel(lq.b->g, ld.b->g, out * r);
        check(ea < 1e-5 && eb < 1e-5, "%s: LoRA dA, dB = the dense layer's (rel %.1e, %.1e)",
              what, ea, eb);
    }
    e = maxrel(pq->g, pd->g, out * in);
    check(e < 1e-6, "%s: straight-through dW = the dense layer's dW on W_hat (rel %.1e)", what, e);
    /* where the rotation goes: the same gradient taken in the rotated basis, dW_rot = dy^T
     * x_rot, and brought back per group with R_j^T, is the plain-basis gradient */
    if (c->method == TZ_TQ_TURBOQUANT) {
        float *xr = malloc((size_t)(n * in) * 4), *gr = calloc((size_t)(out * in), 4);
        float *gp = malloc((size_t)(out * in) * 4);
        tz_tq_rotate(xr, x, n, in, c->group, 77);
        g_be->matmul(g_be, gr, dy, xr, out, in, n, 1, 0, 1.0f, 0.0f);
        tz_tq_rotate_inv(gp, gr, out, in, c->group, 77);
        e = maxrel(gp, pq->g, out * in);
        check(e < 1e-5, "%s: R^T (dy^T x_rot) = dy^T x, the master's basis (rel %.1e)", what, e);
        free(xr), free(gr), free(gp);
    }
    /* dW against central differences of the dense layer on the decoded weight (the
     * quantized layer's own loss is piecewise constant in the master: hence straight-through) */
    {
        double sc = 0.0, bad = 0.0;
        for (int64_t i = 0; i < out * in; i++) sc = fmax(sc, fabs((double)pq->g[i]));
        const float hw = 0.01f;
        for (int k = 0; k < 24; k++) {
            int64_t i = (int64_t)tz_rng_below(&g_rng, (uint64_t)(out * in));
            float w0 = pd->w[i];
            pd->w[i] = w0 + hw;
            double lp = layer_loss(&ld, x, dy, yd, hd, n);
            pd->w[i] = w0 - hw;
            double lm = layer_loss(&ld, x, dy, yd, hd, n);
            pd->w[i] = w0;
            bad = fmax(bad, fabs((lp - lm) / (2.0 * (double)hw) - (double)pq->g[i]) / sc);
        }
        check(bad < 1e-3, "%s: straight-through dW = central differences in W_hat (rel %.1e)",
              what, bad);
    }
    /* dx against central differences of the quantized layer's own forward */
    float *dx = calloc((size_t)(n * in), sizeof *dx);
    g_be->fill(g_be, pq->g, 0.0f, out * in);
    tz_linear_bwd(g_be, &lq, dx, dy, x, hq, scr, n);
    double worst = 0.0, scale = 0.0;
    for (int64_t i = 0; i < n * in; i++) scale = fmax(scale, fabs((double)dx[i]));
    const float hstep = 0.05f;
    for (int k = 0; k < 24; k++) {
        int64_t i = (int64_t)tz_rng_below(&g_rng, (uint64_t)(n * in));
        float x0 = x[i];
        x[i] = x0 + hstep;
        double lp = layer_loss(&lq, x, dy, yq, hq, n);
        x[i] = x0 - hstep;
        double lm = layer_loss(&lq, x, dy, yq, hq, n);
        x[i] = x0;
        double fd = (lp - lm) / (2.0 * (double)hstep);
        worst = fmax(worst, fabs(fd - (double)dx[i]) / scale);
    }
    check(worst < 1e-3, "%s: dx = central differences of its forward (rel %.1e)", what, worst);

    free(w), free(w_hat), free(av), free(bv), free(x), free(dy), free(yq), free(yd);
    free(hq), free(hd), free(scr), free(dx0), free(dxq), free(dxd), free(dx);
    for (int i = 0; i < ps.n; i++)
        if (ps.p[i]->g) g_be->release(g_be, ps.p[i]->g);
    g_be->release(g_be, s.tile);
    g_be->release(g_be, s.act);
    tz_params_free(&ps, g_be);
    tz_tq_tensor_free(&t);
}

int main(void) {
    char err[200];
    g_be = tz_cpu_backend_create(2);
    g_rng = tz_rng_make(2026, 0, TZ_RNG_TEST, 0);
    for (int b = 1; b <= TZ_TQ_MAX_BITS; b++) tz_tq_codebook_init(&g_cb[b], b, err, sizeof err);
    test_ops();
    static const lcase cases[] = {
        {TZ_TQ_TURBOQUANT, 4, 64, 192, 80, 37, 4},   {TZ_TQ_TURBOQUANT, 3, 128, 256, 48, 29, 0},
        {TZ_TQ_TURBOQUANT, 2, 256, 512, 33, 17, 3},  {TZ_TQ_TURBOQUANT, 4, 128, 384, 130, 64, 8},
        {TZ_TQ_ABSMAX, 4, 64, 192, 80, 37, 4},       {TZ_TQ_ABSMAX, 2, 128, 256, 48, 29, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) test_layer(&cases[i]);
    tz_cpu_backend_destroy(g_be);
    return tz_check_done("tq_linear");
}
