/* HDF5 files written whole (io/h5_write.h). */
#include "io/h5_write.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "io/atomic_file.h"

hid_t tz_h5_create_temp(const char *path, char **tmp, char *err, size_t errlen) {
    int fd = tz_atomic_file_make_temp(path, tmp, err, errlen); /* exclusive, random name */
    if (fd < 0) return -1;
    close(fd);
    hid_t f = H5Fcreate(*tmp, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (f < 0) {
        tz_errf(err, errlen, "%s: cannot create", *tmp);
        remove(*tmp);
        free(*tmp);
        *tmp = NULL;
    }
    return f;
}

int tz_h5_commit(hid_t f, char *tmp, const char *path, int ok, char *err, size_t errlen) {
    ok = H5Fclose(f) >= 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        tz_errf(err, errlen, "%s: writing failed%s%s", path, ok ? ": " : "",
                ok ? strerror(errno) : "");
        remove(tmp);
        free(tmp);
        return 1;
    }
    free(tmp);
    return 0;
}
