/* The unit tests' tally: check() prints one ok/FAIL line per assertion, tz_check_done()
 * prints the closing "NAME: N passed, M failed" line and gives the exit status. */
#ifndef TZ_CHECK_H
#define TZ_CHECK_H
#include <stdarg.h>
#include <stdio.h>

static int g_pass, g_fail;

__attribute__((format(printf, 2, 3))) static inline void check(int ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "ok  " : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    if (ok) g_pass++;
    else g_fail++;
}

static inline int tz_check_done(const char *name) {
    printf("%s: %d passed, %d failed\n", name, g_pass, g_fail);
    return g_fail ? 1 : 0;
}

#endif
