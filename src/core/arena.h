/* Arena: a bump allocator over one backend allocation, for activations and scratch.
 * Allocation order is deterministic, so peak use is known; marks let a layer free its
 * temporaries in one step. Not thread-safe (the model allocates from one thread). */
#ifndef TZ_ARENA_H
#define TZ_ARENA_H
#include <stddef.h>

#include "core/backend.h"

typedef struct tz_arena {
    tz_backend *be;
    char *base;
    size_t cap;
    size_t used;
    size_t peak;
} tz_arena;

/* cap bytes from the backend (the model computes the cap from its shapes). */
void tz_arena_init(tz_arena *a, tz_backend *be, size_t cap);
void tz_arena_free(tz_arena *a);
/* 64-byte aligned, fatal with the sizes when the arena is full. */
void *tz_arena_alloc(tz_arena *a, size_t bytes, const char *what);
static inline float *tz_arena_floats(tz_arena *a, int64_t n, const char *what) {
    return (float *)tz_arena_alloc(a, (size_t)n * sizeof(float), what);
}
/* One step of a walk that first sizes an arena (a == NULL: only *total grows by the aligned
 * size of n floats) and then allocates from it (the same walk with the arena). */
static inline void *tz_arena_take(tz_arena *a, size_t *total, int64_t n, const char *what) {
    *total += ((size_t)n * sizeof(float) + 63) & ~(size_t)63;
    return a ? tz_arena_alloc(a, (size_t)n * sizeof(float), what) : NULL;
}
/* The step as a model's walk writes it: ptr (any pointer lvalue) gets the allocation only when
 * allocating, so while sizing it may name storage that does not exist yet. */
#define TZ_ARENA_TAKE(a, total, ptr, n, what)                    \
    do {                                                         \
        void *take_ = tz_arena_take((a), (total), (n), (what));  \
        if (a) (ptr) = take_;                                    \
    } while (0)
static inline size_t tz_arena_mark(const tz_arena *a) { return a->used; }
static inline void tz_arena_reset(tz_arena *a, size_t mark) { a->used = mark; }

#endif
