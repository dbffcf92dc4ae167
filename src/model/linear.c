/* Linear layer with optional LoRA as matmuls on the backend; a quantized weight is decoded
 * into the model's one scratch tile right before each GEMM that needs it (the backend's
 * tq_matmul), never kept. */
#include "model/linear.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "quant/turboquant.h"

void tz_matmul_w(tz_backend *be, float *C, const float *A, const tz_param *W, int64_t M,
                 int64_t N, int64_t K, int transW, float alpha, float beta) {
    if (W->w16)
        be->matmul_bw16(be, C, A, (const uint16_t *)(const void *)W->w, M, N, K, 0, transW,
                        alpha, beta);
    else be->matmul(be, C, A, W->w, M, N, K, 0, transW, alpha, beta);
}

void tz_linear_add_lora(tz_linear *l, tz_params *ps, tz_backend *be, const char *module,
                        int64_t r, double alpha, int stage) {
    char name[TZ_NAME_MAX];
    if (r > (l->in < l->out ? l->in : l->out))
        TZ_FATAL_HINT("lower lora.rank (or use an adapter of a smaller r)",
                      "LoRA rank %lld exceeds the smaller dimension of %s.weight (%lld x %lld): "
                      "B A would have more parameters than the update can use",
                      (long long)r, module, (long long)l->out, (long long)l->in);
    l->r = r;
    l->scale = (float)(alpha / (double)r);
    snprintf(name, sizeof name, "base_model.model.%s.lora_A.weight", module);
    l->a = tz_params_add(ps, be, name, 2, r, l->in, 1, 1, 1);
    l->a->stage = stage;
    snprintf(name, sizeof name, "base_model.model.%s.lora_B.weight", module);
    l->b = tz_params_add(ps, be, name, 2, l->out, r, 1, 1, 1);
    l->b->stage = stage;
}

void tz_embedding_w(tz_backend *be, float *out, const int32_t *tok, const tz_param *W,
                    int64_t n, int64_t C) {
    if (W->w16) be->embedding_fwd_w16(be, out, tok, (const uint16_t *)(const void *)W->w, n, C);
    else be->embedding_fwd(be, out, tok, W->w, n, C);
}

/* y = alpha * x op(W) + beta * y with l's quantized weight decoded into the shared tile on
 * the way (W_rot for TurboQuant, W_hat for absmax): transW 1, y[n, out] = x[n, in] W^T;
 * transW 0, y[n, in] = x[n, out] W. */
static void qmatmul16(tz_backend *be, const tz_linear *l, float *y, const void *x, int x16,
                      int64_t n, int transW, float beta) {
    const tz_qweight *q = l->w->q;
    if (!q->codes) TZ_FATAL("%s: a streamed weight used while its block is not loaded", l->w->name);
    const int64_t need = tz_tq_tile_elems(be, l->out, l->in, l->in, q->group);
    if (!l->tq || !l->tq->tile || need > l->tq->tile_elems)
        TZ_FATAL("%s: no scratch tile of %lld elements for the quantized weight", l->w->name,
                 (long long)need);
    be->tq_matmul(be, y, x, x16, l->tq->tile, q->codes, q->scales, q->levels, l->out, l->in,
                  q->bits, q->group, n, transW, 1.0f, beta);
}
static void qmatmul(tz_backend *be, const tz_linear *l, float *y, const float *x, int64_t n,
                    int transW, float beta) {
    qmatmul16(be, l, y, x, 0, n, transW, beta);
}

/* The activation scratch for n rows of `in` (TurboQuant layers only). */
static float *act_buffer(const tz_linear *l, int64_t n) {
    if (!l->tq->act || n * l->in > l->tq->act_floats)
        TZ_FATAL("%s: no activation scratch of %lld floats for the rotation", l->w->name,
                 (long long)(n * l->in));
    return l->tq->act;
}

/* GEMM with operands fp32 or, where flagged, bf16 bit patterns (an input rounded once for
 * several GEMMs). */
static void mm16(tz_backend *be, float *C, const void *A, int a16, const void *B, int b16,
                 int64_t M, int64_t N, int64_t K, int transA, int transB, float alpha,
                 float beta) {
    if (a16 || b16) be->matmul16(be, C, A, a16, B, b16, M, N, K, transA, transB, alpha, beta);
    else be->matmul(be, C, (const float *)A, (const float *)B, M, N, K, transA, transB, alpha, beta);
}

/* LoRA's forward: y += s (x A^T) B^T, h = x A^T kept. */
static void lora_fwd(tz_backend *be, const tz_linear *l, float *y, float *h, const void *x,
                     int x16, int64_t n) {
    if (!l->a) return;
    mm16(be, h, x, x16, l->a->w, 0, n, l->r, l->in, 0, 1, 1.0f, 0.0f);    /* h = x A^T */
    be->matmul(be, y, h, l->b->w, n, l->out, l->r, 0, 1, l->scale, 1.0f); /* y += s h B^T */
}
/* LoRA's forward and the bias: y += s (x A^T) B^T, h = x A^T kept; y += bias. */
static void lora_bias_fwd(tz_backend *be, const tz_linear *l, float *y, float *h, const void *x,
                          int x16, int64_t n) {
    lora_fwd(be, l, y, h, x, x16, n);
    if (l->bias) be->bias_add_fwd(be, y, l->bias->w, n, l->out);
}

/* Whether be's GEMMs round fp32 operands to bf16: its operand type is bf16 and it has bf16
 * GEMMs (a backend told bf16 without them, as a test may tell the CPU, computes in fp32:
 * rounding its input here would change its results). */
int tz_linear_rounds_bf16(const tz_backend *be) {
    return be->matmul_dtype == TZ_DT_BF16 && ((be->matmul_dtypes >> TZ_DT_BF16) & 1u);
}

static int sharing_on(void);
static int stacking_on(void);

static tz_linear_probe g_probe;
static void *g_probe_ctx;

void tz_linear_set_probe(tz_linear_probe fn, void *ctx) {
    g_probe = fn;
    g_probe_ctx = ctx;
}

int tz_linear_probing(void) { return g_probe != NULL; }

/* Floats, rounded up to 64 bytes, of n fp32 or of n bf16 values. */
static int64_t al16(int64_t n) { return (n + 15) & ~(int64_t)15; }
static int64_t half16(int64_t n) { return al16((n + 1) / 2); }

/* ---- LoRA and the bias folded into the base GEMM along K (tq_matmul_lora) ---- */

/* The row stride of [x_rot | h | 1] and [W_rot | s B | b] for e extra columns (an adapter's
 * rank, plus one for a bias) on `in` inputs: in + e rounded up to 8 (zeros after e). */
static int64_t fold_ld(int64_t in, int64_t e) { return in + ((e + 7) & ~(int64_t)7); }
/* l's extra columns: its adapter's rank and its bias's one */
static int64_t fold_ext(const tz_linear *l) { return (l->a ? l->r : 0) + (l->bias != NULL); }

/* Whether l's forward can take its LoRA path inside the base GEMM at row stride ld: a
 * TurboQuant weight, bf16 GEMMs, an fp32 B, and a tile with room for [out, ld]. */
static int folds(const tz_backend *be, const tz_linear *l, int64_t ld) {
    const tz_qweight *q = l->w->q;
    return q && q->method == TZ_TQ_TURBOQUANT && tz_linear_rounds_bf16(be) && sharing_on() &&
           be->tq_matmul_lora && l->tq && l->tq->tile &&
           tz_tq_tile_elems(be, l->out, l->in, ld, q->group) <= l->tq->tile_elems &&
           (!l->a || !l->b->w16);
}

/* y = [x_rot | h | 1] [W_rot | s B | b]^T from x_rot in bf16 at row stride ld (tq_rotate16's),
 * h = x A^T already in h (n x r); without an adapter or a bias their columns are left out
 * (the padding zeros). */
static void fold_matmul(tz_backend *be, const tz_linear *l, float *y, uint16_t *xr, int64_t ld,
                        const float *h, int64_t n, int y16) {
    const tz_qweight *q = l->w->q;
    if (!q->codes) TZ_FATAL("%s: a streamed weight used while its block is not loaded", l->w->name);
    const int64_t need = tz_tq_tile_elems(be, l->out, l->in, ld, q->group);
    if (!l->tq || !l->tq->tile || need > l->tq->tile_elems)
        TZ_FATAL("%s: no scratch tile of %lld elements for the quantized weight", l->w->name,
                 (long long)need);
    be->tq_matmul_lora(be, y, xr, ld, l->a ? h : NULL, l->a ? l->b->w : NULL, l->a ? l->r : 0,
                       l->scale, l->tq->tile, q->codes, q->scales, q->levels, l->out, l->in,
                       q->bits, q->group, n, l->bias ? l->bias->w : NULL, y16);
}

int64_t tz_linear_fold_cols(const tz_backend *be, int64_t r, int bias) {
    const int64_t e = r + (bias != 0);
    return e > 0 && tz_linear_rounds_bf16(be) && sharing_on() ? fold_ld(0, e) : 0;
}

/* Whether a dense l's bias and LoRA path go inside its GEMM along K on n rows (matmul_bias,
 * matmul_lora): bf16 GEMMs, and a bias (its fold copies both operands into rows of K + 8
 * anyway: the adapter's columns come almost free), or an adapter alone where copying the
 * operands into rows of K + r costs less than the pass over y the adapter's GEMM saves
 * ((n + out) (in + r) bf16 written and read against n x out fp32: the DiT's many rows, not a
 * Llama's). */
static int dense_folds(const tz_backend *be, const tz_linear *l, int64_t n) {
    if (l->w->q || !(l->bias || l->a) || !tz_linear_rounds_bf16(be) || !sharing_on()) return 0;
    if (!l->a) return 1;
    if (!be->matmul_lora || l->b->w16) return 0;
    const int64_t k = l->in + ((l->r + 7) & ~(int64_t)7);
    return l->bias || (n + l->out) * k < 2 * n * l->out;
}
/* y = [x | x A^T | 1] [W | s B | b]^T (dense_folds), x fp32 or bf16 (x16), h = x A^T kept */
static void dense_fold_fwd(tz_backend *be, const tz_linear *l, float *y, float *h, const void *x,
                           int x16, int64_t n) {
    if (!l->a) { /* y = [x | 1] [W | b]^T */
        be->matmul_bias(be, y, x, x16, l->w->w, l->w->w16, l->bias->w, n, l->out, l->in, 0);
        return;
    }
    mm16(be, h, x, x16, l->a->w, 0, n, l->r, l->in, 0, 1, 1.0f, 0.0f);
    be->matmul_lora(be, y, x, x16, l->w->w, l->w->w16, h, l->b->w, l->r, l->scale,
                    l->bias ? l->bias->w : NULL, n, l->out, l->in);
}

/* Whether l's forward on n rows takes its LoRA path and bias inside the base GEMM (a
 * TurboQuant weight with an adapter or a bias, and room for [x_rot | h | 1]) */
static int fold_fwd_ok(const tz_backend *be, const tz_linear *l, int64_t n) {
    const tz_qweight *q = l->w->q;
    return q && q->method == TZ_TQ_TURBOQUANT && fold_ext(l) &&
           folds(be, l, fold_ld(l->in, fold_ext(l))) &&
           (n * fold_ld(l->in, fold_ext(l)) + 1) / 2 <= l->tq->act_floats;
}

int tz_linear_fwd_writes_y16(const tz_backend *be, const tz_linear *l, int64_t n) {
    return !dense_folds(be, l, n) && fold_fwd_ok(be, l, n);
}

void tz_linear_fwd(tz_backend *be, const tz_linear *l, float *y, float *h, const float *x,
                   int64_t n) {
    tz_linear_fwd16(be, l, y, h, x, n, 0);
}

void tz_linear_fwd16(tz_backend *be, const tz_linear *l, float *y, float *h, const float *x,
                     int64_t n, int y16) {
    const tz_qweight *q = l->w->q;
    if (y16 && !tz_linear_fwd_writes_y16(be, l, n))
        TZ_FATAL("linear %lld -> %lld: an output in bf16 needs a TurboQuant weight whose "
                 "adapter or bias folds into its GEMM (tz_linear_fwd_writes_y16)",
                 (long long)l->in, (long long)l->out);
    if (g_probe && q && l->a) g_probe(g_probe_ctx, l, x, n);
    if (dense_folds(be, l, n)) { /* the bias and LoRA inside the GEMM */
        dense_fold_fwd(be, l, y, h, x, 0, n);
        return;
    }
    if (!q) { /* y[n,out] = x[n,in] . W[out,in]^T */
        tz_matmul_w(be, y, x, l->w, n, l->out, l->in, 1, 1.0f, 0.0f);
    } else if (fold_fwd_ok(be, l, n)) {
        /* y = [x_rot | x A^T | 1] [W_rot | s B | b]^T: LoRA and the bias inside the base GEMM;
         * x rounded by the rotation's pass too, after its rows, where there is room (the
         * plans hold it) */
        const int64_t ld = fold_ld(l->in, fold_ext(l)), rot = al16((n * ld + 1) / 2);
        uint16_t *xr = (uint16_t *)(void *)l->tq->act;
        uint16_t *x16 = l->a && rot + (n * l->in + 1) / 2 <= l->tq->act_floats
                            ? (uint16_t *)(void *)(l->tq->act + rot)
                            : NULL;
        be->tq_rotate16(be, xr, x, n, l->in, ld, q->group, q->seed, x16);
        if (l->a) /* h = x A^T */
            mm16(be, h, x16 ? (const void *)x16 : (const void *)x, x16 != NULL, l->a->w, 0, n,
                 l->r, l->in, 0, 1, 1.0f, 0.0f);
        fold_matmul(be, l, y, xr, ld, h, n, y16);
        return;
    } else if (q->method == TZ_TQ_TURBOQUANT) { /* y = x_rot . W_rot^T */
        float *xr = act_buffer(l, n);
        if (tz_linear_rounds_bf16(be) && sharing_on()) {
            /* rounded as it is stored, as the GEMM would */
            be->tq_rotate16(be, (uint16_t *)(void *)xr, x, n, l->in, l->in, q->group, q->seed,
                            NULL);
            qmatmul16(be, l, y, xr, 1, n, 1, 0.0f);
        } else {
            be->tq_rotate(be, xr, x, n, l->in, q->group, q->seed);
            qmatmul(be, l, y, xr, n, 1, 0.0f);
        }
    } else { /* absmax baseline: plain basis */
        qmatmul(be, l, y, x, n, 1, 0.0f);
    }
    lora_bias_fwd(be, l, y, h, x, 0, n);
}

/* tz_linear_bwd but for the bias gradient (dy_prep's), with x fp32 or, where x16, bf16 bit
 * patterns, and dy also rounded once to bf16 where dy16 is not NULL (the GEMMs read it);
 * dx_done: dx gets the base weight's part from the caller (the shared TurboQuant backward);
 * defer: dh left in scratch transposed, dh^T [r, n], the A gradient and dx += dh A left to
 * the caller (2: added to what scratch holds, the dh of a part of dy before);
 * dx_set: the base weight's part is written into dx, not added (its contents not read). */
static void linear_bwd_x(tz_backend *be, const tz_linear *l, float *dx, const float *dy,
                         const uint16_t *dy16, const void *x, int x16, const float *h,
                         float *scratch, int64_t n, int dx_done, int defer, int dx_set) {
    const tz_qweight *q = l->w->q;
    const void *d = dy16 ? (const void *)dy16 : (const void *)dy;
    const int d16 = dy16 != NULL;
    /* dW[out,in] += dy^T x. A quantized weight's is straight-through: the forward used W_hat
     * = Q(master), and the gradient w.r.t. the master is taken as the gradient w.r.t. W_hat,
     * in the plain basis the master lives in, with the un-rotated x (the rotation of the
     * forward acts on x and W_rot together and cancels: x_rot W_rot^T = x W_hat^T). */
    if (l->w->g) mm16(be, l->w->g, d, d16, x, x16, l->out, l->in, n, 1, 0, 1.0f, 1.0f);
    if (dx && !dx_done) {
        const float bd = dx_set ? 0.0f : 1.0f;
        if (q && q->method == TZ_TQ_TURBOQUANT) { /* dx (+)= R^T (dy W_rot) */
            float *t = act_buffer(l, n); /* n * in floats at its start (bwd_layout) */
            qmatmul16(be, l, t, d, d16, n, 0, 0.0f);
            be->tq_rotate_bwd(be, dx, t, n, l->in, q->group, q->seed, !dx_set);
        } else if (q) { /* dx (+)= dy W_hat */
            qmatmul16(be, l, dx, d, d16, n, 0, bd);
        } else if (d16) { /* dx[n,in] (+)= dy[n,out] W[out,in] */
            be->matmul16(be, dx, d, 1, l->w->w, l->w->w16, n, l->in, l->out, 0, 0, 1.0f, bd);
        } else {
            tz_matmul_w(be, dx, dy, l->w, n, l->in, l->out, 0, 1.0f, bd);
        }
    }
    if (!l->a) return;
    if (l->b->g) /* dB[out,r] += s dy^T h */
        mm16(be, l->b->g, d, d16, h, 0, l->out, l->r, n, 1, 0, l->scale, 1.0f);
    if (defer) { /* dh^T[r,n] (+)= s B^T dy^T */
        mm16(be, scratch, l->b->w, 0, d, d16, l->r, n, l->out, 1, 1, l->scale,
             defer == 2 ? 1.0f : 0.0f);
        return;
    }
    /* dh[n,r] = s dy B */
    mm16(be, scratch, d, d16, l->b->w, 0, n, l->r, l->out, 0, 0, l->scale, 0.0f);
    if (l->a->g) /* dA[r,in] += dh^T x */
        mm16(be, l->a->g, scratch, 0, x, x16, l->r, l->in, n, 1, 0, 1.0f, 1.0f);
    if (dx) /* dx += dh A */
        be->matmul(be, dx, scratch, l->a->w, n, l->in, l->r, 0, 0, 1.0f, 1.0f);
}

/* Whether p gets a gradient: its buffer, or, when planning (plan), its trainable flag. */
static int grad(const tz_param *p, int plan) { return p && (p->g || (plan && p->trainable)); }

/* How many GEMMs of l's backward read dy (rounding it once pays from two on). */
static int dy_readers(const tz_linear *l, int dx, int plan) {
    return dx + grad(l->w, plan) + (l->a ? grad(l->b, plan) + (dx || grad(l->a, plan)) : 0);
}

/* Where a backward of the `count` linears reading one input [n, in] keeps its bf16 copies
 * (bf16 GEMM operands only), in the activation scratch after dy W_rot (n * in floats, where
 * turbo: TurboQuant weights):
 *   dy16: each dy rounded once in turn (n * the largest out), where two GEMMs or more read it;
 *   x16:  x rounded once (n * in) for every GEMM of the linears that reads it, where a weight
 *         gradient reads it in turn with dy, or the weights are dense;
 *   dh:   where only the LoRA A gradients of TurboQuant weights read x: every dh kept (n *
 *         the ranks), so that x is rounded after the inverse rotation, into the place of
 *         dy W_rot, and the A gradients taken then; each kept transposed, dh^T [r, n], one
 *         after another, so that together they are [dh_1 .. dh_k]^T [ranks, n];
 *   astack: with dh, where dx is wanted: the kept adapters' A rounded to bf16, stacked
 *         [A_1; ..; A_k] (ranks * in), so that dx += [dh_1 .. dh_k] [A_1; ..; A_k] is one
 *         GEMM, one read and write of dx instead of one for each adapter.
 * (dy W_rot's place is kept with or without dx.) Each where the scratch has room (act, cap
 * floats), else NULL and the GEMMs round their fp32 operand themselves (the same bits, more
 * traffic). act NULL: plan (grad()), with room for all; floats: what the backward takes of
 * the scratch. given16: every dy comes in bf16 (no dy16 room). */
typedef struct {
    uint16_t *dy16, *x16, *astack;
    float *dh;
    int64_t floats;
} bwd_room;

/* fl floats of act from *off where they fit under cap (then *off moves past them), else
 * NULL; act NULL (a plan): NULL either way. */
static void *take(float *act, int64_t *off, int64_t cap, int64_t fl) {
    if (*off + fl > cap) return NULL;
    void *p = act ? (void *)(act + *off) : NULL;
    *off += fl;
    return p;
}

static bwd_room bwd_layout(const tz_backend *be, const tz_linear *const *ls, int count,
                           int64_t n, int turbo, int dx, int given16, float *act, int64_t cap) {
    bwd_room r = {0};
    const int plan = act == NULL;
    int64_t off = turbo ? al16(n * ls[0]->in) : 0, maxout = 0, ranks = 0;
    int dy = 0, wx = 0, ax = 0;
    for (int i = 0; i < count; i++) {
        const tz_linear *l = ls[i];
        maxout = l->out > maxout ? l->out : maxout;
        dy |= !given16 && dy_readers(l, dx, plan) >= 2;
        wx |= grad(l->w, plan);
        if (l->a && grad(l->a, plan)) ax = 1, ranks += l->r;
    }
    r.floats = off;
    if (!tz_linear_rounds_bf16(be) || !sharing_on() || (!plan && cap <= 0)) return r;
    if (plan) cap = INT64_MAX;
    if (dy) r.dy16 = take(act, &off, cap, half16(n * maxout));
    if (count > 1 && (wx || (ax && !turbo))) r.x16 = take(act, &off, cap, half16(n * ls[0]->in));
    else if (count > 1 && ax) {
        const int64_t o0 = off;
        r.dh = take(act, &off, cap, al16(n * ranks));
        if (off > o0 && dx && stacking_on())
            r.astack = take(act, &off, cap, half16(ranks * ls[0]->in));
    }
    r.floats = off;
    return r;
}

int64_t tz_linear_act_floats(const tz_backend *be, const tz_linear *const *ls, int count,
                             int64_t n, int backward) {
    const tz_qweight *q = ls[0]->w->q;
    const int turbo = q && q->method == TZ_TQ_TURBOQUANT;
    int64_t fwd = turbo ? n * ls[0]->in : 0, emax = 0;
    if (count > 1 && !turbo && tz_linear_rounds_bf16(be) && sharing_on())
        fwd = (n * ls[0]->in + 1) / 2;
    int adapted = 0;
    for (int i = 0; i < count; i++) {
        emax = fold_ext(ls[i]) > emax ? fold_ext(ls[i]) : emax;
        adapted |= ls[i]->a != NULL;
    }
    if (turbo && emax && tz_linear_rounds_bf16(be) && sharing_on()) {
        /* LoRA, bias folded (tq_matmul_lora) */
        const int64_t rot = (n * fold_ld(ls[0]->in, emax) + 1) / 2; /* then x in bf16 */
        const int64_t f = al16(rot) + (adapted ? (n * ls[0]->in + 1) / 2 : 0);
        fwd = f > fwd ? f : fwd;
    }
    if (!backward) return fwd;
    const int64_t bwd =
        bwd_layout(be, ls, count, n, turbo, 1, backward == TZ_LINEAR_BWD_DY16, NULL, 0).floats;
    return fwd > bwd ? fwd : bwd;
}

/* A dy given in bf16 (dy16) is read only by the GEMMs, which round an fp32 dy to the same
 * bits: it needs bf16 GEMM operands. */
static void need_dy16(const tz_backend *be, const tz_linear *l) {
    if (!tz_linear_rounds_bf16(be))
        TZ_FATAL("linear %lld -> %lld: a dy given in bf16 needs bf16 GEMM operands",
                 (long long)l->in, (long long)l->out);
}

/* The dy l's backward GEMMs read, with l's bias gradient (db += sum dy) taken: given16 where
 * the op before made it in bf16 (dy then only for the bias), else dy rounded into room where
 * room is not NULL (in the bias gradient's pass where there is one: one read of dy for both),
 * else NULL (the GEMMs read the fp32 dy). */
static const uint16_t *dy_prep(tz_backend *be, const tz_linear *l, const float *dy,
                               const uint16_t *given16, uint16_t *room, int64_t n,
                               int db_done) {
    const int db = l->bias && l->bias->g && !db_done;
    if (given16) need_dy16(be, l);
    if (db && !dy)
        TZ_FATAL("linear %lld -> %lld: its bias gradient sums dy in fp32, and only a bf16 dy "
                 "was given", (long long)l->in, (long long)l->out);
    uint16_t *d16 = given16 ? NULL : room;
    if (db) be->bias_bwd(be, l->bias->g, dy, n, l->out, d16);
    else if (d16) be->to_bf16(be, d16, dy, n * l->out);
    return given16 ? given16 : d16;
}

/* linear_bwd's modes: dx written, not added to; the bias gradient taken already (by the op
 * that made dy16) */
enum { LB_SET = 1, LB_DB_DONE = 2 };

/* tz_linear_bwd, dx written (mode LB_SET) or added to; x fp32, or bf16 bit patterns (x16);
 * dy fp32, or given already rounded (dy16; dy then only for a bias gradient, none with
 * LB_DB_DONE) */
static void linear_bwd(tz_backend *be, const tz_linear *l, float *dx, const float *dy,
                       const uint16_t *dy16, const void *x, int x16, const float *h,
                       float *scratch, int64_t n, int mode) {
    const tz_qweight *q = l->w->q;
    const int turbo = q && q->method == TZ_TQ_TURBOQUANT;
    const bwd_room r = l->tq && l->tq->act ? bwd_layout(be, &l, 1, n, turbo, dx != NULL,
                                                        dy16 != NULL, l->tq->act,
                                                        l->tq->act_floats)
                                           : (bwd_room){0};
    dy16 = dy_prep(be, l, dy, dy16, r.dy16, n, mode & LB_DB_DONE);
    linear_bwd_x(be, l, dx, dy, dy16, x, x16, h, scratch, n, 0, 0, mode & LB_SET);
}

int tz_linear_bwd_reads_x(const tz_linear *l) { return l->w->g || (l->a && l->a->g); }

int tz_linear_takes_dy16(const tz_backend *be, const tz_linear *l) {
    return tz_linear_rounds_bf16(be) && !grad(l->bias, 1);
}

int tz_linear_dy_mode(const tz_backend *be, const tz_linear *l) {
    return tz_linear_takes_dy16(be, l) ? 2 : 0;
}

int tz_linear_takes_dy16_db(const tz_backend *be, const tz_linear *l) {
    return tz_linear_rounds_bf16(be) && l->bias && l->bias->g;
}

void tz_linear_bwd_set_db16(tz_backend *be, const tz_linear *l, float *dx, const uint16_t *dy16,
                            const void *x, int x16, const float *h, float *scratch, int64_t n) {
    if (!tz_linear_takes_dy16_db(be, l))
        TZ_FATAL("linear %lld -> %lld: a bf16 dy with the bias gradient taken needs a trained "
                 "bias and bf16 GEMM operands", (long long)l->in, (long long)l->out);
    linear_bwd(be, l, dx, NULL, dy16, x, x16, h, scratch, n, LB_SET | LB_DB_DONE);
}

/* A dense linear on an input kept in bf16: the fold's and rotation's paths are the
 * quantized weights', which read x in fp32. */
static void need_dense_x16(const tz_linear *l, const tz_backend *be) {
    if (l->w->q || !tz_linear_rounds_bf16(be))
        TZ_FATAL("linear %lld -> %lld: an input kept in bf16 needs a dense weight and bf16 GEMM "
                 "operands", (long long)l->in, (long long)l->out);
}

int tz_linear_writes_y16(const tz_backend *be, const tz_linear *l) {
    return !l->w->q && l->bias && !l->a && tz_linear_rounds_bf16(be);
}

void tz_linear_fwd_x16(tz_backend *be, const tz_linear *l, float *y, float *h,
                       const uint16_t *x16, int64_t n, int y16) {
    need_dense_x16(l, be);
    if (y16 && !tz_linear_writes_y16(be, l))
        TZ_FATAL("linear %lld -> %lld: an output in bf16 needs a dense weight with a bias, no "
                 "adapter and bf16 GEMMs", (long long)l->in, (long long)l->out);
    if (l->a && dense_folds(be, l, n)) { /* y = [x | x A^T | 1] [W | s B | b]^T */
        dense_fold_fwd(be, l, y, h, x16, 1, n);
        return;
    }
    if (l->bias) /* y = [x | 1] [W | b]^T, then LoRA */
        be->matmul_bias(be, y, x16, 1, l->w->w, l->w->w16, l->bias->w, n, l->out, l->in, y16);
    else
        be->matmul16(be, y, x16, 1, l->w->w, l->w->w16, n, l->out, l->in, 0, 1, 1.0f, 0.0f);
    lora_fwd(be, l, y, h, x16, 1, n);
}

void tz_linear_bwd_set_x16(tz_backend *be, const tz_linear *l, float *dx, const float *dy,
                           const uint16_t *dy16, const uint16_t *x16, const float *h,
                           float *scratch, int64_t n) {
    if (!tz_linear_rounds_bf16(be)) /* (any weight: its backward reads x in GEMMs only) */
        TZ_FATAL("linear %lld -> %lld: an input kept in bf16 needs bf16 GEMM operands",
                 (long long)l->in, (long long)l->out);
    linear_bwd(be, l, dx, dy, dy16, x16, 1, h, scratch, n, LB_SET);
}

void tz_linear_bwd(tz_backend *be, const tz_linear *l, float *dx, const float *dy,
                   const float *x, const float *h, float *scratch, int64_t n) {
    linear_bwd(be, l, dx, dy, NULL, x, 0, h, scratch, n, 0);
}

void tz_linear_bwd_set(tz_backend *be, const tz_linear *l, float *dx, const float *dy,
                       const float *x, const float *h, float *scratch, int64_t n) {
    linear_bwd(be, l, dx, dy, NULL, x, 0, h, scratch, n, LB_SET);
}

void tz_linear_bwd_set16(tz_backend *be, const tz_linear *l, float *dx, const float *dy,
                         const uint16_t *dy16, const float *x, const float *h, float *scratch,
                         int64_t n) {
    linear_bwd(be, l, dx, dy, dy16, x, 0, h, scratch, n, LB_SET);
}

/* ---- linears that read one input ---- */

/* TZ_LINEAR_SHARED=0 in the environment: every linear on its own (the same results; for
 * measuring what the sharing saves, docs/gpu.md). Read once. */
static int sharing_on(void) {
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("TZ_LINEAR_SHARED");
        on = !(e && !strcmp(e, "0"));
    }
    return on;
}

/* TZ_LORA_STACK=0: a shared group's adapters add dh_i A_i into dx one GEMM each, without the
 * stacked A's (bwd_layout's astack; the same results to fp32 rounding: for measuring on a GPU
 * the stack's small rounding passes against the GEMMs' passes over dx it saves). Read once;
 * tz_linear_set_stacking overrides it. */
static int g_stacking = -1;
void tz_linear_set_stacking(int on) { g_stacking = on < 0 ? -1 : on != 0; }
static int stacking_on(void) {
    static int env = -1;
    if (g_stacking >= 0) return g_stacking;
    if (env < 0) {
        const char *e = getenv("TZ_LORA_STACK");
        env = !(e && !strcmp(e, "0"));
    }
    return env;
}

/* Whether the `count` linears can share the work on their input: two or more TurboQuant
 * weights of one rotation (group and seed) and one scratch. */
static int shareable(const tz_linear *const *ls, int count) {
    if (count < 2 || !sharing_on()) return 0;
    const tz_qweight *q0 = ls[0]->w->q;
    if (!q0 || q0->method != TZ_TQ_TURBOQUANT) return 0;
    for (int i = 1; i < count; i++) {
        const tz_qweight *q = ls[i]->w->q;
        if (!q || q->method != TZ_TQ_TURBOQUANT || q->group != q0->group ||
            q->seed != q0->seed || ls[i]->in != ls[0]->in || ls[i]->tq != ls[0]->tq)
            return 0;
    }
    return 1;
}

/* Dense weights with bf16 GEMM operands: the linears share x rounded once to bf16, where
 * the scratch has room for it (n * in bf16, half as many floats; the model plans it). */
static int shareable_dense(const tz_backend *be, const tz_linear *const *ls, int count,
                           int64_t n) {
    if (count < 2 || !sharing_on() || !tz_linear_rounds_bf16(be)) return 0;
    const tz_tq_scratch *s = ls[0]->tq;
    if (!s || !s->act || (n * ls[0]->in + 1) / 2 > s->act_floats) return 0;
    for (int i = 0; i < count; i++)
        if (ls[i]->w->q || ls[i]->in != ls[0]->in || ls[i]->tq != s) return 0;
    return 1;
}

/* With bf16 GEMM operands the activation scratch (n * in floats) holds two bf16 copies of
 * x [n, in]: the rotated one first, the plain one after it (16-byte aligned: in is a multiple
 * of the group). */
static uint16_t *act16(const tz_linear *l, int64_t n, int which) {
    return (uint16_t *)(void *)act_buffer(l, n) + (which ? n * l->in : 0);
}

static int fwd_prep(tz_backend *be, const tz_linear *const *ls, float *const *hs, int count,
                    const float *x, int64_t n, float *room, int64_t room_floats);

static int prep_mode(const tz_backend *be, const tz_linear *const *ls, int count, int64_t n,
                     int64_t room, int64_t *ld);

int tz_linear_shared_y16(const tz_backend *be, const tz_linear *const *ls, int count,
                         int64_t n) {
    int64_t ld;
    return be->tq_matmul_lora && ls[0]->tq && ls[0]->tq->act &&
           prep_mode(be, ls, count, n, ls[0]->tq->act_floats, &ld) != 0;
}

void tz_linear_fwd_shared(tz_backend *be, const tz_linear *const *ls, float *const *ys,
                          float *const *hs, int count, const float *x, int64_t n) {
    tz_linear_fwd_shared16(be, ls, ys, hs, count, x, n, 0);
}

void tz_linear_fwd_shared16(tz_backend *be, const tz_linear *const *ls, float *const *ys,
                            float *const *hs, int count, const float *x, int64_t n, int y16) {
    if (y16 && !tz_linear_shared_y16(be, ls, count, n))
        TZ_FATAL("linear %lld -> %lld: outputs in bf16 need TurboQuant weights of one rotation "
                 "on the prepared path (tz_linear_shared_y16)", (long long)ls[0]->in,
                 (long long)ls[0]->out);
    if (shareable_dense(be, ls, count, n)) {
        /* x rounded once for every GEMM that reads it: the linears without a bias and the
         * adapters (a linear with a bias rounds x into its own operand, matmul_bias: the same
         * bits); not at all where nothing else reads it */
        int rounded = 0;
        for (int i = 0; i < count; i++) rounded |= !ls[i]->bias || ls[i]->a;
        uint16_t *x16 = rounded ? (uint16_t *)(void *)ls[0]->tq->act : NULL;
        if (x16) be->to_bf16(be, x16, x, n * ls[0]->in);
        for (int i = 0; i < count; i++) {
            const tz_linear *l = ls[i];
            if (l->a && dense_folds(be, l, n) && x16) { /* LoRA and the bias along K */
                dense_fold_fwd(be, l, ys[i], hs[i], x16, 1, n);
                continue;
            }
            if (l->bias)
                be->matmul_bias(be, ys[i], x, 0, l->w->w, l->w->w16, l->bias->w, n, l->out,
                                l->in, 0);
            else
                be->matmul16(be, ys[i], x16, 1, l->w->w, l->w->w16, n, l->out, l->in, 0, 1,
                             1.0f, 0.0f);
            lora_fwd(be, l, ys[i], hs[i], x16, 1, n);
        }
        return;
    }
    if (!shareable(ls, count)) {
        for (int i = 0; i < count; i++) tz_linear_fwd(be, ls[i], ys[i], hs[i], x, n);
        return;
    }
    const tz_linear *l0 = ls[0];
    const tz_qweight *q0 = l0->w->q;
    int adapted = 0;
    for (int i = 0; i < count; i++) {
        if (g_probe && ls[i]->a) g_probe(g_probe_ctx, ls[i], x, n);
        adapted |= ls[i]->a != NULL;
    }
    /* the LoRA paths and the biases folded into the base GEMMs (x rotated into bf16 rows
     * with room for the adapters' h and the bias's 1, x rounded once after them for the h =
     * x A^T), or with bf16 GEMMs and neither, the plain products on x rotated into bf16:
     * the prepared path, in the rotation buffer */
    if (fwd_prep(be, ls, hs, count, x, n, l0->tq->act, l0->tq->act_floats)) {
        tz_linear_fwd_shared_apply(be, ls, ys, (const float *const *)hs, count, n, l0->tq->act,
                                   y16);
        return;
    }
    const void *xr = act_buffer(l0, n), *xl = x;
    const int b16 = tz_linear_rounds_bf16(be);
    if (b16) { /* rounded once here, as each GEMM would round it */
        be->tq_rotate16(be, act16(l0, n, 0), x, n, l0->in, l0->in, q0->group, q0->seed,
                        adapted ? act16(l0, n, 1) : NULL);
        xr = act16(l0, n, 0);
        if (adapted) xl = act16(l0, n, 1);
    } else {
        be->tq_rotate(be, act_buffer(l0, n), x, n, l0->in, q0->group, q0->seed);
    }
    for (int i = 0; i < count; i++) {
        qmatmul16(be, ls[i], ys[i], xr, b16, n, 1, 0.0f);
        lora_bias_fwd(be, ls[i], ys[i], hs[i], xl, b16, n);
    }
}

/* How tz_linear_fwd_shared_prep and _apply run the linears ls on n rows of their input with
 * `room` floats for it: 1, the fold path (x rotated into bf16 rows of *ld, x in bf16 after
 * them for the adapters' h); 2, no adapter or bias: x rotated into bf16 rows of in, each
 * product on it; 0, neither (tz_linear_fwd_shared's other paths). */
static int prep_mode(const tz_backend *be, const tz_linear *const *ls, int count, int64_t n,
                     int64_t room, int64_t *ld) {
    if (!shareable(ls, count) || !tz_linear_rounds_bf16(be)) return 0;
    int64_t emax = 0;
    int adapted = 0;
    for (int i = 0; i < count; i++) {
        emax = fold_ext(ls[i]) > emax ? fold_ext(ls[i]) : emax;
        adapted |= ls[i]->a != NULL;
    }
    *ld = fold_ld(ls[0]->in, emax);
    if (!emax) return half16(n * ls[0]->in) <= room ? 2 : 0;
    int fold = al16((n * *ld + 1) / 2) + (adapted ? (n * ls[0]->in + 1) / 2 : 0) <= room;
    for (int i = 0; i < count && fold; i++) fold = folds(be, ls[i], *ld);
    return fold;
}

int tz_linear_fwd_shared_prep(tz_backend *be, const tz_linear *const *ls, float *const *hs,
                              int count, const float *x, int64_t n, float *room,
                              int64_t room_floats) {
    /* (not while a probe watches: it gets the whole forward, tz_linear_fwd_shared) */
    return g_probe ? 0 : fwd_prep(be, ls, hs, count, x, n, room, room_floats);
}

int64_t tz_linear_fwd_prep_floats(const tz_linear *const *ls, int count, int64_t n) {
    int64_t emax = 0;
    for (int i = 0; i < count; i++) emax = fold_ext(ls[i]) > emax ? fold_ext(ls[i]) : emax;
    return al16((n * fold_ld(ls[0]->in, emax) + 1) / 2) + half16(n * ls[0]->in);
}

static int fwd_prep(tz_backend *be, const tz_linear *const *ls, float *const *hs, int count,
                    const float *x, int64_t n, float *room, int64_t room_floats) {
    int64_t ld;
    const int mode = room ? prep_mode(be, ls, count, n, room_floats, &ld) : 0;
    if (!mode) return 0;
    const tz_qweight *q0 = ls[0]->w->q;
    int adapted = 0;
    for (int i = 0; i < count; i++) adapted |= ls[i]->a != NULL;
    uint16_t *xr16 = (uint16_t *)(void *)room;
    uint16_t *x16 = adapted ? (uint16_t *)(void *)(room + al16((n * ld + 1) / 2)) : NULL;
    be->tq_rotate16(be, xr16, x, n, ls[0]->in, ld, q0->group, q0->seed, x16);
    for (int i = 0; i < count; i++)
        if (ls[i]->a) /* h = x A^T */
            mm16(be, hs[i], x16, 1, ls[i]->a->w, 0, n, ls[i]->r, ls[i]->in, 0, 1, 1.0f, 0.0f);
    return 1;
}

void tz_linear_fwd_shared_apply(tz_backend *be, const tz_linear *const *ls, float *const *ys,
                                const float *const *hs, int count, int64_t n, float *room,
                                int y16) {
    int64_t ld;
    const int mode = prep_mode(be, ls, count, n, INT64_MAX, &ld);
    if (!mode)
        TZ_FATAL("linear %lld -> %lld: a prepared forward needs TurboQuant weights of one "
                 "rotation whose adapters fold", (long long)ls[0]->in, (long long)ls[0]->out);
    if (y16 && !be->tq_matmul_lora)
        TZ_FATAL("linear %lld -> %lld: outputs in bf16 need the backend's tq_matmul_lora",
                 (long long)ls[0]->in, (long long)ls[0]->out);
    for (int i = 0; i < count; i++) {
        /* (a bf16 y without adapters: the folded product with nothing folded, r = 0 at
         * ld = in) */
        const int o16 = (y16 >> i) & 1;
        if (mode == 1 || o16)
            fold_matmul(be, ls[i], ys[i], (uint16_t *)(void *)room, ld, hs[i], n, o16);
        else qmatmul16(be, ls[i], ys[i], room, 1, n, 1, 0.0f);
    }
}

void tz_linear_bwd_shared(tz_backend *be, const tz_linear *const *ls, int count, float *dx,
                          const float *const *dys, const float *x, const float *const *hs,
                          float *scratch, int64_t n, int dx_set) {
    tz_linear_bwd_shared16(be, ls, count, dx, dys, NULL, x, hs, scratch, n, dx_set);
}

/* tz_linear_bwd_shared16 over the parts of dy (part: TZ_LINEAR_PART_FIRST, _LAST; both: the
 * whole); see tz_linear_bwd_shared_part. */
static void bwd_shared(tz_backend *be, const tz_linear *const *ls, int count, float *dx,
                       const float *const *dys, const uint16_t *const *dy16s, const float *x,
                       const float *const *hs, float *scratch, int64_t n, int dx_set, int part) {
    const int turbo = shareable(ls, count), first = part & TZ_LINEAR_PART_FIRST,
              last = part & TZ_LINEAR_PART_LAST;
    if (!turbo && !shareable_dense(be, ls, count, n)) {
        if (part != (TZ_LINEAR_PART_FIRST | TZ_LINEAR_PART_LAST))
            TZ_FATAL("linear %lld -> %lld: a backward in parts needs TurboQuant weights of one "
                     "rotation", (long long)ls[0]->in, (long long)ls[0]->out);
        for (int i = 0; i < count; i++)
            linear_bwd(be, ls[i], dx, dys ? dys[i] : NULL, dy16s ? dy16s[i] : NULL, x, 0, hs[i],
                       scratch, n, dx_set && !i);
        return;
    }
    /* each dy and x rounded once for every GEMM that reads them (bwd_layout); TurboQuant:
     * dx (+)= R^T (sum_i dy_i W_rot_i), one inverse rotation for all, then LoRA's dh_i A_i
     * where the dh's are kept (else before it); dense: tz_linear_bwd's order, the same bits.
     * In parts: the sum and the kept dh's added up part by part in the scratch, the rotation
     * and what follows it after the last */
    const tz_linear *l0 = ls[0];
    int given16 = dy16s != NULL;
    for (int i = 0; given16 && i < count; i++) given16 = dy16s[i] != NULL;
    if (!last || !first) { /* the scratch's layout the same in every part */
        if (!turbo || !given16 || !dx)
            TZ_FATAL("linear %lld -> %lld: a backward in parts needs TurboQuant weights, dx and "
                     "every dy in bf16", (long long)l0->in, (long long)l0->out);
    }
    const bwd_room r = bwd_layout(be, ls, count, n, turbo, dx != NULL, given16, l0->tq->act,
                                  l0->tq->act_floats);
    if (r.x16) be->to_bf16(be, r.x16, x, n * l0->in);
    float *t = turbo && dx ? act_buffer(l0, n) : NULL, *dh = r.dh;
    /* an adapter's dx += dh A before the rotation: dx zeroed first (by the first part; the
     * last knows it from the same layout) */
    int zeroed = 0;
    if (t && dx_set)
        for (int i = 0; i < count; i++)
            if (ls[i]->a && !(r.dh && ls[i]->a->g)) zeroed = 1;
    if (zeroed && first) be->fill(be, dx, 0.0f, n * l0->in);
    if (zeroed) dx_set = 0;
    for (int i = 0; i < count; i++) {
        const tz_linear *l = ls[i];
        const float *dy = dys ? dys[i] : NULL;
        const uint16_t *dy16 = dy_prep(be, l, dy, dy16s ? dy16s[i] : NULL,
                                       dy_readers(l, dx != NULL, 0) >= 2 ? r.dy16 : NULL, n,
                                       0);
        if (t) /* t (+)= dy_i W_rot_i */
            qmatmul16(be, l, t, dy16 ? (const void *)dy16 : (const void *)dy, dy16 != NULL, n,
                      0, i || !first ? 1.0f : 0.0f);
        const int keep = dh && l->a && l->a->g; /* dA and dx += dh A after the rotation */
        linear_bwd_x(be, l, dx, dy, dy16, r.x16 ? (const void *)r.x16 : (const void *)x,
                     r.x16 != NULL, hs[i], keep ? dh : scratch, n, turbo,
                     keep ? (first ? 1 : 2) : 0, !turbo && dx_set && !i);
        if (keep) dh += n * l->r;
    }
    if (!last) return;
    if (t) be->tq_rotate_bwd(be, dx, t, n, l0->in, l0->w->q->group, l0->w->q->seed, !dx_set);
    if (!r.dh) return;
    /* x rounded into the place of dy W_rot, free now; dA_i[r,in] += dh_i^T x; dx += dh_i A_i,
     * for all of them at once where the stacked A's have room */
    uint16_t *x16 = (uint16_t *)(void *)act_buffer(l0, n);
    be->to_bf16(be, x16, x, n * l0->in);
    dh = r.dh;
    int64_t ranks = 0;
    for (int i = 0; i < count; i++) {
        const tz_linear *l = ls[i];
        if (!(l->a && l->a->g)) continue;
        mm16(be, l->a->g, dh, 0, x16, 1, l->r, l->in, n, 0, 0, 1.0f, 1.0f);
        if (dx && r.astack) be->to_bf16(be, r.astack + ranks * l0->in, l->a->w, l->r * l->in);
        else if (dx) be->matmul(be, dx, dh, l->a->w, n, l->in, l->r, 1, 0, 1.0f, 1.0f);
        dh += n * l->r, ranks += l->r;
    }
    if (dx && r.astack) /* dx[n,in] += (dh^T)^T [A_1; ..; A_k], the kept dh^T one [ranks, n] */
        be->matmul16(be, dx, r.dh, 0, r.astack, 1, n, l0->in, ranks, 1, 0, 1.0f, 1.0f);
}

void tz_linear_bwd_shared16(tz_backend *be, const tz_linear *const *ls, int count, float *dx,
                            const float *const *dys, const uint16_t *const *dy16s,
                            const float *x, const float *const *hs, float *scratch, int64_t n,
                            int dx_set) {
    bwd_shared(be, ls, count, dx, dys, dy16s, x, hs, scratch, n, dx_set,
               TZ_LINEAR_PART_FIRST | TZ_LINEAR_PART_LAST);
}

void tz_linear_bwd_shared_part(tz_backend *be, const tz_linear *const *ls, int count, float *dx,
                               const uint16_t *const *dy16s, const float *x,
                               const float *const *hs, float *scratch, int64_t n, int dx_set,
                               int part) {
    bwd_shared(be, ls, count, dx, NULL, dy16s, x, hs, scratch, n, dx_set, part);
}
