/* Cached latents in HDF5 through the C API: every dataset's rank, class, size and shape
 * checked at open, rows read by hyperslab, HDF5's own error printing silenced. */
#include "io/latents_h5.h"

#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/fsutil.h"
#include "io/h5_write.h"

static const char *const k_layout = "expected \"latents\" [N, Ti, C], \"txt\" [N, Tt, J], "
                                    "\"pooled\" [N, P], \"img_ids\" [Ti, 3] and \"txt_ids\" "
                                    "[Tt, 3], all float32";

/* The largest Ti, C, Tt, J and P (config.json's sizes are bounded alike, io/flux_config.c). */
static const hsize_t k_max = (hsize_t)1 << 24;
/* The most values of one sample's latents or text embeddings (1 GiB of float32; Flux at
 * 1024 x 1024: 4,096 x 64 and 512 x 4,096). */
static const hsize_t k_row = (hsize_t)1 << 28;

/* Dataset name, float32 of rank `rank`, dims into d; -1 with err. */
static hid_t open_f32(hid_t f, const char *path, const char *name, int rank, hsize_t *d,
                      char *err, size_t errlen) {
    if (H5Lexists(f, name, H5P_DEFAULT) <= 0) {
        tz_errf(err, errlen, "%s: no dataset \"%s\" (%s)", path, name, k_layout);
        return -1;
    }
    hid_t ds = H5Dopen2(f, name, H5P_DEFAULT);
    if (ds < 0) {
        tz_errf(err, errlen, "%s: \"%s\" is not a dataset (%s)", path, name, k_layout);
        return -1;
    }
    hid_t s = H5Dget_space(ds), t = H5Dget_type(ds);
    const int r = H5Sget_simple_extent_ndims(s);
    const int f32 = H5Tget_class(t) == H5T_FLOAT && H5Tget_size(t) == 4;
    if (r == rank) H5Sget_simple_extent_dims(s, d, NULL);
    H5Sclose(s), H5Tclose(t);
    if (r != rank || !f32) {
        tz_errf(err, errlen, "%s: dataset \"%s\" is %s of rank %d, expected float32 of rank %d "
                "(%s)", path, name, f32 ? "float32" : "not float32", r, rank, k_layout);
        H5Dclose(ds);
        return -1;
    }
    return ds;
}

int tz_latents_open(tz_latents *l, const char *path, char *err, size_t errlen) {
    memset(l, 0, sizeof *l);
    l->f = l->ds[0] = l->ds[1] = l->ds[2] = -1;
    snprintf(l->path, sizeof l->path, "%s", path);
    if (tz_check_regular(path, err, errlen)) return 1;
    H5E_auto2_t fn;
    void *data;
    H5Eget_auto2(H5E_DEFAULT, &fn, &data);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    int rc = 0;
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    hsize_t dl[3], dt[3], dp[2], di[2], dc[2];
    hid_t ids[2] = {-1, -1};
    if (f < 0) {
        rc = tz_errf(err, errlen, "%s: not an HDF5 file (%s)", path, k_layout);
        goto out;
    }
    l->f = f;
    if ((l->ds[0] = open_f32(f, path, "latents", 3, dl, err, errlen)) < 0 ||
        (l->ds[1] = open_f32(f, path, "txt", 3, dt, err, errlen)) < 0 ||
        (l->ds[2] = open_f32(f, path, "pooled", 2, dp, err, errlen)) < 0 ||
        (ids[0] = open_f32(f, path, "img_ids", 2, di, err, errlen)) < 0 ||
        (ids[1] = open_f32(f, path, "txt_ids", 2, dc, err, errlen)) < 0) {
        rc = 1;
        goto out;
    }
    if (dl[0] == 0 || dt[0] != dl[0] || dp[0] != dl[0]) {
        rc = tz_errf(err, errlen, "%s: %lld latents, %lld txt and %lld pooled rows: expected the "
                     "same number, at least 1", path, (long long)dl[0], (long long)dt[0],
                     (long long)dp[0]);
    } else if (di[0] != dl[1] || di[1] != 3 || dc[0] != dt[1] || dc[1] != 3) {
        rc = tz_errf(err, errlen, "%s: img_ids is [%lld, %lld] and txt_ids [%lld, %lld]: expected "
                     "[Ti, 3] = [%lld, 3] and [Tt, 3] = [%lld, 3]", path, (long long)di[0],
                     (long long)di[1], (long long)dc[0], (long long)dc[1], (long long)dl[1],
                     (long long)dt[1]);
    } else if (dl[1] == 0 || dl[2] == 0 || dt[1] == 0 || dt[2] == 0 || dp[1] == 0) {
        rc = tz_errf(err, errlen, "%s: a dataset has an empty dimension", path);
    } else if (dl[1] > k_max || dl[2] > k_max || dt[1] > k_max || dt[2] > k_max || dp[1] > k_max ||
               dl[0] > (hsize_t)INT64_MAX) {
        /* the sizes bound what is allocated here (the ids) and by the caller (a row) */
        rc = tz_errf(err, errlen, "%s: latents [%llu, %llu, %llu], txt [., %llu, %llu], pooled "
                     "[., %llu]: expected Ti, C, Tt, J and P at most %llu", path,
                     (unsigned long long)dl[0], (unsigned long long)dl[1],
                     (unsigned long long)dl[2], (unsigned long long)dt[1],
                     (unsigned long long)dt[2], (unsigned long long)dp[1],
                     (unsigned long long)k_max);
    } else if (dl[1] * dl[2] > k_row || dt[1] * dt[2] > k_row) {
        rc = tz_errf(err, errlen, "%s: a sample of %llu x %llu latent and %llu x %llu text values: "
                     "expected at most %llu of each (one sample is read into memory at a time)",
                     path, (unsigned long long)dl[1], (unsigned long long)dl[2],
                     (unsigned long long)dt[1], (unsigned long long)dt[2],
                     (unsigned long long)k_row);
    } else {
        l->n = (int64_t)dl[0], l->Ti = (int64_t)dl[1], l->C = (int64_t)dl[2];
        l->Tt = (int64_t)dt[1], l->J = (int64_t)dt[2], l->P = (int64_t)dp[1];
        l->img_ids = tz_xmalloc((size_t)(l->Ti * 3) * sizeof(float));
        l->txt_ids = tz_xmalloc((size_t)(l->Tt * 3) * sizeof(float));
        if (H5Dread(ids[0], H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, l->img_ids) < 0 ||
            H5Dread(ids[1], H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, l->txt_ids) < 0)
            rc = tz_errf(err, errlen, "%s: reading img_ids or txt_ids failed", path);
    }
out:
    for (int k = 0; k < 2; k++)
        if (ids[k] >= 0) H5Dclose(ids[k]);
    H5Eset_auto2(H5E_DEFAULT, fn, data);
    if (rc) tz_latents_close(l);
    return rc;
}

/* Row i of dataset ds (rank 2 or 3, row of `per` floats) into dst. */
static int read_row(hid_t ds, int rank, int64_t i, int64_t d1, int64_t d2, float *dst) {
    hsize_t off[3] = {(hsize_t)i, 0, 0}, cnt[3] = {1, (hsize_t)d1, (hsize_t)d2};
    hid_t fs = H5Dget_space(ds), ms = H5Screate_simple(rank, cnt, NULL);
    int ok = fs >= 0 && ms >= 0 &&
             H5Sselect_hyperslab(fs, H5S_SELECT_SET, off, NULL, cnt, NULL) >= 0 &&
             H5Dread(ds, H5T_NATIVE_FLOAT, ms, fs, H5P_DEFAULT, dst) >= 0;
    if (ms >= 0) H5Sclose(ms);
    if (fs >= 0) H5Sclose(fs);
    return ok;
}

int tz_latents_read(tz_latents *l, int64_t i, float *lat, float *txt, float *pooled, char *err,
                    size_t errlen) {
    if (i < 0 || i >= l->n)
        return tz_errf(err, errlen, "%s: row %lld outside 0..%lld", l->path, (long long)i,
                       (long long)l->n - 1);
    H5E_auto2_t fn;
    void *data;
    H5Eget_auto2(H5E_DEFAULT, &fn, &data);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    const int ok = read_row(l->ds[0], 3, i, l->Ti, l->C, lat) &&
                   read_row(l->ds[1], 3, i, l->Tt, l->J, txt) &&
                   read_row(l->ds[2], 2, i, l->P, 1, pooled);
    H5Eset_auto2(H5E_DEFAULT, fn, data);
    return ok ? 0 : tz_errf(err, errlen, "%s: reading row %lld failed", l->path, (long long)i);
}

void tz_latents_close(tz_latents *l) {
    for (int k = 0; k < 3; k++)
        if (l->ds[k] >= 0) H5Dclose(l->ds[k]);
    if (l->f >= 0) H5Fclose(l->f);
    free(l->img_ids), free(l->txt_ids);
    l->img_ids = l->txt_ids = NULL;
    l->f = l->ds[0] = l->ds[1] = l->ds[2] = -1;
}

static int attr_i64(hid_t f, const char *name, const int64_t *v, hsize_t n) {
    hid_t s = H5Screate_simple(1, &n, NULL);
    hid_t a = H5Acreate2(f, name, H5T_STD_I64LE, s, H5P_DEFAULT, H5P_DEFAULT);
    const int ok = a >= 0 && H5Awrite(a, H5T_NATIVE_INT64, v) >= 0;
    if (a >= 0) H5Aclose(a);
    H5Sclose(s);
    return ok;
}

int tz_latents_write(const char *path, const tz_latents_out *o, char *err, size_t errlen) {
    char *tmp;
    hid_t f = tz_h5_create_temp(path, &tmp, err, errlen);
    if (f < 0) return 1;
    hsize_t dl[3] = {(hsize_t)o->n, (hsize_t)o->Ti, (hsize_t)o->C}, di[2] = {(hsize_t)o->Ti, 3};
    hsize_t one = 1;
    hid_t sl = H5Screate_simple(3, dl, NULL), si = H5Screate_simple(2, di, NULL);
    hid_t lat = H5Dcreate2(f, "latents", H5T_IEEE_F32LE, sl, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hid_t noi = H5Dcreate2(f, "noise", H5T_IEEE_F32LE, sl, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hid_t ids = H5Dcreate2(f, "img_ids", H5T_IEEE_F32LE, si, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    int ok = lat >= 0 && noi >= 0 && ids >= 0 &&
             H5Dwrite(lat, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, o->lat) >= 0 &&
             H5Dwrite(noi, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, o->noise) >= 0 &&
             H5Dwrite(ids, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, o->img_ids) >= 0;
    ok = ok && attr_i64(f, "rows", o->rows, (hsize_t)o->n) && attr_i64(f, "steps", &o->steps, 1) &&
         attr_i64(f, "seed", &o->seed, 1);
    hid_t sa = H5Screate_simple(1, &one, NULL);
    hid_t a = H5Acreate2(f, "guidance", H5T_IEEE_F64LE, sa, H5P_DEFAULT, H5P_DEFAULT);
    ok = ok && a >= 0 && H5Awrite(a, H5T_NATIVE_DOUBLE, &o->guidance) >= 0;
    if (a >= 0) H5Aclose(a);
    if (lat >= 0) H5Dclose(lat);
    if (noi >= 0) H5Dclose(noi);
    if (ids >= 0) H5Dclose(ids);
    H5Sclose(sl), H5Sclose(si), H5Sclose(sa);
    return tz_h5_commit(f, tmp, path, ok, err, errlen);
}
