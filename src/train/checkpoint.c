/* Checkpoints of a run: the shards' layout (pieces of the tensors in every rank's slices),
 * the atomic write (temporary folder, fsync, marker, rename), the search for the newest
 * complete checkpoint with its checks, the re-cut read at any rank count, the signals. The
 * HDF5 calls are io/ckpt_h5's; the step loop is train/trainer's. */
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

#include "core/error.h"
#include "io/ckpt_h5.h"
#include "io/fsutil.h"
#include "train/family.h"

#define FORMAT "turbozero-checkpoint"
#define VERSION 1
#define MSG 480  /* one rank's error message, gathered by every rank */
#define PATHN 1200

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

int tz_ckpt_stop_agreed(tz_comm *comm) {
    int64_t s = stop_signal != 0;
    if (comm->size > 1) tz_comm_all_reduce(comm, &s, &s, 1, TZ_DT_I64);
    if (s && stop_signal)
        tz_info("%s received: finishing this step, writing a checkpoint, then stopping",
                stop_signal == SIGUSR1 ? "SIGUSR1" : stop_signal == SIGTERM ? "SIGTERM" : "SIGINT");
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
    fprintf(stderr, "[rank %d] TZ_CKPT_FAULT: %s at %s of step %lld\n", rank, act, point,
            (long long)step);
    fflush(stderr);
    if (!strcmp(act, "kill")) raise(SIGKILL);
    if (!strcmp(act, "pause")) sleep(3600); /* a signal ends it */
    for (int i = 0; !strcmp(act, "hold") && i < 3600; i++) sleep(1); /* signals do not */
    return !strcmp(act, "fail");
}

/* ---------------------------------------------------------------- layout */

typedef struct ck_tensor {
    char name[TZ_NAME_MAX];
    int ndim;
    int64_t shape[2], numel, flat_off;
    int bits; /* stored quantized in the model (full fine-tuning of a quantized base); 0 dense */
} ck_tensor;

typedef struct ck_bucket {
    int64_t start, len, slice, shard_off;
} ck_bucket;

/* Elements [lo, lo + n) of tensor t, in rank's slice at shard offset `shard`, stored at
 * `pos` of the tensor's dataset in the rank's file. */
typedef struct ck_piece {
    int t, rank;
    int64_t lo, n, shard, pos;
} ck_piece;

static int cmp_tensor(const void *a, const void *b) {
    const ck_tensor *x = a, *y = b;
    return (x->flat_off > y->flat_off) - (x->flat_off < y->flat_off);
}

/* The trainable tensors in flat order. */
static ck_tensor *tensors_of(const tz_params *ps, int *nt) {
    ck_tensor *t = tz_xcalloc((size_t)ps->n + 1, sizeof *t);
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

static ck_bucket *buckets_of(const tz_zero_plan *p) {
    ck_bucket *b = tz_xcalloc((size_t)p->n_buckets + 1, sizeof *b);
    for (int i = 0; i < p->n_buckets; i++)
        b[i] = (ck_bucket){p->b[i].start, p->b[i].len, p->b[i].slice, p->b[i].shard_off};
    return b;
}

/* The pieces of rank's slices (buckets in order; in each, the tensors it touches), with
 * their positions in the rank's per-tensor datasets; *count per tensor (nt entries) when
 * count is not NULL. Returns the number of pieces. */
static int64_t pieces_of(const ck_bucket *b, int nb, int rank, const ck_tensor *t, int nt,
                         ck_piece **out, int64_t *count) {
    int64_t np = 0, cap = 16;
    ck_piece *pc = tz_xmalloc((size_t)cap * sizeof *pc);
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
            pc[np++] = (ck_piece){k, rank, a - t[k].flat_off, e - a,
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
static void pathf(char *out, size_t n, const char *fmt, ...) TZ_PRINTF(3, 4);
static void pathf(char *out, size_t n, const char *fmt, ...) {
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
    char p[PATHN];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            pathf(p, sizeof p, "%s/%s", path, e->d_name);
            unlink(p);
        }
    closedir(d);
    rmdir(path);
}

static char *read_text(const char *path, char *err, size_t n) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        tz_errf(err, n, "%s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 4096, len = 0, k;
    char *s = tz_xmalloc(cap);
    while ((k = fread(s + len, 1, cap - len - 1, f)) > 0)
        if ((len += k) + 1 >= cap) s = tz_xrealloc(s, cap *= 2);
    fclose(f);
    s[len] = 0;
    return s;
}

/* "step-<digits>" -> the number, else -1. */
static int64_t step_of_name(const char *name) {
    if (strncmp(name, "step-", 5) || !name[5]) return -1;
    char *end;
    long long v = strtoll(name + 5, &end, 10);
    return *end || v < 0 ? -1 : v;
}

static int cmp_desc(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x < y) - (x > y);
}

/* The steps of the step-<N> folders in dir, newest first (complete or not). */
static int64_t *list_steps(const char *dir, int *n) {
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return NULL;
    int cap = 16;
    int64_t *s = tz_xmalloc((size_t)cap * sizeof *s);
    struct dirent *e;
    while ((e = readdir(d))) {
        int64_t v = step_of_name(e->d_name);
        if (v < 0) continue;
        if (*n == cap) s = tz_xrealloc(s, (size_t)(cap *= 2) * sizeof *s);
        s[(*n)++] = v;
    }
    closedir(d);
    qsort(s, (size_t)*n, sizeof *s, cmp_desc);
    return s;
}

/* Every rank's message ("" when fine) gathered on every rank: a [size][MSG] array and the
 * number of ranks that failed. Collective. */
static char *gather_msgs(tz_comm *comm, const char *mine, int *failed) {
    char *all = tz_xcalloc((size_t)comm->size, MSG), own[MSG];
    snprintf(own, sizeof own, "%s", mine);
    if (comm->size > 1) {
        memcpy(all + (size_t)comm->rank * MSG, own, MSG);
        tz_comm_all_gather(comm, all + (size_t)comm->rank * MSG, all, MSG, TZ_DT_U8);
    } else {
        memcpy(all, own, MSG);
    }
    *failed = 0;
    for (int r = 0; r < comm->size; r++) *failed += all[(size_t)r * MSG] != 0;
    return all;
}

/* Every rank says what failed (each failing rank's message, then `what`), and stops. */
TZ_NORETURN static void fail_all(tz_comm *comm, const char *msgs, const char *what) {
    for (int r = 0; r < comm->size; r++)
        if (msgs[(size_t)r * MSG]) tz_warn("rank %d failed: %s", r, msgs + (size_t)r * MSG);
    tz_comm_barrier(comm); /* every rank has printed before the first abort */
    TZ_FATAL("%s", what);
}

/* ---------------------------------------------------------------- writing */

static int write_shard(const char *file, const tz_zero *z, const ck_tensor *t, int nt, int rank,
                       int64_t step, char *err, size_t errlen) {
    ck_bucket *b = buckets_of(&z->plan);
    ck_piece *pc;
    int64_t *count = tz_xcalloc((size_t)nt + 1, sizeof *count);
    const int64_t np = pieces_of(b, z->plan.n_buckets, rank, t, nt, &pc, count);
    int64_t most = 1;
    for (int i = 0; i < nt; i++) most = count[i] > most ? count[i] : most;
    float *buf = tz_xmalloc((size_t)most * sizeof *buf);
    int64_t *pairs = tz_xmalloc((size_t)(2 * np + 2) * sizeof *pairs);
    int rc = 0;
    tz_h5_shard *f = tz_h5_shard_create(file, err, errlen);
    if (!f) rc = -1;
    const int64_t head[4] = {VERSION, step, rank, z->plan.world};
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
                memcpy(buf + at, (const float *)arr->data + pc[q].shard, (size_t)pc[q].n * sizeof(float));
                pairs[2 * k] = pc[q].lo, pairs[2 * k + 1] = pc[q].n;
                at += pc[q].n, k++;
            }
            rc = tz_h5_shard_write(f, arr->name, t[i].name, buf, at, t[i].shape, t[i].ndim,
                                   t[i].flat_off, pairs, k, err, errlen);
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

static char *config_text(const tz_config *cfg) {
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
                       const ck_tensor *t, int nt, const int64_t *rec) {
    json_t *m = json_object();
    json_object_set_new(m, "format", json_string(FORMAT));
    json_object_set_new(m, "version", json_integer(VERSION));
    json_object_set_new(m, "step", json_integer(st->step));
    json_object_set_new(m, "steps", json_integer(cfg->train.steps));
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
    char *cfgtext = config_text(cfg);
    json_object_set_new(m, "config", json_string(cfgtext));
    free(cfgtext);
    char *s = json_dumps(m, JSON_INDENT(1));
    json_decref(m);
    return s;
}

/* Rank 0: removes the checkpoints older than the newest `keep` complete ones, and stale
 * temporary folders of earlier steps. */
static void prune(const char *dir, int64_t keep, int64_t step) {
    int n;
    int64_t *s = list_steps(dir, &n), floor = -1;
    char p[PATHN];
    for (int i = 0, kept = 0; keep > 0 && i < n; i++) {
        pathf(p, sizeof p, "%s/step-%lld/COMPLETE", dir, (long long)s[i]);
        if (tz_path_exists(p) && ++kept == keep) floor = s[i];
    }
    for (int i = 0; floor >= 0 && i < n; i++)
        if (s[i] < floor) {
            pathf(p, sizeof p, "%s/step-%lld", dir, (long long)s[i]);
            remove_folder(p);
        }
    free(s);
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (strncmp(e->d_name, ".tmp-", 5) || step_of_name(e->d_name + 5) >= step) continue;
        pathf(p, sizeof p, "%s/%s", dir, e->d_name);
        remove_folder(p);
    }
    if (d) closedir(d);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void tz_ckpt_write(const tz_config *cfg, tz_zero *z, const tz_ckpt_state *st, int64_t keep) {
    tz_comm *comm = z->comm;
    const int rank = comm->rank, root = rank == 0, W = z->plan.world;
    const int64_t step = st->step;
    const double t0 = now_s();
    char dir[PATHN], tmp[PATHN], fin[PATHN], file[PATHN], err[MSG] = "", what[PATHN + 200];
    tz_path_join(dir, sizeof dir, cfg->run.dir, "checkpoints");
    pathf(tmp, sizeof tmp, "%s/.tmp-step-%lld", dir, (long long)step);
    pathf(fin, sizeof fin, "%s/step-%lld", dir, (long long)step);
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
    msgs = gather_msgs(comm, err, &failed);
    if (failed) fail_all(comm, msgs, what);
    free(msgs);

    int nt;
    ck_tensor *t = tensors_of(z->ps, &nt);
    int64_t rec[3] = {0, 0, 0}; /* bytes, crc of this rank's shard */
    if (rank < W) {
        pathf(file, sizeof file, "%s/rank-%05d.h5", tmp, rank);
        uint32_t crc = 0;
        if (write_shard(file, z, t, nt, rank, step, err, sizeof err) == 0 &&
            tz_file_sync_crc(file, &rec[0], &crc, err, sizeof err) == 0)
            rec[1] = crc;
        if (!err[0] && tz_ckpt_fault("shard", step, rank))
            tz_errf(err, sizeof err, "%s: No space left on device (TZ_CKPT_FAULT)", file);
    }
    msgs = gather_msgs(comm, err, &failed);
    int64_t *all = tz_xcalloc((size_t)comm->size * 2, sizeof *all);
    memcpy(all + 2 * rank, rec, 2 * sizeof *all);
    if (comm->size > 1) tz_comm_all_gather(comm, all + 2 * rank, all, 2, TZ_DT_I64);
    if (failed) {
        if (root) remove_folder(tmp);
        fail_all(comm, msgs, what);
    }
    free(msgs);

    if (root) { /* the shared file, the marker last, then the rename */
        char *meta = meta_text(cfg, z, st, t, nt, all), mark[64];
        pathf(file, sizeof file, "%s/checkpoint.json", tmp);
        snprintf(mark, sizeof mark, "step %lld\n", (long long)step);
        int rc = write_synced(file, meta, err, sizeof err);
        if (!rc && tz_ckpt_fault("meta", step, rank))
            rc = tz_errf(err, sizeof err, "%s: No space left on device (TZ_CKPT_FAULT)", file);
        pathf(file, sizeof file, "%s/COMPLETE", tmp);
        if (!rc) rc = write_synced(file, mark, err, sizeof err);
        if (!rc) rc = fsync_path(tmp, 1, err, sizeof err);
        tz_ckpt_fault("rename", step, rank);
        if (!rc && tz_path_exists(fin)) { /* an incomplete or damaged one of this step */
            char old[PATHN + 16];
            pathf(old, sizeof old, "%s/.old-step-%lld", dir, (long long)step);
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
    msgs = gather_msgs(comm, err, &failed);
    if (failed) fail_all(comm, msgs, what);
    free(msgs);
    int64_t bytes = 0;
    for (int q = 0; q < W; q++) bytes += all[2 * q];
    if (root) prune(dir, keep, step);
    tz_info("checkpoint %s: %d shard%s, %.2f MiB, %.2f s", fin, W, W == 1 ? "" : "s",
            (double)bytes / 1048576.0, now_s() - t0);
    free(all);
    free(t);
}

/* ---------------------------------------------------------------- reading */

typedef struct ck_meta {
    int64_t step, global_batch, stage, world, nb, nt, na;
    ck_bucket *b;
    ck_tensor *t;
    int64_t *bytes, *crc;     /* per shard file */
    char arrays[TZ_SHARD_MAX_ARRAYS][32];
    int have_eval;
    double eval0, best;
    int64_t eval0_count, best_count, best_step;
} ck_meta;

static void meta_free(ck_meta *m) {
    free(m->b);
    free(m->t);
    free(m->bytes);
    free(m->crc);
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
    if (!fmt || strcmp(fmt, FORMAT) || get_int(j, "version", &version) || version != VERSION)
        rc = tz_errf(err, n, "checkpoint.json: not a %s version %d file", FORMAT, VERSION);
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
            m->b[i] = (ck_bucket){v[0], v[1], v[3], v[4]};
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
    const ck_piece *x = a, *y = b;
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
static int load_shards(const ck_meta *m, const char *folder, tz_zero *z, const ck_tensor *t,
                       int nt, const int *map, char *err, size_t errlen) {
    const int r = z->stage == 0 ? 0 : z->comm->rank;
    /* where every saved element is: pieces of every saved rank, by (tensor, offset) */
    int64_t ns = 0, *total = tz_xcalloc((size_t)(m->world * m->nt) + 1, sizeof *total);
    ck_piece *saved = NULL;
    for (int q = 0; q < m->world; q++) {
        ck_piece *pc;
        int64_t k = pieces_of(m->b, (int)m->nb, q, m->t, (int)m->nt, &pc, total + q * m->nt);
        saved = tz_xrealloc(saved, (size_t)(ns + k + 1) * sizeof *saved);
        memcpy(saved + ns, pc, (size_t)k * sizeof *pc);
        ns += k;
        free(pc);
    }
    qsort(saved, (size_t)ns, sizeof *saved, cmp_piece);
    ck_bucket *b = buckets_of(&z->plan);
    ck_piece *mine;
    const int64_t nm = pieces_of(b, z->plan.n_buckets, r, t, nt, &mine, NULL);
    int64_t nr = 0, cap = nm + 16, want = 0, got = 0;
    ck_read *rd = tz_xmalloc((size_t)cap * sizeof *rd);
    for (int64_t i = 0; i < nm; i++) {
        const ck_piece *c = &mine[i];
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
        char file[PATHN];
        pathf(file, sizeof file, "%s/rank-%05d.h5", folder, q);
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
                             const ck_tensor *t, int nt, int64_t global_batch, int *map) {
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

/* Rank 0: the checkpoint folders to try, newest first; *one when path names one checkpoint
 * (no fall back). */
static char **candidates(const tz_config *cfg, const char *path, int *n, int *one, char *where,
                         size_t wn) {
    char p[PATHN], dir[PATHN];
    *one = 0;
    *n = 0;
    if (!path || !*path) {
        tz_path_join(dir, sizeof dir, cfg->run.dir, "checkpoints");
    } else {
        struct stat sb;
        if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode))
            TZ_FATAL("--resume %s: no such folder", path);
        pathf(p, sizeof p, "%s/checkpoint.json", path);
        char c2[PATHN];
        pathf(c2, sizeof c2, "%s/COMPLETE", path);
        const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
        if (tz_path_exists(p) || tz_path_exists(c2) || step_of_name(base) >= 0) {
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
    int64_t *s = list_steps(dir, &k);
    char **c = tz_xcalloc((size_t)k + 1, sizeof *c);
    for (int i = 0; i < k; i++) {
        pathf(p, sizeof p, "%s/step-%lld", dir, (long long)s[i]);
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
    char **cand = NULL, where[PATHN] = "", cur[PATHN];
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
        char err[MSG] = "";
        int parsed = 0;
        memset(cur, 0, sizeof cur);
        if (root) snprintf(cur, sizeof cur, "%s", cand[i]);
        tz_comm_bcast(comm, cur, (int64_t)sizeof cur, TZ_DT_U8, 0);
        /* rank 0: the marker and the shared file; every rank gets its text */
        char *text = NULL, p[PATHN + 32];
        int64_t len = -1;
        if (root) {
            pathf(p, sizeof p, "%s/COMPLETE", cur);
            if (!tz_path_exists(p)) {
                tz_errf(err, sizeof err, "%s: no COMPLETE marker (its write did not finish)", cur);
            } else {
                pathf(p, sizeof p, "%s/checkpoint.json", cur);
                text = read_text(p, err, sizeof err);
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
                    pathf(p, sizeof p, "%s/rank-%05lld.h5", cur, (long long)q);
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
        char *msgs = gather_msgs(comm, err, &failed);
        if (failed) {
            if (parsed) meta_free(&m);
            for (int r = 0; r < comm->size; r++)
                if (msgs[(size_t)r * MSG] && root) tz_warn("checkpoint refused: %s", msgs + (size_t)r * MSG);
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
    ck_tensor *t = tensors_of(z->ps, &nt);
    int *map = tz_xcalloc((size_t)nt + 1, sizeof *map);
    check_compatible(&m, cur, z, t, nt, global_batch, map);
    char err[MSG] = "";
    load_shards(&m, cur, z, t, nt, map, err, sizeof err);
    int failed;
    char *msgs = gather_msgs(comm, err, &failed);
    if (failed) fail_all(comm, msgs, "resuming failed: a checkpoint shard could not be read");
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

/* ---------------------------------------------------------------- metrics */

FILE *tz_ckpt_metrics_reopen(const tz_config *cfg, int64_t step) {
    char path[PATHN], tmp[PATHN + 8], err[MSG];
    tz_path_join(path, sizeof path, cfg->run.dir, "metrics.jsonl");
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    char *text = tz_path_exists(path) ? read_text(path, err, sizeof err) : tz_xstrdup("");
    if (!text) TZ_FATAL("%s", err);
    FILE *f = fopen(tmp, "w");
    if (!f) TZ_FATAL("cannot write %s: %s", tmp, strerror(errno));
    for (char *line = text, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        const char *s = strstr(line, "\"step\": ");
        if (!strncmp(line, "{\"summary\"", 10) || !s || strtoll(s + 8, NULL, 10) > step) continue;
        fprintf(f, "%s\n", line);
    }
    free(text);
    if (fflush(f) != 0 || fsync(fileno(f)) != 0 || fclose(f) != 0 || rename(tmp, path) != 0)
        TZ_FATAL("cannot write %s: %s", path, strerror(errno));
    f = fopen(path, "a");
    if (!f) TZ_FATAL("cannot write %s: %s", path, strerror(errno));
    return f;
}
