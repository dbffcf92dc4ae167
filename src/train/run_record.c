/* Run records: ISO wall-clock times, JSON numbers without bare nan, run.dir/run.json written
 * whole (atomic replace) at the start and at the end of a run. No training logic here. */
#define _GNU_SOURCE /* getline */
#include "train/run_record.h"

#include <dirent.h>
#include <limits.h>
#include <sys/stat.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "core/backend.h"
#include "core/build_info.h"
#include "core/clock.h"
#include "core/error.h"
#include "io/atomic_file.h"
#include "io/fsutil.h"
#include "comm/comm.h"
#include "comm/world.h"
#include "train/checkpoint_util.h"

void tz_record_time_now(char *buf, size_t n) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char day[24];
    if (!strftime(day, sizeof day, "%Y-%m-%dT%H:%M:%S", &tm)) day[0] = 0;
    snprintf(buf, n, "%.19s.%03dZ", day, (int)(ts.tv_nsec / 1000000L % 1000));
}

void tz_record_json_number(char *buf, size_t n, const char *key, const char *fmt, double v) {
    if (isfinite(v)) {
        int m = snprintf(buf, n, "\"%s\": ", key);
        if (m >= 0 && (size_t)m < n) snprintf(buf + m, n - (size_t)m, fmt, v);
        return;
    }
    snprintf(buf, n, "\"%s\": null, \"%s_nonfinite\": \"%s\"", key, key,
             isnan(v) ? "nan" : v > 0 ? "inf" : "-inf");
}

double tz_record_peak_rss_mib(tz_comm *comm) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    int64_t rss = (int64_t)ru.ru_maxrss, *all = tz_xmalloc((size_t)comm->size * sizeof *all);
    tz_comm_all_gather(comm, &rss, all, 1, TZ_DT_I64);
    int64_t top = 0;
    for (int64_t i = 0; i < comm->size; i++) top = all[i] > top ? all[i] : top;
    free(all);
    return (double)top / 1024.0; /* ru_maxrss is in KiB on Linux */
}

/* The command line as given (/proc/self/cmdline), one string per argument. */
static json_t *command_line(void) {
    json_t *a = json_array();
    FILE *f = fopen("/proc/self/cmdline", "rb");
    if (!f) return a;
    char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    for (size_t i = 0; i < n; i += strlen(buf + i) + 1)
        json_array_append_new(a, json_string(buf + i));
    return a;
}

/* A Slurm variable as a JSON string, or null. */
static json_t *env_string(const char *name) {
    const char *v = getenv(name);
    return v && *v ? json_string(v) : json_null();
}

/* The Slurm job this process runs in (null outside one): job id, array job and index, the
 * restart count of a requeued job. */
static json_t *slurm_job(void) {
    const char *job = getenv("SLURM_JOB_ID"), *rc = getenv("SLURM_RESTART_COUNT");
    if (!job || !*job) return json_null();
    return json_pack("{s:o, s:o, s:o, s:I}", "job_id", json_string(job), "array_job_id",
                     env_string("SLURM_ARRAY_JOB_ID"), "array_task_id",
                     env_string("SLURM_ARRAY_TASK_ID"), "restart_count",
                     (json_int_t)(rc ? atoll(rc) : 0));
}

/* This process's segment of the run. */
static json_t *segment(const tz_run_record *rec, json_t *hosts, const char *end, double wall_s,
                       const char *status) {
    const char *rc = getenv("SLURM_RESTART_COUNT");
    json_t *s = json_pack("{s:s, s:o, s:s, s:I, s:o, s:I, s:O, s:s, s:s, s:o, s:o}", "start",
                          rec->start, "end", end ? json_string(end) : json_null(), "status",
                          status, "steps_from", (json_int_t)rec->steps_from, "steps_to",
                          rec->steps_to >= 0 ? json_integer(rec->steps_to) : json_null(),
                          "ranks", (json_int_t)rec->ranks, "hosts", hosts, "backend",
                          rec->backend, "device", rec->device, "slurm_job_id",
                          env_string("SLURM_JOB_ID"), "slurm_restart_count",
                          rc && *rc ? json_integer(atoll(rc)) : json_null());
    TZ_CHECK(s, "run.json: cannot build a segment");
    json_object_set_new(s, "wall_s", end ? json_real(wall_s) : json_null());
    return s;
}

/* status: "running", "stopped" or "finished" (end NULL while running). */
static void write_run_json(const tz_run_record *rec, const char *dir, const char *end,
                           double wall_s, const char *status) {
    json_t *hosts = json_array();
    for (int64_t i = 0, off = 0; i < rec->n_hosts; i++) {
        json_array_append_new(hosts, json_string(rec->hosts + off));
        off += (int64_t)strlen(rec->hosts + off) + 1;
    }
    json_t *segs = rec->prior ? json_loads(rec->prior, 0, NULL) : NULL;
    if (!json_is_array(segs)) json_decref(segs), segs = json_array();
    json_array_append_new(segs, segment(rec, hosts, end, wall_s, status));
    double wall = 0; /* the run's wall time: its segments' */
    for (size_t i = 0; i < json_array_size(segs); i++)
        wall += json_number_value(json_object_get(json_array_get(segs, i), "wall_s"));
    const char *first = json_string_value(json_object_get(json_array_get(segs, 0), "start"));
    char cwd[4096];
    if (!getcwd(cwd, sizeof cwd)) snprintf(cwd, sizeof cwd, "?");
    json_t *o = json_pack("{s:s, s:s, s:s, s:b, s:s, s:s, s:s, s:o, s:s, s:I, s:O, s:o, s:s, s:s}",
                          "program", "turbozero", "version", tz_build_version(), "commit",
                          tz_build_commit(), "build_cuda", tz_build_has_cuda(), "cpu_kernel",
                          tz_cpu_kernel_name(), "backend", rec->backend, "device", rec->device,
                          "command", command_line(), "cwd", cwd, "ranks",
                          (json_int_t)rec->ranks, "hosts", hosts, "slurm", slurm_job(), "start",
                          first ? first : rec->start, "status", status);
    TZ_CHECK(o, "run.json: cannot build the record");
    if (rec->run_id[0]) json_object_set_new(o, "run_id", json_string(rec->run_id));
    json_object_set_new(o, "end", end ? json_string(end) : json_null());
    json_object_set_new(o, "wall_s", end ? json_real(wall) : json_null());
    json_object_set_new(o, "segments", segs);
    json_decref(hosts);
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6));
    json_decref(o);
    TZ_CHECK(text, "run.json: cannot format the record");
    char path[1100], err[1024];
    tz_path_join(path, sizeof path, dir, "run.json");
    tz_atomic_file f;
    size_t len = strlen(text);
    text[len] = '\n'; /* json_dumps ends without a newline; its buffer holds the NUL there */
    if (tz_atomic_file_open(&f, path, err, sizeof err) ||
        tz_atomic_file_write(&f, text, len + 1, err, sizeof err) ||
        tz_atomic_file_commit(&f, err, sizeof err))
        TZ_FATAL("cannot write %s: %s", path, err);
    free(text);
}

void tz_record_begin(tz_run_record *rec, const char *dir, const char *run_id, const tz_world *w,
                     tz_comm *comm) {
    memset(rec, 0, sizeof *rec);
    snprintf(rec->run_id, sizeof rec->run_id, "%s", run_id ? run_id : "");
    tz_record_time_now(rec->start, sizeof rec->start);
    rec->t0 = tz_clock_s();
    rec->ranks = comm->size;
    rec->steps_to = -1;
    char mine[TZ_HOST_MAX] = {0};
    snprintf(mine, sizeof mine, "%s", w->hostname);
    char *all = tz_xmalloc((size_t)comm->size * TZ_HOST_MAX);
    tz_comm_all_gather(comm, mine, all, TZ_HOST_MAX, TZ_DT_U8);
    if (comm->rank == 0) { /* distinct names, in rank order */
        rec->hosts = tz_xcalloc((size_t)comm->size, TZ_HOST_MAX);
        int64_t off = 0;
        for (int64_t r = 0; r < comm->size; r++) {
            const char *h = all + r * TZ_HOST_MAX;
            int seen = 0;
            for (int64_t q = 0; q < r && !seen; q++) seen = !strcmp(h, all + q * TZ_HOST_MAX);
            if (seen) continue;
            memcpy(rec->hosts + off, h, strlen(h) + 1);
            off += (int64_t)strlen(h) + 1;
            rec->n_hosts++;
        }
        write_run_json(rec, dir, NULL, 0.0, "running");
    }
    free(all);
}

void tz_record_device(tz_run_record *rec, const char *dir, const char *backend,
                      const char *device) {
    snprintf(rec->backend, sizeof rec->backend, "%s", backend);
    snprintf(rec->device, sizeof rec->device, "%s", device);
    if (rec->hosts) write_run_json(rec, dir, NULL, 0.0, "running");
}

void tz_record_resumed(tz_run_record *rec, const char *dir, struct tz_run_out *o,
                       int64_t steps_from) {
    rec->steps_from = steps_from;
    free(rec->prior);
    rec->prior = NULL;
    json_t *j = o->prior ? json_loads(o->prior, 0, NULL) : NULL;
    free(o->prior);
    o->prior = NULL;
    const char *id = json_string_value(json_object_get(j, "run_id"));
    if (json_is_object(j) && (!id || !rec->run_id[0] || !strcmp(id, rec->run_id))) {
        json_t *segs = json_object_get(j, "segments");
        if (!json_is_array(segs)) { /* a record without segments: the whole run as one */
            segs = json_array();
            json_array_append_new(segs, json_pack("{s:O?, s:O?, s:O?, s:n, s:n, s:O?}", "start",
                                                   json_object_get(j, "start"), "end",
                                                   json_object_get(j, "end"), "status",
                                                   json_object_get(j, "status"), "steps_from",
                                                   "steps_to", "ranks",
                                                   json_object_get(j, "ranks")));
        } else {
            json_incref(segs);
        }
        json_t *last = json_array_get(segs, json_array_size(segs) - 1);
        const char *st = json_string_value(json_object_get(last, "status"));
        if (st && !strcmp(st, "running")) /* its process ended without a word: killed */
            json_object_set_new(last, "status", json_string("interrupted"));
        rec->prior = json_dumps(segs, JSON_COMPACT | JSON_PRESERVE_ORDER);
        json_decref(segs);
    }
    json_decref(j);
    if (rec->hosts) write_run_json(rec, dir, NULL, 0.0, "running");
}

void tz_record_stop(tz_run_record *rec, const char *dir, int64_t step, tz_comm *comm) {
    if (comm->rank == 0) {
        char end[40];
        tz_record_time_now(end, sizeof end);
        rec->steps_to = step;
        write_run_json(rec, dir, end, tz_clock_s() - rec->t0, "stopped");
    }
    free(rec->hosts);
    free(rec->prior);
    rec->hosts = rec->prior = NULL;
}

void tz_record_end(tz_run_record *rec, const char *dir, int64_t step, tz_comm *comm) {
    if (comm->rank == 0) {
        char end[40];
        tz_record_time_now(end, sizeof end);
        rec->steps_to = step;
        write_run_json(rec, dir, end, tz_clock_s() - rec->t0, "finished");
    }
    free(rec->hosts);
    free(rec->prior);
    rec->hosts = rec->prior = NULL;
}

#define TZ_RESUME_LOG ".metrics.resume.jsonl" /* run.dir/: the stopped run's log, set aside */
#define TZ_CKPT_ASIDE "checkpoints.replaced"  /* run.dir/: an earlier run's checkpoints, removed
                                                * by the commit (io/run_dir.c) */

/* Whether dir/checkpoints holds any entry. */
static int has_checkpoints(const char *dir) {
    char path[1200];
    tz_path_join(path, sizeof path, dir, "checkpoints");
    DIR *d = opendir(path);
    if (!d) return 0;
    int any = 0;
    for (struct dirent *e; !any && (e = readdir(d));)
        any = strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return any;
}

/* ---- run identity: run.dir/.run ---------------------------------------------------------- */

static int is_run_id(const char *s) {
    size_t n = strlen(s);
    if (n < 8 || n >= TZ_RUN_ID_MAX) return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return 1;
}

/* The "run_id" string of a JSON file into id ("" when the file, the key or a valid id is
 * missing). */
static void json_run_id(const char *path, char *id) {
    id[0] = 0;
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > (64 << 20)) return;
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    const char *s = json_string_value(json_object_get(j, "run_id"));
    if (s && is_run_id(s)) snprintf(id, TZ_RUN_ID_MAX, "%s", s);
    json_decref(j);
}

static void new_run_id(char *id) {
    unsigned char b[16];
    FILE *f = fopen("/dev/urandom", "rb");
    size_t got = f ? fread(b, 1, sizeof b, f) : 0;
    if (f) fclose(f);
    if (got != sizeof b) { /* no /dev/urandom: the time and the process */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t x = (uint64_t)ts.tv_sec * 1000000007u ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 40);
        for (int i = 0; i < 16; i++, x = x * 6364136223846793005u + 1442695040888963407u)
            b[i] = (unsigned char)(x >> 56);
    }
    for (int i = 0; i < 16; i++) snprintf(id + 2 * i, 3, "%02x", b[i]);
}

static void write_run_id(const char *dir, const char *id) {
    char path[1200], text[96], err[1200];
    tz_path_join(path, sizeof path, dir, ".run");
    int len = snprintf(text, sizeof text, "{\"run_id\": \"%s\"}\n", id);
    tz_atomic_file f;
    if (tz_atomic_file_open(&f, path, err, sizeof err) ||
        tz_atomic_file_write(&f, text, (size_t)len, err, sizeof err) ||
        tz_atomic_file_commit(&f, err, sizeof err))
        TZ_FATAL("run.dir: cannot write %s: %s", path, err);
}

/* ---- what run.dir holds -------------------------------------------------------------------- */

static const tz_run_output train_outputs[] = {
    {"adapter", 1, 3}, {"model", 1, 4}, {"loss.png", 0, 0}, {"config.used.cfg", 0, 0},
    {"run.json", 0, 2}, {TZ_METRICS_FILE, 0, 1}, {TZ_CKPT_ASIDE, 1, 0}};
const tz_run_outputs tz_train_outputs = {
    train_outputs, (int)(sizeof train_outputs / sizeof *train_outputs), "checkpoints"};
const tz_loss_plot_keys tz_metrics_keys = {TZ_METRICS_FILE, "step", "loss", "eval_loss"};

/* Names a run puts in run.dir (besides outputs' temporaries, "*.tmp.*"). */
static int ours(const char *name) {
    static const char *const names[] = {".lock", ".run", TZ_STAGE_NAME, "checkpoints",
                                        TZ_CKPT_ASIDE, TZ_RESUME_LOG, "adapter", "model",
                                        "loss.png", "config.used.cfg", "run.json", TZ_METRICS_FILE,
                                        "tb"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(name, names[i])) return 1;
    return strstr(name, ".tmp.") != NULL;
}

/* Refuses (fatal, before anything is written) a dir that exists and is not a run folder:
 * it holds a folder, a link or a special file of its own, or more than a few files (a
 * note, a config or a job log beside the outputs are fine). */
static void refuse_foreign(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return;
        struct stat st;
        if (stat(dir, &st) == 0 && !S_ISDIR(st.st_mode))
            TZ_FATAL_HINT("choose a folder for run.dir", "run.dir %s is not a folder", dir);
        return; /* the lock reports what is wrong */
    }
    char shown[400] = "", p[1200];
    int files = 0, others = 0;
    size_t at = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || ours(e->d_name)) continue;
        struct stat st;
        tz_path_join(p, sizeof p, dir, e->d_name);
        int file = lstat(p, &st) == 0 && S_ISREG(st.st_mode);
        files += file, others += !file;
        if (at < sizeof shown - 64) {
            int k = snprintf(shown + at, sizeof shown - at, "%s%s%s", at ? ", " : "", e->d_name,
                             file ? "" : "/");
            if (k > 0) at += (size_t)k;
        }
    }
    closedir(d);
    if (others || files > 8)
        TZ_FATAL_HINT("choose a new or empty folder for run.dir (e.g. runs/NAME); a run folder "
                      "holds only turbozero's outputs and at most a few files of yours",
                      "run.dir %s is not a run folder: it holds %d folder%s or other entr%s and "
                      "%d file%s of its own (%s%s); not writing into it", dir, others,
                      others == 1 ? "" : "s", others == 1 ? "y" : "ies", files,
                      files == 1 ? "" : "s", shown, at >= sizeof shown - 64 ? ", ..." : "");
}

/* Whether dir holds a finished run: its outputs are committed (or their commit is pending)
 * and no run of dir's current id stopped before its end. */
static int run_finished(const char *dir, const char *run_id) {
    char p[1200], id[TZ_RUN_ID_MAX];
    tz_path_join(p, sizeof p, dir, TZ_STAGE_NAME "/.commit");
    if (tz_path_exists(p)) return 1; /* the next lock completes the commit */
    tz_path_join(p, sizeof p, dir, TZ_STAGE_NAME "/" TZ_METRICS_FILE);
    if (tz_path_exists(p)) return 0; /* a run stopped or was killed */
    tz_path_join(p, sizeof p, dir, "run.json");
    if (!tz_path_exists(p)) return 0;
    json_run_id(p, id);
    return !run_id[0] || !strcmp(id, run_id); /* another id: a new run stopped early */
}

/* A regular file of at most 1 MiB, read whole (NUL-terminated); NULL otherwise. */
static char *read_small(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > (1 << 20)) return NULL;
    FILE *f = fopen(path, "re");
    if (!f) return NULL;
    char *t = tz_xmalloc((size_t)st.st_size + 1);
    size_t n = fread(t, 1, (size_t)st.st_size, f);
    fclose(f);
    t[n] = 0;
    return t;
}

void tz_run_out_begin(tz_run_out *o, const char *dir, int overwrite, int resume) {
    char err[2400], note[2400], what[1100], a[1200], b[1200], c[1200];
    snprintf(o->dir, sizeof o->dir, "%s", dir);
    refuse_foreign(dir);
    if (tz_run_lock_take(&o->lock, dir, note, sizeof note, err, sizeof err))
        TZ_FATAL_HINT("wait for that run to end, or choose another run.dir", "run.dir: %s", err);
    if (note[0]) tz_warn("%s", note);
    tz_path_join(a, sizeof a, dir, ".run");
    json_run_id(a, o->run_id);
    if (resume && !overwrite && run_finished(dir, o->run_id)) {
        tz_run_lock_release(&o->lock); /* refused: this process never ran here */
        TZ_FATAL_HINT("the run is complete: choose another run.dir for a new run, or --set "
                      "run.overwrite=true to train it again from its newest checkpoint, "
                      "replacing its outputs",
                      "--resume: run.dir %s holds a finished run (run.json, adapter or model): "
                      "there is nothing to resume", dir);
    }
    o->prior = NULL;
    if (resume) { /* the stopped run's record (its segments), before staging is cleared */
        tz_path_join(a, sizeof a, dir, TZ_STAGE_NAME "/run.json");
        tz_path_join(b, sizeof b, dir, "run.json");
        o->prior = read_small(tz_path_exists(a) ? a : b);
    }
    tz_path_join(a, sizeof a, dir, TZ_STAGE_NAME "/" TZ_METRICS_FILE);
    tz_path_join(b, sizeof b, dir, TZ_RESUME_LOG);
    tz_path_join(c, sizeof c, dir, TZ_STAGE_NAME "/.commit");
    /* the stopped run's log survives the clearing of staging (unless an earlier resume set
     * one aside and stopped before copying it: that one is the whole log) */
    if (resume && tz_path_exists(a) && !tz_path_exists(b) && !tz_path_exists(c) &&
        rename(a, b) != 0)
        TZ_FATAL("run.dir: cannot move %s to %s: %s", a, b, strerror(errno));
    /* a run stopped with checkpoints keeps its staged outputs for --resume: a new run that
     * will be refused must not clear them first */
    const int ckpts = has_checkpoints(dir);
    if (!resume && !overwrite && ckpts) {
        tz_run_lock_release(&o->lock); /* refused: this process never ran here */
        TZ_FATAL_HINT("continue it with --resume, choose another run.dir, or --set "
                      "run.overwrite=true to replace it",
                      "run.dir %s already holds a run (%s/checkpoints); not overwriting it", dir,
                      dir);
    }
    if (tz_run_stage_open(dir, &tz_train_outputs, o->stage, sizeof o->stage, note, sizeof note,
                          err, sizeof err))
        TZ_FATAL_HINT("fix the cause; or delete run.dir/staging by hand to discard what a "
                      "previous run left there", "run.dir: %s", err);
    if (note[0]) tz_warn("%s", note);
    if (resume) {
        tz_info("run.dir %s: resuming; this run writes to %s (live log: %s/metrics.jsonl), "
                "moved into run.dir when it ends", dir, o->stage, o->stage);
        return;
    }
    if (!overwrite && tz_run_dir_holds_run(dir, &tz_train_outputs, what, sizeof what)) {
        (void)rmdir(o->stage);
        tz_run_lock_release(&o->lock); /* refused: this process never ran here */
        TZ_FATAL_HINT("continue it with --resume, choose another run.dir, or --set "
                      "run.overwrite=true to replace it",
                      "run.dir %s already holds a run (%s); not overwriting it", dir, what);
    }
    /* a new run: its id first, so that from here on nothing of the earlier run is resumable */
    new_run_id(o->run_id);
    write_run_id(dir, o->run_id);
    if (tz_path_exists(b) && tz_rm_rf(b, err, sizeof err)) TZ_FATAL("run.dir: %s", err);
    if (ckpts) { /* overwrite: the earlier run's checkpoints go at the commit */
        tz_ckpt_fault("aside", 0, 0);
        tz_path_join(a, sizeof a, dir, "checkpoints");
        tz_path_join(b, sizeof b, dir, TZ_CKPT_ASIDE);
        if (tz_rm_rf(b, err, sizeof err)) TZ_FATAL("run.dir: %s", err);
        if (rename(a, b) != 0)
            TZ_FATAL("run.dir: cannot move %s to %s: %s", a, b, strerror(errno));
        tz_warn("run.dir %s: the earlier run's checkpoints are set aside in %s, removed when "
                "this run's outputs are committed", dir, b);
    }
    tz_info("run.dir %s: this run writes to %s (live log: %s/metrics.jsonl), moved into "
            "run.dir when it ends", dir, o->stage, o->stage);
}

/* Moves dir/checkpoints/NAME into dir/checkpoints.replaced/NAME (replacing one there). */
static void set_aside(const char *dir, const char *name, const char *why) {
    char aside[1200], from[1400], to[1400], err[2400];
    tz_path_join(aside, sizeof aside, dir, TZ_CKPT_ASIDE);
    if (tz_mkdir_p(aside, err, sizeof err)) TZ_FATAL("run.dir: %s", err);
    tz_ckpt_pathf(from, sizeof from, "%s/checkpoints/%s", dir, name);
    tz_ckpt_pathf(to, sizeof to, "%s/%s", aside, name);
    if (tz_rm_rf(to, err, sizeof err)) TZ_FATAL("run.dir: %s", err);
    if (rename(from, to) != 0) TZ_FATAL("run.dir: cannot move %s to %s: %s", from, to, strerror(errno));
    tz_warn("%s (%s): set aside in %s, removed when this run's outputs are committed", from,
            why, aside);
}

void tz_run_out_resumed(tz_run_out *o, const char *folder, int64_t step, const char *ckpt_id) {
    char dir[1200], p[1400], id[TZ_RUN_ID_MAX], keep[PATH_MAX] = "", real[PATH_MAX];
    const char *timeline = ckpt_id && ckpt_id[0] ? ckpt_id : o->run_id;
    if (folder && !realpath(folder, keep)) keep[0] = 0;
    tz_path_join(dir, sizeof dir, o->dir, "checkpoints");
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        const int64_t s = tz_ckpt_step_of_name(e->d_name);
        if (s < 0) continue;
        tz_ckpt_pathf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (keep[0] && realpath(p, real) && !strcmp(real, keep)) continue;
        tz_ckpt_pathf(p, sizeof p, "%s/%s/checkpoint.json", dir, e->d_name);
        json_run_id(p, id);
        char why[160];
        if (s > step)
            snprintf(why, sizeof why, "step %lld, after the step %lld this run continues from",
                     (long long)s, (long long)step);
        else if (timeline[0] && id[0] && strcmp(id, timeline))
            snprintf(why, sizeof why, "written by another run, %s", id);
        else if (!folder)
            snprintf(why, sizeof why, "not a checkpoint this run resumes");
        else
            continue;
        set_aside(o->dir, e->d_name, why);
    }
    if (d) closedir(d);
    if (!timeline[0]) new_run_id(id), timeline = id;
    if (strcmp(timeline, o->run_id)) {
        snprintf(o->run_id, sizeof o->run_id, "%s", timeline);
        write_run_id(o->dir, o->run_id);
    }
}

void tz_run_out_resume_log(tz_run_out *o, tz_line_log *l, int64_t step) {
    char aside[1200], path[1200], err[2400];
    tz_path_join(aside, sizeof aside, o->dir, TZ_RESUME_LOG);
    tz_path_join(path, sizeof path, o->dir, TZ_METRICS_FILE);
    const char *src = tz_path_exists(aside) ? aside : path;
    FILE *in = step >= 0 ? fopen(src, "re") : NULL;
    if (in) {
        char *line = NULL;
        size_t cap = 0;
        int64_t kept = 0;
        while (getline(&line, &cap, in) > 0) {
            const char *s = strstr(line, "\"step\": ");
            if (!strncmp(line, "{\"summary\"", 10) || !s || strtoll(s + 8, NULL, 10) > step ||
                !strchr(line, '\n'))
                continue; /* a summary, a later step, or a line cut short */
            fputs(line, l->f);
            kept++;
        }
        free(line);
        fclose(in);
        if (tz_line_log_flush(l, err, sizeof err) || fsync(fileno(l->f)) != 0)
            TZ_FATAL("cannot keep the stopped run's records (%s kept): %s", src,
                     err[0] ? err : strerror(errno));
        tz_info("metrics.jsonl: %lld records of the stopped run kept (steps up to %lld)",
                (long long)kept, (long long)step);
    } else if (step >= 0 && errno != ENOENT) {
        TZ_FATAL("cannot read %s: %s", src, strerror(errno));
    }
    if (tz_path_exists(aside) && tz_rm_rf(aside, err, sizeof err)) tz_warn("%s", err);
}

void tz_run_out_commit(tz_run_out *o) {
    char err[2400];
    if (tz_run_stage_commit(o->dir, &tz_train_outputs, err, sizeof err))
        TZ_FATAL_HINT("fix the cause; the next run in this run.dir completes the commit or "
                      "discards the outputs, which are in its staging folder until then",
                      "run.dir %s: committing the outputs failed: %s", o->dir, err);
    tz_run_lock_release(&o->lock);
}
