/* The NCCL comm's MPI side: finds the CUDA module's NCCL entry points (tz_cuda_module_symbol,
 * in the module backend/registry.c loaded), broadcasts rank 0's ncclUniqueId over the run's host
 * comm, and wraps the module's operations into the comm table (buffers: device memory;
 * stream: the backend's copy queue). NCCL headers stay in cuda/. */
#include "backend/registry.h"
#include "comm/comm_nccl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "comm/comm.h"

typedef struct nccl_fns {
    tz_nccl_load_fn *load;
    tz_nccl_unique_id_fn *unique_id;
    tz_nccl_init_fn *init;
    tz_nccl_start_fn *start;
    tz_nccl_test_fn *test;
    tz_nccl_wait_fn *wait;
    tz_nccl_destroy_fn *destroy;
} nccl_fns;

/* The NCCL entry points of the CUDA module that made `be` (backend/registry.c loaded it): 0, or
 * 1 with why. */
static int find_fns(tz_backend *be, nccl_fns *f, char *why, size_t n) {
    memset(f, 0, sizeof *f);
    if (!be || !be->device || strcmp(be->name, "cuda") != 0) {
        snprintf(why, n, "the NCCL comm needs the CUDA backend (run.device = \"cuda\"), not %s",
                 be ? be->name : "none");
        return 1;
    }
    const char *missing = NULL;
#define TZ_FN(field, sym)                                                                      \
    if (!missing && !(*(void **)&f->field = tz_cuda_module_symbol(sym))) missing = sym;
    TZ_FN(load, TZ_NCCL_SYM_LOAD)
    TZ_FN(unique_id, TZ_NCCL_SYM_UNIQUE_ID)
    TZ_FN(init, TZ_NCCL_SYM_INIT)
    TZ_FN(start, TZ_NCCL_SYM_START)
    TZ_FN(test, TZ_NCCL_SYM_TEST)
    TZ_FN(wait, TZ_NCCL_SYM_WAIT)
    TZ_FN(destroy, TZ_NCCL_SYM_DESTROY)
#undef TZ_FN
    if (missing) {
        snprintf(why, n, "the CUDA module has no NCCL support (no %s)", missing);
        return 1;
    }
    return 0;
}

int tz_comm_nccl_available(tz_backend *be, char *why, size_t n) {
    nccl_fns f;
    if (find_fns(be, &f, why, n)) return 0;
    return f.load(why, n) == 0;
}

typedef struct nccl_ctx {
    nccl_fns f;
    void *h;
} nccl_ctx;

static nccl_ctx *nx(tz_comm *c) { return c->ctx; }

static void *start(tz_comm *c, int op, const void *send, void *recv, int64_t count,
                   const int64_t *counts, enum tz_dtype dt, int root) {
    return nx(c)->f.start(nx(c)->h, op, send, recv, count, counts, (int)dt, root);
}

/* Blocking forms: queued, then waited for (stronger than "ordered on the stream"). */
static void finish(tz_comm *c, void *ev) { nx(c)->f.wait(nx(c)->h, ev); }

static void n_reduce_scatter(tz_comm *c, const void *send, void *recv, int64_t n, enum tz_dtype dt) {
    finish(c, start(c, TZ_NCCL_REDUCE_SCATTER, send, recv, n, NULL, dt, 0));
}

static void n_all_gather(tz_comm *c, const void *send, void *recv, int64_t n, enum tz_dtype dt) {
    finish(c, start(c, TZ_NCCL_ALL_GATHER, send, recv, n, NULL, dt, 0));
}

static void n_all_gatherv(tz_comm *c, const void *send, void *recv, const int64_t *counts,
                          enum tz_dtype dt) {
    finish(c, start(c, TZ_NCCL_ALL_GATHERV, send, recv, 0, counts, dt, 0));
}

static void n_all_reduce(tz_comm *c, const void *send, void *recv, int64_t n, enum tz_dtype dt) {
    finish(c, start(c, TZ_NCCL_ALL_REDUCE, send, recv, n, NULL, dt, 0));
}

static void n_bcast(tz_comm *c, void *buf, int64_t n, enum tz_dtype dt, int root) {
    finish(c, start(c, TZ_NCCL_BCAST, buf, buf, n, NULL, dt, root));
}

static void n_barrier(tz_comm *c) { finish(c, start(c, -1, NULL, NULL, 1, NULL, TZ_DT_I32, 0)); }

static void *n_ireduce_scatter(tz_comm *c, const void *send, void *recv, int64_t n,
                               enum tz_dtype dt) {
    return start(c, TZ_NCCL_REDUCE_SCATTER, send, recv, n, NULL, dt, 0);
}

static void *n_iall_gather(tz_comm *c, const void *send, void *recv, int64_t n, enum tz_dtype dt) {
    return start(c, TZ_NCCL_ALL_GATHER, send, recv, n, NULL, dt, 0);
}

static int n_test(tz_comm *c, void *ev) { return nx(c)->f.test(nx(c)->h, ev); }

static void n_wait(tz_comm *c, void *ev) { nx(c)->f.wait(nx(c)->h, ev); }

static void n_destroy(tz_comm *c) {
    nx(c)->f.destroy(nx(c)->h);
    free(c->ctx);
    free(c);
}

tz_comm *tz_comm_nccl_create(tz_backend *be, tz_comm *host) {
    char why[1200];
    nccl_ctx *x = tz_xcalloc(1, sizeof *x);
    /* the ranks of the run's comm, which need not be MPI_COMM_WORLD's */
    const int rank = host->rank, size = host->size;
    int ok = !find_fns(be, &x->f, why, sizeof why) && x->f.load(why, sizeof why) == 0, all = 0;
    tz_comm_all_reduce(host, &ok, &all, 1, TZ_DT_I32);
    if (!ok)
        TZ_FATAL_HINT("set comm.backend = \"mpi\" (or \"auto\", which falls back to it)",
                      "comm.backend = \"nccl\": %s", why);
    if (all != size) TZ_FATAL("comm.backend = \"nccl\": NCCL cannot be loaded on another rank");
    unsigned char id[TZ_NCCL_ID_BYTES] = {0};
    ok = rank != 0 || x->f.unique_id(id, why, sizeof why) == 0;
    if (!ok) TZ_FATAL("comm.backend = \"nccl\": %s", why);
    tz_comm_bcast(host, id, TZ_NCCL_ID_BYTES, TZ_DT_U8, 0);
    x->h = x->f.init(be, id, rank, size);

    tz_comm *c = tz_xcalloc(1, sizeof *c);
    c->name = "nccl";
    c->rank = rank;
    c->size = size;
    c->ctx = x;
    c->device = 1;
    c->queue = TZ_QUEUE_COPY;
    c->reduce_scatter = n_reduce_scatter;
    c->all_gather = n_all_gather;
    c->all_gatherv = n_all_gatherv;
    c->all_reduce = n_all_reduce;
    c->bcast = n_bcast;
    c->barrier = n_barrier;
    c->ireduce_scatter = n_ireduce_scatter;
    c->iall_gather = n_iall_gather;
    c->test = n_test;
    c->wait = n_wait;
    c->destroy = n_destroy;
    return c;
}

/* ---- comm.backend: the choice ---- */
