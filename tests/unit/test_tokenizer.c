/* Tokenizers on tiny hand-made tokenizer.json files, with expected ids worked out by hand:
 * byte-level BPE (GPT-2 pre-tokenizer, byte-to-unicode map, merges by rank, an added special
 * token, BOS/EOS from tokenizer_config.json) and SentencePiece-style BPE ("▁", byte fallback);
 * decode, round trips, the "bytes" tokenizer, and refusals. The real Llama tokenizers are
 * tested in tests/tokenizer/. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/prep.h"
#include "io/tokenizer.h"
#include "tz_check.h"

static char dir[64];

static void put(const char *name, const char *text) {
    char p[128];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    fputs(text, f);
    fclose(f);
}

/* GPT-2's byte-to-unicode map (printable bytes stand for themselves, the rest 256 + k). */
static unsigned bmap(int b) {
    int k = 0;
    for (int c = 0; c < 256; c++) {
        int keep = (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255);
        if (c == b) return keep ? (unsigned)c : 256u + (unsigned)k;
        if (!keep) k++;
    }
    return 0;
}

static int enc(tz_tokenizer *t, const char *s, int specials, const int32_t *want, int n) {
    int32_t out[64];
    int64_t need;
    char err[256];
    int64_t k = tz_tokenizer_encode(t, s, strlen(s), specials, out, 64, &need, err, sizeof err);
    int ok = k == n && need == n;
    for (int i = 0; ok && i < n; i++) ok = out[i] == want[i];
    if (!ok) {
        printf("  encode \"%s\": got", s);
        for (int64_t i = 0; i < k; i++) printf(" %d", out[i]);
        printf(" (expected %d ids)\n", n);
    }
    return ok;
}

/* A reader that waits on a FIFO instead of refusing it fails the test (no hang). */
static void on_alarm(int sig) {
    static const char m[] = "FAIL a FIFO was waited on: no error within 20 s\n";
    (void)sig;
    if (write(1, m, sizeof m - 1) < 0) _exit(2);
    _exit(1);
}

/* Loads dir/name (written from text when text is not NULL): refused, the message holding want. */
static int refused(const char *name, const char *text, const char *want) {
    char p[128], err[512] = "";
    snprintf(p, sizeof p, "%s/%s", dir, name);
    if (text) put(name, text);
    tz_tokenizer *t = tz_tokenizer_load(p, err, sizeof err);
    tz_tokenizer_free(t);
    if (text) unlink(p);
    if (!t && strstr(err, want)) return 1;
    printf("  %s: %s (expected a refusal with \"%s\")\n", name, t ? "loaded" : err, want);
    return 0;
}

static int round_trip(tz_tokenizer *t, const char *s) {
    int32_t out[256];
    int64_t need;
    char err[256], back[512];
    int64_t k = tz_tokenizer_encode(t, s, strlen(s), 1, out, 256, &need, err, sizeof err);
    int64_t m = k < 0 ? -1 : tz_tokenizer_decode(t, out, k, 0, back, sizeof back);
    int ok = m == (int64_t)strlen(s) && !memcmp(back, s, strlen(s));
    if (!ok) printf("  round trip \"%s\" -> \"%s\"\n", s, m >= 0 ? back : "(error)");
    return ok;
}

int main(void) {
    snprintf(dir, sizeof dir, "tokdir_%d", (int)getpid());
    mkdir(dir, 0755);
    char err[512];

    /* byte-level: ids 0..255 are the bytes, then he, ll, hell, hello, "Ġw" (" w") */
    char *j = malloc(1 << 16);
    int n = sprintf(j, "{\"model\": {\"type\": \"BPE\", \"vocab\": {");
    for (int b = 0; b < 256; b++) {
        unsigned c = bmap(b);
        if (c == '"' || c == '\\') n += sprintf(j + n, "\"\\%c\": %d, ", (char)c, b);
        else n += sprintf(j + n, "\"\\u%04x\": %d, ", c, b);
    }
    n += sprintf(j + n, "\"he\": 256, \"ll\": 257, \"hell\": 258, \"hello\": 259, \"\\u0120w\": 260},"
                        " \"merges\": [\"h e\", \"l l\", \"he ll\", \"hell o\", \"\\u0120 w\"]},"
                        " \"added_tokens\": [{\"id\": 300, \"content\": \"<|x|>\", \"special\": true}],"
                        " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false,"
                        " \"use_regex\": true}, \"decoder\": {\"type\": \"ByteLevel\"}}");
    put("tokenizer.json", j);
    put("tokenizer_config.json", "{\"bos_token\": {\"content\": \"<|x|>\"}, \"eos_token\": \"hello\", "
                                 "\"model_max_length\": 1000000000000000019884624838656}");
    tz_tokenizer *t = tz_tokenizer_load(dir, err, sizeof err);
    check(t != NULL, "byte-level load: %s", err);
    if (t) {
        check(tz_tokenizer_vocab(t) == 301 && tz_tokenizer_bos(t) == 300 && tz_tokenizer_eos(t) == 259,
              "vocab %lld bos %d eos %d", (long long)tz_tokenizer_vocab(t), tz_tokenizer_bos(t),
              tz_tokenizer_eos(t));
        /* "hello" -> h e l l o -> he l l o -> he ll o -> hell o -> hello; " world" -> Ġw o r l d */
        check(enc(t, "hello world", 0, (int32_t[]){259, 260, 'o', 'r', 'l', 'd'}, 6), "hello world");
        /* "hell" stays one piece; "llo" -> ll o */
        check(enc(t, "hell llo", 0, (int32_t[]){258, ' ', 257, 'o'}, 4), "hell llo");
        /* the pre-tokenizer keeps "he" and "llo" apart across the digit */
        check(enc(t, "he1llo", 0, (int32_t[]){256, '1', 257, 'o'}, 4), "he1llo");
        check(enc(t, "<|x|>hello", 1, (int32_t[]){300, 259}, 2), "special recognised");
        check(enc(t, "<|x|>", 0, (int32_t[]){'<', '|', 'x', '|', '>'}, 5), "special as text");
        check(enc(t, "\xc3\xa9", 0, (int32_t[]){0xc3, 0xa9}, 2), "two-byte character as bytes");
        const char *rt[] = {"hello world", "  two  spaces\n\n", "caf\xc3\xa9 \xf0\x9f\x99\x82 \xe6\x97\xa5",
                            "<|x|>he said 'hello'<|x|>", "\t\r\n 123 4567", ""};
        for (int i = 0; i < 6; i++) check(round_trip(t, rt[i]), "round trip %d", i);
        char buf[64];
        check(tz_tokenizer_decode(t, (int32_t[]){300, 259}, 2, 1, buf, sizeof buf) == 5 &&
                  !strcmp(buf, "hello"), "skip_special: %s", buf);
        check(tz_tokenizer_decode(t, (int32_t[]){301}, 1, 0, buf, sizeof buf) == -1, "id out of range");
        check(tz_tokenizer_decode(t, (int32_t[]){259, 259}, 2, 0, buf, 4) == 3 && !strcmp(buf, "hel"),
              "decode truncates to cap");
        int32_t few[2];
        int64_t need;
        check(tz_tokenizer_encode(t, "hello world", 11, 0, few, 2, &need, err, sizeof err) == 2 &&
                  need == 6 && few[0] == 259, "cap: written 2, needed %lld", (long long)need);
        tz_tokenizer_free(t);
    }

    /* SentencePiece-style: <unk> 0, <s> 1, </s> 2, bytes 3..258, then ▁ h e l ▁h ▁he ▁hel */
    n = sprintf(j, "{\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\","
                   " \"prepend\": \"\\u2581\"}, {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"},"
                   " \"content\": \"\\u2581\"}]}, \"pre_tokenizer\": null, \"decoder\": {\"type\":"
                   " \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": {\"String\":"
                   " \"\\u2581\"}, \"content\": \" \"}, {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"},"
                   " {\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]},"
                   " \"added_tokens\": [{\"id\": 1, \"content\": \"<s>\", \"special\": true}, {\"id\": 2,"
                   " \"content\": \"</s>\", \"special\": true}],"
                   " \"model\": {\"type\": \"BPE\", \"byte_fallback\": true, \"unk_token\": \"<unk>\","
                   " \"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"</s>\": 2, ");
    for (int b = 0; b < 256; b++) n += sprintf(j + n, "\"<0x%02X>\": %d, ", b, 3 + b);
    sprintf(j + n, "\"\\u2581\": 259, \"h\": 260, \"e\": 261, \"l\": 262, \"\\u2581h\": 263,"
                   " \"\\u2581he\": 264, \"\\u2581hel\": 265}, \"merges\": [[\"\\u2581\", \"h\"],"
                   " [\"\\u2581h\", \"e\"], [\"\\u2581he\", \"l\"]]}}");
    put("spm.json", j);
    char p[128];
    snprintf(p, sizeof p, "%s/spm.json", dir);
    t = tz_tokenizer_load(p, err, sizeof err);
    check(t != NULL, "SentencePiece-style load: %s", err);
    if (t) {
        /* "hel hello" -> ▁hel▁hello: ▁hel | ▁hel l <0x6F> */
        check(enc(t, "hel hello", 0, (int32_t[]){265, 265, 262, 3 + 'o'}, 4), "hel hello");
        /* é is not in the vocabulary: its bytes */
        check(enc(t, "h\xc3\xa9", 0, (int32_t[]){263, 3 + 0xc3, 3 + 0xa9}, 3), "byte fallback");
        check(enc(t, "<s>he", 1, (int32_t[]){1, 264}, 2), "special, then ▁ before the next segment");
        const char *rt[] = {"hello", "h  e\n\nl", "caf\xc3\xa9 \xf0\x9f\x99\x82", "x  "};
        for (int i = 0; i < 4; i++) check(round_trip(t, rt[i]), "SentencePiece round trip %d", i);
        tz_tokenizer_free(t);
    }

    /* refusals name the component */
    put("bad.json", "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}");
    snprintf(p, sizeof p, "%s/bad.json", dir);
    check(!tz_tokenizer_load(p, err, sizeof err) && strstr(err, "model type WordPiece"), "WordPiece: %s", err);
    check(!tz_tokenizer_load("no/such/dir", err, sizeof err) && strstr(err, "no/such/dir"), "missing: %s", err);

    /* every length from the file is bounded or sizes its buffer: a merge whose two pieces
     * total more than 32 KiB (once a heap overflow of a fixed buffer), as "left right" and as
     * a pair; a vocabulary entry of 16 KiB; ids beyond 2^24 (the id space is allocated whole) */
    {
        size_t big = 3 * 16384 + 100;
        char *m = malloc(2 * big + 4096);
        const char *spm = "{\"model\": {\"type\": \"BPE\", \"unk_token\": \"a\", \"vocab\": "
                          "{\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\", ";
        for (int form = 0; form < 2; form++) {
            int k = sprintf(m, "%s%s", spm, form ? "[\"" : "\"");
            memset(m + k, 'a', 15000), k += 15000;
            k += sprintf(m + k, "%s", form ? "\", \"" : " ");
            memset(m + k, 'b', big), k += (int)big;
            sprintf(m + k, "%s]}}", form ? "\"]" : "\"");
            check(refused("longmerge.json", m, "model.merges[1]"), "a merge of %zu bytes (%s) is refused",
                  15000 + big, form ? "a pair" : "\"left right\"");
        }
        int k = sprintf(m, "{\"model\": {\"type\": \"BPE\", \"unk_token\": \"a\", \"vocab\": {\"a\": 0, \"");
        memset(m + k, 'c', 16384), k += 16384;
        sprintf(m + k, "\": 1}, \"merges\": []}}");
        check(refused("longpiece.json", m, "expected less than 16 KiB"), "a 16 KiB vocabulary entry is refused");
        free(m);
        check(refused("bigid.json", "{\"model\": {\"type\": \"BPE\", \"unk_token\": \"a\", \"vocab\": "
                      "{\"a\": 16777216}, \"merges\": []}}", "2^24"), "an id of 2^24 is refused");
        check(refused("bigadded.json", "{\"model\": {\"type\": \"BPE\", \"unk_token\": \"a\", \"vocab\": "
                      "{\"a\": 0}, \"merges\": []}, \"added_tokens\": [{\"id\": 1073741823, "
                      "\"content\": \"x\"}]}", "added_tokens[0]"), "an added id of 2^30 - 1 is refused");
        put("sparse.json", "{\"model\": {\"type\": \"BPE\", \"unk_token\": \"a\", \"vocab\": "
                           "{\"a\": 0, \"b\": 16777215}, \"merges\": []}}");
        snprintf(p, sizeof p, "%s/sparse.json", dir);
        t = tz_tokenizer_load(p, err, sizeof err);
        check(t && tz_tokenizer_vocab(t) == 16777216 && enc(t, "ab", 0, (int32_t[]){0, 16777215}, 2),
              "ids up to 2^24 - 1 are read: %s", t ? "" : err);
        tz_tokenizer_free(t);
        unlink(p);
    }

    /* FIFOs are refused, naming the path, not waited on: as the tokenizer.json, and as the
     * tokenizer_config.json beside it */
    signal(SIGALRM, on_alarm);
    alarm(20);
    snprintf(p, sizeof p, "%s/fifo.json", dir);
    check(mkfifo(p, 0600) == 0 && refused("fifo.json", NULL, "fifo.json: not a regular file (a FIFO)"),
          "a FIFO as tokenizer.json is refused");
    unlink(p);
    {
        char sub[128], q[160];
        snprintf(sub, sizeof sub, "%s/fifodir", dir);
        mkdir(sub, 0755);
        snprintf(q, sizeof q, "%s/tokenizer.json", sub);
        FILE *f = fopen(q, "w");
        if (f) fputs("{\"model\": {\"type\": \"BPE\", \"unk_token\": \"a\", \"vocab\": {\"a\": 0}, "
                     "\"merges\": []}}", f), fclose(f);
        snprintf(q, sizeof q, "%s/tokenizer_config.json", sub);
        mkfifo(q, 0600);
        tz_tokenizer *ft = tz_tokenizer_load(sub, err, sizeof err);
        check(!ft && strstr(err, "tokenizer_config.json: not a regular file (a FIFO)"),
              "a FIFO as tokenizer_config.json is refused: %s", ft ? "loaded" : err);
        tz_tokenizer_free(ft);
        unlink(q);
        snprintf(q, sizeof q, "%s/tokenizer.json", sub);
        unlink(q);
        rmdir(sub);
    }

    /* prep jsonl: "messages" that is not a list of 1 to 256 objects is refused by what it is
     * (once a use after free: the message read the freed record), and a FIFO as data */
    {
        const char *bad[][2] = {
            {"{\"messages\": 5}", "got a number"},
            {"{\"messages\": 2.5}", "got a number"},
            {"{\"messages\": {\"role\": \"user\"}}", "got an object"},
            {"{\"messages\": \"hi\"}", "got a string"},
            {"{\"messages\": []}", "got an empty list"},
            {"{\"messages\": [5]}", "messages[0] is not an object"},
            {NULL, "got a list of 257"},
        };
        char in[128], out[128], val[128];
        snprintf(in, sizeof in, "%s/data.jsonl", dir);
        snprintf(out, sizeof out, "%s/data.tok", dir);
        snprintf(val, sizeof val, "%s/data.val.tok", dir);
        char *many = malloc(64 * 300);
        int k = sprintf(many, "{\"messages\": [");
        for (int i = 0; i < 257; i++)
            k += sprintf(many + k, "%s{\"role\": \"assistant\", \"content\": \"x\"}", i ? ", " : "");
        sprintf(many + k, "]}");
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            char line[64 * 300 + 64];
            snprintf(line, sizeof line, "{\"text\": \"ok\"}\n%s\n", bad[i][0] ? bad[i][0] : many);
            put("data.jsonl", line);
            int rc = tz_prep_jsonl("bytes", in, out, val, 0.0, "plain", err, sizeof err);
            check(rc != 0 && strstr(err, "data.jsonl:2: ") && strstr(err, bad[i][1]),
                  "prep jsonl %.40s: %s", bad[i][0] ? bad[i][0] : "257 messages", rc ? err : "accepted");
        }
        free(many);
        unlink(in);
        check(mkfifo(in, 0600) == 0 && tz_prep_jsonl("bytes", in, out, val, 0.0, "plain", err, sizeof err) != 0 &&
                  strstr(err, "data.jsonl: not a regular file (a FIFO)"),
              "prep jsonl of a FIFO is refused: %s", err);
        check(tz_prep_text("bytes", in, out, val, 0.0, err, sizeof err) != 0 &&
                  strstr(err, "data.jsonl: not a regular file (a FIFO)"),
              "prep text of a FIFO is refused: %s", err);
        unlink(in);
        unlink(out);
        unlink(val);
    }
    alarm(0);

    /* bytes */
    t = tz_tokenizer_load("bytes", err, sizeof err);
    check(t && tz_tokenizer_vocab(t) == 256 && tz_tokenizer_bos(t) == -1 && enc(t, "hi", 1, (int32_t[]){'h', 'i'}, 2),
          "bytes tokenizer");
    if (t) check(round_trip(t, "caf\xc3\xa9\n"), "bytes round trip");
    tz_tokenizer_free(t);

    free(j);
    const char *names[] = {"tokenizer.json", "tokenizer_config.json", "spm.json", "bad.json"};
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        unlink(p);
    }
    rmdir(dir);
    return tz_check_done("tokenizer");
}
