/* The drivers behind `turbozero train`, `eval` and `bench`: one process or N MPI ranks
 * (data parallel with ZeRO stage 0/1/2). The config is already identical on every rank. */
#ifndef TZ_TRAINER_H
#define TZ_TRAINER_H
#include "io/config.h"
#include "mpi/fwd.h"

/* Train as configured; rank 0 writes run.dir (config.used.cfg, metrics.jsonl, the trained
 * weights). Returns 0; every error is fatal with its place. Collective. */
int tz_train_run(const tz_config *cfg, tz_world *world, tz_comm *comm);
/* Mean next-token loss over data.val (windows spread over the ranks); last line printed:
 * eval_loss=<float> tokens=<int>. Collective. */
int tz_eval_run(const tz_config *cfg, tz_world *world, tz_comm *comm);
/* train.steps training steps without evaluation or output files; prints timing and memory
 * (the figures of docs/benchmarks.md). Collective. */
int tz_bench_run(const tz_config *cfg, tz_world *world, tz_comm *comm);

#endif
