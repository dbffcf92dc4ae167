/* Llama weights from and to HF-layout folders, LoRA adapters from and to PEFT layout. The
 * formats themselves are in io/ (safetensors, hf_config, peft); this file maps names. */
#include "model/llama_io.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/fsutil.h"
#include "io/hf_config.h"
#include "io/peft.h"
#include "io/safetensors.h"
#include "io/tq_format.h"
#include "model/llama_quant.h"

void tz_llama_read_dims(const char *dir, tz_llama_dims *d) {
    char path[1100], err[1024];
    tz_path_join(path, sizeof path, dir, "config.json");
    tz_hf_llama c;
    if (tz_hf_llama_read(&c, path, err, sizeof err)) TZ_FATAL("model.path: %s", err);
    memset(d, 0, sizeof *d);
    d->vocab = c.vocab_size;
    d->dim = c.hidden_size;
    d->hidden = c.intermediate_size;
    d->n_layers = c.num_hidden_layers;
    d->n_heads = c.num_attention_heads;
    d->n_kv_heads = c.num_key_value_heads;
    d->head_dim = c.head_dim;
    d->max_pos = c.max_position_embeddings;
    d->eps = c.rms_norm_eps;
    d->theta = c.rope_theta;
    d->tied = c.tie_word_embeddings;
}

/* Reads tensor p->name of st into p (shape-checked, converted to fp32, uploaded). */
static void load_param(tz_backend *be, const tz_safetensors *st, tz_param *p, const char *name,
                       float *buf) {
    char err[1024];
    if (tz_st_read_f32(st, name, buf, p->ndim, p->shape, err, sizeof err))
        TZ_FATAL("%s", err);
    be->upload(be, p->w, buf, (size_t)p->numel * sizeof(float));
}

static float *max_buffer(const tz_params *ps, int adapters) {
    int64_t n = 1;
    for (int i = 0; i < ps->n; i++)
        if (ps->p[i]->adapter == adapters && ps->p[i]->numel > n) n = ps->p[i]->numel;
    return tz_xmalloc((size_t)n * sizeof(float));
}

tz_llama *tz_llama_load(tz_backend *be, const char *dir, const tz_llama_opts *o) {
    tz_llama_dims d;
    tz_llama_read_dims(dir, &d);
    tz_safetensors st;
    tz_tqf qf;
    char err[1024];
    if (tz_st_open(&st, dir, err, sizeof err)) TZ_FATAL("model.path: %s", err);
    if (tz_tqf_read(&qf, &st, err, sizeof err)) TZ_FATAL("model.path: %s", err);
    tz_llama_opts oq = *o;
    if (qf.present) tz_llama_quant_from_file(&oq, &qf, dir);
    tz_llama *m = tz_llama_create(be, &d, &oq);
    float *buf = max_buffer(&m->params, 0);
    for (int i = 0; i < m->params.n; i++) {
        tz_param *p = m->params.p[i];
        if (p->adapter) continue;
        if (qf.present || p->q) tz_llama_load_weight(m, &st, &qf, p, buf);
        else load_param(be, &st, p, p->name, buf);
    }
    free(buf);
    tz_tqf_free(&qf);
    tz_st_close(&st);
    tz_llama_quant_report(m);
    return m;
}

static void save_weights(tz_llama *m, const char *path, int adapters, int bf16) {
    for (int i = 0; i < m->params.n; i++)
        if (m->params.p[i]->q && m->params.p[i]->adapter == adapters)
            TZ_FATAL_HINT("write quantized models with `turbozero quantize`, dense ones with "
                          "`turbozero export --dequantize`",
                          "%s: %s is quantized; saving a quantized model here is not supported",
                          path, m->params.p[i]->name);
    tz_st_writer w;
    tz_st_writer_init(&w);
    tz_st_writer_set_metadata(&w, "format", "pt");
    tz_st_writer_set_metadata(&w, "producer", "turbozero " TZ_VERSION);
    char err[1024];
    int n = 0;
    for (int i = 0; i < m->params.n; i++) n += m->params.p[i]->adapter == adapters;
    void **bufs = tz_xcalloc((size_t)n + 1, sizeof *bufs);
    n = 0;
    for (int i = 0; i < m->params.n; i++) {
        tz_param *p = m->params.p[i];
        if (p->adapter != adapters) continue;
        float *f = tz_xmalloc((size_t)p->numel * sizeof *f);
        m->be->download(m->be, f, p->w, (size_t)p->numel * sizeof *f);
        enum tz_dtype dt = bf16 ? TZ_DT_BF16 : TZ_DT_F32;
        if (bf16) {
            uint16_t *h = tz_xmalloc((size_t)p->numel * sizeof *h);
            tz_dtype_from_f32(TZ_DT_BF16, f, h, p->numel);
            free(f);
            bufs[n++] = h;
        } else {
            bufs[n++] = f;
        }
        if (tz_st_writer_add(&w, p->name, dt, p->ndim, p->shape, bufs[n - 1], err, sizeof err))
            TZ_FATAL("%s: %s", path, err);
    }
    if (tz_st_writer_save(&w, path, err, sizeof err)) TZ_FATAL("%s", err);
    for (int i = 0; i < n; i++) free(bufs[i]);
    free(bufs);
    tz_st_writer_free(&w);
}

void tz_llama_save(tz_llama *m, const char *dir, int bf16) {
    char path[1100], err[1024];
    if (tz_mkdir_p(dir, err, sizeof err)) TZ_FATAL("%s", err);
    tz_hf_llama c;
    memset(&c, 0, sizeof c);
    c.vocab_size = m->d.vocab;
    c.hidden_size = m->d.dim;
    c.intermediate_size = m->d.hidden;
    c.num_hidden_layers = m->d.n_layers;
    c.num_attention_heads = m->d.n_heads;
    c.num_key_value_heads = m->d.n_kv_heads;
    c.head_dim = m->d.head_dim;
    c.max_position_embeddings = m->d.max_pos;
    c.rms_norm_eps = m->d.eps;
    c.rope_theta = m->d.theta;
    c.tie_word_embeddings = m->d.tied;
    snprintf(c.model_type, sizeof c.model_type, "llama");
    snprintf(c.torch_dtype, sizeof c.torch_dtype, bf16 ? "bfloat16" : "float32");
    tz_path_join(path, sizeof path, dir, "model.safetensors");
    save_weights(m, path, 0, bf16);
    tz_path_join(path, sizeof path, dir, "config.json");
    if (tz_hf_llama_write(&c, path, err, sizeof err)) TZ_FATAL("%s", err);
}

void tz_llama_read_adapter_opts(const char *dir, tz_llama_opts *o) {
    char path[1100], err[1024];
    tz_path_join(path, sizeof path, dir, "adapter_config.json");
    tz_peft_config c;
    if (tz_peft_read(&c, path, err, sizeof err)) TZ_FATAL("model.adapter: %s", err);
    o->lora_rank = c.r;
    o->lora_alpha = c.alpha;
    o->lora_targets = 0;
    for (int i = 0; i < c.ntargets; i++) {
        int found = 0;
        for (int j = 0; j < TZ_LIN_N; j++)
            if (!strcmp(c.targets[i], tz_llama_lin_names[j])) o->lora_targets |= 1 << j, found = 1;
        if (!found)
            TZ_FATAL("%s: target_modules: \"%s\" is not a Llama projection (q_proj, k_proj, "
                     "v_proj, o_proj, gate_proj, up_proj, down_proj)", path, c.targets[i]);
    }
}

void tz_llama_load_adapter(tz_llama *m, const char *dir) {
    char path[1100], err[1024];
    tz_path_join(path, sizeof path, dir, "adapter_model.safetensors");
    tz_safetensors st;
    if (tz_st_open(&st, path, err, sizeof err)) TZ_FATAL("model.adapter: %s", err);
    float *buf = max_buffer(&m->params, 1);
    for (int i = 0; i < m->params.n; i++) {
        tz_param *p = m->params.p[i];
        if (p->adapter) load_param(m->be, &st, p, p->name, buf);
    }
    free(buf);
    tz_st_close(&st);
}

void tz_llama_save_adapter(tz_llama *m, const char *dir, const char *base_model_path) {
    char path[1100], err[1024];
    if (tz_mkdir_p(dir, err, sizeof err)) TZ_FATAL("%s", err);
    tz_peft_config c;
    memset(&c, 0, sizeof c);
    c.r = m->o.lora_rank;
    c.alpha = m->o.lora_alpha;
    for (int j = 0; j < TZ_LIN_N; j++)
        if (m->o.lora_targets & (1 << j))
            snprintf(c.targets[c.ntargets++], sizeof c.targets[0], "%s", tz_llama_lin_names[j]);
    snprintf(c.base_model, sizeof c.base_model, "%s", base_model_path);
    tz_path_join(path, sizeof path, dir, "adapter_model.safetensors");
    save_weights(m, path, 1, 0);
    tz_path_join(path, sizeof path, dir, "adapter_config.json");
    if (tz_peft_write(&c, path, err, sizeof err)) TZ_FATAL("%s", err);
}
