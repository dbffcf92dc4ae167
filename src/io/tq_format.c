/* Quantized tensors in safetensors: the "turbozero_quant" metadata (parse, check, write) and
 * the checks of each NAME.tq_codes / NAME.tq_scales pair. No quantization math, no models. */
#include "io/tq_format.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

#define META "__metadata__ \"" TZ_TQF_META_KEY "\""

static const char *codebook_name(int method) {
    return method == TZ_TQ_ABSMAX ? "uniform" : "lloyd-max-gaussian";
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n > k && !strcmp(s + n - k, suffix);
}

int tz_tqf_is_part(const char *name) {
    return ends_with(name, TZ_TQF_CODES) || ends_with(name, TZ_TQF_SCALES);
}

void tz_tqf_free(tz_tqf *q) {
    for (int64_t i = 0; i < q->n; i++) free(q->e[i].name);
    free(q->e);
    memset(q, 0, sizeof *q);
}

static int cmp_entry(const void *a, const void *b) {
    return strcmp(((const tz_tqf_entry *)a)->name, ((const tz_tqf_entry *)b)->name);
}

const tz_tqf_entry *tz_tqf_find(const tz_tqf *q, const char *name) {
    if (!q->n) return NULL;
    tz_tqf_entry key = {.name = (char *)name};
    return bsearch(&key, q->e, (size_t)q->n, sizeof *q->e, cmp_entry);
}

/* An integer member of obj in [lo, hi] into out; where names the object in messages. */
static int get_int(const json_t *obj, const char *key, int64_t lo, int64_t hi, int64_t *out,
                   const char *file, const char *where, char *err, size_t errlen) {
    const json_t *v = json_object_get(obj, key);
    if (!v || !json_is_integer(v))
        return tz_errf(err, errlen, "%s: %s: %s\"%s\" is %s, expected an integer", file, META,
                       where, key, v ? "not an integer" : "missing");
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return tz_errf(err, errlen, "%s: %s: %s%s %" JSON_INTEGER_FORMAT " out of range (%" PRId64
                       "..%" PRId64 ")", file, META, where, key, x, lo, hi);
    *out = (int64_t)x;
    return 0;
}

static int check_group(int64_t g, int64_t cols, const char *file, const char *where, char *err,
                       size_t errlen) {
    if (g != 64 && g != 128 && g != 256)
        return tz_errf(err, errlen, "%s: %s: %sgroup %" PRId64 " is not 64, 128 or 256", file,
                       META, where, g);
    if (cols % g)
        return tz_errf(err, errlen, "%s: %s: %sgroup %" PRId64 " does not divide the row length %"
                       PRId64, file, META, where, g, cols);
    return 0;
}

/* Finds NAME+suffix with dtype and shape [rows, width]. */
static int find_part(const tz_safetensors *st, const tz_tqf_entry *e, const char *suffix,
                     enum tz_dtype dt, int64_t width, const char *what,
                     const tz_st_tensor **out, const char *file, char *err, size_t errlen) {
    char name[600], got[128], want[128];
    snprintf(name, sizeof name, "%s%s", e->name, suffix);
    const tz_st_tensor *t = tz_st_find(st, name);
    if (!t)
        return tz_errf(err, errlen, "%s: tensor %s: missing (%s lists %s)", file, name, META,
                       e->name);
    if (t->dtype != dt)
        return tz_errf(err, errlen, "%s: tensor %s: dtype %s, expected %s", t->file, name,
                       tz_dtype_name(t->dtype), tz_dtype_name(dt));
    int64_t shape[2] = {e->rows, width};
    if (t->ndim != 2 || t->shape[0] != e->rows || t->shape[1] != width)
        return tz_errf(err, errlen, "%s: tensor %s: shape %s, expected %s (%s)", t->file, name,
                       tz_st_shape_str(got, sizeof got, t->ndim, t->shape),
                       tz_st_shape_str(want, sizeof want, 2, shape), what);
    *out = t;
    return 0;
}

/* One "NAME": {"shape", "bits", "group"} member into e, checked against st. */
static int read_entry(const tz_safetensors *st, const char *name, const json_t *v,
                      tz_tqf_entry *e, const char *file, char *err, size_t errlen) {
    char where[400], what[200];
    snprintf(where, sizeof where, "tensor %s: ", name);
    if (!json_is_object(v))
        return tz_errf(err, errlen, "%s: %s: %sexpected an object", file, META, where);
    e->name = tz_xstrdup(name);
    const json_t *shape = json_object_get(v, "shape");
    if (!json_is_array(shape) || json_array_size(shape) != 2 ||
        !json_is_integer(json_array_get(shape, 0)) || !json_is_integer(json_array_get(shape, 1)) ||
        json_integer_value(json_array_get(shape, 0)) <= 0 ||
        json_integer_value(json_array_get(shape, 1)) <= 0)
        return tz_errf(err, errlen, "%s: %s: %s\"shape\" is not [rows, cols] of positive integers",
                       file, META, where);
    e->rows = (int64_t)json_integer_value(json_array_get(shape, 0));
    e->cols = (int64_t)json_integer_value(json_array_get(shape, 1));
    if (e->rows > (INT64_C(1) << 40) / e->cols)
        return tz_errf(err, errlen, "%s: %s: %sshape [%" PRId64 ", %" PRId64 "] too large", file,
                       META, where, e->rows, e->cols);
    int64_t bits, group;
    if (get_int(v, "bits", 1, TZ_TQ_MAX_BITS, &bits, file, where, err, errlen) ||
        get_int(v, "group", 0, INT32_MAX, &group, file, where, err, errlen) ||
        check_group(group, e->cols, file, where, err, errlen))
        return 1;
    e->bits = (int)bits;
    e->group = (int)group;
    snprintf(what, sizeof what, "%" PRId64 " x %" PRId64 " codes of %d bits", e->rows, e->cols,
             e->bits);
    if (find_part(st, e, TZ_TQF_CODES, TZ_DT_U8, e->cols / 8 * e->bits, what, &e->codes, file,
                  err, errlen))
        return 1;
    snprintf(what, sizeof what, "one bf16 scale per group of %d", e->group);
    if (find_part(st, e, TZ_TQF_SCALES, TZ_DT_BF16, e->cols / e->group, what, &e->scales, file,
                  err, errlen))
        return 1;
    if (tz_st_find(st, name))
        return tz_errf(err, errlen, "%s: tensor %s: stored both dense and quantized", file, name);
    return 0;
}

static int read_meta(tz_tqf *q, const tz_safetensors *st, const json_t *root, const char *file,
                     char *err, size_t errlen) {
    int64_t v;
    const char *s;
    if (!json_is_object(root))
        return tz_errf(err, errlen, "%s: %s is not a JSON object", file, META);
    if (get_int(root, "version", TZ_TQF_VERSION, TZ_TQF_VERSION, &v, file, "", err, errlen))
        return 1;
    s = json_string_value(json_object_get(root, "method"));
    if (!s || tz_tq_method_from_name(s, &q->method))
        return tz_errf(err, errlen, "%s: %s: \"method\" is %s%s%s, expected \"turboquant\" or "
                       "\"absmax\"", file, META, s ? "\"" : "", s ? s : "not a string",
                       s ? "\"" : "");
    s = json_string_value(json_object_get(root, "codebook"));
    if (!s || strcmp(s, codebook_name(q->method)))
        return tz_errf(err, errlen, "%s: %s: \"codebook\" is %s, expected \"%s\" for %s", file,
                       META, s ? s : "not a string", codebook_name(q->method),
                       tz_tq_method_name(q->method));
    s = json_string_value(json_object_get(root, "scale_dtype"));
    if (!s || strcmp(s, "bf16"))
        return tz_errf(err, errlen, "%s: %s: \"scale_dtype\" is %s, expected \"bf16\"", file, META,
                       s ? s : "not a string");
    if (get_int(root, "bits", 1, TZ_TQ_MAX_BITS, &v, file, "", err, errlen)) return 1;
    q->bits = (int)v;
    if (get_int(root, "group", 0, INT32_MAX, &v, file, "", err, errlen) ||
        check_group(v, v, file, "", err, errlen))
        return 1;
    q->group = (int)v;
    if (get_int(root, "seed", 0, INT64_MAX, &v, file, "", err, errlen)) return 1;
    q->seed = (uint64_t)v;
    const json_t *ts = json_object_get(root, "tensors");
    if (!json_is_object(ts) || json_object_size(ts) == 0)
        return tz_errf(err, errlen, "%s: %s: \"tensors\" is not a non-empty object", file, META);
    q->e = tz_xcalloc(json_object_size(ts), sizeof *q->e);
    const char *name;
    json_t *val;
    json_object_foreach((json_t *)ts, name, val) {
        if (read_entry(st, name, val, &q->e[q->n++], file, err, errlen)) return 1;
    }
    qsort(q->e, (size_t)q->n, sizeof *q->e, cmp_entry);
    return 0;
}

int tz_tqf_read(tz_tqf *q, const tz_safetensors *st, char *err, size_t errlen) {
    memset(q, 0, sizeof *q);
    const char *file = st->nfiles ? st->files[0].path : st->path;
    const char *text = tz_st_metadata(st, TZ_TQF_META_KEY);
    int rc = 0;
    if (text) {
        json_error_t je;
        json_t *root = json_loads(text, 0, &je);
        if (!root) {
            rc = tz_errf(err, errlen, "%s: %s is not valid JSON: %s (column %d)", file, META,
                         je.text, je.column);
        } else {
            q->present = 1;
            rc = read_meta(q, st, root, file, err, errlen);
            json_decref(root);
        }
    }
    /* every codes/scales tensor must belong to a listed weight */
    for (int64_t i = 0; !rc && i < st->count; i++) {
        const char *n = st->tensors[i].name;
        if (!tz_tqf_is_part(n)) continue;
        char base[600];
        size_t cut = strlen(n) - strlen(ends_with(n, TZ_TQF_CODES) ? TZ_TQF_CODES : TZ_TQF_SCALES);
        snprintf(base, sizeof base, "%.*s", (int)cut, n);
        if (!tz_tqf_find(q, base))
            rc = tz_errf(err, errlen, "%s: tensor %s: quantized data that %s does not list%s",
                         st->tensors[i].file, n, META, text ? "" : " (there is no such metadata)");
    }
    if (rc) tz_tqf_free(q);
    return rc;
}

int tz_tqf_load(const tz_tqf *q, const tz_tqf_entry *e, tz_tq_tensor *t, char *err,
                size_t errlen) {
    if (tz_tq_tensor_init(t, e->bits, e->group, e->rows, e->cols, q->seed, err, errlen))
        return 1;
    memcpy(t->codes, e->codes->data, e->codes->nbytes);
    memcpy(t->scales, e->scales->data, e->scales->nbytes); /* little-endian bf16 bits */
    int64_t ns = (int64_t)(e->scales->nbytes / 2);
    for (int64_t i = 0; i < ns; i++)
        if ((t->scales[i] & 0x7f80) == 0x7f80) { /* exponent all ones: Inf or NaN */
            tz_errf(err, errlen, "%s: tensor '%s': scale %" PRId64 " is %s: the file holds a "
                    "non-finite value", e->scales->file, e->scales->name, i,
                    (t->scales[i] & 0x7f) ? "NaN" : "Inf");
            tz_tq_tensor_free(t);
            return 1;
        }
    return 0;
}

int tz_tqf_writer_add(tz_st_writer *w, const char *name, const tz_tq_tensor *t, char *err,
                      size_t errlen) {
    char n[600];
    int64_t cshape[2] = {t->rows, tz_tq_codes_bytes(1, t->cols, t->bits)};
    int64_t sshape[2] = {t->rows, t->cols / t->group};
    snprintf(n, sizeof n, "%s%s", name, TZ_TQF_CODES);
    if (tz_st_writer_add(w, n, TZ_DT_U8, 2, cshape, t->codes, err, errlen)) return 1;
    snprintf(n, sizeof n, "%s%s", name, TZ_TQF_SCALES);
    return tz_st_writer_add(w, n, TZ_DT_BF16, 2, sshape, t->scales, err, errlen);
}

char *tz_tqf_meta_json(int method, int bits, int group, uint64_t seed,
                       const char *const *names, const tz_tq_tensor *const *ts, int64_t n) {
    json_t *root = json_object(), *tensors = json_object();
    json_object_set_new(root, "version", json_integer(TZ_TQF_VERSION));
    json_object_set_new(root, "method", json_string(tz_tq_method_name(method)));
    json_object_set_new(root, "codebook", json_string(codebook_name(method)));
    json_object_set_new(root, "scale_dtype", json_string("bf16"));
    json_object_set_new(root, "bits", json_integer(bits));
    json_object_set_new(root, "group", json_integer(group));
    json_object_set_new(root, "seed", json_integer((json_int_t)seed));
    for (int64_t i = 0; i < n; i++) {
        json_t *e = json_object();
        json_object_set_new(e, "shape", json_pack("[II]", (json_int_t)ts[i]->rows,
                                                  (json_int_t)ts[i]->cols));
        json_object_set_new(e, "bits", json_integer(ts[i]->bits));
        json_object_set_new(e, "group", json_integer(ts[i]->group));
        json_object_set_new(tensors, names[i], e);
    }
    json_object_set_new(root, "tensors", tensors);
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!s) TZ_FATAL("cannot format the quantization metadata");
    return s;
}
