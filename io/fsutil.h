/* Small file-system helpers: recursive mkdir, existence checks, path joining. */
#ifndef TZ_FSUTIL_H
#define TZ_FSUTIL_H
#include <stddef.h>

/* mkdir -p; 0 or non-zero with err naming the path. */
int tz_mkdir_p(const char *path, char *err, size_t errlen);
int tz_path_exists(const char *path);
/* out = a "/" b; fatal if it does not fit. */
void tz_path_join(char *out, size_t outlen, const char *a, const char *b);

#endif
