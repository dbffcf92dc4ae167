/* Token files v1 and v2 (io/tokens.c): the input is opened as a token file; one that opens has
 * every token read (each below the vocab size) and every loss-mask bit looked at. */
#include "fuzz_common.h"
#include "io/tokens.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[600], err[1024] = "";
    fz_file(path, "data.tok", data, size);
    tz_tokens t;
    if (tz_tokens_open(&t, path, err, sizeof err)) {
        fz_rejected(err, path);
        return 0;
    }
    int32_t buf[256];
    int64_t trained = 0;
    for (int64_t i = 0; i < t.count; i += 256) {
        int64_t n = t.count - i < 256 ? t.count - i : 256;
        tz_tokens_read(&t, i, n, buf);
        for (int64_t j = 0; j < n; j++) {
            FZ_ASSERT(buf[j] >= 0 && (uint32_t)buf[j] < t.vocab, "token %lld is %d, vocab %u",
                      (long long)(i + j), buf[j], t.vocab);
            trained += tz_tokens_trained(&t, i + j);
        }
    }
    FZ_ASSERT(trained <= t.count, "%lld trained of %lld", (long long)trained, (long long)t.count);
    tz_tokens_close(&t);
    return 0;
}
