/* BPE tokenizers from tokenizer.json (jansson): the vocabulary as raw bytes in one hash
 * table, merges as (left id, right id) -> (rank, result) in another, BPE per word with a
 * linked list of symbols and a heap of candidate pairs, and a cache of encoded words.
 * Byte-level vocabularies are stored decoded (the byte-to-unicode map undone), so BPE runs
 * on the text's own bytes; SentencePiece vocabularies keep "▁" for the space. */
#include "io/tokenizer.h"
#include "io/tokens.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "io/fsutil.h"
#include "io/nfc.h"
#include "io/unicode_classes.h"

enum { KIND_BYTES, KIND_BYTELEVEL, KIND_SPM };
enum { RE_NONE, RE_LLAMA3, RE_GPT2, RE_QWEN2 }; /* RE_QWEN2: RE_LLAMA3 with single digits */

typedef struct piece {
    uint32_t off, len; /* bytes in t->pool */
    uint8_t special, added;
} piece;

typedef struct merge_slot {
    uint64_t key; /* left << 32 | right, UINT64_MAX: empty */
    int32_t rank, result;
} merge_slot;

typedef struct cache_slot {
    uint32_t off, len; /* word bytes in cache_pool; len 0: empty */
    uint32_t ids_off, nids; /* ids in cache_ids */
} cache_slot;

typedef struct added_tok {
    int32_t id;
    uint32_t off, len;
    uint8_t special;
} added_tok;

struct tz_tokenizer {
    int kind;
    int64_t vocab;   /* ids 0 .. vocab-1 */
    piece *pieces;   /* [vocab]; len 0 for a hole in the id space */
    char *pool;      /* piece bytes */
    size_t pool_n, pool_cap;
    int32_t *vslot;  /* vocabulary hash (model vocab only): slot -> id, -1 empty */
    uint64_t vmask;
    merge_slot *mslot;
    uint64_t mmask;
    added_tok *added;
    int nadded;
    int32_t first_added[257]; /* added sorted by first byte: [first_added[b], first_added[b+1]) */
    int32_t byte_tok[256];    /* byte-level: the id of each single byte; SPM: <0xNN>, or -1 */
    int32_t unk, bos, eos;
    int add_bos;        /* tokenizer_config.json's add_bos_token, else the post-processor's */
    uint64_t digest;    /* of the vocabulary, by id (tz_tokenizer_digest) */
    char chat[16];      /* the chat template tokenizer_config.json names, recognised, or "" */
    int regex, add_prefix_space, ignore_merges, byte_fallback, fuse_unk;
    int spm_prepend;   /* 0 never, 1 every segment (Prepend normalizer, Metaspace "always"), 2 first */
    int spm_split_ok;  /* no token has "▁" after other text: words may be cut before "▁" runs */
    int nfc;           /* normalizer NFC (Qwen2, Qwen3): each segment in NFC first */
    int strip_lead;    /* decoder removes one leading space */
    /* the word cache */
    cache_slot *cslot;
    uint64_t cmask, cused;
    char *cpool;
    size_t cpool_n, cpool_cap;
    int32_t *cids;
    size_t cids_n, cids_cap;
};

/* ---------------------------------------------------------------- small helpers */

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}
static uint64_t hash_u64(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    return k ^ (k >> 33);
}

/* One code point from s[0..n): its value, its length in *k (1 for a byte that is not valid
 * UTF-8, which then stands for itself as a code point of no class). */
static uint32_t utf8_next(const uint8_t *s, size_t n, int *k) {
    uint32_t c = s[0];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 1 || len == 0 || (size_t)len > n) {
        *k = 1;
        return len == 1 ? c : 0xFFFFFFFFu;
    }
    uint32_t v = c & (0x7F >> len);
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            *k = 1;
            return 0xFFFFFFFFu;
        }
        v = v << 6 | (s[i] & 0x3F);
    }
    if ((len == 2 && v < 0x80) || (len == 3 && v < 0x800) || (len == 4 && (v < 0x10000 || v > 0x10FFFF)) ||
        (v >= 0xD800 && v <= 0xDFFF)) {
        *k = 1;
        return 0xFFFFFFFFu;
    }
    *k = len;
    return v;
}
enum { CL_OTHER = 0, CL_L = 1, CL_N = 2, CL_WS = 3 };
static int uni_class(uint32_t c) {
    if (c < 0x80) {
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return CL_L;
        if (c >= '0' && c <= '9') return CL_N;
        if (c == ' ' || (c >= 9 && c <= 13)) return CL_WS;
        return CL_OTHER;
    }
    if (c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
        c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000)
        return CL_WS; /* White_Space, the \s of the patterns */
    if (c > 0x10FFFF) return CL_OTHER;
    int lo = 0, hi = TZ_UNI_NRANGES - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        uint32_t a = tz_uni_ranges[mid][0], b = tz_uni_ranges[mid][1] & 0x7FFFFFFFu;
        if (c < a) hi = mid - 1;
        else if (c > b) lo = mid + 1;
        else return tz_uni_ranges[mid][1] >> 31 ? CL_N : CL_L;
    }
    return CL_OTHER;
}

/* ---------------------------------------------------------------- pre-tokenizer scanners */

typedef struct cp_t {
    uint32_t c;
    int k, cl;
} cp_t;
static cp_t cp_at(const uint8_t *s, size_t n, size_t i) {
    cp_t r = {0, 0, -1};
    if (i >= n) return r;
    r.c = utf8_next(s + i, n - i, &r.k);
    r.cl = uni_class(r.c);
    return r;
}
static int lower_eq(uint32_t c, char a) { return c == (uint32_t)a || c == (uint32_t)a - 32; }

/* Length of the whitespace run at i. */
static size_t ws_run(const uint8_t *s, size_t n, size_t i) {
    size_t j = i;
    for (cp_t c; (c = cp_at(s, n, j)).cl == CL_WS;) j += (size_t)c.k;
    return j - i;
}

/* The length of the next piece at s[i..n) under the Llama 3 pattern
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*
 *   |\s*[\r\n]+|\s+(?!\S)|\s+
 * or Qwen2's (Qwen2, Qwen2.5, Qwen3), the same with \p{N} in place of \p{N}{1,3},
 * or the GPT-2 pattern
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * both with leftmost-first alternation, as a backtracking regex engine matches them. */
static size_t next_piece(int re, const uint8_t *s, size_t n, size_t i) {
    cp_t c0 = cp_at(s, n, i);
    const int digits = re == RE_QWEN2 ? 1 : 3; /* \p{N}{1,digits} */
    if (re == RE_QWEN2) re = RE_LLAMA3;
    if (s[i] == '\'' && i + 1 < n) {
        cp_t c1 = cp_at(s, n, i + 1), c2 = cp_at(s, n, i + 2);
        if (re == RE_LLAMA3) {
            if (lower_eq(c1.c, 's') || lower_eq(c1.c, 't') || lower_eq(c1.c, 'm') || lower_eq(c1.c, 'd'))
                return 2;
            if ((lower_eq(c1.c, 'r') && lower_eq(c2.c, 'e')) || (lower_eq(c1.c, 'v') && lower_eq(c2.c, 'e')) ||
                (lower_eq(c1.c, 'l') && lower_eq(c2.c, 'l')))
                return 3;
        } else {
            if (c1.c == 's' || c1.c == 't' || c1.c == 'm' || c1.c == 'd') return 2;
            if ((c1.c == 'r' && c2.c == 'e') || (c1.c == 'v' && c2.c == 'e') || (c1.c == 'l' && c2.c == 'l'))
                return 3;
        }
    }
    size_t j;
    if (re == RE_LLAMA3) {
        /* [^\r\n\p{L}\p{N}]?\p{L}+ */
        j = i;
        if (c0.cl != CL_L && c0.cl != CL_N && c0.c != '\r' && c0.c != '\n') j += (size_t)c0.k;
        if (cp_at(s, n, j).cl == CL_L) {
            for (cp_t c; (c = cp_at(s, n, j)).cl == CL_L;) j += (size_t)c.k;
            return j - i;
        }
        /* \p{N}{1,3} (Qwen2: \p{N}) */
        if (c0.cl == CL_N) {
            j = i;
            for (int m = 0; m < digits; m++) {
                cp_t c = cp_at(s, n, j);
                if (c.cl != CL_N) break;
                j += (size_t)c.k;
            }
            return j - i;
        }
        /*  ?[^\s\p{L}\p{N}]+[\r\n]* */
        j = i + (s[i] == ' ');
        if (cp_at(s, n, j).cl == CL_OTHER) {
            for (cp_t c; (c = cp_at(s, n, j)).cl == CL_OTHER;) j += (size_t)c.k;
            while (j < n && (s[j] == '\r' || s[j] == '\n')) j++;
            return j - i;
        }
        /* \s*[\r\n]+ : the whitespace run up to its last \r or \n */
        size_t w = ws_run(s, n, i), last = 0;
        for (size_t q = i; q < i + w; q++)
            if (s[q] == '\r' || s[q] == '\n') last = q + 1;
        if (last) return last - i;
    } else {
        /*  ?\p{L}+ |  ?\p{N}+ |  ?[^\s\p{L}\p{N}]+ */
        j = i + (s[i] == ' ');
        int cl = cp_at(s, n, j).cl;
        if (cl == CL_L || cl == CL_N || cl == CL_OTHER) {
            for (cp_t c; (c = cp_at(s, n, j)).cl == cl;) j += (size_t)c.k;
            return j - i;
        }
    }
    /* \s+(?!\S) | \s+ */
    size_t w = ws_run(s, n, i);
    if (w == 0) return (size_t)c0.k; /* cannot happen: every code point has a class */
    if (i + w < n) {
        size_t lastk = 1; /* the last whitespace code point's length */
        for (size_t q = i; q < i + w;) {
            cp_t c = cp_at(s, n, q);
            lastk = (size_t)c.k;
            q += lastk;
        }
        if (w > lastk) return w - lastk;
    }
    return w;
}

/* ---------------------------------------------------------------- vocabulary and merges */

static size_t pool_add(tz_tokenizer *t, const char *s, size_t n) {
    if (t->pool_n + n + 1 > t->pool_cap) {
        while (t->pool_n + n + 1 > t->pool_cap) t->pool_cap = t->pool_cap ? 2 * t->pool_cap : 1 << 16;
        t->pool = tz_xrealloc(t->pool, t->pool_cap);
    }
    memcpy(t->pool + t->pool_n, s, n);
    t->pool[t->pool_n + n] = 0;
    size_t off = t->pool_n;
    t->pool_n += n + 1;
    return off;
}

static int32_t vocab_get(const tz_tokenizer *t, const char *s, size_t n) {
    for (uint64_t h = hash_bytes(s, n) & t->vmask;; h = (h + 1) & t->vmask) {
        int32_t id = t->vslot[h];
        if (id < 0) return -1;
        const piece *p = &t->pieces[id];
        if (p->len == n && !memcmp(t->pool + p->off, s, n)) return id;
    }
}
static void vocab_put(tz_tokenizer *t, int32_t id) {
    const piece *p = &t->pieces[id];
    for (uint64_t h = hash_bytes(t->pool + p->off, p->len) & t->vmask;; h = (h + 1) & t->vmask)
        if (t->vslot[h] < 0) {
            t->vslot[h] = id;
            return;
        }
}

static const merge_slot *merge_get(const tz_tokenizer *t, int32_t a, int32_t b) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (uint64_t h = hash_u64(key) & t->mmask;; h = (h + 1) & t->mmask) {
        const merge_slot *m = &t->mslot[h];
        if (m->key == key) return m;
        if (m->key == UINT64_MAX) return NULL;
    }
}

/* GPT-2's byte-to-unicode map: printable bytes stand for themselves, the rest for 256 + k. */
static void byte_map(uint32_t fwd[256]) {
    int k = 0;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        fwd[b] = keep ? (uint32_t)b : (uint32_t)(256 + k++);
    }
}

/* A vocabulary string s[0..n) to the bytes BPE works on: byte-level strings through the
 * inverse byte map (-1 when a character is not in it), SentencePiece strings as they are.
 * Writes at most n bytes to out. */
static long piece_bytes(const tz_tokenizer *t, const char *s, size_t n, char *out) {
    if (t->kind != KIND_BYTELEVEL) {
        memcpy(out, s, n);
        return (long)n;
    }
    static int inv[324];
    static int ready;
    if (!ready) {
        uint32_t f[256];
        byte_map(f);
        for (int i = 0; i < 324; i++) inv[i] = -1;
        for (int b = 0; b < 256; b++) inv[f[b]] = b;
        ready = 1;
    }
    long m = 0;
    for (size_t i = 0; i < n;) {
        int k;
        uint32_t c = utf8_next((const uint8_t *)s + i, n - i, &k);
        if (c >= 324 || inv[c] < 0) return -1;
        out[m++] = (char)inv[c];
        i += (size_t)k;
    }
    return m;
}

/* ---------------------------------------------------------------- loading */

static const char *jstr(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}
static int jtrue(json_t *o, const char *key) { return json_is_true(json_object_get(o, key)); }

#define FAIL(...) do { snprintf(err, errlen, __VA_ARGS__); return 1; } while (0)


/* Ids are below this: the id space is allocated whole (a hole costs a slot). */
#define MAX_ID (1 << 24)

static const char *const LLAMA3_RE =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char *const QWEN2_RE =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char *const GPT2_RE =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int load_normalizer(tz_tokenizer *t, json_t *n, const char *file, char *err, size_t errlen) {
    if (!n || json_is_null(n)) return 0;
    const char *type = jstr(n, "type");
    if (type && !strcmp(type, "Sequence")) {
        json_t *list = json_object_get(n, "normalizers"), *e;
        size_t i;
        json_array_foreach(list, i, e) if (load_normalizer(t, e, file, err, errlen)) return 1;
        return 0;
    }
    if (type && !strcmp(type, "Prepend")) {
        const char *p = jstr(n, "prepend");
        if (!p || strcmp(p, "\u2581"))
            FAIL("%s: normalizer Prepend of \"%s\" is not supported (only \"\u2581\")", file, p ? p : "?");
        t->spm_prepend = 1;
        return 0;
    }
    if (type && !strcmp(type, "Replace")) {
        json_t *pat = json_object_get(n, "pattern");
        const char *from = jstr(pat, "String"), *to = jstr(n, "content");
        if (!from || !to || strcmp(from, " ") || strcmp(to, "\u2581"))
            FAIL("%s: normalizer Replace other than \" \" -> \"\u2581\" is not supported", file);
        return 0;
    }
    if (type && !strcmp(type, "NFC")) { /* Qwen2, Qwen2.5, Qwen3 */
        t->nfc = 1;
        return 0;
    }
    FAIL("%s: normalizer %s is not supported (supported: Sequence, NFC, Prepend, Replace of \" \" "
         "by \"\u2581\")", file, type ? type : "(no type)");
}

static int load_pretok(tz_tokenizer *t, json_t *p, const char *file, char *err, size_t errlen) {
    if (!p || json_is_null(p)) return 0;
    const char *type = jstr(p, "type");
    if (type && !strcmp(type, "Sequence")) {
        json_t *list = json_object_get(p, "pretokenizers"), *e;
        size_t i;
        json_array_foreach(list, i, e) if (load_pretok(t, e, file, err, errlen)) return 1;
        return 0;
    }
    if (type && !strcmp(type, "Split")) {
        const char *re = jstr(json_object_get(p, "pattern"), "Regex");
        const char *beh = jstr(p, "behavior");
        if (!re) FAIL("%s: pre_tokenizer Split with a String pattern is not supported", file);
        if (!strcmp(re, LLAMA3_RE)) t->regex = RE_LLAMA3;
        else if (!strcmp(re, QWEN2_RE)) t->regex = RE_QWEN2;
        else if (!strcmp(re, GPT2_RE)) t->regex = RE_GPT2;
        else FAIL("%s: pre_tokenizer Split with the regex %.200s is not supported (only the Llama 3, "
                  "Qwen2 and GPT-2 patterns)", file, re);
        if (!beh || strcmp(beh, "Isolated") || jtrue(p, "invert"))
            FAIL("%s: pre_tokenizer Split with behavior %s%s is not supported (only Isolated)", file,
                 beh ? beh : "?", jtrue(p, "invert") ? " and invert" : "");
        return 0;
    }
    if (type && !strcmp(type, "ByteLevel")) {
        t->kind = KIND_BYTELEVEL;
        if (jtrue(p, "add_prefix_space")) t->add_prefix_space = 1;
        json_t *ur = json_object_get(p, "use_regex");
        if (!ur || json_is_true(ur)) {
            if (t->regex == RE_LLAMA3 || t->regex == RE_QWEN2)
                FAIL("%s: pre_tokenizer ByteLevel with use_regex after a Split is not supported", file);
            t->regex = RE_GPT2;
        }
        return 0;
    }
    if (type && !strcmp(type, "Metaspace")) {
        const char *rep = jstr(p, "replacement"), *scheme = jstr(p, "prepend_scheme");
        if (rep && strcmp(rep, "\u2581"))
            FAIL("%s: pre_tokenizer Metaspace with replacement \"%s\" is not supported", file, rep);
        json_t *aps = json_object_get(p, "add_prefix_space");
        if (scheme) t->spm_prepend = !strcmp(scheme, "always") ? 1 : !strcmp(scheme, "first") ? 2 : 0;
        else t->spm_prepend = !aps || json_is_true(aps);
        return 0; /* split or not, words are cut before "▁" runs only when that is exact */
    }
    FAIL("%s: pre_tokenizer %s is not supported (supported: Sequence, Split with the Llama 3, "
         "Qwen2 or GPT-2 regex, ByteLevel, Metaspace)", file, type ? type : "(no type)");
}

static int load_decoder(tz_tokenizer *t, json_t *d, const char *file, char *err, size_t errlen) {
    if (!d || json_is_null(d)) return 0;
    const char *type = jstr(d, "type");
    if (type && !strcmp(type, "Sequence")) {
        json_t *list = json_object_get(d, "decoders"), *e;
        size_t i;
        json_array_foreach(list, i, e) if (load_decoder(t, e, file, err, errlen)) return 1;
        return 0;
    }
    if (type && (!strcmp(type, "ByteLevel") || !strcmp(type, "ByteFallback") || !strcmp(type, "Fuse")))
        return 0;
    if (type && !strcmp(type, "Replace")) {
        const char *from = jstr(json_object_get(d, "pattern"), "String"), *to = jstr(d, "content");
        if (!from || !to || strcmp(from, "\u2581") || strcmp(to, " "))
            FAIL("%s: decoder Replace other than \"\u2581\" -> \" \" is not supported", file);
        return 0;
    }
    if (type && !strcmp(type, "Strip")) {
        const char *c = jstr(d, "content");
        json_t *st = json_object_get(d, "start"), *sp = json_object_get(d, "stop");
        if (!c || strcmp(c, " ") || json_integer_value(st) > 1 || json_integer_value(sp) != 0)
            FAIL("%s: decoder Strip other than one leading space is not supported", file);
        t->strip_lead = json_integer_value(st) == 1;
        return 0;
    }
    if (type && !strcmp(type, "Metaspace")) {
        const char *scheme = jstr(d, "prepend_scheme");
        json_t *aps = json_object_get(d, "add_prefix_space");
        t->strip_lead = scheme ? strcmp(scheme, "never") != 0 : (!aps || json_is_true(aps));
        return 0;
    }
    FAIL("%s: decoder %s is not supported (supported: ByteLevel, Metaspace, and Sequence of "
         "Replace, ByteFallback, Fuse, Strip)", file, type ? type : "(no type)");
}

/* BOS/EOS named in tokenizer_config.json (a string or {"content": ...}) or by id in
 * config.json, beside the tokenizer. */
static int32_t special_named(const tz_tokenizer *t, json_t *v) {
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_is_string(v) ? tz_tokenizer_find(t, json_string_value(v)) : -1;
}
static int32_t special_id(const tz_tokenizer *t, json_t *v) {
    if (json_is_array(v)) v = json_array_get(v, 0);
    if (!json_is_number(v)) return -1; /* read as a real: the files hold larger numbers */
    double id = json_number_value(v);
    return id >= 0 && id < t->vocab ? (int32_t)id : -1;
}
/* The JSON of an optional file beside the tokenizer: NULL when it is absent or not valid
 * JSON (no BOS/EOS from it), NULL with *bad set and err when it is not a regular file. */
static json_t *json_beside(const char *path, int *bad, char *err, size_t errlen) {
    struct stat st;
    if (stat(path, &st) != 0) return NULL;
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s: not a regular file (%s), expected the JSON file beside the "
                 "tokenizer", path, tz_file_kind((unsigned)st.st_mode));
        *bad = 1;
        return NULL;
    }
    return tz_json_load_file(path, JSON_DECODE_INT_AS_REAL, NULL, 0);
}
static int load_bos_eos(tz_tokenizer *t, const char *dir, char *err, size_t errlen) {
    char path[4200];
    int bad = 0;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    json_t *c = json_beside(path, &bad, err, errlen);
    if (c) {
        t->bos = special_named(t, json_object_get(c, "bos_token"));
        t->eos = special_named(t, json_object_get(c, "eos_token"));
        json_t *ab = json_object_get(c, "add_bos_token");
        if (json_is_boolean(ab)) t->add_bos = json_is_true(ab);
        json_t *ct = json_object_get(c, "chat_template");
        if (json_is_array(ct)) { /* [{"name": "default", "template": ...}, ...]: the first */
            json_t *e = json_array_get(ct, 0);
            ct = json_object_get(e, "template");
        }
        if (json_is_string(ct)) {
            const char *s = json_string_value(ct);
            const char *name = strstr(s, "<|start_header_id|>") ? "llama3"
                               : strstr(s, "<|im_start|>")      ? "chatml"
                               : strstr(s, "[INST]")            ? "llama2"
                                                                : "";
            snprintf(t->chat, sizeof t->chat, "%s", name);
        }
        json_decref(c);
    }
    if (bad) return 1;
    snprintf(path, sizeof path, "%s/config.json", dir);
    c = json_beside(path, &bad, err, errlen);
    if (c) {
        if (t->bos < 0) t->bos = special_id(t, json_object_get(c, "bos_token_id"));
        if (t->eos < 0) t->eos = special_id(t, json_object_get(c, "eos_token_id"));
        json_decref(c);
    }
    return bad;
}

static const char *sort_pool;
static int cmp_added_pool(const void *a, const void *b) {
    const added_tok *x = a, *y = b;
    int fa = (uint8_t)sort_pool[x->off], fb = (uint8_t)sort_pool[y->off];
    if (fa != fb) return fa - fb;
    if (x->len != y->len) return x->len > y->len ? -1 : 1; /* longest first */
    return x->id - y->id;
}

static int load_json(tz_tokenizer *t, const char *file, char *err, size_t errlen) {
    json_t *root = tz_json_load_file(file, 0, err, errlen);
    if (!root) return 1;
    int rc = 1;
    json_t *model = json_object_get(root, "model");
    json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    json_t *added = json_object_get(root, "added_tokens");
    const char *mtype = jstr(model, "type");
    char *buf = NULL;
    if (!json_is_object(root) || !json_is_object(model)) {
        snprintf(err, errlen, "%s: no \"model\" object: not a tokenizer.json", file);
        goto out;
    }
    if (!mtype || strcmp(mtype, "BPE")) {
        snprintf(err, errlen, "%s: model type %s is not supported (only BPE)", file,
                 mtype ? mtype : "(none)");
        goto out;
    }
    if (!json_is_object(vocab) || !json_is_array(merges)) {
        snprintf(err, errlen, "%s: model.vocab must be an object and model.merges an array", file);
        goto out;
    }
    json_t *v = json_object_get(model, "dropout");
    if (v && !json_is_null(v) && json_number_value(v) > 0) {
        snprintf(err, errlen, "%s: BPE dropout is not supported", file);
        goto out;
    }
    if (jstr(model, "continuing_subword_prefix") && jstr(model, "continuing_subword_prefix")[0]) {
        snprintf(err, errlen, "%s: BPE continuing_subword_prefix is not supported", file);
        goto out;
    }
    if (jstr(model, "end_of_word_suffix") && jstr(model, "end_of_word_suffix")[0]) {
        snprintf(err, errlen, "%s: BPE end_of_word_suffix is not supported", file);
        goto out;
    }
    t->kind = KIND_SPM;
    t->ignore_merges = jtrue(model, "ignore_merges");
    t->byte_fallback = jtrue(model, "byte_fallback");
    t->fuse_unk = jtrue(model, "fuse_unk");
    if (load_normalizer(t, json_object_get(root, "normalizer"), file, err, errlen) ||
        load_pretok(t, json_object_get(root, "pre_tokenizer"), file, err, errlen) ||
        load_decoder(t, json_object_get(root, "decoder"), file, err, errlen))
        goto out;
    if (t->kind == KIND_BYTELEVEL && t->spm_prepend) {
        snprintf(err, errlen, "%s: a ByteLevel pre_tokenizer with a \"\u2581\" normalizer is not supported", file);
        goto out;
    }
    if (t->kind == KIND_SPM && t->regex != RE_NONE) {
        snprintf(err, errlen, "%s: a Split pre_tokenizer without ByteLevel is not supported", file);
        goto out;
    }
    /* ids: the largest of the vocabulary and the added tokens */
    int64_t maxid = -1;
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= MAX_ID) {
            snprintf(err, errlen, "%s: model.vocab[\"%.100s\"]: expected an id (an integer 0 .. 2^24 - 1)",
                     file, key);
            goto out;
        }
        if (json_integer_value(val) > maxid) maxid = json_integer_value(val);
    }
    size_t i;
    json_array_foreach(added, i, val) {
        json_t *id = json_object_get(val, "id");
        const char *content = jstr(val, "content");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= MAX_ID ||
            !content || !content[0]) {
            snprintf(err, errlen, "%s: added_tokens[%zu]: expected an \"id\" (an integer 0 .. 2^24 - 1) and "
                     "a \"content\" (non-empty string)", file, i);
            goto out;
        }
        if (jtrue(val, "lstrip") || jtrue(val, "rstrip") || jtrue(val, "single_word")) {
            snprintf(err, errlen, "%s: added_tokens[%zu] (%s): lstrip, rstrip and single_word are not "
                     "supported", file, i, content);
            goto out;
        }
        if (json_integer_value(id) > maxid) maxid = json_integer_value(id);
    }
    if (maxid < 0) {
        snprintf(err, errlen, "%s: the vocabulary is empty", file);
        goto out;
    }
    t->vocab = maxid + 1;
    t->pieces = tz_xcalloc((size_t)t->vocab, sizeof *t->pieces);
    uint64_t vcap = 1;
    while (vcap < 2 * (uint64_t)json_object_size(vocab) + 2) vcap <<= 1;
    t->vmask = vcap - 1;
    t->vslot = tz_xmalloc(vcap * sizeof *t->vslot);
    memset(t->vslot, 0xFF, vcap * sizeof *t->vslot);
    buf = tz_xmalloc(1 << 14);
    json_object_foreach(vocab, key, val) {
        int32_t id = (int32_t)json_integer_value(val);
        size_t klen = strlen(key);
        if (klen >= (1 << 14)) {
            snprintf(err, errlen, "%s: model.vocab entry %d is %zu bytes long, expected less than "
                     "16 KiB", file, id, klen);
            goto out;
        }
        long n = piece_bytes(t, key, klen, buf);
        if (n <= 0) {
            snprintf(err, errlen, "%s: model.vocab[\"%.100s\"]: %s", file, key,
                     n == 0 ? "an empty token" : "a character outside the byte-level alphabet");
            goto out;
        }
        if (t->pieces[id].len) {
            snprintf(err, errlen, "%s: model.vocab: id %d is given twice", file, id);
            goto out;
        }
        t->pieces[id].off = (uint32_t)pool_add(t, buf, (size_t)n);
        t->pieces[id].len = (uint32_t)n;
        if (vocab_get(t, buf, (size_t)n) >= 0) {
            snprintf(err, errlen, "%s: model.vocab[\"%.100s\"]: the same bytes as another token", file, key);
            goto out;
        }
        vocab_put(t, id);
    }
    /* added tokens: their content as it is; special or not */
    t->added = tz_xcalloc(json_array_size(added) + 1, sizeof *t->added);
    json_array_foreach(added, i, val) {
        int32_t id = (int32_t)json_integer_value(json_object_get(val, "id"));
        const char *content = jstr(val, "content");
        piece *p = &t->pieces[id];
        p->added = 1;
        p->special = jtrue(val, "special");
        if (!p->len) {
            p->off = (uint32_t)pool_add(t, content, strlen(content));
            p->len = (uint32_t)strlen(content);
        }
        added_tok *a = &t->added[t->nadded++];
        a->id = id;
        a->off = (uint32_t)pool_add(t, content, strlen(content));
        a->len = (uint32_t)strlen(content);
        a->special = p->special;
    }
    sort_pool = t->pool;
    qsort(t->added, (size_t)t->nadded, sizeof *t->added, cmp_added_pool);
    for (int b = 0, k = 0; b <= 256; b++) {
        while (k < t->nadded && (uint8_t)t->pool[t->added[k].off] < b) k++;
        t->first_added[b] = k;
    }
    /* merges: "left right" strings or [left, right] pairs */
    size_t nm = json_array_size(merges);
    uint64_t mcap = 1;
    while (mcap < 2 * (uint64_t)nm + 2) mcap <<= 1;
    t->mmask = mcap - 1;
    t->mslot = tz_xmalloc(mcap * sizeof *t->mslot);
    for (uint64_t k = 0; k < mcap; k++) t->mslot[k].key = UINT64_MAX;
    /* lb: the two pieces' bytes, sized from their lengths (a piece's bytes are no more than
     * its characters) */
    size_t lbcap = 1 << 12;
    char *lb = tz_xmalloc(lbcap);
    json_array_foreach(merges, i, val) {
        const char *l = NULL, *r = NULL;
        size_t ll = 0, rl = 0;
        if (json_is_string(val)) {
            const char *s = json_string_value(val), *sp = strchr(s, ' ');
            if (sp) l = s, ll = (size_t)(sp - s), r = sp + 1, rl = strlen(r);
        } else if (json_is_array(val) && json_array_size(val) == 2) {
            l = json_string_value(json_array_get(val, 0));
            r = json_string_value(json_array_get(val, 1));
            ll = l ? strlen(l) : 0, rl = r ? strlen(r) : 0;
        }
        if (ll + rl > lbcap) lb = tz_xrealloc(lb, lbcap = ll + rl);
        long nl = l ? piece_bytes(t, l, ll, lb) : -1;
        long nr = r && nl > 0 ? piece_bytes(t, r, rl, lb + nl) : -1;
        int32_t a = nl > 0 ? vocab_get(t, lb, (size_t)nl) : -1;
        int32_t b = nr > 0 ? vocab_get(t, lb + nl, (size_t)nr) : -1;
        int32_t c = a >= 0 && b >= 0 ? vocab_get(t, lb, (size_t)(nl + nr)) : -1;
        if (c < 0) {
            snprintf(err, errlen, "%s: model.merges[%zu]: expected \"left right\" (or a pair) of "
                     "tokens in the vocabulary whose join is one too", file, i);
            free(lb);
            goto out;
        }
        uint64_t mkey = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
        for (uint64_t h = hash_u64(mkey) & t->mmask;; h = (h + 1) & t->mmask) {
            merge_slot *m = &t->mslot[h];
            if (m->key == mkey) break; /* a repeated merge keeps its first rank */
            if (m->key == UINT64_MAX) {
                *m = (merge_slot){mkey, (int32_t)i, c};
                break;
            }
        }
    }
    free(lb);
    /* single bytes: byte-level tokens, or SentencePiece <0xNN> */
    for (int b = 0; b < 256; b++) {
        char s[8];
        if (t->kind == KIND_BYTELEVEL) {
            s[0] = (char)b;
            t->byte_tok[b] = vocab_get(t, s, 1);
            if (t->byte_tok[b] < 0) {
                snprintf(err, errlen, "%s: byte-level vocabulary without a token for byte 0x%02X", file, b);
                goto out;
            }
        } else {
            snprintf(s, sizeof s, "<0x%02X>", b);
            t->byte_tok[b] = vocab_get(t, s, 6);
        }
    }
    if (t->kind == KIND_SPM && t->byte_fallback)
        for (int b = 0; b < 256; b++)
            if (t->byte_tok[b] < 0) {
                snprintf(err, errlen, "%s: byte_fallback without the token <0x%02X>", file, b);
                goto out;
            }
    const char *unk = jstr(model, "unk_token");
    t->unk = unk ? tz_tokenizer_find(t, unk) : -1;
    if (t->kind == KIND_SPM && !t->byte_fallback && t->unk < 0) {
        snprintf(err, errlen, "%s: a SentencePiece-style BPE needs byte_fallback or an unk_token", file);
        goto out;
    }
    /* words may be cut before each "▁" run when no token holds "▁" after other text */
    t->spm_split_ok = 1;
    for (int64_t id = 0; id < t->vocab && t->kind == KIND_SPM; id++) {
        const piece *p = &t->pieces[id];
        const char *s = t->pool + p->off;
        for (uint32_t k = 1; !p->added && k + 3 <= p->len; k++)
            if (!memcmp(s + k, "\u2581", 3) && !(k >= 3 && !memcmp(s + k - 3, "\u2581", 3)))
                t->spm_split_ok = 0;
    }
    /* BOS added by the post-processor: a TemplateProcessing (alone or in a Sequence) whose
     * single-sequence template starts with a special token */
    json_t *pp = json_object_get(root, "post_processor");
    json_t *procs = json_object_get(pp, "processors");
    for (size_t pi = 0; pi < (json_is_array(procs) ? json_array_size(procs) : 1); pi++) {
        json_t *q = json_is_array(procs) ? json_array_get(procs, pi) : pp;
        const char *qt = jstr(q, "type");
        json_t *first = json_array_get(json_object_get(q, "single"), 0);
        if (qt && !strcmp(qt, "TemplateProcessing") && json_object_get(first, "SpecialToken"))
            t->add_bos = 1;
    }
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a over (length, bytes) of each id's piece */
    for (int64_t id = 0; id < t->vocab; id++) {
        const piece *p = &t->pieces[id];
        uint8_t len[4] = {(uint8_t)p->len, (uint8_t)(p->len >> 8), (uint8_t)(p->len >> 16),
                          (uint8_t)(p->len >> 24)};
        for (int k = 0; k < 4; k++) h = (h ^ len[k]) * 0x100000001b3ull;
        for (uint32_t k = 0; k < p->len; k++) h = (h ^ (uint8_t)t->pool[p->off + k]) * 0x100000001b3ull;
    }
    t->digest = h ? h : 1;
    rc = 0;
out:
    free(buf);
    json_decref(root);
    return rc;
}

tz_tokenizer *tz_tokenizer_load(const char *path, char *err, size_t errlen) {
    tz_tokenizer *t = tz_xcalloc(1, sizeof *t);
    t->bos = t->eos = t->unk = -1;
    if (!strcmp(path, "bytes")) {
        t->kind = KIND_BYTES;
        t->vocab = 256;
        t->digest = TZ_TOKENS_DIGEST_BYTES;
        return t;
    }
    char file[4200], dir[4096];
    struct stat st;
    if (stat(path, &st)) {
        snprintf(err, errlen, "%s: no such tokenizer (expected a tokenizer.json, a model folder "
                 "holding one, or 'bytes')", path);
        free(t);
        return NULL;
    }
    if (S_ISDIR(st.st_mode)) {
        snprintf(dir, sizeof dir, "%s", path);
        snprintf(file, sizeof file, "%s/tokenizer.json", path);
        if (stat(file, &st)) {
            snprintf(err, errlen, "%s: the folder holds no tokenizer.json", path);
            free(t);
            return NULL;
        }
    } else {
        snprintf(file, sizeof file, "%s", path);
        snprintf(dir, sizeof dir, "%s", path);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0;
        else snprintf(dir, sizeof dir, ".");
    }
    if (load_json(t, file, err, errlen) || load_bos_eos(t, dir, err, errlen)) {
        tz_tokenizer_free(t);
        return NULL;
    }
    return t;
}

void tz_tokenizer_free(tz_tokenizer *t) {
    if (!t) return;
    free(t->pieces);
    free(t->pool);
    free(t->vslot);
    free(t->mslot);
    free(t->added);
    free(t->cslot);
    free(t->cpool);
    free(t->cids);
    free(t);
}

int64_t tz_tokenizer_vocab(const tz_tokenizer *t) { return t->vocab; }
int32_t tz_tokenizer_bos(const tz_tokenizer *t) { return t->bos; }
int32_t tz_tokenizer_eos(const tz_tokenizer *t) { return t->eos; }
int tz_tokenizer_add_bos(const tz_tokenizer *t) { return t->add_bos && t->bos >= 0; }
uint64_t tz_tokenizer_digest(const tz_tokenizer *t) { return t->digest; }
const char *tz_tokenizer_chat(const tz_tokenizer *t) { return t->chat; }

int tz_generation_eos(const char *dir, int32_t *ids, int cap) {
    char path[4200];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) return 0;
    json_t *c = tz_json_load_file(path, JSON_DECODE_INT_AS_REAL, NULL, 0);
    json_t *v = json_object_get(c, "eos_token_id");
    int n = 0;
    for (size_t i = 0; i < (json_is_array(v) ? json_array_size(v) : 1) && n < cap; i++) {
        json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
        if (json_is_number(e) && json_number_value(e) >= 0 && json_number_value(e) < 2147483647.0)
            ids[n++] = (int32_t)json_number_value(e);
    }
    json_decref(c);
    return n;
}

int32_t tz_tokenizer_find(const tz_tokenizer *t, const char *s) {
    if (t->kind == KIND_BYTES) return -1;
    size_t n = strlen(s);
    for (int i = 0; i < t->nadded; i++)
        if (t->added[i].len == n && !memcmp(t->pool + t->added[i].off, s, n)) return t->added[i].id;
    char buf[1 << 12];
    if (n >= sizeof buf) return -1;
    long m = piece_bytes(t, s, n, buf);
    return m > 0 ? vocab_get(t, buf, (size_t)m) : -1;
}

/* ---------------------------------------------------------------- BPE on one word */

typedef struct ids_out {
    int32_t *out;
    int64_t cap, n;
} ids_out;
static void emit(ids_out *o, int32_t id) {
    if (o->n < o->cap) o->out[o->n] = id;
    o->n++;
}

typedef struct heap_e {
    int32_t rank, pos;
} heap_e;
static int heap_less(heap_e a, heap_e b) { return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos); }
static void heap_push(heap_e *h, int *n, heap_e e) {
    int i = (*n)++;
    while (i > 0 && heap_less(e, h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = e;
}
static heap_e heap_pop(heap_e *h, int *n) {
    heap_e top = h[0], e = h[--(*n)];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(h[c + 1], h[c])) c++;
        if (!heap_less(h[c], e)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = e;
    return top;
}

typedef struct bpe_buf {
    int32_t *id, *prev, *next;
    heap_e *heap;
    int cap;
} bpe_buf;

/* BPE over the initial symbols sym[0..n): merges by rank, leftmost first among equals. */
static int bpe_run(const tz_tokenizer *t, bpe_buf *b, int n) {
    int hn = 0;
    for (int i = 0; i < n; i++) {
        b->prev[i] = i - 1;
        b->next[i] = i + 1 < n ? i + 1 : -1;
    }
    for (int i = 0; i + 1 < n; i++) {
        const merge_slot *m = merge_get(t, b->id[i], b->id[i + 1]);
        if (m) heap_push(b->heap, &hn, (heap_e){m->rank, i});
    }
    while (hn > 0) {
        heap_e e = heap_pop(b->heap, &hn);
        int i = e.pos, j = b->next[i];
        if (b->id[i] < 0 || j < 0) continue;
        const merge_slot *m = merge_get(t, b->id[i], b->id[j]);
        if (!m || m->rank != e.rank) continue; /* stale */
        b->id[i] = m->result;
        b->id[j] = -1;
        b->next[i] = b->next[j];
        if (b->next[j] >= 0) b->prev[b->next[j]] = i;
        if (b->prev[i] >= 0) {
            const merge_slot *p = merge_get(t, b->id[b->prev[i]], b->id[i]);
            if (p) heap_push(b->heap, &hn, (heap_e){p->rank, b->prev[i]});
        }
        if (b->next[i] >= 0) {
            const merge_slot *q = merge_get(t, b->id[i], b->id[b->next[i]]);
            if (q) heap_push(b->heap, &hn, (heap_e){q->rank, i});
        }
    }
    int k = 0;
    for (int i = 0; i >= 0 && i < n; i = b->next[i]) b->id[k++] = b->id[i];
    return k;
}

static void bpe_grow(bpe_buf *b, size_t n) {
    if ((int)n <= b->cap) return;
    b->cap = (int)n;
    b->id = tz_xrealloc(b->id, n * sizeof *b->id);
    b->prev = tz_xrealloc(b->prev, n * sizeof *b->prev);
    b->next = tz_xrealloc(b->next, n * sizeof *b->next);
    b->heap = tz_xrealloc(b->heap, 4 * n * sizeof *b->heap);
}

/* Encodes one word (already normalized) into b->id; returns the count. */
static int encode_word(const tz_tokenizer *t, bpe_buf *b, const uint8_t *s, size_t n) {
    if (t->ignore_merges) {
        int32_t id = vocab_get(t, (const char *)s, n);
        if (id >= 0) {
            bpe_grow(b, 1);
            b->id[0] = id;
            return 1;
        }
    }
    bpe_grow(b, n + 1);
    int k = 0;
    if (t->kind == KIND_BYTELEVEL) {
        for (size_t i = 0; i < n; i++) b->id[k++] = t->byte_tok[s[i]];
        return bpe_run(t, b, k);
    }
    /* SentencePiece: characters; unknown ones to bytes <0xNN> (or unk) */
    for (size_t i = 0; i < n;) {
        int len;
        utf8_next(s + i, n - i, &len);
        int32_t id = vocab_get(t, (const char *)s + i, (size_t)len);
        if (id >= 0) {
            b->id[k++] = id;
        } else if (t->byte_fallback) {
            for (int q = 0; q < len; q++) b->id[k++] = t->byte_tok[s[i + q]];
        } else if (!(t->fuse_unk && k > 0 && b->id[k - 1] == t->unk)) {
            b->id[k++] = t->unk;
        }
        i += (size_t)len;
    }
    return bpe_run(t, b, k);
}

/* A word through the cache. */
static void word_out(tz_tokenizer *t, bpe_buf *b, const uint8_t *s, size_t n, ids_out *o) {
    if (n == 0) return;
    uint64_t h = hash_bytes((const char *)s, n);
    if (n <= 64 && t->cslot) {
        for (uint64_t q = h & t->cmask;; q = (q + 1) & t->cmask) {
            cache_slot *c = &t->cslot[q];
            if (!c->len) break;
            if (c->len == n && !memcmp(t->cpool + c->off, s, n)) {
                for (uint32_t i = 0; i < c->nids; i++) emit(o, t->cids[c->ids_off + i]);
                return;
            }
        }
    }
    int k = encode_word(t, b, s, n);
    for (int i = 0; i < k; i++) emit(o, b->id[i]);
    if (n > 64) return;
    if (!t->cslot || t->cused * 2 >= t->cmask) {
        if (t->cslot && t->cmask >= (1u << 20) - 1) { /* full: start over */
            memset(t->cslot, 0, (t->cmask + 1) * sizeof *t->cslot);
            t->cused = 0, t->cpool_n = 0, t->cids_n = 0;
        } else {
            uint64_t ncap = t->cslot ? 2 * (t->cmask + 1) : 4096;
            cache_slot *ns = tz_xcalloc(ncap, sizeof *ns);
            for (uint64_t q = 0; t->cslot && q <= t->cmask; q++) {
                cache_slot c = t->cslot[q];
                if (!c.len) continue;
                uint64_t r = hash_bytes(t->cpool + c.off, c.len) & (ncap - 1);
                while (ns[r].len) r = (r + 1) & (ncap - 1);
                ns[r] = c;
            }
            free(t->cslot);
            t->cslot = ns;
            t->cmask = ncap - 1;
        }
    }
    if (t->cpool_n + n > t->cpool_cap) {
        t->cpool_cap = 2 * (t->cpool_n + n) + 65536;
        t->cpool = tz_xrealloc(t->cpool, t->cpool_cap);
    }
    if (t->cids_n + (size_t)k > t->cids_cap) {
        t->cids_cap = 2 * (t->cids_n + (size_t)k) + 65536;
        t->cids = tz_xrealloc(t->cids, t->cids_cap * sizeof *t->cids);
    }
    uint64_t q = h & t->cmask;
    while (t->cslot[q].len) q = (q + 1) & t->cmask;
    t->cslot[q] = (cache_slot){(uint32_t)t->cpool_n, (uint32_t)n, (uint32_t)t->cids_n, (uint32_t)k};
    memcpy(t->cpool + t->cpool_n, s, n);
    t->cpool_n += n;
    memcpy(t->cids + t->cids_n, b->id, (size_t)k * sizeof *t->cids);
    t->cids_n += (size_t)k;
    t->cused++;
}

/* ---------------------------------------------------------------- encoding */

/* A run of text with no added token in it. first: the segment starts the text. */
static void encode_segment(tz_tokenizer *t, bpe_buf *b, const uint8_t *s, size_t n, int first,
                           ids_out *o, uint8_t **norm, size_t *norm_cap, uint8_t **nfc,
                           size_t *nfc_cap) {
    if (n == 0) return;
    if (t->nfc) s = tz_nfc(s, n, nfc, nfc_cap, &n);
    if (t->kind == KIND_BYTELEVEL) {
        if (t->add_prefix_space && s[0] != ' ') {
            if (n + 1 > *norm_cap) *norm = tz_xrealloc(*norm, *norm_cap = 2 * n + 16);
            (*norm)[0] = ' ';
            memcpy(*norm + 1, s, n);
            s = *norm, n++;
        }
        if (t->regex == RE_NONE) {
            word_out(t, b, s, n, o);
            return;
        }
        for (size_t i = 0; i < n;) {
            size_t k = next_piece(t->regex, s, n, i);
            word_out(t, b, s + i, k, o);
            i += k;
        }
        return;
    }
    /* SentencePiece: "▁" before the segment, every space to "▁" */
    size_t cap = 3 * n + 3;
    if (cap > *norm_cap) *norm = tz_xrealloc(*norm, *norm_cap = cap);
    uint8_t *d = *norm;
    size_t m = 0;
    if (t->spm_prepend == 1 || (t->spm_prepend == 2 && first)) memcpy(d, "\u2581", 3), m = 3;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') memcpy(d + m, "\u2581", 3), m += 3;
        else d[m++] = s[i];
    }
    if (!t->spm_split_ok) {
        word_out(t, b, d, m, o);
        return;
    }
    /* words: a run of "▁" and the text up to the next "▁" */
    size_t w = 0;
    for (size_t i = 0; i < m;) {
        int sp = i + 3 <= m && !memcmp(d + i, "\u2581", 3);
        if (sp && i > w && !(i >= 3 && !memcmp(d + i - 3, "\u2581", 3))) {
            word_out(t, b, d + w, i - w, o);
            w = i;
        }
        i += sp ? 3 : 1;
    }
    word_out(t, b, d + w, m - w, o);
}

int64_t tz_tokenizer_encode(const tz_tokenizer *tc, const char *text, size_t len, int specials,
                            int32_t *out, int64_t cap, int64_t *needed, char *err, size_t errlen) {
    tz_tokenizer *t = (tz_tokenizer *)tc; /* the word cache changes; the tokens do not */
    ids_out o = {out, cap < 0 ? 0 : cap, 0};
    const uint8_t *s = (const uint8_t *)text;
    if (t->kind == KIND_BYTES) {
        for (size_t i = 0; i < len; i++) emit(&o, s[i]);
    } else {
        bpe_buf b = {0};
        uint8_t *norm = NULL, *nfc = NULL;
        size_t norm_cap = 0, nfc_cap = 0, seg = 0;
        for (size_t i = 0; i < len;) {
            int32_t hit = -1;
            uint32_t hitlen = 0;
            for (int32_t k = t->first_added[s[i]]; k < t->first_added[s[i] + 1]; k++) {
                const added_tok *a = &t->added[k];
                if ((a->special && !specials) || a->len > len - i) continue;
                if (!memcmp(t->pool + a->off, s + i, a->len)) {
                    hit = a->id, hitlen = a->len;
                    break; /* longest first */
                }
            }
            if (hit < 0) {
                i++;
                continue;
            }
            encode_segment(t, &b, s + seg, i - seg, seg == 0, &o, &norm, &norm_cap, &nfc, &nfc_cap);
            emit(&o, hit);
            i += hitlen;
            seg = i;
        }
        encode_segment(t, &b, s + seg, len - seg, seg == 0, &o, &norm, &norm_cap, &nfc, &nfc_cap);
        free(norm), free(nfc);
        free(b.id), free(b.prev), free(b.next), free(b.heap);
        for (int64_t i = 0; i < o.n && i < o.cap; i++)
            if (out[i] < 0) {
                snprintf(err, errlen, "text has a character the tokenizer cannot encode (no unk token)");
                if (needed) *needed = o.n;
                return -1;
            }
    }
    if (needed) *needed = o.n;
    return o.n < o.cap ? o.n : o.cap;
}

/* ---------------------------------------------------------------- decoding */

int64_t tz_tokenizer_decode(const tz_tokenizer *t, const int32_t *ids, int64_t n, int skip_special,
                            char *buf, size_t cap) {
    size_t m = 0;
    if (cap == 0) return -1;
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->vocab) return -1;
        char one[1];
        const char *p;
        size_t len;
        if (t->kind == KIND_BYTES) {
            one[0] = (char)ids[i];
            p = one, len = 1;
        } else {
            const piece *q = &t->pieces[ids[i]];
            if (q->special && skip_special) continue;
            p = t->pool + q->off, len = q->len;
            if (t->kind == KIND_SPM && !q->added) {
                if (t->byte_fallback && len == 6 && !memcmp(p, "<0x", 3) && p[5] == '>' &&
                    t->byte_tok[strtol(p + 3, NULL, 16) & 255] == ids[i]) {
                    one[0] = (char)strtol(p + 3, NULL, 16);
                    p = one, len = 1;
                } else { /* "\u2581" to " " */
                    for (size_t k = 0; k < len && m + 1 < cap;) {
                        int sp = k + 3 <= len && !memcmp(p + k, "\u2581", 3);
                        buf[m++] = sp ? ' ' : p[k];
                        k += sp ? 3 : 1;
                    }
                    continue;
                }
            }
        }
        for (size_t k = 0; k < len && m + 1 < cap; k++) buf[m++] = p[k];
    }
    if (t->strip_lead && m > 0 && buf[0] == ' ') memmove(buf, buf + 1, --m);
    buf[m] = 0;
    return (int64_t)m;
}
