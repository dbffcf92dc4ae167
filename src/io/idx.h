/* IDX files (the MNIST / Fashion-MNIST format), gzip-compressed or plain: unsigned-byte
 * images (magic 0x00000803, N x rows x cols) and labels (0x00000801, N), big-endian
 * dimensions. Checked readers only; errors are returned with the file named, never fatal. */
#ifndef TZ_IDX_H
#define TZ_IDX_H
#include <stddef.h>
#include <stdint.h>

#include "io/image_set.h"

#define TZ_IDX_IMAGES_MAGIC 0x00000803u
#define TZ_IDX_LABELS_MAGIC 0x00000801u

/* Reads an image file: *pixels (malloc'd, n*rows*cols bytes, row-major). Checks the magic,
 * non-zero dimensions, and that the data is exactly n*rows*cols bytes after the 16-byte
 * header (truncated and over-long files are rejected), and a sound gzip stream. 0, or
 * non-zero with a message naming the file. */
int tz_idx_read_images(const char *path, uint8_t **pixels, int64_t *n, int64_t *rows,
                       int64_t *cols, char *err, size_t errlen);
/* Reads a label file: *labels (malloc'd, n bytes). Same checks, 8-byte header. */
int tz_idx_read_labels(const char *path, uint8_t **labels, int64_t *n, char *err,
                       size_t errlen);
/* An image file and its label file as a set: C = 1, pixels p -> p / 127.5 - 1. Checks
 * the two counts agree and every label < num_classes (num_classes <= 0: the set's
 * num_classes is the largest label + 1). 0, or non-zero naming the file at fault. */
int tz_idx_load(tz_image_set *s, const char *images_path, const char *labels_path,
                int64_t num_classes, char *err, size_t errlen);

#endif
