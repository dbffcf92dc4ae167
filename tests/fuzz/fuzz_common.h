/* What the fuzz targets share: a private scratch folder (the parsers read paths, so each input
 * is written to a file there first), the check that a rejected input was explained, and
 * catching a fatal error (TZ_FATAL) as a clean rejection of the input rather than a crash.
 * A sanitizer report, a leak, an abort() here or a hang is a finding; a parser's error is not.
 * TZ_FUZZ_VERBOSE=1 prints every rejection (for reading a corpus, not while fuzzing). */
#ifndef TZ_FUZZ_COMMON_H
#define TZ_FUZZ_COMMON_H
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char fz_dir_path[512];

/* Removes the scratch folder and what is in it (one level of sub-folders). */
static inline void fz_remove_tree(const char *dir, int depth) {
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat st;
        if (depth < 2 && lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) fz_remove_tree(p, depth + 1);
        else unlink(p);
    }
    closedir(d);
    rmdir(dir);
}
static inline void fz_cleanup(void) {
    if (fz_dir_path[0]) fz_remove_tree(fz_dir_path, 0);
}

/* The scratch folder, $TMPDIR/tzfuzz.XXXXXX: made on first use, removed at exit. */
static inline const char *fz_dir(void) {
    if (!fz_dir_path[0]) {
        const char *tmp = getenv("TMPDIR");
        snprintf(fz_dir_path, sizeof fz_dir_path, "%s/tzfuzz.XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(fz_dir_path)) {
            fprintf(stderr, "fuzz: cannot make %s: %s\n", fz_dir_path, strerror(errno));
            abort();
        }
        atexit(fz_cleanup);
    }
    return fz_dir_path;
}

/* path = scratch/name (path holds 600 bytes). */
static inline const char *fz_path(char *path, const char *name) {
    snprintf(path, 600, "%s/%s", fz_dir(), name);
    return path;
}

/* Writes data[0..size) to scratch/name, replacing it; the path into path (600 bytes). */
static inline const char *fz_file(char *path, const char *name, const void *data, size_t size) {
    fz_path(path, name);
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) {
        fprintf(stderr, "fuzz: cannot write %s: %s\n", path, strerror(errno));
        abort();
    }
    return path;
}

/* Copies a file of the source tree (tests/fuzz/REL) to scratch/name. */
static inline void fz_copy_data(const char *rel, const char *name) {
    char src[700], path[600];
    snprintf(src, sizeof src, "%s/%s", TZ_FUZZ_DIR, rel);
    FILE *f = fopen(src, "rb");
    if (!f) {
        fprintf(stderr, "fuzz: cannot read %s: %s\n", src, strerror(errno));
        abort();
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (size_t got; buf && (got = fread(buf + n, 1, cap - n, f)) > 0;)
        if ((n += got) == cap) buf = realloc(buf, cap *= 2);
    fclose(f);
    if (!buf) abort();
    fz_file(path, name, buf, n);
    free(buf);
}

/* A rejected input must be explained: a message, naming the file when `name` is given. An
 * unexplained rejection is a finding (abort). */
static inline void fz_rejected(const char *err, const char *name) {
    if (getenv("TZ_FUZZ_VERBOSE")) fprintf(stderr, "rejected: %s\n", err);
    if (!err[0] || (name && !strstr(err, name))) {
        fprintf(stderr, "fuzz: an input was rejected without a message naming %s: \"%s\"\n",
                name ? name : "the file", err);
        abort();
    }
}

/* Catching TZ_FATAL: FZ_CATCH_FATAL() is non-zero on the first pass and zero after a fatal
 * error jumped back to it; fz_catch_end() removes the hook. Locals changed in between and
 * read after a jump must be volatile. */
static jmp_buf fz_jmp;
static char fz_fatal_msg[4096];
static inline void fz_on_fatal(const char *message) {
    snprintf(fz_fatal_msg, sizeof fz_fatal_msg, "%s", message);
    if (getenv("TZ_FUZZ_VERBOSE")) fprintf(stderr, "fatal: %s\n", message);
    longjmp(fz_jmp, 1);
}
#define FZ_CATCH_FATAL() (tz_fatal_set_hook(fz_on_fatal), setjmp(fz_jmp) == 0)
static inline void fz_catch_end(void) { tz_fatal_set_hook(NULL); }

/* A property of an accepted input that does not hold: a finding. */
#define FZ_ASSERT(cond, ...)                                               \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "fuzz: %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                  \
            fprintf(stderr, "\n");                                         \
            abort();                                                       \
        }                                                                  \
    } while (0)

#endif
