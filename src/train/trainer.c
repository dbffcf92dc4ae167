/* The training loop (micro-batches, accumulation, ZeRO step, eval, logs, final save), the
 * eval driver and the benchmark driver, over N data-parallel ranks (N = 1 included). */
#include "backend/registry.h"
#include "train/trainer.h"

#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "core/error.h"
#include "core/rng.h"
#include "comm/comm.h"
#include "comm/comm_select.h"
#include "comm/world.h"
#include "io/fsutil.h"
#include "io/run_dir.h"
#include "io/loss_plot.h"
#include "io/tfevents.h"
#include "train/checkpoint.h"
#include "train/checkpoint_util.h"
#include "comm/watchdog.h"
#include "bench/bench.h"
#include "task/family.h"
#include "optim/optim.h"
#include "optim/qzo.h"
#include "train/run_record.h"
#include "task/task.h"
#include "optim/zero.h"

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
    tz_comm *gcomm;   /* the gradients' comm when it is not comm (comm.backend: NCCL) */
    tz_backend *be;
    tz_task *task;
    tz_zero z;
    tz_qzo *qzo;      /* train.mode = "qzo": the scales' trainer, in place of ZeRO */
    int training;
    int64_t B, accum, N;
    tz_bench_clock *clock; /* bench's phase clock (train_step's marks); NULL but under bench */
} run;

/* A GPU backend: the rank's GPU (local rank modulo the visible GPUs, chosen at creation), its
 * NUMA node from the PCI bus id (sysfs), the rank re-bound there so that the host shard is
 * allocated on it; one start-up line per rank. */
static void bind_gpu(tz_backend *be, tz_world *w) {
    tz_device_info d;
    be->device_info(be, &d);
    char bus[sizeof d.bus_id];
    for (size_t i = 0; i < sizeof bus; i++)
        bus[i] = (char)(d.bus_id[i] >= 'A' && d.bus_id[i] <= 'Z' ? d.bus_id[i] + 32 : d.bus_id[i]);
    const int node = tz_numa_node_of_pci(bus);
    w->device = d.ordinal;
    if (node >= 0) tz_world_bind_numa(w, node); /* else the CPU choice of tz_world_init stays */
    char where[96];
    if (node >= 0) snprintf(where, sizeof where, "NUMA node %d%s", node, w->numa_bound ? " (bound)" : "");
    else snprintf(where, sizeof where, "NUMA node of the GPU unknown (host shard on node %d)",
                  w->numa_node);
    tz_info_all("rank %d: GPU %d (%s) | bus id %s | %s | %.1f of %.1f GiB free", w->rank,
                d.ordinal, d.name, bus[0] ? bus : "?", where, (double)d.free_bytes / 1073741824.0,
                (double)d.total_bytes / 1073741824.0);
}

/* The CPUs the ranks get: a rank with fewer cores than threads, the ranks of a node with more
 * threads together than cores (they time-share, and the optimizer step, which runs on them,
 * slows by as much), and a job of several Slurm tasks started as one rank (srun forgotten).
 * Warnings: the run goes on. */
static void check_cpus(const tz_world *w) {
    const char *job = getenv("SLURM_JOB_ID"), *ntasks = getenv("SLURM_NTASKS");
    const char *cpt = getenv("SLURM_CPUS_PER_TASK");
    const long long tasks = ntasks ? atoll(ntasks) : 0;
    if (w->rank == 0 && job && tasks > 1 && w->size == 1)
        tz_warn("Slurm job %s has %lld tasks, but this run is 1 rank (started without srun?): "
                "the other tasks' CPUs and GPUs stay idle", job, tasks),
            tz_warn("HINT: launch it with `srun --mpi=pmix turbozero train ...` inside the job, "
                    "as slurm/train.sbatch does, or ask for --ntasks=1");
    if (w->cores > 0 && w->cores < w->threads)
        tz_warn("this rank may run on %d CPU(s) but uses %d OpenMP threads: they share cores",
                w->cores, w->threads),
            tz_warn("HINT: give each rank as many cores as threads (mpirun --map-by slot:PE=%d, "
                    "or --bind-to none; srun --cpus-per-task=%d), or set train.threads",
                    w->threads, w->threads);
    else if (w->local_rank == 0 && w->local_size > 1 && w->node_cores > 0 &&
             w->node_threads > w->node_cores) {
        tz_warn("%d ranks on host %s run %d OpenMP threads on %d cores: they time-share the cores, "
                "and each rank's optimizer step (on its threads) slows by as much", w->local_size,
                w->hostname, w->node_threads, w->node_cores);
        if (job && !(cpt && *cpt))
            tz_warn("HINT: SLURM_CPUS_PER_TASK is not set, so every task may use every core: ask "
                    "for #SBATCH --cpus-per-task=%d (and export SRUN_CPUS_PER_TASK), or set "
                    "train.threads = %d", w->node_cores / w->local_size > 0 ?
                    w->node_cores / w->local_size : 1, w->node_cores / w->local_size > 0 ?
                    w->node_cores / w->local_size : 1);
        else
            tz_warn("HINT: set train.threads = %d (cores / ranks on the node), or give the ranks "
                    "more cores", w->node_cores / w->local_size > 0 ? w->node_cores / w->local_size : 1);
    }
}

/* Before anything large is allocated: the run's memory on one rank, planned without
 * allocating it (bench/bench.h: the model's shapes on a planning backend), against what this
 * rank's GPU and this node's host can give. A run that cannot fit stops here with the plan's
 * figures and a hint, instead of failing to allocate or being killed later. */
static void check_memory(run *r) {
    const tz_config *cfg = r->cfg;
    tz_mem_plan m;
    if (tz_bench_plan_memory(cfg, r->comm->size, r->be->matmul_dtypes, r->training, 0, &m)) {
        tz_info("memory plan: not made at start-up (a %s folder's shapes need its weights read; "
                "`turbozero train CONFIG --dry-run` plans it)", tz_family_of(cfg)->name);
        return;
    }
    m.gpu = r->be->device; /* the backend's bytes are the device's, or host RAM */
    tz_mem_room room;
    tz_mem_room_of(&room, r->be, r->w);
    char line[768], hint[768];
    const int v = tz_mem_plan_check(&m, cfg, &room, line, sizeof line, hint, sizeof hint);
    if (v == 2) {
        char h[1024];
        snprintf(h, sizeof h, "%s; `turbozero train CONFIG --dry-run` shows the whole plan", hint);
        TZ_FATAL_HINT(h, "%s does not fit in memory: %s; per rank: backend %.2f GiB (weights "
                      "%.2f, activations %.2f, gradients %.2f), host %.2f GiB",
                      cfg->source, line, (double)m.backend / 1073741824.0,
                      (double)m.weights / 1073741824.0, (double)m.arena / 1073741824.0,
                      (double)m.grads / 1073741824.0, (double)m.host / 1073741824.0);
    }
    tz_info("memory plan per rank: %s%s", line, v == 1 ? " (above 90%)" : "");
}

static void run_open(run *r, const tz_config *cfg, tz_world *w, tz_comm *comm, int training) {
    memset(r, 0, sizeof *r);
    r->cfg = cfg;
    r->w = w;
    r->comm = comm;
    r->training = training;
    if (cfg->train.threads > 0) omp_set_num_threads((int)cfg->train.threads); /* AdamW too */
    r->be = tz_backend_create(cfg->run.device, w->local_rank,
                              (int)cfg->train.threads);
    tz_backend_set_precision(r->be, cfg->run.precision);
    if (!strcmp(r->be->name, "cpu")) tz_info("cpu kernel: %s", tz_cpu_kernel_name());
    else
        tz_info("backend: %s, GEMM operands %s (fp32 accumulation)", r->be->name,
                r->be->matmul_dtype == TZ_DT_BF16 ? "bf16" : "fp32");
    if (r->be->device) bind_gpu(r->be, w);
    w->threads = omp_get_max_threads();
    tz_world_gather_cpus(w);
    check_cpus(w);
    check_memory(r);
    r->task = tz_task_create(cfg, r->be, training, 0);
    r->B = r->task->B;
    r->accum = cfg->train.grad_accum;
    r->N = comm->size;
    if (training && cfg->train.mode == TZ_MODE_QZO) {
        if (!cfg->optim.offload)
            tz_warn("optim.offload = false: qzo keeps no optimizer state (the setting is unused)");
        r->qzo = tz_qzo_create(cfg, r->task, comm);
    } else if (training) {
        r->gcomm = tz_comm_select(cfg->comm.backend, r->be, comm);
        tz_zero_init_comms(&r->z, (int)cfg->zero.stage, cfg->zero.bucket_mb,
                           tz_optim_at(cfg->optim.name), r->task->params, r->be, comm,
                           r->gcomm ? r->gcomm : comm, w);
        tz_params_set_grad_hook(r->task->params, tz_zero_grads_ready, &r->z);
        if (!cfg->optim.offload) tz_zero_device_optimizer(&r->z);
        r->z.zw.count_changes = cfg->quant.count_changes;
    } else if (r->task->n_val == 0) {
        TZ_FATAL_HINT("set data.val", "%s: data.val is not set", cfg->source);
    }
}

static void run_close(run *r) {
    if (r->qzo) tz_qzo_destroy(r->qzo);
    else if (r->training) tz_zero_free(&r->z);
    tz_comm_destroy(r->gcomm);
    tz_task_free(r->task);
    tz_backend_destroy(r->be);
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
    double sum[3] = {0.0, 0.0, 0.0}; /* loss, rows, loss terms */
    const int64_t mine = n > rank * B ? (n - rank * B + B * N - 1) / (B * N) : 0; /* my batches */
    const double t0 = tz_clock_s();
    int64_t done = 0, tenth = 0;
    for (int64_t first = rank * B; first < n; first += B * N) {
        int64_t rows = n - first < B ? n - first : B;
        sum[0] += t->eval_rows(t, first, rows);
        sum[1] += (double)rows;
        sum[2] += t->terms ? (double)t->terms(t, 1, first, rows) : (double)(rows * t->row_elems);
        done++;
        if (progress && rank == 0 && done * 10 / mine > tenth) {
            tenth = done * 10 / mine;
            double el = tz_clock_s() - t0;
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
    if (N > 1) tz_comm_all_reduce(r->comm, sum, sum, 3, TZ_DT_F64);
    eval_result e = {sum[0] / (sum[2] > 0.0 ? sum[2] : 1.0), (int64_t)sum[1] * t->row_count};
    return e;
}

typedef struct step_result {
    double loss, gnorm, lr;
    double codes; /* share of the quantized weights' codes the step changed; < 0: not counted */
} step_result;

/* One optimizer step over the global batch: rank r's rows of micro-batch k of step s are
 * samples ((s * accum + k) * N + r) * B ... + B - 1 of the shared order. */
static step_result train_step(run *r, int64_t step) {
    tz_watchdog_set_step(step + 1); /* named by a collective timeout */
    const tz_config *cfg = r->cfg;
    const int64_t B = r->B, A = r->accum, N = r->N, rank = r->comm->rank;
    /* the loss is the mean over the step's loss terms: every row element, or the trained
     * tokens of a loss mask (counted alike on every rank, so any N gives the same step) */
    double total = (double)(B * r->task->row_elems * A * N);
    if (r->task->terms) {
        total = (double)r->task->terms(r->task, 0, step * A * N * B, A * N * B);
        if (total < 1.0) total = 1.0; /* no trained token in the step: loss and gradient 0 */
    }
    if (r->qzo) { /* grad_norm: |d|, the directional derivative estimated (before clipping) */
        tz_qzo_stats q = tz_qzo_train_step(r->qzo, step, total);
        step_result s = {q.loss, fabs(q.d), q.lr, -1.0};
        return s;
    }
    tz_zero_begin_step(&r->z);
    double lsum = 0.0;
    for (int64_t k = 0; k < A; k++) {
        tz_zero_begin_micro(&r->z, k == A - 1);
        tz_bench_phase(r->clock, TZ_PH_FORWARD); /* the model's hook starts backward */
        lsum += r->task->train_rows(r->task, ((step * A + k) * N + rank) * B, (float)(1.0 / total));
        tz_bench_phase(r->clock, TZ_PH_COPY);
        tz_zero_end_micro(&r->z);
    }
    tz_bench_phase(r->clock, TZ_PH_OTHER);
    if (N > 1) tz_comm_all_reduce(r->comm, &lsum, &lsum, 1, TZ_DT_F64);
    step_result s;
    s.loss = lsum / total;
    s.lr = tz_lr_at(step, cfg->train.steps, cfg->optim.warmup, cfg->optim.lr, cfg->optim.min_lr_ratio);
    tz_optim_hparams hp = {s.lr, cfg->optim.beta1, cfg->optim.beta2, cfg->optim.eps,
                           cfg->optim.weight_decay};
    tz_bench_phase(r->clock, TZ_PH_OPTIM);
    /* the re-quantization's rounding: stochastic draws a new seed each step (never 0) */
    tz_rng rr = tz_rng_make((uint64_t)cfg->run.seed, (uint64_t)step, TZ_RNG_ROUND, 0);
    r->z.zw.sr = cfg->quant.rounding == TZ_ROUND_STOCHASTIC ? (tz_rng_u64(&rr) | 1) : 0;
    r->z.zw.changed = r->z.zw.counted = 0;
    s.gnorm = tz_zero_step(&r->z, &hp, step + 1, cfg->optim.grad_clip);
    s.codes = -1.0;
    if (r->z.zw.count_changes && r->z.zw.quant_params > 0) {
        double c[2] = {(double)r->z.zw.changed, (double)r->z.zw.counted};
        if (r->N > 1) tz_comm_all_reduce(r->comm, c, c, 2, TZ_DT_F64);
        s.codes = c[1] > 0 ? c[0] / c[1] : -1.0; /* the first step has nothing to compare */
    }
    tz_bench_phase(r->clock, TZ_PH_OTHER);
    if (!isfinite(s.loss) || !isfinite(s.gnorm))
        TZ_FATAL_HINT("lower optim.lr or check the data",
                      "step %lld: loss %g, gradient norm %g are not finite", (long long)step + 1,
                      s.loss, s.gnorm);
    tz_watchdog_set_step(-(step + 1)); /* between steps until the next one begins */
    return s;
}

/* The learning rates each train.mode is usually run at (optim.lr): AdamW on LoRA adapters,
 * AdamW on every weight, and qzo's step on the scales, where lr multiplies a gradient-sized
 * direction (docs/guide.md, "Zeroth-order training of the scales"). Outside: a warning. */
static const struct {
    double lo, hi;
} lr_usual[3] = {{1e-6, 1e-2}, {1e-7, 3e-3}, {1e-9, 5e-4}};

/* Rank 0's watch over the training loss. One batch's loss differs from the next by tens of
 * percent on varied data, so the mean of this run's first 5 steps is its start and the mean
 * of the last 10 steps after them is compared: above 1.3 x start (and 0.1 above it) at 5
 * steps in a row is a divergence, warned about once, with the learning rate to look at. */
#define DIVERGE_START 5
#define DIVERGE_WINDOW 10
typedef struct divergence {
    int64_t seen, above;
    double start, last[DIVERGE_WINDOW];
    int warned;
} divergence;

static void divergence_watch(divergence *d, const tz_config *cfg, int64_t step, double loss) {
    if (d->warned || !isfinite(loss)) return;
    if (d->seen < DIVERGE_START) d->start += loss / DIVERGE_START;
    else d->last[(d->seen - DIVERGE_START) % DIVERGE_WINDOW] = loss;
    if (++d->seen < DIVERGE_START + DIVERGE_WINDOW) return;
    double mean = 0.0;
    for (int i = 0; i < DIVERGE_WINDOW; i++) mean += d->last[i] / DIVERGE_WINDOW;
    d->above = mean > fmax(1.3 * d->start, d->start + 0.1) ? d->above + 1 : 0;
    if (d->above < 5) return;
    const int mode = cfg->train.mode;
    d->warned = 1;
    tz_warn("step %lld: the training loss is climbing: its mean over the last %d steps, %.4f, has "
            "stayed above 1.3 x its start (%.4f, the mean of the first %d steps) for %lld steps",
            (long long)step, DIVERGE_WINDOW, mean, d->start, DIVERGE_START, (long long)d->above);
    tz_warn("HINT: lower optim.lr (now %g; train.mode = \"%s\" usually runs at %g to %g)%s",
            cfg->optim.lr, tz_mode_name(mode), lr_usual[mode].lo, lr_usual[mode].hi,
            mode == TZ_MODE_QZO ? ", or qzo.clip" : ", or optim.grad_clip");
}

static void print_start(const run *r) {
    const tz_task *t = r->task;
    tz_info("model: %s | activations %.1f MiB per rank", t->describe,
            (double)t->arena_bytes / 1048576.0);
    const tz_config *cfg = r->cfg; /* a warning, not an error: short trial runs keep the default */
    if (r->comm->rank == 0 && cfg->optim.warmup >= cfg->train.steps)
        tz_warn("optim.warmup %lld >= train.steps %lld: the learning rate rises for the whole "
                "run and peaks at %.3g, never reaching optim.lr %g (lower optim.warmup for a "
                "warmup + cosine schedule)", (long long)cfg->optim.warmup,
                (long long)cfg->train.steps,
                cfg->optim.lr * (double)cfg->train.steps / (double)cfg->optim.warmup, cfg->optim.lr);
    const int mode = cfg->train.mode;
    if (r->comm->rank == 0 && r->training &&
        (cfg->optim.lr > lr_usual[mode].hi || cfg->optim.lr < lr_usual[mode].lo))
        tz_warn("optim.lr %g is far outside what train.mode = \"%s\" usually runs at (%g to %g)%s",
                cfg->optim.lr, tz_mode_name(mode), lr_usual[mode].lo, lr_usual[mode].hi,
                mode == TZ_MODE_QZO ? ": qzo's lr multiplies a gradient-sized step, not an "
                "AdamW one; a LoRA or full lr makes its loss climb within tens of steps" : "");
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
    tz_zero_print_memory(&r->z, t->arena_bytes, t->host_act_bytes);
}

/* One record: to metrics.jsonl, and its numbers as TensorBoard scalars (rank 0). */
static void metrics_emit(FILE *f, tz_tfevents *tb, const char *line) {
    fputs(line, f);
    tz_tfevents_json_line(tb, line);
}

/* One evaluation record of metrics.jsonl (rank 0). */
static void metrics_eval(FILE *f, tz_tfevents *tb, int64_t step, eval_result e, const char *unit) {
    char loss[128], now[40], line[512];
    tz_record_json_number(loss, sizeof loss, "eval_loss", "%.6f", e.loss);
    tz_record_time_now(now, sizeof now);
    snprintf(line, sizeof line, "{\"step\": %lld, %s, \"eval_%s\": %lld, \"time\": \"%s\"}\n",
             (long long)step, loss, unit, (long long)e.count, now);
    metrics_emit(f, tb, line);
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

/* Rank 0: tb/'s events written so far, or (a failed write) a warning and no events from
 * there on: they are a view of metrics.jsonl, which keeps every record. close: the last
 * write. */
static void tb_flush(tz_tfevents *tb, int close) {
    char err[1600];
    if (!tb->f)
        return;
    if (!(close ? tz_tfevents_close(tb, err, sizeof err) : tz_tfevents_flush(tb, err, sizeof err)))
        return;
    tz_warn("%s; no TensorBoard events from here on (metrics.jsonl keeps every record)", err);
    tz_tfevents_discard(tb);
}

/* Rank 0: the records so far out to metrics.jsonl, stopping the run at the first failure,
 * and to tb/. */
static void metrics_flush(tz_line_log *m, tz_tfevents *tb, const tz_run_out *o, int64_t step) {
    char err[2400];
    if (tz_line_log_flush(m, err, sizeof err))
        TZ_FATAL_HINT("free space or fix the cause, then run again: nothing in run.dir was "
                      "replaced", "step %lld: %s (this run's outputs so far are in %s)",
                      (long long)step, err, o->stage);
    tb_flush(tb, 0);
}

/* ---------------------------------------------------------------- train.keep_best, export */

/* Rank 0: the task's weights as trained so far saved into stage/best/ (adapter or model). */
static void save_into(run *r, const char *stage, const char *sub) {
    char dir[1200], out[1200], err[2400];
    tz_path_join(dir, sizeof dir, stage, sub);
    if (tz_mkdir_p(dir, err, sizeof err)) TZ_FATAL("%s", err);
    tz_task_save(r->task, dir, out, sizeof out);
}

/* train.keep_best, after the final weights are saved: stage/best/ gets the weights of the
 * best evaluation, read back from its checkpoint (the model is left holding them), or the
 * final ones when the last evaluation was the best. Collective. */
static void save_best(run *r, const char *stage, int64_t best_step) {
    const int root = r->comm->rank == 0;
    const int64_t steps = r->cfg->train.steps;
    char dir[1200], folder[1300];
    if (best_step <= 0) {
        tz_info("train.keep_best: the evaluation before training was the best; no best/ "
                "written (the starting weights are the best)");
        return;
    }
    tz_path_join(dir, sizeof dir, r->cfg->run.dir, "checkpoints");
    snprintf(folder, sizeof folder, "%s/step-%lld", dir, (long long)best_step);
    int64_t have = best_step == steps || tz_path_exists(folder);
    tz_comm_bcast(r->comm, &have, 1, TZ_DT_I64, 0); /* rank 0's file system decides */
    if (!have) {
        tz_warn("train.keep_best: the best evaluation, at step %lld, has no checkpoint in %s "
                "(pruned before train.keep_best was set?): no best/ written",
                (long long)best_step, dir);
        return;
    }
    if (best_step < steps) {
        tz_ckpt_state st;
        tz_ckpt_load(r->cfg, &r->z, folder, &st);
    }
    if (root) save_into(r, stage, "best");
    tz_info("train.keep_best: the weights of step %lld (best eval) saved in %s/best", (long long)best_step,
            r->cfg->run.dir);
}

int tz_ckpt_export_run(const tz_config *cfg, tz_world *w, tz_comm *comm, const char *folder,
                       const char *out) {
    run r;
    run_open(&r, cfg, w, comm, 1);
    if (r.qzo) TZ_FATAL("export: train.mode = \"qzo\" writes no checkpoints");
    tz_ckpt_state st;
    tz_ckpt_load(cfg, &r.z, folder, &st);
    if (comm->rank == 0) { /* saved under a temporary name beside out, then renamed to out */
        char tmp[1400], saved[1200], err[2400];
        snprintf(tmp, sizeof tmp, "%s.export-tmp", out);
        if (tz_rm_rf(tmp, err, sizeof err) || tz_mkdir_p(tmp, err, sizeof err)) TZ_FATAL("%s", err);
        tz_task_save(r.task, tmp, saved, sizeof saved);
        if (tz_path_exists(out) && tz_rm_rf(out, err, sizeof err)) TZ_FATAL("%s", err);
        if (rename(saved, out) != 0)
            TZ_FATAL("export: cannot rename %s to %s: %s", saved, out, strerror(errno));
        if (tz_rm_rf(tmp, err, sizeof err)) TZ_FATAL("%s", err);
        tz_info("exported %s (step %lld) to %s as %s", folder, (long long)st.step, out,
                strrchr(saved, '/') + 1);
    }
    tz_comm_barrier(comm);
    run_close(&r);
    return 0;
}

int tz_train_run(const tz_config *cfg, tz_world *w, tz_comm *comm) {
    return tz_train_run_from(cfg, w, comm, NULL);
}

int tz_train_run_from(const tz_config *cfg, tz_world *w, tz_comm *comm, const char *resume) {
    const double t_start = tz_clock_s();
    const int root = comm->rank == 0;
    tz_line_log mlog = {0};
    tz_run_out out_dir = {0}; /* rank 0: run.dir locked, outputs staged in out_dir.stage */
    if (root) { /* decided on rank 0; a refusal aborts every rank */
        char err[2400], path[1200];
        tz_run_out_begin(&out_dir, cfg->run.dir, cfg->run.overwrite, resume != NULL);
        tz_config_names names;
        tz_family_names(&names);
        if (!resume) { /* once per job: a requeued --resume names only what differs */
            printf("# effective config (%s)\n", cfg->source);
            tz_config_write(cfg, &names, stdout);
        } else {
            tz_info("effective config: %s/config.used.cfg, as the run started (not printed again "
                    "on --resume; settings other than the checkpoint's are named below)",
                    cfg->run.dir);
        }
        tz_path_join(path, sizeof path, out_dir.stage, "config.used.cfg");
        tz_line_log f;
        if (tz_line_log_open(&f, path, err, sizeof err)) TZ_FATAL("%s", err);
        tz_config_write(cfg, &names, f.f);
        if (tz_line_log_close(&f, err, sizeof err)) TZ_FATAL("cannot write %s", err);
        tz_path_join(path, sizeof path, out_dir.stage, TZ_METRICS_FILE);
        if (tz_line_log_open(&mlog, path, err, sizeof err)) TZ_FATAL("%s", err);
    }
    FILE *metrics = mlog.f;
    tz_run_record rec;
    tz_record_begin(&rec, out_dir.stage, out_dir.run_id, w, comm);
    run r;
    run_open(&r, cfg, w, comm, 1);
    if (root) {
        tz_device_info di;
        r.be->device_info(r.be, &di);
        tz_record_device(&rec, out_dir.stage, r.be->name, di.name);
    }
    print_start(&r);
    int stopped = tz_ckpt_stop_at_start(comm, "load", 0); /* a signal now: 75, nothing new */
    const int64_t steps = cfg->train.steps, units = r.N * r.B * r.accum * r.task->row_count;
    const int have_val = r.task->n_val > 0;
    eval_result ev0 = {0, 0}, ev = {0, 0}, best = {0, 0};
    int64_t best_step = 0;
    tz_ckpt_state ck = {.global_batch = r.N * r.B * r.accum};
    if (r.qzo && ((resume && *resume) || cfg->train.checkpoint_every > 0)) /* no shard to save */
        TZ_FATAL_HINT("set train.checkpoint_every = 0 and start qzo runs without --resume PATH",
                      "%s: train.mode = \"qzo\" writes no checkpoints yet (%s)", cfg->source,
                      resume ? "--resume PATH" : "train.checkpoint_every > 0");
    if (r.qzo && resume && root) /* a requeued job: it starts over */
        tz_warn("--resume: train.mode = \"qzo\" writes no checkpoints: starting from step 0");
    const int resumed = !stopped && resume && !r.qzo &&
                        tz_ckpt_resume(cfg, &r.z, resume, out_dir.run_id, ck.global_batch, &ck);
    if (root && resume && !stopped) { /* the timeline resumed: its checkpoints, its log to its step */
        tz_run_out_resumed(&out_dir, resumed ? ck.folder : NULL, resumed ? ck.step : 0,
                           resumed ? ck.run_id : "");
        tz_run_out_resume_log(&out_dir, &mlog, resumed ? ck.step : -1);
    }
    snprintf(ck.run_id, sizeof ck.run_id, "%s", out_dir.run_id); /* rank 0 writes it */
    snprintf(rec.run_id, sizeof rec.run_id, "%s", out_dir.run_id);
    tz_tfevents tb = {0};
    if (root) {
        char dir[1200], err[1400];
        if (resume) tz_record_resumed(&rec, out_dir.stage, &out_dir, resumed ? ck.step : 0);
        tz_path_join(dir, sizeof dir, out_dir.stage, "tb");
        if (tz_tfevents_open(&tb, dir, err, sizeof err)) TZ_FATAL("%s", err);
        if (resume && tz_line_log_flush(&mlog, err, sizeof err) == 0) /* the records kept */
            tz_tfevents_json_file(&tb, mlog.path);
    }
    stopped = stopped || (resume && tz_ckpt_stop_at_start(comm, "resume", ck.step));
    if (resumed && ck.have_eval) {
        ev0 = (eval_result){ck.eval0, ck.eval0_count};
        best = (eval_result){ck.best, ck.best_count};
        best_step = ck.best_step;
    } else if (have_val && !stopped) {
        ev0 = evaluate(&r, cfg->train.eval_windows, 0);
        tz_info("eval before training: val_loss %.4f (%lld %s)", ev0.loss, (long long)ev0.count,
                r.task->unit);
        if (root) metrics_eval(metrics, &tb, 0, ev0, r.task->unit);
        best = ev0;
    }
    const double t_loop = tz_clock_s();
    step_result s = {0, 0, 0, -1.0};
    const int64_t first = resumed ? ck.step : 0;
    stopped = stopped || tz_ckpt_stop_at_start(comm, "start", first);
    if (r.qzo && !stopped) tz_ckpt_signals_default(); /* qzo saves nothing: default action */
    const int early = stopped;
    divergence dv = {0};
    for (int64_t step = first; step < steps && !stopped; step++) {
        double t0 = tz_clock_s();
        s = train_step(&r, step);
        double t1 = tz_clock_s(), tps = (double)units / (t1 - t0);
        if (root) {
            char now[40], rec_line[512];
            tz_record_time_now(now, sizeof now);
            char codes[48] = "";
            if (s.codes >= 0) snprintf(codes, sizeof codes, ", \"codes_changed\": %.6g", s.codes);
            snprintf(rec_line, sizeof rec_line,
                     "{\"step\": %lld, \"loss\": %.9g, \"lr\": %.6e, \"grad_norm\": %.9g%s, "
                     "\"%s_per_s\": %.1f, \"step_s\": %.4f, \"time\": \"%s\"}\n",
                     (long long)step + 1, s.loss, s.lr, s.gnorm, codes, r.task->unit, tps, t1 - t0,
                     now);
            metrics_emit(metrics, &tb, rec_line);
            divergence_watch(&dv, cfg, step + 1, s.loss);
        }
        if ((step + 1) % cfg->train.log_every == 0 || step + 1 == steps) {
            char eta[32];
            fmt_duration(eta, sizeof eta, (t1 - t_loop) / (double)(step + 1 - first) * (double)(steps - step - 1));
            char codes[48] = "";
            if (s.codes >= 0) snprintf(codes, sizeof codes, " | codes changed %.4f%%", 100 * s.codes);
            tz_info("step %lld/%lld | loss %.4f | lr %.2e | grad norm %.3f%s | %.0f %s/s | ETA %s",
                    (long long)step + 1, (long long)steps, s.loss, s.lr, s.gnorm, codes, tps,
                    r.task->unit, eta);
        }
        if (have_val && cfg->train.eval_every > 0 && (step + 1) % cfg->train.eval_every == 0 &&
            step + 1 != steps) {
            ev = evaluate(&r, cfg->train.eval_windows, 0);
            tz_info("eval at step %lld: val_loss %.4f", (long long)step + 1, ev.loss);
            if (root) metrics_eval(metrics, &tb, step + 1, ev, r.task->unit);
            if (eval_better(ev, best)) best = ev, best_step = step + 1;
        }
        if (root) metrics_flush(&mlog, &tb, &out_dir, step + 1);
        /* checkpoint every train.checkpoint_every steps, and when a signal asks to stop */
        tz_ckpt_fault("step", step + 1, comm->rank);
        stopped = tz_ckpt_stop_agreed(comm) && step + 1 < steps;
        const int new_best = cfg->train.keep_best && have_val && best_step == step + 1 &&
                             step + 1 < steps; /* train.keep_best: a checkpoint of it */
        if (stopped || new_best || (cfg->train.checkpoint_every > 0 && step + 1 < steps &&
                                    (step + 1) % cfg->train.checkpoint_every == 0)) {
            ck.step = step + 1;
            ck.have_eval = have_val;
            ck.eval0 = ev0.loss, ck.eval0_count = ev0.count;
            ck.best = best.loss, ck.best_count = best.count, ck.best_step = best_step;
            tz_ckpt_write(cfg, &r.z, &ck, cfg->train.keep_checkpoints);
        }
    }
    if (stopped) { /* the outputs wait in run.dir/staging for the resumed run */
        char err[2400];
        if (root && tz_line_log_close(&mlog, err, sizeof err))
            TZ_FATAL("cannot write %s", err);
        if (root) tb_flush(&tb, 1);
        tz_record_stop(&rec, out_dir.stage, early ? first : ck.step, comm);
        if (root) tz_run_lock_release(&out_dir.lock);
        if (early)
            tz_info("stopped during start-up, having written nothing; continue with `turbozero "
                    "train ... --resume` (exit status %d)", TZ_EXIT_REQUEUE);
        else
            tz_info("stopped after step %lld of %lld; continue with `turbozero train ... --resume` "
                    "(exit status %d)", (long long)ck.step, (long long)steps, TZ_EXIT_REQUEUE);
        tz_comm_barrier(comm);
        run_close(&r);
        return TZ_EXIT_REQUEUE;
    }
    if (have_val) {
        ev = evaluate(&r, cfg->train.eval_windows, 0);
        tz_info("eval after training: val_loss %.4f (before %.4f, change %+.4f)", ev.loss,
                ev0.loss, ev.loss - ev0.loss);
        if (root) metrics_eval(metrics, &tb, steps, ev, r.task->unit);
        if (eval_better(ev, best)) best = ev, best_step = steps;
    }
    const double rss_mib = tz_record_peak_rss_mib(comm);
    char out[1200];
    if (root) { /* the result first, the logs second: a failing log write names a saved result */
        char png[1200], err[2400];
        tz_task_save(r.task, out_dir.stage, out, sizeof out);
        metrics_summary(metrics, steps, steps * units, r.task->unit, tz_clock_s() - t_start, s.loss,
                        have_val ? &best : NULL, best_step, have_val ? &ev : NULL, rss_mib);
        tb_flush(&tb, 1);
        if (tz_line_log_close(&mlog, err, sizeof err))
            TZ_FATAL_HINT("free space or fix the cause: nothing in run.dir was replaced",
                          "%s (the trained result is complete in %s)", err, out);
        /* the legend names the run after run.dir's folder, not the staging folder drawn from */
        char name[sizeof cfg->run.dir];
        const char *dirs[1] = {out_dir.stage}, *names[1] = {name};
        snprintf(name, sizeof name, "%s", cfg->run.dir);
        for (size_t k = strlen(name); k > 1 && name[k - 1] == '/'; k--) name[k - 1] = 0;
        if (strrchr(name, '/')) memmove(name, strrchr(name, '/') + 1, strlen(strrchr(name, '/')));
        tz_path_join(png, sizeof png, out_dir.stage, "loss.png");
        if (steps > 0 && tz_loss_plot_write(&tz_metrics_keys, dirs, names, 1, png, err, sizeof err)) /* a picture only */
            tz_warn("no loss curve: %s", err);
    }
    if (cfg->train.keep_best && have_val) save_best(&r, out_dir.stage, best_step);
    tz_record_end(&rec, out_dir.stage, steps, comm); /* rank 0 writes run.json */
    if (root) {
        char took[32], name[64], saved[1200];
        tz_run_out_commit(&out_dir);
        fmt_duration(took, sizeof took, tz_clock_s() - t_start);
        snprintf(name, sizeof name, "%s", strrchr(out, '/') + 1); /* adapter or model */
        tz_path_join(saved, sizeof saved, cfg->run.dir, name);
        tz_info("saved %s | final train loss %.4f | %s", saved, s.loss, took);
    }
    tz_comm_barrier(comm); /* no rank leaves before the outputs are committed */
    run_close(&r);
    return 0;
}

int tz_eval_run(const tz_config *cfg, tz_world *w, tz_comm *comm) {
    run r;
    run_open(&r, cfg, w, comm, 0);
    double t0 = tz_clock_s();
    /* the windows (images) a training run's evaluations use: train.eval_windows, 0 = all */
    const int64_t limit = cfg->train.eval_windows, n = limit > 0 && limit < r.task->n_val ?
                                                          limit : r.task->n_val;
    eval_result e = evaluate(&r, limit, 1);
    char ppl[64] = ""; /* perplexity: a next-token loss only */
    if (!strcmp(r.task->unit, "tokens"))
        snprintf(ppl, sizeof ppl, " | perplexity %.3f", exp(e.loss));
    tz_info("model %s%s%s | %s: %lld %s | %lld ranks | %.1f s | loss %.4f%s", cfg->model.path,
            cfg->model.adapter[0] ? " + adapter " : "", cfg->model.adapter, cfg->data.val,
            (long long)n, r.task->row_name, (long long)r.N, tz_clock_s() - t0, e.loss, ppl);
    if (n < r.task->n_val)
        tz_info("eval: the first %lld of %lld %s (train.eval_windows = %lld; 0 evaluates all)",
                (long long)n, (long long)r.task->n_val, r.task->row_name, (long long)limit);
    tz_info("eval_loss=%.6f %s=%lld", e.loss, r.task->unit, (long long)e.count);
    run_close(&r);
    return 0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The gradient hook under bench: ZeRO's, inside a copies phase (its host copies; its
 * collectives and transfers nest their own phases). ctx: the run. */
static void bench_grads_ready(void *ctx, int64_t ready_flat) {
    run *r = ctx;
    tz_bench_push(r->clock, TZ_PH_COPY);
    tz_zero_grads_ready(&r->z, ready_flat);
    tz_bench_pop(r->clock);
}

/* Whether run.device will give a GPU backend. */
static int bench_on_gpu(const tz_config *cfg) {
    return cfg->run.device == TZ_DEVICE_CUDA ||
           (cfg->run.device == TZ_DEVICE_AUTO && tz_cuda_device_count() > 0);
}

static int g_bench_split = 1;
void tz_bench_set_split(int on) { g_bench_split = on; }

int tz_bench_run(const tz_config *cfg, tz_world *w, tz_comm *comm) {
    const tz_bench_preset *bp = tz_bench_preset_of(cfg);
    if (bp && bp->gpu_only && !bench_on_gpu(cfg))
        TZ_FATAL_HINT("run it where a GPU is visible (run.device = \"auto\" or \"cuda\"); on "
                      "this machine plan it with --dry-run, or time --preset llama-tiny",
                      "bench --preset %s needs a GPU: a step is about 100 TFLOP, hours on a "
                      "CPU (run.device = \"%s\"%s)", bp->name, tz_device_name(cfg->run.device),
                      tz_cuda_device_count() > 0 ? "" : ", no GPU visible");
    tz_bench_clock clk; /* the run's phase clock, for this bench alone */
    memset(&clk, 0, sizeof clk);
    tz_comm *tc = tz_bench_comm_wrap(comm, &clk);
    run r;
    run_open(&r, cfg, w, tc, 1);
    clk.be = r.be;
    tz_bench_backend_wrap(r.be, &clk);
    if (!r.qzo) {
        r.task->params->backward_hook = tz_bench_backward_begins;
        r.task->params->backward_hook_ctx = &clk;
        tz_params_set_grad_hook(r.task->params, bench_grads_ready, &r);
    }
    r.clock = &clk;
    print_start(&r);
    const int64_t steps = cfg->train.steps, units = r.N * r.B * r.accum * r.task->row_count;
    const int64_t warm = steps > 3 ? 2 : 0;
    /* the phase split: on the host, of the timed steps themselves (the clock costs nothing
     * there); on a device, of extra steps after them, since it synchronises at every phase
     * boundary and would slow the timed ones */
    const int64_t extra = r.be->device && !r.qzo && steps > 0 && g_bench_split ? 2 : 0;
    double *dt = tz_xmalloc((size_t)(steps > 0 ? steps : 1) * sizeof *dt);
    size_t used_max = 0, mem_total = 0;
    for (int64_t step = 0; step < steps + extra; step++) {
        if (step == warm && !r.qzo) tz_zero_clock_reset(&r.z); /* host-step phases after the warm-up */
        clk.on = !r.qzo && (r.be->device ? extra && step >= steps : step >= warm);
        tz_bench_step_begin(&clk);
        double t0 = tz_clock_s();
        step_result s = train_step(&r, step);
        r.be->sync(r.be);
        double t = tz_clock_s() - t0;
        tz_bench_step_end(&clk);
        if (step < steps) dt[step] = t;
        tz_device_info di;
        r.be->device_info(r.be, &di);
        const size_t fr = di.free_bytes, tot = di.total_bytes;
        if (tot >= fr && tot - fr > used_max) used_max = tot - fr;
        mem_total = tot;
        if (step < steps)
            tz_info("bench step %lld/%lld | loss %.4f | %.3f s", (long long)step + 1,
                    (long long)steps, s.loss, t);
        else
            tz_info("bench extra step %lld/%lld | loss %.4f | %.3f s (phase split, synchronised)",
                    (long long)(step - steps + 1), (long long)extra, s.loss, t);
    }
    const int64_t n = steps - warm;
    double med = 0.0;
    if (n > 0) {
        qsort(dt + warm, (size_t)n, sizeof *dt, cmp_double);
        med = dt[warm + n / 2];
    }
    const double rss_mib = tz_record_peak_rss_mib(tc);
    tz_info("bench: %lld ranks x %d threads, zero stage %lld, %s | %lld %s/step | step time "
            "median %.4f s (%lld steps after %lld warm-up) | %.0f %s/s | host shard %.2f "
            "MiB/rank | activations %.1f MiB/rank | peak RSS %.1f MiB (largest rank)",
            (long long)r.N, w->threads, (long long)cfg->zero.stage, tz_mode_name(cfg->train.mode),
            (long long)units, r.task->unit, med, (long long)n, (long long)warm,
            med > 0 ? (double)units / med : 0.0, r.task->unit,
            (double)(r.qzo ? r.qzo->host_bytes : r.z.sh.bytes) / 1048576.0,
            (double)r.task->arena_bytes / 1048576.0, rss_mib);
    const double G = 1073741824.0;
    const int gpu = !strcmp(r.be->name, "cuda");
    tz_info_all("bench memory: allocator peak %.3f GiB (%zu bytes, the program's own count of "
                "%s memory) | %s %.3f of %.3f GiB in use after a step, at most (%s)",
                (double)r.be->peak_bytes / G, r.be->peak_bytes, r.be->device ? "device" : "backend",
                gpu ? "GPU" : "host RAM", (double)used_max / G, (double)mem_total / G,
                gpu ? "cudaMemGetInfo: the whole GPU, the CUDA context, cuBLAS, op scratch and "
                      "other processes included"
                    : "the whole machine, from sysconf");
    if (clk.steps > 0) {
        char line[512];
        size_t at = 0;
        double sum = 0.0;
        for (int p = 0; p < TZ_PH_N; p++) sum += clk.sec[p];
        for (int p = 0; p < TZ_PH_N && at < sizeof line; p++) {
            int k = snprintf(line + at, sizeof line - at, "%s%s %.4f s (%.0f%%)", p ? " | " : "",
                             tz_bench_phase_names[p], clk.sec[p] / (double)clk.steps,
                             sum > 0 ? 100.0 * clk.sec[p] / sum : 0.0);
            if (k > 0) at += (size_t)k;
        }
        tz_info_all("step split, mean of %lld %s: %s | sum %.4f s%s", (long long)clk.steps,
                    extra ? "extra steps" : "timed steps", line, sum / (double)clk.steps,
                    extra ? " (every phase boundary synchronised the device: bench only)" : "");
    }
    if (!r.qzo) tz_zero_clock_print(&r.z);
    free(dt);
    r.clock = NULL;
    run_close(&r);
    tz_bench_comm_unwrap(tc);
    return 0;
}
