/* LoftQ initialisation of LoRA adapters on a quantized base: the base becomes Q =
 * quantize(W - s B A) and the adapter (A, B) a rank-r factorisation of W - Q, so that
 * Q + s B A approximates the dense W better than Q alone (Li et al. 2023, "LoftQ"). Host
 * math on fp32 weights before they are stored; no file I/O (the caller supplies W). */
#ifndef TZ_LOFTQ_H
#define TZ_LOFTQ_H
#include <stdint.h>

#include "core/backend.h"
#include "core/rng.h"
#include "model/params.h"
#include "quant/turboquant.h"

/* Alternations of quantization and low-rank factorisation (LoftQ's T). The error
 * ||W - Q - s B A|| falls most in the first two and by a few per cent after (tests/unit/
 * test_loftq.c prints it per alternation); 5 is the LoftQ paper's largest setting. */
#define TZ_LOFTQ_ITERS 5
/* The randomized SVD (Halko, Martinsson, Tropp 2011) of each residual: rank r + OVERSAMPLE
 * Gaussian sketch, POWER power iterations (each orthonormalised), then an exact SVD (one-sided
 * Jacobi, in double) of the small projected matrix. */
#define TZ_LOFTQ_OVERSAMPLE 8
#define TZ_LOFTQ_POWER 3

/* Squared Frobenius norms over the weights a LoftQ init covered: ||W||^2, the plain
 * quantization's error ||W - quantize(W)||^2 and LoftQ's ||W - Q - s B A||^2. */
typedef struct tz_loftq_stats {
    int n;             /* weights initialised */
    double ref, err_plain, err_loftq;
} tz_loftq_stats;

/* One weight w [out, in] (host fp32, t->rows x t->cols): after `iters` alternations
 *     Q_k = quantize(w - s B_{k-1} A_{k-1})   (B_0 A_0 = 0),   s B_k A_k = SVD_r(w - Q_k)
 * t holds Q_iters (method TZ_TQ_TURBOQUANT with cb of t->bits bits, or TZ_TQ_ABSMAX, cb
 * unused), a [r, in] and b [out, r] the factors, the singular values split evenly between
 * them (B = U sqrt(S / s), A = sqrt(S / s) V^T). cpu: a CPU backend (its matmul; host
 * memory); rng: the stream of the Gaussian sketches. The result depends on w, the quantizer,
 * r, s, iters and the stream only: not on the number of threads, nor on the rank that
 * computes it (the CPU matmul adds in an order fixed by its blocking, not by threads). stats (may be NULL) gets this
 * weight's three norms added; err_iter (may be NULL) ||w - Q_k - s B_k A_k||^2 for k = 1 ..
 * iters. */
void tz_loftq_weight(tz_backend *cpu, int method, const tz_tq_codebook *cb, tz_tq_tensor *t,
                     const float *w, int64_t r, float s, int iters, tz_rng *rng, float *a,
                     float *b, tz_loftq_stats *stats, double *err_iter);

/* The dense weight of base parameter p: p->numel host floats into w (fatal on failure). */
typedef void (*tz_loftq_source)(void *ctx, const tz_param *p, float *w);

/* For every adapter of ps (PEFT names: base_model.model.X.lora_A.weight and .lora_B.weight
 * adapt X.weight) whose base weight is quantized: reads W through src, runs tz_loftq_weight
 * with s = alpha / rank, TZ_LOFTQ_ITERS alternations and the stream tz_rng_make(seed, i,
 * TZ_RNG_LORA, 0) of lora_A's index i, and uploads Q's codes and scales into the base weight
 * and A, B into the adapters. Adapters of dense weights are left as they are. threads: CPU
 * threads of the host matmuls (0: OpenMP default). Returns the totals. */
tz_loftq_stats tz_loftq_init_params(tz_params *ps, tz_backend *be, double alpha, int64_t rank,
                                    uint64_t seed, int threads, tz_loftq_source src, void *ctx);

#endif
