/* The host side of the ZeRO step on one rank: gradients into the shard, norm, clip, AdamW,
 * weights back. Stages 0, 1, 2, one or three micro-batches, 1-3 threads, a host-addressable
 * and a device-like backend all give the same bits, and agree with a plain reference. */
#include <math.h>
#include <mpi.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/registry.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/params.h"
#include "comm/comm.h"
#include "comm/world.h"
#include "optim/adamw.h"
#include "optim/zero.h"
#include "tz_check.h"

/* odd sizes: tensors not multiples of the alignment, one larger than a bucket and than
 * the sizes below which loops stay on one thread */
static const int64_t shapes[][2] = {{37, 29}, {1, 301}, {300, 400}, {1, 64}, {3, 1000}};
#define NT (int)(sizeof shapes / sizeof shapes[0])
#define STEPS 3
#define MAX_ACCUM 3

static void build(tz_params *ps, tz_backend *be) {
    tz_params_init(ps);
    tz_rng r = tz_rng_make(9, 0, 1, 0);
    char name[32];
    for (int i = 0; i < NT; i++) {
        snprintf(name, sizeof name, "t%d", i);
        tz_param *p = tz_params_add(ps, be, name, shapes[i][0] > 1 ? 2 : 1, shapes[i][0],
                                    shapes[i][1], 1, shapes[i][0] > 1, 0);
        for (int64_t j = 0; j < p->numel; j++) p->w[j] = tz_rng_uniform(&r) - 0.5f;
    }
    tz_params_layout(ps);
}

/* The gradient micro-batch k of step s writes for tensor element j (in the tensor's order). */
static float grad_value(int s, int k, int t, int64_t j) {
    tz_rng r = tz_rng_make(77, (uint64_t)s, (uint64_t)(k * 16 + t), (uint64_t)j);
    return 0.4f * (tz_rng_uniform(&r) - 0.5f);
}

/* Runs STEPS steps; out gets every tensor's weights in order, norms[s] the step norms. */
static void run(tz_backend *be, tz_comm *comm, tz_world *w, int stage, int accum, double bucket_mb,
                double clip, float *out, double *norms) {
    tz_params ps;
    build(&ps, be);
    tz_zero z;
    tz_zero_init(&z, stage, bucket_mb, tz_optim_find("adamw"), &ps, be, comm, w);
    const tz_optim_hparams h = {2e-2, 0.9, 0.99, 1e-8, 0.1};
    for (int s = 0; s < STEPS; s++) {
        tz_zero_begin_step(&z);
        for (int k = 0; k < accum; k++) {
            tz_zero_begin_micro(&z, k == accum - 1);
            /* backward, last tensor first, adding into the gradients and reporting readiness */
            for (int t = NT - 1; t >= 0; t--) {
                tz_param *p = ps.p[t];
                for (int64_t j = 0; j < p->numel; j++) p->g[j] += grad_value(s, k, t, j);
                tz_zero_grads_ready(&z, p->flat_off + p->numel);
            }
            tz_zero_end_micro(&z);
        }
        norms[s] = tz_zero_step(&z, &h, s + 1, clip);
    }
    int64_t at = 0;
    for (int t = 0; t < NT; t++) {
        memcpy(out + at, ps.p[t]->w, (size_t)ps.p[t]->numel * sizeof(float));
        at += ps.p[t]->numel;
    }
    tz_zero_free(&z);
    tz_params_free(&ps, be);
}

/* The same steps written plainly: the summed gradient, a long double norm, AdamW on it. */
static void reference(tz_backend *be, int accum, double clip, float *out, double *norms) {
    tz_params ps;
    build(&ps, be);
    int64_t n = 0;
    for (int t = 0; t < NT; t++) n += ps.p[t]->numel;
    float *w = malloc(n * sizeof *w), *g = malloc(n * sizeof *g), *m = calloc(n, sizeof *m);
    float *v = calloc(n, sizeof *v);
    uint8_t *decay = malloc(n);
    int64_t at = 0;
    for (int t = 0; t < NT; t++)
        for (int64_t j = 0; j < ps.p[t]->numel; j++, at++)
            w[at] = ps.p[t]->w[j], decay[at] = (uint8_t)ps.p[t]->decay;
    const tz_optim_hparams h = {2e-2, 0.9, 0.99, 1e-8, 0.1};
    for (int s = 0; s < STEPS; s++) {
        long double ss = 0;
        at = 0;
        for (int t = 0; t < NT; t++)
            for (int64_t j = 0; j < ps.p[t]->numel; j++, at++) {
                float x = 0.0f;
                for (int k = 0; k < accum; k++) x += grad_value(s, k, t, j);
                g[at] = x;
                ss += (long double)x * x;
            }
        norms[s] = (double)sqrtl(ss);
        float scale = clip > 0 && norms[s] > clip ? (float)(clip / norms[s]) : 1.0f;
        tz_optim_arrays a = {.w = w, .g = g, .decay = decay, .state = {m, v}};
        tz_adamw_step(&a, 0, n, s + 1, &h, scale);
    }
    memcpy(out, w, n * sizeof *w);
    free(w), free(g), free(m), free(v), free(decay);
    tz_params_free(&ps, be);
}

int main(int argc, char **argv) {
    tz_mpi_singleton_defaults();
    MPI_Init(&argc, &argv);
    tz_world w;
    tz_world_init(&w, -1);
    tz_comm *comm = tz_comm_mpi_create(MPI_COMM_WORLD);
    tz_backend *cpu = tz_cpu_backend_create(0);
    tz_backend dev = *cpu; /* the same memory, copied only through the table: a device's path */
    dev.device = 1;
    int64_t n = 0;
    for (int t = 0; t < NT; t++) n += shapes[t][0] * shapes[t][1];
    float *ref = malloc(n * sizeof *ref), *first = malloc(n * sizeof *first), *got = malloc(n * sizeof *got);
    double rnorm[STEPS], fnorm[STEPS], norm[STEPS];

    for (int ci = 0; ci < 2; ci++) {
        const double clip = ci ? 1.0 : 0.0; /* clip 1: the norms (40-80) clip every step */
        for (int accum = 1; accum <= MAX_ACCUM; accum += 2) {
            reference(cpu, accum, clip, ref, rnorm);
            int have = 0, same = 1, n_runs = 0;
            for (int stage = 0; stage <= 2; stage++)
                for (int nt = 1; nt <= 3; nt++)
                    for (int d = 0; d < 2; d++)
                        for (int bi = 0; bi < 2; bi++) {
                            omp_set_num_threads(nt);
                            run(d ? &dev : cpu, comm, &w, stage, accum, bi ? 0.05 : 16.0, clip, got, norm);
                            n_runs++;
                            if (!have) {
                                memcpy(first, got, n * sizeof *got);
                                memcpy(fnorm, norm, sizeof norm);
                                have = 1;
                            } else {
                                same &= memcmp(first, got, n * sizeof *got) == 0 &&
                                        memcmp(fnorm, norm, sizeof norm) == 0;
                            }
                        }
            omp_set_num_threads(omp_get_num_procs());
            check(same, "clip %g, %d micro-batch(es): %d runs (stages 0-2, 1-3 threads, host or "
                  "device-like backend, 1 or several buckets) give the same weights and norms, bit "
                  "for bit", clip, accum, n_runs);
            double wn = 0, nn = 0;
            for (int64_t i = 0; i < n; i++) {
                double e = fabs((double)first[i] - ref[i]) / (fabs(ref[i]) + 1e-2);
                if (e > wn) wn = e;
            }
            for (int s = 0; s < STEPS; s++) {
                double e = fabs(fnorm[s] - rnorm[s]) / rnorm[s];
                if (e > nn) nn = e;
            }
            /* norms: blocked sums in double against one long double sum; weights: gradients
             * summed in the same order, so at most the clip factor's last bit can differ */
            check(nn < 1e-12 && wn < 1e-6, "clip %g, %d micro-batch(es): norms within %.1e, weights "
                  "within %.1e of the plain reference", clip, accum, nn, wn);
        }
    }
    free(ref), free(first), free(got);
    tz_cpu_backend_destroy(cpu);
    tz_comm_destroy(comm);
    tz_world_free(&w);
    int rc = tz_check_done("zero_host");
    MPI_Finalize();
    return rc;
}
