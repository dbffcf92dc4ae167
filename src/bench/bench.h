/* What `turbozero bench` adds to a training step: presets (model shapes built in memory with
 * random weights and random data, so a Llama-2-7B-shaped model is timed without downloading
 * one), the memory plan and dry run of any configuration (nothing allocated), and the phase clock
 * that splits a step into forward, backward, communication, copies and optimizer. The loop
 * itself is trainer.c's (tz_bench_run). */
#ifndef TZ_BENCH_H
#define TZ_BENCH_H
#include <stddef.h>
#include <stdint.h>

#include "core/backend.h"
#include "io/config.h"
#include "model/params.h"
#include "comm/fwd.h"

/* A preset: a named shape of a family (model.path "preset:NAME", model/model_base.h: the
 * family builds it with random weights and random data) and the recipe timed on it. */
typedef struct tz_bench_preset {
    const char *name;    /* --preset NAME: the family's shape of that name */
    const char *arch;    /* model.arch: "llama" or "dit" */
    const char *about;   /* one line for --help and the log */
    int gpu_only;        /* too large for a CPU step: bench refuses it there (--dry-run plans it) */
    const char *sets[16]; /* the configuration it stands for, as --set arguments */
} tz_bench_preset;

/* The preset called name, or NULL. */
const tz_bench_preset *tz_bench_preset_find(const char *name);
/* The bench preset cfg stands for (model.path "preset:NAME" with a preset's NAME), or NULL
 * (a model folder, or another shape of a family). */
const tz_bench_preset *tz_bench_preset_of(const tz_config *cfg);
/* The presets' names as "a, b or c" into buf. */
const char *tz_bench_preset_list(char *buf, size_t n);
/* cfg from the preset's settings, then sets (the user's --set, applied after), as
 * tz_config_load with no file; source becomes "bench --preset NAME". Fatal on an unknown
 * preset. */
void tz_bench_preset_config(tz_config *cfg, const tz_config_names *names, const char *preset,
                            const char *const *sets, int nset);

/* A backend that only plans: alloc reserves address space (never touched, counted in
 * live/peak bytes), upload/download/copy/fill do nothing, every compute op is absent. Built
 * for --dry-run, through which a model is set up but never run. */
tz_backend *tz_bench_plan_backend(void);
int tz_bench_is_plan(const tz_backend *be);

/* What one rank of a run allocates, planned on the planning backend without allocating it
 * (tz_bench_plan_memory). */
typedef struct tz_mem_plan {
    size_t backend;       /* the backend's bytes: its allocator's peak while the model is set
                           * up (weights, activations, other) + gradients + staging
                           * + optimizer */
    size_t weights, quant, grads, staging, arena;
    size_t optim;         /* optim.offload = false: the optimizer's masters, states and decay
                           * flags on the backend (flat layout, 13 bytes an element) */
    double other;         /* the rest of the allocator's peak (scratch, tables); may be < 0 */
    size_t shard;         /* host: the ZeRO shard (fp32 master, accumulator, decay flags, the
                           * optimizer's states) and the step's host buffers, or qzo's fp32
                           * scales and their staging */
    size_t dense_src;     /* host, full mode of a quantized base: the dense weights the
                           * master starts from, held until the shard has read them */
    size_t load;          /* host, loading a folder: one weight as fp32 */
    size_t host_codes;    /* host, pinned: the codes of streamed blocks (quant.offload_blocks) */
    size_t host_acts;     /* host, pinned: activations kept there (tz_task.host_act_bytes) */
    size_t host;          /* the host's peak of these: max(load, dense_src + shard) + host_codes
                           * + host_acts */
    int64_t n_total, n_trainable, shard_numel;
    int shapes_only;      /* a model folder planned from its config.json alone */
    int training;         /* planned for training (else evaluation: forward passes only) */
    int gpu;              /* planned with a GPU's GEMM operands: the backend's bytes are the
                           * GPU's (else host RAM, as the CPU backend's are) */
} tz_mem_plan;

/* Plans one rank of cfg on N ranks (training, or evaluation when training is 0) with GEMM
 * operand types matmul_dtypes (a backend's field): a preset as it is; a Llama folder from
 * its config.json (and the quantization its safetensors header names), no weight read; any
 * other folder by loading it onto the planning backend when read_weights, else 1 is
 * returned and nothing planned. 0 when *out is filled. Not collective. */
int tz_bench_plan_memory(const tz_config *cfg, int64_t N, unsigned matmul_dtypes, int training,
                         int read_weights, tz_mem_plan *out);

/* What this machine can give one rank. */
typedef struct tz_mem_room {
    size_t host_avail;    /* the node's available memory (tz_world_host_available) */
    char host_src[160];   /* where that figure comes from */
    int host_ranks;       /* ranks on this node, sharing it */
    size_t dev_free, dev_total; /* the rank's GPU (device_info); 0 without one */
    int dev_ranks;        /* ranks on this node that share that GPU */
} tz_mem_room;
/* The room of w's rank: the host, and be's device when be is a device backend (NULL: none). */
void tz_mem_room_of(tz_mem_room *r, tz_backend *be, const tz_world *w);
/* Plan m against room: the GPU's share for the backend's bytes (when m->gpu and a GPU is
 * there), the host's share (MemAvailable / ranks on the node) for the host memory, and on the
 * CPU for both. line: the figures; hint: what to change, the largest part first. Returns 0
 * when it fits, 1 above 90%, 2 when it does not fit. */
int tz_mem_plan_check(const tz_mem_plan *m, const tz_config *cfg, const tz_mem_room *room,
                      char *line, size_t n, char *hint, size_t hn);

/* bench --dry-run and train --dry-run: the configuration (a preset, or any model folder) set
 * up on the planning backend; rank 0 prints parameters, the backend memory a rank would
 * allocate (weights, gradients, staging, activations), the host memory, whether this
 * machine holds it, and the arithmetic of a step. */
int tz_bench_dry_run(const tz_config *cfg, tz_world *w, tz_comm *comm);

/* ---- the phase clock ---- */

enum { TZ_PH_FORWARD, TZ_PH_BACKWARD, TZ_PH_COMM, TZ_PH_COPY, TZ_PH_OPTIM, TZ_PH_OTHER,
       TZ_PH_N };
extern const char *const tz_bench_phase_names[TZ_PH_N];

/* Time charged to the innermost phase open: a step switches its top phase (forward, copies,
 * optimizer, ...), and the wrapped collectives, backend copies and gradient hook open nested
 * ones, so each second counts once. On a device every boundary synchronises the backend
 * (be->sync) first, which serialises copies and communication with compute: the split is a
 * bench-only measurement. */
typedef struct tz_bench_clock {
    int on;                      /* 0: every call is a no-op (and nothing synchronises) */
    tz_backend *be;
    double sec[TZ_PH_N];         /* summed over the steps measured */
    int64_t steps;
    int stack[16], depth;        /* stack[depth - 1] is charged */
    double mark;                 /* time of the last boundary */
} tz_bench_clock;

/* The step's top phase becomes ph (closing any nested ones). */
void tz_bench_phase(tz_bench_clock *c, int ph);
void tz_bench_push(tz_bench_clock *c, int ph);
void tz_bench_pop(tz_bench_clock *c);
/* Start / end of a measured step (charges the rest to the phase open, counts the step). */
void tz_bench_step_begin(tz_bench_clock *c);
void tz_bench_step_end(tz_bench_clock *c);
/* A table like inner whose collectives count as communication on c (the same rank, size
 * and context; destroy frees the wrapper only). */
tz_comm *tz_bench_comm_wrap(tz_comm *inner, tz_bench_clock *c);
void tz_bench_comm_unwrap(tz_comm *wrapper);
/* be's upload, download and copy count as copies on c (be's table is changed in place). */
void tz_bench_backend_wrap(tz_backend *be, tz_bench_clock *c);
/* The model's backward hook: forward ends, backward begins. ctx: the clock. */
void tz_bench_backward_begins(void *ctx);

#endif
