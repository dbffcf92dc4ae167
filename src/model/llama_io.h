/* Llama weights in HF layout (config.json + safetensors): load and save. Adapters are the
 * family-independent PEFT files of model/adapter_io.h (names: tz_llama_lin_names). */
#ifndef TZ_LLAMA_IO_H
#define TZ_LLAMA_IO_H
#include "model/llama.h"

/* dims from DIR/config.json (fatal with the file and key on error). */
void tz_llama_read_dims(const char *dir, tz_llama_dims *d);
/* Create from DIR's config.json and load every base weight from DIR's safetensors
 * (fatal naming the file and tensor on a missing or mis-shaped tensor). A quantized file
 * (io/tq_format.h) gives a quantized base as stored; a dense one is quantized at load when
 * o->quant.bits > 0. */
tz_llama *tz_llama_load(tz_backend *be, const char *dir, const tz_model_opts *o);
/* Write DIR/config.json and DIR/model.safetensors (base weights; F32, or BF16 if bf16).
 * Fatal for a quantized model (the quantize and export commands write those). */
void tz_llama_save(tz_llama *m, const char *dir, int bf16);

#endif
