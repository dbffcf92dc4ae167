/* ZeRO at run time: buckets of the flat gradients communicated as backward produces them
 * (reduce-scatter in stage 2, all-reduce in stages 0/1), the host shard, the sharded step. */
#include "optim/zero.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "comm/comm.h"
#include "comm/world.h"

static int own_rank(const tz_zero *z) { return z->stage == 0 ? 0 : z->comm->rank; }

/* Flat offset of the first element of rank r's slice of bucket b. */
static int64_t slice_base(const tz_zero_bucket *b, int r) { return b->start + (int64_t)r * b->slice; }

void tz_zero_init(tz_zero *z, int stage, double bucket_mb, const tz_optim *opt, tz_params *ps,
                  tz_backend *be, tz_comm *comm, const tz_world *world) {
    tz_zero_init_comms(z, stage, bucket_mb, opt, ps, be, comm, comm, world);
}

/* Host buffers: pinned where a device copy reads or writes them (dma), else plain memory
 * (MPI's buffers, the host backend's). */
static void *host_buf(tz_zero *z, size_t bytes, int dma) {
    return dma ? z->be->host_alloc(z->be, bytes) : tz_xmalloc(bytes);
}

static void host_buf_free(tz_zero *z, void *p, int dma) {
    if (dma) z->be->host_free(z->be, p);
    else free(p);
}

/* Which host buffers the device's copies use (nothing on a host backend):
 *   the accumulator: the owned slices land there by copy with NCCL (pipelined, fresh) and
 *     on one rank (no collective: the bucket is the slice); with MPI on several ranks they
 *     reach it through MPI from hstage or host_tmp;
 *   recv: the copy's target with NCCL and on one rank, MPI's receive buffer otherwise;
 *   wsend: the quantized pieces uploaded from where the weights are not all-gathered, wrecv
 *     every piece where they are;
 *   the master: where nothing is gathered, the dense pieces are uploaded straight from it
 *     (the copy queue; tz_zero_step waits for them before it changes the master). */
static int acc_dma(const tz_zero *z) {
    return z->be->device && (z->dcomm->device || z->comm->size == 1);
}
static int recv_dma(const tz_zero *z) {
    return z->be->device && (z->dcomm->device || z->comm->size == 1);
}
static int gathers(const tz_zero *z) { return z->stage > 0 && z->comm->size > 1; }
/* The dense pieces go from the master to the device as they are (no packing) */
static int master_dma(const tz_zero *z) {
    return z->be->device && !gathers(z) && z->zw.dense_params > 0;
}

/* Waits for the last push's copies from the master (before the master changes or goes). */
static void master_quiet(tz_zero *z) {
    if (!z->wdone) return;
    z->be->event_wait(z->be, z->wdone, TZ_QUEUE_HOST);
    z->be->event_free(z->be, z->wdone);
    z->wdone = NULL;
    for (int b = 1; z->wev && b < z->plan.n_buckets; b++) /* (wev[0] is wdone) */
        if (z->wev[b]) z->be->event_free(z->be, z->wev[b]);
    if (z->wev) memset(z->wev, 0, (size_t)z->plan.n_buckets * sizeof *z->wev);
    z->wfloor = 0;
}

void tz_zero_quiet(tz_zero *z) { master_quiet(z); }

/* The params' weights hook (wstaged): the compute queue waits for the uploads of every
 * bucket from the one holding flat offset lo up (the copy queue did them from the top). */
static void weights_needed(void *ctx, int64_t lo) {
    tz_zero *z = ctx;
    int b = z->wfloor - 1;
    if (b < 0 || !z->wev || !z->wev[b] || lo >= z->plan.b[b].start + z->plan.b[b].len) return;
    while (b > 0 && z->plan.b[b].start > lo) b--;
    z->be->event_wait(z->be, z->wev[b], TZ_QUEUE_COMPUTE);
    z->wfloor = b;
}

void tz_zero_init_comms(tz_zero *z, int stage, double bucket_mb, const tz_optim *opt,
                        tz_params *ps, tz_backend *be, tz_comm *comm, tz_comm *dcomm,
                        const tz_world *world) {
    memset(z, 0, sizeof *z);
    z->stage = stage;
    z->be = be;
    z->comm = comm;
    z->dcomm = dcomm ? dcomm : comm;
    z->world = world;
    z->ps = ps;
    if (comm->device) TZ_FATAL("zero: the comm for host memory is %s, a device comm", comm->name);
    if (z->dcomm->device && !be->device)
        TZ_FATAL("zero: comm %s moves device memory, but the backend is %s", z->dcomm->name,
                 be->name);
    if (z->dcomm->size != comm->size || z->dcomm->rank != comm->rank)
        TZ_FATAL("zero: comms %s and %s have different ranks", comm->name, z->dcomm->name);
    /* one rank's reduce-scatter is the identity: stage 2 on the host then reads the
     * gradients in place; a device backend always goes through the pipeline, whose copies
     * to the host run beside backward */
    z->pipelined = stage == 2 && (comm->size > 1 || be->device);
    const int64_t F = ps->flat_numel;
    z->grad = be->alloc(be, (size_t)F * sizeof(float));
    tz_params_bind_grads(ps, z->grad);

    /* trainable tensors in flat order */
    int64_t *off = tz_xmalloc((size_t)ps->n * sizeof *off), *num = tz_xmalloc((size_t)ps->n * sizeof *num);
    int nt = 0;
    for (int i = ps->n - 1; i >= 0; i--) /* registration order reversed = flat order */
        if (ps->p[i]->trainable) off[nt] = ps->p[i]->flat_off, num[nt++] = ps->p[i]->numel;
    tz_zero_desc d = {.flat_numel = F, .n_tensors = nt, .offset = off, .numel = num,
                      .world = stage == 0 ? 1 : comm->size,
                      .bucket_bytes = (int64_t)(bucket_mb * 1048576.0), .elem_bytes = 4,
                      .align = TZ_FLAT_ALIGN};
    if (d.bucket_bytes < 1) d.bucket_bytes = 1;
    char err[512];
    if (tz_zero_plan_init(&z->plan, &d, err, sizeof err)) TZ_FATAL("zero plan: %s", err);
    free(off);
    free(num);

    /* the host shard, on this rank's NUMA node (the GPU's, where the trainer bound it); the
     * accumulator pinned where the device copies into it (where pinning is refused it stays
     * pageable: slower copies, the backend warns once) */
    tz_shard_init(&z->sh, opt, z->plan.shard_numel, world);
    if (acc_dma(z)) {
        be->host_register(be, z->sh.acc, (size_t)z->sh.n * sizeof(float));
        z->pinned = 1;
    }

    /* master <- this rank's slice of the weights (a quantized weight's dense source, or its
     * decoded value: train/zero_weights); decay flags per element */
    tz_zero_weights_init(&z->zw, &z->plan, ps);
    /* per flat element: 0 gap, 1 parameter, 2 parameter with weight decay */
    uint8_t *flat_kind = tz_xcalloc((size_t)F + 1, 1);
    for (int i = 0; i < ps->n; i++)
        if (ps->p[i]->trainable)
            memset(flat_kind + ps->p[i]->flat_off, ps->p[i]->decay ? 2 : 1, (size_t)ps->p[i]->numel);
    const int r = own_rank(z);
    for (int b = 0; b < z->plan.n_buckets; b++) {
        const tz_zero_bucket *bk = &z->plan.b[b];
        int64_t begin, end;
        tz_zero_plan_slice(&z->plan, b, r, &begin, &end);
        if (end <= begin) continue;
        int64_t at = bk->shard_off + (begin - slice_base(bk, r));
        tz_zero_weights_read(&z->zw, be, b, r, z->sh.master + bk->shard_off);
        for (int64_t f = begin; f < end; f++) {
            z->sh.decay[at + f - begin] = flat_kind[f] == 2;
            z->owned_params += flat_kind[f] != 0;
        }
    }
    free(flat_kind);
    tz_params_drop_init(ps); /* the dense sources of quantized weights are in the master now */
    if (master_dma(z)) {
        be->host_register(be, z->sh.master, (size_t)z->sh.n * sizeof(float));
        z->master_pinned = 1;
        /* a model that asks for its weights stage by stage gets them in forward order */
        const char *e = getenv("TZ_WEIGHTS_STAGED"); /* 0: all at once (for comparison) */
        if (ps->weights_staged && z->zw.quant_params == 0 && !(e && !strcmp(e, "0"))) {
            z->wstaged = 1;
            z->wev = tz_xcalloc((size_t)z->plan.n_buckets, sizeof *z->wev);
            ps->weights_hook = weights_needed;
            ps->weights_hook_ctx = z;
        }
    }

    const int64_t B = z->plan.bucket_elems;
    if (!z->pipelined) /* the blocking path's bucket: downloaded into */
        z->host_tmp = host_buf(z, (size_t)B * sizeof(float), be->device);
    z->wsend = host_buf(z, (size_t)z->zw.max_chunk + 8, be->device && !gathers(z));
    if (gathers(z)) z->wrecv = host_buf(z, (size_t)z->zw.max_bucket + 8, be->device);
    if (z->pipelined)
        for (int s = 0; s < TZ_ZERO_SLOTS; s++) {
            if (!be->device || z->dcomm->device) /* the bucket, padded, on the backend */
                z->stage_buf[s] = be->alloc(be, (size_t)B * sizeof(float));
            else if (comm->size > 1) /* the bucket, padded, in pinned host memory:
                                        * downloaded into, then MPI */
                z->hstage[s] = be->host_alloc(be, (size_t)B * sizeof(float));
            z->recv[s] = host_buf(z, (size_t)(B / comm->size + 1) * sizeof(float), recv_dma(z));
            z->slot_bucket[s] = -1;
        }
}

void tz_zero_free(tz_zero *z) {
    if (z->dev) {
        z->be->release(z->be, z->d_master);
        for (int i = 0; i < z->sh.opt->n_states; i++) z->be->release(z->be, z->d_state[i]);
        z->be->release(z->be, z->d_decay);
    }
    master_quiet(z);
    if (z->ps && z->ps->weights_hook_ctx == z) z->ps->weights_hook = NULL, z->ps->weights_hook_ctx = NULL;
    free(z->wev);
    if (z->pinned) z->be->host_unregister(z->be, z->sh.acc);
    if (z->master_pinned) z->be->host_unregister(z->be, z->sh.master);
    tz_shard_free(&z->sh);
    for (int s = 0; s < TZ_ZERO_SLOTS; s++) {
        if (z->stage_buf[s]) z->be->release(z->be, z->stage_buf[s]);
        if (z->hstage[s]) z->be->host_free(z->be, z->hstage[s]);
        if (z->recv[s]) host_buf_free(z, z->recv[s], recv_dma(z));
    }
    if (z->host_tmp) host_buf_free(z, z->host_tmp, z->be->device);
    host_buf_free(z, z->wsend, z->be->device && !gathers(z));
    if (z->wrecv) host_buf_free(z, z->wrecv, z->be->device);
    tz_zero_weights_free(&z->zw);
    z->be->release(z->be, z->grad);
    tz_zero_plan_free(&z->plan);
    memset(z, 0, sizeof *z);
}

void tz_zero_begin_step(tz_zero *z) {
    /* the accumulator needs no zeroing: the step's first gradients overwrite it (fresh) */
    z->be->fill(z->be, z->grad, 0.0f, z->ps->flat_numel);
    z->fresh = 1;
}

void tz_zero_begin_micro(tz_zero *z, int last) {
    if (z->dev) { /* the gradients accumulate in the buffer over the step's micro-batches */
        z->communicate = 0;
        return;
    }
    /* stage 2 moves every micro-batch's gradients to the host shard, so the buffer restarts
     * from zero; stages 0/1 accumulate on the device and communicate once, at the end */
    if (z->stage == 2 && z->next_bucket > 0) z->be->fill(z->be, z->grad, 0.0f, z->ps->flat_numel);
    z->next_bucket = 0;
    z->communicate = z->stage == 2 || last;
}

/* ---- host memory at memory bandwidth: every thread, elementwise (the same bits) ---- */

#define PAR_MIN 32768 /* elements below which a loop runs on the calling thread */

static void host_copy(float *restrict dst, const float *restrict src, int64_t n) {
    tz_host_copy(dst, src, (size_t)n * sizeof(float));
}

static void host_add(float *restrict dst, const float *restrict src, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= PAR_MIN)
    for (int64_t i = 0; i < n; i++) dst[i] += src[i];
}

static void clock_add(tz_zero *z, int phase, double t0, double bytes) {
    z->clock[phase].seconds += omp_get_wtime() - t0;
    z->clock[phase].bytes += bytes;
}

/* dst (n shard elements) gets host gradients src: written by the step's first gradients,
 * added to by later micro-batches'. */
static void take_grads(tz_zero *z, float *dst, const float *src, int64_t n) {
    const double t0 = omp_get_wtime();
    if (z->fresh) host_copy(dst, src, n);
    else host_add(dst, src, n);
    clock_add(z, TZ_ZERO_GRADS, t0, (double)n * (z->fresh ? 8.0 : 12.0));
}

/* Device backend, MPI: the slots whose bucket is on the host start their reduce-scatter, in
 * bucket order (every rank starts its collectives in the same order). Slots up to and
 * including `through` (the oldest first) are waited for; later ones only if their copy is
 * done already. through < 0: none waited for. */
static void start_copied(tz_zero *z, int through) {
    tz_backend *be = z->be;
    int blocking = through >= 0;
    for (int k = 0; k < TZ_ZERO_SLOTS; k++) {
        const int s = (z->next_slot + k) % TZ_ZERO_SLOTS;
        if (z->slot_state[s] != TZ_ZERO_COPYING) continue;
        if (blocking) be->event_wait(be, z->ev[s], TZ_QUEUE_HOST);
        else if (!be->event_done(be, z->ev[s])) return;
        be->event_free(be, z->ev[s]);
        z->ev[s] = NULL;
        z->req[s] = tz_comm_ireduce_scatter(z->comm, z->hstage[s], z->slot_recv[s],
                                            z->plan.b[z->slot_bucket[s]].slice, TZ_DT_F32);
        z->slot_state[s] = TZ_ZERO_COMM;
        if (s == through) blocking = 0;
    }
}

static void finish_slot(tz_zero *z, int s) {
    if (z->slot_state[s] == TZ_ZERO_IDLE) return;
    if (z->slot_state[s] == TZ_ZERO_COPYING) start_copied(z, s);
    tz_comm_wait(z->req[s]);
    z->req[s] = NULL;
    if (z->ev[s]) { /* NCCL: the slice's copy to the host, queued after the reduce-scatter */
        z->be->event_wait(z->be, z->ev[s], TZ_QUEUE_HOST);
        z->be->event_free(z->be, z->ev[s]);
        z->ev[s] = NULL;
    }
    z->slot_state[s] = TZ_ZERO_IDLE;
    const tz_zero_bucket *bk = &z->plan.b[z->slot_bucket[s]];
    /* a fresh step's slice was reduce-scattered straight into the accumulator */
    if (!z->fresh) take_grads(z, z->sh.acc + bk->shard_off, z->recv[s], bk->slice);
}

/* Stage 2 on a device backend: bucket b of the gradients leaves the device without the host
 * waiting for it (the compute queue goes on with backward). */
static void launch_device(tz_zero *z, int b, int s, float *recv) {
    const tz_zero_bucket *bk = &z->plan.b[b];
    tz_backend *be = z->be;
    if (!z->dcomm->device && z->comm->size == 1) {
        /* one rank: the reduce-scatter is the identity, so the bucket is downloaded straight
         * into its slice (pinned), its padding zeroed, and no collective runs */
        void *after = be->event_mark(be, TZ_QUEUE_COMPUTE);
        be->event_wait(be, after, TZ_QUEUE_COPY);
        be->event_free(be, after);
        be->download_async(be, recv, z->grad + bk->start, (size_t)bk->len * sizeof(float));
        if (bk->padded > bk->len)
            memset(recv + bk->len, 0, (size_t)(bk->padded - bk->len) * sizeof(float));
        z->req[s] = NULL;
        z->ev[s] = be->event_mark(be, TZ_QUEUE_COPY);
        z->slot_state[s] = TZ_ZERO_COMM;
        return;
    }
    if (!z->dcomm->device) {
        /* MPI: the copy queue waits for the gradients computed so far, downloads the bucket
         * into pinned host memory; its MPI reduce-scatter starts once the copy is done
         * (start_copied, polled from the gradient hook) */
        void *after = be->event_mark(be, TZ_QUEUE_COMPUTE);
        be->event_wait(be, after, TZ_QUEUE_COPY);
        be->event_free(be, after);
        be->download_async(be, z->hstage[s], z->grad + bk->start, (size_t)bk->len * sizeof(float));
        if (bk->padded > bk->len)
            memset(z->hstage[s] + bk->len, 0, (size_t)(bk->padded - bk->len) * sizeof(float));
        z->ev[s] = be->event_mark(be, TZ_QUEUE_COPY);
        z->slot_state[s] = TZ_ZERO_COPYING;
        return;
    }
    /* NCCL: the padded bucket on the device, reduce-scattered in place on the copy queue
     * (after the compute queue's work), the owned slice then copied to the host there too */
    be->copy(be, z->stage_buf[s], z->grad + bk->start, (size_t)bk->len * sizeof(float));
    if (bk->padded > bk->len) be->fill(be, z->stage_buf[s] + bk->len, 0.0f, bk->padded - bk->len);
    float *own = z->stage_buf[s] + (int64_t)z->dcomm->rank * bk->slice;
    z->req[s] = tz_comm_ireduce_scatter(z->dcomm, z->stage_buf[s], own, bk->slice, TZ_DT_F32);
    be->download_async(be, recv, own, (size_t)bk->slice * sizeof(float));
    z->ev[s] = be->event_mark(be, TZ_QUEUE_COPY);
    z->slot_state[s] = TZ_ZERO_COMM;
}

static void launch(tz_zero *z, int b) {
    const tz_zero_bucket *bk = &z->plan.b[b];
    tz_backend *be = z->be;
    if (z->pipelined) {
        int s = z->next_slot;
        finish_slot(z, s);
        float *recv = z->fresh ? z->sh.acc + bk->shard_off : z->recv[s];
        z->slot_bucket[s] = b;
        z->slot_recv[s] = recv;
        if (be->device) {
            launch_device(z, b, s, recv);
            z->next_slot = (s + 1) % TZ_ZERO_SLOTS;
            return;
        }
        const double t0 = omp_get_wtime();
        host_copy(z->stage_buf[s], z->grad + bk->start, bk->len);
        if (bk->padded > bk->len) be->fill(be, z->stage_buf[s] + bk->len, 0.0f, bk->padded - bk->len);
        clock_add(z, TZ_ZERO_GRADS, t0, (double)bk->len * 8.0);
        z->req[s] = tz_comm_ireduce_scatter(z->comm, z->stage_buf[s], recv, bk->slice, TZ_DT_F32);
        z->slot_state[s] = TZ_ZERO_COMM;
        z->next_slot = (s + 1) % TZ_ZERO_SLOTS;
        return;
    }
    /* stages 0/1 (and stage 2 on one rank of a host backend): sum the bucket, keep the owned
     * slice. On a device backend with MPI the bucket is summed on the host (a blocking copy:
     * stages 0/1 communicate once per step, after the last micro-batch) */
    int r = own_rank(z);
    int64_t begin, end;
    tz_zero_plan_slice(&z->plan, b, r, &begin, &end);
    const int host_sum = be->device && !z->dcomm->device && z->comm->size > 1;
    if (host_sum) {
        be->download(be, z->host_tmp, z->grad + bk->start, (size_t)bk->len * sizeof(float));
        tz_comm_all_reduce(z->comm, z->host_tmp, z->host_tmp, bk->len, TZ_DT_F32);
    } else if (z->comm->size > 1) {
        tz_comm_all_reduce(z->dcomm, z->grad + bk->start, z->grad + bk->start, bk->len, TZ_DT_F32);
    }
    if (end <= begin) return;
    float *dst = z->sh.acc + bk->shard_off + (begin - slice_base(bk, r));
    const size_t bytes = (size_t)(end - begin) * sizeof(float);
    if (host_sum) {
        take_grads(z, dst, z->host_tmp + (begin - bk->start), end - begin);
    } else if (!be->device) { /* host-addressable: straight from the gradient buffer */
        take_grads(z, dst, z->grad + begin, end - begin);
    } else if (z->fresh) {
        be->download(be, dst, z->grad + begin, bytes);
    } else {
        be->download(be, z->host_tmp, z->grad + begin, bytes);
        take_grads(z, dst, z->host_tmp, end - begin);
    }
}

void tz_zero_grads_ready(void *ctx, int64_t ready_flat) {
    tz_zero *z = ctx;
    if (!z->communicate) return;
    if (z->be->device && !z->dcomm->device) start_copied(z, -1); /* buckets now on the host */
    for (int s = 0; s < TZ_ZERO_SLOTS; s++) /* MPI progresses inside MPI calls only */
        if (z->req[s]) tz_comm_test(z->req[s]);
    while (z->next_bucket < z->plan.n_buckets &&
           z->plan.b[z->next_bucket].start + z->plan.b[z->next_bucket].len <= ready_flat)
        launch(z, z->next_bucket++);
}

void tz_zero_end_micro(tz_zero *z) {
    if (z->dev || !z->communicate) return;
    while (z->next_bucket < z->plan.n_buckets) launch(z, z->next_bucket++);
    for (int k = 0; k < TZ_ZERO_SLOTS; k++) finish_slot(z, (z->next_slot + k) % TZ_ZERO_SLOTS);
    z->fresh = 0;
}

/* The step with the optimizer on the backend: the norm of the flat gradient buffer (gaps and
 * all: they are zero), AdamW over the flat space, the masters into the model. */
static double device_step(tz_zero *z, const tz_optim_hparams *h, int64_t t, double max_norm) {
    tz_backend *be = z->be;
    const int64_t F = z->ps->flat_numel;
    double t0 = omp_get_wtime();
    const double norm = sqrt(be->sumsq(be, z->grad, F));
    clock_add(z, TZ_ZERO_NORM, t0, (double)F * 4.0);
    float clip = 1.0f;
    if (max_norm > 0 && norm > max_norm) clip = (float)(max_norm / norm);
    t0 = omp_get_wtime();
    if (isfinite(norm)) {
        const tz_adamw_args a = tz_adamw_args_of(h, t, clip);
        be->adamw(be, z->d_master, z->d_state[0], z->d_state[1], z->grad, z->d_decay, F, &a);
    }
    clock_add(z, TZ_ZERO_UPDATE, t0, (double)F * (double)tz_shard_step_bytes(&z->sh));
    tz_zero_push_weights(z);
    z->steps++;
    return norm;
}

double tz_zero_step(tz_zero *z, const tz_optim_hparams *h, int64_t t, double max_norm) {
    if (z->dev) return device_step(z, h, t, max_norm);
    const int64_t n = z->sh.n;
    double t0 = omp_get_wtime();
    double ss = tz_shard_sumsq(&z->sh);
    clock_add(z, TZ_ZERO_NORM, t0, (double)n * 4.0);
    if (z->stage > 0 && z->comm->size > 1) tz_comm_all_reduce(z->comm, &ss, &ss, 1, TZ_DT_F64);
    double norm = sqrt(ss);
    float clip = 1.0f;
    if (max_norm > 0 && norm > max_norm) clip = (float)(max_norm / norm);
    t0 = omp_get_wtime();
    master_quiet(z); /* the last step's uploads from the master are done (long since) */
    if (isfinite(norm)) tz_shard_update(&z->sh, h, t, clip);
    clock_add(z, TZ_ZERO_UPDATE, t0, (double)n * (double)tz_shard_step_bytes(&z->sh));
    tz_zero_push_weights(z);
    z->steps++;
    return norm;
}

void tz_zero_push_weights(tz_zero *z) {
    double t0;
    if (z->dev) { /* the backend's masters into the model's trainable weights (fp32) */
        t0 = omp_get_wtime();
        size_t bytes = 0;
        for (int i = 0; i < z->ps->n; i++) {
            const tz_param *p = z->ps->p[i];
            if (!p->trainable) continue;
            z->be->copy(z->be, p->w, z->d_master + p->flat_off, (size_t)p->numel * sizeof(float));
            bytes += 2 * (size_t)p->numel * sizeof(float);
        }
        clock_add(z, TZ_ZERO_WEIGHTS, t0, (double)bytes);
        return;
    }
    /* the updated weights back into every rank's model: each owner packs its slice (fp32,
     * or codes + scales re-quantized from the master), all-gathered in stages 1 and 2; where
     * nothing is gathered the dense pieces go from the master to the model as they are (on a
     * device backend as copies on the copy queue, which the compute queue waits for before
     * its next op: the host goes on at once) */
    const int r = own_rank(z), gather = gathers(z);
    const int64_t N = z->zw.world;
    if (z->wstaged) { /* forward order, an event after each bucket (weights_needed) */
        master_quiet(z);
        for (int b = z->plan.n_buckets - 1; b >= 0; b--) {
            t0 = omp_get_wtime();
            const int64_t db = tz_zero_weights_put_dense(&z->zw, z->be, b, r,
                                                         z->sh.master + z->plan.b[b].shard_off);
            clock_add(z, TZ_ZERO_WEIGHTS, t0, (double)db);
            z->wev[b] = z->be->event_mark(z->be, TZ_QUEUE_COPY);
        }
        z->wdone = z->wev[0];
        z->wfloor = z->plan.n_buckets; /* the compute queue has waited for none of them */
        return;
    }
    for (int b = 0; b < z->plan.n_buckets; b++) {
        const int64_t *counts = z->zw.bytes + (int64_t)b * N;
        const float *slice = z->sh.master + z->plan.b[b].shard_off;
        if (!gather) {
            t0 = omp_get_wtime();
            const int64_t db = tz_zero_weights_put_dense(&z->zw, z->be, b, r, slice);
            clock_add(z, TZ_ZERO_WEIGHTS, t0, (double)db);
        }
        if (!gather && z->zw.quant_params == 0) continue; /* nothing to pack */
        t0 = omp_get_wtime();
        tz_zero_weights_pack(&z->zw, b, r, slice, z->wsend, gather);
        clock_add(z, TZ_ZERO_PACK, t0, 4.0 * (double)z->plan.b[b].slice + (double)counts[r]);
        if (!gather) {
            t0 = omp_get_wtime();
            tz_zero_weights_unpack(&z->zw, z->be, b, r, z->wsend, 0);
            clock_add(z, TZ_ZERO_WEIGHTS, t0, 2.0 * (double)counts[r]);
            continue;
        }
        t0 = omp_get_wtime();
        tz_comm_all_gatherv(z->comm, z->wsend, z->wrecv, counts, TZ_DT_U8);
        int64_t at = 0;
        for (int q = 0; q < N; q++) at += counts[q];
        clock_add(z, TZ_ZERO_GATHER, t0, (double)at);
        t0 = omp_get_wtime();
        at = 0;
        for (int q = 0; q < N; at += counts[q], q++)
            tz_zero_weights_unpack(&z->zw, z->be, b, q, z->wrecv + at, 1);
        clock_add(z, TZ_ZERO_WEIGHTS, t0, 2.0 * (double)at);
    }
    if (master_dma(z)) {
        tz_backend *be = z->be;
        master_quiet(z);
        z->wdone = be->event_mark(be, TZ_QUEUE_COPY);
        be->event_wait(be, z->wdone, TZ_QUEUE_COMPUTE);
    }
}

void tz_zero_device_optimizer(tz_zero *z) {
    tz_backend *be = z->be;
    tz_params *ps = z->ps;
    if (z->comm->size > 1)
        TZ_FATAL_HINT("keep optim.offload = true (the default) with several ranks",
                      "optim.offload = false: the optimizer on the backend runs on one rank "
                      "only; this run has %d", z->comm->size);
    if (strcmp(z->sh.opt->name, "adamw") || z->sh.opt->n_states != 2 ||
        z->sh.opt->state_types[0] != TZ_DT_F32 || z->sh.opt->state_types[1] != TZ_DT_F32)
        TZ_FATAL("optim.offload = false: the backend's optimizer is AdamW, not %s",
                 z->sh.opt->name);
    for (int i = 0; i < ps->n; i++)
        if (ps->p[i]->trainable && (ps->p[i]->q || ps->p[i]->w16 || !ps->p[i]->w))
            TZ_FATAL_HINT("keep optim.offload = true (the default) to train quantized weights",
                          "optim.offload = false: %s is a trainable %s weight; the backend's "
                          "optimizer updates fp32 weights only", ps->p[i]->name,
                          ps->p[i]->q ? "quantized" : "bf16");
    if (z->master_pinned) { /* no upload reads the host master from now on */
        master_quiet(z);
        z->wstaged = 0;
        be->host_unregister(be, z->sh.master);
        z->master_pinned = 0;
    }
    const int64_t F = ps->flat_numel;
    z->d_master = be->alloc(be, (size_t)F * sizeof(float));
    for (int i = 0; i < 2; i++) {
        z->d_state[i] = be->alloc(be, (size_t)F * sizeof(float));
        be->fill(be, z->d_state[i], 0.0f, F);
    }
    z->d_decay = be->alloc(be, (size_t)F);
    z->d_bytes = (size_t)F * (3 * sizeof(float) + 1);
    be->fill(be, z->d_master, 0.0f, F); /* the gaps between tensors */
    uint8_t *decay = tz_xcalloc((size_t)F + 1, 1);
    for (int i = 0; i < ps->n; i++) {
        const tz_param *p = ps->p[i];
        if (!p->trainable) continue;
        be->copy(be, z->d_master + p->flat_off, p->w, (size_t)p->numel * sizeof(float));
        memset(decay + p->flat_off, p->decay ? 1 : 0, (size_t)p->numel);
    }
    be->upload(be, z->d_decay, decay, (size_t)F);
    free(decay);
    z->dev = 1;
    z->pipelined = 0;
}

/* Bucket b's part of the flat space [start, start + len) is the shard's [shard_off, +len)
 * on one rank (the only case of the backend's optimizer). */
void tz_zero_sync_host(tz_zero *z) {
    if (!z->dev) return;
    tz_backend *be = z->be;
    for (int b = 0; b < z->plan.n_buckets; b++) {
        const tz_zero_bucket *bk = &z->plan.b[b];
        const size_t bytes = (size_t)bk->len * sizeof(float);
        be->download(be, z->sh.master + bk->shard_off, z->d_master + bk->start, bytes);
        for (int i = 0; i < z->sh.opt->n_states; i++)
            be->download(be, (float *)tz_shard_state(&z->sh, i) + bk->shard_off, z->d_state[i] + bk->start,
                         bytes);
    }
}

void tz_zero_host_loaded(tz_zero *z) {
    if (z->dev) {
        tz_backend *be = z->be;
        for (int b = 0; b < z->plan.n_buckets; b++) {
            const tz_zero_bucket *bk = &z->plan.b[b];
            const size_t bytes = (size_t)bk->len * sizeof(float);
            be->upload(be, z->d_master + bk->start, z->sh.master + bk->shard_off, bytes);
            for (int i = 0; i < z->sh.opt->n_states; i++)
                be->upload(be, z->d_state[i] + bk->start, (float *)tz_shard_state(&z->sh, i) + bk->shard_off,
                           bytes);
        }
    }
    tz_zero_push_weights(z);
}

const char *const tz_zero_phase_names[TZ_ZERO_PHASES] = {"gradients", "norm", "update", "pack",
                                                         "all-gather", "weights"};

void tz_zero_clock_reset(tz_zero *z) {
    memset(z->clock, 0, sizeof z->clock);
    z->steps = 0;
}

void tz_zero_clock_print(const tz_zero *z) {
    if (z->steps == 0) return;
    char line[1024];
    size_t at = 0;
    double total = 0.0;
    for (int p = 0; p < TZ_ZERO_PHASES && at < sizeof line; p++) {
        const tz_zero_clock *c = &z->clock[p];
        total += c->seconds;
        if (c->seconds == 0 && c->bytes == 0) continue; /* a phase this run does not have */
        int k = snprintf(line + at, sizeof line - at, " | %s%s%s %.2f ms", tz_zero_phase_names[p],
                         p == TZ_ZERO_UPDATE ? " " : "", p == TZ_ZERO_UPDATE ? z->sh.opt->name : "",
                         1e3 * c->seconds / (double)z->steps);
        if (k > 0) at += (size_t)k;
        if (c->bytes > 0 && c->seconds > 0 && at < sizeof line) {
            k = snprintf(line + at, sizeof line - at, " %.1f GB/s", 1e-9 * c->bytes / c->seconds);
            if (k > 0) at += (size_t)k;
        }
    }
    tz_info_all("%s, mean of %lld steps: %.2f ms%s",
                z->dev ? "optimizer step on the backend (launch time)" : "host step",
                (long long)z->steps, 1e3 * total / (double)z->steps, line);
}

void tz_zero_print_memory(const tz_zero *z, size_t activations, size_t host_acts) {
    const tz_params *ps = z->ps;
    size_t quant = 0, weights = tz_params_bytes(ps);
    for (int i = 0; i < ps->n; i++)
        if (ps->p[i]->q) quant += ps->p[i]->bytes;
    const size_t grads = (size_t)ps->flat_numel * sizeof(float);
    const size_t staging = z->stage_buf[0] ? TZ_ZERO_SLOTS * (size_t)z->plan.bucket_elems * sizeof(float) : 0;
    const size_t sum = weights + grads + staging + activations + z->d_bytes,
                 live = z->be->live_bytes;
    const double M = 1048576.0;
    char other[64] = "";
    if (live != sum)
        snprintf(other, sizeof other, " + other %.2f", ((double)live - (double)sum) / M);
    char opt[64] = "", hacts[96] = "";
    if (z->dev) snprintf(opt, sizeof opt, " + optimizer %.2f", (double)z->d_bytes / M);
    if (host_acts)
        snprintf(hacts, sizeof hacts, " + activations on the host %.2f (pinned)",
                 (double)host_acts / M);
    tz_info_all("memory per rank: %s %.2f MiB = weights %.2f (codes + scales %.2f, dense %.2f) "
                "+ gradients %.2f + staging %.2f + activations %.2f%s%s (the allocator's count) | "
                "host shard %.2f MiB%s", z->be->device ? "device" : "backend (host)",
                (double)live / M, (double)weights / M, (double)quant / M,
                (double)(weights - quant) / M, (double)grads / M, (double)staging / M,
                (double)activations / M, opt, other, (double)z->sh.bytes / M, hacts);
}

void tz_zero_print(const tz_zero *z) {
    char arrays[256];
    tz_shard_describe(&z->sh, arrays, sizeof arrays);
    tz_info_all("zero stage %d: owns %lld of %lld trainable parameters (shard of %lld elements "
                "in %d buckets, with padding) | host shard %zu bytes (%.2f MiB: %s: %s)%s",
                z->stage, (long long)z->owned_params, (long long)z->ps->n_trainable,
                (long long)z->sh.n, z->plan.n_buckets, z->sh.bytes,
                (double)z->sh.bytes / 1048576.0, z->sh.opt->name, arrays,
                z->wstaged ? " | updated weights uploaded in forward order, each layer waiting "
                             "for its own" : "");
}
