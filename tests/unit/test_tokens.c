/* Token files: write/read round trip at each width, byte-level prep with and without a
 * validation split, and each malformed file rejected with a message naming it. Also the
 * data windows: the permutation covers every window once per epoch and is seeded. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/tokens.h"
#include "train/data.h"
#include "tz_check.h"


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

    uint8_t v2[4] = {2, 0, 0, 0}, w3[4] = {3, 0, 0, 0}, many[8] = {0xff, 0xff, 0, 0, 0, 0, 0, 0};
    uint8_t small_vocab[4] = {5, 0, 0, 0};
    check(try_bad(path, 0, "XXTOKENS", 8, 0, "bad magic"), "bad magic");
    check(try_bad(path, 8, v2, 4, 0, "version 2"), "bad version");
    check(try_bad(path, 12, w3, 4, 0, "token width 3"), "bad width");
    check(try_bad(path, 24, many, 8, 0, "header says"), "count larger than the file");
    check(try_bad(path, 0, NULL, 0, 70, "header says"), "truncated tokens");
    check(try_bad(path, 0, NULL, 0, 30, "not a token file"), "truncated header");
    check(try_bad(path, 16, small_vocab, 4, 0, "not below the vocab size 5"), "token >= vocab");

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
    unlink(path); unlink(txt); unlink(tr); unlink(va);
    MPI_Finalize();
    return tz_check_done("tokens");
}
