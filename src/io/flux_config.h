/* Flux transformer config.json (diffusers' FluxTransformer2DModel): a checked parser into a
 * pointer-free struct. No weights, no model code. */
#ifndef TZ_FLUX_CONFIG_H
#define TZ_FLUX_CONFIG_H
#include <stddef.h>
#include <stdint.h>

typedef struct tz_flux_config {
    int64_t patch_size, in_channels, out_channels; /* out_channels null or absent: in_channels */
    int64_t num_layers, num_single_layers, attention_head_dim, num_attention_heads;
    int64_t joint_attention_dim, pooled_projection_dim;
    int guidance_embeds;
    int64_t axes_dims_rope[3];
} tz_flux_config;

/* Reads path (a config.json, or a folder holding one). Required: in_channels, num_layers,
 * num_single_layers, attention_head_dim, num_attention_heads, joint_attention_dim,
 * pooled_projection_dim (non-negative integers; the layer counts may be 0). Optional:
 * axes_dims_rope (three integers; absent in the first Flux.1 configs: [16, 56, 56], diffusers'
 * default), patch_size (1, the only value supported), out_channels, guidance_embeds (false). "_class_name", when present, must be "FluxTransformer2DModel".
 * 0, or non-zero with "file: key \"k\" is X, expected Y". */
int tz_flux_config_read(tz_flux_config *c, const char *path, char *err, size_t errlen);
/* Writes path atomically, in diffusers' layout (with "_class_name"). 0 or non-zero. */
int tz_flux_config_write(const tz_flux_config *c, const char *path, char *err, size_t errlen);

#endif
