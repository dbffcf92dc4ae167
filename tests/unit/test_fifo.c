/* Readers that hand a path to a library's own open (jansson, zlib, stdio before HDF5) refuse a
 * FIFO, a folder or a device by name before it can block: DiT's config.json, a PEFT
 * adapter_config.json, IDX image files, HDF5 image sets. An alarm fails the test instead of
 * hanging it, should one block. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/dit_config.h"
#include "io/fsutil.h"
#include "io/idx.h"
#include "io/images_h5.h"
#include "io/peft.h"
#include "tz_check.h"

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "FAIL a reader blocked on a FIFO for 20 s\n";
    if (write(1, msg, sizeof msg - 1) < 0) _exit(2);
    _exit(1);
}

static int says(const char *err, const char *path, const char *kind) {
    char want[700];
    snprintf(want, sizeof want, "%s: not a regular file (%s)", path, kind);
    if (strstr(err, want)) return 1;
    printf("     got \"%s\"\n     expected \"%s\"\n", err, want);
    return 0;
}

int main(void) {
    char dir[] = "/tmp/tzfifo.XXXXXX", fifo[600], sub[600], err[1200];
    if (!mkdtemp(dir)) return 1;
    snprintf(fifo, sizeof fifo, "%s/pipe", dir);
    snprintf(sub, sizeof sub, "%s/model", dir);
    signal(SIGALRM, on_alarm);
    alarm(20);
    check(mkfifo(fifo, 0600) == 0 && mkdir(sub, 0700) == 0, "a FIFO and a folder made");
    char cj[700];
    snprintf(cj, sizeof cj, "%s/config.json", sub);
    check(mkfifo(cj, 0600) == 0, "a FIFO named config.json in a model folder");

    err[0] = 0;
    check(tz_check_regular(fifo, err, sizeof err) != 0 && says(err, fifo, "a FIFO"), "tz_check_regular: a FIFO");
    check(tz_check_regular(dir, err, sizeof err) != 0 && says(err, dir, "a directory"), "tz_check_regular: a folder");
    check(tz_check_regular("/dev/null", err, sizeof err) != 0 && says(err, "/dev/null", "a character device"),
          "tz_check_regular: a device");
    err[0] = 0;
    check(tz_check_regular("/nonexistent/x", err, sizeof err) == 0 && !err[0],
          "tz_check_regular: a missing file is left to the open to report");

    tz_dit_config dc;
    err[0] = 0;
    check(tz_dit_config_read(&dc, sub, err, sizeof err) != 0 && says(err, cj, "a FIFO"), "DiT config.json: a FIFO refused");
    tz_peft_config pc;
    err[0] = 0;
    check(tz_peft_read(&pc, fifo, err, sizeof err) != 0 && says(err, fifo, "a FIFO"), "adapter_config.json: a FIFO refused");
    uint8_t *px = NULL;
    int64_t n, rows, cols;
    err[0] = 0;
    check(tz_idx_read_images(fifo, &px, &n, &rows, &cols, err, sizeof err) != 0 && says(err, fifo, "a FIFO"),
          "IDX images: a FIFO refused");
    tz_image_set s;
    err[0] = 0;
    check(tz_h5_images_read(&s, fifo, 10, err, sizeof err) != 0 && says(err, fifo, "a FIFO"),
          "HDF5 image set: a FIFO refused");
    alarm(0);
    unlink(cj);
    rmdir(sub);
    unlink(fifo);
    rmdir(dir);
    return tz_check_done("fifo");
}
