/* comm.backend: which comm moves the gradients (src/comm/comm_select.h). The choice is made
 * here, from every rank's device, so the NCCL file only makes the comm it is asked for. */
#include "comm/comm_select.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm.h"
#include "comm/comm_nccl.h"
#include "core/error.h"

typedef struct gpu_rec {
    char host[128];
    char bus[32];
    int device; /* the rank's backend drives a GPU */
} gpu_rec;

tz_comm *tz_comm_select(enum tz_comm_backend want, tz_backend *be, tz_comm *host) {
    static const char *const names[] = {"auto", "mpi", "nccl"};
    const char *wname = want >= TZ_COMM_AUTO && want <= TZ_COMM_NCCL ? names[want] : "?";
    if (want == TZ_COMM_MPI) {
        if (host->rank == 0) tz_info("comm: mpi (comm.backend = \"mpi\")");
        return NULL;
    }
    /* one rank: nothing to sum, and a reduce-scatter on the host comm is a copy; NCCL would
     * only add its start-up and its memory (asked for by name, it is still made) */
    if (want == TZ_COMM_AUTO && host->size == 1) {
        if (be->device) tz_info("comm: mpi (comm.backend = \"auto\": one rank)");
        return NULL;
    }
    /* every rank's GPU: NCCL needs one per rank */
    gpu_rec me;
    memset(&me, 0, sizeof me);
    gethostname(me.host, sizeof me.host - 1);
    me.device = be->device;
    if (be->device) {
        tz_device_info di;
        be->device_info(be, &di);
        snprintf(me.bus, sizeof me.bus, "%s", di.bus_id);
    }
    gpu_rec *all = tz_xcalloc((size_t)host->size, sizeof *all);
    tz_comm_all_gather(host, &me, all, (int64_t)sizeof me, TZ_DT_U8);
    char why[1200] = "";
    int own = 1, any_device = 0;
    for (int r = 0; r < host->size; r++) any_device |= all[r].device;
    for (int r = 0; r < host->size && own; r++) {
        if (!all[r].device) {
            own = 0;
            snprintf(why, sizeof why, "rank %d computes on the CPU (run.device)", r);
        }
        for (int q = 0; q < r && own; q++)
            if (!strcmp(all[q].host, all[r].host) && !strcmp(all[q].bus, all[r].bus)) {
                own = 0;
                snprintf(why, sizeof why, "ranks %d and %d share the GPU at bus id %s on host %s "
                         "(NCCL refuses two ranks on one GPU)", q, r, all[r].bus, all[r].host);
            }
    }
    free(all);
    if (want == TZ_COMM_NCCL && !own)
        TZ_FATAL_HINT("run one rank per GPU (mpirun -np <GPUs per node x nodes>; srun "
                      "--gpus-per-task=1), or set comm.backend = \"mpi\" (or \"auto\")",
                      "comm.backend = \"nccl\": %s", why);
    int ok = own, all_ok = 0;
    if (own && !tz_comm_nccl_available(be, why, sizeof why)) ok = 0;
    tz_comm_all_reduce(host, &ok, &all_ok, 1, TZ_DT_I32);
    all_ok = all_ok == host->size;
    if (want == TZ_COMM_NCCL && !ok)
        TZ_FATAL_HINT("set comm.backend = \"mpi\" (or \"auto\", which falls back to it)",
                      "comm.backend = \"nccl\": %s", why);
    if (want == TZ_COMM_NCCL && !all_ok) TZ_FATAL("comm.backend = \"nccl\": NCCL cannot be loaded on every rank");
    if (!all_ok) {
        if (host->rank == 0 && any_device) /* CPU runs: MPI goes without saying */
            tz_info("comm: mpi (comm.backend = \"%s\": %s)", wname,
                    !own ? why : ok ? "NCCL cannot be loaded on every rank" : why);
        return NULL;
    }
    tz_comm *c = tz_comm_nccl_create(be, host);
    if (host->rank == 0)
        tz_info("comm: nccl for the gradients (comm.backend = \"%s\"), mpi for the rest", wname);
    return c;
}
