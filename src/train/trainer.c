/* The training loop (micro-batches, accumulation, ZeRO step, eval, logs, final save), the
 * eval driver and the benchmark driver, over N data-parallel ranks (N = 1 included). */
#include "train/trainer.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "core/error.h"
#include "io/fsutil.h"
#include "io/tokens.h"
#include "model/llama_io.h"
#include "train/adamw.h"
#include "train/data.h"
#include "train/zero.h"

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

/* Everything one run holds on a rank. */
typedef struct run {
    const tz_config *cfg;
    tz_world *w;
    tz_comm *comm;
    tz_backend *be;
    tz_llama *m;
    tz_zero z;
    int training;
    tz_tokens train_tok, val_tok;
    tz_data data, val;
    int have_val;
    int64_t B, T, accum, N;
    int32_t *in, *tg;
} run;

static void open_tokens(tz_tokens *t, const char *path, const char *key, int64_t vocab) {
    char err[1024];
    if (!path[0]) TZ_FATAL_HINT("set it in the config or with --set", "%s is not set", key);
    if (tz_tokens_open(t, path, err, sizeof err)) TZ_FATAL("%s: %s", key, err);
    if (t->vocab > vocab)
        TZ_FATAL_HINT("prepare the data with the model's tokenizer",
                      "%s: %s has vocab %u but the model's vocab is %lld", key, path, t->vocab,
                      (long long)vocab);
}

/* The model the config asks for: base from model.path, adapters from lora.* (training in
 * LoRA mode) or from model.adapter. */
static tz_llama *build_model(const tz_config *cfg, tz_backend *be, int train) {
    if (cfg->model.arch != TZ_ARCH_LLAMA)
        TZ_FATAL("%s: model.arch = \"%s\" is not available in this build yet", cfg->source,
                 tz_arch_name(cfg->model.arch));
    tz_llama_opts o = {0};
    o.full = train && cfg->train.mode == TZ_MODE_FULL;
    o.checkpointing = cfg->train.checkpointing;
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

static void run_open(run *r, const tz_config *cfg, tz_world *w, tz_comm *comm, int training) {
    memset(r, 0, sizeof *r);
    r->cfg = cfg;
    r->w = w;
    r->comm = comm;
    r->training = training;
    if (cfg->train.threads > 0) omp_set_num_threads((int)cfg->train.threads); /* AdamW too */
    r->be = tz_cpu_backend_create((int)cfg->train.threads);
    w->threads = omp_get_max_threads();
    r->m = build_model(cfg, r->be, training);
    r->B = cfg->train.micro_batch;
    r->T = cfg->data.seq_len;
    r->accum = cfg->train.grad_accum;
    r->N = comm->size;
    tz_llama_setup(r->m, r->B, r->T);
    if (training) {
        open_tokens(&r->train_tok, cfg->data.train, "data.train", r->m->d.vocab);
        tz_data_init(&r->data, &r->train_tok, r->T, (uint64_t)cfg->run.seed);
        tz_zero_init(&r->z, (int)cfg->zero.stage, cfg->zero.bucket_mb, &r->m->params, r->be,
                     comm, w);
        r->m->grad_hook = tz_zero_grads_ready;
        r->m->grad_hook_ctx = &r->z;
    }
    r->have_val = cfg->data.val[0] != 0;
    if (!training && !r->have_val)
        TZ_FATAL_HINT("set data.val to a token file", "%s: data.val is not set", cfg->source);
    if (r->have_val) {
        open_tokens(&r->val_tok, cfg->data.val, "data.val", r->m->d.vocab);
        tz_data_init(&r->val, &r->val_tok, r->T, 0);
    }
    r->in = tz_xmalloc((size_t)(r->B * r->T) * sizeof *r->in);
    r->tg = tz_xmalloc((size_t)(r->B * r->T) * sizeof *r->tg);
}

static void run_close(run *r) {
    free(r->in);
    free(r->tg);
    if (r->have_val) {
        tz_data_free(&r->val);
        tz_tokens_close(&r->val_tok);
    }
    if (r->training) {
        tz_zero_free(&r->z);
        tz_data_free(&r->data);
        tz_tokens_close(&r->train_tok);
    }
    tz_llama_free(r->m);
    tz_cpu_backend_destroy(r->be);
}

typedef struct eval_result {
    double loss;
    int64_t tokens;
} eval_result;

/* Mean loss over the first `limit` validation windows (all if limit <= 0): rank r takes
 * windows r, r+N, ..., B at a time (a partial batch padded with ignored rows); the sums
 * are added over the ranks. */
static eval_result evaluate(run *r, int64_t limit) {
    const int64_t B = r->B, T = r->T, N = r->N, rank = r->comm->rank;
    int64_t n = limit > 0 && limit < r->val.nwin ? limit : r->val.nwin;
    double sum[2] = {0.0, 0.0}; /* loss, windows */
    for (int64_t w0 = rank; w0 < n; w0 += B * N) {
        for (int64_t i = 0; i < B; i++) {
            int64_t w = w0 + i * N;
            if (w < n) {
                tz_data_window(&r->val, w, r->in + i * T, r->tg + i * T);
                sum[1] += 1.0;
            } else {
                memset(r->in + i * T, 0, (size_t)T * sizeof *r->in);
                for (int64_t t = 0; t < T; t++) r->tg[i * T + t] = -1;
            }
        }
        sum[0] += tz_llama_forward(r->m, r->in, r->tg);
    }
    if (N > 1) tz_comm_all_reduce(r->comm, sum, sum, 2, TZ_DT_F64);
    eval_result e = {sum[0] / (sum[1] * (double)T), (int64_t)sum[1] * T};
    return e;
}

typedef struct step_result {
    double loss, gnorm, lr;
} step_result;

/* One optimizer step over the global batch: rank r's rows of micro-batch k of step s are
 * samples ((s * accum + k) * N + r) * B ... + B - 1 of the shared order. */
static step_result train_step(run *r, int64_t step) {
    const tz_config *cfg = r->cfg;
    const int64_t B = r->B, T = r->T, A = r->accum, N = r->N, rank = r->comm->rank;
    const double total = (double)(B * T * A * N);
    tz_zero_begin_step(&r->z);
    double lsum = 0.0;
    for (int64_t k = 0; k < A; k++) {
        tz_zero_begin_micro(&r->z, k == A - 1);
        tz_data_batch(&r->data, ((step * A + k) * N + rank) * B, B, r->in, r->tg);
        lsum += tz_llama_forward_backward(r->m, r->in, r->tg, (float)(1.0 / total));
        tz_zero_end_micro(&r->z);
    }
    if (N > 1) tz_comm_all_reduce(r->comm, &lsum, &lsum, 1, TZ_DT_F64);
    step_result s;
    s.loss = lsum / total;
    s.lr = tz_lr_at(step, cfg->train.steps, cfg->optim.warmup, cfg->optim.lr, cfg->optim.min_lr_ratio);
    tz_adamw_hparams hp = {s.lr, cfg->optim.beta1, cfg->optim.beta2, cfg->optim.eps,
                           cfg->optim.weight_decay};
    s.gnorm = tz_zero_step(&r->z, &hp, step + 1, cfg->optim.grad_clip);
    if (!isfinite(s.loss) || !isfinite(s.gnorm))
        TZ_FATAL_HINT("lower optim.lr or check the data",
                      "step %lld: loss %g, gradient norm %g are not finite", (long long)step + 1,
                      s.loss, s.gnorm);
    return s;
}

static void print_start(const run *r) {
    const tz_llama *m = r->m;
    const tz_params *ps = &m->params;
    tz_info("model: %s | %lld layers, dim %lld, %lld/%lld heads | %lld params, %lld trainable "
            "(%s) | activations %.1f MiB per rank",
            r->cfg->model.path, (long long)m->d.n_layers, (long long)m->d.dim,
            (long long)m->d.n_heads, (long long)m->d.n_kv_heads, (long long)ps->n_total,
            (long long)ps->n_trainable, tz_mode_name(r->cfg->train.mode),
            (double)m->arena.cap / 1048576.0);
    tz_info("data: %s: %lld tokens, %lld windows of %lld | %lld ranks x %lld x %lld accum = "
            "%lld tokens/step",
            r->cfg->data.train, (long long)r->train_tok.count, (long long)r->data.nwin,
            (long long)r->T, (long long)r->N, (long long)r->B, (long long)r->accum,
            (long long)(r->N * r->B * r->T * r->accum));
    tz_world_print(r->w);
    tz_zero_plan_print(&r->z.plan);
    tz_zero_print(&r->z);
}

static FILE *open_rank0(const tz_config *cfg, const char *name, const char *mode) {
    char path[1100];
    tz_path_join(path, sizeof path, cfg->run.dir, name);
    FILE *f = fopen(path, mode);
    if (!f) TZ_FATAL("cannot write %s", path);
    return f;
}

int tz_train_run(const tz_config *cfg, tz_world *w, tz_comm *comm) {
    const double t_start = now_s();
    const int root = comm->rank == 0;
    FILE *metrics = NULL;
    if (root) { /* decided on rank 0; a refusal aborts every rank */
        char err[1024], path[1100];
        if (tz_mkdir_p(cfg->run.dir, err, sizeof err)) TZ_FATAL("run.dir: %s", err);
        tz_path_join(path, sizeof path, cfg->run.dir, "metrics.jsonl");
        if (tz_path_exists(path) && !cfg->run.overwrite)
            TZ_FATAL_HINT("choose another run.dir, or --set run.overwrite=true to replace it",
                          "run.dir %s already holds a run (%s); not overwriting it",
                          cfg->run.dir, path);
        printf("# effective config (%s)\n", cfg->source);
        tz_config_write(cfg, stdout);
        FILE *f = open_rank0(cfg, "config.used.cfg", "w");
        tz_config_write(cfg, f);
        if (fclose(f) != 0) TZ_FATAL("cannot write %s/config.used.cfg", cfg->run.dir);
        metrics = open_rank0(cfg, "metrics.jsonl", "w");
    }
    run r;
    run_open(&r, cfg, w, comm, 1);
    print_start(&r);
    const int64_t steps = cfg->train.steps, tokens = r.N * r.B * r.T * r.accum;
    eval_result ev0 = {0, 0}, ev = {0, 0};
    if (r.have_val) {
        ev0 = evaluate(&r, cfg->train.eval_windows);
        tz_info("eval before training: val_loss %.4f (%lld tokens)", ev0.loss, (long long)ev0.tokens);
        if (root)
            fprintf(metrics, "{\"step\": 0, \"eval_loss\": %.6f, \"eval_tokens\": %lld}\n",
                    ev0.loss, (long long)ev0.tokens);
    }
    const double t_loop = now_s();
    step_result s = {0, 0, 0};
    for (int64_t step = 0; step < steps; step++) {
        double t0 = now_s();
        s = train_step(&r, step);
        double t1 = now_s(), tps = (double)tokens / (t1 - t0);
        if (root)
            fprintf(metrics,
                    "{\"step\": %lld, \"loss\": %.9g, \"lr\": %.6e, \"grad_norm\": %.9g, "
                    "\"tokens_per_s\": %.1f, \"step_s\": %.4f}\n",
                    (long long)step + 1, s.loss, s.lr, s.gnorm, tps, t1 - t0);
        if ((step + 1) % cfg->train.log_every == 0 || step + 1 == steps) {
            char eta[32];
            fmt_duration(eta, sizeof eta, (t1 - t_loop) / (double)(step + 1) * (double)(steps - step - 1));
            tz_info("step %lld/%lld | loss %.4f | lr %.2e | grad norm %.3f | %.0f tok/s | ETA %s",
                    (long long)step + 1, (long long)steps, s.loss, s.lr, s.gnorm, tps, eta);
        }
        if (r.have_val && cfg->train.eval_every > 0 && (step + 1) % cfg->train.eval_every == 0 &&
            step + 1 != steps) {
            ev = evaluate(&r, cfg->train.eval_windows);
            tz_info("eval at step %lld: val_loss %.4f", (long long)step + 1, ev.loss);
            if (root)
                fprintf(metrics, "{\"step\": %lld, \"eval_loss\": %.6f, \"eval_tokens\": %lld}\n",
                        (long long)step + 1, ev.loss, (long long)ev.tokens);
        }
        if (root) fflush(metrics);
    }
    if (r.have_val) {
        ev = evaluate(&r, cfg->train.eval_windows);
        tz_info("eval after training: val_loss %.4f (before %.4f, change %+.4f)", ev.loss,
                ev0.loss, ev.loss - ev0.loss);
        if (root)
            fprintf(metrics, "{\"step\": %lld, \"eval_loss\": %.6f, \"eval_tokens\": %lld}\n",
                    (long long)steps, ev.loss, (long long)ev.tokens);
    }
    if (root) {
        if (fclose(metrics) != 0) TZ_FATAL("cannot write %s/metrics.jsonl", cfg->run.dir);
        char out[1100], took[32];
        if (cfg->train.mode == TZ_MODE_FULL) {
            tz_path_join(out, sizeof out, cfg->run.dir, "model");
            tz_llama_save(r.m, out, cfg->run.save_dtype);
        } else {
            tz_path_join(out, sizeof out, cfg->run.dir, "adapter");
            tz_llama_save_adapter(r.m, out, cfg->model.path);
        }
        fmt_duration(took, sizeof took, now_s() - t_start);
        tz_info("saved %s | final train loss %.4f | %s", out, s.loss, took);
    }
    tz_comm_barrier(comm); /* no rank leaves before the outputs are written */
    run_close(&r);
    return 0;
}

int tz_eval_run(const tz_config *cfg, tz_world *w, tz_comm *comm) {
    run r;
    run_open(&r, cfg, w, comm, 0);
    double t0 = now_s();
    eval_result e = evaluate(&r, 0);
    tz_info("model %s%s%s | %s: %lld windows of %lld | %lld ranks | %.1f s", cfg->model.path,
            cfg->model.adapter[0] ? " + adapter " : "", cfg->model.adapter, cfg->data.val,
            (long long)r.val.nwin, (long long)r.T, (long long)r.N, now_s() - t0);
    tz_info("eval_loss=%.6f tokens=%lld", e.loss, (long long)e.tokens);
    run_close(&r);
    return 0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int tz_bench_run(const tz_config *cfg, tz_world *w, tz_comm *comm) {
    run r;
    run_open(&r, cfg, w, comm, 1);
    print_start(&r);
    const int64_t steps = cfg->train.steps, tokens = r.N * r.B * r.T * r.accum;
    const int64_t warm = steps > 3 ? 2 : 0;
    double *dt = tz_xmalloc((size_t)steps * sizeof *dt);
    for (int64_t step = 0; step < steps; step++) {
        double t0 = now_s();
        step_result s = train_step(&r, step);
        dt[step] = now_s() - t0;
        tz_info("bench step %lld/%lld | loss %.4f | %.3f s", (long long)step + 1, (long long)steps,
                s.loss, dt[step]);
    }
    const int64_t n = steps - warm;
    qsort(dt + warm, (size_t)n, sizeof *dt, cmp_double);
    double med = dt[warm + n / 2];
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    int64_t rss = (int64_t)ru.ru_maxrss, *all = tz_xmalloc((size_t)r.N * sizeof *all);
    tz_comm_all_gather(comm, &rss, all, 1, TZ_DT_I64);
    int64_t rss_max = 0;
    for (int64_t i = 0; i < r.N; i++) rss_max = all[i] > rss_max ? all[i] : rss_max;
    tz_info("bench: %lld ranks x %d threads, zero stage %lld, %s | %lld tokens/step | step time "
            "median %.4f s (%lld steps after %lld warm-up) | %.0f tokens/s | host shard %.2f "
            "MiB/rank | activations %.1f MiB/rank | peak RSS %.1f MiB (largest rank)",
            (long long)r.N, w->threads, (long long)cfg->zero.stage, tz_mode_name(cfg->train.mode),
            (long long)tokens, med, (long long)n, (long long)warm, (double)tokens / med,
            (double)r.z.shard_bytes / 1048576.0, (double)r.m->arena.cap / 1048576.0,
            (double)rss_max / 1024.0);
    free(all);
    free(dt);
    run_close(&r);
    return 0;
}
