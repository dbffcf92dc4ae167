/* Cached Flux latents in HDF5 (io/latents_h5.c), structure-aware: the input is not an HDF5
 * file (that would fuzz libhdf5's own parser) but the description of one, which this target
 * writes with the HDF5 C API and then opens with tz_latents_open. For each of the datasets
 * "latents", "txt", "pooled", "img_ids" and "txt_ids": whether it is there, and as what (a
 * dataset, a group, a named datatype, a soft link to another of them or to nothing), its
 * element type (float32 either byte order, float64, int32, uint8, a fixed-length string), its
 * rank (0-4, a null dataspace too) and dims (0..5, or past 2^24 and 2^31 through a chunked,
 * extendible dataspace that holds no data), its storage (contiguous, chunked, compact,
 * deflated) and whether its values are written or left to its fill value; then extras (an
 * attribute, a group, a user block, the newest file format).
 *
 * Properties: no crash, leak or HDF5 handle left open (H5Fget_obj_count); the file is
 * accepted exactly when it is what latents_h5.h documents (with Ti, C, Tt, J and P at most
 * 2^24, as latents_h5.c bounds them); a refusal names the file; an accepted file's n, Ti, Tt,
 * C, J and P are the dims written, its img_ids and txt_ids and its rows 0 and n-1 are exactly
 * the values written (or the fill value), and rows n, -1 and INT64_MAX are refused with a
 * message naming the file.
 *
 * Input layout (a byte past the end reads as 0; tests/fuzz/make_corpus.py writes the seeds):
 * flags (bit 0: a group "extra" with an attribute, 1: a root attribute named "latents", 2: a
 * user block, 3: the newest file format, 4-7: the seed's high bits), the seed of the values,
 * the six sizes n Ti Tt C J P (one byte each: b % 6, or past 0xF7 a large one), then per
 * dataset three bytes:
 *   kind: bits 0-3 what it is (0-10 a dataset, 11 absent, 12 a group, 13 a soft link to the
 *     one before, 14 a dangling soft link, 15 a named datatype), bits 4-5 its storage
 *     (contiguous, chunked, compact, chunked + deflate), bit 6 no values written (its fill
 *     value), bit 7 an attribute on it;
 *   type % 8: 0-2 float32, 3 float32 big-endian, 4 float64, 5 int32, 6 uint8, 7 a string;
 *   shape: below 0xC0 the documented shape from the six sizes, else rank b % 5 (0 with bit 3:
 *     a null dataspace) and that many size bytes. */
#include <hdf5.h>

#include "fuzz_common.h"
#include "io/latents_h5.h"

enum { NSETS = 5, SMALL = 4096 };
static const char *const names[NSETS] = {"latents", "txt", "pooled", "img_ids", "txt_ids"};
static const int ranks[NSETS] = {3, 3, 2, 2, 2};

enum { K_DATASET, K_ABSENT, K_GROUP, K_ALIAS, K_DANGLING, K_TYPE };
enum { T_F32LE, T_F32BE, T_F64, T_I32, T_U8, T_STR };
enum { L_CONTIG, L_CHUNK, L_COMPACT, L_DEFLATE };

typedef struct {
    int kind, type, layout, write, attr, rank, null;
    hsize_t dims[4];
    uint64_t count; /* elements */
} desc;

typedef struct {
    const uint8_t *p;
    size_t n, i;
} rd;
static unsigned byte(rd *r) { return r->i < r->n ? r->p[r->i++] : 0; }

static hsize_t size_of(unsigned b) {
    static const hsize_t big[8] = {(1u << 24) + 1, 1u << 31,        (1ull << 32) + 1,
                                   (1u << 24) + 1, 1u << 31,        (1u << 31) + 3,
                                   1u << 25,       (1ull << 32) + 1};
    return b < 0xF8 ? b % 6 : big[b & 7];
}

/* The values: element k of the dataset `set`, and its fill value; exact in float32. */
static float val(uint32_t seed, int set, uint64_t k) {
    uint32_t h = seed * 0x9E3779B1u ^ (uint32_t)(set + 1) * 0x85EBCA77u ^
                 (uint32_t)k * 0xC2B2AE3Du ^ (uint32_t)(k >> 32) * 0x27D4EB2Fu;
    h ^= h >> 15, h *= 0x2C1B3C6Du, h ^= h >> 12;
    return (float)((int)(h % 4001) - 2000) * 0.125f;
}
static float fill(uint32_t seed, int set) { return (float)(int)(seed % 97) - 48.5f - (float)set; }

static hid_t file_type(int type) {
    switch (type) {
    case T_F32LE: return H5Tcopy(H5T_IEEE_F32LE);
    case T_F32BE: return H5Tcopy(H5T_IEEE_F32BE);
    case T_F64: return H5Tcopy(H5T_IEEE_F64LE);
    case T_I32: return H5Tcopy(H5T_STD_I32LE);
    case T_U8: return H5Tcopy(H5T_STD_U8LE);
    default: {
        hid_t t = H5Tcopy(H5T_C_S1);
        H5Tset_size(t, 4);
        return t;
    }
    }
}

static int ok_h5(herr_t e) { return e >= 0; }

/* Writes dataset i as d describes it. */
static void write_set(hid_t f, int i, const desc *d, uint32_t seed) {
    hid_t space;
    if (d->rank == 0) {
        space = H5Screate(d->null ? H5S_NULL : H5S_SCALAR);
    } else {
        hsize_t maxd[4];
        for (int k = 0; k < d->rank; k++)
            maxd[k] = d->layout == L_CHUNK || d->layout == L_DEFLATE ? H5S_UNLIMITED : d->dims[k];
        space = H5Screate_simple(d->rank, d->dims, maxd);
    }
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE), ft = file_type(d->type);
    FZ_ASSERT(space >= 0 && dcpl >= 0 && ft >= 0, "making the dataspace of %s", names[i]);
    if (d->layout == L_CHUNK || d->layout == L_DEFLATE) {
        hsize_t chunk[4];
        for (int k = 0; k < d->rank; k++)
            chunk[k] = d->dims[k] > 5 ? 1 : d->dims[k] ? d->dims[k] : 1;
        FZ_ASSERT(ok_h5(H5Pset_chunk(dcpl, d->rank, chunk)), "chunking %s", names[i]);
        if (d->layout == L_DEFLATE) FZ_ASSERT(ok_h5(H5Pset_deflate(dcpl, 1)), "deflate");
    } else if (d->layout == L_COMPACT) {
        FZ_ASSERT(ok_h5(H5Pset_layout(dcpl, H5D_COMPACT)), "compact");
    }
    if (d->type == T_F32LE || d->type == T_F32BE) {
        const float fv = fill(seed, i);
        FZ_ASSERT(ok_h5(H5Pset_fill_value(dcpl, H5T_NATIVE_FLOAT, &fv)), "fill value");
    }
    hid_t ds = H5Dcreate2(f, names[i], ft, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    FZ_ASSERT(ds >= 0, "creating %s (rank %d, layout %d, type %d)", names[i], d->rank, d->layout,
              d->type);
    if (d->write) {
        void *buf = malloc(d->count ? d->count * 8 : 8);
        hid_t mt = ft;
        FZ_ASSERT(buf, "out of memory");
        for (uint64_t k = 0; k < d->count; k++) {
            const float v = val(seed, i, k);
            switch (d->type) {
            case T_F32LE:
            case T_F32BE: ((float *)buf)[k] = v, mt = H5T_NATIVE_FLOAT; break;
            case T_F64: ((double *)buf)[k] = v, mt = H5T_NATIVE_DOUBLE; break;
            case T_I32: ((int32_t *)buf)[k] = (int32_t)(v * 8), mt = H5T_NATIVE_INT32; break;
            case T_U8: ((uint8_t *)buf)[k] = (uint8_t)(int)v, mt = H5T_NATIVE_UINT8; break;
            default: memcpy((char *)buf + 4 * k, (int)v & 1 ? "1.5" : "abcd", 4); break;
            }
        }
        FZ_ASSERT(ok_h5(H5Dwrite(ds, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf)), "writing %s",
                  names[i]);
        free(buf);
    }
    if (d->attr) {
        hid_t as = H5Screate(H5S_SCALAR);
        hid_t a = H5Acreate2(ds, "scale", H5T_NATIVE_INT, as, H5P_DEFAULT, H5P_DEFAULT);
        const int one = 1;
        FZ_ASSERT(a >= 0 && ok_h5(H5Awrite(a, H5T_NATIVE_INT, &one)), "an attribute");
        H5Aclose(a), H5Sclose(as);
    }
    H5Dclose(ds), H5Tclose(ft), H5Pclose(dcpl), H5Sclose(space);
}

static void write_other(hid_t f, int i, const desc *d) {
    switch (d->kind) {
    case K_GROUP: { /* a group, holding a dataset of the same name */
        hid_t g = H5Gcreate2(f, names[i], H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        hsize_t one = 1;
        hid_t s = H5Screate_simple(1, &one, NULL);
        hid_t ds =
            H5Dcreate2(g, names[i], H5T_IEEE_F32LE, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        FZ_ASSERT(g >= 0 && s >= 0 && ds >= 0, "a group %s", names[i]);
        H5Dclose(ds), H5Sclose(s), H5Gclose(g);
        break;
    }
    case K_ALIAS:
        FZ_ASSERT(ok_h5(H5Lcreate_soft(names[(i + NSETS - 1) % NSETS], f, names[i], H5P_DEFAULT,
                                       H5P_DEFAULT)),
                  "a soft link %s", names[i]);
        break;
    case K_DANGLING:
        FZ_ASSERT(ok_h5(H5Lcreate_soft("/nowhere/at_all", f, names[i], H5P_DEFAULT, H5P_DEFAULT)),
                  "a dangling link %s", names[i]);
        break;
    case K_TYPE: {
        hid_t t = H5Tcopy(H5T_IEEE_F32LE);
        FZ_ASSERT(ok_h5(H5Tcommit2(f, names[i], t, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)),
                  "a named datatype %s", names[i]);
        H5Tclose(t);
        break;
    }
    default: break;
    }
}

/* What set i is once soft links are followed: the index of the dataset it names, or -1. */
static int owner(const desc *d, int i) {
    for (int hops = 0; hops <= NSETS; hops++) {
        if (d[i].kind == K_DATASET) return i;
        if (d[i].kind != K_ALIAS) return -1;
        i = (i + NSETS - 1) % NSETS;
    }
    return -1; /* a loop of soft links */
}

static float expect(const desc *d, int set, uint32_t seed, uint64_t k) {
    return d[set].write ? val(seed, set, k) : fill(seed, set);
}

static int64_t open_count(void) { return (int64_t)H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int quiet;
    if (!quiet) H5Eset_auto2(H5E_DEFAULT, NULL, NULL), quiet = 1;
    rd r = {data, size, 0};
    const unsigned flags = byte(&r);
    const uint32_t seed = byte(&r) | (flags & 0xF0u) << 4;
    hsize_t sz[6]; /* n Ti Tt C J P */
    for (int k = 0; k < 6; k++) sz[k] = size_of(byte(&r));
    const hsize_t shape[NSETS][3] = {
        {sz[0], sz[1], sz[3]}, {sz[0], sz[2], sz[4]}, {sz[0], sz[5]}, {sz[1], 3}, {sz[2], 3}};
    desc d[NSETS];
    memset(d, 0, sizeof d);
    for (int i = 0; i < NSETS; i++) {
        const unsigned kb = byte(&r), tb = byte(&r), sb = byte(&r);
        const int kind = kb % 16;
        d[i].kind = kind <= 10 ? K_DATASET : kind - 10;
        d[i].layout = (int)(kb >> 4) & 3;
        d[i].write = !(kb & 0x40);
        d[i].attr = (kb & 0x80) != 0;
        d[i].type = (int)(tb % 8) <= 2 ? T_F32LE : (int)(tb % 8) - 2;
        if (sb < 0xC0) {
            d[i].rank = ranks[i];
            memcpy(d[i].dims, shape[i], sizeof shape[i]);
        } else {
            d[i].rank = (int)(sb % 5);
            d[i].null = d[i].rank == 0 && (sb & 8);
            for (int k = 0; k < d[i].rank; k++) d[i].dims[k] = size_of(byte(&r));
        }
        /* no more than 2^40 elements (one large size at a time), which only chunked storage
         * declares without writing */
        uint64_t count = d[i].null ? 0 : 1;
        for (int k = 0; k < d[i].rank; k++)
            if (__builtin_mul_overflow(count, d[i].dims[k], &count) || count > (1ull << 40))
                d[i].dims[k] = 1, count = 1;
        count = d[i].null ? 0 : 1;
        for (int k = 0; k < d[i].rank; k++) count *= d[i].dims[k];
        d[i].count = count;
        if (count > SMALL) d[i].layout = L_CHUNK, d[i].write = 0;
        if (!count) d[i].write = 0;
        if (d[i].rank == 0 && (d[i].layout == L_CHUNK || d[i].layout == L_DEFLATE))
            d[i].layout = L_CONTIG;
    }

    /* the file */
    char path[600], err[2048] = "";
    fz_path(path, "cache.h5");
    hid_t fcpl = H5Pcreate(H5P_FILE_CREATE), fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (flags & 4) H5Pset_userblock(fcpl, 512);
    if (flags & 8) H5Pset_libver_bounds(fapl, H5F_LIBVER_LATEST, H5F_LIBVER_LATEST);
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, fcpl, fapl);
    FZ_ASSERT(f >= 0, "cannot create %s", path);
    H5Pclose(fcpl), H5Pclose(fapl);
    for (int i = 0; i < NSETS; i++)
        if (d[i].kind == K_DATASET) write_set(f, i, &d[i], seed);
    for (int i = 0; i < NSETS; i++)
        if (d[i].kind != K_DATASET) write_other(f, i, &d[i]);
    if (flags & 1) { /* a group beside them, with an attribute */
        hid_t g = H5Gcreate2(f, "extra", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        hid_t s = H5Screate(H5S_SCALAR);
        hid_t a = H5Acreate2(g, "note", H5T_NATIVE_DOUBLE, s, H5P_DEFAULT, H5P_DEFAULT);
        const double v = 0.5;
        FZ_ASSERT(g >= 0 && a >= 0 && ok_h5(H5Awrite(a, H5T_NATIVE_DOUBLE, &v)), "the extra group");
        H5Aclose(a), H5Sclose(s), H5Gclose(g);
    }
    if (flags & 2) { /* an attribute on the root named like a dataset */
        hid_t s = H5Screate(H5S_SCALAR);
        hid_t a = H5Acreate2(f, "latents", H5T_NATIVE_FLOAT, s, H5P_DEFAULT, H5P_DEFAULT);
        const float v = 1;
        FZ_ASSERT(a >= 0 && ok_h5(H5Awrite(a, H5T_NATIVE_FLOAT, &v)), "a root attribute");
        H5Aclose(a), H5Sclose(s);
    }
    FZ_ASSERT(ok_h5(H5Fclose(f)), "closing %s", path);
    FZ_ASSERT(open_count() == 0, "the writer left %lld HDF5 objects open", (long long)open_count());

    /* what the reader must make of it */
    int own[NSETS], valid = 1;
    for (int i = 0; i < NSETS; i++) {
        own[i] = owner(d, i);
        const desc *e = own[i] >= 0 ? &d[own[i]] : NULL;
        valid = valid && e && (e->type == T_F32LE || e->type == T_F32BE) && !e->null &&
                e->rank == ranks[i];
    }
    const desc *L = valid ? &d[own[0]] : NULL, *T = valid ? &d[own[1]] : NULL;
    const desc *Pd = valid ? &d[own[2]] : NULL, *I = valid ? &d[own[3]] : NULL;
    const desc *X = valid ? &d[own[4]] : NULL;
    valid = valid && L->dims[0] >= 1 && T->dims[0] == L->dims[0] && Pd->dims[0] == L->dims[0] &&
            I->dims[0] == L->dims[1] && I->dims[1] == 3 && X->dims[0] == T->dims[1] &&
            X->dims[1] == 3 && L->dims[1] && L->dims[2] && T->dims[1] && T->dims[2] && Pd->dims[1];
    const hsize_t most = (hsize_t)1 << 24; /* Ti, C, Tt, J and P (io/latents_h5.c) */
    valid = valid && L->dims[1] <= most && L->dims[2] <= most && T->dims[1] <= most &&
            T->dims[2] <= most && Pd->dims[1] <= most;

    tz_latents l;
    if (tz_latents_open(&l, path, err, sizeof err)) {
        fz_rejected(err, path);
        FZ_ASSERT(!valid, "a file as documented is refused: %s", err);
        FZ_ASSERT(l.f < 0 && l.ds[0] < 0 && l.ds[1] < 0 && l.ds[2] < 0 && !l.img_ids && !l.txt_ids,
                  "a refused file leaves state behind");
        FZ_ASSERT(open_count() == 0, "a refusal leaves %lld HDF5 objects open",
                  (long long)open_count());
        return 0;
    }
    FZ_ASSERT(valid,
              "an undocumented file is accepted: n %lld Ti %lld Tt %lld C %lld J %lld P %lld",
              (long long)l.n, (long long)l.Ti, (long long)l.Tt, (long long)l.C, (long long)l.J,
              (long long)l.P);
    FZ_ASSERT((hsize_t)l.n == L->dims[0] && (hsize_t)l.Ti == L->dims[1] &&
                  (hsize_t)l.C == L->dims[2] && (hsize_t)l.Tt == T->dims[1] &&
                  (hsize_t)l.J == T->dims[2] && (hsize_t)l.P == Pd->dims[1],
              "sizes n %lld Ti %lld Tt %lld C %lld J %lld P %lld are not the ones written",
              (long long)l.n, (long long)l.Ti, (long long)l.Tt, (long long)l.C, (long long)l.J,
              (long long)l.P);
    for (int64_t k = 0; k < l.Ti * 3; k++)
        FZ_ASSERT(l.img_ids[k] == expect(d, own[3], seed, (uint64_t)k),
                  "img_ids[%lld] is %g, %g written", (long long)k, l.img_ids[k],
                  expect(d, own[3], seed, (uint64_t)k));
    for (int64_t k = 0; k < l.Tt * 3; k++)
        FZ_ASSERT(l.txt_ids[k] == expect(d, own[4], seed, (uint64_t)k),
                  "txt_ids[%lld] is %g, %g written", (long long)k, l.txt_ids[k],
                  expect(d, own[4], seed, (uint64_t)k));
    const int64_t nl = l.Ti * l.C, nt = l.Tt * l.J;
    if (nl + nt + l.P <= (1 << 22)) {
        float *lat = malloc((size_t)(nl + nt + l.P) * sizeof(float));
        FZ_ASSERT(lat, "out of memory");
        float *txt = lat + nl, *pooled = txt + nt;
        const int64_t rows[2] = {0, l.n - 1};
        for (int j = 0; j < 2; j++) {
            const int64_t row = rows[j];
            err[0] = 0;
            FZ_ASSERT(tz_latents_read(&l, row, lat, txt, pooled, err, sizeof err) == 0,
                      "row %lld of %lld is refused: %s", (long long)row, (long long)l.n, err);
            for (int64_t k = 0; k < nl; k++)
                FZ_ASSERT(lat[k] == expect(d, own[0], seed, (uint64_t)(row * nl + k)),
                          "latents row %lld [%lld] is %g, %g written", (long long)row, (long long)k,
                          lat[k], expect(d, own[0], seed, (uint64_t)(row * nl + k)));
            for (int64_t k = 0; k < nt; k++)
                FZ_ASSERT(txt[k] == expect(d, own[1], seed, (uint64_t)(row * nt + k)),
                          "txt row %lld [%lld] is %g, %g written", (long long)row, (long long)k,
                          txt[k], expect(d, own[1], seed, (uint64_t)(row * nt + k)));
            for (int64_t k = 0; k < l.P; k++)
                FZ_ASSERT(pooled[k] == expect(d, own[2], seed, (uint64_t)(row * l.P + k)),
                          "pooled row %lld [%lld] is %g, %g written", (long long)row, (long long)k,
                          pooled[k], expect(d, own[2], seed, (uint64_t)(row * l.P + k)));
        }
        free(lat);
    }
    /* out of range: refused before anything is read (one float each: a read would overflow) */
    float one[3];
    const int64_t outside[3] = {l.n, -1, INT64_MAX};
    for (int j = 0; j < 3; j++) {
        err[0] = 0;
        FZ_ASSERT(tz_latents_read(&l, outside[j], one, one + 1, one + 2, err, sizeof err) != 0,
                  "row %lld of %lld is read", (long long)outside[j], (long long)l.n);
        fz_rejected(err, path);
    }
    tz_latents_close(&l);
    FZ_ASSERT(open_count() == 0, "closing leaves %lld HDF5 objects open", (long long)open_count());
    return 0;
}
