/* NCCL in the CUDA emulation (tests/cuda_emu/emu/): not there. The emulated module leaves out
 * the NCCL sources of cuda/ (file names containing "nccl": tests/cuda_emu/emu/emu.cmake); this header
 * only lets other sources that include <nccl.h> compile, and every call reports NCCL
 * unavailable (ncclInvalidUsage; ncclGetErrorString says why). */
#ifndef TZ_EMU_NCCL_H
#define TZ_EMU_NCCL_H
#include "cuda_runtime.h"

typedef struct tz_emu_nccl_comm *ncclComm_t;
typedef struct {
    char internal[128];
} ncclUniqueId;
typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7
} ncclResult_t;
typedef enum {
    ncclInt8 = 0, ncclChar = 0, ncclUint8 = 1, ncclInt32 = 2, ncclInt = 2, ncclUint32 = 3,
    ncclInt64 = 4, ncclUint64 = 5, ncclFloat16 = 6, ncclHalf = 6, ncclFloat32 = 7,
    ncclFloat = 7, ncclFloat64 = 8, ncclDouble = 8, ncclBfloat16 = 9
} ncclDataType_t;
typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;
#define NCCL_UNIQUE_ID_BYTES 128

static inline const char *ncclGetErrorString(ncclResult_t r) {
    return r == ncclSuccess ? "no error" : "NCCL is not available in the CPU emulation of CUDA";
}
static inline const char *ncclGetLastError(ncclComm_t) {
    return "NCCL is not available in the CPU emulation of CUDA";
}
static inline ncclResult_t ncclGetVersion(int *v) {
    if (v) *v = 0;
    return ncclInvalidUsage;
}
static inline ncclResult_t ncclGetUniqueId(ncclUniqueId *) { return ncclInvalidUsage; }
static inline ncclResult_t ncclCommInitRank(ncclComm_t *c, int, ncclUniqueId, int) {
    if (c) *c = NULL;
    return ncclInvalidUsage;
}
static inline ncclResult_t ncclCommInitAll(ncclComm_t *, int, const int *) {
    return ncclInvalidUsage;
}
static inline ncclResult_t ncclCommDestroy(ncclComm_t) { return ncclInvalidUsage; }
static inline ncclResult_t ncclCommAbort(ncclComm_t) { return ncclInvalidUsage; }
static inline ncclResult_t ncclCommCount(ncclComm_t, int *) { return ncclInvalidUsage; }
static inline ncclResult_t ncclCommUserRank(ncclComm_t, int *) { return ncclInvalidUsage; }
static inline ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t *e) {
    if (e) *e = ncclInvalidUsage;
    return ncclInvalidUsage;
}
static inline ncclResult_t ncclGroupStart(void) { return ncclInvalidUsage; }
static inline ncclResult_t ncclGroupEnd(void) { return ncclInvalidUsage; }
static inline ncclResult_t ncclAllReduce(const void *, void *, size_t, ncclDataType_t,
                                         ncclRedOp_t, ncclComm_t, cudaStream_t) {
    return ncclInvalidUsage;
}
static inline ncclResult_t ncclReduceScatter(const void *, void *, size_t, ncclDataType_t,
                                             ncclRedOp_t, ncclComm_t, cudaStream_t) {
    return ncclInvalidUsage;
}
static inline ncclResult_t ncclAllGather(const void *, void *, size_t, ncclDataType_t,
                                         ncclComm_t, cudaStream_t) {
    return ncclInvalidUsage;
}
static inline ncclResult_t ncclBroadcast(const void *, void *, size_t, ncclDataType_t, int,
                                         ncclComm_t, cudaStream_t) {
    return ncclInvalidUsage;
}
static inline ncclResult_t ncclReduce(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
                                      int, ncclComm_t, cudaStream_t) {
    return ncclInvalidUsage;
}
static inline ncclResult_t ncclSend(const void *, size_t, ncclDataType_t, int, ncclComm_t,
                                    cudaStream_t) {
    return ncclInvalidUsage;
}
static inline ncclResult_t ncclRecv(void *, size_t, ncclDataType_t, int, ncclComm_t,
                                    cudaStream_t) {
    return ncclInvalidUsage;
}
#endif
