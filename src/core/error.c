/* The fatal path and logging. MPI_Abort is called when MPI is initialised, so one failing
 * rank stops the whole job instead of leaving the others waiting in a collective. */
#include "core/error.h"

#include <mpi.h>
#include <stdlib.h>
#include <string.h>

static int g_rank = 0; /* written once at start-up by tz_log_set_rank; read-only after */
static int g_world = 1;
static tz_fatal_hook_fn g_fatal_hook; /* set only by fuzz harnesses */

void tz_fatal_set_hook(tz_fatal_hook_fn hook) { g_fatal_hook = hook; }

void tz_log_set_rank(int rank, int world) {
    g_rank = rank;
    g_world = world;
}

int tz_log_rank(void) { return g_rank; }

TZ_NORETURN static void tz_abort(void) {
    int up = 0, down = 0;
    MPI_Initialized(&up);
    MPI_Finalized(&down);
    fflush(stdout);
    fflush(stderr);
    if (up && !down && g_world > 1) MPI_Abort(MPI_COMM_WORLD, 1);
    if (up && !down) MPI_Finalize();
    exit(1);
}

/* The whole message is formatted first (into buf, 4096 bytes) and written with one call, so
 * lines from other ranks (forwarded by mpirun or srun) cannot land in the middle of it. */
static void tz_vfatal(char *buf, const char *file, int line, const char *func, const char *hint,
                      const char *fmt, va_list ap) {
    const size_t cap = 4096;
    const char *dbg = getenv("TZ_DEBUG"); /* the source location, for developers */
    int n = dbg && *dbg && strcmp(dbg, "0")
                ? snprintf(buf, cap, "[rank %d] %s:%d %s: ", g_rank, file, line, func)
                : snprintf(buf, cap, "[rank %d] ", g_rank);
    if (n < 0 || n >= (int)cap) n = 0;
    int m = vsnprintf(buf + n, cap - (size_t)n, fmt, ap);
    n = m < 0 ? n : n + m < (int)cap ? n + m : (int)cap - 1;
    if (hint) {
        m = snprintf(buf + n, cap - (size_t)n, "\n[rank %d] HINT: %s", g_rank, hint);
        n = m < 0 ? n : n + m < (int)cap ? n + m : (int)cap - 1;
    }
}

TZ_NORETURN static void tz_die(const char *buf) {
    if (g_fatal_hook) g_fatal_hook(buf);
    fflush(stdout);
    fprintf(stderr, "%s\n", buf);
    fflush(stderr);
    tz_abort();
}

void tz_fatal_at(const char *file, int line, const char *func, const char *fmt, ...) {
    char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    tz_vfatal(buf, file, line, func, NULL, fmt, ap);
    va_end(ap);
    tz_die(buf);
}

void tz_fatal_hint_at(const char *file, int line, const char *func, const char *hint,
                      const char *fmt, ...) {
    char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    tz_vfatal(buf, file, line, func, hint, fmt, ap);
    va_end(ap);
    tz_die(buf);
}

void tz_fatal_mpi_at(const char *file, int line, const char *func, const char *call, int rc) {
    char msg[MPI_MAX_ERROR_STRING + 1];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) len = 0;
    msg[len] = 0;
    tz_fatal_at(file, line, func, "%s failed: %s (MPI error %d)", call, msg, rc);
}

int tz_errf(char *err, size_t n, const char *fmt, ...) {
    if (err && n) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, n, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static int g_info_stderr; /* tz_info_to_stderr */

void tz_info_to_stderr(void) { g_info_stderr = 1; }

void tz_info(const char *fmt, ...) {
    if (g_rank != 0) return;
    FILE *to = g_info_stderr ? stderr : stdout;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(to, fmt, ap);
    va_end(ap);
    fputc('\n', to);
    fflush(to);
}

/* One rank-tagged line "[rank r] <tag><message>", the message cut to cap - 1 characters and
 * formatted before the one write (see tz_vfatal). */
static void tz_vsay(FILE *to, size_t cap, const char *tag, const char *fmt, va_list ap) {
    char buf[2048];
    vsnprintf(buf, cap < sizeof buf ? cap : sizeof buf, fmt, ap);
    fprintf(to, "[rank %d] %s%s\n", g_rank, tag, buf);
    fflush(to);
}

void tz_info_all(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tz_vsay(g_info_stderr ? stderr : stdout, 1024, "", fmt, ap);
    va_end(ap);
}

void tz_warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tz_vsay(stderr, 2048, "warning: ", fmt, ap);
    va_end(ap);
}

void *tz_xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) TZ_FATAL("out of memory allocating %zu bytes", bytes);
    return p;
}

void *tz_xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) TZ_FATAL("out of memory allocating %zu x %zu bytes", n, size);
    return p;
}

void *tz_xrealloc(void *p, size_t bytes) {
    void *q = realloc(p, bytes ? bytes : 1);
    if (!q) TZ_FATAL("out of memory reallocating %zu bytes", bytes);
    return q;
}

char *tz_xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = tz_xmalloc(n);
    memcpy(p, s, n);
    return p;
}
