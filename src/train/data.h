/* Batches of token windows: window w covers tokens [w*T, w*T + T] (T+1 tokens: inputs are
 * the first T, targets the last T). Training order is one seeded permutation of all windows
 * per epoch, shared by every rank; each rank takes its slice of every global batch. */
#ifndef TZ_DATA_H
#define TZ_DATA_H
#include <stdint.h>

#include "io/tokens.h"

/* The training order of n items (windows, images): sample s of the run is item
 * perm_e[s % n] of epoch e = s / n, one seeded permutation per epoch, the same on every rank. */
typedef struct tz_order {
    int64_t n;
    uint64_t seed;
    int64_t epoch;    /* epoch of the cached permutation (-1: none) */
    int64_t *perm;
} tz_order;

void tz_order_init(tz_order *o, int64_t n, uint64_t seed);
void tz_order_free(tz_order *o);
/* The item of sample s. */
int64_t tz_order_at(tz_order *o, int64_t s);

typedef struct tz_data {
    const tz_tokens *tok;
    int64_t T;        /* seq_len */
    int64_t nwin;     /* windows in the file */
    tz_order order;
    int32_t *wterms;  /* with a loss mask: the trained targets of each window; else NULL */
} tz_data;

/* Fatal (naming the file) when the file holds no complete window. */
void tz_data_init(tz_data *d, const tz_tokens *tok, int64_t seq_len, uint64_t seed);
void tz_data_free(tz_data *d);
/* Rows [first, first+n) of the global sample sequence (tz_order) into inputs and targets,
 * [n*T] each. */
void tz_data_batch(tz_data *d, int64_t first, int64_t n, int32_t *inputs, int32_t *targets);
/* Window w in file order (no permutation), for evaluation. Targets the loss mask leaves out
 * are -1 (no loss, no gradient). */
void tz_data_window(const tz_data *d, int64_t w, int32_t *inputs, int32_t *targets);
/* The trained targets (loss terms) of samples [first, first+n) of the global order, or of
 * windows [first, first+n) in file order when file_order; n*T without a loss mask. */
int64_t tz_data_terms(tz_data *d, int64_t first, int64_t n, int file_order);

#endif
