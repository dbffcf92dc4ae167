/* DiT weights in a folder (config.json + model.safetensors, original DiT tensor names) and
 * LoRA adapters in PEFT layout: load and save. Name mapping only; formats are in io/. */
#ifndef TZ_DIT_IO_H
#define TZ_DIT_IO_H
#include "model/dit.h"

/* dims from DIR/config.json (fatal naming the file and key on error). */
void tz_dit_read_dims(const char *dir, tz_dit_dims *d);
/* Create from DIR/config.json and load every base weight from DIR's safetensors (fatal
 * naming the file and tensor on a missing or mis-shaped one). x_embedder.proj.weight may be
 * the Conv2d layout [hidden, C, p, p] or the flattened [hidden, C*p*p]: the bytes are the
 * same. pos_embed, when present, is ignored (it is fixed and recomputed). */
tz_dit *tz_dit_load(tz_backend *be, const char *dir, const tz_model_opts *o);
/* Write DIR/config.json and DIR/model.safetensors (F32, or BF16 if bf16) with the original
 * DiT names and shapes: x_embedder.proj.weight as [hidden, C, p, p], plus pos_embed
 * [1, T, hidden], so DiT's load_state_dict(strict=True) takes the file as it is. */
void tz_dit_save(tz_dit *m, const char *dir, int bf16);
/* LoRA settings from DIR/adapter_config.json (target names: tz_dit_lin_names). */
void tz_dit_read_adapter_opts(const char *dir, tz_model_opts *o);
void tz_dit_load_adapter(tz_dit *m, const char *dir);
void tz_dit_save_adapter(tz_dit *m, const char *dir, const char *base_model_path);

#endif
