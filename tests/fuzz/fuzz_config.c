/* The libconfig run configuration (io/config.c): the input is loaded as a run config with the
 * program's own family names; a rejection (a fatal error: the loader stops the run) is caught
 * as a clean one. A config that loads is written out (tz_config_write), and that text must
 * load again to the same values. */
#include "fuzz_common.h"
#include "io/config.h"
#include "task/family.h"

static tz_config_names names;
static tz_config cfg, back;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int ready;
    char path[600], round[600];
    if (!ready) {
        tz_family_names(&names);
        if (chdir(fz_dir()) != 0) abort(); /* an @include "name" resolves in the scratch folder */
        ready = 1;
    }
    fz_file(path, "run.cfg", data, size);
    fz_path(round, "round.cfg");
    if (FZ_CATCH_FATAL()) {
        tz_config_load(&cfg, &names, path, NULL, 0);
    } else {
        fz_catch_end();
        fz_rejected(fz_fatal_msg, NULL);
        return 0;
    }
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) abort();
    tz_config_write(&cfg, &names, f);
    fclose(f);
    fz_file(round, "round.cfg", text, len);
    if (FZ_CATCH_FATAL()) {
        tz_config_load(&back, &names, round, NULL, 0);
    } else {
        fz_catch_end();
        FZ_ASSERT(0, "the written config does not load: %s\n%s", fz_fatal_msg, text);
    }
    fz_catch_end();
    memcpy(back.source, cfg.source, sizeof cfg.source);
    FZ_ASSERT(!memcmp(&cfg, &back, sizeof cfg), "the written config loads to other values:\n%s", text);
    free(text);
    return 0;
}
