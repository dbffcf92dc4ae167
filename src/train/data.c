/* The sample order (seeded permutation per epoch) and window extraction. Reads tokens
 * through io/tokens.h; knows nothing of ranks beyond the sample index it is given. */
#include "train/data.h"

#include <stdlib.h>

#include "core/error.h"
#include "core/rng.h"

void tz_order_init(tz_order *o, int64_t n, uint64_t seed) {
    o->n = n;
    o->seed = seed;
    o->epoch = -1;
    o->perm = tz_xmalloc((size_t)(n > 0 ? n : 1) * sizeof *o->perm);
}

void tz_order_free(tz_order *o) {
    free(o->perm);
    o->perm = NULL;
}

int64_t tz_order_at(tz_order *o, int64_t s) {
    int64_t epoch = s / o->n;
    if (epoch != o->epoch) {
        tz_rng r = tz_rng_make(o->seed, (uint64_t)epoch, TZ_RNG_DATA, 0);
        tz_rng_permutation(&r, o->perm, o->n);
        o->epoch = epoch;
    }
    return o->perm[s % o->n];
}

void tz_data_init(tz_data *d, const tz_tokens *tok, int64_t seq_len, uint64_t seed) {
    d->tok = tok;
    d->T = seq_len;
    d->nwin = tok->count > 0 ? (tok->count - 1) / seq_len : 0;
    if (d->nwin < 1)
        TZ_FATAL_HINT("use more data or a smaller data.seq_len",
                      "%s: %lld tokens hold no window of data.seq_len + 1 = %lld tokens",
                      tok->path, (long long)tok->count, (long long)seq_len + 1);
    tz_order_init(&d->order, d->nwin, seed);
    d->wterms = NULL;
    if (tok->mask) {
        d->wterms = tz_xmalloc((size_t)d->nwin * sizeof *d->wterms);
        for (int64_t w = 0; w < d->nwin; w++) {
            int32_t c = 0;
            for (int64_t j = 1; j <= seq_len; j++) c += tz_tokens_trained(tok, w * seq_len + j);
            d->wterms[w] = c;
        }
    }
}

void tz_data_free(tz_data *d) {
    tz_order_free(&d->order);
    free(d->wterms);
    d->wterms = NULL;
}

int64_t tz_data_terms(tz_data *d, int64_t first, int64_t n, int file_order) {
    if (!d->wterms) return n * d->T;
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++)
        c += d->wterms[file_order ? first + i : tz_order_at(&d->order, first + i)];
    return c;
}

void tz_data_window(const tz_data *d, int64_t w, int32_t *inputs, int32_t *targets) {
    int64_t start = w * d->T;
    tz_tokens_read(d->tok, start, d->T, inputs);
    tz_tokens_read(d->tok, start + 1, d->T, targets);
    if (d->tok->mask)
        for (int64_t j = 0; j < d->T; j++)
            if (!tz_tokens_trained(d->tok, start + 1 + j)) targets[j] = -1;
}

void tz_data_batch(tz_data *d, int64_t first, int64_t n, int32_t *inputs, int32_t *targets) {
    for (int64_t i = 0; i < n; i++)
        tz_data_window(d, tz_order_at(&d->order, first + i), inputs + i * d->T, targets + i * d->T);
}
