/* Checkpoints of a run: the shards' layout (pieces of the tensors in every rank's slices),
 * the atomic write (temporary folder, fsync, marker, rename, pruning), the signals and the
 * test hook. Reading is checkpoint_resume.c's; HDF5 calls are io/ckpt_h5's. */
#define _GNU_SOURCE /* open_memstream */
#include "train/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "core/clock.h"
#include "core/error.h"
#include "io/ckpt_h5.h"
#include "io/fsutil.h"
#include "train/checkpoint_util.h"
#include "task/family.h"


/* ---------------------------------------------------------------- signals */

/* Set by the handlers, read at step boundaries: the one state a signal handler may touch. */
static volatile sig_atomic_t stop_signal, sigints;

static void on_signal(int sig) {
    if (sig == SIGINT && sigints++ > 0) { /* the second Ctrl-C: stop now */
        signal(SIGINT, SIG_DFL);
        raise(SIGINT);
        return;
    }
    stop_signal = sig;
}

void tz_ckpt_signals_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
}

void tz_ckpt_signals_default(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    if (stop_signal) raise(stop_signal); /* one that came after the last look */
}

static const char *signal_name(void) {
    return stop_signal == SIGUSR1 ? "SIGUSR1" : stop_signal == SIGTERM ? "SIGTERM" : "SIGINT";
}

int tz_ckpt_stop_agreed(tz_comm *comm) {
    int64_t s = stop_signal != 0;
    if (comm->size > 1) tz_comm_all_reduce(comm, &s, &s, 1, TZ_DT_I64);
    if (s && stop_signal)
        tz_info("%s received: finishing this step, writing a checkpoint, then stopping",
                signal_name());
    return s > 0;
}

int tz_ckpt_stop_at_start(tz_comm *comm, const char *stage, int64_t step) {
    tz_ckpt_fault(stage, step, comm->rank);
    int64_t s = stop_signal != 0;
    if (comm->size > 1) tz_comm_all_reduce(comm, &s, &s, 1, TZ_DT_I64);
    if (s && stop_signal)
        tz_info_all("%s received during start-up (at %s): stopping before the first step, "
                    "writing nothing", signal_name(), stage);
    return s > 0;
}

/* ---------------------------------------------------------------- fault injection (tests) */

int tz_ckpt_fault(const char *point, int64_t step, int rank) {
    const char *e = getenv("TZ_CKPT_FAULT");
    if (!e || !*e) return 0;
    int r = -1;
    long long s = 0;
    char at[32] = "", act[32] = "", buf[256];
    snprintf(buf, sizeof buf, "%s", e);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        if (sscanf(tok, "rank=%d", &r) == 1 || sscanf(tok, "step=%lld", &s) == 1 ||
            sscanf(tok, "at=%31s", at) == 1 || sscanf(tok, "do=%31s", act) == 1)
            continue;
    }
    if (r != rank || strcmp(at, point) || (s && s != step)) return 0;
    fprintf(stderr, "[rank %d] TZ_CKPT_FAULT: %s at %s of step %lld (pid %ld)\n", rank, act,
            point, (long long)step, (long)getpid());
    fflush(stderr);
    if (!strcmp(act, "kill")) raise(SIGKILL);
    /* pause: until a signal comes. Polled, not one sleep: a signal sent to the process may be
     * handled on any of its threads (MPI's, OpenMP's), where it would not end a sleep here */
    for (int i = 0; !strcmp(act, "pause") && !stop_signal && i < 36000; i++) usleep(100000);
    for (int i = 0; !strcmp(act, "hold") && i < 3600; i++) sleep(1); /* signals do not */
    return !strcmp(act, "fail");
}

/* ---------------------------------------------------------------- layout */

static int cmp_tensor(const void *a, const void *b) {
    const tz_ckpt_tensor *x = a, *y = b;
    return (x->flat_off > y->flat_off) - (x->flat_off < y->flat_off);
}

/* The trainable tensors in flat order. */
tz_ckpt_tensor *tz_ckpt_tensors(const tz_params *ps, int *nt) {
    tz_ckpt_tensor *t = tz_xcalloc((size_t)ps->n + 1, sizeof *t);
    int n = 0;
    for (int i = 0; i < ps->n; i++) {
        const tz_param *p = ps->p[i];
        if (!p->trainable) continue;
        snprintf(t[n].name, sizeof t[n].name, "%s", p->name);
        t[n].ndim = p->ndim;
        t[n].shape[0] = p->shape[0];
        t[n].shape[1] = p->ndim > 1 ? p->shape[1] : 0;
        t[n].numel = p->numel;
        t[n].flat_off = p->flat_off;
        t[n].bits = p->q ? p->q->bits : 0;
        n++;
    }
    qsort(t, (size_t)n, sizeof *t, cmp_tensor);
    *nt = n;
    return t;
}

tz_ckpt_bucket *tz_ckpt_buckets(const tz_zero_plan *p) {
    tz_ckpt_bucket *b = tz_xcalloc((size_t)p->n_buckets + 1, sizeof *b);
    for (int i = 0; i < p->n_buckets; i++)
        b[i] = (tz_ckpt_bucket){p->b[i].start, p->b[i].len, p->b[i].slice, p->b[i].shard_off};
    return b;
}

/* The pieces of rank's slices (buckets in order; in each, the tensors it touches), with
 * their positions in the rank's per-tensor datasets; *count per tensor (nt entries) when
 * count is not NULL. Returns the number of pieces. */
int64_t tz_ckpt_pieces(const tz_ckpt_bucket *b, int nb, int rank, const tz_ckpt_tensor *t, int nt,
                       tz_ckpt_piece **out, int64_t *count) {
    int64_t np = 0, cap = 16;
    tz_ckpt_piece *pc = tz_xmalloc((size_t)cap * sizeof *pc);
    int64_t *pos = tz_xcalloc((size_t)nt + 1, sizeof *pos);
    int j = 0;
    for (int i = 0; i < nb; i++) {
        int64_t lo = rank * b[i].slice, hi = lo + b[i].slice;
        if (lo > b[i].len) lo = b[i].len;
        if (hi > b[i].len) hi = b[i].len;
        const int64_t begin = b[i].start + lo, end = b[i].start + hi, base = b[i].start + rank * b[i].slice;
        while (j < nt && t[j].flat_off + t[j].numel <= begin) j++;
        for (int k = j; k < nt && t[k].flat_off < end; k++) {
            int64_t a = t[k].flat_off > begin ? t[k].flat_off : begin;
            int64_t e = t[k].flat_off + t[k].numel < end ? t[k].flat_off + t[k].numel : end;
            if (e <= a) continue;
            if (np == cap) pc = tz_xrealloc(pc, (size_t)(cap *= 2) * sizeof *pc);
            pc[np++] = (tz_ckpt_piece){k, rank, a - t[k].flat_off, e - a,
                                       b[i].shard_off + (a - base), pos[k]};
            pos[k] += e - a;
        }
    }
    if (count) memcpy(count, pos, (size_t)nt * sizeof *count);
    free(pos);
    *out = pc;
    return np;
}

/* ---------------------------------------------------------------- files and folders */

/* A path from a format; fatal when it does not fit. */
void tz_ckpt_pathf(char *out, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(out, n, fmt, ap);
    va_end(ap);
    if (k < 0 || (size_t)k >= n) TZ_FATAL("path too long: %s...", out);
}

static int fsync_path(const char *path, int dir, char *err, size_t n) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | (dir ? O_DIRECTORY : 0));
    if (fd < 0) return tz_errf(err, n, "%s: %s", path, strerror(errno));
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    return rc ? tz_errf(err, n, "%s: fsync: %s", path, strerror(e)) : 0;
}

static int write_synced(const char *path, const char *text, char *err, size_t n) {
    FILE *f = fopen(path, "w");
    if (!f) return tz_errf(err, n, "%s: %s", path, strerror(errno));
    int ok = fputs(text, f) >= 0 && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int e = errno;
    if (fclose(f) != 0) ok = 0;
    return ok ? 0 : tz_errf(err, n, "%s: %s", path, strerror(e ? e : EIO));
}

/* Removes a folder of plain files (a checkpoint); a missing folder is fine. */
static void remove_folder(const char *path) {
    DIR *d = opendir(path);
    if (!d) return;
    struct dirent *e;
    char p[TZ_CKPT_PATH];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            tz_ckpt_pathf(p, sizeof p, "%s/%s", path, e->d_name);
            unlink(p);
        }
    closedir(d);
    rmdir(path);
}

/* "step-<digits>" -> the number, else -1. */
int64_t tz_ckpt_step_of_name(const char *name) {
    if (strncmp(name, "step-", 5) || !name[5]) return -1;
    char *end;
    long long v = strtoll(name + 5, &end, 10);
    return *end || v < 0 ? -1 : v;
}

/* The COMPLETE marker: the step, then checkpoint.json's size and CRC-32, so that a
 * checkpoint.json edited or damaged after the write is refused. */
void tz_ckpt_marker_text(char *out, size_t n, int64_t step, const char *json, size_t len) {
    const uint32_t crc = (uint32_t)crc32(crc32(0L, Z_NULL, 0), (const Bytef *)json, (uInt)len);
    snprintf(out, n, "step %lld\ncheckpoint.json %zu %08x\n", (long long)step, len, crc);
}

static int cmp_desc(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x < y) - (x > y);
}

/* The steps of the step-<N> folders in dir, newest first (complete or not). */
int64_t *tz_ckpt_list_steps(const char *dir, int *n) {
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return NULL;
    int cap = 16;
    int64_t *s = tz_xmalloc((size_t)cap * sizeof *s);
    struct dirent *e;
    while ((e = readdir(d))) {
        int64_t v = tz_ckpt_step_of_name(e->d_name);
        if (v < 0) continue;
        if (*n == cap) s = tz_xrealloc(s, (size_t)(cap *= 2) * sizeof *s);
        s[(*n)++] = v;
    }
    closedir(d);
    qsort(s, (size_t)*n, sizeof *s, cmp_desc);
    return s;
}

/* Every rank's message ("" when fine) gathered on every rank: a [size][TZ_CKPT_MSG] array and the
 * number of ranks that failed. Collective. */
char *tz_ckpt_gather_msgs(tz_comm *comm, const char *mine, int *failed) {
    char *all = tz_xcalloc((size_t)comm->size, TZ_CKPT_MSG), own[TZ_CKPT_MSG];
    snprintf(own, sizeof own, "%s", mine);
    if (comm->size > 1) {
        memcpy(all + (size_t)comm->rank * TZ_CKPT_MSG, own, TZ_CKPT_MSG);
        tz_comm_all_gather(comm, all + (size_t)comm->rank * TZ_CKPT_MSG, all, TZ_CKPT_MSG, TZ_DT_U8);
    } else {
        memcpy(all, own, TZ_CKPT_MSG);
    }
    *failed = 0;
    for (int r = 0; r < comm->size; r++) *failed += all[(size_t)r * TZ_CKPT_MSG] != 0;
    return all;
}

/* Every rank says what failed (each failing rank's message, then `what`), and stops. */
void tz_ckpt_fail_all(tz_comm *comm, const char *msgs, const char *what) {
    for (int r = 0; r < comm->size; r++)
        if (msgs[(size_t)r * TZ_CKPT_MSG]) tz_warn("rank %d failed: %s", r, msgs + (size_t)r * TZ_CKPT_MSG);
    tz_comm_barrier(comm); /* every rank has printed before the first abort */
    TZ_FATAL("%s", what);
}

/* ---------------------------------------------------------------- writing */

static int write_shard(const char *file, const tz_zero *z, const tz_ckpt_tensor *t, int nt, int rank,
                       int64_t step, char *err, size_t errlen) {
    tz_ckpt_bucket *b = tz_ckpt_buckets(&z->plan);
    tz_ckpt_piece *pc;
    int64_t *count = tz_xcalloc((size_t)nt + 1, sizeof *count);
    const int64_t np = tz_ckpt_pieces(b, z->plan.n_buckets, rank, t, nt, &pc, count);
    int64_t most = 1;
    for (int i = 0; i < nt; i++) most = count[i] > most ? count[i] : most;
    size_t widest = 1; /* bytes of the widest element of a saved array */
    for (int a = 0; a < z->sh.n_arrays; a++)
        if (z->sh.a[a].saved && z->sh.a[a].elem_bytes > widest) widest = z->sh.a[a].elem_bytes;
    char *buf = tz_xmalloc((size_t)most * widest);
    int64_t *pairs = tz_xmalloc((size_t)(2 * np + 2) * sizeof *pairs);
    int rc = 0;
    tz_h5_shard *f = tz_h5_shard_create(file, err, errlen);
    if (!f) rc = -1;
    const int64_t head[4] = {TZ_CKPT_VERSION, step, rank, z->plan.world};
    static const char *const hn[4] = {"format_version", "step", "rank", "world"};
    for (int k = 0; !rc && k < 4; k++) rc = tz_h5_shard_attr(f, "", hn[k], &head[k], 1, err, errlen);
    for (int a = 0; !rc && a < z->sh.n_arrays; a++) {
        const tz_shard_array *arr = &z->sh.a[a];
        if (!arr->saved) continue;
        for (int i = 0; !rc && i < nt; i++) {
            if (!count[i]) continue;
            int64_t at = 0, k = 0;
            for (int64_t q = 0; q < np; q++) {
                if (pc[q].t != i) continue;
                const size_t es = arr->elem_bytes;
                memcpy(buf + at * es, (const char *)arr->data + pc[q].shard * es, (size_t)pc[q].n * es);
                pairs[2 * k] = pc[q].lo, pairs[2 * k + 1] = pc[q].n;
                at += pc[q].n, k++;
            }
            rc = tz_h5_shard_write(f, arr->name, t[i].name, arr->dtype, buf, at, t[i].shape,
                                   t[i].ndim, t[i].flat_off, pairs, k, err, errlen);
        }
    }
    if (f && tz_h5_shard_close(f, rc ? NULL : err, rc ? 0 : errlen)) rc = -1;
    free(pairs);
    free(buf);
    free(count);
    free(pc);
    free(b);
    return rc;
}

char *tz_ckpt_config_text(const tz_config *cfg) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) TZ_FATAL("open_memstream: %s", strerror(errno));
    tz_config_names names;
    tz_family_names(&names);
    tz_config_write(cfg, &names, f);
    fclose(f);
    return text;
}

static json_t *int_pair(int64_t a, int64_t b) {
    json_t *p = json_array();
    json_array_append_new(p, json_integer(a));
    json_array_append_new(p, json_integer(b));
    return p;
}

/* checkpoint.json: everything every rank shares. */
static char *meta_text(const tz_config *cfg, const tz_zero *z, const tz_ckpt_state *st,
                       const tz_ckpt_tensor *t, int nt, const int64_t *rec) {
    json_t *m = json_object();
    json_object_set_new(m, "format", json_string(TZ_CKPT_FORMAT));
    json_object_set_new(m, "version", json_integer(TZ_CKPT_VERSION));
    json_object_set_new(m, "step", json_integer(st->step));
    json_object_set_new(m, "steps", json_integer(cfg->train.steps));
    if (st->run_id[0]) json_object_set_new(m, "run_id", json_string(st->run_id));
    json_t *d = json_object();
    json_object_set_new(d, "global_batch", json_integer(st->global_batch));
    json_object_set_new(d, "next_row", json_integer(st->step * st->global_batch));
    json_object_set_new(d, "ranks", json_integer(z->comm->size));
    json_object_set_new(d, "micro_batch", json_integer(cfg->train.micro_batch));
    json_object_set_new(d, "grad_accum", json_integer(cfg->train.grad_accum));
    json_object_set_new(m, "data", d);
    json_t *r = json_object();
    json_object_set_new(r, "seed", json_integer(cfg->run.seed));
    json_object_set_new(r, "streams", json_string("counter-based: every draw derives from (run.seed, "
                                                  "row index, purpose), so data.next_row is the "
                                                  "whole RNG state"));
    json_object_set_new(m, "rng", r);
    if (st->have_eval) {
        json_t *e = json_object();
        json_object_set_new(e, "before", json_real(st->eval0));
        json_object_set_new(e, "before_count", json_integer(st->eval0_count));
        json_object_set_new(e, "best", json_real(st->best));
        json_object_set_new(e, "best_count", json_integer(st->best_count));
        json_object_set_new(e, "best_step", json_integer(st->best_step));
        json_object_set_new(m, "eval", e);
    }
    json_t *o = json_object(), *arrays = json_array();
    json_object_set_new(o, "name", json_string(z->sh.opt->name));
    for (int a = 0; a < z->sh.n_arrays; a++)
        if (z->sh.a[a].saved) json_array_append_new(arrays, json_string(z->sh.a[a].name));
    json_object_set_new(o, "arrays", arrays);
    json_object_set_new(m, "optimizer", o);
    const tz_zero_plan *p = &z->plan;
    json_t *zp = json_object(), *bs = json_array(), *owned = json_array();
    json_object_set_new(zp, "stage", json_integer(z->stage));
    json_object_set_new(zp, "world", json_integer(p->world));
    json_object_set_new(zp, "bucket_elems", json_integer(p->bucket_elems));
    json_object_set_new(zp, "align", json_integer(p->align));
    json_object_set_new(zp, "flat_numel", json_integer(p->flat_numel));
    json_object_set_new(zp, "shard_numel", json_integer(p->shard_numel));
    for (int i = 0; i < p->n_buckets; i++) {
        json_t *b = json_array();
        const int64_t v[5] = {p->b[i].start, p->b[i].len, p->b[i].padded, p->b[i].slice, p->b[i].shard_off};
        for (int k = 0; k < 5; k++) json_array_append_new(b, json_integer(v[k]));
        json_array_append_new(bs, b);
    }
    json_object_set_new(zp, "bucket_fields", json_string("start, len, padded, slice, shard_off"));
    json_object_set_new(zp, "buckets", bs);
    for (int q = 0; q < p->world; q++) {
        json_t *rr = json_array();
        for (int i = 0; i < p->n_buckets; i++) {
            int64_t lo, hi;
            tz_zero_plan_slice(p, i, q, &lo, &hi);
            if (hi > lo) json_array_append_new(rr, int_pair(lo, hi));
        }
        json_array_append_new(owned, rr);
    }
    json_object_set_new(zp, "owned", owned); /* per rank: flat [begin, end) ranges */
    json_object_set_new(m, "zero", zp);
    json_t *ts = json_array();
    for (int i = 0; i < nt; i++) {
        json_t *e = json_object(), *sh = json_array();
        json_object_set_new(e, "name", json_string(t[i].name));
        for (int k = 0; k < t[i].ndim; k++) json_array_append_new(sh, json_integer(t[i].shape[k]));
        json_object_set_new(e, "shape", sh);
        json_object_set_new(e, "flat_offset", json_integer(t[i].flat_off));
        json_object_set_new(e, "numel", json_integer(t[i].numel));
        json_object_set_new(e, "quant_bits", json_integer(t[i].bits));
        json_array_append_new(ts, e);
    }
    json_object_set_new(m, "tensors", ts);
    json_t *sh = json_array();
    for (int q = 0; q < p->world; q++) {
        char name[32];
        snprintf(name, sizeof name, "rank-%05d.h5", q);
        json_t *e = json_object();
        json_object_set_new(e, "file", json_string(name));
        json_object_set_new(e, "bytes", json_integer(rec[2 * q]));
        json_object_set_new(e, "crc32", json_integer(rec[2 * q + 1]));
        json_array_append_new(sh, e);
    }
    json_object_set_new(m, "shards", sh);
    char *cfgtext = tz_ckpt_config_text(cfg);
    json_object_set_new(m, "config", json_string(cfgtext));
    free(cfgtext);
    char *s = json_dumps(m, JSON_INDENT(1));
    json_decref(m);
    return s;
}

/* Rank 0: removes the checkpoints older than the newest `keep` complete ones but step-<best>
 * (train.keep_best; -1: none), and stale temporary folders of earlier steps. */
static void prune(const char *dir, int64_t keep, int64_t step, int64_t best) {
    int n;
    int64_t *s = tz_ckpt_list_steps(dir, &n), floor = -1;
    char p[TZ_CKPT_PATH];
    for (int i = 0, kept = 0; keep > 0 && i < n; i++) {
        tz_ckpt_pathf(p, sizeof p, "%s/step-%lld/COMPLETE", dir, (long long)s[i]);
        if (tz_path_exists(p) && ++kept == keep) floor = s[i];
    }
    for (int i = 0; floor >= 0 && i < n; i++)
        if (s[i] < floor && s[i] != best) {
            tz_ckpt_pathf(p, sizeof p, "%s/step-%lld", dir, (long long)s[i]);
            remove_folder(p);
        }
    free(s);
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (strncmp(e->d_name, ".tmp-", 5) || tz_ckpt_step_of_name(e->d_name + 5) >= step) continue;
        tz_ckpt_pathf(p, sizeof p, "%s/%s", dir, e->d_name);
        remove_folder(p);
    }
    if (d) closedir(d);
}

/* Rank 0, train.keep_best: dir/best, a symbolic link to step-<best> (replaced by a rename, so
 * that it always names one), once that checkpoint is complete. */
static void link_best(const char *dir, int64_t best) {
    char p[TZ_CKPT_PATH], target[64], tmp[TZ_CKPT_PATH];
    snprintf(target, sizeof target, "step-%lld", (long long)best);
    tz_ckpt_pathf(p, sizeof p, "%s/%s/COMPLETE", dir, target);
    if (!tz_path_exists(p)) return;
    tz_ckpt_pathf(tmp, sizeof tmp, "%s/.best-link", dir);
    tz_ckpt_pathf(p, sizeof p, "%s/best", dir);
    unlink(tmp);
    if (symlink(target, tmp) != 0 || rename(tmp, p) != 0)
        tz_warn("%s: cannot link the best checkpoint, %s: %s", p, target, strerror(errno));
}

void tz_ckpt_write(const tz_config *cfg, tz_zero *z, const tz_ckpt_state *st, int64_t keep) {
    tz_comm *comm = z->comm;
    const int rank = comm->rank, root = rank == 0, W = z->plan.world;
    const int64_t step = st->step;
    const double t0 = tz_clock_s();
    tz_zero_sync_host(z); /* the optimizer on the backend: its state into the host shard */
    char dir[TZ_CKPT_PATH], tmp[TZ_CKPT_PATH], fin[TZ_CKPT_PATH], file[TZ_CKPT_PATH], err[TZ_CKPT_MSG] = "", what[TZ_CKPT_PATH + 200];
    tz_path_join(dir, sizeof dir, cfg->run.dir, "checkpoints");
    tz_ckpt_pathf(tmp, sizeof tmp, "%s/.tmp-step-%lld", dir, (long long)step);
    tz_ckpt_pathf(fin, sizeof fin, "%s/step-%lld", dir, (long long)step);
    snprintf(what, sizeof what, "checkpoint %s was not written; earlier checkpoints are kept", fin);
    int failed;
    char *msgs;
    tz_ckpt_fault("begin", step, rank);
    if (root) {
        if (tz_mkdir_p(dir, err, sizeof err) == 0) {
            remove_folder(tmp);
            if (mkdir(tmp, 0755) != 0) tz_errf(err, sizeof err, "%s: %s", tmp, strerror(errno));
        }
    }
    msgs = tz_ckpt_gather_msgs(comm, err, &failed);
    if (failed) tz_ckpt_fail_all(comm, msgs, what);
    free(msgs);

    int nt;
    tz_ckpt_tensor *t = tz_ckpt_tensors(z->ps, &nt);
    int64_t rec[3] = {0, 0, 0}; /* bytes, crc of this rank's shard */
    if (rank < W) {
        tz_ckpt_pathf(file, sizeof file, "%s/rank-%05d.h5", tmp, rank);
        uint32_t crc = 0;
        if (write_shard(file, z, t, nt, rank, step, err, sizeof err) == 0 &&
            tz_file_sync_crc(file, &rec[0], &crc, err, sizeof err) == 0)
            rec[1] = crc;
        if (!err[0] && tz_ckpt_fault("shard", step, rank))
            tz_errf(err, sizeof err, "%s: No space left on device (TZ_CKPT_FAULT)", file);
    }
    msgs = tz_ckpt_gather_msgs(comm, err, &failed);
    int64_t *all = tz_xcalloc((size_t)comm->size * 2, sizeof *all);
    memcpy(all + 2 * rank, rec, 2 * sizeof *all);
    if (comm->size > 1) tz_comm_all_gather(comm, all + 2 * rank, all, 2, TZ_DT_I64);
    if (failed) {
        if (root) remove_folder(tmp);
        tz_ckpt_fail_all(comm, msgs, what);
    }
    free(msgs);

    if (root) { /* the shared file, the marker last, then the rename */
        char *meta = meta_text(cfg, z, st, t, nt, all), mark[160];
        tz_ckpt_pathf(file, sizeof file, "%s/checkpoint.json", tmp);
        tz_ckpt_marker_text(mark, sizeof mark, step, meta, strlen(meta));
        int rc = write_synced(file, meta, err, sizeof err);
        if (!rc && tz_ckpt_fault("meta", step, rank))
            rc = tz_errf(err, sizeof err, "%s: No space left on device (TZ_CKPT_FAULT)", file);
        tz_ckpt_pathf(file, sizeof file, "%s/COMPLETE", tmp);
        if (!rc) rc = write_synced(file, mark, err, sizeof err);
        if (!rc) rc = fsync_path(tmp, 1, err, sizeof err);
        tz_ckpt_fault("rename", step, rank);
        if (!rc && tz_path_exists(fin)) { /* an incomplete or damaged one of this step */
            char old[TZ_CKPT_PATH + 16];
            tz_ckpt_pathf(old, sizeof old, "%s/.old-step-%lld", dir, (long long)step);
            remove_folder(old);
            if (rename(fin, old) != 0) rc = tz_errf(err, sizeof err, "%s: %s", fin, strerror(errno));
            else remove_folder(old);
        }
        if (!rc && rename(tmp, fin) != 0)
            rc = tz_errf(err, sizeof err, "rename %s -> %s: %s", tmp, fin, strerror(errno));
        if (!rc) rc = fsync_path(dir, 1, err, sizeof err);
        if (rc) remove_folder(tmp);
        free(meta);
    }
    msgs = tz_ckpt_gather_msgs(comm, err, &failed);
    if (failed) tz_ckpt_fail_all(comm, msgs, what);
    free(msgs);
    int64_t bytes = 0;
    for (int q = 0; q < W; q++) bytes += all[2 * q];
    const int64_t best = cfg->train.keep_best && st->have_eval && st->best_step > 0 ?
                         st->best_step : -1;
    if (root) prune(dir, keep, step, best);
    if (root && best > 0) link_best(dir, best);
    tz_info("checkpoint %s: %d shard%s, %.2f MiB, %.2f s", fin, W, W == 1 ? "" : "s",
            (double)bytes / 1048576.0, tz_clock_s() - t0);
    free(all);
    free(t);
}

