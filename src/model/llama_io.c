/* Llama weights from and to HF-layout folders (adapters: model/adapter_io.c). The formats
 * themselves are in io/ (safetensors, hf_config, tq_format); this file maps names. */
#include "model/llama_io.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/adapter_io.h"
#include "io/fsutil.h"
#include "io/hf_config.h"
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
    d->qkv_bias = !strcmp(c.model_type, "qwen2"); /* q, k, v biases */
    d->qk_norm = !strcmp(c.model_type, "qwen3");  /* per-head q/k RMSNorm */
    if (!strcmp(c.rope_type, "llama3")) {
        d->rope_type = TZ_ROPE_LLAMA3;
        d->rope_factor = c.rope_factor;
        d->rope_low_freq = c.rope_low_freq_factor;
        d->rope_high_freq = c.rope_high_freq_factor;
        d->rope_orig_max = c.rope_original_max_position_embeddings;
    }
}

/* One tensor the dims promise: present in the file (dense, or as a quantized entry) with
 * this shape. Fatal, naming the file and the config key, otherwise. */
static void expect_tensor(const tz_safetensors *st, const tz_tqf *qf, const char *dir,
                          const char *name, int ndim, int64_t d0, int64_t d1, const char *key,
                          int64_t key_value) {
    char got[96] = "", want[96];
    int64_t shape[2] = {d0, d1};
    tz_st_shape_str(want, sizeof want, ndim, shape);
    const tz_tqf_entry *e = qf->present ? tz_tqf_find(qf, name) : NULL;
    if (e) {
        int64_t qs[2] = {e->rows, e->cols};
        if (ndim == 2 && e->rows == d0 && e->cols == d1) return;
        tz_st_shape_str(got, sizeof got, 2, qs);
    } else {
        const tz_st_tensor *t = tz_st_find(st, name);
        if (!t)
            TZ_FATAL_HINT("check config.json against the weights (a config.json of another model?)",
                          "model.path: %s: tensor '%s' is missing from the weights, but "
                          "config.json says %s = %lld", dir, name, key, (long long)key_value);
        if (t->ndim == ndim && t->shape[0] == d0 && (ndim == 1 || t->shape[1] == d1)) return;
        tz_st_shape_str(got, sizeof got, t->ndim, t->shape);
    }
    TZ_FATAL_HINT("check config.json against the weights (a config.json of another model?)",
                  "model.path: %s: tensor '%s' has shape %s in the weights, config.json implies %s "
                  "(%s = %lld)", dir, name, got, want, key, (long long)key_value);
}

/* Every tensor config.json implies, checked against the file before anything is allocated:
 * a config.json that does not belong to the weights (num_hidden_layers 1000000, a vocab of
 * another model) is refused by name instead of growing memory first. */
static void check_shapes(const tz_llama_dims *d, const tz_safetensors *st, const tz_tqf *qf,
                         const char *dir) {
    const int64_t C = d->dim, qd = d->n_heads * d->head_dim, kvd = d->n_kv_heads * d->head_dim;
    static const char *const blk[7] = {"self_attn", "self_attn", "self_attn", "self_attn",
                                       "mlp", "mlp", "mlp"};
    static const char *const lin[7] = {"q_proj", "k_proj", "v_proj", "o_proj",
                                       "gate_proj", "up_proj", "down_proj"};
    const int64_t out[7] = {qd, kvd, kvd, C, d->hidden, d->hidden, C};
    const int64_t in[7] = {C, C, C, qd, C, C, d->hidden};
    static const char *const key[7] = {"num_attention_heads", "num_key_value_heads",
                                       "num_key_value_heads", "num_attention_heads",
                                       "intermediate_size", "intermediate_size",
                                       "intermediate_size"};
    const int64_t keyv[7] = {d->n_heads, d->n_kv_heads, d->n_kv_heads, d->n_heads,
                             d->hidden, d->hidden, d->hidden};
    char name[256];
    expect_tensor(st, qf, dir, "model.embed_tokens.weight", 2, d->vocab, C, "vocab_size", d->vocab);
    expect_tensor(st, qf, dir, "model.norm.weight", 1, C, 1, "hidden_size", C);
    if (!d->tied) expect_tensor(st, qf, dir, "lm_head.weight", 2, d->vocab, C, "vocab_size", d->vocab);
    for (int64_t i = 0; i < d->n_layers; i++) {
        snprintf(name, sizeof name, "model.layers.%lld.input_layernorm.weight", (long long)i);
        expect_tensor(st, qf, dir, name, 1, C, 1, "num_hidden_layers", d->n_layers);
        snprintf(name, sizeof name, "model.layers.%lld.post_attention_layernorm.weight", (long long)i);
        expect_tensor(st, qf, dir, name, 1, C, 1, "num_hidden_layers", d->n_layers);
        for (int j = 0; j < 7; j++) {
            snprintf(name, sizeof name, "model.layers.%lld.%s.%s.weight", (long long)i, blk[j],
                     lin[j]);
            expect_tensor(st, qf, dir, name, 2, out[j], in[j], key[j], keyv[j]);
            if (d->qkv_bias && j < 3) { /* model_type qwen2 */
                snprintf(name, sizeof name, "model.layers.%lld.self_attn.%s.bias", (long long)i,
                         lin[j]);
                expect_tensor(st, qf, dir, name, 1, out[j], 1, key[j], keyv[j]);
            }
        }
        for (int j = 0; d->qk_norm && j < 2; j++) { /* model_type qwen3 */
            snprintf(name, sizeof name, "model.layers.%lld.self_attn.%s_norm.weight",
                     (long long)i, j ? "k" : "q");
            expect_tensor(st, qf, dir, name, 1, d->head_dim, 1, "head_dim", d->head_dim);
        }
    }
}

tz_llama *tz_llama_load(tz_backend *be, const char *dir, const tz_model_opts *o) {
    tz_llama_dims d;
    tz_llama_read_dims(dir, &d);
    tz_safetensors st;
    tz_tqf qf;
    char err[1024];
    if (tz_st_open(&st, dir, err, sizeof err)) TZ_FATAL("model.path: %s", err);
    if (tz_tqf_read(&qf, &st, err, sizeof err)) TZ_FATAL("model.path: %s", err);
    tz_model_opts oq = *o;
    if (qf.present) tz_llama_quant_from_file(&oq.quant, &qf, dir);
    check_shapes(&d, &st, &qf, dir);
    tz_llama *m = tz_llama_create(be, &d, &oq);
    float *buf = tz_params_host_buffer(&m->params, 0);
    for (int i = 0; i < m->params.n; i++)
        if (!m->params.p[i]->adapter) tz_llama_load_weight(m, &st, &qf, m->params.p[i], buf);
    free(buf);
    tz_tqf_free(&qf);
    tz_st_close(&st);
    tz_llama_quant_report(m);
    return m;
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
    if (m->d.rope_type == TZ_ROPE_LLAMA3) {
        snprintf(c.rope_type, sizeof c.rope_type, "llama3");
        c.rope_factor = m->d.rope_factor;
        c.rope_low_freq_factor = m->d.rope_low_freq;
        c.rope_high_freq_factor = m->d.rope_high_freq;
        c.rope_original_max_position_embeddings = m->d.rope_orig_max;
    }
    snprintf(c.model_type, sizeof c.model_type, "%s",
             m->d.qk_norm ? "qwen3" : m->d.qkv_bias ? "qwen2" : "llama");
    snprintf(c.torch_dtype, sizeof c.torch_dtype, bf16 ? "bfloat16" : "float32");
    tz_path_join(path, sizeof path, dir, "model.safetensors");
    /* quantized weights (full fine-tuning of a quantized model) keep the quantized layout */
    int nq = tz_params_save(&m->params, m->be, path, 0, bf16, NULL, 0, &m->o.quant, NULL);
    tz_path_join(path, sizeof path, dir, "config.json");
    if (tz_hf_llama_write(&c, path, err, sizeof err)) TZ_FATAL("%s", err);
    if (nq) {
        char qc[400];
        tz_llama_quant_config_json(&m->o.quant, qc, sizeof qc);
        if (tz_hf_config_rewrite(path, path, qc, NULL, err, sizeof err)) TZ_FATAL("%s", err);
    }
}
