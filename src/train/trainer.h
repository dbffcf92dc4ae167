/* The training and evaluation drivers behind `turbozero train` and `turbozero eval`. */
#ifndef TZ_TRAINER_H
#define TZ_TRAINER_H
#include "io/config.h"

/* Train as configured; writes run.dir (config.used.cfg, metrics.jsonl, the trained weights).
 * Returns 0; every error is fatal with its place. */
int tz_train_run(const tz_config *cfg);
/* Mean next-token loss over data.val; last line printed: eval_loss=<float> tokens=<int>. */
int tz_eval_run(const tz_config *cfg);

#endif
