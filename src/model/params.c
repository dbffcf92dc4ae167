/* Parameter table bookkeeping: registration, look-up and the flat layout of trainables.
 * Owns the weight allocations; the gradient buffer is owned by the trainer. */
#include "model/params.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

void tz_params_init(tz_params *ps) { memset(ps, 0, sizeof *ps); }

void tz_params_free(tz_params *ps, tz_backend *be) {
    for (int i = 0; i < ps->n; i++) {
        if (!(ps->flat_w && ps->p[i]->trainable)) be->release(be, ps->p[i]->w);
        free(ps->p[i]);
    }
    if (ps->flat_w) be->release(be, ps->flat_w);
    free(ps->p);
    memset(ps, 0, sizeof *ps);
}

tz_param *tz_params_add(tz_params *ps, tz_backend *be, const char *name, int ndim, int64_t d0,
                        int64_t d1, int trainable, int decay, int adapter) {
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
    p->w = be->alloc(be, (size_t)p->numel * sizeof(float));
    ps->n_total += p->numel;
    return p;
}

tz_param *tz_params_find(tz_params *ps, const char *name) {
    for (int i = 0; i < ps->n; i++)
        if (!strcmp(ps->p[i]->name, name)) return ps->p[i];
    return NULL;
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
}

void tz_params_bind_grads(tz_params *ps, float *grad) {
    for (int i = 0; i < ps->n; i++)
        ps->p[i]->g = ps->p[i]->trainable ? grad + ps->p[i]->flat_off : NULL;
}

void tz_params_flatten_weights(tz_params *ps, tz_backend *be) {
    if (ps->flat_w || ps->flat_numel == 0) return;
    ps->flat_w = be->alloc(be, (size_t)ps->flat_numel * sizeof(float));
    for (int i = 0; i < ps->n; i++) {
        tz_param *p = ps->p[i];
        if (!p->trainable) continue;
        float *w = ps->flat_w + p->flat_off;
        be->copy(be, w, p->w, (size_t)p->numel * sizeof(float));
        be->release(be, p->w);
        p->w = w;
    }
}
