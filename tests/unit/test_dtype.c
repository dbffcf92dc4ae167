/* dtype names/sizes and the fp32 <-> bf16/fp16 conversions: exhaustive over all 16-bit
 * values, ties-to-even checked against brute force. No files. */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/dtype.h"
#include "tz_check.h"



static double f16_value(uint16_t h) { /* independent reference: ldexp on the fields */
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return (h & 0x8000) ? -v : v;
}

static void test_conversions(void) {
    int bad_bf = 0, bad_h2f = 0, bad_rt = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = tz_bf16_to_f32((uint16_t)h);
        if (isnan(f)) {
            if (!isnan(tz_bf16_to_f32(tz_f32_to_bf16(f)))) bad_bf++;
        } else if (tz_f32_to_bf16(f) != h) {
            bad_bf++;
        }
        float g = tz_f16_to_f32((uint16_t)h);
        int nan = ((h >> 10) & 31) == 31 && (h & 1023);
        int inf = ((h >> 10) & 31) == 31 && !(h & 1023);
        if (nan) {
            if (!isnan(g) || (signbit(g) != 0) != ((h & 0x8000) != 0)) bad_h2f++;
            /* payload and sign kept; a signalling NaN comes back quiet (bit 9 set) */
            if (tz_f32_to_f16(g) != (h | 0x200u)) bad_rt++;
        } else if (inf) {
            if (!isinf(g) || (g < 0) != ((h & 0x8000) != 0)) bad_h2f++;
            if (tz_f32_to_f16(g) != h) bad_rt++;
        } else {
            double want = f16_value((uint16_t)h);
            if ((double)g != want || !signbit(g) != !signbit(want)) bad_h2f++;
            if (tz_f32_to_f16(g) != h) bad_rt++;
        }
    }
    check(bad_bf == 0, "bf16 -> f32 -> bf16 exact for all 65536 values (%d bad)", bad_bf);
    check(bad_h2f == 0, "f16 -> f32 exact (subnormal, inf, nan) for all 65536 (%d bad)", bad_h2f);
    check(bad_rt == 0, "f16 -> f32 -> f16 identity (NaNs come back quiet) for all 65536 (%d bad)",
          bad_rt);

    /* bf16 round to nearest even */
    float one_half_ulp = 1.0f + ldexpf(1.0f, -8), three_half = 1.0f + 3 * ldexpf(1.0f, -8);
    float above = 1.0f + ldexpf(1.0f, -8) + ldexpf(1.0f, -20);
    int ok = tz_f32_to_bf16(one_half_ulp) == 0x3f80 && tz_f32_to_bf16(three_half) == 0x3f82 &&
             tz_f32_to_bf16(above) == 0x3f81 && tz_f32_to_bf16(3.4028235e38f) == 0x7f80 &&
             tz_f32_to_bf16(-0.0f) == 0x8000 && isnan(tz_bf16_to_f32(tz_f32_to_bf16(NAN))) &&
             tz_f32_to_bf16(tz_f32_from_bits(0x7f800001u)) != 0x7f80;
    check(ok, "f32 -> bf16 ties to even, overflow to inf, NaN stays NaN");

    /* f16 special points */
    ok = tz_f32_to_f16(65504.0f) == 0x7bff && tz_f32_to_f16(65519.99f) == 0x7bff &&
         tz_f32_to_f16(65520.0f) == 0x7c00 && tz_f32_to_f16(-1e9f) == 0xfc00 &&
         tz_f32_to_f16(ldexpf(1, -24)) == 0x0001 && tz_f32_to_f16(ldexpf(1, -25)) == 0x0000 &&
         tz_f32_to_f16(ldexpf(1, -25) * 1.0000001f) == 0x0001 &&
         tz_f32_to_f16(3 * ldexpf(1, -25)) == 0x0002 &&
         tz_f32_to_f16(ldexpf(1, -14) - ldexpf(1, -25)) == 0x0400 &&
         tz_f32_to_f16(1.0f + ldexpf(1, -11)) == 0x3c00 &&
         tz_f32_to_f16(1.0f + 3 * ldexpf(1, -11)) == 0x3c02 && tz_f32_to_f16(-0.0f) == 0x8000;
    check(ok, "f32 -> f16 special points (max, overflow, subnormal ties, carry into normal)");

    /* f16 round to nearest even against brute force on random floats in and around range */
    uint64_t s = 0x9E3779B97F4A7C15ull;
    int bad = 0;
    for (int i = 0; i < 1000000; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        uint32_t exp = 98 + (uint32_t)(s % 48); /* 2^-29 .. 2^18 */
        uint32_t bits = ((uint32_t)(s >> 20) & 0x807fffffu) | (exp << 23);
        float x = tz_f32_from_bits(bits);
        uint16_t r = tz_f32_to_f16(x);
        double ax = fabs((double)x);
        if (ax >= 65520.0) {
            bad += (r & 0x7fff) != 0x7c00;
            continue;
        }
        uint16_t m = r & 0x7fff;
        double v = f16_value(m), d = fabs(ax - v);
        double dl = m > 0 ? fabs(ax - f16_value((uint16_t)(m - 1))) : INFINITY;
        double du = m < 0x7bff ? fabs(ax - f16_value((uint16_t)(m + 1))) : INFINITY;
        if (d > dl || d > du || (d == dl && (m & 1)) || (d == du && (m & 1)) ||
            ((r & 0x8000) != 0) != (x < 0))
            bad++;
    }
    check(bad == 0, "f32 -> f16 is the nearest (ties even) on 1e6 random floats (%d bad)", bad);

    ok = 1;
    for (int i = 0; i < TZ_DT_COUNT; i++) {
        enum tz_dtype d;
        ok &= tz_dtype_from_name(tz_dtype_name((enum tz_dtype)i), &d) == 0 && d == (enum tz_dtype)i;
        ok &= tz_dtype_size((enum tz_dtype)i) > 0;
    }
    enum tz_dtype d;
    ok &= tz_dtype_from_name("F42", &d) != 0 && tz_dtype_size(TZ_DT_BF16) == 2 &&
          tz_dtype_size(TZ_DT_I64) == 8 && strcmp(tz_dtype_name(TZ_DT_BF16), "BF16") == 0;
    check(ok, "dtype names and sizes round trip");
}

static void test_bulk(void) {
    float src[5] = {1.0f, -2.5f, 65504.0f, ldexpf(1, -24), 3.140625f}, back[5];
    unsigned char raw[1 + 10];
    int ok = 1;
    /* odd destination address: the bulk converters must not assume alignment */
    ok &= tz_dtype_from_f32(TZ_DT_F16, src, raw + 1, 5) == 0;
    ok &= tz_dtype_to_f32(TZ_DT_F16, raw + 1, back, 5) == 0 && memcmp(src, back, sizeof src) == 0;
    ok &= tz_dtype_from_f32(TZ_DT_BF16, src, raw + 1, 5) == 0;
    ok &= tz_dtype_to_f32(TZ_DT_BF16, raw + 1, back, 5) == 0;
    for (int i = 0; i < 5; i++) ok &= back[i] == tz_bf16_to_f32(tz_f32_to_bf16(src[i]));
    ok &= tz_dtype_to_f32(TZ_DT_I32, raw, back, 1) != 0;
    ok &= tz_dtype_from_f32(TZ_DT_I8, src, raw, 1) != 0;
    check(ok, "bulk converters: unaligned buffers, F16/BF16 exact, other dtypes refused");
}

int main(void) {
    test_conversions();
    test_bulk();
    printf("dtype: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
