/* The tokenizer interface with the byte-level tokenizer only ("bytes": one token per byte,
 * vocab 256, no special tokens); a tokenizer.json is refused. */
#include "io/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

struct tz_tokenizer {
    int64_t vocab;
};

tz_tokenizer *tz_tokenizer_load(const char *path, char *err, size_t errlen) {
    if (strcmp(path, "bytes") != 0) {
        tz_errf(err, errlen, "%s: only the byte-level tokenizer \"bytes\" is built in (this "
                "build reads no tokenizer.json)", path);
        return NULL;
    }
    tz_tokenizer *t = tz_xcalloc(1, sizeof *t);
    t->vocab = 256;
    return t;
}

void tz_tokenizer_free(tz_tokenizer *t) { free(t); }

int64_t tz_tokenizer_vocab(const tz_tokenizer *t) { return t->vocab; }
int32_t tz_tokenizer_bos(const tz_tokenizer *t) { (void)t; return -1; }
int32_t tz_tokenizer_eos(const tz_tokenizer *t) { (void)t; return -1; }

int64_t tz_tokenizer_encode(const tz_tokenizer *t, const char *text, size_t len, int specials,
                            int32_t *out, int64_t cap, int64_t *needed, char *err, size_t errlen) {
    (void)t, (void)specials, (void)err, (void)errlen;
    if (needed) *needed = (int64_t)len;
    int64_t n = (int64_t)len < cap ? (int64_t)len : cap;
    for (int64_t i = 0; i < n; i++) out[i] = (unsigned char)text[i];
    return n;
}

int64_t tz_tokenizer_decode(const tz_tokenizer *t, const int32_t *ids, int64_t n, int skip_special,
                            char *buf, size_t cap) {
    (void)skip_special;
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= t->vocab) return -1;
    for (int64_t i = 0; cap && i < n && (size_t)i < cap - 1; i++) buf[i] = (char)ids[i];
    if (cap) buf[(size_t)n < cap ? (size_t)n : cap - 1] = 0;
    return n;
}
