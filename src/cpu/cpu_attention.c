/* CPU scaled dot-product attention with grouped-query heads (causal or not): forward saving
 * log-sum-exp, and a backward that recomputes the probabilities. No dropout, bias or masks
 * other than causal. Blocks of 64 query (or key) rows go through the one-thread GEMM. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "cpu/cpu_internal.h"

#define BQ 64 /* query rows per work item (forward and dq) */
#define BK 64 /* key rows per work item (dk, dv) */

typedef struct {
    /* ldq: rows of q and dq; ldk: of k, v, dk and dv; ldo: of out and dout (tz_att_ld) */
    int64_t B, T, Hq, Hkv, D, rep, ldq, ldk, ldo;
    int causal;
    float scale;
} att_shape;

static att_shape make_shape(int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D,
                            int causal, const tz_att_ld *ldp) {
    if (Hkv <= 0 || Hq % Hkv != 0)
        TZ_FATAL("attention: Hq=%lld is not a multiple of Hkv=%lld", (long long)Hq,
                 (long long)Hkv);
    const tz_att_ld ld = tz_att_ld_of(ldp, Hq, Hkv, D);
    att_shape s = {B, T, Hq, Hkv, D, Hq / Hkv, ld.q, ld.kv, ld.o, causal,
                   1.0f / sqrtf((float)D)};
    return s;
}

/* Element offset of head h of row (b, t) in a tensor of T rows per sequence at stride ld. */
static inline int64_t at(int64_t b, int64_t t, int64_t h, int64_t T, int64_t ld, int64_t D) {
    return (b * T + t) * ld + h * D;
}

/* C[M,N] (ld ldc) = alpha * A[M,K] (ld lda) * op(B) + beta * C, on this thread. */
static void gemm(float *C, int64_t ldc, const float *A, int64_t lda, const float *B,
                 int64_t ldb, int transB, int64_t M, int64_t N, int64_t K, float alpha,
                 float beta, float *ws) {
    tz_cpu_gemm_args g = {C, ldc, A, lda, 0, B, ldb, transB, M, N, K, alpha, beta};
    TZ_CPU_K(tz_cpu_gemm_serial)(&g, ws);
}

/* Team size: one thread for small problems, where a team costs more than it saves. */
static int team(tz_backend *be, const att_shape *s) {
    double work = (double)s->B * (double)s->Hq * (double)s->T * (double)s->T * (double)s->D;
    return work < 65536.0 ? 1 : tz_cpu_threads(be);
}

/* Queries at positions pos0 .. pos0+T-1 against S key/value rows per sequence (S = T, pos0 = 0
 * for training; a cache otherwise). Work item (b, h, query block): P = scale Q K^T over the
 * keys the block can see, softmax row by row (masked entries 0), out = P V. lse (NULL: not
 * kept) gets each row's log-sum-exp. Every output row and lse entry has one writer. */
static void attend(tz_backend *be, float *out, float *lse, const float *q, const float *k,
                   const float *v, int64_t B, int64_t T, int64_t S, int64_t pos0, int64_t Hq,
                   int64_t Hkv, int64_t D, int causal, const tz_att_ld *ld) {
    att_shape sh = make_shape(B, T, Hq, Hkv, D, causal, ld);
    if (B <= 0 || T <= 0 || D <= 0) return;
    const int64_t keys = pos0 + T; /* keys any query may see */
    int64_t nqb = (T + BQ - 1) / BQ, items = B * Hq * nqb;
    double work = (double)B * (double)Hq * (double)T * (double)keys * (double)D;
    int nt = work < 65536.0 ? 1 : tz_cpu_threads(be);
    tz_cpu_ws_reserve(be, nt);
#pragma omp parallel num_threads(nt)
    {
        float *ws = tz_cpu_ws_get(be, omp_get_thread_num(), TZ_CPU_K(tz_cpu_gemm_ws_floats)());
        float *P = tz_cpu_aligned_alloc((size_t)(BQ * keys) * sizeof(float));
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < items; it++) {
            int64_t b = it / (Hq * nqb), h = (it / nqb) % Hq, t0 = (it % nqb) * BQ;
            int64_t nq = T - t0 < BQ ? T - t0 : BQ, nk = causal ? pos0 + t0 + nq : keys;
            const float *kg = k + at(b, 0, h / sh.rep, S, sh.ldk, D);
            const float *vg = v + at(b, 0, h / sh.rep, S, sh.ldk, D);
            gemm(P, nk, q + at(b, t0, h, T, sh.ldq, D), sh.ldq, kg, sh.ldk, 1, nq, nk, D,
                 sh.scale, 0.0f, ws);
            for (int64_t i = 0; i < nq; i++) {
                float *sr = P + i * nk;
                int64_t n = causal ? pos0 + t0 + i + 1 : keys;
                float m = tz_cpu_maxf(sr, n), sum = 0.0f;
#pragma omp simd reduction(+ : sum)
                for (int64_t s = 0; s < n; s++) {
                    sr[s] = tz_cpu_expf(sr[s] - m);
                    sum += sr[s];
                }
                float inv = 1.0f / sum;
#pragma omp simd
                for (int64_t s = 0; s < n; s++) sr[s] *= inv;
                for (int64_t s = n; s < nk; s++) sr[s] = 0.0f;
                if (lse) lse[(b * Hq + h) * T + t0 + i] = m + logf(sum);
            }
            gemm(out + at(b, t0, h, T, sh.ldo, D), sh.ldo, P, nk, vg, sh.ldk, 0, nq, D, nk, 1.0f,
                 0.0f, ws);
        }
        free(P);
    }
}

/* q, k, v given in bf16 (tz_att_ld.in16): widened to fp32 in the same row layout (each from
 * its first element to its last row's last head), the exact values the bf16 stand for; the
 * op then runs on those with in16 cleared. */
typedef struct {
    float *q, *k, *v;
    tz_att_ld ld;
} wide_qkv;
static float *widen(const float *p, int64_t rows, int64_t ld, int64_t w) {
    const int64_t n = rows > 0 ? (rows - 1) * ld + w : 0;
    float *r = malloc((size_t)(n > 0 ? n : 1) * sizeof *r);
    if (!r) TZ_FATAL("attention: out of host memory widening bf16 operands");
    const uint16_t *s = (const uint16_t *)(const void *)p;
    for (int64_t i = 0; i < n; i++) r[i] = tz_bf16_to_f32(s[i]);
    return r;
}
static wide_qkv wide_of(const float *q, const float *k, const float *v, int64_t BT, int64_t Hq,
                        int64_t Hkv, int64_t D, const tz_att_ld *ldp) {
    wide_qkv w = {NULL, NULL, NULL, tz_att_ld_of(ldp, Hq, Hkv, D)};
    if (!w.ld.in16) return w;
    w.q = widen(q, BT, w.ld.q, Hq * D);
    w.k = widen(k, BT, w.ld.kv, Hkv * D);
    w.v = widen(v, BT, w.ld.kv, Hkv * D);
    w.ld.in16 = 0;
    return w;
}

static void cpu_attention_fwd(tz_backend *be, float *out, float *lse, const float *q,
                              const float *k, const float *v, int64_t B, int64_t T, int64_t Hq,
                              int64_t Hkv, int64_t D, int causal, const tz_att_ld *ld) {
    wide_qkv w = wide_of(q, k, v, B * T, Hq, Hkv, D, ld);
    if (w.q) {
        attend(be, out, lse, w.q, w.k, w.v, B, T, T, 0, Hq, Hkv, D, causal, &w.ld);
        free(w.q), free(w.k), free(w.v);
        return;
    }
    attend(be, out, lse, q, k, v, B, T, T, 0, Hq, Hkv, D, causal, ld);
}

static void cpu_attention_cache_fwd(tz_backend *be, float *out, const float *q, const void *kc,
                                    const void *vc, int64_t B, int64_t T, int64_t S,
                                    int64_t pos0, int64_t Hq, int64_t Hkv, int64_t D, int kv16) {
    if (B <= 0 || T <= 0 || D <= 0) return;
    if (pos0 < 0 || pos0 + T > S)
        TZ_FATAL("attention_cache: positions %lld..%lld do not fit a cache of %lld",
                 (long long)pos0, (long long)(pos0 + T - 1), (long long)S);
    if (!kv16) {
        attend(be, out, NULL, q, kc, vc, B, T, S, pos0, Hq, Hkv, D, 1, NULL);
        return;
    }
    /* a bf16 cache: its positions in use widened, a cache of pos0 + T positions in fp32 */
    const int64_t n = pos0 + T, row = Hkv * D;
    float *k = tz_xmalloc((size_t)(B * n * row) * sizeof *k);
    float *v = tz_xmalloc((size_t)(B * n * row) * sizeof *v);
    for (int64_t b = 0; b < B; b++) {
        const uint16_t *ks = (const uint16_t *)kc + b * S * row;
        const uint16_t *vs = (const uint16_t *)vc + b * S * row;
        for (int64_t i = 0; i < n * row; i++) {
            k[b * n * row + i] = tz_bf16_to_f32(ks[i]);
            v[b * n * row + i] = tz_bf16_to_f32(vs[i]);
        }
    }
    attend(be, out, NULL, q, k, v, B, T, n, pos0, Hq, Hkv, D, 1, NULL);
    free(k), free(v);
}

/* With P = exp(S - lse), dP = dO V^T, delta_t = dO_t . O_t (= sum_s P_ts dP_ts) and
 * dS = P * (dP - delta):  dV = P^T dO,  dQ = scale dS K,  dK = scale dS^T Q.
 * Two passes so every gradient row has one owner: dq over (b, q-head, query block); dk and
 * dv over (b, kv-head, key block), adding its query heads in order. Both passes compute
 * S(t, s) with the same fused multiply-adds in the same order, so they agree on P. */

/* dq for query block t0.. of head h. S and dS are BQ x T scratch. */
static void dq_block(const att_shape *sh, float *dq, const float *dout, const float *lse,
                     const float *delta, const float *q, const float *k, const float *v,
                     int64_t b, int64_t h, int64_t t0, float *S, float *dS, float *ws) {
    int64_t T = sh->T, D = sh->D, Hq = sh->Hq;
    int64_t nq = T - t0 < BQ ? T - t0 : BQ, nk = sh->causal ? t0 + nq : T;
    const float *kg = k + at(b, 0, h / sh->rep, T, sh->ldk, D);
    const float *vg = v + at(b, 0, h / sh->rep, T, sh->ldk, D);
    const int64_t qo = at(b, t0, h, T, sh->ldq, D);
    gemm(S, nk, q + qo, sh->ldq, kg, sh->ldk, 1, nq, nk, D, sh->scale, 0.0f, ws);
    gemm(dS, nk, dout + at(b, t0, h, T, sh->ldo, D), sh->ldo, vg, sh->ldk, 1, nq, nk, D, 1.0f,
         0.0f, ws);
    for (int64_t i = 0; i < nq; i++) {
        float *sr = S + i * nk, *dr = dS + i * nk;
        int64_t n = sh->causal ? t0 + i + 1 : T;
        float l = lse[(b * Hq + h) * T + t0 + i], dl = delta[(b * Hq + h) * T + t0 + i];
#pragma omp simd
        for (int64_t s = 0; s < n; s++) dr[s] = tz_cpu_expf(sr[s] - l) * (dr[s] - dl);
        for (int64_t s = n; s < nk; s++) dr[s] = 0.0f;
    }
    gemm(dq + qo, sh->ldq, dS, nk, kg, sh->ldk, 0, nq, D, nk, sh->scale, 1.0f, ws);
}

/* dk, dv for key block s0.. of kv head g. St, dSt are BK x T scratch; ak, av BK x D. */
static void dkv_block(const att_shape *sh, float *dk, float *dv, const float *dout,
                      const float *lse, const float *delta, const float *q, const float *k,
                      const float *v, int64_t b, int64_t g, int64_t s0, float *St, float *dSt,
                      float *ak, float *av, float *ws) {
    int64_t T = sh->T, D = sh->D, Hq = sh->Hq;
    int64_t nkb = T - s0 < BK ? T - s0 : BK;
    int64_t tq0 = sh->causal ? s0 : 0, nqr = T - tq0; /* queries that see these keys */
    const int64_t ko = at(b, s0, g, T, sh->ldk, D);
    for (int64_t r = 0; r < sh->rep; r++) {
        int64_t h = g * sh->rep + r;
        const float *qr = q + at(b, tq0, h, T, sh->ldq, D);
        const float *gr = dout + at(b, tq0, h, T, sh->ldo, D);
        const float *lr = lse + (b * Hq + h) * T + tq0, *dl = delta + (b * Hq + h) * T + tq0;
        gemm(St, nqr, k + ko, sh->ldk, qr, sh->ldq, 1, nkb, nqr, D, sh->scale, 0.0f, ws);
        gemm(dSt, nqr, v + ko, sh->ldk, gr, sh->ldo, 1, nkb, nqr, D, 1.0f, 0.0f, ws);
        for (int64_t j = 0; j < nkb; j++) {
            float *sr = St + j * nqr, *dr = dSt + j * nqr;
            int64_t first = sh->causal ? j : 0; /* query t = tq0 + i sees key s0 + j iff i >= j */
            for (int64_t i = 0; i < first; i++) sr[i] = dr[i] = 0.0f;
#pragma omp simd
            for (int64_t i = first; i < nqr; i++) {
                float p = tz_cpu_expf(sr[i] - lr[i]);
                dr[i] = p * (dr[i] - dl[i]);
                sr[i] = p;
            }
        }
        float beta = r == 0 ? 0.0f : 1.0f;
        gemm(av, D, St, nqr, gr, sh->ldo, 0, nkb, D, nqr, 1.0f, beta, ws);
        gemm(ak, D, dSt, nqr, qr, sh->ldq, 0, nkb, D, nqr, sh->scale, beta, ws);
    }
    for (int64_t j = 0; j < nkb; j++) {
        float *dkr = dk + ko + j * sh->ldk, *dvr = dv + ko + j * sh->ldk;
#pragma omp simd
        for (int64_t i = 0; i < D; i++) {
            dkr[i] += ak[j * D + i];
            dvr[i] += av[j * D + i];
        }
    }
}

/* The first w elements of each of n rows at stride ld set to 0 (the rest of a row untouched). */
static void zero_rows(tz_backend *be, float *p, int64_t n, int64_t ld, int64_t w) {
    if (ld == w) {
        be->fill(be, p, 0.0f, n * w);
        return;
    }
#pragma omp parallel for num_threads(tz_cpu_threads(be)) schedule(static) if (n * w >= 65536)
    for (int64_t r = 0; r < n; r++) memset(p + r * ld, 0, (size_t)w * sizeof(float));
}

static void cpu_attention_bwd(tz_backend *be, float *dq, float *dk, float *dv, const float *dout,
                              const float *out, const float *lse, const float *q, const float *k,
                              const float *v, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                              int64_t D, int causal, int accumulate, const tz_att_ld *ld) {
    if (ld && ld->d16) { /* each bf16 gradient into fp32 rows at its stride, then rounded */
        if (accumulate)
            TZ_FATAL("attention_bwd: gradients in bf16 (tz_att_ld.d16) are written, never "
                     "added to");
        tz_att_ld l32 = tz_att_ld_of(ld, Hq, Hkv, D);
        const int d16 = l32.d16;
        l32.d16 = 0;
        const int64_t BT = B * T;
        float *g[3] = {dq, dk, dv}, *t[3] = {NULL, NULL, NULL};
        const int64_t lds[3] = {l32.q, l32.kv, l32.kv}, ws[3] = {Hq * D, Hkv * D, Hkv * D};
        for (int i = 0; i < 3; i++)
            if (d16 & (1 << i)) {
                const int64_t n = BT > 0 ? (BT - 1) * lds[i] + ws[i] : 0;
                t[i] = tz_xmalloc((size_t)(n > 0 ? n : 1) * sizeof(float));
            }
        cpu_attention_bwd(be, t[0] ? t[0] : dq, t[1] ? t[1] : dk, t[2] ? t[2] : dv, dout, out,
                          lse, q, k, v, B, T, Hq, Hkv, D, causal, 0, &l32);
        for (int i = 0; i < 3; i++) {
            if (!t[i]) continue;
            uint16_t *o16 = (uint16_t *)(void *)g[i];
            for (int64_t r = 0; r < BT && ws[i] > 0; r++)
                be->to_bf16(be, o16 + r * lds[i], t[i] + r * lds[i], ws[i]);
            free(t[i]);
        }
        return;
    }
    wide_qkv w = wide_of(q, k, v, B * T, Hq, Hkv, D, ld);
    if (w.q) {
        cpu_attention_bwd(be, dq, dk, dv, dout, out, lse, w.q, w.k, w.v, B, T, Hq, Hkv, D, causal,
                          accumulate, &w.ld);
        free(w.q), free(w.k), free(w.v);
        return;
    }
    att_shape sh = make_shape(B, T, Hq, Hkv, D, causal, ld);
    if (B <= 0 || T <= 0 || D <= 0) return;
    if (!accumulate) { /* written: the blocks below add into zeros (the same bits) */
        zero_rows(be, dq, B * T, sh.ldq, Hq * D);
        zero_rows(be, dk, B * T, sh.ldk, Hkv * D);
        zero_rows(be, dv, B * T, sh.ldk, Hkv * D);
    }
    int64_t rows = B * Hq * T, nqb = (T + BQ - 1) / BQ, nkb = (T + BK - 1) / BK;
    int nt = team(be, &sh);
    tz_cpu_ws_reserve(be, nt);
    float *delta = tz_cpu_aligned_alloc((size_t)rows * sizeof(float)); /* [B, Hq, T] */
    int64_t rowsz = (BQ > BK ? BQ : BK) * T;
#pragma omp parallel num_threads(nt)
    {
        float *ws = tz_cpu_ws_get(be, omp_get_thread_num(), TZ_CPU_K(tz_cpu_gemm_ws_floats)());
        float *S = tz_cpu_aligned_alloc((size_t)(2 * rowsz + 2 * BK * D) * sizeof(float));
        float *dS = S + rowsz, *ak = dS + rowsz, *av = ak + BK * D;
#pragma omp for schedule(static)
        for (int64_t idx = 0; idx < rows; idx++) {
            int64_t b = idx / (Hq * T), h = (idx / T) % Hq, t = idx % T;
            const float *o = out + at(b, t, h, T, sh.ldo, D);
            const float *d = dout + at(b, t, h, T, sh.ldo, D);
            float s = 0.0f;
#pragma omp simd reduction(+ : s)
            for (int64_t i = 0; i < D; i++) s += o[i] * d[i];
            delta[idx] = s;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < B * Hq * nqb; it++)
            dq_block(&sh, dq, dout, lse, delta, q, k, v, it / (Hq * nqb), (it / nqb) % Hq,
                     (it % nqb) * BQ, S, dS, ws);
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < B * Hkv * nkb; it++)
            dkv_block(&sh, dk, dv, dout, lse, delta, q, k, v, it / (Hkv * nkb),
                      (it / nkb) % Hkv, (it % nkb) * BK, S, dS, ak, av, ws);
        free(S);
    }
    free(delta);
}

void TZ_CPU_K(tz_cpu_install_attention)(tz_backend *be) {
    be->attention_fwd = cpu_attention_fwd;
    be->attention_bwd = cpu_attention_bwd;
    be->attention_cache_fwd = cpu_attention_cache_fwd;
}
