/* The run configuration: one schema table drives defaults, libconfig parsing, --set
 * overrides, range checks and writing. No MPI here: rank 0 loads, the caller broadcasts. */
#include "io/config.h"

#include <ctype.h>
#include <errno.h>
#include <libconfig.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/error.h"
#include "io/fsutil.h"
#include "quant/turboquant.h"

_Static_assert((int)TZ_QUANT_TURBOQUANT == (int)TZ_TQ_TURBOQUANT &&
                   (int)TZ_QUANT_ABSMAX == (int)TZ_TQ_ABSMAX,
               "quant.method values are the quantizer's (passed through as they are)");

typedef enum { T_INT, T_FLOAT, T_BOOL, T_STRING, T_ENUM, T_TARGETS } tz_type;
enum { CLOSED = 0, OPEN = 1 };

/* One row per key. Integers are int64_t fields, floats double, strings and targets (the names
 * joined by ',') char[TZ_PATH_MAX]; bool and enum (index into names) are int fields. */
typedef struct {
    const char *section, *key;
    size_t off, size;
    tz_type type;
    int required;                  /* no default: must come from the file or --set */
    int64_t idef, imin, imax;      /* T_INT range; idef is also the bool/enum default */
    int pow2;                      /* T_INT: a power of two only */
    double fdef, fmin, fmax;       /* T_FLOAT */
    int fmin_open, fmax_open;      /* OPEN: the bound itself is excluded */
    const char *sdef;              /* T_STRING, T_TARGETS */
    const char *const *names;      /* T_ENUM, T_TARGETS: allowed names, NULL-terminated */
    int family;                    /* the names are the caller's: FAMILY_ARCHS, _TARGETS, _OPTIMS */
    const char *doc;
} tz_key;
enum { FAMILY_NONE = 0, FAMILY_ARCHS = 1, FAMILY_TARGETS = 2, FAMILY_OPTIMS = 3 };

static const char *const mode_names[] = {"lora", "full", "qzo", NULL};
static const char *const qzo_schedules[] = {"constant", "cosine", NULL};
static const char *const dtype_names[] = {"f32", "bf16", NULL};
/* in the order of enum tz_device_kind and enum tz_precision (core/backend.h); the fields are
 * written as ints */
_Static_assert(sizeof(enum tz_device_kind) == sizeof(int) &&
                   sizeof(enum tz_precision) == sizeof(int) &&
                   sizeof(enum tz_comm_backend) == sizeof(int) && TZ_DEVICE_CUDA == 2 &&
                   TZ_PRECISION_BF16 == 2 && TZ_COMM_NCCL == 2,
               "run.device, run.precision and comm.backend are stored through int pointers");
static const char *const device_names[] = {"auto", "cpu", "cuda", NULL};
static const char *const precision_names[] = {"auto", "fp32", "bf16", NULL};
static const char *const quant_methods[] = {"turboquant", "absmax", NULL};
static const char *const quant_roundings[] = {"nearest", "stochastic", NULL};
static const char *const lora_inits[] = {"default", "loftq", "calibrated", "loftq_calibrated", NULL};
static const char *const comm_names[] = {"auto", "mpi", "nccl", NULL};
static const char *const section_names[] = {"model", "data", "train", "optim", "lora", "quant",
                                            "qzo", "zero", "run", "comm", NULL};

#define ROW(s, k) .section = #s, .key = #k, .off = offsetof(tz_config, s.k), \
                  .size = sizeof(((tz_config *)0)->s.k)
#define INT(s, k, def, lo, hi, d) {ROW(s, k), .type = T_INT, .idef = def, .imin = lo, .imax = hi, .doc = d}
#define POW2(s, k, def, lo, hi, d) \
    {ROW(s, k), .type = T_INT, .idef = def, .imin = lo, .imax = hi, .pow2 = 1, .doc = d}
#define FLT(s, k, def, lo_open, lo, hi, hi_open, d)                                            \
    {ROW(s, k), .type = T_FLOAT, .fdef = def, .fmin = lo, .fmax = hi, .fmin_open = lo_open, \
     .fmax_open = hi_open, .doc = d}
#define BOOL(s, k, def, d) {ROW(s, k), .type = T_BOOL, .idef = def, .doc = d}
#define STR(s, k, def, d) {ROW(s, k), .type = T_STRING, .sdef = def, .doc = d}
#define REQ_STR(s, k, d) {ROW(s, k), .type = T_STRING, .required = 1, .sdef = "", .doc = d}
#define ENUM(s, k, def, nm, d) {ROW(s, k), .type = T_ENUM, .idef = def, .names = nm, .doc = d}
#define FAMILY_ENUM(s, k, d) {ROW(s, k), .type = T_ENUM, .family = FAMILY_ARCHS, .doc = d}
#define OPTIM_ENUM(s, k, d) {ROW(s, k), .type = T_ENUM, .family = FAMILY_OPTIMS, .doc = d}
#define TARGETS(s, k, def, d) {ROW(s, k), .type = T_TARGETS, .sdef = def, .family = FAMILY_TARGETS, .doc = d}

static const tz_key schema[] = {
    FAMILY_ENUM(model, arch, "model family"),
    REQ_STR(model, path, "HF-layout model folder (config.json + *.safetensors)"),
    STR(model, adapter, "", "LoRA adapter folder to load before training (\"\" = none)"),
    STR(data, train, "", "training token file (required by train, not by eval)"),
    STR(data, val, "", "validation token file (\"\" = no validation)"),
    STR(data, train_labels, "", "IDX label file of data.train (dit with IDX images)"),
    STR(data, val_labels, "", "IDX label file of data.val (dit with IDX images)"),
    STR(data, classes, "", "classes of image data to use, e.g. \"0-4\" or \"1,3,5-7\" (\"\" = all)"),
    INT(data, seq_len, 128, 1, 65536, "tokens per training window"),
    ENUM(train, mode, TZ_MODE_LORA, mode_names, "what is trained: LoRA adapters, every weight, or the quantization scales (zeroth-order)"),
    INT(train, steps, 100, 1, 1000000000, "optimizer steps"),
    INT(train, micro_batch, 8, 1, 65536, "sequences per rank per forward/backward pass"),
    INT(train, grad_accum, 1, 1, 65536, "micro-batches accumulated per optimizer step"),
    INT(train, eval_every, 0, 0, 1000000000, "steps between evaluations (0 = only at start and end)"),
    INT(train, eval_windows, 0, 0, 1000000000, "validation windows (DiT: images) per evaluation (0 = all)"),
    INT(train, eval_seed, 0, 0, INT64_C(1) << 62, "seed of the diffusion eval's timesteps and noise (kept fixed so runs compare)"),
    INT(train, log_every, 1, 1, 1000000000, "steps between log lines"),
    BOOL(train, checkpointing, 0, "activation checkpointing (recompute in backward, less memory)"),
    INT(train, threads, 0, 0, 4096, "CPU threads per rank (0 = OpenMP default)"),
    INT(train, checkpoint_every, 0, 0, 1000000000, "steps between checkpoints in run.dir/checkpoints (0 = only on SIGUSR1/SIGTERM/SIGINT)"),
    INT(train, keep_checkpoints, 2, 0, 1000000, "newest complete checkpoints kept (0 = all)"),
    BOOL(train, keep_best, 0, "with data.val: checkpoint every new best eval, keep it past keep_checkpoints, save run.dir/best"),
    OPTIM_ENUM(optim, name, "the optimizer, by name (adamw)"),
    FLT(optim, lr, 2e-4, OPEN, 0.0, 10.0, CLOSED, "peak learning rate (unset: by train.mode, lora 2e-4, full 2e-5, qzo 1e-6)"),
    FLT(optim, min_lr_ratio, 0.1, CLOSED, 0.0, 1.0, CLOSED, "cosine floor as a fraction of lr"),
    INT(optim, warmup, 10, 0, 1000000000, "linear warmup steps"),
    FLT(optim, weight_decay, 0.0, CLOSED, 0.0, 10.0, CLOSED, "decoupled weight decay (on matrices)"),
    FLT(optim, beta1, 0.9, CLOSED, 0.0, 1.0, OPEN, "AdamW first-moment decay"),
    FLT(optim, beta2, 0.999, CLOSED, 0.0, 1.0, OPEN, "AdamW second-moment decay"),
    FLT(optim, eps, 1e-8, OPEN, 0.0, 1.0, CLOSED, "AdamW denominator epsilon"),
    FLT(optim, grad_clip, 1.0, CLOSED, 0.0, 1e6, CLOSED, "global gradient-norm clip (0 = off)"),
    BOOL(optim, offload, 1, "AdamW's masters and states in host memory, stepped by the CPU (ZeRO offload); false: on the GPU (one rank, no trainable quantized weight; faster, uses 13 bytes per trainable parameter of GPU memory)"),
    INT(lora, rank, 8, 1, 4096, "LoRA rank r"),
    FLT(lora, alpha, 16.0, OPEN, 0.0, 1e6, CLOSED, "LoRA scale: the update is alpha/rank * B A"),
    TARGETS(lora, targets, "all", "projections that get adapters"),
    ENUM(lora, init, TZ_LORA_INIT_DEFAULT, lora_inits, "adapter init: default (B = 0), loftq (Q + s B A fitted to the dense weight of a quantized base), calibrated (the base quantize(W); s B A the best rank-r fit of W - Q for the inputs of lora.calibration training rows: min ||X (W - Q - s B A)^T||), or loftq_calibrated (loftq's base, the adapter then fitted so)"),
    INT(lora, calibration, 32, 1, 65536, "lora.init = \"calibrated\": training rows (sequences, images, samples) whose inputs to each adapted quantized weight weigh its fit"),
    BOOL(lora, train_embeddings, 0, "also train the conditioning embeddings (DiT: the class table), saved with the adapter (PEFT modules_to_save)"),
    INT(quant, bits, 0, 0, 4, "bits per weight of the quantized base projections (0 = dense)"),
    POW2(quant, group, 128, 64, 256, "weights per quantization group (one bf16 scale each)"),
    ENUM(quant, method, TZ_QUANT_TURBOQUANT, quant_methods, "quantizer (absmax: the baseline)"),
    INT(quant, seed, 0, 0, INT64_C(1) << 62, "seed of the TurboQuant random signs"),
    ENUM(quant, rounding, TZ_ROUND_NEAREST, quant_roundings, "full fine-tuning of quantized weights: how each step re-quantizes the fp32 master (nearest, or stochastic: unbiased, a new draw each step)"),
    INT(quant, offload_blocks, 0, 0, 1 << 20, "keep the quantized codes of the model's last N blocks in pinned host memory and copy each block to the GPU as it runs, while the block before it computes (frozen bases: lora, eval, sample; flux)"),
    BOOL(quant, count_changes, 0, "full fine-tuning of quantized weights: log the share of codes each step's re-quantization changes (keeps a copy of the codes on the host)"),
    FLT(qzo, eps, 1e-3, OPEN, 0.0, 1.0, CLOSED, "qzo: perturbation size of the scales"),
    FLT(qzo, clip, 100.0, OPEN, 0.0, 1e12, CLOSED, "qzo: bound on the estimated directional derivative"),
    ENUM(qzo, schedule, TZ_QZO_CONSTANT, qzo_schedules, "qzo: learning-rate schedule (cosine: optim.warmup, optim.min_lr_ratio)"),
    INT(zero, stage, 2, 0, 2, "ZeRO stage: 0 all-reduce, 1 + sharded optimizer, 2 + sharded gradients"),
    FLT(zero, bucket_mb, 16.0, OPEN, 0.0, 1e6, CLOSED, "gradient bucket size in MiB (communication unit)"),
    STR(run, dir, "runs/default", "output folder (logs, checkpoints, adapters)"),
    INT(run, seed, 1234, 0, INT64_C(1) << 62, "seed of every random stream"),
    BOOL(run, overwrite, 0, "replace a finished run already in run.dir (else stop, keeping it)"),
    ENUM(run, save_dtype, 0, dtype_names, "dtype of the model written by full-mode training"),
    ENUM(run, device, 0, device_names, "compute backend: auto (cuda when built in and a GPU is visible, else cpu), cpu or cuda"),
    ENUM(run, precision, 0, precision_names, "GEMM operands: auto (bf16 on a GPU, fp32 on the CPU), fp32, or bf16 (fp32 accumulation; GPU only)"),
    FLT(run, collective_timeout, 1800.0, CLOSED, 0.0, 1e7, CLOSED, "seconds a collective may wait before every rank is stopped (0 = never)"),
    ENUM(comm, backend, TZ_COMM_AUTO, comm_names, "collectives of the gradients: auto (nccl when every rank has its own GPU and NCCL loads, else mpi), mpi (through pinned host buffers on a GPU) or nccl (GPU memory; run.device cuda)"),
};
#define NKEYS ((int)(sizeof schema / sizeof schema[0]))

/* The first error of a load: the message and its HINT ("" when none). Loading stops at it,
 * frees what it holds, and tz_config_load makes it fatal. */
typedef struct {
    char msg[2048];
    char hint[512];
} tz_cfg_err;

/* Where a value came from: a file line, or one --set argument; where its error goes. */
typedef struct {
    const char *file;
    int line;
    const char *set; /* the whole "section.key=value" when from --set */
    tz_cfg_err *e;
} tz_origin;

/* Records an error (with a hint, or NULL) and returns -1, so `return cfg_fail(...)` both
 * explains and fails. */
TZ_PRINTF(3, 4) static int cfg_fail(tz_cfg_err *e, const char *hint, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    snprintf(e->hint, sizeof e->hint, "%s", hint ? hint : "");
    return -1;
}

static void *field(tz_config *cfg, const tz_key *k) { return (char *)cfg + k->off; }
static const void *cfield(const tz_config *cfg, const tz_key *k) {
    return (const char *)cfg + k->off;
}

const char *tz_mode_name(int mode) {
    return mode >= 0 && mode <= TZ_MODE_QZO ? mode_names[mode] : "?";
}

const char *tz_precision_name(int precision) {
    return precision >= 0 && precision <= 2 ? precision_names[precision] : "auto";
}

const char *tz_device_name(int device) {
    return device >= 0 && device <= 2 ? device_names[device] : "auto";
}

const char *tz_comm_backend_name(int backend) {
    return backend >= 0 && backend <= TZ_COMM_NCCL ? comm_names[backend] : "auto";
}

/* The row with its names filled in: the caller's for the families' keys. */
static tz_key with_names(const tz_key *k, const tz_config_names *nm) {
    tz_key r = *k;
    if (k->family == FAMILY_ARCHS) r.names = nm->archs;
    else if (k->family == FAMILY_TARGETS) r.names = nm->targets;
    else if (k->family == FAMILY_OPTIMS) r.names = nm->optims;
    return r;
}

/* ---- messages ---------------------------------------------------------------------- */

static void join_names(char *buf, size_t n, const char *const *names, const char *extra) {
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; names[i]; i++)
        used += (size_t)snprintf(buf + used, used < n ? n - used : 0, "%s\"%s\"", i ? ", " : "",
                                 names[i]);
    if (extra && used < n) snprintf(buf + used, n - used, " or \"%s\"", extra);
}

static void describe_expected(const tz_key *k, char *buf, size_t n) {
    char names[1024];
    switch (k->type) {
    case T_INT:
        snprintf(buf, n, "%s in %lld..%lld", k->pow2 ? "a power of two" : "an integer",
                 (long long)k->imin, (long long)k->imax);
        break;
    case T_FLOAT:
        snprintf(buf, n, "a number in %c%g, %g%c", k->fmin_open ? '(' : '[', k->fmin, k->fmax,
                 k->fmax_open ? ')' : ']');
        break;
    case T_BOOL: snprintf(buf, n, "a boolean (true or false)"); break;
    case T_STRING: snprintf(buf, n, "a string of at most %d bytes", TZ_PATH_MAX - 1); break;
    case T_ENUM:
        join_names(names, sizeof names, k->names, NULL);
        snprintf(buf, n, "one of %s", names);
        break;
    case T_TARGETS:
        join_names(names, sizeof names, k->names, "all");
        snprintf(buf, n, "a non-empty list of names from %s (or one name as a string)", names);
        break;
    }
}

/* "a string ("abc")", "a float (2.5)", ...: what a libconfig setting holds. */
static void describe_setting(const config_setting_t *s, char *buf, size_t n) {
    switch (config_setting_type(s)) {
    case CONFIG_TYPE_INT:
    case CONFIG_TYPE_INT64: snprintf(buf, n, "an integer (%lld)", config_setting_get_int64(s)); break;
    case CONFIG_TYPE_FLOAT: snprintf(buf, n, "a float (%g)", config_setting_get_float(s)); break;
    case CONFIG_TYPE_STRING:
        snprintf(buf, n, "a string (\"%.64s\")", config_setting_get_string(s));
        break;
    case CONFIG_TYPE_BOOL:
        snprintf(buf, n, "a boolean (%s)", config_setting_get_bool(s) ? "true" : "false");
        break;
    case CONFIG_TYPE_ARRAY: snprintf(buf, n, "an array"); break;
    case CONFIG_TYPE_LIST: snprintf(buf, n, "a list"); break;
    case CONFIG_TYPE_GROUP: snprintf(buf, n, "a group"); break;
    default: snprintf(buf, n, "an unknown type"); break;
    }
}

static int fail(const tz_origin *o, const tz_key *k, const char *got) {
    char want[1200];
    describe_expected(k, want, sizeof want);
    /* One rule for booleans in the file and in --set: true or false, as libconfig spells them
     * (any case); 1 and 0 are integers in the file, so they are refused in --set too. */
    const char *hint = k->type == T_BOOL ? "write true or false (1 and 0 are integers)" : NULL;
    if (o->set) return cfg_fail(o->e, hint, "--set %s: expected %s (got %s)", o->set, want, got);
    return cfg_fail(o->e, hint, "%s:%d: %s.%s: expected %s (got %s)", o->file, o->line, k->section,
                    k->key, want, got);
}

/* Edit distance, for "did you mean" hints (names longer than 47 bytes get no hint). */
static int edit_distance(const char *a, const char *b) {
    int row[48], la = (int)strlen(a), lb = (int)strlen(b);
    if (la > 47 || lb > 47) return 1000;
    for (int j = 0; j <= lb; j++) row[j] = j;
    for (int i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = i;
        for (int j = 1; j <= lb; j++) {
            int up = row[j], best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            diag = up;
            row[j] = best;
        }
    }
    return row[lb];
}

/* The known name nearest to TYPO, as "section.key" (or a section name when SECTION is NULL)
 * into OUT; the same key in another section wins. Returns 0 when nothing is close. */
static int nearest(const char *section, const char *typo, char *out, size_t n) {
    int bestd = 1000;
    for (int i = 0; section && i < NKEYS; i++)
        if (!strcmp(schema[i].key, typo))
            return snprintf(out, n, "%s.%s", schema[i].section, schema[i].key), 1;
    for (int i = 0; i < NKEYS; i++) {
        if (section && strcmp(schema[i].section, section)) continue;
        const char *cand = section ? schema[i].key : schema[i].section;
        int d = edit_distance(typo, cand), len = (int)strlen(cand);
        if (strstr(cand, typo) || strstr(typo, cand)) d = d < 3 ? d : 3;
        if (d < bestd && d <= 2 + len / 4 && d < len) {
            bestd = d;
            snprintf(out, n, "%s%s%s", section ? section : "", section ? "." : "", cand);
        }
    }
    return bestd < 1000;
}

static const tz_key *find_key(const char *section, const char *key) {
    for (int i = 0; i < NKEYS; i++)
        if (!strcmp(schema[i].section, section) && !strcmp(schema[i].key, key)) return &schema[i];
    return NULL;
}

/* The error of an unknown key; PREFIX is "FILE:LINE: " or "--set ". */
static int fail_unknown_key(tz_cfg_err *e, const char *prefix, const char *section, const char *key) {
    char hint[256], near[160];
    if (nearest(section, key, near, sizeof near)) {
        snprintf(hint, sizeof hint, "did you mean %s?", near);
    } else {
        size_t used = (size_t)snprintf(hint, sizeof hint, "keys of %s:", section);
        for (int i = 0; i < NKEYS && used < sizeof hint; i++)
            if (!strcmp(schema[i].section, section))
                used += (size_t)snprintf(hint + used, sizeof hint - used, " %s", schema[i].key);
    }
    return cfg_fail(e, hint, "%s%s.%s: unknown key", prefix, section, key);
}

/* ---- storing values (shared by the file and --set); 0, or -1 with the error in o->e ---- */

static int store_int(tz_config *cfg, const tz_key *k, const tz_origin *o, int64_t v) {
    char got[64];
    snprintf(got, sizeof got, "%lld", (long long)v);
    if (v < k->imin || v > k->imax || (k->pow2 && (v & (v - 1)))) return fail(o, k, got);
    *(int64_t *)field(cfg, k) = v;
    return 0;
}

static int store_float(tz_config *cfg, const tz_key *k, const tz_origin *o, double v) {
    char got[64];
    snprintf(got, sizeof got, "%g", v);
    int ok = isfinite(v) && (k->fmin_open ? v > k->fmin : v >= k->fmin) &&
             (k->fmax_open ? v < k->fmax : v <= k->fmax);
    if (!ok) return fail(o, k, got);
    *(double *)field(cfg, k) = v;
    return 0;
}

static int store_string(tz_config *cfg, const tz_key *k, const tz_origin *o, const char *s) {
    char got[64];
    size_t len = strlen(s);
    if (len >= k->size) {
        snprintf(got, sizeof got, "a string of %zu bytes", len);
        return fail(o, k, got);
    }
    if (k->required && len == 0) return fail(o, k, "an empty string");
    memcpy(field(cfg, k), s, len + 1);
    return 0;
}

/* Stores the index of S in the key's names as the enum's value. */
static int store_enum(tz_config *cfg, const tz_key *k, const tz_origin *o, const char *s) {
    char got[96];
    for (int i = 0; k->names[i]; i++)
        if (!strcmp(k->names[i], s)) {
            *(int *)field(cfg, k) = i;
            return 0;
        }
    snprintf(got, sizeof got, "\"%.64s\"", s);
    return fail(o, k, got);
}

/* Adds the bit of one target name in the key's names (all ones for "all") to *bits. */
static int target_bits(const tz_key *k, const tz_origin *o, const char *s, uint64_t *bits) {
    if (!strcmp(s, "all")) {
        *bits = ~(uint64_t)0;
        return 0;
    }
    for (int i = 0; k->names[i]; i++)
        if (!strcmp(k->names[i], s)) {
            *bits |= (uint64_t)1 << i;
            return 0;
        }
    char got[96];
    snprintf(got, sizeof got, "\"%.64s\"", s);
    return fail(o, k, got);
}

/* Stores the names of the bits, in the order of the key's names, or "all". */
static void store_targets(tz_config *cfg, const tz_key *k, uint64_t bits) {
    char *out = field(cfg, k);
    size_t used = 0;
    memset(out, 0, k->size); /* the bytes after the names too: the struct is compared as bytes */
    if (bits == ~(uint64_t)0) {
        snprintf(out, k->size, "all");
        return;
    }
    for (int i = 0; k->names[i]; i++)
        if (bits & ((uint64_t)1 << i))
            used += (size_t)snprintf(out + used, used < k->size ? k->size - used : 0, "%s%s",
                                     used ? "," : "", k->names[i]);
    TZ_CHECK(used < k->size, "config: %s.%s: the names do not fit", k->section, k->key);
}

/* ---- the file ---------------------------------------------------------------------- */

/* libconfig 1.5 wraps an integer literal beyond 32 bits without an L suffix (5000000000 ->
 * 705032704). Find the literal after "key =" from the key's line in the text and compare;
 * returns 1 (with the literal in LIT) when the stored value is not what was written. */
static int literal_wrapped(const char *text, int line, const char *key, long long value,
                           char *lit, size_t litn) {
    const char *p = text;
    size_t klen = strlen(key);
    for (int l = 1; l < line && p; l++) p = (p = strchr(p, '\n')) ? p + 1 : NULL;
    if (!p) return 0;
    for (const char *end = strchr(p, '\n'); (p = strstr(p, key)) != NULL; p += klen) {
        if (end && p > end) return 0;
        if (p > text && (p[-1] == '_' || isalnum((unsigned char)p[-1]))) continue;
        const char *q = p + klen;
        while (*q == ' ' || *q == '\t' || *q == '\r' || *q == '\n') q++;
        if (*q != '=' && *q != ':') continue;
        for (q++; *q == ' ' || *q == '\t' || *q == '\r' || *q == '\n';) q++;
        const char *digits = q + (*q == '-' || *q == '+');
        int hex = digits[0] == '0' && (digits[1] == 'x' || digits[1] == 'X');
        char *stop;
        errno = 0;
        long long v = strtoll(q, &stop, hex ? 16 : 10);
        if (stop == q || *stop == 'L' || *stop == '.' || *stop == 'e' || *stop == 'E') return 0;
        snprintf(lit, litn, "%.*s", (int)(stop - q), q);
        return errno == ERANGE || v != value;
    }
    return 0;
}

static int apply_setting(tz_config *cfg, const tz_key *k, const config_setting_t *s,
                         const char *file, const char *text, tz_cfg_err *e) {
    tz_origin o = {file, config_setting_source_line(s), NULL, e};
    int type = config_setting_type(s);
    char got[128], lit[64];
    describe_setting(s, got, sizeof got);
    if ((k->type == T_INT || k->type == T_FLOAT) && type == CONFIG_TYPE_INT &&
        literal_wrapped(text, o.line, k->key, config_setting_get_int64(s), lit, sizeof lit)) {
        char hint[160];
        snprintf(hint, sizeof hint, "libconfig reads integers beyond 32 bits only with an L suffix: "
                 "write %sL", lit);
        return cfg_fail(e, hint, "%s:%d: %s.%s: expected an integer that fits 32 bits or ends in L "
                        "(got %s)", file, o.line, k->section, k->key, lit);
    }
    switch (k->type) {
    case T_INT:
        if (type != CONFIG_TYPE_INT && type != CONFIG_TYPE_INT64) return fail(&o, k, got);
        return store_int(cfg, k, &o, config_setting_get_int64(s));
    case T_FLOAT:
        if (type == CONFIG_TYPE_FLOAT) return store_float(cfg, k, &o, config_setting_get_float(s));
        if (type == CONFIG_TYPE_INT || type == CONFIG_TYPE_INT64)
            return store_float(cfg, k, &o, (double)config_setting_get_int64(s));
        return fail(&o, k, got);
    case T_BOOL:
        if (type != CONFIG_TYPE_BOOL) return fail(&o, k, got);
        *(int *)field(cfg, k) = config_setting_get_bool(s) ? 1 : 0;
        return 0;
    case T_STRING:
        if (type != CONFIG_TYPE_STRING) return fail(&o, k, got);
        return store_string(cfg, k, &o, config_setting_get_string(s));
    case T_ENUM:
        if (type != CONFIG_TYPE_STRING) return fail(&o, k, got);
        return store_enum(cfg, k, &o, config_setting_get_string(s));
    case T_TARGETS: {
        uint64_t bits = 0;
        if (type == CONFIG_TYPE_STRING) { /* one name, or "all" (the default's spelling) */
            if (target_bits(k, &o, config_setting_get_string(s), &bits)) return -1;
            store_targets(cfg, k, bits);
            return 0;
        }
        if (type != CONFIG_TYPE_ARRAY && type != CONFIG_TYPE_LIST) return fail(&o, k, got);
        int n = config_setting_length(s);
        if (n == 0) return fail(&o, k, "an empty list");
        for (int i = 0; i < n; i++) {
            const config_setting_t *el = config_setting_get_elem(s, (unsigned)i);
            int eline = (int)config_setting_source_line(el);
            tz_origin eo = {file, eline ? eline : o.line, NULL, e};
            describe_setting(el, got, sizeof got);
            if (config_setting_type(el) != CONFIG_TYPE_STRING) return fail(&eo, k, got);
            if (target_bits(k, &eo, config_setting_get_string(el), &bits)) return -1;
        }
        store_targets(cfg, k, bits);
        return 0;
    }
    }
    return 0;
}

/* The sections and keys of a parsed file; 0 or -1 with the error in e. */
static int apply_file(tz_config *cfg, const tz_config_names *nm, const char *file,
                      const config_t *lc, const char *text, unsigned char *seen, tz_cfg_err *e) {
    const config_setting_t *root = config_root_setting(lc);
    for (int i = 0; i < config_setting_length(root); i++) {
        const config_setting_t *sec = config_setting_get_elem(root, (unsigned)i);
        const char *name = config_setting_name(sec);
        const char *sfile = config_setting_source_file(sec) ? config_setting_source_file(sec) : file;
        int known = 0, line = config_setting_source_line(sec);
        for (int j = 0; section_names[j]; j++) known |= !strcmp(section_names[j], name);
        if (!known) {
            char hint[96] = "the sections are model, data, train, optim, lora, quant, qzo, zero, run", near[64];
            if (nearest(NULL, name, near, sizeof near))
                snprintf(hint, sizeof hint, "did you mean %s?", near);
            return cfg_fail(e, hint, "%s:%d: %s: unknown section", sfile, line, name);
        }
        if (!config_setting_is_group(sec)) {
            char got[128];
            describe_setting(sec, got, sizeof got);
            return cfg_fail(e, NULL, "%s:%d: %s: expected a section (%s = { ... };) (got %s)", sfile,
                            line, name, name, got);
        }
        for (int j = 0; j < config_setting_length(sec); j++) {
            const config_setting_t *s = config_setting_get_elem(sec, (unsigned)j);
            const char *kfile = config_setting_source_file(s) ? config_setting_source_file(s) : file;
            const tz_key *k = find_key(name, config_setting_name(s));
            if (!k) {
                char prefix[TZ_PATH_MAX + 32];
                snprintf(prefix, sizeof prefix, "%s:%d: ", kfile, config_setting_source_line(s));
                return fail_unknown_key(e, prefix, name, config_setting_name(s));
            }
            /* an @include'd file is not the text we hold: skip the wrap check there */
            const tz_key kn = with_names(k, nm);
            if (apply_setting(cfg, &kn, s, kfile, strcmp(kfile, file) ? "" : text, e)) return -1;
            seen[k - schema] = 1;
        }
    }
    return 0;
}

static int load_file(tz_config *cfg, const tz_config_names *nm, const char *file,
                     unsigned char *seen, tz_cfg_err *e) {
    char rerr[1200];
    char *text = tz_read_file(file, NULL, rerr, sizeof rerr); /* a FIFO is refused here */
    if (!text) return cfg_fail(e, "check the config path", "%s", rerr);
    config_t lc;
    config_init(&lc);
    int rc;
    if (!config_read_file(&lc, file))
        rc = cfg_fail(e, NULL, "%s:%d: %s", config_error_file(&lc) ? config_error_file(&lc) : file,
                      config_error_line(&lc), config_error_text(&lc));
    else
        rc = apply_file(cfg, nm, file, &lc, text, seen, e);
    config_destroy(&lc);
    free(text);
    return rc;
}

/* ---- --set ------------------------------------------------------------------------- */

static char *trim(char *s) {
    while (*s == ' ' || *s == '\t') s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t')) s[--n] = 0;
    return s;
}

/* Strip one pair of surrounding double quotes, in place. */
static char *unquote(char *s) {
    size_t n = strlen(s);
    if (n < 2 || s[0] != '"' || s[n - 1] != '"') return s;
    s[n - 1] = 0;
    return s + 1;
}

/* One --set value in v (a copy: trimmed and cut in place). */
static int set_value(tz_config *cfg, const tz_key *k, const tz_origin *o, char *v) {
    char got[96], *stop;
    snprintf(got, sizeof got, "\"%.64s\"", v);
    switch (k->type) {
    case T_INT: {
        errno = 0;
        long long x = strtoll(v, &stop, 10);
        if (stop != v && stop[0] == 'L') stop += stop[1] == 'L' ? 2 : 1;
        if (stop == v || *stop || errno == ERANGE) return fail(o, k, got);
        return store_int(cfg, k, o, x);
    }
    case T_FLOAT: {
        double x = strtod(v, &stop);
        if (!*v || *stop) return fail(o, k, got);
        return store_float(cfg, k, o, x);
    }
    case T_BOOL:
        if (!strcasecmp(v, "true")) *(int *)field(cfg, k) = 1;
        else if (!strcasecmp(v, "false")) *(int *)field(cfg, k) = 0;
        else return fail(o, k, got);
        return 0;
    case T_STRING: return store_string(cfg, k, o, unquote(v));
    case T_ENUM: return store_enum(cfg, k, o, unquote(v));
    case T_TARGETS: {
        size_t n = strlen(v);
        if (n >= 2 && ((v[0] == '[' && v[n - 1] == ']') || (v[0] == '(' && v[n - 1] == ')'))) {
            v[n - 1] = 0;
            v++;
        }
        uint64_t bits = 0;
        if (!*trim(v)) return fail(o, k, "an empty list");
        for (char *item = v, *next; item; item = next) {
            next = strchr(item, ',');
            if (next) *next++ = 0;
            char *name = unquote(trim(item));
            if (!*name) return fail(o, k, "an empty name");
            if (target_bits(k, o, name, &bits)) return -1;
        }
        store_targets(cfg, k, bits);
        return 0;
    }
    }
    return 0;
}

static int apply_set(tz_config *cfg, const tz_config_names *nm, const char *arg,
                     unsigned char *seen, tz_cfg_err *e) {
    const char *eq = strchr(arg, '='), *dot = strchr(arg, '.');
    if (!eq || !dot || dot > eq)
        return cfg_fail(e, "write --set section.key=value, e.g. --set train.steps=200",
                        "--set %s: expected section.key=value", arg);
    char section[64], key[64];
    snprintf(section, sizeof section, "%.*s", (int)(dot - arg), arg);
    snprintf(key, sizeof key, "%.*s", (int)(eq - dot - 1), dot + 1);
    const tz_key *kr = find_key(section, key);
    if (!kr) return fail_unknown_key(e, "--set ", section, key);
    const tz_key kn = with_names(kr, nm), *k = &kn;
    tz_origin o = {NULL, 0, arg, e};
    char *copy = tz_xstrdup(eq + 1);
    int rc = set_value(cfg, k, &o, k->type == T_STRING ? copy : trim(copy));
    free(copy);
    if (!rc) seen[kr - schema] = 1;
    return rc;
}

/* ---- public ------------------------------------------------------------------------ */

void tz_config_defaults(tz_config *cfg) {
    memset(cfg, 0, sizeof *cfg); /* padding too, so the struct compares and broadcasts as bytes */
    for (int i = 0; i < NKEYS; i++) {
        const tz_key *k = &schema[i];
        size_t want = k->type == T_INT ? sizeof(int64_t) : k->type == T_FLOAT ? sizeof(double)
                    : k->type == T_STRING || k->type == T_TARGETS ? (size_t)TZ_PATH_MAX
                                                                  : sizeof(int);
        TZ_CHECK(k->size == want, "config schema: %s.%s: wrong field size", k->section, k->key);
        switch (k->type) {
        case T_INT: *(int64_t *)field(cfg, k) = k->idef; break;
        case T_FLOAT: *(double *)field(cfg, k) = k->fdef; break;
        case T_STRING:
        case T_TARGETS: snprintf(field(cfg, k), k->size, "%s", k->sdef); break;
        case T_BOOL:
        case T_ENUM: *(int *)field(cfg, k) = (int)k->idef; break;
        }
    }
}

/* FILE may be NULL: defaults and --set only (source stays ""). */
void tz_config_load(tz_config *cfg, const tz_config_names *names, const char *file,
                    const char *const *sets, int nset) {
    unsigned char seen[NKEYS] = {0};
    tz_config_defaults(cfg);
    if (file) {
        if (strlen(file) >= sizeof cfg->source)
            TZ_FATAL("config path too long (%zu bytes, at most %d)", strlen(file), TZ_PATH_MAX - 1);
        snprintf(cfg->source, sizeof cfg->source, "%s", file);
    }
    /* the first error stops the load; everything it held is freed before the fatal error */
    tz_cfg_err e = {{0}, {0}};
    int rc = file ? load_file(cfg, names, file, seen, &e) : 0;
    for (int i = 0; i < nset && !rc; i++) rc = apply_set(cfg, names, sets[i], seen, &e);
    if (rc) TZ_FATAL_HINT(e.hint[0] ? e.hint : NULL, "%s", e.msg);
    /* optim.lr not given: the mode's own (AdamW on adapters or on every weight; qzo's step
     * multiplies a gradient-sized direction, docs/guide.md) */
    if (!seen[find_key("optim", "lr") - schema])
        cfg->optim.lr = cfg->train.mode == TZ_MODE_FULL  ? 2e-5
                        : cfg->train.mode == TZ_MODE_QZO ? 1e-6
                                                         : 2e-4;
    if (cfg->comm.backend == TZ_COMM_NCCL && cfg->run.device == TZ_DEVICE_CPU)
        TZ_FATAL_HINT("set run.device = \"cuda\" (or \"auto\" where GPUs are visible), or "
                      "comm.backend = \"mpi\" (or \"auto\")",
                      "%s: comm.backend = \"nccl\" needs GPU memory, but run.device = \"cpu\"",
                      file ? file : "(no config file)");
    for (int i = 0; i < NKEYS; i++)
        if (schema[i].required && !seen[i]) {
            char hint[160];
            snprintf(hint, sizeof hint, "add %s = ... to the %s section or pass --set %s.%s=...",
                     schema[i].key, schema[i].section, schema[i].section, schema[i].key);
            TZ_FATAL_HINT(hint, "%s: %s.%s: required key missing", file ? file : "(no config file)",
                          schema[i].section, schema[i].key);
        }
}

/* S as a libconfig string literal (quoted, escaped) into BUF of at least 4*strlen+3 bytes. */
static size_t quote_string(char *buf, const char *s) {
    size_t n = 0;
    buf[n++] = '"';
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') buf[n++] = '\\', buf[n++] = (char)c;
        else if (c == '\n') buf[n++] = '\\', buf[n++] = 'n';
        else if (c == '\t') buf[n++] = '\\', buf[n++] = 't';
        else if (c < 0x20 || c == 0x7f) n += (size_t)sprintf(buf + n, "\\x%02x", c);
        else buf[n++] = (char)c;
    }
    buf[n++] = '"';
    buf[n] = 0;
    return n;
}

/* The value at P in libconfig syntax: integers beyond 32 bits get L, floats the shortest
 * digits that read back exactly and always a '.' or exponent (so they stay floats). */
static void format_value(const tz_key *k, const void *p, char *buf, size_t n) {
    switch (k->type) {
    case T_INT: {
        long long v = *(const int64_t *)p;
        snprintf(buf, n, "%lld%s", v, v < -2147483647LL - 1 || v > 2147483647LL ? "L" : "");
        break;
    }
    case T_FLOAT: {
        double v = *(const double *)p;
        char t[40]; /* formatted here: GCC's -Wformat-truncation under -fsanitize=undefined
                     * (TZ_SANITIZE) saw a NULL buf in the loop and failed the build */
        for (int digits = 15; digits <= 17; digits++) {
            snprintf(t, sizeof t, "%.*g", digits, v);
            if (strtod(t, NULL) == v) break;
        }
        if (!strpbrk(t, ".eEn")) strcat(t, ".0");
        snprintf(buf, n, "%s", t);
        break;
    }
    case T_BOOL: snprintf(buf, n, "%s", *(const int *)p ? "true" : "false"); break;
    case T_STRING: quote_string(buf, (const char *)p); break;
    case T_ENUM: {
        int v = *(const int *)p, count = 0;
        while (k->names[count]) count++;
        quote_string(buf, v >= 0 && v < count ? k->names[v] : "?");
        break;
    }
    case T_TARGETS: { /* "q,v" -> ["q", "v"] */
        size_t used = (size_t)snprintf(buf, n, "[\"");
        for (const char *t = p; *t && used + 5 < n; t++) {
            if (*t == ',') used += (size_t)snprintf(buf + used, n - used, "\", \"");
            else buf[used++] = *t;
        }
        snprintf(buf + used, n - used, "\"]");
        break;
    }
    }
}

void tz_config_write(const tz_config *cfg, const tz_config_names *names, FILE *f) {
    size_t vn = 4 * TZ_PATH_MAX + 8; /* room for a fully escaped string */
    char want[1200], *value = tz_xmalloc(vn), *def = tz_xmalloc(vn);
    tz_config d;
    tz_config_defaults(&d);
    fprintf(f, "# turbozero %s configuration%s%s\n", TZ_VERSION, cfg->source[0] ? " from " : "",
            cfg->source);
    for (int i = 0; i < NKEYS; i++) {
        const tz_key kn = with_names(&schema[i], names), *k = &kn;
        if (i == 0 || strcmp(k->section, schema[i - 1].section))
            fprintf(f, "%s%s = {\n", i ? "};\n\n" : "\n", k->section);
        describe_expected(k, want, sizeof want);
        format_value(k, cfield(&d, k), def, vn);
        format_value(k, cfield(cfg, k), value, vn);
        fprintf(f, "  # %s; %s; %s%s\n  %s = %s;\n", k->doc, want, k->required ? "required" :
                "default ", k->required ? "" : def, k->key, value);
    }
    fputs("};\n", f);
    free(value);
    free(def);
}
