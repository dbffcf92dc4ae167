/* ZeRO stages 0/1/2 at run time: the partition plan applied to one model's flat gradient
 * and weight buffers, the rank's host shard, the bucketed collectives (overlapped with
 * backward in stage 2) and the sharded optimizer step. The plan itself is mpi/zero_plan. */
#ifndef TZ_ZERO_H
#define TZ_ZERO_H
#include <stdint.h>

#include "core/backend.h"
#include "model/params.h"
#include "mpi/fwd.h"
#include "mpi/zero_plan.h"
#include "train/optim.h"
#include "train/zero_weights.h"

#define TZ_ZERO_SLOTS 2 /* buckets in flight at once in stage 2 */

/* Phases of the host side of a step, timed (and their bytes counted, read + written as
 * STREAM counts them) by every rank: gradients into the accumulator (and, on a
 * host-addressable backend, into the stage-2 staging buffers), the sum of squares, the
 * optimizer, packing the updated slice (fp32 copies, and the re-quantization of quantized
 * weights from the master), the all-gather of the packed slices, the copies of the weights
 * (or codes and scales) into the model. */
enum { TZ_ZERO_GRADS, TZ_ZERO_NORM, TZ_ZERO_UPDATE, TZ_ZERO_PACK, TZ_ZERO_GATHER,
       TZ_ZERO_WEIGHTS, TZ_ZERO_PHASES };
extern const char *const tz_zero_phase_names[TZ_ZERO_PHASES];
typedef struct tz_zero_clock {
    double seconds, bytes;
} tz_zero_clock;

typedef struct tz_zero {
    int stage;             /* 0: all-reduce, replicated optimizer; 1: all-reduce, sharded
                            * optimizer; 2: reduce-scatter, sharded optimizer */
    tz_backend *be;
    tz_comm *comm;
    const tz_world *world;
    tz_params *ps;
    tz_zero_plan plan;     /* ownership: world = N (stages 1, 2) or 1 (stage 0) */
    float *grad;           /* backend: the flat gradient buffer the model writes */
    tz_shard sh;           /* host shard (NUMA-local): master, accumulator, decay, states */
    int64_t owned_params;  /* trainable parameters in this rank's slices (no gaps, no padding) */
    /* stage-2 pipeline: staging buffers (backend) and receive slices (host) per slot */
    float *stage_buf[TZ_ZERO_SLOTS], *recv[TZ_ZERO_SLOTS];
    tz_comm_req *req[TZ_ZERO_SLOTS];
    int slot_bucket[TZ_ZERO_SLOTS];
    int next_slot;
    float *host_tmp;       /* one padded bucket on the host (device downloads) */
    tz_zero_weights zw;    /* the weights' way back: pieces of every slice, packed */
    uint8_t *wsend, *wrecv; /* one packed slice; a bucket's packed slices (the all-gather) */
    int next_bucket;       /* first bucket not yet communicated in this micro-batch */
    int communicate;       /* this micro-batch's backward communicates (hook armed) */
    int pipelined;         /* stage 2 on more than one rank: staged, non-blocking */
    int fresh;             /* no gradient has reached the accumulator in this step yet */
    tz_zero_clock clock[TZ_ZERO_PHASES]; /* summed over steps since init or reset */
    int64_t steps;
} tz_zero;

/* Plans, allocates the shard with opt's states and copies this rank's slice of the current
 * weights into the master (a quantized weight's from its dense source, or decoded), and
 * binds the gradients. Collective. */
void tz_zero_init(tz_zero *z, int stage, double bucket_mb, const tz_optim *opt, tz_params *ps,
                  tz_backend *be, tz_comm *comm, const tz_world *world);
void tz_zero_free(tz_zero *z);

/* Before each optimizer step: zero the gradient buffer; the step's first gradients will
 * overwrite the host accumulator. */
void tz_zero_begin_step(tz_zero *z);
/* Before each micro-batch's backward; last: the step's final micro-batch. */
void tz_zero_begin_micro(tz_zero *z, int last);
/* The model's gradient hook: every gradient below ready_flat is final; communicate the
 * buckets it completes (stage 2 every micro-batch, stages 0/1 on the last). */
void tz_zero_grads_ready(void *z, int64_t ready_flat);
/* After a micro-batch's backward: finish its communication. */
void tz_zero_end_micro(tz_zero *z);
/* Global gradient norm (before clipping), clip to max_norm (0: off), the optimizer on the
 * shard, all-gather the updated weights into every rank's model. t is the 1-based step. */
double tz_zero_step(tz_zero *z, const tz_optim_hparams *h, int64_t t, double max_norm);
/* The masters into every rank's model (what the end of tz_zero_step does): each owner packs
 * its slices (fp32, or codes + scales re-quantized), all-gathered in stages 1 and 2. After
 * a checkpoint's shards were read into the masters. Collective. */
void tz_zero_push_weights(tz_zero *z);
/* Every rank prints its share: owned elements and host shard bytes. */
void tz_zero_print(const tz_zero *z);
/* Every rank prints its memory: the backend's bytes as its allocator counts them, split into
 * weights (quantized codes + scales, dense), gradients, stage-2 staging and `activations`
 * (the model's arena), with any remainder named "other"; and the host shard. */
void tz_zero_print_memory(const tz_zero *z, size_t activations);
/* Restart the phase clocks; every rank prints its phases' mean time and bytes/s per step. */
void tz_zero_clock_reset(tz_zero *z);
void tz_zero_clock_print(const tz_zero *z);

#endif
