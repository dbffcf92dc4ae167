/* Checkpoint shard files through the HDF5 C API (HDF5's own error printing silenced, each
 * failure turned into one message naming the file and object), and the file CRC-32. */
#define _GNU_SOURCE /* pread, pwrite */
#include "io/ckpt_h5.h"

#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#if H5_VERSION_GE(1, 13, 0)
#include <H5FDdevelop.h> /* H5FD_class_t, H5FD_t: a header of their own from 1.13 */
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "core/error.h"

struct tz_h5_shard {
    hid_t f;
    int io_errno;      /* written shards: the first failed write or truncate (0: none) */
    char io_what[16];  /* which of them */
    char path[1024];
};

/* ---- the written shards' file driver
 *
 * HDF5 (1.10.8, and later versions by their source) frees a file's state when its last
 * close fails to write it out (a full disk, a file size limit) but keeps its ID, and at the
 * end (MPI_Finalize, exit) closes that ID again: a segfault after the right message. The chunks and metadata it caches are
 * written at H5Dclose and H5Fclose, so a failing write cannot be kept out of the closes.
 * Shards are therefore written through this driver: plain POSIX I/O, as HDF5's sec2 driver
 * does (the same features, so the same bytes on disk), except that a failed write or
 * truncate is recorded in the shard (its errno, the first one) and reported as done. Every
 * HDF5 call then completes and every close frees what it holds; the writer reports the
 * recorded error, naming the file. Reading uses HDF5's own driver. */

typedef struct latch_fapl {
    tz_h5_shard *shard; /* where a failure is recorded */
} latch_fapl;

typedef struct latch_file {
    H5FD_t pub; /* HDF5's part, first */
    int fd;
    haddr_t eoa, eof;
    tz_h5_shard *shard;
} latch_file;

static void latch_fail(latch_file *f, const char *what, int e) {
    if (f->shard && !f->shard->io_errno) {
        f->shard->io_errno = e ? e : EIO;
        snprintf(f->shard->io_what, sizeof f->shard->io_what, "%s", what);
    }
}

static int latch_failed(const latch_file *f) { return f->shard && f->shard->io_errno; }

static H5FD_t *latch_open(const char *name, unsigned flags, hid_t fapl, haddr_t maxaddr) {
    (void)maxaddr;
    int o = (flags & H5F_ACC_RDWR) ? O_RDWR : O_RDONLY;
    if (flags & H5F_ACC_TRUNC) o |= O_TRUNC;
    if (flags & H5F_ACC_CREAT) o |= O_CREAT;
    if (flags & H5F_ACC_EXCL) o |= O_EXCL;
    const latch_fapl *fa = H5Pget_driver_info(fapl);
    int fd = open(name, o | O_CLOEXEC, 0666);
    struct stat st;
    if (fd < 0) return NULL;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return NULL;
    }
    latch_file *f = calloc(1, sizeof *f);
    if (!f) {
        close(fd);
        return NULL;
    }
    f->fd = fd;
    f->eof = (haddr_t)st.st_size;
    f->shard = fa ? fa->shard : NULL;
    return &f->pub;
}

static herr_t latch_close(H5FD_t *file) {
    latch_file *f = (latch_file *)file;
    if (close(f->fd) != 0) latch_fail(f, "close", errno); /* NFS may report a full disk here */
    free(f);
    return 0;
}

static herr_t latch_query(const H5FD_t *file, unsigned long *flags) {
    (void)file; /* sec2's allocation features: the same file layout */
    *flags = H5FD_FEAT_AGGREGATE_METADATA | H5FD_FEAT_ACCUMULATE_METADATA | H5FD_FEAT_DATA_SIEVE |
             H5FD_FEAT_AGGREGATE_SMALLDATA;
    return 0;
}

static haddr_t latch_get_eoa(const H5FD_t *file, H5FD_mem_t type) {
    (void)type;
    return ((const latch_file *)file)->eoa;
}

static herr_t latch_set_eoa(H5FD_t *file, H5FD_mem_t type, haddr_t addr) {
    (void)type;
    ((latch_file *)file)->eoa = addr;
    return 0;
}

static haddr_t latch_get_eof(const H5FD_t *file, H5FD_mem_t type) {
    (void)type;
    return ((const latch_file *)file)->eof;
}

static herr_t latch_read(H5FD_t *file, H5FD_mem_t type, hid_t dxpl, haddr_t addr, size_t size,
                         void *buf) {
    (void)type, (void)dxpl;
    latch_file *f = (latch_file *)file;
    unsigned char *p = buf;
    while (size > 0) { /* past the end of the file: zeros, as sec2 gives */
        ssize_t k = pread(f->fd, p, size, (off_t)addr);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return -1;
        if (k == 0) {
            memset(p, 0, size);
            break;
        }
        p += k, addr += (haddr_t)k, size -= (size_t)k;
    }
    return 0;
}

static herr_t latch_write(H5FD_t *file, H5FD_mem_t type, hid_t dxpl, haddr_t addr, size_t size,
                          const void *buf) {
    (void)type, (void)dxpl;
    latch_file *f = (latch_file *)file;
    const unsigned char *p = buf;
    while (size > 0 && !latch_failed(f)) { /* after a failure the file is not kept: no writes */
        ssize_t k = pwrite(f->fd, p, size, (off_t)addr);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            latch_fail(f, "write", k < 0 ? errno : ENOSPC);
            break;
        }
        p += k, addr += (haddr_t)k, size -= (size_t)k;
        if (addr > f->eof) f->eof = addr;
    }
    return 0;
}

static herr_t latch_truncate(H5FD_t *file, hid_t dxpl, hbool_t closing) {
    (void)dxpl, (void)closing;
    latch_file *f = (latch_file *)file;
    if (f->eoa == f->eof) return 0;
    if (!latch_failed(f) && ftruncate(f->fd, (off_t)f->eoa) != 0) latch_fail(f, "truncate", errno);
    f->eof = f->eoa;
    return 0;
}

static const H5FD_class_t latch_class = {
#if H5_VERSION_GE(1, 13, 2)
    .version = H5FD_CLASS_VERSION,
    .value = (H5FD_class_value_t)511, /* in the range HDF5 leaves to unregistered drivers */
#endif
    .name = "tz_shard",
    .maxaddr = (haddr_t)INT64_MAX, /* the largest off_t, as sec2 */
    .fc_degree = H5F_CLOSE_WEAK,
    .fapl_size = sizeof(latch_fapl),
    .open = latch_open,
    .close = latch_close,
    .query = latch_query,
    .get_eoa = latch_get_eoa,
    .set_eoa = latch_set_eoa,
    .get_eof = latch_get_eof,
    .read = latch_read,
    .write = latch_write,
    .truncate = latch_truncate,
    .fl_map = H5FD_FLMAP_DICHOTOMY,
};

/* A file access property list with the driver, failures recorded in s; < 0 on failure. */
static hid_t latch_fapl_for(tz_h5_shard *s) {
    static hid_t id = -1;
    if (id < 0 || H5Iis_valid(id) <= 0) id = H5FDregister(&latch_class);
    hid_t fa = id >= 0 ? H5Pcreate(H5P_FILE_ACCESS) : -1;
    latch_fapl info = {s};
    if (fa >= 0 && H5Pset_driver(fa, id, &info) < 0) {
        H5Pclose(fa);
        fa = -1;
    }
    return fa;
}

#define CHUNK_ELEMS ((hsize_t)1 << 20)  /* 4 MiB chunks, each with its Fletcher32 checksum */
#define BLOCK_ELEMS ((hsize_t)1 << 26)  /* one write or read call moves at most 256 MiB */

/* HDF5 prints its error stack by default; every call here reports through err instead. */
typedef struct quiet {
    H5E_auto2_t fn;
    void *data;
} quiet;
static quiet quiet_on(void) {
    quiet q;
    H5Eget_auto2(H5E_DEFAULT, &q.fn, &q.data);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    return q;
}
static void quiet_off(quiet q) { H5Eset_auto2(H5E_DEFAULT, q.fn, q.data); }

/* The write failure recorded in s, as a message in err and -1; 0 (err untouched) when none. */
static int io_error(const tz_h5_shard *s, char *err, size_t errlen) {
    if (!s->io_errno) return 0;
    const int w = !strcmp(s->io_what, "write"); /* "file: No space left on device" */
    return tz_errf(err, errlen, "%s: %s%s%s", s->path, w ? "" : s->io_what, w ? "" : ": ",
                   strerror(s->io_errno));
}

tz_h5_shard *tz_h5_shard_create(const char *path, char *err, size_t errlen) {
    tz_h5_shard *s = tz_xcalloc(1, sizeof *s);
    snprintf(s->path, sizeof s->path, "%s", path);
    quiet q = quiet_on();
    hid_t fc = H5Pcreate(H5P_FILE_CREATE); /* no object times: equal states, equal bytes */
    if (fc >= 0) H5Pset_obj_track_times(fc, 0);
    hid_t fa = latch_fapl_for(s);
    errno = 0;
    s->f = fa >= 0 ? H5Fcreate(path, H5F_ACC_TRUNC, fc >= 0 ? fc : H5P_DEFAULT, fa) : -1;
    const int e = errno;
    if (fc >= 0) H5Pclose(fc);
    if (fa >= 0) H5Pclose(fa);
    quiet_off(q);
    if (s->f < 0) {
        tz_errf(err, errlen, "%s: cannot create the HDF5 file: %s", path,
                e ? strerror(e) : "HDF5 error");
        free(s);
        return NULL;
    }
    if (io_error(s, err, errlen)) { /* the superblock is written at once */
        tz_h5_shard_close(s, NULL, 0);
        return NULL;
    }
    return s;
}

tz_h5_shard *tz_h5_shard_open(const char *path, char *err, size_t errlen) {
    quiet q = quiet_on();
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    quiet_off(q);
    if (f < 0) {
        tz_errf(err, errlen, "%s: not a readable HDF5 file (missing, truncated or damaged)", path);
        return NULL;
    }
    tz_h5_shard *s = tz_xcalloc(1, sizeof *s);
    s->f = f;
    snprintf(s->path, sizeof s->path, "%s", path);
    return s;
}

int tz_h5_shard_close(tz_h5_shard *s, char *err, size_t errlen) {
    if (!s) return 0;
    quiet q = quiet_on();
    int ok = H5Fclose(s->f) >= 0;
    quiet_off(q);
    int rc = io_error(s, err, errlen); /* written files: the failure behind any other */
    if (!rc && !ok) rc = tz_errf(err, errlen, "%s: closing the HDF5 file failed", s->path);
    free(s);
    return rc;
}

static int put_attr(hid_t obj, const char *name, const int64_t *v, hsize_t n) {
    hsize_t dims[1] = {n ? n : 1};
    hid_t sp = H5Screate_simple(1, dims, NULL);
    hid_t a = H5Acreate2(obj, name, H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
    int64_t zero = 0;
    int ok = sp >= 0 && a >= 0 && H5Awrite(a, H5T_NATIVE_INT64, n ? v : &zero) >= 0;
    if (a >= 0) H5Aclose(a);
    if (sp >= 0) H5Sclose(sp);
    return ok;
}

int tz_h5_shard_attr(tz_h5_shard *s, const char *obj, const char *name, const int64_t *v, int n,
                     char *err, size_t errlen) {
    quiet q = quiet_on();
    hid_t o = obj && *obj ? H5Oopen(s->f, obj, H5P_DEFAULT) : s->f;
    int ok = o >= 0 && put_attr(o, name, v, (hsize_t)n);
    if (obj && *obj && o >= 0) H5Oclose(o);
    quiet_off(q);
    if (io_error(s, err, errlen)) return -1;
    return ok ? 0 : tz_errf(err, errlen, "%s: cannot write attribute %s", s->path, name);
}

/* The group `name`, created when absent; < 0 on failure. */
static hid_t group(hid_t f, const char *name) {
    if (H5Lexists(f, name, H5P_DEFAULT) > 0) return H5Gopen2(f, name, H5P_DEFAULT);
    hid_t gc = H5Pcreate(H5P_GROUP_CREATE);
    if (gc >= 0) H5Pset_obj_track_times(gc, 0);
    hid_t g = H5Gcreate2(f, name, H5P_DEFAULT, gc >= 0 ? gc : H5P_DEFAULT, H5P_DEFAULT);
    if (gc >= 0) H5Pclose(gc);
    return g;
}

/* The file and memory types of an element type; 0 for one a shard does not store. */
static int h5_types(enum tz_dtype dt, hid_t *file, hid_t *mem) {
    switch (dt) {
    case TZ_DT_F32: *file = H5T_IEEE_F32LE, *mem = H5T_NATIVE_FLOAT; return 1;
    case TZ_DT_BF16: *file = H5T_STD_U16LE, *mem = H5T_NATIVE_UINT16; return 1;
    case TZ_DT_U8: *file = H5T_STD_U8LE, *mem = H5T_NATIVE_UINT8; return 1;
    default: return 0;
    }
}

/* What a dataset's type is, in words: "4-byte floats", "2-byte integers". */
static void type_words(hid_t t, char *buf, size_t n) {
    H5T_class_t c = t >= 0 ? H5Tget_class(t) : H5T_NO_CLASS;
    snprintf(buf, n, "%zu-byte %s", t >= 0 ? H5Tget_size(t) : 0,
             c == H5T_FLOAT ? "floats" : c == H5T_INTEGER ? "integers" : "values");
}

int tz_h5_shard_write(tz_h5_shard *s, const char *gname, const char *name, enum tz_dtype dt,
                      const void *data, int64_t n, const int64_t *shape, int ndim,
                      int64_t flat_offset, const int64_t *pieces, int64_t npieces, char *err,
                      size_t errlen) {
    hid_t ftype, mtype;
    if (!h5_types(dt, &ftype, &mtype))
        return tz_errf(err, errlen, "%s: dataset %s/%s: element type %s is not stored", s->path,
                       gname, name, tz_dtype_name(dt));
    const size_t es = tz_dtype_size(dt);
    quiet q = quiet_on();
    hsize_t dims[1] = {(hsize_t)n}, chunk[1] = {(hsize_t)n < CHUNK_ELEMS ? (hsize_t)n : CHUNK_ELEMS};
    if (chunk[0] == 0) chunk[0] = 1;
    hid_t g = group(s->f, gname);
    hid_t sp = H5Screate_simple(1, dims, NULL);
    hid_t pl = H5Pcreate(H5P_DATASET_CREATE);
    int ok = g >= 0 && sp >= 0 && pl >= 0 && H5Pset_chunk(pl, 1, chunk) >= 0 &&
             H5Pset_fletcher32(pl) >= 0 && H5Pset_obj_track_times(pl, 0) >= 0;
    hid_t d = ok ? H5Dcreate2(g, name, ftype, sp, H5P_DEFAULT, pl, H5P_DEFAULT) : -1;
    ok = ok && d >= 0;
    for (hsize_t at = 0; ok && at < (hsize_t)n; at += BLOCK_ELEMS) {
        hsize_t cnt[1] = {(hsize_t)n - at < BLOCK_ELEMS ? (hsize_t)n - at : BLOCK_ELEMS}, off[1] = {at};
        hid_t ms = H5Screate_simple(1, cnt, NULL), fs = H5Dget_space(d);
        ok = ms >= 0 && fs >= 0 &&
             H5Sselect_hyperslab(fs, H5S_SELECT_SET, off, NULL, cnt, NULL) >= 0 &&
             H5Dwrite(d, mtype, ms, fs, H5P_DEFAULT, (const char *)data + at * es) >= 0;
        if (ms >= 0) H5Sclose(ms);
        if (fs >= 0) H5Sclose(fs);
    }
    ok = ok && put_attr(d, "shape", shape, (hsize_t)ndim) && put_attr(d, "flat_offset", &flat_offset, 1) &&
         put_attr(d, "pieces", pieces, (hsize_t)(2 * npieces));
    if (d >= 0 && H5Dclose(d) < 0) ok = 0; /* its cached chunks are written here */
    if (pl >= 0) H5Pclose(pl);
    if (sp >= 0) H5Sclose(sp);
    if (g >= 0) H5Gclose(g);
    quiet_off(q);
    if (io_error(s, err, errlen)) return -1;
    return ok ? 0 : tz_errf(err, errlen, "%s: cannot write dataset %s/%s (%lld %s values)",
                            s->path, gname, name, (long long)n, tz_dtype_name(dt));
}

int tz_h5_shard_read(tz_h5_shard *s, const char *gname, const char *name, enum tz_dtype dt,
                     int64_t total, int64_t at, int64_t n, void *dst, char *err,
                     size_t errlen) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", gname, name);
    hid_t ftype, mtype;
    if (!h5_types(dt, &ftype, &mtype))
        return tz_errf(err, errlen, "%s: dataset %s: element type %s is not stored", s->path,
                       path, tz_dtype_name(dt));
    const size_t es = tz_dtype_size(dt);
    quiet q = quiet_on();
    int rc = 0;
    hid_t d = H5Lexists(s->f, gname, H5P_DEFAULT) > 0 && H5Lexists(s->f, path, H5P_DEFAULT) > 0
                  ? H5Dopen2(s->f, path, H5P_DEFAULT)
                  : -1;
    hid_t fs = d >= 0 ? H5Dget_space(d) : -1;
    hid_t dty = d >= 0 ? H5Dget_type(d) : -1;
    hsize_t dims[1] = {0};
    if (d < 0) {
        rc = tz_errf(err, errlen, "%s: no dataset %s", s->path, path);
    } else if (dty < 0 || H5Tget_class(dty) != H5Tget_class(ftype) ||
               H5Tget_size(dty) != H5Tget_size(ftype)) {
        char have[64], want[64];
        type_words(dty, have, sizeof have);
        type_words(ftype, want, sizeof want);
        rc = tz_errf(err, errlen, "%s: dataset %s holds %s, this run keeps it as %s (%s)",
                     s->path, path, have, want, tz_dtype_name(dt));
    } else if (fs < 0 || H5Sget_simple_extent_ndims(fs) != 1 ||
               H5Sget_simple_extent_dims(fs, dims, NULL) < 0 || (int64_t)dims[0] != total) {
        rc = tz_errf(err, errlen, "%s: dataset %s holds %lld values, expected %lld", s->path, path,
                     (long long)dims[0], (long long)total);
    } else if (at < 0 || n < 0 || at + n > total) {
        rc = tz_errf(err, errlen, "%s: %s: elements [%lld, %lld) outside [0, %lld)", s->path, path,
                     (long long)at, (long long)(at + n), (long long)total);
    }
    for (int64_t done = 0; rc == 0 && done < n; done += (int64_t)BLOCK_ELEMS) {
        hsize_t cnt[1] = {(hsize_t)(n - done) < BLOCK_ELEMS ? (hsize_t)(n - done) : BLOCK_ELEMS};
        hsize_t off[1] = {(hsize_t)(at + done)};
        hid_t ms = H5Screate_simple(1, cnt, NULL);
        int ok = ms >= 0 && H5Sselect_hyperslab(fs, H5S_SELECT_SET, off, NULL, cnt, NULL) >= 0 &&
                 H5Dread(d, mtype, ms, fs, H5P_DEFAULT, (char *)dst + done * es) >= 0;
        if (ms >= 0) H5Sclose(ms);
        if (!ok)
            rc = tz_errf(err, errlen, "%s: reading %s failed (checksum mismatch: the file is "
                         "damaged)", s->path, path);
    }
    if (dty >= 0) H5Tclose(dty);
    if (fs >= 0) H5Sclose(fs);
    if (d >= 0) H5Dclose(d);
    quiet_off(q);
    return rc;
}

int tz_file_sync_crc(const char *path, int64_t *bytes, uint32_t *crc, char *err, size_t errlen) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return tz_errf(err, errlen, "%s: %s", path, strerror(errno));
    if (fsync(fd) != 0) {
        int e = errno;
        close(fd);
        return tz_errf(err, errlen, "%s: fsync: %s", path, strerror(e));
    }
    const size_t B = (size_t)8 << 20;
    unsigned char *buf = tz_xmalloc(B);
    uLong c = crc32(0L, Z_NULL, 0);
    int64_t total = 0;
    for (;;) {
        ssize_t k = read(fd, buf, B);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            int e = errno;
            free(buf);
            close(fd);
            return tz_errf(err, errlen, "%s: read: %s", path, strerror(e));
        }
        if (k == 0) break;
        c = crc32(c, buf, (uInt)k);
        total += k;
    }
    free(buf);
    close(fd);
    *bytes = total;
    *crc = (uint32_t)c;
    return 0;
}
