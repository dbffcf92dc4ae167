/* The Llama's training memory at large shapes, forced on a small model: the MLP in chunks of
 * rows (tz_llama.mlp_rows, here a few rows through mlp_rows_max) against the MLP on every row
 * at once, and on a device backend the saved residual streams kept in host memory.
 *  - chunks: the same loss bit for bit (every op of the forward works row by row) and the
 *    same gradients up to the order of their sums over rows (a weight's gradient adds the
 *    chunks' partial sums: relative 1e-5 of the tensor's largest element); the arena holds
 *    the MLP's buffers for one chunk only; eval gives the training forward's loss;
 *    without checkpointing nothing is cut;
 *  - with q, k, v wider than the model (heads x head_dim > dim) the attention gradients take
 *    the pool instead of h2 and x2;
 *  - on a device backend (CUDA, or its CPU emulation through TZ_CUDA_MODULE; skipped without
 *    one), bf16 GEMM operands: the streams on the host (one bf16 slot in the arena), chunks
 *    and all, against the CPU with the same bf16 storage within test_gpu_model's bf16
 *    tolerances, and a second step's loss equal to the first's bit for bit (the streams come
 *    back from the host as they went);
 *  - on a device backend, a 4-bit MLP in chunks of columns (tz_llama.mlp_cols) against the
 *    same model in chunks of rows and against the CPU: each MLP weight decoded once a pass
 *    (the elements tq_matmul and tq_matmul_lora decode, counted), the loss and gradients
 *    within the rounding that adding the chunks' parts in another order makes. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/world.h"
#include "backend/registry.h"
#include "core/rng.h"
#include "model/llama.h"
#include "tz_check.h"

enum { B = 2, T = 16, BT = B * T, V = 61 };

typedef struct mcase {
    const char *what;
    int full, bits, tied;
    int64_t heads, kv, head_dim;
    int rope3; /* Llama 3 RoPE scaling (the table form of RoPE) */
    int targets; /* LoRA's projections (1 << TZ_LIN_*); 0: all seven */
} mcase;

static tz_llama *make_dims(tz_backend *be, const mcase *c, int ckpt, int64_t rows_max,
                           int64_t dim, int64_t hidden, int64_t cols_max) {
    tz_llama_dims d = {.vocab = V, .dim = dim, .hidden = hidden, .n_layers = 3, .n_heads = c->heads,
                       .n_kv_heads = c->kv, .head_dim = c->head_dim, .max_pos = 64,
                       .eps = 1e-5, .theta = 10000.0, .tied = c->tied};
    if (c->rope3) /* some frequencies kept (i = 0), one smoothed, the rest scaled by 1/8 */
        d.rope_type = TZ_ROPE_LLAMA3, d.rope_factor = 8.0, d.rope_low_freq = 1.0,
        d.rope_high_freq = 4.0, d.rope_orig_max = 64;
    tz_model_opts o = {.full = c->full, .checkpointing = ckpt};
    if (!c->full)
        o.lora.targets = c->targets ? c->targets : (1 << TZ_LIN_N) - 1, o.lora.rank = 4,
        o.lora.alpha = 8.0;
    if (c->bits) o.quant.bits = c->bits, o.quant.group = 64, o.quant.seed = 3;
    tz_llama *m = tz_llama_create(be, &d, &o);
    tz_llama_init_random(m, 7);
    for (int i = 0; i < m->params.n; i++) { /* nonzero adapters, so every path carries */
        tz_param *p = m->params.p[i];
        if (!p->adapter) continue;
        float *h = malloc((size_t)p->numel * sizeof *h);
        tz_rng r = tz_rng_make(5, (uint64_t)i, TZ_RNG_TEST, 0);
        for (int64_t k = 0; k < p->numel; k++) h[k] = 0.1f * (2.0f * tz_rng_uniform(&r) - 1.0f);
        tz_param_upload(be, p, h, 0, p->numel);
        free(h);
    }
    m->mlp_rows_max = rows_max;
    m->mlp_cols_max = cols_max;
    tz_llama_setup(m, B, T);
    return m;
}

static tz_llama *make(tz_backend *be, const mcase *c, int ckpt, int64_t rows_max) {
    return make_dims(be, c, ckpt, rows_max, 48, 80, 0);
}

/* Loss of one forward + backward into zeroed gradients; *g receives them on the host (flat,
 * malloc'd). */
static double step(tz_llama *m, float *dg, const int32_t *in, const int32_t *tg, float **g) {
    tz_backend *be = m->be;
    const size_t bytes = (size_t)m->params.flat_numel * sizeof(float);
    be->fill(be, dg, 0.0f, m->params.flat_numel);
    tz_params_bind_grads(&m->params, dg);
    const double l = tz_llama_forward_backward(m, in, tg, 1.0f / BT);
    *g = malloc(bytes);
    be->download(be, *g, dg, bytes);
    return l;
}

static float *grads(tz_llama *m) {
    return m->be->alloc(m->be, (size_t)m->params.flat_numel * sizeof(float));
}

static void drop(tz_llama *m, float *dg) {
    tz_backend *be = m->be;
    tz_llama_free(m);
    be->release(be, dg);
}

/* max over trainable tensors (whose names hold `only`, where not NULL) of max |a - b| /
 * max |a|; *zero counts tensors all zero in a */
static double grad_err_of(const tz_llama *m, const float *a, const float *b, int *zero,
                          const char **worst, const char *only) {
    double w = 0.0;
    *zero = 0;
    *worst = "-";
    for (int i = 0; i < m->params.n; i++) {
        const tz_param *p = m->params.p[i];
        if (!p->trainable || (only && !strstr(p->name, only))) continue;
        double e = 0.0, s = 0.0;
        for (int64_t k = 0; k < p->numel; k++) {
            const double x = a[p->flat_off + k], y = b[p->flat_off + k], d = fabs(x - y);
            if (!(d <= e)) e = d; /* NaN: taken */
            if (fabs(x) > s) s = fabs(x);
        }
        *zero += s == 0;
        const double rel = e != e ? INFINITY : s > 0 ? e / s : e;
        if (!(rel <= w)) w = rel, *worst = p->name;
    }
    return w;
}

static double grad_err(const tz_llama *m, const float *a, const float *b, int *zero,
                       const char **worst) {
    return grad_err_of(m, a, b, zero, worst, NULL);
}

static void chunks_case(tz_backend *be, const mcase *c, const int32_t *in, const int32_t *tg,
                        const char *tag) {
    tz_llama *one = make(be, c, 1, 0), *ch = make(be, c, 1, 5);
    check(!one->mlp_chunked && one->mlp_rows == BT && ch->mlp_chunked && ch->mlp_rows == 5,
          "%s%s: MLP rows %lld at once, %lld in chunks", tag, c->what, (long long)one->mlp_rows,
          (long long)ch->mlp_rows);
    /* the MLP's five hidden-sized buffers for 5 rows instead of 32 (h2 in h1, hf and logits
     * in the pool): at least 4 x 27 rows of hidden fewer */
    const size_t a1 = one->arena.cap, a2 = ch->arena.cap;
    check(a2 + (size_t)(4 * 27 * 80 * 4) <= a1, "%s%s: arena %zu bytes in chunks, %zu at once",
          tag, c->what, a2, a1);
    float *g1, *g2, *d1 = grads(one), *d2 = grads(ch);
    const double l1 = step(one, d1, in, tg, &g1), l2 = step(ch, d2, in, tg, &g2);
    const double f2 = tz_llama_forward(ch, in, tg);
    check(l1 == l2 && l2 == f2 && isfinite(l1),
          "%s%s: loss %.9g at once, %.9g in chunks, %.9g forward only", tag, c->what, l1, l2, f2);
    int zero;
    const char *worst;
    const double e = grad_err(one, g1, g2, &zero, &worst);
    check(e <= 1e-5 && zero == 0, "%s%s: gradients within %.2e of the unchunked (%s; tol 1e-5)",
          tag, c->what, e, worst);
    free(g1), free(g2);
    drop(one, d1), drop(ch, d2);
    /* without checkpointing every layer keeps its MLP activations: no chunks */
    tz_llama *nc = make(be, c, 0, 5);
    check(!nc->mlp_chunked && nc->mlp_rows == BT, "%s%s: no chunks without checkpointing", tag,
          c->what);
    tz_llama_free(nc);
}

/* The device: streams on the host, MLP chunks, against the CPU with bf16 storage. */
static void device_case(tz_backend *cpu16, tz_backend *dev, const mcase *c, const int32_t *in,
                        const int32_t *tg) {
    tz_llama *h = make(cpu16, c, 1, 5), *d = make(dev, c, 1, 5);
    const tz_llama_dims *dd = &d->d;
    const size_t stream = ((size_t)(BT * dd->dim + 1) / 2 * 4 + 63) & ~(size_t)63;
    check(tz_layer_stack_on_host(&d->stack) && !tz_layer_stack_on_host(&h->stack) &&
              d->stack.x16 && d->mlp_chunked && d->stack.xb == d->dh,
          "device %s: streams on the host, xb in dh, MLP in chunks of %lld rows", c->what,
          (long long)d->mlp_rows);
    /* the arena holds one bf16 slot instead of n_layers + 1 streams, and no xb (dh is) */
    const size_t ws = (tz_attention_ws_bytes(dev, B, T, dd->n_heads, dd->head_dim, 1, 1) + 63) & ~(size_t)63;
    const size_t want = (size_t)dd->n_layers * stream +
                        (((size_t)(BT * dd->dim) * 4 + 63) & ~(size_t)63);
    /* the device's GEMMs round to bf16, so its linears' scratch may hold their input rounded
     * once (tz_linear_fwd_shared; the CPU's GEMMs are fp32 and need none) */
    const size_t ad = (((size_t)d->tq.act_floats * 4 + 63) & ~(size_t)63) -
                      (((size_t)h->tq.act_floats * 4 + 63) & ~(size_t)63);
    /* attention reads q, k, v in bf16 on the device (att16): one bf16 copy of each */
    const int64_t qd = dd->n_heads * dd->head_dim, kvd = dd->n_kv_heads * dd->head_dim;
    const size_t q16 = d->att16 ? (((size_t)(BT * qd + 1) / 2 * 4 + 63) & ~(size_t)63) +
                                      2 * (((size_t)(BT * kvd + 1) / 2 * 4 + 63) & ~(size_t)63)
                                : 0;
    check(d->att16 && !h->att16, "device %s: attention reads q, k, v in bf16 (the CPU: fp32)",
          c->what);
    /* the fp32 q, k, v, read only to make those copies, live in the pool (the MLP's chunks,
     * free in the attention half of a forward), which grows to hold them where it must */
    const size_t q32 = (((size_t)(BT * qd) * 4 + 63) & ~(size_t)63) +
                       2 * (((size_t)(BT * kvd) * 4 + 63) & ~(size_t)63);
    const size_t grow = (size_t)(d->pool_floats - h->pool_floats) * 4;
    /* attention's outputs kept for the recomputation (tz_llama.keep): a second att and lse here,
     * the first n_layers - 2 layers' on the host */
    const size_t kept = (((size_t)(BT * qd) * 4 + 63) & ~(size_t)63) +
                        (((size_t)(BT * dd->n_heads) * 4 + 63) & ~(size_t)63);
    const size_t kept_host =
        (size_t)(dd->n_layers - 2) * (size_t)(BT * (qd + dd->n_heads)) * sizeof(float);
    check(d->keep.on && !h->keep.on && d->keep.host_bytes == kept_host,
          "device %s: attention's outputs kept for the recomputation (the CPU runs it again), "
          "%zu bytes of them on the host", c->what, d->keep.host_bytes);
    const tz_llama_acts *s = tz_layer_stack_set(&d->stack, 0);
    const float *p0 = d->pool, *p1 = d->pool + d->pool_floats;
    check(s->q >= p0 && s->k >= s->q + BT * qd && s->v >= s->k + BT * kvd &&
              s->v + BT * kvd <= p1 && d->pool_floats >= h->pool_floats,
          "device %s: q, k, v in fp32 in the pool (%lld floats; the CPU's %lld)", c->what,
          (long long)d->pool_floats, (long long)h->pool_floats);
    check(d->tq.act_floats >= h->tq.act_floats &&
              d->arena.cap + want + q32 == h->arena.cap + ws + ad + q16 + grow + kept,
          "device %s: arena %zu bytes + %zu (n_layers bf16 streams and xb) + %zu (q, k, v in "
          "fp32) = the CPU's %zu + attention's workspace %zu + the bf16 input copy %zu + q, k, "
          "v in bf16 %zu + the pool's growth %zu + attention's outputs kept %zu", c->what,
          d->arena.cap, want, q32, h->arena.cap, ws, ad, q16, grow, kept);
    float *gh, *gd, *gd2, *bh = grads(h), *bd = grads(d);
    const double lh = step(h, bh, in, tg, &gh), ld = step(d, bd, in, tg, &gd);
    const double fd = tz_llama_forward(d, in, tg), ld2 = step(d, bd, in, tg, &gd2);
    const double le = fabs(lh - ld) / fabs(lh);
    check(le <= 2e-3 && isfinite(ld), "device %s: loss %.9g, cpu %.9g (relative %.2e, tol 2e-3)",
          c->what, ld, lh, le);
    check(ld == ld2 && ld == fd, "device %s: a second step %.9g and eval %.9g as the first",
          c->what, ld2, fd);
    int zero;
    const char *worst;
    const double e = grad_err(h, gh, gd, &zero, &worst);
    check(e <= 5e-2 && zero == 0, "device %s: gradients within %.2e of the cpu's (%s; tol 5e-2)",
          c->what, e, worst);
    check(memcmp(gd, gd2, (size_t)d->params.flat_numel * sizeof(float)) == 0,
          "device %s: the second step's gradients are the first's", c->what);
    /* without checkpointing (no MLP chunks) the fp32 q, k, v take the set's g and u where
     * they fit (the hidden size at least qd and 2 kvd, as in every Llama; not the MHA case
     * here, 2 x 48 > 80), else memory of their own; against the CPU as above (the device's
     * streams are not rounded to bf16 without checkpointing, so not its loss with it) */
    tz_llama *n = make(dev, c, 0, 0);
    float *gn, *bn = grads(n);
    const tz_llama_acts *sn = tz_layer_stack_set(&n->stack, 0);
    const int gu = qd <= dd->hidden && 2 * kvd <= dd->hidden;
    check(!n->mlp_chunked && n->att16 &&
              (gu ? sn->q == sn->g && sn->k == sn->u && sn->v == sn->u + BT * kvd
                  : sn->q != sn->g && sn->k != sn->u),
          "device %s, no checkpointing: q, k, v in fp32 %s", c->what,
          gu ? "in the set's g and u" : "in their own memory (they do not fit g and u)");
    const double ln = step(n, bn, in, tg, &gn), lne = fabs(lh - ln) / fabs(lh);
    const double en = grad_err(h, gh, gn, &zero, &worst);
    check(lne <= 2e-3 && en <= 5e-2 && zero == 0, "device %s, no checkpointing: loss %.9g, cpu "
          "%.9g (relative %.2e, tol 2e-3), gradients within %.2e (%s; tol 5e-2)", c->what, ln,
          lh, lne, en, worst);
    free(gn);
    drop(n, bn);
    free(gh), free(gd), free(gd2);
    drop(h, bh), drop(d, bd);
}

/* Elements of quantized weights decoded (tq_matmul's and tq_matmul_lora's rows x cols),
 * counted around the device's ops. */
static int64_t g_decoded;
static void (*g_tqm)(tz_backend *, float *, const void *, int, float *, const uint8_t *,
                     const uint16_t *, const float *, int64_t, int64_t, int, int, int64_t, int,
                     float, float);
static void (*g_tqml)(tz_backend *, float *, uint16_t *, int64_t, const float *, const float *,
                      int64_t, float, float *, const uint8_t *, const uint16_t *, const float *,
                      int64_t, int64_t, int, int, int64_t, const float *, int);
static int64_t g_out16; /* elements tq_matmul_lora wrote in bf16 (c_bf16) */
static void count_tqm(tz_backend *be, float *C, const void *A, int a16, float *tile,
                      const uint8_t *c, const uint16_t *s, const float *l, int64_t rows,
                      int64_t cols, int bits, int group, int64_t M, int tw, float al, float be_) {
    g_decoded += rows * cols;
    g_tqm(be, C, A, a16, tile, c, s, l, rows, cols, bits, group, M, tw, al, be_);
}
static void count_tqml(tz_backend *be, float *C, uint16_t *A, int64_t ld, const float *h,
                       const float *Bm, int64_t r, float sc, float *tile, const uint8_t *c,
                       const uint16_t *s, const float *l, int64_t rows, int64_t cols, int bits,
                       int group, int64_t M, const float *bias, int c16) {
    g_decoded += rows * cols;
    if (c16) g_out16 += M * rows;
    g_tqml(be, C, A, ld, h, Bm, r, sc, tile, c, s, l, rows, cols, bits, group, M, bias, c16);
}

/* The memory lent to attention's backward for its score gradients (be->att_ds), as the
 * device's op found it at its last call, and the calls that found a loan forming groups
 * (tz_attention_ds_group: dS kept, the pool's end written by dk/dv's kernel). */
static void (*g_attb)(tz_backend *, float *, float *, float *, const float *, const float *,
                      const float *, const float *, const float *, const float *, int64_t,
                      int64_t, int64_t, int64_t, int64_t, int, int, const struct tz_att_ld *);
static void *g_ds;
static size_t g_ds_bytes;
static int g_ds_groups;
static void rec_attb(tz_backend *be, float *dq, float *dk, float *dv, const float *dout,
                     const float *out, const float *lse, const float *q, const float *k,
                     const float *v, int64_t B_, int64_t T_, int64_t Hq, int64_t Hkv, int64_t D,
                     int causal, int acc, const struct tz_att_ld *ld) {
    const char *off = getenv("TZ_FA_DS"); /* (the backend's switch, read at every call) */
    g_ds = be->att_ds, g_ds_bytes = be->att_ds_bytes;
    g_ds_groups += !(off && !strcmp(off, "0")) &&
                   tz_attention_ds_group(B_, T_, Hq, Hkv, causal, g_ds ? g_ds_bytes : 0) > 0;
    g_attb(be, dq, dk, dv, dout, out, lse, q, k, v, B_, T_, Hq, Hkv, D, causal, acc, ld);
}

/* A 4-bit MLP (dim 64, hidden 640, group 64) in chunks of 256 columns (the last of 128)
 * against chunks of 5 rows, both on the device, and against the CPU (bf16 storage, chunks of
 * rows). */
static void cols_case(tz_backend *cpu16, tz_backend *dev, const mcase *cs, const int32_t *in,
                      const int32_t *tg) {
    const mcase c = *cs;
    const int64_t C = 64, F = 640, L = 3, kvd = 2 * 16;
    tz_llama *h = make_dims(cpu16, &c, 1, 5, C, F, 0);
    tz_llama *rw = make_dims(dev, &c, 1, 5, C, F, -1), *cl = make_dims(dev, &c, 1, 5, C, F, 256);
    check(!h->mlp_cols && !rw->mlp_cols && rw->mlp_chunked && cl->mlp_cols == 256 &&
              cl->mlp_cols_fwd >= 256 && cl->mlp_cols_fwd % 128 == 0,
          "device %s: the MLP in chunks of %lld columns (forward %lld), of rows where told "
          "(%lld rows), the CPU in chunks of rows", c.what, (long long)cl->mlp_cols,
          (long long)cl->mlp_cols_fwd, (long long)rw->mlp_rows);
    g_tqm = dev->tq_matmul, g_tqml = dev->tq_matmul_lora;
    dev->tq_matmul = count_tqm, dev->tq_matmul_lora = count_tqml;
    float *gh, *gr, *gc, *gc2, *bh = grads(h), *br = grads(rw), *bc = grads(cl);
    const double lh = step(h, bh, in, tg, &gh);
    g_decoded = 0, g_out16 = 0;
    const double lr = step(rw, br, in, tg, &gr);
    const int64_t dec_rows = g_decoded, out16_rows = g_out16;
    g_decoded = 0, g_out16 = 0;
    const double lc = step(cl, bc, in, tg, &gc);
    const int64_t dec_cols = g_decoded, out16_cols = g_out16;
    /* forward, the backward's recomputation (not of the last layer's attention, whose
     * activations are still there) and the input gradient: three passes over every weight of
     * attention; gate and up three (the backward makes g and u again), down two */
    const int64_t att = C * C + 2 * kvd * C + C * C, once = L * (3 * att + 8 * C * F) - att;
    check(dec_cols == once && dec_rows > dec_cols,
          "device %s: %lld elements decoded in a step in chunks of columns (each weight once "
          "a pass: %lld), %lld in chunks of rows", c.what, (long long)dec_cols, (long long)once,
          (long long)dec_rows);
    /* g and u written in bf16 by their GEMMs (SwiGLU reads them so), in the forward and in
     * the backward's recomputation, every row of every layer, either way; and v, which
     * attention reads in bf16, in the passes above */
    const int64_t gu = 2 * 2 * L * BT * F, v = (2 * L - 1) * BT * kvd;
    check(out16_cols == gu + v && out16_rows == gu + v,
          "device %s: gate's, up's and v's outputs written in bf16 by their GEMMs: %lld "
          "elements in chunks of columns, %lld of rows (two passes of g and u, %lld, and v's "
          "%lld)", c.what, (long long)out16_cols, (long long)out16_rows, (long long)gu,
          (long long)v);
    dev->tq_matmul = g_tqm, dev->tq_matmul_lora = g_tqml;
    const double fc = tz_llama_forward(cl, in, tg), lc2 = step(cl, bc, in, tg, &gc2);
    /* the same operands rounded to bf16 either way (g and u too); only down's sum over the
     * hidden size (and the input gradient's through gate and up) adds the chunks' parts in
     * another order: fp32 rounding, which can move a later bf16 rounding by one step (2^-8
     * of an element) */
    const double le = fabs(lc - lr) / fabs(lr);
    check(le <= 1e-4 && lc == lc2 && lc == fc && isfinite(lc),
          "device %s: loss %.9g in chunks of columns, %.9g of rows (relative %.2e, tol 1e-4); "
          "a second step %.9g and eval %.9g as the first", c.what, lc, lr, le, lc2, fc);
    /* gate's and up's backward adds its chunks' sums (dy W_rot, the adapters' dh) in fp32 and
     * rounds dh to bf16 once, as the chunks of rows do; down's product adds its parts in fp32:
     * fp32's rounding, which can move later bf16 roundings by a step (2^-8 of an element)
     * each, a few of them compounding over the layers (1e-2); with TZ_LINEAR_SHARED=0 each
     * chunk's dh is rounded on its own too, bf16 roundings of parts (2e-2). A wrong window or
     * sum is off by the gradients' own size. */
    const char *sh = getenv("TZ_LINEAR_SHARED");
    const double tol = sh && !strcmp(sh, "0") ? 2e-2 : 1e-2;
    int zero;
    const char *worst;
    const double e = grad_err(cl, gr, gc, &zero, &worst);
    check(e <= tol && zero == 0, "device %s: gradients in chunks of columns within %.2e of "
          "those in chunks of rows (%s; tol %.0e)", c.what, e, worst, tol);
    /* where the two forwards made the same bits (down's product sums the hidden size in
     * parts, which fp32 may round otherwise), the last layer's gate and up B and down A
     * gradients read the same bf16 operands either way (dg, du and h; dh and s): only fp32's
     * sums differ between them. (Its other adapters' read sums over the hidden size that the
     * chunks add in parts; the layers before it gradients that went through bf16 roundings
     * since: above.) */
    if (lc == lr) {
        const char *tight[] = {"layers.2.mlp.gate_proj.lora_B", "layers.2.mlp.up_proj.lora_B",
                               "layers.2.mlp.down_proj.lora_A"};
        double el = 0.0;
        const char *tw = "-";
        for (int i = 0; i < 3; i++) {
            const double t = grad_err_of(cl, gr, gc, &zero, &worst, tight[i]);
            if (!(t <= el)) el = t, tw = worst;
        }
        check(el <= 1e-5, "device %s: the last layer's gate and up B and down A gradients in "
              "chunks of columns within %.2e of those in chunks of rows (%s; tol 1e-5)", c.what,
              el, tw);
    } else {
        printf("  (device %s: the forwards' losses differ in fp32's last bits, so the last "
               "layer's adapter gradients are compared only as above)\n", c.what);
    }
    const double ec = grad_err(h, gh, gc, &zero, &worst), lce = fabs(lh - lc) / fabs(lh);
    check(lce <= 2e-3 && ec <= 5e-2 && zero == 0, "device %s: in chunks of columns, loss "
          "within %.2e (tol 2e-3) and gradients within %.2e (%s; tol 5e-2) of the cpu's", c.what, lce, ec,
          worst);
    check(memcmp(gc, gc2, (size_t)cl->params.flat_numel * sizeof(float)) == 0,
          "device %s: in chunks of columns, the second step's gradients are the first's", c.what);
    /* attention's backward is lent the pool past dk and dv, where (with chunks of columns,
     * 44,000 to 49,000 floats; dS's 4 pairs of 2 heads take 16,384) it keeps its score
     * gradients; the same
     * bits as dq's kernel computing them again (TZ_FA_DS=0) on the emulation, which sums
     * S = K Q^T as it does Q K^T (a GPU's mma could round them apart: within 1e-2 there, as
     * the chunks above) */
    g_attb = dev->attention_bwd, dev->attention_bwd = rec_attb, g_ds_groups = 0;
    float *gk, *gn;
    const double lk = step(cl, bc, in, tg, &gk);
    const int kept_calls = g_ds_groups;
    const int lent_pool = g_ds == (void *)(cl->pool + 2 * ((BT * kvd + 15) / 16 * 16)) &&
                          g_ds_bytes == cl->ds_room_bytes && cl->ds_room == g_ds &&
                          (float *)g_ds + g_ds_bytes / 4 == cl->pool + cl->pool_floats;
    const char *prev0 = getenv("TZ_FA_DS");
    char *saved = prev0 ? strdup(prev0) : NULL;
    const char *prev = saved;
    setenv("TZ_FA_DS", "0", 1);
    const double ln = step(cl, bc, in, tg, &gn);
    if (saved) setenv("TZ_FA_DS", saved, 1);
    else unsetenv("TZ_FA_DS");
    dev->attention_bwd = g_attb;
    tz_device_info di;
    dev->device_info(dev, &di);
    const int emu = strstr(di.name, "CPU emulation") != NULL;
    const int same = lk == ln && !memcmp(gk, gn, (size_t)cl->params.flat_numel * sizeof(float));
    const double ek = grad_err(cl, gn, gk, &zero, &worst);
    /* (TZ_FA_DS=0 for the whole run: nothing kept, the same bits trivially) */
    const int want = prev && !strcmp(prev, "0") ? 0 : (int)L;
    check(lent_pool && kept_calls == want && (same || (!emu && ek <= 1e-2 && zero == 0)),
          "device %s: attention's backward lent the pool past dk and dv (%zu bytes: %s), dS kept "
          "in it by %d of %d layers; the loss and gradients %s those with TZ_FA_DS=0%s",
          c.what, g_ds_bytes, lent_pool ? "yes" : "NO", kept_calls, (int)L,
          same ? "the bits of" : "NOT the bits of", same || emu ? "" : " (a GPU: within 1e-2)");
    free(gk), free(gn);
    /* without checkpointing (no pool) du is lent, read for the last time by gate's and up's
     * backward: 32 x 640 floats, dS's 16,384 fit */
    tz_llama *nc = make_dims(dev, &c, 0, 0, C, F, 0);
    float *bn = grads(nc), *gk2, *gn2;
    dev->attention_bwd = rec_attb, g_ds_groups = 0;
    const double lk2 = step(nc, bn, in, tg, &gk2);
    const int kept2 = g_ds_groups, lent_du = g_ds == (void *)nc->du && nc->ds_room == g_ds &&
                                            g_ds_bytes == (size_t)(BT * F) * sizeof(float);
    setenv("TZ_FA_DS", "0", 1);
    const double ln2 = step(nc, bn, in, tg, &gn2);
    if (saved) setenv("TZ_FA_DS", saved, 1);
    else unsetenv("TZ_FA_DS");
    dev->attention_bwd = g_attb;
    const int same2 =
        lk2 == ln2 && !memcmp(gk2, gn2, (size_t)nc->params.flat_numel * sizeof(float));
    const double ek2 = grad_err(nc, gn2, gk2, &zero, &worst);
    check(!nc->mlp_chunked && lent_du && kept2 == want &&
              (same2 || (!emu && ek2 <= 1e-2 && zero == 0)),
          "device %s, no checkpointing: attention's backward lent du (%s), dS kept in it by %d "
          "of %d layers; the loss and gradients %s those with TZ_FA_DS=0", c.what,
          lent_du ? "yes" : "NO", kept2, (int)L, same2 ? "the bits of" : "NOT the bits of");
    free(gk2), free(gn2), free(saved);
    drop(nc, bn);
    free(gh), free(gr), free(gc), free(gc2);
    drop(h, bh), drop(rw, br), drop(cl, bc);
}

int main(int argc, char **argv) {
    tz_mpi_singleton_defaults();
    MPI_Init(&argc, &argv);
    int32_t in[BT], tg[BT];
    for (int i = 0; i < BT; i++) in[i] = (i * 37 + 5) % V, tg[i] = (i * 53 + 1) % V;
    tg[9] = -1; /* an ignored row inside a chunk */
    const mcase cases[] = {
        {"LoRA on all 7 projections of a 4-bit base, GQA 4/2, untied", 0, 4, 0, 4, 2, 12, 0, 0},
        {"full training, dense, tied, 4/4 heads", 1, 0, 1, 4, 4, 12, 0, 0},
        {"LoRA on a dense base, q wider than the model (4 x 16 > 48)", 0, 0, 0, 4, 2, 16, 0, 0},
        {"LoRA on a 4-bit base, Llama 3 RoPE scaling", 0, 4, 0, 4, 2, 12, 1, 0},
    };
    const int nc = (int)(sizeof cases / sizeof cases[0]);
    tz_backend *cpu = tz_cpu_backend_create(2), *cpu16 = tz_cpu_backend_create(2);
    cpu16->matmul_dtype = TZ_DT_BF16; /* storage as on a GPU, the CPU's GEMMs fp32 */
    for (int i = 0; i < nc; i++) chunks_case(cpu, &cases[i], in, tg, "");
    for (int i = 0; i < nc; i++) chunks_case(cpu16, &cases[i], in, tg, "bf16 storage: ");
    const int ndev = tz_cuda_device_count();
    if (ndev > 0) {
        tz_backend *dev = tz_backend_create(TZ_DEVICE_CUDA, 0, 0);
        tz_backend_set_precision(dev, TZ_PRECISION_BF16);
        for (int i = 0; i < nc; i++) device_case(cpu16, dev, &cases[i], in, tg);
        const mcase cc[] = {
            {"LoRA on all 7 projections of a 4-bit base, hidden 640", 0, 4, 0, 4, 2, 16, 0, 0},
            {"LoRA on q and v of a 4-bit base, hidden 640", 0, 4, 0, 4, 2, 16, 0,
             (1 << TZ_LIN_Q) | (1 << TZ_LIN_V)},
            {"LoRA on gate and up of a 4-bit base, hidden 640", 0, 4, 0, 4, 2, 16, 0,
             (1 << TZ_LIN_GATE) | (1 << TZ_LIN_UP)},
            {"LoRA on down of a 4-bit base, hidden 640", 0, 4, 0, 4, 2, 16, 0,
             1 << TZ_LIN_DOWN},
        };
        for (int i = 0; i < 4; i++) cols_case(cpu16, dev, &cc[i], in, tg);
        tz_backend_destroy(dev);
    } else {
        printf("skip the device cases: %s\n",
               ndev < 0 ? "this build has no CUDA backend" : "no CUDA device");
    }
    tz_backend_destroy(cpu);
    tz_backend_destroy(cpu16);
    MPI_Finalize();
    return tz_check_done("test_llama_memory");
}
