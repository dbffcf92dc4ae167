/* What the op-case table (tests/ops/) cannot check because it is the CPU backend's own: that
 * results do not depend on the thread count (every op, bit for bit at 1, 2 and 3 threads, on
 * inputs large enough that each op splits its work), and the accuracy of tz_cpu_expf, the
 * vectorised exp behind softmax, SiLU and the rest. ctest runs it under each CPU kernel. */
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

/* ---- every op, at 1, 2 and 3 threads ---- */

/* shapes above every op's parallel threshold */
enum { DM = 300, DN = 257, DK = 520 };
enum { AB = 2, AT = 64, AHQ = 8, AHKV = 2, AD = 32 };
enum { RR = 300, RC = 257, EN = 400, EV = 13, EC = 300, XN = 64, XV = 1000, SN = 100003 };
enum { RB = 2, RT = 64, RH = 8, RD = 64 };
enum { DB = 4, DT = 256, DC = 96 };

typedef struct {
    float *A, *B, *C0, *q, *k, *v, *dout, *rx, *rw, *rdo, *edo, *logits, *g, *u, *sdo, *rp;
    float *x, *mod, *R;
    int32_t tok[EN], tgt[XN];
} inputs;

static void make_inputs(inputs *in) {
    in->A = frand((int64_t)DM * DK, 1.0f), in->B = frand((int64_t)DK * DN, 1.0f);
    in->C0 = frand((int64_t)DM * DN, 1.0f);
    int64_t nq = (int64_t)AB * AT * AHQ * AD, nk = (int64_t)AB * AT * AHKV * AD;
    in->q = frand(nq, 1.5f), in->k = frand(nk, 1.5f), in->v = frand(nk, 1.0f);
    in->dout = frand(nq, 1.0f);
    in->rx = frand((int64_t)RR * RC, 1.0f), in->rw = frand(RC, 1.0f);
    in->rdo = frand((int64_t)RR * RC, 1.0f);
    for (int i = 0; i < EN; i++) in->tok[i] = (int32_t)tz_rng_below(&g_rng, EV);
    in->edo = frand((int64_t)EN * EC, 1.0f);
    in->logits = frand((int64_t)XN * XV, 4.0f);
    for (int i = 0; i < XN; i++) in->tgt[i] = i % 7 == 3 ? -1 : (int32_t)tz_rng_below(&g_rng, XV);
    in->g = frand(SN, 4.0f), in->u = frand(SN, 2.0f), in->sdo = frand(SN, 1.0f);
    in->rp = frand((int64_t)RB * RT * RH * RD, 1.0f);
    const int64_t n = (int64_t)DB * DT * DC;
    in->x = frand(n, 3.0f), in->mod = frand((int64_t)DB * 3 * DC, 1.0f), in->R = frand(n, 1.0f);
}

static void free_inputs(inputs *in) {
    float *all[] = {in->A, in->B, in->C0, in->q, in->k, in->v, in->dout, in->rx, in->rw,
                    in->rdo, in->edo, in->logits, in->g, in->u, in->sdo, in->rp, in->x,
                    in->mod, in->R};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]);
}

/* The results, one buffer handed out in pieces (never moved: the pieces stay valid). */
#define RESULTS_CAP ((int64_t)1 << 23)
typedef struct {
    float *o;
    int64_t n;
} results;
static float *take(results *r, int64_t n) {
    if (!r->o) r->o = calloc((size_t)RESULTS_CAP, sizeof(float));
    if (!r->o || r->n + n > RESULTS_CAP) {
        fprintf(stderr, "test_cpu_ops: the results outgrow %lld floats\n", (long long)RESULTS_CAP);
        exit(1);
    }
    float *p = r->o + r->n;
    r->n += n;
    return p;
}

/* Runs every op once on in; the results, in one buffer. */
static results run_all(const inputs *in) {
    results r = {0};
    tz_backend *be = g_be;
    const int64_t nmm = (int64_t)DM * DN;
    for (int tr = 0; tr < 4; tr++) {
        float *c = take(&r, nmm);
        memcpy(c, in->C0, sizeof(float) * (size_t)nmm);
        be->matmul(be, c, in->A, in->B, DM, DN, DK, tr >> 1, tr & 1, 0.9f, 0.5f);
    }
    const int64_t nq = (int64_t)AB * AT * AHQ * AD, nk = (int64_t)AB * AT * AHKV * AD;
    for (int causal = 0; causal < 2; causal++) {
        float *out = take(&r, nq), *lse = take(&r, AB * AHQ * AT);
        float *dq = take(&r, nq), *dk = take(&r, nk), *dv = take(&r, nk);
        be->attention_fwd(be, out, lse, in->q, in->k, in->v, AB, AT, AHQ, AHKV, AD, causal, NULL);
        be->attention_bwd(be, dq, dk, dv, in->dout, out, lse, in->q, in->k, in->v, AB, AT, AHQ,
                          AHKV, AD, causal, 1, NULL);
    }
    const int64_t nrm = (int64_t)RR * RC;
    float *ro = take(&r, nrm), *rs = take(&r, RR), *rdx = take(&r, nrm), *rdw = take(&r, RC);
    be->rmsnorm_fwd(be, ro, rs, in->rx, in->rw, RR, RC, 1e-6f);
    be->rmsnorm_bwd(be, rdx, rdw, in->rdo, in->rx, in->rw, rs, RR, RC, 1);
    be->embedding_bwd(be, take(&r, (int64_t)EV * EC), in->tok, in->edo, EN, EC);
    be->xent_fwd(be, take(&r, XN), in->logits, in->tgt, XN, XV);
    be->xent_bwd(be, take(&r, (int64_t)XN * XV), in->logits, in->tgt, 0.5f, XN, XV);
    float *sw = take(&r, 3 * SN);
    be->swiglu_fwd(be, sw, in->g, in->u, SN, 0);
    be->swiglu_bwd(be, sw + SN, sw + 2 * SN, in->sdo, in->g, in->u, SN, 1, 0);
    const int64_t nrp = (int64_t)RB * RT * RH * RD;
    float *rp = take(&r, nrp);
    memcpy(rp, in->rp, sizeof(float) * (size_t)nrp);
    be->rope_fwd(be, rp, RB, RT, RH, RD, 10000.0f);
    double ss = be->sumsq(be, in->A, (int64_t)DM * DK) +
                be->sumsq(be, in->logits, 3 * (int64_t)XN * XV / 4);
    memcpy(take(&r, 2), &ss, sizeof ss);
    /* the DiT ops */
    const int64_t n = (int64_t)DB * DT * DC, ld = 3 * DC, nm = DB * ld, rows = DB * DT;
    float *p = take(&r, 2 * n + 2 * rows);
    be->layernorm_fwd(be, p, p + n, p + n + rows, in->x, rows, DC, 1e-6f);
    be->layernorm_bwd(be, p + n + 2 * rows, in->R, in->x, p + n, p + n + rows, rows, DC);
    p = take(&r, 2 * n + nm);
    be->modulate_fwd(be, p, in->x, in->mod, in->mod + DC, ld, DB, DT, DC, 0);
    be->modulate_bwd(be, p + n, p + 2 * n, p + 2 * n + DC, in->R, in->x, in->mod + DC, ld, DB,
                     DT, DC, 1);
    p = take(&r, 2 * n + nm);
    be->gate_fwd(be, p, in->x, in->R, in->mod + 2 * DC, ld, DB, DT, DC);
    be->gate_bwd(be, p + n, p + 2 * n + 2 * DC, in->R, in->x, in->mod + 2 * DC, ld, DB, DT, DC,
                 1);
    p = take(&r, 4 * n);
    be->gelu_tanh_fwd(be, p, in->x, n, 0, 0, 0);
    be->gelu_tanh_bwd(be, p + n, in->R, in->x, n, 1, 0, 0);
    be->silu_fwd(be, p + 2 * n, in->x, n);
    be->silu_bwd(be, p + 3 * n, in->R, in->x, n, 1);
    be->bias_bwd(be, take(&r, DC), in->R, rows, DC, NULL);
    p = take(&r, rows + n);
    be->mse_fwd(be, p, in->x, DC, in->R, rows, DC);
    be->mse_bwd(be, p + rows, in->x, DC, in->R, 0.5f, rows, DC);
    be->patchify(be, take(&r, n), in->x, DB, 6, 64, 64, 4, 1);
    return r;
}

static void test_threads(void) {
    inputs in;
    make_inputs(&in);
    omp_set_num_threads(1);
    results ref = run_all(&in);
    for (int th = 2; th <= 3; th++) {
        omp_set_num_threads(th);
        results got = run_all(&in);
        int64_t diff = got.n != ref.n;
        for (int64_t i = 0; i < got.n && i < ref.n; i++)
            diff += memcmp(&got.o[i], &ref.o[i], sizeof(float)) != 0;
        char name[96];
        snprintf(name, sizeof name, "every op bitwise equal, 1 vs %d threads (%lld values)", th,
                 (long long)ref.n);
        report(name, (double)diff, 0.0);
        free(got.o);
    }
    free(ref.o);
    free_inputs(&in);
}

int main(void) {
    tz_optest_kernel();
    g_rng = tz_rng_make(1234, 0, TZ_RNG_TEST, 0);
    g_be = tz_cpu_backend_create(0);
    test_expf();
    test_threads();
    tz_cpu_backend_destroy(g_be);
    return tz_check_done("test_cpu_ops");
}
