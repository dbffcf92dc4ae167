/* What checkpoint.c (writing) and checkpoint_resume.c (reading) share: the format's name,
 * the layout of the shards (tensors, buckets, pieces) and small folder and message helpers.
 * Internal to src/train. */
#ifndef TZ_CHECKPOINT_UTIL_H
#define TZ_CHECKPOINT_UTIL_H
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "io/config.h"
#include "model/params.h"
#include "comm/comm.h"
#include "optim/zero_plan.h"

#define TZ_CKPT_FORMAT "turbozero-checkpoint"
#define TZ_CKPT_VERSION 1
#define TZ_CKPT_MSG 480   /* one rank's error message, gathered by every rank */
#define TZ_CKPT_PATH 1200 /* a path inside a checkpoint folder */

typedef struct tz_ckpt_tensor {
    char name[TZ_NAME_MAX];
    int ndim;
    int64_t shape[2], numel, flat_off;
    int bits; /* stored quantized in the model (full fine-tuning of a quantized base); 0 dense */
} tz_ckpt_tensor;

typedef struct tz_ckpt_bucket {
    int64_t start, len, slice, shard_off;
} tz_ckpt_bucket;

/* Elements [lo, lo + n) of tensor t, in rank's slice at shard offset `shard`, stored at
 * `pos` of the tensor's dataset in the rank's file. */
typedef struct tz_ckpt_piece {
    int t, rank;
    int64_t lo, n, shard, pos;
} tz_ckpt_piece;

/* The trainable tensors of ps in flat order; *nt of them. */
tz_ckpt_tensor *tz_ckpt_tensors(const tz_params *ps, int *nt);
/* The buckets of a plan (start, len, slice, shard offset). */
tz_ckpt_bucket *tz_ckpt_buckets(const tz_zero_plan *p);
/* The pieces of rank's slices (buckets in order; in each, the tensors it touches), with
 * their positions in the rank's per-tensor datasets; *count per tensor (nt entries) when
 * count is not NULL. Returns the number of pieces (*out: free it). */
int64_t tz_ckpt_pieces(const tz_ckpt_bucket *b, int nb, int rank, const tz_ckpt_tensor *t, int nt,
                       tz_ckpt_piece **out, int64_t *count);

/* The effective configuration as config.used.cfg holds it (free it). */
char *tz_ckpt_config_text(const tz_config *cfg);
/* A path from a format; fatal when it does not fit. */
void tz_ckpt_pathf(char *out, size_t n, const char *fmt, ...) TZ_PRINTF(3, 4);
/* A whole text file (free it), or NULL with a message. */

/* The COMPLETE marker's text for checkpoint.json (len bytes) of step: "step N\n" and
 * "checkpoint.json BYTES CRC32\n". */
void tz_ckpt_marker_text(char *out, size_t n, int64_t step, const char *json, size_t len);
/* Checks checkpoint.json's text in itself (the fields, their ranges, the ZeRO plan
 * re-derived from its inputs, the tensor table, the shards); folder_step >= 0: its step is
 * the folder's. 0, or non-zero with a message. No file is read. */
int tz_ckpt_meta_check(const char *text, int64_t folder_step, char *err, size_t n);

/* "step-<digits>" -> the number, else -1. */
int64_t tz_ckpt_step_of_name(const char *name);
/* The steps of the step-<N> folders in dir, newest first (complete or not); NULL and 0
 * when dir cannot be read. */
int64_t *tz_ckpt_list_steps(const char *dir, int *n);
/* Every rank's message ("" when fine) gathered on every rank: a [size][TZ_CKPT_MSG] array
 * and the number of ranks that failed. Collective. */
char *tz_ckpt_gather_msgs(tz_comm *comm, const char *mine, int *failed);
/* Every rank says what failed (each failing rank's message, then `what`), and stops. */
TZ_NORETURN void tz_ckpt_fail_all(tz_comm *comm, const char *msgs, const char *what);

/* Test hook: TZ_CKPT_FAULT="rank=R,at=POINT,step=S,do=ACTION" makes rank R, at POINT of
 * the checkpoint of step S (0: any), either die (kill: SIGKILL), pause (pause: sleep up to
 * 1 h, ended by a signal; hold: 1 h whatever comes) or fail as a full disk would (fail:
 * "shard" and "meta"). POINT: "step" (after the
 * step, before any checkpoint), "begin", "shard" (shard written), "meta" (rank 0, before
 * the marker), "rename" (rank 0, before the rename); or a start-up stage, its step the one
 * the run starts from: "load" (the model loaded), "resume" (the checkpoint read, or none
 * found), "start" (before the first step); "aside" (rank 0, step 0: a new run with
 * run.overwrite about to set the earlier run's checkpoints aside). Returns 1 for a simulated
 * failure. */
int tz_ckpt_fault(const char *point, int64_t step, int rank);

#endif
