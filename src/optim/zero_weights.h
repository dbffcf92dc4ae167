/* The trainable weights' way between the owners' host shards and every rank's model: the
 * master's first values (read from the model), and after each optimizer step the updated
 * weights back, bucket by bucket. A rank's slice of a bucket is cut into pieces, one per
 * tensor it touches: a dense piece travels as fp32, a quantized one as the packed codes and
 * bf16 scales the owner re-quantizes from its fp32 master (full fine-tuning of a quantized
 * model), so what crosses the network is bits/8 + 2/group bytes per quantized weight.
 * No optimizer math and no communication here (optim/zero.c drives both). */
#ifndef TZ_ZERO_WEIGHTS_H
#define TZ_ZERO_WEIGHTS_H
#include <stdint.h>

#include "core/backend.h"
#include "model/params.h"
#include "optim/zero_plan.h"
#include "quant/codebook.h"
#include "quant/tq_layout.h"

/* Elements [off, off + n) of tensor p, inside one rank's slice of one bucket. Quantized:
 * off and n are multiples of p's group (the plan cuts at multiples of TZ_FLAT_ALIGN, which
 * every group divides), so a piece is whole groups. */
typedef struct tz_zero_piece {
    tz_param *p;
    int64_t off, n;
    int64_t in_slice; /* offset of the first element in the rank's slice of the bucket */
    int64_t at;       /* byte offset in the rank's packed chunk */
    int64_t bytes;    /* 4 n (dense), or n bits/8 codes + 2 n/group scale bytes */
} tz_zero_piece;

typedef struct tz_zero_weights {
    int world, n_buckets;
    int64_t *first;        /* [n_buckets * world + 1]: pieces of (bucket b, rank r) are
                            * first[b * world + r] .. first[b * world + r + 1] - 1 */
    tz_zero_piece *pc;
    int64_t *bytes;        /* [n_buckets * world]: packed bytes of rank r's slice of bucket
                            * b (a multiple of 8): the block it sends in b's all-gather */
    int64_t max_chunk;     /* the largest of them */
    int64_t max_bucket;    /* the largest sum over the ranks of one bucket's blocks */
    int64_t quant_params;  /* trainable elements stored quantized */
    int64_t dense_params;  /* trainable elements stored as fp32 */
    tz_tq_codebook cb[TZ_TQ_MAX_BITS + 1]; /* TurboQuant codebooks of the bits present */
    uint64_t sr;           /* this step's stochastic-rounding seed for the re-quantization
                            * (quant.rounding = "stochastic"); 0: nearest */
    int count_changes;     /* count the codes each re-quantization changes (prev kept) */
    uint8_t **prev;        /* [n_buckets]: the rank's last packed chunk of each bucket */
    int64_t changed, counted; /* codes changed / compared since the caller last zeroed them */
} tz_zero_weights;

/* Cuts every (bucket, rank) slice of plan into pieces of the trainable tensors of ps. The
 * plan's ranks are plan->world (1 for stage 0). Fatal when a quantized piece would not be
 * whole groups (a plan not aligned to the groups). */
void tz_zero_weights_init(tz_zero_weights *zw, const tz_zero_plan *plan, tz_params *ps);
void tz_zero_weights_free(tz_zero_weights *zw);

/* The master's first values for rank r's slice of bucket b (slice floats, zeros in gaps and
 * padding): dense pieces from the model's weight; quantized ones from p->init (the dense
 * weight the quantized one was made from) when the model kept it, else decoded from the
 * codes and scales. */
void tz_zero_weights_read(const tz_zero_weights *zw, tz_backend *be, int b, int r,
                          float *slice);
/* Packs rank r's slice of bucket b from its master (slice floats) into chunk
 * (zw->bytes[b * world + r] bytes): dense pieces copied (dense = 0: left out, their bytes
 * untouched), quantized pieces re-quantized (OpenMP over groups; the same bytes as `turbozero
 * quantize` of the master would give). */
void tz_zero_weights_pack(tz_zero_weights *zw, int b, int r, const float *slice,
                          uint8_t *chunk, int dense);
/* Writes rank r's packed chunk of bucket b into the model: weights, or codes and scales
 * (dense = 0: the quantized pieces only). */
void tz_zero_weights_unpack(const tz_zero_weights *zw, tz_backend *be, int b, int r,
                            const uint8_t *chunk, int dense);
/* The dense pieces of rank r's slice of bucket b straight from the master (slice floats) into
 * the model's weights, with no chunk between: on a device backend as asynchronous copies on
 * the copy queue (the slice must not change until they are done: an event marked after them
 * says when), on the host at once. Returns the bytes. */
int64_t tz_zero_weights_put_dense(const tz_zero_weights *zw, tz_backend *be, int b, int r,
                                  const float *slice);
/* Bytes rank r receives in the all-gathers of one step: the other ranks' blocks. */
int64_t tz_zero_weights_gather_bytes(const tz_zero_weights *zw, int r);

#endif
