/* The LR schedule and the host shard: its named arrays, the sum of squares of its gradient
 * and the threaded step. No communication here (optim/zero.c); the registry of optimizers is
 * optim_registry.c. */
#include "optim/optim.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "comm/world.h"

double tz_lr_at(int64_t step, int64_t total, int64_t warmup, double lr, double min_ratio) {
    if (warmup > 0 && step < warmup) return lr * (double)(step + 1) / (double)warmup;
    int64_t span = total - warmup;
    if (span <= 1) return lr;
    double p = (double)(step - warmup) / (double)(span - 1);
    if (p > 1.0) p = 1.0;
    return lr * (min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + cos(M_PI * p)));
}

static void add_array(tz_shard *s, const char *name, enum tz_dtype dt, int saved) {
    tz_shard_array *a = &s->a[s->n_arrays++];
    const size_t elem_bytes = tz_dtype_size(dt);
    a->name = name;
    a->dtype = dt;
    a->elem_bytes = elem_bytes;
    a->saved = saved;
    a->data = tz_world_host_alloc(s->world, (size_t)s->n * elem_bytes);
    s->bytes += (size_t)s->n * elem_bytes;
}

void tz_shard_init(tz_shard *s, const tz_optim *opt, int64_t n, const tz_world *world) {
    memset(s, 0, sizeof *s);
    if (!opt || !opt->step || opt->n_states < 0 || opt->n_states > TZ_OPTIM_MAX_STATES)
        TZ_FATAL("optimizer %s: needs a step function and 0..%d states",
                 opt && opt->name ? opt->name : "(null)", TZ_OPTIM_MAX_STATES);
    for (int i = 0; i < opt->n_states; i++)
        if (!tz_shard_dtype_ok(opt->state_types[i]))
            TZ_FATAL("optimizer %s: state %s of element type %s (expected F32, BF16 or U8)",
                     opt->name, opt->state_names[i], tz_dtype_name(opt->state_types[i]));
    if (n < 0) TZ_FATAL("shard of %lld elements", (long long)n);
    s->opt = opt;
    s->world = world;
    s->n = n;
    add_array(s, "master", TZ_DT_F32, 1);
    add_array(s, "grad_acc", TZ_DT_F32, 0);
    add_array(s, "decay", TZ_DT_U8, 0);
    for (int i = 0; i < opt->n_states; i++)
        add_array(s, opt->state_names[i], opt->state_types[i], 1);
    s->master = s->a[TZ_SHARD_MASTER].data;
    s->acc = s->a[TZ_SHARD_ACC].data;
    s->decay = s->a[TZ_SHARD_DECAY].data;
    s->partial = tz_xmalloc((size_t)((n + TZ_SHARD_SUMSQ_BLOCK - 1) / TZ_SHARD_SUMSQ_BLOCK + 1) * sizeof(double));
}

void tz_shard_free(tz_shard *s) {
    for (int i = 0; i < s->n_arrays; i++)
        tz_world_host_free(s->world, s->a[i].data, (size_t)s->n * s->a[i].elem_bytes);
    free(s->partial);
    memset(s, 0, sizeof *s);
}

void *tz_shard_state(const tz_shard *s, int i) {
    if (i < 0 || i >= s->opt->n_states) TZ_FATAL("%s has no state %d", s->opt->name, i);
    return s->a[TZ_SHARD_STATE0 + i].data;
}

/* Sum of squares of one block in 16 fixed lanes (element i of the block in lane i % 16),
 * the lanes added pairwise in a fixed tree. Each float square is exact in double, so only
 * the sums round, the same way on any machine and for any thread count. */
static double block_sumsq(const float *restrict x, int64_t n) {
    double lane[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) lane[j] += (double)x[i + j] * (double)x[i + j];
    for (int j = 0; i < n; i++, j++) lane[j] += (double)x[i] * (double)x[i];
    for (int w = 8; w >= 1; w /= 2)
        for (int j = 0; j < w; j++) lane[j] += lane[j + w];
    return lane[0];
}

double tz_shard_sumsq(const tz_shard *s) {
    const int64_t n = s->n, B = TZ_SHARD_SUMSQ_BLOCK, nb = (n + B - 1) / B;
    double *part = s->partial;
#pragma omp parallel for schedule(static) if (n >= 4 * B)
    for (int64_t b = 0; b < nb; b++) {
        const int64_t lo = b * B;
        part[b] = block_sumsq(s->acc + lo, n - lo < B ? n - lo : B);
    }
    double ss = 0.0; /* the blocks in order */
    for (int64_t b = 0; b < nb; b++) ss += part[b];
    return ss;
}

void tz_shard_thread_range(int64_t n, int64_t *lo, int64_t *hi) {
    const int k = omp_get_thread_num(), nt = omp_get_num_threads();
    int64_t per = (n + nt - 1) / nt;
    per = (per + 15) / 16 * 16; /* cut at multiples of 16 elements (64 bytes) */
    *lo = (int64_t)k * per < n ? (int64_t)k * per : n;
    *hi = *lo + per < n ? *lo + per : n;
}

void tz_host_copy(void *dst, const void *src, size_t bytes) {
    const int64_t n = (int64_t)bytes;
#pragma omp parallel if (n >= 32768 * 4)
    {
        int64_t lo, hi;
        tz_shard_thread_range(n, &lo, &hi);
        if (hi > lo) memcpy((char *)dst + lo, (const char *)src + lo, (size_t)(hi - lo));
    }
}

size_t tz_optim_elem_bytes(const tz_optim *opt) {
    size_t b = 2 * sizeof(float) + 1; /* master, accumulator, decay flag */
    for (int i = 0; i < opt->n_states; i++) b += tz_dtype_size(opt->state_types[i]);
    return b;
}

size_t tz_shard_elem_bytes(const tz_shard *s) { return tz_optim_elem_bytes(s->opt); }

size_t tz_shard_step_bytes(const tz_shard *s) {
    /* read master, gradient, decay flag and states; write master and states */
    size_t states = tz_shard_elem_bytes(s) - (2 * sizeof(float) + 1);
    return 2 * sizeof(float) + 1 + 2 * states + sizeof(float);
}

void tz_shard_update(tz_shard *s, const tz_optim_hparams *h, int64_t t, float grad_scale) {
    tz_optim_arrays a = {.w = s->master, .g = s->acc, .decay = s->decay};
    for (int i = 0; i < s->opt->n_states; i++) a.state[i] = tz_shard_state(s, i);
    const tz_optim *o = s->opt;
    const int64_t n = s->n;
#pragma omp parallel if (n >= 32768)
    {
        int64_t lo, hi;
        tz_shard_thread_range(n, &lo, &hi);
        o->step(&a, lo, hi, t, h, grad_scale);
    }
}

void tz_shard_describe(const tz_shard *s, char *buf, size_t len) {
    size_t at = 0;
    buf[0] = 0;
    for (int i = 0; i < s->n_arrays && at < len; i++) {
        const int typed = i >= TZ_SHARD_STATE0 && s->a[i].dtype != TZ_DT_F32;
        int k = snprintf(buf + at, len - at, "%s%s%s%s%s", i ? ", " : "", s->a[i].name,
                         typed ? " (" : "", typed ? tz_dtype_name(s->a[i].dtype) : "",
                         typed ? ")" : "");
        if (k < 0) break;
        at += (size_t)k;
    }
}
