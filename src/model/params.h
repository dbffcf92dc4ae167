/* The parameter table: every tensor of a model (weights and LoRA adapters) by its HF/PEFT
 * name, with shape, backend pointers, trainability, and its place in the flat space. */
#ifndef TZ_PARAMS_H
#define TZ_PARAMS_H
#include <stdint.h>

#include "core/backend.h"

#define TZ_NAME_MAX 128
/* Every trainable tensor starts at a multiple of this many elements in the flat space (a
 * multiple of every TurboQuant group size, so slices never split a group). */
#define TZ_FLAT_ALIGN 256

typedef struct tz_param {
    char name[TZ_NAME_MAX];
    int ndim;
    int64_t shape[2];
    int64_t numel;
    float *w;          /* backend memory */
    float *g;          /* gradient in the flat gradient buffer; NULL when frozen */
    int trainable;
    int decay;         /* weight decay applies (matrices and adapters, not norms) */
    int adapter;       /* a LoRA tensor (saved with the adapter, not with the model) */
    int64_t flat_off;  /* offset in the flat trainable space; -1 when frozen */
} tz_param;

typedef struct tz_params {
    tz_param **p;       /* each allocated on its own, so pointers to it stay valid */
    int n, cap;
    int64_t flat_numel; /* padded length of the flat trainable space */
    int64_t n_trainable; /* trainable elements, without padding */
    int64_t n_total;     /* all elements */
    float *flat_w;       /* trainable weights, one backend buffer over the flat space (or NULL) */
} tz_params;

void tz_params_init(tz_params *ps);
void tz_params_free(tz_params *ps, tz_backend *be);
/* Register a tensor, allocate it in backend memory (zeroed); returns its weight pointer. */
tz_param *tz_params_add(tz_params *ps, tz_backend *be, const char *name, int ndim, int64_t d0,
                        int64_t d1, int trainable, int decay, int adapter);
tz_param *tz_params_find(tz_params *ps, const char *name);
/* Lay the trainable tensors out in one flat space in backward order (the reverse of
 * registration, which is forward order), each at a multiple of TZ_FLAT_ALIGN, and point
 * each trainable tensor's g into grad (flat_numel floats of backend memory). */
void tz_params_layout(tz_params *ps);
void tz_params_bind_grads(tz_params *ps, float *grad);
/* Move every trainable tensor's weights into one backend buffer laid out like the flat
 * space (gaps zero), so whole buckets of updated weights can be gathered into place. */
void tz_params_flatten_weights(tz_params *ps, tz_backend *be);

#endif
