/* HF transformers config.json of the Llama architecture and its relatives (Mistral without a
 * sliding window, Qwen2/Qwen2.5, Qwen3): a checked parser into a pointer-free struct (HF
 * defaults applied) and an atomic writer transformers can load. No weights, no training. */
#ifndef TZ_HF_CONFIG_H
#define TZ_HF_CONFIG_H
#include <stddef.h>
#include <stdint.h>

typedef struct tz_hf_llama {
    int64_t vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
        num_key_value_heads, head_dim, max_position_embeddings;
    double rms_norm_eps, rope_theta;
    int tie_word_embeddings;
    /* rope_scaling: "" (null, absent or rope_type "default"), or "llama3" with its four keys */
    char rope_type[16];
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int64_t rope_original_max_position_embeddings;
    char model_type[32];  /* "llama", "mistral", "qwen2" or "qwen3" (what a type adds to the
                           * Llama layer is the model's to know: model/llama_io.c) */
    char torch_dtype[16]; /* "bfloat16", "float16", "float32"; "" when the file has none */
} tz_hf_llama;

/* HF defaults for the optional fields; the five required sizes are set to 0. */
void tz_hf_llama_defaults(tz_hf_llama *c);

/* Reads path (a config.json, or a folder holding one). Unknown keys are ignored. Required:
 * vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads.
 * Defaults: num_key_value_heads = num_attention_heads, head_dim = hidden_size /
 * num_attention_heads, rope_theta 10000, rms_norm_eps 1e-6, tie_word_embeddings false,
 * max_position_embeddings 2048. Rejected: wrong JSON types, non-positive sizes, heads that
 * do not divide, rope_scaling other than null or {"rope_type": "llama3" (or "default"), factor,
 * low_freq_factor < high_freq_factor, original_max_position_embeddings} (Llama 3.1, 3.2;
 * older files say "type"), model_type other than "llama", "mistral" (the same architecture
 * when its sliding_window is null or not below max_position_embeddings), "qwen2" or "qwen3"
 * (when use_sliding_window is false), attention_bias or mlp_bias true, hidden_act other than
 * "silu". An explicit head_dim need not equal
 * hidden_size / num_attention_heads (as in HF). 0, or non-zero with "file: key \"k\" is X,
 * expected Y" (c then holds partial values: do not use it). */
int tz_hf_llama_read(tz_hf_llama *c, const char *path, char *err, size_t errlen);

/* Checks the values the reader checks (file names the source in messages). 0 or non-zero. */
int tz_hf_llama_check(const tz_hf_llama *c, const char *file, char *err, size_t errlen);

/* Writes a config.json for LlamaForCausalLM (model_type llama, silu, no biases,
 * rope_scaling null or llama3's, bos/eos null; torch_dtype null when empty), via path.tmp + rename.
 * 0, or non-zero with a message. */
int tz_hf_llama_write(const tz_hf_llama *c, const char *path, char *err, size_t errlen);

/* Copies the config.json at src to dst (atomically), every key kept, with
 * "quantization_config" set to the JSON text quant_json (NULL: the key removed) and
 * "torch_dtype" replaced when torch_dtype is not NULL. 0, or non-zero with a message. */
int tz_hf_config_rewrite(const char *src, const char *dst, const char *quant_json,
                         const char *torch_dtype, char *err, size_t errlen);

/* The "model_type" string of the config.json in folder dir into buf ("" when the key is
 * absent). 0, or non-zero with a message naming the file. */
int tz_hf_model_type(const char *dir, char *buf, size_t len, char *err, size_t errlen);

#endif
