/* PEFT LoRA adapter_config.json: the fields turbozero reads and writes (r, lora_alpha,
 * target_modules, base model path, task type, the base's quantization). Format only. */
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
    char task_type[32];       /* PEFT task_type ("CAUSAL_LM"); "" is written as null */
    /* The quantization of the base the adapter was trained on, in the key
     * "turbozero_base_quantization" (absent, and quant_bits 0, for a dense base). */
    int quant_bits, quant_group;
    char quant_method[16];    /* "turboquant" | "absmax" */
    uint64_t quant_seed;
    /* lora.init = "loftq": the base was re-quantized with the first adapters, made from
     * init_seed (run.seed); kept in the same key ("lora_init", "init_seed"), so the base can
     * be made again wherever the adapter is used. "" for the default init. */
    char lora_init[16];
    uint64_t init_seed;
    /* modules trained whole beside the adapters and saved with them (PEFT modules_to_save,
     * e.g. "y_embedder.embedding_table"); written, not read (the adapter file says it) */
    int nsave;
    char save[4][96];
} tz_peft_config;

/* Reads path (an adapter_config.json). 0, or non-zero with a message naming the file and key. */
int tz_peft_read(tz_peft_config *c, const char *path, char *err, size_t errlen);
/* Writes path atomically (LoRA, c->task_type, bias none, dropout 0, the base's quantization). */
int tz_peft_write(const tz_peft_config *c, const char *path, char *err, size_t errlen);

#endif
