/* safetensors reader and writer: round trips (bit-identical), a sharded folder, and one
 * crafted malformed file per rejection rule, each checked by its message. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/dtype.h"
#include "io/safetensors.h"
#include "tz_check.h"
#include "tz_files.h"

static volatile unsigned g_sink; /* keeps the mutation test's reads */


#define TMP "st_tmp"

/* A reader that waits on a FIFO instead of refusing it fails the test (no hang). */
static void on_alarm(int sig) {
    static const char m[] = "FAIL a FIFO was waited on: no error within 20 s\n";
    (void)sig;
    if (write(1, m, sizeof m - 1) < 0) _exit(2);
    _exit(1);
}

static void write_bytes(const char *path, const void *buf, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, n, f) != n) {
        printf("cannot write %s: %s\n", path, strerror(errno));
        exit(1);
    }
    fclose(f);
}

/* A crafted file: declared header length, header text, then ndata bytes of 0xAB. */
static void write_crafted(const char *path, uint64_t declared, const char *hdr, size_t ndata) {
    size_t hl = strlen(hdr);
    unsigned char *b = (unsigned char *)malloc(8 + hl + ndata + 1);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(declared >> (8 * i));
    memcpy(b + 8, hdr, hl);
    memset(b + 8 + hl, 0xAB, ndata);
    write_bytes(path, b, 8 + hl + ndata);
    free(b);
}

static void write_hdr(const char *path, const char *hdr, size_t ndata) {
    write_crafted(path, strlen(hdr), hdr, ndata);
}

/* Opening path must fail, leave st empty, and the message must hold every substring. */
static void expect_reject(const char *what, const char *path, const char *s1, const char *s2,
                          const char *s3) {
    tz_safetensors st;
    char err[1024];
    int rc = tz_st_open(&st, path, err, sizeof err);
    int ok = rc != 0 && st.count == 0 && st.files == NULL && st.path == NULL;
    const char *subs[3] = {s1, s2, s3};
    for (int i = 0; i < 3; i++)
        if (subs[i] && !strstr(err, subs[i])) ok = 0;
    check(ok, "reject %-28s -> %s", what, rc ? err : "(accepted!)");
    if (rc == 0) tz_st_close(&st);
}

/* ---- round trip ---- */

static float g_f32[15], g_bf[24], g_h[7];
static uint16_t g_bf_bits[24], g_h_bits[7];
static int32_t g_i32[4] = {1, -2, 2147483647, (int32_t)0x80000000u};
static int8_t g_i8[5] = {-128, -1, 0, 1, 127};
static int64_t g_i64 = -1234567890123456789ll;

static void make_data(void) {
    for (int i = 0; i < 15; i++) g_f32[i] = (float)i * 0.37f - 2.0f;
    g_f32[3] = -0.0f;
    g_f32[4] = INFINITY;
    g_f32[5] = tz_f32_from_bits(0x7fc12345u); /* NaN with a payload */
    g_f32[6] = tz_f32_from_bits(0x00000001u); /* smallest subnormal */
    for (int i = 0; i < 24; i++) {
        g_bf_bits[i] = tz_f32_to_bf16((float)(i - 11) * 0.125f + 1e-3f * (float)i);
        g_bf[i] = tz_bf16_to_f32(g_bf_bits[i]);
    }
    const float h[7] = {0.0f, 1.0f, -2.5f, 65504.0f, ldexpf(1, -24), -ldexpf(3, -20), INFINITY};
    for (int i = 0; i < 7; i++) {
        g_h_bits[i] = tz_f32_to_f16(h[i]);
        g_h[i] = h[i];
    }
}

static int add(tz_st_writer *w, const char *name, enum tz_dtype dt, int ndim,
               const int64_t *shape, const void *data) {
    char err[512];
    int rc = tz_st_writer_add(w, name, dt, ndim, shape, data, err, sizeof err);
    if (rc) printf("add %s: %s\n", name, err);
    return rc;
}

static void test_roundtrip(void) {
    const char *path = TMP "/rt.safetensors";
    char err[1024];
    tz_st_writer w;
    tz_st_writer_init(&w);
    w.allow_nonfinite = 1; /* the reader's conversions of -0, Inf and NaN are tested below */
    const int64_t s_f32[2] = {3, 5}, s_bf[3] = {4, 2, 3}, s_h[1] = {7}, s_i32[2] = {2, 2},
                  s_empty[2] = {0, 4}, s_i8[1] = {5};
    int rc = add(&w, "model.embed.weight", TZ_DT_F32, 2, s_f32, g_f32) |
             add(&w, "b.bf16", TZ_DT_BF16, 3, s_bf, g_bf_bits) |
             add(&w, "c.f16", TZ_DT_F16, 1, s_h, g_h_bits) |
             add(&w, "d.i32", TZ_DT_I32, 2, s_i32, g_i32) |
             add(&w, "e.empty", TZ_DT_U8, 2, s_empty, NULL) |
             add(&w, "f.scalar", TZ_DT_I64, 0, NULL, &g_i64) |
             add(&w, "a.i8", TZ_DT_I8, 1, s_i8, g_i8);
    tz_st_writer_set_metadata(&w, "format", "pt");
    tz_st_writer_set_metadata(&w, "note", "old");
    tz_st_writer_set_metadata(&w, "note", "h\xc3\xa9llo \"quoted\"");
    rc |= tz_st_writer_save(&w, path, err, sizeof err);
    tz_st_writer_free(&w);
    struct stat sb;
    check(rc == 0 && stat(TMP "/rt.safetensors.tmp", &sb) != 0,
          "writer saves 7 tensors + metadata, no .tmp left behind%s%s", rc ? ": " : "",
          rc ? err : "");

    /* raw layout */
    FILE *f = fopen(path, "rb");
    unsigned char len8[8] = {0};
    size_t got = f ? fread(len8, 1, 8, f) : 0;
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)len8[i] << (8 * i);
    char *hdr = (char *)calloc(1, hlen + 1);
    got += f ? fread(hdr, 1, hlen, f) : 0;
    if (f) fclose(f);
    size_t data_bytes = 5 + 48 + 14 + 16 + 0 + 8 + 60;
    size_t end = hlen;
    while (end > 0 && hdr[end - 1] == ' ') end--;
    check(got == 8 + hlen && hlen % 8 == 0 && end > 0 && hdr[end - 1] == '}' && hlen - end < 8,
          "header length %llu is a multiple of 8, padded with spaces", (unsigned long long)hlen);
    /* layout order: 8-byte, 4-byte, 2-byte, 1-byte elements, by name within a size */
    const char *order[7] = {"\"f.scalar\"", "\"d.i32\"", "\"model.embed.weight\"", "\"b.bf16\"",
                            "\"c.f16\"", "\"a.i8\"", "\"e.empty\""};
    int in_order = strncmp(hdr, "{\"__metadata__\"", 15) == 0;
    for (int i = 1; i < 7; i++) {
        const char *p0 = strstr(hdr, order[i - 1]), *p1 = strstr(hdr, order[i]);
        in_order &= p0 && p1 && p0 < p1;
    }
    check(in_order, "header: metadata first, then element size descending, then name");
    stat(path, &sb);
    check((uint64_t)sb.st_size == 8 + hlen + data_bytes, "file is header + %zu data bytes",
          data_bytes);
    free(hdr);

    tz_safetensors st;
    rc = tz_st_open(&st, path, err, sizeof err);
    check(rc == 0 && st.count == 7 && st.nfiles == 1, "reader opens it: %s",
          rc ? err : "7 tensors");
    if (rc) return;
    int sorted = 1, aligned = 1;
    const char *base = (const char *)st.files[0].map + st.files[0].data_start, *next = base;
    for (int64_t i = 1; i < st.count; i++)
        sorted &= strcmp(st.tensors[i - 1].name, st.tensors[i].name) < 0;
    for (int k = 0; k < 7; k++) { /* walk the data section in header order */
        char nm[64];
        snprintf(nm, sizeof nm, "%.*s", (int)strlen(order[k]) - 2, order[k] + 1);
        const tz_st_tensor *t = tz_st_find(&st, nm);
        if (!t || (const char *)t->data != next) {
            aligned = 0;
            break;
        }
        aligned &= (size_t)((const char *)t->data - base) % tz_dtype_size(t->dtype) == 0;
        next += t->nbytes;
    }
    check(sorted && aligned && next == (const char *)st.files[0].map + st.files[0].size,
          "reader's table sorted by name; data back to back in header order, each tensor "
          "aligned to its element size, ending at the end of the file");
    const struct {
        const char *name;
        enum tz_dtype dt;
        int ndim;
        const int64_t *shape;
        const void *data;
        size_t nbytes;
    } want[] = {
        {"model.embed.weight", TZ_DT_F32, 2, s_f32, g_f32, 60},
        {"b.bf16", TZ_DT_BF16, 3, s_bf, g_bf_bits, 48},
        {"c.f16", TZ_DT_F16, 1, s_h, g_h_bits, 14},
        {"d.i32", TZ_DT_I32, 2, s_i32, g_i32, 16},
        {"e.empty", TZ_DT_U8, 2, s_empty, NULL, 0},
        {"f.scalar", TZ_DT_I64, 0, NULL, &g_i64, 8},
        {"a.i8", TZ_DT_I8, 1, s_i8, g_i8, 5},
    };
    int all = 1;
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        const tz_st_tensor *t = tz_st_find(&st, want[k].name);
        int ok = t && t->dtype == want[k].dt && t->ndim == want[k].ndim &&
                 t->nbytes == want[k].nbytes && strcmp(t->file, path) == 0 &&
                 (int64_t)t->nbytes == t->numel * (int64_t)tz_dtype_size(t->dtype);
        for (int i = 0; ok && i < want[k].ndim; i++) ok = t->shape[i] == want[k].shape[i];
        if (ok && want[k].nbytes) ok = memcmp(t->data, want[k].data, want[k].nbytes) == 0;
        if (!ok) printf("  mismatch in %s\n", want[k].name);
        all &= ok;
    }
    check(all, "every tensor: dtype, shape, numel, nbytes, file and bit-identical bytes");
    check(tz_st_find(&st, "nope") == NULL && tz_st_find(&st, "") == NULL,
          "find returns NULL for absent names");
    const char *fmt = tz_st_metadata(&st, "format"), *note = tz_st_metadata(&st, "note");
    check(fmt && strcmp(fmt, "pt") == 0 && note && strcmp(note, "h\xc3\xa9llo \"quoted\"") == 0 &&
              tz_st_metadata(&st, "absent") == NULL,
          "metadata read back (UTF-8, quotes, replaced value)");

    float out[24];
    rc = tz_st_read_f32(&st, "model.embed.weight", out, 2, s_f32, err, sizeof err);
    check(rc != 0 && strstr(err, "rt.safetensors") && strstr(err, "'model.embed.weight'") &&
              strstr(err, "non-finite"),
          "read_f32 refuses a tensor holding Inf or NaN: %s", rc ? err : "(accepted!)");
    const tz_st_tensor *te = tz_st_find(&st, "model.embed.weight");
    rc = tz_dtype_to_f32(te->dtype, te->data, out, te->numel);
    check(rc == 0 && memcmp(out, g_f32, sizeof g_f32) == 0,
          "F32 data: bit-identical (-0, inf, NaN payload, subnormal)");
    rc = tz_st_read_f32(&st, "b.bf16", out, 3, s_bf, err, sizeof err);
    check(rc == 0 && memcmp(out, g_bf, sizeof g_bf) == 0, "read_f32 BF16: exact");
    rc = tz_st_read_f32(&st, "c.f16", out, 1, s_h, err, sizeof err);
    check(rc != 0 && strstr(err, "'c.f16'") && strstr(err, "is Inf"),
          "read_f32 F16 refuses inf: %s", rc ? err : "(accepted!)");
    te = tz_st_find(&st, "c.f16");
    rc = tz_dtype_to_f32(te->dtype, te->data, out, te->numel);
    check(rc == 0 && memcmp(out, g_h, sizeof g_h) == 0, "F16 data: exact incl. subnormal, inf");
    const int64_t wrong[2] = {4, 6};
    rc = tz_st_read_f32(&st, "b.bf16", out, 2, wrong, err, sizeof err);
    check(rc && strstr(err, "rt.safetensors") && strstr(err, "'b.bf16'") &&
              strstr(err, "[4, 2, 3]") && strstr(err, "[4, 6]"),
          "read_f32 shape mismatch -> %s", err);
    rc = tz_st_read_f32(&st, "missing.weight", out, 2, wrong, err, sizeof err);
    check(rc && strstr(err, "rt.safetensors") && strstr(err, "'missing.weight'") &&
              strstr(err, "not found"), "read_f32 missing tensor -> %s", err);
    rc = tz_st_read_f32(&st, "d.i32", out, 2, s_i32, err, sizeof err);
    check(rc && strstr(err, "'d.i32'") && strstr(err, "I32"), "read_f32 I32 refused -> %s", err);
    tz_st_close(&st);
    check(st.count == 0 && st.files == NULL, "close leaves the struct empty");
}

static void test_writer_errors(void) {
    char err[512];
    tz_st_writer w;
    tz_st_writer_init(&w);
    const int64_t neg[1] = {-1}, two[1] = {2};
    float d[2] = {1, 2};
    int r1 = tz_st_writer_add(&w, "x", TZ_DT_F32, 1, neg, d, err, sizeof err);
    int r2 = tz_st_writer_add(&w, "__metadata__", TZ_DT_F32, 1, two, d, err, sizeof err);
    int r3 = tz_st_writer_add(&w, "x", TZ_DT_F32, 9, two, d, err, sizeof err);
    int r4 = tz_st_writer_add(&w, "x", TZ_DT_F32, 1, two, NULL, err, sizeof err);
    check(r1 && r2 && r3 && r4, "writer refuses negative dim, reserved name, 9 dims, NULL data");
    add(&w, "x", TZ_DT_F32, 1, two, d);
    add(&w, "x", TZ_DT_F32, 1, two, d);
    struct stat sb;
    int rc = tz_st_writer_save(&w, TMP "/dup_w.safetensors", err, sizeof err);
    check(rc && strstr(err, "'x'") && stat(TMP "/dup_w.safetensors", &sb) != 0 &&
              stat(TMP "/dup_w.safetensors.tmp", &sb) != 0,
          "writer refuses a duplicate name, writes nothing -> %s", err);
    tz_st_writer_free(&w);
    tz_st_writer_init(&w);
    add(&w, "x", TZ_DT_F32, 1, two, d);
    rc = tz_st_writer_save(&w, TMP "/no/such/dir/x.safetensors", err, sizeof err);
    check(rc && strstr(err, "x.safetensors"), "writer into a missing folder fails -> %s", err);
    {
        tz_st_writer wn;
        tz_st_writer_init(&wn);
        uint16_t hb[2] = {0x3f80, 0x7fc0}; /* 1, NaN (BF16) */
        add(&wn, "ok", TZ_DT_F32, 1, two, d);
        add(&wn, "bad.bf16", TZ_DT_BF16, 1, two, hb);
        rc = tz_st_writer_save(&wn, TMP "/nan_w.safetensors", err, sizeof err);
        check(rc && strstr(err, "nan_w.safetensors") && strstr(err, "'bad.bf16'") &&
                  strstr(err, "element 1 is NaN") && stat(TMP "/nan_w.safetensors", &sb) != 0,
              "writer refuses a NaN, writes nothing -> %s", err);
        tz_st_writer_free(&wn);
    }
    /* single-file folder: overwrite an existing file atomically, open by folder */
    mkdir(TMP "/single", 0755);
    write_bytes(TMP "/single/model.safetensors", "garbage", 7);
    rc = tz_st_writer_save(&w, TMP "/single/model.safetensors", err, sizeof err);
    tz_st_writer_free(&w);
    tz_safetensors st;
    float out[2];
    rc |= tz_st_open(&st, TMP "/single", err, sizeof err);
    rc |= rc ? 1 : tz_st_read_f32(&st, "x", out, 1, two, err, sizeof err);
    check(rc == 0 && out[0] == 1 && out[1] == 2 && st.count == 1,
          "save replaces an old file; folder with model.safetensors opens%s%s", rc ? ": " : "",
          rc ? err : "");
    if (rc == 0) tz_st_close(&st);
}

static void save_shard(const char *path, const char *n1, const char *n2, int meta) {
    static float a[6] = {1, 2, 3, 4, 5, 6};
    static uint16_t b[8] = {0x3f80, 0x4000, 0xbf80, 0x0001, 0x4080, 0, 0x8000, 0x4049};
    const int64_t sa[2] = {2, 3}, sb[2] = {4, 2};
    char err[512];
    tz_st_writer w;
    tz_st_writer_init(&w);
    add(&w, n1, TZ_DT_F32, 2, sa, a);
    add(&w, n2, TZ_DT_BF16, 2, sb, b);
    if (meta) tz_st_writer_set_metadata(&w, "format", "pt");
    if (tz_st_writer_save(&w, path, err, sizeof err)) printf("save %s: %s\n", path, err);
    tz_st_writer_free(&w);
}

static void write_index(const char *dir, const char *const *names, const char *const *shards,
                        int n) {
    char path[512], buf[4096];
    size_t at = (size_t)snprintf(buf, sizeof buf,
                                 "{\"metadata\": {\"total_size\": 112}, \"weight_map\": {");
    for (int i = 0; i < n; i++)
        at += (size_t)snprintf(buf + at, sizeof buf - at, "%s\"%s\": \"%s\"", i ? ", " : "",
                               names[i], shards[i]);
    snprintf(buf + at, sizeof buf - at, "}}\n");
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    write_bytes(path, buf, strlen(buf));
}

static void test_sharded(void) {
    const char *s1 = "model-00001-of-00002.safetensors", *s2 = "model-00002-of-00002.safetensors";
    mkdir(TMP "/sharded", 0755);
    save_shard(TMP "/sharded/model-00001-of-00002.safetensors", "model.layers.0.w",
               "model.embed_tokens.weight", 1);
    save_shard(TMP "/sharded/model-00002-of-00002.safetensors", "model.layers.1.w",
               "lm_head.weight", 0);
    const char *names[4] = {"model.embed_tokens.weight", "model.layers.0.w", "model.layers.1.w",
                            "lm_head.weight"};
    const char *shards[4] = {s1, s1, s2, s2};
    write_index(TMP "/sharded", names, shards, 4);
    tz_safetensors st;
    char err[1024];
    int rc = tz_st_open(&st, TMP "/sharded", err, sizeof err);
    check(rc == 0 && st.count == 4 && st.nfiles == 2, "sharded folder opens: %s",
          rc ? err : "4 tensors in 2 files");
    if (rc) return;
    const tz_st_tensor *t0 = tz_st_find(&st, "model.layers.0.w");
    const tz_st_tensor *t1 = tz_st_find(&st, "lm_head.weight");
    check(t0 && t1 && strstr(t0->file, s1) && strstr(t1->file, s2) && t1->dtype == TZ_DT_BF16,
          "each tensor knows its shard file");
    float out[8];
    const int64_t sa[2] = {2, 3}, sb[2] = {4, 2};
    rc = tz_st_read_f32(&st, "model.layers.1.w", out, 2, sa, err, sizeof err);
    int ok = rc == 0 && out[0] == 1 && out[5] == 6;
    rc = tz_st_read_f32(&st, "lm_head.weight", out, 2, sb, err, sizeof err);
    ok &= rc == 0 && out[0] == 1 && out[1] == 2 && out[2] == -1 && out[3] == ldexpf(1, -133) &&
          out[4] == 4 && out[5] == 0 && signbit(out[6]) && out[7] == 3.140625f;
    check(ok, "read_f32 across shards (F32 and BF16) exact");
    const char *fmt = tz_st_metadata(&st, "format");
    check(fmt && strcmp(fmt, "pt") == 0, "shard __metadata__ readable through the folder");
    rc = tz_st_read_f32(&st, "model.norm.weight", out, 1, sa, err, sizeof err);
    check(rc && strstr(err, "sharded") && strstr(err, "'model.norm.weight'"),
          "missing tensor in a sharded model -> %s", err);
    tz_st_close(&st);
    rc = tz_st_open(&st, TMP "/sharded/model.safetensors.index.json", err, sizeof err);
    check(rc == 0 && st.count == 4, "index.json path opens directly");
    if (rc == 0) tz_st_close(&st);

    /* duplicate name across shards */
    mkdir(TMP "/dup", 0755);
    save_shard(TMP "/dup/a.safetensors", "x.w", "y.w", 0);
    save_shard(TMP "/dup/b.safetensors", "z.w", "y.w", 0);
    const char *dn[4] = {"x.w", "y.w", "z.w"}, *ds[4] = {"a.safetensors", "a.safetensors",
                                                         "b.safetensors"};
    write_index(TMP "/dup", dn, ds, 3);
    expect_reject("duplicate across shards", TMP "/dup", "'y.w'", "a.safetensors",
                  "b.safetensors");
    /* weight_map names a missing shard */
    mkdir(TMP "/missing", 0755);
    save_shard(TMP "/missing/a.safetensors", "x.w", "y.w", 0);
    const char *ms[3] = {"a.safetensors", "a.safetensors", "gone.safetensors"};
    write_index(TMP "/missing", dn, ms, 3);
    expect_reject("index names a missing shard", TMP "/missing", "index.json",
                  "gone.safetensors", "'z.w'");
    /* weight_map puts a tensor in the wrong shard */
    mkdir(TMP "/wrong", 0755);
    save_shard(TMP "/wrong/a.safetensors", "x.w", "y.w", 0);
    save_shard(TMP "/wrong/b.safetensors", "z.w", "q.w", 0);
    const char *wn[4] = {"x.w", "y.w", "z.w", "q.w"},
               *ws[4] = {"a.safetensors", "b.safetensors", "b.safetensors", "b.safetensors"};
    write_index(TMP "/wrong", wn, ws, 4);
    expect_reject("index puts tensor in wrong shard", TMP "/wrong", "index.json", "'y.w'",
                  "b.safetensors");
    mkdir(TMP "/badidx", 0755);
    write_bytes(TMP "/badidx/model.safetensors.index.json", "{\"weight_map\": [1]}",
                strlen("{\"weight_map\": [1]}"));
    expect_reject("index weight_map not an object", TMP "/badidx", "index.json", "weight_map",
                  NULL);
    write_bytes(TMP "/badidx/model.safetensors.index.json", "{\"weight_map\": {\"x\": \"../a\"}}",
                strlen("{\"weight_map\": {\"x\": \"../a\"}}"));
    expect_reject("index shard outside the folder", TMP "/badidx", "index.json", "'x'", NULL);
    mkdir(TMP "/empty", 0755);
    expect_reject("folder without model files", TMP "/empty", "empty", "model.safetensors",
                  NULL);
    expect_reject("path that does not exist", TMP "/nothing.safetensors", "nothing.safetensors",
                  NULL, NULL);
}

static void test_malformed(void) {
    char p[256];
#define BAD(file) (snprintf(p, sizeof p, TMP "/%s", file), p)
    write_bytes(BAD("short.safetensors"), "\x08\0\0\0\0", 5);
    expect_reject("file shorter than 8 bytes", p, "short.safetensors", "shorter than", NULL);
    write_crafted(BAD("hlen_file.safetensors"), 1000, "{}", 10);
    expect_reject("header longer than the file", p, "hlen_file.safetensors", "past the end",
                  NULL);
    /* a sparse file bigger than the limit, so only the 100 MB rule can reject it */
    write_crafted(BAD("hlen_100mb.safetensors"), 100000008ull, "{}", 0);
    if (truncate(p, 100000100) != 0) printf("truncate: %s\n", strerror(errno));
    expect_reject("header larger than 100 MB", p, "hlen_100mb.safetensors", "100000000", NULL);
    unlink(p);
    write_hdr(BAD("notjson.safetensors"), "{\"w\": {\"dtype\": ", 0);
    expect_reject("header not JSON", p, "notjson.safetensors", "not valid JSON", NULL);
    write_hdr(BAD("array.safetensors"), "[1, 2]  ", 0);
    expect_reject("header not an object", p, "array.safetensors", "expected a JSON object", NULL);
    write_hdr(BAD("entry.safetensors"), "{\"w\": 5}", 0);
    expect_reject("entry not an object", p, "entry.safetensors", "'w'", "expected an object");
    write_hdr(BAD("nodtype.safetensors"), "{\"w\": {\"shape\": [2], \"data_offsets\": [0, 8]}}", 8);
    expect_reject("missing dtype", p, "nodtype.safetensors", "'w'", "missing \"dtype\"");
    write_hdr(BAD("noshape.safetensors"), "{\"w\": {\"dtype\": \"F32\", \"data_offsets\": [0, 8]}}",
              8);
    expect_reject("missing shape", p, "noshape.safetensors", "'w'", "missing \"shape\"");
    write_hdr(BAD("nooffs.safetensors"), "{\"w\": {\"dtype\": \"F32\", \"shape\": [2]}}", 8);
    expect_reject("missing data_offsets", p, "nooffs.safetensors", "'w'",
                  "missing \"data_offsets\"");
    write_hdr(BAD("dtype_type.safetensors"),
              "{\"w\": {\"dtype\": 4, \"shape\": [2], \"data_offsets\": [0, 8]}}", 8);
    expect_reject("dtype not a string", p, "dtype_type.safetensors", "'w'", "\"dtype\" is 4");
    write_hdr(BAD("shape_type.safetensors"),
              "{\"w\": {\"dtype\": \"F32\", \"shape\": \"2\", \"data_offsets\": [0, 8]}}", 8);
    expect_reject("shape not an array", p, "shape_type.safetensors", "'w'", "\"shape\" is");
    write_hdr(BAD("offs_type.safetensors"),
              "{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": {\"a\": 0}}}", 8);
    expect_reject("data_offsets not an array", p, "offs_type.safetensors", "'w'",
                  "\"data_offsets\" is");
    write_hdr(BAD("offs_str.safetensors"),
              "{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [\"0\", 8]}}", 8);
    expect_reject("data_offsets not integers", p, "offs_str.safetensors", "'w'",
                  "non-negative integers");
    write_hdr(BAD("dtype_unknown.safetensors"),
              "{\"w\": {\"dtype\": \"F42\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 8);
    expect_reject("unknown dtype", p, "dtype_unknown.safetensors", "'w'", "\"F42\"");
    write_hdr(BAD("dim_neg.safetensors"),
              "{\"w\": {\"dtype\": \"F32\", \"shape\": [-2], \"data_offsets\": [0, 8]}}", 8);
    expect_reject("negative dim", p, "dim_neg.safetensors", "'w'", "is -2");
    write_hdr(BAD("dim_real.safetensors"),
              "{\"w\": {\"dtype\": \"F32\", \"shape\": [2.5], \"data_offsets\": [0, 8]}}", 8);
    expect_reject("non-integer dim", p, "dim_real.safetensors", "'w'", "not an integer");
    write_hdr(BAD("dim_many.safetensors"), "{\"w\": {\"dtype\": \"F32\", \"shape\": "
              "[1,1,1,1,1,1,1,1,2], \"data_offsets\": [0, 8]}}", 8);
    expect_reject("more than 8 dims", p, "dim_many.safetensors", "'w'", "9 dims");
    write_hdr(BAD("dim_huge.safetensors"), "{\"w\": {\"dtype\": \"F32\", \"shape\": "
              "[4294967296, 4294967296], \"data_offsets\": [0, 8]}}", 8);
    expect_reject("shape overflowing int64", p, "dim_huge.safetensors", "'w'", "2^63");
    write_hdr(BAD("offs_three.safetensors"),
              "{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 4, 8]}}", 8);
    expect_reject("data_offsets of 3 numbers", p, "offs_three.safetensors", "'w'",
                  "[begin, end]");
    write_hdr(BAD("offs_order.safetensors"),
              "{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 0]}}", 8);
    expect_reject("data_offsets begin > end", p, "offs_order.safetensors", "'w'", "begin > end");
    write_hdr(BAD("offs_past.safetensors"),
              "{\"w\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}}", 8);
    expect_reject("end past the data section", p, "offs_past.safetensors", "'w'",
                  "past the end of the data section");
    write_hdr(BAD("size.safetensors"),
              "{\"w\": {\"dtype\": \"BF16\", \"shape\": [3], \"data_offsets\": [0, 8]}}", 8);
    expect_reject("bytes disagree with shape", p, "size.safetensors", "'w'", "needs 3 x 2 bytes");
    write_hdr(BAD("dupkey.safetensors"), "{\"w\": {\"dtype\": \"F32\", \"shape\": [1], "
              "\"data_offsets\": [0, 4]}, \"w\": {\"dtype\": \"F32\", \"shape\": [1], "
              "\"data_offsets\": [4, 8]}}", 8);
    expect_reject("name twice in one header", p, "dupkey.safetensors", "duplicate", NULL);
    write_hdr(BAD("overlap.safetensors"), "{\"w\": {\"dtype\": \"F32\", \"shape\": [2], "
              "\"data_offsets\": [0, 8]}, \"v\": {\"dtype\": \"F32\", \"shape\": [1], "
              "\"data_offsets\": [4, 8]}}", 8);
    expect_reject("overlapping data_offsets", p, "overlap.safetensors", "'w' and 'v' overlap", NULL);
    write_hdr(BAD("meta_val.safetensors"), "{\"__metadata__\": {\"format\": 1}}", 0);
    expect_reject("metadata value not a string", p, "meta_val.safetensors", "\"format\"",
                  "expected a string");
    write_hdr(BAD("meta_type.safetensors"), "{\"__metadata__\": [\"pt\"]}", 0);
    expect_reject("metadata not an object", p, "meta_type.safetensors", "__metadata__", NULL);
    /* valid though unusual: header not padded to 8, a BF16 tensor at an odd offset */
    write_hdr(BAD("unaligned.safetensors"), "{\"a\": {\"dtype\": \"U8\", \"shape\": [1], "
              "\"data_offsets\": [0, 1]}, \"b\": {\"dtype\": \"BF16\", \"shape\": [2], "
              "\"data_offsets\": [1, 5]}}", 5);
    tz_safetensors st;
    char err[512];
    float out[2] = {0, 0};
    const int64_t two[1] = {2};
    int rc = tz_st_open(&st, p, err, sizeof err);
    if (rc == 0) rc = tz_st_read_f32(&st, "b", out, 1, two, err, sizeof err);
    check(rc == 0 && out[0] == tz_bf16_to_f32(0xABAB) && out[1] == out[0] &&
              ((uintptr_t)tz_st_find(&st, "b")->data & 1),
          "unpadded header and an odd-offset BF16 tensor are read correctly%s%s",
          rc ? ": " : "", rc ? err : "");
    if (rc == 0) tz_st_close(&st);

    /* FIFOs are refused, naming them, not waited on: as the file, as the index, as a shard */
    signal(SIGALRM, on_alarm);
    alarm(20);
    mkfifo(BAD("fifo.safetensors"), 0600);
    expect_reject("a FIFO as the file", p, "fifo.safetensors", "not a regular file (a FIFO)", NULL);
    unlink(p);
    mkfifo(BAD("fifo.index.json"), 0600);
    expect_reject("a FIFO as the index", p, "fifo.index.json", "not a regular file (a FIFO)", NULL);
    unlink(p);
    mkdir(BAD("fifo_shard"), 0755);
    tz_put(BAD("fifo_shard/model.safetensors.index.json"),
           "{\"weight_map\": {\"w\": \"model-00001-of-00001.safetensors\"}}");
    mkfifo(BAD("fifo_shard/model-00001-of-00001.safetensors"), 0600);
    expect_reject("a FIFO as a shard", BAD("fifo_shard"), "model-00001-of-00001.safetensors",
                  "not a regular file (a FIFO)", NULL);
    unlink(BAD("fifo_shard/model-00001-of-00001.safetensors"));
    unlink(BAD("fifo_shard/model.safetensors.index.json"));
    rmdir(BAD("fifo_shard"));
    alarm(0);
#undef BAD
}

/* Mutates the round-trip file's length field and header bytes: every variant must either
 * open (and then every tensor byte is readable) or be rejected with a message naming it. */
static void test_mutations(void) {
    const char *src = TMP "/rt.safetensors", *dst = TMP "/mut.safetensors";
    FILE *f = fopen(src, "rb");
    if (!f) {
        check(0, "mutation test: cannot read %s", src);
        return;
    }
    unsigned char orig[4096];
    size_t n = fread(orig, 1, sizeof orig, f);
    fclose(f);
    size_t hend = 8 + (size_t)orig[0] + ((size_t)orig[1] << 8);
    const char *tokens[] = {"0", "9", "-", ".", "\"", "}", "]", ",", "e", "[", "{", ":"};
    uint64_t s = 12345;
    int opened = 0, rejected = 0, bad = 0;
    unsigned char buf[4096];
    for (int it = 0; it < 3000; it++) {
        memcpy(buf, orig, n);
        size_t len = n;
        int nm = 1 + it % 3;
        for (int k = 0; k < nm; k++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            size_t at = (size_t)(s >> 16) % hend;
            if ((s & 7) == 0) at = (size_t)(s >> 8) % 8; /* the length field */
            buf[at] = (s & 1) ? (unsigned char)tokens[(s >> 40) % 12][0] : (unsigned char)(s >> 32);
        }
        if (it % 10 == 9) len = (size_t)(s >> 24) % n; /* truncated */
        write_bytes(dst, buf, len);
        tz_safetensors st;
        char err[1024] = "";
        if (tz_st_open(&st, dst, err, sizeof err) == 0) {
            unsigned sum = 0;
            for (int64_t i = 0; i < st.count; i++)
                for (size_t b = 0; b < st.tensors[i].nbytes; b++)
                    sum += ((const unsigned char *)st.tensors[i].data)[b];
            g_sink += sum;
            opened++;
            tz_st_close(&st);
        } else {
            rejected++;
            if (!strstr(err, "mut.safetensors")) {
                if (bad++ < 3) printf("  message without the file name: %s\n", err);
            }
        }
    }
    check(bad == 0 && rejected > 0, "3000 mutated/truncated files: %d opened, %d rejected, "
          "every rejection names the file", opened, rejected);
}

int main(void) {
    mkdir(TMP, 0755);
    make_data();
    test_roundtrip();
    test_writer_errors();
    test_sharded();
    test_malformed();
    test_mutations();
    printf("safetensors: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
