/* What `turbozero bench` adds to a training step: presets (model shapes built in memory with
 * random weights and random data, so a Llama-2-7B-shaped model is timed without downloading
 * one), the dry run that plans a preset's memory without allocating it, and the phase clock
 * that splits a step into forward, backward, communication, copies and optimizer. The loop
 * itself is trainer.c's (tz_bench_run). */
#ifndef TZ_BENCH_H
#define TZ_BENCH_H
#include <stddef.h>
#include <stdint.h>

#include "core/backend.h"
#include "io/config.h"
#include "model/params.h"
#include "mpi/fwd.h"

/* model.path of a preset's configuration: "preset:NAME" (no folder is read). */
#define TZ_BENCH_PRESET_PREFIX "preset:"

typedef struct tz_bench_preset {
    const char *name;    /* --preset NAME */
    const char *arch;    /* model.arch: "llama" or "dit" */
    const char *about;   /* one line for --help and the log */
    int gpu_only;        /* too large for a CPU step: bench refuses it there (--dry-run plans it) */
    /* llama: vocab, dim, MLP hidden, layers, heads, kv heads, tied embeddings, positions;
     * dit: input side, patch, channels, hidden, depth, heads, classes */
    int64_t v[8];
    const char *sets[16]; /* the configuration it stands for, as --set arguments */
} tz_bench_preset;

/* The preset called name, or NULL. */
const tz_bench_preset *tz_bench_preset_find(const char *name);
/* The preset cfg stands for (model.path "preset:NAME"), or NULL for a model folder; fatal
 * for "preset:" with an unknown name. */
const tz_bench_preset *tz_bench_preset_of(const tz_config *cfg);
/* The presets' names as "a, b or c" into buf. */
const char *tz_bench_preset_list(char *buf, size_t n);
/* cfg from the preset's settings, then sets (the user's --set, applied after), as
 * tz_config_load with no file; source becomes "bench --preset NAME". Fatal on an unknown
 * preset. */
void tz_bench_preset_config(tz_config *cfg, const tz_config_names *names, const char *preset,
                            const char *const *sets, int nset);

/* Random base weights for a timing run, fast at any size: dense matrices uniform with
 * standard deviation 0.02, norms 1, and a quantized weight random codes with the scale
 * that gives its decoded values the same deviation (levels: the 2^bits code values of the
 * model's quantization, host memory). No quantizer runs. Adapters are left alone. */
void tz_bench_fill_params(tz_params *ps, tz_backend *be, const float *levels, uint64_t seed);
/* n random token ids below vocab (host memory, from seed). */
void tz_bench_random_tokens(uint32_t *tok, int64_t n, int64_t vocab, uint64_t seed);

/* A backend that only plans: alloc reserves address space (never touched, counted in
 * live/peak bytes), upload/download/copy/fill do nothing, every compute op is absent. Built
 * for --dry-run, through which a model is set up but never run. */
tz_backend *tz_bench_plan_backend(void);
int tz_bench_is_plan(const tz_backend *be);

/* bench --dry-run: the preset set up on the planning backend; rank 0 prints parameters,
 * the backend memory a rank would allocate (weights, gradients, staging, activations),
 * the host shard and the arithmetic of a step. */
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
