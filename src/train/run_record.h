/* What a training run leaves about itself besides its outputs: wall-clock times for
 * metrics.jsonl, JSON numbers that are never bare nan, and run.dir/run.json (command line,
 * build, hosts, ranks, start and end). Computes nothing of the training. */
#ifndef TZ_RUN_RECORD_H
#define TZ_RUN_RECORD_H
#include <stddef.h>
#include <stdint.h>

#include "io/run_dir.h"
#include "mpi/fwd.h"

/* The wall-clock time now, ISO 8601 UTC with milliseconds: "2026-11-23T11:56:52.123Z". */
void tz_record_time_now(char *buf, size_t n);

/* `"key": v` with printf format fmt when v is finite; `"key": null, "key_nonfinite": "nan"`
 * (or "inf", "-inf") otherwise, so that every record stays valid JSON. */
void tz_record_json_number(char *buf, size_t n, const char *key, const char *fmt, double v);

/* The largest peak resident set size over the ranks, in MiB. Collective. */
double tz_record_peak_rss_mib(tz_comm *comm);

/* One run's identity, gathered once (collective: every rank's host name) at the start. */
typedef struct tz_run_record {
    char start[40];
    double t0;          /* monotonic seconds at start */
    int64_t ranks;
    char *hosts;        /* rank 0: the distinct host names in rank order, "\0"-separated */
    int64_t n_hosts;
} tz_run_record;

/* Starts the record (collective) and, on rank 0, writes dir/run.json with status "running". */
void tz_record_begin(tz_run_record *rec, const char *dir, const tz_world *w, tz_comm *comm);
/* Rank 0: rewrites dir/run.json with the end time, the wall time and status "finished".
 * Frees the record on every rank. */
void tz_record_end(tz_run_record *rec, const char *dir, tz_comm *comm);

/* Rank 0's hold on run.dir for one training run: the lock, and the staging folder where the
 * run writes its outputs until they are committed into run.dir together. */
typedef struct tz_run_out {
    tz_run_lock lock;
    char dir[1100];   /* run.dir */
    char stage[1100]; /* run.dir/staging: where this run writes */
} tz_run_out;

/* Locks dir (fatal, naming the holder, when another run has it), finishes or clears what a
 * previous run left in dir/staging, and opens an empty staging folder. A new run (resume 0)
 * is refused (fatal) when dir holds a finished run or checkpoints, unless overwrite; with
 * overwrite, earlier checkpoints are set aside in dir/checkpoints.replaced until the commit
 * (a failed run leaves them there). resume 1: neither is refused, and the metrics.jsonl of
 * the run that stopped is set aside for tz_run_out_resume_log. */
void tz_run_out_begin(tz_run_out *o, const char *dir, int overwrite, int resume);
/* Resuming: copies into f the records of the stopped run's metrics.jsonl (its staging copy,
 * else run.dir/metrics.jsonl) up to and including `step` (summaries left out); step < 0:
 * none (the run starts over). The set-aside copy is removed once copied. */
void tz_run_out_resume_log(tz_run_out *o, FILE *f, int64_t step);
void tz_run_out_commit(tz_run_out *o);

#endif
