/* Errors and logging: the one fatal path (TZ_FATAL -> MPI_Abort), the typed checks that funnel
 * into it, error messages for callers, rank-tagged logs. No assert on input, no MPI headers. */
#ifndef TZ_ERROR_H
#define TZ_ERROR_H
#include <stdarg.h>
#include <stdio.h>

#if defined(__GNUC__)
#define TZ_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define TZ_NORETURN __attribute__((noreturn))
#else
#define TZ_PRINTF(a, b)
#define TZ_NORETURN
#endif

/* Prints "[rank r] message" ("[rank r] file:line func: message" when the environment has
 * TZ_DEBUG set and not 0), flushes, and aborts every rank (MPI_Abort when MPI is up, exit(1)
 * otherwise). */
TZ_NORETURN void tz_fatal_at(const char *file, int line, const char *func, const char *fmt, ...)
    TZ_PRINTF(4, 5);
/* Same, with a HINT line telling the user the likely fix. */
TZ_NORETURN void tz_fatal_hint_at(const char *file, int line, const char *func, const char *hint,
                                  const char *fmt, ...) TZ_PRINTF(5, 6);

#define TZ_FATAL(...) tz_fatal_at(__FILE__, __LINE__, __func__, __VA_ARGS__)
#define TZ_FATAL_HINT(hint, ...) tz_fatal_hint_at(__FILE__, __LINE__, __func__, hint, __VA_ARGS__)
#define TZ_CHECK(cond, ...)                   \
    do {                                      \
        if (!(cond)) TZ_FATAL(__VA_ARGS__);   \
    } while (0)

/* For fuzz harnesses, so that an input a parser rejects through TZ_FATAL is not a crash: while
 * a hook is set, a fatal error formats its message and calls hook(message) instead of printing
 * it and stopping the process. The hook must not return (it longjmps back into the harness);
 * if it does, the process stops as usual. NULL removes it. */
typedef void (*tz_fatal_hook_fn)(const char *message);
void tz_fatal_set_hook(tz_fatal_hook_fn hook);

/* MPI_CHECK(call): an MPI error code into TZ_FATAL with MPI's own message, "call failed:
 * message (MPI error rc)". Only meaningful on a communicator whose error handler returns (the
 * default, MPI_ERRORS_ARE_FATAL, never returns): tz_world_init and tz_comm_mpi_create set
 * MPI_ERRORS_RETURN on what they own. The macro names MPI_SUCCESS only where it is expanded,
 * in files that call MPI and so include <mpi.h>; this header stays free of MPI (and CUDA)
 * headers, and error.c, which links MPI for MPI_Abort anyway, turns the code into text. */
#define MPI_CHECK(call)                                                          \
    do {                                                                         \
        int tz_mpi_rc_ = (call);                                                 \
        if (tz_mpi_rc_ != MPI_SUCCESS)                                           \
            tz_fatal_mpi_at(__FILE__, __LINE__, __func__, #call, tz_mpi_rc_);    \
    } while (0)
TZ_NORETURN void tz_fatal_mpi_at(const char *file, int line, const char *func, const char *call,
                                 int rc);

/* The error message of a function that reports failure to its caller (the io/ readers and
 * writers, the ZeRO plan: "0, or non-zero with a message in err"): formats into err when err
 * is not NULL and n > 0 (truncating to n - 1 characters) and returns -1, so that
 * `return tz_errf(err, n, "%s: ...", path, ...);` both explains and fails. */
int tz_errf(char *err, size_t n, const char *fmt, ...) TZ_PRINTF(3, 4);

/* Rank used in message prefixes; set once by the world set-up (defaults to 0). */
void tz_log_set_rank(int rank, int world);
int tz_log_rank(void);

/* info: rank 0 only, to stdout. warn: any rank, to stderr, tagged. */
void tz_info(const char *fmt, ...) TZ_PRINTF(1, 2);
void tz_warn(const char *fmt, ...) TZ_PRINTF(1, 2);
/* Every rank prints (stdout), tagged with the rank; for per-rank start-up lines. */
void tz_info_all(const char *fmt, ...) TZ_PRINTF(1, 2);
/* tz_info and tz_info_all to stderr from now on: for a command whose standard output is its
 * result alone (generate's text). */
void tz_info_to_stderr(void);

/* Allocation that never returns NULL (fatal with the size on failure). */
void *tz_xmalloc(size_t bytes);
void *tz_xcalloc(size_t n, size_t size);
void *tz_xrealloc(void *p, size_t bytes);
char *tz_xstrdup(const char *s);

#endif
