/* The run configuration: one pointer-free struct filled from a libconfig file, with
 * --set overrides, checked against a schema (type, default or required, range).
 * Pointer-free so rank 0 can parse it and broadcast it as bytes. */
#ifndef TZ_CONFIG_H
#define TZ_CONFIG_H
#include <stdint.h>
#include <stdio.h>

#include "comm/fwd.h"     /* enum tz_comm_backend */
#include "core/backend.h" /* enum tz_device_kind, enum tz_precision */

#define TZ_PATH_MAX 512

enum tz_mode { TZ_MODE_LORA = 0, TZ_MODE_FULL = 1, TZ_MODE_QZO = 2 };
/* qzo.schedule */
enum tz_qzo_schedule { TZ_QZO_CONSTANT = 0, TZ_QZO_COSINE = 1 };
/* lora.init: how fresh adapters start (docs/guide.md, "Quantized models"). */
enum tz_lora_init {
    TZ_LORA_INIT_DEFAULT = 0,
    TZ_LORA_INIT_LOFTQ = 1,
    TZ_LORA_INIT_CALIBRATED = 2,       /* base quantize(W), the adapter fitted on inputs */
    TZ_LORA_INIT_LOFTQ_CALIBRATED = 3  /* loftq's base, the adapter then refitted on inputs */
};
/* quant.method; the values are quant/turboquant.h's enum tz_tq_method. */
enum tz_quant_method { TZ_QUANT_TURBOQUANT = 0, TZ_QUANT_ABSMAX = 1 };
enum tz_quant_rounding { TZ_ROUND_NEAREST = 0, TZ_ROUND_STOCHASTIC = 1 };

/* The values of the keys that belong to the model families, which io/ does not know: the
 * caller passes them in (src/task/family.c, tz_family_names), NULL-terminated. model.arch is
 * stored as an index into archs (0 is the default); lora.targets as the names given. */
#define TZ_CONFIG_NAMES_MAX 64
typedef struct tz_config_names {
    const char *archs[TZ_CONFIG_NAMES_MAX + 1];   /* the families */
    const char *targets[TZ_CONFIG_NAMES_MAX + 1]; /* every family's LoRA targets, each once */
    const char *optims[TZ_CONFIG_NAMES_MAX + 1];  /* the optimizers (optim/optim.c) */
} tz_config_names;

typedef struct tz_config {
    char source[TZ_PATH_MAX]; /* the file it came from */
    struct {
        int arch;                     /* index into tz_config_names.archs: "llama" | "dit" */
        char path[TZ_PATH_MAX];       /* HF-layout folder (config.json + safetensors) */
        char adapter[TZ_PATH_MAX];    /* optional LoRA adapter folder to load ("" = none) */
    } model;
    struct {
        char train[TZ_PATH_MAX];      /* token file (llama); images: IDX or HDF5 (dit) */
        char val[TZ_PATH_MAX];        /* the same for validation ("" = no validation) */
        char train_labels[TZ_PATH_MAX]; /* IDX label file of data.train (dit) */
        char val_labels[TZ_PATH_MAX];   /* IDX label file of data.val (dit) */
        char classes[TZ_PATH_MAX];    /* class subset "0-4,7" of image data ("" = all) */
        int64_t seq_len;
    } data;
    struct {
        int mode;                     /* enum tz_mode: "lora" | "full" | "qzo" */
        int64_t steps;
        int64_t micro_batch;
        int64_t grad_accum;
        int64_t eval_every;           /* 0: evaluate only before and after */
        int64_t eval_windows;         /* 0: every validation window (or image) */
        int64_t eval_seed;            /* seed of the diffusion eval draws (fixed across runs) */
        int64_t log_every;
        int checkpointing;            /* activation checkpointing */
        int64_t threads;              /* 0: OpenMP default */
        int64_t checkpoint_every;     /* steps between checkpoints (0: none but on a signal) */
        int64_t keep_checkpoints;     /* newest complete checkpoints kept (0: all) */
        int keep_best;                /* checkpoint at each new best eval, kept; run.dir/best */
    } train;
    struct {
        int name;                     /* index into tz_config_names.optims: "adamw" */
        double lr;
        double min_lr_ratio;          /* cosine floor as a fraction of lr */
        int64_t warmup;               /* steps */
        double weight_decay;          /* decoupled; matrices only */
        double beta1, beta2, eps;
        double grad_clip;             /* global norm; 0 = off */
        int offload;                  /* the optimizer on the host (1) or the backend (0) */
    } optim;
    struct {
        int64_t rank;
        double alpha;
        char targets[TZ_PATH_MAX];    /* "all", or names of tz_config_names.targets joined
                                       * by ',' in that order, each once: "q,v" */
        int init;                     /* enum tz_lora_init: "default" | "loftq" | "calibrated"
                                       * | "loftq_calibrated" */
        int64_t calibration;          /* lora.init = "calibrated": training rows of inputs */
        int train_embeddings;         /* also train the conditioning embeddings (DiT's class
                                       * table), saved with the adapter */
    } lora;
    struct {
        double eps;                   /* perturbation size of the scales */
        double clip;                  /* |directional derivative| bound C */
        int schedule;                 /* enum tz_qzo_schedule: "constant" | "cosine" */
    } qzo;
    struct {
        int64_t stage;                /* 0: DDP all-reduce; 1: + sharded optimizer; 2: + sharded gradients */
        double bucket_mb;             /* gradient bucket size */
    } zero;
    struct {
        int64_t bits;                 /* 0: dense base; 1..4: quantize the projections at load */
        int64_t group;                /* 64, 128 or 256 */
        int method;                   /* enum tz_quant_method: "turboquant" | "absmax" */
        int rounding;                 /* enum tz_quant_rounding: "nearest" | "stochastic" */
        int count_changes;            /* log the share of codes each re-quantization changes */
        int64_t seed;                 /* TurboQuant sign seed */
        int64_t offload_blocks;       /* the last N blocks' codes on the host, streamed in */
    } quant;
    struct {
        char dir[TZ_PATH_MAX];
        int64_t seed;
        int overwrite;                /* replace an existing run in run.dir */
        int save_dtype;               /* full-mode model output: "f32" (0) | "bf16" (1) */
        enum tz_device_kind device;   /* compute backend: "auto" | "cpu" | "cuda" */
        enum tz_precision precision;  /* GEMM operands: "auto" | "fp32" | "bf16" */
        double collective_timeout;    /* seconds a collective may wait; 0 = no watchdog */
    } run;
    struct {
        enum tz_comm_backend backend; /* "auto" | "mpi" | "nccl" */
    } comm;
} tz_config;

/* Parse FILE, apply overrides ("section.key=value", nset of them), check everything, the
 * families' keys against names. Any error is fatal with "FILE:LINE: key: expected ..." (or
 * "--set KEY: ..."). */
void tz_config_load(tz_config *cfg, const tz_config_names *names, const char *file,
                    const char *const *sets, int nset);
/* Defaults for every key that has one (required strings left empty). */
void tz_config_defaults(tz_config *cfg);
/* Write the effective config in libconfig syntax (every key, loadable again). */
void tz_config_write(const tz_config *cfg, const tz_config_names *names, FILE *f);
/* Name for printing. */
const char *tz_mode_name(int mode);
/* The name of a run.device value ("auto", "cpu" or "cuda"), for messages. */
const char *tz_device_name(int device);
/* The names of comm.backend and run.precision values, for messages. */
const char *tz_comm_backend_name(int backend);
const char *tz_precision_name(int precision);

#endif
