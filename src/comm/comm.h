/* Collectives as a table of function pointers (MPI here, NCCL in comm/comm_nccl.h): sums,
 * gathers, broadcasts, non-blocking reduce-scatter. Knows nothing of parameters or plans. */
#ifndef TZ_COMM_H
#define TZ_COMM_H
#include <mpi.h>
#include <stdint.h>

#include "core/backend.h"
#include "core/dtype.h"
#include "comm/fwd.h"

/* Element types a comm moves: F32, F64, BF16, F16, I32, I64, U8. Sums of F32/F64/I32/I64/U8
 * are MPI_SUM; MPI has no 16-bit floats, so BF16 and F16 are summed by a user-defined op that
 * adds two values in fp32 and rounds the result to the type (round to nearest even) at
 * every step of the reduction tree, as NCCL does: keep fp32 where the precision matters.
 *
 * Counts are elements (not bytes), int64_t; counts above INT_MAX (or the comm's call limit)
 * are split into several MPI calls by the implementation, so callers never chunk.
 *
 * Buffers: send and recv must not overlap, except in the in-place forms (those of NCCL):
 *   reduce_scatter: recv == send + rank * recv_count   (the rank's own block of send)
 *   all_gather:     send == recv + rank * send_count   (the rank's own block of recv)
 *   all_reduce:     send == recv
 * In place, the rest of the send buffer (reduce_scatter) is left with unspecified values.
 *
 * Blocking calls return when the result is in recv and send may be reused (MPI); an NCCL
 * table will define them as ordered on its stream, which is all a caller may assume. */

/* tz_comm, and tz_comm_req (a non-blocking operation in flight; finished, and freed, by
 * tz_comm_wait), are named in comm/fwd.h. */

struct tz_comm {
    const char *name; /* "mpi", "nccl" */
    int rank, size;
    void *ctx;        /* implementation state */
    /* Where the buffers of every call live, and where the calls are ordered:
     *   device 0, queue TZ_QUEUE_HOST (MPI): host memory; a call is done when it returns
     *     (blocking) or at wait (non-blocking). Device memory must be staged through host
     *     buffers by the caller (optim/zero.c does: pinned, on the backend's copy queue).
     *   device 1, queue TZ_QUEUE_COPY (NCCL): device memory of the backend the comm was made
     *     with; each call is queued on that backend's copy queue after the work queued so far
     *     on its compute queue, so later copies on the copy queue see its result without
     *     waiting; test polls and wait blocks the host until it has run. The blocking forms
     *     return once the result is in recv. */
    int device;
    int queue;          /* TZ_QUEUE_HOST or TZ_QUEUE_COPY (core/backend.h) */

    /* send: size * recv_count elements, rank-major blocks; recv: recv_count elements, the sum
     * over ranks of block `rank` (MPI_Reduce_scatter_block). */
    void (*reduce_scatter)(tz_comm *c, const void *send, void *recv, int64_t recv_count,
                           enum tz_dtype dt);
    /* send: send_count elements; recv: size * send_count, block r from rank r. */
    void (*all_gather)(tz_comm *c, const void *send, void *recv, int64_t send_count,
                       enum tz_dtype dt);
    /* Blocks of different lengths: rank r sends counts[r] elements (send; counts is the
     * same array on every rank), recv gets every block back to back in rank order (block r
     * at the sum of counts[0..r-1]). In place: send == the rank's own block of recv. */
    void (*all_gatherv)(tz_comm *c, const void *send, void *recv, const int64_t *counts,
                        enum tz_dtype dt);
    void (*all_reduce)(tz_comm *c, const void *send, void *recv, int64_t count,
                       enum tz_dtype dt);
    void (*bcast)(tz_comm *c, void *buf, int64_t count, enum tz_dtype dt, int root);
    void (*barrier)(tz_comm *c);

    /* Non-blocking twins: start the operation and return an implementation handle; the
     * buffers must stay untouched until wait. test: 1 when complete (also drives progress,
     * which MPI needs: call it now and then while computing); wait: completes and frees. */
    void *(*ireduce_scatter)(tz_comm *c, const void *send, void *recv, int64_t recv_count,
                             enum tz_dtype dt);
    void *(*iall_gather)(tz_comm *c, const void *send, void *recv, int64_t send_count,
                         enum tz_dtype dt);
    int (*test)(tz_comm *c, void *handle);
    void (*wait)(tz_comm *c, void *handle);

    void (*destroy)(tz_comm *c); /* frees ctx and c */
};

/* ---- the MPI implementation ---- */

/* Duplicates `comm` (so its traffic never meets the caller's), sets MPI_ERRORS_RETURN on the
 * duplicate (errors come back through MPI_CHECK into TZ_FATAL) and creates the 16-bit float
 * sum ops. Collective over comm. */
tz_comm *tz_comm_mpi_create(MPI_Comm comm);
/* Same, with at most max_call_count elements per MPI call (default INT_MAX), so tests can
 * drive the large-count path with small buffers. */
tz_comm *tz_comm_mpi_create_limited(MPI_Comm comm, int64_t max_call_count);

/* ---- what callers use: checked dispatch through the table ----
 * Each checks its arguments (count >= 0, buffers present when count > 0, a supported dtype,
 * no overlap but the in-place forms, root in range) and stops with TZ_FATAL otherwise. */
void tz_comm_reduce_scatter(tz_comm *c, const void *send, void *recv, int64_t recv_count,
                            enum tz_dtype dt);
void tz_comm_all_gather(tz_comm *c, const void *send, void *recv, int64_t send_count,
                        enum tz_dtype dt);
void tz_comm_all_gatherv(tz_comm *c, const void *send, void *recv, const int64_t *counts,
                         enum tz_dtype dt);
void tz_comm_all_reduce(tz_comm *c, const void *send, void *recv, int64_t count,
                        enum tz_dtype dt);
void tz_comm_bcast(tz_comm *c, void *buf, int64_t count, enum tz_dtype dt, int root);
void tz_comm_barrier(tz_comm *c);
tz_comm_req *tz_comm_ireduce_scatter(tz_comm *c, const void *send, void *recv,
                                     int64_t recv_count, enum tz_dtype dt);
tz_comm_req *tz_comm_iall_gather(tz_comm *c, const void *send, void *recv, int64_t send_count,
                                 enum tz_dtype dt);
/* 1 when the operation has completed (wait must still be called); drives progress. */
int tz_comm_test(tz_comm_req *req);
/* Completes the operation and frees req; NULL is a no-op. */
void tz_comm_wait(tz_comm_req *req);
void tz_comm_destroy(tz_comm *c);

/* Bytes per element of a dtype the comms move; 0 when the dtype is not one of them. */
size_t tz_comm_dtype_size(enum tz_dtype dt);

#endif
