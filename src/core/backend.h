/* The backend op table: every compute op the models use, forward and backward, as function
 * pointers. The CPU table (cpu/) is the specification; CUDA (cuda/) implements the same.
 *
 * Conventions (all ops):
 *  - Tensors are row-major fp32 unless stated; token ids are int32. Sizes are int64_t.
 *  - Activations of a sequence batch are [B*T, C] ("BT rows"); attention heads are
 *    interleaved in the last dimension: q is [B, T, Hq, D], k and v are [B, T, Hkv, D].
 *  - Backward ops ACCUMULATE (+=) into every gradient they produce, input and parameter
 *    gradients alike, so the caller zeroes a gradient buffer once and several paths add to
 *    it. Exceptions, stated at the op: xent_bwd writes, rope_bwd transforms in place,
 *    patchify / unpatchify / copy2d (permutations) write.
 *  - Results do not depend on the number of threads (each output element is reduced by
 *    one thread in a fixed order), so runs are reproducible bit for bit on one machine.
 *  - Pointers are backend memory (host memory for the CPU backend). */
#ifndef TZ_BACKEND_H
#define TZ_BACKEND_H
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"

typedef struct tz_backend tz_backend;

/* The queues of a backend (see "the offload" in struct tz_backend). */
enum { TZ_QUEUE_HOST = -1, TZ_QUEUE_COMPUTE = 0, TZ_QUEUE_COPY = 1 };

/* One AdamW step's scalars for be->adamw (the bias corrections already inverted). */
typedef struct tz_adamw_args {
    float lr, beta1, beta2, eps, weight_decay, c1, c2, grad_scale;
} tz_adamw_args;

#if defined(__CUDACC__)
#define TZ_ADAMW_HD __host__ __device__
#else
#define TZ_ADAMW_HD
#endif
/* AdamW on one element, the one arithmetic of every AdamW here (the host shard's,
 * optim/adamw.c, and each backend's be->adamw): g scaled by grad_scale, the moments updated,
 * w -= lr (m c1 / (sqrt(v c2) + eps) + wd w), wd only where decay. */
static inline TZ_ADAMW_HD void tz_adamw_elem(float *w, float *m, float *v, float g, int decay,
                                            const tz_adamw_args *a) {
    const float gi = g * a->grad_scale;
    const float mi = a->beta1 * *m + (1.0f - a->beta1) * gi;
    const float vi = a->beta2 * *v + (1.0f - a->beta2) * gi * gi;
    *m = mi;
    *v = vi;
    const float upd = (mi * a->c1) / (sqrtf(vi * a->c2) + a->eps);
    *w -= a->lr * (upd + (decay ? a->weight_decay : 0.0f) * *w);
}

/* The row strides, in elements, of attention's operands (attention_fwd, attention_bwd): row
 * (b, t) of q and of dq starts at (b*T + t) * q, of k, v, dk and dv at (b*T + t) * kv, of out
 * and of dout at (b*T + t) * o, head h at h*D within it. 0 in a field, or a NULL pointer:
 * dense (Hq*D, Hkv*D, Hq*D). A fused projection's output [B*T, (Hq + 2 Hkv) D] is read in
 * place with q = kv = (Hq + 2 Hkv) D (k and v pointing into the row). in16: q, k and v hold
 * bf16 bit patterns (their strides in bf16 elements), the form the tensor-core kernels round
 * them to as they load them, so the results are those of the fp32 values they stand for;
 * backends take it where tz_attention_takes_bf16 says (the CPU widens them). d16 (backward,
 * accumulate 0): the gradients it names (TZ_ATT_DQ16, TZ_ATT_DK16, TZ_ATT_DV16) written as bf16
 * bit patterns at their strides (in bf16 elements), the fp32 values rounded as to_bf16 rounds
 * them, for projections whose backward GEMMs read their dy in bf16 (tz_linear_takes_dy16: the
 * Llama's v, the DiT's fused q, k, v); backends take it where tz_attention_takes_bf16 says. */
enum { TZ_ATT_DQ16 = 1, TZ_ATT_DK16 = 2, TZ_ATT_DV16 = 4 };
/* swiglu_fwd's and swiglu_bwd's flags (below) */
enum { TZ_SWIGLU_OUT16 = 1, TZ_SWIGLU_IN16 = 2 };
/* gelu_tanh_fwd's flags and a bit of gelu_tanh_bwd's accumulate (below) */
enum { TZ_GELU_OUT16 = 1, TZ_GELU_X16 = 4 };
typedef struct tz_att_ld {
    int64_t q, kv, o;
    int in16, d16;
} tz_att_ld;
/* The strides ld asks for, with dense ones for its 0 fields (every backend's attention
 * calls it). Fatal, naming them, when one is below its row's width (rows would overlap). */
tz_att_ld tz_att_ld_of(const tz_att_ld *ld, int64_t Hq, int64_t Hkv, int64_t D);
/* The rows of an elementwise op over n elements given as rows of cols with one side's rows
 * at stride ld (gelu_tanh_fwd, gelu_tanh_bwd): n / cols, or 0 for cols = 0 (all dense).
 * Fatal, naming op, when n is not whole rows or ld < cols. */
int64_t tz_op_rows(const char *op, int64_t n, int64_t cols, int64_t ld);

/* What device_info reports. */
typedef struct tz_device_info {
    int ordinal;       /* -1: the host (CPU backend) */
    char name[256];
    char bus_id[32];   /* PCI bus id, "" when none */
    size_t free_bytes, total_bytes;
} tz_device_info;

struct tz_backend {
    const char *name;
    int device;        /* 1: memory is not host-addressable (copy with upload/download) */
    int plan;          /* 1: a planning backend (bench --dry-run): memory reserved, never
                        * touched; no op runs, so nothing need be computed for it */
    void *ctx;         /* implementation state */
    /* The operand type of matmul: TZ_DT_F32 (fp32 products, the CPU's and every backend's
     * default) or TZ_DT_BF16 (A and B rounded to bf16 to nearest even, products summed in
     * fp32, C fp32: tensor-core GEMMs). Set with tz_backend_set_precision; a backend lists
     * the types it supports as bits (1u << type) of matmul_dtypes. Every other op and all
     * storage stay fp32. */
    enum tz_dtype matmul_dtype;
    unsigned matmul_dtypes;
    /* tq_matmul and tq_matmul_lora with bf16 GEMMs: the weight decoded in this many chunks
     * (> 1: two chunk buffers in the tile, the next chunk decoded while the GEMM reads the
     * last; tz_tq_tile_elems says the tile's size); 0 or 1: whole (the CPU). */
    int tq_chunks;
#define TZ_TQ_DEVICE_CHUNKS 4 /* the CUDA backend's (and a GPU's plan's) by default */
    /* 1: matmul16 with bf16 GEMMs takes the narrow path where tz_narrow_plan says so (the
     * CUDA backend's and a GPU plan's, from tz_narrow_gemm_enabled); 0: never (the CPU). */
    int narrow_gemm;
    /* 1: tq_matmul and tq_matmul_lora with bf16 GEMMs on at most TZ_NARROW_MAXR rows multiply
     * the weight's codes in one kernel, decoding them on the way (tz_tq_fused_plan; the CUDA
     * backend's and a GPU plan's, from tz_tq_fused_enabled); 0: never (the CPU). */
    int tq_fused;
    /* A workspace lent to the next attention_fwd or attention_bwd, which takes it back (NULL
     * and 0 after the call): att_ws_bytes bytes of backend memory from the caller's planned
     * memory, tz_attention_ws_bytes for the shape (below). A backend whose attention wants
     * none (that function gives 0) ignores it. */
    void *att_ws;
    size_t att_ws_bytes;
    /* Spare memory lent to the next attention_bwd alone, which takes it back likewise: memory
     * of the caller's plan that nothing reads or writes during the call (the Llama's pool past
     * dk and dv, or its du without MLP chunks; the DiT's dg). A backend may keep the score
     * gradients there instead of computing them twice (tz_attention_ds_group, below); with too
     * little, or none, it computes them twice. Never required, never planned for. */
    void *att_ds;
    size_t att_ds_bytes;
    /* frees the implementation state and the table itself (tz_backend_destroy calls it) */
    void (*destroy)(tz_backend *be);

    /* ---- memory ---- */
    void *(*alloc)(tz_backend *be, size_t bytes); /* zeroed, 64-byte aligned; fatal on failure */
    void (*release)(tz_backend *be, void *p);
    void (*upload)(tz_backend *be, void *dst, const void *host_src, size_t bytes);
    void (*download)(tz_backend *be, void *host_dst, const void *src, size_t bytes);
    void (*copy)(tz_backend *be, void *dst, const void *src, size_t bytes);
    void (*sync)(tz_backend *be);
    /* Bytes of backend memory allocated through alloc and not yet released, now and at most
     * so far (kept by the implementation; the ops' own scratch is not counted). */
    size_t live_bytes, peak_bytes;

    /* ---- elementwise and reductions ---- */
    void (*fill)(tz_backend *be, float *x, float v, int64_t n);
    void (*scale)(tz_backend *be, float *x, float a, int64_t n);            /* x *= a */
    void (*axpy)(tz_backend *be, float *y, float a, const float *x, int64_t n); /* y += a*x */
    /* dst[i] = bf16(src[i]) (round to nearest even; bit patterns), and back (exact) */
    void (*to_bf16)(tz_backend *be, uint16_t *dst, const float *src, int64_t n);
    void (*from_bf16)(tz_backend *be, float *dst, const uint16_t *src, int64_t n);
    /* sum of squares, accumulated in double, returned to the host */
    double (*sumsq)(tz_backend *be, const float *x, int64_t n);
    /* AdamW over n elements in place, the host optimizer's arithmetic (optim/adamw.c) on the
     * backend (optim.offload = false): with g' = g * grad_scale, m = b1 m + (1 - b1) g',
     * v = b2 v + (1 - b2) g'^2, w -= lr (m c1 / (sqrt(v c2) + eps) + wd w), wd only where
     * decay[i] != 0; c1, c2 the bias corrections 1 / (1 - b^t). */
    void (*adamw)(tz_backend *be, float *w, float *m, float *v, const float *g,
                  const uint8_t *decay, int64_t n, const tz_adamw_args *a);

    /* ---- matmul ----
     * C[M,N] = alpha * op(A) * op(B) + beta * C, op(A) is M x K, op(B) is K x N.
     * transA = 0: A is stored [M,K]; 1: A is stored [K,M]. transB = 0: B stored [K,N];
     * 1: B stored [N,K]. beta = 0 overwrites C (C may hold garbage, even NaN). */
    void (*matmul)(tz_backend *be, float *C, const float *A, const float *B, int64_t M,
                   int64_t N, int64_t K, int transA, int transB, float alpha, float beta);
    /* The same with B stored in bf16 (bit patterns: a weight kept in bf16, tz_param.w16):
     * C = alpha * op(A) * op(B) + beta * C with B's values exactly as stored; A is taken as
     * matmul takes it (rounded to bf16 with bf16 GEMM operands, else fp32). */
    void (*matmul_bw16)(tz_backend *be, float *C, const float *A, const uint16_t *B, int64_t M,
                        int64_t N, int64_t K, int transA, int transB, float alpha, float beta);
    /* The same with either operand in bf16 (a_bf16, b_bf16: A, B hold bf16 bit patterns):
     * a bf16 operand is read exactly as stored (widened exactly with fp32 GEMMs), an fp32 one
     * as matmul takes it. With bf16 GEMMs an input rounded once (to_bf16, tq_rotate16) and
     * read by several GEMMs gives each the bits matmul would have made from the fp32 input. */
    void (*matmul16)(tz_backend *be, float *C, const void *A, int a_bf16, const void *B,
                     int b_bf16, int64_t M, int64_t N, int64_t K, int transA, int transB,
                     float alpha, float beta);
    /* A dense linear with a bias: C[M,N] = A[M,K] W[N,K]^T + bias[N] (C written), A fp32 or
     * bf16 (a_bf16: bit patterns, an input kept rounded), W fp32 or bf16 (w_bf16: bit
     * patterns, a frozen weight). With bf16 GEMMs the bias goes in along K (one more column:
     * A's 1, W's bf16(bias); the operands rounded into rows of K + 8 as matmul would round
     * them), so no pass over C adds it: C gains the bias rounded to bf16. Otherwise (the CPU:
     * the reference) matmul16, then the bias added in fp32. c_bf16: C written as bf16 bit
     * patterns, the fp32 result rounded as to_bf16 rounds it (the GEMM's own epilogue with bf16
     * GEMMs; fatal with fp32 ones on a device). */
    void (*matmul_bias)(tz_backend *be, float *C, const void *A, int a_bf16, const void *W,
                        int w_bf16, const float *bias, int64_t M, int64_t N, int64_t K, int c_bf16);
    /* A dense linear with its LoRA path (and bias, where not NULL): C[M,N] = A[M,K] W[N,K]^T
     * + s h[M,r] B[N,r]^T (+ bias[N]) (C written; A, W as matmul_bias takes them; h = x
     * A_lora^T and B fp32). With bf16 GEMMs LoRA and the bias go in along K, as
     * tq_matmul_lora folds them into a quantized weight's GEMM: A's rows [A | bf16(h) | 1 |
     * 0..], W's [W | bf16(s B) | bf16(bias) | 0..], K + (r + 1 for a bias) rounded up to 8
     * columns, one GEMM and no pass over C. Otherwise (the CPU: the reference) matmul16, C +=
     * s h B^T in fp32, then the bias. r = 0: matmul_bias (h and B unread; a NULL bias: none). */
    void (*matmul_lora)(tz_backend *be, float *C, const void *A, int a_bf16, const void *W,
                        int w_bf16, const float *h, const float *B, int64_t r, float s,
                        const float *bias, int64_t M, int64_t N, int64_t K);

    /* ---- embedding ----
     * out[t, :] = table[tok[t], :], t < n, table [V, C]. Token ids were validated by the
     * data loader (0 <= tok < V). bwd: dtable[tok[t], :] += dout[t, :]. */
    void (*embedding_fwd)(tz_backend *be, float *out, const int32_t *tok, const float *table,
                          int64_t n, int64_t C);
    void (*embedding_bwd)(tz_backend *be, float *dtable, const int32_t *tok, const float *dout,
                          int64_t n, int64_t C);
    /* embedding_fwd from a table stored in bf16 (bit patterns; exact in fp32). */
    void (*embedding_fwd_w16)(tz_backend *be, float *out, const int32_t *tok,
                              const uint16_t *table, int64_t n, int64_t C);

    /* ---- RMSNorm (HF LlamaRMSNorm) ----
     * rstd[r] = 1/sqrt(mean_c(x[r,c]^2) + eps); out[r,c] = x[r,c] * rstd[r] * w[c].
     * bwd: dx += ... (accumulate 0: dx = ..., its contents not read), dw += ... (dw may be
     * NULL: frozen weight). */
    void (*rmsnorm_fwd)(tz_backend *be, float *out, float *rstd, const float *x, const float *w,
                        int64_t rows, int64_t C, float eps);
    void (*rmsnorm_bwd)(tz_backend *be, float *dx, float *dw, const float *dout, const float *x,
                        const float *w, const float *rstd, int64_t rows, int64_t C,
                        int accumulate);

    /* ---- RoPE, HF rotate-half convention, in place on x [B, T, H, D] ----
     * position of row (b, t) is t; inv_freq[i] = theta^(-2i/D), i < D/2;
     * (x[i], x[i+D/2]) -> (x[i] cos - x[i+D/2] sin, x[i+D/2] cos + x[i] sin).
     * bwd: in place on the gradient, the inverse rotation (the transpose). */
    void (*rope_fwd)(tz_backend *be, float *x, int64_t B, int64_t T, int64_t H, int64_t D,
                     float theta);
    void (*rope_bwd)(tz_backend *be, float *dx, int64_t B, int64_t T, int64_t H, int64_t D,
                     float theta);
    /* rope_fwd into y [B, T, H, D] as bf16 bit patterns (x not changed): rope_fwd's values
     * rounded as to_bf16 rounds, bit for bit (q and k for attention that reads them in bf16,
     * tz_att_ld.in16, in one pass instead of a rotation and a rounding) */
    void (*rope_fwd16)(tz_backend *be, uint16_t *y, const float *x, int64_t B, int64_t T,
                       int64_t H, int64_t D, float theta);
    /* rope_bwd into dy [B, T, H, D] as bf16 bit patterns (dx not changed): rope_bwd's values
     * rounded as to_bf16 rounds, bit for bit (the gradients of q and k for projections whose
     * backward GEMMs read them in bf16, tz_linear_takes_dy16) */
    void (*rope_bwd16)(tz_backend *be, uint16_t *dy, const float *dx, int64_t B, int64_t T,
                       int64_t H, int64_t D, float theta);
    /* The same rotation with the frequencies given and the positions offset: inv_freq is
     * D/2 floats of backend memory (theta^(-2i/D), or a scaled table such as Llama 3's),
     * the position of row (b, t) is pos0 + t, the angle (float)(pos0 + t) * inv_freq[i].
     * With inv_freq[i] = 1 / theta^((float)(2i) / D) in float and pos0 = 0 it gives
     * rope_fwd's results bit for bit. bwd: the inverse rotation, in place. */
    void (*rope_tab_fwd)(tz_backend *be, float *x, int64_t B, int64_t T, int64_t H, int64_t D,
                         const float *inv_freq, int64_t pos0);
    void (*rope_tab_bwd)(tz_backend *be, float *dx, int64_t B, int64_t T, int64_t H, int64_t D,
                         const float *inv_freq, int64_t pos0);
    /* rope_tab_fwd and rope_tab_bwd into y as bf16 bit patterns (x not changed): their values
     * rounded as to_bf16 rounds, bit for bit (rope_fwd16's and rope_bwd16's forms for a RoPE
     * with a frequency table, as Llama 3's rope_scaling makes) */
    void (*rope_tab_fwd16)(tz_backend *be, uint16_t *y, const float *x, int64_t B, int64_t T,
                           int64_t H, int64_t D, const float *inv_freq, int64_t pos0);
    void (*rope_tab_bwd16)(tz_backend *be, uint16_t *y, const float *x, int64_t B, int64_t T,
                           int64_t H, int64_t D, const float *inv_freq, int64_t pos0);
    /* RoPE of adjacent pairs with a per-position table (Flux: three axes of positions per
     * token, the angles computed by the caller), in place on x [B, T, H, D]: cs holds
     * T * D/2 (cos, sin) pairs, backend memory, cs[2 (t D/2 + i)] = cos and + 1 = sin of the
     * angle of pair i at position t, the same for every sequence and head;
     * (x[2i], x[2i+1]) -> (x[2i] cos - x[2i+1] sin, x[2i+1] cos + x[2i] sin).
     * bwd: the inverse rotation, in place on the gradient. */
    void (*rope_pairs_fwd)(tz_backend *be, float *x, int64_t B, int64_t T, int64_t H, int64_t D,
                           const float *cs);
    void (*rope_pairs_bwd)(tz_backend *be, float *dx, int64_t B, int64_t T, int64_t H,
                           int64_t D, const float *cs);
    /* rope_pairs_fwd into y [B, T, H, D] as bf16 bit patterns (x not changed): its values
     * rounded as to_bf16 rounds, bit for bit (Flux's q and k for attention that reads them in
     * bf16, tz_att_ld.in16: one pass instead of a rotation in place and a rounding) */
    void (*rope_pairs_fwd16)(tz_backend *be, uint16_t *y, const float *x, int64_t B, int64_t T,
                             int64_t H, int64_t D, const float *cs);
    /* A per-head RMSNorm and rope_pairs_fwd16 in one pass, for one stream of a joint
     * sequence: x [B, Ts, H, D] (rows of D), w [D]; rstd [B * Ts * H] and the normalised row
     * (b, t, h), rotated at position off + t and rounded to bf16, written as row (b, off + t,
     * h) of y [B, T, H, D] (y's other rows not touched): the bits of rmsnorm_fwd(h, rstd, x,
     * w, B * Ts * H, D, eps) placed into a joint [B, T, H, D] and rope_pairs_fwd16 of it
     * (Flux's q and k norms before attention on bf16 inputs: no fp32 q or k stored). */
    void (*rms_rope_pairs16)(tz_backend *be, uint16_t *y, float *rstd, const float *x,
                             const float *w, int64_t B, int64_t Ts, int64_t off, int64_t T,
                             int64_t H, int64_t D, float eps, const float *cs);

    /* ---- scaled dot-product attention with grouped-query heads ----
     * q [B,T,Hq,D], k, v [B,T,Hkv,D], Hq % Hkv == 0, query head h reads kv head h/(Hq/Hkv).
     * scores = q.k / sqrt(D), causal: key s <= query t only. out [B,T,Hq,D];
     * lse [B,Hq,T] = log-sum-exp of each score row (saved for backward, which recomputes the
     * probabilities from q, k and lse rather than storing B*Hq*T*T of them).
     * bwd: dq, dk, dv += ... (accumulate), or = ... (accumulate 0: what they held is neither
     * read nor kept, so they need no zeroing). Both take the workspace lent in att_ws where
     * the backend wants one (tz_attention_ws_bytes). ld: the rows' strides (tz_att_ld,
     * below; NULL: dense), so q, k and v can be read where a fused projection wrote them and
     * out written where the next GEMM reads it; only a row's Hq*D (Hkv*D) elements are read
     * or written, never the rest of the row. */
    void (*attention_fwd)(tz_backend *be, float *out, float *lse, const float *q, const float *k,
                          const float *v, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                          int64_t D, int causal, const struct tz_att_ld *ld);
    void (*attention_bwd)(tz_backend *be, float *dq, float *dk, float *dv, const float *dout,
                          const float *out, const float *lse, const float *q, const float *k,
                          const float *v, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                          int64_t D, int causal, int accumulate, const struct tz_att_ld *ld);

    /* Attention of T new queries against a key/value cache (generation; forward only):
     * q [B,T,Hq,D] at positions pos0 .. pos0+T-1; kc, vc [B,S,Hkv,D] hold the keys and values
     * of positions 0 .. pos0+T-1 (the new ones included; pos0 + T <= S, the cache's
     * capacity). Causal: query t reads keys s <= pos0 + t, with rope, scale and grouped heads
     * as attention_fwd; with pos0 = 0 and S = T it is attention_fwd's forward. out
     * [B,T,Hq,D]; no lse. kv16: kc and vc hold bf16 bit patterns (to_bf16's), else floats;
     * the result is the fp32 one over the widened values. */
    void (*attention_cache_fwd)(tz_backend *be, float *out, const float *q, const void *kc,
                                const void *vc, int64_t B, int64_t T, int64_t S, int64_t pos0,
                                int64_t Hq, int64_t Hkv, int64_t D, int kv16);

    /* ---- SwiGLU: out = silu(g) * u, n elements. bwd: dg, du += ... (accumulate = 0: dg,
     * du = ..., their contents not read: no zeroing before). flags, TZ_SWIGLU_*: OUT16
     * (bwd: accumulate 0 only): out (fwd), dg and du (bwd) written as bf16 bit patterns,
     * rounded to nearest even as to_bf16 rounds, in the first n * 2 bytes of each (the form
     * bf16 GEMMs read them in); IN16: g and u hold bf16 bit patterns (a GEMM's bf16 output,
     * tq_matmul_lora's c_bf16), widened exactly: the results of their fp32 values, bit for
     * bit. (1 and 0 as flags are the out_bf16 of before.) ---- */
    void (*swiglu_fwd)(tz_backend *be, float *out, const float *g, const float *u, int64_t n,
                       int flags);
    void (*swiglu_bwd)(tz_backend *be, float *dg, float *du, const float *dout, const float *g,
                       const float *u, int64_t n, int accumulate, int flags);

    /* ---- cross-entropy fused with softmax over logits [n, V] ----
     * fwd: loss[r] = logsumexp(logits[r]) - logits[r, target[r]], or 0 where
     *      target[r] < 0 (ignored). Returns nothing else; the caller sums.
     * bwd: WRITES dlogits[r] = dloss * (softmax(logits[r]) - onehot(target[r])), or zeros
     *      for an ignored row. dlogits may alias logits (in place). */
    void (*xent_fwd)(tz_backend *be, float *loss, const float *logits, const int32_t *target,
                     int64_t n, int64_t V);
    void (*xent_bwd)(tz_backend *be, float *dlogits, const float *logits, const int32_t *target,
                     float dloss, int64_t n, int64_t V);

    /* ---- ops the DiT uses (in their families' files like every op: layernorm in
     * cpu/cpu_norm.c; modulate, gate, bias in cpu_elementwise.c; gelu_tanh, silu in
     * cpu_activation.c; mse in cpu_loss.c; patchify, unpatchify, copy2d in cpu_layout.c) ----
     * Per-sample conditioning vectors (shift, scale, gate) are rows of a [B, ld] matrix read
     * from column 0 of the pointer given, so slices of one adaLN output [B, 6C] are passed
     * without copies: row b of shift is shift[b*ld + c], c < C. x, y, out are [B, T, C]. */

    /* LayerNorm without affine (nn.LayerNorm(elementwise_affine=False)), biased variance:
     * mean[r], rstd[r] = 1/sqrt(var[r] + eps) saved; out[r,c] = (x[r,c] - mean[r]) * rstd[r].
     * bwd: dx += rstd * (g - mean_c(g) - xhat * mean_c(g * xhat)), xhat = (x - mean) * rstd. */
    void (*layernorm_fwd)(tz_backend *be, float *out, float *mean, float *rstd, const float *x,
                          int64_t rows, int64_t C, float eps);
    void (*layernorm_bwd)(tz_backend *be, float *dx, const float *dout, const float *x,
                          const float *mean, const float *rstd, int64_t rows, int64_t C);

    /* adaLN modulate: out[b,t,c] = x[b,t,c] * (1 + scale[b,c]) + shift[b,c] (out may alias x;
     * out_bf16: out holds bf16 bit patterns, each value rounded as to_bf16 rounds it, for a
     * linear whose GEMMs read it so, and must not alias x).
     * bwd: dx += dout * (1 + scale) (dx may be NULL; accumulate 0: dx = ..., its contents
     * not read); dshift[b,c] += sum_t dout[b,t,c]; dscale[b,c] += sum_t dout[b,t,c] * x[b,t,c]
     * (dshift, dscale in the same [B, ld] layout, always added to; either may be NULL). */
    void (*modulate_fwd)(tz_backend *be, float *out, const float *x, const float *shift,
                         const float *scale, int64_t ld, int64_t B, int64_t T, int64_t C,
                         int out_bf16);
    void (*modulate_bwd)(tz_backend *be, float *dx, float *dshift, float *dscale,
                         const float *dout, const float *x, const float *scale, int64_t ld,
                         int64_t B, int64_t T, int64_t C, int accumulate);

    /* Gated residual: out[b,t,c] = x[b,t,c] + gate[b,c] * y[b,t,c] (out may alias x).
     * bwd (the x path is the identity, left to the caller): dy += dout * gate (dy may be
     * NULL; accumulate 0: dy = ..., not read; 2: dy written as bf16 bit patterns, rounded as
     * to_bf16 rounds, for the linear's bf16 GEMMs); dgate[b,c] += sum_t dout[b,t,c] *
     * y[b,t,c] (always added to; dgate may be NULL). */
    void (*gate_fwd)(tz_backend *be, float *out, const float *x, const float *y,
                     const float *gate, int64_t ld, int64_t B, int64_t T, int64_t C);
    void (*gate_bwd)(tz_backend *be, float *dy, float *dgate, const float *dout, const float *y,
                     const float *gate, int64_t ld, int64_t B, int64_t T, int64_t C,
                     int accumulate);

    /* GELU, tanh approximation (nn.GELU(approximate="tanh")), n elements:
     * out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). bwd: dx += dout * gelu'(x).
     * SiLU: out = x * sigmoid(x). bwd: dx += dout * sigmoid(x) (1 + x (1 - sigmoid(x))).
     * out may alias x in the forwards. bwd with accumulate 0: dx = ..., its contents not read
     * (the bits of adding into zeros). GELU's rows: cols > 0 takes x (and dx) as n / cols rows
     * of cols elements and out (forward) or dout (backward) as rows at stride ld >= cols, the
     * rest of those rows neither read nor written (a GEMM's operand concatenated beside
     * another); cols = 0: all dense. The forward's flags: TZ_GELU_OUT16, out holds bf16 bit
     * patterns (each value rounded to nearest even, as to_bf16 would round it: an output only
     * GEMMs read, kept as they read it; 1, the out_bf16 of before); TZ_GELU_X16, x holds bf16
     * bit patterns (a GEMM's bf16 output), widened exactly: the values of GELU on the widened
     * x, bit for bit. GELU's backward with accumulate 2: dx written likewise as bf16 (the dy
     * of the linear before, which only its GEMMs read); accumulate | TZ_GELU_X16: x in bf16,
     * as the forward's. */
    void (*gelu_tanh_fwd)(tz_backend *be, float *out, const float *x, int64_t n, int64_t cols,
                          int64_t ld, int flags);
    void (*gelu_tanh_bwd)(tz_backend *be, float *dx, const float *dout, const float *x, int64_t n,
                          int accumulate, int64_t cols, int64_t ld);
    void (*silu_fwd)(tz_backend *be, float *out, const float *x, int64_t n);
    void (*silu_bwd)(tz_backend *be, float *dx, const float *dout, const float *x, int64_t n,
                     int accumulate);

    /* Bias of a linear layer: y[r,c] += bias[c], y [rows, C].
     * bwd: dbias[c] += sum_r dy[r,c] (rows summed in order, in double); dy16 (NULL: none):
     * dy rounded to bf16 as to_bf16 rounds it, written there in the same pass (rows * C bit
     * patterns, for the linear's bf16 GEMMs: one read of dy for both). */
    void (*bias_add_fwd)(tz_backend *be, float *y, const float *bias, int64_t rows, int64_t C);
    void (*bias_bwd)(tz_backend *be, float *dbias, const float *dy, int64_t rows, int64_t C,
                     uint16_t *dy16);
    /* gelu_tanh_bwd's dx (accumulate 0, dense) for a linear with a trained bias, that
     * linear's bias gradient taken in the same pass: dbias[c] += sum_r dx[r,c] (bias_bwd's
     * sums, in its order) and dx written only as bf16 bit patterns into dx16 [rows, C] (the
     * dy its bf16 GEMMs read), never in fp32: the bits of gelu_tanh_bwd(dx, dout, x, rows *
     * C, 0, 0, 0) then bias_bwd(dbias, dx, rows, C, dx16). (The DiT's fc1 in full
     * fine-tuning: one read of dout and x instead of an fp32 dx written and read again.) x16:
     * x holds bf16 bit patterns, as gelu_tanh_bwd's TZ_GELU_X16. */
    void (*gelu_tanh_bwd_bias)(tz_backend *be, uint16_t *dx16, float *dbias, const float *dout,
                               const float *x, int64_t rows, int64_t C, int x16);

    /* Squared error per row: sse[r] = sum_{i<n} (pred[r*ld + i] - target[r*n + i])^2 (in
     * double, stored as float); pred rows may be longer than n (ld >= n: extra channels are
     * ignored). bwd: dpred[r*ld + i] += 2 * dloss * (pred - target), i < n. */
    void (*mse_fwd)(tz_backend *be, float *sse, const float *pred, int64_t ld, const float *target,
                    int64_t rows, int64_t n);
    void (*mse_bwd)(tz_backend *be, float *dpred, const float *pred, int64_t ld,
                    const float *target, float dloss, int64_t rows, int64_t n);

    /* Patches of p x p pixels, row-major over the (H/p) x (W/p) grid (token = gy*(W/p) + gx).
     * patchify WRITES tok [B, T, C*p*p] from img [B, C, H, W]; unpatchify WRITES the inverse.
     * Element order within a patch vector: chan_last = 0: (c, i, j), the flattened layout of
     * a Conv2d weight [out, C, p, p]; chan_last = 1: (i, j, c), DiT's unpatchify. The two are
     * each other's inverse and transpose, so each is the other's backward. H % p == 0 and
     * W % p == 0. */
    void (*patchify)(tz_backend *be, float *tok, const float *img, int64_t B, int64_t C,
                     int64_t H, int64_t W, int64_t p, int chan_last);
    void (*unpatchify)(tz_backend *be, float *img, const float *tok, int64_t B, int64_t C,
                       int64_t H, int64_t W, int64_t p, int chan_last);

    /* Strided 2-D copy (WRITES): dst[r*ldd + c] = src[r*lds + c], r < rows, c < cols. */
    void (*copy2d)(tz_backend *be, float *dst, int64_t ldd, const float *src, int64_t lds,
                   int64_t rows, int64_t cols);

    /* ---- quantized weights (quant/turboquant.h has the math, quant/tq_layout.h the layout) ----
     * A row of cols elements is cut into groups of `group` (64, 128 or 256; cols a multiple
     * of it); group column j has the signs s_j derived from `seed` by the rule of
     * tq_layout.h, and R_j = H diag(s_j) / sqrt(group) (H the Walsh-Hadamard matrix).
     * tq_rotate: y[r, j-th group] = R_j x[r, j-th group], rows r < rows. WRITES y; y may be x.
     * tq_rotate_bwd: dx[r, j-th group] += R_j^T dy[r, j-th group] (the inverse rotation);
     *   accumulate = 0: dx = ..., its contents not read (dx may not be dy).
     * tq_dequant: w[rows, cols] = scale_k * levels[code] for every element of every group k
     *   (row-major group order): codes rows*cols*bits/8 bytes packed per tq_layout.h, scales
     *   rows*cols/group bf16 bit patterns, levels 2^bits floats (the codebook centroids:
     *   w is then the weight in the rotated basis; or the absmax levels: the plain weight).
     *   WRITES w. */
    void (*tq_rotate)(tz_backend *be, float *y, const float *x, int64_t rows, int64_t cols,
                      int group, uint64_t seed);
    /* tq_rotate's y rounded to bf16 (to nearest even) as it is written: bf16(R_j x), the
     * bits to_bf16 would make of tq_rotate's output (y may not be x), row r at y + r * ldy
     * (ldy >= cols; elements past cols in a row are not written); where xc is not NULL, x
     * itself rounded too, into xc [rows, cols] (to_bf16's bits: one read of x for both). */
    void (*tq_rotate16)(tz_backend *be, uint16_t *y, const float *x, int64_t rows, int64_t cols,
                        int64_t ldy, int group, uint64_t seed, uint16_t *xc);
    void (*tq_rotate_bwd)(tz_backend *be, float *dx, const float *dy, int64_t rows,
                          int64_t cols, int group, uint64_t seed, int accumulate);
    /* tq_rotate16 and tq_rotate_bwd on a window of columns: x (dy) [rows, cols] is columns
     * [c0, c0 + cols) of rows of wcols (a wider weight's input: the Llama's MLP in column
     * chunks), so its group j takes the signs of group column c0 / group + j; xc as
     * tq_rotate16's. c0 and cols multiples of group, c0 + cols <= wcols (fatal otherwise).
     * c0 = 0 and wcols = cols: tq_rotate16 and tq_rotate_bwd, the same bits. */
    void (*tq_rotate16_at)(tz_backend *be, uint16_t *y, const float *x, int64_t rows,
                           int64_t cols, int64_t ldy, int group, uint64_t seed, int64_t c0,
                           int64_t wcols, uint16_t *xc);
    void (*tq_rotate_bwd_at)(tz_backend *be, float *dx, const float *dy, int64_t rows,
                             int64_t cols, int group, uint64_t seed, int accumulate, int64_t c0,
                             int64_t wcols);
    /* SwiGLU into tq_rotate16_at in one pass: y = tq_rotate16_at of s = silu(g) * u (g, u
     * [rows, cols] bf16 bit patterns, a GEMM's bf16 outputs), the bits swiglu_fwd(s, g, u,
     * TZ_SWIGLU_IN16) then tq_rotate16_at(y, s, ..., sc) make, s stored only as its bf16
     * copy sc [rows, cols] where sc is not NULL (the window's LoRA input). No fp32 s written
     * or read: the Llama's MLP forward in chunks of columns. */
    void (*swiglu_rot16_at)(tz_backend *be, uint16_t *y, const uint16_t *g, const uint16_t *u,
                            int64_t rows, int64_t cols, int64_t ldy, int group, uint64_t seed,
                            int64_t c0, int64_t wcols, uint16_t *sc);
    void (*tq_dequant)(tz_backend *be, float *w, const uint8_t *codes, const uint16_t *scales,
                       const float *levels, int64_t rows, int64_t cols, int bits, int group);
    /* A GEMM with a quantized weight W [rows, cols] (tq_dequant's w from codes, scales,
     * levels) as the second operand, decoded on the way into `tile` (tz_tq_tile_elems(be,
     * rows, cols, cols, group) elements of the GEMM operand type, tz_dtype_size(matmul_dtype)
     * bytes each: rows * cols, or two chunks' worth where be decodes in chunks; backend
     * memory, the caller's scratch, its contents afterwards unspecified):
     *   transW = 1: C[M, rows] = alpha * A[M, cols] W^T + beta * C  (a layer's forward)
     *   transW = 0: C[M, cols] = alpha * A[M, rows] W   + beta * C  (its input gradient)
     * With fp32 GEMMs it is tq_dequant into tile then matmul(C, A, tile, ..., transA = 0,
     * transB = transW), which is what the CPU does; with bf16 GEMMs the weight is decoded
     * straight into bf16, so that no fp32 copy of it is made. A holds fp32, or bf16 bit
     * patterns where a_bf16 (read as matmul16 reads them). */
    void (*tq_matmul)(tz_backend *be, float *C, const void *A, int a_bf16, float *tile,
                      const uint8_t *codes, const uint16_t *scales, const float *levels,
                      int64_t rows, int64_t cols, int bits, int group, int64_t M, int transW,
                      float alpha, float beta);
    /* A LoRA path folded into tq_matmul's forward product (transW = 1) along K:
     *   C[M, rows] = [A | h] [W | s B]^T
     * A: bf16 bit patterns [M, ld] (ld >= cols + r, a multiple of 8), each row's first cols
     *   the GEMM operand (the rotated input, tq_rotate16 at row stride ld); the op WRITES the
     *   rest of each row: h [M, r] (fp32, x A_lora^T) rounded to bf16, then zeros.
     * W decoded into tile (bf16, tz_tq_tile_elems(be, rows, cols, ld, group) elements) at
     *   row stride ld, each row's last ld - cols elements s * B [rows, r] (fp32) rounded to
     *   bf16, then zeros.
     * r = 0: the plain product (h and B unread). bias: NULL, or [rows] fp32 folded in the
     * same way, one column after h (ld >= cols + r + 1): A's is 1, W's bf16(bias), so C
     * gains the bias rounded to bf16 (no pass over C to add it). For backends whose GEMMs
     * round to bf16 (fatal otherwise); the CPU's is the reference: A's first cols read from
     * bf16, the rest in fp32, C = A W^T + s h B^T + bias. c_bf16: C written as bf16 bit
     * patterns [M, rows] (its first M * rows * 2 bytes), the fp32 result rounded to nearest
     * even by the GEMM's epilogue (an output only bf16 consumers read: swiglu's IN16). */
    void (*tq_matmul_lora)(tz_backend *be, float *C, uint16_t *A, int64_t ld, const float *h,
                           const float *B, int64_t r, float s, float *tile, const uint8_t *codes,
                           const uint16_t *scales, const float *levels, int64_t rows,
                           int64_t cols, int bits, int group, int64_t M, const float *bias,
                           int c_bf16);

    /* ---- the offload: pinned host memory, asynchronous copies, events (optim/zero.c) ----
     * A backend has two queues: TZ_QUEUE_COMPUTE, where every op above runs, and
     * TZ_QUEUE_COPY, where the async copies run (a device backend's second stream, so copies
     * overlap the ops). Work on one queue runs in order; the queues are ordered against each
     * other (and the host) only by events: event_mark records the point a queue has reached,
     * event_wait makes a queue (or the host: TZ_QUEUE_HOST) wait until the work before that
     * point is done. E.g. a gradient bucket to the host while backward goes on:
     *   ev = mark(COMPUTE); wait(ev, COPY); download_async(...); done = mark(COPY);
     *   ... later: wait(done, HOST) (or event_done(done) to poll), then read the host buffer.
     * The CPU backend does everything at once: plain memory, memcpy, events always done. */

    /* Pinned (page-locked) host memory, zeroed, 64-byte aligned (the CPU backend: plain
     * memory). Not counted in live_bytes. Fatal on failure. */
    void *(*host_alloc)(tz_backend *be, size_t bytes);
    void (*host_free)(tz_backend *be, void *p);
    /* Pins an existing host buffer (e.g. the NUMA-local optimizer shard) so the async copies
     * to and from it run at full speed; unregister before freeing it. CPU: nothing. */
    void (*host_register)(tz_backend *be, void *p, size_t bytes);
    void (*host_unregister)(tz_backend *be, void *p);
    /* Copies on TZ_QUEUE_COPY, returning at once (the host buffer must stay untouched until
     * an event marked after it is done; from pinned memory for full speed). */
    void (*download_async)(tz_backend *be, void *host_dst, const void *src, size_t bytes);
    void (*upload_async)(tz_backend *be, void *dst, const void *host_src, size_t bytes);
    /* An event at the current end of `queue` (TZ_QUEUE_COMPUTE or TZ_QUEUE_COPY); free it
     * with event_free once no wait needs it. */
    void *(*event_mark)(tz_backend *be, int queue);
    /* `queue` (TZ_QUEUE_COMPUTE, TZ_QUEUE_COPY, or TZ_QUEUE_HOST: the caller blocks) runs
     * nothing more until the work before the event is done. */
    void (*event_wait)(tz_backend *be, void *ev, int queue);
    /* 1 when the work before the event is done (does not block). */
    int (*event_done)(tz_backend *be, void *ev);
    void (*event_free)(tz_backend *be, void *ev);
    /* The device this backend drives, for start-up lines and GPU binding: ordinal (-1: the
     * host), name, PCI bus id ("0000:3b:00.0" as the driver spells it; "" for the host),
     * free and total bytes of its memory now (0 when unknown). */
    void (*device_info)(tz_backend *be, tz_device_info *out);
};

/* Every function pointer of the table, in the order of the struct (the memory ops first).
 * tz_backend_create checks that a backend set each one (a NULL slot is fatal, naming the
 * op); backend.c asserts at compile time that the list covers the whole struct, so a new
 * op is added here as well. */
#define TZ_BACKEND_OPS(X)                                                                    \
    X(destroy) X(alloc) X(release) X(upload) X(download) X(copy) X(sync) X(fill) X(scale)    \
    X(axpy) X(to_bf16) X(from_bf16) X(sumsq) X(adamw) X(matmul) X(matmul_bw16) X(matmul16) X(matmul_bias) X(matmul_lora) X(embedding_fwd)        \
    X(embedding_bwd) X(embedding_fwd_w16) X(rmsnorm_fwd)                                      \
    X(rmsnorm_bwd) X(rope_fwd) X(rope_bwd) X(rope_fwd16) X(rope_bwd16) X(rope_tab_fwd)         \
    X(rope_tab_bwd) X(rope_tab_fwd16) X(rope_tab_bwd16) X(rope_pairs_fwd) X(rope_pairs_bwd)   \
    X(rope_pairs_fwd16) X(rms_rope_pairs16)                                                   \
    X(attention_fwd)                                                                          \
    X(attention_bwd) X(attention_cache_fwd) X(swiglu_fwd)                                    \
    X(swiglu_bwd) X(xent_fwd) X(xent_bwd) X(layernorm_fwd) X(layernorm_bwd)                 \
    X(modulate_fwd) X(modulate_bwd) X(gate_fwd) X(gate_bwd) X(gelu_tanh_fwd)                \
    X(gelu_tanh_bwd) X(silu_fwd) X(silu_bwd) X(bias_add_fwd) X(bias_bwd)                    \
    X(gelu_tanh_bwd_bias) X(mse_fwd) X(mse_bwd) X(patchify) X(unpatchify) X(copy2d) X(tq_rotate) X(tq_rotate16) X(tq_rotate_bwd)  \
    X(tq_rotate16_at) X(tq_rotate_bwd_at) X(swiglu_rot16_at)                                \
    X(tq_dequant) X(tq_matmul) X(tq_matmul_lora) X(host_alloc) X(host_free) X(host_register)                   \
    X(host_unregister) X(download_async) X(upload_async) X(event_mark) X(event_wait)          \
    X(event_done) X(event_free) X(device_info)

/* tq_matmul's chunks where be decodes in them (tq_chunks > 1 with bf16 GEMMs): the forward
 * (transW = 1) takes W's rows, tz_tq_chunk_rows at a time; the backward (transW = 0) its
 * columns, tz_tq_chunk_cols (whole groups) at a time. Not chunked: all of W at once. */
/* The chunks a GPU's decode takes (the CUDA backend's tq_chunks and a GPU plan's, so that the
 * plan stays the allocator's peak): TZ_TQ_CHUNKS (a whole number from 1 to 16; 1: each weight
 * decoded whole and multiplied by one GEMM, nothing overlapped), else TZ_TQ_DEVICE_CHUNKS.
 * Fatal, naming the variable, for anything else. For measuring the overlap of the decode
 * against the GEMMs' size (docs/gpu.md). */
int tz_tq_device_chunks(void);
static inline int tz_tq_chunked(const tz_backend *be) {
    return be->tq_chunks > 1 && be->matmul_dtype == TZ_DT_BF16;
}
static inline int64_t tz_tq_chunk_rows(const tz_backend *be, int64_t rows) {
    const int k = tz_tq_chunked(be) ? be->tq_chunks : 1;
    return (rows + k - 1) / k;
}
static inline int64_t tz_tq_chunk_cols(const tz_backend *be, int64_t cols, int group) {
    const int k = tz_tq_chunked(be) ? be->tq_chunks : 1;
    return (cols / group + k - 1) / k * group;
}
/* Elements (of the GEMM operand type) of the tile tq_matmul (ld = cols) or tq_matmul_lora
 * (its ld) needs for W [rows, cols] in groups of `group`: rows * ld; decoded in chunks, one
 * chunk buffer where one chunk covers W, else two, of the larger of the forward's (chunk rows
 * x ld) and the backward's (rows x chunk columns). */
static inline int64_t tz_tq_tile_elems(const tz_backend *be, int64_t rows, int64_t cols,
                                       int64_t ld, int group) {
    if (!tz_tq_chunked(be)) return rows * ld;
    const int64_t cr = tz_tq_chunk_rows(be, rows), cc = tz_tq_chunk_cols(be, cols, group);
    const int64_t f = (cr < rows ? 2 : 1) * cr * ld, b = (cc < cols ? 2 : 1) * rows * cc;
    return f > b ? f : b;
}

/* The narrow GEMM (a device's bf16 GEMMs of matmul, matmul16, matmul_bw16 and an undivided
 * tq_matmul: cuda/cuda_narrow.cu, docs/design/cuda.md "Narrow GEMMs"): C [M, N] = alpha op(A)
 * op(B) + beta C where one side of C is at most TZ_NARROW_MAXR wide (LoRA's rank: its products
 * x A^T, dh^T x, B^T dy, ...), the operand along the other side read in bf16 as stored (or
 * rounded to it first). A GEMM library's tiles of 128 cut such a C
 * into a few dozen blocks; this cuts it into blocks of TZ_NARROW_ROWS rows of the long side
 * and splits K so that there are about TZ_NARROW_BLOCKS of them, each block's sums written
 * apart and then added in the order of K (the same bits every run, on any GPU: the split
 * follows the shape alone). In its terms Y [P, R] = X [P, K] S [R, K]^T: X the long side's
 * operand, S the narrow one's; C is Y (yt = 0: N narrow) or Y^T (yt = 1: M narrow). */
#define TZ_NARROW_MAXR 64
#define TZ_NARROW_ROWS 64   /* rows of P a block: 4 warps of 16 */
#define TZ_NARROW_KC 64     /* K a stage of a block's pipeline */
#define TZ_NARROW_BLOCKS 264 /* two blocks for each of an H100 SXM's 132 multiprocessors */
typedef struct tz_narrow {
    int yt;         /* 1: M is the narrow side (C = Y^T, [R, P]); 0: N (C = Y, [P, R]) */
    int xk;         /* X stored [K, P] (row stride P); 0: [P, K] (row stride K) */
    int sk;         /* S stored [K, R] (row stride R); 0: [R, K] (row stride K) */
    int64_t P, R, K;
    int64_t rpad;   /* R rounded up to 16, 32 or 64 (the kernel's columns) */
    int64_t kc;     /* K a block (a multiple of TZ_NARROW_KC) */
    int64_t nsplit; /* blocks along K: ceil(K / kc) */
} tz_narrow;
/* TZ_NARROW_GEMM: 1 (default) or 0 (every matmul16 through the GEMM library, for measuring);
 * fatal for anything else, naming the variable. */
int tz_narrow_gemm_enabled(void);
/* Whether a GEMM (M, N, K, transposes) takes the narrow path on a backend with it on (`on`),
 * and its plan in np: one side of C at most TZ_NARROW_MAXR (N first) and X's rows 16-byte
 * aligned in bf16 elements (a row stride a multiple of 8). An fp32 operand is rounded to bf16
 * first, as for any bf16 GEMM, so that which path a product takes follows its shape alone,
 * not the type its operands arrive in (a shared forward on an input rounded once gives the
 * separate forwards' bits). */
static inline int tz_narrow_plan(int on, int64_t M, int64_t N, int64_t K, int ta, int tb,
                                 tz_narrow *np) {
    if (!on || M <= 0 || N <= 0 || K <= 0) return 0;
    int yt;
    if (N <= TZ_NARROW_MAXR) yt = 0;
    else if (M <= TZ_NARROW_MAXR) yt = 1;
    else return 0;
    np->yt = yt;
    np->P = yt ? N : M, np->R = yt ? M : N, np->K = K;
    /* yt = 0: X = op(A), S[j][k] = op(B)[k][j]; yt = 1: X = op(B)^T, S = op(A) */
    np->xk = yt ? !tb : ta;
    np->sk = yt ? ta : !tb;
    if ((np->xk ? np->P : K) % 8) return 0;
    np->rpad = np->R <= 16 ? 16 : np->R <= 32 ? 32 : 64;
    const int64_t tiles = (np->P + TZ_NARROW_ROWS - 1) / TZ_NARROW_ROWS;
    const int64_t chunks = (K + TZ_NARROW_KC - 1) / TZ_NARROW_KC;
    int64_t ns = (TZ_NARROW_BLOCKS + tiles - 1) / tiles;
    if (ns > chunks) ns = chunks;
    np->kc = (chunks + ns - 1) / ns * TZ_NARROW_KC;
    np->nsplit = (K + np->kc - 1) / np->kc;
    return 1;
}

/* TZ_TQ_FUSED: 1 (default) or 0 (a decode step's and a modulation's quantized products
 * decoded into the tile and multiplied apart, as larger ones are, for measuring); fatal for
 * anything else, naming the variable. */
int tz_tq_fused_enabled(void);
/* Whether tq_matmul (ld = cols) or tq_matmul_lora (its ld) on a quantized W [rows, cols] and M
 * rows of A goes through the fused narrow kernel (cuda/cuda_narrow.cu, k_narrow_tq): bf16
 * GEMMs, be->tq_fused, M at most TZ_NARROW_MAXR and the other side wider (the narrow plan's
 * yt = 1: X is the weight). Its plan in np: tz_narrow_plan's for C [M, N] = A op(W) over K
 * (transW = 1: N = rows, K = ld, W [N, K]; transW = 0: N = cols, K = rows), so that the kernel
 * sums in the order the narrow GEMM would over the decoded weight. */
static inline int tz_tq_fused_plan(const tz_backend *be, int64_t M, int64_t rows, int64_t cols,
                                   int64_t ld, int transW, tz_narrow *np) {
    if (!be->tq_fused || be->matmul_dtype != TZ_DT_BF16) return 0;
    const int64_t N = transW ? rows : cols, K = transW ? ld : rows;
    return tz_narrow_plan(1, M, N, K, 0, transW, np) && np->yt;
}

/* Attention's workspace (be->att_ws). On a device backend with bf16 GEMM operands (a GPU)
 * attention runs on the tensor cores (cuda/cuda_attention.cu, docs/design/cuda.md): for a head
 * dimension up to TZ_ATTENTION_FLASH_MAXD flash style, the scores never leaving the chip, so
 * the forward wants no workspace and the backward delta (B*Hq*T floats), and where q, k, v
 * are given in bf16 (in16: tz_att_ld.in16) lse in base 2 (as many) and dO rounded to bf16
 * (B*T*Hq*D, written by delta's pass for the kernels that copy their tiles ahead: cp.async
 * moves bytes, it cannot round); above it through
 * tensor-core GEMMs over chunks of query rows, whose scores live in the workspace: the forward
 * holds one chunk of scores, the backward two (the probabilities and their gradients) plus
 * delta. A chunk of c query rows holds c rows of ceil4(T) floats for each of the B*Hq
 * (sequence, head) pairs. The plan gives the score buffers TZ_ATTENTION_WS_SCORES bytes in
 * all, at least 16 rows (all T when T < 16). With fp32 GEMM operands, and on the host,
 * attention wants no workspace: 0 bytes. */
#define TZ_ATTENTION_FLASH_MAXD 128
#define TZ_ATTENTION_WS_SCORES ((size_t)64 << 20)
/* Query rows per chunk that `bytes` of score buffers hold (nbuf buffers), rounded down to a
 * multiple of 64 (or 16) rows where that many fit, all T when they fit; 0: not one row. */
static inline int64_t tz_attention_chunk(size_t bytes, int64_t B, int64_t T, int64_t Hq,
                                         int nbuf) {
    const size_t row = (size_t)nbuf * (size_t)(B * Hq) * (size_t)((T + 3) / 4 * 4) * 4;
    const int64_t c = row ? (int64_t)(bytes / row) : 0;
    if (c >= T) return T;
    return c >= 64 ? c / 64 * 64 : c >= 16 ? c / 16 * 16 : c;
}
/* delta's part of the backward's workspace (first in it, 64-byte rounded) */
static inline size_t tz_attention_delta_bytes(int64_t B, int64_t T, int64_t Hq) {
    return ((size_t)(B * Hq * T) * 4 + 63) & ~(size_t)63;
}
/* the flash backward's workspace: delta, then lse in base 2, then dO in bf16 (each 64-byte
 * rounded) */
static inline size_t tz_attention_flash_ws_bytes(int64_t B, int64_t T, int64_t Hq, int64_t D) {
    return 2 * tz_attention_delta_bytes(B, T, Hq) +
           (((size_t)(B * T * Hq * D) * 2 + 63) & ~(size_t)63);
}
static inline size_t tz_attention_ws_bytes(const tz_backend *be, int64_t B, int64_t T,
                                           int64_t Hq, int64_t D, int backward, int in16) {
    if (!be->device || be->matmul_dtype != TZ_DT_BF16 || B <= 0 || T <= 0 || Hq <= 0)
        return 0;
    if (D <= TZ_ATTENTION_FLASH_MAXD)
        return !backward ? 0
               : in16    ? tz_attention_flash_ws_bytes(B, T, Hq, D)
                         : tz_attention_delta_bytes(B, T, Hq);
    const int nbuf = backward ? 2 : 1;
    int64_t c = tz_attention_chunk(TZ_ATTENTION_WS_SCORES, B, T, Hq, nbuf);
    if (c < 16) c = T < 16 ? T : 16;
    return (size_t)nbuf * (size_t)(c * B * Hq) * (size_t)((T + 3) / 4 * 4) * 4 +
           (backward ? tz_attention_delta_bytes(B, T, Hq) : 0);
}
/* The flash backward's score gradients kept (be->att_ds): the kernel of dk and dv, which
 * computes dS = P (dP - delta) for every visible (query, key), stores it in bf16, and dq's kernel
 * reads it (dq = dS K) instead of computing S, P, dP and dS again: 5 matrix products a tile
 * instead of 7, one exponential instead of two. Tiles of 64 queries x 64 keys (8 KiB), the lower
 * triangle of them when causal; (sequence, kv head) pairs in groups, each group's heads' tiles
 * in the memory lent, the kernel of dk and dv then dq's for one group after the other. Only
 * where the memory holds TZ_ATTENTION_DS_PAIRS_MIN pairs (or all of them): dk and dv's grid
 * needs enough blocks to spread the causal triangle's unequal blocks over the multiprocessors;
 * the groups are then made equal (16 and 16 of 32 pairs where 24 fit, not 24 and 8). */
#define TZ_ATTENTION_DS_TILE 64
#define TZ_ATTENTION_DS_PAIRS_MIN 16
/* Bytes of one query head's tiles of dS (bf16) */
static inline size_t tz_attention_ds_head_bytes(int64_t T, int causal) {
    const size_t n = (size_t)((T + TZ_ATTENTION_DS_TILE - 1) / TZ_ATTENTION_DS_TILE);
    return (causal ? n * (n + 1) / 2 : n * n) * TZ_ATTENTION_DS_TILE * TZ_ATTENTION_DS_TILE * 2;
}
/* (sequence, kv head) pairs per group when `bytes` are lent (the groups made equal: every
 * group this many but the last, which may hold fewer), or 0: the memory holds too few pairs,
 * and dS is computed twice. */
static inline int64_t tz_attention_ds_group(int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                                            int causal, size_t bytes) {
    if (B <= 0 || T <= 0 || Hkv <= 0 || Hq % Hkv) return 0;
    const int64_t pairs = B * Hkv;
    const size_t per = tz_attention_ds_head_bytes(T, causal) * (size_t)(Hq / Hkv);
    const int64_t fit = (int64_t)(bytes / per); /* (bytes < per: 0) */
    const int64_t least = pairs < TZ_ATTENTION_DS_PAIRS_MIN ? pairs : TZ_ATTENTION_DS_PAIRS_MIN;
    if (fit < least) return 0;
    if (fit >= pairs) return pairs;
    const int64_t groups = (pairs + fit - 1) / fit;
    return (pairs + groups - 1) / groups;
}

/* Whether be's attention takes q, k and v in bf16 (tz_att_ld.in16) at head dimension D:
 * the host (it widens them, for tests) and a device's flash kernels on the tensor cores (bf16
 * GEMM operands, D <= TZ_ATTENTION_FLASH_MAXD), which round them to bf16 as they load them
 * anyway, so a model keeping them in bf16 gets the same results. */
static inline int tz_attention_takes_bf16(const tz_backend *be, int64_t D) {
    return !be->device || (be->matmul_dtype == TZ_DT_BF16 && D <= TZ_ATTENTION_FLASH_MAXD);
}

/* run.device and run.precision, as the config holds them (io/config.c parses the names, in
 * this order). */
enum tz_device_kind { TZ_DEVICE_AUTO = 0, TZ_DEVICE_CPU = 1, TZ_DEVICE_CUDA = 2 };
enum tz_precision { TZ_PRECISION_AUTO = 0, TZ_PRECISION_FP32 = 1, TZ_PRECISION_BF16 = 2 };

/* run.precision: fp32, bf16, or auto (bf16 on a device backend that supports it, else fp32):
 * sets be->matmul_dtype. Fatal, with a hint, when the backend lacks the type asked for (the
 * CPU computes in fp32 only). Returns the type chosen. */
enum tz_dtype tz_backend_set_precision(tz_backend *be, enum tz_precision precision);
/* Frees a backend made by any create function (NULL: nothing). */
void tz_backend_destroy(tz_backend *be);
/* Fatal, naming the op, when a slot of be's table is NULL (tz_backend_create, in
 * backend/registry.h, calls it). */
void tz_backend_check(const tz_backend *be);


/* The CPU kernel, i.e. the instruction set the CPU ops were compiled for, that a backend
 * created now uses: "avx512", "avx2" or "portable" ("native" alone in a TZ_NATIVE build), the
 * fastest one this CPU runs, or the one the environment variable TZ_CPU_KERNEL names (fatal,
 * with a hint, when it is not built in or this CPU cannot run it; "auto" or empty: choose).
 * Kernels differ in rounding only (vector widths and FMA change the order of additions);
 * on one machine and kernel, results are reproducible bit for bit. */
const char *tz_cpu_kernel_name(void);
/* 1 when kernel `name` is built in and this CPU can run it, else 0. */
int tz_cpu_kernel_usable(const char *name);

#endif
