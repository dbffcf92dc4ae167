/* The optimizer interface and the host shard: the registry and AdamW's state names, AdamW
 * against a double-precision scalar reference, the same bits for any range split or thread
 * count, a shard built for optimizers with 0 and 3 states (bytes, fp32, bf16), a checkpoint
 * shard file keeping each state in its element type, the blocked sum of squares. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "io/ckpt_h5.h"
#include "comm/world.h"
#include "optim/adamw.h"
#include "optim/optim.h"
#include "tz_check.h"

static tz_world g_world; /* no NUMA node: plain aligned host memory */

static void fill_normal(float *x, int64_t n, double sd, uint64_t seed) {
    tz_rng r = tz_rng_make(seed, 0, 7, 0);
    for (int64_t i = 0; i < n; i++) x[i] = (float)(sd * tz_rng_normal(&r));
}

/* ---- AdamW against a scalar double reference ---- */

static void test_registry(void) {
    const tz_optim *o = tz_optim_find("adamw");
    check(o == &tz_optim_adamw, "registry finds adamw");
    check(tz_optim_find("adam") == NULL && tz_optim_find("") == NULL, "registry: unknown names give NULL");
    check(o && o->n_states == 2 && strcmp(o->state_names[0], "exp_avg") == 0 &&
              strcmp(o->state_names[1], "exp_avg_sq") == 0,
          "adamw states are exp_avg, exp_avg_sq (torch.optim.AdamW's names)");
}

static void test_adamw_reference(void) {
    const int64_t n = 1000;
    float *w = malloc(n * sizeof *w), *m = calloc(n, sizeof *m), *v = calloc(n, sizeof *v);
    float *g = malloc(n * sizeof *g);
    uint8_t *decay = malloc(n);
    double *rw = malloc(n * sizeof *rw), *rm = calloc(n, sizeof *rm), *rv = calloc(n, sizeof *rv);
    fill_normal(w, n, 0.5, 1);
    for (int64_t i = 0; i < n; i++) rw[i] = w[i], decay[i] = (uint8_t)(i % 3 != 0);
    const tz_optim_hparams h = {.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                                .weight_decay = 0.1};
    double worst[3] = {0, 0, 0};
    for (int64_t t = 1; t <= 10; t++) {
        fill_normal(g, n, t % 2 ? 1e-2 : 3.0, 100 + (uint64_t)t); /* small and large gradients */
        const float scale = t == 4 ? 0.25f : 1.0f;                 /* a clipped step */
        tz_optim_arrays a = {.w = w, .g = g, .decay = decay, .state = {m, v}};
        tz_adamw_step(&a, 0, n, t, &h, scale);
        const double c1 = 1.0 / (1.0 - pow(h.beta1, (double)t)), c2 = 1.0 / (1.0 - pow(h.beta2, (double)t));
        for (int64_t i = 0; i < n; i++) {
            double gi = (double)g[i] * scale;
            rm[i] = h.beta1 * rm[i] + (1 - h.beta1) * gi;
            rv[i] = h.beta2 * rv[i] + (1 - h.beta2) * gi * gi;
            double wd = decay[i] ? h.weight_decay : 0.0;
            rw[i] -= h.lr * (rm[i] * c1 / (sqrt(rv[i] * c2) + h.eps) + wd * rw[i]);
            /* relative to the size of what is rounded: w and its step (lr * O(1)); m can
             * cancel to near 0 (gradients of alternating size and sign): relative to sqrt(v) */
            double e = fabs(w[i] - rw[i]) / (fabs(rw[i]) + h.lr);
            double em = fabs(m[i] - rm[i]) / sqrt(rv[i]);
            double ev = fabs(v[i] - rv[i]) / rv[i];
            if (e > worst[0]) worst[0] = e;
            if (em > worst[1]) worst[1] = em;
            if (ev > worst[2]) worst[2] = ev;
        }
    }
    /* fp32 arithmetic against double over 10 steps: a few ulps of float */
    check(worst[0] < 1e-6 && worst[1] < 1e-6 && worst[2] < 1e-6,
          "adamw vs double reference over 10 steps (decay mask, clip 0.25): worst relative "
          "error w %.1e, exp_avg %.1e, exp_avg_sq %.1e", worst[0], worst[1], worst[2]);

    /* decay NULL = decay everywhere; zero gradient with decay shrinks w by lr*wd exactly-ish */
    float w1[4] = {1, -2, 3, 0.5f}, m1[4] = {0}, v1[4] = {0}, g1[4] = {0};
    tz_optim_arrays a1 = {.w = w1, .g = g1, .decay = NULL, .state = {m1, v1}};
    tz_adamw_step(&a1, 0, 4, 1, &h, 1.0f);
    check(fabsf(w1[1] - (-2.0f * (1.0f - 3e-4f))) < 1e-6f && m1[0] == 0 && v1[0] == 0,
          "adamw: zero gradient, decay everywhere: w *= 1 - lr*wd (w[1] = %.7f)", w1[1]);
    free(w), free(m), free(v), free(g), free(decay), free(rw), free(rm), free(rv);
}

/* AdamW on [0, n) in one call and on random ranges gives the same bits. */
static void test_adamw_split(void) {
    const int64_t n = 4099;
    float *x = malloc(6 * n * sizeof *x);
    float *w0 = x, *m0 = x + n, *v0 = x + 2 * n, *w1 = x + 3 * n, *m1 = x + 4 * n, *v1 = x + 5 * n;
    float *g = malloc(n * sizeof *g);
    fill_normal(w0, n, 1, 3);
    fill_normal(g, n, 1, 4);
    memset(m0, 0, 2 * n * sizeof *x);
    memcpy(w1, w0, n * sizeof *x);
    memset(m1, 0, 2 * n * sizeof *x);
    const tz_optim_hparams h = {1e-2, 0.9, 0.999, 1e-8, 0.01};
    tz_rng r = tz_rng_make(5, 0, 0, 0);
    for (int t = 1; t <= 3; t++) {
        tz_optim_arrays a0 = {.w = w0, .g = g, .state = {m0, v0}};
        tz_optim_arrays a1 = {.w = w1, .g = g, .state = {m1, v1}};
        tz_adamw_step(&a0, 0, n, t, &h, 0.5f);
        for (int64_t lo = 0; lo < n;) {
            int64_t hi = lo + 1 + (int64_t)tz_rng_below(&r, 40);
            if (hi > n) hi = n;
            tz_adamw_step(&a1, lo, hi, t, &h, 0.5f);
            lo = hi;
        }
    }
    check(memcmp(w0, w1, 3 * n * sizeof *x) == 0, "adamw: ranges of 1-40 elements give the bits of one call");
    free(x), free(g);
}

/* ---- the shard over optimizers with 0 and 3 states, of three element types ---- */

/* Counts how often each element is stepped (a byte), and checks the arrays it is handed: the
 * scaled gradient (fp32) and the step with the decay flag (bf16). */
static void count_step(const tz_optim_arrays *a, int64_t lo, int64_t hi, int64_t t,
                       const tz_optim_hparams *h, float grad_scale) {
    uint8_t *visits = a->state[0];
    float *sg = a->state[1];
    uint16_t *sd = a->state[2];
    for (int64_t i = lo; i < hi; i++) {
        visits[i] += 1;
        sg[i] = a->g[i] * grad_scale;
        sd[i] = tz_f32_to_bf16((float)t + (a->decay[i] ? 0.5f : 0.0f));
        a->w[i] -= (float)h->lr;
    }
}
static const tz_optim counter = {.name = "counter", .n_states = 3,
                                 .state_names = {"visits", "scaled_grad", "step_decay"},
                                 .state_types = {TZ_DT_U8, TZ_DT_F32, TZ_DT_BF16},
                                 .step = count_step};

/* Plain SGD: no state. */
static void sgd_step(const tz_optim_arrays *a, int64_t lo, int64_t hi, int64_t t,
                     const tz_optim_hparams *h, float grad_scale) {
    for (int64_t i = lo; i < hi; i++) a->w[i] -= (float)h->lr * a->g[i] * grad_scale;
}
static const tz_optim sgd = {.name = "sgd", .step = sgd_step};

static void test_shard_generic(void) {
    const int64_t sizes[] = {0, 1, 15, 17, 40000, 100003};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        const int64_t n = sizes[k];
        /* three states */
        tz_shard s;
        tz_shard_init(&s, &counter, n, &g_world);
        int names = s.n_arrays == 6 && strcmp(s.a[TZ_SHARD_MASTER].name, "master") == 0 &&
                    strcmp(s.a[TZ_SHARD_ACC].name, "grad_acc") == 0 &&
                    strcmp(s.a[TZ_SHARD_DECAY].name, "decay") == 0 &&
                    strcmp(s.a[TZ_SHARD_STATE0 + 2].name, "step_decay") == 0 &&
                    s.a[TZ_SHARD_MASTER].saved && !s.a[TZ_SHARD_ACC].saved &&
                    !s.a[TZ_SHARD_DECAY].saved && s.a[TZ_SHARD_STATE0].saved;
        int types = s.a[TZ_SHARD_STATE0].dtype == TZ_DT_U8 &&
                    s.a[TZ_SHARD_STATE0].elem_bytes == 1 &&
                    s.a[TZ_SHARD_STATE0 + 2].dtype == TZ_DT_BF16 &&
                    s.a[TZ_SHARD_STATE0 + 2].elem_bytes == 2 && tz_shard_elem_bytes(&s) == 16;
        check(names && types && s.bytes == (size_t)n * (1 + 4 + 2 + 4 + 4 + 1),
              "n=%lld, 3 states (u8, f32, bf16): arrays master, grad_acc, decay + the "
              "optimizer's, %zu bytes", (long long)n, s.bytes);
        for (int64_t i = 0; i < n; i++) s.acc[i] = (float)i, s.decay[i] = (uint8_t)(i & 1);
        const tz_optim_hparams h = {.lr = 0.25};
        int ok = 1;
        for (int nt = 1; nt <= 4; nt++) {
            omp_set_num_threads(nt);
            tz_shard_update(&s, &h, 7, 0.5f);
            const uint8_t *vis = tz_shard_state(&s, 0);
            const float *sg = tz_shard_state(&s, 1);
            const uint16_t *sd = tz_shard_state(&s, 2);
            for (int64_t i = 0; i < n; i++)
                ok &= vis[i] == nt && sg[i] == 0.5f * (float)i &&
                      tz_bf16_to_f32(sd[i]) == 7.0f + (i & 1 ? 0.5f : 0.0f) &&
                      s.master[i] == -0.25f * (float)nt;
        }
        check(ok, "n=%lld: 1-4 threads step every element exactly once with its own arrays", (long long)n);
        char buf[128];
        tz_shard_describe(&s, buf, sizeof buf);
        check(strcmp(buf, "master, grad_acc, decay, visits (U8), scaled_grad, step_decay (BF16)") == 0,
              "describe: %s", buf);
        tz_shard_free(&s);

        /* no state */
        tz_shard_init(&s, &sgd, n, &g_world);
        for (int64_t i = 0; i < n; i++) s.acc[i] = 1.0f, s.master[i] = 2.0f;
        tz_shard_update(&s, &h, 1, 2.0f);
        ok = s.n_arrays == 3 && s.bytes == (size_t)n * 9;
        for (int64_t i = 0; i < n; i++) ok &= s.master[i] == 1.5f;
        check(ok, "n=%lld, no state (sgd): 9 bytes per element, stepped", (long long)n);
        tz_shard_free(&s);
    }
    omp_set_num_threads(omp_get_num_procs());

    /* AdamW in a shard: same bits for 1, 2, 3 threads */
    const int64_t n = 70001;
    float *ref = malloc(3 * n * sizeof *ref);
    int same = 1;
    for (int nt = 1; nt <= 3; nt++) {
        omp_set_num_threads(nt);
        tz_shard s;
        tz_shard_init(&s, &tz_optim_adamw, n, &g_world);
        fill_normal(s.master, n, 1, 11);
        for (int64_t i = 0; i < n; i++) s.decay[i] = (uint8_t)(i % 5 != 0);
        const tz_optim_hparams h = {1e-3, 0.9, 0.999, 1e-8, 0.1};
        for (int t = 1; t <= 3; t++) {
            fill_normal(s.acc, n, 1, 20 + (uint64_t)t);
            tz_shard_update(&s, &h, t, 0.7f);
        }
        float *got[3] = {s.master, tz_shard_state(&s, 0), tz_shard_state(&s, 1)};
        for (int k = 0; k < 3; k++) {
            if (nt == 1) memcpy(ref + k * n, got[k], n * sizeof *ref);
            else same &= memcmp(ref + k * n, got[k], n * sizeof *ref) == 0;
        }
        tz_shard_free(&s);
    }
    omp_set_num_threads(omp_get_num_procs());
    check(same, "adamw shard of %lld elements: master, exp_avg, exp_avg_sq bit-identical for 1, 2, 3 threads", (long long)n);
    free(ref);
}

/* ---- a checkpoint shard file keeps each state in its own element type ---- */

static void test_checkpoint_types(void) {
    char dir[] = "/tmp/tzoptimXXXXXX", path[64], err[512] = "";
    if (!mkdtemp(dir)) {
        check(0, "mkdtemp");
        return;
    }
    snprintf(path, sizeof path, "%s/rank-00000.h5", dir);
    enum { N = 1000 };
    static float f[N], f2[N];
    static uint16_t h[N], h2[N];
    static uint8_t b[N], b2[N];
    for (int i = 0; i < N; i++)
        f[i] = (float)i * 0.37f - 11.0f, h[i] = tz_f32_to_bf16(f[i]), b[i] = (uint8_t)(i * 7);
    const int64_t shape[1] = {N}, pieces[2] = {0, N};
    tz_h5_shard *w = tz_h5_shard_create(path, err, sizeof err);
    int rc = !w || tz_h5_shard_write(w, "master", "t", TZ_DT_F32, f, N, shape, 1, 0, pieces, 1, err, sizeof err) ||
             tz_h5_shard_write(w, "exp_avg", "t", TZ_DT_BF16, h, N, shape, 1, 0, pieces, 1, err, sizeof err) ||
             tz_h5_shard_write(w, "codes", "t", TZ_DT_U8, b, N, shape, 1, 0, pieces, 1, err, sizeof err);
    if (w && tz_h5_shard_close(w, rc ? NULL : err, rc ? 0 : sizeof err)) rc = 1;
    check(!rc, "a shard file with fp32, bf16 and byte datasets written%s%s", rc ? ": " : "", err);
    tz_h5_shard *r = tz_h5_shard_open(path, err, sizeof err);
    /* a slice of each, read back as its type */
    rc = !r || tz_h5_shard_read(r, "master", "t", TZ_DT_F32, N, 100, 800, f2, err, sizeof err) ||
         tz_h5_shard_read(r, "exp_avg", "t", TZ_DT_BF16, N, 100, 800, h2, err, sizeof err) ||
         tz_h5_shard_read(r, "codes", "t", TZ_DT_U8, N, 100, 800, b2, err, sizeof err);
    check(!rc && !memcmp(f2, f + 100, 800 * sizeof *f) && !memcmp(h2, h + 100, 800 * sizeof *h) &&
              !memcmp(b2, b + 100, 800),
          "elements 100..899 of each read back bit for bit%s%s", rc ? ": " : "", rc ? err : "");
    /* a state kept in another type than the file's: refused, both named */
    err[0] = 0;
    rc = r ? tz_h5_shard_read(r, "exp_avg", "t", TZ_DT_F32, N, 0, 10, f2, err, sizeof err) : 0;
    check(rc && strstr(err, "dataset exp_avg/t holds 2-byte integers, this run keeps it as "
                            "4-byte floats (F32)"),
          "a bf16 state read as fp32 is refused: %s", err);
    if (r) tz_h5_shard_close(r, NULL, 0);
    unlink(path);
    rmdir(dir);
}

/* ---- the blocked sum of squares ---- */

static void test_sumsq(void) {
    const int64_t B = TZ_SHARD_SUMSQ_BLOCK;
    const int64_t sizes[] = {0, 1, 15, 16, 17, B - 1, B, B + 1, 4 * B + 17, 3000001};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        const int64_t n = sizes[k];
        tz_shard s;
        tz_shard_init(&s, &tz_optim_adamw, n, &g_world);
        fill_normal(s.acc, n, 1e-3, 40 + k);
        for (int64_t i = 0; i < n; i += 997) s.acc[i] *= 1e4f; /* a few large values */
        long double ref = 0;
        double serial = 0;
        for (int64_t i = 0; i < n; i++) {
            ref += (long double)s.acc[i] * s.acc[i];
            serial += (double)s.acc[i] * (double)s.acc[i];
        }
        double got[3];
        for (int nt = 1; nt <= 3; nt++) {
            omp_set_num_threads(nt);
            got[nt - 1] = tz_shard_sumsq(&s);
        }
        omp_set_num_threads(omp_get_num_procs());
        const double rel = n ? fabs((double)((long double)got[0] - ref)) / (double)ref : fabs(got[0]);
        const double rel_serial = n ? fabs((double)((long double)serial - ref)) / (double)ref : 0;
        check(memcmp(&got[0], &got[1], sizeof got[0]) == 0 && memcmp(&got[0], &got[2], sizeof got[0]) == 0 &&
                  rel < 1e-12,
              "sumsq n=%lld: same bits for 1, 2, 3 threads; %.1e from long double (serial double "
              "loop: %.1e)", (long long)n, rel, rel_serial);
        tz_shard_free(&s);
    }
}

int main(void) {
    memset(&g_world, 0, sizeof g_world);
    g_world.numa_node = -1;
    test_registry();
    test_adamw_reference();
    test_adamw_split();
    test_shard_generic();
    test_checkpoint_types();
    test_sumsq();
    return tz_check_done("optim");
}
