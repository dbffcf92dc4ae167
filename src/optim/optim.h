/* The optimizer interface (named per-element state arrays, a step over a shard range, the
 * hyperparameters), the registry of optimizers, and the host shard they run on. */
#ifndef TZ_OPTIM_H
#define TZ_OPTIM_H
#include <stddef.h>
#include <stdint.h>

#include "core/backend.h"
#include "core/dtype.h"
#include "comm/fwd.h"

#define TZ_OPTIM_MAX_STATES 4

/* One step's hyperparameters: the optim section of the config with the scheduled learning
 * rate. Each optimizer reads the fields it uses and documents them. */
typedef struct tz_optim_hparams {
    double lr;            /* this step's learning rate (schedule applied) */
    double beta1, beta2;  /* moment decays */
    double eps;
    double weight_decay;  /* decoupled, where the element's decay flag is set */
} tz_optim_hparams;

/* The per-element arrays of one shard that a step reads and writes, indexed alike. */
typedef struct tz_optim_arrays {
    float *w;                            /* fp32 master weights, updated in place */
    const float *g;                      /* the accumulated gradient, before grad_scale */
    const uint8_t *decay;                /* != 0 where weight decay applies; NULL: everywhere */
    void *state[TZ_OPTIM_MAX_STATES];    /* the optimizer's states, in state_names order,
                                          * each of its state_types element type */
} tz_optim_arrays;

/* An optimizer: what it keeps per element and how it steps. The state names are the names
 * the states carry outside the program (checkpoint datasets), so they are chosen once and
 * kept: PyTorch's names where PyTorch has the same optimizer. Each state has an element type
 * (state_types, TZ_DT_F32 unless set; TZ_DT_BF16 and TZ_DT_U8 too, e.g. an 8-bit optimizer's
 * codes), which the shard allocates and checkpoints store as they are (tz_shard_dtype_ok). A
 * state is one element per parameter element, so it is sliced across ranks like the master. */
typedef struct tz_optim {
    const char *name;                               /* "adamw" */
    int n_states;                                   /* arrays per element, <= MAX */
    const char *state_names[TZ_OPTIM_MAX_STATES];   /* "exp_avg", "exp_avg_sq" */
    enum tz_dtype state_types[TZ_OPTIM_MAX_STATES]; /* TZ_DT_F32 (0) unless set */
    /* Elements [lo, hi) at step t (1-based), with g multiplied by grad_scale (the clip
     * factor). Runs on the calling thread: the shard calls it on disjoint ranges from
     * every thread at once, so an element's result must not depend on the range split. */
    void (*step)(const tz_optim_arrays *a, int64_t lo, int64_t hi, int64_t t,
                 const tz_optim_hparams *h, float grad_scale);
} tz_optim;

/* AdamW's scalars for step t (1-based) of h, the gradient scaled by grad_scale. */
tz_adamw_args tz_adamw_args_of(const tz_optim_hparams *h, int64_t t, float grad_scale);

/* The registered optimizer called name, or NULL. */
const tz_optim *tz_optim_find(const char *name);
/* The i-th optimizer of the registry (optim.name's index, in order), NULL past the last. */
const tz_optim *tz_optim_at(int i);

/* Learning rate at step (0-based) of total: linear warmup over `warmup` steps to lr, then
 * cosine from lr down to lr * min_ratio at the last step. */
double tz_lr_at(int64_t step, int64_t total, int64_t warmup, double lr, double min_ratio);

/* ---- the host shard ---- */

/* One named per-element array of the shard. saved: part of the training state a checkpoint
 * keeps (the master and the optimizer's states); the accumulator is rewritten every step
 * and the decay flags follow from the parameter table. */
typedef struct tz_shard_array {
    const char *name;
    void *data;
    enum tz_dtype dtype;
    size_t elem_bytes;
    int saved;
} tz_shard_array;

/* The element types a shard array (an optimizer state) may have: fp32, bf16, bytes. */
static inline int tz_shard_dtype_ok(enum tz_dtype dt) {
    return dt == TZ_DT_F32 || dt == TZ_DT_BF16 || dt == TZ_DT_U8;
}

enum { TZ_SHARD_MASTER, TZ_SHARD_ACC, TZ_SHARD_DECAY, TZ_SHARD_STATE0 };
#define TZ_SHARD_MAX_ARRAYS (TZ_SHARD_STATE0 + TZ_OPTIM_MAX_STATES)

/* A rank's slice of the flat trainable space in host memory (NUMA-local): the fp32 master
 * ("master"), the fp32 gradient accumulator ("grad_acc"), the weight-decay flags ("decay",
 * one byte) and the optimizer's states, n elements each. */
typedef struct tz_shard {
    const tz_optim *opt;
    const tz_world *world;
    int64_t n;
    int n_arrays;
    tz_shard_array a[TZ_SHARD_MAX_ARRAYS];
    float *master, *acc;   /* = a[TZ_SHARD_MASTER].data, a[TZ_SHARD_ACC].data */
    uint8_t *decay;        /* = a[TZ_SHARD_DECAY].data */
    size_t bytes;          /* all arrays together */
    double *partial;       /* one sum of squares per block (tz_shard_sumsq) */
} tz_shard;

/* tz_shard_sumsq's block: the shard is cut into blocks of this many elements from its
 * start, whatever the thread count. */
#define TZ_SHARD_SUMSQ_BLOCK 16384

/* Allocates every array zeroed on the world's NUMA node. Fatal on an invalid optimizer. */
void tz_shard_init(tz_shard *s, const tz_optim *opt, int64_t n, const tz_world *world);
void tz_shard_free(tz_shard *s);
/* The optimizer's state i (0 <= i < opt->n_states), of its element type. */
void *tz_shard_state(const tz_shard *s, int i);
/* Sum of squares of the accumulator in double, blocked: each block of TZ_SHARD_SUMSQ_BLOCK
 * elements summed in a fixed order by one thread, the block sums added in block order. The
 * bits do not depend on the thread count (they differ from a serial sum's last bits). */
double tz_shard_sumsq(const tz_shard *s);
/* One optimizer step over the whole shard: master and states from the accumulator times
 * grad_scale, one range per OpenMP thread (tz_shard_thread_range). */
void tz_shard_update(tz_shard *s, const tz_optim_hparams *h, int64_t t, float grad_scale);
/* Inside a parallel region: this thread's part of n elements, equal parts cut at multiples
 * of 16 elements (64 bytes). */
void tz_shard_thread_range(int64_t n, int64_t *lo, int64_t *hi);
/* memcpy of host memory on every thread (one part each) when it is large (>= 128 KiB): the
 * host step's copies at memory bandwidth; the same bytes as memcpy. */
void tz_host_copy(void *dst, const void *src, size_t bytes);
/* Bytes per element of the shard's arrays (AdamW: 4 master + 4 accumulator + 1 decay + 8
 * states = 17) and of opt's alone, before a shard exists (AdamW: 17). */
size_t tz_shard_elem_bytes(const tz_shard *s);
size_t tz_optim_elem_bytes(const tz_optim *opt);
/* Bytes a step reads and writes per element (AdamW: 29). */
size_t tz_shard_step_bytes(const tz_shard *s);
/* "master, grad_acc, decay, exp_avg, exp_avg_sq" into buf. */
void tz_shard_describe(const tz_shard *s, char *buf, size_t len);

#endif
