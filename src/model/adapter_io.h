/* LoRA adapters of any model family in PEFT layout (adapter_config.json and
 * adapter_model.safetensors), and the write of a parameter table (dense, or quantized). The
 * families pass the names of their projections; formats are in io/ (peft, safetensors). */
#ifndef TZ_ADAPTER_IO_H
#define TZ_ADAPTER_IO_H
#include <stdint.h>

#include "core/backend.h"
#include "io/peft.h"
#include "model/model_base.h"
#include "model/params.h"

/* Reads DIR/adapter_config.json; target_modules must all be in names[0..n) (fatal naming the
 * file, the module and the family's names otherwise). */
void tz_adapter_read_spec(const char *dir, const char *const *names, int n, tz_lora_spec *s);
/* Loads every adapter tensor of ps from DIR/adapter_model.safetensors by name and shape. */
/* base: the model folder it is applied to (NULL: not checked): a warning when the adapter
 * records another base's identity (io/safetensors.h, tz_st_identity). */
void tz_adapter_load(tz_params *ps, tz_backend *be, const char *dir, const char *base);
/* Writes DIR/adapter_model.safetensors (F32) and DIR/adapter_config.json (PEFT task_type,
 * NULL for none, and the quantization of the base ps holds). */
void tz_adapter_save(tz_params *ps, tz_backend *be, const char *dir, const char *const *names,
                     int n, const tz_lora_spec *s, const char *base_model_path,
                     const char *task_type);
/* The adapters of ps as diffusers' LoRA file of a pipeline component (its
 * pytorch_lora_weights.safetensors, which load_lora_weights reads): PREFIX.MODULE.lora_A.weight
 * and .lora_B.weight, F32, with B scaled by alpha / r (diffusers takes alpha = r where a file
 * states none, so the product means what it means here). Written atomically to path. */
void tz_adapter_save_diffusers(tz_params *ps, tz_backend *be, const char *path,
                               const char *prefix, const tz_lora_spec *s);
/* The quantization of the base ps holds into c's quant_* fields: bits, method and seed of its
 * quantized weights, the largest group among them (quant.group; rows it does not divide
 * use a smaller one); bits 0: dense. */
void tz_adapter_base_quant(const tz_params *ps, tz_peft_config *c);
/* A tensor of backend floats written under a name and shape of its own: a buffer that is no
 * parameter (DiT's pos_embed), or a parameter in its file layout (a Conv2d weight held as a
 * matrix); a view named like a parameter is written instead of it. */
typedef struct tz_tensor_view {
    const char *name;
    int ndim;           /* 1..4 */
    int64_t shape[4];
    const float *w;     /* backend memory, the product of shape floats */
} tz_tensor_view;

/* Writes the tensors of ps whose adapter flag equals `adapters`, and the n_views views, to a
 * safetensors file under their table names and shapes: dense ones as F32 (or BF16 rounded to
 * nearest even); quantized ones, with quant given, in the quantized layout of io/tq_format.h
 * (codes, scales and the metadata, whose top-level method/bits/group/seed are *quant's), or
 * with quant NULL dequantized like the dense ones; extra: more metadata pairs (key, value, ...,
 * NULL), or NULL. Returns the number written quantized. */
int tz_params_save(tz_params *ps, tz_backend *be, const char *path, int adapters, int bf16,
                         const tz_tensor_view *views, int n_views, const tz_quant_opts *quant,
                         const char *const *extra);

/* Folds the LoRA adapters of ps into their base weights, W += alpha / rank * B A (PEFT's
 * names: base_model.model.X.lora_A.weight and lora_B adapt X.weight), and makes every
 * quantized weight dense, dequantized: afterwards the base weights alone compute what base +
 * adapters computed (to rounding) and save like any dense model's. The adapter tensors are
 * left as they were. Returns the number of weights merged; fatal when an adapter's weight is
 * missing or mis-shaped. */
int tz_params_merge_lora(tz_params *ps, tz_backend *be, const tz_lora_spec *s);

#endif
