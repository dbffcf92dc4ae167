/* A task is one model family with its data, behind the few calls the trainer makes, so the
 * loop, evaluation, ZeRO, logging and saving are shared: Llama on token windows, DiT on
 * labelled images with a diffusion loss. The trainer never sees tokens or images. */
#ifndef TZ_TASK_H
#define TZ_TASK_H
#include <stdint.h>

#include "core/backend.h"
#include "io/config.h"
#include "model/params.h"

typedef struct tz_task tz_task;
struct tz_task {
    const char *unit;      /* what a validation row counts as: "tokens" (per window) or "images" */
    tz_params *params;     /* the model's; its grad hook lets ZeRO overlap backward */
    size_t arena_bytes;    /* activation arena */
    int64_t B;             /* rows (windows or images) per micro-batch */
    int64_t row_elems;     /* loss terms per row: seq_len tokens, or C*H*W values */
    int64_t row_count;     /* units per row: seq_len tokens, or 1 image */
    int64_t n_train;       /* training rows (0 when built for evaluation only) */
    int64_t n_val;         /* validation rows (0 without validation data) */
    char describe[2048];    /* one line on the model, for the start-up log */
    char data_line[2048];  /* one line on the data */
    void *impl;
    /* Training rows first .. first+B-1 of the shared order: forward, loss, backward with
     * d(loss term)/d(...) = dloss; returns the sum of the loss terms. */
    double (*train_rows)(tz_task *t, int64_t first, float dloss);
    /* Validation rows first .. first+n-1 (n <= B), forward only; sum of the loss terms. */
    double (*eval_rows)(tz_task *t, int64_t first, int64_t n);
    /* Rank 0 after training: the model (full) or the adapter (LoRA) into run.dir; out gets
     * the folder written. */
    void (*save)(tz_task *t, char *out, size_t outlen);
    void (*destroy)(tz_task *t);
};

/* Builders, one per model family: the model (+ adapters), its data, the arena for
 * micro_batch rows. training = 0: evaluation only (no training data, frozen model). */
tz_task *tz_task_llama_create(const tz_config *cfg, tz_backend *be, int training);
tz_task *tz_task_dit_create(const tz_config *cfg, tz_backend *be, int training);

#endif
