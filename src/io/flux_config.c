/* Flux transformer config.json through jansson: every key read is type- and range-checked
 * with the file and key in the message. Format only. */
#include "io/flux_config.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/fsutil.h"

typedef struct {
    const char *file;
    json_t *root;
    char *err;
    size_t errlen;
} fc_ctx;

static int bad(fc_ctx *x, const char *key, const json_t *v, const char *expected) {
    char s[96] = "missing";
    if (v && json_is_integer(v)) snprintf(s, sizeof s, "%lld", (long long)json_integer_value(v));
    else if (v && json_is_string(v)) snprintf(s, sizeof s, "\"%.40s\"", json_string_value(v));
    else if (v) snprintf(s, sizeof s, "%s", json_is_null(v) ? "null" : json_is_boolean(v)
                                                ? (json_is_true(v) ? "true" : "false")
                                                : json_is_real(v) ? "a real number"
                                                : json_is_array(v) ? "an array" : "an object");
    snprintf(x->err, x->errlen, "%s: key \"%s\" is %s, expected %s", x->file, key, s, expected);
    return 1;
}

static int get_int(fc_ctx *x, const char *key, int required, int64_t lo, int64_t *out) {
    json_t *v = json_object_get(x->root, key);
    if (!v || json_is_null(v)) return required ? bad(x, key, v, "an integer (required)") : 0;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > (1 << 24)) {
        char want[64];
        snprintf(want, sizeof want, "an integer in %lld..%d", (long long)lo, 1 << 24);
        return bad(x, key, v, want);
    }
    *out = (int64_t)json_integer_value(v);
    return 0;
}

int tz_flux_config_read(tz_flux_config *c, const char *path, char *err, size_t errlen) {
    char file[1100];
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) tz_path_join(file, sizeof file, path, "config.json");
    else snprintf(file, sizeof file, "%s", path);
    json_error_t je;
    json_t *root = json_load_file(file, 0, &je);
    if (!root) return tz_errf(err, errlen, "%s: %s (line %d)", file, je.text, je.line);
    fc_ctx x = {file, root, err, errlen};
    memset(c, 0, sizeof *c);
    c->patch_size = 1;
    int rc = 0;
    if (!json_is_object(root)) rc = tz_errf(err, errlen, "%s: expected a JSON object", file);
    json_t *cls = rc ? NULL : json_object_get(root, "_class_name");
    if (!rc && cls && (!json_is_string(cls) || strcmp(json_string_value(cls), "FluxTransformer2DModel")))
        rc = bad(&x, "_class_name", cls, "\"FluxTransformer2DModel\"");
    rc = rc || get_int(&x, "patch_size", 0, 1, &c->patch_size) ||
         get_int(&x, "in_channels", 1, 1, &c->in_channels) ||
         get_int(&x, "num_layers", 1, 0, &c->num_layers) ||
         get_int(&x, "num_single_layers", 1, 0, &c->num_single_layers) ||
         get_int(&x, "attention_head_dim", 1, 2, &c->attention_head_dim) ||
         get_int(&x, "num_attention_heads", 1, 1, &c->num_attention_heads) ||
         get_int(&x, "joint_attention_dim", 1, 1, &c->joint_attention_dim) ||
         get_int(&x, "pooled_projection_dim", 1, 1, &c->pooled_projection_dim);
    if (!rc && c->patch_size != 1)
        rc = bad(&x, "patch_size", json_object_get(root, "patch_size"), "1 (latents are packed 2x2 into tokens by the caller)");
    c->out_channels = c->in_channels;
    if (!rc) rc = get_int(&x, "out_channels", 0, 1, &c->out_channels);
    json_t *g = rc ? NULL : json_object_get(root, "guidance_embeds");
    if (!rc && g && !json_is_boolean(g)) rc = bad(&x, "guidance_embeds", g, "true or false");
    c->guidance_embeds = g && json_is_true(g);
    json_t *ax = rc ? NULL : json_object_get(root, "axes_dims_rope");
    /* absent in the first Flux.1 configs: diffusers' default then, Flux.1's own axes */
    c->axes_dims_rope[0] = 16, c->axes_dims_rope[1] = 56, c->axes_dims_rope[2] = 56;
    if (!rc && ax) {
        if (!json_is_array(ax) || json_array_size(ax) != 3) {
            rc = bad(&x, "axes_dims_rope", ax, "an array of three integers");
        } else {
            for (int i = 0; i < 3 && !rc; i++) {
                json_t *e = json_array_get(ax, (size_t)i);
                if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > 4096)
                    rc = bad(&x, "axes_dims_rope", ax, "an array of three integers in 0..4096");
                else c->axes_dims_rope[i] = (int64_t)json_integer_value(e);
            }
        }
    }
    json_decref(root);
    return rc;
}

int tz_flux_config_write(const tz_flux_config *c, const char *path, char *err, size_t errlen) {
    char text[1200];
    const int n = snprintf(text, sizeof text,
        "{\n"
        "  \"_class_name\": \"FluxTransformer2DModel\",\n"
        "  \"patch_size\": %lld,\n"
        "  \"in_channels\": %lld,\n"
        "  \"out_channels\": %lld,\n"
        "  \"num_layers\": %lld,\n"
        "  \"num_single_layers\": %lld,\n"
        "  \"attention_head_dim\": %lld,\n"
        "  \"num_attention_heads\": %lld,\n"
        "  \"joint_attention_dim\": %lld,\n"
        "  \"pooled_projection_dim\": %lld,\n"
        "  \"guidance_embeds\": %s,\n"
        "  \"axes_dims_rope\": [%lld, %lld, %lld]\n"
        "}\n",
        (long long)c->patch_size, (long long)c->in_channels, (long long)c->out_channels,
        (long long)c->num_layers, (long long)c->num_single_layers,
        (long long)c->attention_head_dim, (long long)c->num_attention_heads,
        (long long)c->joint_attention_dim, (long long)c->pooled_projection_dim,
        c->guidance_embeds ? "true" : "false", (long long)c->axes_dims_rope[0],
        (long long)c->axes_dims_rope[1], (long long)c->axes_dims_rope[2]);
    if (n < 0 || (size_t)n >= sizeof text)
        return tz_errf(err, errlen, "%s: config text does not fit its buffer", path);
    return tz_atomic_file_put(path, text, (size_t)n, err, errlen);
}
