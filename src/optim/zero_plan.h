/* The ZeRO partition plan: the flat space cut into buckets padded to N*A, rank r owning slice r
 * of each. A pure function of plain numbers (sizes, offsets, N, bytes, A): no MPI, no model. */
#ifndef TZ_ZERO_PLAN_H
#define TZ_ZERO_PLAN_H
#include <stddef.h>
#include <stdint.h>

/* What the plan is made from. The flat space is [0, flat_numel); tensors are given in flat
 * order (ascending offsets, each a multiple of align, not overlapping); the gaps between
 * tensors (alignment padding) are part of the space and hold zeros. The tensors only say
 * where a bucket may not cut when it can help it. */
typedef struct tz_zero_desc {
    int64_t flat_numel;    /* padded flat length, a multiple of align */
    int n_tensors;
    const int64_t *offset; /* [n_tensors] flat offset of each tensor */
    const int64_t *numel;  /* [n_tensors] elements of each tensor */
    int world;             /* N ranks, >= 1 */
    int64_t bucket_bytes;  /* target bucket size, > 0 */
    int64_t elem_bytes;    /* bytes per element in a bucket (4: fp32 gradients), > 0 */
    int64_t align;         /* A elements, > 0 */
} tz_zero_desc;

typedef struct tz_zero_bucket {
    int64_t start;     /* flat offset of the first element (a multiple of A) */
    int64_t len;       /* flat elements [start, start + len) */
    int64_t padded;    /* len rounded up to a multiple of N*A: the communicated length */
    int64_t slice;     /* padded / N: elements each rank owns (a multiple of A) */
    int64_t shard_off; /* where this bucket's slice sits in every rank's shard (same on all) */
    int first_tensor;  /* first and last tensor with elements in the bucket; -1 when the  */
    int last_tensor;   /* bucket holds only gap (the bucket is complete once last_tensor is) */
} tz_zero_bucket;

typedef struct tz_zero_plan {
    int world;
    int64_t align;
    int64_t bucket_elems;   /* target bucket length: bucket_bytes / elem_bytes rounded down to a
                             * multiple of N*A, at least N*A; no bucket is longer */
    int64_t elem_bytes;
    int64_t flat_numel;     /* the space the buckets cover, end to end */
    int64_t trainable;      /* elements inside tensors (flat_numel minus the gaps) */
    int64_t padded_numel;   /* sum of the buckets' padded lengths */
    int64_t shard_numel;    /* elements of each rank's shard = padded_numel / N */
    int n_tensors;
    int n_split;            /* tensors larger than a bucket, cut across buckets */
    int n_buckets;
    tz_zero_bucket *b;
} tz_zero_plan;

/* Where a flat element lives. */
typedef struct tz_zero_loc {
    int bucket;
    int owner;         /* rank owning it */
    int64_t in_bucket; /* offset in the bucket's (padded) buffer */
    int64_t shard;     /* offset in the owner's shard */
} tz_zero_loc;

/* Builds the plan. Buckets are filled greedily in flat order with whole tensors (a tensor
 * together with the gap after it) while they fit in bucket_elems; a tensor that does not
 * fit in an empty bucket is cut at multiples of bucket_elems (so at multiples of A) into
 * full buckets of its own, and its tail opens the next bucket, which later tensors may join.
 * Returns 0, or -1 with a message in err for a bad description (nothing to free then). */
int tz_zero_plan_init(tz_zero_plan *p, const tz_zero_desc *d, char *err, size_t errlen);
void tz_zero_plan_free(tz_zero_plan *p);

/* The bucket holding flat element i (0 <= i < flat_numel), by binary search. */
int tz_zero_plan_bucket_of(const tz_zero_plan *p, int64_t i);
/* Bucket, owner, offsets of flat element i. */
tz_zero_loc tz_zero_plan_locate(const tz_zero_plan *p, int64_t i);
/* The flat element at offset s of rank r's shard; -1 when it is bucket padding. */
int64_t tz_zero_plan_flat_of(const tz_zero_plan *p, int rank, int64_t s);
/* The flat elements [*begin, *end) of bucket b owned by rank r (empty when the rank's
 * slice is all padding). The slice's shard offset is b's shard_off. */
void tz_zero_plan_slice(const tz_zero_plan *p, int b, int rank, int64_t *begin, int64_t *end);

/* Start-up table on rank 0 (tz_info): buckets, elements, padding, and per-rank shard
 * elements and bytes for fp32 master + m + v + gradient accumulator (16 bytes/element). */
void tz_zero_plan_print(const tz_zero_plan *p);

#endif
