/* The MPI world as one rank sees it: rank, size, local rank (from a shared-memory split, never
 * from Slurm variables), host, NUMA node and binding, threads. Does not call MPI_Init. */
#ifndef TZ_WORLD_H
#define TZ_WORLD_H
#include <mpi.h>

#include "core/error.h" /* MPI_CHECK */
#include "comm/fwd.h"

#define TZ_HOST_MAX 256
#define TZ_REASON_MAX 160

struct tz_world {
    int rank, size;             /* in MPI_COMM_WORLD */
    int local_rank, local_size; /* among the ranks sharing this node's memory */
    MPI_Comm local;             /* the shared-memory communicator (freed by tz_world_free) */
    char hostname[TZ_HOST_MAX];
    int device;                 /* accelerator index this rank drives, -1 for none */
    int numa_nodes;             /* configured NUMA nodes; 0 when libnuma is unusable */
    int numa_node;              /* the node this rank's memory and threads belong to; -1 unknown */
    int numa_bound;             /* 1: memory policy and CPU affinity were set to numa_node */
    char numa_reason[TZ_REASON_MAX]; /* why not bound ("single node", "set_mempolicy: ...") */
    int numa_warned;            /* the refusal warning was printed (once per rank) */
    int threads;                /* OpenMP threads this rank will use */
    /* CPU cores (tz_world_gather_cpus): this rank's affinity mask, the distinct cores of the
     * ranks on this node together, and the OpenMP threads they run together */
    int cores, node_cores, node_threads;
};

/* Call before MPI_Init (every program of this project does). Started without a launcher (no
 * mpirun, no srun with PMI or PMIx: the variables each sets in its processes), a program is
 * an MPI singleton of one rank. Open MPI 4 then starts a helper daemon and every transport it
 * has, about 0.35 s of the start of every command; a singleton that talks only to itself
 * needs neither: ess_singleton_isolated (no daemon, no MPI_Comm_spawn, which nothing here
 * uses) and the ob1 messaging layer (its "self" path) start it in about 0.02 s. A value the
 * user set is kept; under a launcher nothing changes. */
void tz_mpi_singleton_defaults(void);

/* Fills w from MPI_COMM_WORLD (MPI must be initialised), sets the log rank, and binds the
 * rank to a NUMA node: with several nodes, node = local_rank % nodes (the CPU choice; the GPU
 * code re-binds with tz_world_bind_numa and the device's real node). device is recorded.
 * A refused binding is recorded in numa_reason and warned about once, on that rank; a single
 * node is not a failure. Call before the first OpenMP region, so the thread pool inherits
 * the CPU affinity. Collective over MPI_COMM_WORLD. */
void tz_world_init(tz_world *w, int device_index_or_minus1);
void tz_world_free(tz_world *w);

/* The hook for accelerators: bind memory policy and CPU affinity to `node` (from
 * cudaDevAttrHostNumaId or tz_numa_node_of_pci). node < 0 means "no preference": the rank
 * is left unbound with that reason. Warns (once per call) only when binding is refused.
 * Returns 1 when bound. Not collective. */
int tz_world_bind_numa(tz_world *w, int node);

/* The NUMA node of a PCI device from /sys/bus/pci/devices/<bus_id>/numa_node ("0000:3b:00.0",
 * lower case as sysfs spells it); -1 when unknown (no file, or the kernel says -1). */
int tz_numa_node_of_pci(const char *bus_id);

/* Host memory for this rank's optimizer shard: zeroed, page-aligned, placed on the rank's
 * NUMA node when it is known (numa_alloc_onnode; first touch by this rank otherwise). The
 * CUDA backend will register it as pinned memory (cudaHostRegister) after this call.
 * Fatal on failure. Free with tz_world_host_free and the same byte count. */
void *tz_world_host_alloc(const tz_world *w, size_t bytes);
void tz_world_host_free(const tz_world *w, void *p, size_t bytes);
/* After the thread count is final (w->threads): each rank counts the CPUs of its affinity
 * mask, and the ranks of each node add up their threads and the distinct CPUs of their masks
 * (a mask per rank gathered over the node). Collective over MPI_COMM_WORLD. */
void tz_world_gather_cpus(tz_world *w);
/* Memory this node can still give, in bytes: MemAvailable of /proc/meminfo, or the room left
 * under this process's cgroup limit (memory.max - memory.current, cgroup v2) when smaller;
 * src gets where the figure comes from ("MemAvailable", "cgroup memory.max"). 0 when
 * neither can be read. */
size_t tz_world_host_available(char *src, size_t n);

/* Every rank prints one start-up line (tz_info_all): rank, local rank, host, NUMA node or
 * "unbound: reason", CPU cores and OpenMP threads. Not collective (lines may interleave by
 * rank). */
void tz_world_print(const tz_world *w);

#endif
