/* Tokenizers read from a Hugging Face tokenizer.json: byte-level BPE (Llama 3, GPT-2 style:
 * regex pre-tokenizer, byte-to-unicode map, merges by rank, added and special tokens) and
 * SentencePiece-style BPE (Llama 2, Mistral: metaspace "▁", byte fallback <0xNN>, merges),
 * and the byte tokenizer (token = byte). A component of tokenizer.json that is not supported
 * is refused by name. Encoding caches words, so one tokenizer is used by one thread at a time. */
#ifndef TZ_TOKENIZER_H
#define TZ_TOKENIZER_H
#include <stddef.h>
#include <stdint.h>

typedef struct tz_tokenizer tz_tokenizer;
/* path: a tokenizer.json file, a model folder holding one (BOS/EOS then read from
 * tokenizer_config.json or config.json beside it), or the string "bytes" (token = byte, vocab 256). */
tz_tokenizer *tz_tokenizer_load(const char *path, char *err, size_t errlen); /* NULL + err on failure */
void tz_tokenizer_free(tz_tokenizer *t);
int64_t tz_tokenizer_vocab(const tz_tokenizer *t);
int32_t tz_tokenizer_bos(const tz_tokenizer *t); /* -1 when none */
int32_t tz_tokenizer_eos(const tz_tokenizer *t); /* -1 when none */
/* Encode len bytes of UTF-8 text (no BOS added; special tokens in the text recognised when
 * specials != 0). Returns the count written to out (at most cap), or -1 with err; *needed set to the full count. */
int64_t tz_tokenizer_encode(const tz_tokenizer *t, const char *text, size_t len, int specials,
                            int32_t *out, int64_t cap, int64_t *needed, char *err, size_t errlen);
/* Decode n ids to UTF-8 into buf (NUL-terminated, at most cap bytes incl. NUL); returns bytes
 * written (without NUL), or -1 when an id is out of range. skip_special: leave special tokens out. */
int64_t tz_tokenizer_decode(const tz_tokenizer *t, const int32_t *ids, int64_t n, int skip_special,
                            char *buf, size_t cap);
/* Whether a sequence starts with BOS: tokenizer_config.json's add_bos_token, else a
 * post-processor that puts a special token first (Llama 3); never without a BOS. */
int tz_tokenizer_add_bos(const tz_tokenizer *t);
/* The identity of the vocabulary: FNV-1a over each id's piece (length, bytes), never 0; two
 * tokenizers with the same digest give the same text for the same ids. The byte tokenizer's is
 * TZ_TOKENS_DIGEST_BYTES. */
uint64_t tz_tokenizer_digest(const tz_tokenizer *t);
/* The chat template tokenizer_config.json's chat_template looks like: "llama3", "llama2",
 * "chatml", or "" (none, or not recognised). */
const char *tz_tokenizer_chat(const tz_tokenizer *t);
/* The ids of dir/generation_config.json's eos_token_id (a number or a list), at most cap;
 * 0 when the file is absent or names none. */
int tz_generation_eos(const char *dir, int32_t *ids, int cap);
/* The id of a token given by its text (an added token's content or a vocabulary entry as
 * tokenizer.json spells it), or -1. */
int32_t tz_tokenizer_find(const tz_tokenizer *t, const char *piece);

#endif
