/* Text <-> token ids: an HF tokenizer.json (BPE), or "bytes" (token = byte value, vocab 256). */
#ifndef TZ_TOKENIZER_H
#define TZ_TOKENIZER_H
#include <stddef.h>
#include <stdint.h>

typedef struct tz_tokenizer tz_tokenizer;

/* path: a tokenizer.json, a model folder holding one, or "bytes". NULL with a message in err
 * on failure. */
tz_tokenizer *tz_tokenizer_load(const char *path, char *err, size_t errlen);
void tz_tokenizer_free(tz_tokenizer *t);
/* Number of token ids (the largest id + 1). */
int64_t tz_tokenizer_vocab(const tz_tokenizer *t);
/* The begin- and end-of-sequence ids; -1 when none. */
int32_t tz_tokenizer_bos(const tz_tokenizer *t);
int32_t tz_tokenizer_eos(const tz_tokenizer *t);
/* Encodes len bytes of text into at most cap ids of out (specials: add the tokenizer's
 * begin-of-sequence and other template tokens). *needed (when not NULL) gets the number of
 * ids the text takes. Returns the number written, or -1 with a message in err. */
int64_t tz_tokenizer_encode(const tz_tokenizer *t, const char *text, size_t len, int specials,
                            int32_t *out, int64_t cap, int64_t *needed, char *err, size_t errlen);
/* Decodes n ids into buf (NUL-terminated, at most cap bytes with the NUL; skip_special:
 * leave special tokens out). Returns the length the whole text needs (without the NUL), as
 * snprintf does, or -1 on an id out of range. */
int64_t tz_tokenizer_decode(const tz_tokenizer *t, const int32_t *ids, int64_t n, int skip_special,
                            char *buf, size_t cap);

#endif
