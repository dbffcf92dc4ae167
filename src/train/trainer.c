/* The training loop (micro-batches, accumulation, ZeRO step, eval, logs, final save), the
 * eval driver and the benchmark driver, over N data-parallel ranks (N = 1 included). */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "train/trainer.h"

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "io/fsutil.h"
#include "io/loss_plot.h"
#include "train/optim.h"
#include "train/qzo.h"
#include "train/run_record.h"
#include "train/task.h"
#include "train/zero.h"

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
    tz_task *task;
    tz_zero z;
    tz_qzo *qzo;      /* train.mode = "qzo": the scales' trainer, in place of ZeRO */
    int training;
    int64_t B, accum, N;
} run;

static void run_open(run *r, const tz_config *cfg, tz_world *w, tz_comm *comm, int training) {
    memset(r, 0, sizeof *r);
    r->cfg = cfg;
    r->w = w;
    r->comm = comm;
    r->training = training;
    if (cfg->train.threads > 0) omp_set_num_threads((int)cfg->train.threads); /* AdamW too */
    r->be = tz_cpu_backend_create((int)cfg->train.threads);
    tz_info("cpu kernel: %s", tz_cpu_kernel_name());
    w->threads = omp_get_max_threads();
    cpu_set_t cpus;
    if (sched_getaffinity(0, sizeof cpus, &cpus) == 0 && CPU_COUNT(&cpus) < w->threads)
        tz_warn("this rank may run on %d CPU(s) but uses %d OpenMP threads: they share cores",
                CPU_COUNT(&cpus), w->threads),
            tz_warn("HINT: give each rank as many cores as threads (mpirun --map-by slot:PE=%d, "
                    "or --bind-to none; srun --cpus-per-task=%d), or set train.threads",
                    w->threads, w->threads);
    r->task = tz_task_create(cfg, r->be, training);
    r->B = r->task->B;
    r->accum = cfg->train.grad_accum;
    r->N = comm->size;
    if (training && cfg->train.mode == TZ_MODE_QZO) {
        r->qzo = tz_qzo_create(cfg, r->task, comm);
    } else if (training) {
        tz_zero_init(&r->z, (int)cfg->zero.stage, cfg->zero.bucket_mb, tz_optim_find("adamw"),
                     r->task->params, r->be, comm, w);
        tz_params_set_grad_hook(r->task->params, tz_zero_grads_ready, &r->z);
    } else if (r->task->n_val == 0) {
        TZ_FATAL_HINT("set data.val", "%s: data.val is not set", cfg->source);
    }
}

static void run_close(run *r) {
    if (r->qzo) tz_qzo_destroy(r->qzo);
    else if (r->training) tz_zero_free(&r->z);
    tz_task_free(r->task);
    tz_cpu_backend_destroy(r->be);
}

typedef struct eval_result {
    double loss;
    int64_t count; /* tokens or images evaluated */
} eval_result;

/* Mean loss over the first `limit` validation rows (all if limit <= 0), in batches of B
 * consecutive rows, batch k on rank k % N; the sums are added over the ranks. With progress,
 * rank 0 prints a line at each tenth of its batches once the evaluation has run 2 s. */
static eval_result evaluate(run *r, int64_t limit, int progress) {
    tz_task *t = r->task;
    const int64_t B = r->B, N = r->N, rank = r->comm->rank;
    int64_t n = limit > 0 && limit < t->n_val ? limit : t->n_val;
    double sum[2] = {0.0, 0.0}; /* loss terms, rows */
    const int64_t mine = n > rank * B ? (n - rank * B + B * N - 1) / (B * N) : 0; /* my batches */
    const double t0 = now_s();
    int64_t done = 0, tenth = 0;
    for (int64_t first = rank * B; first < n; first += B * N) {
        int64_t rows = n - first < B ? n - first : B;
        sum[0] += t->eval_rows(t, first, rows);
        sum[1] += (double)rows;
        done++;
        if (progress && rank == 0 && done * 10 / mine > tenth) {
            tenth = done * 10 / mine;
            double el = now_s() - t0;
            if (el >= 2.0 && done < mine) {
                char a[32], b[32];
                fmt_duration(a, sizeof a, el);
                fmt_duration(b, sizeof b, el / (double)done * (double)(mine - done));
                tz_info("eval: %lld%% | %lld of %lld %s | %s, ETA %s",
                        (long long)(done * 100 / mine), (long long)(first + rows), (long long)n,
                        t->row_name, a, b);
            }
        }
    }
    if (N > 1) tz_comm_all_reduce(r->comm, sum, sum, 2, TZ_DT_F64);
    eval_result e = {sum[0] / (sum[1] * (double)t->row_elems), (int64_t)sum[1] * t->row_count};
    return e;
}

typedef struct step_result {
    double loss, gnorm, lr;
} step_result;

/* One optimizer step over the global batch: rank r's rows of micro-batch k of step s are
 * samples ((s * accum + k) * N + r) * B ... + B - 1 of the shared order. */
static step_result train_step(run *r, int64_t step) {
    const tz_config *cfg = r->cfg;
    const int64_t B = r->B, A = r->accum, N = r->N, rank = r->comm->rank;
    const double total = (double)(B * r->task->row_elems * A * N);
    if (r->qzo) { /* grad_norm: |d|, the directional derivative estimated (before clipping) */
        tz_qzo_stats q = tz_qzo_train_step(r->qzo, step, total);
        step_result s = {q.loss, fabs(q.d), q.lr};
        return s;
    }
    tz_zero_begin_step(&r->z);
    double lsum = 0.0;
    for (int64_t k = 0; k < A; k++) {
        tz_zero_begin_micro(&r->z, k == A - 1);
        lsum += r->task->train_rows(r->task, ((step * A + k) * N + rank) * B, (float)(1.0 / total));
        tz_zero_end_micro(&r->z);
    }
    if (N > 1) tz_comm_all_reduce(r->comm, &lsum, &lsum, 1, TZ_DT_F64);
    step_result s;
    s.loss = lsum / total;
    s.lr = tz_lr_at(step, cfg->train.steps, cfg->optim.warmup, cfg->optim.lr, cfg->optim.min_lr_ratio);
    tz_optim_hparams hp = {s.lr, cfg->optim.beta1, cfg->optim.beta2, cfg->optim.eps,
                           cfg->optim.weight_decay};
    s.gnorm = tz_zero_step(&r->z, &hp, step + 1, cfg->optim.grad_clip);
    if (!isfinite(s.loss) || !isfinite(s.gnorm))
        TZ_FATAL_HINT("lower optim.lr or check the data",
                      "step %lld: loss %g, gradient norm %g are not finite", (long long)step + 1,
                      s.loss, s.gnorm);
    return s;
}

static void print_start(const run *r) {
    const tz_task *t = r->task;
    tz_info("model: %s | activations %.1f MiB per rank", t->describe,
            (double)t->arena_bytes / 1048576.0);
    tz_info("data: %s | %lld ranks x %lld x %lld accum = %lld rows (%lld %s) per step",
            t->data_line, (long long)r->N, (long long)r->B, (long long)r->accum,
            (long long)(r->N * r->B * r->accum), (long long)(r->N * r->B * r->accum * t->row_count),
            t->unit);
    tz_world_print(r->w);
    if (r->qzo) {
        tz_qzo_print(r->qzo);
        return;
    }
    tz_zero_plan_print(&r->z.plan);
    tz_zero_print(&r->z);
    tz_zero_print_memory(&r->z, t->arena_bytes);
}

/* One evaluation record of metrics.jsonl (rank 0). */
static void metrics_eval(FILE *f, int64_t step, eval_result e, const char *unit) {
    char loss[128], now[40];
    tz_record_json_number(loss, sizeof loss, "eval_loss", "%.6f", e.loss);
    tz_record_time_now(now, sizeof now);
    fprintf(f, "{\"step\": %lld, %s, \"eval_%s\": %lld, \"time\": \"%s\"}\n", (long long)step,
            loss, unit, (long long)e.count, now);
}

/* Whether e is a better evaluation than best (a finite loss beats a non-finite one). */
static int eval_better(eval_result e, eval_result best) {
    return isfinite(e.loss) && !(e.loss >= best.loss);
}

/* The last record of metrics.jsonl: what the run did in all (best and final NULL without
 * validation data). */
static void metrics_summary(FILE *f, int64_t steps, int64_t units, const char *unit, double wall,
                            double train_loss, const eval_result *best, int64_t best_step,
                            const eval_result *final, double rss_mib) {
    char tl[128], bl[128] = "\"best_eval_loss\": null", now[40];
    char fl[128] = "\"final_eval_loss\": null";
    tz_record_json_number(tl, sizeof tl, "final_train_loss", "%.9g", train_loss);
    if (best) tz_record_json_number(bl, sizeof bl, "best_eval_loss", "%.6f", best->loss);
    if (final) tz_record_json_number(fl, sizeof fl, "final_eval_loss", "%.6f", final->loss);
    tz_record_time_now(now, sizeof now);
    fprintf(f, "{\"summary\": true, \"steps\": %lld, \"%s\": %lld, \"wall_s\": %.3f, %s, %s, "
            "\"best_eval_step\": %lld, %s, \"peak_rss_mib\": %.1f, \"time\": \"%s\"}\n",
            (long long)steps, unit, (long long)units, wall, tl, bl, (long long)best_step, fl,
            rss_mib, now);
}

static FILE *open_rank0(const tz_config *cfg, const char *name, const char *mode) {
    char path[1100];
    tz_path_join(path, sizeof path, cfg->run.dir, name);
    FILE *f = fopen(path, mode);
    if (!f) TZ_FATAL("cannot write %s: %s", path, strerror(errno));
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
        tz_config_names names;
        tz_family_names(&names);
        printf("# effective config (%s)\n", cfg->source);
        tz_config_write(cfg, &names, stdout);
        FILE *f = open_rank0(cfg, "config.used.cfg", "w");
        tz_config_write(cfg, &names, f);
        if (fclose(f) != 0)
            TZ_FATAL("cannot write %s/config.used.cfg: %s", cfg->run.dir, strerror(errno));
        metrics = open_rank0(cfg, "metrics.jsonl", "w");
    }
    tz_run_record rec;
    tz_record_begin(&rec, cfg->run.dir, w, comm);
    run r;
    run_open(&r, cfg, w, comm, 1);
    print_start(&r);
    const int64_t steps = cfg->train.steps, units = r.N * r.B * r.accum * r.task->row_count;
    const int have_val = r.task->n_val > 0;
    eval_result ev0 = {0, 0}, ev = {0, 0}, best = {0, 0};
    int64_t best_step = 0;
    if (have_val) {
        ev0 = evaluate(&r, cfg->train.eval_windows, 0);
        tz_info("eval before training: val_loss %.4f (%lld %s)", ev0.loss, (long long)ev0.count,
                r.task->unit);
        if (root) metrics_eval(metrics, 0, ev0, r.task->unit);
        best = ev0;
    }
    const double t_loop = now_s();
    step_result s = {0, 0, 0};
    for (int64_t step = 0; step < steps; step++) {
        double t0 = now_s();
        s = train_step(&r, step);
        double t1 = now_s(), tps = (double)units / (t1 - t0);
        if (root) {
            char now[40];
            tz_record_time_now(now, sizeof now);
            fprintf(metrics,
                    "{\"step\": %lld, \"loss\": %.9g, \"lr\": %.6e, \"grad_norm\": %.9g, "
                    "\"%s_per_s\": %.1f, \"step_s\": %.4f, \"time\": \"%s\"}\n",
                    (long long)step + 1, s.loss, s.lr, s.gnorm, r.task->unit, tps, t1 - t0, now);
        }
        if ((step + 1) % cfg->train.log_every == 0 || step + 1 == steps) {
            char eta[32];
            fmt_duration(eta, sizeof eta, (t1 - t_loop) / (double)(step + 1) * (double)(steps - step - 1));
            tz_info("step %lld/%lld | loss %.4f | lr %.2e | grad norm %.3f | %.0f %s/s | ETA %s",
                    (long long)step + 1, (long long)steps, s.loss, s.lr, s.gnorm, tps,
                    r.task->unit, eta);
        }
        if (have_val && cfg->train.eval_every > 0 && (step + 1) % cfg->train.eval_every == 0 &&
            step + 1 != steps) {
            ev = evaluate(&r, cfg->train.eval_windows, 0);
            tz_info("eval at step %lld: val_loss %.4f", (long long)step + 1, ev.loss);
            if (root) metrics_eval(metrics, step + 1, ev, r.task->unit);
            if (eval_better(ev, best)) best = ev, best_step = step + 1;
        }
        if (root) fflush(metrics);
    }
    if (have_val) {
        ev = evaluate(&r, cfg->train.eval_windows, 0);
        tz_info("eval after training: val_loss %.4f (before %.4f, change %+.4f)", ev.loss,
                ev0.loss, ev.loss - ev0.loss);
        if (root) metrics_eval(metrics, steps, ev, r.task->unit);
        if (eval_better(ev, best)) best = ev, best_step = steps;
    }
    const double rss_mib = tz_record_peak_rss_mib(comm);
    if (root) {
        metrics_summary(metrics, steps, steps * units, r.task->unit, now_s() - t_start, s.loss,
                        have_val ? &best : NULL, best_step, have_val ? &ev : NULL, rss_mib);
        if (fclose(metrics) != 0)
            TZ_FATAL("cannot write %s/metrics.jsonl: %s", cfg->run.dir, strerror(errno));
        char out[1100], took[32], err[1024];
        const char *dirs[1] = {cfg->run.dir};
        tz_path_join(out, sizeof out, cfg->run.dir, "loss.png");
        if (steps > 0 && tz_loss_plot_write(dirs, 1, out, err, sizeof err)) /* a picture only */
            tz_warn("no loss curve: %s", err);
        tz_task_save(r.task, out, sizeof out);
        fmt_duration(took, sizeof took, now_s() - t_start);
        tz_info("saved %s | final train loss %.4f | %s", out, s.loss, took);
    }
    tz_comm_barrier(comm); /* no rank leaves before the outputs are written */
    tz_record_end(&rec, cfg->run.dir, comm);
    run_close(&r);
    return 0;
}

int tz_eval_run(const tz_config *cfg, tz_world *w, tz_comm *comm) {
    run r;
    run_open(&r, cfg, w, comm, 0);
    double t0 = now_s();
    eval_result e = evaluate(&r, 0, 1);
    char ppl[64] = ""; /* perplexity: a next-token loss only */
    if (!strcmp(r.task->unit, "tokens"))
        snprintf(ppl, sizeof ppl, " | perplexity %.3f", exp(e.loss));
    tz_info("model %s%s%s | %s: %lld %s | %lld ranks | %.1f s | loss %.4f%s", cfg->model.path,
            cfg->model.adapter[0] ? " + adapter " : "", cfg->model.adapter, cfg->data.val,
            (long long)r.task->n_val, r.task->row_name, (long long)r.N, now_s() - t0, e.loss, ppl);
    tz_info("eval_loss=%.6f %s=%lld", e.loss, r.task->unit, (long long)e.count);
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
    const int64_t steps = cfg->train.steps, units = r.N * r.B * r.accum * r.task->row_count;
    const int64_t warm = steps > 3 ? 2 : 0;
    double *dt = tz_xmalloc((size_t)steps * sizeof *dt);
    for (int64_t step = 0; step < steps; step++) {
        if (step == warm && !r.qzo) tz_zero_clock_reset(&r.z); /* host-step phases after the warm-up */
        double t0 = now_s();
        step_result s = train_step(&r, step);
        dt[step] = now_s() - t0;
        tz_info("bench step %lld/%lld | loss %.4f | %.3f s", (long long)step + 1, (long long)steps,
                s.loss, dt[step]);
    }
    const int64_t n = steps - warm;
    qsort(dt + warm, (size_t)n, sizeof *dt, cmp_double);
    double med = dt[warm + n / 2];
    const double rss_mib = tz_record_peak_rss_mib(comm);
    tz_info("bench: %lld ranks x %d threads, zero stage %lld, %s | %lld %s/step | step time "
            "median %.4f s (%lld steps after %lld warm-up) | %.0f %s/s | host shard %.2f "
            "MiB/rank | activations %.1f MiB/rank | peak RSS %.1f MiB (largest rank)",
            (long long)r.N, w->threads, (long long)cfg->zero.stage, tz_mode_name(cfg->train.mode),
            (long long)units, r.task->unit, med, (long long)n, (long long)warm,
            (double)units / med, r.task->unit,
            (double)(r.qzo ? r.qzo->host_bytes : r.z.sh.bytes) / 1048576.0,
            (double)r.task->arena_bytes / 1048576.0, rss_mib);
    if (!r.qzo) tz_zero_clock_print(&r.z);
    free(dt);
    run_close(&r);
    return 0;
}
