/* Pieces of the ranks' slices, the master's first values, and packing (re-quantizing) and
 * unpacking the updated weights of one bucket slice. Communication is optim/zero.c's. */
#include "optim/zero_weights.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "quant/turboquant.h"
#include "optim/optim.h"

static int64_t piece_bytes(const tz_param *p, int64_t n) {
    if (!p->q) return 4 * n;
    return n * p->q->bits / 8 + 2 * (n / p->q->group);
}

void tz_zero_weights_init(tz_zero_weights *zw, const tz_zero_plan *plan, tz_params *ps) {
    memset(zw, 0, sizeof *zw);
    const int N = plan->world;
    zw->world = N;
    zw->n_buckets = plan->n_buckets;
    /* trainable tensors in flat order */
    tz_param **tt = tz_xmalloc((size_t)(ps->n ? ps->n : 1) * sizeof *tt);
    int nt = 0;
    for (int i = ps->n - 1; i >= 0; i--)
        if (ps->p[i]->trainable) tt[nt++] = ps->p[i];
    for (int i = 0; i < nt; i++) {
        tz_param *p = tt[i];
        if (p->q) {
            zw->quant_params += p->numel;
            if (p->q->method == TZ_TQ_TURBOQUANT && !zw->cb[p->q->bits].bits) {
                char err[256];
                if (tz_tq_codebook_init(&zw->cb[p->q->bits], p->q->bits, err, sizeof err))
                    TZ_FATAL("%s", err);
            }
        } else {
            zw->dense_params += p->numel;
        }
    }
    const int64_t ns = (int64_t)plan->n_buckets * N;
    zw->first = tz_xcalloc((size_t)ns + 1, sizeof *zw->first);
    zw->bytes = tz_xcalloc((size_t)ns + 1, sizeof *zw->bytes);
    int64_t cap = 0, np = 0;
    for (int b = 0; b < plan->n_buckets; b++) {
        int64_t sum = 0;
        for (int r = 0; r < N; r++) {
            zw->first[(int64_t)b * N + r] = np;
            int64_t begin, end, at = 0;
            tz_zero_plan_slice(plan, b, r, &begin, &end);
            const int64_t base = plan->b[b].start + (int64_t)r * plan->b[b].slice;
            for (int i = 0; i < nt && end > begin; i++) {
                tz_param *p = tt[i];
                int64_t lo = p->flat_off > begin ? p->flat_off : begin;
                int64_t hi = p->flat_off + p->numel < end ? p->flat_off + p->numel : end;
                if (hi <= lo) continue;
                tz_zero_piece c = {p, lo - p->flat_off, hi - lo, lo - base, at, 0};
                if (p->q && (c.off % p->q->group || c.n % p->q->group))
                    TZ_FATAL("%s: a ZeRO slice cuts a quantization group of %d (elements "
                             "[%lld, %lld)): the plan must cut at multiples of the group",
                             p->name, p->q->group, (long long)c.off, (long long)(c.off + c.n));
                c.bytes = piece_bytes(p, c.n);
                at += (c.bytes + 7) & ~(int64_t)7; /* 8-aligned pieces: aligned copies */
                if (np == cap) {
                    cap = cap ? 2 * cap : 64;
                    zw->pc = tz_xrealloc(zw->pc, (size_t)cap * sizeof *zw->pc);
                }
                zw->pc[np++] = c;
            }
            zw->bytes[(int64_t)b * N + r] = at;
            if (at > zw->max_chunk) zw->max_chunk = at;
            sum += at;
        }
        if (sum > zw->max_bucket) zw->max_bucket = sum;
    }
    zw->first[ns] = np;
    free(tt);
}

void tz_zero_weights_free(tz_zero_weights *zw) {
    if (zw->prev)
        for (int b = 0; b < zw->n_buckets; b++) free(zw->prev[b]);
    free(zw->prev);
    free(zw->first);
    free(zw->pc);
    free(zw->bytes);
    memset(zw, 0, sizeof *zw);
}

static const tz_zero_piece *pieces(const tz_zero_weights *zw, int b, int r, int64_t *n) {
    int64_t k = (int64_t)b * zw->world + r;
    *n = zw->first[k + 1] - zw->first[k];
    return zw->pc + zw->first[k];
}

static const tz_tq_codebook *codebook(const tz_zero_weights *zw, const tz_qweight *q) {
    return q->method == TZ_TQ_TURBOQUANT ? &zw->cb[q->bits] : NULL;
}

void tz_zero_weights_read(const tz_zero_weights *zw, tz_backend *be, int b, int r,
                          float *slice) {
    int64_t n;
    const tz_zero_piece *pc = pieces(zw, b, r, &n);
    for (int64_t k = 0; k < n; k++) {
        const tz_zero_piece *c = &pc[k];
        const tz_param *p = c->p;
        float *dst = slice + c->in_slice;
        if (!p->q) {
            be->download(be, dst, p->w + c->off, (size_t)c->n * sizeof(float));
        } else if (p->init) { /* the dense weight it was quantized from */
            memcpy(dst, p->init + c->off, (size_t)c->n * sizeof(float));
        } else { /* only codes exist: the master starts at the decoded weight */
            const tz_qweight *q = p->q;
            const int64_t g0 = c->off / q->group, ng = c->n / q->group;
            uint8_t *codes = tz_xmalloc((size_t)(c->n * q->bits / 8));
            uint16_t *scales = tz_xmalloc((size_t)ng * sizeof *scales);
            tz_qweight_codes_get(be, q, codes, (size_t)(c->off * q->bits / 8),
                                 (size_t)(c->n * q->bits / 8));
            be->download(be, scales, q->scales + g0, (size_t)ng * sizeof *scales);
            tz_tq_dequantize_range(q->method, codebook(zw, q), q->bits, q->group, p->shape[1],
                                   q->seed, codes, scales, g0, ng, dst);
            free(codes);
            free(scales);
        }
    }
}

/* Codes of the quantized pieces of (b, r) that differ between the packed chunks a and b. */
static void count_changes(tz_zero_weights *zw, const tz_zero_piece *pc, int64_t n,
                          const uint8_t *old, const uint8_t *now) {
    int64_t changed = 0, counted = 0;
    for (int64_t k = 0; k < n; k++) {
        const tz_zero_piece *c = &pc[k];
        const tz_qweight *q = c->p->q;
        if (!q) continue;
        const int g = q->group;
        const int64_t ng = c->n / g, gb = TZ_TQ_GROUP_BYTES(g, q->bits);
#pragma omp parallel for schedule(static) reduction(+ : changed)
        for (int64_t j = 0; j < ng; j++) {
            uint8_t x[TZ_TQ_MAX_GROUP], y[TZ_TQ_MAX_GROUP];
            tz_tq_unpack_group(x, old + c->at + j * gb, g, q->bits);
            tz_tq_unpack_group(y, now + c->at + j * gb, g, q->bits);
            for (int i = 0; i < g; i++) changed += x[i] != y[i];
        }
        counted += c->n;
    }
    zw->changed += changed;
    zw->counted += counted;
}

void tz_zero_weights_pack(tz_zero_weights *zw, int b, int r, const float *slice,
                          uint8_t *chunk, int dense) {
    int64_t n;
    const tz_zero_piece *pc = pieces(zw, b, r, &n);
    for (int64_t k = 0; k < n; k++) {
        const tz_zero_piece *c = &pc[k];
        const tz_qweight *q = c->p->q;
        const float *src = slice + c->in_slice;
        uint8_t *dst = chunk + c->at;
        if (!q) {
            if (dense) tz_host_copy(dst, src, (size_t)c->bytes);
            continue;
        }
        const int64_t ng = c->n / q->group, cbytes = c->n * q->bits / 8;
        tz_tq_quantize_range_sr(q->method, codebook(zw, q), q->bits, q->group, c->p->shape[1],
                                q->seed, src, c->off / q->group, ng, dst,
                                (uint16_t *)(dst + cbytes), zw->sr);
    }
    if (zw->count_changes && zw->quant_params > 0) {
        const size_t bytes = (size_t)zw->bytes[(int64_t)b * zw->world + r];
        if (!zw->prev) zw->prev = tz_xcalloc((size_t)zw->n_buckets, sizeof *zw->prev);
        if (zw->prev[b]) count_changes(zw, pc, n, zw->prev[b], chunk);
        else zw->prev[b] = tz_xmalloc(bytes > 0 ? bytes : 1);
        memcpy(zw->prev[b], chunk, bytes);
    }
}

void tz_zero_weights_unpack(const tz_zero_weights *zw, tz_backend *be, int b, int r,
                            const uint8_t *chunk, int dense) {
    int64_t n;
    const tz_zero_piece *pc = pieces(zw, b, r, &n);
    for (int64_t k = 0; k < n; k++) {
        const tz_zero_piece *c = &pc[k];
        const tz_param *p = c->p;
        const uint8_t *src = chunk + c->at;
        if (!p->q) {
            if (!dense) continue;
            if (be->device) be->upload(be, p->w + c->off, src, (size_t)c->bytes);
            else tz_host_copy(p->w + c->off, src, (size_t)c->bytes); /* host memory: every thread */
            continue;
        }
        tz_qweight *q = p->q;
        const int64_t cbytes = c->n * q->bits / 8;
        tz_qweight_codes_put(be, q, (size_t)(c->off * q->bits / 8), src, (size_t)cbytes);
        be->upload(be, q->scales + c->off / q->group, src + cbytes,
                   (size_t)(c->n / q->group) * sizeof(uint16_t));
    }
}

int64_t tz_zero_weights_put_dense(const tz_zero_weights *zw, tz_backend *be, int b, int r,
                                  const float *slice) {
    int64_t n, bytes = 0;
    const tz_zero_piece *pc = pieces(zw, b, r, &n);
    for (int64_t k = 0; k < n; k++) {
        const tz_zero_piece *c = &pc[k];
        if (c->p->q) continue;
        const float *src = slice + c->in_slice;
        if (be->device) be->upload_async(be, c->p->w + c->off, src, (size_t)c->bytes);
        else tz_host_copy(c->p->w + c->off, src, (size_t)c->bytes);
        bytes += c->bytes;
    }
    return bytes;
}

int64_t tz_zero_weights_gather_bytes(const tz_zero_weights *zw, int r) {
    int64_t s = 0;
    for (int b = 0; b < zw->n_buckets; b++)
        for (int q = 0; q < zw->world; q++)
            if (q != r) s += zw->bytes[(int64_t)b * zw->world + q];
    return s;
}
