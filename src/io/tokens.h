/* Token files: a 64-byte little-endian header (magic, version, dtype, vocab, count) then the
 * tokens, and the byte-level text preparation. Knows the format, not batching or training.
 *
 * Layout (version 2), all integers little-endian:
 *   0  char[8]  magic "TZTOKENS"
 *   8  u32      version = 2 (1: flags are 0)
 *  12  u32      bytes per token: 1 (u8), 2 (u16) or 4 (u32)
 *  16  u32      vocab size V (every token < V)
 *  20  u32      flags: bit 0 = a loss mask follows the tokens
 *  24  u64      token count N
 *  32  u64      the tokenizer's digest (io/tokenizer.h tz_tokenizer_digest), 0: not recorded
 *  40  u8[24]   reserved, 0
 *  64  tokens   N * (bytes per token)
 *      mask     with flag bit 0: ceil(N / 8) bytes, bit i % 8 of byte i / 8 set when token i
 *               is trained as a target (a response token); clear: it is context only
 * Files without a mask are written as version 1, which every reader of version 1 reads.
 */
#ifndef TZ_TOKENS_H
#define TZ_TOKENS_H
#include <stddef.h>
#include <stdint.h>

#define TZ_TOKENS_MAGIC "TZTOKENS"
#define TZ_TOKENS_VERSION 2u
#define TZ_TOKENS_FLAG_MASK 1u
#define TZ_TOKENS_HEADER 64
/* The byte tokenizer's digest (token = byte value, vocab 256). */
#define TZ_TOKENS_DIGEST_BYTES 0x6279746573323536ull

typedef struct tz_tokens {
    char path[512];
    uint32_t vocab;
    uint32_t width; /* bytes per token */
    int64_t count;
    const uint8_t *data; /* mmap of the whole file */
    size_t map_bytes;
    const uint8_t *tokens; /* data + header */
    const uint8_t *mask;   /* the loss mask bits, or NULL: every token is trained */
    uint32_t version;
    uint64_t tokenizer; /* the digest of the tokenizer that made it; 0: not recorded */
} tz_tokens;

/* Open and validate (magic, version, width, size agrees with count, every token < vocab).
 * Returns 0, or non-zero with a message naming the file in err. */
int tz_tokens_open(tz_tokens *t, const char *path, char *err, size_t errlen);
void tz_tokens_close(tz_tokens *t);
static inline int32_t tz_tokens_at(const tz_tokens *t, int64_t i) {
    const uint8_t *p = t->tokens + (size_t)i * t->width;
    if (t->width == 1) return p[0];
    if (t->width == 2) return (int32_t)(p[0] | (uint32_t)p[1] << 8);
    return (int32_t)(p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}
/* Whether token i is trained as a target (always, without a mask). */
static inline int tz_tokens_trained(const tz_tokens *t, int64_t i) {
    return !t->mask || (t->mask[i >> 3] >> (i & 7) & 1);
}
/* out[i] = token[start + i], i < n. */
void tz_tokens_read(const tz_tokens *t, int64_t start, int64_t n, int32_t *out);

/* Write n tokens (each < vocab) with the narrowest width; to path.tmp, fsync, rename. */
int tz_tokens_write(const char *path, const uint32_t *tok, int64_t n, uint32_t vocab, char *err,
                    size_t errlen);
/* The same with a loss mask, one byte per token (non-zero: trained), as version 2; mask NULL
 * writes version 1 as tz_tokens_write. */
int tz_tokens_write_masked(const char *path, const uint32_t *tok, const uint8_t *mask, int64_t n,
                           uint32_t vocab, char *err, size_t errlen);
/* The same, recording the digest of the tokenizer that made the tokens (0: none). */
int tz_tokens_write_tagged(const char *path, const uint32_t *tok, const uint8_t *mask, int64_t n,
                           uint32_t vocab, uint64_t tokenizer, char *err, size_t errlen);

/* Byte-level tokenizer: token = byte value, vocab 256. The last val_fraction of the text
 * (cut at a byte) goes to val_path, the rest to out_path; val_fraction = 0 writes every
 * token to out_path. Prints what it wrote. Returns 0 or non-zero with err. */
int tz_tokens_prep_bytes(const char *in_path, const char *out_path, const char *val_path,
                         double val_fraction, char *err, size_t errlen);

#endif
