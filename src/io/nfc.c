/* NFC of UTF-8 text (io/nfc.h): decode, canonical decomposition (tables and the Hangul
 * algorithm), canonical ordering of each run of non-zero combining classes, canonical
 * composition with the starter rule of UAX #15, encode. */
#include "io/nfc.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/unicode_nfc.h"

enum { SB = 0xAC00, LB = 0x1100, VB = 0x1161, TB = 0x11A7, LC = 19, VC = 21, TC = 28 };
enum { NC = VC * TC, SC = LC * NC };
#define RAW 0x80000000u /* a byte that is not UTF-8, kept as it is */
#define MAXD (TZ_NFC_MAXDEC > 3 ? TZ_NFC_MAXDEC : 3)

static int ccc_of(uint32_t c) {
    if (c < TZ_NFC_QUICK || (c & RAW)) return 0;
    int lo = 0, hi = TZ_NFC_NCCC - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (c < tz_nfc_ccc[mid][0]) hi = mid - 1;
        else if (c > tz_nfc_ccc[mid][1]) lo = mid + 1;
        else return (int)tz_nfc_ccc[mid][2];
    }
    return 0;
}

static const uint32_t *dec_of(uint32_t c, uint32_t *len) {
    int lo = 0, hi = TZ_NFC_NDEC - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (c < tz_nfc_dec[mid][0]) hi = mid - 1;
        else if (c > tz_nfc_dec[mid][0]) lo = mid + 1;
        else {
            *len = tz_nfc_dec[mid][2];
            return tz_nfc_pool + tz_nfc_dec[mid][1];
        }
    }
    return NULL;
}

/* The primary composite of a + b, or 0. */
static uint32_t compose(uint32_t a, uint32_t b) {
    if (a >= LB && a < LB + LC && b >= VB && b < VB + VC)
        return SB + ((a - LB) * VC + (b - VB)) * TC;
    if (a >= SB && a < SB + SC && (a - SB) % TC == 0 && b > TB && b < TB + TC) return a + (b - TB);
    int lo = 0, hi = TZ_NFC_NCOMP - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        const uint32_t *e = tz_nfc_comp[mid];
        if (a < e[0] || (a == e[0] && b < e[1])) hi = mid - 1;
        else if (a > e[0] || b > e[1]) lo = mid + 1;
        else return e[2];
    }
    return 0;
}

/* The code point at s[i] and its length k (1 and RAW | byte for a byte that is not UTF-8). */
static uint32_t utf8_at(const uint8_t *s, size_t n, size_t i, size_t *k) {
    const uint8_t c = s[i];
    *k = 1;
    if (c < 0x80) return c;
    size_t need = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 && c < 0xE0 ? 2 : 0;
    if (!need || c > 0xF4 || i + need > n) return RAW | c;
    uint32_t v = c & (need == 2 ? 0x1F : need == 3 ? 0x0F : 0x07);
    for (size_t j = 1; j < need; j++) {
        if ((s[i + j] & 0xC0) != 0x80) return RAW | c;
        v = v << 6 | (s[i + j] & 0x3F);
    }
    if ((need == 3 && (v < 0x800 || (v >= 0xD800 && v < 0xE000))) ||
        (need == 4 && (v < 0x10000 || v > 0x10FFFF)))
        return RAW | c;
    *k = need;
    return v;
}

static size_t utf8_put(uint8_t *d, uint32_t c) {
    if (c & RAW) return d[0] = (uint8_t)c, 1;
    if (c < 0x80) return d[0] = (uint8_t)c, 1;
    if (c < 0x800) return d[0] = (uint8_t)(0xC0 | c >> 6), d[1] = (uint8_t)(0x80 | (c & 0x3F)), 2;
    if (c < 0x10000) {
        d[0] = (uint8_t)(0xE0 | c >> 12), d[1] = (uint8_t)(0x80 | (c >> 6 & 0x3F));
        d[2] = (uint8_t)(0x80 | (c & 0x3F));
        return 3;
    }
    d[0] = (uint8_t)(0xF0 | c >> 18), d[1] = (uint8_t)(0x80 | (c >> 12 & 0x3F));
    d[2] = (uint8_t)(0x80 | (c >> 6 & 0x3F)), d[3] = (uint8_t)(0x80 | (c & 0x3F));
    return 4;
}

const uint8_t *tz_nfc(const uint8_t *s, size_t n, uint8_t **out, size_t *cap, size_t *len) {
    size_t i = 0;
    while (i < n && s[i] < 0xCC) i++; /* U+0300 is 0xCC 0x80: below it, NFC as it is */
    if (i == n) {
        *len = n;
        return s;
    }
    /* decomposed: at most MAXD code points per character (a table's longest, Hangul's 3) */
    size_t m = 0, ccap = n + 16;
    uint32_t *cp = tz_xmalloc(ccap * sizeof *cp);
    for (size_t j = 0, k; j < n; j += k) {
        const uint32_t c = utf8_at(s, n, j, &k);
        if (m + MAXD > ccap) cp = tz_xrealloc(cp, (ccap = 2 * ccap + MAXD) * sizeof *cp);
        uint32_t dl;
        const uint32_t *d;
        if (c >= SB && c < SB + SC) {
            const uint32_t x = c - SB;
            cp[m++] = LB + x / NC, cp[m++] = VB + x % NC / TC;
            if (x % TC) cp[m++] = TB + x % TC;
        } else if (!(c & RAW) && c >= 0xC0 && (d = dec_of(c, &dl))) { /* U+00C0: the first */
            memcpy(cp + m, d, dl * sizeof *d), m += dl;
        } else {
            cp[m++] = c;
        }
    }
    /* canonical ordering: a stable sort by class of every run of non-zero classes */
    for (size_t a = 0; a < m;) {
        if (!ccc_of(cp[a])) {
            a++;
            continue;
        }
        size_t b = a;
        while (b < m && ccc_of(cp[b])) b++;
        for (size_t x = a + 1; x < b; x++) /* insertion sort: runs are short */
            for (size_t y = x; y > a && ccc_of(cp[y - 1]) > ccc_of(cp[y]); y--) {
                uint32_t t = cp[y];
                cp[y] = cp[y - 1], cp[y - 1] = t;
            }
        a = b;
    }
    /* composition: c joins the last starter when adjacent to it, or when every character
     * between them has a class, the last (the largest) below c's */
    size_t w = 0, starter = (size_t)-1;
    int prev = 0; /* the class of the last character kept after the starter */
    for (size_t r = 0; r < m; r++) {
        const uint32_t c = cp[r];
        const int cc = ccc_of(c);
        if (starter != (size_t)-1 && !(c & RAW) &&
            (w - 1 == starter || (prev != 0 && prev < cc))) {
            const uint32_t x = compose(cp[starter], c);
            if (x) {
                cp[starter] = x;
                continue;
            }
        }
        if (cc == 0) starter = w, prev = 0;
        else prev = cc;
        cp[w++] = c;
    }
    if (*cap < 4 * w + 1) *out = tz_xrealloc(*out, *cap = 4 * w + 1);
    size_t o = 0;
    for (size_t r = 0; r < w; r++) o += utf8_put(*out + o, cp[r]);
    free(cp);
    *len = o;
    return *out;
}
