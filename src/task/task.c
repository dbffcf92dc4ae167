/* What every family's task does the same way: the model options from the config (mode,
 * adapters, quantization), the adapters' loading or initialisation, saving the result. The
 * data and the model are each family's (task_<name>.c). */
#include "task/task.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/registry.h"
#include "core/error.h"
#include "io/fsutil.h"
#include "io/peft.h"
#include "io/run_dir.h"
#include "io/safetensors.h"
#include "io/tq_format.h"
#include "model/adapter_io.h"
#include "model/loftq.h"
#include "quant/turboquant.h"

tz_model_opts tz_task_model_opts(const tz_family *f, const tz_config *cfg, int training) {
    tz_model_opts o;
    memset(&o, 0, sizeof o);
    o.full = training && cfg->train.mode == TZ_MODE_FULL;
    o.checkpointing = cfg->train.checkpointing;
    /* evaluation and qzo (two forward passes a step) keep nothing for a backward pass */
    o.forward_only = !training || cfg->train.mode == TZ_MODE_QZO;
    o.quant.method = cfg->quant.method;
    o.quant.bits = (int)cfg->quant.bits;
    o.quant.group = (int)cfg->quant.group;
    o.quant.seed = (uint64_t)cfg->quant.seed;
    o.quant.offload_blocks = cfg->quant.offload_blocks;
    if (o.quant.offload_blocks) {
        if (!f->offload_blocks)
            TZ_FATAL_HINT("unset quant.offload_blocks", "%s: quant.offload_blocks: the %s family "
                          "does not stream block weights (flux does)", cfg->source, f->name);
        if (!o.quant.bits)
            TZ_FATAL_HINT("set quant.bits (4)", "%s: quant.offload_blocks streams quantized "
                          "codes, and the base is dense (quant.bits = 0)", cfg->source);
        if (o.full)
            TZ_FATAL_HINT("train with train.mode = \"lora\", or unset quant.offload_blocks",
                          "%s: quant.offload_blocks keeps frozen codes on the host; full "
                          "fine-tuning rewrites them every step", cfg->source);
    }
    if (cfg->model.adapter[0]) {
        tz_adapter_read_spec(cfg->model.adapter, f->modules, tz_family_n_targets(f), &o.lora);
    } else if (training && cfg->train.mode == TZ_MODE_LORA) {
        o.lora.targets = tz_family_lora_targets(f, cfg);
        o.lora.rank = cfg->lora.rank;
        o.lora.alpha = cfg->lora.alpha;
        o.lora.loftq = cfg->lora.init == TZ_LORA_INIT_LOFTQ ||
                       cfg->lora.init == TZ_LORA_INIT_LOFTQ_CALIBRATED;
        o.lora.init_seed = (uint64_t)cfg->run.seed;
        o.lora.embeddings = cfg->lora.train_embeddings;
        if (o.lora.embeddings && !f->embeddings)
            TZ_FATAL_HINT("unset lora.train_embeddings", "%s: lora.train_embeddings: the %s "
                          "family has no conditioning embeddings to train (DiT's class table "
                          "is the one there is)", cfg->source, f->name);
    }
    if (o.full && o.lora.targets)
        TZ_FATAL_HINT("unset model.adapter, or train with train.mode = \"lora\"",
                      "%s: train.mode = \"full\" with an adapter (model.adapter = %s)",
                      cfg->source, cfg->model.adapter);
    if (training && cfg->train.mode == TZ_MODE_QZO && o.lora.targets)
        TZ_FATAL_HINT("unset model.adapter (qzo trains the base's quantization scales)",
                      "%s: train.mode = \"qzo\" with an adapter (model.adapter = %s)",
                      cfg->source, cfg->model.adapter);
    return o;
}

/* "turboquant 4-bit, group 128, seed 0", or "dense". */
static void describe_quant(const tz_peft_config *c, char *buf, size_t n) {
    if (c->quant_bits <= 0) snprintf(buf, n, "dense");
    else snprintf(buf, n, "%s %d-bit, group %d, seed %llu", c->quant_method, c->quant_bits,
                  c->quant_group, (unsigned long long)c->quant_seed);
}

/* Warns when model.adapter was trained on a base quantized otherwise than this one. */
static void check_adapter_base(const tz_config *cfg, const tz_params *ps) {
    char path[1100], err[1200], was[128], is[128], diff[128] = "";
    tz_path_join(path, sizeof path, cfg->model.adapter, "adapter_config.json");
    tz_peft_config a, b;
    if (tz_peft_read(&a, path, err, sizeof err)) return; /* read and checked before */
    memset(&b, 0, sizeof b);
    tz_adapter_base_quant(ps, &b);
    const char *what = a.quant_bits != b.quant_bits                           ? "bits"
                       : a.quant_bits <= 0                                    ? NULL
                       : strcmp(a.quant_method, b.quant_method)               ? "method"
                       : a.quant_group != b.quant_group                       ? "group"
                       : a.quant_seed != b.quant_seed                         ? "seed"
                                                                              : NULL;
    if (!what) return;
    snprintf(diff, sizeof diff, "%s", what);
    describe_quant(&a, was, sizeof was);
    describe_quant(&b, is, sizeof is);
    tz_warn("model.adapter %s was trained on a %s base; this base is %s (different %s): its "
            "corrections were learnt against other weights", cfg->model.adapter, was, is, diff);
}

/* The dense weights of model.path, read one at a time for lora.init = "loftq". */
static void read_dense(void *ctx, const tz_param *p, float *w) {
    char err[1200];
    if (tz_st_read_f32((const tz_safetensors *)ctx, p->name, w, p->ndim, p->shape, err, sizeof err))
        TZ_FATAL("lora.init: the dense weights of model.path: %s", err);
}

/* The dense weights of model.path for lora.init = `init` into st: fatal, with a hint, for a
 * preset built in memory or a folder already quantized (there is no W to fit then). */
static void open_dense(const tz_config *cfg, int random_base, const char *init,
                       tz_safetensors *st) {
    char err[1200];
    const char *hint = "point model.path at the dense model and set quant.bits (quant.group, "
                       "quant.method, quant.seed) to quantize it at load, or set lora.init = "
                       "\"default\"";
    if (random_base)
        TZ_FATAL_HINT(hint, "lora.init = \"%s\" needs the dense weights of a model folder; "
                      "model.path %s is a preset built in memory", init, cfg->model.path);
    tz_tqf qf;
    if (tz_st_open(st, cfg->model.path, err, sizeof err))
        TZ_FATAL("lora.init = \"%s\": model.path: %s", init, err);
    if (tz_tqf_read(&qf, st, err, sizeof err))
        TZ_FATAL("lora.init = \"%s\": model.path: %s", init, err);
    if (qf.present)
        TZ_FATAL_HINT(hint, "lora.init = \"%s\" starts from the dense weights, but model.path "
                      "%s is already quantized (%s, %d bits)", init, cfg->model.path,
                      tz_tq_method_name(qf.method), qf.bits);
    tz_tqf_free(&qf);
}

/* lora.init = "loftq": the default init first (adapters of dense weights keep it), then each
 * quantized adapted weight re-quantized as quantize(W - s B A) with its adapter (model/
 * loftq.h), from the dense weights of model.path. Every rank computes the same bits. */
static void init_loftq(const tz_config *cfg, const tz_model_opts *o, tz_params *ps,
                       tz_backend *be, uint64_t seed) {
    tz_model_init_lora(ps, be, seed);
    tz_safetensors st;
    open_dense(cfg, o->random_base, "loftq", &st);
    tz_loftq_stats r = tz_loftq_init_params(ps, be, o->lora.alpha, o->lora.rank,
                                            seed, (int)cfg->train.threads,
                                            read_dense, &st);
    tz_st_close(&st);
    if (!r.n) {
        tz_warn("lora.init = \"loftq\": no adapted weight is quantized (quant.bits = 0): the "
                "adapters start as with lora.init = \"default\"");
        return;
    }
    tz_info("lora.init = loftq: %d quantized weights re-quantized with their adapters (rank "
            "%lld, %d alternations): ||W - Q - s B A||^2 / ||W||^2 = %.6f, quantize(W) alone "
            "%.6f (%.2fx)", r.n, (long long)o->lora.rank, TZ_LOFTQ_ITERS,
            r.err_loftq / r.ref, r.err_plain / r.ref,
            r.err_loftq > 0 ? r.err_plain / r.err_loftq : 0.0);
}

/* lora.init = "calibrated": forward passes over the first lora.calibration training rows (the
 * same on every rank) gather each adapted quantized weight's input Gram matrix, then each
 * adapter becomes the rank-r fit of W - Q in that norm (model/loftq.h); the base stays
 * quantize(W). Before the optimizer reads the adapters. */
static void init_calibrated(tz_task *t) {
    const tz_config *cfg = t->cfg;
    if (!t->train_loss || t->n_train <= 0)
        TZ_FATAL("lora.init = \"calibrated\": no training rows to calibrate on");
    tz_safetensors st;
    open_dense(cfg, t->opts.random_base, "calibrated", &st);
    const int64_t want = cfg->lora.calibration < t->n_train ? cfg->lora.calibration : t->n_train;
    tz_calib c;
    tz_calib_begin(&c, t->be, (int)cfg->train.threads);
    int64_t rows = 0;
    for (int64_t first = 0; rows < want && first + t->B <= t->n_train; first += t->B, rows += t->B)
        t->train_loss(t, first);
    tz_calib_end(&c);
    if (!rows)
        TZ_FATAL("lora.init = \"calibrated\": %lld training rows, fewer than one micro-batch "
                 "(%lld)", (long long)t->n_train, (long long)t->B);
    tz_loftq_stats r = tz_calib_init_params(t->params, t->be, &c, t->opts.lora.alpha,
                                            t->opts.lora.rank, t->opts.lora.init_seed,
                                            (int)cfg->train.threads, read_dense, &st);
    tz_calib_free(&c);
    tz_st_close(&st);
    if (!r.n) {
        tz_warn("lora.init = \"calibrated\": no adapted weight is quantized (quant.bits = 0): "
                "the adapters start as with lora.init = \"default\"");
        return;
    }
    tz_info("lora.init = calibrated: %d quantized weights' adapters fitted on the inputs of %lld "
            "training %s: output error ||X (W - Q - s B A)^T||^2 / ||X W^T||^2 = %.6f, "
            "the base Q alone %.6f (%.2fx)", r.n, (long long)rows, t->row_name,
            r.err_loftq / r.ref, r.err_plain / r.ref,
            r.err_loftq > 0 ? r.err_plain / r.err_loftq : 0.0);
}

tz_backend *tz_task_forward_setup(const tz_family *f, const tz_config *cfg, tz_model_opts *o) {
    tz_backend *be = tz_backend_create(cfg->run.device, 0, (int)cfg->train.threads);
    tz_backend_set_precision(be, cfg->run.precision);
    *o = tz_task_model_opts(f, cfg, 0);
    o->checkpointing = 0;
    return be;
}

void tz_task_load_adapters(const tz_config *cfg, const tz_model_opts *o, tz_params *ps,
                           tz_backend *be) {
    if (cfg->model.adapter[0]) check_adapter_base(cfg, ps);
    /* loftq changes the base as well: made again under model.adapter (the adapter's rank,
     * alpha and first adapters' seed, as its adapter_config.json records them), so an adapter
     * trained on a loftq base is used on that base whatever this config's lora.init says */
    const int want = cfg->lora.init == TZ_LORA_INIT_LOFTQ ||
                     cfg->lora.init == TZ_LORA_INIT_LOFTQ_CALIBRATED;
    if (cfg->model.adapter[0]) {
        int loftq = o->lora.loftq;
        uint64_t seed = o->lora.init_seed;
        const int shapes = o->random_base; /* no weights to re-quantize */
        if (loftq < 0) loftq = want, seed = (uint64_t)cfg->run.seed; /* not recorded */
        else if (loftq != want && o->lora.targets && !shapes)
            tz_warn("model.adapter %s was trained with lora.init = \"%s\" (its "
                    "adapter_config.json): its base is made so; lora.init = \"%s\" here is not "
                    "used", cfg->model.adapter, loftq ? "loftq" : "default",
                    want ? "loftq" : "default");
        if (o->lora.targets && loftq && !shapes) init_loftq(cfg, o, ps, be, seed);
        tz_adapter_load(ps, be, cfg->model.adapter, cfg->model.path);
    } else if (o->lora.targets && want) {
        init_loftq(cfg, o, ps, be, (uint64_t)cfg->run.seed);
    } else if (o->lora.targets) {
        tz_model_init_lora(ps, be, (uint64_t)cfg->run.seed);
    }
}

void tz_task_save(tz_task *t, const char *dir, char *out, size_t outlen) {
    const tz_config *cfg = t->cfg;
    const int full = cfg->train.mode == TZ_MODE_FULL || cfg->train.mode == TZ_MODE_QZO;
    char tmp[1200], err[2400];
    tz_path_join(out, outlen, dir, full ? "model" : "adapter");
    /* the folder is written under a temporary name and renamed whole: its files always
     * belong together (never new weights beside an old adapter_config.json) */
    if (tz_dir_make_temp(out, tmp, sizeof tmp, err, sizeof err)) TZ_FATAL("%s", err);
    if (full) {
        t->family->task->save_model(t, tmp, cfg->run.save_dtype);
    } else {
        const tz_family *f = t->family;
        tz_adapter_save(t->params, t->be, tmp, f->modules, tz_family_n_targets(f), &t->opts.lora,
                        cfg->model.path, f->peft_task_type);
        if (f->diffusers_component) {
            char p[1300];
            tz_path_join(p, sizeof p, tmp, "pytorch_lora_weights.safetensors");
            tz_adapter_save_diffusers(t->params, t->be, p, f->diffusers_component, &t->opts.lora);
        }
    }
    if (tz_dir_commit(tmp, out, err, sizeof err)) TZ_FATAL("%s", err);
}

tz_task *tz_task_create(const tz_config *cfg, tz_backend *be, int training, int shapes) {
    const tz_family *f = tz_family_of(cfg);
    const tz_task_ops *ops = f->task;
    tz_task *t = tz_xcalloc(1, ops->size);
    t->family = f;
    t->cfg = cfg;
    t->be = be;
    t->training = training;
    t->opts = tz_task_model_opts(f, cfg, training);
    t->opts.random_base = shapes || tz_model_preset_name(cfg->model.path) != NULL;
    t->params = ops->load(t);
    tz_task_load_adapters(cfg, &t->opts, t->params, be);
    t->B = cfg->train.micro_batch;
    ops->open(t);
    t->train_loss = ops->train_loss;
    if (training && cfg->train.mode == TZ_MODE_LORA && !cfg->model.adapter[0] && !be->plan &&
        (cfg->lora.init == TZ_LORA_INIT_CALIBRATED ||
         cfg->lora.init == TZ_LORA_INIT_LOFTQ_CALIBRATED))
        init_calibrated(t);
    size_t used = strlen(t->describe);
    const int qzo = training && cfg->train.mode == TZ_MODE_QZO; /* the scales train */
    snprintf(t->describe + used, sizeof t->describe - used,
             " | %lld params, %lld trainable (%s)", (long long)t->params->n_total,
             (long long)(qzo ? tz_params_count_scales(t->params) : t->params->n_trainable),
             training ? tz_mode_name(cfg->train.mode) : "eval");
    t->train_rows = ops->train_rows;
    t->eval_rows = ops->eval_rows;
    t->train_loss = ops->train_loss;
    return t;
}

void tz_task_free(tz_task *t) {
    t->family->task->close(t);
    free(t);
}

void tz_task_host_acts(tz_task *t, const tz_layer_stack *s, const tz_att_keep *k) {
    const size_t streams = tz_layer_stack_host_bytes(s);
    t->host_act_bytes = streams + k->host_bytes;
    t->host_act_what = !k->host_bytes ? "the checkpointed residual streams"
                       : streams      ? "the checkpointed residual streams and attention's outputs"
                                      : "attention's outputs";
}
