/* The one-process commands: init-model and sample through the family registry. No model code
 * here: each family brings its own (train/task_<name>.c). */
#include "train/commands.h"

#include <stdio.h>

#include "core/error.h"

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
