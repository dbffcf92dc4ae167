/* Run folders: the lock, the staging folder and its commit, folders committed as one unit,
 * checked logs, the write-failure test hook. See run_dir.h and docs/guide.md ("What run.dir
 * holds"). */
#define _GNU_SOURCE /* renameat2, RENAME_EXCHANGE, __fpurge */
#include "io/run_dir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdio_ext.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/fsutil.h"

/* ---- small helpers -------------------------------------------------------------------- */

static int no_exchange; /* tests: behave as on a file system without RENAME_EXCHANGE */

void tz_dir_exchange_off(int off) {
    no_exchange = off;
}

/* Swaps two names atomically; -1 with errno EINVAL where the file system cannot. */
static int exchange(const char *a, const char *b) {
    if (no_exchange) {
        errno = EINVAL;
        return -1;
    }
    return renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE);
}

static int join(char *out, size_t out_n, const char *a, const char *b, char *err, size_t n) {
    if ((size_t)snprintf(out, out_n, "%s/%s", a, b) >= out_n)
        return tz_errf(err, n, "%s/%s: path too long", a, b);
    return 0;
}

/* fsync of a folder or file by name; failure to open is ignored (some file systems refuse to
 * open folders for it), a failing fsync is not. */
static int sync_path(const char *path, int dir, char *err, size_t n) {
    int fd = open(path, (dir ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return 0;
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    if (rc != 0 && e != EINVAL && e != EROFS)
        return tz_errf(err, n, "%s: fsync failed: %s", path, strerror(e));
    return 0;
}

/* fsync of the regular files directly in dir, then of dir itself. */
static int sync_folder(const char *dir, char *err, size_t n) {
    DIR *d = opendir(dir);
    if (!d) return tz_errf(err, n, "%s: cannot read the folder: %s", dir, strerror(errno));
    struct dirent *e;
    char path[2200];
    int rc = 0;
    while (!rc && (e = readdir(d))) {
        if (e->d_type != DT_REG && e->d_type != DT_UNKNOWN) continue;
        if (join(path, sizeof path, dir, e->d_name, err, n)) rc = 1;
        else rc = sync_path(path, 0, err, n);
    }
    closedir(d);
    return rc ? rc : sync_path(dir, 1, err, n);
}

static void parent_of(const char *path, char *out, size_t out_n) {
    snprintf(out, out_n, "%s", path);
    char *s = strrchr(out, '/');
    if (!s) snprintf(out, out_n, ".");
    else if (s == out) out[1] = 0;
    else *s = 0;
}

static int rm_first_errno;
static char rm_first_path[1100];
static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)ftw;
    int rc = flag == FTW_DP ? rmdir(path) : unlink(path);
    if (rc != 0 && errno != ENOENT && !rm_first_errno) {
        rm_first_errno = errno;
        snprintf(rm_first_path, sizeof rm_first_path, "%s", path);
    }
    return 0;
}

int tz_rm_rf(const char *path, char *err, size_t n) {
    struct stat st;
    if (lstat(path, &st) != 0) return 0;
    if (!S_ISDIR(st.st_mode)) {
        if (unlink(path) != 0 && errno != ENOENT)
            return tz_errf(err, n, "%s: cannot remove: %s", path, strerror(errno));
        return 0;
    }
    rm_first_errno = 0;
    if (nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS) != 0 && !rm_first_errno)
        rm_first_errno = errno, snprintf(rm_first_path, sizeof rm_first_path, "%s", path);
    if (rm_first_errno)
        return tz_errf(err, n, "%s: cannot remove: %s", rm_first_path, strerror(rm_first_errno));
    return 0;
}

static void iso_now(char *buf, size_t n) {
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    if (!strftime(buf, n, "%Y-%m-%dT%H:%M:%SZ", &tm)) snprintf(buf, n, "?");
}

/* ---- lock ----------------------------------------------------------------------------- */

typedef struct holder {
    char host[256], since[64], state[32];
    long pid;
} holder;

static int read_holder(int fd, holder *h) {
    char buf[600];
    ssize_t got = pread(fd, buf, sizeof buf - 1, 0);
    memset(h, 0, sizeof *h);
    if (got <= 0) return 0;
    buf[got] = 0;
    return sscanf(buf, "host=%255s pid=%ld since=%63s state=%31s", h->host, &h->pid, h->since,
                  h->state) == 4;
}

static int write_holder(int fd, const char *since, const char *state) {
    char host[256] = "?", buf[600];
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "?");
    host[sizeof host - 1] = 0;
    int len = snprintf(buf, sizeof buf, "host=%s pid=%ld since=%s state=%s\n", host,
                       (long)getpid(), since, state);
    /* written over the old record, then cut to length: never an empty file to a reader */
    if (pwrite(fd, buf, (size_t)len, 0) != (ssize_t)len) return 1;
    return ftruncate(fd, (off_t)len) != 0;
}

static int same_host(const char *host) {
    char mine[256] = "";
    if (gethostname(mine, sizeof mine) != 0) return 0;
    mine[sizeof mine - 1] = 0;
    return !strcmp(mine, host);
}

static int pid_alive(long pid) {
    return pid > 0 && (kill((pid_t)pid, 0) == 0 || errno == EPERM);
}

int tz_run_lock_take(tz_run_lock *l, const char *dir, char *note, size_t note_n, char *err,
                     size_t n) {
    l->fd = -1;
    if (note_n) note[0] = 0;
    if (tz_mkdir_p(dir, err, n)) return 1;
    if (join(l->path, sizeof l->path, dir, ".lock", err, n)) return 1;
    int fd = open(l->path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0)
        return tz_errf(err, n, "%s: cannot open the lock file: %s", l->path, strerror(errno));
    holder h;
    int left;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        left = read_holder(fd, &h) && !strcmp(h.state, "running");
        if (e == EWOULDBLOCK) {
            /* a holder that took the lock a moment ago writes its record just after */
            for (int i = 0; i < 80 && !(read_holder(fd, &h) && !strcmp(h.state, "running")); i++)
                usleep(25000);
            close(fd);
            if (h.pid > 0)
                return tz_errf(err, n, "%s is in use by another run: pid %ld on host %s, since %s "
                               "(lock %s)", dir, h.pid, h.host, h.since, l->path);
            return tz_errf(err, n, "%s is in use by another run (lock %s)", dir, l->path);
        }
        if (e != ENOLCK && e != EOPNOTSUPP && e != ENOSYS && e != EINVAL) {
            close(fd);
            return tz_errf(err, n, "%s: cannot lock: %s", l->path, strerror(e));
        }
        /* a file system that refuses locks (NFS without a lock manager): the record decides */
        if (left && (!same_host(h.host) || pid_alive(h.pid))) {
            close(fd);
            return tz_errf(err, n, "%s is in use by another run: pid %ld on host %s, since %s "
                           "(lock %s; this file system has no locks: %s; if no such run is "
                           "going on, delete the lock file)", dir, h.pid, h.host, h.since,
                           l->path, strerror(e));
        }
    } else {
        left = read_holder(fd, &h) && !strcmp(h.state, "running"); /* read under the lock */
    }
    if (left)
        snprintf(note, note_n, "%s: the previous run (pid %ld on host %s, since %s) did not "
                 "finish (it failed, crashed or was killed)%s", dir, h.pid, h.host, h.since,
                 same_host(h.host) && !pid_alive(h.pid) ? "; that process is gone" : "");
    char since[64];
    iso_now(since, sizeof since);
    if (write_holder(fd, since, "running")) {
        int e = errno;
        close(fd);
        return tz_errf(err, n, "%s: cannot write the lock file: %s", l->path, strerror(e));
    }
    l->fd = fd;
    return 0;
}

void tz_run_lock_release(tz_run_lock *l) {
    if (l->fd < 0) return;
    holder h;
    if (read_holder(l->fd, &h)) (void)write_holder(l->fd, h.since, "released");
    close(l->fd); /* drops the flock */
    l->fd = -1;
}

/* ---- staging and commit ---------------------------------------------------------------- */

int tz_run_dir_holds_run(const char *dir, const tz_run_outputs *outs, char *what, size_t n) {
    char path[1100];
    for (int k = 1; k <= outs->n; k++)
        for (int i = 0; i < outs->n; i++) {
            if (outs->o[i].mark != k) continue;
            if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, outs->o[i].name) >= sizeof path)
                continue;
            struct stat st;
            if (lstat(path, &st) == 0) {
                snprintf(what, n, "%s", path);
                return 1;
            }
        }
    return 0;
}

/* Carries out the commit record DIR/staging/.commit: each line "NAME\tINODE" moves
 * staging/NAME (that inode) to DIR/NAME unless DIR/NAME already is that inode (done before);
 * "NAME\t-" moves an old DIR/NAME away. Old outputs go to staging/.old, removed at the end
 * with the staging folder. Repeating it after a stop half-way finishes the same commit. */
static int roll_forward(const char *dir, char *err, size_t n) {
    char stage[1100], rec[1200], old_dir[1200];
    if (join(stage, sizeof stage, dir, TZ_STAGE_NAME, err, n) ||
        join(rec, sizeof rec, stage, ".commit", err, n) ||
        join(old_dir, sizeof old_dir, stage, ".old", err, n))
        return 1;
    FILE *f = fopen(rec, "re");
    if (!f) return tz_errf(err, n, "%s: cannot read the commit record: %s", rec, strerror(errno));
    if (mkdir(old_dir, 0755) != 0 && errno != EEXIST) {
        fclose(f);
        return tz_errf(err, n, "%s: cannot create: %s", old_dir, strerror(errno));
    }
    char line[600];
    int rc = 0;
    while (!rc && fgets(line, sizeof line, f)) {
        char name[256], ino_s[64], fin[1400], stg[1400], old[1400];
        if (sscanf(line, "%255[^\t]\t%63s", name, ino_s) != 2 || strchr(name, '/')) {
            rc = tz_errf(err, n, "%s: malformed line '%s'", rec, line);
            break;
        }
        if (join(fin, sizeof fin, dir, name, err, n) ||
            join(stg, sizeof stg, stage, name, err, n) ||
            join(old, sizeof old, old_dir, name, err, n)) {
            rc = 1;
            break;
        }
        struct stat fs, ss;
        int have_final = lstat(fin, &fs) == 0;
        if (!strcmp(ino_s, "-")) { /* an output of the old run that this run does not have */
            if (!have_final) continue;
            if (tz_write_fault(fin, err, n) || tz_rm_rf(old, err, n)) rc = 1;
            else if (rename(fin, old) != 0)
                rc = tz_errf(err, n, "%s: cannot move it to %s: %s", fin, old, strerror(errno));
            continue;
        }
        unsigned long long ino = strtoull(ino_s, NULL, 10);
        if (have_final && (unsigned long long)fs.st_ino == ino) continue; /* moved before */
        if (lstat(stg, &ss) != 0 || (unsigned long long)ss.st_ino != ino) {
            rc = tz_errf(err, n, "%s: the commit record names %s, which is gone", rec, stg);
            break;
        }
        if (tz_write_fault(fin, err, n)) {
            rc = 1;
        } else if (!have_final || (!S_ISDIR(fs.st_mode) && !S_ISDIR(ss.st_mode))) {
            if (rename(stg, fin) != 0) /* a file over a file: one atomic replace */
                rc = tz_errf(err, n, "%s: cannot move %s there: %s", fin, stg, strerror(errno));
        } else if (exchange(stg, fin) != 0) {
            /* no atomic exchange here (NFS): the old folder aside, then the new one in */
            if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP)
                rc = tz_errf(err, n, "%s: cannot exchange it with %s: %s", fin, stg,
                             strerror(errno));
            else if (tz_rm_rf(old, err, n)) rc = 1;
            else if (rename(fin, old) != 0)
                rc = tz_errf(err, n, "%s: cannot move it to %s: %s", fin, old, strerror(errno));
            else if (tz_write_fault(fin, err, n)) /* a stop between the two renames */
                rc = 1;
            else if (rename(stg, fin) != 0)
                rc = tz_errf(err, n, "%s: cannot move %s there: %s", fin, stg, strerror(errno));
        }
    }
    fclose(f);
    if (rc) return rc;
    if (sync_path(dir, 1, err, n)) return 1;
    if (unlink(rec) != 0) return tz_errf(err, n, "%s: cannot remove: %s", rec, strerror(errno));
    char e2[1400];
    if (tz_rm_rf(stage, e2, sizeof e2)) tz_warn("%s (the run itself is complete)", e2);
    return sync_path(dir, 1, err, n);
}

int tz_run_stage_open(const char *dir, const tz_run_outputs *outs, char *stage, size_t stage_n,
                      char *note, size_t note_n, char *err, size_t n) {
    char rec[1200];
    if (note_n) note[0] = 0;
    if (join(stage, stage_n, dir, TZ_STAGE_NAME, err, n) ||
        join(rec, sizeof rec, stage, ".commit", err, n))
        return 1;
    struct stat st;
    if (lstat(rec, &st) == 0) {
        if (roll_forward(dir, err, n)) return 1;
        snprintf(note, note_n, "%s: completed the commit of the outputs of a previous run, which "
                 "stopped while committing them", dir);
    } else if (lstat(stage, &st) == 0) {
        if (tz_rm_rf(stage, err, n)) return 1;
        snprintf(note, note_n, "%s: removed %s, the partial outputs of a previous run that did "
                 "not finish", dir, stage);
    }
    for (int i = 0; i < outs->n; i++) { /* an output's name taken by the wrong kind */
        char p[1400];
        int want_dir = outs->o[i].is_dir;
        if (join(p, sizeof p, dir, outs->o[i].name, err, n)) return 1;
        if (lstat(p, &st) == 0 && !S_ISDIR(st.st_mode) != !want_dir)
            return tz_errf(err, n, "cannot write %s: %s", p, strerror(want_dir ? ENOTDIR : EISDIR));
    }
    if (mkdir(stage, 0755) != 0)
        return tz_errf(err, n, "%s: cannot create the staging folder: %s", stage, strerror(errno));
    return 0;
}

static int is_output(const tz_run_outputs *outs, const char *name) {
    for (int i = 0; i < outs->n; i++)
        if (!strcmp(name, outs->o[i].name)) return 1;
    return 0;
}

/* Appends "NAME\tINODE\n" for staging/NAME when it exists, or "NAME\t-\n" when it does not
 * and DIR/NAME does (an old output to remove); 0 or non-zero with err. */
static int record_line(const char *dir, const char *stage, const char *name, char *buf,
                       size_t cap, size_t *len, char *err, size_t n) {
    char p[1400];
    struct stat st;
    int m;
    if (join(p, sizeof p, stage, name, err, n)) return 1;
    if (lstat(p, &st) == 0) {
        m = snprintf(buf + *len, cap - *len, "%s\t%llu\n", name, (unsigned long long)st.st_ino);
    } else {
        if (join(p, sizeof p, dir, name, err, n)) return 1;
        if (lstat(p, &st) != 0) return 0;
        m = snprintf(buf + *len, cap - *len, "%s\t-\n", name);
    }
    if (m < 0 || (size_t)m >= cap - *len) return tz_errf(err, n, "%s: too many outputs", stage);
    *len += (size_t)m;
    return 0;
}

int tz_run_stage_commit(const char *dir, const tz_run_outputs *outs, char *err, size_t n) {
    char stage[1100], rec[1200], buf[8192];
    size_t len = 0;
    if (join(stage, sizeof stage, dir, TZ_STAGE_NAME, err, n) ||
        join(rec, sizeof rec, stage, ".commit", err, n))
        return 1;
    if (sync_folder(stage, err, n)) return 1;
    DIR *d = opendir(stage); /* other entries of the staging folder first, in folder order */
    if (!d) return tz_errf(err, n, "%s: cannot read the folder: %s", stage, strerror(errno));
    struct dirent *e;
    int rc = 0;
    while (!rc && (e = readdir(d))) {
        if (e->d_name[0] == '.' || strstr(e->d_name, ".tmp.") || is_output(outs, e->d_name) ||
            (outs->keep && !strcmp(e->d_name, outs->keep))) /* never replaced */
            continue;
        rc = record_line(dir, stage, e->d_name, buf, sizeof buf, &len, err, n);
    }
    closedir(d);
    for (int i = 0; !rc && i < outs->n; i++)
        rc = record_line(dir, stage, outs->o[i].name, buf, sizeof buf, &len, err, n);
    if (rc) return rc;
    tz_atomic_file f;
    if (tz_atomic_file_open(&f, rec, err, n)) return 1;
    if (tz_atomic_file_write(&f, buf, len, err, n)) {
        tz_atomic_file_abort(&f);
        return 1;
    }
    if (tz_atomic_file_commit(&f, err, n)) return 1; /* from here on the commit will happen */
    return roll_forward(dir, err, n);
}

/* ---- one folder as one unit ------------------------------------------------------------ */

int tz_dir_make_temp(const char *final_dir, char *out, size_t out_n, char *err, size_t n) {
    if ((size_t)snprintf(out, out_n, "%s.tmp.XXXXXX", final_dir) >= out_n)
        return tz_errf(err, n, "%s: path too long", final_dir);
    if (!mkdtemp(out))
        return tz_errf(err, n, "%s: cannot create a temporary folder %s: %s", final_dir, out,
                       strerror(errno));
    (void)chmod(out, 0755); /* mkdtemp makes it 0700 */
    return 0;
}

int tz_dir_commit(const char *tmp_dir, const char *final_dir, char *err, size_t n) {
    char parent[1100], aside[1200];
    parent_of(final_dir, parent, sizeof parent);
    int rc = 0;
    struct stat st;
    if (tz_write_fault(final_dir, err, n) || sync_folder(tmp_dir, err, n)) {
        rc = 1;
    } else if (lstat(final_dir, &st) != 0) {
        if (rename(tmp_dir, final_dir) != 0)
            rc = tz_errf(err, n, "%s: cannot rename %s to it: %s", final_dir, tmp_dir,
                         strerror(errno));
    } else if (exchange(tmp_dir, final_dir) == 0) {
        /* tmp_dir now holds the old folder, removed below */
    } else if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP) {
        rc = tz_errf(err, n, "%s: cannot exchange it with %s: %s", final_dir, tmp_dir,
                     strerror(errno));
    } else { /* no atomic exchange on this file system: the old folder aside first */
        snprintf(aside, sizeof aside, "%s.old", tmp_dir);
        if (rename(final_dir, aside) != 0) {
            rc = tz_errf(err, n, "%s: cannot move it to %s: %s", final_dir, aside, strerror(errno));
        } else if (tz_write_fault(final_dir, err, n)) { /* a stop between the two renames */
            rc = 1;
            (void)rename(aside, final_dir);
        } else if (rename(tmp_dir, final_dir) != 0) {
            rc = tz_errf(err, n, "%s: cannot rename %s to it: %s", final_dir, tmp_dir,
                         strerror(errno));
            (void)rename(aside, final_dir);
        } else {
            char e2[1400];
            if (tz_rm_rf(aside, e2, sizeof e2)) tz_warn("%s", e2);
        }
    }
    if (!rc) rc = sync_path(parent, 1, err, n);
    char e2[1400];
    if (tz_rm_rf(tmp_dir, e2, sizeof e2)) tz_warn("%s", e2); /* the new (failure) or old one */
    return rc;
}

/* ---- checked log ----------------------------------------------------------------------- */

int tz_line_log_open(tz_line_log *l, const char *path, char *err, size_t n) {
    snprintf(l->path, sizeof l->path, "%s", path);
    l->good = 0;
    l->f = fopen(path, "we");
    if (!l->f) return tz_errf(err, n, "cannot write %s: %s", path, strerror(errno));
    return 0;
}

/* After a failed write: the file cut back to its complete lines, the buffered rest dropped
 * (so that nothing is written at exit), the log closed. */
static int log_fail(tz_line_log *l, int e, const char *why, char *err, size_t n) {
    if (ftruncate(fileno(l->f), (off_t)l->good) != 0) { /* best effort */
    }
    __fpurge(l->f);
    fclose(l->f);
    l->f = NULL;
    if (why) return tz_errf(err, n, "%s", why);
    return tz_errf(err, n, "%s: write failed: %s", l->path, strerror(e));
}

int tz_line_log_flush(tz_line_log *l, char *err, size_t n) {
    if (!l->f) return tz_errf(err, n, "%s: the log is closed after a failed write", l->path);
    char why[1400];
    if (tz_write_fault(l->path, why, sizeof why)) return log_fail(l, EIO, why, err, n);
    if (fflush(l->f) != 0 || ferror(l->f)) return log_fail(l, errno, NULL, err, n);
    off_t at = ftello(l->f);
    if (at >= 0) l->good = (long long)at;
    return 0;
}

int tz_line_log_close(tz_line_log *l, char *err, size_t n) {
    if (tz_line_log_flush(l, err, n)) return 1;
    int rc = fsync(fileno(l->f)) != 0 ? errno : 0;
    if (fclose(l->f) != 0 && !rc) rc = errno;
    l->f = NULL;
    if (rc) return tz_errf(err, n, "%s: write failed: %s", l->path, strerror(rc));
    return 0;
}
