/* DiT weights in a folder (config.json + model.safetensors, original DiT tensor names): load
 * and save. Name mapping only; formats are in io/, adapters in model/adapter_io.h. */
#ifndef TZ_DIT_IO_H
#define TZ_DIT_IO_H
#include "model/dit.h"

/* Create from DIR/config.json and load every base weight from DIR's safetensors (fatal
 * naming the file and tensor on a missing or mis-shaped one). x_embedder.proj.weight may be
 * the Conv2d layout [hidden, C, p, p] or the flattened [hidden, C*p*p]: the bytes are the
 * same. pos_embed, when present, is ignored (it is fixed and recomputed). */
tz_dit *tz_dit_load(tz_backend *be, const char *dir, const tz_model_opts *o);
/* Write DIR/config.json and DIR/model.safetensors (F32, or BF16 if bf16) with the original
 * DiT names and shapes: x_embedder.proj.weight as [hidden, C, p, p], plus pos_embed
 * [1, T, hidden], so DiT's load_state_dict(strict=True) takes the file as it is. */
void tz_dit_save(tz_dit *m, const char *dir, int bf16);

#endif
