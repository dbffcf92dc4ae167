/* DiT set-up: dims checks and presets, parameter registration (DiT names, backward stages),
 * initialisation, the position table and the activation arena. The forward and backward
 * passes are in dit_pass.c, loading and saving in dit_io.c. */
#include "model/dit.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/rng.h"

const char *const tz_dit_lin_names[TZ_DIT_LIN_N] = {"attn.qkv", "attn.proj", "mlp.fc1",
                                                    "mlp.fc2", "adaLN_modulation.1"};

enum { INIT_XAVIER, INIT_NORMAL, INIT_ZERO };

int tz_dit_check_dims(const tz_dit_dims *d, char *err, size_t errlen) {
    const char *why = NULL;
    char buf[200];
    if (d->input_size <= 0 || d->patch_size <= 0 || d->in_channels <= 0 || d->hidden <= 0 ||
        d->depth <= 0 || d->num_heads <= 0 || d->num_classes <= 0 || d->freq_dim <= 0)
        why = "every size (input_size, patch_size, in_channels, hidden_size, depth, num_heads, "
              "num_classes, frequency_embedding_size) must be positive";
    else if (d->input_size % d->patch_size)
        snprintf(buf, sizeof buf, "input_size %lld is not a multiple of patch_size %lld",
                 (long long)d->input_size, (long long)d->patch_size), why = buf;
    else if (d->hidden % d->num_heads || d->hidden % 4)
        snprintf(buf, sizeof buf, "hidden_size %lld must be a multiple of num_heads %lld and of "
                 "4 (the 2-D sin-cos table)", (long long)d->hidden, (long long)d->num_heads),
            why = buf;
    else if (d->freq_dim % 2)
        why = "frequency_embedding_size must be even";
    else if (!(d->mlp_ratio > 0.0) || tz_dit_mlp_hidden(d) < 1)
        why = "mlp_ratio must give a positive MLP width";
    else if (!(d->class_dropout_prob >= 0.0 && d->class_dropout_prob < 1.0))
        why = "class_dropout_prob must be in [0, 1)";
    else if (d->diffusion != TZ_DIFF_DDPM && d->diffusion != TZ_DIFF_FLOW)
        why = "diffusion must be ddpm or flow";
    if (why) snprintf(err, errlen, "dit: %s", why);
    return why != NULL;
}

/* The family's named shapes: input side, patch, channels, hidden, depth, heads, classes,
 * learned sigma; every one with MLP ratio 4, class dropout 0.1, 256 frequencies, DDPM. */
static const struct {
    const char *name;
    int64_t side, patch, channels, hidden, depth, heads, classes, learn_sigma;
} shapes[] = {
    {"tiny", 28, 4, 1, 64, 2, 4, 10, 0},
    {"small", 28, 2, 1, 128, 4, 4, 10, 0},
    {"dit-xl-2", 32, 2, 4, 1152, 28, 16, 1000, 1},
    {"dit-tiny", 8, 2, 4, 64, 2, 4, 10, 1},
};

int tz_dit_preset(const char *name, tz_dit_dims *d, char *err, size_t errlen) {
    const int n = (int)(sizeof shapes / sizeof *shapes);
    int i = 0;
    while (i < n && strcmp(shapes[i].name, name)) i++;
    if (i == n) {
        size_t used = (size_t)snprintf(err, errlen, "dit: preset \"%s\": expected ", name);
        for (int k = 0; k < n && used < errlen; k++)
            used += (size_t)snprintf(err + used, errlen - used, "%s%s",
                                     k == 0 ? "" : k + 1 < n ? ", " : " or ", shapes[k].name);
        return 1;
    }
    memset(d, 0, sizeof *d);
    d->input_size = shapes[i].side, d->patch_size = shapes[i].patch;
    d->in_channels = shapes[i].channels, d->hidden = shapes[i].hidden;
    d->depth = shapes[i].depth, d->num_heads = shapes[i].heads;
    d->num_classes = shapes[i].classes, d->learn_sigma = (int)shapes[i].learn_sigma;
    d->mlp_ratio = 4.0, d->class_dropout_prob = 0.1, d->freq_dim = 256;
    d->diffusion = TZ_DIFF_DDPM;
    return 0;
}

/* ---- registration ---- */

/* Records the backward stage and init rule of the parameter registered last. */
static tz_param *with_meta(tz_dit *m, tz_param *p, int stage, int init) {
    m->init_rule = tz_xrealloc(m->init_rule, (size_t)m->params.n * sizeof *m->init_rule);
    m->init_rule[m->params.n - 1] = init;
    p->stage = stage;
    return p;
}

static tz_param *add_param(tz_dit *m, const char *name, int ndim, int64_t d0, int64_t d1,
                           int trainable, int decay, int adapter, int stage, int init) {
    tz_param *p = tz_params_add(&m->params, m->be, name, ndim, d0, d1, trainable, decay, adapter);
    return with_meta(m, p, stage, init);
}

/* Registers MODULE.weight [out, in] and MODULE.bias [out], and LoRA A, B when lora_bit is
 * one of the targets (lora_bit < 0: never adapted). The weight is quantized when o.quant asks
 * for it and the linear is in a block (backward stages 1..depth). */
static void add_linear(tz_dit *m, tz_linear *L, const char *module, int64_t in, int64_t out,
                       int lora_bit, int stage, int init) {
    char name[TZ_NAME_MAX];
    int full = m->o.full;
    L->in = in;
    L->out = out;
    L->tq = &m->tq;
    snprintf(name, sizeof name, "%s.weight", module);
    const tz_quant_opts *q = &m->o.quant;
    if (q->bits && stage >= 1 && stage <= m->d.depth) {
        L->w = with_meta(m, tz_params_add_quant(&m->params, m->be, name, out, in, q->method,
                                                q->bits, q->group, q->seed, m->levels),
                         stage, init);
        L->w->trainable = full; /* full fine-tuning: fp32 master on the host, codes here */
    } else
        L->w = add_param(m, name, 2, out, in, full, 1, 0, stage, init);
    snprintf(name, sizeof name, "%s.bias", module);
    L->bias = add_param(m, name, 1, out, 1, full, 0, 0, stage, INIT_ZERO);
    L->a = L->b = NULL;
    L->r = 0;
    if (lora_bit >= 0 && (m->o.lora.targets & (1 << lora_bit))) {
        tz_linear_add_lora(L, &m->params, m->be, module, m->o.lora.rank, m->o.lora.alpha, stage);
        /* A and B start at zero (the init rule of the two tensors just added) */
        m->init_rule = tz_xrealloc(m->init_rule, (size_t)m->params.n * sizeof *m->init_rule);
        m->init_rule[m->params.n - 2] = m->init_rule[m->params.n - 1] = INIT_ZERO;
    }
}

/* DiT's get_2d_sincos_pos_embed: token m = i*g + j; the first half of the row encodes the
 * column j, the second the row i; each half is [sin(pos w_k), cos(pos w_k)], w_k =
 * 10000^(-k/(E/2)), E = hidden/2. Computed in double as numpy does, stored as float. */
static void make_pos_embed(tz_dit *m) {
    const int64_t g = m->d.input_size / m->d.patch_size, Hd = m->d.hidden, E = Hd / 2;
    const int64_t half = E / 2;
    float *h = tz_xmalloc((size_t)(g * g * Hd) * sizeof *h);
    for (int64_t i = 0; i < g; i++)
        for (int64_t j = 0; j < g; j++) {
            float *row = h + (i * g + j) * Hd;
            for (int64_t k = 0; k < half; k++) {
                double w = 1.0 / pow(10000.0, (double)k / (double)half);
                row[k] = (float)sin((double)j * w);
                row[half + k] = (float)cos((double)j * w);
                row[E + k] = (float)sin((double)i * w);
                row[E + half + k] = (float)cos((double)i * w);
            }
        }
    m->pos_embed = m->be->alloc(m->be, (size_t)(g * g * Hd) * sizeof(float));
    m->be->upload(m->be, m->pos_embed, h, (size_t)(g * g * Hd) * sizeof(float));
    free(h);
}

tz_dit *tz_dit_create(tz_backend *be, const tz_dit_dims *d, const tz_model_opts *o) {
    char err[256];
    if (tz_dit_check_dims(d, err, sizeof err)) TZ_FATAL("%s", err);
    if (o->lora.targets && o->lora.rank <= 0)
        TZ_FATAL("dit: LoRA targets given with rank %lld", (long long)o->lora.rank);
    tz_dit *m = tz_xcalloc(1, sizeof *m);
    m->d = *d;
    m->o = *o;
    m->be = be;
    tz_params_init(&m->params);
    m->params.weights_staged = 1; /* tz_dit_forward asks for its weights stage by stage */
    const int64_t Hd = d->hidden, p = d->patch_size, L = d->depth, emb = L + 1;
    if (o->quant.bits) {
        tz_quant_prepare(&o->quant, &m->cb, m->levels);
        const int64_t g = o->quant.group, F = tz_dit_mlp_hidden(d);
        if (Hd % g || F % g)
            TZ_FATAL_HINT("use quant.group = 64 (the tiny and small presets: hidden_size 64 and "
                          "128), or a group that divides both",
                          "dit: quant.group %lld must divide hidden_size %lld and the MLP width "
                          "%lld (the inputs of the quantized block weights)", (long long)g,
                          (long long)Hd, (long long)F);
    }
    char name[TZ_NAME_MAX];
    /* forward order; the flat layout reverses it. Stage = backward stage that finishes it. */
    add_linear(m, &m->x_emb, "x_embedder.proj", d->in_channels * p * p, Hd, -1, emb, INIT_XAVIER);
    add_linear(m, &m->t_fc1, "t_embedder.mlp.0", d->freq_dim, Hd, -1, emb, INIT_NORMAL);
    add_linear(m, &m->t_fc2, "t_embedder.mlp.2", Hd, Hd, -1, emb, INIT_NORMAL);
    m->y_table = add_param(m, "y_embedder.embedding_table.weight", 2, tz_dit_label_rows(d), Hd,
                           o->full || (o->lora.targets && o->lora.embeddings), 1, 0, emb,
                           INIT_NORMAL);
    m->blocks = tz_xcalloc((size_t)L, sizeof *m->blocks);
    for (int i = 0; i < L; i++) {
        tz_linear *B = m->blocks[i].lin;
        int st = (int)(L - i);
        const int64_t F = tz_dit_mlp_hidden(d);
        snprintf(name, sizeof name, "blocks.%d.adaLN_modulation.1", i);
        add_linear(m, &B[TZ_DIT_ADALN], name, Hd, 6 * Hd, TZ_DIT_ADALN, st, INIT_ZERO);
        snprintf(name, sizeof name, "blocks.%d.attn.qkv", i);
        add_linear(m, &B[TZ_DIT_QKV], name, Hd, 3 * Hd, TZ_DIT_QKV, st, INIT_XAVIER);
        snprintf(name, sizeof name, "blocks.%d.attn.proj", i);
        add_linear(m, &B[TZ_DIT_PROJ], name, Hd, Hd, TZ_DIT_PROJ, st, INIT_XAVIER);
        snprintf(name, sizeof name, "blocks.%d.mlp.fc1", i);
        add_linear(m, &B[TZ_DIT_FC1], name, Hd, F, TZ_DIT_FC1, st, INIT_XAVIER);
        snprintf(name, sizeof name, "blocks.%d.mlp.fc2", i);
        add_linear(m, &B[TZ_DIT_FC2], name, F, Hd, TZ_DIT_FC2, st, INIT_XAVIER);
    }
    add_linear(m, &m->f_ada, "final_layer.adaLN_modulation.1", Hd, 2 * Hd, TZ_DIT_ADALN, 0,
               INIT_ZERO);
    add_linear(m, &m->f_lin, "final_layer.linear", Hd, p * p * tz_dit_out_channels(d), -1, 0,
               INIT_ZERO);
    tz_params_layout(&m->params);
    m->cond_trainable = m->y_table->trainable || m->t_fc1.w->trainable ||
                        m->t_fc2.w->trainable;
    make_pos_embed(m);
    return m;
}

void tz_dit_free(tz_dit *m) {
    if (!m) return;
    tz_att_keep_free(&m->keep); /* (its copies done before the memory they read goes) */
    tz_arena_free(&m->arena);
    tz_params_free(&m->params, m->be);
    if (m->pos_embed) m->be->release(m->be, m->pos_embed);
    free(m->init_rule);
    free(m->blocks);
    tz_layer_stack_free(&m->stack);
    free(m->tfreq_host);
    if (m->sse_host) m->be->host_free(m->be, m->sse_host);
    free(m);
}

/* ---- initialisation ---- */

/* Parameter i by the rule it was registered with. */
static void fill_init(void *ctx, int i, const tz_param *p, tz_rng *r, float *h) {
    const int rule = ((const tz_dit *)ctx)->init_rule[i];
    /* xavier_uniform_: bound sqrt(6 / (fan_in + fan_out)) of the [out, in] matrix */
    const double arg = rule == INIT_NORMAL ? 0.02
                                           : sqrt(6.0 / (double)(p->shape[0] + p->shape[1]));
    for (int64_t k = 0; k < p->numel; k++) {
        if (rule == INIT_ZERO) h[k] = 0.0f;
        else if (rule == INIT_NORMAL) h[k] = (float)(arg * tz_rng_normal(r));
        else h[k] = (float)(arg * (2.0 * tz_rng_uniform(r) - 1.0));
    }
}

void tz_dit_init_random(tz_dit *m, uint64_t seed) {
    tz_model_init_base(&m->params, m->be, &m->cb, seed, fill_init, m);
}

/* ---- activation memory ---- */

/* Whether the block's linear inputs h1, h2, g are kept in bf16 (tz_dit.x16): what their GEMMs
 * read of them with bf16 operands, so the same results in half the memory. Dense qkv, fc1 and
 * fc2 weights only (a TurboQuant weight rotates its fp32 input), and a backward to keep them
 * for. */
static int keeps_x16(const tz_dit *m) {
    if (m->o.forward_only || !tz_linear_rounds_bf16(m->be) || !m->d.depth) return 0;
    const tz_linear *L = m->blocks[0].lin;
    return !L[TZ_DIT_QKV].w->q && !L[TZ_DIT_FC1].w->q && !L[TZ_DIT_FC2].w->q;
}
/* Whether q, k, v are kept in bf16 too (tz_dit.qkv16): the attention's kernels read them so,
 * and df (made for the MLP's hidden width) holds the projection's fp32 output meanwhile. */
static int keeps_qkv16(const tz_dit *m) {
    const tz_dit_dims *d = &m->d;
    return keeps_x16(m) && tz_dit_mlp_hidden(d) >= 3 * d->hidden &&
           tz_attention_takes_bf16(m->be, d->hidden / d->num_heads);
}

/* Walks every allocation of tz_dit_setup; with a NULL arena it only counts bytes. */
static size_t acts_walk(tz_dit *m, tz_arena *a, int64_t B) {
    const tz_dit_dims *d = &m->d;
    const int64_t T = tz_dit_tokens(d), BT = B * T, Hd = d->hidden, F = tz_dit_mlp_hidden(d);
    const int64_t p2 = d->patch_size * d->patch_size, HW = d->input_size * d->input_size;
    const int64_t Cin = d->in_channels, Cout = tz_dit_out_channels(d), r = m->o.lora.rank;
    size_t total = 0;
    const int x16 = keeps_x16(m), qkv16 = keeps_qkv16(m);
    if (a) m->x16 = x16, m->qkv16 = qkv16;
    /* floats for n elements of the linear inputs: half as many in bf16 */
#define XN(n) (x16 ? ((n) + 1) / 2 : (n))
#define TAKE(ptr, n, what) TZ_ARENA_TAKE(a, &total, ptr, n, what)
    TAKE(m->img, B * Cin * HW, "x_t"); TAKE(m->target, B * Cin * HW, "target");
    TAKE(m->patches, BT * Cin * p2, "patches"); TAKE(m->tfreq, B * d->freq_dim, "t features");
    TAKE(m->t_h, B * Hd, "t hidden"); TAKE(m->t_s, B * Hd, "t silu");
    TAKE(m->temb, B * Hd, "t embedding"); TAKE(m->c, B * Hd, "conditioning");
    TAKE(m->sc, B * Hd, "silu(c)"); TAKE(m->labels, B, "labels");
    int n_sets = tz_layer_stack_walk(&m->stack, a, &total, d->depth, m->o.checkpointing,
                                     m->o.forward_only, sizeof(tz_dit_acts), BT * Hd,
                                     m->be->matmul_dtype == TZ_DT_BF16);
    for (int i = 0; i < n_sets; i++) {
        tz_dit_acts *s = a ? tz_layer_stack_set(&m->stack, i) : NULL;
#define ACT(field, n) TAKE(s->field, n, #field) /* s is NULL only while sizing */
        ACT(mod, B * 6 * Hd); ACT(mean1, BT); ACT(rstd1, BT); ACT(ln1, BT * Hd);
        ACT(h1, XN(BT * Hd)); ACT(qkv, qkv16 ? (BT * 3 * Hd + 1) / 2 : BT * 3 * Hd);
        ACT(lse, BT * d->num_heads); ACT(att, BT * Hd); ACT(ao, BT * Hd); ACT(x2, BT * Hd);
        ACT(mean2, BT); ACT(rstd2, BT); ACT(ln2, BT * Hd); ACT(h2, XN(BT * Hd));
        ACT(f, BT * F); ACT(g, XN(BT * F)); ACT(mo, BT * Hd);
        for (int j = 0; j < TZ_DIT_LIN_N; j++)
            if (m->o.lora.targets & (1 << j)) ACT(lh[j], (j == TZ_DIT_ADALN ? B : BT) * r);
#undef ACT
    }
    /* attention's outputs kept (tz_dit.keep): a second buffer of att and lse beside the set's,
     * the first blocks' on the host */
    tz_att_keep_walk(&m->keep, m->be, a, &total,
                     tz_att_keep_wanted(m->be, m->o.checkpointing, m->o.forward_only, d->depth),
                     d->depth, BT * Hd, BT * d->num_heads, 1);
    if (a && m->keep.on) {
        tz_dit_acts *s0 = tz_layer_stack_set(&m->stack, 0);
        m->keep.att2[0] = s0->att, m->keep.lse2[0] = s0->lse;
    }
    TAKE(m->fmod, B * 2 * Hd, "final modulation"); TAKE(m->fmean, BT, "final mean");
    TAKE(m->frstd, BT, "final rstd"); TAKE(m->fln, BT * Hd, "final norm");
    TAKE(m->fh, BT * Hd, "final modulated"); TAKE(m->fo, BT * p2 * Cout, "final linear");
    if (m->o.lora.targets & (1 << TZ_DIT_ADALN)) TAKE(m->f_lh, B * r, "final adaLN lora");
    TAKE(m->out_img, B * Cout * HW, "prediction"); TAKE(m->sse, B, "squared errors");
    if (!m->o.forward_only) { /* backward buffers */
        TAKE(m->dres, BT * Hd, "dres"); TAKE(m->da, BT * Hd, "da"); TAKE(m->db, BT * Hd, "db");
        TAKE(m->dqkv, BT * 3 * Hd, "dqkv"); TAKE(m->df, BT * F, "df"); TAKE(m->dg, BT * F, "dg");
        TAKE(m->dmod, B * 6 * Hd, "dmod"); TAKE(m->dsc, B * Hd, "dsilu(c)");
        TAKE(m->dc, B * Hd, "dc"); TAKE(m->dt, B * Hd, "dt"); TAKE(m->dfo, BT * p2 * Cout, "dfo");
        TAKE(m->dimg, B * Cout * HW, "dprediction");
        TAKE(m->dlora, BT * (r > 0 ? r : 1), "dlora");
    }
    /* attention's workspace, where the backend wants one (core/backend.h) */
    const size_t att_ws = tz_attention_ws_bytes(m->be, B, T, d->num_heads, d->hidden / d->num_heads,
                                               !m->o.forward_only, qkv16);
    if (a) m->att_ws = NULL, m->att_ws_bytes = att_ws;
    if (att_ws) TAKE(m->att_ws, (int64_t)(att_ws / sizeof(float)), "attention workspace");
    /* quantized weights: one decode tile for all of them; one activation scratch for the most
     * any linear needs as the passes call it (tz_linear_act_floats: a TurboQuant input's
     * rotation and LoRA's columns, and, dense weights too, each dy rounded once for the GEMMs
     * of its backward) */
    /* the linears and their rows: the patch embedder and final linear on every token, the
     * conditioning's on one row per sample; a block's (all blocks alike) on every token but
     * adaLN's */
    const tz_linear *lins[TZ_DIT_LIN_N + 5] = {&m->x_emb, &m->f_lin, &m->t_fc1, &m->t_fc2,
                                               &m->f_ada};
    int64_t rows[TZ_DIT_LIN_N + 5] = {BT, BT, B, B, B};
    int nl = 5;
    for (int j = 0; j < TZ_DIT_LIN_N; j++, nl++)
        lins[nl] = &m->blocks[0].lin[j], rows[nl] = j == TZ_DIT_ADALN ? B : BT;
    int64_t act = 0;
    for (int i = 0; i < nl; i++) {
        const int64_t f = tz_linear_act_floats(m->be, &lins[i], 1, rows[i], !m->o.forward_only);
        if (f > act) act = f;
    }
    total += tz_quant_scratch_walk_act(&m->tq, &m->params, a, act, m->be,
                                       tz_linear_fold_cols(m->be, m->o.lora.targets ? m->o.lora.rank : 0, 1));
#undef TAKE
#undef XN
    return total;
}

size_t tz_dit_arena_bytes(const tz_dit *m, int64_t B) { return acts_walk((tz_dit *)m, NULL, B); }

void tz_dit_setup(tz_dit *m, int64_t B) {
    if (B <= 0) TZ_FATAL("dit: batch size %lld", (long long)B);
    tz_att_keep_free(&m->keep); /* (its copies done before the memory they read goes) */
    tz_arena_free(&m->arena);
    free(m->tfreq_host);
    if (m->sse_host) m->be->host_free(m->be, m->sse_host);
    m->B = m->n = B;
    tz_arena_init(&m->arena, m->be, tz_dit_arena_bytes(m, B));
    acts_walk(m, &m->arena, B);
    m->tfreq_host = tz_xmalloc((size_t)(B * m->d.freq_dim) * sizeof *m->tfreq_host);
    /* pinned: the losses come down on the copy queue while backward is queued */
    m->sse_host = m->be->host_alloc(m->be, (size_t)B * sizeof *m->sse_host);
}

void tz_dit_set_batch(tz_dit *m, int64_t n) {
    if (!m->arena.base) TZ_FATAL("dit: tz_dit_setup was not called");
    if (n <= 0 || n > m->B)
        TZ_FATAL("dit: batch %lld outside 1..%lld (the size given to tz_dit_setup)",
                 (long long)n, (long long)m->B);
    m->n = n;
}
