/* PEFT LoRA adapter_config.json: the fields turbozero reads and writes (r, lora_alpha,
 * target_modules, base model path). Format only; tensors go through safetensors. */
#ifndef TZ_PEFT_H
#define TZ_PEFT_H
#include <stddef.h>
#include <stdint.h>

#define TZ_PEFT_MAX_TARGETS 16

typedef struct tz_peft_config {
    int64_t r;
    double alpha;
    int ntargets;
    char targets[TZ_PEFT_MAX_TARGETS][32]; /* e.g. "q_proj" */
    char base_model[512];
} tz_peft_config;

/* Reads path (an adapter_config.json). 0, or non-zero with a message naming the file and key. */
int tz_peft_read(tz_peft_config *c, const char *path, char *err, size_t errlen);
/* Writes path atomically (LoRA, CAUSAL_LM, bias none, dropout 0). */
int tz_peft_write(const tz_peft_config *c, const char *path, char *err, size_t errlen);

#endif
