/* The one binary layout of TurboQuant weights, read by C and CUDA: code packing for 1-4 bits,
 * the sign-vector rule, and the per-tensor header. Layout only: no quantization math here.
 *
 * A quantized weight W [rows, cols] (row-major, groups of `group` consecutive elements along
 * cols, i.e. along the reduction dimension) is stored as, all little-endian:
 *
 *   codes   rows * cols * bits / 8 bytes. Group k (k = row * cols/group + j, row-major over
 *           the groups) occupies bytes [k * G, (k + 1) * G), G = TZ_TQ_GROUP_BYTES(group, bits).
 *           Within a group, element i's b-bit code sits in a little-endian bit stream:
 *             bits = 4: byte i/2; element 2i in the low nibble (bits 0-3), 2i+1 in the high.
 *             bits = 2: byte i/4; element 4i+k in bits 2k..2k+1 (element 4i in bits 0-1).
 *             bits = 1: byte i/8; element 8i+k in bit k.
 *             bits = 3: 8 codes in 3 bytes; the 3 bytes form the 24-bit little-endian word
 *                       w = b0 | b1 << 8 | b2 << 16 and code j of those 8 is bits 3j..3j+2.
 *           In every case: code i occupies bits [i*b, i*b + b) of the group's bit stream,
 *           where bit n of the stream is bit n%8 of byte n/8.
 *           A code is an index into the 2^b centroids sorted ascending (codebook.h).
 *   scales  rows * cols/group uint16, bf16 bits, one per group in the same group order.
 *
 * Signs: group column j (0 <= j < cols/group) uses s_j in {+1,-1}^group, the same for every
 * row. Word m (m = 0 .. group/64 - 1) is the (m+1)-th output of the stream
 * tz_rng_make(seed, j, TZ_RNG_QUANT, 0) (core/rng.h, splitmix64); element i's sign is
 * negative when bit i%64 of word i/64 is set. */
#ifndef TZ_TQ_LAYOUT_H
#define TZ_TQ_LAYOUT_H
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#define TZ_TQ_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#else
#define TZ_TQ_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif

#if defined(__CUDACC__)
#define TZ_TQ_HD __host__ __device__
#else
#define TZ_TQ_HD
#endif

#define TZ_TQ_MAX_BITS 4
#define TZ_TQ_MIN_GROUP 64
#define TZ_TQ_MAX_GROUP 256
/* Bytes of packed codes for one group of g codes at b bits (g a multiple of 8). */
#define TZ_TQ_GROUP_BYTES(g, b) ((g) * (b) / 8)
#define TZ_TQ_MAGIC 0x31575154u /* "TQW1" read as little-endian bytes */
#define TZ_TQ_VERSION 1
#define TZ_TQ_CODEBOOK_LLOYD_GAUSS 0 /* Lloyd-Max codebook of N(0,1), codebook.h */
#define TZ_TQ_SCALE_BF16 0

TZ_TQ_STATIC_ASSERT(TZ_TQ_GROUP_BYTES(64, 1) == 8, "1-bit group of 64");
TZ_TQ_STATIC_ASSERT(TZ_TQ_GROUP_BYTES(64, 2) == 16, "2-bit group of 64");
TZ_TQ_STATIC_ASSERT(TZ_TQ_GROUP_BYTES(64, 3) == 24, "3-bit group of 64");
TZ_TQ_STATIC_ASSERT(TZ_TQ_GROUP_BYTES(64, 4) == 32, "4-bit group of 64");
TZ_TQ_STATIC_ASSERT(TZ_TQ_GROUP_BYTES(128, 3) == 48, "3-bit group of 128");
TZ_TQ_STATIC_ASSERT(TZ_TQ_GROUP_BYTES(128, 4) == 64, "4-bit group of 128");
TZ_TQ_STATIC_ASSERT(TZ_TQ_GROUP_BYTES(256, 2) == 64, "2-bit group of 256");
TZ_TQ_STATIC_ASSERT(TZ_TQ_GROUP_BYTES(256, 3) == 96, "3-bit group of 256");
TZ_TQ_STATIC_ASSERT(TZ_TQ_GROUP_BYTES(256, 4) == 128, "4-bit group of 256");
TZ_TQ_STATIC_ASSERT(TZ_TQ_MIN_GROUP % 64 == 0, "sign words cover whole groups");

/* Per-tensor header of a stored quantized tensor (40 bytes, little-endian); the codes and
 * then the scales follow it. */
typedef struct tz_tq_header {
    uint32_t magic;       /* TZ_TQ_MAGIC */
    uint16_t version;     /* TZ_TQ_VERSION */
    uint8_t bits;         /* 1..4 */
    uint8_t codebook;     /* TZ_TQ_CODEBOOK_LLOYD_GAUSS */
    uint32_t group;       /* 64, 128 or 256 */
    uint8_t scale_dtype;  /* TZ_TQ_SCALE_BF16 */
    uint8_t reserved[3];  /* zero */
    int64_t rows;         /* out */
    int64_t cols;         /* in, a multiple of group */
    uint64_t seed;        /* sign seed */
} tz_tq_header;

TZ_TQ_STATIC_ASSERT(sizeof(tz_tq_header) == 40, "tz_tq_header is 40 bytes");
TZ_TQ_STATIC_ASSERT(offsetof(tz_tq_header, group) == 8, "tz_tq_header.group at 8");
TZ_TQ_STATIC_ASSERT(offsetof(tz_tq_header, rows) == 16, "tz_tq_header.rows at 16");
TZ_TQ_STATIC_ASSERT(offsetof(tz_tq_header, seed) == 32, "tz_tq_header.seed at 32");

/* Bytes of packed codes and count of scales of a [rows, cols] tensor. */
static inline TZ_TQ_HD int64_t tz_tq_codes_bytes(int64_t rows, int64_t cols, int bits) {
    return rows * cols / 8 * bits;
}
static inline TZ_TQ_HD int64_t tz_tq_scales_count(int64_t rows, int64_t cols, int group) {
    return rows * (cols / group);
}

/* Packs g codes (each < 2^bits, g a multiple of 8) into TZ_TQ_GROUP_BYTES(g, bits) bytes. */
static inline TZ_TQ_HD void tz_tq_pack_group(uint8_t *dst, const uint8_t *idx, int g, int bits) {
    int i;
    switch (bits) {
    case 4:
        for (i = 0; i < g / 2; i++)
            dst[i] = (uint8_t)((idx[2 * i] & 0xFu) | ((idx[2 * i + 1] & 0xFu) << 4));
        break;
    case 2:
        for (i = 0; i < g / 4; i++)
            dst[i] = (uint8_t)((idx[4 * i] & 3u) | ((idx[4 * i + 1] & 3u) << 2) |
                               ((idx[4 * i + 2] & 3u) << 4) | ((idx[4 * i + 3] & 3u) << 6));
        break;
    case 1:
        for (i = 0; i < g / 8; i++) {
            unsigned v = 0;
            int k;
            for (k = 0; k < 8; k++) v |= (unsigned)(idx[8 * i + k] & 1u) << k;
            dst[i] = (uint8_t)v;
        }
        break;
    case 3:
        for (i = 0; i < g / 8; i++) {
            uint32_t w = 0;
            int k;
            for (k = 0; k < 8; k++) w |= (uint32_t)(idx[8 * i + k] & 7u) << (3 * k);
            dst[3 * i] = (uint8_t)(w & 0xFFu);
            dst[3 * i + 1] = (uint8_t)((w >> 8) & 0xFFu);
            dst[3 * i + 2] = (uint8_t)((w >> 16) & 0xFFu);
        }
        break;
    default:
        break;
    }
}

/* Inverse of tz_tq_pack_group: g codes from TZ_TQ_GROUP_BYTES(g, bits) bytes. */
static inline TZ_TQ_HD void tz_tq_unpack_group(uint8_t *idx, const uint8_t *src, int g,
                                                int bits) {
    int i;
    switch (bits) {
    case 4:
        for (i = 0; i < g / 2; i++) {
            idx[2 * i] = (uint8_t)(src[i] & 0xFu);
            idx[2 * i + 1] = (uint8_t)(src[i] >> 4);
        }
        break;
    case 2:
        for (i = 0; i < g / 4; i++) {
            idx[4 * i] = (uint8_t)(src[i] & 3u);
            idx[4 * i + 1] = (uint8_t)((src[i] >> 2) & 3u);
            idx[4 * i + 2] = (uint8_t)((src[i] >> 4) & 3u);
            idx[4 * i + 3] = (uint8_t)(src[i] >> 6);
        }
        break;
    case 1:
        for (i = 0; i < g / 8; i++) {
            int k;
            for (k = 0; k < 8; k++) idx[8 * i + k] = (uint8_t)((src[i] >> k) & 1u);
        }
        break;
    case 3:
        for (i = 0; i < g / 8; i++) {
            uint32_t w = (uint32_t)src[3 * i] | ((uint32_t)src[3 * i + 1] << 8) |
                         ((uint32_t)src[3 * i + 2] << 16);
            int k;
            for (k = 0; k < 8; k++) idx[8 * i + k] = (uint8_t)((w >> (3 * k)) & 7u);
        }
        break;
    default:
        break;
    }
}

/* One code of a packed group, without unpacking the rest (bit-stream rule above). */
static inline TZ_TQ_HD unsigned tz_tq_code_at(const uint8_t *src, int i, int bits) {
    int bit = i * bits;
    unsigned lo = src[bit >> 3];
    unsigned hi = ((bit & 7) + bits > 8) ? src[(bit >> 3) + 1] : 0u;
    return (((hi << 8) | lo) >> (bit & 7)) & ((1u << bits) - 1u);
}

#endif
