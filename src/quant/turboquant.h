/* TurboQuant weight quantization on the CPU (the specification for CUDA): quantize a weight
 * matrix group by group, dequantize it in the plain or the rotated basis, and the absmax
 * round-to-nearest baseline. No file I/O, no linear-layer wiring, no backend op table.
 *
 * W is [rows, cols] = [out, in], row-major fp32; groups are g consecutive elements of a row
 * (g = 64, 128 or 256; cols % g == 0); group column j of every row uses the signs s_j and
 * the rotation R_j = H diag(s_j) / sqrt(g) of fwht.h. For one group w (length g):
 *
 *   r     = H (s_j .* w)                       (= sqrt(g) R_j w)
 *   z     = r / ||w||                          (coordinates ~ N(0,1); z = 0 when w = 0)
 *   idx_i = nearest centroid of z_i            (codebook.h, binary search on midpoints)
 *   scale = <r/sqrt(g), c[idx]> / <c[idx], c[idx]>, stored as bf16  (0 when w = 0)
 *   q     = scale * c[idx]                     (the code vector, approximates R_j w)
 *   w_hat = s_j .* H (q) / sqrt(g)             (= R_j^T q)
 *
 * Rotated basis. W_rot[r, j*g + i] = scale[r, j] * c[idx[r, j, i]] (= q, no other factor),
 * and with x_rot_j = R_j x_j = H (s_j .* x_j) / sqrt(g) (tz_tq_rotate) the identities
 *
 *   (W_hat x)[r] = sum_j <R_j^T q_rj, x_j> = sum_j <q_rj, R_j x_j> = (W_rot x_rot)[r]
 *   (W_hat^T dy)_j = R_j^T (W_rot^T dy)_j = s_j .* H ((W_rot^T dy)_j) / sqrt(g)
 *
 * hold exactly in real arithmetic (R_j orthogonal): the 1/sqrt(g) of r is absorbed by the
 * scale, the activation rotation carries its own. So y = x W_hat^T is computed as
 * tz_tq_rotate(x) times W_rot^T, and dx = dy W_hat as tz_tq_rotate_inv(dy W_rot).
 *
 * Non-finite weights give a NaN (or inf) scale for their group: visible, never hidden. */
#ifndef TZ_TURBOQUANT_H
#define TZ_TURBOQUANT_H
#include <stddef.h>
#include <stdint.h>

#include "quant/codebook.h"
#include "quant/tq_layout.h"

/* A quantized [rows, cols] tensor: codes packed per tq_layout.h (rows*cols*bits/8 bytes)
 * and one bf16 scale per group (rows * cols/group), both owned. The absmax baseline uses
 * the same struct (seed unused there). */
typedef struct tz_tq_tensor {
    int bits, group;
    int64_t rows, cols;
    uint64_t seed;
    uint8_t *codes;
    uint16_t *scales;
} tz_tq_tensor;

/* Validates the shape (bits 1..4, group 64/128/256, cols a positive multiple of group,
 * rows > 0) and allocates zeroed codes and scales. 0, or -1 with a message in err (and t
 * left empty, safe to free). */
int tz_tq_tensor_init(tz_tq_tensor *t, int bits, int group, int64_t rows, int64_t cols,
                      uint64_t seed, char *err, size_t errlen);
void tz_tq_tensor_free(tz_tq_tensor *t);
/* Fills the stored header of t (tq_layout.h). */
void tz_tq_tensor_header(const tz_tq_tensor *t, tz_tq_header *h);

/* Number of groups of t: rows * cols / group. */
static inline int64_t tz_tq_tensor_groups(const tz_tq_tensor *t) {
    return t->rows * (t->cols / t->group);
}

/* ---- TurboQuant ----
 * cb must be the codebook of t->bits (fatal otherwise). All are OpenMP over groups (rows of
 * groups in order), and the results do not depend on the number of threads. */

/* Quantizes all of w [rows, cols] into t. */
void tz_tq_quantize(tz_tq_tensor *t, const tz_tq_codebook *cb, const float *w);
/* Quantizes groups [first, first + count) of the row-major group order only (e.g. a rank's
 * owned slice); w is the whole tensor's base pointer, only those groups are read. */
void tz_tq_quantize_groups(tz_tq_tensor *t, const tz_tq_codebook *cb, const float *w,
                           int64_t first, int64_t count);
/* The one quantizer behind all of the above, on a range of groups held contiguously: `count`
 * groups of a weight with rows of `cols` elements (in groups of `group`), starting at group
 * `first` of the row-major group order (which fixes each group's signs). w points at the
 * first of them (count * group floats); codes receives count * TZ_TQ_GROUP_BYTES(group,
 * bits) bytes and scales count bf16 values: exactly the bytes the whole-tensor functions
 * write at those groups. method TZ_TQ_TURBOQUANT (cb of `bits` bits) or TZ_TQ_ABSMAX (cb
 * unused). Used where a rank re-quantizes the groups it owns from its fp32 master. */
void tz_tq_quantize_range(int method, const tz_tq_codebook *cb, int bits, int group,
                          int64_t cols, uint64_t seed, const float *w, int64_t first,
                          int64_t count, uint8_t *codes, uint16_t *scales);
/* The same with stochastic rounding when sr != 0 (TurboQuant only; absmax ignores it): the
 * group's scale as nearest rounding fits it, then each element one of the two centroids
 * around it with the probabilities that make its expected decoded value the input (in the
 * rotated basis, up to the bf16 scale), drawn from a hash of (sr, global group, element):
 * the same bytes on any thread count. Full fine-tuning re-quantizes with it where
 * quant.rounding = "stochastic" (a new sr each step). */
void tz_tq_quantize_range_sr(int method, const tz_tq_codebook *cb, int bits, int group,
                             int64_t cols, uint64_t seed, const float *w, int64_t first,
                             int64_t count, uint8_t *codes, uint16_t *scales, uint64_t sr);
/* w_hat [rows, cols] = the dequantized weight in the plain basis. */
void tz_tq_dequantize(const tz_tq_tensor *t, const tz_tq_codebook *cb, float *w_hat);
/* w_rot [rows, cols] = the weight in the rotated basis (see the identity above). */
void tz_tq_dequantize_rotated(const tz_tq_tensor *t, const tz_tq_codebook *cb, float *w_rot);

/* The inverse of tz_tq_quantize_range on the same range: count groups starting at `first`
 * (codes and scales point at the first group's), decoded in the plain basis into w_hat
 * (count * group floats), by either method; the same values tz_tq_dequantize(_as) gives. */
void tz_tq_dequantize_range(int method, const tz_tq_codebook *cb, int bits, int group,
                            int64_t cols, uint64_t seed, const uint8_t *codes,
                            const uint16_t *scales, int64_t first, int64_t count, float *w_hat);

/* ---- absmax round-to-nearest baseline ----
 * Kept only as the baseline that tests and docs compare TurboQuant against; not used by
 * training. Per group, no rotation: step = 2 * absmax / (2^b - 1) stored as bf16 (the
 * scale), levels (k - (2^b - 1)/2) * step for k < 2^b, code = nearest level to w under the
 * stored (rounded) step. Same storage as TurboQuant: packed codes + one bf16 per group. */
void tz_tq_absmax_quantize(tz_tq_tensor *t, const float *w);
void tz_tq_absmax_dequantize(const tz_tq_tensor *t, float *w_hat);

/* ---- by method (what models and files use) ---- */

/* The two quantizers a model or file can hold. Values are stored in files: append only. */
enum tz_tq_method { TZ_TQ_TURBOQUANT = 0, TZ_TQ_ABSMAX = 1 };
/* "turboquant" | "absmax" ("?" otherwise); parse: 0, or -1 for an unknown name. */
const char *tz_tq_method_name(int method);
int tz_tq_method_from_name(const char *name, int *method);

/* The group a weight with rows of `cols` elements is quantized with when `group` is asked
 * for: the largest of group, group/2, ..., 64 that divides cols; 0 when none does (then
 * the weight stays dense). group must be 64, 128 or 256 (0 is returned otherwise). */
int tz_tq_group_for(int64_t cols, int group);

/* levels[k], k < 2^bits: the value code k decodes to before the group's scale multiplies
 * it, so that w[i] = scale * levels[code_i] in the stored basis. TurboQuant: the codebook
 * centroids (cb, of `bits` bits), the rotated basis; absmax: k - (2^bits - 1)/2, the plain
 * basis (cb unused, may be NULL). Exactly what the quantize/dequantize functions use. */
void tz_tq_levels(int method, int bits, const tz_tq_codebook *cb, float *levels);

/* Quantize / dequantize (plain basis) with either method; cb as above. */
void tz_tq_quantize_as(tz_tq_tensor *t, int method, const tz_tq_codebook *cb, const float *w);
void tz_tq_dequantize_as(const tz_tq_tensor *t, int method, const tz_tq_codebook *cb,
                         float *w_hat);

/* ||w - w_hat||^2 / ||w||^2 over n elements, accumulated in double in fixed blocks (the
 * result does not depend on the number of threads). 0 when both are zero, INFINITY when
 * only w is. */
double tz_tq_relative_error(const float *w, const float *w_hat, int64_t n);

#endif
