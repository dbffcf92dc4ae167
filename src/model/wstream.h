/* Streamed block weights: the frozen quantized codes of a model's last blocks (quant.
 * offload_blocks) stay in pinned host memory (tz_qweight.host) and are copied to the device a
 * block at a time, into one of two slots of backend memory (block k into slot k mod 2), on the
 * copy queue while the block before it computes. The compute queue waits for a block's copy
 * (an event), the copy into a slot waits for the compute that last read it: correct on any
 * backend, overlapped on a device (the CPU backend copies at once). Every use is ordered by
 * events, so the emulated CUDA backend checks the ordering byte range by byte range. */
#ifndef TZ_WSTREAM_H
#define TZ_WSTREAM_H
#include <stddef.h>
#include <stdint.h>

#include "core/arena.h"
#include "core/backend.h"
#include "model/params.h"

typedef struct tz_wstream {
    int64_t n_blocks, first;  /* blocks first .. n_blocks - 1 are streamed (none: first = n) */
    tz_qweight ***q;          /* per streamed block its quantized weights */
    size_t **size;            /* and the bytes of each one's codes */
    int *nq;
    size_t *bytes;            /* codes bytes per streamed block */
    size_t slot_bytes;        /* the largest */
    tz_backend *be;
    uint8_t *slot[2];         /* backend memory (the model's arena) */
    int64_t held[2];          /* the block whose codes a slot holds, -1 */
    void *loaded[2], *read[2]; /* events: the copy into a slot done; the compute reading it */
} tz_wstream;

/* n_blocks blocks, the last `streamed` of them streamed (0: none). */
void tz_wstream_init(tz_wstream *s, int64_t n_blocks, int64_t streamed);
/* Whether block k is streamed. */
static inline int tz_wstream_has(const tz_wstream *s, int64_t k) {
    return k >= s->first && k < s->n_blocks;
}
/* Registers q (host codes) as one of block k's streamed weights. */
void tz_wstream_add(tz_wstream *s, int64_t k, tz_qweight *q, size_t codes_bytes);
/* The model's arena walk: the two slots (nothing when no block is streamed). */
void tz_wstream_walk(tz_wstream *s, tz_backend *be, tz_arena *a, size_t *total);
/* Before block k's ops are queued: its codes are on the device for the compute queue (copied
 * now if its slot holds another block), and block `next` (-1: none; the next block in the
 * pass's order) starts copying into the other slot. Blocks not streamed: nothing to do. */
void tz_wstream_use(tz_wstream *s, int64_t k, int64_t next);
/* After block k's ops are queued: its slot may be overwritten once they have run. */
void tz_wstream_done(tz_wstream *s, int64_t k);
void tz_wstream_free(tz_wstream *s);

#endif
