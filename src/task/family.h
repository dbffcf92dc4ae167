/* The model families: each is one tz_family (defined beside its task, train/task_<name>.c) and
 * one line in the registry (family.c). The trainer and the CLI reach a family only through it;
 * the lookups and the names the config checks are here, the families' code is not. */
#ifndef TZ_FAMILY_H
#define TZ_FAMILY_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/backend.h"
#include "io/config.h"

typedef struct tz_task tz_task;
typedef struct tz_task_ops tz_task_ops;

#define TZ_INIT_FLAGS_MAX 16

/* What `turbozero init-model` gives a family: the common flags, and the values of the flags
 * the families declare (tz_family_init_flags; a value is NULL when its flag was not given). */
typedef struct tz_init_args {
    const char *preset, *out;
    uint64_t seed;
    tz_backend *be;     /* where the model is built (the CPU backend) */
    int n;
    const char *flags[TZ_INIT_FLAGS_MAX];
    const char *values[TZ_INIT_FLAGS_MAX];
} tz_init_args;
/* The value given for flag ("--vocab"), or NULL. */
const char *tz_init_arg(const tz_init_args *a, const char *flag);

/* What `turbozero sample` asks for. */
typedef struct tz_sample_args {
    int64_t cls, n, steps, seed;
    int64_t scale; /* each pixel enlarged to scale x scale (1: as sampled) */
    double guidance;
    double shift;  /* --shift: a static timestep shift for Flux (0: the family's default) */
    int given;     /* which of --class, --steps, --guidance were given (TZ_SAMPLE_*) */
    char out[1024];
    char prompts[1024]; /* --prompts: a cache whose text embeddings condition (Flux) */
} tz_sample_args;
enum { TZ_SAMPLE_CLASS = 1, TZ_SAMPLE_STEPS = 2, TZ_SAMPLE_GUIDANCE = 4 };
/* Whether sample's --out names an HDF5 file (.h5 or .hdf5): latents rather than a PNG grid. */
static inline int tz_sample_out_h5(const char *out) {
    const size_t n = strlen(out);
    return (n > 3 && !strcmp(out + n - 3, ".h5")) || (n > 5 && !strcmp(out + n - 5, ".hdf5"));
}

/* What `turbozero generate` asks for. */
typedef struct tz_generate_args {
    const char *prompt;     /* the text to continue */
    const char *tokenizer;  /* --tokenizer (NULL: the model folder's tokenizer.json, else bytes
                             * for a vocab of 256) */
    int64_t max_new, seed;
    double temperature;     /* 0: greedy (argmax, deterministic) */
    double top_p;           /* nucleus sampling: the smallest set of tokens of this mass */
    int chat;               /* --chat: the prompt in a chat template (tokenizer_config.json's) */
    const char *tmpl;       /* --template NAME (implies chat; NULL: the tokenizer's) */
    const char *system;     /* --system TEXT: the chat's system message (NULL: none) */
    const char *stops[8];   /* --stop STRING: the text ends before the first of these */
    int nstops;
    int interactive;        /* --interactive: prompts from stdin, one a line */
} tz_generate_args;

typedef struct tz_family {
    const char *name;               /* model.arch and init-model --arch */
    /* The projections LoRA can adapt, in the model's order (bit 1 << j of tz_lora_spec.targets):
     * their lora.targets names, NULL-terminated, and their PEFT target_modules names. */
    const char *const *targets;
    const char *const *modules;
    /* Its task: the model with its data behind the trainer's calls (task/task.h). */
    const tz_task_ops *task;
    /* init-model: the family's own flags (NULL-terminated) and the preset-driven writer of a
     * random model into a->out (fatal on a bad preset or flag); returns the model's number of
     * parameters and puts a few words on its shape into about. */
    const char *const *init_flags;
    int64_t (*init_model)(const tz_init_args *a, char *about, size_t n);
    /* sample: images from the configured model as a PNG (one process); NULL: no sampler. */
    int (*sample)(const tz_config *cfg, const tz_sample_args *a);
    /* The PEFT task_type of its adapters ("CAUSAL_LM"), or NULL (written as null). */
    const char *peft_task_type;
    /* generate: a continuation of a->prompt on stdout (one process); NULL: no generator. */
    int (*generate)(const tz_config *cfg, const tz_generate_args *a);
    /* A pipeline component's name ("transformer"): the adapter folder also holds diffusers'
     * LoRA file, pytorch_lora_weights.safetensors, with keys under it; NULL: none. */
    const char *diffusers_component;
    /* The conditioning embeddings lora.train_embeddings trains beside the adapters (DiT: its
     * class table), for messages; NULL: the family has none, and the key is refused. */
    const char *embeddings;
    /* 1: the family streams its last blocks' quantized codes from the host
     * (quant.offload_blocks, model/wstream.h). */
    int offload_blocks;
} tz_family;

/* The registry's entries, each defined in its family's task file. */
extern const tz_family tz_family_llama, tz_family_dit, tz_family_flux;

/* The family of model.arch (registry order is the config's index), or of a name (NULL when
 * there is none). */
const tz_family *tz_family_of(const tz_config *cfg);
const tz_family *tz_family_find(const char *name);
/* The families' names and LoRA targets, for tz_config_load and tz_config_write. */
void tz_family_names(tz_config_names *n);
/* The families (only those with a sampler when samplers is set) as "a, b or c", quoted when
 * quote is set, into buf. */
const char *tz_family_list(char *buf, size_t n, int samplers, int quote);
/* Every family's init-model flags, each once, into a->flags (a->n of them). */
void tz_family_init_flags(tz_init_args *a);
/* How many projections f can adapt (its targets). */
int tz_family_n_targets(const tz_family *f);
/* lora.targets as bits of f's projections ("all": every one); fatal naming f's targets when a
 * name is not one of them. */
int tz_family_lora_targets(const tz_family *f, const tz_config *cfg);

#endif
