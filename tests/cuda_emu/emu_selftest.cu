/* The CUDA emulation itself (tests/cuda_emu/emu/), against what CUDA specifies: written as CUDA and
 * built like the backend (tests/cuda_emu/emu/rewrite.py, then the host C++ compiler against the
 * emulated runtime), so the same source would run under nvcc. Checks:
 *   - thread and block coordinates of 3-D launches; __syncthreads with static shared memory;
 *     __syncthreads_count; the shuffles (idx, up, down, xor, with widths 32 and 8),
 *     __ballot_sync, __any_sync, __all_sync;
 *   - shared memory (dynamic, and static from one block to the next) and cudaMalloc'd
 *     memory read before any write are NaN bytes;
 *   - launch configuration errors, copies in the wrong direction or past an allocation;
 *   - streams, events, pinned and registered host memory keep their API contracts;
 *   - cuBLAS: SGEMM in all four transposes with padded leading dimensions against a plain
 *     loop, beta = 0 not reading C (NaN there), alpha = 0 not reading A and B, an invalid
 *     ld rejected, GemmEx with bf16 operands, the bf16 conversions (ties to even, NaN);
 *   - the warp-level bf16 tensor-core product (cuda/cuda_mma.cuh, mma.sync m16n8k16): its
 *     fragments loaded and stored by the layouts the PTX ISA documents, against a plain
 *     matrix product of the same bf16 values, onto a nonzero C; ldmatrix.x4, plain and
 *     .trans, against its documented fragments, and feeding mma's B both ways; ex2 with
 *     subnormals flushed (the flash kernels' exponential) against exp2;
 *   - misuses reported by name instead of a hang or a silent result (each in a child
 *     process, which must die with the message): a deadlock between a barrier and a shuffle,
 *     __syncthreads in divergent code, a shuffle naming a lane that returned, an access past
 *     the end of an allocation. */
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda/cuda_mma.cuh"

static int g_pass, g_fail;
static void check(bool ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(bool ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "ok  " : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
    (ok ? g_pass : g_fail)++;
}

/* ---- kernels ---- */

/* D = A B + C, A 16x16 row-major, B 16x8 row-major (k x n), C 16x8, through the fragments of
 * cuda/cuda_mma.cuh's layouts; one warp. */
static __global__ void k_mma(float *d, const float *a, const float *b, const float *c) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    uint32_t af[4], bf[2];
    for (int i = 0; i < 4; i++) {
        const int r = g + (i & 1 ? 8 : 0), k = 2 * t + (i & 2 ? 8 : 0);
        af[i] = tz_pack_bf16(a[r * 16 + k], a[r * 16 + k + 1]);
    }
    for (int i = 0; i < 2; i++) {
        const int k = 2 * t + 8 * i;
        bf[i] = tz_pack_bf16(b[k * 8 + g], b[(k + 1) * 8 + g]);
    }
    float cf[4];
    for (int i = 0; i < 4; i++) cf[i] = c[(g + (i & 2 ? 8 : 0)) * 8 + 2 * t + (i & 1)];
    tz_mma_bf16_16816(cf, af, bf);
    for (int i = 0; i < 4; i++) d[(g + (i & 2 ? 8 : 0)) * 8 + 2 * t + (i & 1)] = cf[i];
}

/* ldmatrix.x4 (cuda/cuda_mma.cuh) of a 16 x 16 tile of 16-bit values in shared memory, rows
 * of LDM_LD elements (16-byte aligned): lane 8j + i addresses row (j % 2) * 8 + i at column
 * (j / 2) * 8, so matrix j is a quadrant. out[lane][form][reg]: form 0 plain, 1 .trans. */
#define LDM_LD 24
static __global__ void k_ldmatrix(uint32_t *out, const uint16_t *tile) {
    __shared__ uint16_t s[16 * LDM_LD];
    const int lane = threadIdx.x & 31, j = lane >> 3, i = lane & 7;
    for (int e = lane; e < 16 * LDM_LD; e += 32) s[e] = tile[e];
    __syncwarp();
    const uint16_t *row = s + ((j & 1) * 8 + i) * LDM_LD + (j >> 1) * 8;
    uint32_t r[4];
    tz_ldmatrix_x4<false>(r, row);
    for (int q = 0; q < 4; q++) out[lane * 8 + q] = r[q];
    tz_ldmatrix_x4<true>(r, row);
    for (int q = 0; q < 4; q++) out[lane * 8 + 4 + q] = r[q];
}

/* D [16][16] = A B through mma with B's fragments from ldmatrix: B [k][n] row-major in shared
 * memory loaded with .trans (kt = 0), or its transpose [n][k] loaded plain (kt = 1); matrix j
 * of the load covers k rows (j % 2) * 8.. and n columns (j / 2) * 8.., so registers 0, 1 are
 * the first n-tile's B and 2, 3 the second's (as the flash kernels use them). */
static __global__ void k_mma_ldmatrix(float *d, const float *a, const float *b, int kt) {
    __shared__ uint16_t s[16 * LDM_LD];
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, j = lane >> 3, i = lane & 7;
    for (int e = lane; e < 256; e += 32) {
        const int k = e / 16, n = e % 16; /* b[k][n] */
        const uint16_t v = __bfloat16_as_ushort(__float2bfloat16_rn(b[e]));
        if (kt) s[n * LDM_LD + k] = v;
        else s[k * LDM_LD + n] = v;
    }
    __syncwarp();
    uint32_t af[4], bf[4];
    for (int q = 0; q < 4; q++) {
        const int r = g + (q & 1 ? 8 : 0), k = 2 * t + (q & 2 ? 8 : 0);
        af[q] = tz_pack_bf16(a[r * 16 + k], a[r * 16 + k + 1]);
    }
    if (kt) tz_ldmatrix_x4<false>(bf, s + ((j >> 1) * 8 + i) * LDM_LD + (j & 1) * 8);
    else tz_ldmatrix_x4<true>(bf, s + ((j & 1) * 8 + i) * LDM_LD + (j >> 1) * 8);
    for (int nt = 0; nt < 2; nt++) {
        float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        tz_mma_bf16_16816(c, af, bf + 2 * nt);
        for (int q = 0; q < 4; q++)
            d[(g + (q & 2 ? 8 : 0)) * 16 + nt * 8 + 2 * t + (q & 1)] = c[q];
    }
}

static __global__ void k_coords(int *out) {
    int t = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
    int b = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    int nt = blockDim.x * blockDim.y * blockDim.z;
    out[b * nt + t] = ((((int)blockIdx.z * 4 + blockIdx.y) * 4 + blockIdx.x) * 64 +
                       threadIdx.z) * 4096 + threadIdx.y * 64 + threadIdx.x;
}

static __global__ void k_reverse(int *out, int *count) {
    __shared__ int s[256];
    int t = threadIdx.x, n = blockDim.x;
    s[t] = t + 1000 * blockIdx.x;
    int c = __syncthreads_count(t % 3 == 0);
    out[blockIdx.x * n + t] = s[n - 1 - t];
    if (t == 0) count[blockIdx.x] = c;
}

static __global__ void k_shuffles(int *out) {
    int lane = threadIdx.x & 31, v = threadIdx.x * 10;
    int *o = out + threadIdx.x * 9;
    o[0] = __shfl_sync(0xffffffffu, v, (lane * 7) % 32);
    o[1] = __shfl_up_sync(0xffffffffu, v, 3);
    o[2] = __shfl_down_sync(0xffffffffu, v, 5);
    o[3] = __shfl_xor_sync(0xffffffffu, v, 6);
    o[4] = __shfl_sync(0xffffffffu, v, 3, 8);
    o[5] = __shfl_down_sync(0xffffffffu, v, 2, 8);
    o[6] = (int)__ballot_sync(0xffffffffu, lane % 5 == 0);
    o[7] = __any_sync(0xffffffffu, lane == 31);
    o[8] = __all_sync(0xffffffffu, lane < 31);
    double d = __shfl_xor_sync(0xffffffffu, (double)v + 0.5, 1);
    if (d != (double)((lane ^ 1) + (threadIdx.x & ~31)) * 10 + 0.5) o[0] = -1;
}

/* two half-warps at different collectives, each with its own mask */
static __global__ void k_half_masks(int *out) {
    int lane = threadIdx.x & 31, v = threadIdx.x * 10;
    if (lane < 16) {
        out[2 * threadIdx.x] = __shfl_xor_sync(0x0000ffffu, v, 1);
        out[2 * threadIdx.x + 1] = (int)__ballot_sync(0x0000ffffu, lane % 3 == 0);
    } else {
        out[2 * threadIdx.x] = __shfl_down_sync(0xffff0000u, v, 4);
        out[2 * threadIdx.x + 1] = __all_sync(0xffff0000u, lane > 15);
    }
}

static __global__ void k_read_dyn(float *out) {
    extern __shared__ float dyn[];
    out[threadIdx.x] = dyn[threadIdx.x];
}

static __global__ void k_stale_shared(float *out) {
    __shared__ float s[32];
    if (blockIdx.x == 0) s[threadIdx.x] = 1.0f;
    __syncthreads();
    out[blockIdx.x * 32 + threadIdx.x] = s[threadIdx.x];
}

static __global__ void k_arg(int *out, int v) {
    v += threadIdx.x; /* each thread's own copy of the parameter */
    out[blockIdx.x * blockDim.x + threadIdx.x] = v;
}

static __global__ void k_nothing(void) {}

static __global__ void k_deadlock(float *out) {
    float v = (float)threadIdx.x;
    if (threadIdx.x < 16) __syncthreads();
    else v = __shfl_xor_sync(0xffffffffu, v, 1);
    out[threadIdx.x] = v;
}

static __global__ void k_divergent(float *out) {
    if (threadIdx.x < 32) {
        out[threadIdx.x] = 1.0f;
        __syncthreads();
        out[threadIdx.x + 64] = 3.0f;
    } else {
        out[threadIdx.x] = 2.0f;
        __syncthreads();
        out[threadIdx.x + 128] = 4.0f;
    }
}

static __global__ void k_shfl_returned(float *out) {
    if (threadIdx.x == 5) return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (float)threadIdx.x, 1);
}

static __global__ void k_overrun(float *out, int n) {
    for (int i = threadIdx.x; i < n + 4096; i += blockDim.x) out[i] = 1.0f;
}

/* ---- host checks ---- */

static void test_threads(void) {
    dim3 grid(2, 3, 2), block(5, 4, 3);
    int nt = 60, nb = 12, *d, h[720];
    cudaMalloc(&d, sizeof h);
    k_coords<<<grid, block>>>(d);
    cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    int bad = 0;
    for (int bz = 0; bz < 2; bz++)
        for (int by = 0; by < 3; by++)
            for (int bx = 0; bx < 2; bx++)
                for (int tz = 0; tz < 3; tz++)
                    for (int ty = 0; ty < 4; ty++)
                        for (int tx = 0; tx < 5; tx++) {
                            int b = (bz * 3 + by) * 2 + bx, t = (tz * 4 + ty) * 5 + tx;
                            int want = (((bz * 4 + by) * 4 + bx) * 64 + tz) * 4096 + ty * 64 + tx;
                            bad += h[b * nt + t] != want;
                        }
    check(bad == 0 && nb * nt == 720, "3-D grid and block coordinates (%d wrong)", bad);
    cudaFree(d);

    int *o, *c, ho[3 * 256], hc[3];
    cudaMalloc(&o, sizeof ho);
    cudaMalloc(&c, sizeof hc);
    k_reverse<<<3, 256>>>(o, c);
    cudaMemcpy(ho, o, sizeof ho, cudaMemcpyDeviceToHost);
    cudaMemcpy(hc, c, sizeof hc, cudaMemcpyDeviceToHost);
    bad = 0;
    for (int b = 0; b < 3; b++)
        for (int t = 0; t < 256; t++) bad += ho[b * 256 + t] != 255 - t + 1000 * b;
    check(bad == 0, "__syncthreads orders static shared memory (%d wrong)", bad);
    check(hc[0] == 86 && hc[2] == 86, "__syncthreads_count (%d, want 86)", hc[0]);
    cudaFree(o);
    cudaFree(c);

    int *a, ha[128], calls = 0;
    cudaMalloc(&a, sizeof ha);
    k_arg<<<2, 64>>>(a, 100 * ++calls);
    cudaMemcpy(ha, a, sizeof ha, cudaMemcpyDeviceToHost);
    bad = calls != 1;
    for (int i = 0; i < 128; i++) bad += ha[i] != 100 + i % 64;
    check(bad == 0, "kernel arguments: evaluated once at the launch, a copy per thread");
    cudaFree(a);

    int *s, hs[64 * 9];
    cudaMalloc(&s, sizeof hs);
    k_shuffles<<<1, 64>>>(s);
    cudaMemcpy(hs, s, sizeof hs, cudaMemcpyDeviceToHost);
    bad = 0;
    for (int t = 0; t < 64; t++) {
        int l = t & 31, w = t & ~31, *r = hs + t * 9, seg = l & ~7;
        int want[9] = {(w + (l * 7) % 32) * 10,
                       (l >= 3 ? t - 3 : t) * 10,
                       (l + 5 < 32 ? t + 5 : t) * 10,
                       (w + (l ^ 6)) * 10,
                       (w + seg + 3) * 10,
                       (l + 2 < seg + 8 ? t + 2 : t) * 10,
                       (int)0x42108421u,
                       1,
                       0};
        for (int k = 0; k < 9; k++)
            if (r[k] != want[k]) {
                if (bad < 3) printf("     thread %d result %d: %d, want %d\n", t, k, r[k], want[k]);
                bad++;
            }
    }
    check(bad == 0, "shuffles (idx, up, down, xor, width 8, double), ballot, any, all (%d wrong)",
          bad);
    k_half_masks<<<1, 64>>>(s);
    cudaMemcpy(hs, s, 64 * 2 * sizeof *hs, cudaMemcpyDeviceToHost);
    bad = 0;
    for (int t = 0; t < 64; t++) {
        int l = t & 31;
        int w0 = l < 16 ? (t ^ 1) * 10 : (l + 4 < 32 ? t + 4 : t) * 10;
        int w1 = l < 16 ? 0x9249 : 1;
        bad += hs[2 * t] != w0 || hs[2 * t + 1] != w1;
    }
    check(bad == 0, "half-warps at different collectives with their own masks (%d wrong)", bad);
    cudaFree(s);
}

static void test_memory(void) {
    float *d, h[64];
    cudaMalloc(&d, sizeof h);
    cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    check(isnan(h[0]) && isnan(h[63]), "cudaMalloc'd memory reads as NaN before any write");
    k_read_dyn<<<1, 64, 64 * sizeof(float)>>>(d);
    cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    check(isnan(h[0]) && isnan(h[63]), "dynamic shared memory reads as NaN before any write");
    k_stale_shared<<<2, 32>>>(d);
    cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    check(h[0] == 1.0f && isnan(h[32]),
          "static shared memory: a block does not see the previous block's values (NaN)");
    check(cudaGetLastError() == cudaSuccess, "no error so far");
    k_nothing<<<1, 1025>>>();
    check(cudaGetLastError() == cudaErrorInvalidConfiguration, "1025 threads: invalid configuration");
    k_nothing<<<dim3(1, 65536), 32>>>();
    check(cudaGetLastError() == cudaErrorInvalidConfiguration, "grid.y 65536: invalid configuration");
    k_read_dyn<<<1, 32, 49 * 1024>>>(d);
    check(cudaGetLastError() == cudaErrorInvalidValue, "49 KiB of dynamic shared memory refused");
    float host[64];
    check(cudaMemcpy(host, h, sizeof h, cudaMemcpyHostToDevice) == cudaErrorInvalidValue,
          "HostToDevice into host memory refused");
    check(cudaMemcpy(d + 1, h, sizeof h, cudaMemcpyHostToDevice) == cudaErrorInvalidValue,
          "a copy running past the allocation refused");
    check(cudaMemcpy(d, h, sizeof h, cudaMemcpyDefault) == cudaSuccess, "cudaMemcpyDefault");
    check(cudaFree(d + 1) == cudaErrorInvalidValue, "cudaFree of an inner pointer refused");
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    check(tot - fr == sizeof h, "cudaMemGetInfo: %zu bytes used", tot - fr);
    cudaFree(d);
    cudaGetLastError();
    cudaDeviceProp p;
    cudaGetDeviceProperties(&p, 0);
    check(strstr(p.name, "CPU emulation") != NULL, "the device's name: \"%s\"", p.name);
}

static int g_host_fn_ran;
static void host_fn(void *p) { *(int *)p = 1; }

static void test_streams(void) {
    cudaStream_t s;
    cudaEvent_t a, b, nt;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess &&
              cudaEventCreate(&a) == cudaSuccess && cudaEventCreate(&b) == cudaSuccess &&
              cudaEventCreateWithFlags(&nt, cudaEventDisableTiming) == cudaSuccess,
          "streams and events created");
    float ms = -1.0f;
    cudaEventRecord(a, s);
    k_nothing<<<1, 32, 0, s>>>();
    cudaEventRecord(b, s);
    bool ev = cudaStreamWaitEvent(0, b, 0) == cudaSuccess &&
              cudaEventSynchronize(b) == cudaSuccess && cudaEventQuery(b) == cudaSuccess &&
              cudaEventElapsedTime(&ms, a, b) == cudaSuccess && ms >= 0.0f;
    check(ev, "event record, wait, query, elapsed time (%.3f ms)", (double)ms);
    cudaEventRecord(nt, s);
    check(cudaEventElapsedTime(&ms, a, nt) == cudaErrorInvalidResourceHandle,
          "no elapsed time from an event made with cudaEventDisableTiming");
    check(cudaLaunchHostFunc(s, host_fn, &g_host_fn_ran) == cudaSuccess && g_host_fn_ran,
          "cudaLaunchHostFunc runs the function");
    cudaEventDestroy(a), cudaEventDestroy(b), cudaEventDestroy(nt);
    cudaStreamDestroy(s);
    check(cudaStreamSynchronize(s) == cudaErrorInvalidResourceHandle &&
              cudaEventQuery(a) == cudaErrorInvalidResourceHandle,
          "a destroyed stream or event is an invalid handle");
    cudaGetLastError();

    static float host[4096];
    float *pinned, *dev;
    cudaPointerAttributes at;
    check(cudaHostRegister(host, sizeof host, cudaHostRegisterDefault) == cudaSuccess &&
              cudaHostRegister(host + 16, 64, cudaHostRegisterDefault) ==
                  cudaErrorHostMemoryAlreadyRegistered,
          "cudaHostRegister; twice over the same memory refused");
    cudaPointerGetAttributes(&at, host + 5);
    check(at.type == cudaMemoryTypeHost, "a registered pointer is host memory");
    check(cudaHostUnregister(host) == cudaSuccess &&
              cudaHostUnregister(host) == cudaErrorHostMemoryNotRegistered,
          "cudaHostUnregister; twice refused");
    cudaGetLastError();
    cudaMallocHost(&pinned, 256);
    cudaMalloc(&dev, 256);
    cudaPointerGetAttributes(&at, dev + 3);
    check(at.type == cudaMemoryTypeDevice, "a device pointer is device memory");
    check(cudaMemcpyAsync(dev, pinned, 256, cudaMemcpyHostToDevice, 0) == cudaSuccess &&
              cudaFree(pinned) == cudaErrorInvalidValue && cudaFreeHost(pinned) == cudaSuccess,
          "pinned memory: copied from, freed by cudaFreeHost only");
    char bus[32];
    cudaDeviceGetPCIBusId(bus, sizeof bus, 0);
    check(strlen(bus) > 0, "cudaDeviceGetPCIBusId: %s (made up)", bus);
    cudaFree(dev);
    cudaGetLastError();
}

/* Stream order: a copy on one stream and a declared kernel access on another, unordered, fail
 * (a race a GPU may or may not show); an event recorded after the copy and waited for orders
 * them. Both ways: the kernel reading what a copy wrote, and writing what a copy read. */
static void test_stream_order(void) {
    cudaStream_t s;
    cudaEvent_t e;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    float *pinned, *dev;
    cudaMallocHost(&pinned, 256);
    cudaMalloc(&dev, 256);
    memset(pinned, 0, 256);
    for (int w = 0; w < 2; w++) { /* the kernel reads what the copy wrote; writes what it read */
        if (w) cudaMemcpyAsync(pinned, dev, 256, cudaMemcpyDeviceToHost, s);
        else cudaMemcpyAsync(dev, pinned, 256, cudaMemcpyHostToDevice, s);
        cudaError_t e0, e1;
        for (int ordered = 0; ordered < 2; ordered++) {
            if (ordered) cudaEventRecord(e, s), cudaStreamWaitEvent(0, e, 0);
            const cudaError_t r = w ? tz_emu_kernel_writes(0, dev + 60, 4, "selftest write")
                                    : tz_emu_kernel_reads(0, dev + 8, 16, "selftest read");
            (ordered ? e1 : e0) = r;
            cudaGetLastError();
        }
        check(e0 == cudaErrorInvalidValue && e1 == cudaSuccess,
              "a kernel %s a copy on another stream %s: refused unordered (%d), ordered by an "
              "event (%d)", w ? "writing what" : "reading what", w ? "read" : "wrote", (int)e0,
              (int)e1);
    }
    cudaGetLastError();
    cudaStreamSynchronize(s);
    cudaFree(dev), cudaFreeHost(pinned);
    cudaEventDestroy(e), cudaStreamDestroy(s);
    cudaGetLastError();
}

static void test_cublas(void) {
    cublasHandle_t h;
    cublasCreate(&h);
    cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH);
    const int m = 7, n = 5, k = 9, pad = 3;
    srand(7);
    float A[(k + pad) * (k + pad)], B[(k + pad) * (k + pad)], C[(m + pad) * n], R[(m + pad) * n];
    for (int i = 0; i < (k + pad) * (k + pad); i++) {
        A[i] = (float)(rand() % 17 - 8) / 4.0f;
        B[i] = (float)(rand() % 13 - 6) / 2.0f;
    }
    float *dA, *dB, *dC;
    cudaMalloc(&dA, sizeof A);
    cudaMalloc(&dB, sizeof B);
    cudaMalloc(&dC, sizeof C);
    cudaMemcpy(dA, A, sizeof A, cudaMemcpyHostToDevice);
    cudaMemcpy(dB, B, sizeof B, cudaMemcpyHostToDevice);
    int bad = 0;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            int lda = (ta ? k : m) + pad, ldb = (tb ? n : k) + pad, ldc = m + pad;
            float alpha = 1.5f, beta = ta ? 0.0f : 0.5f;
            for (int i = 0; i < ldc * n; i++) C[i] = beta == 0.0f ? NAN : (float)(i % 5);
            cudaMemcpy(dC, C, sizeof C, cudaMemcpyHostToDevice);
            cublasSgemm(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n,
                        k, &alpha, dA, lda, dB, ldb, &beta, dC, ldc);
            cudaMemcpy(R, dC, sizeof R, cudaMemcpyDeviceToHost);
            for (int j = 0; j < n; j++)
                for (int i = 0; i < m; i++) {
                    double s = 0; /* small integers and halves: exact in any order */
                    for (int l = 0; l < k; l++)
                        s += (double)(ta ? A[l + i * lda] : A[i + l * lda]) *
                             (double)(tb ? B[j + l * ldb] : B[l + j * ldb]);
                    double want = alpha * s + (beta == 0.0f ? 0.0 : beta * C[i + j * ldc]);
                    bad += R[i + j * ldc] != (float)want;
                }
            for (int j = 0; j < n; j++) /* padding rows untouched */
                for (int i = m; i < ldc; i++)
                    bad += !(isnan(C[i + j * ldc]) ? isnan(R[i + j * ldc])
                                                   : R[i + j * ldc] == C[i + j * ldc]);
        }
    check(bad == 0, "cublasSgemm: four transposes, padded ld, beta = 0 ignores NaN C (%d wrong)", bad);
    float zero = 0.0f, two = 2.0f;
    cublasStatus_t st = cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &zero, NULL, m, NULL, k,
                                    &two, dC, m);
    check(st == CUBLAS_STATUS_SUCCESS, "alpha = 0 reads neither A nor B (NULL accepted)");
    st = cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &two, dA, m - 1, dB, k, &two, dC, m);
    check(st == CUBLAS_STATUS_INVALID_VALUE, "lda < m: CUBLAS_STATUS_INVALID_VALUE");
    st = cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 64, 64, 64, &two, dA, 64, dB, 64, &two, dC, 64);
    check(st == CUBLAS_STATUS_EXECUTION_FAILED, "operands past their allocations refused");

    /* bf16: conversions, then a GemmEx on bf16 operands */
    check(__bfloat16_as_ushort(__float2bfloat16(1.00390625f)) == 0x3f80 &&
              __bfloat16_as_ushort(__float2bfloat16(1.01171875f)) == 0x3f82 &&
              __bfloat16_as_ushort(__float2bfloat16_rn(-2.0f)) == 0xc000 &&
              isnan(__bfloat162float(__float2bfloat16(NAN))) &&
              __bfloat162float(__float2bfloat16(3.4e38f)) == INFINITY,
          "bf16 rounding: ties to even, NaN stays NaN, overflow to inf");
    __nv_bfloat16 a16[k * m], b16[k * n];
    for (int i = 0; i < k * m; i++) a16[i] = __float2bfloat16(A[i] * 1.01f);
    for (int i = 0; i < k * n; i++) b16[i] = __float2bfloat16(B[i] * 0.99f);
    __nv_bfloat16 *dA16, *dB16;
    cudaMalloc(&dA16, sizeof a16);
    cudaMalloc(&dB16, sizeof b16);
    cudaMemcpy(dA16, a16, sizeof a16, cudaMemcpyHostToDevice);
    cudaMemcpy(dB16, b16, sizeof b16, cudaMemcpyHostToDevice);
    float one = 1.0f, z = 0.0f;
    st = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, dA16, CUDA_R_16BF, m, dB16,
                      CUDA_R_16BF, k, &z, dC, CUDA_R_32F, m, CUBLAS_COMPUTE_32F,
                      CUBLAS_GEMM_DEFAULT);
    cudaMemcpy(R, dC, sizeof(float) * m * n, cudaMemcpyDeviceToHost);
    double worst = 0;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double s = 0;
            for (int l = 0; l < k; l++)
                s += (double)__bfloat162float(a16[i + l * m]) * __bfloat162float(b16[l + j * k]);
            worst = fmax(worst, fabs(R[i + j * m] - s) / (fabs(s) + 1));
        }
    check(st == CUBLAS_STATUS_SUCCESS && worst < 1e-6,
          "cublasGemmEx bf16 x bf16 -> fp32, fp32 sums (rel err %.1e)", worst);
    cudaFree(dA), cudaFree(dB), cudaFree(dC), cudaFree(dA16), cudaFree(dB16);
    cublasDestroy(h);
}

/* Runs fn in a child process, which must die with every one of the phrases on stderr. */
static void expect_death(const char *what, void (*fn)(void), const char *p1, const char *p2) {
    int fd[2];
    if (pipe(fd) != 0) return;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        alarm(20); /* a hang is a failure too */
        fn();
        _exit(0);
    }
    close(fd[1]);
    char buf[4096];
    size_t len = 0;
    ssize_t r;
    while (len + 1 < sizeof buf && (r = read(fd[0], buf + len, sizeof buf - 1 - len)) > 0)
        len += (size_t)r;
    buf[len] = 0;
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    bool died = WIFSIGNALED(status) && WTERMSIG(status) != SIGALRM;
    bool said = strstr(buf, p1) && strstr(buf, p2);
    check(died && said, "%s: reported", what);
    printf("     status %#x, stderr: %s", status, buf);
}

/* cp.async (cuda_mma.cuh's tz_cp_async) as the kernels use it: each of 32 threads copies its
 * 4 floats of src into slot t (group 0), and 16 bytes of zeros into slot 32 + t and 4 bytes,
 * src[t + 64], into float 256 + t (group 1); out[t] what slot t held before any wait,
 * out[32 + t] slot t after wait_group 1, out[64 + t] slot 32 + t before wait_group 0, and
 * after it and a barrier out[96 + t] the neighbour's slot (t + 1) % 32, out[128 + t] the zero
 * slot and out[160 + t] the neighbour's 4 bytes. */
static __global__ void k_cp_async(float *out, const float *src) {
    extern __shared__ float sm[];
    const int t = (int)threadIdx.x;
    tz_cp_async<16>(sm + 4 * t, src + 4 * t, true);
    tz_cp_async_commit();
    tz_cp_async<16>(sm + 4 * (32 + t), src, false);
    tz_cp_async<4>(sm + 256 + t, src + 64 + t, true);
    tz_cp_async_commit();
    out[t] = sm[4 * t];
    tz_cp_async_wait<1>();
    out[32 + t] = sm[4 * t];
    out[64 + t] = sm[4 * (32 + t)];
    tz_cp_async_wait<0>();
    __syncthreads();
    out[96 + t] = sm[4 * ((t + 1) % 32) + 3];
    out[128 + t] = sm[4 * (32 + t) + 2];
    out[160 + t] = sm[256 + (t + 1) % 32];
}
static __global__ void k_cp_async_unwaited(const float *src) {
    extern __shared__ float sm[];
    tz_cp_async<16>(sm, src, true);
    tz_cp_async_commit();
}
static __global__ void k_cp_async_misaligned(const float *src) {
    extern __shared__ float sm[];
    tz_cp_async<16>(sm + 1, src, true);
    tz_cp_async_commit();
    tz_cp_async_wait<0>();
}

static void test_cp_async(void) {
    float src[128], out[192];
    for (int i = 0; i < 128; i++) src[i] = (float)i + 0.5f;
    float *ds, *dout;
    cudaMalloc(&ds, sizeof src), cudaMalloc(&dout, sizeof out);
    cudaMemcpy(ds, src, sizeof src, cudaMemcpyHostToDevice);
    for (int early = 0; early < 2; early++) {
        setenv("TZ_CUDA_EMU_ASYNC", early ? "early" : "late", 1);
        k_cp_async<<<1, 32, 64 * 16 + 32 * 4>>>(dout, ds);
        cudaMemcpy(out, dout, sizeof out, cudaMemcpyDeviceToHost);
        int before = 0, after = 0, pend = 0, seen = 0, zero = 0, four = 0;
        for (int t = 0; t < 32; t++) {
            before += early ? out[t] == src[4 * t] : isnan(out[t]);
            after += out[32 + t] == src[4 * t];
            pend += early ? out[64 + t] == 0.0f : isnan(out[64 + t]);
            seen += out[96 + t] == src[4 * ((t + 1) % 32) + 3];
            zero += out[128 + t] == 0.0f;
            four += out[160 + t] == src[64 + (t + 1) % 32];
        }
        check(before == 32 && pend == 32, "cp.async copies done %s (slots read before their "
              "wait: %d and %d of 32 as expected)", early ? "at issue" : "at the wait", before,
              pend);
        check(after == 32 && seen == 32 && zero == 32 && four == 32, "cp.async %s: wait_group 1 "
              "leaves the newest group, wait_group 0 and a barrier show every thread's copies "
              "of 16 and of 4 bytes, src-size 0 zeros (%d, %d, %d, %d of 32)",
              early ? "early" : "late", after, seen, four, zero);
    }
    unsetenv("TZ_CUDA_EMU_ASYNC");
    cudaFree(ds), cudaFree(dout);
}

static float *g_out;
static void run_cp_async_unwaited(void) { k_cp_async_unwaited<<<1, 32, 64>>>(g_out); }
static void run_cp_async_misaligned(void) { k_cp_async_misaligned<<<1, 32, 64>>>(g_out); }
static void run_deadlock(void) { k_deadlock<<<1, 32>>>(g_out); }
static void run_divergent(void) { k_divergent<<<1, 64>>>(g_out); }
static void run_shfl_returned(void) { k_shfl_returned<<<1, 32>>>(g_out); }
static void run_overrun(void) { k_overrun<<<1, 32>>>(g_out, 1000); }

/* The tensor-core product of cuda/cuda_mma.cuh against a plain loop: bf16 values (small
 * multiples of 1/8 and 1/4, so every product and sum is exact in fp32 and the order of the
 * sums does not matter), each element distinct enough that a misplaced one shows. */
static void test_mma(void) {
    float a[256], b[128], c[128], d[128], want[128];
    for (int i = 0; i < 256; i++) a[i] = (float)((i * 37) % 29 - 14) / 8.0f;
    for (int i = 0; i < 128; i++) b[i] = (float)((i * 53) % 31 - 15) / 4.0f;
    for (int i = 0; i < 128; i++) c[i] = (float)(i % 11) - 5.0f;
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 8; n++) {
            float s = c[r * 8 + n];
            for (int k = 0; k < 16; k++) s += a[r * 16 + k] * b[k * 8 + n];
            want[r * 8 + n] = s;
        }
    float *da, *db, *dc, *dd;
    cudaMalloc(&da, sizeof a), cudaMalloc(&db, sizeof b), cudaMalloc(&dc, sizeof c);
    cudaMalloc(&dd, sizeof d);
    cudaMemcpy(da, a, sizeof a, cudaMemcpyHostToDevice);
    cudaMemcpy(db, b, sizeof b, cudaMemcpyHostToDevice);
    cudaMemcpy(dc, c, sizeof c, cudaMemcpyHostToDevice);
    k_mma<<<1, 32>>>(dd, da, db, dc);
    cudaMemcpy(d, dd, sizeof d, cudaMemcpyDeviceToHost);
    int bad = 0;
    for (int i = 0; i < 128; i++) bad += d[i] != want[i];
    check(bad == 0, "mma m16n8k16 bf16 (A row, B col, C/D fp32 fragments): D = A B + C, %d of "
          "128 elements differ", bad);
    cudaFree(da), cudaFree(db), cudaFree(dc), cudaFree(dd);
}

/* ldmatrix's fragments against the layouts the PTX ISA documents for it, and the tensor-core
 * product with B loaded by it (both ways the flash kernels load B) against a plain loop. */
static void test_ldmatrix(void) {
    uint16_t tile[16 * LDM_LD];
    for (int e = 0; e < 16 * LDM_LD; e++) tile[e] = (uint16_t)(0x1000 + e); /* distinct */
    uint16_t *dt;
    uint32_t *dout, got[32 * 8];
    cudaMalloc(&dt, sizeof tile), cudaMalloc(&dout, sizeof got);
    cudaMemcpy(dt, tile, sizeof tile, cudaMemcpyHostToDevice);
    k_ldmatrix<<<1, 32>>>(dout, dt);
    cudaMemcpy(got, dout, sizeof got, cudaMemcpyDeviceToHost);
    int bad[2] = {0, 0};
    for (int lane = 0; lane < 32; lane++) {
        const int g = lane / 4, t = lane % 4;
        for (int j = 0; j < 4; j++) { /* M_j[r][c] = tile[(j % 2) * 8 + r][(j / 2) * 8 + c] */
#define M(r, c) tile[((j % 2) * 8 + (r)) * LDM_LD + (j / 2) * 8 + (c)]
            const uint32_t plain = (uint32_t)M(g, 2 * t) | ((uint32_t)M(g, 2 * t + 1) << 16);
            const uint32_t trans = (uint32_t)M(2 * t, g) | ((uint32_t)M(2 * t + 1, g) << 16);
#undef M
            bad[0] += got[lane * 8 + j] != plain;
            bad[1] += got[lane * 8 + 4 + j] != trans;
        }
    }
    check(bad[0] == 0, "ldmatrix.x4 (plain): lane 4g + t holds M_j[g][2t, 2t+1]; %d of 128 "
          "registers differ", bad[0]);
    check(bad[1] == 0, "ldmatrix.x4.trans: lane 4g + t holds M_j[2t, 2t+1][g]; %d of 128 "
          "registers differ", bad[1]);
    cudaFree(dt), cudaFree(dout);
    float a[256], b[256], d[256], want[256];
    for (int i = 0; i < 256; i++) a[i] = (float)((i * 37) % 29 - 14) / 8.0f;
    for (int i = 0; i < 256; i++) b[i] = (float)((i * 53) % 31 - 15) / 4.0f;
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 16; n++) {
            float s = 0.0f;
            for (int k = 0; k < 16; k++) s += a[r * 16 + k] * b[k * 16 + n];
            want[r * 16 + n] = s;
        }
    float *da, *db, *dd;
    cudaMalloc(&da, sizeof a), cudaMalloc(&db, sizeof b), cudaMalloc(&dd, sizeof d);
    cudaMemcpy(da, a, sizeof a, cudaMemcpyHostToDevice);
    cudaMemcpy(db, b, sizeof b, cudaMemcpyHostToDevice);
    for (int kt = 0; kt < 2; kt++) {
        k_mma_ldmatrix<<<1, 32>>>(dd, da, db, kt);
        cudaMemcpy(d, dd, sizeof d, cudaMemcpyDeviceToHost);
        int nb = 0;
        for (int i = 0; i < 256; i++) nb += d[i] != want[i];
        check(nb == 0, "mma with B from ldmatrix%s (B stored %s): D = A B, %d of 256 elements "
              "differ", kt ? "" : ".trans", kt ? "[n][k]" : "[k][n]", nb);
    }
    cudaFree(da), cudaFree(db), cudaFree(dd);
}

/* tz_ex2 (cuda/cuda_mma.cuh) as the PTX ISA describes ex2.approx.ftz.f32: 2^x to a relative
 * error of at most 2^-22 where the result is normal; subnormal inputs and results flushed to
 * zero (so 2^x is 0 below x = -126, and 1 at a subnormal x); 2^-inf = 0, 2^+inf = +inf, NaN
 * stays NaN. The flash kernels' softmax takes every exponential from it. */
static __global__ void k_ex2(float *out, const float *x, int n) {
    const int i = (int)threadIdx.x;
    if (i < n) out[i] = tz_ex2(x[i]);
}
static void test_ex2(void) {
    enum { N = 64 };
    float x[N], got[N];
    int n = 0;
    for (int k = -40; k <= 12; k++) x[n++] = (float)k * 3.1f + 0.37f; /* -123.63 .. 37.57 */
    x[n++] = -125.9f, x[n++] = -126.0f, x[n++] = -126.01f, x[n++] = -140.0f;
    x[n++] = 1e-40f, x[n++] = -1e-40f, x[n++] = 0.0f, x[n++] = -INFINITY, x[n++] = INFINITY;
    x[n++] = NAN;
    float *dx, *dout;
    cudaMalloc(&dx, sizeof x), cudaMalloc(&dout, sizeof got);
    cudaMemcpy(dx, x, sizeof x, cudaMemcpyHostToDevice);
    k_ex2<<<1, N>>>(dout, dx, n);
    cudaMemcpy(got, dout, sizeof got, cudaMemcpyDeviceToHost);
    int bad = 0;
    double worst = 0.0;
    for (int i = 0; i < n; i++) {
        const double want = exp2((double)x[i]);
        if (isnan(x[i])) bad += !isnan(got[i]);
        else if (fabsf(x[i]) < 1.17549435e-38f) bad += got[i] != 1.0f;
        else if (want < 1.17549435e-38) bad += got[i] != 0.0f;
        else if (isinf(want)) bad += !(isinf(got[i]) && got[i] > 0.0f);
        else {
            const double rel = fabs((double)got[i] - want) / want;
            worst = rel > worst ? rel : worst;
            bad += rel > 0x1p-22;
        }
    }
    check(bad == 0, "ex2.approx.ftz.f32 (tz_ex2): %d of %d values wrong (relative error at most "
          "%.2g, 2^-22 allowed; results below 2^-126 and subnormal inputs flushed)", bad, n,
          worst);
    cudaFree(dx), cudaFree(dout);
}

int main(void) {
    test_threads();
    test_memory();
    test_streams();
    test_stream_order();
    test_cublas();
    test_mma();
    test_ldmatrix();
    test_ex2();
    test_cp_async();
    cudaMalloc(&g_out, 1000 * sizeof(float));
    expect_death("a thread returning with cp.async copies not waited for",
                 run_cp_async_unwaited, "kernel k_cp_async_unwaited", "not waited for");
    expect_death("a cp.async to a misaligned address", run_cp_async_misaligned,
                 "kernel k_cp_async_misaligned", "not aligned");
    expect_death("a barrier and a shuffle waiting for each other", run_deadlock,
                 "kernel k_deadlock", "deadlock");
    expect_death("__syncthreads in divergent code", run_divergent, "kernel k_divergent",
                 "different __syncthreads");
    expect_death("a shuffle naming a lane that returned", run_shfl_returned,
                 "kernel k_shfl_returned", "returned");
    expect_death("a write past the end of an allocation", run_overrun, "kernel k_overrun",
                 "faulted");
    cudaFree(g_out);
    printf("test_cuda_emu: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail != 0;
}
