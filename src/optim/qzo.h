/* train.mode = "qzo": quantized zeroth-order training (QZO, Shang et al. 2025). The frozen
 * codes of every quantized projection stay as they are; only the per-group scales train,
 * from two forward passes per step (Q-SPSA) with the estimated directional derivative
 * clipped. No gradient, no optimizer moment and no activation kept for a backward pass: the
 * model is built forward-only (tz_model_opts.forward_only), so a step needs the memory of
 * inference plus an fp32 copy of the scales (4 bytes per group).
 *
 * One step s (eps = qzo.eps, C = qzo.clip, lr from optim.lr and qzo.schedule):
 *   z ~ N(0, I), one value per scale, regenerated from (run.seed, s) whenever needed: the
 *     stream of scales k*1024 .. k*1024+1023 of quantized tensor i (in parameter-table
 *     order) is tz_rng_make(run.seed, s, TZ_RNG_QZO, i << 32 | k), tz_rng_normal in order.
 *     Every rank derives the same z, with no communication.
 *   l+ = loss with scales bf16(m + eps z), l- = loss with bf16(m - eps z), over the global
 *     batch (the same rows as a LoRA or full step); m is the fp32 copy.
 *   d = (l+ - l-) / (2 eps), clipped to [-C, C];  m <- max(m - lr d z, 1e-7);  scales <- bf16(m).
 *   The stored scales are always bf16(m): with lr = 0 they come back bit for bit. A group
 *   whose scale is 0 (an all-zero group) stays 0.
 * Data parallel: each rank sums its rows' loss terms per micro-batch, as fixed-point
 * integers (2^-24 units), so the sum has the same bits in any order; one all-reduce of the
 * two integers gives the global l+ and l-, identical at any number of ranks. */
#ifndef TZ_QZO_H
#define TZ_QZO_H
#include <stddef.h>
#include <stdint.h>

#include "core/backend.h"
#include "io/config.h"
#include "model/params.h"
#include "comm/fwd.h"
#include "task/task.h"

#define TZ_QZO_BLOCK 1024       /* scales per random stream */
#define TZ_QZO_MIN_SCALE 1e-7f  /* the floor of an updated scale */

typedef struct tz_qzo_tensor {
    tz_param *p;     /* a quantized weight of the model */
    int64_t n;       /* its scales */
    float *master;   /* host fp32 copy of the scales, where the updates accumulate */
} tz_qzo_tensor;

typedef struct tz_qzo {
    tz_backend *be;
    uint64_t seed;
    int n;                 /* quantized tensors */
    tz_qzo_tensor *t;
    int64_t n_scales;
    uint16_t *stage;       /* bf16 staging buffer, as large as the largest tensor's scales */
    size_t host_bytes;     /* fp32 copies + staging */
    /* the training loop's (tz_qzo_create): */
    const tz_config *cfg;
    tz_task *task;
    tz_comm *comm;
} tz_qzo;

/* One step's figures: the loss (l+ + l-) / 2 per loss term, the directional derivative
 * estimate d before clipping, and the learning rate used. */
typedef struct tz_qzo_stats {
    double loss, lplus, lminus, d, lr;
} tz_qzo_stats;

/* The scales of every quantized weight of ps (read from the backend into fp32 copies);
 * q->n = 0 when ps holds none. tz_qzo_free releases what init made. */
void tz_qzo_init(tz_qzo *q, tz_params *ps, tz_backend *be, uint64_t seed);
void tz_qzo_free(tz_qzo *q);
/* z of tensor i at step (q->t[i].n values). */
void tz_qzo_noise(const tz_qzo *q, uint64_t step, int i, float *z);
/* The model's scales <- bf16(m + c z_step) (c = 0: bf16(m), the unperturbed scales). */
void tz_qzo_perturb(tz_qzo *q, uint64_t step, double c);
/* m <- max(m - a z_step, 1e-7) where m > 0, then scales <- bf16(m). */
void tz_qzo_update(tz_qzo *q, uint64_t step, double a);
/* A loss sum as fixed point (2^-24 units), fatal when not finite or beyond 2^30. */
int64_t tz_qzo_fixed(double loss_sum);
/* One Q-SPSA step (the header's): fn(ctx) gives this rank's loss sum under the current
 * scales (tz_qzo_fixed units), summed over comm's ranks (comm NULL: one process); total is
 * the number of loss terms in the global batch (the mean's divisor). */
tz_qzo_stats tz_qzo_step(tz_qzo *q, uint64_t step, double eps, double clip, double lr,
                         int64_t (*fn)(void *ctx), void *ctx, tz_comm *comm, double total);

/* The training loop's side (train/trainer.c). Create: the scales of task's model, with the
 * settings of cfg (fatal, naming the keys, on a model without quantized weights). */
tz_qzo *tz_qzo_create(const tz_config *cfg, tz_task *task, tz_comm *comm);
void tz_qzo_destroy(tz_qzo *q);
/* Step `step` (0-based) over the global batch: rank r's rows of micro-batch k are samples
 * ((step * accum + k) * N + r) * B ..., as in LoRA and full training; total: the loss terms
 * of the global batch, as the trainer counts them for the other modes. */
tz_qzo_stats tz_qzo_train_step(tz_qzo *q, int64_t step, double total);
/* The start-up lines: what trains and the memory per rank. */
void tz_qzo_print(const tz_qzo *q);

#endif
