/* ZeRO stages 0/1/2 at run time: the partition plan applied to one model's flat gradient
 * and weight buffers, the rank's host shard, the bucketed collectives (overlapped with
 * backward in stage 2) and the sharded optimizer step. The plan itself is train/zero_plan. */
#ifndef TZ_ZERO_H
#define TZ_ZERO_H
#include <stdint.h>

#include "core/backend.h"
#include "model/params.h"
#include "comm/fwd.h"
#include "optim/zero_plan.h"
#include "optim/optim.h"
#include "optim/zero_weights.h"

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
    tz_comm *comm;         /* host memory (MPI): the norm, the weights' all-gather */
    tz_comm *dcomm;        /* the gradients' comm: comm, or one on device memory (NCCL) */
    const tz_world *world;
    tz_params *ps;
    tz_zero_plan plan;     /* ownership: world = N (stages 1, 2) or 1 (stage 0) */
    float *grad;           /* backend: the flat gradient buffer the model writes */
    tz_shard sh;           /* host shard (NUMA-local): master, accumulator, decay, states */
    int64_t owned_params;  /* trainable parameters in this rank's slices (no gaps, no padding) */
    /* Stage-2 pipeline, per slot (buckets use the slots in turn). Where each buffer lives:
     *   host backend:           stage_buf (host) -> comm -> recv or the accumulator (host)
     *   device backend, MPI:    gradients (device) -> copy queue -> hstage (pinned host) ->
     *                           MPI -> recv or the accumulator (pinned host shard); on one
     *                           rank straight to recv or the accumulator (no hstage, no MPI)
     *   device backend, NCCL:   stage_buf (device) -> NCCL on the copy queue, in place ->
     *                           copy queue -> recv or the accumulator (pinned host shard) */
    float *stage_buf[TZ_ZERO_SLOTS], *recv[TZ_ZERO_SLOTS], *hstage[TZ_ZERO_SLOTS];
    tz_comm_req *req[TZ_ZERO_SLOTS];
    void *ev[TZ_ZERO_SLOTS];        /* the slot's copy on the copy queue (device backends) */
    float *slot_recv[TZ_ZERO_SLOTS]; /* where the slot's slice lands */
    int slot_state[TZ_ZERO_SLOTS];  /* TZ_ZERO_IDLE, _COPYING (to hstage), _COMM */
    int slot_bucket[TZ_ZERO_SLOTS];
    int next_slot;         /* the slot the next bucket takes: the oldest one in flight */
    float *host_tmp;       /* one padded bucket on the host (device downloads; pinned) */
    int pinned;            /* the shard's accumulator is registered (device) */
    int master_pinned;     /* the master is registered: dense weights are uploaded from it */
    void *wdone;           /* the last push's uploads from the master (copy queue), or NULL */
    /* Uploads in forward order (wstaged: one rank or stage 0, dense trainables only, a model
     * that asks for its weights stage by stage): bucket b's uploads from the master are
     * followed by the event wev[b] on the copy queue, the buckets from the last (the first
     * layers) down to 0 (then wdone = wev[0]); the compute queue waits for wev[b] when the
     * model first needs a weight in bucket b (tz_params_weights_needed), and from then on
     * for nothing in buckets >= wfloor. */
    int wstaged;
    void **wev;
    int wfloor;
    tz_zero_weights zw;    /* the weights' way back: pieces of every slice, packed */
    uint8_t *wsend, *wrecv; /* one packed slice; a bucket's packed slices (the all-gather) */
    int next_bucket;       /* first bucket not yet communicated in this micro-batch */
    int communicate;       /* this micro-batch's backward communicates (hook armed) */
    int pipelined;         /* stage 2 on more than one rank: staged, non-blocking */
    int fresh;             /* no gradient has reached the accumulator in this step yet */
    /* The optimizer on the backend (optim.offload = false, tz_zero_device_optimizer): the
     * masters, the optimizer's states and the decay flags in backend memory in the flat
     * layout of the gradients; the host shard then only holds what checkpoints read and
     * write (tz_zero_sync_host, tz_zero_host_loaded). */
    int dev;
    float *d_master, *d_state[TZ_OPTIM_MAX_STATES];
    uint8_t *d_decay;
    size_t d_bytes;        /* their backend bytes */
    tz_zero_clock clock[TZ_ZERO_PHASES]; /* summed over steps since init or reset */
    int64_t steps;
} tz_zero;

enum { TZ_ZERO_IDLE, TZ_ZERO_COPYING, TZ_ZERO_COMM };

/* Plans, allocates the shard with opt's states and copies this rank's slice of the current
 * weights into the master (a quantized weight's from its dense source, or decoded), and
 * binds the gradients. comm is a host-memory comm (MPI); the gradients go through it too.
 * Collective. */
void tz_zero_init(tz_zero *z, int stage, double bucket_mb, const tz_optim *opt, tz_params *ps,
                  tz_backend *be, tz_comm *comm, const tz_world *world);
/* The same with the gradients' comm given: dcomm == comm, or a comm on be's device memory
 * (dcomm->device, NCCL) of the same ranks. On a device backend the shard's master and
 * accumulator are pinned (host_register) and the staging buffers are pinned host memory. */
void tz_zero_init_comms(tz_zero *z, int stage, double bucket_mb, const tz_optim *opt,
                        tz_params *ps, tz_backend *be, tz_comm *comm, tz_comm *dcomm,
                        const tz_world *world);
void tz_zero_free(tz_zero *z);
/* Waits until no copy to the backend reads the host master any more (before the host
 * overwrites it, as a checkpoint's load does). */
void tz_zero_quiet(tz_zero *z);

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
/* The optimizer moves onto the backend (optim.offload = false): after tz_zero_init_comms,
 * on one rank, for AdamW, with no quantized trainable weight (fatal otherwise, naming the
 * setting). The masters start from the model's weights; gradients accumulate on the backend
 * across micro-batches and are never copied to the host; each step runs be->adamw and copies
 * the masters into the model. */
void tz_zero_device_optimizer(tz_zero *z);
/* With the optimizer on the backend: the masters and states into the host shard (before a
 * checkpoint reads it); nothing otherwise. */
void tz_zero_sync_host(tz_zero *z);
/* The host shard's masters (and states) were read from a checkpoint: onto the backend when
 * the optimizer is there, then into every rank's model (tz_zero_push_weights). Collective. */
void tz_zero_host_loaded(tz_zero *z);
/* Every rank prints its share: owned elements and host shard bytes. */
void tz_zero_print(const tz_zero *z);
/* Every rank prints its memory: the backend's bytes as its allocator counts them, split into
 * weights (quantized codes + scales, dense), gradients, stage-2 staging and `activations`
 * (the model's arena), with any remainder named "other"; and the host shard, with host_acts
 * bytes of activations kept in host memory where there are any (tz_task.host_act_bytes). */
void tz_zero_print_memory(const tz_zero *z, size_t activations, size_t host_acts);
/* Restart the phase clocks; every rank prints its phases' mean time and bytes/s per step. */
void tz_zero_clock_reset(tz_zero *z);
void tz_zero_clock_print(const tz_zero *z);

#endif
