/* safetensors: a checked mmap reader (a file, or a model folder, single or sharded) and an
 * atomic writer. Formats only, no models or training; errors are returned, never fatal. */
#ifndef TZ_SAFETENSORS_H
#define TZ_SAFETENSORS_H
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"

#define TZ_ST_MAX_DIMS 8
/* The reference implementation's limit on the JSON header (100 MB). */
#define TZ_ST_MAX_HEADER_BYTES ((uint64_t)100000000)

typedef struct tz_st_tensor {
    const char *name;
    enum tz_dtype dtype;
    int ndim; /* 0 (a scalar) .. TZ_ST_MAX_DIMS */
    int64_t shape[TZ_ST_MAX_DIMS];
    int64_t numel; /* product of the shape; 1 for a scalar */
    size_t nbytes; /* numel * tz_dtype_size(dtype) */
    /* Inside the read-only mapping: valid until tz_st_close. May be unaligned (a file
     * whose writer did not align tensors), so read it with memcpy or tz_dtype_to_f32. */
    const void *data;
    const char *file; /* path of the file it came from */
} tz_st_tensor;

typedef struct tz_st_file {
    char *path;
    void *map;         /* whole file, PROT_READ, MAP_PRIVATE */
    size_t size;       /* file bytes */
    size_t data_start; /* 8 + header length: where offset 0 of the data section is */
} tz_st_file;

typedef struct tz_safetensors {
    char *path; /* as given to tz_st_open */
    tz_st_file *files;
    int nfiles;
    tz_st_tensor *tensors; /* all tensors of all files, sorted by name (strcmp) */
    int64_t count;
    char **meta; /* __metadata__ pairs: key0, value0, key1, value1, ...; first file wins */
    int64_t nmeta;
} tz_safetensors;

/* Opens path: a .safetensors file, a model.safetensors.index.json, or a folder holding
 * model.safetensors or (else) model.safetensors.index.json, or else diffusers'
 * diffusion_pytorch_model.safetensors or its index. Every file is mapped and
 * every header entry checked before success (two tensors of one file whose data_offsets
 * overlap are refused). 0 on success; non-zero with a message in err
 * naming the file and, where there is one, the tensor, and st left empty (safe to close). */
int tz_st_open(tz_safetensors *st, const char *path, char *err, size_t errlen);
/* Unmaps and frees everything; st is zeroed. Safe on a zeroed or failed-to-open st. */
void tz_st_close(tz_safetensors *st);

/* NULL when absent. Binary search over the sorted names. */
const tz_st_tensor *tz_st_find(const tz_safetensors *st, const char *name);
/* Value of a __metadata__ key, NULL when absent. */
const char *tz_st_metadata(const tz_safetensors *st, const char *key);

/* Finds name, checks its shape equals (ndim, shape), converts F32/F16/BF16 to fp32 into
 * out (numel floats). 0, or non-zero with a message naming the file, the tensor and the
 * shapes or dtype that disagree, or the first non-finite element. */
int tz_st_read_f32(const tz_safetensors *st, const char *name, float *out, int ndim,
                   const int64_t *shape, char *err, size_t errlen);
/* Converts one tensor (F32/F16/BF16) to fp32, out holds t->numel floats. 0, or non-zero;
 * a NaN or Inf element is an error naming the file, the tensor and the element. */
int tz_st_tensor_to_f32(const tz_st_tensor *t, float *out, char *err, size_t errlen);
/* A model's identity, to tell whether an adapter meets the base it was trained on: 64 bits of
 * FNV-1a over every tensor's name, dtype and shape and 3 x 64 bytes of its data (start,
 * middle, end), in name order (the same for any sharding). Cheap at any size: pages touched,
 * not read whole. A folder written from another (turbozero quantize, export --dequantize)
 * records its source's identity under TZ_ST_SOURCE_KEY (16 hex digits), so a quantized copy
 * and its dense source are one base; an adapter records its base's under TZ_ST_BASE_KEY. */
#define TZ_ST_SOURCE_KEY "turbozero.source_digest"
#define TZ_ST_BASE_KEY "turbozero.base_digest"
uint64_t tz_st_digest(const tz_safetensors *st);
/* The recorded source's identity when the metadata has one, else tz_st_digest. */
uint64_t tz_st_identity_of(const tz_safetensors *st);
/* tz_st_identity_of of the model at path (a file, or a folder as tz_st_open takes); 0, or
 * non-zero with err. */
int tz_st_identity(const char *path, uint64_t *id, char *err, size_t errlen);
/* Writes "[a, b, c]" into buf; returns buf. */
char *tz_st_shape_str(char *buf, size_t len, int ndim, const int64_t *shape);

/* ---- writer ---- */

typedef struct tz_st_wentry {
    char *name;
    enum tz_dtype dtype;
    int ndim;
    int64_t shape[TZ_ST_MAX_DIMS];
    size_t nbytes;
    const void *data; /* borrowed: must stay valid until tz_st_writer_save returns */
} tz_st_wentry;

typedef struct tz_st_writer {
    tz_st_wentry *entries;
    int64_t count, cap;
    char **meta; /* key0, value0, ... */
    int64_t nmeta, metacap;
    int allow_nonfinite; /* 0 (init): save refuses NaN/Inf in F32/F16/BF16 tensors; 1 lets
                          * format tests write them */
} tz_st_writer;

void tz_st_writer_init(tz_st_writer *w);
void tz_st_writer_free(tz_st_writer *w);
/* Adds a tensor (name copied, data borrowed, raw little-endian bytes of dtype). Checks
 * the name, dtype and shape; a duplicate name is reported by save. 0, or non-zero. */
int tz_st_writer_add(tz_st_writer *w, const char *name, enum tz_dtype dtype, int ndim,
                     const int64_t *shape, const void *data, char *err, size_t errlen);
/* Sets a __metadata__ string pair (a repeated key replaces the value). */
void tz_st_writer_set_metadata(tz_st_writer *w, const char *key, const char *value);
/* Writes the standard layout: u64 little-endian header length, JSON header (__metadata__
 * first, then the tensors) padded with spaces to a multiple of 8, then the tensors back to
 * back in header order. The order is the reference writer's: element size descending, then
 * name (strcmp), so each tensor's data is aligned to its element size; files of one dtype
 * are in plain name order. Written to path.tmp, fsynced, renamed onto path. 0, or non-zero
 * with a message (path is then untouched). A name added twice is an error, and so is a
 * NaN or Inf in a floating tensor (named) unless w->allow_nonfinite. Reorders
 * w->entries into that layout order; w can be saved again or freed. */
int tz_st_writer_save(tz_st_writer *w, const char *path, char *err, size_t errlen);

#endif
