/* Loss curves as a PNG: train and eval loss against steps from one or more run folders'
 * metrics.jsonl, one colour per run. Reads and draws; knows nothing of training. */
#ifndef TZ_LOSS_PLOT_H
#define TZ_LOSS_PLOT_H
#include <stddef.h>

/* Where the curves are in a run folder: a JSON-lines file of records, and the keys of a
 * record's step (an integer), training loss and evaluation loss (numbers; records without a
 * step, and nulls, are skipped). The caller's schema (the trainer's: train/run_record.h). */
typedef struct tz_loss_plot_keys {
    const char *file, *step, *loss, *eval_loss;
} tz_loss_plot_keys;

/* Draws the curves of the n run folders dirs[] (each with the records keys names) into out (PNG,
 * written atomically): the training loss as a pale line of every step with a moving average
 * over it (of 2h + 1 steps, h = steps / 40, at least 1 from 8 steps on) in full colour, the evaluation loss as outlined squares
 * joined by a thin line, in the run's colour; axes with tick labels; a legend naming each run:
 * names[i], or (names NULL) the folder's name, a folder named staging (a run in progress)
 * going by its parent's. 0, or non-zero with a message in err (a missing or unreadable
 * metrics.jsonl, no loss in any). */
int tz_loss_plot_write(const tz_loss_plot_keys *keys, const char *const *dirs,
                       const char *const *names, int n, const char *out, char *err, size_t errlen);

#endif
