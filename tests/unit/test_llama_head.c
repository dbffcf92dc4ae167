/* The Llama head in chunks of rows (TZ_LLAMA_HEAD_FLOATS): a forward + backward with the
 * logits made a few rows at a time gives the same losses and gradients as with every row at
 * once, tied and untied, with LoRA and in full training, and the arena holds only one
 * chunk of logits. The per-row losses and the input gradients of the head are the same
 * arithmetic either way (bit for bit); the head's own weight gradient sums its rows in
 * chunks, so it differs by rounding only (relative 1e-6 of its largest element). */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/world.h"
#include "backend/registry.h"
#include "model/llama.h"
#include "tz_check.h"

static tz_llama *make(tz_backend *be, int tied, int full, int64_t head_rows_max, int64_t B,
                      int64_t T) {
    tz_llama_dims d = {.vocab = 97, .dim = 48, .hidden = 80, .n_layers = 2, .n_heads = 4,
                       .n_kv_heads = 2, .head_dim = 12, .max_pos = 64, .eps = 1e-5,
                       .theta = 10000.0, .tied = tied};
    tz_model_opts o = {.full = full, .lora.targets = full ? 0 : 0x7f, .lora.rank = full ? 0 : 4,
                       .lora.alpha = 8.0};
    tz_llama *m = tz_llama_create(be, &d, &o);
    tz_llama_init_random(m, 11);
    if (!full) {
        tz_model_init_lora(&m->params, m->be, 4);
        for (int i = 0; i < m->params.n; i++) /* nonzero B so the adapters act */
            if (strstr(m->params.p[i]->name, "lora_B"))
                for (int64_t j = 0; j < m->params.p[i]->numel; j++)
                    m->params.p[i]->w[j] = 0.02f * (float)((j % 9) - 4);
    }
    m->head_rows_max = head_rows_max;
    tz_llama_setup(m, B, T);
    return m;
}

int main(int argc, char **argv) {
    tz_mpi_singleton_defaults();
    MPI_Init(&argc, &argv);
    tz_backend *be = tz_cpu_backend_create(2);
    const int64_t B = 2, T = 16, BT = B * T, V = 97;
    int32_t in[32], tgt[32];
    for (int64_t i = 0; i < BT; i++) in[i] = (int32_t)((i * 37 + 5) % V), tgt[i] = (int32_t)((i * 53 + 1) % V);
    tgt[7] = -1; /* an ignored row inside a chunk */
    for (int tied = 0; tied < 2; tied++)
        for (int full = 0; full < 2; full++) {
            tz_llama *one = make(be, tied, full, 0, B, T), *ch = make(be, tied, full, 5, B, T);
            check(one->head_rows == BT && ch->head_rows == 5,
                  "head rows: %lld at once, %lld in chunks", (long long)one->head_rows,
                  (long long)ch->head_rows);
            const size_t saved = tz_llama_arena_bytes(one, B, T) - tz_llama_arena_bytes(ch, B, T);
            const size_t want = ((size_t)(BT * V * 4) + 63) / 64 * 64 - ((size_t)(5 * V * 4) + 63) / 64 * 64;
            check(saved == want, "the arena holds one chunk of logits: %zu bytes fewer (%zu)",
                  saved, want);
            const int64_t n = one->params.flat_numel;
            float *g1 = be->alloc(be, (size_t)n * 4), *g2 = be->alloc(be, (size_t)n * 4);
            tz_params_bind_grads(&one->params, g1);
            tz_params_bind_grads(&ch->params, g2);
            const double l1 = tz_llama_forward_backward(one, in, tgt, 0.25f);
            const double l2 = tz_llama_forward_backward(ch, in, tgt, 0.25f);
            const double f2 = tz_llama_forward(ch, in, tgt);
            check(l1 == l2 && l1 == f2 && isfinite(l1),
                  "tied %d full %d: loss %.9g at once, %.9g in chunks, forward only %.9g", tied,
                  full, l1, l2, f2);
            /* the head's weight gradient (lm_head, or the tied embedding) may differ by the
             * order of its row sums; every other gradient comes through dh, which is the
             * same bits */
            const tz_param *hp = ch->lm_head;
            const int64_t h0 = hp->g ? hp->g - g2 : 0, h1 = hp->g ? h0 + hp->numel : 0;
            double emax = 0, gmax = 0, hmax = 0, hscale = 0;
            for (int64_t i = 0; i < n; i++) {
                double e = fabs((double)g1[i] - g2[i]);
                if (i >= h0 && i < h1) {
                    if (e > hmax) hmax = e;
                    if (fabs(g1[i]) > hscale) hscale = fabs(g1[i]);
                } else if (e > emax) emax = e;
                if (fabs(g1[i]) > gmax) gmax = fabs(g1[i]);
            }
            check(gmax > 0, "tied %d full %d: gradients are nonzero (max %.3g)", tied, full,
                  gmax);
            if (hp->g) /* trained in full mode only */
                check(hscale > 0 && hmax <= 1e-6 * hscale,
                      "tied %d full %d: head weight gradient within %.2g of %.3g (tol 1e-6 rel)",
                      tied, full, hmax, hscale);
            /* tied: the embedding's gradient is the head's, already compared */
            check(emax == 0.0, "tied %d full %d: every other gradient identical (max diff %.3g)",
                  tied, full, emax);
            be->release(be, g1), be->release(be, g2);
            tz_llama_free(one), tz_llama_free(ch);
        }
    tz_backend_destroy(be);
    MPI_Finalize();
    return tz_check_done("test_llama_head");
}
