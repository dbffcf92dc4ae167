/* World set-up: ranks from MPI, local rank from MPI_Comm_split_type(SHARED), NUMA binding of
 * memory policy and CPU affinity with libnuma. Does not pick GPUs or create communicators. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "comm/world.h"

#include <errno.h>
#include <sched.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(TZ_HAVE_NUMA)
#include <numa.h>
#include <numaif.h>
#endif

/* Number of configured NUMA nodes, 0 when libnuma is absent or the kernel has no NUMA. */
static int numa_node_count(char *why, size_t n) {
#if defined(TZ_HAVE_NUMA)
    if (numa_available() < 0) {
        snprintf(why, n, "no NUMA support in the kernel");
        return 0;
    }
    int nodes = numa_num_configured_nodes();
    if (nodes < 1) {
        snprintf(why, n, "libnuma reports %d nodes", nodes);
        return 0;
    }
    return nodes;
#else
    snprintf(why, n, "built without libnuma");
    return 0;
#endif
}

#if defined(TZ_HAVE_NUMA)
/* Preferred-node memory policy for this thread (inherited by threads created later).
 * 0, or -1 with errno set. Uses set_mempolicy directly because numa_set_preferred does not
 * report failure. */
static int set_preferred_node(int node) {
    struct bitmask *mask = numa_allocate_nodemask();
    if (!mask) {
        errno = ENOMEM;
        return -1;
    }
    numa_bitmask_setbit(mask, (unsigned int)node);
    long rc = set_mempolicy(MPOL_PREFERRED, mask->maskp, mask->size + 1);
    int err = errno;
    numa_bitmask_free(mask);
    errno = err;
    return rc == 0 ? 0 : -1;
}
#endif

int tz_world_bind_numa(tz_world *w, int node) {
    w->numa_bound = 0;
    w->numa_node = node;
    if (node < 0) {
        snprintf(w->numa_reason, sizeof w->numa_reason, "no preferred node");
        return 0;
    }
#if defined(TZ_HAVE_NUMA)
    if (w->numa_nodes < 1) {
        w->numa_node = -1;
        return 0; /* numa_reason was set when the nodes were counted */
    }
    if (node >= w->numa_nodes) {
        snprintf(w->numa_reason, sizeof w->numa_reason, "node %d out of range (%d nodes)", node,
                 w->numa_nodes);
        w->numa_node = -1;
    } else if (set_preferred_node(node) != 0) {
        snprintf(w->numa_reason, sizeof w->numa_reason, "set_mempolicy(preferred %d): %s", node,
                 strerror(errno));
    } else if (numa_run_on_node(node) != 0) {
        snprintf(w->numa_reason, sizeof w->numa_reason, "numa_run_on_node(%d): %s", node,
                 strerror(errno));
    } else {
        w->numa_bound = 1;
        w->numa_reason[0] = 0;
        return 1;
    }
    if (!w->numa_warned) {
        w->numa_warned = 1;
        tz_warn("NUMA binding refused, continuing unbound: %s", w->numa_reason);
    }
    return 0;
#else
    w->numa_node = -1;
    return 0;
#endif
}

int tz_numa_node_of_pci(const char *bus_id) {
    char path[512];
    if (!bus_id || !bus_id[0] || strchr(bus_id, '/')) return -1;
    if ((size_t)snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/numa_node", bus_id) >=
        sizeof path)
        return -1;
    FILE *f = fopen(path, "r");
    /* sysfs names the domain with 4 hex digits; some drivers print 8 ("00000000:3b:00.0") */
    if (!f && strlen(bus_id) > 9 && bus_id[8] == ':' && !strncmp(bus_id, "0000", 4)) {
        snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/numa_node", bus_id + 4);
        f = fopen(path, "r");
    }
    if (!f) return -1;
    int node = -1;
    if (fscanf(f, "%d", &node) != 1) node = -1;
    fclose(f);
    return node < 0 ? -1 : node;
}

/* (world.h) */
void tz_mpi_singleton_defaults(void) {
    static const char *launched[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK",
                                     "PMI_FD", "PMI_SIZE"};
    for (size_t i = 0; i < sizeof launched / sizeof *launched; i++)
        if (getenv(launched[i])) return;
    setenv("OMPI_MCA_ess_singleton_isolated", "1", 0);
    setenv("OMPI_MCA_pml", "ob1", 0);
}

void tz_world_init(tz_world *w, int device_index_or_minus1) {
    memset(w, 0, sizeof *w);
    w->local = MPI_COMM_NULL;
    int up = 0;
    MPI_Initialized(&up);
    if (!up) TZ_FATAL("MPI is not initialised; call MPI_Init before tz_world_init");
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &w->rank));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &w->size));
    tz_log_set_rank(w->rank, w->size);

    MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, w->rank, MPI_INFO_NULL,
                                  &w->local));
    MPI_CHECK(MPI_Comm_set_errhandler(w->local, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(w->local, &w->local_rank));
    MPI_CHECK(MPI_Comm_size(w->local, &w->local_size));

    if (gethostname(w->hostname, sizeof w->hostname) != 0)
        snprintf(w->hostname, sizeof w->hostname, "unknown");
    w->hostname[sizeof w->hostname - 1] = 0;
    w->device = device_index_or_minus1 >= 0 ? device_index_or_minus1 : -1;
    w->threads = omp_get_max_threads();

    w->numa_node = -1;
    w->numa_nodes = numa_node_count(w->numa_reason, sizeof w->numa_reason);
    if (w->numa_nodes == 1) {
        /* one node: every allocation is local already; nothing to bind, nothing to warn */
        w->numa_node = 0;
        snprintf(w->numa_reason, sizeof w->numa_reason, "single node");
    } else if (w->numa_nodes > 1) {
        /* CPU path; the GPU code re-binds with the device's node through the hook */
        tz_world_bind_numa(w, w->local_rank % w->numa_nodes);
    }
}

void tz_world_free(tz_world *w) {
    int down = 0;
    MPI_Finalized(&down);
    if (!down && w->local != MPI_COMM_NULL) MPI_Comm_free(&w->local);
    w->local = MPI_COMM_NULL;
}

void tz_world_print(const tz_world *w) {
    char numa[TZ_REASON_MAX + 64];
    if (w->numa_bound)
        snprintf(numa, sizeof numa, "NUMA node %d of %d (bound)", w->numa_node, w->numa_nodes);
    else if (w->numa_node >= 0 && w->numa_nodes == 1)
        snprintf(numa, sizeof numa, "NUMA node 0 (single node)");
    else
        snprintf(numa, sizeof numa, "NUMA unbound: %s", w->numa_reason);
    char dev[32] = "";
    if (w->device >= 0) snprintf(dev, sizeof dev, " | device %d", w->device);
    char cores[32] = "";
    if (w->cores > 0) snprintf(cores, sizeof cores, "%d cores, ", w->cores);
    tz_info_all("rank %d/%d | local rank %d/%d | host %s%s | %s | %s%d OpenMP threads", w->rank,
                w->size, w->local_rank, w->local_size, w->hostname, dev, numa, cores, w->threads);
}

void tz_world_gather_cpus(tz_world *w) {
    cpu_set_t mine, *all = tz_xcalloc((size_t)(w->local_size > 0 ? w->local_size : 1), sizeof *all);
    CPU_ZERO(&mine);
    if (sched_getaffinity(0, sizeof mine, &mine) != 0) CPU_ZERO(&mine);
    w->cores = CPU_COUNT(&mine);
    int threads = w->threads;
    w->node_threads = threads, w->node_cores = w->cores;
    if (w->local != MPI_COMM_NULL && w->local_size > 1) {
        MPI_CHECK(MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine,
                                MPI_BYTE, w->local));
        MPI_CHECK(MPI_Allreduce(&threads, &w->node_threads, 1, MPI_INT, MPI_SUM, w->local));
        cpu_set_t u;
        CPU_ZERO(&u);
        for (int i = 0; i < w->local_size; i++) CPU_OR(&u, &u, &all[i]);
        w->node_cores = CPU_COUNT(&u);
    }
    free(all);
}

/* The value in bytes of the "Key: N kB" line of /proc/meminfo; -1 when absent. */
static long long meminfo(const char *key) {
    FILE *f = fopen("/proc/meminfo", "re");
    if (!f) return -1;
    char line[256];
    long long v = -1;
    const size_t k = strlen(key);
    while (v < 0 && fgets(line, sizeof line, f))
        if (!strncmp(line, key, k) && line[k] == ':') v = strtoll(line + k + 1, NULL, 10) * 1024;
    fclose(f);
    return v;
}

/* A cgroup v2 file of this process's group as a number; -1 when absent or "max". */
static long long cgroup_value(const char *name) {
    FILE *f = fopen("/proc/self/cgroup", "re");
    if (!f) return -1;
    char line[1024], path[1200] = "";
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "0::", 3)) {
            line[strcspn(line, "\n")] = 0;
            snprintf(path, sizeof path, "/sys/fs/cgroup%s/%s", line + 3, name);
        }
    fclose(f);
    if (!path[0] || !(f = fopen(path, "re"))) return -1;
    long long v = -1;
    if (fgets(line, sizeof line, f) && line[0] >= '0' && line[0] <= '9') v = strtoll(line, NULL, 10);
    fclose(f);
    return v;
}

size_t tz_world_host_available(char *src, size_t n) {
    long long avail = meminfo("MemAvailable");
    snprintf(src, n, "MemAvailable");
    long long max = cgroup_value("memory.max"), cur = cgroup_value("memory.current");
    if (max > 0 && cur >= 0) {
        long long room = max > cur ? max - cur : 0;
        if (avail < 0 || room < avail) {
            avail = room;
            snprintf(src, n, "cgroup memory.max %.1f GiB less %.1f GiB in use",
                     (double)max / 1073741824.0, (double)cur / 1073741824.0);
        }
    }
    return avail > 0 ? (size_t)avail : 0;
}

void *tz_world_host_alloc(const tz_world *w, size_t bytes) {
    size_t n = bytes ? bytes : 1;
    void *p = NULL;
#if defined(TZ_HAVE_NUMA)
    if (w->numa_nodes > 0 && w->numa_node >= 0) {
        p = numa_alloc_onnode(n, w->numa_node);
        if (!p) TZ_FATAL("numa_alloc_onnode(%zu bytes, node %d) failed", n, w->numa_node);
        memset(p, 0, n); /* touch every page now, on this node */
        return p;
    }
#else
    (void)w;
#endif
    if (posix_memalign(&p, 4096, n) != 0) TZ_FATAL("out of host memory allocating %zu bytes", n);
    memset(p, 0, n);
    return p;
}

void tz_world_host_free(const tz_world *w, void *p, size_t bytes) {
    if (!p) return;
#if defined(TZ_HAVE_NUMA)
    if (w->numa_nodes > 0 && w->numa_node >= 0) {
        numa_free(p, bytes ? bytes : 1);
        return;
    }
#else
    (void)w;
    (void)bytes;
#endif
    free(p);
}
