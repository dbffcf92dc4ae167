/* Labelled images or latents in HDF5, the layout of docs/dit.md: dataset "images" float32
 * or uint8 [N, C, H, W], dataset "labels" int32 or int64 [N], root attributes "num_classes"
 * (integer, optional) and "scale" (float, optional). Checked reader and a writer; errors are
 * returned with the file named, never fatal. The whole set is read into memory. */
#ifndef TZ_IMAGES_H5_H
#define TZ_IMAGES_H5_H
#include <stddef.h>
#include <stdint.h>

#include "io/image_set.h"

/* Reads path into s. uint8 pixels p -> p / 127.5 - 1; float32 values are taken as stored,
 * times "scale" when the attribute is present (e.g. 0.18215 for SD-VAE latents). Checks:
 * both datasets exist, images have rank 4 and labels rank 1, the dtypes above, equal N,
 * every label in [0, num_classes). num_classes: the model's (> 0) or 0 to take the file's
 * attribute (or, without one, the largest label + 1); a file attribute that disagrees with a
 * given num_classes is an error. 0, or non-zero with a message naming the file. */
int tz_h5_images_read(tz_image_set *s, const char *path, int64_t num_classes, char *err,
                      size_t errlen);
/* Writes s as float32 images + int32 labels + num_classes (and "scale" when scale > 0),
 * to path.tmp then renamed over path. 0, or non-zero with a message. */
int tz_h5_images_write(const char *path, const tz_image_set *s, double scale, char *err,
                       size_t errlen);

#endif
