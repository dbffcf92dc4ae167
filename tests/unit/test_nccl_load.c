/* The NCCL comm's library loading (cuda/cuda_comm_nccl.cu), which otherwise runs only on a GPU
 * machine: the CUDA module (TZ_TEST_CUDA_MODULE, its path in this build) is opened here, where
 * no GPU is needed, and its tz_cuda_module_nccl_load asked to load TZ_NCCL_LIBRARY. With
 * TZ_TEST_NCCL_EXPECT=ok every NCCL symbol the comm uses must resolve in that library (a
 * misspelt name fails here); with =fail the library is absent and the error must name it and
 * say how to point turbozero at NCCL. Skips (77) in a build without the CUDA module, or
 * (ok) where the NCCL library given does not exist. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/registry.h"
#include "core/backend.h"
#include "backend/cuda_module.h"
#include "tz_check.h"

int main(void) {
    const char *mod = getenv("TZ_TEST_CUDA_MODULE"), *lib = getenv("TZ_NCCL_LIBRARY");
    const char *expect = getenv("TZ_TEST_NCCL_EXPECT");
    if (!mod || !*mod || !lib || !expect) {
        printf("skip: TZ_TEST_CUDA_MODULE, TZ_NCCL_LIBRARY and TZ_TEST_NCCL_EXPECT not set "
               "(a build without the CUDA module)\n");
        return 77;
    }
    const int want_ok = !strcmp(expect, "ok");
    if (want_ok && access(lib, R_OK) != 0) {
        printf("skip: %s does not exist here\n", lib);
        return 77;
    }
    /* links backend/registry.c, and with it what the module calls back (error path, allocators) */
    printf("backends built in: %s\n", tz_backend_names());
    void *h = dlopen(mod, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        printf("skip: the CUDA module does not load here: %s\n", dlerror());
        return 77;
    }
    int (*load)(char *, size_t) = (int (*)(char *, size_t))dlsym(h, "tz_cuda_module_nccl_load");
    check(load != NULL, "the module exports tz_cuda_module_nccl_load");
    if (load) {
        char why[1200] = "";
        int rc = load(why, sizeof why);
        if (want_ok) {
            check(rc == 0, "%s loads with every symbol the comm uses%s%s", lib, rc ? ": " : "",
                  why);
        } else {
            check(rc != 0 && strstr(why, lib) && strstr(why, "LD_LIBRARY_PATH") &&
                      strstr(why, "TZ_NCCL_LIBRARY"),
                  "an absent library is refused, naming it and the way out: %s", why);
            check(load(why, sizeof why) != 0, "asked again: still refused (loaded once)");
        }
        const char *names[] = {"tz_cuda_module_nccl_unique_id", "tz_cuda_module_nccl_init",
                               "tz_cuda_module_nccl_start", "tz_cuda_module_nccl_test",
                               "tz_cuda_module_nccl_wait", "tz_cuda_module_nccl_destroy"};
        int all = 1;
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) all &= dlsym(h, names[i]) != NULL;
        check(all, "the module exports the comm's other entry points (backend/cuda_module.h)");
    }
    uint64_t (*abi)(void) = (uint64_t (*)(void))dlsym(h, TZ_CUDA_SYM_ABI);
    check(abi && abi() == TZ_CUDA_ABI_STAMP,
          "the module's layout stamp is this program's (%llx): a module of another build is "
          "refused at load", (unsigned long long)TZ_CUDA_ABI_STAMP);
    dlclose(h);
    return tz_check_done("test_nccl_load");
}
