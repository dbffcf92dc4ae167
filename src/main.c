/* turbozero <command>: the command-line entry point. Dispatches to the commands; holds no
 * training logic of its own. */
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: turbozero <command> [args]\n"
            "commands:\n"
            "  train CONFIG [--set k=v ...]   fine-tune or pretrain\n"
            "  eval CONFIG [--set k=v ...]    validation loss of the configured model\n"
            "  init-model --arch llama --preset NAME --vocab V --out DIR [--seed S]\n"
            "  prep text --tokenizer bytes --in TEXT --out FILE [--val-fraction F]\n");
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        MPI_Finalize();
        return argc < 2 ? 2 : 0;
    }
    TZ_FATAL("unknown command '%s' (see turbozero --help)", argv[1]);
}
