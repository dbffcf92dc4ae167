/* Deterministic random streams. A stream is derived from (seed, step, purpose, rank), so
 * any rank can reproduce any stream without shared state; no hidden global generator. */
#ifndef TZ_RNG_H
#define TZ_RNG_H
#include <stdint.h>

/* Purposes keep streams of one seed apart. Append only: values are part of the results. */
enum tz_rng_purpose {
    TZ_RNG_INIT = 1,    /* model weight init */
    TZ_RNG_LORA = 2,    /* LoRA A init */
    TZ_RNG_DATA = 3,    /* data permutation (per epoch in `step`) */
    TZ_RNG_QUANT = 4,   /* TurboQuant sign vectors */
    TZ_RNG_NOISE = 5,   /* diffusion noise / timesteps */
    TZ_RNG_DROPOUT = 6, /* label dropout */
    TZ_RNG_QZO = 7,     /* qzo perturbation of the quantization scales (per step) */
    TZ_RNG_ROUND = 8,   /* stochastic rounding of full fine-tuning's re-quantization (per step) */
    TZ_RNG_TEST = 100,
};

typedef struct tz_rng {
    uint64_t s;
} tz_rng;

static inline uint64_t tz_splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static inline tz_rng tz_rng_make(uint64_t seed, uint64_t step, uint64_t purpose, uint64_t rank) {
    uint64_t h = seed;
    uint64_t a = tz_splitmix64(&h) ^ step;
    a = tz_splitmix64(&a) ^ purpose;
    a = tz_splitmix64(&a) ^ rank;
    tz_rng r = {tz_splitmix64(&a)};
    return r;
}

static inline uint64_t tz_rng_u64(tz_rng *r) { return tz_splitmix64(&r->s); }

/* Uniform in [0, 1) with 24 random bits (exactly representable as float). */
static inline float tz_rng_uniform(tz_rng *r) { return (float)(tz_rng_u64(r) >> 40) * (1.0f / 16777216.0f); }

/* Uniform integer in [0, n), n > 0, without modulo bias. */
static inline uint64_t tz_rng_below(tz_rng *r, uint64_t n) {
    uint64_t lim = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = tz_rng_u64(r);
    while (x >= lim);
    return x % n;
}

/* n ids uniform below bound from seed (purpose TZ_RNG_DATA): the random data of a model
 * built from a named shape (model.path "preset:NAME"). */
static inline void tz_rng_ids(uint32_t *out, int64_t n, uint64_t bound, uint64_t seed) {
    tz_rng r = tz_rng_make(seed, 0, TZ_RNG_DATA, 1);
    for (int64_t i = 0; i < n; i++) out[i] = (uint32_t)tz_rng_below(&r, bound);
}

/* Standard normal (Box-Muller in double, one value per call). */
double tz_rng_normal(tz_rng *r);

/* perm[i] = a uniform random permutation of 0..n-1 (Fisher-Yates). */
void tz_rng_permutation(tz_rng *r, int64_t *perm, int64_t n);

#endif
