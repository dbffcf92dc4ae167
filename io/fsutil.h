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
/* The whole file, NUL-terminated (malloc'd; *len, when len is given, its size without the
 * NUL); NULL with "PATH: REASON" in err when it cannot be opened or read. */
char *tz_read_file(const char *path, size_t *len, char *err, size_t errlen);

#endif
