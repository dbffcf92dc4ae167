/* tz_config_check FILE [section.key=value ...]: loads a config the way the program does and
 * prints "OK" and the effective config. Used by tests/config_errors.sh; no training here. */
#include <mpi.h>
#include <stdio.h>

#include "comm/world.h"
#include "io/config.h"
#include "task/family.h"

int main(int argc, char **argv) {
    tz_mpi_singleton_defaults();
    MPI_Init(&argc, &argv);
    if (argc < 2) {
        fprintf(stderr, "usage: tz_config_check FILE [section.key=value ...]\n");
        MPI_Finalize();
        return 2;
    }
    tz_config cfg;
    tz_config_names names;
    tz_family_names(&names);
    tz_config_load(&cfg, &names, argv[1], (const char *const *)(argv + 2), argc - 2);
    printf("OK\n");
    tz_config_write(&cfg, &names, stdout);
    MPI_Finalize();
    return 0;
}
