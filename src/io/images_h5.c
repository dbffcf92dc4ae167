/* HDF5 image sets through the C API: every object, rank, dtype and count checked before any
 * read, with HDF5's own error printing silenced and its stack turned into one message. */
#include "io/images_h5.h"

#include <errno.h>
#include <hdf5.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "io/h5_write.h"
#include "io/fsutil.h"

typedef struct {
    const char *path;
    char *err;
    size_t errlen;
} h5ctx;

static int fail(h5ctx *c, const char *fmt, ...) TZ_PRINTF(2, 3);
static int fail(h5ctx *c, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(c->err, c->errlen, "%s: %s", c->path, msg);
    return 1;
}

/* A root attribute as a double: 0 absent, 1 read, -1 error (bad type). */
static int attr_num(h5ctx *c, hid_t f, const char *name, double *out, int want_int) {
    if (H5Aexists(f, name) <= 0) return 0;
    hid_t a = H5Aopen(f, name, H5P_DEFAULT);
    hid_t t = H5Aget_type(a), s = H5Aget_space(a);
    H5T_class_t cl = H5Tget_class(t);
    int ok = a >= 0 && H5Sget_simple_extent_npoints(s) == 1 &&
             (cl == H5T_INTEGER || (!want_int && cl == H5T_FLOAT));
    if (ok) ok = H5Aread(a, H5T_NATIVE_DOUBLE, out) >= 0;
    H5Sclose(s), H5Tclose(t), H5Aclose(a);
    if (!ok) {
        fail(c, "attribute \"%s\": expected one %s value", name, want_int ? "integer" : "number");
        return -1;
    }
    return 1;
}

/* Opens dataset name of rank `rank`, dims into d. Returns the id or -1 (err set). */
static hid_t open_ds(h5ctx *c, hid_t f, const char *name, int rank, hsize_t *d) {
    if (H5Lexists(f, name, H5P_DEFAULT) <= 0) {
        fail(c, "no dataset \"%s\" (expected \"images\" [N, C, H, W] and \"labels\" [N])", name);
        return -1;
    }
    hid_t ds = H5Dopen2(f, name, H5P_DEFAULT);
    if (ds < 0) {
        fail(c, "\"%s\" is not a dataset", name);
        return -1;
    }
    hid_t s = H5Dget_space(ds);
    int r = H5Sget_simple_extent_ndims(s);
    if (r == rank) H5Sget_simple_extent_dims(s, d, NULL);
    H5Sclose(s);
    if (r != rank) {
        fail(c, "dataset \"%s\" has rank %d, expected %d", name, r, rank);
        H5Dclose(ds);
        return -1;
    }
    return ds;
}

static int read_file(h5ctx *c, hid_t f, tz_image_set *s, int64_t num_classes) {
    hsize_t di[4], dl[1];
    hid_t im = open_ds(c, f, "images", 4, di);
    if (im < 0) return 1;
    hid_t lb = open_ds(c, f, "labels", 1, dl);
    if (lb < 0) return H5Dclose(im), 1;
    int rc = 1;
    hid_t ti = H5Dget_type(im), tl = H5Dget_type(lb);
    H5T_class_t ci = H5Tget_class(ti), cl = H5Tget_class(tl);
    size_t si = H5Tget_size(ti), sl = H5Tget_size(tl);
    int is_u8 = ci == H5T_INTEGER && si == 1 && H5Tget_sign(ti) == H5T_SGN_NONE;
    double file_nc = 0, scale = 1.0;
    int has_nc = 0, has_scale = 0;
    if (!(is_u8 || (ci == H5T_FLOAT && si == 4))) {
        fail(c, "dataset \"images\" has %s of %lld bytes, expected float32 or uint8",
             ci == H5T_FLOAT ? "floats" : ci == H5T_INTEGER ? "integers" : "elements",
             (long long)si);
    } else if (!(cl == H5T_INTEGER && (sl == 4 || sl == 8))) {
        fail(c, "dataset \"labels\" has %s of %lld bytes, expected int32 or int64",
             cl == H5T_FLOAT ? "floats" : cl == H5T_INTEGER ? "integers" : "elements",
             (long long)sl);
    } else if (di[0] != dl[0]) {
        fail(c, "%lld images but %lld labels", (long long)di[0], (long long)dl[0]);
    } else if (di[0] == 0 || di[1] == 0 || di[2] == 0 || di[3] == 0) {
        fail(c, "dataset \"images\" has an empty dimension");
    } else if ((has_nc = attr_num(c, f, "num_classes", &file_nc, 1)) < 0 ||
               (has_scale = attr_num(c, f, "scale", &scale, 0)) < 0) {
        /* err set */
    } else if (has_nc && (file_nc < 1 || (num_classes > 0 && (int64_t)file_nc != num_classes))) {
        fail(c, "attribute num_classes is %lld, expected %s%lld", (long long)file_nc,
             num_classes > 0 ? "the model's " : "at least ", (long long)(num_classes > 0 ? num_classes : 1));
    } else {
        int64_t n = (int64_t)di[0], numel = (int64_t)(di[1] * di[2] * di[3]);
        int64_t *lab = tz_xmalloc((size_t)n * sizeof *lab);
        float *x = tz_xmalloc((size_t)(n * numel) * sizeof *x);
        int ok = H5Dread(lb, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, lab) >= 0;
        if (ok && is_u8) {
            uint8_t *px = tz_xmalloc((size_t)(n * numel));
            ok = H5Dread(im, H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, px) >= 0;
            for (int64_t i = 0; ok && i < n * numel; i++) x[i] = (float)px[i] / 127.5f - 1.0f;
            free(px);
        } else if (ok) {
            ok = H5Dread(im, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, x) >= 0;
            if (ok && has_scale)
                for (int64_t i = 0; i < n * numel; i++) x[i] = (float)((double)x[i] * scale);
        }
        int64_t nc = num_classes > 0 ? num_classes : has_nc ? (int64_t)file_nc : 0, maxl = -1;
        if (!ok) fail(c, "reading the datasets failed (corrupt file?)");
        for (int64_t i = 0; ok && i < n; i++) {
            if (lab[i] > maxl) maxl = lab[i];
            if (lab[i] < 0 || (nc > 0 && lab[i] >= nc)) {
                if (nc > 0)
                    fail(c, "label %lld of item %lld is outside [0, %lld)", (long long)lab[i],
                         (long long)i, (long long)nc);
                else fail(c, "label %lld of item %lld is negative", (long long)lab[i], (long long)i);
                ok = 0;
            }
        }
        if (ok) {
            s->n = n, s->C = (int64_t)di[1], s->H = (int64_t)di[2], s->W = (int64_t)di[3];
            s->num_classes = nc > 0 ? nc : maxl + 1;
            s->x = x;
            s->y = tz_xmalloc((size_t)n * sizeof *s->y);
            for (int64_t i = 0; i < n; i++) s->y[i] = (int32_t)lab[i];
            x = NULL;
            rc = 0;
        }
        free(x);
        free(lab);
    }
    H5Tclose(ti), H5Tclose(tl), H5Dclose(im), H5Dclose(lb);
    return rc;
}

int tz_h5_images_read(tz_image_set *s, const char *path, int64_t num_classes, char *err,
                      size_t errlen) {
    memset(s, 0, sizeof *s);
    h5ctx c = {path, err, errlen};
    H5E_auto2_t fn;
    void *data;
    H5Eget_auto2(H5E_DEFAULT, &fn, &data);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    int rc = 1;
    const int odd = tz_check_regular(path, err, errlen); /* a FIFO would block the open */
    FILE *fp = odd ? NULL : fopen(path, "rb");
    if (odd) {
    } else if (!fp) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    } else if (fclose(fp), H5Fis_hdf5(path) <= 0) {
        snprintf(err, errlen, "%s: not an HDF5 file", path);
    } else {
        hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
        if (f < 0) snprintf(err, errlen, "%s: cannot open as HDF5", path);
        else rc = read_file(&c, f, s, num_classes), H5Fclose(f);
    }
    H5Eset_auto2(H5E_DEFAULT, fn, data);
    return rc;
}

int tz_h5_images_write(const char *path, const tz_image_set *s, double scale, char *err,
                       size_t errlen) {
    char *tmp;
    hid_t f = tz_h5_create_temp(path, &tmp, err, errlen);
    if (f < 0) return 1;
    hsize_t di[4] = {(hsize_t)s->n, (hsize_t)s->C, (hsize_t)s->H, (hsize_t)s->W}, dl = (hsize_t)s->n;
    hsize_t one = 1;
    hid_t si = H5Screate_simple(4, di, NULL), sl = H5Screate_simple(1, &dl, NULL);
    hid_t sa = H5Screate_simple(1, &one, NULL);
    hid_t im = H5Dcreate2(f, "images", H5T_IEEE_F32LE, si, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hid_t lb = H5Dcreate2(f, "labels", H5T_STD_I32LE, sl, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    int ok = im >= 0 && lb >= 0 &&
             H5Dwrite(im, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, s->x) >= 0 &&
             H5Dwrite(lb, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, s->y) >= 0;
    long long nc = s->num_classes;
    hid_t a = H5Acreate2(f, "num_classes", H5T_STD_I64LE, sa, H5P_DEFAULT, H5P_DEFAULT);
    ok = ok && a >= 0 && H5Awrite(a, H5T_NATIVE_LLONG, &nc) >= 0;
    H5Aclose(a);
    if (scale > 0) {
        a = H5Acreate2(f, "scale", H5T_IEEE_F64LE, sa, H5P_DEFAULT, H5P_DEFAULT);
        ok = ok && a >= 0 && H5Awrite(a, H5T_NATIVE_DOUBLE, &scale) >= 0;
        H5Aclose(a);
    }
    H5Dclose(im), H5Dclose(lb), H5Sclose(si), H5Sclose(sl), H5Sclose(sa);
    return tz_h5_commit(f, tmp, path, ok, err, errlen);
}
