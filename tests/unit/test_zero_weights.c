/* The weights' way between host shards and models (train/zero_weights): every rank's slice of
 * every bucket packed from one fp32 master and unpacked into a model gives, at N = 1..4 and
 * buckets that cut tensors, the master itself for dense tensors and exactly the codes and
 * scales of quantizing the whole master tensor for quantized ones (TurboQuant and absmax);
 * the master's first values come from p->init or the decoded weight; byte counts. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/registry.h"
#include "core/backend.h"
#include "core/rng.h"
#include "model/params.h"
#include "optim/zero_plan.h"
#include "quant/turboquant.h"
#include "optim/zero_weights.h"
#include "tz_check.h"

static tz_backend *g_be;
static tz_tq_codebook g_cb[TZ_TQ_MAX_BITS + 1];

typedef struct model {
    tz_params ps;
    tz_param *emb, *q4, *norm, *a3, *q2, *frozen;
} model;

static void model_make(model *m) {
    float levels[16];
    tz_params_init(&m->ps);
    m->emb = tz_params_add(&m->ps, g_be, "embed", 2, 97, 64, 1, 1, 0);
    tz_tq_levels(TZ_TQ_TURBOQUANT, 4, &g_cb[4], levels);
    m->q4 = tz_params_add_quant(&m->ps, g_be, "q4", 80, 192, TZ_TQ_TURBOQUANT, 4, 64, 9, levels);
    m->norm = tz_params_add(&m->ps, g_be, "norm", 1, 64, 1, 1, 0, 0);
    tz_tq_levels(TZ_TQ_ABSMAX, 3, NULL, levels);
    m->a3 = tz_params_add_quant(&m->ps, g_be, "a3", 48, 256, TZ_TQ_ABSMAX, 3, 128, 0, levels);
    tz_tq_levels(TZ_TQ_TURBOQUANT, 2, &g_cb[2], levels);
    m->q2 = tz_params_add_quant(&m->ps, g_be, "q2", 33, 512, TZ_TQ_TURBOQUANT, 2, 256, 4, levels);
    m->frozen = tz_params_add_quant(&m->ps, g_be, "frozen", 16, 64, TZ_TQ_TURBOQUANT, 2, 64, 1,
                                    levels);
    m->q4->trainable = m->a3->trainable = m->q2->trainable = 1; /* full fine-tuning */
    tz_params_layout(&m->ps);
}

static tz_zero_plan plan_for(const tz_params *ps, int world, int64_t bucket_bytes) {
    int64_t off[16], num[16];
    int nt = 0;
    for (int i = ps->n - 1; i >= 0; i--)
        if (ps->p[i]->trainable) off[nt] = ps->p[i]->flat_off, num[nt++] = ps->p[i]->numel;
    tz_zero_desc d = {ps->flat_numel, nt, off, num, world, bucket_bytes, 4, TZ_FLAT_ALIGN};
    tz_zero_plan p;
    char err[256];
    if (tz_zero_plan_init(&p, &d, err, sizeof err)) {
        check(0, "plan: %s", err);
        exit(1);
    }
    return p;
}

/* codes and scales of p equal quantizing w whole (p's method) */
static int same_as_quantized(const tz_param *p, const float *w) {
    tz_tq_tensor t;
    char err[256];
    tz_tq_tensor_init(&t, p->q->bits, p->q->group, p->shape[0], p->shape[1], p->q->seed, err,
                      sizeof err);
    tz_tq_quantize_as(&t, p->q->method, &g_cb[p->q->bits], w);
    int same = !memcmp(t.codes, p->q->codes, (size_t)tz_tq_codes_bytes(t.rows, t.cols, t.bits)) &&
               !memcmp(t.scales, p->q->scales,
                       (size_t)tz_tq_scales_count(t.rows, t.cols, t.group) * 2);
    tz_tq_tensor_free(&t);
    return same;
}

static void test_round_trip(int world, int64_t bucket_bytes) {
    model m;
    model_make(&m);
    tz_zero_plan plan = plan_for(&m.ps, world, bucket_bytes);
    tz_zero_weights zw;
    tz_zero_weights_init(&zw, &plan, &m.ps);
    /* one master over the flat space: values in the tensors, zeros in the gaps */
    const int64_t F = m.ps.flat_numel;
    float *master = calloc((size_t)F, sizeof *master);
    tz_rng rng = tz_rng_make(7, (uint64_t)world, TZ_RNG_TEST, 0);
    for (int i = 0; i < m.ps.n; i++) {
        const tz_param *p = m.ps.p[i];
        if (p->trainable)
            for (int64_t k = 0; k < p->numel; k++)
                master[p->flat_off + k] = (float)(0.05 * tz_rng_normal(&rng));
    }
    uint8_t *chunk = malloc((size_t)(zw.max_chunk ? zw.max_chunk : 8));
    float *slice = malloc((size_t)plan.bucket_elems * 4);
    int64_t bytes = 0;
    for (int b = 0; b < plan.n_buckets; b++) {
        const tz_zero_bucket *bk = &plan.b[b];
        for (int r = 0; r < world; r++) {
            memset(slice, 0, (size_t)bk->slice * 4);
            for (int64_t s = 0; s < bk->slice; s++) {
                int64_t f = bk->start + (int64_t)r * bk->slice + s;
                if (f < bk->start + bk->len) slice[s] = master[f];
            }
            memset(chunk, 0xA5, (size_t)zw.bytes[b * world + r]);
            /* every other slice the way zero.c takes where nothing is gathered: the dense
             * pieces straight from the slice, the chunk (its dense bytes left as 0xA5,
             * which unpack must not write) for the quantized ones */
            const int direct = (b + r) % 2;
            if (direct) tz_zero_weights_put_dense(&zw, g_be, b, r, slice);
            tz_zero_weights_pack(&zw, b, r, slice, chunk, !direct);
            tz_zero_weights_unpack(&zw, g_be, b, r, chunk, !direct);
        }
        for (int r = 1; r < world; r++) bytes += zw.bytes[b * world + r];
    }
    int dense_ok = !memcmp(m.emb->w, master + m.emb->flat_off, (size_t)m.emb->numel * 4) &&
                   !memcmp(m.norm->w, master + m.norm->flat_off, (size_t)m.norm->numel * 4);
    check(dense_ok, "N=%d bucket %lld B: dense tensors = the master (packed or put directly)", world,
          (long long)bucket_bytes);
    check(same_as_quantized(m.q4, master + m.q4->flat_off) &&
              same_as_quantized(m.a3, master + m.a3->flat_off) &&
              same_as_quantized(m.q2, master + m.q2->flat_off),
          "N=%d bucket %lld B: quantized tensors = quantizing the whole master (turboquant 4 "
          "and 2 bits, absmax 3 bits), in %d buckets", world, (long long)bucket_bytes,
          plan.n_buckets);
    check(tz_zero_weights_gather_bytes(&zw, 0) == bytes && zw.quant_params == 80 * 192 + 48 * 256 + 33 * 512 &&
              zw.dense_params == 97 * 64 + 64,
          "N=%d: rank 0 receives %lld bytes per step; %lld quantized + %lld dense parameters", world,
          (long long)bytes, (long long)zw.quant_params, (long long)zw.dense_params);
    /* what crosses: bits/8 + 2/group bytes per quantized weight, 4 per dense one, plus at
     * most 7 bytes of alignment per piece; every rank receives what the others own */
    int64_t all = 0, npieces = zw.first[plan.n_buckets * world];
    for (int r = 0; r < world; r++) all += tz_zero_weights_gather_bytes(&zw, r);
    double ideal = (double)(world - 1) *
                   (80 * 192 * (0.5 + 2.0 / 64) + 48 * 256 * (3.0 / 8 + 2.0 / 128) +
                    33 * 512 * (0.25 + 2.0 / 256) + 4.0 * (97 * 64 + 64));
    check((double)all >= ideal && (double)all <= ideal + 7.0 * (double)(npieces * (world - 1)),
          "N=%d: all ranks receive %lld bytes = codes + scales + fp32 of the others' slices "
          "(%.0f) + alignment of %lld pieces", world, (long long)all, ideal, (long long)npieces);
    free(master), free(chunk), free(slice);
    tz_zero_weights_free(&zw);
    tz_zero_plan_free(&plan);
    tz_params_free(&m.ps, g_be);
}

static void test_read(void) {
    model m;
    model_make(&m);
    tz_zero_plan plan = plan_for(&m.ps, 3, 6000);
    tz_zero_weights zw;
    tz_zero_weights_init(&zw, &plan, &m.ps);
    tz_rng rng = tz_rng_make(8, 0, TZ_RNG_TEST, 0);
    for (int64_t k = 0; k < m.emb->numel; k++) m.emb->w[k] = (float)tz_rng_normal(&rng);
    /* q4 keeps its dense source; a3 and q2 have only codes (from a quantized folder) */
    float *src = malloc((size_t)m.q4->numel * 4), *w = malloc((size_t)m.q2->numel * 4);
    for (int64_t k = 0; k < m.q4->numel; k++) src[k] = (float)(0.02 * tz_rng_normal(&rng));
    m.q4->init = malloc((size_t)m.q4->numel * 4);
    memcpy(m.q4->init, src, (size_t)m.q4->numel * 4);
    for (int64_t k = 0; k < m.q2->numel; k++) w[k] = (float)(0.02 * tz_rng_normal(&rng));
    tz_tq_tensor t;
    char err[256];
    tz_tq_tensor_init(&t, 2, 256, 33, 512, 4, err, sizeof err);
    tz_tq_quantize(&t, &g_cb[2], w);
    memcpy(m.q2->q->codes, t.codes, (size_t)tz_tq_codes_bytes(33, 512, 2));
    memcpy(m.q2->q->scales, t.scales, (size_t)tz_tq_scales_count(33, 512, 256) * 2);
    float *dec = malloc((size_t)m.q2->numel * 4);
    tz_tq_dequantize(&t, &g_cb[2], dec);
    const int64_t F = m.ps.flat_numel;
    float *got = calloc((size_t)F, 4);
    float *slice = malloc((size_t)plan.bucket_elems * 4);
    for (int b = 0; b < plan.n_buckets; b++)
        for (int r = 0; r < 3; r++) {
            const tz_zero_bucket *bk = &plan.b[b];
            memset(slice, 0, (size_t)bk->slice * 4);
            tz_zero_weights_read(&zw, g_be, b, r, slice);
            for (int64_t s = 0; s < bk->slice; s++) {
                int64_t f = bk->start + (int64_t)r * bk->slice + s;
                if (f < bk->start + bk->len) got[f] = slice[s];
            }
        }
    check(!memcmp(got + m.emb->flat_off, m.emb->w, (size_t)m.emb->numel * 4),
          "read: a dense master starts at the weight");
    check(!memcmp(got + m.q4->flat_off, src, (size_t)m.q4->numel * 4),
          "read: a quantized master starts at the dense weight it was quantized from (p->init)");
    check(!memcmp(got + m.q2->flat_off, dec, (size_t)m.q2->numel * 4),
          "read: without it, at the decoded weight (a quantized folder)");
    tz_params_drop_init(&m.ps);
    check(m.q4->init == NULL, "tz_params_drop_init frees the dense sources");
    free(src), free(w), free(dec), free(got), free(slice);
    tz_tq_tensor_free(&t);
    tz_zero_weights_free(&zw);
    tz_zero_plan_free(&plan);
    tz_params_free(&m.ps, g_be);
}

int main(void) {
    char err[200];
    g_be = tz_cpu_backend_create(2);
    for (int b = 1; b <= TZ_TQ_MAX_BITS; b++) tz_tq_codebook_init(&g_cb[b], b, err, sizeof err);
    static const int64_t buckets[] = {1 << 20, 20000, 4096};
    for (int world = 1; world <= 4; world++)
        for (size_t k = 0; k < sizeof buckets / sizeof buckets[0]; k++)
            test_round_trip(world, buckets[k]);
    test_read();
    tz_cpu_backend_destroy(g_be);
    return tz_check_done("zero_weights");
}
