/* Test tool under mpirun (1-4 ranks): world description and every collective against local sums
 * (odd, split, multi-million counts, in place, non-blocking), comm.backend = auto on one rank;
 * --fatal-rank R tests the abort. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/registry.h"
#include "core/backend.h"
#include "core/error.h"
#include "core/dtype.h"
#include "comm/comm.h"
#include "comm/comm_nccl.h"
#include "comm/comm_select.h"
#include "comm/world.h"

static int g_rank, g_size, g_pass, g_fail;

/* Every rank evaluates ok; rank 0 prints one line with the verdict of all ranks. */
static void agree(int ok, const char *fmt, ...) TZ_PRINTF(2, 3);
static void agree(int ok, const char *fmt, ...) {
    int bad = !ok, nbad = 0;
    MPI_Allreduce(&bad, &nbad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (nbad)
        g_fail++;
    else
        g_pass++;
    if (g_rank != 0) return;
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", nbad ? "FAIL" : "ok  ");
    vprintf(fmt, ap);
    if (nbad) printf("  (failed on %d of %d ranks)", nbad, g_size);
    printf("\n");
    fflush(stdout);
    va_end(ap);
}

/* ---- typed buffers through doubles ---- */

static void put(enum tz_dtype dt, void *b, int64_t i, double v) {
    switch (dt) {
    case TZ_DT_F32: ((float *)b)[i] = (float)v; break;
    case TZ_DT_F64: ((double *)b)[i] = v; break;
    case TZ_DT_BF16: ((uint16_t *)b)[i] = tz_f32_to_bf16((float)v); break;
    case TZ_DT_F16: ((uint16_t *)b)[i] = tz_f32_to_f16((float)v); break;
    case TZ_DT_I32: ((int32_t *)b)[i] = (int32_t)v; break;
    case TZ_DT_I64: ((int64_t *)b)[i] = (int64_t)v; break;
    case TZ_DT_U8: ((uint8_t *)b)[i] = (uint8_t)v; break;
    default: TZ_FATAL("dtype %s", tz_dtype_name(dt));
    }
}

static double get(enum tz_dtype dt, const void *b, int64_t i) {
    switch (dt) {
    case TZ_DT_F32: return ((const float *)b)[i];
    case TZ_DT_F64: return ((const double *)b)[i];
    case TZ_DT_BF16: return tz_bf16_to_f32(((const uint16_t *)b)[i]);
    case TZ_DT_F16: return tz_f16_to_f32(((const uint16_t *)b)[i]);
    case TZ_DT_I32: return ((const int32_t *)b)[i];
    case TZ_DT_I64: return (double)((const int64_t *)b)[i];
    case TZ_DT_U8: return ((const uint8_t *)b)[i];
    default: TZ_FATAL("dtype %s", tz_dtype_name(dt));
    }
}

/* Small integers: every partial sum over <= 8 ranks is exact in every dtype, so sums in any
 * order match. U8 stays non-negative. */
static double val(int rank, int64_t j, enum tz_dtype dt) {
    int64_t v = (rank * 7 + j * 3 + j / 5) % 5;
    return dt == TZ_DT_U8 ? (double)v : (double)(v - 2);
}

static void *alloc(int64_t n, enum tz_dtype dt) {
    return tz_xmalloc((size_t)(n > 0 ? n : 1) * tz_comm_dtype_size(dt));
}

/* Count of wrong elements of b[0..n) against want(base + i). */
static int64_t wrong_rs(enum tz_dtype dt, const void *b, int64_t n, int64_t base) {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double s = 0;
        for (int r = 0; r < g_size; r++)
            s += val(r, base + i, dt);
        bad += get(dt, b, i) != s;
    }
    return bad;
}

static void check_reduce_scatter(tz_comm *c, const char *cn, enum tz_dtype dt, int64_t n) {
    const int64_t N = g_size;
    void *send = alloc(N * n, dt), *recv = alloc(n, dt);
    for (int64_t j = 0; j < N * n; j++)
        put(dt, send, j, val(g_rank, j, dt));
    tz_comm_reduce_scatter(c, send, recv, n, dt);
    int64_t bad = wrong_rs(dt, recv, n, g_rank * n);
    /* in place: the result lands in this rank's own block */
    char *own = (char *)send + (size_t)(g_rank * n) * tz_comm_dtype_size(dt);
    tz_comm_reduce_scatter(c, send, own, n, dt);
    int64_t bad_ip = wrong_rs(dt, own, n, g_rank * n);
    agree(bad == 0 && bad_ip == 0, "%s reduce_scatter %s n=%lld (wrong: %lld, in place %lld)", cn,
          tz_dtype_name(dt), (long long)n, (long long)bad, (long long)bad_ip);
    free(send);
    free(recv);
}

static void check_all_gather(tz_comm *c, const char *cn, enum tz_dtype dt, int64_t n) {
    const int64_t N = g_size;
    void *send = alloc(n, dt), *recv = alloc(N * n, dt);
    for (int64_t j = 0; j < n; j++)
        put(dt, send, j, val(g_rank, j, dt));
    int64_t bad = 0, bad_ip = 0;
    tz_comm_all_gather(c, send, recv, n, dt);
    for (int r = 0; r < N; r++)
        for (int64_t j = 0; j < n; j++)
            bad += get(dt, recv, r * n + j) != val(r, j, dt);
    memset(recv, 0, (size_t)(N * n) * tz_comm_dtype_size(dt));
    char *own = (char *)recv + (size_t)(g_rank * n) * tz_comm_dtype_size(dt);
    for (int64_t j = 0; j < n; j++)
        put(dt, own, j, val(g_rank, j, dt));
    tz_comm_all_gather(c, own, recv, n, dt);
    for (int r = 0; r < N; r++)
        for (int64_t j = 0; j < n; j++)
            bad_ip += get(dt, recv, r * n + j) != val(r, j, dt);
    agree(bad == 0 && bad_ip == 0, "%s all_gather %s n=%lld (wrong: %lld, in place %lld)", cn,
          tz_dtype_name(dt), (long long)n, (long long)bad, (long long)bad_ip);
    free(send);
    free(recv);
}

/* Blocks of different lengths: rank r sends n * (r + 1) + r elements, rank 1 none at all;
 * out of place and in place. */
static void check_all_gatherv(tz_comm *c, const char *cn, enum tz_dtype dt, int64_t n) {
    const int N = g_size;
    int64_t *counts = tz_xmalloc((size_t)N * sizeof *counts), total = 0, own = 0;
    for (int r = 0; r < N; r++) {
        counts[r] = r == 1 ? 0 : n * (r + 1) + r;
        if (r == g_rank) own = total;
        total += counts[r];
    }
    const size_t es = tz_comm_dtype_size(dt);
    void *send = alloc(counts[g_rank], dt), *recv = alloc(total, dt);
    for (int64_t j = 0; j < counts[g_rank]; j++) put(dt, send, j, val(g_rank, j, dt));
    int64_t bad = 0, bad_ip = 0;
    tz_comm_all_gatherv(c, send, recv, counts, dt);
    for (int r = 0, d = 0; r < N; d += (int)counts[r], r++)
        for (int64_t j = 0; j < counts[r]; j++) bad += get(dt, recv, d + j) != val(r, j, dt);
    memset(recv, 0, (size_t)(total > 0 ? total : 1) * es);
    char *mine = (char *)recv + (size_t)own * es;
    for (int64_t j = 0; j < counts[g_rank]; j++) put(dt, mine, j, val(g_rank, j, dt));
    tz_comm_all_gatherv(c, mine, recv, counts, dt);
    for (int r = 0, d = 0; r < N; d += (int)counts[r], r++)
        for (int64_t j = 0; j < counts[r]; j++) bad_ip += get(dt, recv, d + j) != val(r, j, dt);
    agree(bad == 0 && bad_ip == 0, "%s all_gatherv %s n=%lld (wrong: %lld, in place %lld)", cn,
          tz_dtype_name(dt), (long long)n, (long long)bad, (long long)bad_ip);
    free(send), free(recv), free(counts);
}

static void check_all_reduce(tz_comm *c, const char *cn, enum tz_dtype dt, int64_t n) {
    void *send = alloc(n, dt), *recv = alloc(n, dt);
    for (int64_t j = 0; j < n; j++)
        put(dt, send, j, val(g_rank, j, dt));
    tz_comm_all_reduce(c, send, recv, n, dt);
    int64_t bad = wrong_rs(dt, recv, n, 0);
    tz_comm_all_reduce(c, send, send, n, dt);
    int64_t bad_ip = wrong_rs(dt, send, n, 0);
    agree(bad == 0 && bad_ip == 0, "%s all_reduce %s n=%lld (wrong: %lld, in place %lld)", cn,
          tz_dtype_name(dt), (long long)n, (long long)bad, (long long)bad_ip);
    free(send);
    free(recv);
}

static void check_bcast(tz_comm *c, const char *cn, enum tz_dtype dt, int64_t n, int root) {
    void *buf = alloc(n, dt);
    for (int64_t j = 0; j < n; j++)
        put(dt, buf, j, val(g_rank, j, dt));
    tz_comm_bcast(c, buf, n, dt, root);
    int64_t bad = 0;
    for (int64_t j = 0; j < n; j++)
        bad += get(dt, buf, j) != val(root, j, dt);
    agree(bad == 0, "%s bcast %s n=%lld root %d (wrong: %lld)", cn, tz_dtype_name(dt), (long long)n,
          root, (long long)bad);
    free(buf);
}

/* Non-integer fp32 sums: equal to the fp64 sum within fp32 rounding of a few additions. */
static void check_float_values(tz_comm *c) {
    const int64_t n = 10007;
    float *send = tz_xmalloc((size_t)(n * g_size) * sizeof *send),
          *recv = tz_xmalloc((size_t)n * sizeof *recv);
    for (int64_t j = 0; j < n * g_size; j++)
        send[j] = (float)sin(0.37 * (double)j + 1.3 * g_rank);
    tz_comm_reduce_scatter(c, send, recv, n, TZ_DT_F32);
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double s = 0;
        for (int r = 0; r < g_size; r++)
            s += (float)sin(0.37 * (double)(g_rank * n + i) + 1.3 * r);
        double e = fabs(recv[i] - s);
        if (e > worst) worst = e;
    }
    agree(worst <= 4e-7 * g_size, "reduce_scatter F32 non-integer values: max error %.2e", worst);
    free(send);
    free(recv);
}

/* Two buckets reduce-scattered in the background while this rank computes; results checked
 * after wait. test() drives MPI progress during the computation. */
static void check_nonblocking(tz_comm *c, const char *cn, int64_t n, enum tz_dtype dt) {
    const int64_t N = g_size;
    void *b1 = alloc(N * n, dt), *b2 = alloc(N * n, dt), *r1 = alloc(n, dt);
    for (int64_t j = 0; j < N * n; j++) {
        put(dt, b1, j, val(g_rank, j, dt));
        put(dt, b2, j, val(g_rank, j, dt));
    }
    char *own2 = (char *)b2 + (size_t)(g_rank * n) * tz_comm_dtype_size(dt);
    tz_comm_req *q1 = tz_comm_ireduce_scatter(c, b1, r1, n, dt);
    tz_comm_req *q2 = tz_comm_ireduce_scatter(c, b2, own2, n, dt); /* in place */
    const int64_t m = 1 << 16;
    double *work = tz_xmalloc((size_t)m * sizeof *work), acc = 0;
    for (int64_t i = 0; i < m; i++)
        work[i] = (double)(i % 13);
    int polls = 0, done_early = 0;
    for (int it = 0; it < 40; it++) { /* "backward" of the next layer */
        for (int64_t i = 0; i < m; i++)
            acc += work[i] * 0.5;
        polls++;
        if (tz_comm_test(q1) && tz_comm_test(q2)) {
            done_early = 1;
            break;
        }
    }
    tz_comm_wait(q2);
    tz_comm_wait(q1);
    int64_t bad = wrong_rs(dt, r1, n, g_rank * n) + wrong_rs(dt, own2, n, g_rank * n);
    agree(bad == 0 && acc > 0,
          "%s ireduce_scatter %s n=%lld x 2 buckets overlapping compute "
          "(wrong %lld; %s after %d polls)",
          cn, tz_dtype_name(dt), (long long)n, (long long)bad,
          done_early ? "completed during compute" : "completed at wait", polls);
    /* non-blocking all-gather of the owned slices back into the buckets */
    void *g = alloc(N * n, dt);
    char *gown = (char *)g + (size_t)(g_rank * n) * tz_comm_dtype_size(dt);
    for (int64_t j = 0; j < n; j++)
        put(dt, gown, j, val(g_rank, j, dt));
    tz_comm_req *q3 = tz_comm_iall_gather(c, gown, g, n, dt);
    while (!tz_comm_test(q3)) {
    }
    tz_comm_wait(q3);
    bad = 0;
    for (int r = 0; r < N; r++)
        for (int64_t j = 0; j < n; j++)
            bad += get(dt, g, r * n + j) != val(r, j, dt);
    agree(bad == 0, "%s iall_gather %s n=%lld in place (wrong %lld)", cn, tz_dtype_name(dt),
          (long long)n, (long long)bad);
    free(work);
    free(b1);
    free(b2);
    free(r1);
    free(g);
}

static void check_world(const tz_world *w) {
    int mr, ms;
    MPI_Comm_rank(MPI_COMM_WORLD, &mr);
    MPI_Comm_size(MPI_COMM_WORLD, &ms);
    agree(w->rank == mr && w->size == ms && tz_log_rank() == mr, "world: rank %d of %d", w->rank,
          w->size);
    char *hosts = tz_xmalloc((size_t)ms * TZ_HOST_MAX);
    int mine[2] = {w->local_rank, w->local_size}, *all = tz_xmalloc((size_t)ms * 2 * sizeof *all);
    MPI_Allgather(w->hostname, TZ_HOST_MAX, MPI_CHAR, hosts, TZ_HOST_MAX, MPI_CHAR, MPI_COMM_WORLD);
    MPI_Allgather(mine, 2, MPI_INT, all, 2, MPI_INT, MPI_COMM_WORLD);
    int ok = 1;
    for (int r = 0; r < ms; r++) { /* on each host: local ranks 0..k-1, each once, size k */
        int same = 0, seen = 0;
        for (int s = 0; s < ms; s++) {
            if (strcmp(hosts + (size_t)r * TZ_HOST_MAX, hosts + (size_t)s * TZ_HOST_MAX)) continue;
            same++;
            seen += all[2 * s] == all[2 * r];
        }
        ok &= seen == 1 && all[2 * r + 1] == same && all[2 * r] >= 0 && all[2 * r] < same;
    }
    agree(ok, "world: local ranks distinct per host, local sizes agree (local rank %d of %d)",
          w->local_rank, w->local_size);
    int numa_ok = w->numa_bound
                      ? (w->numa_node >= 0 && w->numa_node < w->numa_nodes)
                      : (w->numa_reason[0] != 0 && (w->numa_nodes != 1 || w->numa_node == 0));
    agree(numa_ok && w->threads >= 1, "world: NUMA %d of %d nodes (%s), %d threads", w->numa_node,
          w->numa_nodes, w->numa_bound ? "bound" : w->numa_reason, w->threads);
    /* the accelerator hook, on a copy: node 0 exists everywhere; node 1000 nowhere */
    tz_world t = *w;
    t.numa_warned = 1; /* the warning path was taken at init where binding failed */
    int b0 = tz_world_bind_numa(&t, 0);
    agree(t.numa_nodes < 1 ? b0 == 0 && t.numa_node == -1
                           : (b0 == 1 ? t.numa_bound && t.numa_node == 0 : t.numa_reason[0] != 0),
          "world: bind hook to node 0: %s", b0 ? "bound" : t.numa_reason);
    int b1 = tz_world_bind_numa(&t, 1000);
    agree(b1 == 0 && !t.numa_bound && t.numa_node == -1 && t.numa_reason[0],
          "world: bind hook to node 1000 refused: %s", t.numa_reason);
    agree(tz_numa_node_of_pci("0000:ff:1f.7") == -1 && tz_numa_node_of_pci("../x") == -1,
          "world: no sysfs NUMA node for a missing PCI device");
    free(hosts);
    free(all);
}

/* comm.backend = "auto" on one rank: the host comm, decided before anything is asked of a GPU
 * or of NCCL. The backend is a stand-in for a CUDA one (its name, the device flag, and a
 * device_info that counts its calls); the CUDA module is loaded where this build has one, so
 * that NCCL would be found (libnccl.so.2 of the toolkit) if the choice went on to ask. */
static int g_info_calls;
static void fake_device_info(tz_backend *be, tz_device_info *out) {
    (void)be;
    g_info_calls++;
    memset(out, 0, sizeof *out);
    snprintf(out->bus_id, sizeof out->bus_id, "0000:%02x:00.0", g_rank + 1);
}

static void check_select_one_rank(tz_comm *c) {
    if (c->size != 1) return;
    tz_backend fake;
    memset(&fake, 0, sizeof fake);
    fake.name = "cuda";
    fake.device = 1;
    fake.device_info = fake_device_info;
    const char *why = tz_cuda_module_error();
    tz_comm *g = tz_comm_select(TZ_COMM_AUTO, &fake, c);
    agree(g == NULL && g_info_calls == 0,
          "comm.backend = auto on one rank, a GPU backend: the host comm, no GPU or NCCL asked "
          "(CUDA module: %s)", why ? why : "loaded");
    if (g) tz_comm_destroy(g);
}

int main(int argc, char **argv) {
    tz_mpi_singleton_defaults();
    MPI_Init(&argc, &argv);
    int fatal_rank = -1, mpi_error_rank = -1;
    for (int i = 1; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "--fatal-rank")) fatal_rank = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--mpi-error-rank")) mpi_error_rank = atoi(argv[i + 1]);
    }
    tz_world w;
    tz_world_init(&w, -1);
    g_rank = w.rank;
    g_size = w.size;
    tz_world_print(&w);
    tz_comm *c = tz_comm_mpi_create(MPI_COMM_WORLD);

    if (fatal_rank >= 0 || mpi_error_rank >= 0) {
        /* the fatal path: one rank fails (TZ_FATAL, or an MPI error through MPI_CHECK), the
         * others sit in a collective */
        float x[4] = {1, 2, 3, 4}, y[4];
        if (w.rank == fatal_rank)
            TZ_FATAL("deliberate failure on rank %d (test of the fatal path)", fatal_rank);
        if (w.rank == mpi_error_rank) {
            MPI_Comm dup;
            MPI_Comm_dup(MPI_COMM_SELF, &dup);
            MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
            MPI_CHECK(MPI_Bcast(x, -1, MPI_FLOAT, 0, dup)); /* a negative count */
        }
        tz_comm_all_reduce(c, x, y, 4, TZ_DT_F32);
        tz_comm_barrier(c);
        if (w.rank == 0) printf("fatal: the other ranks were not stopped\n");
        MPI_Finalize();
        return 0;
    }

    check_world(&w);
    check_select_one_rank(c);
    tz_comm *small = tz_comm_mpi_create_limited(MPI_COMM_WORLD, 1000);
    tz_comm *comms[2] = {c, small};
    const char *names[2] = {"mpi", "mpi/limit1000"};
    const enum tz_dtype dts[6] = {TZ_DT_F32, TZ_DT_F64, TZ_DT_BF16,
                                  TZ_DT_F16, TZ_DT_I32, TZ_DT_I64};
    const int64_t counts[5] = {0, 1, 7, 1001, 4099};
    for (int k = 0; k < 2; k++) {
        for (int d = 0; d < 6; d++)
            for (int i = 0; i < 5; i++) {
                check_reduce_scatter(comms[k], names[k], dts[d], counts[i]);
                check_all_reduce(comms[k], names[k], dts[d], counts[i]);
            }
        for (int i = 0; i < 5; i++) {
            check_all_gather(comms[k], names[k], TZ_DT_F32, counts[i]);
            check_all_gather(comms[k], names[k], TZ_DT_U8, counts[i]);
            check_all_gather(comms[k], names[k], TZ_DT_BF16, counts[i]);
            check_all_gatherv(comms[k], names[k], TZ_DT_U8, counts[i]);
            check_all_gatherv(comms[k], names[k], TZ_DT_F32, counts[i]);
            check_bcast(comms[k], names[k], TZ_DT_F64, counts[i], g_size - 1);
            check_bcast(comms[k], names[k], TZ_DT_U8, counts[i], 0);
        }
        check_nonblocking(comms[k], names[k], 4099, TZ_DT_F32);
        check_nonblocking(comms[k], names[k], 3001, TZ_DT_BF16);
    }
    check_float_values(c);

    /* multi-million counts, whole and split into calls of 2^18 elements */
    tz_comm *mid = tz_comm_mpi_create_limited(MPI_COMM_WORLD, 1 << 18);
    check_all_reduce(c, "mpi", TZ_DT_F32, 3000001);
    check_all_reduce(mid, "mpi/limit256K", TZ_DT_F32, 3000001);
    check_bcast(mid, "mpi/limit256K", TZ_DT_F32, 3000001, 0);
    check_reduce_scatter(c, "mpi", TZ_DT_F32, 1000003);
    check_reduce_scatter(mid, "mpi/limit256K", TZ_DT_F32, 1000003);
    check_all_gather(mid, "mpi/limit256K", TZ_DT_F32, 1000003);
    check_all_gatherv(mid, "mpi/limit256K", TZ_DT_U8, 300001);
    check_nonblocking(c, "mpi", 1 << 20, TZ_DT_F32);
    check_nonblocking(mid, "mpi/limit256K", 600001, TZ_DT_F32);

    tz_comm_barrier(c);
    agree(1, "barrier");
    tz_comm_destroy(mid);
    tz_comm_destroy(small);
    tz_comm_destroy(c);
    tz_world_free(&w);
    if (g_rank == 0)
        printf("tz_comm_check (%d ranks): %d passed, %d failed\n", g_size, g_pass, g_fail);
    MPI_Finalize();
    return g_fail ? 1 : 0;
}
