/* The DiT task: labelled images (IDX or HDF5, optionally a class subset) into a DiT with a
 * diffusion loss (model/diffusion.h), adapters per lora.* or model.adapter, outputs with
 * DiT's names. The trainer's rows are images; a loss term is one squared pixel error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/fsutil.h"
#include "io/idx.h"
#include "io/images_h5.h"
#include "io/png.h"
#include "model/diffusion.h"
#include "model/dit_io.h"
#include "train/data.h"
#include "train/task.h"
#include "train/trainer.h"

typedef struct images {
    tz_image_set s;
    int64_t *idx; /* the rows of s in the class subset */
    int64_t n;
} images;

typedef struct dit_task {
    tz_task t;
    const tz_config *cfg;
    tz_dit *m;
    tz_diffusion diff;
    int training, have_val;
    images train, val;
    tz_order order;
    float *x0;
    int32_t *y;
} dit_task;

/* "0-4,7" -> keep[c] = 1; "" keeps every class. Fatal naming the key on a bad list. */
static void parse_classes(const char *spec, int64_t nclass, uint8_t *keep) {
    memset(keep, spec[0] ? 0 : 1, (size_t)nclass);
    const char *p = spec;
    while (*p) {
        char *end;
        long a = strtol(p, &end, 10), b = a;
        if (end == p) goto bad;
        p = end;
        if (*p == '-') {
            b = strtol(p + 1, &end, 10);
            if (end == p + 1) goto bad;
            p = end;
        }
        if (a < 0 || b < a || b >= nclass) goto bad;
        for (long c = a; c <= b; c++) keep[c] = 1;
        if (*p == ',') p++;
        else if (*p) goto bad;
    }
    return;
bad:
    TZ_FATAL_HINT("write labels and ranges such as \"0-4\" or \"1,3,5-7\"",
                  "data.classes = \"%s\": expected a list of classes in 0..%lld", spec,
                  (long long)nclass - 1);
}

static int is_hdf5(const char *path) {
    static const unsigned char sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    unsigned char buf[8];
    FILE *f = fopen(path, "rb");
    int yes = f && fread(buf, 1, 8, f) == 8 && !memcmp(buf, sig, 8);
    if (f) fclose(f);
    return yes;
}

static void load_images(images *im, const tz_config *cfg, const tz_dit_dims *d, const char *path,
                        const char *labels, const char *key) {
    char err[1024];
    if (!path[0]) TZ_FATAL_HINT("set it in the config or with --set", "%s is not set", key);
    int rc = is_hdf5(path) ? tz_h5_images_read(&im->s, path, d->num_classes, err, sizeof err)
             : labels[0]   ? tz_idx_load(&im->s, path, labels, d->num_classes, err, sizeof err)
                           : (snprintf(err, sizeof err,
                                       "%s is not HDF5, and an IDX image file needs its label "
                                       "file in %s_labels", path, key), 1);
    if (rc) TZ_FATAL("%s: %s", key, err);
    if (im->s.C != d->in_channels || im->s.H != d->input_size || im->s.W != d->input_size)
        TZ_FATAL("%s: %s holds %lldx%lldx%lld images, the model takes %lldx%lldx%lld", key, path,
                 (long long)im->s.C, (long long)im->s.H, (long long)im->s.W,
                 (long long)d->in_channels, (long long)d->input_size, (long long)d->input_size);
    uint8_t *keep = tz_xmalloc((size_t)d->num_classes);
    parse_classes(cfg->data.classes, d->num_classes, keep);
    im->idx = tz_xmalloc((size_t)(im->s.n > 0 ? im->s.n : 1) * sizeof *im->idx);
    for (int64_t i = 0; i < im->s.n; i++)
        if (keep[im->s.y[i]]) im->idx[im->n++] = i;
    free(keep);
    if (im->n == 0)
        TZ_FATAL("%s: %s has no image of the classes \"%s\"", key, path, cfg->data.classes);
}

static void images_free(images *im) {
    tz_image_set_free(&im->s);
    free(im->idx);
}

/* rows [first, first+n) of im (through the order when given) into x0 and y */
static void gather(dit_task *k, images *im, tz_order *order, int64_t first, int64_t n) {
    const int64_t numel = tz_image_set_numel(&im->s);
    for (int64_t i = 0; i < n; i++) {
        int64_t row = order ? tz_order_at(order, first + i) : first + i;
        int64_t j = im->idx[row];
        memcpy(k->x0 + i * numel, im->s.x + j * numel, (size_t)numel * sizeof(float));
        k->y[i] = im->s.y[j];
    }
}

static double train_rows(tz_task *t, int64_t first, float dloss) {
    dit_task *k = (dit_task *)t;
    gather(k, &k->train, &k->order, first, t->B);
    tz_dit_set_batch(k->m, t->B);
    /* draws keyed by the sample's place in the whole run: independent of the rank split */
    return tz_diffusion_train_batch(k->m, &k->diff, k->x0, k->y, (uint64_t)k->cfg->run.seed, 0,
                                    (uint64_t)first, dloss);
}

static double eval_rows(tz_task *t, int64_t first, int64_t n) {
    dit_task *k = (dit_task *)t;
    gather(k, &k->val, NULL, first, n);
    tz_dit_set_batch(k->m, n);
    return tz_diffusion_eval_batch(k->m, &k->diff, k->x0, k->y, (uint64_t)k->cfg->train.eval_seed,
                                   (uint64_t)first);
}

static void save(tz_task *t, char *out, size_t outlen) {
    dit_task *k = (dit_task *)t;
    if (k->cfg->train.mode == TZ_MODE_FULL) {
        tz_path_join(out, outlen, k->cfg->run.dir, "model");
        tz_dit_save(k->m, out, k->cfg->run.save_dtype);
    } else {
        tz_path_join(out, outlen, k->cfg->run.dir, "adapter");
        tz_dit_save_adapter(k->m, out, k->cfg->model.path);
    }
}

static void destroy(tz_task *t) {
    dit_task *k = (dit_task *)t;
    if (k->training) {
        images_free(&k->train);
        tz_order_free(&k->order);
    }
    if (k->have_val) images_free(&k->val);
    free(k->x0);
    free(k->y);
    tz_dit_free(k->m);
    free(k);
}

/* lora.targets as DiT projection bits: "all", or DiT names only. */
static int dit_targets(const tz_config *cfg) {
    int t = cfg->lora.targets;
    if (t == TZ_LORA_ALL) return (1 << TZ_DIT_LIN_N) - 1;
    if (t & TZ_LORA_LLAMA)
        TZ_FATAL_HINT("DiT's projections are qkv, proj, fc1, fc2 and adaln (or \"all\")",
                      "%s: lora.targets names Llama projections for model.arch = \"dit\"",
                      cfg->source);
    return t >> 7;
}
_Static_assert(TZ_LORA_QKV >> 7 == 1 << TZ_DIT_QKV && TZ_LORA_PROJ >> 7 == 1 << TZ_DIT_PROJ &&
                   TZ_LORA_FC1 >> 7 == 1 << TZ_DIT_FC1 && TZ_LORA_FC2 >> 7 == 1 << TZ_DIT_FC2 &&
                   TZ_LORA_ADALN >> 7 == 1 << TZ_DIT_ADALN,
               "config DiT target bits follow the DiT projection order");

/* quant.* as the model opts take it (as task_llama.c passes it). */
static tz_quant_opts quant_opts(const tz_config *cfg) {
    tz_quant_opts q = {.method = cfg->quant.method, .bits = (int)cfg->quant.bits,
                       .group = (int)cfg->quant.group, .seed = (uint64_t)cfg->quant.seed};
    return q;
}

tz_task *tz_task_dit_create(const tz_config *cfg, tz_backend *be, int training) {
    dit_task *k = tz_xcalloc(1, sizeof *k);
    k->cfg = cfg;
    k->training = training;
    tz_model_opts o = {0};
    o.full = training && cfg->train.mode == TZ_MODE_FULL;
    o.quant = quant_opts(cfg);
    o.checkpointing = cfg->train.checkpointing;
    if (cfg->model.adapter[0]) {
        tz_dit_read_adapter_opts(cfg->model.adapter, &o);
    } else if (training && cfg->train.mode == TZ_MODE_LORA) {
        o.lora_targets = dit_targets(cfg);
        o.lora_rank = cfg->lora.rank;
        o.lora_alpha = cfg->lora.alpha;
    }
    if (o.full && o.lora_targets)
        TZ_FATAL_HINT("unset model.adapter, or train with train.mode = \"lora\"",
                      "%s: train.mode = \"full\" with an adapter (model.adapter = %s)",
                      cfg->source, cfg->model.adapter);
    tz_dit *m = k->m = tz_dit_load(be, cfg->model.path, &o);
    if (cfg->model.adapter[0]) tz_dit_load_adapter(m, cfg->model.adapter);
    else if (o.lora_targets) tz_model_init_lora(&m->params, be, (uint64_t)cfg->run.seed);
    tz_diffusion_init(&k->diff, m->d.diffusion);
    const int64_t B = cfg->train.micro_batch, numel = tz_dit_image_numel(&m->d);
    tz_dit_setup(m, B);

    tz_task *t = &k->t;
    t->unit = "images";
    t->params = &m->params;
    t->arena_bytes = m->arena.cap;
    t->B = B;
    t->row_elems = numel;
    t->row_count = 1;
    snprintf(t->describe, sizeof t->describe,
             "dit %s | %lldx%lldx%lld, patch %lld, hidden %lld, depth %lld, %lld heads, %lld "
             "classes, %s | %lld params, %lld trainable (%s)",
             cfg->model.path, (long long)m->d.in_channels, (long long)m->d.input_size,
             (long long)m->d.input_size, (long long)m->d.patch_size, (long long)m->d.hidden,
             (long long)m->d.depth, (long long)m->d.num_heads, (long long)m->d.num_classes,
             m->d.diffusion == TZ_DIFF_FLOW ? "rectified flow" : "DDPM",
             (long long)m->params.n_total, (long long)m->params.n_trainable,
             training ? tz_mode_name(cfg->train.mode) : "eval");
    if (training) {
        load_images(&k->train, cfg, &m->d, cfg->data.train, cfg->data.train_labels, "data.train");
        tz_order_init(&k->order, k->train.n, (uint64_t)cfg->run.seed);
        t->n_train = k->train.n;
        snprintf(t->data_line, sizeof t->data_line, "%s: %lld images%s%s%s", cfg->data.train,
                 (long long)k->train.n, cfg->data.classes[0] ? " of classes \"" : "",
                 cfg->data.classes, cfg->data.classes[0] ? "\"" : "");
    }
    k->have_val = cfg->data.val[0] != 0;
    if (k->have_val) {
        load_images(&k->val, cfg, &m->d, cfg->data.val, cfg->data.val_labels, "data.val");
        t->n_val = k->val.n;
    }
    k->x0 = tz_xmalloc((size_t)(B * numel) * sizeof *k->x0);
    k->y = tz_xmalloc((size_t)B * sizeof *k->y);
    t->impl = k;
    t->train_rows = train_rows;
    t->eval_rows = eval_rows;
    t->save = save;
    t->destroy = destroy;
    return t;
}

int tz_sample_run(const tz_config *cfg, const tz_sample_args *a) {
    if (cfg->model.arch != TZ_ARCH_DIT)
        TZ_FATAL("%s: sample needs model.arch = \"dit\"", cfg->source);
    tz_backend *be = tz_cpu_backend_create((int)cfg->train.threads);
    tz_model_opts o = {0};
    o.quant = quant_opts(cfg);
    if (cfg->model.adapter[0]) tz_dit_read_adapter_opts(cfg->model.adapter, &o);
    tz_dit *m = tz_dit_load(be, cfg->model.path, &o);
    if (cfg->model.adapter[0]) tz_dit_load_adapter(m, cfg->model.adapter);
    if (a->cls < 0 || a->cls >= m->d.num_classes)
        TZ_FATAL("sample: --class %lld: the model has classes 0..%lld", (long long)a->cls,
                 (long long)m->d.num_classes - 1);
    if (a->guidance != 1.0 && m->d.class_dropout_prob <= 0)
        TZ_FATAL_HINT("use --guidance 1", "sample: guidance needs the null class, and %s was "
                      "trained without class dropout", cfg->model.path);
    tz_diffusion diff;
    tz_diffusion_init(&diff, m->d.diffusion);
    const int64_t numel = tz_dit_image_numel(&m->d);
    int32_t *y = tz_xmalloc((size_t)a->n * sizeof *y);
    float *img = tz_xmalloc((size_t)(a->n * numel) * sizeof *img);
    for (int64_t i = 0; i < a->n; i++) y[i] = (int32_t)a->cls;
    tz_diffusion_sample(m, &diff, y, a->n, (int)a->steps, a->guidance, (uint64_t)a->seed, img);
    char err[1024];
    if (tz_png_write_grid(a->out, img, a->n, m->d.in_channels, m->d.input_size, m->d.input_size,
                          0, 2, err, sizeof err))
        TZ_FATAL("sample: %s", err);
    tz_info("wrote %s: %lld samples of class %lld, %lld %s steps, guidance %g, seed %lld", a->out,
            (long long)a->n, (long long)a->cls, (long long)a->steps,
            m->d.diffusion == TZ_DIFF_FLOW ? "Euler" : "DDIM", a->guidance, (long long)a->seed);
    free(y);
    free(img);
    tz_dit_free(m);
    tz_cpu_backend_destroy(be);
    return 0;
}
