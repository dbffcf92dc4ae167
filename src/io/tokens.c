/* Token file reading (mmap, validated up front) and writing (atomic), and byte-level
 * preparation of a text. Real tokenizers are io/tokenizer.c;
 * preparation with them is io/prep.c. */
#include "io/tokens.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/fsutil.h"

static uint32_t rd32(const uint8_t *p) {
    return p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const uint8_t *p) { return rd32(p) | (uint64_t)rd32(p + 4) << 32; }
static void wr32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void wr64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

int tz_tokens_open(tz_tokens *t, const char *path, char *err, size_t errlen) {
    memset(t, 0, sizeof *t);
    snprintf(t->path, sizeof t->path, "%s", path);
    const char *kind;
    int fd = tz_open_regular(path, &kind); /* a FIFO is refused, not waited on */
    if (fd < 0 && kind) {
        snprintf(err, errlen, "%s: not a token file: it is %s, expected a regular file", path, kind);
        return 1;
    }
    if (fd < 0) {
        snprintf(err, errlen, "%s: cannot open token file: %s", path, strerror(errno));
        return 1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < TZ_TOKENS_HEADER) {
        snprintf(err, errlen, "%s: not a token file: %lld bytes, the header alone is %d", path,
                 (long long)st.st_size, TZ_TOKENS_HEADER);
        close(fd);
        return 1;
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        snprintf(err, errlen, "%s: mmap failed: %s", path, strerror(errno));
        return 1;
    }
    t->data = m;
    t->map_bytes = (size_t)st.st_size;
    const uint8_t *h = t->data;
    uint32_t version = rd32(h + 8);
    t->width = rd32(h + 12);
    t->vocab = rd32(h + 16);
    uint32_t flags = rd32(h + 20);
    uint64_t count = rd64(h + 24);
    t->version = version;
    t->tokenizer = rd64(h + 32);
    int has_mask = version >= 2 && (flags & TZ_TOKENS_FLAG_MASK);
    uint64_t avail = t->map_bytes - TZ_TOKENS_HEADER;
    const char *why = NULL;
    char buf[160];
    if (memcmp(h, TZ_TOKENS_MAGIC, 8) != 0)
        why = "bad magic (expected \"TZTOKENS\"; make one with `turbozero prep text`)";
    else if (version < 1 || version > TZ_TOKENS_VERSION)
        snprintf(buf, sizeof buf, "version %u, this build reads versions 1 to %u", version,
                 TZ_TOKENS_VERSION), why = buf;
    else if ((version == 1 && flags) || (flags & ~TZ_TOKENS_FLAG_MASK))
        snprintf(buf, sizeof buf, "unknown flags 0x%x for version %u", flags, version), why = buf;
    else if (t->width != 1 && t->width != 2 && t->width != 4)
        snprintf(buf, sizeof buf, "token width %u, expected 1, 2 or 4 bytes", t->width), why = buf;
    else if (t->vocab == 0 || (t->width < 4 && t->vocab > (1u << (8 * t->width))))
        snprintf(buf, sizeof buf, "vocab %u does not fit %u-byte tokens", t->vocab, t->width),
            why = buf;
    else if (t->vocab > (uint32_t)INT32_MAX) /* tokens are read as int32_t */
        snprintf(buf, sizeof buf, "vocab %u, expected at most 2^31 - 1", t->vocab), why = buf;
    else if (count > (UINT64_MAX - TZ_TOKENS_HEADER) / t->width) /* the size would wrap */
        snprintf(buf, sizeof buf, "header says %llu tokens (more than 2^64 bytes) but the file "
                 "has %zu bytes", (unsigned long long)count, t->map_bytes), why = buf;
    else if (count > avail / t->width ||
             TZ_TOKENS_HEADER + count * t->width + (has_mask ? (count + 7) / 8 : 0) != t->map_bytes)
        snprintf(buf, sizeof buf, "header says %llu tokens%s (%llu bytes) but the file has %zu",
                 (unsigned long long)count, has_mask ? " and a loss mask" : "",
                 (unsigned long long)(TZ_TOKENS_HEADER + count * t->width +
                                      (has_mask ? (count + 7) / 8 : 0)),
                 t->map_bytes),
            why = buf;
    if (why) {
        snprintf(err, errlen, "%s: %s", path, why);
        tz_tokens_close(t);
        return 1;
    }
    t->count = (int64_t)count;
    t->tokens = t->data + TZ_TOKENS_HEADER;
    t->mask = has_mask ? t->tokens + count * t->width : NULL;
    for (int64_t i = 0; i < t->count; i++) {
        uint32_t v = (uint32_t)tz_tokens_at(t, i);
        if (v >= t->vocab) {
            snprintf(err, errlen, "%s: token %lld is %u, not below the vocab size %u", path,
                     (long long)i, v, t->vocab);
            tz_tokens_close(t);
            return 1;
        }
    }
    return 0;
}

void tz_tokens_close(tz_tokens *t) {
    if (t->data) munmap((void *)t->data, t->map_bytes);
    t->data = t->tokens = NULL;
}

void tz_tokens_read(const tz_tokens *t, int64_t start, int64_t n, int32_t *out) {
    for (int64_t i = 0; i < n; i++) out[i] = tz_tokens_at(t, start + i);
}

int tz_tokens_write(const char *path, const uint32_t *tok, int64_t n, uint32_t vocab, char *err,
                    size_t errlen) {
    return tz_tokens_write_masked(path, tok, NULL, n, vocab, err, errlen);
}

int tz_tokens_write_masked(const char *path, const uint32_t *tok, const uint8_t *mask, int64_t n,
                           uint32_t vocab, char *err, size_t errlen) {
    return tz_tokens_write_tagged(path, tok, mask, n, vocab, 0, err, errlen);
}

int tz_tokens_write_tagged(const char *path, const uint32_t *tok, const uint8_t *mask, int64_t n,
                           uint32_t vocab, uint64_t tokenizer, char *err, size_t errlen) {
    uint32_t width = vocab <= 256 ? 1 : vocab <= 65536 ? 2 : 4;
    uint8_t h[TZ_TOKENS_HEADER] = {0};
    memcpy(h, TZ_TOKENS_MAGIC, 8);
    wr32(h + 8, mask ? 2u : 1u);
    wr32(h + 12, width);
    wr32(h + 16, vocab);
    wr32(h + 20, mask ? TZ_TOKENS_FLAG_MASK : 0u);
    wr64(h + 24, (uint64_t)n);
    wr64(h + 32, tokenizer);
    tz_atomic_file f;
    if (tz_atomic_file_open(&f, path, err, errlen)) return 1;
    int rc = tz_atomic_file_write(&f, h, sizeof h, err, errlen);
    uint8_t buf[4096];
    for (int64_t i = 0; i < n && !rc;) {
        size_t k = 0;
        for (; i < n && k + width <= sizeof buf; i++) {
            if (tok[i] >= vocab) {
                snprintf(err, errlen, "%s: token %lld is %u, not below vocab %u", path,
                         (long long)i, tok[i], vocab);
                tz_atomic_file_abort(&f);
                return 1;
            }
            for (uint32_t b = 0; b < width; b++) buf[k++] = (uint8_t)(tok[i] >> (8 * b));
        }
        rc = tz_atomic_file_write(&f, buf, k, err, errlen);
    }
    for (int64_t i = 0; mask && i < n && !rc;) { /* the mask, 8 tokens a byte */
        size_t k = 0;
        for (; i < n && k < sizeof buf; i += 8) {
            uint8_t bits = 0;
            for (int64_t j = i; j < i + 8 && j < n; j++) bits |= (uint8_t)((mask[j] != 0) << (j - i));
            buf[k++] = bits;
        }
        rc = tz_atomic_file_write(&f, buf, k, err, errlen);
    }
    if (rc) {
        tz_atomic_file_abort(&f);
        return 1;
    }
    return tz_atomic_file_commit(&f, err, errlen);
}

int tz_tokens_prep_bytes(const char *in_path, const char *out_path, const char *val_path,
                         double val_fraction, char *err, size_t errlen) {
    if (!(val_fraction >= 0.0 && val_fraction < 1.0)) {
        snprintf(err, errlen, "--val-fraction %g: expected a number in [0, 1)", val_fraction);
        return 1;
    }
    const char *kind;
    int fd = tz_open_regular(in_path, &kind);
    FILE *f = fd < 0 ? NULL : fdopen(fd, "rb");
    if (!f) {
        if (kind) snprintf(err, errlen, "%s: not a text file: it is %s, expected a regular file", in_path, kind);
        else snprintf(err, errlen, "%s: cannot open text: %s", in_path, strerror(errno));
        if (fd >= 0) close(fd);
        return 1;
    }
    size_t cap = 1 << 20, n = 0, k;
    uint8_t *text = tz_xmalloc(cap);
    while ((k = fread(text + n, 1, cap - n, f)) > 0) {
        n += k;
        if (n == cap) text = tz_xrealloc(text, cap *= 2);
    }
    int rerr = ferror(f);
    fclose(f);
    if (rerr || n == 0) {
        snprintf(err, errlen, "%s: %s", in_path, rerr ? "read error" : "empty text");
        free(text);
        return 1;
    }
    uint32_t *tok = tz_xmalloc(n * sizeof *tok);
    for (size_t i = 0; i < n; i++) tok[i] = text[i];
    free(text);
    int64_t nval = (int64_t)((double)n * val_fraction);
    int64_t ntrain = (int64_t)n - nval;
    const uint64_t dg = TZ_TOKENS_DIGEST_BYTES;
    int rc = tz_tokens_write_tagged(out_path, tok, NULL, ntrain, 256, dg, err, errlen);
    if (!rc) printf("wrote %s: %lld tokens (bytes, vocab 256)\n", out_path, (long long)ntrain);
    if (!rc && nval > 0) {
        rc = tz_tokens_write_tagged(val_path, tok + ntrain, NULL, nval, 256, dg, err, errlen);
        if (!rc) printf("wrote %s: %lld tokens (validation)\n", val_path, (long long)nval);
    }
    free(tok);
    return rc;
}
