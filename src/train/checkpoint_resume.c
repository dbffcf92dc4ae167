/* Resuming: the newest complete checkpoint of the run found and checked (the marker against
 * checkpoint.json, checkpoint.json in itself down to its ZeRO plan, every shard's size and
 * CRC-32, the read itself; falling back past refused ones), the saved run checked against
 * this one (tensors, optimizer, batch, settings key by key), and every rank's owned slices
 * read through the saved plan (any rank count). Writing is checkpoint.c's. */
#include <errno.h>
#include <jansson.h>
#include <libconfig.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "io/ckpt_h5.h"
#include "io/fsutil.h"
#include "train/checkpoint.h"
#include "train/checkpoint_util.h"

typedef struct ck_meta {
    int64_t step, steps, global_batch, next_row, ranks, micro_batch, grad_accum;
    int64_t stage, world, nb, nt, na, bucket_elems, align, flat_numel, shard_numel;
    tz_ckpt_bucket *b;
    int64_t *padded;          /* per bucket */
    tz_ckpt_tensor *t;
    int64_t *bytes, *crc;     /* per shard file */
    char arrays[TZ_SHARD_MAX_ARRAYS][32];
    char run_id[TZ_RUN_ID_MAX];
    int have_eval;
    double eval0, best;
    int64_t eval0_count, best_count, best_step;
    char *config;             /* the effective configuration it was written with, or NULL */
} ck_meta;

static void meta_free(ck_meta *m) {
    free(m->b);
    free(m->padded);
    free(m->t);
    free(m->bytes);
    free(m->crc);
    free(m->config);
    memset(m, 0, sizeof *m);
}

/* An integer member in [lo, hi]; -1 when missing, of another type or out of range. */
static int get_int(json_t *o, const char *key, int64_t *v, int64_t lo, int64_t hi) {
    json_t *x = json_object_get(o, key);
    if (!json_is_integer(x)) return -1;
    *v = json_integer_value(x);
    return *v < lo || *v > hi ? -1 : 0;
}

#define BIG ((int64_t)1 << 50) /* bound of element counts and offsets: no overflow in sums */

/* Parses checkpoint.json (every field typed and in range); 0, or non-zero with a message
 * naming the field. */
static int meta_parse(const char *text, ck_meta *m, char *err, size_t n) {
    memset(m, 0, sizeof *m);
    json_error_t je;
    json_t *j = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    if (!j) return tz_errf(err, n, "checkpoint.json: line %d: %s", je.line, je.text);
    int rc = 0;
    const char *bad = NULL;
    json_t *d = json_object_get(j, "data"), *z = json_object_get(j, "zero"), *e = json_object_get(j, "eval");
    json_t *bs = json_object_get(z, "buckets"), *ts = json_object_get(j, "tensors");
    json_t *sh = json_object_get(j, "shards"), *ar = json_object_get(json_object_get(j, "optimizer"), "arrays");
    int64_t version = 0;
    const char *fmt = json_string_value(json_object_get(j, "format"));
    json_t *rid = json_object_get(j, "run_id");
    if (!fmt || strcmp(fmt, TZ_CKPT_FORMAT) || get_int(j, "version", &version, 1, 1 << 20) ||
        version != TZ_CKPT_VERSION)
        rc = tz_errf(err, n, "checkpoint.json: not a %s version %d file", TZ_CKPT_FORMAT, TZ_CKPT_VERSION);
    else if ((bad = "step", get_int(j, "step", &m->step, 1, BIG)) ||
             (bad = "steps", get_int(j, "steps", &m->steps, 1, BIG)) ||
             (bad = "data.global_batch", get_int(d, "global_batch", &m->global_batch, 1, 1 << 30)) ||
             (bad = "data.next_row", get_int(d, "next_row", &m->next_row, 0, BIG)) ||
             (bad = "data.ranks", get_int(d, "ranks", &m->ranks, 1, 1 << 20)) ||
             (bad = "data.micro_batch", get_int(d, "micro_batch", &m->micro_batch, 1, 1 << 30)) ||
             (bad = "data.grad_accum", get_int(d, "grad_accum", &m->grad_accum, 1, 1 << 30)) ||
             (bad = "zero.stage", get_int(z, "stage", &m->stage, 0, 2)) ||
             (bad = "zero.world", get_int(z, "world", &m->world, 1, 1 << 20)) ||
             (bad = "zero.bucket_elems", get_int(z, "bucket_elems", &m->bucket_elems, 1, BIG)) ||
             (bad = "zero.align", get_int(z, "align", &m->align, 1, 1 << 20)) ||
             (bad = "zero.flat_numel", get_int(z, "flat_numel", &m->flat_numel, 0, BIG)) ||
             (bad = "zero.shard_numel", get_int(z, "shard_numel", &m->shard_numel, 0, BIG)) ||
             (bad = "zero.buckets", !json_is_array(bs) || json_array_size(bs) < 1 ||
                                    json_array_size(bs) > (1u << 24)) ||
             (bad = "tensors", !json_is_array(ts) || json_array_size(ts) < 1 ||
                               json_array_size(ts) > (1u << 24)) ||
             (bad = "shards", !json_is_array(sh) || (int64_t)json_array_size(sh) != m->world) ||
             (bad = "optimizer.arrays", !json_is_array(ar) || json_array_size(ar) < 1 ||
                                        json_array_size(ar) > TZ_SHARD_MAX_ARRAYS) ||
             (bad = "run_id", rid && (!json_is_string(rid) || strlen(json_string_value(rid)) < 8 ||
                                      strlen(json_string_value(rid)) >= TZ_RUN_ID_MAX ||
                                      strspn(json_string_value(rid), "0123456789abcdef") !=
                                          strlen(json_string_value(rid)))) ||
             (bad = "config", json_object_get(j, "config") && !json_is_string(json_object_get(j, "config"))))
        rc = tz_errf(err, n, "checkpoint.json: %s missing, malformed or out of range", bad);
    if (!rc) {
        if (rid) snprintf(m->run_id, sizeof m->run_id, "%s", json_string_value(rid));
        m->nb = (int64_t)json_array_size(bs);
        m->nt = (int64_t)json_array_size(ts);
        m->na = (int64_t)json_array_size(ar);
        m->b = tz_xcalloc((size_t)m->nb + 1, sizeof *m->b);
        m->padded = tz_xcalloc((size_t)m->nb + 1, sizeof *m->padded);
        m->t = tz_xcalloc((size_t)m->nt + 1, sizeof *m->t);
        m->bytes = tz_xcalloc((size_t)m->world, sizeof *m->bytes);
        m->crc = tz_xcalloc((size_t)m->world, sizeof *m->crc);
        for (int64_t i = 0; !rc && i < m->nb; i++) {
            json_t *b = json_array_get(bs, (size_t)i);
            int64_t v[5];
            if (!json_is_array(b) || json_array_size(b) != 5) rc = -1;
            for (int k = 0; !rc && k < 5; k++) {
                json_t *x = json_array_get(b, (size_t)k);
                if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > BIG) rc = -1;
                else v[k] = json_integer_value(x);
            }
            if (!rc) m->b[i] = (tz_ckpt_bucket){v[0], v[1], v[3], v[4]}, m->padded[i] = v[2];
        }
        if (rc) bad = "zero.buckets";
        for (int64_t i = 0; !rc && i < m->nt; i++) {
            json_t *x = json_array_get(ts, (size_t)i), *s = json_object_get(x, "shape");
            const char *nm = json_string_value(json_object_get(x, "name"));
            int64_t bits = 0;
            if (!nm || !*nm || strlen(nm) >= TZ_NAME_MAX || !json_is_array(s) ||
                json_array_size(s) < 1 || json_array_size(s) > 2 ||
                get_int(x, "flat_offset", &m->t[i].flat_off, 0, BIG) ||
                get_int(x, "numel", &m->t[i].numel, 1, BIG) ||
                (json_object_get(x, "quant_bits") && get_int(x, "quant_bits", &bits, 0, 8))) {
                rc = -1, bad = "tensors";
                break;
            }
            snprintf(m->t[i].name, sizeof m->t[i].name, "%s", nm);
            m->t[i].ndim = (int)json_array_size(s);
            m->t[i].bits = (int)bits;
            for (int k = 0; !rc && k < m->t[i].ndim; k++) {
                json_t *y = json_array_get(s, (size_t)k);
                if (!json_is_integer(y) || json_integer_value(y) < 1 || json_integer_value(y) > BIG)
                    rc = -1, bad = "tensors";
                else m->t[i].shape[k] = json_integer_value(y);
            }
        }
        for (int64_t q = 0; !rc && q < m->world; q++) {
            json_t *x = json_array_get(sh, (size_t)q);
            if (get_int(x, "bytes", &m->bytes[q], 1, BIG) || get_int(x, "crc32", &m->crc[q], 0, 0xffffffffLL))
                rc = -1, bad = "shards";
        }
        for (int64_t a = 0; !rc && a < m->na; a++) {
            const char *s = json_string_value(json_array_get(ar, (size_t)a));
            if (!s || !*s || strlen(s) >= sizeof m->arrays[a]) rc = -1, bad = "optimizer.arrays";
            else snprintf(m->arrays[a], sizeof m->arrays[a], "%s", s);
        }
        if (rc) tz_errf(err, n, "checkpoint.json: %s malformed or out of range", bad);
        const char *c = json_string_value(json_object_get(j, "config"));
        if (!rc && c) m->config = tz_xstrdup(c);
        if (!rc && e) {
            json_t *b0 = json_object_get(e, "before"), *bb = json_object_get(e, "best");
            m->have_eval = json_is_number(b0) && json_is_number(bb) &&
                           !get_int(e, "before_count", &m->eval0_count, 0, BIG) &&
                           !get_int(e, "best_count", &m->best_count, 0, BIG) &&
                           !get_int(e, "best_step", &m->best_step, 0, m->step);
            if (m->have_eval) m->eval0 = json_number_value(b0), m->best = json_number_value(bb);
            if (!m->have_eval || !isfinite(m->eval0) || !isfinite(m->best))
                rc = tz_errf(err, n, "checkpoint.json: eval malformed or out of range");
        }
    }
    json_decref(j);
    if (rc) meta_free(m);
    return rc;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp((*(const tz_ckpt_tensor *const *)a)->name, (*(const tz_ckpt_tensor *const *)b)->name);
}

/* The parsed checkpoint.json consistent in itself: the step is the folder's and the data
 * position follows from it; the tensors lie in order inside the flat space, named once,
 * shaped as counted; the ZeRO plan is the one its own inputs (tensors, world, bucket size,
 * alignment) give. 0, or non-zero with a message. */
static int meta_validate(const ck_meta *m, int64_t folder_step, char *err, size_t n) {
    if (folder_step >= 0 && m->step != folder_step)
        return tz_errf(err, n, "checkpoint.json: step %lld in a folder of step %lld", (long long)m->step,
                       (long long)folder_step);
    if (m->step >= m->steps)
        return tz_errf(err, n, "checkpoint.json: step %lld of a run of %lld steps", (long long)m->step,
                       (long long)m->steps);
    if (m->step > BIG / m->global_batch || m->next_row != m->step * m->global_batch ||
        m->ranks * m->micro_batch > m->global_batch ||
        m->ranks * m->micro_batch * m->grad_accum != m->global_batch)
        return tz_errf(err, n, "checkpoint.json: data position %lld is not step %lld x %lld rows "
                       "(ranks x micro_batch x grad_accum = %lld x %lld x %lld)", (long long)m->next_row,
                       (long long)m->step, (long long)m->global_batch, (long long)m->ranks,
                       (long long)m->micro_batch, (long long)m->grad_accum);
    if (m->world * m->align > (1LL << 40) || m->flat_numel % m->align)
        return tz_errf(err, n, "checkpoint.json: zero.world, zero.align or zero.flat_numel out of range");
    /* the tensors: in flat order, aligned, disjoint, inside the space, counted, named once */
    const tz_ckpt_tensor **by = tz_xmalloc((size_t)m->nt * sizeof *by);
    int rc = 0;
    for (int64_t i = 0; !rc && i < m->nt; i++) {
        const tz_ckpt_tensor *t = &m->t[i];
        by[i] = t;
        const int64_t prod = t->ndim == 1 ? t->shape[0]
                             : t->shape[0] > BIG / t->shape[1] ? -1 : t->shape[0] * t->shape[1];
        if (prod != t->numel || t->flat_off % m->align || t->flat_off + t->numel > m->flat_numel ||
            (i > 0 && t->flat_off < m->t[i - 1].flat_off + m->t[i - 1].numel))
            rc = tz_errf(err, n, "checkpoint.json: tensor %s: shape, size or offset inconsistent", t->name);
    }
    if (!rc) {
        qsort(by, (size_t)m->nt, sizeof *by, cmp_name);
        for (int64_t i = 1; !rc && i < m->nt; i++)
            if (!strcmp(by[i]->name, by[i - 1]->name))
                rc = tz_errf(err, n, "checkpoint.json: tensor %s listed twice", by[i]->name);
    }
    free(by);
    if (rc) return rc;
    /* the buckets: contiguous over the space, padded and sliced as the plan cuts them */
    int64_t at = 0, shard = 0;
    for (int64_t i = 0; i < m->nb; i++) {
        const tz_ckpt_bucket *b = &m->b[i];
        const int64_t unit = m->world * m->align, pad = (b->len + unit - 1) / unit * unit;
        if (b->start != at || b->len < 1 || b->len > m->bucket_elems || m->padded[i] != pad ||
            b->slice != pad / m->world || b->shard_off != shard)
            return tz_errf(err, n, "checkpoint.json: zero.buckets[%lld] inconsistent", (long long)i);
        at += b->len, shard += b->slice;
    }
    if (at != m->flat_numel || shard != m->shard_numel)
        return tz_errf(err, n, "checkpoint.json: the buckets cover %lld of %lld elements", (long long)at,
                       (long long)m->flat_numel);
    /* the plan its own inputs give: the same buckets */
    int64_t *off = tz_xmalloc((size_t)m->nt * sizeof *off), *num = tz_xmalloc((size_t)m->nt * sizeof *num);
    for (int64_t i = 0; i < m->nt; i++) off[i] = m->t[i].flat_off, num[i] = m->t[i].numel;
    tz_zero_desc zd = {m->flat_numel, (int)m->nt, off, num, (int)m->world, m->bucket_elems * 4, 4, m->align};
    tz_zero_plan p;
    char perr[200];
    if (tz_zero_plan_init(&p, &zd, perr, sizeof perr)) {
        rc = tz_errf(err, n, "checkpoint.json: its ZeRO plan cannot be made again: %s", perr);
    } else {
        int same = p.n_buckets == m->nb && p.shard_numel == m->shard_numel;
        for (int i = 0; same && i < p.n_buckets; i++)
            same = p.b[i].start == m->b[i].start && p.b[i].len == m->b[i].len &&
                   p.b[i].slice == m->b[i].slice && p.b[i].shard_off == m->b[i].shard_off;
        if (!same) rc = tz_errf(err, n, "checkpoint.json: zero.buckets are not the plan of its tensors");
        tz_zero_plan_free(&p);
    }
    free(off);
    free(num);
    return rc;
}

int tz_ckpt_meta_check(const char *text, int64_t folder_step, char *err, size_t n) {
    ck_meta m;
    if (meta_parse(text, &m, err, n)) return -1;
    int rc = meta_validate(&m, folder_step, err, n);
    meta_free(&m);
    return rc;
}

static int cmp_piece(const void *a, const void *b) {
    const tz_ckpt_piece *x = a, *y = b;
    if (x->t != y->t) return (x->t > y->t) - (x->t < y->t);
    return (x->lo > y->lo) - (x->lo < y->lo);
}

typedef struct ck_read {
    int q, s;               /* saved rank (file) and saved tensor */
    int64_t pos, n, shard;  /* dataset position, elements, this rank's shard offset */
} ck_read;

static int cmp_read(const void *a, const void *b) {
    const ck_read *x = a, *y = b;
    return (x->q > y->q) - (x->q < y->q);
}

/* This rank's owned slices (the current plan) from the saved shards (the saved plan):
 * every owned element of every tensor from the saved rank that owned it. */
static int load_shards(const ck_meta *m, const char *folder, tz_zero *z, const tz_ckpt_tensor *t,
                       int nt, const int *map, char *err, size_t errlen) {
    tz_zero_quiet(z); /* no upload still reads the master this overwrites */
    const int r = z->stage == 0 ? 0 : z->comm->rank;
    /* where every saved element is: pieces of every saved rank, by (tensor, offset) */
    int64_t ns = 0, *total = tz_xcalloc((size_t)(m->world * m->nt) + 1, sizeof *total);
    tz_ckpt_piece *saved = NULL;
    for (int q = 0; q < m->world; q++) {
        tz_ckpt_piece *pc;
        int64_t k = tz_ckpt_pieces(m->b, (int)m->nb, q, m->t, (int)m->nt, &pc, total + q * m->nt);
        saved = tz_xrealloc(saved, (size_t)(ns + k + 1) * sizeof *saved);
        memcpy(saved + ns, pc, (size_t)k * sizeof *pc);
        ns += k;
        free(pc);
    }
    qsort(saved, (size_t)ns, sizeof *saved, cmp_piece);
    tz_ckpt_bucket *b = tz_ckpt_buckets(&z->plan);
    tz_ckpt_piece *mine;
    const int64_t nm = tz_ckpt_pieces(b, z->plan.n_buckets, r, t, nt, &mine, NULL);
    int64_t nr = 0, cap = nm + 16, want = 0, got = 0;
    ck_read *rd = tz_xmalloc((size_t)cap * sizeof *rd);
    for (int64_t i = 0; i < nm; i++) {
        const tz_ckpt_piece *c = &mine[i];
        const int s = map[c->t];
        want += c->n;
        int64_t lo = 0, hi = ns; /* first saved piece of s ending after c->lo */
        while (lo < hi) {
            int64_t mid = (lo + hi) / 2;
            if (saved[mid].t < s || (saved[mid].t == s && saved[mid].lo + saved[mid].n <= c->lo)) lo = mid + 1;
            else hi = mid;
        }
        for (int64_t k = lo; k < ns && saved[k].t == s && saved[k].lo < c->lo + c->n; k++) {
            int64_t a = saved[k].lo > c->lo ? saved[k].lo : c->lo;
            int64_t e = saved[k].lo + saved[k].n < c->lo + c->n ? saved[k].lo + saved[k].n : c->lo + c->n;
            if (nr == cap) rd = tz_xrealloc(rd, (size_t)(cap *= 2) * sizeof *rd);
            rd[nr++] = (ck_read){saved[k].rank, s, saved[k].pos + (a - saved[k].lo), e - a,
                                 c->shard + (a - c->lo)};
            got += e - a;
        }
    }
    int rc = 0;
    if (got != want)
        rc = tz_errf(err, errlen, "%s: the saved plan covers %lld of the %lld elements this rank "
                     "owns", folder, (long long)got, (long long)want);
    qsort(rd, (size_t)nr, sizeof *rd, cmp_read);
    for (int64_t i = 0; !rc && i < nr;) {
        const int q = rd[i].q;
        char file[TZ_CKPT_PATH];
        tz_ckpt_pathf(file, sizeof file, "%s/rank-%05d.h5", folder, q);
        tz_h5_shard *f = tz_h5_shard_open(file, err, errlen);
        if (!f) {
            rc = -1;
            break;
        }
        int64_t j = i;
        for (; j < nr && rd[j].q == q; j++)
            for (int a = 0; !rc && a < z->sh.n_arrays; a++) {
                if (!z->sh.a[a].saved) continue;
                const ck_read *o = &rd[j];
                const tz_shard_array *arr = &z->sh.a[a];
                rc = tz_h5_shard_read(f, arr->name, m->t[o->s].name, arr->dtype,
                                      total[q * m->nt + o->s], o->pos, o->n,
                                      (char *)arr->data + o->shard * arr->elem_bytes, err, errlen);
            }
        tz_h5_shard_close(f, NULL, 0);
        i = j;
    }
    free(rd);
    free(mine);
    free(b);
    free(saved);
    free(total);
    return rc;
}

/* Checks the saved run against this one: tensors (names, shapes), optimizer arrays, global
 * batch. Fatal with the difference (the same on every rank). *map gets, per current
 * tensor, its index in the saved table. */
static void check_compatible(const ck_meta *m, const char *folder, const tz_zero *z,
                             const tz_ckpt_tensor *t, int nt, int64_t global_batch, int *map) {
    int na = 0;
    for (int a = 0; a < z->sh.n_arrays; a++) {
        if (!z->sh.a[a].saved) continue;
        if (na >= m->na || strcmp(m->arrays[na], z->sh.a[a].name))
            TZ_FATAL("%s: saved optimizer arrays differ from this run's (%s: %s expected)", folder,
                     z->sh.opt->name, z->sh.a[a].name);
        na++;
    }
    if (na != m->na) TZ_FATAL("%s: the checkpoint holds %lld optimizer arrays, this run %d", folder,
                              (long long)m->na, na);
    if (m->nt != nt)
        TZ_FATAL_HINT("resume with the model, train.mode, lora.* and quant.* it was written with",
                      "%s: the checkpoint holds %lld trainable tensors, this run has %d", folder,
                      (long long)m->nt, nt);
    for (int i = 0; i < nt; i++) {
        int s = -1;
        for (int k = 0; k < nt && s < 0; k++)
            if (!strcmp(m->t[(i + k) % nt].name, t[i].name)) s = (i + k) % nt;
        if (s < 0 || m->t[s].numel != t[i].numel || m->t[s].shape[0] != t[i].shape[0] ||
            m->t[s].ndim != t[i].ndim || (t[i].ndim > 1 && m->t[s].shape[1] != t[i].shape[1]))
            TZ_FATAL_HINT("resume with the model, train.mode, lora.* and quant.* it was written with",
                          "%s: trainable tensor %s [%lld x %lld] %s in the checkpoint", folder,
                          t[i].name, (long long)t[i].shape[0], (long long)t[i].shape[1],
                          s < 0 ? "is not" : "has another shape");
        map[i] = s;
    }
    if (global_batch >= 0 && m->global_batch != global_batch) /* < 0: export, no data order */
        TZ_FATAL_HINT("keep ranks x train.micro_batch x train.grad_accum equal to the checkpoint's",
                      "%s: the checkpoint's steps are %lld rows each, this run's %lld: the data "
                      "order would not continue where it stopped", folder,
                      (long long)m->global_batch, (long long)global_batch);
}

/* One setting of a configuration text: "section.key", its value as text, and as a number
 * where it is one. */
typedef struct ck_setting {
    char *key, *val;
    int num;
    double x;
} ck_setting;

static void value_text(const config_setting_t *s, char *out, size_t n) {
    switch (config_setting_type(s)) {
    case CONFIG_TYPE_INT: snprintf(out, n, "%d", config_setting_get_int(s)); break;
    case CONFIG_TYPE_INT64: snprintf(out, n, "%lld", config_setting_get_int64(s)); break;
    case CONFIG_TYPE_FLOAT: snprintf(out, n, "%.9g", config_setting_get_float(s)); break;
    case CONFIG_TYPE_BOOL: snprintf(out, n, "%s", config_setting_get_bool(s) ? "true" : "false"); break;
    case CONFIG_TYPE_STRING: snprintf(out, n, "\"%s\"", config_setting_get_string(s)); break;
    default: { /* a list or an array: its elements */
        size_t at = 0;
        at += (size_t)snprintf(out, n, "[");
        for (int i = 0; i < config_setting_length(s) && at < n; i++) {
            char one[256];
            value_text(config_setting_get_elem(s, (unsigned)i), one, sizeof one);
            at += (size_t)snprintf(out + at, n - at, "%s%s", i ? ", " : "", one);
        }
        if (at < n) snprintf(out + at, n - at, "]");
    }
    }
}

/* The scalar and list settings under s, flattened as "a.b". */
static void flatten(const config_setting_t *s, const char *prefix, ck_setting **out, int *n) {
    for (int i = 0; i < config_setting_length(s); i++) {
        const config_setting_t *c = config_setting_get_elem(s, (unsigned)i);
        const char *name = config_setting_name(c);
        char key[256], val[1024];
        snprintf(key, sizeof key, "%s%s%s", prefix, *prefix ? "." : "", name ? name : "?");
        if (config_setting_type(c) == CONFIG_TYPE_GROUP) {
            flatten(c, key, out, n);
            continue;
        }
        value_text(c, val, sizeof val);
        *out = tz_xrealloc(*out, (size_t)(*n + 1) * sizeof **out);
        const int t = config_setting_type(c);
        (*out)[(*n)++] = (ck_setting){tz_xstrdup(key), tz_xstrdup(val),
                                      t == CONFIG_TYPE_INT || t == CONFIG_TYPE_INT64 || t == CONFIG_TYPE_FLOAT,
                                      t == CONFIG_TYPE_FLOAT ? config_setting_get_float(c)
                                      : t == CONFIG_TYPE_INT64 ? (double)config_setting_get_int64(c)
                                                               : (double)config_setting_get_int(c)};
    }
}

static int cmp_setting(const void *a, const void *b) {
    return strcmp(((const ck_setting *)a)->key, ((const ck_setting *)b)->key);
}

/* A configuration text's settings, sorted by key; -1 when it does not parse. */
static int settings_of(const char *text, ck_setting **out) {
    config_t c;
    config_init(&c);
    *out = NULL;
    int n = -1;
    if (config_read_string(&c, text) == CONFIG_TRUE) {
        n = 0;
        flatten(config_root_setting(&c), "", out, &n);
        qsort(*out, (size_t)n, sizeof **out, cmp_setting);
    }
    config_destroy(&c);
    return n;
}

static void settings_free(ck_setting *s, int n) {
    for (int i = 0; i < n; i++) free(s[i].key), free(s[i].val);
    free(s);
}

/* Rank 0: warns about every setting of this run that differs from the checkpoint's, key by
 * key (a changed run.dir, rank split or run.overwrite is fine). */
static void warn_config_changes(const tz_config *cfg, const ck_meta *m) {
    if (!m->config) return;
    static const char *const free_keys[] = {"run.dir", "run.overwrite", "train.micro_batch",
                                            "train.grad_accum", "optim.offload"};
    char *now_text = tz_ckpt_config_text(cfg), changed[600] = "";
    ck_setting *a, *b;
    const int na = settings_of(m->config, &a), nb = settings_of(now_text, &b);
    free(now_text);
    if (na < 0 || nb < 0) {
        tz_warn("resuming: the checkpoint's settings cannot be compared with this run's");
        settings_free(a, na < 0 ? 0 : na), settings_free(b, nb < 0 ? 0 : nb);
        return;
    }
    int n = 0, i = 0, j = 0;
    size_t at = 0;
    while (i < na || j < nb) {
        const int c = i == na ? 1 : j == nb ? -1 : strcmp(a[i].key, b[j].key);
        const char *key = c <= 0 ? a[i].key : b[j].key;
        int differs = c != 0;
        if (!c) differs = a[i].num && b[j].num ? a[i].x != b[j].x : strcmp(a[i].val, b[j].val) != 0;
        int skip = 0;
        for (size_t k = 0; k < sizeof free_keys / sizeof free_keys[0]; k++) skip |= !strcmp(key, free_keys[k]);
        if (differs && !skip && n++ < 6 && at < sizeof changed) {
            int k = snprintf(changed + at, sizeof changed - at, "%s%s %s -> %s", at ? "; " : "", key,
                             c <= 0 ? a[i].val : "(unset)", c >= 0 ? b[j].val : "(unset)");
            if (k > 0) at += (size_t)k;
        }
        i += c <= 0, j += c >= 0;
    }
    if (n)
        tz_warn("resuming with %d setting%s other than the checkpoint's: %s%s", n, n == 1 ? "" : "s",
                changed, n > 6 ? "; ..." : "");
    settings_free(a, na), settings_free(b, nb);
}

/* Rank 0: the checkpoint folders to try, newest first; *one when path names one checkpoint
 * (no fall back). */
static char **candidates(const tz_config *cfg, const char *path, int *n, int *one, char *where,
                         size_t wn) {
    char p[TZ_CKPT_PATH], dir[TZ_CKPT_PATH];
    *one = 0;
    *n = 0;
    if (!path || !*path) {
        tz_path_join(dir, sizeof dir, cfg->run.dir, "checkpoints");
    } else {
        struct stat sb;
        if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode))
            TZ_FATAL("--resume %s: no such folder", path);
        tz_ckpt_pathf(p, sizeof p, "%s/checkpoint.json", path);
        char c2[TZ_CKPT_PATH];
        tz_ckpt_pathf(c2, sizeof c2, "%s/COMPLETE", path);
        const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
        if (tz_path_exists(p) || tz_path_exists(c2) || tz_ckpt_step_of_name(base) >= 0) {
            char **c = tz_xcalloc(1, sizeof *c);
            c[0] = tz_xstrdup(path);
            *n = *one = 1;
            snprintf(where, wn, "%s", path);
            return c;
        }
        tz_path_join(p, sizeof p, path, "checkpoints");
        snprintf(dir, sizeof dir, "%s", tz_path_exists(p) ? p : path);
    }
    snprintf(where, wn, "%s", dir);
    int k;
    int64_t *s = tz_ckpt_list_steps(dir, &k);
    char **c = tz_xcalloc((size_t)k + 1, sizeof *c);
    for (int i = 0; i < k; i++) {
        tz_ckpt_pathf(p, sizeof p, "%s/step-%lld", dir, (long long)s[i]);
        c[i] = tz_xstrdup(p);
    }
    free(s);
    *n = k;
    return c;
}

/* Rank 0: the marker and checkpoint.json of folder checked against each other; the text of
 * checkpoint.json (free it), or NULL with a message. */
static char *read_checked(const char *folder, char *err, size_t n) {
    char p[TZ_CKPT_PATH + 32], mark[256] = "";
    struct stat sb;
    tz_ckpt_pathf(p, sizeof p, "%s/COMPLETE", folder);
    if (lstat(p, &sb) != 0) {
        tz_errf(err, n, "%s: no COMPLETE marker (its write did not finish)", folder);
        return NULL;
    }
    if (!S_ISREG(sb.st_mode) || sb.st_size > 200) {
        tz_errf(err, n, "%s: not a marker file", p);
        return NULL;
    }
    FILE *f = fopen(p, "re");
    size_t k = f ? fread(mark, 1, sizeof mark - 1, f) : 0;
    if (f) fclose(f);
    mark[k] = 0;
    long long step = -1, bytes = -1;
    unsigned crc = 0;
    const int fields = sscanf(mark, "step %lld\ncheckpoint.json %lld %8x", &step, &bytes, &crc);
    const char *base = strrchr(folder, '/') ? strrchr(folder, '/') + 1 : folder;
    const int64_t named = tz_ckpt_step_of_name(base);
    if (fields < 1 || (named >= 0 && step != named)) {
        tz_errf(err, n, "%s: the marker names step %lld, not this folder's", p, step);
        return NULL;
    }
    tz_ckpt_pathf(p, sizeof p, "%s/checkpoint.json", folder);
    if (lstat(p, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        tz_errf(err, n, "%s: missing or not a regular file", p);
        return NULL;
    }
    size_t len = 0;
    char *text = tz_read_file(p, &len, err, n);
    if (!text) return NULL;
    if (fields == 3) { /* markers without the line come from before it was written */
        char want[160];
        tz_ckpt_marker_text(want, sizeof want, step, text, len);
        if ((long long)len != bytes || strcmp(want, mark)) {
            tz_errf(err, n, "%s: %zu bytes and a CRC-32 other than its marker records (%lld "
                    "bytes): edited or damaged after it was written", p, len, bytes);
            free(text);
            return NULL;
        }
    }
    if (strlen(text) != len) {
        tz_errf(err, n, "%s: holds a NUL byte (damaged)", p);
        free(text);
        return NULL;
    }
    return text;
}

/* Every shard file of m in folder of its recorded size and CRC-32 (file q checked by rank
 * q % N); "" or a message in err. */
static void check_shards(const ck_meta *m, const char *folder, const tz_comm *comm, char *err, size_t n) {
    char p[TZ_CKPT_PATH + 32];
    for (int64_t q = comm->rank; q < m->world && !err[0]; q += comm->size) {
        tz_ckpt_pathf(p, sizeof p, "%s/rank-%05lld.h5", folder, (long long)q);
        int64_t bytes = 0;
        uint32_t crc = 0;
        struct stat sb;
        if (lstat(p, &sb) != 0)
            tz_errf(err, n, "%s: missing shard (%s)", p, strerror(errno));
        else if (!S_ISREG(sb.st_mode))
            tz_errf(err, n, "%s: not a regular file", p);
        else if ((int64_t)sb.st_size != m->bytes[q])
            tz_errf(err, n, "%s: %lld bytes, expected %lld (truncated or damaged)", p,
                    (long long)sb.st_size, (long long)m->bytes[q]);
        else if (tz_file_sync_crc(p, &bytes, &crc, err, n) == 0 && (int64_t)crc != m->crc[q])
            tz_errf(err, n, "%s: CRC-32 %08x, expected %08llx (damaged)", p, crc,
                    (unsigned long long)m->crc[q]);
    }
}

/* tz_ckpt_resume, and tz_ckpt_load when exporting (path one checkpoint folder; neither the
 * global batch, train.steps nor the settings compared). */
static int resume_from(const tz_config *cfg, tz_zero *z, const char *path, const char *run_id,
                       int64_t global_batch, tz_ckpt_state *st, int exporting) {
    tz_comm *comm = z->comm;
    const int rank = comm->rank, root = rank == 0;
    int nc = 0, one = 0, refused = 0, others = 0;
    char **cand = NULL, where[TZ_CKPT_PATH] = "", cur[TZ_CKPT_PATH], id[TZ_RUN_ID_MAX] = "";
    if (root) cand = candidates(cfg, path, &nc, &one, where, sizeof where);
    if (root && run_id) snprintf(id, sizeof id, "%s", run_id);
    int64_t hdr[2] = {nc, one};
    tz_comm_bcast(comm, hdr, 2, TZ_DT_I64, 0);
    tz_comm_bcast(comm, where, (int64_t)sizeof where, TZ_DT_U8, 0);
    tz_comm_bcast(comm, id, (int64_t)sizeof id, TZ_DT_U8, 0);
    nc = (int)hdr[0], one = (int)hdr[1];
    if (nc == 0) {
        if (path && *path) TZ_FATAL("--resume %s: no checkpoint (step-<N> folder) there", path);
        tz_warn("--resume: no checkpoint in %s yet: starting from step 0", where);
        return 0;
    }
    int nt;
    tz_ckpt_tensor *t = tz_ckpt_tensors(z->ps, &nt);
    int *map = tz_xcalloc((size_t)nt + 1, sizeof *map);
    ck_meta m;
    int accepted = 0;
    for (int i = 0; i < nc && !accepted; i++) {
        char err[TZ_CKPT_MSG] = "";
        int parsed = 0;
        memset(cur, 0, sizeof cur);
        if (root) snprintf(cur, sizeof cur, "%s", cand[i]);
        tz_comm_bcast(comm, cur, (int64_t)sizeof cur, TZ_DT_U8, 0);
        /* rank 0 reads the marker and the shared file; every rank gets its text */
        char *text = root ? read_checked(cur, err, sizeof err) : NULL;
        int64_t len = text ? (int64_t)strlen(text) : -1;
        tz_comm_bcast(comm, &len, 1, TZ_DT_I64, 0);
        if (len >= 0) {
            if (!root) text = tz_xmalloc((size_t)len + 1);
            tz_comm_bcast(comm, text, len + 1, TZ_DT_U8, 0);
            const char *base = strrchr(cur, '/') ? strrchr(cur, '/') + 1 : cur;
            if (meta_parse(text, &m, err, sizeof err) == 0) {
                parsed = 1;
                if (meta_validate(&m, tz_ckpt_step_of_name(base), err, sizeof err) == 0 && !one &&
                    id[0] && m.run_id[0] && strcmp(m.run_id, id)) {
                    if (root)
                        tz_warn("--resume: passing over %s: written by another run (%s), not "
                                "the one this run.dir holds (%s)", cur, m.run_id, id);
                    others++;
                    free(text);
                    meta_free(&m);
                    continue;
                }
                if (!err[0]) check_shards(&m, cur, comm, err, sizeof err);
            }
        }
        free(text);
        int failed;
        char *msgs = tz_ckpt_gather_msgs(comm, err, &failed);
        if (!failed) { /* fits this run? fatal if not: every checkpoint of the run is alike */
            check_compatible(&m, cur, z, t, nt, exporting ? -1 : global_batch, map);
            if (!exporting && m.step >= cfg->train.steps)
                TZ_FATAL_HINT("raise train.steps (the learning-rate schedule follows it), or "
                              "--resume an earlier checkpoint of the run by its folder",
                              "%s is at step %lld and train.steps is %lld: nothing left to train",
                              cur, (long long)m.step, (long long)cfg->train.steps);
            if (root && !exporting) warn_config_changes(cfg, &m);
            load_shards(&m, cur, z, t, nt, map, err, sizeof err);
            free(msgs);
            msgs = tz_ckpt_gather_msgs(comm, err, &failed);
        }
        if (failed) {
            if (parsed) meta_free(&m);
            for (int r = 0; r < comm->size; r++)
                if (msgs[(size_t)r * TZ_CKPT_MSG] && root) tz_warn("checkpoint refused: %s", msgs + (size_t)r * TZ_CKPT_MSG);
            refused++;
            if (one) {
                tz_comm_barrier(comm);
                TZ_FATAL("--resume %s: the checkpoint is incomplete, damaged or inconsistent (above)", cur);
            }
            if (i + 1 < nc && root)
                tz_warn("falling back to the previous checkpoint, %s", cand[i + 1]);
        } else {
            accepted = 1;
        }
        free(msgs);
    }
    if (root) {
        for (int i = 0; i < nc; i++) free(cand[i]);
        free(cand);
    }
    free(map);
    free(t);
    if (!accepted && refused == 0) { /* only other runs' checkpoints */
        tz_warn("--resume: no checkpoint of this run in %s yet (%d of another run): starting "
                "from step 0", where, others);
        return 0;
    }
    if (!accepted) {
        tz_comm_barrier(comm);
        TZ_FATAL("--resume: no usable checkpoint in %s (%d refused, above)", where, refused);
    }
    tz_zero_host_loaded(z);
    memset(st, 0, sizeof *st);
    st->step = m.step;
    st->global_batch = m.global_batch;
    st->have_eval = m.have_eval;
    st->eval0 = m.eval0, st->eval0_count = m.eval0_count;
    st->best = m.best, st->best_count = m.best_count, st->best_step = m.best_step;
    snprintf(st->run_id, sizeof st->run_id, "%s", m.run_id);
    snprintf(st->folder, sizeof st->folder, "%s", cur);
    tz_info("%s %s: step %lld, written by %lld rank%s (zero stage %lld), read by %d%s",
            exporting ? "read" : "resumed from", cur, (long long)m.step, (long long)m.world, m.world == 1 ? "" : "s",
            (long long)m.stage, comm->size, refused ? " (newer checkpoints refused above)" : "");
    meta_free(&m);
    return 1;
}

int tz_ckpt_resume(const tz_config *cfg, tz_zero *z, const char *path, const char *run_id,
                   int64_t global_batch, tz_ckpt_state *st) {
    return resume_from(cfg, z, path, run_id, global_batch, st, 0);
}

void tz_ckpt_load(const tz_config *cfg, tz_zero *z, const char *folder, tz_ckpt_state *st) {
    char p[TZ_CKPT_PATH];
    tz_ckpt_pathf(p, sizeof p, "%s/checkpoint.json", folder);
    if (!tz_path_exists(p)) /* not a folder of checkpoints: this one */
        TZ_FATAL("%s: not a checkpoint (no checkpoint.json)", folder);
    resume_from(cfg, z, folder, NULL, -1, st, 1);
}

char *tz_ckpt_config_read(const char *folder, int64_t *step, char *err, size_t n) {
    err[0] = 0;
    char *text = read_checked(folder, err, n);
    if (!text) return NULL;
    ck_meta m;
    const char *base = strrchr(folder, '/') ? strrchr(folder, '/') + 1 : folder;
    char *cfg = NULL;
    if (meta_parse(text, &m, err, n) == 0) {
        if (meta_validate(&m, tz_ckpt_step_of_name(base), err, n) == 0 && !m.config)
            tz_errf(err, n, "%s/checkpoint.json: holds no configuration (written by an older "
                    "version)", folder);
        if (!err[0]) cfg = tz_xstrdup(m.config), *step = m.step;
        meta_free(&m);
    }
    free(text);
    return cfg;
}
