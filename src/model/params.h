/* The parameter table: every tensor of a model (weights and LoRA adapters) by its HF/PEFT
 * name, with shape, backend storage (dense fp32, or quantized codes + scales), trainability,
 * and its place in the flat space. No quantization math here (src/quant). */
#ifndef TZ_PARAMS_H
#define TZ_PARAMS_H
#include <stdint.h>

#include "core/backend.h"

#define TZ_NAME_MAX 128
/* Every trainable tensor starts at a multiple of this many elements in the flat space (a
 * multiple of every TurboQuant group size, so slices never split a group). */
#define TZ_FLAT_ALIGN 256

/* A frozen quantized weight [rows, cols] in backend memory, laid out as quant/tq_layout.h
 * says. method: TZ_TQ_TURBOQUANT (codes in the rotated basis, signs from seed) or
 * TZ_TQ_ABSMAX (the baseline: plain basis). levels: what each code decodes to before the
 * group's scale (quant/turboquant.h, tz_tq_levels). */
typedef struct tz_qweight {
    int method, bits, group;
    uint64_t seed;
    uint8_t *codes;    /* rows * cols * bits / 8 bytes of backend memory; for a weight whose
                        * codes live on the host (host != NULL) a place in a device slot
                        * while its block is loaded (tz_wstream), else NULL */
    uint8_t *host;     /* the codes in pinned host memory (streamed weights), else NULL */
    uint16_t *scales;  /* rows * cols / group, bf16 bit patterns */
    float *levels;     /* 2^bits floats */
} tz_qweight;

typedef struct tz_param {
    char name[TZ_NAME_MAX];
    int ndim;
    int64_t shape[2];
    int64_t numel;
    float *w;          /* backend memory, numel floats; NULL when quantized. With w16 set it
                        * holds numel bf16 bit patterns instead (read it only through
                        * tz_matmul_w / tz_embedding_w / tz_param_upload / tz_param_download) */
    int w16;           /* a frozen dense matrix stored in bf16: set by tz_params_add on a
                        * backend whose matmul takes bf16 operands (matmul_dtype), where the
                        * GEMM would round it to bf16 anyway; half the memory, no conversion */
    tz_qweight *q;     /* quantized storage (frozen); NULL when dense */
    size_t bytes;      /* backend bytes the weight holds (w, or codes + scales + levels) */
    float *g;          /* gradient in the flat gradient buffer; NULL when frozen */
    float *init;       /* host: the dense values a trainable quantized weight was quantized
                        * from (its fp32 master starts there), kept until the optimizer has
                        * read them (tz_params_drop_init); NULL otherwise */
    int trainable;
    int decay;         /* weight decay applies (matrices and adapters, not norms) */
    int adapter;       /* a LoRA tensor (saved with the adapter, not with the model) */
    int64_t flat_off;  /* offset in the flat trainable space; -1 when frozen */
    int stage;         /* the backward stage after which its gradient is final (0: the first
                        * stage of backward); the model sets it at registration */
} tz_param;

typedef struct tz_params {
    tz_param **p;       /* each allocated on its own, so pointers to it stay valid */
    int n, cap;
    int64_t flat_numel; /* padded length of the flat trainable space */
    int64_t n_trainable; /* trainable elements, without padding */
    int64_t n_total;     /* all elements */
    /* Gradient readiness, so communication can overlap backward: once backward stage s is
     * done, every trainable gradient below flat offset ready[s] is final (ready[s] = the
     * lowest offset of a trainable tensor whose stage is > s, else flat_numel). */
    int64_t *ready;      /* n_stages entries, set by tz_params_layout */
    int n_stages;        /* 1 + the largest stage */
    void (*grad_hook)(void *ctx, int64_t ready_flat); /* called by tz_params_stage_done */
    void *grad_hook_ctx;
    /* Called when a forward pass with its loss is done and its backward begins (a
     * benchmark's phase clock; NULL: none). */
    void (*backward_hook)(void *ctx);
    void *backward_hook_ctx;
    /* Weight readiness, the mirror of ready[]: the optimizer may leave the updated weights
     * on their way to the backend (copies in forward order, optim/zero.c) and install this
     * hook; a forward pass then calls tz_params_weights_needed(ps, s) before it reads the
     * weights of backward stage s (the stages from n_stages - 1 down to 0), and whatever else
     * reads or writes trainable weights (saving, loading) calls tz_params_weights_all first.
     * weights_staged: the model makes these calls in every pass that reads trainable
     * weights; without it the optimizer makes the backend wait for all of them at once. */
    void (*weights_hook)(void *ctx, int64_t lo_flat); /* every trainable weight at or above
                                                        * flat offset lo_flat is needed */
    void *weights_hook_ctx;
    int weights_staged;
    /* Set by a model while it registers the weights of streamed blocks: the quantized weights
     * registered meanwhile keep their codes in pinned host memory (tz_qweight.host). */
    int codes_on_host;
} tz_params;

void tz_params_init(tz_params *ps);
/* Host fp32 values into elements off .. off+n-1 of p's weight (rounded to bf16, nearest
 * even, when p->w16), and p's whole weight back to the host as fp32. */
void tz_param_upload(tz_backend *be, tz_param *p, const float *host, int64_t off, int64_t n);
void tz_param_download(tz_backend *be, const tz_param *p, float *host);
void tz_params_free(tz_params *ps, tz_backend *be);
/* Register a tensor, allocate it in backend memory (zeroed); returns its weight pointer. A
 * frozen base matrix (ndim 2, neither trainable nor an adapter) on a backend with bf16
 * GEMM operands is stored in bf16 (w16). */
tz_param *tz_params_add(tz_params *ps, tz_backend *be, const char *name, int ndim, int64_t d0,
                        int64_t d1, int trainable, int decay, int adapter);
tz_param *tz_params_find(tz_params *ps, const char *name);
/* A host array of floats as large as the largest tensor whose adapter flag is `adapters`
 * (at least 1): the staging buffer of a loader. */
float *tz_params_host_buffer(const tz_params *ps, int adapters);
/* Register a quantized weight [d0, d1]: codes, scales (zeroed) and levels (copied from the
 * host array of 2^bits floats) in backend memory; no fp32 copy is ever made on the backend.
 * Frozen; a model makes it trainable (full fine-tuning) before tz_params_layout. */
tz_param *tz_params_add_quant(tz_params *ps, tz_backend *be, const char *name, int64_t d0,
                              int64_t d1, int method, int bits, int group, uint64_t seed,
                              const float *levels);
/* Change a 2-D weight's storage, before its values are loaded: to quantized (as
 * tz_params_add_quant), or to dense fp32 (zeroed). The old storage is released. A trainable
 * quantized weight (full fine-tuning) has a gradient like a dense one; its fp32 master lives
 * only in the optimizer's host shard, the backend holds codes + scales. */
void tz_param_make_quant(tz_param *p, tz_backend *be, int method, int bits, int group,
                         uint64_t seed, const float *levels);
void tz_param_make_dense(tz_param *p, tz_backend *be);
/* n bytes of q's codes at byte offset off from (put) or into (get) host memory, wherever the
 * codes live (backend memory, or pinned host memory for a streamed weight). */
void tz_qweight_codes_put(tz_backend *be, tz_qweight *q, size_t off, const void *src, size_t n);
void tz_qweight_codes_get(tz_backend *be, const tz_qweight *q, void *dst, size_t off, size_t n);
/* Bytes of codes kept in host memory (streamed weights). */
size_t tz_params_host_codes_bytes(const tz_params *ps);
/* Frees every p->init (host copies of dense sources). */
void tz_params_drop_init(tz_params *ps);
/* Backend bytes held by all weights (dense and quantized), gradients excluded. */
size_t tz_params_bytes(const tz_params *ps);
/* Lay the trainable tensors out in one flat space in backward order (the reverse of
 * registration, which is forward order), each at a multiple of TZ_FLAT_ALIGN, and compute
 * ready[] from the stages. bind_grads points each trainable tensor's g into grad (flat_numel
 * floats of backend memory). */
void tz_params_layout(tz_params *ps);
void tz_params_bind_grads(tz_params *ps, float *grad);
/* The hook that hears of final gradients (fn NULL: none). A model calls stage_done after
 * each backward stage, 0 .. n_stages-1 in order; the hook gets ready[s]. */
void tz_params_set_grad_hook(tz_params *ps, void (*fn)(void *ctx, int64_t ready_flat), void *ctx);
static inline void tz_params_stage_done(const tz_params *ps, int s) {
    if (ps->grad_hook) ps->grad_hook(ps->grad_hook_ctx, ps->ready[s]);
}
/* Before a forward pass reads the trainable weights of backward stage s: the weights of
 * stages s and above (the flat space from the lowest offset of a tensor of stage >= s up). */
static inline void tz_params_weights_needed(const tz_params *ps, int s) {
    if (!ps->weights_hook) return;
    const int64_t lo = s <= 0 ? 0 : s > ps->n_stages ? ps->flat_numel : ps->ready[s - 1];
    if (lo < ps->flat_numel) ps->weights_hook(ps->weights_hook_ctx, lo);
}
/* Before anything else that reads or writes trainable weights on the backend. */
static inline void tz_params_weights_all(const tz_params *ps) {
    if (ps->weights_hook) ps->weights_hook(ps->weights_hook_ctx, 0);
}
/* A model calls it between the forward pass (loss included) and the backward pass (every
 * trainable weight is needed from here on). */
static inline void tz_params_backward_begins(const tz_params *ps) {
    tz_params_weights_all(ps);
    if (ps->backward_hook) ps->backward_hook(ps->backward_hook_ctx);
}

/* Random base weights for a model built from a named shape (model.path "preset:NAME"), fast
 * at any size: dense matrices uniform with standard deviation 0.02, norms 1, and a quantized
 * weight random codes with the scale that gives its decoded values the same deviation
 * (levels: the 2^bits code values of the model's quantization, host memory). No quantizer
 * runs. Adapters are left alone; nothing is done on a planning backend (be->plan). */
void tz_params_fill_random(tz_params *ps, tz_backend *be, const float *levels, uint64_t seed);

/* The scales of the quantized weights of ps (what train.mode = "qzo" trains). */
int64_t tz_params_count_scales(const tz_params *ps);

#endif
