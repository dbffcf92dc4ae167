/* Batches of token windows: window w covers tokens [w*T, w*T + T] (T+1 tokens: inputs are
 * the first T, targets the last T). Training order is one seeded permutation of all windows
 * per epoch, shared by every rank; each rank takes its slice of every global batch. */
#ifndef TZ_DATA_H
#define TZ_DATA_H
#include <stdint.h>

#include "io/tokens.h"

typedef struct tz_data {
    const tz_tokens *tok;
    int64_t T;        /* seq_len */
    int64_t nwin;     /* windows in the file */
    uint64_t seed;
    int64_t epoch;    /* epoch of the cached permutation (-1: none) */
    int64_t *perm;
} tz_data;

/* Fatal (naming the file) when the file holds no complete window. */
void tz_data_init(tz_data *d, const tz_tokens *tok, int64_t seq_len, uint64_t seed);
void tz_data_free(tz_data *d);
/* Rows [first, first+n) of the global sample sequence (sample s = epoch s / nwin, position
 * perm_epoch[s % nwin]) into inputs and targets, [n*T] each. */
void tz_data_batch(tz_data *d, int64_t first, int64_t n, int32_t *inputs, int32_t *targets);
/* Window w in file order (no permutation), for evaluation. */
void tz_data_window(const tz_data *d, int64_t w, int32_t *inputs, int32_t *targets);

#endif
