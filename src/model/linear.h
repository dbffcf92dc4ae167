/* Linear layers: y = x W^T (+ LoRA: scale * (x A^T) B^T) (+ bias), forward and backward through the
 * backend, with W dense or quantized (frozen codes + scales, decoded per use into a scratch
 * tile). The one place where weights meet quantization and adapters; no storage owned here. */
#ifndef TZ_LINEAR_H
#define TZ_LINEAR_H
#include <stdint.h>

#include "core/arena.h"
#include "core/backend.h"
#include "model/params.h"

/* Scratch shared by every quantized layer of a model (the model owns it, in its arena):
 * ONE tile that holds the decoded weight of the layer in use (sized for the largest
 * quantized weight, in elements of the backend's GEMM operand type: fp32, or bf16 where
 * tq_matmul decodes straight into bf16) and one activation buffer of rows x (largest `in` of a TurboQuant
 * layer): the rotated input in forward, dy W_rot in backward; in the shared forward with bf16
 * GEMM operands the rotated and the plain input as two bf16 arrays, side by side. */
typedef struct tz_tq_scratch {
    float *tile;        /* tile_elems elements of the GEMM operand type */
    int64_t tile_elems;
    float *act;
    int64_t act_floats;
} tz_tq_scratch;

typedef struct tz_linear {
    int64_t in, out;
    tz_param *w;   /* [out, in]: dense (w->w) or quantized (w->q, frozen) */
    tz_param *a;   /* LoRA A [r, in], NULL without adapter */
    tz_param *b;   /* LoRA B [out, r] */
    int64_t r;
    float scale;   /* alpha / r */
    const tz_tq_scratch *tq; /* the model's scratch; used when w is quantized */
    tz_param *bias; /* [out], NULL without bias */
} tz_linear;

/* LoRA on l for the module named `module` (e.g. "model.layers.3.self_attn.q_proj"): registers
 * base_model.model.MODULE.lora_A.weight [r, in] and .lora_B.weight [out, r] in ps (trainable
 * adapters with weight decay, zero until the model's init or an adapter file fills them) at
 * backward stage `stage`, and sets l->r and l->scale = alpha / r. Fatal, with a hint, when r
 * exceeds the smaller dimension of l. l->in and l->out must be set. */
void tz_linear_add_lora(tz_linear *l, tz_params *ps, tz_backend *be, const char *module,
                        int64_t r, double alpha, int stage);

/* C = alpha * A op(W) + beta * C for a dense weight W as the second operand (matmul with
 * transA = 0, B = W), whether W holds fp32 or bf16 (w16); and the embedding lookup from a
 * table W likewise. Every op that reads a dense weight goes through these two. */
void tz_matmul_w(tz_backend *be, float *C, const float *A, const tz_param *W, int64_t M,
                 int64_t N, int64_t K, int transW, float alpha, float beta);
void tz_embedding_w(tz_backend *be, float *out, const int32_t *tok, const tz_param *W,
                    int64_t n, int64_t C);

/* y[n, out] = x[n, in] W^T (+ LoRA) (+ bias, added last). h[n, r] receives x A^T when adapted
 * (saved for backward); h may be NULL without adapter.
 * Quantized W, TurboQuant: x_rot = tq_rotate(x) into tq->act, W_rot decoded into tq->tile,
 * y = x_rot W_rot^T (= x W_hat^T, quant/turboquant.h). Absmax: W_hat decoded, y = x W_hat^T.
 * The LoRA path always reads the un-rotated x. With bf16 GEMMs and room in the tile
 * (tz_linear_fold_cols) a TurboQuant weight's LoRA path and bias run inside its GEMM, along K
 * (tq_matmul_lora: s B, h and the bias rounded to bf16 there; h itself is kept in fp32). */
void tz_linear_fwd(tz_backend *be, const tz_linear *l, float *y, float *h, const float *x,
                   int64_t n);
/* tz_linear_fwd with y written as bf16 bit patterns [n, out] where y16 (the folded GEMM's
 * epilogue rounding: tq_matmul_lora's c_bf16), for an output read only where it is rounded or
 * widened exactly (GELU's TZ_GELU_X16); fatal where tz_linear_fwd_writes_y16 says no: a
 * TurboQuant weight whose adapter or bias folds into its GEMM on n rows. */
void tz_linear_fwd16(tz_backend *be, const tz_linear *l, float *y, float *h, const float *x,
                     int64_t n, int y16);
int tz_linear_fwd_writes_y16(const tz_backend *be, const tz_linear *l, int64_t n);
/* Accumulates dx += dy W (+ LoRA path), and the weight / adapter / bias gradients where
 * trainable.
 * dx may be NULL (input gradient not needed). scratch: n * r floats when adapted.
 * Quantized W: the tile is decoded again, tq->act = dy W_rot, and dx += tq_rotate_bwd(tq->act)
 * (TurboQuant), or dx += dy W_hat (absmax). A trainable quantized W (full fine-tuning: the
 * fp32 master lives in the optimizer's host shard) gets the straight-through gradient
 * dW += dy^T x, the gradient w.r.t. W_hat in the plain basis, as for a dense weight. */
void tz_linear_bwd(tz_backend *be, const tz_linear *l, float *dx, const float *dy,
                   const float *x, const float *h, float *scratch, int64_t n);
/* The same with dx written, not added to (its contents not read: no zeroing before), for
 * the first input gradient a buffer gets. */
void tz_linear_bwd_set(tz_backend *be, const tz_linear *l, float *dx, const float *dy,
                       const float *x, const float *h, float *scratch, int64_t n);
/* Whether be's GEMMs round fp32 operands to bf16: its operand type is bf16 and it has bf16
 * GEMMs (a backend told bf16 without them computes in fp32). */
int tz_linear_rounds_bf16(const tz_backend *be);
/* tz_linear_fwd and tz_linear_bwd_set on an input kept rounded to bf16, x16 [n, in] (bit
 * patterns: what the GEMMs read of it with bf16 operands, so the same bits as giving them the
 * fp32 x): a dense weight's (a bias folded along K, LoRA's A read from x16 too) on a backend
 * with bf16 GEMM operands; fatal otherwise. For a model that keeps the inputs of its linears
 * in bf16 for the backward instead of fp32 (the DiT). The backward takes a quantized weight
 * too: it reads x only in the GEMMs of the weight's and A's gradients (its dx goes through
 * the weight), so any weight on a backend with bf16 GEMM operands (the Llama's down
 * projection in a backward with MLP chunks, whose input SwiGLU writes in bf16). */
void tz_linear_fwd_x16(tz_backend *be, const tz_linear *l, float *y, float *h,
                       const uint16_t *x16, int64_t n, int y16);
/* Whether tz_linear_fwd_x16 can write y in bf16 (its y16: bit patterns, the fp32 result with
 * the bias rounded by the GEMM's epilogue as to_bf16 rounds it): a dense weight with a bias
 * (matmul_bias's c_bf16), no adapter (LoRA adds into an fp32 y) and bf16 GEMMs. */
int tz_linear_writes_y16(const tz_backend *be, const tz_linear *l);
void tz_linear_bwd_set_x16(tz_backend *be, const tz_linear *l, float *dx, const float *dy,
                           const uint16_t *dy16, const uint16_t *x16, const float *h,
                           float *scratch, int64_t n);
/* Linears that read one input x [n, in] (q, k and v; gate and up): the same as
 * tz_linear_fwd(ls[i], ys[i], hs[i], x) and tz_linear_bwd(ls[i], dx, dys[i], x, hs[i]) for
 * i < count, in that order, with the work on x done once for all where every weight is
 * TurboQuant of one rotation (group, seed) and one scratch: forward, x rotated once (with bf16
 * GEMM operands straight into bf16, tq_rotate16, and x itself rounded once for the LoRA
 * paths), the same bits as the separate calls; backward, dx += R^T (sum_i dy_i W_rot_i), one
 * inverse rotation instead of count (equal to the separate calls' sum to fp32 rounding), and
 * x rounded once for the weight and LoRA gradients. Dense weights with bf16 GEMM operands,
 * where the scratch holds n * in bf16 (the Llama plans it): x rounded once for every GEMM that
 * reads it, in the separate calls' order, so the same bits throughout. Otherwise the separate
 * calls. Both backwards, with bf16 GEMM operands: each dy rounded once for the GEMMs that read
 * it, where the scratch has room (tz_linear_act_floats), the same bits. dx_set: dx written,
 * not added to (tz_linear_bwd_set's). */
void tz_linear_fwd_shared(tz_backend *be, const tz_linear *const *ls, float *const *ys,
                          float *const *hs, int count, const float *x, int64_t n);
/* tz_linear_fwd_shared with ys[i] written as bf16 bit patterns [n, out] where bit i of the
 * mask y16 is set (the prepared path's products with the GEMM's epilogue rounding:
 * tz_linear_fwd_shared_apply's y16), for outputs read only where they are rounded or widened
 * exactly; fatal where tz_linear_shared_y16 says no. y16 = 0: tz_linear_fwd_shared. */
void tz_linear_fwd_shared16(tz_backend *be, const tz_linear *const *ls, float *const *ys,
                            float *const *hs, int count, const float *x, int64_t n, int y16);
/* Whether tz_linear_fwd_shared16 can write the outputs of ls on n rows in bf16: TurboQuant
 * weights of one rotation on bf16 GEMMs whose adapters fold, with room for the prepared path
 * in their scratch, and a backend with tq_matmul_lora. True for n, true for fewer rows. */
int tz_linear_shared_y16(const tz_backend *be, const tz_linear *const *ls, int count,
                         int64_t n);
void tz_linear_bwd_shared(tz_backend *be, const tz_linear *const *ls, int count, float *dx,
                          const float *const *dys, const float *x, const float *const *hs,
                          float *scratch, int64_t n, int dx_set);
/* tz_linear_bwd_shared with dy_i given already rounded to bf16 where dy16s[i] is not NULL
 * (bit patterns [n, out_i], as the op that makes dy wrote it): what the backward's GEMMs read
 * of an fp32 dy, so the same bits, without the rounding pass. dys may then be NULL (dys[i]
 * is read only where dy16s[i] is NULL, or for a bias gradient). Each linear given a bf16 dy
 * must take one (tz_linear_takes_dy16); fatal otherwise. dy16s NULL: tz_linear_bwd_shared. */
void tz_linear_bwd_shared16(tz_backend *be, const tz_linear *const *ls, int count, float *dx,
                            const float *const *dys, const uint16_t *const *dy16s,
                            const float *x, const float *const *hs, float *scratch, int64_t n,
                            int dx_set);
/* tz_linear_fwd_shared in two steps, for running the linears on parts of their weights (the
 * same input, other rows of each weight: the Llama's MLP in chunks of the hidden size):
 * _prep rotates x (and rounds it, for the adapters) once into `room` (room_floats floats,
 * tz_linear_fwd_prep_floats at most; backend memory the caller keeps until the last _apply)
 * and writes each adapter's h = x A^T into hs[i]; _apply then makes the products, ys[i] =
 * x ls[i]^T (+ LoRA), for linears of the same input, rotation and adapters' ranks as _prep's
 * (rows of them: tz_linears whose w, b point into the whole's). The same bits as
 * tz_linear_fwd_shared. _prep returns 0 and does nothing where that path does not apply (not
 * TurboQuant weights of one rotation with bf16 GEMMs, adapters that do not fold into the
 * tile, a room too small, a probe set): then call tz_linear_fwd_shared for each part.
 * y16: a mask, bit i: ys[i] written as bf16 bit patterns [n, out] (tq_matmul_lora's c_bf16:
 * the fp32 result rounded by the GEMM, the bits to_bf16 makes of the fp32 ys on the
 * emulation), for outputs read only where they are rounded or widened exactly (SwiGLU's
 * TZ_SWIGLU_IN16, attention's bf16 v). */
int64_t tz_linear_fwd_prep_floats(const tz_linear *const *ls, int count, int64_t n);
int tz_linear_fwd_shared_prep(tz_backend *be, const tz_linear *const *ls, float *const *hs,
                              int count, const float *x, int64_t n, float *room,
                              int64_t room_floats);
void tz_linear_fwd_shared_apply(tz_backend *be, const tz_linear *const *ls, float *const *ys,
                                const float *const *hs, int count, int64_t n, float *room,
                                int y16);
/* tz_linear_bwd_shared16 for a dy in parts (the columns of each dy_i that rows of each weight
 * make: the Llama's MLP in chunks of the hidden size), every dy given in bf16 (dy16s), with
 * dx: call it for each part in turn with ls the rows of that part, the first with
 * TZ_LINEAR_PART_FIRST, the last with TZ_LINEAR_PART_LAST (both: the whole, as
 * tz_linear_bwd_shared16), and the same dx, x, hs, scratch, n and dx_set each time. The sum
 * dy W_rot and the adapters' kept dh add up part by part in the activation scratch (the parts
 * between leave it as they found it for the next: nothing else may use it between the calls);
 * the inverse rotation into dx, the A gradients and dx += dh A once, after the last. Equal to
 * the whole's to fp32 rounding (and the bf16 rounding of each part's dh where dh is not
 * kept). Fatal for weights other than TurboQuant of one rotation. */
#define TZ_LINEAR_PART_FIRST 1
#define TZ_LINEAR_PART_LAST 2
void tz_linear_bwd_shared_part(tz_backend *be, const tz_linear *const *ls, int count, float *dx,
                               const uint16_t *const *dy16s, const float *x,
                               const float *const *hs, float *scratch, int64_t n, int dx_set,
                               int part);
/* tz_linear_bwd_set with dy given already rounded to bf16 (dy16 [n, out], bit patterns, as the
 * op that makes dy wrote it; dy fp32 only for a bias gradient, else NULL): the same bits
 * without the rounding pass; fatal where l does not take one (tz_linear_takes_dy16). dy16
 * NULL: tz_linear_bwd_set. tz_linear_bwd_set_x16 takes a dy16 likewise (NULL: none). */
void tz_linear_bwd_set16(tz_backend *be, const tz_linear *l, float *dx, const float *dy,
                         const uint16_t *dy16, const float *x, const float *h, float *scratch,
                         int64_t n);
/* Whether l's backward reads its input x: for its weight's gradient, or its adapter's A
 * gradient (its dx goes through the weights, its B gradient through the adapter's hidden).
 * Where not, the backward takes x = NULL, and what makes x need not be made again for it. */
int tz_linear_bwd_reads_x(const tz_linear *l);
/* Whether l's backward on be can take its dy in bf16 alone: bf16 GEMM operands, and no bias
 * gradient (it sums the fp32 dy). */
int tz_linear_takes_dy16(const tz_backend *be, const tz_linear *l);
/* The accumulate argument for the elementwise backward op that writes l's dy (gate_bwd,
 * gelu_tanh_bwd): 2 (written in bf16) where l takes it so (tz_linear_takes_dy16), else 0
 * (written in fp32); give that dy to tz_linear_bwd_set16 (or _set_x16) as dy16 when 2. */
int tz_linear_dy_mode(const tz_backend *be, const tz_linear *l);
/* Whether l's backward can take its dy in bf16 with its bias gradient taken by the op that
 * made dy (gelu_tanh_bwd_bias: that op sums the fp32 dy it never stores): bf16 GEMM operands
 * and a bias whose gradient is wanted. Then tz_linear_bwd_set_db16: tz_linear_bwd_set with
 * dy16 [n, out] (bf16 bit patterns) and no bias gradient left to take; x fp32, or bf16 bit
 * patterns where x16. Fatal where the first says no. */
int tz_linear_takes_dy16_db(const tz_backend *be, const tz_linear *l);
void tz_linear_bwd_set_db16(tz_backend *be, const tz_linear *l, float *dx, const uint16_t *dy16,
                            const void *x, int x16, const float *h, float *scratch, int64_t n);
/* Floats of a model's activation scratch (tz_tq_scratch.act) that the `count` linears ls,
 * reading one input of n rows (through tz_linear_*_shared where count > 1), use on be, in the
 * forward and, where backward, the backward (gradients as the parameters' trainable flags
 * say): a TurboQuant weight's rotated input and dy W_rot; where be's GEMMs round to bf16, the
 * backward's copies of dy and x rounded once for the GEMMs that read them. A backward without
 * the room lets each GEMM round its operands (the same bits, more traffic). backward
 * TZ_LINEAR_BWD_DY16: the backward with every dy given in bf16 (tz_linear_bwd_shared16's
 * dy16s, tz_linear_bwd_set16's dy16), which then takes no room for rounding them. */
#define TZ_LINEAR_BWD_DY16 2
int64_t tz_linear_act_floats(const tz_backend *be, const tz_linear *const *ls, int count,
                             int64_t n, int backward);

/* Where be's GEMMs round to bf16, a TurboQuant linear's forward takes its LoRA path (rank r)
 * and its bias (bias: the model's linears have one) inside the base GEMM, along K
 * (tq_matmul_lora): the decode tile then holds [out, in + this many columns] (r + bias
 * rounded up to 8; 0 without folding), which the model plans. A tile without that room gets
 * the separate GEMMs and bias pass. */
int64_t tz_linear_fold_cols(const tz_backend *be, int64_t r, int bias);

/* A probe that sees the input x [n, in] (backend memory) of every adapted quantized layer's
 * forward (lora.init = "calibrated" gathers X^T X with it); NULL: none. One at a time, set
 * and cleared around the forward passes that calibrate. */
typedef void (*tz_linear_probe)(void *ctx, const tz_linear *l, const float *x, int64_t n);
void tz_linear_set_probe(tz_linear_probe fn, void *ctx);
/* Whether a probe is set: a model that would run a linear on part of its weight or input at
 * a time (the Llama's MLP in chunks of columns) runs it whole then, so the probe sees the
 * weight and the input it knows. */
int tz_linear_probing(void);
/* Whether a shared group's adapters add dh A into dx in one GEMM over their stacked A's (1),
 * or one GEMM each (0: the path of a scratch without room for the stack); -1: as
 * TZ_LORA_STACK says (the default: stacked unless it is 0). For tests. */
void tz_linear_set_stacking(int on);

#endif
