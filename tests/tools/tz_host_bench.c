/* Benchmark tool: the host side of the ZeRO step (gradients into the shard, norm, optimizer,
 * weight copies) on a synthetic model of P parameters, beside a STREAM-like triad. Not a test. */
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
#include "optim/zero.h"

static const char *arg(int argc, char **argv, const char *name, const char *def) {
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], name)) return argv[i + 1];
    return def;
}

/* a[i] = b[i] + s * c[i] over doubles, as STREAM's triad (24 bytes per element counted);
 * best of reps, in GB/s. Pages first touched by the threads that use them. */
static double triad_gbs(int64_t n, int reps) {
    double *a = tz_xmalloc((size_t)n * sizeof *a), *b = tz_xmalloc((size_t)n * sizeof *b);
    double *c = tz_xmalloc((size_t)n * sizeof *c);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) a[i] = 0.0, b[i] = 1.0, c[i] = 2.0;
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        const double s = 0.5 + r, t0 = omp_get_wtime();
#pragma omp parallel for simd schedule(static)
        for (int64_t i = 0; i < n; i++) a[i] = b[i] + s * c[i];
        const double dt = omp_get_wtime() - t0;
        if (dt < best) best = dt;
    }
    volatile double sink = a[n / 2];
    (void)sink;
    free(a), free(b), free(c);
    return 24.0 * (double)n / best * 1e-9;
}

int main(int argc, char **argv) {
    tz_mpi_singleton_defaults();
    MPI_Init(&argc, &argv);
    const int64_t P = (int64_t)atof(arg(argc, argv, "--params", "9e7"));
    const int steps = atoi(arg(argc, argv, "--steps", "6")), accum = atoi(arg(argc, argv, "--accum", "1"));
    const int stage = atoi(arg(argc, argv, "--stage", "2"));
    const double bucket_mb = atof(arg(argc, argv, "--bucket-mb", "16"));
    const double triad_mb = atof(arg(argc, argv, "--triad-mb", "512"));
    if (P < 1 || steps < 2 || accum < 1 || stage < 0 || stage > 2 || bucket_mb <= 0)
        TZ_FATAL("usage: tz_host_bench [--params P] [--steps S >= 2] [--accum A] [--stage 0|1|2] "
                 "[--bucket-mb MB] [--triad-mb MB per array, 0: no triad]");
    tz_world w;
    tz_world_init(&w, -1);
    tz_comm *comm = tz_comm_mpi_create(MPI_COMM_WORLD);
    tz_backend *be = tz_cpu_backend_create(0);

    /* matrices of 1024 x up to 4096 (with weight decay) and a 1024-element norm after each */
    tz_params ps;
    tz_params_init(&ps);
    char name[64];
    for (int64_t left = P, k = 0; left > 0; k++) {
        int64_t cols = left / 1024 > 4096 ? 4096 : left / 1024;
        if (cols > 0) {
            snprintf(name, sizeof name, "layer.%lld.weight", (long long)k);
            tz_params_add(&ps, be, name, 2, 1024, cols, 1, 1, 0);
            left -= 1024 * cols;
        }
        int64_t nn = left < 1024 ? left : 1024;
        if (nn > 0) {
            snprintf(name, sizeof name, "layer.%lld.norm", (long long)k);
            tz_params_add(&ps, be, name, 1, nn, 1, 1, 0, 0);
            left -= nn;
        }
    }
    tz_params_layout(&ps);
    tz_rng r = tz_rng_make(1, 0, 0, (uint64_t)comm->rank);
    for (int i = 0; i < ps.n; i++)
        for (int64_t j = 0; j < ps.p[i]->numel; j++) ps.p[i]->w[j] = 0.02f * (tz_rng_uniform(&r) - 0.5f);
    tz_zero z;
    tz_zero_init(&z, stage, bucket_mb, tz_optim_find("adamw"), &ps, be, comm, &w);
    const int64_t F = ps.flat_numel;
    float *gsrc = tz_xmalloc((size_t)F * sizeof *gsrc);
    for (int64_t i = 0; i < F; i++) gsrc[i] = 1e-4f * (tz_rng_uniform(&r) - 0.5f);

    const tz_optim_hparams h = {1e-4, 0.9, 0.999, 1e-8, 0.01};
    double norm = 0.0, outer[2] = {0, 0}; /* timed from here: gradients in, the step */
    for (int s = 0; s < steps; s++) {
        if (s == 1) { /* the first step touches the buffers first */
            tz_zero_clock_reset(&z);
            outer[0] = outer[1] = 0.0;
        }
        double t0 = omp_get_wtime();
        tz_zero_begin_step(&z);
        for (int k = 0; k < accum; k++) {
            tz_zero_begin_micro(&z, k == accum - 1);
            outer[0] += omp_get_wtime() - t0;
            memcpy(z.grad, gsrc, (size_t)F * sizeof(float)); /* stands in for backward */
            t0 = omp_get_wtime();
            tz_zero_grads_ready(&z, F);
            tz_zero_end_micro(&z);
        }
        outer[0] += omp_get_wtime() - t0;
        t0 = omp_get_wtime();
        norm = tz_zero_step(&z, &h, s + 1, 1.0);
        outer[1] += omp_get_wtime() - t0;
    }
    const double ns = (double)(steps - 1);
    if (comm->rank == 0) {
        printf("host step: %lld parameters (%lld elements in this rank's shard), %d rank(s) x %d "
               "thread(s), zero stage %d, %d bucket(s), %d micro-batch(es), last norm %.6g\n",
               (long long)ps.n_trainable, (long long)z.sh.n, comm->size, omp_get_max_threads(),
               stage, z.plan.n_buckets, accum, norm);
        printf("%-12s %10s %12s %8s\n", "phase", "ms/step", "bytes/elem", "GB/s");
        double ts = 0.0, tb = 0.0;
        for (int p = 0; p < TZ_ZERO_PHASES; p++) {
            const tz_zero_clock *c = &z.clock[p];
            const double ms = 1e3 * c->seconds / (double)z.steps;
            const double per = c->bytes / (double)z.steps / (double)z.sh.n;
            ts += c->seconds;
            if (p != TZ_ZERO_GATHER) tb += c->bytes;
            if (c->bytes > 0)
                printf("%-12s %10.2f %12.1f %8.1f\n", tz_zero_phase_names[p], ms, per, 1e-9 * c->bytes / c->seconds);
            else
                printf("%-12s %10.2f %12s %8s\n", tz_zero_phase_names[p], ms, "-", "-");
        }
        printf("%-12s %10.2f %12.1f %8.1f  (all-gather time included, its bytes not)\n", "host step",
               1e3 * ts / (double)z.steps, tb / (double)z.steps / (double)z.sh.n, 1e-9 * tb / ts);
        printf("outside: gradients (begin_step, hook, end_micro) %.2f ms, tz_zero_step %.2f ms, "
               "together %.2f ms per step\n", 1e3 * outer[0] / ns, 1e3 * outer[1] / ns,
               1e3 * (outer[0] + outer[1]) / ns);
        printf("update: %.2f Gparam/s (%s, %zu bytes per element)\n",
               1e-9 * (double)z.sh.n * (double)z.steps / z.clock[TZ_ZERO_UPDATE].seconds,
               z.sh.opt->name, tz_shard_step_bytes(&z.sh));
    }
    tz_zero_free(&z);
    free(gsrc);
    tz_params_free(&ps, be);
    if (triad_mb > 0 && comm->rank == 0) {
        const int64_t n = (int64_t)(triad_mb * 1048576.0 / 8.0);
        const double gbs = triad_gbs(n, 10);
        printf("triad: %.1f GB/s (a = b + s*c, 3 x %.0f MiB of doubles, best of 10, %d thread(s)); "
               "%.1f GB/s counting the read of a's lines before they are written\n", gbs,
               triad_mb, omp_get_max_threads(), gbs * 32.0 / 24.0);
    }
    tz_cpu_backend_destroy(be);
    tz_comm_destroy(comm);
    tz_world_free(&w);
    MPI_Finalize();
    return 0;
}
