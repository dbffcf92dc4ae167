/* Atomic file replacement (tmp + fsync + rename + folder fsync), used by every writer in io/
 * so a crash mid-write leaves either the old file or the new one, never a torn one. */
#include "io/atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"

static void af_release(tz_atomic_file *f) {
    free(f->path);
    free(f->tmp_path);
    f->path = NULL;
    f->tmp_path = NULL;
    f->fd = -1;
}

int tz_atomic_file_open(tz_atomic_file *f, const char *path, char *err, size_t errlen) {
    f->fd = -1;
    f->path = NULL;
    f->tmp_path = NULL;
    if (!path || !*path) {
        tz_errf(err, errlen, "(empty path): cannot write a file without a name");
        return 1;
    }
    size_t n = strlen(path);
    f->path = tz_xstrdup(path);
    f->tmp_path = (char *)tz_xmalloc(n + 5);
    memcpy(f->tmp_path, path, n);
    memcpy(f->tmp_path + n, ".tmp", 5);
    f->fd = open(f->tmp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f->fd < 0) {
        tz_errf(err, errlen, "%s: cannot create %s: %s", path, f->tmp_path, strerror(errno));
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
