/* What every model family (Llama, DiT) builds on: its options, the LoRA initialisation,
 * host-to-backend weight uploads, and the quantized frozen base (codebook set-up, quantizing a
 * host weight into its storage, the one decode tile + rotation buffer of a model's arena).
 * Which weights a model quantizes or adapts is the model's choice; the math is src/quant's. */
#ifndef TZ_MODEL_BASE_H
#define TZ_MODEL_BASE_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/arena.h"
#include "core/backend.h"
#include "core/rng.h"
#include "model/linear.h"
#include "model/params.h"
#include "quant/codebook.h"

/* How a model's quantizable weights are stored (quant/turboquant.h). bits 0: dense. */
typedef struct tz_quant_opts {
    int method;        /* TZ_TQ_TURBOQUANT | TZ_TQ_ABSMAX (the baseline) */
    int bits;          /* 0 (dense), 1..4 */
    int group;         /* 64, 128 or 256 */
    uint64_t seed;     /* sign seed (TurboQuant) */
    int64_t offload_blocks; /* the last N blocks' codes on the host (model/wstream.h) */
} tz_quant_opts;

/* The LoRA adapters of a model (what PEFT's adapter_config.json says, model/adapter_io.h). */
typedef struct tz_lora_spec {
    int targets;       /* bit 1 << j: the family's projection j is adapted; 0: no adapters */
    int64_t rank;
    double alpha;      /* the update is alpha / rank * B A */
    int loftq;         /* the base was re-quantized with the first adapters (lora.init =
                        * "loftq"): 1; 0 the default init; -1 not recorded (an adapter
                        * written before adapters recorded it: the config's lora.init) */
    uint64_t init_seed; /* the seed of those first adapters (run.seed) */
    int embeddings;     /* the family's conditioning embeddings train too (DiT's class table;
                         * lora.train_embeddings): saved with the adapter */
} tz_lora_spec;

/* How a model is built: what trains, its adapters, checkpointing, and how the quantizable
 * weights are stored. One struct for every family. */
/* model.path "preset:NAME": a model of the family's named shape NAME (tz_llama_preset,
 * tz_dit_preset) with random weights made in memory (tz_params_fill_random) and random data;
 * no folder is read. bench --preset uses them. */
#define TZ_MODEL_PRESET_PREFIX "preset:"
static inline const char *tz_model_preset_name(const char *path) {
    return strncmp(path, TZ_MODEL_PRESET_PREFIX, sizeof TZ_MODEL_PRESET_PREFIX - 1)
               ? NULL
               : path + sizeof TZ_MODEL_PRESET_PREFIX - 1;
}

typedef struct tz_model_opts {
    int full;          /* 1: every weight trainable; 0: frozen base (adapters only) */
    tz_lora_spec lora;
    int checkpointing; /* keep only layer inputs, recompute each layer in backward */
    int forward_only;  /* forward passes only (eval, qzo): the arena holds one layer's
                        * activations and two residual streams, no backward buffers */
    tz_quant_opts quant;
    /* 1: the base has random weights: a named shape (model.path "preset:NAME"), or the
     * shapes of model.path's config.json alone (a plan: no weight is read). Random data. */
    int random_base;
} tz_model_opts;

/* What a stack of layers keeps for backward: the residual stream into each layer (and out of
 * the last), and each layer's saved activations (the family's struct, set_bytes each) or,
 * with activation checkpointing, one set shared by every layer and recomputed layer by layer
 * in backward (the last layer's is still in place). */
typedef struct tz_layer_stack {
    int64_t n_layers;
    float **xin;      /* n_layers + 1 residual streams, in the model's arena (x16: each holds
                       * stream_floats bf16 values; read and write them through
                       * tz_layer_stack_in / _out / _put, never directly); NULL entries
                       * with host streams */
    void *sets;       /* n_sets activation sets */
    size_t set_bytes;
    int n_sets;       /* n_layers, or 1 with checkpointing */
    int x16;          /* the saved streams are kept in bf16 (checkpointing on a backend with
                       * bf16 GEMM operands): a layer reads its input widened into xa and
                       * writes its output into xb, which is rounded into the next stream */
    float *xa, *xb;   /* x16: the fp32 work streams */
    int64_t stream_floats;
    /* TZ_STACK_HOST (x16 on a device backend): the bf16 streams live in host memory (pinned
     * where the backend can pin), the backend holds one of them at a time in `slot`; put
     * rounds into the slot and copies it out on the copy queue, in copies it back (the
     * stream read before it is fetched ahead while the caller works: backward's order) */
    int on_host;
    tz_backend *be;
    uint16_t *host;   /* (n_layers + 1) x stream_floats bf16 values, registered with be
                       * (NULL on a backend that cannot pin: the planning one) */
    size_t host_bytes;
    uint16_t *slot;   /* stream_floats bf16 values of backend memory */
    int64_t slot_of;  /* the stream slot holds, or will once slot_ev is done (-1: none) */
    void *slot_ev;    /* the copy queue's last copy to or from slot (NULL: none pending) */
    int slot_up;      /* that copy writes the slot (an upload) */
    int64_t last_in;  /* the stream tz_layer_stack_in read last */
} tz_layer_stack;

/* Options of tz_layer_stack_walk_ex. TZ_STACK_HOST: the bf16 streams (x16) on a device
 * backend in host memory (above). TZ_STACK_XB_OWN: the family gives xb after the walk
 * (memory free whenever a layer's output is written, e.g. a backward buffer), so the walk
 * takes none. */
enum { TZ_STACK_HOST = 1, TZ_STACK_XB_OWN = 2 };

/* The stack's step of a model's arena walk (core/arena.h): takes the n_layers + 1 residual
 * streams of stream_floats each; when allocating (a != NULL) first (re)allocates s's host
 * arrays, the family then takes each set's fields. Returns the number of sets.
 * forward_only: one set and two streams, xin[i] alternating between them (a forward pass
 * reads layer i's input and writes its output, nothing older). */
int tz_layer_stack_walk(tz_layer_stack *s, tz_arena *a, size_t *total, int64_t n_layers,
                        int checkpointing, int forward_only, size_t set_bytes,
                        int64_t stream_floats, int x16);
/* The same with options (TZ_STACK_*) on backend be. Host streams apply only where the
 * streams are bf16 (x16) and be->device: the arena then holds one slot of bf16 instead of
 * n_layers + 1 streams, and (n_layers + 1) x stream_floats x 2 bytes of host memory are
 * allocated (not counted in the backend's bytes). Returns the number of sets. */
int tz_layer_stack_walk_ex(tz_layer_stack *s, tz_backend *be, tz_arena *a, size_t *total,
                           int64_t n_layers, int checkpointing, int forward_only,
                           size_t set_bytes, int64_t stream_floats, int x16, unsigned opts);
/* 1 when s keeps its streams in host memory (after an allocating walk), and the bytes of host
 * memory they take (0 when they do not). */
static inline int tz_layer_stack_on_host(const tz_layer_stack *s) { return s->on_host; }
static inline size_t tz_layer_stack_host_bytes(const tz_layer_stack *s) { return s->host_bytes; }
/* Stream i (0: the input of layer 0; n_layers: the output of the last) as fp32 to read: the
 * stream itself, or with x16 its bf16 values widened into xa (valid until the next call). */
const float *tz_layer_stack_in(tz_layer_stack *s, tz_backend *be, int64_t i);
/* Where stream i is written: the stream itself, or with x16 xb, which tz_layer_stack_put(i)
 * then rounds into the stream (to nearest even). So the next layer, and its recomputation in
 * backward, read the rounded values: forward and backward see the same function. */
float *tz_layer_stack_out(tz_layer_stack *s, int64_t i);
void tz_layer_stack_put(tz_layer_stack *s, tz_backend *be, int64_t i);
void tz_layer_stack_free(tz_layer_stack *s);

/* Attention's outputs kept for backward's recomputation (training with checkpointing on a
 * device: tz_att_keep_wanted): each layer's attention output and lse are made in one of two
 * buffers, att2[l % 2] and lse2[l % 2], and those of layers 0 .. n_layers - 3 go to pinned
 * host memory on the copy queue while the next layer computes (tz_att_keep_copy) and come
 * back one layer ahead in backward, so that a recomputation reads them instead of running
 * attention's forward again (the last two layers' stay in their buffers). The same bits:
 * attention's forward is deterministic. docs/design/cuda.md, "Attention's outputs kept for
 * the recomputation". */
typedef struct tz_att_keep {
    int on;
    tz_backend *be;
    int64_t n_layers, att_floats, lse_floats; /* a layer's, at the set-up's shapes */
    float *att2[2], *lse2[2];                 /* backend memory */
    float *host;      /* (n_layers - 2) x (att_floats + lse_floats), pinned (NULL on a backend
                       * that cannot pin: the planning one, whose copies move nothing) */
    size_t host_bytes; /* what host takes (also where it is NULL) */
    void *ev[2];      /* the copy queue's last copy from or to buffer i (NULL: none) */
} tz_att_keep;
/* Whether a model on be keeps them (a device with bf16 GEMMs among its types: the planning
 * backend, a device too, plans a CPU's run with fp32 alone; two layers at least;
 * TZ_ATT_KEEP=0 says no, for measuring). */
int tz_att_keep_wanted(const tz_backend *be, int checkpointing, int forward_only,
                       int64_t n_layers);
/* The walk's step (core/arena.h): with on, the buffers of a layer's att_floats and
 * lse_floats from the arena (given0: buffer 1 only; the model sets att2[0] and lse2[0] to
 * memory of its own after the walk); allocating (a != NULL) first releases what k held, then
 * takes the host memory. Off, k is left empty. */
void tz_att_keep_walk(tz_att_keep *k, tz_backend *be, tz_arena *a, size_t *total, int on,
                      int64_t n_layers, int64_t att_floats, int64_t lse_floats, int given0);
/* Layer l's first att and lse floats between its buffer and the host (to_host: down), on the
 * copy queue after the compute queue's work so far. Layers n_layers - 2 and up: nothing. */
void tz_att_keep_copy(tz_att_keep *k, int64_t l, int to_host, int64_t att, int64_t lse);
/* Layer l's buffer index, once the compute queue waits for the copy queue's last copy from
 * or to it (before a layer's attention writes it, or reads what an upload brought). */
int tz_att_keep_take(tz_att_keep *k, int64_t l);
/* Waits for k's copies, releases its host memory; k empty. */
void tz_att_keep_free(tz_att_keep *k);

/* bytes of backend memory src to the host's dst (pinned: host_alloc) on the copy queue, after
 * the compute queue's work so far, without the host waiting (so what follows is queued at
 * once); tz_model_received waits for the copy and frees the returned event. */
void *tz_model_send_host(tz_backend *be, void *dst, const void *src, size_t bytes);
void tz_model_received(tz_backend *be, void *sent);
/* The activation set of a layer, and whether backward must recompute the layer first. */
static inline void *tz_layer_stack_set(const tz_layer_stack *s, int64_t layer) {
    return (char *)s->sets + (size_t)(s->n_sets == 1 ? 0 : layer) * s->set_bytes;
}
static inline int tz_layer_stack_recompute(const tz_layer_stack *s, int64_t layer) {
    return s->n_sets == 1 && layer != s->n_layers - 1;
}

/* A family's initialisation rule: p->numel host floats into h for parameter i of the table,
 * drawing from r (the stream tz_rng_make(seed, i, purpose, 0)). */
typedef void (*tz_init_fill)(void *ctx, int i, const tz_param *p, tz_rng *r, float *h);
/* Random base weights (adapters left alone) by the family's rule, uploaded with
 * tz_model_upload_param: a quantized weight holds the quantization of the dense draws. */
void tz_model_init_base(tz_params *ps, tz_backend *be, const tz_tq_codebook *cb, uint64_t seed,
                        tz_init_fill fill, void *ctx);
/* LoRA init as PEFT does, for every adapter tensor of ps: A ~ U(-1/sqrt(in), 1/sqrt(in)),
 * B = 0; the draws of parameter i come from tz_rng_make(seed, i, TZ_RNG_LORA, 0). */
void tz_model_init_lora(tz_params *ps, tz_backend *be, uint64_t seed);
/* Sets p from the host floats w (p->numel): uploaded as they are, or, when p is quantized,
 * quantized on the host as p->q says (cb: the model's codebook) and its codes uploaded; a
 * trainable quantized p also keeps w in p->init, where its fp32 master will start. */
void tz_model_upload_param(tz_backend *be, const tz_tq_codebook *cb, tz_param *p,
                           const float *w);

/* Checks q (fatal when it cannot be used) and fills cb (TurboQuant) and levels (2^bits code
 * values, tz_tq_levels). */
void tz_quant_prepare(const tz_quant_opts *q, tz_tq_codebook *cb, float *levels);
/* The codebook of `bits` bits: cb when it has that many, else computed into local. */
const tz_tq_codebook *tz_quant_codebook(const tz_tq_codebook *cb, int method, int bits,
                                        tz_tq_codebook *local);
/* Quantizes the host weight w (p->numel floats) as p->q says and uploads codes and scales. */
void tz_quant_upload(tz_backend *be, const tz_tq_codebook *cb, tz_param *p, const float *w);
/* The scratch of a model whose quantized weights are those of ps: one tile for the largest
 * (tz_tq_tile_elems: whole, or two chunks where be decodes in chunks), of be's GEMM operand type (4 bytes for fp32, 2 when the weight is decoded straight into
 * bf16, see tq_matmul; with room for LoRA's and the bias's columns (biases: the model's
 * linears have them) where the backend folds them, tz_linear_fold_cols), and one activation
 * buffer for the most any TurboQuant
 * weight's linear on `rows` rows needs (tz_linear_act_floats, as a linear on its own;
 * backward: 0 for forward passes only). With a NULL arena it
 * only counts bytes (64-byte rounded, as tz_arena_alloc takes them); else it allocates s. */
size_t tz_quant_scratch_walk(tz_tq_scratch *s, const tz_params *ps, tz_arena *a, int64_t rows,
                             const tz_backend *be, int backward, int64_t lora_rank, int biases);
/* The same with the activation buffer given in floats (a family that calls its linears on
 * different numbers of rows, or shares inputs: the most of tz_linear_act_floats; 0: none),
 * the backend (the tile's element type, its decode in chunks: tz_tq_tile_elems) and the
 * columns a TurboQuant weight's row gets in the tile where LoRA is folded into its GEMM
 * (tz_linear_fold_cols; 0: none). */
size_t tz_quant_scratch_walk_act(tz_tq_scratch *s, const tz_params *ps, tz_arena *a,
                                 int64_t act_floats, const tz_backend *be, int64_t fold_cols);

#endif
