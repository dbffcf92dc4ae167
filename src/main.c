/* turbozero <command>: the command-line entry point. Parses arguments and dispatches to
 * the commands; holds no training logic of its own. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/config.h"
#include "io/tokens.h"
#include "model/llama_io.h"
#include "model/llama_quant.h"
#include "quant/turboquant.h"
#include "train/trainer.h"

static void usage(FILE *f) {
    fprintf(f,
            "turbozero %s: fine-tune Llama models with TurboQuant weights and ZeRO-2\n"
            "usage: turbozero <command> [args]\n"
            "  train CONFIG [--set section.key=value ...]   train as configured\n"
            "  eval CONFIG [--set section.key=value ...]    mean next-token loss on data.val\n"
            "  init-model --arch llama --preset tiny|small --vocab V --out DIR [--seed S]\n"
            "             [--tied 0|1]                      a random model in HF layout\n"
            "  prep text --tokenizer bytes --in TEXT --out FILE [--val-fraction F]\n"
            "             [--val-out FILE2]                 text to a token file\n"
            "  quantize --model DIR --bits B --out DIR2 [--group 64|128|256] [--seed S]\n"
            "             [--method turboquant|absmax]      quantize the block projections\n"
            "  export --model DIR2 --dequantize --out DIR3  a quantized model as dense F32\n"
            "See docs/guide.md and inputs/reference.cfg.\n",
            TZ_VERSION);
}

/* Value of --name in argv[from..argc), or NULL; every other argument must be a known flag. */
static const char *flag(int argc, char **argv, int from, const char *name, const char *const *known) {
    const char *val = NULL;
    for (int i = from; i < argc; i++) {
        int ok = 0;
        for (const char *const *k = known; *k; k++) ok |= !strcmp(argv[i], *k);
        if (!ok) TZ_FATAL("%s: unknown argument '%s' (see turbozero --help)", argv[from - 1], argv[i]);
        if (i + 1 >= argc) TZ_FATAL("%s: %s needs a value", argv[from - 1], argv[i]);
        if (!strcmp(argv[i], name)) val = argv[i + 1];
        i++;
    }
    return val;
}

static int64_t parse_int(const char *s, const char *what) {
    char *end;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end) TZ_FATAL("%s: expected an integer, got '%s'", what, s);
    return v;
}

static int cmd_init_model(int argc, char **argv) {
    static const char *const known[] = {"--arch", "--preset", "--vocab", "--out", "--seed", "--tied", NULL};
    const char *arch = flag(argc, argv, 2, "--arch", known);
    const char *preset = flag(argc, argv, 2, "--preset", known);
    const char *vocab = flag(argc, argv, 2, "--vocab", known);
    const char *out = flag(argc, argv, 2, "--out", known);
    const char *seed = flag(argc, argv, 2, "--seed", known);
    const char *tied = flag(argc, argv, 2, "--tied", known);
    if (!arch || !preset || !vocab || !out)
        TZ_FATAL("init-model: --arch, --preset, --vocab and --out are required");
    if (strcmp(arch, "llama")) TZ_FATAL("init-model: --arch %s: expected llama", arch);
    tz_llama_dims d = {0};
    d.vocab = parse_int(vocab, "--vocab");
    if (d.vocab < 2 || d.vocab > (1 << 24)) TZ_FATAL("init-model: --vocab %s: expected 2..16777216", vocab);
    d.max_pos = 2048;
    d.eps = 1e-5;
    d.theta = 10000.0;
    if (!strcmp(preset, "tiny")) {
        d.dim = 128, d.n_layers = 2, d.n_heads = 4, d.n_kv_heads = 2, d.hidden = 352, d.tied = 1;
    } else if (!strcmp(preset, "mini")) {
        d.dim = 192, d.n_layers = 4, d.n_heads = 6, d.n_kv_heads = 2, d.hidden = 512, d.tied = 1;
    } else if (!strcmp(preset, "small")) {
        d.dim = 256, d.n_layers = 6, d.n_heads = 8, d.n_kv_heads = 4, d.hidden = 688, d.tied = 1;
    } else {
        TZ_FATAL("init-model: --preset %s: expected tiny, mini or small", preset);
    }
    if (tied) d.tied = (int)parse_int(tied, "--tied") != 0;
    d.head_dim = d.dim / d.n_heads;
    tz_backend *be = tz_cpu_backend_create(0);
    tz_llama_opts o = {0};
    tz_llama *m = tz_llama_create(be, &d, &o);
    tz_llama_init_random(m, seed ? (uint64_t)parse_int(seed, "--seed") : 0);
    tz_llama_save(m, out, 0);
    printf("wrote %s: llama preset %s, %lld parameters (%lld layers, dim %lld, %lld/%lld heads, "
           "vocab %lld, %s embeddings)\n",
           out, preset, (long long)m->params.n_total, (long long)d.n_layers, (long long)d.dim,
           (long long)d.n_heads, (long long)d.n_kv_heads, (long long)d.vocab,
           d.tied ? "tied" : "untied");
    tz_llama_free(m);
    tz_cpu_backend_destroy(be);
    return 0;
}

static int cmd_prep(int argc, char **argv) {
    if (argc < 3 || strcmp(argv[2], "text"))
        TZ_FATAL("prep: expected 'prep text --tokenizer bytes --in TEXT --out FILE'");
    static const char *const known[] = {"--tokenizer", "--in", "--out", "--val-fraction", "--val-out", NULL};
    const char *tok = flag(argc, argv, 3, "--tokenizer", known);
    const char *in = flag(argc, argv, 3, "--in", known);
    const char *out = flag(argc, argv, 3, "--out", known);
    const char *vf = flag(argc, argv, 3, "--val-fraction", known);
    const char *vout = flag(argc, argv, 3, "--val-out", known);
    if (!in || !out) TZ_FATAL("prep text: --in and --out are required");
    if (tok && strcmp(tok, "bytes"))
        TZ_FATAL_HINT("tokenize elsewhere and write the token file format of docs/guide.md",
                      "prep text: --tokenizer %s: only 'bytes' is built in", tok);
    double frac = 0.0;
    if (vf) {
        char *end;
        frac = strtod(vf, &end);
        if (!*vf || *end) TZ_FATAL("prep text: --val-fraction %s: expected a number in [0, 1)", vf);
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
    char err[1024];
    if (tz_tokens_prep_bytes(in, out, vpath, frac, err, sizeof err)) TZ_FATAL("prep text: %s", err);
    return 0;
}

static int cmd_quantize(int argc, char **argv) {
    static const char *const known[] = {"--model", "--bits", "--group", "--out", "--method",
                                        "--seed", NULL};
    const char *model = flag(argc, argv, 2, "--model", known);
    const char *bits = flag(argc, argv, 2, "--bits", known);
    const char *group = flag(argc, argv, 2, "--group", known);
    const char *out = flag(argc, argv, 2, "--out", known);
    const char *method = flag(argc, argv, 2, "--method", known);
    const char *seed = flag(argc, argv, 2, "--seed", known);
    if (!model || !bits || !out) TZ_FATAL("quantize: --model, --bits and --out are required");
    int m = TZ_TQ_TURBOQUANT;
    if (method && tz_tq_method_from_name(method, &m))
        TZ_FATAL("quantize: --method %s: expected turboquant or absmax", method);
    int64_t s = seed ? parse_int(seed, "--seed") : 0;
    if (s < 0) TZ_FATAL("quantize: --seed %s: expected a non-negative integer", seed);
    tz_llama_quantize_dir(model, out, m, (int)parse_int(bits, "--bits"),
                          group ? (int)parse_int(group, "--group") : 128, (uint64_t)s, stdout);
    return 0;
}

static int cmd_export(int argc, char **argv) {
    static const char *const known[] = {"--model", "--out", NULL};
    int deq = 0, n = 0;
    char **rest = tz_xcalloc((size_t)argc + 1, sizeof *rest);
    for (int i = 0; i < argc; i++) { /* --dequantize takes no value */
        if (i >= 2 && !strcmp(argv[i], "--dequantize")) deq = 1;
        else rest[n++] = argv[i];
    }
    const char *model = flag(n, rest, 2, "--model", known);
    const char *out = flag(n, rest, 2, "--out", known);
    free(rest);
    if (!model || !out || !deq)
        TZ_FATAL("export: expected 'export --model DIR --dequantize --out DIR2' (only "
                 "--dequantize is supported)");
    tz_llama_export_dequantized(model, out, stdout);
    return 0;
}

/* CONFIG [--set k=v ...] */
static void load_config(tz_config *cfg, int argc, char **argv) {
    if (argc < 3) TZ_FATAL("%s: expected a config file (see inputs/reference.cfg)", argv[1]);
    const char **sets = tz_xcalloc((size_t)argc, sizeof *sets);
    int nset = 0;
    for (int i = 3; i < argc; i++) {
        if (!strcmp(argv[i], "--set") && i + 1 < argc) sets[nset++] = argv[++i];
        else if (!strncmp(argv[i], "--set=", 6)) sets[nset++] = argv[i] + 6;
        else TZ_FATAL("%s: unknown argument '%s' (expected --set section.key=value)", argv[1], argv[i]);
    }
    tz_config_load(cfg, argv[2], sets, nset);
    free(sets);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank = 0, world = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    tz_log_set_rank(rank, world);
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        MPI_Finalize();
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("turbozero %s\n", TZ_VERSION);
        MPI_Finalize();
        return 0;
    }
    int rc;
    static tz_config cfg;
    if (!strcmp(argv[1], "init-model")) {
        rc = cmd_init_model(argc, argv);
    } else if (!strcmp(argv[1], "prep")) {
        rc = cmd_prep(argc, argv);
    } else if (!strcmp(argv[1], "quantize")) {
        rc = cmd_quantize(argc, argv);
    } else if (!strcmp(argv[1], "export")) {
        rc = cmd_export(argc, argv);
    } else if (!strcmp(argv[1], "train")) {
        load_config(&cfg, argc, argv);
        rc = tz_train_run(&cfg);
    } else if (!strcmp(argv[1], "eval")) {
        load_config(&cfg, argc, argv);
        rc = tz_eval_run(&cfg);
    } else {
        TZ_FATAL("unknown command '%s' (see turbozero --help)", argv[1]);
    }
    MPI_Finalize();
    return rc;
}
