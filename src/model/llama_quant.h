/* Quantized base weights of a Llama: preparing the codebook, quantizing a weight into its
 * backend storage, loading weights from a quantized or a dense file (quantizing at load).
 * The file layout is io/tq_format.h; the math is src/quant; the commands are llama_convert. */
#ifndef TZ_LLAMA_QUANT_H
#define TZ_LLAMA_QUANT_H
#include "io/safetensors.h"
#include "io/tq_format.h"
#include "model/llama.h"

/* Checks m->o.quant (fatal with a hint when it cannot be used) and fills m->cb and
 * m->levels. Called by tz_llama_create when o.quant.bits > 0. */
void tz_llama_quant_prepare(tz_llama *m);
/* Quantizes the host weight w (p->numel floats) as p->q says and uploads codes and scales. */
void tz_llama_quantize_param(tz_llama *m, tz_param *p, const float *w);
/* Sets o->quant from a quantized file's metadata (fatal when o->quant asks for something
 * else: quant.bits must be 0 or agree with the file's bits, group and method). */
void tz_llama_quant_from_file(tz_llama_opts *o, const tz_tqf *qf, const char *dir);
/* Loads base weight p from st: a quantized file's codes and scales (p's storage follows the
 * file), or a dense tensor (quantized here when p is quantized and the file is not). buf
 * holds p->numel floats. Fatal with the file and tensor on any error. */
void tz_llama_load_weight(tz_llama *m, const tz_safetensors *st, const tz_tqf *qf, tz_param *p,
                          float *buf);
/* One log line on the base weights: how many projections are quantized, how, and bytes. */
void tz_llama_quant_report(const tz_llama *m);

#endif
