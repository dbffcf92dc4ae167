/* The conversions of `turbozero quantize` and `turbozero export --dequantize`: a Llama folder
 * to another, on the host (no backend). */
#ifndef TZ_LLAMA_CONVERT_H
#define TZ_LLAMA_CONVERT_H
#include <stdint.h>
#include <stdio.h>

/* Quantizes every projection of the transformer blocks of the Llama in DIR `in` (method
 * TZ_TQ_TURBOQUANT or TZ_TQ_ABSMAX, bits 1..4, group 64/128/256, which the caller has checked:
 * a projection whose rows group does not divide takes the largest of group/2, ..., 64 that
 * does, or stays dense) and
 * writes DIR `out`: config.json with "quantization_config", model.safetensors with codes,
 * scales and the other tensors unchanged. Prints the per-tensor table (shape, group, bits
 * per weight stored, relative error ||W - W_hat||^2 / ||W||^2, bytes) and totals to rep.
 * Fatal with the place on any error; out is written atomically. */
void tz_llama_quantize_dir(const char *in, const char *out, int method, int bits, int group,
                           uint64_t seed, FILE *rep);
/* Writes DIR `out` in plain HF layout, every tensor F32, the quantized ones dequantized;
 * config.json without "quantization_config". A dense `in` is simply converted to F32. */
void tz_llama_export_dequantized(const char *in, const char *out, FILE *rep);

#endif
