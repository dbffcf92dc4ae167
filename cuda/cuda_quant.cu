/* CUDA ops of quantized weights: per-group rotation of activation rows (forward and inverse,
 * accumulating) and decoding packed codes into a dense tile (cpu/cpu_quant.c's twins; the
 * layout is quant/tq_layout.h's, shared with the host). */
#include <cuda_bf16.h>
#include <math.h>
#include <string.h>

#include "cuda/cuda_internal.cuh"
extern "C" {
#include "quant/fwht.h"
}
#include "quant/tq_layout.h"

static void check_rows(int64_t rows, int64_t cols, int group, const char *op) {
    char err[200];
    if (rows < 0 || tz_tq_check_shape(cols, group, err, sizeof err))
        TZ_FATAL("%s: rows %lld: %s", op, (long long)rows, err);
}

/* The signs of one row, [cols] on the device, made on the host by the rule of tq_layout.h on
 * first use of (seed, cols, group) and kept (tz_cuda_sign_cache). */
static const float *row_signs(tz_backend *be, int64_t rows, int64_t cols, int group,
                              uint64_t seed, const char *op) {
    check_rows(rows, cols, group, op);
    tz_cuda_ctx *c = tz_cuda_ctx_of(be);
    tz_cuda_sign_cache *sc = &c->signs;
    for (int i = 0; i < sc->n; i++)
        if (sc->e[i].seed == seed && sc->e[i].cols == cols && sc->e[i].group == group)
            return sc->e[i].s;
    if (sc->n == sc->cap) {
        sc->cap = sc->cap ? 2 * sc->cap : 8;
        sc->e = (tz_cuda_sign_entry *)tz_xrealloc(sc->e, (size_t)sc->cap * sizeof *sc->e);
    }
    size_t bytes = (size_t)cols * sizeof(float);
    float *h = (float *)tz_xmalloc(bytes);
    tz_tq_signs_row(seed, cols, group, h);
    tz_cuda_sign_entry *e = &sc->e[sc->n];
    CUDA_CHECK(cudaMalloc((void **)&e->s, bytes));
    CUDA_CHECK(cudaMemcpyAsync(e->s, h, bytes, cudaMemcpyHostToDevice, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    free(h);
    e->seed = seed, e->cols = cols, e->group = group;
    sc->n++;
    return e->s;
}

/* The rotation: a thread holds 8 consecutive elements of a row in registers, so a group of g
 * is g/8 consecutive lanes of a warp (8, 16 or 32; a warp holds 256 / g whole groups). The
 * Walsh-Hadamard butterflies run level by level, h = 1, 2, 4 within the thread's registers,
 * then h = 8 .. g/2 between lanes (__shfl_xor_sync on lane bit h/8: the lower lane keeps
 * a + b, the upper a - b): the same additions on the same values as tz_fwht, so the same bits.
 * No shared memory, no barriers, no division: a block of ROT_THREADS covers ROT_SPAN
 * columns of one row (grid.x: spans of a row, grid.y: rows); a row's last span may hold fewer
 * groups, and the lanes past the row's end (whole groups of them, cols being a multiple of g)
 * take part in the shuffles on zeros and store nothing. Row offsets are int64, the rest int. */
#define ROT_THREADS 128
#define ROT_SPAN (ROT_THREADS * 8)

/* 8 floats at p: two 16-byte accesses when VEC (p 16-byte aligned), else one at a time. */
template <bool VEC> static __device__ __forceinline__ void load8(float *v, const float *p) {
    if (VEC) {
        const float4 a = reinterpret_cast<const float4 *>(p)[0];
        const float4 b = reinterpret_cast<const float4 *>(p)[1];
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
        v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = p[i];
    }
}
template <bool VEC> static __device__ __forceinline__ void store8(float *p, const float *v) {
    if (VEC) {
        float4 a, b;
        a.x = v[0], a.y = v[1], a.z = v[2], a.w = v[3];
        b.x = v[4], b.y = v[5], b.z = v[6], b.w = v[7];
        reinterpret_cast<float4 *>(p)[0] = a;
        reinterpret_cast<float4 *>(p)[1] = b;
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) p[i] = v[i];
    }
}

/* Two floats as one word of two bf16 (nearest even: the lower address from lo). */
static __device__ __forceinline__ unsigned bf16x2_bits(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    unsigned u;
    memcpy(&u, &h, sizeof u);
    return u;
}

/* 8 floats rounded to bf16 at p: one 16-byte store when VEC (p 16-byte aligned). */
template <bool VEC> static __device__ __forceinline__ void store8(uint16_t *p, const float *v) {
    if (VEC) {
        uint4 u;
        u.x = bf16x2_bits(v[0], v[1]), u.y = bf16x2_bits(v[2], v[3]);
        u.z = bf16x2_bits(v[4], v[5]), u.w = bf16x2_bits(v[6], v[7]);
        reinterpret_cast<uint4 *>(p)[0] = u;
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) p[i] = tz_bf16_bits(v[i]);
    }
}

/* What k_rotate rotates, 8 elements from element i of its [rows, cols] input: an fp32 x as
 * stored, or SwiGLU's output made from g and u in bf16 (swiglu_rot16_at: s = silu(g) u as
 * swiglu_fwd makes it, tz_silu_mul, never stored in fp32). */
struct rot_in_f32 {
    const float *x;
    template <bool VEC> __device__ __forceinline__ void load(float *v, int64_t i) const {
        load8<VEC>(v, x + i);
    }
};
struct rot_in_swiglu {
    const uint16_t *g, *u;
    template <bool VEC> __device__ __forceinline__ void load(float *v, int64_t i) const {
        uint16_t a[8], b[8];
        if (VEC) {
            const uint4 ga = reinterpret_cast<const uint4 *>(g + i)[0];
            const uint4 ub = reinterpret_cast<const uint4 *>(u + i)[0];
            memcpy(a, &ga, sizeof a), memcpy(b, &ub, sizeof b);
        } else {
#pragma unroll
            for (int k = 0; k < 8; k++) a[k] = g[i + k], b[k] = u[i + k];
        }
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = tz_silu_mul(tz_get(a + k), tz_get(b + k));
    }
};

/* inverse = 0: y = (H (s*x)) * inv, written (as fp32, or rounded to bf16 where O is
 * uint16_t) at row stride ldo, and x itself rounded to bf16 into xc [rows, cols] where xc is
 * not NULL; inverse = 1 (O float only): dx += (H dy) * (s * inv); inverse = 2: dx = (H dy) *
 * (s * inv), dx not read. x as `in` loads it (I: rot_in_f32, rot_in_swiglu).
 * lanes = g / 8. VEC: in, out's rows, xc (and signs, from cudaMalloc) 16-byte aligned. */
template <bool VEC, class O, class I>
static __global__ void k_rotate(O *out, I in, const float *signs, int cols, int64_t ldo,
                                int lanes, float inv, int inverse, uint16_t *xc) {
    const int c = (blockIdx.x * ROT_THREADS + threadIdx.x) * 8, lane = threadIdx.x & 31;
    const bool live = c < cols;
    const int64_t row = (int64_t)blockIdx.y * cols;
    float v[8], s[8];
    if (live) {
        in.template load<VEC>(v, row + c);
        load8<true>(s, signs + c);
        if (xc) store8<VEC>(xc + row + c, v);
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = s[i] = 0.0f;
    }
    if (!inverse) {
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = s[i] * v[i];
    }
#pragma unroll
    for (int h = 1; h < 8; h *= 2) /* within the thread */
#pragma unroll
        for (int i = 0; i < 8; i++)
            if (!(i & h)) {
                const float a = v[i], b = v[i + h];
                v[i] = a + b;
                v[i + h] = a - b;
            }
    for (int m = 1; m < lanes; m *= 2) /* between lanes: h = 8 m */
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const float o = __shfl_xor_sync(0xffffffffu, v[i], m);
            v[i] = (lane & m) ? o - v[i] : v[i] + o;
        }
    if (!live) return;
    O *orow = out + (int64_t)blockIdx.y * ldo + c;
    if (inverse) {
        float d[8], *fo = reinterpret_cast<float *>(orow); /* O is float here */
        if (inverse == 1) load8<VEC>(d, fo);
        else
#pragma unroll
            for (int i = 0; i < 8; i++) d[i] = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) d[i] += v[i] * (s[i] * inv);
        store8<VEC>(fo, d);
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] *= inv;
        store8<VEC>(orow, v);
    }
}

/* wcols > 0: in's rows are columns [c0, c0 + cols) of rows of wcols (tq_rotate16_at's and
 * tq_rotate_bwd_at's window): the signs from c0 of the whole row's (one cache entry). */
/* (the base address of what in reads, for the alignment test) */
static uintptr_t rot_in_bits(const rot_in_f32 &in) { return (uintptr_t)in.x; }
static uintptr_t rot_in_bits(const rot_in_swiglu &in) { return (uintptr_t)in.g | (uintptr_t)in.u; }
static rot_in_f32 rot_in_rows(const rot_in_f32 &in, int64_t off) { return rot_in_f32{in.x + off}; }
static rot_in_swiglu rot_in_rows(const rot_in_swiglu &in, int64_t off) {
    return rot_in_swiglu{in.g + off, in.u + off};
}

template <class O, class I>
static void rotate_in(tz_backend *be, O *out, I in, int64_t rows, int64_t cols, int64_t ldo,
                      int group, uint64_t seed, int inverse, const char *op, uint16_t *xc,
                      int64_t c0, int64_t wcols) {
    if (wcols > 0) {
        check_rows(rows, cols, group, op);
        if (c0 < 0 || c0 % group || c0 + cols > wcols)
            TZ_FATAL("%s: columns [%lld, %lld) are not whole groups of %d inside a row of %lld",
                     op, (long long)c0, (long long)(c0 + cols), group, (long long)wcols);
    }
    const float *s = row_signs(be, rows, wcols > 0 ? wcols : cols, group, seed, op) + c0;
    if (rows <= 0) return;
    if (cols > INT32_MAX - ROT_SPAN)
        TZ_FATAL("%s: rows of %lld columns exceed the kernel's int indices", op, (long long)cols);
    if (rows > 65535) { /* grid.y limit: in slices of rows */
        for (int64_t r0 = 0; r0 < rows; r0 += 65535) {
            int64_t n = rows - r0 < 65535 ? rows - r0 : 65535;
            rotate_in(be, out + r0 * ldo, rot_in_rows(in, r0 * cols), n, cols, ldo, group, seed,
                      inverse, op, xc ? xc + r0 * cols : NULL, c0, wcols);
        }
        return;
    }
    const float inv = (float)(1.0 / sqrt((double)group));
    const int c = (int)cols, lanes = group / 8;
    dim3 grid((unsigned)((cols + ROT_SPAN - 1) / ROT_SPAN), (unsigned)rows);
    cudaStream_t st = tz_cuda_stream(be);
    if (!(((uintptr_t)out | rot_in_bits(in) | (uintptr_t)xc |
           (uintptr_t)(ldo * (int64_t)sizeof(O))) &
          15))
        k_rotate<true, O, I><<<grid, ROT_THREADS, 0, st>>>(out, in, s, c, ldo, lanes, inv,
                                                           inverse, xc);
    else
        k_rotate<false, O, I><<<grid, ROT_THREADS, 0, st>>>(out, in, s, c, ldo, lanes, inv,
                                                            inverse, xc);
    CUDA_LAUNCHED();
}
template <class O>
static void rotate(tz_backend *be, O *out, const float *in, int64_t rows, int64_t cols,
                   int64_t ldo, int group, uint64_t seed, int inverse, const char *op,
                   uint16_t *xc = NULL, int64_t c0 = 0, int64_t wcols = 0) {
    rotate_in(be, out, rot_in_f32{in}, rows, cols, ldo, group, seed, inverse, op, xc, c0, wcols);
}

static void cuda_tq_rotate(tz_backend *be, float *y, const float *x, int64_t rows, int64_t cols,
                           int group, uint64_t seed) {
    rotate(be, y, x, rows, cols, cols, group, seed, 0, "tq_rotate");
}

static void cuda_tq_rotate16(tz_backend *be, uint16_t *y, const float *x, int64_t rows,
                             int64_t cols, int64_t ldy, int group, uint64_t seed, uint16_t *xc) {
    if (ldy < cols) TZ_FATAL("tq_rotate16: row stride %lld below %lld columns", (long long)ldy,
                             (long long)cols);
    rotate(be, y, x, rows, cols, ldy, group, seed, 0, "tq_rotate16", xc);
}

static void cuda_tq_rotate_bwd(tz_backend *be, float *dx, const float *dy, int64_t rows,
                               int64_t cols, int group, uint64_t seed, int accumulate) {
    rotate(be, dx, dy, rows, cols, cols, group, seed, accumulate ? 1 : 2, "tq_rotate_bwd");
}

static void cuda_tq_rotate16_at(tz_backend *be, uint16_t *y, const float *x, int64_t rows,
                                int64_t cols, int64_t ldy, int group, uint64_t seed, int64_t c0,
                                int64_t wcols, uint16_t *xc) {
    if (ldy < cols) TZ_FATAL("tq_rotate16_at: row stride %lld below %lld columns",
                             (long long)ldy, (long long)cols);
    rotate(be, y, x, rows, cols, ldy, group, seed, 0, "tq_rotate16_at", xc, c0, wcols);
}

static void cuda_swiglu_rot16_at(tz_backend *be, uint16_t *y, const uint16_t *g,
                                 const uint16_t *u, int64_t rows, int64_t cols, int64_t ldy,
                                 int group, uint64_t seed, int64_t c0, int64_t wcols,
                                 uint16_t *sc) {
    if (ldy < cols) TZ_FATAL("swiglu_rot16_at: row stride %lld below %lld columns",
                             (long long)ldy, (long long)cols);
    rotate_in(be, y, rot_in_swiglu{g, u}, rows, cols, ldy, group, seed, 0, "swiglu_rot16_at", sc,
              c0, wcols);
}

static void cuda_tq_rotate_bwd_at(tz_backend *be, float *dx, const float *dy, int64_t rows,
                                  int64_t cols, int group, uint64_t seed, int accumulate,
                                  int64_t c0, int64_t wcols) {
    rotate(be, dx, dy, rows, cols, cols, group, seed, accumulate ? 1 : 2, "tq_rotate_bwd_at",
           (uint16_t *)NULL, c0, wcols);
}

/* The decode: a thread decodes octets, 8 consecutive weights of one group (g is a multiple of
 * 8, so an octet never straddles groups), whose codes are the `bits` bytes at octet * bits (the
 * layout's bit stream puts code j of the octet in bits [j*bits, j*bits + bits) of their
 * little-endian word). Per octet: one code load (a 1-, 2- or 4-byte word; 3 bytes at 3 bits),
 * one 2-byte scale load (the g/8 lanes of a group read the same address), 8 shift-and-mask
 * code extractions into the codebook held in shared memory (2^bits floats, distinct banks,
 * so no conflicts), 8 products scale * level (the CPU's one rounding, so the same bits), and
 * one 16-byte store of 8 bf16 (pairs packed by one conversion each) or two of 8 fp32. A block
 * of DQ_THREADS handles DQ_OCTETS consecutive octets, two per thread (both loads issued
 * before either decode), one block-wide step; octet indices are int within a launch, the
 * host cuts larger tensors into launches of at most DQ_LAUNCH_OCTETS with int64 base offsets.
 * wide: codes 4-byte and w 16-byte aligned (the word loads and the 16-byte stores); otherwise
 * byte loads and element stores, the same values. */
#define DQ_THREADS 256
#define DQ_PER_THREAD 2
#define DQ_OCTETS (DQ_THREADS * DQ_PER_THREAD)
#define DQ_LAUNCH_OCTETS ((int64_t)1 << 28) /* a multiple of DQ_OCTETS and of g/8 */

/* The bits*8 code bits of octet o, as a little-endian word. */
template <int BITS>
static __device__ __forceinline__ unsigned octet_codes(const uint8_t *codes, int o, int wide) {
    const uint8_t *p = codes + (size_t)o * BITS;
    if (wide && BITS == 4) return reinterpret_cast<const uint32_t *>(codes)[o];
    if (wide && BITS == 2) return reinterpret_cast<const uint16_t *>(codes)[o];
    unsigned c = 0;
#pragma unroll
    for (int b = 0; b < BITS; b++) c |= (unsigned)p[b] << (8 * b);
    return c;
}


/* The 8 decoded weights of an octet into w at element e. */
static __device__ __forceinline__ void store_octet(float *w, size_t e, const float *v, int wide) {
    float *p = w + e;
    if (wide) store8<true>(p, v);
    else store8<false>(p, v);
}
static __device__ __forceinline__ void store_octet(__nv_bfloat16 *w, size_t e, const float *v,
                                                   int wide) {
    uint16_t *p = reinterpret_cast<uint16_t *>(w) + e;
    if (wide) store8<true>(p, v);
    else store8<false>(p, v);
}

/* Which part of W [rows, cols] a decode writes, and where: rows [r0, r0 + nr) by columns
 * [c0, c0 + nc) (multiples of the group) into w at row stride ld elements, on stream st. */
struct dq_part {
    int64_t r0, nr, c0, nc, ld;
    cudaStream_t st;
};

/* n octets; octet o's scale is scales[o >> gshift] (gshift = log2(g / 8)). ld = 0: octet o
 * at w + 8 o (W whole, codes and scales at the launch's first octet); else octet o of the
 * part (obase the launch's first, ncpr octets a row of the part) is the tensor's octet
 * (r0 + row) cpr + c0 + j, at w + row ld + 8 j. */
template <int BITS, class T>
static __global__ void k_dequant(T *w, const uint8_t *codes, const uint16_t *scales,
                                 const float *levels, int gshift, int n, int wide, int64_t ld,
                                 int ncpr, int cpr, int64_t r0, int c0, int64_t obase) {
    __shared__ float lv[1 << BITS];
    if (threadIdx.x < (1u << BITS)) lv[threadIdx.x] = levels[threadIdx.x];
    __syncthreads();
    const int o0 = blockIdx.x * DQ_OCTETS + threadIdx.x;
    unsigned c[DQ_PER_THREAD];
    float sc[DQ_PER_THREAD];
    int64_t dst[DQ_PER_THREAD];
#pragma unroll
    for (int u = 0; u < DQ_PER_THREAD; u++) {
        const int o = o0 + u * DQ_THREADS;
        c[u] = 0, sc[u] = 0.0f, dst[u] = 0;
        if (o < n) {
            int64_t src = o;
            dst[u] = (int64_t)o * 8;
            if (ld) {
                const int64_t og = obase + o, row = og / ncpr, j = og - row * ncpr;
                src = (r0 + row) * cpr + c0 + j;
                dst[u] = row * ld + j * 8;
            }
            c[u] = octet_codes<BITS>(codes + src * BITS, 0, wide);
            sc[u] = __uint_as_float((unsigned)scales[src >> gshift] << 16); /* bf16 -> fp32 */
        }
    }
#pragma unroll
    for (int u = 0; u < DQ_PER_THREAD; u++) {
        const int o = o0 + u * DQ_THREADS;
        if (o >= n) break;
        float v[8];
#pragma unroll
        for (int j = 0; j < 8; j++) v[j] = sc[u] * lv[(c[u] >> (BITS * j)) & ((1u << BITS) - 1u)];
        store_octet(w, (size_t)dst[u], v, wide);
    }
}

template <int BITS, class T>
static void dequant_bits(T *w, const uint8_t *codes, const uint16_t *scales, const float *levels,
                         int64_t cols, int group, const dq_part &pt) {
    const int gshift = group == 64 ? 3 : group == 128 ? 4 : 5; /* checked: 64, 128 or 256 */
    const int whole = pt.c0 == 0 && pt.nc == cols && pt.ld == cols && pt.r0 == 0;
    const int64_t ld = whole ? 0 : pt.ld, n_oct = pt.nr * (pt.nc / 8);
    const int wide = !((uintptr_t)codes & 3) && !((uintptr_t)w & 15) &&
                     !((ld * (int64_t)sizeof(T)) & 15);
    for (int64_t o0 = 0; o0 < n_oct; o0 += DQ_LAUNCH_OCTETS) {
        const int n = (int)(n_oct - o0 < DQ_LAUNCH_OCTETS ? n_oct - o0 : DQ_LAUNCH_OCTETS);
        k_dequant<BITS, T><<<(unsigned)((n + DQ_OCTETS - 1) / DQ_OCTETS), DQ_THREADS, 0, pt.st>>>(
            ld ? w : w + o0 * 8, ld ? codes : codes + o0 * BITS,
            ld ? scales : scales + (o0 >> gshift), levels, gshift, n, wide, ld,
            (int)(pt.nc / 8), (int)(cols / 8), pt.r0, (int)(pt.c0 / 8), o0);
        CUDA_LAUNCHED();
    }
}

/* The decode of a part of W [rows, cols] into w (dq_part; whole: {0, rows, 0, cols, cols,
 * the compute stream}). */
template <class T>
static void dequant_part(tz_backend *be, T *w, const uint8_t *codes, const uint16_t *scales,
                         const float *levels, int64_t rows, int64_t cols, int bits, int group,
                         const char *op, const dq_part &pt) {
    check_rows(rows, cols, group, op);
    if (bits < 1 || bits > TZ_TQ_MAX_BITS) TZ_FATAL("%s: bits %d out of range", op, bits);
    if (pt.nr <= 0 || pt.nc <= 0) return;
    if (cols / 8 > INT32_MAX || pt.r0 + pt.nr > rows || pt.c0 + pt.nc > cols || pt.ld < pt.nc ||
        pt.c0 % group || pt.nc % group)
        TZ_FATAL("%s: rows %lld + %lld, columns %lld + %lld at stride %lld: not a part of %lld x "
                 "%lld in groups of %d", op, (long long)pt.r0, (long long)pt.nr,
                 (long long)pt.c0, (long long)pt.nc, (long long)pt.ld, (long long)rows,
                 (long long)cols, group);
    /* codes may be streamed in; the emulation checks the read against the stream */
    CUDA_CHECK(tz_cuda_kernel_reads(pt.st, codes, (size_t)(rows * (cols / 8) * bits), op));
    CUDA_CHECK(tz_cuda_kernel_writes(pt.st, w,
                                     (size_t)((pt.nr - 1) * pt.ld + pt.nc) * sizeof(T), op));
    (void)be;
    switch (bits) {
    case 1: dequant_bits<1>(w, codes, scales, levels, cols, group, pt); break;
    case 2: dequant_bits<2>(w, codes, scales, levels, cols, group, pt); break;
    case 3: dequant_bits<3>(w, codes, scales, levels, cols, group, pt); break;
    default: dequant_bits<4>(w, codes, scales, levels, cols, group, pt); break;
    }
}

template <class T>
static void dequant(tz_backend *be, T *w, const uint8_t *codes, const uint16_t *scales,
                    const float *levels, int64_t rows, int64_t cols, int bits, int group,
                    const char *op) {
    const dq_part pt = {0, rows, 0, cols, cols, tz_cuda_stream(be)};
    dequant_part(be, w, codes, scales, levels, rows, cols, bits, group, op, pt);
}

static void cuda_tq_dequant(tz_backend *be, float *w, const uint8_t *codes,
                            const uint16_t *scales, const float *levels, int64_t rows,
                            int64_t cols, int bits, int group) {
    dequant(be, w, codes, scales, levels, rows, cols, bits, group, "tq_dequant");
}

/* tz_cuda_lora_cols (cuda_internal.cuh): the columns a LoRA path and a bias add to a product
 * along K (src NULL: r is 0). */
static __global__ void k_lora_cols(uint16_t *dst, int64_t ld, int64_t cols, const float *src,
                                   int64_t r, float s, int nb, const float *bias, int64_t rows) {
    const int64_t w = ld - cols;
    TZ_CUDA_FOR(i, rows * w) {
        const int64_t row = i / w, j = i - row * w;
        dst[row * ld + cols + j] = j < r          ? tz_bf16_bits(s * src[row * r + j])
                                   : j == r && nb ? tz_bf16_bits(bias ? bias[row] : 1.0f)
                                                  : (uint16_t)0;
    }
}
void tz_cuda_lora_cols(cudaStream_t st, uint16_t *dst, int64_t ld, int64_t cols,
                       const float *src, int64_t r, float s, int nb, const float *bias,
                       int64_t rows) {
    const int64_t n = rows * (ld - cols);
    if (n <= 0) return;
    if (r) CUDA_CHECK(tz_cuda_kernel_reads(st, src, (size_t)(rows * r) * 4, "lora columns"));
    if (bias) CUDA_CHECK(tz_cuda_kernel_reads(st, bias, (size_t)rows * 4, "bias column"));
    CUDA_CHECK(tz_cuda_kernel_writes(st, dst + cols, (size_t)((rows - 1) * ld + ld - cols) * 2,
                                     "lora columns"));
    k_lora_cols<<<tz_cuda_blocks(n, TZ_CUDA_THREADS), TZ_CUDA_THREADS, 0, st>>>(
        dst, ld, cols, src, r, s, nb, bias, rows);
    CUDA_LAUNCHED();
}

/* ---- the decode in chunks, on a side stream (tz_backend.tq_chunks, bf16 GEMMs) ----
 * W is decoded a chunk at a time (the forward: rows; the backward: columns, whole groups) into
 * one of two buffers of the tile on ctx->dec_stream, while the compute stream's GEMM reads the
 * other. Chunk i's decode waits for the GEMM of chunk i - 2, its buffer's last reader
 * (dec_free); the GEMM of chunk i for its decode (dec_ready). First the decode stream waits
 * for the compute stream's point at the call (dec_start), so that all before it (codes
 * streamed in, LoRA's B uploaded, the last call's GEMMs on the buffers) comes first. The
 * compute stream has waited for every decode by the op's end. TZ_TQ_DECODE_STREAM=0: the same
 * chunks in turn on the compute stream (for measuring what the overlap gives). */
static int decode_side(void) {
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("TZ_TQ_DECODE_STREAM");
        on = !(e && !strcmp(e, "0"));
    }
    return on;
}

struct dec_chunks {
    tz_cuda_ctx *c;
    int side;
    cudaStream_t st; /* where the decodes go */
    /* several: more than one chunk (one has nothing to overlap: the compute stream) */
    dec_chunks(tz_backend *be, int several) : c(tz_cuda_ctx_of(be)), side(several && decode_side()) {
        st = side ? c->dec_stream : c->stream;
        if (!side) return;
        CUDA_CHECK(cudaEventRecord(c->dec_start, c->stream));
        CUDA_CHECK(cudaStreamWaitEvent(c->dec_stream, c->dec_start, 0));
    }
    void before_decode(int64_t i) {
        if (side && i >= 2) CUDA_CHECK(cudaStreamWaitEvent(c->dec_stream, c->dec_free[i & 1], 0));
    }
    void decoded(int64_t i) {
        if (!side) return;
        CUDA_CHECK(cudaEventRecord(c->dec_ready[i & 1], c->dec_stream));
        CUDA_CHECK(cudaStreamWaitEvent(c->stream, c->dec_ready[i & 1], 0));
    }
    void used(int64_t i) {
        if (side) CUDA_CHECK(cudaEventRecord(c->dec_free[i & 1], c->stream));
    }
};

/* The product a chunk of W at a time. transW = 1: C[M, rows] (row stride rows) = alpha A W^T
 * + beta C, A bf16 [M, ld]: W's rows a chunk at a time, each decoded at row stride ld with
 * LoRA's columns after cols (s B's rows of the chunk; zeros without B). transW = 0: C[M, cols]
 * (row stride cols) = alpha A W + beta C, A bf16 [M, rows]: W's columns, whole groups a chunk
 * at a time, each decoded into a [rows, chunk] buffer. Each chunk's GEMM writes its own
 * columns of C (c_bf16, transW = 1 only: in bf16, C then [M, rows] bf16 elements). */
static void tq_chunks(tz_backend *be, float *C, const uint16_t *A, uint16_t *tile,
                      const uint8_t *codes, const uint16_t *scales, const float *levels,
                      int64_t rows, int64_t cols, int64_t ld, const float *B, int64_t r, float s,
                      const float *bias, int bits, int group, int64_t M, int transW, float alpha,
                      float beta, const char *op, int c_bf16) {
    const int64_t total = transW ? rows : cols;
    const int64_t step = transW ? tz_tq_chunk_rows(be, rows) : tz_tq_chunk_cols(be, cols, group);
    const int64_t buf_elems = transW ? step * ld : rows * step;
    dec_chunks ch(be, step < total);
    for (int64_t k0 = 0, i = 0; k0 < total; k0 += step, i++) {
        const int64_t nk = total - k0 < step ? total - k0 : step;
        uint16_t *buf = tile + (i & 1) * buf_elems;
        ch.before_decode(i);
        const dq_part pt = transW ? dq_part{k0, nk, 0, cols, ld, ch.st}
                                  : dq_part{0, rows, k0, nk, nk, ch.st};
        dequant_part(be, reinterpret_cast<__nv_bfloat16 *>(buf), codes, scales, levels, rows, cols,
                     bits, group, op, pt);
        if (transW)
            tz_cuda_lora_cols(ch.st, buf, ld, cols, B ? B + k0 * r : NULL, B ? r : 0, s,
                              bias != NULL, bias ? bias + k0 : NULL, nk);
        ch.decoded(i);
        if (transW && c_bf16)
            tz_cuda_gemm16_ld_c16(be, reinterpret_cast<uint16_t *>(C) + k0, rows, A, ld, buf, ld,
                                  1, M, nk, ld, alpha, beta);
        else if (transW)
            tz_cuda_gemm16_ld(be, C + k0, rows, A, ld, buf, ld, 1, M, nk, ld, alpha, beta);
        else tz_cuda_gemm16_ld(be, C + k0, cols, A, rows, buf, nk, 0, M, nk, rows, alpha, beta);
        ch.used(i);
    }
}

/* With bf16 GEMMs the weight is decoded straight into bf16 (the tile holds bf16 elements):
 * the same bits matmul would make by rounding the fp32 tile, one pass fewer and no fp32
 * copy; where the backend decodes in chunks (tq_chunks), a chunk at a time, overlapping the
 * GEMMs (above). */
static void cuda_tq_matmul(tz_backend *be, float *C, const void *A, int a_bf16, float *tile,
                           const uint8_t *codes, const uint16_t *scales, const float *levels,
                           int64_t rows, int64_t cols, int bits, int group, int64_t M,
                           int transW, float alpha, float beta) {
    const int64_t N = transW ? rows : cols, K = transW ? cols : rows;
    const int work = M > 0 && rows > 0 && alpha != 0.0f;
    if (work) check_rows(rows, cols, group, "tq_matmul");
    /* on at most 64 rows: one kernel, no tile */
    if (work && tz_cuda_narrow_tq(be, C, 0, A, a_bf16, codes, scales, levels, rows, cols, cols,
                                  bits, group, NULL, 0, 0.0f, NULL, M, transW, alpha, beta))
        return;
    if (work && tz_tq_chunked(be)) {
        const uint16_t *a16 = a_bf16 ? (const uint16_t *)A : tz_cuda_gemm_round(be, (const float *)A, M * K);
        uint16_t *t16 = reinterpret_cast<uint16_t *>(tile);
        tq_chunks(be, C, a16, t16, codes, scales, levels, rows, cols, cols, NULL, 0, 0.0f, NULL,
                  bits, group, M, transW, alpha, beta, "tq_matmul", 0);
    } else if (be->matmul_dtype == TZ_DT_BF16) {
        __nv_bfloat16 *w16 = (__nv_bfloat16 *)tile;
        dequant(be, w16, codes, scales, levels, rows, cols, bits, group, "tq_matmul");
        tz_cuda_gemm(be, C, A, a_bf16, w16, 1, M, N, K, 0, transW, alpha, beta);
    } else {
        dequant(be, tile, codes, scales, levels, rows, cols, bits, group, "tq_matmul");
        be->matmul16(be, C, A, a_bf16, tile, 0, M, N, K, 0, transW, alpha, beta);
    }
}

/* The weight decoded into bf16 at row stride ld, B's columns after it, A's h after its rotated
 * input, then one GEMM over cols + (ld - cols) (docs/design/cuda.md, "LoRA folded into the
 * base GEMM"); in chunks of W's rows where the backend decodes in chunks, else in one. */
static void cuda_tq_matmul_lora(tz_backend *be, float *C, uint16_t *A, int64_t ld,
                                const float *h, const float *B, int64_t r, float s, float *tile,
                                const uint8_t *codes, const uint16_t *scales,
                                const float *levels, int64_t rows, int64_t cols, int bits,
                                int group, int64_t M, const float *bias, int c_bf16) {
    if (be->matmul_dtype != TZ_DT_BF16) TZ_FATAL("tq_matmul_lora: for bf16 GEMMs only");
    const int nb = bias != NULL;
    if (ld < cols + r + nb || ld % 8)
        TZ_FATAL("tq_matmul_lora: row stride %lld is not a multiple of 8 of at least %lld + %lld",
                 (long long)ld, (long long)cols, (long long)(r + nb));
    if (M <= 0 || rows <= 0) return;
    check_rows(rows, cols, group, "tq_matmul_lora");
    uint16_t *t16 = reinterpret_cast<uint16_t *>(tile);
    /* h's columns after x's, and the bias's 1s */
    tz_cuda_lora_cols(tz_cuda_stream(be), A, ld, cols, h, r, 1.0f, nb, NULL, M);
    if (tz_cuda_narrow_tq(be, C, c_bf16, A, 1, codes, scales, levels, rows, cols, ld, bits, group,
                          r ? B : NULL, r, s, bias, M, 1, 1.0f, 0.0f))
        return;
    tq_chunks(be, C, A, t16, codes, scales, levels, rows, cols, ld, r ? B : NULL, r, s, bias,
              bits, group, M, 1, 1.0f, 0.0f, "tq_matmul_lora", c_bf16);
}

void tz_cuda_install_quant(tz_backend *be) {
    be->tq_rotate = cuda_tq_rotate;
    be->tq_rotate16 = cuda_tq_rotate16;
    be->tq_rotate_bwd = cuda_tq_rotate_bwd;
    be->tq_rotate16_at = cuda_tq_rotate16_at;
    be->tq_rotate_bwd_at = cuda_tq_rotate_bwd_at;
    be->swiglu_rot16_at = cuda_swiglu_rot16_at;
    be->tq_dequant = cuda_tq_dequant;
    be->tq_matmul = cuda_tq_matmul;
    be->tq_matmul_lora = cuda_tq_matmul_lora;
}
