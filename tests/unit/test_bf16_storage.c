/* bf16 storage on a backend with bf16 GEMM operands: frozen dense matrices kept in bf16
 * (tz_param.w16) and, with activation checkpointing, the saved residual streams kept in bf16
 * (tz_layer_stack.x16). A GPU does this when run.precision is bf16; here the CPU backend is
 * told its GEMM operand type is bf16 (its GEMMs stay fp32), which runs the same storage code
 * with exact fp32 arithmetic around it, so every difference below comes from storage alone.
 *
 * Against a fp32 model holding the same bf16-rounded weights (so the weights agree exactly):
 *  - memory: each frozen matrix takes 2 bytes per element, the streams half, plus two fp32
 *    work streams; the arena shrinks by exactly that;
 *  - the forward pass alone and the forward of forward+backward give the same loss bit for
 *    bit (the recomputation in backward reads the same rounded streams);
 *  - loss and LoRA gradients differ only by the rounding of the residual stream between
 *    layers (relative 2^-9 per element, five layers deep, partly averaging out): loss within
 *    1e-4 relative, gradients within 1e-2 in norm (about 3e-7 and 1e-3 seen), and not equal
 *    (the rounding happened);
 *  - without checkpointing nothing is rounded between layers: identical to the fp32 model. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/world.h"
#include "backend/registry.h"
#include "core/dtype.h"
#include "model/llama.h"
#include "tz_check.h"

enum { B = 2, T = 12, V = 61 };
static const tz_llama_dims k_dims = {.vocab = V, .dim = 64, .hidden = 96, .n_layers = 5,
                                     .n_heads = 4, .n_kv_heads = 2, .head_dim = 16,
                                     .max_pos = 64, .eps = 1e-5, .theta = 10000.0, .tied = 0};

static tz_llama *make(tz_backend *be, int checkpointing) {
    tz_model_opts o = {.lora.targets = 0x7f, .lora.rank = 4, .lora.alpha = 8.0,
                       .checkpointing = checkpointing};
    tz_llama *m = tz_llama_create(be, &k_dims, &o);
    tz_llama_init_random(m, 7);
    tz_model_init_lora(&m->params, m->be, 3);
    for (int i = 0; i < m->params.n; i++) { /* nonzero B so the adapters act */
        tz_param *p = m->params.p[i];
        if (!strstr(p->name, "lora_B")) continue;
        float *h = malloc((size_t)p->numel * sizeof *h);
        for (int64_t j = 0; j < p->numel; j++) h[j] = 0.03f * (float)((j % 7) - 3);
        tz_param_upload(m->be, p, h, 0, p->numel);
        free(h);
    }
    return m;
}

/* the fp32 model's frozen matrices rounded to bf16, as the bf16 model stores them */
static void round_frozen(tz_llama *m) {
    for (int i = 0; i < m->params.n; i++) {
        tz_param *p = m->params.p[i];
        if (p->trainable || p->adapter || p->ndim != 2 || p->q) continue;
        float *h = malloc((size_t)p->numel * sizeof *h);
        tz_param_download(m->be, p, h);
        for (int64_t j = 0; j < p->numel; j++) h[j] = tz_bf16_to_f32(tz_f32_to_bf16(h[j]));
        tz_param_upload(m->be, p, h, 0, p->numel);
        free(h);
    }
}

static double run(tz_llama *m, const int32_t *in, const int32_t *tgt, float **g) {
    *g = m->be->alloc(m->be, (size_t)m->params.flat_numel * sizeof(float));
    tz_params_bind_grads(&m->params, *g);
    return tz_llama_forward_backward(m, in, tgt, 1.0f / (B * T));
}

int main(int argc, char **argv) {
    tz_mpi_singleton_defaults();
    MPI_Init(&argc, &argv);
    tz_backend *b32 = tz_cpu_backend_create(2), *b16 = tz_cpu_backend_create(2);
    b16->matmul_dtype = TZ_DT_BF16; /* storage as on a GPU; the CPU's GEMMs stay fp32 */
    int32_t in[B * T], tgt[B * T];
    for (int i = 0; i < B * T; i++) in[i] = (i * 29 + 3) % V, tgt[i] = (i * 17 + 11) % V;
    for (int ck = 1; ck >= 0; ck--) {
        tz_llama *m32 = make(b32, ck), *m16 = make(b16, ck);
        round_frozen(m32);
        size_t w32 = 0, w16 = 0, want = 0;
        int flagged = 1;
        for (int i = 0; i < m16->params.n; i++) {
            const tz_param *p = m16->params.p[i];
            const int frozen_matrix = !p->trainable && !p->adapter && p->ndim == 2;
            flagged &= p->w16 == frozen_matrix;
            w16 += p->bytes, w32 += m32->params.p[i]->bytes;
            want += (size_t)p->numel * (frozen_matrix ? 2 : 4);
        }
        check(flagged && w16 == want && w32 > w16,
              "ck %d: frozen matrices in bf16: weights %zu bytes (fp32 model %zu)", ck, w16, w32);
        tz_llama_setup(m32, B, T);
        tz_llama_setup(m16, B, T);
        const int64_t S = B * T * k_dims.dim, L = k_dims.n_layers;
        const size_t f = sizeof(float), al = 63, a16 = (((size_t)(S + 1) / 2 * f + al) & ~al),
                     a32 = ((size_t)S * f + al) & ~al;
        const size_t saved = ck ? (size_t)(L + 1) * (a32 - a16) - 2 * a32 : 0;
        const size_t d = m32->arena.cap - m16->arena.cap;
        check(m16->stack.x16 == ck && d == saved && (!ck || saved > 0),
              "ck %d: streams %s, arena %zu bytes smaller (expected %zu)", ck,
              m16->stack.x16 ? "in bf16" : "in fp32", d, saved);
        float *g32, *g16;
        const double l32 = run(m32, in, tgt, &g32), l16 = run(m16, in, tgt, &g16);
        const double f16 = tz_llama_forward(m16, in, tgt);
        check(f16 == l16, "ck %d: forward alone = forward of forward+backward (%.9g)", ck, l16);
        double dn = 0, gn = 0;
        for (int64_t i = 0; i < m32->params.flat_numel; i++)
            dn += ((double)g16[i] - g32[i]) * ((double)g16[i] - g32[i]),
                gn += (double)g32[i] * g32[i];
        const double le = fabs(l16 - l32) / fabs(l32), ge = sqrt(dn / gn);
        if (ck) {
            check(le > 0 && le <= 1e-4, "ck 1: loss %.9g vs %.9g, relative %.2e (tol 1e-4)", l16,
                  l32, le);
            check(gn > 0 && ge > 0 && ge <= 1e-2, "ck 1: LoRA gradients within %.2e in norm (tol 1e-2)",
                  ge);
        } else {
            check(le == 0 && ge == 0, "ck 0: loss and gradients identical to the fp32 model "
                  "(%.2e, %.2e)", le, ge);
        }
        b32->release(b32, g32), b16->release(b16, g16);
        tz_llama_free(m32), tz_llama_free(m16);
    }
    tz_backend_destroy(b32);
    tz_backend_destroy(b16);
    MPI_Finalize();
    return tz_check_done("test_bf16_storage");
}
