/* Training checkpoints: run.dir/checkpoints/step-<N>/ with one HDF5 shard per owning rank
 * (fp32 master and optimizer states of its slices, datasets named after the tensors), the
 * shared checkpoint.json (step, data position, seed, ZeRO plan, tensor table, config, shard
 * sizes and CRC-32s) and a COMPLETE marker written last; written into a temporary folder and
 * renamed. Resume at the same or another rank count (shards re-cut through the saved plan),
 * the preemption signals, and the loop state a checkpoint carries. Not the loop itself. */
#ifndef TZ_CHECKPOINT_H
#define TZ_CHECKPOINT_H
#include <stdint.h>
#include <stdio.h>

#include "io/config.h"
#include "comm/comm.h"
#include "train/run_record.h"
#include "optim/zero.h"

/* Exit status of a run stopped by SIGUSR1, SIGTERM or SIGINT after writing a checkpoint:
 * EX_TEMPFAIL, "try again"; slurm/train.sbatch requeues the job on it. */
#define TZ_EXIT_REQUEUE 75

/* What the loop carries across a checkpoint besides the shards. */
typedef struct tz_ckpt_state {
    int64_t step;        /* optimizer steps done */
    int64_t global_batch; /* rows per step: ranks x micro_batch x grad_accum */
    int have_eval;       /* the evaluation figures below are set */
    double eval0, best;  /* eval loss before training; best so far */
    int64_t eval0_count, best_count, best_step;
    char run_id[TZ_RUN_ID_MAX]; /* the run the checkpoint belongs to ("" in older ones) */
    char folder[1200];          /* resume: the checkpoint folder read */
} tz_ckpt_state;

/* SIGUSR1, SIGTERM, SIGINT: ask the run to stop at the end of the step, or before the first
 * one when they come during start-up (a second SIGINT stops at once). Installed by `train`
 * before anything slow. */
void tz_ckpt_signals_install(void);
/* The default actions back (a run that saves nothing: qzo); a signal that came since the
 * last tz_ckpt_stop_* takes its default action now. */
void tz_ckpt_signals_default(void);
/* Whether any rank was asked to stop (an all-reduce: every rank gets the same answer).
 * Collective. */
int tz_ckpt_stop_agreed(tz_comm *comm);
/* The same at the end of start-up stage `stage` ("load", "resume", "start": before the first
 * step), after the test hook's point of that name (step: the step the run starts from):
 * the run then stops having written nothing new. Collective. */
int tz_ckpt_stop_at_start(tz_comm *comm, const char *stage, int64_t step);

/* Writes checkpoint step-<st->step> of z's shards; keeps the newest `keep` complete
 * checkpoints (0: all). Any rank's failure is fatal on every rank with its message; earlier
 * checkpoints are never touched but by the pruning after success. Collective. */
void tz_ckpt_write(const tz_config *cfg, tz_zero *z, const tz_ckpt_state *st, int64_t keep);

/* Loads the newest complete, valid and undamaged checkpoint: path "" searches
 * run.dir/checkpoints (falling back past refused ones, saying so, and passing over those of
 * another run than run_id, when run_id is not ""), else path is one checkpoint folder
 * (refused when damaged) or a folder of them. A checkpoint is accepted when its COMPLETE
 * marker holds checkpoint.json's size and CRC-32, checkpoint.json is consistent in itself
 * (step, data position, ZeRO plan re-derived, tensor table, shards), and every shard has
 * its recorded size and CRC-32; the checkpoint is then checked against this run (tensors,
 * optimizer, global batch, train.steps: fatal, the same for every checkpoint of the run),
 * and every rank's owned slices are read through the saved plan (a failed read falls back
 * too). Then pushes the masters into the model. Returns 1 with *st set (st->folder the
 * checkpoint read), or 0 when no checkpoint of this run exists. run_id: rank 0's. Collective. */
int tz_ckpt_resume(const tz_config *cfg, tz_zero *z, const char *path, const char *run_id,
                   int64_t global_batch, tz_ckpt_state *st);

/* Reads the one checkpoint folder `folder` (checked as tz_ckpt_resume checks it, refused
 * when damaged; a symbolic link such as run.dir/checkpoints/best is followed) into z
 * through its saved plan, at any rank count, and pushes the masters into the model: what
 * `export CHECKPOINT` and train.keep_best save. The global batch, train.steps and the other
 * settings are not compared. Fatal when it cannot. Collective. */
void tz_ckpt_load(const tz_config *cfg, tz_zero *z, const char *folder, tz_ckpt_state *st);
/* Rank 0: the effective configuration text checkpoint `folder` was written with (free it)
 * and its step, after the marker and checkpoint.json are checked; NULL with a message. */
char *tz_ckpt_config_read(const char *folder, int64_t *step, char *err, size_t n);



#endif
