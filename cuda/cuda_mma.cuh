/* One warp-level tensor-core product, D = A B + C for a 16 x 8 tile with K = 16: the PTX
 * instruction mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (sm_80 and later), and the
 * same product written with shuffles for everything else that compiles this file (the CPU
 * emulation, tests/cuda_emu/emu/; a build for an older GPU). Both follow the fragment layouts of the PTX
 * ISA ("Matrix Fragments for mma.m16n8k16 with floating point type"), which is what the
 * kernels that call it rely on. With g = lane / 4 (groupID) and t = lane % 4
 * (threadID_in_group), each .b32 register holding two bf16 values, the lower half the
 * element of lower column (A) or row (B) index:
 *   A, 16 x 16, row-major:  a[0] = A[g][2t, 2t+1]      a[1] = A[g+8][2t, 2t+1]
 *                           a[2] = A[g][2t+8, 2t+9]    a[3] = A[g+8][2t+8, 2t+9]
 *   B, 16 x 8, "col":       b[0] = B[2t, 2t+1][g]      b[1] = B[2t+8, 2t+9][g]
 *   C and D, 16 x 8, fp32:  c[0] = C[g][2t]  c[1] = C[g][2t+1]  c[2] = C[g+8][2t]
 *                           c[3] = C[g+8][2t+1]
 * The shuffle form gathers row g and g+8 of A and columns 2t, 2t+1 of B from the lanes that
 * hold them and sums the 16 exact products of each output in fp32, in order of k, onto C (the
 * hardware's order of summation inside the instruction is its own: results agree to fp32
 * rounding, not to the bit). Every lane of the warp must call it together (a warp
 * collective, like __shfl_sync). tests/cuda_emu/emu_selftest.cu checks the emulated form
 * against a plain matrix product, through the same layouts. */
#ifndef TZ_CUDA_MMA_CUH
#define TZ_CUDA_MMA_CUH
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

/* Two floats rounded to bf16 (nearest, ties to even) in one register: lo in bits 0-15. */
__device__ __forceinline__ uint32_t tz_pack_bf16(float lo, float hi) {
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) |
           ((uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16);
}
/* Two bf16 bit patterns in one register: lo in bits 0-15. */
__device__ __forceinline__ uint32_t tz_pack_u16(uint16_t lo, uint16_t hi) {
    return (uint32_t)lo | ((uint32_t)hi << 16);
}
__device__ __forceinline__ float tz_bf16_lo(uint32_t x) { return __uint_as_float(x << 16); }
__device__ __forceinline__ float tz_bf16_hi(uint32_t x) { return __uint_as_float(x & 0xffff0000u); }

/* 2^x with subnormals flushed to zero, in one instruction: the PTX ex2.approx.ftz.f32 (one
 * MUFU.EX2). exp2f compiles to ex2.approx.f32, whose subnormal results cost three more
 * instructions a call (a compare, a scale before and a square after: the sm_80 and sm_90
 * cubins' sizes, 4 instructions an exp2f against 1) and which give nothing here: a score's
 * probability below 2^-126 (1.2e-38) is zero either way once rounded into a product with
 * values of order one. The flash kernels' softmax, one per score, is where it counts. The
 * emulation (no __CUDA_ARCH__): exp2f with the same flushes of a subnormal x and result. */
__device__ __forceinline__ float tz_ex2(float x) {
#if defined(__CUDA_ARCH__)
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
#else
    const float r = exp2f(fabsf(x) < 1.17549435e-38f ? 0.0f : x);
    return r < 1.17549435e-38f ? 0.0f : r; /* (FLT_MIN; a NaN stays one) */
#endif
}

__device__ __forceinline__ void tz_mma_bf16_16816(float c[4], const uint32_t a[4],
                                                  const uint32_t b[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    const unsigned full = 0xffffffffu;
    const int lane = (int)(threadIdx.x & 31u), g = lane >> 2, t = lane & 3;
    float ar[2][16], bc[2][16]; /* rows g, g+8 of A; columns 2t, 2t+1 of B */
    for (int j = 0; j < 4; j++) { /* lane 4g + j holds columns 2j, 2j+1, 2j+8, 2j+9 */
        const uint32_t x0 = __shfl_sync(full, a[0], 4 * g + j);
        const uint32_t x1 = __shfl_sync(full, a[1], 4 * g + j);
        const uint32_t x2 = __shfl_sync(full, a[2], 4 * g + j);
        const uint32_t x3 = __shfl_sync(full, a[3], 4 * g + j);
        ar[0][2 * j] = tz_bf16_lo(x0), ar[0][2 * j + 1] = tz_bf16_hi(x0);
        ar[1][2 * j] = tz_bf16_lo(x1), ar[1][2 * j + 1] = tz_bf16_hi(x1);
        ar[0][2 * j + 8] = tz_bf16_lo(x2), ar[0][2 * j + 9] = tz_bf16_hi(x2);
        ar[1][2 * j + 8] = tz_bf16_lo(x3), ar[1][2 * j + 9] = tz_bf16_hi(x3);
    }
    for (int n = 0; n < 2; n++) /* column 2t + n of B: lanes 4 (2t + n) + j */
        for (int j = 0; j < 4; j++) {
            const uint32_t y0 = __shfl_sync(full, b[0], 4 * (2 * t + n) + j);
            const uint32_t y1 = __shfl_sync(full, b[1], 4 * (2 * t + n) + j);
            bc[n][2 * j] = tz_bf16_lo(y0), bc[n][2 * j + 1] = tz_bf16_hi(y0);
            bc[n][2 * j + 8] = tz_bf16_lo(y1), bc[n][2 * j + 9] = tz_bf16_hi(y1);
        }
    for (int r = 0; r < 2; r++)
        for (int n = 0; n < 2; n++) {
            float s = c[2 * r + n];
            for (int k = 0; k < 16; k++) s += ar[r][k] * bc[n][k];
            c[2 * r + n] = s;
        }
#endif
}

/* Four 8 x 8 matrices of 16-bit elements from shared memory, one register each: the PTX
 * instruction ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 (sm_75 and later), and the same
 * load written with shuffles for everything else (the CPU emulation). Lane 8j + i gives the
 * address of row i of matrix j (16-byte aligned, 8 consecutive elements); with g = lane / 4 and
 * t = lane % 4, register r[j] of a lane holds, the lower half first (the PTX ISA, "Warp-level
 * matrix load instruction: ldmatrix"):
 *   without .trans:  M_j[g][2t], M_j[g][2t+1]
 *   with .trans:     M_j[2t][g], M_j[2t+1][g]   (the transpose's row g)
 * So an 8 x 8 block of a row-major [n][k] tile loaded plain, or of a row-major [k][n] tile
 * loaded with .trans, is a B register of mma.m16n8k16 (b = B[2t, 2t+1][g], above): one
 * instruction for four B registers instead of eight 16-bit or four 32-bit loads. A warp
 * collective: every lane calls it together. tests/cuda_emu/emu_selftest.cu checks the emulated
 * form against these layouts and, through mma, against a plain matrix product. */
template <bool TRANS>
__device__ __forceinline__ void tz_ldmatrix_x4(uint32_t r[4], const uint16_t *row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned a = (unsigned)__cvta_generic_to_shared(row);
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
#else
    const unsigned full = 0xffffffffu;
    const int lane = (int)(threadIdx.x & 31u), g = lane >> 2, t = lane & 3;
    const unsigned long long mine = (unsigned long long)(uintptr_t)row;
    for (int j = 0; j < 4; j++) {
        if (TRANS) { /* rows 2t and 2t + 1 of matrix j, column g */
            const uint16_t *p0 =
                (const uint16_t *)(uintptr_t)__shfl_sync(full, mine, 8 * j + 2 * t);
            const uint16_t *p1 =
                (const uint16_t *)(uintptr_t)__shfl_sync(full, mine, 8 * j + 2 * t + 1);
            r[j] = tz_pack_u16(p0[g], p1[g]);
        } else { /* row g of matrix j, columns 2t and 2t + 1 */
            const uint16_t *p = (const uint16_t *)(uintptr_t)__shfl_sync(full, mine, 8 * j + g);
            r[j] = tz_pack_u16(p[2 * t], p[2 * t + 1]);
        }
    }
#endif
}

/* cp.async (sm_80 and later): N bytes (16, or 4) copied from global to shared memory without
 * passing through registers, so a thread can issue the next tile's loads and go on computing
 * on the current one (16: .cg, past L1; 4: .ca, the only way 4 bytes go). `full` false: the N
 * bytes are zeros and nothing is read (the PTX form's src-size of 0). Copies are grouped by
 * tz_cp_async_commit; tz_cp_async_wait<W> returns once all but the newest W groups the thread
 * committed are done, and other threads see them only after a __syncthreads that follows.
 * dst and src N-byte aligned. The CPU emulation does each copy as late as that allows (at the
 * wait: tests/cuda_emu/emu/emu_runtime.cpp), or with TZ_CUDA_EMU_ASYNC=early as early (at the
 * issue), so a read too early, or without the barrier, or a copy into a buffer still read,
 * shows; anything else (no such GPU here) copies at once. */
template <int N> __device__ __forceinline__ void tz_cp_async(void *dst, const void *src, bool full) {
    static_assert(N == 16 || N == 4, "tz_cp_async: 16 or 4 bytes");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    if constexpr (N == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
                     "r"(full ? 16 : 0)
                     : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src),
                     "r"(full ? 4 : 0)
                     : "memory");
#elif defined(TZ_EMU_CUDA_RUNTIME_H)
    tz_emu_cp_async(dst, src, N, full ? N : 0);
#else
    uint32_t *o = (uint32_t *)dst;
    const uint32_t *i = (const uint32_t *)src;
    for (int j = 0; j < N / 4; j++) o[j] = full ? i[j] : 0u;
#endif
}
__device__ __forceinline__ void tz_cp_async_commit(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#elif defined(TZ_EMU_CUDA_RUNTIME_H)
    tz_emu_cp_async_commit();
#endif
}
template <int N> __device__ __forceinline__ void tz_cp_async_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#elif defined(TZ_EMU_CUDA_RUNTIME_H)
    tz_emu_cp_async_wait(N);
#endif
}

#endif
