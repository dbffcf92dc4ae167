/* ZeRO at run time: buckets of the flat gradients communicated as backward produces them
 * (reduce-scatter in stage 2, all-reduce in stages 0/1), the host shard, the sharded step. */
#include "train/zero.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

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
    tz_params_flatten_weights(ps, be);
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

    /* master <- this rank's slice of the weights; decay flags per element */
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
        be->download(be, z->sh.master + at, ps->flat_w + begin, (size_t)(end - begin) * sizeof(float));
        for (int64_t f = begin; f < end; f++) {
            z->sh.decay[at + f - begin] = flat_kind[f] == 2;
            z->owned_params += flat_kind[f] != 0;
        }
    }
    free(flat_kind);

    const int64_t B = z->plan.bucket_elems;
    z->host_tmp = tz_xmalloc((size_t)B * sizeof(float));
    if (stage == 2)
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
    z->be->release(z->be, z->grad);
    tz_zero_plan_free(&z->plan);
    memset(z, 0, sizeof *z);
}

void tz_zero_begin_step(tz_zero *z) {
    z->be->fill(z->be, z->grad, 0.0f, z->ps->flat_numel);
    memset(z->sh.acc, 0, (size_t)z->sh.n * sizeof(float));
}

void tz_zero_begin_micro(tz_zero *z, int last) {
    /* stage 2 moves every micro-batch's gradients to the host shard, so the buffer restarts
     * from zero; stages 0/1 accumulate on the device and communicate once, at the end */
    if (z->stage == 2 && z->next_bucket > 0) z->be->fill(z->be, z->grad, 0.0f, z->ps->flat_numel);
    z->next_bucket = 0;
    z->communicate = z->stage == 2 || last;
}

/* acc[shard range of bucket b] += src (slice elements of host memory). */
static void accumulate(tz_zero *z, int b, const float *src, int64_t n) {
    float *dst = z->sh.acc + z->plan.b[b].shard_off;
    for (int64_t i = 0; i < n; i++) dst[i] += src[i];
}

static void finish_slot(tz_zero *z, int s) {
    if (!z->req[s]) return;
    tz_comm_wait(z->req[s]);
    z->req[s] = NULL;
    int b = z->slot_bucket[s];
    accumulate(z, b, z->recv[s], z->plan.b[b].slice);
}

static void launch(tz_zero *z, int b) {
    const tz_zero_bucket *bk = &z->plan.b[b];
    tz_backend *be = z->be;
    if (z->stage == 2) {
        int s = z->next_slot;
        finish_slot(z, s);
        be->copy(be, z->stage_buf[s], z->grad + bk->start, (size_t)bk->len * sizeof(float));
        if (bk->padded > bk->len) be->fill(be, z->stage_buf[s] + bk->len, 0.0f, bk->padded - bk->len);
        z->req[s] = tz_comm_ireduce_scatter(z->comm, z->stage_buf[s], z->recv[s], bk->slice, TZ_DT_F32);
        z->slot_bucket[s] = b;
        z->next_slot = (s + 1) % TZ_ZERO_SLOTS;
        return;
    }
    /* stages 0/1: sum the bucket in place, keep the owned slice */
    if (z->comm->size > 1)
        tz_comm_all_reduce(z->comm, z->grad + bk->start, z->grad + bk->start, bk->len, TZ_DT_F32);
    int r = own_rank(z);
    int64_t begin, end;
    tz_zero_plan_slice(&z->plan, b, r, &begin, &end);
    if (end <= begin) return;
    be->download(be, z->host_tmp, z->grad + begin, (size_t)(end - begin) * sizeof(float));
    float *dst = z->sh.acc + bk->shard_off + (begin - slice_base(bk, r));
    for (int64_t i = 0; i < end - begin; i++) dst[i] += z->host_tmp[i];
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
}

double tz_zero_step(tz_zero *z, const tz_optim_hparams *h, int64_t t, double max_norm) {
    double ss = tz_shard_sumsq(&z->sh);
    if (z->stage > 0 && z->comm->size > 1) tz_comm_all_reduce(z->comm, &ss, &ss, 1, TZ_DT_F64);
    double norm = sqrt(ss);
    float clip = 1.0f;
    if (max_norm > 0 && norm > max_norm) clip = (float)(max_norm / norm);
    if (isfinite(norm)) tz_shard_update(&z->sh, h, t, clip);
    /* the updated weights back into every rank's model */
    tz_backend *be = z->be;
    for (int b = 0; b < z->plan.n_buckets; b++) {
        const tz_zero_bucket *bk = &z->plan.b[b];
        const float *src = z->sh.master + bk->shard_off;
        if (z->stage > 0 && z->comm->size > 1) {
            tz_comm_all_gather(z->comm, z->sh.master + bk->shard_off, z->host_tmp, bk->slice, TZ_DT_F32);
            src = z->host_tmp;
        }
        be->upload(be, z->ps->flat_w + bk->start, src, (size_t)bk->len * sizeof(float));
    }
    return norm;
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
