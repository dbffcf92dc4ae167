/* LoftQ on the host: per adapted weight, alternate quantizing W - s B A and factorising the
 * residual W - Q by a randomized SVD; and the walk that applies it to a parameter table. */
#include "backend/registry.h"
#include "model/loftq.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/linear.h"

/* Orthonormalises the k rows of x [k, n] in place: modified Gram-Schmidt in double, each row
 * projected out twice (which keeps fp32 rows orthogonal to rounding). A row that is
 * (numerically) in the span of those before it becomes zero. v: n doubles of scratch. */
static void orth_rows(float *x, int64_t k, int64_t n, double *v) {
    for (int64_t i = 0; i < k; i++) {
        float *xi = x + i * n;
        double n0 = 0.0;
        for (int64_t j = 0; j < n; j++) v[j] = xi[j], n0 += v[j] * v[j];
        for (int pass = 0; pass < 2; pass++)
            for (int64_t p = 0; p < i; p++) {
                const float *u = x + p * n;
                double d = 0.0;
                for (int64_t j = 0; j < n; j++) d += (double)u[j] * v[j];
                for (int64_t j = 0; j < n; j++) v[j] -= d * (double)u[j];
            }
        double nn = 0.0;
        for (int64_t j = 0; j < n; j++) nn += v[j] * v[j];
        nn = sqrt(nn);
        const int dead = !(nn > 1e-6 * sqrt(n0)); /* also a zero row */
        for (int64_t j = 0; j < n; j++) xi[j] = dead ? 0.0f : (float)(v[j] / nn);
    }
}

/* One-sided Jacobi (Hestenes) on the rows of x [k, n], in double and in place: afterwards its
 * rows are orthogonal (their norms the singular values) and x_before = v x_after, v [k, k]
 * orthogonal (its columns the left singular vectors). Pairs in a fixed order: deterministic. */
static void jacobi_rows(double *x, double *v, int64_t k, int64_t n) {
    for (int64_t i = 0; i < k * k; i++) v[i] = 0.0;
    for (int64_t i = 0; i < k; i++) v[i * k + i] = 1.0;
    for (int sweep = 0; sweep < 60; sweep++) {
        int rotated = 0;
        for (int64_t p = 0; p < k; p++)
            for (int64_t q = p + 1; q < k; q++) {
                double *xp = x + p * n, *xq = x + q * n, a = 0.0, b = 0.0, g = 0.0;
                for (int64_t j = 0; j < n; j++) a += xp[j] * xp[j], b += xq[j] * xq[j], g += xp[j] * xq[j];
                if (g == 0.0 || fabs(g) <= 1e-15 * sqrt(a * b)) continue;
                rotated = 1;
                const double zeta = (b - a) / (2.0 * g);
                const double t = (zeta >= 0.0 ? 1.0 : -1.0) / (fabs(zeta) + sqrt(1.0 + zeta * zeta));
                const double c = 1.0 / sqrt(1.0 + t * t), s = c * t;
                for (int64_t j = 0; j < n; j++) {
                    const double u = xp[j], w = xq[j];
                    xp[j] = c * u - s * w;
                    xq[j] = s * u + c * w;
                }
                for (int64_t i = 0; i < k; i++) {
                    const double u = v[i * k + p], w = v[i * k + q];
                    v[i * k + p] = c * u - s * w;
                    v[i * k + q] = s * u + c * w;
                }
            }
        if (!rotated) break;
    }
}

/* b [m, r] and a [r, n] such that s b a is the rank-r truncated SVD of res [m, n], by a
 * randomized SVD: sketch Y = res Omega (k = r + oversampling Gaussian columns from rng),
 * power iterations, the exact SVD of the k x n projection Y^T res, its top r kept. */
static void lowrank(tz_backend *cpu, const float *res, int64_t m, int64_t n, int64_t r, float s,
                    tz_rng *rng, float *a, float *b) {
    const int64_t mn = m < n ? m : n;
    const int64_t k = r + TZ_LOFTQ_OVERSAMPLE < mn ? r + TZ_LOFTQ_OVERSAMPLE : mn;
    float *ot = tz_xmalloc((size_t)(k * n) * sizeof *ot);  /* Omega^T, then Z^T, then Y^T res */
    float *yt = tz_xmalloc((size_t)(k * m) * sizeof *yt);  /* Y^T: orthonormal rows */
    double *tmp = tz_xmalloc((size_t)(m > n ? m : n) * sizeof *tmp);
    double *x = tz_xmalloc((size_t)(k * n) * sizeof *x);
    double *v = tz_xmalloc((size_t)(k * k) * sizeof *v);
    double *sig = tz_xmalloc((size_t)k * sizeof *sig);
    int64_t *idx = tz_xmalloc((size_t)k * sizeof *idx);
    for (int64_t i = 0; i < k * n; i++) ot[i] = (float)tz_rng_normal(rng);
    cpu->matmul(cpu, yt, ot, res, k, m, n, 0, 1, 1.0f, 0.0f); /* Y^T = Omega^T res^T */
    orth_rows(yt, k, m, tmp);
    for (int it = 0; it < TZ_LOFTQ_POWER; it++) {
        cpu->matmul(cpu, ot, yt, res, k, n, m, 0, 0, 1.0f, 0.0f); /* Z^T = Y^T res */
        orth_rows(ot, k, n, tmp);
        cpu->matmul(cpu, yt, ot, res, k, m, n, 0, 1, 1.0f, 0.0f); /* Y^T = Z^T res^T */
        orth_rows(yt, k, m, tmp);
    }
    cpu->matmul(cpu, ot, yt, res, k, n, m, 0, 0, 1.0f, 0.0f); /* P = Y^T res, res ~ Y P */
    for (int64_t i = 0; i < k * n; i++) x[i] = ot[i];
    jacobi_rows(x, v, k, n); /* P = v X, X's rows orthogonal: res ~ (Y v) X */
    for (int64_t i = 0; i < k; i++) {
        double q = 0.0;
        for (int64_t j = 0; j < n; j++) q += x[i * n + j] * x[i * n + j];
        sig[i] = sqrt(q);
        int64_t at = i; /* insertion by descending singular value, ties by index */
        while (at > 0 && sig[idx[at - 1]] < sig[i]) idx[at] = idx[at - 1], at--;
        idx[at] = i;
    }
    memset(a, 0, (size_t)(r * n) * sizeof *a);
    memset(b, 0, (size_t)(m * r) * sizeof *b);
    for (int64_t j = 0; j < r && j < k; j++) {
        const int64_t i = idx[j];
        if (!(sig[i] > 0.0)) continue;
        const double f = sqrt(sig[i] / (double)s); /* s b a = U S V^T, S split evenly */
        for (int64_t c = 0; c < n; c++) a[j * n + c] = (float)(x[i * n + c] / sig[i] * f);
        for (int64_t row = 0; row < m; row++) { /* U[:, i] = Y v[:, i] */
            double u = 0.0;
            for (int64_t l = 0; l < k; l++) u += (double)yt[l * m + row] * v[l * k + i];
            b[row * r + j] = (float)(u * f);
        }
    }
    free(ot), free(yt), free(tmp), free(x), free(v), free(sig), free(idx);
}

static double sumsq(const float *x, int64_t n) {
    double q = 0.0;
    for (int64_t i = 0; i < n; i++) q += (double)x[i] * (double)x[i];
    return q;
}

void tz_loftq_weight(tz_backend *cpu, int method, const tz_tq_codebook *cb, tz_tq_tensor *t,
                     const float *w, int64_t r, float s, int iters, tz_rng *rng, float *a,
                     float *b, tz_loftq_stats *stats, double *err_iter) {
    const int64_t m = t->rows, n = t->cols, N = m * n;
    TZ_CHECK(iters >= 1 && r >= 1 && s > 0.0f, "loftq: %d alternations, rank %lld, scale %g",
             iters, (long long)r, (double)s);
    float *res = tz_xmalloc((size_t)N * sizeof *res);
    float *qh = tz_xmalloc((size_t)N * sizeof *qh);
    memset(a, 0, (size_t)(r * n) * sizeof *a);
    memset(b, 0, (size_t)(m * r) * sizeof *b);
    double err = 0.0;
    for (int it = 0; it < iters; it++) {
        memcpy(res, w, (size_t)N * sizeof *res);
        if (it) cpu->matmul(cpu, res, b, a, m, n, r, 0, 0, -s, 1.0f); /* W - s B A */
        tz_tq_quantize_as(t, method, cb, res);
        tz_tq_dequantize_as(t, method, cb, qh);
        for (int64_t e = 0; e < N; e++) res[e] = w[e] - qh[e];
        if (it == 0 && stats) stats->err_plain += sumsq(res, N);
        lowrank(cpu, res, m, n, r, s, rng, a, b);
        cpu->matmul(cpu, res, b, a, m, n, r, 0, 0, -s, 1.0f); /* W - Q - s B A */
        err = sumsq(res, N);
        if (err_iter) err_iter[it] = err;
    }
    if (stats) {
        stats->n++;
        stats->ref += sumsq(w, N);
        stats->err_loftq += err;
    }
    free(res);
    free(qh);
}

/* When ps->p[i] is an adapter's A (PEFT: base_model.model.X.lora_A.weight), its base weight
 * X.weight (returned) and B (*bp); NULL for any other tensor. Fatal when they do not match. */
static tz_param *adapter_of(tz_params *ps, int i, int64_t rank, const char *init,
                            tz_param **bp) {
    static const char prefix[] = "base_model.model.", tail[] = ".lora_A.weight";
    tz_param *a = ps->p[i];
    const size_t len = strlen(a->name), np = sizeof prefix - 1, nt = sizeof tail - 1;
    if (!a->adapter || len <= np + nt || strncmp(a->name, prefix, np) ||
        strcmp(a->name + len - nt, tail))
        return NULL;
    char wname[TZ_NAME_MAX], bname[TZ_NAME_MAX];
    snprintf(wname, sizeof wname, "%.*s.weight", (int)(len - np - nt), a->name + np);
    snprintf(bname, sizeof bname, "%.*s.lora_B.weight", (int)(len - nt), a->name);
    tz_param *w = tz_params_find(ps, wname), *b = tz_params_find(ps, bname);
    if (!w || !b || w->ndim != 2 || a->shape[0] != rank || b->shape[0] != w->shape[0] ||
        b->shape[1] != rank || a->shape[1] != w->shape[1])
        TZ_FATAL("lora.init = \"%s\": adapter %s has no matching %s and %s", init, a->name,
                 bname, wname);
    *bp = b;
    return w;
}

tz_loftq_stats tz_loftq_init_params(tz_params *ps, tz_backend *be, double alpha, int64_t rank,
                                    uint64_t seed, int threads, tz_loftq_source src, void *ctx) {
    tz_loftq_stats st;
    memset(&st, 0, sizeof st);
    tz_backend *cpu = NULL;
    tz_tq_codebook cbs[TZ_TQ_MAX_BITS + 1];
    memset(cbs, 0, sizeof cbs);
    const float s = (float)(alpha / (double)rank);
    char err[256];
    for (int i = 0; i < ps->n; i++) {
        tz_param *a = ps->p[i], *b = NULL, *w = adapter_of(ps, i, rank, "loftq", &b);
        if (!w) continue;
        tz_qweight *q = w->q;
        if (!q) continue; /* a dense weight: nothing to recover, the default init stays */
        if (!cpu) cpu = tz_cpu_backend_create(threads);
        if (q->method == TZ_TQ_TURBOQUANT && cbs[q->bits].bits != q->bits &&
            tz_tq_codebook_init(&cbs[q->bits], q->bits, err, sizeof err))
            TZ_FATAL("%s", err);
        tz_tq_tensor t;
        if (tz_tq_tensor_init(&t, q->bits, q->group, w->shape[0], w->shape[1], q->seed, err,
                              sizeof err))
            TZ_FATAL("%s: %s", w->name, err);
        float *wd = tz_xmalloc((size_t)w->numel * sizeof *wd);
        float *ha = tz_xmalloc((size_t)a->numel * sizeof *ha);
        float *hb = tz_xmalloc((size_t)b->numel * sizeof *hb);
        src(ctx, w, wd);
        tz_rng rng = tz_rng_make(seed, (uint64_t)i, TZ_RNG_LORA, 0);
        tz_loftq_weight(cpu, q->method, &cbs[q->bits], &t, wd, rank, s, TZ_LOFTQ_ITERS, &rng, ha,
                        hb, &st, NULL);
        tz_qweight_codes_put(be, q, 0, t.codes, (size_t)tz_tq_codes_bytes(t.rows, t.cols, t.bits));
        be->upload(be, q->scales, t.scales,
                   (size_t)tz_tq_scales_count(t.rows, t.cols, t.group) * sizeof *t.scales);
        tz_param_upload(be, a, ha, 0, a->numel);
        tz_param_upload(be, b, hb, 0, b->numel);
        tz_tq_tensor_free(&t);
        free(wd), free(ha), free(hb);
    }
    if (cpu) tz_cpu_backend_destroy(cpu);
    return st;
}

/* ---- lora.init = "calibrated" ---- */

static int calib_find(tz_calib *c, const tz_param *w) {
    for (int i = 0; i < c->n; i++)
        if (c->w[i] == w) return i;
    return -1;
}

static void calib_probe(void *ctx, const tz_linear *l, const float *x, int64_t n) {
    tz_calib *c = ctx;
    const int64_t in = l->in;
    int k = calib_find(c, l->w);
    if (k < 0) {
        if (c->n == c->cap) {
            c->cap = c->cap ? 2 * c->cap : 64;
            c->w = tz_xrealloc(c->w, (size_t)c->cap * sizeof *c->w);
            c->root = tz_xrealloc(c->root, (size_t)c->cap * sizeof *c->root);
            c->H = tz_xrealloc(c->H, (size_t)c->cap * sizeof *c->H);
            c->in = tz_xrealloc(c->in, (size_t)c->cap * sizeof *c->in);
            c->rows = tz_xrealloc(c->rows, (size_t)c->cap * sizeof *c->rows);
        }
        k = c->n++;
        c->w[k] = l->w;
        c->in[k] = in;
        c->rows[k] = 0;
        /* the input the previous weight just read: share its Gram matrix */
        const int same = c->last_k >= 0 && c->last_x == x && c->last_n == n && c->in[c->last_k] == in;
        c->root[k] = same ? c->root[c->last_k] : k;
        c->H[k] = same ? NULL : tz_xcalloc((size_t)(in * in), sizeof **c->H);
    }
    c->last_x = x, c->last_n = n, c->last_k = k;
    if (c->root[k] != k) return; /* gathered for its root */
    const size_t need = (size_t)(n * in + in * in);
    if (need > c->xcap) {
        free(c->x);
        c->x = tz_xmalloc(need * sizeof *c->x);
        c->xcap = need;
    }
    c->xtx = c->x + n * in;
    c->be->download(c->be, c->x, x, (size_t)(n * in) * sizeof *c->x);
    c->cpu->matmul(c->cpu, c->xtx, c->x, c->x, in, in, n, 1, 0, 1.0f, 0.0f); /* X^T X */
    double *H = c->H[k];
    for (int64_t e = 0; e < in * in; e++) H[e] += (double)c->xtx[e];
    c->rows[k] += n;
}

void tz_calib_begin(tz_calib *c, tz_backend *be, int threads) {
    memset(c, 0, sizeof *c);
    c->be = be;
    c->last_k = -1;
    c->cpu = tz_cpu_backend_create(threads);
    tz_linear_set_probe(calib_probe, c);
}

void tz_calib_end(tz_calib *c) {
    (void)c;
    tz_linear_set_probe(NULL, NULL);
}

void tz_calib_free(tz_calib *c) {
    for (int i = 0; i < c->n; i++) free(c->H[i]);
    free(c->w), free(c->root), free(c->H), free(c->in), free(c->rows), free(c->x);
    if (c->cpu) tz_cpu_backend_destroy(c->cpu);
    memset(c, 0, sizeof *c);
}

/* The lower Cholesky factor L [n, n] of the symmetric positive definite h (double); fatal
 * when it is not (damping makes a Gram matrix so). */
static void cholesky(const double *h, int64_t n, double *L) {
    memset(L, 0, (size_t)(n * n) * sizeof *L);
    for (int64_t j = 0; j < n; j++) {
        double d = h[j * n + j];
        for (int64_t k = 0; k < j; k++) d -= L[j * n + k] * L[j * n + k];
        if (!(d > 0.0)) TZ_FATAL("lora.init = \"calibrated\": the inputs' Gram matrix is not "
                                 "positive definite (column %lld)", (long long)j);
        const double ljj = sqrt(d);
        L[j * n + j] = ljj;
        for (int64_t i = j + 1; i < n; i++) {
            double v = h[i * n + j];
            for (int64_t k = 0; k < j; k++) v -= L[i * n + k] * L[j * n + k];
            L[i * n + j] = v / ljj;
        }
    }
}

void tz_calib_weight(tz_backend *cpu, const float *res, const double *H, int64_t m, int64_t n,
                     int64_t r, float s, tz_rng *rng, float *a, float *b, double *err_plain,
                     double *err_fit) {
    double *h = tz_xmalloc((size_t)(n * n) * sizeof *h), *L = tz_xmalloc((size_t)(n * n) * sizeof *L);
    double mean = 0.0;
    for (int64_t i = 0; i < n; i++) mean += H[i * n + i] / (double)n;
    const double damp = TZ_CALIB_DAMP * (mean > 0.0 ? mean : 1.0);
    for (int64_t e = 0; e < n * n; e++) h[e] = H[e];
    for (int64_t i = 0; i < n; i++) h[i * n + i] += damp;
    cholesky(h, n, L);
    float *Lf = tz_xmalloc((size_t)(n * n) * sizeof *Lf);
    float *rl = tz_xmalloc((size_t)(m * n) * sizeof *rl);
    float *ap = tz_xmalloc((size_t)(r * n) * sizeof *ap);
    for (int64_t e = 0; e < n * n; e++) Lf[e] = (float)L[e];
    cpu->matmul(cpu, rl, res, Lf, m, n, n, 0, 0, 1.0f, 0.0f); /* R L */
    if (err_plain) *err_plain += sumsq(rl, m * n);
    lowrank(cpu, rl, m, n, r, s, rng, ap, b); /* s b a' ~ R L */
    if (err_fit) {
        cpu->matmul(cpu, rl, b, ap, m, n, r, 0, 0, -s, 1.0f); /* (R - s b a) L */
        *err_fit += sumsq(rl, m * n);
    }
    /* a = a' L^{-1}: each row x solves x L = a'_row, i.e. L^T x^T = a'_row^T (back
     * substitution, L^T upper triangular) */
    for (int64_t j = 0; j < r; j++) {
        const float *y = ap + j * n;
        float *x = a + j * n;
        for (int64_t i = n - 1; i >= 0; i--) {
            double v = y[i];
            for (int64_t k = i + 1; k < n; k++) v -= L[k * n + i] * (double)x[k];
            x[i] = (float)(v / L[i * n + i]);
        }
    }
    free(h), free(L), free(Lf), free(rl), free(ap);
}

/* tr(W H W^T) = sum of W o (W H), W [m, n] host floats, H [n, n]. */
static double quad_form(tz_backend *cpu, const float *w, const double *H, int64_t m, int64_t n) {
    float *hf = tz_xmalloc((size_t)(n * n) * sizeof *hf), *wh = tz_xmalloc((size_t)(m * n) * sizeof *wh);
    for (int64_t e = 0; e < n * n; e++) hf[e] = (float)H[e];
    cpu->matmul(cpu, wh, w, hf, m, n, n, 0, 0, 1.0f, 0.0f);
    double q = 0.0;
    for (int64_t e = 0; e < m * n; e++) q += (double)w[e] * (double)wh[e];
    free(hf), free(wh);
    return q;
}

tz_loftq_stats tz_calib_init_params(tz_params *ps, tz_backend *be, const tz_calib *c,
                                    double alpha, int64_t rank, uint64_t seed, int threads,
                                    tz_loftq_source src, void *ctx) {
    tz_loftq_stats st;
    memset(&st, 0, sizeof st);
    tz_backend *cpu = tz_cpu_backend_create(threads);
    tz_tq_codebook cbs[TZ_TQ_MAX_BITS + 1];
    memset(cbs, 0, sizeof cbs);
    const float s = (float)(alpha / (double)rank);
    char err[256];
    for (int i = 0; i < ps->n; i++) {
        tz_param *a = ps->p[i], *b = NULL, *w = adapter_of(ps, i, rank, "calibrated", &b);
        if (!w || !w->q) continue;
        int k = calib_find((tz_calib *)c, w);
        if (k >= 0) k = c->root[k];
        if (k < 0 || !c->rows[k]) continue; /* not reached by the calibration's forward */
        const tz_qweight *q = w->q;
        const int64_t m = w->shape[0], n = w->shape[1];
        if (q->method == TZ_TQ_TURBOQUANT && cbs[q->bits].bits != q->bits &&
            tz_tq_codebook_init(&cbs[q->bits], q->bits, err, sizeof err))
            TZ_FATAL("%s", err);
        tz_tq_tensor t;
        if (tz_tq_tensor_init(&t, q->bits, q->group, m, n, q->seed, err, sizeof err))
            TZ_FATAL("%s: %s", w->name, err);
        tz_qweight_codes_get(be, q, t.codes, 0, (size_t)tz_tq_codes_bytes(m, n, q->bits));
        be->download(be, t.scales, q->scales,
                     (size_t)tz_tq_scales_count(m, n, q->group) * sizeof *t.scales);
        float *wd = tz_xmalloc((size_t)w->numel * sizeof *wd);
        float *qh = tz_xmalloc((size_t)w->numel * sizeof *qh);
        float *ha = tz_xmalloc((size_t)a->numel * sizeof *ha);
        float *hb = tz_xmalloc((size_t)b->numel * sizeof *hb);
        double *H = tz_xmalloc((size_t)(n * n) * sizeof *H);
        src(ctx, w, wd);
        tz_tq_dequantize_as(&t, q->method, &cbs[q->bits], qh);
        for (int64_t e = 0; e < w->numel; e++) qh[e] = wd[e] - qh[e]; /* R = W - Q */
        for (int64_t e = 0; e < n * n; e++) H[e] = c->H[k][e] / (double)c->rows[k];
        st.ref += quad_form(cpu, wd, H, m, n);
        tz_rng rng = tz_rng_make(seed, (uint64_t)i, TZ_RNG_LORA, 0);
        tz_calib_weight(cpu, qh, H, m, n, rank, s, &rng, ha, hb, &st.err_plain, &st.err_loftq);
        st.n++;
        tz_param_upload(be, a, ha, 0, a->numel);
        tz_param_upload(be, b, hb, 0, b->numel);
        tz_tq_tensor_free(&t);
        free(wd), free(qh), free(ha), free(hb), free(H);
    }
    tz_cpu_backend_destroy(cpu);
    return st;
}
