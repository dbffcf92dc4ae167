/* Start-up check that every rank sees the same inputs: a digest of the configuration, the
 * model files, the adapter and the data files, compared across ranks before anything is
 * loaded, so a rank that reads another base model or another training file (a node-local
 * copy that differs) stops the job instead of training on it. */
#ifndef TZ_INPUTS_CHECK_H
#define TZ_INPUTS_CHECK_H
#include <stdint.h>

#include "io/config.h"
#include "comm/comm.h"

/* Rank 0 lists the files (model.path and model.adapter: their *.json and *.safetensors;
 * data.train, data.val and the label files: the file, or such files of a folder); every rank
 * digests the same paths (resolved in its own working directory) and the digests are
 * gathered. A difference stops every rank with rank 0's message naming the rank(s), the key
 * and the file. A file a rank cannot read is left to that rank's loader (its own message).
 * Collective over comm. */
void tz_inputs_check(const tz_config *cfg, tz_comm *comm);

/* The digest of one file: its size and an FNV-1a hash of all of it when it is at most
 * 4 MiB, else of its first MiB and 64 blocks of 4 KiB spread evenly to its end (a sample:
 * cheap on a large model, and two different trainings of one model differ in every block).
 * 0, or -1 when the file cannot be read. */
int tz_file_digest(const char *path, int64_t *size, uint64_t *hash);

#endif
