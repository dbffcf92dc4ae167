/* Config loading on good input: defaults, every key from a file, --set of every type,
 * lora.targets forms, write/reload identity and inputs/reference.cfg, with the program's
 * family names. Error paths (fatal) are tested by tests/config_errors.sh; here only a few,
 * caught through the fatal hook: a FIFO refused without waiting on it, and the message of
 * each kind of error as the loader now builds it before stopping. */
#include <dirent.h>
#include <libconfig.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "io/config.h"
#include "task/family.h"

#ifndef TZ_SOURCE_DIR
#define TZ_SOURCE_DIR "../.."
#endif

static int g_fail = 0, g_pass = 0;
#define CHECK(cond)                                                          \
    do {                                                                     \
        if (cond) {                                                          \
            g_pass++;                                                        \
        } else {                                                             \
            g_fail++;                                                        \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                    \
    } while (0)

static tz_config_names g_names; /* the families' names, as the program passes them */
static char g_dir[64];

/* The family model.arch names. */
static const char *arch_of(const tz_config *cfg) { return g_names.archs[cfg->model.arch]; }
static int g_nfile = 0;

/* Writes TEXT to a fresh file in the temp folder; returns its path (static storage). */
static const char *write_temp(const char *text) {
    static char paths[16][128];
    char *path = paths[g_nfile % 16];
    snprintf(path, 128, "%s/c%d.cfg", g_dir, g_nfile++);
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        exit(1);
    }
    fputs(text, f);
    fclose(f);
    return path;
}

/* load(write(cfg)) must give back the same bytes (source aside: it names the new file). */
static void check_round_trip(const tz_config *cfg, const char *what) {
    char path[128];
    snprintf(path, sizeof path, "%s/rt%d.cfg", g_dir, g_nfile++);
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        exit(1);
    }
    tz_config_write(cfg, &g_names, f);
    fclose(f);
    tz_config *back = malloc(sizeof *back), *want = malloc(sizeof *want);
    tz_config_load(back, &g_names, path, NULL, 0);
    memcpy(want, cfg, sizeof *want);
    memcpy(want->source, back->source, sizeof want->source);
    int same = !memcmp(want, back, sizeof *want);
    if (!same) fprintf(stderr, "round trip of %s differs (see %s)\n", what, path);
    CHECK(same);
    free(back);
    free(want);
}

static void test_defaults(void) {
    tz_config cfg, want;
    const char *path = write_temp("model = { path = \"m\"; };\n");
    tz_config_load(&cfg, &g_names, path, NULL, 0);
    CHECK(!strcmp(cfg.source, path));
    CHECK(!strcmp(cfg.model.path, "m"));
    CHECK(!strcmp(arch_of(&cfg), "llama") && cfg.model.adapter[0] == 0);
    CHECK(cfg.data.train[0] == 0 && cfg.data.val[0] == 0 && cfg.data.seq_len == 128);
    CHECK(cfg.train.mode == TZ_MODE_LORA && cfg.train.steps == 100);
    CHECK(cfg.train.micro_batch == 8 && cfg.train.grad_accum == 1);
    CHECK(cfg.train.eval_every == 0 && cfg.train.eval_windows == 0 && cfg.train.log_every == 1);
    CHECK(cfg.train.checkpointing == 0 && cfg.train.threads == 0);
    CHECK(cfg.optim.lr == 2e-4 && cfg.optim.min_lr_ratio == 0.1 && cfg.optim.warmup == 10);
    CHECK(cfg.optim.weight_decay == 0.0 && cfg.optim.beta1 == 0.9 && cfg.optim.beta2 == 0.999);
    CHECK(cfg.optim.eps == 1e-8 && cfg.optim.grad_clip == 1.0);
    CHECK(cfg.lora.rank == 8 && cfg.lora.alpha == 16.0);
    CHECK(!strcmp(cfg.lora.targets, "all"));
    CHECK(!strcmp(cfg.run.dir, "runs/default") && cfg.run.seed == 1234);
    /* tz_config_defaults is the same, bar path and source */
    tz_config_defaults(&want);
    strcpy(want.model.path, "m");
    strcpy(want.source, path);
    CHECK(!memcmp(&want, &cfg, sizeof cfg));
    check_round_trip(&cfg, "defaults");
    /* an empty section and missing semicolons are fine */
    tz_config_load(&cfg, &g_names, write_temp("model = { path = \"m\" }\ntrain = { }\n"), NULL, 0);
    CHECK(!memcmp(cfg.model.path, "m", 2) && cfg.train.steps == 100);
}

static void test_every_key(void) {
    tz_config cfg;
    const char *path = write_temp(
        "# every key, none at its default\n"
        "model = { arch = \"dit\"; path = \"/models/x y\"; adapter = \"ad\"; };\n"
        "data = { train = \"t.bin\"; val = \"v.bin\"; seq_len = 65536; };\n"
        "train = { mode = \"full\"; steps = 1000000000; micro_batch = 3; grad_accum = 4;\n"
        "  eval_every = 5; eval_windows = 6; log_every = 7; checkpointing = true;\n"
        "  threads = 4096; };\n"
        "optim = { lr = 10; min_lr_ratio = 0.0; warmup = 0; weight_decay = 1e-2;\n"
        "  beta1 = 0.0; beta2 = 0.95; eps = 1.0; grad_clip = 0; };\n"
        "lora = { rank = 4096; alpha = 1e6; targets = (\"q\", \"v\"); };\n"
        "run = { dir = \"out\"; seed = 4611686018427387904L; };\n");
    tz_config_load(&cfg, &g_names, path, NULL, 0);
    CHECK(!strcmp(arch_of(&cfg), "dit") && !strcmp(cfg.model.path, "/models/x y"));
    CHECK(!strcmp(cfg.model.adapter, "ad") && !strcmp(cfg.data.train, "t.bin"));
    CHECK(!strcmp(cfg.data.val, "v.bin") && cfg.data.seq_len == 65536);
    CHECK(cfg.train.mode == TZ_MODE_FULL && cfg.train.steps == 1000000000);
    CHECK(cfg.train.micro_batch == 3 && cfg.train.grad_accum == 4 && cfg.train.eval_every == 5);
    CHECK(cfg.train.eval_windows == 6 && cfg.train.log_every == 7);
    CHECK(cfg.train.checkpointing == 1 && cfg.train.threads == 4096);
    CHECK(cfg.optim.lr == 10.0 && cfg.optim.min_lr_ratio == 0.0 && cfg.optim.warmup == 0);
    CHECK(cfg.optim.weight_decay == 1e-2 && cfg.optim.beta1 == 0.0 && cfg.optim.beta2 == 0.95);
    CHECK(cfg.optim.eps == 1.0 && cfg.optim.grad_clip == 0.0);
    CHECK(cfg.lora.rank == 4096 && cfg.lora.alpha == 1e6);
    CHECK(!strcmp(cfg.lora.targets, "q,v"));
    CHECK(!strcmp(cfg.run.dir, "out") && cfg.run.seed == (int64_t)1 << 62);
    check_round_trip(&cfg, "every key");
    CHECK(!strcmp(tz_mode_name(cfg.train.mode), "full") && !strcmp(g_names.archs[0], "llama"));
    CHECK(!strcmp(tz_mode_name(TZ_MODE_LORA), "lora") && !strcmp(g_names.archs[1], "dit"));
}

static void test_sets(void) {
    tz_config cfg;
    const char *path = write_temp("model = { path = \"m\"; };\ntrain = { steps = 5; };\n");
    const char *sets[] = {
        "train.steps=7",                 /* int present in the file */
        "run.seed=5000000000L",          /* int64 with L, absent from the file */
        "data.seq_len=256",
        "optim.lr=1",                    /* float from an integer */
        "optim.eps=1e-6",
        "train.checkpointing=true",
        "lora.alpha=0.5",
        "model.adapter=\"quoted dir\"",  /* string, quoted */
        "run.dir=plain/dir",             /* string, raw */
        "train.mode=full",               /* enum */
        "model.arch=\"dit\"",            /* enum, quoted */
        "lora.targets=q,v",              /* targets, comma list */
        "data.val=",                     /* empty string */
    };
    tz_config_load(&cfg, &g_names, path, sets, (int)(sizeof sets / sizeof sets[0]));
    CHECK(cfg.train.steps == 7 && cfg.run.seed == 5000000000LL && cfg.data.seq_len == 256);
    CHECK(cfg.optim.lr == 1.0 && cfg.optim.eps == 1e-6 && cfg.lora.alpha == 0.5);
    CHECK(cfg.train.checkpointing == 1);
    CHECK(!strcmp(cfg.model.adapter, "quoted dir") && !strcmp(cfg.run.dir, "plain/dir"));
    CHECK(cfg.train.mode == TZ_MODE_FULL && !strcmp(arch_of(&cfg), "dit"));
    CHECK(!strcmp(cfg.lora.targets, "q,v") && cfg.data.val[0] == 0);
    check_round_trip(&cfg, "--set values");

    /* bool spellings; later --set wins */
    const char *bools[] = {"train.checkpointing=true", "train.checkpointing=False"};
    tz_config_load(&cfg, &g_names, path, bools, 1);
    CHECK(cfg.train.checkpointing == 1);
    tz_config_load(&cfg, &g_names, path, bools, 2);
    CHECK(cfg.train.checkpointing == 0);
    const char *bools2[] = {"train.checkpointing=TRUE", "train.checkpointing=false"};
    tz_config_load(&cfg, &g_names, path, bools2, 1);
    CHECK(cfg.train.checkpointing == 1);
    tz_config_load(&cfg, &g_names, path, bools2, 2);
    CHECK(cfg.train.checkpointing == 0);

    /* targets forms */
    struct { const char *set, *want; } t[] = {
        {"lora.targets=[\"q\",\"v\"]", "q,v"},
        {"lora.targets=[q, o]", "q,o"},
        {"lora.targets=(\"down\", \"up\", \"gate\")", "gate,up,down"}, /* the names' order */
        {"lora.targets=all", "all"},
        {"lora.targets=k", "k"},
        {"lora.targets= k , k ", "k"},
        {"lora.targets=q,all", "all"},
        {"lora.targets=adaln,qkv", "qkv,adaln"},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        tz_config_load(&cfg, &g_names, path, &t[i].set, 1);
        if (strcmp(cfg.lora.targets, t[i].want)) fprintf(stderr, "targets case %s\n", t[i].set);
        CHECK(!strcmp(cfg.lora.targets, t[i].want));
        check_round_trip(&cfg, t[i].set);
    }
    /* in a file, one name as a string: "all" (the default's spelling, inputs/reference.cfg) */
    const char *fs[][2] = {{"model = { path = \"m\"; };\nlora = { targets = \"all\"; };\n", "all"},
                           {"model = { path = \"m\"; };\nlora = { targets = \"down\"; };\n", "down"}};
    for (size_t i = 0; i < 2; i++) {
        tz_config_load(&cfg, &g_names, write_temp(fs[i][0]), NULL, 0);
        CHECK(!strcmp(cfg.lora.targets, fs[i][1]));
    }
    /* no file at all: defaults and --set */
    const char *only[] = {"model.path=/m", "train.steps=3"};
    tz_config_load(&cfg, &g_names, NULL, only, 2);
    CHECK(!strcmp(cfg.model.path, "/m") && cfg.train.steps == 3 && cfg.source[0] == 0);
    /* --set satisfies a required key the file lacks */
    tz_config_load(&cfg, &g_names, write_temp("train = { steps = 2; };\n"), only, 1);
    CHECK(!strcmp(cfg.model.path, "/m") && cfg.train.steps == 2);
}

static void test_targets_file(void) {
    struct { const char *text, *want; } t[] = {
        {"lora = { targets = [\"q\", \"v\"]; };", "q,v"},
        {"lora = { targets = (\"down\"); };", "down"},
        {"lora = { targets = [\"all\"]; };", "all"},
        {"lora = { targets = [\"o\", \"gate\", \"o\"]; };", "o,gate"},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        char text[256];
        tz_config cfg;
        snprintf(text, sizeof text, "model = { path = \"m\"; };\n%s\n", t[i].text);
        tz_config_load(&cfg, &g_names, write_temp(text), NULL, 0);
        CHECK(!strcmp(cfg.lora.targets, t[i].want));
    }
}

/* Floats and strings that are hard to print: the written file must read back bit for bit. */
static void test_round_trip_hard(void) {
    tz_config cfg;
    const char *sets[] = {
        "optim.lr=0.30000000000000004", "optim.min_lr_ratio=0.3333333333333333",
        "optim.eps=4.9406564584124654e-324", "optim.weight_decay=9.999999999999998",
        "optim.beta2=0.99999999999999989", "lora.alpha=1e6", "optim.grad_clip=123456.789",
        "run.seed=2147483648", "optim.warmup=999999999", "run.dir=a \"quoted\" \\back\\slash\tx",
        "model.adapter=caf\xc3\xa9 #not a comment // nor this", "data.val=\x01\x7f end",
        "lora.targets=v,up",
    };
    tz_config_load(&cfg, &g_names, write_temp("model = { path = \"m\"; };\n"), sets,
                   (int)(sizeof sets / sizeof sets[0]));
    CHECK(cfg.optim.lr == 0.30000000000000004 && cfg.optim.eps > 0);
    CHECK(!strcmp(cfg.run.dir, "a \"quoted\" \\back\\slash\tx"));
    check_round_trip(&cfg, "hard values");
    /* the longest string that fits */
    char set[TZ_PATH_MAX + 16];
    const char *one[] = {set};
    snprintf(set, sizeof set, "data.train=%0*d", TZ_PATH_MAX - 1, 7);
    tz_config_load(&cfg, &g_names, write_temp("model = { path = \"m\"; };\n"), one, 1);
    CHECK(strlen(cfg.data.train) == TZ_PATH_MAX - 1);
    check_round_trip(&cfg, "longest string");
}

/* inputs/reference.cfg loads to the defaults (with its model.path) and names every key that
 * tz_config_write writes, so the reference cannot fall behind the schema. */
static void test_reference(void) {
    const char *ref = TZ_SOURCE_DIR "/inputs/reference.cfg";
    tz_config cfg, want;
    tz_config_load(&cfg, &g_names, ref, NULL, 0);
    tz_config_defaults(&want);
    strcpy(want.model.path, "inputs/llama/model");
    strcpy(want.source, ref);
    CHECK(!memcmp(&cfg, &want, sizeof cfg));

    char *buf = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&buf, &len);
    tz_config_write(&want, &g_names, mem);
    fclose(mem);
    config_t written, reference;
    config_init(&written);
    config_init(&reference);
    CHECK(config_read_string(&written, buf) == CONFIG_TRUE);
    CHECK(config_read_file(&reference, ref) == CONFIG_TRUE);
    config_setting_t *root = config_root_setting(&written);
    int nkeys = 0;
    for (int i = 0; i < config_setting_length(root); i++) {
        config_setting_t *sec = config_setting_get_elem(root, (unsigned)i);
        for (int j = 0; j < config_setting_length(sec); j++, nkeys++) {
            char path[128];
            snprintf(path, sizeof path, "%s.%s", config_setting_name(sec),
                     config_setting_name(config_setting_get_elem(sec, (unsigned)j)));
            if (!config_lookup(&reference, path)) fprintf(stderr, "reference lacks %s\n", path);
            CHECK(config_lookup(&reference, path) != NULL);
        }
    }
    /* and nothing more in the reference: the two hold the same keys */
    int nref = 0;
    config_setting_t *rroot = config_root_setting(&reference);
    for (int i = 0; i < config_setting_length(rroot); i++)
        nref += config_setting_length(config_setting_get_elem(rroot, (unsigned)i));
    CHECK(nkeys == nref && nkeys >= 30);
    config_destroy(&written);
    config_destroy(&reference);
    free(buf);
}

/* ---- fatal errors, caught ---------------------------------------------------------- */

static jmp_buf g_jmp;
static char g_fatal[4096];
static void on_fatal(const char *message) {
    snprintf(g_fatal, sizeof g_fatal, "%s", message);
    longjmp(g_jmp, 1);
}
static void on_alarm(int sig) {
    static const char m[] = "FAIL a FIFO was waited on: no error within 20 s\n";
    (void)sig;
    if (write(2, m, sizeof m - 1) < 0) _exit(2);
    _exit(1);
}

/* Loading FILE with the --set SET (NULL: none) must stop with a message holding WANT and
 * WANT2 (NULL: anything). */
static int fatal_with(const char *file, const char *set, const char *want, const char *want2) {
    static tz_config cfg;
    g_fatal[0] = 0;
    tz_fatal_set_hook(on_fatal);
    if (setjmp(g_jmp) == 0) {
        tz_config_load(&cfg, &g_names, file, set ? &set : NULL, set ? 1 : 0);
        tz_fatal_set_hook(NULL);
        fprintf(stderr, "  %s: loaded (expected: %s)\n", file ? file : set, want);
        return 0;
    }
    tz_fatal_set_hook(NULL);
    if (strstr(g_fatal, want) && (!want2 || strstr(g_fatal, want2))) return 1;
    fprintf(stderr, "  got: %s\n  expected: %s%s%s\n", g_fatal, want, want2 ? " ... " : "",
            want2 ? want2 : "");
    return 0;
}

static void test_fatal(void) {
    char fifo[128], want[200];
    snprintf(fifo, sizeof fifo, "%s/fifo.cfg", g_dir);
    signal(SIGALRM, on_alarm);
    alarm(20);
    CHECK(mkfifo(fifo, 0600) == 0);
    snprintf(want, sizeof want, "%s: not a regular file (a FIFO)", fifo);
    CHECK(fatal_with(fifo, NULL, want, "HINT: check the config path"));
    alarm(0);
    unlink(fifo);
    const char *f = write_temp("model = { path = \"m\"; };\ntrain = { steps = 0; };\n");
    snprintf(want, sizeof want, "%s:2: train.steps: expected an integer in 1..1000000000 (got 0)", f);
    CHECK(fatal_with(f, NULL, want, NULL));
    f = write_temp("model = { path = \"m\"; };\ntrain = { checkpointing = 1; };\n");
    CHECK(fatal_with(f, NULL, "train.checkpointing: expected a boolean (true or false) (got an integer (1))",
                     "HINT: write true or false (1 and 0 are integers)"));
    f = write_temp("model = { path = \"m\"; };\ntrain = { step = 5; };\n");
    CHECK(fatal_with(f, NULL, "train.step: unknown key", "HINT: did you mean train.steps?"));
    f = write_temp("model = { path = \"m\"; };\ntrain = { steps = 5000000000; };\n");
    CHECK(fatal_with(f, NULL, "expected an integer that fits 32 bits or ends in L (got 5000000000)",
                     "write 5000000000L"));
    f = write_temp("model = { path = \"m\"; };\nlora = { targets = (\"q\", 5); };\n");
    CHECK(fatal_with(f, NULL, "lora.targets: expected a non-empty list of names", "(got an integer (5))"));
    f = write_temp("model = { path = \"m\"; };\nlora = { targets = \"x\"; };\n");
    CHECK(fatal_with(f, NULL, ":2: lora.targets: expected a non-empty list of names", "(got \"x\")"));
    f = write_temp("model = { path = \"m\" };\ntrain = { steps = ; };\n");
    CHECK(fatal_with(f, NULL, ":2: syntax error", NULL));
    f = write_temp("modle = { path = \"m\"; };\n");
    CHECK(fatal_with(f, NULL, "modle: unknown section", "HINT: did you mean model?"));
    f = write_temp("model = { path = \"m\"; };\n");
    CHECK(fatal_with(f, "run.device=gpu", "--set run.device=gpu: expected one of \"auto\", \"cpu\", \"cuda\"",
                     NULL));
    CHECK(fatal_with(f, "train.stepz=3", "--set train.stepz: unknown key", "did you mean train.steps?"));
    CHECK(fatal_with(f, "nodot", "--set nodot: expected section.key=value", "HINT: write --set"));
    CHECK(fatal_with(NULL, NULL, "model.path: required key missing", NULL));
}

static void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d)) != NULL;) {
        char path[384];
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    if (d) closedir(d);
    rmdir(dir);
}

int main(void) {
    tz_family_names(&g_names);
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(g_dir, sizeof g_dir, "%.40s/tzcfgXXXXXX", tmp);
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_defaults();
    test_every_key();
    test_sets();
    test_targets_file();
    test_round_trip_hard();
    test_reference();
    test_fatal();
    if (!g_fail) remove_dir(g_dir); /* a failing run keeps its files for a look */
    printf("test_config: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
