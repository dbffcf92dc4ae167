/* safetensors writer: collects (name, dtype, shape, borrowed data) and metadata pairs, then
 * writes the standard layout atomically (tmp + fsync + rename). Reading is safetensors.c. */
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"

void tz_st_writer_init(tz_st_writer *w) { memset(w, 0, sizeof *w); }

void tz_st_writer_free(tz_st_writer *w) {
    for (int64_t i = 0; i < w->count; i++) free(w->entries[i].name);
    free(w->entries);
    for (int64_t i = 0; i < 2 * w->nmeta; i++) free(w->meta[i]);
    free(w->meta);
    memset(w, 0, sizeof *w);
}

int tz_st_writer_add(tz_st_writer *w, const char *name, enum tz_dtype dtype, int ndim,
                     const int64_t *shape, const void *data, char *err, size_t errlen) {
    if (!name || !*name || strcmp(name, "__metadata__") == 0) {
        tz_errf(err, errlen, "tensor name '%s' is not allowed (empty or reserved)",
                name ? name : "(null)");
        return 1;
    }
    size_t es = tz_dtype_size(dtype);
    if (es == 0) {
        tz_errf(err, errlen, "tensor '%s': dtype %d is not a known dtype", name, (int)dtype);
        return 1;
    }
    if (ndim < 0 || ndim > TZ_ST_MAX_DIMS || (ndim > 0 && !shape)) {
        tz_errf(err, errlen, "tensor '%s': ndim %d, expected 0..%d with a shape", name, ndim,
                TZ_ST_MAX_DIMS);
        return 1;
    }
    uint64_t numel = 1;
    int zero = 0;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) {
            tz_errf(err, errlen, "tensor '%s': shape[%d] is %" PRId64 ", expected >= 0", name, i,
                    shape[i]);
            return 1;
        }
        if (shape[i] == 0) zero = 1;
    }
    for (int i = 0; i < ndim && !zero; i++) {
        if (numel > (uint64_t)INT64_MAX / es / (uint64_t)shape[i]) {
            tz_errf(err, errlen, "tensor '%s': shape is too large to store", name);
            return 1;
        }
        numel *= (uint64_t)shape[i];
    }
    if (zero) numel = 0;
    if (numel > 0 && !data) {
        tz_errf(err, errlen, "tensor '%s': no data for %" PRIu64 " elements", name, numel);
        return 1;
    }
    if (w->count + 1 > w->cap) {
        w->cap = w->cap ? 2 * w->cap : 64;
        w->entries = (tz_st_wentry *)tz_xrealloc(w->entries, (size_t)w->cap * sizeof(tz_st_wentry));
    }
    tz_st_wentry *e = &w->entries[w->count++];
    memset(e, 0, sizeof *e);
    e->name = tz_xstrdup(name);
    e->dtype = dtype;
    e->ndim = ndim;
    for (int i = 0; i < ndim; i++) e->shape[i] = shape[i];
    e->nbytes = (size_t)(numel * es);
    e->data = data;
    return 0;
}

void tz_st_writer_set_metadata(tz_st_writer *w, const char *key, const char *value) {
    for (int64_t i = 0; i < w->nmeta; i++) {
        if (strcmp(w->meta[2 * i], key) == 0) {
            free(w->meta[2 * i + 1]);
            w->meta[2 * i + 1] = tz_xstrdup(value);
            return;
        }
    }
    if (w->nmeta + 1 > w->metacap) {
        w->metacap = w->metacap ? 2 * w->metacap : 8;
        w->meta = (char **)tz_xrealloc(w->meta, (size_t)w->metacap * 2 * sizeof(char *));
    }
    w->meta[2 * w->nmeta] = tz_xstrdup(key);
    w->meta[2 * w->nmeta + 1] = tz_xstrdup(value);
    w->nmeta++;
}

static int sw_cmp_name(const void *a, const void *b) {
    return strcmp(((const tz_st_wentry *)a)->name, ((const tz_st_wentry *)b)->name);
}

/* The reference writer's order: larger elements first, then by name, so that every tensor
 * starts at a multiple of its element size (the data section starts 8-aligned). */
static int sw_cmp_layout(const void *a, const void *b) {
    const tz_st_wentry *x = (const tz_st_wentry *)a, *y = (const tz_st_wentry *)b;
    size_t sx = tz_dtype_size(x->dtype), sy = tz_dtype_size(y->dtype);
    if (sx != sy) return sx > sy ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* The JSON header (unpadded), or NULL with err set. Entries are already in layout order. */
static char *sw_header(const tz_st_writer *w, const char *path, char *err, size_t errlen) {
    json_t *root = json_object();
    if (w->nmeta > 0) {
        json_t *m = json_object();
        json_object_set_new(root, "__metadata__", m);
        for (int64_t i = 0; i < w->nmeta; i++) {
            json_t *s = json_string(w->meta[2 * i + 1]);
            if (!s || json_object_set_new(m, w->meta[2 * i], s) != 0) {
                tz_errf(err, errlen, "%s: metadata key '%s' or its value is not valid UTF-8", path,
                        w->meta[2 * i]);
                json_decref(root);
                return NULL;
            }
        }
    }
    uint64_t off = 0;
    for (int64_t i = 0; i < w->count; i++) {
        const tz_st_wentry *e = &w->entries[i];
        json_t *t = json_object(), *shape = json_array(), *offs = json_array();
        json_object_set_new(t, "dtype", json_string(tz_dtype_name(e->dtype)));
        for (int d = 0; d < e->ndim; d++) json_array_append_new(shape, json_integer(e->shape[d]));
        json_object_set_new(t, "shape", shape);
        json_array_append_new(offs, json_integer((json_int_t)off));
        json_array_append_new(offs, json_integer((json_int_t)(off + e->nbytes)));
        json_object_set_new(t, "data_offsets", offs);
        off += e->nbytes;
        if (json_object_set_new(root, e->name, t) != 0) {
            tz_errf(err, errlen, "%s: tensor name '%s' is not valid UTF-8", path, e->name);
            json_decref(root);
            return NULL;
        }
    }
    char *s = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!s) tz_errf(err, errlen, "%s: could not encode the JSON header", path);
    return s;
}

/* 0 when every value of a floating entry is finite; else a message naming the tensor. */
static int sw_check_finite(const tz_st_wentry *e, const char *path, char *err, size_t errlen) {
    if (e->dtype != TZ_DT_F32 && e->dtype != TZ_DT_F16 && e->dtype != TZ_DT_BF16) return 0;
    size_t es = tz_dtype_size(e->dtype);
    int64_t n = (int64_t)(e->nbytes / es);
    float buf[1024];
    for (int64_t at = 0; at < n; at += 1024) {
        int64_t k = n - at < 1024 ? n - at : 1024;
        if (tz_dtype_to_f32(e->dtype, (const char *)e->data + (size_t)at * es, buf, k)) return 0;
        for (int64_t i = 0; i < k; i++)
            if (!isfinite(buf[i])) {
                tz_errf(err, errlen, "%s: tensor '%s': element %" PRId64 " is %s: refusing to save "
                        "a non-finite value (the training diverged or the input held one)",
                        path, e->name, at + i, isnan(buf[i]) ? "NaN" : "Inf");
                return 1;
            }
    }
    return 0;
}

int tz_st_writer_save(tz_st_writer *w, const char *path, char *err, size_t errlen) {
    for (int64_t i = 0; i < w->count; i++)
        if (!w->allow_nonfinite && sw_check_finite(&w->entries[i], path, err, errlen)) return 1;
    if (w->count > 1) qsort(w->entries, (size_t)w->count, sizeof(tz_st_wentry), sw_cmp_name);
    for (int64_t i = 1; i < w->count; i++) {
        if (strcmp(w->entries[i - 1].name, w->entries[i].name) == 0) {
            tz_errf(err, errlen, "%s: tensor '%s' was added twice", path, w->entries[i].name);
            return 1;
        }
    }
    if (w->count > 1) qsort(w->entries, (size_t)w->count, sizeof(tz_st_wentry), sw_cmp_layout);
    char *hdr = sw_header(w, path, err, errlen);
    if (!hdr) return 1;
    size_t hlen = strlen(hdr), padded = (hlen + 7) & ~(size_t)7;
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    static const char spaces[8] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};

    tz_atomic_file f;
    int rc = tz_atomic_file_open(&f, path, err, errlen);
    if (rc == 0) rc = tz_atomic_file_write(&f, len8, 8, err, errlen);
    if (rc == 0) rc = tz_atomic_file_write(&f, hdr, hlen, err, errlen);
    if (rc == 0) rc = tz_atomic_file_write(&f, spaces, padded - hlen, err, errlen);
    for (int64_t i = 0; i < w->count && rc == 0; i++)
        if (w->entries[i].nbytes > 0)
            rc = tz_atomic_file_write(&f, w->entries[i].data, w->entries[i].nbytes, err, errlen);
    free(hdr);
    if (rc == 0) return tz_atomic_file_commit(&f, err, errlen);
    if (f.path) tz_atomic_file_abort(&f);
    return rc;
}
