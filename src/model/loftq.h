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

/* ---- lora.init = "calibrated": the adapter fitted in the norm of the layer's inputs ----
 * The base stays quantize(W) (as with the default init, so an adapter needs nothing else to
 * be used), and s B A is the rank-r fit of R = W - Q that is best for the outputs on inputs
 * X: min ||X (R - s B A)^T||_F = ||(R - s B A) L||_F with H = X^T X / rows + damp I = L L^T
 * (Cholesky, damp = TZ_CALIB_DAMP of H's mean diagonal): the truncated SVD of R L, then A
 * times L^{-1}. */
#define TZ_CALIB_DAMP 0.01

/* H = X^T X of each adapted quantized weight's input, gathered through tz_linear's probe. */
typedef struct tz_calib {
    tz_backend *be, *cpu;
    int n, cap;
    const tz_param **w; /* the weights seen, and per weight: */
    int *root;          /* the weight whose H it shares (weights fed the same input one after
                         * another, as q, k and v are: one Gram matrix, gathered once) */
    double **H;         /* [in, in], summed over rows (NULL where root is another) */
    int64_t *in, *rows;
    const float *last_x; /* the previous call's input, rows and weight */
    int64_t last_n;
    int last_k;
    float *x, *xtx;     /* host staging */
    size_t xcap;
} tz_calib;

/* Starts gathering (the probe set) for the forward passes that follow, on backend be. */
void tz_calib_begin(tz_calib *c, tz_backend *be, int threads);
/* Stops gathering (the probe cleared); c keeps what it gathered until tz_calib_free. */
void tz_calib_end(tz_calib *c);
void tz_calib_free(tz_calib *c);

/* One weight: a [r, in] and b [out, r] with s b a the rank-r fit of res [out, in] in the norm
 * of H [in, in] (the rows' mean X^T X, damped as above). err_plain and err_fit (may be NULL)
 * get tr(R H R^T) and tr(E H E^T), E = R - s b a: the outputs' squared error per row before
 * and after. */
void tz_calib_weight(tz_backend *cpu, const float *res, const double *H, int64_t m, int64_t n,
                     int64_t r, float s, tz_rng *rng, float *a, float *b, double *err_plain,
                     double *err_fit);

/* For every adapter of ps whose base weight is quantized and was seen by c: R = W - Q (W
 * through src, Q the stored codes decoded), tz_calib_weight with s = alpha / rank and the
 * stream tz_rng_make(seed, i, TZ_RNG_LORA, 0), A and B uploaded; the base is untouched.
 * Returns the totals, with ref = tr(W H W^T) and err_plain, err_loftq the two errors. */
tz_loftq_stats tz_calib_init_params(tz_params *ps, tz_backend *be, const tz_calib *c,
                                    double alpha, int64_t rank, uint64_t seed, int threads,
                                    tz_loftq_source src, void *ctx);

#endif
