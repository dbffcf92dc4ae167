/* Llama (HF LlamaForCausalLM semantics): RMSNorm, rotate-half RoPE, grouped-query
 * attention, SwiGLU MLP, optional tied embeddings; LoRA on any projection; quantized (frozen)
 * projections; forward and backward through the backend op table, optional checkpointing. */
#ifndef TZ_LLAMA_H
#define TZ_LLAMA_H
#include <stdint.h>

#include "core/arena.h"
#include "core/backend.h"
#include "model/linear.h"
#include "model/params.h"
#include "model/model_base.h"
#include "quant/codebook.h"

enum { TZ_LIN_Q, TZ_LIN_K, TZ_LIN_V, TZ_LIN_O, TZ_LIN_GATE, TZ_LIN_UP, TZ_LIN_DOWN, TZ_LIN_N };
extern const char *const tz_llama_lin_names[TZ_LIN_N]; /* "q_proj", ... */

typedef struct tz_llama_dims {
    int64_t vocab, dim, hidden, n_layers, n_heads, n_kv_heads, head_dim, max_pos;
    double eps, theta;
    int tied;
} tz_llama_dims;

/* Presets for `init-model --arch llama`, every one with tied embeddings, 2048 positions, eps
 * 1e-5 and theta 1e4: "tiny" (dim 128, 2 layers, 4 heads / 2 kv, MLP 352), "mini" (192, 4,
 * 6 / 2, 512) and "small" (256, 6, 8 / 4, 688); vocab is the caller's. 0, or non-zero with
 * what was expected in err. */
int tz_llama_preset(const char *name, int64_t vocab, tz_llama_dims *d, char *err, size_t errlen);

/* Options: model/model_base.h (tz_model_opts); lora.targets bits are 1 << TZ_LIN_x. A
 * quantized base (quant.bits > 0) stores the seven projections of every block as codes +
 * scales (quant/turboquant.h); a projection whose `in` is not a multiple of group uses the
 * largest group of group/2, ..., 64 that divides it, or stays dense when none does
 * (tz_tq_group_for). Embeddings, norms and the output head stay dense. */

typedef struct tz_llama_layer {
    tz_param *attn_norm, *mlp_norm;
    tz_linear lin[TZ_LIN_N];
} tz_llama_layer;

/* Saved activations of one layer for one batch ([B*T, ...] rows). */
typedef struct tz_llama_acts {
    float *h1, *rstd1, *q, *k, *v, *att, *lse, *x2, *h2, *rstd2, *g, *u, *s;
    float *lh[TZ_LIN_N]; /* LoRA hidden x A^T per projection (NULL if not adapted) */
} tz_llama_acts;

typedef struct tz_llama {
    tz_llama_dims d;
    tz_model_opts o;
    tz_backend *be;
    tz_params params;
    tz_param *embed, *final_norm, *lm_head; /* lm_head == embed when tied */
    tz_llama_layer *layers;
    tz_tq_codebook cb;        /* codebook of o.quant.bits (TurboQuant) */
    float levels[TZ_TQ_MAX_LEVELS]; /* the code values of o.quant (tz_tq_levels) */
    tz_tq_scratch tq;         /* the one decode tile + rotation buffer, in the arena */
    /* activations for batches of B sequences of T tokens (set by tz_llama_setup) */
    int64_t B, T;
    tz_arena arena;
    tz_layer_stack stack;     /* residual streams [BT, C] and tz_llama_acts sets */
    float *hf, *rstdf, *logits, *losses;
    int32_t *tok, *tgt;
    float *dres, *dh, *dq, *dk, *dv, *datt, *dg, *du, *ds, *dlora;
    float *loss_host;         /* BT floats on the host */
} tz_llama;

/* Register every parameter (base weights zeroed, adapters per opts), each with its backward
 * stage (0: the head, 1..n_layers: layers n_layers-1 .. 0, n_layers+1: the embedding, final
 * only at the end; tz_params.ready). Fatal for full
 * training (o->full) of a quantized base: quantization-aware training is not built yet. */
tz_llama *tz_llama_create(tz_backend *be, const tz_llama_dims *d, const tz_model_opts *o);
void tz_llama_free(tz_llama *m);
/* Random init as HF does: normal(0, 0.02) for matrices and embeddings, ones for norms; a
 * quantized weight holds the quantization of what a dense model would hold. */
void tz_llama_init_random(tz_llama *m, uint64_t seed);
/* Size the activation arena for batches of B x T and allocate it (with the quantized
 * weights' scratch: one tile for the largest and one rotation buffer). */
void tz_llama_setup(tz_llama *m, int64_t B, int64_t T);
/* Bytes the activation arena needs for B x T under the model's options. */
size_t tz_llama_arena_bytes(const tz_llama *m, int64_t B, int64_t T);

/* One micro-batch: inputs and targets [B*T] on the host (target < 0: ignored). Forward,
 * loss, backward with d(loss_r)/d(...) scaled by dloss, gradients accumulated into the
 * trainable parameters' g. Returns the sum of the per-token losses. */
double tz_llama_forward_backward(tz_llama *m, const int32_t *inputs, const int32_t *targets,
                                 float dloss);
/* Forward only; returns the sum of the per-token losses (and counts nothing ignored). */
double tz_llama_forward(tz_llama *m, const int32_t *inputs, const int32_t *targets);
/* Logits of the last forward, [B*T, vocab], backend memory. */
static inline const float *tz_llama_logits(const tz_llama *m) { return m->logits; }

#endif
