/* Flux transformer config.json (io/flux_config.c): the input is read as a config.json, both by
 * its path and through the folder holding it (the same answer both ways); a refusal must name
 * the file, and a config that is accepted is written back (tz_flux_config_write) and must read
 * back to the same values, every field. */
#include "fuzz_common.h"
#include "io/flux_config.h"

static int same(const tz_flux_config *a, const tz_flux_config *b) {
    return a->patch_size == b->patch_size && a->in_channels == b->in_channels &&
           a->out_channels == b->out_channels && a->num_layers == b->num_layers &&
           a->num_single_layers == b->num_single_layers &&
           a->attention_head_dim == b->attention_head_dim &&
           a->num_attention_heads == b->num_attention_heads &&
           a->joint_attention_dim == b->joint_attention_dim &&
           a->pooled_projection_dim == b->pooled_projection_dim &&
           a->guidance_embeds == b->guidance_embeds &&
           a->axes_dims_rope[0] == b->axes_dims_rope[0] &&
           a->axes_dims_rope[1] == b->axes_dims_rope[1] &&
           a->axes_dims_rope[2] == b->axes_dims_rope[2];
}

static void show(const char *what, const tz_flux_config *c) {
    fprintf(stderr,
            "%s: patch %lld in %lld out %lld layers %lld+%lld heads %lld x %lld joint %lld "
            "pooled %lld guidance %d rope [%lld, %lld, %lld]\n",
            what, (long long)c->patch_size, (long long)c->in_channels, (long long)c->out_channels,
            (long long)c->num_layers, (long long)c->num_single_layers,
            (long long)c->num_attention_heads, (long long)c->attention_head_dim,
            (long long)c->joint_attention_dim, (long long)c->pooled_projection_dim,
            c->guidance_embeds, (long long)c->axes_dims_rope[0], (long long)c->axes_dims_rope[1],
            (long long)c->axes_dims_rope[2]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[600], out[600], err[2048] = "", derr[2048] = "";
    fz_file(path, "config.json", data, size);
    fz_path(out, "written.json");
    tz_flux_config c, folder, back;
    const int rc = tz_flux_config_read(&c, path, err, sizeof err);
    const int frc = tz_flux_config_read(&folder, fz_dir(), derr, sizeof derr);
    FZ_ASSERT(!rc == !frc, "the file is %s, the folder holding it %s: \"%s\" / \"%s\"",
              rc ? "refused" : "accepted", frc ? "refused" : "accepted", err, derr);
    if (rc) {
        fz_rejected(err, path);
        fz_rejected(derr, path); /* the folder's message names the config.json in it */
        return 0;
    }
    FZ_ASSERT(same(&c, &folder), "the file and its folder read differently");
    FZ_ASSERT(c.patch_size == 1 && c.in_channels >= 1 && c.out_channels >= 1 && c.num_layers >= 0 &&
                  c.num_single_layers >= 0 && c.attention_head_dim >= 2 &&
                  c.num_attention_heads >= 1 && c.joint_attention_dim >= 1 &&
                  c.pooled_projection_dim >= 1 &&
                  (c.guidance_embeds == 0 || c.guidance_embeds == 1),
              "an accepted config is out of its documented ranges");
    FZ_ASSERT(tz_flux_config_write(&c, out, err, sizeof err) == 0,
              "an accepted config is not written: %s", err);
    err[0] = 0;
    if (tz_flux_config_read(&back, out, err, sizeof err)) {
        show("read", &c);
        FZ_ASSERT(0, "the written config is refused: %s", err);
    }
    if (!same(&c, &back)) {
        show("read", &c);
        show("back", &back);
        FZ_ASSERT(0, "a field differs after a write and a read");
    }
    return 0;
}
