/* The command-line help: the top-level summary, one page per command, and --version. Prints
 * only; opens no file and starts no MPI, so it works anywhere, even without mpirun. */
#ifndef TZ_HELP_H
#define TZ_HELP_H
#include <stdio.h>

/* The summary of every command, to f. */
void tz_help_print_summary(FILE *f);
/* The page of command cmd (usage, flags, one example) to stdout; 0, or -1 when there is no
 * such command (nothing printed). */
int tz_help_print_command(const char *cmd);
/* 1 when any of argv[from..argc) is -h or --help. */
int tz_help_wanted(int argc, char **argv, int from);
/* "turbozero VERSION" and the build: git commit, CUDA or not, the CPU kernel. */
void tz_help_print_version(void);

#endif
