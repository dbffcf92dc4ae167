/* `turbozero bench`'s own parts: the presets (shapes built in memory, random weights and
 * data), the planning backend, the memory plan and dry run of any configuration, and the
 * phase clock of a step. */
#define _GNU_SOURCE /* MAP_NORESERVE */
#include "backend/registry.h"
#include "bench/bench.h"
#include "bench/step_model.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "io/dit_config.h"
#include "model/dit.h"
#include "io/safetensors.h"
#include "io/tq_format.h"
#include "model/llama_io.h"
#include "comm/comm.h"
#include "comm/world.h"
#include "optim/zero_plan.h"
#include "quant/tq_layout.h"
#include "task/family.h"
#include "optim/optim.h"
#include "task/task.h"
#include "optim/zero.h"

/* ---- presets ---- */

#define FLUX_LORA                                                                            \
    "train.mode=lora", "lora.rank=16", "lora.alpha=16",                                      \
        "lora.targets=[\"to_q\",\"to_k\",\"to_v\",\"to_out.0\"]"
#define LORA_7B                                                                              \
    "train.mode=lora", "lora.rank=16", "lora.alpha=32", "lora.targets=all"
static const tz_bench_preset presets[] = {
    {"llama2-7b", "llama",
     "Llama-2-7B shape (dim 4096, MLP 11008, 32 layers, 32 heads, vocab 32000, untied): "
     "LoRA r16 on all 7 projections, 4-bit TurboQuant base, seq 2048, micro-batch 1, "
     "checkpointing",
     1,
     {LORA_7B, "quant.bits=4", "quant.group=128", "data.seq_len=2048", "train.micro_batch=1",
      "train.checkpointing=true", "train.steps=8", "optim.warmup=0", NULL}},
    {"llama-tiny", "llama",
     "the same recipe on a tiny untied Llama (dim 128, MLP 352, 2 layers, 4/2 heads, vocab "
     "256), seq 128, micro-batch 4: the CPU-sized stand-in",
     0,
     {LORA_7B, "quant.bits=4", "quant.group=64", "data.seq_len=128", "train.micro_batch=4",
      "train.checkpointing=true", "train.steps=4", "optim.warmup=0", NULL}},
    {"dit-xl-2", "dit",
     "DiT-XL/2 shape (4x32x32 latents, patch 2, hidden 1152, depth 28, 16 heads, 1000 "
     "classes, learned sigma): full fine-tuning, batch 32",
     1,
     {"train.mode=full", "quant.bits=0", "train.micro_batch=32", "train.checkpointing=false",
      "train.steps=8", "optim.warmup=0", "lora.rank=16", "lora.alpha=32", "lora.targets=all",
      NULL}},
    {"dit-tiny", "dit",
     "the same recipe on a tiny DiT (4x8x8 latents, patch 2, hidden 64, depth 2, 4 heads, 10 "
     "classes), batch 8: the CPU-sized stand-in",
     0,
     {"train.mode=full", "quant.bits=0", "train.micro_batch=8", "train.checkpointing=false",
      "train.steps=4", "optim.warmup=0", "lora.rank=16", "lora.alpha=32", "lora.targets=all",
      NULL}},
    {"flux-dev", "flux",
     "Flux.1-dev transformer (19 double + 38 single blocks, 24 heads of 128, guidance): LoRA "
     "r16 on to_q, to_k, to_v, to_out.0, 4-bit TurboQuant base, the last 18 blocks' codes "
     "streamed from the host, 1024x1024 (4,096 image + 512 text tokens; data.seq_len=1536: "
     "512x768), micro-batch 1, checkpointing",
     1,
     {FLUX_LORA, "data.seq_len=4096", "quant.bits=4", "quant.group=128",
      "quant.offload_blocks=18", "train.micro_batch=1", "train.checkpointing=true",
      "train.steps=8", "optim.warmup=0", NULL}},
    {"flux-tiny", "flux",
     "the same recipe on a tiny Flux (2 double + 2 single blocks, 4 heads of 16; 16 image + 8 "
     "text tokens; the last 3 blocks streamed), micro-batch 4: the CPU-sized stand-in",
     0,
     {FLUX_LORA, "data.seq_len=16", "quant.bits=4", "quant.group=64", "quant.offload_blocks=3",
      "train.micro_batch=4", "train.checkpointing=true", "train.steps=4", "optim.warmup=0",
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
    const char *shape = tz_model_preset_name(cfg->model.path);
    return shape ? tz_bench_preset_find(shape) : NULL;
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
    snprintf(path, sizeof path, "model.path=%s%s", TZ_MODEL_PRESET_PREFIX, p->name);
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
    if (strcmp(cfg->model.path + strlen(TZ_MODEL_PRESET_PREFIX), p->name))
        TZ_FATAL("bench --preset %s: model.path is the preset's (do not --set it)", p->name);
}

/* ---- the planning backend ---- */

typedef struct plan_block {
    void *p;
    size_t bytes, mapped;
} plan_block;
typedef struct plan_ctx {
    tz_step_model model; /* first: the step model's counters (bench/step_model.h) */
    plan_block *b;
    int n, cap;
} plan_ctx;

static const char plan_name[] = "plan";

static void *plan_alloc(tz_backend *be, size_t bytes) {
    plan_ctx *c = be->ctx;
    size_t len = bytes ? (bytes + 4095) / 4096 * 4096 : 4096;
    /* address space only: PROT_NONE, so a stray access faults instead of passing; a size
     * beyond the address space (a plan far too large for any machine) gets one page, since
     * its bytes are only counted */
    void *p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        len = 4096;
        p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    }
    if (p == MAP_FAILED) TZ_FATAL("dry run: cannot reserve %zu bytes of address space", len);
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 256;
        c->b = tz_xrealloc(c->b, (size_t)c->cap * sizeof *c->b);
    }
    c->b[c->n++] = (plan_block){p, bytes, len};
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
            munmap(p, c->b[i].mapped);
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

/* Host memory is the host's (the models' small pinned buffers, such as the losses): not
 * part of the device plan. */
static void *plan_host_alloc(tz_backend *be, size_t bytes) {
    (void)be;
    return tz_xcalloc(1, bytes ? bytes : 1);
}
static void plan_host_free(tz_backend *be, void *p) {
    (void)be;
    free(p);
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
    be->plan = 1;
    be->device = 1; /* nothing it hands out may be read on the host */
    be->matmul_dtypes = (1u << TZ_DT_F32) | (1u << TZ_DT_BF16); /* a GPU's, for run.precision */
    be->tq_chunks = tz_tq_device_chunks(); /* a GPU's decode in chunks (with bf16 GEMMs) */
    be->narrow_gemm = tz_narrow_gemm_enabled(); /* a GPU's narrow GEMMs (with bf16 GEMMs) */
    be->tq_fused = tz_tq_fused_enabled();       /* and its fused quantized ones */
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
    be->host_alloc = plan_host_alloc;
    be->host_free = plan_host_free;
    return be;
}

int tz_bench_is_plan(const tz_backend *be) { return be && be->plan; }

/* ---- the memory plan and the dry run ---- */

static double gib(double b) { return b / 1073741824.0; }

/* A configuration built on a planning backend. */
typedef struct plan_run {
    tz_config *cfg;  /* the configuration built: a copy, naming the folder preset if used */
    tz_backend *be;
    tz_task *t;
    int shapes_only; /* a model folder built from its config.json alone */
} plan_run;

/* Whether c's model folder can be planned from its shapes alone (a Llama folder: its
 * config.json, and for a quantized folder the quantization its safetensors header names,
 * which c then takes): 1, or 0 with c unchanged. The family's task builds those shapes with
 * random weights (tz_task_create's shapes), reading no weight. */
static int folder_shapes(tz_config *c) {
    if (strcmp(tz_family_of(c)->name, "llama")) return 0;
    tz_llama_dims d;
    tz_llama_read_dims(c->model.path, &d); /* fatal as the load would be */
    tz_safetensors st;
    tz_tqf qf;
    char err[1024];
    if (tz_st_open(&st, c->model.path, err, sizeof err)) TZ_FATAL("model.path: %s", err);
    if (tz_tqf_read(&qf, &st, err, sizeof err)) TZ_FATAL("model.path: %s", err);
    /* shapes the weights do not have (a config.json claiming more layers than the file
     * holds): not planned from config.json; the load names what is missing */
    char last[96];
    snprintf(last, sizeof last, "model.layers.%lld.input_layernorm.weight", (long long)d.n_layers - 1);
    if (d.n_layers < 1 || !tz_st_find(&st, last)) {
        tz_tqf_free(&qf);
        tz_st_close(&st);
        return 0;
    }
    if (qf.present)
        c->quant.bits = qf.bits, c->quant.group = qf.group, c->quant.method = qf.method,
        c->quant.seed = (int64_t)qf.seed;
    tz_tqf_free(&qf);
    tz_st_close(&st);
    return 1;
}

/* Builds cfg (training, or evaluation) on a planning backend with GEMM operand types
 * dtypes. 0; or 1, with nothing built, for a folder whose shapes need its weights read when
 * read_weights is 0. */
static int plan_open(plan_run *p, const tz_config *cfg, unsigned dtypes, int training,
                     int read_weights) {
    memset(p, 0, sizeof *p);
    p->cfg = tz_xmalloc(sizeof *p->cfg);
    *p->cfg = *cfg;
    tz_config *c = p->cfg;
    c->lora.init = TZ_LORA_INIT_DEFAULT; /* the same memory; loftq would read the weights */
    if (!tz_model_preset_name(c->model.path)) {
        p->shapes_only = folder_shapes(c);
        if (p->shapes_only) /* random data, in memory, as for a preset */
            c->data.val[0] = 0, snprintf(c->data.train, sizeof c->data.train, "(random tokens)");
        else if (!read_weights) {
            free(p->cfg);
            return 1;
        }
    }
    p->be = tz_bench_plan_backend();
    p->be->matmul_dtypes = dtypes;
    p->be->tq_chunks = (dtypes >> TZ_DT_BF16) & 1u ? tz_tq_device_chunks() : 0; /* as the backend */
    tz_backend_set_precision(p->be, c->run.precision);
    p->t = tz_task_create(c, p->be, training, p->shapes_only);
    return 0;
}

static void plan_close(plan_run *p) {
    tz_task_free(p->t);
    tz_backend_destroy(p->be);
    free(p->cfg);
}

/* The figures of the built plan p for one of N ranks. */
static void plan_figures(const plan_run *p, int64_t N, tz_mem_plan *m) {
    const tz_config *cfg = p->cfg;
    const tz_params *ps = p->t->params;
    const int training = p->t->training, qzo = training && cfg->train.mode == TZ_MODE_QZO;
    const int zero = training && !qzo, full = training && cfg->train.mode == TZ_MODE_FULL;
    memset(m, 0, sizeof *m);
    m->gpu = (p->be->matmul_dtypes >> TZ_DT_BF16) & 1u;
    m->shapes_only = p->shapes_only;
    m->training = training;
    m->weights = tz_params_bytes(ps);
    m->arena = p->t->arena_bytes;
    m->n_total = ps->n_total;
    int64_t largest = 0, scales_max = 0;
    size_t dense_src = 0;
    for (int i = 0; i < ps->n; i++) {
        const tz_param *q = ps->p[i];
        if (q->q) {
            m->quant += q->bytes;
            int64_t ns = tz_tq_scales_count(q->shape[0], q->shape[1], q->q->group);
            scales_max = ns > scales_max ? ns : scales_max;
            if (full) dense_src += (size_t)q->numel * sizeof(float); /* until ZeRO reads it */
        }
        if (!q->adapter && q->numel > largest) largest = q->numel;
    }
    if (!tz_model_preset_name(cfg->model.path)) /* a folder: one weight at a time, fp32 */
        m->load = (size_t)largest * sizeof(float);
    size_t buffers = 0;
    if (zero) {
        m->n_trainable = ps->n_trainable;
        m->grads = (size_t)ps->flat_numel * sizeof(float);
        if (!cfg->optim.offload) m->optim = (size_t)ps->flat_numel * (3 * sizeof(float) + 1);
        /* the ZeRO plan optim/zero.c makes: trainable tensors in flat order */
        int64_t *off = tz_xmalloc((size_t)(ps->n + 1) * sizeof *off);
        int64_t *num = tz_xmalloc((size_t)(ps->n + 1) * sizeof *num);
        int nt = 0;
        for (int i = ps->n - 1; i >= 0; i--)
            if (ps->p[i]->trainable) off[nt] = ps->p[i]->flat_off, num[nt++] = ps->p[i]->numel;
        const int64_t world = cfg->zero.stage == 0 ? 1 : N;
        tz_zero_desc d = {.flat_numel = ps->flat_numel, .n_tensors = nt, .offset = off,
                          .numel = num, .world = (int)world,
                          .bucket_bytes = (int64_t)(cfg->zero.bucket_mb * 1048576.0),
                          .elem_bytes = 4, .align = TZ_FLAT_ALIGN};
        if (d.bucket_bytes < 1) d.bucket_bytes = 1;
        tz_zero_plan zp;
        char err[512];
        if (tz_zero_plan_init(&zp, &d, err, sizeof err)) TZ_FATAL("zero plan: %s", err);
        const tz_optim *opt = tz_optim_at(cfg->optim.name);
        m->shard_numel = zp.shard_numel;
        m->shard = (size_t)zp.shard_numel * tz_optim_elem_bytes(opt);
        /* stage 2 on several ranks stages two buckets on the backend (optim/zero.c); on one
         * rank of a GPU the buckets are downloaded straight into the received slices, host
         * memory like every slot's received slice */
        const size_t bucket = (size_t)zp.bucket_elems * sizeof(float);
        const int pipelined = cfg->zero.stage == 2 && (N > 1 || m->gpu);
        if (pipelined && N > 1) m->staging = TZ_ZERO_SLOTS * bucket;
        if (pipelined) buffers += TZ_ZERO_SLOTS * (size_t)(zp.bucket_elems / N + 1) * sizeof(float);
        else buffers += bucket;
        tz_zero_plan_free(&zp);
        free(off);
        free(num);
    } else if (qzo) { /* fp32 copies of the scales and one tensor's bf16 staging */
        m->n_trainable = tz_params_count_scales(ps);
        m->shard = (size_t)m->n_trainable * sizeof(float) + (size_t)scales_max * sizeof(uint16_t);
    }
    m->shard += buffers;
    m->host = dense_src + m->shard > m->load ? dense_src + m->shard : m->load;
    m->host_codes = tz_params_host_codes_bytes(ps);
    m->host_acts = p->t->host_act_bytes;
    m->host += m->host_codes + m->host_acts;
    m->dense_src = dense_src;
    m->backend = p->be->peak_bytes + m->grads + m->staging + m->optim;
    m->other = (double)p->be->peak_bytes - (double)m->weights - (double)m->arena;
}

int tz_bench_plan_memory(const tz_config *cfg, int64_t N, unsigned matmul_dtypes, int training,
                         int read_weights, tz_mem_plan *out) {
    plan_run p;
    if (plan_open(&p, cfg, matmul_dtypes, training, read_weights)) return 1;
    plan_figures(&p, N, out);
    plan_close(&p);
    return 0;
}

void tz_mem_room_of(tz_mem_room *r, tz_backend *be, const tz_world *w) {
    memset(r, 0, sizeof *r);
    r->host_avail = tz_world_host_available(r->host_src, sizeof r->host_src);
    r->host_ranks = w && w->local_size > 0 ? w->local_size : 1;
    if (!be || !be->device) return;
    tz_device_info d;
    be->device_info(be, &d);
    r->dev_free = d.free_bytes, r->dev_total = d.total_bytes;
    /* ranks on this node whose local rank gives the same GPU (local rank % visible GPUs) */
    const int g = tz_cuda_device_count(), L = r->host_ranks, me = w ? w->local_rank : 0;
    r->dev_ranks = g > 0 ? L / g + (me % g < L % g) : 1;
    if (r->dev_ranks < 1) r->dev_ranks = 1;
}

int tz_mem_plan_check(const tz_mem_plan *m, const tz_config *cfg, const tz_mem_room *room,
                      char *line, size_t n, char *hint, size_t hn) {
    const double host_have = (double)room->host_avail / (room->host_ranks > 0 ? room->host_ranks : 1);
    const double dev_have = (double)room->dev_free / (room->dev_ranks > 0 ? room->dev_ranks : 1);
    /* on the CPU backend the backend's memory is host memory too */
    const double host_need = (double)(m->gpu ? m->host : m->backend + m->host);
    double worst = host_need / (host_have > 0 ? host_have : 1);
    const double host_f = worst;
    char dev[256] = "";
    if (m->gpu && room->dev_total) {
        double f = (double)m->backend / (dev_have > 0 ? dev_have : 1);
        worst = f > worst ? f : worst;
        snprintf(dev, sizeof dev, "GPU %.2f GiB planned, %.2f GiB free%s; ", gib((double)m->backend),
                 gib(dev_have), room->dev_ranks > 1 ? " (its share: ranks share the GPU)" : "");
    } else if (m->gpu) {
        snprintf(dev, sizeof dev, "GPU %.2f GiB planned (no GPU visible here); ",
                 gib((double)m->backend));
    }
    snprintf(line, n, "%shost %.2f GiB planned%s, %.2f GiB available (%s%s)", dev,
             gib(host_need), m->gpu ? "" : " (backend + host memory)", gib(host_have),
             room->host_src, room->host_ranks > 1 ? ", shared by the ranks on this node" : "");
    /* the largest part named first */
    const int qzo = cfg->train.mode == TZ_MODE_QZO;
    size_t at = 0;
    hint[0] = 0;
#define HINT(...)                                                                    \
    do {                                                                             \
        int k_ = snprintf(hint + at, at < hn ? hn - at : 0, __VA_ARGS__);            \
        if (k_ > 0) at += (size_t)k_;                                                \
    } while (0)
    if (m->gpu && m->host_acts && host_f >= worst && m->host_acts >= m->shard &&
        m->host_acts >= m->host_codes) {
        /* a GPU's run short of host memory, most of it activations kept there */
        HINT("the activations kept in host memory are %.2f GiB: lower train.micro_batch (%lld) "
             "or data.seq_len (%lld), or set TZ_ATT_KEEP=0 (attention's outputs not kept: the "
             "recomputation runs attention again)", gib((double)m->host_acts),
             (long long)cfg->train.micro_batch, (long long)cfg->data.seq_len);
    } else if ((double)m->arena >= (double)m->weights && (double)m->arena >= (double)m->shard) {
        HINT("activations are %.2f GiB: lower train.micro_batch (%lld; raise train.grad_accum "
             "to keep the batch) or data.seq_len (%lld)", gib((double)m->arena),
             (long long)cfg->train.micro_batch, (long long)cfg->data.seq_len);
        if (!cfg->train.checkpointing && !qzo && m->training)
            HINT(", or set train.checkpointing = true");
    } else if (m->shard >= m->weights) {
        HINT("the host shard is %.2f GiB: %s", gib((double)m->shard),
             cfg->zero.stage == 0 ? "set zero.stage = 2 and use more ranks (each holds 1/N)"
                                  : "use more ranks (each holds 1/N of it)");
        if (cfg->train.mode == TZ_MODE_FULL) HINT(", or train LoRA adapters (train.mode = \"lora\")");
    } else {
        HINT("the weights are %.2f GiB: ", gib((double)m->weights));
        if (cfg->quant.bits == 0) HINT("quantize the base (quant.bits = 4)");
        else HINT("a smaller model, or a GPU with more memory");
    }
#undef HINT
    return worst > 1.0 ? 2 : worst > 0.9 ? 1 : 0;
}

/* Positions a row (a token, an image) shows the weights: 1, or a DiT image's patches. */
static int64_t patches_per_row(const tz_config *cfg) {
    if (strcmp(tz_family_of(cfg)->name, "dit")) return 1;
    const char *shape = tz_model_preset_name(cfg->model.path);
    int64_t side = 0, patch = 1;
    tz_dit_config c;
    tz_dit_dims d;
    char err[1200];
    if (shape) {
        if (!tz_dit_preset(shape, &d, err, sizeof err)) side = d.input_size, patch = d.patch_size;
    } else if (!tz_dit_config_read(&c, cfg->model.path, err, sizeof err))
        side = c.input_size, patch = c.patch_size;
    return patch > 0 ? (side / patch) * (side / patch) : 1;
}

/* The GEMM operand types a dry run plans with: the CPU's (fp32) for run.device = "cpu", and
 * for "auto" where no GPU is visible and the configuration is not a GPU-sized preset; a
 * GPU's otherwise (bf16 storage of the frozen matrices with run.precision = "auto"). */
static unsigned dry_run_dtypes(const tz_config *cfg) {
    const unsigned gpu = (1u << TZ_DT_F32) | (1u << TZ_DT_BF16), cpu = 1u << TZ_DT_F32;
    const tz_bench_preset *bp = tz_bench_preset_of(cfg);
    if (cfg->run.device == TZ_DEVICE_CPU) return cpu;
    if (cfg->run.device == TZ_DEVICE_CUDA || (bp && bp->gpu_only) || tz_cuda_device_count() > 0) return gpu;
    return bp ? gpu : cpu; /* a preset plans a GPU's run unless run.device says cpu */
}

int tz_bench_dry_run(const tz_config *cfg, tz_world *w, tz_comm *comm) {
    if (comm->rank != 0) return 0;
    plan_run p;
    plan_open(&p, cfg, dry_run_dtypes(cfg), 1, 1);
    tz_mem_plan m;
    const int64_t N = comm->size;
    plan_figures(&p, N, &m);
    tz_task *t = p.t;
    tz_backend *be = p.be;
    const tz_params *ps = t->params;
    const int qzo = cfg->train.mode == TZ_MODE_QZO, full = cfg->train.mode == TZ_MODE_FULL;
    tz_info("dry run (nothing allocated): %s | %s | GEMM operands %s (as on %s)%s", cfg->source,
            t->describe, be->matmul_dtype == TZ_DT_BF16 ? "bf16" : "fp32", m.gpu ? "a GPU" : "the CPU",
            p.shapes_only ? " | planned from config.json, no weight read"
            : tz_model_preset_name(cfg->model.path) ? ""
                                                    : " | planned from the weights (read, not allocated)");
    char optim[64] = "";
    if (m.optim) snprintf(optim, sizeof optim, " + optimizer %.3f", gib((double)m.optim));
    tz_info("planned backend memory per rank: %.3f GiB (%zu bytes) %s = weights %.3f (codes + "
            "scales %.3f, dense %.3f) + gradients %.3f + staging %.3f + activations %.3f%s%s%.3f%s",
            gib((double)m.backend), m.backend, m.gpu ? "on the GPU" : "in host RAM (the CPU backend)",
            gib((double)m.weights), gib((double)m.quant),
            gib((double)(m.weights - m.quant)), gib((double)m.grads), gib((double)m.staging),
            gib((double)m.arena), optim, m.other < 0 ? " - other " : " + other ", gib(fabs(m.other)),
            m.gpu ? " (a device backend's op scratch and runtime come on top)" : "");
    if (qzo)
        tz_info("host memory per rank: %.3f GiB (%zu bytes): fp32 copies of %lld trainable "
                "scales and one tensor's bf16 staging; %lld parameters", gib((double)m.host),
                m.host, (long long)m.n_trainable, (long long)m.n_total);
    else {
        char extra[160] = "";
        if (m.dense_src)
            snprintf(extra, sizeof extra, " + dense sources of the quantized weights %.3f (until "
                     "the shard holds them)", gib((double)m.dense_src));
        if (m.load > m.dense_src + m.shard)
            snprintf(extra, sizeof extra, "; the load's one-weight buffer, %.3f, is the peak",
                     gib((double)m.load));
        char codes[160] = "";
        if (m.host_codes)
            snprintf(codes, sizeof codes, " + the codes of the last %lld blocks %.3f (pinned; "
                     "each block copied to the GPU as it runs, through two slots in the "
                     "activations)", (long long)cfg->quant.offload_blocks,
                     gib((double)m.host_codes));
        char acts[160] = "";
        if (m.host_acts)
            snprintf(acts, sizeof acts, " + activations %.3f (pinned: %s)", gib((double)m.host_acts),
                     t->host_act_what ? t->host_act_what : "kept for backward");
        tz_info("host memory per rank: %.3f GiB (%zu bytes) = host shard %.3f (%lld elements for "
                "%lld trainable of %lld parameters: fp32 master, accumulator, adamw states, decay "
                "flag; %lld ranks, zero stage %lld; with the step's buffers)%s%s%s",
                gib((double)m.host), m.host, gib((double)m.shard), (long long)m.shard_numel,
                (long long)m.n_trainable, (long long)m.n_total, (long long)N,
                (long long)cfg->zero.stage, codes, acts, extra);
    }
    /* this machine, for a rank of this dry run: the host, and the GPU where one is visible
     * (one is created only to be asked; a CPU build has none) */
    tz_mem_room room;
    tz_backend *dev = m.gpu && tz_cuda_device_count() > 0 ? tz_backend_create(TZ_DEVICE_CUDA, w->local_rank, 0)
                                                           : NULL;
    tz_mem_room_of(&room, dev, w);
    if (dev) tz_backend_destroy(dev);
    char line[768], hint[512];
    const int v = tz_mem_plan_check(&m, cfg, &room, line, sizeof line, hint, sizeof hint);
    tz_info("this machine%s: %s: %s", m.gpu && !room.dev_total ? " (its host only)" : "",
            v == 2 ? "does not fit" : v == 1 ? "fits, above 90%" : "fits", line);
    if (v) tz_info("HINT: %s", hint);
    /* positions the weights see: tokens, or an image's patches */
    const int64_t units = t->B * cfg->train.grad_accum * t->row_count;
    const int64_t tokens = units * patches_per_row(cfg);
    /* matrix products of a step: 2 flops per weight and unit forward (every weight counted,
     * the embedding lookup too: an estimate); backward 2 more for the activations'
     * gradients, 2 for the trainable weights' own; with checkpointing one forward again;
     * qzo: two forward passes */
    const double fwd = 2.0 * (double)ps->n_total * (double)tokens;
    const double flops = qzo ? 2.0 * fwd
                             : fwd * (cfg->train.checkpointing ? 3.0 : 2.0) +
                                   (full ? fwd : 2.0 * (double)ps->n_trainable * (double)tokens);
    tz_info("step: %lld %s per rank (%lld positions), about %.2f TFLOP of matrix products "
            "(attention's not counted)", (long long)units, t->unit, (long long)tokens, 1e-12 * flops);
    /* the step model: one micro-batch's forward and backward (qzo: two forward passes) with
     * every op counted (the gradients bound now, after the plan, so that every weight
     * gradient is counted too), times the micro-batches of a step */
    const tz_step_rates rates = tz_step_rates_h100(be->matmul_dtype == TZ_DT_BF16);
    tz_step_model_install(be, &rates);
    if (qzo) {
        t->train_loss(t, 0);
        t->train_loss(t, 0);
    } else {
        tz_params_bind_grads(t->params, be->alloc(be, m.grads));
        t->train_rows(t, 0, 1.0f);
    }
    tz_step_model *sm = tz_step_model_of(be);
    tz_step_model_scale(sm, (double)cfg->train.grad_accum);
    tz_step_model_print(sm);
    const char *ops = getenv("TZ_STEP_OPS");
    if (ops && strcmp(ops, "0")) tz_step_model_print_ops(sm);
    plan_close(&p);
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
