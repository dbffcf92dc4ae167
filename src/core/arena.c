/* Bump allocation with marks over one backend buffer; tracks the peak for memory plans. */
#include "core/arena.h"

#include "core/error.h"

void tz_arena_init(tz_arena *a, tz_backend *be, size_t cap) {
    a->be = be;
    a->cap = cap;
    a->used = 0;
    a->peak = 0;
    a->base = cap ? be->alloc(be, cap) : NULL;
}

void tz_arena_free(tz_arena *a) {
    if (a->base) a->be->release(a->be, a->base);
    a->base = NULL;
    a->cap = a->used = 0;
}

void *tz_arena_alloc(tz_arena *a, size_t bytes, const char *what) {
    size_t off = (a->used + 63) & ~(size_t)63;
    if (off + bytes > a->cap)
        TZ_FATAL_HINT("lower train.micro_batch or data.seq_len, or set train.checkpointing = true",
                      "activation arena full: %s needs %zu bytes, %zu of %zu in use", what,
                      bytes, a->used, a->cap);
    a->used = off + bytes;
    if (a->used > a->peak) a->peak = a->used;
    return a->base + off;
}
