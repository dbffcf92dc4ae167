/* qzo (optim/qzo.h) on a tiny 4-bit TurboQuant Llama:
 *  1. a forward-only model computes the same loss, bit for bit, as one built for training,
 *     in a smaller arena (one activation set, two residual streams, no backward buffers);
 *  2. the perturbation is undone exactly: after steps with lr = 0 the scales are the same
 *     bytes; a perturbed scale is bf16(m + eps z); an update moves m by lr * clip(d) * z;
 *  3. the estimate agrees with the true directional derivative. The back-propagated gradient
 *     G of the mean loss with respect to every scale (from the gradient dL/dW_hat of a
 *     full-mode model with the same weights: dW_hat/dscale of a group is the group decoded
 *     with scale 1) is projected on each step's z, p_k = G . z_k, and compared with the
 *     estimates d_k over K = 400 seeds:
 *     a. d_k against p_k: correlation >= 0.98 and regression slope within [0.9, 1.1]. The
 *        estimate differs from p_k by the central difference's O(eps^2) term, the float
 *        rounding of the two losses, and mostly by the bf16 rounding of the perturbed scales
 *        (the model sees bf16(m + eps z), not m + eps z): at most half a bf16 step, 2^-9 of a
 *        scale of about 0.02 here, i.e. up to 4% of eps |z| per scale with independent
 *        signs, a few % of |p_k| in all (measured: correlation 0.9993, slope 0.994). Under the
 *        null (d unrelated to z) the correlation is 0 +- 1/sqrt(K) = 0.05.
 *     b. the SPSA mean (1/K) sum d_k z_k, which estimates G: its cosine with G. For an exact
 *        directional derivative and Gaussian z its expectation is about
 *        1/sqrt(1 + (n + 1)/K) (n scales; 0.31 for n = 3840, K = 400); the test requires at
 *        least half of that, and under the null the cosine is 0 +- 1/sqrt(n) = 0.016, so the
 *        bound is 9 null standard deviations away. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/world.h"
#include "backend/registry.h"
#include "core/dtype.h"
#include "model/llama.h"
#include "quant/turboquant.h"
#include "optim/qzo.h"
#include "tz_check.h"

static const tz_llama_dims k_dims = {.vocab = 64, .dim = 128, .hidden = 192, .n_layers = 2,
                                     .n_heads = 4, .n_kv_heads = 2, .head_dim = 32,
                                     .max_pos = 64, .eps = 1e-5, .theta = 10000.0, .tied = 1};
enum { B = 2, T = 16, BT = B * T, K = 400 };

static tz_llama *make(tz_backend *be, int full, int forward_only) {
    tz_model_opts o = {.full = full, .forward_only = forward_only};
    o.quant = (tz_quant_opts){.method = TZ_TQ_TURBOQUANT, .bits = 4, .group = 64, .seed = 5};
    tz_llama *m = tz_llama_create(be, &k_dims, &o);
    tz_llama_init_random(m, 3);
    tz_llama_setup(m, B, T);
    return m;
}

typedef struct batch {
    tz_llama *m;
    int32_t in[BT], tg[BT];
} batch;

static int64_t loss_fn(void *ctx) {
    batch *b = ctx;
    return tz_qzo_fixed(tz_llama_forward(b->m, b->in, b->tg));
}

static int same_scales(const tz_qzo *q, uint16_t **snap) {
    int same = 1;
    for (int i = 0; i < q->n; i++)
        same &= !memcmp(snap[i], q->t[i].p->q->scales, (size_t)q->t[i].n * sizeof(uint16_t));
    return same;
}

/* G[k] for every scale of q's tensors (in q's order), from the full-mode model f holding the
 * same weights: <dL/dW_hat of group k, the group decoded with scale 1>. */
static void scale_gradient(tz_llama *f, const tz_qzo *q, double *G) {
    int64_t off = 0;
    for (int i = 0; i < q->n; i++) {
        const tz_param *pq = q->t[i].p;
        const tz_param *pf = tz_params_find(&f->params, pq->name);
        tz_tq_tensor t;
        char err[128];
        tz_tq_tensor_init(&t, pq->q->bits, pq->q->group, pq->shape[0], pq->shape[1], pq->q->seed,
                          err, sizeof err);
        memcpy(t.codes, pq->q->codes, (size_t)tz_tq_codes_bytes(t.rows, t.cols, t.bits));
        for (int64_t k = 0; k < q->t[i].n; k++) t.scales[k] = tz_f32_to_bf16(1.0f);
        tz_tq_codebook cb;
        tz_tq_codebook_init(&cb, pq->q->bits, err, sizeof err);
        float *u = malloc((size_t)pq->numel * sizeof *u);
        tz_tq_dequantize_as(&t, pq->q->method, &cb, u);
        const int64_t g = pq->q->group;
        for (int64_t k = 0; k < q->t[i].n; k++) {
            double s = 0.0;
            for (int64_t j = 0; j < g; j++) s += (double)pf->g[k * g + j] * (double)u[k * g + j];
            G[off + k] = s;
        }
        off += q->t[i].n;
        free(u);
        tz_tq_tensor_free(&t);
    }
}

int main(int argc, char **argv) {
    tz_mpi_singleton_defaults();
    MPI_Init(&argc, &argv);
    tz_backend *be = tz_cpu_backend_create(2);
    batch b;
    for (int i = 0; i < BT; i++) {
        b.in[i] = (int32_t)((i * 7 + 3) % k_dims.vocab);
        b.tg[i] = (int32_t)((i * 5 + 11) % k_dims.vocab);
    }

    /* 1. forward-only: the same loss in a smaller arena */
    tz_llama *mf = make(be, 0, 1), *mt = make(be, 0, 0);
    b.m = mf;
    double lf = tz_llama_forward(mf, b.in, b.tg), lt = tz_llama_forward(mt, b.in, b.tg);
    check(lf == lt, "forward-only loss %.9g == training-built model's %.9g", lf, lt);
    check(mf->arena.cap < mt->arena.cap && !mf->dres && !mf->dq && mf->stack.n_sets == 1 &&
              mf->stack.xin[2] == mf->stack.xin[0],
          "forward-only arena %zu bytes (training: %zu): one activation set, two residual "
          "streams, no backward buffers", mf->arena.cap, mt->arena.cap);
    tz_llama_free(mt);

    /* 2. exact restore, the perturbation, the update */
    tz_qzo q;
    tz_qzo_init(&q, &mf->params, be, 77);
    check(q.n == 14 && q.n_scales == 3840, "%d quantized tensors, %lld scales (14, 3840)", q.n,
          (long long)q.n_scales);
    uint16_t **snap = calloc((size_t)q.n, sizeof *snap);
    for (int i = 0; i < q.n; i++) {
        snap[i] = malloc((size_t)q.t[i].n * sizeof(uint16_t));
        memcpy(snap[i], q.t[i].p->q->scales, (size_t)q.t[i].n * sizeof(uint16_t));
    }
    const double eps = 1e-3;
    int moved = 1;
    for (int s = 0; s < 5; s++) {
        tz_qzo_stats st = tz_qzo_step(&q, (uint64_t)s, eps, 100.0, 0.0, loss_fn, &b, NULL, BT);
        moved &= st.lplus != st.lminus;
    }
    check(moved, "l+ != l- at every step (the perturbation reaches the forward pass)");
    check(same_scales(&q, snap), "lr = 0: scales bit-identical after 5 steps");
    check(tz_llama_forward(mf, b.in, b.tg) == lf, "lr = 0: the loss is the same bits again");

    float *z = malloc((size_t)q.t[0].n * sizeof *z);
    tz_qzo_noise(&q, 9, 0, z);
    tz_qzo_perturb(&q, 9, eps);
    int pert_ok = 1;
    for (int64_t k = 0; k < q.t[0].n; k++)
        pert_ok &= q.t[0].p->q->scales[k] ==
                   tz_f32_to_bf16((float)((double)q.t[0].master[k] + eps * (double)z[k]));
    tz_qzo_perturb(&q, 9, 0.0);
    check(pert_ok, "a perturbed scale is bf16(m + eps z)");
    check(same_scales(&q, snap), "perturb(0) restores the scales");

    /* clip 0.01, lr 0.05: m moves by 5e-4 * sign(d) * z */
    float *m0 = malloc((size_t)q.t[0].n * sizeof *m0);
    memcpy(m0, q.t[0].master, (size_t)q.t[0].n * sizeof *m0);
    tz_qzo_stats st = tz_qzo_step(&q, 9, eps, 0.01, 0.05, loss_fn, &b, NULL, BT);
    const double a = 0.05 * (st.d > 0.01 ? 0.01 : st.d < -0.01 ? -0.01 : st.d);
    double worst = 0.0;
    for (int64_t k = 0; k < q.t[0].n; k++) {
        double want = (double)m0[k] - a * (double)z[k];
        if (want < 1e-7) want = 1e-7;
        double e = fabs((double)q.t[0].master[k] - want) / fabs(want);
        if (e > worst) worst = e;
    }
    check(fabs(st.d) > 0.01 && worst < 1e-6,
          "update with clip 0.01: |d| = %.3g clipped, m - lr*clip(d)*z within %.2g", fabs(st.d),
          worst);
    int stored = 1;
    for (int64_t k = 0; k < q.t[0].n; k++)
        stored &= q.t[0].p->q->scales[k] == tz_f32_to_bf16(q.t[0].master[k]);
    check(stored, "after the update the scales are bf16(m)");
    tz_qzo_free(&q);
    tz_llama_free(mf);

    /* 3. the estimate against the back-propagated directional derivative */
    tz_llama *mz = make(be, 0, 1), *mg = make(be, 1, 0);
    b.m = mz;
    tz_qzo_init(&q, &mz->params, be, 4242);
    int same_q = 1;
    for (int i = 0; i < q.n; i++) {
        const tz_param *pg = tz_params_find(&mg->params, q.t[i].p->name);
        same_q &= pg && pg->q && !memcmp(pg->q->scales, q.t[i].p->q->scales,
                                         (size_t)q.t[i].n * sizeof(uint16_t));
    }
    check(same_q, "the full-mode model holds the same scales");
    float *gbuf = be->alloc(be, (size_t)mg->params.flat_numel * sizeof(float));
    tz_params_bind_grads(&mg->params, gbuf);
    double lg = tz_llama_forward_backward(mg, b.in, b.tg, 1.0f / BT);
    check(lg == tz_llama_forward(mz, b.in, b.tg), "both models give the same loss");
    const int64_t n = q.n_scales;
    double *G = calloc((size_t)n, sizeof *G), *mean = calloc((size_t)n, sizeof *mean);
    scale_gradient(mg, &q, G);
    float *zk = malloc((size_t)n * sizeof *zk);
    double sdd = 0, spp = 0, sdp = 0, sd = 0, sp = 0;
    for (int k = 0; k < K; k++) {
        const uint64_t step = 1000 + (uint64_t)k;
        tz_qzo_stats r = tz_qzo_step(&q, step, eps, 1e9, 0.0, loss_fn, &b, NULL, BT);
        int64_t off = 0;
        for (int i = 0; i < q.n; i++) {
            tz_qzo_noise(&q, step, i, zk + off);
            off += q.t[i].n;
        }
        double p = 0.0;
        for (int64_t j = 0; j < n; j++) p += G[j] * zk[j];
        for (int64_t j = 0; j < n; j++) mean[j] += r.d * zk[j] / K;
        sdd += r.d * r.d, spp += p * p, sdp += r.d * p, sd += r.d, sp += p;
    }
    const double cov = sdp / K - sd / K * sp / K;
    const double corr = cov / sqrt((sdd / K - sd / K * sd / K) * (spp / K - sp / K * sp / K));
    const double slope = sdp / spp;
    check(corr >= 0.98 && slope >= 0.9 && slope <= 1.1,
          "d against G.z over %d seeds: correlation %.5f (>= 0.98), slope %.4f (0.9..1.1)", K,
          corr, slope);
    double gg = 0, mm = 0, gm = 0;
    for (int64_t j = 0; j < n; j++) gg += G[j] * G[j], mm += mean[j] * mean[j], gm += G[j] * mean[j];
    const double cosine = gm / sqrt(gg * mm), expect = 1.0 / sqrt(1.0 + (double)(n + 1) / K);
    check(cosine >= 0.5 * expect,
          "mean of d z over %d seeds against G: cosine %.4f (expected about %.3f, required >= "
          "%.3f; null 0 +- %.3f)", K, cosine, expect, 0.5 * expect, 1.0 / sqrt((double)n));
    for (int i = 0; i < 14; i++) free(snap[i]);
    free(snap);
    free(z);
    free(m0);
    free(zk);
    free(G);
    free(mean);
    be->release(be, gbuf);
    tz_qzo_free(&q);
    tz_llama_free(mz);
    tz_llama_free(mg);
    tz_cpu_backend_destroy(be);
    MPI_Finalize();
    return tz_check_done("test_qzo");
}
