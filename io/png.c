/* Image grids to PNG through libpng's simplified API (png_image_write_to_memory, so no
 * setjmp), then one atomic file write. Only 8-bit grayscale and RGB. */
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

int tz_png_write_grid(const char *path, const float *img, int64_t n, int64_t C, int64_t H,
                      int64_t W, int64_t ncols, int64_t pad, char *err, size_t errlen) {
    if (C != 1 && C != 3) {
        snprintf(err, errlen, "%s: %lld channels: a PNG grid takes 1 (grayscale) or 3 (RGB); "
                 "decode latents to pixels first", path, (long long)C);
        return 1;
    }
    if (n <= 0 || H <= 0 || W <= 0 || pad < 0) {
        snprintf(err, errlen, "%s: nothing to write (%lld images of %lldx%lld)", path,
                 (long long)n, (long long)H, (long long)W);
        return 1;
    }
    if (ncols <= 0) {
        ncols = (int64_t)ceil(sqrt((double)n));
        while (ncols * ncols < n) ncols++;
    }
    if (ncols > n) ncols = n;
    const int64_t nrows = (n + ncols - 1) / ncols;
    const int64_t gw = ncols * (W + pad) + pad, gh = nrows * (H + pad) + pad;
    if (gw > (1 << 20) || gh > (1 << 20)) {
        snprintf(err, errlen, "%s: grid of %lldx%lld pixels is too large", path, (long long)gw,
                 (long long)gh);
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
    png_image im;
    memset(&im, 0, sizeof im);
    im.version = PNG_IMAGE_VERSION;
    im.width = (png_uint_32)gw;
    im.height = (png_uint_32)gh;
    im.format = C == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
    png_alloc_size_t bytes = 0;
    int rc = 1;
    if (!png_image_write_to_memory(&im, NULL, &bytes, 0, px, 0, NULL)) {
        snprintf(err, errlen, "%s: libpng: %s", path, im.message);
        png_image_free(&im);
        free(px);
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
    free(px);
    return rc;
}
