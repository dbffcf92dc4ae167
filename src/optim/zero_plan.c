/* The ZeRO partition plan: greedy bucketing of the flat space, N-way slicing, shard offsets,
 * look-ups both ways, and the start-up table. Pure arithmetic: no MPI, no I/O but the print. */
#include "optim/zero_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

static int check_desc(const tz_zero_desc *d, char *err, size_t errlen) {
    if (d->world < 1) return tz_errf(err, errlen, "world size %d < 1", d->world);
    if (d->align < 1) return tz_errf(err, errlen, "alignment %lld < 1", (long long)d->align);
    if (d->align > INT64_MAX / 4 / d->world)
        return tz_errf(err, errlen, "alignment %lld times world %d overflows", (long long)d->align,
                       d->world);
    if (d->bucket_bytes < 1)
        return tz_errf(err, errlen, "bucket size %lld bytes < 1", (long long)d->bucket_bytes);
    if (d->elem_bytes < 1)
        return tz_errf(err, errlen, "element size %lld bytes < 1", (long long)d->elem_bytes);
    if (d->flat_numel < 0 || d->flat_numel % d->align)
        return tz_errf(err, errlen, "flat length %lld is not a non-negative multiple of %lld",
                       (long long)d->flat_numel, (long long)d->align);
    if (d->flat_numel > INT64_MAX / 4)
        return tz_errf(err, errlen, "flat length %lld is too large", (long long)d->flat_numel);
    if (d->n_tensors < 0) return tz_errf(err, errlen, "tensor count %d < 0", d->n_tensors);
    if (d->n_tensors > 0 && (!d->offset || !d->numel))
        return tz_errf(err, errlen, "tensor offsets or sizes missing");
    int64_t end = 0;
    for (int i = 0; i < d->n_tensors; i++) {
        int64_t off = d->offset[i], n = d->numel[i];
        if (n < 1) return tz_errf(err, errlen, "tensor %d has %lld elements", i, (long long)n);
        if (off < end)
            return tz_errf(err, errlen,
                           "tensor %d at %lld overlaps or precedes the one before "
                           "(which ends at %lld)",
                           i, (long long)off, (long long)end);
        if (off % d->align)
            return tz_errf(err, errlen, "tensor %d at %lld is not aligned to %lld", i,
                           (long long)off, (long long)d->align);
        if (n > d->flat_numel - off)
            return tz_errf(err, errlen, "tensor %d [%lld, +%lld) runs past the flat length %lld", i,
                        (long long)off, (long long)n, (long long)d->flat_numel);
        end = off + n;
    }
    return 0;
}

typedef struct builder {
    tz_zero_plan *p;
    int cap;
    int64_t start, len; /* the open bucket */
    int first, last;
} builder;

static void emit(builder *u, int64_t len, int first, int last) {
    tz_zero_plan *p = u->p;
    if (p->n_buckets == u->cap) {
        u->cap = u->cap ? 2 * u->cap : 16;
        p->b = tz_xrealloc(p->b, (size_t)u->cap * sizeof *p->b);
    }
    tz_zero_bucket *b = &p->b[p->n_buckets++];
    const int64_t na = (int64_t)p->world * p->align;
    b->start = u->start;
    b->len = len;
    b->padded = round_up(len, na);
    b->slice = b->padded / p->world;
    b->shard_off = p->shard_numel;
    b->first_tensor = first;
    b->last_tensor = last;
    p->shard_numel += b->slice;
    p->padded_numel += b->padded;
    u->start += len;
}

static void close_open(builder *u) {
    if (u->len > 0) emit(u, u->len, u->first, u->last);
    u->len = 0;
    u->first = u->last = -1;
}

/* Adds the unit [.., +ulen) of tensor t (-1: gap) to the open bucket. */
static void add_unit(builder *u, int64_t ulen, int t) {
    const int64_t B = u->p->bucket_elems;
    if (ulen <= 0) return;
    if (u->len > 0 && u->len + ulen > B) close_open(u);
    if (ulen > B) { /* too big for any bucket: full buckets of its own, the tail stays open */
        if (t >= 0) u->p->n_split++;
        while (ulen > B) {
            emit(u, B, t, t);
            ulen -= B;
        }
    }
    u->len += ulen;
    if (t >= 0) {
        if (u->first < 0) u->first = t;
        u->last = t;
    }
}

int tz_zero_plan_init(tz_zero_plan *p, const tz_zero_desc *d, char *err, size_t errlen) {
    memset(p, 0, sizeof *p);
    if (!d) return tz_errf(err, errlen, "no description");
    if (check_desc(d, err, errlen)) return -1;
    const int64_t na = (int64_t)d->world * d->align;
    p->world = d->world;
    p->align = d->align;
    p->elem_bytes = d->elem_bytes;
    p->flat_numel = d->flat_numel;
    p->n_tensors = d->n_tensors;
    int64_t target = d->bucket_bytes / d->elem_bytes;
    p->bucket_elems = target / na * na;
    if (p->bucket_elems < na) p->bucket_elems = na;

    builder u = {p, 0, 0, 0, -1, -1};
    int64_t pos = 0;
    for (int i = 0; i < d->n_tensors; i++) {
        add_unit(&u, d->offset[i] - pos, -1); /* gap before the tensor (none from params) */
        int64_t ext = round_up(d->numel[i], d->align);
        add_unit(&u, ext, i);
        pos = d->offset[i] + ext;
        p->trainable += d->numel[i];
    }
    add_unit(&u, d->flat_numel - pos, -1);
    close_open(&u);
    if (p->padded_numel != p->shard_numel * p->world || u.start != p->flat_numel)
        TZ_FATAL("zero plan: internal inconsistency (padded %lld, shard %lld x %d, end %lld)",
                 (long long)p->padded_numel, (long long)p->shard_numel, p->world,
                 (long long)u.start);
    return 0;
}

void tz_zero_plan_free(tz_zero_plan *p) {
    free(p->b);
    memset(p, 0, sizeof *p);
}

int tz_zero_plan_bucket_of(const tz_zero_plan *p, int64_t i) {
    if (i < 0 || i >= p->flat_numel)
        TZ_FATAL("flat index %lld is outside [0, %lld)", (long long)i, (long long)p->flat_numel);
    int lo = 0, hi = p->n_buckets - 1; /* last bucket with start <= i */
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (p->b[mid].start <= i)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

tz_zero_loc tz_zero_plan_locate(const tz_zero_plan *p, int64_t i) {
    tz_zero_loc l;
    l.bucket = tz_zero_plan_bucket_of(p, i);
    const tz_zero_bucket *b = &p->b[l.bucket];
    l.in_bucket = i - b->start;
    l.owner = (int)(l.in_bucket / b->slice);
    l.shard = b->shard_off + l.in_bucket - (int64_t)l.owner * b->slice;
    return l;
}

int64_t tz_zero_plan_flat_of(const tz_zero_plan *p, int rank, int64_t s) {
    if (rank < 0 || rank >= p->world || s < 0 || s >= p->shard_numel)
        TZ_FATAL("shard offset %lld of rank %d is outside the plan (%d ranks, %lld per shard)",
                 (long long)s, rank, p->world, (long long)p->shard_numel);
    int lo = 0, hi = p->n_buckets - 1; /* last bucket with shard_off <= s */
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (p->b[mid].shard_off <= s)
            lo = mid;
        else
            hi = mid - 1;
    }
    const tz_zero_bucket *b = &p->b[lo];
    int64_t in_bucket = (int64_t)rank * b->slice + (s - b->shard_off);
    return in_bucket < b->len ? b->start + in_bucket : -1;
}

void tz_zero_plan_slice(const tz_zero_plan *p, int b, int rank, int64_t *begin, int64_t *end) {
    if (b < 0 || b >= p->n_buckets || rank < 0 || rank >= p->world)
        TZ_FATAL("bucket %d / rank %d outside the plan (%d buckets, %d ranks)", b, rank,
                 p->n_buckets, p->world);
    const tz_zero_bucket *k = &p->b[b];
    int64_t lo = (int64_t)rank * k->slice, hi = lo + k->slice;
    if (lo > k->len) lo = k->len;
    if (hi > k->len) hi = k->len;
    *begin = k->start + lo;
    *end = k->start + hi;
}

static void fmt_bytes(char *buf, size_t n, double bytes) {
    if (bytes >= 1024.0 * 1048576.0)
        snprintf(buf, n, "%.2f GiB", bytes / (1024.0 * 1048576.0));
    else if (bytes >= 1048576.0)
        snprintf(buf, n, "%.1f MiB", bytes / 1048576.0);
    else
        snprintf(buf, n, "%.1f KiB", bytes / 1024.0);
}

static void print_row(const tz_zero_plan *p, int i) {
    const tz_zero_bucket *b = &p->b[i];
    char t[48];
    if (b->first_tensor < 0)
        snprintf(t, sizeof t, "(gap)");
    else if (b->first_tensor == b->last_tensor)
        snprintf(t, sizeof t, "%d", b->first_tensor);
    else
        snprintf(t, sizeof t, "%d-%d", b->first_tensor, b->last_tensor);
    tz_info("  %6d %14lld %12lld %8lld %12lld %14lld  %s", i, (long long)b->start,
            (long long)b->len, (long long)(b->padded - b->len), (long long)b->slice,
            (long long)b->shard_off, t);
}

void tz_zero_plan_print(const tz_zero_plan *p) {
    char bucket[32], shard[32];
    fmt_bytes(bucket, sizeof bucket, (double)p->bucket_elems * (double)p->elem_bytes);
    /* fp32 master + m + v + gradient accumulator */
    fmt_bytes(shard, sizeof shard, (double)p->shard_numel * 16.0);
    const int64_t pad = p->padded_numel - p->flat_numel;
    tz_info("ZeRO plan: %d rank%s, %d bucket%s of at most %lld elements (%s at %lld B), "
            "alignment %lld",
            p->world, p->world == 1 ? "" : "s", p->n_buckets, p->n_buckets == 1 ? "" : "s",
            (long long)p->bucket_elems, bucket, (long long)p->elem_bytes, (long long)p->align);
    tz_info("  flat %lld elements (%lld in %d tensors, %lld alignment gap), bucket padding "
            "%lld (%.3f%%), %d tensor%s cut across buckets",
            (long long)p->flat_numel, (long long)p->trainable, p->n_tensors,
            (long long)(p->flat_numel - p->trainable), (long long)pad,
            p->padded_numel ? 100.0 * (double)pad / (double)p->padded_numel : 0.0, p->n_split,
            p->n_split == 1 ? "" : "s");
    if (p->n_buckets > 0) {
        tz_info("  %6s %14s %12s %8s %12s %14s  %s", "bucket", "flat start", "elements", "padding",
                "per rank", "shard offset", "tensors");
        const int head = 8, tail = 2;
        for (int i = 0; i < p->n_buckets; i++) {
            if (p->n_buckets > head + tail + 1 && i == head) {
                tz_info("  %6s ... %d more", "", p->n_buckets - head - tail);
                i = p->n_buckets - tail;
            }
            print_row(p, i);
        }
    }
    tz_info("  per-rank shard: %lld elements; fp32 master + m + v + grad accumulator %s",
            (long long)p->shard_numel, shard);
}
