/* The Llama family: token windows (train/data.h) into tz_llama, outputs in HF layout; its
 * registry entry (LoRA targets, init-model presets). Adapters and saving are task.c's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/tokens.h"
#include "model/llama_io.h"
#include "train/commands.h"
#include "train/data.h"
#include "train/task.h"

/* lora.targets names of the projections, in the order of TZ_LIN_* */
static const char *const targets[] = {"q", "k", "v", "o", "gate", "up", "down", NULL};
_Static_assert(sizeof targets / sizeof targets[0] == TZ_LIN_N + 1, "one name per projection");

typedef struct llama_task {
    tz_task t;
    tz_llama *m;
    int have_val;
    tz_tokens train_tok, val_tok;
    tz_data data, val;
    int32_t *in, *tg;
} llama_task;

/* The model, built with the options task.c derived from the config. */
static tz_params *load(tz_task *t) {
    llama_task *k = (llama_task *)t;
    k->m = tz_llama_load(t->be, t->cfg->model.path, &t->opts);
    return &k->m->params;
}

static void open_tokens(tz_tokens *t, const char *path, const char *key, int64_t vocab) {
    char err[1024];
    if (!path[0]) TZ_FATAL_HINT("set it in the config or with --set", "%s is not set", key);
    if (tz_tokens_open(t, path, err, sizeof err)) TZ_FATAL("%s: %s", key, err);
    if (t->vocab > vocab)
        TZ_FATAL_HINT("prepare the data with the model's tokenizer",
                      "%s: %s has vocab %u but the model's vocab is %lld", key, path, t->vocab,
                      (long long)vocab);
}

static void open_task(tz_task *t) {
    llama_task *k = (llama_task *)t;
    const tz_config *cfg = t->cfg;
    tz_llama *m = k->m;
    const int64_t B = t->B, T = cfg->data.seq_len;
    tz_llama_setup(m, B, T);
    t->unit = "tokens";
    t->row_name = "windows";
    t->arena_bytes = m->arena.cap;
    t->row_elems = t->row_count = T;
    snprintf(t->describe, sizeof t->describe,
             "llama %s | %lld layers, dim %lld, %lld/%lld heads, vocab %lld", cfg->model.path,
             (long long)m->d.n_layers, (long long)m->d.dim, (long long)m->d.n_heads,
             (long long)m->d.n_kv_heads, (long long)m->d.vocab);
    if (t->training) {
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
}

static double train_rows(tz_task *t, int64_t first, float dloss) {
    llama_task *k = (llama_task *)t;
    tz_data_batch(&k->data, first, t->B, k->in, k->tg);
    return tz_llama_forward_backward(k->m, k->in, k->tg, dloss);
}

static double train_loss(tz_task *t, int64_t first) {
    llama_task *k = (llama_task *)t;
    tz_data_batch(&k->data, first, t->B, k->in, k->tg);
    return tz_llama_forward(k->m, k->in, k->tg);
}

static double eval_rows(tz_task *t, int64_t first, int64_t n) {
    llama_task *k = (llama_task *)t;
    const int64_t T = t->cfg->data.seq_len;
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

static void save_model(tz_task *t, const char *dir, int bf16) {
    tz_llama_save(((llama_task *)t)->m, dir, bf16);
}

static void close_task(tz_task *t) {
    llama_task *k = (llama_task *)t;
    free(k->in);
    free(k->tg);
    if (k->have_val) {
        tz_data_free(&k->val);
        tz_tokens_close(&k->val_tok);
    }
    if (t->training) {
        tz_data_free(&k->data);
        tz_tokens_close(&k->train_tok);
    }
    tz_llama_free(k->m);
}

static const char *const init_flags[] = {"--vocab", "--tied", NULL};
/* init-model --arch llama --preset P --vocab V [--tied 0|1]: a random Llama in HF layout. */
static int64_t init_model(const tz_init_args *a, char *about, size_t n) {
    const char *vocab = tz_init_arg(a, "--vocab"), *tied = tz_init_arg(a, "--tied");
    if (!vocab) TZ_FATAL("init-model: --arch llama needs --vocab");
    int64_t v = tz_command_int(vocab, "--vocab");
    if (v < 2 || v > (1 << 24)) TZ_FATAL("init-model: --vocab %s: expected 2..16777216", vocab);
    tz_llama_dims d;
    char err[128];
    if (tz_llama_preset(a->preset, v, &d, err, sizeof err))
        TZ_FATAL("init-model: --preset %s: %s", a->preset, err);
    if (tied) d.tied = (int)tz_command_int(tied, "--tied") != 0;
    tz_model_opts o = {0};
    tz_llama *m = tz_llama_create(a->be, &d, &o);
    tz_llama_init_random(m, a->seed);
    tz_llama_save(m, a->out, 0);
    snprintf(about, n, "%lld layers, dim %lld, %lld/%lld heads, vocab %lld, %s embeddings",
             (long long)d.n_layers, (long long)d.dim, (long long)d.n_heads,
             (long long)d.n_kv_heads, (long long)d.vocab, d.tied ? "tied" : "untied");
    const int64_t count = m->params.n_total;
    tz_llama_free(m);
    return count;
}

static const tz_task_ops ops = {sizeof(llama_task), load, open_task, train_rows, eval_rows,
                                save_model, close_task, train_loss};
/* The registry entry (train/family.h): name, LoRA targets, PEFT modules, task, init-model;
 * no sampler. */
const tz_family tz_family_llama = {"llama",    targets,    tz_llama_lin_names, &ops,
                                   init_flags, init_model, NULL,      "CAUSAL_LM"};
