/* Token files: write/read round trip at each width, version 2 with a loss mask, byte-level prep with and without a
 * validation split, and each malformed file rejected with a message naming it. Also the
 * data windows: the permutation covers every window once per epoch and is seeded. */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comm/world.h"
#include "io/tokens.h"
#include "train/data.h"
#include "tz_check.h"

/* A reader that waits on a FIFO instead of refusing it fails the test (no hang). */
static void on_alarm(int sig) {
    static const char m[] = "FAIL a FIFO was waited on: no error within 20 s\n";
    (void)sig;
    if (write(1, m, sizeof m - 1) < 0) _exit(2);
    _exit(1);
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    fwrite(p, 1, n, f);
    fclose(f);
}

/* A valid 1-byte file of n tokens, then `patch` applied at offset off. */
static int try_bad(const char *path, size_t off, const void *patch, size_t plen, size_t trunc,
                   const char *want) {
    uint32_t tok[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    char err[512];
    tz_tokens_write(path, tok, 10, 256, err, sizeof err);
    FILE *f = fopen(path, "rb");
    unsigned char buf[128];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    if (patch) memcpy(buf + off, patch, plen);
    write_bytes(path, buf, trunc ? trunc : n);
    tz_tokens t;
    int rc = tz_tokens_open(&t, path, err, sizeof err);
    int ok = rc != 0 && strstr(err, path) && strstr(err, want);
    if (!ok) printf("  got rc %d, message: %s\n", rc, rc ? err : "(none)");
    if (!rc) tz_tokens_close(&t);
    return ok;
}

int main(int argc, char **argv) {
    tz_mpi_singleton_defaults();
    MPI_Init(&argc, &argv);
    char path[64], err[512];
    snprintf(path, sizeof path, "tok_%d.tok", (int)getpid());
    uint32_t vocabs[3] = {200, 50000, 100000};
    for (int k = 0; k < 3; k++) {
        uint32_t tok[1000];
        for (int i = 0; i < 1000; i++) tok[i] = (uint32_t)(i * 7919) % vocabs[k];
        check(tz_tokens_write(path, tok, 1000, vocabs[k], err, sizeof err) == 0, "write: %s", err);
        tz_tokens t;
        check(tz_tokens_open(&t, path, err, sizeof err) == 0, "open: %s", err);
        int same = t.count == 1000 && t.vocab == vocabs[k] && t.width == (k == 0 ? 1u : k == 1 ? 2u : 4u);
        for (int i = 0; i < 1000 && same; i++) same = tz_tokens_at(&t, i) == (int32_t)tok[i];
        check(same, "round trip at vocab %u", vocabs[k]);
        tz_tokens_close(&t);
    }
    uint32_t big[2] = {3, 300};
    check(tz_tokens_write(path, big, 2, 256, err, sizeof err) != 0 && strstr(err, "not below"),
          "token >= vocab accepted by the writer");

    uint8_t v3[4] = {3, 0, 0, 0}, flag1[4] = {1, 0, 0, 0}, w3[4] = {3, 0, 0, 0}, many[8] = {0xff, 0xff, 0, 0, 0, 0, 0, 0};
    uint8_t small_vocab[4] = {5, 0, 0, 0};
    check(try_bad(path, 0, "XXTOKENS", 8, 0, "bad magic"), "bad magic");
    check(try_bad(path, 8, v3, 4, 0, "version 3"), "bad version");
    check(try_bad(path, 20, flag1, 4, 0, "unknown flags 0x1 for version 1"), "flags in version 1");
    check(try_bad(path, 12, w3, 4, 0, "token width 3"), "bad width");
    check(try_bad(path, 24, many, 8, 0, "header says"), "count larger than the file");
    check(try_bad(path, 0, NULL, 0, 70, "header says"), "truncated tokens");
    check(try_bad(path, 0, NULL, 0, 30, "not a token file"), "truncated header");
    check(try_bad(path, 16, small_vocab, 4, 0, "not below the vocab size 5"), "token >= vocab");
    /* 4-byte tokens are read as int32_t: a vocab above 2^31 - 1 (once unchecked, so a token of
     * 2^31 or more came out negative) */
    {
        uint32_t one[1] = {7};
        uint8_t huge[4] = {0xff, 0xff, 0xff, 0xff}, top[4] = {0x00, 0x00, 0x00, 0x80};
        tz_tokens_write(path, one, 1, 100000, err, sizeof err); /* 4 bytes a token */
        FILE *hf = fopen(path, "r+b");
        fseek(hf, 16, SEEK_SET), fwrite(huge, 1, 4, hf); /* vocab 2^32 - 1 */
        fseek(hf, 64, SEEK_SET), fwrite(top, 1, 4, hf);  /* token 2^31 */
        fclose(hf);
        tz_tokens ht;
        int rc = tz_tokens_open(&ht, path, err, sizeof err);
        check(rc != 0 && strstr(err, "vocab 4294967295, expected at most 2^31 - 1"),
              "a vocab of 2^32 - 1 is refused: %s", rc ? err : "opened");
        if (!rc) tz_tokens_close(&ht);
    }

    /* a FIFO (data.train, data.val) is refused, naming it, not waited on; so is one as the
     * text of prep */
    {
        char fifo[64];
        snprintf(fifo, sizeof fifo, "fifo_%d.tok", (int)getpid());
        signal(SIGALRM, on_alarm);
        alarm(20);
        tz_tokens ft;
        int rc = mkfifo(fifo, 0600) == 0 ? tz_tokens_open(&ft, fifo, err, sizeof err) : 0;
        check(rc != 0 && strstr(err, fifo) && strstr(err, "it is a FIFO, expected a regular file"),
              "a FIFO as token file: %s", rc ? err : "opened");
        rc = tz_tokens_prep_bytes(fifo, "never.tok", "never.val.tok", 0.0, err, sizeof err);
        check(rc != 0 && strstr(err, fifo) && strstr(err, "it is a FIFO"), "a FIFO as text: %s", err);
        alarm(0);
        unlink(fifo);
    }

    /* prep: 1000 bytes of text, 10% validation */
    char txt[64], tr[64], va[64];
    snprintf(txt, sizeof txt, "text_%d.txt", (int)getpid());
    snprintf(tr, sizeof tr, "train_%d.tok", (int)getpid());
    snprintf(va, sizeof va, "val_%d.tok", (int)getpid());
    char text[1000];
    for (int i = 0; i < 1000; i++) text[i] = (char)('a' + i % 26);
    write_bytes(txt, text, sizeof text);
    check(tz_tokens_prep_bytes(txt, tr, va, 0.1, err, sizeof err) == 0, "prep: %s", err);
    tz_tokens a, b;
    check(tz_tokens_open(&a, tr, err, sizeof err) == 0 && tz_tokens_open(&b, va, err, sizeof err) == 0,
          "prep output: %s", err);
    check(a.count == 900 && b.count == 100 && a.vocab == 256 && tz_tokens_at(&a, 0) == 'a' &&
              tz_tokens_at(&b, 0) == 'a' + 900 % 26,
          "prep split: %lld + %lld", (long long)a.count, (long long)b.count);

    /* windows: T = 10 over 900 tokens -> 89 windows; epoch permutation covers each once */
    tz_data d;
    tz_data_init(&d, &a, 10, 42);
    check(d.nwin == 89, "windows: %lld", (long long)d.nwin);
    int32_t in[890], tg[890];
    tz_data_batch(&d, 0, 89, in, tg);
    int seen[89] = {0}, okw = 1;
    for (int i = 0; i < 89; i++) /* row i is window perm[i]: inputs, then targets shifted by one */
        for (int t = 0; t < 10; t++)
            okw &= in[i * 10 + t] == tz_tokens_at(&a, d.order.perm[i] * 10 + t) &&
                   tg[i * 10 + t] == tz_tokens_at(&a, d.order.perm[i] * 10 + t + 1);
    for (int i = 0; i < 89; i++) seen[d.order.perm[i]]++;
    int once = 1;
    for (int i = 0; i < 89; i++) once &= seen[i] == 1;
    check(once && okw, "epoch permutation is not a permutation");
    int64_t p0[89];
    memcpy(p0, d.order.perm, sizeof p0);
    tz_data e;
    tz_data_init(&e, &a, 10, 42);
    tz_data_batch(&e, 0, 1, in, tg);
    check(!memcmp(p0, e.order.perm, sizeof p0), "same seed, different order");
    tz_data_batch(&e, 89, 1, in, tg); /* epoch 1 */
    check(memcmp(p0, e.order.perm, sizeof p0) != 0, "epoch 1 repeats epoch 0's order");
    tz_data_free(&d);
    tz_data_free(&e);
    tz_tokens_close(&a);
    tz_tokens_close(&b);

    /* version 2 with a loss mask: round trip, masked targets -1, the trained-target count */
    uint32_t mt[37];
    uint8_t mm[37];
    for (int i = 0; i < 37; i++) mt[i] = (uint32_t)(i * 13) % 300, mm[i] = (uint8_t)(i % 3 != 0);
    check(tz_tokens_write_masked(path, mt, mm, 37, 300, err, sizeof err) == 0, "masked write: %s", err);
    tz_tokens m;
    check(tz_tokens_open(&m, path, err, sizeof err) == 0, "masked open: %s", err);
    int mok = m.version == 2 && m.mask && m.count == 37 && m.width == 2;
    for (int i = 0; i < 37 && mok; i++) mok = tz_tokens_at(&m, i) == (int32_t)mt[i] && tz_tokens_trained(&m, i) == mm[i];
    check(mok, "masked round trip");
    tz_data md;
    tz_data_init(&md, &m, 6, 1); /* 6 windows of 6 */
    int64_t want = 0;
    int tok_ok = 1;
    for (int64_t w = 0; w < 6; w++) {
        int32_t mi[6], mtg[6];
        tz_data_window(&md, w, mi, mtg);
        for (int j = 0; j < 6; j++) {
            int64_t i = w * 6 + j + 1;
            tok_ok &= mi[j] == (int32_t)mt[i - 1] && mtg[j] == (mm[i] ? (int32_t)mt[i] : -1);
            want += mm[i];
        }
    }
    check(tok_ok, "masked window: targets not -1 exactly where the mask is clear");
    check(tz_data_terms(&md, 0, 6, 1) == want && tz_data_terms(&md, 0, 6, 0) == want,
          "trained targets %lld, expected %lld", (long long)tz_data_terms(&md, 0, 6, 1), (long long)want);
    tz_data_free(&md);
    tz_tokens_close(&m);
    /* a mask that does not match the count */
    FILE *f = fopen(path, "ab");
    fputc(0, f);
    fclose(f);
    check(tz_tokens_open(&m, path, err, sizeof err) != 0 && strstr(err, "and a loss mask"),
          "mask of the wrong size accepted");

    /* the tokenizer's digest at offset 32: written by write_tagged, 0 from the older writers */
    check(tz_tokens_write_tagged(path, mt, NULL, 37, 300, 0x1234567890abcdefull, err, sizeof err) == 0,
          "tagged write: %s", err);
    check(tz_tokens_open(&m, path, err, sizeof err) == 0 && m.tokenizer == 0x1234567890abcdefull &&
              m.version == 1, "tagged round trip");
    tz_tokens_close(&m);
    check(tz_tokens_write(path, mt, 37, 300, err, sizeof err) == 0 &&
              tz_tokens_open(&m, path, err, sizeof err) == 0 && m.tokenizer == 0,
          "untagged file: digest 0");
    tz_tokens_close(&m);
    unlink(path); unlink(txt); unlink(tr); unlink(va);
    MPI_Finalize();
    return tz_check_done("tokens");
}
