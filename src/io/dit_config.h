/* DiT config.json: a checked parser into a pointer-free struct and an atomic writer. The
 * keys are the constructor arguments of the original DiT; no weights, no model code. */
#ifndef TZ_DIT_CONFIG_H
#define TZ_DIT_CONFIG_H
#include <stddef.h>
#include <stdint.h>

typedef struct tz_dit_config {
    int64_t input_size, patch_size, in_channels, hidden_size, depth, num_heads, num_classes;
    int64_t frequency_embedding_size; /* optional, 256 */
    double mlp_ratio;                 /* optional, 4.0 */
    double class_dropout_prob;        /* optional, 0.1 */
    int learn_sigma;                  /* optional, true (DiT's default) */
    char diffusion[16];               /* optional, "ddpm" (epsilon) or "flow" (velocity) */
} tz_dit_config;

/* Reads path (a config.json, or a folder holding one). Required: input_size, patch_size,
 * in_channels, hidden_size, depth, num_heads, num_classes (positive integers). Optional as
 * above; "model_type", when present, must be "dit". Unknown keys are ignored. 0, or non-zero
 * with "file: key \"k\" is X, expected Y". */
int tz_dit_config_read(tz_dit_config *c, const char *path, char *err, size_t errlen);
/* Writes path atomically (with "model_type": "dit", "architectures": ["DiT"]). 0 or non-zero. */
int tz_dit_config_write(const tz_dit_config *c, const char *path, char *err, size_t errlen);

#endif
