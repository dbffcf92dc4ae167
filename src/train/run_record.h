/* What a training run leaves about itself besides its outputs: wall-clock times for
 * metrics.jsonl, JSON numbers that are never bare nan, and run.dir/run.json (command line,
 * build, backend and device, hosts, ranks, Slurm job, and a segment per start or resume).
 * Computes nothing of the training. */
#ifndef TZ_RUN_RECORD_H
#define TZ_RUN_RECORD_H
#include <stddef.h>
#include <stdint.h>

#include "io/loss_plot.h"
#include "io/run_dir.h"
#include "comm/fwd.h"

/* What a training run leaves in run.dir, in the order its staging folder is committed: the
 * adapter/ or model/, loss.png, config.used.cfg, run.json, metrics.jsonl, and where an
 * earlier run's checkpoints are set aside (removed with the commit); run.dir/checkpoints
 * itself is never replaced. metrics.jsonl, run.json, adapter/ and model/ say a run is there.
 * io/run_dir.c's staging and commit take it. */
extern const tz_run_outputs tz_train_outputs;
/* The log of a run, one JSON record per line: its file in run.dir and the keys the loss
 * curves are drawn from (io/loss_plot.h): "step", "loss", "eval_loss". */
#define TZ_METRICS_FILE "metrics.jsonl"
extern const tz_loss_plot_keys tz_metrics_keys;

struct tz_run_out;

/* The wall-clock time now, ISO 8601 UTC with milliseconds: "2026-11-23T11:56:52.123Z". */
void tz_record_time_now(char *buf, size_t n);

/* `"key": v` with printf format fmt when v is finite; `"key": null, "key_nonfinite": "nan"`
 * (or "inf", "-inf") otherwise, so that every record stays valid JSON. */
void tz_record_json_number(char *buf, size_t n, const char *key, const char *fmt, double v);

/* The largest peak resident set size over the ranks, in MiB. Collective. */
double tz_record_peak_rss_mib(tz_comm *comm);

/* A run's identity: 32 hex digits, drawn when a new run starts in a run.dir and kept by its
 * resumes; recorded in run.dir/.run, in run.json and in every checkpoint it writes. */
#define TZ_RUN_ID_MAX 33

/* One run's record, run.json: the build, the command, the backend and device it ran on, its
 * ranks and hosts, the Slurm job (id, array index, restart count), and one segment per start
 * of the run (the first, then every resume): start, end, status, steps from and to, ranks. */
typedef struct tz_run_record {
    char start[40];
    char run_id[TZ_RUN_ID_MAX]; /* rank 0: written into run.json ("" leaves it out) */
    double t0;          /* monotonic seconds at start */
    int64_t ranks;
    char *hosts;        /* rank 0: the distinct host names in rank order, "\0"-separated */
    int64_t n_hosts;
    char backend[32];   /* the backend the run computes on ("cpu", "cuda"; "" before known) */
    char device[256];   /* its device's name (a GPU's, or the host CPU's) */
    int64_t steps_from, steps_to; /* this segment's first and last step (steps_to -1: running) */
    char *prior;        /* rank 0: the earlier segments of this run (a JSON array), or NULL */
} tz_run_record;

/* Starts the record (collective) and, on rank 0, writes dir/run.json with status "running"
 * (and run_id, rank 0's, unless ""). */
void tz_record_begin(tz_run_record *rec, const char *dir, const char *run_id, const tz_world *w,
                     tz_comm *comm);
/* Rank 0: the backend (its name) and device the run computes on, then run.json rewritten. */
void tz_record_device(tz_run_record *rec, const char *dir, const char *backend,
                      const char *device);
/* Rank 0, resuming: this segment starts at step steps_from, after the segments of the
 * previous run.json that tz_run_out_begin kept (o->prior; those of another run id are
 * dropped, and a last segment still "running" was killed: it becomes "interrupted"); the run
 * id is rec->run_id. run.json is rewritten. */
void tz_record_resumed(tz_run_record *rec, const char *dir, struct tz_run_out *o,
                       int64_t steps_from);
/* Rank 0: the run stopped after step `step` to be resumed (status "stopped", the end time). */
void tz_record_stop(tz_run_record *rec, const char *dir, int64_t step, tz_comm *comm);
/* Rank 0: rewrites dir/run.json with the end time, the wall time, steps_to = step and status
 * "finished". Frees the record on every rank. */
void tz_record_end(tz_run_record *rec, const char *dir, int64_t step, tz_comm *comm);

/* Rank 0's hold on run.dir for one training run: the lock, and the staging folder where the
 * run writes its outputs until they are committed into run.dir together. */
typedef struct tz_run_out {
    tz_run_lock lock;
    char *prior;      /* resuming: the run.json the stopped run left (staging/ or run.dir/),
                       * for tz_record_resumed, which takes it; NULL when there is none */
    char dir[1100];   /* run.dir */
    char stage[1100]; /* run.dir/staging: where this run writes */
    char run_id[TZ_RUN_ID_MAX]; /* this run's identity (run.dir/.run); "" when a resume
                                 * finds a run.dir of an earlier version without one */
} tz_run_out;

/* Locks dir (fatal, naming the holder, when another run has it), finishes or clears what a
 * previous run left in dir/staging, and opens an empty staging folder. A dir that exists and
 * is not a run folder (it holds folders or many files of its own) is refused before
 * anything is written into it. A new run (resume 0) is refused (fatal) when dir holds a
 * finished run or checkpoints, unless overwrite; it draws a new run id (run.dir/.run, written
 * first, so that a requeued --resume of a run stopped at any later moment never continues
 * the run it replaces) and, with overwrite, sets the earlier checkpoints aside in
 * dir/checkpoints.replaced until the commit (a failed run leaves them there). resume 1: a
 * dir holding a finished run is refused unless overwrite (there is nothing to resume);
 * otherwise the run keeps its id and the metrics.jsonl of the run that stopped is set aside
 * for tz_run_out_resume_log. */
void tz_run_out_begin(tz_run_out *o, const char *dir, int overwrite, int resume);
/* After a resume (rank 0): the timeline continues from checkpoint `folder` (its step, its
 * run id ckpt_id, "" when it has none), or from step 0 when folder is NULL. Every checkpoint
 * in dir/checkpoints that is not part of that timeline (a newer step, another run's id) is
 * set aside in dir/checkpoints.replaced, removed at the commit, so that a later plain
 * --resume cannot take it; the run's id becomes the checkpoint's and is recorded. */
void tz_run_out_resumed(tz_run_out *o, const char *folder, int64_t step, const char *ckpt_id);
/* Resuming: copies into l the records of the stopped run's metrics.jsonl (its set-aside
 * copy, else run.dir/metrics.jsonl) up to and including `step` (summaries left out); step < 0:
 * none (the run starts over). The copy is made durable (flushed, fsynced) before the
 * set-aside file is removed, so a run that fails right after loses no record. */
void tz_run_out_resume_log(tz_run_out *o, tz_line_log *l, int64_t step);
void tz_run_out_commit(tz_run_out *o);

#endif
