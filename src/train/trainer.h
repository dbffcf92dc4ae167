/* The drivers behind `turbozero train`, `eval` and `bench`: one process or N MPI ranks
 * (data parallel with ZeRO stage 0/1/2). The config is already identical on every rank. */
#ifndef TZ_TRAINER_H
#define TZ_TRAINER_H
#include "io/config.h"
#include "comm/fwd.h"

/* Train as configured; rank 0 writes run.dir (config.used.cfg, metrics.jsonl, the trained
 * weights). Returns 0; every error is fatal with its place. Collective. */
int tz_train_run(const tz_config *cfg, tz_world *world, tz_comm *comm);
/* The same, continuing from a checkpoint when resume is not NULL ("": the newest complete
 * one under run.dir/checkpoints; else a checkpoint folder, or a folder of them). Returns 0,
 * or TZ_EXIT_REQUEUE (train/checkpoint.h) when SIGUSR1/SIGTERM/SIGINT stopped it after a
 * checkpoint. Collective. */
int tz_train_run_from(const tz_config *cfg, tz_world *world, tz_comm *comm, const char *resume);
/* export CHECKPOINT: the checkpoint folder's fp32 masters (read through its saved plan into
 * the model cfg describes: the checkpoint's own configuration) saved to out as training
 * saves them: a LoRA adapter folder, or a model folder for train.mode = "full". Collective. */
int tz_ckpt_export_run(const tz_config *cfg, tz_world *world, tz_comm *comm, const char *folder,
                       const char *out);
/* Mean next-token loss over data.val (windows spread over the ranks); last line printed:
 * eval_loss=<float> tokens=<int>. Collective. */
int tz_eval_run(const tz_config *cfg, tz_world *world, tz_comm *comm);
/* train.steps training steps without evaluation or output files; prints timing and memory
 * (the figures of docs/benchmarks.md). Collective. */
int tz_bench_run(const tz_config *cfg, tz_world *world, tz_comm *comm);
/* bench --no-split (on = 0): on a device, no extra synchronised steps for the step split
 * (nor its line); on the host the split costs nothing and stays. */
void tz_bench_set_split(int on);

#endif
