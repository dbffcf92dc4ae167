/* The step model of `bench --dry-run`: every op a training step calls on the planning
 * backend is counted, by class, in floating-point operations and bytes of its operands (as
 * stored), and a time is estimated from an accelerator's peak rates. Counts what the model
 * code calls, so it follows the code; computes nothing. Not the memory plan (bench.c). */
#ifndef TZ_STEP_MODEL_H
#define TZ_STEP_MODEL_H
#include <stdint.h>

#include "core/backend.h"

enum {
    TZ_SM_GEMM,      /* matmul, matmul_bw16, the product of tq_matmul */
    TZ_SM_ATTENTION, /* attention_fwd, attention_bwd, attention_cache_fwd */
    TZ_SM_QUANT,     /* tq_rotate(_bwd), tq_dequant, the decode of tq_matmul */
    TZ_SM_NORM,      /* rmsnorm, layernorm */
    TZ_SM_ELEMENT,   /* elementwise and layout ops: rope, swiglu, gelu, silu, casts, ... */
    TZ_SM_LOSS,      /* xent, mse */
    TZ_SM_COPY,      /* device copies */
    TZ_SM_TRANSFER,  /* host <-> device */
    TZ_SM_N
};

/* Peak rates an estimate is made at. */
typedef struct tz_step_rates {
    const char *name;
    double gemm_flops;      /* GEMMs with the run's operand type */
    double attention_flops; /* the attention kernels' */
    double other_flops;     /* CUDA cores, fp32 */
    double mem_bytes;       /* device memory bandwidth */
    double link_bytes;      /* host <-> device */
} tz_step_rates;

/* One op's counts (the op table's entry the counter stands for; an op that books work in
 * two classes, a GEMM and its casts, has a row for each). */
typedef struct tz_step_op {
    const char *name;
    int cls;
    double flops, bytes, sec;
    int64_t calls;
} tz_step_op;
enum { TZ_SM_OPS = 64 };

typedef struct tz_step_model {
    double flops[TZ_SM_N], bytes[TZ_SM_N];
    double sec[TZ_SM_N]; /* each call's larger of its compute and its memory time, summed */
    int64_t calls[TZ_SM_N];
    tz_step_rates rates; /* the peaks sec is taken at */
    tz_step_op ops[TZ_SM_OPS];
    int n_ops;
} tz_step_model;

extern const char *const tz_step_model_names[TZ_SM_N];

/* Fills every compute op of be's table (and the async copies and events) with counters that
 * time each call at the peak rates r. be->ctx must point to a struct whose first member is the
 * tz_step_model the counts go to (the planning backend's); its memory ops are left as they
 * are. */
void tz_step_model_install(tz_backend *be, const tz_step_rates *r);
/* The counts of be (installed above). */
tz_step_model *tz_step_model_of(tz_backend *be);
/* scale: multiplies every count (e.g. by the micro-batches of a step). */
void tz_step_model_scale(tz_step_model *m, double scale);

/* The H100 SXM's datasheet peaks for GEMM operands bf16 (bf16 = 1) or fp32 (TF32). */
tz_step_rates tz_step_rates_h100(int bf16);

/* rank 0: one line per class (calls, GFLOP, GB, estimated ms at the installed rates: for
 * each call the larger of its compute and its memory time, a lower bound: a skinny GEMM is
 * timed by its bytes even where the class's arithmetic is far larger), and the total. */
void tz_step_model_print(const tz_step_model *m);
/* rank 0: one line per op (and class), the most time first: what the classes above are made
 * of (bench --dry-run prints it with TZ_STEP_OPS=1 in the environment). */
void tz_step_model_print_ops(const tz_step_model *m);

#endif
