/* ZeRO at run time: buckets of the flat gradients communicated as backward produces them
 * (reduce-scatter in stage 2, all-reduce in stages 0/1), the host shard, the sharded step. */
#include "train/zero.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "mpi/comm.h"
#include "mpi/world.h"

static int own_rank(const tz_zero *z) { return z->stage == 0 ? 0 : z->comm->rank; }

/* Flat offset of the first element of rank r's slice of bucket b. */
static int64_t slice_base(const tz_zero_bucket *b, int r) { return b->start + (int64_t)r * b->slice; }

void tz_zero_init(tz_zero *z, int stage, double bucket_mb, const tz_optim *opt, tz_params *ps,
                  tz_backend *be, tz_comm *comm, const tz_world *world) {
    memset(z, 0, sizeof *z);
    z->stage = stage;
    z->be = be;
    z->comm = comm;
    z->world = world;
    z->ps = ps;
    /* one rank's reduce-scatter is the identity: stage 2 then reads the gradients in place */
    z->pipelined = stage == 2 && comm->size > 1;
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

    /* the host shard, on this rank's NUMA node */
    tz_shard_init(&z->sh, opt, z->plan.shard_numel, world);

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

    const int64_t B = z->plan.bucket_elems;
    z->host_tmp = tz_xmalloc((size_t)B * sizeof(float));
    z->wsend = tz_xmalloc((size_t)z->zw.max_chunk + 8);
    z->wrecv = tz_xmalloc((size_t)z->zw.max_bucket + 8);
    if (z->pipelined)
        for (int s = 0; s < TZ_ZERO_SLOTS; s++) {
            z->stage_buf[s] = be->alloc(be, (size_t)B * sizeof(float));
            z->recv[s] = tz_xmalloc((size_t)(B / comm->size + 1) * sizeof(float));
            z->slot_bucket[s] = -1;
        }
}

void tz_zero_free(tz_zero *z) {
    tz_shard_free(&z->sh);
    for (int s = 0; s < TZ_ZERO_SLOTS; s++) {
        if (z->stage_buf[s]) z->be->release(z->be, z->stage_buf[s]);
        free(z->recv[s]);
    }
    free(z->host_tmp);
    free(z->wsend);
    free(z->wrecv);
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

static void finish_slot(tz_zero *z, int s) {
    if (!z->req[s]) return;
    tz_comm_wait(z->req[s]);
    z->req[s] = NULL;
    const tz_zero_bucket *bk = &z->plan.b[z->slot_bucket[s]];
    /* a fresh step's slice was reduce-scattered straight into the accumulator */
    if (!z->fresh) take_grads(z, z->sh.acc + bk->shard_off, z->recv[s], bk->slice);
}

static void launch(tz_zero *z, int b) {
    const tz_zero_bucket *bk = &z->plan.b[b];
    tz_backend *be = z->be;
    if (z->pipelined) {
        int s = z->next_slot;
        finish_slot(z, s);
        const double t0 = omp_get_wtime();
        if (be->device) be->copy(be, z->stage_buf[s], z->grad + bk->start, (size_t)bk->len * sizeof(float));
        else host_copy(z->stage_buf[s], z->grad + bk->start, bk->len);
        if (bk->padded > bk->len) be->fill(be, z->stage_buf[s] + bk->len, 0.0f, bk->padded - bk->len);
        if (!be->device) clock_add(z, TZ_ZERO_GRADS, t0, (double)bk->len * 8.0);
        float *recv = z->fresh ? z->sh.acc + bk->shard_off : z->recv[s];
        z->req[s] = tz_comm_ireduce_scatter(z->comm, z->stage_buf[s], recv, bk->slice, TZ_DT_F32);
        z->slot_bucket[s] = b;
        z->next_slot = (s + 1) % TZ_ZERO_SLOTS;
        return;
    }
    /* stages 0/1 (and stage 2 on one rank): sum the bucket in place, keep the owned slice */
    if (z->comm->size > 1)
        tz_comm_all_reduce(z->comm, z->grad + bk->start, z->grad + bk->start, bk->len, TZ_DT_F32);
    int r = own_rank(z);
    int64_t begin, end;
    tz_zero_plan_slice(&z->plan, b, r, &begin, &end);
    if (end <= begin) return;
    float *dst = z->sh.acc + bk->shard_off + (begin - slice_base(bk, r));
    const size_t bytes = (size_t)(end - begin) * sizeof(float);
    if (!be->device) { /* host-addressable: straight from the gradient buffer */
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
    for (int s = 0; s < TZ_ZERO_SLOTS; s++) /* MPI progresses inside MPI calls only */
        if (z->req[s]) tz_comm_test(z->req[s]);
    while (z->next_bucket < z->plan.n_buckets &&
           z->plan.b[z->next_bucket].start + z->plan.b[z->next_bucket].len <= ready_flat)
        launch(z, z->next_bucket++);
}

void tz_zero_end_micro(tz_zero *z) {
    if (!z->communicate) return;
    while (z->next_bucket < z->plan.n_buckets) launch(z, z->next_bucket++);
    for (int k = 0; k < TZ_ZERO_SLOTS; k++) finish_slot(z, (z->next_slot + k) % TZ_ZERO_SLOTS);
    z->fresh = 0;
}

double tz_zero_step(tz_zero *z, const tz_optim_hparams *h, int64_t t, double max_norm) {
    const int64_t n = z->sh.n;
    double t0 = omp_get_wtime();
    double ss = tz_shard_sumsq(&z->sh);
    clock_add(z, TZ_ZERO_NORM, t0, (double)n * 4.0);
    if (z->stage > 0 && z->comm->size > 1) tz_comm_all_reduce(z->comm, &ss, &ss, 1, TZ_DT_F64);
    double norm = sqrt(ss);
    float clip = 1.0f;
    if (max_norm > 0 && norm > max_norm) clip = (float)(max_norm / norm);
    t0 = omp_get_wtime();
    if (isfinite(norm)) tz_shard_update(&z->sh, h, t, clip);
    clock_add(z, TZ_ZERO_UPDATE, t0, (double)n * (double)tz_shard_step_bytes(&z->sh));
    tz_zero_push_weights(z);
    z->steps++;
    return norm;
}

void tz_zero_push_weights(tz_zero *z) {
    double t0;
    /* the updated weights back into every rank's model: each owner packs its slice (fp32,
     * or codes + scales re-quantized from the master), all-gathered in stages 1 and 2 */
    const int r = own_rank(z), gather = z->stage > 0 && z->comm->size > 1;
    const int64_t N = z->zw.world;
    for (int b = 0; b < z->plan.n_buckets; b++) {
        const int64_t *counts = z->zw.bytes + (int64_t)b * N;
        t0 = omp_get_wtime();
        tz_zero_weights_pack(&z->zw, b, r, z->sh.master + z->plan.b[b].shard_off, z->wsend);
        clock_add(z, TZ_ZERO_PACK, t0, 4.0 * (double)z->plan.b[b].slice + (double)counts[r]);
        if (!gather) {
            t0 = omp_get_wtime();
            tz_zero_weights_unpack(&z->zw, z->be, b, r, z->wsend);
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
            tz_zero_weights_unpack(&z->zw, z->be, b, q, z->wrecv + at);
        clock_add(z, TZ_ZERO_WEIGHTS, t0, 2.0 * (double)at);
    }
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
    tz_info_all("host step, mean of %lld steps: %.2f ms%s", (long long)z->steps,
                1e3 * total / (double)z->steps, line);
}

void tz_zero_print_memory(const tz_zero *z, size_t activations) {
    const tz_params *ps = z->ps;
    size_t quant = 0, weights = tz_params_bytes(ps);
    for (int i = 0; i < ps->n; i++)
        if (ps->p[i]->q) quant += ps->p[i]->bytes;
    const size_t grads = (size_t)ps->flat_numel * sizeof(float);
    const size_t staging = z->pipelined ? TZ_ZERO_SLOTS * (size_t)z->plan.bucket_elems * sizeof(float) : 0;
    const size_t sum = weights + grads + staging + activations, live = z->be->live_bytes;
    const double M = 1048576.0;
    char other[64] = "";
    if (live != sum)
        snprintf(other, sizeof other, " + other %.2f", ((double)live - (double)sum) / M);
    tz_info_all("memory per rank: %s %.2f MiB = weights %.2f (codes + scales %.2f, dense %.2f) "
                "+ gradients %.2f + staging %.2f + activations %.2f%s (the allocator's count) | "
                "host shard %.2f MiB", z->be->device ? "device" : "backend (host)", (double)live / M,
                (double)weights / M, (double)quant / M, (double)(weights - quant) / M,
                (double)grads / M, (double)staging / M, (double)activations / M, other,
                (double)z->sh.bytes / M);
}

void tz_zero_print(const tz_zero *z) {
    char arrays[256];
    tz_shard_describe(&z->sh, arrays, sizeof arrays);
    tz_info_all("zero stage %d: owns %lld of %lld trainable parameters (shard of %lld elements "
                "in %d buckets, with padding) | host shard %zu bytes (%.2f MiB: %s: %s)",
                z->stage, (long long)z->owned_params, (long long)z->ps->n_trainable,
                (long long)z->sh.n, z->plan.n_buckets, z->sh.bytes,
                (double)z->sh.bytes / 1048576.0, z->sh.opt->name, arrays);
}
