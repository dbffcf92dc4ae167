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
    /* RoPE scaling (HF rope_scaling): TZ_ROPE_DEFAULT, or TZ_ROPE_LLAMA3 (Llama 3.1 / 3.2)
     * with its factor, low_freq_factor, high_freq_factor and original_max_position_embeddings */
    int rope_type;
    double rope_factor, rope_low_freq, rope_high_freq;
    int64_t rope_orig_max;
    /* Qwen2/Qwen2.5 (HF model_type "qwen2"): biases on the q, k and v projections; Qwen3
     * ("qwen3"): q_norm and k_norm, an RMSNorm over each head of q and of k before RoPE. Both
     * 0: Llama (and Mistral without a sliding window). */
    int qkv_bias, qk_norm;
} tz_llama_dims;
enum { TZ_ROPE_DEFAULT = 0, TZ_ROPE_LLAMA3 = 1 };

/* The head_dim/2 RoPE frequencies of d into inv (host floats), computed in float as HF does:
 * inv[i] = 1 / theta^(2i/head_dim), then for TZ_ROPE_LLAMA3 (wavelength w = 2 pi / inv[i],
 * L = original_max_position_embeddings): w < L / high_freq_factor: kept; w > L /
 * low_freq_factor: divided by factor; between: (1 - s) inv / factor + s inv with
 * s = (L / w - low_freq_factor) / (high_freq_factor - low_freq_factor). */
void tz_llama_inv_freq(const tz_llama_dims *d, float *inv);

/* The family's named shapes, for `init-model --arch llama --preset NAME` and for model.path
 * "preset:NAME" (random weights built in memory: bench --preset), every one with eps 1e-5 and
 * theta 1e4: "tiny" (dim 128, 2 layers, 4 heads / 2 kv, MLP 352), "mini" (192, 4, 6 / 2,
 * 512) and "small" (256, 6, 8 / 4, 688), tied, 2048 positions, vocab the caller's;
 * "llama2-7b" (Llama-2-7B: 4096, 32, 32 / 32, 11008, untied, vocab 32000, 4096 positions)
 * and "llama-tiny" (tiny untied, vocab 256). vocab > 0 replaces the shape's. 0, or non-zero
 * with what was expected in err. */
int tz_llama_preset(const char *name, int64_t vocab, tz_llama_dims *d, char *err, size_t errlen);

/* Options: model/model_base.h (tz_model_opts); lora.targets bits are 1 << TZ_LIN_x. A
 * quantized base (quant.bits > 0) stores the seven projections of every block as codes +
 * scales (quant/turboquant.h); a projection whose `in` is not a multiple of group uses the
 * largest group of group/2, ..., 64 that divides it, or stays dense when none does
 * (tz_tq_group_for). Embeddings, norms and the output head stay dense. */

typedef struct tz_llama_layer {
    tz_param *attn_norm, *mlp_norm;
    tz_param *q_norm, *k_norm; /* [head_dim] each, with dims.qk_norm; else NULL */
    tz_linear lin[TZ_LIN_N];   /* q, k, v with a bias where dims.qkv_bias */
} tz_llama_layer;

/* Saved activations of one layer for one batch ([B*T, ...] rows). */
/* Logits are made, turned into losses and (in backward) into the head's gradients a chunk of
 * rows at a time, so that at most this many floats of logits exist (64 MiB; at a 32000-token
 * vocabulary 524 rows: four chunks for a 2048-token sequence instead of 250 MiB at once). */
#define TZ_LLAMA_HEAD_FLOATS ((int64_t)1 << 24)
/* Training with activation checkpointing runs the MLP (gate, up, SwiGLU, down and their
 * gradients) on chunks of rows when the B*T rows of a hidden-sized buffer exceed this many
 * floats (24 MiB): equal chunks of at most TZ_LLAMA_MLP_FLOATS / hidden rows each in backward
 * (at Llama-2-7B's hidden 11008 and 2048 tokens, four of 512), fewer in forward, which needs
 * three hidden-sized buffers instead of five (there three of 683). See tz_llama.mlp_rows.
 * With frozen TurboQuant MLP weights on a GPU, chunks of the hidden size instead, all rows at
 * once, at most TZ_LLAMA_MLP_FLOATS / (B*T) columns each in backward (the 7B: four of 2,816;
 * in forward three of 3,840), so that each weight is decoded once a pass (tz_llama.mlp_cols). */
#define TZ_LLAMA_MLP_FLOATS ((int64_t)6 << 20)

typedef struct tz_llama_acts {
    float *h1, *rstd1, *q, *k, *v, *att, *lse, *x2, *h2, *rstd2, *g, *u, *s;
    float *qn, *kn, *rq, *rk; /* dims.qk_norm: q and k before their norm, its 1/rms per head */
    float *lh[TZ_LIN_N]; /* LoRA hidden x A^T per projection (NULL if not adapted) */
    uint16_t *q16, *k16, *v16; /* tz_llama.att16: q and k after RoPE, and v, in bf16 */
} tz_llama_acts;

/* The backward's buffers of the MLP in chunks of columns (tz_llama.mlp_cols), in the pool. */
typedef struct tz_llama_mlp_fc {
    float *g, *u, *s, *du, *ds;  /* B*T x mlp_cols each */
    uint16_t *dres16;            /* dres rounded once for the down projection's GEMMs */
    uint8_t *codes;              /* a window of down's codes, [dim, mlp_cols] */
    uint16_t *scales;            /* and of its scales */
    float *dh, *a, *da, *da_all; /* its adapter: dh [B*T, r], A's window [r, mlp_cols] and
                                  * its gradient's, the whole gradient [r, hidden] */
    float *xr;                   /* h2 rotated and rounded once for gate's and up's chunks
                                  * (tz_linear_fwd_shared_prep's room) */
    int64_t xr_floats;
} tz_llama_mlp_fc;

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
    void *att_ws;             /* attention's workspace in the arena, lent to each call */
    size_t att_ws_bytes;      /* (tz_attention_ws_bytes: 0 and NULL where none is wanted) */
    float *inv_freq;          /* head_dim/2 RoPE frequencies (backend memory), made when
                               * first needed (rope_scaling, or generation) */
    /* activations for batches of B sequences of T tokens (set by tz_llama_setup) */
    int64_t B, T;
    tz_arena arena;
    tz_layer_stack stack;     /* residual streams [BT, C] and tz_llama_acts sets */
    float *hf, *rstdf, *logits, *losses;
    int64_t head_rows;        /* rows of logits the head computes at a time (tz_llama_setup:
                               * all B*T when B*T*vocab <= TZ_LLAMA_HEAD_FLOATS, else as many
                               * as fit, at least 1; head_rows_max > 0 caps it) */
    int64_t head_rows_max;    /* 0: by TZ_LLAMA_HEAD_FLOATS alone */
    int32_t *tok, *tgt;
    float *dres, *dh, *dq, *dk, *dv, *datt, *dg, *du, *ds, *dlora;
    float *dqn, *dkn;         /* dims.qk_norm: the gradients of q and k before their norm */
    int bwd_in_set;           /* dq, dk, dv, datt, dg live in activations already read (then
                               * those five pointers are NULL: llama.c's layer_bwd) */
    /* MLP chunks (checkpointing, training): mlp_rows < B*T rows at a time. The set's g, u, s
     * and du, ds then hold mlp_rows rows each, in one pool that also holds, when each is
     * in use, the head's hf and logits and the attention's dk and dv; h2 shares h1's
     * memory (h1 is made again from the layer input before the q, k, v backward), datt
     * and dq take h2's and x2's once those are read (the pool's where q is wider than the
     * model); backward makes each chunk's g, u, s again from h2 (the recomputation of a
     * layer stops at h2). */
    int64_t mlp_rows;         /* rows of the MLP at a time (B*T: no chunks) in backward */
    int64_t mlp_rows_fwd;     /* in forward, which needs g, u, s only: as many as the pool
                               * and the rotation buffer hold (at least mlp_rows) */
    int64_t mlp_rows_max;     /* 0: by TZ_LLAMA_MLP_FLOATS; > 0: at most this many (tests) */
    int mlp_chunked;
    /* MLP chunks of columns instead of rows (llama.c's mlp_cols_ok: a device with bf16 GEMMs,
     * frozen TurboQuant gate, up and down weights): every row at once on mlp_cols columns of
     * the hidden size at a time (gate's and up's rows, down's columns), so that each weight
     * is decoded once a pass instead of once a chunk of rows; 0: chunks of rows. The pool
     * then holds g, u, s, du, ds of B*T x mlp_cols each, dres rounded to bf16, the window of
     * the down projection's codes and scales, and its adapter's pieces (mlp_fc). */
    int64_t mlp_cols;         /* in backward (a multiple of twice down's group) */
    int64_t mlp_cols_fwd;     /* in forward (g, u, s only: as many as the pool holds) */
    int64_t mlp_cols_max;     /* 0: by TZ_LLAMA_MLP_FLOATS; > 0: at most this many (tests);
                               * < 0: chunks of rows (tests, and TZ_MLP_COLS=0) */
    tz_llama_mlp_fc mlp_fc;
    int att16;                /* attention reads q, k, v in bf16 (the set's q16, k16, v16):
                               * a device whose flash kernels round them so as they load them,
                               * so the same results from half the bytes (llama.c keeps_att16);
                               * the fp32 q, k, v, read only to make those, then live in the
                               * set's g and u or in the pool, free in that part of a forward */
    int qk16;                 /* backward: RoPE's backward writes the gradients of q and k in
                               * bf16 (rope_bwd16) for projections that read them so (llama.c
                               * qk_dy16), into qk16_room (with chunks: the pool's end) or,
                               * without, the memory datt held (read by then) */
    float *qk16_room;
    float *pool;              /* (with chunks) */
    int64_t pool_floats;      /* its size (0: none) */
    /* memory free while attention's backward runs, lent to it for its score gradients
     * (be->att_ds): with MLP chunks the pool past dk and dv (and dq, datt where they live
     * there), without them du */
    float *ds_room;
    size_t ds_room_bytes;
    float *loss_host;         /* BT floats on the host */
    /* Attention's outputs kept for backward (model_base.h; on: training with checkpointing on
     * a device): a layer's recomputation reads the att and lse its forward made instead of
     * running attention's forward again. The set's att and lse point at layer l's buffer
     * while it runs; buffer 0 is the set's own. */
    tz_att_keep keep;
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
 * weights' scratch: one tile for the largest and one rotation buffer). On a device backend
 * whose checkpointed streams are bf16, those live in host memory
 * (tz_layer_stack_host_bytes(&m->stack) bytes, pinned), one of them in the arena. */
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
/* Logits of the last forward's last chunk of head_rows rows, [head_rows, vocab], backend
 * memory: every row's when head_rows == B*T (any model whose B*T*vocab fits in
 * TZ_LLAMA_HEAD_FLOATS). */
static inline const float *tz_llama_logits(const tz_llama *m) { return m->logits; }

/* ---- generation with a key/value cache ---- */

/* The keys and values (after RoPE) of the positions a sequence has gone through, per layer,
 * for one sequence (B = 1). */
typedef struct tz_llama_cache {
    int64_t cap, len;  /* positions it can hold; positions held (the next one's index) */
    void **k, **v;     /* n_layers buffers of [cap, n_kv_heads * head_dim], backend memory */
    int kv16;          /* the buffers hold bf16 (the backend's GEMMs take bf16), else fp32 */
} tz_llama_cache;

/* A cache for up to cap positions (backend memory; tz_llama_cache_free releases it). */
void tz_llama_cache_init(tz_llama *m, tz_llama_cache *c, int64_t cap);
void tz_llama_cache_free(tz_llama *m, tz_llama_cache *c);
/* Runs the n tokens tok (host) at positions c->len .. c->len + n - 1, appends their keys and
 * values to c, and returns the logits of the last one (vocab floats, backend memory, valid
 * until the next call). Needs tz_llama_setup(m, 1, T) with n <= T; fatal when the cache is
 * full. The logits are the forward pass's for the same prefix, up to rounding. */
const float *tz_llama_decode(tz_llama *m, tz_llama_cache *c, const int32_t *tok, int64_t n);

#endif
