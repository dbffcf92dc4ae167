/* Image grids (optionally enlarged) and RGB pictures to PNG through libpng's simplified API
 * (png_image_write_to_memory, so no setjmp), then one atomic file write. 8-bit gray, RGB. */
#include "io/png.h"

#include <math.h>
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/atomic_file.h"

uint8_t tz_png_byte(float v) {
    if (!(v > -1.0f)) return 0; /* also NaN */
    if (v >= 1.0f) return 255;
    return (uint8_t)lrintf((v + 1.0f) * 127.5f);
}

/* Encodes w x h pixels of C channels (1 gray, 3 RGB) and writes them atomically to path. */
static int write_pixels(const char *path, const uint8_t *px, int64_t w, int64_t h, int64_t C,
                        char *err, size_t errlen) {
    png_image im;
    memset(&im, 0, sizeof im);
    im.version = PNG_IMAGE_VERSION;
    im.width = (png_uint_32)w;
    im.height = (png_uint_32)h;
    im.format = C == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
    png_alloc_size_t bytes = 0;
    int rc = 1;
    if (!png_image_write_to_memory(&im, NULL, &bytes, 0, px, 0, NULL)) {
        snprintf(err, errlen, "%s: libpng: %s", path, im.message);
        png_image_free(&im);
        return 1;
    }
    void *mem = tz_xmalloc(bytes);
    if (!png_image_write_to_memory(&im, mem, &bytes, 0, px, 0, NULL)) {
        snprintf(err, errlen, "%s: libpng: %s", path, im.message);
    } else {
        tz_atomic_file f;
        rc = tz_atomic_file_open(&f, path, err, errlen);
        if (!rc) rc = tz_atomic_file_write(&f, mem, bytes, err, errlen);
        if (!rc) rc = tz_atomic_file_commit(&f, err, errlen);
        else tz_atomic_file_abort(&f);
    }
    png_image_free(&im);
    free(mem);
    return rc;
}

int tz_png_write_rgb(const char *path, const uint8_t *rgb, int64_t w, int64_t h, char *err,
                     size_t errlen) {
    if (w <= 0 || h <= 0 || w > (1 << 20) || h > (1 << 20)) {
        snprintf(err, errlen, "%s: %lldx%lld pixels: not an image size", path, (long long)w,
                 (long long)h);
        return 1;
    }
    return write_pixels(path, rgb, w, h, 3, err, errlen);
}

int tz_png_write_grid(const char *path, const float *img, int64_t n, int64_t C, int64_t H,
                      int64_t W, int64_t ncols, int64_t pad, char *err, size_t errlen) {
    return tz_png_write_grid_scaled(path, img, n, C, H, W, ncols, pad, 1, err, errlen);
}

int tz_png_write_grid_scaled(const char *path, const float *img, int64_t n, int64_t C, int64_t H,
                             int64_t W, int64_t ncols, int64_t pad, int64_t scale, char *err,
                             size_t errlen) {
    if (C != 1 && C != 3) {
        snprintf(err, errlen, "%s: %lld channels: a PNG grid takes 1 (grayscale) or 3 (RGB); "
                 "decode latents to pixels first", path, (long long)C);
        return 1;
    }
    if (n <= 0 || H <= 0 || W <= 0 || pad < 0 || scale < 1) {
        snprintf(err, errlen, "%s: nothing to write (%lld images of %lldx%lld, scale %lld)", path,
                 (long long)n, (long long)H, (long long)W, (long long)scale);
        return 1;
    }
    if (ncols <= 0) {
        ncols = (int64_t)ceil(sqrt((double)n));
        while (ncols * ncols < n) ncols++;
    }
    if (ncols > n) ncols = n;
    const int64_t nrows = (n + ncols - 1) / ncols;
    const int64_t gw = ncols * (W + pad) + pad, gh = nrows * (H + pad) + pad;
    if (gw * scale > (1 << 20) || gh * scale > (1 << 20)) {
        snprintf(err, errlen, "%s: grid of %lldx%lld pixels is too large", path,
                 (long long)(gw * scale), (long long)(gh * scale));
        return 1;
    }
    uint8_t *px = calloc((size_t)(gw * gh * C), 1);
    if (!px) TZ_FATAL("out of memory for a %lldx%lld image", (long long)gw, (long long)gh);
    for (int64_t k = 0; k < n; k++) {
        int64_t x0 = pad + (k % ncols) * (W + pad), y0 = pad + (k / ncols) * (H + pad);
        for (int64_t c = 0; c < C; c++)
            for (int64_t y = 0; y < H; y++)
                for (int64_t x = 0; x < W; x++)
                    px[((y0 + y) * gw + x0 + x) * C + c] =
                        tz_png_byte(img[((k * C + c) * H + y) * W + x]);
    }
    if (scale > 1) { /* nearest neighbour: every pixel becomes scale x scale */
        const int64_t sw = gw * scale, sh = gh * scale;
        uint8_t *big = calloc((size_t)(sw * sh * C), 1);
        if (!big) TZ_FATAL("out of memory for a %lldx%lld image", (long long)sw, (long long)sh);
        for (int64_t y = 0; y < sh; y++)
            for (int64_t x = 0; x < sw; x++)
                memcpy(big + (y * sw + x) * C, px + ((y / scale) * gw + x / scale) * C, (size_t)C);
        free(px);
        px = big;
        int rc = write_pixels(path, px, sw, sh, C, err, errlen);
        free(px);
        return rc;
    }
    int rc = write_pixels(path, px, gw, gh, C, err, errlen);
    free(px);
    return rc;
}
