/* The collective watchdog: a thread per rank that stops the whole job when a collective has
 * waited longer than run.collective_timeout, naming the operation, the step and the ranks
 * that did not arrive, instead of leaving every rank blocked forever behind one that stopped
 * (SIGSTOP, a dead link, a stuck file system).
 *
 * The comm front door (comm/comm.c) records each collective: tz_watch_enter when it starts
 * (counted: collective #k of this rank), tz_watch_block / tz_watch_unblock around the time
 * the rank waits in it (a blocking call, or tz_comm_wait of a non-blocking one). Only waiting
 * counts towards the timeout, never the computing between a non-blocking start and its wait.
 *
 * Past the timeout the waiting rank asks every other rank, over a private duplicate of
 * MPI_COMM_WORLD, how far it got: each rank's watchdog thread answers (its collective count,
 * whether and where it waits, its step) every tick, whatever its main thread is doing. A rank
 * that answers with a count below k has not reached the collective; one that does not answer
 * within the grace time is stopped, dead or unreachable. The waiting rank prints one message
 * and calls MPI_Abort. Asking needs MPI_THREAD_MULTIPLE (src/cli/main.c asks for it); with less
 * the watchdog still stops the job, without asking. */
#ifndef TZ_WATCHDOG_H
#define TZ_WATCHDOG_H
#include <stdint.h>

/* Starts the watchdog thread with the timeout in seconds (<= 0: no watchdog; one rank: none
 * needed). Collective over MPI_COMM_WORLD (duplicates it); MPI must be initialised. */
void tz_watchdog_start(double timeout_s);
/* Stops and joins the thread, frees the duplicate. Collective; a no-op when not started. */
void tz_watchdog_stop(void);
/* Where the rank is, for the message: in training step `step` (1-based), after step -step
 * (between steps: logging, evaluation, saving) when negative, 0 before the first step. */
void tz_watchdog_set_step(int64_t step);

/* ---- for the comm front door ---- */
/* A collective starts: returns its number on this rank (1, 2, ...). */
int64_t tz_watch_enter(const char *op);
/* The rank waits for collective `seq` (named op) to complete ... and no longer. */
void tz_watch_block(int64_t seq, const char *op);
void tz_watch_unblock(void);

#endif
