/* The CUDA runtime as the CPU emulation of the CUDA backend sees it (tests/cuda_emu/emu/): the types,
 * the runtime API, the device built-ins and the launch entry that tests/cuda_emu/emu/rewrite.py puts in
 * place of `kernel<<<grid, block, smem, stream>>>(args)`. Compiled by the host C++ compiler,
 * never by nvcc. Only what cuda/ uses (and a little around it): not a general CUDA.
 *
 * Execution model: a kernel's blocks run one after another on the calling thread; a block's
 * threads are cooperative fibers (tests/cuda_emu/emu/emu_runtime.cpp) switched at __syncthreads and at
 * the warp collectives (__shfl_*_sync, __ballot_sync, __syncwarp), so barriers and shuffles
 * have their CUDA meaning and a barrier some thread never reaches is reported by name.
 * Streams run every operation at once (synchronous). */
#ifndef TZ_EMU_CUDA_RUNTIME_H
#define TZ_EMU_CUDA_RUNTIME_H
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define TZ_CUDA_EMULATION 1
#define CUDART_VERSION 12000

/* ---- qualifiers ---- */
/* A launch calls its kernel from a generic lambda, which is no use of the kernel where the
 * launch sits in a template never instantiated (a header's kernel in a file that does not
 * launch it): nvcc's build, which compiles the same kernels, keeps -Wunused-function. */
#define __global__ __attribute__((unused))
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __constant__
#define __managed__
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
/* Blocks run one at a time, so a block's shared variables can be static storage (never
 * cleared between blocks, as on a GPU nothing promises their contents). Dynamic shared memory
 * (`extern __shared__ T x[];`) is rewritten by tests/cuda_emu/emu/rewrite.py into tz_emu_dyn_smem(). */
#define __shared__ static

/* ---- vector types and the launch geometry ---- */
struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
struct double2 { double x, y; };
struct int2 { int x, y; };
struct int4 { int x, y, z, w; };
struct uint2 { unsigned x, y; };
struct uint4 { unsigned x, y, z, w; };
static inline float2 make_float2(float x, float y) { return float2{x, y}; }
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
static inline double2 make_double2(double x, double y) { return double2{x, y}; }
static inline int2 make_int2(int x, int y) { return int2{x, y}; }
static inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }

/* The current thread's coordinates, set by the scheduler before it resumes a thread. */
extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;
static constexpr int warpSize = 32;

/* ---- errors, streams, events, memory ---- */
enum cudaError_t {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidPitchValue = 12,
    cudaErrorInvalidSymbol = 13,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorInsufficientDriver = 35,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorHostMemoryAlreadyRegistered = 712,
    cudaErrorHostMemoryNotRegistered = 713,
    cudaErrorLaunchFailure = 719,
    cudaErrorNotSupported = 801,
    cudaErrorUnknown = 999
};
typedef enum cudaError_t cudaError;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
};
enum cudaMemoryType {
    cudaMemoryTypeUnregistered = 0,
    cudaMemoryTypeHost = 1,
    cudaMemoryTypeDevice = 2,
    cudaMemoryTypeManaged = 3
};
struct cudaPointerAttributes {
    enum cudaMemoryType type;
    int device;
    void *devicePointer;
    void *hostPointer;
};
enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
    cudaFuncAttributePreferredSharedMemoryCarveout = 9
};

typedef struct tz_emu_stream *cudaStream_t;
typedef struct tz_emu_event *cudaEvent_t;
#define cudaStreamLegacy ((cudaStream_t)0x1)
#define cudaStreamPerThread ((cudaStream_t)0x2)

#define cudaStreamDefault 0x00u
#define cudaStreamNonBlocking 0x01u
#define cudaEventDefault 0x00u
#define cudaEventBlockingSync 0x01u
#define cudaEventDisableTiming 0x02u
#define cudaEventInterprocess 0x04u
#define cudaHostAllocDefault 0x00u
#define cudaHostAllocPortable 0x01u
#define cudaHostAllocMapped 0x02u
#define cudaHostAllocWriteCombined 0x04u
#define cudaHostRegisterDefault 0x00u
#define cudaHostRegisterPortable 0x01u
#define cudaHostRegisterMapped 0x02u
#define cudaHostRegisterIoMemory 0x04u
#define cudaHostRegisterReadOnly 0x08u

struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem, sharedMemPerBlock, sharedMemPerBlockOptin, totalConstMem;
    size_t sharedMemPerMultiprocessor;
    int regsPerBlock, warpSize, maxThreadsPerBlock, maxThreadsDim[3], maxGridSize[3];
    int clockRate, major, minor, multiProcessorCount, maxThreadsPerMultiProcessor;
    int pciBusID, pciDeviceID, pciDomainID, integrated, canMapHostMemory, concurrentKernels;
    int asyncEngineCount, unifiedAddressing, memoryClockRate, memoryBusWidth, l2CacheSize;
    int managedMemory, isMultiGpuBoard, ECCEnabled;
    char uuid[16];
};

extern "C" {
const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaGetDevice(int *d);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d);
cudaError_t cudaDeviceGetPCIBusId(char *id, int len, int d);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaDeviceReset(void);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t s);
cudaError_t cudaFree(void *p);
cudaError_t cudaFreeAsync(void *p, cudaStream_t s);
cudaError_t cudaMallocHost(void **p, size_t bytes);
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaHostRegister(void *p, size_t bytes, unsigned flags);
cudaError_t cudaHostUnregister(void *p);
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind k);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind k,
                            cudaStream_t s);
cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                         size_t height, enum cudaMemcpyKind k);
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, enum cudaMemcpyKind k,
                              cudaStream_t s);
cudaError_t cudaMemset(void *p, int v, size_t bytes);
cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t s);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned flags, int priority);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b);
cudaError_t cudaFuncSetAttribute(const void *f, enum cudaFuncAttribute a, int v);
typedef void (*cudaHostFn_t)(void *user);
cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *user);
/* Emulation only: a kernel on stream s about to read [p, p + bytes) of device memory, checked
 * for stream order against the copies that wrote those bytes (cudaErrorInvalidValue and a note
 * when nothing orders them). */
cudaError_t tz_emu_kernel_reads(cudaStream_t s, const void *p, size_t bytes, const char *kernel);
/* A kernel about to run on stream s writes [p, p + bytes): checked, as a copy's destination
 * is, against earlier writes and declared reads of those bytes by other streams, then
 * recorded (so that a later access by another stream must be ordered after it). */
cudaError_t tz_emu_kernel_writes(cudaStream_t s, void *p, size_t bytes, const char *kernel);
cudaError_t cudaHostGetDevicePointer(void **dev, void *host, unsigned flags);
cudaError_t cudaSetDeviceFlags(unsigned flags);
cudaError_t cudaStreamGetFlags(cudaStream_t s, unsigned *flags);
}

/* The C++ conveniences of the real header. */
template <class T> static inline cudaError_t cudaMalloc(T **p, size_t bytes) {
    return cudaMalloc((void **)p, bytes);
}
template <class T> static inline cudaError_t cudaMallocHost(T **p, size_t bytes) {
    return cudaMallocHost((void **)p, bytes);
}
template <class T> static inline cudaError_t cudaHostAlloc(T **p, size_t bytes, unsigned f) {
    return cudaHostAlloc((void **)p, bytes, f);
}
template <class T>
static inline cudaError_t cudaMallocAsync(T **p, size_t bytes, cudaStream_t s) {
    return cudaMallocAsync((void **)p, bytes, s);
}
static inline cudaError_t cudaEventRecord(cudaEvent_t e) { return cudaEventRecord(e, 0); }
static inline cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e) {
    return cudaStreamWaitEvent(s, e, 0);
}
template <class T>
static inline cudaError_t cudaMemcpyToSymbol(T &symbol, const void *src, size_t bytes,
                                             size_t offset = 0,
                                             cudaMemcpyKind k = cudaMemcpyHostToDevice) {
    if (offset + bytes > sizeof symbol) return cudaErrorInvalidValue;
    memcpy((char *)&symbol + offset, src, bytes);
    (void)k;
    return cudaSuccess;
}
template <class F>
static inline cudaError_t cudaFuncSetAttribute(F *f, enum cudaFuncAttribute a, int v) {
    return cudaFuncSetAttribute((const void *)f, a, v);
}

/* ---- kernel launch (the rewrite of <<< >>>) ---- */
cudaError_t tz_emu_launch_impl(const char *name, dim3 grid, dim3 block, size_t smem,
                               cudaStream_t s, void (*call)(const void *), const void *fn);
struct tz_emu_cfg {
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
};
static inline tz_emu_cfg tz_emu_config(dim3 grid, dim3 block, size_t smem = 0,
                                       cudaStream_t s = 0) {
    return tz_emu_cfg{grid, block, smem, s};
}
/* k is the kernel as a callable; the arguments arrive here evaluated once, by value, and
 * each thread calls the kernel with its own copy of them. */
template <class K, class... A>
static inline void tz_emu_launch(const char *name, tz_emu_cfg c, const K &k, A... a) {
    auto call = [&] { k(a...); };
    tz_emu_launch_impl(name, c.grid, c.block, c.smem, c.stream,
                       [](const void *p) { (*(const decltype(call) *)p)(); }, &call);
}
#define TZ_EMU_STR(...) #__VA_ARGS__
/* The launch's dynamic shared memory (filled with NaN bytes at each block). */
void *tz_emu_dyn_smem(void);
/* Called where a static __shared__ variable is declared (tests/cuda_emu/emu/rewrite.py): the first
 * thread of a block to pass there fills it with NaN bytes, so a block reads only what it
 * wrote, never what the previous block left. */
void tz_emu_shared_fresh(void *p, size_t bytes);
/* cp.async and its groups (cuda/cuda_mma.cuh's tz_cp_async): each copy done at the latest
 * moment its wait allows (tests/cuda_emu/emu/emu_runtime.cpp) */
void tz_emu_cp_async(void *dst, const void *src, int bytes, int src_bytes);
void tz_emu_cp_async_commit(void);
void tz_emu_cp_async_wait(int n);

/* ---- barriers and warp collectives ---- */
void __syncthreads(void);
int __syncthreads_count(int pred);
int __syncthreads_and(int pred);
int __syncthreads_or(int pred);
enum { TZ_EMU_SHFL_IDX, TZ_EMU_SHFL_UP, TZ_EMU_SHFL_DOWN, TZ_EMU_SHFL_XOR, TZ_EMU_BALLOT,
       TZ_EMU_SYNCWARP };
uint64_t tz_emu_warp(int kind, unsigned mask, uint64_t bits, int arg, int width);
template <class T> static inline uint64_t tz_emu_bits(T v) {
    static_assert(sizeof(T) <= 8, "warp shuffles move at most 8 bytes");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof v);
    return b;
}
template <class T> static inline T tz_emu_from_bits(uint64_t b) {
    T v;
    memcpy(&v, &b, sizeof v);
    return v;
}
template <class T> static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    return tz_emu_from_bits<T>(tz_emu_warp(TZ_EMU_SHFL_IDX, mask, tz_emu_bits(v), src, width));
}
template <class T>
static inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return tz_emu_from_bits<T>(
        tz_emu_warp(TZ_EMU_SHFL_UP, mask, tz_emu_bits(v), (int)delta, width));
}
template <class T>
static inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return tz_emu_from_bits<T>(
        tz_emu_warp(TZ_EMU_SHFL_DOWN, mask, tz_emu_bits(v), (int)delta, width));
}
template <class T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    return tz_emu_from_bits<T>(
        tz_emu_warp(TZ_EMU_SHFL_XOR, mask, tz_emu_bits(v), lane_mask, width));
}
static inline unsigned __ballot_sync(unsigned mask, int pred) {
    return (unsigned)tz_emu_warp(TZ_EMU_BALLOT, mask, pred != 0, 0, 32);
}
static inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
static inline int __all_sync(unsigned mask, int pred) {
    return (__ballot_sync(mask, pred) & mask) == mask;
}
static inline void __syncwarp(unsigned mask = 0xffffffffu) {
    tz_emu_warp(TZ_EMU_SYNCWARP, mask, 0, 0, 32);
}
static inline void __threadfence(void) {}
static inline void __threadfence_block(void) {}
template <class T> static inline T __ldg(const T *p) { return *p; }
template <class T> static inline T __ldcg(const T *p) { return *p; }

/* Atomics: threads run one at a time, so plain read-modify-write is atomic here. */
template <class T> static inline T atomicAdd(T *p, T v) {
    T old = *p;
    *p = old + v;
    return old;
}
template <class T> static inline T atomicMax(T *p, T v) {
    T old = *p;
    if (v > old) *p = v;
    return old;
}
template <class T> static inline T atomicMin(T *p, T v) {
    T old = *p;
    if (v < old) *p = v;
    return old;
}
template <class T> static inline T atomicExch(T *p, T v) {
    T old = *p;
    *p = v;
    return old;
}
template <class T> static inline T atomicCAS(T *p, T cmp, T v) {
    T old = *p;
    if (old == cmp) *p = v;
    return old;
}

/* ---- math built-ins (IEEE round to nearest: the _rn forms are the plain operations; the
 * emulation is built with -ffp-contract=off, so nothing is fused unless asked) ---- */
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline float __frcp_rn(float a) { return 1.0f / a; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline float __fdividef(float a, float b) { return a / b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
/* The fast intrinsics are the accurate functions here (glibc declares functions of these
 * names, hence macros, defined after <math.h>). */
#define __expf(x) expf(x)
#define __logf(x) logf(x)
#define __sinf(x) sinf(x)
#define __cosf(x) cosf(x)
#define __tanf(x) tanf(x)
#define __powf(a, b) powf(a, b)
static inline float __saturatef(float x) { return x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline unsigned __float_as_uint(float x) { return tz_emu_from_bits<unsigned>(tz_emu_bits(x)); }
static inline float __uint_as_float(unsigned x) { return tz_emu_from_bits<float>(tz_emu_bits(x)); }
static inline int __float_as_int(float x) { return tz_emu_from_bits<int>(tz_emu_bits(x)); }
static inline float __int_as_float(int x) { return tz_emu_from_bits<float>(tz_emu_bits(x)); }
static inline long long __double_as_longlong(double x) {
    return tz_emu_from_bits<long long>(tz_emu_bits(x));
}
static inline double __longlong_as_double(long long x) {
    return tz_emu_from_bits<double>(tz_emu_bits(x));
}
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(unsigned x) { return x ? __builtin_clz(x) : 32; }
static inline int __ffs(unsigned x) { return __builtin_ffs((int)x); }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline long min(long a, long b) { return a < b ? a : b; }
static inline long max(long a, long b) { return a > b ? a : b; }
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }

#endif
