/* The quantized-model layout in safetensors (docs/guide.md, "Quantized models"): a quantized
 * weight NAME is stored as NAME.tq_codes (U8 [rows, cols*bits/8], packed as
 * quant/tq_layout.h says) and NAME.tq_scales (BF16 [rows, cols/group]), and described in
 * __metadata__["turbozero_quant"], a JSON object:
 *
 *   {"version": 1, "method": "turboquant" | "absmax", "codebook": "lloyd-max-gaussian" |
 *    "uniform", "scale_dtype": "bf16", "bits": B, "group": G, "seed": S,
 *    "tensors": {"NAME": {"shape": [rows, cols], "bits": b, "group": g}, ...}}
 *
 * B and G are what was asked; each tensor's own bits and group are what it holds (g may be
 * smaller than G where G does not divide cols). S is the sign seed of every tensor. Reading
 * checks all of it before anything is used; quantization math is src/quant's, not here. */
#ifndef TZ_TQ_FORMAT_H
#define TZ_TQ_FORMAT_H
#include <stddef.h>
#include <stdint.h>

#include "io/safetensors.h"
#include "quant/turboquant.h"

#define TZ_TQF_META_KEY "turbozero_quant"
#define TZ_TQF_VERSION 1
#define TZ_TQF_CODES ".tq_codes"
#define TZ_TQF_SCALES ".tq_scales"

typedef struct tz_tqf_entry {
    char *name;                        /* the weight's own name, e.g. "...q_proj.weight" */
    int bits, group;
    int64_t rows, cols;
    const tz_st_tensor *codes, *scales; /* inside the open safetensors */
} tz_tqf_entry;

typedef struct tz_tqf {
    int present;      /* 0: the file holds no quantized tensor (a plain model) */
    int method;       /* enum tz_tq_method */
    int bits, group;  /* as asked when the file was made */
    uint64_t seed;
    tz_tqf_entry *e;  /* sorted by name */
    int64_t n;
} tz_tqf;

/* Reads and checks the quantization metadata of st and every tensor it lists: version,
 * method, codebook, scale dtype, bits (1..4), group (64, 128 or 256, dividing the row),
 * shapes, dtypes and byte counts of NAME.tq_codes and NAME.tq_scales, no dense NAME beside
 * them, and no .tq_codes/.tq_scales tensor that the metadata does not list. 0 (q->present 0
 * for a plain file), or non-zero with a message naming the file and tensor (q left empty). */
int tz_tqf_read(tz_tqf *q, const tz_safetensors *st, char *err, size_t errlen);
void tz_tqf_free(tz_tqf *q);
/* NULL when name is not a quantized tensor of q. */
const tz_tqf_entry *tz_tqf_find(const tz_tqf *q, const char *name);
/* 1 when a tensor name ends in .tq_codes or .tq_scales. */
int tz_tqf_is_part(const char *name);
/* t = e's codes and scales (t is initialised here with e's shape, bits, group and q's
 * seed; free it with tz_tq_tensor_free). 0, or non-zero with a message. */
int tz_tqf_load(const tz_tqf *q, const tz_tqf_entry *e, tz_tq_tensor *t, char *err,
                size_t errlen);

/* ---- writing ---- */

/* Adds NAME.tq_codes and NAME.tq_scales of t to w (data borrowed from t until saved). */
int tz_tqf_writer_add(tz_st_writer *w, const char *name, const tz_tq_tensor *t, char *err,
                      size_t errlen);
/* The metadata value for n quantized tensors names[i] holding ts[i] (malloc'd string). */
char *tz_tqf_meta_json(int method, int bits, int group, uint64_t seed,
                       const char *const *names, const tz_tq_tensor *const *ts, int64_t n);

#endif
