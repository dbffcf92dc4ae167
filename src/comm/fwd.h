/* The names of the comm/ types, without <mpi.h>: headers above comm/ (src/train) declare
 * functions taking tz_world, tz_comm and tz_comm_req pointers through this file, so only
 * the .c files that use MPI or the types' members include comm/world.h, comm/comm.h (and so
 * <mpi.h>). */
#ifndef TZ_MPI_FWD_H
#define TZ_MPI_FWD_H

typedef struct tz_world tz_world;
typedef struct tz_comm tz_comm;
typedef struct tz_comm_req tz_comm_req;

/* comm.backend: which comm moves the gradients and weights of ZeRO (comm/comm_select.h). */
enum tz_comm_backend { TZ_COMM_AUTO = 0, TZ_COMM_MPI = 1, TZ_COMM_NCCL = 2 };

#endif
