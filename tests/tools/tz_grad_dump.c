/* Test tool: loss and every trainable gradient of a Llama on one random batch (a second call
 * on the same model), written to a safetensors file for tests/ref/llama_ref.py to compare
 * with PyTorch. Not installed. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/world.h"
#include "backend/registry.h"
#include "core/error.h"
#include "core/rng.h"
#include "io/safetensors.h"
#include "model/llama_io.h"

static const char *arg(int argc, char **argv, const char *name, const char *def) {
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], name)) return argv[i + 1];
    return def;
}

int main(int argc, char **argv) {
    tz_mpi_singleton_defaults();
    MPI_Init(&argc, &argv);
    const char *model = arg(argc, argv, "--model", NULL), *out = arg(argc, argv, "--out", NULL);
    if (!model || !out) TZ_FATAL("usage: tz_grad_dump --model DIR --out FILE [--mode lora|full] "
                                 "[--B n] [--T n] [--seed s] [--targets bits] [--rank r] "
                                 "[--alpha a] [--ckpt 0|1]");
    int full = !strcmp(arg(argc, argv, "--mode", "lora"), "full");
    int64_t B = atoll(arg(argc, argv, "--B", "2")), T = atoll(arg(argc, argv, "--T", "9"));
    uint64_t seed = (uint64_t)atoll(arg(argc, argv, "--seed", "1"));
    tz_model_opts o = {0};
    o.full = full;
    o.lora.targets = full ? 0 : atoi(arg(argc, argv, "--targets", "127"));
    o.lora.rank = atoll(arg(argc, argv, "--rank", "4"));
    o.lora.alpha = atof(arg(argc, argv, "--alpha", "8"));
    o.checkpointing = atoi(arg(argc, argv, "--ckpt", "0"));
    tz_backend *be = tz_cpu_backend_create(0);
    tz_llama *m = tz_llama_load(be, model, &o);
    tz_model_init_lora(&m->params, m->be, seed);
    /* B = 0 would make every lora_A gradient zero: give B random values for the check */
    for (int i = 0; i < m->params.n; i++) {
        tz_param *p = m->params.p[i];
        if (!p->adapter || !strstr(p->name, "lora_B")) continue;
        tz_rng r = tz_rng_make(seed, (uint64_t)i, TZ_RNG_TEST, 0);
        float *h = tz_xmalloc((size_t)p->numel * sizeof *h);
        for (int64_t j = 0; j < p->numel; j++) h[j] = (float)(0.05 * tz_rng_normal(&r));
        be->upload(be, p->w, h, (size_t)p->numel * sizeof *h);
        free(h);
    }
    tz_llama_setup(m, B, T);
    float *grad = be->alloc(be, (size_t)m->params.flat_numel * sizeof(float));
    tz_params_bind_grads(&m->params, grad);
    int32_t *in = tz_xmalloc((size_t)(B * T) * sizeof *in), *tg = tz_xmalloc((size_t)(B * T) * sizeof *tg);
    tz_rng r = tz_rng_make(seed, 0, TZ_RNG_TEST, 1);
    int64_t count = 0;
    for (int64_t i = 0; i < B * T; i++) {
        in[i] = (int32_t)tz_rng_below(&r, (uint64_t)m->d.vocab);
        tg[i] = i % 7 == 3 ? -1 : (int32_t)tz_rng_below(&r, (uint64_t)m->d.vocab); /* some ignored */
        count += tg[i] >= 0;
    }
    /* twice, the gradients zeroed between, and the second call's loss and gradients dumped: a
     * buffer that an op adds into while it still holds the first call's values shows in the
     * second (on a first call the arena's zeros hide it) */
    (void)tz_llama_forward_backward(m, in, tg, (float)(1.0 / (double)count));
    be->fill(be, grad, 0.0f, m->params.flat_numel);
    double loss = tz_llama_forward_backward(m, in, tg, (float)(1.0 / (double)count)) / (double)count;

    tz_st_writer w;
    tz_st_writer_init(&w);
    char err[1024], name[300];
    float lossf = (float)loss;
    int64_t one = 1, bt[2] = {B, T};
    tz_st_writer_add(&w, "loss", TZ_DT_F32, 1, &one, &lossf, err, sizeof err);
    tz_st_writer_add(&w, "inputs", TZ_DT_I32, 2, bt, in, err, sizeof err);
    tz_st_writer_add(&w, "targets", TZ_DT_I32, 2, bt, tg, err, sizeof err);
    float **bufs = tz_xcalloc((size_t)m->params.n * 2, sizeof *bufs);
    int nb = 0;
    for (int i = 0; i < m->params.n; i++) {
        tz_param *p = m->params.p[i];
        if (p->adapter) {
            bufs[nb] = tz_xmalloc((size_t)p->numel * sizeof(float));
            be->download(be, bufs[nb], p->w, (size_t)p->numel * sizeof(float));
            snprintf(name, sizeof name, "w:%s", p->name);
            if (tz_st_writer_add(&w, name, TZ_DT_F32, p->ndim, p->shape, bufs[nb++], err, sizeof err)) TZ_FATAL("%s", err);
        }
        if (p->g) {
            bufs[nb] = tz_xmalloc((size_t)p->numel * sizeof(float));
            be->download(be, bufs[nb], p->g, (size_t)p->numel * sizeof(float));
            snprintf(name, sizeof name, "g:%s", p->name);
            if (tz_st_writer_add(&w, name, TZ_DT_F32, p->ndim, p->shape, bufs[nb++], err, sizeof err)) TZ_FATAL("%s", err);
        }
    }
    if (tz_st_writer_save(&w, out, err, sizeof err)) TZ_FATAL("%s", err);
    printf("loss %.8f over %lld tokens; %d tensors written to %s\n", loss, (long long)count, nb, out);
    for (int i = 0; i < nb; i++) free(bufs[i]);
    free(bufs); free(in); free(tg);
    tz_st_writer_free(&w);
    be->release(be, grad);
    tz_llama_free(m);
    tz_cpu_backend_destroy(be);
    MPI_Finalize();
    return 0;
}
