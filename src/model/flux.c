/* Flux set-up: dims checks and named shapes, parameter registration (diffusers names,
 * backward stages), initialisation and the activation arena. The passes are flux_pass.c,
 * loading flux_io.c. */
#include "model/flux.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/rng.h"
#include "quant/turboquant.h"

const char *const tz_flux_lin_names[TZ_FLUX_LIN_N] = {
    "to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out",
    "ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj", "ff_context.net.2", "norm1.linear",
    "norm1_context.linear", "proj_mlp", "proj_out", "norm.linear"};

int tz_flux_check_dims(const tz_flux_dims *d, char *err, size_t errlen) {
    const char *why = NULL;
    if (d->in_channels < 1 || d->out_channels < 1) why = "in_channels and out_channels must be >= 1";
    else if (d->layers < 0 || d->single_layers < 0 || d->layers + d->single_layers < 1)
        why = "num_layers + num_single_layers must be >= 1";
    else if (d->heads < 1 || d->head_dim < 2 || d->head_dim % 2)
        why = "num_attention_heads must be >= 1 and attention_head_dim even";
    else if (d->axes[0] < 0 || d->axes[1] < 0 || d->axes[2] < 0 || d->axes[0] % 2 ||
             d->axes[1] % 2 || d->axes[2] % 2 ||
             d->axes[0] + d->axes[1] + d->axes[2] != d->head_dim)
        why = "axes_dims_rope must be three even sizes adding up to attention_head_dim";
    else if (d->joint_dim < 1 || d->pooled_dim < 1)
        why = "joint_attention_dim and pooled_projection_dim must be >= 1";
    if (why) return tz_errf(err, errlen, "flux: %s", why);
    return 0;
}

static const struct {
    const char *name;
    int64_t in, layers, single, heads, head_dim, joint, pooled, guidance, a0, a1, a2;
} shapes[] = {
    {"flux-dev", 64, 19, 38, 24, 128, 4096, 768, 1, 16, 56, 56},
    {"flux-schnell", 64, 19, 38, 24, 128, 4096, 768, 0, 16, 56, 56},
    {"flux-tiny", 16, 2, 2, 4, 16, 32, 24, 1, 4, 6, 6},
};

int tz_flux_preset(const char *name, tz_flux_dims *d, char *err, size_t errlen) {
    const int n = (int)(sizeof shapes / sizeof *shapes);
    int i = 0;
    while (i < n && strcmp(shapes[i].name, name)) i++;
    if (i == n) {
        size_t used = (size_t)snprintf(err, errlen, "flux: preset \"%s\": expected ", name);
        for (int k = 0; k < n && used < errlen; k++)
            used += (size_t)snprintf(err + used, errlen - used, "%s%s",
                                     k == 0 ? "" : k + 1 < n ? ", " : " or ", shapes[k].name);
        return 1;
    }
    memset(d, 0, sizeof *d);
    d->in_channels = d->out_channels = shapes[i].in;
    d->layers = shapes[i].layers, d->single_layers = shapes[i].single;
    d->heads = shapes[i].heads, d->head_dim = shapes[i].head_dim;
    d->joint_dim = shapes[i].joint, d->pooled_dim = shapes[i].pooled;
    d->guidance = (int)shapes[i].guidance;
    d->axes[0] = shapes[i].a0, d->axes[1] = shapes[i].a1, d->axes[2] = shapes[i].a2;
    d->theta = 10000.0;
    return 0;
}

/* ---- registration ---- */

enum { INIT_NORMAL, INIT_ZERO, INIT_ONE };

typedef struct {
    tz_flux *m;
    int *rule; /* by registration index */
    int n;
} reg;

static tz_param *note(reg *r, tz_param *p, int stage, int rule) {
    r->rule = tz_xrealloc(r->rule, (size_t)r->m->params.n * sizeof *r->rule);
    for (int i = r->n; i < r->m->params.n; i++) r->rule[i] = INIT_ZERO; /* adapters */
    r->rule[r->m->params.n - 1] = rule;
    r->n = r->m->params.n;
    p->stage = stage;
    return p;
}

/* MODULE.weight [out, in] and MODULE.bias [out]; LoRA when bit is a target; the weight
 * quantized when o.quant asks and the linear is in a block. */
static void add_linear(reg *r, tz_linear *L, const char *module, int64_t in, int64_t out,
                       int bit, int stage, int in_block, int rule) {
    tz_flux *m = r->m;
    char name[TZ_NAME_MAX];
    const int full = m->o.full;
    L->in = in, L->out = out, L->tq = &m->tq;
    snprintf(name, sizeof name, "%s.weight", module);
    const tz_quant_opts *q = &m->o.quant;
    if (q->bits && in_block) {
        /* block k's backward stage is L - k: streamed blocks keep their codes on the host */
        const int64_t k = m->d.layers + m->d.single_layers - stage;
        m->params.codes_on_host = tz_wstream_has(&m->ws, k);
        L->w = note(r, tz_params_add_quant(&m->params, m->be, name, out, in, q->method, q->bits,
                                           q->group, q->seed, m->levels), stage, rule);
        m->params.codes_on_host = 0;
        if (L->w->q->host)
            tz_wstream_add(&m->ws, k, L->w->q, (size_t)tz_tq_codes_bytes(out, in, q->bits));
        L->w->trainable = full;
    } else {
        L->w = note(r, tz_params_add(&m->params, m->be, name, 2, out, in, full, 1, 0), stage, rule);
    }
    snprintf(name, sizeof name, "%s.bias", module);
    L->bias = note(r, tz_params_add(&m->params, m->be, name, 1, out, 1, full, 0, 0), stage,
                   INIT_ZERO);
    L->a = L->b = NULL;
    L->r = 0;
    if (bit >= 0 && (m->o.lora.targets & (1u << bit))) {
        tz_linear_add_lora(L, &m->params, m->be, module, m->o.lora.rank, m->o.lora.alpha, stage);
        note(r, L->b, stage, INIT_ZERO);
    }
}

static tz_param *add_norm(reg *r, const char *module, int64_t D, int stage) {
    char name[TZ_NAME_MAX];
    snprintf(name, sizeof name, "%s.weight", module);
    return note(r, tz_params_add(&r->m->params, r->m->be, name, 1, D, 1, r->m->o.full, 0, 0),
                stage, INIT_ONE);
}

static void add_double(reg *r, tz_flux_block *b, int i, int stage) {
    const tz_flux_dims *d = &r->m->d;
    const int64_t I = tz_flux_inner(d), F = tz_flux_mlp(d);
    char mod[TZ_NAME_MAX];
    static const struct {
        int lin;
        const char *name;
        int io; /* 0: I -> I, 1: I -> 6I, 2: I -> F, 3: F -> I */
        int rule;
    } lins[] = {{TZ_FLUX_NORM1, "norm1.linear", 1, INIT_ZERO},
                {TZ_FLUX_NORM1C, "norm1_context.linear", 1, INIT_ZERO},
                {TZ_FLUX_Q, "attn.to_q", 0, INIT_NORMAL},
                {TZ_FLUX_K, "attn.to_k", 0, INIT_NORMAL},
                {TZ_FLUX_V, "attn.to_v", 0, INIT_NORMAL},
                {TZ_FLUX_AQ, "attn.add_q_proj", 0, INIT_NORMAL},
                {TZ_FLUX_AK, "attn.add_k_proj", 0, INIT_NORMAL},
                {TZ_FLUX_AV, "attn.add_v_proj", 0, INIT_NORMAL},
                {TZ_FLUX_OUT, "attn.to_out.0", 0, INIT_NORMAL},
                {TZ_FLUX_AOUT, "attn.to_add_out", 0, INIT_NORMAL},
                {TZ_FLUX_FF1, "ff.net.0.proj", 2, INIT_NORMAL},
                {TZ_FLUX_FF2, "ff.net.2", 3, INIT_NORMAL},
                {TZ_FLUX_CFF1, "ff_context.net.0.proj", 2, INIT_NORMAL},
                {TZ_FLUX_CFF2, "ff_context.net.2", 3, INIT_NORMAL}};
    for (size_t k = 0; k < sizeof lins / sizeof *lins; k++) {
        const int64_t in = lins[k].io == 3 ? F : I;
        const int64_t out = lins[k].io == 1 ? 6 * I : lins[k].io == 2 ? F : I;
        snprintf(mod, sizeof mod, "transformer_blocks.%d.%s", i, lins[k].name);
        add_linear(r, &b->lin[lins[k].lin], mod, in, out, lins[k].lin, stage, 1, lins[k].rule);
        if (lins[k].lin == TZ_FLUX_K) { /* diffusers' order: the norms after to_k */
            snprintf(mod, sizeof mod, "transformer_blocks.%d.attn.norm_q", i);
            b->nq = add_norm(r, mod, d->head_dim, stage);
            snprintf(mod, sizeof mod, "transformer_blocks.%d.attn.norm_k", i);
            b->nk = add_norm(r, mod, d->head_dim, stage);
        }
        if (lins[k].lin == TZ_FLUX_AK) {
            snprintf(mod, sizeof mod, "transformer_blocks.%d.attn.norm_added_q", i);
            b->naq = add_norm(r, mod, d->head_dim, stage);
            snprintf(mod, sizeof mod, "transformer_blocks.%d.attn.norm_added_k", i);
            b->nak = add_norm(r, mod, d->head_dim, stage);
        }
    }
}

static void add_single(reg *r, tz_flux_block *b, int j, int stage) {
    const tz_flux_dims *d = &r->m->d;
    const int64_t I = tz_flux_inner(d), F = tz_flux_mlp(d);
    char mod[TZ_NAME_MAX];
    snprintf(mod, sizeof mod, "single_transformer_blocks.%d.norm.linear", j);
    add_linear(r, &b->lin[TZ_FLUX_NORM], mod, I, 3 * I, TZ_FLUX_NORM, stage, 1, INIT_ZERO);
    snprintf(mod, sizeof mod, "single_transformer_blocks.%d.proj_mlp", j);
    add_linear(r, &b->lin[TZ_FLUX_MLP], mod, I, F, TZ_FLUX_MLP, stage, 1, INIT_NORMAL);
    const int qkv[3] = {TZ_FLUX_Q, TZ_FLUX_K, TZ_FLUX_V};
    const char *qkv_names[3] = {"to_q", "to_k", "to_v"};
    for (int k = 0; k < 3; k++) {
        snprintf(mod, sizeof mod, "single_transformer_blocks.%d.attn.%s", j, qkv_names[k]);
        add_linear(r, &b->lin[qkv[k]], mod, I, I, qkv[k], stage, 1, INIT_NORMAL);
    }
    snprintf(mod, sizeof mod, "single_transformer_blocks.%d.attn.norm_q", j);
    b->nq = add_norm(r, mod, d->head_dim, stage);
    snprintf(mod, sizeof mod, "single_transformer_blocks.%d.attn.norm_k", j);
    b->nk = add_norm(r, mod, d->head_dim, stage);
    snprintf(mod, sizeof mod, "single_transformer_blocks.%d.proj_out", j);
    add_linear(r, &b->lin[TZ_FLUX_POUT], mod, I + F, I, TZ_FLUX_POUT, stage, 1, INIT_NORMAL);
}

tz_flux *tz_flux_create(tz_backend *be, const tz_flux_dims *d, const tz_model_opts *o) {
    char err[256];
    if (tz_flux_check_dims(d, err, sizeof err)) TZ_FATAL("%s", err);
    if (o->lora.targets && o->lora.rank <= 0)
        TZ_FATAL("flux: LoRA targets given with rank %lld", (long long)o->lora.rank);
    tz_flux *m = tz_xcalloc(1, sizeof *m);
    m->d = *d;
    m->o = *o;
    m->be = be;
    tz_params_init(&m->params);
    m->params.weights_staged = 1; /* tz_flux_forward asks for its weights stage by stage */
    const int64_t I = tz_flux_inner(d), F = tz_flux_mlp(d), Ld = d->layers, Ls = d->single_layers;
    if (o->quant.bits) {
        tz_quant_prepare(&o->quant, &m->cb, m->levels);
        const int64_t g = o->quant.group;
        if (I % g || F % g)
            TZ_FATAL("flux: quant.group %lld must divide the inner width %lld and the MLP width "
                     "%lld (the inputs of the quantized block weights)", (long long)g,
                     (long long)I, (long long)F);
    }
    if (o->quant.offload_blocks && (!o->quant.bits || o->full))
        TZ_FATAL("flux: quant.offload_blocks streams the codes of a frozen quantized base");
    tz_wstream_init(&m->ws, Ld + Ls, o->quant.offload_blocks);
    reg r = {m, NULL, 0};
    const int emb = (int)(Ld + Ls + 1);
    add_linear(&r, &m->x_emb, "x_embedder", d->in_channels, I, -1, emb, 0, INIT_NORMAL);
    add_linear(&r, &m->ctx_emb, "context_embedder", d->joint_dim, I, -1, emb, 0, INIT_NORMAL);
    add_linear(&r, &m->t1, "time_text_embed.timestep_embedder.linear_1", 256, I, -1, emb, 0,
               INIT_NORMAL);
    add_linear(&r, &m->t2, "time_text_embed.timestep_embedder.linear_2", I, I, -1, emb, 0,
               INIT_NORMAL);
    if (d->guidance) {
        add_linear(&r, &m->g1, "time_text_embed.guidance_embedder.linear_1", 256, I, -1, emb, 0,
                   INIT_NORMAL);
        add_linear(&r, &m->g2, "time_text_embed.guidance_embedder.linear_2", I, I, -1, emb, 0,
                   INIT_NORMAL);
    }
    add_linear(&r, &m->p1, "time_text_embed.text_embedder.linear_1", d->pooled_dim, I, -1, emb,
               0, INIT_NORMAL);
    add_linear(&r, &m->p2, "time_text_embed.text_embedder.linear_2", I, I, -1, emb, 0,
               INIT_NORMAL);
    m->blocks = tz_xcalloc((size_t)(Ld + Ls), sizeof *m->blocks);
    for (int i = 0; i < Ld; i++) add_double(&r, &m->blocks[i], i, (int)(Ls + Ld - i));
    for (int j = 0; j < Ls; j++) add_single(&r, &m->blocks[Ld + j], j, (int)(Ls - j));
    add_linear(&r, &m->norm_out, "norm_out.linear", I, 2 * I, -1, 0, 0, INIT_ZERO);
    add_linear(&r, &m->proj_out, "proj_out", I, d->out_channels, -1, 0, 0, INIT_ZERO);
    tz_params_layout(&m->params);
    if (o->quant.bits) {
        int nq = 0;
        for (int i = 0; i < m->params.n; i++) nq += m->params.p[i]->q != NULL;
        tz_info("flux: %d block weights quantized (%s, %d bits, group %lld); the embedders, "
                "the output layer, biases and norms dense", nq, tz_tq_method_name(o->quant.method),
                o->quant.bits, (long long)o->quant.group);
    }
    m->cond_trainable = m->o.full; /* the conditioning embedders train in full mode only */
    m->init_rule = r.rule;
    return m;
}

void tz_flux_free(tz_flux *m) {
    if (!m) return;
    tz_att_keep_free(&m->keep); /* (its copies done before the memory they read goes) */
    tz_arena_free(&m->arena);
    tz_params_free(&m->params, m->be);
    free(m->blocks);
    free(m->init_rule);
    tz_layer_stack_free(&m->stack);
    tz_wstream_free(&m->ws);
    free(m->feat_host), free(m->cs_host);
    if (m->sse_host) m->be->host_free(m->be, m->sse_host);
    free(m);
}

/* ---- initialisation ---- */

static void fill_init(void *ctx, int i, const tz_param *p, tz_rng *r, float *h) {
    const int rule = ((const tz_flux *)ctx)->init_rule[i];
    for (int64_t k = 0; k < p->numel; k++)
        h[k] = rule == INIT_ZERO ? 0.0f : rule == INIT_ONE ? 1.0f
                                                           : (float)(0.02 * tz_rng_normal(r));
}

void tz_flux_init_random(tz_flux *m, uint64_t seed) {
    tz_model_init_base(&m->params, m->be, &m->cb, seed, fill_init, m);
}

/* ---- activation memory ---- */

static size_t acts_walk(tz_flux *m, tz_arena *a, int64_t B, int64_t Ti, int64_t Tt) {
    const tz_flux_dims *d = &m->d;
    const int64_t I = tz_flux_inner(d), F = tz_flux_mlp(d), H = d->heads, T = Ti + Tt;
    const int64_t BT = B * T, Bi = B * Ti, Bc = B * Tt, r = m->o.lora.rank;
    const int64_t Cin = d->in_channels, Cout = d->out_channels, L = d->layers + d->single_layers;
    size_t total = 0;
#define TAKE(ptr, n, what) TZ_ARENA_TAKE(a, &total, ptr, n, what)
    TAKE(m->xt, Bi * Cin, "x_t"); TAKE(m->txt, Bc * d->joint_dim, "text embeddings");
    TAKE(m->pooled, B * d->pooled_dim, "pooled"); TAKE(m->target, Bi * Cout, "target");
    TAKE(m->tfeat, B * 256, "t features"); TAKE(m->gfeat, B * 256, "guidance features");
    TAKE(m->cs, T * d->head_dim, "rope table");
    TAKE(m->th, B * I, "t hidden"); TAKE(m->ts, B * I, "t silu");
    TAKE(m->gh, B * I, "g hidden"); TAKE(m->gs, B * I, "g silu");
    TAKE(m->ph, B * I, "pooled hidden"); TAKE(m->pss, B * I, "pooled silu");
    TAKE(m->temb, B * I, "conditioning"); TAKE(m->sc, B * I, "silu(conditioning)");
    /* with one sample a stream's rows are a slice of the joint ones (flux_pass.c, text_rows):
     * the streams' own buffers are left out */
    const int own = B > 1;
    if (a && !own)
        m->hi = m->hc = m->yi = m->yc = m->dyi = m->dyc = m->dd = m->dvi = m->dvc = NULL;
    if (own) { TAKE(m->hi, Bi * I, "image tokens"); TAKE(m->hc, Bc * I, "text tokens"); }
    /* on a device backend the bf16 streams live on the host, one on the device at a time */
    const int n_sets = tz_layer_stack_walk_ex(&m->stack, m->be, a, &total, L, m->o.checkpointing,
                                              m->o.forward_only, sizeof(tz_flux_acts), BT * I,
                                              m->be->matmul_dtype == TZ_DT_BF16,
                                              m->be->device ? TZ_STACK_HOST : 0);
    const int single_only = d->layers == 0, double_only = d->single_layers == 0;
    const char *ea = getenv("TZ_FLUX_ATT16"); /* 0: fp32 inputs (for measuring; the same bits) */
    const int att16 = m->be->device && tz_linear_rounds_bf16(m->be) &&
                      tz_attention_takes_bf16(m->be, d->head_dim) && !(ea && !strcmp(ea, "0"));
    if (a) m->att16 = att16; /* (then the norms write Q16 and K16 themselves: no fp32 Q, K) */
    for (int s = 0; s < n_sets; s++) {
        tz_flux_acts *x = a ? tz_layer_stack_set(&m->stack, s) : NULL;
        /* with checkpointing one set serves both kinds; else set s is layer s's */
        const int dbl = n_sets == 1 ? !single_only : s < d->layers;
        const int sgl = n_sets == 1 ? !double_only : s >= d->layers;
#define ACT(field, n) TAKE(x->field, n, #field)
        /* the i fields: the image stream's in a double block, every token's in a single one */
        const int64_t Ni = sgl ? BT : Bi;
        ACT(modi, B * 6 * I); ACT(V, BT * I);
        if (!att16) { ACT(Q, BT * I); ACT(K, BT * I); }
        else if (x) x->Q = x->K = NULL;
        ACT(lse, BT * H);
        if (att16) { ACT(Q16, (BT * I + 1) / 2); ACT(K16, (BT * I + 1) / 2); ACT(V16, (BT * I + 1) / 2); }
        else if (x) x->Q16 = x->K16 = x->V16 = NULL;
        ACT(ln1i, Ni * I); ACT(mean1i, Ni); ACT(rstd1i, Ni); ACT(h1i, Ni * I);
        ACT(qi, Ni * I); ACT(ki, Ni * I); ACT(vi, Ni * I); ACT(rqi, Ni * H); ACT(rki, Ni * H);
        ACT(fi, Ni * F);
        /* with one set for both kinds, the double-only and the single-only fields share
         * memory (a block uses one kind's): the walk lays both from the same mark */
        const size_t t0 = total, m0 = a ? tz_arena_mark(a) : 0;
        if (dbl) {
            ACT(modc, B * 6 * I); ACT(att, BT * I);
            if (x && !own) x->xi = x->xc = x->vc = x->atti = x->attc = NULL;
            if (own) { ACT(xi, Bi * I); ACT(xc, Bc * I); }
            ACT(ln1c, Bc * I); ACT(mean1c, Bc); ACT(rstd1c, Bc); ACT(h1c, Bc * I);
            ACT(qc, Bc * I); ACT(kc, Bc * I); ACT(rqc, Bc * H); ACT(rkc, Bc * H);
            if (own) { ACT(vc, Bc * I); ACT(atti, Bi * I); ACT(attc, Bc * I); }
            ACT(aoi, Bi * I); ACT(aoc, Bc * I);
            ACT(x2i, Bi * I); ACT(x2c, Bc * I);
            ACT(ln2i, Bi * I); ACT(mean2i, Bi); ACT(rstd2i, Bi); ACT(h2i, Bi * I);
            ACT(ln2c, Bc * I); ACT(mean2c, Bc); ACT(rstd2c, Bc); ACT(h2c, Bc * I);
            ACT(fc, Bc * F); ACT(moi, Bi * I); ACT(moc, Bc * I);
        }
        const size_t t_d = total, m_d = a ? tz_arena_mark(a) : 0;
        total = t0;
        if (a) tz_arena_reset(a, m0);
        if (sgl) { ACT(cat, BT * (I + F)); ACT(o, BT * I); }
        if (t_d > total) total = t_d;
        if (a && m_d > tz_arena_mark(a)) tz_arena_reset(a, m_d);
        for (int j = 0; j < TZ_FLUX_LIN_N; j++)
            if (m->o.lora.targets & (1u << j)) {
                const int cond = j == TZ_FLUX_NORM1 || j == TZ_FLUX_NORM1C || j == TZ_FLUX_NORM;
                ACT(lh[j], (cond ? B : BT) * r);
            }
#undef ACT
    }
    if (own) { TAKE(m->yi, Bi * I, "image output"); TAKE(m->yc, Bc * I, "text output"); }
    TAKE(m->fx, Bi * I, "final input"); TAKE(m->fmod, B * 2 * I, "final modulation");
    TAKE(m->fmean, Bi, "final mean"); TAKE(m->frstd, Bi, "final rstd");
    TAKE(m->fln, Bi * I, "final norm"); TAKE(m->fh, Bi * I, "final modulated");
    TAKE(m->pred, Bi * Cout, "prediction"); TAKE(m->sse, B, "squared errors");
    if (m->norm_out.a) TAKE(m->f_lh, B * r, "final adaLN lora");
    TAKE(m->wide1, BT * F, "wide scratch 1 (GELU output, its gradient)");
    if (!m->o.forward_only) {
        TAKE(m->dres, BT * I, "dres");
        if (own) { TAKE(m->dyi, Bi * I, "dyi"); TAKE(m->dyc, Bc * I, "dyc"); }
        TAKE(m->da, BT * I, "da"); TAKE(m->db, BT * I, "db");
        TAKE(m->dc, BT * I, "dc");
        if (own) TAKE(m->dd, BT * I, "dd");
        TAKE(m->dQ, BT * I, "dQ"); TAKE(m->dK, BT * I, "dK"); TAKE(m->dV, BT * I, "dV");
        TAKE(m->dqi, BT * I, "dqi"); TAKE(m->dki, BT * I, "dki");
        TAKE(m->dqc, Bc * I, "dqc"); TAKE(m->dkc, Bc * I, "dkc");
        if (own) { TAKE(m->dvi, BT * I, "dvi"); TAKE(m->dvc, Bc * I, "dvc"); }
        TAKE(m->datt, BT * I, "datt");
        TAKE(m->wide0, BT * (I + F), "wide scratch 0 (d[attention, MLP], dMLP hidden)");
        TAKE(m->dmodi, B * 6 * I, "dmodi"); TAKE(m->dmodc, B * 6 * I, "dmodc");
        TAKE(m->dsc, B * I, "dsilu(c)"); TAKE(m->dtemb, B * I, "dtemb");
        TAKE(m->dth, B * I, "dth"); TAKE(m->dts, B * I, "dts");
        TAKE(m->dpred, Bi * Cout, "dprediction");
        TAKE(m->dlora, BT * (r > 0 ? r : 1), "dlora");
    }
    /* attention's outputs kept (tz_flux.keep): two buffers of a block's, the first blocks' on
     * the host */
    tz_att_keep_walk(&m->keep, m->be, a, &total,
                     tz_att_keep_wanted(m->be, m->o.checkpointing, m->o.forward_only, L), L,
                     BT * I, BT * H, 0);
    const size_t att_ws = tz_attention_ws_bytes(m->be, B, T, H, d->head_dim, !m->o.forward_only,
                                                att16); /* (q, k, v in bf16 where att16) */
    if (a) m->att_ws = NULL, m->att_ws_bytes = att_ws;
    if (att_ws) TAKE(m->att_ws, (int64_t)(att_ws / sizeof(float)), "attention workspace");
    total += tz_quant_scratch_walk(&m->tq, &m->params, a, BT, m->be, !m->o.forward_only,
                                   m->o.lora.targets ? m->o.lora.rank : 0, 1 /* biases */);
    tz_wstream_walk(&m->ws, m->be, a, &total);
#undef TAKE
    return total;
}

size_t tz_flux_arena_bytes(const tz_flux *m, int64_t B, int64_t Ti, int64_t Tt) {
    return acts_walk((tz_flux *)m, NULL, B, Ti, Tt);
}

void tz_flux_setup(tz_flux *m, int64_t B, int64_t Ti, int64_t Tt) {
    if (B <= 0 || Ti <= 0 || Tt <= 0)
        TZ_FATAL("flux: batch %lld of %lld image and %lld text tokens", (long long)B,
                 (long long)Ti, (long long)Tt);
    tz_att_keep_free(&m->keep); /* (its copies done before the memory they read goes) */
    tz_arena_free(&m->arena);
    free(m->feat_host), free(m->cs_host);
    if (m->sse_host) m->be->host_free(m->be, m->sse_host);
    m->B = m->n = B, m->Ti = Ti, m->Tt = Tt;
    tz_arena_init(&m->arena, m->be, tz_flux_arena_bytes(m, B, Ti, Tt));
    acts_walk(m, &m->arena, B, Ti, Tt);
    m->feat_host = tz_xmalloc((size_t)(2 * B * 256) * sizeof(float));
    m->cs_host = tz_xmalloc((size_t)((Ti + Tt) * m->d.head_dim) * sizeof(float));
    /* pinned: the losses come down on the copy queue while backward is queued */
    m->sse_host = m->be->host_alloc(m->be, (size_t)B * sizeof(float));
}

void tz_flux_set_batch(tz_flux *m, int64_t n) {
    if (!m->arena.base) TZ_FATAL("flux: tz_flux_setup was not called");
    if (n <= 0 || n > m->B)
        TZ_FATAL("flux: batch %lld outside 1..%lld", (long long)n, (long long)m->B);
    m->n = n;
}
