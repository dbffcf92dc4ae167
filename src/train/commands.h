/* The one-process commands of the CLI besides train, eval and bench: init-model and sample
 * reach a family through the registry. Arguments arrive parsed by main.c, which includes no
 * model header; what needs a model happens here or in the family. */
#ifndef TZ_COMMANDS_H
#define TZ_COMMANDS_H
#include "io/config.h"
#include "train/family.h"

/* A random model of family `arch` (init-model --arch), as the family's preset says; fatal
 * naming the families when there is none of that name. */
void tz_init_model_run(const char *arch, const tz_init_args *a);
/* a->n images of class a->cls from the configured model (+ model.adapter) by the family's
 * sampler, as a PNG grid; fatal when the family has none. One process. */
int tz_sample_run(const tz_config *cfg, const tz_sample_args *a);

#endif
