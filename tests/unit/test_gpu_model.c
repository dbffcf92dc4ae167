/* Whole models on the CUDA backend against the CPU backend (the specification): the same
 * small random Llama or DiT built on both, one forward + backward on the same batch, then the
 * loss and every trainable gradient compared. Llama: tied embeddings with grouped-query
 * heads, untied with as many kv heads as heads (and activation checkpointing), and LoRA on a
 * 4-bit TurboQuant base (untied, GQA, checkpointing: the rotation and decode path); DiT:
 * full training with learned sigma (the XL/2 layout at a small size), LoRA on a dense base
 * with checkpointing, and (bf16) LoRA on a 4-bit base: with bf16 GEMMs a dense DiT keeps the
 * inputs of qkv, fc1 and fc2 in bf16, a quantized one in fp32. Exits 77 (skip) in a
 * build without the CUDA backend or where no GPU is visible. TZ_CUDA_MODULE picks the module
 * (the CPU emulation of the CUDA backend runs the same checks).
 *
 * Every op of the table is checked alone by test_cuda_ops, at relative errors up to 3e-5
 * (attention) and mostly 1e-6..1e-5. A whole model chains about 25 ops per layer forward and
 * as many backward, and the errors add rather than multiply (each op's error is relative to
 * its own output's scale): 2 layers give a few times 1e-5 at worst. Stated tolerances, max
 * |gpu - cpu| / max |cpu| over a tensor:
 *   loss       2e-5 relative (a sum over every token of fp32 log-sum-exps, one reduction
 *              order against another, on top of the forward's own error);
 *   gradients  2e-4 relative per tensor (the backward's errors on top of the forward's,
 *              through the same chain twice with checkpointing; a tensor whose gradient is
 *              a long sum over B*T rows, such as a norm weight, collects the most).
 * A failure names the model, the tensor and the error found. Then a second call on the GPU's
 * model, its gradients zeroed between, must give the first call's loss and gradients bit for
 * bit: an op that adds into a buffer it should write, which the same model code gets wrong on
 * both backends alike, shows there (its buffer held the arena's zeros the first time).
 *
 * The same again with the GPU's GEMM operands in bf16 (run.precision's default on a GPU:
 * matmul_dtype = TZ_DT_BF16 before the model is built, so frozen matrices are stored in bf16
 * and, with checkpointing, the saved residual streams too) against the fp32 CPU. Each GEMM
 * then rounds both operands to 8 significant bits (2^-9 relative per element, ~4e-3 per
 * product at worst), frozen weights and saved streams likewise; the errors of different
 * elements are independent and largely cancel in the GEMMs' and the loss's sums. Stated
 * tolerances: loss 2e-3 relative, gradients 5e-2 per tensor (measured on the CPU emulation of
 * the CUDA backend, 2026-11-23: losses within 3.5e-4, gradients within 1.9e-2, the worst a
 * LoRA A whose gradient sums B*T rows of products of two rounded operands). The rounding
 * itself is checked element by element, op by op, in test_cuda_ops.
 *
 * First, on the CPU and on the device (fp32, then bf16 GEMM operands): linears that read one
 * input run together (tz_linear_fwd_shared / _bwd_shared), 4-bit or dense, against the same
 * run one by one, to the bit where the arithmetic is the same (see shared_case). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/registry.h"
#include "core/backend.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "model/dit.h"
#include "model/flux.h"
#include "model/linear.h"
#include "model/llama.h"
#include "quant/codebook.h"
#include "quant/turboquant.h"
#include "tz_check.h"

static double TOL_LOSS = 2e-5, TOL_GRAD = 2e-4; /* fp32; main sets the bf16 ones */

static tz_backend *g_cpu, *g_gpu;

/* Random values for every parameter (quantized ones keep their codes), the same on both
 * backends: each tensor's draws come from its own stream. */
static void fill_random(tz_params *ps, tz_backend *be, uint64_t seed) {
    for (int i = 0; i < ps->n; i++) {
        tz_param *p = ps->p[i];
        if (p->q) continue;
        tz_rng r = tz_rng_make(seed, (uint64_t)i, TZ_RNG_TEST, 0);
        float *h = malloc((size_t)p->numel * sizeof *h);
        /* norm weights 1 +- 0.2, biases (Qwen2's q, k, v) +- 0.2 around zero: a key bias near 1
         * for every element would add a large q.b to every score of a query, which bf16
         * operands then round at 2^-9 of that size (the k projection's LoRA gradients of a
         * bf16 run err by 5.4e-2 there, against 1.4e-5 in fp32) */
        const size_t nl = strlen(p->name);
        const int bias = nl > 5 && !strcmp(p->name + nl - 5, ".bias");
        for (int64_t k = 0; k < p->numel; k++)
            h[k] = bias            ? 0.2f * (2.0f * tz_rng_uniform(&r) - 1.0f)
                   : p->ndim == 1 ? 1.0f + 0.2f * (2.0f * tz_rng_uniform(&r) - 1.0f)
                                  : 0.08f * (2.0f * tz_rng_uniform(&r) - 1.0f);
        tz_param_upload(be, p, h, 0, p->numel); /* bf16 where the GPU stores it so */
        free(h);
    }
}

/* Random codes and scales (0.02 to 0.06) for every quantized weight, the same on both
 * backends: a base that multiplies by zeros (a created weight's codes and scales before any
 * quantization, and the adaLN-Zero modulations) would leave its products, the fused narrow
 * kernel's among them, out of the comparison. */
static void fill_codes(tz_params *ps, tz_backend *be, uint64_t seed) {
    for (int i = 0; i < ps->n; i++) {
        tz_param *p = ps->p[i];
        if (!p->q || !p->q->codes || p->q->host) continue;
        const tz_qweight *q = p->q;
        const int64_t rows = p->shape[0], cols = p->shape[1], ng = rows * cols / q->group;
        const size_t cb = (size_t)tz_tq_codes_bytes(rows, cols, q->bits);
        tz_rng r = tz_rng_make(seed, (uint64_t)i, TZ_RNG_TEST, 1);
        uint8_t *c = malloc(cb);
        uint16_t *sc = malloc((size_t)ng * 2);
        for (size_t k = 0; k < cb; k++) c[k] = (uint8_t)tz_rng_below(&r, 256);
        for (int64_t k = 0; k < ng; k++)
            sc[k] = tz_f32_to_bf16(0.02f + 0.04f * tz_rng_uniform(&r));
        be->upload(be, q->codes, c, cb);
        be->upload(be, q->scales, sc, (size_t)ng * 2);
        free(c), free(sc);
    }
}

/* The gradient buffer of ps on be (zeroed by alloc). */
static float *bind(tz_params *ps, tz_backend *be) {
    float *g = be->alloc(be, (size_t)ps->flat_numel * sizeof(float));
    tz_params_bind_grads(ps, g);
    return g;
}

/* A second call on the GPU's model, the gradients zeroed between: its loss and gradients
 * must be the first call's bits (an op adding into a buffer left from the first call, whose
 * arena was all zeros then, shows here). first_grads downloads the first call's gradients and
 * zeroes grad for the second call; second_call_same compares and frees them. */
static float *first_grads(tz_params *ps, float *grad) {
    const int64_t F = ps->flat_numel;
    float *first = malloc((size_t)F * sizeof *first);
    g_gpu->download(g_gpu, first, grad, (size_t)F * sizeof *first);
    g_gpu->fill(g_gpu, grad, 0.0f, F);
    return first;
}
static void second_call_same(const char *what, double l1, double l2, tz_params *ps,
                             float *first, const float *grad) {
    const int64_t F = ps->flat_numel;
    float *again = malloc((size_t)F * sizeof *again);
    g_gpu->download(g_gpu, again, grad, (size_t)F * sizeof *again);
    const int same = l1 == l2 && !memcmp(first, again, (size_t)F * sizeof *again);
    free(again), free(first);
    check(same, "%s: a second call on the same model gives the first's loss and gradients, bit "
          "for bit", what);
}

/* second_call_same within the tolerances instead of to the bit: the loss relative TOL_LOSS,
 * the flat gradients TOL_GRAD of their largest element */
static void second_call_near(const char *what, double l1, double l2, tz_params *ps,
                             float *first, const float *grad) {
    const int64_t F = ps->flat_numel;
    float *again = malloc((size_t)F * sizeof *again);
    g_gpu->download(g_gpu, again, grad, (size_t)F * sizeof *again);
    double e = 0.0, s = 0.0;
    for (int64_t i = 0; i < F; i++) {
        const double d = fabs((double)again[i] - (double)first[i]);
        if (!(d <= e)) e = d;
        if (fabs((double)first[i]) > s) s = fabs((double)first[i]);
    }
    free(again), free(first);
    const double le = fabs(l1 - l2) / (fabs(l1) > 0 ? fabs(l1) : 1.0), ge = s > 0 ? e / s : e;
    check(le <= TOL_LOSS && ge <= TOL_GRAD, "%s: a second call's loss within %.2e and gradients "
          "within %.2e of the first's (tolerances %.0e, %.0e)", what, le, ge, TOL_LOSS, TOL_GRAD);
}

/* Loss and every trainable gradient of a (CPU) against b (GPU). */
static void compare(const char *what, double la, double lb, tz_params *a, tz_params *b) {
    double le = fabs(la - lb) / (fabs(la) > 0 ? fabs(la) : 1.0);
    check(le <= TOL_LOSS && isfinite(lb), "%s: loss cpu %.9g gpu %.9g (relative %.2e, tolerance %.0e)",
          what, la, lb, le, TOL_LOSS);
    double worst = 0.0;
    const char *wname = "-";
    int bad = 0, n = 0, zero = 0; /* zero: gradients that are 0 on the CPU (nothing compared) */
    for (int i = 0; i < a->n; i++) {
        tz_param *p = a->p[i], *q = b->p[i];
        if (!p->g) continue;
        n++;
        float *h = malloc((size_t)q->numel * sizeof *h);
        g_gpu->download(g_gpu, h, q->g, (size_t)q->numel * sizeof *h);
        double e = 0.0, s = 0.0;
        for (int64_t k = 0; k < p->numel; k++) {
            double d = fabs((double)h[k] - (double)p->g[k]);
            if (!(d <= e)) e = d; /* NaN: +inf below */
            if (fabs((double)p->g[k]) > s) s = fabs((double)p->g[k]);
        }
        free(h);
        zero += s == 0;
        double rel = e != e ? INFINITY : s > 0 ? e / s : e;
        if (!(rel <= TOL_GRAD)) {
            bad++;
            printf("     %s: %s: gradient error %.3e (max |cpu| %.3e)\n", what, p->name, rel, s);
        }
        if (!(rel <= worst)) worst = rel, wname = p->name;
    }
    check(bad == 0 && n > 0 && zero == 0,
          "%s: %d gradients (%d all zero), worst relative error %.2e (%s), tolerance %.0e", what,
          n, zero, worst, wname, TOL_GRAD);
}

/* Layers of the next llama_case (2 unless a case says), and whether its second call runs
 * with attention's forward again in the recomputation (TZ_ATT_KEEP=0) instead of the outputs
 * kept from the forward, which must give the same bits. */
static int64_t g_layers = 2;
static int g_keep_off_again;
static int64_t g_flux_singles; /* > 0: the next flux_case's single blocks (else flux-tiny's) */
static int64_t g_dit_depth = 2;  /* the next dit_case's blocks */
static int64_t g_dit_size = 8;   /* the next dit_case's latent side (8: 16 tokens, 16: 64) */
/* Whether the next dit_case's second call runs with TZ_FA_DS=0: dq's flash kernel computing the
 * score gradients again instead of reading those dk/dv's kept in the memory lent (fc2's input
 * gradient dg, read for the last time by then; core/backend.h, tz_attention_ds_group), which
 * on the emulation must give the same bits (a GPU's mma could round S = K Q^T and Q K^T
 * apart: within TOL_GRAD of the first call there). g_ds_kept counts the backward's calls lent
 * enough memory to keep dS. */
static int g_ds_off_again, g_ds_kept;
static void (*g_attb)(tz_backend *, float *, float *, float *, const float *, const float *,
                      const float *, const float *, const float *, const float *, int64_t,
                      int64_t, int64_t, int64_t, int64_t, int, int, const struct tz_att_ld *);
static void ds_count(tz_backend *be, float *dq, float *dk, float *dv, const float *dout,
                     const float *out, const float *lse, const float *q, const float *k,
                     const float *v, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D,
                     int causal, int acc, const struct tz_att_ld *ld) {
    const char *off = getenv("TZ_FA_DS"); /* (the backend's switch, read at every call) */
    g_ds_kept += be->att_ds && !(off && !strcmp(off, "0")) &&
                 tz_attention_ds_group(B, T, Hq, Hkv, causal, be->att_ds_bytes) > 0;
    g_attb(be, dq, dk, dv, dout, out, lse, q, k, v, B, T, Hq, Hkv, D, causal, acc, ld);
}

/* With checkpointing on the device: attention's outputs kept for the recomputation, the
 * first L - 2 layers' (`floats` each: a layer's output and lse) on the host */
static void keep_checked(const char *what, const tz_att_keep *k, int ckpt, int64_t L,
                         int64_t floats) {
    if (ckpt)
        check(k->on && k->host_bytes == (size_t)(L > 2 ? L - 2 : 0) * (size_t)floats * sizeof(float),
              "%s: attention's outputs kept for the recomputation, %zu bytes of them on the host",
              what, k->host_bytes);
}
/* g_keep_off_again: TZ_ATT_KEEP=0 set (on) around a model's set-up, then unset (off) with
 * the check that the set-up kept nothing */
static void keep_off(const char *what, const tz_att_keep *k, int on) {
    if (on) setenv("TZ_ATT_KEEP", "0", 1);
    if (on) return;
    unsetenv("TZ_ATT_KEEP");
    check(!k->on && !k->host_bytes, "%s: TZ_ATT_KEEP=0 keeps none", what);
}

/* arch: 0 Llama, 2 Qwen2 (q, k, v biases), 3 Qwen3 (q_norm, k_norm; head_dim 24, not 64 / 4) */
static void llama_case(const char *what, int tied, int64_t kv, int ckpt, int lora_bits,
                       int arch) {
    tz_llama_dims d;
    memset(&d, 0, sizeof d);
    d.vocab = 97, d.dim = 64, d.hidden = 192, d.n_layers = g_layers, d.n_heads = 4, d.n_kv_heads = kv;
    d.head_dim = arch == 3 ? 24 : 16, d.max_pos = 128, d.eps = 1e-5, d.theta = 10000.0;
    d.tied = tied, d.qkv_bias = arch == 2, d.qk_norm = arch == 3;
    tz_model_opts o;
    memset(&o, 0, sizeof o);
    o.checkpointing = ckpt;
    if (lora_bits) { /* < 0: LoRA on a dense base */
        if (lora_bits > 0) o.quant.bits = lora_bits, o.quant.group = 64, o.quant.seed = 5;
        o.lora.targets = (1 << TZ_LIN_N) - 1, o.lora.rank = 4, o.lora.alpha = 8;
    } else {
        o.full = 1;
    }
    const int64_t B = 2, T = 37;
    int32_t *in = malloc((size_t)(B * T) * sizeof *in), *tg = malloc((size_t)(B * T) * sizeof *tg);
    tz_rng r = tz_rng_make(11, 0, TZ_RNG_TEST, 1);
    for (int64_t i = 0; i < B * T; i++) {
        in[i] = (int32_t)tz_rng_below(&r, (uint64_t)d.vocab);
        tg[i] = i % 11 == 3 ? -1 : (int32_t)tz_rng_below(&r, (uint64_t)d.vocab); /* some ignored */
    }
    tz_llama *m[2];
    float *g[2];
    double loss[2];
    tz_backend *be[2] = {g_cpu, g_gpu};
    for (int k = 0; k < 2; k++) {
        m[k] = tz_llama_create(be[k], &d, &o);
        tz_llama_init_random(m[k], 3); /* the quantized base: the same codes on both */
        fill_random(&m[k]->params, be[k], 7);
        g[k] = bind(&m[k]->params, be[k]);
        tz_llama_setup(m[k], B, T);
        loss[k] = tz_llama_forward_backward(m[k], in, tg, 1.0f / (float)(B * T));
    }
    compare(what, loss[0], loss[1], &m[0]->params, &m[1]->params);
    keep_checked(what, &m[1]->keep, ckpt, d.n_layers, B * T * (d.n_heads * d.head_dim + d.n_heads));
    {
        float *first = first_grads(&m[1]->params, g[1]);
        if (g_keep_off_again) { /* the same model with attention's forward run again */
            keep_off(what, &m[1]->keep, 1);
            tz_llama_setup(m[1], B, T);
            keep_off(what, &m[1]->keep, 0);
        }
        const double l2 = tz_llama_forward_backward(m[1], in, tg, 1.0f / (float)(B * T));
        second_call_same(what, loss[1], l2, &m[1]->params, first, g[1]);
    }
    for (int k = 0; k < 2; k++) {
        be[k]->release(be[k], g[k]);
        tz_llama_free(m[k]);
    }
    free(in), free(tg);
}

/* Generation on the device: the logits of a prompt's pass (7 tokens, one piece) and of 10
 * decode steps after it (one token each, against the key/value cache), the tokens fed the same
 * on both backends, for a Llama with LoRA (B not zero) on a 4-bit TurboQuant base. With bf16
 * GEMMs every product of a step is on at most 64 rows, the fused narrow kernel's (the codes
 * decoded inside it) where the weight's side is wider (q, o, gate, up and down here; k and v,
 * 64 rows, are narrow GEMMs of the decoded weight): the GPU's logits against the CPU's fp32
 * ones within tol of the largest logit, and against the GPU's own with the kernel off
 * (TZ_TQ_FUSED=0's decode, then a GEMM). With bf16 GEMMs the device's key/value cache is bf16
 * (tz_llama_cache_init), the CPU's fp32, and the prompt's pass is attention's flash forward on
 * bf16 q, k, v. tol: bf16's, some six roundings of 2^-9 on a logit's way (the rotated inputs,
 * v's, gate's and up's bf16 outputs, the head's operands, the cached keys and values).
 * Measured (2026-11-28, the emulation): 3.91e-3 of the CPU's and 3.1e-4 of the kernel off
 * (with the prompt's pass over the cache in fp32, as before: 3.34e-3 and 9.8e-4). */
static void decode_logits(tz_backend *be, tz_llama *m, const int32_t *tok, int64_t P,
                          int64_t G, float *out) {
    const int64_t V = m->d.vocab;
    tz_llama_setup(m, 1, P);
    tz_llama_cache c;
    tz_llama_cache_init(m, &c, P + G);
    const float *lg = tz_llama_decode(m, &c, tok, P);
    for (int64_t g = 0; g < G; g++) {
        be->download(be, out + g * V, lg, (size_t)V * sizeof *out);
        if (g + 1 < G) lg = tz_llama_decode(m, &c, tok + P + g, 1);
    }
    tz_llama_cache_free(m, &c);
}
static double logit_err(const float *ref, const float *got, int64_t n) {
    double worst = 0, scale = 0;
    for (int64_t i = 0; i < n; i++) {
        const double e = fabs((double)got[i] - ref[i]);
        worst = e > worst || e != e ? e : worst;
        scale = fmax(scale, fabs(ref[i]));
    }
    return scale > 0 ? worst / scale : worst;
}
static void decode_case(const char *what, double tol) {
    tz_llama_dims d;
    memset(&d, 0, sizeof d);
    d.vocab = 97, d.dim = 128, d.hidden = 256, d.n_layers = 2, d.n_heads = 4, d.n_kv_heads = 2;
    d.head_dim = 32, d.max_pos = 128, d.eps = 1e-5, d.theta = 10000.0;
    tz_model_opts o;
    memset(&o, 0, sizeof o);
    o.quant.bits = 4, o.quant.group = 64, o.quant.seed = 5;
    o.lora.targets = (1 << TZ_LIN_N) - 1, o.lora.rank = 4, o.lora.alpha = 8;
    enum { P = 7, G = 10 };
    int32_t tok[P + G];
    tz_rng r = tz_rng_make(13, 0, TZ_RNG_TEST, 1);
    for (int i = 0; i < P + G; i++) tok[i] = (int32_t)tz_rng_below(&r, (uint64_t)d.vocab);
    float *lg[3];
    tz_backend *be[2] = {g_cpu, g_gpu};
    tz_llama *m[2];
    for (int k = 0; k < 2; k++) {
        m[k] = tz_llama_create(be[k], &d, &o);
        tz_llama_init_random(m[k], 3); /* the same codes on both */
        fill_random(&m[k]->params, be[k], 7);
    }
    for (int k = 0; k < 3; k++) lg[k] = malloc((size_t)(G * d.vocab) * sizeof(float));
    decode_logits(g_cpu, m[0], tok, P, G, lg[0]);
    decode_logits(g_gpu, m[1], tok, P, G, lg[1]);
    const int fused = g_gpu->tq_fused;
    g_gpu->tq_fused = 0;
    decode_logits(g_gpu, m[1], tok, P, G, lg[2]);
    g_gpu->tq_fused = fused;
    const double e_cpu = logit_err(lg[0], lg[1], G * d.vocab);
    const double e_off = logit_err(lg[2], lg[1], G * d.vocab);
    check(e_cpu <= tol && e_off <= tol,
          "%s: a prompt's pass and 10 decode steps, the logits within %.2e of the largest of the "
          "CPU's and %.2e of the device's with TZ_TQ_FUSED=0 (tolerance %.0e)", what, e_cpu,
          e_off, tol);
    for (int k = 0; k < 2; k++) tz_llama_free(m[k]);
    for (int k = 0; k < 3; k++) free(lg[k]);
}

/* lora: 0 full training; -1 LoRA on every projection of a dense base; > 0 of a base quantized
 * to that many bits (TurboQuant). ckpt: activation checkpointing. */
static void dit_case(const char *what, int lora, int ckpt) {
    tz_dit_dims d;
    char err[128];
    if (tz_dit_preset("tiny", &d, err, sizeof err)) check(0, "%s", err);
    d.input_size = g_dit_size, d.in_channels = 4, d.patch_size = 2, d.hidden = 64,
    d.depth = g_dit_depth;
    d.num_heads = 4, d.num_classes = 10, d.learn_sigma = 1; /* DiT-XL/2's layout, small */
    tz_model_opts o;
    memset(&o, 0, sizeof o);
    o.checkpointing = ckpt;
    if (lora) {
        if (lora > 0) o.quant.bits = lora, o.quant.group = 64, o.quant.seed = 5;
        o.lora.targets = (1 << TZ_DIT_LIN_N) - 1, o.lora.rank = 4, o.lora.alpha = 8;
    } else {
        o.full = 1;
    }
    const int64_t n = 3, numel = tz_dit_image_numel(&d);
    float *x = malloc((size_t)(n * numel) * sizeof *x), *tgt = malloc((size_t)(n * numel) * sizeof *tgt);
    float t[3] = {17.0f, 500.0f, 999.0f};
    int32_t y[3] = {1, 7, tz_dit_null_class(&d)};
    tz_rng r = tz_rng_make(13, 0, TZ_RNG_TEST, 2);
    for (int64_t i = 0; i < n * numel; i++) x[i] = (float)tz_rng_normal(&r), tgt[i] = (float)tz_rng_normal(&r);
    tz_dit *m[2];
    float *g[2];
    double loss[2];
    tz_backend *be[2] = {g_cpu, g_gpu};
    g_attb = g_gpu->attention_bwd, g_gpu->attention_bwd = ds_count, g_ds_kept = 0;
    for (int k = 0; k < 2; k++) {
        m[k] = tz_dit_create(be[k], &d, &o);
        fill_random(&m[k]->params, be[k], 9); /* adaLN-Zero would zero most gradients */
        fill_codes(&m[k]->params, be[k], 10);
        g[k] = bind(&m[k]->params, be[k]);
        tz_dit_setup(m[k], n);
        loss[k] = tz_dit_forward_backward(m[k], x, t, y, tgt, 1.0f / (float)(n * numel));
    }
    g_gpu->attention_bwd = g_attb;
    const char *env = getenv("TZ_FA_DS"); /* (0 for the whole run: nothing kept) */
    char *saved = env ? strdup(env) : NULL;
    if (g_ds_off_again)
        check(g_ds_kept == (saved && !strcmp(saved, "0") ? 0 : d.depth), "%s: dS kept by "
              "attention's backward in fc2's input gradient, lent, in %d of %lld blocks", what,
              g_ds_kept, (long long)d.depth);
    compare(what, loss[0], loss[1], &m[0]->params, &m[1]->params);
    keep_checked(what, &m[1]->keep, ckpt, d.depth,
                 n * tz_dit_tokens(&d) * (d.hidden + d.num_heads));
    {
        float *first = first_grads(&m[1]->params, g[1]);
        if (g_keep_off_again) { /* the same model with attention's forward run again */
            keep_off(what, &m[1]->keep, 1);
            tz_dit_setup(m[1], n);
            keep_off(what, &m[1]->keep, 0);
        }
        if (g_ds_off_again) setenv("TZ_FA_DS", "0", 1);
        const double l2 = tz_dit_forward_backward(m[1], x, t, y, tgt, 1.0f / (float)(n * numel));
        if (g_ds_off_again && saved) setenv("TZ_FA_DS", saved, 1);
        else if (g_ds_off_again) unsetenv("TZ_FA_DS");
        tz_device_info di;
        g_gpu->device_info(g_gpu, &di);
        if (g_ds_off_again && !strstr(di.name, "CPU emulation")) /* a GPU: within tolerance */
            second_call_near(what, loss[1], l2, &m[1]->params, first, g[1]);
        else second_call_same(what, loss[1], l2, &m[1]->params, first, g[1]);
    }
    free(saved);
    for (int k = 0; k < 2; k++) {
        be[k]->release(be[k], g[k]);
        tz_dit_free(m[k]);
    }
    free(x), free(tgt);
}

/* flux-tiny (2 double and 2 single blocks, 4 heads of 16, guidance) on n samples of 12 image
 * and 5 text tokens: lora 0, full fine-tuning of a dense model; > 0, LoRA on every linear of
 * a base of that many bits (on a device with bf16 GEMMs: GELU's input and V in bf16 from
 * their GEMMs, attention on bf16 inputs) */
static void flux_case(const char *what, int lora, int ckpt, int64_t n) {
    tz_flux_dims d;
    char err[128];
    if (tz_flux_preset("flux-tiny", &d, err, sizeof err)) check(0, "%s", err);
    if (g_flux_singles > 0) d.single_layers = g_flux_singles;
    tz_model_opts o;
    memset(&o, 0, sizeof o);
    o.checkpointing = ckpt;
    if (lora) {
        o.quant.bits = lora, o.quant.group = 64, o.quant.seed = 5;
        o.lora.targets = (1u << TZ_FLUX_LIN_N) - 1, o.lora.rank = 4, o.lora.alpha = 8;
    } else {
        o.full = 1;
    }
    const int64_t Ti = 12, Tt = 5;
    const int64_t nx = n * Ti * d.in_channels, nt = n * Tt * d.joint_dim, ny = n * Ti * d.out_channels;
    float *x = malloc((size_t)(nx + nt + n * d.pooled_dim + 2 * n + 3 * (Ti + Tt) + ny) * sizeof *x);
    float *txt = x + nx, *pooled = txt + nt, *sigma = pooled + n * d.pooled_dim, *guid = sigma + n;
    float *ids = guid + n, *tgt = ids + 3 * (Ti + Tt);
    tz_rng r = tz_rng_make(17, 0, TZ_RNG_TEST, 3);
    for (int64_t i = 0; i < nx + nt + n * d.pooled_dim; i++) x[i] = (float)tz_rng_normal(&r);
    for (int64_t b = 0; b < n; b++) sigma[b] = 0.3f + 0.4f * (float)b, guid[b] = 3.5f;
    for (int64_t t = 0; t < Tt; t++) ids[3 * t] = ids[3 * t + 1] = ids[3 * t + 2] = 0.0f;
    for (int64_t t = 0; t < Ti; t++) { /* image tokens on a 3 x 4 grid */
        float *p = ids + 3 * (Tt + t);
        p[0] = 0.0f, p[1] = (float)(t / 4), p[2] = (float)(t % 4);
    }
    for (int64_t i = 0; i < ny; i++) tgt[i] = (float)tz_rng_normal(&r);
    const tz_flux_batch in = {x, txt, pooled, sigma, guid, ids + 3 * Tt, ids};
    tz_flux *m[2];
    float *g[2];
    double loss[2];
    tz_backend *be[2] = {g_cpu, g_gpu};
    for (int k = 0; k < 2; k++) {
        m[k] = tz_flux_create(be[k], &d, &o);
        fill_random(&m[k]->params, be[k], 11);
        fill_codes(&m[k]->params, be[k], 12);
        g[k] = bind(&m[k]->params, be[k]);
        tz_flux_setup(m[k], n, Ti, Tt);
        loss[k] = tz_flux_forward_backward(m[k], &in, tgt, 1.0f / (float)ny);
    }
    compare(what, loss[0], loss[1], &m[0]->params, &m[1]->params);
    keep_checked(what, &m[1]->keep, ckpt, d.layers + d.single_layers,
                 n * (Ti + Tt) * (tz_flux_inner(&d) + d.heads));
    {
        float *first = first_grads(&m[1]->params, g[1]);
        if (g_keep_off_again) { /* the same model with attention's forward run again */
            keep_off(what, &m[1]->keep, 1);
            tz_flux_setup(m[1], n, Ti, Tt);
            keep_off(what, &m[1]->keep, 0);
        }
        const double l2 = tz_flux_forward_backward(m[1], &in, tgt, 1.0f / (float)ny);
        second_call_same(what, loss[1], l2, &m[1]->params, first, g[1]);
    }
    for (int k = 0; k < 2; k++) {
        be[k]->release(be[k], g[k]);
        tz_flux_free(m[k]);
    }
    free(x);
}

/* ---- linears that read one input (tz_linear_fwd_shared, tz_linear_bwd_shared) ----
 * Three TurboQuant linears of one rotation on one x, as q, k and v read it (one without an
 * adapter, one with a bias, every weight trainable straight-through as in full fine-tuning),
 * run separately and shared on one backend: the forward must give the same bits (one rotation
 * and one rounding of x for all, the bits each call would make); the backward the same
 * weight, bias and LoRA gradients to the bit, and dx, whose inverse rotation is taken once of
 * the sum instead of once per linear, within fp32 rounding (1e-5 of its largest element). */
static float *dev_rand(tz_backend *be, tz_rng *r, int64_t n, float amp) {
    float *h = malloc((size_t)n * sizeof *h), *d = be->alloc(be, (size_t)n * sizeof *h);
    for (int64_t i = 0; i < n; i++) h[i] = amp * (2.0f * tz_rng_uniform(r) - 1.0f);
    be->upload(be, d, h, (size_t)n * sizeof *h);
    free(h);
    return d;
}
static void put_rand(tz_backend *be, tz_rng *r, tz_param *p, float amp) {
    float *h = malloc((size_t)p->numel * sizeof *h);
    for (int64_t i = 0; i < p->numel; i++) h[i] = amp * (2.0f * tz_rng_uniform(r) - 1.0f);
    tz_param_upload(be, p, h, 0, p->numel);
    free(h);
}
static float *host_of(tz_backend *be, const float *d, int64_t n) {
    float *h = malloc((size_t)n * sizeof *h);
    be->download(be, h, d, (size_t)n * sizeof *h);
    return h;
}
static int dev_same(tz_backend *be, const float *a, const float *b, int64_t n) {
    float *x = host_of(be, a, n), *y = host_of(be, b, n);
    int same = !memcmp(x, y, (size_t)n * sizeof *x);
    free(x), free(y);
    return same;
}

/* mode: 0 TurboQuant 4-bit weights (trainable straight-through); 1 dense frozen weights
 * (bf16 storage with bf16 GEMM operands) under LoRA; 2 dense trainable weights; 3 TurboQuant
 * 4-bit frozen under LoRA (the 7B recipe: x rounded for the A gradients after the inverse
 * rotation). Dense weights share x rounded once (bf16 GEMM operands only) and keep the
 * separate calls' order in backward: every result to the bit, dx too. */
static void shared_case(tz_backend *be, const char *what0, int mode) {
    static const char *const modes[] = {"4-bit TurboQuant", "dense frozen + LoRA",
                                        "dense trained", "4-bit frozen + LoRA"};
    const int dense = mode == 1 || mode == 2;
    char what[96];
    snprintf(what, sizeof what, "%s, %s", what0, modes[mode]);
    enum { NL = 3 };
    const int64_t in = 256, n = 7, r = 4, outs[NL] = {128, 64, 64};
    const int group = 128, bits = 4;
    char err[200];
    tz_tq_codebook cb;
    float levels[16];
    tz_tq_codebook_init(&cb, bits, err, sizeof err);
    tz_tq_levels(TZ_TQ_TURBOQUANT, bits, &cb, levels);
    tz_rng rng = tz_rng_make(21, 0, TZ_RNG_TEST, 3);
    tz_params ps;
    tz_params_init(&ps);
    /* sc: the scratch as a model plans it (tz_linear_act_floats); small: n x in floats, the
     * rotation's own (none for dense weights), which leaves the backward no room for its bf16
     * copies (every GEMM then rounds its fp32 operands itself) */
    const int64_t tile = 128 * (in + tz_linear_fold_cols(be, r, 1)); /* LoRA's, the bias's */
    tz_tq_scratch sc = {be->alloc(be, (size_t)tile * 4), tile, NULL, 0};
    tz_tq_scratch small = {be->alloc(be, (size_t)(128 * in) * 4), 128 * in,
                           be->alloc(be, (size_t)(n * in) * 4), dense ? 0 : n * in};
    tz_linear lin[NL];
    const tz_linear *ls[NL];
    float *y[3][NL], *h[2][NL], *dy[NL];
    for (int i = 0; i < NL; i++) {
        const int64_t out = outs[i];
        char name[32];
        float *w = malloc((size_t)(out * in) * sizeof *w);
        for (int64_t k = 0; k < out * in; k++) w[k] = (float)(0.05 * tz_rng_normal(&rng));
        snprintf(name, sizeof name, "w%d", i);
        tz_param *pq;
        if (dense) {
            pq = tz_params_add(&ps, be, name, 2, out, in, dense == 2, 1, 0);
            tz_param_upload(be, pq, w, 0, out * in);
        } else {
            tz_tq_tensor t;
            tz_tq_tensor_init(&t, bits, group, out, in, 5, err, sizeof err);
            tz_tq_quantize_as(&t, TZ_TQ_TURBOQUANT, &cb, w);
            pq = tz_params_add_quant(&ps, be, name, out, in, TZ_TQ_TURBOQUANT, bits, group, 5,
                                     levels);
            be->upload(be, pq->q->codes, t.codes, (size_t)tz_tq_codes_bytes(out, in, bits));
            be->upload(be, pq->q->scales, t.scales,
                       (size_t)tz_tq_scales_count(out, in, group) * 2);
            tz_tq_tensor_free(&t);
        }
        if (mode == 0 || mode == 2) pq->g = be->alloc(be, (size_t)(out * in) * 4);
        free(w);
        lin[i] = (tz_linear){.in = in, .out = out, .w = pq, .tq = &sc};
        if (i != 1) { /* k without an adapter */
            snprintf(name, sizeof name, "a%d", i);
            lin[i].a = tz_params_add(&ps, be, name, 2, r, in, 1, 1, 1);
            snprintf(name, sizeof name, "b%d", i);
            lin[i].b = tz_params_add(&ps, be, name, 2, out, r, 1, 1, 1);
            put_rand(be, &rng, lin[i].a, 0.2f), put_rand(be, &rng, lin[i].b, 0.2f);
            lin[i].a->g = be->alloc(be, (size_t)(r * in) * 4);
            lin[i].b->g = be->alloc(be, (size_t)(out * r) * 4);
            lin[i].r = r, lin[i].scale = 0.75f;
        }
        if (i == 2) { /* v with a bias */
            lin[i].bias = tz_params_add(&ps, be, "bias2", 1, out, 1, 1, 1, 0);
            put_rand(be, &rng, lin[i].bias, 0.2f);
            lin[i].bias->g = be->alloc(be, (size_t)out * 4);
        }
        ls[i] = &lin[i];
        for (int k = 0; k < 3; k++) y[k][i] = be->alloc(be, (size_t)(n * out) * 4);
        for (int k = 0; k < 2; k++) h[k][i] = be->alloc(be, (size_t)(n * r) * 4);
        dy[i] = dev_rand(be, &rng, n * out, 1.0f);
    }
    float *x = dev_rand(be, &rng, n * in, 1.0f), *dx0 = dev_rand(be, &rng, n * in, 0.5f);
    int64_t act = n * in; /* the forward's rotation at least (the test's fallbacks use it) */
    for (int i = 0; i <= NL; i++) {
        const int64_t f = tz_linear_act_floats(be, i < NL ? ls + i : ls, i < NL ? 1 : NL, n, 1);
        act = f > act ? f : act;
    }
    sc.act = be->alloc(be, (size_t)act * 4), sc.act_floats = act;
    float *dx[3];
    for (int k = 0; k < 3; k++) dx[k] = be->alloc(be, (size_t)(n * in) * 4);
    float *scr = be->alloc(be, (size_t)(n * r) * 4);
    /* forward */
    for (int i = 0; i < NL; i++) tz_linear_fwd(be, ls[i], y[0][i], lin[i].a ? h[0][i] : NULL, x, n);
    float *hs1[NL] = {h[1][0], NULL, h[1][2]};
    tz_linear_fwd_shared(be, ls, y[1], hs1, NL, x, n);
    int same = 1;
    for (int i = 0; i < NL; i++) {
        same &= dev_same(be, y[0][i], y[1][i], n * outs[i]);
        if (lin[i].a) same &= dev_same(be, h[0][i], h[1][i], n * r);
    }
    check(same, "%s: shared forward of 3 linears = the separate forwards, bit for bit", what);
    /* the same forward on a backend without tq_matmul_lora and matmul_lora: two GEMMs (base,
     * then y += s h B^T) and a bias pass instead of one GEMM along K. The same bits where
     * nothing is folded (fp32 GEMMs); folded (bf16 GEMMs: TurboQuant or dense weights), s B,
     * h and the bias rounded to bf16 inside the one GEMM: within 4e-3 of the largest output,
     * and not the same bits (the fold ran) */
    void (*lora_op)(tz_backend *, float *, uint16_t *, int64_t, const float *, const float *,
                    int64_t, float, float *, const uint8_t *, const uint16_t *, const float *,
                    int64_t, int64_t, int, int, int64_t, const float *, int) = be->tq_matmul_lora;
    void (*dense_op)(tz_backend *, float *, const void *, int, const void *, int, const float *,
                     const float *, int64_t, float, const float *, int64_t, int64_t, int64_t) =
        be->matmul_lora;
    be->tq_matmul_lora = NULL;
    be->matmul_lora = NULL;
    float *hx = be->alloc(be, (size_t)(n * r) * 4);
    for (int i = 0; i < NL; i++) tz_linear_fwd(be, ls[i], y[2][i], lin[i].a ? hx : NULL, x, n);
    be->tq_matmul_lora = lora_op;
    be->matmul_lora = dense_op;
    be->release(be, hx);
    const int folded = tz_linear_fold_cols(be, r, 1) > 0;
    double fe = 0.0, fm = 0.0;
    int fsame = 1;
    for (int i = 0; i < NL; i++) {
        float *a = host_of(be, y[0][i], n * outs[i]), *b = host_of(be, y[2][i], n * outs[i]);
        for (int64_t k = 0; k < n * outs[i]; k++) {
            fe = fmax(fe, fabs((double)a[k] - (double)b[k]));
            fm = fmax(fm, fabs((double)b[k]));
        }
        fsame &= !memcmp(a, b, (size_t)(n * outs[i]) * 4);
        free(a), free(b);
    }
    if (folded)
        check(!fsame && fe <= 4e-3 * fm, "%s: LoRA folded into the base GEMM: within %.1e of the "
              "largest output of the two GEMMs' (4e-3), not the same bits", what, fe / fm);
    else
        check(fsame, "%s: nothing folded (fp32 GEMMs): the two GEMMs' bits", what);
    /* backward: the gradients of each way kept on the host, then compared: 0 the separate
     * calls, 1 the shared call (both with the planned scratch), 2 the separate calls without
     * room for the backward's bf16 copies of dy and x */
    float *gh[3][3 * NL + 1];
    const float sentinel = 1234.5f;
    int64_t kept = 0; /* words past the rotation's n x in the shared backward left alone */
    const int64_t rot = dense ? 0 : n * in;
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < ps.n; i++)
            if (ps.p[i]->g) be->fill(be, ps.p[i]->g, 0.0f, ps.p[i]->numel);
        be->copy(be, dx[k], dx0, (size_t)(n * in) * 4);
        const float *hk[NL] = {h[k & 1][0], NULL, h[k & 1][2]}, *dys[NL] = {dy[0], dy[1], dy[2]};
        for (int i = 0; i < NL; i++) lin[i].tq = k == 2 ? &small : &sc;
        if (k == 1) be->fill(be, sc.act, sentinel, act);
        if (k != 1)
            for (int i = 0; i < NL; i++) tz_linear_bwd(be, ls[i], dx[k], dy[i], x, hk[i], scr, n);
        else tz_linear_bwd_shared(be, ls, NL, dx[1], dys, x, hk, scr, n, 0);
        if (k == 1) {
            float *a = host_of(be, sc.act, act);
            for (int64_t w = rot; w < act; w++) kept += a[w] == sentinel;
            free(a);
        }
        int j = 0;
        for (int i = 0; i < ps.n; i++)
            if (ps.p[i]->g) gh[k][j++] = host_of(be, ps.p[i]->g, ps.p[i]->numel);
        gh[k][j] = host_of(be, dx[k], n * in);
    }
    for (int i = 0; i < NL; i++) lin[i].tq = &sc;
    /* each dy given already in bf16 (as swiglu_bwd writes them; v's fp32 dy too, for its bias
     * gradient), with the planned scratch (way 1's bits) and, for dense weights, with the
     * small one (the separate calls, way 2's): every gradient and dx those bits */
    int d16same = 1, d16runs = 0;
    for (int k = 1; k <= 1 + dense && tz_linear_rounds_bf16(be); k++, d16runs++) {
        for (int i = 0; i < ps.n; i++)
            if (ps.p[i]->g) be->fill(be, ps.p[i]->g, 0.0f, ps.p[i]->numel);
        be->copy(be, dx[2], dx0, (size_t)(n * in) * 4);
        uint16_t *d16[NL];
        for (int i = 0; i < NL; i++) {
            d16[i] = be->alloc(be, (size_t)(n * outs[i]) * 2);
            be->to_bf16(be, d16[i], dy[i], n * outs[i]);
            lin[i].tq = k == 2 ? &small : &sc;
        }
        const float *hk[NL] = {h[k & 1][0], NULL, h[k & 1][2]}, *dyb[NL] = {NULL, NULL, dy[2]};
        const uint16_t *d16c[NL] = {d16[0], d16[1], d16[2]};
        tz_linear_bwd_shared16(be, ls, NL, dx[2], dyb, d16c, x, hk, scr, n, 0);
        int j = 0;
        for (int i = 0; i < ps.n; i++)
            if (ps.p[i]->g) {
                float *g = host_of(be, ps.p[i]->g, ps.p[i]->numel);
                d16same &= !memcmp(g, gh[k][j++], (size_t)ps.p[i]->numel * 4);
                free(g);
            }
        float *g = host_of(be, dx[2], n * in);
        d16same &= !memcmp(g, gh[k][j], (size_t)(n * in) * 4);
        free(g);
        for (int i = 0; i < NL; i++) be->release(be, d16[i]), lin[i].tq = &sc;
    }
    if (d16runs)
        check(d16same, "%s: dy given in bf16: every gradient and dx = the fp32 dy's, bit for bit "
              "(%s)", what, dense ? "planned scratch and without room" : "planned scratch");
    /* x given in bf16 (tz_linear_bwd_set_x16, as the Llama's chunked backward gives the down
     * projection SwiGLU's output): each linear's gradients and dx those of its fp32 x, bit for
     * bit, quantized weights included (their backward reads x in GEMMs only) */
    if (tz_linear_rounds_bf16(be)) {
        uint16_t *x16 = be->alloc(be, (size_t)(n * in) * 2);
        be->to_bf16(be, x16, x, n * in);
        const float *hx16[NL] = {h[0][0], NULL, h[0][2]};
        int x16same = 1;
        for (int i = 0; i < NL; i++) {
            float *got[2][3 * NL + 1];
            int ng16 = 0;
            for (int w = 0; w < 2; w++) {
                for (int p = 0; p < ps.n; p++)
                    if (ps.p[p]->g) be->fill(be, ps.p[p]->g, 0.0f, ps.p[p]->numel);
                if (w) tz_linear_bwd_set_x16(be, ls[i], dx[2], dy[i], NULL, x16, hx16[i], scr, n);
                else tz_linear_bwd_set(be, ls[i], dx[2], dy[i], x, hx16[i], scr, n);
                ng16 = 0;
                for (int p = 0; p < ps.n; p++)
                    if (ps.p[p]->g) got[w][ng16++] = host_of(be, ps.p[p]->g, ps.p[p]->numel);
                got[w][ng16] = host_of(be, dx[2], n * in);
            }
            for (int j = 0, p = 0; p < ps.n; p++)
                if (ps.p[p]->g) {
                    x16same &= !memcmp(got[0][j], got[1][j], (size_t)ps.p[p]->numel * 4);
                    free(got[0][j]), free(got[1][j]), j++;
                }
            x16same &= !memcmp(got[0][ng16], got[1][ng16], (size_t)(n * in) * 4);
            free(got[0][ng16]), free(got[1][ng16]);
        }
        be->release(be, x16);
        check(x16same, "%s: x given in bf16 (tz_linear_bwd_set_x16): each linear's gradients and "
              "dx = the fp32 x's, bit for bit", what);
    }
    /* with bf16 GEMM operands the backward rounds dy (and x) once into the scratch past the
     * rotation's place; a backend whose GEMMs are fp32 leaves it alone */
    const int rounds = be->matmul_dtype == TZ_DT_BF16 && ((be->matmul_dtypes >> TZ_DT_BF16) & 1u);
    check(rounds ? act > rot && kept < act - rot : kept == act - rot,
          "%s: the backward's bf16 copies %s the scratch past the rotation's place (%lld of "
          "%lld words kept)", what, rounds ? "written into" : "not in", (long long)kept,
          (long long)(act - rot));
    int ng = 0, gsame = 1, rsame = 1;
    for (int i = 0; i < ps.n; i++)
        if (ps.p[i]->g) {
            gsame &= !memcmp(gh[0][ng], gh[1][ng], (size_t)ps.p[i]->numel * 4);
            rsame &= !memcmp(gh[0][ng], gh[2][ng], (size_t)ps.p[i]->numel * 4);
            ng++;
        }
    rsame &= !memcmp(gh[0][ng], gh[2][ng], (size_t)(n * in) * 4);
    check(rsame, "%s: dy and x rounded once for the backward's GEMMs: every gradient and dx "
                 "= each GEMM rounding its own, bit for bit", what);
    double e = 0.0, mx = 0.0;
    for (int64_t k = 0; k < n * in; k++) {
        e = fmax(e, fabs((double)gh[0][ng][k] - (double)gh[1][ng][k]));
        mx = fmax(mx, fabs((double)gh[0][ng][k]));
    }
    check(gsame && ng == (mode == 0 || mode == 2 ? 3 : 0) + 2 * 2 + 1,
          "%s: shared backward: %d weight, bias and LoRA gradients = the separate ones, bit for bit",
          what, ng);
    if (dense)
        check(e == 0, "%s: shared backward: dx = the separate calls', bit for bit", what);
    else
        check(e <= 1e-5 * mx, "%s: shared backward: dx within %.1e of its largest element (1e-5)",
              what, e / mx);
    /* dx written instead of added to (tz_linear_bwd_set first, then added; the shared call
     * with dx_set), over NaN: the values of the same calls adding into zeros, every element
     * (+0 and -0 alike) */
    int wsame = 1;
    const float *hk0[NL] = {h[0][0], NULL, h[0][2]}, *dys0[NL] = {dy[0], dy[1], dy[2]};
    for (int shared = 0; shared < 2; shared++) {
        float *got[2];
        for (int set = 0; set < 2; set++) {
            be->fill(be, dx[2], set ? NAN : 0.0f, n * in);
            for (int i = 0; i < ps.n; i++)
                if (ps.p[i]->g) be->fill(be, ps.p[i]->g, 0.0f, ps.p[i]->numel);
            if (shared) tz_linear_bwd_shared(be, ls, NL, dx[2], dys0, x, hk0, scr, n, set);
            else
                for (int i = 0; i < NL; i++)
                    (set && !i ? tz_linear_bwd_set : tz_linear_bwd)(be, ls[i], dx[2], dy[i], x,
                                                                   hk0[i], scr, n);
            got[set] = host_of(be, dx[2], n * in);
        }
        for (int64_t k = 0; k < n * in; k++) wsame &= got[1][k] == got[0][k];
        free(got[0]), free(got[1]);
    }
    check(wsame, "%s: dx written (the separate calls and the shared one) = added into zeros, "
          "over NaN", what);
    for (int k = 0; k < 3; k++)
        for (int j = 0; j <= ng; j++) free(gh[k][j]);
    for (int i = 0; i < NL; i++) {
        for (int k = 0; k < 3; k++) be->release(be, y[k][i]);
        for (int k = 0; k < 2; k++) be->release(be, h[k][i]);
        be->release(be, dy[i]);
    }
    for (int i = 0; i < ps.n; i++)
        if (ps.p[i]->g) be->release(be, ps.p[i]->g);
    be->release(be, x), be->release(be, dx0);
    for (int k = 0; k < 3; k++) be->release(be, dx[k]);
    be->release(be, scr), be->release(be, sc.tile), be->release(be, sc.act);
    be->release(be, small.act), be->release(be, small.tile);
    tz_params_free(&ps, be);
}

int main(void) {
    int n = tz_cuda_device_count();
    if (n <= 0) {
        printf("skip: %s\n", n < 0 ? "this build has no CUDA backend" : "no CUDA device");
        return 77;
    }
    g_cpu = tz_backend_create(TZ_DEVICE_CPU, 0, 2);
    g_gpu = tz_backend_create(TZ_DEVICE_CUDA, 0, 0);
    for (int mode = 0; mode < 4; mode++) {
        shared_case(g_cpu, "cpu", mode);
        shared_case(g_gpu, "gpu fp32", mode);
        g_gpu->matmul_dtype = TZ_DT_BF16;
        shared_case(g_gpu, "gpu bf16", mode);
        if (mode == 3) { /* each adapter's GEMM on the transposed dh, without the stack */
            tz_linear_set_stacking(0);
            shared_case(g_gpu, "gpu bf16, LoRA stack off", mode);
            tz_linear_set_stacking(-1);
        }
        g_gpu->matmul_dtype = TZ_DT_F32;
    }
    llama_case("llama tied, GQA 4/2, full", 1, 2, 0, 0, 0);
    llama_case("llama untied, 4/4 heads, full, checkpointing", 0, 4, 1, 0, 0);
    llama_case("llama untied, GQA 4/2, LoRA on 4-bit TurboQuant, checkpointing", 0, 2, 1, 4, 0);
    llama_case("qwen2 tied, GQA 4/2, full, checkpointing", 1, 2, 1, 0, 2);
    llama_case("qwen3 untied, GQA 4/2, head_dim 24, full, checkpointing", 0, 2, 1, 0, 3);
    /* four layers: the first two's attention outputs go to the host and come back for the
     * recomputation (the residual streams stay on the device in fp32, so only the model's
     * own events order those copies); the second call runs attention's forward again there */
    g_layers = 4, g_keep_off_again = 1;
    llama_case("llama untied, GQA 4/2, 4 layers, LoRA on 4-bit TurboQuant, checkpointing, "
               "second call with TZ_ATT_KEEP=0", 0, 2, 1, 4, 0);
    g_layers = 2, g_keep_off_again = 0;
    /* flux-tiny with four single blocks: two double and two single blocks' attention outputs
     * go to the host and back (fp32: only the model's own events order those copies) */
    g_flux_singles = 4, g_keep_off_again = 1;
    flux_case("flux-tiny, 4 single blocks, LoRA on a 4-bit base, 1 sample, checkpointing, "
              "second call with TZ_ATT_KEEP=0", 4, 1, 1);
    g_flux_singles = 0, g_keep_off_again = 0;
    g_dit_depth = 4, g_keep_off_again = 1; /* the first two blocks' outputs through the host */
    dit_case("dit, 4 blocks, LoRA on a dense base, checkpointing, second call with TZ_ATT_KEEP=0",
             -1, 1);
    g_dit_depth = 2, g_keep_off_again = 0;
    dit_case("dit 8x8x4, patch 2, learned sigma, full", 0, 0);
    dit_case("dit, LoRA on a dense base, checkpointing", -1, 1);
    /* bf16 GEMM operands and bf16 storage on the GPU, against the fp32 CPU */
    g_gpu->matmul_dtype = TZ_DT_BF16;
    TOL_LOSS = 2e-3, TOL_GRAD = 5e-2;
    llama_case("bf16: llama tied, GQA 4/2, full", 1, 2, 0, 0, 0);
    llama_case("bf16: llama untied, GQA 4/2, LoRA on a dense base, checkpointing", 0, 2, 1, -1, 0);
    llama_case("bf16: llama untied, GQA 4/2, LoRA on 4-bit TurboQuant, checkpointing", 0, 2, 1, 4, 0);
    llama_case("bf16: qwen2 tied, LoRA on 4-bit TurboQuant, checkpointing", 1, 2, 1, 4, 2);
    llama_case("bf16: qwen3 untied, head_dim 24, full, checkpointing", 0, 2, 1, 0, 3);
    /* the same with the residual streams on the host in bf16 */
    g_layers = 4, g_keep_off_again = 1;
    llama_case("bf16: llama untied, GQA 4/2, 4 layers, LoRA on 4-bit TurboQuant, checkpointing, "
               "second call with TZ_ATT_KEEP=0", 0, 2, 1, 4, 0);
    g_layers = 2, g_keep_off_again = 0;
    dit_case("bf16: dit 8x8x4, patch 2, learned sigma, full", 0, 0);
    /* the inputs of qkv, fc1 and fc2 kept in bf16 (dense weights), LoRA's A reading them too;
     * and a quantized base, which keeps them in fp32 for its rotation */
    dit_case("bf16: dit, LoRA on a dense base, checkpointing", -1, 1);
    dit_case("bf16: dit, LoRA on 4-bit TurboQuant", 4, 0);
    /* 64 tokens: fc2's input gradient (3 x 64 x 256 floats) holds dS's 12 (sample, head)
     * pairs, one 64 x 64 tile each (16 tokens' 48 rows would hold 6) */
    g_dit_size = 16, g_ds_off_again = 1;
    dit_case("bf16: dit 16x16x4, full, dS kept, second call with TZ_FA_DS=0", 0, 0);
    g_dit_size = 8, g_ds_off_again = 0;
    g_dit_depth = 4, g_keep_off_again = 1;
    dit_case("bf16: dit, 4 blocks, LoRA on 4-bit TurboQuant, checkpointing, second call with "
             "TZ_ATT_KEEP=0", 4, 1);
    g_dit_depth = 2, g_keep_off_again = 0;
    /* Flux on a 4-bit base: GELU's input and a single block's V written in bf16 by their
     * GEMMs, attention on bf16 inputs (Q and K from the norms with RoPE), against the CPU */
    flux_case("bf16: flux-tiny, LoRA on every linear of a 4-bit base, 2 samples", 4, 0, 2);
    flux_case("bf16: flux-tiny, LoRA on a 4-bit base, 1 sample, checkpointing", 4, 1, 1);
    g_flux_singles = 4, g_keep_off_again = 1; /* the same with the streams on the host */
    flux_case("bf16: flux-tiny, 4 single blocks, LoRA on a 4-bit base, 2 samples, checkpointing, "
              "second call with TZ_ATT_KEEP=0", 4, 1, 2);
    g_flux_singles = 0, g_keep_off_again = 0;
    decode_case("bf16: llama generation, LoRA on a 4-bit TurboQuant base", 1e-2);
    tz_backend_destroy(g_gpu);
    tz_backend_destroy(g_cpu);
    return tz_check_done("test_gpu_model");
}
