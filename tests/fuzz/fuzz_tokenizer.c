/* tokenizer.json (io/tokenizer.c): the input is loaded as a tokenizer; one that loads encodes
 * fixed texts and the start of the input itself (with and without special tokens), decodes
 * what it got and every id near the ends of its id space, and looks up a few pieces. */
#include "fuzz_common.h"
#include "io/tokenizer.h"

static const char *const texts[] = {
    "Hello world",
    " it's  DON'T we'll 123456 3.14\t(x) foo_bar\r\n\n  ",
    ("<|begin_of_text|>h\xc3\xa9llo \xe2\x96\x81w\xc3\xb6rld \xe6\x97\xa5\xe6\x9c\xac "
     "\xf0\x9f\x99\x82<|eot_id|><s></s>"),
    "\xff\xfe bad \xc3 utf-8 \xed\xa0\x80 \xf4\x90\x80\x80",
    /* NFC's slow path (Qwen's normalizer): marks out of order, a blocked mark, Hangul jamo,
     * a singleton, a mark first, a lone lead byte after a mark */
    "e\xcc\x81 q\xcc\x87\xcc\xa3 a\xcc\x80\xcc\x81 \xe1\x84\x8f\xe1\x85\xa1\xe1\x86\xae "
    "\xef\xa4\x80 \xcc\x81x \xcc\x81\xcc",
    "",
};

static void use(const tz_tokenizer *t, const char *s, size_t n) {
    int32_t ids[512];
    char buf[4096], err[512];
    for (int specials = 0; specials < 2; specials++) {
        int64_t need = 0;
        int64_t k = tz_tokenizer_encode(t, s, n, specials, ids, 512, &need, err, sizeof err);
        FZ_ASSERT(k < 0 || (k <= 512 && k <= need), "encode returned %lld of %lld", (long long)k,
                  (long long)need);
        for (int skip = 0; k >= 0 && skip < 2; skip++) {
            int64_t m = tz_tokenizer_decode(t, ids, k, skip, buf, sizeof buf);
            FZ_ASSERT(m >= 0 && (size_t)m < sizeof buf, "decode of encoded ids returned %lld",
                      (long long)m);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[600], err[1024] = "";
    fz_file(path, "tokenizer.json", data, size);
    tz_tokenizer *t = tz_tokenizer_load(path, err, sizeof err);
    if (!t) {
        fz_rejected(err, path);
        return 0;
    }
    int64_t v = tz_tokenizer_vocab(t);
    FZ_ASSERT(v > 0, "vocab %lld", (long long)v);
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) use(t, texts[i], strlen(texts[i]));
    use(t, (const char *)data, size < 2048 ? size : 2048);
    int32_t ids[] = {0, 1, 2, (int32_t)(v / 2), (int32_t)(v - 2), (int32_t)(v - 1)};
    char buf[256];
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
        if (ids[i] >= 0 && ids[i] < v) tz_tokenizer_decode(t, &ids[i], 1, 0, buf, sizeof buf);
    int32_t bad[] = {-1, (int32_t)v};
    FZ_ASSERT(tz_tokenizer_decode(t, &bad[0], 1, 0, buf, sizeof buf) < 0, "id -1 decoded");
    FZ_ASSERT(tz_tokenizer_decode(t, &bad[1], 1, 0, buf, sizeof buf) < 0, "id vocab decoded");
    tz_tokenizer_find(t, "<|eot_id|>");
    tz_tokenizer_find(t, "\xe2\x96\x81");
    tz_tokenizer_find(t, "hello");
    int32_t bos = tz_tokenizer_bos(t), eos = tz_tokenizer_eos(t);
    FZ_ASSERT(bos < v && eos < v, "bos %d eos %d vocab %lld", bos, eos, (long long)v);
    tz_tokenizer_free(t);
    return 0;
}
