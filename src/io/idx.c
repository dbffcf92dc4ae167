/* IDX reading through zlib's gz* functions (which read plain files unchanged): the whole
 * stream into memory, then the header checked against the length. No writer. */
#include "io/idx.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "core/error.h"
#include "io/fsutil.h"

#define IDX_MAX_BYTES ((int64_t)1 << 36) /* 64 GiB: beyond it, something is wrong */

static uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* The whole (decompressed) file into *buf, *len bytes. 0, or non-zero with err. */
static int read_all(const char *path, uint8_t **buf, int64_t *len, char *err, size_t errlen) {
    *buf = NULL;
    *len = 0;
    if (tz_check_regular(path, err, errlen)) return 1;
    errno = 0;
    gzFile gz = gzopen(path, "rb");
    if (!gz) {
        snprintf(err, errlen, "%s: cannot open: %s", path, errno ? strerror(errno) : "out of memory");
        return 1;
    }
    int64_t cap = 1 << 20, n = 0;
    uint8_t *b = tz_xmalloc((size_t)cap);
    for (;;) {
        if (n == cap) {
            if (cap >= IDX_MAX_BYTES) {
                snprintf(err, errlen, "%s: larger than %lld bytes: not an IDX file", path,
                         (long long)IDX_MAX_BYTES);
                goto fail;
            }
            cap *= 2;
            b = tz_xrealloc(b, (size_t)cap);
        }
        unsigned want = (unsigned)(cap - n < (1 << 30) ? cap - n : (1 << 30));
        int got = gzread(gz, b + n, want);
        if (got < 0) break;
        n += got;
        if (got == 0) break;
    }
    int zerr = Z_OK;
    const char *msg = gzerror(gz, &zerr);
    if (zerr != Z_OK && zerr != Z_STREAM_END) {
        size_t pl = strlen(path); /* zlib prefixes its message with "path: " */
        if (!strncmp(msg, path, pl) && !strncmp(msg + pl, ": ", 2)) msg += pl + 2;
        snprintf(err, errlen, "%s: corrupt or truncated gzip stream: %s", path,
                 zerr == Z_ERRNO ? strerror(errno) : msg);
        goto fail;
    }
    gzclose(gz);
    *buf = b;
    *len = n;
    return 0;
fail:
    gzclose(gz);
    free(b);
    return 1;
}

/* Checks magic and the length for `dims` big-endian dimensions after the magic. */
static int check_header(const char *path, const uint8_t *b, int64_t len, uint32_t magic,
                        int ndims, int64_t *dims, char *err, size_t errlen) {
    const int64_t hdr = 4 + 4 * (int64_t)ndims;
    const char *what = magic == TZ_IDX_IMAGES_MAGIC ? "unsigned-byte images N x rows x cols"
                                                    : "unsigned-byte labels N";
    if (len < hdr) {
        snprintf(err, errlen, "%s: %lld bytes, shorter than the %lld-byte IDX header (%s)",
                 path, (long long)len, (long long)hdr, what);
        return 1;
    }
    uint32_t got = be32(b);
    if (got != magic) {
        const char *hint = got == TZ_IDX_LABELS_MAGIC   ? " (this is a label file)"
                           : got == TZ_IDX_IMAGES_MAGIC ? " (this is an image file)"
                                                        : "";
        snprintf(err, errlen, "%s: bad magic 0x%08x, expected 0x%08x (IDX %s)%s", path, got,
                 magic, what, hint);
        return 1;
    }
    int64_t count = 1;
    for (int i = 0; i < ndims; i++) {
        dims[i] = be32(b + 4 + 4 * i);
        if (dims[i] == 0) {
            snprintf(err, errlen, "%s: dimension %d of the header is 0", path, i);
            return 1;
        }
        count *= dims[i];
        if (count > IDX_MAX_BYTES) {
            snprintf(err, errlen, "%s: header dimensions give more than %lld bytes", path,
                     (long long)IDX_MAX_BYTES);
            return 1;
        }
    }
    if (len - hdr != count) {
        snprintf(err, errlen, "%s: header says %lld bytes of data (%s), the file has %lld%s",
                 path, (long long)count, what, (long long)(len - hdr),
                 len - hdr < count ? " (truncated)" : " (trailing bytes)");
        return 1;
    }
    return 0;
}

int tz_idx_read_images(const char *path, uint8_t **pixels, int64_t *n, int64_t *rows,
                       int64_t *cols, char *err, size_t errlen) {
    uint8_t *b;
    int64_t len, dims[3];
    *pixels = NULL;
    if (read_all(path, &b, &len, err, errlen)) return 1;
    if (check_header(path, b, len, TZ_IDX_IMAGES_MAGIC, 3, dims, err, errlen)) {
        free(b);
        return 1;
    }
    *n = dims[0], *rows = dims[1], *cols = dims[2];
    memmove(b, b + 16, (size_t)(len - 16));
    *pixels = b;
    return 0;
}

int tz_idx_read_labels(const char *path, uint8_t **labels, int64_t *n, char *err,
                       size_t errlen) {
    uint8_t *b;
    int64_t len, dims[1];
    *labels = NULL;
    if (read_all(path, &b, &len, err, errlen)) return 1;
    if (check_header(path, b, len, TZ_IDX_LABELS_MAGIC, 1, dims, err, errlen)) {
        free(b);
        return 1;
    }
    *n = dims[0];
    memmove(b, b + 8, (size_t)(len - 8));
    *labels = b;
    return 0;
}

int tz_idx_load(tz_image_set *s, const char *images_path, const char *labels_path,
                int64_t num_classes, char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    uint8_t *px = NULL, *lab = NULL;
    int64_t n, rows, cols, nl;
    if (tz_idx_read_images(images_path, &px, &n, &rows, &cols, err, errlen)) return 1;
    if (tz_idx_read_labels(labels_path, &lab, &nl, err, errlen)) {
        free(px);
        return 1;
    }
    int rc = 0;
    if (nl != n) {
        snprintf(err, errlen, "%s: %lld labels, but %s has %lld images", labels_path,
                 (long long)nl, images_path, (long long)n);
        rc = 1;
    }
    int64_t maxl = 0;
    for (int64_t i = 0; !rc && i < n; i++) {
        if (lab[i] > maxl) maxl = lab[i];
        if (num_classes > 0 && lab[i] >= num_classes) {
            snprintf(err, errlen, "%s: label %u of item %lld is not below num_classes %lld",
                     labels_path, lab[i], (long long)i, (long long)num_classes);
            rc = 1;
        }
    }
    if (!rc) {
        s->n = n, s->C = 1, s->H = rows, s->W = cols;
        s->num_classes = num_classes > 0 ? num_classes : maxl + 1;
        s->x = tz_xmalloc((size_t)(n * rows * cols) * sizeof *s->x);
        s->y = tz_xmalloc((size_t)n * sizeof *s->y);
        for (int64_t i = 0; i < n * rows * cols; i++) s->x[i] = (float)px[i] / 127.5f - 1.0f;
        for (int64_t i = 0; i < n; i++) s->y[i] = lab[i];
    }
    free(px);
    free(lab);
    return rc;
}
