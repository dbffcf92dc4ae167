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
    if (!l->tq || !l->tq->tile || l->out * l->in > l->tq->tile_elems)
        TZ_FATAL("%s: no scratch tile of %lld elements for the quantized weight", l->w->name,
                 (long long)(l->out * l->in));
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

/* matmul with the layer input x as operand A (a_is_x) or B, x fp32 or, where x16, bf16 bit
 * patterns (rounded once for several GEMMs); the other operand fp32. */
static void matmul_x(tz_backend *be, float *C, const void *A, const void *B, int a_is_x, int x16,
                     int64_t M, int64_t N, int64_t K, int transA, int transB, float alpha,
                     float beta) {
    if (x16)
        be->matmul16(be, C, A, a_is_x, B, !a_is_x, M, N, K, transA, transB, alpha, beta);
    else be->matmul(be, C, (const float *)A, (const float *)B, M, N, K, transA, transB, alpha, beta);
}

/* LoRA's forward and the bias: y += s (x A^T) B^T, h = x A^T kept; y += bias. */
static void lora_bias_fwd(tz_backend *be, const tz_linear *l, float *y, float *h, const void *x,
                          int x16, int64_t n) {
    if (l->a) {
        matmul_x(be, h, x, l->a->w, 1, x16, n, l->r, l->in, 0, 1, 1.0f, 0.0f); /* h = x A^T */
        be->matmul(be, y, h, l->b->w, n, l->out, l->r, 0, 1, l->scale, 1.0f); /* y += s h B^T */
    }
    if (l->bias) be->bias_add_fwd(be, y, l->bias->w, n, l->out);
}

static tz_linear_probe g_probe;
static void *g_probe_ctx;

void tz_linear_set_probe(tz_linear_probe fn, void *ctx) {
    g_probe = fn;
    g_probe_ctx = ctx;
}

void tz_linear_fwd(tz_backend *be, const tz_linear *l, float *y, float *h, const float *x,
                   int64_t n) {
    const tz_qweight *q = l->w->q;
    if (g_probe && q && l->a) g_probe(g_probe_ctx, l, x, n);
    if (!q) { /* y[n,out] = x[n,in] . W[out,in]^T */
        tz_matmul_w(be, y, x, l->w, n, l->out, l->in, 1, 1.0f, 0.0f);
    } else if (q->method == TZ_TQ_TURBOQUANT) { /* y = x_rot . W_rot^T */
        float *xr = act_buffer(l, n);
        be->tq_rotate(be, xr, x, n, l->in, q->group, q->seed);
        qmatmul(be, l, y, xr, n, 1, 0.0f);
    } else { /* absmax baseline: plain basis */
        qmatmul(be, l, y, x, n, 1, 0.0f);
    }
    lora_bias_fwd(be, l, y, h, x, 0, n);
}

/* tz_linear_bwd with x fp32 or, where x16, bf16 bit patterns; dx_done: dx already has the
 * base weight's part (the shared TurboQuant backward), only LoRA's is added here. */
static void linear_bwd_x(tz_backend *be, const tz_linear *l, float *dx, const float *dy,
                         const void *x, int x16, const float *h, float *scratch, int64_t n,
                         int dx_done) {
    const tz_qweight *q = l->w->q;
    /* dW[out,in] += dy^T x. A quantized weight's is straight-through: the forward used W_hat
     * = Q(master), and the gradient w.r.t. the master is taken as the gradient w.r.t. W_hat,
     * in the plain basis the master lives in, with the un-rotated x (the rotation of the
     * forward acts on x and W_rot together and cancels: x_rot W_rot^T = x W_hat^T). */
    if (l->w->g) matmul_x(be, l->w->g, dy, x, 0, x16, l->out, l->in, n, 1, 0, 1.0f, 1.0f);
    if (dx && !dx_done) {
        if (q && q->method == TZ_TQ_TURBOQUANT) { /* dx += R^T (dy W_rot) */
            float *t = act_buffer(l, n); /* (x16 never lies there: only shared paths pass it) */
            qmatmul(be, l, t, dy, n, 0, 0.0f);
            be->tq_rotate_bwd(be, dx, t, n, l->in, q->group, q->seed);
        } else if (q) { /* dx += dy W_hat */
            qmatmul(be, l, dx, dy, n, 0, 1.0f);
        } else { /* dx[n,in] += dy[n,out] W[out,in] */
            tz_matmul_w(be, dx, dy, l->w, n, l->in, l->out, 0, 1.0f, 1.0f);
        }
    }
    if (l->bias && l->bias->g) be->bias_bwd(be, l->bias->g, dy, n, l->out); /* db += sum dy */
    if (!l->a) return;
    if (l->b->g) /* dB[out,r] += s dy^T h */
        be->matmul(be, l->b->g, dy, h, l->out, l->r, n, 1, 0, l->scale, 1.0f);
    /* dh[n,r] = s dy B */
    be->matmul(be, scratch, dy, l->b->w, n, l->r, l->out, 0, 0, l->scale, 0.0f);
    if (l->a->g) /* dA[r,in] += dh^T x */
        matmul_x(be, l->a->g, scratch, x, 0, x16, l->r, l->in, n, 1, 0, 1.0f, 1.0f);
    if (dx) /* dx += dh A */
        be->matmul(be, dx, scratch, l->a->w, n, l->in, l->r, 0, 0, 1.0f, 1.0f);
}

void tz_linear_bwd(tz_backend *be, const tz_linear *l, float *dx, const float *dy,
                   const float *x, const float *h, float *scratch, int64_t n) {
    linear_bwd_x(be, l, dx, dy, x, 0, h, scratch, n, 0);
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

/* Whether a backward of the linears reads x (a weight or LoRA A gradient to take). */
static int reads_x(const tz_linear *const *ls, int count) {
    for (int i = 0; i < count; i++)
        if (ls[i]->w->g || (ls[i]->a && ls[i]->a->g)) return 1;
    return 0;
}

/* Whether be's GEMMs round fp32 operands to bf16: its operand type is bf16 and it has bf16
 * GEMMs (a backend told bf16 without them, as a test may tell the CPU, computes in fp32:
 * rounding its input here would change its results). */
static int rounds_bf16(const tz_backend *be) {
    return be->matmul_dtype == TZ_DT_BF16 && ((be->matmul_dtypes >> TZ_DT_BF16) & 1u);
}

/* Dense weights with bf16 GEMM operands: the linears share x rounded once to bf16, where
 * the scratch has room for it (n * in bf16, half as many floats; the model plans it). */
static int shareable_dense(const tz_backend *be, const tz_linear *const *ls, int count,
                           int64_t n) {
    if (count < 2 || !sharing_on() || !rounds_bf16(be)) return 0;
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

void tz_linear_fwd_shared(tz_backend *be, const tz_linear *const *ls, float *const *ys,
                          float *const *hs, int count, const float *x, int64_t n) {
    if (shareable_dense(be, ls, count, n)) { /* x rounded once for every GEMM that reads it */
        uint16_t *x16 = (uint16_t *)(void *)ls[0]->tq->act;
        be->to_bf16(be, x16, x, n * ls[0]->in);
        for (int i = 0; i < count; i++) {
            const tz_linear *l = ls[i];
            be->matmul16(be, ys[i], x16, 1, l->w->w, l->w->w16, n, l->out, l->in, 0, 1, 1.0f,
                         0.0f);
            lora_bias_fwd(be, l, ys[i], hs[i], x16, 1, n);
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
    const void *xr = act_buffer(l0, n), *xl = x;
    const int b16 = rounds_bf16(be);
    if (b16) { /* rounded once here, as each GEMM would round it */
        be->tq_rotate16(be, act16(l0, n, 0), x, n, l0->in, q0->group, q0->seed);
        xr = act16(l0, n, 0);
        if (adapted) be->to_bf16(be, act16(l0, n, 1), x, n * l0->in), xl = act16(l0, n, 1);
    } else {
        be->tq_rotate(be, act_buffer(l0, n), x, n, l0->in, q0->group, q0->seed);
    }
    for (int i = 0; i < count; i++) {
        qmatmul16(be, ls[i], ys[i], xr, b16, n, 1, 0.0f);
        lora_bias_fwd(be, ls[i], ys[i], hs[i], xl, b16, n);
    }
}

void tz_linear_bwd_shared(tz_backend *be, const tz_linear *const *ls, int count, float *dx,
                          const float *const *dys, const float *x, const float *const *hs,
                          float *scratch, int64_t n) {
    if (shareable_dense(be, ls, count, n)) { /* tz_linear_bwd's order, x read rounded */
        const int x16 = reads_x(ls, count);
        uint16_t *xb = (uint16_t *)(void *)ls[0]->tq->act;
        if (x16) be->to_bf16(be, xb, x, n * ls[0]->in);
        for (int i = 0; i < count; i++)
            linear_bwd_x(be, ls[i], dx, dys[i], x16 ? (const void *)xb : x, x16, hs[i], scratch,
                         n, 0);
        return;
    }
    if (!shareable(ls, count)) {
        for (int i = 0; i < count; i++) tz_linear_bwd(be, ls[i], dx, dys[i], x, hs[i], scratch, n);
        return;
    }
    const tz_linear *l0 = ls[0];
    const tz_qweight *q0 = l0->w->q;
    if (dx) { /* dx += R^T (sum_i dy_i W_rot_i): one inverse rotation for all */
        float *t = act_buffer(l0, n);
        for (int i = 0; i < count; i++) qmatmul(be, ls[i], t, dys[i], n, 0, i ? 1.0f : 0.0f);
        be->tq_rotate_bwd(be, dx, t, n, l0->in, q0->group, q0->seed);
    }
    /* x for the weight and LoRA gradients, rounded once with bf16 GEMM operands (into the
     * scratch, free again after the rotation) */
    const void *xg = x;
    const int b16 = rounds_bf16(be) && reads_x(ls, count);
    if (b16) be->to_bf16(be, act16(l0, n, 1), x, n * l0->in), xg = act16(l0, n, 1);
    for (int i = 0; i < count; i++)
        linear_bwd_x(be, ls[i], dx, dys[i], xg, b16, hs[i], scratch, n, 1);
}
