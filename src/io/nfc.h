/* Unicode Normalization Form C (UAX #15) of UTF-8 text: the "NFC" normalizer of
 * tokenizer.json (Qwen2, Qwen2.5, Qwen3), with the tables of io/unicode_nfc.h (Python's
 * unicodedata, io/gen_unicode_nfc.py). Bytes that are not UTF-8 are kept as they are, each a
 * character of class 0 that nothing composes with. */
#ifndef TZ_NFC_H
#define TZ_NFC_H
#include <stddef.h>
#include <stdint.h>

/* s[0..n) in NFC: returns s itself (*len = n) when it is already (every code point below
 * U+0300: the common case costs one pass), else *out, grown as needed (realloc: *out and
 * *cap may start NULL and 0), holding *len bytes. */
const uint8_t *tz_nfc(const uint8_t *s, size_t n, uint8_t **out, size_t *cap, size_t *len);

#endif
