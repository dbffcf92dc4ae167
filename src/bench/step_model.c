/* The step model: counting stubs for every compute op of the backend table (floating-point
 * operations and bytes of the operands as stored, 4 per fp32 element), and the estimate of a
 * step's time from peak rates. The formulas count what an op must read and write once, and
 * with bf16 GEMM operands the cast that rounds each fp32 operand of a GEMM first (booked as
 * elementwise: read, written in bf16; the GEMM then reads the bf16); other work an
 * implementation adds (re-reads, a GEMM library's partial sums) is not in them, but the
 * narrow GEMM's split sums are (narrow_op: its own kernel, whose passes are known). */
#include "bench/step_model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

const char *const tz_step_model_names[TZ_SM_N] = {
    "GEMM", "attention", "quant (rotate, decode)", "norms", "elementwise", "loss",
    "device copies", "host <-> device"};

tz_step_model *tz_step_model_of(tz_backend *be) { return (tz_step_model *)be->ctx; }

#define add(be, c, flops, bytes) add_op(be, c, flops, bytes, __func__)
static void add_op(tz_backend *be, int c, double flops, double bytes, const char *fn) {
    tz_step_model *m = tz_step_model_of(be);
    const tz_step_rates *r = &m->rates;
    const double rate = c == TZ_SM_GEMM ? r->gemm_flops : c == TZ_SM_ATTENTION ? r->attention_flops
                                                                               : r->other_flops;
    const double bw = c == TZ_SM_TRANSFER ? r->link_bytes : r->mem_bytes;
    m->flops[c] += flops;
    m->bytes[c] += bytes;
    const double t = fmax(flops / rate, bytes / bw);
    m->sec[c] += t;
    m->calls[c]++;
    const char *name = !strncmp(fn, "s_", 2) ? fn + 2 : fn; /* the counter's, less s_ */
    int i = 0;
    while (i < m->n_ops && (m->ops[i].cls != c || strcmp(m->ops[i].name, name))) i++;
    if (i == TZ_SM_OPS) return; /* more ops than rows: the classes still count them */
    if (i == m->n_ops) m->ops[m->n_ops++] = (tz_step_op){.name = name, .cls = c};
    tz_step_op *o = &m->ops[i];
    o->flops += flops, o->bytes += bytes, o->sec += t, o->calls++;
}

#define F 4.0 /* bytes of an fp32 element */
typedef const float cf;

/* ---- elementwise, casts, reductions ---- */
static void s_fill(tz_backend *be, float *x, float v, int64_t n) { (void)x, (void)v; add(be, TZ_SM_ELEMENT, 0, F * n); }
static void s_scale(tz_backend *be, float *x, float a, int64_t n) { (void)x, (void)a; add(be, TZ_SM_ELEMENT, n, 2 * F * n); }
static void s_axpy(tz_backend *be, float *y, float a, cf *x, int64_t n) { (void)y, (void)a, (void)x; add(be, TZ_SM_ELEMENT, 2.0 * n, 3 * F * n); }
static void s_to_bf16(tz_backend *be, uint16_t *d, cf *s, int64_t n) { (void)d, (void)s; add(be, TZ_SM_ELEMENT, 0, 6.0 * n); }
static void s_from_bf16(tz_backend *be, float *d, const uint16_t *s, int64_t n) { (void)d, (void)s; add(be, TZ_SM_ELEMENT, 0, 6.0 * n); }
static double s_sumsq(tz_backend *be, cf *x, int64_t n) { (void)x; add(be, TZ_SM_ELEMENT, 2.0 * n, F * n); return 0.0; }
static void s_adamw(tz_backend *be, float *w, float *m, float *v, cf *g, const uint8_t *d, int64_t n, const tz_adamw_args *a) { (void)w, (void)m, (void)v, (void)g, (void)d, (void)a; add(be, TZ_SM_ELEMENT, 12.0 * n, (7 * F + 1) * n); }

/* ---- matmul ---- */
/* A GEMM C[M, N] = A[M, K] B[K, N] (+ beta C), operands flagged bf16 where stored so. With
 * bf16 GEMMs each fp32 operand is first rounded by a cast kernel of its own (read 4 bytes,
 * write 2: elementwise, a bandwidth-bound kernel the GEMM's arithmetic does not hide), then
 * read in bf16; with fp32 GEMMs an fp32 operand is read as it is. C of cb bytes an element
 * (fp32, or 2 for a bf16 output), read too where beta != 0. */
static void gemm_op_c(tz_backend *be, int64_t M, int64_t N, int64_t K, int a16, int b16,
                      float beta, double a_reads, double cb, const char *op) {
    const int r = be->matmul_dtype == TZ_DT_BF16;
    if (r && !a16) add_op(be, TZ_SM_ELEMENT, 0, 6.0 * M * K, op);
    if (r && !b16) add_op(be, TZ_SM_ELEMENT, 0, 6.0 * K * N, op);
    const double ab = a16 || r ? 2.0 : F, bb = b16 || r ? 2.0 : F;
    add_op(be, TZ_SM_GEMM, 2.0 * M * N * K,
           a_reads * ab * (double)M * K + bb * (double)K * N +
               cb * (double)M * N * (beta != 0.0f ? 2 : 1),
           op);
}
/* C in fp32 */
#define gemm_op(be, M, N, K, a16, b16, beta, a_reads, op)                                       \
    gemm_op_c(be, M, N, K, a16, b16, beta, a_reads, F, op)
/* booked under the calling op's name; A read once */
#define gemm(be, M, N, K, a16, b16, beta) gemm_op(be, M, N, K, a16, b16, beta, 1.0, __func__)
/* A quantized weight's GEMM decoded in chunks (tz_tq_chunked): one GEMM a chunk, each reading
 * all of A (the forward's chunks W's rows, the backward's its columns). */
static double tq_a_reads(const tz_backend *be, int64_t rows, int64_t cols, int group, int transW) {
    if (!tz_tq_chunked(be)) return 1.0;
    if (transW) {
        const int64_t cr = tz_tq_chunk_rows(be, rows);
        return (double)((rows + cr - 1) / cr);
    }
    const int64_t cc = tz_tq_chunk_cols(be, cols, group);
    return (double)((cols + cc - 1) / cc);
}
/* A narrow kernel's split sums (R rounded up to 4 columns a row of P, each split's): written,
 * then read back by each row's last block. */
static double narrow_part_bytes(const tz_narrow *np) {
    return 2.0 * F * (double)np->nsplit * (double)np->P * (double)((np->R + 3) / 4 * 4);
}
/* A GEMM the narrow kernel takes (core/backend.h's tz_narrow_plan; cuda/cuda_narrow.cu), booked
 * under op and returning 1: an fp32 X rounded first (elementwise); the kernel reads X and S as
 * stored, once (S rounded on its way into shared memory; the blocks' re-reads of S come from
 * the L2, not the memory), multiplies (the FLOPs booked are the model's R columns, as the
 * step model's GEMM arithmetic is checked against it, not the kernel's rpad), writes each
 * split's sums (fp32 [P, R rounded up to 4]), which each row's last block reads back (with C
 * where beta != 0) to write C. 0: not narrow. */
static int narrow_op(tz_backend *be, int64_t M, int64_t N, int64_t K, int ta, int tb, int a16,
                     int b16, float beta, const char *op) {
    tz_narrow np;
    if (be->matmul_dtype != TZ_DT_BF16 || !tz_narrow_plan(be->narrow_gemm, M, N, K, ta, tb, &np))
        return 0;
    const int x16 = np.yt ? b16 : a16, s16 = np.yt ? a16 : b16;
    const double P = (double)np.P, R = (double)np.R;
    if (!x16) add_op(be, TZ_SM_ELEMENT, 0, 6.0 * P * K, op);
    const double part = narrow_part_bytes(&np);
    add_op(be, TZ_SM_GEMM, 2.0 * P * R * K,
           2.0 * P * K + (s16 ? 2.0 : F) * R * K + part + F * P * R * (beta != 0.0f ? 2 : 1),
           op);
    return 1;
}

static void s_matmul(tz_backend *be, float *C, cf *A, cf *B, int64_t M, int64_t N, int64_t K,
                     int ta, int tb, float alpha, float beta) {
    (void)C, (void)A, (void)B, (void)alpha;
    if (!narrow_op(be, M, N, K, ta, tb, 0, 0, beta, __func__)) gemm(be, M, N, K, 0, 0, beta);
}
static void s_matmul_bw16(tz_backend *be, float *C, cf *A, const uint16_t *B, int64_t M, int64_t N,
                          int64_t K, int ta, int tb, float alpha, float beta) {
    (void)C, (void)A, (void)B, (void)alpha;
    if (!narrow_op(be, M, N, K, ta, tb, 0, 1, beta, __func__)) gemm(be, M, N, K, 0, 1, beta);
}
static void s_matmul16(tz_backend *be, float *C, const void *A, int a16, const void *B, int b16,
                       int64_t M, int64_t N, int64_t K, int ta, int tb, float alpha, float beta) {
    (void)C, (void)A, (void)B, (void)alpha;
    if (!narrow_op(be, M, N, K, ta, tb, a16, b16, beta, __func__))
        gemm(be, M, N, K, a16, b16, beta);
}

static void s_matmul_bias(tz_backend *be, float *C, const void *A, int a16, const void *W, int w16,
                          cf *bias, int64_t M, int64_t N, int64_t K, int c16) {
    (void)C, (void)A, (void)W, (void)bias;
    if (be->matmul_dtype == TZ_DT_BF16) { /* the bias along K: 8 more columns, no pass */
        gemm_op_c(be, M, N, K + 8, a16, w16, 0.0f, 1.0, c16 ? 2.0 : F, __func__);
        /* an operand already in bf16 is still copied into its rows of K + 8 (a cast's pass,
         * which gemm books for an fp32 one) */
        if (a16) add(be, TZ_SM_ELEMENT, 0, 2.0 * (double)M * K + 2.0 * (double)M * (K + 8));
        if (w16) add(be, TZ_SM_ELEMENT, 0, 2.0 * (double)N * K + 2.0 * (double)N * (K + 8));
        add(be, TZ_SM_ELEMENT, 0, F * (double)N);
        return;
    }
    gemm(be, M, N, K, a16, w16, 0.0f);
    add(be, TZ_SM_ELEMENT, (double)M * N, 2 * F * (double)M * N + F * (double)N);
}

static void s_matmul_lora(tz_backend *be, float *C, const void *A, int a16, const void *W, int w16,
                          cf *h, cf *B, int64_t r, float s, cf *bias, int64_t M, int64_t N,
                          int64_t K) {
    (void)C, (void)A, (void)W, (void)h, (void)B, (void)s;
    const int64_t e = r + (bias != NULL);
    if (r <= 0 && bias) { /* matmul_bias's */
        s_matmul_bias(be, C, A, a16, W, w16, bias, M, N, K, 0);
        return;
    }
    if (r <= 0 || be->matmul_dtype != TZ_DT_BF16) { /* the products, then the bias's pass */
        if (!narrow_op(be, M, N, K, 0, 1, a16, w16, 0.0f, __func__))
            gemm(be, M, N, K, a16, w16, 0.0f);
        if (r > 0) gemm(be, M, N, r, 0, 0, 1.0f);
        if (bias) add(be, TZ_SM_ELEMENT, (double)M * N, 2 * F * (double)M * N + F * (double)N);
        return;
    }
    /* along K: K + e rounded up to 8 columns; h's and s B's columns (and the bias's) written
     * after the operands' rows, an operand already in bf16 copied into them */
    const int64_t ld = K + ((e + 7) & ~(int64_t)7);
    gemm_op_c(be, M, N, ld, a16, w16, 0.0f, 1.0, F, __func__);
    if (a16) add(be, TZ_SM_ELEMENT, 0, 2.0 * (double)M * K + 2.0 * (double)M * ld);
    if (w16) add(be, TZ_SM_ELEMENT, 0, 2.0 * (double)N * K + 2.0 * (double)N * ld);
    add(be, TZ_SM_ELEMENT, 0, F * (double)r * (M + N) + (bias ? F * (double)N : 0.0));
}

/* ---- embedding, norms, rope ---- */
static void s_emb_fwd(tz_backend *be, float *o, const int32_t *t, cf *w, int64_t n, int64_t C) { (void)o, (void)t, (void)w; add(be, TZ_SM_ELEMENT, 0, 2 * F * n * C); }
static void s_emb_bwd(tz_backend *be, float *dw, const int32_t *t, cf *d, int64_t n, int64_t C) { (void)dw, (void)t, (void)d; add(be, TZ_SM_ELEMENT, (double)n * C, 3 * F * n * C); }
static void s_emb_w16(tz_backend *be, float *o, const int32_t *t, const uint16_t *w, int64_t n, int64_t C) { (void)o, (void)t, (void)w; add(be, TZ_SM_ELEMENT, 0, 6.0 * n * C); }
static void s_rms_fwd(tz_backend *be, float *o, float *r, cf *x, cf *w, int64_t rows, int64_t C, float eps) {
    (void)o, (void)r, (void)x, (void)w, (void)eps;
    add(be, TZ_SM_NORM, 4.0 * rows * C, 2 * F * rows * C + F * C);
}
static void s_rms_bwd(tz_backend *be, float *dx, float *dw, cf *d, cf *x, cf *w, cf *r, int64_t rows, int64_t C, int acc) {
    (void)dx, (void)dw, (void)d, (void)x, (void)w, (void)r;
    add(be, TZ_SM_NORM, 8.0 * rows * C, (acc ? 4 : 3) * F * rows * C);
}
static void s_rope(tz_backend *be, float *x, int64_t B, int64_t T, int64_t H, int64_t D, float th) {
    (void)x, (void)th;
    add(be, TZ_SM_ELEMENT, 3.0 * B * T * H * D, 2 * F * B * T * H * D);
}
static void s_rope16(tz_backend *be, uint16_t *y, cf *x, int64_t B, int64_t T, int64_t H, int64_t D, float th) {
    (void)y, (void)x, (void)th; /* fp32 in, bf16 out */
    add(be, TZ_SM_ELEMENT, 3.0 * B * T * H * D, (F + 2) * (double)(B * T * H * D));
}
static void s_rope_tab(tz_backend *be, float *x, int64_t B, int64_t T, int64_t H, int64_t D, cf *f, int64_t p) {
    (void)x, (void)f, (void)p;
    add(be, TZ_SM_ELEMENT, 3.0 * B * T * H * D, 2 * F * B * T * H * D);
}
static void s_rope_tab16(tz_backend *be, uint16_t *y, cf *x, int64_t B, int64_t T, int64_t H, int64_t D, cf *f, int64_t p) {
    (void)y, (void)x, (void)f, (void)p; /* fp32 in, bf16 out */
    add(be, TZ_SM_ELEMENT, 3.0 * B * T * H * D, (F + 2) * (double)(B * T * H * D));
}
static void s_rope_pairs(tz_backend *be, float *x, int64_t B, int64_t T, int64_t H, int64_t D, cf *cs) {
    (void)x, (void)cs; /* the table is read per position: small beside x */
    add(be, TZ_SM_ELEMENT, 3.0 * B * T * H * D, 2 * F * B * T * H * D);
}
static void s_rms_rope16(tz_backend *be, uint16_t *y, float *r, cf *x, cf *w, int64_t B, int64_t Ts, int64_t off, int64_t T, int64_t H, int64_t D, float eps, cf *cs) {
    (void)y, (void)r, (void)x, (void)w, (void)off, (void)T, (void)eps, (void)cs; /* fp32 in, bf16 out */
    add(be, TZ_SM_NORM, 6.0 * B * Ts * H * D, (F + 2) * (double)(B * Ts * H * D));
}
static void s_rope_pairs16(tz_backend *be, uint16_t *y, cf *x, int64_t B, int64_t T, int64_t H, int64_t D, cf *cs) {
    (void)y, (void)x, (void)cs; /* fp32 in, bf16 out */
    add(be, TZ_SM_ELEMENT, 3.0 * B * T * H * D, (F + 2) * (double)(B * T * H * D));
}

/* ---- attention: query-key pairs visible (causal: the lower triangle) ---- */
static double pairs(int64_t T, int64_t S, int causal) { return causal ? (double)T * (T + 1) / 2 : (double)T * S; }
/* q, k and v read in bf16 (tz_att_ld.in16): 2 bytes of each element fewer */
static double qkv16_saves(const tz_att_ld *ld, int64_t BT, int64_t Hq, int64_t Hkv, int64_t D) {
    return ld && ld->in16 ? (F - 2.0) * BT * (Hq + 2.0 * Hkv) * D : 0.0;
}
static void s_att_fwd(tz_backend *be, float *o, float *lse, cf *q, cf *k, cf *v, int64_t B, int64_t T,
                      int64_t Hq, int64_t Hkv, int64_t D, int causal, const tz_att_ld *ld) {
    (void)o, (void)lse, (void)q, (void)k, (void)v;
    /* S = QK^T and O = PV: 2 flops each per pair and head dimension */
    add(be, TZ_SM_ATTENTION, 4.0 * B * Hq * D * pairs(T, T, causal),
        F * B * T * (2.0 * Hq * D + 2.0 * Hkv * D + Hq) - qkv16_saves(ld, B * T, Hq, Hkv, D));
}
static void s_att_bwd(tz_backend *be, float *dq, float *dk, float *dv, cf *d, cf *o, cf *lse, cf *q,
                      cf *k, cf *v, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D, int causal,
                      int acc, const tz_att_ld *ld) {
    (void)dq, (void)dk, (void)dv, (void)d, (void)o, (void)lse, (void)q, (void)k, (void)v;
    /* S again, dP = dO V^T, dV += P^T dO, dQ += dS K, dK += dS^T Q: q, dO, O and k, v read,
     * dq, dk, dv written (and read first when added into); lse and delta. A GPU's flash
     * kernels compute S and dP twice (dq's kernel and dk/dv's: 7 products) unless they keep
     * dS in memory lent (5 products, and dS's bytes) */
    const int d16 = ld ? ld->d16 : 0; /* gradients written in bf16: 2 bytes each fewer */
    const double a = acc ? 1.0 : 0.0,
                 g16 = (F - 2.0) * B * T *
                       ((d16 & TZ_ATT_DQ16 ? Hq : 0) + (d16 & TZ_ATT_DK16 ? Hkv : 0) +
                        (d16 & TZ_ATT_DV16 ? Hkv : 0)) * (double)D;
    /* the score gradients kept in the memory lent (be->att_ds), as a GPU's tiles-ahead
     * kernels keep them (bf16 q, k, v; tz_attention_ds_group): written once, read once */
    const char *off = getenv("TZ_FA_DS"); /* (the CUDA backend's switch, docs/gpu.md) */
    const int keeps = be->att_ds && !(off && !strcmp(off, "0")) && ld && ld->in16 &&
                      D % 8 == 0 && D <= TZ_ATTENTION_FLASH_MAXD &&
                      tz_attention_ds_group(B, T, Hq, Hkv, causal, be->att_ds_bytes);
    const double ds = keeps ? 2.0 * B * Hq * (double)tz_attention_ds_head_bytes(T, causal) : 0.0;
    be->att_ds = NULL, be->att_ds_bytes = 0; /* (the loan ends with the call) */
    /* (the flash kernels, bf16 on the tensor cores up to TZ_ATTENTION_FLASH_MAXD or fp32 on
     * the CUDA cores; above it bf16 runs chunks through GEMMs, S once) */
    const int twice = !keeps && be->device &&
                      (be->matmul_dtype != TZ_DT_BF16 || D <= TZ_ATTENTION_FLASH_MAXD);
    add(be, TZ_SM_ATTENTION, (twice ? 14.0 : 10.0) * B * Hq * D * pairs(T, T, causal),
        F * B * T * ((4.0 + a) * Hq * D + (4.0 + 2.0 * a) * Hkv * D + Hq) -
            qkv16_saves(ld, B * T, Hq, Hkv, D) - g16 + ds);
}
/* (q and out, and the keys and values of the p + T positions read, as stored) */
static void s_att_cache(tz_backend *be, float *o, cf *q, const void *kc, const void *vc,
                        int64_t B, int64_t T, int64_t S, int64_t p, int64_t Hq, int64_t Hkv,
                        int64_t D, int kv16) {
    (void)o, (void)q, (void)kc, (void)vc, (void)S;
    add(be, TZ_SM_ATTENTION, 4.0 * B * Hq * D * T * (double)(p + T),
        B * (F * 2.0 * T * Hq * D + (kv16 ? 2.0 : F) * 2.0 * (double)(p + T) * Hkv * D));
}

/* ---- activations, losses, DiT's ops, layout ---- */
/* (the bytes of g and u read: fp32, or bf16 with TZ_SWIGLU_IN16) */
static double gu_bytes(int flags) { return flags & TZ_SWIGLU_IN16 ? 4.0 : 2 * F; }
static void s_swiglu_fwd(tz_backend *be, float *o, cf *g, cf *u, int64_t n, int fl) { /* reads 2, writes 1 (fp32 or bf16) */
    (void)o, (void)g, (void)u;
    add(be, TZ_SM_ELEMENT, 6.0 * n, (gu_bytes(fl) + (fl & TZ_SWIGLU_OUT16 ? 2 : F)) * n);
}
static void s_swiglu_bwd(tz_backend *be, float *dg, float *du, cf *d, cf *g, cf *u, int64_t n, int acc, int fl) { /* reads 3, writes 2 (fp32 or bf16), reads 2 more to add */
    (void)dg, (void)du, (void)d, (void)g, (void)u;
    add(be, TZ_SM_ELEMENT, 10.0 * n,
        (F + gu_bytes(fl) + (fl & TZ_SWIGLU_OUT16 ? 4 : 2 * F) + (acc ? 2 * F : 0)) * n);
}
static void s_xent_fwd(tz_backend *be, float *l, cf *x, const int32_t *t, int64_t n, int64_t V) { (void)l, (void)x, (void)t; add(be, TZ_SM_LOSS, 4.0 * n * V, F * n * V); }
static void s_xent_bwd(tz_backend *be, float *d, cf *x, const int32_t *t, float dl, int64_t n, int64_t V) { (void)d, (void)x, (void)t, (void)dl; add(be, TZ_SM_LOSS, 4.0 * n * V, 2 * F * n * V); }
static void s_ln_fwd(tz_backend *be, float *o, float *mu, float *r, cf *x, int64_t rows, int64_t C, float eps) { (void)o, (void)mu, (void)r, (void)x, (void)eps; add(be, TZ_SM_NORM, 5.0 * rows * C, 2 * F * rows * C); }
static void s_ln_bwd(tz_backend *be, float *dx, cf *d, cf *x, cf *mu, cf *r, int64_t rows, int64_t C) { (void)dx, (void)d, (void)x, (void)mu, (void)r; add(be, TZ_SM_NORM, 8.0 * rows * C, 4 * F * rows * C); }
static void s_mod_fwd(tz_backend *be, float *o, cf *x, cf *sh, cf *sc, int64_t ld, int64_t B, int64_t T, int64_t C, int o16) { (void)o, (void)x, (void)sh, (void)sc, (void)ld; add(be, TZ_SM_ELEMENT, 2.0 * B * T * C, (F + (o16 ? 2 : F)) * B * T * C); }
/* the backward's dx (dy): read as well where added to (acc), only written otherwise */
static void s_mod_bwd(tz_backend *be, float *dx, float *dsh, float *dsc, cf *d, cf *x, cf *sc, int64_t ld, int64_t B, int64_t T, int64_t C, int acc) { (void)dx, (void)dsh, (void)dsc, (void)d, (void)x, (void)sc, (void)ld; add(be, TZ_SM_ELEMENT, 4.0 * B * T * C, (acc ? 4 : 3) * F * B * T * C); }
static void s_gate_fwd(tz_backend *be, float *o, cf *x, cf *y, cf *g, int64_t ld, int64_t B, int64_t T, int64_t C) { (void)o, (void)x, (void)y, (void)g, (void)ld; add(be, TZ_SM_ELEMENT, 2.0 * B * T * C, 3 * F * B * T * C); }
/* a backward's output: read too where added to (acc 1), written in bf16 (acc 2: 2 bytes) */
static double out_bytes(int acc) { return acc == 2 ? 2.0 : acc ? 2 * F : F; }
static void s_gate_bwd(tz_backend *be, float *dy, float *dg, cf *d, cf *y, cf *g, int64_t ld, int64_t B, int64_t T, int64_t C, int acc) { (void)dy, (void)dg, (void)d, (void)y, (void)g, (void)ld; add(be, TZ_SM_ELEMENT, 4.0 * B * T * C, (2 * F + out_bytes(acc)) * B * T * C); }
static void s_act_fwd(tz_backend *be, float *o, cf *x, int64_t n) { (void)o, (void)x; add(be, TZ_SM_ELEMENT, 8.0 * n, 2 * F * n); }
static void s_act_bwd(tz_backend *be, float *dx, cf *d, cf *x, int64_t n, int acc) { (void)dx, (void)d, (void)x; add(be, TZ_SM_ELEMENT, 12.0 * n, (acc ? 4 : 3) * F * n); }
/* GELU's: the same work at any row stride (it moves no more bytes) */
static void s_gelu_fwd(tz_backend *be, float *o, cf *x, int64_t n, int64_t cols, int64_t ld, int fl) {
    (void)o, (void)x, (void)cols, (void)ld; /* (an output or an x in bf16: 2 bytes) */
    add(be, TZ_SM_ELEMENT, 8.0 * n,
        ((fl & TZ_GELU_X16 ? 2 : F) + (fl & TZ_GELU_OUT16 ? 2 : F)) * n);
}
static void s_gelu_bwd(tz_backend *be, float *dx, cf *d, cf *x, int64_t n, int acc, int64_t cols, int64_t ld) {
    (void)dx, (void)d, (void)x, (void)cols, (void)ld;
    add(be, TZ_SM_ELEMENT, 12.0 * n,
        (F + (acc & TZ_GELU_X16 ? 2 : F) + out_bytes(acc & ~TZ_GELU_X16)) * n);
}
static void s_bias_add(tz_backend *be, float *y, cf *b, int64_t rows, int64_t C) { (void)y, (void)b; add(be, TZ_SM_ELEMENT, (double)rows * C, 2 * F * rows * C); }
static void s_bias_bwd(tz_backend *be, float *db, cf *dy, int64_t rows, int64_t C, uint16_t *d16) { (void)db, (void)dy; add(be, TZ_SM_ELEMENT, (double)rows * C, (F + (d16 ? 2 : 0)) * rows * C); }
static void s_gelu_bwd_bias(tz_backend *be, uint16_t *d16, float *db, cf *d, cf *x, int64_t rows, int64_t C, int x16) { /* GELU's backward and the bias's column sums: reads dout and x, writes dx in bf16 */
    (void)d16, (void)db, (void)d, (void)x;
    add(be, TZ_SM_ELEMENT, 13.0 * rows * C, (F + (x16 ? 2 : F) + 2) * rows * C);
}
static void s_mse_fwd(tz_backend *be, float *s, cf *p, int64_t ld, cf *t, int64_t rows, int64_t n) { (void)s, (void)p, (void)ld, (void)t; add(be, TZ_SM_LOSS, 3.0 * rows * n, 2 * F * rows * n); }
static void s_mse_bwd(tz_backend *be, float *d, cf *p, int64_t ld, cf *t, float dl, int64_t rows, int64_t n) { (void)d, (void)p, (void)ld, (void)t, (void)dl; add(be, TZ_SM_LOSS, 3.0 * rows * n, 3 * F * rows * n); }
static void s_patch(tz_backend *be, float *a, cf *b, int64_t B, int64_t C, int64_t H, int64_t W, int64_t p, int cl) { (void)a, (void)b, (void)p, (void)cl; add(be, TZ_SM_ELEMENT, 0, 2 * F * B * C * H * W); }
static void s_copy2d(tz_backend *be, float *d, int64_t ldd, cf *s, int64_t lds, int64_t rows, int64_t cols) { (void)d, (void)ldd, (void)s, (void)lds; add(be, TZ_SM_ELEMENT, 0, 2 * F * rows * cols); }

/* ---- TurboQuant: codes of `bits`, one bf16 scale per group ---- */
static double decode_bytes(int64_t rows, int64_t cols, int bits, int group, double out) {
    const double n = (double)rows * cols;
    return n * bits / 8.0 + 2.0 * n / group + out * n;
}
static void s_rot(tz_backend *be, float *y, cf *x, int64_t rows, int64_t cols, int group, uint64_t seed) {
    (void)y, (void)x, (void)seed;
    add(be, TZ_SM_QUANT, (double)rows * cols * (log2((double)group) + 1), 2 * F * rows * cols);
}
static void s_rot16(tz_backend *be, uint16_t *y, cf *x, int64_t rows, int64_t cols, int64_t ldy,
                    int group, uint64_t seed, uint16_t *xc) {
    (void)y, (void)x, (void)seed, (void)ldy;
    add(be, TZ_SM_QUANT, (double)rows * cols * (log2((double)group) + 1),
        (F + (xc ? 4 : 2)) * rows * cols);
}
static void s_rot_bwd(tz_backend *be, float *dx, cf *dy, int64_t rows, int64_t cols, int group,
                      uint64_t seed, int acc) {
    (void)dx, (void)dy, (void)seed;
    add(be, TZ_SM_QUANT, (double)rows * cols * (log2((double)group) + 2),
        (acc ? 3 : 2) * F * rows * cols);
}
static void s_rot16_at(tz_backend *be, uint16_t *y, cf *x, int64_t rows, int64_t cols,
                       int64_t ldy, int group, uint64_t seed, int64_t c0, int64_t wcols,
                       uint16_t *xc) {
    (void)y, (void)x, (void)seed, (void)ldy, (void)c0, (void)wcols;
    add(be, TZ_SM_QUANT, (double)rows * cols * (log2((double)group) + 1),
        (F + (xc ? 4 : 2)) * rows * cols);
}
/* g and u read in bf16 (SwiGLU's arithmetic, 6 per element, as swiglu_fwd's), the rotation */
static void s_swiglu_rot16_at(tz_backend *be, uint16_t *y, const uint16_t *g, const uint16_t *u,
                              int64_t rows, int64_t cols, int64_t ldy, int group, uint64_t seed,
                              int64_t c0, int64_t wcols, uint16_t *sc) {
    (void)y, (void)g, (void)u, (void)seed, (void)ldy, (void)c0, (void)wcols;
    add(be, TZ_SM_QUANT, (double)rows * cols * (log2((double)group) + 7),
        (4.0 + (sc ? 4 : 2)) * rows * cols);
}
static void s_rot_bwd_at(tz_backend *be, float *dx, cf *dy, int64_t rows, int64_t cols,
                         int group, uint64_t seed, int acc, int64_t c0, int64_t wcols) {
    (void)dx, (void)dy, (void)seed, (void)c0, (void)wcols;
    add(be, TZ_SM_QUANT, (double)rows * cols * (log2((double)group) + 2),
        (acc ? 3 : 2) * F * rows * cols);
}
static void s_dequant(tz_backend *be, float *w, const uint8_t *c, const uint16_t *s, cf *l, int64_t rows,
                      int64_t cols, int bits, int group) {
    (void)w, (void)c, (void)s, (void)l;
    add(be, TZ_SM_QUANT, 2.0 * rows * cols, decode_bytes(rows, cols, bits, group, F));
}
/* A quantized weight's product by the fused narrow kernel where tz_tq_fused_plan takes it
 * (cuda/cuda_narrow.cu's k_narrow_tq), booked under op and returning 1: the decode's arithmetic
 * (quant, no bytes: the codes are decoded in the kernel, never written out); an fp32 A rounded
 * first; the kernel reads the codes and scales once, LoRA's and the bias's columns after W's
 * (bf16 [rows, ld - cols], written by the columns' pass the caller books) and A, writes each
 * split's sums and reads them back, and writes C (cb bytes an element; read where beta != 0).
 * 0: not fused. */
static int fused_tq_op(tz_backend *be, int64_t M, int64_t rows, int64_t cols, int64_t ld,
                       int transW, int bits, int group, int a16, double cb, float beta,
                       const char *op) {
    tz_narrow np;
    if (!tz_tq_fused_plan(be, M, rows, cols, ld, transW, &np)) return 0;
    const double P = (double)np.P, R = (double)np.R, K = (double)np.K;
    add_op(be, TZ_SM_QUANT, 2.0 * rows * cols, 0.0, op);
    if (!a16) add_op(be, TZ_SM_ELEMENT, 0, 6.0 * R * K, op);
    const double part = narrow_part_bytes(&np);
    add_op(be, TZ_SM_GEMM, 2.0 * P * R * K,
           decode_bytes(rows, cols, bits, group, 0.0) + 2.0 * (double)rows * (ld - cols) +
               2.0 * R * K + part + cb * P * R * (beta != 0.0f ? 2 : 1),
           op);
    return 1;
}

static void s_tq_matmul(tz_backend *be, float *C, const void *A, int a16, float *tile, const uint8_t *c,
                        const uint16_t *s, cf *l, int64_t rows, int64_t cols, int bits, int group,
                        int64_t M, int transW, float alpha, float beta) {
    (void)C, (void)A, (void)tile, (void)c, (void)s, (void)l, (void)alpha;
    if (fused_tq_op(be, M, rows, cols, cols, transW, bits, group, a16, F, beta, __func__)) return;
    /* the weight decoded into a tile of the GEMM operand type, then the product */
    const double ob = be->matmul_dtype == TZ_DT_BF16 ? 2.0 : F;
    add(be, TZ_SM_QUANT, 2.0 * rows * cols, decode_bytes(rows, cols, bits, group, ob));
    const int64_t K = transW ? cols : rows, N = transW ? rows : cols;
    /* the tile is in the GEMM operand type already (bf16 or fp32): read once, no cast; not
     * decoded in chunks, the product may be a narrow one */
    if (!tz_tq_chunked(be) && narrow_op(be, M, N, K, 0, transW, a16, ob == 2.0, beta, __func__))
        return;
    gemm_op(be, M, N, K, a16, ob == 2.0, beta, tq_a_reads(be, rows, cols, group, transW),
            __func__);
}

static void s_tq_matmul_lora(tz_backend *be, float *C, uint16_t *A, int64_t ld, cf *h, cf *B,
                             int64_t r, float sc, float *tile, const uint8_t *c,
                             const uint16_t *s, cf *l, int64_t rows, int64_t cols, int bits,
                             int group, int64_t M, cf *bias, int c16) {
    (void)C, (void)A, (void)h, (void)B, (void)sc, (void)tile, (void)c, (void)s, (void)l;
    /* the columns of B and h (and the bias's) written after W's and x's (read fp32, written
     * bf16; the padding to ld written); on at most 64 rows the fused kernel, else the decode
     * into bf16 and one GEMM over ld */
    add(be, TZ_SM_ELEMENT, 0,
        (F * r + 2.0 * (ld - cols)) * (double)(rows + M) + (bias ? F * (double)rows : 0.0));
    if (fused_tq_op(be, M, rows, cols, ld, 1, bits, group, 1, c16 ? 2.0 : F, 0.0f, __func__))
        return;
    add(be, TZ_SM_QUANT, 2.0 * rows * cols, decode_bytes(rows, cols, bits, group, 2.0));
    gemm_op_c(be, M, rows, ld, 1, 1, 0.0f, tq_a_reads(be, rows, cols, group, 1), c16 ? 2.0 : F,
              __func__);
}

/* ---- copies and events ---- */
static void s_copy(tz_backend *be, void *d, const void *s, size_t n) { (void)d, (void)s; add(be, TZ_SM_COPY, 0, 2.0 * n); }
static void s_xfer(tz_backend *be, void *d, const void *s, size_t n) { (void)d, (void)s; add(be, TZ_SM_TRANSFER, 0, (double)n); }
static void *s_event_mark(tz_backend *be, int q) { (void)q; return be; }
static void s_event_wait(tz_backend *be, void *ev, int q) { (void)be, (void)ev, (void)q; }
static int s_event_done(tz_backend *be, void *ev) { (void)be, (void)ev; return 1; }
static void s_event_free(tz_backend *be, void *ev) { (void)be, (void)ev; }

void tz_step_model_install(tz_backend *be, const tz_step_rates *r) {
    tz_step_model_of(be)->rates = *r;
    be->upload = s_xfer, be->download = s_xfer, be->copy = s_copy;
    be->download_async = s_xfer, be->upload_async = s_xfer;
    be->event_mark = s_event_mark, be->event_wait = s_event_wait;
    be->event_done = s_event_done, be->event_free = s_event_free;
    be->fill = s_fill, be->scale = s_scale, be->axpy = s_axpy, be->to_bf16 = s_to_bf16;
    be->from_bf16 = s_from_bf16, be->sumsq = s_sumsq, be->adamw = s_adamw, be->matmul = s_matmul;
    be->matmul_bw16 = s_matmul_bw16, be->matmul16 = s_matmul16, be->matmul_bias = s_matmul_bias, be->matmul_lora = s_matmul_lora, be->embedding_fwd = s_emb_fwd, be->embedding_bwd = s_emb_bwd;
    be->embedding_fwd_w16 = s_emb_w16, be->rmsnorm_fwd = s_rms_fwd, be->rmsnorm_bwd = s_rms_bwd;
    be->rope_fwd = s_rope, be->rope_bwd = s_rope, be->rope_fwd16 = s_rope16, be->rope_bwd16 = s_rope16;
    be->rope_tab_fwd = s_rope_tab;
    be->rope_tab_fwd16 = s_rope_tab16, be->rope_tab_bwd16 = s_rope_tab16;
    be->rope_tab_bwd = s_rope_tab, be->rope_pairs_fwd = s_rope_pairs, be->rope_pairs_bwd = s_rope_pairs;
    be->rope_pairs_fwd16 = s_rope_pairs16, be->rms_rope_pairs16 = s_rms_rope16;
    be->attention_fwd = s_att_fwd, be->attention_bwd = s_att_bwd;
    be->attention_cache_fwd = s_att_cache, be->swiglu_fwd = s_swiglu_fwd;
    be->swiglu_bwd = s_swiglu_bwd, be->xent_fwd = s_xent_fwd, be->xent_bwd = s_xent_bwd;
    be->layernorm_fwd = s_ln_fwd, be->layernorm_bwd = s_ln_bwd, be->modulate_fwd = s_mod_fwd;
    be->modulate_bwd = s_mod_bwd, be->gate_fwd = s_gate_fwd, be->gate_bwd = s_gate_bwd;
    be->gelu_tanh_fwd = s_gelu_fwd, be->gelu_tanh_bwd = s_gelu_bwd, be->silu_fwd = s_act_fwd;
    be->silu_bwd = s_act_bwd, be->bias_add_fwd = s_bias_add, be->bias_bwd = s_bias_bwd;
    be->gelu_tanh_bwd_bias = s_gelu_bwd_bias;
    be->mse_fwd = s_mse_fwd, be->mse_bwd = s_mse_bwd, be->patchify = s_patch;
    be->unpatchify = s_patch, be->copy2d = s_copy2d, be->tq_rotate = s_rot;
    be->tq_rotate16 = s_rot16, be->tq_rotate_bwd = s_rot_bwd,
    be->tq_rotate16_at = s_rot16_at, be->tq_rotate_bwd_at = s_rot_bwd_at;
    be->swiglu_rot16_at = s_swiglu_rot16_at;
    be->tq_dequant = s_dequant;
    be->tq_matmul = s_tq_matmul, be->tq_matmul_lora = s_tq_matmul_lora;
}

void tz_step_model_scale(tz_step_model *m, double scale) {
    for (int c = 0; c < TZ_SM_N; c++) {
        m->flops[c] *= scale;
        m->bytes[c] *= scale;
        m->sec[c] *= scale;
        m->calls[c] = (int64_t)llround((double)m->calls[c] * scale);
    }
    for (int i = 0; i < m->n_ops; i++) {
        tz_step_op *o = &m->ops[i];
        o->flops *= scale, o->bytes *= scale, o->sec *= scale;
        o->calls = (int64_t)llround((double)o->calls * scale);
    }
}

tz_step_rates tz_step_rates_h100(int bf16) {
    /* NVIDIA H100 SXM5 datasheet: dense bf16 989 TFLOP/s, TF32 495, fp32 67; HBM3 3.35 TB/s;
     * PCIe gen 5 x16 64 GB/s each way (about 50 in practice). Attention with bf16 operands
     * (head dimension <= 128: the flash kernels' bf16 mma.sync) at the bf16 rate, which
     * mma.sync does not reach on Hopper (wgmma does): a lower bound, as every line; with fp32
     * operands the fp32 flash kernels on the CUDA cores. */
    return (tz_step_rates){bf16 ? "H100 SXM (bf16 GEMMs)" : "H100 SXM (TF32 GEMMs)",
                           bf16 ? 989e12 : 495e12, bf16 ? 989e12 : 67e12, 67e12, 3.35e12,
                           50e9};
}

void tz_step_model_print(const tz_step_model *m) {
    double tf = 0, tb = 0, tt = 0;
    tz_info("step model (op by op as the code calls them; bytes of the operands as stored; time "
            "at the %s's peak rates, each call's compute or memory time, whichever is larger: "
            "a lower bound):", m->rates.name);
    tz_info("  %-24s %8s %12s %12s %10s", "class", "calls", "GFLOP", "GB", "est. ms");
    for (int c = 0; c < TZ_SM_N; c++) {
        if (!m->calls[c]) continue;
        const double t = m->sec[c];
        tf += m->flops[c], tb += m->bytes[c], tt += t;
        tz_info("  %-24s %8lld %12.6g %12.6g %10.4g", tz_step_model_names[c], (long long)m->calls[c],
                1e-9 * m->flops[c], 1e-9 * m->bytes[c], 1e3 * t);
    }
    tz_info("  %-24s %8s %12.6g %12.6g %10.4g", "total", "", 1e-9 * tf, 1e-9 * tb, 1e3 * tt);
    /* the transfers run on the copy queue beside the compute (streamed weights, checkpointed
     * streams, gradients and losses): the total adds them, a step overlaps them */
    const double tx = m->sec[TZ_SM_TRANSFER];
    if (tx > 0.0)
        tz_info("  the queues overlap: compute %.4g ms, host <-> device %.4g ms (on the copy queue "
                "beside it but for a step's few inputs): a step of about %.4g ms where they "
                "overlap fully (the total above adds them)",
                1e3 * (tt - tx), 1e3 * tx, 1e3 * fmax(tt - tx, tx));
}

void tz_step_model_print_ops(const tz_step_model *m) {
    int idx[TZ_SM_OPS];
    for (int i = 0; i < m->n_ops; i++) idx[i] = i;
    for (int i = 1; i < m->n_ops; i++) /* insertion sort, the most time first */
        for (int j = i; j > 0 && m->ops[idx[j]].sec > m->ops[idx[j - 1]].sec; j--) {
            const int t = idx[j];
            idx[j] = idx[j - 1], idx[j - 1] = t;
        }
    tz_info("  %-24s %-22s %8s %12s %12s %10s", "op (counter)", "class", "calls", "GFLOP", "GB",
            "est. ms");
    for (int k = 0; k < m->n_ops; k++) {
        const tz_step_op *o = &m->ops[idx[k]];
        tz_info("  %-24s %-22s %8lld %12.6g %12.6g %10.4g", o->name, tz_step_model_names[o->cls],
                (long long)o->calls, 1e-9 * o->flops, 1e-9 * o->bytes, 1e3 * o->sec);
    }
}
