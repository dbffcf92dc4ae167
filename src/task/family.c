/* The registry of model families and the lookups over it: model.arch, the config's names, the
 * init-model flags, lora.targets. Adding a family adds one line to `families` (and its extern
 * in family.h); nothing here knows what a family does. */
#include "task/family.h"

#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "optim/optim.h"

/* One line per family; the order is model.arch's (index 0, the first, is the default). */
static const tz_family *const families[] = {&tz_family_llama, &tz_family_dit, &tz_family_flux};
#define NFAM ((int)(sizeof families / sizeof families[0]))

const tz_family *tz_family_of(const tz_config *cfg) {
    if (cfg->model.arch < 0 || cfg->model.arch >= NFAM)
        TZ_FATAL("model.arch %d is not a family of this build", cfg->model.arch);
    return families[cfg->model.arch];
}

const tz_family *tz_family_find(const char *name) {
    for (int i = 0; i < NFAM; i++)
        if (!strcmp(families[i]->name, name)) return families[i];
    return NULL;
}

/* Adds s to the NULL-terminated list (of at most cap - 1 names) unless it is there. */
static void add_once(const char **list, int cap, const char *s, const char *what) {
    int n = 0;
    while (list[n] && strcmp(list[n], s)) n++;
    if (list[n]) return;
    if (n + 1 >= cap) TZ_FATAL("the families have more than %d %s", cap - 1, what);
    list[n] = s;
    list[n + 1] = NULL;
}

void tz_family_names(tz_config_names *n) {
    memset(n, 0, sizeof *n);
    for (int i = 0; i < NFAM; i++) {
        add_once(n->archs, TZ_CONFIG_NAMES_MAX + 1, families[i]->name, "names");
        for (int j = 0; families[i]->targets[j]; j++)
            add_once(n->targets, TZ_CONFIG_NAMES_MAX + 1, families[i]->targets[j],
                     "LoRA target names");
    }
    for (int i = 0; tz_optim_at(i); i++)
        add_once(n->optims, TZ_CONFIG_NAMES_MAX + 1, tz_optim_at(i)->name, "optimizer names");
}

const char *tz_family_list(char *buf, size_t n, int samplers, int quote) {
    const tz_family *pick[NFAM];
    int k = 0;
    for (int i = 0; i < NFAM; i++)
        if (!samplers || families[i]->sample) pick[k++] = families[i];
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; i < k && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%s%s%s%s", i == 0 ? "" : i + 1 < k ? ", "
                                 : " or ", quote ? "\"" : "", pick[i]->name, quote ? "\"" : "");
    return buf;
}

void tz_family_init_flags(tz_init_args *a) {
    const char *list[TZ_INIT_FLAGS_MAX + 1] = {NULL};
    for (int i = 0; i < NFAM; i++)
        for (int j = 0; families[i]->init_flags[j]; j++)
            add_once(list, TZ_INIT_FLAGS_MAX + 1, families[i]->init_flags[j], "init-model flags");
    for (a->n = 0; list[a->n]; a->n++) a->flags[a->n] = list[a->n];
}

const char *tz_init_arg(const tz_init_args *a, const char *flag) {
    for (int i = 0; i < a->n; i++)
        if (!strcmp(a->flags[i], flag)) return a->values[i];
    return NULL;
}

int tz_family_n_targets(const tz_family *f) {
    int n = 0;
    while (f->targets[n]) n++;
    return n;
}

int tz_family_lora_targets(const tz_family *f, const tz_config *cfg) {
    const int n = tz_family_n_targets(f);
    int bits = 0;
    if (!strcmp(cfg->lora.targets, "all")) return (1 << n) - 1;
    for (const char *t = cfg->lora.targets; *t;) {
        size_t len = strcspn(t, ",");
        int j = 0;
        while (j < n && (strlen(f->targets[j]) != len || strncmp(f->targets[j], t, len))) j++;
        if (j == n) {
            char hint[256];
            size_t used = (size_t)snprintf(hint, sizeof hint, "the LoRA targets of %s are",
                                           f->name);
            for (int k = 0; k < n && used < sizeof hint; k++)
                used += (size_t)snprintf(hint + used, sizeof hint - used, " %s", f->targets[k]);
            if (used < sizeof hint) snprintf(hint + used, sizeof hint - used, " (or all)");
            TZ_FATAL_HINT(hint, "%s: lora.targets: \"%.*s\" is not a projection of model.arch = "
                          "\"%s\"", cfg->source, (int)len, t, f->name);
        }
        bits |= 1 << j;
        t += len + (t[len] == ',');
    }
    return bits;
}
