/* PEFT adapters and plain tensor writes shared by the Llama and DiT loaders; the names of
 * the projections come from the family, everything else is the same for both. */
#include "model/adapter_io.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/fsutil.h"
#include "io/peft.h"
#include "io/safetensors.h"
#include "io/tq_format.h"
#include "quant/turboquant.h"

void tz_adapter_read_spec(const char *dir, const char *const *names, int n, tz_lora_spec *s) {
    char path[1100], err[1200];
    tz_path_join(path, sizeof path, dir, "adapter_config.json");
    tz_peft_config c;
    if (tz_peft_read(&c, path, err, sizeof err)) TZ_FATAL("model.adapter: %s", err);
    s->rank = c.r;
    s->alpha = c.alpha;
    s->loftq = !strcmp(c.lora_init, "loftq") ? 1 : c.lora_init[0] ? 0 : -1;
    s->init_seed = c.init_seed;
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

void tz_adapter_load(tz_params *ps, tz_backend *be, const char *dir, const char *base) {
    tz_params_weights_all(ps); /* the optimizer's uploads into them are done */
    char path[1100], err[1200];
    tz_path_join(path, sizeof path, dir, "adapter_model.safetensors");
    tz_safetensors st;
    if (tz_st_open(&st, path, err, sizeof err)) TZ_FATAL("model.adapter: %s", err);
    /* the base it was trained on: the same shapes do not make the same model */
    const char *rec = tz_st_metadata(&st, TZ_ST_BASE_KEY);
    uint64_t id;
    if (rec && base && tz_path_exists(base) && !tz_st_identity(base, &id, err, sizeof err)) {
        char now[24];
        snprintf(now, sizeof now, "%016llx", (unsigned long long)id);
        if (strcmp(now, rec))
            tz_warn("model.adapter %s was trained on another base than model.path %s (base "
                    "identity %s, this one %s): the same shapes, other weights; a quantized or "
                    "dequantized copy made by turbozero counts as its source", dir, base, rec,
                    now);
    }
    for (int i = 0; i < ps->n; i++) {
        tz_param *p = ps->p[i];
        if (!p->adapter) continue;
        float *buf = tz_xmalloc((size_t)p->numel * sizeof *buf);
        if (tz_st_read_f32(&st, p->name, buf, p->ndim, p->shape, err, sizeof err))
            TZ_FATAL("model.adapter: %s", err);
        be->upload(be, p->w, buf, (size_t)p->numel * sizeof *buf);
        free(buf);
    }
    /* base weights the adapter trained whole (PEFT modules_to_save): they replace the base's */
    for (int i = 0; i < ps->n; i++) {
        tz_param *p = ps->p[i];
        char name[TZ_NAME_MAX + 24];
        snprintf(name, sizeof name, "base_model.model.%s", p->name);
        if (p->adapter || p->q || !tz_st_find(&st, name)) continue;
        float *buf = tz_xmalloc((size_t)p->numel * sizeof *buf);
        if (tz_st_read_f32(&st, name, buf, p->ndim, p->shape, err, sizeof err))
            TZ_FATAL("model.adapter: %s", err);
        tz_param_upload(be, p, buf, 0, p->numel);
        free(buf);
    }
    tz_st_close(&st);
}

/* Downloads numel floats at src and adds them to w as F32 or BF16; the host copy goes to
 * bufs[(*n)++] (the writer reads it when saving). */
/* Adds host floats f (numel, owned from here on: freed with bufs) as F32 or BF16. */
static void add_host(tz_st_writer *w, const char *path, const char *name, int ndim,
                     const int64_t *shape, float *f, int64_t numel, int bf16, void **bufs, int *n) {
    char err[1024];
    if (bf16) {
        uint16_t *h = tz_xmalloc((size_t)numel * sizeof *h);
        tz_dtype_from_f32(TZ_DT_BF16, f, h, numel);
        for (int64_t i = 0; i < numel; i++)
            if (isfinite(f[i]) && !isfinite(tz_bf16_to_f32(h[i])))
                TZ_FATAL_HINT("the training diverged: lower optim.lr or raise optim.grad_clip",
                              "%s: tensor '%s': element %lld = %g overflows to Inf in BF16; "
                              "refusing to save it", path, name, (long long)i, (double)f[i]);
        free(f);
        bufs[(*n)++] = h;
    } else {
        bufs[(*n)++] = f;
    }
    if (tz_st_writer_add(w, name, bf16 ? TZ_DT_BF16 : TZ_DT_F32, ndim, shape, bufs[*n - 1], err,
                         sizeof err))
        TZ_FATAL("%s: %s", path, err);
}

static void add_dense(tz_st_writer *w, tz_backend *be, const char *path, const char *name,
                      int ndim, const int64_t *shape, const float *src, int64_t numel, int bf16,
                      void **bufs, int *n) {
    float *f = tz_xmalloc((size_t)numel * sizeof *f);
    be->download(be, f, src, (size_t)numel * sizeof *f);
    add_host(w, path, name, ndim, shape, f, numel, bf16, bufs, n);
}

/* A quantized weight from the backend into a host tensor (codes and scales). */
static void download_quant(tz_backend *be, const tz_param *p, tz_tq_tensor *t, const char *path) {
    const tz_qweight *q = p->q;
    char err[256];
    if (tz_tq_tensor_init(t, q->bits, q->group, p->shape[0], p->shape[1], q->seed, err, sizeof err))
        TZ_FATAL("%s: %s: %s", path, p->name, err);
    tz_qweight_codes_get(be, q, t->codes, 0, (size_t)tz_tq_codes_bytes(t->rows, t->cols, t->bits));
    be->download(be, t->scales, q->scales,
                 (size_t)tz_tq_scales_count(t->rows, t->cols, t->group) * sizeof *t->scales);
}

int tz_params_save(tz_params *ps, tz_backend *be, const char *path, int adapters, int bf16,
                         const tz_tensor_view *views, int n_views, const tz_quant_opts *quant,
                         const char *const *extra) {
    tz_params_weights_all(ps); /* the optimizer's uploads into them are done */
    tz_st_writer w;
    tz_st_writer_init(&w);
    tz_st_writer_set_metadata(&w, "format", "pt");
    tz_st_writer_set_metadata(&w, "producer", "turbozero " TZ_VERSION);
    for (int i = 0; extra && extra[i] && extra[i + 1]; i += 2)
        tz_st_writer_set_metadata(&w, extra[i], extra[i + 1]);
    char err[1024];
    void **bufs = tz_xcalloc((size_t)(ps->n + n_views) + 1, sizeof *bufs);
    tz_tq_tensor *qt = tz_xcalloc((size_t)ps->n + 1, sizeof *qt);
    const char **qnames = tz_xcalloc((size_t)ps->n + 1, sizeof *qnames);
    const tz_tq_tensor **qts = tz_xcalloc((size_t)ps->n + 1, sizeof *qts);
    int n = 0, nq = 0;
    for (int i = 0; i < ps->n; i++) {
        tz_param *p = ps->p[i];
        int viewed = 0;
        for (int v = 0; v < n_views; v++) viewed |= !strcmp(views[v].name, p->name);
        if (p->adapter != adapters || viewed) continue;
        if (!p->q && p->w16) { /* stored in bf16: widened on the host */
            float *f = tz_xmalloc((size_t)p->numel * sizeof *f);
            tz_param_download(be, p, f);
            add_host(&w, path, p->name, p->ndim, p->shape, f, p->numel, bf16, bufs, &n);
            continue;
        }
        if (!p->q) {
            add_dense(&w, be, path, p->name, p->ndim, p->shape, p->w, p->numel, bf16, bufs, &n);
            continue;
        }
        tz_tq_tensor *t = &qt[nq];
        download_quant(be, p, t, path);
        if (quant) { /* the quantized layout, as `turbozero quantize` writes it */
            if (tz_tqf_writer_add(&w, p->name, t, err, sizeof err)) TZ_FATAL("%s: %s", path, err);
            qnames[nq] = p->name;
            qts[nq] = t;
            nq++;
            continue;
        }
        tz_tq_codebook cb;
        memset(&cb, 0, sizeof cb);
        if (p->q->method == TZ_TQ_TURBOQUANT && tz_tq_codebook_init(&cb, p->q->bits, err, sizeof err))
            TZ_FATAL("%s", err);
        float *f = tz_xmalloc((size_t)p->numel * sizeof *f);
        tz_tq_dequantize_as(t, p->q->method, &cb, f);
        tz_tq_tensor_free(t);
        add_host(&w, path, p->name, p->ndim, p->shape, f, p->numel, bf16, bufs, &n);
    }
    for (int v = 0; v < n_views; v++) {
        int64_t numel = 1;
        for (int d = 0; d < views[v].ndim; d++) numel *= views[v].shape[d];
        add_dense(&w, be, path, views[v].name, views[v].ndim, views[v].shape, views[v].w, numel,
                  bf16, bufs, &n);
    }
    char *meta = NULL;
    if (nq) {
        meta = tz_tqf_meta_json(quant->method, quant->bits, quant->group, quant->seed, qnames, qts, nq);
        tz_st_writer_set_metadata(&w, TZ_TQF_META_KEY, meta);
    }
    if (tz_st_writer_save(&w, path, err, sizeof err)) TZ_FATAL("%s", err);
    for (int i = 0; i < n; i++) free(bufs[i]);
    for (int i = 0; i < nq; i++) tz_tq_tensor_free(&qt[i]);
    free(meta), free(bufs), free(qt), free(qnames), free(qts);
    tz_st_writer_free(&w);
    return nq;
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
    tz_params_weights_all(ps); /* the optimizer's uploads into them are done */
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
    if (c.quant_bits > 0) { /* loftq: the base to make again, quantize(W - s B0 A0) */
        snprintf(c.lora_init, sizeof c.lora_init, "%s", s->loftq > 0 ? "loftq" : "default");
        c.init_seed = s->loftq > 0 ? s->init_seed : 0;
    }
    tz_path_join(path, sizeof path, dir, "adapter_model.safetensors");
    /* the base's identity (tz_st_identity), checked when the adapter is loaded; none for a
     * base that is no folder of weights (a bench preset) */
    uint64_t id;
    char hex[24], ierr[1200];
    const char *meta[3] = {NULL, NULL, NULL};
    if (tz_path_exists(base_model_path) && !tz_st_identity(base_model_path, &id, ierr, sizeof ierr)) {
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)id);
        meta[0] = TZ_ST_BASE_KEY, meta[1] = hex;
    }
    /* weights trained whole beside the adapters (lora.train_embeddings), under PEFT's names
     * for modules_to_save: base_model.model.NAME */
    tz_tensor_view views[4];
    char vnames[4][TZ_NAME_MAX + 24];
    int nv = 0;
    for (int i = 0; i < ps->n; i++) {
        const tz_param *p = ps->p[i];
        if (p->adapter || !p->trainable || p->q) continue;
        if (nv == 4) TZ_FATAL("adapter: more than 4 weights trained beside the adapters");
        if (p->w16) TZ_FATAL("adapter: %s is stored in bf16 on this backend", p->name);
        snprintf(vnames[nv], sizeof vnames[nv], "base_model.model.%s", p->name);
        views[nv] = (tz_tensor_view){vnames[nv], p->ndim, {p->shape[0], p->shape[1], 0, 0}, p->w};
        const size_t len = strlen(p->name);
        snprintf(c.save[c.nsave++], sizeof c.save[0], "%.*s",
                 (int)(len > 7 && !strcmp(p->name + len - 7, ".weight") ? len - 7 : len), p->name);
        nv++;
    }
    tz_params_save(ps, be, path, 1, 0, views, nv, NULL, meta);
    tz_path_join(path, sizeof path, dir, "adapter_config.json");
    if (tz_peft_write(&c, path, err, sizeof err)) TZ_FATAL("%s", err);
}

/* The dense host floats of quantized p (its codes decoded as tz_params_save writes them). */
static float *dequant_host(tz_backend *be, const tz_param *p) {
    tz_tq_tensor t;
    char err[256];
    download_quant(be, p, &t, "merge");
    tz_tq_codebook cb;
    memset(&cb, 0, sizeof cb);
    if (p->q->method == TZ_TQ_TURBOQUANT && tz_tq_codebook_init(&cb, p->q->bits, err, sizeof err))
        TZ_FATAL("%s", err);
    float *f = tz_xmalloc((size_t)p->numel * sizeof *f);
    tz_tq_dequantize_as(&t, p->q->method, &cb, f);
    tz_tq_tensor_free(&t);
    return f;
}

int tz_params_merge_lora(tz_params *ps, tz_backend *be, const tz_lora_spec *s) {
    tz_params_weights_all(ps); /* the optimizer's uploads into them are done */
    static const char prefix[] = "base_model.model.", tail[] = ".lora_A.weight";
    for (int i = 0; i < ps->n; i++) { /* every weight dense first */
        tz_param *p = ps->p[i];
        if (!p->q) continue;
        float *f = dequant_host(be, p);
        tz_param_make_dense(p, be);
        be->upload(be, p->w, f, (size_t)p->numel * sizeof *f);
        free(f);
    }
    const float scale = (float)(s->alpha / (double)s->rank);
    int merged = 0;
    for (int i = 0; i < ps->n; i++) {
        tz_param *a = ps->p[i];
        size_t n = strlen(a->name), np = sizeof prefix - 1, nt = sizeof tail - 1;
        if (!a->adapter || n <= np + nt || strncmp(a->name, prefix, np) ||
            strcmp(a->name + n - nt, tail))
            continue;
        char wname[TZ_NAME_MAX], bname[TZ_NAME_MAX];
        snprintf(wname, sizeof wname, "%.*s.weight", (int)(n - np - nt), a->name + np);
        snprintf(bname, sizeof bname, "%.*s.lora_B.weight", (int)(n - nt), a->name);
        tz_param *w = tz_params_find(ps, wname), *b = tz_params_find(ps, bname);
        if (!w || !b || w->ndim != 2 || b->shape[0] != w->shape[0] || b->shape[1] != a->shape[0] ||
            a->shape[1] != w->shape[1])
            TZ_FATAL("merge: adapter %s has no matching %s and %s [%lld, %lld]", a->name, bname,
                     wname, (long long)(w ? w->shape[0] : 0), (long long)a->shape[0]);
        if (w->w16)
            TZ_FATAL("merge: %s is stored in bf16 on this backend (run.precision); merge on a "
                     "backend with fp32 weights", w->name);
        /* W[out, in] += scale * B[out, r] A[r, in] */
        be->matmul(be, w->w, b->w, a->w, w->shape[0], w->shape[1], a->shape[0], 0, 0, scale,
                   1.0f);
        merged++;
    }
    return merged;
}

void tz_adapter_save_diffusers(tz_params *ps, tz_backend *be, const char *path,
                               const char *prefix, const tz_lora_spec *s) {
    tz_params_weights_all(ps); /* the optimizer's uploads into them are done */
    static const char peft[] = "base_model.model.";
    const float scale = s->rank > 0 ? (float)(s->alpha / (double)s->rank) : 1.0f;
    tz_st_writer w;
    tz_st_writer_init(&w);
    char err[1200];
    int n = 0;
    char (*names)[TZ_NAME_MAX + 64] = tz_xcalloc((size_t)(ps->n > 0 ? ps->n : 1), sizeof *names);
    float **bufs = tz_xcalloc((size_t)(ps->n > 0 ? ps->n : 1), sizeof *bufs);
    for (int i = 0; i < ps->n; i++) {
        const tz_param *p = ps->p[i];
        if (!p->adapter || strncmp(p->name, peft, sizeof peft - 1)) continue;
        bufs[n] = tz_xmalloc((size_t)p->numel * sizeof(float));
        tz_param_download(be, p, bufs[n]);
        const size_t len = strlen(p->name);
        if (len > 14 && !strcmp(p->name + len - 14, ".lora_B.weight"))
            for (int64_t k = 0; k < p->numel; k++) bufs[n][k] *= scale;
        snprintf(names[n], sizeof names[n], "%s.%s", prefix, p->name + sizeof peft - 1);
        if (tz_st_writer_add(&w, names[n], TZ_DT_F32, p->ndim, p->shape, bufs[n], err, sizeof err))
            TZ_FATAL("%s", err);
        n++;
    }
    if (tz_st_writer_save(&w, path, err, sizeof err)) TZ_FATAL("%s", err);
    tz_st_writer_free(&w);
    for (int i = 0; i < n; i++) free(bufs[i]);
    free(bufs);
    free(names);
}
