/* Cached latents for the Flux family in HDF5 (docs/dit.md, "Flux"): what the VAE and the
 * text encoders made of each training sample, so training needs neither. Datasets: "latents"
 * float32 [N, Ti, C] (the VAE latents packed 2x2 into tokens, Flux: C = 64), "txt" float32
 * [N, Tt, J] (the T5 sequence embeddings), "pooled" float32 [N, P] (the CLIP pooled
 * embedding), "img_ids" float32 [Ti, 3] and "txt_ids" float32 [Tt, 3] (the RoPE positions:
 * (0, row, col) per image token, zeros for text). Rows are read on demand; the file stays
 * open. Errors name the file, never fatal. */
#ifndef TZ_LATENTS_H5_H
#define TZ_LATENTS_H5_H
#include <stddef.h>
#include <stdint.h>

typedef struct tz_latents {
    char path[1024];
    int64_t n, Ti, Tt, C, J, P;
    float *img_ids, *txt_ids; /* [Ti, 3], [Tt, 3], read at open */
    long long f, ds[3];        /* HDF5 ids: the file; latents, txt, pooled */
} tz_latents;

/* Opens path and checks every dataset's rank, type and shape against the others. 0, or
 * non-zero with a message naming the file and what was expected. */
int tz_latents_open(tz_latents *l, const char *path, char *err, size_t errlen);
/* Row i (0 <= i < n) into lat [Ti, C], txt [Tt, J], pooled [P]. 0, or non-zero with err. */
int tz_latents_read(tz_latents *l, int64_t i, float *lat, float *txt, float *pooled, char *err,
                    size_t errlen);
void tz_latents_close(tz_latents *l);
/* Sampled latents (what `sample` makes of a cache's prompts): "latents" float32 [n, Ti, C],
 * "noise" float32 [n, Ti, C] (where each sample started) and "img_ids" float32 [Ti, 3], with
 * root attributes "rows" int64 [n] (the prompt row of each
 * sample), "steps", "seed" (int64) and "guidance" (float64); to path.tmp, then renamed over
 * path. 0, or non-zero with a message naming the file. */
typedef struct tz_latents_out {
    int64_t n, Ti, C, steps, seed;
    double guidance;
    const float *lat, *noise, *img_ids;
    const int64_t *rows;
} tz_latents_out;
int tz_latents_write(const char *path, const tz_latents_out *o, char *err, size_t errlen);

#endif
