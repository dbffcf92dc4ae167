/* Run folders: the lock refuses a second holder and names it, a dead holder is named and its
 * lock taken over; a folder is committed whole; a failed log write leaves complete lines; a
 * run commit replaces the old outputs together (checkpoints/ untouched) and, stopped at any
 * of its writes, leaves the old outputs or, after the next stage_open, all the new ones. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "io/run_dir.h"
#include "train/run_record.h" /* the trainer's outputs: tz_train_outputs */
#include "tz_check.h"
#include "tz_files.h"

static char g_dir[256];

static const char *at(const char *name) { return tz_tpath(g_dir, name); }

static int exists(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0;
}

static void test_lock(void) {
    char err[2400], note[2400], host[256] = "", want[400];
    gethostname(host, sizeof host);
    tz_run_lock a, b;
    check(tz_run_lock_take(&a, at("run"), note, sizeof note, err, sizeof err) == 0 && !note[0],
          "lock: a fresh folder is created and locked");
    check(tz_run_lock_take(&b, at("run"), note, sizeof note, err, sizeof err) != 0,
          "lock: a second holder is refused");
    snprintf(want, sizeof want, "in use by another run: pid %ld on host %s", (long)getpid(), host);
    check(strstr(err, want) != NULL, "lock: the refusal names the holder (%s)", err);
    tz_run_lock_release(&a);
    check(tz_run_lock_take(&b, at("run"), note, sizeof note, err, sizeof err) == 0 && !note[0],
          "lock: taken again after a clean release, nothing to report");
    tz_run_lock_release(&b);

    pid_t child = fork(); /* a pid that is certainly gone */
    if (child == 0) _exit(0);
    waitpid(child, NULL, 0);
    char text[600];
    snprintf(text, sizeof text, "host=%s pid=%ld since=2026-01-01T00:00:00Z state=running\n",
             host, (long)child);
    tz_put(at("run/.lock"), text);
    snprintf(want, sizeof want, "pid %ld on host %s", (long)child, host);
    check(tz_run_lock_take(&a, at("run"), note, sizeof note, err, sizeof err) == 0 &&
              strstr(note, want) && strstr(note, "process is gone"),
          "lock: a dead holder's lock is taken over and named (%s)", note);
    tz_run_lock_release(&a);
}

static void test_dir_commit(void) {
    char err[2400], tmp[700];
    mkdir(at("ad"), 0755);
    tz_put(at("ad/w"), "old w"), tz_put(at("ad/c"), "old c");
    for (int fault = 1; fault >= 0; fault--) {
        tz_write_fault_arm(fault);
        int rc = tz_dir_make_temp(at("ad"), tmp, sizeof tmp, err, sizeof err);
        char p[800];
        snprintf(p, sizeof p, "%s/w", tmp), tz_put(p, "new w");
        snprintf(p, sizeof p, "%s/c", tmp), tz_put(p, "new c");
        rc = rc || tz_dir_commit(tmp, at("ad"), err, sizeof err);
        const char *w = fault ? "old w" : "new w", *c = fault ? "old c" : "new c";
        check((rc != 0) == (fault != 0) && tz_holds(at("ad/w"), w) && tz_holds(at("ad/c"), c) &&
                  !exists(tmp),
              "folder commit%s: both files %s, no temporary left", fault ? " failing" : "",
              fault ? "old" : "new");
    }
    tz_write_fault_arm(0);
}

static void test_log(void) {
    char err[2400];
    tz_line_log l;
    check(tz_line_log_open(&l, at("log"), err, sizeof err) == 0, "log: opened");
    fprintf(l.f, "{\"step\": 1}\n");
    check(tz_line_log_flush(&l, err, sizeof err) == 0, "log: first line written");
    fprintf(l.f, "{\"step\": 2, \"a long line that never makes it\": 1}\n");
    tz_write_fault_arm(1);
    check(tz_line_log_flush(&l, err, sizeof err) != 0 && strstr(err, "Input/output error"),
          "log: a failed write is reported with its reason (%s)", err);
    tz_write_fault_arm(0);
    check(tz_holds(at("log"), "{\"step\": 1}\n") && l.f == NULL,
          "log: cut back to its complete lines, closed");
}

/* An old run (metrics "old", adapter/ and model/ folders, checkpoints/) and a staged new
 * one (metrics "new", adapter/); the run folder is old or new as a whole. */
static void old_and_new(void) {
    char err[2400], stage[700], note[2400];
    mkdir(at("r"), 0755);
    tz_put(at("r/metrics.jsonl"), "old");
    tz_put(at("r/loss.png"), "old png");
    mkdir(at("r/model"), 0755);
    tz_put(at("r/model/m"), "old m");
    mkdir(at("r/adapter"), 0755);
    tz_put(at("r/adapter/w"), "old w");
    mkdir(at("r/checkpoints"), 0755);
    mkdir(at("r/checkpoints/step-1"), 0755);
    tz_put(at("r/checkpoints/step-1/s"), "ckpt");
    if (tz_run_stage_open(at("r"), &tz_train_outputs, stage, sizeof stage, note, sizeof note, err, sizeof err))
        printf("stage_open: %s\n", err);
    tz_put(at("r/staging/metrics.jsonl"), "new");
    tz_put(at("r/staging/config.used.cfg"), "new cfg");
    mkdir(at("r/staging/adapter"), 0755);
    tz_put(at("r/staging/adapter/w"), "new w");
}

static int is_old(void) {
    return tz_holds(at("r/metrics.jsonl"), "old") && tz_holds(at("r/model/m"), "old m") &&
           tz_holds(at("r/loss.png"), "old png") && tz_holds(at("r/adapter/w"), "old w") &&
           !exists(at("r/config.used.cfg"));
}

static int is_new(void) {
    return tz_holds(at("r/metrics.jsonl"), "new") && tz_holds(at("r/adapter/w"), "new w") &&
           tz_holds(at("r/config.used.cfg"), "new cfg") && !exists(at("r/model")) &&
           !exists(at("r/loss.png"));
}

static void test_stage(void) {
    char err[2400], stage[700], note[2400], what[700];
    check(!tz_run_dir_holds_run(at("none"), &tz_train_outputs, what, sizeof what), "an absent folder holds no run");
    char cmd[800];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", at("r"));
    if (system(cmd) != 0) return;
    int k = 1, mixed = 0, kept = 0, completed = 0;
    for (;; k++) {
        tz_run_lock l;
        tz_run_lock_take(&l, at("r"), note, sizeof note, err, sizeof err);
        old_and_new();
        tz_write_fault_arm(k);
        int rc = tz_run_stage_commit(at("r"), &tz_train_outputs, err, sizeof err);
        tz_write_fault_arm(0);
        if (rc == 0) {
            check(is_new() && !exists(at("r/staging")) &&
                      tz_holds(at("r/checkpoints/step-1/s"), "ckpt"),
                  "stage commit: the new outputs replace the old ones together, the old model/ "
                  "is gone, checkpoints/ untouched, no staging left");
            tz_run_lock_release(&l);
            break;
        }
        int was_old = is_old();
        /* the next holder finishes or discards what the failed commit left */
        if (tz_run_stage_open(at("r"), &tz_train_outputs, stage, sizeof stage, note, sizeof note, err, sizeof err))
            printf("stage_open after failure %d: %s\n", k, err);
        if (was_old && is_old()) kept++;
        else if (is_new() && strstr(note, "completed the commit")) completed++;
        else mixed++, printf("write %d: mixed outputs (note: %s)\n", k, note);
        if (!tz_holds(at("r/checkpoints/step-1/s"), "ckpt")) mixed++;
        rmdir(stage);
        tz_run_lock_release(&l);
        /* back to the old run for the next fault */
        if (system(cmd) != 0) break;
    }
    check(mixed == 0 && kept > 0 && completed > 0,
          "stage commit failing at each of its %d writes: old kept %d times, completed by the "
          "next holder %d times, never mixed", k - 1, kept, completed);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/tz_run_dir_XXXXXX");
    if (!mkdtemp(g_dir)) return 1;
    test_lock();
    test_dir_commit();
    test_log();
    test_stage();
    printf("-- again, as on a file system without an atomic exchange (NFS)\n");
    tz_dir_exchange_off(1);
    test_dir_commit();
    test_stage();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) return 1;
    return tz_check_done("run_dir");
}
