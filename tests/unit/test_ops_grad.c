/* CPU op table against fp64 references written here: forwards against naive formulas, every
 * backward gradient against central differences of the reference loss L = sum(out * R),
 * accumulation, matmul beta = 0 over NaN, and bit-identical results at 1, 2 and 3 threads.
 * Does not test speed, nor any CUDA table. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/registry.h"
#include "core/backend.h"
#include "core/rng.h"
#include "cpu/cpu_internal.h" /* tz_cpu_expf */
#include "tz_optest.h"

/* relerr over the elements i = 0, stride, 2*stride, ... */
static double relerr_strided(const float *got, const double *ref, int64_t n, int64_t stride) {
    int64_t m = (n + stride - 1) / stride;
    float *g = fbuf(m);
    double *r = dbuf(m);
    for (int64_t j = 0; j < m; j++) g[j] = got[j * stride], r[j] = ref[j * stride];
    double e = relerr(g, r, m);
    free(g), free(r);
    return e;
}

/* ---- fp64 references ---- */

static void ref_matmul(double *C, const double *A, const double *B, int64_t M, int64_t N,
                       int64_t K, int ta, int tb, double alpha, double beta) {
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0.0;
            for (int64_t k = 0; k < K; k++)
                s += (ta ? A[k * M + i] : A[i * K + k]) * (tb ? B[j * K + k] : B[k * N + j]);
            C[i * N + j] = alpha * s + (beta == 0.0 ? 0.0 : beta * C[i * N + j]);
        }
}

static void ref_rmsnorm(double *out, double *rstd, const double *x, const double *w, int64_t rows,
                        int64_t C, double eps) {
    for (int64_t r = 0; r < rows; r++) {
        double ss = 0.0;
        for (int64_t c = 0; c < C; c++) ss += x[r * C + c] * x[r * C + c];
        double rs = 1.0 / sqrt(ss / (double)C + eps);
        if (rstd) rstd[r] = rs;
        for (int64_t c = 0; c < C; c++) out[r * C + c] = x[r * C + c] * rs * w[c];
    }
}

static void ref_rope(double *y, const double *x, int64_t B, int64_t T, int64_t H, int64_t D,
                     double theta) {
    int64_t half = D / 2;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < H; h++) {
                const double *xr = x + ((b * T + t) * H + h) * D;
                double *yr = y + ((b * T + t) * H + h) * D;
                for (int64_t i = 0; i < half; i++) {
                    double ang = (double)t * pow(theta, -2.0 * (double)i / (double)D);
                    yr[i] = xr[i] * cos(ang) - xr[i + half] * sin(ang);
                    yr[i + half] = xr[i + half] * cos(ang) + xr[i] * sin(ang);
                }
            }
}

static void ref_attention(double *out, double *lse, const double *q, const double *k,
                          const double *v, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                          int64_t D, int causal) {
    double *p = dbuf(T);
    double scale = 1.0 / sqrt((double)D);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t t = 0; t < T; t++) {
                int64_t g = h / (Hq / Hkv), nk = causal ? t + 1 : T;
                const double *qr = q + ((b * T + t) * Hq + h) * D;
                double m = -INFINITY, sum = 0.0;
                for (int64_t s = 0; s < nk; s++) {
                    p[s] = scale * dot_d(qr, k + ((b * T + s) * Hkv + g) * D, D);
                    if (p[s] > m) m = p[s];
                }
                for (int64_t s = 0; s < nk; s++) sum += exp(p[s] - m);
                if (lse) lse[(b * Hq + h) * T + t] = m + log(sum);
                double *o = out + ((b * T + t) * Hq + h) * D;
                for (int64_t i = 0; i < D; i++) o[i] = 0.0;
                for (int64_t s = 0; s < nk; s++) {
                    double w = exp(p[s] - m) / sum;
                    const double *vr = v + ((b * T + s) * Hkv + g) * D;
                    for (int64_t i = 0; i < D; i++) o[i] += w * vr[i];
                }
            }
    free(p);
}

static double ref_xent_row(const double *l, int64_t V, int32_t t) {
    double m = -INFINITY, s = 0.0;
    for (int64_t j = 0; j < V; j++) m = l[j] > m ? l[j] : m;
    for (int64_t j = 0; j < V; j++) s += exp(l[j] - m);
    return m + log(s) - l[t];
}

/* ---- matmul ---- */

static void test_matmul_fwd(int64_t M, int64_t N, int64_t K) {
    for (int tr = 0; tr < 4; tr++) {
        int ta = tr >> 1, tb = tr & 1;
        float *A = frand(M * K, 1.0f), *B = frand(K * N, 1.0f), *C = frand(M * N, 1.0f);
        double *Ad = todbl(A, M * K), *Bd = todbl(B, K * N), *Cd = todbl(C, M * N);
        g_be->matmul(g_be, C, A, B, M, N, K, ta, tb, 0.7f, 0.3f);
        ref_matmul(Cd, Ad, Bd, M, N, K, ta, tb, 0.7, 0.3);
        char name[96];
        snprintf(name, sizeof name, "matmul fwd %lldx%lldx%lld tA=%d tB=%d a=.7 b=.3",
                 (long long)M, (long long)N, (long long)K, ta, tb);
        report(name, relerr(C, Cd, M * N), 1e-5);
        free(A), free(B), free(C), free(Ad), free(Bd), free(Cd);
    }
}

static void test_matmul_nan(void) {
    const int64_t M = 37, N = 29, K = 41;
    for (int tr = 0; tr < 4; tr++) {
        int ta = tr >> 1, tb = tr & 1;
        float *A = frand(M * K, 1.0f), *B = frand(K * N, 1.0f), *C = fbuf(M * N);
        for (int64_t i = 0; i < M * N; i++) C[i] = NAN;
        double *Ad = todbl(A, M * K), *Bd = todbl(B, K * N), *Cd = dbuf(M * N);
        g_be->matmul(g_be, C, A, B, M, N, K, ta, tb, 1.3f, 0.0f);
        ref_matmul(Cd, Ad, Bd, M, N, K, ta, tb, 1.3, 0.0);
        char name[96];
        snprintf(name, sizeof name, "matmul beta=0 over NaN C, tA=%d tB=%d", ta, tb);
        report(name, relerr(C, Cd, M * N), 1e-5);
        free(A), free(B), free(C), free(Ad), free(Bd), free(Cd);
    }
    /* K = 0: C = beta * C, and beta = 0 clears NaN */
    float C2[6] = {1, 2, 3, NAN, NAN, NAN}, dummy[1] = {0};
    double ref2[6] = {0.5, 1, 1.5, 0, 0, 0};
    g_be->matmul(g_be, C2, dummy, dummy, 1, 3, 0, 0, 0, 1.0f, 0.5f);
    g_be->matmul(g_be, C2 + 3, dummy, dummy, 1, 3, 0, 0, 0, 1.0f, 0.0f);
    report("matmul K=0: C = beta*C", relerr(C2, ref2, 6), 0.0);
}

typedef struct {
    double *A, *B, *R, *C;
    int64_t M, N, K;
    int ta, tb;
} mm_ctx;

static double mm_loss(void *p) {
    mm_ctx *c = p;
    ref_matmul(c->C, c->A, c->B, c->M, c->N, c->K, c->ta, c->tb, 1.0, 0.0);
    return dot_d(c->C, c->R, c->M * c->N);
}

/* dA and dB of L = sum(op(A) op(B) * R) via the transposed products the model uses. */
static void test_matmul_grad(int64_t M, int64_t N, int64_t K) {
    for (int tr = 0; tr < 4; tr++) {
        int ta = tr >> 1, tb = tr & 1;
        float *A = frand(M * K, 1.0f), *B = frand(K * N, 1.0f), *R = frand(M * N, 1.0f);
        float *dA = fbuf(M * K), *dB = fbuf(K * N);
        mm_ctx c = {todbl(A, M * K), todbl(B, K * N), todbl(R, M * N), dbuf(M * N), M, N, K,
                    ta, tb};
        double *gA = dbuf(M * K), *gB = dbuf(K * N);
        fd_grad(mm_loss, &c, c.A, M * K, gA);
        fd_grad(mm_loss, &c, c.B, K * N, gB);
        tz_backend *be = g_be;
        if (!ta && !tb) {
            be->matmul(be, dA, R, B, M, K, N, 0, 1, 1.0f, 1.0f);
            be->matmul(be, dB, A, R, K, N, M, 1, 0, 1.0f, 1.0f);
        } else if (!ta && tb) {
            be->matmul(be, dA, R, B, M, K, N, 0, 0, 1.0f, 1.0f);
            be->matmul(be, dB, R, A, N, K, M, 1, 0, 1.0f, 1.0f);
        } else if (ta && !tb) {
            be->matmul(be, dA, B, R, K, M, N, 0, 1, 1.0f, 1.0f);
            be->matmul(be, dB, A, R, K, N, M, 0, 0, 1.0f, 1.0f);
        } else {
            be->matmul(be, dA, B, R, K, M, N, 1, 1, 1.0f, 1.0f);
            be->matmul(be, dB, R, A, N, K, M, 1, 1, 1.0f, 1.0f);
        }
        char name[96];
        snprintf(name, sizeof name, "matmul grad dA %lldx%lldx%lld tA=%d tB=%d", (long long)M,
                 (long long)N, (long long)K, ta, tb);
        report(name, relerr(dA, gA, M * K), 1e-5);
        snprintf(name, sizeof name, "matmul grad dB %lldx%lldx%lld tA=%d tB=%d", (long long)M,
                 (long long)N, (long long)K, ta, tb);
        report(name, relerr(dB, gB, K * N), 1e-5);
        free(A), free(B), free(R), free(dA), free(dB), free(gA), free(gB);
        free(c.A), free(c.B), free(c.R), free(c.C);
    }
}

/* ---- embedding ---- */

typedef struct {
    double *table, *R, *out;
    const int32_t *tok;
    int64_t n, C;
} emb_ctx;

static double emb_loss(void *p) {
    emb_ctx *c = p;
    for (int64_t t = 0; t < c->n; t++)
        memcpy(c->out + t * c->C, c->table + c->tok[t] * c->C, (size_t)c->C * sizeof(double));
    return dot_d(c->out, c->R, c->n * c->C);
}

static void test_embedding(void) {
    const int64_t V = 11, C = 7, n = 9;
    const int32_t tok[9] = {3, 0, 10, 3, 7, 3, 0, 5, 10}; /* duplicates on purpose */
    float *table = frand(V * C, 1.0f), *R = frand(n * C, 1.0f), *out = fbuf(n * C);
    float *dt = fbuf(V * C), *dt2 = fbuf(V * C);
    emb_ctx c = {todbl(table, V * C), todbl(R, n * C), dbuf(n * C), tok, n, C};
    emb_loss(&c);
    g_be->embedding_fwd(g_be, out, tok, table, n, C);
    report("embedding fwd", relerr(out, c.out, n * C), 0.0);
    double *g = dbuf(V * C);
    fd_grad(emb_loss, &c, c.table, V * C, g);
    g_be->embedding_bwd(g_be, dt, tok, R, n, C);
    report("embedding bwd dtable (duplicate ids)", relerr(dt, g, V * C), 1e-6);
    memcpy(dt2, dt, (size_t)(V * C) * sizeof(float));
    g_be->embedding_bwd(g_be, dt2, tok, R, n, C);
    report("embedding bwd accumulates", relerr_doubled(dt2, dt, V * C), 1e-6);
    free(table), free(R), free(out), free(dt), free(dt2), free(g);
    free(c.table), free(c.R), free(c.out);
}

/* ---- rmsnorm ---- */

typedef struct {
    double *x, *w, *R, *out;
    int64_t rows, C;
    double eps;
} rms_ctx;

static double rms_loss(void *p) {
    rms_ctx *c = p;
    ref_rmsnorm(c->out, NULL, c->x, c->w, c->rows, c->C, c->eps);
    return dot_d(c->out, c->R, c->rows * c->C);
}

static void test_rmsnorm(void) {
    const int64_t rows = 5, C = 7;
    const float eps = 1e-5f;
    float *x = frand(rows * C, 1.0f), *w = frand(C, 1.5f), *R = frand(rows * C, 1.0f);
    float *out = fbuf(rows * C), *rstd = fbuf(rows);
    rms_ctx c = {todbl(x, rows * C), todbl(w, C), todbl(R, rows * C), dbuf(rows * C), rows, C,
                 (double)eps};
    double *rstd_ref = dbuf(rows);
    ref_rmsnorm(c.out, rstd_ref, c.x, c.w, rows, C, c.eps);
    g_be->rmsnorm_fwd(g_be, out, rstd, x, w, rows, C, eps);
    report("rmsnorm fwd out", relerr(out, c.out, rows * C), 1e-6);
    report("rmsnorm fwd rstd", relerr(rstd, rstd_ref, rows), 1e-6);
    double *gx = dbuf(rows * C), *gw = dbuf(C);
    fd_grad(rms_loss, &c, c.x, rows * C, gx);
    fd_grad(rms_loss, &c, c.w, C, gw);
    float *dx = fbuf(rows * C), *dw = fbuf(C), *dx2 = fbuf(rows * C);
    g_be->rmsnorm_bwd(g_be, dx, dw, R, x, w, rstd, rows, C);
    report("rmsnorm bwd dx", relerr(dx, gx, rows * C), 1e-5);
    report("rmsnorm bwd dw", relerr(dw, gw, C), 1e-5);
    g_be->rmsnorm_bwd(g_be, dx2, NULL, R, x, w, rstd, rows, C);
    report("rmsnorm bwd dw=NULL gives the same dx (bitwise)",
           memcmp(dx, dx2, sizeof(float) * (size_t)(rows * C)) ? 1.0 : 0.0, 0.0);
    float *dx1 = fbuf(rows * C), *dw1 = fbuf(C);
    memcpy(dx1, dx, sizeof(float) * (size_t)(rows * C));
    memcpy(dw1, dw, sizeof(float) * (size_t)C);
    g_be->rmsnorm_bwd(g_be, dx, dw, R, x, w, rstd, rows, C);
    report("rmsnorm bwd accumulates dx", relerr_doubled(dx, dx1, rows * C), 1e-6);
    report("rmsnorm bwd accumulates dw", relerr_doubled(dw, dw1, C), 1e-6);
    free(x), free(w), free(R), free(out), free(rstd), free(rstd_ref), free(gx), free(gw);
    free(dx), free(dw), free(dx2), free(dx1), free(dw1);
    free(c.x), free(c.w), free(c.R), free(c.out);
}

/* ---- rope ---- */

typedef struct {
    double *x, *R, *out;
    int64_t B, T, H, D;
    double theta;
} rope_ctx;

static double rope_loss(void *p) {
    rope_ctx *c = p;
    ref_rope(c->out, c->x, c->B, c->T, c->H, c->D, c->theta);
    return dot_d(c->out, c->R, c->B * c->T * c->H * c->D);
}

static void test_rope(void) {
    const float theta = 10000.0f;
    { /* forward at long positions: the double formula, and HF's float formula */
        const int64_t B = 2, T = 300, H = 3, D = 6, n = B * T * H * D, half = D / 2;
        float *x = frand(n, 1.0f), *y = fbuf(n);
        double *ref = dbuf(n), *xd = todbl(x, n), *hf = dbuf(n);
        memcpy(y, x, sizeof(float) * (size_t)n);
        g_be->rope_fwd(g_be, y, B, T, H, D, theta);
        ref_rope(ref, xd, B, T, H, D, theta);
        report("rope fwd vs fp64 formula (T=300)", relerr(y, ref, n), 1e-4);
        for (int64_t r = 0; r < B * T * H; r++) {
            int64_t t = (r / H) % T;
            for (int64_t i = 0; i < half; i++) {
                float inv = 1.0f / powf(theta, (float)(2 * i) / (float)D);
                float ang = (float)t * inv, a = x[r * D + i], b = x[r * D + i + half];
                hf[r * D + i] = a * cosf(ang) - b * sinf(ang);
                hf[r * D + i + half] = b * cosf(ang) + a * sinf(ang);
            }
        }
        report("rope fwd vs HF float formula (T=300)", relerr(y, hf, n), 1e-6);
        g_be->rope_bwd(g_be, y, B, T, H, D, theta);
        report("rope bwd(fwd(x)) == x", relerr(y, xd, n), 1e-6);
        free(x), free(y), free(ref), free(xd), free(hf);
    }
    { /* backward: the gradient of sum(rope(x) * R) is rope_bwd(R) */
        const int64_t B = 2, T = 5, H = 3, D = 6, n = B * T * H * D;
        float *x = frand(n, 1.0f), *R = frand(n, 1.0f);
        rope_ctx c = {todbl(x, n), todbl(R, n), dbuf(n), B, T, H, D, theta};
        double *g = dbuf(n);
        fd_grad(rope_loss, &c, c.x, n, g);
        g_be->rope_bwd(g_be, R, B, T, H, D, theta);
        report("rope bwd dx", relerr(R, g, n), 1e-5);
        free(x), free(R), free(g), free(c.x), free(c.R), free(c.out);
    }
}

/* ---- attention ---- */

typedef struct {
    double *q, *k, *v, *R, *out;
    int64_t B, T, Hq, Hkv, D;
    int causal;
} att_ctx;

static double att_loss(void *p) {
    att_ctx *c = p;
    ref_attention(c->out, NULL, c->q, c->k, c->v, c->B, c->T, c->Hq, c->Hkv, c->D, c->causal);
    return dot_d(c->out, c->R, c->B * c->T * c->Hq * c->D);
}

/* Gradients are checked at every fd_stride-th element (1: all). */
static void test_attention(int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D,
                           int causal, int64_t fd_stride) {
    int64_t nq = B * T * Hq * D, nk = B * T * Hkv * D, nl = B * Hq * T;
    float *q = frand(nq, 1.5f), *k = frand(nk, 1.5f), *v = frand(nk, 1.0f);
    float *R = frand(nq, 1.0f), *out = fbuf(nq), *lse = fbuf(nl);
    att_ctx c = {todbl(q, nq), todbl(k, nk), todbl(v, nk), todbl(R, nq), dbuf(nq),
                 B, T, Hq, Hkv, D, causal};
    double *lse_ref = dbuf(nl);
    ref_attention(c.out, lse_ref, c.q, c.k, c.v, B, T, Hq, Hkv, D, causal);
    g_be->attention_fwd(g_be, out, lse, q, k, v, B, T, Hq, Hkv, D, causal);
    char tag[64], name[128];
    snprintf(tag, sizeof tag, "B=%lld T=%lld Hq=%lld Hkv=%lld D=%lld %s", (long long)B,
             (long long)T, (long long)Hq, (long long)Hkv, (long long)D,
             causal ? "causal" : "full");
    snprintf(name, sizeof name, "attn fwd out %s", tag);
    report(name, relerr(out, c.out, nq), 1e-5);
    snprintf(name, sizeof name, "attn fwd lse %s", tag);
    report(name, relerr(lse, lse_ref, nl), 1e-5);

    double *gq = dbuf(nq), *gk = dbuf(nk), *gv = dbuf(nk);
    fd_grad_strided(att_loss, &c, c.q, nq, gq, fd_stride);
    fd_grad_strided(att_loss, &c, c.k, nk, gk, fd_stride);
    fd_grad_strided(att_loss, &c, c.v, nk, gv, fd_stride);
    float *dq = fbuf(nq), *dk = fbuf(nk), *dv = fbuf(nk);
    g_be->attention_bwd(g_be, dq, dk, dv, R, out, lse, q, k, v, B, T, Hq, Hkv, D, causal);
    snprintf(name, sizeof name, "attn bwd dq %s", tag);
    report(name, relerr_strided(dq, gq, nq, fd_stride), 1e-4);
    snprintf(name, sizeof name, "attn bwd dk %s", tag);
    report(name, relerr_strided(dk, gk, nk, fd_stride), 1e-4);
    snprintf(name, sizeof name, "attn bwd dv %s", tag);
    report(name, relerr_strided(dv, gv, nk, fd_stride), 1e-4);

    float *dq1 = fbuf(nq), *dk1 = fbuf(nk), *dv1 = fbuf(nk);
    memcpy(dq1, dq, sizeof(float) * (size_t)nq);
    memcpy(dk1, dk, sizeof(float) * (size_t)nk);
    memcpy(dv1, dv, sizeof(float) * (size_t)nk);
    g_be->attention_bwd(g_be, dq, dk, dv, R, out, lse, q, k, v, B, T, Hq, Hkv, D, causal);
    double e = relerr_doubled(dq, dq1, nq);
    double e2 = relerr_doubled(dk, dk1, nk), e3 = relerr_doubled(dv, dv1, nk);
    if (e2 > e) e = e2;
    if (e3 > e) e = e3;
    snprintf(name, sizeof name, "attn bwd accumulates dq dk dv %s", tag);
    report(name, e, 1e-6);
    free(q), free(k), free(v), free(R), free(out), free(lse), free(lse_ref);
    free(gq), free(gk), free(gv), free(dq), free(dk), free(dv), free(dq1), free(dk1), free(dv1);
    free(c.q), free(c.k), free(c.v), free(c.R), free(c.out);
}

/* ---- swiglu ---- */

typedef struct {
    double *g, *u, *R;
    int64_t n;
} swi_ctx;

static double swi_loss(void *p) {
    swi_ctx *c = p;
    double s = 0.0;
    for (int64_t i = 0; i < c->n; i++) s += c->g[i] / (1.0 + exp(-c->g[i])) * c->u[i] * c->R[i];
    return s;
}

static void test_swiglu(void) {
    const int64_t n = 37;
    float *g = frand(n, 4.0f), *u = frand(n, 2.0f), *R = frand(n, 1.0f), *out = fbuf(n);
    swi_ctx c = {todbl(g, n), todbl(u, n), todbl(R, n), n};
    double *ref = dbuf(n);
    for (int64_t i = 0; i < n; i++) ref[i] = c.g[i] / (1.0 + exp(-c.g[i])) * c.u[i];
    g_be->swiglu_fwd(g_be, out, g, u, n);
    report("swiglu fwd", relerr(out, ref, n), 1e-6);
    double *gg = dbuf(n), *gu = dbuf(n);
    fd_grad(swi_loss, &c, c.g, n, gg);
    fd_grad(swi_loss, &c, c.u, n, gu);
    float *dg = fbuf(n), *du = fbuf(n), *dg1 = fbuf(n), *du1 = fbuf(n);
    g_be->swiglu_bwd(g_be, dg, du, R, g, u, n);
    report("swiglu bwd dg", relerr(dg, gg, n), 1e-5);
    report("swiglu bwd du", relerr(du, gu, n), 1e-5);
    memcpy(dg1, dg, sizeof(float) * (size_t)n);
    memcpy(du1, du, sizeof(float) * (size_t)n);
    g_be->swiglu_bwd(g_be, dg, du, R, g, u, n);
    double e = relerr_doubled(dg, dg1, n), e2 = relerr_doubled(du, du1, n);
    report("swiglu bwd accumulates dg du", e > e2 ? e : e2, 1e-6);
    free(g), free(u), free(R), free(out), free(ref), free(gg), free(gu);
    free(dg), free(du), free(dg1), free(du1), free(c.g), free(c.u), free(c.R);
}

/* ---- cross-entropy ---- */

typedef struct {
    double *logits;
    const int32_t *target;
    int64_t n, V;
    double dloss;
} xent_ctx;

static double xent_loss(void *p) {
    xent_ctx *c = p;
    double s = 0.0;
    for (int64_t r = 0; r < c->n; r++)
        if (c->target[r] >= 0) s += ref_xent_row(c->logits + r * c->V, c->V, c->target[r]);
    return c->dloss * s;
}

/* Rows 1 and 4 are ignored (target -1 and -100); row 2 targets the last class. */
static void test_xent(int64_t n, int64_t V) {
    int32_t target[6] = {3, -1, 0, 0, -100, 7};
    target[2] = (int32_t)V - 1;
    for (int r = 0; r < 6; r++)
        if (target[r] >= V) target[r] = (int32_t)(V / 2);
    const float dloss = 0.37f;
    float *logits = frand(n * V, 3.0f), *loss = fbuf(n);
    xent_ctx c = {todbl(logits, n * V), target, n, V, (double)dloss};
    double *ref = dbuf(n);
    for (int64_t r = 0; r < n; r++)
        ref[r] = target[r] < 0 ? 0.0 : ref_xent_row(c.logits + r * V, V, target[r]);
    for (int64_t r = 0; r < n; r++) loss[r] = NAN;
    g_be->xent_fwd(g_be, loss, logits, target, n, V);
    char name[96];
    snprintf(name, sizeof name, "xent fwd n=%lld V=%lld (2 ignored rows)", (long long)n,
             (long long)V);
    report(name, relerr(loss, ref, n), 1e-6);
    report("xent fwd ignored rows are exactly 0", (loss[1] != 0.0f) + (loss[4] != 0.0f), 0.0);
    double *g = dbuf(n * V);
    fd_grad(xent_loss, &c, c.logits, n * V, g);
    float *d = fbuf(n * V);
    for (int64_t i = 0; i < n * V; i++) d[i] = NAN; /* bwd writes, never reads dlogits */
    g_be->xent_bwd(g_be, d, logits, target, dloss, n, V);
    snprintf(name, sizeof name, "xent bwd dlogits n=%lld V=%lld", (long long)n, (long long)V);
    report(name, relerr(d, g, n * V), 1e-5);
    double nz = 0.0;
    for (int64_t j = 0; j < V; j++) nz += (d[1 * V + j] != 0.0f) + (d[4 * V + j] != 0.0f);
    report("xent bwd ignored rows are exactly 0", nz, 0.0);
    g_be->xent_bwd(g_be, d, logits, target, dloss, n, V);
    report("xent bwd writes (a second call gives the same)", relerr(d, g, n * V), 1e-5);
    float *inplace = fbuf(n * V);
    memcpy(inplace, logits, sizeof(float) * (size_t)(n * V));
    g_be->xent_bwd(g_be, inplace, inplace, target, dloss, n, V);
    report("xent bwd in place == out of place (bitwise)",
           memcmp(inplace, d, sizeof(float) * (size_t)(n * V)) ? 1.0 : 0.0, 0.0);
    free(logits), free(loss), free(ref), free(g), free(d), free(inplace), free(c.logits);
}

/* ---- the vectorisable exp of the CPU backend ---- */

static void test_expf(void) {
    enum { N = 4096 };
    static float x[N], y[N];
    double e = 0.0;
    for (int rep = 0; rep < 64; rep++) {
        for (int i = 0; i < N; i++) x[i] = -87.0f + 175.0f * tz_rng_uniform(&g_rng);
#pragma omp simd
        for (int i = 0; i < N; i++) y[i] = tz_cpu_expf(x[i]);
        for (int i = 0; i < N; i++) {
            double r = exp((double)x[i]), d = fabs(y[i] - r) / r;
            if (!(d <= e)) e = d;
        }
    }
    report("tz_cpu_expf rel error on [-87, 88] (1 ulp = 1.2e-7)", e, 2.4e-7);
    float sp[5] = {-INFINITY, -200.0f, 0.0f, -0.0f, NAN};
    double bad = tz_cpu_expf(sp[0]) != 0.0f;
    bad += tz_cpu_expf(sp[1]) != 0.0f;
    bad += tz_cpu_expf(sp[2]) != 1.0f;
    bad += tz_cpu_expf(sp[3]) != 1.0f;
    bad += !isnan(tz_cpu_expf(sp[4]));
    report("tz_cpu_expf(-inf, -200, 0, -0, nan) = 0, 0, 1, 1, nan", bad, 0.0);
}

/* ---- memory, elementwise, sumsq ---- */

static void test_elementwise(void) {
    const int64_t n = 100003;
    float *p = g_be->alloc(g_be, (size_t)n * sizeof(float));
    double bad = ((uintptr_t)p % 64 != 0);
    for (int64_t i = 0; i < n; i++) bad += p[i] != 0.0f;
    report("alloc: 64-byte aligned and zeroed", bad, 0.0);
    float *x = frand(n, 1.0f), *y = frand(n, 1.0f);
    double *ref = dbuf(n);
    g_be->upload(g_be, p, x, (size_t)n * sizeof(float));
    g_be->scale(g_be, p, 0.75f, n);
    for (int64_t i = 0; i < n; i++) ref[i] = x[i] * 0.75f;
    report("scale", relerr(p, ref, n), 0.0);
    g_be->axpy(g_be, p, -1.25f, y, n);
    for (int64_t i = 0; i < n; i++) ref[i] = (float)ref[i] + -1.25f * y[i];
    report("axpy", relerr(p, ref, n), 1e-7);
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += (double)p[i] * p[i];
    double got = g_be->sumsq(g_be, p, n);
    report("sumsq (double accumulation)", fabs(got - s) / s, 1e-11);
    g_be->fill(g_be, p, 2.5f, n);
    for (int64_t i = 0; i < n; i++) ref[i] = 2.5;
    report("fill", relerr(p, ref, n), 0.0);
    g_be->copy(g_be, p, x, (size_t)n * sizeof(float));
    g_be->download(g_be, y, p, (size_t)n * sizeof(float));
    report("copy + download", memcmp(x, y, (size_t)n * sizeof(float)) ? 1.0 : 0.0, 0.0);
    g_be->release(g_be, p);
    free(x), free(y), free(ref);
}

/* ---- results do not depend on the thread count ---- */

/* Inputs large enough that every op splits its work across threads. */
enum { DM = 300, DN = 257, DK = 520 };
enum { AB = 2, AT = 64, AHQ = 8, AHKV = 2, AD = 32 };
enum { RR = 300, RC = 257, EN = 400, EV = 13, EC = 300, XN = 64, XV = 1000, SN = 100003 };
enum { RB = 2, RT = 64, RH = 8, RD = 64 };
static float *dA, *dB, *dC0, *aq, *ak, *av, *ado, *rx, *rw, *rdo, *edo, *xl, *sg, *su, *sdo, *rp;
static int32_t etok[EN], xtgt[XN];

static void det_init(void) {
    dA = frand((int64_t)DM * DK, 1.0f), dB = frand((int64_t)DK * DN, 1.0f);
    dC0 = frand((int64_t)DM * DN, 1.0f);
    int64_t nq = (int64_t)AB * AT * AHQ * AD, nk = (int64_t)AB * AT * AHKV * AD;
    aq = frand(nq, 1.5f), ak = frand(nk, 1.5f), av = frand(nk, 1.0f), ado = frand(nq, 1.0f);
    rx = frand((int64_t)RR * RC, 1.0f), rw = frand(RC, 1.0f), rdo = frand((int64_t)RR * RC, 1.0f);
    for (int i = 0; i < EN; i++) etok[i] = (int32_t)tz_rng_below(&g_rng, EV);
    edo = frand((int64_t)EN * EC, 1.0f);
    xl = frand((int64_t)XN * XV, 4.0f);
    for (int i = 0; i < XN; i++) xtgt[i] = i % 7 == 3 ? -1 : (int32_t)tz_rng_below(&g_rng, XV);
    sg = frand(SN, 4.0f), su = frand(SN, 2.0f), sdo = frand(SN, 1.0f);
    rp = frand((int64_t)RB * RT * RH * RD, 1.0f);
}

/* Runs every op once; returns one buffer with all results (and sets *len). */
static float *det_run(int64_t *len) {
    int64_t nq = (int64_t)AB * AT * AHQ * AD, nk = (int64_t)AB * AT * AHKV * AD;
    int64_t nmm = (int64_t)DM * DN, nrm = (int64_t)RR * RC, nrp = (int64_t)RB * RT * RH * RD;
    int64_t n = 4 * nmm + 2 * (nq + AB * AHQ * AT + nq + 2 * nk) + 2 * nrm + RR + RC +
                (int64_t)EV * EC + XN + (int64_t)XN * XV + 3 * SN + nrp + 2;
    float *o = fbuf(n), *p = o;
    tz_backend *be = g_be;
    for (int tr = 0; tr < 4; tr++, p += nmm) {
        memcpy(p, dC0, sizeof(float) * (size_t)nmm);
        be->matmul(be, p, dA, dB, DM, DN, DK, tr >> 1, tr & 1, 0.9f, 0.5f);
    }
    for (int causal = 0; causal < 2; causal++) {
        float *out = p, *lse = out + nq, *dq = lse + AB * AHQ * AT, *dk = dq + nq, *dv = dk + nk;
        be->attention_fwd(be, out, lse, aq, ak, av, AB, AT, AHQ, AHKV, AD, causal);
        be->attention_bwd(be, dq, dk, dv, ado, out, lse, aq, ak, av, AB, AT, AHQ, AHKV, AD,
                          causal);
        p = dv + nk;
    }
    float *ro = p, *rs = ro + nrm, *rdx = rs + RR, *rdw = rdx + nrm;
    be->rmsnorm_fwd(be, ro, rs, rx, rw, RR, RC, 1e-6f);
    be->rmsnorm_bwd(be, rdx, rdw, rdo, rx, rw, rs, RR, RC);
    p = rdw + RC;
    be->embedding_bwd(be, p, etok, edo, EN, EC);
    p += (int64_t)EV * EC;
    be->xent_fwd(be, p, xl, xtgt, XN, XV);
    be->xent_bwd(be, p + XN, xl, xtgt, 0.5f, XN, XV);
    p += XN + (int64_t)XN * XV;
    be->swiglu_fwd(be, p, sg, su, SN);
    be->swiglu_bwd(be, p + SN, p + 2 * SN, sdo, sg, su, SN);
    p += 3 * SN;
    memcpy(p, rp, sizeof(float) * (size_t)nrp);
    be->rope_fwd(be, p, RB, RT, RH, RD, 10000.0f);
    p += nrp;
    double ss = be->sumsq(be, dA, (int64_t)DM * DK) + be->sumsq(be, xl, 3 * (int64_t)XN * XV / 4);
    memcpy(p, &ss, sizeof ss);
    *len = n;
    return o;
}

static void test_threads(void) {
    det_init();
    int64_t n1, n;
    omp_set_num_threads(1);
    float *ref = det_run(&n1);
    for (int th = 2; th <= 3; th++) {
        omp_set_num_threads(th);
        float *got = det_run(&n);
        int64_t diff = 0;
        for (int64_t i = 0; i < n; i++) diff += memcmp(&got[i], &ref[i], sizeof(float)) != 0;
        char name[96];
        snprintf(name, sizeof name, "all ops bitwise equal, 1 vs %d threads (%lld values)", th,
                 (long long)n);
        report(name, (double)diff, 0.0);
        free(got);
    }
    free(ref);
    float *in[] = {dA, dB, dC0, aq, ak, av, ado, rx, rw, rdo, edo, xl, sg, su, sdo, rp};
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++) free(in[i]);
}

int main(void) {
    tz_optest_kernel();
    g_rng = tz_rng_make(1234, 0, TZ_RNG_TEST, 0);
    g_be = tz_cpu_backend_create(0);
    double t0 = omp_get_wtime();

    test_matmul_fwd(37, 29, 41);
    test_matmul_fwd(130, 70, 300);
    test_matmul_fwd(200, 257, 520);
    test_matmul_fwd(1, 1, 1);
    test_matmul_fwd(5, 300, 3);
    test_matmul_nan();
    test_matmul_grad(7, 5, 9);
    test_embedding();
    test_rmsnorm();
    test_rope();
    test_attention(2, 5, 4, 2, 6, 1, 1); /* GQA */
    test_attention(2, 5, 4, 2, 6, 0, 1);
    test_attention(1, 7, 3, 3, 4, 1, 1); /* MHA */
    test_attention(1, 7, 3, 3, 4, 0, 1);
    test_attention(2, 6, 4, 1, 8, 1, 1); /* MQA */
    test_attention(1, 150, 4, 2, 10, 1, 13); /* several 64-row blocks, a partial last one */
    test_attention(1, 150, 4, 2, 10, 0, 13);
    test_attention(1, 300, 2, 1, 4, 0, 31); /* > 256 keys: several GEMM tiles and K blocks */
    test_attention(1, 300, 2, 1, 4, 1, 31);
    test_swiglu();
    test_xent(6, 11);
    test_xent(6, 1003);
    test_expf();
    test_elementwise();
    test_threads();

    tz_cpu_backend_destroy(g_be);
    printf("ops_grad: %d passed, %d failed (%.1f s)\n", g_pass, g_fail, omp_get_wtime() - t0);
    return g_fail ? 1 : 0;
}
