/* The CPU kernels (instruction-set builds of the CPU ops): the default is the fastest this CPU
 * runs, TZ_CPU_KERNEL forces one or is refused, and every kernel this CPU runs computes the
 * matmul within the fp32 error bound of an fp64 reference. The other ops run under each kernel
 * in test_ops_grad / test_ops_dit (one ctest per kernel). Results of two kernels may differ in
 * rounding: AVX2 and AVX-512 order the additions of the `omp simd` reductions differently
 * (attention's softmax sums, sumsq), and the portable matmul rounds each product where the
 * others fuse it (FMA). Their matmuls agree bit for bit: same K order, FMA in both. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/registry.h"
#include "tz_optest.h"

/* Preference order of tz_cpu_kernel_name when TZ_CPU_KERNEL is unset. */
static const char *const k_names[] = {"native", "avx512", "avx2", "portable"};
#define NK ((int)(sizeof k_names / sizeof k_names[0]))

static void ref_matmul(double *C, const double *A, const double *B, double *bound, int64_t M,
                       int64_t N, int64_t K, int ta, int tb, double alpha, double beta) {
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0.0, a = 0.0;
            for (int64_t k = 0; k < K; k++) {
                double x = ta ? A[k * M + i] : A[i * K + k], y = tb ? B[j * K + k] : B[k * N + j];
                s += x * y;
                a += fabs(x * y);
            }
            bound[i * N + j] = fabs(alpha) * a + fabs(beta * C[i * N + j]);
            C[i * N + j] = alpha * s + beta * C[i * N + j];
        }
}

typedef struct {
    int64_t M, N, K;
    float alpha, beta;
} mm_case;

/* odd sizes, one element, several K blocks (KC = 256) and tiles, beta 0 and not */
static const mm_case k_cases[] = {
    {1, 1, 1, 1.0f, 0.0f},      {37, 29, 41, 0.7f, 0.3f},   {5, 300, 3, 1.0f, 1.0f},
    {130, 70, 300, 0.7f, 0.0f}, {200, 257, 520, 1.3f, 0.5f}, {64, 96, 48, 1.0f, 0.0f},
};
#define NCASES ((int)(sizeof k_cases / sizeof k_cases[0]))

/* Runs every case and transpose pair on the current backend; writes the results into out
 * (one after another) and checks each element against the fp64 reference:
 * |got - ref| <= (K + 2) * 2^-24 * (|alpha| sum_k |a b| + |beta c|), the worst-case bound of
 * an fp32 dot product of K terms (any order, fused or not), and the scaling. */
static int64_t run_cases(const char *kernel, float *out) {
    int64_t at = 0;
    for (int c = 0; c < NCASES; c++) {
        const mm_case *m = &k_cases[c];
        for (int tr = 0; tr < 4; tr++) {
            int ta = tr >> 1, tb = tr & 1;
            g_rng = tz_rng_make(77, (uint64_t)(c * 4 + tr), TZ_RNG_TEST, 0); /* same inputs */
            float *A = frand(m->M * m->K, 1.0f), *B = frand(m->K * m->N, 1.0f);
            float *C = frand(m->M * m->N, 1.0f);
            double *Ad = todbl(A, m->M * m->K), *Bd = todbl(B, m->K * m->N);
            double *Cd = todbl(C, m->M * m->N), *bound = dbuf(m->M * m->N);
            g_be->matmul(g_be, C, A, B, m->M, m->N, m->K, ta, tb, m->alpha, m->beta);
            ref_matmul(Cd, Ad, Bd, bound, m->M, m->N, m->K, ta, tb, m->alpha, m->beta);
            double worst = 0.0; /* max |got - ref| / bound */
            for (int64_t i = 0; i < m->M * m->N; i++) {
                double r = fabs((double)C[i] - Cd[i]) / (bound[i] > 1e-30 ? bound[i] : 1e-30);
                if (!(r <= worst)) worst = r; /* NaN propagates */
            }
            double tol = (double)(m->K + 2) * 0x1p-24;
            check(worst <= tol, "%-8s matmul %lldx%lldx%lld tA=%d tB=%d: error %.2e of the "
                  "bound scale (tol %.2e)", kernel, (long long)m->M, (long long)m->N,
                  (long long)m->K, ta, tb, worst, tol);
            memcpy(out + at, C, (size_t)(m->M * m->N) * sizeof *C);
            at += m->M * m->N;
            free(A), free(B), free(C), free(Ad), free(Bd), free(Cd), free(bound);
        }
    }
    return at;
}

static int64_t total_outputs(void) {
    int64_t n = 0;
    for (int c = 0; c < NCASES; c++) n += 4 * k_cases[c].M * k_cases[c].N;
    return n;
}

/* Child process: TZ_CPU_KERNEL=name, then tz_cpu_kernel_name(). Returns its exit status and
 * puts its stderr into msg. */
static int refused(const char *name, char *msg, size_t len) {
    int fd[2];
    if (pipe(fd)) return -1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        setenv("TZ_CPU_KERNEL", name, 1);
        printf("%s\n", tz_cpu_kernel_name()); /* fatal: exits 1 */
        _exit(0);
    }
    close(fd[1]);
    size_t got = 0;
    ssize_t r;
    while (got + 1 < len && (r = read(fd[0], msg + got, len - 1 - got)) > 0) got += (size_t)r;
    msg[got] = 0;
    close(fd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int main(void) {
    unsetenv("TZ_CPU_KERNEL");
    const char *best = NULL;
    for (int i = 0; i < NK && !best; i++)
        if (tz_cpu_kernel_usable(k_names[i])) best = k_names[i];
    check(best && !strcmp(tz_cpu_kernel_name(), best),
          "default kernel %s is the fastest this CPU runs (%s)", tz_cpu_kernel_name(),
          best ? best : "none");
    check(tz_cpu_kernel_usable("portable") || tz_cpu_kernel_usable("native"),
          "a portable or native kernel is built and runs");
    check(!tz_cpu_kernel_usable("sse9"), "an unknown kernel is not usable");

    char msg[1024];
    int rc = refused("sse9", msg, sizeof msg);
    check(rc == 1 && strstr(msg, "TZ_CPU_KERNEL=sse9: no such CPU kernel") &&
              strstr(msg, "HINT"),
          "TZ_CPU_KERNEL=sse9 is refused with a hint (exit %d)", rc);
    for (int i = 0; i < NK; i++) {
        if (tz_cpu_kernel_usable(k_names[i])) continue;
        rc = refused(k_names[i], msg, sizeof msg);
        check(rc == 1 && (strstr(msg, "this CPU cannot run it") ||
                          strstr(msg, "no such CPU kernel")),
              "TZ_CPU_KERNEL=%s (not here) is refused (exit %d)", k_names[i], rc);
    }

    int64_t n = total_outputs();
    float *res[NK] = {NULL};
    for (int i = 0; i < NK; i++) {
        if (!tz_cpu_kernel_usable(k_names[i])) continue;
        setenv("TZ_CPU_KERNEL", k_names[i], 1);
        g_be = tz_cpu_backend_create(2);
        check(!strcmp(tz_cpu_kernel_name(), k_names[i]), "TZ_CPU_KERNEL=%s selects it",
              k_names[i]);
        res[i] = fbuf(n);
        run_cases(k_names[i], res[i]);
        tz_cpu_backend_destroy(g_be);
    }
    unsetenv("TZ_CPU_KERNEL");
    /* the same products on every kernel: report how far apart they are (rounding only, the
     * bound above holds for each); AVX2 and AVX-512 agree bit for bit (see the top) */
    for (int i = 0; i < NK; i++)
        for (int j = i + 1; j < NK; j++) {
            if (!res[i] || !res[j]) continue;
            int64_t ndiff = 0;
            for (int64_t e = 0; e < n; e++) ndiff += memcmp(&res[i][e], &res[j][e], 4) != 0;
            int same_bits = !strcmp(k_names[i], "avx512") && !strcmp(k_names[j], "avx2");
            check(!same_bits || ndiff == 0, "matmul %s vs %s: %lld of %lld values differ%s",
                  k_names[i], k_names[j], (long long)ndiff, (long long)n,
                  same_bits ? " (expected: none)" : " (rounding, within the bound)");
        }
    for (int i = 0; i < NK; i++) free(res[i]);
    return tz_check_done("cpu_kernels");
}
