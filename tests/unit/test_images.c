/* Image data in and out: IDX readers (gzip and plain; malformed files rejected with the file
 * named), the HDF5 image-set layout (round trip, uint8, scale, malformed files), and PNG
 * grids read back with libpng. Fashion-MNIST itself is read when the Debian package is there. */
#include <hdf5.h>
#include <png.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "io/idx.h"
#include "io/images_h5.h"
#include "io/png.h"
#include "tz_check.h"

static char g_dir[256];

static const char *tmp(const char *name) {
    static char buf[8][512];
    static int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
    return buf[k];
}

static void be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

/* Writes bytes to path, gzip-compressed when gz. */
static void write_bytes(const char *path, const uint8_t *b, size_t n, int gz) {
    if (gz) {
        gzFile f = gzopen(path, "wb");
        gzwrite(f, b, (unsigned)n);
        gzclose(f);
    } else {
        FILE *f = fopen(path, "wb");
        fwrite(b, 1, n, f);
        fclose(f);
    }
}

/* An IDX image file: magic, n, rows, cols in the header; `data` bytes of pixels follow. */
static void write_idx_images(const char *path, uint32_t magic, uint32_t n, uint32_t r,
                             uint32_t c, size_t data, int gz) {
    uint8_t *b = calloc(16 + data, 1);
    be32(b, magic), be32(b + 4, n), be32(b + 8, r), be32(b + 12, c);
    for (size_t i = 0; i < data; i++) b[16 + i] = (uint8_t)(i * 37 % 256);
    if (data) b[16] = 0, b[16 + data - 1] = 255;
    write_bytes(path, b, 16 + data, gz);
    free(b);
}

static void write_idx_labels(const char *path, uint32_t n, const uint8_t *lab, int gz) {
    uint8_t *b = calloc(8 + n, 1);
    be32(b, TZ_IDX_LABELS_MAGIC), be32(b + 4, n);
    memcpy(b + 8, lab, n);
    write_bytes(path, b, 8 + n, gz);
    free(b);
}

/* Expects tz_idx_load to fail with a message naming `blame` and containing `word`. */
static void idx_rejects(const char *what, const char *img, const char *lab, int64_t nc,
                        const char *blame, const char *word) {
    tz_image_set s;
    char err[1024] = "";
    int rc = tz_idx_load(&s, img, lab, nc, err, sizeof err);
    check(rc != 0 && strstr(err, blame) && strstr(err, word), "idx rejects %s: %s", what, err);
}

static void test_idx(void) {
    const uint8_t lab[3] = {0, 2, 1};
    for (int gz = 1; gz >= 0; gz--) {
        const char *img = tmp(gz ? "img.gz" : "img"), *lb = tmp(gz ? "lab.gz" : "lab");
        write_idx_images(img, TZ_IDX_IMAGES_MAGIC, 3, 4, 5, 60, gz);
        write_idx_labels(lb, 3, lab, gz);
        tz_image_set s;
        char err[1024] = "";
        int rc = tz_idx_load(&s, img, lb, 3, err, sizeof err);
        check(rc == 0 && s.n == 3 && s.C == 1 && s.H == 4 && s.W == 5 && s.num_classes == 3,
              "idx %s: 3 images 4x5, 3 classes %s", gz ? "gzip" : "plain", err);
        if (rc) continue;
        check(s.x[0] == -1.0f && s.x[59] == 1.0f && s.x[1] == 37.0f / 127.5f - 1.0f &&
                  s.y[1] == 2,
              "idx pixels map to [-1, 1] (0 -> -1, 255 -> 1) and labels are kept");
        tz_image_set_free(&s);
    }
    const char *lb = tmp("lab"), *img = tmp("bad.gz");
    write_idx_images(img, TZ_IDX_LABELS_MAGIC, 3, 4, 5, 60, 1);
    idx_rejects("wrong magic", img, lb, 3, img, "magic");
    write_idx_images(img, 0x12345678u, 3, 4, 5, 60, 1);
    idx_rejects("garbage magic", img, lb, 3, img, "magic");
    write_idx_images(img, TZ_IDX_IMAGES_MAGIC, 3, 4, 5, 59, 1);
    idx_rejects("truncated data", img, lb, 3, img, "truncated");
    write_idx_images(img, TZ_IDX_IMAGES_MAGIC, 3, 4, 5, 61, 1);
    idx_rejects("trailing bytes", img, lb, 3, img, "trailing");
    write_idx_images(img, TZ_IDX_IMAGES_MAGIC, 3, 5, 5, 60, 1);
    idx_rejects("dims vs length", img, lb, 3, img, "header says");
    write_idx_images(img, TZ_IDX_IMAGES_MAGIC, 3, 0, 5, 0, 1);
    idx_rejects("a zero dimension", img, lb, 3, img, "is 0");
    write_bytes(img, (const uint8_t *)"\0\0\x08", 3, 1);
    idx_rejects("a file shorter than the header", img, lb, 3, img, "shorter");
    idx_rejects("a missing file", tmp("nothere.gz"), lb, 3, "nothere.gz", "cannot open");
    write_idx_images(img, TZ_IDX_IMAGES_MAGIC, 3, 4, 5, 60, 1);
    { /* a gzip stream cut short */
        FILE *f = fopen(img, "rb");
        uint8_t buf[4096];
        size_t n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        write_bytes(tmp("cut.gz"), buf, n - 12, 0);
        idx_rejects("a truncated gzip stream", tmp("cut.gz"), lb, 3, "cut.gz", "gzip");
    }
    const uint8_t lab2[2] = {0, 1}, lab3[3] = {0, 5, 1};
    write_idx_labels(tmp("lab2"), 2, lab2, 0);
    idx_rejects("a label count mismatch", img, tmp("lab2"), 3, "lab2", "2 labels");
    write_idx_labels(tmp("lab3"), 3, lab3, 0);
    idx_rejects("a label out of range", img, tmp("lab3"), 3, "lab3", "num_classes");
    idx_rejects("an image file as labels", img, img, 3, img, "image file");
}

static void test_fashion_mnist(void) {
    const char *img = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz";
    const char *lab = "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz";
    if (access(img, R_OK) != 0) {
        printf("note: %s absent (apt-get install dataset-fashion-mnist): not read\n", img);
        return;
    }
    tz_image_set s;
    char err[1024] = "";
    int rc = tz_idx_load(&s, img, lab, 10, err, sizeof err);
    check(rc == 0 && s.n == 10000 && s.H == 28 && s.W == 28 && s.num_classes == 10,
          "Fashion-MNIST t10k: 10000 images 28x28, 10 classes %s", err);
    if (!rc) tz_image_set_free(&s);
}

/* ---- HDF5 ---- */

/* A file with "images" of the given type and dims and "labels" of the given type and n. */
static void write_h5(const char *path, hid_t itype, int irank, const hsize_t *idims,
                     hid_t ltype, hsize_t nl, const int64_t *labels, int with_labels) {
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hid_t s = H5Screate_simple(irank, idims, NULL);
    hid_t d = H5Dcreate2(f, "images", itype, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hsize_t n = 1;
    for (int i = 0; i < irank; i++) n *= idims[i];
    double *v = calloc(n, sizeof *v);
    for (hsize_t i = 0; i < n; i++) v[i] = (double)(i % 256);
    H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
    free(v);
    H5Dclose(d), H5Sclose(s);
    if (with_labels) {
        s = H5Screate_simple(1, &nl, NULL);
        d = H5Dcreate2(f, "labels", ltype, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        H5Dwrite(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, labels);
        H5Dclose(d), H5Sclose(s);
    }
    H5Fclose(f);
}

static void h5_rejects(const char *what, const char *path, int64_t nc, const char *word) {
    tz_image_set s;
    char err[1024] = "";
    int rc = tz_h5_images_read(&s, path, nc, err, sizeof err);
    check(rc != 0 && strstr(err, path) && strstr(err, word), "hdf5 rejects %s: %s", what, err);
}

static void test_h5(void) {
    tz_image_set w = {.n = 3, .C = 2, .H = 2, .W = 3, .num_classes = 4};
    w.x = malloc(36 * sizeof(float));
    w.y = malloc(3 * sizeof(int32_t));
    for (int i = 0; i < 36; i++) w.x[i] = 0.25f * (float)i - 3.0f;
    w.y[0] = 3, w.y[1] = 0, w.y[2] = 2;
    char p[512]; /* tmp() reuses its buffers */
    snprintf(p, sizeof p, "%s", tmp("set.h5"));
    char err[1024] = "";
    tz_image_set r;
    write_bytes(tmp("victim"), (const uint8_t *)"keep", 4, 0); /* a planted link is not followed */
    check(symlink(tmp("victim"), tmp("set.h5.tmp")) == 0, "plant set.h5.tmp -> victim");
    int rc = tz_h5_images_write(p, &w, 0.5, err, sizeof err);
    FILE *vf = fopen(tmp("victim"), "rb");
    char vb[8] = "";
    size_t vn = vf ? fread(vb, 1, sizeof vb, vf) : 0;
    if (vf) fclose(vf);
    check(vn == 4 && !memcmp(vb, "keep", 4), "hdf5 writer leaves the target of a planted .tmp link alone");
    if (!rc) rc = tz_h5_images_read(&r, p, 4, err, sizeof err);
    check(rc == 0 && r.n == 3 && r.C == 2 && r.H == 2 && r.W == 3 && r.num_classes == 4,
          "hdf5 round trip: [3, 2, 2, 3], 4 classes %s", err);
    if (!rc) {
        int same = !memcmp(r.y, w.y, 3 * sizeof(int32_t));
        for (int i = 0; i < 36; i++) same &= r.x[i] == 0.5f * w.x[i];
        check(same, "hdf5 round trip: labels equal, latents multiplied by the scale attribute");
        tz_image_set_free(&r);
    }
    unlink(tmp("set.h5.tmp"));
    const int64_t lab[3] = {1, 0, 2}, badlab[3] = {1, 7, 2};
    hsize_t d4[4] = {3, 1, 4, 4}, d3[3] = {3, 4, 4};
    write_h5(tmp("u8.h5"), H5T_STD_U8LE, 4, d4, H5T_STD_I64LE, 3, lab, 1);
    rc = tz_h5_images_read(&r, tmp("u8.h5"), 0, err, sizeof err);
    check(rc == 0 && r.num_classes == 3 && r.x[0] == -1.0f && r.x[1] == 1.0f / 127.5f - 1.0f,
          "hdf5 uint8 images map to [-1, 1]; num_classes from the labels %s", rc ? err : "");
    if (!rc) tz_image_set_free(&r);
    write_h5(tmp("rank.h5"), H5T_IEEE_F32LE, 3, d3, H5T_STD_I32LE, 3, lab, 1);
    h5_rejects("images of rank 3", tmp("rank.h5"), 0, "rank 3");
    write_h5(tmp("count.h5"), H5T_IEEE_F32LE, 4, d4, H5T_STD_I32LE, 2, lab, 1);
    h5_rejects("mismatched N", tmp("count.h5"), 0, "3 images but 2 labels");
    write_h5(tmp("f64.h5"), H5T_IEEE_F64LE, 4, d4, H5T_STD_I32LE, 3, lab, 1);
    h5_rejects("float64 images", tmp("f64.h5"), 0, "float32 or uint8");
    write_h5(tmp("flab.h5"), H5T_IEEE_F32LE, 4, d4, H5T_IEEE_F32LE, 3, lab, 1);
    h5_rejects("float labels", tmp("flab.h5"), 0, "int32 or int64");
    write_h5(tmp("nolab.h5"), H5T_IEEE_F32LE, 4, d4, H5T_STD_I32LE, 3, lab, 0);
    h5_rejects("a missing labels dataset", tmp("nolab.h5"), 0, "no dataset \"labels\"");
    write_h5(tmp("range.h5"), H5T_IEEE_F32LE, 4, d4, H5T_STD_I32LE, 3, badlab, 1);
    h5_rejects("a label out of range", tmp("range.h5"), 5, "label 7");
    h5_rejects("num_classes disagreeing with the model", p, 10, "num_classes is 4");
    write_bytes(tmp("plain.h5"), (const uint8_t *)"not hdf5 at all", 15, 0);
    h5_rejects("a file that is not HDF5", tmp("plain.h5"), 0, "not an HDF5 file");
    h5_rejects("a missing file", tmp("none.h5"), 0, "cannot open");
    free(w.x), free(w.y);
}

/* ---- PNG ---- */

static void test_png(void) {
    /* 5 gray 3x4 images, image k filled with -1 + 0.5 k: 3 columns, pad 1 -> 16 x 9 */
    float g[5 * 12];
    for (int k = 0; k < 5; k++)
        for (int i = 0; i < 12; i++) g[k * 12 + i] = -1.0f + 0.5f * (float)k;
    const char *p = tmp("grid.png");
    char err[1024] = "";
    int rc = tz_png_write_grid(p, g, 5, 1, 3, 4, 0, 1, err, sizeof err);
    png_image im;
    memset(&im, 0, sizeof im);
    im.version = PNG_IMAGE_VERSION;
    rc = rc || !png_image_begin_read_from_file(&im, p);
    check(rc == 0 && im.width == 16 && im.height == 9, "png gray grid: 16x9 for 5 images of 3x4");
    if (!rc) {
        im.format = PNG_FORMAT_GRAY;
        uint8_t px[16 * 9];
        rc = !png_image_finish_read(&im, NULL, px, 0, NULL);
        /* image 0 at (1,1), image 1 at (6,1), image 4 at (6,5); padding (0,0) black */
        check(!rc && px[1 * 16 + 1] == 0 && px[1 * 16 + 6] == 64 && px[1 * 16 + 11] == 128 &&
                  px[5 * 16 + 1] == 191 && px[5 * 16 + 6] == 255 && px[0] == 0 && px[5 * 16 + 11] == 0,
              "png gray pixels: -1 -> 0, -0.5 -> 64, 0 -> 128, 0.5 -> 191, 1 -> 255, pad 0");
    }
    png_image_free(&im);
    float rgb[2 * 3 * 2 * 2];
    for (int i = 0; i < 24; i++) rgb[i] = (i / 4) % 3 == 0 ? 1.0f : -1.0f; /* red images */
    rgb[12 + 4] = 2.0f;                                                     /* clamped */
    p = tmp("rgb.png");
    rc = tz_png_write_grid(p, rgb, 2, 3, 2, 2, 2, 0, err, sizeof err);
    memset(&im, 0, sizeof im);
    im.version = PNG_IMAGE_VERSION;
    rc = rc || !png_image_begin_read_from_file(&im, p);
    if (!rc) {
        im.format = PNG_FORMAT_RGB;
        uint8_t px[4 * 2 * 3];
        rc = !png_image_finish_read(&im, NULL, px, 0, NULL);
        check(!rc && im.width == 4 && im.height == 2 && px[0] == 255 && px[1] == 0 &&
                  px[2] == 0 && px[2 * 3 + 1] == 255,
              "png RGB grid: 4x2, red pixels, out-of-range values clamped");
    } else {
        check(0, "png RGB grid written and read: %s", err);
    }
    png_image_free(&im);
    rc = tz_png_write_grid(tmp("four.png"), rgb, 1, 4, 1, 1, 0, 0, err, sizeof err);
    check(rc != 0 && strstr(err, "four.png") && strstr(err, "4 channels"),
          "png rejects 4 channels: %s", err);
    check(access(tmp("grid.png.tmp"), F_OK) != 0, "png writer leaves no .tmp file");
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "%s/tz_images_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(g_dir)) return 1;
    test_idx();
    test_fashion_mnist();
    test_h5();
    test_png();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) printf("note: could not remove %s\n", g_dir);
    return tz_check_done("images");
}
