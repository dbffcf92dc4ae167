/* init-model round trip: a random Llama saved in HF layout and loaded back gives
 * bit-identical logits (tied and untied, F32); BF16 saving rounds each weight to nearest
 * even; an adapter saved and loaded gives identical logits (and its adapter_config.json
 * reads back). Load errors are fatal and tested by tests/train/train_test.sh. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/world.h"
#include "backend/registry.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/dtype.h"
#include "io/safetensors.h"
#include "model/adapter_io.h"
#include "model/llama_io.h"
#include "tz_check.h"


static float *logits_of(tz_llama *m, const int32_t *in, const int32_t *tg) {
    const int64_t n = m->B * m->T * m->d.vocab;
    tz_llama_forward(m, in, tg);
    float *out = malloc((size_t)n * sizeof *out);
    m->be->download(m->be, out, tz_llama_logits(m), (size_t)n * sizeof *out);
    return out;
}

int main(int argc, char **argv) {
    tz_mpi_singleton_defaults();
    MPI_Init(&argc, &argv);
    tz_backend *be = tz_cpu_backend_create(0);
    const int64_t B = 2, T = 11;
    int32_t in[22], tg[22];
    tz_rng r = tz_rng_make(5, 0, TZ_RNG_TEST, 0);
    for (int i = 0; i < 22; i++) in[i] = (int32_t)tz_rng_below(&r, 50), tg[i] = (int32_t)tz_rng_below(&r, 50);
    char dir[64];
    snprintf(dir, sizeof dir, "llama_io_%d", (int)getpid());

    for (int tied = 0; tied <= 1; tied++) {
        tz_llama_dims d = {.vocab = 50, .dim = 32, .hidden = 40, .n_layers = 2, .n_heads = 4,
                           .n_kv_heads = 2, .head_dim = 8, .max_pos = 64, .eps = 1e-5,
                           .theta = 500000.0, .tied = tied};
        tz_model_opts o = {0};
        tz_llama *a = tz_llama_create(be, &d, &o);
        tz_llama_init_random(a, 9);
        tz_llama_setup(a, B, T);
        float *la = logits_of(a, in, tg);
        tz_llama_save(a, dir, 0);
        tz_llama *b = tz_llama_load(be, dir, &o);
        tz_llama_setup(b, B, T);
        float *lb = logits_of(b, in, tg);
        check(!memcmp(la, lb, (size_t)(B * T * d.vocab) * sizeof(float)),
              "tied=%d: logits after save/load differ", tied);
        check(b->d.tied == tied && b->d.theta == 500000.0 && b->d.n_kv_heads == 2,
              "tied=%d: dims not read back", tied);

        /* bf16: every stored value is the round-to-nearest-even of the fp32 weight */
        tz_llama_save(a, dir, 1);
        tz_safetensors st;
        char err[1024];
        check(tz_st_open(&st, dir, err, sizeof err) == 0, "bf16 open: %s", err);
        const tz_st_tensor *t = tz_st_find(&st, "model.layers.1.mlp.down_proj.weight");
        check(t && t->dtype == TZ_DT_BF16, "bf16: down_proj missing or not BF16");
        if (t) {
            tz_param *p = tz_params_find(&a->params, "model.layers.1.mlp.down_proj.weight");
            int bad = 0;
            for (int64_t i = 0; i < p->numel; i++) {
                uint16_t h;
                memcpy(&h, (const char *)t->data + 2 * i, 2);
                bad += h != tz_f32_to_bf16(p->w[i]);
            }
            check(bad == 0, "bf16: %d values not rounded to nearest even", bad);
        }
        tz_st_close(&st);
        free(la);
        free(lb);
        tz_llama_free(b);

        /* adapters: save, load into a fresh model, same logits */
        tz_model_opts lo = {.lora.targets = 0x7f, .lora.rank = 3, .lora.alpha = 6.0};
        tz_llama *c = tz_llama_load(be, dir, &lo);
        tz_model_init_lora(&c->params, c->be, 3);
        for (int i = 0; i < c->params.n; i++) /* nonzero B so the adapter changes logits */
            if (strstr(c->params.p[i]->name, "lora_B"))
                for (int64_t j = 0; j < c->params.p[i]->numel; j++) c->params.p[i]->w[j] = 0.01f * (float)(j % 7);
        tz_llama_setup(c, B, T);
        float *lc = logits_of(c, in, tg);
        char adir[80];
        snprintf(adir, sizeof adir, "%s/adapter", dir);
        tz_adapter_save(&c->params, be, adir, tz_llama_lin_names, TZ_LIN_N, &lo.lora, dir,
                        "CAUSAL_LM");
        tz_model_opts lo2 = {0};
        tz_adapter_read_spec(adir, tz_llama_lin_names, TZ_LIN_N, &lo2.lora);
        check(lo2.lora.rank == 3 && lo2.lora.alpha == 6.0 && lo2.lora.targets == 0x7f,
              "adapter_config.json not read back (r %lld alpha %g targets %x)",
              (long long)lo2.lora.rank, lo2.lora.alpha, lo2.lora.targets);
        tz_llama *e = tz_llama_load(be, dir, &lo2);
        tz_adapter_load(&e->params, be, adir, NULL);
        tz_llama_setup(e, B, T);
        float *le = logits_of(e, in, tg);
        check(!memcmp(lc, le, (size_t)(B * T * d.vocab) * sizeof(float)),
              "tied=%d: logits with a reloaded adapter differ", tied);
        free(lc);
        free(le);
        tz_llama_free(c);
        tz_llama_free(e);
        tz_llama_free(a);
    }
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) printf("warning: could not remove %s\n", dir);
    tz_cpu_backend_destroy(be);
    MPI_Finalize();
    return tz_check_done("llama_io");
}
