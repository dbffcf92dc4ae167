/* adapter_config.json through jansson, as PEFT writes it; unknown PEFT keys are ignored on
 * read, and the ones that change the math (use_dora, use_rslora, bias) are rejected. */
#include "io/peft.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/atomic_file.h"
#include "io/fsutil.h"

int tz_peft_read(tz_peft_config *c, const char *path, char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    if (tz_check_regular(path, err, errlen)) return 1;
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) {
        snprintf(err, errlen, "%s:%d: %s", path, je.line, je.text);
        return 1;
    }
    int rc = 1;
    json_t *r = json_object_get(root, "r"), *a = json_object_get(root, "lora_alpha");
    json_t *t = json_object_get(root, "target_modules");
    json_t *dora = json_object_get(root, "use_dora"), *rs = json_object_get(root, "use_rslora");
    json_t *bias = json_object_get(root, "bias"), *base = json_object_get(root, "base_model_name_or_path");
    if (!json_is_object(root)) snprintf(err, errlen, "%s: expected a JSON object", path);
    else if (!json_is_integer(r) || json_integer_value(r) < 1 || json_integer_value(r) > 4096)
        snprintf(err, errlen, "%s: r: expected an integer in 1..4096 (the range of lora.rank)",
                 path);
    else if (!json_is_number(a) || json_number_value(a) <= 0)
        snprintf(err, errlen, "%s: lora_alpha: expected a positive number", path);
    else if (!json_is_array(t) || json_array_size(t) == 0 ||
             json_array_size(t) > TZ_PEFT_MAX_TARGETS)
        snprintf(err, errlen, "%s: target_modules: expected a list of 1 to %d module names", path,
                 TZ_PEFT_MAX_TARGETS);
    else if (json_is_true(dora) || json_is_true(rs))
        snprintf(err, errlen, "%s: use_dora / use_rslora adapters are not supported", path);
    else if (bias && !json_is_null(bias) && !(json_is_string(bias) && !strcmp(json_string_value(bias), "none")))
        snprintf(err, errlen, "%s: bias: only \"none\" is supported", path);
    else {
        c->r = json_integer_value(r);
        c->alpha = json_number_value(a);
        if (json_is_string(base))
            snprintf(c->base_model, sizeof c->base_model, "%s", json_string_value(base));
        json_t *tt = json_object_get(root, "task_type");
        if (json_is_string(tt))
            snprintf(c->task_type, sizeof c->task_type, "%s", json_string_value(tt));
        json_t *q = json_object_get(root, "turbozero_base_quantization");
        if (json_is_object(q)) {
            json_t *b = json_object_get(q, "bits"), *g = json_object_get(q, "group_size"),
                   *m = json_object_get(q, "method"), *sd = json_object_get(q, "seed");
            c->quant_bits = json_is_integer(b) ? (int)json_integer_value(b) : 0;
            c->quant_group = json_is_integer(g) ? (int)json_integer_value(g) : 0;
            c->quant_seed = json_is_integer(sd) ? (uint64_t)json_integer_value(sd) : 0;
            if (json_is_string(m))
                snprintf(c->quant_method, sizeof c->quant_method, "%s", json_string_value(m));
            json_t *li = json_object_get(q, "lora_init"), *is = json_object_get(q, "init_seed");
            if (json_is_string(li))
                snprintf(c->lora_init, sizeof c->lora_init, "%s", json_string_value(li));
            c->init_seed = json_is_integer(is) ? (uint64_t)json_integer_value(is) : 0;
        }
        rc = 0;
        size_t i;
        json_t *v;
        json_array_foreach(t, i, v) {
            if (!json_is_string(v) || strlen(json_string_value(v)) >= sizeof c->targets[0]) {
                snprintf(err, errlen, "%s: target_modules[%zu]: expected a module name", path, i);
                rc = 1;
                break;
            }
            snprintf(c->targets[c->ntargets++], sizeof c->targets[0], "%s", json_string_value(v));
        }
    }
    json_decref(root);
    return rc;
}

int tz_peft_write(const tz_peft_config *c, const char *path, char *err, size_t errlen) {
    json_t *root = json_object();
    json_t *t = json_array();
    for (int i = 0; i < c->ntargets; i++) json_array_append_new(t, json_string(c->targets[i]));
    json_object_set_new(root, "peft_type", json_string("LORA"));
    json_object_set_new(root, "task_type",
                        c->task_type[0] ? json_string(c->task_type) : json_null());
    if (c->quant_bits > 0) { /* PEFT ignores keys it does not know */
        json_t *q = json_pack("{s:i, s:i, s:s, s:I}", "bits", c->quant_bits, "group_size",
                              c->quant_group, "method", c->quant_method, "seed",
                              (json_int_t)c->quant_seed);
        if (c->lora_init[0]) {
            json_object_set_new(q, "lora_init", json_string(c->lora_init));
            json_object_set_new(q, "init_seed", json_integer((json_int_t)c->init_seed));
        }
        json_object_set_new(root, "turbozero_base_quantization", q);
    }
    json_object_set_new(root, "base_model_name_or_path", json_string(c->base_model));
    json_object_set_new(root, "r", json_integer(c->r));
    json_object_set_new(root, "lora_alpha", json_real(c->alpha));
    json_object_set_new(root, "lora_dropout", json_real(0.0));
    json_object_set_new(root, "bias", json_string("none"));
    json_object_set_new(root, "fan_in_fan_out", json_false());
    json_object_set_new(root, "use_rslora", json_false());
    json_object_set_new(root, "use_dora", json_false());
    json_object_set_new(root, "inference_mode", json_true());
    json_object_set_new(root, "target_modules", t);
    json_t *ms = c->nsave ? json_array() : json_null();
    for (int i = 0; i < c->nsave; i++) json_array_append_new(ms, json_string(c->save[i]));
    json_object_set_new(root, "modules_to_save", ms);
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(root);
    tz_atomic_file f;
    int rc = tz_atomic_file_open(&f, path, err, errlen);
    if (!rc) rc = tz_atomic_file_write(&f, text, strlen(text), err, errlen);
    if (!rc) rc = tz_atomic_file_write(&f, "\n", 1, err, errlen);
    if (!rc) rc = tz_atomic_file_commit(&f, err, errlen);
    else tz_atomic_file_abort(&f);
    free(text);
    return rc;
}
