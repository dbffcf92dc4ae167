/* The file-to-file conversions behind `turbozero quantize` and `turbozero export --dequantize`
 * (host only): above both llama_io (config.json into dims) and llama_quant (the quantized
 * layout), which then need not know each other's conversions. */
#include "model/llama_convert.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/fsutil.h"
#include "io/hf_config.h"
#include "model/llama_io.h"
#include "model/llama_quant.h"
#include "quant/turboquant.h"

/* ---- the quantize and export commands (host only, file to file) ---- */

/* 1 when name is "model.layers.N.self_attn.{q,k,v,o}_proj.weight" or
 * "model.layers.N.mlp.{gate,up,down}_proj.weight" with N < n_layers. */
static int is_projection_name(const char *name, int64_t n_layers) {
    int layer, used = 0;
    char blk[32], proj[32];
    if (sscanf(name, "model.layers.%d.%31[^.].%31[^.].weight%n", &layer, blk, proj, &used) != 3 ||
        name[used] != 0 || layer < 0 || layer >= n_layers)
        return 0;
    for (int j = 0; j < TZ_LIN_N; j++)
        if (!strcmp(proj, tz_llama_lin_names[j]))
            return !strcmp(blk, j <= TZ_LIN_O ? "self_attn" : "mlp");
    return 0;
}

static void open_model(tz_safetensors *st, tz_tqf *qf, const char *dir, const char *cmd) {
    char err[1024];
    if (tz_st_open(st, dir, err, sizeof err)) TZ_FATAL("%s: %s", cmd, err);
    if (tz_tqf_read(qf, st, err, sizeof err)) TZ_FATAL("%s: %s", cmd, err);
}

static void save_model(tz_st_writer *w, const char *in, const char *out, const char *quant_json,
                       const char *dtype) {
    char src[1100], dst[1100], err[1024];
    if (tz_mkdir_p(out, err, sizeof err)) TZ_FATAL("%s", err);
    tz_path_join(dst, sizeof dst, out, "model.safetensors");
    if (tz_st_writer_save(w, dst, err, sizeof err)) TZ_FATAL("%s", err);
    tz_path_join(src, sizeof src, in, "config.json");
    tz_path_join(dst, sizeof dst, out, "config.json");
    if (tz_hf_config_rewrite(src, dst, quant_json, dtype, err, sizeof err)) TZ_FATAL("%s", err);
    if (tz_copy_tokenizer_files(in, out, err, sizeof err) < 0) TZ_FATAL("%s", err);
}

/* The quantization of one projection: its stored tensor and table row. */
typedef struct qrow {
    const char *name;
    tz_tq_tensor t;
    double rel;
} qrow;

/* The totals of a quantize run: every tensor's bytes, and the quantized projections' bytes in
 * and out, weights, squared error sum ||W - W_hat||^2 and squared sum ||W||^2. */
typedef struct qtotals {
    int64_t nq;
    double in_bytes, out_bytes, qin, qout, qw, qerr, qref;
} qtotals;

/* Quantizes projection t in groups of g into r (its codes and relative error) and adds it to
 * the totals; returns the bytes it is stored in. */
static double quantize_tensor(const tz_st_tensor *t, int method, int bits, int g, uint64_t seed,
                              const tz_tq_codebook *cb, qrow *r, qtotals *tot) {
    char err[1024];
    r->name = t->name;
    float *wf = tz_xmalloc((size_t)t->numel * sizeof *wf);
    float *wh = tz_xmalloc((size_t)t->numel * sizeof *wh);
    if (tz_st_tensor_to_f32(t, wf, err, sizeof err)) TZ_FATAL("quantize: %s", err);
    if (tz_tq_tensor_init(&r->t, bits, g, t->shape[0], t->shape[1], seed, err, sizeof err))
        TZ_FATAL("quantize: %s: tensor %s: %s", t->file, t->name, err);
    tz_tq_quantize_as(&r->t, method, cb, wf);
    tz_tq_dequantize_as(&r->t, method, cb, wh);
    r->rel = tz_tq_relative_error(wf, wh, t->numel);
    for (int64_t k = 0; k < t->numel; k++) { /* totals over all projections */
        double e = (double)wf[k] - (double)wh[k];
        tot->qerr += e * e;
        tot->qref += (double)wf[k] * (double)wf[k];
    }
    free(wf);
    free(wh);
    double stored = (double)tz_tq_codes_bytes(r->t.rows, r->t.cols, bits) +
                    2.0 * (double)tz_tq_scales_count(r->t.rows, r->t.cols, g);
    tot->nq++;
    tot->out_bytes += stored;
    tot->qin += (double)t->nbytes;
    tot->qout += stored;
    tot->qw += (double)t->numel;
    return stored;
}

/* ---- the report: one table row per projection, then the totals ---- */

static void report_header(FILE *rep) {
    fprintf(rep, "%-44s %-12s %5s %7s %10s %10s %10s\n", "tensor", "shape", "group", "bits/w",
            "rel.error", "bytes", "stored");
}

/* A quantized projection (r), or one left dense (r NULL: its rows fit no group). */
static void report_row(FILE *rep, const tz_st_tensor *t, int g, const qrow *r, double stored) {
    char shape[64];
    tz_st_shape_str(shape, sizeof shape, t->ndim, t->shape);
    if (!r)
        fprintf(rep, "%-44s %-12s %5s %7s %10s %10zu %10zu  dense: row of %lld is not a "
                "multiple of 64\n", t->name, shape, "-", "-", "-", t->nbytes, t->nbytes,
                (long long)t->shape[1]);
    else
        fprintf(rep, "%-44s %-12s %5d %7.3f %10.6f %10zu %10.0f\n", t->name, shape, g,
                8.0 * stored / (double)t->numel, r->rel, t->nbytes, stored);
}

static void report_totals(FILE *rep, const qtotals *tot, int method, int bits, int group,
                          uint64_t seed, const char *out) {
    fprintf(rep, "projections: %lld quantized (%s, %d bits, group %d, seed %llu): %.0f weights, "
            "%.0f -> %.0f bytes (%.3f bits per weight), relative error %.6f\n",
            (long long)tot->nq, tz_tq_method_name(method), bits, group, (unsigned long long)seed,
            tot->qw, tot->qin, tot->qout, 8.0 * tot->qout / tot->qw,
            tot->qref > 0 ? tot->qerr / tot->qref : 0.0);
    fprintf(rep, "model: %.0f -> %.0f bytes of tensors (%.2fx smaller); wrote %s\n",
            tot->in_bytes, tot->out_bytes, tot->in_bytes / tot->out_bytes, out);
}

void tz_llama_quant_config_json(const tz_quant_opts *q, char *qc, size_t n) {
    snprintf(qc, n, "{\"quant_method\": \"%s\", \"bits\": %d, \"group_size\": %d, "
             "\"seed\": %llu, \"format\": \"turbozero\", \"quantized\": \"the projections of "
             "every block; see model.safetensors __metadata__ %s\"}",
             tz_tq_method_name(q->method), q->bits, q->group, (unsigned long long)q->seed,
             TZ_TQF_META_KEY);
}

/* The model's metadata: "turbozero_quant" (every tensor's layout) in the safetensors header,
 * "quantization_config" for config.json into qc. */
static void describe_quant(tz_st_writer *w, const qrow *rows, int64_t nq, int method, int bits,
                           int group, uint64_t seed, char *qc, size_t n) {
    const char **names = tz_xcalloc((size_t)nq, sizeof *names);
    const tz_tq_tensor **ts = tz_xcalloc((size_t)nq, sizeof *ts);
    for (int64_t k = 0; k < nq; k++) names[k] = rows[k].name, ts[k] = &rows[k].t;
    char *meta = tz_tqf_meta_json(method, bits, group, seed, names, ts, nq);
    tz_st_writer_set_metadata(w, TZ_TQF_META_KEY, meta);
    tz_quant_opts o = {method, bits, group, seed, 0};
    tz_llama_quant_config_json(&o, qc, n);
    free(meta);
    free(names);
    free(ts);
}

void tz_llama_quantize_dir(const char *in, const char *out, int method, int bits, int group,
                           uint64_t seed, FILE *rep) {
    char err[1024], qc[400];
    TZ_CHECK((method == TZ_TQ_TURBOQUANT || method == TZ_TQ_ABSMAX) && bits >= 1 &&
                 bits <= TZ_TQ_MAX_BITS && (group == 64 || group == 128 || group == 256),
             "quantize: method %d, %d bits, group %d", method, bits, group);
    tz_llama_dims d;
    tz_llama_read_dims(in, &d);
    tz_safetensors st;
    tz_tqf qf;
    open_model(&st, &qf, in, "quantize");
    if (qf.present)
        TZ_FATAL_HINT("quantize the dense model, or `turbozero export --dequantize` this one first",
                      "quantize: %s is already quantized (%s, %d bits)", in,
                      tz_tq_method_name(qf.method), qf.bits);
    tz_tq_codebook cb;
    memset(&cb, 0, sizeof cb);
    if (method == TZ_TQ_TURBOQUANT && tz_tq_codebook_init(&cb, bits, err, sizeof err))
        TZ_FATAL("quantize: %s", err);

    tz_st_writer w;
    tz_st_writer_init(&w);
    tz_st_writer_set_metadata(&w, "format", "pt");
    tz_st_writer_set_metadata(&w, "producer", "turbozero " TZ_VERSION);
    char id[24];
    snprintf(id, sizeof id, "%016llx", (unsigned long long)tz_st_identity_of(&st));
    tz_st_writer_set_metadata(&w, TZ_ST_SOURCE_KEY, id); /* the dense source's identity */
    qrow *rows = tz_xcalloc((size_t)st.count + 1, sizeof *rows);
    qtotals tot;
    memset(&tot, 0, sizeof tot);
    report_header(rep);
    for (int64_t i = 0; i < st.count; i++) {
        const tz_st_tensor *t = &st.tensors[i];
        tot.in_bytes += (double)t->nbytes;
        int proj = t->ndim == 2 && is_projection_name(t->name, d.n_layers);
        int g = proj ? tz_tq_group_for(t->shape[1], group) : 0;
        if (!g) { /* stays as it is, same dtype and bytes */
            if (tz_st_writer_add(&w, t->name, t->dtype, t->ndim, t->shape, t->data, err, sizeof err))
                TZ_FATAL("quantize: %s", err);
            tot.out_bytes += (double)t->nbytes;
            if (proj) report_row(rep, t, 0, NULL, 0.0);
            continue;
        }
        qrow *r = &rows[tot.nq];
        double stored = quantize_tensor(t, method, bits, g, seed, &cb, r, &tot);
        if (tz_tqf_writer_add(&w, t->name, &r->t, err, sizeof err)) TZ_FATAL("quantize: %s", err);
        report_row(rep, t, g, r, stored);
    }
    if (!tot.nq)
        TZ_FATAL("quantize: %s: no projection of the transformer blocks can be quantized", in);
    describe_quant(&w, rows, tot.nq, method, bits, group, seed, qc, sizeof qc);
    save_model(&w, in, out, qc, NULL);
    report_totals(rep, &tot, method, bits, group, seed, out);
    for (int64_t k = 0; k < tot.nq; k++) tz_tq_tensor_free(&rows[k].t);
    free(rows);
    tz_st_writer_free(&w);
    tz_tqf_free(&qf);
    tz_st_close(&st);
}

void tz_llama_export_dequantized(const char *in, const char *out, FILE *rep) {
    char err[1024];
    tz_safetensors st;
    tz_tqf qf;
    open_model(&st, &qf, in, "export");
    tz_st_writer w;
    tz_st_writer_init(&w);
    tz_st_writer_set_metadata(&w, "format", "pt");
    tz_st_writer_set_metadata(&w, "producer", "turbozero " TZ_VERSION);
    char id[24];
    snprintf(id, sizeof id, "%016llx", (unsigned long long)tz_st_identity_of(&st));
    tz_st_writer_set_metadata(&w, TZ_ST_SOURCE_KEY, id); /* the same base, dequantized */
    float **bufs = tz_xcalloc((size_t)st.count + 1, sizeof *bufs);
    int64_t nb = 0, ndeq = 0;
    double bytes = 0;
    tz_tq_codebook cb[TZ_TQ_MAX_BITS + 1];
    memset(cb, 0, sizeof cb);
    for (int64_t i = 0; i < st.count; i++) {
        const tz_st_tensor *t = &st.tensors[i];
        if (tz_tqf_is_part(t->name)) continue;
        float *f = bufs[nb++] = tz_xmalloc((size_t)t->numel * sizeof *f);
        if (tz_st_tensor_to_f32(t, f, err, sizeof err)) TZ_FATAL("export: %s", err);
        if (tz_st_writer_add(&w, t->name, TZ_DT_F32, t->ndim, t->shape, f, err, sizeof err))
            TZ_FATAL("export: %s", err);
        bytes += 4.0 * (double)t->numel;
    }
    for (int64_t i = 0; i < qf.n; i++) {
        const tz_tqf_entry *e = &qf.e[i];
        tz_tq_tensor t;
        if (tz_tqf_load(&qf, e, &t, err, sizeof err)) TZ_FATAL("export: %s: %s", e->name, err);
        if (qf.method == TZ_TQ_TURBOQUANT && cb[e->bits].bits != e->bits &&
            tz_tq_codebook_init(&cb[e->bits], e->bits, err, sizeof err))
            TZ_FATAL("export: %s", err);
        float *f = bufs[nb++] = tz_xmalloc((size_t)(e->rows * e->cols) * sizeof *f);
        tz_tq_dequantize_as(&t, qf.method, &cb[e->bits], f);
        tz_tq_tensor_free(&t);
        int64_t shape[2] = {e->rows, e->cols};
        if (tz_st_writer_add(&w, e->name, TZ_DT_F32, 2, shape, f, err, sizeof err))
            TZ_FATAL("export: %s", err);
        bytes += 4.0 * (double)(e->rows * e->cols);
        ndeq++;
    }
    save_model(&w, in, out, NULL, "float32");
    if (qf.present)
        fprintf(rep, "wrote %s: %lld tensors, F32, %.0f bytes (%lld dequantized from %s %d-bit)\n",
                out, (long long)nb, bytes, (long long)ndeq, tz_tq_method_name(qf.method), qf.bits);
    else
        fprintf(rep, "wrote %s: %lld tensors, F32, %.0f bytes (the model was not quantized: a "
                "dense F32 copy)\n", out, (long long)nb, bytes);
    for (int64_t k = 0; k < nb; k++) free(bufs[k]);
    free(bufs);
    tz_st_writer_free(&w);
    tz_tqf_free(&qf);
    tz_st_close(&st);
}
