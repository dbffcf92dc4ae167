/* The DiT family: labelled images (IDX or HDF5, optionally a class subset) into a DiT with a
 * diffusion loss (model/diffusion.h), outputs with DiT's names; its registry entry (LoRA
 * targets, init-model presets, the sampler). The trainer's rows are images; a loss term is one
 * squared pixel error. Adapters and saving are task.c's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backend/registry.h"
#include "core/error.h"
#include "io/idx.h"
#include "io/images_h5.h"
#include "io/png.h"
#include "model/diffusion.h"
#include "model/dit_io.h"
#include "train/data.h"
#include "task/task.h"
#include "io/fsutil.h"

/* lora.targets names of the projections, in the order of TZ_DIT_* ("adaln": every block's
 * adaLN_modulation.1 and the final layer's) */
static const char *const targets[] = {"qkv", "proj", "fc1", "fc2", "adaln", NULL};
_Static_assert(sizeof targets / sizeof targets[0] == TZ_DIT_LIN_N + 1, "one name per projection");

typedef struct images {
    tz_image_set s;
    int64_t *idx; /* the rows of s in the class subset */
    int64_t n;
} images;

typedef struct dit_task {
    tz_task t;
    tz_dit *m;
    tz_diffusion diff;
    int have_val;
    images train, val;
    tz_order order;
    float *x0;
    int32_t *y;
} dit_task;

/* A model of random weights: a named shape of the family (model.path "preset:NAME"). */
static tz_dit *random_model(tz_task *t) {
    const char *path = t->cfg->model.path, *shape = tz_model_preset_name(path);
    tz_dit_dims d;
    char err[256];
    if (!shape) TZ_FATAL("model.path %s: a DiT is planned from its weights", path);
    if (tz_dit_preset(shape, &d, err, sizeof err))
        TZ_FATAL("model.path %s: no such shape of the dit family (%s)", path, err);
    tz_dit *m = tz_dit_create(t->be, &d, &t->opts);
    tz_params_fill_random(&m->params, t->be, m->levels, (uint64_t)t->cfg->run.seed);
    return m;
}

/* The model, built with the options task.c derived from the config. */
static tz_params *load(tz_task *t) {
    dit_task *k = (dit_task *)t;
    k->m = t->opts.random_base ? random_model(t)
                               : tz_dit_load(t->be, t->cfg->model.path, &t->opts);
    return &k->m->params;
}

/* A random model's training data: 64 images of normal noise with random labels. */
static void random_images(images *im, const tz_dit_dims *d, uint64_t seed) {
    memset(im, 0, sizeof *im);
    im->s.n = im->n = 64, im->s.C = d->in_channels, im->s.H = im->s.W = d->input_size;
    im->s.num_classes = d->num_classes;
    const int64_t numel = tz_image_set_numel(&im->s);
    im->s.x = tz_xmalloc((size_t)(im->n * numel) * sizeof *im->s.x);
    im->s.y = tz_xmalloc((size_t)im->n * sizeof *im->s.y);
    im->idx = tz_xmalloc((size_t)im->n * sizeof *im->idx);
    uint32_t *u = tz_xmalloc((size_t)(im->n * numel + im->n) * sizeof *u);
    tz_rng_ids(u, im->n * numel + im->n, 1 << 24, seed);
    for (int64_t i = 0; i < im->n * numel; i++) /* uniform with unit variance */
        im->s.x[i] = ((float)u[i] / 16777216.0f - 0.5f) * 3.4641016f;
    for (int64_t i = 0; i < im->n; i++) {
        im->s.y[i] = (int32_t)(u[im->n * numel + i] % (uint32_t)d->num_classes);
        im->idx[i] = i;
    }
    free(u);
}

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
    char err[8];
    FILE *f = tz_check_regular(path, err, sizeof err) ? NULL : fopen(path, "rb");
    int yes = f && fread(buf, 1, 8, f) == 8 && !memcmp(buf, sig, 8);
    if (f) fclose(f);
    return yes;
}

/* Whether path ends in one of the extensions of model checkpoints. */
static int is_checkpoint_name(const char *path) {
    static const char *const ext[] = {".pt", ".pth", ".ckpt", ".bin", ".safetensors", NULL};
    const size_t n = strlen(path);
    for (int i = 0; ext[i]; i++) {
        const size_t e = strlen(ext[i]);
        if (n > e && !strcmp(path + n - e, ext[i])) return 1;
    }
    return 0;
}

static void load_images(images *im, const tz_config *cfg, const tz_dit_dims *d, const char *path,
                        const char *labels, const char *key) {
    char err[1024];
    if (!path[0]) TZ_FATAL_HINT("set it in the config or with --set", "%s is not set", key);
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        TZ_FATAL_HINT("make one HDF5 file of the folder: python3 tools/latents.py images DIR "
                      "OUT.h5 --size S (pixels), or dit-cache (VAE latents); docs/dit.md",
                      "%s: %s is a folder; the DiT reads an IDX or HDF5 image file", key, path);
    if (is_checkpoint_name(path) && !is_hdf5(path))
        TZ_FATAL_HINT("a checkpoint is model.path's, after tools/convert_dit.py; data.* takes "
                      "images (tools/latents.py makes them)", "%s: %s looks like a model "
                      "checkpoint, not images (IDX or HDF5)", key, path);
    int rc = is_hdf5(path) ? tz_h5_images_read(&im->s, path, d->num_classes, err, sizeof err)
             : labels[0]   ? tz_idx_load(&im->s, path, labels, d->num_classes, err, sizeof err)
                           : (snprintf(err, sizeof err,
                                       "%s is not HDF5, and an IDX image file needs its label "
                                       "file in %s_labels", path, key), 1);
    if (rc) TZ_FATAL("%s: %s", key, err);
    if (im->s.C != d->in_channels || im->s.H != d->input_size || im->s.W != d->input_size)
        TZ_FATAL_HINT(im->s.C != d->in_channels && (im->s.C == 4 || d->in_channels == 4)
                          ? "4 channels are SD-VAE latents (a latent DiT such as DiT-XL/2); 1 or 3 "
                            "are pixels: the data and the model must be of the same kind"
                          : "resize the images to the model's size (tools/latents.py --size)",
                      "%s: %s holds %lldx%lldx%lld images, the model takes %lldx%lldx%lld", key,
                      path, (long long)im->s.C, (long long)im->s.H, (long long)im->s.W,
                      (long long)d->in_channels, (long long)d->input_size,
                      (long long)d->input_size);
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

static void open_task(tz_task *t) {
    dit_task *k = (dit_task *)t;
    const tz_config *cfg = t->cfg;
    tz_dit *m = k->m;
    const int64_t B = t->B, numel = tz_dit_image_numel(&m->d);
    tz_diffusion_init(&k->diff, m->d.diffusion);
    tz_dit_setup(m, B);
    t->unit = "images";
    t->row_name = "images";
    t->arena_bytes = m->arena.cap;
    tz_task_host_acts(t, &m->stack, &m->keep);
    t->row_elems = numel;
    t->row_count = 1;
    snprintf(t->describe, sizeof t->describe,
             "dit %s | %lldx%lldx%lld, patch %lld, hidden %lld, depth %lld, %lld heads, %lld "
             "classes, %s",
             cfg->model.path, (long long)m->d.in_channels, (long long)m->d.input_size,
             (long long)m->d.input_size, (long long)m->d.patch_size, (long long)m->d.hidden,
             (long long)m->d.depth, (long long)m->d.num_heads, (long long)m->d.num_classes,
             m->d.diffusion == TZ_DIFF_FLOW ? "rectified flow" : "DDPM");
    if (t->training) {
        if (t->opts.random_base) random_images(&k->train, &m->d, (uint64_t)cfg->run.seed);
        else load_images(&k->train, cfg, &m->d, cfg->data.train, cfg->data.train_labels, "data.train");
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
}

static double train_rows(tz_task *t, int64_t first, float dloss) {
    dit_task *k = (dit_task *)t;
    gather(k, &k->train, &k->order, first, t->B);
    tz_dit_set_batch(k->m, t->B);
    /* draws keyed by the sample's place in the whole run: independent of the rank split */
    return tz_diffusion_train_batch(k->m, &k->diff, k->x0, k->y, (uint64_t)t->cfg->run.seed, 0,
                                    (uint64_t)first, dloss);
}

static double train_loss(tz_task *t, int64_t first) {
    dit_task *k = (dit_task *)t;
    gather(k, &k->train, &k->order, first, t->B);
    tz_dit_set_batch(k->m, t->B);
    return tz_diffusion_train_loss(k->m, &k->diff, k->x0, k->y, (uint64_t)t->cfg->run.seed, 0,
                                   (uint64_t)first);
}

static double eval_rows(tz_task *t, int64_t first, int64_t n) {
    dit_task *k = (dit_task *)t;
    gather(k, &k->val, NULL, first, n);
    tz_dit_set_batch(k->m, n);
    return tz_diffusion_eval_batch(k->m, &k->diff, k->x0, k->y, (uint64_t)t->cfg->train.eval_seed,
                                   (uint64_t)first);
}

static void save_model(tz_task *t, const char *dir, int bf16) {
    tz_dit_save(((dit_task *)t)->m, dir, bf16);
}

static void close_task(tz_task *t) {
    dit_task *k = (dit_task *)t;
    if (t->training) {
        images_free(&k->train);
        tz_order_free(&k->order);
    }
    if (k->have_val) images_free(&k->val);
    free(k->x0);
    free(k->y);
    tz_dit_free(k->m);
}

/* sample: DDIM (DDPM) or Euler (flow) with classifier-free guidance, as a PNG grid. */
static int sample(const tz_config *cfg, const tz_sample_args *a) {
    if (a->prompts[0] || a->shift > 0)
        TZ_FATAL("sample: %s is for Flux models; a DiT is conditioned on --class",
                 a->prompts[0] ? "--prompts" : "--shift");
    tz_model_opts o;
    tz_backend *be = tz_task_forward_setup(&tz_family_dit, cfg, &o);
    tz_dit *m = tz_dit_load(be, cfg->model.path, &o);
    tz_task_load_adapters(cfg, &o, &m->params, be);
    if (a->cls < 0 || a->cls >= m->d.num_classes)
        TZ_FATAL("sample: --class %lld: the model has classes 0..%lld", (long long)a->cls,
                 (long long)m->d.num_classes - 1);
    if (a->guidance != 1.0 && m->d.class_dropout_prob <= 0)
        TZ_FATAL_HINT("use --guidance 1", "sample: guidance needs the null class, and %s was "
                      "trained without class dropout", cfg->model.path);
    const int h5 = tz_sample_out_h5(a->out);
    if (!h5 && m->d.in_channels != 1 && m->d.in_channels != 3)
        TZ_FATAL_HINT("write them with --out samples.h5 and decode them with the VAE "
                      "(tools/latents.py dit-decode, docs/dit.md)", "sample: %s makes %lld-channel "
                      "latents, not images: a PNG takes 1 or 3 channels", cfg->model.path,
                      (long long)m->d.in_channels);
    tz_diffusion diff;
    tz_diffusion_init(&diff, m->d.diffusion);
    const int64_t numel = tz_dit_image_numel(&m->d);
    int32_t *y = tz_xmalloc((size_t)a->n * sizeof *y);
    float *img = tz_xmalloc((size_t)(a->n * numel) * sizeof *img);
    for (int64_t i = 0; i < a->n; i++) y[i] = (int32_t)a->cls;
    tz_diffusion_sample(m, &diff, y, a->n, (int)a->steps, a->guidance, (uint64_t)a->seed, img);
    char err[1024];
    if (h5) { /* the model's values as sampled: latents stay in the space they were trained in */
        const tz_image_set set = {a->n, m->d.in_channels, m->d.input_size, m->d.input_size,
                                  m->d.num_classes, img, y};
        if (tz_h5_images_write(a->out, &set, 0.0, err, sizeof err)) TZ_FATAL("sample: %s", err);
    } else if (tz_png_write_grid_scaled(a->out, img, a->n, m->d.in_channels, m->d.input_size,
                                        m->d.input_size, 0, 2, a->scale > 1 ? a->scale : 1, err,
                                        sizeof err)) {
        TZ_FATAL("sample: %s", err);
    }
    tz_info("wrote %s: %lld samples of class %lld, %lld %s steps, guidance %g, seed %lld", a->out,
            (long long)a->n, (long long)a->cls, (long long)a->steps,
            m->d.diffusion == TZ_DIFF_FLOW ? "Euler" : "DDIM", a->guidance, (long long)a->seed);
    free(y);
    free(img);
    tz_dit_free(m);
    tz_backend_destroy(be);
    return 0;
}

static const char *const init_flags[] = {"--objective", NULL};
/* init-model --arch dit --preset P [--objective ddpm|flow]: a random DiT (DiT's own names). */
static int64_t init_model(const tz_init_args *a, char *about, size_t n) {
    const char *objective = tz_init_arg(a, "--objective");
    tz_dit_dims d;
    char err[512];
    if (tz_dit_preset(a->preset, &d, err, sizeof err))
        TZ_FATAL("init-model: --preset %s: %s", a->preset, err);
    if (objective && !strcmp(objective, "flow")) d.diffusion = TZ_DIFF_FLOW;
    else if (objective && strcmp(objective, "ddpm"))
        TZ_FATAL("init-model: --objective %s: expected ddpm or flow", objective);
    tz_model_opts o = {0};
    tz_dit *m = tz_dit_create(a->be, &d, &o);
    tz_dit_init_random(m, a->seed);
    tz_dit_save(m, a->out, 0);
    snprintf(about, n, "%lldx%lldx%lld images, patch %lld, hidden %lld, depth %lld, %lld heads, "
             "%lld classes, %s", (long long)d.in_channels, (long long)d.input_size,
             (long long)d.input_size, (long long)d.patch_size, (long long)d.hidden,
             (long long)d.depth, (long long)d.num_heads, (long long)d.num_classes,
             d.diffusion == TZ_DIFF_FLOW ? "rectified flow" : "DDPM");
    const int64_t count = m->params.n_total;
    tz_dit_free(m);
    return count;
}

static const tz_task_ops ops = {sizeof(dit_task), load, open_task, train_rows, eval_rows,
                                save_model, close_task, train_loss};
/* The registry entry (task/family.h): name, LoRA targets, PEFT modules, task, init-model,
 * sampler. */
const tz_family tz_family_dit = {"dit", targets, tz_dit_lin_names, &ops, init_flags, init_model,
                                 sample, NULL, NULL, NULL, "y_embedder.embedding_table", 0};
