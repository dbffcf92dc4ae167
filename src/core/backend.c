/* What every backend shares: the check that a backend's table is whole, the precision of its
 * GEMMs, its destruction. Choosing one by name and loading the CUDA module: backend/registry.c. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/error.h"

/* TZ_BACKEND_OPS must name every function pointer of struct tz_backend: the struct is those
 * pointers, the fields before `destroy` and the two byte counters. */
#define TZ_COUNT_OP(op) +1
_Static_assert(sizeof(tz_backend) == offsetof(tz_backend, destroy) +
                                         (0 TZ_BACKEND_OPS(TZ_COUNT_OP)) * sizeof(void (*)(void)) +
                                         2 * sizeof(size_t),
               "TZ_BACKEND_OPS (core/backend.h) must list every op of struct tz_backend");

tz_att_ld tz_att_ld_of(const tz_att_ld *ld, int64_t Hq, int64_t Hkv, int64_t D) {
    tz_att_ld r = {Hq * D, Hkv * D, Hq * D, 0, 0};
    if (ld) {
        if (ld->q) r.q = ld->q;
        if (ld->kv) r.kv = ld->kv;
        if (ld->o) r.o = ld->o;
        r.in16 = ld->in16 != 0;
        r.d16 = ld->d16 & (TZ_ATT_DQ16 | TZ_ATT_DK16 | TZ_ATT_DV16);
    }
    if (r.q < Hq * D || r.kv < Hkv * D || r.o < Hq * D)
        TZ_FATAL("attention: row strides q %lld, kv %lld, out %lld below the rows' widths "
                 "%lld, %lld, %lld (Hq=%lld, Hkv=%lld, D=%lld)", (long long)r.q,
                 (long long)r.kv, (long long)r.o, (long long)(Hq * D), (long long)(Hkv * D),
                 (long long)(Hq * D), (long long)Hq, (long long)Hkv, (long long)D);
    return r;
}

int tz_tq_device_chunks(void) {
    const char *e = getenv("TZ_TQ_CHUNKS");
    if (!e || !*e) return TZ_TQ_DEVICE_CHUNKS;
    char *end = NULL;
    const long v = strtol(e, &end, 10);
    if (*end || v < 1 || v > 16)
        TZ_FATAL("TZ_TQ_CHUNKS=%s: expected a whole number from 1 to 16 (the chunks a GPU's "
                 "decode of each quantized weight takes; default %d)", e, TZ_TQ_DEVICE_CHUNKS);
    return (int)v;
}

int tz_narrow_gemm_enabled(void) {
    const char *e = getenv("TZ_NARROW_GEMM");
    if (!e || !*e || !strcmp(e, "1")) return 1;
    if (!strcmp(e, "0")) return 0;
    TZ_FATAL("TZ_NARROW_GEMM=%s: expected 1 (LoRA's narrow products by turbozero's own "
             "kernel, the default) or 0 (by the GEMM library, for measuring)", e);
    return 0;
}

int tz_tq_fused_enabled(void) {
    const char *e = getenv("TZ_TQ_FUSED");
    if (!e || !*e || !strcmp(e, "1")) return 1;
    if (!strcmp(e, "0")) return 0;
    TZ_FATAL("TZ_TQ_FUSED=%s: expected 1 (a quantized weight's products on at most 64 rows "
             "decoded inside turbozero's narrow kernel, the default) or 0 (decoded, then "
             "multiplied, for measuring)", e);
    return 0;
}

int64_t tz_op_rows(const char *op, int64_t n, int64_t cols, int64_t ld) {
    if (cols <= 0) return 0;
    if (n % cols || ld < cols)
        TZ_FATAL("%s: %lld elements are not rows of %lld at a stride of %lld", op, (long long)n,
                 (long long)cols, (long long)ld);
    return n / cols;
}

void tz_backend_check(const tz_backend *be) {
#define TZ_CHECK_OP(op)                                                                       \
    if (!be->op)                                                                              \
        TZ_FATAL("backend %s: op %s is missing from its table (every op of core/backend.h "   \
                 "must be set)", be->name ? be->name : "?", #op);
    TZ_BACKEND_OPS(TZ_CHECK_OP)
#undef TZ_CHECK_OP
    if (!(be->matmul_dtypes & (1u << TZ_DT_F32)))
        TZ_FATAL("backend %s: matmul must support fp32 operands (matmul_dtypes)",
                 be->name ? be->name : "?");
}

enum tz_dtype tz_backend_set_precision(tz_backend *be, enum tz_precision precision) {
    const int bf16 = (be->matmul_dtypes & (1u << TZ_DT_BF16)) != 0;
    if (precision == TZ_PRECISION_AUTO)
        be->matmul_dtype = be->device && bf16 ? TZ_DT_BF16 : TZ_DT_F32;
    else if (precision == TZ_PRECISION_FP32)
        be->matmul_dtype = TZ_DT_F32;
    else if (precision == TZ_PRECISION_BF16) {
        if (!bf16)
            TZ_FATAL_HINT("set run.precision = \"auto\" or \"fp32\", or run.device = \"cuda\"",
                          "run.precision = \"bf16\": the %s backend computes in fp32 only",
                          be->name);
        be->matmul_dtype = TZ_DT_BF16;
    } else
        TZ_FATAL("run.precision: no precision %d (expected auto, fp32 or bf16)", (int)precision);
    return be->matmul_dtype;
}

void tz_backend_destroy(tz_backend *be) {
    if (be) be->destroy(be);
}
