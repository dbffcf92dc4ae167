/* Choosing a backend by name (run.device) and the whole-table check: "cpu" and "auto" give a
 * working table, an unknown name and "cuda" where it cannot be made are fatal with a message,
 * a table with a NULL op is refused naming the op. Fatal paths run in a child process. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/backend.h"
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

static void create_named(const void *name) {
    tz_backend *be = tz_backend_create((const char *)name, 0, 1);
    tz_backend_destroy(be);
}

static void check_without_matmul(const void *unused) {
    tz_backend *be = tz_backend_create("cpu", 0, 1);
    be->matmul = NULL;
    tz_backend_check(be);
}

int main(void) {
    tz_backend *be = tz_backend_create("cpu", 0, 1);
    check(be && !strcmp(be->name, "cpu") && be->device == 0, "run.device = cpu gives the CPU table");
    float *x = be->alloc(be, 40);
    be->fill(be, x, 2.0f, 10);
    check(be->sumsq(be, x, 10) == 40.0, "its ops work (fill, sumsq)");
    be->release(be, x);
    tz_backend_destroy(be);
    tz_backend_destroy(NULL);

    int gpus = tz_cuda_device_count();
    be = tz_backend_create("auto", 0, 1);
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
    rc = in_child(create_named, "tpu", err, sizeof err);
    check(rc != 0 && strstr(err, "no backend named \"tpu\""), "an unknown backend is fatal (exit %d)",
          rc);
    if (gpus <= 0) {
        rc = in_child(create_named, "cuda", err, sizeof err);
        const char *why = gpus < 0 ? "this build has no CUDA backend" : "no CUDA device is visible";
        check(rc != 0 && strstr(err, why) && strstr(err, "HINT"),
              "run.device = cuda without %s is fatal with a hint (exit %d)",
              gpus < 0 ? "CUDA" : "a GPU", rc);
    }
    return tz_check_done("test_backend");
}
