/* Quantized Llama base weights: codebook set-up, host-side quantization into backend storage,
 * loading from quantized or dense files. The conversions of `quantize` and `export
 * --dequantize` are model/llama_convert.c. The layout is io/tq_format's, the math src/quant's. */
#include "model/llama_quant.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/fsutil.h"
#include "io/hf_config.h"
#include "quant/turboquant.h"

void tz_llama_quant_from_file(tz_quant_opts *q, const tz_tqf *qf, const char *dir) {
    if (q->bits && (q->bits != qf->bits || q->group != qf->group || q->method != qf->method))
        TZ_FATAL_HINT("leave quant.bits = 0 to use the model as it was quantized, or point "
                      "model.path at the dense model to quantize it at load",
                      "model.path %s is already quantized (%s, %d bits, group %d) but quant.* "
                      "asks for %s, %d bits, group %d", dir, tz_tq_method_name(qf->method),
                      qf->bits, qf->group, tz_tq_method_name(q->method), q->bits, q->group);
    q->method = qf->method;
    q->bits = qf->bits;
    q->group = qf->group;
    q->seed = qf->seed;
}

static int is_projection(const tz_llama *m, const tz_param *p) {
    for (int64_t i = 0; i < m->d.n_layers; i++)
        for (int j = 0; j < TZ_LIN_N; j++)
            if (m->layers[i].lin[j].w == p) return 1;
    return 0;
}

static void load_stored(tz_llama *m, const tz_safetensors *st, const tz_tqf *qf,
                        const tz_tqf_entry *e, tz_param *p) {
    char err[1024];
    const char *file = e->codes->file;
    if (!is_projection(m, p))
        TZ_FATAL_HINT("re-quantize the dense model with `turbozero quantize`",
                      "%s: tensor %s is quantized, but only the projections of the transformer "
                      "blocks can be: embeddings, norms and the output head stay dense",
                      file, p->name);
    if (e->rows != p->shape[0] || e->cols != p->shape[1])
        TZ_FATAL("%s: tensor %s: quantized shape [%lld, %lld], expected [%lld, %lld]", file,
                 p->name, (long long)e->rows, (long long)e->cols, (long long)p->shape[0],
                 (long long)p->shape[1]);
    const tz_qweight *q = p->q;
    if (!q || q->method != qf->method || q->bits != e->bits || q->group != e->group ||
        q->seed != qf->seed) { /* the file decides how this tensor is stored */
        float levels[TZ_TQ_MAX_LEVELS];
        tz_tq_codebook local;
        tz_tq_levels(qf->method, e->bits, tz_quant_codebook(&m->cb, qf->method, e->bits, &local), levels);
        tz_param_make_quant(p, m->be, qf->method, e->bits, e->group, qf->seed, levels);
    }
    tz_tq_tensor t;
    if (tz_tqf_load(qf, e, &t, err, sizeof err)) TZ_FATAL("%s: tensor %s: %s", file, p->name, err);
    tz_qweight_codes_put(m->be, p->q, 0, t.codes, e->codes->nbytes);
    m->be->upload(m->be, p->q->scales, t.scales, e->scales->nbytes);
    tz_tq_tensor_free(&t);
}

void tz_llama_load_weight(tz_llama *m, const tz_safetensors *st, const tz_tqf *qf, tz_param *p,
                          float *buf) {
    char err[1024];
    const tz_tqf_entry *e = qf->present ? tz_tqf_find(qf, p->name) : NULL;
    if (e) {
        load_stored(m, st, qf, e, p);
        return;
    }
    if (p->q && qf->present) tz_param_make_dense(p, m->be); /* the file keeps it dense */
    if (tz_st_read_f32(st, p->name, buf, p->ndim, p->shape, err, sizeof err))
        TZ_FATAL("%s", err);
    tz_model_upload_param(m->be, &m->cb, p, buf); /* a quantized p: quantized at load */
}

void tz_llama_quant_report(const tz_llama *m) {
    int nq = 0, nlin = 0, by_group[3] = {0, 0, 0}, method = 0, bits = 0;
    double qbytes = 0, dense = 0, tile = 0;
    for (int64_t i = 0; i < m->d.n_layers; i++)
        for (int j = 0; j < TZ_LIN_N; j++) {
            const tz_param *p = m->layers[i].lin[j].w;
            nlin++;
            if (!p->q) continue;
            nq++;
            method = p->q->method;
            bits = p->q->bits;
            by_group[p->q->group == 64 ? 0 : p->q->group == 128 ? 1 : 2]++;
            qbytes += (double)p->bytes;
            dense += (double)p->numel * 4.0;
            if ((double)p->numel * 4.0 > tile) tile = (double)p->numel * 4.0;
        }
    if (!nq) return;
    char groups[96] = "";
    size_t at = 0;
    static const int gs[3] = {64, 128, 256};
    for (int k = 0; k < 3; k++)
        if (by_group[k])
            at += (size_t)snprintf(groups + at, sizeof groups - at, "%s%d x group %d",
                                   at ? ", " : "", by_group[k], gs[k]);
    tz_info("base: %d of %d projections quantized (%s, %d bits; %s): %.2f MiB, %.2f MiB as "
            "F32 (%.3f bits per weight); decoded per layer into one %.2f MiB tile",
            nq, nlin, tz_tq_method_name(method), bits, groups, qbytes / 1048576.0,
            dense / 1048576.0, 8.0 * qbytes / (dense / 4.0),
            tile / 1048576.0);
}
