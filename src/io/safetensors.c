/* safetensors reader: maps files read-only, checks every header entry (types, dtype, shape,
 * offsets, sizes) and sharded indexes before handing out tensors. Writing: _write.c. */
#include "io/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "io/fsutil.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this reader assumes a little-endian host"
#endif

/* Loading state: the reader being filled, capacities, and where errors go. */
typedef struct st_load {
    tz_safetensors *st;
    int64_t cap, metacap;
    char *err;
    size_t errlen;
} st_load;

#define LERR(L, ...) tz_errf((L)->err, (L)->errlen, __VA_ARGS__)

/* A short description of a JSON value for messages: its value when small, else its kind. */
static const char *st_json_show(const json_t *v, char *buf, size_t len) {
    switch (json_typeof(v)) {
    case JSON_INTEGER: snprintf(buf, len, "%" JSON_INTEGER_FORMAT, json_integer_value(v)); break;
    case JSON_REAL: snprintf(buf, len, "%g (not an integer)", json_real_value(v)); break;
    case JSON_STRING: snprintf(buf, len, "the string \"%.40s\"", json_string_value(v)); break;
    case JSON_ARRAY: snprintf(buf, len, "an array of %zu", json_array_size(v)); break;
    case JSON_OBJECT: snprintf(buf, len, "an object"); break;
    case JSON_TRUE: snprintf(buf, len, "true"); break;
    case JSON_FALSE: snprintf(buf, len, "false"); break;
    default: snprintf(buf, len, "null"); break;
    }
    return buf;
}

char *tz_st_shape_str(char *buf, size_t len, int ndim, const int64_t *shape) {
    size_t at = 0;
    if (len == 0) return buf;
    buf[0] = '\0';
    at += (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (at < len) snprintf(buf + at, len - at, "]");
    return buf;
}

/* Maps path and checks the 8-byte header length against the file and the 100 MB limit. */
static int st_map_file(st_load *L, tz_st_file *f, const char *path) {
    f->path = tz_xstrdup(path);
    const char *kind;
    int fd = tz_open_regular(path, &kind); /* a FIFO is refused, not waited on */
    if (fd < 0 && kind)
        return LERR(L, "%s: not a regular file (%s), expected a safetensors file", path, kind);
    if (fd < 0) return LERR(L, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return LERR(L, "%s: cannot stat: %s", path, strerror(e));
    }
    if (sb.st_size < 8) {
        close(fd);
        return LERR(L, "%s: file is %lld bytes, shorter than the 8-byte header length",
                    path, (long long)sb.st_size);
    }
    void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int saved = errno;
    close(fd);
    if (map == MAP_FAILED) return LERR(L, "%s: mmap failed: %s", path, strerror(saved));
    f->map = map;
    f->size = (size_t)sb.st_size;
    const unsigned char *b = (const unsigned char *)map;
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)b[i] << (8 * i);
    if (hlen > TZ_ST_MAX_HEADER_BYTES)
        return LERR(L, "%s: header length %" PRIu64 " is larger than the %" PRIu64
                    "-byte limit (not a safetensors file?)", path, hlen, TZ_ST_MAX_HEADER_BYTES);
    if (hlen > (uint64_t)f->size - 8)
        return LERR(L, "%s: header length %" PRIu64 " runs past the end of the file (%zu bytes,"
                    " so at most %zu)", path, hlen, f->size, f->size - 8);
    f->data_start = 8 + (size_t)hlen;
    return 0;
}

static int st_parse_meta(st_load *L, const tz_st_file *f, json_t *m) {
    char show[96];
    if (json_is_null(m)) return 0;
    if (!json_is_object(m))
        return LERR(L, "%s: \"__metadata__\" is %s, expected an object of strings", f->path,
                    st_json_show(m, show, sizeof show));
    const char *key;
    json_t *v;
    json_object_foreach(m, key, v) {
        if (!json_is_string(v))
            return LERR(L, "%s: \"__metadata__\" key \"%s\" is %s, expected a string", f->path,
                        key, st_json_show(v, show, sizeof show));
        tz_safetensors *st = L->st;
        if (tz_st_metadata(st, key)) continue; /* an earlier shard set it: first file wins */
        if (st->nmeta + 1 > L->metacap) {
            L->metacap = L->metacap ? 2 * L->metacap : 8;
            st->meta = (char **)tz_xrealloc(st->meta, (size_t)L->metacap * 2 * sizeof(char *));
        }
        st->meta[2 * st->nmeta] = tz_xstrdup(key);
        st->meta[2 * st->nmeta + 1] = tz_xstrdup(json_string_value(v));
        st->nmeta++;
    }
    return 0;
}

/* One header entry -> t (name not set). Every field is checked against the file. */
static int st_parse_entry(st_load *L, const tz_st_file *f, const char *name, json_t *v,
                          tz_st_tensor *t) {
    const char *fp = f->path;
    char show[96], sh[256];
    if (!json_is_object(v))
        return LERR(L, "%s: tensor '%s': entry is %s, expected an object with dtype, shape and "
                    "data_offsets", fp, name, st_json_show(v, show, sizeof show));
    json_t *jd = json_object_get(v, "dtype");
    json_t *js = json_object_get(v, "shape");
    json_t *jo = json_object_get(v, "data_offsets");
    if (!jd) return LERR(L, "%s: tensor '%s': missing \"dtype\"", fp, name);
    if (!js) return LERR(L, "%s: tensor '%s': missing \"shape\"", fp, name);
    if (!jo) return LERR(L, "%s: tensor '%s': missing \"data_offsets\"", fp, name);
    if (!json_is_string(jd))
        return LERR(L, "%s: tensor '%s': \"dtype\" is %s, expected a string such as \"BF16\"",
                    fp, name, st_json_show(jd, show, sizeof show));
    if (tz_dtype_from_name(json_string_value(jd), &t->dtype) != 0)
        return LERR(L, "%s: tensor '%s': unknown dtype \"%s\" (expected one of %s)", fp, name,
                    json_string_value(jd), tz_dtype_all_names());
    if (!json_is_array(js))
        return LERR(L, "%s: tensor '%s': \"shape\" is %s, expected an array of non-negative "
                    "integers", fp, name, st_json_show(js, show, sizeof show));
    size_t nd = json_array_size(js);
    if (nd > TZ_ST_MAX_DIMS)
        return LERR(L, "%s: tensor '%s': \"shape\" has %zu dims, at most %d are supported", fp,
                    name, nd, TZ_ST_MAX_DIMS);
    t->ndim = (int)nd;
    int zero = 0;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(js, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return LERR(L, "%s: tensor '%s': \"shape\"[%zu] is %s, expected a non-negative "
                        "integer", fp, name, i, st_json_show(d, show, sizeof show));
        t->shape[i] = (int64_t)json_integer_value(d);
        if (t->shape[i] == 0) zero = 1;
    }
    tz_st_shape_str(sh, sizeof sh, t->ndim, t->shape);
    t->numel = zero ? 0 : 1;
    for (int i = 0; i < t->ndim && !zero; i++) {
        if (t->numel > INT64_MAX / t->shape[i])
            return LERR(L, "%s: tensor '%s': shape %s has more than 2^63 elements", fp, name, sh);
        t->numel *= t->shape[i];
    }
    if (!json_is_array(jo) || json_array_size(jo) != 2)
        return LERR(L, "%s: tensor '%s': \"data_offsets\" is %s, expected [begin, end]", fp, name,
                    st_json_show(jo, show, sizeof show));
    json_t *jb = json_array_get(jo, 0), *je = json_array_get(jo, 1);
    if (!json_is_integer(jb) || !json_is_integer(je) || json_integer_value(jb) < 0 ||
        json_integer_value(je) < 0)
        return LERR(L, "%s: tensor '%s': \"data_offsets\" must be two non-negative integers "
                    "[begin, end]", fp, name);
    uint64_t begin = (uint64_t)json_integer_value(jb), end = (uint64_t)json_integer_value(je);
    uint64_t data_size = (uint64_t)(f->size - f->data_start);
    if (begin > end)
        return LERR(L, "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] has begin > end",
                    fp, name, begin, end);
    if (end > data_size)
        return LERR(L, "%s: tensor '%s': data_offsets end %" PRIu64 " is past the end of the "
                    "data section (%" PRIu64 " bytes)", fp, name, end, data_size);
    uint64_t es = tz_dtype_size(t->dtype);
    if ((uint64_t)t->numel > UINT64_MAX / es || (uint64_t)t->numel * es != end - begin)
        return LERR(L, "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] span %" PRIu64
                    " bytes, but shape %s of %s needs %" PRId64 " x %" PRIu64 " bytes", fp, name,
                    begin, end, end - begin, sh, tz_dtype_name(t->dtype), t->numel, es);
    t->nbytes = (size_t)(end - begin);
    t->data = (const char *)f->map + f->data_start + begin;
    t->file = f->path;
    return 0;
}

/* Parses the JSON header of the mapped file f and appends its tensors. */
static int st_parse_header(st_load *L, const tz_st_file *f) {
    json_error_t je;
    const char *hdr = (const char *)f->map + 8;
    json_t *root = json_loadb(hdr, f->data_start - 8, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return LERR(L, "%s: header is not valid JSON: %s (line %d, column %d)", f->path, je.text,
                    je.line, je.column);
    if (!json_is_object(root)) {
        char show[96];
        tz_errf(L->err, L->errlen, "%s: header is %s, expected a JSON object", f->path,
                st_json_show(root, show, sizeof show));
        json_decref(root);
        return 1;
    }
    tz_safetensors *st = L->st;
    const char *key;
    json_t *v;
    int rc = 0;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "__metadata__") == 0) {
            rc = st_parse_meta(L, f, v);
        } else {
            if (st->count + 1 > L->cap) {
                L->cap = L->cap ? 2 * L->cap : 256;
                st->tensors = (tz_st_tensor *)tz_xrealloc(st->tensors,
                                                          (size_t)L->cap * sizeof(tz_st_tensor));
            }
            tz_st_tensor *t = &st->tensors[st->count];
            memset(t, 0, sizeof *t);
            rc = st_parse_entry(L, f, key, v, t);
            if (rc == 0) {
                t->name = tz_xstrdup(key);
                st->count++;
            }
        }
        if (rc) break;
    }
    json_decref(root);
    return rc;
}

static int st_cmp_tensor(const void *a, const void *b) {
    return strcmp(((const tz_st_tensor *)a)->name, ((const tz_st_tensor *)b)->name);
}

static int st_cmp_place(const void *a, const void *b) {
    const tz_st_tensor *x = *(const tz_st_tensor *const *)a, *y = *(const tz_st_tensor *const *)b;
    int c = strcmp(x->file, y->file);
    if (c) return c;
    return (const char *)x->data < (const char *)y->data ? -1 : (const char *)x->data > (const char *)y->data;
}

/* Rejects two tensors of one file whose data_offsets overlap (empty tensors overlap nothing). */
static int st_check_overlap(st_load *L) {
    tz_safetensors *st = L->st;
    const tz_st_tensor **by = tz_xcalloc((size_t)st->count + 1, sizeof *by);
    int64_t n = 0;
    for (int64_t i = 0; i < st->count; i++)
        if (st->tensors[i].nbytes) by[n++] = &st->tensors[i];
    if (n > 1) qsort(by, (size_t)n, sizeof *by, st_cmp_place);
    int rc = 0;
    for (int64_t i = 1; i < n && !rc; i++) {
        const tz_st_tensor *a = by[i - 1], *b = by[i];
        if (!strcmp(a->file, b->file) && (const char *)a->data + a->nbytes > (const char *)b->data)
            rc = LERR(L, "%s: tensors '%s' and '%s' overlap: their data_offsets share bytes",
                      a->file, a->name, b->name);
    }
    free(by);
    return rc;
}

/* Sorts by name and rejects a name found twice (necessarily in two shards: one header
 * with a repeated key was already rejected by the JSON parser), and overlapping data. */
static int st_finish(st_load *L) {
    tz_safetensors *st = L->st;
    if (st_check_overlap(L)) return 1;
    if (st->count > 1) qsort(st->tensors, (size_t)st->count, sizeof(tz_st_tensor), st_cmp_tensor);
    for (int64_t i = 1; i < st->count; i++) {
        if (strcmp(st->tensors[i - 1].name, st->tensors[i].name) == 0)
            return LERR(L, "%s: tensor '%s' is in two files: %s and %s", st->path,
                        st->tensors[i].name, st->tensors[i - 1].file, st->tensors[i].file);
    }
    return 0;
}

static int st_open_single(st_load *L, const char *path) {
    tz_safetensors *st = L->st;
    st->files = (tz_st_file *)tz_xcalloc(1, sizeof(tz_st_file));
    st->nfiles = 1;
    if (st_map_file(L, &st->files[0], path)) return 1;
    if (st_parse_header(L, &st->files[0])) return 1;
    return st_finish(L);
}

static char *st_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    int slash = a > 0 && dir[a - 1] != '/';
    char *p = (char *)tz_xmalloc(a + (size_t)slash + b + 1);
    memcpy(p, dir, a);
    if (slash) p[a] = '/';
    memcpy(p + a + (size_t)slash, name, b + 1);
    return p;
}

/* Folder of a path ("." when it has none). */
static char *st_dirname(const char *path) {
    const char *s = strrchr(path, '/');
    if (!s) return tz_xstrdup(".");
    size_t n = s == path ? 1 : (size_t)(s - path);
    char *d = (char *)tz_xmalloc(n + 1);
    memcpy(d, path, n);
    d[n] = '\0';
    return d;
}

/* A shard name must stay inside the model folder. */
static int st_shard_name_ok(const char *s) {
    if (!*s || s[0] == '/') return 0;
    for (const char *p = s; *p;) {
        const char *q = strchr(p, '/');
        size_t n = q ? (size_t)(q - p) : strlen(p);
        if (n == 0 || (n == 2 && p[0] == '.' && p[1] == '.')) return 0;
        p += n + (q ? 1 : 0);
    }
    return 1;
}

static int st_cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int st_open_index_json(st_load *L, const char *ipath, json_t *root) {
    char show[96];
    tz_safetensors *st = L->st;
    if (!json_is_object(root))
        return LERR(L, "%s: index is %s, expected a JSON object with \"weight_map\"", ipath,
                    st_json_show(root, show, sizeof show));
    json_t *wm = json_object_get(root, "weight_map");
    if (!wm) return LERR(L, "%s: missing \"weight_map\" (tensor name -> shard file)", ipath);
    if (!json_is_object(wm) || json_object_size(wm) == 0)
        return LERR(L, "%s: \"weight_map\" is %s, expected a non-empty object of tensor name -> "
                    "shard file", ipath, st_json_show(wm, show, sizeof show));
    size_t nw = json_object_size(wm), n = 0;
    const char **names = (const char **)tz_xmalloc(nw * sizeof(char *));
    const char *key;
    json_t *v;
    json_object_foreach(wm, key, v) {
        if (!json_is_string(v) || !st_shard_name_ok(json_string_value(v))) {
            free(names);
            return LERR(L, "%s: weight_map entry for tensor '%s' is %s, expected the name of a "
                        "shard file in the model folder", ipath, key,
                        st_json_show(v, show, sizeof show));
        }
        names[n++] = json_string_value(v);
    }
    qsort(names, n, sizeof(char *), st_cmp_str);
    size_t nshards = 0;
    for (size_t i = 0; i < n; i++)
        if (i == 0 || strcmp(names[i], names[i - 1]) != 0) names[nshards++] = names[i];
    char *dir = st_dirname(ipath);
    st->files = (tz_st_file *)tz_xcalloc(nshards, sizeof(tz_st_file));
    int rc = 0;
    for (size_t i = 0; i < nshards && rc == 0; i++) {
        char *full = st_join(dir, names[i]);
        struct stat sb;
        if (stat(full, &sb) != 0) {
            const char *who = "?";
            json_object_foreach(wm, key, v) {
                if (strcmp(json_string_value(v), names[i]) == 0) {
                    who = key;
                    break;
                }
            }
            rc = LERR(L, "%s: weight_map names shard '%s' (for tensor '%s'), but %s cannot be "
                      "opened: %s", ipath, names[i], who, full, strerror(errno));
        } else {
            st->nfiles++;
            rc = st_map_file(L, &st->files[i], full);
            if (rc == 0) rc = st_parse_header(L, &st->files[i]);
        }
        free(full);
    }
    free(names);
    if (rc == 0) rc = st_finish(L);
    /* Each weight_map entry must be found in the shard it names. */
    json_object_foreach(wm, key, v) {
        if (rc) break;
        const tz_st_tensor *t = tz_st_find(st, key);
        char *full = st_join(dir, json_string_value(v));
        if (!t)
            rc = LERR(L, "%s: weight_map puts tensor '%s' in shard '%s', but no file has it", ipath,
                      key, json_string_value(v));
        else if (strcmp(t->file, full) != 0)
            rc = LERR(L, "%s: weight_map puts tensor '%s' in shard '%s', but it is in %s", ipath,
                      key, json_string_value(v), t->file);
        free(full);
    }
    free(dir);
    return rc;
}

static int st_open_index(st_load *L, const char *ipath) {
    json_error_t je;
    char rerr[600];
    size_t n;
    char *text = tz_read_file(ipath, &n, rerr, sizeof rerr);
    if (!text) return LERR(L, "%s (the safetensors index)", rerr);
    json_t *root = json_loadb(text, n, JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (!root)
        return LERR(L, "%s: index is not valid JSON: %s (line %d, column %d)", ipath, je.text,
                    je.line, je.column);
    int rc = st_open_index_json(L, ipath, root);
    json_decref(root);
    return rc;
}

static int st_ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

int tz_st_open(tz_safetensors *st, const char *path, char *err, size_t errlen) {
    memset(st, 0, sizeof *st);
    if (err && errlen) err[0] = '\0';
    if (!path || !*path) {
        tz_errf(err, errlen, "(empty path): no safetensors file or model folder given");
        return 1;
    }
    st_load L = {st, 0, 0, err, errlen};
    st->path = tz_xstrdup(path);
    struct stat sb;
    int rc;
    if (stat(path, &sb) != 0) {
        rc = LERR(&L, "%s: cannot open: %s", path, strerror(errno));
    } else if (S_ISDIR(sb.st_mode)) {
        /* transformers' names, then diffusers' (a pipeline component's folder) */
        static const char *const base[2] = {"model", "diffusion_pytorch_model"};
        rc = -2;
        for (int k = 0; k < 2 && rc == -2; k++) {
            char name[64];
            snprintf(name, sizeof name, "%s.safetensors", base[k]);
            char *single = st_join(path, name);
            snprintf(name, sizeof name, "%s.safetensors.index.json", base[k]);
            char *index = st_join(path, name);
            if (stat(single, &sb) == 0) rc = st_open_single(&L, single);
            else if (stat(index, &sb) == 0) rc = st_open_index(&L, index);
            free(single);
            free(index);
        }
        if (rc == -2)
            rc = LERR(&L, "%s: folder has neither model.safetensors nor "
                      "model.safetensors.index.json (nor diffusers' "
                      "diffusion_pytorch_model.safetensors or its index)", path);
    } else if (st_ends_with(path, ".json")) {
        rc = st_open_index(&L, path);
    } else {
        rc = st_open_single(&L, path);
    }
    if (rc) tz_st_close(st);
    return rc;
}

void tz_st_close(tz_safetensors *st) {
    for (int i = 0; i < st->nfiles; i++) {
        if (st->files[i].map) munmap(st->files[i].map, st->files[i].size);
        free(st->files[i].path);
    }
    free(st->files);
    for (int64_t i = 0; i < st->count; i++) free((void *)st->tensors[i].name);
    free(st->tensors);
    for (int64_t i = 0; i < 2 * st->nmeta; i++) free(st->meta[i]);
    free(st->meta);
    free(st->path);
    memset(st, 0, sizeof *st);
}

const tz_st_tensor *tz_st_find(const tz_safetensors *st, const char *name) {
    int64_t lo = 0, hi = st->count;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(st->tensors[mid].name, name);
        if (c == 0) return &st->tensors[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

const char *tz_st_metadata(const tz_safetensors *st, const char *key) {
    for (int64_t i = 0; i < st->nmeta; i++)
        if (strcmp(st->meta[2 * i], key) == 0) return st->meta[2 * i + 1];
    return NULL;
}

int tz_st_tensor_to_f32(const tz_st_tensor *t, float *out, char *err, size_t errlen) {
    if (tz_dtype_to_f32(t->dtype, t->data, out, t->numel) != 0) {
        tz_errf(err, errlen, "%s: tensor '%s' has dtype %s; only F32, F16 and BF16 convert to "
                "fp32", t->file, t->name, tz_dtype_name(t->dtype));
        return 1;
    }
    for (int64_t i = 0; i < t->numel; i++)
        if (!isfinite(out[i])) {
            tz_errf(err, errlen, "%s: tensor '%s': element %" PRId64 " is %s: the file holds a "
                    "non-finite value", t->file, t->name, i, isnan(out[i]) ? "NaN" : "Inf");
            return 1;
        }
    return 0;
}

int tz_st_read_f32(const tz_safetensors *st, const char *name, float *out, int ndim,
                   const int64_t *shape, char *err, size_t errlen) {
    const tz_st_tensor *t = tz_st_find(st, name);
    if (!t) {
        tz_errf(err, errlen, "%s: tensor '%s' not found (%" PRId64 " tensors present)", st->path,
                name, st->count);
        return 1;
    }
    int same = ndim == t->ndim;
    for (int i = 0; same && i < ndim; i++) same = shape[i] == t->shape[i];
    if (!same) {
        char got[256], want[256];
        int wn = ndim < 0 ? 0 : (ndim > TZ_ST_MAX_DIMS ? TZ_ST_MAX_DIMS : ndim);
        tz_errf(err, errlen, "%s: tensor '%s' has shape %s, expected %s", t->file, name,
                tz_st_shape_str(got, sizeof got, t->ndim, t->shape),
                tz_st_shape_str(want, sizeof want, wn, shape));
        return 1;
    }
    return tz_st_tensor_to_f32(t, out, err, errlen);
}

/* ---- identity ---- */

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}

uint64_t tz_st_digest(const tz_safetensors *st) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (int64_t i = 0; i < st->count; i++) { /* sorted by name: any sharding gives the same */
        const tz_st_tensor *t = &st->tensors[i];
        h = fnv1a(h, t->name, strlen(t->name) + 1);
        const int64_t head[2] = {(int64_t)t->dtype, t->ndim};
        h = fnv1a(h, head, sizeof head);
        h = fnv1a(h, t->shape, (size_t)t->ndim * sizeof t->shape[0]);
        const size_t k = t->nbytes < 64 ? t->nbytes : 64, at[3] = {0, t->nbytes / 2, t->nbytes - k};
        for (int j = 0; j < 3 && k; j++) {
            const size_t off = at[j] + k <= t->nbytes ? at[j] : t->nbytes - k;
            h = fnv1a(h, (const char *)t->data + off, k);
        }
    }
    return h;
}

uint64_t tz_st_identity_of(const tz_safetensors *st) {
    const char *src = tz_st_metadata(st, TZ_ST_SOURCE_KEY);
    char *end = NULL;
    if (src && strlen(src) == 16) {
        uint64_t v = strtoull(src, &end, 16);
        if (end && *end == 0) return v;
    }
    return tz_st_digest(st);
}

int tz_st_identity(const char *path, uint64_t *id, char *err, size_t errlen) {
    tz_safetensors st;
    if (tz_st_open(&st, path, err, errlen)) return -1;
    *id = tz_st_identity_of(&st);
    tz_st_close(&st);
    return 0;
}
