/* Resuming: the newest complete checkpoint found and checked (marker, checkpoint.json, every
 * shard's size and CRC-32; falling back past refused ones), the saved run checked against
 * this one, every rank's owned slices read through the saved plan (any rank count), and
 * metrics.jsonl cut back to the checkpoint's step. Writing is checkpoint.c's. */
#include <errno.h>
#include <jansson.h>
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
    int64_t step, global_batch, stage, world, nb, nt, na;
    tz_ckpt_bucket *b;
    tz_ckpt_tensor *t;
    int64_t *bytes, *crc;     /* per shard file */
    char arrays[TZ_SHARD_MAX_ARRAYS][32];
    int have_eval;
    double eval0, best;
    int64_t eval0_count, best_count, best_step;
    char *config;             /* the effective configuration it was written with, or NULL */
} ck_meta;

static void meta_free(ck_meta *m) {
    free(m->b);
    free(m->t);
    free(m->bytes);
    free(m->crc);
    free(m->config);
    memset(m, 0, sizeof *m);
}

static int get_int(json_t *o, const char *key, int64_t *v) {
    json_t *x = json_object_get(o, key);
    if (!json_is_integer(x)) return -1;
    *v = json_integer_value(x);
    return 0;
}

/* Parses checkpoint.json; 0, or non-zero with a message. */
static int meta_parse(const char *text, ck_meta *m, char *err, size_t n) {
    memset(m, 0, sizeof *m);
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    if (!j) return tz_errf(err, n, "checkpoint.json: line %d: %s", je.line, je.text);
    int rc = 0;
    json_t *d = json_object_get(j, "data"), *z = json_object_get(j, "zero"), *e = json_object_get(j, "eval");
    json_t *bs = json_object_get(z, "buckets"), *ts = json_object_get(j, "tensors");
    json_t *sh = json_object_get(j, "shards"), *ar = json_object_get(json_object_get(j, "optimizer"), "arrays");
    int64_t version = 0;
    const char *fmt = json_string_value(json_object_get(j, "format"));
    if (!fmt || strcmp(fmt, TZ_CKPT_FORMAT) || get_int(j, "version", &version) || version != TZ_CKPT_VERSION)
        rc = tz_errf(err, n, "checkpoint.json: not a %s version %d file", TZ_CKPT_FORMAT, TZ_CKPT_VERSION);
    else if (get_int(j, "step", &m->step) || get_int(d, "global_batch", &m->global_batch) ||
             get_int(z, "stage", &m->stage) || get_int(z, "world", &m->world) ||
             !json_is_array(bs) || !json_is_array(ts) || !json_is_array(sh) || !json_is_array(ar) ||
             m->world < 1 || (int64_t)json_array_size(sh) != m->world ||
             json_array_size(ar) > TZ_SHARD_MAX_ARRAYS)
        rc = tz_errf(err, n, "checkpoint.json: step, data, zero, tensors, shards or optimizer "
                     "missing or malformed");
    if (!rc) {
        m->nb = (int64_t)json_array_size(bs);
        m->nt = (int64_t)json_array_size(ts);
        m->na = (int64_t)json_array_size(ar);
        m->b = tz_xcalloc((size_t)m->nb + 1, sizeof *m->b);
        m->t = tz_xcalloc((size_t)m->nt + 1, sizeof *m->t);
        m->bytes = tz_xcalloc((size_t)m->world, sizeof *m->bytes);
        m->crc = tz_xcalloc((size_t)m->world, sizeof *m->crc);
        for (int64_t i = 0; !rc && i < m->nb; i++) {
            json_t *b = json_array_get(bs, (size_t)i);
            int64_t v[5];
            for (int k = 0; k < 5; k++) {
                json_t *x = json_array_get(b, (size_t)k);
                if (!json_is_integer(x)) rc = -1;
                v[k] = x ? json_integer_value(x) : 0;
            }
            m->b[i] = (tz_ckpt_bucket){v[0], v[1], v[3], v[4]};
        }
        for (int64_t i = 0; !rc && i < m->nt; i++) {
            json_t *x = json_array_get(ts, (size_t)i), *s = json_object_get(x, "shape");
            const char *nm = json_string_value(json_object_get(x, "name"));
            if (!nm || !json_is_array(s) || json_array_size(s) < 1 || json_array_size(s) > 2 ||
                get_int(x, "flat_offset", &m->t[i].flat_off) || get_int(x, "numel", &m->t[i].numel)) {
                rc = -1;
                break;
            }
            snprintf(m->t[i].name, sizeof m->t[i].name, "%s", nm);
            m->t[i].ndim = (int)json_array_size(s);
            for (int k = 0; k < m->t[i].ndim; k++) m->t[i].shape[k] = json_integer_value(json_array_get(s, (size_t)k));
        }
        for (int64_t q = 0; !rc && q < m->world; q++) {
            json_t *x = json_array_get(sh, (size_t)q);
            if (get_int(x, "bytes", &m->bytes[q]) || get_int(x, "crc32", &m->crc[q])) rc = -1;
        }
        for (int64_t a = 0; !rc && a < m->na; a++) {
            const char *s = json_string_value(json_array_get(ar, (size_t)a));
            if (!s) rc = -1;
            else snprintf(m->arrays[a], sizeof m->arrays[a], "%s", s);
        }
        if (rc) tz_errf(err, n, "checkpoint.json: malformed buckets, tensors, shards or arrays");
        const char *c = json_string_value(json_object_get(j, "config"));
        if (!rc && c) m->config = tz_xstrdup(c);
        if (!rc && e) {
            json_t *b0 = json_object_get(e, "before"), *bb = json_object_get(e, "best");
            m->have_eval = json_is_number(b0) && json_is_number(bb) &&
                           !get_int(e, "before_count", &m->eval0_count) &&
                           !get_int(e, "best_count", &m->best_count) &&
                           !get_int(e, "best_step", &m->best_step);
            if (m->have_eval) m->eval0 = json_number_value(b0), m->best = json_number_value(bb);
        }
    }
    json_decref(j);
    if (rc) meta_free(m);
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
                rc = tz_h5_shard_read(f, z->sh.a[a].name, m->t[o->s].name, total[q * m->nt + o->s],
                                      o->pos, o->n, (float *)z->sh.a[a].data + o->shard, err, errlen);
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
    if (m->global_batch != global_batch)
        TZ_FATAL_HINT("keep ranks x train.micro_batch x train.grad_accum equal to the checkpoint's",
                      "%s: the checkpoint's steps are %lld rows each, this run's %lld: the data "
                      "order would not continue where it stopped", folder,
                      (long long)m->global_batch, (long long)global_batch);
}

/* Rank 0: warns about the settings of this run that differ from the checkpoint's (the
 * lines of the effective configuration it lacks); a changed run.dir or rank split is fine. */
static void warn_config_changes(const tz_config *cfg, const ck_meta *m) {
    if (!m->config) return;
    char *now = tz_ckpt_config_text(cfg), changed[512] = "";
    int n = 0;
    size_t at = 0;
    for (char *line = now, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        while (*line == ' ') line++;
        if (!*line || *line == '#' || strchr(line, '{') || strchr(line, '}') ||
            !strncmp(line, "dir = ", 6) || !strncmp(line, "micro_batch = ", 14) ||
            !strncmp(line, "grad_accum = ", 13) || !strncmp(line, "overwrite = ", 12))
            continue;
        const char *hit = strstr(m->config, line); /* the same line, indented alike or not */
        int whole = 0;
        for (; hit && !whole; hit = strstr(hit + 1, line))
            whole = (hit == m->config || hit[-1] == ' ' || hit[-1] == '\n') && hit[strlen(line)] == '\n';
        if (whole) continue;
        if (n++ < 6 && at < sizeof changed) {
            int k = snprintf(changed + at, sizeof changed - at, "%s%s", at ? " " : "", line);
            if (k > 0) at += (size_t)k;
        }
    }
    if (n)
        tz_warn("resuming with %d setting%s other than the checkpoint's: %s%s", n, n == 1 ? "" : "s",
                changed, n > 6 ? " ..." : "");
    free(now);
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

int tz_ckpt_resume(const tz_config *cfg, tz_zero *z, const char *path, int64_t global_batch,
                   tz_ckpt_state *st) {
    tz_comm *comm = z->comm;
    const int rank = comm->rank, root = rank == 0;
    int nc = 0, one = 0, refused = 0;
    char **cand = NULL, where[TZ_CKPT_PATH] = "", cur[TZ_CKPT_PATH];
    if (root) cand = candidates(cfg, path, &nc, &one, where, sizeof where);
    int64_t hdr[2] = {nc, one};
    tz_comm_bcast(comm, hdr, 2, TZ_DT_I64, 0);
    tz_comm_bcast(comm, where, (int64_t)sizeof where, TZ_DT_U8, 0);
    nc = (int)hdr[0], one = (int)hdr[1];
    if (nc == 0) {
        if (path && *path) TZ_FATAL("--resume %s: no checkpoint (step-<N> folder) there", path);
        tz_warn("--resume: no checkpoint in %s yet: starting from step 0", where);
        return 0;
    }
    ck_meta m;
    int accepted = 0;
    for (int i = 0; i < nc && !accepted; i++) {
        char err[TZ_CKPT_MSG] = "";
        int parsed = 0;
        memset(cur, 0, sizeof cur);
        if (root) snprintf(cur, sizeof cur, "%s", cand[i]);
        tz_comm_bcast(comm, cur, (int64_t)sizeof cur, TZ_DT_U8, 0);
        /* rank 0: the marker and the shared file; every rank gets its text */
        char *text = NULL, p[TZ_CKPT_PATH + 32];
        int64_t len = -1;
        if (root) {
            tz_ckpt_pathf(p, sizeof p, "%s/COMPLETE", cur);
            if (!tz_path_exists(p)) {
                tz_errf(err, sizeof err, "%s: no COMPLETE marker (its write did not finish)", cur);
            } else {
                tz_ckpt_pathf(p, sizeof p, "%s/checkpoint.json", cur);
                text = tz_read_file(p, NULL, err, sizeof err);
                if (text) len = (int64_t)strlen(text);
            }
        }
        tz_comm_bcast(comm, &len, 1, TZ_DT_I64, 0);
        if (len >= 0) {
            if (!root) text = tz_xmalloc((size_t)len + 1);
            tz_comm_bcast(comm, text, len + 1, TZ_DT_U8, 0);
            if (meta_parse(text, &m, err, sizeof err) == 0) {
                parsed = 1;
                /* every shard file present, of its size and CRC-32: file q checked by rank q % N */
                for (int64_t q = rank; q < m.world && !err[0]; q += comm->size) {
                    tz_ckpt_pathf(p, sizeof p, "%s/rank-%05lld.h5", cur, (long long)q);
                    int64_t bytes = 0;
                    uint32_t crc = 0;
                    struct stat sb;
                    if (stat(p, &sb) != 0)
                        tz_errf(err, sizeof err, "%s: missing shard (%s)", p, strerror(errno));
                    else if ((int64_t)sb.st_size != m.bytes[q])
                        tz_errf(err, sizeof err, "%s: %lld bytes, expected %lld (truncated or damaged)",
                                p, (long long)sb.st_size, (long long)m.bytes[q]);
                    else if (tz_file_sync_crc(p, &bytes, &crc, err, sizeof err) == 0 &&
                             (int64_t)crc != m.crc[q])
                        tz_errf(err, sizeof err, "%s: CRC-32 %08x, expected %08llx (damaged)", p, crc,
                                (unsigned long long)m.crc[q]);
                }
            }
        }
        free(text);
        int failed;
        char *msgs = tz_ckpt_gather_msgs(comm, err, &failed);
        if (failed) {
            if (parsed) meta_free(&m);
            for (int r = 0; r < comm->size; r++)
                if (msgs[(size_t)r * TZ_CKPT_MSG] && root) tz_warn("checkpoint refused: %s", msgs + (size_t)r * TZ_CKPT_MSG);
            refused++;
            if (one) {
                tz_comm_barrier(comm);
                TZ_FATAL("--resume %s: the checkpoint is incomplete or damaged (above)", cur);
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
    if (!accepted) {
        tz_comm_barrier(comm);
        TZ_FATAL("--resume: no usable checkpoint in %s (%d refused, above)", where, refused);
    }
    int nt;
    tz_ckpt_tensor *t = tz_ckpt_tensors(z->ps, &nt);
    int *map = tz_xcalloc((size_t)nt + 1, sizeof *map);
    check_compatible(&m, cur, z, t, nt, global_batch, map);
    if (root) warn_config_changes(cfg, &m);
    char err[TZ_CKPT_MSG] = "";
    load_shards(&m, cur, z, t, nt, map, err, sizeof err);
    int failed;
    char *msgs = tz_ckpt_gather_msgs(comm, err, &failed);
    if (failed) tz_ckpt_fail_all(comm, msgs, "resuming failed: a checkpoint shard could not be read");
    free(msgs);
    tz_zero_push_weights(z);
    memset(st, 0, sizeof *st);
    st->step = m.step;
    st->global_batch = m.global_batch;
    st->have_eval = m.have_eval;
    st->eval0 = m.eval0, st->eval0_count = m.eval0_count;
    st->best = m.best, st->best_count = m.best_count, st->best_step = m.best_step;
    tz_info("resumed from %s: step %lld, written by %lld rank%s (zero stage %lld), read by %d%s",
            cur, (long long)m.step, (long long)m.world, m.world == 1 ? "" : "s",
            (long long)m.stage, comm->size, refused ? " (newer checkpoints refused above)" : "");
    meta_free(&m);
    free(map);
    free(t);
    return 1;
}
