/* Quantized model files: quantize -> save -> load -> dequantize is bit-identical to quantize ->
 * dequantize; a quantized folder and quantize-at-load give the same model bit for bit; the
 * dequantized export matches; malformed files are rejected with a message naming the file,
 * the tensor and the fault. The CLI around these is tested by tests/quant/quant_test.sh. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/world.h"
#include "backend/registry.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "io/tq_format.h"
#include "model/llama_io.h"
#include "model/llama_convert.h"
#include "model/llama_quant.h"
#include "quant/turboquant.h"
#include "tz_check.h"

static char g_dir[64];

static const tz_llama_dims k_dims = {.vocab = 64, .dim = 128, .hidden = 192, .n_layers = 2,
                                     .n_heads = 4, .n_kv_heads = 2, .head_dim = 32,
                                     .max_pos = 64, .eps = 1e-5, .theta = 10000.0, .tied = 0};

static float *logits_of(tz_llama *m, const int32_t *in, const int32_t *tg) {
    tz_llama_setup(m, 2, 8);
    const int64_t n = m->B * m->T * m->d.vocab;
    tz_llama_forward(m, in, tg);
    float *out = malloc((size_t)n * sizeof *out);
    m->be->download(m->be, out, tz_llama_logits(m), (size_t)n * sizeof *out);
    return out;
}

/* quantize -> save -> load -> dequantize vs quantize -> dequantize, every projection */
static void test_round_trip(tz_backend *be, const char *dense, int method, int bits) {
    char qdir[128], err[1024];
    snprintf(qdir, sizeof qdir, "%s/q_%s%d", g_dir, tz_tq_method_name(method), bits);
    FILE *devnull = fopen("/dev/null", "w");
    tz_llama_quantize_dir(dense, qdir, method, bits, 128, 9, devnull);
    fclose(devnull);
    tz_safetensors sd, sq;
    tz_tqf qf;
    check(!tz_st_open(&sd, dense, err, sizeof err) && !tz_st_open(&sq, qdir, err, sizeof err),
          "dense and quantized folders open (%s)", err);
    check(!tz_tqf_read(&qf, &sq, err, sizeof err) && qf.present && qf.n == 14 &&
              qf.method == method && qf.bits == bits && qf.group == 128 && qf.seed == 9,
          "%s %d-bit: metadata lists 14 projections (%s)", tz_tq_method_name(method), bits, err);
    tz_tq_codebook cb;
    tz_tq_codebook_init(&cb, bits, err, sizeof err);
    int same = 1, groups = 1;
    for (int64_t i = 0; i < qf.n; i++) {
        const tz_tqf_entry *e = &qf.e[i];
        const tz_st_tensor *t = tz_st_find(&sd, e->name);
        int64_t n = e->rows * e->cols;
        float *w = malloc((size_t)n * 4), *a = malloc((size_t)n * 4), *b = malloc((size_t)n * 4);
        tz_st_tensor_to_f32(t, w, err, sizeof err);
        tz_tq_tensor direct, loaded;
        tz_tq_tensor_init(&direct, bits, tz_tq_group_for(e->cols, 128), e->rows, e->cols, 9, err,
                          sizeof err);
        tz_tq_quantize_as(&direct, method, &cb, w);
        tz_tq_dequantize_as(&direct, method, &cb, a);
        tz_tqf_load(&qf, e, &loaded, err, sizeof err);
        tz_tq_dequantize_as(&loaded, method, &cb, b);
        groups &= e->group == direct.group && e->group == (e->cols == 192 ? 64 : 128);
        same &= !memcmp(a, b, (size_t)n * 4) &&
                !memcmp(direct.codes, loaded.codes, (size_t)tz_tq_codes_bytes(e->rows, e->cols, bits)) &&
                !memcmp(direct.scales, loaded.scales, (size_t)(e->rows * (e->cols / e->group)) * 2);
        tz_tq_tensor_free(&direct), tz_tq_tensor_free(&loaded);
        free(w), free(a), free(b);
    }
    check(groups, "%s %d-bit: group 128, or 64 for the rows of 192", tz_tq_method_name(method), bits);
    check(same, "%s %d-bit: quantize -> save -> load -> dequantize is bit-identical to quantize "
          "-> dequantize", tz_tq_method_name(method), bits);
    tz_tqf_free(&qf);
    tz_st_close(&sd);
    tz_st_close(&sq);

    /* the model from the folder = the model quantized at load; the F32 export matches */
    int32_t in[16], tg[16];
    for (int i = 0; i < 16; i++) in[i] = (i * 7) % 64, tg[i] = (i * 5 + 3) % 64;
    tz_model_opts o = {.lora.targets = 0x7f, .lora.rank = 2, .lora.alpha = 4.0};
    tz_llama *mf = tz_llama_load(be, qdir, &o);
    o.quant = (tz_quant_opts){.method = method, .bits = bits, .group = 128, .seed = 9};
    tz_llama *ml = tz_llama_load(be, dense, &o);
    float *lf = logits_of(mf, in, tg), *ll = logits_of(ml, in, tg);
    check(!memcmp(lf, ll, 2 * 8 * 64 * sizeof(float)),
          "%s %d-bit: the quantized folder and quantize-at-load give the same logits, bit for bit",
          tz_tq_method_name(method), bits);
    char xdir[160];
    snprintf(xdir, sizeof xdir, "%s_f32", qdir);
    devnull = fopen("/dev/null", "w");
    tz_llama_export_dequantized(qdir, xdir, devnull);
    fclose(devnull);
    tz_model_opts od = {0};
    tz_llama *mx = tz_llama_load(be, xdir, &od);
    float *lx = logits_of(mx, in, tg);
    double e = 0, s = 0;
    for (int i = 0; i < 2 * 8 * 64; i++) e = fmax(e, fabs(lx[i] - lf[i])), s = fmax(s, fabs(lf[i]));
    check(e <= 1e-5 * s, "%s %d-bit: export --dequantize (F32) gives the same logits to float "
          "rounding (%.1e)", tz_tq_method_name(method), bits, e / s);
    free(lf), free(ll), free(lx);
    tz_llama_free(mf), tz_llama_free(ml), tz_llama_free(mx);
}

/* ---- malformed files ---- */

#define NAME "model.layers.0.mlp.up_proj.weight"
static uint8_t g_codes[8 * 192];
static uint16_t g_scales[8 * 4];

/* Writes a one-tensor file: codes [8, code_w] of codes_dt, scales [8, scale_w] (scale_w 0:
 * none), metadata `meta` (NULL: none) with the tensor entry `entry`. Returns tz_tqf_read's rc. */
static int try_file(const char *label, int code_w, enum tz_dtype codes_dt, int scale_w,
                    const char *meta_fmt, const char *entry, char *err, size_t errlen) {
    char path[128], meta[1024], e2[256];
    snprintf(path, sizeof path, "%s/bad_%s.safetensors", g_dir, label);
    tz_st_writer w;
    tz_st_writer_init(&w);
    int64_t cs[2] = {8, code_w}, ss[2] = {8, scale_w};
    tz_st_writer_add(&w, NAME ".tq_codes", codes_dt, 2, cs, g_codes, e2, sizeof e2);
    if (scale_w) tz_st_writer_add(&w, NAME ".tq_scales", TZ_DT_BF16, 2, ss, g_scales, e2, sizeof e2);
    if (meta_fmt) {
        snprintf(meta, sizeof meta, meta_fmt, entry);
        tz_st_writer_set_metadata(&w, TZ_TQF_META_KEY, meta);
    }
    if (tz_st_writer_save(&w, path, e2, sizeof e2)) TZ_FATAL("%s", e2);
    tz_st_writer_free(&w);
    tz_safetensors st;
    tz_tqf q;
    if (tz_st_open(&st, path, e2, sizeof e2)) TZ_FATAL("%s", e2);
    int rc = tz_tqf_read(&q, &st, err, errlen);
    tz_tqf_free(&q);
    tz_st_close(&st);
    return rc;
}

static void test_malformed(void) {
    static const char *ok_meta =
        "{\"version\": 1, \"method\": \"turboquant\", \"codebook\": \"lloyd-max-gaussian\", "
        "\"scale_dtype\": \"bf16\", \"bits\": 4, \"group\": 64, \"seed\": 0, \"tensors\": {%s}}";
    static const struct {
        const char *label, *entry, *meta, *want;
        int code_w, scale_w;
        enum tz_dtype dt;
    } cases[] = {
        {"valid", "\"" NAME "\": {\"shape\": [8, 192], \"bits\": 4, \"group\": 64}", NULL, NULL, 96, 3, TZ_DT_U8},
        {"bits", "\"" NAME "\": {\"shape\": [8, 192], \"bits\": 5, \"group\": 64}", NULL,
         "bits 5 out of range (1..4)", 96, 3, TZ_DT_U8},
        {"group_divides", "\"" NAME "\": {\"shape\": [8, 192], \"bits\": 4, \"group\": 128}",
         NULL, "group 128 does not divide the row length 192", 96, 2, TZ_DT_U8},
        {"group_pow2", "\"" NAME "\": {\"shape\": [8, 192], \"bits\": 4, \"group\": 96}", NULL,
         "group 96 is not 64, 128 or 256", 96, 2, TZ_DT_U8},
        {"scales", "\"" NAME "\": {\"shape\": [8, 192], \"bits\": 4, \"group\": 64}", NULL,
         NAME ".tq_scales: shape [8, 2], expected [8, 3] (one bf16 scale per group of 64)", 96, 2, TZ_DT_U8},
        {"codes", "\"" NAME "\": {\"shape\": [8, 192], \"bits\": 3, \"group\": 64}", NULL,
         NAME ".tq_codes: shape [8, 96], expected [8, 72] (8 x 192 codes of 3 bits)", 96, 3, TZ_DT_U8},
        {"codes_dtype", "\"" NAME "\": {\"shape\": [8, 192], \"bits\": 4, \"group\": 64}", NULL,
         NAME ".tq_codes: dtype I8, expected U8", 96, 3, TZ_DT_I8},
        {"missing_scales", "\"" NAME "\": {\"shape\": [8, 192], \"bits\": 4, \"group\": 64}", NULL,
         NAME ".tq_scales: missing", 96, 0, TZ_DT_U8},
        {"no_meta", NULL, NULL, NAME ".tq_codes: quantized data that", 96, 3, TZ_DT_U8},
        {"not_json", "", "{\"version\": 1, %s", "is not valid JSON", 96, 3, TZ_DT_U8},
        {"method", "", "{\"version\": 1, \"method\": \"nf4\"%s}", "\"method\" is \"nf4\"", 96, 3, TZ_DT_U8},
        {"file_bits", "", "{\"version\": 1, \"method\": \"absmax\", \"codebook\": \"uniform\", "
         "\"scale_dtype\": \"bf16\", \"bits\": 0, \"group\": 64, \"seed\": 0, \"tensors\": {%s}}",
         "bits 0 out of range (1..4)", 96, 3, TZ_DT_U8},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[1024] = "", file[128];
        const char *meta = cases[i].entry ? (cases[i].meta ? cases[i].meta : ok_meta) : NULL;
        int rc = try_file(cases[i].label, cases[i].code_w, cases[i].dt, cases[i].scale_w, meta,
                          cases[i].entry, err, sizeof err);
        snprintf(file, sizeof file, "%s/bad_%s.safetensors", g_dir, cases[i].label);
        if (!cases[i].want) {
            check(rc == 0, "%s: a well-formed file is accepted (%s)", cases[i].label, err);
            continue;
        }
        check(rc != 0 && strstr(err, cases[i].want) && strstr(err, file),
              "%s: rejected with \"%s\"", cases[i].label, err);
    }
}

int main(int argc, char **argv) {
    tz_mpi_singleton_defaults();
    MPI_Init(&argc, &argv);
    tz_backend *be = tz_cpu_backend_create(2);
    snprintf(g_dir, sizeof g_dir, "tq_format_%d", (int)getpid());
    char dense[96];
    snprintf(dense, sizeof dense, "%s/dense", g_dir);
    tz_model_opts o = {0};
    tz_llama *m = tz_llama_create(be, &k_dims, &o);
    tz_llama_init_random(m, 21);
    tz_llama_save(m, dense, 0);
    tz_llama_free(m);
    test_round_trip(be, dense, TZ_TQ_TURBOQUANT, 4);
    test_round_trip(be, dense, TZ_TQ_TURBOQUANT, 3);
    test_round_trip(be, dense, TZ_TQ_ABSMAX, 2);
    test_malformed();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd) != 0) printf("warning: could not remove %s\n", g_dir);
    tz_cpu_backend_destroy(be);
    MPI_Finalize();
    return tz_check_done("tq_format");
}
