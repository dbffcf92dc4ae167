/* Inputs compared across ranks at start-up (see inputs_check.h). */
#include "train/inputs_check.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"

#define WHOLE_MAX (4 << 20)
#define HEAD_BYTES (1 << 20)
#define BLOCKS 64
#define BLOCK_BYTES 4096

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}

/* Hashes n bytes at off; 0, or -1 on a short read. */
static int hash_range(int fd, int64_t off, int64_t n, unsigned char *buf, size_t cap,
                      uint64_t *h) {
    while (n > 0) {
        size_t want = (size_t)n < cap ? (size_t)n : cap;
        ssize_t got = pread(fd, buf, want, (off_t)off);
        if (got <= 0) return -1;
        *h = fnv(*h, buf, (size_t)got);
        off += got;
        n -= got;
    }
    return 0;
}

int tz_file_digest(const char *path, int64_t *size, uint64_t *hash) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return -1;
    }
    const int64_t n = (int64_t)st.st_size;
    unsigned char *buf = tz_xmalloc(1 << 16);
    uint64_t h = fnv(0xcbf29ce484222325ULL, &n, sizeof n);
    int rc = 0;
    if (n <= WHOLE_MAX) {
        rc = hash_range(fd, 0, n, buf, 1 << 16, &h);
    } else {
        rc = hash_range(fd, 0, HEAD_BYTES, buf, 1 << 16, &h);
        for (int k = 0; k < BLOCKS && !rc; k++)
            rc = hash_range(fd, (n - BLOCK_BYTES) / (BLOCKS - 1) * k, BLOCK_BYTES, buf, 1 << 16, &h);
    }
    free(buf);
    close(fd);
    *size = n;
    *hash = h;
    return rc;
}

/* The list rank 0 sends: "key\tpath\n" lines. */
typedef struct list {
    char *s;
    size_t n, cap;
} list;

static void add(list *l, const char *key, const char *path) {
    size_t need = strlen(key) + strlen(path) + 3;
    if (l->n + need + 1 > l->cap) {
        l->cap = 2 * (l->n + need + 1);
        l->s = tz_xrealloc(l->s, l->cap);
    }
    l->n += (size_t)sprintf(l->s + l->n, "%s\t%s\n", key, path);
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int model_file(const char *name) {
    size_t n = strlen(name);
    return name[0] != '.' && ((n > 5 && !strcmp(name + n - 5, ".json")) ||
                              (n > 12 && !strcmp(name + n - 12, ".safetensors")));
}

/* path as a file, or the *.json / *.safetensors of a folder, sorted by name. */
static void add_path(list *l, const char *key, const char *path) {
    struct stat st;
    if (!path[0] || stat(path, &st) != 0) return; /* absent: the loader says so */
    if (!S_ISDIR(st.st_mode)) {
        add(l, key, path);
        return;
    }
    DIR *d = opendir(path);
    if (!d) return;
    char **names = NULL;
    int n = 0, cap = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (!model_file(e->d_name)) continue;
        if (n == cap) names = tz_xrealloc(names, (size_t)(cap = cap ? 2 * cap : 16) * sizeof *names);
        names[n++] = tz_xstrdup(e->d_name);
    }
    closedir(d);
    if (n > 1) qsort(names, (size_t)n, sizeof *names, cmp_str);
    char full[2 * TZ_PATH_MAX + 8];
    for (int i = 0; i < n; i++) {
        snprintf(full, sizeof full, "%s/%s", path, names[i]);
        add(l, key, full);
        free(names[i]);
    }
    free(names);
}

void tz_inputs_check(const tz_config *cfg, tz_comm *comm) {
    if (comm->size < 2) return;
    list l = {NULL, 0, 0};
    int64_t len = 0;
    if (comm->rank == 0) {
        add(&l, "config", "(the configuration broadcast by rank 0)");
        add_path(&l, "model.path", cfg->model.path);
        add_path(&l, "model.adapter", cfg->model.adapter);
        add_path(&l, "data.train", cfg->data.train);
        add_path(&l, "data.val", cfg->data.val);
        add_path(&l, "data.train_labels", cfg->data.train_labels);
        add_path(&l, "data.val_labels", cfg->data.val_labels);
        len = (int64_t)l.n;
    }
    tz_comm_bcast(comm, &len, 1, TZ_DT_I64, 0);
    if (comm->rank != 0) l.s = tz_xmalloc((size_t)len + 1);
    tz_comm_bcast(comm, l.s, len, TZ_DT_U8, 0);
    l.s[len] = 0;
    /* entries: key and path pointers into l.s */
    int n = 0;
    for (int64_t i = 0; i < len; i++) n += l.s[i] == '\n';
    char **key = tz_xcalloc((size_t)n, sizeof *key), **path = tz_xcalloc((size_t)n, sizeof *path);
    char *p = l.s;
    for (int i = 0; i < n; i++) {
        key[i] = p;
        p = strchr(p, '\t');
        *p++ = 0;
        path[i] = p;
        p = strchr(p, '\n');
        *p++ = 0;
    }
    /* mine: (size, hash) per entry; size -1: unreadable here */
    int64_t *mine = tz_xcalloc((size_t)(2 * n), sizeof *mine);
    for (int i = 0; i < n; i++) {
        uint64_t h = 0;
        if (i == 0) {
            mine[0] = (int64_t)sizeof *cfg;
            h = fnv(0xcbf29ce484222325ULL, cfg, sizeof *cfg);
        } else if (tz_file_digest(path[i], &mine[2 * i], &h) != 0) {
            mine[2 * i] = -1;
        }
        memcpy(&mine[2 * i + 1], &h, sizeof h);
    }
    int64_t *all = tz_xmalloc((size_t)(2 * n) * (size_t)comm->size * sizeof *all);
    tz_comm_all_gather(comm, mine, all, 2 * n, TZ_DT_I64);
    char msg[3000];
    size_t m = 0;
    int bad = 0;
    for (int r = 1; r < comm->size; r++) {
        const int64_t *a = all, *b = all + (size_t)r * (size_t)(2 * n);
        for (int i = 0; i < n; i++) {
            if (a[2 * i] < 0 || b[2 * i] < 0) continue; /* unreadable: the loader reports it */
            if (a[2 * i] == b[2 * i] && a[2 * i + 1] == b[2 * i + 1]) continue;
            if (bad < 8 && m < sizeof msg)
                m += (size_t)snprintf(msg + m, sizeof msg - m,
                                      "%s rank %d sees a different %s file %s (%lld bytes, digest "
                                      "%016llx; rank 0: %lld bytes, digest %016llx)",
                                      bad ? ";" : "", r, key[i], path[i], (long long)b[2 * i],
                                      (unsigned long long)b[2 * i + 1], (long long)a[2 * i],
                                      (unsigned long long)a[2 * i + 1]);
            bad++;
            break; /* one file per rank */
        }
    }
    if (bad) {
        if (comm->rank == 0)
            TZ_FATAL_HINT("every rank must read the same files: copy them again to the node(s) "
                          "named, or put them on a file system all nodes share",
                          "inputs differ between ranks:%s%s", msg,
                          bad > 8 ? "; and more ranks" : "");
        tz_comm_barrier(comm); /* rank 0 stops the job; never returns */
    }
    free(all);
    free(mine);
    free(key);
    free(path);
    free(l.s);
}
