/* Whole-file replacement that never leaves a half-written file under the final name:
 * write PATH.tmp.<random>, fsync, rename over PATH, fsync the folder. No formats. */
#ifndef TZ_ATOMIC_FILE_H
#define TZ_ATOMIC_FILE_H
#include <stddef.h>

typedef struct tz_atomic_file {
    int fd;          /* -1 when not open */
    char *path;      /* final name */
    char *tmp_path;  /* path + ".tmp." + 12 random characters */
} tz_atomic_file;

/* A new empty file path.tmp.<12 random characters> in path's folder, created with O_CREAT |
 * O_EXCL | O_NOFOLLOW (an existing name or a planted link is never opened; another name is
 * tried); its name in *tmp_path (free it). The open fd, or -1 with a message in err. */
int tz_atomic_file_make_temp(const char *path, char **tmp_path, char *err, size_t errlen);
/* Creates a temporary (as above) for writing. 0, or non-zero with a message in err. */
int tz_atomic_file_open(tz_atomic_file *f, const char *path, char *err, size_t errlen);
/* Writes all n bytes (retrying short writes). 0, or non-zero with a message. */
int tz_atomic_file_write(tz_atomic_file *f, const void *buf, size_t n, char *err, size_t errlen);
/* fsync, close, rename to the final name, fsync the folder; frees f. On failure the .tmp
 * file is removed, the final name is left as it was, and f is freed. */
int tz_atomic_file_commit(tz_atomic_file *f, char *err, size_t errlen);
/* Gives up: closes and removes the temporary, frees f. Safe on a file that failed to open. */
void tz_atomic_file_abort(tz_atomic_file *f);
/* The whole of buf (n bytes) as path: open, write, commit, aborting on a failure. 0, or
 * non-zero with a message. */
int tz_atomic_file_put(const char *path, const void *buf, size_t n, char *err, size_t errlen);

/* ---- test hook (every checked write of src/io: atomic files, run_dir's logs and commits) */
/* With TZ_TEST_FAIL_WRITE=N in the environment, the N-th call in this process (counting
 * every checked write: atomic file commits, log flushes, folder commits, the moves of a run
 * commit) returns non-zero with errno = EIO and "WHAT: injected write failure (EIO)" in err;
 * all other calls return 0. For tests of what a failure between two outputs leaves. */
int tz_write_fault(const char *what, char *err, size_t n);
/* Unit tests: the nth call from now fails (0: none), whatever the environment says. */
void tz_write_fault_arm(long nth);

#endif
