/* Small file-system helpers: recursive mkdir, existence checks, path joining, a whole file
 * read. */
#ifndef TZ_FSUTIL_H
#define TZ_FSUTIL_H
#include <stddef.h>

/* mkdir -p; 0 or non-zero with err naming the path. */
int tz_mkdir_p(const char *path, char *err, size_t errlen);
int tz_path_exists(const char *path);
/* out = a "/" b; fatal if it does not fit. */
void tz_path_join(char *out, size_t outlen, const char *a, const char *b);
/* Opens path read-only when it is a regular file, without blocking on a FIFO or a device
 * (opened O_NONBLOCK, checked with fstat before anything is read, then set back to blocking).
 * The descriptor (close-on-exec), or -1: with *kind NULL and errno set when it cannot be
 * opened, with *kind naming what it is instead ("a FIFO", "a directory", ...) when it is not a
 * regular file. */
int tz_open_regular(const char *path, const char **kind);
/* What a file of stat mode `mode` is, for messages: "a regular file", "a FIFO", "a directory",
 * "a character device", "a block device", "a socket", or "not a regular file". */
const char *tz_file_kind(unsigned mode);
/* 0 when path names a regular file (through links) or nothing at all (the caller's open
 * then says so); non-zero with "PATH: not a regular file (a FIFO)" in err otherwise. For
 * readers that open by name (libraries' own open calls): checked before they can block. */
int tz_check_regular(const char *path, char *err, size_t errlen);
/* The whole file, NUL-terminated (malloc'd; *len, when len is given, its size without the
 * NUL); NULL with "PATH: REASON" in err when it cannot be opened or read, or is not a regular
 * file ("PATH: not a regular file (a FIFO)"). */
char *tz_read_file(const char *path, size_t *len, char *err, size_t errlen);
/* The JSON value in path (jansson's json_loadb with its flags), the file read whole first by
 * tz_read_file (a FIFO or a device refused, not waited on); NULL with "PATH: REASON" or "PATH:
 * not valid JSON: WHAT (line L, column C)" in err (err may be NULL). */
struct json_t;
struct json_t *tz_json_load_file(const char *path, size_t flags, char *err, size_t errlen);
/* The files of a Hugging Face tokenizer beside a model (tokenizer.json, its config, special
 * tokens, generation_config.json's stop ids, a SentencePiece model), NULL-terminated. */
extern const char *const tz_tokenizer_files[];
/* Copies those of them that folder src holds into folder dst (each written whole under a
 * temporary name, then renamed), so a model written from src carries its tokenizer. The
 * count copied, or -1 with "PATH: REASON" in err. */
int tz_copy_tokenizer_files(const char *src, const char *dst, char *err, size_t errlen);

#endif
