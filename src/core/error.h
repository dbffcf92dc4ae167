/* Errors and logging: the one fatal path (TZ_FATAL -> MPI_Abort) and rank-tagged messages.
 * No assert on input anywhere: bad input goes through TZ_FATAL with the place and a hint. */
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

/* Prints "[rank r] file:line func: message", flushes, and aborts every rank (MPI_Abort
 * when MPI is up, exit(1) otherwise). */
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

/* Rank used in message prefixes; set once by the world set-up (defaults to 0). */
void tz_log_set_rank(int rank, int world);
int tz_log_rank(void);

/* info: rank 0 only, to stdout. warn: any rank, to stderr, tagged. */
void tz_info(const char *fmt, ...) TZ_PRINTF(1, 2);
void tz_warn(const char *fmt, ...) TZ_PRINTF(1, 2);
/* Every rank prints (stdout), tagged with the rank; for per-rank start-up lines. */
void tz_info_all(const char *fmt, ...) TZ_PRINTF(1, 2);

/* Allocation that never returns NULL (fatal with the size on failure). */
void *tz_xmalloc(size_t bytes);
void *tz_xcalloc(size_t n, size_t size);
void *tz_xrealloc(void *p, size_t bytes);
char *tz_xstrdup(const char *s);

#endif
