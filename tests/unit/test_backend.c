/* Choosing a backend by name (run.device) and the whole-table check: "cpu" and "auto" give a
 * working table, an unknown name and "cuda" where it cannot be made are fatal with a message,
 * a table with a NULL op is refused naming the op. Fatal paths run in a child process. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/registry.h"
#include "core/backend.h"
#include "core/dtype.h"
#include "tz_check.h"

/* Runs fn(arg) in a child with stderr captured; returns the child's exit status (-1 if it did
 * not exit) and the first bytes of its stderr in err. */
static int in_child(void (*fn)(const void *), const void *arg, char *err, size_t n) {
    int fd[2];
    if (pipe(fd)) return -1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        fn(arg);
        exit(0);
    }
    close(fd[1]);
    size_t got = 0;
    ssize_t r;
    while (got + 1 < n && (r = read(fd[0], err + got, n - 1 - got)) > 0) got += (size_t)r;
    err[got] = '\0';
    char sink[256];
    while (read(fd[0], sink, sizeof sink) > 0) {
    }
    close(fd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void create_kind(const void *kind) {
    tz_backend *be = tz_backend_create((enum tz_device_kind)*(const int *)kind, 0, 1);
    tz_backend_destroy(be);
}

static void check_without_matmul(const void *unused) {
    tz_backend *be = tz_backend_create(TZ_DEVICE_CPU, 0, 1);
    be->matmul = NULL;
    tz_backend_check(be);
}

int main(void) {
    tz_backend *be = tz_backend_create(TZ_DEVICE_CPU, 0, 1);
    check(be && !strcmp(be->name, "cpu") && be->device == 0, "run.device = cpu gives the CPU table");
    float *x = be->alloc(be, 40);
    be->fill(be, x, 2.0f, 10);
    check(be->sumsq(be, x, 10) == 40.0, "its ops work (fill, sumsq)");
    be->release(be, x);

    /* weights stored in bf16: the ops read them as the same values widened to fp32 */
    {
        enum { M = 5, N = 7, K = 9, V = 6 };
        float a[M * K], bw[K * N], c1[M * N], c2[M * N], e1[4 * N], e2[4 * N];
        uint16_t b16[K * N];
        for (int i = 0; i < M * K; i++) a[i] = 0.37f * (float)((i * 7) % 11) - 1.3f;
        for (int i = 0; i < K * N; i++) {
            b16[i] = tz_f32_to_bf16(0.113f * (float)((i * 5) % 13) - 0.71f);
            bw[i] = tz_bf16_to_f32(b16[i]);
        }
        for (int tb = 0; tb < 2; tb++) {
            for (int i = 0; i < M * N; i++) c1[i] = c2[i] = 0.5f * (float)i;
            be->matmul(be, c1, a, bw, M, N, K, 0, tb, 0.8f, 0.25f);
            be->matmul_bw16(be, c2, a, b16, M, N, K, 0, tb, 0.8f, 0.25f);
            check(!memcmp(c1, c2, sizeof c1), "matmul_bw16 (transB %d) = matmul of the widened B",
                  tb);
        }
        const int32_t tok[4] = {3, 0, 5, 3};
        uint16_t t16[V * N];
        float tw[V * N];
        for (int i = 0; i < V * N; i++) t16[i] = (uint16_t)(0x3f00u + (unsigned)i * 37u), tw[i] = tz_bf16_to_f32(t16[i]);
        be->embedding_fwd(be, e1, tok, tw, 4, N);
        be->embedding_fwd_w16(be, e2, tok, t16, 4, N);
        check(!memcmp(e1, e2, sizeof e1), "embedding_fwd_w16 = embedding_fwd of the widened table");
        check(be->matmul_dtypes == 1u << TZ_DT_F32 && be->matmul_dtype == TZ_DT_F32,
              "the CPU's GEMM operands: fp32 only");
    }
    tz_backend_destroy(be);
    tz_backend_destroy(NULL);

    int gpus = tz_cuda_device_count();
    be = tz_backend_create(TZ_DEVICE_AUTO, 0, 1);
    check(!strcmp(be->name, gpus > 0 ? "cuda" : "cpu"), "run.device = auto gives %s (%d GPUs, %s)",
          be->name, gpus, gpus < 0 ? "no CUDA in this build" : "CUDA built in");
    tz_backend_destroy(be);
    check(!strcmp(tz_backend_names(), gpus < 0 ? "cpu" : "cpu, cuda"), "backends built in: %s",
          tz_backend_names());

    /* a CUDA build: its module (libtzcuda.so) loads into this program, every symbol it
     * calls back resolved, whether or not a GPU is there */
    const char *why_not = tz_cuda_module_error();
    if (gpus >= 0) check(why_not == NULL, "the CUDA module loads (%s)", why_not ? why_not : "ok");
    else check(why_not && strstr(why_not, "no CUDA backend"), "no CUDA module in this build");

    char err[1024];
    int rc = in_child(check_without_matmul, NULL, err, sizeof err);
    check(rc != 0 && strstr(err, "op matmul is missing"), "a NULL op is fatal, naming it (exit %d)",
          rc);
    static const int bogus = 7, cuda = TZ_DEVICE_CUDA;
    rc = in_child(create_kind, &bogus, err, sizeof err);
    check(rc != 0 && strstr(err, "no backend of kind 7"), "an unknown backend kind is fatal (exit %d)",
          rc);
    if (gpus <= 0) {
        rc = in_child(create_kind, &cuda, err, sizeof err);
        const char *why = gpus < 0 ? "this build has no CUDA backend" : "no CUDA device is visible";
        check(rc != 0 && strstr(err, why) && strstr(err, "HINT"),
              "run.device = cuda without %s is fatal with a hint (exit %d)",
              gpus < 0 ? "CUDA" : "a GPU", rc);
    }
    return tz_check_done("test_backend");
}
