/* Flux.1 (the MMDiT of Black Forest Labs, diffusers' FluxTransformer2DModel): an image stream
 * of packed latent tokens and a text stream of encoder embeddings, double-stream blocks (each
 * stream its own adaLN-zero modulation, projections and MLP, one joint attention over both
 * with per-head RMSNorm of q and k and a 3-axis RoPE), then single-stream blocks over the
 * concatenated tokens (attention and MLP in parallel), an adaLN-continuous final layer on the
 * image tokens; conditioning = timestep + guidance + pooled-text embeddings. Every linear is a
 * tz_linear (LoRA, quantization, its bias). The flow-matching loss and its timestep sampling
 * are the caller's (task_flux.c); this file maps inputs to the velocity and its gradients. */
#ifndef TZ_FLUX_H
#define TZ_FLUX_H
#include <stddef.h>
#include <stdint.h>

#include "core/arena.h"
#include "core/backend.h"
#include "model/linear.h"
#include "model/model_base.h"
#include "model/params.h"
#include "model/wstream.h"

/* The projections LoRA can adapt (bit 1 << TZ_FLUX_x in tz_model_opts.lora.targets), by their
 * diffusers module names (tz_flux_lin_names): in both kinds of block to_q, to_k, to_v; in the
 * double blocks to_out.0, the text stream's add_q_proj, add_k_proj, add_v_proj, to_add_out,
 * the MLPs ff.net.0.proj, ff.net.2, ff_context.net.0.proj, ff_context.net.2 and the adaLN
 * norm1.linear, norm1_context.linear; in the single blocks proj_mlp, proj_out, norm.linear. */
enum {
    TZ_FLUX_Q, TZ_FLUX_K, TZ_FLUX_V, TZ_FLUX_OUT, TZ_FLUX_AQ, TZ_FLUX_AK, TZ_FLUX_AV,
    TZ_FLUX_AOUT, TZ_FLUX_FF1, TZ_FLUX_FF2, TZ_FLUX_CFF1, TZ_FLUX_CFF2, TZ_FLUX_NORM1,
    TZ_FLUX_NORM1C, TZ_FLUX_MLP, TZ_FLUX_POUT, TZ_FLUX_NORM, TZ_FLUX_LIN_N
};
extern const char *const tz_flux_lin_names[TZ_FLUX_LIN_N];

typedef struct tz_flux_dims {
    int64_t in_channels;   /* packed latent token width (Flux: 16 channels x 2 x 2 = 64) */
    int64_t out_channels;  /* the velocity's token width (= in_channels) */
    int64_t layers;        /* double-stream blocks (num_layers) */
    int64_t single_layers; /* single-stream blocks (num_single_layers) */
    int64_t heads, head_dim; /* inner width = heads * head_dim */
    int64_t joint_dim;     /* the text encoder's width (joint_attention_dim) */
    int64_t pooled_dim;    /* the pooled text embedding's width (pooled_projection_dim) */
    int guidance;          /* 1: a guidance embedder (Flux.1-dev; schnell has none) */
    int64_t axes[3];       /* RoPE dims per position axis (axes_dims_rope), sum = head_dim */
    double theta;          /* RoPE base, 10000 */
} tz_flux_dims;

static inline int64_t tz_flux_inner(const tz_flux_dims *d) { return d->heads * d->head_dim; }
static inline int64_t tz_flux_mlp(const tz_flux_dims *d) { return 4 * tz_flux_inner(d); }

/* 0, or non-zero with the first inconsistency in err. */
int tz_flux_check_dims(const tz_flux_dims *d, char *err, size_t errlen);
/* The family's named shapes ("flux-dev", "flux-schnell": the published models; "flux-tiny":
 * a CPU-sized one). 0, or non-zero with what was expected in err. */
int tz_flux_preset(const char *name, tz_flux_dims *d, char *err, size_t errlen);

/* One block's linears: a double block uses Q .. NORM1C, a single block Q, K, V, MLP, POUT,
 * NORM; and its RMSNorm weights over head_dim (norm_q, norm_k; double: norm_added_q, _k). */
typedef struct tz_flux_block {
    tz_linear lin[TZ_FLUX_LIN_N];
    tz_param *nq, *nk, *naq, *nak;
} tz_flux_block;

/* Saved activations of one block. Double blocks: the image stream's (i) and the text
 * stream's (c) tensors; single blocks use the i set over all tokens. Token rows [n*Ts, ...]
 * for a stream of Ts tokens, conditioning rows [n, ...]. */
typedef struct tz_flux_acts {
    float *modi, *modc;                   /* adaLN outputs [n, 6 inner] (single: [n, 3 inner]) */
    float *xi, *xc;                       /* the block input, split by stream */
    float *ln1i, *mean1i, *rstd1i, *h1i;  /* LN and modulated input */
    float *ln1c, *mean1c, *rstd1c, *h1c;
    float *qi, *ki, *vi, *qc, *kc, *vc;   /* projections before the RMSNorms */
    float *rqi, *rki, *rqc, *rkc;         /* the RMSNorms' 1/rms per (token, head) */
    float *Q, *K, *V, *lse, *att;         /* the joint attention over [n, T, heads, D] */
    uint16_t *Q16, *K16, *V16;            /* tz_flux.att16: Q, K after RoPE, and V, in bf16 */
    float *atti, *attc, *aoi, *aoc;       /* its output split, and projected */
    float *x2i, *x2c;                     /* after the attention residual */
    float *ln2i, *mean2i, *rstd2i, *h2i, *ln2c, *mean2c, *rstd2c, *h2c;
    float *fi, *fc;                       /* MLP hidden before the GELU (after it: a scratch) */
    float *moi, *moc;                     /* MLP output */
    float *cat, *o;                       /* single: [attention, MLP] and proj_out of it */
    float *lh[TZ_FLUX_LIN_N];             /* LoRA hidden x A^T per projection */
} tz_flux_acts;

typedef struct tz_flux {
    tz_flux_dims d;
    tz_model_opts o;
    tz_backend *be;
    tz_params params;
    int *init_rule;        /* initialisation rule of each parameter, by registration index */
    tz_linear x_emb, ctx_emb, t1, t2, g1, g2, p1, p2, norm_out, proj_out;
    tz_flux_block *blocks; /* layers double, then single_layers single */
    int cond_trainable;    /* a gradient must flow into the conditioning embedders */
    tz_tq_codebook cb;
    float levels[TZ_TQ_MAX_LEVELS];
    tz_tq_scratch tq;
    void *att_ws;
    size_t att_ws_bytes;
    int att16; /* attention reads Q, K, V in bf16 (the set's Q16, K16, V16): a device whose
                * flash kernels round them so as they stage them (the same results, half the
                * bytes staged, and the tiles copied ahead) */
    /* activations for batches of up to B samples of Ti image and Tt text tokens */
    int64_t B, n, Ti, Tt;
    tz_arena arena;
    float *xt, *txt, *pooled, *target, *tfeat, *gfeat, *cs;
    float *th, *ts, *gh, *gs, *ph, *pss, *temb, *sc;
    float *hi, *hc;                       /* embedded streams, before the first merge */
    tz_layer_stack stack;                 /* residual streams [n, Tt + Ti, inner] */
    tz_wstream ws;                        /* the streamed blocks (quant.offload_blocks) */
    float *yi, *yc;                       /* a block's outputs before the merge */
    float *fx, *fmod, *fmean, *frstd, *fln, *fh, *pred, *sse, *f_lh;
    float *dres, *dyi, *dyc, *da, *db, *dc, *dd, *dQ, *dK, *dV, *dqi, *dki, *dvi, *dqc,
          *dkc, *dvc, *datt, *dmodi, *dmodc, *dsc, *dtemb, *dth, *dts, *dpred, *dlora;
    /* two wide scratches, live within one block: wide1 [n T, mlp] holds a double block's GELU
     * output in the forward (recomputed from the saved pre-GELU hidden when the backward needs
     * it; a single block's goes straight into its cat) and in the backward the GELU output's
     * gradient (double) or the pre-GELU one (single); wide0 [n T, inner + mlp] the single
     * block's gradient of [attention, MLP], a double block's GELU output again and then its
     * pre-GELU gradient (absent when built forward-only) */
    float *wide0, *wide1;
    float *feat_host, *cs_host, *sse_host;
    /* Attention's outputs kept for backward (model_base.h; on: training with checkpointing on
     * a device): a block's recomputation reads the attention output and lse its forward made
     * instead of running attention again. A double block's att and lse point at its buffer
     * while it runs; a single block's attention writes into its cat, copied into the buffer
     * (and back into cat for the recomputation). */
    tz_att_keep keep;
} tz_flux;

/* Registers every parameter (diffusers names; adapters per opts), each with its backward
 * stage (0: the final layer, 1..single_layers: the single blocks from the last, then the
 * double blocks from the last, then the embedders). Fatal on inconsistent dims. */
tz_flux *tz_flux_create(tz_backend *be, const tz_flux_dims *d, const tz_model_opts *o);
void tz_flux_free(tz_flux *m);
/* Normal(0, 0.02) linears, zero adaLN and output projections (so a fresh model predicts 0),
 * RMSNorm weights 1; adapters are left alone. */
void tz_flux_init_random(tz_flux *m, uint64_t seed);
/* The activation arena for batches of up to B samples of Ti image and Tt text tokens. */
void tz_flux_setup(tz_flux *m, int64_t B, int64_t Ti, int64_t Tt);
size_t tz_flux_arena_bytes(const tz_flux *m, int64_t B, int64_t Ti, int64_t Tt);
void tz_flux_set_batch(tz_flux *m, int64_t n);

/* The inputs of a batch of n samples, host memory: x_t [n, Ti, in_channels] (the noised
 * latents), txt [n, Tt, joint_dim], pooled [n, pooled_dim], sigma [n] (the flow time in
 * [0, 1]; the model embeds 1000 sigma), guidance [n] (ignored without a guidance embedder),
 * img_ids [Ti, 3], txt_ids [Tt, 3] (the positions RoPE rotates by). */
typedef struct tz_flux_batch {
    const float *x_t, *txt, *pooled, *sigma, *guidance, *img_ids, *txt_ids;
} tz_flux_batch;

/* The velocity; tz_flux_output gives it, [n, Ti, out_channels] in backend memory. */
void tz_flux_forward(tz_flux *m, const tz_flux_batch *in);
static inline const float *tz_flux_output(const tz_flux *m) { return m->pred; }
/* Forward and the sum of squared errors against target [n, Ti, out_channels] (host). */
double tz_flux_forward_loss(tz_flux *m, const tz_flux_batch *in, const float *target);
/* Forward, loss, and the backward of dloss * SSE into the trainable parameters' g
 * (accumulated); returns the SSE. */
double tz_flux_forward_backward(tz_flux *m, const tz_flux_batch *in, const float *target,
                                float dloss);

/* From and to a diffusers folder: config.json and diffusion_pytorch_model*.safetensors
 * (one file or shards with their index). Fatal, naming the file and key, on a mismatch. */
tz_flux *tz_flux_load(tz_backend *be, const char *dir, const tz_model_opts *o);
/* The whole model into dir (config.json and diffusion_pytorch_model.safetensors, F32 or
 * BF16); a quantized block weight is written dequantized. */
void tz_flux_save(tz_flux *m, const char *dir, int bf16);
void tz_flux_read_dims(const char *dir, tz_flux_dims *d);

#endif
