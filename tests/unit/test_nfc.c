/* io/nfc.c, the NFC normalizer of tokenizer.json: fixed cases that name the rules (Hangul
 * composition, canonical ordering, blocking, composition exclusions, singletons, bytes that are
 * not UTF-8, text already in NFC returned as it is), then, with a file argument, every line of
 * tests/tokenizer/nfc_cases.py's output (input and expected output as hex, made by Python's
 * unicodedata) compared byte for byte. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/nfc.h"
#include "tz_check.h"

static uint8_t *g_buf;
static size_t g_cap;

static void expect(const char *what, const char *in, const char *want) {
    size_t len;
    const uint8_t *o = tz_nfc((const uint8_t *)in, strlen(in), &g_buf, &g_cap, &len);
    int ok = len == strlen(want) && !memcmp(o, want, len);
    check(ok, "nfc %s", what);
}

static int unhex(const char *h, uint8_t *out, size_t cap) {
    size_t n = strlen(h);
    if (n % 2 || n / 2 > cap) return -1;
    for (size_t i = 0; i < n / 2; i++) {
        unsigned v;
        if (sscanf(h + 2 * i, "%2x", &v) != 1) return -1;
        out[i] = (uint8_t)v;
    }
    return (int)(n / 2);
}

int main(int argc, char **argv) {
    const char *ascii = "plain text, 123";
    size_t len;
    check(tz_nfc((const uint8_t *)ascii, strlen(ascii), &g_buf, &g_cap, &len) ==
              (const uint8_t *)ascii && len == strlen(ascii),
          "nfc: text below U+0300 returned as it is");
    expect("e + acute -> U+00E9", "e\xcc\x81", "\xc3\xa9");
    expect("precomposed U+00E9 kept", "\xc3\xa9", "\xc3\xa9");
    expect("Hangul L V T -> U+CE7B", "\xe1\x84\x8f\xe1\x85\xa1\xe1\x86\xae", "\xec\xb9\xbb");
    expect("Hangul LV + T -> LVT", "\xea\xb0\x80\xe1\x86\xa8", "\xea\xb0\x81");
    /* q + dot below (220) + dot above (230) in either order: one order after sorting */
    expect("marks reordered by class", "q\xcc\x87\xcc\xa3", "q\xcc\xa3\xcc\x87");
    /* a + grave (230) + acute (230): the acute is blocked by the grave of the same class */
    expect("blocked: a + grave + acute -> U+00E0 + acute", "a\xcc\x80\xcc\x81",
           "\xc3\xa0\xcc\x81");
    /* U+0958 (a composition exclusion) stays decomposed */
    expect("exclusion U+0958 -> U+0915 U+093C", "\xe0\xa5\x98", "\xe0\xa4\x95\xe0\xa4\xbc");
    /* U+212B ANGSTROM SIGN (a singleton) -> U+00C5 */
    expect("singleton U+212B -> U+00C5", "\xe2\x84\xab", "\xc3\x85");
    /* CJK compatibility ideograph U+F900 -> U+8C48 */
    expect("U+F900 -> U+8C48", "\xef\xa4\x80", "\xe8\xb1\x88");
    expect("bytes that are not UTF-8 kept", "\xff" "e\xcc\x81" "\xcc", "\xff\xc3\xa9\xcc");
    if (argc > 1) {
        FILE *f = fopen(argv[1], "r");
        if (!f) {
            check(0, "cannot open %s", argv[1]);
            return tz_check_done("test_nfc");
        }
        char hin[512], hout[512];
        uint8_t in[256], want[256];
        long n = 0, bad = 0;
        while (fscanf(f, "%511s %511s", hin, hout) == 2) {
            int ni = unhex(hin, in, sizeof in), nw = unhex(hout, want, sizeof want);
            if (ni < 0 || nw < 0) {
                bad++;
                continue;
            }
            const uint8_t *o = tz_nfc(in, (size_t)ni, &g_buf, &g_cap, &len);
            if (len != (size_t)nw || memcmp(o, want, len)) {
                if (bad < 5) printf("     differs: %s -> want %s\n", hin, hout);
                bad++;
            }
            n++;
        }
        fclose(f);
        check(n > 1000 && bad == 0, "nfc: %ld cases against Python's unicodedata, %ld differ", n,
              bad);
    }
    free(g_buf);
    return tz_check_done("test_nfc");
}
