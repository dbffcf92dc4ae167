/* Normal variates and permutations on top of the splitmix64 streams of rng.h. */
#include "core/rng.h"

#include <math.h>

double tz_rng_normal(tz_rng *r) {
    double u1 = ((double)(tz_rng_u64(r) >> 11) + 1.0) * (1.0 / 9007199254740993.0); /* (0,1] */
    double u2 = (double)(tz_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void tz_rng_permutation(tz_rng *r, int64_t *perm, int64_t n) {
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)tz_rng_below(r, (uint64_t)i + 1);
        int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}
