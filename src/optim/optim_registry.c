/* The registry of optimizers (optim.name): every optimizer, one line each. The only file
 * that knows them all; the interface (optim.h) knows none. */
#include <stddef.h>
#include <string.h>

#include "optim/adamw.h"
#include "optim/optim.h"

/* Every optimizer, one line each. */
static const tz_optim *const optims[] = {&tz_optim_adamw};

const tz_optim *tz_optim_at(int i) {
    return i >= 0 && (size_t)i < sizeof optims / sizeof optims[0] ? optims[i] : NULL;
}

const tz_optim *tz_optim_find(const char *name) {
    for (size_t i = 0; i < sizeof optims / sizeof optims[0]; i++)
        if (strcmp(optims[i]->name, name) == 0) return optims[i];
    return NULL;
}
