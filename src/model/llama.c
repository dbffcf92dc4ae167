/* Llama forward and backward on the backend op table, with saved or recomputed (activation
 * checkpointing) layer activations. Loading and saving weights live in llama_io.c. */
#include "model/llama.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/rng.h"
#include "quant/turboquant.h"

const char *const tz_llama_lin_names[TZ_LIN_N] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                  "gate_proj", "up_proj", "down_proj"};

/* The family's named shapes: vocab (0: the caller's), dim, MLP hidden, layers, heads, kv
 * heads, tied embeddings, positions. */
static const struct {
    const char *name;
    int64_t vocab, dim, hidden, layers, heads, kv, tied, max_pos;
} shapes[] = {
    {"tiny", 0, 128, 352, 2, 4, 2, 1, 2048},
    {"mini", 0, 192, 512, 4, 6, 2, 1, 2048},
    {"small", 0, 256, 688, 6, 8, 4, 1, 2048},
    {"llama2-7b", 32000, 4096, 11008, 32, 32, 32, 0, 4096},
    {"llama-tiny", 256, 128, 352, 2, 4, 2, 0, 2048},
};

int tz_llama_preset(const char *name, int64_t vocab, tz_llama_dims *d, char *err, size_t errlen) {
    const int n = (int)(sizeof shapes / sizeof *shapes);
    int i = 0;
    while (i < n && strcmp(shapes[i].name, name)) i++;
    if (i == n) {
        size_t used = (size_t)snprintf(err, errlen, "expected ");
        for (int k = 0; k < n && used < errlen; k++)
            used += (size_t)snprintf(err + used, errlen - used, "%s%s",
                                     k == 0 ? "" : k + 1 < n ? ", " : " or ", shapes[k].name);
        return 1;
    }
    memset(d, 0, sizeof *d);
    d->vocab = vocab > 0 ? vocab : shapes[i].vocab;
    d->dim = shapes[i].dim, d->hidden = shapes[i].hidden, d->n_layers = shapes[i].layers;
    d->n_heads = shapes[i].heads, d->n_kv_heads = shapes[i].kv, d->tied = (int)shapes[i].tied;
    d->max_pos = shapes[i].max_pos;
    d->eps = 1e-5;
    d->theta = 10000.0;
    d->head_dim = d->dim / d->n_heads;
    if (d->vocab <= 0) {
        snprintf(err, errlen, "shape %s takes its vocabulary size from the caller", name);
        return 1;
    }
    return 0;
}

void tz_llama_inv_freq(const tz_llama_dims *d, float *inv) {
    const int64_t D = d->head_dim;
    const float two_pi = 6.283185307179586f;
    for (int64_t i = 0; i < D / 2; i++) {
        float f = 1.0f / powf((float)d->theta, (float)(2 * i) / (float)D);
        if (d->rope_type == TZ_ROPE_LLAMA3) {
            const float L = (float)d->rope_orig_max, lo = (float)d->rope_low_freq,
                        hi = (float)d->rope_high_freq, factor = (float)d->rope_factor;
            float wl = two_pi / f;
            if (wl > L / lo) {
                f = f / factor;
            } else if (!(wl < L / hi)) {
                float s = (L / wl - lo) / (hi - lo);
                f = (1.0f - s) * f / factor + s * f;
            }
        }
        inv[i] = f;
    }
}

static tz_param *add_param(tz_llama *m, const char *name, int ndim, int64_t d0, int64_t d1,
                           int trainable, int decay, int adapter, int64_t stage) {
    tz_param *p = tz_params_add(&m->params, m->be, name, ndim, d0, d1, trainable, decay, adapter);
    p->stage = (int)stage;
    return p;
}

static void add_linear(tz_llama *m, tz_linear *l, int layer, int which, int64_t in, int64_t out) {
    char name[TZ_NAME_MAX];
    const char *blk = which <= TZ_LIN_O ? "self_attn" : "mlp";
    const int64_t stage = m->d.n_layers - layer; /* backward reaches layer l at this stage */
    snprintf(name, sizeof name, "model.layers.%d.%s.%s.weight", layer, blk,
             tz_llama_lin_names[which]);
    l->in = in;
    l->out = out;
    l->tq = &m->tq;
    const tz_quant_opts *qo = &m->o.quant;
    int g = qo->bits ? tz_tq_group_for(in, qo->group) : 0;
    if (g) {
        l->w = tz_params_add_quant(&m->params, m->be, name, out, in, qo->method, qo->bits, g,
                                   qo->seed, m->levels);
        l->w->stage = (int)stage;
        l->w->trainable = m->o.full; /* full fine-tuning: fp32 master on the host, codes here */
    } else {
        l->w = add_param(m, name, 2, out, in, m->o.full, 1, 0, stage);
    }
    l->a = l->b = l->bias = NULL;
    l->r = 0;
    if (m->o.lora.targets & (1 << which)) {
        snprintf(name, sizeof name, "model.layers.%d.%s.%s", layer, blk, tz_llama_lin_names[which]);
        tz_linear_add_lora(l, &m->params, m->be, name, m->o.lora.rank, m->o.lora.alpha,
                           (int)stage);
    }
}

tz_llama *tz_llama_create(tz_backend *be, const tz_llama_dims *d, const tz_model_opts *o) {
    if (d->n_heads % d->n_kv_heads || d->head_dim % 2)
        TZ_FATAL("llama: %lld heads not a multiple of %lld kv heads, or odd head_dim %lld",
                 (long long)d->n_heads, (long long)d->n_kv_heads, (long long)d->head_dim);
    tz_llama *m = tz_xcalloc(1, sizeof *m);
    m->d = *d;
    m->o = *o;
    m->be = be;
    tz_params_init(&m->params);
    m->params.weights_staged = 1; /* forward_body and decode ask for their weights */
    int full = o->full;
    if (o->quant.bits) tz_quant_prepare(&o->quant, &m->cb, m->levels);
    const int64_t C = d->dim, qd = d->n_heads * d->head_dim, kvd = d->n_kv_heads * d->head_dim;
    /* registration in forward order; the flat layout reverses it (backward order) */
    m->embed = add_param(m, "model.embed_tokens.weight", 2, d->vocab, C, full, 1, 0,
                         d->n_layers + 1);
    m->layers = tz_xcalloc((size_t)d->n_layers, sizeof *m->layers);
    for (int i = 0; i < d->n_layers; i++) {
        tz_llama_layer *L = &m->layers[i];
        char name[TZ_NAME_MAX];
        snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", i);
        L->attn_norm = add_param(m, name, 1, C, 1, full, 0, 0, d->n_layers - i);
        add_linear(m, &L->lin[TZ_LIN_Q], i, TZ_LIN_Q, C, qd);
        add_linear(m, &L->lin[TZ_LIN_K], i, TZ_LIN_K, C, kvd);
        add_linear(m, &L->lin[TZ_LIN_V], i, TZ_LIN_V, C, kvd);
        for (int j = TZ_LIN_Q; d->qkv_bias && j <= TZ_LIN_V; j++) {
            snprintf(name, sizeof name, "model.layers.%d.self_attn.%s.bias", i,
                     tz_llama_lin_names[j]);
            L->lin[j].bias = add_param(m, name, 1, L->lin[j].out, 1, full, 0, 0, d->n_layers - i);
        }
        if (d->qk_norm) {
            snprintf(name, sizeof name, "model.layers.%d.self_attn.q_norm.weight", i);
            L->q_norm = add_param(m, name, 1, d->head_dim, 1, full, 0, 0, d->n_layers - i);
            snprintf(name, sizeof name, "model.layers.%d.self_attn.k_norm.weight", i);
            L->k_norm = add_param(m, name, 1, d->head_dim, 1, full, 0, 0, d->n_layers - i);
        }
        add_linear(m, &L->lin[TZ_LIN_O], i, TZ_LIN_O, qd, C);
        snprintf(name, sizeof name, "model.layers.%d.post_attention_layernorm.weight", i);
        L->mlp_norm = add_param(m, name, 1, C, 1, full, 0, 0, d->n_layers - i);
        add_linear(m, &L->lin[TZ_LIN_GATE], i, TZ_LIN_GATE, C, d->hidden);
        add_linear(m, &L->lin[TZ_LIN_UP], i, TZ_LIN_UP, C, d->hidden);
        add_linear(m, &L->lin[TZ_LIN_DOWN], i, TZ_LIN_DOWN, d->hidden, C);
    }
    m->final_norm = add_param(m, "model.norm.weight", 1, C, 1, full, 0, 0, 0);
    m->lm_head = d->tied ? m->embed
                         : add_param(m, "lm_head.weight", 2, d->vocab, C, full, 1, 0, 0);
    tz_params_layout(&m->params);
    return m;
}

void tz_llama_free(tz_llama *m) {
    if (!m) return;
    tz_att_keep_free(&m->keep); /* (its copies done before the memory they read goes) */
    tz_arena_free(&m->arena);
    tz_params_free(&m->params, m->be);
    if (m->inv_freq) m->be->release(m->be, m->inv_freq);
    free(m->layers);
    tz_layer_stack_free(&m->stack);
    if (m->loss_host) m->be->host_free(m->be, m->loss_host);
    free(m);
}

/* HF's rule: norms ones, biases zeros, matrices (embeddings included) normal(0, 0.02). */
static void fill_init(void *ctx, int i, const tz_param *p, tz_rng *r, float *h) {
    (void)ctx, (void)i;
    const size_t n = strlen(p->name);
    const int bias = n > 5 && !strcmp(p->name + n - 5, ".bias");
    for (int64_t k = 0; k < p->numel; k++)
        h[k] = p->ndim == 1 ? (bias ? 0.0f : 1.0f) : (float)(0.02 * tz_rng_normal(r));
}

void tz_llama_init_random(tz_llama *m, uint64_t seed) {
    tz_model_init_base(&m->params, m->be, &m->cb, seed, fill_init, NULL);
}

/* ---- activation memory ---- */

/* Rows of the MLP at a time for batches of BT rows (tz_llama.mlp_rows): equal chunks of at
 * most TZ_LLAMA_MLP_FLOATS / hidden rows (or mlp_rows_max), only when training with
 * checkpointing; BT otherwise. */
static int64_t mlp_rows_for(const tz_llama *m, int64_t BT) {
    if (!m->o.checkpointing || m->o.forward_only) return BT;
    int64_t most = TZ_LLAMA_MLP_FLOATS / m->d.hidden;
    if (m->mlp_rows_max > 0 && m->mlp_rows_max < most) most = m->mlp_rows_max;
    if (most < 1) most = 1;
    const int64_t n = (BT + most - 1) / most;
    return (BT + n - 1) / n;
}

/* Whether attention reads q, k, v in bf16 (tz_llama.att16): on a device that takes them so
 * (tz_attention_takes_bf16: its flash kernels round q, k, v to bf16 as they load them, so
 * the results are those of the fp32 values), in training, where RoPE can write q and k in
 * bf16 in its pass (rope_fwd16) and v is rounded once for every tile that reads it. The CPU
 * computes attention in fp32 and keeps it so. */
static int keeps_att16(const tz_llama *m) {
    return m->be->device && !m->o.forward_only && tz_linear_rounds_bf16(m->be) &&
           tz_attention_takes_bf16(m->be, m->d.head_dim);
}

/* Whether the gate and up projections' backward takes dg and du as swiglu_bwd writes them in
 * bf16: where their GEMMs would round them to bf16 anyway (the same bits, without an fp32
 * write and a rounding pass of each). */
static int gate_up_dy16(const tz_backend *be, const tz_llama_layer *L) {
    return tz_linear_takes_dy16(be, &L->lin[TZ_LIN_GATE]) &&
           tz_linear_takes_dy16(be, &L->lin[TZ_LIN_UP]);
}

/* n floats rounded up to 64 bytes, the arena's alignment, for buffers cut from one take */
static int64_t al16(int64_t n) { return (n + 15) / 16 * 16; }
/* the floats that hold n bf16, likewise rounded */
static int64_t half16(int64_t n) { return al16((n + 1) / 2); }

/* Whether attention's backward writes dv in bf16 (tz_att_ld.d16), and RoPE's backward the
 * gradients of q and k (rope_bwd16, llama.h qk16), for the q, k, v projections: where
 * attention reads q, k, v in bf16 (att16: the flash kernels, which write dv so) and the
 * projections' backward GEMMs read their dy in bf16 (tz_linear_takes_dy16), the bits those
 * GEMMs read, without an fp32 write and a rounding pass of each. q and k so where no head norm
 * comes between RoPE and the projections. */
static int v_dy16(const tz_llama *m, const tz_llama_layer *L) {
    return m->att16 && tz_linear_takes_dy16(m->be, &L->lin[TZ_LIN_V]);
}
static int qk_dy16(const tz_backend *be, const tz_llama_dims *d, const tz_llama_layer *L) {
    return !d->qk_norm && tz_linear_takes_dy16(be, &L->lin[TZ_LIN_Q]) &&
           tz_linear_takes_dy16(be, &L->lin[TZ_LIN_K]);
}

/* ---- the MLP in chunks of columns (tz_llama.mlp_cols) ----
 * With frozen TurboQuant weights, chunks of rows decode gate, up and down once for every
 * chunk (each chunk's GEMMs read all of each weight); chunks of the hidden size instead take
 * a part of each: rows f0.. of gate and up (contiguous codes, and of their adapters' B) and
 * columns f0.. of down (whole groups: its codes, scales and A copied out into the pool, its
 * input's rotation from group column f0 on: tq_rotate16_at, tq_rotate_bwd_at), so every
 * weight is decoded once a pass. Sums over the hidden size (down's product, its adapter's
 * hidden, the input gradient through gate and up) then add the chunks' parts: the results
 * equal the chunks of rows' to fp32 rounding. */

/* Whether every layer's MLP can run in chunks of columns: a backend whose GEMMs round to
 * bf16 (a GPU's; the plan's for one); gate, up and down frozen TurboQuant weights without a
 * bias (their adapters' B in fp32); gate and up of one rotation; the hidden size a multiple
 * of twice down's group (its scales' windows are whole floats). TZ_MLP_COLS=0 in the
 * environment: chunks of rows (for measuring the two, docs/gpu.md). */
static int mlp_cols_ok(const tz_llama *m) {
    const tz_backend *be = m->be;
    const char *e = getenv("TZ_MLP_COLS");
    if (m->mlp_cols_max < 0 || (e && !strcmp(e, "0")) || !tz_linear_rounds_bf16(be)) return 0;
    for (int64_t l = 0; l < m->d.n_layers; l++) {
        const tz_linear *lin = m->layers[l].lin;
        for (int j = TZ_LIN_GATE; j <= TZ_LIN_DOWN; j++) {
            const tz_param *w = lin[j].w;
            if (!w->q || w->q->method != TZ_TQ_TURBOQUANT || w->trainable || lin[j].bias ||
                (lin[j].a && lin[j].b->w16))
                return 0;
        }
        const tz_qweight *g = lin[TZ_LIN_GATE].w->q, *u = lin[TZ_LIN_UP].w->q;
        const tz_qweight *dn = lin[TZ_LIN_DOWN].w->q;
        if (g->group != u->group || g->seed != u->seed || m->d.hidden % (2 * dn->group))
            return 0;
    }
    return 1;
}

/* Down's window of fc columns: codes and scales floats (whole floats: fc a multiple of twice
 * the group), the most over the layers */
static int64_t win_codes_floats(const tz_llama *m, int64_t fc) {
    int64_t most = 0;
    for (int64_t l = 0; l < m->d.n_layers; l++) {
        const tz_qweight *q = m->layers[l].lin[TZ_LIN_DOWN].w->q;
        const int64_t f = m->d.dim * (fc / q->group) * TZ_TQ_GROUP_BYTES(q->group, q->bits) / 4;
        most = f > most ? f : most;
    }
    return most;
}
static int64_t win_scales_floats(const tz_llama *m, int64_t fc) {
    int64_t most = 0;
    for (int64_t l = 0; l < m->d.n_layers; l++) {
        const int64_t f = m->d.dim * (fc / m->layers[l].lin[TZ_LIN_DOWN].w->q->group) / 2;
        most = f > most ? f : most;
    }
    return most;
}
/* the unit of a chunk: twice the largest group of down */
static int64_t cols_unit(const tz_llama *m) {
    int64_t g = 0;
    for (int64_t l = 0; l < m->d.n_layers; l++) {
        const int64_t q = m->layers[l].lin[TZ_LIN_DOWN].w->q->group;
        g = q > g ? q : g;
    }
    return 2 * g;
}
/* fc rounded up to the unit */
static int64_t cols_round(int64_t fc, int64_t unit) { return (fc + unit - 1) / unit * unit; }

/* Columns of the hidden size at a time in backward for BT rows: equal chunks (whole units) of
 * at most TZ_LLAMA_MLP_FLOATS / BT columns (or mlp_cols_max), one unit at least; 0 where the
 * MLP cannot run so (mlp_cols_ok). */
static int64_t mlp_cols_for(const tz_llama *m, int64_t BT) {
    if (!mlp_cols_ok(m)) return 0;
    const int64_t F = m->d.hidden, unit = cols_unit(m);
    int64_t most = TZ_LLAMA_MLP_FLOATS / BT;
    if (m->mlp_cols_max > 0 && m->mlp_cols_max < most) most = m->mlp_cols_max;
    most = most / unit * unit;
    if (most < unit) most = unit;
    const int64_t k = (F + most - 1) / most;
    return cols_round((F + k - 1) / k, unit);
}

/* The view of gate and up restricted to rows [f0, f0 + fc) of each (their outputs' columns):
 * the codes and scales of those rows, the adapter's B rows and their gradient's; A whole. */
typedef struct gu_view {
    tz_linear lin[2];
    tz_param w[2], b[2];
    tz_qweight q[2];
    const tz_linear *ls[2];
} gu_view;
static void gu_view_at(gu_view *v, const tz_llama_layer *L, int64_t f0, int64_t fc) {
    for (int i = 0; i < 2; i++) {
        const tz_linear *l = &L->lin[TZ_LIN_GATE + i];
        const tz_qweight *q = l->w->q;
        const int64_t per_row = l->in / q->group;
        v->q[i] = *q;
        if (q->codes)
            v->q[i].codes = q->codes + f0 * per_row * TZ_TQ_GROUP_BYTES(q->group, q->bits);
        v->q[i].scales = q->scales + f0 * per_row;
        v->w[i] = *l->w;
        v->w[i].q = &v->q[i];
        v->w[i].shape[0] = fc, v->w[i].numel = fc * l->in;
        v->lin[i] = *l;
        v->lin[i].out = fc;
        v->lin[i].w = &v->w[i];
        if (l->a) {
            v->b[i] = *l->b;
            v->b[i].w = l->b->w + f0 * l->r;
            v->b[i].g = l->b->g ? l->b->g + f0 * l->r : NULL;
            v->b[i].shape[0] = fc, v->b[i].numel = fc * l->r;
            v->lin[i].b = &v->b[i];
        }
        v->ls[i] = &v->lin[i];
    }
}

/* Columns [f0, f0 + fc) of down (W [dim, hidden]) into the pool's window: its codes and
 * scales as a weight [dim, fc] of its own (*w), and its adapter's A [r, fc] where it has one
 * (into a). */
static void down_window(tz_backend *be, const tz_linear *down, int64_t f0, int64_t fc,
                        uint8_t *codes, uint16_t *scales, float *a, tz_qweight *w) {
    const tz_qweight *q = down->w->q;
    const int64_t F = down->in, C = down->out, gb = TZ_TQ_GROUP_BYTES(q->group, q->bits);
    if (!q->codes)
        TZ_FATAL("%s: a streamed weight used while its block is not loaded", down->w->name);
    be->copy2d(be, (float *)(void *)codes, fc / q->group * gb / 4,
               (const float *)(const void *)(q->codes + f0 / q->group * gb),
               F / q->group * gb / 4, C, fc / q->group * gb / 4);
    be->copy2d(be, (float *)(void *)scales, fc / q->group / 2,
               (const float *)(const void *)(q->scales + f0 / q->group), F / q->group / 2, C,
               fc / q->group / 2);
    *w = *q;
    w->codes = codes, w->scales = scales;
    if (down->a) be->copy2d(be, a, fc, down->a->w + f0, F, down->r, fc);
}

/* The forward's pool in chunks of fc columns on BT rows: g, u, s, s rotated and s in bf16,
 * down's window and its A's (r_down: its adapter's rank, 0 without) */
static int64_t fwd_cols_floats(const tz_llama *m, int64_t BT, int64_t fc, int64_t r_down) {
    return 3 * al16(BT * fc) + 2 * half16(BT * fc) + al16(win_codes_floats(m, fc)) +
           al16(win_scales_floats(m, fc)) + (r_down ? al16(r_down * fc) : 0);
}

/* Walks every allocation of tz_llama_setup; with a NULL arena it only counts bytes. */
static size_t acts_walk(tz_llama *m, tz_arena *a, int64_t B, int64_t T) {
    const tz_llama_dims *d = &m->d;
    const int64_t BT = B * T, C = d->dim, F = d->hidden;
    const int64_t qd = d->n_heads * d->head_dim, kvd = d->n_kv_heads * d->head_dim;
    const int64_t R = mlp_rows_for(m, BT);
    const int chunked = R < BT;
    const int64_t FC = chunked ? mlp_cols_for(m, BT) : 0; /* chunks of columns instead */
    const int64_t r_down = m->layers[0].lin[TZ_LIN_DOWN].a ? m->o.lora.rank : 0;
    size_t total = 0;
#define TAKE(ptr, n, what) TZ_ARENA_TAKE(a, &total, ptr, n, what)
    /* on a device backend, bf16 streams live on the host and xb is dh (free in forward) */
    const int dev = m->be->device, xb_dh = dev && !m->o.forward_only;
    int n_sets = tz_layer_stack_walk_ex(&m->stack, m->be, a, &total, d->n_layers,
                                        m->o.checkpointing, m->o.forward_only,
                                        sizeof(tz_llama_acts), BT * C,
                                        m->be->matmul_dtype == TZ_DT_BF16,
                                        (dev ? TZ_STACK_HOST : 0) | (xb_dh ? TZ_STACK_XB_OWN : 0));
    const int att16 = keeps_att16(m);
    /* With att16 the fp32 q, k, v live only from their GEMMs to rope16 and to_bf16, in the
     * attention half of a layer's forward, when the MLP's buffers are free: they take the
     * set's g and u (q in g, k and v in u: F at least qd and 2 kvd, as every Llama) or, with
     * MLP chunks, the pool (grown to hold them where it must) instead of memory of their own. */
    const int qkv_gu = att16 && !chunked && qd <= F && 2 * kvd <= F, qkv_pool = att16 && chunked;
    if (a) m->mlp_rows = m->mlp_rows_fwd = R, m->mlp_chunked = chunked, m->pool = NULL;
    if (a) m->ds_room = NULL, m->ds_room_bytes = 0;
    if (a) m->mlp_cols = m->mlp_cols_fwd = FC, memset(&m->mlp_fc, 0, sizeof m->mlp_fc);
    if (a) m->att16 = att16, m->pool_floats = 0; /* (attention's inputs: att_inputs) */
    /* the gradients of q and k in bf16 (qk_dy16) where a layer takes them, and room for them:
     * with MLP chunks at the pool's end (below), else where datt was (read by then): the
     * set's g (B*T*F floats, bwd_in_set below) where they fit, or datt's own memory */
    int qk16 = 0;
    for (int64_t l = 0; att16 && l < d->n_layers; l++)
        qk16 |= qk_dy16(m->be, d, &m->layers[l]);
    const int64_t qk16_floats = half16(BT * kvd) + half16(BT * qd); /* dk's, then dq's */
    if (!chunked && qd <= F && 2 * kvd <= F && qk16_floats > BT * F) qk16 = 0;
    if (a) m->qk16 = qk16, m->qk16_room = NULL;
    for (int i = 0; i < n_sets; i++) {
        tz_llama_acts *s = a ? tz_layer_stack_set(&m->stack, i) : NULL;
#define ACT(field, n) TAKE(s->field, n, #field) /* s is NULL only while sizing */
        ACT(h1, BT * C); ACT(rstd1, BT);
        if (!qkv_gu && !qkv_pool) { ACT(q, BT * qd); ACT(k, BT * kvd); ACT(v, BT * kvd); }
        if (d->qk_norm) {
            ACT(qn, BT * qd); ACT(kn, BT * kvd);
            ACT(rq, BT * d->n_heads); ACT(rk, BT * d->n_kv_heads);
        }
        ACT(att, BT * qd); ACT(lse, BT * d->n_heads); ACT(x2, BT * C);
        if (chunked) { /* h2 in h1; g, u, s in the pool below */
            if (a) s->h2 = s->h1;
        } else ACT(h2, BT * C);
        ACT(rstd2, BT);
        if (!chunked) { ACT(g, BT * F); ACT(u, BT * F); ACT(s, BT * F); }
        if (a && qkv_gu) s->q = s->g, s->k = s->u, s->v = s->u + BT * kvd;
        for (int j = 0; j < TZ_LIN_N; j++)
            if (m->o.lora.targets & (1 << j)) ACT(lh[j], BT * m->o.lora.rank);
        if (att16) { /* bf16: half a float each */
            ACT(q16, (BT * qd + 1) / 2); ACT(k16, (BT * kvd + 1) / 2); ACT(v16, (BT * kvd + 1) / 2);
        }
#undef ACT
    }
    /* attention's outputs kept (tz_llama.keep): a second buffer of att and lse beside the
     * set's, the first layers' on the host */
    tz_att_keep_walk(&m->keep, m->be, a, &total,
                     tz_att_keep_wanted(m->be, m->o.checkpointing, m->o.forward_only, d->n_layers),
                     d->n_layers, BT * qd, BT * d->n_heads, 1);
    if (a && m->keep.on) {
        tz_llama_acts *s0 = tz_layer_stack_set(&m->stack, 0);
        m->keep.att2[0] = s0->att, m->keep.lse2[0] = s0->lse;
    }
    int64_t rows = m->head_rows_max > 0 ? m->head_rows_max : TZ_LLAMA_HEAD_FLOATS / d->vocab;
    m->head_rows = rows < 1 ? 1 : rows < BT ? rows : BT;
    float *pool = NULL;
    if (chunked) {
        /* one pool, used in turn: the MLP's g, u, s, du, ds (mlp_rows each); the head's hf and
         * logits; backward's dk, dv (and dq, datt where they do not fit h2 and x2) */
        const int64_t RF = al16(R * F), fit = qd <= C;
        int64_t n = 5 * RF;
        if (al16(BT * C) + m->head_rows * d->vocab > n) n = al16(BT * C) + m->head_rows * d->vocab;
        const int64_t att_grads0 = 2 * al16(BT * kvd) + (fit ? 0 : 2 * al16(BT * qd));
        const int64_t att_grads = att_grads0 + (qk16 ? qk16_floats : 0);
        if (att_grads > n) n = att_grads;
        const int64_t qkv = qkv_pool ? al16(BT * qd) + 2 * al16(BT * kvd) : 0;
        if (qkv > n) n = qkv;
        /* chunks of columns: g, u, s, du, ds of BT x FC, dres in bf16, down's window and its
         * adapter's pieces */
        const int64_t RC = al16(BT * FC),
                      fc_win = FC ? al16(win_codes_floats(m, FC)) + al16(win_scales_floats(m, FC))
                                  : 0;
        int64_t xr = 0; /* gate's and up's input, rotated once for all chunks */
        if (FC) {
            gu_view v;
            gu_view_at(&v, &m->layers[0], 0, FC);
            xr = al16(tz_linear_fwd_prep_floats(v.ls, 2, BT));
        }
        const int64_t fc_all = FC ? 5 * RC + half16(BT * C) + fc_win + xr +
                                        (r_down ? al16(BT * r_down) + 2 * al16(r_down * FC) +
                                                      al16(r_down * F)
                                                : 0)
                                  : 0;
        if (fc_all > n) n = fc_all;
        TAKE(pool, n, "pool: fp32 q, k, v, MLP chunks, head, attention gradients");
        if (a) {
            m->pool = pool, m->pool_floats = n;
            m->qk16_room = qk16 ? pool + att_grads0 : NULL;
            /* (qk16_room is written after attention's backward, from its dq and dk) */
            m->ds_room = m->o.forward_only ? NULL : pool + att_grads0;
            m->ds_room_bytes = m->o.forward_only ? 0 : (size_t)(n - att_grads0) * sizeof(float);
            for (int i = 0; qkv_pool && i < n_sets; i++) { /* q, k, v in forward (above) */
                tz_llama_acts *s = tz_layer_stack_set(&m->stack, i);
                s->q = pool, s->k = pool + al16(BT * qd), s->v = s->k + al16(BT * kvd);
            }
            tz_llama_acts *s = tz_layer_stack_set(&m->stack, 0);
            s->g = pool, s->u = pool + RF, s->s = pool + 2 * RF;
            m->du = pool + 3 * RF, m->ds = pool + 4 * RF;
            m->hf = pool, m->logits = pool + al16(BT * C);
            if (FC) {
                float *p = pool;
                m->mlp_fc.g = p, m->mlp_fc.u = p + RC, m->mlp_fc.s = p + 2 * RC;
                m->mlp_fc.du = p + 3 * RC, m->mlp_fc.ds = p + 4 * RC;
                p += 5 * RC;
                m->mlp_fc.dres16 = (uint16_t *)(void *)p;
                p += half16(BT * C);
                m->mlp_fc.codes = (uint8_t *)(void *)p;
                p += al16(win_codes_floats(m, FC));
                m->mlp_fc.scales = (uint16_t *)(void *)p;
                p += al16(win_scales_floats(m, FC));
                m->mlp_fc.xr = p, m->mlp_fc.xr_floats = xr;
                p += xr;
                if (r_down) {
                    m->mlp_fc.dh = p, p += al16(BT * r_down);
                    m->mlp_fc.a = p, p += al16(r_down * FC);
                    m->mlp_fc.da = p, p += al16(r_down * FC);
                    m->mlp_fc.da_all = p;
                }
            }
        }
    } else {
        TAKE(m->hf, BT * C, "final norm");
    }
    TAKE(m->rstdf, BT, "final rstd");
    if (!chunked) TAKE(m->logits, m->head_rows * d->vocab, "logits");
    TAKE(m->losses, BT, "losses");
    TAKE(m->tok, BT, "tokens"); TAKE(m->tgt, BT, "targets");
    if (!m->o.forward_only) { /* backward buffers */
        TAKE(m->dres, BT * C, "dres"); TAKE(m->dh, BT * C, "dh");
        if (d->qk_norm) { TAKE(m->dqn, BT * qd, "dq before q_norm"); TAKE(m->dkn, BT * kvd, "dk before k_norm"); }
        if (a && xb_dh && m->stack.x16) m->stack.xb = m->dh;
        if (chunked) { /* layer_bwd_chunked: dg in the chunk's s */
            m->bwd_in_set = 0;
            if (a) {
                tz_llama_acts *s = tz_layer_stack_set(&m->stack, 0);
                const int fit = qd <= C;
                m->dk = pool, m->dv = pool + al16(BT * kvd);
                m->datt = fit ? s->h2 : pool + 2 * al16(BT * kvd);
                m->dq = fit ? s->x2 : pool + 2 * al16(BT * kvd) + al16(BT * qd);
                m->dg = NULL;
            }
        } else {
            /* layer_bwd puts dg, datt and dq in the layer's s, g and u once it has read them,
             * and dk, dv in ds once read, where they fit (F at least qd and 2 kvd: every
             * Llama) */
            m->bwd_in_set = qd <= F && 2 * kvd <= F;
            if (a && m->bwd_in_set) m->dq = m->dk = m->dv = m->datt = m->dg = NULL;
            if (!m->bwd_in_set) { /* (datt grown to hold the bf16 dq, dk where it must) */
                TAKE(m->dq, BT * qd, "dq"); TAKE(m->dk, BT * kvd, "dk"); TAKE(m->dv, BT * kvd, "dv");
                TAKE(m->datt, qk16 && qk16_floats > BT * qd ? qk16_floats : BT * qd, "datt");
                TAKE(m->dg, BT * F, "dg");
            }
            TAKE(m->du, BT * F, "du"); TAKE(m->ds, BT * F, "ds");
            /* du, read for the last time by gate's and up's backward, lent to attention's */
            if (a) m->ds_room = m->du, m->ds_room_bytes = (size_t)(BT * F) * sizeof(float);
        }
        TAKE(m->dlora, BT * (m->o.lora.rank > 0 ? m->o.lora.rank : 1), "dlora");
    }
    /* attention's workspace, where the backend wants one (core/backend.h) */
    const size_t att_ws = tz_attention_ws_bytes(m->be, B, T, d->n_heads, d->head_dim,
                                               !m->o.forward_only, att16);
    if (a) m->att_ws = NULL, m->att_ws_bytes = att_ws;
    if (att_ws) TAKE(m->att_ws, (int64_t)(att_ws / sizeof(float)), "attention workspace");
    /* quantized weights: one decode tile for all of them, one activation scratch for the
     * most any linear needs (tz_linear_act_floats: the rotated input of a TurboQuant
     * projection, and with bf16 GEMMs the rounded dy and x of the backward), the MLP's on
     * mlp_rows rows; q, k, v and gate, up share their input (tz_linear_*_shared) */
    int64_t act = 0;
    const int bwd = !m->o.forward_only;
    for (int64_t l = 0; l < d->n_layers; l++) {
        const tz_llama_layer *L = &m->layers[l];
        /* the linears whose dy comes in bf16 (attn_bwd, layer_bwd) take no room to round it */
        int given[TZ_LIN_N] = {0};
        given[TZ_LIN_Q] = given[TZ_LIN_K] = qk16 && qk_dy16(m->be, d, L);
        given[TZ_LIN_V] = att16 && tz_linear_takes_dy16(m->be, &L->lin[TZ_LIN_V]);
        given[TZ_LIN_GATE] = given[TZ_LIN_UP] = gate_up_dy16(m->be, L);
        for (int j = 0; j < TZ_LIN_N; j++) {
            const tz_linear *lj = &L->lin[j];
            const tz_qweight *q = lj->w->q;
            if (q && q->method != TZ_TQ_TURBOQUANT) continue; /* absmax: no scratch */
            const int64_t nr = j >= TZ_LIN_GATE ? R : BT;
            const int mode = bwd && given[j] ? TZ_LINEAR_BWD_DY16 : bwd;
            int64_t n = tz_linear_act_floats(m->be, &lj, 1, nr, mode);
            if (n > act) act = n;
            if (j != TZ_LIN_Q && j != TZ_LIN_GATE) continue;
            /* the group it leads, on one input: q, k, v; gate, up */
            const tz_linear *grp[3] = {lj, lj + 1, lj + 2};
            const int count = j == TZ_LIN_Q ? 3 : 2;
            int all = bwd;
            for (int i = 0; i < count; i++) all &= given[j + i];
            n = tz_linear_act_floats(m->be, grp, count, nr, all ? TZ_LINEAR_BWD_DY16 : bwd);
            if (n > act) act = n;
        }
        if (FC) { /* chunks of columns: gate and up on every row, FC of their outputs; down's
                   * input rotated and rounded (two bf16 copies of BT x FC) */
            gu_view v;
            gu_view_at(&v, L, 0, FC);
            int64_t n = tz_linear_act_floats(m->be, v.ls, 2, BT,
                                             gate_up_dy16(m->be, L) ? TZ_LINEAR_BWD_DY16 : bwd);
            if (n > act) act = n;
        }
    }
    total += tz_quant_scratch_walk_act(
        &m->tq, &m->params, a, act, m->be,
        tz_linear_fold_cols(m->be, m->o.lora.targets ? m->o.lora.rank : 0, m->d.qkv_bias));
    /* forward's MLP chunks: g, u, s only, so the fewest equal chunks whose three buffers fit
     * the pool and whose rows x `in` of each MLP projection fit the rotation buffer */
    for (int64_t n = 1; a && chunked && n <= BT; n++) {
        const int64_t rf = (BT + n - 1) / n;
        int fits = 3 * al16(rf * F) <= m->pool_floats;
        for (int64_t l = 0; l < d->n_layers; l++)
            for (int j = TZ_LIN_GATE; j <= TZ_LIN_DOWN; j++) {
                const tz_param *w = m->layers[l].lin[j].w;
                if (w->q && w->q->method == TZ_TQ_TURBOQUANT && rf * w->shape[1] > act) fits = 0;
            }
        if (fits) {
            m->mlp_rows_fwd = rf;
            break;
        }
    }
    /* and in chunks of columns: g, u, s, down's input rotated and rounded, its window and its
     * A's, so the fewest equal chunks (whole units) that fit the pool (FC's do) */
    for (int64_t k = 1; a && FC && k <= d->hidden; k++) {
        const int64_t fc = cols_round((d->hidden + k - 1) / k, cols_unit(m));
        if (fwd_cols_floats(m, BT, fc, r_down) <= m->pool_floats) {
            m->mlp_cols_fwd = fc;
            break;
        }
    }
#undef TAKE
    return total;
}

size_t tz_llama_arena_bytes(const tz_llama *m, int64_t B, int64_t T) {
    return acts_walk((tz_llama *)m, NULL, B, T);
}

void tz_llama_setup(tz_llama *m, int64_t B, int64_t T) {
    if (T > m->d.max_pos)
        tz_warn("sequence length %lld exceeds the model's max_position_embeddings %lld",
                (long long)T, (long long)m->d.max_pos);
    tz_att_keep_free(&m->keep); /* (its copies done before the memory they read goes) */
    tz_arena_free(&m->arena);
    if (m->loss_host) m->be->host_free(m->be, m->loss_host);
    m->B = B;
    m->T = T;
    tz_arena_init(&m->arena, m->be, tz_llama_arena_bytes(m, B, T));
    acts_walk(m, &m->arena, B, T);
    /* pinned: the losses come down on the copy queue while backward runs (head) */
    m->loss_host = m->be->host_alloc(m->be, (size_t)(B * T) * sizeof *m->loss_host);
}

/* ---- forward ---- */

/* The frequency table of a RoPE with one (rope_scaling) in backend memory, made on first use:
 * a model that never needs it holds none. */
static const float *inv_freq_of(tz_llama *m) {
    if (!m->inv_freq) {
        const tz_llama_dims *d = &m->d;
        const size_t bytes = (size_t)(d->head_dim / 2) * sizeof(float);
        float *inv = tz_xmalloc(bytes);
        tz_llama_inv_freq(d, inv);
        m->inv_freq = m->be->alloc(m->be, bytes);
        m->be->upload(m->be, m->inv_freq, inv, bytes);
        free(inv);
    }
    return m->inv_freq;
}

/* RoPE on x [B, T, H, head_dim] at positions pos0 + t: the theta op where it suffices (no
 * scaling, no offset; every backend has it), else the op with the frequency table. */
static void rope(tz_llama *m, float *x, int64_t B, int64_t T, int64_t H, int64_t pos0, int bwd) {
    tz_backend *be = m->be;
    const tz_llama_dims *d = &m->d;
    if (d->rope_type == TZ_ROPE_DEFAULT && pos0 == 0) {
        if (bwd) be->rope_bwd(be, x, B, T, H, d->head_dim, (float)d->theta);
        else be->rope_fwd(be, x, B, T, H, d->head_dim, (float)d->theta);
        return;
    }
    if (!be->rope_tab_fwd || !be->rope_tab_bwd)
        TZ_FATAL("llama: the %s backend has no RoPE with a frequency table (needed for "
                 "rope_scaling and for generation)", be->name);
    if (bwd) be->rope_tab_bwd(be, x, B, T, H, d->head_dim, inv_freq_of(m), pos0);
    else be->rope_tab_fwd(be, x, B, T, H, d->head_dim, inv_freq_of(m), pos0);
}

/* RoPE of x [B, T, H, head_dim] (positions 0..) into y in bf16, x kept: one pass, the theta op
 * or the one with the frequency table (bwd: the inverse rotation, for a gradient). */
static void rope16(tz_llama *m, uint16_t *y, const float *x, int64_t B, int64_t T, int64_t H,
                   int bwd) {
    tz_backend *be = m->be;
    const tz_llama_dims *d = &m->d;
    const int64_t D = d->head_dim;
    if (d->rope_type == TZ_ROPE_DEFAULT)
        (bwd ? be->rope_bwd16 : be->rope_fwd16)(be, y, x, B, T, H, D, (float)d->theta);
    else (bwd ? be->rope_tab_bwd16 : be->rope_tab_fwd16)(be, y, x, B, T, H, D, inv_freq_of(m), 0);
}

/* The attention's inputs as tz_llama_acts holds them: q, k, v, or (att16) their bf16 copies */
static const tz_att_ld att16_ld = {0, 0, 0, 1, 0};
static void att_inputs(const tz_llama *m, const tz_llama_acts *a, const float *p[3],
                       const tz_att_ld **ld) {
    p[0] = m->att16 ? (const float *)(const void *)a->q16 : a->q;
    p[1] = m->att16 ? (const float *)(const void *)a->k16 : a->k;
    p[2] = m->att16 ? (const float *)(const void *)a->v16 : a->v;
    *ld = m->att16 ? &att16_ld : NULL;
}

/* Rows r0.. of a [rows, width] buffer that may be NULL (a projection without adapter). */
static float *rows_at(float *p, int64_t r0, int64_t width) { return p ? p + r0 * width : NULL; }

/* The linears of L that read one input, from `first` (TZ_LIN_Q: q, k, v; TZ_LIN_GATE: gate,
 * up): their forward and backward through tz_linear_*_shared, which rotates and rounds the
 * input once for all. */
static int lin_set(const tz_llama_layer *L, int first, const tz_linear **ls) {
    const int n = first == TZ_LIN_Q ? 3 : 2;
    for (int i = 0; i < n; i++) ls[i] = &L->lin[first + i];
    return n;
}
/* Whether gate and up write g and u in bf16 (tz_linear_fwd_shared16; SwiGLU then reads them
 * widened, TZ_SWIGLU_IN16: a GEMM's bf16 epilogue instead of an fp32 write and read of
 * each), decided for the most rows the MLP takes at once in either pass (chunks of rows: the
 * forward's or the backward's; else all n), so that the forward and the backward's
 * recomputation round alike. (In chunks of columns the prepared path decides, mlp_fwd_cols.) */
static int gu_out16(const tz_llama *m, const tz_llama_layer *L, int64_t n) {
    if (m->mlp_chunked) n = m->mlp_rows > m->mlp_rows_fwd ? m->mlp_rows : m->mlp_rows_fwd;
    const tz_linear *ls[3];
    return tz_linear_shared_y16(m->be, ls, lin_set(L, TZ_LIN_GATE, ls), n);
}
/* Whether the v projection writes attention's bf16 v itself (its GEMM's epilogue rounding,
 * the bits to_bf16 would make of its fp32 output on the emulation: an fp32 write, a read and
 * a pass fewer), on the shared path of q, k and v */
static int v16_direct(const tz_llama *m, const tz_llama_layer *L, int64_t n) {
    const tz_linear *ls[3];
    return tz_linear_shared_y16(m->be, ls, lin_set(L, TZ_LIN_Q, ls), n);
}
/* gate and up on n rows of h2 into g and u, in bf16 where y16 */
static void gate_up_fwd(tz_backend *be, const tz_llama_layer *L, float *g, float *u,
                        float *const *hs, const float *h2, int64_t n, int y16) {
    const tz_linear *ls[3];
    float *ys[2] = {g, u};
    tz_linear_fwd_shared16(be, ls, ys, hs, lin_set(L, TZ_LIN_GATE, ls), h2, n, y16 ? 3 : 0);
}
/* Each linear's dy: d16[i] in bf16 bit patterns where not NULL (swiglu_bwd's out_bf16,
 * rope_bwd16, attention's bf16 dv), else dys[i] in fp32 */
static void lins_bwd(tz_backend *be, const tz_llama_layer *L, int first, float *dx,
                     const float *const *dys, const uint16_t *const *d16, const float *x,
                     const float *const *hs, float *scratch, int64_t n, int dx_set) {
    const tz_linear *ls[3];
    tz_linear_bwd_shared16(be, ls, lin_set(L, first, ls), dx, dys, d16, x, hs, scratch, n,
                           dx_set);
}
/* dg and du as swiglu_bwd wrote them: in bf16 (gu16) or fp32 */
static void gate_up_bwd(tz_backend *be, const tz_llama_layer *L, float *dx, float *dg, float *du,
                        int gu16, const float *x, const float *const *hs, float *scratch,
                        int64_t n) {
    const float *dys[2] = {gu16 ? NULL : dg, gu16 ? NULL : du};
    const uint16_t *d16[2] = {gu16 ? (const uint16_t *)(const void *)dg : NULL,
                              gu16 ? (const uint16_t *)(const void *)du : NULL};
    lins_bwd(be, L, TZ_LIN_GATE, dx, dys, d16, x, hs, scratch, n, 1);
}

/* The MLP on n rows in chunks of mlp_cols_fwd columns (tz_llama.mlp_cols): each chunk's g, u
 * and s on every row, s rotated from its group column on (and rounded, for the adapter) and
 * multiplied by down's window of columns, added into out; down's adapter hidden s A^T
 * likewise, then out += scale h B^T once. */
static void mlp_fwd_cols(tz_llama *m, const tz_llama_layer *L, tz_llama_acts *a, float *out,
                         int64_t n) {
    tz_backend *be = m->be;
    const int64_t C = m->d.dim, F = m->d.hidden, FC = m->mlp_cols_fwd;
    const tz_linear *down = &L->lin[TZ_LIN_DOWN];
    const tz_qweight *q = down->w->q;
    /* the forward's layout of the pool: g, u, s, s rotated and s in bf16, down's window, its
     * A's (fwd_cols_floats) */
    float *g = m->pool, *u = g + al16(n * FC), *s = u + al16(n * FC), *p = s + al16(n * FC);
    uint16_t *sr = (uint16_t *)(void *)p, *s16 = sr + 2 * half16(n * FC);
    p += 2 * half16(n * FC);
    uint8_t *codes = (uint8_t *)(void *)p;
    p += al16(win_codes_floats(m, FC));
    uint16_t *scales = (uint16_t *)(void *)p;
    float *aw = p + al16(win_scales_floats(m, FC));
    float *hd = a->lh[TZ_LIN_DOWN];
    float *hs[2] = {a->lh[TZ_LIN_GATE], a->lh[TZ_LIN_UP]};
    /* gate's and up's input rotated (and rounded, and their adapters' h) once for every
     * chunk, in the rotation buffer */
    gu_view v0;
    gu_view_at(&v0, L, 0, FC);
    const int prepared = tz_linear_fwd_shared_prep(be, v0.ls, hs, 2, a->h2, n, m->tq.act,
                                                   m->tq.act_floats);
    const int in16 = prepared ? TZ_SWIGLU_IN16 : 0; /* g and u in bf16 (the prepared path) */
    for (int64_t f0 = 0; f0 < F; f0 += FC) {
        const int64_t fc = F - f0 < FC ? F - f0 : FC;
        gu_view v;
        gu_view_at(&v, L, f0, fc);
        float *ys[2] = {g, u};
        if (prepared)
            tz_linear_fwd_shared_apply(be, v.ls, ys, (const float *const *)hs, 2, n, m->tq.act,
                                       3);
        else tz_linear_fwd_shared(be, v.ls, ys, hs, 2, a->h2, n);
        /* s rotated from its group column on (and rounded, for the adapter); from g and u in
         * bf16 in one pass, s never stored in fp32 (swiglu_rot16_at) */
        if (in16)
            be->swiglu_rot16_at(be, sr, (const uint16_t *)(const void *)g,
                                (const uint16_t *)(const void *)u, n, fc, fc, q->group, q->seed,
                                f0, F, down->a ? s16 : NULL);
        else be->swiglu_fwd(be, s, g, u, n * fc, 0);
        tz_qweight w;
        down_window(be, down, f0, fc, codes, scales, aw, &w);
        if (!in16)
            be->tq_rotate16_at(be, sr, s, n, fc, fc, q->group, q->seed, f0, F,
                               down->a ? s16 : NULL);
        be->tq_matmul(be, out, sr, 1, down->tq->tile, w.codes, w.scales, w.levels, C, fc,
                      w.bits, w.group, n, 1, 1.0f, f0 ? 1.0f : 0.0f);
        if (down->a) /* h (+)= s A^T over this window */
            be->matmul16(be, hd, s16, 1, aw, 0, n, down->r, fc, 0, 1, 1.0f, f0 ? 1.0f : 0.0f);
    }
    if (down->a) /* out += scale h B^T */
        be->matmul(be, out, hd, down->b->w, n, C, down->r, 0, 1, down->scale, 1.0f);
}

/* The MLP on n rows: out = down(swiglu(gate(h2), up(h2))), mlp_rows rows at a time (all n at
 * once without chunks: g, u and s then hold every row, as backward reads them), or in chunks
 * of columns (mlp_fwd_cols; not while a probe watches the linears: it knows them whole). */
static void mlp_fwd(tz_llama *m, const tz_llama_layer *L, tz_llama_acts *a, float *out,
                    int64_t n) {
    if (m->mlp_cols && !tz_linear_probing()) {
        mlp_fwd_cols(m, L, a, out, n);
        return;
    }
    tz_backend *be = m->be;
    const int64_t C = m->d.dim, F = m->d.hidden, r = m->o.lora.rank;
    const int64_t R = m->mlp_chunked ? m->mlp_rows_fwd : n;
    /* chunks: g, u, s of mlp_rows_fwd rows each from the pool */
    float *g = a->g, *u = a->u, *s = a->s;
    if (m->mlp_chunked) g = m->pool, u = g + al16(R * F), s = u + al16(R * F);
    const int y16 = gu_out16(m, L, n);
    for (int64_t r0 = 0; r0 < n; r0 += R) {
        const int64_t c = n - r0 < R ? n - r0 : R;
        const float *h2 = a->h2 + r0 * C;
        float *hs[2] = {rows_at(a->lh[TZ_LIN_GATE], r0, r), rows_at(a->lh[TZ_LIN_UP], r0, r)};
        gate_up_fwd(be, L, g, u, hs, h2, c, y16);
        be->swiglu_fwd(be, s, g, u, c * F, y16 ? TZ_SWIGLU_IN16 : 0);
        tz_linear_fwd(be, &L->lin[TZ_LIN_DOWN], out + r0 * C,
                      rows_at(a->lh[TZ_LIN_DOWN], r0, r), s, c);
    }
}

/* Generation's key/value cache of one layer: keys and values of positions < pos0 written, cap
 * positions in all, in fp32 or (kv16) bf16. */
typedef struct layer_kv {
    void *k, *v;
    int64_t cap, pos0;
    int kv16;
} layer_kv;

/* One layer on B sequences of T rows: x -> out, saving its activations in a. kv NULL
 * (training): positions 0.., causal attention over the T rows. kv (generation, B = 1):
 * positions kv->pos0.., the new keys and values written into the cache, attention reading it.
 * mlp 0 (backward's recomputation with MLP chunks, which makes the MLP's activations chunk by
 * chunk itself): stop at h2, out unused. att_kept (backward's recomputation, tz_llama.keep):
 * a->att and a->lse already hold what attention's forward made of this layer's q, k, v. */
static void layer_fwd(tz_llama *m, const tz_llama_layer *L, tz_llama_acts *a, const float *x,
                      float *out, int64_t B, int64_t T, const layer_kv *kv, int mlp,
                      int att_kept) {
    tz_backend *be = m->be;
    const tz_llama_dims *d = &m->d;
    const int64_t BT = B * T, C = d->dim, pos0 = kv ? kv->pos0 : 0;
    be->rmsnorm_fwd(be, a->h1, a->rstd1, x, L->attn_norm->w, BT, C, (float)d->eps);
    const int qkn = d->qk_norm;
    /* v straight into bf16 by its GEMM where attention reads it so and the shared path can
     * (v16_direct), else in fp32 and rounded below */
    const int v16 = m->att16 && !kv && v16_direct(m, L, BT);
    float *ys[3] = {qkn ? a->qn : a->q, qkn ? a->kn : a->k,
                    v16 ? (float *)(void *)a->v16 : a->v};
    const tz_linear *lq[3];
    tz_linear_fwd_shared16(be, lq, ys, a->lh + TZ_LIN_Q, lin_set(L, TZ_LIN_Q, lq), a->h1, BT,
                           v16 ? 4 : 0);
    if (qkn) { /* Qwen3: each head of q and k through its RMSNorm */
        be->rmsnorm_fwd(be, a->q, a->rq, a->qn, L->q_norm->w, BT * d->n_heads, d->head_dim,
                        (float)d->eps);
        be->rmsnorm_fwd(be, a->k, a->rk, a->kn, L->k_norm->w, BT * d->n_kv_heads, d->head_dim,
                        (float)d->eps);
    }
    if (m->att16 && !kv) { /* q and k rotated into bf16, v rounded */
        rope16(m, a->q16, a->q, B, T, d->n_heads, 0);
        rope16(m, a->k16, a->k, B, T, d->n_kv_heads, 0);
        if (!v16) be->to_bf16(be, a->v16, a->v, BT * d->n_kv_heads * d->head_dim);
    } else {
        rope(m, a->q, B, T, d->n_heads, pos0, 0);
        rope(m, a->k, B, T, d->n_kv_heads, pos0, 0);
    }
    if (kv) {
        const int64_t kvd = d->n_kv_heads * d->head_dim;
        if (kv->kv16) {
            be->to_bf16(be, (uint16_t *)kv->k + pos0 * kvd, a->k, T * kvd);
            be->to_bf16(be, (uint16_t *)kv->v + pos0 * kvd, a->v, T * kvd);
        } else {
            be->copy(be, (float *)kv->k + pos0 * kvd, a->k, (size_t)(T * kvd) * sizeof(float));
            be->copy(be, (float *)kv->v + pos0 * kvd, a->v, (size_t)(T * kvd) * sizeof(float));
        }
        if (pos0 == 0) { /* a prompt's first pass: the cache holds its rows alone, which is
                          * attention_fwd's case (the same bits on the CPU: test_llama_generate),
                          * on a device the flash kernels' tensor cores, not a warp a row */
            be->att_ws = m->att_ws, be->att_ws_bytes = m->att_ws_bytes;
            be->attention_fwd(be, a->att, a->lse, a->q, a->k, a->v, 1, T, d->n_heads,
                              d->n_kv_heads, d->head_dim, 1, NULL);
        } else {
            be->attention_cache_fwd(be, a->att, a->q, kv->k, kv->v, 1, T, kv->cap, pos0,
                                    d->n_heads, d->n_kv_heads, d->head_dim, kv->kv16);
        }
    } else if (!att_kept) {
        const float *in[3];
        const tz_att_ld *ld;
        att_inputs(m, a, in, &ld);
        be->att_ws = m->att_ws, be->att_ws_bytes = m->att_ws_bytes;
        be->attention_fwd(be, a->att, a->lse, in[0], in[1], in[2], B, T, d->n_heads,
                          d->n_kv_heads, d->head_dim, 1, ld);
    }
    tz_linear_fwd(be, &L->lin[TZ_LIN_O], a->x2, a->lh[TZ_LIN_O], a->att, BT);
    be->axpy(be, a->x2, 1.0f, x, BT * C); /* x2 = x + attn */
    /* (with MLP chunks h2 overwrites h1, read for the last time above) */
    be->rmsnorm_fwd(be, a->h2, a->rstd2, a->x2, L->mlp_norm->w, BT, C, (float)d->eps);
    if (!mlp) return;
    mlp_fwd(m, L, a, out, BT);
    be->axpy(be, out, 1.0f, a->x2, BT * C); /* out = x2 + mlp */
}

static tz_llama_acts *acts_of(tz_llama *m, int64_t layer) {
    return tz_layer_stack_set(&m->stack, layer);
}

/* tz_llama.keep: layer l's att and lse to the host (to_host) or back */
static void att_copy(tz_llama *m, int64_t l, int to_host) {
    const int64_t BT = m->B * m->T;
    tz_att_keep_copy(&m->keep, l, to_host, BT * m->d.n_heads * m->d.head_dim, BT * m->d.n_heads);
}

/* tz_llama.keep: layer l's set points at its buffer, once the copy queue is done with it */
static void att_take(tz_llama *m, tz_llama_acts *a, int64_t l) {
    const int i = tz_att_keep_take(&m->keep, l);
    a->att = m->keep.att2[i], a->lse = m->keep.lse2[i];
}

/* Embedding, layers, final norm: m->hf holds the head's input. bwd: a backward follows (with
 * tz_llama.keep, the first layers' attention outputs go to the host for it). */
static void forward_body(tz_llama *m, const int32_t *inputs, const int32_t *targets, int bwd) {
    tz_backend *be = m->be;
    const tz_llama_dims *d = &m->d;
    const int64_t BT = m->B * m->T, C = d->dim;
    if (!m->arena.base) TZ_FATAL("llama: tz_llama_setup was not called");
    be->upload(be, m->tok, inputs, (size_t)BT * sizeof *inputs);
    be->upload(be, m->tgt, targets, (size_t)BT * sizeof *targets);
    tz_layer_stack *st = &m->stack;
    /* each stage's trainable weights as the pass reaches them (the optimizer's uploads of
     * later layers may still be on their way: tz_params_weights_needed) */
    tz_params_weights_needed(&m->params, (int)d->n_layers + 1);
    tz_embedding_w(be, tz_layer_stack_out(st, 0), m->tok, m->embed, BT, C);
    tz_layer_stack_put(st, be, 0);
    for (int64_t l = 0; l < d->n_layers; l++) {
        tz_params_weights_needed(&m->params, (int)(d->n_layers - l));
        tz_llama_acts *a = acts_of(m, l);
        if (m->keep.on) att_take(m, a, l);
        layer_fwd(m, &m->layers[l], a, tz_layer_stack_in(st, be, l),
                  tz_layer_stack_out(st, l + 1), m->B, m->T, NULL, 1, 0);
        if (m->keep.on && bwd) att_copy(m, l, 1); /* (the first n_layers - 2) */
        tz_layer_stack_put(st, be, l + 1);
    }
    tz_params_weights_needed(&m->params, 0);
    be->rmsnorm_fwd(be, m->hf, m->rstdf, tz_layer_stack_in(st, be, d->n_layers),
                    m->final_norm->w, BT, C, (float)d->eps);
}

/* The head, head_rows rows at a time: logits, per-row losses, and with backward the gradients
 * (dlogits in place, dh = dlogits W_head, dW_head += dlogits^T hf). The per-row losses then go
 * to the host on the copy queue, after the head's work, without the host waiting for them:
 * losses_sum waits and adds them (so backward is queued behind the head at once). */
static void *head(tz_llama *m, int backward, float dloss) {
    tz_backend *be = m->be;
    const int64_t BT = m->B * m->T, C = m->d.dim, V = m->d.vocab;
    for (int64_t r0 = 0; r0 < BT; r0 += m->head_rows) {
        const int64_t n = BT - r0 < m->head_rows ? BT - r0 : m->head_rows;
        const float *hf = m->hf + r0 * C;
        tz_matmul_w(be, m->logits, hf, m->lm_head, n, V, C, 1, 1.0f, 0.0f);
        be->xent_fwd(be, m->losses + r0, m->logits, m->tgt + r0, n, V);
        if (!backward) continue;
        be->xent_bwd(be, m->logits, m->logits, m->tgt + r0, dloss, n, V);
        tz_matmul_w(be, m->dh + r0 * C, m->logits, m->lm_head, n, C, V, 0, 1.0f, 0.0f);
        if (m->lm_head->g)
            be->matmul(be, m->lm_head->g, m->logits, hf, V, C, n, 1, 0, 1.0f, 1.0f);
    }
    return tz_model_send_host(be, m->loss_host, m->losses, (size_t)BT * sizeof(float));
}

/* The sum of the per-row losses head sent, once they are on the host (done: head's event). */
static double losses_sum(tz_llama *m, void *done) {
    tz_backend *be = m->be;
    tz_model_received(be, done);
    double sum = 0.0;
    for (int64_t i = 0; i < m->B * m->T; i++) sum += m->loss_host[i];
    return sum;
}

double tz_llama_forward(tz_llama *m, const int32_t *inputs, const int32_t *targets) {
    forward_body(m, inputs, targets, 0);
    return losses_sum(m, head(m, 0, 0.0f));
}

/* ---- backward ---- */

/* The attention half's backward, from m->dres = dL/dx2 (the MLP's norm path added): the
 * output projection, attention, RoPE, q, k, v and the input norm; dres becomes dL/dx. datt,
 * dq, dk, dv: where the gradients go. remake_h1: h1 is made again from x before q, k and v's
 * backward (with MLP chunks its memory held datt). */
static void attn_bwd(tz_llama *m, const tz_llama_layer *L, tz_llama_acts *a, const float *x,
                     float *datt, float *dq, float *dk, float *dv, int remake_h1) {
    tz_backend *be = m->be;
    const tz_llama_dims *d = &m->d;
    const int64_t B = m->B, T = m->T, BT = B * T, C = d->dim;
    tz_linear_bwd_set(be, &L->lin[TZ_LIN_O], datt, m->dres, a->att, a->lh[TZ_LIN_O], m->dlora, BT);
    const float *in[3];
    const tz_att_ld *ld;
    att_inputs(m, a, in, &ld);
    tz_att_ld ldv = ld ? *ld : (tz_att_ld){0};
    ldv.d16 = v_dy16(m, L) ? TZ_ATT_DV16 : 0;
    be->att_ws = m->att_ws, be->att_ws_bytes = m->att_ws_bytes;
    be->att_ds = m->ds_room, be->att_ds_bytes = m->ds_room_bytes;
    be->attention_bwd(be, dq, dk, dv, datt, a->att, a->lse, in[0], in[1], in[2], B, T,
                      d->n_heads, d->n_kv_heads, d->head_dim, 1, 0,
                      ldv.d16 ? &ldv : ld); /* dq, dk, dv written */
    uint16_t *dq16 = NULL, *dk16 = NULL;
    if (m->qk16 && qk_dy16(be, d, L)) { /* into datt's memory (read), or the pool's room */
        float *room = m->qk16_room ? m->qk16_room : datt;
        dk16 = (uint16_t *)(void *)room;
        dq16 = (uint16_t *)(void *)(room + half16(BT * d->n_kv_heads * d->head_dim));
        rope16(m, dq16, dq, B, T, d->n_heads, 1);
        rope16(m, dk16, dk, B, T, d->n_kv_heads, 1);
    } else {
        rope(m, dq, B, T, d->n_heads, 0, 1);
        rope(m, dk, B, T, d->n_kv_heads, 0, 1);
    }
    if (d->qk_norm) { /* through each head's RMSNorm: the gradients of q and k before it */
        be->rmsnorm_bwd(be, m->dqn, L->q_norm->g, dq, a->qn, L->q_norm->w, a->rq,
                        BT * d->n_heads, d->head_dim, 0); /* written */
        be->rmsnorm_bwd(be, m->dkn, L->k_norm->g, dk, a->kn, L->k_norm->w, a->rk,
                        BT * d->n_kv_heads, d->head_dim, 0);
        dq = m->dqn, dk = m->dkn;
    }
    if (remake_h1) /* h1 again, in its memory: the same op on the same x */
        be->rmsnorm_fwd(be, a->h1, a->rstd1, x, L->attn_norm->w, BT, C, (float)d->eps);
    const float *dqkv[3] = {dq16 ? NULL : dq, dk16 ? NULL : dk, ldv.d16 ? NULL : dv};
    const uint16_t *d16[3] = {dq16, dk16,
                              ldv.d16 ? (const uint16_t *)(const void *)dv : NULL};
    const float *lqkv[3] = {a->lh[TZ_LIN_Q], a->lh[TZ_LIN_K], a->lh[TZ_LIN_V]};
    lins_bwd(be, L, TZ_LIN_Q, m->dh, dqkv, d16, a->h1, lqkv, m->dlora, BT, 1); /* dh written */
    /* dres += norm path: now dL/dx */
    be->rmsnorm_bwd(be, m->dres, L->attn_norm->g, m->dh, x, L->attn_norm->w, a->rstd1, BT, C, 1);
}

static void layer_bwd(tz_llama *m, const tz_llama_layer *L, tz_llama_acts *a, const float *x) {
    tz_backend *be = m->be;
    const tz_llama_dims *d = &m->d;
    const int64_t BT = m->B * m->T, C = d->dim, F = d->hidden;
    const int64_t kvd = d->n_kv_heads * d->head_dim;
    /* m->dres holds dL/d(layer output). Where the sizes allow (tz_llama.bwd_in_set), the
     * gradients below take the memory of activations already read for the last time:
     * dg that of s (read by the down projection's backward), datt and dq those of g and u
     * (read by swiglu_bwd), dk and dv that of ds (likewise). */
    const int in_set = m->bwd_in_set;
    float *dg = in_set ? a->s : m->dg, *datt = in_set ? a->g : m->datt;
    float *dq = in_set ? a->u : m->dq, *dk = in_set ? m->ds : m->dk;
    float *dv = in_set ? m->ds + BT * kvd : m->dv;
    /* each gradient written by the first op that makes it (no zeroing before) */
    tz_linear_bwd_set(be, &L->lin[TZ_LIN_DOWN], m->ds, m->dres, a->s, a->lh[TZ_LIN_DOWN], m->dlora,
                      BT);
    const int gu16 = gate_up_dy16(be, L);
    be->swiglu_bwd(be, dg, m->du, m->ds, a->g, a->u, BT * F, 0,
                   (gu16 ? TZ_SWIGLU_OUT16 : 0) | (gu_out16(m, L, BT) ? TZ_SWIGLU_IN16 : 0));
    const float *lgu[2] = {a->lh[TZ_LIN_GATE], a->lh[TZ_LIN_UP]};
    gate_up_bwd(be, L, m->dh, dg, m->du, gu16, a->h2, lgu, m->dlora, BT);
    /* dres += norm path: now dL/dx2 */
    be->rmsnorm_bwd(be, m->dres, L->mlp_norm->g, m->dh, a->x2, L->mlp_norm->w, a->rstd2, BT, C, 1);
    attn_bwd(m, L, a, x, datt, dq, dk, dv, 0);
}

/* The MLP's backward in chunks of columns (tz_llama.mlp_cols), from m->dres = dL/d(layer
 * output): dres rounded once; per chunk, g, u, s made again on every row (s in bf16: only
 * GEMMs read it), ds = R^T (dres W_rot) on down's window of columns (+ dh A), SwiGLU's
 * backward, and gate's and up's on their rows of the chunk, added into dh; down's adapter's
 * hidden, its A's gradient a window at a time, its B's gradient once at the end. */
static void mlp_bwd_cols(tz_llama *m, const tz_llama_layer *L, tz_llama_acts *a) {
    tz_backend *be = m->be;
    const int64_t BT = m->B * m->T, C = m->d.dim, F = m->d.hidden, FC = m->mlp_cols;
    const tz_linear *down = &L->lin[TZ_LIN_DOWN];
    const tz_qweight *q = down->w->q;
    const int gu16 = gate_up_dy16(be, L);
    const int64_t r = down->r;
    const tz_llama_mlp_fc *P = &m->mlp_fc;
    float *hd = a->lh[TZ_LIN_DOWN];
    be->to_bf16(be, P->dres16, m->dres, BT * C);
    if (down->a) /* dh = scale dres B */
        be->matmul16(be, P->dh, P->dres16, 1, down->b->w, 0, BT, r, C, 0, 0, down->scale, 0.0f);
    /* gate's and up's input rotated once for every chunk, in the pool (the rotation buffer
     * holds their backward's sums from chunk to chunk), where that path applies (else each
     * chunk makes it, and takes their backward whole) */
    float *hs[2] = {a->lh[TZ_LIN_GATE], a->lh[TZ_LIN_UP]};
    gu_view v0;
    gu_view_at(&v0, L, 0, FC);
    const int prepared = tz_linear_fwd_shared_prep(be, v0.ls, hs, 2, a->h2, BT, P->xr,
                                                   P->xr_floats);
    const int in16 = prepared ? TZ_SWIGLU_IN16 : 0; /* g and u in bf16, as the forward's */
    for (int64_t f0 = 0; f0 < F; f0 += FC) {
        const int64_t fc = F - f0 < FC ? F - f0 : FC;
        gu_view v;
        gu_view_at(&v, L, f0, fc);
        float *ys[2] = {P->g, P->u};
        if (prepared)
            tz_linear_fwd_shared_apply(be, v.ls, ys, (const float *const *)hs, 2, BT, P->xr, 3);
        else tz_linear_fwd_shared(be, v.ls, ys, hs, 2, a->h2, BT);
        if (down->a) /* (read by its adapter) */
            be->swiglu_fwd(be, P->s, P->g, P->u, BT * fc, TZ_SWIGLU_OUT16 | in16);
        const uint16_t *s16 = (const uint16_t *)(const void *)P->s;
        tz_qweight w;
        down_window(be, down, f0, fc, P->codes, P->scales, P->a, &w);
        /* ds = R^T (dres W_rot's columns), through du's memory */
        be->tq_matmul(be, P->du, P->dres16, 1, down->tq->tile, w.codes, w.scales, w.levels, C,
                      fc, w.bits, w.group, BT, 0, 1.0f, 0.0f);
        be->tq_rotate_bwd_at(be, P->ds, P->du, BT, fc, q->group, q->seed, 0, f0, F);
        if (down->a) {
            /* h (+)= s A^T, as the forward made it; dA's window = dh^T s; ds += dh A */
            be->matmul16(be, hd, s16, 1, P->a, 0, BT, r, fc, 0, 1, 1.0f, f0 ? 1.0f : 0.0f);
            if (down->a->g) {
                be->matmul16(be, P->da, P->dh, 0, s16, 1, r, fc, BT, 1, 0, 1.0f, 0.0f);
                be->copy2d(be, P->da_all + f0, F, P->da, fc, r, fc);
            }
            be->matmul(be, P->ds, P->dh, P->a, BT, fc, r, 0, 0, 1.0f, 1.0f);
        }
        float *dg = P->s; /* s was read for the last time */
        be->swiglu_bwd(be, dg, P->du, P->ds, P->g, P->u, BT * fc, 0,
                       (gu16 ? TZ_SWIGLU_OUT16 : 0) | in16);
        const float *dys[2] = {gu16 ? NULL : dg, gu16 ? NULL : P->du};
        const uint16_t *d16[2] = {gu16 ? (const uint16_t *)(const void *)dg : NULL,
                                  gu16 ? (const uint16_t *)(const void *)P->du : NULL};
        const float *lgu[2] = {a->lh[TZ_LIN_GATE], a->lh[TZ_LIN_UP]};
        if (prepared && gu16) /* the sums kept from chunk to chunk, finished after the last */
            tz_linear_bwd_shared_part(be, v.ls, 2, m->dh, d16, a->h2, lgu, m->dlora, BT, 1,
                                      (f0 == 0 ? TZ_LINEAR_PART_FIRST : 0) |
                                          (f0 + fc == F ? TZ_LINEAR_PART_LAST : 0));
        else
            tz_linear_bwd_shared16(be, v.ls, 2, m->dh, dys, d16, a->h2, lgu, m->dlora, BT,
                                   f0 == 0);
    }
    if (down->a && down->b->g) /* dB += scale dres^T h */
        be->matmul16(be, down->b->g, P->dres16, 1, hd, 0, C, r, BT, 1, 0, down->scale, 1.0f);
    if (down->a && down->a->g) be->axpy(be, down->a->g, 1.0f, P->da_all, r * F);
}

/* layer_bwd with MLP chunks (tz_llama.mlp_chunked): a holds the layer's activations up to
 * h2 (x2 and h2 included); each chunk's g, u, s are made again from h2 (and the down
 * projection's LoRA hidden from s), then its gradients go back to dh; h1 is made again from
 * x before the q, k, v backward. */
static void layer_bwd_chunked(tz_llama *m, const tz_llama_layer *L, tz_llama_acts *a,
                              const float *x) {
    tz_backend *be = m->be;
    const tz_llama_dims *d = &m->d;
    const int64_t BT = m->B * m->T, C = d->dim, F = d->hidden;
    const int64_t R = m->mlp_rows, r = m->o.lora.rank;
    const tz_linear *down = &L->lin[TZ_LIN_DOWN];
    const int gu16 = gate_up_dy16(be, L);
    /* s is read here only by GEMMs (the down projection's LoRA hidden and its backward), which
     * round it to bf16 where their operands are bf16: SwiGLU then writes it so, the same bits
     * without the fp32 write and a rounding pass for each GEMM */
    const int s16 = tz_linear_rounds_bf16(be);
    const uint16_t *s_16 = (const uint16_t *)(const void *)a->s;
    const int s_read = down->a || tz_linear_bwd_reads_x(down);
    const int y16 = !m->mlp_cols && gu_out16(m, L, BT), in16 = y16 ? TZ_SWIGLU_IN16 : 0;
    if (m->mlp_cols) mlp_bwd_cols(m, L, a);
    for (int64_t r0 = 0; !m->mlp_cols && r0 < BT; r0 += R) { /* each chunk: its rows of dh */
        const int64_t c = BT - r0 < R ? BT - r0 : R;
        const float *h2 = a->h2 + r0 * C, *dres = m->dres + r0 * C;
        float *dh = m->dh + r0 * C, *lh_down = rows_at(a->lh[TZ_LIN_DOWN], r0, r);
        float *lh_gate = rows_at(a->lh[TZ_LIN_GATE], r0, r), *lh_up = rows_at(a->lh[TZ_LIN_UP], r0, r);
        float *hs[2] = {lh_gate, lh_up};
        gate_up_fwd(be, L, a->g, a->u, hs, h2, c, y16);
        /* (s only where down's backward reads it: a frozen down without an adapter does not) */
        if (s_read)
            be->swiglu_fwd(be, a->s, a->g, a->u, c * F, (s16 ? TZ_SWIGLU_OUT16 : 0) | in16);
        if (down->a && s16) /* the down projection's LoRA hidden s A^T, as its forward made it */
            be->matmul16(be, lh_down, s_16, 1, down->a->w, 0, c, down->r, F, 0, 1, 1.0f, 0.0f);
        else if (down->a)
            be->matmul(be, lh_down, a->s, down->a->w, c, down->r, F, 0, 1, 1.0f, 0.0f);
        if (!s_read) tz_linear_bwd_set(be, down, m->ds, dres, NULL, lh_down, m->dlora, c);
        else if (s16)
            tz_linear_bwd_set_x16(be, down, m->ds, dres, NULL, s_16, lh_down, m->dlora, c);
        else tz_linear_bwd_set(be, down, m->ds, dres, a->s, lh_down, m->dlora, c);
        float *dg = a->s; /* s was read for the last time */
        be->swiglu_bwd(be, dg, m->du, m->ds, a->g, a->u, c * F, 0,
                       (gu16 ? TZ_SWIGLU_OUT16 : 0) | in16);
        const float *lgu[2] = {lh_gate, lh_up};
        gate_up_bwd(be, L, dh, dg, m->du, gu16, h2, lgu, m->dlora, c);
    }
    /* dres += norm path: now dL/dx2 */
    be->rmsnorm_bwd(be, m->dres, L->mlp_norm->g, m->dh, a->x2, L->mlp_norm->w, a->rstd2, BT, C, 1);
    /* datt in h2's memory, dq in x2's (both read for the last time), dk, dv in the pool */
    attn_bwd(m, L, a, x, m->datt, m->dq, m->dk, m->dv, 1);
}

double tz_llama_forward_backward(tz_llama *m, const int32_t *inputs, const int32_t *targets,
                                 float dloss) {
    tz_backend *be = m->be;
    const tz_llama_dims *d = &m->d;
    const int64_t BT = m->B * m->T, C = d->dim;
    if (m->o.forward_only) TZ_FATAL("llama: built for forward passes only (no backward buffers)");
    forward_body(m, inputs, targets, 1);
    tz_params_backward_begins(&m->params); /* (the head's chunks interleave both ways) */
    void *loss_done = head(m, 1, dloss); /* dh = d(loss)/d(hf); the losses on their way */
    be->rmsnorm_bwd(be, m->dres, m->final_norm->g, m->dh, tz_layer_stack_in(&m->stack, be, d->n_layers),
                    m->final_norm->w, m->rstdf, BT, C, 0); /* dres written */
    tz_params_stage_done(&m->params, 0);
    for (int64_t l = d->n_layers - 1; l >= 0; l--) {
        tz_llama_acts *a = acts_of(m, l);
        if (m->keep.on) { /* layer l - 1's outputs on their way back while this one runs */
            att_copy(m, l - 1, 0);
            att_take(m, a, l);
        }
        /* checkpointing: recompute the layer (the last one's activations are still there);
         * its output goes to dh, free until layer_bwd fills it */
        const float *x = tz_layer_stack_in(&m->stack, be, l);
        if (tz_layer_stack_recompute(&m->stack, l))
            layer_fwd(m, &m->layers[l], a, x, m->dh, m->B, m->T, NULL, !m->mlp_chunked,
                      m->keep.on);
        if (m->mlp_chunked) layer_bwd_chunked(m, &m->layers[l], a, x);
        else layer_bwd(m, &m->layers[l], a, x);
        tz_params_stage_done(&m->params, (int)(d->n_layers - l));
    }
    if (m->embed->g) be->embedding_bwd(be, m->embed->g, m->tok, m->dres, BT, C);
    tz_params_stage_done(&m->params, (int)d->n_layers + 1);
    return losses_sum(m, loss_done);
}

/* ---- generation ---- */

void tz_llama_cache_init(tz_llama *m, tz_llama_cache *c, int64_t cap) {
    const int64_t L = m->d.n_layers, kvd = m->d.n_kv_heads * m->d.head_dim;
    c->cap = cap;
    c->len = 0;
    /* bf16 where the GEMMs take bf16 operands (a device's default): attention's training
     * kernels read k and v rounded so too; half the memory and half the reads a step */
    c->kv16 = m->be->matmul_dtype == TZ_DT_BF16;
    c->k = tz_xcalloc((size_t)L, sizeof *c->k);
    c->v = tz_xcalloc((size_t)L, sizeof *c->v);
    const size_t bytes = (size_t)(cap * kvd) * (c->kv16 ? 2 : sizeof(float));
    for (int64_t l = 0; l < L; l++) {
        c->k[l] = m->be->alloc(m->be, bytes);
        c->v[l] = m->be->alloc(m->be, bytes);
    }
}

void tz_llama_cache_free(tz_llama *m, tz_llama_cache *c) {
    for (int64_t l = 0; c->k && l < m->d.n_layers; l++) {
        m->be->release(m->be, c->k[l]);
        m->be->release(m->be, c->v[l]);
    }
    free(c->k);
    free(c->v);
    memset(c, 0, sizeof *c);
}

const float *tz_llama_decode(tz_llama *m, tz_llama_cache *c, const int32_t *tok, int64_t n) {
    tz_backend *be = m->be;
    const tz_llama_dims *d = &m->d;
    const int64_t C = d->dim;
    if (!m->arena.base || m->B != 1 || n < 1 || n > m->T)
        TZ_FATAL("llama: decode of %lld tokens needs tz_llama_setup(m, 1, T >= %lld)",
                 (long long)n, (long long)n);
    if (!be->attention_cache_fwd)
        TZ_FATAL("llama: the %s backend has no attention over a key/value cache", be->name);
    if (c->len + n > c->cap)
        TZ_FATAL("llama: the key/value cache holds %lld positions; %lld more do not fit",
                 (long long)c->cap, (long long)(c->len + n - c->cap));
    be->upload(be, m->tok, tok, (size_t)n * sizeof *tok);
    tz_params_weights_all(&m->params);
    tz_layer_stack *st = &m->stack;
    tz_embedding_w(be, tz_layer_stack_out(st, 0), m->tok, m->embed, n, C);
    tz_layer_stack_put(st, be, 0);
    for (int64_t l = 0; l < d->n_layers; l++) {
        const layer_kv kv = {c->k[l], c->v[l], c->cap, c->len, c->kv16};
        layer_fwd(m, &m->layers[l], acts_of(m, 0), tz_layer_stack_in(st, be, l),
                  tz_layer_stack_out(st, l + 1), 1, n, &kv, 1, 0);
        tz_layer_stack_put(st, be, l + 1);
    }
    c->len += n;
    const float *last = tz_layer_stack_in(st, be, d->n_layers) + (n - 1) * C;
    be->rmsnorm_fwd(be, m->hf, m->rstdf, last, m->final_norm->w, 1, C, (float)d->eps);
    tz_matmul_w(be, m->logits, m->hf, m->lm_head, 1, d->vocab, C, 1, 1.0f, 0.0f);
    return m->logits;
}
