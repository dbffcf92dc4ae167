/* File-system helpers shared by the writers; no format knowledge here. */
#include "io/fsutil.h"

#include <errno.h>
#include <jansson.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"

int tz_mkdir_p(const char *path, char *err, size_t errlen) {
    char buf[1024];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) {
        snprintf(err, errlen, "%s: path too long", path);
        return 1;
    }
    for (char *p = buf + 1;; p++) {
        char c = *p;
        if (c == '/' || c == '\0') {
            *p = '\0';
            if (mkdir(buf, 0777) != 0 && errno != EEXIST) {
                snprintf(err, errlen, "%s: cannot create directory: %s", buf, strerror(errno));
                return 1;
            }
            struct stat st;
            if (stat(buf, &st) != 0 || !S_ISDIR(st.st_mode)) {
                snprintf(err, errlen, "%s: exists and is not a directory", buf);
                return 1;
            }
            *p = c;
        }
        if (c == '\0') break;
    }
    return 0;
}

int tz_path_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

void tz_path_join(char *out, size_t outlen, const char *a, const char *b) {
    if ((size_t)snprintf(out, outlen, "%s/%s", a, b) >= outlen)
        TZ_FATAL("path too long: %s/%s", a, b);
}

const char *tz_file_kind(unsigned mode) {
    return S_ISREG(mode)    ? "a regular file"
           : S_ISFIFO(mode) ? "a FIFO"
           : S_ISDIR(mode)  ? "a directory"
           : S_ISCHR(mode)  ? "a character device"
           : S_ISBLK(mode)  ? "a block device"
           : S_ISSOCK(mode) ? "a socket"
                            : "not a regular file";
}

int tz_open_regular(const char *path, const char **kind) {
    *kind = NULL;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        *kind = tz_file_kind((unsigned)st.st_mode);
        close(fd);
        errno = 0;
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    return fd;
}

char *tz_read_file(const char *path, size_t *len, char *err, size_t errlen) {
    const char *kind;
    int fd = tz_open_regular(path, &kind);
    if (fd < 0) {
        if (kind) tz_errf(err, errlen, "%s: not a regular file (%s)", path, kind);
        else tz_errf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        tz_errf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    size_t cap = 4096, n = 0;
    char *text = tz_xmalloc(cap);
    for (size_t got; (got = fread(text + n, 1, cap - n - 1, f)) > 0;)
        if ((n += got) + 1 >= cap) text = tz_xrealloc(text, cap *= 2);
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        tz_errf(err, errlen, "%s: read error", path);
        free(text);
        return NULL;
    }
    text[n] = 0;
    if (len) *len = n;
    return text;
}

int tz_check_regular(const char *path, char *err, size_t errlen) {
    struct stat st;
    if (stat(path, &st) != 0 || S_ISREG(st.st_mode)) return 0;
    snprintf(err, errlen, "%s: not a regular file (%s)", path, tz_file_kind((unsigned)st.st_mode));
    return 1;
}

const char *const tz_tokenizer_files[] = {"tokenizer.json", "tokenizer_config.json",
                                          "special_tokens_map.json", "generation_config.json",
                                          "tokenizer.model", NULL};

int tz_copy_tokenizer_files(const char *src, const char *dst, char *err, size_t errlen) {
    int copied = 0;
    for (int i = 0; tz_tokenizer_files[i]; i++) {
        char from[1100], to[1100];
        tz_path_join(from, sizeof from, src, tz_tokenizer_files[i]);
        tz_path_join(to, sizeof to, dst, tz_tokenizer_files[i]);
        struct stat s;
        if (stat(from, &s) != 0) continue; /* not there: nothing to carry */
        size_t n = 0;
        char *data = tz_read_file(from, &n, err, errlen);
        if (!data) return -1;
        char tmp[1200];
        snprintf(tmp, sizeof tmp, "%s.tmp.%ld", to, (long)getpid());
        FILE *f = fopen(tmp, "wb");
        int bad = !f || fwrite(data, 1, n, f) != n;
        if (f && fclose(f) != 0) bad = 1;
        free(data);
        if (bad || rename(tmp, to) != 0) {
            snprintf(err, errlen, "%s: cannot write: %s", to, strerror(errno));
            unlink(tmp);
            return -1;
        }
        copied++;
    }
    return copied;
}

json_t *tz_json_load_file(const char *path, size_t flags, char *err, size_t errlen) {
    char rerr[600];
    size_t n;
    char *text = tz_read_file(path, &n, rerr, sizeof rerr);
    if (!text) {
        if (err) tz_errf(err, errlen, "%s", rerr);
        return NULL;
    }
    json_error_t je;
    json_t *root = json_loadb(text, n, flags, &je);
    free(text);
    if (!root && err)
        tz_errf(err, errlen, "%s: not valid JSON: %s (line %d, column %d)", path, je.text,
                je.line, je.column);
    return root;
}
