/* The op-case table (tests/ops/): one list of op cases that every backend runs. A case is a
 * row: the ops it calls, its tensors (shapes and how they are made), the backend call of its
 * forward and of its backward, an fp64 reference forward, and tolerances. The runner
 * (test_op_table.c) runs every row on a backend (the CPU under the kernel ctest names, the
 * CUDA module, its CPU emulation), and checks
 *   - the forward's outputs against the fp64 reference (error = max |got - ref| / max |ref|,
 *     relative to the result's scale, so a cancelled element does not blow it up);
 *   - the backward's input gradients against central differences of the fp64 reference of
 *     L = sum over the outputs given an upstream gradient of sum(dout * out), at
 *     OC_FD_POINTS evenly spaced elements of each input and its last one, accumulated onto a
 *     random start (the backward adds) unless the row says the backward writes;
 *   - that every op of the backend table (TZ_BACKEND_OPS) is named by some row.
 * Adding an op: one row (a function adding the case, in the cases file of its family) whose
 * `ops` names it. Test code only. */
#ifndef TZ_OP_CASE_H
#define TZ_OP_CASE_H
#include <stddef.h>
#include <stdint.h>

#include "core/backend.h"

#define OC_MAXT 12       /* tensors of a row */
#define OC_FD_POINTS 96  /* elements differenced per input */

/* What a tensor of a row is. Float tensors are fp32; the reference sees every tensor as
 * doubles (v) and, for the bit-level ones, as the bytes the backend got (raw). */
enum oc_kind {
    OC_IN,    /* float input, uniform in [-amp, amp] */
    OC_INOUT, /* float, random start (amp), the forward updates it in place (so does ref) */
    OC_OUT,   /* float output the forward writes: NaN before the forward, so an element it
               * misses fails */
    OC_I32,   /* int32 input, uniform in [lo, hi) (token ids, targets; < 0: ignored rows) */
    OC_BF16,  /* bf16 input (bit patterns) of values uniform in [-amp, amp]; v holds them */
    OC_U8,    /* bytes, uniform in [0, 256): packed codes, flags (lo, hi: a range instead) */
    OC_DOUT,  /* upstream gradient of tensor `of` (an OUT or INOUT): random (amp 1), or one
               * value r->dscal everywhere with OC_UNIFORM; read by the backward */
    OC_DIN,   /* gradient of input `of` (IN or INOUT): a random start the backward adds to
               * (OC_WRITES: NaN, the backward writes it), checked against differences */
    OC_DIO,   /* both, in place (rope_bwd): holds the upstream gradient of `of`'s output on
               * entry, the gradient of `of`'s input (written) on return */
    OC_OUT16, /* an output the forward writes as bf16 bit patterns: NaN before, widened for the
               * comparison with the reference (forward-only rows) */
};

/* tensor flags */
enum {
    OC_UNIFORM = 1, /* OC_DOUT: one scalar (r->dscal, in [0.5, 1.5]) everywhere */
    OC_WRITES = 2,  /* OC_DIN: the backward writes, not adds */
    OC_NOCHECK = 4, /* OC_OUT/OC_INOUT: not compared (scratch the op may leave anything in) */
    OC_POSITIVE = 8, /* OC_IN/OC_INOUT: uniform in [0, amp] (a second moment, a variance) */
    OC_DIN16 = 16,   /* OC_DIN with OC_WRITES: written as bf16 bit patterns (n * 2 bytes) */
};

typedef struct oc_tensor {
    const char *name;
    enum oc_kind kind;
    int64_t n;     /* elements */
    float amp;     /* OC_IN, OC_INOUT, OC_BF16: half-width of the uniform values (0: 1) */
    float mid;     /* OC_IN, OC_INOUT: their centre (0 unless set) */
    int of;        /* OC_DOUT, OC_DIN, OC_DIO: the tensor it is the gradient of */
    int flags;
    int lo, hi;    /* OC_I32, OC_U8: the range [lo, hi) */
} oc_tensor;

/* case flags */
enum {
    OC_GEMM = 1, /* runs GEMMs in the backend's matmul operand type: also run with bf16
                  * operands on a device backend that has them (tol_*_bf16) */
    OC_RET = 2,  /* the forward returns a double (r->ret) checked against the reference's */
    OC_DEVICE_BF16 = 4, /* (with OC_GEMM) a shape a device backend runs with bf16 operands
                         * only: its fp32 pass leaves the row out */
    OC_HOST_ONLY = 8,   /* a shape chosen for the CPU's blocking: device backends leave it out
                         * (their tiles are covered by smaller rows; on the emulation it is the
                         * slowest of all) */
};

typedef struct oc_case oc_case;

/* A backend call of a row: its buffers d[i] (backend memory, tensor i), its params. */
typedef struct oc_run {
    const oc_case *c;
    tz_backend *be;
    void *d[OC_MAXT];
    float dscal;   /* the OC_UNIFORM upstream gradient */
    double ret;    /* OC_RET: what the forward returned */
} oc_run;

/* The reference's view: every tensor as doubles (v[i]), raw host bytes (raw[i]). */
typedef struct oc_ref {
    const oc_case *c;
    double *v[OC_MAXT];
    const void *raw[OC_MAXT];
    double ret;
} oc_ref;

struct oc_case {
    char name[256];       /* what and at which shape, e.g. "rmsnorm rows 7 C 37" */
    const char *ops;      /* the backend ops the row calls, space separated */
    int nt;
    oc_tensor t[OC_MAXT];
    int64_t p[8];         /* shape parameters, as the row's functions read them */
    double s[8];          /* scalar parameters */
    int flags;
    void (*fwd)(oc_run *r);
    void (*ref)(oc_ref *r);  /* fp64: reads inputs (and INOUT starts), writes OUT and INOUT */
    void (*bwd)(oc_run *r);  /* NULL: no backward */
    double tol_fwd, tol_bwd;           /* fp32 GEMM operands */
    double tol_fwd_bf16, tol_bwd_bf16; /* bf16 GEMM operands (OC_GEMM rows; 0: the fp32 ones) */
    int fd_points;        /* elements differenced per input (0: OC_FD_POINTS): fewer for rows
                           * whose reference is costly */
    /* Instead of all of the above: a row that checks itself (memory, queues, events). 0 when
     * it passes; else a message in msg. */
    int (*custom)(tz_backend *be, const oc_case *c, char *msg, size_t len);
};

/* Shorthands for the rows' functions. */
#define OCF(r, i) ((float *)(r)->d[i])
#define OCI(r, i) ((int32_t *)(r)->d[i])
#define OCH(r, i) ((uint16_t *)(r)->d[i])
#define OCB(r, i) ((uint8_t *)(r)->d[i])
#define OCP(r, i) ((r)->c->p[i])
#define OCS(r, i) ((r)->c->s[i])

/* The list the cases files add to. */
typedef struct oc_list {
    oc_case *c;
    int n, cap;
} oc_list;
/* Adds a copy of *c; returns the copy. */
oc_case *oc_add(oc_list *l, const oc_case *c);

/* Tensor initialisers. */
#define OC_T_IN(nm, cnt) {.name = nm, .kind = OC_IN, .n = (cnt), .amp = 1.0f}
#define OC_T_INA(nm, cnt, a) {.name = nm, .kind = OC_IN, .n = (cnt), .amp = (a)}
#define OC_T_INOUT(nm, cnt) {.name = nm, .kind = OC_INOUT, .n = (cnt), .amp = 1.0f}
#define OC_T_OUT(nm, cnt) {.name = nm, .kind = OC_OUT, .n = (cnt)}
#define OC_T_OUT16(nm, cnt) {.name = nm, .kind = OC_OUT16, .n = (cnt)}
#define OC_T_I32(nm, cnt, l, h) {.name = nm, .kind = OC_I32, .n = (cnt), .lo = (l), .hi = (h)}
#define OC_T_BF16(nm, cnt, a) {.name = nm, .kind = OC_BF16, .n = (cnt), .amp = (a)}
#define OC_T_U8(nm, cnt, l, h) {.name = nm, .kind = OC_U8, .n = (cnt), .lo = (l), .hi = (h)}
#define OC_T_DOUT(nm, o) {.name = nm, .kind = OC_DOUT, .of = (o)}
#define OC_T_DIN(nm, o) {.name = nm, .kind = OC_DIN, .of = (o)}
#define OC_T_DIO(nm, o) {.name = nm, .kind = OC_DIO, .of = (o)}
/* (gradient tensors take n from the tensor they are the gradient of) */

/* The cases files (one function per family of ops). */
void oc_cases_base(oc_list *l);   /* memory, queues, elementwise, matmul, optimizer */
void oc_cases_llama(oc_list *l);  /* embedding, norms, rope, attention, swiglu, xent */
void oc_cases_dit(oc_list *l);    /* layernorm, modulate, gate, activations, bias, mse, layout */
void oc_cases_quant(oc_list *l);  /* the quantized-weight ops */

/* fp64 helpers for references */
void oc_ref_matmul(double *C, const double *A, const double *B, int64_t M, int64_t N, int64_t K,
                   int ta, int tb, double alpha, double beta);

#endif
