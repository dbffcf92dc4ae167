/* A labelled image set in memory, the common result of the IDX and HDF5 readers: float
 * images [n, C, H, W] (pixels mapped to [-1, 1], or latents as stored) and int32 labels. */
#ifndef TZ_IMAGE_SET_H
#define TZ_IMAGE_SET_H
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct tz_image_set {
    int64_t n, C, H, W;
    int64_t num_classes; /* every label is in [0, num_classes) */
    float *x;            /* [n, C, H, W], malloc'd */
    int32_t *y;          /* [n], malloc'd */
} tz_image_set;

/* Values of one image. */
static inline int64_t tz_image_set_numel(const tz_image_set *s) { return s->C * s->H * s->W; }

static inline void tz_image_set_free(tz_image_set *s) {
    free(s->x);
    free(s->y);
    memset(s, 0, sizeof *s);
}

#endif
