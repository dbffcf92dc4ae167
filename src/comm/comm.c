/* The comm table's checked front door (tz_comm_*) and its MPI implementation: dtype mapping,
 * 16-bit float sum ops, calls split at the count limit, requests. No GPU memory, no NCCL. */
#include "comm/comm.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "comm/watchdog.h"
#include "comm/world.h"

/* ======================= checked dispatch ======================= */

struct tz_comm_req {
    tz_comm *c;
    void *h;
    int64_t seq;    /* the collective's number, for the watchdog */
    const char *op;
};

/* A blocking collective starts: counted, and its wait watched (see comm/watchdog.h). */
static void watch_begin(const char *op) { tz_watch_block(tz_watch_enter(op), op); }

size_t tz_comm_dtype_size(enum tz_dtype dt) {
    switch (dt) {
    case TZ_DT_F32:
    case TZ_DT_I32: return 4;
    case TZ_DT_F64:
    case TZ_DT_I64: return 8;
    case TZ_DT_BF16:
    case TZ_DT_F16: return 2;
    case TZ_DT_U8: return 1;
    default: return 0;
    }
}

static size_t check_args(const tz_comm *c, const char *op, const void *a, const void *b,
                         int64_t count, enum tz_dtype dt) {
    if (!c) TZ_FATAL("%s: no communicator", op);
    size_t es = tz_comm_dtype_size(dt);
    if (!es)
        TZ_FATAL_HINT("communicate F32, F64, BF16, F16, I32, I64 or U8",
                      "%s on comm %s: dtype %s is not supported", op, c->name, tz_dtype_name(dt));
    if (count < 0) TZ_FATAL("%s on comm %s: negative count %lld", op, c->name, (long long)count);
    if (count > 0 && (!a || !b)) TZ_FATAL("%s on comm %s: NULL buffer", op, c->name);
    if ((uint64_t)count > (uint64_t)INT64_MAX / es / (uint64_t)c->size)
        TZ_FATAL("%s on comm %s: count %lld overflows", op, c->name, (long long)count);
    return es;
}

/* [a, a+an) and [b, b+bn) overlap, except when a == b + off exactly (the in-place form). */
static void check_overlap(const tz_comm *c, const char *op, const void *a, size_t an, const void *b,
                          size_t bn, size_t off) {
    uintptr_t pa = (uintptr_t)a, pb = (uintptr_t)b;
    if (an == 0 || bn == 0 || pa == pb + off) return;
    if (pa < pb + bn && pb < pa + an)
        TZ_FATAL_HINT("pass separate buffers, or the exact in-place form described in comm.h",
                      "%s on comm %s: send and receive buffers overlap", op, c->name);
}

void tz_comm_reduce_scatter(tz_comm *c, const void *send, void *recv, int64_t recv_count,
                            enum tz_dtype dt) {
    size_t es = check_args(c, "reduce_scatter", send, recv, recv_count, dt);
    size_t blk = (size_t)recv_count * es;
    check_overlap(c, "reduce_scatter", recv, blk, send, blk * (size_t)c->size,
                  (size_t)c->rank * blk);
    watch_begin("reduce_scatter");
    c->reduce_scatter(c, send, recv, recv_count, dt);
    tz_watch_unblock();
}

void tz_comm_all_gather(tz_comm *c, const void *send, void *recv, int64_t send_count,
                        enum tz_dtype dt) {
    size_t es = check_args(c, "all_gather", send, recv, send_count, dt);
    size_t blk = (size_t)send_count * es;
    check_overlap(c, "all_gather", send, blk, recv, blk * (size_t)c->size, (size_t)c->rank * blk);
    watch_begin("all_gather");
    c->all_gather(c, send, recv, send_count, dt);
    tz_watch_unblock();
}

void tz_comm_all_gatherv(tz_comm *c, const void *send, void *recv, const int64_t *counts,
                         enum tz_dtype dt) {
    if (!c || !counts) TZ_FATAL("all_gatherv: no communicator or no counts");
    int64_t total = 0, own = 0;
    for (int r = 0; r < c->size; r++) {
        if (counts[r] < 0 || counts[r] > INT64_MAX / 16 - total)
            TZ_FATAL("all_gatherv on comm %s: count %lld of rank %d invalid", c->name,
                     (long long)counts[r], r);
        if (r == c->rank) own = total;
        total += counts[r];
    }
    size_t es = check_args(c, "all_gatherv", counts[c->rank] ? send : recv, recv, total, dt);
    check_overlap(c, "all_gatherv", send, (size_t)counts[c->rank] * es, recv,
                  (size_t)total * es, (size_t)own * es);
    if (!c->all_gatherv) TZ_FATAL("comm %s has no all_gatherv", c->name);
    watch_begin("all_gatherv");
    c->all_gatherv(c, send, recv, counts, dt);
    tz_watch_unblock();
}

void tz_comm_all_reduce(tz_comm *c, const void *send, void *recv, int64_t count, enum tz_dtype dt) {
    size_t es = check_args(c, "all_reduce", send, recv, count, dt);
    check_overlap(c, "all_reduce", send, (size_t)count * es, recv, (size_t)count * es, 0);
    watch_begin("all_reduce");
    c->all_reduce(c, send, recv, count, dt);
    tz_watch_unblock();
}

void tz_comm_bcast(tz_comm *c, void *buf, int64_t count, enum tz_dtype dt, int root) {
    check_args(c, "bcast", buf, buf, count, dt);
    if (root < 0 || root >= c->size)
        TZ_FATAL("bcast on comm %s: root %d is not a rank of %d", c->name, root, c->size);
    watch_begin("bcast");
    c->bcast(c, buf, count, dt, root);
    tz_watch_unblock();
}

void tz_comm_barrier(tz_comm *c) {
    if (!c) TZ_FATAL("barrier: no communicator");
    watch_begin("barrier");
    c->barrier(c);
    tz_watch_unblock();
}

static tz_comm_req *make_req(tz_comm *c, void *h, int64_t seq, const char *op) {
    tz_comm_req *r = tz_xmalloc(sizeof *r);
    r->c = c;
    r->h = h;
    r->seq = seq;
    r->op = op;
    return r;
}

tz_comm_req *tz_comm_ireduce_scatter(tz_comm *c, const void *send, void *recv, int64_t recv_count,
                                     enum tz_dtype dt) {
    size_t es = check_args(c, "ireduce_scatter", send, recv, recv_count, dt);
    if (!c->ireduce_scatter) TZ_FATAL("comm %s has no ireduce_scatter", c->name);
    size_t blk = (size_t)recv_count * es;
    check_overlap(c, "ireduce_scatter", recv, blk, send, blk * (size_t)c->size,
                  (size_t)c->rank * blk);
    int64_t k = tz_watch_enter("reduce_scatter (non-blocking)");
    return make_req(c, c->ireduce_scatter(c, send, recv, recv_count, dt), k,
                    "reduce_scatter (non-blocking)");
}

tz_comm_req *tz_comm_iall_gather(tz_comm *c, const void *send, void *recv, int64_t send_count,
                                 enum tz_dtype dt) {
    size_t es = check_args(c, "iall_gather", send, recv, send_count, dt);
    if (!c->iall_gather) TZ_FATAL("comm %s has no iall_gather", c->name);
    size_t blk = (size_t)send_count * es;
    check_overlap(c, "iall_gather", send, blk, recv, blk * (size_t)c->size, (size_t)c->rank * blk);
    int64_t k = tz_watch_enter("all_gather (non-blocking)");
    return make_req(c, c->iall_gather(c, send, recv, send_count, dt), k,
                    "all_gather (non-blocking)");
}

int tz_comm_test(tz_comm_req *req) {
    if (!req) return 1;
    return req->c->test(req->c, req->h);
}

void tz_comm_wait(tz_comm_req *req) {
    if (!req) return;
    tz_watch_block(req->seq, req->op);
    req->c->wait(req->c, req->h);
    tz_watch_unblock();
    free(req);
}

void tz_comm_destroy(tz_comm *c) {
    if (c) c->destroy(c);
}

/* ======================= MPI implementation ======================= */

typedef struct mpi_ctx {
    MPI_Comm comm;     /* private duplicate, MPI_ERRORS_RETURN */
    int64_t max_count; /* elements per MPI call */
    MPI_Op sum_bf16, sum_f16;
} mpi_ctx;

/* A request: the MPI requests of every call it was split into, and a move to do once they
 * are complete (the in-place reduce-scatter leaves the result at the start of the buffer). */
typedef struct mpi_req {
    int n, cap;
    MPI_Request *r;
    void *move_dst;
    const void *move_src;
    size_t move_bytes;
} mpi_req;

static void sum_bf16_fn(void *in, void *inout, int *len, MPI_Datatype *type) {
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++)
        b[i] = tz_f32_to_bf16(tz_bf16_to_f32(a[i]) + tz_bf16_to_f32(b[i]));
}

static void sum_f16_fn(void *in, void *inout, int *len, MPI_Datatype *type) {
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++)
        b[i] = tz_f32_to_f16(tz_f16_to_f32(a[i]) + tz_f16_to_f32(b[i]));
}

static MPI_Datatype mpi_type(enum tz_dtype dt) {
    switch (dt) {
    case TZ_DT_F32: return MPI_FLOAT;
    case TZ_DT_F64: return MPI_DOUBLE;
    case TZ_DT_BF16:
    case TZ_DT_F16: return MPI_UINT16_T; /* summed by the user ops */
    case TZ_DT_I32: return MPI_INT32_T;
    case TZ_DT_I64: return MPI_INT64_T;
    case TZ_DT_U8: return MPI_UINT8_T;
    default: TZ_FATAL("dtype %s has no MPI type", tz_dtype_name(dt));
    }
}

static MPI_Op mpi_sum(const mpi_ctx *x, enum tz_dtype dt) {
    if (dt == TZ_DT_BF16) return x->sum_bf16;
    if (dt == TZ_DT_F16) return x->sum_f16;
    return MPI_SUM;
}

static mpi_ctx *ctx_of(tz_comm *c) { return c->ctx; }

static char *at(const void *p, int64_t elems, size_t es) { return (char *)p + (size_t)elems * es; }

static MPI_Request *next_req(mpi_req *q) {
    if (!q) return NULL;
    if (q->n == q->cap) {
        q->cap = q->cap ? 2 * q->cap : 4;
        q->r = tz_xrealloc(q->r, (size_t)q->cap * sizeof *q->r);
    }
    return &q->r[q->n++];
}

/* One body per collective; q == NULL: blocking calls, else non-blocking ones into q. */
static void rs_body(tz_comm *c, const void *send, void *recv, int64_t n, enum tz_dtype dt,
                    mpi_req *q) {
    mpi_ctx *x = ctx_of(c);
    const size_t es = tz_comm_dtype_size(dt);
    const MPI_Datatype T = mpi_type(dt);
    const MPI_Op op = mpi_sum(x, dt);
    const int in_place = recv == at(send, (int64_t)c->rank * n, es);
    if (n == 0) return;
    if (c->size == 1) {
        if (!in_place) memcpy(recv, send, (size_t)n * es);
        return;
    }
    if (n <= x->max_count) {
        const void *sb = in_place ? MPI_IN_PLACE : send;
        void *rb = in_place ? (void *)send : recv; /* in place: input and result in send */
        if (q)
            MPI_CHECK(MPI_Ireduce_scatter_block(sb, rb, (int)n, T, op, x->comm, next_req(q)));
        else
            MPI_CHECK(MPI_Reduce_scatter_block(sb, rb, (int)n, T, op, x->comm));
        if (in_place && c->rank != 0) { /* the result is at the start of the buffer */
            if (q) {
                q->move_dst = recv;
                q->move_src = send;
                q->move_bytes = (size_t)n * es;
            } else {
                memmove(recv, send, (size_t)n * es);
            }
        }
        return;
    }
    /* large counts: one rooted reduction per (piece, owner); rank r's block stays in place */
    for (int64_t off = 0; off < n; off += x->max_count) {
        const int len = (int)(n - off < x->max_count ? n - off : x->max_count);
        for (int r = 0; r < c->size; r++) {
            const void *sb = at(send, (int64_t)r * n + off, es);
            void *rb = r == c->rank ? at(recv, off, es) : NULL;
            if (r == c->rank && in_place) sb = MPI_IN_PLACE;
            if (q)
                MPI_CHECK(MPI_Ireduce(sb, rb, len, T, op, r, x->comm, next_req(q)));
            else
                MPI_CHECK(MPI_Reduce(sb, rb, len, T, op, r, x->comm));
        }
    }
}

static void ag_body(tz_comm *c, const void *send, void *recv, int64_t n, enum tz_dtype dt,
                    mpi_req *q) {
    mpi_ctx *x = ctx_of(c);
    const size_t es = tz_comm_dtype_size(dt);
    const MPI_Datatype T = mpi_type(dt);
    void *own = at(recv, (int64_t)c->rank * n, es);
    const int in_place = send == own;
    if (n == 0) return;
    if (!in_place && (c->size == 1 || n > x->max_count)) memcpy(own, send, (size_t)n * es);
    if (c->size == 1) return;
    if (n <= x->max_count) {
        const void *sb = in_place ? MPI_IN_PLACE : send;
        if (q)
            MPI_CHECK(MPI_Iallgather(sb, (int)n, T, recv, (int)n, T, x->comm, next_req(q)));
        else
            MPI_CHECK(MPI_Allgather(sb, (int)n, T, recv, (int)n, T, x->comm));
        return;
    }
    /* large counts: every rank broadcasts its block piece by piece */
    for (int64_t off = 0; off < n; off += x->max_count) {
        const int len = (int)(n - off < x->max_count ? n - off : x->max_count);
        for (int r = 0; r < c->size; r++) {
            void *b = at(recv, (int64_t)r * n + off, es);
            if (q)
                MPI_CHECK(MPI_Ibcast(b, len, T, r, x->comm, next_req(q)));
            else
                MPI_CHECK(MPI_Bcast(b, len, T, r, x->comm));
        }
    }
}

/* MPI_Allgatherv while every count and offset fits an int and the call limit; else each
 * rank broadcasts its block piece by piece (what NCCL, which has no allgatherv, does too). */
static void mpi_all_gatherv(tz_comm *c, const void *send, void *recv, const int64_t *counts,
                            enum tz_dtype dt) {
    mpi_ctx *x = ctx_of(c);
    const size_t es = tz_comm_dtype_size(dt);
    const MPI_Datatype T = mpi_type(dt);
    int64_t total = 0, own = 0;
    for (int r = 0; r < c->size; r++) {
        if (r == c->rank) own = total;
        total += counts[r];
    }
    void *mine = at(recv, own, es);
    const int in_place = send == mine;
    if (!in_place && counts[c->rank]) memcpy(mine, send, (size_t)counts[c->rank] * es);
    if (c->size == 1 || total == 0) return;
    if (total <= x->max_count) {
        int *cn = tz_xmalloc((size_t)c->size * sizeof *cn), *dp = tz_xmalloc((size_t)c->size * sizeof *dp);
        for (int r = 0, d = 0; r < c->size; d += (int)counts[r], r++) cn[r] = (int)counts[r], dp[r] = d;
        MPI_CHECK(MPI_Allgatherv(MPI_IN_PLACE, 0, T, recv, cn, dp, T, x->comm));
        free(cn);
        free(dp);
        return;
    }
    int64_t d = 0;
    for (int r = 0; r < c->size; d += counts[r], r++)
        for (int64_t off = 0; off < counts[r]; off += x->max_count) {
            const int len = (int)(counts[r] - off < x->max_count ? counts[r] - off : x->max_count);
            MPI_CHECK(MPI_Bcast(at(recv, d + off, es), len, T, r, x->comm));
        }
}

static void mpi_reduce_scatter(tz_comm *c, const void *send, void *recv, int64_t n,
                               enum tz_dtype dt) {
    rs_body(c, send, recv, n, dt, NULL);
}

static void mpi_all_gather(tz_comm *c, const void *send, void *recv, int64_t n, enum tz_dtype dt) {
    ag_body(c, send, recv, n, dt, NULL);
}

static void mpi_all_reduce(tz_comm *c, const void *send, void *recv, int64_t n, enum tz_dtype dt) {
    mpi_ctx *x = ctx_of(c);
    const size_t es = tz_comm_dtype_size(dt);
    const int in_place = send == recv;
    if (c->size == 1) {
        if (!in_place && n > 0) memcpy(recv, send, (size_t)n * es);
        return;
    }
    for (int64_t off = 0; off < n; off += x->max_count) {
        const int len = (int)(n - off < x->max_count ? n - off : x->max_count);
        const void *sb = in_place ? MPI_IN_PLACE : at(send, off, es);
        MPI_CHECK(MPI_Allreduce(sb, at(recv, off, es), len, mpi_type(dt), mpi_sum(x, dt), x->comm));
    }
}

static void mpi_bcast(tz_comm *c, void *buf, int64_t n, enum tz_dtype dt, int root) {
    mpi_ctx *x = ctx_of(c);
    const size_t es = tz_comm_dtype_size(dt);
    if (c->size == 1) return;
    for (int64_t off = 0; off < n; off += x->max_count) {
        const int len = (int)(n - off < x->max_count ? n - off : x->max_count);
        MPI_CHECK(MPI_Bcast(at(buf, off, es), len, mpi_type(dt), root, x->comm));
    }
}

static void mpi_barrier(tz_comm *c) { MPI_CHECK(MPI_Barrier(ctx_of(c)->comm)); }

static void *mpi_ireduce_scatter(tz_comm *c, const void *send, void *recv, int64_t n,
                                 enum tz_dtype dt) {
    mpi_req *q = tz_xcalloc(1, sizeof *q);
    rs_body(c, send, recv, n, dt, q);
    return q;
}

static void *mpi_iall_gather(tz_comm *c, const void *send, void *recv, int64_t n,
                             enum tz_dtype dt) {
    mpi_req *q = tz_xcalloc(1, sizeof *q);
    ag_body(c, send, recv, n, dt, q);
    return q;
}

static void finish_move(mpi_req *q) {
    if (q->move_bytes) memmove(q->move_dst, q->move_src, q->move_bytes);
    q->move_bytes = 0;
}

static int mpi_test(tz_comm *c, void *h) {
    mpi_req *q = h;
    int done = 1;
    if (q->n > 0) MPI_CHECK(MPI_Testall(q->n, q->r, &done, MPI_STATUSES_IGNORE));
    if (done) finish_move(q);
    return done;
}

static void mpi_wait(tz_comm *c, void *h) {
    mpi_req *q = h;
    if (q->n > 0) MPI_CHECK(MPI_Waitall(q->n, q->r, MPI_STATUSES_IGNORE));
    finish_move(q);
    free(q->r);
    free(q);
}

static void mpi_destroy(tz_comm *c) {
    mpi_ctx *x = ctx_of(c);
    int down = 0;
    MPI_Finalized(&down);
    if (!down) {
        MPI_Op_free(&x->sum_bf16);
        MPI_Op_free(&x->sum_f16);
        MPI_Comm_free(&x->comm);
    }
    free(x);
    free(c);
}

tz_comm *tz_comm_mpi_create_limited(MPI_Comm comm, int64_t max_call_count) {
    int up = 0;
    MPI_Initialized(&up);
    if (!up) TZ_FATAL("MPI is not initialised; call MPI_Init before creating a comm");
    if (max_call_count < 1 || max_call_count > INT_MAX)
        TZ_FATAL("max_call_count %lld is outside [1, INT_MAX]", (long long)max_call_count);
    mpi_ctx *x = tz_xcalloc(1, sizeof *x);
    MPI_CHECK(MPI_Comm_dup(comm, &x->comm));
    MPI_CHECK(MPI_Comm_set_errhandler(x->comm, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Op_create(sum_bf16_fn, 1, &x->sum_bf16));
    MPI_CHECK(MPI_Op_create(sum_f16_fn, 1, &x->sum_f16));
    x->max_count = max_call_count;

    tz_comm *c = tz_xcalloc(1, sizeof *c);
    c->name = "mpi";
    c->ctx = x;
    c->device = 0;
    c->queue = TZ_QUEUE_HOST;
    MPI_CHECK(MPI_Comm_rank(x->comm, &c->rank));
    MPI_CHECK(MPI_Comm_size(x->comm, &c->size));
    c->reduce_scatter = mpi_reduce_scatter;
    c->all_gather = mpi_all_gather;
    c->all_gatherv = mpi_all_gatherv;
    c->all_reduce = mpi_all_reduce;
    c->bcast = mpi_bcast;
    c->barrier = mpi_barrier;
    c->ireduce_scatter = mpi_ireduce_scatter;
    c->iall_gather = mpi_iall_gather;
    c->test = mpi_test;
    c->wait = mpi_wait;
    c->destroy = mpi_destroy;
    return c;
}

tz_comm *tz_comm_mpi_create(MPI_Comm comm) { return tz_comm_mpi_create_limited(comm, INT_MAX); }
