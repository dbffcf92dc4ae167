/* File helpers of the unit tests that work in a scratch folder: paths in it, small text files
 * written and compared. */
#ifndef TZ_FILES_H
#define TZ_FILES_H
#include <stdio.h>
#include <string.h>

/* dir/name in one of 8 rotating buffers (several may be live in one call). */
static inline const char *tz_tpath(const char *dir, const char *name) {
    static char buf[8][600];
    static int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

/* Writes text to path (best effort: the checks that follow see a failure). */
static inline void tz_put(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (f) fputs(text, f), fclose(f);
}

/* Whether path exists and holds exactly text (text under 256 bytes). */
static inline int tz_holds(const char *path, const char *text) {
    char b[256] = "";
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(b, 1, sizeof b - 1, f) : 0;
    if (f) fclose(f);
    return f && n == strlen(text) && !memcmp(b, text, n);
}

#endif
