/* DiT config.json through jansson: every key read is type- and range-checked with the file
 * and key in the message; written back with every key explicit. Format only. */
#include "io/dit_config.h"

#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/fsutil.h"
#include <sys/stat.h>

#include "core/error.h"
#include "io/atomic_file.h"

typedef struct {
    const char *file;
    json_t *root;
    char *err;
    size_t errlen;
} dc_ctx;

static const char *show(const json_t *v, char *buf, size_t len) {
    if (json_is_integer(v)) snprintf(buf, len, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
    else if (json_is_real(v)) snprintf(buf, len, "%g", json_real_value(v));
    else if (json_is_string(v)) snprintf(buf, len, "\"%.40s\"", json_string_value(v));
    else if (json_is_boolean(v)) snprintf(buf, len, "%s", json_is_true(v) ? "true" : "false");
    else if (json_is_null(v)) snprintf(buf, len, "null");
    else snprintf(buf, len, "%s", json_is_array(v) ? "an array" : "an object");
    return buf;
}

static int bad(dc_ctx *x, const char *key, const json_t *v, const char *expected) {
    char s[96];
    snprintf(x->err, x->errlen, "%s: key \"%s\" is %s, expected %s", x->file, key,
             v ? show(v, s, sizeof s) : "missing", expected);
    return 1;
}

static int get_int(dc_ctx *x, const char *key, int required, int64_t *out) {
    json_t *v = json_object_get(x->root, key);
    if (!v) return required ? bad(x, key, NULL, "a positive integer (required)") : 0;
    if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > (1 << 30))
        return bad(x, key, v, "a positive integer");
    *out = (int64_t)json_integer_value(v);
    return 0;
}

static int get_real(dc_ctx *x, const char *key, double lo, double hi, double *out) {
    json_t *v = json_object_get(x->root, key);
    if (!v) return 0;
    if (!json_is_number(v) || !(json_number_value(v) >= lo && json_number_value(v) < hi)) {
        char want[64];
        snprintf(want, sizeof want, "a number in [%g, %g)", lo, hi);
        return bad(x, key, v, want);
    }
    *out = json_number_value(v);
    return 0;
}

static int parse(dc_ctx *x, tz_dit_config *c) {
    if (!json_is_object(x->root)) {
        snprintf(x->err, x->errlen, "%s: expected a JSON object", x->file);
        return 1;
    }
    json_t *mt = json_object_get(x->root, "model_type");
    if (mt && !(json_is_string(mt) && !strcmp(json_string_value(mt), "dit")))
        return bad(x, "model_type", mt, "\"dit\"");
    if (get_int(x, "input_size", 1, &c->input_size) || get_int(x, "patch_size", 1, &c->patch_size) ||
        get_int(x, "in_channels", 1, &c->in_channels) ||
        get_int(x, "hidden_size", 1, &c->hidden_size) || get_int(x, "depth", 1, &c->depth) ||
        get_int(x, "num_heads", 1, &c->num_heads) || get_int(x, "num_classes", 1, &c->num_classes) ||
        get_int(x, "frequency_embedding_size", 0, &c->frequency_embedding_size))
        return 1;
    if (get_real(x, "mlp_ratio", 1e-3, 1e3, &c->mlp_ratio) ||
        get_real(x, "class_dropout_prob", 0.0, 1.0, &c->class_dropout_prob))
        return 1;
    json_t *ls = json_object_get(x->root, "learn_sigma");
    if (ls && !json_is_boolean(ls)) return bad(x, "learn_sigma", ls, "true or false");
    if (ls) c->learn_sigma = json_is_true(ls);
    json_t *df = json_object_get(x->root, "diffusion");
    if (df) {
        if (!json_is_string(df) || (strcmp(json_string_value(df), "ddpm") &&
                                    strcmp(json_string_value(df), "flow")))
            return bad(x, "diffusion", df, "\"ddpm\" or \"flow\"");
        snprintf(c->diffusion, sizeof c->diffusion, "%s", json_string_value(df));
    }
    return 0;
}

static void defaults(tz_dit_config *c) {
    memset(c, 0, sizeof *c);
    c->frequency_embedding_size = 256;
    c->mlp_ratio = 4.0;
    c->class_dropout_prob = 0.1;
    c->learn_sigma = 1;
    snprintf(c->diffusion, sizeof c->diffusion, "ddpm");
}

int tz_dit_config_read(tz_dit_config *c, const char *path, char *err, size_t errlen) {
    defaults(c);
    struct stat sb;
    char file[1100];
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        snprintf(file, sizeof file, "%s/config.json", path);
    else snprintf(file, sizeof file, "%s", path);
    if (tz_check_regular(file, err, errlen)) return 1;
    json_error_t je;
    json_t *root = json_load_file(file, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        if (je.line < 0) snprintf(err, errlen, "%s: cannot read: %s", file, je.text);
        else snprintf(err, errlen, "%s: not valid JSON: %s (line %d)", file, je.text, je.line);
        return 1;
    }
    dc_ctx x = {file, root, err, errlen};
    int rc = parse(&x, c);
    json_decref(root);
    return rc;
}

/* Shortest text that reads back as the same double, with a '.' or exponent. */
static void fmt_double(char *buf, size_t len, double v) {
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, len, "%.*g", p, v);
        if (strtod(buf, NULL) == v) break;
    }
    if (!strpbrk(buf, ".e")) strncat(buf, ".0", len - strlen(buf) - 1);
}

int tz_dit_config_write(const tz_dit_config *c, const char *path, char *err, size_t errlen) {
    char mlp[40], drop[40], text[1600];
    fmt_double(mlp, sizeof mlp, c->mlp_ratio);
    fmt_double(drop, sizeof drop, c->class_dropout_prob);
    int n = snprintf(text, sizeof text,
        "{\n"
        "  \"architectures\": [\"DiT\"],\n"
        "  \"model_type\": \"dit\",\n"
        "  \"input_size\": %" PRId64 ",\n"
        "  \"patch_size\": %" PRId64 ",\n"
        "  \"in_channels\": %" PRId64 ",\n"
        "  \"hidden_size\": %" PRId64 ",\n"
        "  \"depth\": %" PRId64 ",\n"
        "  \"num_heads\": %" PRId64 ",\n"
        "  \"mlp_ratio\": %s,\n"
        "  \"class_dropout_prob\": %s,\n"
        "  \"num_classes\": %" PRId64 ",\n"
        "  \"learn_sigma\": %s,\n"
        "  \"frequency_embedding_size\": %" PRId64 ",\n"
        "  \"diffusion\": \"%s\"\n"
        "}\n",
        c->input_size, c->patch_size, c->in_channels, c->hidden_size, c->depth, c->num_heads,
        mlp, drop, c->num_classes, c->learn_sigma ? "true" : "false",
        c->frequency_embedding_size, c->diffusion);
    if (n < 0 || (size_t)n >= sizeof text) {
        snprintf(err, errlen, "%s: config text does not fit its buffer", path);
        return 1;
    }
    return tz_atomic_file_put(path, text, (size_t)n, err, errlen);
}
