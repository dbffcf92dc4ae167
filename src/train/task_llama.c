/* The Llama task: token windows (train/data.h) into tz_llama, adapters per lora.* or
 * model.adapter, outputs in HF / PEFT layout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/fsutil.h"
#include "io/tokens.h"
#include "model/llama_io.h"
#include "train/data.h"
#include "train/task.h"

_Static_assert(TZ_LORA_Q == 1 << TZ_LIN_Q && TZ_LORA_K == 1 << TZ_LIN_K &&
                   TZ_LORA_V == 1 << TZ_LIN_V && TZ_LORA_O == 1 << TZ_LIN_O &&
                   TZ_LORA_GATE == 1 << TZ_LIN_GATE && TZ_LORA_UP == 1 << TZ_LIN_UP &&
                   TZ_LORA_DOWN == 1 << TZ_LIN_DOWN,
               "config LoRA target bits follow the projection order of the model");

typedef struct llama_task {
    tz_task t;
    const tz_config *cfg;
    tz_llama *m;
    int training, have_val;
    tz_tokens train_tok, val_tok;
    tz_data data, val;
    int32_t *in, *tg;
} llama_task;

static void open_tokens(tz_tokens *t, const char *path, const char *key, int64_t vocab) {
    char err[1024];
    if (!path[0]) TZ_FATAL_HINT("set it in the config or with --set", "%s is not set", key);
    if (tz_tokens_open(t, path, err, sizeof err)) TZ_FATAL("%s: %s", key, err);
    if (t->vocab > vocab)
        TZ_FATAL_HINT("prepare the data with the model's tokenizer",
                      "%s: %s has vocab %u but the model's vocab is %lld", key, path, t->vocab,
                      (long long)vocab);
}

static double train_rows(tz_task *t, int64_t first, float dloss) {
    llama_task *k = (llama_task *)t;
    tz_data_batch(&k->data, first, t->B, k->in, k->tg);
    return tz_llama_forward_backward(k->m, k->in, k->tg, dloss);
}

static double eval_rows(tz_task *t, int64_t first, int64_t n) {
    llama_task *k = (llama_task *)t;
    const int64_t T = k->cfg->data.seq_len;
    for (int64_t i = 0; i < t->B; i++) {
        if (i < n) {
            tz_data_window(&k->val, first + i, k->in + i * T, k->tg + i * T);
        } else { /* a partial batch: padding rows whose targets are ignored */
            memset(k->in + i * T, 0, (size_t)T * sizeof *k->in);
            for (int64_t j = 0; j < T; j++) k->tg[i * T + j] = -1;
        }
    }
    return tz_llama_forward(k->m, k->in, k->tg);
}

static void save(tz_task *t, char *out, size_t outlen) {
    llama_task *k = (llama_task *)t;
    if (k->cfg->train.mode == TZ_MODE_FULL) {
        tz_path_join(out, outlen, k->cfg->run.dir, "model");
        tz_llama_save(k->m, out, k->cfg->run.save_dtype);
    } else {
        tz_path_join(out, outlen, k->cfg->run.dir, "adapter");
        tz_llama_save_adapter(k->m, out, k->cfg->model.path);
    }
}

static void destroy(tz_task *t) {
    llama_task *k = (llama_task *)t;
    free(k->in);
    free(k->tg);
    if (k->have_val) {
        tz_data_free(&k->val);
        tz_tokens_close(&k->val_tok);
    }
    if (k->training) {
        tz_data_free(&k->data);
        tz_tokens_close(&k->train_tok);
    }
    tz_llama_free(k->m);
    free(k);
}

tz_task *tz_task_llama_create(const tz_config *cfg, tz_backend *be, int training) {
    llama_task *k = tz_xcalloc(1, sizeof *k);
    k->cfg = cfg;
    k->training = training;
    tz_model_opts o = {0};
    o.full = training && cfg->train.mode == TZ_MODE_FULL;
    o.checkpointing = cfg->train.checkpointing;
    o.quant.method = cfg->quant.method;
    o.quant.bits = (int)cfg->quant.bits;
    o.quant.group = (int)cfg->quant.group;
    o.quant.seed = (uint64_t)cfg->quant.seed;
    if (cfg->model.adapter[0]) {
        tz_llama_read_adapter_opts(cfg->model.adapter, &o);
    } else if (training && cfg->train.mode == TZ_MODE_LORA) {
        o.lora_targets = cfg->lora.targets;
        o.lora_rank = cfg->lora.rank;
        o.lora_alpha = cfg->lora.alpha;
    }
    if (o.full && o.lora_targets)
        TZ_FATAL_HINT("unset model.adapter, or train with train.mode = \"lora\"",
                      "%s: train.mode = \"full\" with an adapter (model.adapter = %s)",
                      cfg->source, cfg->model.adapter);
    tz_llama *m = k->m = tz_llama_load(be, cfg->model.path, &o);
    if (cfg->model.adapter[0]) tz_llama_load_adapter(m, cfg->model.adapter);
    else if (o.lora_targets) tz_model_init_lora(&m->params, be, (uint64_t)cfg->run.seed);
    const int64_t B = cfg->train.micro_batch, T = cfg->data.seq_len;
    tz_llama_setup(m, B, T);

    tz_task *t = &k->t;
    t->unit = "tokens";
    t->params = &m->params;
    t->arena_bytes = m->arena.cap;
    t->B = B;
    t->row_elems = t->row_count = T;
    snprintf(t->describe, sizeof t->describe,
             "llama %s | %lld layers, dim %lld, %lld/%lld heads, vocab %lld | %lld params, "
             "%lld trainable (%s)",
             cfg->model.path, (long long)m->d.n_layers, (long long)m->d.dim,
             (long long)m->d.n_heads, (long long)m->d.n_kv_heads, (long long)m->d.vocab,
             (long long)m->params.n_total, (long long)m->params.n_trainable,
             training ? tz_mode_name(cfg->train.mode) : "eval");
    if (training) {
        open_tokens(&k->train_tok, cfg->data.train, "data.train", m->d.vocab);
        tz_data_init(&k->data, &k->train_tok, T, (uint64_t)cfg->run.seed);
        t->n_train = k->data.nwin;
        snprintf(t->data_line, sizeof t->data_line, "%s: %lld tokens, %lld windows of %lld",
                 cfg->data.train, (long long)k->train_tok.count, (long long)k->data.nwin,
                 (long long)T);
    }
    k->have_val = cfg->data.val[0] != 0;
    if (k->have_val) {
        open_tokens(&k->val_tok, cfg->data.val, "data.val", m->d.vocab);
        tz_data_init(&k->val, &k->val_tok, T, 0);
        t->n_val = k->val.nwin;
    }
    k->in = tz_xmalloc((size_t)(B * T) * sizeof *k->in);
    k->tg = tz_xmalloc((size_t)(B * T) * sizeof *k->tg);
    t->impl = k;
    t->train_rows = train_rows;
    t->eval_rows = eval_rows;
    t->save = save;
    t->destroy = destroy;
    return t;
}
