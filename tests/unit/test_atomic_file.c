/* Atomic file replacement: the temporary is created exclusively under an unpredictable name,
 * so a planted PATH.tmp link (or any existing name) is never written through; no leftovers. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/atomic_file.h"
#include "tz_check.h"
#include "tz_files.h"

static char g_dir[256];

static const char *tmp(const char *name) { return tz_tpath(g_dir, name); }

/* Entries of g_dir whose name starts with prefix. */
static int count(const char *prefix) {
    DIR *d = opendir(g_dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += !strncmp(e->d_name, prefix, strlen(prefix));
    if (d) closedir(d);
    return n;
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "%s/tz_atomic_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(g_dir)) return 1;
    char err[1024] = "";
    tz_put(tmp("victim"), "keep");
    check(symlink(tmp("victim"), tmp("out.txt.tmp")) == 0, "plant out.txt.tmp -> victim");
    tz_atomic_file f;
    int rc = tz_atomic_file_open(&f, tmp("out.txt"), err, sizeof err);
    check(rc == 0 && strncmp(f.tmp_path, tmp("out.txt.tmp."), strlen(tmp("out.txt.tmp."))) == 0 &&
              strlen(f.tmp_path) == strlen(tmp("out.txt.tmp.")) + 12,
          "temporary named out.txt.tmp.<12 random characters> %s", rc ? err : f.tmp_path);
    if (!rc) rc = tz_atomic_file_write(&f, "new", 3, err, sizeof err) ||
                  tz_atomic_file_commit(&f, err, sizeof err);
    check(rc == 0 && tz_holds(tmp("out.txt"), "new"), "write, fsync, rename: out.txt holds the data %s", err);
    check(tz_holds(tmp("victim"), "keep"), "the target of the planted link is left alone");
    struct stat st;
    check(lstat(tmp("out.txt.tmp"), &st) == 0 && S_ISLNK(st.st_mode), "the planted link itself is untouched");
    check(count("out.txt.tmp.") == 0, "no temporary left after commit");

    char *a, *b;
    int fa = tz_atomic_file_make_temp(tmp("x"), &a, err, sizeof err);
    int fb = tz_atomic_file_make_temp(tmp("x"), &b, err, sizeof err);
    check(fa >= 0 && fb >= 0 && strcmp(a, b) != 0, "two temporaries for one path get two names");
    if (fa >= 0) close(fa), unlink(a), free(a);
    if (fb >= 0) close(fb), unlink(b), free(b);

    rc = tz_atomic_file_open(&f, tmp("out2.txt"), err, sizeof err);
    if (!rc) tz_atomic_file_abort(&f);
    check(rc == 0 && count("out2.txt") == 0, "abort removes the temporary and makes no file");
    rc = tz_atomic_file_open(&f, tmp("nodir/out.txt"), err, sizeof err);
    check(rc != 0 && strstr(err, "nodir/out.txt") && strstr(err, "No such file"),
          "a missing folder is named with the reason: %s", err);

    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) printf("note: could not remove %s\n", g_dir);
    return tz_check_done("atomic_file");
}
