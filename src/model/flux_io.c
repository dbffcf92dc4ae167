/* Flux from a diffusers folder: config.json (io/flux_config) and the weights under their
 * diffusers names (diffusion_pytorch_model.safetensors, or its shards with the index, as
 * io/safetensors opens a folder), every tensor config.json implies checked before anything
 * is allocated. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/flux_config.h"
#include "io/fsutil.h"
#include "model/adapter_io.h"
#include "io/safetensors.h"
#include "io/tq_format.h"
#include "model/flux.h"

void tz_flux_read_dims(const char *dir, tz_flux_dims *d) {
    char err[1200];
    tz_flux_config c;
    if (tz_flux_config_read(&c, dir, err, sizeof err)) TZ_FATAL("model.path: %s", err);
    memset(d, 0, sizeof *d);
    d->in_channels = c.in_channels, d->out_channels = c.out_channels;
    d->layers = c.num_layers, d->single_layers = c.num_single_layers;
    d->heads = c.num_attention_heads, d->head_dim = c.attention_head_dim;
    d->joint_dim = c.joint_attention_dim, d->pooled_dim = c.pooled_projection_dim;
    d->guidance = c.guidance_embeds;
    for (int i = 0; i < 3; i++) d->axes[i] = c.axes_dims_rope[i];
    d->theta = 10000.0;
    if (tz_flux_check_dims(d, err, sizeof err)) TZ_FATAL("model.path: %s/config.json: %s", dir, err);
}

tz_flux *tz_flux_load(tz_backend *be, const char *dir, const tz_model_opts *o) {
    tz_flux_dims d;
    tz_flux_read_dims(dir, &d);
    tz_safetensors st;
    char err[1024], got[96], want[96];
    if (tz_st_open(&st, dir, err, sizeof err)) TZ_FATAL("model.path: %s", err);
    tz_tqf qf;
    if (tz_tqf_read(&qf, &st, err, sizeof err)) TZ_FATAL("model.path: %s", err);
    if (qf.present)
        TZ_FATAL_HINT("point model.path at the dense transformer and set quant.bits to quantize "
                      "it at load", "model.path %s holds quantized tensors: a quantized Flux "
                      "folder is not read yet", dir);
    tz_tqf_free(&qf);
    tz_flux *m = tz_flux_create(be, &d, o);
    /* every base tensor, shape-checked against the table (the names and shapes config.json
     * implies), before the first is read */
    for (int i = 0; i < m->params.n; i++) {
        const tz_param *p = m->params.p[i];
        if (p->adapter) continue;
        const tz_st_tensor *t = tz_st_find(&st, p->name);
        const int64_t shape[2] = {p->shape[0], p->shape[1]};
        if (!t)
            TZ_FATAL_HINT("check config.json against the weights (a config.json of another model?)",
                          "model.path: %s: tensor '%s' is missing from the weights, but "
                          "config.json implies it (num_layers %lld, num_single_layers %lld)",
                          dir, p->name, (long long)d.layers, (long long)d.single_layers);
        if (t->ndim != p->ndim || t->shape[0] != shape[0] || (p->ndim == 2 && t->shape[1] != shape[1]))
            TZ_FATAL_HINT("check config.json against the weights (a config.json of another model?)",
                          "model.path: %s: tensor '%s' has shape %s in the weights, config.json "
                          "implies %s", dir, p->name,
                          tz_st_shape_str(got, sizeof got, t->ndim, t->shape),
                          tz_st_shape_str(want, sizeof want, p->ndim, shape));
    }
    float *buf = tz_params_host_buffer(&m->params, 0);
    for (int i = 0; i < m->params.n; i++) {
        tz_param *p = m->params.p[i];
        if (p->adapter) continue;
        if (tz_st_read_f32(&st, p->name, buf, p->ndim, p->shape, err, sizeof err))
            TZ_FATAL("%s", err);
        tz_model_upload_param(be, &m->cb, p, buf);
    }
    free(buf);
    tz_st_close(&st);
    return m;
}

void tz_flux_save(tz_flux *m, const char *dir, int bf16) {
    char path[1100], err[1200];
    if (tz_mkdir_p(dir, err, sizeof err)) TZ_FATAL("%s", err);
    const tz_flux_dims *d = &m->d;
    const tz_flux_config c = {.patch_size = 1, .in_channels = d->in_channels,
                              .out_channels = d->out_channels, .num_layers = d->layers,
                              .num_single_layers = d->single_layers,
                              .attention_head_dim = d->head_dim, .num_attention_heads = d->heads,
                              .joint_attention_dim = d->joint_dim,
                              .pooled_projection_dim = d->pooled_dim,
                              .guidance_embeds = d->guidance,
                              .axes_dims_rope = {d->axes[0], d->axes[1], d->axes[2]}};
    tz_path_join(path, sizeof path, dir, "diffusion_pytorch_model.safetensors");
    tz_params_save(&m->params, m->be, path, 0, bf16, NULL, 0, NULL, NULL);
    tz_path_join(path, sizeof path, dir, "config.json");
    if (tz_flux_config_write(&c, path, err, sizeof err)) TZ_FATAL("%s", err);
}
