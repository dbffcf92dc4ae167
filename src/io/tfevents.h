/* TensorBoard event files: a record file of length-prefixed Event protocol buffers, each
 * record framed with masked CRC-32C checksums, holding scalar summaries. The few protobuf
 * bytes are written by hand. Writes a format; knows nothing of training. */
#ifndef TZ_TFEVENTS_H
#define TZ_TFEVENTS_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* CRC-32C (Castagnoli) of n bytes, and TensorBoard's mask of it. */
uint32_t tz_crc32c(const void *data, size_t n);
uint32_t tz_crc32c_mask(uint32_t crc);

typedef struct tz_tfevents {
    FILE *f;
    char path[1200];
} tz_tfevents;

/* Creates dir (mkdir -p) and dir/events.out.tfevents.<seconds>.<host> with its first record
 * (file_version "brain.Event:2"). 0, or non-zero with err. */
int tz_tfevents_open(tz_tfevents *w, const char *dir, char *err, size_t n);
/* One Event record: a scalar summary tag = value at step, wall time in seconds since the
 * epoch. Buffered; tz_tfevents_flush writes it out. */
void tz_tfevents_scalar(tz_tfevents *w, double wall_time, int64_t step, const char *tag,
                        float value);
/* Each number of a metrics.jsonl record (one JSON object on a line, with "step" and an ISO
 * 8601 UTC "time") as a scalar at that step: "eval_KEY" under the tag "eval/KEY", any other
 * key under "train/KEY"; "step", "time", null values and a "summary" record are skipped.
 * Returns the scalars written (0 for a line that is not such a record). */
int tz_tfevents_json_line(tz_tfevents *w, const char *line);
/* Every record of a metrics.jsonl file, as tz_tfevents_json_line; the count, or -1 when the
 * file cannot be read. */
int64_t tz_tfevents_json_file(tz_tfevents *w, const char *path);
/* 0, or non-zero with err ("PATH: write failed: ..."). */
int tz_tfevents_flush(tz_tfevents *w, char *err, size_t n);
/* Flushes, fsyncs and closes (also on failure); 0 or non-zero with err. */
int tz_tfevents_close(tz_tfevents *w, char *err, size_t n);
/* Closes and removes the file (after a failed write: no torn record is left); later calls
 * write nothing. */
void tz_tfevents_discard(tz_tfevents *w);

#endif
