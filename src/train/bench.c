/* `turbozero bench`'s own parts: the presets (shapes built in memory, random weights and
 * data), the planning backend and the dry run, and the phase clock of a step. */
#define _GNU_SOURCE /* MAP_NORESERVE */
#include "train/bench.h"
#include "train/step_model.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "mpi/comm.h"
#include "mpi/world.h"
#include "quant/tq_layout.h"
#include "train/family.h"
#include "train/optim.h"
#include "train/task.h"

/* ---- presets ---- */

#define LORA_7B                                                                              \
    "train.mode=lora", "lora.rank=16", "lora.alpha=32", "lora.targets=all"
static const tz_bench_preset presets[] = {
    {"llama2-7b", "llama",
     "Llama-2-7B shape (dim 4096, MLP 11008, 32 layers, 32 heads, vocab 32000, untied): "
     "LoRA r16 on all 7 projections, 4-bit TurboQuant base, seq 2048, micro-batch 1, "
     "checkpointing",
     1, {32000, 4096, 11008, 32, 32, 32, 0, 4096},
     {LORA_7B, "quant.bits=4", "quant.group=128", "data.seq_len=2048", "train.micro_batch=1",
      "train.checkpointing=true", "train.steps=8", "optim.warmup=0", NULL}},
    {"llama-tiny", "llama",
     "the same recipe on a tiny untied Llama (dim 128, MLP 352, 2 layers, 4/2 heads, vocab "
     "256), seq 128, micro-batch 4: the CPU-sized stand-in",
     0, {256, 128, 352, 2, 4, 2, 0, 2048},
     {LORA_7B, "quant.bits=4", "quant.group=64", "data.seq_len=128", "train.micro_batch=4",
      "train.checkpointing=true", "train.steps=4", "optim.warmup=0", NULL}},
    {"dit-xl-2", "dit",
     "DiT-XL/2 shape (4x32x32 latents, patch 2, hidden 1152, depth 28, 16 heads, 1000 "
     "classes, learned sigma): full fine-tuning, batch 32",
     1, {32, 2, 4, 1152, 28, 16, 1000, 0},
     {"train.mode=full", "quant.bits=0", "train.micro_batch=32", "train.checkpointing=false",
      "train.steps=8", "optim.warmup=0", "lora.rank=16", "lora.alpha=32", "lora.targets=all",
      NULL}},
    {"dit-tiny", "dit",
     "the same recipe on a tiny DiT (4x8x8 latents, patch 2, hidden 64, depth 2, 4 heads, 10 "
     "classes), batch 8: the CPU-sized stand-in",
     0, {8, 2, 4, 64, 2, 4, 10, 0},
     {"train.mode=full", "quant.bits=0", "train.micro_batch=8", "train.checkpointing=false",
      "train.steps=4", "optim.warmup=0", "lora.rank=16", "lora.alpha=32", "lora.targets=all",
      NULL}},
};
#define NPRESETS ((int)(sizeof presets / sizeof presets[0]))

const tz_bench_preset *tz_bench_preset_find(const char *name) {
    for (int i = 0; i < NPRESETS; i++)
        if (!strcmp(presets[i].name, name)) return &presets[i];
    return NULL;
}

const char *tz_bench_preset_list(char *buf, size_t n) {
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; i < NPRESETS && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%s%s", i == 0 ? "" : i + 1 < NPRESETS ?
                                 ", " : " or ", presets[i].name);
    return buf;
}

const tz_bench_preset *tz_bench_preset_of(const tz_config *cfg) {
    const size_t k = strlen(TZ_BENCH_PRESET_PREFIX);
    if (strncmp(cfg->model.path, TZ_BENCH_PRESET_PREFIX, k)) return NULL;
    const tz_bench_preset *p = tz_bench_preset_find(cfg->model.path + k);
    if (!p) {
        char names[256];
        TZ_FATAL("model.path %s: no such bench preset (expected %s)", cfg->model.path,
                 tz_bench_preset_list(names, sizeof names));
    }
    return p;
}

void tz_bench_preset_config(tz_config *cfg, const tz_config_names *names, const char *preset,
                            const char *const *sets, int nset) {
    const tz_bench_preset *p = tz_bench_preset_find(preset);
    char list[256];
    if (!p)
        TZ_FATAL_HINT("turbozero bench --help lists them", "bench --preset %s: expected %s",
                      preset, tz_bench_preset_list(list, sizeof list));
    static char arch[64], path[TZ_PATH_MAX], train[64];
    snprintf(arch, sizeof arch, "model.arch=%s", p->arch);
    snprintf(path, sizeof path, "model.path=%s%s", TZ_BENCH_PRESET_PREFIX, p->name);
    snprintf(train, sizeof train, "data.train=(random %s)",
             strcmp(p->arch, "dit") ? "tokens" : "images");
    const char **all = tz_xcalloc((size_t)nset + 24, sizeof *all);
    int n = 0;
    all[n++] = arch, all[n++] = path, all[n++] = train;
    for (int i = 0; p->sets[i]; i++) all[n++] = p->sets[i];
    for (int i = 0; i < nset; i++) all[n++] = sets[i];
    tz_config_load(cfg, names, NULL, all, n);
    free(all);
    snprintf(cfg->source, sizeof cfg->source, "bench --preset %s", p->name);
    if (strcmp(cfg->model.path + strlen(TZ_BENCH_PRESET_PREFIX), p->name))
        TZ_FATAL("bench --preset %s: model.path is the preset's (do not --set it)", p->name);
}

/* ---- random weights and data ---- */

#define FILL_CHUNK ((int64_t)1 << 22) /* elements generated and uploaded at a time */

void tz_bench_fill_params(tz_params *ps, tz_backend *be, const float *levels, uint64_t seed) {
    if (tz_bench_is_plan(be)) return;
    float *buf = tz_xmalloc((size_t)FILL_CHUNK * sizeof(float));
    const float a = 0.02f * sqrtf(3.0f); /* uniform(-a, a): deviation 0.02 */
    for (int i = 0; i < ps->n; i++) {
        tz_param *p = ps->p[i];
        if (p->adapter) continue;
        tz_rng r = tz_rng_make(seed, (uint64_t)i, TZ_RNG_INIT, 0);
        if (!p->q) {
            for (int64_t at = 0; at < p->numel; at += FILL_CHUNK) {
                int64_t n = p->numel - at < FILL_CHUNK ? p->numel - at : FILL_CHUNK;
                for (int64_t k = 0; k < n; k++)
                    buf[k] = p->ndim == 1 ? 1.0f : a * (2.0f * tz_rng_uniform(&r) - 1.0f);
                tz_param_upload(be, p, buf, at, n);
            }
            continue;
        }
        const tz_qweight *q = p->q;
        /* uniform codes: the decoded values' mean square is scale^2 * mean(levels^2) */
        double ms = 0.0;
        const int nl = 1 << q->bits;
        for (int k = 0; k < nl; k++) ms += (double)levels[k] * levels[k] / nl;
        const uint16_t s = tz_f32_to_bf16((float)(0.02 / sqrt(ms > 0 ? ms : 1.0)));
        const int64_t cb = tz_tq_codes_bytes(p->shape[0], p->shape[1], q->bits);
        const int64_t ns = tz_tq_scales_count(p->shape[0], p->shape[1], q->group);
        const int64_t chunk = FILL_CHUNK * (int64_t)sizeof(float);
        uint8_t *bytes = (uint8_t *)buf;
        for (int64_t at = 0; at < cb; at += chunk) {
            int64_t n = cb - at < chunk ? cb - at : chunk;
            for (int64_t k = 0; k < n; k += 8) {
                uint64_t x = tz_rng_u64(&r);
                memcpy(bytes + k, &x, (size_t)(n - k < 8 ? n - k : 8));
            }
            be->upload(be, q->codes + at, bytes, (size_t)n);
        }
        uint16_t *sc = (uint16_t *)buf;
        const int64_t sch = chunk / 2;
        for (int64_t at = 0; at < ns; at += sch) {
            int64_t n = ns - at < sch ? ns - at : sch;
            for (int64_t k = 0; k < n; k++) sc[k] = s;
            be->upload(be, q->scales + at, sc, (size_t)n * sizeof *sc);
        }
    }
    free(buf);
}

void tz_bench_random_tokens(uint32_t *tok, int64_t n, int64_t vocab, uint64_t seed) {
    tz_rng r = tz_rng_make(seed, 0, TZ_RNG_DATA, 1);
    for (int64_t i = 0; i < n; i++) tok[i] = (uint32_t)tz_rng_below(&r, (uint64_t)vocab);
}

/* ---- the planning backend ---- */

typedef struct plan_block {
    void *p;
    size_t bytes;
} plan_block;
typedef struct plan_ctx {
    tz_step_model model; /* first: the step model's counters (train/step_model.h) */
    plan_block *b;
    int n, cap;
} plan_ctx;

static const char plan_name[] = "plan";

static void *plan_alloc(tz_backend *be, size_t bytes) {
    plan_ctx *c = be->ctx;
    size_t len = bytes ? (bytes + 4095) / 4096 * 4096 : 4096;
    /* address space only: PROT_NONE, so a stray access faults instead of passing */
    void *p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) TZ_FATAL("dry run: cannot reserve %zu bytes of address space", len);
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 256;
        c->b = tz_xrealloc(c->b, (size_t)c->cap * sizeof *c->b);
    }
    c->b[c->n++] = (plan_block){p, bytes};
    be->live_bytes += bytes;
    if (be->live_bytes > be->peak_bytes) be->peak_bytes = be->live_bytes;
    return p;
}

static void plan_release(tz_backend *be, void *p) {
    plan_ctx *c = be->ctx;
    if (!p) return;
    for (int i = c->n - 1; i >= 0; i--)
        if (c->b[i].p == p) {
            size_t bytes = c->b[i].bytes;
            munmap(p, bytes ? (bytes + 4095) / 4096 * 4096 : 4096);
            be->live_bytes -= bytes;
            c->b[i] = c->b[--c->n];
            return;
        }
    TZ_FATAL("dry run: release of %p, which was not allocated", p);
}

static void plan_move(tz_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be, (void)dst, (void)src, (void)bytes;
}
static void plan_sync(tz_backend *be) { (void)be; }
static void plan_fill(tz_backend *be, float *x, float v, int64_t n) { (void)be, (void)x, (void)v, (void)n; }
static void plan_device_info(tz_backend *be, tz_device_info *out) {
    (void)be;
    memset(out, 0, sizeof *out);
    out->ordinal = -1;
    snprintf(out->name, sizeof out->name, "memory plan (nothing allocated)");
}

static void plan_destroy(tz_backend *be) {
    plan_ctx *c = be->ctx;
    while (c->n) plan_release(be, c->b[c->n - 1].p);
    free(c->b);
    free(c);
    free(be);
}

tz_backend *tz_bench_plan_backend(void) {
    tz_backend *be = tz_xcalloc(1, sizeof *be);
    be->name = plan_name;
    be->device = 1; /* nothing it hands out may be read on the host */
    be->matmul_dtypes = (1u << TZ_DT_F32) | (1u << TZ_DT_BF16); /* a GPU's, for run.precision */
    be->ctx = tz_xcalloc(1, sizeof(plan_ctx));
    be->destroy = plan_destroy;
    be->alloc = plan_alloc;
    be->release = plan_release;
    be->upload = plan_move;
    be->download = plan_move;
    be->copy = plan_move;
    be->sync = plan_sync;
    be->fill = plan_fill;
    be->device_info = plan_device_info;
    return be;
}

int tz_bench_is_plan(const tz_backend *be) { return be && be->name == plan_name; }

/* ---- the dry run ---- */

static double gib(double b) { return b / 1073741824.0; }

int tz_bench_dry_run(const tz_config *cfg, tz_world *w, tz_comm *comm) {
    (void)w;
    const tz_bench_preset *bp = tz_bench_preset_of(cfg);
    if (!bp)
        TZ_FATAL_HINT("give --preset NAME (bench --help lists them)",
                      "bench --dry-run plans a preset only (%s is a model folder)", cfg->model.path);
    if (comm->rank != 0) return 0;
    tz_backend *be = tz_bench_plan_backend();
    /* GEMM operands (and with them the bf16 storage) as the run would have them: a GPU's,
     * unless run.device says cpu */
    if (cfg->run.device == 1) be->matmul_dtypes = 1u << TZ_DT_F32;
    tz_backend_set_precision(be, tz_precision_name(cfg->run.precision));
    tz_task *t = tz_task_create(cfg, be, 1);
    const tz_params *ps = t->params;
    size_t quant = 0, weights = tz_params_bytes(ps);
    for (int i = 0; i < ps->n; i++)
        if (ps->p[i]->q) quant += ps->p[i]->bytes;
    const int64_t N = comm->size;
    const size_t grads = (size_t)ps->flat_numel * sizeof(float);
    /* stage 2 on more than one rank stages two buckets of the gradients (train/zero.c),
     * each as long as mpi/zero_plan.c makes them */
    size_t staging = 0;
    if (cfg->zero.stage == 2 && N > 1) {
        const int64_t na = N * TZ_FLAT_ALIGN;
        int64_t bb = (int64_t)(cfg->zero.bucket_mb * 1048576.0);
        int64_t elems = (bb < 1 ? 1 : bb) / 4 / na * na;
        staging = 2 * (size_t)(elems < na ? na : elems) * sizeof(float);
    }
    const tz_optim *opt = tz_optim_find("adamw");
    const double per = 4.0 + 4.0 + 1.0 + 4.0 * opt->n_states; /* master, acc, decay, states */
    const int64_t shard = cfg->zero.stage == 0 ? ps->n_trainable : (ps->n_trainable + N - 1) / N;
    const int64_t units = t->B * cfg->train.grad_accum * t->row_count;
    /* positions the weights see: tokens, or an image's patches */
    const int64_t tokens = strcmp(bp->arch, "dit") ? units : units * (bp->v[0] / bp->v[1]) * (bp->v[0] / bp->v[1]);
    /* matrix products of a step: 2 flops per weight and unit forward (every weight counted,
     * the embedding lookup too: an estimate); backward 2 more for the activations'
     * gradients, 2 for the trainable weights' own; with checkpointing one forward again */
    const int full = cfg->train.mode == TZ_MODE_FULL;
    const double fwd = 2.0 * (double)ps->n_total * (double)tokens;
    const double flops = fwd * (cfg->train.checkpointing ? 3.0 : 2.0) +
                         (full ? fwd : 2.0 * (double)ps->n_trainable * (double)tokens);
    tz_info("dry run (nothing allocated): %s | %s | GEMM operands %s", cfg->source, t->describe,
            be->matmul_dtype == TZ_DT_BF16 ? "bf16" : "fp32");
    const size_t peak = be->peak_bytes, total = peak + grads + staging;
    const double other = (double)peak - (double)weights - (double)t->arena_bytes;
    tz_info("planned backend memory per rank: %.3f GiB (%zu bytes) = weights %.3f (codes + "
            "scales %.3f, dense %.3f) + gradients %.3f + staging %.3f + activations %.3f%s%.3f "
            "(a device backend's op scratch and runtime come on top)", gib((double)total), total,
            gib((double)weights), gib((double)quant), gib((double)(weights - quant)),
            gib((double)grads), gib((double)staging), gib((double)t->arena_bytes),
            other < 0 ? " - other " : " + other ", gib(fabs(other)));
    tz_info("host shard per rank: about %.2f GiB (%lld trainable of %lld parameters, %.0f bytes "
            "each: fp32 master, accumulator, %s states, decay flag; %lld ranks, zero stage %lld)",
            gib(per * (double)shard), (long long)ps->n_trainable, (long long)ps->n_total, per,
            opt->name, (long long)N, (long long)cfg->zero.stage);
    tz_info("step: %lld %s per rank (%lld positions), about %.2f TFLOP of matrix products "
            "(attention's not counted)", (long long)units, t->unit, (long long)tokens, 1e-12 * flops);
    /* the step model: one micro-batch's forward and backward with every op counted (the
     * gradients bound now, after the plan, so that every weight gradient is counted too),
     * times the micro-batches of a step */
    tz_step_model_install(be);
    tz_params_bind_grads(t->params, be->alloc(be, grads));
    t->train_rows(t, 0, 1.0f);
    tz_step_model *sm = tz_step_model_of(be);
    tz_step_model_scale(sm, (double)cfg->train.grad_accum);
    const tz_step_rates rates = tz_step_rates_h100(be->matmul_dtype == TZ_DT_BF16);
    tz_step_model_print(sm, &rates);
    tz_task_free(t);
    tz_backend_destroy(be);
    return 0;
}

/* ---- the phase clock ---- */

const char *const tz_bench_phase_names[TZ_PH_N] = {"forward", "backward", "communication",
                                                   "copies", "optimizer", "other"};

static void clock_charge(tz_bench_clock *c) {
    if (c->be->device) c->be->sync(c->be);
    double t = omp_get_wtime();
    if (c->depth > 0) c->sec[c->stack[c->depth - 1]] += t - c->mark;
    c->mark = t;
}

void tz_bench_phase(tz_bench_clock *c, int ph) {
    if (!c || !c->on) return;
    clock_charge(c);
    c->depth = 1;
    c->stack[0] = ph;
}

void tz_bench_push(tz_bench_clock *c, int ph) {
    if (!c || !c->on) return;
    clock_charge(c);
    if (c->depth < (int)(sizeof c->stack / sizeof c->stack[0])) c->stack[c->depth++] = ph;
}

void tz_bench_pop(tz_bench_clock *c) {
    if (!c || !c->on) return;
    clock_charge(c);
    if (c->depth > 1) c->depth--;
}

void tz_bench_step_begin(tz_bench_clock *c) {
    if (!c || !c->on) return;
    if (c->be->device) c->be->sync(c->be);
    c->mark = omp_get_wtime();
    c->depth = 1;
    c->stack[0] = TZ_PH_OTHER;
}

void tz_bench_step_end(tz_bench_clock *c) {
    if (!c || !c->on) return;
    clock_charge(c);
    c->depth = 0;
    c->steps++;
}

void tz_bench_backward_begins(void *ctx) { tz_bench_phase(ctx, TZ_PH_BACKWARD); }

/* The collectives, timed: the wrapper is a copy of the inner table (rank, size, ctx, name)
 * whose calls go to the inner one inside a communication phase. One bench per process. */
static struct {
    tz_comm *inner;
    tz_bench_clock *c;
} g_comm;

#define IN g_comm.inner
static void w_reduce_scatter(tz_comm *c, const void *s, void *r, int64_t n, enum tz_dtype dt) {
    (void)c, tz_bench_push(g_comm.c, TZ_PH_COMM), IN->reduce_scatter(IN, s, r, n, dt), tz_bench_pop(g_comm.c);
}
static void w_all_gather(tz_comm *c, const void *s, void *r, int64_t n, enum tz_dtype dt) {
    (void)c, tz_bench_push(g_comm.c, TZ_PH_COMM), IN->all_gather(IN, s, r, n, dt), tz_bench_pop(g_comm.c);
}
static void w_all_gatherv(tz_comm *c, const void *s, void *r, const int64_t *n, enum tz_dtype dt) {
    (void)c, tz_bench_push(g_comm.c, TZ_PH_COMM), IN->all_gatherv(IN, s, r, n, dt), tz_bench_pop(g_comm.c);
}
static void w_all_reduce(tz_comm *c, const void *s, void *r, int64_t n, enum tz_dtype dt) {
    (void)c, tz_bench_push(g_comm.c, TZ_PH_COMM), IN->all_reduce(IN, s, r, n, dt), tz_bench_pop(g_comm.c);
}
static void w_bcast(tz_comm *c, void *b, int64_t n, enum tz_dtype dt, int root) {
    (void)c, tz_bench_push(g_comm.c, TZ_PH_COMM), IN->bcast(IN, b, n, dt, root), tz_bench_pop(g_comm.c);
}
static void w_barrier(tz_comm *c) {
    (void)c, tz_bench_push(g_comm.c, TZ_PH_COMM), IN->barrier(IN), tz_bench_pop(g_comm.c);
}
static void *w_ireduce_scatter(tz_comm *c, const void *s, void *r, int64_t n, enum tz_dtype dt) {
    (void)c;
    tz_bench_push(g_comm.c, TZ_PH_COMM);
    void *h = IN->ireduce_scatter(IN, s, r, n, dt);
    tz_bench_pop(g_comm.c);
    return h;
}
static void *w_iall_gather(tz_comm *c, const void *s, void *r, int64_t n, enum tz_dtype dt) {
    (void)c;
    tz_bench_push(g_comm.c, TZ_PH_COMM);
    void *h = IN->iall_gather(IN, s, r, n, dt);
    tz_bench_pop(g_comm.c);
    return h;
}
static int w_test(tz_comm *c, void *h) {
    (void)c;
    tz_bench_push(g_comm.c, TZ_PH_COMM);
    int done = IN->test(IN, h);
    tz_bench_pop(g_comm.c);
    return done;
}
static void w_wait(tz_comm *c, void *h) {
    (void)c, tz_bench_push(g_comm.c, TZ_PH_COMM), IN->wait(IN, h), tz_bench_pop(g_comm.c);
}
#undef IN
static void w_destroy(tz_comm *c) { free(c); }

tz_comm *tz_bench_comm_wrap(tz_comm *inner, tz_bench_clock *c) {
    g_comm.inner = inner;
    g_comm.c = c;
    tz_comm *w = tz_xmalloc(sizeof *w);
    *w = *inner;
    w->reduce_scatter = inner->reduce_scatter ? w_reduce_scatter : NULL;
    w->all_gather = inner->all_gather ? w_all_gather : NULL;
    w->all_gatherv = inner->all_gatherv ? w_all_gatherv : NULL;
    w->all_reduce = inner->all_reduce ? w_all_reduce : NULL;
    w->bcast = inner->bcast ? w_bcast : NULL;
    w->barrier = inner->barrier ? w_barrier : NULL;
    w->ireduce_scatter = inner->ireduce_scatter ? w_ireduce_scatter : NULL;
    w->iall_gather = inner->iall_gather ? w_iall_gather : NULL;
    w->test = inner->test ? w_test : NULL;
    w->wait = inner->wait ? w_wait : NULL;
    w->destroy = w_destroy;
    return w;
}

void tz_bench_comm_unwrap(tz_comm *wrapper) {
    if (wrapper) wrapper->destroy(wrapper);
    g_comm.inner = NULL;
    g_comm.c = NULL;
}

/* The backend's transfers, timed (one bench per process). */
static struct {
    void (*upload)(tz_backend *, void *, const void *, size_t);
    void (*download)(tz_backend *, void *, const void *, size_t);
    void (*copy)(tz_backend *, void *, const void *, size_t);
    tz_bench_clock *c;
} g_be;

static void w_upload(tz_backend *be, void *d, const void *s, size_t n) {
    tz_bench_push(g_be.c, TZ_PH_COPY), g_be.upload(be, d, s, n), tz_bench_pop(g_be.c);
}
static void w_download(tz_backend *be, void *d, const void *s, size_t n) {
    tz_bench_push(g_be.c, TZ_PH_COPY), g_be.download(be, d, s, n), tz_bench_pop(g_be.c);
}
static void w_copy(tz_backend *be, void *d, const void *s, size_t n) {
    tz_bench_push(g_be.c, TZ_PH_COPY), g_be.copy(be, d, s, n), tz_bench_pop(g_be.c);
}

void tz_bench_backend_wrap(tz_backend *be, tz_bench_clock *c) {
    g_be.upload = be->upload, g_be.download = be->download, g_be.copy = be->copy, g_be.c = c;
    be->upload = w_upload;
    be->download = w_download;
    be->copy = w_copy;
}
