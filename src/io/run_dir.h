/* The life of an output folder: an exclusive lock on a run folder (who holds it, stale
 * holders named), a staging folder whose outputs are committed into the run folder together
 * (a commit record makes an interrupted commit complete on the next lock), a folder committed
 * as one unit (temporary name, fsync, rename), checked append-only logs, and the test hook
 * that makes the N-th checked write fail. No formats, no training logic. */
#ifndef TZ_RUN_DIR_H
#define TZ_RUN_DIR_H
#include <stdio.h>
#include <stddef.h>

#include "io/atomic_file.h" /* tz_write_fault, tz_write_fault_arm */

/* ---- lock ---------------------------------------------------------------------------- */
/* DIR/.lock, held with flock(LOCK_EX) for the life of the process (the kernel drops it when
 * the process ends, however it ends); the file names the holder (host, pid, start time) and
 * says "released" after a clean release. */
typedef struct tz_run_lock {
    int fd; /* -1 when not held */
    char path[1100];
} tz_run_lock;

/* Creates DIR (mkdir -p) and takes its lock. 0; or non-zero with err naming the holder
 * ("... is in use by pid P on host H since T"). note: "" or a line naming a previous holder
 * that ended without releasing the lock (crashed or killed), for the caller to print. */
int tz_run_lock_take(tz_run_lock *l, const char *dir, char *note, size_t note_n, char *err,
                     size_t n);
/* Marks the lock file released and drops the lock. Safe on a lock that is not held. */
void tz_run_lock_release(tz_run_lock *l);

/* ---- staging and commit of a run folder ---------------------------------------------- */
#define TZ_STAGE_NAME "staging" /* DIR/staging: the outputs of the run in progress */

/* What a run leaves in its folder, as the caller (the trainer: train/run_record.h) lists it:
 * its outputs in the order of the commit (the result first, the log that says a run is there
 * last), which are folders, which say a finished run is there (mark k > 0: looked for k-th),
 * and the one name a commit never replaces (the checkpoints). */
typedef struct tz_run_output {
    const char *name;
    int is_dir;
    int mark;
} tz_run_output;
typedef struct tz_run_outputs {
    const tz_run_output *o;
    int n;
    const char *keep;
} tz_run_outputs;

/* Whether DIR holds the outputs of a finished run (an output with a mark); 1 with the first
 * one found in what, else 0. */
int tz_run_dir_holds_run(const char *dir, const tz_run_outputs *outs, char *what, size_t n);
/* With the lock held: completes a commit that a previous process left half done, or removes
 * the staging folder of a run that did not finish (note says which, else ""), checks that no
 * output's name is taken by the wrong kind (a file where a folder goes), and creates an empty
 * DIR/staging (its path in stage). 0, or non-zero with err. */
int tz_run_stage_open(const char *dir, const tz_run_outputs *outs, char *stage, size_t stage_n,
                      char *note, size_t note_n, char *err, size_t n);
/* Moves everything in DIR/staging into DIR, replacing the outputs of a previous run (the
 * outputs it had that this one lacks are removed; DIR/<keep> and the lock are never touched,
 * nor is a staging/<keep> moved), then removes DIR/staging. A commit record written first
 * makes the moves complete on the next tz_run_stage_open if this process stops half-way. 0,
 * or non-zero with err. */
int tz_run_stage_commit(const char *dir, const tz_run_outputs *outs, char *err, size_t n);

/* ---- one folder as one unit ---------------------------------------------------------- */
/* Creates an empty folder FINAL.tmp.<random> beside final_dir; its path in out. 0 or
 * non-zero with err. */
int tz_dir_make_temp(const char *final_dir, char *out, size_t out_n, char *err, size_t n);
/* fsyncs tmp_dir and puts it under the name final_dir in one rename: an existing final_dir
 * is swapped out atomically (renameat2 RENAME_EXCHANGE; where the file system lacks it, it
 * is renamed aside first, a window of two renames) and then removed. Readers see the old
 * folder or the new one, whole. On failure final_dir is as it was and tmp_dir is removed. */
int tz_dir_commit(const char *tmp_dir, const char *final_dir, char *err, size_t n);
/* rm -rf without following links; 0 (also when path does not exist) or non-zero with err. */
int tz_rm_rf(const char *path, char *err, size_t n);

/* ---- checked append-only log --------------------------------------------------------- */
/* Lines are written with fprintf to f and made durable with tz_line_log_flush; a flush that
 * fails cuts the file back to its last complete line, so the log never ends mid-line. */
typedef struct tz_line_log {
    FILE *f;
    char path[1100];
    long long good; /* bytes known written in full */
} tz_line_log;

int tz_line_log_open(tz_line_log *l, const char *path, char *err, size_t n);
/* Writes out what fprintf buffered; 0, or non-zero with "PATH: write failed: REASON". */
int tz_line_log_flush(tz_line_log *l, char *err, size_t n);
/* Flushes, fsyncs and closes; 0 or non-zero with err. The log is closed either way. */
int tz_line_log_close(tz_line_log *l, char *err, size_t n);

/* ---- test hooks (and tz_write_fault, io/atomic_file.h) ------------------------------ */
/* Unit tests: off = 1 commits folders as on a file system without an atomic exchange. */
void tz_dir_exchange_off(int off);

#endif
