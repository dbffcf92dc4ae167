/* Every op of the CUDA table against the CPU table (the specification), on random inputs at
 * odd sizes, forward and backward (backwards on random, not zero, gradients: they accumulate),
 * plus the memory ops, live/peak bytes and run-to-run reproducibility. Exits 77 (skip) in a
 * build without the CUDA backend or where no GPU is visible.
 *
 * Tolerances, as max |gpu - cpu| / max |cpu| over the output (the error relative to the
 * result's scale, so a cancelled element does not blow it up):
 *   0       permutations and copies (patchify, unpatchify, copy2d, embedding forward,
 *           memory), decoding (one product of the same two floats), the embedding backward
 *           (both add the tokens of a column in the same order), fill and scale (one
 *           rounding of the same product).
 *   1e-7    axpy: nvcc fuses the multiply-add (one rounding instead of two: half an ulp).
 *   1e-6    elementwise ops with exponentials or tanh (the device's expf and the CPU's
 *           polynomial each err by up to 2 ulp, amplified by a few operations after them),
 *           RoPE (the same host-made table; the rotation is two rounded products and a sum),
 *           modulate/gate/bias/mse and the rotation (a few roundings; column sums in double).
 *   1e-5    row reductions in fp32 math around double sums (norms, cross-entropy) and the
 *           GEMM (K <= 96 products summed in another order: ~sqrt(K) * 6e-8 typical, far
 *           below; the margin covers the worst element).
 *   3e-5    attention with fp32 GEMM operands (two chained reductions over T <= 80 and
 *           D <= 128 in different order, an online softmax against a two-pass one, exp of
 *           the difference); on tensor cores (bf16 GEMM operands: TF32 products) 4e-3 of
 *           each row's norm, see test_attention_tc.
 *   1e-6    adamw (the CPU's arithmetic; fused multiply-adds move each element by ulps).
 *   1e-12   sumsq (double accumulation of the same squares, relative: both backends sum the
 *           GPU's own floats, so only the order of the additions differs).
 * The bf16 GEMM (matmul_dtype = TZ_DT_BF16) is checked element by element against bounds
 * rather than a relative figure, see test_matmul_bf16. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/registry.h"
#include "core/backend.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "quant/tq_layout.h"
#include "tz_check.h"

static tz_backend *g_cpu, *g_gpu;
static tz_rng g_rng;

/* A tensor on both backends: h (CPU backend memory = host), d (GPU), n floats. */
typedef struct {
    float *h, *d;
    int64_t n;
} pair;

static float urand(float amp) { return amp * (2.0f * tz_rng_uniform(&g_rng) - 1.0f); }

static pair mk(int64_t n, float amp) {
    pair p = {g_cpu->alloc(g_cpu, (size_t)n * 4), g_gpu->alloc(g_gpu, (size_t)n * 4), n};
    for (int64_t i = 0; i < n; i++) p.h[i] = urand(amp);
    g_gpu->upload(g_gpu, p.d, p.h, (size_t)n * 4);
    return p;
}
static pair mkz(int64_t n) { return mk(n, 0.0f); }
static int same16(tz_backend *be, const void *d16, const float *d32, int64_t n);
static void drop(pair *p) {
    g_cpu->release(g_cpu, p->h);
    g_gpu->release(g_gpu, p->d);
}

/* Device integers (token ids, targets) with their host copy. */
static int32_t *up_i32(const int32_t *h, int64_t n) {
    int32_t *d = g_gpu->alloc(g_gpu, (size_t)n * 4);
    g_gpu->upload(g_gpu, d, h, (size_t)n * 4);
    return d;
}

/* max |gpu - cpu| / max |cpu| of p (NaN anywhere: +inf) */
static double err_of(const pair *p) {
    float *g = malloc((size_t)p->n * 4);
    g_gpu->download(g_gpu, g, p->d, (size_t)p->n * 4);
    double e = 0.0, s = 0.0;
    for (int64_t i = 0; i < p->n; i++) {
        double df = fabs((double)g[i] - (double)p->h[i]);
        if (!(df <= e)) e = df;
        if (fabs((double)p->h[i]) > s) s = fabs((double)p->h[i]);
    }
    free(g);
    if (e != e) return INFINITY;
    return s > 0 ? e / s : e;
}

static void expect(const char *what, const pair *p, double tol) {
    double e = err_of(p);
    check(e <= tol, "%-48s err %.3e (tol %.0e)", what, e, tol);
}

/* ---- memory ---- */

static void test_memory(void) {
    size_t live0 = g_gpu->live_bytes;
    float *a = g_gpu->alloc(g_gpu, 1000), *b = g_gpu->alloc(g_gpu, 3000);
    check(g_gpu->live_bytes == live0 + 4000 && g_gpu->peak_bytes >= live0 + 4000,
          "live/peak bytes after two allocations (%zu, %zu)", g_gpu->live_bytes,
          g_gpu->peak_bytes);
    float z[250], h[250], back[250];
    g_gpu->download(g_gpu, z, a, sizeof z);
    int zero = 1;
    for (int i = 0; i < 250; i++) zero &= z[i] == 0.0f;
    check(zero, "alloc gives zeroed memory");
    for (int i = 0; i < 250; i++) h[i] = urand(1.0f);
    g_gpu->upload(g_gpu, a, h, sizeof h);
    g_gpu->copy(g_gpu, b + 10, a, sizeof h);
    g_gpu->sync(g_gpu);
    g_gpu->download(g_gpu, back, b + 10, sizeof back);
    check(!memcmp(back, h, sizeof h), "upload, copy, download round trip");
    g_gpu->release(g_gpu, a);
    g_gpu->release(g_gpu, b);
    g_gpu->release(g_gpu, NULL);
    check(g_gpu->live_bytes == live0, "live bytes back after release");
}

/* ---- elementwise and reductions ---- */

static void test_elementwise(void) {
    const int64_t n = 100003;
    pair x = mk(n, 2.0f), y = mk(n, 2.0f);
    g_cpu->fill(g_cpu, x.h, 0.37f, 777), g_gpu->fill(g_gpu, x.d, 0.37f, 777);
    expect("fill", &x, 0);
    g_cpu->scale(g_cpu, x.h, -1.7f, n), g_gpu->scale(g_gpu, x.d, -1.7f, n);
    expect("scale", &x, 0);
    g_cpu->axpy(g_cpu, y.h, 0.3f, x.h, n), g_gpu->axpy(g_gpu, y.d, 0.3f, x.d, n);
    expect("axpy (a fused multiply-add on the GPU)", &y, 1e-7);
    /* sumsq of the same floats on both (the GPU's axpy may differ from the CPU's in the last
     * bit: a fused multiply-add), so only the order of the double additions differs */
    float *yg = (float *)malloc((size_t)n * sizeof *yg);
    g_gpu->download(g_gpu, yg, y.d, (size_t)n * sizeof *yg);
    double sc = g_cpu->sumsq(g_cpu, yg, n), sg = g_gpu->sumsq(g_gpu, y.d, n);
    double e = fabs(sc - sg) / sc;
    check(e <= 1e-12, "sumsq %.17g vs %.17g (rel %.1e, tol 1e-12)", sg, sc, e);
    free(yg);
    double sg2 = g_gpu->sumsq(g_gpu, y.d, n);
    check(sg2 == sg, "sumsq is the same bits run to run");
    check(g_gpu->sumsq(g_gpu, y.d, 0) == 0.0, "sumsq of nothing is 0");
    drop(&x), drop(&y);

    /* AdamW, three steps on the same inputs: the CPU's arithmetic up to fused multiply-adds
     * (a few ulps of each element's update, relative to the largest weight) */
    pair w = mk(n, 0.05f), m = mk(n, 1e-3f), v = mk(n, 0.0f), g = mk(n, 0.2f);
    for (int64_t i = 0; i < n; i++) v.h[i] = 1e-6f * (float)(i % 7);
    g_gpu->upload(g_gpu, v.d, v.h, (size_t)n * 4);
    uint8_t *dec_h = malloc((size_t)n);
    for (int64_t i = 0; i < n; i++) dec_h[i] = (uint8_t)(i % 3 != 0);
    uint8_t *dec_d = g_gpu->alloc(g_gpu, (size_t)n);
    g_gpu->upload(g_gpu, dec_d, dec_h, (size_t)n);
    for (int t = 1; t <= 3; t++) {
        const tz_adamw_args a = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                                 .weight_decay = 0.1f, .c1 = (float)(1.0 / (1.0 - pow(0.9, t))),
                                 .c2 = (float)(1.0 / (1.0 - pow(0.999, t))), .grad_scale = 0.7f};
        g_cpu->adamw(g_cpu, w.h, m.h, v.h, g.h, dec_h, n, &a);
        g_gpu->adamw(g_gpu, w.d, m.d, v.d, g.d, dec_d, n, &a);
    }
    expect("adamw: weights after 3 steps", &w, 1e-6);
    expect("adamw: exp_avg", &m, 1e-6);
    expect("adamw: exp_avg_sq", &v, 1e-6);
    g_gpu->release(g_gpu, dec_d), free(dec_h);
    drop(&w), drop(&m), drop(&v), drop(&g);
}

/* ---- matmul ---- */

static void test_matmul(void) {
    const int64_t M = 37, N = 53, K = 71;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int bi = 0; bi < 2; bi++) {
                float beta = bi ? 0.3f : 0.0f;
                pair A = mk(M * K, 1.0f), B = mk(K * N, 1.0f), C = mk(M * N, 1.0f);
                if (!bi) { /* beta = 0: C may hold NaN, which must not come through */
                    for (int64_t i = 0; i < M * N; i++) C.h[i] = NAN;
                    g_gpu->upload(g_gpu, C.d, C.h, (size_t)(M * N) * 4);
                }
                g_cpu->matmul(g_cpu, C.h, A.h, B.h, M, N, K, ta, tb, 0.7f, beta);
                g_gpu->matmul(g_gpu, C.d, A.d, B.d, M, N, K, ta, tb, 0.7f, beta);
                char what[96];
                snprintf(what, sizeof what, "matmul transA=%d transB=%d beta=%g", ta, tb,
                         (double)beta);
                expect(what, &C, 1e-5);
                drop(&A), drop(&B), drop(&C);
            }
    pair C = mk(M * N, 1.0f);
    g_cpu->matmul(g_cpu, C.h, NULL, NULL, M, N, 0, 0, 0, 1.0f, 0.5f);
    g_gpu->matmul(g_gpu, C.d, NULL, NULL, M, N, 0, 0, 0, 1.0f, 0.5f);
    expect("matmul K=0 (C = beta C)", &C, 0);
    drop(&C);
}

/* The bf16 GEMM: operands rounded to bf16 (nearest even), products summed in fp32. With
 * S = alpha * sum_k |a_ik b_kj| per element:
 *  - against the same products of the ROUNDED operands summed in double: only the fp32 sums
 *    differ, |err| <= K 2^-24 S (the classical bound; the margin 2x covers beta C's rounding),
 *    which shows the operands were rounded to bf16 exactly as tz_f32_to_bf16 does;
 *  - against the fp32 operands: each rounding errs by at most 2^-8 relative, so a product by
 *    (2^-7 + 2^-16) relative, plus the sums: |err| <= (2^-7 + 2^-16 + K 2^-23) S. That is
 *    the precision given up for the tensor cores. */
static void test_matmul_bf16(void) {
    const int64_t M = 37, N = 45, K = 300;
    g_gpu->matmul_dtype = TZ_DT_BF16;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int bi = 0; bi < 2; bi++) {
                const float alpha = 0.7f, beta = bi ? 0.3f : 0.0f;
                pair A = mk(M * K, 1.0f), B = mk(K * N, 1.0f), C = mk(M * N, 1.0f);
                float *g = malloc((size_t)(M * N) * 4);
                g_gpu->matmul(g_gpu, C.d, A.d, B.d, M, N, K, ta, tb, alpha, beta);
                g_gpu->download(g_gpu, g, C.d, (size_t)(M * N) * 4);
                double worst_r = 0, worst_f = 0; /* error / bound, <= 1 passes */
                for (int64_t i = 0; i < M; i++)
                    for (int64_t j = 0; j < N; j++) {
                        double s = 0, r = 0, f = 0;
                        for (int64_t k = 0; k < K; k++) {
                            float a = A.h[ta ? k * M + i : i * K + k];
                            float b = B.h[tb ? j * K + k : k * N + j];
                            float a16 = tz_bf16_to_f32(tz_f32_to_bf16(a));
                            float b16 = tz_bf16_to_f32(tz_f32_to_bf16(b));
                            r += (double)a16 * b16, f += (double)a * b;
                            s += fabs((double)a * b);
                        }
                        const double c0 = beta * (double)C.h[i * N + j];
                        r = alpha * r + c0, f = alpha * f + c0, s = alpha * s + fabs(c0);
                        const double gv = g[i * N + j];
                        double er = fabs(gv - r) / (2.0 * K * 0x1p-24 * s);
                        double ef = fabs(gv - f) / ((0x1p-7 + 0x1p-16 + K * 0x1p-23) * s);
                        if (!(er <= worst_r)) worst_r = er;
                        if (!(ef <= worst_f)) worst_f = ef;
                    }
                check(worst_r <= 1.0, "bf16 matmul transA=%d transB=%d beta=%g: vs rounded "
                      "operands %.2f of the bound", ta, tb, (double)beta, worst_r);
                check(worst_f <= 1.0, "bf16 matmul transA=%d transB=%d beta=%g: vs fp32 "
                      "operands %.2f of the bound", ta, tb, (double)beta, worst_f);
                free(g);
                drop(&A), drop(&B), drop(&C);
            }
    g_gpu->matmul_dtype = TZ_DT_F32;
}

/* The narrow GEMM (core/backend.h's tz_narrow_plan, cuda_matmul.cu): matmul16 where one side
 * of C is at most 64 wide, the other side's operand in bf16 as LoRA passes it (or fp32,
 * rounded first; or bf16 at an address not 16-byte aligned, copied first). Its sums are split
 * along K and added in order, so against the products of the ROUNDED operands summed in
 * double it is held to test_matmul_bf16's bound, 2 K 2^-24 S per element (any order of fp32
 * sums is within (K - 1) 2^-24 S). Returns the worst error / bound; *same: a second call on
 * the same inputs gave the same bits. A side of at most 64 rows or columns (R) is padded to
 * 16, 32 or 64 columns of the kernel. */
static double narrow_run(int64_t M, int64_t N, int64_t K, int ta, int tb, int a16, int b16,
                         int off, float beta, int *same) {
    const int64_t na = M * K, nb = K * N, nc = M * N;
    const float alpha = 0.7f;
    float *ah = malloc((size_t)na * 4), *bh = malloc((size_t)nb * 4), *ch = malloc((size_t)nc * 4);
    float *g = malloc((size_t)nc * 4), *g2 = malloc((size_t)nc * 4);
    for (int64_t i = 0; i < na; i++) ah[i] = urand(1.0f);
    for (int64_t i = 0; i < nb; i++) bh[i] = urand(1.0f);
    for (int64_t i = 0; i < nc; i++) ch[i] = beta == 0.0f ? NAN : urand(1.0f);
    void *dev[2];
    const void *op[2];
    const int is16[2] = {a16, b16};
    float *host[2] = {ah, bh};
    const int64_t cnt[2] = {na, nb};
    for (int o = 0; o < 2; o++) {
        if (is16[o]) {
            uint16_t *h = malloc((size_t)(cnt[o] + 8) * 2);
            for (int64_t i = 0; i < cnt[o]; i++) h[off + i] = tz_f32_to_bf16(host[o][i]);
            dev[o] = g_gpu->alloc(g_gpu, (size_t)(cnt[o] + 8) * 2);
            g_gpu->upload(g_gpu, (uint16_t *)dev[o] + off, h + off, (size_t)cnt[o] * 2);
            op[o] = (uint16_t *)dev[o] + off;
            free(h);
        } else {
            dev[o] = g_gpu->alloc(g_gpu, (size_t)cnt[o] * 4);
            g_gpu->upload(g_gpu, dev[o], host[o], (size_t)cnt[o] * 4);
            op[o] = dev[o];
        }
    }
    float *cd = g_gpu->alloc(g_gpu, (size_t)nc * 4);
    for (int run = 0; run < 2; run++) {
        g_gpu->upload(g_gpu, cd, ch, (size_t)nc * 4);
        g_gpu->matmul16(g_gpu, cd, op[0], a16, op[1], b16, M, N, K, ta, tb, alpha, beta);
        g_gpu->download(g_gpu, run ? g2 : g, cd, (size_t)nc * 4);
    }
    *same = !memcmp(g, g2, (size_t)nc * 4);
    double worst = 0;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double r = 0, sabs = 0;
            for (int64_t k = 0; k < K; k++) {
                const float a = tz_bf16_to_f32(tz_f32_to_bf16(ah[ta ? k * M + i : i * K + k]));
                const float b = tz_bf16_to_f32(tz_f32_to_bf16(bh[tb ? j * K + k : k * N + j]));
                r += (double)a * b, sabs += fabs((double)a * b);
            }
            const double c0 = beta == 0.0f ? 0.0 : beta * (double)ch[i * N + j];
            r = alpha * r + c0, sabs = alpha * sabs + fabs(c0);
            const double e = fabs((double)g[i * N + j] - r) / (2.0 * K * 0x1p-24 * sabs);
            if (!(e <= worst)) worst = e;
        }
    g_gpu->release(g_gpu, dev[0]), g_gpu->release(g_gpu, dev[1]), g_gpu->release(g_gpu, cd);
    free(ah), free(bh), free(ch), free(g), free(g2);
    return worst;
}

static void test_matmul_narrow(void) {
    g_gpu->matmul_dtype = TZ_DT_BF16;
    /* M, N, K, transA, transB, A bf16, B bf16, bf16 operand offset, beta, what */
    static const struct {
        int64_t M, N, K;
        int ta, tb, a16, b16, off;
        float beta;
        const char *what;
    } cs[] = {
        /* N narrow: X = op(A) bf16 [P, K] (transA 0: K a multiple of 8) or [K, P] (transA 1:
         * P a multiple of 8), S = op(B) fp32 [K, R] (transB 0) or [R, K] */
        {203, 16, 336, 0, 0, 1, 0, 0, 0.0f, "N 16, X [P, K], S [K, R]"},
        {203, 5, 336, 0, 1, 1, 0, 0, 0.3f, "N 5, X [P, K], S [R, K] (LoRA's x A^T)"},
        {200, 32, 333, 1, 0, 1, 0, 0, 1.0f, "N 32, X [K, P], S [K, R] (LoRA's dA = x^T dh)"},
        {200, 64, 333, 1, 1, 1, 0, 0, 0.0f, "N 64, X [K, P], S [R, K]"},
        /* M narrow: X = op(B)^T, S = op(A) */
        {16, 200, 333, 0, 0, 0, 1, 0, 1.0f, "M 16, X [K, P], S [R, K] (LoRA's dB)"},
        {5, 203, 336, 0, 1, 0, 1, 0, 0.0f, "M 5, X [P, K], S [R, K]"},
        {24, 200, 333, 1, 0, 0, 1, 0, 0.3f, "M 24, X [K, P], S [K, R]"},
        {64, 203, 336, 1, 1, 0, 1, 0, 0.0f, "M 64, X [P, K], S [K, R]"},
        /* K of one stage: one split */
        {300, 16, 64, 0, 1, 1, 0, 0, 0.3f, "N 16, K 64: one split"},
        /* blocks of three stages of 64 (K split into 10 of 192 and one of 128) */
        {1100, 16, 2048, 0, 1, 1, 0, 0, 0.0f, "N 16, 1100 x 2048, three stages a block"},
        {64, 1104, 2048, 1, 0, 0, 1, 0, 1.0f, "M 64, 1104 x 2048, two buffers a block"},
        /* X in fp32 (rounded first), X bf16 off 16-byte alignment (copied first), and a
         * shape the kernel does not take (K not a multiple of 8 with X [P, K]) */
        {203, 16, 336, 0, 1, 0, 0, 0, 0.0f, "N 16, X fp32"},
        {203, 16, 336, 0, 1, 1, 0, 1, 0.3f, "N 16, X bf16 at an odd address"},
        {203, 16, 333, 0, 1, 1, 0, 0, 0.0f, "N 16, K 333 with X [P, K] (the GEMM library)"},
        {1, 203, 336, 0, 1, 0, 1, 0, 0.0f, "M 1 (a decode step's product)"},
    };
    for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) {
        int same = 0;
        const double w = narrow_run(cs[i].M, cs[i].N, cs[i].K, cs[i].ta, cs[i].tb, cs[i].a16,
                                    cs[i].b16, cs[i].off, cs[i].beta, &same);
        check(w <= 1.0 && same, "narrow matmul16 %s, beta %g: vs rounded operands %.2f of the "
              "bound, %s", cs[i].what, (double)cs[i].beta, w,
              same ? "the same bits run to run" : "NOT the same bits run to run");
    }
    g_gpu->matmul_dtype = TZ_DT_F32;
}

/* Weights stored in bf16 (tz_param.w16): matmul_bw16 and embedding_fwd_w16 against the CPU's
 * (fp32 GEMMs: the GEMM tolerance; the lookup: exact), and with bf16 GEMMs bit for bit
 * against matmul of the widened weight (rounding a bf16 value to bf16 changes nothing, so the
 * GEMM sees the same operands). */
static void test_w16(void) {
    const int64_t M = 23, N = 41, K = 67, V = 50, n = 37;
    uint16_t *b16 = malloc((size_t)(K * N) * 2), *t16 = malloc((size_t)(V * N) * 2);
    pair A = mk(M * K, 1.0f), Bw = mk(K * N, 1.0f), C = mk(M * N, 1.0f), C2 = mkz(M * N);
    for (int64_t i = 0; i < K * N; i++)
        b16[i] = tz_f32_to_bf16(Bw.h[i]), Bw.h[i] = tz_bf16_to_f32(b16[i]);
    g_gpu->upload(g_gpu, Bw.d, Bw.h, (size_t)(K * N) * 4);
    uint16_t *db16 = g_gpu->alloc(g_gpu, (size_t)(K * N) * 2);
    g_gpu->upload(g_gpu, db16, b16, (size_t)(K * N) * 2);
    for (int tb = 0; tb < 2; tb++) {
        g_gpu->copy(g_gpu, C2.d, C.d, (size_t)(M * N) * 4); /* C's first values, kept */
        g_cpu->matmul_bw16(g_cpu, C.h, A.h, b16, M, N, K, 0, tb, 0.6f, 0.2f);
        g_gpu->matmul_bw16(g_gpu, C.d, A.d, db16, M, N, K, 0, tb, 0.6f, 0.2f);
        char what[64];
        snprintf(what, sizeof what, "matmul_bw16 transB=%d (fp32)", tb);
        expect(what, &C, 1e-5);
        g_gpu->matmul_dtype = TZ_DT_BF16;
        g_gpu->copy(g_gpu, C.d, C2.d, (size_t)(M * N) * 4);
        g_gpu->matmul_bw16(g_gpu, C.d, A.d, db16, M, N, K, 0, tb, 0.6f, 0.2f);
        g_gpu->matmul(g_gpu, C2.d, A.d, Bw.d, M, N, K, 0, tb, 0.6f, 0.2f);
        g_gpu->matmul_dtype = TZ_DT_F32;
        float *x = malloc((size_t)(M * N) * 4), *y = malloc((size_t)(M * N) * 4);
        g_gpu->download(g_gpu, x, C.d, (size_t)(M * N) * 4);
        g_gpu->download(g_gpu, y, C2.d, (size_t)(M * N) * 4);
        check(!memcmp(x, y, (size_t)(M * N) * 4),
              "matmul_bw16 transB=%d (bf16) = bf16 matmul of the widened weight, bit for bit", tb);
        memcpy(C.h, x, (size_t)(M * N) * 4); /* the host copy follows the device again */
        g_gpu->upload(g_gpu, C.d, C.h, (size_t)(M * N) * 4);
        free(x), free(y);
    }
    { /* the casts: rounding to nearest even and widening, exactly the CPU's */
        const int64_t nc = 10007;
        pair x = mk(nc, 3.0f), y = mkz(nc);
        x.h[0] = NAN, x.h[1] = 1.00390625f /* a tie: 1 + 2^-8 rounds to 1 */, x.h[2] = -0.0f;
        g_gpu->upload(g_gpu, x.d, x.h, 3 * sizeof(float));
        uint16_t *h16 = malloc((size_t)nc * 2), *d16 = g_gpu->alloc(g_gpu, (size_t)nc * 2);
        g_cpu->to_bf16(g_cpu, h16, x.h, nc);
        g_gpu->to_bf16(g_gpu, d16, x.d, nc);
        uint16_t *back = malloc((size_t)nc * 2);
        g_gpu->download(g_gpu, back, d16, (size_t)nc * 2);
        int same = 1;
        for (int64_t i = 1; i < nc; i++) same &= back[i] == h16[i];
        check(same && (back[0] & 0x7f80) == 0x7f80 && (back[0] & 0x7f), "to_bf16: the CPU's bits "
              "(NaN stays NaN)");
        g_cpu->from_bf16(g_cpu, y.h, h16, nc);
        g_gpu->from_bf16(g_gpu, y.d, d16, nc);
        y.h[0] = 0, g_gpu->upload(g_gpu, y.d, y.h, sizeof(float)); /* NaN compared above */
        expect("from_bf16", &y, 0);
        free(h16), free(back), g_gpu->release(g_gpu, d16);
        drop(&x), drop(&y);
    }
    for (int64_t i = 0; i < V * N; i++) t16[i] = tz_f32_to_bf16(urand(2.0f));
    int32_t tok[37];
    for (int64_t i = 0; i < n; i++) tok[i] = (int32_t)tz_rng_below(&g_rng, (uint64_t)V);
    int32_t *dtok = up_i32(tok, n);
    uint16_t *dt16 = g_gpu->alloc(g_gpu, (size_t)(V * N) * 2);
    g_gpu->upload(g_gpu, dt16, t16, (size_t)(V * N) * 2);
    pair E = mkz(n * N);
    g_cpu->embedding_fwd_w16(g_cpu, E.h, tok, t16, n, N);
    g_gpu->embedding_fwd_w16(g_gpu, E.d, dtok, dt16, n, N);
    expect("embedding_fwd_w16", &E, 0);
    g_gpu->release(g_gpu, db16), g_gpu->release(g_gpu, dt16), g_gpu->release(g_gpu, dtok);
    free(b16), free(t16);
    drop(&A), drop(&Bw), drop(&C), drop(&C2), drop(&E);
}

/* ---- embedding, RoPE, layouts ---- */

static void test_layout(void) {
    const int64_t V = 50, C = 67, n = 301;
    int32_t tok[301];
    for (int64_t i = 0; i < n; i++) tok[i] = (int32_t)tz_rng_below(&g_rng, (uint64_t)V);
    int32_t *dtok = up_i32(tok, n);
    pair table = mk(V * C, 1.0f), out = mkz(n * C), dout = mk(n * C, 1.0f);
    g_cpu->embedding_fwd(g_cpu, out.h, tok, table.h, n, C);
    g_gpu->embedding_fwd(g_gpu, out.d, dtok, table.d, n, C);
    expect("embedding_fwd", &out, 0);
    g_cpu->embedding_bwd(g_cpu, table.h, tok, dout.h, n, C);
    g_gpu->embedding_bwd(g_gpu, table.d, dtok, dout.d, n, C);
    expect("embedding_bwd (repeated ids, same order)", &table, 0);
    drop(&table), drop(&out), drop(&dout);
    g_gpu->release(g_gpu, dtok);

    const int64_t B = 2, T = 37, H = 3, D = 18;
    pair x = mk(B * T * H * D, 1.0f);
    g_cpu->rope_fwd(g_cpu, x.h, B, T, H, D, 10000.0f);
    g_gpu->rope_fwd(g_gpu, x.d, B, T, H, D, 10000.0f);
    expect("rope_fwd", &x, 1e-6);
    g_cpu->rope_bwd(g_cpu, x.h, B, T, H, D, 500000.0f);
    g_gpu->rope_bwd(g_gpu, x.d, B, T, H, D, 500000.0f); /* a new table */
    expect("rope_bwd (another theta)", &x, 1e-6);
    /* the table form at an offset: the angle is the same float product on both, cos and sin
     * are the host's and the device's cosf/sinf (2 ulp apart at most; angles up to ~60 rad
     * lose a few more bits in the argument reduction), hence 2e-6 */
    pair inv = mk(D / 2, 0.0f);
    for (int64_t i = 0; i < D / 2; i++) /* every third frequency scaled down, as llama3 does */
        inv.h[i] = 1.0f / powf(10000.0f, (float)(2 * i) / (float)D) * (i % 3 ? 1.0f : 0.125f);
    g_gpu->upload(g_gpu, inv.d, inv.h, (size_t)inv.n * 4);
    g_cpu->rope_tab_fwd(g_cpu, x.h, B, T, H, D, inv.h, 23);
    g_gpu->rope_tab_fwd(g_gpu, x.d, B, T, H, D, inv.d, 23);
    expect("rope_tab_fwd (pos0 23, scaled table)", &x, 2e-6);
    g_cpu->rope_tab_bwd(g_cpu, x.h, B, T, H, D, inv.h, 5);
    g_gpu->rope_tab_bwd(g_gpu, x.d, B, T, H, D, inv.d, 5);
    expect("rope_tab_bwd (pos0 5)", &x, 2e-6);
    drop(&x);
    /* rope_fwd16: rope_fwd's values rounded by to_bf16, bit for bit, on each backend (x kept);
     * the two backends' bf16 within one unit of each other (their fp32 within 1e-6 above);
     * rope_bwd16 likewise against rope_bwd, and rope_tab_fwd16, rope_tab_bwd16 against
     * rope_tab_fwd, rope_tab_bwd (the scaled table above, pos0 7) */
    for (int v = 0; v < 4; v++) {
        const int bwd = v & 1, tab = v >> 1;
        const char *ops[4] = {"rope_fwd16", "rope_bwd16", "rope_tab_fwd16", "rope_tab_bwd16"};
        const char *op = ops[v], *op32[4] = {"rope_fwd", "rope_bwd", "rope_tab_fwd", "rope_tab_bwd"};
        const int64_t nr = B * T * H * D;
        pair r = mk(nr, 1.0f), r32 = mkz(nr);
        uint16_t *y16 = g_gpu->alloc(g_gpu, (size_t)nr * 2), *h16 = malloc((size_t)nr * 2);
        uint16_t *c16 = malloc((size_t)nr * 2), *g16 = malloc((size_t)nr * 2);
        g_gpu->copy(g_gpu, r32.d, r.d, (size_t)nr * 4);
        if (tab) {
            (bwd ? g_gpu->rope_tab_bwd16 : g_gpu->rope_tab_fwd16)(g_gpu, y16, r.d, B, T, H, D,
                                                                  inv.d, 7);
            (bwd ? g_gpu->rope_tab_bwd : g_gpu->rope_tab_fwd)(g_gpu, r32.d, B, T, H, D, inv.d, 7);
        } else {
            (bwd ? g_gpu->rope_bwd16 : g_gpu->rope_fwd16)(g_gpu, y16, r.d, B, T, H, D, 10000.0f);
            (bwd ? g_gpu->rope_bwd : g_gpu->rope_fwd)(g_gpu, r32.d, B, T, H, D, 10000.0f);
        }
        const int same = same16(g_gpu, y16, r32.d, nr);
        float *back = malloc((size_t)nr * 4);
        g_gpu->download(g_gpu, back, r.d, (size_t)nr * 4);
        const int kept = !memcmp(back, r.h, (size_t)nr * 4);
        memcpy(r32.h, r.h, (size_t)nr * 4);
        if (tab) {
            (bwd ? g_cpu->rope_tab_bwd16 : g_cpu->rope_tab_fwd16)(g_cpu, c16, r.h, B, T, H, D,
                                                                  inv.h, 7);
            (bwd ? g_cpu->rope_tab_bwd : g_cpu->rope_tab_fwd)(g_cpu, r32.h, B, T, H, D, inv.h, 7);
        } else {
            (bwd ? g_cpu->rope_bwd16 : g_cpu->rope_fwd16)(g_cpu, c16, r.h, B, T, H, D, 10000.0f);
            (bwd ? g_cpu->rope_bwd : g_cpu->rope_fwd)(g_cpu, r32.h, B, T, H, D, 10000.0f);
        }
        int cpu_same = 1, near = 1;
        g_gpu->download(g_gpu, g16, y16, (size_t)nr * 2);
        for (int64_t i = 0; i < nr; i++) {
            h16[i] = tz_f32_to_bf16(r32.h[i]);
            cpu_same &= c16[i] == h16[i];
            const int dd = (int)c16[i] - (int)g16[i];
            near &= (c16[i] >> 15) == (g16[i] >> 15) && dd >= -1 && dd <= 1;
        }
        check(same && kept && cpu_same && near, "%s: %s rounded by to_bf16, bit for bit on each "
              "backend (%s, %s), x kept (%s), the backends within a bf16 unit (%s)", op, op32[v],
              same ? "device" : "DEVICE DIFFERS", cpu_same ? "CPU" : "CPU DIFFERS",
              kept ? "yes" : "NO", near ? "yes" : "NO");
        g_gpu->release(g_gpu, y16);
        free(h16), free(c16), free(g16), free(back);
        drop(&r), drop(&r32);
    }
    drop(&inv);

    for (int cl = 0; cl < 2; cl++) {
        const int64_t Bi = 2, Ci = 3, Hi = 12, Wi = 8, p = 4, P = Ci * p * p;
        const int64_t Tt = (Hi / p) * (Wi / p);
        pair img = mk(Bi * Ci * Hi * Wi, 1.0f), tk = mkz(Bi * Tt * P), back = mkz(img.n);
        g_cpu->patchify(g_cpu, tk.h, img.h, Bi, Ci, Hi, Wi, p, cl);
        g_gpu->patchify(g_gpu, tk.d, img.d, Bi, Ci, Hi, Wi, p, cl);
        expect(cl ? "patchify chan_last" : "patchify", &tk, 0);
        g_cpu->unpatchify(g_cpu, back.h, tk.h, Bi, Ci, Hi, Wi, p, cl);
        g_gpu->unpatchify(g_gpu, back.d, tk.d, Bi, Ci, Hi, Wi, p, cl);
        expect(cl ? "unpatchify chan_last" : "unpatchify", &back, 0);
        drop(&img), drop(&tk), drop(&back);
    }
    pair src = mk(9 * 20, 1.0f), dst = mk(9 * 17, 1.0f);
    g_cpu->copy2d(g_cpu, dst.h, 17, src.h, 20, 9, 13);
    g_gpu->copy2d(g_gpu, dst.d, 17, src.d, 20, 9, 13);
    expect("copy2d", &dst, 0);
    drop(&src), drop(&dst);
}

/* ---- norms ---- */

static void test_norm(void) {
    const int64_t rows = 29, C = 333;
    pair x = mk(rows * C, 2.0f), w = mk(C, 1.0f), out = mkz(rows * C), rstd = mkz(rows);
    pair dout = mk(rows * C, 1.0f), dx = mk(rows * C, 1.0f), dw = mk(C, 1.0f);
    g_cpu->rmsnorm_fwd(g_cpu, out.h, rstd.h, x.h, w.h, rows, C, 1e-5f);
    g_gpu->rmsnorm_fwd(g_gpu, out.d, rstd.d, x.d, w.d, rows, C, 1e-5f);
    expect("rmsnorm_fwd out", &out, 1e-5);
    expect("rmsnorm_fwd rstd", &rstd, 1e-5);
    g_cpu->rmsnorm_bwd(g_cpu, dx.h, dw.h, dout.h, x.h, w.h, rstd.h, rows, C, 1);
    g_gpu->rmsnorm_bwd(g_gpu, dx.d, dw.d, dout.d, x.d, w.d, rstd.d, rows, C, 1);
    expect("rmsnorm_bwd dx", &dx, 1e-5);
    expect("rmsnorm_bwd dw", &dw, 1e-5);
    g_cpu->rmsnorm_bwd(g_cpu, dx.h, NULL, dout.h, x.h, w.h, rstd.h, rows, C, 1);
    g_gpu->rmsnorm_bwd(g_gpu, dx.d, NULL, dout.d, x.d, w.d, rstd.d, rows, C, 1);
    expect("rmsnorm_bwd dx (frozen weight)", &dx, 1e-5);
    pair mean = mkz(rows);
    for (int64_t i = 0; i < x.n; i++) x.h[i] += 0.5f; /* a mean to remove */
    g_gpu->upload(g_gpu, x.d, x.h, (size_t)x.n * 4);
    g_cpu->layernorm_fwd(g_cpu, out.h, mean.h, rstd.h, x.h, rows, C, 1e-6f);
    g_gpu->layernorm_fwd(g_gpu, out.d, mean.d, rstd.d, x.d, rows, C, 1e-6f);
    expect("layernorm_fwd out", &out, 1e-5);
    expect("layernorm_fwd mean", &mean, 1e-5);
    expect("layernorm_fwd rstd", &rstd, 1e-5);
    g_cpu->layernorm_bwd(g_cpu, dx.h, dout.h, x.h, mean.h, rstd.h, rows, C);
    g_gpu->layernorm_bwd(g_gpu, dx.d, dout.d, x.d, mean.d, rstd.d, rows, C);
    expect("layernorm_bwd dx", &dx, 1e-5);
    drop(&x), drop(&w), drop(&out), drop(&rstd), drop(&dout), drop(&dx), drop(&dw), drop(&mean);
}

/* bias_bwd writing dy's bf16 copy in its pass: the same dbias bits as without, and the copy
 * to_bf16's bits (dy: backend memory) */
static void bias_bwd16_same(tz_backend *be, const char *tag, const float *dy, int64_t rows,
                            int64_t C) {
    float *db = be->alloc(be, (size_t)(2 * C) * 4);
    uint16_t *d16 = be->alloc(be, (size_t)(rows * C) * 2), *r16 = be->alloc(be, (size_t)(rows * C) * 2);
    be->fill(be, db, 0.5f, 2 * C);
    be->bias_bwd(be, db, dy, rows, C, NULL);
    be->bias_bwd(be, db + C, dy, rows, C, d16);
    be->to_bf16(be, r16, dy, rows * C);
    float *h = malloc((size_t)(2 * C) * 4);
    uint16_t *a = malloc((size_t)(rows * C) * 2), *b = malloc((size_t)(rows * C) * 2);
    be->download(be, h, db, (size_t)(2 * C) * 4);
    be->download(be, a, d16, (size_t)(rows * C) * 2);
    be->download(be, b, r16, (size_t)(rows * C) * 2);
    check(!memcmp(h, h + C, (size_t)C * 4) && !memcmp(a, b, (size_t)(rows * C) * 2),
          "%s bias_bwd with dy's bf16 copy: dbias the same bits, the copy to_bf16's", tag);
    free(h), free(a), free(b);
    be->release(be, db), be->release(be, d16), be->release(be, r16);
}

/* ---- activations ---- */

/* Whether got holds want's n bf16 bit patterns; if not, the first element that differs and
 * how many do, printed under what (a bit check's diagnosis on a GPU) */
static int bits16_same(const char *what, const uint16_t *got, const uint16_t *want, int64_t n) {
    int64_t first = -1, count = 0;
    for (int64_t i = 0; i < n; i++)
        if (got[i] != want[i]) count++, first = first < 0 ? i : first;
    if (count)
        printf("  %s: %lld of %lld elements differ, the first at %lld: 0x%04x, expected 0x%04x\n",
               what, (long long)count, (long long)n, (long long)first, got[first], want[first]);
    return !count;
}

/* Whether d16 (n bf16 bit patterns, backend memory) holds d32's n floats rounded by to_bf16:
 * to the bit, or (ulp) within one bf16 unit of it */
static int near16(tz_backend *be, const void *d16, const float *d32, int64_t n, int ulp) {
    uint16_t *r16 = be->alloc(be, (size_t)n * 2);
    be->to_bf16(be, r16, d32, n);
    uint16_t *a = malloc((size_t)n * 2), *b = malloc((size_t)n * 2);
    be->download(be, a, r16, (size_t)n * 2);
    be->download(be, b, d16, (size_t)n * 2);
    int same = 1;
    for (int64_t i = 0; i < n; i++) {
        const int d = (int)a[i] - (int)b[i];
        same &= ulp ? (a[i] >> 15) == (b[i] >> 15) && d >= -1 && d <= 1 : d == 0;
    }
    free(a), free(b);
    be->release(be, r16);
    return same;
}
static int same16(tz_backend *be, const void *d16, const float *d32, int64_t n) {
    return near16(be, d16, d32, n, 0);
}

/* The gradients the backward ops write in bf16 (swiglu_bwd's out_bf16, gate_bwd's and
 * gelu_tanh_bwd's accumulate 2) = their fp32 ones rounded by to_bf16, bit for bit (the form
 * the next linear's GEMMs would have rounded them to); gelu's in its row form too */
static void bwd16_same(tz_backend *be, const char *tag, const pair *g, const pair *u,
                       const pair *dout, int64_t n) {
    float *d32 = be->alloc(be, (size_t)(2 * n) * 4), *d16 = be->alloc(be, (size_t)(2 * n) * 4);
    be->swiglu_bwd(be, d32, d32 + n, dout->d, g->d, u->d, n, 0, 0);
    be->swiglu_bwd(be, d16, d16 + n, dout->d, g->d, u->d, n, 0, 1);
    check(same16(be, d16, d32, n) && same16(be, d16 + n, d32 + n, n),
          "%s swiglu_bwd into bf16 = its fp32 gradients rounded by to_bf16, bit for bit", tag);
    be->swiglu_fwd(be, d32, g->d, u->d, n, 0);
    be->swiglu_fwd(be, d16, g->d, u->d, n, 1);
    check(same16(be, d16, d32, n),
          "%s swiglu_fwd into bf16 = its fp32 out rounded by to_bf16, bit for bit", tag);
    be->gelu_tanh_bwd(be, d32, dout->d, g->d, n, 0, 0, 0);
    be->gelu_tanh_bwd(be, d16, dout->d, g->d, n, 2, 0, 0);
    int gsame = same16(be, d16, d32, n);
    const int64_t cols = 97, rows = n / (2 * cols); /* dout's rows at stride 2 cols */
    be->gelu_tanh_bwd(be, d32, dout->d, g->d, rows * cols, 0, cols, 2 * cols);
    be->gelu_tanh_bwd(be, d16, dout->d, g->d, rows * cols, 2, cols, 2 * cols);
    gsame &= same16(be, d16, d32, rows * cols);
    check(gsame, "%s gelu_tanh_bwd into bf16 (dense, rows) = its fp32 dx rounded by to_bf16, "
          "bit for bit", tag);
    /* modulate's forward into bf16, and the gate's backward, over [2, n / 2 / C, C] rows with
     * the shift, scale and gate rows of u (ld C) */
    const int64_t C = 61, T = n / 2 / C;
    be->gate_bwd(be, d32, NULL, dout->d, g->d, u->d, C, 2, T, C, 0);
    be->gate_bwd(be, d16, NULL, dout->d, g->d, u->d, C, 2, T, C, 2);
    check(same16(be, d16, d32, 2 * T * C),
          "%s gate_bwd's dy into bf16 = its fp32 dy rounded by to_bf16, bit for bit", tag);
    /* matmul_bias into bf16 (its GEMM's epilogue) = the fp32 C rounded, over bf16 operands: to
     * the bit on the emulation (one cuBLAS sum for both); a GPU's cuBLAS may take another
     * kernel for a bf16 C, summing in another order: within one bf16 unit there */
    if (be->matmul_dtype == TZ_DT_BF16) {
        const int64_t M = 2 * T, N = 37, K = C;
        tz_device_info di;
        be->device_info(be, &di);
        const int emu = strstr(di.name, "CPU emulation") != NULL;
        be->matmul_bias(be, d32, g->d, 0, u->d, 0, dout->d, M, N, K, 0);
        be->matmul_bias(be, d16, g->d, 0, u->d, 0, dout->d, M, N, K, 1);
        check(near16(be, d16, d32, M * N, !emu),
              "%s matmul_bias into bf16 = its fp32 C rounded by to_bf16, %s", tag,
              emu ? "bit for bit" : "within one bf16 unit");
    }
    be->modulate_fwd(be, d32, dout->d, u->d, u->d + 2 * C, C, 2, T, C, 0);
    be->modulate_fwd(be, d16, dout->d, u->d, u->d + 2 * C, C, 2, T, C, 1);
    check(same16(be, d16, d32, 2 * T * C),
          "%s modulate_fwd into bf16 = its fp32 out rounded by to_bf16, bit for bit", tag);
    be->release(be, d32), be->release(be, d16);
}

/* Whether n floats of backend memory a and b are the same bits */
static int dev_same(tz_backend *be, const float *a, const float *b, int64_t n) {
    float *x = malloc((size_t)n * 8), *y = x + n;
    be->download(be, x, a, (size_t)n * 4), be->download(be, y, b, (size_t)n * 4);
    const int same = !memcmp(x, y, (size_t)n * 4);
    free(x);
    return same;
}

/* SwiGLU on g and u given in bf16 (TZ_SWIGLU_IN16: a GEMM's bf16 output) = SwiGLU on their
 * values widened to fp32 (from_bf16), bit for bit, every output form: forward into fp32 and
 * into bf16, backward written and accumulated in fp32, written in bf16 */
static void in16_same(tz_backend *be, const char *tag, const pair *g, const pair *u,
                      const pair *dout, int64_t n) {
    uint16_t *gu16 = be->alloc(be, (size_t)(2 * n) * 2);
    float *guw = be->alloc(be, (size_t)(2 * n) * 4), *o = be->alloc(be, (size_t)(4 * n) * 4);
    float *w = o + 2 * n; /* (o: the IN16 results, w: the widened inputs') */
    be->to_bf16(be, gu16, g->d, n), be->to_bf16(be, gu16 + n, u->d, n);
    be->from_bf16(be, guw, gu16, 2 * n);
    const float *g16 = (const float *)(const void *)gu16;
    const float *u16 = (const float *)(const void *)(gu16 + n);
    int same = 1;
    for (int out16 = 0; out16 < 2; out16++) {
        const int64_t cmp = out16 ? (n + 1) / 2 : n; /* floats holding the outputs */
        be->swiglu_fwd(be, o, g16, u16, n, TZ_SWIGLU_IN16 | out16);
        be->swiglu_fwd(be, w, guw, guw + n, n, out16);
        same &= dev_same(be, o, w, cmp);
        for (int acc = 0; acc < 2 - out16; acc++) { /* (bf16: written only) */
            if (acc) be->fill(be, o, 0.25f, 2 * n), be->fill(be, w, 0.25f, 2 * n);
            be->swiglu_bwd(be, o, o + n, dout->d, g16, u16, n, acc, TZ_SWIGLU_IN16 | out16);
            be->swiglu_bwd(be, w, w + n, dout->d, guw, guw + n, n, acc, out16);
            same &= dev_same(be, o, w, cmp) && dev_same(be, o + n, w + n, cmp);
        }
    }
    check(same, "%s swiglu_fwd and swiglu_bwd on g, u in bf16 (TZ_SWIGLU_IN16) = on their values "
          "widened, bit for bit (fp32 and bf16 outputs, gradients written and accumulated)", tag);
    be->release(be, gu16), be->release(be, guw), be->release(be, o);
}

/* GELU on x given in bf16 (TZ_GELU_X16: a GEMM's bf16 output) = GELU on x widened, bit for
 * bit: the forward into fp32 and bf16, dense and as rows at a stride; the backward written,
 * accumulated and in bf16, dense and as rows; gelu_tanh_bwd_bias (dx in bf16, the bias's
 * column sums added to) */
static void gelu_x16_same(tz_backend *be, const char *tag, const pair *x, const pair *dout,
                          int64_t n) {
    const int64_t cols = 97, rows = n / (2 * cols), nr = rows * cols; /* rows at stride 2 cols */
    uint16_t *x16 = be->alloc(be, (size_t)n * 2);
    float *xw = be->alloc(be, (size_t)n * 4), *o = be->alloc(be, (size_t)(2 * n) * 4);
    float *w = be->alloc(be, (size_t)(2 * n) * 4);
    be->to_bf16(be, x16, x->d, n);
    be->from_bf16(be, xw, x16, n);
    const float *xb = (const float *)(const void *)x16;
    int same = 1;
    for (int out16 = 0; out16 < 2; out16++) {
        const int64_t cmp = out16 ? (n + 1) / 2 : n;
        be->fill(be, o, 0.5f, 2 * n), be->fill(be, w, 0.5f, 2 * n);
        be->gelu_tanh_fwd(be, o, xb, n, 0, 0, TZ_GELU_X16 | out16);
        be->gelu_tanh_fwd(be, w, xw, n, 0, 0, out16);
        same &= dev_same(be, o, w, cmp);
        be->gelu_tanh_fwd(be, o, xb, nr, cols, 2 * cols, TZ_GELU_X16 | out16);
        be->gelu_tanh_fwd(be, w, xw, nr, cols, 2 * cols, out16);
        same &= dev_same(be, o, w, 2 * n);
    }
    for (int acc = 0; acc < 3; acc++) {
        const int64_t cmp = acc == 2 ? (n + 1) / 2 : n;
        be->fill(be, o, 0.25f, 2 * n), be->fill(be, w, 0.25f, 2 * n);
        be->gelu_tanh_bwd(be, o, dout->d, xb, n, acc | TZ_GELU_X16, 0, 0);
        be->gelu_tanh_bwd(be, w, dout->d, xw, n, acc, 0, 0);
        same &= dev_same(be, o, w, cmp);
        be->gelu_tanh_bwd(be, o, dout->d, xb, nr, acc | TZ_GELU_X16, cols, 2 * cols);
        be->gelu_tanh_bwd(be, w, dout->d, xw, nr, acc, cols, 2 * cols);
        same &= dev_same(be, o, w, 2 * n);
    }
    be->fill(be, o, 0.125f, 2 * n), be->fill(be, w, 0.125f, 2 * n);
    be->gelu_tanh_bwd_bias(be, (uint16_t *)(void *)o, o + n, dout->d, xb, rows, 2 * cols, 1);
    be->gelu_tanh_bwd_bias(be, (uint16_t *)(void *)w, w + n, dout->d, xw, rows, 2 * cols, 0);
    same &= dev_same(be, o, w, 2 * n);
    check(same, "%s gelu_tanh_fwd, gelu_tanh_bwd and gelu_tanh_bwd_bias on x in bf16 "
          "(TZ_GELU_X16) = on x widened, bit for bit (fp32 and bf16 outputs, dense and rows, "
          "gradients written, added and in bf16)", tag);
    be->release(be, x16), be->release(be, xw), be->release(be, o), be->release(be, w);
}

static void test_activation(void) {
    const int64_t n = 10007;
    pair g = mk(n, 6.0f), u = mk(n, 2.0f), out = mkz(n), dout = mk(n, 1.0f);
    pair dg = mk(n, 1.0f), du = mk(n, 1.0f);
    g_cpu->swiglu_fwd(g_cpu, out.h, g.h, u.h, n, 0), g_gpu->swiglu_fwd(g_gpu, out.d, g.d, u.d, n, 0);
    expect("swiglu_fwd", &out, 1e-6);
    g_cpu->swiglu_bwd(g_cpu, dg.h, du.h, dout.h, g.h, u.h, n, 1, 0);
    g_gpu->swiglu_bwd(g_gpu, dg.d, du.d, dout.d, g.d, u.d, n, 1, 0);
    expect("swiglu_bwd dg", &dg, 1e-6);
    expect("swiglu_bwd du", &du, 1e-6);
    bwd16_same(g_gpu, "gpu", &g, &u, &dout, n);
    in16_same(g_cpu, "cpu", &g, &u, &dout, n);
    in16_same(g_gpu, "gpu", &g, &u, &dout, n);
    gelu_x16_same(g_cpu, "cpu", &g, &dout, n);
    gelu_x16_same(g_gpu, "gpu", &g, &dout, n);
    g_gpu->matmul_dtype = TZ_DT_BF16;
    bwd16_same(g_gpu, "gpu bf16", &g, &u, &dout, n);
    g_gpu->matmul_dtype = TZ_DT_F32;
    g_cpu->gelu_tanh_fwd(g_cpu, out.h, g.h, n, 0, 0, 0);
    g_gpu->gelu_tanh_fwd(g_gpu, out.d, g.d, n, 0, 0, 0);
    expect("gelu_tanh_fwd", &out, 1e-6);
    g_cpu->gelu_tanh_bwd(g_cpu, dg.h, dout.h, g.h, n, 1, 0, 0);
    g_gpu->gelu_tanh_bwd(g_gpu, dg.d, dout.d, g.d, n, 1, 0, 0);
    expect("gelu_tanh_bwd", &dg, 1e-6);
    g_cpu->silu_fwd(g_cpu, out.h, g.h, n), g_gpu->silu_fwd(g_gpu, out.d, g.d, n);
    expect("silu_fwd", &out, 1e-6);
    g_cpu->silu_bwd(g_cpu, dg.h, dout.h, g.h, n, 1), g_gpu->silu_bwd(g_gpu, dg.d, dout.d, g.d, n, 1);
    expect("silu_bwd", &dg, 1e-6);
    drop(&g), drop(&u), drop(&out), drop(&dout), drop(&dg), drop(&du);
}

/* ---- losses ---- */

static void test_loss(void) {
    const int64_t n = 13, V = 1001;
    int32_t tgt[13];
    for (int64_t i = 0; i < n; i++) tgt[i] = i % 5 == 3 ? -1 : (int32_t)tz_rng_below(&g_rng, V);
    int32_t *dt = up_i32(tgt, n);
    pair logits = mk(n * V, 8.0f), loss = mk(n, 1.0f), dl = mk(n * V, 1.0f);
    g_cpu->xent_fwd(g_cpu, loss.h, logits.h, tgt, n, V);
    g_gpu->xent_fwd(g_gpu, loss.d, logits.d, dt, n, V);
    expect("xent_fwd (ignored rows give 0)", &loss, 1e-5);
    g_cpu->xent_bwd(g_cpu, dl.h, logits.h, tgt, 0.25f, n, V);
    g_gpu->xent_bwd(g_gpu, dl.d, logits.d, dt, 0.25f, n, V);
    expect("xent_bwd", &dl, 1e-5);
    g_cpu->xent_bwd(g_cpu, logits.h, logits.h, tgt, 0.25f, n, V);
    g_gpu->xent_bwd(g_gpu, logits.d, logits.d, dt, 0.25f, n, V);
    expect("xent_bwd in place", &logits, 1e-5);
    drop(&logits), drop(&loss), drop(&dl);
    g_gpu->release(g_gpu, dt);

    const int64_t rows = 7, m = 50, ld = 60;
    pair pred = mk(rows * ld, 1.0f), target = mk(rows * m, 1.0f), sse = mkz(rows);
    pair dpred = mk(rows * ld, 1.0f);
    g_cpu->mse_fwd(g_cpu, sse.h, pred.h, ld, target.h, rows, m);
    g_gpu->mse_fwd(g_gpu, sse.d, pred.d, ld, target.d, rows, m);
    expect("mse_fwd", &sse, 1e-6);
    g_cpu->mse_bwd(g_cpu, dpred.h, pred.h, ld, target.h, 0.1f, rows, m);
    g_gpu->mse_bwd(g_gpu, dpred.d, pred.d, ld, target.d, 0.1f, rows, m);
    expect("mse_bwd (extra channels untouched)", &dpred, 1e-6);
    drop(&pred), drop(&target), drop(&sse), drop(&dpred);
}

/* ---- DiT conditioning ---- */

static void test_conditioning(void) {
    const int64_t B = 3, T = 19, C = 37, ld = 3 * C, n = B * T * C;
    pair x = mk(n, 1.0f), y = mk(n, 1.0f), cond = mk(B * ld, 0.5f), out = mkz(n);
    pair dout = mk(n, 1.0f), dx = mk(n, 1.0f), dcond = mk(B * ld, 1.0f);
    const float *shift_h = cond.h, *scale_h = cond.h + C, *gate_h = cond.h + 2 * C;
    const float *shift_d = cond.d, *scale_d = cond.d + C, *gate_d = cond.d + 2 * C;
    g_cpu->modulate_fwd(g_cpu, out.h, x.h, shift_h, scale_h, ld, B, T, C, 0);
    g_gpu->modulate_fwd(g_gpu, out.d, x.d, shift_d, scale_d, ld, B, T, C, 0);
    expect("modulate_fwd", &out, 1e-6);
    g_cpu->modulate_bwd(g_cpu, dx.h, dcond.h, dcond.h + C, dout.h, x.h, scale_h, ld, B, T, C, 1);
    g_gpu->modulate_bwd(g_gpu, dx.d, dcond.d, dcond.d + C, dout.d, x.d, scale_d, ld, B, T, C, 1);
    expect("modulate_bwd dx", &dx, 1e-6);
    expect("modulate_bwd dshift, dscale", &dcond, 1e-6);
    g_cpu->gate_fwd(g_cpu, out.h, x.h, y.h, gate_h, ld, B, T, C);
    g_gpu->gate_fwd(g_gpu, out.d, x.d, y.d, gate_d, ld, B, T, C);
    expect("gate_fwd", &out, 1e-6);
    g_cpu->gate_bwd(g_cpu, dx.h, dcond.h + 2 * C, dout.h, y.h, gate_h, ld, B, T, C, 1);
    g_gpu->gate_bwd(g_gpu, dx.d, dcond.d + 2 * C, dout.d, y.d, gate_d, ld, B, T, C, 1);
    expect("gate_bwd dy", &dx, 1e-6);
    expect("gate_bwd dgate", &dcond, 1e-6);
    /* bias over more rows than one column-sum chunk */
    const int64_t rows = 141, Cb = 29;
    pair yb = mk(rows * Cb, 1.0f), bias = mk(Cb, 1.0f);
    g_cpu->bias_add_fwd(g_cpu, yb.h, bias.h, rows, Cb);
    g_gpu->bias_add_fwd(g_gpu, yb.d, bias.d, rows, Cb);
    expect("bias_add_fwd", &yb, 1e-6);
    g_cpu->bias_bwd(g_cpu, bias.h, yb.h, rows, Cb, NULL);
    g_gpu->bias_bwd(g_gpu, bias.d, yb.d, rows, Cb, NULL);
    expect("bias_bwd", &bias, 1e-6);
    bias_bwd16_same(g_cpu, "cpu", yb.h, rows, Cb);
    bias_bwd16_same(g_gpu, "gpu", yb.d, rows, Cb);
    drop(&x), drop(&y), drop(&cond), drop(&out), drop(&dout), drop(&dx), drop(&dcond);
    drop(&yb), drop(&bias);
}

/* ---- attention ---- */

static void test_attention(int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D,
                           int causal) {
    pair q = mk(B * T * Hq * D, 1.0f), k = mk(B * T * Hkv * D, 1.0f), v = mk(B * T * Hkv * D, 1.0f);
    pair out = mkz(q.n), lse = mkz(B * Hq * T), dout = mk(q.n, 1.0f);
    pair dq = mk(q.n, 0.1f), dk = mk(k.n, 0.1f), dv = mk(v.n, 0.1f);
    char what[128];
    snprintf(what, sizeof what, "B=%lld T=%lld Hq=%lld Hkv=%lld D=%lld causal=%d", (long long)B,
             (long long)T, (long long)Hq, (long long)Hkv, (long long)D, causal);
    g_cpu->attention_fwd(g_cpu, out.h, lse.h, q.h, k.h, v.h, B, T, Hq, Hkv, D, causal, NULL);
    g_gpu->attention_fwd(g_gpu, out.d, lse.d, q.d, k.d, v.d, B, T, Hq, Hkv, D, causal, NULL);
    char line[200];
    snprintf(line, sizeof line, "attention_fwd out %s", what);
    expect(line, &out, 3e-5);
    snprintf(line, sizeof line, "attention_fwd lse %s", what);
    expect(line, &lse, 3e-5);
    /* the backward on the CPU's forward results for both, so only the backward is compared */
    g_gpu->upload(g_gpu, out.d, out.h, (size_t)out.n * 4);
    g_gpu->upload(g_gpu, lse.d, lse.h, (size_t)lse.n * 4);
    g_cpu->attention_bwd(g_cpu, dq.h, dk.h, dv.h, dout.h, out.h, lse.h, q.h, k.h, v.h, B, T, Hq,
                         Hkv, D, causal, 1, NULL);
    float *dq0 = malloc((size_t)dq.n * 4), *dk0 = malloc((size_t)dk.n * 4);
    g_gpu->download(g_gpu, dq0, dq.d, (size_t)dq.n * 4);
    g_gpu->download(g_gpu, dk0, dk.d, (size_t)dk.n * 4);
    g_gpu->attention_bwd(g_gpu, dq.d, dk.d, dv.d, dout.d, out.d, lse.d, q.d, k.d, v.d, B, T, Hq,
                         Hkv, D, causal, 1, NULL);
    snprintf(line, sizeof line, "attention_bwd dq %s", what);
    expect(line, &dq, 3e-5);
    snprintf(line, sizeof line, "attention_bwd dk %s", what);
    expect(line, &dk, 3e-5);
    snprintf(line, sizeof line, "attention_bwd dv %s", what);
    expect(line, &dv, 3e-5);
    /* run to run: the same gradients from the same starting buffers, to the bit */
    float *dq1 = malloc((size_t)dq.n * 4), *dk1 = malloc((size_t)dk.n * 4);
    g_gpu->download(g_gpu, dq1, dq.d, (size_t)dq.n * 4);
    g_gpu->download(g_gpu, dk1, dk.d, (size_t)dk.n * 4);
    g_gpu->upload(g_gpu, dq.d, dq0, (size_t)dq.n * 4);
    g_gpu->upload(g_gpu, dk.d, dk0, (size_t)dk.n * 4);
    g_gpu->attention_bwd(g_gpu, dq.d, dk.d, dv.d, dout.d, out.d, lse.d, q.d, k.d, v.d, B, T, Hq,
                         Hkv, D, causal, 1, NULL);
    g_gpu->download(g_gpu, dq0, dq.d, (size_t)dq.n * 4);
    g_gpu->download(g_gpu, dk0, dk.d, (size_t)dk.n * 4);
    snprintf(line, sizeof line, "attention_bwd reproducible %s", what);
    check(!memcmp(dq0, dq1, (size_t)dq.n * 4) && !memcmp(dk0, dk1, (size_t)dk.n * 4), "%s", line);
    free(dq0), free(dk0), free(dq1), free(dk1);
    /* written (accumulate 0): over NaN on both sides, nothing of it may come through */
    pair *gw[3] = {&dq, &dk, &dv};
    for (int i = 0; i < 3; i++) {
        for (int64_t j = 0; j < gw[i]->n; j++) gw[i]->h[j] = NAN;
        g_gpu->upload(g_gpu, gw[i]->d, gw[i]->h, (size_t)gw[i]->n * 4);
    }
    g_cpu->attention_bwd(g_cpu, dq.h, dk.h, dv.h, dout.h, out.h, lse.h, q.h, k.h, v.h, B, T, Hq,
                         Hkv, D, causal, 0, NULL);
    g_gpu->attention_bwd(g_gpu, dq.d, dk.d, dv.d, dout.d, out.d, lse.d, q.d, k.d, v.d, B, T, Hq,
                         Hkv, D, causal, 0, NULL);
    for (int i = 0; i < 2 && T == 1; i++) {
        /* one key: dq and dk are exactly 0, so both sides hold rounding of dP - delta, which
         * a relative error cannot judge: finite and within 1e-6 of 0 */
        float *g = malloc((size_t)gw[i]->n * 4);
        g_gpu->download(g_gpu, g, gw[i]->d, (size_t)gw[i]->n * 4);
        double e = 0.0;
        for (int64_t j = 0; j < gw[i]->n; j++) e = !(fabs((double)g[j]) <= e) ? fabs((double)g[j]) : e;
        free(g);
        check(e <= 1e-6, "attention_bwd written %s %s: |x| %.3e (0 exactly; tol 1e-6)",
              i ? "dk" : "dq", what, e);
    }
    snprintf(line, sizeof line, "attention_bwd written dq %s", what);
    if (T > 1) expect(line, &dq, 3e-5);
    snprintf(line, sizeof line, "attention_bwd written dk %s", what);
    if (T > 1) expect(line, &dk, 3e-5);
    snprintf(line, sizeof line, "attention_bwd written dv %s", what);
    expect(line, &dv, 3e-5);
    drop(&q), drop(&k), drop(&v), drop(&out), drop(&lse), drop(&dout);
    drop(&dq), drop(&dk), drop(&dv);
}

/* ---- attention on tensor cores (bf16 GEMM operands) ----
 * Two ways (cuda/cuda_attention.cu): head dimensions up to TZ_ATTENTION_FLASH_MAXD flash
 * style with bf16 mma.sync tiles, no workspace but delta; above it chunks of query rows
 * through cuBLAS, the scores in a workspace lent in be->att_ws.
 * Against the CPU's fp32 op. The cuBLAS GEMMs round their fp32 operands to TF32 (10 explicit
 * mantissa bits: a relative error of at most u = 2^-11 per operand, so 2^-10 per product) and
 * sum in fp32. A score s = scale q.k then errs by at most 2^-10 scale sum_d |q_d k_d| (~1e-3 at
 * these sizes), a probability by that much relative, and each output (O = P V, dQ, dK, dV,
 * sums of such products over keys or queries) by about 2^-10 of the sum of the absolute
 * values of its terms. Those terms have random signs and cancel, so the result's norm is
 * smaller than that sum (by up to sqrt(T)), while the rounding errors, independent, cancel
 * likewise. Measured as in the rest of this file but per row of D values (a row of out, dq,
 * dk or dv): ||gpu - cpu|| / ||cpu's result|| (of the increment, for the accumulated
 * gradients; at least the mean row norm of out, or of the three gradients, see worst_rel), at
 * most TOL_TC = 4e-3, and lse (absolute: a log-sum-exp errs by a weighted mean of its scores'
 * errors) within TOL_TC too. Measured on the CPU emulation of the backend (its cuBLAS rounds
 * to TF32 as the tensor cores do): rows within 1.6e-3 (dq of causal chunks of 7), mostly
 * 3e-4..9e-4; lse within 2.3e-4.
 * The flash kernels take bf16 operands: they round q, k, v and dO to bf16 as they load them,
 * as the bf16 GEMM rounds its operands (test_matmul_bf16), so they are checked on inputs that
 * are bf16 values, against the CPU on the same inputs. Their products are then exact and summed
 * in fp32: lse within TOL_FA_LSE = 1e-5 (measured 9.5e-7: fp32 sums in another order). What is
 * left is P and dS, rounded to bf16 (u = 2^-8, a relative 3.9e-3 each at most, 2e-3 on average)
 * before the products that make out, dq, dk and dv: rows within TOL_FA = 8e-3, 2u (measured 1.2e-3..5.0e-3, the worst
 * dv at D = 16, where few products average the roundings). A wrong mask, tile boundary,
 * fragment layout or head mapping errs by O(1). */
#define TOL_TC 4e-3
#define TOL_FA 8e-3
#define TOL_FA_LSE 1e-5

/* Rows of `row` values of a pair whose device copy was computed from `start` (NULL: zeros):
 * inc[r] = ||cpu - start|| (the CPU's result, or increment) and err[r] = ||gpu - cpu|| of row
 * r; returns the mean of inc. */
static double row_norms(const pair *p, const float *start, int64_t row, double *inc,
                        double *err) {
    float *g = malloc((size_t)p->n * 4);
    g_gpu->download(g_gpu, g, p->d, (size_t)p->n * 4);
    const int64_t nr = p->n / row;
    double mean = 0.0;
    for (int64_t r = 0; r < nr; r++) {
        double e = 0.0, c = 0.0;
        for (int64_t i = r * row; i < (r + 1) * row; i++) {
            double d = (double)g[i] - (double)p->h[i];
            double x = (double)p->h[i] - (start ? (double)start[i] : 0.0);
            e += d * d, c += x * x;
        }
        inc[r] = sqrt(c), err[r] = e == e ? sqrt(e) : INFINITY, mean += inc[r] / (double)nr;
    }
    free(g);
    return mean;
}
/* max over rows of err / max(inc, floor): the floor keeps a row whose exact result cancels to
 * ~0 (dq of the first causal query; dq and dk at T = 1) from dividing by its own rounding. */
static double worst_rel(const double *inc, const double *err, int64_t nr, double floor) {
    double w = 0.0;
    for (int64_t r = 0; r < nr; r++) {
        double den = inc[r] > floor ? inc[r] : floor;
        double rel = den > 0.0 ? err[r] / den : (err[r] > 0.0 ? INFINITY : 0.0);
        if (!(rel <= w)) w = rel;
    }
    return w;
}

/* Workspace bytes for a forward (backward = 0) or backward chunk of c query rows, as
 * tz_attention_chunk reads them. */
static size_t ws_for_chunk(int64_t c, int64_t B, int64_t T, int64_t Hq, int backward) {
    size_t rows = (size_t)(c * B * Hq) * (size_t)((T + 3) / 4 * 4) * 4 * (backward ? 2 : 1);
    return rows + (backward ? tz_attention_delta_bytes(B, T, Hq) : 0);
}

/* The workspace refilled with NaN (a value read before it is written shows) and a canary of
 * 256 bytes after the bytes lent, checked afterwards. */
#define WS_CANARY 256
static void ws_fill(void *ws, size_t lent) {
    unsigned char *h = malloc(lent + WS_CANARY);
    memset(h, 0xff, lent);
    for (int i = 0; i < WS_CANARY; i++) h[lent + (size_t)i] = (unsigned char)(0x5a ^ i);
    g_gpu->upload(g_gpu, ws, h, lent + WS_CANARY);
    free(h);
}
static int ws_canary_ok(const void *ws, size_t lent) {
    unsigned char c[WS_CANARY];
    g_gpu->download(g_gpu, c, (const char *)ws + lent, WS_CANARY);
    for (int i = 0; i < WS_CANARY; i++)
        if (c[i] != (unsigned char)(0x5a ^ i)) return 0;
    return 1;
}

/* The flash kernels with their B fragments loaded by ldmatrix (the default) and by 16- and
 * 32-bit reads (TZ_FA_LDMATRIX=0): the same values into the same products in the same order,
 * so out, lse, dq, dk and dv agree to the bit. On a GPU this checks the hardware's ldmatrix
 * against the fragment layouts the kernels assume (cuda/cuda_mma.cuh); on the emulation, the
 * emulated ldmatrix. */
static void test_attention_ldmatrix(int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D,
                                    int causal) {
    g_gpu->matmul_dtype = TZ_DT_BF16;
    const size_t wb = tz_attention_ws_bytes(g_gpu, B, T, Hq, D, 1, 0);
    void *ws = g_gpu->alloc(g_gpu, wb);
    pair q = mk(B * T * Hq * D, 1.0f), k = mk(B * T * Hkv * D, 1.0f), v = mk(B * T * Hkv * D, 1.0f);
    pair dout = mk(q.n, 1.0f), out = mkz(q.n), lse = mkz(B * Hq * T);
    pair dq = mkz(q.n), dk = mkz(k.n), dv = mkz(v.n);
    pair *res[5] = {&out, &lse, &dq, &dk, &dv};
    float *got[2][5];
    const char *prev = getenv("TZ_FA_LDMATRIX");
    char *saved = prev ? strdup(prev) : NULL;
    for (int ldm = 0; ldm < 2; ldm++) {
        setenv("TZ_FA_LDMATRIX", ldm ? "1" : "0", 1);
        g_gpu->attention_fwd(g_gpu, out.d, lse.d, q.d, k.d, v.d, B, T, Hq, Hkv, D, causal, NULL);
        g_gpu->att_ws = ws, g_gpu->att_ws_bytes = wb;
        g_gpu->attention_bwd(g_gpu, dq.d, dk.d, dv.d, dout.d, out.d, lse.d, q.d, k.d, v.d, B, T,
                             Hq, Hkv, D, causal, 0, NULL);
        for (int i = 0; i < 5; i++) {
            got[ldm][i] = malloc((size_t)res[i]->n * 4);
            g_gpu->download(g_gpu, got[ldm][i], res[i]->d, (size_t)res[i]->n * 4);
        }
    }
    if (saved) setenv("TZ_FA_LDMATRIX", saved, 1);
    else unsetenv("TZ_FA_LDMATRIX");
    free(saved);
    int same = 1;
    for (int i = 0; i < 5; i++) {
        same &= !memcmp(got[0][i], got[1][i], (size_t)res[i]->n * 4);
        free(got[0][i]), free(got[1][i]);
    }
    check(same, "flash attention B=%lld T=%lld Hq=%lld Hkv=%lld D=%lld causal=%d: out, lse, dq, "
          "dk, dv with ldmatrix equal to the bit those by 16- and 32-bit reads", (long long)B,
          (long long)T, (long long)Hq, (long long)Hkv, (long long)D, causal);
    g_gpu->release(g_gpu, ws);
    drop(&q), drop(&k), drop(&v), drop(&dout), drop(&out), drop(&lse);
    drop(&dq), drop(&dk), drop(&dv);
    g_gpu->matmul_dtype = TZ_DT_F32;
}

/* q, k and v given in bf16 (tz_att_ld.in16) against the same values in fp32, on be: the flash
 * kernels round fp32 q, k, v to bf16 as they load them, so out, lse, dq, dk and dv are the same
 * bits (the CPU widens them: its own bits too). fused: q, k, v read in place in the rows of
 * one projection [B*T, (Hq + 2 Hkv) D] and their gradients written there, as the DiT's; else
 * dense. */
static void test_attention_in16(tz_backend *be, const char *tag, int64_t B, int64_t T,
                                int64_t Hq, int64_t Hkv, int64_t D, int causal, int fused) {
    const enum tz_dtype prev = be->matmul_dtype;
    be->matmul_dtype = TZ_DT_BF16;
    const int64_t BT = B * T, W = (Hq + 2 * Hkv) * D, n = BT * W;
    const tz_att_ld ld32 = {fused ? W : 0, fused ? W : 0, 0, 0, 0};
    const tz_att_ld ld16 = {ld32.q, ld32.kv, 0, 1, 0};
    /* dense: q [BT, Hq D], then k, v [BT, Hkv D] each, back to back in one buffer */
    const int64_t ok = fused ? Hq * D : BT * Hq * D, ov = fused ? (Hq + Hkv) * D : BT * (Hq + Hkv) * D;
    float *h = malloc((size_t)n * 4), *hd = malloc((size_t)(BT * Hq * D) * 4);
    for (int64_t i = 0; i < n; i++) h[i] = tz_bf16_to_f32(tz_f32_to_bf16(urand(1.0f)));
    for (int64_t i = 0; i < BT * Hq * D; i++) hd[i] = urand(1.0f);
    float *x = be->alloc(be, (size_t)n * 4), *dout = be->alloc(be, (size_t)(BT * Hq * D) * 4);
    uint16_t *x16 = be->alloc(be, (size_t)n * 2);
    be->upload(be, x, h, (size_t)n * 4), be->upload(be, dout, hd, (size_t)(BT * Hq * D) * 4);
    be->to_bf16(be, x16, x, n);
    const size_t wb = tz_attention_ws_bytes(be, B, T, Hq, D, 1, 1); /* (fp32 runs take less) */
    void *ws = wb ? be->alloc(be, wb) : NULL;
    float *res[2][3];
    for (int w = 0; w < 2; w++) {
        const float *q = w ? (const float *)(const void *)x16 : x;
        const float *k = w ? (const float *)(const void *)(x16 + ok) : x + ok;
        const float *v = w ? (const float *)(const void *)(x16 + ov) : x + ov;
        float *out = be->alloc(be, (size_t)(BT * Hq * D) * 4), *lse = be->alloc(be, (size_t)(B * Hq * T) * 4);
        float *dx = be->alloc(be, (size_t)n * 4);
        be->fill(be, dx, 0.0f, n);
        be->attention_fwd(be, out, lse, q, k, v, B, T, Hq, Hkv, D, causal, w ? &ld16 : &ld32);
        be->att_ws = ws, be->att_ws_bytes = wb;
        be->attention_bwd(be, dx, dx + ok, dx + ov, dout, out, lse, q, k, v, B, T, Hq, Hkv, D,
                          causal, 0, w ? &ld16 : &ld32);
        const int64_t cnt[3] = {BT * Hq * D, B * Hq * T, n};
        float *dev[3] = {out, lse, dx};
        for (int i = 0; i < 3; i++) {
            res[w][i] = malloc((size_t)cnt[i] * 4);
            be->download(be, res[w][i], dev[i], (size_t)cnt[i] * 4);
            be->release(be, dev[i]);
        }
    }
    int same = 1;
    const int64_t cnt[3] = {BT * Hq * D, B * Hq * T, n};
    /* the device's bf16 forward again with 64 query rows a block (TZ_FA_ROWS=64: k_fa_fwd,
     * where the default takes k_fa_fwd_wide's 128): the same bits */
    int same64 = 1;
    if (be->device) {
        const char *prev64 = getenv("TZ_FA_ROWS");
        char *saved64 = prev64 ? strdup(prev64) : NULL;
        setenv("TZ_FA_ROWS", "64", 1);
        float *out = be->alloc(be, (size_t)cnt[0] * 4), *lse = be->alloc(be, (size_t)cnt[1] * 4);
        be->attention_fwd(be, out, lse, (const float *)(const void *)x16,
                          (const float *)(const void *)(x16 + ok),
                          (const float *)(const void *)(x16 + ov), B, T, Hq, Hkv, D, causal, &ld16);
        float *dev[2] = {out, lse};
        for (int i = 0; i < 2; i++) {
            float *h64 = malloc((size_t)cnt[i] * 4);
            be->download(be, h64, dev[i], (size_t)cnt[i] * 4);
            same64 &= !memcmp(h64, res[1][i], (size_t)cnt[i] * 4);
            free(h64), be->release(be, dev[i]);
        }
        if (saved64) setenv("TZ_FA_ROWS", saved64, 1);
        else unsetenv("TZ_FA_ROWS");
        free(saved64);
    }
    /* gradients written in bf16 (tz_att_ld.d16) into a buffer laid out as x16: dv alone (the
     * Llama's), then dq, dk and dv (the DiT's fused rows): each the fp32 run's rounded by
     * to_bf16, bit for bit, at its stride, nothing else of the rows written; the others the
     * fp32 run's bits, in dx */
    int g_same = 1, g_kept = 1, rest_same = 1;
    for (int mi = 0; mi < 2; mi++) {
        const int m16 = mi ? TZ_ATT_DQ16 | TZ_ATT_DK16 | TZ_ATT_DV16 : TZ_ATT_DV16;
        const tz_att_ld ldg = {ld16.q, ld16.kv, 0, 1, m16};
        float *out = be->alloc(be, (size_t)cnt[0] * 4), *lse = be->alloc(be, (size_t)cnt[1] * 4);
        float *dx = be->alloc(be, (size_t)n * 4);
        uint16_t *g16 = be->alloc(be, (size_t)n * 2), *h16 = malloc((size_t)n * 2);
        float *hx = malloc((size_t)n * 4);
        for (int64_t i = 0; i < n; i++) h16[i] = 0x7fc1; /* a NaN to_bf16 never writes */
        be->upload(be, g16, h16, (size_t)n * 2);
        be->fill(be, dx, 0.0f, n);
        const float *q = (const float *)(const void *)x16;
        const float *k = (const float *)(const void *)(x16 + ok);
        const float *v = (const float *)(const void *)(x16 + ov);
        float *gp[3];
        const int64_t offs[3] = {0, ok, ov};
        for (int j = 0; j < 3; j++)
            gp[j] = m16 & (1 << j) ? (float *)(void *)(g16 + offs[j]) : dx + offs[j];
        be->attention_fwd(be, out, lse, q, k, v, B, T, Hq, Hkv, D, causal, &ld16);
        be->att_ws = ws, be->att_ws_bytes = wb;
        be->attention_bwd(be, gp[0], gp[1], gp[2], dout, out, lse, q, k, v, B, T, Hq, Hkv, D,
                          causal, 0, &ldg);
        be->download(be, hx, dx, (size_t)n * 4), be->download(be, h16, g16, (size_t)n * 2);
        for (int64_t i = 0; i < n; i++) {
            const int64_t c = fused ? i % W : i;
            const int part = c < (fused ? Hq * D : ok) ? 0 : c < (fused ? (Hq + Hkv) * D : ov) ? 1 : 2;
            if (m16 & (1 << part)) {
                g_same &= h16[i] == tz_f32_to_bf16(res[0][2][i]);
                rest_same &= hx[i] == 0.0f; /* dx's part not written */
            } else {
                g_kept &= h16[i] == 0x7fc1;
                rest_same &= !memcmp(&hx[i], &res[0][2][i], 4);
            }
        }
        be->release(be, out), be->release(be, lse), be->release(be, dx), be->release(be, g16);
        free(h16), free(hx);
    }
    for (int i = 0; i < 3; i++) {
        same &= !memcmp(res[0][i], res[1][i], (size_t)cnt[i] * 4);
        free(res[0][i]), free(res[1][i]);
    }
    check(same && same64, "%s attention with q, k, v in bf16 (B=%lld T=%lld Hq=%lld Hkv=%lld "
          "D=%lld causal=%d, %s): out, lse, dq, dk, dv the bits of the same values in fp32%s",
          tag, (long long)B, (long long)T, (long long)Hq, (long long)Hkv, (long long)D, causal,
          fused ? "in place in fused rows" : "dense",
          be->device ? "; the forward's with 64 query rows a block too" : "");
    check(g_same && g_kept && rest_same, "%s attention_bwd with gradients in bf16 (d16: dv, then "
          "dq, dk, dv; T=%lld Hq=%lld Hkv=%lld D=%lld, %s): each the fp32 one rounded, bit for "
          "bit (%s), the rest of their rows kept (%s), the fp32 gradients the fp32 run's bits "
          "(%s)", tag, (long long)T, (long long)Hq, (long long)Hkv, (long long)D,
          fused ? "fused rows" : "dense", g_same ? "yes" : "NO", g_kept ? "yes" : "NO",
          rest_same ? "yes" : "NO");
    if (ws) be->release(be, ws);
    be->release(be, x), be->release(be, x16), be->release(be, dout);
    free(h), free(hd);
    be->matmul_dtype = prev;
}

/* The flash backward keeping its score gradients in memory lent (be->att_ds: dk/dv's kernel
 * stores dS in bf16, dq's reads it; core/backend.h, tz_attention_ds_group) against the same
 * backward without the loan (dq's kernel computing dS again): q, k, v in bf16 (the tiles-ahead
 * kernels keep it), `pairs` (sequence, kv head) pairs' worth lent. The same dS values rounded
 * the same way into the same products in the same order: dq, dk and dv the same bits on the
 * emulation (its mma sums a product of the same two bf16 in the same order whichever operand
 * is A). A GPU's mma could round S = K Q^T and S = Q K^T apart; there dq is held to TOL_FA of
 * the recomputing kernel's, per row, the tensor cores' bf16 tolerance. The loan taken back,
 * nothing written past it, and written (NaN-filled first) exactly when a group is formed; not
 * written with TZ_FA_DS=0. acc: added into starting gradients; m16: gradients in bf16. */
static void test_attention_ds(int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D,
                              int causal, int acc, int m16, double pairs, int off) {
    tz_backend *be = g_gpu;
    be->matmul_dtype = TZ_DT_BF16;
    tz_device_info di;
    be->device_info(be, &di);
    const int emu = strstr(di.name, "CPU emulation") != NULL;
    const int64_t BT = B * T, nq = BT * Hq * D, nk = BT * Hkv * D, n = nq + 2 * nk;
    float *h = malloc((size_t)n * 4), *hd = malloc((size_t)nq * 4), *hg = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) h[i] = urand(1.0f), hg[i] = acc ? urand(0.1f) : 0.0f;
    for (int64_t i = 0; i < nq; i++) hd[i] = urand(1.0f);
    float *x = be->alloc(be, (size_t)n * 4), *dout = be->alloc(be, (size_t)nq * 4);
    uint16_t *x16 = be->alloc(be, (size_t)n * 2);
    be->upload(be, x, h, (size_t)n * 4), be->upload(be, dout, hd, (size_t)nq * 4);
    be->to_bf16(be, x16, x, n);
    const float *q = (const float *)(const void *)x16;
    const float *k = (const float *)(const void *)(x16 + nq);
    const float *v = (const float *)(const void *)(x16 + nq + nk);
    const tz_att_ld ld = {0, 0, 0, 1, m16};
    float *out = be->alloc(be, (size_t)nq * 4), *lse = be->alloc(be, (size_t)(B * Hq * T) * 4);
    be->attention_fwd(be, out, lse, q, k, v, B, T, Hq, Hkv, D, causal, &ld);
    const size_t wb = tz_attention_ws_bytes(be, B, T, Hq, D, 1, 1);
    const size_t per = tz_attention_ds_head_bytes(T, causal) * (size_t)(Hq / Hkv);
    const size_t lent = (size_t)(pairs * (double)per);
    void *ws = be->alloc(be, wb), *ds = be->alloc(be, lent + WS_CANARY);
    const char *env = getenv("TZ_FA_DS"); /* (set to 0 for the whole run: no group either) */
    const int64_t group = off || (env && !strcmp(env, "0"))
                              ? 0 : tz_attention_ds_group(B, T, Hq, Hkv, causal, lent);
    /* the gradients: fp32, or (m16) bf16 bits from the start of the part's fp32 memory */
    const int64_t offs[3] = {0, nq, nq + nk};
    float *res[2];
    int loan_back = 1, canary = 1, written = 0;
    const char *prev = getenv("TZ_FA_DS");
    char *saved = prev ? strdup(prev) : NULL;
    for (int w = 0; w < 2; w++) { /* 0: no loan; 1: the loan */
        float *g = be->alloc(be, (size_t)n * 4);
        be->upload(be, g, hg, (size_t)n * 4);
        float *gp[3];
        for (int j = 0; j < 3; j++)
            gp[j] = g + offs[j];
        be->att_ws = ws, be->att_ws_bytes = wb;
        if (w) {
            ws_fill(ds, lent);
            be->att_ds = ds, be->att_ds_bytes = lent;
            if (off) setenv("TZ_FA_DS", "0", 1);
        }
        be->attention_bwd(be, gp[0], gp[1], gp[2], dout, out, lse, q, k, v, B, T, Hq, Hkv, D,
                          causal, acc, &ld);
        if (w) {
            if (saved) setenv("TZ_FA_DS", saved, 1);
            else unsetenv("TZ_FA_DS");
            loan_back = !be->att_ds && !be->att_ds_bytes && !be->att_ws;
            canary = ws_canary_ok(ds, lent);
            unsigned char *c = malloc(lent ? lent : 1);
            be->download(be, c, ds, lent);
            for (size_t i = 0; i < lent && !written; i++) written = c[i] != 0xff;
            free(c);
        }
        res[w] = malloc((size_t)n * 4);
        be->download(be, res[w], g, (size_t)n * 4);
        be->release(be, g);
    }
    free(saved);
    /* the same bits; or, on a GPU, each row within TOL_FA of the recomputing kernels' (of
     * its norm, at least the mean row norm: worst_rel's floor) */
    int same = !memcmp(res[0], res[1], (size_t)n * 4);
    double worst = 0.0;
    if (!same && !emu) {
        const int64_t rows = n / D;
        double *inc = malloc((size_t)rows * 2 * sizeof *inc), *err = inc + rows, mean = 0.0;
        for (int64_t r = 0; r < rows; r++) {
            double e = 0.0, c = 0.0;
            for (int64_t i = r * D; i < (r + 1) * D; i++) {
                const int part = i < nq ? 0 : i < nq + nk ? 1 : 2;
                const int b16 = m16 & (1 << part);
                /* (a bf16 gradient's element i - offs[part] of its halves) */
                const uint16_t *h0 = (const uint16_t *)(const void *)(res[0] + offs[part]);
                const uint16_t *h1 = (const uint16_t *)(const void *)(res[1] + offs[part]);
                const double a0 = b16 ? tz_bf16_to_f32(h0[i - offs[part]]) : res[0][i];
                const double a1 = b16 ? tz_bf16_to_f32(h1[i - offs[part]]) : res[1][i];
                e += (a1 - a0) * (a1 - a0), c += a0 * a0;
            }
            inc[r] = sqrt(c), err[r] = e == e ? sqrt(e) : INFINITY, mean += inc[r] / (double)rows;
        }
        worst = worst_rel(inc, err, rows, mean);
        free(inc);
    }
    check((same || (!emu && worst <= TOL_FA)) && loan_back && canary &&
              written == (group > 0),
          "flash attention_bwd with dS kept (B=%lld T=%lld Hq=%lld Hkv=%lld D=%lld causal=%d "
          "acc=%d d16=%d; %.1f pairs lent%s: groups of %lld): dq, dk, dv %s the recomputing "
          "kernels'; loan back %s, canary %s, lent memory %s", (long long)B, (long long)T,
          (long long)Hq, (long long)Hkv, (long long)D, causal, acc, m16, pairs,
          off ? ", TZ_FA_DS=0" : "", (long long)group,
          same ? "the bits of" : emu ? "NOT the bits of" : "within TOL_FA of",
          loan_back ? "yes" : "NO", canary ? "kept" : "OVERWRITTEN",
          written ? "written" : "untouched");
    if (!same && !emu) printf("      (rows within %.3e of each other)\n", worst);
    free(res[0]), free(res[1]);
    be->release(be, ws), be->release(be, ds), be->release(be, out), be->release(be, lse);
    be->release(be, x), be->release(be, x16), be->release(be, dout);
    free(h), free(hd), free(hg);
    be->matmul_dtype = TZ_DT_F32;
}

/* test_attention_tc's inputs with key 0 the largest score of every query (as in a trained
 * model's attention sink): q's first component 1, k's 40 at key 0 and 0 elsewhere, the rest
 * random in [-1, 1] (what the other components add is of order 4 at D = 128). The flash
 * forward's running maxima are then set by the first key tile, and every later tile leaves
 * them where they are (its rescale of o skipped by the vote in fa_softmax_tile). */
static int g_att_sink;

/* chunk (the GEMM path, D > TZ_ATTENTION_FLASH_MAXD): query rows per chunk, forced through
 * the bytes lent (a size tz_attention_chunk keeps: < 16, a multiple of 16 below 64, of 64, or
 * >= T); 0: the planned workspace, which is what the flash path always gets. */
static void test_attention_tc(int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D,
                              int causal, int64_t chunk) {
    g_gpu->matmul_dtype = TZ_DT_BF16;
    const int flash = D <= TZ_ATTENTION_FLASH_MAXD;
    if (flash) chunk = 0;
    const double tol = flash ? TOL_FA : TOL_TC, tol_lse = flash ? TOL_FA_LSE : TOL_TC;
    const size_t fb = chunk ? ws_for_chunk(chunk, B, T, Hq, 0)
                            : tz_attention_ws_bytes(g_gpu, B, T, Hq, D, 0, 0);
    const size_t bb = chunk ? ws_for_chunk(chunk, B, T, Hq, 1)
                            : tz_attention_ws_bytes(g_gpu, B, T, Hq, D, 1, 0);
    const size_t b16 = tz_attention_ws_bytes(g_gpu, B, T, Hq, D, 1, 1);
    check(!flash || (fb == 0 && bb == tz_attention_delta_bytes(B, T, Hq) &&
                     b16 == tz_attention_flash_ws_bytes(B, T, Hq, D) &&
                     b16 == 2 * tz_attention_delta_bytes(B, T, Hq) +
                                (((size_t)(B * T * Hq * D) * 2 + 63) & ~(size_t)63)),
          "tc attention D=%lld: the flash path plans no workspace but the backward's delta, "
          "and with q, k, v in bf16 its base-2 lse and bf16 dO too", (long long)D);
    const int64_t cf = flash ? 0 : tz_attention_chunk(fb, B, T, Hq, 1);
    const int64_t cb =
        flash ? 0 : tz_attention_chunk(bb - tz_attention_delta_bytes(B, T, Hq), B, T, Hq, 2);
    void *ws = g_gpu->alloc(g_gpu, (fb > bb ? fb : bb) + WS_CANARY);
    pair q = mk(B * T * Hq * D, 1.0f), k = mk(B * T * Hkv * D, 1.0f), v = mk(B * T * Hkv * D, 1.0f);
    pair out = mkz(q.n), lse = mkz(B * Hq * T), dout = mk(q.n, 1.0f);
    pair dq = mk(q.n, 0.1f), dk = mk(k.n, 0.1f), dv = mk(v.n, 0.1f);
    if (g_att_sink) { /* rows (b, t, head) of D: t = row / heads % T */
        for (int64_t r = 0; r < B * T * Hq; r++) q.h[r * D] = 1.0f;
        for (int64_t r = 0; r < B * T * Hkv; r++) k.h[r * D] = r / Hkv % T ? 0.0f : 40.0f;
        g_gpu->upload(g_gpu, q.d, q.h, (size_t)q.n * 4);
        g_gpu->upload(g_gpu, k.d, k.h, (size_t)k.n * 4);
    }
    if (flash) { /* its operands as the kernels see them: bf16 values */
        pair *in[4] = {&q, &k, &v, &dout};
        for (int j = 0; j < 4; j++) {
            for (int64_t i = 0; i < in[j]->n; i++)
                in[j]->h[i] = tz_bf16_to_f32(tz_f32_to_bf16(in[j]->h[i]));
            g_gpu->upload(g_gpu, in[j]->d, in[j]->h, (size_t)in[j]->n * 4);
        }
    }
    char what[160], line[240];
    if (flash)
        snprintf(what, sizeof what, "B=%lld T=%lld Hq=%lld Hkv=%lld D=%lld causal=%d flash%s",
                 (long long)B, (long long)T, (long long)Hq, (long long)Hkv, (long long)D, causal,
                 g_att_sink ? " sink" : "");
    else
        snprintf(what, sizeof what, "B=%lld T=%lld Hq=%lld Hkv=%lld D=%lld causal=%d chunk "
                 "%lld/%lld", (long long)B, (long long)T, (long long)Hq, (long long)Hkv,
                 (long long)D, causal, (long long)cf, (long long)cb);
    g_cpu->attention_fwd(g_cpu, out.h, lse.h, q.h, k.h, v.h, B, T, Hq, Hkv, D, causal, NULL);
    ws_fill(ws, fb);
    g_gpu->att_ws = ws, g_gpu->att_ws_bytes = fb;
    g_gpu->attention_fwd(g_gpu, out.d, lse.d, q.d, k.d, v.d, B, T, Hq, Hkv, D, causal, NULL);
    check(!g_gpu->att_ws && !g_gpu->att_ws_bytes && ws_canary_ok(ws, fb),
          "tc attention_fwd %s: the loan taken back, nothing written past it", what);
    const int64_t nrq = B * T * Hq, nrk = B * T * Hkv;
    double *inc = malloc((size_t)(2 * nrq + 4 * nrk) * sizeof *inc), *err = inc + nrq;
    double mean = row_norms(&out, NULL, D, inc, err);
    double e = worst_rel(inc, err, nrq, mean);
    snprintf(line, sizeof line, "tc attention_fwd out %s", what);
    check(e <= tol, "%-60s row err %.3e (tol %.1e)", line, e, tol);
    row_norms(&lse, NULL, 1, inc, err); /* rows of one: err is the absolute error */
    e = 0.0;
    for (int64_t r = 0; r < nrq; r++) e = !(err[r] <= e) ? err[r] : e;
    snprintf(line, sizeof line, "tc attention_fwd lse %s", what);
    check(e <= tol_lse, "%-60s abs err %.3e (tol %.1e)", line, e, tol_lse);
    /* the backward on the CPU's forward results for both, so only the backward is compared */
    g_gpu->upload(g_gpu, out.d, out.h, (size_t)out.n * 4);
    g_gpu->upload(g_gpu, lse.d, lse.h, (size_t)lse.n * 4);
    float *s0[3];
    pair *gr[3] = {&dq, &dk, &dv};
    for (int i = 0; i < 3; i++) {
        s0[i] = malloc((size_t)gr[i]->n * 4);
        memcpy(s0[i], gr[i]->h, (size_t)gr[i]->n * 4);
    }
    g_cpu->attention_bwd(g_cpu, dq.h, dk.h, dv.h, dout.h, out.h, lse.h, q.h, k.h, v.h, B, T, Hq,
                         Hkv, D, causal, 1, NULL);
    ws_fill(ws, bb);
    g_gpu->att_ws = ws, g_gpu->att_ws_bytes = bb;
    g_gpu->attention_bwd(g_gpu, dq.d, dk.d, dv.d, dout.d, out.d, lse.d, q.d, k.d, v.d, B, T, Hq,
                         Hkv, D, causal, 1, NULL);
    check(!g_gpu->att_ws && !g_gpu->att_ws_bytes && ws_canary_ok(ws, bb),
          "tc attention_bwd %s: the loan taken back, nothing written past it", what);
    /* rows relative to themselves, at least to the mean row of the three increments */
    const char *name[3] = {"dq", "dk", "dv"};
    const int64_t nr[3] = {nrq, nrk, nrk};
    double *ri[3] = {inc, inc + 2 * nrq, inc + 2 * nrq + 2 * nrk};
    float *res[3];
    mean = 0.0;
    for (int i = 0; i < 3; i++)
        mean += row_norms(gr[i], s0[i], D, ri[i], ri[i] + nr[i]) / 3.0;
    for (int i = 0; i < 3; i++) {
        e = worst_rel(ri[i], ri[i] + nr[i], nr[i], mean);
        snprintf(line, sizeof line, "tc attention_bwd %s %s", name[i], what);
        check(e <= tol, "%-60s row err %.3e (tol %.1e)", line, e, tol);
        res[i] = malloc((size_t)gr[i]->n * 4);
        g_gpu->download(g_gpu, res[i], gr[i]->d, (size_t)gr[i]->n * 4);
        g_gpu->upload(g_gpu, gr[i]->d, s0[i], (size_t)gr[i]->n * 4);
    }
    /* run to run: the same gradients from the same starting buffers, to the bit */
    ws_fill(ws, bb);
    g_gpu->att_ws = ws, g_gpu->att_ws_bytes = bb;
    g_gpu->attention_bwd(g_gpu, dq.d, dk.d, dv.d, dout.d, out.d, lse.d, q.d, k.d, v.d, B, T, Hq,
                         Hkv, D, causal, 1, NULL);
    int same = 1;
    for (int i = 0; i < 3; i++) {
        float *again = malloc((size_t)gr[i]->n * 4);
        g_gpu->download(g_gpu, again, gr[i]->d, (size_t)gr[i]->n * 4);
        same &= !memcmp(again, res[i], (size_t)gr[i]->n * 4);
        free(again), free(res[i]), free(s0[i]);
    }
    check(same, "tc attention_bwd reproducible %s", what);
    free(inc);
    g_gpu->release(g_gpu, ws);
    drop(&q), drop(&k), drop(&v), drop(&out), drop(&lse), drop(&dout);
    drop(&dq), drop(&dk), drop(&dv);
    g_gpu->matmul_dtype = TZ_DT_F32;
}

/* Attention of T new queries at pos0 against a cache of capacity S (keys 0 .. pos0+T-1
 * filled, the rest garbage that must not be read): the same 3e-5 as attention_fwd. kv16: the
 * cache in bf16 on both sides (the CPU widens it: test_llama_generate holds that to the fp32
 * cache of the same values, bit for bit). */
static void test_attention_cache(int64_t B, int64_t T, int64_t S, int64_t pos0, int64_t Hq,
                                 int64_t Hkv, int64_t D, int kv16) {
    pair q = mk(B * T * Hq * D, 1.0f), kc = mk(B * S * Hkv * D, 1.0f), vc = mk(kc.n, 1.0f);
    pair out = mkz(q.n);
    for (int64_t b = 0; b < B; b++) /* unfilled slots: huge values that would show if read */
        for (int64_t s = pos0 + T; s < S; s++)
            for (int64_t e = 0; e < Hkv * D; e++) {
                kc.h[(b * S + s) * Hkv * D + e] = 1e30f;
                vc.h[(b * S + s) * Hkv * D + e] = 1e30f;
            }
    const void *kd = kc.d, *vd = vc.d, *kh = kc.h, *vh = vc.h;
    uint16_t *k16 = NULL, *v16 = NULL;
    void *k16d = NULL, *v16d = NULL;
    if (kv16) {
        k16 = malloc((size_t)kc.n * 2), v16 = malloc((size_t)kc.n * 2);
        g_cpu->to_bf16(g_cpu, k16, kc.h, kc.n), g_cpu->to_bf16(g_cpu, v16, vc.h, vc.n);
        k16d = g_gpu->alloc(g_gpu, (size_t)kc.n * 2), v16d = g_gpu->alloc(g_gpu, (size_t)kc.n * 2);
        g_gpu->upload(g_gpu, k16d, k16, (size_t)kc.n * 2);
        g_gpu->upload(g_gpu, v16d, v16, (size_t)kc.n * 2);
        kd = k16d, vd = v16d, kh = k16, vh = v16;
    } else {
        g_gpu->upload(g_gpu, kc.d, kc.h, (size_t)kc.n * 4);
        g_gpu->upload(g_gpu, vc.d, vc.h, (size_t)kc.n * 4);
    }
    g_cpu->attention_cache_fwd(g_cpu, out.h, q.h, kh, vh, B, T, S, pos0, Hq, Hkv, D, kv16);
    g_gpu->attention_cache_fwd(g_gpu, out.d, q.d, kd, vd, B, T, S, pos0, Hq, Hkv, D, kv16);
    char line[200];
    snprintf(line, sizeof line, "attention_cache_fwd B=%lld T=%lld S=%lld pos0=%lld Hq=%lld "
             "Hkv=%lld D=%lld%s", (long long)B, (long long)T, (long long)S, (long long)pos0,
             (long long)Hq, (long long)Hkv, (long long)D, kv16 ? ", bf16 cache" : "");
    expect(line, &out, 3e-5);
    if (kv16) {
        g_gpu->release(g_gpu, k16d), g_gpu->release(g_gpu, v16d);
        free(k16), free(v16);
    }
    drop(&q), drop(&kc), drop(&vc), drop(&out);
}

/* ---- quantized weights ---- */

/* tq_matmul, both ways round: fp32 GEMMs against the CPU's (tq_dequant + matmul) at the GEMM
 * tolerance; bf16 GEMMs, where the weight is decoded straight into bf16, bit for bit against
 * the GPU's own tq_dequant into fp32 followed by a bf16 matmul (the same rounding of the same
 * decoded values, then the same GEMM). */
static void test_tq_matmul(void) {
    const int bits = 3, g = 64;
    const int64_t rows = 40, cols = 2 * g, M = 29, ng = rows * cols / g;
    size_t cb = (size_t)tz_tq_codes_bytes(rows, cols, bits);
    uint8_t *codes = malloc(cb);
    uint16_t *scales = malloc((size_t)ng * 2);
    for (size_t i = 0; i < cb; i++) codes[i] = (uint8_t)tz_rng_below(&g_rng, 256);
    for (int64_t i = 0; i < ng; i++) scales[i] = tz_f32_to_bf16(urand(0.1f));
    uint8_t *dcodes = g_gpu->alloc(g_gpu, cb);
    uint16_t *dscales = g_gpu->alloc(g_gpu, (size_t)ng * 2);
    g_gpu->upload(g_gpu, dcodes, codes, cb);
    g_gpu->upload(g_gpu, dscales, scales, (size_t)ng * 2);
    pair lv = mk(1 << bits, 2.0f), tile = mkz(rows * cols);
    for (int tw = 0; tw < 2; tw++) {
        const int64_t K = tw ? cols : rows, N = tw ? rows : cols;
        pair A = mk(M * K, 1.0f), C = mk(M * N, 1.0f), C2 = mkz(M * N);
        g_gpu->copy(g_gpu, C2.d, C.d, (size_t)(M * N) * 4);
        g_cpu->tq_matmul(g_cpu, C.h, A.h, 0, tile.h, codes, scales, lv.h, rows, cols, bits, g, M,
                         tw, 0.9f, 0.4f);
        g_gpu->tq_matmul(g_gpu, C.d, A.d, 0, tile.d, dcodes, dscales, lv.d, rows, cols, bits, g,
                         M, tw, 0.9f, 0.4f);
        char what[64];
        snprintf(what, sizeof what, "tq_matmul transW=%d (fp32)", tw);
        expect(what, &C, 1e-5);
        g_gpu->matmul_dtype = TZ_DT_BF16; /* C2 still holds C's first values */
        g_gpu->copy(g_gpu, C.d, C2.d, (size_t)(M * N) * 4);
        /* whole, one GEMM of the matmul's shape: a GPU's cuBLAS may sum a chunk's narrower
         * GEMM in another order (the chunks against the whole: dq_case, within 1e-5) */
        const int chunks = g_gpu->tq_chunks;
        g_gpu->tq_chunks = 0;
        g_gpu->tq_matmul(g_gpu, C.d, A.d, 0, tile.d, dcodes, dscales, lv.d, rows, cols, bits, g,
                         M, tw, 0.9f, 0.4f);
        g_gpu->tq_chunks = chunks;
        g_gpu->tq_dequant(g_gpu, tile.d, dcodes, dscales, lv.d, rows, cols, bits, g);
        g_gpu->matmul(g_gpu, C2.d, A.d, tile.d, M, N, K, 0, tw, 0.9f, 0.4f);
        g_gpu->matmul_dtype = TZ_DT_F32;
        float *a = malloc((size_t)(M * N) * 4), *b = malloc((size_t)(M * N) * 4);
        g_gpu->download(g_gpu, a, C.d, (size_t)(M * N) * 4);
        g_gpu->download(g_gpu, b, C2.d, (size_t)(M * N) * 4);
        check(!memcmp(a, b, (size_t)(M * N) * 4),
              "tq_matmul transW=%d (bf16): decoded straight to bf16 = fp32 tile then bf16 "
              "matmul, bit for bit", tw);
        free(a), free(b);
        drop(&A), drop(&C), drop(&C2);
    }
    g_gpu->release(g_gpu, dcodes), g_gpu->release(g_gpu, dscales);
    free(codes), free(scales);
    drop(&lv), drop(&tile);
}

/* The fused narrow product of a quantized weight (tz_tq_fused_plan, cuda_narrow.cu's
 * k_narrow_tq): tq_matmul and tq_matmul_lora on at most 64 rows, the codes decoded on their way
 * into shared memory. Held to two references:
 *   - bit for bit, the narrow GEMM (matmul16) of the same rows and of the weight as the CPU
 *     decodes it, with LoRA's and the bias's columns after it as tq_matmul_lora folds them:
 *     the same plan, so the same sums in the same order; a bf16 C is that fp32 C rounded;
 *   - within the bf16 GEMM's bound (2 K 2^-24 of the sum of magnitudes, as narrow_run) of the
 *     rounded operands' products summed in double.
 * c_off: the codes that many bytes past a 4-byte boundary (byte loads). r: LoRA's rank (with
 * lora: tq_matmul_lora, transW 1, alpha 1, beta 0), nb: a bias. */
static void fused_case(int bits, int g, int64_t rows, int64_t cols, int64_t M, int transW,
                       int lora, int64_t r, int nb, int c16, int a16, float beta, int c_off) {
    const int64_t n = rows * cols, ng = n / g;
    const int64_t ext = lora ? r + nb : 0, ld = lora ? cols + ((ext + 7) & ~(int64_t)7) : cols;
    const int64_t N = transW ? rows : cols, K = transW ? ld : rows;
    const float alpha = lora ? 1.0f : 0.9f, sc = 0.75f;
    if (lora) beta = 0.0f;
    const size_t cb = (size_t)tz_tq_codes_bytes(rows, cols, bits);
    uint8_t *codes = malloc(cb);
    uint16_t *scales = malloc((size_t)ng * 2);
    float lv[16], *wd = malloc((size_t)n * 4);
    for (size_t i = 0; i < cb; i++) codes[i] = (uint8_t)tz_rng_below(&g_rng, 256);
    for (int64_t i = 0; i < ng; i++) scales[i] = tz_f32_to_bf16(urand(0.1f));
    for (int i = 0; i < 1 << bits; i++) lv[i] = urand(2.0f);
    g_cpu->tq_dequant(g_cpu, wd, codes, scales, lv, rows, cols, bits, g);
    uint8_t *dc = g_gpu->alloc(g_gpu, cb + 4);
    uint16_t *ds = g_gpu->alloc(g_gpu, (size_t)ng * 2);
    float *dl = g_gpu->alloc(g_gpu, sizeof lv);
    g_gpu->upload(g_gpu, dc + c_off, codes, cb);
    g_gpu->upload(g_gpu, ds, scales, (size_t)ng * 2);
    g_gpu->upload(g_gpu, dl, lv, sizeof lv);
    /* A [M, K] (its fp32 values; as bf16 where a16 or lora), h [M, r], B [rows, r], bias */
    float *ah = malloc((size_t)(M * K) * 4), *hh = malloc((size_t)(M * (r + 1)) * 4);
    float *bh = malloc((size_t)(rows * (r + 1)) * 4), *biash = malloc((size_t)rows * 4);
    for (int64_t i = 0; i < M * K; i++) ah[i] = urand(1.0f);
    for (int64_t i = 0; i < M * r; i++) hh[i] = urand(1.0f);
    for (int64_t i = 0; i < rows * r; i++) bh[i] = urand(1.0f);
    for (int64_t i = 0; i < rows; i++) biash[i] = urand(1.0f);
    void *adev;
    if (a16 || lora) {
        uint16_t *t = malloc((size_t)(M * K) * 2);
        for (int64_t i = 0; i < M * K; i++) t[i] = tz_f32_to_bf16(ah[i]);
        adev = g_gpu->alloc(g_gpu, (size_t)(M * K) * 2);
        g_gpu->upload(g_gpu, adev, t, (size_t)(M * K) * 2);
        free(t);
    } else {
        adev = g_gpu->alloc(g_gpu, (size_t)(M * K) * 4);
        g_gpu->upload(g_gpu, adev, ah, (size_t)(M * K) * 4);
    }
    pair h = mk(M * (r + 1), 0.0f), B = mk(rows * (r + 1), 0.0f), bias = mk(rows, 0.0f);
    g_gpu->upload(g_gpu, h.d, hh, (size_t)(M * (r + 1)) * 4);
    g_gpu->upload(g_gpu, B.d, bh, (size_t)(rows * (r + 1)) * 4);
    g_gpu->upload(g_gpu, bias.d, biash, (size_t)rows * 4);
    /* X = [W | s B | b | 0] [rows, ld] (transW 1) or W [rows, cols]: values bf16 holds */
    const int64_t nx = transW ? rows * ld : n;
    float *xh = malloc((size_t)nx * 4);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < (transW ? ld : cols); j++) {
            float v = j < cols      ? wd[i * cols + j]
                      : j < cols + r ? sc * bh[i * r + (j - cols)]
                      : j == cols + r && nb ? biash[i]
                                            : 0.0f;
            xh[i * (transW ? ld : cols) + j] = tz_bf16_to_f32(tz_f32_to_bf16(v));
        }
    float *xd = g_gpu->alloc(g_gpu, (size_t)nx * 4);
    g_gpu->upload(g_gpu, xd, xh, (size_t)nx * 4);
    float *c0 = malloc((size_t)(M * N) * 4);
    for (int64_t i = 0; i < M * N; i++) c0[i] = beta == 0.0f ? NAN : urand(1.0f);
    pair C = mkz(M * N), R = mkz(M * N);
    g_gpu->upload(g_gpu, C.d, c0, (size_t)(M * N) * 4);
    g_gpu->upload(g_gpu, R.d, c0, (size_t)(M * N) * 4);
    const int64_t tile_n = tz_tq_tile_elems(g_gpu, rows, cols, ld, g);
    float *tile = g_gpu->alloc(g_gpu, (size_t)tile_n * 4);
    g_gpu->matmul_dtype = TZ_DT_BF16;
    if (lora)
        g_gpu->tq_matmul_lora(g_gpu, C.d, adev, ld, r ? h.d : NULL, r ? B.d : NULL, r, sc, tile,
                              dc + c_off, ds, dl, rows, cols, bits, g, M, nb ? bias.d : NULL, c16);
    else
        g_gpu->tq_matmul(g_gpu, C.d, adev, a16, tile, dc + c_off, ds, dl, rows, cols, bits, g, M,
                         transW, alpha, beta);
    /* the reference: A as the fused call left it (tq_matmul_lora writes h and the bias's 1 into
     * its columns after cols) */
    if (lora) {
        uint16_t *t = malloc((size_t)(M * K) * 2);
        g_gpu->download(g_gpu, t, adev, (size_t)(M * K) * 2);
        for (int64_t i = 0; i < M * K; i++) ah[i] = tz_bf16_to_f32(t[i]);
        free(t);
    }
    g_gpu->matmul16(g_gpu, R.d, adev, a16 || lora, xd, 0, M, N, K, 0, transW, alpha, beta);
    g_gpu->matmul_dtype = TZ_DT_F32;
    float *got = malloc((size_t)(M * N) * 4), *ref = malloc((size_t)(M * N) * 4);
    g_gpu->download(g_gpu, ref, R.d, (size_t)(M * N) * 4);
    int same;
    if (c16) {
        uint16_t *g16 = malloc((size_t)(M * N) * 2), *r16 = malloc((size_t)(M * N) * 2);
        g_gpu->download(g_gpu, g16, C.d, (size_t)(M * N) * 2);
        for (int64_t i = 0; i < M * N; i++) r16[i] = tz_f32_to_bf16(ref[i]);
        same = bits16_same("fused bf16 C", g16, r16, M * N);
        for (int64_t i = 0; i < M * N; i++) got[i] = tz_bf16_to_f32(g16[i]);
        free(g16), free(r16);
    } else {
        g_gpu->download(g_gpu, got, C.d, (size_t)(M * N) * 4);
        same = !memcmp(got, ref, (size_t)(M * N) * 4);
    }
    double worst = 0;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double acc = 0, sabs = 0;
            for (int64_t k = 0; k < K; k++) {
                const double a = tz_bf16_to_f32(tz_f32_to_bf16(ah[i * K + k]));
                const double x = transW ? xh[j * ld + k] : xh[k * cols + j];
                acc += a * x, sabs += fabs(a * x);
            }
            const double b0 = beta == 0.0f ? 0.0 : beta * (double)c0[i * N + j];
            acc = alpha * acc + b0, sabs = alpha * sabs + fabs(b0);
            /* a bf16 C: its rounding (half a unit: at most 2^-8 relative) on top */
            const double tol = 2.0 * K * 0x1p-24 * sabs + (c16 ? 0x1p-8 * fabs(acc) : 0.0);
            const double e = fabs((double)got[i * N + j] - acc) / tol;
            if (!(e <= worst)) worst = e;
        }
    check(same && worst <= 1.0,
          "fused tq_%s, %d bits in groups of %d, W %lld x %lld, %lld rows, transW %d%s%s%s%s, "
          "beta %g: %s the narrow GEMM of the decoded weight, %.2f of the bf16 bound",
          lora ? "matmul_lora" : "matmul", bits, g, (long long)rows, (long long)cols,
          (long long)M, transW, lora ? (r ? ", LoRA" : ", no adapter") : "",
          nb ? " and a bias" : "", c16 ? ", C in bf16" : "", c_off ? ", codes unaligned" : "",
          (double)beta, same ? "the bits of" : "NOT the bits of", worst);
    g_gpu->release(g_gpu, dc), g_gpu->release(g_gpu, ds), g_gpu->release(g_gpu, dl);
    g_gpu->release(g_gpu, adev), g_gpu->release(g_gpu, xd), g_gpu->release(g_gpu, tile);
    drop(&h), drop(&B), drop(&bias), drop(&C), drop(&R);
    free(codes), free(scales), free(wd), free(ah), free(hh), free(bh), free(biash), free(xh);
    free(c0), free(got), free(ref);
}

static void test_tq_fused(void) {
    /* bits, group, rows, cols, M, transW, lora, r, bias, c16, a16, beta, codes offset */
    fused_case(4, 64, 200, 256, 1, 1, 0, 0, 0, 0, 0, 0.0f, 0);    /* a decode step, A fp32 */
    fused_case(3, 128, 130, 384, 5, 0, 0, 0, 0, 0, 1, 0.4f, 0);   /* backward, K cut by rows */
    fused_case(2, 256, 96, 512, 16, 1, 0, 0, 0, 0, 0, 1.0f, 0);
    fused_case(1, 64, 70, 128, 33, 0, 0, 0, 0, 0, 1, 0.0f, 0);    /* 64 columns, two stages */
    fused_case(4, 128, 300, 1024, 2, 1, 0, 0, 0, 0, 1, 0.0f, 0);  /* several stages a block */
    fused_case(4, 64, 90, 2048, 3, 0, 0, 0, 0, 0, 1, 0.0f, 0);    /* 32 column blocks */
    /* blocks of three stages (K split into 10 of 192 and one of 128): the stages after the
     * first two decoded in the loop, into the buffer ahead; two buffers at 64 columns */
    fused_case(4, 128, 1100, 2048, 1, 1, 0, 0, 0, 0, 0, 0.0f, 0);
    fused_case(3, 64, 2048, 1152, 64, 0, 0, 0, 0, 0, 1, 0.0f, 0);
    /* four stages a block (9 splits): the codes loaded two rounds ahead, in the loop too */
    fused_case(4, 128, 2048, 2304, 1, 1, 0, 0, 0, 0, 0, 0.0f, 0);
    fused_case(2, 256, 2304, 2048, 5, 0, 0, 0, 0, 0, 1, 0.0f, 0);
    fused_case(3, 64, 100, 192, 7, 1, 0, 0, 0, 0, 1, 0.0f, 1);    /* codes at odd addresses */
    fused_case(2, 64, 77, 256, 4, 0, 0, 0, 0, 0, 0, 0.5f, 2);
    /* tq_matmul_lora: T's columns after W's (one stage; two at rank 64 and a bias) */
    fused_case(4, 64, 150, 192, 3, 1, 1, 5, 1, 0, 1, 0.0f, 0);
    fused_case(4, 64, 150, 192, 3, 1, 1, 5, 1, 1, 1, 0.0f, 0);    /* C in bf16 */
    fused_case(3, 128, 260, 256, 1, 1, 1, 16, 0, 1, 1, 0.0f, 0);
    fused_case(2, 64, 140, 128, 64, 1, 1, 64, 1, 0, 1, 0.0f, 0);
    fused_case(4, 128, 129, 256, 9, 1, 1, 0, 1, 0, 1, 0.0f, 3);   /* a bias alone */
    fused_case(4, 256, 1100, 2048, 2, 1, 1, 16, 0, 0, 1, 0.0f, 0); /* T's stage in the loop */
}

/* max |b - a| / max |a| of two device arrays of n floats (NaN: +inf) */
static double dev_rel(const float *a, const float *b, int64_t n) {
    float *ha = malloc((size_t)n * 4), *hb = malloc((size_t)n * 4);
    g_gpu->download(g_gpu, ha, a, (size_t)n * 4);
    g_gpu->download(g_gpu, hb, b, (size_t)n * 4);
    double e = 0.0, m = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs((double)hb[i] - (double)ha[i]);
        if (!(d <= e)) e = d;
        m = fmax(m, fabs((double)ha[i]));
    }
    free(ha), free(hb);
    return e != e ? INFINITY : m > 0 ? e / m : e;
}

/* The decode (the fused kernel off), bit for bit against the CPU: fp32 through tq_dequant,
 * bf16 through tq_matmul's tile (with bf16 GEMMs the CUDA backend leaves the decoded weight
 * there, which must be the CPU's fp32 decode rounded to nearest even). w_off (bytes) and c_off put the output and the
 * codes off the alignment of the wide stores and loads (the element-by-element path). The
 * output starts as NaN and the 256 bytes after it must keep their canary. */
static void dq_case(int bits, int g, int64_t rows, int64_t cols, int w_off, int c_off) {
    const int64_t n = rows * cols, ng = n / g, M = 2;
    const int fused = g_gpu->tq_fused;
    g_gpu->tq_fused = 0; /* the decode itself (on 2 rows the fused kernel: fused_case) */
    const size_t cb = (size_t)tz_tq_codes_bytes(rows, cols, bits), wb = (size_t)n * 4;
    uint8_t *codes = malloc(cb);
    uint16_t *scales = malloc((size_t)ng * 2), *got16 = malloc((size_t)n * 2);
    float lv[16], *ref = malloc(wb), *got = malloc(wb);
    for (size_t i = 0; i < cb; i++) codes[i] = (uint8_t)tz_rng_below(&g_rng, 256);
    for (int64_t i = 0; i < ng; i++) scales[i] = tz_f32_to_bf16(urand(0.1f));
    for (int i = 0; i < 1 << bits; i++) lv[i] = urand(2.0f);
    g_cpu->tq_dequant(g_cpu, ref, codes, scales, lv, rows, cols, bits, g);
    uint8_t *dc = g_gpu->alloc(g_gpu, cb + 4);
    uint16_t *ds = g_gpu->alloc(g_gpu, (size_t)ng * 2);
    float *dl = g_gpu->alloc(g_gpu, sizeof lv);
    char *dw = g_gpu->alloc(g_gpu, 16 + wb + WS_CANARY);
    float *w = (float *)(void *)(dw + w_off);
    g_gpu->upload(g_gpu, dc + c_off, codes, cb);
    g_gpu->upload(g_gpu, ds, scales, (size_t)ng * 2);
    g_gpu->upload(g_gpu, dl, lv, sizeof lv);
    char shape[96];
    snprintf(shape, sizeof shape, "bits %d group %d, %lld x %lld%s%s", bits, g, (long long)rows,
             (long long)cols, w_off ? ", output unaligned" : "", c_off ? ", codes unaligned" : "");
    ws_fill(w, wb);
    g_gpu->tq_dequant(g_gpu, w, dc + c_off, ds, dl, rows, cols, bits, g);
    g_gpu->download(g_gpu, got, w, wb);
    check(!memcmp(got, ref, wb) && ws_canary_ok(w, wb),
          "tq_dequant fp32 %s: the CPU's bits, canary kept", shape);
    pair A = mk(M * cols, 1.0f), C = mkz(M * rows), dA = mkz(M * cols), B = mk(M * rows, 1.0f);
    ws_fill(w, (size_t)n * 2);
    g_gpu->matmul_dtype = TZ_DT_BF16;
    const int chunks = g_gpu->tq_chunks;
    g_gpu->tq_chunks = 0; /* whole: the tile holds the decoded weight */
    g_gpu->tq_matmul(g_gpu, C.d, A.d, 0, w, dc + c_off, ds, dl, rows, cols, bits, g, M, 1, 1.0f,
                     0.0f);
    g_gpu->download(g_gpu, got16, w, (size_t)n * 2);
    uint16_t *ref16 = malloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++) ref16[i] = tz_f32_to_bf16(ref[i]);
    const int same = bits16_same("decoded bf16", got16, ref16, n);
    free(ref16);
    check(same && ws_canary_ok(w, (size_t)n * 2),
          "tq decode to bf16 %s: the CPU's bits rounded, canary kept", shape);
    g_gpu->tq_matmul(g_gpu, dA.d, B.d, 0, w, dc + c_off, ds, dl, rows, cols, bits, g, M, 0, 1.0f,
                     0.0f);
    g_gpu->tq_chunks = chunks;
    if (chunks > 1) {
        /* decoded in chunks (two buffers, the next decoded on a side stream while the GEMM
         * reads the last): the whole decode's products, within the tile the planner gives
         * (tz_tq_tile_elems), both ways round */
        g_gpu->matmul_dtype = TZ_DT_BF16;
        const int64_t need = tz_tq_tile_elems(g_gpu, rows, cols, cols, g);
        pair C2 = mkz(M * rows), dA2 = mkz(M * cols);
        ws_fill(w, (size_t)need * 2);
        g_gpu->tq_matmul(g_gpu, C2.d, A.d, 0, w, dc + c_off, ds, dl, rows, cols, bits, g, M, 1,
                         1.0f, 0.0f);
        g_gpu->tq_matmul(g_gpu, dA2.d, B.d, 0, w, dc + c_off, ds, dl, rows, cols, bits, g, M, 0,
                         1.0f, 0.0f);
        g_gpu->matmul_dtype = TZ_DT_F32;
        const double ef = dev_rel(C.d, C2.d, M * rows), eb = dev_rel(dA.d, dA2.d, M * cols);
        check(ef <= 1e-5 && eb <= 1e-5 && ws_canary_ok(w, (size_t)need * 2),
              "tq_matmul %s in chunks of %lld rows / %lld columns: the whole decode's products "
              "(within %.1e and %.1e of the largest, tolerance 1e-5: the same sums, GEMMs of "
              "other widths), the tile's %lld elements kept to", shape,
              (long long)tz_tq_chunk_rows(g_gpu, rows), (long long)tz_tq_chunk_cols(g_gpu, cols, g),
              ef, eb, (long long)need);
        drop(&C2), drop(&dA2);
        /* tq_matmul_lora (rank 5 and a bias: 2 zero columns of padding) in chunks and whole
         * (each chunk's rows of B and of the bias) */
        const int64_t rk = 5, ld = cols + 8;
        uint16_t *a16h = malloc((size_t)(M * ld) * 2), *a16 = g_gpu->alloc(g_gpu, (size_t)(M * ld) * 2);
        for (int64_t i = 0; i < M * ld; i++) a16h[i] = tz_f32_to_bf16(urand(1.0f));
        g_gpu->upload(g_gpu, a16, a16h, (size_t)(M * ld) * 2);
        pair h = mk(M * rk, 1.0f), Bl = mk(rows * rk, 1.0f), L1 = mkz(M * rows), L2 = mkz(M * rows);
        pair bias = mk(rows, 1.0f);
        g_gpu->matmul_dtype = TZ_DT_BF16;
        g_gpu->tq_matmul_lora(g_gpu, L1.d, a16, ld, h.d, Bl.d, rk, 0.75f, w, dc + c_off, ds, dl,
                              rows, cols, bits, g, M, bias.d, 0);
        /* C in bf16 (c_bf16), in chunks: each chunk's GEMM rounds its columns */
        pair L3 = mkz(M * rows);
        g_gpu->tq_matmul_lora(g_gpu, L3.d, a16, ld, h.d, Bl.d, rk, 0.75f, w, dc + c_off, ds, dl,
                              rows, cols, bits, g, M, bias.d, 1);
        g_gpu->tq_chunks = 0;
        g_gpu->tq_matmul_lora(g_gpu, L2.d, a16, ld, h.d, Bl.d, rk, 0.75f, w, dc + c_off, ds, dl,
                              rows, cols, bits, g, M, bias.d, 0);
        g_gpu->tq_chunks = chunks;
        g_gpu->matmul_dtype = TZ_DT_F32;
        const double el = dev_rel(L2.d, L1.d, M * rows);
        check(el <= 1e-5, "tq_matmul_lora %s, rank 5, a bias: in chunks = whole (within %.1e of "
              "the largest, tolerance 1e-5)", shape, el);
        /* to the bit on the emulation (one cuBLAS sum for both); a GPU's cuBLAS may sum a
         * bf16 C in another order: within one bf16 unit there */
        tz_device_info di;
        g_gpu->device_info(g_gpu, &di);
        const int emu = strstr(di.name, "CPU emulation") != NULL;
        check(near16(g_gpu, L3.d, L1.d, M * rows, !emu),
              "tq_matmul_lora %s, C in bf16 = its fp32 C rounded by to_bf16, %s", shape,
              emu ? "bit for bit" : "within one bf16 unit");
        drop(&h), drop(&Bl), drop(&L1), drop(&L2), drop(&L3), drop(&bias);
        g_gpu->release(g_gpu, a16);
        free(a16h);
    }
    g_gpu->matmul_dtype = TZ_DT_F32;
    drop(&A), drop(&C), drop(&dA), drop(&B);
    g_gpu->release(g_gpu, dc), g_gpu->release(g_gpu, ds), g_gpu->release(g_gpu, dl);
    g_gpu->release(g_gpu, dw);
    free(codes), free(scales), free(got16), free(ref), free(got);
    g_gpu->tq_fused = fused;
}

/* The rotation at rows that end inside a warp (cols not a multiple of the 1024 columns a
 * block covers) and, with off = 1, on pointers off the 16-byte alignment of the wide loads.
 * The element before and after the rows must stay untouched. The forward rotation is exact
 * (sign flips, the same butterflies, one product), hence 0; the inverse accumulates (1e-6). */
static void rot_case(int g, int64_t rows, int64_t cols, int off) {
    const int64_t n = rows * cols + 2;
    pair x = mk(n, 1.0f), y = mkz(n), dx = mk(n, 1.0f);
    char what[96];
    g_cpu->tq_rotate(g_cpu, y.h + off, x.h + off, rows, cols, g, 99);
    g_gpu->tq_rotate(g_gpu, y.d + off, x.d + off, rows, cols, g, 99);
    snprintf(what, sizeof what, "tq_rotate group %d, %lld x %lld%s", g, (long long)rows,
             (long long)cols, off ? ", unaligned" : "");
    expect(what, &y, 0);
    g_cpu->tq_rotate_bwd(g_cpu, dx.h + off, y.h + off, rows, cols, g, 99, 1);
    g_gpu->tq_rotate_bwd(g_gpu, dx.d + off, y.d + off, rows, cols, g, 99, 1);
    snprintf(what, sizeof what, "tq_rotate_bwd group %d, %lld x %lld%s", g, (long long)rows,
             (long long)cols, off ? ", unaligned" : "");
    expect(what, &dx, 1e-6);
    /* tq_rotate16: the CPU's bf16 bits (both round the same fp32 values), nothing written
     * past the rows */
    const size_t b16 = (size_t)(rows * cols) * 2;
    uint16_t *h16 = malloc(b16), *g16 = malloc(b16 + 32);
    uint16_t *d16 = g_gpu->alloc(g_gpu, b16 + 32); /* 16 canary bytes either side */
    g_gpu->upload(g_gpu, d16, memset(g16, 0xA5, b16 + 32), b16 + 32);
    g_cpu->tq_rotate16(g_cpu, h16, x.h + off, rows, cols, cols, g, 99, NULL);
    g_gpu->tq_rotate16(g_gpu, d16 + 8 + off, x.d + off, rows, cols, cols, g, 99, NULL);
    g_gpu->download(g_gpu, g16, d16, b16 + 32);
    int same = bits16_same("rotated bf16", g16 + 8 + off, h16, rows * cols), kept = 1;
    for (int64_t i = 0; i < (int64_t)(b16 + 32) / 2; i++)
        if (i < 8 + off || i >= 8 + off + rows * cols) kept &= g16[i] == 0xA5A5;
    if (!kept) printf("  rotated bf16: the canary either side overwritten\n");
    check(same && kept, "tq_rotate16 group %d, %lld x %lld%s: the CPU's bf16 bits, canary kept",
          g, (long long)rows, (long long)cols, off ? ", unaligned" : "");
    g_gpu->release(g_gpu, d16);
    /* at a row stride of cols + 24 (tq_matmul_lora's rows): each row the same bits, the
     * elements between the rows left as they were */
    const int64_t ld = cols + 24;
    const size_t s16 = (size_t)(rows * ld) * 2;
    uint16_t *gs = malloc(s16), *ds = g_gpu->alloc(g_gpu, s16);
    g_gpu->upload(g_gpu, ds, memset(gs, 0xA5, s16), s16);
    /* ... and x itself rounded in the same pass (xc): to_bf16's bits, canary after it kept */
    uint16_t *xc = g_gpu->alloc(g_gpu, b16 + 32), *hc = malloc(b16 + 32);
    g_gpu->upload(g_gpu, xc, memset(hc, 0xA5, b16 + 32), b16 + 32);
    g_gpu->tq_rotate16(g_gpu, ds, x.d + off, rows, cols, ld, g, 99, xc + off);
    g_gpu->download(g_gpu, gs, ds, s16);
    g_gpu->download(g_gpu, hc, xc, b16 + 32);
    same = 1, kept = 1;
    for (int64_t r = 0; r < rows; r++) {
        same &= !memcmp(gs + r * ld, h16 + r * cols, (size_t)cols * 2);
        for (int64_t j = cols; j < ld; j++) kept &= gs[r * ld + j] == 0xA5A5;
    }
    int xsame = 1;
    for (int64_t i = 0; i < rows * cols; i++) xsame &= hc[off + i] == tz_f32_to_bf16(x.h[off + i]);
    for (int64_t i = off + rows * cols; i < (int64_t)(b16 + 32) / 2; i++) xsame &= hc[i] == 0xA5A5;
    if (!(same && kept && xsame))
        printf("  rotated bf16 at a row stride: rows %s, gaps %s, x rounded %s\n",
               same ? "the same" : "differ", kept ? "kept" : "overwritten",
               xsame ? "right" : "wrong or its canary overwritten");
    check(same && kept && xsame, "tq_rotate16 group %d, %lld x %lld%s at row stride %lld: the "
          "same bits, the gaps kept, x rounded beside it (to_bf16's bits)", g, (long long)rows,
          (long long)cols, off ? ", unaligned" : "", (long long)ld);
    g_gpu->release(g_gpu, xc);
    free(hc);
    g_gpu->release(g_gpu, ds);
    free(gs);
    free(h16), free(g16);
    drop(&x), drop(&y), drop(&dx);
}

/* A window of columns [c0, c0 + wc) of rows of cols (the Llama's MLP in column chunks):
 * tq_rotate16_at on it gives the bits tq_rotate16 gives those columns of the whole rows (on
 * the device and on the CPU), and tq_rotate_bwd_at, written and added, the whole rows'
 * tq_rotate_bwd there (the same arithmetic on the same values: bit for bit). */
static void rot_window_case(int g, int64_t rows, int64_t cols, int64_t c0, int64_t wc) {
    pair x = mk(rows * cols, 1.0f), dx = mkz(rows * cols);
    pair xw = mk(rows * wc, 0.0f), dxw = mk(rows * wc, 1.0f), dxa = mk(rows * wc, 1.0f);
    for (int64_t r = 0; r < rows; r++)
        memcpy(xw.h + r * wc, x.h + r * cols + c0, (size_t)wc * 4);
    g_gpu->upload(g_gpu, xw.d, xw.h, (size_t)(rows * wc) * 4);
    const size_t bw = (size_t)(rows * wc) * 2, bf = (size_t)(rows * cols) * 2;
    uint16_t *hf = malloc(bf), *hw = malloc(bw), *gw = malloc(bw);
    uint16_t *dw = g_gpu->alloc(g_gpu, bw);
    g_cpu->tq_rotate16(g_cpu, hf, x.h, rows, cols, cols, g, 77, NULL);
    uint16_t *dxc = g_gpu->alloc(g_gpu, bw), *gxc = malloc(bw);
    g_cpu->tq_rotate16_at(g_cpu, hw, xw.h, rows, wc, wc, g, 77, c0, cols, NULL);
    g_gpu->tq_rotate16_at(g_gpu, dw, xw.d, rows, wc, wc, g, 77, c0, cols, dxc);
    g_gpu->download(g_gpu, gw, dw, bw);
    g_gpu->download(g_gpu, gxc, dxc, bw);
    int same = 1, xsame = 1;
    for (int64_t i = 0; i < rows * wc; i++) xsame &= gxc[i] == tz_f32_to_bf16(xw.h[i]);
    check(xsame, "tq_rotate16_at group %d: x rounded beside it (to_bf16's bits)", g);
    g_gpu->release(g_gpu, dxc);
    free(gxc);
    for (int64_t r = 0; r < rows; r++)
        same &= !memcmp(hw + r * wc, hf + r * cols + c0, (size_t)wc * 2) &&
                !memcmp(gw + r * wc, hf + r * cols + c0, (size_t)wc * 2);
    check(same, "tq_rotate16_at group %d, columns [%lld, %lld) of %lld: the whole rows' bits "
          "there (CPU and device)", g, (long long)c0, (long long)(c0 + wc), (long long)cols);
    /* the inverse: the whole rows' dx (written) against the window's, written and added */
    float *full = malloc((size_t)(rows * cols) * 4), *got = malloc((size_t)(rows * wc) * 4);
    float *start = malloc((size_t)(rows * wc) * 4);
    memcpy(start, dxa.h, (size_t)(rows * wc) * 4);
    g_gpu->tq_rotate_bwd(g_gpu, dx.d, x.d, rows, cols, g, 77, 0);
    g_gpu->download(g_gpu, full, dx.d, (size_t)(rows * cols) * 4);
    g_gpu->tq_rotate_bwd_at(g_gpu, dxw.d, xw.d, rows, wc, g, 77, 0, c0, cols);
    g_gpu->tq_rotate_bwd_at(g_gpu, dxa.d, xw.d, rows, wc, g, 77, 1, c0, cols);
    g_cpu->tq_rotate_bwd_at(g_cpu, dxw.h, xw.h, rows, wc, g, 77, 0, c0, cols);
    int wsame = 1, asame = 1;
    g_gpu->download(g_gpu, got, dxw.d, (size_t)(rows * wc) * 4);
    for (int64_t r = 0; r < rows; r++)
        wsame &= !memcmp(got + r * wc, full + r * cols + c0, (size_t)wc * 4);
    g_gpu->download(g_gpu, got, dxa.d, (size_t)(rows * wc) * 4);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < wc; j++)
            asame &= got[r * wc + j] == start[r * wc + j] + full[r * cols + c0 + j];
    check(wsame && asame, "tq_rotate_bwd_at group %d, columns [%lld, %lld) of %lld: the whole "
          "rows' dx there, written (%s) and added (%s)", g, (long long)c0, (long long)(c0 + wc),
          (long long)cols, wsame ? "same" : "differs", asame ? "same" : "differs");
    expect("tq_rotate_bwd_at against the CPU's", &dxw, 1e-6);
    g_gpu->release(g_gpu, dw);
    free(hf), free(hw), free(gw), free(full), free(got), free(start);
    drop(&x), drop(&dx), drop(&xw), drop(&dxw), drop(&dxa);
}

/* Every bit width and group at 7 rows of 3 groups; a tensor ending inside a block's second
 * half (5 x 1280 at 256: 800 octets); one group; unaligned outputs and codes; a larger one. */
static void test_tq_decode(void) {
    for (int bits = 1; bits <= 4; bits++)
        for (int g = 64; g <= 256; g *= 2) dq_case(bits, g, 7, 3 * (int64_t)g, 0, 0);
    dq_case(3, 256, 5, 1280, 0, 0);
    dq_case(4, 128, 1, 128, 0, 0);
    dq_case(4, 64, 3, 192, 4, 0);
    dq_case(2, 128, 3, 384, 0, 1);
    dq_case(3, 64, 9, 320, 4, 1);
    dq_case(1, 256, 3, 512, 4, 3);
    dq_case(4, 128, 33, 2304, 0, 0);
    rot_case(64, 3, 1088, 0);  /* the last block: 8 live lanes of one warp */
    rot_case(128, 5, 1152, 1); /* unaligned */
    rot_case(256, 3, 1280, 0);
    rot_case(64, 1, 64, 1);
    rot_window_case(64, 3, 1088, 320, 448);  /* groups 5 .. 11 of 17 */
    rot_window_case(128, 2, 1152, 1024, 128); /* the last group */
    rot_window_case(256, 4, 1280, 0, 512);   /* the first two */
}

static void test_quant(void) {
    const int64_t rows = 5;
    const int64_t shapes[][2] = {{64, 192}, {128, 384}, {256, 512}, {128, 1152}};
    for (int s = 0; s < 4; s++) {
        int g = (int)shapes[s][0];
        int64_t cols = shapes[s][1];
        pair x = mk(rows * cols, 1.0f), y = mkz(rows * cols), dx = mk(rows * cols, 1.0f);
        char what[96];
        g_cpu->tq_rotate(g_cpu, y.h, x.h, rows, cols, g, 42 + (uint64_t)s);
        g_gpu->tq_rotate(g_gpu, y.d, x.d, rows, cols, g, 42 + (uint64_t)s);
        snprintf(what, sizeof what, "tq_rotate group %d cols %lld", g, (long long)cols);
        expect(what, &y, 1e-6);
        /* odd shapes add into dx; even ones write it, over NaN on both backends (read, the
         * NaN would stay) */
        if (!(s & 1)) g_cpu->fill(g_cpu, dx.h, NAN, rows * cols), g_gpu->fill(g_gpu, dx.d, NAN, rows * cols);
        g_cpu->tq_rotate_bwd(g_cpu, dx.h, y.h, rows, cols, g, 42 + (uint64_t)s, s & 1);
        g_gpu->tq_rotate_bwd(g_gpu, dx.d, y.d, rows, cols, g, 42 + (uint64_t)s, s & 1);
        snprintf(what, sizeof what, "tq_rotate_bwd group %d cols %lld, %s", g, (long long)cols,
                 s & 1 ? "added" : "written over NaN");
        expect(what, &dx, 1e-6);
        g_cpu->tq_rotate(g_cpu, x.h, x.h, rows, cols, g, 7);
        g_gpu->tq_rotate(g_gpu, x.d, x.d, rows, cols, g, 7);
        snprintf(what, sizeof what, "tq_rotate in place group %d", g);
        expect(what, &x, 1e-6);
        drop(&x), drop(&y), drop(&dx);
    }
    for (int bits = 1; bits <= 4; bits++)
        for (int g = 64; g <= 128; g *= 2) {
            const int64_t r = 3, cols = 2 * (int64_t)g, ng = r * cols / g;
            size_t cb = (size_t)tz_tq_codes_bytes(r, cols, bits);
            uint8_t *codes = malloc(cb);
            uint16_t *scales = malloc((size_t)ng * 2);
            for (size_t i = 0; i < cb; i++) codes[i] = (uint8_t)tz_rng_below(&g_rng, 256);
            for (int64_t i = 0; i < ng; i++) scales[i] = tz_f32_to_bf16(urand(0.1f));
            pair lv = mk(1 << bits, 2.0f), w = mkz(r * cols);
            uint8_t *dcodes = g_gpu->alloc(g_gpu, cb);
            uint16_t *dscales = g_gpu->alloc(g_gpu, (size_t)ng * 2);
            g_gpu->upload(g_gpu, dcodes, codes, cb);
            g_gpu->upload(g_gpu, dscales, scales, (size_t)ng * 2);
            g_cpu->tq_dequant(g_cpu, w.h, codes, scales, lv.h, r, cols, bits, g);
            g_gpu->tq_dequant(g_gpu, w.d, dcodes, dscales, lv.d, r, cols, bits, g);
            char what[64];
            snprintf(what, sizeof what, "tq_dequant bits %d group %d", bits, g);
            expect(what, &w, 0);
            g_gpu->release(g_gpu, dcodes), g_gpu->release(g_gpu, dscales);
            free(codes), free(scales);
            drop(&lv), drop(&w);
        }
    test_tq_matmul();
    test_tq_decode();
}

/* ---- the backend's own checks ---- */

/* The bf16 GEMM rounds its fp32 operands into a buffer of its own: both operands converted in
 * one call, one buffer serving as both (C = X X^T), and a call needing more room than any
 * before (the buffer grows inside it); each bit for bit against the same GEMM of a separate
 * copy (the same bf16 operands, so the same GEMM). */
static void test_matmul_operands(void) {
    const int64_t K = 77, sizes[2] = {29, 400};
    g_gpu->matmul_dtype = TZ_DT_BF16;
    pair X = mk(sizes[1] * K, 1.0f), Y = mkz(sizes[1] * K);
    g_gpu->copy(g_gpu, Y.d, X.d, (size_t)(sizes[1] * K) * 4);
    float *c1 = g_gpu->alloc(g_gpu, (size_t)(sizes[1] * sizes[1]) * 4);
    float *c2 = g_gpu->alloc(g_gpu, (size_t)(sizes[1] * sizes[1]) * 4);
    for (int i = 0; i < 2; i++) {
        const int64_t m = sizes[i];
        g_gpu->matmul(g_gpu, c1, X.d, X.d, m, m, K, 0, 1, 1.0f, 0.0f);
        g_gpu->matmul(g_gpu, c2, X.d, Y.d, m, m, K, 0, 1, 1.0f, 0.0f);
        float *a = malloc((size_t)(m * m) * 4), *b = malloc((size_t)(m * m) * 4);
        g_gpu->download(g_gpu, a, c1, (size_t)(m * m) * 4);
        g_gpu->download(g_gpu, b, c2, (size_t)(m * m) * 4);
        check(!memcmp(a, b, (size_t)(m * m) * 4) && a[0] == a[0],
              "bf16 matmul X X^T, %lld x %lld: one fp32 buffer as both operands = separate "
              "copies, bit for bit", (long long)m, (long long)K);
        free(a), free(b);
    }
    g_gpu->matmul_dtype = TZ_DT_F32;
    g_gpu->release(g_gpu, c1), g_gpu->release(g_gpu, c2);
    drop(&X), drop(&Y);
}

/* Runs the child named `name` (main's `children` table) in a child process with env ("NAME=value"
 * strings, NULL ended) added; its stderr in err. Returns its exit status (-1: killed by a
 * signal). The child is a fresh exec of this program, not a bare fork: a fork of a process
 * that has initialised CUDA cannot use CUDA (on a GPU every call fails), only the emulation
 * allowed it. */
static int in_child(const char *name, const char *const *env, char *err, size_t n) {
    int fd[2];
    if (pipe(fd)) return -1;
    fflush(stdout), fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 2), close(fd[0]), close(fd[1]);
        for (int i = 0; env[i]; i++) putenv((char *)env[i]);
        execl("/proc/self/exe", "test_cuda_ops", "--child", name, (char *)NULL);
        fprintf(stderr, "exec /proc/self/exe failed\n");
        _exit(126);
    }
    close(fd[1]);
    size_t got = 0;
    ssize_t r;
    while (got + 1 < n && (r = read(fd[0], err + got, n - 1 - got)) > 0) got += (size_t)r;
    err[got] = 0;
    char sink[256];
    while (read(fd[0], sink, sizeof sink) > 0) {}
    close(fd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A rotation whose kernel faults (the emulation's TZ_CUDA_EMU_FAULT), then a sync. */
static void child_fault(void) {
    tz_backend *be = tz_backend_create(TZ_DEVICE_CUDA, 0, 0);
    float *x = be->alloc(be, 3 * 128 * 4), *y = be->alloc(be, 3 * 128 * 4);
    be->fill(be, x, 1.0f, 3 * 128);
    be->tq_rotate(be, y, x, 3, 128, 64, 1);
    be->sync(be);
    fprintf(stderr, "no failure reported\n");
}

/* A narrow bf16 product (LoRA's h = x A^T: 300 x 16 over K 64, x in bf16), then a sync. */
static void child_narrow(void) {
    tz_backend *be = tz_backend_create(TZ_DEVICE_CUDA, 0, 0);
    be->matmul_dtype = TZ_DT_BF16;
    uint16_t *x = be->alloc(be, 300 * 64 * 2);
    float *a = be->alloc(be, 16 * 64 * 4), *h = be->alloc(be, 300 * 16 * 4);
    be->matmul16(be, h, x, 1, a, 0, 300, 16, 64, 0, 1, 1.0f, 0.0f);
    be->sync(be);
    fprintf(stderr, "no failure reported\n");
}

/* A 4-bit weight's product on one row (a decode step's y = x W^T: 128 x 128), then a sync. */
static void child_narrow_tq(void) {
    tz_backend *be = tz_backend_create(TZ_DEVICE_CUDA, 0, 0);
    be->matmul_dtype = TZ_DT_BF16;
    uint8_t *codes = be->alloc(be, 128 * 128 / 2);
    uint16_t *scales = be->alloc(be, 128 * 2 * 2);
    float *lv = be->alloc(be, 16 * 4), *x = be->alloc(be, 128 * 4), *y = be->alloc(be, 128 * 4);
    float *tile = be->alloc(be, (size_t)tz_tq_tile_elems(be, 128, 128, 128, 64) * 4);
    be->tq_matmul(be, y, x, 0, tile, codes, scales, lv, 128, 128, 4, 64, 1, 1, 1.0f, 0.0f);
    be->sync(be);
    fprintf(stderr, "no failure reported\n");
}

static void child_old_driver(void) {
    fprintf(stderr, "device count %d\n", tz_cuda_device_count());
    tz_backend_create(TZ_DEVICE_CUDA, 0, 0);
}

/* The child of test_op_times: three fp32 matmuls and an rmsnorm; the output's sum of
 * squares (as a hex float) on stderr before the backend's end. */
static void child_op_times(void) {
    tz_backend *be = tz_backend_create(TZ_DEVICE_CUDA, 0, 0);
    const int64_t M = 19, N = 23, K = 31;
    float *a = be->alloc(be, (size_t)(M * K) * 4), *b = be->alloc(be, (size_t)(K * N) * 4);
    float *c = be->alloc(be, (size_t)(M * N) * 4), *w = be->alloc(be, (size_t)N * 4);
    float *r = be->alloc(be, (size_t)M * 4);
    be->fill(be, a, 0.3f, M * K), be->fill(be, b, -0.7f, K * N), be->fill(be, w, 1.1f, N);
    for (int i = 0; i < 3; i++) be->matmul(be, c, a, b, M, N, K, 0, 0, 0.5f, i ? 1.0f : 0.0f);
    be->rmsnorm_fwd(be, c, r, c, w, M, N, 1e-5f);
    fprintf(stderr, "sumsq %a\n", be->sumsq(be, c, M * N));
    /* attention over a cache of 600 keys in splits: two kernels, each a part of the op */
    const int64_t S = 600, D = 32;
    float *qc = be->alloc(be, (size_t)D * 4), *kv = be->alloc(be, (size_t)(S * D) * 4);
    float *oc = be->alloc(be, (size_t)D * 4);
    be->fill(be, qc, 0.1f, D), be->fill(be, kv, 0.2f, S * D);
    be->attention_cache_fwd(be, oc, qc, kv, kv, 1, 1, S, S - 1, 1, 1, D, 0);
    be->sync(be);
    tz_backend_destroy(be);
}

/* The count of a row of the TZ_CUDA_OP_TIMES table ("  op  calls ..."), -1 without it. */
static long op_calls(const char *table, const char *op) {
    char pat[64];
    snprintf(pat, sizeof pat, "\n  %s ", op);
    const char *at = strstr(table, pat);
    long n = -1;
    if (at && sscanf(at + strlen(pat), "%ld", &n) != 1) n = -1;
    return n;
}

/* TZ_CUDA_OP_TIMES: the same bits as without it, and a table at the backend's end counting
 * each op's calls (on any CUDA backend: the emulation and a GPU). */
static void test_op_times(void) {
    char plain[4096], timed[8192];
    const char *none[] = {NULL}, *env[] = {"TZ_CUDA_OP_TIMES=1", NULL};
    int rc0 = in_child("op_times", none, plain, sizeof plain);
    int rc1 = in_child("op_times", env, timed, sizeof timed);
    const char *s0 = strstr(plain, "sumsq "), *s1 = strstr(timed, "sumsq ");
    check(rc0 == 0 && rc1 == 0 && s0 && s1 && strcspn(s0, "\n") == strcspn(s1, "\n") &&
              !strncmp(s0, s1, strcspn(s0, "\n")),
          "TZ_CUDA_OP_TIMES=1: the same result as without it (exits %d, %d)", rc0, rc1);
    check(strstr(timed, "TZ_CUDA_OP_TIMES on") && !strstr(plain, "TZ_CUDA_OP_TIMES on"),
          "TZ_CUDA_OP_TIMES=1: the table at the backend's end, and only then");
    check(op_calls(timed, "matmul") == 3 && op_calls(timed, "rmsnorm_fwd") == 1 &&
              op_calls(timed, "sumsq") == 1 && op_calls(timed, "fill") == 5,
          "TZ_CUDA_OP_TIMES=1: calls counted per op (matmul %ld, rmsnorm_fwd %ld, sumsq %ld, "
          "fill %ld)", op_calls(timed, "matmul"), op_calls(timed, "rmsnorm_fwd"),
          op_calls(timed, "sumsq"), op_calls(timed, "fill"));
    /* the parts of an op of several kernels (tz_cuda_part), each once */
    check(op_calls(timed, "attention_cache_fwd") == 1 &&
              op_calls(timed, "attention_cache_fwd: k_att_cache") == 1 &&
              op_calls(timed, "attention_cache_fwd: k_att_cache_join") == 1 &&
              strstr(timed, "parts of ops") && !strstr(plain, "parts of ops"),
          "TZ_CUDA_OP_TIMES=1: an op's parts counted (attention_cache_fwd %ld: k_att_cache %ld, "
          "k_att_cache_join %ld)", op_calls(timed, "attention_cache_fwd"),
          op_calls(timed, "attention_cache_fwd: k_att_cache"),
          op_calls(timed, "attention_cache_fwd: k_att_cache_join"));
}

/* TZ_CUDA_SYNC_DEBUG: the same results as without it; a kernel's fault named by its op (and,
 * without the mode, by the later call that synchronises); cudaGetDeviceCount's error named.
 * The failures are the emulation's (a GPU cannot be made to fail on demand). */
static void test_checked_mode(void) {
    tz_device_info di;
    g_gpu->device_info(g_gpu, &di);
    if (!strstr(di.name, "CPU emulation")) {
        printf("skip: TZ_CUDA_SYNC_DEBUG and failures on demand are tested on the emulation\n");
        return;
    }
    setenv("TZ_CUDA_SYNC_DEBUG", "1", 1);
    tz_backend *dbg = tz_backend_create(TZ_DEVICE_CUDA, 0, 0);
    unsetenv("TZ_CUDA_SYNC_DEBUG");
    const int64_t M = 21, N = 33, K = 40;
    pair A = mk(M * K, 1.0f), B = mk(K * N, 1.0f), w = mk(N, 1.0f);
    float *out[2], *rstd[2];
    tz_backend *bes[2] = {g_gpu, dbg};
    for (int i = 0; i < 2; i++) {
        bes[i]->matmul_dtype = TZ_DT_BF16;
        out[i] = bes[i]->alloc(bes[i], (size_t)(M * N) * 4);
        rstd[i] = bes[i]->alloc(bes[i], (size_t)M * 4);
        bes[i]->matmul(bes[i], out[i], A.d, B.d, M, N, K, 0, 0, 0.5f, 0.0f);
        bes[i]->rmsnorm_fwd(bes[i], out[i], rstd[i], out[i], w.d, M, N, 1e-5f);
        bes[i]->matmul_dtype = TZ_DT_F32;
    }
    float *a = malloc((size_t)(M * N) * 4), *b = malloc((size_t)(M * N) * 4);
    g_gpu->download(g_gpu, a, out[0], (size_t)(M * N) * 4);
    dbg->download(dbg, b, out[1], (size_t)(M * N) * 4);
    check(!memcmp(a, b, (size_t)(M * N) * 4) && dbg->sumsq(dbg, out[1], M * N) > 0,
          "TZ_CUDA_SYNC_DEBUG=1: bf16 matmul, rmsnorm, download, sumsq as without it");
    free(a), free(b);
    for (int i = 0; i < 2; i++) bes[i]->release(bes[i], out[i]), bes[i]->release(bes[i], rstd[i]);
    tz_backend_destroy(dbg);
    drop(&A), drop(&B), drop(&w);

    char err[4096];
    const char *fault_dbg[] = {"TZ_CUDA_SYNC_DEBUG=1", "TZ_CUDA_EMU_FAULT=k_rotate", NULL};
    int rc = in_child("fault", fault_dbg, err, sizeof err);
    check(rc != 0 && strstr(err, "TZ_CUDA_SYNC_DEBUG: op tq_rotate failed") &&
              strstr(err, "cudaErrorIllegalAddress"),
          "TZ_CUDA_SYNC_DEBUG=1, a kernel fault: the op is named (exit %d): %.*s", rc,
          (int)strcspn(err, "\n"), err);
    const char *fault[] = {"TZ_CUDA_EMU_FAULT=k_rotate", NULL};
    rc = in_child("fault", fault, err, sizeof err);
    check(rc != 0 && !strstr(err, "tq_rotate") && strstr(err, "cudaStreamSynchronize") &&
              strstr(err, "cudaErrorIllegalAddress"),
          "without it: the fault surfaces at the next synchronising call (exit %d)", rc);
    /* which path a narrow product takes: a fault planted in the narrow kernel shows by
     * default and not with TZ_NARROW_GEMM=0 (the GEMM library's) */
    const char *nw[] = {"TZ_CUDA_EMU_FAULT=k_narrow_part", NULL};
    rc = in_child("narrow", nw, err, sizeof err);
    check(rc != 0 && strstr(err, "cudaErrorIllegalAddress"),
          "a narrow product (300 x 16, LoRA's x A^T) runs the narrow kernel (exit %d)", rc);
    const char *nw0[] = {"TZ_CUDA_EMU_FAULT=k_narrow_part", "TZ_NARROW_GEMM=0", NULL};
    rc = in_child("narrow", nw0, err, sizeof err);
    check(rc == 0 && strstr(err, "no failure reported"),
          "with TZ_NARROW_GEMM=0 it does not (exit %d): %.*s", rc, (int)strcspn(err, "\n"), err);
    const char *nq[] = {"TZ_CUDA_EMU_FAULT=k_narrow_tq", NULL};
    rc = in_child("narrow_tq", nq, err, sizeof err);
    check(rc != 0 && strstr(err, "cudaErrorIllegalAddress"),
          "a quantized weight's product on one row (a decode step's) runs the fused kernel "
          "(exit %d)", rc);
    const char *nq0[] = {"TZ_CUDA_EMU_FAULT=k_narrow_tq", "TZ_TQ_FUSED=0", NULL};
    rc = in_child("narrow_tq", nq0, err, sizeof err);
    check(rc == 0 && strstr(err, "no failure reported"),
          "with TZ_TQ_FUSED=0 it does not (exit %d): %.*s", rc, (int)strcspn(err, "\n"), err);
    const char *nqx[] = {"TZ_TQ_FUSED=yes", NULL};
    rc = in_child("narrow_tq", nqx, err, sizeof err);
    check(rc != 0 && strstr(err, "TZ_TQ_FUSED=yes: expected 1"),
          "TZ_TQ_FUSED=yes is refused, naming the variable (exit %d): %.*s", rc,
          (int)strcspn(err, "\n"), err);
    const char *old[] = {"TZ_CUDA_EMU_DRIVER=old", NULL};
    rc = in_child("old_driver", old, err, sizeof err);
    check(rc != 0 && strstr(err, "device count 0") &&
              strstr(err, "no usable CUDA device (cudaGetDeviceCount: cudaErrorInsufficientDriver"
                          ": CUDA driver version is insufficient") &&
              strstr(err, "no CUDA device is visible") &&
              strstr(err, "HINT: update the NVIDIA driver"),
          "an old driver: named as such, not as \"no device\" (exit %d)", rc);
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--child")) { /* in_child's children */
        static const struct { const char *name; void (*fn)(void); } children[] = {
            {"op_times", child_op_times}, {"fault", child_fault}, {"old_driver", child_old_driver},
            {"narrow", child_narrow}, {"narrow_tq", child_narrow_tq}};
        for (size_t i = 0; i < sizeof children / sizeof *children; i++)
            if (!strcmp(argv[2], children[i].name)) return children[i].fn(), 0;
        fprintf(stderr, "no child named %s\n", argv[2]);
        return 2;
    }
    int n = tz_cuda_device_count();
    if (n <= 0) {
        printf("skip: %s\n", n < 0 ? "this build has no CUDA backend" : "no CUDA device");
        return 77;
    }
    g_rng = tz_rng_make(2024, 0, TZ_RNG_TEST, 0);
    g_cpu = tz_backend_create(TZ_DEVICE_CPU, 0, 2);
    g_gpu = tz_backend_create(TZ_DEVICE_CUDA, 0, 0);
    test_memory();
    test_elementwise();
    test_matmul();
    test_matmul_bf16();
    test_matmul_narrow();
    test_w16();
    test_layout();
    test_norm();
    test_activation();
    test_loss();
    test_conditioning();
    test_attention(2, 45, 4, 2, 40, 1);
    test_attention(1, 70, 3, 3, 128, 0);
    test_attention(1, 33, 2, 1, 72, 1);
    test_attention(3, 80, 2, 2, 16, 1);
    test_attention(1, 1, 1, 1, 8, 1);
    /* tensor cores: chunks that do not divide T, T below the chunk, T = 1, odd D (40, 72),
     * D = 128, grouped heads of 1, 2 and 4 members, causal and not, B > 1; both batchings
     * (over kv groups where B * rep <= Hq, else over sequences) */
    /* flash (D <= 128): every padded width (32, 64, 80, 128), tiles cut by T, GQA */
    test_attention_tc(2, 45, 4, 2, 40, 1, 0);   /* one tile, rep 2 */
    test_attention_tc(1, 70, 3, 3, 128, 0, 0);  /* 64 + 6, not causal */
    test_attention_tc(1, 33, 4, 1, 72, 1, 0);   /* D 72 padded to 80; rep 4 */
    test_attention_tc(3, 80, 2, 2, 16, 1, 0);   /* D 16 padded to 32 */
    test_attention_tc(2, 150, 4, 2, 64, 1, 0);  /* three query and key tiles, causal */
    test_attention_tc(1, 130, 2, 1, 72, 0, 0);  /* three tiles, not causal, rep 2 */
    test_attention_tc(1, 1, 1, 1, 8, 1, 0);     /* T = 1 */
    test_attention_tc(1, 97, 2, 2, 37, 1, 0);   /* odd D: pairs cut at D */
    g_att_sink = 1; /* maxima set by the first tile: later tiles skip their rescale */
    test_attention_tc(1, 200, 2, 1, 128, 1, 0); /* four tiles, causal, rep 2 */
    test_attention_tc(1, 140, 2, 2, 64, 0, 0);  /* three tiles, not causal */
    g_att_sink = 0;
    /* ldmatrix against plain reads: every padded width (32, 64, 80, 128), GQA, tiles cut by T */
    test_attention_ldmatrix(1, 45, 2, 1, 40, 1);
    test_attention_ldmatrix(1, 70, 1, 1, 128, 0);
    test_attention_ldmatrix(1, 33, 2, 1, 72, 1);
    test_attention_ldmatrix(2, 40, 1, 1, 16, 1);
    test_attention_ldmatrix(1, 33, 1, 1, 37, 0);
    /* q, k, v in bf16: vectorised staging (D 40, 72) and not (37), fused rows and dense, GQA;
     * the bf16 ones with D a multiple of 8 through cp.async (fa_pipe), the fp32 ones not */
    test_attention_in16(g_cpu, "cpu", 2, 21, 4, 2, 40, 1, 1); /* the CPU widens them */
    test_attention_in16(g_gpu, "gpu", 2, 21, 4, 2, 40, 1, 1);
    test_attention_in16(g_gpu, "gpu", 1, 33, 2, 1, 37, 0, 1);
    test_attention_in16(g_gpu, "gpu", 1, 70, 1, 1, 128, 1, 0); /* two key tiles */
    test_attention_in16(g_gpu, "gpu", 1, 20, 2, 1, 72, 1, 0);
    /* (D a multiple of 8: the tiles copied ahead by cp.async, two buffers; 3 key tiles, 5
     * query tiles of dk/dv's for each of the group's 2 heads) */
    test_attention_in16(g_gpu, "gpu", 1, 150, 2, 1, 64, 1, 0);
    test_attention_in16(g_gpu, "gpu", 1, 45, 2, 1, 36, 1, 0); /* D 36: staged, not cp.async */
    /* (two forward blocks of 128 query rows, not causal: the second's warps 1-3 past T) */
    test_attention_in16(g_gpu, "gpu", 1, 130, 1, 1, 32, 0, 1);
    /* dS kept in memory lent (tiles ahead, D a multiple of 8): T past a tile by 8 (dk/dv
     * never visits the last block's second half of queries), by 2, and whole; GQA; groups */
    test_attention_ds(1, 136, 4, 4, 64, 1, 0, 0, 4.0, 0);   /* all 4 pairs: one group */
    test_attention_ds(1, 130, 6, 2, 128, 1, 0, 0, 2.5, 0);  /* rep 3, one group */
    test_attention_ds(3, 96, 8, 8, 32, 0, 0, 0, 17.0, 0);   /* 24 pairs, 17 fit: 2 of 12 */
    test_attention_ds(1, 77, 20, 20, 80, 1, 0, 0, 16.0, 0); /* 20 pairs, 16 fit: 2 of 10 */
    test_attention_ds(2, 64, 4, 1, 128, 1, 1, 0, 2.0, 0);   /* added into (accumulate) */
    test_attention_ds(1, 100, 2, 2, 64, 1, 0, TZ_ATT_DQ16 | TZ_ATT_DK16 | TZ_ATT_DV16, 2.0, 0);
    test_attention_ds(1, 100, 2, 2, 64, 0, 0, TZ_ATT_DV16, 2.0, 0); /* dv alone, the Llama's */
    test_attention_ds(1, 128, 4, 4, 64, 1, 0, 0, 3.9, 0); /* too little: recomputed */
    test_attention_ds(1, 128, 4, 4, 64, 1, 0, 0, 4.0, 1); /* TZ_FA_DS=0: recomputed */
    /* chunks of query rows through cuBLAS (D > 128) */
    test_attention_tc(2, 45, 4, 2, 136, 1, 16); /* chunks 16, 16, 13; rep 2, by group */
    test_attention_tc(1, 70, 3, 3, 144, 0, 64); /* 64 + 6, not causal */
    test_attention_tc(1, 33, 4, 1, 160, 1, 64); /* T < chunk: one chunk of 33; rep 4 */
    test_attention_tc(3, 80, 2, 2, 136, 1, 7);  /* chunks of 7; by sequence (B > Hq) */
    test_attention_tc(5, 37, 4, 2, 136, 0, 16); /* by sequence with rep 2 */
    test_attention_tc(1, 1, 1, 1, 200, 1, 1);   /* T = 1 */
    test_attention_tc(2, 50, 8, 2, 256, 1, 0);  /* the planned workspace (one chunk of 50) */
    test_attention_cache(2, 1, 80, 70, 4, 2, 40, 0);  /* one decode step, 71 keys */
    test_attention_cache(1, 13, 50, 20, 3, 1, 128, 0); /* a prefill chunk at an offset */
    test_attention_cache(1, 33, 33, 0, 2, 2, 72, 0);   /* pos0 0, S = T: attention_fwd's case */
    /* few rows, many keys: each row's keys in splits of 256, joined in order (4 splits; 3 of a
     * prefill chunk, D 128; 2, the first rows' second split empty) */
    test_attention_cache(1, 1, 1100, 1000, 4, 2, 40, 0);
    test_attention_cache(1, 3, 700, 600, 2, 1, 128, 0);
    test_attention_cache(1, 20, 300, 250, 2, 1, 64, 0);
    /* a bf16 cache: 8 splits of a decode step at D = 128 (vector loads of 4 elements a lane),
     * a prefill chunk at D = 64 (2 a lane), D = 80 and 72 (3 a lane, element by element; the
     * last lanes past D), D = 40 with grouped heads */
    test_attention_cache(1, 1, 2100, 2047, 4, 4, 128, 1);
    test_attention_cache(1, 9, 400, 350, 4, 2, 64, 1);
    test_attention_cache(2, 1, 90, 77, 2, 1, 80, 1);
    test_attention_cache(1, 5, 60, 40, 3, 3, 72, 1);
    test_attention_cache(2, 1, 1100, 1000, 4, 2, 40, 1);
    /* element by element at 4 a lane (D 98), and 1 a lane (D 24) */
    test_attention_cache(1, 2, 70, 60, 2, 1, 98, 0);
    test_attention_cache(1, 1, 40, 30, 2, 2, 24, 1);
    /* several query heads of a group in one warp (R of them, 32 / R keys a step rounded down
     * to a power of two): R = 8 with 8 splits and a last step of 2 of its 4 keys; R = 4 on a
     * prefill chunk; a group of 12 in two warps of R = 6 (24 of the tree's 32 values a
     * query's), with splits; R = 6 at D 40; R = 7 (28 values) with splits, R = 5 (20) on a
     * prefill chunk, R = 3 (24, 8 keys a step) in bf16; and R = 3 of a group of 3 at D 128
     * above */
    test_attention_cache(1, 1, 2100, 2045, 16, 2, 128, 1);
    test_attention_cache(1, 5, 90, 61, 8, 2, 64, 0);
    test_attention_cache(2, 1, 300, 290, 12, 1, 128, 1);
    test_attention_cache(1, 2, 50, 33, 6, 1, 40, 0);
    test_attention_cache(1, 1, 1500, 1400, 7, 1, 128, 1);
    test_attention_cache(1, 3, 80, 50, 10, 2, 128, 0);
    test_attention_cache(2, 1, 200, 150, 6, 2, 64, 1);
    test_quant();
    test_tq_fused();
    test_matmul_operands();
    test_op_times();
    test_checked_mode();
    tz_backend_destroy(g_gpu);
    tz_backend_destroy(g_cpu);
    return tz_check_done("test_cuda_ops");
}
