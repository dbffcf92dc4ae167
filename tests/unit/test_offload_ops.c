/* The offload's entries of the backend table (core/backend.h "the offload"): pinned host
 * memory, registration, async copies on the copy queue, events ordering the queues and the
 * host, device_info. The CPU backend always (done at once); a CUDA backend when one can be
 * created (a GPU, or the CPU emulation through TZ_CUDA_MODULE): a bucket produced on the
 * compute queue, copied to the host on the copy queue after an event, read after the host
 * waited for the copy's event, back through upload_async with the compute queue waiting; a
 * fresh allocation written first by the copy queue; the same under TZ_CUDA_SYNC_DEBUG; and,
 * on the emulation, a refused host_register (a warning, the buffer stays pageable). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/registry.h"
#include "core/backend.h"
#include "tz_check.h"

/* fill -> (compute) event -> copy queue waits -> download_async -> event -> host waits;
 * then upload_async of new values, the compute queue waits for it, sumsq reads them. */
static void roundtrip(tz_backend *be, int64_t n) {
    const char *nm = be->name;
    float *d = be->alloc(be, (size_t)n * sizeof(float));
    float *pinned = be->host_alloc(be, (size_t)n * sizeof(float));
    int zero = 1;
    for (int64_t i = 0; i < n; i++) zero &= pinned[i] == 0.0f;
    check(zero && ((uintptr_t)pinned & 63) == 0, "%s: host_alloc of %lld floats: zeroed, 64-byte aligned",
          nm, (long long)n);
    be->fill(be, d, 1.5f, n);
    be->scale(be, d, 2.0f, n); /* more compute-queue work the copy must wait for */
    void *after = be->event_mark(be, TZ_QUEUE_COMPUTE);
    be->event_wait(be, after, TZ_QUEUE_COPY);
    be->event_free(be, after);
    be->download_async(be, pinned, d, (size_t)n * sizeof(float));
    void *done = be->event_mark(be, TZ_QUEUE_COPY);
    be->event_wait(be, done, TZ_QUEUE_HOST);
    check(be->event_done(be, done) == 1, "%s: event done after the host waited for it", nm);
    be->event_free(be, done);
    int good = 1;
    for (int64_t i = 0; i < n; i++) good &= pinned[i] == 3.0f;
    check(good, "%s: download_async after the compute queue's fill and scale: every value 3", nm);

    /* a registered plain buffer (the shard's way) as the target, a partial range */
    float *plain = calloc((size_t)n, sizeof(float));
    be->host_register(be, plain, (size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) pinned[i] = (float)(i % 7);
    be->upload_async(be, d, pinned, (size_t)n * sizeof(float));
    void *up = be->event_mark(be, TZ_QUEUE_COPY);
    be->event_wait(be, up, TZ_QUEUE_COMPUTE); /* ops after this see the upload */
    be->event_free(be, up);
    double ss = be->sumsq(be, d, n), want = 0.0;
    for (int64_t i = 0; i < n; i++) want += (double)(i % 7) * (double)(i % 7);
    check(ss == want, "%s: upload_async, compute queue waits, sumsq = %.0f (expected %.0f)", nm, ss,
          want);
    after = be->event_mark(be, TZ_QUEUE_COMPUTE);
    be->event_wait(be, after, TZ_QUEUE_COPY);
    be->event_free(be, after);
    be->download_async(be, plain + 1, d + 1, (size_t)(n - 2) * sizeof(float));
    done = be->event_mark(be, TZ_QUEUE_COPY);
    while (!be->event_done(be, done)) {} /* polling, as the gradient hook does */
    be->event_free(be, done);
    good = plain[0] == 0.0f && plain[n - 1] == 0.0f;
    for (int64_t i = 1; i < n - 1; i++) good &= plain[i] == (float)(i % 7);
    check(good, "%s: download_async into a registered buffer, elements 1..n-2 only", nm);
    be->host_unregister(be, plain);
    free(plain);
    be->host_free(be, pinned);
    be->release(be, d);
}

/* alloc zeroes on the compute queue; a buffer written first by the copy queue must not be
 * zeroed after that write (the emulation stops a copy that no event orders after a set on
 * another stream; on a GPU the values would show it, now and then). */
static void fresh_alloc_copy_first(tz_backend *be, int64_t n) {
    float *h = be->host_alloc(be, (size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) h[i] = (float)(i % 5 + 1);
    float *d = be->alloc(be, (size_t)n * sizeof(float));
    be->upload_async(be, d, h, (size_t)n * sizeof(float));
    void *up = be->event_mark(be, TZ_QUEUE_COPY);
    be->event_wait(be, up, TZ_QUEUE_COMPUTE);
    be->event_free(be, up);
    double ss = be->sumsq(be, d, n), want = 0.0;
    for (int64_t i = 0; i < n; i++) want += (double)h[i] * (double)h[i];
    check(ss == want, "%s: a fresh allocation written first on the copy queue keeps the values "
          "(sumsq %.0f, expected %.0f)", be->name, ss, want);
    be->release(be, d);
    be->host_free(be, h);
}

/* stderr of fn(be) into out (n bytes). */
static void capture_stderr(void (*fn)(tz_backend *), tz_backend *be, char *out, size_t n) {
    fflush(stderr);
    int saved = dup(2);
    FILE *tmp = tmpfile();
    dup2(fileno(tmp), 2);
    fn(be);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(tmp);
    size_t got = fread(out, 1, n - 1, tmp);
    out[got] = 0;
    fclose(tmp);
}

/* Two buffers registered where pinning is refused, used by async copies, unregistered. */
static void register_refused(tz_backend *be) {
    const int64_t n = 5000;
    float *a = calloc((size_t)n, sizeof(float)), *b = calloc((size_t)n, sizeof(float));
    be->host_register(be, a, (size_t)n * sizeof(float));
    be->host_register(be, b, (size_t)n * sizeof(float));
    float *d = be->alloc(be, (size_t)n * sizeof(float));
    be->fill(be, d, 2.5f, n);
    void *after = be->event_mark(be, TZ_QUEUE_COMPUTE);
    be->event_wait(be, after, TZ_QUEUE_COPY);
    be->event_free(be, after);
    be->download_async(be, a, d, (size_t)n * sizeof(float));
    void *done = be->event_mark(be, TZ_QUEUE_COPY);
    be->event_wait(be, done, TZ_QUEUE_HOST);
    be->event_free(be, done);
    int good = 1;
    for (int64_t i = 0; i < n; i++) good &= a[i] == 2.5f;
    check(good, "%s: download_async into a buffer left pageable: every value 2.5", be->name);
    be->host_unregister(be, a);
    be->host_unregister(be, b);
    be->release(be, d);
    free(a), free(b);
}

int main(void) {
    tz_backend *cpu = tz_backend_create(TZ_DEVICE_CPU, 0, 1);
    tz_device_info di;
    cpu->device_info(cpu, &di);
    check(di.ordinal == -1 && di.bus_id[0] == 0 && di.name[0],
          "cpu: device_info: ordinal -1, no bus id, \"%s\"", di.name);
    roundtrip(cpu, 1000);
    tz_backend_destroy(cpu);

    if (tz_cuda_device_count() > 0) {
        tz_backend *gpu = tz_backend_create(TZ_DEVICE_CUDA, 0, 0);
        gpu->device_info(gpu, &di);
        check(di.ordinal == 0 && strlen(di.bus_id) >= 7 && di.total_bytes > 0 &&
                  di.free_bytes <= di.total_bytes,
              "cuda: device_info: GPU %d (%s), bus id %s, %.1f of %.1f GiB free", di.ordinal,
              di.name, di.bus_id, (double)di.free_bytes / 1073741824.0,
              (double)di.total_bytes / 1073741824.0);
        roundtrip(gpu, 1 << 20);
        roundtrip(gpu, 333);
        fresh_alloc_copy_first(gpu, 100003);
        if (strstr(di.name, "CPU emulation")) { /* a GPU cannot be made to refuse on demand */
            char err[4096];
            setenv("TZ_CUDA_EMU_REGISTER_MB", "0", 1);
            capture_stderr(register_refused, gpu, err, sizeof err);
            unsetenv("TZ_CUDA_EMU_REGISTER_MB");
            const char *w = strstr(err, "cannot pin 20000 bytes");
            check(w && strstr(err, "cudaErrorMemoryAllocation") && strstr(err, "pageable") &&
                      !strstr(w + 1, "cannot pin"),
                  "cuda: a refused host_register warns once, naming the size and CUDA's error: "
                  "%.160s", err);
        }
        tz_backend_destroy(gpu);
        setenv("TZ_CUDA_SYNC_DEBUG", "1", 1); /* every op synchronised and checked */
        gpu = tz_backend_create(TZ_DEVICE_CUDA, 0, 0);
        unsetenv("TZ_CUDA_SYNC_DEBUG");
        roundtrip(gpu, 333);
        fresh_alloc_copy_first(gpu, 999);
        tz_backend_destroy(gpu);
    } else {
        printf("cuda: not tested here (%s)\n",
               tz_cuda_device_count() < 0 ? "this build has no CUDA backend" : "no CUDA device");
    }
    return tz_check_done("test_offload_ops");
}
