/* The safetensors header (io/safetensors.c): an input starting with '{' is a sharded
 * model.safetensors.index.json (beside it two real shards, tests/fuzz/safetensors/), any
 * other a model.safetensors. One that opens has every tensor found by name, converted to
 * fp32 where it is F32, F16 or BF16, and read back through its own shape. */
#include "fuzz_common.h"
#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int ready;
    char path[600], err[2048] = "";
    if (!ready) {
        fz_copy_data("safetensors/model-00001-of-00002.safetensors", "model-00001-of-00002.safetensors");
        fz_copy_data("safetensors/model-00002-of-00002.safetensors", "model-00002-of-00002.safetensors");
        ready = 1;
    }
    int index = size > 0 && data[0] == '{';
    fz_file(path, index ? "model.safetensors.index.json" : "model.safetensors", data, size);
    tz_safetensors st;
    if (tz_st_open(&st, path, err, sizeof err)) {
        fz_rejected(err, NULL);
        return 0;
    }
    for (int64_t i = 0; i < st.count; i++) {
        const tz_st_tensor *t = &st.tensors[i];
        FZ_ASSERT(tz_st_find(&st, t->name) == t, "tensor '%s' not found by name", t->name);
        FZ_ASSERT(t->nbytes == (size_t)t->numel * tz_dtype_size(t->dtype), "'%s': %zu bytes",
                  t->name, t->nbytes);
        if (t->numel > (1 << 16) ||
            (t->dtype != TZ_DT_F32 && t->dtype != TZ_DT_F16 && t->dtype != TZ_DT_BF16))
            continue;
        float *f = malloc(((size_t)t->numel + 1) * sizeof *f);
        tz_st_tensor_to_f32(t, f, err, sizeof err);
        tz_st_read_f32(&st, t->name, f, t->ndim, t->shape, err, sizeof err);
        free(f);
    }
    tz_st_metadata(&st, "format");
    tz_st_close(&st);
    return 0;
}
