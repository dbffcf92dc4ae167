/* Test tool for tests/ref/flux_ref.py: loads a Flux transformer from a diffusers folder and
 * an inputs file (latents, noise, sigma, guidance, pooled, txt, img_ids, txt_ids), and writes
 * the flow-matching loss (sum of squared errors of the velocity against noise - latents at
 * x_t = (1 - sigma) latents + sigma noise) and every parameter's gradient, as "loss" and
 * "grad.NAME" (full fine-tuning: every weight trains), of a second call on the same model.
 * Not installed.
 * usage: tz_flux_dump MODEL_DIR INPUTS OUT [--ckpt 0|1] */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/world.h"
#include "backend/registry.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "model/flux.h"

static float *read_all(const tz_safetensors *st, const char *name, int64_t *numel, int64_t *shape0,
                       int64_t *shape1) {
    char err[1024];
    const tz_st_tensor *t = tz_st_find(st, name);
    if (!t) TZ_FATAL("inputs: no tensor %s", name);
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    float *h = tz_xmalloc((size_t)n * sizeof *h);
    if (tz_st_tensor_to_f32(t, h, err, sizeof err)) TZ_FATAL("%s", err);
    if (numel) *numel = n;
    if (shape0) *shape0 = t->ndim > 0 ? t->shape[0] : 1;
    if (shape1) *shape1 = t->ndim > 1 ? t->shape[1] : 1;
    return h;
}

int main(int argc, char **argv) {
    tz_mpi_singleton_defaults();
    MPI_Init(&argc, &argv);
    if (argc < 4) TZ_FATAL("usage: tz_flux_dump MODEL_DIR INPUTS OUT [--ckpt 0|1]");
    const int ckpt = argc > 5 && !strcmp(argv[4], "--ckpt") ? atoi(argv[5]) : 0;
    tz_backend *be = tz_cpu_backend_create(0);
    tz_model_opts o = {0};
    o.full = 1;
    o.checkpointing = ckpt;
    tz_flux *m = tz_flux_load(be, argv[1], &o);
    tz_safetensors st;
    char err[1024];
    if (tz_st_open(&st, argv[2], err, sizeof err)) TZ_FATAL("%s", err);
    int64_t nl, B, Ti, Tt;
    float *lat = read_all(&st, "latents", &nl, &B, &Ti);
    float *noise = read_all(&st, "noise", NULL, NULL, NULL);
    float *sigma = read_all(&st, "sigma", NULL, NULL, NULL);
    float *guid = read_all(&st, "guidance", NULL, NULL, NULL);
    float *pooled = read_all(&st, "pooled", NULL, NULL, NULL);
    float *txt = read_all(&st, "txt", NULL, NULL, &Tt);
    float *img_ids = read_all(&st, "img_ids", NULL, NULL, NULL);
    float *txt_ids = read_all(&st, "txt_ids", NULL, NULL, NULL);
    tz_st_close(&st);
    const int64_t per = nl / B;
    float *xt = tz_xmalloc((size_t)nl * sizeof *xt), *tgt = tz_xmalloc((size_t)nl * sizeof *tgt);
    for (int64_t b = 0; b < B; b++)
        for (int64_t k = 0; k < per; k++) {
            const int64_t i = b * per + k;
            xt[i] = (1.0f - sigma[b]) * lat[i] + sigma[b] * noise[i];
            tgt[i] = noise[i] - lat[i];
        }
    tz_flux_setup(m, B, Ti, Tt);
    float *grad = be->alloc(be, (size_t)m->params.flat_numel * sizeof(float));
    tz_params_bind_grads(&m->params, grad);
    const tz_flux_batch in = {xt, txt, pooled, sigma, guid, img_ids, txt_ids};
    /* twice, the gradients zeroed between, and the second call's loss and gradients dumped: a
     * buffer that an op adds into while it still holds the first call's values shows in the
     * second (on a first call the arena's zeros hide it) */
    (void)tz_flux_forward_backward(m, &in, tgt, 1.0f);
    be->fill(be, grad, 0.0f, m->params.flat_numel);
    const double loss = tz_flux_forward_backward(m, &in, tgt, 1.0f);
    tz_st_writer w;
    tz_st_writer_init(&w);
    const int64_t one = 1;
    if (tz_st_writer_add(&w, "loss", TZ_DT_F64, 1, &one, &loss, err, sizeof err)) TZ_FATAL("%s", err);
    char (*names)[TZ_NAME_MAX + 8] = tz_xcalloc((size_t)m->params.n, sizeof *names);
    for (int i = 0; i < m->params.n; i++) {
        const tz_param *p = m->params.p[i];
        if (!p->trainable || !p->g) continue;
        snprintf(names[i], sizeof names[i], "grad.%s", p->name);
        if (tz_st_writer_add(&w, names[i], TZ_DT_F32, p->ndim, p->shape, p->g, err, sizeof err))
            TZ_FATAL("%s", err);
    }
    if (tz_st_writer_save(&w, argv[3], err, sizeof err)) TZ_FATAL("%s", err);
    tz_st_writer_free(&w);
    printf("flux: loss %.9g, %d parameters, %lld x (%lld image + %lld text tokens)\n", loss,
           m->params.n, (long long)B, (long long)Ti, (long long)Tt);
    free(names), free(lat), free(noise), free(sigma), free(guid), free(pooled), free(txt);
    free(img_ids), free(txt_ids), free(xt), free(tgt);
    be->release(be, grad);
    tz_flux_free(m);
    tz_cpu_backend_destroy(be);
    MPI_Finalize();
    return 0;
}
