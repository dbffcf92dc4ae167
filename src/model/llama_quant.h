/* Quantized base weights of a Llama: preparing the codebook, quantizing a weight into its
 * backend storage, loading weights from a quantized or a dense file (quantizing at load).
 * The conversions of `quantize` and `export --dequantize`: model/llama_convert.h. Layout:
 * io/tq_format.h; math: src/quant. */
#ifndef TZ_LLAMA_QUANT_H
#define TZ_LLAMA_QUANT_H
#include <stdint.h>
#include <stdio.h>

#include "io/safetensors.h"
#include "io/tq_format.h"
#include "model/llama.h"

/* Sets q from a quantized file's metadata (fatal when q asks for something else: quant.bits
 * must be 0 or agree with the file's bits, group and method). */
void tz_llama_quant_from_file(tz_quant_opts *q, const tz_tqf *qf, const char *dir);
/* Loads base weight p from st: a quantized file's codes and scales (p's storage follows the
 * file), or a dense tensor (quantized here when p is quantized and the file is not). buf
 * holds p->numel floats. Fatal with the file and tensor on any error. */
void tz_llama_load_weight(tz_llama *m, const tz_safetensors *st, const tz_tqf *qf, tz_param *p,
                          float *buf);
/* config.json's "quantization_config" object for a model quantized as q (at most 400 bytes). */
void tz_llama_quant_config_json(const tz_quant_opts *q, char *qc, size_t n);
/* One log line on the base weights: how many projections are quantized, how, and bytes. */
void tz_llama_quant_report(const tz_llama *m);

#endif
