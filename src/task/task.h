/* A task is one model family with its data, behind the few calls the trainer makes, so the
 * loop, evaluation, ZeRO, logging and saving are shared: Llama on token windows, DiT on
 * labelled images with a diffusion loss. The trainer never sees tokens or images. */
#ifndef TZ_TASK_H
#define TZ_TASK_H
#include <stdint.h>

#include "core/backend.h"
#include "io/config.h"
#include "model/model_base.h"
#include "model/params.h"
#include "task/family.h"

struct tz_task {
    const tz_family *family;
    const tz_config *cfg;
    tz_backend *be;
    int training;          /* 0: evaluation only (no training data, frozen model) */
    tz_model_opts opts;    /* what the model is built with (tz_task_model_opts) */
    tz_params *params;     /* the model's; its grad hook lets ZeRO overlap backward */
    int64_t B;             /* rows (windows or images) per micro-batch: train.micro_batch */
    /* set by the family's open: */
    const char *unit;      /* what a validation row counts as: "tokens" (per window) or "images" */
    const char *row_name;  /* what a row is: "windows" (of seq_len tokens) or "images" */
    size_t arena_bytes;    /* activation arena */
    size_t host_act_bytes; /* activations kept in host memory, pinned (a device's checkpointed
                            * residual streams, the kept attention outputs) */
    const char *host_act_what; /* what they are, for messages */
    int64_t row_elems;     /* loss terms per row: seq_len tokens, or C*H*W values */
    int64_t row_count;     /* units per row: seq_len tokens, or 1 image */
    int64_t n_train;       /* training rows (0 when built for evaluation only) */
    int64_t n_val;         /* validation rows (0 without validation data) */
    char describe[2048];    /* one line on the model, for the start-up log */
    char data_line[2048];  /* one line on the data */
    /* The family's (tz_task_ops), for the loop. Training rows first .. first+B-1 of the
     * shared order: forward, loss, backward with d(loss term)/d(...) = dloss; returns the sum
     * of the loss terms. Validation rows first .. first+n-1 (n <= B), forward only; the sum of
     * the loss terms. */
    double (*train_rows)(tz_task *t, int64_t first, float dloss);
    double (*eval_rows)(tz_task *t, int64_t first, int64_t n);
    /* Set by open when not every row element is a loss term (a token file's loss mask): the
     * loss terms of training rows first .. first+n-1 of the shared order (val = 0) or of
     * validation rows (val = 1). The same on every rank: the loop divides by it. NULL:
     * n * row_elems. */
    int64_t (*terms)(tz_task *t, int val, int64_t first, int64_t n);
    /* Training rows first .. first+B-1 as train_rows takes them (the same data and draws),
     * forward only (qzo); the sum of the loss terms. */
    double (*train_loss)(tz_task *t, int64_t first);
};

/* What a family's task does itself (train/task_<name>.c); the rest is task.c's. */
typedef struct tz_task_ops {
    size_t size;  /* bytes of the family's task struct, which starts with a tz_task */
    /* Builds the model with t->opts from t->cfg's model.path; returns its parameters. */
    tz_params *(*load)(tz_task *t);
    /* Sets the model up for t->B rows, opens the data, fills the fields after `unit` (and
     * the head of describe: the family, its folder and its shape). */
    void (*open)(tz_task *t);
    double (*train_rows)(tz_task *t, int64_t first, float dloss);
    double (*eval_rows)(tz_task *t, int64_t first, int64_t n);
    /* The whole model (full mode) in the family's folder layout in dir (F32, or BF16). */
    void (*save_model)(tz_task *t, const char *dir, int bf16);
    /* Releases what load and open made (not t itself). */
    void (*close)(tz_task *t);
    double (*train_loss)(tz_task *t, int64_t first);
} tz_task_ops;

/* The task of cfg's model.arch: options, the model, its adapters (model.adapter, or a fresh
 * LoRA init), the family's data. training = 0: evaluation only. shapes = 1: the model of the
 * shapes model.path's config.json gives, with random weights and random data (a memory plan
 * that reads no weight; the Llama family); model.path "preset:NAME" is always so. */
tz_task *tz_task_create(const tz_config *cfg, tz_backend *be, int training, int shapes);
void tz_task_free(tz_task *t);
/* Rank 0 after training: the model (full, qzo) or the adapter (LoRA, PEFT layout) into
 * dir/model or dir/adapter, committed as one folder (fatal on failure); out gets its path. */
void tz_task_save(tz_task *t, const char *dir, char *out, size_t outlen);

/* Sets t's host_act_bytes and host_act_what from a model's layer stack and kept attention
 * outputs (their host memory, pinned). */
void tz_task_host_acts(tz_task *t, const tz_layer_stack *s, const tz_att_keep *k);

/* The model options a run of cfg asks of family f: train.mode (training only), checkpointing,
 * quant.*, and adapters: model.adapter's settings, or lora.* when training LoRA (fatal for
 * full training with an adapter). */
tz_model_opts tz_task_model_opts(const tz_family *f, const tz_config *cfg, int training);
/* A one-process forward-only command (sample): the backend of run.device at run.precision,
 * and in *o family f's evaluation options without checkpointing (nothing is kept for a
 * backward pass). The caller loads its model with them, then tz_task_load_adapters. */
tz_backend *tz_task_forward_setup(const tz_family *f, const tz_config *cfg, tz_model_opts *o);
/* Once the model is loaded: model.adapter's tensors into ps, or a fresh LoRA init (run.seed)
 * when o asks for adapters. */
void tz_task_load_adapters(const tz_config *cfg, const tz_model_opts *o, tz_params *ps,
                           tz_backend *be);

#endif
