/* The TurboQuant rotation: unnormalised fast Walsh-Hadamard transform, the per-group random
 * signs (rule in tq_layout.h), and the row-wise rotation of activations and its transpose.
 * No quantization here, and no backend op: plain host memory, OpenMP over rows.
 *
 * For a row x of length cols, cut into groups x_j of g elements (j = 0 .. cols/g - 1), the
 * rotation is the orthogonal map R_j = H diag(s_j) / sqrt(g), H the unnormalised g x g
 * Hadamard matrix (H H = g I, H symmetric), s_j the group's signs (same for every row):
 *   rotate:      x_rot_j = R_j x_j     = H (s_j .* x_j) / sqrt(g)
 *   rotate_inv:  dx_j    = R_j^T dy_j  = s_j .* H (dy_j) / sqrt(g)   (also R_j^-1) */
#ifndef TZ_FWHT_H
#define TZ_FWHT_H
#include <stddef.h>
#include <stdint.h>

/* In place: x <- H x, g a power of two (1 <= g). Butterflies in the natural (Sylvester)
 * order: H[i][k] = (-1)^popcount(i & k). */
void tz_fwht(float *x, int64_t g);

/* s_j for group column j: out[i] = +1 or -1, i < g, g a multiple of 64 (tq_layout.h rule).
 * Depends only on (seed, group_index, i): deterministic, thread-safe. */
void tz_tq_signs(uint64_t seed, int64_t group_index, int64_t g, float *out);

/* The signs of every group of a row of cols elements, concatenated: out[j*g + i] = s_j[i]. */
void tz_tq_signs_row(uint64_t seed, int64_t cols, int64_t g, float *out);

/* 0 when g is 64, 128 or 256 and cols a positive multiple of g; -1 with a message. */
int tz_tq_check_shape(int64_t cols, int64_t g, char *err, size_t errlen);

/* y[r, :] = rotation of x[r, :] group by group, for rows r < rows; x and y are [rows, cols]
 * and may be the same buffer. signs: [cols] from tz_tq_signs_row. Writes y (no accumulate).
 * The shape must pass tz_tq_check_shape (fatal otherwise: the caller validated it). */
void tz_tq_rotate_signed(float *y, const float *x, int64_t rows, int64_t cols, int64_t g,
                         const float *signs);
/* dx[r, :] = transpose (= inverse) rotation of dy[r, :]; dx may be dy. Writes dx. */
void tz_tq_rotate_inv_signed(float *dx, const float *dy, int64_t rows, int64_t cols, int64_t g,
                             const float *signs);

/* The same, deriving the signs from the seed (one small allocation per call). */
void tz_tq_rotate(float *y, const float *x, int64_t rows, int64_t cols, int64_t g,
                  uint64_t seed);
void tz_tq_rotate_inv(float *dx, const float *dy, int64_t rows, int64_t cols, int64_t g,
                      uint64_t seed);

#endif
