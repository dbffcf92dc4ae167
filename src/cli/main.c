/* turbozero <command>: the command-line entry point. Parses arguments and dispatches to
 * the commands; holds no training logic of its own. */
#include <mpi.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "help.h"
#include "io/config.h"
#include "io/fsutil.h"
#include "io/loss_plot.h"
#include "io/prep.h"
#include "io/tokens.h"
#include "comm/comm.h"
#include "comm/watchdog.h"
#include "comm/world.h"
#include "bench/bench.h"
#include "train/checkpoint.h"
#include "cli/commands.h"
#include "task/family.h"
#include "train/inputs_check.h"
#include "train/run_record.h"
#include "train/trainer.h"

/* Value of --name in argv[from..argc), or NULL; every other argument must be a known flag. */
static const char *flag(int argc, char **argv, int from, const char *name, const char *const *known) {
    const char *val = NULL;
    for (int i = from; i < argc; i += 2) { /* flag, value, flag, value, ... */
        int ok = 0;
        for (const char *const *k = known; *k; k++) ok |= !strcmp(argv[i], *k);
        if (!ok)
            TZ_FATAL("%s: unknown argument '%s' (see turbozero %s --help)", argv[from - 1],
                     argv[i], argv[1]);
        if (i + 1 >= argc) TZ_FATAL("%s: %s needs a value", argv[from - 1], argv[i]);
        if (!strcmp(argv[i], name)) val = argv[i + 1];
    }
    return val;
}

/* Removes the switch `name` (a flag without a value) from argv; 1 when it was there. */
static int take_switch(int *argc, char **argv, const char *name) {
    int n = 0, seen = 0;
    for (int i = 0; i < *argc; i++) {
        if (i >= 2 && !strcmp(argv[i], name)) seen = 1;
        else argv[n++] = argv[i];
    }
    *argc = n;
    return seen;
}

static int cmd_init_model(int argc, char **argv) {
    int force = take_switch(&argc, argv, "--force");
    tz_init_args a = {0};
    tz_family_init_flags(&a); /* --vocab, --tied, --objective, ...: each family's own */
    const char *known[4 + TZ_INIT_FLAGS_MAX + 1] = {"--arch", "--preset", "--out", "--seed"};
    for (int i = 0; i < a.n; i++) known[4 + i] = a.flags[i];
    const char *arch = flag(argc, argv, 2, "--arch", known);
    a.preset = flag(argc, argv, 2, "--preset", known);
    a.out = flag(argc, argv, 2, "--out", known);
    const char *seed = flag(argc, argv, 2, "--seed", known);
    for (int i = 0; i < a.n; i++) a.values[i] = flag(argc, argv, 2, a.flags[i], known);
    if (!arch || !a.preset || !a.out) TZ_FATAL("init-model: --arch, --preset and --out are required");
    a.seed = seed ? (uint64_t)tz_command_int(seed, "--seed") : 0;
    tz_command_check_output("init-model", a.out, NULL, force);
    tz_init_model_run(arch, &a);
    return 0;
}

static int cmd_prep(int argc, char **argv) {
    int jsonl = argc >= 3 && !strcmp(argv[2], "jsonl");
    if (argc < 3 || (strcmp(argv[2], "text") && !jsonl))
        TZ_FATAL("prep: expected 'prep text --tokenizer TOK --in TEXT --out FILE' or 'prep jsonl "
                 "--tokenizer TOK --in DATA.jsonl --out FILE'");
    const char *cmd = jsonl ? "prep jsonl" : "prep text";
    static const char *const known[] = {"--tokenizer", "--in", "--out", "--val-fraction", "--val-out",
                                        "--template", NULL};
    const char *tok = flag(argc, argv, 3, "--tokenizer", known);
    const char *in = flag(argc, argv, 3, "--in", known);
    const char *out = flag(argc, argv, 3, "--out", known);
    const char *vf = flag(argc, argv, 3, "--val-fraction", known);
    const char *vout = flag(argc, argv, 3, "--val-out", known);
    const char *tmpl = flag(argc, argv, 3, "--template", known);
    if (!in || !out) TZ_FATAL("%s: --in and --out are required", cmd);
    if (!tok && jsonl)
        TZ_FATAL_HINT("give the model's tokenizer.json or its folder",
                      "prep jsonl: --tokenizer is required");
    if (tmpl && !jsonl) TZ_FATAL("prep text: --template is for prep jsonl");
    double frac = 0.0;
    if (vf) {
        char *end;
        frac = strtod(vf, &end);
        if (!*vf || *end) TZ_FATAL("%s: --val-fraction %s: expected a number in [0, 1)", cmd, vf);
    }
    char vpath[1024];
    if (vout) {
        snprintf(vpath, sizeof vpath, "%s", vout);
    } else { /* FILE.tok -> FILE.val.tok */
        const char *dot = strrchr(out, '.'), *slash = strrchr(out, '/');
        if (dot && (!slash || dot > slash))
            snprintf(vpath, sizeof vpath, "%.*s.val%s", (int)(dot - out), out, dot);
        else
            snprintf(vpath, sizeof vpath, "%s.val", out);
    }
    char err[2048];
    const char *outs[2] = {out, vpath};
    for (int i = 0; i < (frac > 0 ? 2 : 1); i++) { /* the output folders, made as needed */
        const char *slash = strrchr(outs[i], '/');
        char dir[1024];
        if (!slash || slash == outs[i]) continue;
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - outs[i]), outs[i]);
        if (tz_mkdir_p(dir, err, sizeof err)) TZ_FATAL("%s: %s", cmd, err);
    }
    int rc = jsonl ? tz_prep_jsonl(tok, in, out, vpath, frac, tmpl, err, sizeof err)
             : !tok || !strcmp(tok, "bytes")
                 ? tz_tokens_prep_bytes(in, out, vpath, frac, err, sizeof err)
                 : tz_prep_text(tok, in, out, vpath, frac, err, sizeof err);
    if (rc) TZ_FATAL("%s: %s", cmd, err);
    return 0;
}

static int cmd_quantize(int argc, char **argv) {
    int force = take_switch(&argc, argv, "--force");
    static const char *const known[] = {"--model", "--bits", "--group", "--out", "--method",
                                        "--seed", NULL};
    const char *model = flag(argc, argv, 2, "--model", known);
    const char *bits = flag(argc, argv, 2, "--bits", known);
    const char *group = flag(argc, argv, 2, "--group", known);
    const char *out = flag(argc, argv, 2, "--out", known);
    const char *method = flag(argc, argv, 2, "--method", known);
    const char *seed = flag(argc, argv, 2, "--seed", known);
    if (!model || !bits || !out) TZ_FATAL("quantize: --model, --bits and --out are required");
    tz_command_check_output("quantize", out, model, force);
    tz_quantize_args a = {model, out, bits, group, method, seed};
    tz_quantize_run(&a);
    return 0;
}

/* export CHECKPOINT --out DIR [--force] [--set k=v ...]: the checkpoint's weights as the
 * adapter or model folder its training would save, by its own configuration. */
static int cmd_export_checkpoint(int argc, char **argv) {
    int force = take_switch(&argc, argv, "--force");
    const char *folder = argv[2], *out = NULL;
    const char **sets = tz_xcalloc((size_t)argc, sizeof *sets);
    int nset = 0;
    for (int i = 3; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--set") && i + 1 < argc) sets[nset++] = argv[++i];
        else TZ_FATAL("export: unknown argument '%s' (see turbozero export --help)", argv[i]);
    }
    if (!out) TZ_FATAL("export: expected 'export CHECKPOINT_FOLDER --out DIR [--set k=v ...]'");
    static tz_config cfg;
    tz_world world;
    tz_world_init(&world, -1);
    tz_comm *comm = tz_comm_mpi_create(MPI_COMM_WORLD);
    if (comm->rank == 0) {
        tz_command_check_output("export", out, folder, force);
        tz_export_checkpoint_config(&cfg, folder, sets, nset);
    }
    tz_comm_bcast(comm, &cfg, (int64_t)sizeof cfg, TZ_DT_U8, 0);
    int rc = tz_ckpt_export_run(&cfg, &world, comm, folder, out);
    tz_comm_destroy(comm);
    tz_world_free(&world);
    free(sets);
    return rc;
}

static int cmd_export(int argc, char **argv) {
    if (argc > 2 && strncmp(argv[2], "--", 2)) return cmd_export_checkpoint(argc, argv);
    static const char *const known[] = {"--model", "--out", "--adapter", "--dtype", NULL};
    int force = take_switch(&argc, argv, "--force");
    int deq = take_switch(&argc, argv, "--dequantize");
    int merge = take_switch(&argc, argv, "--merge");
    const char *model = flag(argc, argv, 2, "--model", known);
    const char *out = flag(argc, argv, 2, "--out", known);
    const char *adapter = flag(argc, argv, 2, "--adapter", known);
    const char *dtype = flag(argc, argv, 2, "--dtype", known);
    if (!model || !out || deq + merge != 1)
        TZ_FATAL("export: expected 'export --model DIR --dequantize --out DIR2' or 'export "
                 "--model DIR --adapter ADIR --merge --out DIR2 [--dtype f32|bf16]'");
    if (deq && (adapter || dtype))
        TZ_FATAL("export: --dequantize takes no %s (it writes F32; --merge folds an adapter in)",
                 adapter ? "--adapter" : "--dtype");
    if (merge && !adapter) TZ_FATAL("export: --merge needs --adapter ADIR (a LoRA adapter folder)");
    if (dtype && strcmp(dtype, "f32") && strcmp(dtype, "bf16"))
        TZ_FATAL("export: --dtype %s: expected f32 or bf16", dtype);
    tz_command_check_output("export", out, model, force);
    if (adapter) tz_command_check_output("export", out, adapter, force);
    if (deq) tz_export_run(model, out);
    else tz_export_merge_run(model, adapter, out, dtype && !strcmp(dtype, "bf16"));
    return 0;
}

/* plot RUN_DIR [RUN_DIR ...] --out FILE.png: loss curves of finished or running runs. */
static int cmd_plot(int argc, char **argv) {
    const char *out = NULL;
    int n = 0;
    const char **dirs = tz_xcalloc((size_t)argc, sizeof *dirs);
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
        else if (!strncmp(argv[i], "--", 2))
            TZ_FATAL("plot: unknown argument '%s' (see turbozero plot --help)", argv[i]);
        else dirs[n++] = argv[i];
    }
    if (!n || !out) TZ_FATAL("plot: expected 'plot RUN_DIR [RUN_DIR ...] --out FILE.png'");
    char err[1024];
    if (tz_loss_plot_write(&tz_metrics_keys, dirs, NULL, n, out, err, sizeof err)) TZ_FATAL("plot: %s", err);
    tz_info("wrote %s: loss curves of %d run%s", out, n, n > 1 ? "s" : "");
    free(dirs);
    return 0;
}

/* CONFIG [--set k=v ...], parsed on rank 0 (an error there stops every rank) and
 * broadcast, so every rank runs the same configuration. */
static const char *g_bench_preset; /* bench --preset NAME: the configuration is the preset's */

static void load_config_file(tz_config *cfg, int argc, char **argv) {
    if (argc < 3 && !g_bench_preset)
        TZ_FATAL("%s: expected a config file (see inputs/reference.cfg)", argv[1]);
    const char **sets = tz_xcalloc((size_t)argc, sizeof *sets);
    int nset = 0;
    for (int i = g_bench_preset ? 2 : 3; i < argc; i++) {
        if (!strcmp(argv[i], "--set") && i + 1 < argc) sets[nset++] = argv[++i];
        else if (!strncmp(argv[i], "--set=", 6)) sets[nset++] = argv[i] + 6;
        else TZ_FATAL("%s: unknown argument '%s' (expected --set section.key=value)", argv[1], argv[i]);
    }
    tz_config_names names;
    tz_family_names(&names);
    if (g_bench_preset) tz_bench_preset_config(cfg, &names, g_bench_preset, sets, nset);
    else tz_config_load(cfg, &names, argv[2], sets, nset);
    free(sets);
}

static void load_config(tz_config *cfg, int argc, char **argv, tz_comm *comm) {
    if (comm->rank == 0) load_config_file(cfg, argc, argv);
    tz_comm_bcast(comm, cfg, (int64_t)sizeof *cfg, TZ_DT_U8, 0);
}

/* sample CONFIG --class C --n N --steps S --guidance W --out FILE [--seed S] [--set k=v ...]:
 * one process (rank 0 samples, the others wait). */
static int cmd_sample(int argc, char **argv) {
    static const char *const known[] = {"--class", "--n",     "--steps", "--guidance", "--out",
                                        "--seed",  "--scale", "--prompts", "--shift", NULL};
    tz_sample_args a = {.cls = 0, .n = 16, .steps = 50, .guidance = 4.0, .seed = 0, .scale = 1};
    char **rest = tz_xcalloc((size_t)argc + 1, sizeof *rest);
    int nrest = 0;
    const char *out = NULL;
    for (int i = 0; i < argc; i++) {
        int k = 0;
        while (known[k] && strcmp(argv[i], known[k])) k++;
        if (i < 3 || !known[k]) { rest[nrest++] = argv[i]; continue; }
        if (i + 1 >= argc) TZ_FATAL("sample: %s needs a value", argv[i]);
        const char *v = argv[++i];
        if (k == 0) a.cls = tz_command_int(v, "--class"), a.given |= TZ_SAMPLE_CLASS;
        else if (k == 1) a.n = tz_command_int(v, "--n");
        else if (k == 2) a.steps = tz_command_int(v, "--steps"), a.given |= TZ_SAMPLE_STEPS;
        else if (k == 3) {
            char *end;
            a.guidance = strtod(v, &end);
            if (!*v || *end || !isfinite(a.guidance))
                TZ_FATAL("sample: --guidance %s: expected a number", v);
            a.given |= TZ_SAMPLE_GUIDANCE;
        } else if (k == 4) out = v;
        else if (k == 5) a.seed = tz_command_int(v, "--seed");
        else if (k == 6) a.scale = tz_command_int(v, "--scale");
        else if (k == 7) snprintf(a.prompts, sizeof a.prompts, "%s", v);
        else {
            char *end;
            a.shift = strtod(v, &end);
            if (!*v || *end || !(a.shift > 0 && a.shift <= 100))
                TZ_FATAL("sample: --shift %s: expected a number in (0, 100]", v);
        }
    }
    if (!out) TZ_FATAL("sample: --out FILE is required (.png: an image grid; .h5: latents)");
    if (a.n < 1 || a.n > 4096 || a.steps < 1 || a.steps > 1000)
        TZ_FATAL("sample: --n must be in 1..4096 and --steps in 1..1000");
    if (a.scale < 1 || a.scale > 16) TZ_FATAL("sample: --scale must be in 1..16");
    snprintf(a.out, sizeof a.out, "%s", out);
    static tz_config cfg;
    tz_world world;
    tz_world_init(&world, -1);
    tz_comm *comm = tz_comm_mpi_create(MPI_COMM_WORLD);
    load_config(&cfg, nrest, rest, comm);
    int rc = comm->rank == 0 ? tz_sample_run(&cfg, &a) : 0;
    tz_comm_barrier(comm);
    tz_comm_destroy(comm);
    tz_world_free(&world);
    free(rest);
    return rc;
}

/* A number from flag what's value v; fatal otherwise. */
static double number_arg(const char *cmd, const char *what, const char *v) {
    char *end;
    double x = strtod(v, &end);
    if (!*v || *end || !isfinite(x)) TZ_FATAL("%s: %s %s: expected a number", cmd, what, v);
    return x;
}

/* generate CONFIG --prompt TEXT | --interactive [--max-new N] [--temperature T] [--top-p P]
 * [--seed S] [--tokenizer PATH] [--chat] [--template NAME] [--system TEXT] [--stop STRING]...
 * [--set k=v ...]: one process (rank 0 generates, the others wait). */
static int cmd_generate(int argc, char **argv) {
    static const char *const known[] = {"--prompt",    "--max-new",  "--temperature", "--top-p",
                                        "--seed",      "--tokenizer", "--template",   "--system",
                                        "--stop",      "--chat",     "--interactive", NULL};
    tz_generate_args a = {.prompt = NULL, .max_new = 64, .temperature = 0.0, .top_p = 1.0};
    char **rest = tz_xcalloc((size_t)argc + 1, sizeof *rest);
    int nrest = 0;
    for (int i = 0; i < argc; i++) {
        int k = 0;
        while (known[k] && strcmp(argv[i], known[k])) k++;
        if (i < 3 || !known[k]) { rest[nrest++] = argv[i]; continue; }
        if (k == 9) { a.chat = 1; continue; }
        if (k == 10) { a.interactive = 1; continue; }
        if (i + 1 >= argc) TZ_FATAL("generate: %s needs a value", argv[i]);
        const char *v = argv[++i];
        if (k == 0) a.prompt = v;
        else if (k == 1) a.max_new = tz_command_int(v, "--max-new");
        else if (k == 2) a.temperature = number_arg("generate", "--temperature", v);
        else if (k == 3) a.top_p = number_arg("generate", "--top-p", v);
        else if (k == 4) a.seed = tz_command_int(v, "--seed");
        else if (k == 5) a.tokenizer = v;
        else if (k == 6) a.tmpl = v, a.chat = 1;
        else if (k == 7) a.system = v;
        else if (a.nstops == 8) TZ_FATAL("generate: --stop: at most 8");
        else if (!*v) TZ_FATAL("generate: --stop needs a non-empty string");
        else a.stops[a.nstops++] = v;
    }
    if (!a.prompt && !a.interactive)
        TZ_FATAL("generate: --prompt TEXT (or --interactive, prompts from stdin) is required");
    if (a.prompt && a.interactive)
        TZ_FATAL("generate: --prompt and --interactive: give one of them");
    if (a.system && !a.chat) TZ_FATAL("generate: --system needs --chat or --template NAME");
    if (a.tmpl && strcmp(a.tmpl, "llama3") && strcmp(a.tmpl, "llama2") &&
        strcmp(a.tmpl, "chatml") && strcmp(a.tmpl, "plain"))
        TZ_FATAL("generate: --template %s: expected llama3, llama2, chatml or plain", a.tmpl);
    if (a.max_new < 0 || a.max_new > (1 << 20))
        TZ_FATAL("generate: --max-new %lld: expected 0..1048576", (long long)a.max_new);
    if (a.temperature < 0) TZ_FATAL("generate: --temperature %g: expected 0 (greedy) or more",
                                    a.temperature);
    if (!(a.top_p > 0 && a.top_p <= 1)) TZ_FATAL("generate: --top-p %g: expected 0 < P <= 1",
                                                 a.top_p);
    if (a.seed < 0) TZ_FATAL("generate: --seed %lld: expected a non-negative integer",
                             (long long)a.seed);
    static tz_config cfg;
    tz_world world;
    tz_world_init(&world, -1);
    tz_comm *comm = tz_comm_mpi_create(MPI_COMM_WORLD);
    load_config(&cfg, nrest, rest, comm);
    int rc = comm->rank == 0 ? tz_generate_run(&cfg, &a) : 0;
    tz_comm_barrier(comm);
    tz_comm_destroy(comm);
    tz_world_free(&world);
    free(rest);
    return rc;
}

/* The collective commands: world, communicator, config, then the driver. */
static int cmd_collective(int argc, char **argv, int (*fn)(const tz_config *, tz_world *, tz_comm *)) {
    static tz_config cfg;
    tz_world world;
    tz_world_init(&world, -1);
    tz_comm *comm = tz_comm_mpi_create(MPI_COMM_WORLD);
    load_config(&cfg, argc, argv, comm);
    tz_watchdog_start(cfg.run.collective_timeout);
    tz_inputs_check(&cfg, comm); /* every rank sees the same model and data */
    int rc = fn(&cfg, &world, comm);
    tz_watchdog_stop();
    tz_comm_destroy(comm);
    tz_world_free(&world);
    return rc;
}

/* bench CONFIG | bench --preset NAME, then [--dry-run] [--no-split] [--set k=v ...]: --dry-run
 * plans the memory of a rank without allocating it (a preset, or any model folder);
 * --no-split leaves out a device's extra steps for the step split */
static int cmd_bench(int argc, char **argv) {
    int dry = 0, n = 0;
    for (int i = 0; i < argc; i++) {
        if (i >= 2 && !strcmp(argv[i], "--dry-run")) {
            dry = 1;
            continue;
        }
        if (i >= 2 && !strcmp(argv[i], "--no-split")) {
            tz_bench_set_split(0);
            continue;
        }
        if (i >= 2 && !strcmp(argv[i], "--preset")) {
            if (i + 1 >= argc) TZ_FATAL("bench: --preset needs a NAME (bench --help lists them)");
            g_bench_preset = argv[++i];
            continue;
        }
        argv[n++] = argv[i];
    }
    return cmd_collective(n, argv, dry ? tz_bench_dry_run : tz_bench_run);
}

static const char *g_resume; /* train's --resume: NULL, "" (newest checkpoint) or a path */
static int train_resuming(const tz_config *cfg, tz_world *w, tz_comm *comm) {
    return tz_train_run_from(cfg, w, comm, g_resume);
}

/* train CONFIG [--resume [PATH]] [--dry-run] [--set k=v ...]: --resume with no PATH (the next
 * argument absent or another flag) continues from the newest checkpoint in
 * run.dir/checkpoints; --dry-run plans the run's memory and stops (bench --dry-run). */
static int cmd_train(int argc, char **argv) {
    const char *resume = NULL;
    if (take_switch(&argc, argv, "--dry-run")) return cmd_collective(argc, argv, tz_bench_dry_run);
    int n = 0;
    for (int i = 0; i < argc; i++) {
        if (i >= 3 && !strcmp(argv[i], "--resume")) {
            resume = i + 1 < argc && strncmp(argv[i + 1], "--", 2) ? argv[++i] : "";
            continue;
        }
        argv[n++] = argv[i];
    }
    g_resume = resume;
    return cmd_collective(n, argv, train_resuming);
}

/* Help and --version, answered before MPI starts or any file is opened; -1 when argv asks
 * for neither, else the exit status. */
static int answer_help(int argc, char **argv) {
    if (argc < 2) {
        tz_help_print_summary(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") ||
        (!strcmp(argv[1], "help") && argc == 2)) {
        tz_help_print_summary(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        tz_help_print_version();
        return 0;
    }
    const char *cmd = NULL;
    if (!strcmp(argv[1], "help")) cmd = tz_help_wanted(argc, argv, 2) ? "help" : argv[2];
    else if (tz_help_wanted(argc, argv, 2)) cmd = argv[1];
    if (!cmd) return -1;
    if (tz_help_print_command(cmd) == 0) return 0;
    fprintf(stderr, "turbozero: unknown command '%s'\n", cmd);
    tz_help_print_summary(stderr);
    return 2;
}

/* OpenMP threads that sleep at barriers unless the user chose otherwise. libgomp reads
 * OMP_WAIT_POLICY once, when the program is loaded, so the default is set by running the
 * program again (same process, same pid, before MPI starts) with OMP_WAIT_POLICY=passive: on
 * cores shared with other ranks or jobs, spinning threads slowed steps several times over,
 * while sleeping ones cost microseconds per parallel region. OMP_WAIT_POLICY=active (or
 * any value) is kept as given; a failed exec goes on with the library's default. */
static void default_wait_policy(char **argv) {
    const char *p = getenv("OMP_WAIT_POLICY");
    if (p && *p) return;
    if (setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
    execv("/proc/self/exe", argv);
}

int main(int argc, char **argv) {
    int hrc = answer_help(argc, argv);
    if (hrc >= 0) return hrc;
    default_wait_policy(argv);
    tz_mpi_singleton_defaults();
    /* train: SIGUSR1, SIGTERM and SIGINT stop it with status 75 from here on, also during
     * start-up (loading, resuming), so that a job stopped early is requeued */
    if (!strcmp(argv[1], "train")) tz_ckpt_signals_install();
    int thread_level = MPI_THREAD_SINGLE; /* the watchdog thread asks other ranks (watchdog.h) */
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &thread_level);
    int rank = 0, world = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    tz_log_set_rank(rank, world);
    int rc;
    if (!strcmp(argv[1], "init-model")) {
        rc = cmd_init_model(argc, argv);
    } else if (!strcmp(argv[1], "prep")) {
        rc = cmd_prep(argc, argv);
    } else if (!strcmp(argv[1], "quantize")) {
        rc = cmd_quantize(argc, argv);
    } else if (!strcmp(argv[1], "export")) {
        rc = cmd_export(argc, argv);
    } else if (!strcmp(argv[1], "train")) {
        rc = cmd_train(argc, argv);
    } else if (!strcmp(argv[1], "eval")) {
        rc = cmd_collective(argc, argv, tz_eval_run);
    } else if (!strcmp(argv[1], "bench")) {
        rc = cmd_bench(argc, argv);
    } else if (!strcmp(argv[1], "plot")) {
        rc = cmd_plot(argc, argv);
    } else if (!strcmp(argv[1], "sample")) {
        rc = cmd_sample(argc, argv);
    } else if (!strcmp(argv[1], "generate")) {
        rc = cmd_generate(argc, argv);
    } else {
        TZ_FATAL_HINT("turbozero --help lists the commands", "unknown command '%s'", argv[1]);
    }
    MPI_Finalize();
    return rc;
}
