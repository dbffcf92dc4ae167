/* DiT (Peebles & Xie, class-conditional diffusion transformer): patch embedding, fixed 2-D
 * sin-cos positions, timestep and label embeddings, adaLN-Zero blocks, final layer; every
 * linear a tz_linear (LoRA, quantization, its bias). The diffusion maths is elsewhere
 * (model/diffusion.h); this file maps (x_t, t, y) to the prediction and its gradients. */
#ifndef TZ_DIT_H
#define TZ_DIT_H
#include <stddef.h>
#include <stdint.h>

#include "core/arena.h"
#include "core/backend.h"
#include "model/linear.h"
#include "model/params.h"
#include "model/model_base.h"

/* The projections LoRA can adapt (bit 1 << TZ_DIT_x in tz_model_opts.lora.targets). ADALN
 * adapts every block's adaLN_modulation.1 and the final layer's. */
enum { TZ_DIT_QKV, TZ_DIT_PROJ, TZ_DIT_FC1, TZ_DIT_FC2, TZ_DIT_ADALN, TZ_DIT_LIN_N };
/* PEFT target_modules names: "attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2",
 * "adaLN_modulation.1" (suffixes of the module names, as PEFT matches them). */
extern const char *const tz_dit_lin_names[TZ_DIT_LIN_N];

/* The training objective the weights are for (config.json "diffusion"). */
enum tz_diff_kind { TZ_DIFF_DDPM = 0, TZ_DIFF_FLOW = 1 };

typedef struct tz_dit_dims {
    int64_t input_size;   /* image (or latent) side H = W */
    int64_t patch_size;   /* p; input_size % p == 0 */
    int64_t in_channels;  /* C */
    int64_t hidden;       /* hidden_size, a multiple of 4 and of num_heads */
    int64_t depth;        /* blocks */
    int64_t num_heads;
    double mlp_ratio;     /* MLP hidden = (int64_t)(hidden * mlp_ratio), as int() in DiT */
    int64_t num_classes;  /* >= 1; the label table has one more row (the null class) when
                           * class_dropout_prob > 0, as in DiT */
    double class_dropout_prob;
    int learn_sigma;      /* 1: 2*C output channels (the second C unused by the loss) */
    int64_t freq_dim;     /* sinusoidal timestep features, 256 in DiT */
    int diffusion;        /* enum tz_diff_kind */
} tz_dit_dims;

/* Derived sizes. */
static inline int64_t tz_dit_tokens(const tz_dit_dims *d) {
    return (d->input_size / d->patch_size) * (d->input_size / d->patch_size);
}
static inline int64_t tz_dit_out_channels(const tz_dit_dims *d) {
    return d->learn_sigma ? 2 * d->in_channels : d->in_channels;
}
static inline int64_t tz_dit_mlp_hidden(const tz_dit_dims *d) {
    return (int64_t)((double)d->hidden * d->mlp_ratio);
}
static inline int64_t tz_dit_label_rows(const tz_dit_dims *d) {
    return d->num_classes + (d->class_dropout_prob > 0.0);
}
/* The null-class label (classifier-free guidance), or -1 when the model has none. */
static inline int32_t tz_dit_null_class(const tz_dit_dims *d) {
    return d->class_dropout_prob > 0.0 ? (int32_t)d->num_classes : -1;
}
/* Values of one input image (C x H x W). */
static inline int64_t tz_dit_image_numel(const tz_dit_dims *d) {
    return d->in_channels * d->input_size * d->input_size;
}

/* 0, or non-zero with the first inconsistency in err. */
int tz_dit_check_dims(const tz_dit_dims *d, char *err, size_t errlen);
/* The family's named shapes, for `init-model --arch dit --preset NAME` and for model.path
 * "preset:NAME" (random weights built in memory: bench --preset): "tiny" (28x28x1, patch 4,
 * hidden 64, depth 2, 4 heads, 10 classes) and "small" (28x28x1, patch 2, hidden 128, depth
 * 4, 4 heads, 10 classes); "dit-xl-2" (DiT-XL/2: 4x32x32 latents, patch 2, hidden 1152,
 * depth 28, 16 heads, 1000 classes, learned sigma) and "dit-tiny" (4x8x8, patch 2, hidden 64,
 * depth 2, 4 heads, 10 classes, learned sigma). 0, or non-zero with a message. */
int tz_dit_preset(const char *name, tz_dit_dims *d, char *err, size_t errlen);

/* Options: model/model_base.h (tz_model_opts); lora.targets bits are 1 << TZ_DIT_x. A
 * quantized frozen base (quant.bits > 0) stores the weights of every block's attn.qkv,
 * attn.proj, mlp.fc1, mlp.fc2 and adaLN_modulation.1 (the bulk of the parameters) as codes +
 * scales, run as tq linears as Llama's projections are. Biases, x_embedder, t_embedder, the
 * label table and the final layer stay dense (small, and the first and last layers are the
 * most sensitive). quant.group must divide hidden_size and the MLP width (fatal otherwise);
 * full training of a quantized base is refused. */

typedef struct tz_dit_block {
    tz_linear lin[TZ_DIT_LIN_N];    /* qkv, proj, fc1, fc2, adaLN_modulation.1 */
} tz_dit_block;

/* Saved activations of one block ([n*T, ...] token rows, [n, ...] conditioning rows). */
typedef struct tz_dit_acts {
    /* qkv: [n*T, 3 hidden], bf16 bit patterns where tz_dit.qkv16; h1, h2, g: likewise where
     * tz_dit.x16 */
    float *mod, *mean1, *rstd1, *ln1, *h1, *qkv, *lse, *att, *ao, *x2;
    float *mean2, *rstd2, *ln2, *h2, *f, *g, *mo;
    float *lh[TZ_DIT_LIN_N]; /* LoRA hidden x A^T per projection (NULL if not adapted) */
} tz_dit_acts;

typedef struct tz_dit {
    tz_dit_dims d;
    tz_model_opts o;
    tz_backend *be;
    tz_params params;
    int *init_rule;     /* initialisation rule of each parameter, by registration index */
    tz_linear x_emb, t_fc1, t_fc2, f_ada, f_lin; /* every DiT linear has a bias */
    tz_param *y_table;
    tz_dit_block *blocks;
    float *pos_embed;   /* [T, hidden], backend memory, fixed */
    int cond_trainable; /* a gradient must flow into the timestep / label embedders */
    tz_tq_codebook cb;  /* codebook of o.quant.bits (TurboQuant) */
    float levels[TZ_TQ_MAX_LEVELS]; /* the code values of o.quant (tz_tq_levels) */
    tz_tq_scratch tq;   /* the one decode tile + rotation buffer, in the arena */
    void *att_ws;       /* attention's workspace in the arena, lent to each call */
    size_t att_ws_bytes; /* (tz_attention_ws_bytes: 0 and NULL where none is wanted) */
    /* activations for batches of up to B images (tz_dit_setup); n is the current batch */
    int64_t B, n;
    /* the inputs of qkv, fc1 and fc2 (h1, h2, g) kept in bf16 for the backward: with bf16
     * GEMM operands, dense weights and a backward (the GEMMs read them rounded anyway) */
    int x16;
    /* the fused projection's q, k, v kept in bf16 (made in fp32 in df, free in a forward, then
     * rounded once): where x16 and attention takes them so (tz_attention_takes_bf16: the flash
     * kernels on the tensor cores, which round them to bf16 as they load them anyway) */
    int qkv16;
    tz_arena arena;
    float *img, *target, *patches, *tfreq, *t_h, *t_s, *temb, *c, *sc;
    int32_t *labels;
    tz_layer_stack stack; /* residual streams [B*T, hidden] and tz_dit_acts sets */
    float *fmod, *fmean, *frstd, *fln, *fh, *fo, *f_lh, *out_img, *sse;
    float *dres, *da, *db, *dqkv, *df, *dg, *dmod, *dsc, *dc, *dt, *dfo, *dimg;
    float *dlora;
    float *tfreq_host, *sse_host;
    /* Attention's outputs kept for backward (model_base.h; on: training with checkpointing on
     * a device): a block's recomputation reads the att and lse its forward made instead of
     * running attention again. The set's att and lse point at block i's buffer while it runs;
     * buffer 0 is the set's own. */
    tz_att_keep keep;
} tz_dit;

/* Register every parameter (zeroed; adapters per opts), each with its backward stage (0: the
 * final layer, 1..depth: blocks depth-1 .. 0, depth+1: the embedders; tz_params.ready), and
 * compute the position table.
 * Fatal on inconsistent dims. */
tz_dit *tz_dit_create(tz_backend *be, const tz_dit_dims *d, const tz_model_opts *o);
void tz_dit_free(tz_dit *m);
/* DiT's initialize_weights: xavier-uniform linears (x_embedder on the flattened patch),
 * zero biases, normal(0, 0.02) label table and timestep MLP, adaLN-Zero: every
 * adaLN_modulation and the final linear zero. Adapters are left alone. */
void tz_dit_init_random(tz_dit *m, uint64_t seed);
/* Size the activation arena for batches of up to B images and allocate it (current batch
 * B). Bytes it needs: */
void tz_dit_setup(tz_dit *m, int64_t B);
size_t tz_dit_arena_bytes(const tz_dit *m, int64_t B);
/* Current batch n <= B (the last, partial batch of an eval; the sampler). */
void tz_dit_set_batch(tz_dit *m, int64_t n);

/* Inputs on the host, for the current batch n: x_t [n, C, H, W], t [n] (the model time:
 * DDPM step 0..999, or 1000 * t for flow, see diffusion.h), y [n] (0 <= y < num_classes, or
 * the null class), target [n, C, H, W]. */

/* Prediction only; tz_dit_output gives it, [n, C_out, H, W] in backend memory. */
void tz_dit_forward(tz_dit *m, const float *x_t, const float *t, const int32_t *y);
static inline const float *tz_dit_output(const tz_dit *m) { return m->out_img; }
/* Forward and the sum of squared errors of the first C output channels against target. */
double tz_dit_forward_loss(tz_dit *m, const float *x_t, const float *t, const int32_t *y,
                           const float *target);
/* Forward, loss, backward of dloss * SSE into the trainable parameters' g (accumulated);
 * returns the SSE (the caller's mean: dloss = 1 / (elements of the global batch)). */
double tz_dit_forward_backward(tz_dit *m, const float *x_t, const float *t, const int32_t *y,
                               const float *target, float dloss);

#endif
