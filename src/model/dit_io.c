/* DiT from and to folders: config.json (io/dit_config), model.safetensors with the original
 * DiT names (adapters: model/adapter_io.c). The one layout change is x_embedder.proj.weight
 * (Conv2d 4-D in files, a [hidden, C*p*p] matrix in memory); pos_embed is written, never read. */
#include "model/dit_io.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/adapter_io.h"
#include "io/dit_config.h"
#include "io/fsutil.h"
#include "io/safetensors.h"
#include "io/tq_format.h"

/* dims from DIR/config.json (fatal naming the file and key on error, or the inconsistency). */
static tz_dit_dims read_dims(const char *dir) {
    char err[1200];
    tz_dit_config c;
    if (tz_dit_config_read(&c, dir, err, sizeof err)) TZ_FATAL("model.path: %s", err);
    const tz_dit_dims d = {
        .input_size = c.input_size, .patch_size = c.patch_size, .in_channels = c.in_channels,
        .hidden = c.hidden_size, .depth = c.depth, .num_heads = c.num_heads,
        .mlp_ratio = c.mlp_ratio, .num_classes = c.num_classes,
        .class_dropout_prob = c.class_dropout_prob, .learn_sigma = c.learn_sigma,
        .freq_dim = c.frequency_embedding_size,
        .diffusion = strcmp(c.diffusion, "flow") ? TZ_DIFF_DDPM : TZ_DIFF_FLOW};
    if (tz_dit_check_dims(&d, err, sizeof err))
        TZ_FATAL("model.path: %s/config.json: %s", dir, err);
    return d;
}

static int is_patch_weight(const tz_dit *m, const tz_param *p) { return p == m->x_emb.w; }

/* Reads tensor p->name of st into p (shape-checked, converted to fp32, uploaded). */
static void load_param(tz_dit *m, const tz_safetensors *st, tz_param *p, float *buf) {
    char err[1024];
    const int64_t pp = m->d.patch_size;
    const tz_st_tensor *t = tz_st_find(st, p->name);
    if (t && is_patch_weight(m, p) && t->ndim == 4) {
        int64_t want[4] = {m->d.hidden, m->d.in_channels, pp, pp};
        if (memcmp(t->shape, want, sizeof want)) {
            char a[96], b[96];
            TZ_FATAL("%s: tensor %s has shape %s, expected %s (or [%lld, %lld])", t->file, p->name,
                     tz_st_shape_str(a, sizeof a, 4, t->shape), tz_st_shape_str(b, sizeof b, 4, want),
                     (long long)p->shape[0], (long long)p->shape[1]);
        }
        if (tz_st_tensor_to_f32(t, buf, err, sizeof err)) TZ_FATAL("%s", err);
    } else if (tz_st_read_f32(st, p->name, buf, p->ndim, p->shape, err, sizeof err)) {
        TZ_FATAL("%s", err);
    }
    tz_model_upload_param(m->be, &m->cb, p, buf); /* a quantized p: quantized at load */
}

/* A linear layer config.json implies: MODULE.weight [out, in] (the patch embedding may be
 * its 4-D Conv2d form) and MODULE.bias [out], present with these shapes. */
static void expect_linear(const tz_safetensors *st, const char *dir, const char *module,
                          int64_t out, int64_t in, const tz_dit_dims *d) {
    char name[160], got[96], want[96];
    for (int bias = 0; bias < 2; bias++) {
        snprintf(name, sizeof name, "%s.%s", module, bias ? "bias" : "weight");
        const tz_st_tensor *t = tz_st_find(st, name);
        int64_t shape[2] = {out, in};
        if (!t)
            TZ_FATAL_HINT("check config.json against the weights (a config.json of another model?)",
                          "model.path: %s: tensor '%s' is missing from the weights, but "
                          "config.json implies it (depth %lld, hidden_size %lld)", dir, name,
                          (long long)d->depth, (long long)d->hidden);
        if (bias ? t->ndim == 1 && t->shape[0] == out
                 : (t->ndim == 2 && t->shape[0] == out && t->shape[1] == in) ||
                       (t->ndim == 4 && !strcmp(module, "x_embedder.proj") &&
                        t->shape[0] == out && t->shape[1] * t->shape[2] * t->shape[3] == in))
            continue;
        TZ_FATAL_HINT("check config.json against the weights (a config.json of another model?)",
                      "model.path: %s: tensor '%s' has shape %s in the weights, config.json "
                      "implies %s", dir, name, tz_st_shape_str(got, sizeof got, t->ndim, t->shape),
                      tz_st_shape_str(want, sizeof want, bias ? 1 : 2, shape));
    }
}

/* Every weight config.json implies, checked against the file before anything is allocated
 * (a depth or width of another model is refused by name instead of growing memory first). */
static void check_shapes(const tz_dit_dims *d, const tz_safetensors *st, const char *dir) {
    const int64_t Hd = d->hidden, p = d->patch_size, F = tz_dit_mlp_hidden(d);
    char name[96], got[96], want[96];
    expect_linear(st, dir, "x_embedder.proj", Hd, d->in_channels * p * p, d);
    expect_linear(st, dir, "t_embedder.mlp.0", Hd, d->freq_dim, d);
    expect_linear(st, dir, "t_embedder.mlp.2", Hd, Hd, d);
    const tz_st_tensor *y = tz_st_find(st, "y_embedder.embedding_table.weight");
    int64_t ys[2] = {tz_dit_label_rows(d), Hd};
    if (!y || y->ndim != 2 || y->shape[0] != ys[0] || y->shape[1] != ys[1])
        TZ_FATAL("model.path: %s: tensor 'y_embedder.embedding_table.weight' is %s%s in the "
                 "weights, config.json implies %s (num_classes %lld, hidden_size %lld)", dir,
                 y ? "of shape " : "missing", y ? tz_st_shape_str(got, sizeof got, y->ndim, y->shape) : "",
                 tz_st_shape_str(want, sizeof want, 2, ys), (long long)d->num_classes,
                 (long long)Hd);
    for (int64_t i = 0; i < d->depth; i++) {
        static const char *const mod[5] = {"adaLN_modulation.1", "attn.qkv", "attn.proj",
                                           "mlp.fc1", "mlp.fc2"};
        const int64_t out[5] = {6 * Hd, 3 * Hd, Hd, F, Hd}, in[5] = {Hd, Hd, Hd, Hd, F};
        for (int j = 0; j < 5; j++) {
            snprintf(name, sizeof name, "blocks.%lld.%s", (long long)i, mod[j]);
            expect_linear(st, dir, name, out[j], in[j], d);
        }
    }
    expect_linear(st, dir, "final_layer.adaLN_modulation.1", 2 * Hd, Hd, d);
    expect_linear(st, dir, "final_layer.linear", p * p * tz_dit_out_channels(d), Hd, d);
}

tz_dit *tz_dit_load(tz_backend *be, const char *dir, const tz_model_opts *o) {
    const tz_dit_dims d = read_dims(dir);
    tz_safetensors st;
    char err[1024];
    if (tz_st_open(&st, dir, err, sizeof err)) TZ_FATAL("model.path: %s", err);
    tz_tqf qf;
    if (tz_tqf_read(&qf, &st, err, sizeof err)) TZ_FATAL("model.path: %s", err);
    if (qf.present)
        TZ_FATAL_HINT("point model.path at the dense DiT and set quant.bits to quantize it at load",
                      "model.path %s holds quantized tensors: loading an already-quantized DiT "
                      "folder is not supported yet", dir);
    tz_tqf_free(&qf);
    check_shapes(&d, &st, dir);
    tz_dit *m = tz_dit_create(be, &d, o);
    float *buf = tz_params_host_buffer(&m->params, 0);
    for (int i = 0; i < m->params.n; i++)
        if (!m->params.p[i]->adapter) load_param(m, &st, m->params.p[i], buf);
    free(buf);
    tz_st_close(&st);
    return m;
}

void tz_dit_save(tz_dit *m, const char *dir, int bf16) {
    char path[1100], err[1200];
    if (tz_mkdir_p(dir, err, sizeof err)) TZ_FATAL("%s", err);
    const tz_dit_dims *d = &m->d;
    tz_dit_config c;
    memset(&c, 0, sizeof c);
    c.input_size = d->input_size;
    c.patch_size = d->patch_size;
    c.in_channels = d->in_channels;
    c.hidden_size = d->hidden;
    c.depth = d->depth;
    c.num_heads = d->num_heads;
    c.mlp_ratio = d->mlp_ratio;
    c.num_classes = d->num_classes;
    c.class_dropout_prob = d->class_dropout_prob;
    c.learn_sigma = d->learn_sigma;
    c.frequency_embedding_size = d->freq_dim;
    snprintf(c.diffusion, sizeof c.diffusion, "%s", d->diffusion == TZ_DIFF_FLOW ? "flow" : "ddpm");
    /* DiT's layouts: the patch embedding as its Conv2d weight, plus the fixed pos_embed */
    const int64_t pp = d->patch_size;
    if (m->x_emb.w->w16) /* the view reads fp32 (the model is saved after full training) */
        TZ_FATAL("save: %s is stored in bf16 on this backend (run.precision)",
                 m->x_emb.w->name);
    const tz_tensor_view views[2] = {
        {m->x_emb.w->name, 4, {d->hidden, d->in_channels, pp, pp}, m->x_emb.w->w},
        {"pos_embed", 3, {1, tz_dit_tokens(d), d->hidden, 0}, m->pos_embed}};
    tz_path_join(path, sizeof path, dir, "model.safetensors");
    /* a quantized block weight (full fine-tuning at quant.bits) is written dequantized: a
     * quantized DiT folder is not read yet */
    tz_params_save(&m->params, m->be, path, 0, bf16, views, 2, NULL, NULL);
    tz_path_join(path, sizeof path, dir, "config.json");
    if (tz_dit_config_write(&c, path, err, sizeof err)) TZ_FATAL("%s", err);
}
