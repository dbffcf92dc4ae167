/* HF Llama config.json: parse with jansson into tz_hf_llama, checking every key it uses
 * (type, sign, divisibility, unsupported features), and write one back atomically. */
#include "io/hf_config.h"

#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/fsutil.h"

typedef struct hf_ctx {
    const char *file;
    json_t *root;
    char *err;
    size_t errlen;
} hf_ctx;

#define HERR(X, ...) tz_errf((X)->err, (X)->errlen, __VA_ARGS__)

static const char *hf_show(const json_t *v, char *buf, size_t len) {
    switch (json_typeof(v)) {
    case JSON_INTEGER: snprintf(buf, len, "%" JSON_INTEGER_FORMAT, json_integer_value(v)); break;
    case JSON_REAL: snprintf(buf, len, "the real number %g", json_real_value(v)); break;
    case JSON_STRING: snprintf(buf, len, "the string \"%.40s\"", json_string_value(v)); break;
    case JSON_ARRAY: snprintf(buf, len, "an array"); break;
    case JSON_OBJECT: snprintf(buf, len, "an object"); break;
    case JSON_TRUE: snprintf(buf, len, "true"); break;
    case JSON_FALSE: snprintf(buf, len, "false"); break;
    default: snprintf(buf, len, "null"); break;
    }
    return buf;
}


/* A positive integer. Absent: error when required, else *out unchanged; null counts as
 * absent only where null_ok (HF treats a null head_dim or num_key_value_heads as unset). */
static int hf_int(hf_ctx *x, const char *key, int required, int null_ok, int64_t *out) {
    char show[96];
    json_t *v = json_object_get(x->root, key);
    if (!v || (null_ok && json_is_null(v))) {
        if (required) return HERR(x, "%s: key \"%s\" is missing (required, a positive integer)",
                                  x->file, key);
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) <= 0)
        return HERR(x, "%s: key \"%s\" is %s, expected a positive integer", x->file, key,
                    hf_show(v, show, sizeof show));
    *out = (int64_t)json_integer_value(v);
    return 0;
}

/* A positive finite number (integer or real); absent leaves the default. */
static int hf_real(hf_ctx *x, const char *key, double *out) {
    char show[96];
    json_t *v = json_object_get(x->root, key);
    if (!v) return 0;
    if (!json_is_number(v) || !(json_number_value(v) > 0) || !isfinite(json_number_value(v)))
        return HERR(x, "%s: key \"%s\" is %s, expected a positive number", x->file, key,
                    hf_show(v, show, sizeof show));
    *out = json_number_value(v);
    return 0;
}

static int hf_bool(hf_ctx *x, const char *key, int *out) {
    char show[96];
    json_t *v = json_object_get(x->root, key);
    if (!v) return 0;
    if (!json_is_boolean(v))
        return HERR(x, "%s: key \"%s\" is %s, expected true or false", x->file, key,
                    hf_show(v, show, sizeof show));
    *out = json_is_true(v);
    return 0;
}

/* A string that fits buf (absent or null: buf unchanged). *found says whether it was set. */
static int hf_str(hf_ctx *x, const char *key, char *buf, size_t len, int *found) {
    char show[96];
    json_t *v = json_object_get(x->root, key);
    if (found) *found = 0;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v))
        return HERR(x, "%s: key \"%s\" is %s, expected a string", x->file, key,
                    hf_show(v, show, sizeof show));
    if (strlen(json_string_value(v)) >= len)
        return HERR(x, "%s: key \"%s\" is \"%.40s\", expected a string of at most %zu characters",
                    x->file, key, json_string_value(v), len - 1);
    snprintf(buf, len, "%s", json_string_value(v));
    if (found) *found = 1;
    return 0;
}

/* The model_types read here. */
static int hf_known_type(const char *t) {
    return !strcmp(t, "llama") || !strcmp(t, "mistral") || !strcmp(t, "qwen2") ||
           !strcmp(t, "qwen3");
}

/* A Llama feature this program does not implement: absent, null or false is fine. */
static int hf_unsupported_flag(hf_ctx *x, const char *key, const char *what) {
    int on = 0;
    if (hf_bool(x, key, &on)) return 1;
    if (on) return HERR(x, "%s: key \"%s\" is true, expected false (%s is not supported)",
                        x->file, key, what);
    return 0;
}

/* rope_scaling: null, absent or rope_type "default" (none), or "llama3" with its keys. */
static int hf_rope_scaling(hf_ctx *x, tz_hf_llama *c) {
    char show[96];
    json_t *rs = json_object_get(x->root, "rope_scaling");
    c->rope_type[0] = 0;
    if (!rs || json_is_null(rs)) return 0;
    if (!json_is_object(rs))
        return HERR(x, "%s: key \"rope_scaling\" is %s, expected null or an object", x->file,
                    hf_show(rs, show, sizeof show));
    const char *tkey = "rope_type";
    json_t *t = json_object_get(rs, tkey);
    if (!t) t = json_object_get(rs, tkey = "type"); /* the name before transformers 4.43 */
    if (!t || !json_is_string(t))
        return HERR(x, "%s: key \"rope_scaling.rope_type\" is %s, expected \"llama3\" or "
                    "\"default\"", x->file, t ? hf_show(t, show, sizeof show) : "missing");
    const char *type = json_string_value(t);
    if (!strcmp(type, "default")) return 0;
    if (strcmp(type, "llama3") != 0)
        return HERR(x, "%s: key \"rope_scaling.%s\" is \"%.40s\", expected \"llama3\" or "
                    "\"default\" (other RoPE scalings are not supported)", x->file, tkey, type);
    snprintf(c->rope_type, sizeof c->rope_type, "llama3");
    const char *keys[3] = {"factor", "low_freq_factor", "high_freq_factor"};
    double *vals[3] = {&c->rope_factor, &c->rope_low_freq_factor, &c->rope_high_freq_factor};
    for (int i = 0; i < 3; i++) {
        json_t *v = json_object_get(rs, keys[i]);
        if (!v || !json_is_number(v) || !(json_number_value(v) > 0) ||
            !isfinite(json_number_value(v)))
            return HERR(x, "%s: key \"rope_scaling.%s\" is %s, expected a positive number",
                        x->file, keys[i], v ? hf_show(v, show, sizeof show) : "missing");
        *vals[i] = json_number_value(v);
    }
    json_t *o = json_object_get(rs, "original_max_position_embeddings");
    if (!o || !json_is_integer(o) || json_integer_value(o) <= 0)
        return HERR(x, "%s: key \"rope_scaling.original_max_position_embeddings\" is %s, "
                    "expected a positive integer", x->file,
                    o ? hf_show(o, show, sizeof show) : "missing");
    c->rope_original_max_position_embeddings = (int64_t)json_integer_value(o);
    if (!(c->rope_low_freq_factor < c->rope_high_freq_factor))
        return HERR(x, "%s: key \"rope_scaling.high_freq_factor\" is %g, expected more than "
                    "low_freq_factor %g", x->file, c->rope_high_freq_factor,
                    c->rope_low_freq_factor);
    return 0;
}

void tz_hf_llama_defaults(tz_hf_llama *c) {
    memset(c, 0, sizeof *c);
    c->max_position_embeddings = 2048;
    c->rms_norm_eps = 1e-6;
    c->rope_theta = 10000.0;
    c->tie_word_embeddings = 0;
    snprintf(c->model_type, sizeof c->model_type, "llama");
}

static int hf_parse(hf_ctx *x, tz_hf_llama *c) {
    char show[96];
    if (!json_is_object(x->root))
        return HERR(x, "%s: is %s, expected a JSON object", x->file, hf_show(x->root, show,
                                                                                 sizeof show));
    tz_hf_llama_defaults(c);
    int found = 0;
    if (hf_str(x, "model_type", c->model_type, sizeof c->model_type, &found)) return 1;
    if (found && !hf_known_type(c->model_type))
        return HERR(x, "%s: key \"model_type\" is \"%s\", expected \"llama\", \"mistral\", "
                    "\"qwen2\" or \"qwen3\" (the Llama architecture and its relatives)", x->file,
                    c->model_type);
    const int qwen = !strncmp(c->model_type, "qwen", 4);
    if (hf_int(x, "vocab_size", 1, 0, &c->vocab_size) ||
        hf_int(x, "hidden_size", 1, 0, &c->hidden_size) ||
        hf_int(x, "intermediate_size", 1, 0, &c->intermediate_size) ||
        hf_int(x, "num_hidden_layers", 1, 0, &c->num_hidden_layers) ||
        hf_int(x, "num_attention_heads", 1, 0, &c->num_attention_heads) ||
        hf_int(x, "num_key_value_heads", 0, 1, &c->num_key_value_heads) ||
        hf_int(x, "head_dim", 0, 1, &c->head_dim) ||
        hf_int(x, "max_position_embeddings", 0, 0, &c->max_position_embeddings))
        return 1;
    if (hf_real(x, "rms_norm_eps", &c->rms_norm_eps) || hf_real(x, "rope_theta", &c->rope_theta))
        return 1;
    if (hf_bool(x, "tie_word_embeddings", &c->tie_word_embeddings)) return 1;
    /* transformers >= 4.56 writes "dtype"; older versions "torch_dtype". */
    if (hf_str(x, "torch_dtype", c->torch_dtype, sizeof c->torch_dtype, &found)) return 1;
    if (!found && hf_str(x, "dtype", c->torch_dtype, sizeof c->torch_dtype, NULL)) return 1;

    if (hf_rope_scaling(x, c)) return 1;
    /* Qwen's sliding_window only applies under use_sliding_window (false in every release) */
    int use_sw = 0;
    if (qwen && hf_bool(x, "use_sliding_window", &use_sw)) return 1;
    if (use_sw)
        return HERR(x, "%s: key \"use_sliding_window\" is true, expected false (sliding-window "
                    "attention is not supported)", x->file);
    json_t *sw = qwen ? NULL : json_object_get(x->root, "sliding_window");
    if (sw && !json_is_null(sw) &&
        !(json_is_integer(sw) && json_integer_value(sw) >= c->max_position_embeddings))
        return HERR(x, "%s: key \"sliding_window\" is %s, expected null or at least "
                    "max_position_embeddings %" PRId64 " (sliding-window attention is not "
                    "supported)", x->file, hf_show(sw, show, sizeof show),
                    c->max_position_embeddings);
    if (hf_unsupported_flag(x, "attention_bias", "a bias in the attention projections") ||
        hf_unsupported_flag(x, "mlp_bias", "a bias in the MLP projections"))
        return 1;
    char act[32] = "silu";
    if (hf_str(x, "hidden_act", act, sizeof act, NULL)) return 1;
    if (strcmp(act, "silu") != 0)
        return HERR(x, "%s: key \"hidden_act\" is \"%s\", expected \"silu\"", x->file, act);

    if (c->num_key_value_heads == 0) c->num_key_value_heads = c->num_attention_heads;
    if (c->head_dim == 0) {
        if (c->hidden_size % c->num_attention_heads != 0)
            return HERR(x, "%s: key \"hidden_size\" is %" PRId64 ", expected a multiple of "
                        "num_attention_heads %" PRId64 " (no head_dim is given)", x->file,
                        c->hidden_size, c->num_attention_heads);
        c->head_dim = c->hidden_size / c->num_attention_heads;
    }
    return tz_hf_llama_check(c, x->file, x->err, x->errlen);
}

int tz_hf_llama_read(tz_hf_llama *c, const char *path, char *err, size_t errlen) {
    if (err && errlen) err[0] = '\0';
    tz_hf_llama_defaults(c);
    struct stat sb;
    char *file;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        size_t n = strlen(path);
        file = (char *)tz_xmalloc(n + 13);
        snprintf(file, n + 13, "%s%sconfig.json", path, n && path[n - 1] == '/' ? "" : "/");
    } else {
        file = tz_xstrdup(path);
    }
    json_t *root = tz_json_load_file(file, JSON_REJECT_DUPLICATES, err, errlen);
    int rc;
    if (!root) {
        rc = 1;
    } else {
        hf_ctx x = {file, root, err, errlen};
        rc = hf_parse(&x, c);
        json_decref(root);
    }
    free(file);
    return rc;
}

int tz_hf_llama_check(const tz_hf_llama *c, const char *file, char *err, size_t errlen) {
    const struct {
        const char *key;
        int64_t v;
    } ints[] = {
        {"vocab_size", c->vocab_size},
        {"hidden_size", c->hidden_size},
        {"intermediate_size", c->intermediate_size},
        {"num_hidden_layers", c->num_hidden_layers},
        {"num_attention_heads", c->num_attention_heads},
        {"num_key_value_heads", c->num_key_value_heads},
        {"head_dim", c->head_dim},
        {"max_position_embeddings", c->max_position_embeddings},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        if (ints[i].v <= 0) {
            tz_errf(err, errlen, "%s: key \"%s\" is %" PRId64 ", expected a positive integer",
                    file, ints[i].key, ints[i].v);
            return 1;
        }
    }
    if (c->num_attention_heads % c->num_key_value_heads != 0) {
        tz_errf(err, errlen, "%s: key \"num_key_value_heads\" is %" PRId64 ", expected a divisor "
                "of num_attention_heads %" PRId64, file, c->num_key_value_heads,
                c->num_attention_heads);
        return 1;
    }
    if (!(c->rms_norm_eps > 0) || !isfinite(c->rms_norm_eps)) {
        tz_errf(err, errlen, "%s: key \"rms_norm_eps\" is %g, expected a positive number", file,
                c->rms_norm_eps);
        return 1;
    }
    if (!(c->rope_theta > 0) || !isfinite(c->rope_theta)) {
        tz_errf(err, errlen, "%s: key \"rope_theta\" is %g, expected a positive number", file,
                c->rope_theta);
        return 1;
    }
    if (c->model_type[0] && !hf_known_type(c->model_type)) {
        tz_errf(err, errlen, "%s: key \"model_type\" is \"%.31s\", expected \"llama\", "
                "\"mistral\", \"qwen2\" or \"qwen3\"", file, c->model_type);
        return 1;
    }
    size_t n = strnlen(c->torch_dtype, sizeof c->torch_dtype);
    for (size_t i = 0; i < n; i++) {
        char ch = c->torch_dtype[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_') ||
            n == sizeof c->torch_dtype) {
            tz_errf(err, errlen, "%s: key \"torch_dtype\" is \"%.15s\", expected a torch dtype "
                    "name such as \"bfloat16\"", file, c->torch_dtype);
            return 1;
        }
    }
    return 0;
}

/* Shortest "%g" text that reads back as the same double, always with a '.' or exponent so
 * Python reads a float. */
static void hf_fmt_double(char *buf, size_t len, double v) {
    if (v == floor(v) && fabs(v) < 1e15) { /* 10000.0, 500000.0 as HF writes them */
        snprintf(buf, len, "%.1f", v);
        return;
    }
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, len, "%.*g", p, v);
        if (strtod(buf, NULL) == v) break;
    }
    if (!strpbrk(buf, ".e")) strncat(buf, ".0", len - strlen(buf) - 1);
}

int tz_hf_llama_write(const tz_hf_llama *c, const char *path, char *err, size_t errlen) {
    if (tz_hf_llama_check(c, path, err, errlen)) return 1;
    char eps[40], theta[40], dtype[32];
    hf_fmt_double(eps, sizeof eps, c->rms_norm_eps);
    hf_fmt_double(theta, sizeof theta, c->rope_theta);
    size_t dn = strnlen(c->torch_dtype, sizeof c->torch_dtype);
    if (dn == 0) snprintf(dtype, sizeof dtype, "null");
    else snprintf(dtype, sizeof dtype, "\"%.*s\"", (int)dn, c->torch_dtype);
    char rope[300] = "null";
    if (c->rope_type[0]) {
        char f[40], lo[40], hi[40];
        hf_fmt_double(f, sizeof f, c->rope_factor);
        hf_fmt_double(lo, sizeof lo, c->rope_low_freq_factor);
        hf_fmt_double(hi, sizeof hi, c->rope_high_freq_factor);
        snprintf(rope, sizeof rope, "{\"rope_type\": \"llama3\", \"factor\": %s, "
                 "\"low_freq_factor\": %s, \"high_freq_factor\": %s, "
                 "\"original_max_position_embeddings\": %" PRId64 "}", f, lo, hi,
                 c->rope_original_max_position_embeddings);
    }
    /* Qwen2 and Qwen3 keep their type (their extra tensors need it); Mistral without a
     * sliding window is written as the Llama it is */
    const char *type = !strcmp(c->model_type, "qwen2")   ? "qwen2"
                       : !strcmp(c->model_type, "qwen3") ? "qwen3"
                                                         : "llama";
    const char *arch = !strcmp(type, "qwen2")   ? "Qwen2ForCausalLM"
                       : !strcmp(type, "qwen3") ? "Qwen3ForCausalLM"
                                                : "LlamaForCausalLM";
    char text[2400];
    int n = snprintf(text, sizeof text,
        "{\n"
        "  \"architectures\": [\"%s\"],\n"
        "  \"model_type\": \"%s\",\n"
        "  \"vocab_size\": %" PRId64 ",\n"
        "  \"hidden_size\": %" PRId64 ",\n"
        "  \"intermediate_size\": %" PRId64 ",\n"
        "  \"num_hidden_layers\": %" PRId64 ",\n"
        "  \"num_attention_heads\": %" PRId64 ",\n"
        "  \"num_key_value_heads\": %" PRId64 ",\n"
        "  \"head_dim\": %" PRId64 ",\n"
        "  \"max_position_embeddings\": %" PRId64 ",\n"
        "  \"rms_norm_eps\": %s,\n"
        "  \"rope_theta\": %s,\n"
        "  \"rope_scaling\": %s,\n"
        "  \"tie_word_embeddings\": %s,\n"
        "  \"hidden_act\": \"silu\",\n"
        "  \"attention_bias\": false,\n"
        "  \"attention_dropout\": 0.0,\n"
        "  \"mlp_bias\": false,\n%s"
        "  \"initializer_range\": 0.02,\n"
        "  \"pretraining_tp\": 1,\n"
        "  \"use_cache\": true,\n"
        "  \"bos_token_id\": null,\n"
        "  \"eos_token_id\": null,\n"
        "  \"torch_dtype\": %s\n"
        "}\n",
        arch, type, c->vocab_size, c->hidden_size, c->intermediate_size, c->num_hidden_layers,
        c->num_attention_heads, c->num_key_value_heads, c->head_dim, c->max_position_embeddings,
        eps, theta, rope, c->tie_word_embeddings ? "true" : "false",
        strcmp(type, "llama") ? "  \"use_sliding_window\": false,\n" : "", dtype);
    if (n < 0 || (size_t)n >= sizeof text) {
        tz_errf(err, errlen, "%s: config text does not fit its buffer", path);
        return 1;
    }
    return tz_atomic_file_put(path, text, (size_t)n, err, errlen);
}

int tz_hf_config_rewrite(const char *src, const char *dst, const char *quant_json,
                         const char *torch_dtype, char *err, size_t errlen) {
    json_error_t je;
    json_t *root = tz_json_load_file(src, 0, err, errlen);
    if (!root) return 1;
    if (!json_is_object(root)) {
        tz_errf(err, errlen, "%s: not a JSON object", src);
        json_decref(root);
        return 1;
    }
    if (quant_json) {
        json_t *q = json_loads(quant_json, 0, &je);
        if (!q) {
            tz_errf(err, errlen, "%s: quantization_config is not JSON: %s", dst, je.text);
            json_decref(root);
            return 1;
        }
        json_object_set_new(root, "quantization_config", q);
    } else {
        json_object_del(root, "quantization_config");
    }
    if (torch_dtype) json_object_set_new(root, "torch_dtype", json_string(torch_dtype));
    char *text = json_dumps(root, JSON_INDENT(2));
    json_decref(root);
    if (!text) {
        tz_errf(err, errlen, "%s: cannot format the config", dst);
        return 1;
    }
    tz_atomic_file f;
    int rc = tz_atomic_file_open(&f, dst, err, errlen);
    if (!rc && (tz_atomic_file_write(&f, text, strlen(text), err, errlen) ||
                tz_atomic_file_write(&f, "\n", 1, err, errlen))) {
        tz_atomic_file_abort(&f);
        rc = 1;
    } else if (!rc) {
        rc = tz_atomic_file_commit(&f, err, errlen);
    }
    free(text);
    return rc;
}

int tz_hf_model_type(const char *dir, char *buf, size_t len, char *err, size_t errlen) {
    size_t n = strlen(dir);
    char *file = (char *)tz_xmalloc(n + 13);
    snprintf(file, n + 13, "%s%sconfig.json", dir, n && dir[n - 1] == '/' ? "" : "/");
    json_t *root = tz_json_load_file(file, 0, err, errlen);
    int rc = 0;
    buf[0] = 0;
    if (!root) {
        rc = 1;
    } else if (!json_is_object(root)) {
        rc = tz_errf(err, errlen, "%s: not a JSON object", file);
    } else {
        json_t *v = json_object_get(root, "model_type");
        if (v && !json_is_string(v))
            rc = tz_errf(err, errlen, "%s: key \"model_type\" is not a string", file);
        else if (v)
            snprintf(buf, len, "%s", json_string_value(v));
    }
    json_decref(root);
    free(file);
    return rc;
}
