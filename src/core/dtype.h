/* Element types of stored tensors (the safetensors set), their names and sizes, and exact
 * scalar conversions between fp32 and bf16/fp16. No tensors, no files: just the numbers. */
#ifndef TZ_DTYPE_H
#define TZ_DTYPE_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum tz_dtype {
    TZ_DT_F32 = 0,
    TZ_DT_F16,
    TZ_DT_BF16,
    TZ_DT_I32,
    TZ_DT_I64,
    TZ_DT_U8,
    TZ_DT_I8,
    TZ_DT_U16,
    TZ_DT_I16,
    TZ_DT_F64,
    TZ_DT_U32,
    TZ_DT_U64,
    TZ_DT_BOOL,
    TZ_DT_F8_E4M3,
    TZ_DT_F8_E5M2,
    TZ_DT_COUNT /* number of types; not a type */
};

/* Bytes per element; 0 for a value outside the enum. */
size_t tz_dtype_size(enum tz_dtype dt);
/* The safetensors spelling ("F32", "BF16", ...); "?" for a value outside the enum. */
const char *tz_dtype_name(enum tz_dtype dt);
/* Parses a safetensors dtype string. 0 on success, -1 when the name is unknown. */
int tz_dtype_from_name(const char *name, enum tz_dtype *out);
/* Every known name, comma separated, for error messages ("F32, F16, ..."). */
const char *tz_dtype_all_names(void);

/* ---- scalar conversions (exact where the value is representable) ---- */

static inline uint32_t tz_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float tz_f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* bf16 is the top half of an fp32: widening is exact. */
static inline float tz_bf16_to_f32(uint16_t h) { return tz_f32_from_bits((uint32_t)h << 16); }

/* Round to nearest, ties to even; overflow goes to inf; NaN stays NaN (quiet). */
static inline uint16_t tz_f32_to_bf16(float f) {
    uint32_t x = tz_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x0040u);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* IEEE binary16 -> fp32, exact for every input: subnormals are normalised, inf stays inf,
 * NaN keeps its sign and payload. */
static inline float tz_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1fu) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else {
        uint32_t e = 113u; /* exponent of 2^-14, the subnormal scale, in fp32 bias */
        while (!(man & 0x400u)) {
            man <<= 1;
            e--;
        }
        bits = sign | (e << 23) | ((man & 0x3ffu) << 13);
    }
    return tz_f32_from_bits(bits);
}

/* fp32 -> IEEE binary16, round to nearest, ties to even, including into and out of the
 * subnormal range; |x| >= 65520 gives inf; NaN stays NaN (quiet, payload top bits kept). */
static inline uint16_t tz_f32_to_f16(float f) {
    uint32_t x = tz_f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) {
        if (ax == 0x7f800000u) return (uint16_t)(sign | 0x7c00u);
        return (uint16_t)(sign | 0x7c00u | 0x200u | ((ax >> 13) & 0x3ffu));
    }
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520: rounds to inf */
    if (ax >= 0x38800000u) {                                   /* >= 2^-14: normal */
        uint32_t r = ax - (112u << 23);
        r += 0xfffu + ((r >> 13) & 1u);
        return (uint16_t)(sign | (r >> 13));
    }
    if (ax < 0x33000000u) return sign; /* < 2^-25: rounds to zero */
    /* subnormal: count units of 2^-24, rounding the dropped bits to nearest even. The
     * result may carry into 0x400, which is the encoding of the smallest normal. */
    uint32_t e = ax >> 23; /* 102..112 */
    uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e; /* 14..24 */
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint16_t)(sign | q);
}

/* ---- bulk conversions; src may be unaligned (it often points into a mapped file) ---- */

/* n elements of dtype dt (F32, F16 or BF16) to fp32. Returns 0, or -1 for another dtype. */
int tz_dtype_to_f32(enum tz_dtype dt, const void *src, float *dst, int64_t n);
/* n fp32 values to dt (F32, F16 or BF16), rounding to nearest even. 0, or -1. */
int tz_dtype_from_f32(enum tz_dtype dt, const float *src, void *dst, int64_t n);

#endif
