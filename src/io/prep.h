/* Token files from text and from instruction data (JSONL) with a real tokenizer
 * (io/tokenizer.h); the byte-level text preparation stays in io/tokens.h.
 *
 * JSONL: one record per line, blank lines skipped, each an object with either
 *   "prompt" and "response" (strings; optional "system" string), or
 *   "messages": [{"role": "system"|"user"|"assistant", "content": string}, ...], or
 *   "text" (a string, all of it trained).
 * A record becomes its chat template's tokens, BOS first and EOS (or the template's end of
 * turn) last; only the assistant's tokens and the end token after each are trained (the loss
 * mask of the token file). Records are laid end to end in file order: a window of seq_len
 * tokens is cut from that stream at a fixed stride, so it may hold the end of one record and
 * the start of the next, and attention crosses that boundary (no packing with isolation). */
#ifndef TZ_PREP_H
#define TZ_PREP_H
#include <stddef.h>
#include <stdint.h>

/* Text through the tokenizer (no BOS or EOS added; special tokens in the text are text).
 * The last val_fraction of the tokens goes to val_path. Prints what it wrote. */
int tz_prep_text(const char *tokenizer, const char *in_path, const char *out_path,
                 const char *val_path, double val_fraction, char *err, size_t errlen);

/* JSONL records with a chat template: "llama3", "llama2", "chatml", "plain", or NULL for the
 * tokenizer's own (llama3 when it has <|start_header_id|>, llama2 for a SentencePiece
 * vocabulary, otherwise plain). The last val_fraction of the records goes to val_path. */
int tz_prep_jsonl(const char *tokenizer, const char *in_path, const char *out_path,
                  const char *val_path, double val_fraction, const char *tmpl, char *err,
                  size_t errlen);

/* A prompt for generation in a chat template (as tz_prep_jsonl renders a record): the optional
 * system message and the user message, then the opening of the assistant's turn. tmpl: a
 * template's name or NULL for the tokenizer's default. Returns the count of ids in *ids (to be
 * freed), with the template's name in tmpl_used and its end-of-turn id (<|eot_id|>,
 * <|im_end|>, EOS; -1 when none) in *end; -1 with err. */
struct tz_tokenizer;
int64_t tz_chat_prompt(const struct tz_tokenizer *t, const char *tmpl, const char *system,
                       const char *user, int32_t **ids, char *tmpl_used, size_t tulen, int32_t *end,
                       char *err, size_t errlen);

#endif
