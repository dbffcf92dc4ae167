/* The training loop (micro-batches, accumulation, clipping, AdamW on the host shard, eval,
 * logs, final save) and the eval driver. One process for now; ranks come with the ZeRO plan. */
#include "train/trainer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "io/fsutil.h"
#include "io/tokens.h"
#include "model/llama_io.h"
#include "train/adamw.h"
#include "train/data.h"

_Static_assert(TZ_LORA_Q == 1 << TZ_LIN_Q && TZ_LORA_K == 1 << TZ_LIN_K &&
                   TZ_LORA_V == 1 << TZ_LIN_V && TZ_LORA_O == 1 << TZ_LIN_O &&
                   TZ_LORA_GATE == 1 << TZ_LIN_GATE && TZ_LORA_UP == 1 << TZ_LIN_UP &&
                   TZ_LORA_DOWN == 1 << TZ_LIN_DOWN,
               "config LoRA target bits follow the projection order of the model");

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void fmt_duration(char *buf, size_t n, double s) {
    if (!(s >= 0) || s > 1e8) s = 0;
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else if (t >= 60) snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
    else snprintf(buf, n, "%lds", t);
}

static void open_tokens(tz_tokens *t, const char *path, const char *key, int64_t vocab) {
    char err[1024];
    if (!path[0]) TZ_FATAL_HINT("set it in the config or with --set", "%s is not set", key);
    if (tz_tokens_open(t, path, err, sizeof err)) TZ_FATAL("%s: %s", key, err);
    if (t->vocab > vocab)
        TZ_FATAL_HINT("prepare the data with the model's tokenizer",
                      "%s: %s has vocab %u but the model's vocab is %lld", key, path, t->vocab,
                      (long long)vocab);
}

/* Build the model the config asks for (base from model.path, quantized per quant.* or as
 * stored; adapters per lora.* or from model.adapter). */
static tz_llama *build_model(const tz_config *cfg, tz_backend *be, int train) {
    if (cfg->model.arch != TZ_ARCH_LLAMA)
        TZ_FATAL("%s: model.arch = \"%s\" is not available in this build yet", cfg->source,
                 tz_arch_name(cfg->model.arch));
    tz_llama_opts o = {0};
    o.full = train && cfg->train.mode == TZ_MODE_FULL;
    o.checkpointing = cfg->train.checkpointing;
    o.quant.method = cfg->quant.method;
    o.quant.bits = (int)cfg->quant.bits;
    o.quant.group = (int)cfg->quant.group;
    o.quant.seed = (uint64_t)cfg->quant.seed;
    if (cfg->model.adapter[0]) {
        tz_llama_read_adapter_opts(cfg->model.adapter, &o);
    } else if (train && cfg->train.mode == TZ_MODE_LORA) {
        o.lora_targets = cfg->lora.targets;
        o.lora_rank = cfg->lora.rank;
        o.lora_alpha = cfg->lora.alpha;
    }
    if (o.full && o.lora_targets)
        TZ_FATAL_HINT("unset model.adapter, or train with train.mode = \"lora\"",
                      "%s: train.mode = \"full\" with an adapter (model.adapter = %s)",
                      cfg->source, cfg->model.adapter);
    tz_llama *m = tz_llama_load(be, cfg->model.path, &o);
    if (cfg->model.adapter[0]) tz_llama_load_adapter(m, cfg->model.adapter);
    else if (o.lora_targets) tz_llama_init_lora(m, (uint64_t)cfg->run.seed);
    return m;
}

typedef struct eval_result {
    double loss;
    int64_t tokens;
} eval_result;

/* Mean loss over the first `limit` windows of d (all if limit <= 0), B rows at a time; a
 * partial last batch is padded with ignored rows. */
static eval_result evaluate(tz_llama *m, const tz_data *d, int64_t limit, int32_t *in,
                            int32_t *tg) {
    const int64_t B = m->B, T = m->T;
    int64_t n = limit > 0 && limit < d->nwin ? limit : d->nwin;
    double sum = 0.0;
    for (int64_t w = 0; w < n; w += B) {
        for (int64_t i = 0; i < B; i++) {
            if (w + i < n) {
                tz_data_window(d, w + i, in + i * T, tg + i * T);
            } else {
                memset(in + i * T, 0, (size_t)T * sizeof *in);
                for (int64_t t = 0; t < T; t++) tg[i * T + t] = -1;
            }
        }
        sum += tz_llama_forward(m, in, tg);
    }
    eval_result r = {sum / (double)(n * T), n * T};
    return r;
}

static void check_run_dir(const tz_config *cfg) {
    char err[1024], path[1100];
    if (tz_mkdir_p(cfg->run.dir, err, sizeof err)) TZ_FATAL("run.dir: %s", err);
    tz_path_join(path, sizeof path, cfg->run.dir, "metrics.jsonl");
    if (tz_path_exists(path) && !cfg->run.overwrite)
        TZ_FATAL_HINT("choose another run.dir, or --set run.overwrite=true to replace it",
                      "run.dir %s already holds a run (%s); not overwriting it", cfg->run.dir,
                      path);
}

static void write_config_used(const tz_config *cfg) {
    char path[1100];
    tz_path_join(path, sizeof path, cfg->run.dir, "config.used.cfg");
    FILE *f = fopen(path, "w");
    if (!f) TZ_FATAL("cannot write %s", path);
    tz_config_write(cfg, f);
    if (fclose(f) != 0) TZ_FATAL("cannot write %s", path);
}

int tz_train_run(const tz_config *cfg) {
    const double t_start = now_s();
    check_run_dir(cfg);
    printf("# effective config (%s)\n", cfg->source);
    tz_config_write(cfg, stdout);
    write_config_used(cfg);

    tz_backend *be = tz_cpu_backend_create((int)cfg->train.threads);
    tz_llama *m = build_model(cfg, be, 1);
    const int64_t B = cfg->train.micro_batch, T = cfg->data.seq_len;
    const int64_t accum = cfg->train.grad_accum, steps = cfg->train.steps;
    tz_llama_setup(m, B, T);

    tz_tokens train_tok, val_tok;
    open_tokens(&train_tok, cfg->data.train, "data.train", m->d.vocab);
    tz_data data, val;
    tz_data_init(&data, &train_tok, T, (uint64_t)cfg->run.seed);
    int have_val = cfg->data.val[0] != 0;
    if (have_val) {
        open_tokens(&val_tok, cfg->data.val, "data.val", m->d.vocab);
        tz_data_init(&val, &val_tok, T, 0);
    }

    /* gradients: one flat buffer in backward order; host shard: master, m, v, decay mask */
    tz_params *ps = &m->params;
    const int64_t N = ps->flat_numel;
    float *grad = be->alloc(be, (size_t)N * sizeof(float));
    tz_params_bind_grads(ps, grad);
    float *master = tz_xcalloc((size_t)N, sizeof(float));
    float *mom = tz_xcalloc((size_t)N, sizeof(float));
    float *var = tz_xcalloc((size_t)N, sizeof(float));
    float *ghost = be->device ? tz_xmalloc((size_t)N * sizeof(float)) : grad;
    uint8_t *decay = tz_xcalloc((size_t)N, 1);
    for (int i = 0; i < ps->n; i++) {
        tz_param *p = ps->p[i];
        if (!p->trainable) continue;
        be->download(be, master + p->flat_off, p->w, (size_t)p->numel * sizeof(float));
        memset(decay + p->flat_off, p->decay ? 1 : 0, (size_t)p->numel);
    }
    tz_info("model: %s | %lld layers, dim %lld, %lld/%lld heads | %lld params, %lld trainable "
            "(%s) | activations %.1f MiB | host shard %.1f MiB",
            cfg->model.path, (long long)m->d.n_layers, (long long)m->d.dim,
            (long long)m->d.n_heads, (long long)m->d.n_kv_heads, (long long)ps->n_total,
            (long long)ps->n_trainable, tz_mode_name(cfg->train.mode),
            (double)m->arena.cap / 1048576.0, (double)N * 13.0 / 1048576.0);
    tz_info("data: %s: %lld tokens, %lld windows of %lld | batch %lld x %lld accum = %lld "
            "tokens/step",
            cfg->data.train, (long long)train_tok.count, (long long)data.nwin, (long long)T,
            (long long)B, (long long)accum, (long long)(B * T * accum));

    char mpath[1100];
    tz_path_join(mpath, sizeof mpath, cfg->run.dir, "metrics.jsonl");
    FILE *metrics = fopen(mpath, "w");
    if (!metrics) TZ_FATAL("cannot write %s", mpath);

    int32_t *in = tz_xmalloc((size_t)(B * T) * sizeof *in);
    int32_t *tg = tz_xmalloc((size_t)(B * T) * sizeof *tg);
    eval_result ev0 = {0, 0}, ev = {0, 0};
    if (have_val) {
        ev0 = evaluate(m, &val, cfg->train.eval_windows, in, tg);
        tz_info("eval before training: val_loss %.4f (%lld tokens)", ev0.loss,
                (long long)ev0.tokens);
        fprintf(metrics, "{\"step\": 0, \"eval_loss\": %.6f, \"eval_tokens\": %lld}\n", ev0.loss,
                (long long)ev0.tokens);
    }

    tz_adamw_hparams hp = {cfg->optim.lr, cfg->optim.beta1, cfg->optim.beta2, cfg->optim.eps,
                           cfg->optim.weight_decay};
    const float dloss = (float)(1.0 / (double)(B * T * accum));
    const double t_loop = now_s();
    double loss = 0.0;
    for (int64_t step = 0; step < steps; step++) {
        double t0 = now_s();
        be->fill(be, grad, 0.0f, N);
        double lsum = 0.0;
        for (int64_t mb = 0; mb < accum; mb++) {
            tz_data_batch(&data, (step * accum + mb) * B, B, in, tg);
            lsum += tz_llama_forward_backward(m, in, tg, dloss);
        }
        loss = lsum / (double)(B * T * accum);
        double gnorm = sqrt(be->sumsq(be, grad, N));
        if (!isfinite(loss) || !isfinite(gnorm))
            TZ_FATAL_HINT("lower optim.lr or check the data",
                          "step %lld: loss %g, gradient norm %g are not finite",
                          (long long)step + 1, loss, gnorm);
        float clip = 1.0f;
        if (cfg->optim.grad_clip > 0 && gnorm > cfg->optim.grad_clip)
            clip = (float)(cfg->optim.grad_clip / gnorm);
        hp.lr = tz_lr_at(step, steps, cfg->optim.warmup, cfg->optim.lr, cfg->optim.min_lr_ratio);
        if (be->device) be->download(be, ghost, grad, (size_t)N * sizeof(float));
        tz_adamw_step(master, mom, var, ghost, decay, N, step + 1, &hp, clip);
        for (int i = 0; i < ps->n; i++) {
            tz_param *p = ps->p[i];
            if (p->trainable)
                be->upload(be, p->w, master + p->flat_off, (size_t)p->numel * sizeof(float));
        }
        double t1 = now_s();
        double tps = (double)(B * T * accum) / (t1 - t0);
        fprintf(metrics,
                "{\"step\": %lld, \"loss\": %.6f, \"lr\": %.6e, \"grad_norm\": %.6f, "
                "\"tokens_per_s\": %.1f, \"step_s\": %.4f}\n",
                (long long)step + 1, loss, hp.lr, gnorm, tps, t1 - t0);
        if ((step + 1) % cfg->train.log_every == 0 || step + 1 == steps) {
            char eta[32];
            fmt_duration(eta, sizeof eta, (t1 - t_loop) / (double)(step + 1) * (double)(steps - step - 1));
            tz_info("step %lld/%lld | loss %.4f | lr %.2e | grad norm %.3f | %.0f tok/s | ETA %s",
                    (long long)step + 1, (long long)steps, loss, hp.lr, gnorm, tps, eta);
        }
        if (have_val && cfg->train.eval_every > 0 && (step + 1) % cfg->train.eval_every == 0 &&
            step + 1 != steps) {
            ev = evaluate(m, &val, cfg->train.eval_windows, in, tg);
            tz_info("eval at step %lld: val_loss %.4f", (long long)step + 1, ev.loss);
            fprintf(metrics, "{\"step\": %lld, \"eval_loss\": %.6f, \"eval_tokens\": %lld}\n",
                    (long long)step + 1, ev.loss, (long long)ev.tokens);
        }
        fflush(metrics);
    }
    if (have_val) {
        ev = evaluate(m, &val, cfg->train.eval_windows, in, tg);
        tz_info("eval after training: val_loss %.4f (before %.4f, change %+.4f)", ev.loss,
                ev0.loss, ev.loss - ev0.loss);
        fprintf(metrics, "{\"step\": %lld, \"eval_loss\": %.6f, \"eval_tokens\": %lld}\n",
                (long long)steps, ev.loss, (long long)ev.tokens);
    }
    fclose(metrics);

    char out[1100];
    if (cfg->train.mode == TZ_MODE_FULL) {
        tz_path_join(out, sizeof out, cfg->run.dir, "model");
        tz_llama_save(m, out, cfg->run.save_dtype);
    } else {
        tz_path_join(out, sizeof out, cfg->run.dir, "adapter");
        tz_llama_save_adapter(m, out, cfg->model.path);
    }
    char took[32];
    fmt_duration(took, sizeof took, now_s() - t_start);
    tz_info("saved %s | final train loss %.4f | %s", out, loss, took);

    free(in); free(tg); free(master); free(mom); free(var); free(decay);
    if (ghost != grad) free(ghost);
    be->release(be, grad);
    tz_data_free(&data);
    tz_tokens_close(&train_tok);
    if (have_val) {
        tz_data_free(&val);
        tz_tokens_close(&val_tok);
    }
    tz_llama_free(m);
    tz_cpu_backend_destroy(be);
    return 0;
}

int tz_eval_run(const tz_config *cfg) {
    tz_backend *be = tz_cpu_backend_create((int)cfg->train.threads);
    tz_llama *m = build_model(cfg, be, 0);
    const int64_t B = cfg->train.micro_batch, T = cfg->data.seq_len;
    tz_llama_setup(m, B, T);
    tz_tokens tok;
    open_tokens(&tok, cfg->data.val, "data.val", m->d.vocab);
    tz_data d;
    tz_data_init(&d, &tok, T, 0);
    int32_t *in = tz_xmalloc((size_t)(B * T) * sizeof *in);
    int32_t *tg = tz_xmalloc((size_t)(B * T) * sizeof *tg);
    double t0 = now_s();
    eval_result r = evaluate(m, &d, 0, in, tg);
    tz_info("model %s%s%s | %s: %lld windows of %lld | %.1f s", cfg->model.path,
            cfg->model.adapter[0] ? " + adapter " : "", cfg->model.adapter, cfg->data.val,
            (long long)d.nwin, (long long)T, now_s() - t0);
    tz_info("eval_loss=%.6f tokens=%lld", r.loss, (long long)r.tokens);
    free(in); free(tg);
    tz_data_free(&d);
    tz_tokens_close(&tok);
    tz_llama_free(m);
    tz_cpu_backend_destroy(be);
    return 0;
}
