/* Atomic file replacement (tmp + fsync + rename + folder fsync), used by every writer in io/
 * so a crash mid-write leaves either the old file or the new one, never a torn one. The
 * temporary has an unpredictable name and is created exclusively: no link is ever followed. */
#include "io/atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"

/* ---- test hook ------------------------------------------------------------------------ */

static long fault_target = -2, fault_count = 0;

void tz_write_fault_arm(long nth) {
    fault_target = nth;
    fault_count = 0;
}

int tz_write_fault(const char *what, char *err, size_t n) {
    long target = fault_target, count;
    if (target == -2) {
        const char *s = getenv("TZ_TEST_FAIL_WRITE");
        target = fault_target = s && *s ? strtol(s, NULL, 10) : -1;
    }
    if (target <= 0) return 0;
    count = ++fault_count;
    if (count != target) return 0;
    errno = EIO;
    tz_errf(err, n, "%s: write failed: %s (injected by TZ_TEST_FAIL_WRITE=%ld)", what,
            strerror(EIO), target);
    errno = EIO;
    return 1;
}

static void af_release(tz_atomic_file *f) {
    free(f->path);
    free(f->tmp_path);
    f->path = NULL;
    f->tmp_path = NULL;
    f->fd = -1;
}

int tz_atomic_file_make_temp(const char *path, char **tmp_path, char *err, size_t errlen) {
    size_t n = strlen(path);
    char *tmp = (char *)tz_xmalloc(n + 32);
    static const char digits[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    for (int attempt = 0; attempt < 100; attempt++) {
        unsigned char r[12];
        if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) { /* no entropy: time and pid */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^
                         ((uint64_t)getpid() << 40) ^ ((uint64_t)attempt * 0x9e3779b97f4a7c15u);
            for (size_t i = 0; i < sizeof r; i++, x = x * 6364136223846793005u + 1442695040888963407u)
                r[i] = (unsigned char)(x >> 56);
        }
        char suffix[13];
        for (size_t i = 0; i < sizeof r; i++) suffix[i] = digits[r[i] % 62];
        suffix[12] = 0;
        snprintf(tmp, n + 32, "%s.tmp.%s", path, suffix);
        /* O_EXCL: a name that exists, a planted link included, is never opened */
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (fd >= 0) {
            *tmp_path = tmp;
            return fd;
        }
        if (errno != EEXIST) break;
    }
    tz_errf(err, errlen, "%s: cannot create a temporary file %s: %s", path, tmp, strerror(errno));
    free(tmp);
    *tmp_path = NULL;
    return -1;
}

int tz_atomic_file_open(tz_atomic_file *f, const char *path, char *err, size_t errlen) {
    f->fd = -1;
    f->path = NULL;
    f->tmp_path = NULL;
    if (!path || !*path) {
        tz_errf(err, errlen, "(empty path): cannot write a file without a name");
        return 1;
    }
    f->path = tz_xstrdup(path);
    f->fd = tz_atomic_file_make_temp(path, &f->tmp_path, err, errlen);
    if (f->fd < 0) {
        af_release(f);
        return 1;
    }
    return 0;
}

int tz_atomic_file_write(tz_atomic_file *f, const void *buf, size_t n, char *err, size_t errlen) {
    const char *p = (const char *)buf;
    while (n > 0) {
        size_t chunk = n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n;
        ssize_t w = write(f->fd, p, chunk);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            tz_errf(err, errlen, "%s: write to %s failed: %s", f->path, f->tmp_path,
                    w < 0 ? strerror(errno) : "no progress");
            return 1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Makes the rename durable. Failure to open the folder is not an error (some file systems
 * refuse it); the data itself was already fsynced. */
static void af_sync_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir;
    if (!slash) {
        dir = tz_xstrdup(".");
    } else {
        size_t len = (size_t)(slash - path);
        if (len == 0) len = 1; /* "/file" -> "/" */
        dir = (char *)tz_xmalloc(len + 1);
        memcpy(dir, path, len);
        dir[len] = '\0';
    }
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
    free(dir);
}

int tz_atomic_file_commit(tz_atomic_file *f, char *err, size_t errlen) {
    if (tz_write_fault(f->path, err, errlen)) {
        tz_atomic_file_abort(f);
        return 1;
    }
    if (fsync(f->fd) != 0) {
        tz_errf(err, errlen, "%s: fsync of %s failed: %s", f->path, f->tmp_path, strerror(errno));
        tz_atomic_file_abort(f);
        return 1;
    }
    int rc = close(f->fd);
    f->fd = -1;
    if (rc != 0) {
        tz_errf(err, errlen, "%s: close of %s failed: %s", f->path, f->tmp_path, strerror(errno));
        tz_atomic_file_abort(f);
        return 1;
    }
    if (rename(f->tmp_path, f->path) != 0) {
        tz_errf(err, errlen, "%s: rename from %s failed: %s", f->path, f->tmp_path,
                strerror(errno));
        tz_atomic_file_abort(f);
        return 1;
    }
    af_sync_dir(f->path);
    af_release(f);
    return 0;
}

void tz_atomic_file_abort(tz_atomic_file *f) {
    if (f->fd >= 0) close(f->fd);
    if (f->tmp_path) unlink(f->tmp_path);
    af_release(f);
}

int tz_atomic_file_put(const char *path, const void *buf, size_t n, char *err, size_t errlen) {
    tz_atomic_file f;
    if (tz_atomic_file_open(&f, path, err, errlen)) return 1;
    if (tz_atomic_file_write(&f, buf, n, err, errlen)) {
        tz_atomic_file_abort(&f);
        return 1;
    }
    return tz_atomic_file_commit(&f, err, errlen);
}
