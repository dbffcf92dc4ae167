/* Names and sizes of the stored element types, and the bulk fp32 <-> bf16/fp16 converters.
 * The scalar conversions live in dtype.h (static inline); nothing here touches files. */
#include "core/dtype.h"

#include <string.h>

static const struct {
    const char *name;
    size_t size;
} dtype_table[TZ_DT_COUNT] = {
    [TZ_DT_F32] = {"F32", 4},         [TZ_DT_F16] = {"F16", 2},
    [TZ_DT_BF16] = {"BF16", 2},       [TZ_DT_I32] = {"I32", 4},
    [TZ_DT_I64] = {"I64", 8},         [TZ_DT_U8] = {"U8", 1},
    [TZ_DT_I8] = {"I8", 1},           [TZ_DT_U16] = {"U16", 2},
    [TZ_DT_I16] = {"I16", 2},         [TZ_DT_F64] = {"F64", 8},
    [TZ_DT_U32] = {"U32", 4},         [TZ_DT_U64] = {"U64", 8},
    [TZ_DT_BOOL] = {"BOOL", 1},       [TZ_DT_F8_E4M3] = {"F8_E4M3", 1},
    [TZ_DT_F8_E5M2] = {"F8_E5M2", 1},
};

size_t tz_dtype_size(enum tz_dtype dt) {
    if ((int)dt < 0 || dt >= TZ_DT_COUNT) return 0;
    return dtype_table[dt].size;
}

const char *tz_dtype_name(enum tz_dtype dt) {
    if ((int)dt < 0 || dt >= TZ_DT_COUNT) return "?";
    return dtype_table[dt].name;
}

int tz_dtype_from_name(const char *name, enum tz_dtype *out) {
    if (!name) return -1;
    for (int i = 0; i < TZ_DT_COUNT; i++) {
        if (strcmp(name, dtype_table[i].name) == 0) {
            *out = (enum tz_dtype)i;
            return 0;
        }
    }
    return -1;
}

const char *tz_dtype_all_names(void) {
    return "F32, F16, BF16, I32, I64, U8, I8, U16, I16, F64, U32, U64, BOOL, F8_E4M3, F8_E5M2";
}

/* Large tensors are converted by all threads; each element is independent, so the result
 * does not depend on the thread count. */
#define TZ_DTYPE_PAR_MIN ((int64_t)1 << 18)

int tz_dtype_to_f32(enum tz_dtype dt, const void *src, float *dst, int64_t n) {
    const unsigned char *s = (const unsigned char *)src;
    switch (dt) {
    case TZ_DT_F32:
        if (n > 0) memcpy(dst, src, (size_t)n * sizeof(float));
        return 0;
    case TZ_DT_BF16:
#pragma omp parallel for schedule(static) if (n >= TZ_DTYPE_PAR_MIN)
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = tz_bf16_to_f32(h);
        }
        return 0;
    case TZ_DT_F16:
#pragma omp parallel for schedule(static) if (n >= TZ_DTYPE_PAR_MIN)
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = tz_f16_to_f32(h);
        }
        return 0;
    default:
        return -1;
    }
}

int tz_dtype_from_f32(enum tz_dtype dt, const float *src, void *dst, int64_t n) {
    unsigned char *d = (unsigned char *)dst;
    switch (dt) {
    case TZ_DT_F32:
        if (n > 0) memcpy(dst, src, (size_t)n * sizeof(float));
        return 0;
    case TZ_DT_BF16:
#pragma omp parallel for schedule(static) if (n >= TZ_DTYPE_PAR_MIN)
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = tz_f32_to_bf16(src[i]);
            memcpy(d + 2 * i, &h, 2);
        }
        return 0;
    case TZ_DT_F16:
#pragma omp parallel for schedule(static) if (n >= TZ_DTYPE_PAR_MIN)
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = tz_f32_to_f16(src[i]);
            memcpy(d + 2 * i, &h, 2);
        }
        return 0;
    default:
        return -1;
    }
}
