/* PEFT adapters and plain tensor writes shared by the Llama and DiT loaders; the names of
 * the projections come from the family, everything else is the same for both. */
#include "model/adapter_io.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/fsutil.h"
#include "io/peft.h"
#include "io/safetensors.h"
#include "quant/turboquant.h"

void tz_adapter_read_spec(const char *dir, const char *const *names, int n, tz_lora_spec *s) {
    char path[1100], err[1200];
    tz_path_join(path, sizeof path, dir, "adapter_config.json");
    tz_peft_config c;
    if (tz_peft_read(&c, path, err, sizeof err)) TZ_FATAL("model.adapter: %s", err);
    s->rank = c.r;
    s->alpha = c.alpha;
    s->targets = 0;
    for (int i = 0; i < c.ntargets; i++) {
        int j = 0;
        while (j < n && strcmp(c.targets[i], names[j])) j++;
        if (j == n) {
            char known[512] = "";
            for (int k = 0; k < n; k++)
                snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", k ? ", " : "",
                         names[k]);
            TZ_FATAL("%s: target_modules: \"%s\" is not a projection of this model (%s)", path,
                     c.targets[i], known);
        }
        s->targets |= 1 << j;
    }
}

void tz_adapter_load(tz_params *ps, tz_backend *be, const char *dir) {
    char path[1100], err[1200];
    tz_path_join(path, sizeof path, dir, "adapter_model.safetensors");
    tz_safetensors st;
    if (tz_st_open(&st, path, err, sizeof err)) TZ_FATAL("model.adapter: %s", err);
    for (int i = 0; i < ps->n; i++) {
        tz_param *p = ps->p[i];
        if (!p->adapter) continue;
        float *buf = tz_xmalloc((size_t)p->numel * sizeof *buf);
        if (tz_st_read_f32(&st, p->name, buf, p->ndim, p->shape, err, sizeof err))
            TZ_FATAL("model.adapter: %s", err);
        be->upload(be, p->w, buf, (size_t)p->numel * sizeof *buf);
        free(buf);
    }
    tz_st_close(&st);
}

/* Downloads numel floats at src and adds them to w as F32 or BF16; the host copy goes to
 * bufs[(*n)++] (the writer reads it when saving). */
static void add_dense(tz_st_writer *w, tz_backend *be, const char *path, const char *name,
                      int ndim, const int64_t *shape, const float *src, int64_t numel, int bf16,
                      void **bufs, int *n) {
    char err[1024];
    float *f = tz_xmalloc((size_t)numel * sizeof *f);
    be->download(be, f, src, (size_t)numel * sizeof *f);
    if (bf16) {
        uint16_t *h = tz_xmalloc((size_t)numel * sizeof *h);
        tz_dtype_from_f32(TZ_DT_BF16, f, h, numel);
        free(f);
        bufs[(*n)++] = h;
    } else {
        bufs[(*n)++] = f;
    }
    if (tz_st_writer_add(w, name, bf16 ? TZ_DT_BF16 : TZ_DT_F32, ndim, shape, bufs[*n - 1], err,
                         sizeof err))
        TZ_FATAL("%s: %s", path, err);
}

void tz_params_save_dense(tz_params *ps, tz_backend *be, const char *path, int adapters, int bf16,
                          const tz_tensor_view *views, int n_views) {
    tz_st_writer w;
    tz_st_writer_init(&w);
    tz_st_writer_set_metadata(&w, "format", "pt");
    tz_st_writer_set_metadata(&w, "producer", "turbozero " TZ_VERSION);
    char err[1024];
    void **bufs = tz_xcalloc((size_t)(ps->n + n_views) + 1, sizeof *bufs);
    int n = 0;
    for (int i = 0; i < ps->n; i++) {
        tz_param *p = ps->p[i];
        int viewed = 0;
        for (int v = 0; v < n_views; v++) viewed |= !strcmp(views[v].name, p->name);
        if (p->adapter != adapters || viewed) continue;
        if (p->q)
            TZ_FATAL_HINT("write quantized models with `turbozero quantize`, dense ones with "
                          "`turbozero export --dequantize`",
                          "%s: %s is quantized; saving a quantized model here is not supported",
                          path, p->name);
        add_dense(&w, be, path, p->name, p->ndim, p->shape, p->w, p->numel, bf16, bufs, &n);
    }
    for (int v = 0; v < n_views; v++) {
        int64_t numel = 1;
        for (int d = 0; d < views[v].ndim; d++) numel *= views[v].shape[d];
        add_dense(&w, be, path, views[v].name, views[v].ndim, views[v].shape, views[v].w, numel,
                  bf16, bufs, &n);
    }
    if (tz_st_writer_save(&w, path, err, sizeof err)) TZ_FATAL("%s", err);
    for (int i = 0; i < n; i++) free(bufs[i]);
    free(bufs);
    tz_st_writer_free(&w);
}

void tz_adapter_base_quant(const tz_params *ps, tz_peft_config *c) {
    c->quant_bits = c->quant_group = 0;
    c->quant_seed = 0;
    c->quant_method[0] = 0;
    for (int i = 0; i < ps->n; i++) {
        const tz_qweight *q = ps->p[i]->q;
        if (!q) continue;
        c->quant_bits = q->bits;
        c->quant_seed = q->seed;
        if (q->group > c->quant_group) c->quant_group = q->group; /* the setting; rows that */
        snprintf(c->quant_method, sizeof c->quant_method, "%s", /* it does not divide use less */
                 tz_tq_method_name(q->method));
    }
}

void tz_adapter_save(tz_params *ps, tz_backend *be, const char *dir, const char *const *names,
                     int n, const tz_lora_spec *s, const char *base_model_path,
                     const char *task_type) {
    char path[1100], err[1200];
    if (tz_mkdir_p(dir, err, sizeof err)) TZ_FATAL("%s", err);
    tz_peft_config c;
    memset(&c, 0, sizeof c);
    c.r = s->rank;
    c.alpha = s->alpha;
    for (int j = 0; j < n; j++)
        if (s->targets & (1 << j))
            snprintf(c.targets[c.ntargets++], sizeof c.targets[0], "%s", names[j]);
    snprintf(c.base_model, sizeof c.base_model, "%s", base_model_path);
    snprintf(c.task_type, sizeof c.task_type, "%s", task_type ? task_type : "");
    tz_adapter_base_quant(ps, &c);
    tz_path_join(path, sizeof path, dir, "adapter_model.safetensors");
    tz_params_save_dense(ps, be, path, 1, 0, NULL, 0);
    tz_path_join(path, sizeof path, dir, "adapter_config.json");
    if (tz_peft_write(&c, path, err, sizeof err)) TZ_FATAL("%s", err);
}
