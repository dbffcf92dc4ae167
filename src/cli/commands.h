/* The one-process commands of the CLI besides train, eval and bench: init-model and sample
 * reach a family through the registry, quantize and export convert Llama folders. Arguments
 * arrive split by main.c, which includes no model header; the checks that name flags are here. */
#ifndef TZ_COMMANDS_H
#define TZ_COMMANDS_H
#include <stdint.h>

#include "io/config.h"
#include "task/family.h"

/* s as an integer; fatal naming the flag (what) otherwise. */
int64_t tz_command_int(const char *s, const char *what);

/* Fatal unless --out (out) may be written by command cmd: out must not be the input folder
 * in (NULL when there is none) nor inside it, after links are resolved, whatever force says;
 * an existing file or non-empty folder is refused unless force (--force). */
void tz_command_check_output(const char *cmd, const char *out, const char *in, int force);

/* A random model of family `arch` (init-model --arch), as the family's preset says; fatal
 * naming the families when there is none of that name. */
void tz_init_model_run(const char *arch, const tz_init_args *a);
/* a->n images of class a->cls from the configured model (+ model.adapter) by the family's
 * sampler, as a PNG grid; fatal when the family has none. One process. */
int tz_sample_run(const tz_config *cfg, const tz_sample_args *a);

/* A continuation of a->prompt from the configured model (+ model.adapter) by the family's
 * generator, on stdout; fatal when the family has none. One process. */
int tz_generate_run(const tz_config *cfg, const tz_generate_args *a);

/* What `turbozero quantize` was given, as typed (group, method and seed may be NULL). */
typedef struct tz_quantize_args {
    const char *in, *out, *bits, *group, *method, *seed;
} tz_quantize_args;
/* The projections of the Llama folder a->in quantized into a->out, with a report on stdout
 * (model/llama_quant.h); fatal naming the flag on a bad value. */
void tz_quantize_run(const tz_quantize_args *a);
/* export --dequantize: the Llama folder in, every tensor F32 (the quantized ones decoded). */
void tz_export_run(const char *in, const char *out);
/* export --merge: the model folder in (Llama, Mistral-style or DiT, by its config.json's
 * model_type; dense or quantized) with the LoRA adapter folder `adapter` folded into its
 * weights, written to out as a dense folder of the same layout (F32, or BF16 when bf16):
 * config.json copied from in without "quantization_config", the tokenizer files copied. */
void tz_export_merge_run(const char *in, const char *adapter, const char *out, int bf16);
/* export CHECKPOINT: the effective configuration checkpoint folder `folder` was written with
 * (its checkpoint.json, checked), then the overrides (`--set`, nset of them); cfg->source
 * names the folder. Fatal when the checkpoint is damaged or holds none. Rank 0. */
void tz_export_checkpoint_config(tz_config *cfg, const char *folder, const char *const *sets,
                                 int nset);

#endif
