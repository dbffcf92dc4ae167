/* The one-process commands: init-model and sample through the family registry (each family
 * brings its own code, train/task_<name>.c), quantize and export onto model/llama_quant.c. */
#include "backend/registry.h"
#include "cli/commands.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "io/fsutil.h"
#include "io/hf_config.h"
#include "io/peft.h"
#include "model/adapter_io.h"
#include "model/llama_convert.h"
#include "model/llama_quant.h"
#include "quant/turboquant.h"
#include "train/checkpoint.h"
#include "task/task.h"

int64_t tz_command_int(const char *s, const char *what) {
    char *end;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end) TZ_FATAL("%s: expected an integer, got '%s'", what, s);
    return v;
}

/* path made absolute and free of links: realpath of its longest existing ancestor followed
 * by the rest as typed (the part that does not exist yet cannot be a link). */
static void command_resolve_path(const char *path, char *out, size_t cap) {
    char head[PATH_MAX], rest[PATH_MAX] = "", tmp[PATH_MAX], real[PATH_MAX];
    snprintf(head, sizeof head, "%s", path);
    for (;;) {
        size_t n = strlen(head);
        while (n > 1 && head[n - 1] == '/') head[--n] = 0;
        if (realpath(n ? head : ".", real)) break;
        char *slash = strrchr(head, '/');
        const char *last = slash ? slash + 1 : head;
        if (snprintf(tmp, sizeof tmp, "%s%s%s", last, rest[0] ? "/" : "", rest) >= (int)sizeof tmp)
            TZ_FATAL("path too long: %s", path);
        snprintf(rest, sizeof rest, "%s", tmp);
        if (!slash) head[0] = 0;
        else if (slash == head) head[1] = 0; /* "/" */
        else *slash = 0;
    }
    snprintf(out, cap, "%s%s%s", real, rest[0] && strcmp(real, "/") ? "/" : "", rest);
}

void tz_command_check_output(const char *cmd, const char *out, const char *in, int force) {
    char ro[2 * PATH_MAX + 2], ri[PATH_MAX];
    command_resolve_path(out, ro, sizeof ro);
    if (in && realpath(in, ri)) {
        size_t n = strlen(ri);
        if (!strcmp(ro, ri) || (!strncmp(ro, ri, n) && (ri[n - 1] == '/' || ro[n] == '/')))
            TZ_FATAL_HINT("choose an --out outside the model folder; --force does not allow "
                          "this",
                          "%s: --out %s is the input %s or inside it: turbozero never writes "
                          "over its input",
                          cmd, out, in);
    }
    struct stat st;
    if (stat(out, &st)) return; /* nothing there yet */
    int empty = 0;
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(out);
        empty = 1;
        for (struct dirent *e; d && (e = readdir(d));)
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) empty = 0;
        if (d) closedir(d);
    }
    if (!empty && !force)
        TZ_FATAL_HINT("choose another --out, remove it, or add --force to write over it",
                      "%s: --out %s already exists (%s)", cmd, out,
                      S_ISDIR(st.st_mode) ? "a folder that is not empty" : "a file");
}

void tz_init_model_run(const char *arch, const tz_init_args *a) {
    const tz_family *f = tz_family_find(arch);
    char names[256], about[512];
    if (!f)
        TZ_FATAL("init-model: --arch %s: expected %s", arch,
                 tz_family_list(names, sizeof names, 0, 0));
    tz_init_args on = *a;
    on.be = tz_cpu_backend_create(0);
    int64_t count = f->init_model(&on, about, sizeof about);
    tz_cpu_backend_destroy(on.be);
    printf("wrote %s: %s preset %s, %lld parameters (%s)\n", a->out, f->name, a->preset,
           (long long)count, about);
}

int tz_sample_run(const tz_config *cfg, const tz_sample_args *a) {
    const tz_family *f = tz_family_of(cfg);
    char names[256];
    if (!f->sample)
        TZ_FATAL("%s: sample needs model.arch = %s", cfg->source,
                 tz_family_list(names, sizeof names, 1, 1));
    return f->sample(cfg, a);
}

int tz_generate_run(const tz_config *cfg, const tz_generate_args *a) {
    const tz_family *f = tz_family_of(cfg);
    if (!f->generate)
        TZ_FATAL("%s: generate needs a model.arch that generates text (model.arch = \"%s\" "
                 "has no generator)", cfg->source, f->name);
    return f->generate(cfg, a);
}

void tz_quantize_run(const tz_quantize_args *a) {
    int method = TZ_TQ_TURBOQUANT;
    if (a->method && tz_tq_method_from_name(a->method, &method))
        TZ_FATAL("quantize: --method %s: expected turboquant or absmax", a->method);
    int64_t seed = a->seed ? tz_command_int(a->seed, "--seed") : 0;
    if (seed < 0) TZ_FATAL("quantize: --seed %s: expected a non-negative integer", a->seed);
    int bits = (int)tz_command_int(a->bits, "--bits");
    int group = a->group ? (int)tz_command_int(a->group, "--group") : 128;
    if (bits < 1 || bits > TZ_TQ_MAX_BITS)
        TZ_FATAL("quantize: --bits %d: expected 1..%d (2, 3 or 4 are useful)", bits, TZ_TQ_MAX_BITS);
    if (group != 64 && group != 128 && group != 256)
        TZ_FATAL("quantize: --group %d: expected 64, 128 or 256", group);
    tz_llama_quantize_dir(a->in, a->out, method, bits, group, (uint64_t)seed, stdout);
}

void tz_export_run(const char *in, const char *out) { tz_llama_export_dequantized(in, out, stdout); }


void tz_export_merge_run(const char *in, const char *adapter, const char *out, int bf16) {
    char type[64], err[1200], src[1100], dst[1100];
    if (tz_hf_model_type(in, type, sizeof type, err, sizeof err)) TZ_FATAL("export: %s", err);
    const tz_family *f = tz_family_find(!strcmp(type, "mistral") || !type[0] ? "llama" : type);
    if (!f)
        TZ_FATAL("export: %s/config.json: model_type \"%s\": expected \"llama\", \"mistral\" or "
                 "\"dit\"", in, type);
    static tz_config cfg; /* what a config file would say: the model and its adapter */
    memset(&cfg, 0, sizeof cfg);
    snprintf(cfg.source, sizeof cfg.source, "export --merge");
    snprintf(cfg.model.path, sizeof cfg.model.path, "%s", in);
    snprintf(cfg.model.adapter, sizeof cfg.model.adapter, "%s", adapter);
    /* an adapter trained on a loftq base belongs to that base, quantize(W - s B0 A0), not to
     * the dense W: the merge quantizes the dense model as the training did, makes the loftq
     * base again and merges into it (dequantized) */
    char cpath[1100];
    tz_peft_config pc;
    tz_path_join(cpath, sizeof cpath, adapter, "adapter_config.json");
    if (tz_peft_read(&pc, cpath, err, sizeof err)) TZ_FATAL("export: %s", err);
    if (!strcmp(pc.lora_init, "loftq") && pc.quant_bits > 0) {
        cfg.quant.bits = pc.quant_bits;
        cfg.quant.group = pc.quant_group;
        cfg.quant.seed = (int64_t)pc.quant_seed;
        cfg.quant.method = !strcmp(pc.quant_method, "absmax") ? TZ_QUANT_ABSMAX : TZ_QUANT_TURBOQUANT;
        cfg.lora.init = TZ_LORA_INIT_LOFTQ;
        cfg.run.seed = (int64_t)pc.init_seed;
        printf("export: %s was trained on a loftq base (%s %d-bit, group %d): merging into that "
               "base, made again from %s\n", adapter, pc.quant_method, pc.quant_bits,
               pc.quant_group, in);
    }
    tz_task *t = tz_xcalloc(1, f->task->size);
    t->family = f;
    t->cfg = &cfg;
    t->be = tz_cpu_backend_create(0);
    t->opts = tz_task_model_opts(f, &cfg, 0);
    t->params = f->task->load(t);
    int nq = 0;
    for (int i = 0; i < t->params->n; i++) nq += t->params->p[i]->q != NULL;
    tz_task_load_adapters(&cfg, &t->opts, t->params, t->be);
    int merged = tz_params_merge_lora(t->params, t->be, &t->opts.lora);
    if (!merged) TZ_FATAL("export: %s holds no LoRA weights for %s", adapter, in);
    f->task->save_model(t, out, bf16); /* with the source's tokenizer files (the family's) */
    /* the source's config.json as it was (rope_scaling, token ids, ...), now dense */
    tz_path_join(src, sizeof src, in, "config.json");
    tz_path_join(dst, sizeof dst, out, "config.json");
    if (tz_hf_config_rewrite(src, dst, NULL, bf16 ? "bfloat16" : "float32", err, sizeof err))
        TZ_FATAL("export: %s", err);
    printf("wrote %s: %s with %d LoRA weights merged (alpha/rank %g)%s, %s\n", out, in, merged,
           t->opts.lora.alpha / (double)t->opts.lora.rank,
           nq ? ", quantized weights dequantized" : "", bf16 ? "BF16" : "F32");
    tz_backend *be = t->be;
    f->task->close(t);
    free(t);
    tz_cpu_backend_destroy(be);
}

void tz_export_checkpoint_config(tz_config *cfg, const char *folder, const char *const *sets,
                                 int nset) {
    char err[1400];
    int64_t step = 0;
    char *text = tz_ckpt_config_read(folder, &step, err, sizeof err);
    if (!text) TZ_FATAL("export %s: %s", folder, err);
    const char *tmpdir = getenv("TMPDIR");
    char tpath[1200];
    snprintf(tpath, sizeof tpath, "%s/turbozero-export-XXXXXX", tmpdir && *tmpdir ? tmpdir : "/tmp");
    int fd = mkstemp(tpath);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f || fputs(text, f) < 0 || fclose(f) != 0)
        TZ_FATAL("export: cannot write the checkpoint's configuration to %s: %s", tpath, strerror(errno));
    free(text);
    tz_config_names names;
    tz_family_names(&names);
    tz_config_load(cfg, &names, tpath, sets, nset);
    unlink(tpath);
    snprintf(cfg->source, sizeof cfg->source, "%s/checkpoint.json", folder);
    tz_info("export: %s, step %lld, with the configuration it was written with", folder,
            (long long)step);
}
