/* Generation with a key/value cache: the logits tz_llama_decode gives for each new token
 * equal those of the full forward pass over the same prefix (to rounding), so greedy
 * generation is the argmax continuation of the forward pass without a cache; for the default
 * and the llama3 RoPE, with LoRA adapters, prefill in one piece or in chunks. The ops under it:
 * rope_tab_fwd with the theta table at offset 0 is rope_fwd bit for bit, and at an offset it
 * is the same rows of a longer sequence; attention_cache_fwd over a cache of exactly the
 * sequence is attention_fwd bit for bit. And `generate` prints every byte of its text when
 * tokens are long (30 tokens of 100 bytes each: the text once stopped at 1,215 bytes). */
#include <fcntl.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comm/world.h"
#include "backend/registry.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/llama.h"
#include "model/llama_io.h"
#include "task/family.h"
#include "tz_check.h"
#include "tz_files.h"

static void fill(float *x, int64_t n, uint64_t seed) {
    tz_rng r = tz_rng_make(seed, 0, TZ_RNG_TEST, 0);
    for (int64_t i = 0; i < n; i++) x[i] = (float)tz_rng_normal(&r);
}

static void check_ops(tz_backend *be) {
    const int64_t B = 2, T = 13, H = 3, D = 16, Hkv = 1;
    const int64_t n = B * T * H * D;
    float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    fill(x, n, 1);
    memcpy(y, x, (size_t)n * sizeof *x);
    tz_llama_dims d = {.head_dim = D, .theta = 10000.0};
    float inv[8];
    tz_llama_inv_freq(&d, inv);
    be->rope_fwd(be, x, B, T, H, D, 10000.0f);
    be->rope_tab_fwd(be, y, B, T, H, D, inv, 0);
    check(!memcmp(x, y, (size_t)n * sizeof *x), "rope_tab_fwd(theta table, 0) == rope_fwd");
    /* offset 5: rows 5.. of a sequence of T (one sequence) */
    fill(x, n, 2);
    memcpy(y, x + 5 * H * D, (size_t)((T - 5) * H * D) * sizeof *x);
    be->rope_tab_fwd(be, x, 1, T, H, D, inv, 0);
    be->rope_tab_fwd(be, y, 1, T - 5, H, D, inv, 5);
    check(!memcmp(x + 5 * H * D, y, (size_t)((T - 5) * H * D) * sizeof *x),
          "rope_tab_fwd at offset 5 == rows 5.. of the whole sequence");
    be->rope_tab_bwd(be, y, 1, T - 5, H, D, inv, 5);
    fill(x, n, 2);
    double worst = 0;
    for (int64_t i = 0; i < (T - 5) * H * D; i++)
        worst = fmax(worst, fabs(y[i] - x[5 * H * D + i]));
    check(worst < 1e-5, "rope_tab_bwd undoes rope_tab_fwd (max diff %.2e)", worst);
    /* attention over a cache holding exactly the sequence */
    const int64_t nq = B * T * H * D, nk = B * T * Hkv * D;
    float *q = malloc((size_t)nq * 4), *k = malloc((size_t)nk * 4), *v = malloc((size_t)nk * 4);
    float *o1 = malloc((size_t)nq * 4), *o2 = malloc((size_t)nq * 4), *lse = malloc((size_t)(B * H * T) * 4);
    fill(q, nq, 3), fill(k, nk, 4), fill(v, nk, 5);
    be->attention_fwd(be, o1, lse, q, k, v, B, T, H, Hkv, D, 1, NULL);
    be->attention_cache_fwd(be, o2, q, k, v, B, T, T, 0, H, Hkv, D, 0);
    check(!memcmp(o1, o2, (size_t)nq * 4), "attention_cache_fwd(pos0 0, S = T) == attention_fwd");
    /* the last 4 queries of sequence 0 against a longer cache (capacity T + 3) */
    const int64_t S = T + 3, kvd = Hkv * D;
    float *kc = calloc((size_t)(S * kvd), 4), *vc = calloc((size_t)(S * kvd), 4);
    memcpy(kc, k, (size_t)(T * kvd) * 4), memcpy(vc, v, (size_t)(T * kvd) * 4);
    be->attention_cache_fwd(be, o2, q + (T - 4) * H * D, kc, vc, 1, 4, S, T - 4, H, Hkv, D, 0);
    worst = 0;
    for (int64_t i = 0; i < 4 * H * D; i++)
        worst = fmax(worst, fabs(o2[i] - o1[(T - 4) * H * D + i]));
    check(worst < 1e-5, "attention_cache_fwd at an offset == the rows of the whole sequence "
          "(max diff %.2e)", worst);
    /* a bf16 cache (kv16): the fp32 cache's values rounded, then widened, bit for bit; the
     * slots past the filled ones hold NaN and must not be read */
    uint16_t *k16 = malloc((size_t)(S * kvd) * 2), *v16 = malloc((size_t)(S * kvd) * 2);
    be->to_bf16(be, k16, kc, T * kvd), be->to_bf16(be, v16, vc, T * kvd);
    for (int64_t i = T * kvd; i < S * kvd; i++) k16[i] = v16[i] = 0x7fc0;
    for (int64_t i = 0; i < T * kvd; i++)
        kc[i] = tz_bf16_to_f32(k16[i]), vc[i] = tz_bf16_to_f32(v16[i]);
    float *o3 = malloc((size_t)(4 * H * D) * 4);
    be->attention_cache_fwd(be, o2, q + (T - 4) * H * D, kc, vc, 1, 4, S, T - 4, H, Hkv, D, 0);
    be->attention_cache_fwd(be, o3, q + (T - 4) * H * D, k16, v16, 1, 4, S, T - 4, H, Hkv, D, 1);
    check(!memcmp(o2, o3, (size_t)(4 * H * D) * 4), "attention_cache_fwd over a bf16 cache == "
          "over its values widened to fp32");
    free(x), free(y), free(q), free(k), free(v), free(o1), free(o2), free(lse), free(kc), free(vc);
    free(k16), free(v16), free(o3);
}

static int64_t argmax(const float *x, int64_t n) {
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Greedy generation of G tokens after P prompt tokens (prefill in chunks of `chunk`), then
 * one forward pass over prompt + all but the last generated token. */
static void check_model(tz_backend *be, const tz_llama_dims *d, const tz_model_opts *o,
                        int64_t chunk, const char *what) {
    const int64_t P = 7, G = 12, V = d->vocab, N = P + G;
    tz_llama *m = tz_llama_create(be, d, o);
    tz_llama_init_random(m, 11);
    for (int i = 0; i < m->params.n; i++) { /* non-zero LoRA B: the adapters count */
        tz_param *p = m->params.p[i];
        /* Qwen2's biases and Qwen3's q/k norms: random too, not zeros and ones */
        const int extra = strstr(p->name, ".bias") || strstr(p->name, "q_norm") ||
                          strstr(p->name, "k_norm");
        if (!p->adapter && !extra) continue;
        float *h = malloc((size_t)p->numel * sizeof *h);
        fill(h, p->numel, 20 + (uint64_t)i);
        for (int64_t j = 0; j < p->numel; j++)
            h[j] = strstr(p->name, "_norm") ? 1.0f + 0.3f * h[j] : h[j] * 0.05f;
        be->upload(be, p->w, h, (size_t)p->numel * sizeof *h);
        free(h);
    }
    int32_t seq[32], tg[32] = {0};
    tz_rng r = tz_rng_make(3, 0, TZ_RNG_TEST, 0);
    for (int64_t i = 0; i < P; i++) seq[i] = (int32_t)tz_rng_below(&r, (uint64_t)V);
    float *dec = malloc((size_t)(G * V) * sizeof *dec);
    tz_llama_setup(m, 1, chunk);
    tz_llama_cache c;
    tz_llama_cache_init(m, &c, N);
    const float *lg = NULL;
    for (int64_t i = 0; i < P; i += chunk)
        lg = tz_llama_decode(m, &c, seq + i, P - i < chunk ? P - i : chunk);
    for (int64_t g = 0; g < G; g++) {
        be->download(be, dec + g * V, lg, (size_t)V * sizeof *dec);
        seq[P + g] = (int32_t)argmax(dec + g * V, V);
        if (g + 1 < G) lg = tz_llama_decode(m, &c, seq + P + g, 1);
    }
    check(c.len == N - 1, "%s: the cache holds %lld positions, expected %lld", what,
          (long long)c.len, (long long)(N - 1));
    tz_llama_cache_free(m, &c);
    tz_llama_setup(m, 1, N - 1);
    tz_llama_forward(m, seq, tg);
    float *full = malloc((size_t)((N - 1) * V) * sizeof *full);
    be->download(be, full, tz_llama_logits(m), (size_t)((N - 1) * V) * sizeof *full);
    double worst = 0, scale = 0;
    int same = 1;
    for (int64_t g = 0; g < G; g++) {
        const float *ref = full + (P - 1 + g) * V;
        same &= argmax(ref, V) == seq[P + g];
        for (int64_t j = 0; j < V; j++) {
            worst = fmax(worst, fabs(ref[j] - dec[g * V + j]));
            scale = fmax(scale, fabs(ref[j]));
        }
    }
    check(same, "%s: greedy tokens with the cache == argmax of the forward pass", what);
    check(worst <= 1e-5 * scale + 1e-6, "%s: logits with the cache == forward pass (max diff "
          "%.2e, max |logit| %.2e)", what, worst, scale);
    free(dec), free(full);
    tz_llama_free(m);
}

/* GPT-2's byte-to-unicode map (printable bytes stand for themselves, the rest 256 + k). */
static unsigned bmap(int b) {
    int k = 0;
    for (int c = 0; c < 256; c++) {
        int keep = (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255);
        if (c == b) return keep ? (unsigned)c : 256u + (unsigned)k;
        if (!keep) k++;
    }
    return 0;
}

/* generate with a model folder whose tokenizer's id 0 is a piece of 100 bytes and whose
 * final norm is zero, so every logit is 0 and greedy decoding picks id 0 each time: the
 * output must be 30 copies of the piece and a newline, byte for byte. */
static void check_long_tokens(tz_backend *be) {
    enum { PIECE = 100, NEW = 30 };
    char dir[64], piece[PIECE + 1];
    snprintf(dir, sizeof dir, "gen_long_%d", (int)getpid());
    mkdir(dir, 0755);
    for (int i = 0; i < PIECE; i++) piece[i] = "abcdefghijklmnopqrstuvwxyz0123456789"[i % 36];
    piece[PIECE] = 0;
    tz_llama_dims d = {.vocab = 257, .dim = 32, .hidden = 48, .n_layers = 1, .n_heads = 2,
                       .n_kv_heads = 1, .head_dim = 16, .max_pos = 64, .eps = 1e-5,
                       .theta = 10000.0, .tied = 0};
    tz_model_opts o = {0};
    tz_llama *m = tz_llama_create(be, &d, &o);
    tz_llama_init_random(m, 5);
    float zero[32] = {0};
    tz_param_upload(be, m->final_norm, zero, 0, d.dim);
    tz_llama_save(m, dir, 0);
    tz_llama_free(m);
    /* byte-level BPE: id 0 the long piece, ids 1..256 the bytes, no merges */
    char *j = malloc(1 << 14);
    int n = sprintf(j, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"%s\": 0", piece);
    for (int b = 0; b < 256; b++) {
        unsigned c = bmap(b);
        if (c == '"' || c == '\\') n += sprintf(j + n, ", \"\\%c\": %d", (char)c, b + 1);
        else n += sprintf(j + n, ", \"\\u%04x\": %d", c, b + 1);
    }
    sprintf(j + n, "}, \"merges\": []}, \"pre_tokenizer\": {\"type\": \"ByteLevel\", "
                   "\"add_prefix_space\": false, \"use_regex\": true}, \"decoder\": "
                   "{\"type\": \"ByteLevel\"}}");
    tz_put(tz_tpath(dir, "tokenizer.json"), j);
    free(j);
    static tz_config cfg;
    tz_config_defaults(&cfg);
    snprintf(cfg.model.path, sizeof cfg.model.path, "%s", dir);
    tz_generate_args a = {.prompt = "hi", .max_new = NEW, .temperature = 0.0, .top_p = 1.0};
    /* its stdout into a file */
    const char *outp = tz_tpath(dir, "out.txt");
    fflush(stdout);
    int keep = dup(1), fd = open(outp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    close(fd);
    int rc = tz_family_llama.generate(&cfg, &a);
    fflush(stdout);
    dup2(keep, 1);
    close(keep);
    static char got[2 * NEW * PIECE], want[NEW * PIECE + 2];
    FILE *f = fopen(outp, "rb");
    size_t len = f ? fread(got, 1, sizeof got, f) : 0;
    if (f) fclose(f);
    for (int i = 0; i < NEW; i++) memcpy(want + i * PIECE, piece, PIECE);
    want[NEW * PIECE] = '\n';
    check(rc == 0 && len == NEW * PIECE + 1 && !memcmp(got, want, len),
          "generate: %d tokens of %d bytes give all %d bytes (got %zu)", NEW, PIECE,
          NEW * PIECE + 1, len);
    remove(outp);
    remove(tz_tpath(dir, "tokenizer.json"));
    remove(tz_tpath(dir, "config.json"));
    remove(tz_tpath(dir, "model.safetensors"));
    rmdir(dir);
}

int main(int argc, char **argv) {
    tz_mpi_singleton_defaults();
    MPI_Init(&argc, &argv);
    tz_backend *be = tz_cpu_backend_create(0);
    check_ops(be);
    tz_llama_dims d = {.vocab = 61, .dim = 48, .hidden = 72, .n_layers = 2, .n_heads = 4,
                       .n_kv_heads = 2, .head_dim = 12, .max_pos = 64, .eps = 1e-5,
                       .theta = 10000.0, .tied = 0};
    tz_model_opts o = {0};
    check_model(be, &d, &o, 7, "default rope, untied");
    check_model(be, &d, &o, 3, "default rope, prefill in chunks of 3");
    o.lora.targets = (1 << TZ_LIN_N) - 1;
    o.lora.rank = 4;
    o.lora.alpha = 8;
    d.tied = 1;
    d.rope_type = TZ_ROPE_LLAMA3;
    d.rope_factor = 8, d.rope_low_freq = 1, d.rope_high_freq = 4, d.rope_orig_max = 16;
    check_model(be, &d, &o, 7, "llama3 rope, tied, LoRA");
    check_model(be, &d, &o, 2, "llama3 rope, tied, LoRA, prefill in chunks of 2");
    d.qkv_bias = 1; /* Qwen2 */
    check_model(be, &d, &o, 3, "qwen2 biases, LoRA, prefill in chunks of 3");
    d.qkv_bias = 0, d.qk_norm = 1, d.head_dim = 16; /* Qwen3: head_dim 16 with dim 48, 4 heads */
    d.rope_type = TZ_ROPE_DEFAULT;
    check_model(be, &d, &o, 3, "qwen3 q/k norms, head_dim 16, LoRA, prefill in chunks of 3");
    check_long_tokens(be);
    tz_cpu_backend_destroy(be);
    MPI_Finalize();
    return tz_check_done("test_llama_generate");
}
