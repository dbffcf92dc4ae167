/* The ZeRO plan as a pure function: over many seeded random descriptions every flat element is
 * owned once, slices are equal and aligned, shards agree; plus fixed cases and bad input. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/world.h"
#include "core/error.h"
#include "core/rng.h"
#include "optim/zero_plan.h"
#include "tz_check.h"

#define MAX_T 64

typedef struct tcase {
    int64_t off[MAX_T], numel[MAX_T];
    tz_zero_desc d;
} tcase;

static int64_t rup(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* A random description: params-style packing, sometimes extra gaps, odd sizes, 1-element
 * tensors, a tensor larger than the bucket, N = 1..8, buckets from 1 byte to 1 TB. */
static void random_case(tcase *c, tz_rng *r) {
    static const int64_t aligns[] = {1, 4, 16, 64, 256};
    memset(c, 0, sizeof *c);
    tz_zero_desc *d = &c->d;
    d->align = aligns[tz_rng_below(r, 5)];
    d->world = 1 + (int)tz_rng_below(r, 8);
    d->elem_bytes = tz_rng_below(r, 2) ? 4 : 2;
    int64_t exp10 = (int64_t)tz_rng_below(r, 13); /* 1 B .. 1 TB */
    d->bucket_bytes = 1;
    for (int64_t k = 0; k < exp10; k++)
        d->bucket_bytes *= 10;
    d->bucket_bytes += (int64_t)tz_rng_below(r, (uint64_t)d->bucket_bytes);
    d->n_tensors = (int)tz_rng_below(r, 41);
    int gaps = tz_rng_below(r, 4) == 0;
    int64_t pos = gaps ? d->align * (int64_t)tz_rng_below(r, 3) : 0;
    for (int i = 0; i < d->n_tensors; i++) {
        int64_t n;
        switch (tz_rng_below(r, 6)) {
        case 0: n = 1; break;
        case 1: n = 1 + (int64_t)tz_rng_below(r, 9) * 2; break; /* small odd */
        case 2: n = d->align * (1 + (int64_t)tz_rng_below(r, 8)); break;
        case 3: n = 1 + (int64_t)tz_rng_below(r, 5000); break;
        case 4: n = 1 + (int64_t)tz_rng_below(r, 40000); break;
        default: n = 50000 + (int64_t)tz_rng_below(r, 150000); break; /* often > bucket */
        }
        c->off[i] = pos;
        c->numel[i] = n;
        pos += rup(n, d->align);
        if (gaps && tz_rng_below(r, 3) == 0) pos += d->align * (int64_t)tz_rng_below(r, 4);
    }
    if (gaps) pos += d->align * (int64_t)tz_rng_below(r, 3);
    d->flat_numel = pos;
    /* keep tiny buckets to small spaces (at most ~20000 buckets a case) */
    while (pos / (d->bucket_bytes / d->elem_bytes + 1) > 20000)
        d->bucket_bytes *= 10;
    d->offset = c->off;
    d->numel = c->numel;
}

/* All properties of one plan; returns the number of violations (printing the first few). */
static int verify(const tcase *c, const tz_zero_plan *p, unsigned char *count, int verbose) {
    const tz_zero_desc *d = &c->d;
    const int64_t N = d->world, A = d->align, NA = N * A;
    int bad = 0;
#define V(cond, ...) \
    do { \
        if (!(cond)) { \
            if (bad++ < 5 && verbose) { \
                printf("    violated: " __VA_ARGS__); \
                printf("\n"); \
            } \
        } \
    } while (0)
    V(p->bucket_elems % NA == 0 && p->bucket_elems >= NA, "bucket_elems %lld",
      (long long)p->bucket_elems);
    V(p->bucket_elems <=
          (d->bucket_bytes / d->elem_bytes > NA ? d->bucket_bytes / d->elem_bytes : NA),
      "bucket_elems above target");
    int64_t pos = 0, shard = 0, padded = 0;
    for (int k = 0; k < p->n_buckets; k++) {
        const tz_zero_bucket *b = &p->b[k];
        V(b->start == pos, "bucket %d starts at %lld, expected %lld", k, (long long)b->start,
          (long long)pos);
        V(b->len > 0 && b->len <= p->bucket_elems, "bucket %d length %lld", k, (long long)b->len);
        V(b->padded >= b->len && b->padded - b->len < NA && b->padded % NA == 0,
          "bucket %d padded %lld for %lld", k, (long long)b->padded, (long long)b->len);
        V(b->slice * N == b->padded && b->slice % A == 0 && b->start % A == 0,
          "bucket %d slice %lld start %lld", k, (long long)b->slice, (long long)b->start);
        V(b->shard_off == shard, "bucket %d shard offset", k);
        /* first/last tensor by brute force */
        int first = -1, last = -1;
        for (int t = 0; t < d->n_tensors; t++)
            if (c->off[t] < b->start + b->len && c->off[t] + c->numel[t] > b->start) {
                if (first < 0) first = t;
                last = t;
            }
        V(b->first_tensor == first && b->last_tensor == last,
          "bucket %d tensors %d-%d, expected %d-%d", k, b->first_tensor, b->last_tensor, first,
          last);
        for (int r = 0; r < N; r++) {
            int64_t lo, hi;
            tz_zero_plan_slice(p, k, r, &lo, &hi);
            V(lo == b->start + (r * b->slice < b->len ? r * b->slice : b->len),
              "bucket %d rank %d slice start", k, r);
            for (int64_t i = lo; i < hi; i++)
                count[i]++;
        }
        pos += b->len;
        shard += b->slice;
        padded += b->padded;
    }
    V(pos == d->flat_numel, "buckets end at %lld, flat %lld", (long long)pos,
      (long long)d->flat_numel);
    V(shard == p->shard_numel && padded == p->padded_numel && shard * N == padded,
      "shard %lld x %lld vs padded %lld", (long long)shard, (long long)N, (long long)padded);
    int64_t once = 0;
    for (int64_t i = 0; i < d->flat_numel; i++)
        once += count[i] == 1;
    V(once == d->flat_numel, "%lld of %lld elements owned exactly once", (long long)once,
      (long long)d->flat_numel);
    memset(count, 0, (size_t)d->flat_numel);
    /* whole tensors stay whole when they fit; a larger one starts a bucket */
    for (int t = 0; t < d->n_tensors; t++) {
        int b0 = tz_zero_plan_bucket_of(p, c->off[t]);
        int b1 = tz_zero_plan_bucket_of(p, c->off[t] + c->numel[t] - 1);
        if (rup(c->numel[t], A) <= p->bucket_elems)
            V(b0 == b1, "tensor %d split", t);
        else
            V(p->b[b0].start == c->off[t], "big tensor %d does not start its bucket", t);
    }
    /* locate and flat_of agree both ways (every element in small cases, a stride otherwise) */
    int64_t step = d->flat_numel > 40000 ? 97 : 1;
    for (int64_t i = 0; i < d->flat_numel; i += step) {
        tz_zero_loc l = tz_zero_plan_locate(p, i);
        V(tz_zero_plan_flat_of(p, l.owner, l.shard) == i, "flat %lld round trip", (long long)i);
        V(l.in_bucket == i - p->b[l.bucket].start && l.owner == l.in_bucket / p->b[l.bucket].slice,
          "flat %lld location", (long long)i);
    }
    int64_t real = 0;
    for (int r = 0; r < N; r++)
        for (int64_t s = 0; s < p->shard_numel; s += step) {
            int64_t i = tz_zero_plan_flat_of(p, r, s);
            if (i < 0) continue;
            real++;
            tz_zero_loc l = tz_zero_plan_locate(p, i);
            V(l.owner == r && l.shard == s, "shard (%d, %lld) round trip", r, (long long)s);
        }
    if (step == 1)
        V(real == d->flat_numel, "%lld shard elements map into the flat space", (long long)real);
#undef V
    return bad;
}

static void test_random(void) {
    tz_rng r = tz_rng_make(42, 0, TZ_RNG_TEST, 0);
    unsigned char *count = tz_xcalloc(16 << 20, 1);
    tcase c;
    int cases = 2000, bad_cases = 0, split_cases = 0, init_fail = 0, det_fail = 0;
    char err[256];
    for (int n = 0; n < cases; n++) {
        random_case(&c, &r);
        if (c.d.flat_numel > (16 << 20)) continue;
        tz_zero_plan p, q;
        if (tz_zero_plan_init(&p, &c.d, err, sizeof err)) {
            if (init_fail++ < 3) printf("  case %d: %s\n", n, err);
            continue;
        }
        split_cases += p.n_split > 0;
        int bad = verify(&c, &p, count, bad_cases < 3);
        if (bad && bad_cases++ < 3)
            printf(
                "  case %d (N %d, A %lld, bucket %lld B, %d tensors, flat %lld): %d violations\n",
                n, c.d.world, (long long)c.d.align, (long long)c.d.bucket_bytes, c.d.n_tensors,
                (long long)c.d.flat_numel, bad);
        if (tz_zero_plan_init(&q, &c.d, err, sizeof err) || q.n_buckets != p.n_buckets ||
            (p.n_buckets > 0 && memcmp(q.b, p.b, (size_t)p.n_buckets * sizeof *p.b) != 0))
            det_fail++;
        tz_zero_plan_free(&q);
        tz_zero_plan_free(&p);
    }
    free(count);
    check(init_fail == 0, "random: %d valid descriptions rejected", init_fail);
    check(bad_cases == 0,
          "random: %d cases, %d with violations (ownership, alignment, padding, shards)", cases,
          bad_cases);
    check(split_cases > cases / 10, "random: %d cases have a tensor larger than the bucket",
          split_cases);
    check(det_fail == 0, "random: the same description gives the same plan (%d differ)", det_fail);
}

static void test_fixed(void) {
    char err[256];
    tz_zero_plan p;
    /* params-style: sizes 1, 300, 10000 at alignment 256; bucket 4096 fp32 elements, N = 2 */
    int64_t off[3] = {0, 256, 768}, numel[3] = {1, 300, 10000};
    tz_zero_desc d = {768 + 10240, 3, off, numel, 2, 4096 * 4, 4, 256};
    int rc = tz_zero_plan_init(&p, &d, err, sizeof err);
    check(rc == 0, "fixed: init (%s)", rc ? err : "ok");
    if (rc) return;
    /* [0,768) (tensors 0,1) | tensor 2 cut: 4096, 4096, tail 2048 */
    check(p.n_buckets == 4 && p.n_split == 1, "fixed: 4 buckets, 1 split tensor (got %d, %d)",
          p.n_buckets, p.n_split);
    if (p.n_buckets == 4) {
        check(p.b[0].start == 0 && p.b[0].len == 768 && p.b[0].padded == 1024 &&
                  p.b[0].slice == 512 && p.b[0].last_tensor == 1,
              "fixed: bucket 0 = tensors 0-1, 768 padded to 1024");
        check(p.b[1].start == 768 && p.b[1].len == 4096 && p.b[2].len == 4096 &&
                  p.b[3].len == 2048 && p.b[3].first_tensor == 2,
              "fixed: the 10000-element tensor is cut 4096 + 4096 + 2048 (A-aligned)");
        check(p.shard_numel == 512 + 2048 + 2048 + 1024, "fixed: shard %lld elements",
              (long long)p.shard_numel);
        tz_zero_loc l = tz_zero_plan_locate(&p, 768 + 4096 + 2048);
        check(l.bucket == 2 && l.owner == 1 && l.shard == 512 + 2048,
              "fixed: locate in a cut tensor (bucket %d, owner %d, shard %lld)", l.bucket, l.owner,
              (long long)l.shard);
        check(tz_zero_plan_flat_of(&p, 1, 511) == -1 && tz_zero_plan_flat_of(&p, 1, 0) == 512 &&
                  tz_zero_plan_flat_of(&p, 0, 0) == 0,
              "fixed: shard offsets map back, padding maps to -1");
    }
    tz_zero_plan_print(&p);
    tz_zero_plan_free(&p);

    /* one rank: the shard is the flat space */
    d.world = 1;
    rc = tz_zero_plan_init(&p, &d, err, sizeof err);
    check(rc == 0 && p.shard_numel == d.flat_numel && p.padded_numel == d.flat_numel,
          "fixed: N = 1 shard = flat space (%lld)", (long long)p.shard_numel);
    tz_zero_plan_free(&p);

    /* many buckets (the printed table elides the middle); huge bucket: one bucket */
    d.world = 3;
    d.bucket_bytes = 1;
    rc = tz_zero_plan_init(&p, &d, err, sizeof err);
    check(rc == 0 && p.bucket_elems == 768 && p.n_buckets > 12,
          "fixed: 1-byte buckets -> %lld elements, %d buckets", (long long)p.bucket_elems,
          p.n_buckets);
    tz_zero_plan_print(&p);
    tz_zero_plan_free(&p);
    d.bucket_bytes = (int64_t)1 << 40;
    rc = tz_zero_plan_init(&p, &d, err, sizeof err);
    check(rc == 0 && p.n_buckets == 1 && p.b[0].padded == 11520 && p.n_split == 0,
          "fixed: 1 TiB bucket -> one bucket of %lld",
          p.n_buckets ? (long long)p.b[0].padded : 0LL);
    tz_zero_plan_free(&p);

    /* empty space */
    tz_zero_desc e = {0, 0, NULL, NULL, 4, 1 << 20, 4, 256};
    rc = tz_zero_plan_init(&p, &e, err, sizeof err);
    check(rc == 0 && p.n_buckets == 0 && p.shard_numel == 0, "fixed: empty space, no buckets");
    tz_zero_plan_free(&p);
}

static void bad(const char *what, tz_zero_desc d, const char *want) {
    char err[256] = "";
    tz_zero_plan p;
    int rc = tz_zero_plan_init(&p, &d, err, sizeof err);
    check(rc != 0 && strstr(err, want) != NULL, "bad input: %s -> \"%s\"", what, err);
    if (!rc) tz_zero_plan_free(&p);
}

static void test_bad(void) {
    int64_t off[2] = {0, 256}, numel[2] = {300, 10};
    tz_zero_desc d = {512, 2, off, numel, 2, 4096, 4, 256};
    tz_zero_desc x = d;
    x.world = 0;
    bad("world 0", x, "world size");
    x = d;
    x.align = 0;
    bad("alignment 0", x, "alignment");
    x = d;
    x.flat_numel = 500;
    bad("flat length not aligned", x, "multiple of");
    x = d;
    x.bucket_bytes = 0;
    bad("bucket 0 bytes", x, "bucket size");
    int64_t off2[2] = {0, 128};
    x = d;
    x.offset = off2;
    bad("overlapping tensors", x, "overlaps");
    int64_t off3[2] = {0, 320};
    int64_t numel3[2] = {10, 10};
    x = d;
    x.offset = off3;
    x.numel = numel3;
    bad("unaligned tensor", x, "not aligned");
    int64_t numel4[2] = {10, 300};
    x = d;
    x.numel = numel4;
    bad("tensor past the end", x, "runs past");
    int64_t numel5[2] = {300, 0};
    x = d;
    x.numel = numel5;
    bad("empty tensor", x, "0 elements");
}

int main(int argc, char **argv) {
    tz_mpi_singleton_defaults();
    MPI_Init(&argc, &argv); /* only so a TZ_FATAL path could finalise cleanly */
    test_fixed();
    test_bad();
    test_random();
    int rc = tz_check_done("test_zero_plan");
    MPI_Finalize();
    return rc;
}
