/* The op-case table's runner (op_case.h): every row on one backend.
 *   test_op_table cpu    the CPU backend under the kernel TZ_CPU_KERNEL names (or the one this
 *                        CPU chooses); skip (77) where this CPU cannot run it
 *   test_op_table cuda   the CUDA module (TZ_CUDA_MODULE: the real one, or its CPU emulation);
 *                        skip (77) without a device. A device backend with bf16 GEMM operands
 *                        runs the OC_GEMM rows a second time with them.
 * Also checks that every op of TZ_BACKEND_OPS is named by a row, and that the rows leave the
 * backend's live bytes where they found them. One ok/FAIL line per row and pass. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/registry.h"
#include "core/backend.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "ops/op_case.h"
#include "tz_check.h"

static tz_rng g_rng;

oc_case *oc_add(oc_list *l, const oc_case *c) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->c = realloc(l->c, (size_t)l->cap * sizeof *l->c);
        if (!l->c) abort();
    }
    l->c[l->n] = *c;
    return &l->c[l->n++];
}

void oc_ref_matmul(double *C, const double *A, const double *B, int64_t M, int64_t N, int64_t K,
                   int ta, int tb, double alpha, double beta) {
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0.0;
            for (int64_t k = 0; k < K; k++)
                s += (ta ? A[k * M + i] : A[i * K + k]) * (tb ? B[j * K + k] : B[k * N + j]);
            C[i * N + j] = alpha * s + (beta == 0.0 ? 0.0 : beta * C[i * N + j]);
        }
}

/* ---- one row on one backend ---- */

static int64_t tensor_n(const oc_case *c, int i) {
    const oc_tensor *t = &c->t[i];
    return (t->kind == OC_DOUT || t->kind == OC_DIN || t->kind == OC_DIO) ? c->t[t->of].n : t->n;
}
static size_t esize(enum oc_kind k) {
    return k == OC_BF16 || k == OC_OUT16 ? 2 : k == OC_U8 ? 1 : 4;
}

static float urand(float amp) { return amp * (2.0f * tz_rng_uniform(&g_rng) - 1.0f); }
/* bf16 pass: float inputs made of bf16 values, so the operand rounding is exact */
static float mkval(float amp, int bf16) {
    float x = urand(amp);
    return bf16 ? tz_bf16_to_f32(tz_f32_to_bf16(x)) : x;
}

typedef struct {
    const oc_case *c;
    void *host[OC_MAXT];     /* the bytes uploaded */
    double *v0[OC_MAXT];     /* their values */
    double *work[OC_MAXT];   /* OUT and INOUT: the reference's results */
} state;

static void ref_run(state *s, oc_ref *R) {
    const oc_case *c = s->c;
    memset(R, 0, sizeof *R);
    R->c = c;
    for (int i = 0; i < c->nt; i++) {
        int64_t n = tensor_n(c, i);
        R->raw[i] = s->host[i];
        if (c->t[i].kind == OC_INOUT) {
            memcpy(s->work[i], s->v0[i], (size_t)n * sizeof(double));
            R->v[i] = s->work[i];
        } else if (c->t[i].kind == OC_OUT || c->t[i].kind == OC_OUT16) {
            memset(s->work[i], 0, (size_t)n * sizeof(double));
            R->v[i] = s->work[i];
        } else {
            R->v[i] = s->v0[i];
        }
    }
    c->ref(R);
}

/* L = sum over the upstream gradients of sum(dout * out) at the current v0 */
static double loss_at(state *s) {
    oc_ref R;
    ref_run(s, &R);
    const oc_case *c = s->c;
    double L = 0.0;
    for (int i = 0; i < c->nt; i++) {
        if (c->t[i].kind != OC_DOUT && c->t[i].kind != OC_DIO) continue;
        int o = c->t[i].of;
        for (int64_t k = 0; k < c->t[o].n; k++) L += s->v0[i][k] * R.v[o][k];
    }
    return L;
}

static double relerr_d(const double *got, const double *ref, int64_t n, int64_t stride) {
    double e = 0.0, sc = 0.0;
    for (int64_t k = 0; k < n; k += stride) {
        double df = fabs(got[k] - ref[k]);
        if (!(df <= e)) e = df; /* NaN propagates */
        if (fabs(ref[k]) > sc) sc = fabs(ref[k]);
    }
    return e / (sc > 1e-30 ? sc : 1e-30);
}

/* Runs row c on be; bf16: the pass with bf16 GEMM operands. Prints its line. */
static void run_case(tz_backend *be, const char *tag, const oc_case *c, int bf16) {
    char msg[512] = "";
    size_t live0 = be->live_bytes;
    if (c->custom) {
        int bad = c->custom(be, c, msg, sizeof msg);
        check(!bad && be->live_bytes == live0, "[%s] %s%s%s", tag, c->name, bad ? ": " : "",
              bad ? msg : (be->live_bytes != live0 ? ": live bytes not restored" : ""));
        return;
    }
    state s = {.c = c};
    oc_run r = {.c = c, .be = be};
    r.dscal = 0.5f + tz_rng_uniform(&g_rng);
    if (bf16) r.dscal = tz_bf16_to_f32(tz_f32_to_bf16(r.dscal));
    for (int i = 0; i < c->nt; i++) {
        const oc_tensor *t = &c->t[i];
        int64_t n = tensor_n(c, i);
        size_t bytes = (size_t)(n > 0 ? n : 1) * esize(t->kind);
        s.host[i] = calloc(1, bytes);
        s.v0[i] = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
        s.work[i] = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
        float amp = t->amp > 0.0f ? t->amp : 1.0f;
        for (int64_t k = 0; k < n; k++) {
            double v = 0.0;
            switch (t->kind) {
            case OC_IN: case OC_INOUT:
                v = ((float *)s.host[i])[k] = (t->flags & OC_POSITIVE) ? fabsf(mkval(amp, bf16))
                                                                       : mkval(amp, bf16);
                if (t->mid != 0.0f) {
                    float x = t->mid + ((float *)s.host[i])[k];
                    v = ((float *)s.host[i])[k] = bf16 ? tz_bf16_to_f32(tz_f32_to_bf16(x)) : x;
                }
                break;
            case OC_OUT:
                ((float *)s.host[i])[k] = NAN;
                break;
            case OC_OUT16:
                ((uint16_t *)s.host[i])[k] = 0xffff; /* NaN */
                break;
            case OC_I32: {
                int32_t x = t->lo + (int32_t)(tz_rng_uniform(&g_rng) * (float)(t->hi - t->lo));
                if (x >= t->hi) x = t->hi - 1;
                v = ((int32_t *)s.host[i])[k] = x;
                break;
            }
            case OC_BF16: {
                uint16_t h = tz_f32_to_bf16(urand(amp));
                ((uint16_t *)s.host[i])[k] = h;
                v = tz_bf16_to_f32(h);
                break;
            }
            case OC_U8: {
                int lo = t->hi > t->lo ? t->lo : 0, hi = t->hi > t->lo ? t->hi : 256;
                int x = lo + (int)(tz_rng_uniform(&g_rng) * (float)(hi - lo));
                v = ((uint8_t *)s.host[i])[k] = (uint8_t)(x >= hi ? hi - 1 : x);
                break;
            }
            case OC_DOUT:
                v = ((float *)s.host[i])[k] = (t->flags & OC_UNIFORM) ? r.dscal : mkval(1.0f, bf16);
                break;
            case OC_DIN:
                if (t->flags & OC_WRITES) ((float *)s.host[i])[k] = NAN;
                else v = ((float *)s.host[i])[k] = mkval(1.0f, bf16);
                break;
            case OC_DIO:
                v = ((float *)s.host[i])[k] = mkval(1.0f, bf16);
                break;
            }
            s.v0[i][k] = v;
        }
        r.d[i] = be->alloc(be, bytes);
        be->upload(be, r.d[i], s.host[i], bytes);
    }

    /* forward */
    c->fwd(&r);
    be->sync(be);
    oc_ref R;
    ref_run(&s, &R);
    double efwd = 0.0;
    const char *wfwd = "";
    for (int i = 0; i < c->nt; i++) {
        const oc_tensor *t = &c->t[i];
        if ((t->kind != OC_OUT && t->kind != OC_INOUT && t->kind != OC_OUT16) ||
            (t->flags & OC_NOCHECK))
            continue;
        int64_t n = t->n;
        float *g = malloc((size_t)(n > 0 ? n : 1) * 4);
        double *gd = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
        be->download(be, g, r.d[i], (size_t)n * esize(t->kind));
        for (int64_t k = 0; k < n; k++)
            gd[k] = t->kind == OC_OUT16 ? tz_bf16_to_f32(((const uint16_t *)g)[k]) : g[k];
        double e = relerr_d(gd, R.v[i], n, 1);
        if (!(e <= efwd) && efwd == efwd) efwd = e, wfwd = t->name; /* a NaN stays */
        free(g), free(gd);
    }
    if (c->flags & OC_RET) {
        double e = fabs(r.ret - R.ret) / (fabs(R.ret) > 1e-30 ? fabs(R.ret) : 1e-30);
        if (!(e <= efwd) && efwd == efwd) efwd = e, wfwd = "returned value";
    }
    double tf = bf16 && c->tol_fwd_bf16 > 0 ? c->tol_fwd_bf16 : c->tol_fwd;
    double tb = bf16 && c->tol_bwd_bf16 > 0 ? c->tol_bwd_bf16 : c->tol_bwd;

    /* backward */
    double ebwd = 0.0;
    const char *wbwd = "";
    if (c->bwd) {
        c->bwd(&r);
        be->sync(be);
        for (int i = 0; i < c->nt; i++) {
            const oc_tensor *t = &c->t[i];
            if (t->kind != OC_DIN && t->kind != OC_DIO) continue;
            int j = t->of;
            const int64_t pts = c->fd_points > 0 ? c->fd_points : OC_FD_POINTS;
            int64_t n = c->t[j].n, stride = (n + pts - 1) / pts;
            float *g = malloc((size_t)(n > 0 ? n : 1) * 4);
            double *got = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
            double *fd = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
            const int b16 = t->kind == OC_DIN && (t->flags & OC_DIN16);
            be->download(be, g, r.d[i], (size_t)n * (b16 ? 2 : 4));
            for (int64_t k = n - 1; b16 && k >= 0; k--) /* widened in place, from the end */
                g[k] = tz_bf16_to_f32(((const uint16_t *)g)[k]);
            int adds = t->kind == OC_DIN && !(t->flags & OC_WRITES);
            int64_t m = 0; /* elements 0, stride, 2 stride, ... and the last one */
            for (int64_t k = 0; k < n; k = k + stride < n || k == n - 1 ? k + stride : n - 1) {
                got[m] = (double)g[k] - (adds ? s.v0[i][k] : 0.0);
                double x0 = s.v0[j][k], h = 1e-4 * (fabs(x0) > 1.0 ? fabs(x0) : 1.0);
                s.v0[j][k] = x0 + h;
                double lp = loss_at(&s);
                s.v0[j][k] = x0 - h;
                double lm = loss_at(&s);
                s.v0[j][k] = x0;
                fd[m++] = (lp - lm) / (2.0 * h);
            }
            double e = relerr_d(got, fd, m, 1);
            if (!(e <= ebwd) && ebwd == ebwd) ebwd = e, wbwd = t->name; /* a NaN stays */
            free(g), free(got), free(fd);
        }
    }
    for (int i = 0; i < c->nt; i++) {
        be->release(be, r.d[i]);
        free(s.host[i]), free(s.v0[i]), free(s.work[i]);
    }
    int ok = efwd <= tf && (!c->bwd || ebwd <= tb) && be->live_bytes == live0;
    char b[160] = "";
    if (c->bwd) snprintf(b, sizeof b, ", bwd %.2e (tol %.0e%s%s)", ebwd, tb, *wbwd ? ", worst " : "", wbwd);
    check(ok, "[%s] %s: fwd %.2e (tol %.0e%s%s)%s%s", tag, c->name, efwd, tf,
          *wfwd ? ", worst " : "", wfwd, b, be->live_bytes != live0 ? ", live bytes not restored" : "");
}

/* ---- coverage ---- */

#define OC_OP_NAME(op) #op,
static const char *const k_ops[] = {TZ_BACKEND_OPS(OC_OP_NAME)};

static int names_op(const char *ops, const char *op) {
    size_t n = strlen(op);
    for (const char *p = ops; (p = strstr(p, op)); p += n)
        if ((p == ops || p[-1] == ' ') && (p[n] == 0 || p[n] == ' ')) return 1;
    return 0;
}

static void check_coverage(const oc_list *l) {
    int missing = 0;
    char list[1024] = "";
    for (size_t i = 0; i < sizeof k_ops / sizeof *k_ops; i++) {
        /* destroy: the runner calls it on the backend when the rows are done */
        int found = !strcmp(k_ops[i], "destroy");
        for (int j = 0; j < l->n && !found; j++) found = names_op(l->c[j].ops, k_ops[i]);
        if (!found) {
            missing++;
            if (strlen(list) + strlen(k_ops[i]) + 3 < sizeof list) {
                if (*list) strcat(list, ", ");
                strcat(list, k_ops[i]);
            }
        }
    }
    /* every op a row names is an op of the table */
    int unknown = 0;
    for (int j = 0; j < l->n; j++) {
        char buf[512];
        snprintf(buf, sizeof buf, "%s", l->c[j].ops);
        for (char *tok = strtok(buf, " "); tok; tok = strtok(NULL, " ")) {
            int known = 0;
            for (size_t i = 0; i < sizeof k_ops / sizeof *k_ops && !known; i++)
                known = !strcmp(tok, k_ops[i]);
            if (!known) {
                unknown++;
                printf("     row '%s' names '%s', not an op of the table\n", l->c[j].name, tok);
            }
        }
    }
    check(missing == 0 && unknown == 0,
          "every one of the %zu ops of TZ_BACKEND_OPS is named by a row of the %d (%s%s)",
          sizeof k_ops / sizeof *k_ops, l->n, missing ? "missing: " : "none missing",
          missing ? list : "");
}

int main(int argc, char **argv) {
    const char *kind = argc > 1 ? argv[1] : "cpu";
    const char *only = argc > 2 ? argv[2] : NULL; /* rows whose name contains this */
    tz_backend *be;
    char tag[64];
    if (!strcmp(kind, "cpu")) {
        const char *k = getenv("TZ_CPU_KERNEL");
        if (k && *k && strcmp(k, "auto") && !tz_cpu_kernel_usable(k)) {
            printf("skip: this CPU cannot run the %s kernel\n", k);
            return 77;
        }
        be = tz_backend_create(TZ_DEVICE_CPU, 0, 2);
        snprintf(tag, sizeof tag, "cpu %s", tz_cpu_kernel_name());
    } else if (!strcmp(kind, "cuda")) {
        int n = tz_cuda_device_count();
        if (n <= 0) {
            printf("skip: %s\n", n < 0 ? "this build has no CUDA backend" : "no CUDA device");
            return 77;
        }
        be = tz_backend_create(TZ_DEVICE_CUDA, 0, 0);
        snprintf(tag, sizeof tag, "%s fp32", be->name);
    } else {
        fprintf(stderr, "usage: test_op_table cpu|cuda [ROW-SUBSTRING]\n");
        return 2;
    }
    g_rng = tz_rng_make(4242, 0, TZ_RNG_TEST, 0);
    oc_list l = {0};
    oc_cases_base(&l);
    oc_cases_llama(&l);
    oc_cases_dit(&l);
    oc_cases_quant(&l);
    check_coverage(&l);

    tz_backend_set_precision(be, TZ_PRECISION_FP32);
    for (int i = 0; i < l.n; i++)
        if ((!only || strstr(l.c[i].name, only)) &&
            !(be->device && (l.c[i].flags & (OC_DEVICE_BF16 | OC_HOST_ONLY))))
            run_case(be, tag, &l.c[i], 0);
    if (be->device && (be->matmul_dtypes & (1u << TZ_DT_BF16))) {
        tz_backend_set_precision(be, TZ_PRECISION_BF16);
        snprintf(tag, sizeof tag, "%s bf16", be->name);
        for (int i = 0; i < l.n; i++)
            if ((l.c[i].flags & OC_GEMM) && !(l.c[i].flags & OC_HOST_ONLY) &&
                (!only || strstr(l.c[i].name, only)))
                run_case(be, tag, &l.c[i], 1);
    }
    tz_backend_destroy(be);
    free(l.c);
    return tz_check_done("test_op_table");
}
