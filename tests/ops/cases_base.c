/* Rows of the op-case table (op_case.h): memory, queues and events; elementwise ops, bf16
 * conversions, the sum of squares and AdamW; the GEMMs (fp32 and bf16-stored B). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "ops/op_case.h"

/* ---- memory, queues, events: a row that checks itself, exactly ---- */

#define FAILIF(cond, ...)                   \
    do {                                    \
        if (cond) {                         \
            snprintf(msg, len, __VA_ARGS__); \
            bad = 1;                        \
            goto out;                       \
        }                                   \
    } while (0)

static int memory_row(tz_backend *be, const oc_case *c, char *msg, size_t len) {
    const size_t n = (size_t)c->p[0], bytes = n * 4;
    int bad = 0;
    size_t live0 = be->live_bytes;
    float *h = malloc(bytes), *h2 = malloc(bytes);
    float *a = be->alloc(be, bytes), *b = be->alloc(be, bytes);
    float *pin = be->host_alloc(be, bytes);
    void *ev = NULL, *ev2 = NULL;
    for (size_t i = 0; i < n; i++) h[i] = (float)i * 0.25f - 7.0f;
    FAILIF(be->live_bytes < live0 + 2 * bytes || be->peak_bytes < be->live_bytes,
           "live bytes %zu after two allocations of %zu from %zu (peak %zu)", be->live_bytes,
           bytes, live0, be->peak_bytes);
    FAILIF(((uintptr_t)a & 63) || ((uintptr_t)pin & 63), "alloc or host_alloc not 64-byte aligned");
    be->download(be, h2, a, bytes);
    for (size_t i = 0; i < n; i++) FAILIF(h2[i] != 0.0f, "alloc: element %zu is not zero", i);
    for (size_t i = 0; i < n; i++) FAILIF(pin[i] != 0.0f, "host_alloc: element %zu is not zero", i);
    be->upload(be, a, h, bytes);
    be->copy(be, b, a, bytes);
    be->sync(be);
    be->download(be, h2, b, bytes);
    FAILIF(memcmp(h, h2, bytes), "upload, copy, download: not the bytes uploaded");
    /* pinned upload on the copy queue, ordered after the compute queue by an event */
    memcpy(pin, h, bytes);
    for (size_t i = 0; i < n; i++) pin[i] += 1.0f;
    ev = be->event_mark(be, TZ_QUEUE_COMPUTE);
    be->event_wait(be, ev, TZ_QUEUE_COPY);
    be->upload_async(be, b, pin, bytes);
    ev2 = be->event_mark(be, TZ_QUEUE_COPY);
    be->event_wait(be, ev2, TZ_QUEUE_COMPUTE);
    be->event_wait(be, ev2, TZ_QUEUE_HOST);
    FAILIF(!be->event_done(be, ev2), "event_done is 0 after the host waited for it");
    be->download(be, h2, b, bytes);
    FAILIF(memcmp(pin, h2, bytes), "upload_async from pinned memory: not the bytes given");
    be->event_free(be, ev2);
    ev2 = NULL;
    /* download_async into a registered buffer */
    be->host_register(be, h2, bytes);
    memset(h2, 0, bytes);
    be->download_async(be, h2, a, bytes);
    ev2 = be->event_mark(be, TZ_QUEUE_COPY);
    be->event_wait(be, ev2, TZ_QUEUE_HOST);
    be->host_unregister(be, h2);
    FAILIF(memcmp(h, h2, bytes), "download_async into a registered buffer: not the bytes");
    tz_device_info di;
    memset(&di, 0, sizeof di);
    be->device_info(be, &di);
    FAILIF(!di.name[0] || (be->device ? di.ordinal < 0 : di.ordinal != -1) ||
               di.free_bytes > di.total_bytes,
           "device_info: ordinal %d, name '%s', free %zu of %zu", di.ordinal, di.name,
           di.free_bytes, di.total_bytes);
out:
    if (ev) be->event_free(be, ev);
    if (ev2) be->event_free(be, ev2);
    be->host_free(be, pin);
    be->release(be, a);
    be->release(be, b);
    free(h), free(h2);
    if (!bad && be->live_bytes != live0) {
        snprintf(msg, len, "live bytes %zu after release, %zu before", be->live_bytes, live0);
        bad = 1;
    }
    return bad;
}

static void add_memory(oc_list *l) {
    oc_case c = {.ops = "alloc release upload download copy sync host_alloc host_free "
                        "host_register host_unregister upload_async download_async event_mark "
                        "event_wait event_done event_free device_info",
                 .p = {1000}, .custom = memory_row};
    snprintf(c.name, sizeof c.name, "memory, queues and events (%d floats)", 1000);
    oc_add(l, &c);
}


/* ---- elementwise ---- */

static void fill_fwd(oc_run *r) { r->be->fill(r->be, OCF(r, 0), (float)OCS(r, 0), OCP(r, 0)); }
static void fill_ref(oc_ref *r) {
    for (int64_t i = 0; i < r->c->p[0]; i++) r->v[0][i] = (double)(float)r->c->s[0];
}
static void scale_fwd(oc_run *r) { r->be->scale(r->be, OCF(r, 0), (float)OCS(r, 0), OCP(r, 0)); }
static void scale_ref(oc_ref *r) {
    for (int64_t i = 0; i < r->c->p[0]; i++) r->v[0][i] *= (double)(float)r->c->s[0];
}
/* y += a x; its backward dx += a dy through axpy again */
static void axpy_fwd(oc_run *r) {
    r->be->axpy(r->be, OCF(r, 1), (float)OCS(r, 0), OCF(r, 0), OCP(r, 0));
}
static void axpy_ref(oc_ref *r) {
    for (int64_t i = 0; i < r->c->p[0]; i++) r->v[1][i] += (double)(float)r->c->s[0] * r->v[0][i];
}
static void axpy_bwd(oc_run *r) {
    r->be->axpy(r->be, OCF(r, 3), (float)OCS(r, 0), OCF(r, 2), OCP(r, 0));
}

/* x -> bf16 -> fp32: the round trip is the rounding to nearest even */
static void bf16_fwd(oc_run *r) {
    int64_t n = OCP(r, 0);
    uint16_t *h = r->be->alloc(r->be, (size_t)n * 2);
    r->be->to_bf16(r->be, h, OCF(r, 0), n);
    r->be->from_bf16(r->be, OCF(r, 1), h, n);
    r->be->release(r->be, h);
}
/* the nearest of the two bf16 values around x (8 significant bits; below 2^-126, subnormal,
 * multiples of 2^-133), ties to the even one */
static double rne_bf16(double x) {
    if (x == 0.0 || !isfinite(x)) return x;
    int e;
    frexp(x, &e);                    /* |x| in [2^(e-1), 2^e) */
    double ulp = ldexp(1.0, e - 8 < -133 ? -133 : e - 8); /* the spacing of bf16 values there */
    double lo = floor(x / ulp) * ulp, hi = lo + ulp;
    double dl = x - lo, dh = hi - x;
    if (dl < dh) return lo;
    if (dh < dl) return hi;
    return fmod(fabs(lo / ulp), 2.0) == 0.0 ? lo : hi;
}
static void bf16_ref(oc_ref *r) {
    for (int64_t i = 0; i < r->c->p[0]; i++) r->v[1][i] = rne_bf16(r->v[0][i]);
}

/* special values of the conversions, exactly: ties to even, overflow, Inf, NaN, subnormals */
static int bf16_special_row(tz_backend *be, const oc_case *c, char *msg, size_t len) {
    static const float x[] = {
        1.0f + 0x1p-8f,           /* tie between 1 and 1 + 2^-7: to 1 (even) */
        1.0f + 3 * 0x1p-8f,       /* tie between 1 + 2^-7 and 1 + 2^-6: to 1 + 2^-6 (even) */
        1.0f + 0x1p-8f + 0x1p-20f, /* just above the tie: up */
        -2.5f, 0.0f, -0.0f, 0x1.ffp+127f /* halfway past the largest bf16, odd: +Inf */,
        INFINITY, -INFINITY, 1e-40f /* subnormal */, 0x1p-133f};
    const int n = (int)(sizeof x / sizeof *x);
    const float want[] = {1.0f, 1.0f + 0x1p-6f, 1.0f + 0x1p-7f, -2.5f, 0.0f, -0.0f, INFINITY,
                          INFINITY, -INFINITY, (float)rne_bf16(1e-40f), 0x1p-133f};
    float *d = be->alloc(be, sizeof x + 4), *back = be->alloc(be, sizeof x + 4);
    uint16_t *h = be->alloc(be, sizeof x);
    float y[16], nanin = NAN;
    be->upload(be, d, x, sizeof x);
    be->upload(be, d + n, &nanin, 4);
    be->to_bf16(be, h, d, n + 1);
    be->from_bf16(be, back, h, n + 1);
    be->download(be, y, back, (size_t)(n + 1) * 4);
    be->release(be, d), be->release(be, back), be->release(be, h);
    for (int i = 0; i < n; i++)
        if (memcmp(&y[i], &want[i], 4)) {
            snprintf(msg, len, "%a -> %a, expected %a", (double)x[i], (double)y[i], (double)want[i]);
            return 1;
        }
    if (!isnan(y[n])) {
        snprintf(msg, len, "NaN -> %a", (double)y[n]);
        return 1;
    }
    (void)c;
    return 0;
}

/* sum of squares, returned in double */
static void sumsq_fwd(oc_run *r) { r->ret = r->be->sumsq(r->be, OCF(r, 0), OCP(r, 0)); }
static void sumsq_ref(oc_ref *r) {
    double s = 0.0;
    for (int64_t i = 0; i < r->c->p[0]; i++) s += r->v[0][i] * r->v[0][i];
    r->ret = s;
}

/* AdamW: tensors 0 w, 1 m, 2 v (in place), 3 g, 4 decay flags; s: the tz_adamw_args */
static tz_adamw_args adamw_args(const oc_case *c) {
    return (tz_adamw_args){(float)c->s[0], (float)c->s[1], (float)c->s[2], (float)c->s[3],
                           (float)c->s[4], (float)c->s[5], (float)c->s[6], (float)c->s[7]};
}
static void adamw_fwd(oc_run *r) {
    tz_adamw_args a = adamw_args(r->c);
    r->be->adamw(r->be, OCF(r, 0), OCF(r, 1), OCF(r, 2), OCF(r, 3), OCB(r, 4), OCP(r, 0), &a);
}
static void adamw_ref(oc_ref *r) {
    tz_adamw_args a = adamw_args(r->c);
    for (int64_t i = 0; i < r->c->p[0]; i++) {
        double g = r->v[3][i] * a.grad_scale;
        double m = a.beta1 * r->v[1][i] + (1.0 - (double)a.beta1) * g;
        double v = a.beta2 * r->v[2][i] + (1.0 - (double)a.beta2) * g * g;
        r->v[1][i] = m, r->v[2][i] = v;
        double upd = m * a.c1 / (sqrt(v * a.c2) + a.eps);
        double wd = r->v[4][i] != 0.0 ? a.weight_decay : 0.0;
        r->v[0][i] -= a.lr * (upd + wd * r->v[0][i]);
    }
}

static void add_elementwise(oc_list *l, int64_t n) {
    oc_case c = {.ops = "fill", .nt = 1, .p = {n}, .s = {-0.3}, .fwd = fill_fwd, .ref = fill_ref,
                 .tol_fwd = 0.0};
    c.t[0] = (oc_tensor)OC_T_OUT("x", n);
    snprintf(c.name, sizeof c.name, "fill n %lld", (long long)n);
    oc_add(l, &c);
    /* one rounding of the product */
    c = (oc_case){.ops = "scale", .nt = 1, .p = {n}, .s = {-1.7}, .fwd = scale_fwd,
                  .ref = scale_ref, .tol_fwd = 1e-7};
    c.t[0] = (oc_tensor)OC_T_INOUT("x", n);
    snprintf(c.name, sizeof c.name, "scale n %lld", (long long)n);
    oc_add(l, &c);
    /* a product and a sum: two roundings (one where the device fuses them) */
    c = (oc_case){.ops = "axpy", .nt = 4, .p = {n}, .s = {0.7}, .fwd = axpy_fwd, .ref = axpy_ref,
                  .bwd = axpy_bwd, .tol_fwd = 2e-7, .tol_bwd = 2e-7};
    c.t[0] = (oc_tensor)OC_T_IN("x", n);
    c.t[1] = (oc_tensor)OC_T_INOUT("y", n);
    c.t[2] = (oc_tensor)OC_T_DOUT("dy", 1);
    c.t[3] = (oc_tensor)OC_T_DIN("dx", 0);
    snprintf(c.name, sizeof c.name, "axpy n %lld", (long long)n);
    oc_add(l, &c);
    /* exact: the rounding is the specification */
    c = (oc_case){.ops = "to_bf16 from_bf16", .nt = 2, .p = {n}, .fwd = bf16_fwd, .ref = bf16_ref,
                  .tol_fwd = 0.0};
    c.t[0] = (oc_tensor)OC_T_INA("x", n, 300.0f);
    c.t[1] = (oc_tensor)OC_T_OUT("bf16(x)", n);
    snprintf(c.name, sizeof c.name, "to_bf16, from_bf16 n %lld", (long long)n);
    oc_add(l, &c);
    /* squares of floats are exact in double; only the order of the double sum differs */
    c = (oc_case){.ops = "sumsq", .nt = 1, .p = {n}, .flags = OC_RET, .fwd = sumsq_fwd,
                  .ref = sumsq_ref, .tol_fwd = 1e-12};
    c.t[0] = (oc_tensor)OC_T_INA("x", n, 5.0f);
    snprintf(c.name, sizeof c.name, "sumsq n %lld", (long long)n);
    oc_add(l, &c);
}

static void add_adamw(oc_list *l, int64_t n, double grad_scale) {
    /* lr, beta1, beta2, eps, weight_decay, c1 = 1/(1-b1^t), c2 = 1/(1-b2^t) at t = 3,
     * grad_scale. fp32 arithmetic: a few roundings of each moment, one of the division and
     * the square root: ulps of each result */
    oc_case c = {.ops = "adamw", .nt = 5, .p = {n},
                 .s = {1e-2, 0.9, 0.999, 1e-8, 0.1, 1.0 / (1.0 - 0.729),
                       1.0 / (1.0 - 0.997002999), grad_scale},
                 .fwd = adamw_fwd, .ref = adamw_ref, .tol_fwd = 1e-6};
    c.t[0] = (oc_tensor)OC_T_INOUT("w", n);
    c.t[1] = (oc_tensor)OC_T_INOUT("m", n);
    c.t[2] = (oc_tensor){.name = "v", .kind = OC_INOUT, .n = n, .amp = 0.01f, .flags = OC_POSITIVE};
    c.t[3] = (oc_tensor)OC_T_INA("g", n, 0.5f);
    c.t[4] = (oc_tensor)OC_T_U8("decay", n, 0, 2);
    snprintf(c.name, sizeof c.name, "adamw n %lld grad_scale %g", (long long)n, grad_scale);
    oc_add(l, &c);
}

/* ---- matmul: C = alpha op(A) op(B) + beta C; backward through matmul itself ----
 * tensors: 0 A, 1 B, 2 C (INOUT: beta C is its start), 3 dC, 4 dA, 5 dB */

static void mm_fwd(oc_run *r) {
    r->be->matmul(r->be, OCF(r, 2), OCF(r, 0), OCF(r, 1), OCP(r, 0), OCP(r, 1), OCP(r, 2),
                  (int)OCP(r, 3), (int)OCP(r, 4), (float)OCS(r, 0), (float)OCS(r, 1));
}
static void mm_ref(oc_ref *r) {
    const oc_case *c = r->c;
    oc_ref_matmul(r->v[2], r->v[0], r->v[1], c->p[0], c->p[1], c->p[2], (int)c->p[3],
                  (int)c->p[4], c->s[0], c->s[1]);
}
/* dA += alpha dC op(B)^T (stored as A is), dB += alpha op(A)^T dC (stored as B is) */
static void mm_bwd(oc_run *r) {
    tz_backend *be = r->be;
    int64_t M = OCP(r, 0), N = OCP(r, 1), K = OCP(r, 2);
    int ta = (int)OCP(r, 3), tb = (int)OCP(r, 4);
    float al = (float)OCS(r, 0);
    if (!ta) be->matmul(be, OCF(r, 4), OCF(r, 3), OCF(r, 1), M, K, N, 0, !tb, al, 1.0f);
    else be->matmul(be, OCF(r, 4), OCF(r, 1), OCF(r, 3), K, M, N, tb, 1, al, 1.0f);
    if (!tb) be->matmul(be, OCF(r, 5), OCF(r, 0), OCF(r, 3), K, N, M, !ta, 0, al, 1.0f);
    else be->matmul(be, OCF(r, 5), OCF(r, 3), OCF(r, 0), N, K, M, 1, ta, al, 1.0f);
}

static void add_matmul(oc_list *l, int64_t M, int64_t N, int64_t K, int ta, int tb, double alpha,
                       double beta, int with_bwd) {
    oc_case c = {.ops = "matmul", .nt = 6, .p = {M, N, K, ta, tb}, .s = {alpha, beta},
                 /* the CPU's cache-blocking shapes (over a million products) stay on the CPU */
                 .flags = OC_GEMM | ((double)M * N * K > 1e6 ? OC_HOST_ONLY : 0), .fwd = mm_fwd,
                 .ref = mm_ref,
                 .bwd = with_bwd ? mm_bwd : NULL,
                 /* K <= 96 products summed in another order; bf16: the operands are bf16
                  * values, so only the fp32 sums differ */
                 .tol_fwd = 1e-5, .tol_bwd = 1e-5};
    c.t[0] = (oc_tensor)OC_T_IN("A", M * K);
    c.t[1] = (oc_tensor)OC_T_IN("B", K * N);
    /* beta = 0 overwrites C: it starts as NaN, which must not come through */
    c.t[2] = beta == 0.0 ? (oc_tensor)OC_T_OUT("C", M * N) : (oc_tensor)OC_T_INOUT("C", M * N);
    c.t[3] = (oc_tensor)OC_T_DOUT("dC", 2);
    c.t[4] = (oc_tensor)OC_T_DIN("dA", 0);
    c.t[5] = (oc_tensor)OC_T_DIN("dB", 1);
    if (!with_bwd) c.nt = 3;
    snprintf(c.name, sizeof c.name, "matmul M %lld N %lld K %lld trans %d%d alpha %g beta %g",
             (long long)M, (long long)N, (long long)K, ta, tb, alpha, beta);
    oc_add(l, &c);
}


/* ---- matmul_bias: C = A W^T + bias, W fp32 or bf16 (p[3]), A fp32 or bf16 (p[4]), C fp32
 * or bf16 (p[5]: the bf16 pass only, OC_DEVICE_BF16) ----
 * tensors: 0 A [M, K], 1 W [N, K], 2 bias [N], 3 C (NaN before: written) */
static void mb_fwd(oc_run *r) {
    r->be->matmul_bias(r->be, OCF(r, 3), r->d[0], (int)OCP(r, 4), r->d[1], (int)OCP(r, 3),
                       OCF(r, 2), OCP(r, 0), OCP(r, 1), OCP(r, 2), (int)OCP(r, 5));
}
static void mb_ref(oc_ref *r) {
    const int64_t M = r->c->p[0], N = r->c->p[1], K = r->c->p[2];
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double acc = r->v[2][n];
            for (int64_t k = 0; k < K; k++) acc += r->v[0][m * K + k] * r->v[1][n * K + k];
            r->v[3][m * N + n] = acc;
        }
}
static void add_matmul_bias(oc_list *l, int64_t M, int64_t N, int64_t K, int w16, int a16) {
    oc_case c = {.ops = "matmul_bias", .nt = 4, .p = {M, N, K, w16, a16, 0}, .flags = OC_GEMM,
                 .fwd = mb_fwd, .ref = mb_ref,
                 /* K products summed in another order; bf16: the operands and the bias are
                  * bf16 values in that pass (its one extra column exact), so only the fp32 sums
                  * differ. Leaving the bias out moves C by up to 4 */
                 .tol_fwd = 1e-5};
    c.t[0] = a16 ? (oc_tensor)OC_T_BF16("A", M * K, 1.0f) : (oc_tensor)OC_T_IN("A", M * K);
    c.t[1] = w16 ? (oc_tensor)OC_T_BF16("W", N * K, 1.0f) : (oc_tensor)OC_T_IN("W", N * K);
    c.t[2] = (oc_tensor)OC_T_INA("bias", N, 4.0f);
    c.t[3] = (oc_tensor)OC_T_OUT("C", M * N);
    snprintf(c.name, sizeof c.name, "matmul_bias M %lld N %lld K %lld, A %s, W %s", (long long)M,
             (long long)N, (long long)K, a16 ? "bf16" : "fp32", w16 ? "bf16" : "fp32");
    oc_add(l, &c);
}
/* ---- matmul_lora: C = A W^T + s h B^T (+ bias), A, W fp32 or bf16 (p[4], p[3]), rank p[5],
 * a bias where p[6]; s[0] the scale ----
 * tensors: 0 A [M, K], 1 W [N, K], 2 h [M, r], 3 B [N, r], 4 bias [N], 5 C (written) */
static void ml_fwd(oc_run *r) {
    r->be->matmul_lora(r->be, OCF(r, 5), r->d[0], (int)OCP(r, 4), r->d[1], (int)OCP(r, 3),
                       OCF(r, 2), OCF(r, 3), OCP(r, 5), (float)OCS(r, 0),
                       OCP(r, 6) ? OCF(r, 4) : NULL, OCP(r, 0), OCP(r, 1), OCP(r, 2));
}
static void ml_ref(oc_ref *r) {
    const int64_t M = r->c->p[0], N = r->c->p[1], K = r->c->p[2], R = r->c->p[5];
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double acc = r->c->p[6] ? r->v[4][n] : 0.0, lo = 0.0;
            for (int64_t k = 0; k < K; k++) acc += r->v[0][m * K + k] * r->v[1][n * K + k];
            for (int64_t k = 0; k < R; k++) lo += r->v[2][m * R + k] * r->v[3][n * R + k];
            r->v[5][m * N + n] = acc + r->c->s[0] * lo;
        }
}
static void add_matmul_lora(oc_list *l, int64_t M, int64_t N, int64_t K, int64_t R, double sc,
                            int bias, int w16, int a16, double tol_bf16) {
    oc_case c = {.ops = "matmul_lora", .nt = 6, .p = {M, N, K, w16, a16, R, bias},
                 .s = {sc}, .flags = OC_GEMM, .fwd = ml_fwd, .ref = ml_ref,
                 /* K + r products summed in another order; with bf16 operands the inputs are
                  * bf16 values, so the folded columns are exact where s B is (s a power of 2)
                  * and within 2^-9 of each s B otherwise (tol_bf16). Leaving LoRA or the bias
                  * out moves C by the order of 1 */
                 .tol_fwd = 1e-5, .tol_fwd_bf16 = tol_bf16};
    c.t[0] = a16 ? (oc_tensor)OC_T_BF16("A", M * K, 1.0f) : (oc_tensor)OC_T_IN("A", M * K);
    c.t[1] = w16 ? (oc_tensor)OC_T_BF16("W", N * K, 1.0f) : (oc_tensor)OC_T_IN("W", N * K);
    c.t[2] = (oc_tensor)OC_T_INA("h", M * (R > 0 ? R : 1), 2.0f);
    c.t[3] = (oc_tensor)OC_T_INA("B", N * (R > 0 ? R : 1), 1.0f);
    c.t[4] = (oc_tensor)OC_T_INA("bias", N, 4.0f);
    c.t[5] = (oc_tensor)OC_T_OUT("C", M * N);
    snprintf(c.name, sizeof c.name,
             "matmul_lora M %lld N %lld K %lld rank %lld scale %g%s, A %s, W %s", (long long)M,
             (long long)N, (long long)K, (long long)R, sc, bias ? ", a bias" : "",
             a16 ? "bf16" : "fp32", w16 ? "bf16" : "fp32");
    oc_add(l, &c);
}
/* C written in bf16 (c_bf16): a device's bf16 GEMM epilogue, the CPU's rounding after it */
static void add_matmul_bias16(oc_list *l, int64_t M, int64_t N, int64_t K) {
    oc_case c = {.ops = "matmul_bias", .nt = 4, .p = {M, N, K, 1, 1, 1},
                 .flags = OC_GEMM | OC_DEVICE_BF16, .fwd = mb_fwd, .ref = mb_ref,
                 /* matmul_bias's, then C rounded to bf16: 2^-8 of each value at most */
                 .tol_fwd = 4e-3, .tol_fwd_bf16 = 4e-3};
    c.t[0] = (oc_tensor)OC_T_BF16("A", M * K, 1.0f);
    c.t[1] = (oc_tensor)OC_T_BF16("W", N * K, 1.0f);
    c.t[2] = (oc_tensor)OC_T_INA("bias", N, 4.0f);
    c.t[3] = (oc_tensor)OC_T_OUT16("C", M * N);
    snprintf(c.name, sizeof c.name, "matmul_bias M %lld N %lld K %lld, A and W bf16, C bf16",
             (long long)M, (long long)N, (long long)K);
    oc_add(l, &c);
}

/* ---- matmul_bw16: B stored in bf16; the backward's dA through matmul_bw16 on B^T ----
 * tensors: 0 A, 1 B (bf16), 2 C, 3 dC, 4 dA */
static void bw16_fwd(oc_run *r) {
    r->be->matmul_bw16(r->be, OCF(r, 2), OCF(r, 0), OCH(r, 1), OCP(r, 0), OCP(r, 1), OCP(r, 2),
                       (int)OCP(r, 3), (int)OCP(r, 4), (float)OCS(r, 0), (float)OCS(r, 1));
}
static void bw16_bwd(oc_run *r) { /* dA += alpha dC op(B)^T, for A stored [M, K] */
    r->be->matmul_bw16(r->be, OCF(r, 4), OCF(r, 3), OCH(r, 1), OCP(r, 0), OCP(r, 2), OCP(r, 1),
                       0, !(int)OCP(r, 4), (float)OCS(r, 0), 1.0f);
}

static void add_matmul_bw16(oc_list *l, int64_t M, int64_t N, int64_t K, int ta, int tb,
                            double alpha, double beta) {
    oc_case c = {.ops = "matmul_bw16", .nt = ta ? 4 : 5, .p = {M, N, K, ta, tb},
                 .s = {alpha, beta}, .flags = OC_GEMM, .fwd = bw16_fwd, .ref = mm_ref,
                 .bwd = ta ? NULL : bw16_bwd, .tol_fwd = 1e-5, .tol_bwd = 1e-5};
    c.t[0] = (oc_tensor)OC_T_IN("A", M * K);
    c.t[1] = (oc_tensor)OC_T_BF16("B", K * N, 1.0f);
    c.t[2] = beta == 0.0 ? (oc_tensor)OC_T_OUT("C", M * N) : (oc_tensor)OC_T_INOUT("C", M * N);
    c.t[3] = (oc_tensor)OC_T_DOUT("dC", 2);
    if (!ta) c.t[4] = (oc_tensor)OC_T_DIN("dA", 0);
    snprintf(c.name, sizeof c.name, "matmul_bw16 M %lld N %lld K %lld trans %d%d alpha %g beta %g",
             (long long)M, (long long)N, (long long)K, ta, tb, alpha, beta);
    oc_add(l, &c);
}

/* ---- matmul16: either operand stored in bf16 (forward only: its backward is matmul16 with
 * the same operands, the rows above cover the GEMMs) ----
 * p: M, N, K, ta, tb, a16, b16. tensors: 0 A, 1 B (each bf16 where asked), 2 C */
static void mm16_fwd(oc_run *r) {
    r->be->matmul16(r->be, OCF(r, 2), r->d[0], (int)OCP(r, 5), r->d[1], (int)OCP(r, 6),
                    OCP(r, 0), OCP(r, 1), OCP(r, 2), (int)OCP(r, 3), (int)OCP(r, 4),
                    (float)OCS(r, 0), (float)OCS(r, 1));
}

static void add_matmul16(oc_list *l, int64_t M, int64_t N, int64_t K, int ta, int tb, int a16,
                         int b16, double alpha, double beta) {
    oc_case c = {.ops = "matmul16", .nt = 3, .p = {M, N, K, ta, tb, a16, b16},
                 .s = {alpha, beta}, .flags = OC_GEMM, .fwd = mm16_fwd, .ref = mm_ref,
                 /* the bf16 operands' values exactly (the reference reads the same values):
                  * only the sums' order differs, as for matmul */
                 .tol_fwd = 1e-5};
    c.t[0] = a16 ? (oc_tensor)OC_T_BF16("A", M * K, 1.0f) : (oc_tensor)OC_T_IN("A", M * K);
    c.t[1] = b16 ? (oc_tensor)OC_T_BF16("B", K * N, 1.0f) : (oc_tensor)OC_T_IN("B", K * N);
    c.t[2] = beta == 0.0 ? (oc_tensor)OC_T_OUT("C", M * N) : (oc_tensor)OC_T_INOUT("C", M * N);
    snprintf(c.name, sizeof c.name,
             "matmul16 M %lld N %lld K %lld trans %d%d bf16 A %d B %d alpha %g beta %g",
             (long long)M, (long long)N, (long long)K, ta, tb, a16, b16, alpha, beta);
    oc_add(l, &c);
}

void oc_cases_base(oc_list *l) {
    add_memory(l);
    add_elementwise(l, 1000);
    add_elementwise(l, 1);
    oc_case sp = {.ops = "to_bf16 from_bf16", .custom = bf16_special_row};
    snprintf(sp.name, sizeof sp.name, "to_bf16, from_bf16: ties, overflow, Inf, NaN, subnormals");
    oc_add(l, &sp);
    add_adamw(l, 777, 1.0);
    add_adamw(l, 5, 0.25);
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) add_matmul(l, 37, 29, 45, ta, tb, 1.0, 0.0, 1);
    add_matmul(l, 5, 70, 96, 0, 1, 0.5, 1.0, 1); /* accumulate into C, alpha */
    add_matmul(l, 1, 1, 1, 0, 0, 2.0, -0.5, 1);
    /* the CPU's cache blocks: K past one block (256), M and N past several register tiles
     * and past a column strip; forward only (the backward is matmul itself) */
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) add_matmul(l, 200, 257, 520, ta, tb, 0.9, 0.5, 0);
    add_matmul(l, 130, 70, 300, 0, 0, 1.0, 0.0, 0);
    add_matmul(l, 5, 300, 3, 1, 0, 1.0, 0.0, 0);
    add_matmul(l, 3, 4, 0, 0, 0, 1.0, 0.5, 0); /* K = 0: C = beta C */
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) add_matmul_bw16(l, 19, 33, 40, ta, tb, 1.0, 0.0);
    add_matmul_bw16(l, 3, 64, 17, 0, 1, -0.5, 1.0);
    add_matmul_bias(l, 13, 37, 45, 0, 0); /* K + 8 = 53: rows of odd length */
    add_matmul_bias(l, 9, 24, 64, 1, 0);
    add_matmul_bias(l, 11, 29, 45, 0, 1); /* A kept in bf16 */
    add_matmul_bias16(l, 10, 27, 45);       /* C written in bf16 */
    add_matmul_bias(l, 7, 24, 64, 1, 1);
    /* LoRA along K: rank 5 and a bias (K + 6 -> 53 columns), rank 16 without (80), rank 7
     * and a bias with an inexact scale (one block of 8), rank 0 (matmul_bias) */
    add_matmul_lora(l, 13, 37, 45, 5, 2.0, 1, 0, 0, 0.0);
    add_matmul_lora(l, 9, 24, 64, 16, 0.5, 0, 1, 0, 0.0);
    add_matmul_lora(l, 11, 29, 45, 7, 0.75, 1, 0, 1, 4e-3);
    add_matmul_lora(l, 7, 24, 64, 0, 1.0, 1, 1, 1, 0.0);
    /* A, B or both in bf16, every transposition once */
    add_matmul16(l, 21, 35, 40, 0, 0, 1, 0, 1.0, 0.0);
    add_matmul16(l, 21, 35, 40, 1, 1, 1, 0, 0.5, 1.0);
    add_matmul16(l, 17, 24, 33, 0, 1, 1, 1, 1.0, 0.0);
    add_matmul16(l, 17, 24, 33, 1, 0, 0, 1, -1.0, 0.5);
}
