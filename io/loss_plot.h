/* Loss curves as a PNG: train and eval loss against steps from one or more run folders'
 * metrics.jsonl, one colour per run. Reads and draws; knows nothing of training. */
#ifndef TZ_LOSS_PLOT_H
#define TZ_LOSS_PLOT_H
#include <stddef.h>

/* Draws the curves of the n run folders dirs[] (each with a metrics.jsonl) into out (PNG,
 * written atomically): training loss as a line, evaluation loss as squares joined by a thin
 * line, in the run's colour, axes with tick labels, a legend with the folder names. 0, or
 * non-zero with a message in err (a missing or unreadable metrics.jsonl, no loss in any). */
int tz_loss_plot_write(const char *const *dirs, int n, const char *out, char *err, size_t errlen);

#endif
