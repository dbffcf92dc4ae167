/* Streamed block weights (model/wstream.h): two slots, events both ways. */
#include "model/wstream.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

#define ALIGN64(n) (((n) + 63) & ~(size_t)63)

void tz_wstream_init(tz_wstream *s, int64_t n_blocks, int64_t streamed) {
    memset(s, 0, sizeof *s);
    if (streamed < 0 || streamed > n_blocks)
        TZ_FATAL("quant.offload_blocks = %lld: the model has %lld blocks", (long long)streamed,
                 (long long)n_blocks);
    s->n_blocks = n_blocks;
    s->first = n_blocks - streamed;
    s->held[0] = s->held[1] = -1;
    if (!streamed) return;
    s->q = tz_xcalloc((size_t)streamed, sizeof *s->q);
    s->size = tz_xcalloc((size_t)streamed, sizeof *s->size);
    s->nq = tz_xcalloc((size_t)streamed, sizeof *s->nq);
    s->bytes = tz_xcalloc((size_t)streamed, sizeof *s->bytes);
}

void tz_wstream_add(tz_wstream *s, int64_t k, tz_qweight *q, size_t codes_bytes) {
    if (!tz_wstream_has(s, k) || !q->host)
        TZ_FATAL("streamed weights: block %lld is not streamed", (long long)k);
    const int64_t i = k - s->first;
    const int n = s->nq[i] + 1;
    s->q[i] = tz_xrealloc(s->q[i], (size_t)n * sizeof *s->q[i]);
    s->size[i] = tz_xrealloc(s->size[i], (size_t)n * sizeof *s->size[i]);
    s->q[i][n - 1] = q;
    s->size[i][n - 1] = codes_bytes;
    s->nq[i] = n;
    s->bytes[i] += ALIGN64(codes_bytes);
    if (s->bytes[i] > s->slot_bytes) s->slot_bytes = s->bytes[i];
}

/* Block k's weights point into slot j, or nowhere (j < 0: a use fails loudly). */
static void bind(tz_wstream *s, int64_t k, int j) {
    const int64_t i = k - s->first;
    size_t off = 0;
    for (int w = 0; w < s->nq[i]; w++) {
        s->q[i][w]->codes = j < 0 ? NULL : s->slot[j] + off;
        off += ALIGN64(s->size[i][w]);
    }
}

void tz_wstream_walk(tz_wstream *s, tz_backend *be, tz_arena *a, size_t *total) {
    if (s->first >= s->n_blocks) return;
    const int64_t floats = (int64_t)((s->slot_bytes + sizeof(float) - 1) / sizeof(float));
    for (int j = 0; j < 2; j++)
        TZ_ARENA_TAKE(a, total, s->slot[j], floats, "streamed block weights (one of two slots)");
    if (a) { /* a new arena: no slot holds anything yet */
        for (int j = 0; j < 2; j++)
            if (s->held[j] >= 0) bind(s, s->held[j], -1), s->held[j] = -1;
        s->be = be;
    }
}

/* Queues block k's codes into slot j once the compute that last read the slot is done. */
static void load(tz_wstream *s, int64_t k, int j) {
    tz_backend *be = s->be;
    if (s->held[j] >= 0) bind(s, s->held[j], -1);
    if (s->read[j]) be->event_wait(be, s->read[j], TZ_QUEUE_COPY);
    const int64_t i = k - s->first;
    bind(s, k, j);
    for (int w = 0; w < s->nq[i]; w++)
        be->upload_async(be, s->q[i][w]->codes, s->q[i][w]->host, s->size[i][w]);
    if (s->loaded[j]) be->event_free(be, s->loaded[j]);
    s->loaded[j] = be->event_mark(be, TZ_QUEUE_COPY);
    s->held[j] = k;
}

void tz_wstream_use(tz_wstream *s, int64_t k, int64_t next) {
    if (!s->be) {
        if (s->first < s->n_blocks) TZ_FATAL("streamed weights: the model's arena is not set up");
        return;
    }
    if (tz_wstream_has(s, k)) {
        const int j = (int)(k & 1);
        if (s->held[j] != k) load(s, k, j);
        s->be->event_wait(s->be, s->loaded[j], TZ_QUEUE_COMPUTE);
    }
    if (next >= 0 && tz_wstream_has(s, next) && s->held[next & 1] != next)
        load(s, next, (int)(next & 1));
}

void tz_wstream_done(tz_wstream *s, int64_t k) {
    if (!s->be || !tz_wstream_has(s, k)) return;
    const int j = (int)(k & 1);
    if (s->read[j]) s->be->event_free(s->be, s->read[j]);
    s->read[j] = s->be->event_mark(s->be, TZ_QUEUE_COMPUTE);
}

void tz_wstream_free(tz_wstream *s) {
    for (int j = 0; j < 2; j++) {
        if (s->be && s->read[j]) s->be->event_free(s->be, s->read[j]);
        if (s->be && s->loaded[j]) {
            s->be->event_wait(s->be, s->loaded[j], TZ_QUEUE_HOST); /* no copy outlives it */
            s->be->event_free(s->be, s->loaded[j]);
        }
    }
    for (int64_t i = 0; s->q && i < s->n_blocks - s->first; i++) free(s->q[i]), free(s->size[i]);
    free(s->q), free(s->size), free(s->nq), free(s->bytes);
    memset(s, 0, sizeof *s);
}
