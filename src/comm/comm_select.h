/* Choosing the comm of the gradients (comm.backend): MPI through the host, or NCCL on the
 * GPUs, from what every rank has. */
#ifndef TZ_COMM_SELECT_H
#define TZ_COMM_SELECT_H
#include "comm/fwd.h"
#include "core/backend.h"

/* comm.backend: NULL when the gradients go through
 * the host comm (MPI), else a new NCCL comm. auto picks nccl only on more than one rank, when
 * every rank's backend is a GPU of its own (no two ranks of a host with the same PCI bus id)
 * and NCCL loads on every rank; "nccl" where that does not hold is fatal, saying why (on one
 * rank it is made as asked). Rank 0 prints the choice. Collective over host (the run's MPI
 * comm). */
tz_comm *tz_comm_select(enum tz_comm_backend want, tz_backend *be, tz_comm *host);

#endif
