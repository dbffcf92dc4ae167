/* Parameter table bookkeeping: registration (dense or quantized storage), look-up and the
 * flat layout of trainables. Owns the weight allocations; the gradients are the trainer's. */
#include "model/params.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "quant/tq_layout.h"

static void make_quant(tz_param *p, tz_backend *be, int method, int bits, int group,
                       uint64_t seed, const float *levels, int on_host);

void tz_params_init(tz_params *ps) { memset(ps, 0, sizeof *ps); }

static void release_storage(tz_param *p, tz_backend *be) {
    if (p->w) be->release(be, p->w);
    if (p->q) {
        if (p->q->host) be->host_free(be, p->q->host);
        else be->release(be, p->q->codes);
        be->release(be, p->q->scales);
        be->release(be, p->q->levels);
        free(p->q);
    }
    free(p->init);
    p->w = NULL;
    p->q = NULL;
    p->init = NULL;
    p->bytes = 0;
}

void tz_params_free(tz_params *ps, tz_backend *be) {
    for (int i = 0; i < ps->n; i++) {
        release_storage(ps->p[i], be);
        free(ps->p[i]);
    }
    free(ps->p);
    free(ps->ready);
    memset(ps, 0, sizeof *ps);
}

static tz_param *add_entry(tz_params *ps, const char *name, int ndim, int64_t d0, int64_t d1,
                           int trainable, int decay, int adapter) {
    if (ps->n == ps->cap) {
        ps->cap = ps->cap ? 2 * ps->cap : 64;
        ps->p = tz_xrealloc(ps->p, (size_t)ps->cap * sizeof *ps->p);
    }
    tz_param *p = tz_xcalloc(1, sizeof *p); /* stable address: models keep pointers to it */
    ps->p[ps->n++] = p;
    if ((size_t)snprintf(p->name, sizeof p->name, "%s", name) >= sizeof p->name)
        TZ_FATAL("parameter name too long: %s", name);
    p->ndim = ndim;
    p->shape[0] = d0;
    p->shape[1] = ndim > 1 ? d1 : 1;
    p->numel = d0 * (ndim > 1 ? d1 : 1);
    p->trainable = trainable;
    p->decay = decay;
    p->adapter = adapter;
    p->flat_off = -1;
    ps->n_total += p->numel;
    return p;
}

tz_param *tz_params_add(tz_params *ps, tz_backend *be, const char *name, int ndim, int64_t d0,
                        int64_t d1, int trainable, int decay, int adapter) {
    tz_param *p = add_entry(ps, name, ndim, d0, d1, trainable, decay, adapter);
    p->w16 = !trainable && !adapter && ndim == 2 && be->matmul_dtype == TZ_DT_BF16;
    p->bytes = (size_t)p->numel * (p->w16 ? sizeof(uint16_t) : sizeof(float));
    p->w = be->alloc(be, p->bytes);
    return p;
}

tz_param *tz_params_add_quant(tz_params *ps, tz_backend *be, const char *name, int64_t d0,
                              int64_t d1, int method, int bits, int group, uint64_t seed,
                              const float *levels) {
    tz_param *p = add_entry(ps, name, 2, d0, d1, 0, 1, 0);
    make_quant(p, be, method, bits, group, seed, levels, ps->codes_on_host);
    return p;
}

void tz_param_make_quant(tz_param *p, tz_backend *be, int method, int bits, int group,
                         uint64_t seed, const float *levels) {
    make_quant(p, be, method, bits, group, seed, levels, 0);
}

static void make_quant(tz_param *p, tz_backend *be, int method, int bits, int group,
                       uint64_t seed, const float *levels, int on_host) {
    if (p->ndim != 2 || p->adapter)
        TZ_FATAL("%s: only a weight matrix can be quantized", p->name);
    if (bits < 1 || bits > TZ_TQ_MAX_BITS || (group != 64 && group != 128 && group != 256) ||
        p->shape[1] % group)
        TZ_FATAL("%s: cannot hold %d-bit codes in groups of %d for %lld columns", p->name, bits,
                 group, (long long)p->shape[1]);
    release_storage(p, be);
    tz_qweight *q = tz_xcalloc(1, sizeof *q);
    q->method = method;
    q->bits = bits;
    q->group = group;
    q->seed = seed;
    size_t cb = (size_t)tz_tq_codes_bytes(p->shape[0], p->shape[1], bits);
    size_t sb = (size_t)tz_tq_scales_count(p->shape[0], p->shape[1], group) * sizeof(uint16_t);
    size_t lb = ((size_t)1 << bits) * sizeof(float);
    if (on_host) q->host = be->host_alloc(be, cb); /* zeroed; q->codes set by tz_wstream */
    else q->codes = be->alloc(be, cb);
    q->scales = be->alloc(be, sb);
    q->levels = be->alloc(be, lb);
    be->upload(be, q->levels, levels, lb);
    p->q = q;
    p->bytes = (on_host ? 0 : cb) + sb + lb;
}

void tz_qweight_codes_put(tz_backend *be, tz_qweight *q, size_t off, const void *src, size_t n) {
    if (be->plan) return; /* nothing moves on a planning backend */
    if (q->host) memcpy(q->host + off, src, n);
    else be->upload(be, q->codes + off, src, n);
}

void tz_qweight_codes_get(tz_backend *be, const tz_qweight *q, void *dst, size_t off, size_t n) {
    if (q->host && !be->plan) memcpy(dst, q->host + off, n);
    else be->download(be, dst, q->codes + off, n);
}

size_t tz_params_host_codes_bytes(const tz_params *ps) {
    size_t b = 0;
    for (int i = 0; i < ps->n; i++)
        if (ps->p[i]->q && ps->p[i]->q->host)
            b += (size_t)tz_tq_codes_bytes(ps->p[i]->shape[0], ps->p[i]->shape[1], ps->p[i]->q->bits);
    return b;
}

void tz_param_make_dense(tz_param *p, tz_backend *be) {
    release_storage(p, be);
    p->bytes = (size_t)p->numel * sizeof(float);
    p->w = be->alloc(be, p->bytes);
}

size_t tz_params_bytes(const tz_params *ps) {
    size_t b = 0;
    for (int i = 0; i < ps->n; i++) b += ps->p[i]->bytes;
    return b;
}

tz_param *tz_params_find(tz_params *ps, const char *name) {
    for (int i = 0; i < ps->n; i++)
        if (!strcmp(ps->p[i]->name, name)) return ps->p[i];
    return NULL;
}

float *tz_params_host_buffer(const tz_params *ps, int adapters) {
    int64_t n = 1;
    for (int i = 0; i < ps->n; i++)
        if (ps->p[i]->adapter == adapters && ps->p[i]->numel > n) n = ps->p[i]->numel;
    return tz_xmalloc((size_t)n * sizeof(float));
}

void tz_params_layout(tz_params *ps) {
    int64_t off = 0;
    ps->n_trainable = 0;
    for (int i = ps->n - 1; i >= 0; i--) {
        tz_param *p = ps->p[i];
        if (!p->trainable) {
            p->flat_off = -1;
            continue;
        }
        p->flat_off = off;
        off += (p->numel + TZ_FLAT_ALIGN - 1) / TZ_FLAT_ALIGN * TZ_FLAT_ALIGN;
        ps->n_trainable += p->numel;
    }
    ps->flat_numel = off;
    ps->n_stages = 1;
    for (int i = 0; i < ps->n; i++)
        if (ps->p[i]->stage >= ps->n_stages) ps->n_stages = ps->p[i]->stage + 1;
    free(ps->ready);
    ps->ready = tz_xcalloc((size_t)ps->n_stages, sizeof *ps->ready);
    for (int s = 0; s < ps->n_stages; s++) {
        int64_t r = ps->flat_numel;
        for (int i = 0; i < ps->n; i++) {
            const tz_param *p = ps->p[i];
            if (p->trainable && p->stage > s && p->flat_off < r) r = p->flat_off;
        }
        ps->ready[s] = r;
    }
}

void tz_params_set_grad_hook(tz_params *ps, void (*fn)(void *ctx, int64_t ready_flat), void *ctx) {
    ps->grad_hook = fn;
    ps->grad_hook_ctx = ctx;
}

void tz_params_bind_grads(tz_params *ps, float *grad) {
    for (int i = 0; i < ps->n; i++)
        ps->p[i]->g = ps->p[i]->trainable ? grad + ps->p[i]->flat_off : NULL;
}

void tz_params_drop_init(tz_params *ps) {
    for (int i = 0; i < ps->n; i++) {
        free(ps->p[i]->init);
        ps->p[i]->init = NULL;
    }
}

void tz_param_upload(tz_backend *be, tz_param *p, const float *host, int64_t off, int64_t n) {
    if (off < 0 || n < 0 || off + n > p->numel)
        TZ_FATAL("%s: upload of elements %lld..%lld of %lld", p->name, (long long)off,
                 (long long)(off + n), (long long)p->numel);
    if (!p->w16) {
        be->upload(be, p->w + off, host, (size_t)n * sizeof(float));
        return;
    }
    uint16_t *h = tz_xmalloc((size_t)(n ? n : 1) * sizeof *h);
    tz_dtype_from_f32(TZ_DT_BF16, host, h, n);
    be->upload(be, (uint16_t *)(void *)p->w + off, h, (size_t)n * sizeof *h);
    free(h);
}

void tz_param_download(tz_backend *be, const tz_param *p, float *host) {
    if (!p->w16) {
        be->download(be, host, p->w, (size_t)p->numel * sizeof(float));
        return;
    }
    uint16_t *h = tz_xmalloc((size_t)(p->numel ? p->numel : 1) * sizeof *h);
    be->download(be, h, p->w, (size_t)p->numel * sizeof *h);
    tz_dtype_to_f32(TZ_DT_BF16, h, host, p->numel);
    free(h);
}

/* ---- random weights (model.path "preset:NAME") ---- */

#define FILL_CHUNK ((int64_t)1 << 22) /* elements generated and uploaded at a time */

void tz_params_fill_random(tz_params *ps, tz_backend *be, const float *levels, uint64_t seed) {
    if (be->plan) return;
    float *buf = tz_xmalloc((size_t)FILL_CHUNK * sizeof(float));
    const float a = 0.02f * sqrtf(3.0f); /* uniform(-a, a): deviation 0.02 */
    for (int i = 0; i < ps->n; i++) {
        tz_param *p = ps->p[i];
        if (p->adapter) continue;
        tz_rng r = tz_rng_make(seed, (uint64_t)i, TZ_RNG_INIT, 0);
        if (!p->q) {
            for (int64_t at = 0; at < p->numel; at += FILL_CHUNK) {
                int64_t n = p->numel - at < FILL_CHUNK ? p->numel - at : FILL_CHUNK;
                for (int64_t k = 0; k < n; k++)
                    buf[k] = p->ndim == 1 ? 1.0f : a * (2.0f * tz_rng_uniform(&r) - 1.0f);
                tz_param_upload(be, p, buf, at, n);
            }
            continue;
        }
        const tz_qweight *q = p->q;
        /* uniform codes: the decoded values' mean square is scale^2 * mean(levels^2) */
        double ms = 0.0;
        const int nl = 1 << q->bits;
        for (int k = 0; k < nl; k++) ms += (double)levels[k] * levels[k] / nl;
        const uint16_t s = tz_f32_to_bf16((float)(0.02 / sqrt(ms > 0 ? ms : 1.0)));
        const int64_t cb = tz_tq_codes_bytes(p->shape[0], p->shape[1], q->bits);
        const int64_t ns = tz_tq_scales_count(p->shape[0], p->shape[1], q->group);
        const int64_t chunk = FILL_CHUNK * (int64_t)sizeof(float);
        uint8_t *bytes = (uint8_t *)buf;
        for (int64_t at = 0; at < cb; at += chunk) {
            int64_t n = cb - at < chunk ? cb - at : chunk;
            for (int64_t k = 0; k < n; k += 8) {
                uint64_t x = tz_rng_u64(&r);
                memcpy(bytes + k, &x, (size_t)(n - k < 8 ? n - k : 8));
            }
            tz_qweight_codes_put(be, p->q, (size_t)at, bytes, (size_t)n);
        }
        uint16_t *sc = (uint16_t *)buf;
        const int64_t sch = chunk / 2;
        for (int64_t at = 0; at < ns; at += sch) {
            int64_t n = ns - at < sch ? ns - at : sch;
            for (int64_t k = 0; k < n; k++) sc[k] = s;
            be->upload(be, q->scales + at, sc, (size_t)n * sizeof *sc);
        }
    }
    free(buf);
}

int64_t tz_params_count_scales(const tz_params *ps) {
    int64_t n = 0;
    for (int i = 0; i < ps->n; i++)
        if (ps->p[i]->q)
            n += tz_tq_scales_count(ps->p[i]->shape[0], ps->p[i]->shape[1], ps->p[i]->q->group);
    return n;
}
