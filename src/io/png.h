/* PNG output (libpng) of image grids, n images [n, C, H, W] with C = 1 (grayscale) or 3
 * (RGB), values in [-1, 1] mapped to 0..255, tiled row by row, and of RGB pictures (plots).
 * Written atomically. No reader (the tests read back with libpng directly). */
#ifndef TZ_PNG_H
#define TZ_PNG_H
#include <stddef.h>
#include <stdint.h>

/* The byte of a value: round((v + 1) * 127.5) clamped to 0..255; NaN -> 0. */
uint8_t tz_png_byte(float v);

/* Writes the grid to path (path.tmp, fsync, rename): ncols images per row (ncols <= 0:
 * ceil(sqrt(n))), pad pixels of black between and around images. 0, or non-zero with a
 * message naming the file (unsupported channel count, libpng or file errors). */
int tz_png_write_grid(const char *path, const float *img, int64_t n, int64_t C, int64_t H,
                      int64_t W, int64_t ncols, int64_t pad, char *err, size_t errlen);

/* The same grid with every pixel (pads included) enlarged to scale x scale (nearest
 * neighbour), scale >= 1, so that small images can be looked at. */
int tz_png_write_grid_scaled(const char *path, const float *img, int64_t n, int64_t C, int64_t H,
                             int64_t W, int64_t ncols, int64_t pad, int64_t scale, char *err,
                             size_t errlen);

/* w x h RGB pixels (3 bytes each, row by row) to path, atomically. 0, or non-zero with a
 * message naming the file. */
int tz_png_write_rgb(const char *path, const uint8_t *rgb, int64_t w, int64_t h, char *err,
                     size_t errlen);

#endif
