/* The HDF5 file of one rank's checkpoint shard: groups of datasets named after the tensors
 * (Fletcher32 on every chunk), int64 attributes, hyperslab reads; and the whole-file size and
 * CRC-32 a checkpoint's manifest records. Knows no training (train/checkpoint.c). Element
 * types: TZ_DT_F32 (IEEE little-endian float), TZ_DT_BF16 (its bit patterns as
 * little-endian 16-bit unsigned integers) and TZ_DT_U8. */
#ifndef TZ_CKPT_H5_H
#define TZ_CKPT_H5_H
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"

typedef struct tz_h5_shard tz_h5_shard; /* an open shard file */

/* Creates path (truncating) for writing; NULL with a message in err. A write that fails (a
 * full disk) is reported with its errno and the file by the call it happened in, or by the
 * close; the file is closed safely after it all the same. */
tz_h5_shard *tz_h5_shard_create(const char *path, char *err, size_t errlen);
/* Opens path read-only; NULL with a message in err. */
tz_h5_shard *tz_h5_shard_open(const char *path, char *err, size_t errlen);
/* Closes (and, for a written file, flushes) the file. 0, or non-zero with a message. */
int tz_h5_shard_close(tz_h5_shard *f, char *err, size_t errlen);

/* An int64 attribute array of n values on the file's root ("" ) or on group/dataset `obj`. */
int tz_h5_shard_attr(tz_h5_shard *f, const char *obj, const char *name, const int64_t *v,
                     int n, char *err, size_t errlen);
/* Dataset group/name of n elements of type dt (chunked, Fletcher32), written from data, with
 * int64 attributes "shape" (ndim values) and "flat_offset" (1), and "pieces" (npieces pairs:
 * the tensor element offset and count of each run of elements, in the order they are
 * stored). The group is created on first use. 0, or non-zero with a message. */
int tz_h5_shard_write(tz_h5_shard *f, const char *group, const char *name, enum tz_dtype dt,
                      const void *data, int64_t n, const int64_t *shape, int ndim,
                      int64_t flat_offset, const int64_t *pieces, int64_t npieces, char *err,
                      size_t errlen);
/* Elements [at, at + n) of dataset group/name into dst, checksums verified; the dataset must
 * hold exactly `total` elements of type dt. 0, or non-zero with a message naming the file and
 * dataset (and, for another element type, both types). */
int tz_h5_shard_read(tz_h5_shard *f, const char *group, const char *name, enum tz_dtype dt,
                     int64_t total, int64_t at, int64_t n, void *dst, char *err,
                     size_t errlen);

/* fsyncs path and reads it back: its size and CRC-32. 0, or non-zero with a message. */
int tz_file_sync_crc(const char *path, int64_t *bytes, uint32_t *crc, char *err, size_t errlen);

#endif
