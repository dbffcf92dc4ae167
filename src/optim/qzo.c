/* QZO: the per-group scales of the quantized weights trained from pairs of forward passes
 * (optim/qzo.h has the algorithm, the random streams and the summation rule). */
#include "optim/qzo.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "comm/comm.h"
#include "quant/tq_layout.h"
#include "optim/optim.h"

#define FIXED_ONE 16777216.0 /* 2^24: the fixed-point unit of loss sums is 2^-24 */
#define FIXED_MAX 1073741824.0 /* 2^30: the largest loss sum of one rank (2^54 units) */

static int64_t scales_of(const tz_param *p) {
    return tz_tq_scales_count(p->shape[0], p->shape[1], p->q->group);
}


void tz_qzo_init(tz_qzo *q, tz_params *ps, tz_backend *be, uint64_t seed) {
    memset(q, 0, sizeof *q);
    q->be = be;
    q->seed = seed;
    int64_t largest = 0;
    for (int i = 0; i < ps->n; i++) q->n += ps->p[i]->q != NULL;
    q->t = tz_xcalloc((size_t)(q->n ? q->n : 1), sizeof *q->t);
    for (int i = 0, j = 0; i < ps->n; i++) {
        tz_param *p = ps->p[i];
        if (!p->q) continue;
        tz_qzo_tensor *t = &q->t[j++];
        t->p = p;
        t->n = scales_of(p);
        t->master = tz_xmalloc((size_t)t->n * sizeof *t->master);
        q->n_scales += t->n;
        if (t->n > largest) largest = t->n;
    }
    q->stage = tz_xmalloc((size_t)(largest ? largest : 1) * sizeof *q->stage);
    for (int i = 0; i < q->n; i++) { /* bf16 widens exactly: bf16(m) gives the bits back */
        tz_qzo_tensor *t = &q->t[i];
        be->download(be, q->stage, t->p->q->scales, (size_t)t->n * sizeof *q->stage);
        for (int64_t k = 0; k < t->n; k++) t->master[k] = tz_bf16_to_f32(q->stage[k]);
    }
    q->host_bytes = (size_t)q->n_scales * sizeof(float) + (size_t)largest * sizeof(uint16_t);
}

void tz_qzo_free(tz_qzo *q) {
    for (int i = 0; i < q->n; i++) free(q->t[i].master);
    free(q->t);
    free(q->stage);
    q->t = NULL;
    q->stage = NULL;
    q->n = 0;
}

/* z of block k of tensor i at step: up to TZ_QZO_BLOCK values into z. */
static void noise_block(const tz_qzo *q, uint64_t step, int i, int64_t k, int64_t count,
                        double *z) {
    tz_rng r = tz_rng_make(q->seed, step, TZ_RNG_QZO, (uint64_t)i << 32 | (uint64_t)k);
    for (int64_t j = 0; j < count; j++) z[j] = tz_rng_normal(&r);
}

void tz_qzo_noise(const tz_qzo *q, uint64_t step, int i, float *z) {
    const int64_t n = q->t[i].n, nb = (n + TZ_QZO_BLOCK - 1) / TZ_QZO_BLOCK;
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < nb; k++) {
        double buf[TZ_QZO_BLOCK];
        const int64_t c = n - k * TZ_QZO_BLOCK < TZ_QZO_BLOCK ? n - k * TZ_QZO_BLOCK : TZ_QZO_BLOCK;
        noise_block(q, step, i, k, c, buf);
        for (int64_t j = 0; j < c; j++) z[k * TZ_QZO_BLOCK + j] = (float)buf[j];
    }
}

/* One pass over every scale: update (a != 0: m <- max(m - a z, floor)), then the model's
 * scales <- bf16(m + c z). z is drawn only when a or c needs it. Blocks are independent
 * streams, so the threads' split does not change any value. */
static void pass(tz_qzo *q, uint64_t step, double a, double c) {
    const int draw = a != 0.0 || c != 0.0;
    for (int i = 0; i < q->n; i++) {
        tz_qzo_tensor *t = &q->t[i];
        const int64_t n = t->n, nb = (n + TZ_QZO_BLOCK - 1) / TZ_QZO_BLOCK;
        float *m = t->master;
        uint16_t *out = q->stage;
#pragma omp parallel for schedule(static)
        for (int64_t k = 0; k < nb; k++) {
            double z[TZ_QZO_BLOCK];
            const int64_t first = k * TZ_QZO_BLOCK;
            const int64_t cnt = n - first < TZ_QZO_BLOCK ? n - first : TZ_QZO_BLOCK;
            if (draw) noise_block(q, step, i, k, cnt, z);
            for (int64_t j = 0; j < cnt; j++) {
                float v = m[first + j];
                if (v > 0.0f && a != 0.0) {
                    v = (float)((double)v - a * z[j]);
                    if (!(v >= TZ_QZO_MIN_SCALE)) v = TZ_QZO_MIN_SCALE; /* NaN too */
                    m[first + j] = v;
                }
                float s = v > 0.0f && c != 0.0 ? (float)((double)v + c * z[j]) : v;
                out[first + j] = tz_f32_to_bf16(s);
            }
        }
        q->be->upload(q->be, t->p->q->scales, out, (size_t)n * sizeof *out);
    }
}

void tz_qzo_perturb(tz_qzo *q, uint64_t step, double c) { pass(q, step, 0.0, c); }

void tz_qzo_update(tz_qzo *q, uint64_t step, double a) { pass(q, step, a, 0.0); }

int64_t tz_qzo_fixed(double loss_sum) {
    if (!isfinite(loss_sum) || fabs(loss_sum) >= FIXED_MAX)
        TZ_FATAL_HINT("lower optim.lr or qzo.eps, or check the data",
                      "qzo: a micro-batch's loss sum %g is not finite or beyond %g", loss_sum,
                      FIXED_MAX);
    return (int64_t)llround(loss_sum * FIXED_ONE);
}

tz_qzo_stats tz_qzo_step(tz_qzo *q, uint64_t step, double eps, double clip, double lr,
                         int64_t (*fn)(void *ctx), void *ctx, tz_comm *comm, double total) {
    int64_t l[2];
    tz_qzo_perturb(q, step, eps);
    l[0] = fn(ctx);
    tz_qzo_perturb(q, step, -eps);
    l[1] = fn(ctx);
    if (comm && comm->size > 1) tz_comm_all_reduce(comm, l, l, 2, TZ_DT_I64);
    tz_qzo_stats s;
    s.lplus = (double)l[0] / FIXED_ONE / total;
    s.lminus = (double)l[1] / FIXED_ONE / total;
    s.loss = 0.5 * (s.lplus + s.lminus);
    s.d = (double)(l[0] - l[1]) / FIXED_ONE / total / (2.0 * eps);
    s.lr = lr;
    const double d = s.d > clip ? clip : s.d < -clip ? -clip : s.d;
    tz_qzo_update(q, step, lr * d); /* also puts the unperturbed scales back */
    return s;
}

/* ---- the training loop's side ---- */

tz_qzo *tz_qzo_create(const tz_config *cfg, tz_task *task, tz_comm *comm) {
    if (!task->train_loss)
        TZ_FATAL("train.mode = \"qzo\": the %s family has no forward-only training loss",
                 task->family->name);
    tz_qzo *q = tz_xcalloc(1, sizeof *q);
    tz_qzo_init(q, task->params, task->be, (uint64_t)cfg->run.seed);
    if (q->n == 0)
        TZ_FATAL_HINT("set quant.bits (2, 3 or 4), or give a model.path written by `turbozero "
                      "quantize`",
                      "%s: train.mode = \"qzo\" trains the quantization scales, and model.path "
                      "%s is dense (quant.bits = 0)", cfg->source, cfg->model.path);
    q->cfg = cfg;
    q->task = task;
    q->comm = comm;
    return q;
}

void tz_qzo_destroy(tz_qzo *q) {
    if (!q) return;
    tz_qzo_free(q);
    free(q);
}

typedef struct step_ctx {
    tz_task *task;
    int64_t step, accum, N, rank;
} step_ctx;

/* This rank's loss sum over its micro-batches of the step, in fixed point. */
static int64_t rank_loss(void *ctx) {
    const step_ctx *c = ctx;
    const int64_t B = c->task->B;
    int64_t sum = 0;
    for (int64_t k = 0; k < c->accum; k++)
        sum += tz_qzo_fixed(c->task->train_loss(c->task, ((c->step * c->accum + k) * c->N + c->rank) * B));
    return sum;
}

tz_qzo_stats tz_qzo_train_step(tz_qzo *q, int64_t step, double total) {
    const tz_config *cfg = q->cfg;
    step_ctx c = {q->task, step, cfg->train.grad_accum, q->comm->size, q->comm->rank};
    const double lr = cfg->qzo.schedule == TZ_QZO_COSINE
                          ? tz_lr_at(step, cfg->train.steps, cfg->optim.warmup, cfg->optim.lr,
                                     cfg->optim.min_lr_ratio)
                          : cfg->optim.lr;
    return tz_qzo_step(q, (uint64_t)step, cfg->qzo.eps, cfg->qzo.clip, lr, rank_loss, &c, q->comm,
                       total);
}

void tz_qzo_print(const tz_qzo *q) {
    const tz_config *cfg = q->cfg;
    const tz_params *ps = q->task->params;
    tz_info("qzo: %lld scales of %d quantized weights train (%.3f%% of %lld parameters) | eps "
            "%g, clip %g, lr %g %s | 2 forward passes per micro-batch",
            (long long)q->n_scales, q->n, 100.0 * (double)q->n_scales / (double)ps->n_total,
            (long long)ps->n_total, cfg->qzo.eps, cfg->qzo.clip, cfg->optim.lr,
            cfg->qzo.schedule == TZ_QZO_COSINE ? "cosine" : "constant");
    tz_info("memory per rank: weights %.2f MiB + forward activations %.1f MiB + fp32 scales "
            "%.2f MiB; no gradients, no optimizer moments, no backward buffers",
            (double)tz_params_bytes(ps) / 1048576.0, (double)q->task->arena_bytes / 1048576.0,
            (double)q->host_bytes / 1048576.0);
}
