/* Text and JSONL to token files with a tokenizer: chat templates and the loss mask. Each part
 * of a template (a header, a message's content) is encoded on its own with special tokens in
 * the data taken as text, so a record cannot smuggle in a control token; the template's own
 * special tokens are inserted by id. */
#include "io/prep.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "io/fsutil.h"
#include "io/tokenizer.h"
#include "io/tokens.h"

typedef struct tokbuf {
    uint32_t *tok;
    uint8_t *mask;
    int64_t n, cap;
    int32_t *scratch;
    int64_t scap;
} tokbuf;

static void tb_push(tokbuf *b, uint32_t id, int trained) {
    if (b->n == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 1 << 16;
        b->tok = tz_xrealloc(b->tok, (size_t)b->cap * sizeof *b->tok);
        b->mask = tz_xrealloc(b->mask, (size_t)b->cap);
    }
    b->tok[b->n] = id;
    b->mask[b->n++] = (uint8_t)(trained != 0);
}

static int tb_text(tokbuf *b, const tz_tokenizer *t, const char *s, size_t len, int trained,
                   char *err, size_t errlen) {
    int64_t need = 0;
    for (;;) {
        int64_t n = tz_tokenizer_encode(t, s, len, 0, b->scratch, b->scap, &need, err, errlen);
        if (n < 0) return 1;
        if (need <= b->scap) break;
        b->scap = need + 1024;
        b->scratch = tz_xrealloc(b->scratch, (size_t)b->scap * sizeof *b->scratch);
    }
    for (int64_t i = 0; i < need; i++) tb_push(b, (uint32_t)b->scratch[i], trained);
    return 0;
}

static tz_tokenizer *open_tokenizer(const char *path, char *err, size_t errlen) {
    char e[1024];
    tz_tokenizer *t = tz_tokenizer_load(path, e, sizeof e);
    if (!t) snprintf(err, errlen, "--tokenizer %s: %s", path, e);
    return t;
}

static int write_split(const char *out_path, const char *val_path, const tokbuf *b, int64_t cut,
                       int masked, const tz_tokenizer *t, const char *what, char *err,
                       size_t errlen) {
    const uint32_t vocab = (uint32_t)tz_tokenizer_vocab(t);
    const uint64_t dg = tz_tokenizer_digest(t);
    int64_t trained = 0;
    for (int64_t i = 0; masked && i < cut; i++) trained += b->mask[i];
    int rc = tz_tokens_write_tagged(out_path, b->tok, masked ? b->mask : NULL, cut, vocab, dg, err,
                                    errlen);
    if (rc) return rc;
    if (masked)
        printf("wrote %s: %lld tokens (%s, vocab %u), %lld of them trained (loss mask)\n", out_path,
               (long long)cut, what, vocab, (long long)trained);
    else
        printf("wrote %s: %lld tokens (%s, vocab %u)\n", out_path, (long long)cut, what, vocab);
    if (cut < b->n) {
        rc = tz_tokens_write_tagged(val_path, b->tok + cut, masked ? b->mask + cut : NULL,
                                    b->n - cut, vocab, dg, err, errlen);
        if (!rc) printf("wrote %s: %lld tokens (validation)\n", val_path, (long long)(b->n - cut));
    }
    return rc;
}

static int check_fraction(double f, char *err, size_t errlen) {
    if (f >= 0.0 && f < 1.0) return 0;
    snprintf(err, errlen, "--val-fraction %g: expected a number in [0, 1)", f);
    return 1;
}

int tz_prep_text(const char *tokenizer, const char *in_path, const char *out_path,
                 const char *val_path, double val_fraction, char *err, size_t errlen) {
    if (check_fraction(val_fraction, err, errlen)) return 1;
    tz_tokenizer *t = open_tokenizer(tokenizer, err, errlen);
    if (!t) return 1;
    size_t n;
    char *text = tz_read_file(in_path, &n, err, errlen);
    if (text && n == 0) {
        snprintf(err, errlen, "%s: empty file", in_path);
        free(text), text = NULL;
    }
    tokbuf b = {0};
    int rc = !text;
    if (!rc) {
        char e[512];
        rc = tb_text(&b, t, text, n, 1, e, sizeof e);
        if (rc) snprintf(err, errlen, "%s: %s", in_path, e);
    }
    if (!rc) {
        int64_t cut = b.n - (int64_t)((double)b.n * val_fraction);
        char what[64];
        snprintf(what, sizeof what, "%s", "tokenizer");
        rc = write_split(out_path, val_path, &b, cut, 0, t, what, err, errlen);
    }
    free(text);
    free(b.tok), free(b.mask), free(b.scratch);
    tz_tokenizer_free(t);
    return rc;
}

/* ---------------------------------------------------------------- JSONL */

enum { T_LLAMA3, T_LLAMA2, T_CHATML, T_PLAIN };
static const char *const tmpl_names[] = {"llama3", "llama2", "chatml", "plain", NULL};

typedef struct msg {
    const char *role, *content;
    size_t len;
} msg;

typedef struct jctx {
    const tz_tokenizer *t;
    int tmpl;
    int32_t bos, eos, sh, eh, eot, ims, ime; /* the template's special tokens */
    const char *file;
    long line;
    char *err;
    size_t errlen;
} jctx;

#define JFAIL(c, ...)                                                          \
    do {                                                                       \
        int at_ = snprintf((c)->err, (c)->errlen, "%s:%ld: ", (c)->file, (c)->line); \
        if (at_ > 0 && (size_t)at_ < (c)->errlen)                              \
            snprintf((c)->err + at_, (c)->errlen - (size_t)at_, __VA_ARGS__);  \
        return 1;                                                              \
    } while (0)

static const char *jtype(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER:
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

static int enc(jctx *c, tokbuf *b, const char *s, size_t len, int trained) {
    char e[512];
    if (tb_text(b, c->t, s, len, trained, e, sizeof e)) JFAIL(c, "%s", e);
    return 0;
}
static int encs(jctx *c, tokbuf *b, const char *s, int trained) {
    return enc(c, b, s, strlen(s), trained);
}

/* One record's messages (roles checked) through the template. gen: the messages end with a
 * user message and the assistant's turn is opened after it, as a prompt for generation. */
static int render(jctx *c, tokbuf *b, const msg *m, int nm, int gen) {
    int rc = 0;
    if (c->tmpl == T_LLAMA3) {
        tb_push(b, (uint32_t)c->bos, 0);
        for (int i = 0; i < nm && !rc; i++) {
            int a = !strcmp(m[i].role, "assistant");
            tb_push(b, (uint32_t)c->sh, 0);
            rc = encs(c, b, m[i].role, 0);
            tb_push(b, (uint32_t)c->eh, 0);
            rc = rc || encs(c, b, "\n\n", 0) || enc(c, b, m[i].content, m[i].len, a);
            tb_push(b, (uint32_t)c->eot, a);
        }
        if (gen && !rc) {
            tb_push(b, (uint32_t)c->sh, 0);
            rc = encs(c, b, "assistant", 0);
            tb_push(b, (uint32_t)c->eh, 0);
            rc = rc || encs(c, b, "\n\n", 0);
        }
        return rc;
    }
    if (c->tmpl == T_CHATML) {
        for (int i = 0; i < nm && !rc; i++) {
            int a = !strcmp(m[i].role, "assistant");
            tb_push(b, (uint32_t)c->ims, 0);
            rc = encs(c, b, m[i].role, 0) || encs(c, b, "\n", 0) ||
                 enc(c, b, m[i].content, m[i].len, a);
            tb_push(b, (uint32_t)c->ime, a);
            rc = rc || encs(c, b, "\n", 0);
        }
        if (gen && !rc) {
            tb_push(b, (uint32_t)c->ims, 0);
            rc = encs(c, b, "assistant\n", 0);
        }
        return rc;
    }
    if (c->tmpl == T_PLAIN) {
        if (c->bos >= 0) tb_push(b, (uint32_t)c->bos, 0);
        for (int i = 0; i < nm && !rc; i++)
            rc = enc(c, b, m[i].content, m[i].len, !strcmp(m[i].role, "assistant"));
        if (c->eos >= 0 && !gen) tb_push(b, (uint32_t)c->eos, 1);
        return rc;
    }
    /* llama2: <s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s> per turn */
    int i = 0;
    const msg *sys = NULL;
    if (nm > 0 && !strcmp(m[0].role, "system")) sys = &m[0], i = 1;
    for (; i < nm && !rc; i += 2) {
        const int open = gen && i + 1 == nm; /* the last user message, answered by generation */
        if (strcmp(m[i].role, "user") || (!open && (i + 1 >= nm || strcmp(m[i + 1].role, "assistant"))))
            JFAIL(c, "template llama2 needs user and assistant messages in turn (after an "
                     "optional system message); message %d is %s", i, m[i].role);
        size_t n = m[i].len + (sys ? sys->len : 0) + 64;
        char *s = tz_xmalloc(n);
        int k = 0;
        if (sys && i == 1)
            k = snprintf(s, n, "[INST] <<SYS>>\n%.*s\n<</SYS>>\n\n", (int)sys->len, sys->content);
        else
            k = snprintf(s, n, "[INST] ");
        memcpy(s + k, m[i].content, m[i].len);
        memcpy(s + k + m[i].len, " [/INST]", 8);
        tb_push(b, (uint32_t)c->bos, 0);
        rc = enc(c, b, s, (size_t)k + m[i].len + 8, 0) ||
             (!open && enc(c, b, m[i + 1].content, m[i + 1].len, 1));
        if (!open) tb_push(b, (uint32_t)c->eos, 1);
        free(s);
    }
    return rc;
}

static int str_field(jctx *c, json_t *o, const char *key, const char **s, size_t *len) {
    json_t *v = json_object_get(o, key);
    if (!v) return 0;
    if (!json_is_string(v)) JFAIL(c, "\"%s\" must be a string, got %s", key, jtype(v));
    *s = json_string_value(v);
    *len = json_string_length(v);
    return 0;
}

static int record(jctx *c, tokbuf *b, const char *line) {
    json_error_t je;
    json_t *o = json_loads(line, JSON_DECODE_INT_AS_REAL, &je);
    if (!o) JFAIL(c, "not valid JSON: %s (column %d)", je.text, je.column);
    msg m[256];
    int nm = 0, rc = 0;
    const char *p = NULL, *r = NULL, *sys = NULL, *text = NULL;
    size_t pl = 0, rl = 0, sl = 0, tl = 0;
    json_t *msgs = json_object_get(o, "messages");
    if (!json_is_object(o)) {
        int at = snprintf(c->err, c->errlen, "%s:%ld: expected a JSON object, got %s", c->file,
                          c->line, jtype(o));
        (void)at;
        json_decref(o);
        return 1;
    }
    if (str_field(c, o, "prompt", &p, &pl) || str_field(c, o, "response", &r, &rl) ||
        str_field(c, o, "system", &sys, &sl) || str_field(c, o, "text", &text, &tl)) {
        json_decref(o);
        return 1;
    }
    if (text && !msgs && !p && !r) {
        if (c->bos >= 0) tb_push(b, (uint32_t)c->bos, 0);
        rc = enc(c, b, text, tl, 1);
        if (c->eos >= 0) tb_push(b, (uint32_t)c->eos, 1);
        json_decref(o);
        return rc;
    }
    if (msgs) {
        if (p || r) {
            json_decref(o);
            JFAIL(c, "has both \"messages\" and \"prompt\"/\"response\": expected one of them");
        }
        if (!json_is_array(msgs) || json_array_size(msgs) == 0 || json_array_size(msgs) > 256) {
            /* described before the record is freed: msgs is part of it */
            char got[64];
            if (!json_is_array(msgs)) snprintf(got, sizeof got, "%s", jtype(msgs));
            else if (json_array_size(msgs) == 0) snprintf(got, sizeof got, "an empty list");
            else snprintf(got, sizeof got, "a list of %zu", json_array_size(msgs));
            json_decref(o);
            JFAIL(c, "\"messages\" must be a list of 1 to 256 messages, got %s", got);
        }
        size_t i;
        json_t *e;
        int has_a = 0;
        json_array_foreach(msgs, i, e) {
            json_t *role = json_object_get(e, "role"), *content = json_object_get(e, "content");
            const char *why = !json_is_object(e)          ? "is not an object"
                              : !json_is_string(role)     ? "has no \"role\" string"
                              : !json_is_string(content) ? "has no \"content\" string"
                                                          : NULL;
            if (why) {
                json_decref(o);
                JFAIL(c, "messages[%zu] %s (expected {\"role\": ..., \"content\": ...})", i, why);
            }
            const char *rs = json_string_value(role);
            if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant")) {
                char bad[64];
                snprintf(bad, sizeof bad, "%s", rs);
                json_decref(o);
                JFAIL(c, "messages[%zu]: role \"%s\": expected system, user or assistant", i, bad);
            }
            has_a |= !strcmp(rs, "assistant");
            m[nm++] = (msg){rs, json_string_value(content), json_string_length(content)};
        }
        if (!has_a) {
            json_decref(o);
            JFAIL(c, "no assistant message: nothing to train on");
        }
    } else {
        if (!p || !r) {
            json_decref(o);
            JFAIL(c, "expected \"prompt\" and \"response\" strings, a \"messages\" list, or a "
                     "\"text\" string; %s is missing", p ? "\"response\"" : "\"prompt\"");
        }
        if (sys) m[nm++] = (msg){"system", sys, sl};
        m[nm++] = (msg){"user", p, pl};
        m[nm++] = (msg){"assistant", r, rl};
    }
    rc = render(c, b, m, nm, 0);
    json_decref(o);
    return rc;
}

static int need_token(jctx *c, const char *tmpl, const char *name, int32_t *id, const char *tok) {
    if (*id >= 0) return 0;
    *id = tz_tokenizer_find(c->t, name);
    if (*id >= 0) return 0;
    snprintf(c->err, c->errlen, "--template %s needs the token %s, which --tokenizer %s does not have",
             tmpl, name, tok);
    return 1;
}

/* c's template: tmpl by name, or NULL for the tokenizer's default; its special tokens. */
static int setup(jctx *c, const tz_tokenizer *t, const char *tmpl, const char *tokenizer) {
    char *err = c->err;
    size_t errlen = c->errlen;
    c->tmpl = -1;
    if (tmpl) {
        for (int i = 0; tmpl_names[i]; i++)
            if (!strcmp(tmpl, tmpl_names[i])) c->tmpl = i;
        if (c->tmpl < 0) {
            snprintf(err, errlen, "--template %s: expected llama3, llama2, chatml or plain", tmpl);
            return 1;
        }
    }
    c->t = t;
    c->bos = tz_tokenizer_bos(t), c->eos = tz_tokenizer_eos(t);
    c->sh = c->eh = c->eot = c->ims = c->ime = -1;
    if (c->tmpl < 0)
        c->tmpl = tz_tokenizer_find(t, "<|start_header_id|>") >= 0 ? T_LLAMA3
                  : tz_tokenizer_find(t, "\u2581") >= 0      ? T_LLAMA2
                                                                : T_PLAIN;
    const char *tn = tmpl_names[c->tmpl];
    int rc = 0;
    if (c->tmpl == T_LLAMA3)
        rc = need_token(c, tn, "<|begin_of_text|>", &c->bos, tokenizer) ||
             need_token(c, tn, "<|start_header_id|>", &c->sh, tokenizer) ||
             need_token(c, tn, "<|end_header_id|>", &c->eh, tokenizer) ||
             need_token(c, tn, "<|eot_id|>", &c->eot, tokenizer);
    else if (c->tmpl == T_CHATML)
        rc = need_token(c, tn, "<|im_start|>", &c->ims, tokenizer) ||
             need_token(c, tn, "<|im_end|>", &c->ime, tokenizer);
    else if (c->tmpl == T_LLAMA2 && (c->bos < 0 || c->eos < 0)) {
        snprintf(err, errlen, "--template llama2 needs BOS and EOS tokens; --tokenizer %s names "
                 "none (tokenizer_config.json or config.json beside it)", tokenizer);
        rc = 1;
    }
    return rc;
}

int tz_prep_jsonl(const char *tokenizer, const char *in_path, const char *out_path,
                  const char *val_path, double val_fraction, const char *tmpl, char *err,
                  size_t errlen) {
    if (check_fraction(val_fraction, err, errlen)) return 1;
    jctx c = {0};
    c.file = in_path, c.err = err, c.errlen = errlen;
    tz_tokenizer *t = open_tokenizer(tokenizer, err, errlen);
    if (!t) return 1;
    int rc = setup(&c, t, tmpl, tokenizer);
    const char *tn = tmpl_names[c.tmpl < 0 ? T_PLAIN : c.tmpl];
    FILE *f = NULL;
    if (!rc) { /* a FIFO is refused, not waited on */
        const char *kind;
        int fd = tz_open_regular(in_path, &kind);
        if (fd >= 0 && !(f = fdopen(fd, "rb"))) close(fd);
        if (!f && kind) snprintf(err, errlen, "%s: not a regular file (%s), expected JSONL records", in_path, kind);
        else if (!f) snprintf(err, errlen, "%s: cannot open: %s", in_path, strerror(errno));
        rc = !f;
    }
    tokbuf b = {0};
    int64_t *starts = NULL, nrec = 0, rcap = 0;
    char *line = NULL;
    size_t lcap = 0;
    ssize_t got;
    while (!rc && (got = getline(&line, &lcap, f)) > 0) {
        c.line++;
        if ((size_t)got != strlen(line)) {
            snprintf(err, errlen, "%s:%ld: a NUL byte in the line", in_path, c.line);
            rc = 1;
            break;
        }
        size_t k = strspn(line, " \t\r\n");
        if (!line[k]) continue; /* blank */
        if (nrec == rcap) starts = tz_xrealloc(starts, (size_t)(rcap = 2 * rcap + 1024) * sizeof *starts);
        starts[nrec++] = b.n;
        rc = record(&c, &b, line);
    }
    free(line);
    if (f) fclose(f);
    if (!rc && nrec == 0) {
        snprintf(err, errlen, "%s: no records (expected one JSON object per line)", in_path);
        rc = 1;
    }
    if (!rc) {
        int64_t nval = (int64_t)((double)nrec * val_fraction);
        int64_t cut = nval > 0 ? starts[nrec - nval] : b.n;
        char what[96];
        snprintf(what, sizeof what, "%lld records, template %s", (long long)(nrec - nval), tn);
        rc = write_split(out_path, val_path, &b, cut, 1, t, what, err, errlen);
    }
    free(starts);
    free(b.tok), free(b.mask), free(b.scratch);
    tz_tokenizer_free(t);
    return rc;
}

/* ---------------------------------------------------------------- prompts for generation */

int64_t tz_chat_prompt(const tz_tokenizer *t, const char *tmpl, const char *system,
                       const char *user, int32_t **ids, char *tmpl_used, size_t tulen, int32_t *end,
                       char *err, size_t errlen) {
    jctx c = {0};
    c.file = "prompt", c.line = 1, c.err = err, c.errlen = errlen;
    if (setup(&c, t, tmpl, "of the model")) return -1;
    msg m[2];
    int nm = 0;
    if (system) m[nm++] = (msg){"system", system, strlen(system)};
    m[nm++] = (msg){"user", user, strlen(user)};
    tokbuf b = {0};
    int rc = render(&c, &b, m, nm, 1);
    free(b.mask), free(b.scratch);
    if (rc) {
        free(b.tok);
        return -1;
    }
    snprintf(tmpl_used, tulen, "%s", tmpl_names[c.tmpl]);
    *end = c.tmpl == T_LLAMA3 ? c.eot : c.tmpl == T_CHATML ? c.ime : c.eos;
    *ids = tz_xmalloc((size_t)(b.n + 1) * sizeof **ids);
    for (int64_t i = 0; i < b.n; i++) (*ids)[i] = (int32_t)b.tok[i];
    free(b.tok);
    return b.n;
}
