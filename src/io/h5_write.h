/* The two ends of every HDF5 file turbozero writes: created under a fresh temporary name beside
 * its path, renamed over the path only when whole, so a reader never meets half a file. */
#ifndef TZ_H5_WRITE_H
#define TZ_H5_WRITE_H
#include <hdf5.h>
#include <stddef.h>

/* A new HDF5 file at an exclusive temporary name beside path: its id, with *tmp the name
 * (malloc'd); or -1 with "NAME: cannot create" in err (nothing left behind). */
hid_t tz_h5_create_temp(const char *path, char **tmp, char *err, size_t errlen);
/* Closes f; when ok and the close succeed, renames tmp over path; otherwise removes tmp and
 * says "path: writing failed". Frees tmp. 0, or non-zero with err. */
int tz_h5_commit(hid_t f, char *tmp, const char *path, int ok, char *err, size_t errlen);

#endif
