/* The Llama family: token windows (train/data.h) into tz_llama, outputs in HF layout; its
 * registry entry (LoRA targets, init-model presets). Adapters and saving are task.c's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backend/registry.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/rng.h"
#include "io/fsutil.h"
#include "io/prep.h"
#include "io/tokenizer.h"
#include "io/tokens.h"
#include "model/llama_io.h"
#include "cli/commands.h"
#include "train/data.h"
#include "task/task.h"

/* lora.targets names of the projections, in the order of TZ_LIN_* */
static const char *const targets[] = {"q", "k", "v", "o", "gate", "up", "down", NULL};
_Static_assert(sizeof targets / sizeof targets[0] == TZ_LIN_N + 1, "one name per projection");

typedef struct llama_task {
    tz_task t;
    tz_llama *m;
    int have_val;
    tz_tokens train_tok, val_tok;
    tz_data data, val;
    int32_t *in, *tg;
    uint32_t *random_tok; /* a bench preset's random tokens (tz_tokens over host memory) */
} llama_task;

/* A model of random weights (t->opts.random_base): a named shape of the family (model.path
 * "preset:NAME"; vocab: the vocabulary of a shape that takes the caller's, 0: none), or the
 * shapes model.path's config.json gives (no weight read). */
static tz_llama *random_model(const tz_config *cfg, tz_backend *be, const tz_model_opts *o,
                              int64_t vocab) {
    const char *path = cfg->model.path, *shape = tz_model_preset_name(path);
    tz_llama_dims d;
    char err[256];
    if (!shape) tz_llama_read_dims(path, &d);
    else if (tz_llama_preset(shape, 0, &d, err, sizeof err) &&
             (!vocab || tz_llama_preset(shape, vocab, &d, err, sizeof err)))
        TZ_FATAL("model.path %s: no such shape of the llama family (%s)", path, err);
    tz_llama *m = tz_llama_create(be, &d, o);
    tz_params_fill_random(&m->params, be, m->levels, (uint64_t)cfg->run.seed);
    return m;
}

/* The model, built with the options task.c derived from the config. */
static tz_params *load(tz_task *t) {
    llama_task *k = (llama_task *)t;
    k->m = t->opts.random_base ? random_model(t->cfg, t->be, &t->opts, 0)
                               : tz_llama_load(t->be, t->cfg->model.path, &t->opts);
    return &k->m->params;
}

/* A random model's training data: 64 windows of random tokens in memory. */
static void random_tokens(llama_task *k, int64_t T, int64_t vocab, uint64_t seed) {
    const int64_t n = 64 * T + 1;
    k->random_tok = tz_xmalloc((size_t)n * sizeof *k->random_tok);
    tz_rng_ids(k->random_tok, n, (uint64_t)vocab, seed);
    tz_tokens *tk = &k->train_tok;
    memset(tk, 0, sizeof *tk);
    snprintf(tk->path, sizeof tk->path, "(random tokens)");
    tk->vocab = (uint32_t)vocab, tk->width = 4, tk->count = n, tk->version = 1;
    tk->tokens = (const uint8_t *)k->random_tok;
}

/* The digest of the model's tokenizer (its folder's tokenizer.json; the byte tokenizer for a
 * model of 256 tokens without one), 0 when unknown or unreadable. */
static uint64_t model_tokenizer(const char *dir, int64_t vocab) {
    char path[1100], err[1024];
    tz_path_join(path, sizeof path, dir, "tokenizer.json");
    if (!tz_path_exists(path)) return vocab == 256 ? TZ_TOKENS_DIGEST_BYTES : 0;
    tz_tokenizer *tk = tz_tokenizer_load(path, err, sizeof err);
    uint64_t d = tk ? tz_tokenizer_digest(tk) : 0;
    tz_tokenizer_free(tk);
    return d;
}

/* Opens a token file and checks it against the model: every id below the model's vocab, and
 * the tokenizer recorded in the file (prep) the model's own (digest != 0). */
static void open_tokens(tz_tokens *t, const char *path, const char *key, int64_t vocab,
                        uint64_t digest, const char *model) {
    char err[1024];
    if (!path[0]) TZ_FATAL_HINT("set it in the config or with --set", "%s is not set", key);
    if (tz_tokens_open(t, path, err, sizeof err)) TZ_FATAL("%s: %s", key, err);
    if (t->vocab > vocab) {
        for (int64_t i = 0; i < t->count; i++)
            if (tz_tokens_at(t, i) >= vocab)
                TZ_FATAL_HINT("prepare the data with the model's tokenizer",
                              "%s: %s holds token id %d (at token %lld), beyond the model's vocab "
                              "size %lld (the file's vocab is %u)", key, path, tz_tokens_at(t, i),
                              (long long)i, (long long)vocab, t->vocab);
        TZ_FATAL_HINT("prepare the data with the model's tokenizer",
                      "%s: %s has vocab %u but the model's vocab is %lld", key, path, t->vocab,
                      (long long)vocab);
    }
    if (digest && t->tokenizer && t->tokenizer != digest)
        TZ_FATAL_HINT("prepare the data again with `turbozero prep ... --tokenizer MODEL`",
                      "%s: %s was made with another tokenizer (vocab %u, digest %016llx) than the "
                      "model's in %s (digest %016llx)", key, path, t->vocab,
                      (unsigned long long)t->tokenizer, model, (unsigned long long)digest);
}

/* The loss terms of a masked token file: its trained targets. */
static int64_t llama_terms(tz_task *t, int val, int64_t first, int64_t n) {
    llama_task *k = (llama_task *)t;
    return val ? tz_data_terms(&k->val, first, n, 1) : tz_data_terms(&k->data, first, n, 0);
}

static void open_task(tz_task *t) {
    llama_task *k = (llama_task *)t;
    const tz_config *cfg = t->cfg;
    tz_llama *m = k->m;
    const int64_t B = t->B, T = cfg->data.seq_len;
    tz_llama_setup(m, B, T);
    t->unit = "tokens";
    t->row_name = "windows";
    t->arena_bytes = m->arena.cap;
    tz_task_host_acts(t, &m->stack, &m->keep);
    t->row_elems = t->row_count = T;
    if (T > m->d.max_pos)
        TZ_FATAL_HINT("lower data.seq_len (a model trained on longer sequences states so in "
                      "config.json's max_position_embeddings, with its rope_scaling)",
                      "data.seq_len %lld exceeds the model's max_position_embeddings %lld",
                      (long long)T, (long long)m->d.max_pos);
    const int preset = t->opts.random_base;
    const uint64_t digest = preset ? 0 : model_tokenizer(cfg->model.path, m->d.vocab);
    snprintf(t->describe, sizeof t->describe,
             "llama %s | %lld layers, dim %lld, %lld/%lld heads, vocab %lld", cfg->model.path,
             (long long)m->d.n_layers, (long long)m->d.dim, (long long)m->d.n_heads,
             (long long)m->d.n_kv_heads, (long long)m->d.vocab);
    if (t->training) {
        if (preset) random_tokens(k, T, m->d.vocab, (uint64_t)cfg->run.seed);
        else open_tokens(&k->train_tok, cfg->data.train, "data.train", m->d.vocab, digest,
                         cfg->model.path);
        tz_data_init(&k->data, &k->train_tok, T, (uint64_t)cfg->run.seed);
        t->n_train = k->data.nwin;
        snprintf(t->data_line, sizeof t->data_line, "%s: %lld tokens, %lld windows of %lld%s",
                 cfg->data.train, (long long)k->train_tok.count, (long long)k->data.nwin,
                 (long long)T, k->train_tok.mask ? ", loss on the masked-in (response) tokens" : "");
    }
    k->have_val = cfg->data.val[0] != 0;
    if (k->have_val) {
        open_tokens(&k->val_tok, cfg->data.val, "data.val", m->d.vocab, digest, cfg->model.path);
        tz_data_init(&k->val, &k->val_tok, T, 0);
        t->n_val = k->val.nwin;
    }
    if ((t->training && k->train_tok.mask) || (k->have_val && k->val_tok.mask)) t->terms = llama_terms;
    k->in = tz_xmalloc((size_t)(B * T) * sizeof *k->in);
    k->tg = tz_xmalloc((size_t)(B * T) * sizeof *k->tg);
}

static double train_rows(tz_task *t, int64_t first, float dloss) {
    llama_task *k = (llama_task *)t;
    tz_data_batch(&k->data, first, t->B, k->in, k->tg);
    return tz_llama_forward_backward(k->m, k->in, k->tg, dloss);
}

static double train_loss(tz_task *t, int64_t first) {
    llama_task *k = (llama_task *)t;
    tz_data_batch(&k->data, first, t->B, k->in, k->tg);
    return tz_llama_forward(k->m, k->in, k->tg);
}

static double eval_rows(tz_task *t, int64_t first, int64_t n) {
    llama_task *k = (llama_task *)t;
    const int64_t T = t->cfg->data.seq_len;
    for (int64_t i = 0; i < t->B; i++) {
        if (i < n) {
            tz_data_window(&k->val, first + i, k->in + i * T, k->tg + i * T);
        } else { /* a partial batch: padding rows whose targets are ignored */
            memset(k->in + i * T, 0, (size_t)T * sizeof *k->in);
            for (int64_t j = 0; j < T; j++) k->tg[i * T + j] = -1;
        }
    }
    return tz_llama_forward(k->m, k->in, k->tg);
}

static void save_model(tz_task *t, const char *dir, int bf16) {
    tz_llama_save(((llama_task *)t)->m, dir, bf16);
    /* the tokenizer of the model it was trained from travels with it (a folder; a bench
     * preset has none) */
    char err[1400];
    if (tz_copy_tokenizer_files(t->cfg->model.path, dir, err, sizeof err) < 0)
        TZ_FATAL("saving the model to %s: %s", dir, err);
}

static void close_task(tz_task *t) {
    llama_task *k = (llama_task *)t;
    free(k->in);
    free(k->tg);
    if (k->have_val) {
        tz_data_free(&k->val);
        tz_tokens_close(&k->val_tok);
    }
    if (t->training) {
        tz_data_free(&k->data);
        if (k->random_tok) free(k->random_tok);
        else tz_tokens_close(&k->train_tok);
    }
    tz_llama_free(k->m);
}

static const char *const init_flags[] = {"--vocab", "--tied", NULL};
/* init-model --arch llama --preset P --vocab V [--tied 0|1]: a random Llama in HF layout. */
static int64_t init_model(const tz_init_args *a, char *about, size_t n) {
    const char *vocab = tz_init_arg(a, "--vocab"), *tied = tz_init_arg(a, "--tied");
    if (!vocab) TZ_FATAL("init-model: --arch llama needs --vocab");
    int64_t v = tz_command_int(vocab, "--vocab");
    if (v < 2 || v > (1 << 24)) TZ_FATAL("init-model: --vocab %s: expected 2..16777216", vocab);
    tz_llama_dims d;
    char err[128];
    if (tz_llama_preset(a->preset, v, &d, err, sizeof err))
        TZ_FATAL("init-model: --preset %s: %s", a->preset, err);
    if (tied) d.tied = (int)tz_command_int(tied, "--tied") != 0;
    tz_model_opts o = {0};
    tz_llama *m = tz_llama_create(a->be, &d, &o);
    tz_llama_init_random(m, a->seed);
    tz_llama_save(m, a->out, 0);
    snprintf(about, n, "%lld layers, dim %lld, %lld/%lld heads, vocab %lld, %s embeddings",
             (long long)d.n_layers, (long long)d.dim, (long long)d.n_heads,
             (long long)d.n_kv_heads, (long long)d.vocab, d.tied ? "tied" : "untied");
    const int64_t count = m->params.n_total;
    tz_llama_free(m);
    return count;
}

/* ---- generate ---- */

/* The tokenizer generate uses: --tokenizer, else the model folder's tokenizer.json, else
 * "bytes" for a model of 256 tokens. */
static tz_tokenizer *open_tokenizer(const tz_config *cfg, const tz_generate_args *a,
                                    int64_t vocab) {
    char path[1100], err[1024];
    tz_path_join(path, sizeof path, cfg->model.path, "tokenizer.json");
    const char *use = a->tokenizer;
    if (!use && tz_path_exists(path)) use = path;
    /* a named shape's random weights (a speed run) have no tokenizer: the bytes' */
    if (!use && (vocab == 256 || tz_model_preset_name(cfg->model.path))) use = "bytes";
    if (!use)
        TZ_FATAL_HINT("give --tokenizer PATH (a tokenizer.json, or bytes)",
                      "generate: %s has no tokenizer.json and its vocab is %lld, not 256 (the "
                      "byte-level tokenizer's)", cfg->model.path, (long long)vocab);
    tz_tokenizer *t = tz_tokenizer_load(use, err, sizeof err);
    if (!t) TZ_FATAL("generate: tokenizer %s: %s", use, err);
    return t;
}

typedef struct cand {
    double p;
    int32_t id;
} cand;

/* Descending probability, ties by ascending id: a total order, so the draw is reproducible. */
static int cand_cmp(const void *x, const void *y) {
    const cand *a = x, *b = y;
    if (a->p != b->p) return a->p < b->p ? 1 : -1;
    return (a->id > b->id) - (a->id < b->id);
}

/* The next token from logits[0..V): argmax (temperature 0; the first of equal maxima), or
 * the draw u in [0, 1) from the softmax of logits / temperature restricted to the most
 * likely tokens whose mass first reaches top_p (all of them at top_p = 1). c: V scratch. */
static int32_t pick_token(const float *logits, int64_t V, double temperature, double top_p,
                          float u, cand *c) {
    int64_t best = 0;
    for (int64_t i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (temperature <= 0) return (int32_t)best;
    double sum = 0.0;
    for (int64_t i = 0; i < V; i++) {
        c[i].p = exp(((double)logits[i] - (double)logits[best]) / temperature);
        c[i].id = (int32_t)i;
        sum += c[i].p;
    }
    int64_t n = V;
    if (top_p < 1.0) {
        qsort(c, (size_t)V, sizeof *c, cand_cmp);
        double mass = 0.0;
        for (n = 0; n < V && mass < top_p * sum; n++) mass += c[n].p;
        sum = mass;
    }
    double target = (double)u * sum, acc = 0.0;
    for (int64_t k = 0; k < n; k++) {
        acc += c[k].p;
        if (target < acc) return c[k].id;
    }
    return c[n - 1].id;
}

/* The generation state shared by the prompts of one run. */
typedef struct gen_ctx {
    const tz_config *cfg;
    const tz_generate_args *a;
    tz_backend *be;
    tz_llama *m;
    tz_tokenizer *tk;
    int32_t stop_ids[40];
    int nstop;
    int64_t V; /* ids past the tokenizer's are never drawn: they have no text */
    char tmpl[16];
} gen_ctx;

static void add_stop(gen_ctx *g, int32_t id) {
    if (id < 0 || g->nstop == (int)(sizeof g->stop_ids / sizeof g->stop_ids[0])) return;
    for (int i = 0; i < g->nstop; i++)
        if (g->stop_ids[i] == id) return;
    g->stop_ids[g->nstop++] = id;
}

/* ids[0..n) as text into *text (grown as needed); its length. decode writes at most tcap - 1
 * bytes and returns how many it wrote, not how many the text needs (a token may be hundreds
 * of bytes): a text that comes within 2 bytes of the end (one more for a leading space it
 * strips) may have been cut, so it is decoded again into twice the room. */
static size_t decode_text(const tz_tokenizer *tk, const int32_t *ids, int64_t n, char **text,
                          size_t *tcap) {
    int64_t len;
    while ((len = tz_tokenizer_decode(tk, ids, n, 1, *text, *tcap)) >= 0 && (size_t)len + 2 >= *tcap)
        *text = tz_xrealloc(*text, *tcap *= 2);
    if (len < 0) TZ_FATAL("generate: a generated id has no text in the tokenizer");
    return (size_t)len;
}

/* Where the first --stop string starts in text, or len when none does. */
static size_t stop_at(const tz_generate_args *a, const char *text, size_t len) {
    size_t at = len;
    for (int i = 0; i < a->nstops; i++) {
        const char *p = strstr(text, a->stops[i]);
        if (p && (size_t)(p - text) < at) at = (size_t)(p - text);
    }
    return at;
}

/* The prompt's ids: in the chat template (--chat, --template), else the text with special
 * tokens recognised and BOS first when the tokenizer adds one. */
static int64_t prompt_ids(gen_ctx *g, const char *prompt, int32_t **out) {
    const tz_generate_args *a = g->a;
    char err[1024];
    int64_t np;
    int32_t *ids;
    if (a->chat) {
        const char *t = a->tmpl ? a->tmpl : tz_tokenizer_chat(g->tk)[0] ? tz_tokenizer_chat(g->tk) : NULL;
        int32_t end = -1;
        np = tz_chat_prompt(g->tk, t, a->system, prompt, &ids, g->tmpl, sizeof g->tmpl, &end, err,
                            sizeof err);
        if (np < 0) TZ_FATAL("generate: %s", err);
        add_stop(g, end);
    } else {
        size_t plen = strlen(prompt);
        int64_t cap = (int64_t)plen + 17, need = 0;
        const int bos = tz_tokenizer_add_bos(g->tk);
        ids = tz_xmalloc((size_t)cap * sizeof *ids);
        np = tz_tokenizer_encode(g->tk, prompt, plen, 1, ids + bos, cap - bos, &need, err, sizeof err);
        if (np >= 0 && need > cap - bos) { /* more ids than bytes + 16: again into room enough */
            cap = need + bos;
            ids = tz_xrealloc(ids, (size_t)cap * sizeof *ids);
            np = tz_tokenizer_encode(g->tk, prompt, plen, 1, ids + bos, cap - bos, &need, err,
                                     sizeof err);
        }
        if (np < 0) TZ_FATAL("generate: --prompt: %s", err);
        if (bos && np > 0 && ids[1] == tz_tokenizer_bos(g->tk)) memmove(ids, ids + 1, (size_t)np * sizeof *ids);
        else if (bos) ids[0] = tz_tokenizer_bos(g->tk), np++;
    }
    if (np == 0)
        TZ_FATAL("generate: --prompt is empty and the tokenizer adds no begin-of-sequence token");
    for (int64_t i = 0; i < np; i++)
        if (ids[i] < 0 || ids[i] >= g->m->d.vocab)
            TZ_FATAL("generate: the tokenizer gave id %d, outside the model's vocab of %lld",
                     ids[i], (long long)g->m->d.vocab);
    *out = ids;
    return np;
}

/* One prompt: through the model once (filling the key/value cache), then one token at a time;
 * stops after max_new tokens, at a stop id, or at a --stop string. Prints the continuation. */
static void generate_one(gen_ctx *g, const char *prompt) {
    const tz_generate_args *a = g->a;
    tz_llama *m = g->m;
    int32_t *ids;
    const int64_t np = prompt_ids(g, prompt, &ids);
    const int64_t total = np + a->max_new;
    ids = tz_xrealloc(ids, (size_t)(total + 1) * sizeof *ids);
    if (total > m->d.max_pos)
        tz_warn("generate: %lld positions exceed the model's max_position_embeddings %lld",
                (long long)total, (long long)m->d.max_pos);
    tz_llama_setup(m, 1, np);
    tz_llama_cache cache;
    tz_llama_cache_init(m, &cache, total);
    float *logits = tz_xmalloc((size_t)m->d.vocab * sizeof *logits);
    cand *cands = tz_xmalloc((size_t)g->V * sizeof *cands);
    tz_rng r = tz_rng_make((uint64_t)a->seed, 0, TZ_RNG_NOISE, 0);
    size_t tcap = 256 + 32 * (size_t)a->max_new, len = 0;
    char *text = tz_xmalloc(tcap);
    /* the prompt's pass and the decode steps timed apart: each download of the logits waits
     * for the pass that made them */
    const double t0 = tz_clock_s();
    double t_prompt = t0, t_last = t0;
    int64_t steps = 0; /* decode steps whose logits came back */
    const float *lg = tz_llama_decode(m, &cache, ids, np);
    int64_t n = np;
    const char *why = "max-new";
    for (int64_t step = 0; step < a->max_new; step++) {
        g->be->download(g->be, logits, lg, (size_t)m->d.vocab * sizeof *logits);
        t_last = tz_clock_s();
        if (step == 0) t_prompt = t_last;
        steps = step;
        float u = tz_rng_uniform(&r);
        int32_t next = pick_token(logits, g->V, a->temperature, a->top_p, u, cands);
        int stop = 0;
        for (int i = 0; i < g->nstop; i++) stop |= next == g->stop_ids[i];
        if (stop) { why = "end of turn"; break; }
        ids[n++] = next;
        if (a->nstops) {
            len = decode_text(g->tk, ids + np, n - np, &text, &tcap);
            if (stop_at(a, text, len) < len) { why = "--stop"; break; }
        }
        if (step + 1 < a->max_new) lg = tz_llama_decode(m, &cache, &ids[n - 1], 1);
    }
    len = decode_text(g->tk, ids + np, n - np, &text, &tcap);
    len = stop_at(a, text, len);
    fwrite(text, 1, len, stdout);
    fputc('\n', stdout);
    fflush(stdout);
    char speed[160] = "";
    int w = 0;
    if (a->max_new > 0) {
        w = snprintf(speed, sizeof speed, "; prompt %.2f s", t_prompt - t0);
        if (steps > 0 && t_last > t_prompt && w > 0 && (size_t)w < sizeof speed)
            w += snprintf(speed + w, sizeof speed - (size_t)w, ", %.1f tokens/s after it",
                          (double)steps / (t_last - t_prompt));
    }
    if (g->be->device && w >= 0 && (size_t)w < sizeof speed) /* the allocator's own count */
        snprintf(speed + w, sizeof speed - (size_t)w, "; device memory peak %.2f GiB",
                 (double)g->be->peak_bytes / 1073741824.0);
    fprintf(stderr, "generate: %lld prompt tokens%s%s, %lld new (%s%s), stopped at %s%s\n",
            (long long)np, a->chat ? ", template " : "", a->chat ? g->tmpl : "",
            (long long)(n - np), a->temperature > 0 ? "sampled" : "greedy",
            g->cfg->model.adapter[0] ? ", with model.adapter" : "", why, speed);
    free(text), free(logits), free(cands), free(ids);
    tz_llama_cache_free(m, &cache);
}

/* generate: --prompt, or each line of stdin with --interactive, through generate_one. */
static int generate(const tz_config *cfg, const tz_generate_args *a) {
    gen_ctx g;
    memset(&g, 0, sizeof g);
    g.cfg = cfg, g.a = a;
    tz_info_to_stderr(); /* standard output is the text alone */
    tz_model_opts o;     /* run.device and run.precision, as eval and sample */
    g.be = tz_task_forward_setup(&tz_family_llama, cfg, &o);
    o.random_base = tz_model_preset_name(cfg->model.path) != NULL;
    if (o.random_base) { /* model.path "preset:NAME": random weights, to time generation */
        if (!cfg->model.adapter[0] && cfg->train.mode == TZ_MODE_LORA) /* and random adapters */
            o.lora = tz_task_model_opts(&tz_family_llama, cfg, 1).lora;
        g.m = random_model(cfg, g.be, &o, 256); /* (the byte tokenizer's, where it asks) */
    } else {
        g.m = tz_llama_load(g.be, cfg->model.path, &o);
    }
    tz_task_load_adapters(cfg, &o, &g.m->params, g.be);
    g.tk = open_tokenizer(cfg, a, g.m->d.vocab);
    g.V = g.m->d.vocab < tz_tokenizer_vocab(g.tk) ? g.m->d.vocab : tz_tokenizer_vocab(g.tk);
    /* stop ids: EOS, generation_config.json's eos_token_id (beside the model and the
     * tokenizer), and the chat template's end of turn (prompt_ids) */
    add_stop(&g, tz_tokenizer_eos(g.tk));
    int32_t extra[32];
    int ne = tz_generation_eos(cfg->model.path, extra, 32);
    for (int i = 0; i < ne; i++) add_stop(&g, extra[i]);
    if (a->tokenizer && strcmp(a->tokenizer, "bytes")) {
        char dir[1100];
        snprintf(dir, sizeof dir, "%s", a->tokenizer);
        char *slash = strrchr(dir, '/');
        struct stat st;
        if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
            if (slash) *slash = 0;
            else snprintf(dir, sizeof dir, ".");
        }
        ne = tz_generation_eos(dir, extra, 32);
        for (int i = 0; i < ne; i++) add_stop(&g, extra[i]);
    }
    if (a->interactive) {
        char *line = NULL;
        size_t cap = 0;
        ssize_t got;
        while ((got = getline(&line, &cap, stdin)) > 0) {
            while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = 0;
            if (got == 0) continue;
            generate_one(&g, line);
        }
        free(line);
    } else {
        generate_one(&g, a->prompt);
    }
    tz_tokenizer_free(g.tk);
    tz_llama_free(g.m);
    tz_backend_destroy(g.be);
    return 0;
}

static const tz_task_ops ops = {sizeof(llama_task), load, open_task, train_rows, eval_rows,
                                save_model, close_task, train_loss};
/* The registry entry (task/family.h): name, LoRA targets, PEFT modules, task, init-model;
 * no image sampler; the text generator. */
const tz_family tz_family_llama = {"llama",    targets,    tz_llama_lin_names, &ops,
                                   init_flags, init_model, NULL,      "CAUSAL_LM", generate, NULL, NULL, 0};
