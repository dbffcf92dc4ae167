/* The one-process commands: init-model and sample through the family registry (each family
 * brings its own code, train/task_<name>.c), quantize and export onto model/llama_quant.c. */
#include "train/commands.h"

#include <stdio.h>
#include <stdlib.h>

#include "core/error.h"
#include "model/llama_quant.h"
#include "quant/turboquant.h"

int64_t tz_command_int(const char *s, const char *what) {
    char *end;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end) TZ_FATAL("%s: expected an integer, got '%s'", what, s);
    return v;
}

void tz_init_model_run(const char *arch, const tz_init_args *a) {
    const tz_family *f = tz_family_find(arch);
    char names[256], about[512];
    if (!f)
        TZ_FATAL("init-model: --arch %s: expected %s", arch,
                 tz_family_list(names, sizeof names, 0, 0));
    tz_init_args on = *a;
    on.be = tz_cpu_backend_create(0);
    int64_t count = f->init_model(&on, about, sizeof about);
    tz_cpu_backend_destroy(on.be);
    printf("wrote %s: %s preset %s, %lld parameters (%s)\n", a->out, f->name, a->preset,
           (long long)count, about);
}

int tz_sample_run(const tz_config *cfg, const tz_sample_args *a) {
    const tz_family *f = tz_family_of(cfg);
    char names[256];
    if (!f->sample)
        TZ_FATAL("%s: sample needs model.arch = %s", cfg->source,
                 tz_family_list(names, sizeof names, 1, 1));
    return f->sample(cfg, a);
}

void tz_quantize_run(const tz_quantize_args *a) {
    int method = TZ_TQ_TURBOQUANT;
    if (a->method && tz_tq_method_from_name(a->method, &method))
        TZ_FATAL("quantize: --method %s: expected turboquant or absmax", a->method);
    int64_t seed = a->seed ? tz_command_int(a->seed, "--seed") : 0;
    if (seed < 0) TZ_FATAL("quantize: --seed %s: expected a non-negative integer", a->seed);
    int bits = (int)tz_command_int(a->bits, "--bits");
    int group = a->group ? (int)tz_command_int(a->group, "--group") : 128;
    if (bits < 1 || bits > TZ_TQ_MAX_BITS)
        TZ_FATAL("quantize: --bits %d: expected 1..%d (2, 3 or 4 are useful)", bits, TZ_TQ_MAX_BITS);
    if (group != 64 && group != 128 && group != 256)
        TZ_FATAL("quantize: --group %d: expected 64, 128 or 256", group);
    tz_llama_quantize_dir(a->in, a->out, method, bits, group, (uint64_t)seed, stdout);
}

void tz_export_run(const char *in, const char *out) { tz_llama_export_dequantized(in, out, stdout); }
